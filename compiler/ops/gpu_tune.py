"""Tuning GPU schedules by search, as compiler.autotune does for the CPU: per kernel the space is
every combination of its schedule's knobs (GPU_KNOBS: tile sizes, registers per thread, the
reduction step staged in shared memory, threads per block, vector width); the default point is
measured first, then batches of the candidates autotune's cost model (ridge regression over
knob and workload features, refit after each batch on every measurement of this device) ranks
fastest, plus a share picked at random, until the trial budget is spent. Each candidate is built,
run on the OpenCL device against the default kernel's output (a wrong one is recorded as failed)
and timed. The log has autotune's JSON-lines format, keyed by the device instead of the CPU ISA:

    {"version": 1, "isa": {"triple": "opencl", "cpu": <device>, "features": <sha256[:16]>},
     "workload": {"op": <kind>, "impl": "gpu.<kind>", "shapes": [...], "dtypes": [...], "key": ...},
     "config": {<knob>: <value>}, "time_s": 1.2e-4}

so a rebuild is a lookup. Only OpenCL kernels can be measured here (PoCL where there is no GPU);
--target cuda keeps the defaults unless a CUDA device is there to time them.
"""
from __future__ import annotations

import hashlib
import inspect
import itertools
import json
import logging
import math
import time
from pathlib import Path

import numpy as np

from host_runtime.gpu import open_device

from ..autotune.cost import CostModel
from ..autotune.tuning_log import check_header, read_records
from ..errors import CompilerError
from .gpu import GPU_KNOBS, SCHEDULES

log = logging.getLogger(__name__)

#: measurements per kernel when tuning is asked for without a count
TRIALS = 8
VERSION = 1
_KINDS = tuple(SCHEDULES)


class GpuTuneError(CompilerError):
    """A GPU tuning log that cannot be read or written (the message names the line and field)."""


def space(kind: str) -> list[dict]:
    """Every knob setting of a schedule kind, the default point ({}) first."""
    names = SCHEDULES[kind][1]
    if not names:
        return [{}]
    return [{}] + [dict(zip(names, vals)) for vals in itertools.product(*(GPU_KNOBS[n] for n in names))]


def candidates(kind: str, trials: int = TRIALS) -> list[dict]:
    """The default point, then a deterministic spread of the space (the search's first batch
    when no measurement trains the cost model yet)."""
    grid = space(kind)[1:]
    if not grid or trials <= 1:
        return [{}]
    step = max(1, len(grid) // (trials - 1))
    return [{}] + grid[::step][:trials - 1]


def features(kind: str, shapes: list, cfg: dict) -> np.ndarray:
    """The kernel kind, the work (log2 of the elements of its parameters and output) and each
    knob (log2; 0 when the kind has no such knob, the default's values for {})."""
    fn, names = SCHEDULES[kind]
    dflt = {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not inspect.Parameter.empty}
    f = [1.0 if kind == k else 0.0 for k in _KINDS]
    f.append(math.log2(1 + math.prod(shapes[-1])) if shapes else 0.0)
    f.append(math.log2(1 + sum(math.prod(s) for s in shapes[:-1])) if shapes else 0.0)
    for k in sorted(GPU_KNOBS):
        v = cfg.get(k, dflt.get(k)) if k in names else None
        f.append(math.log2(v) if isinstance(v, int) and v > 0 else 0.0)
    return np.asarray(f, dtype=np.float64)


def _inputs(kernel, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) if np.dtype(dtype).kind == "f" else rng.integers(-8, 8, shape)).astype(dtype)
            for shape, dtype in kernel.params]


