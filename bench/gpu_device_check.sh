#!/usr/bin/env bash
# One-call check of the CUDA path on a machine with an NVIDIA GPU (docs/gpu.md): build two zoo
# models for --target cuda, run them through host_runtime.gpu's CUDA launcher, compare with
# onnxruntime's CPU output, time them, and print one JSON object (also written to $OUT/ when set).
#   bash bench/gpu_device_check.sh [models, comma-separated; default mlp,conv_bn_relu_pool]
# Needs: the repo's Python deps (numpy, onnx, onnxruntime, llvmlite), cuda-python and a driver.
# Exit 0 when every model is within 1e-4 relative error, 1 otherwise, 2 when no CUDA device.
set -u
cd "$(dirname "$0")/.."
MODELS="${1:-mlp,conv_bn_relu_pool}"
python3 -c "import cuda.bindings.driver" 2>/dev/null || python3 -c "from cuda import cuda" 2>/dev/null || \
  echo "cuda-python is not importable: pip install cuda-python (or carry a venv that has it)" >&2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >&2 || true
MODELS="$MODELS" python3 - <<'EOF'
import json, os, platform, sys, time, traceback

import numpy as np

sys.path.insert(0, os.getcwd())
import compiler                                   # noqa: E402
from compiler.frontend import zoo                 # noqa: E402
from host_runtime.gpu import GpuError, open_device  # noqa: E402

report = {"host": platform.node(), "models": {}, "ok": False}
try:
    dev = open_device("ptx")
    report["device"] = dev.name
except GpuError as e:
    report["error"] = str(e)
    print(json.dumps(report, indent=1))
    sys.exit(2)


def rel(a, b):
    return float(np.abs(a - b).max() / max(1e-12, float(np.abs(b).max())))


ok = True
for name in os.environ["MODELS"].split(","):
    row = {}
    try:
        import onnxruntime as ort
        m = zoo.MODELS[name]()
        feeds = zoo.sample_inputs(m, 1)[0]
        t0 = time.perf_counter()
        mod = compiler.build_model(m, target="cuda")
        row["build_s"] = round(time.perf_counter() - t0, 3)
        row["gpu_steps"] = sum(s.kind == "gpu" for s in mod.steps)
        row["cpu_steps"] = len(mod.steps) - row["gpu_steps"]
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        ex = mod.executor()
        outs = ex.run(feeds)                      # first run: PTX JIT by the driver
        row["rel_err"] = max(rel(outs[k], ref[k]) for k in ref)
        ts = []
        for _ in range(10):
            t0 = time.perf_counter()
            ex.run(feeds)
            ts.append(time.perf_counter() - t0)
        row["latency_ms"] = round(1e3 * float(np.median(ts)), 3)
        row["copies"] = ex.gpu.counts
        row["ok"] = row["rel_err"] <= 1e-4
    except Exception as e:  # noqa: BLE001 - report every failure in the JSON, keep going
        row["error"] = f"{type(e).__name__}: {e}"[:500]
        row["trace"] = traceback.format_exc()[-1500:]
        row["ok"] = False
    ok &= row["ok"]
    report["models"][name] = row
report["ok"] = ok
text = json.dumps(report, indent=1)
print(text)
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "gpu_device_check.json"), "w") as f:
        f.write(text)
sys.exit(0 if ok else 1)
EOF
