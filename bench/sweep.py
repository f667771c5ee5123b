"""Sweep throughput: design points per minute on a two-worker Dask LocalCluster against a plain
sequential loop over the same points, measured in one run.

The sequential loop calls flows.point.evaluate_point for each point in this process (compile,
tsim run, estimate, energy: the work of one Dask task), after one warm-up point; the Dask run is
`run_sweep(workers=2)` into a fresh folder, timed from the call (cluster start included) and from
the workers being up, to the last point's record (the workers' own imports and first compile
count against Dask), and again on a cluster whose workers have each run the warm-up point (the
steady state of a long sweep). All evaluate the same points
(the sweep's results are checked equal to the loop's cycles). Prints, and writes
bench/results/sweep.json.

    python bench/sweep.py [--model residual_block|conv_bn_relu_pool|...|M.onnx] [--points 8] [--workers 2]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from distributed import Client, LocalCluster

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accel.isa.files import write_atomic  # noqa: E402
from compiler.frontend import zoo
from flows.point import (
    energy_table,  # noqa: E402
    evaluate_point,  # noqa: E402
)
from flows.space import parse_space  # noqa: E402
from flows.sweep import Plan, kit_version, load_models, plan_points, resolve_target, run_sweep  # noqa: E402

SPACE = {"base": "tiny", "params": {"block_in": [4, 8], "block_out": [4, 8, 16, 32],
                                    "acc_buff_bytes": ["auto", 4096], "inp_buff_bytes": "auto",
                                    "wgt_buff_bytes": "auto"}}


def _model_path(spec: str, tmp: Path) -> Path:
    if spec.endswith(".onnx"):
        return Path(spec)
    if spec not in zoo.MODELS:
        raise SystemExit(f"--model {spec!r}: an .onnx file or a zoo model ({', '.join(zoo.MODELS)})")
    p = tmp / f"{spec}.onnx"
    p.write_bytes(zoo.MODELS[spec]().SerializeToString())
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="residual_block")
    ap.add_argument("--points", type=int, default=8, help="points of the space to run (the first N of the grid)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "sweep.json"))
    args = ap.parse_args(argv)
    os.environ.setdefault("ACCEL_CHECK_RACES", "0")
    tmp = Path(tempfile.mkdtemp(prefix="accel-sweep-bench-"))
    model = _model_path(args.model, tmp)
    space = parse_space(SPACE)
    models = load_models([model])
    part, max_mhz, label = resolve_target("pynq-z1")
    kit = kit_version()
    plan = Plan(space, models, part, max_mhz, label, "estimate", "tsim", kit, energy_table(space.energy))
    points, _ = plan_points(plan, list(space.grid()))
    points = [p for p in points if p.config is not None][:args.points]
    combos = [p.values for p in points]
    keys = {p.key for p in points}

    # warm this process's imports (the workers pay theirs inside the Dask time)
    evaluate_point(plan.task(points[0], tmp), *[m.blob for m in models])
    t0 = time.perf_counter()
    seq = {p.key: evaluate_point(plan.task(p, tmp), *[m.blob for m in models]) for p in points}
    t_seq = time.perf_counter() - t0

    stamps = {}
    t0 = time.perf_counter()
    res = run_sweep(space, models, tmp / "dask", workers=args.workers, kit=kit, plot=False, combos=combos,
                    on_start=lambda n: stamps.setdefault("start", time.perf_counter()),
                    on_record=lambda r: stamps.__setitem__("last", time.perf_counter()))
    t_dask = stamps["last"] - t0                     # cluster start to the last point's record
    t_dask_run = stamps["last"] - stamps["start"]    # workers up to the last point's record
    got = {r["point"]: r for r in res.records if r["point"] in keys}
    same = all(got[k].get("cycles") == seq[k].get("cycles") for k in keys)

    # warm: the same points on a cluster whose workers have each run the warm-up point already
    # (what a long sweep sees after its first points), like the warmed sequential process
    warm_task = plan.task(points[0], tmp)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster, Client(cluster) as client:
        client.wait_for_workers(args.workers)
        client.run(evaluate_point, warm_task, *[m.blob for m in models])
        stamps_w = {}
        t0 = time.perf_counter()
        res_w = run_sweep(space, models, tmp / "dask-warm", scheduler=cluster.scheduler_address, kit=kit, plot=False,
                          combos=combos, on_record=lambda r: stamps_w.__setitem__("last", time.perf_counter()))
        t_warm = stamps_w["last"] - t0
    same = same and all(r.get("cycles") == seq[r["point"]].get("cycles") for r in res_w.records)
    n = len(points)
    out = {"model": model.name, "points": n, "workers": args.workers, "cpus": os.cpu_count(),
           "sequential_s": round(t_seq, 2), "dask_s": round(t_dask, 2), "dask_run_s": round(t_dask_run, 2),
           "points_per_min_sequential": round(60 * n / t_seq, 2),
           "points_per_min_dask": round(60 * n / t_dask, 2),
           "points_per_min_dask_after_start": round(60 * n / t_dask_run, 2),
           "dask_warm_s": round(t_warm, 2), "points_per_min_dask_warm": round(60 * n / t_warm, 2),
           "speedup": round(t_seq / t_dask, 2), "speedup_after_start": round(t_seq / t_dask_run, 2),
           "speedup_warm": round(t_seq / t_warm, 2),
           "same_cycles": same, "failed": sum(r.get("status") != "ok" for r in seq.values()),
           "host": platform.node(), "load_avg": os.getloadavg()[0], "kit": kit}
    print(json.dumps(out, indent=2))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.output, json.dumps(out, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
