"""CPU runtime for generated code: the parallel launcher and the callable Module.

Generated code calls `__kit_parallel_launch(worker, closure, n)` for a parallel loop of n
iterations; worker(chunk, nchunk, closure) runs one chunk. The launcher is the kit's C runtime
(host_runtime.kernel_cache.RUNTIME_C, compiled here and cached like a kernel library): the calling
thread and a persistent pool take chunks from an atomic counter, the caller waits only for helpers
that joined, and the pool backs off to the caller alone while cores are busy (docs/threads.md).
Without a C compiler a Python launcher with the same rules stands in (slower: a ctypes callback
per chunk). A launch costs microseconds, so parallelise outer loops, not inner ones.
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm
import numpy as np

from accel.isa.files import write_atomic
from host_runtime.executor import default_num_threads
from host_runtime.kernel_cache import PARALLEL_LAUNCH, KernelBuildError, KernelCacheError, load_kernels

from ..errors import CodegenError
from ..tir import dtype as dt

log = logging.getLogger(__name__)

_WORKER_T = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
_LAUNCH_T = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
#: chunks per thread a Python-launched loop is cut into (idle or late helpers then cost little)
_CHUNKS_PER_THREAD = 4
#: most threads the C runtime runs a loop on (its MAX_THREADS)
_MAX_NATIVE_THREADS = 256

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_num_threads: int | None = None
_workers: dict = {}
_native = None          # the C runtime's KernelLibrary, once loaded
_native_failed = False


def num_threads() -> int:
    global _num_threads
    if _num_threads is None:
        _num_threads = default_num_threads()
    return _num_threads


def set_num_threads(n: int) -> None:
    """Number of threads parallel loops use (default: the CPUs this process may run on,
    or $KIT_NUM_THREADS)."""
    global _num_threads, _pool
    if n < 1:
        raise ValueError(f"set_num_threads: need at least 1 thread, got {n}")
    with _lock:
        _num_threads = n
        if _native is not None:
            _native.set_num_threads(min(n, _MAX_NATIVE_THREADS))
        if _pool is not None:
            _pool.shutdown(wait=False)
            _pool = None


def native_runtime():
    """The C parallel runtime as a kernel_cache.KernelLibrary (stats() gives its counters), or None
    where it cannot be built (no C compiler): JIT modules then use the Python launcher."""
    global _native, _native_failed
    with _lock:
        if _native is None and not _native_failed:
            try:
                lib = load_kernels([])
                lib.set_num_threads(min(num_threads(), _MAX_NATIVE_THREADS))
                _native = lib
            except (KernelBuildError, KernelCacheError) as e:
                _native_failed = True
                log.warning("parallel loops use the Python launcher: the C runtime cannot be built (%s)", e)
        return _native


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, num_threads() - 1),
                                       thread_name_prefix="kit-parallel")
        return _pool


class _Job:
    """One Python-launched parallel loop: chunks handed out by a counter (next() on it is atomic
    under the GIL); helpers join only while the job is open, and the caller waits for those alone."""

    __slots__ = ("worker", "closure", "nchunk", "chunks", "open", "active", "cv")

    def __init__(self, worker, closure, nchunk):
        self.worker, self.closure, self.nchunk = worker, closure, nchunk
        self.chunks = itertools.count()
        self.open, self.active = True, 0
        self.cv = threading.Condition(threading.Lock())

    def run_chunks(self) -> None:
        for t in self.chunks:
            if t >= self.nchunk:
                return
            self.worker(t, self.nchunk, self.closure)

    def helper(self) -> None:
        with self.cv:
            if not self.open:
                return
            self.active += 1
        try:
            self.run_chunks()
        finally:
            with self.cv:
                self.active -= 1
                if not self.active:
                    self.cv.notify_all()

    def finish(self) -> None:
        with self.cv:
            self.open = False
            while self.active:
                self.cv.wait()


def _launch(fn_addr, closure, n):
    try:
        worker = _workers.get(fn_addr)
        if worker is None:
            worker = _workers[fn_addr] = _WORKER_T(fn_addr)
        nthread = min(num_threads(), int(n))
        if nthread <= 1:
            worker(0, 1, closure)
            return 0
        job = _Job(worker, closure, min(int(n), nthread * _CHUNKS_PER_THREAD))
        pool = _get_pool()
        for _ in range(nthread - 1):
            pool.submit(job.helper)
        try:
            job.run_chunks()
        finally:
            job.finish()
        return 0
    except Exception:  # pragma: no cover - must not unwind through native frames
        log.exception("parallel launch failed")
        return -1


_launch_cb = _LAUNCH_T(_launch)
_registered = False


def register_runtime_symbols() -> None:
    """Make the runtime's symbols resolvable by JIT-compiled code (once per process)."""
    global _registered
    if _registered:
        return
    native = native_runtime()
    target = getattr(native.lib, PARALLEL_LAUNCH) if native is not None else _launch_cb
    llvm.add_symbol(PARALLEL_LAUNCH, ctypes.cast(target, ctypes.c_void_p).value)
    _registered = True


