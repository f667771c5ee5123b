"""host_runtime.matmul: blocked int8 matmul with bias, shift and clip on fsim equals numpy."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel.isa import PRESETS, AccelConfig
from host_runtime import CommandError, Device
from host_runtime.matmul import matmul, matmul_reference, plan_matmul

TINY = PRESETS["tiny"]
ODD = AccelConfig(batch=2, block_in=8, block_out=16)
_DEVICES = {}


def _device(cfg):
    if cfg not in _DEVICES:  # one device per config: kernels and DRAM are reused across runs
        _DEVICES[cfg] = Device(cfg, dram_bytes=8 << 20)
    return _DEVICES[cfg]


def _operands(seed, m, k, n, bias=True):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    c = rng.integers(-(1 << 20), 1 << 20, n).astype(np.int32) if bias else None
    return a, b, c


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(m=st.integers(1, 40), k=st.integers(1, 70), n=st.integers(1, 40), vt=st.sampled_from([1, 2]),
       shift=st.integers(0, 14), bias=st.booleans(), seed=st.integers(0, 1 << 16))
def test_matmul_random_shapes_equal_numpy_tiny(m, k, n, vt, shift, bias, seed):
    a, b, c = _operands(seed, m, k, n, bias)
    got, result = matmul(_device(TINY), a, b, c, shift=shift, virtual_threads=vt)
    assert got.dtype == np.int8 and got.shape == (m, n)
    assert np.array_equal(got, matmul_reference(a, b, c, shift))
    assert result.stats["macs"] > 0 and not result.stats.get("leftover_tokens")


@pytest.mark.parametrize("cfg", [ODD, PRESETS["default"]], ids=["odd", "default"])
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 17, 33), (37, 100, 21), (130, 260, 70)])
def test_matmul_shapes_not_multiple_of_block(cfg, m, k, n):
    a, b, c = _operands(m * k + n, m, k, n)
    for vt in (1, 2):
        got, _ = matmul(_device(cfg), a, b, c, shift=9, virtual_threads=vt)
        assert np.array_equal(got, matmul_reference(a, b, c, 9)), f"virtual_threads={vt}"


@pytest.mark.parametrize("lo, hi", [(-127, 127), (-5, 100), (None, None), (0, None), (None, 3)])
def test_matmul_clip_bounds(lo, hi):
    a, b, c = _operands(3, 9, 30, 11)
    got, result = matmul(_device(TINY), a, b, c, shift=4, lo=lo, hi=hi)
    assert np.array_equal(got, matmul_reference(a, b, c, 4, lo, hi))
    clip = lo is not None and hi is not None and lo == -hi
    per_tile = 2 + (1 if clip else (lo is not None) + (hi is not None))  # ADD, SHR, then CLIP or MIN/MAX
    assert result.stats["insns"]["ALU"] == result.stats["insns"]["STORE"] * per_tile


def test_matmul_tiles_large_problem_and_double_buffers():
    cfg = TINY
    p = plan_matmul(cfg, 200, 300, 150, virtual_threads=2)
    assert p.tm * p.tk <= p.inp_slot and p.tn * p.tk <= p.wgt_slot and p.tm * p.tn <= p.acc_slot
    assert 2 * p.acc_slot + p.tn <= cfg.acc_depth and p.steps > 4
    a, b, c = _operands(5, 200, 300, 150)
    got, result = matmul(_device(cfg), a, b, c, shift=10)
    assert np.array_equal(got, matmul_reference(a, b, c, 10))
    # micro-op kernels stay small: GEMMs cover whole tiles with both loop levels
    assert result.stats["gemm_uops"] >= 20 * result.stats["insns"]["GEMM"]


@pytest.mark.parametrize("args, match", [
    (dict(a=np.zeros((2, 3), np.int16)), "int8"),
    (dict(b=np.zeros((4, 2), np.int8)), "inner dimensions"),
    (dict(bias=np.zeros(5, np.int32)), "length N=2"),
    (dict(shift=32), "shift=32"),
    (dict(lo=5, hi=1), "lo=5 > hi=1"),
    (dict(hi=1 << 15), "immediate range"),
    (dict(virtual_threads=3), "virtual_threads=3"),
])
def test_matmul_bad_input_raises(args, match):
    kw = dict(a=np.zeros((2, 3), np.int8), b=np.zeros((3, 2), np.int8), bias=None)
    kw.update(args)
    with pytest.raises(CommandError, match=match):
        matmul(_device(TINY), **kw)


def test_matmul_frees_its_buffers():
    dev = Device(TINY, dram_bytes=1 << 20)
    a, b, c = _operands(1, 10, 20, 30)
    matmul(dev, a, b, c)
    used = dev.memory.used_bytes  # kernels stay (cached); operands are freed
    matmul(dev, a, b, c)
    assert dev.memory.used_bytes == used and len(dev.memory.buffers()) == len(dev.kernels)
