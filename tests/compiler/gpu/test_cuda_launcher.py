"""The CUDA launcher (host_runtime.gpu.CudaDevice) against a fake of cuda-python's driver API: PTX
module loading, kernel argument packing, grid and block dimensions, copy directions and sizes.
Kernels run as their OpenCL twins on PoCL (same name, launch shape and parameters), so a cuda
model runs end to end through the launcher without a GPU."""
import ctypes
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import compiler
from compiler.frontend import zoo
from compiler.ops import gpu  # noqa: F401 - gpu registers the GPU kernels
from host_runtime import gpu as hgpu
from host_runtime.gpu import CudaDevice, GpuError
from tests.compiler.gpu.gpu_helpers import opencl_or_skip


class FakeCuda:
    """The subset of cuda.bindings.driver the launcher calls; each returns (err, *values) as
    cuda-python does. Device memory is a dict of bytearrays at fake addresses."""

    def __init__(self, kernels=None, devices=1):
        self.kernels = kernels or {}
        self.devices = devices
        self.mem: dict[int, bytearray] = {}
        self.next = 0x10000
        self.log: list[tuple] = []

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGetCount(self):
        return (0, self.devices)

    def cuDeviceGet(self, i):
        return (0, i)

    def cuDevicePrimaryCtxRetain(self, dev):
        return (0, "ctx")

    def cuCtxSetCurrent(self, ctx):
        return (0,)

    def cuModuleLoadData(self, image):
        assert isinstance(image, int), "the PTX image is passed by address"
        self.log.append(("load", ctypes.string_at(image).decode()))   # up to its NUL
        return (0, ("module", len(self.log)))

    def cuModuleGetFunction(self, mod, name):
        assert isinstance(name, bytes)
        return (0, name.decode())

    def cuMemAlloc(self, n):
        p = self.next
        self.next += (n + 255) // 256 * 256
        self.mem[p] = bytearray(n)
        self.log.append(("alloc", p, n))
        return (0, p)

    def cuMemcpyHtoD(self, dst, src, n):
        assert dst in self.mem and n <= len(self.mem[dst])
        self.mem[dst][:n] = ctypes.string_at(src, n)
        self.log.append(("HtoD", dst, n))
        return (0,)

    def cuMemcpyDtoH(self, dst, src, n):
        assert src in self.mem and n <= len(self.mem[src])
        ctypes.memmove(dst, bytes(self.mem[src][:n]), n)
        self.log.append(("DtoH", src, n))
        return (0,)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        kern = self.kernels[fn]
        # kernelParams: void** -> one pointer per argument, each to the u64 device address
        ptrs = [ctypes.c_uint64.from_address(ctypes.c_uint64.from_address(params + 8 * i).value).value
                for i in range(kern["nargs"])]
        assert all(p in self.mem for p in ptrs), "a kernel argument is not a device pointer"
        self.log.append(("launch", fn, (gx, gy, gz), (bx, by, bz), shared, ptrs))
        kern["run"](self.mem, ptrs)
        return (0,)

    def cuCtxSynchronize(self):
        return (0,)


def _add_kernel():
    def run(mem, ptrs):
        a, b, out = (np.frombuffer(bytes(mem[p]), np.float32) for p in ptrs)
        mem[ptrs[2]][:] = (a + b).tobytes()
    return {"nargs": 3, "run": run}


def _attrs(n=8):
    return {"lang": "ptx", "source": ".version 7.0\n.target sm_70\n// add\n", "kernel": "add", "grid": [2, 1, 1],
            "block": [4, 1, 1], "params": [[[n], "float32"]] * 3}


def test_launcher_loads_ptx_packs_pointers_and_copies_each_way():
    cu = FakeCuda({"add": _add_kernel()})
    dev = CudaDevice(driver=cu)
    a, b, out = np.arange(8, dtype=np.float32), np.full(8, 0.5, np.float32), np.zeros(8, np.float32)
    call = dev.launcher(_attrs(), [a, b], out)
    call()
    call()
    np.testing.assert_array_equal(out, a + b)
    loads = [e for e in cu.log if e[0] == "load"]
    assert len(loads) == 1 and loads[0][1] == _attrs()["source"]     # one module per source text
    allocs = [e[1] for e in cu.log if e[0] == "alloc"]
    launch = next(e for e in cu.log if e[0] == "launch")
    assert launch[1:5] == ("add", (2, 1, 1), (4, 1, 1), 0) and launch[5] == allocs
    kinds = [e[0] for e in cu.log if e[0] in ("HtoD", "DtoH", "launch")]
    assert kinds == ["HtoD", "HtoD", "launch", "DtoH"] * 2
    assert [e[1:] for e in cu.log if e[0] == "DtoH"] == [(allocs[2], 32)] * 2


