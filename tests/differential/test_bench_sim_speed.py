"""bench/sim_speed.py stays runnable: its quick form on the tiny config (rtl and tsim, no cocotb)
writes JSON whose programs all agree in cycles and DRAM bytes."""
import json

import pytest
from benchmod import load_bench

from sim.verilator.build import tools_available

pytestmark = [pytest.mark.rtl,
              pytest.mark.skipif(tools_available() is not None, reason=f"rtl driver: {tools_available()}")]


def test_sim_speed_quick_on_tiny(tmp_path):
    bench = load_bench("sim_speed")
    assert bench.main(["--config", "tiny", "--quick", "--no-cocotb", "--repeat", "1", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "sim_speed.json").read_text())
    s = doc["summary"]
    assert doc["config_name"] == "tiny" and len(doc["programs"]) == 2
    assert s["all_cycles_equal"] and s["all_dram_equal"] and s["cycles"] > 0
    assert s["groups"]["small"]["programs"] == 2 and "tsim_over_rtl" in s["bars"]
