"""Residual add on the accelerator (GEMM against scaled identity tiles) against numpy."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel.isa import PRESETS, AccelConfig
from compiler.accel.conv2d import Requant, TilingError
from compiler.accel.eltwise import add_reference, run_add
from host_runtime import Device


@settings(max_examples=20, deadline=None)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(1, 9), st.integers(1, 9)),
       ka=st.integers(0, 9), kb=st.integers(0, 9), shift=st.integers(-2, 12), relu=st.booleans(),
       rnd=st.booleans(),
       vt=st.sampled_from([1, 2]), cfg=st.sampled_from([PRESETS["tiny"], PRESETS["default"]]), seed=st.integers(0, 99))
def test_add_random(shape, ka, kb, shift, relu, rnd, vt, cfg, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, shape, dtype=np.int8)
    b = rng.integers(-128, 128, shape, dtype=np.int8)
    rq = Requant(shift, 0 if relu else -127, 127, rnd)
    y, _ = run_add(Device(cfg), a, b, ka, kb, rq, vt)
    assert np.array_equal(y, add_reference(a, b, ka, kb, rq))


def test_add_errors():
    with pytest.raises(TilingError, match="operand shift 32 outside"):
        run_add(Device(PRESETS["tiny"]), np.zeros((1, 4, 1, 1), np.int8), np.zeros((1, 4, 1, 1), np.int8), 32)
    cfg = AccelConfig(block_in=8, block_out=16, acc_buff_bytes=64 * 1024, out_buff_bytes=16 * 1024)
    a = np.zeros((1, 16, 2, 2), np.int8)
    with pytest.raises(TilingError, match="needs block_in == block_out"):
        run_add(Device(cfg), a, a)
    with pytest.raises(TilingError, match="operand shapes differ"):
        run_add(Device(PRESETS["tiny"]), a, a[:, :8])
