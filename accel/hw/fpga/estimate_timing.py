"""The longest register-to-register path by yosys' static timing analysis (`sta`) after synth_xilinx:
the open tools' own estimate of the clock a 7-series part can reach, no place and route.

    python -m accel.hw.fpga.estimate_timing --config default -o DIR [--json]

What it counts: the cell delays of yosys' 7-series models (techlibs/xilinx/cells_sim.v, from
Project X-Ray: LUTs, carry chains, block RAM clock-to-out and setup, DSP48E1 combinational and
registered arcs) along the worst path; no routing delay, so Vivado's path after routing is longer
(typically 1.5-2x on carry- and DSP-heavy paths). The flip-flops' arcs in cells_sim.v carry enable
conditions that `sta` does not read, so the netlist is re-read with FF models of the same figures
without the conditions (FF_TIMING); without them no path would end at a flip-flop.

Run time: one synth_xilinx of the design (seconds for a module, minutes for the default core) and
a few seconds of analysis.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from accel.isa import resolve_config

from .errors import FpgaError, ToolError
from .rtl import rtl_for_config
from .synth import run_tool

# 7-series -1 figures (ps) as cells_sim.v gives them for FDRE: clock to Q 303, setup D 25, CE 109, R/S 404
FF_TIMING = "\n".join(
    f"""module {name} (output reg Q, input C, CE, D, {rst});
  parameter [0:0] INIT = 1'b{init}; parameter [0:0] IS_C_INVERTED = 1'b0;
  parameter [0:0] IS_D_INVERTED = 1'b0; parameter [0:0] IS_{rst}_INVERTED = 1'b0;
  specify
    $setup(D, posedge C, 25); $setup(CE, posedge C, 109); {setup_rst}
    (posedge C => (Q : D)) = 303;
  endspecify
  always @(posedge C) if (CE) Q <= D;
endmodule
""" for name, rst, init, setup_rst in (("FDRE", "R", 0, "$setup(R, posedge C, 404);"),
                                       ("FDSE", "S", 1, "$setup(S, posedge C, 404);"),
                                       ("FDCE", "CLR", 0, ""), ("FDPE", "PRE", 1, "")))

_LATEST = re.compile(r"Latest arrival time in '([^']+)' is (\d+):")
_STEP = re.compile(r"^\s*(\d+)\s+(\S+)\s+\(([^)]*)\)\s*$")


@dataclass
class PathEstimate:
    """The worst path: its length (ns, cell delays only), the cells along it (arrival ps, cell,
    arc, the net into it) from the end back to the clock, and the run's files."""

    path_ns: float
    fmax_mhz: float
    steps: list[tuple[int, str, str, str]] = field(default_factory=list)
    out_dir: str = ""
    basis: str = ("yosys sta after synth_xilinx: 7-series -1 cell delays (Project X-Ray models), "
                  "no routing; Vivado's routed path is longer")

    def to_dict(self) -> dict:
        return asdict(self)


def parse_sta(text: str) -> PathEstimate:
    """The worst path from a yosys `sta` report; FpgaError when the report has none or it does
    not end at a timed input (a register's or RAM's)."""
    m = _LATEST.search(text)
    if not m:
        raise FpgaError("the yosys sta report names no latest arrival time (no timed path in the design)")
    steps = []
    for line in text[m.end():].splitlines()[1:]:
        s = _STEP.match(line)
        if s:
            steps.append([int(s.group(1)), s.group(2), s.group(3), ""])
        elif line.startswith("      ") and steps and line.strip():
            steps[-1][3] = line.strip()          # the net into that cell
        elif line.strip():
            break
    if not steps or steps[0][2] in ("<unknown>", "<primary output>"):
        raise FpgaError(f"the worst path ends at {steps[0][2] if steps else 'nothing'}, not at a register or "
                        "RAM input: the sequential cells were read without timing")
    ps = int(m.group(2))
    return PathEstimate(path_ns=ps / 1000.0, fmax_mhz=round(1e6 / ps, 1) if ps else 0.0,
                        steps=[tuple(s) for s in steps])


def sta_script(verilog: str, top: str) -> str:
    """synth_xilinx, then the mapped netlist re-read over cells_sim.v's timing models and FF_TIMING."""
    return "\n".join([f"read_verilog -defer {verilog}", f"hierarchy -top {top}",
                      f"synth_xilinx -family xc7 -top {top} -noiopad", "tee -q -o stat_core.json stat -json",
                      "write_verilog -noattr mapped.v", "design -reset",
                      "read_verilog -lib -specify +/xilinx/cells_sim.v",
                      "read_verilog -lib -specify -overwrite ff_timing.v",
                      "read_verilog mapped.v", f"hierarchy -top {top}", "flatten",
                      "tee -q -o sta.txt sta", ""])


def path_estimate(verilog: str | Path, top: str, out_dir: str | Path, timeout: float | None = None) -> PathEstimate:
    """Synthesize `verilog` (top module `top`) for 7-series in out_dir and time its worst path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src = Path(verilog)
    if src.resolve() != (out / src.name).resolve():
        (out / src.name).write_text(src.read_text())
    (out / "ff_timing.v").write_text(FF_TIMING)
    (out / "sta.ys").write_text(sta_script(src.name, top))
    run_tool("yosys", ["-q", "-l", "yosys.log", "-s", "sta.ys"], out, "yosys.console.log", timeout,
             own_log="yosys.log")
    if not (out / "sta.txt").exists():
        raise ToolError(f"yosys sta failed in {out}; its log is {out / 'yosys.log'}")
    est = parse_sta((out / "sta.txt").read_text())
    est.out_dir = str(out)
    (out / "path.json").write_text(json.dumps(est.to_dict(), indent=1))
    return est


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m accel.hw.fpga.estimate_timing", description=__doc__.split("\n")[0])
    p.add_argument("--config", default="default", help="preset name or JSON file (default: %(default)s)")
    p.add_argument("-o", "--out", required=True, help="output folder (Verilog, logs, sta.txt, path.json)")
    p.add_argument("--json", action="store_true", help="print the path as JSON")
    args = p.parse_args(argv)
    try:
        cfg = resolve_config(args.config)
        rtl = rtl_for_config(cfg, args.out)
        est = path_estimate(Path(args.out) / rtl.file_name, rtl.top, args.out)
    except (FpgaError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(est.to_dict(), indent=1))
    else:
        print(f"worst path {est.path_ns:.2f} ns ({est.fmax_mhz} MHz), {len(est.steps)} cells; {est.basis}")
        for ps, _cell, arc, net in est.steps[:60]:
            print(f"  {ps:6d} ps  {arc:24s} {net}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
