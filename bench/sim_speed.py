"""Cycle-accurate simulation speed: simulated cycles per second of the `rtl` driver (Verilator + C++
harness), the `tsim` driver (timing model + functional data) and the cocotb path (sim/rtl, the
same Verilog under Verilator with a cocotb testbench), on the same programs in one run.

Programs: small conv2d layers compiled by compiler.accel.conv2d, a few random programs, and
full-size ResNet-18 layers (C2, C6, C10 of compiler/accel/resnet18_conv.json; what users simulate), each captured
once, then replayed on every executor from the same DRAM image. Figures are given per group
(small programs, where fixed per-run costs weigh; layers) and over all. Each executor must leave the same
DRAM bytes and tsim's cycle count must equal the RTL's (both are checked and reported); the
timing model alone (Tsim.run_insns, no data) is timed too, as `tsim_model`.
Wall time is the run alone (model build, the tsim helper's start and the cocotb process start
excluded; rtl and tsim include decoding, and tsim its functional simulation, which runs while its
timing model runs in the helper process: sim/tsim/helper.py). Bars: rtl >= 50x cocotb on the default
config, tsim >= 20x rtl. Prints, and writes bench/results/sim_speed.json.

    python bench/sim_speed.py [--config default] [--no-cocotb] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))

from randprog import random_program  # noqa: E402 - tests/ is on sys.path only from here

from accel.isa import resolve_config  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from compiler.accel.conv2d import Conv2dSpec, Requant, run_conv2d  # noqa: E402
from host_runtime import Device, Driver, RunResult, get_driver  # noqa: E402
from sim.rtl import RtlProgram, run_programs
from sim.trace import program_at  # noqa: E402
from sim.tsim import Tsim  # noqa: E402
from sim.tsim import helper as tsim_helper

BARS = {"rtl_over_cocotb": 50.0, "tsim_over_rtl": 20.0, "tsim_model_over_rtl": 20.0}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


class _Capture(Driver):
    """Records the DRAM image and program of each run (and runs fsim so the caller gets its data)."""
    name = "capture"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.fsim = get_driver("fsim", cfg)
        self.runs = []

    def run(self, dram, insn_addr, insn_count) -> RunResult:
        self.runs.append((dram.copy(), insn_addr, insn_count))
        return self.fsim.run(dram, insn_addr, insn_count)


def conv_program(cfg, spec: Conv2dSpec, vt: int = 2, dram_bytes: int = 8 << 20):
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, spec.o).astype(np.int32)
    cap = _Capture(cfg)
    with Device(cfg, driver=cap, dram_bytes=dram_bytes) as dev:
        run_conv2d(dev, x, w, b, spec, Requant(8), vt)
    return cap.runs[-1]


from compiler.accel.workloads import RESNET18_CONV as WORKLOADS  # noqa: E402

#: Full-size ResNet-18 layers (what users simulate): a 3x3, a strided 3x3 and a strided 1x1.
LAYERS = ("C2", "C6", "C10")


def programs(cfg, quick: bool, layers: bool):
    """Small conv layers and random programs (fixed per-run costs weigh), then, with `layers`,
    full-size ResNet-18 layers from the shared workload (hundreds of thousands of cycles each)."""
    convs = {"conv3x3 16x16 c32->32": Conv2dSpec(1, 32, 16, 16, 32, 3, 3, (1, 1, 1, 1)),
             "conv3x3/2 16x16 c32->64": Conv2dSpec(1, 32, 16, 16, 64, 3, 3, (1, 1, 1, 1), (2, 2)),
             "conv1x1 14x14 c64->64": Conv2dSpec(1, 64, 14, 14, 64, 1, 1)}
    if quick:
        convs = dict(list(convs.items())[:1])
    out = {name: conv_program(cfg, spec) for name, spec in convs.items()}
    for seed in range(1 if quick else 3):
        prog, _ = random_program(cfg, seed)
        out[f"random seed {seed}"] = (prog.dram_image(), prog.insn_addr, len(prog.insns))
    if layers and not quick:
        table = json.loads(WORKLOADS.read_text())["layers"]
        for name in LAYERS:
            spec = Conv2dSpec.from_workload(table[name], name)
            out[f"resnet18 {name} {spec.kh}x{spec.kw}/{spec.strides[0]} {spec.h}x{spec.w} c{spec.c}->{spec.o}"] = \
                conv_program(cfg, spec, dram_bytes=32 << 20)
    return out


def _best(fn, repeat):
    """The fastest of `repeat` runs, with the DRAM of the first: on-chip buffers persist across runs, so
    a program reading stale buffer entries may leave other bytes when run again."""
    runs = [fn() for _ in range(repeat)]
    res, wall, _ = min(runs, key=lambda r: r[1])
    return res, wall, runs[0][2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default")
    ap.add_argument("--repeat", type=int, default=3, help="runs of rtl and tsim per program; the best is reported")
    ap.add_argument("--no-cocotb", action="store_true", help="skip the cocotb path (it is the slow one)")
    ap.add_argument("--quick", action="store_true", help="one conv layer and one random program")
    ap.add_argument("--no-layers", action="store_true", help="skip the full-size ResNet-18 layers")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    cfg = resolve_config(args.config)

    t0 = time.perf_counter()
    progs = programs(cfg, args.quick, not args.no_layers)
    print(f"{len(progs)} programs for config {args.config!r} captured in {time.perf_counter() - t0:.1f} s")
    rtl = get_driver("rtl", cfg)
    tsim = get_driver("tsim", cfg)
    # tsim's timing model runs in a helper process (sim/tsim/helper.py) once that is up; its start,
    # like the rtl model's build, is not part of a run
    t0 = time.perf_counter()
    helper_ready = tsim_helper.start(wait=60)
    helper = {"enabled": tsim_helper.enabled(), "ready": helper_ready, "start_s": time.perf_counter() - t0}
    print(f"tsim helper: {helper}")
    fsim = get_driver("fsim", cfg)     # each program once, in order: the cocotb job's reference
    rows, final = [], {}
    for name, (image, addr, count) in progs.items():
        def run_on(drv):
            dram = image.copy()
            res = drv.run(dram, addr, count)
            return res, res.wall_s, dram
        r_res, r_wall, r_dram = _best(lambda: run_on(rtl), args.repeat)
        t_res, t_wall, t_dram = _best(lambda: run_on(tsim), args.repeat)
        insns = program_at(cfg, image, addr, count)
        model = Tsim(cfg, tsim.dram_model)
        m_wall = min(_timed(lambda: model.run_insns(insns, addr)) for _ in range(args.repeat))
        row = {"program": name, "insns": count, "cycles_rtl": r_res.cycles, "cycles_tsim": t_res.cycles,
               "cycles_equal": r_res.cycles == t_res.cycles, "dram_equal": bool(np.array_equal(r_dram, t_dram)),
               "tsim_model_in_helper": t_res.raw.model_in_helper,
               "rtl_s": r_wall, "tsim_s": t_wall, "tsim_model_s": m_wall,
               "rtl_cycles_per_s": r_res.cycles / r_wall, "tsim_cycles_per_s": t_res.cycles / t_wall,
               "tsim_model_cycles_per_s": t_res.cycles / m_wall}
        rows.append(row)
        final[name] = image.copy()
        fsim.run(final[name], addr, count)
        print(f"{name:<26} {count:>6} insns {r_res.cycles:>9} cycles  rtl {row['rtl_cycles_per_s']:>12,.0f} c/s  "
              f"tsim {row['tsim_cycles_per_s']:>12,.0f} c/s (model alone {row['tsim_model_cycles_per_s']:>12,.0f})  tsim==rtl {row['cycles_equal']}  "
              f"dram== {row['dram_equal']}")
    rtl.close()

    if not args.no_cocotb:
        t0 = time.perf_counter()
        runs = run_programs(cfg, [RtlProgram(r["program"], progs[r["program"]][0].copy(), progs[r["program"]][1],
                                             progs[r["program"]][2], max_cycles=50_000_000) for r in rows],
                            simulator="verilator", timeout_s=7200)
        print(f"cocotb job (build or cache, process, all programs): {time.perf_counter() - t0:.1f} s")
        for row, run in zip(rows, runs):
            row.update({"cycles_cocotb": run.cycles, "cocotb_s": run.wall_s,
                        "cocotb_cycles_per_s": run.cycles / run.wall_s,
                        "cocotb_dram_equal": bool(run.dram is not None and np.array_equal(run.dram,
                                                                                          final[row["program"]]))})
            print(f"{row['program']:<26} cocotb {run.cycles:>9} cycles  {row['cocotb_cycles_per_s']:>10,.0f} c/s  "
                  f"dram== {row['cocotb_dram_equal']}")

    def speeds(sub: list[dict]) -> dict:
        """Simulated cycles per second of each executor over `sub` (total cycles / total seconds)."""
        def total(key_s):
            return sum(r["cycles_rtl"] for r in sub) / sum(r[key_s] for r in sub)
        g = {"programs": len(sub), "cycles": sum(r["cycles_rtl"] for r in sub),
             "rtl_cycles_per_s": total("rtl_s"), "tsim_cycles_per_s": total("tsim_s"),
             "tsim_model_cycles_per_s": total("tsim_model_s")}
        g["tsim_over_rtl"] = g["tsim_cycles_per_s"] / g["rtl_cycles_per_s"]
        g["tsim_model_over_rtl"] = g["tsim_model_cycles_per_s"] / g["rtl_cycles_per_s"]
        if all("cocotb_s" in r for r in sub):
            g["cocotb_cycles_per_s"] = total("cocotb_s")
            g["rtl_over_cocotb"] = g["rtl_cycles_per_s"] / g["cocotb_cycles_per_s"]
            g["tsim_over_cocotb"] = g["tsim_cycles_per_s"] / g["cocotb_cycles_per_s"]
        return g
    groups = {"small": [r for r in rows if not r["program"].startswith("resnet18")],
              "layers": [r for r in rows if r["program"].startswith("resnet18")]}
    summary = speeds(rows)
    summary["groups"] = {k: speeds(v) for k, v in groups.items() if v}
    summary["all_cycles_equal"] = all(r["cycles_equal"] for r in rows)
    summary["all_dram_equal"] = all(r["dram_equal"] for r in rows)
    summary["bars"] = {k: {"target": v, "value": summary.get(k), "met": summary.get(k, 0) >= v}
                       for k, v in BARS.items() if k in summary}
    print(json.dumps(summary, indent=2))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"bench": "sim_speed", "config": cfg.to_dict(), "config_name": args.config, "tsim_helper": helper,
           "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()},
           "programs": rows, "summary": summary}
    write_atomic(out / "sim_speed.json", json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out / 'sim_speed.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
