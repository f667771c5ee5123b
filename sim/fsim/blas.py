"""BLAS for fsim's GEMM paths: the float type in which int products are exact, and thread use."""
from __future__ import annotations

import contextlib
import functools
import os
import time

import numpy as np
from threadpoolctl import ThreadpoolController

from accel.isa import AccelConfig


def gemm_float_dtype(cfg: AccelConfig):
    """Float type in which every block_in-long int dot product is exact: its magnitude is at
    most block_in * 2^(inp_width-1) * 2^(wgt_width-1), which must fit the mantissa."""
    bound = cfg.block_in * (1 << (cfg.inp_width - 1)) * (1 << (cfg.wgt_width - 1))
    if bound <= 1 << 24:
        return np.float32
    if bound <= 1 << 53:
        return np.float64
    return None  # fall back to int64 einsum


#: a matmul of at least this many multiply-adds may use the idle cores (2 threads: 1.4x at 0.5M, 1.9x at 4M)
THREADED_MATMUL_MACS = 1 << 18
#: a run within this many seconds of the last idle-core count reuses it (a count reads /proc for
#: ~0.13 ms, a tenth of a small program's run; a network makes one run per accelerator layer)
IDLE_RECOUNT_S = 0.5


class BlasThreads:
    """BLAS threads for fsim's matmuls. Most are small (bounded by the on-chip buffers): threaded
    BLAS on them costs more in hand-offs than it gains, and on a loaded machine a descheduled BLAS
    thread stalls every call (measured: 4.7x slower bench/fsim_speed.py with a second process busy).
    So a run holds BLAS to one thread, and a matmul of at least THREADED_MATMUL_MACS also takes the
    cores no other process is running on, counted at the run's first such matmul unless a count is
    less than IDLE_RECOUNT_S old."""

    def __init__(self):
        self.controller = ThreadpoolController()
        self.libs = self.controller.select(user_api="blas").lib_controllers
        self.threads = None
        self.counted_at = 0.0
        self.single = False

    @contextlib.contextmanager
    def run(self, single: bool = False):
        """The context of one run: one BLAS thread, the caller's setting given back after (set on
        the libraries directly: threadpoolctl's limit() re-reads every library's state, ~30 us).
        single: no extra threads for big matmuls either (the caller keeps the other cores busy)."""
        if time.monotonic() - self.counted_at > IDLE_RECOUNT_S:
            self.threads = None
        before = [lib.num_threads for lib in self.libs]
        for lib in self.libs:
            lib.set_num_threads(1)
        self.single = single
        try:
            yield
        finally:
            self.single = False
            for lib, n in zip(self.libs, before):
                lib.set_num_threads(n)

    def matmul(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if self.single or x.shape[0] * x.shape[1] * w.shape[1] < THREADED_MATMUL_MACS:
            return x @ w
        if self.threads is None:
            self.threads = idle_cores() + 1
            self.counted_at = time.monotonic()
        if self.threads == 1:
            return x @ w
        for lib in self.libs:
            lib.set_num_threads(self.threads)
        try:
            return x @ w
        finally:
            for lib in self.libs:
                lib.set_num_threads(1)


def idle_cores() -> int:
    """Cores of this process's CPU set that no other process's thread is running on now (Linux:
    the runnable count of /proc/loadavg less this process's running threads, which include
    BLAS's own spinning workers); 0 where that cannot be read."""
    try:
        cores = len(os.sched_getaffinity(0))
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        own = 0
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                own += f.read().rsplit(")", 1)[1].split()[0] == "R"
    except (AttributeError, OSError, ValueError, IndexError):
        return 0
    return max(0, cores - 1 - max(0, running - own))


@functools.lru_cache(maxsize=None)
def blas_threads() -> BlasThreads:
    return BlasThreads()
