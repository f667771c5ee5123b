"""int8 quantization with shift requantization (power-of-two steps where an add or concat ties
tensors, exact steps elsewhere): the shift arithmetic is bit-exact, calibration is reported, QDQ
models' scales are imported (fixed-point multipliers where they are not powers of two);
onnxruntime's own quantizer output is the QDQ oracle."""
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from compiler.frontend import from_onnx, zoo
from compiler.graph import Graph, Node, OpError, QuantizeError, run
from compiler.graph.ops import fixed_multiplier
from compiler.graph.passes import Calibration, calibrate, optimize, pow2_shift, quantize
from compiler.graph.passes.quantize import exact_steps

RNG = np.random.default_rng(0)


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def ort_run(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_quantize_pow2_shift_keeps_absmax_representable():
    assert [pow2_shift(a) for a in (1.0, 127.0, 0.5, 200.0, 0.0, 1.99)] == [6, 0, 7, -1, 0, 5]
    for a in RNG.uniform(1e-3, 1e3, 50):
        k = pow2_shift(a)
        assert a * 2.0 ** k <= 127 < a * 2.0 ** (k + 1)


def _qconv_loops(x, w, b, s, pads):
    """Independent integer reference: loops, Python ints, floor shift (the half is in b)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pads, pads), (pads, pads)))
    out = np.zeros((n, o, h + 2 * pads - kh + 1, wd + 2 * pads - kw + 1), np.int64)
    for oc in range(o):
        for i in range(out.shape[2]):
            for j in range(out.shape[3]):
                acc = int((xp[0, :, i:i + kh, j:j + kw] * w[oc]).sum()) + int(b[oc])
                out[0, oc, i, j] = min(127, max(-127, acc >> s))
    return out.astype(np.int8)


def test_quantize_qconv2d_reference_is_bit_exact():
    x = RNG.integers(-127, 128, (1, 3, 5, 5)).astype(np.int8)
    w = RNG.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8)
    b = RNG.integers(-5000, 5000, 4).astype(np.int32)
    attrs = {"pads": (1, 1, 1, 1), "in_shift": 5, "w_shift": 7, "out_shift": 4}
    xin = Node.input("x", x.shape, "int8")
    q = Node("qconv2d", [xin, Node.const(w), Node.const(b)], attrs, name="q")
    got = run(Graph.from_outputs([xin], [q]), [x])[0]
    np.testing.assert_array_equal(got, _qconv_loops(x, w, b, 5 + 7 - 4, 1))
    assert got.dtype == np.int8 and got.min() >= -127


def test_quantize_qadd_and_quantize_ops_round_and_saturate():
    a = np.array([100, -100, 3, 127], np.int8)
    b = np.array([1, -1, 5, 127], np.int8)
    ai, bi = Node.input("a", (4,), "int8"), Node.input("b", (4,), "int8")
    s = Node("qadd", [ai, bi], {"a_shift": 4, "b_shift": 6, "out_shift": 3})
    got = run(Graph.from_outputs([ai, bi], [s]), [a, b])[0]
    # align to 2^-6: a << 2, then (sum + 4) >> 3
    want = np.clip(((a.astype(int) << 2) + b + 4) >> 3, -127, 127)
    np.testing.assert_array_equal(got, want)
    f = Node.input("f", (4,))
    q = Node("quantize", [f], {"shift": 4})
    np.testing.assert_array_equal(run(Graph.from_outputs([f], [q]), [np.array([100., -100., 0.03125, -0.09375])])[0],
                                  [127, -127, 0, -2])  # round half to even: 0.5 -> 0, -1.5 -> -2


def _conv_relu_graph():
    x = Node.input("x", (1, 4, 6, 6))
    c = Node("conv2d", [x, Node.const((RNG.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32)),
                        Node.const((RNG.standard_normal(8) * 0.1).astype(np.float32))], {"pads": (1, 1, 1, 1)}, name="conv")
    return Graph.from_outputs([x], [Node("relu", [c], name="relu")], ["y"])


def test_quantize_conv_relu_uses_relu_range_folds_rounding_into_bias_and_reports(monkeypatch):
    """Power-of-two steps throughout (EXACT_STEPS off): the shifts are the tensors' own."""
    monkeypatch.setattr(sys.modules[exact_steps.__module__], "EXACT_STEPS", False)
    g = _conv_relu_graph()
    samples = [{"x": RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)} for _ in range(3)]
    cal = calibrate(g, samples)
    assert set(cal.shifts) == {"x", "conv", "relu"} and cal.samples == 3
    table = cal.table()
    assert table.splitlines()[0].split()[:4] == ["tensor", "source", "absmax", "shift"]
    assert "relu" in table and "calibration" in table
    q = quantize(g, cal)
    assert [n.op for n in q.ops] == ["quantize", "qconv2d", "relu", "dequantize"]
    qc = q.find("conv")
    a = qc.attrs
    assert a["in_shift"] == cal.shifts["x"] and a["out_shift"] == cal.shifts["relu"]
    s = a["in_shift"] + a["w_shift"] - a["out_shift"]
    bias_f = g.find("conv").inputs[2].value
    np.testing.assert_array_equal(qc.inputs[2].value, np.rint(bias_f * 2.0 ** (a["in_shift"] + a["w_shift"])) + (1 << (s - 1)))
    layer = q.meta["quantize"]["layers"][0]
    assert layer["name"] == "conv" and layer["shr"] == s
    for f in samples:
        assert cosine(run(q, f)[0], run(g, f)[0]) > 0.995


