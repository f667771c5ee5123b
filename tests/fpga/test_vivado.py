"""Board table, port grouping, and the Vivado build directory: files, wrapper lint, Tcl under a
recording stub of Vivado (order, objects, pins, CONFIG values)."""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from conftest import STUB, needs_tclsh, needs_verilator

from accel.cli import main
from accel.hw.axi import ID_WIDTH
from accel.hw.boards import BOARDS, PARTS, BoardError, board, default_part, part
from accel.hw.fpga import PortError, lint_wrapper, make_rtl, read_top_ports, write_project
from accel.isa import AccelConfig, preset

BOARD_CONFIGS = [("pynq-z1", "pynq-z1"), ("ultra96", "ultra96"), ("zcu104", "default")]


# ---- board table ----------------------------------------------------------------------------
def test_boards_table_is_consistent():
    for b in BOARDS.values():
        assert b.part_name in PARTS and b.part.is_xilinx
        assert b.ps.clk_pin and b.hp_width_max in (64, 128)
        assert all(v > 0 for v in b.part.capacity().values())
    assert board("pynq-z1").part.name == "xc7z020clg400-1"
    assert board("ULTRA96V2").part.name == "xczu3eg-sbva484-1-i"
    assert board("zcu104").part.name == "xczu7ev-ffvc1156-2-e"
    assert part("85k").name == "LFE5U-85F-6BG381C" and default_part("ecp5").brams == 208


def test_boards_unknown_names_list_the_known_ones():
    with pytest.raises(BoardError, match="unknown board 'pynq-z2'; boards are pynq-z1, ultra96, zcu104"):
        board("pynq-z2")
    with pytest.raises(BoardError, match="unknown part 'xc7k325t'.*xc7z020clg400-1"):
        part("xc7k325t")


def test_boards_hp_width_choice():
    pynq = board("pynq-z1")
    assert [pynq.hp_width_for(w) for w in (32, 64, 128)] == [32, 64, 64]
    assert board("ultra96").hp_width_for(256) == 128


# ---- ports ----------------------------------------------------------------------------------
def test_ports_group_the_standin(rtl_of):
    p = rtl_of("tiny").ports
    assert (p.clock.name, p.reset.name, p.reset_active_low, p.irq.name) == ("clk", "rst", False, "irq")
    assert p.mem.prefix == "mem__" and p.mem.data_width == 64 and p.mem.addr_width == 32 and not p.mem.is_lite
    assert p.ctrl.prefix == "ctrl__" and p.ctrl.is_lite and p.ctrl.data_width == 32


def test_ports_ansi_header_and_nested_names():
    sigs = {"aw__addr": ("output", 32), "aw__valid": ("output", 1), "aw__ready": ("input", 1),
            "w__data": ("output", 128), "w__valid": ("output", 1), "w__ready": ("input", 1),
            "b__valid": ("input", 1), "b__ready": ("output", 1), "ar__addr": ("output", 32),
            "ar__valid": ("output", 1), "ar__ready": ("input", 1), "r__data": ("input", 128),
            "r__valid": ("input", 1), "r__ready": ("output", 1), "ar__len": ("output", 8)}
    lite = {k.replace("__", ""): ("input" if d == "output" else "output", 32 if w > 32 else w)
            for k, (d, w) in sigs.items() if "len" not in k}
    decl = [f"{d} wire {'[%d:0] ' % (w - 1) if w > 1 else ''}bus__{n}" for n, (d, w) in sigs.items()]
    decl += [f"{d} wire {'[%d:0] ' % (w - 1) if w > 1 else ''}s_axi_{n}" for n, (d, w) in lite.items()]
    text = "module core (input wire aclk, input wire aresetn, output wire done, output wire [7:0] dbg,\n  " + \
           ",\n  ".join(decl) + ");\nendmodule\n"
    p = read_top_ports(text)
    assert p.module == "core" and p.clock.name == "aclk" and p.reset_active_low and p.irq.name == "done"
    assert p.mem.prefix == "bus__" and p.mem.signals["awaddr"].name == "bus__aw__addr" and p.mem.data_width == 128
    assert p.ctrl.prefix == "s_axi_" and [o.name for o in p.other] == ["dbg"]