_externs: dict = {}


def register_extern(name: str, func) -> None:
    """Make C function `func` (a ctypes function pointer, or an int address) callable from
    generated code as `call_extern(..., name, ...)`. Keep `func` alive yourself."""
    addr = func if isinstance(func, int) else ctypes.cast(func, ctypes.c_void_p).value
    _externs[name] = func
    llvm.add_symbol(name, addr)


class _Sources:
    """The loop IR, LLVM IR or assembly a compiled function came from (func, _ir, target, _llvm_module)."""

    def get_source(self, fmt: str = "ll") -> str:
        if fmt == "tir":
            return self.func.script()
        if fmt == "ll":
            return self._ir
        if fmt in ("asm", "s"):
            return self.target.target_machine().emit_assembly(self._llvm_module)
        raise CodegenError(f"get_source: unknown format {fmt!r}; use 'tir', 'll' or 'asm'")


class Module(_Sources):
    """A JIT-compiled function: call it with numpy arrays in the order of `args`.

    mod(a, b, c) checks each array's shape, dtype and layout (C-contiguous) and names the
    parameter at fault. get_source("tir" | "ll" | "asm") returns the lowered loop IR, the
    optimised LLVM IR or the assembly.
    """

    def __init__(self, func, engine, llvm_module, target, ir_text: str):
        self.func = func
        self.name = func.name
        self.target = target
        self._engine = engine
        self._llvm_module = llvm_module
        self._ir = ir_text
        addr = engine.get_function_address(func.name)
        if not addr:
            raise CodegenError(f"function '{func.name}' was not found after JIT compilation")
        self._cfunc = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * len(func.params)))(addr)
        self._specs = [(b.name, b.const_shape(), dt.to_numpy(b.dtype)) for b in func.params]
        self.entry_address = addr

    @property
    def params(self):
        return list(self._specs)

    def _check(self, arrays):
        if len(arrays) != len(self._specs):
            raise CodegenError(f"{self.name}: takes {len(self._specs)} arrays "
                               f"({', '.join(n for n, _, _ in self._specs)}), got {len(arrays)}")
        ptrs = []
        for a, (name, shape, dtype) in zip(arrays, self._specs):
            if not isinstance(a, np.ndarray):
                raise CodegenError(f"{self.name}: argument '{name}' must be a numpy array, got {type(a).__name__}")
            if a.shape != shape:
                raise CodegenError(f"{self.name}: argument '{name}' has shape {a.shape}, expected {shape}")
            if a.dtype != np.dtype(dtype):
                raise CodegenError(f"{self.name}: argument '{name}' has dtype {a.dtype}, expected {dtype}")
            if not a.flags.c_contiguous:
                raise CodegenError(f"{self.name}: argument '{name}' is not C-contiguous "
                                   "(use np.ascontiguousarray)")
            ptrs.append(a.ctypes.data)
        return ptrs

    def __call__(self, *arrays) -> None:
        self._cfunc(*self._check(arrays))

    def time(self, *arrays, number: int = 10, repeat: int = 3, warmup: int = 1) -> float:
        """Best over `repeat` runs of the mean seconds per call over `number` calls."""
        ptrs = self._check(arrays)
        for _ in range(warmup):
            self._cfunc(*ptrs)
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                self._cfunc(*ptrs)
            best = min(best, (time.perf_counter() - t0) / number)
        return best

    def __repr__(self):
        return f"Module({self.name}, target={self.target})"


class CrossModule(_Sources):
    """Code for another machine (an ARM board): the object file and its sources, not callable."""

    def __init__(self, func, llvm_module, target, ir_text: str):
        self.func, self.name, self.target = func, func.name, target
        self._llvm_module = llvm_module
        self._ir = ir_text
        self.object_code: bytes = target.target_machine().emit_object(llvm_module)

    def __call__(self, *arrays):
        raise CodegenError(f"module '{self.name}' is compiled for {self.target.triple}; it cannot run "
                           "on this host. save() the object and link it on the board")

    def save(self, path: str) -> None:
        write_atomic(path, self.object_code)
