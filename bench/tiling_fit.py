"""How good the conv2d planner's pick is: every accelerator layer of the e2e networks, its best few
tilings by the analytical estimate (compiler.accel.conv2d.estimate_cycles) each measured on tsim
(fused residual adds included), and the pick against the fastest measured.

Reports per config the total cycles of the picks over the networks' layers (each layer as often as
the networks have it) against the total of the best measured, and with --grid the estimate's
constants (INSN_CYCLES, CHUNK_CYCLES, OVERLAP_LOSS) that minimise the picks' total, re-ranking the
same candidates (a pick outside the measured set is measured too). Writes bench/results/tiling_fit.json.

    python bench/tiling_fit.py [--configs default,ultra96] [--top 12] [--grid]
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e import mobilenetv2, resnet18  # noqa: E402

import compiler  # noqa: E402
import compiler.accel.conv2d as conv  # noqa: E402
import compiler.accel.plan as plan  # noqa: E402  (the estimate constants the grid varies)
from accel.isa.config import resolve_config  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from compiler.accel.tune import measure_conv2d  # noqa: E402
from compiler.targets.accel import AccelTarget as cls


def network_layers(cfg_name: str) -> Counter:
    """(Conv2dSpec without its name, residual) -> how many layers of the two networks have it."""
    seen: Counter = Counter()
    orig = cls.tiling

    def spy(self, builder, spec, residual):
        seen[(dataclasses.replace(spec, name="conv2d"), residual)] += 1
        return orig(self, builder, spec, residual)
    cls.tiling = spy
    try:
        for net in (resnet18(), mobilenetv2()):
            compiler.build_model(net, target="accel", config=cfg_name)
    finally:
        cls.tiling = orig
    return seen


def measure(cfg, spec, residual: bool, tiling) -> int:
    """tsim cycles of the layer with this tiling, with a bias, a symmetric requantization and, when
    asked, a fused residual add (as the networks' layers are compiled)."""
    return measure_conv2d(spec, cfg, tiling, requant=conv.Requant(9, -127, 127), residual=residual)


def picks_total(cfg, layers: Counter, cycles: dict) -> int:
    """Total measured cycles of the planner's current picks (measuring any pick not measured yet)."""
    total = 0
    for (spec, residual), n in layers.items():
        t = conv.plan_conv2d(spec, cfg, 2, residual)
        key = (spec, residual, t)
        if key not in cycles:
            cycles[key] = measure(cfg, spec, residual, t)
        total += n * cycles[key]
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="default,ultra96")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--grid", action="store_true", help="search the estimate's constants")
    ap.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "tiling_fit.json"))
    args = ap.parse_args(argv)
    report = {"top": args.top, "constants": {"INSN_CYCLES": plan.INSN_CYCLES, "CHUNK_CYCLES": plan.CHUNK_CYCLES,
                                             "OVERLAP_LOSS": plan.OVERLAP_LOSS}, "configs": {}}
    state = {}
    for name in args.configs.split(","):
        cfg = resolve_config(name)
        t0 = time.perf_counter()
        layers = network_layers(name)
        cycles: dict = {}
        best_total = 0
        for (spec, residual), n in layers.items():
            best = None
            for _, t in conv.conv2d_candidates(spec, cfg, 2, residual)[:args.top]:
                c = cycles[(spec, residual, t)] = measure(cfg, spec, residual, t)
                best = c if best is None else min(best, c)
            best_total += n * best
        pick = picks_total(cfg, layers, cycles)
        report["configs"][name] = {"layers": sum(layers.values()), "distinct": len(layers), "picks_cycles": pick,
                                   "best_cycles": best_total, "picks_vs_best": pick / best_total,
                                   "seconds": time.perf_counter() - t0}
        print(f"{name}: {sum(layers.values())} layers ({len(layers)} distinct): picks {pick} cycles, best of "
              f"top {args.top} {best_total} -> {pick / best_total:.4f}", flush=True)
        state[name] = (cfg, layers, cycles, best_total)
    if args.grid:
        grid = list(itertools.product((5, 10, 20, 30), (5, 10, 20), (0.0, 0.05, 0.1, 0.15, 0.2)))
        saved = (plan.INSN_CYCLES, plan.CHUNK_CYCLES, plan.OVERLAP_LOSS)
        results = []
        try:
            for consts in grid:
                plan.INSN_CYCLES, plan.CHUNK_CYCLES, plan.OVERLAP_LOSS = consts
                ratio = [picks_total(cfg, layers, cycles) / best for cfg, layers, cycles, best in state.values()]
                results.append((sum(ratio) / len(ratio), consts, ratio))
        finally:
            plan.INSN_CYCLES, plan.CHUNK_CYCLES, plan.OVERLAP_LOSS = saved
        results.sort()
        report["grid"] = [{"constants": c, "picks_vs_best": r, "mean": m} for m, c, r in results]
        for m, c, r in results[:5]:
            print(f"INSN_CYCLES, CHUNK_CYCLES, OVERLAP_LOSS = {c}: picks vs best {', '.join(f'{x:.4f}' for x in r)}")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(report, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
