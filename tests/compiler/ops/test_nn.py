"""conv2d (NCHW direct and blocked, groups, depthwise, dilation), dense, matmul, pooling,
softmax and norms against numpy (float64) and onnxruntime, on random shapes."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import ops
from compiler.ops.nn import pack_kernel_np
from tests.compiler.ops.oracle import close, conv2d_ref, run_onnx

SETTINGS = settings(max_examples=6, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def rnd(rng, shape, dtype="float32"):
    if dtype == "int8":
        return rng.integers(-127, 128, shape, dtype=np.int8)
    if dtype == "int32":
        return rng.integers(-1000, 1000, shape, dtype=np.int32)
    return rng.standard_normal(shape).astype(dtype)


@st.composite
def conv_cases(draw, depthwise=False):
    groups = 1
    c = draw(st.sampled_from([3, 4, 8, 16]))
    if depthwise:
        groups, o = c, c
    else:
        groups = draw(st.sampled_from([1, 1, 2])) if c % 2 == 0 else 1
        o = groups * draw(st.sampled_from([4, 8, 16, 32]))
    k = draw(st.sampled_from([1, 3, 5]))
    dil = draw(st.sampled_from([1, 1, 2]))
    pads = tuple(draw(st.integers(0, k // 2 + 1)) for _ in range(4))
    stride = draw(st.sampled_from([(1, 1), (2, 2), (1, 2)]))
    h = draw(st.integers((k - 1) * dil + 1, 12))
    w = draw(st.integers((k - 1) * dil + 1, 12))
    n = draw(st.sampled_from([1, 2]))
    return dict(x=(n, c, h, w), w=(o, c // groups, k, k),
                attrs={"strides": stride, "pads": pads, "dilations": (dil, dil), "groups": groups})


@SETTINGS
@given(conv_cases(), st.booleans())
def test_conv2d_fp32_matches_numpy_and_onnxruntime(case, const_weight):
    rng = np.random.default_rng(0)
    x, w = rnd(rng, case["x"]), rnd(rng, case["w"])
    a = case["attrs"]
    f = ops.compile_op("conv2d", [x.shape, w.shape], a, consts={1: w} if const_weight else None)
    y = f(x) if const_weight else f(x, w)
    ref = conv2d_ref(x, w, a["strides"], a["pads"], a["dilations"], a["groups"])
    close(y, ref)
    ort_y = run_onnx("Conv", [x, w], {"strides": list(a["strides"]), "pads": [a["pads"][k] for k in (0, 1, 2, 3)],
                                      "dilations": list(a["dilations"]), "group": a["groups"]}, consts=(1,))
    close(y, ort_y)


@SETTINGS
@given(conv_cases(depthwise=True))
def test_conv2d_depthwise_uses_depthwise_schedule(case):
    rng = np.random.default_rng(1)
    x, w = rnd(rng, case["x"]), rnd(rng, case["w"])
    a = case["attrs"]
    f = ops.compile_op("conv2d", [x.shape, w.shape], a)
    want = "conv2d_nchw.depthwise" if a["dilations"] == (1, 1) else "conv2d_nchw.direct"
    assert f.impl.name == want or a["groups"] == 1
    close(f(x, w), conv2d_ref(x, w, a["strides"], a["pads"], a["dilations"], a["groups"]))


@pytest.mark.parametrize("impl", ["conv2d_nchw.nchwc", "conv2d_nchw.direct"])
def test_conv2d_each_implementation_with_bias(impl):
    rng = np.random.default_rng(2)
    x, w, b = rnd(rng, (1, 16, 9, 11)), rnd(rng, (32, 16, 3, 3)), rnd(rng, (32,))
    a = {"strides": (2, 1), "pads": (1, 0, 1, 2)}
    f = ops.compile_op("conv2d", [x.shape, w.shape, b.shape], a, impl=impl)
    assert f.impl.name == impl
    ref = conv2d_ref(x, w, a["strides"], a["pads"], (1, 1), 1) + b.reshape(1, -1, 1, 1)
    close(f(x, w, b), ref)


def test_conv2d_NCHWc_blocked_layout():
    rng = np.random.default_rng(3)
    x, w = rnd(rng, (1, 16, 8, 8)), rnd(rng, (32, 16, 3, 3))
    xp = x.reshape(1, 2, 8, 8, 8, 8).transpose(0, 1, 3, 4, 2, 5).reshape(1, 2, 8, 8, 8).copy() \
        if False else x.reshape(1, 2, 8, 8, 8).transpose(0, 1, 3, 4, 2).copy()
    wp = pack_kernel_np(w, 8, 16)
    f = ops.compile_op("conv2d_NCHWc", [xp.shape, wp.shape], {"pads": (1, 1, 1, 1)})
    y = f(xp, wp)                                     # (1, 2, 8, 8, 16)
    y = y.transpose(0, 1, 4, 2, 3).reshape(1, 32, 8, 8)
    close(y, conv2d_ref(x, w, (1, 1), (1, 1, 1, 1), (1, 1), 1))


@SETTINGS
@given(st.integers(1, 5), st.integers(1, 40), st.integers(1, 70), st.booleans(), st.booleans())
def test_dense_matches_numpy_and_onnxruntime(m, k, n, bias, const_weight):
    rng = np.random.default_rng(4)
    x, w, b = rnd(rng, (m, k)), rnd(rng, (n, k)), rnd(rng, (n,))
    ins = [x, w, b] if bias else [x, w]
    f = ops.compile_op("dense", [a.shape for a in ins], consts={1: w} if const_weight else None)
    y = f(*[a for i, a in enumerate(ins) if not (const_weight and i == 1)])
    ref = x.astype(np.float64) @ w.astype(np.float64).T + (b if bias else 0)
    close(y, ref)
    close(y, run_onnx("Gemm", ins, {"transB": 1}))


@SETTINGS
@given(st.sampled_from([(), (3,), (1,)]), st.integers(1, 9), st.integers(1, 20), st.integers(1, 40))
def test_matmul_and_batched_match_numpy(batch, m, k, n):
    rng = np.random.default_rng(5)
    a = rnd(rng, (*batch, m, k))
    b = rnd(rng, ((3,) if batch == (1,) else batch) + (k, n))
    if len(a.shape) != len(b.shape):
        return
    f = ops.compile_op("matmul", [a.shape, b.shape])
    y = f(a, b)
    close(y, np.matmul(a.astype(np.float64), b.astype(np.float64)))
    close(y, run_onnx("MatMul", [a, b]))


@SETTINGS
@given(st.sampled_from(["max", "avg"]), st.integers(1, 3), st.integers(1, 3), st.integers(1, 2),
       st.integers(0, 1), st.integers(0, 1), st.integers(3, 11))
def test_pool2d_matches_onnxruntime(kind, kh, kw, s, pad, ceil_mode, size):
    rng = np.random.default_rng(6)
    x = rnd(rng, (1, 3, size, size + 1))
    pads = (pad, pad, pad, pad) if pad < kh and pad < kw else (0, 0, 0, 0)
    attrs = {"kernel": (kh, kw), "strides": (s, s), "pads": pads, "ceil_mode": ceil_mode}
    onnx_attrs = {"kernel_shape": [kh, kw], "strides": [s, s], "pads": list(pads), "ceil_mode": ceil_mode}
    if kind == "avg":
        cip = int(rng.integers(0, 2))
        attrs["count_include_pad"] = cip
        onnx_attrs["count_include_pad"] = cip
    f = ops.compile_op(f"{kind}_pool2d", [x.shape], attrs)
    close(f(x), run_onnx("MaxPool" if kind == "max" else "AveragePool", [x], onnx_attrs, opset=19))


def test_global_pools_match_onnxruntime():
    rng = np.random.default_rng(7)
    x = rnd(rng, (2, 5, 7, 6))
    close(ops.compile_op("global_avg_pool", [x.shape])(x), run_onnx("GlobalAveragePool", [x]))
    close(ops.compile_op("global_max_pool", [x.shape])(x), run_onnx("GlobalMaxPool", [x]))


def test_max_pool_int8_is_exact():
    rng = np.random.default_rng(8)
    x = rnd(rng, (1, 4, 9, 9), "int8")
    y = ops.compile_op("max_pool2d", [x.shape], {"kernel": (3, 3), "strides": (2, 2)}, "int8")(x)
    ref = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(-1, -2))
    np.testing.assert_array_equal(y, ref)


@SETTINGS
@given(st.lists(st.integers(1, 9), min_size=1, max_size=3), st.data())
def test_softmax_matches_onnxruntime(shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = rnd(np.random.default_rng(9), shape) * 3
    y = ops.compile_op("softmax", [x.shape], {"axis": axis})(x)
    z = x.astype(np.float64)
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    close(y, e / e.sum(axis=axis, keepdims=True))
    close(y, run_onnx("Softmax", [x], {"axis": axis}, opset=13))


@SETTINGS
@given(st.lists(st.integers(1, 9), min_size=1, max_size=3), st.data(), st.booleans())
def test_layer_norm_matches_onnxruntime(shape, data, bias):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(10)
    x = rnd(rng, shape)
    inner = tuple(shape[axis % len(shape):])
    s, b = rnd(rng, inner), rnd(rng, inner)
    ins = [x, s, b] if bias else [x, s]
    y = ops.compile_op("layer_norm", [a.shape for a in ins], {"axis": axis, "epsilon": 1e-5})(*ins)
    close(y, run_onnx("LayerNormalization", ins, {"axis": axis, "epsilon": 1e-5}), rtol=1e-4)
    axes = tuple(range(axis % len(shape), len(shape)))
    z = x.astype(np.float64)
    m = z.mean(axis=axes, keepdims=True)
    v = ((z - m) ** 2).mean(axis=axes, keepdims=True)
    close(y, (z - m) / np.sqrt(v + 1e-5) * s + (b if bias else 0), rtol=1e-4)


def test_batch_norm_matches_onnxruntime():
    rng = np.random.default_rng(11)
    x = rnd(rng, (2, 6, 5, 4))
    s, b, m = rnd(rng, (6,)), rnd(rng, (6,)), rnd(rng, (6,))
    v = np.abs(rnd(rng, (6,))) + 0.1
    y = ops.compile_op("batch_norm", [x.shape, (6,), (6,), (6,), (6,)], {"epsilon": 1e-3})(x, s, b, m, v)
    close(y, run_onnx("BatchNormalization", [x, s, b, m, v], {"epsilon": 1e-3}, opset=15))


@pytest.mark.parametrize("impl", ["conv2d_nchw.pointwise", "conv2d_nchw.nchwc"])
def test_conv2d_1x1_strided_subsamples(impl):
    rng = np.random.default_rng(12)
    x, w = rnd(rng, (1, 16, 9, 8)), rnd(rng, (32, 16, 1, 1))
    f = ops.compile_op("conv2d", [x.shape, w.shape], {"strides": (2, 3)}, consts={1: w}, impl=impl)
    assert f.impl.name == impl and f.out_shape == (1, 32, 5, 3)
    close(f(x), conv2d_ref(x, w, (2, 3), (0, 0, 0, 0), (1, 1), 1))