def measure(kernel, repeats: int = 3, seed: int = 0, output: list | None = None) -> float:
    """Median seconds of one launch of an OpenCL kernel on random inputs (copies excluded);
    `output` (a list) receives the kernel's result."""
    if kernel.lang != "opencl":
        raise GpuTuneError(f"kernel {kernel.name}: only OpenCL kernels can be timed here (lang {kernel.lang})")
    dev = open_device("opencl")
    cl = dev.cl
    k = dev.kernel(kernel.source, kernel.name)
    arrays = _inputs(kernel, seed)
    bufs = []
    for a in arrays:
        b = cl.Buffer(dev.ctx, cl.mem_flags.READ_WRITE, size=max(1, a.nbytes))
        if a.nbytes:
            cl.enqueue_copy(dev.queue, b, np.ascontiguousarray(a))
        bufs.append(b)
    k.set_args(*bufs)
    g = tuple(x * y for x, y in zip(kernel.grid, kernel.block))
    ts = []
    for _ in range(repeats + 1):
        dev.queue.finish()
        t0 = time.perf_counter()
        cl.enqueue_nd_range_kernel(dev.queue, k, g, tuple(kernel.block))
        dev.queue.finish()
        ts.append(time.perf_counter() - t0)
    if output is not None:
        out = arrays[-1]
        if out.nbytes:
            cl.enqueue_copy(dev.queue, out, bufs[-1])
            dev.queue.finish()
        output.append(out)
    return float(np.median(ts[1:]))


def device_isa() -> dict:
    """The OpenCL device as the log keys it: a log carried to another device is ignored."""
    dev = open_device("opencl")
    d = dev.device
    ident = f"{d.platform.name}|{d.name}|{d.driver_version}|{d.version}"
    return {"triple": "opencl", "cpu": dev.name, "features": hashlib.sha256(ident.encode()).hexdigest()[:16]}


def _bad(path, lineno: int, what: str) -> GpuTuneError:
    return GpuTuneError(f"GPU tuning log {path}:{lineno}: {what}")


def _check(rec, path, lineno: int) -> dict:
    check_header(rec, path, lineno, _bad, VERSION)
    wl = rec.get("workload")
    if not isinstance(wl, dict) or wl.get("op") not in _KINDS or not isinstance(wl.get("key"), str):
        raise _bad(path, lineno, f"field 'workload': expected op one of {', '.join(_KINDS)} and a string key")
    shapes = wl.get("shapes")
    if not isinstance(shapes, list) or not all(isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s)
                                               for s in shapes):
        raise _bad(path, lineno, "field 'workload.shapes': expected lists of non-negative integers")
    cfg = rec.get("config")
    if not isinstance(cfg, dict):
        raise _bad(path, lineno, "field 'config': expected an object")
    for k, v in cfg.items():
        if k not in GPU_KNOBS or v not in GPU_KNOBS[k] or isinstance(v, bool):
            raise _bad(path, lineno, f"field 'config.{k}': {v!r} is not a GPU knob setting "
                                     f"({', '.join(f'{n}: {list(vs)}' for n, vs in GPU_KNOBS.items())})")
    t = rec.get("time_s")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
        raise _bad(path, lineno, f"field 'time_s': expected a positive number or null, got {t!r}")
    return rec


def read_log(path: str | Path) -> list[dict]:
    """Every record of a GPU tuning log; [] when it does not exist yet."""
    return read_records(path, _check, _bad, lambda msg: GpuTuneError(f"GPU tuning log {msg}"))


def _canon(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True)


