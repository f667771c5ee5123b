"""Row kernels (softmax and layer norm over the last axis, their max/sum/mean/variance as
lane-partial vector reductions) and matmul tiles with tails, against float64 numpy, over row
lengths the vector width does not divide, primes and rows shorter than one vector. A softmax of
197-long rows ran 11x slower than onnxruntime as scalar reductions; a 196-wide matmul 20x slower
on a 28-lane tile."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler import ops, te
from compiler.build import build
from compiler.ops import cpu, nn
from compiler.ops import transform as tf
from tests.compiler.ops.oracle import close, conv2d_ref

shapes = st.tuples(st.integers(1, 3), st.integers(1, 5), st.sampled_from([1, 2, 3, 5, 15, 16, 17, 31, 33, 64, 197]))


def softmax_ref(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def layer_norm_ref(x, s, b, eps):
    x = x.astype(np.float64)
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * s + b


@settings(max_examples=25, deadline=None)
@given(shape=shapes, scale=st.sampled_from([0.1, 3.0, 80.0]), seed=st.integers(0, 99))
def test_softmax_rows_matches_float64(shape, scale, seed):
    x = (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
    f = ops.compile_op("softmax", [shape], {"axis": -1})
    assert f.impl.name == "softmax.rows"
    y = f(x)
    close(y, softmax_ref(x))
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-5)


def test_softmax_rows_keeps_infinities_and_huge_logits():
    """-inf logits get probability 0; logits of 1e30 do not overflow (the max is subtracted)."""
    x = np.array([[0.0, -np.inf, 1.0, 2.0] * 5, [1e30, 1e30, -1e30, 0.0] * 5], np.float32)
    y = ops.compile_op("softmax", [x.shape], {"axis": 1})(x)
    close(y, softmax_ref(x))
    assert y[0, 1] == 0.0


def test_softmax_over_a_middle_axis_keeps_the_generic_kernel():
    x = np.random.default_rng(1).standard_normal((2, 7, 5)).astype(np.float32)
    f = ops.compile_op("softmax", [x.shape], {"axis": 1})
    assert f.impl.name == "softmax.generic"
    e = np.exp(x - x.max(1, keepdims=True))
    close(f(x), e / e.sum(1, keepdims=True))


@settings(max_examples=25, deadline=None)
@given(shape=shapes, shift=st.sampled_from([0.0, 100.0]), bias=st.booleans(), seed=st.integers(0, 99))
def test_layer_norm_rows_matches_float64(shape, shift, bias, seed):
    """A large common offset (shift) is where a one-pass variance would lose its digits."""
    rng = np.random.default_rng(seed)
    n = shape[-1]
    x = (rng.standard_normal(shape) + shift).astype(np.float32)
    s = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    ins = [shape, (n,)] + ([(n,)] if bias else [])
    f = ops.compile_op("layer_norm", ins, {"axis": -1, "epsilon": 1e-5})
    assert f.impl.name == "layer_norm.rows"
    y = f(x, s, b) if bias else f(x, s)
    want = layer_norm_ref(x, s, b if bias else 0.0, 1e-5)
    # float32's own limit: the mean of values near `shift` is off by a few ulp of shift, and that
    # error is divided by the row's deviation (tiny for a short row of near-equal values)
    x64 = x.astype(np.float64)
    std = np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    bound = 8 * 2.0 ** -23 * (abs(shift) + 4) / std * np.abs(s) + 1e-5 * (1 + np.abs(want))
    assert np.all(np.abs(y - want) <= bound), float(np.max(np.abs(y - want) / bound))


@pytest.mark.parametrize("shape, axis", [((2, 3, 7, 20), 2), ((1, 4, 5, 16), 2), ((2, 6, 33), 1), ((3, 2, 2, 3), 1)])
def test_layer_norm_rows_over_trailing_planes(shape, axis):
    """InstanceNormalization imports as layer_norm over (H, W): the same row kernel, lanes along W."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(shape) * 2 + 3).astype(np.float32)
    inner = shape[axis:]
    s = rng.standard_normal(inner).astype(np.float32)
    f = ops.compile_op("layer_norm", [shape, inner], {"axis": axis, "epsilon": 1e-5})
    assert f.impl.name == "layer_norm.rows"
    x64 = x.astype(np.float64)
    red = tuple(range(axis, len(shape)))
    m = x64.mean(red, keepdims=True)
    v = ((x64 - m) ** 2).mean(red, keepdims=True)
    close(f(x, s), (x64 - m) / np.sqrt(v + 1e-5) * s, rtol=1e-4)


def test_row_kernels_vectorize_along_the_row():
    text = ops.compile_op("softmax", [(4, 197)], {"axis": -1}).module.get_source("tir")
    assert "ramp(" in text and "parallel" not in text    # 788 elements: below the thread pool's size


@pytest.mark.parametrize("n, want, unit, expect", [
    (196, 32, 16, 32),   # no multiple of 16 divides 196: a 32 tile with a 4-wide tail, not 28 lanes
    (197, 32, 16, 32),   # a prime: a tail, not a scalar loop
    (49, 32, 16, 16),    # 32 would leave a 17-lane tail (Swin's 7x7 windows: 7x slower)
    (64, 32, 16, 32), (48, 32, 16, 16), (8, 32, 16, 8), (24, 32, 16, 16),
    (7, 4, 1, 4), (12, 6, 1, 6), (100, 6, 1, 5), (3, 4, 1, 3),
])
def test_tile_extent_prefers_whole_vectors(n, want, unit, expect):
    assert cpu.tile_extent(n, want, unit) == expect


