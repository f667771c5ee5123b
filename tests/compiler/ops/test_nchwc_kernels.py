"""CPU kernels on the blocked layout N C' H W c (what the cpu target keeps between convs): max and
average pooling (padding, ceil mode, count_include_pad, lanes below a vector), a channel concat,
and a blocked conv whose epilogue (bias, residual add, ReLU) is written in the blocked layout; each
against the graph IR's reference."""
import numpy as np
import pytest

from compiler import ops, te
from compiler.build import build
from compiler.graph.ops import get_op
from compiler.ops import cpu, nn
from compiler.ops.registry import normalize_attrs

RNG = np.random.default_rng(11)

POOLS = [
    ("max_pool2d", dict(kernel=(3, 3), strides=(2, 2), ceil_mode=1)),
    ("max_pool2d", dict(kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1))),
    ("avg_pool2d", dict(kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), count_include_pad=0)),
    ("avg_pool2d", dict(kernel=(3, 3), strides=(2, 2), pads=(0, 1, 1, 0), ceil_mode=1, count_include_pad=1)),
    ("avg_pool2d", dict(kernel=(2, 2), strides=(2, 2))),
]


@pytest.mark.parametrize("lanes", [4, 16])
@pytest.mark.parametrize("op,attrs", POOLS)
def test_blocked_pools_match_the_reference(op, attrs, lanes):
    x = RNG.standard_normal((2, 3, 11, 9, lanes)).astype(np.float32)
    f = ops.compile_op(op, [x.shape], attrs)
    assert f.impl.name.endswith(".nchwc")
    want = get_op(op).reference(normalize_attrs(op, attrs), x)
    np.testing.assert_allclose(f(x), want, rtol=1e-6, atol=1e-6)


def test_nchw_pools_keep_their_kernels():
    f = ops.compile_op("max_pool2d", [(1, 8, 9, 9)], dict(kernel=(2, 2), strides=(2, 2)))
    assert not f.impl.name.endswith(".nchwc")


def test_blocked_concat_copies_whole_blocks():
    xs = [RNG.standard_normal((2, k, 5, 7, 16)).astype(np.float32) for k in (1, 3, 2)]
    f = ops.compile_op("concat", [x.shape for x in xs], {"axis": 1})
    np.testing.assert_array_equal(f(*xs), np.concatenate(xs, axis=1))


def test_blocked_conv_writes_its_epilogue_blocked():
    """conv2d_NCHWc + bias + residual add + ReLU in one kernel, output blocked."""
    x = RNG.standard_normal((2, 2, 9, 10, 8)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 3, 3, 8, 16)).astype(np.float32) * 0.1
    b = RNG.standard_normal((1, 3, 1, 1, 16)).astype(np.float32)
    r = RNG.standard_normal((2, 3, 9, 10, 16)).astype(np.float32)
    X, W, B, R = (te.placeholder(a.shape, "float32", n) for a, n in ((x, "x"), (w, "w"), (b, "b"), (r, "r")))
    conv = nn.conv2d_NCHWc(X, W, (1, 1), (1, 1, 1, 1))
    y = te.compute(conv.shape, lambda *i: te.max(conv[i] + B[0, i[1], 0, 0, i[4]] + R[i], te.const(0.0, "float32")),
                   name="epilogue", tag="elemwise")
    s = cpu.schedule_conv2d_NCHWc([y])
    conv_stage = next(st for st in s.stages if not st.is_placeholder and st.op.tag == "conv2d_NCHWc")
    assert conv_stage.attach_type != "root"   # computed at the output tile, not a whole tensor first
    mod = build(s, [X, W, B, R, y], target="llvm", name="blocked_epilogue")
    out = np.zeros(r.shape, np.float32)
    mod(x, w, b, r, out)
    a = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}
    want = np.maximum(get_op("conv2d_NCHWc").reference(a, x, w) + b + r, 0)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


