"""GPU devices for compiled models' 'gpu' steps: OpenCL (pyopencl; PoCL runs it on the CPU where
there is no GPU) and CUDA (cuda-python's driver API, PTX loaded by the driver).

A step carries its kernel as source text (OpenCL C or PTX) with its launch shape and parameter
types (attrs: lang, source, kernel, grid, block, params); the device's own compiler turns it
into machine code here, so a module file still brings no native code (docs/trust.md). Each call
copies the step's arguments to device buffers, launches, and copies the output back into the
arena: simple and exact, not fast (a later step would keep tensors resident).
"""
from __future__ import annotations

import hashlib
import logging
import math

import numpy as np

from .errors import HostRuntimeError

log = logging.getLogger(__name__)

LANGS = ("opencl", "ptx")
#: launch bounds a module may ask for
MAX_GRID = 1 << 31
MAX_BLOCK = 1024
MAX_SOURCE = 16 << 20


class GpuError(HostRuntimeError):
    """No device of the kind a step needs, or its driver refused a kernel or launch."""


def check_gpu_attrs(attrs: dict) -> str | None:
    """Why a gpu step's attributes are malformed (None when they are fine)."""
    if not isinstance(attrs, dict):
        return "attrs is not an object"
    lang = attrs.get("lang")
    if lang not in LANGS:
        return f"attrs.lang = {str(lang)[:40]!r}; allowed: {', '.join(LANGS)}"
    src, kern = attrs.get("source"), attrs.get("kernel")
    if not isinstance(src, str) or not src or len(src) > MAX_SOURCE:
        return f"attrs.source must be kernel source text of 1..{MAX_SOURCE} characters"
    if not isinstance(kern, str) or not kern.isidentifier():
        return f"attrs.kernel = {str(kern)[:40]!r} is not a kernel name"
    for key, hi in (("grid", MAX_GRID), ("block", MAX_BLOCK)):
        v = attrs.get(key)
        if not isinstance(v, list) or len(v) != 3 or not all(
                isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= hi for x in v):
            return f"attrs.{key} = {str(v)[:60]}; expected three integers 1..{hi}"
    if math.prod(attrs["block"]) > MAX_BLOCK:
        return f"attrs.block = {attrs['block']}: more than {MAX_BLOCK} threads per block"
    ps = attrs.get("params")
    if not isinstance(ps, list) or not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], list)
                                           and all(isinstance(d, int) and d >= 0 for d in p[0])
                                           and isinstance(p[1], str) for p in ps):
        return "attrs.params must be a list of [shape, dtype]"
    return None


class OpenCLDevice:
    """The first OpenCL GPU, else the first OpenCL device of any kind (PoCL's CPU device)."""
    kind = "opencl"

    def __init__(self):
        try:
            import pyopencl as cl
        except ImportError:
            raise GpuError("OpenCL needs pyopencl (pip install pyopencl pocl-binary-distribution, the 'gpu' "
                           "extra)") from None
        self.cl = cl
        try:
            platforms = cl.get_platforms()
        except cl.Error as e:
            raise GpuError(f"no OpenCL platform ({e}); pip install pocl-binary-distribution for a CPU device") from None
        devs = [d for p in platforms for d in p.get_devices()]
        if not devs:
            raise GpuError("no OpenCL device found; pip install pocl-binary-distribution for a CPU device")
        gpus = [d for d in devs if d.type & cl.device_type.GPU]
        self.device = (gpus or devs)[0]
        self.ctx = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.ctx)
        self.programs: dict[str, object] = {}
        self.name = self.device.name.strip()

    def kernel(self, source: str, name: str):
        key = hashlib.sha256(source.encode()).hexdigest()
        prg = self.programs.get(key)
        if prg is None:
            try:
                prg = self.cl.Program(self.ctx, source).build()
            except self.cl.Error as e:
                raise GpuError(f"OpenCL kernel {name}: the device compiler refused it: {str(e)[:500]}") from None
            self.programs[key] = prg
        try:
            return self.cl.Kernel(prg, name)
        except self.cl.Error:
            raise GpuError(f"OpenCL program defines no kernel {name!r}") from None

    def launcher(self, attrs: dict, arrays: list[np.ndarray], out: np.ndarray):
        cl = self.cl
        most = self.device.max_work_group_size
        if math.prod(attrs["block"]) > most:
            raise GpuError(f"kernel {attrs['kernel']} needs {math.prod(attrs['block'])} threads per block, "
                           f"{self.name} allows {most}")
        sizes = list(self.device.max_work_item_sizes)
        if any(b > s for b, s in zip(attrs["block"], sizes)):
            raise GpuError(f"kernel {attrs['kernel']} needs a block of {attrs['block']}, {self.name} allows "
                           f"at most {sizes[:3]} per dimension")
        k = self.kernel(attrs["source"], attrs["kernel"])
        mf = cl.mem_flags
        bufs = [cl.Buffer(self.ctx, mf.READ_WRITE, size=max(1, a.nbytes)) for a in arrays] + \
            [cl.Buffer(self.ctx, mf.READ_WRITE, size=max(1, out.nbytes))]
        k.set_args(*bufs)
        block = attrs["block"]
        gsize = tuple(g * b for g, b in zip(attrs["grid"], block))

        def call():
            for b, a in zip(bufs, arrays):
                if a.nbytes:
                    cl.enqueue_copy(self.queue, b, a)
            cl.enqueue_nd_range_kernel(self.queue, k, gsize, tuple(block))
            if out.nbytes:
                cl.enqueue_copy(self.queue, out, bufs[-1])
            self.queue.finish()
        return call


