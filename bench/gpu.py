"""GPU targets against the CPU, in one run: per model the latency of --target opencl (on PoCL where
there is no GPU), --target cpu, onnxruntime's CPU provider, and, where a CUDA GPU and the
packages exist, --target cuda and onnxruntime's CUDA provider. Every result is checked against
onnxruntime's CPU output (relative error printed). Prints a table and writes
bench/results/gpu.json.

    python bench/gpu.py [--models mlp,conv_bn_relu_pool,...] [--onnx M.onnx ...] [--repeat 5] [--tune]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import compiler  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from compiler.frontend import zoo  # noqa: E402
from host_runtime.gpu import CudaDevice, open_device


def _median_s(fn, repeat: int) -> float:
    fn()   # warm: kernel compilation and first-touch copies
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _rel(a: dict, ref: dict) -> float:
    return max(float(np.abs(a[k] - r).max() / max(1e-12, np.abs(r).max())) for k, r in ref.items())


def _cuda_available() -> str | None:
    """None when a CUDA device can run PTX here, else why not."""
    try:
        CudaDevice()
        return None
    except Exception as e:  # noqa: BLE001 - any failure means: no CUDA here
        return str(e)


def bench_model(name: str, model, repeat: int, tune: bool, cuda_why: str | None) -> dict:
    import onnxruntime as ort  # noqa: PLC0415 - optional dep onnxruntime
    feeds = zoo.sample_inputs(model, 1)[0]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = [o.name for o in sess.get_outputs()]
    ref = dict(zip(outs, sess.run(None, feeds)))
    row = {"model": name, "ort_cpu_ms": 1e3 * _median_s(lambda: sess.run(None, feeds), repeat)}
    targets = ["cpu", "opencl"] + ([] if cuda_why else ["cuda"])
    for tgt in targets:
        t0 = time.perf_counter()
        mod = compiler.build_model(model, target=tgt, tune=True if (tune and tgt == "opencl") else None)
        row[f"{tgt}_build_s"] = time.perf_counter() - t0
        y, _ = mod.run(feeds)
        row[f"{tgt}_rel_err"] = _rel(y, ref)
        row[f"{tgt}_ms"] = 1e3 * _median_s(lambda: mod.run(feeds), repeat)
        row[f"{tgt}_gpu_steps"] = sum(s.kind == "gpu" for s in mod.steps)
        row[f"{tgt}_steps"] = len(mod.steps)
    if "CUDAExecutionProvider" in ort.get_available_providers() and not cuda_why:
        cs = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
        row["ort_cuda_ms"] = 1e3 * _median_s(lambda: cs.run(None, feeds), repeat)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(zoo.MODELS), help="zoo models, comma separated")
    ap.add_argument("--onnx", nargs="*", default=[], help="ONNX files to add (static shapes)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tune", action="store_true", help="tune the OpenCL kernels (slow on PoCL)")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "gpu.json"))
    args = ap.parse_args(argv)
    dev = open_device("opencl")
    cuda_why = _cuda_available()
    print(f"OpenCL device: {dev.name}; CUDA: {'yes' if cuda_why is None else 'no (' + cuda_why + ')'}")
    models = [(n, zoo.MODELS[n]()) for n in args.models.split(",") if n]
    models += [(Path(p).stem, onnx.load(p)) for p in args.onnx]
    rows = []
    cols = ["ort_cpu_ms", "cpu_ms", "opencl_ms", "cuda_ms", "ort_cuda_ms", "opencl_rel_err"]
    print(f"{'model':24s} " + " ".join(f"{c:>14s}" for c in cols))
    for name, m in models:
        r = bench_model(name, m, args.repeat, args.tune, cuda_why)
        rows.append(r)
        print(f"{name:24s} " + " ".join(f"{r[c]:14.4g}" if c in r else f"{'-':>14s}" for c in cols))
    out = {"host": platform.node(), "opencl_device": dev.name, "cuda": cuda_why is None, "cuda_why_not": cuda_why,
           "repeat": args.repeat, "models": rows}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(args.output), json.dumps(out, indent=1).encode())
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
