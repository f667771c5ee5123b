"""Verilog generation: files, the JSON description, the cache, config errors, Verilator lint."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from accel.cli import main
from accel.hw import verilog
from accel.hw.regs import COUNTERS, register_map
from accel.isa import AccelConfig, preset
from accel.isa.errors import ConfigError


@pytest.fixture()
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCEL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_generate_writes_verilog_json_and_waivers(tmp_path):
    res = verilog.generate("tiny", tmp_path / "out")
    v = (tmp_path / "out" / "accel_top.v").read_text()
    assert "module accel_top(" in v and res["lines"] > 1000
    desc = json.loads((tmp_path / "out" / "accel_top.json").read_text())
    ports = {p["name"]: p for p in desc["ports"]}
    assert ports["m_axi_rdata"] == {"name": "m_axi_rdata", "direction": "input", "width": 64}
    assert ports["m_axi_araddr"]["width"] == preset("tiny").dram_addr_width
    assert {"clk", "rst", "irq", "s_axil_wdata", "m_axi_wstrb", "m_axi_arid"} <= set(ports)
    for p in desc["ports"]:       # every JSON port is a port of the Verilog module
        assert f" {p['name']};" in v or f"] {p['name']};" in v
    regs = {r["name"]: r["offset"] for r in desc["registers"]}
    assert regs["CTRL"] == 0 and regs["STATUS"] == 4 and regs["CYCLES_LO"] == 0x40
    assert len(desc["registers"]) == len(register_map(preset("tiny"))) == 10 + 2 * len(COUNTERS)
    assert (regs["ERROR"], regs["ERROR_INSN"], regs["WATCHDOG"], regs["SOFT_RESET"]) == (0x18, 0x1C, 0x20, 0x24)
    assert desc["error_codes"]["INDEX_RANGE"]["code"] == 4 and desc["error_codes"]["NONE"]["code"] == 0
    assert desc["config"] == preset("tiny").to_dict()
    assert (tmp_path / "out" / "accel_top.vlt").exists()


def test_alu_lanes_have_no_wide_shift_terms(tmp_path):
    """Verilator evaluates a term wider than 64 bits on every cycle, outside the op's case; the ALU's
    only ones are its packed-entry ports and SCALE's 65-66-bit rounding sum and shift (kept at the
    calibrated design's width for Fmax): no 95-bit SHR or 127-bit rounding-term shift (the
    rtl model ran 1.24x faster without them)."""
    text = verilog.generate("tiny", tmp_path)["verilog"].read_text()
    body = re.search(r"^module \\accel_top\.compute\.alu .*?^endmodule", text, re.S | re.M).group(0)
    wide = {m.group(2): int(m.group(1)) + 1
            for m in re.finditer(r"^\s*(?:wire|reg)\s+(?:signed\s+)?\[(\d+):0\]\s+([^\s;]+)", body, re.M)
            if int(m.group(1)) >= 64}
    ports = {"acc_rd_a__data", "acc_rd_b__data", "wb_data"}
    assert ports <= set(wide)
    assert max((w for name, w in wide.items() if name not in ports), default=0) <= 66, sorted(wide.items(), key=lambda x: -x[1])[:5]


def test_generation_is_cached_by_config_and_sources(isolated_cache):
    first = verilog.generate("tiny", isolated_cache / "a")
    again = verilog.generate("tiny", isolated_cache / "b")
    assert not first["cached"] and again["cached"] and again["key"] == first["key"]
    assert (isolated_cache / "a" / "accel_top.v").read_text() == (isolated_cache / "b" / "accel_top.v").read_text()
    other = preset("tiny").replace(dep_queue_depth=4)
    assert verilog.source_key(other) != first["key"]


def test_source_key_ignores_docstrings_and_comments(tmp_path):
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('"""Doc."""\ndef f(x):\n    """Doc."""\n    return x + 1  # why\n')
    b.write_text('"""Other doc."""\n\ndef f(x):\n    # a comment\n    return x + 1\n')
    c.write_text('def f(x):\n    return x + 2\n')
    assert verilog._code_text(a) == verilog._code_text(b) != verilog._code_text(c)


def test_invalid_config_fails_before_elaboration(isolated_cache, monkeypatch):
    bad = isolated_cache / "bad.json"
    bad.write_text(json.dumps({**preset("tiny").to_dict(), "block_in": 3}))

    def boom(cfg):
        raise AssertionError("elaborated an invalid config")
    monkeypatch.setattr(verilog, "_elaborate", boom)
    with pytest.raises(ConfigError, match="block_in=3"):
        verilog.generate(str(bad), isolated_cache / "out")
    assert not (isolated_cache / "out").exists()


def test_cli_verilog_command(tmp_path, capsys):
    assert main(["verilog", "--config", "tiny", "-o", str(tmp_path)]) == 0
    assert "accel_top.v" in capsys.readouterr().out
    assert (tmp_path / "accel_top.json").exists()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**preset("tiny").to_dict(), "bus_width": 48}))
    assert main(["verilog", "--config", str(bad), "-o", str(tmp_path / "x")]) == 2
    assert "bus_width=48" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("verilator") is None, reason="verilator not installed")
@pytest.mark.parametrize("name", ["tiny", "default"])
def test_verilator_lint_wall_passes(tmp_path, name):
    verilog.generate(name, tmp_path)
    p = subprocess.run(["verilator", "--lint-only", "-Wall", "accel_top.vlt", "accel_top.v", "--top-module",
                        "accel_top"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "%Warning" not in p.stderr


def test_every_dimension_comes_from_the_config():
    """Ports and buffers follow the config: change bus width, address width and block shape."""
    cfg = AccelConfig(batch=2, block_in=8, block_out=4, bus_width=128, dram_addr_width=40, uop_buff_bytes=1024,
                      inp_buff_bytes=2048, wgt_buff_bytes=4096, acc_buff_bytes=8192, out_buff_bytes=2048,
                      cmd_queue_depth=4, dep_queue_depth=4)
    desc = verilog.describe(cfg)
    ports = {p["name"]: p["width"] for p in desc["ports"]}
    assert ports["m_axi_rdata"] == 128 and ports["m_axi_wstrb"] == 16 and ports["m_axi_araddr"] == 40
    text, _ = verilog._elaborate(cfg)
    assert f"reg [{cfg.acc_elem_bytes * 8 - 1}:0] acc_buf [{cfg.acc_depth - 1}:0]" in text
    assert f"reg [{cfg.wgt_elem_bytes * 8 - 1}:0] wgt_buf [{cfg.wgt_depth - 1}:0]" in text


def test_docs_register_map_matches_the_rtl():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "hardware.md").read_text()
    for r in register_map(preset("tiny")):
        if r.name.endswith("_HI") and r.offset >= 0x40:
            continue
        name = r.name[:-3] if r.name.endswith("_LO") and r.offset >= 0x40 else r.name
        assert f"| 0x{r.offset:02X} | {name} |" in doc, name