def test_exact_steps_requantize_by_a_shift_the_weight_step_absorbing_their_ratio():
    """An untied conv -> relu: the input and the ReLU take their exact steps, max |x| / 127; the
    weight step is (out step / in step) 2^-m, so the layer still requantizes by one shift of m."""
    g = _conv_relu_graph()
    samples = [{"x": RNG.standard_normal((1, 4, 6, 6)).astype(np.float32)} for _ in range(3)]
    cal = calibrate(g, samples)
    q = quantize(g, cal)
    layer = q.meta["quantize"]["layers"][0]
    sx, so, sw = layer["in_scale"], layer["out_scale"], layer["w_scale"]
    assert sx == cal.absmax["x"] / 127 and so == cal.absmax["relu"] / 127
    a = q.find("conv").attrs
    assert a.get("mul", 1) == 1 and a["w_shift"] == a["out_shift"] == 0 and layer["shr"] == a["in_shift"]
    assert sx * sw / so == pytest.approx(2.0 ** -a["in_shift"], rel=1e-12)
    w = g.find("conv").inputs[1].value
    assert np.max(np.abs(w)) / 127 <= sw < 2 * np.max(np.abs(w)) / 127   # the finest such step
    assert layer["w_use"] > 0.5
    for f in samples:
        assert cosine(run(q, f)[0], run(g, f)[0]) > 0.999


def test_tensors_an_add_or_concat_ties_keep_power_of_two_steps():
    """The int8 add aligns its operands by shifts: its inputs, its output and what keeps their
    scale (the ReLU before it) stay powers of two; the conv inside the branch does not."""
    x = Node.input("x", (1, 8, 6, 6))
    w1, w2 = ((RNG.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32) for _ in range(2))
    c1 = Node("conv2d", [x, Node.const(w1), Node.const(np.zeros(8, np.float32))], {"pads": (1, 1, 1, 1)}, name="c1")
    r1 = Node("relu", [c1], name="r1")
    c2 = Node("conv2d", [r1, Node.const(w2), Node.const(np.zeros(8, np.float32))], {"pads": (1, 1, 1, 1)}, name="c2")
    add = Node("add", [c2, x], name="add")
    g = Graph.from_outputs([x], [Node("relu", [add], name="out")], ["y"])
    cal = calibrate(g, [{"x": RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)} for _ in range(2)])
    steps = exact_steps(g, cal)
    assert {"r1", "c1"} <= set(steps.scales) and not {"x", "c2", "add", "out"} & set(steps.scales)
    q = quantize(g, cal)
    assert q.find("add").op == "qadd" and "a_mul" not in {k for k, v in q.find("add").attrs.items() if v}


