"""Dense layers on the accelerator: cycles on the timing model against the ideal and the DRAM floor.

Per layer (rows x K -> M, int8, as networks lay dense layers out) the tiling the compiler picks,
the cycles a timing driver (tsim) counts, the ideal (MACs / peak MACs per cycle) and the floor no
mapping that reads its weights from DRAM can beat (input, weights and bias read once over the
bus, or the ideal, whichever is slower); every layer is also checked bit-exact against numpy.
With --encoders, zoo transformer encoder layers (SEQ,DIM,HEADS,FFN) are compiled whole and their
accelerator steps timed the same way.

    python bench/accel_dense.py [--config default] [--shapes 8x32x96,128x256x512]
                                [--encoders 8,32,2,64;128,128,4,512] [-o bench/results/accel_dense.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accel.isa import resolve_config  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from compiler import build_model  # noqa: E402
from compiler.accel.conv2d import Conv2dSpec, Requant, dense_reference, plan_conv2d, run_dense  # noqa: E402
from compiler.frontend import from_onnx  # noqa: E402
from compiler.frontend.zoo import sample_inputs, transformer_encoder  # noqa: E402
from host_runtime import Device, available_drivers  # noqa: E402
from host_runtime.executor import Executor  # noqa: E402

#: the zoo encoder's and MLP's layers, then transformer-sized ones
SHAPES = "8x32x96,8x32x32,8x32x64,8x64x32,4x64x128,4x128x64,64x64x192,64x256x64,128x128x384,128x512x128,128x256x512"
ENCODERS = "8,32,2,64;64,64,2,256;128,128,4,512"


def _shape(text: str) -> tuple[int, int, int]:
    try:
        rows, k, m = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes: {text!r} is not ROWSxKxM") from None
    return rows, k, m


def dense_row(cfg, rows: int, k: int, m: int, driver: str) -> dict:
    """One dense layer on `driver`: tiling, cycles, ideal, DRAM floor, bit-exactness."""
    rng = np.random.default_rng(rows * 7 + k * 3 + m)
    x = rng.integers(-128, 128, (rows, k), dtype=np.int8)
    w = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-999, 999, m).astype(np.int32)
    rq = Requant(9, 0, 127, True)
    tiling = plan_conv2d(Conv2dSpec(rows, k, 1, 1, m, 1, 1, name="dense"), cfg)
    with Device(cfg, driver=driver, dram_bytes=64 << 20) as dev:
        y, res, _ = run_dense(dev, x, w, b, rq)
    ideal = rows * k * m / cfg.macs_per_cycle
    floor = max(ideal, (rows * k + m * k + 4 * m) / cfg.bus_bytes)
    return {"shape": f"{rows}x{k}x{m}", "tiling": tiling.describe(), "cycles": res.cycles, "ideal": ideal,
            "dram_floor": floor, "vs_ideal": res.cycles / ideal, "vs_floor": res.cycles / floor,
            "bit_exact": bool(np.array_equal(y, dense_reference(x, w, b, rq)))}


def encoder_row(cfg, sizes: str) -> dict:
    """A zoo transformer encoder layer compiled for the accelerator; its steps' tsim cycles."""
    seq, dim, heads, ffn = (int(v) for v in sizes.split(","))
    model = transformer_encoder(seq=seq, dim=dim, heads=heads, ffn=ffn)
    feeds = sample_inputs(model, 3, seed=5)
    mod = build_model(from_onnx(model), target="accel", config=cfg, calibration=feeds[:2])
    with Executor(mod, driver="tsim") as ex:
        ex.run(feeds[2])
        steps = [r for r in ex.profile if r["target"] == "accel"]
    cycles = sum(r["cycles"] for r in steps)
    ideal = sum(r["macs"] for r in steps) / cfg.macs_per_cycle
    macs = mod.meta["macs"]
    return {"encoder": sizes, "accel_steps": len(steps), "cycles": cycles, "ideal": ideal,
            "vs_ideal": cycles / ideal if ideal else None,
            "offload_fraction": macs["accel"] / max(1, macs["accel"] + macs["cpu"])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="default")
    p.add_argument("--shapes", default=SHAPES, help="comma list of ROWSxKxM (default: %(default)s)")
    p.add_argument("--encoders", default=ENCODERS, help="';' list of SEQ,DIM,HEADS,FFN ('' for none)")
    p.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "accel_dense.json"))
    args = p.parse_args(argv)
    cfg = resolve_config(args.config)
    if "tsim" not in available_drivers():
        raise SystemExit("the tsim driver is not registered: cycles need the timing model")
    report = {"config": args.config, "layers": [], "encoders": []}
    for text in args.shapes.split(","):
        r = dense_row(cfg, *_shape(text), "tsim")
        report["layers"].append(r)
        print(f"{r['shape']:>14} {r['tiling']:<34} {r['cycles']:>8} cycles  {r['vs_ideal']:6.2f}x ideal  "
              f"{r['vs_floor']:5.2f}x floor{'' if r['bit_exact'] else '  MISMATCH'}")
    for sizes in filter(None, args.encoders.split(";")):
        r = encoder_row(cfg, sizes)
        report["encoders"].append(r)
        print(f"encoder {sizes}: {r['cycles']} cycles, {r['vs_ideal']:.3f}x ideal over {r['accel_steps']} steps, "
              f"{r['offload_fraction']:.1%} of MACs offloaded")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(report, indent=1))
    return 0 if all(r["bit_exact"] for r in report["layers"]) else 1


if __name__ == "__main__":
    sys.exit(main())