def test_ports_missing_or_backwards_interfaces_are_named(rtl_of):
    text = rtl_of("tiny").verilog
    with pytest.raises(PortError, match="expected one AXI4-Lite slave.*found 0"):
        read_top_ports(text.replace("ctrl__awvalid", "ctrl__awvalidx"))
    flipped = text.replace("input mem__wready", "output mem__wready")
    with pytest.raises(PortError, match="mem__wready .output. has the wrong direction for WREADY of an AXI master"):
        read_top_ports(flipped)


# ---- build directory ------------------------------------------------------------------------
@pytest.fixture(scope="module", params=BOARD_CONFIGS, ids=[b for b, _ in BOARD_CONFIGS])
def built(request, tmp_path_factory, rtl_of):
    name, cfg_name = request.param
    cfg = preset(cfg_name)
    out = tmp_path_factory.mktemp(f"build-{name}") / "out"
    res = write_project(board(name), cfg, rtl_of(cfg), out)
    return name, cfg, out, res


def test_build_writes_every_vivado_input(built):
    name, cfg, out, res = built
    for rel in ("build.tcl", "bd.tcl", "rtl/accel_top.v", "rtl/accel_wrapper.v", "constraints/accel.xdc",
                "overlay/accel.json", "config.json", "ports.json"):
        assert (out / rel).is_file(), rel
    meta = json.loads((out / "overlay/accel.json").read_text())
    b = board(name)
    assert meta["format"] == "accel-overlay/1" and meta["board"]["part"] == b.part.name
    assert meta["config"] == cfg.to_dict() and AccelConfig.load(out / "config.json") == cfg
    assert meta["control"]["base_address"] == b.ctrl_base and meta["control"]["registers"][0]["name"] == "CTRL"
    assert meta["memory"]["hp_data_width"] == b.hp_width_for(cfg.bus_width)
    assert meta["interrupt"]["ps_pin"].endswith(b.ps.irq_pin)
    assert meta["files"] == {"bitstream": "accel.bit", "hwh": "accel.hwh", "xsa": "accel.xsa"}
    assert "-part $part" in (out / "build.tcl").read_text() and b.part.name in (out / "build.tcl").read_text()