def test_no_device_and_driver_errors_are_gpu_errors():
    with pytest.raises(GpuError, match="no CUDA device found"):
        CudaDevice(driver=FakeCuda(devices=0))
    broken = FakeCuda()
    broken.cuInit = lambda flags: (_ for _ in ()).throw(OSError("libcuda.so.1: cannot open shared object file"))
    with pytest.raises(GpuError, match="no CUDA device: cuInit failed .*libcuda"):
        CudaDevice(driver=broken)     # cuda-python installed, no driver: still one GpuError
    cu = FakeCuda({"add": _add_kernel()})
    cu.cuModuleLoadData = lambda image: (218, None)          # CUDA_ERROR_INVALID_PTX
    with pytest.raises(GpuError, match="loading the PTX of add: error 218"):
        CudaDevice(driver=cu).launcher(_attrs(), [np.zeros(8, np.float32)] * 2, np.zeros(8, np.float32))


def _twins(cuda_mod, ocl_mod):
    """Fake CUDA kernels that run the OpenCL kernel of the same name on numpy copies."""
    ocl = {s.symbol: s for s in ocl_mod.steps if s.kind == "gpu"}
    kernels = {}
    for s in cuda_mod.steps:
        if s.kind != "gpu":
            continue
        twin = ocl[s.symbol]
        assert twin.attrs["params"] == s.attrs["params"] and twin.attrs["grid"] == s.attrs["grid"]

        def run(mem, ptrs, attrs=twin.attrs):
            arrs = [np.frombuffer(bytes(mem[p]), np.dtype(dt))[:int(np.prod(shape))].reshape(shape).copy()
                    for p, (shape, dt) in zip(ptrs, attrs["params"])]
            hgpu.run_kernel(attrs, arrs[:-1], arrs[-1])
            mem[ptrs[-1]][:arrs[-1].nbytes] = arrs[-1].tobytes()
        kernels[s.attrs["kernel"]] = {"nargs": len(s.attrs["params"]), "run": run}
    return kernels


def test_cuda_model_runs_through_the_launcher_with_tensors_resident(monkeypatch):
    opencl_or_skip()
    m = zoo.mlp()
    feeds = zoo.sample_inputs(m, 1)[0]
    cuda_mod = compiler.build_model(m, target="cuda")
    ocl_mod = compiler.build_model(m, target="opencl")
    cu = FakeCuda(_twins(cuda_mod, ocl_mod))
    monkeypatch.setitem(hgpu._DEVICES, "cuda", CudaDevice(driver=cu))
    outs, rows = cuda_mod.run(feeds)
    want, _ = compiler.build_model(m, target="cpu").run(feeds)
    for k in want:
        assert np.abs(outs[k] - want[k]).max() <= 1e-5
    launches = [e for e in cu.log if e[0] == "launch"]
    steps = [s for s in cuda_mod.steps if s.kind == "gpu"]
    assert [(e[1], list(e[2]), list(e[3])) for e in launches] == [
        (s.attrs["kernel"], s.attrs["grid"], s.attrs["block"]) for s in steps]
    # one input up, each constant up once, the one output down
    n_c = len({a[1] for s in steps for a in s.args if a[0] == "c"})
    assert sum(e[0] == "HtoD" for e in cu.log) == 1 + n_c
    assert sum(e[0] == "DtoH" for e in cu.log) == len(cuda_mod.outputs)
    # the loaded PTX is the steps' own text
    assert {e[1] for e in cu.log if e[0] == "load"} == {s.attrs["source"] for s in steps}


def test_device_check_script_reports_no_device_as_json():
    """bench/gpu_device_check.sh (the one-call check for a GPU machine) runs here: no CUDA device
    -> exit 2 and a JSON report that says why."""
    try:
        CudaDevice()
        pytest.skip("a CUDA device exists here: the script would build and run the models")
    except GpuError:
        pass
    root = Path(__file__).resolve().parents[3]
    r = subprocess.run(["bash", str(root / "bench" / "gpu_device_check.sh"), "mlp"], capture_output=True, text=True,
                       timeout=300, cwd=root)
    assert r.returncode == 2, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["ok"] is False and "CUDA" in report["error"] and report["models"] == {}
