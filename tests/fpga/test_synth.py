"""The open-tool flow: cell accounting, the ECP5 harness, yosys on the stand-in and on the real
tiny core (xc7), the full ECP5 flow (nextpnr Fmax, ecppack) on the stand-in, and designs that do
not fit. The first yowasp call on a machine compiles its WebAssembly (minutes); later calls are
cached, so this file runs in about a minute and a half on a warm machine."""
from __future__ import annotations

import json
import subprocess

import pytest
from conftest import needs_nextpnr, needs_verilator, needs_yosys, standin_rtl

from accel.cli import main
from accel.hw.boards import Part, part
from accel.hw.fpga import FpgaError, ToolError, rtl_for_config
from accel.hw.fpga.estimate import estimate
from accel.hw.fpga.synth import (
    HARNESS,
    _nextpnr_log_utilization,
    ecp5_harness,
    fit_check,
    format_table,
    synthesize,
    utilization_from_cells,
)
from accel.isa import preset


# ---- accounting -------------------------------------------------------------------------------
def test_synth_counts_cells_in_part_units():
    x = utilization_from_cells({"LUT6": 10, "LUT2": 5, "INV": 1, "RAM32M": 2, "SRLC32E": 1, "FDRE": 7, "FDSE": 1,
                                "DSP48E1": 3, "RAMB36E1": 2, "RAMB18E1": 3, "CARRY4": 4, "MUXF7": 9}, "xc7")
    assert x == {"lut": 10 + 5 + 1 + 8 + 1, "ff": 8, "dsp": 3, "bram": 3.5, "lutram": 9, "carry": 4}
    e = utilization_from_cells({"LUT4": 100, "CCU2C": 10, "TRELLIS_DPR16X4": 2, "TRELLIS_FF": 50, "MULT18X18D": 4,
                                "DP16KD": 6, "PFUMX": 20}, "ecp5")
    assert e == {"lut": 100 + 20 + 8, "ff": 50, "dsp": 4, "bram": 6.0, "lutram": 8, "carry": 10}


def test_synth_fit_check_margins_and_limiting_resource():
    f = fit_check({"lut": 60000, "ff": 1000, "dsp": 10, "bram": 70}, part("xc7z020"))
    assert not f["fits"] and f["limiting"] == "lut"
    assert f["resources"]["lut"]["margin"] == 53200 - 60000 and f["resources"]["bram"]["percent"] == 50.0


