"""Random-program regression across configurations: seeded random programs (tests/randprog.py) on
fsim and each other executor (tsim, rtl, the plain ISA model `ref`, any registered driver), compared
in lockstep against the recording fsim (sim/lockstep.py); a mismatch records the seed, the config,
the executor and the first diverging instruction. Prints one line per mismatch and a summary, and
writes the JSON summary (default bench/results/random_regression.json).

    python bench/random_regression.py --seeds 50 --configs tiny,default --executors tsim,rtl,ref
The test suite runs a small slice (tests/sim/test_lockstep.py). The RTL builds each config once
(about two minutes for default, then cached).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))

from randprog import random_program  # noqa: E402 - tests/ is on sys.path only from here

from accel.isa import resolve_config  # noqa: E402
from accel.isa.errors import AccelError  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from flows.lockstep import factory
from sim.lockstep import RecordingFsim, decode_at, lockstep  # noqa: E402
from sim.reference import run_reference  # noqa: E402

DEFAULT_OUT = ROOT / "bench" / "results" / "random_regression.json"


class RefExecutor:
    """sim/reference.py (plain, slow, program order) behind the run(dram, addr, n) interface."""

    def __init__(self, cfg):
        self.cfg = cfg

    def run(self, dram, insn_addr, insn_count):
        run_reference(self.cfg, decode_at(dram, insn_addr, insn_count, self.cfg), dram)


def maker(name: str, cfg):
    if name == "ref":
        return lambda: RefExecutor(cfg)
    return factory(name, cfg)


def regression(seeds, configs, executors, blocks=None, first_seed: int = 0, progress=None) -> dict:
    """Lockstep of every (config, seed, executor) against the recording fsim; the JSON summary."""
    mismatches, errors, runs = [], [], 0
    t0 = time.perf_counter()
    for cname in configs:
        cfg = resolve_config(cname)
        for seed in range(first_seed, first_seed + seeds):
            prog, _ = random_program(cfg, seed, blocks)
            for ex in executors:
                runs += 1
                where = {"config": cname, "seed": seed, "executor": ex, "insns": len(prog.insns)}
                try:
                    r = lockstep(cfg, prog.insns, prog.dram_image(), prog.insn_addr, lambda: RecordingFsim(cfg),
                                 maker(ex, cfg), ("fsim", ex))
                except AccelError as e:
                    errors.append({**where, "error": str(e)})
                    if progress:
                        progress(f"{cname} seed {seed} {ex}: error: {e}")
                    continue
                if r.diverged:
                    d = r.divergence
                    mismatches.append({**where, "mode": r.mode, "first_insn": d.index, "disasm": d.insn,
                                       "differences": d.lines, "origin": d.origin})
                    if progress:
                        progress(f"{cname} seed {seed} {ex}: first divergence at instruction {d.index}: {d.insn}")
    return {"configs": list(configs), "seeds": seeds, "first_seed": first_seed, "executors": list(executors),
            "runs": runs, "mismatches": mismatches, "errors": errors, "wall_s": round(time.perf_counter() - t0, 3),
            "host": platform.node()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20, help="programs per config (default: %(default)s)")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--configs", default="tiny,default", help="comma-separated presets or JSON files")
    p.add_argument("--executors", default="tsim,rtl", help="compared against fsim (default: %(default)s)")
    p.add_argument("--blocks", type=int, default=None, help="blocks per random program (default: random)")
    p.add_argument("-o", "--output", default=str(DEFAULT_OUT), help="JSON summary (default: %(default)s)")
    a = p.parse_args(argv)
    if a.seeds < 1:
        p.error("--seeds must be at least 1")
    configs = [c for c in a.configs.split(",") if c]
    executors = [e for e in a.executors.split(",") if e]
    try:
        summary = regression(a.seeds, configs, executors, a.blocks, a.first_seed, progress=print)
    except AccelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(summary, indent=1).encode())
    print(f"{summary['runs']} runs ({len(configs)} configs x {a.seeds} seeds x {len(executors)} executors): "
          f"{len(summary['mismatches'])} mismatches, {len(summary['errors'])} errors, {summary['wall_s']} s; "
          f"wrote {out}")
    return 1 if summary["mismatches"] or summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