def test_a_conv_int8_cannot_carry_stays_float_and_the_rest_quantizes(caplog):
    """A tiny input range (a squeeze-excitation branch of an untrained net) with an ordinary bias:
    the bias at the input step is beyond int32. That conv is computed in float, with a warning
    naming it; a conv beside it still quantizes (torchvision's MobileNetV3 failed to build)."""
    x = Node.input("x", (1, 4, 6, 6))
    w = Node.const((RNG.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32))
    tiny = Node("conv2d", [x, w, Node.const(np.full(8, 100.0, np.float32))], {"pads": (1, 1, 1, 1)}, name="tiny")
    fine = Node("conv2d", [Node("relu", [tiny], name="r"), Node.const((RNG.standard_normal((8, 8, 1, 1))).astype(np.float32)),
                           Node.const(np.zeros(8, np.float32))], name="fine")
    g = Graph.from_outputs([x], [fine], ["y"])
    samples = [{"x": (RNG.standard_normal((1, 4, 6, 6)) * 1e-12).astype(np.float32)} for _ in range(2)]
    with caplog.at_level("WARNING"):
        q = quantize(g, calibrate(g, samples))
    assert "conv2d 'tiny': bias does not fit int32" in caplog.text and "computed in float" in caplog.text
    ops = [n.op for n in q.ops]
    assert "conv2d" in ops and "qconv2d" in ops
    for f in samples:
        assert cosine(run(q, f)[0], run(g, f)[0]) > 0.99


def test_quantize_missing_scale_names_the_tensor():
    g = _conv_relu_graph()
    with pytest.raises(QuantizeError, match="no scale for tensor 'x' \\(input\\), needed as input of conv2d 'conv'"):
        quantize(g, Calibration())
    with pytest.raises(Exception, match="needs calibration_samples"):
        optimize(g, quantize=True)


def _pow2_qdq_conv_model():
    """x -Q/DQ(2^-5)-> Conv(int8 weights at 2^-7 via DQ) -> Relu -Q/DQ(2^-4)-> y."""
    w = np.clip(np.rint(RNG.standard_normal((16, 16, 3, 3)) * 20), -127, 127).astype(np.int8)
    w[0, 0, 0, 0] = 127  # the weight range fills int8, so the data-derived weight shift is the QDQ one
    inits = [numpy_helper.from_array(np.float32(2 ** -5), "sx"), numpy_helper.from_array(np.int8(0), "zx"),
             numpy_helper.from_array(w, "wq"), numpy_helper.from_array(np.float32(2 ** -7), "sw"),
             numpy_helper.from_array(np.int8(0), "zw"),
             numpy_helper.from_array(np.float32(2 ** -4), "sy"), numpy_helper.from_array(np.int8(0), "zy")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], name="dqw"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["rq"], name="qy"),
             helper.make_node("DequantizeLinear", ["rq", "sy", "zy"], ["y"], name="dqy")]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 6, 6])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_quantize_imports_pow2_qdq_scales_exactly():
    m = _pow2_qdq_conv_model()
    g = optimize(from_onnx(m), quantize=True, accel="default", fuse=False)
    cal = g.meta["quantize"]["calibration"]
    assert cal.shifts["x"] == 5 and cal.shifts["relu"] == 4 and cal.source["x"] == "qdq"
    conv = g.find("conv")
    assert conv.op == "qconv2d" and conv.target == "accel"
    assert (conv.attrs["in_shift"], conv.attrs["w_shift"], conv.attrs["out_shift"]) == (5, 7, 4)
    assert not any(n.op in ("quantize_linear", "dequantize_linear") for n in g.nodes)
    x = (RNG.standard_normal((1, 16, 6, 6)) * 1.5).astype(np.float32)
    ref = ort_run(m, {"x": x})[0]
    got = run(g, {"x": x})[0]
    # same scales; only the rounding of ties and of the requantization may differ by one step
    assert np.abs(got - ref).max() <= 2 ** -4 + 1e-6
    assert cosine(got, ref) > 0.999


class _Reader:
    def __init__(self, feeds):
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


