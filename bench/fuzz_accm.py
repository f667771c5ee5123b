"""Long fuzzing campaign on compiled-model files (.accm): random mutations of real modules.

    python bench/fuzz_accm.py [--cases 5000] [--seed 0] [--mode raw|header|both] [--timeout 30]
                              [--out bench/results/fuzz_accm.json]

Three modules (residual_block for the cpu target and for the accelerator on the tiny config, and
an embedding lookup with a numpy step) are built once; each case mutates one of them:
  raw     1-4 byte edits (flip, set, insert, delete, truncate) of the file: it must be refused with
          ModuleFormatError or load and give the original outputs bit for bit;
  header  1-3 header values replaced (integers near the real value, or of any size, strings,
          null, lists, ...) and the hashes
          re-sealed, as an attacker would: refused, or runs and fails only with the kit's own
          one-line errors (AccelError: the runtime's, or the simulator's on a program the file
          changed); different outputs are allowed (the file says something else).
Cases run in a child process so that a crash (signal) or a hang (no progress for --timeout
seconds) is recorded and the campaign goes on with the next case. Findings (crash, hang, an
exception of another type, different outputs from a raw mutation) are written with the case
number and seed that reproduce them: `--replay N` reruns one case in this process.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from onnx import TensorProto

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import compiler
import compiler.module  # noqa: F401 - registers the numpy host ops
from accel.isa.errors import AccelError
from compiler.frontend import zoo
from host_runtime.executor import FORMAT_VERSION, MAGIC, Executor, ModuleFormatError, ModuleImage  # noqa: E402

TARGETS = ("cpu", "accel", "numpy")


def build(work: Path) -> None:
    """The modules, their inputs and outputs, into `work`."""

    m = zoo.residual_block()
    feeds = zoo.sample_inputs(m, 3, seed=3)
    b = zoo.ModelBuilder("embed", seed=4)   # a gather at run-time indices: a numpy step
    ids = b.input("ids", (2, 8), TensorProto.INT64)
    x = b.op("Gather", [b.init(b.rng.standard_normal((50, 32)).astype(np.float32)), ids], name="embedding", axis=0)
    embed = b.build([b.op("Relu", [x], name="relu")])
    for target in TARGETS:
        model, feed, kw = m, feeds[2], {}
        if target == "accel":
            kw = {"config": "tiny", "calibration": feeds[:2]}
        elif target == "numpy":
            model, feed = embed, {"ids": np.arange(16, dtype=np.int64).reshape(2, 8)}
        mod = compiler.build_model(model, target="cpu" if target == "numpy" else target, **kw)
        outs = mod.run(feed)[0]
        (work / f"{target}.accm").write_bytes(mod.to_bytes())
        np.savez(work / f"{target}.out.npz", **outs)
        np.savez(work / f"{target}.in.npz", **feed)


def seal(h, payload: bytes) -> bytes:
    for b in h.get("blobs", []) if isinstance(h, dict) and isinstance(h.get("blobs"), list) else []:
        if isinstance(b, dict) and isinstance(b.get("offset"), int) and isinstance(b.get("size"), int):
            b["sha256"] = hashlib.sha256(payload[b["offset"]:b["offset"] + b["size"]]).hexdigest()
    hj = json.dumps(h).encode()
    return MAGIC + struct.pack("<II", FORMAT_VERSION, len(hj)) + hashlib.sha256(hj).digest() + hj + payload


def _leaves(o, path=()):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(o, list):
        for k, v in enumerate(o):
            yield from _leaves(v, path + (k,))
    yield path


def _value(rng: random.Random):
    return rng.choice([
        lambda: rng.randint(-3, 300), lambda: rng.randint(-(1 << 70), 1 << 70), lambda: 1 << rng.randint(0, 64),
        lambda: None, lambda: rng.random() < 0.5, lambda: rng.choice([float("nan"), float("inf"), -0.5, 1e300]),
        lambda: "".join(chr(rng.randint(32, 0x2FF)) for _ in range(rng.randint(0, 6))), lambda: [], lambda: {},
        lambda: [rng.randint(-2, 70) for _ in range(rng.randint(0, 5))], lambda: "system"])()


def mutate(data: bytes, mode: str, rng: random.Random) -> tuple[bytes, str]:
    if mode == "raw":
        b = bytearray(data)
        ops = []
        for _ in range(rng.randint(1, 4)):
            if not b:
                break
            kind, p, v = rng.choice(["flip", "set", "insert", "delete", "truncate"]), rng.randrange(len(b)), \
                rng.randrange(256)
            ops.append(f"{kind}@{p}")
            if kind == "flip":
                b[p] ^= 1 << (v % 8)
            elif kind == "set":
                b[p] = v
            elif kind == "insert":
                b[p:p] = bytes([v])
            elif kind == "delete":
                del b[p:p + 1 + v % 16]
            else:
                del b[p:]
        return bytes(b), " ".join(ops)
    hlen = struct.unpack("<I", data[12:16])[0]
    h = json.loads(data[48:48 + hlen])
    payload = data[48 + hlen:]
    paths = [p for p in _leaves(h) if p and p[0] not in ("meta", "library_target")]
    what = []
    for _ in range(rng.randint(1, 3)):
        path, value = rng.choice(paths), _value(rng)
        node = h
        try:
            for k in path[:-1]:
                node = node[k]
            old = node[path[-1]]
            if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.6:
                # near the real value: the mutations most likely to pass the type checks
                value = rng.choice([old + rng.choice([-4096, -64, -16, -4, -1, 1, 4, 16, 64, 4096]), old * 2,
                                    old // 2, 0, 1])
            node[path[-1]] = value
            what.append(f"{'.'.join(map(str, path))}={value!r}"[:120])
        except (KeyError, IndexError, TypeError):
            pass
    return seal(h, payload), "; ".join(what)


def run_case(work: Path, k: int, seed: int, modes: list[str]) -> dict:
    """One case: (target, mode, mutation) from (seed, k); its outcome and whether it is a finding."""
    rng = random.Random(seed * 1_000_003 + k)
    target, mode = rng.choice(TARGETS), rng.choice(modes)
    data, what = mutate((work / f"{target}.accm").read_bytes(), mode, rng)
    row = {"case": k, "target": target, "mode": mode, "mutation": what}
    feeds = dict(np.load(work / f"{target}.in.npz"))
    want = dict(np.load(work / f"{target}.out.npz"))
    try:
        mod = ModuleImage.from_bytes(data, "fuzz.accm")
    except ModuleFormatError as e:
        return {**row, "outcome": "refused", "detail": str(e)[:200]}
    except Exception as e:  # noqa: BLE001 - the finding
        return {**row, "outcome": "exception", "finding": True, "detail": traceback.format_exc(limit=-3)[-800:],
                "type": type(e).__name__}
    try:
        with Executor(mod) as ex:
            got = ex.run(feeds)
    except AccelError as e:
        return {**row, "outcome": "runtime_error", "detail": f"{type(e).__name__}: {str(e)[:200]}"}
    except Exception as e:  # noqa: BLE001
        return {**row, "outcome": "exception", "finding": True, "detail": traceback.format_exc(limit=-3)[-800:],
                "type": type(e).__name__}
    same = set(got) == set(want) and all(np.array_equal(got[n], want[n], equal_nan=True) for n in want)
    if same:
        return {**row, "outcome": "identical"}
    return {**row, "outcome": "different", "finding": mode == "raw"}


def worker(work: Path, start: int, end: int, seed: int, modes: list[str]) -> None:
    os.environ.setdefault("ACCEL_KIT_CACHE", str(work / "cache"))
    with open(work / "results.jsonl", "a") as out:
        for k in range(start, end):
            (work / "progress").write_text(str(k))
            out.write(json.dumps(run_case(work, k, seed, modes)) + "\n")
            out.flush()


def campaign(args) -> dict:
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="fuzz-accm-") as d:
        work = Path(d)
        build(work)
        k = 0
        crashes = []
        while k < args.cases:
            (work / "progress").write_text(str(k))
            cmd = [sys.executable, __file__, "--worker", str(work), "--start", str(k), "--end", str(args.cases),
                   "--seed", str(args.seed), "--mode", args.mode]
            p = subprocess.Popen(cmd)
            last, since = k, time.time()
            while p.poll() is None:
                time.sleep(0.2)
                cur = int((work / "progress").read_text() or last)
                if cur != last:
                    last, since = cur, time.time()
                elif time.time() - since > args.timeout:
                    p.kill()
                    p.wait()
                    crashes.append({"case": cur, "outcome": "hang", "finding": True,
                                    "detail": f"no progress for {args.timeout} s"})
                    break
            if p.returncode not in (0, None) and (not crashes or crashes[-1]["case"] != last):
                crashes.append({"case": last, "outcome": "crash", "finding": True,
                                "detail": f"worker exit status {p.returncode}"})
            k = (last + 1) if p.returncode else args.cases
            print(f"\r{k}/{args.cases} cases", end="", file=sys.stderr)
        print(file=sys.stderr)
        rows = [json.loads(ln) for ln in (work / "results.jsonl").read_text().splitlines() if ln.strip()]
    rows += crashes
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    samples: dict[str, list] = {}
    for r in rows:
        if not r.get("finding") and r["outcome"] != "refused" and len(samples.setdefault(r["outcome"], [])) < 10:
            samples[r["outcome"]].append(r)
    return {"cases": args.cases, "seed": args.seed, "mode": args.mode, "counts": counts,
            "findings": [r for r in rows if r.get("finding")], "samples": samples,
            "wall_s": round(time.time() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=("raw", "header", "both"), default="both")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds without progress that count as a hang")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fuzz_accm.json")
    ap.add_argument("--replay", type=int, metavar="N", help="run case N here and print its outcome")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--end", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    modes = ["raw", "header"] if args.mode == "both" else [args.mode]
    if args.worker:
        worker(args.worker, args.start, args.end, args.seed, modes)
        return 0
    if args.replay is not None:
        with tempfile.TemporaryDirectory(prefix="fuzz-accm-") as d:
            build(Path(d))
            print(json.dumps(run_case(Path(d), args.replay, args.seed, modes), indent=2))
        return 0
    res = campaign(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: res[k] for k in ("cases", "counts", "wall_s")}), f"findings: {len(res['findings'])}",
          f"-> {args.out}")
    return 1 if res["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
