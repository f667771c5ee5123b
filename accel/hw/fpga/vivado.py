"""Vivado project inputs for a Zynq board: everything `vivado -mode batch -source build.tcl` needs
to turn the accelerator into a bitstream and a hardware handoff for PYNQ.

Layout of a build directory (all text, all generated from the board table and the core's ports):
    build.tcl                 project, sources, block design, implementation, overlay export
    bd.tcl                    block design: PS + accelerator + SmartConnects + reset, address map
    rtl/<core>.v              the accelerator's Verilog, as generated
    rtl/accel_wrapper.v       shell: Xilinx interface names and attributes, reset polarity, AXI defaults
    constraints/accel.xdc     bitstream settings (the PS constrains its own fabric clock)
    overlay/accel.json        metadata for the board-side runtime (build.tcl adds .bit/.hwh/.xsa)
    config.json, ports.json   the AccelConfig and the core's grouped ports, for the record
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

from accel.hw.boards import Board, BoardError
from accel.isa import AccelConfig

from .errors import FpgaError
from .ports import _MASTER_OUT, AXI4_SIGNALS, AxiInterface, TopPorts
from .rtl import RtlSource

log = logging.getLogger(__name__)

FORMAT = "accel-overlay/1"
WRAPPER = "accel_wrapper"
BD_NAME = "accel_bd"
ACCEL_CELL = "accel_0"
PS_CELL = "zynq_ps"
OVERLAY_BASENAME = "accel"
MIN_VIVADO = "2020.2"  # assign_bd_address -offset/-range and write_hw_platform as used here

# AXI signals the shell drives with constants when the core does not: what Xilinx HP ports expect.
_AXI_DEFAULTS = {"awcache": ("0011", 4), "arcache": ("0011", 4), "awprot": ("000", 3), "arprot": ("000", 3)}


@dataclass
class BuildResult:
    out_dir: Path
    files: list[Path]
    metadata: dict
    warnings: list[str] = field(default_factory=list)


# ---- checks ---------------------------------------------------------------------------------
def check_board_config(board: Board, cfg: AccelConfig, ports: TopPorts) -> list[str]:
    """Errors for what the board cannot host; warnings (returned) for what works but costs."""
    warnings = []
    if cfg.clock_mhz > board.max_fabric_mhz:
        raise BoardError(f"AccelConfig.clock_mhz={cfg.clock_mhz:g} exceeds {board.name}'s fabric clock limit "
                         f"{board.max_fabric_mhz:g} MHz")
    reach = 1 << ports.mem.addr_width
    if reach < board.ddr_bytes:
        raise BoardError(f"AccelConfig.dram_addr_width={ports.mem.addr_width} reaches {reach >> 20} MiB but "
                         f"{board.name}'s DDR spans {board.ddr_bytes >> 20} MiB; PYNQ may place buffers anywhere in it")
    if ports.mem.data_width != cfg.bus_width:
        raise BoardError(f"the core's memory port {ports.mem.prefix}* is {ports.mem.data_width} bits wide but "
                         f"AccelConfig.bus_width={cfg.bus_width}; regenerate the Verilog for this config")
    hp = board.hp_width_for(cfg.bus_width)
    if hp != cfg.bus_width:
        warnings.append(f"bus_width={cfg.bus_width} does not match {board.name}'s HP port ({hp} bits used): a "
                        f"SmartConnect converts widths, so memory bandwidth is that of a {min(hp, cfg.bus_width)}-bit port")
    return warnings


# ---- wrapper ----------------------------------------------------------------------------------
def _vrange(width: int) -> str:
    return f"[{width - 1}:0] " if width > 1 else ""


def _wrapper_axi_ports(intf: AxiInterface, name: str, *, master: bool) -> list[tuple[str, str, int, str | None]]:
    """(direction, wrapper port, width, core port or None for a constant) for one AXI interface."""
    out = []
    for sig in AXI4_SIGNALS:
        core = intf.signals.get(sig)
        if core is None and not (master and sig in _AXI_DEFAULTS):
            continue
        drives = (sig in _MASTER_OUT) == master  # the wrapper port is an output
        width = core.width if core else _AXI_DEFAULTS[sig][1]
        out.append(("output" if drives else "input", f"{name}_{sig}", width, core.name if core else None))
    return out


def wrapper_verilog(board: Board, cfg: AccelConfig, rtl: RtlSource) -> str:
    """The shell module `accel_wrapper` that the block design instantiates as a module reference."""
    p = rtl.ports
    mem = _wrapper_axi_ports(p.mem, "m_axi", master=True)
    ctrl = _wrapper_axi_ports(p.ctrl, "s_axi", master=False)
    busifs = "m_axi:s_axi"
    decl: list[str] = []

    def port(direction, name, width, attrs=()):
        for a in attrs:
            decl.append(f"    (* {a} *)")
        decl.append(f"    {direction:<6} wire {_vrange(width)}{name},")

    clk_params = f"ASSOCIATED_BUSIF {busifs}" + (", ASSOCIATED_RESET rst_n" if p.reset else "")
    port("input", "clk", 1, ('X_INTERFACE_INFO = "xilinx.com:signal:clock:1.0 clk CLK"',
                             f'X_INTERFACE_PARAMETER = "{clk_params}"'))
    if p.reset:
        port("input", "rst_n", 1, ('X_INTERFACE_INFO = "xilinx.com:signal:reset:1.0 rst_n RST"',
                                   'X_INTERFACE_PARAMETER = "POLARITY ACTIVE_LOW"'))
    if p.irq:
        port("output", "irq", 1, ('X_INTERFACE_INFO = "xilinx.com:signal:interrupt:1.0 irq INTERRUPT"',
                                  'X_INTERFACE_PARAMETER = "SENSITIVITY LEVEL_HIGH"'))
    for intf, rows, name in ((p.mem, mem, "m_axi"), (p.ctrl, ctrl, "s_axi")):
        params = (f"PROTOCOL {intf.protocol}, DATA_WIDTH {intf.data_width}, ADDR_WIDTH {intf.addr_width}, "
                  f"ID_WIDTH {intf.id_width}")
        if name == "m_axi":
            # what the AXI master issues (accel/hw/axi.py): the interconnect sizes its tracking by these
            params += (f", MAX_BURST_LENGTH {cfg.max_burst_beats}, NUM_READ_OUTSTANDING {cfg.read_outstanding}, "
                       f"NUM_WRITE_OUTSTANDING {cfg.write_outstanding}")
        for i, (direction, wname, width, _core) in enumerate(rows):
            sig = wname[len(name) + 1:].upper()
            attrs = [f'X_INTERFACE_INFO = "xilinx.com:interface:aximm:1.0 {name} {sig}"']
            if i == 0:
                attrs.append(f'X_INTERFACE_PARAMETER = "{params}"')
            port(direction, wname, width, attrs)
    decl[-1] = decl[-1].rstrip(",")

    conns = [f".{p.clock.name}(clk)"]
    body = []
    if p.reset:
        if p.reset_active_low:
            conns.append(f".{p.reset.name}(rst_n)")
        else:
            body.append("    // The core resets on a high level; the PS reset block drives an active-low one.")
            body.append("    wire core_rst = ~rst_n;")
            conns.append(f".{p.reset.name}(core_rst)")
    if p.irq:
        conns.append(f".{p.irq.name}(irq)")
    consts = []
    for rows in (mem, ctrl):
        for _direction, wname, width, core in rows:
            if core is None:
                sig = wname.split("_", 2)[-1]
                consts.append(f"    assign {wname} = {width}'b{_AXI_DEFAULTS[sig][0]};")
            else:
                conns.append(f".{core}({wname})")
    if p.other:
        body.append("    // Core outputs the board shell does not use.")
        body.append("    /* verilator lint_off UNUSEDSIGNAL */")
        for o in p.other:
            body.append(f"    wire {_vrange(o.width)}unused_{o.name};")
            conns.append(f".{o.name}(unused_{o.name})")
        body.append("    /* verilator lint_on UNUSEDSIGNAL */")
    if consts:
        body.append("    // AXI attributes the core does not drive: normal non-cacheable bufferable, unprivileged.")
        body.extend(consts)

    core_name = rtl.top if not rtl.top.startswith("\\") else rtl.top + " "
    lines = [
        f"// accel_wrapper: Zynq block-design shell around {rtl.top} for {board.name} ({board.part.name}).",
        "// Generated by `accel build`; regenerate rather than edit.",
        f"// Config {cfg.digest()}: bus {cfg.bus_width} bits, DRAM address {cfg.dram_addr_width} bits, "
        f"fabric clock {cfg.clock_mhz:g} MHz (set on the PS, not here).",
        "// m_axi: AXI4 master to the PS high-performance port; s_axi: AXI4-Lite control registers;",
        "// rst_n: active-low reset from the PS reset block; irq: level interrupt to the PS.",
        "`default_nettype none",
        "",
        f"module {WRAPPER} (",
        *decl,
        ");",
        *body,
        "",
        f"    {core_name} core (",
        *[f"        {c}," for c in conns[:-1]],
        f"        {conns[-1]}",
        "    );",
        "endmodule",
        "",
        "`default_nettype wire",
        "",
    ]
    return "\n".join(lines)


# ---- Tcl --------------------------------------------------------------------------------------
def _tcl_dict(d: dict) -> str:
    return " \\\n    ".join(f"CONFIG.{k} {{{v}}}" for k, v in d.items())


def _fmt_mhz(v: float) -> str:
    return f"{v:.6f}".rstrip("0").rstrip(".")


def ps_config(board: Board, cfg: AccelConfig, ports: TopPorts) -> dict[str, str]:
    """CONFIG.* properties of the PS cell: fabric clock, HP port, GP port, interrupt."""
    ps = board.ps
    c = dict(ps.config_fixed)
    c[ps.config_fclk_mhz] = _fmt_mhz(cfg.clock_mhz)
    c[ps.config_hp_enable] = "1"
    c[ps.config_hp_width] = str(board.hp_width_for(cfg.bus_width))
    c[ps.config_gp_enable] = "1"
    if ps.gp_width_key:
        c[ps.gp_width_key] = str(board.gp_width)
    if ports.irq:
        for k in ps.config_irq:
            c[k] = "1"
    return c


def bd_tcl(board: Board, cfg: AccelConfig, rtl: RtlSource) -> str:
    ps, p = board.ps, rtl.ports
    # [list ...] rather than braces: $use_board_preset must be substituted.
    automation = ('[list make_external "FIXED_IO, DDR" apply_board_preset $use_board_preset Master Disable '
                  'Slave Disable]' if ps.kind == "ps7" else '[list apply_board_preset $use_board_preset]')
    clk_pins = [f"{PS_CELL}/{ps.clk_pin}", f"{PS_CELL}/{ps.gp_aclk}", f"{PS_CELL}/{ps.hp_aclk}",
                "rst_0/slowest_sync_clk", "mem_sc/aclk", "ctrl_sc/aclk", f"{ACCEL_CELL}/clk"]
    lines = [
        f"# Block design {BD_NAME} for {board.name} ({board.part.name}): generated by `accel build`.",
        "# Sourced by build.tcl once the project and the RTL sources exist; expects $use_board_preset.",
        "# Zynq PS -> GP port -> SmartConnect -> accelerator control registers (AXI4-Lite);",
        "# accelerator AXI4 master -> SmartConnect -> PS HP port -> DDR; level interrupt to the PS.",
        f"create_bd_design {BD_NAME}",
        f"current_bd_design {BD_NAME}",
        "",
        "# Processing system: board preset (MIO, DDR) when the board files are installed.",
        f"set ps [create_bd_cell -type ip -vlnv {ps.vlnv} {PS_CELL}]",
        f"apply_bd_automation -rule {ps.automation_rule} -config {automation} $ps",
        "# Fabric clock, memory and control ports, interrupt.",
        "set_property -dict [list \\",
        "    " + _tcl_dict(ps_config(board, cfg, p)) + " \\",
        "] $ps",
        "",
        "# The accelerator (module reference to the shell in rtl/), reset and interconnect.",
        f"set accel [create_bd_cell -type module -reference {WRAPPER} {ACCEL_CELL}]",
        "set rst [create_bd_cell -type ip -vlnv xilinx.com:ip:proc_sys_reset:5.0 rst_0]",
        "set mem_sc [create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:1.0 mem_sc]",
        "set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] $mem_sc",
        "set ctrl_sc [create_bd_cell -type ip -vlnv xilinx.com:ip:smartconnect:1.0 ctrl_sc]",
        "set_property -dict [list CONFIG.NUM_SI {1} CONFIG.NUM_MI {1}] $ctrl_sc",
        "",
        "# One fabric clock for the PS ports, the interconnect and the accelerator.",
        "connect_bd_net " + " ".join(f"[get_bd_pins {x}]" for x in clk_pins),
        f"connect_bd_net [get_bd_pins {PS_CELL}/{ps.resetn_pin}] [get_bd_pins rst_0/ext_reset_in]",
        "connect_bd_net [get_bd_pins rst_0/interconnect_aresetn] [get_bd_pins mem_sc/aresetn] "
        "[get_bd_pins ctrl_sc/aresetn]",
    ]
    if p.reset:
        lines.append(f"connect_bd_net [get_bd_pins rst_0/peripheral_aresetn] [get_bd_pins {ACCEL_CELL}/rst_n]")
    lines += [
        "",
        "# Memory: accelerator master to DDR through the HP port.",
        f"connect_bd_intf_net [get_bd_intf_pins {ACCEL_CELL}/m_axi] [get_bd_intf_pins mem_sc/S00_AXI]",
        f"connect_bd_intf_net [get_bd_intf_pins mem_sc/M00_AXI] [get_bd_intf_pins {PS_CELL}/{ps.hp_intf}]",
        "# Control: PS general-purpose master to the accelerator's registers.",
        f"connect_bd_intf_net [get_bd_intf_pins {PS_CELL}/{ps.gp_intf}] [get_bd_intf_pins ctrl_sc/S00_AXI]",
        f"connect_bd_intf_net [get_bd_intf_pins ctrl_sc/M00_AXI] [get_bd_intf_pins {ACCEL_CELL}/s_axi]",
    ]
    if p.irq:
        lines += ["# Interrupt: the accelerator's done level on the PS fabric interrupt 0.",
                  f"connect_bd_net [get_bd_pins {ACCEL_CELL}/irq] [get_bd_pins {PS_CELL}/{ps.irq_pin}]"]
    lines += [
        "",
        "# Address map: control registers in the PS window PYNQ expects; the accelerator sees the DDR.",
        f"assign_bd_address -target_address_space [get_bd_addr_spaces {PS_CELL}/{ps.gp_space}] "
        f"-offset {board.ctrl_base:#010x} -range {board.ctrl_range // 1024}K [get_bd_addr_segs {ACCEL_CELL}/s_axi/reg0]",
        f"assign_bd_address -target_address_space [get_bd_addr_spaces {ACCEL_CELL}/m_axi] "
        f"[get_bd_addr_segs {PS_CELL}/{ps.hp_seg}]",
        "",
        "validate_bd_design",
        "save_bd_design",
        "",
    ]
    return "\n".join(lines)


def build_tcl(board: Board, cfg: AccelConfig, rtl: RtlSource) -> str:
    project = f"accel_{board.name.replace('-', '_')}"
    return "\n".join([
        f"# Bitstream and hardware handoff for {board.name} ({board.part.name}): generated by `accel build`.",
        "# Run from anywhere:   vivado -mode batch -source build.tcl",
        f"# Needs Vivado {MIN_VIVADO} or later. Writes the project to vivado/, reports to reports/ and",
        f"# overlay/{OVERLAY_BASENAME}.bit, overlay/{OVERLAY_BASENAME}.hwh and overlay/{OVERLAY_BASENAME}.xsa "
        f"next to overlay/{OVERLAY_BASENAME}.json.",
        "# Parallel jobs: set ACCEL_VIVADO_JOBS (default 4).",
        "set here [file dirname [file normalize [info script]]]",
        f"set proj_name {project}",
        f"set part {board.part.name}",
        f"set board_part {board.board_part}",
        "set jobs 4",
        "if {[info exists ::env(ACCEL_VIVADO_JOBS)]} { set jobs $::env(ACCEL_VIVADO_JOBS) }",
        "",
        "create_project -force $proj_name [file join $here vivado] -part $part",
        "set use_board_preset 0",
        "if {[llength [get_board_parts -quiet $board_part]] > 0} {",
        "    set_property board_part $board_part [current_project]",
        "    set use_board_preset 1",
        "} else {",
        "    puts \"WARNING: board files for $board_part are not installed; the PS keeps the part's defaults."
        " PYNQ configures the PS at boot, so the overlay still loads; install the board files for a standalone design.\"",
        "}",
        "",
        "# Sources: the generated core and its Zynq shell, then the constraints.",
        f"add_files -norecurse [list [file join $here rtl {rtl.file_name}] [file join $here rtl {WRAPPER}.v]]",
        "add_files -fileset constrs_1 -norecurse [file join $here constraints accel.xdc]",
        "update_compile_order -fileset sources_1",
        "",
        "# Block design (needs use_board_preset), its output products and the HDL top.",
        "source [file join $here bd.tcl]",
        f"set bd_file [get_files {BD_NAME}.bd]",
        "generate_target all $bd_file",
        "make_wrapper -files $bd_file -top -import",
        f"set_property top {BD_NAME}_wrapper [current_fileset]",
        "update_compile_order -fileset sources_1",
        "",
        "# Synthesis, implementation, bitstream.",
        "launch_runs impl_1 -to_step write_bitstream -jobs $jobs",
        "wait_on_run impl_1",
        "if {[get_property PROGRESS [get_runs impl_1]] ne \"100%\"} {",
        "    error \"implementation did not finish: see [get_property DIRECTORY [get_runs impl_1]]\"",
        "}",
        "",
        "# Reports: utilization and timing as Vivado measured them.",
        "open_run impl_1",
        "file mkdir [file join $here reports]",
        "report_utilization -file [file join $here reports utilization.txt]",
        "report_timing_summary -file [file join $here reports timing_summary.txt]",
        "# A design that misses timing is not handed to the board: fail before the overlay is written.",
        "set wns [get_property SLACK [get_timing_paths -max_paths 1 -nworst 1 -setup]]",
        "set whs [get_property SLACK [get_timing_paths -max_paths 1 -nworst 1 -hold]]",
        "if {$wns eq \"\"} { set wns null }",
        "if {$whs eq \"\"} { set whs null }",
        "set met [expr {$wns ne \"null\" && $whs ne \"null\" && $wns >= 0 && $whs >= 0}]",
        "set fh [open [file join $here reports timing.json] w]",
        "set met_json [expr {$met ? \"true\" : \"false\"}]",
        f"puts $fh \"{{\\\"clock_mhz\\\": {_fmt_mhz(cfg.clock_mhz)}, \\\"wns_ns\\\": $wns, "
        "\\\"whs_ns\\\": $whs, \\\"met\\\": $met_json}\"",
        "close $fh",
        "if {!$met} {",
        f"    error \"timing not met at {_fmt_mhz(cfg.clock_mhz)} MHz after implementation (setup WNS $wns ns, "
        "hold WHS $whs ns): lower clock_mhz in the config and rebuild; see reports/timing_summary.txt\"",
        "}",
        "",
        "# Overlay: bitstream and hardware handoff with one base name, as PYNQ loads them.",
        "set out [file join $here overlay]",
        "file mkdir $out",
        f"file copy -force [file join [get_property DIRECTORY [get_runs impl_1]] {BD_NAME}_wrapper.bit] "
        f"[file join $out {OVERLAY_BASENAME}.bit]",
        f"set hwh [lindex [get_files -all -of_objects $bd_file {BD_NAME}.hwh] 0]",
        f"file copy -force $hwh [file join $out {OVERLAY_BASENAME}.hwh]",
        f"write_hw_platform -fixed -include_bit -force -file [file join $out {OVERLAY_BASENAME}.xsa]",
        "puts \"overlay written to $out\"",
        "",
    ])


def constraints_xdc(board: Board, cfg: AccelConfig) -> str:
    return "\n".join([
        f"# Constraints for the accelerator on {board.name} ({board.part.name}): generated by `accel build`.",
        f"# The fabric clock ({_fmt_mhz(cfg.clock_mhz)} MHz) comes from the PS ({board.ps.clk_pin}); the PS IP",
        "# creates its clock constraint, so there is no create_clock here. All accelerator ports stay",
        "# inside the fabric (AXI to the PS), so there are no pin assignments either.",
        "set_property BITSTREAM.GENERAL.COMPRESS TRUE [current_design]",
        "",
    ])


# ---- metadata -----------------------------------------------------------------------------------
def overlay_metadata(board: Board, cfg: AccelConfig, rtl: RtlSource, warnings: list[str],
                     estimate: dict | None = None) -> dict:
    ps, p = board.ps, rtl.ports
    try:
        kit_version = version("accel-kit")
    except Exception:  # not installed as a distribution (running from a checkout)
        kit_version = "unknown"
    return {
        "format": FORMAT,
        "generated_by": f"accel-kit {kit_version}",
        "board": board.to_dict(),
        "files": {"bitstream": f"{OVERLAY_BASENAME}.bit", "hwh": f"{OVERLAY_BASENAME}.hwh",
                  "xsa": f"{OVERLAY_BASENAME}.xsa"},
        "config": cfg.to_dict(),
        "config_digest": cfg.digest(),
        "fabric_clock": {"requested_mhz": cfg.clock_mhz, "source": f"{PS_CELL}/{ps.clk_pin}",
                         "note": "the PS divides its PLL to the nearest achievable frequency; the .hwh has the actual one"},
        "ip_name": ACCEL_CELL,
        "control": {"base_address": board.ctrl_base, "range": board.ctrl_range, "interface": "s_axi",
                    "protocol": "AXI4LITE", "data_width": 32, "addr_width": p.ctrl.addr_width,
                    "registers": rtl.registers},
        "memory": {"port": ps.hp_intf, "accel_data_width": p.mem.data_width,
                   "hp_data_width": board.hp_width_for(cfg.bus_width), "addr_width": p.mem.addr_width,
                   "coherent": False,
                   "cache_maintenance": "flush buffers the accelerator reads before start; invalidate "
                                        "buffers it writes after done (HP ports do not snoop the CPU caches)"},
        "interrupt": ({"source": f"{ACCEL_CELL}/irq", "ps_pin": f"{PS_CELL}/{ps.irq_pin}", "index": 0,
                       "sensitivity": "level_high"} if p.irq else None),
        "rtl": {"top": rtl.top, "file": f"rtl/{rtl.file_name}", "sha256": rtl.sha256, "origin": rtl.origin},
        "estimate": estimate,
        "warnings": warnings,
    }


# ---- writing ----------------------------------------------------------------------------------
def write_project(board: Board, cfg: AccelConfig, rtl: RtlSource, out_dir: str | Path,
                  estimate: dict | None = None) -> BuildResult:
    """Write the Vivado inputs for `board` into out_dir (created; files of a previous build replaced).

    Everything is first written to a temporary folder beside out_dir and moved in only when all
    of it was generated, so a failure never leaves a half-written build.
    """
    out_dir = Path(out_dir)
    warnings = check_board_config(board, cfg, rtl.ports)
    meta = overlay_metadata(board, cfg, rtl, warnings, estimate)
    files = {
        "build.tcl": build_tcl(board, cfg, rtl),
        "bd.tcl": bd_tcl(board, cfg, rtl),
        f"rtl/{rtl.file_name}": rtl.verilog,
        f"rtl/{WRAPPER}.v": wrapper_verilog(board, cfg, rtl),
        "constraints/accel.xdc": constraints_xdc(board, cfg),
        f"overlay/{OVERLAY_BASENAME}.json": json.dumps(meta, indent=2) + "\n",
        "config.json": cfg.to_json() + "\n",
        "ports.json": json.dumps({"ports": rtl.ports.to_dict(), "description": rtl.description}, indent=2) + "\n",
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    if out_dir.exists() and not out_dir.is_dir():
        raise FpgaError(f"output {out_dir} exists and is not a directory")
    stage = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for rel, text in files.items():
            path = stage / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        written = []
        for rel in files:
            dst = out_dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / rel, dst)
            written.append(dst)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    for w in warnings:
        log.warning("%s", w)
    log.info("wrote Vivado inputs for %s to %s", board.name, out_dir)
    return BuildResult(out_dir=out_dir, files=written, metadata=meta, warnings=warnings)


# ---- lint -------------------------------------------------------------------------------------
def lint_wrapper(out_dir: str | Path, verilator: str = "verilator") -> subprocess.CompletedProcess:
    """Verilator -Wall lint of rtl/accel_wrapper.v against the core (whose own style is not linted).

    Returns the finished process; returncode 0 means clean. Raises FpgaError if Verilator is missing.
    """
    out_dir = Path(out_dir)
    exe = shutil.which(verilator)
    if exe is None:
        raise FpgaError("verilator not found on PATH (apt-get install verilator)")
    meta = json.loads((out_dir / "overlay" / f"{OVERLAY_BASENAME}.json").read_text())
    core = out_dir / meta["rtl"]["file"]
    with tempfile.TemporaryDirectory(prefix="accel-lint-") as tmp:
        vlt = Path(tmp) / "core.vlt"
        vlt.write_text(f'`verilator_config\nlint_off -file "{core.resolve()}"\n')
        cmd = [exe, "--lint-only", "-Wall", "--top-module", WRAPPER, str(vlt), str(core.resolve()),
               str((out_dir / "rtl" / f"{WRAPPER}.v").resolve())]
        return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
