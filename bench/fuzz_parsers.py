"""Long fuzz campaign of accel.isa's parsers; writes its findings as JSON.

    python3 bench/fuzz_parsers.py --seconds 600 [--seed 1] [-o bench/results/fuzz_parsers.json]

Runs the targets of tests/isa/test_fuzz.py (instruction decoder, program decoder, assembler, .accp
reader, config reader) round-robin on random and mutated inputs, far beyond the suite's budget. A
finding is an input that lets anything but the target's own AccelError escape (a crash, a failed
round-trip) or takes longer than --slow seconds (a hang in the making); each is kept once per
(target, exception type, raising line) with the input that showed it (base64) and the traceback.
"""
from __future__ import annotations

import argparse
import base64
import json
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "isa")]

import test_fuzz as tf  # noqa: E402  (the targets and mutators the suite uses)

from accel.isa import PRESETS  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402


def _words(rng: random.Random) -> str:
    return "".join(rng.choice(tf._WORDS) if rng.random() < 0.8 else chr(rng.randrange(0x20, 0x250))
                   for _ in range(rng.randint(1, 40)))


def generators(rng: random.Random):
    """name -> (make input, run target on it, input -> bytes for the record)."""
    tiny, default = PRESETS["tiny"], PRESETS["default"]
    seed_prog = tf.seed_program().to_bytes()
    seed_header = tf.seed_program().header()

    def word():
        if rng.random() < 0.5:
            return rng.getrandbits(128)
        return rng.getrandbits(rng.randint(4, 125)) << 3 | rng.randrange(8)

    def header_file():
        h = seed_header
        for _ in range(rng.randint(1, 4)):
            h = tf.mutate_json(h, rng)
        return tf.program_with_header(h)

    int_bytes = lambda w: w.to_bytes(16, "little")   # noqa: E731
    return {
        "decode_tiny": (word, lambda w: tf.target_decode(w, tiny), int_bytes),
        "decode_default": (word, lambda w: tf.target_decode(w, default), int_bytes),
        "decode_program": (lambda: rng.randbytes(rng.randrange(0, 161)),
                           lambda d: tf.target_decode_program(d, tiny), bytes),
        "asm_words": (lambda: _words(rng), lambda t: tf.target_asm(t, tiny), str.encode),
        "asm_mutated": (lambda: tf.mutate_bytes(tf.SEED_ASM.encode(), rng, 8).decode("utf-8", "replace"),
                        lambda t: tf.target_asm(t, tiny), str.encode),
        "accp_bytes": (lambda: tf.mutate_bytes(seed_prog, rng, 8), tf.target_program, bytes),
        "accp_header": (header_file, tf.target_program, bytes),
        "config_bytes": (lambda: tf.mutate_bytes(tf.SEED_CONFIG, rng, 8), tf.target_config, bytes),
        "config_json": (lambda: json.dumps(tf.mutate_json(tiny.to_dict(), rng)).encode(), tf.target_config, bytes),
    }


def campaign(seconds: float, seed: int, slow: float, only: list[str] | None = None) -> dict:
    rng = random.Random(seed)
    gens = generators(rng)
    names = [n for n in gens if not only or n in only]
    stats = {n: {"runs": 0, "findings": 0, "slowest_s": 0.0} for n in names}
    findings: dict[tuple, dict] = {}
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        for name in names:
            make, run, as_bytes = gens[name]
            x = make()
            t0 = time.perf_counter()
            problem = None
            try:
                run(x)
            except Exception as e:     # anything escaping a target is a finding
                tb = traceback.extract_tb(e.__traceback__)
                where = f"{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else "?"
                problem = (type(e).__name__, where, str(e)[:300], "".join(traceback.format_exception(e))[-2000:])
            dt = time.perf_counter() - t0
            s = stats[name]
            s["runs"] += 1
            s["slowest_s"] = max(s["slowest_s"], round(dt, 4))
            if problem is None and dt > slow:
                problem = ("slow", "", f"{dt:.2f} s", "")
            if problem is not None:
                s["findings"] += 1
                key = (name, problem[0], problem[1])
                if key not in findings:
                    findings[key] = {"target": name, "kind": problem[0], "where": problem[1], "message": problem[2],
                                     "input_b64": base64.b64encode(as_bytes(x)[:65536]).decode(),
                                     "traceback": problem[3], "count": 0}
                findings[key]["count"] += 1
    return {"seed": seed, "seconds": seconds, "slow_s": slow, "targets": stats, "findings": list(findings.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=600.0, help="campaign length (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slow", type=float, default=2.0, help="an input taking longer is a finding (seconds)")
    p.add_argument("--target", action="append", help="run only these targets (repeatable)")
    p.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "fuzz_parsers.json"))
    args = p.parse_args(argv)
    result = campaign(args.seconds, args.seed, args.slow, args.target)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(result, indent=2) + "\n")
    runs = sum(s["runs"] for s in result["targets"].values())
    print(f"{runs} inputs in {args.seconds:g} s, {len(result['findings'])} distinct finding(s) -> {out}")
    for f in result["findings"]:
        print(f"  {f['target']}: {f['kind']} at {f['where']} x{f['count']}: {f['message'][:120]}")
    return 1 if result["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
