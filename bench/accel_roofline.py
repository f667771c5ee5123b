"""Roofline of the ResNet-18 conv layers (C2..C11) on the accelerator, virtual threads 1 vs 2.

For each layer: the tiling the compiler picks, GEMM micro-ops, DRAM bytes, cycles, achieved
MACs/cycle and GEMM utilization, and the roofline bound min(peak, intensity x bytes/cycle).
Cycles come from a timing driver (tsim, or rtl) when one is registered; otherwise from the
compiler's analytical estimate, and the JSON says which ("cycles_source"). Every layer is also
run on the functional simulator and checked bit-exact against numpy.

With --net NAME (a net of bench/e2e.py: tiny_cnn, resnet18, mobilenetv2, light:<model>, ...) it
instead breaks a whole network down by offloaded layer on tsim: cycles against the ideal (MACs /
peak) and against the floor of any layer-by-layer mapping (the ideal, or the layer's activations in
and out once on the bus, whichever is larger), each stage's busy and token/queue stall cycles,
micro-ops and DRAM bytes: where the cycles beyond the ideal go (accel_layers_<net>.json).

    python bench/accel_roofline.py [--config default] [--driver tsim] [--out bench/results]
    python bench/accel_roofline.py --net mobilenetv2 [--config default]
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
sys.path.insert(0, str(ROOT / "bench"))

from e2e import load_net  # noqa: E402

from accel.isa import resolve_config  # noqa: E402
from compiler import build_model  # noqa: E402
from compiler.accel.conv2d import Conv2dSpec, Requant, conv2d_reference, estimate_cycles, plan_conv2d, run_conv2d  # noqa: E402
from compiler.accel.tune import tune_conv2d  # noqa: E402
from compiler.accel.workloads import RESNET18_CONV as WORKLOADS  # noqa: E402
from compiler.frontend import from_onnx  # noqa: E402
from compiler.frontend.zoo import sample_inputs  # noqa: E402
from host_runtime import Device, available_drivers  # noqa: E402
from host_runtime.executor import Executor  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="default")
    ap.add_argument("--driver", default=None, help="timing driver for cycles (default: tsim if available)")
    ap.add_argument("--workloads", default=str(WORKLOADS))
    ap.add_argument("--no-tune", action="store_true",
                    help="use the analytical tiling only (default: measure the top candidates on the timing driver)")
    ap.add_argument("--top", type=int, default=8, help="candidates measured per layer when tuning")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--net", default=None, help="break this bench/e2e.py net down by offloaded layer instead")
    args = ap.parse_args(argv)
    cfg = resolve_config(args.config)
    timing = args.driver or ("tsim" if "tsim" in available_drivers() else None)
    if args.net:
        if timing is None:
            raise SystemExit("--net needs a timing driver (tsim)")
        return net_layers(args.net, cfg, timing, Path(args.out))
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


def net_layers(name: str, cfg, driver: str, out_dir: Path) -> int:
    """Per offloaded layer of net `name` on `driver`: cycles, ideal, floor, stage busy/stalls."""
    model = load_net(name)
    feeds = sample_inputs(model, 3, seed=5)
    mod = build_model(from_onnx(model), target="accel", config=cfg, calibration=feeds[:2])
    steps = {s.name: s for s in mod.steps if s.kind == "accel"}
    with Executor(mod, driver=driver) as ex:
        ex.run(feeds[2])
        pairs = [(row, res) for row, res in zip(ex.profile, ex.results) if row["target"] == "accel"]
    rows = []
    print(f"{'layer':28s} {'op':18s} {'cycles':>9s} {'ideal':>9s} {'x ideal':>7s} {'x floor':>7s} "
          f"{'load busy/stall':>16s} {'compute busy/stall':>18s} {'store busy/stall':>17s} {'gemm':>8s} {'alu':>6s}")
    for row, res in pairs:
        st, step = res.stats, steps[row["name"]]
        ideal = row["macs"] / cfg.macs_per_cycle
        floor = max(ideal, sum(mod.tensors[t].nbytes for t in step.inputs) / cfg.bus_bytes,
                    mod.tensors[step.output].nbytes / cfg.bus_bytes)
        stages = {k: {"busy": v["busy"], "stall": v["stall_token"] + v["stall_queue"]}
                  for k, v in st.get("stages", {}).items()}
        r = {"layer": row["name"], "op": row["op"], "cycles": row["cycles"], "ideal_cycles": ideal,
             "floor_cycles": floor, "vs_ideal": row["cycles"] / ideal if ideal else None,
             "vs_floor": row["cycles"] / floor if floor else None, "stages": stages,
             "gemm_uops": st.get("gemm_uops"), "alu_uops": st.get("alu_uops"),
             "bytes_read": st.get("dram_bytes", {}).get("read"), "bytes_written": st.get("dram_bytes", {}).get("written")}
        rows.append(r)

        def bs(k):
            return f"{stages[k]['busy']}/{stages[k]['stall']}" if k in stages else "-"
        print(f"{r['layer'][:28]:28s} {r['op'][:18]:18s} {r['cycles']:9d} {ideal:9.0f} "
              f"{r['vs_ideal'] or 0:7.3f} {r['vs_floor'] or 0:7.3f} {bs('load'):>16s} {bs('compute'):>18s} "
              f"{bs('store'):>17s} {r['gemm_uops'] or 0:8d} {r['alu_uops'] or 0:6d}")
    total = {k: sum(r[k] for r in rows) for k in ("cycles", "ideal_cycles", "floor_cycles")}
    summary = {"net": name, "config": cfg.to_dict(), "driver": driver, **total,
               "vs_ideal": total["cycles"] / total["ideal_cycles"] if total["ideal_cycles"] else None,
               "floor_vs_ideal": total["floor_cycles"] / total["ideal_cycles"] if total["ideal_cycles"] else None,
               "layers": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"accel_layers_{name.replace(':', '_')}.json"
    path.write_text(json.dumps(summary, indent=2))
    print(f"{name}: {total['cycles']} cycles, ideal {total['ideal_cycles']:.0f} -> "
          f"{summary['vs_ideal'] or 0:.3f}x; floor of a layer-by-layer mapping {summary['floor_vs_ideal'] or 0:.3f}x "
          f"[{driver}]; wrote {path}")
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