class GpuTuner:
    """Picks knobs per kernel key by search; `log_path` (JSON lines) is read first and extended
    with every measurement. trials: measurements per kernel (0: look up only)."""

    def __init__(self, log_path: str | Path | None = None, trials: int = TRIALS, batch: int = 4,
                 explore: float = 0.25, seed: int = 0):
        if not isinstance(trials, int) or trials < 0 or batch < 1 or not 0 <= explore <= 1:
            raise GpuTuneError("GPU tuning: trials >= 0, batch >= 1 and 0 <= explore <= 1 required")
        self.path = Path(log_path) if log_path else None
        self.trials, self.batch, self.explore = trials, batch, explore
        self._rng = np.random.default_rng(seed)
        self.records: list[dict] = read_log(self.path) if self.path is not None else []
        self._isa = None
        self.measurements = 0

    @property
    def isa(self) -> dict:
        if self._isa is None:
            self._isa = device_isa()
        return self._isa

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def _mine(self, key: str | None = None) -> list[dict]:
        return [r for r in self.records if r["isa"] == self.isa and (key is None or r["workload"]["key"] == key)]

    def best(self, key: str, kind: str, build) -> tuple[object, dict]:
        """(kernel, record): the logged best for `key` on this device, else a search of the kind's
        space (build(knobs) -> GpuKernel). record: knobs, seconds, trials."""
        timed = [r for r in self._mine(key) if r["time_s"] is not None]
        if timed:
            r = min(timed, key=lambda r: r["time_s"])
            return build(r["config"]), {"kind": kind, "knobs": r["config"], "seconds": r["time_s"], "trials": []}
        if self.trials == 0:   # look up only: not in the log -> the defaults
            return build({}), {"kind": kind, "knobs": {}, "seconds": None, "trials": []}
        return self.search(key, kind, build)

    def search(self, key: str, kind: str, build):
        cands = space(kind)
        done: dict[str, float | None] = {}
        built: dict[str, object] = {}
        ref = None
        shapes: list = []
        new = []
        budget = min(self.trials, len(cands))
        while len(done) < budget:
            todo = [c for c in cands if _canon(c) not in done]
            if not todo:
                break
            batch = [{}] if not done else self.next_batch(kind, shapes, todo, min(self.batch, budget - len(done)), new)
            fresh = []
            for cfg in batch:
                t, err = None, None
                try:
                    k = build(cfg)
                    shapes = [list(s) for s, _ in k.params]
                    out: list = []
                    t = measure(k, output=out)
                    if ref is None:
                        ref = out[0]
                    elif not _close(out[0], ref):
                        t, err = None, "differs from the default kernel's output"
                    if t is not None:
                        built[_canon(cfg)] = k
                except Exception as e:  # noqa: BLE001 - a setting that does not build or run is recorded
                    err = f"{type(e).__name__}: {str(e)[:200]}"
                    log.info("GPU tuning %s: knobs %s declined: %s", key[:8], cfg, err)
                self.measurements += 1
                done[_canon(cfg)] = t
                rec = {"version": VERSION, "isa": self.isa,
                       "workload": {"op": kind, "impl": f"gpu.{kind}", "shapes": shapes,
                                    "dtypes": [], "key": key},
                       "config": dict(cfg), "time_s": t}
                if err:
                    rec["error"] = err
                fresh.append(rec)
                if ref is None:   # the default does not build: nothing to compare against
                    break
            new += fresh
            self._append(fresh)
            if ref is None:
                break
        self.records.extend(new)
        if not built:
            raise GpuTuneError(f"GPU tuning {key[:8]}: no setting built ({kind} schedule)")
        best = min(built, key=lambda c: done[c])
        trials = [{"knobs": json.loads(c), "seconds": t} for c, t in done.items()]
        log.info("GPU tuned %s (%s): %.1f us with %s over %d trial(s)", key[:8], kind, done[best] * 1e6, best,
                 len(done))
        return built[best], {"kind": kind, "knobs": json.loads(best), "seconds": done[best], "trials": trials}

    def next_batch(self, kind: str, shapes: list, todo: list[dict], n: int, new: list[dict] = ()) -> list[dict]:
        """n candidates of `todo`: the cost model's fastest (trained on this device's records
        and this search's, `new`), plus a share at random."""
        X, y = [], []
        for r in self._mine() + list(new):
            if r["time_s"] is not None:
                X.append(features(r["workload"]["op"], r["workload"]["shapes"], r["config"]))
                y.append(math.log(r["time_s"]))
        if len(y) < 4:
            idx = self._rng.permutation(len(todo))[:n]
            return [todo[i] for i in idx]
        model = CostModel().fit(X, y)
        pred = model.predict([features(kind, shapes, c) for c in todo])
        order = list(np.argsort(pred, kind="stable"))
        n_explore = min(int(round(n * self.explore)), max(0, len(todo) - n))
        picked = order[:n - n_explore]
        if n_explore:
            picked += list(self._rng.choice(order[n - n_explore:], size=n_explore, replace=False))
        return [todo[i] for i in picked]

    def _append(self, records: list[dict]) -> None:
        if self.path is None or not records:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                for r in records:
                    f.write(json.dumps(r, sort_keys=True) + "\n")
        except OSError as e:
            raise GpuTuneError(f"GPU tuning log {self.path}: cannot be written ({e.strerror})") from None


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    if np.dtype(a.dtype).kind == "f":
        return bool(np.allclose(a, b, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(b).max(initial=0)))))
    return bool(np.abs(a.astype(np.int64) - b.astype(np.int64)).max(initial=0) <= 1)