@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 3), m=st.sampled_from([1, 3, 7, 13, 196]), k=st.sampled_from([1, 5, 64]),
       n=st.sampled_from([1, 5, 17, 28, 49, 196, 197]), seed=st.integers(0, 9))
def test_batch_matmul_tails_match_float64(b, m, k, n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, m, k)).astype(np.float32)
    y = rng.standard_normal((b, k, n)).astype(np.float32)
    f = ops.compile_op("matmul", [x.shape, y.shape])
    close(f(x, y), x.astype(np.float64) @ y.astype(np.float64))


def test_matmul_of_a_transposed_operand_copies_it_once():
    """K^T fused into Q.K^T: the transpose is kept as its own loop nest (one transposing copy),
    not inlined into the tiles, where each vector of B was a strided gather."""
    q = te.placeholder((6, 49, 32), "float32", name="q")
    k = te.placeholder((6, 49, 32), "float32", name="k")
    out = nn.matmul(q, tf.transpose(k, (0, 2, 1)))
    s = cpu.schedule_matmul([out])
    assert [st.op.name for st in s.stages if not st.is_placeholder and st.attach_type != "inline"] == \
        ["transpose", "batch_matmul.local", "batch_matmul"]
    mod = build(s, [q, k, out])
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 6, 49, 32)).astype(np.float32)
    got = np.empty((6, 49, 49), np.float32)
    mod(a, b, got)
    close(got, a.astype(np.float64) @ b.astype(np.float64).transpose(0, 2, 1))


@settings(max_examples=20, deadline=None)
@given(m=st.sampled_from([1, 3, 7, 13, 197, 200]), k=st.sampled_from([3, 16, 96]),
       n=st.sampled_from([5, 16, 32, 96, 100]), bias=st.booleans(), seed=st.integers(0, 9))
def test_dense_row_tails_match_float64(m, k, n, bias, seed):
    """Row tiles of 8 with a peeled tail (a prime M ran 1-row tiles, 2.6x slower than onnxruntime)
    and 32-wide output blocks where they divide N."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    shapes = [x.shape, w.shape] + ([b.shape] if bias else [])
    f = ops.compile_op("dense", shapes, consts={1: w})
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0.0)
    close(f(x, b) if bias else f(x), want)


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 6), min_size=1, max_size=3), keep=st.lists(st.integers(1, 20), max_size=2),
       seed=st.integers(0, 99))
def test_reshape_keeping_trailing_axes_matches_numpy(lead, keep, seed):
    """A reshape reads the trailing axes both shapes share as they are: only the leading ones
    go through a flat index (so the vectorized last axis loads whole vectors)."""
    rng = np.random.default_rng(seed)
    src = tuple(lead) + tuple(keep)
    flat = int(np.prod(lead))
    dst = tuple(rng.permutation([d for d in lead])) if len(lead) > 1 and seed % 2 else (flat,)
    dst = dst + tuple(keep)
    x = rng.standard_normal(src).astype(np.float32)
    f = ops.compile_op("reshape", [src], {"shape": dst})
    np.testing.assert_array_equal(f(x), x.reshape(dst))


def test_reshape_around_a_row_loads_whole_vectors():
    text = ops.compile_op("reshape", [(3136, 384)], {"shape": (1, 56, 56, 384)}).module.get_source("tir")
    assert "ramp(" in text and "// broadcast(" not in text and "% broadcast(" not in text


@pytest.mark.parametrize("width, stride, groups", [(17, 1, 1), (23, 2, 1), (47, 1, 1), (17, 1, 16)])
def test_conv_pixel_tiles_with_a_tail_match_float64(width, stride, groups):
    """Output widths with no divisor near the 14-pixel register tile (17, 799 = 17 x 47) took
    1-pixel tiles: a 1-D encoder's convs ran at half of onnxruntime's speed. Tiles of 14 with a
    peeled tail (the blocked conv; groups 16 takes the NCHW depthwise kernel)."""
    assert cpu.tile_extent(799, 14, 1) == 14 and cpu.tile_extent(17, 14, 1) == 14
    rng = np.random.default_rng(width)
    x = rng.standard_normal((1, 16, 5, width)).astype(np.float32)
    w = (rng.standard_normal((16, 16 // groups, 3, 3)) * 0.2).astype(np.float32)
    attrs = {"strides": (stride, stride), "pads": (1, 1, 1, 1), "groups": groups}
    f = ops.compile_op("conv2d", [x.shape, w.shape], attrs, consts={1: w})
    close(f(x), conv2d_ref(x, w, (stride, stride), (1, 1, 1, 1), (1, 1), groups))


def test_blocked_depthwise_pixel_tiles_with_a_tail_match_float64():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 1, 5, 17, 16)).astype(np.float32)     # N C' H W c, 17 pixels wide
    w = rng.standard_normal((1, 3, 3, 16)).astype(np.float32)
    f = ops.compile_op("depthwise_conv2d_NCHWc", [x.shape, w.shape],
                       {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)})
    got = f(x, w)
    xn = x.transpose(0, 1, 4, 2, 3).reshape(1, 16, 5, 17)
    wn = w.transpose(0, 3, 1, 2).reshape(16, 1, 3, 3)
    want = conv2d_ref(xn, wn, (1, 1), (1, 1, 1, 1), (1, 1), 16).reshape(1, 1, 16, 5, 17).transpose(0, 1, 3, 4, 2)
    close(got, want)
