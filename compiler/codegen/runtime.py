"""CPU runtime for generated code: the parallel launcher and the callable Module.

Generated code calls `__kit_parallel_launch(worker, closure, n)` for a parallel loop of n
iterations. The launcher (a ctypes callback) runs worker(task, ntask, closure) for task 0 in
the calling thread and the others on a persistent thread pool; ctypes drops the GIL for the
duration of every native call, so the chunks run on all cores at once. The launch costs tens
of microseconds, so parallelise outer loops, not inner ones.
"""
from __future__ import annotations

import ctypes
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm
import numpy as np

from accel.isa.files import write_atomic
from host_runtime.executor import default_num_threads

from ..errors import CodegenError
from ..tir import dtype as dt

log = logging.getLogger(__name__)

_WORKER_T = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
_LAUNCH_T = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_num_threads: int | None = None
_workers: dict = {}


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
        if _pool is not None:
            _pool.shutdown(wait=False)
            _pool = None


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, num_threads() - 1),
                                       thread_name_prefix="kit-parallel")
        return _pool


def _launch(fn_addr, closure, n):
    try:
        worker = _workers.get(fn_addr)
        if worker is None:
            worker = _workers[fn_addr] = _WORKER_T(fn_addr)
        ntask = min(num_threads(), int(n))
        if ntask <= 1:
            worker(0, 1, closure)
            return 0
        pool = _get_pool()
        futs = [pool.submit(worker, t, ntask, closure) for t in range(1, ntask)]
        worker(0, ntask, closure)
        for f in futs:
            f.result()
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
    llvm.add_symbol("__kit_parallel_launch", ctypes.cast(_launch_cb, ctypes.c_void_p).value)
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
