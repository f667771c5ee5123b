"""Roofline of the ResNet-18 conv layers (C2..C11) on the accelerator, virtual threads 1 vs 2.

For each layer: the tiling the compiler picks, GEMM micro-ops, DRAM bytes, cycles, achieved
MACs/cycle and GEMM utilization, and the roofline bound min(peak, intensity x bytes/cycle).
Cycles come from a timing driver (tsim, or rtl) when one is registered; otherwise from the
compiler's analytical estimate, and the JSON says which ("cycles_source"). Every layer is also
run on the functional simulator and checked bit-exact against numpy.

    python bench/accel_roofline.py [--config default] [--driver tsim] [--out bench/results]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accel.isa import resolve_config  # noqa: E402
from compiler.accel.conv2d import Conv2dSpec, Requant, conv2d_reference, estimate_cycles, plan_conv2d, run_conv2d  # noqa: E402
from compiler.accel.tune import tune_conv2d  # noqa: E402
from compiler.accel.workloads import RESNET18_CONV as WORKLOADS  # noqa: E402
from host_runtime import Device, available_drivers  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default")
    ap.add_argument("--driver", default=None, help="timing driver for cycles (default: tsim if available)")
    ap.add_argument("--workloads", default=str(WORKLOADS))
    ap.add_argument("--no-tune", action="store_true",
                    help="use the analytical tiling only (default: measure the top candidates on the timing driver)")
    ap.add_argument("--top", type=int, default=8, help="candidates measured per layer when tuning")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    cfg = resolve_config(args.config)
    timing = args.driver or ("tsim" if "tsim" in available_drivers() else None)
    layers = json.loads(Path(args.workloads).read_text())["layers"]
    out_dir = Path(args.out)
    rng = np.random.default_rng(0)
    rows = []
    for name, fields in layers.items():
        if name == "C1":
            continue  # 3 input channels: the CPU's layer, as in VTA
        spec = Conv2dSpec.from_workload(fields, name)
        x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
        w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
        b = rng.integers(-20000, 20000, spec.o).astype(np.int32)
        rq = Requant(11, 0, 127)
        ref = conv2d_reference(x, w, b, spec, rq)
        for vt in (1, 2):
            tiling, tiling_source = plan_conv2d(spec, cfg, vt), "analytical"
            if timing and not args.no_tune:
                tiling, _ = tune_conv2d(spec, cfg, vt, top=args.top, driver=timing,
                                        log_path=out_dir / "tuning_log.json")
                tiling_source = f"tuned on {timing}"
            est = estimate_cycles(spec, cfg, tiling)
            t0 = time.perf_counter()
            y, res, stream = run_conv2d(Device(cfg), x, w, b, spec, rq, vt, tiling)
            wall = time.perf_counter() - t0
            assert np.array_equal(y, ref), f"{name} vt={vt}: fsim result differs from numpy"
            cycles, source = est["cycles"], "analytical estimate"
            if timing:
                r = Device(cfg, driver=timing)
                _, tres, _ = run_conv2d(r, x, w, b, spec, rq, vt, tiling)
                cycles, source = tres.cycles, timing
            macs = res.stats["macs"]
            dram = res.stats["bytes_read"] + res.stats["bytes_written"]
            intensity = macs / dram
            bound = min(cfg.macs_per_cycle, intensity * cfg.bus_bytes)
            rows.append({"layer": name, "vt": vt, "tiling": tiling.describe(), "tiling_source": tiling_source,
                         "insns": len(stream.last_insns),
                         "gemm_uops": res.stats["gemm_uops"], "macs": macs, "dram_bytes": dram,
                         "cycles": cycles, "cycles_source": source,
                         "macs_per_cycle": macs / cycles, "gemm_utilization": macs / cycles / cfg.macs_per_cycle,
                         "intensity_macs_per_byte": intensity, "roofline_macs_per_cycle": bound,
                         "compute_bound": bound >= cfg.macs_per_cycle, "fsim_wall_s": wall})
            r = rows[-1]
            print(f"{name:4s} vt={vt} {r['tiling']:38s} cycles={cycles:>12,.0f} ({source}) "
                  f"MACs/cyc={r['macs_per_cycle']:6.1f} util={r['gemm_utilization']:5.1%} "
                  f"roof={bound:6.1f} AI={intensity:6.1f}")
    cb = [r for r in rows if r["compute_bound"] and r["vt"] == 2]
    summary = {"config": cfg.to_dict(), "peak_macs_per_cycle": cfg.macs_per_cycle, "bus_bytes_per_cycle": cfg.bus_bytes,
               "cycles_source": rows[0]["cycles_source"] if rows else None,
               "min_util_compute_bound_vt2": min((r["gemm_utilization"] for r in cb), default=None),
               "mean_util_vt1": float(np.mean([r["gemm_utilization"] for r in rows if r["vt"] == 1])),
               "mean_util_vt2": float(np.mean([r["gemm_utilization"] for r in rows if r["vt"] == 2])),
               "layers": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "accel_roofline.json").write_text(json.dumps(summary, indent=2))
    _plot(rows, cfg, out / "accel_roofline.png")
    print(f"mean GEMM utilization vt=1 {summary['mean_util_vt1']:.1%}, vt=2 {summary['mean_util_vt2']:.1%}; "
          f"min on compute-bound layers (vt=2) {summary['min_util_compute_bound_vt2']:.1%} "
          f"[{summary['cycles_source']}]; wrote {out / 'accel_roofline.json'}")
    return 0


def _plot(rows, cfg, path: Path) -> None:
    matplotlib.use("Agg")
    fig, ax = plt.subplots(figsize=(7, 5))
    ai = np.logspace(0, 3.5, 100)
    ax.plot(ai, np.minimum(cfg.macs_per_cycle, ai * cfg.bus_bytes), "k-", label="roofline")
    for vt, marker in ((1, "o"), (2, "s")):
        pts = [r for r in rows if r["vt"] == vt]
        ax.scatter([r["intensity_macs_per_byte"] for r in pts], [r["macs_per_cycle"] for r in pts], marker=marker,
                   label=f"virtual threads {vt}")
        for r in pts:
            ax.annotate(r["layer"], (r["intensity_macs_per_byte"], r["macs_per_cycle"]), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (MACs per DRAM byte)")
    ax.set_ylabel("achieved MACs per cycle")
    ax.set_title(f"ResNet-18 convs, {cfg.batch}x{cfg.block_in}x{cfg.block_out} ({rows[0]['cycles_source']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