@needs_verilator
def test_build_wrapper_passes_verilator_lint(built):
    _, _, out, _ = built
    proc = lint_wrapper(out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "%Warning" not in proc.stderr


def run_stub(build_dir, tmp_path, **env):
    log = tmp_path / "vivado.jsonl"
    proc = subprocess.run(["tclsh", str(STUB), str(build_dir / "build.tcl"), str(log)], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, **env}, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


@needs_tclsh
@pytest.mark.parametrize("board_files", ["0", "1"])
def test_build_tcl_runs_in_order_under_the_vivado_stub(built, tmp_path, board_files):
    name, cfg, out, _ = built
    proc, calls = run_stub(out, tmp_path, STUB_BOARD_FILES=board_files)
    assert proc.returncode == 0, proc.stderr
    assert calls[-1] == ["END"]
    cmds = [c[0] for c in calls]
    order = ["create_project", "add_files", "create_bd_design", "validate_bd_design", "save_bd_design",
             "generate_target", "make_wrapper", "launch_runs", "wait_on_run", "write_hw_platform"]
    assert [cmds.index(c) for c in order] == sorted(cmds.index(c) for c in order)
    b = board(name)
    ps_cfg = next(c for c in calls if c[0] == "set_property" and c[1] == "-dict" and c[-1] == "cell:zynq_ps")
    props = dict(zip(ps_cfg[2].split()[0::2], ps_cfg[2].split()[1::2]))
    assert float(props[f"CONFIG.{b.ps.config_fclk_mhz}"]) == cfg.clock_mhz
    assert int(props[f"CONFIG.{b.ps.config_hp_width}"]) == b.hp_width_for(cfg.bus_width)
    assert ("set_property" in cmds and ["set_property", "board_part", b.board_part, "project:accel_" +
                                        name.replace("-", "_")] in calls) == (board_files == "1")
    for f in ("accel.bit", "accel.hwh", "accel.xsa"):
        assert (out / "overlay" / f).is_file()


@needs_tclsh
@pytest.mark.parametrize("mutation", ["order", "syntax", "typo", "unconnected"])
def test_build_tcl_stub_rejects_broken_scripts(tmp_path, rtl_of, mutation):
    cfg = preset("tiny")
    out = tmp_path / "out"
    write_project(board("pynq-z1"), cfg, rtl_of(cfg), out)
    build, bd = out / "build.tcl", out / "bd.tcl"
    if mutation == "order":  # the block design before the sources it references
        text = build.read_text()
        src = "source [file join $here bd.tcl]\n"
        build.write_text(text.replace(src, "").replace("create_project -force", src + "create_project -force"))
    elif mutation == "syntax":
        bd.write_text(bd.read_text().replace("set_property -dict [list \\", "set_property -dict [list {\\", 1))
    elif mutation == "typo":
        bd.write_text(bd.read_text().replace("connect_bd_intf_net", "conect_bd_intf_net", 1))
    elif mutation == "unconnected":
        bd.write_text("\n".join(l for l in bd.read_text().splitlines() if "accel_0/irq" not in l))
    proc, _ = run_stub(out, tmp_path)
    assert proc.returncode != 0
    expect = {"order": "set_property before create_project|create_bd_design before create_project",
              "syntax": "missing close-bracket|missing close-brace|extra characters",
              "typo": "unknown command 'conect_bd_intf_net'",
              "unconnected": "accel_0/irq is not connected"}[mutation]
    assert any(e in proc.stderr for e in expect.split("|")), proc.stderr


@needs_tclsh
@pytest.mark.parametrize("wns", ["-0.042", "0.000", ""])
def test_build_tcl_fails_on_negative_slack_after_implementation(tmp_path, rtl_of, wns):
    """Setup or hold slack below zero (or no timed path at all) stops the script with an error before
    the overlay is written; timing.json records what was measured."""
    cfg = preset("tiny")
    out = tmp_path / "out"
    write_project(board("pynq-z1"), cfg, rtl_of(cfg), out)
    text = (out / "build.tcl").read_text()
    assert "-setup]]" in text and "-hold]]" in text and "CRITICAL WARNING" not in text
    proc, calls = run_stub(out, tmp_path, STUB_WNS=wns)
    timing = json.loads((out / "reports/timing.json").read_text())
    assert timing["clock_mhz"] == 100
    if wns == "0.000":
        assert proc.returncode == 0, proc.stderr
        assert timing == {"clock_mhz": 100, "wns_ns": 0.0, "whs_ns": 0.0, "met": True}
        assert (out / "overlay/accel.bit").is_file()
        return
    assert proc.returncode != 0
    assert "timing not met at 100 MHz after implementation" in proc.stderr, proc.stderr
    assert f"setup WNS {wns or 'null'} ns" in proc.stderr
    assert timing["met"] is False and timing["wns_ns"] == (float(wns) if wns else None)
    assert not (out / "overlay/accel.bit").exists() and "write_hw_platform" not in [c[0] for c in calls]


def test_block_design_declares_the_masters_outstanding_bursts(tmp_path, rtl_of):
    """The wrapper's m_axi parameters say what the RTL issues (accel/hw/axi.py), so the
    SmartConnect tracks enough transactions: read/write outstanding and the longest burst."""
    for cfg in (preset("tiny"), preset("tiny").replace(read_outstanding=7, write_outstanding=2)):
        out = tmp_path / f"o{cfg.read_outstanding}"
        write_project(board("pynq-z1"), cfg, rtl_of(preset("tiny")), out)
        text = (out / "rtl/accel_wrapper.v").read_text()
        assert (f"MAX_BURST_LENGTH {cfg.max_burst_beats}, NUM_READ_OUTSTANDING {cfg.read_outstanding}, "
                f"NUM_WRITE_OUTSTANDING {cfg.write_outstanding}") in text


# ---- checks and errors ------------------------------------------------------------------------
def test_build_rejects_what_the_board_cannot_host(tmp_path, rtl_of):
    fast = preset("tiny").replace(clock_mhz=300.0)
    with pytest.raises(BoardError, match="clock_mhz=300 exceeds pynq-z1's fabric clock limit 250 MHz"):
        write_project(board("pynq-z1"), fast, rtl_of(fast), tmp_path / "a")
    narrow = preset("tiny").replace(dram_addr_width=28)
    with pytest.raises(BoardError, match="dram_addr_width=28 reaches 256 MiB but pynq-z1's DDR spans 512 MiB"):
        write_project(board("pynq-z1"), narrow, rtl_of(narrow), tmp_path / "b")
    with pytest.raises(BoardError, match="is 64 bits wide but AccelConfig.bus_width=128"):
        write_project(board("pynq-z1"), preset("tiny").replace(bus_width=128), rtl_of("tiny"), tmp_path / "c")
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_build_warns_when_the_bus_is_wider_than_the_hp_port(tmp_path, rtl_of):
    wide = preset("tiny").replace(bus_width=128)
    res = write_project(board("pynq-z1"), wide, rtl_of(wide), tmp_path / "w")
    assert any("SmartConnect converts widths" in w for w in res.warnings)
    assert res.metadata["memory"]["hp_data_width"] == 64


@needs_verilator
@needs_tclsh
def test_build_shell_adapts_to_active_low_reset_no_irq_and_extra_outputs(tmp_path, rtl_of):
    """A core with aresetn, no interrupt, no AxCACHE and a debug output still lints and builds."""
    text = rtl_of("tiny").verilog
    for s in ("mem__awcache", "mem__arcache"):  # make them internal wires
        text = re.sub(rf"\boutput \[3:0\] {s};", "", text)
        text = re.sub(rf"\(\s*{s}\s*,", "(", re.sub(rf",\s*{s}(?=\s*[,)])", "", text))
        text = re.sub(rf"\b{s}\b", f"{s}_int", text)
    text = re.sub(r"\birq\b", "dbg_done", re.sub(r"\brst\b", "rst_n", text))
    rtl = make_rtl(text)
    assert rtl.ports.irq is None and rtl.ports.reset_active_low and [o.name for o in rtl.ports.other] == ["dbg_done"]
    out = tmp_path / "out"
    res = write_project(board("pynq-z1"), preset("tiny"), rtl, out)
    wrapper = (out / "rtl/accel_wrapper.v").read_text()
    assert "assign m_axi_awcache = 4'b0011;" in wrapper and ".rst_n(rst_n)" in wrapper
    assert res.metadata["interrupt"] is None and "IRQ_F2P" not in (out / "bd.tcl").read_text()
    proc = lint_wrapper(out)
    assert proc.returncode == 0, proc.stderr
    proc, _ = run_stub(out, tmp_path)
    assert proc.returncode == 0, proc.stderr


@needs_verilator
@needs_tclsh
@pytest.mark.parametrize("board_name", ["pynq-z1", "ultra96"])
def test_build_with_the_kit_generator_lints_and_runs_under_the_stub(tmp_path, board_name):
    """The real accelerator (accel.hw.verilog) through `accel build`: shell lint and Tcl under the stub."""
    pytest.importorskip("accel.hw.verilog")
    out = tmp_path / "out"
    assert main(["build", "--board", board_name, "--config", "tiny", "-o", str(out)]) == 0
    meta = json.loads((out / "overlay/accel.json").read_text())
    assert meta["rtl"]["origin"].startswith("accel.hw.verilog") and meta["control"]["registers"]
    # the interconnect is told the core's ID width: one ID per direction (accel/hw/axi.py), so the
    # SmartConnect keeps each direction's responses in issue order
    text = (out / "rtl/accel_wrapper.v").read_text()
    assert f"ID_WIDTH {ID_WIDTH}, MAX_BURST_LENGTH" in text
    for sig in ("arid", "rid", "awid", "bid"):
        decl = re.search(rf"wire\s+(\[(\d+):0\]\s*)?m_axi_{sig},", text)
        assert decl and (int(decl.group(2)) + 1 if decl.group(2) else 1) == ID_WIDTH, sig
    assert meta["estimate"] is None or meta["estimate"]["fit"]["part"] == board(board_name).part.name
    proc = lint_wrapper(out)
    assert proc.returncode == 0, proc.stderr
    proc, calls = run_stub(out, tmp_path)
    assert proc.returncode == 0, proc.stderr
    irq = ["get_bd_pins", "accel_0/irq"], ["get_bd_pins", f"zynq_ps/{board(board_name).ps.irq_pin}"]
    assert all(i in calls for i in irq)