# ---- harness ----------------------------------------------------------------------------------
@needs_verilator
def test_synth_ecp5_harness_keeps_every_port_live(tmp_path, rtl_of):
    rtl = rtl_of("tiny")
    h = ecp5_harness(rtl)
    outs = sum(p.width for p in rtl.ports.ports if not p.is_input)
    ins = sum(p.width for p in rtl.ports.ports if p.is_input) - 2  # clk, rst come from pins
    assert (h.in_bits, h.out_bits) == (ins, outs)
    assert h.ffs > ins + outs and f"module {HARNESS} (input wire clk, input wire rst_in, input wire din, " \
                                  f"output wire dout)" in h.verilog
    (tmp_path / "core.v").write_text(rtl.verilog)
    (tmp_path / "h.v").write_text(h.verilog)
    proc = subprocess.run(["verilator", "--lint-only", "-Wno-fatal", "-Wno-lint", "-Wno-style", "--top-module", HARNESS,
                           "core.v", "h.v"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ---- yosys --------------------------------------------------------------------------------------
@needs_yosys
def test_synth_xc7_standin_report_json_table_and_logs(tmp_path, rtl_of):
    cfg = preset("tiny")
    rep = synthesize(rtl_of(cfg), "xc7", tmp_path, config=cfg)
    d = json.loads((tmp_path / "report.json").read_text())
    assert d["format"] == "accel-synth/1" and d["part"] == "xc7z020clg400-1" and d["fit"]["fits"]
    u = d["utilization"]
    assert u["dsp"] == 1 and u["bram"] == 1 and 100 < u["lut"] < 2000 and u["ff"] > 100
    assert d["tools"]["yosys"]["seconds"] > 0 and d["tools"]["yosys"]["version"].startswith("0.")
    assert (tmp_path / "yosys.log").stat().st_size > 1000 and (tmp_path / "synth.ys").exists()
    assert "fits" in (tmp_path / "report.txt").read_text() and rep.table() == format_table(d)


@needs_yosys
def test_synth_a_design_that_does_not_fit_is_a_report(tmp_path, rtl_of):
    small = Part("toy", "xc7", luts=100, ffs=100, dsps=0, brams=0, bram_unit="RAMB36", lutram_luts=0)
    rep = synthesize(rtl_of("tiny"), "xc7", tmp_path, part=small, config=preset("tiny"))
    assert not rep.fit["fits"] and rep.fit["resources"]["dsp"]["margin"] == -1
    assert "DOES NOT FIT" in (tmp_path / "report.txt").read_text()


@needs_yosys
def test_synth_tool_errors_name_the_tool_and_log(tmp_path, rtl_of):
    rtl = rtl_of("tiny")
    broken = type(rtl)(verilog=rtl.verilog.replace("endmodule", "endmodul", 1), top=rtl.top, ports=rtl.ports)
    with pytest.raises(ToolError, match=r"yosys failed \(exit \d+\); log .*ERROR: syntax error"):
        synthesize(broken, "xc7", tmp_path)
    with pytest.raises(FpgaError, match="part LFE5U-85F-6BG381C is ecp5, not xc7"):
        synthesize(rtl, "xc7", tmp_path, part="85k")


@needs_yosys
@needs_nextpnr
def test_synth_ecp5_standin_places_routes_and_packs(tmp_path, rtl_of):
    cfg = preset("tiny")
    rep = synthesize(rtl_of(cfg), "ecp5", tmp_path, config=cfg)
    d = rep.to_dict()
    assert d["pnr"]["status"] == "routed" and d["fit"]["fits"]
    assert 10 < d["timing"]["fmax_mhz"] < 500 and d["timing"]["target_mhz"] == 100
    placed = d["pnr"]["utilization"]
    assert placed["lut"]["used"] >= d["utilization"]["lut"] * 0.8 and placed["dsp"]["used"] == 1
    assert d["harness"]["ff"] > d["harness"]["input_bits"] + d["harness"]["output_bits"]
    assert d["bitstream"] == "accel.bit" and (tmp_path / "accel.bit").stat().st_size > 100_000
    for log in ("yosys.log", "nextpnr.log", "ecppack.log"):
        assert (tmp_path / log).exists()
    assert set(d["tools"]) == {"yosys", "nextpnr-ecp5", "ecppack"}


def test_synth_nextpnr_over_capacity_log_is_classified():
    log = ("Info: Device utilisation:\nInfo:          TRELLIS_IO:     4/  197     2%\n"
           "Info:                DCCA:     1/   56     1%\nInfo:              DP16KD:   114/   56   203%\n"
           "Info:          MULT18X18D:     1/   28     3%\nInfo:        TRELLIS_COMB:  1776/24288     7%\n"
           "ERROR: Unable to place cell 'core.buf.0.9', no BELs remaining to implement cell type 'DP16KD'\n")
    u = _nextpnr_log_utilization(log)
    assert u["bram"] == {"used": 114, "available": 56} and u["lut"]["used"] == 1776 and "ff" not in u


@pytest.mark.slow
@needs_yosys
@needs_nextpnr
def test_synth_ecp5_over_capacity_is_reported_not_raised(tmp_path):
    """A stand-in with 512-bit words and 4096 entries needs 128 EBRs; the LFE5U-25F has 56."""
    cfg = preset("tiny").replace(bus_width=512, inp_buff_bytes=16 * 1024)  # 4096 entries in the stand-in
    rep = synthesize(standin_rtl(cfg), "ecp5", tmp_path, part="25k", config=cfg)
    d = rep.to_dict()
    assert not d["fit"]["fits"] and d["utilization"]["bram"] > 56
    assert d["pnr"]["status"] == "does_not_fit" and d["bitstream"] is None
    assert "DOES NOT FIT" in (tmp_path / "report.txt").read_text()


@needs_yosys
def test_synth_real_tiny_core_xc7_matches_the_estimate(tmp_path):
    """The accelerator's own tiny config through yosys: per-module breakdown, and the estimator's
    BRAM and DSP counts exact, LUTs within 15%."""
    pytest.importorskip("accel.hw.verilog")
    cfg = preset("tiny")
    rep = synthesize(rtl_for_config(cfg), "xc7", tmp_path, config=cfg)
    u, e = rep.utilization, estimate(cfg, "xc7").utilization
    assert rep.fit["fits"] and any(m.endswith("compute.gemm") for m in rep.modules)
    assert (e["bram"], e["dsp"]) == (u["bram"], u["dsp"])
    assert abs(e["lut"] - u["lut"]) <= 0.15 * u["lut"]


@needs_yosys
def test_synth_cli_writes_report_and_prints_json(tmp_path, rtl_of, capsys):
    v = tmp_path / "core.v"
    v.write_text(rtl_of("tiny").verilog)
    out = tmp_path / "rep"
    assert main(["synth", "--config", "tiny", "--family", "xc7", "--verilog", str(v), "-o", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["utilization"]["dsp"] == 1 and (out / "report.json").exists() and (out / "yosys.log").exists()
    assert main(["synth", "--config", "tiny", "--family", "ecp5", "--part", "xc7z020", "--verilog", str(v),
                 "-o", str(out)]) == 2
    assert "part xc7z020clg400-1 is xc7, not ecp5" in capsys.readouterr().err


def test_estimate_cli_prints_the_fit(capsys):
    assert main(["estimate", "--config", "tiny", "--board", "pynq-z1"]) == 0
    text = capsys.readouterr().out
    assert "xc7z020clg400-1" in text and "bram" in text and "fits" in text
    assert main(["estimate", "--config", "tiny", "--family", "ecp5", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["part"] == "LFE5U-85F-6BG381C" and d["utilization"]["dsp"] == 35   # 33 by synth_ecp5 before the loaders' multiply
