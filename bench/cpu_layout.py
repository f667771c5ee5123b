"""The cpu target with and without the NCHWc layout pass (compiler.graph.passes.nchwc_layout)
against onnxruntime, one thread against one thread, by CPU time consumed (steady under other
processes' load, unlike wall clock on a shared machine).

Per model three sides are alternated in rounds: onnxruntime (intra_op_num_threads=1), the cpu
target built without the pass ("before") and with it ("after"), both run with num_threads=1.
Each round runs every side once untimed, then `--per` timed calls; the figures are medians of
process CPU seconds per call, with the 1-minute load average seen during the run. Writes JSON.

    python bench/cpu_layout.py [--light squeezenet,resnet50,inception_v2] [--rounds 5] [--per 3]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e import load_average, load_net, sample_inputs  # noqa: E402

from compiler import build_model  # noqa: E402
from compiler.frontend import from_onnx  # noqa: E402
from compiler.graph import passes  # noqa: E402
from host_runtime.executor import Executor  # noqa: E402

DEFAULT = "squeezenet,resnet50,inception_v2"


@contextlib.contextmanager
def without_pass(name: str):
    """The pass pipeline with step `name` left out (the "before" build)."""
    saved = list(passes.PIPELINE)
    passes.PIPELINE[:] = [s for s in saved if s.name != name]
    try:
        yield
    finally:
        passes.PIPELINE[:] = saved


def cpu_seconds(f) -> float:
    t0 = time.process_time()
    f()
    return time.process_time() - t0


def bench(name: str, rounds: int, per: int, log) -> dict:
    model = load_net(f"light:{name}")
    feed = sample_inputs(model, 1, seed=5)[0]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, feed)[0]
    graph = from_onnx(model)
    with without_pass("nchwc_layout"):
        before = build_model(graph, target="cpu")
    after = build_model(from_onnx(model), target="cpu")
    r = {"model": name, "layout": after.graph.meta.get("nchwc")}
    times = {"ort": [], "before": [], "after": []}
    loads = []
    with Executor(before, num_threads=1) as eb, Executor(after, num_threads=1) as ea:
        for side, ex in (("before", eb), ("after", ea)):
            got = next(iter(ex.run(feed).values()))
            r[f"{side}_max_rel_err"] = float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-30))
        sides = {"ort": lambda: sess.run(None, feed), "before": lambda: eb.run(feed), "after": lambda: ea.run(feed)}
        for _ in range(rounds):
            loads.append(load_average())
            for side, f in sides.items():
                f()
                times[side] += [cpu_seconds(f) for _ in range(per)]
    med = {k: float(np.median(v)) for k, v in times.items()}
    r.update({"cpu_s": med, "samples": times, "load_avg_1m": loads,
              "ratio_before": med["before"] / med["ort"], "ratio_after": med["after"] / med["ort"]})
    log(f"{name}: onnxruntime {med['ort'] * 1e3:.1f} ms, before {med['before'] * 1e3:.1f} ms "
        f"({r['ratio_before']:.2f}x), after {med['after'] * 1e3:.1f} ms ({r['ratio_after']:.2f}x); "
        f"load {min(loads):.1f}-{max(loads):.1f}")
    return r


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--light", default=DEFAULT, help=f"comma list of classic models (default {DEFAULT})")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--per", type=int, default=3, help="timed calls per side and round")
    p.add_argument("-o", "--output", default="bench/results/cpu_layout.json")
    args = p.parse_args(argv)
    os.environ.setdefault("KIT_NUM_THREADS", "1")

    def log(msg):
        print(msg, flush=True)

    results = [bench(n.strip(), args.rounds, args.per, log) for n in args.light.split(",") if n.strip()]
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"onnxruntime": ort.__version__, "threads": 1, "measure": "process CPU time",
                               "rounds": args.rounds, "per": args.per, "results": results}, indent=1))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
