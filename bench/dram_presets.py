"""Accelerator cycles under each DRAM preset (sim/dram.py, docs/dram.md), with one read burst in
flight and with the config's read_outstanding: how much the board's memory costs and how much
overlapping reads win back, per layer.

    python bench/dram_presets.py [--config default] [--layers C2,C6,C10] [--dense 64x512x512] [--quick]

Each layer is compiled and run once on the functional simulator to capture its instructions;
then the timing model (Tsim.run_insns) times them under every preset and both outstanding
settings. "ideal" is MACs / MACs per cycle. Prints a table and writes
bench/results/dram_presets.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accel.isa import resolve_config  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from compiler.accel.conv2d import Requant, run_conv2d, run_dense  # noqa: E402
from compiler.accel.spec import Conv2dSpec  # noqa: E402
from compiler.accel.workloads import load_layers  # noqa: E402
from host_runtime import Device  # noqa: E402
from sim.dram import DRAM_PRESETS, dram_preset  # noqa: E402
from sim.tsim import Tsim  # noqa: E402


def capture(cfg, name: str, kind: str, shape) -> tuple[list, int]:
    """(instructions, MACs) of one layer, compiled and run once on fsim."""
    rng = np.random.default_rng(0)
    with Device(cfg, driver="fsim", dram_bytes=min(1 << cfg.dram_addr_width, 256 << 20)) as dev:
        if kind == "conv":
            spec = Conv2dSpec.from_workload(shape, name)
            x = rng.integers(-128, 128, (1, spec.c, spec.h, spec.w), dtype=np.int8)
            w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
            _, _, stream = run_conv2d(dev, x, w, np.zeros(spec.o, np.int32), spec, Requant())
            oh = (spec.h + spec.pads[0] + spec.pads[1] - spec.kh) // spec.strides[0] + 1
            ow = (spec.w + spec.pads[2] + spec.pads[3] - spec.kw) // spec.strides[1] + 1
            macs = spec.o * oh * ow * spec.c * spec.kh * spec.kw
        else:
            rows, k, m = shape
            x = rng.integers(-128, 128, (rows, k), dtype=np.int8)
            w = rng.integers(-128, 128, (m, k), dtype=np.int8)
            _, _, stream = run_dense(dev, x, w, np.zeros(m, np.int32), Requant())
            macs = rows * k * m
    return stream.last_insns, macs


def measure(cfg, insns, macs: int) -> dict:
    """Cycles per (preset, read_outstanding) and their ratio to the ideal."""
    ideal = macs / cfg.macs_per_cycle
    out = {}
    for preset in DRAM_PRESETS:
        dram = dram_preset(preset, cfg.clock_mhz)
        row = {"dram": dram.to_dict()}
        for n in sorted({1, cfg.read_outstanding}):
            st = Tsim(cfg.replace(read_outstanding=n), dram).run_insns(insns)
            row[f"outstanding_{n}"] = {"cycles": st.cycles, "over_ideal": round(st.cycles / ideal, 3),
                                       "load_busy": st.busy[0], "bytes_read": st.bytes_read}
        out[preset] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default")
    ap.add_argument("--layers", default="C2,C6,C10", help="ResNet-18 conv layers (compiler/accel/resnet18_conv.json)")
    ap.add_argument("--dense", default="64x512x512", help="ROWSxKxM dense layers, comma-separated ('' for none)")
    ap.add_argument("--quick", action="store_true", help="one small conv and one small dense layer")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    cfg = resolve_config(args.config)
    table = load_layers()
    jobs = []
    if args.quick:
        jobs = [("conv 8x8 16->16", "conv", [8, 8, 16, 16, 3, 3, 1, 1, 1, 1]), ("dense 16x32x32", "dense", (16, 32, 32))]
    else:
        for name in filter(None, args.layers.split(",")):
            if name not in table:
                raise SystemExit(f"--layers: unknown layer {name!r}; layers are {', '.join(table)}")
            jobs.append((name, "conv", table[name]))
        for d in filter(None, args.dense.split(",")):
            jobs.append((f"dense {d}", "dense", tuple(int(v) for v in d.split("x"))))
    result = {"config": args.config, "config_digest": cfg.digest(), "clock_mhz": cfg.clock_mhz,
              "read_outstanding": cfg.read_outstanding, "layers": {}}
    t0 = time.monotonic()
    for name, kind, shape in jobs:
        insns, macs = capture(cfg, name, kind, shape)
        result["layers"][name] = {"macs": macs, "insns": len(insns), "presets": measure(cfg, insns, macs)}
    result["seconds"] = round(time.monotonic() - t0, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "dram_presets.json", json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {out / 'dram_presets.json'}")
    return 0


def print_table(r: dict) -> None:
    n = r["read_outstanding"]
    keys = sorted({1, n})
    print(f"cycles / ideal on {r['config']} at {r['clock_mhz']:g} MHz (read_outstanding {' -> '.join(map(str, keys))})")
    presets = list(next(iter(r["layers"].values()))["presets"]) if r["layers"] else []
    print(f"{'layer':<20}" + "".join(f"{p:>18}" for p in presets))
    for name, lay in r["layers"].items():
        cells = []
        for p in presets:
            row = lay["presets"][p]
            cells.append(" -> ".join(f"{row[f'outstanding_{k}']['over_ideal']:.2f}" for k in keys))
        print(f"{name:<20}" + "".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
