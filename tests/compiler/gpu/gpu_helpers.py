"""Helpers of the GPU tests: OpenCL kernels run on whatever OpenCL device exists (PoCL's CPU device here); PTX is
checked with ptxas from the nvidia-cuda-nvcc-cu12 wheel when it is installed."""
import os
import shutil
import subprocess

import numpy as np
import pytest

from host_runtime.gpu import GpuError, open_device


def opencl_or_skip():
    pytest.importorskip("pyopencl", reason="OpenCL tests need pyopencl and pocl-binary-distribution (pip, the "
                                           "'gpu' extra)")
    try:
        return open_device("opencl")
    except GpuError as e:
        pytest.skip(f"no OpenCL device: {e}")


def ptxas_path():
    try:
        import nvidia.cuda_nvcc as n  # noqa: PLC0415 - optional dep nvidia-cuda-nvcc-cu12
        for base in list(getattr(n, "__path__", [])):
            p = os.path.join(base, "bin", "ptxas")
            if os.path.exists(p):
                return p
    except ImportError:
        pass
    return shutil.which("ptxas")


def ptxas_check(ptx: str, tmp_path, name: str = "k") -> str:
    """Run ptxas on PTX text; skip naming the wheel when ptxas is absent. Returns ptxas -v output."""
    exe = ptxas_path()
    if exe is None:
        pytest.skip("ptxas not found: pip install nvidia-cuda-nvcc-cu12 to check generated PTX")
    src = tmp_path / f"{name}.ptx"
    src.write_text(ptx)
    # PTX for sm_70 is valid input for any later GPU; CUDA 13's ptxas no longer targets sm_70
    # (Volta), so take the oldest architecture this ptxas still accepts
    for arch in PTXAS_ARCHS:
        r = subprocess.run([exe, f"-arch={arch}", "-v", str(src), "-o", str(tmp_path / f"{name}.cubin")],
                           capture_output=True, text=True, timeout=120)
        if "is not defined for option 'gpu-name'" not in r.stderr:
            break
    assert r.returncode == 0, f"ptxas rejected {name} for {arch}: {r.stderr[-2000:]}"
    return r.stderr + r.stdout


PTXAS_ARCHS = ("sm_70", "sm_75", "sm_80")


@pytest.fixture
def rng():
    return np.random.default_rng(7)
