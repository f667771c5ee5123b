"""Max pooling on the accelerator's ALU against the graph's int8 max_pool2d (bit-exact)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compiler
from accel.isa import PRESETS, AccelConfig
from compiler.accel.conv2d import TilingError
from compiler.accel.layout import pack_activation, unpack_activation
from compiler.accel.pool import PoolSpec, PoolTiling, plan_pool, run_max_pool
from compiler.frontend import zoo
from compiler.graph import run as reference_run
from compiler.graph.ops import get_op, normalize_attrs
from host_runtime import Device
from host_runtime.executor import Executor


def reference(x, kernel, strides, pads, ceil_mode, lo=-128, hi=127):
    attrs = normalize_attrs("max_pool2d", {"kernel": kernel, "strides": strides, "pads": pads,
                                           "ceil_mode": ceil_mode})
    return np.clip(get_op("max_pool2d").reference(attrs, x), lo, hi).astype(np.int8)


@st.composite
def pools(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = (draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)), draw(st.integers(0, kh - 1)),
            draw(st.integers(0, kw - 1)))
    h, w = draw(st.integers(kh, 12)), draw(st.integers(kw, 12))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 40)), h, w)
    return shape, (kh, kw), (sh, sw), pads, draw(st.integers(0, 1))


@settings(max_examples=25, deadline=None)
@given(p=pools(), relu=st.booleans(), vt=st.sampled_from([1, 2]),
       cfg=st.sampled_from([PRESETS["tiny"], PRESETS["default"]]), seed=st.integers(0, 99))
def test_max_pool_random(p, relu, vt, cfg, seed):
    shape, kernel, strides, pads, ceil_mode = p
    x = np.random.default_rng(seed).integers(-128, 128, shape, dtype=np.int8)
    lo = 0 if relu else -128
    y, _ = run_max_pool(Device(cfg), x, kernel, strides, pads, ceil_mode, lo, 127, vt)
    assert np.array_equal(y, reference(x, kernel, strides, pads, ceil_mode, lo))


def test_max_pool_row_bands_on_tsim():
    """A plane too large for one tile runs in bands of output rows (the halo rows reloaded); tsim
    runs the same program."""
    cfg = PRESETS["tiny"]
    x = np.random.default_rng(1).integers(-128, 128, (1, 8, 30, 28), dtype=np.int8)
    spec = PoolSpec(1, 30, 28, (3, 3), (2, 2), (1, 1, 1, 1))
    assert plan_pool(spec, cfg).rows < spec.out_hw[0]
    want = reference(x, (3, 3), (2, 2), (1, 1, 1, 1), 0)
    for driver in ("fsim", "tsim"):
        y, res = run_max_pool(Device(cfg, driver), x, (3, 3), (2, 2), (1, 1, 1, 1))
        assert np.array_equal(y, want), driver


def test_plan_pool_whole_planes():
    spec = PoolSpec(64, 7, 7, (2, 2), (2, 2))
    t = plan_pool(spec, PRESETS["default"])
    assert t.rows == 3 and t.planes > 1
    assert all(v <= d for v, d in zip(t.needs(spec).values(), (2048, 2048, 2048)))


def test_pool_errors():
    with pytest.raises(TilingError, match="pads .* smaller than the kernel"):
        PoolSpec(1, 4, 4, (2, 2), pads=(2, 0, 0, 0))
    cfg = AccelConfig(block_in=8, block_out=16, acc_buff_bytes=64 * 1024, out_buff_bytes=16 * 1024)
    with pytest.raises(TilingError, match="needs block_in == block_out"):
        run_max_pool(Device(cfg), np.zeros((1, 16, 4, 4), np.int8), (2, 2))
    with pytest.raises(TilingError, match="one output row .* does not fit"):
        plan_pool(PoolSpec(1, 3, 5000, (3, 3)), PRESETS["tiny"])
    with pytest.raises(TilingError, match="clamp"):
        run_max_pool(Device(PRESETS["tiny"]), np.zeros((1, 16, 4, 4), np.int8), (2, 2), lo=5, hi=2)
    assert PoolTiling(1, 1, 2).needs(PoolSpec(1, 4, 4, (2, 2)))["out"] == 2 * 3


def test_built_model_pools_on_the_accelerator_bit_exact():
    """conv-relu-maxpool: the pool is placed on the accelerator (it rides with its producer) and
    every int8 tensor the module computes equals the graph's int8 reference."""
    m = zoo.conv_bn_relu_pool()
    feeds = zoo.sample_inputs(m, 5, seed=11)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:4])
    pools = [s for s in mod.steps if s.op == "max_pool2d"]
    assert pools and all(s.kind == "accel" for s in pools) and not mod.meta["fallbacks"]
    with Executor(mod, driver="fsim") as ex:
        ex.run(feeds[4], keep=True)
    _, env = reference_run(mod.graph, feeds[4], keep=True)
    ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
    assert any(s.name in ex.values for s in pools)
    for k in ex.values:
        if k in ints:
            np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=k)


def test_packed_max_pool_reference_matches_nchw():
    """The graph op pools the accelerator's packed layout as it pools NCHW."""
    x = np.random.default_rng(3).integers(-128, 128, (2, 20, 7, 6), dtype=np.int8)
    attrs = normalize_attrs("max_pool2d", {"kernel": (3, 2), "strides": (2, 1), "pads": (1, 0, 1, 1),
                                           "ceil_mode": 1})
    ref = get_op("max_pool2d").reference
    got = unpack_activation(ref(attrs, pack_activation(x, 1, 16)), 2, 20)
    assert np.array_equal(got, ref(attrs, x))
