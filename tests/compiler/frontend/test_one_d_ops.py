"""Window ops on 1-D signals (N, C, L), as audio and sequence models export them: Conv,
ConvTranspose, MaxPool, AveragePool and the global pools run as their 2-D forms on (N, C, 1, L),
checked against onnxruntime interpreted and compiled for the cpu target. Before, every 1-D Conv
was refused at import."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.frontend import from_onnx
from compiler.frontend.errors import ConversionError, ModelLoadError
from compiler.graph import run
from compiler.graph.passes import optimize

RNG = np.random.default_rng(11)


def _model(op, x_shape, attrs, weight=None, bias=None, y_dims=("n", "c", "l")):
    inits = []
    ins = ["x"]
    if weight is not None:
        inits.append(numpy_helper.from_array(weight, "w"))
        ins.append("w")
    if bias is not None:
        inits.append(numpy_helper.from_array(bias, "b"))
        ins.append("b")
    g = helper.make_graph([helper.make_node(op, ins, ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_dims))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _check(m, x_shape):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    g = from_onnx(m)
    got = run(g, {"x": x})[0]
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * scale)
    mod = compiler.build_model(m, target="cpu")
    assert mod.meta["fallbacks"] == [] and mod.count("numpy") == 0
    out = next(iter(mod.run({"x": x})[0].values()))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("attrs, k, group, bias", [
    ({"strides": [5]}, 10, 1, False),                              # a wav2vec-style feature encoder stem
    ({"pads": [1, 2], "dilations": [2]}, 3, 1, True),
    ({"auto_pad": "SAME_UPPER", "strides": [2]}, 4, 1, True),
    ({"pads": [2, 2], "group": 4}, 5, 4, False),
    ({"pads": [1, 1], "group": 8}, 3, 8, True),                    # depthwise
])
def test_conv1d_matches_onnxruntime(attrs, k, group, bias):
    w = (RNG.standard_normal((8, 8 // group, k)) * 0.3).astype(np.float32)
    b = RNG.standard_normal(8).astype(np.float32) if bias else None
    _check(_model("Conv", (2, 8, 37), attrs, w, b), (2, 8, 37))


@pytest.mark.parametrize("attrs", [{"strides": [2]}, {"strides": [2], "pads": [1, 1], "output_padding": [1]},
                                   {"strides": [3], "dilations": [2]}])
def test_conv_transpose1d_matches_onnxruntime(attrs):
    w = (RNG.standard_normal((6, 4, 3)) * 0.3).astype(np.float32)
    _check(_model("ConvTranspose", (1, 6, 11), attrs, w, RNG.standard_normal(4).astype(np.float32)), (1, 6, 11))


@pytest.mark.parametrize("op, attrs", [
    ("MaxPool", {"kernel_shape": [3], "strides": [2]}),
    ("MaxPool", {"kernel_shape": [4], "pads": [1, 2]}),
    ("AveragePool", {"kernel_shape": [3], "strides": [1], "pads": [1, 1], "count_include_pad": 1}),
    ("AveragePool", {"kernel_shape": [2], "strides": [2]}),
    ("GlobalAveragePool", {}), ("GlobalMaxPool", {}),
])
def test_pools_on_1d_signals_match_onnxruntime(op, attrs):
    _check(_model(op, (2, 5, 20), attrs), (2, 5, 20))


def test_a_global_pool_without_spatial_axes_is_one_error():
    m = _model("GlobalAveragePool", (2, 5), {}, y_dims=("n", "c"))
    with pytest.raises(ConversionError, match=r"GlobalAveragePool '.*': expects an \(N, C, spatial\.\.\.\) input "
                                              r"of rank 3 or more, got float32\[2,5\]"):
        from_onnx(m)


def test_a_2d_attribute_on_a_1d_input_is_one_error():
    m = _model("Conv", (1, 4, 16), {"strides": [1, 1]}, RNG.standard_normal((4, 4, 3)).astype(np.float32))
    with pytest.raises(ModelLoadError, match="strides"):
        from_onnx(m)


def test_stacked_1d_convs_keep_no_reshapes_between_them():
    """Each 1-D conv reshapes to 2-D and back; simplify moves a reshape below the ReLU that reads
    it, so the pairs between convs cancel and the convs run blocked with their ReLU fused."""
    w1 = (RNG.standard_normal((16, 4, 5)) * 0.3).astype(np.float32)
    w2 = (RNG.standard_normal((16, 16, 3)) * 0.3).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w1"], ["a"], strides=[2]), helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("Conv", ["r", "w2"], ["b"], pads=[1, 1]), helper.make_node("Relu", ["b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 30])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    opt = optimize(from_onnx(m))
    assert opt.op_counts().get("reshape", 0) == 2     # into 2-D at the input, back at the output
    _check(m, (1, 4, 64))
