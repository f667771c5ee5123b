"""onnxruntime's QOperator quantized models (QLinearConv, QGemm, QLinearAdd, ...): imported as the
int8 layers the QDQ path makes, compiled for cpu and accel, run on fsim, against onnxruntime's
own run of the same quantized model (the oracle), and bit-exact against our int8 reference."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.frontend import ConversionError, UnsupportedOpError, from_onnx, zoo
from compiler.graph import run as reference_run
from compiler.graph.passes import optimize
from host_runtime.executor import Executor


def qoperator(model, feeds, per_channel=False, activations="int8"):
    """model quantized by onnxruntime as QOperator (zoo.ort_quantize's recipe)."""
    return zoo.ort_quantize(model, feeds, per_channel, activations, quant_format="qoperator")


def cnn(seed=0):
    """conv-bn-relu, max pool, residual add, concat, average pool, leaky relu, global pool, dense."""
    b = zoo.ModelBuilder("qop_cnn", seed)
    x = b.input("x", (1, 3, 12, 12))
    y = b.op("Relu", [b.bn(b.conv(x, 3, 16, name="conv1"), 16, name="bn1")], name="relu1")
    y = b.op("MaxPool", [y], name="pool1", kernel_shape=[2, 2], strides=[2, 2])
    r = b.conv(b.op("Relu", [b.conv(y, 16, 16, name="conv2")], name="relu2"), 16, 16, name="conv3")
    y = b.op("Relu", [b.op("Add", [r, y], name="residual")], name="relu3")
    z = b.op("Relu", [b.conv(y, 16, 8, k=1, name="conv4")], name="relu4")
    y = b.op("Concat", [y, z], name="concat", axis=1)
    y = b.op("AveragePool", [y], name="avgpool", kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("LeakyRelu", [b.conv(y, 24, 16, name="conv5")], name="leaky", alpha=0.1)
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y], name="gap")], name="flatten", axis=1)
    return b.build([b.op("Gemm", [y, b.weight((10, 16)), b.init(np.zeros(10, np.float32))], name="fc", transB=1)])


def mlp(seed=0):
    """Gemm-relu, MatMul + bias (QGemm after onnxruntime's fusion), swish (QLinearSigmoid,
    QLinearMul), MatMul (QLinearMatMul)."""
    b = zoo.ModelBuilder("qop_mlp", seed)
    x = b.input("x", (4, 32))
    y = b.op("Gemm", [x, b.weight((48, 32)), b.init(np.full(48, 0.05, np.float32))], name="fc1", transB=1)
    y = b.op("MatMul", [b.op("Relu", [y], name="relu1"), b.weight((48, 32), fan_in=48)], name="mm2")
    y = b.op("Add", [y, b.init((b.rng.standard_normal(32) * 0.1).astype(np.float32))], name="bias2")
    y = b.op("Mul", [y, b.op("Sigmoid", [y], name="sig")], name="swish")
    return b.build([b.op("MatMul", [y, b.weight((32, 10), fan_in=32)], name="mm3")])


NETS = {"cnn": cnn, "mlp": mlp}


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def output_unit(qm) -> float:
    """The scale of the model's output DequantizeLinear: one output unit."""
    inits = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    dq = [n for n in qm.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == qm.graph.output[0].name]
    return float(inits[dq[0].input[1]])


def all_nodes(g):
    for n in g.nodes:
        yield from all_nodes(n.attrs["body"]) if n.op == "fused" else (n,)


@pytest.fixture(scope="module")
def quantized():
    cache = {}

    def get(name, per_channel, activations):
        key = (name, per_channel, activations)
        if key not in cache:
            m = NETS[name]()
            feeds = zoo.sample_inputs(m, 6, seed=2)
            cache[key] = qoperator(m, feeds[:4], per_channel, activations), feeds[4:]
        return cache[key]
    return get


CASES = [("cnn", False, "int8"), ("cnn", True, "uint8"), ("cnn", True, "symmetric"),
         ("mlp", True, "int8"), ("mlp", False, "uint8"), ("mlp", False, "symmetric")]


@pytest.mark.parametrize("target", ["cpu", "accel"])
@pytest.mark.parametrize("name,per_channel,activations", CASES,
                         ids=[f"{n}-{'per_channel' if p else 'per_tensor'}-{a}" for n, p, a in CASES])