@pytest.mark.parametrize("name,symmetric", [("mlp", True), ("residual_block", False), ("transformer_encoder", True)])
def test_quantize_onnxruntime_qdq_model_imports_close_to_float(tmp_path, name, symmetric):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static  # noqa: PLC0415 - optional dep onnxruntime
    m = zoo.MODELS[name]()
    onnx.save(m, tmp_path / "m.onnx")
    feeds = zoo.sample_inputs(m, 5, seed=2)
    reader = type("Reader", (_Reader, CalibrationDataReader), {})(feeds[:4])
    quantize_static(str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx"), reader, quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=False,
                    extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True})
    qm = onnx.load(tmp_path / "q.onnx")
    g = optimize(from_onnx(qm), quantize=True, accel="default",  # no samples: the QDQ scales are used
                 force_target={"qdense": "accel"})  # small-batch dense is memory-bound: on by force
    assert any(n.target == "accel" and n.op in ("fused", "qdense", "qconv2d") for n in g.nodes)
    assert g.meta["quantize"]["calibration"].source and set(g.meta["quantize"]["calibration"].source.values()) == {"qdq"}
    ref = ort_run(m, feeds[4])[0]
    assert cosine(run(g, feeds[4])[0], ref) >= 0.99


@settings(max_examples=200, deadline=None)
@given(r=st.floats(1e-12, 1e6, allow_nan=False, allow_infinity=False))
def test_fixed_multiplier_is_as_fine_as_24_bits(r):
    mul, k = fixed_multiplier(r, "layer")
    assert 0 <= k <= 63 and 2 <= mul < 1 << 24
    assert (1 << 23) <= mul or k == 63
    assert abs(mul * 2.0 ** -k - r) <= r * 2.0 ** -23


def test_fixed_multiplier_names_the_layer_when_out_of_range():
    for bad in (0.0, -1.0, float("inf"), 2.0 ** 30):
        with pytest.raises(ValueError, match="conv 'c1'"):
            fixed_multiplier(bad, "conv 'c1'")


@pytest.mark.parametrize("muls, attrs, match", [
    (np.array([3, 5], np.int32), {}, "per-channel multipliers must be an int64 vector"),
    (np.array([[3, 5]], np.int64), {}, "per-channel multipliers must be an int64 vector"),
    (np.array([3, 0], np.int64), {}, r"must lie in \[1, 2\^31\), got \[0, 3\]"),
    (np.array([3, 1 << 31], np.int64), {}, r"must lie in \[1, 2\^31\), got \[3, 2147483648\]"),
    (np.array([3, 5], np.int64), {"mul": 7}, "take the shift from in_shift alone"),
    (np.array([3, 5], np.int64), {"w_shift": 2}, "take the shift from in_shift alone"),
])
def test_qconv2d_per_channel_multipliers_are_checked(muls, attrs, match):
    """A malformed fourth input of qconv2d (per-channel multipliers) names the node and what is wrong."""
    xin = Node.input("x", (1, 3, 4, 4), "int8")
    w, b = Node.const(np.ones((2, 3, 1, 1), np.int8)), Node.const(np.zeros(2, np.int32))
    a = {"in_shift": 20, "w_shift": 0, "out_shift": 0, **attrs}
    with pytest.raises(OpError, match=r"qconv2d 'qc': .*" + match):
        Graph.from_outputs([xin], [Node("qconv2d", [xin, w, b, Node.const(muls)], a, name="qc")])


@pytest.mark.parametrize("op, key, bad", [("qconv2d", "out_zp", 128), ("qconv2d", "out_zp", -129),
                                          ("quantize", "zero_point", 200), ("dequantize", "zero_point", 1.5)])
def test_zero_points_outside_int8_are_refused_by_name(op, key, bad):
    """A zero point is an int8 value: anything else names the node, the attribute and the range."""
    x = Node.input("x", (1, 3, 4, 4), "float32" if op == "quantize" else "int8")
    with pytest.raises(OpError, match=rf"{op} 'q': {key}={bad!r} must be an int8 zero point in \[-128, 127\]"):
        if op == "qconv2d":
            w, b = Node.const(np.ones((2, 3, 1, 1), np.int8)), Node.const(np.zeros(2, np.int32))
            Node(op, [x, w, b], {"in_shift": 20, "w_shift": 0, "out_shift": 0, key: bad}, name="q")
        else:
            Node(op, [x], {"scale": 0.5, key: bad}, name="q")
