"""Grouped and depthwise convolutions on the accelerator (compiler.accel.grouped) through the
functional simulator, bit-exact against the numpy reference; the merge rule and its waste."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from accel.isa import PRESETS, AccelConfig
from compiler.accel.conv2d import Conv2dSpec, Requant, TilingError
from compiler.accel.grouped import (expand_grouped_weight, grouped_reference, grouped_waste, merge_factor,
                                    run_grouped_conv2d)
from compiler.graph.ops import conv2d_ref
from host_runtime import Device

ODD = AccelConfig(batch=2, block_in=8, block_out=16, acc_buff_bytes=64 * 1024, out_buff_bytes=16 * 1024,
                  inp_buff_bytes=8 * 1024, wgt_buff_bytes=32 * 1024)


def _check(cfg, spec, groups, rq, seed=0, bias=True):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c // groups, spec.kh, spec.kw), dtype=np.int8)
    b = rng.integers(-20000, 20000, spec.o).astype(np.int32) if bias else None
    y, res, gp = run_grouped_conv2d(Device(cfg, dram_bytes=32 << 20), x, w, b, spec, groups, rq)
    ref = grouped_reference(x, w, b, spec, groups, rq)
    assert y.shape == ref.shape and np.array_equal(y, ref), f"{spec} groups={groups} merged to {gp}: mismatch"
    return res, gp


def test_reference_matches_graph_conv():
    rng = np.random.default_rng(1)
    spec = Conv2dSpec(1, 12, 5, 5, 6, 3, 3, (1, 1, 1, 1), (2, 2))
    x = rng.integers(-128, 128, (1, 12, 5, 5)).astype(np.int8)
    w = rng.integers(-128, 128, (6, 4, 3, 3)).astype(np.int8)
    acc = conv2d_ref(x, w, (2, 2), (1, 1, 1, 1), (1, 1), 3, np.int64)
    assert np.array_equal(grouped_reference(x, w, None, spec, 3, Requant(0, -127, 127)), np.clip(acc, -127, 127))


def test_merge_factor_and_waste():
    assert merge_factor(3, 240, 240, 16, 16) == 1            # ShuffleNet: 80 channels a group, whole blocks
    assert merge_factor(32, 32, 32, 16, 16) == 16            # depthwise: 16 channels a diagonal GEMM
    assert grouped_waste(32, 32, 32, 16, 16) == pytest.approx(15 / 16)
    assert merge_factor(3, 24, 24, 16, 16) == 3              # no divisor aligns: one conv, block-diagonal
    assert grouped_waste(3, 240, 240, 16, 16) == 0.0
    with pytest.raises(TilingError, match="groups=5"):
        merge_factor(5, 12, 10, 16, 16)


def test_expand_weight_is_the_same_conv():
    rng = np.random.default_rng(2)
    x = rng.integers(-9, 9, (1, 8, 4, 4)).astype(np.int64)
    w = rng.integers(-9, 9, (8, 2, 3, 3)).astype(np.int64)
    wm = expand_grouped_weight(w, 4, 2)
    assert wm.shape == (8, 4, 3, 3)
    a = conv2d_ref(x, w, (1, 1), (0, 0, 0, 0), (1, 1), 4, np.int64)
    b = conv2d_ref(x, wm, (1, 1), (0, 0, 0, 0), (1, 1), 2, np.int64)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("c,o,groups,k", [(48, 48, 3, 3), (32, 32, 32, 3), (64, 128, 64, 3), (240, 240, 3, 1),
                                          (24, 24, 3, 1), (32, 64, 2, 1)])
def test_grouped_default_config_bit_exact(c, o, groups, k):
    spec = Conv2dSpec(1, c, 7, 6, o, k, k, (k // 2,) * 4, (1, 1), "g")
    res, _ = _check(PRESETS["default"], spec, groups, Requant(shift=9, lo=0, hi=127))
    assert res.stats["macs"] >= spec.macs // groups


def test_depthwise_strided_merges_to_block_slices():
    spec = Conv2dSpec(1, 64, 9, 9, 64, 3, 3, (1, 1, 1, 1), (2, 2), "dw")
    _, gp = _check(PRESETS["default"], spec, 64, Requant(shift=7, lo=-127, hi=127))
    assert gp == 4


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.sampled_from([PRESETS["tiny"], ODD, PRESETS["default"]]), n=st.integers(1, 3),
       cpg=st.sampled_from([1, 2, 3, 4, 8, 16]), opg=st.sampled_from([1, 2, 4, 8, 16]), groups=st.integers(1, 12),
       h=st.integers(1, 8), w=st.integers(1, 8), k=st.sampled_from([1, 3]), pad=st.integers(0, 1),
       stride=st.integers(1, 2), shift=st.integers(0, 12), seed=st.integers(0, 9))
def test_grouped_random_shapes_and_configs(cfg, n, cpg, opg, groups, h, w, k, pad, stride, shift, seed):
    if h + 2 * pad < k or w + 2 * pad < k or cpg * opg * groups > 256:
        return
    spec = Conv2dSpec(n, cpg * groups, h, w, opg * groups, k, k, (pad,) * 4, (stride, stride), "g")
    _check(cfg, spec, groups, Requant(shift, -127, 127), seed, bias=seed % 2 == 0)
