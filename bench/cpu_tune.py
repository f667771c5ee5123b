"""Tuned vs untuned CPU schedules vs onnxruntime: per network, the cpu target
built with the heuristic schedules (an empty log), tuned on this machine (compiler.autotune: the
cost model picks what to measure, --trials per kernel signature), rebuilt from the log (a lookup:
the measurement count of that build is recorded and must be 0), and the three timed alternately
in one run (untuned, tuned, onnxruntime, and the untuned module once more as a control whose
ratio to the first is the run's noise floor; each block after a pause and an untimed call, the
order rotating every round).

Networks: the zoo's tiny CNN, MLP and transformer encoder, ResNet-18 and the MobileNetV2-like net
of bench/e2e.py, or its mobilenetv3 and efficientnet by --nets (--size sets the image side of the
image models; 224 is the reference figure). The machine may be shared: keep --trials small and read
the ratios, not the times.

    python bench/cpu_tune.py [--nets tiny_cnn,mlp,...] [--trials 4] [--size 224] [--repeat 10]
                             [--rounds 3] [--log F] [-o bench/results/cpu_tune.json]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import onnxruntime as ort  # noqa: E402
from e2e import DEFAULT_NETS, NETS  # noqa: E402

from accel.isa.files import write_atomic  # noqa: E402
from compiler import build_model  # noqa: E402
from compiler.autotune import TuneOptions, host_isa  # noqa: E402
from compiler.autotune import tuner as tuner_mod  # noqa: E402
from compiler.frontend import from_onnx  # noqa: E402
from compiler.frontend.zoo import sample_inputs  # noqa: E402
from host_runtime.executor import Executor  # noqa: E402

#: the nets built at --size (image models); the others have their zoo shapes
SIZED = ("resnet18", "mobilenetv2", "mobilenetv3", "efficientnet")


def load(name: str, size: int):
    if name not in NETS:
        raise SystemExit(f"--nets {name}: unknown; nets are {', '.join(NETS)}")
    return NETS[name](size=size) if name in SIZED else NETS[name]()


def time_alternating(fns: dict, repeat: int, rounds: int) -> dict[str, float]:
    """Median seconds per call of each function, measured in alternating blocks; the order
    rotates every round, so no side always runs right after the same other one."""
    ts = {k: [] for k in fns}
    per = max(1, -(-repeat // rounds))
    items = list(fns.items())
    for r in range(rounds):
        for k, f in items[r % len(items):] + items[:r % len(items)]:
            time.sleep(0.05)
            f()
            for _ in range(per):
                t0 = time.perf_counter()
                f()
                ts[k].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in ts.items()}


class _Counter:
    """Counts candidate measurements (a rebuild from the log must take none)."""

    def __init__(self):
        self.n = 0
        self._real = tuner_mod._Measure.measure
        counter = self

        def counting(m, cfg):
            counter.n += 1
            return counter._real(m, cfg)
        tuner_mod._Measure.measure = counting


def bench_net(name: str, args, log_path: Path, empty_log: Path, counter: _Counter, say) -> dict:
    model = load(name, args.size)
    graph = from_onnx(model)
    feed = sample_inputs(model)[0]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, feed)[0]
    r = {}
    t0 = time.perf_counter()
    untuned = build_model(graph, target="cpu", tune=TuneOptions(log=empty_log))
    r["untuned_build_s"] = time.perf_counter() - t0
    n0, t0 = counter.n, time.perf_counter()
    build_model(graph, target="cpu", tune=TuneOptions(log=log_path, trials=args.trials, repeats=args.tune_repeats))
    r["tune_s"], r["measurements"] = time.perf_counter() - t0, counter.n - n0
    n0, t0 = counter.n, time.perf_counter()
    tuned = build_model(graph, target="cpu", tune=TuneOptions(log=log_path))
    r["tuned_build_s"], r["rebuild_measurements"] = time.perf_counter() - t0, counter.n - n0
    r["kernels_tuned"] = len(tuned.meta["tuning"])
    r["configs"] = {k: v["config"] for k, v in tuned.meta["tuning"].items()}
    say(f"{name}: tuned {r['kernels_tuned']} kernel signature(s) with {r['measurements']} measurement(s) in "
        f"{r['tune_s']:.1f} s; rebuild {r['tuned_build_s']:.1f} s with {r['rebuild_measurements']} measurement(s)")
    with Executor(untuned) as eu, Executor(tuned) as et, Executor(untuned) as ec:
        for key, ex in (("untuned", eu), ("tuned", et)):
            got = next(iter(ex.run(feed).values()))
            r[f"{key}_max_rel_err"] = float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-30))
        # control: the untuned module a second time; control / untuned is the run's noise floor
        t = time_alternating({"untuned": lambda: eu.run(feed), "tuned": lambda: et.run(feed),
                              "ort": lambda: sess.run(None, feed), "control": lambda: ec.run(feed)},
                             args.repeat, args.rounds)
    r.update({f"{k}_s": v for k, v in t.items()})
    r["tuned_vs_ort"] = t["tuned"] / t["ort"]
    r["untuned_vs_ort"] = t["untuned"] / t["ort"]
    r["tuned_vs_untuned"] = t["tuned"] / t["untuned"]
    r["control_vs_untuned"] = t["control"] / t["untuned"]
    say(f"{name}: untuned {t['untuned'] * 1e3:.3f} ms, tuned {t['tuned'] * 1e3:.3f} ms, onnxruntime "
        f"{t['ort'] * 1e3:.3f} ms: tuned/ort {r['tuned_vs_ort']:.2f}, untuned/ort {r['untuned_vs_ort']:.2f} "
        f"(noise floor: the untuned module again {r['control_vs_untuned']:.2f}x)")
    return r


def geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", default=DEFAULT_NETS, help=f"comma-separated of {', '.join(NETS)} (default: %(default)s)")
    p.add_argument("--trials", type=int, default=4, help="measurements per kernel signature (default: 4)")
    p.add_argument("--tune-repeats", type=int, default=3, help="timing repeats per candidate (median)")
    p.add_argument("--size", type=int, default=224, help="image side of the image models")
    p.add_argument("--repeat", type=int, default=10, help="timed calls per network and side")
    p.add_argument("--rounds", type=int, default=3, help="alternation rounds")
    p.add_argument("--log", help="tuning log to read and extend (default: a fresh one next to the JSON)")
    p.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "cpu_tune.json"))
    args = p.parse_args(argv)
    out = Path(args.output)
    log_path = Path(args.log) if args.log else out.with_suffix(".jsonl")
    if not args.log and log_path.exists():
        log_path.unlink()
    empty = Path(tempfile.mkdtemp()) / "none.jsonl"
    counter = _Counter()
    results = {"isa": host_isa(), "machine": platform.machine(), "cpus": os.cpu_count(),
               "load_avg_1m": os.getloadavg()[0], "trials": args.trials, "size": args.size,
               "log": str(log_path), "nets": {}}
    for name in args.nets.split(","):
        try:
            results["nets"][name] = bench_net(name, args, log_path, empty, counter, lambda m: print(m, flush=True))
        except Exception as e:  # noqa: BLE001 - one failing net is recorded, the run goes on
            results["nets"][name] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name}: error {type(e).__name__}: {e}", flush=True)
    ok = [r for r in results["nets"].values() if "tuned_vs_ort" in r]
    for key in ("tuned_vs_ort", "untuned_vs_ort", "tuned_vs_untuned", "control_vs_untuned"):
        results[f"geomean_{key}"] = geomean(r[key] for r in ok)
        results[f"max_{key}"] = max((r[key] for r in ok), default=None)
    results["load_avg_1m_after"] = os.getloadavg()[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, (json.dumps(results, indent=2) + "\n").encode())
    print(f"geomean tuned/ort {results['geomean_tuned_vs_ort']}, untuned/ort {results['geomean_untuned_vs_ort']}, "
          f"tuned/untuned {results['geomean_tuned_vs_untuned']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