class CudaDevice:
    """CUDA device 0 through cuda-python's driver API; PTX is JIT-compiled by the driver."""
    kind = "cuda"

    def __init__(self):
        try:
            from cuda.bindings import driver as cu   # cuda-python >= 12.6
        except ImportError:
            try:
                from cuda import cuda as cu          # older cuda-python
            except ImportError:
                raise GpuError("no CUDA device: cuda-python is not installed (pip install cuda-python)") from None
        self.cu = cu
        err, = cu.cuInit(0)
        if int(err) != 0:
            raise GpuError(f"no CUDA device: cuInit failed ({err})")
        err, n = cu.cuDeviceGetCount()
        if int(err) != 0 or n < 1:
            raise GpuError("no CUDA device found")
        err, self.dev = cu.cuDeviceGet(0)
        self._check(err, "opening device 0")
        err, self.ctx = cu.cuCtxCreate(0, self.dev) if not hasattr(cu, "cuDevicePrimaryCtxRetain") else \
            cu.cuDevicePrimaryCtxRetain(self.dev)
        self._check(err, "creating a context")
        self._check(cu.cuCtxSetCurrent(self.ctx)[0], "making the context current")
        self.modules: dict[str, object] = {}
        self.name = "CUDA device 0"

    def _check(self, err, what: str):
        if int(err) != 0:
            raise GpuError(f"CUDA {what}: error {err}")

    def launcher(self, attrs: dict, arrays: list[np.ndarray], out: np.ndarray):
        cu = self.cu
        key = hashlib.sha256(attrs["source"].encode()).hexdigest()
        mod = self.modules.get(key)
        if mod is None:
            err, mod = cu.cuModuleLoadData(attrs["source"].encode() + b"\0")
            self._check(err, f"loading the PTX of {attrs['kernel']}")
            self.modules[key] = mod
        err, fn = cu.cuModuleGetFunction(mod, attrs["kernel"].encode())
        self._check(err, f"finding kernel {attrs['kernel']}")
        ptrs = []
        for a in arrays + [out]:
            err, p = cu.cuMemAlloc(max(1, a.nbytes))
            self._check(err, "allocating device memory")
            ptrs.append(p)
        params = np.array([int(p) for p in ptrs], dtype=np.uint64)
        argp = np.array([params[i:].ctypes.data for i in range(len(ptrs))], dtype=np.uint64)
        g, b = attrs["grid"], attrs["block"]

        def call():
            for p, a in zip(ptrs, arrays):
                if a.nbytes:
                    self._check(cu.cuMemcpyHtoD(p, a.ctypes.data, a.nbytes)[0], "copying to the device")
            self._check(cu.cuLaunchKernel(fn, *g, *b, 0, 0, argp.ctypes.data, 0)[0], f"launching {attrs['kernel']}")
            self._check(cu.cuCtxSynchronize()[0], f"running {attrs['kernel']}")
            if out.nbytes:
                self._check(cu.cuMemcpyDtoH(out.ctypes.data, ptrs[-1], out.nbytes)[0], "copying from the device")
            return (params, argp)
        return call


_DEVICES: dict[str, object] = {}


def open_device(lang: str):
    """The process's device for kernels in `lang` ("opencl" | "ptx"); GpuError when none exists."""
    kind = "cuda" if lang == "ptx" else "opencl"
    if kind not in _DEVICES:
        _DEVICES[kind] = CudaDevice() if kind == "cuda" else OpenCLDevice()
        log.info("GPU steps run on %s (%s)", _DEVICES[kind].name, kind)
    return _DEVICES[kind]


def run_kernel(attrs: dict, arrays: list[np.ndarray], out: np.ndarray) -> None:
    """Compile (cached) and run one kernel on numpy arrays: a test and tool convenience."""
    why = check_gpu_attrs(attrs)
    if why:
        raise GpuError(why)
    open_device(attrs["lang"]).launcher(attrs, [np.ascontiguousarray(a) for a in arrays], out)()
