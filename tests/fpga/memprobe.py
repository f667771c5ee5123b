"""Memory probes: one Verilog module per memory shape, written the way Amaranth's Verilog
back end writes an lib.memory.Memory (one write port, registered read ports with enables,
optional write-to-read transparency), and a yosys run that maps them and counts cells per module.

tests/fpga/data/memprobe_yosys.json holds yosys' answer for 276 shapes (xc7 and ecp5); the
live test re-asks yosys for a few of them.
"""
from __future__ import annotations

import json
from pathlib import Path

from accel.hw.fpga.synth import run_tool


def probe_module(name: str, depth: int, width: int, n_read: int, transparent: bool) -> str:
    ab = max(1, (depth - 1).bit_length())

    def rng(x):
        return f"[{x - 1}:0] " if x > 1 else ""
    ports = ["clk", "waddr", "wdata", "wen"] + [p for i in range(n_read) for p in (f"raddr{i}", f"ren{i}", f"rdata{i}")]
    lines = [f"module {name}({', '.join(ports)});", "  input clk;", f"  input {rng(ab)}waddr;",
             f"  input {rng(width)}wdata;", "  input wen;"]
    for i in range(n_read):
        lines += [f"  input {rng(ab)}raddr{i};", f"  input ren{i};", f"  output reg {rng(width)}rdata{i};"]
    lines += [f"  reg {rng(width)}mem [{depth - 1}:0];", "  always @(posedge clk)", "    if (wen) mem[waddr] <= wdata;",
              "  always @(posedge clk) begin"]
    for i in range(n_read):
        lines += [f"    if (ren{i}) begin", f"      rdata{i} <= mem[raddr{i}];"]
        if transparent:
            lines += [f"      if (wen && raddr{i} == waddr) rdata{i} <= wdata;"]
        lines += ["    end"]
    return "\n".join(lines + ["  end", "endmodule", ""])


def probe_design(shapes: list[tuple]) -> str:
    """All probe modules plus `probe_top`, which drives each from its own slice of one input bus."""
    text = "".join(probe_module(*s) for s in shapes)
    ins = outs = 0
    inst = []
    for (name, d, w, n, _t) in shapes:
        ab = max(1, (d - 1).bit_length())
        conns = [".clk(clk)"]
        for p, wd in [("waddr", ab), ("wdata", w), ("wen", 1)] + [x for i in range(n) for x in ((f"raddr{i}", ab), (f"ren{i}", 1))]:
            conns.append(f".{p}(i[{ins + wd - 1}:{ins}])")
            ins += wd
        for i in range(n):
            conns.append(f".rdata{i}(o[{outs + w - 1}:{outs}])")
            outs += w
        inst.append(f"  {name} u_{name} ({', '.join(conns)});")
    return text + "\n".join([f"module probe_top(input clk, input [{ins - 1}:0] i, output [{outs - 1}:0] o);",
                             *inst, "endmodule", ""])


def yosys_script(family: str) -> str:
    synth = ("synth_xilinx -family xc7 -top probe_top -noiopad" if family == "xc7"
             else "synth_ecp5 -top probe_top -noflatten")
    return f"read_verilog probe.v\nhierarchy -top probe_top\n{synth} -run begin:map_ffram\ntee -q -o stat.json stat -json\n"


def run_probe(shapes: list[tuple], family: str, out: Path) -> dict[str, dict]:
    """yosys' cell counts per probe module."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.v").write_text(probe_design(shapes))
    (out / "probe.ys").write_text(yosys_script(family))
    run_tool("yosys", ["-q", "-l", "yosys.log", "-s", "probe.ys"], out, "console.log", own_log="yosys.log")
    d = json.loads((out / "stat.json").read_text())
    return {k.lstrip("\\"): v.get("num_cells_by_type", {}) for k, v in d["modules"].items()}
