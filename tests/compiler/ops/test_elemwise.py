"""Elementwise, broadcasting, data-movement and int8 quantization operators against numpy and
onnxruntime; integer results bit-exact."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import ops, te
from compiler.build import build
from compiler.graph.ops import clip_int8, get_op, shift_floor, shift_right_round, wrap_int32
from compiler.ops import cpu
from compiler.ops import elemwise as ew
from tests.compiler.ops.oracle import close, conv2d_ref, erf, run_onnx

SETTINGS = settings(max_examples=5, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
shapes = st.lists(st.integers(1, 7), min_size=1, max_size=4)

UNARY = {
    "relu": (lambda x: np.maximum(x, 0), "Relu", {}, {}),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), "Sigmoid", {}, {}),
    "tanh": (np.tanh, "Tanh", {}, {}),
    "exp": (np.exp, "Exp", {}, {}),
    "neg": (np.negative, "Neg", {}, {}),
    "erf": (erf, "Erf", {}, {}),
    "gelu": (lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))), "Gelu", {}, {}),
    "leaky_relu": (lambda x: np.where(x >= 0, x, 0.1 * x), "LeakyRelu", {"alpha": 0.1}, {"alpha": 0.1}),
    "clip": (lambda x: np.clip(x, -0.5, 0.7), None, {"min": -0.5, "max": 0.7}, {}),
    "abs": (np.abs, "Abs", {}, {}),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_fp32_matches_numpy_and_onnxruntime(name):
    ref, onnx_op, attrs, onnx_attrs = UNARY[name]
    x = (np.random.default_rng(0).standard_normal((3, 37)) * 3).astype("float32")
    y = ops.compile_op(name, [x.shape], attrs)(x)
    close(y, ref(x.astype(np.float64)))
    if onnx_op:
        close(y, run_onnx(onnx_op, [x], onnx_attrs, opset=20))


def test_sqrt_reciprocal_and_gelu_tanh():
    x = np.random.default_rng(1).uniform(0.1, 5, (4, 16)).astype("float32")
    close(ops.compile_op("sqrt", [x.shape])(x), np.sqrt(x.astype(np.float64)))
    close(ops.compile_op("reciprocal", [x.shape])(x), 1 / x.astype(np.float64))
    close(ops.compile_op("log", [x.shape])(x), np.log(x.astype(np.float64)))
    y = ops.compile_op("gelu", [x.shape], {"approximate": "tanh"})(x)
    close(y, run_onnx("Gelu", [x], {"approximate": "tanh"}, opset=20))


def test_relu_and_clip_int8_exact():
    x = np.random.default_rng(2).integers(-127, 128, (5, 33), dtype=np.int8)
    np.testing.assert_array_equal(ops.compile_op("relu", [x.shape], dtype="int8")(x), np.maximum(x, 0))
    np.testing.assert_array_equal(ops.compile_op("clip", [x.shape], {"min": -5, "max": 9}, "int8")(x),
                                  np.clip(x, -5, 9))


@st.composite
def broadcast_pair(draw):
    out = draw(shapes)
    a = [d if draw(st.booleans()) else 1 for d in out]
    b = [d if draw(st.booleans()) else 1 for d in out]
    b = b[draw(st.integers(0, len(b) - 1)):]
    return tuple(a), tuple(b)


BINARY = {"add": (np.add, "Add"), "sub": (np.subtract, "Sub"), "mul": (np.multiply, "Mul"),
          "div": (np.divide, "Div"), "maximum": (np.maximum, "Max"), "minimum": (np.minimum, "Min")}


@SETTINGS
@given(broadcast_pair(), st.sampled_from(sorted(BINARY)))
def test_broadcast_binary_fp32(pair, name):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(pair[0]).astype("float32"), rng.standard_normal(pair[1]).astype("float32") + 3
    y = ops.compile_op(name, [a.shape, b.shape])(a, b)
    fn, onnx_op = BINARY[name]
    close(y, fn(a.astype(np.float64), b.astype(np.float64)))
    close(y, run_onnx(onnx_op, [a, b], opset=13))


@SETTINGS
@given(broadcast_pair(), st.sampled_from(["add", "sub", "mul", "maximum", "div"]))
def test_broadcast_binary_int32_exact(pair, name):
    rng = np.random.default_rng(4)
    a = rng.integers(-1000, 1000, pair[0], dtype=np.int32)
    b = rng.integers(1, 50, pair[1], dtype=np.int32) * rng.choice([-1, 1], pair[1]).astype(np.int32)
    y = ops.compile_op(name, [a.shape, b.shape], dtype="int32")(a, b)
    ref = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum,
           "div": lambda x, z: (np.trunc(x / z)).astype(np.int32)}[name](a, b)
    np.testing.assert_array_equal(y, ref)


# ---------------------------------------------------------------- data movement

@SETTINGS
@given(shapes, st.data())
def test_transpose_and_reshape(shape, data):
    x = np.random.default_rng(5).standard_normal(shape).astype("float32")
    perm = data.draw(st.permutations(range(len(shape))))
    y = ops.compile_op("transpose", [x.shape], {"perm": tuple(perm)})(x)
    np.testing.assert_array_equal(y, np.transpose(x, perm))
    np.testing.assert_array_equal(y, run_onnx("Transpose", [x], {"perm": list(perm)}))
    new = (int(np.prod(shape)),) if len(shape) > 1 else (1, shape[0])
    np.testing.assert_array_equal(ops.compile_op("reshape", [y.shape], {"shape": new})(y), y.reshape(new))


@SETTINGS
@given(shapes, st.integers(1, 3), st.data())
def test_concat(shape, n, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    rng = np.random.default_rng(6)
    xs = []
    for _ in range(n):
        s = list(shape)
        s[axis] = data.draw(st.integers(1, 4))
        xs.append(rng.standard_normal(s).astype("float32"))
    y = ops.compile_op("concat", [x.shape for x in xs], {"axis": axis})(*xs)
    np.testing.assert_array_equal(y, np.concatenate(xs, axis))
    np.testing.assert_array_equal(y, run_onnx("Concat", xs, {"axis": axis}))


@SETTINGS
@given(shapes, st.sampled_from(["constant", "edge", "reflect"]), st.data())
def test_pad_modes(shape, mode, data):
    x = np.random.default_rng(7).standard_normal(shape).astype("float32")
    r = len(shape)
    cap = [max(0, d - 1) if mode == "reflect" else 3 for d in shape]
    pads = [data.draw(st.integers(0, cap[k % r])) for k in range(2 * r)]
    y = ops.compile_op("pad", [x.shape], {"pads": tuple(pads), "mode": mode, "value": 1.5})(x)
    widths = [(pads[k], pads[k + r]) for k in range(r)]
    ref = np.pad(x, widths, constant_values=1.5) if mode == "constant" else np.pad(x, widths, mode=mode)
    np.testing.assert_array_equal(y, ref)
    inputs = [x, np.asarray(pads, np.int64)] + ([np.asarray(1.5, np.float32)] if mode == "constant" else [])
    np.testing.assert_array_equal(y, run_onnx("Pad", inputs, {"mode": mode}, opset=13, consts=(1, 2)))


@SETTINGS
@given(shapes, st.data())
def test_strided_slice(shape, data):
    x = np.random.default_rng(8).standard_normal(shape).astype("float32")
    ax = data.draw(st.integers(0, len(shape) - 1))
    step = data.draw(st.sampled_from([1, 2, -1]))
    n = shape[ax]
    if step > 0:
        s = data.draw(st.integers(0, n - 1))
        e = data.draw(st.integers(s + 1, n))
    else:
        s = data.draw(st.integers(0, n - 1))
        e = data.draw(st.integers(-1, s - 1))
    y = ops.compile_op("slice", [x.shape], {"starts": (s,), "ends": (e,), "axes": (ax,), "steps": (step,)})(x)
    idx = [slice(None)] * len(shape)
    idx[ax] = slice(s, None if e < 0 else e, step)
    np.testing.assert_array_equal(y, x[tuple(idx)])


def test_layout_transform_round_trip():
    x = np.random.default_rng(9).standard_normal((2, 32, 5, 3)).astype("float32")
    p = ops.compile_op("layout_transform", [x.shape], {"src_layout": "NCHW", "dst_layout": "NCHW16c"})(x)
    np.testing.assert_array_equal(p, x.reshape(2, 2, 16, 5, 3).transpose(0, 1, 3, 4, 2))
    u = ops.compile_op("layout_transform", [p.shape], {"src_layout": "NCHW16c", "dst_layout": "NCHW"})(p)
    np.testing.assert_array_equal(u, x)


# ---------------------------------------------------------------- int8 quantized flow (bit-exact)

def test_quantize_rounds_half_to_even_and_clips():
    x = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, 0.49, 100.0, -100.0, 3.25, -2.75]], np.float32)
    y = ops.compile_op("quantize", [x.shape], {"shift": 1})(x)
    np.testing.assert_array_equal(y, clip_int8(np.rint(x.astype(np.float64) * 2)))
    d = ops.compile_op("dequantize", [y.shape], {"shift": 1}, "int8")(y)
    np.testing.assert_array_equal(d, y.astype(np.float32) / 2)


@pytest.mark.parametrize("zp", [-128, -27, 5])
def test_quantize_dequantize_with_a_zero_point_match_the_graph_ops(zp):
    """An asymmetric activation (a QDQ model's): + zero_point, saturated to [-128, 127], and back;
    the CPU kernels against compiler.graph.ops' definitions (ONNX QuantizeLinear/DequantizeLinear)."""
    x = np.array([[0.5, 1.5, -2.5, -4.0, 7.0, 100.0, -100.0, 0.0, 3.25, -2.75]], np.float32)
    a = {"shift": 0, "scale": 0.25, "zero_point": zp}
    y = ops.compile_op("quantize", [x.shape], a)(x)
    np.testing.assert_array_equal(y, np.clip(np.rint(x / np.float32(0.25)) + zp, -128, 127).astype(np.int8))
    np.testing.assert_array_equal(y, get_op("quantize").impl(a, x))
    d = ops.compile_op("dequantize", [y.shape], a, "int8")(y)
    np.testing.assert_array_equal(d, (y.astype(np.float32) - zp) * np.float32(0.25))
    np.testing.assert_array_equal(d, get_op("dequantize").impl(a, y))


@pytest.mark.parametrize("s_in,s_out", [(10, 3), (4, 4), (2, 5)])
def test_requantize_int32_exact(s_in, s_out):
    x = np.random.default_rng(10).integers(-(1 << 20), 1 << 20, (3, 41), dtype=np.int32)
    y = ops.compile_op("requantize", [x.shape], {"in_shift": s_in, "out_shift": s_out}, "int32")(x)
    np.testing.assert_array_equal(y, clip_int8(shift_right_round(x, s_in - s_out)))


def test_qadd_exact():
    rng = np.random.default_rng(11)
    a, b = rng.integers(-127, 128, (2, 3, 4), dtype=np.int8), rng.integers(-127, 128, (3, 1), dtype=np.int8)
    y = ops.compile_op("qadd", [a.shape, b.shape], {"a_shift": 5, "b_shift": 3, "out_shift": 4}, "int8")(a, b)
    s = (a.astype(np.int64) << 0) + (b.astype(np.int64) << 2)
    np.testing.assert_array_equal(y, clip_int8(shift_right_round(wrap_int32(s), 1)))


@settings(max_examples=4, deadline=None, derandomize=True)
@given(st.sampled_from([1, 2]), st.sampled_from([4, 16]), st.sampled_from([8, 32]), st.sampled_from([1, 3]),
       st.sampled_from([1, 2]), st.booleans(), st.sampled_from([0, -128, 7]))
def test_qconv2d_int8_exact(groups, c, o, k, stride, const_weight, out_zp):
    rng = np.random.default_rng(12)
    x = rng.integers(-127, 128, (1, c, 7, 6), dtype=np.int8)
    w = rng.integers(-127, 128, (o, c // groups, k, k), dtype=np.int8)
    b = rng.integers(-5000, 5000, (o,), dtype=np.int32)
    a = {"strides": (stride, stride), "pads": (k // 2,) * 4, "groups": groups, "in_shift": 4, "w_shift": 6,
         "out_shift": 3, "out_zp": out_zp}
    f = ops.compile_op("qconv2d", [x.shape, w.shape, b.shape], a, ["int8", "int8", "int32"],
                       consts={1: w} if const_weight else None)
    y = f(x, b) if const_weight else f(x, w, b)
    acc = wrap_int32(conv2d_ref(x, w, a["strides"], a["pads"], (1, 1), groups) + b.reshape(1, -1, 1, 1))
    np.testing.assert_array_equal(y, clip_int8(shift_floor(acc, 4 + 6 - 3) + out_zp, out_zp))


@pytest.mark.parametrize("k, stride, size", [(3, 1, (9, 7)), (3, 2, (12, 11)), (5, 2, (10, 10)), (5, 1, (6, 13)),
                                             (3, 4, (9, 9))])
@pytest.mark.parametrize("requant", ["shift", "mul", "per_channel"])
def test_int8_depthwise_in_flat_phase_planes_is_exact(k, stride, size, requant):
    """An int8 depthwise conv (the CPU's side of the accelerator target: MobileNet's and
    EfficientNet's 3x3 and 5x5, stride 1 and 2) takes the flat phase-plane kernel, its int32
    accumulation equal to the graph reference bit for bit under each requantization."""
    rng = np.random.default_rng(k * 10 + stride)
    c = 24
    x = rng.integers(-127, 128, (1, c, *size), dtype=np.int8)
    w = rng.integers(-127, 128, (c, 1, k, k), dtype=np.int8)
    b = rng.integers(-20000, 20000, (c,), dtype=np.int32)
    muls = rng.integers(1 << 20, 1 << 24, (c,)).astype(np.int64)
    attrs = {"strides": (stride, stride), "pads": (k // 2,) * 4, "dilations": (1, 1), "groups": c, "layout": "NCHW",
             **{"shift": {"in_shift": 5, "w_shift": 4, "out_shift": 2},
                "mul": {"in_shift": 29, "w_shift": 0, "out_shift": 0, "mul": 9876543},
                "per_channel": {"in_shift": 31, "w_shift": 0, "out_shift": 0, "mul": 1}}[requant]}
    extra = [muls] if requant == "per_channel" else []
    ref = get_op("qconv2d").impl(attrs, x, w, b, *extra)
    f = ops.compile_op("qconv2d", [x.shape, w.shape, b.shape] + [m.shape for m in extra], attrs,
                       ["int8", "int8", "int32"] + ["int64"] * len(extra), consts={1: w})
    assert f.impl.name == "qconv2d.depthwise"
    np.testing.assert_array_equal(f(x, b, *extra), ref)
    assert 0 < np.count_nonzero(np.abs(ref) < 127) < ref.size


def test_a_global_pool_as_an_int8_depthwise_conv_keeps_the_direct_kernel():
    """The flat form unrolls its window: a 56x56 one (a global average pool the quantizer made a
    depthwise conv) takes the direct kernel, which compiles in a moment."""
    c, h = 16, 56
    attrs = {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "groups": c, "layout": "NCHW",
             "in_shift": 20, "w_shift": 0, "out_shift": 0, "mul": 1}
    w = np.ones((c, 1, h, h), np.int8)
    f = ops.compile_op("qconv2d", [(1, c, h, h), w.shape, (c,)], attrs, ["int8", "int8", "int32"], consts={1: w})
    assert f.impl.name == "qconv2d.direct"


@pytest.mark.parametrize("m,k,n", [(1, 64, 10), (3, 17, 40)])
def test_qdense_and_int8_dense_exact(m, k, n):
    rng = np.random.default_rng(13)
    x, w = rng.integers(-127, 128, (m, k), dtype=np.int8), rng.integers(-127, 128, (n, k), dtype=np.int8)
    b = rng.integers(-5000, 5000, (n,), dtype=np.int32)
    acc = x.astype(np.int64) @ w.astype(np.int64).T
    y = ops.compile_op("dense", [x.shape, w.shape], dtype="int8")(x, w)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, acc)
    q = ops.compile_op("qdense", [x.shape, w.shape, b.shape], {"in_shift": 3, "w_shift": 7, "out_shift": 2},
                       ["int8", "int8", "int32"], consts={1: w})(x, b)
    np.testing.assert_array_equal(q, clip_int8(shift_floor(wrap_int32(acc + b), 8)))


@pytest.mark.parametrize("op", ["qconv2d", "qdense"])
def test_fixed_point_and_per_channel_requantization_exact(op):
    """mul (one fixed-point multiplier) and a fourth input of per-channel multipliers: the CPU
    kernels equal the graph reference, round_half_up(acc * m * 2^-in_shift) clipped, bit for bit."""
    rng = np.random.default_rng(21)
    if op == "qconv2d":
        x, w = rng.integers(-127, 128, (1, 12, 7, 9), dtype=np.int8), rng.integers(-127, 128, (20, 12, 3, 3), dtype=np.int8)
        base = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "groups": 1, "layout": "NCHW"}
    else:
        x, w = rng.integers(-127, 128, (5, 70), dtype=np.int8), rng.integers(-127, 128, (20, 70), dtype=np.int8)
        base = {"layout": "NC"}
    b = rng.integers(-50000, 50000, (20,), dtype=np.int32)
    muls = rng.integers(1 << 20, 1 << 30, (20,)).astype(np.int64)
    for a, extra in (({"in_shift": 29, "w_shift": 0, "out_shift": 0, "mul": 12345678}, []),
                     ({"in_shift": 33, "w_shift": 0, "out_shift": 0, "mul": 1}, [muls])):
        attrs = {**base, **a}
        ref = get_op(op).impl(attrs, x, w, b, *extra)
        f = ops.compile_op(op, [x.shape, w.shape, b.shape] + [m.shape for m in extra], attrs,
                           ["int8", "int8", "int32"] + ["int64"] * len(extra), consts={1: w})
        got = f(x, b, *extra)
        np.testing.assert_array_equal(got, ref)
        assert 0 < np.count_nonzero(np.abs(ref) < 127) < ref.size   # neither all saturated nor all in range


def test_chained_quantize_steps_stay_bounded_when_fused():
    """Each quantize reads its input about 18 times (round half to even, the clip); inlined through
    a chain of four such steps, as a QDQ model's fused HardSwish - upsample - concat group had them,
    the loop body grew to 13 MB and the build ran for minutes. Past INLINE_NODES a stage keeps
    its own loop nest: the kernel stays small and exact."""
    x = te.placeholder((2, 3, 8, 8), "float32", name="x")
    c = te.placeholder((1,), "float32", name="c")
    y = x
    for shift in (4, 3, 5, 2):
        y = ew.dequantize(ew.quantize(ew.mul(y, c), shift), shift)
    s = cpu.schedule_injective([y])
    assert sum(st.attach_type != "inline" for st in s.stages if not st.is_placeholder) >= 2
    mod = build(s, [x, c, y])
    assert len(mod.get_source("tir")) < 200_000
    a = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32) * 4
    want = a.astype(np.float64)
    for shift in (4, 3, 5, 2):
        want = np.clip(np.rint(want * 1.5 * 2.0 ** shift), -127, 127) * 2.0 ** -shift
    got = np.empty_like(a)
    mod(a, np.float32([1.5]), got)
    np.testing.assert_array_equal(got, want.astype(np.float32))
