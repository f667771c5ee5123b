"""RTL figures: Verilog generation time and size, cocotb simulation speed, and the counters of
the latency-hiding programs (GEMM-only utilization; overlapped vs serialized loads).

    python bench/rtl_report.py [--configs tiny default] [--simulators verilator icarus] [--out bench/results]

Writes <out>/rtl_report.json and prints a summary. Simulation speed is measured on a fixed
workload (random programs from tests/randprog.py plus the GEMM-only program) on the tiny
config: cycles per second of the simulator process while programs run (startup and the
one-time model build excluded, reported separately). Build times depend on the machine's load.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

from randprog import random_program

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from accel.hw.verilog import generate  # noqa: E402
from accel.isa import preset  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from sim.fsim import Fsim  # noqa: E402
from sim.rtl import RtlProgram, build, run_programs, simulators_available  # noqa: E402
from sim.rtl.programs import gemm_only, pipelined_matmul  # noqa: E402


def verilog_figures(name: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        res = generate(name, d, use_cache=False)
    return {"config": name, "seconds": round(res["seconds"], 3), "lines": res["lines"]}


def speed_figures(simulator: str, n_random: int) -> dict:
    cfg = preset("tiny")
    t0 = time.perf_counter()
    build(cfg, simulator)
    build_s = time.perf_counter() - t0
    progs, refs, fs = [], [], Fsim(cfg)
    for seed in range(n_random):
        p, _ = random_program(cfg, seed)
        d = p.dram_image()
        ref = d.copy()
        fs.run(ref, p.insn_addr, len(p.insns))
        progs.append(RtlProgram(f"rand{seed}", d, p.insn_addr, len(p.insns)))
        refs.append(ref)
    g = gemm_only(cfg, n_uops=16, iters=256)
    progs.append(RtlProgram("gemm_only", g.dram_image(), g.insn_addr, len(g.insns)))
    t0 = time.perf_counter()
    runs = run_programs(cfg, progs, simulator)
    job_s = time.perf_counter() - t0
    ok = all((r.dram == ref).all() for r, ref in zip(runs, refs))
    cycles = sum(r.sim_cycles for r in runs)
    run_s = sum(r.wall_s for r in runs)
    rnd = [r for r in runs if r.name.startswith("rand")]
    return {"simulator": simulator, "config": "tiny", "programs": len(runs), "cycles": cycles,
            "run_seconds": round(run_s, 3), "cycles_per_second": round(cycles / run_s),
            "random_cycles_per_second": round(sum(r.sim_cycles for r in rnd) / sum(r.wall_s for r in rnd)),
            "gemm_only_cycles_per_second": round(runs[-1].sim_cycles / runs[-1].wall_s),
            "job_seconds_with_startup": round(job_s, 2), "build_seconds_if_not_cached": round(build_s, 1),
            "matches_fsim": bool(ok)}


def latency_hiding_figures(simulator: str) -> dict:
    cfg = preset("tiny")
    named = {"gemm_only": gemm_only(cfg, n_uops=16, iters=256), "overlapped": pipelined_matmul(cfg, overlap=True),
             "serialized": pipelined_matmul(cfg, overlap=False)}
    runs = {r.name: r for r in run_programs(cfg, [RtlProgram(k, p.dram_image(), p.insn_addr, len(p.insns))
                                                  for k, p in named.items()], simulator)}
    g = runs["gemm_only"].counters
    ov, ser = runs["overlapped"].counters, runs["serialized"].counters
    return {"simulator": simulator, "config": "tiny",
            "gemm_only": {**g, "gemm_utilization": round(g["gemm_uops"] / g["cycles"], 4)},
            "overlapped": ov, "serialized": ser,
            "speedup_overlapped_vs_serialized": round(ser["cycles"] / ov["cycles"], 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["tiny", "default"])
    ap.add_argument("--simulators", nargs="+", default=["verilator", "icarus"])
    ap.add_argument("--random-programs", type=int, default=20)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    avail = simulators_available()
    report = {"machine": platform.platform(), "python": platform.python_version(),
              "verilog": [verilog_figures(c) for c in args.configs], "simulation_speed": [], "latency_hiding": None}
    for sim in args.simulators:
        if avail.get(sim):
            print(f"skipping {sim}: {avail[sim]}")
            continue
        report["simulation_speed"].append(speed_figures(sim, args.random_programs))
    first = next((s for s in args.simulators if not avail.get(s)), None)
    if first:
        report["latency_hiding"] = latency_hiding_figures(first)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rtl_report.json"
    write_atomic(path, json.dumps(report, indent=2) + "\n")
    for v in report["verilog"]:
        print(f"verilog {v['config']:8s} {v['lines']:7d} lines in {v['seconds']:.2f} s")
    for s in report["simulation_speed"]:
        print(f"{s['simulator']:10s} {s['cycles_per_second']:8d} cycles/s (random {s['random_cycles_per_second']}, "
              f"gemm-only {s['gemm_only_cycles_per_second']}); {s['programs']} programs, {s['cycles']} cycles, "
              f"match fsim: {s['matches_fsim']}")
    lh = report["latency_hiding"]
    if lh:
        print(f"GEMM-only: {lh['gemm_only']['gemm_uops']} micro-ops in {lh['gemm_only']['cycles']} cycles "
              f"({100 * lh['gemm_only']['gemm_utilization']:.1f}% busy)")
        print(f"overlapped {lh['overlapped']['cycles']} vs serialized {lh['serialized']['cycles']} cycles "
              f"({lh['speedup_overlapped_vs_serialized']}x)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