def test_qoperator_model_matches_onnxruntime(quantized, name, per_channel, activations, target):
    """Every QLinear op of the net imported; the convs and dense layers run in int8 with the
    model's own int8 weights (qconv2d/qdense, on the accelerator for accel); the output is
    within one output unit of onnxruntime's run of the same QOperator model (measured: 0 units on
    these nets, see the module docstring of compiler.frontend.qoperator), and on accel every int8
    tensor equals our int8 reference bit for bit."""
    qm, feeds = quantized(name, per_channel, activations)
    qops = {n.op_type for n in qm.graph.node if n.op_type.startswith(("QLinear", "QGemm"))}
    assert {"QLinearConv", "QLinearAdd", "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool",
            "QGemm"} <= qops if name == "cnn" else {"QGemm", "QLinearMatMul", "QLinearMul", "QLinearSigmoid"} <= qops
    mod = compiler.build_model(qm, target=target, config="default", force_target={"qdense": "accel"})
    assert not mod.meta["warnings"]
    # average pools become int8 depthwise convs (quantize.py): only the model's own layers count here
    layers = [n for n in all_nodes(mod.graph) if n.op in ("qconv2d", "qdense") and "Pool" not in (n.origin or "")]
    assert len(layers) == sum(n.op_type in ("QLinearConv", "QGemm", "QLinearMatMul") for n in qm.graph.node)
    assert not [n for n in all_nodes(mod.graph) if n.op in ("conv2d", "dense")], "a layer fell back to float"
    if target == "accel":
        assert {n.name for n in layers} & {s.name for s in mod.steps if s.kind == "accel"}
    unit = output_unit(qm)
    for f in feeds:
        want = ort_run(qm, f)[0]
        if target == "accel":
            with Executor(mod, driver="fsim") as ex:
                got = next(iter(ex.run(f, keep=True).values()))
            _, env = reference_run(mod.graph, f, keep=True)
            ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
            checked = [k for k in ex.values if k in ints]
            assert len(checked) >= mod.count("accel")
            for k in checked:
                np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=f"int8 tensor {k}")
        else:
            got = next(iter(mod.run(f)[0].values()))
        assert np.abs(got - want).max() <= unit * (1 + 1e-5), np.abs(got - want).max() / unit


def test_qoperator_layers_keep_the_models_int8_weights_and_bias(quantized):
    """No float round trip: each QLinearConv becomes a qconv2d whose int8 weights and int32 bias
    are the model's own (per-channel scales: one fixed-point multiplier per channel)."""
    qm, _ = quantized("cnn", True, "uint8")
    inits = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    g = optimize(from_onnx(qm), quantize=True, fuse=False)
    convs = {n.name: n for n in g.nodes if n.op == "qconv2d" and "Pool" not in (n.origin or "")}
    model_convs = [n for n in qm.graph.node if n.op_type == "QLinearConv"]
    assert len(convs) == len(model_convs)
    for n in model_convs:
        q = convs[n.name]
        np.testing.assert_array_equal(q.inputs[1].value, inits[n.input[3]])
        x_zp = int(inits[n.input[2]]) - 128   # uint8 activations: zero point in int8 terms
        bias = inits[n.input[8]].astype(np.int64) - x_zp * inits[n.input[3]].reshape(len(inits[n.input[3]]), -1).sum(1)
        np.testing.assert_array_equal(q.inputs[2].value, bias)
        assert len(q.inputs) == 4 and q.attrs.get("out_zp") == int(inits[n.input[7]]) - 128


def _qlinear_conv_model(w_zero_point=0, channels_last=None, w=None):
    """x (float) -> QuantizeLinear -> QLinearConv (3x3, pad 1) -> DequantizeLinear, uint8 activations."""
    rng = np.random.default_rng(0)
    w = rng.integers(-100, 100, (4, 4, 3, 3)).astype(np.int8) if w is None else w
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "xs": np.float32(0.05), "xz": np.uint8(120), "w": w, "ws": np.float32(0.01),
        "wz": np.asarray(w_zero_point, w.dtype), "ys": np.float32(0.2), "yz": np.uint8(100),
        "b": rng.integers(-500, 500, 4).astype(np.int32)}.items()]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="quant_x"),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["yq"],
                              name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"], name="dequant_y")]
    if channels_last is not None:
        nodes.insert(2, helper.make_node("QLinearGlobalAveragePool", ["yq", "ys", "yz", "ys", "yz"], ["gq"],
                                         name="gap", domain="com.microsoft", channels_last=channels_last))
        nodes[-1] = helper.make_node("DequantizeLinear", ["gq", "ys", "yz"], ["y"], name="dequant_y")
    g = helper.make_graph(nodes, "qconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5] if channels_last is None
                                                         else [1, 4, 1, 1])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("target", ["cpu", "accel"])
