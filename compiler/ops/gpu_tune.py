"""Tuning GPU schedules: per kernel a few knob settings (tile sizes, registers per thread, reduction
step staged in shared memory, threads per block) are built and timed on the OpenCL device, and the
fastest kept; a JSON log makes a rebuild a lookup (as compiler.accel.tune does for the accelerator).

Only OpenCL kernels can be measured here (PoCL where there is no GPU); for --target cuda the
tuner needs a CUDA device, so a cuda build without one keeps the defaults (logged).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import time
from pathlib import Path

import numpy as np

from accel.isa.files import write_atomic
from host_runtime.gpu import open_device

from ..errors import CompilerError
from .gpu import GPU_KNOBS, SCHEDULES

log = logging.getLogger(__name__)

#: settings measured per kernel (the default first, then a spread of the space)
TRIALS = 6


class GpuTuneError(CompilerError):
    """A GPU tuning log that cannot be read or written."""


def candidates(kind: str, trials: int = TRIALS) -> list[dict]:
    """Knob settings for a schedule kind: {} (the defaults) first, then a deterministic spread."""
    names = SCHEDULES[kind][1]
    grid = [dict(zip(names, vals)) for vals in itertools.product(*(GPU_KNOBS[n] for n in names))]
    if not grid or trials <= 1:
        return [{}]
    step = max(1, len(grid) // (trials - 1))
    return [{}] + grid[::step][:trials - 1]


def measure(kernel, repeats: int = 3, seed: int = 0) -> float:
    """Median seconds of one launch of an OpenCL kernel on random inputs (copies excluded)."""
    if kernel.lang != "opencl":
        raise GpuTuneError(f"kernel {kernel.name}: only OpenCL kernels can be timed here (lang {kernel.lang})")
    dev = open_device("opencl")
    cl = dev.cl
    rng = np.random.default_rng(seed)
    k = dev.kernel(kernel.source, kernel.name)
    bufs = []
    for shape, dtype in kernel.params:
        a = (rng.standard_normal(shape) if np.dtype(dtype).kind == "f" else rng.integers(-8, 8, shape)).astype(dtype)
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
    return float(np.median(ts[1:]))


class GpuTuner:
    """Picks knobs per kernel key; `log_path` (JSON) is read first and extended with new results."""

    def __init__(self, log_path: str | Path | None = None, trials: int = TRIALS):
        self.path = Path(log_path) if log_path else None
        self.trials = trials
        self.records: dict[str, dict] = {}
        if self.path is not None and self.path.exists():
            try:
                data = json.loads(self.path.read_text())
            except (OSError, ValueError) as e:
                raise GpuTuneError(f"GPU tuning log {self.path}: cannot be read ({e})") from None
            if not isinstance(data, dict) or not isinstance(data.get("gpu"), dict):
                raise GpuTuneError(f"GPU tuning log {self.path}: expected an object with a 'gpu' table")
            for k, v in data["gpu"].items():
                if isinstance(v, dict) and isinstance(v.get("knobs"), dict):
                    self.records[k] = v

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def best(self, key: str, kind: str, build) -> tuple[object, dict]:
        """(kernel, record): build(knobs) -> GpuKernel for each candidate; the fastest is kept."""
        rec = self.records.get(key)
        if rec is not None:
            return build(rec["knobs"]), rec
        trials = []
        best = None
        for knobs in candidates(kind, self.trials):
            try:
                k = build(knobs)
                t = measure(k) if k.lang == "opencl" else math.inf
            except Exception as e:  # noqa: BLE001 - a setting that does not build or run is skipped
                log.info("GPU tuning %s: knobs %s declined: %s", key, knobs, e)
                continue
            trials.append({"knobs": knobs, "seconds": t})
            if best is None or t < best[1]:
                best = (k, t, knobs)
        if best is None:
            raise GpuTuneError(f"GPU tuning {key}: no setting built ({kind} schedule)")
        rec = {"kind": kind, "knobs": best[2], "seconds": best[1], "trials": trials}
        self.records[key] = rec
        self.save()
        return best[0], rec

    def save(self) -> None:
        if self.path is None:
            return
        try:
            write_atomic(self.path, json.dumps({"gpu": self.records}, indent=1).encode())
        except OSError as e:
            raise GpuTuneError(f"GPU tuning log {self.path}: cannot be written ({e.strerror})") from None
