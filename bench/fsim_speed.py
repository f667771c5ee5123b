"""Functional-simulator speed: simulated int8 MACs per second on a GEMM-heavy program.

Runs C = clip((A @ B + bias) >> shift) of M x K x N through host_runtime.matmul on the
functional simulator, checks it bit-exact against numpy, and reports MACs/s of the simulator
run alone (stats.macs / driver wall time) and of the whole call (packing, stream, run), with
numpy's int32 matmul of the same shape, timed in the same process, as the reference ratio.
Target: >= 1e9 simulated MACs/s. Prints, and writes bench/results/fsim_speed.json.

    python bench/fsim_speed.py [--config default] [--m 1024 --k 1024 --n 1024] [--repeat 3]
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

from accel.isa import resolve_config  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from host_runtime import Device  # noqa: E402
from host_runtime.matmul import matmul, matmul_reference, plan_matmul  # noqa: E402

TARGET_MACS_PER_S = 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default")
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--virtual-threads", type=int, default=2, choices=(1, 2))
    ap.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)

    cfg = resolve_config(args.config)
    m, k, n = args.m, args.k, args.n
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    bias = rng.integers(-(1 << 16), 1 << 16, n).astype(np.int32)
    shift = 10
    plan = plan_matmul(cfg, m, k, n, args.virtual_threads)
    dram = 3 * (a.nbytes + b.nbytes + 4 * m * n) + (16 << 20)

    runs = []
    with Device(cfg, driver="fsim", dram_bytes=min(dram, 1 << cfg.dram_addr_width)) as dev:
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            c, result = matmul(dev, a, b, bias, shift=shift, virtual_threads=args.virtual_threads)
            runs.append((time.perf_counter() - t0, result))
    exact = bool(np.array_equal(c, matmul_reference(a, b, bias, shift)))

    a32, b32 = a.astype(np.int32), b.astype(np.int32)
    np_times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        a32 @ b32
        np_times.append(time.perf_counter() - t0)

    total_s, result = min(runs, key=lambda r: r[1].wall_s)
    sim_s = result.wall_s
    macs = result.stats["macs"]
    useful = m * k * n
    np_s = min(np_times)
    report = {
        "shape": {"m": m, "k": k, "n": n}, "config": args.config, "config_digest": cfg.digest(),
        "virtual_threads": args.virtual_threads,
        "tiling": {"tm": plan.tm, "tn": plan.tn, "tk": plan.tk, "steps": plan.steps},
        "instructions": result.insn_count, "insns": result.stats["insns"],
        "simulated_macs": macs, "useful_macs": useful,
        "fsim_run_s": round(sim_s, 4), "matmul_call_s": round(min(r[0] for r in runs), 4),
        "sim_macs_per_s": macs / sim_s, "end_to_end_macs_per_s": useful / total_s,
        "numpy_int32_matmul_s": round(np_s, 4), "numpy_macs_per_s": useful / np_s,
        "fsim_vs_numpy": (macs / sim_s) / (useful / np_s),
        "target_macs_per_s": TARGET_MACS_PER_S, "meets_target": macs / sim_s >= TARGET_MACS_PER_S,
        "bit_exact": exact, "repeat": args.repeat,
        "python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "fsim_speed.json"
    write_atomic(path, json.dumps(report, indent=2) + "\n")

    print(f"fsim speed, {m}x{k}x{n} int8 matmul on config {args.config!r} "
          f"({cfg.batch}x{cfg.block_in}x{cfg.block_out}), {result.insn_count} instructions, "
          f"tiles {plan.tm}x{plan.tn}x{plan.tk} blocks")
    print(f"  simulator run   {sim_s:8.3f} s  {macs / sim_s:10.3e} simulated MACs/s "
          f"({'meets' if report['meets_target'] else 'BELOW'} the {TARGET_MACS_PER_S:.0e} target)")
    print(f"  whole call      {report['matmul_call_s']:8.3f} s  {useful / total_s:10.3e} MACs/s (packing, stream, run)")
    print(f"  numpy int32     {np_s:8.3f} s  {useful / np_s:10.3e} MACs/s  -> fsim at "
          f"{report['fsim_vs_numpy']:.2f}x numpy")
    print(f"  bit-exact vs numpy: {exact}; wrote {path}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