def test_hand_written_qlinear_conv_with_weight_zero_point(target):
    """uint8 weights with a zero point (onnxruntime's asymmetric weights): the zero point is
    subtracted at import; the layer is still exact against onnxruntime."""
    w = np.random.default_rng(1).integers(30, 230, (4, 4, 3, 3)).astype(np.uint8)
    qm = _qlinear_conv_model(w_zero_point=128, w=w)
    mod = compiler.build_model(qm, target=target, config="default")
    for seed in range(2):
        f = {"x": np.random.default_rng(seed).normal(0, 2, (1, 4, 5, 5)).astype(np.float32)}
        got = next(iter(mod.run(f)[0].values()))
        assert np.abs(got - ort_run(qm, f)[0]).max() <= 0.2 * (1 + 1e-5)


def test_weights_that_do_not_fit_int8_after_their_zero_point_are_refused_by_name():
    w = np.full((4, 4, 3, 3), 250, np.uint8)
    with pytest.raises(ConversionError, match=r"QLinearConv 'conv': weight minus its zero point spans \[0, 240\], "
                                              r"outside int8 \[-127, 127\].*WeightSymmetric"):
        from_onnx(_qlinear_conv_model(w_zero_point=10, w=w))


def test_channels_last_pooling_is_refused_by_name():
    with pytest.raises(ConversionError, match=r"QLinearGlobalAveragePool 'gap': channels_last=1 \(NHWC\) is not "
                                              r"supported"):
        from_onnx(_qlinear_conv_model(channels_last=1))


def test_unsupported_quantized_contrib_ops_are_listed_with_their_domain():
    m = _qlinear_conv_model()
    m.graph.node.insert(2, helper.make_node("QLinearWhere", ["yq"], ["wq"], name="where", domain="com.microsoft"))
    with pytest.raises(UnsupportedOpError, match=r"com\.microsoft\.QLinearWhere \(node 'where'\)"):
        from_onnx(m)


def test_pad_of_a_quantized_tensor_reads_its_constant_value_at_the_tensors_scale():
    """QOperator keeps Pad on the integers: its uint8 constant_value (here 130 at zero point 120,
    i.e. 10 steps of 0.05 = 0.5) is padded as the value it stands for; exact against onnxruntime."""
    m = _qlinear_conv_model()
    m.graph.initializer.extend([numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
                                numpy_helper.from_array(np.uint8(130), "pad_value")])
    m.graph.node.insert(1, helper.make_node("Pad", ["xq", "pads", "pad_value"], ["xp"], name="pad"))
    conv = m.graph.node[2]
    conv.input[0] = "xp"
    del conv.attribute[:]
    conv.attribute.append(helper.make_attribute("kernel_shape", [3, 3]))
    for target in ("cpu", "accel"):
        mod = compiler.build_model(m, target=target, config="default")
        f = {"x": np.random.default_rng(3).normal(0, 2, (1, 4, 5, 5)).astype(np.float32)}
        got = next(iter(mod.run(f)[0].values()))
        np.testing.assert_allclose(got, ort_run(m, f)[0], atol=0.2 * 1e-5)


def test_errors_of_the_plain_converter_name_the_quantized_node():
    m = _qlinear_conv_model()
    m.graph.node[1].attribute.append(helper.make_attribute("group", 3))
    with pytest.raises(ConversionError, match=r"^QLinearConv 'conv': "):
        compiler.build_model(m, target="cpu")


def test_hand_written_qgemm_with_float_output():
    """QGemm without y_scale: a float result, alpha a_scale b_scale (A B^T + C). Without an output
    scale the layer has no int8 result: it runs as a float dense layer on the dequantized weights
    (exact products, float32 sums), against onnxruntime to float precision."""
    rng = np.random.default_rng(2)
    ms = "com.microsoft"
    inits = [numpy_helper.from_array(v, k) for k, v in {
        "xs": np.float32(0.04), "xz": np.int8(3), "w": rng.integers(-127, 128, (6, 16)).astype(np.int8),
        "ws": np.float32(0.02), "wz": np.int8(0), "b": rng.integers(-300, 300, 6).astype(np.int32)}.items()]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="quant_x"),
             helper.make_node("QGemm", ["xq", "xs", "xz", "w", "ws", "wz", "b"], ["y"], name="fc", domain=ms,
                              transB=1, alpha=0.5)]
    g = helper.make_graph(nodes, "qgemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 6])], inits)
    qm = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)])
    mod = compiler.build_model(qm, target="cpu")
    assert [n.op for n in all_nodes(mod.graph) if n.op in ("dense", "qdense")] == ["dense"]
    for seed in range(2):
        f = {"x": np.random.default_rng(seed).normal(0, 2, (3, 16)).astype(np.float32)}
        np.testing.assert_allclose(next(iter(mod.run(f)[0].values())), ort_run(qm, f)[0], rtol=1e-5, atol=1e-5)