DEPTHWISE = [
    dict(strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), k=3),
    dict(strides=(2, 2), pads=(0, 1, 1, 0), dilations=(1, 1), k=3),   # asymmetric, as TF "SAME" exports
    dict(strides=(2, 1), pads=(2, 2, 2, 2), dilations=(1, 1), k=5),
    dict(strides=(1, 1), pads=(2, 2, 2, 2), dilations=(2, 2), k=3),
    dict(strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), k=3),
]


def _dw_case(lanes, k, strides, pads, dilations, shape=(2, 3, 11, 9)):
    n, cb, h, w_ = shape
    x = RNG.standard_normal((n, cb, h, w_, lanes)).astype(np.float32)
    w = RNG.standard_normal((cb, k, k, lanes)).astype(np.float32)
    return x, w, {"strides": strides, "pads": pads, "dilations": dilations}


@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("case", DEPTHWISE)
def test_blocked_depthwise_matches_a_grouped_conv(lanes, case):
    """depthwise_conv2d_NCHWc alone (its accumulator tile a local stage) against conv2d with
    groups == channels on the unblocked tensors."""
    x, w, a = _dw_case(lanes, **case)
    f = ops.compile_op("depthwise_conv2d_NCHWc", [x.shape, w.shape], a)
    assert f.impl.name == "depthwise_NCHWc.x86"
    got = f(x, w)
    want = get_op("depthwise_conv2d_NCHWc").reference(a, x, w)
    cb, kh, kw, c = w.shape
    xn = get_op("layout_transform").reference({"src_layout": f"NCHW{c}c", "dst_layout": "NCHW"}, x)
    grouped = get_op("conv2d").reference({**a, "groups": cb * c}, xn, w.transpose(0, 3, 1, 2).reshape(cb * c, 1, kh, kw))
    np.testing.assert_allclose(get_op("layout_transform").reference({"src_layout": f"NCHW{c}c", "dst_layout": "NCHW"},
                                                                    want), grouped, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", DEPTHWISE[:2])
@pytest.mark.parametrize("unpack", [False, True])
def test_blocked_depthwise_writes_its_epilogue_blocked_or_nchw(case, unpack):
    """depthwise + bias + ReLU6 in one kernel, computed at the output tile, padding read through a
    guard (no padded copy); the output blocked, or NCHW straight from the tile."""
    x, w, a = _dw_case(8, **case)
    b = RNG.standard_normal((1, 3, 1, 1, 8)).astype(np.float32)
    X, W, B = (te.placeholder(v.shape, "float32", nm) for v, nm in ((x, "x"), (w, "w"), (b, "b")))
    conv = nn.depthwise_conv2d_NCHWc(X, W, a["strides"], a["pads"], a["dilations"])
    y = te.compute(conv.shape, lambda *i: te.min(te.max(conv[i] + B[0, i[1], 0, 0, i[4]], te.const(0.0, "float32")),
                                                 te.const(6.0, "float32")), name="epilogue", tag="elemwise")
    if unpack:
        y = nn.unpack_nchwc(y)
    s = cpu.schedule_depthwise_NCHWc([y])
    stages = [st for st in s.stages if not st.is_placeholder and st.attach_type != "inline"]
    assert not any("pad" in st.op.tag for st in stages)
    assert next(st for st in stages if st.op.tag == "depthwise_NCHWc").attach_type != "root"
    mod = build(s, [X, W, B, y], target="llvm", name="blocked_dw_epilogue")
    out = np.zeros([int(d) for d in y.shape], np.float32)
    mod(x, w, b, out)
    want = np.clip(get_op("depthwise_conv2d_NCHWc").reference(a, x, w) + b, 0, 6)
    if unpack:
        want = get_op("layout_transform").reference({"src_layout": "NCHW8c", "dst_layout": "NCHW"}, want)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lanes", [4, 6, 16, 32])
def test_mean_over_blocked_planes_keeps_the_lanes(lanes):
    x = RNG.standard_normal((2, 3, 7, 5, lanes)).astype(np.float32)
    f = ops.compile_op("reduce_mean", [x.shape], {"axes": (2, 3), "keepdims": 1})
    np.testing.assert_allclose(f(x), x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
