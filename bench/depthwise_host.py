"""The host figures of the depthwise placement rule (compiler/accel/depthwise_cost.py), measured:
MobileNetV2-like blocks (expand 1x1 - depthwise 3x3 - project 1x1) built for the accelerator with
the depthwise conv kept on the CPU, run on fsim; per step the best of --repeat runs. Prints the
depthwise kernel's MACs/s at stride 1 and 2, the pack/unpack bytes/s, the smallest step, the
HostModel line they make, and per layer both estimates against the measured CPU time; writes
bench/results/depthwise_host.json. No timing is asserted anywhere.

    python bench/depthwise_host.py [--repeat 8] [--config default]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from accel.isa.config import resolve_config  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from compiler import build_model  # noqa: E402
from compiler.accel import depthwise_cost as dc  # noqa: E402
from compiler.frontend import zoo  # noqa: E402
from host_runtime.executor import Executor  # noqa: E402

#: (channels, height = width, stride): MobileNetV2's depthwise layers at 224x224
LAYERS = [(96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1), (192, 28, 2), (384, 14, 1), (576, 14, 2),
          (960, 7, 1)]


def block(c: int, hw: int, stride: int):
    b = zoo.ModelBuilder(f"dw{c}_{hw}_s{stride}", 0)
    x = b.input("x", (1, 16, hw, hw))
    y = b.op("Relu", [b.conv(x, 16, c, k=1, name="expand")])
    y = b.op("Relu", [b.conv(y, c, c, k=3, stride=stride, group=c, name="dw")])
    return b.build([b.conv(y, c, 16, k=1, name="project")])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=8)
    p.add_argument("--config", default="default")
    p.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "depthwise_host.json"))
    args = p.parse_args(argv)
    cfg = resolve_config(args.config)
    dc.HOST_MODELS["bench-cpu"] = dc.HostModel("bench-cpu", 1e15, 1e15, 1e15, 0.0)   # keeps dw on the CPU
    dc.DEFAULT_HOST = "bench-cpu"
    rows, conv = [], []
    for c, hw, s in LAYERS:
        m = block(c, hw, s)
        feeds = zoo.sample_inputs(m, 3, seed=1)
        mod = build_model(m, target="accel", config=cfg, calibration=feeds[:2])
        best: dict[str, float] = {}
        with Executor(mod, driver="fsim") as ex:
            for _ in range(args.repeat):
                ex.run(feeds[2])
                for r in ex.profile:
                    if r["target"] != "accel":
                        best[r["name"]] = min(best.get(r["name"], 1e9), r["time_s"])
        steps = {st.name: st for st in mod.steps}
        macs = c * (-(-hw // s)) ** 2 * 9
        row = {"layer": f"{c}x{hw}x{hw} s{s}", "stride": s, "macs": macs, "dw_s": best["dw"],
               "macs_per_s": macs / best["dw"], "accel_estimate_s": None}
        for name, t in best.items():
            st = steps.get(name)
            if st is not None and st.kind == "native":   # pack / unpack
                conv.append((mod.tensors[st.output].nbytes, t))
        rows.append(row)
        print(f"{row['layer']:16} depthwise {best['dw'] * 1e3:7.3f} ms = {row['macs_per_s'] / 1e9:5.2f} GMAC/s")
    rate1 = float(np.median([r["macs_per_s"] for r in rows if r["stride"] == 1]))
    rate2 = float(np.median([r["macs_per_s"] for r in rows if r["stride"] > 1]))
    bw = float(np.median([b / t for b, t in conv]))
    step = float(min(t for _, t in conv))
    model = dc.HostModel("measured", rate1, rate2, bw, step)
    print(f"HostModel('measured', macs_per_s={rate1:.3g}, strided_macs_per_s={rate2:.3g}, bytes_per_s={bw:.3g}, "
          f"step_s={step:.3g})  (x86-dev in the code: {dc.HOST_MODELS['x86-dev']})")
    write_atomic(Path(args.output), json.dumps({"config": args.config, "repeat": args.repeat, "layers": rows,
                                                "host_model": model.__dict__}, indent=1).encode())
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
