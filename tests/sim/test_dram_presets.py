"""DRAM presets (sim/dram.py, docs/dram.md): figures in cycles of the accelerator clock, selection
by name through the drivers' `dram=` option and `--dram` on the CLI, errors that list the presets."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from randprog import random_program

from accel.cli import main
from accel.isa import PRESETS
from host_runtime import get_driver
from sim.dram import DEFAULT_DRAM, DRAM_PRESETS, DramModel, dram_preset
from sim.errors import SimError

TINY = PRESETS["tiny"]


def _program():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    return random_program(TINY, 5)[0]


def test_presets_in_cycles_follow_the_clock():
    assert dram_preset("default") == DEFAULT_DRAM == DramModel()
    p100 = dram_preset("pynq-z1", 100.0)
    assert p100 == DramModel(read_latency=20, write_latency=10, bytes_per_cycle=15)
    p200 = dram_preset("PYNQ-Z1", 200.0)      # twice the clock: twice the cycles, half the bytes per cycle
    assert (p200.read_latency, p200.write_latency, p200.bytes_per_cycle) == (40, 20, 7)
    for name, p in DRAM_PRESETS.items():
        if p is None:
            continue
        m = p.model(150.0)
        assert m.read_latency >= 1 and m.write_latency >= 1 and m.bytes_per_cycle >= 1, name
        # each board's memory is faster than its 100 MHz, 8-byte default bus can take
        assert m.read_latency * 1000 / 150.0 >= p.read_latency_ns and not dram_preset(name, 100.0).throttled(8)
    assert dram_preset("ultra96", 200.0).throttled(64) and not dram_preset("ultra96", 200.0).throttled(16)


@pytest.mark.parametrize("bad", ["pynq-z2", "", "DDR3"])
def test_unknown_preset_lists_the_presets(bad):
    with pytest.raises(SimError, match=f"unknown DRAM preset {bad!r}; presets are default, pynq-z1, ultra96, zcu104"):
        dram_preset(bad)
    with pytest.raises(SimError, match="unknown DRAM preset"):
        DramModel.from_dict(bad)
    with pytest.raises(SimError, match="expected a dict of timings or a preset name"):
        DramModel.from_dict(42)
    with pytest.raises(SimError, match="clock_mhz=0 must be in"):
        DRAM_PRESETS["zcu104"].model(0)


def test_driver_takes_a_preset_name_at_the_configs_clock():
    drv = get_driver("tsim", TINY, dram="pynq-z1", helper=False)
    assert drv.dram_model == dram_preset("pynq-z1", TINY.clock_mhz)
    fast = TINY.replace(clock_mhz=200.0)
    assert get_driver("tsim", fast, dram="pynq-z1", helper=False).dram_model.read_latency == 40
    prog = _program()
    cycles = {}
    for name in ("default", "pynq-z1"):
        dram = prog.dram_image()
        cycles[name] = get_driver("tsim", TINY, dram=name, helper=False).run(dram, prog.insn_addr,
                                                                           len(prog.insns)).cycles
    assert cycles["pynq-z1"] > cycles["default"] > 0      # 20-cycle reads against 8


def test_cli_dram_option(tmp_path, capsys):
    prog = _program()
    prog.save(tmp_path / "p.accp")
    p = str(tmp_path / "p.accp")
    got = {}
    for name in ("default", "pynq-z1"):
        assert main(["run", p, "--driver", "tsim", "--dram", name, "--counters", str(tmp_path / f"{name}.json")]) == 0
        got[name] = json.loads((tmp_path / f"{name}.json").read_text())["cycles"]
    assert got["pynq-z1"] > got["default"]
    capsys.readouterr()
    assert main(["run", p, "--driver", "tsim", "--dram", "pynq-z2"]) != 0
    err = capsys.readouterr().err
    assert "--dram pynq-z2: unknown DRAM preset; presets are default, pynq-z1, ultra96, zcu104" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["run", p, "--dram", "zcu104"]) != 0
    assert "not of driver 'fsim'" in capsys.readouterr().err
    dram = prog.dram_image()
    ref = prog.dram_image()
    get_driver("fsim", TINY).run(ref, prog.insn_addr, len(prog.insns))
    get_driver("tsim", TINY, dram="zcu104", helper=False).run(dram, prog.insn_addr, len(prog.insns))
    assert np.array_equal(dram, ref)          # the timing never changes the bytes
