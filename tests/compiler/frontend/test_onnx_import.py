"""ONNX frontend: every supported op against onnxruntime, the zoo networks, and the error cases."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from compiler.frontend import ConversionError, ModelLoadError, UnsupportedOpError, from_onnx, zoo
from compiler.graph import run, structural_equal

RNG = np.random.default_rng(0)


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def single_op_model(op_type, in_shapes, inits=(), attrs=None, opset=17, n_out=1, in_dtype=TensorProto.FLOAT):
    """One node; graph inputs x0..xk of in_shapes, then initializers (name, array) in order."""
    inputs = [helper.make_tensor_value_info(f"x{k}", in_dtype, list(s)) for k, s in enumerate(in_shapes)]
    init_protos = [onnx.numpy_helper.from_array(np.asarray(v), name) for name, v in inits]
    names = [f"x{k}" for k in range(len(in_shapes))] + [name for name, _ in inits]
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, name="the_node", **(attrs or {}))
    g = helper.make_graph([node], "single", inputs, [], init_protos)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    types = {vi.name: vi for vi in inferred.graph.value_info}
    m.graph.output.extend(types[o] for o in outs)
    return m


def check_against_ort(model, rtol=1e-4, atol=1e-5, feeds=None):
    feeds = feeds or zoo.sample_inputs(model, 1, seed=3)[0]
    ref = ort_run(model, feeds)
    got = run(from_onnx(model), feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


def w(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*v):
    return np.array(v, np.int64)


OP_CASES = {
    "conv_pads_stride": ("Conv", [(1, 4, 9, 9)], [("w", w(8, 4, 3, 3)), ("b", w(8))], dict(pads=[1, 0, 2, 1], strides=[2, 1])),
    "conv_same_lower": ("Conv", [(1, 4, 8, 8)], [("w", w(6, 4, 4, 4))], dict(auto_pad="SAME_LOWER", strides=[2, 2])),
    "conv_dilated": ("Conv", [(1, 4, 9, 9)], [("w", w(6, 4, 3, 3))], dict(pads=[2, 2, 2, 2], dilations=[2, 2])),
    "conv_grouped": ("Conv", [(2, 8, 6, 6)], [("w", w(8, 2, 3, 3))], dict(group=4, pads=[1, 1, 1, 1])),
    "conv_transpose": ("ConvTranspose", [(1, 4, 5, 5)], [("w", w(4, 3, 3, 3)), ("b", w(3))],
                       dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
    "conv_transpose_grouped": ("ConvTranspose", [(1, 4, 4, 4)], [("w", w(4, 2, 2, 2))], dict(strides=[2, 2], group=2)),
    "gemm_transb_alpha": ("Gemm", [(3, 5)], [("w", w(4, 5)), ("c", w(4))], dict(transB=1, alpha=0.5, beta=2.0)),
    "gemm_transa": ("Gemm", [(5, 3)], [("w", w(5, 4)), ("c", w(3, 4))], dict(transA=1)),
    "matmul_const_3d": ("MatMul", [(2, 3, 5)], [("w", w(5, 4))], {}),
    "matmul_batched": ("MatMul", [(2, 3, 5), (2, 5, 4)], [], {}),
    "add_broadcast": ("Add", [(2, 3, 4)], [("b", w(3, 1))], {}),
    "sub": ("Sub", [(2, 3), (3,)], [], {}),
    "mul": ("Mul", [(2, 1, 4), (3, 1)], [], {}),
    "div": ("Div", [(2, 3)], [("b", np.abs(w(2, 3)) + 1.0)], {}),
    "relu": ("Relu", [(3, 4)], [], {}),
    "sigmoid": ("Sigmoid", [(3, 4)], [], {}),
    "tanh": ("Tanh", [(3, 4)], [], {}),
    "erf": ("Erf", [(3, 4)], [], {}),
    "leaky_relu": ("LeakyRelu", [(3, 4)], [], dict(alpha=0.2)),
    "clip": ("Clip", [(3, 4)], [("lo", np.float32(-0.5)), ("hi", np.float32(0.7))], {}),
    "batch_norm": ("BatchNormalization", [(2, 3, 4, 4)],
                   [("s", w(3)), ("b", w(3)), ("m", w(3)), ("v", np.abs(w(3)) + 0.5)], dict(epsilon=1e-3)),
    "max_pool_ceil": ("MaxPool", [(1, 2, 7, 7)], [], dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "max_pool_pads": ("MaxPool", [(1, 2, 6, 6)], [], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])),
    "avg_pool_include_pad": ("AveragePool", [(1, 2, 6, 6)], [], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                                                     count_include_pad=1)),
    "avg_pool_exclude_pad": ("AveragePool", [(1, 2, 6, 6)], [], dict(kernel_shape=[2, 2], pads=[1, 1, 0, 0], strides=[2, 2])),
    "global_avg_pool": ("GlobalAveragePool", [(2, 3, 5, 4)], [], {}),
    "flatten": ("Flatten", [(2, 3, 4, 5)], [], dict(axis=2)),
    "reshape_zero_minus1": ("Reshape", [(2, 3, 4)], [("s", i64(0, -1, 2))], {}),
    "transpose": ("Transpose", [(2, 3, 4)], [], dict(perm=[2, 0, 1])),
    "transpose_default": ("Transpose", [(2, 3, 4)], [], {}),
    "concat": ("Concat", [(2, 3), (2, 5)], [], dict(axis=-1)),
    "slice_negative_step": ("Slice", [(5, 6)], [("s", i64(-1, 1)), ("e", i64(-100, 5)), ("a", i64(0, 1)), ("t", i64(-2, 2))], {}),
    "slice_clamped": ("Slice", [(5, 6)], [("s", i64(1)), ("e", i64(1000)), ("a", i64(-1))], {}),
    "pad_constant": ("Pad", [(1, 2, 3, 3)], [("p", i64(0, 0, 1, 2, 0, 0, 2, 1)), ("v", np.float32(1.5))], {}),
    "pad_reflect": ("Pad", [(1, 2, 4, 4)], [("p", i64(0, 0, 1, 2, 0, 0, 2, 1))], dict(mode="reflect")),
    "pad_axes_opset18": ("Pad", [(2, 4, 4)], [("p", i64(1, 2)), ("v", np.float32(0.0)), ("a", i64(-1))], dict(mode="edge")),
    "squeeze": ("Squeeze", [(1, 3, 1, 4)], [("a", i64(0, 2))], {}),
    "squeeze_all": ("Squeeze", [(1, 3, 1, 4)], [], {}),
    "unsqueeze": ("Unsqueeze", [(3, 4)], [("a", i64(0, -1))], {}),
    "softmax": ("Softmax", [(2, 3, 5)], [], dict(axis=1)),
    "layer_norm": ("LayerNormalization", [(2, 3, 8)], [("s", w(8)), ("b", w(8))], dict(axis=-1, epsilon=1e-5)),
    "layer_norm_two_axes": ("LayerNormalization", [(2, 3, 8)], [("s", w(3, 8))], dict(axis=1)),
    "reduce_mean_attr": ("ReduceMean", [(2, 3, 4)], [], dict(axes=[1, 2], keepdims=0)),
    "identity": ("Identity", [(2, 3)], [], {}),
    "dropout": ("Dropout", [(2, 3)], [], {}),
    "gather_const": ("Gather", [(4, 5)], [("i", i64(3, 0))], dict(axis=1)),
    "quantize_dequantize_u8": ("QuantizeLinear", [(2, 8)], [("s", np.float32(0.05)), ("z", np.uint8(128))], {}),
    "dequantize_per_axis": ("DequantizeLinear", [], [("q", np.arange(-12, 12, dtype=np.int8).reshape(3, 8)),
                                                     ("s", np.array([0.1, 0.2, 0.3], np.float32)),
                                                     ("z", np.array([0, 1, -1], np.int8))], dict(axis=0)),
    "abs": ("Abs", [(3, 4)], [], {}),
    "log": ("Log", [(3, 4)], [], {}),   # positive inputs: FEEDS
    "max_variadic_broadcast": ("Max", [(2, 3, 4), (3, 1), (4,)], [], {}),
    "min_two": ("Min", [(2, 3)], [("b", w(2, 3))], {}),
    "reduce_sum_axes_input": ("ReduceSum", [(2, 3, 4)], [("a", i64(0, -1))], dict(keepdims=0)),
    "reduce_sum_all": ("ReduceSum", [(2, 3, 4)], [], {}),
    "reduce_max_attr": ("ReduceMax", [(2, 3, 4)], [], dict(axes=[1], keepdims=1)),
    "reduce_max_axes_input_opset18": ("ReduceMax", [(2, 3, 4)], [("a", i64(2))], dict(keepdims=0)),
    "log_softmax": ("LogSoftmax", [(2, 3, 5)], [], dict(axis=1)),
    "instance_norm": ("InstanceNormalization", [(2, 3, 4, 5)], [("s", w(3)), ("b", w(3))], dict(epsilon=1e-3)),
    "global_max_pool": ("GlobalMaxPool", [(2, 3, 5, 4)], [], {}),
    "gather_scalar_index": ("Gather", [(4, 5)], [("i", np.array(-2, np.int64))], dict(axis=1)),
    "gather_runtime_indices": ("Gather", [(6, 3)], [], dict(axis=0)),   # x1: int64 indices (OP_DTYPES)
    "prelu_per_channel": ("PRelu", [(2, 3, 4, 4)], [("s", w(3, 1, 1))], {}),
    "prelu_scalar": ("PRelu", [(3, 4)], [("s", np.array([0.25], np.float32))], {}),
    "hard_sigmoid": ("HardSigmoid", [(3, 4)], [], dict(alpha=0.3, beta=0.4)),
    "hard_swish": ("HardSwish", [(2, 3, 5)], [], {}),
    # Resize: X, roi (empty), scales, sizes
    "resize_nearest_asymmetric_floor": ("Resize", [(1, 2, 3, 4)], [("r", np.zeros(0, np.float32)),
                                        ("s", np.array([1, 1, 2, 3], np.float32))],
                                        dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")),
    "resize_nearest_half_pixel_down": ("Resize", [(1, 2, 6, 4)], [("r", np.zeros(0, np.float32)),
                                       ("s", np.array([1, 1, 0.5, 2], np.float32))], {}),
    "resize_nearest_sizes_align_corners_ceil": ("Resize", [(1, 2, 3, 4)], [("r", np.zeros(0, np.float32)),
                                                ("s", np.zeros(0, np.float32)), ("z", i64(1, 2, 5, 7))],
                                                dict(coordinate_transformation_mode="align_corners", nearest_mode="ceil")),
    "resize_linear_half_pixel": ("Resize", [(1, 2, 4, 5)], [("r", np.zeros(0, np.float32)),
                                 ("s", np.array([1, 1, 2, 1.5], np.float32))], dict(mode="linear")),
    "resize_linear_sizes_align_corners": ("Resize", [(1, 2, 4, 5)], [("r", np.zeros(0, np.float32)),
                                          ("s", np.zeros(0, np.float32)), ("z", i64(1, 2, 7, 3))],
                                          dict(mode="linear", coordinate_transformation_mode="align_corners")),
    "resize_cubic_pytorch_half_pixel": ("Resize", [(1, 1, 4, 4)], [("r", np.zeros(0, np.float32)),
                                        ("s", np.array([1, 1, 2, 2], np.float32))],
                                        dict(mode="cubic", coordinate_transformation_mode="pytorch_half_pixel")),
    "resize_axes_opset18": ("Resize", [(1, 2, 3, 4)], [("r", np.zeros(0, np.float32)), ("s", np.array([2, 2], np.float32))],
                            dict(axes=[2, 3], mode="nearest")),
}
OPSET = {"reduce_mean_attr": 13, "pad_axes_opset18": 18, "resize_axes_opset18": 18, "reduce_max_axes_input_opset18": 18}


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_onnx_import_op_matches_onnxruntime(case):
    op, shapes, inits, attrs = OP_CASES[case]
    m = single_op_model(op, shapes, inits, attrs, opset=OPSET.get(case, 17))
    feeds = None
    if case == "log":
        feeds = {"x0": np.abs(w(3, 4)) + 0.1}
    if case == "gather_runtime_indices":   # a graph input of int64 indices, negative ones included
        m = single_op_model(op, [(6, 3), (2, 4)], [], attrs)
        m.graph.input[1].type.tensor_type.elem_type = TensorProto.INT64
        feeds = {"x0": w(6, 3), "x1": np.array([[0, 5, -1, 2], [3, 3, -6, 1]], np.int64)}
    check_against_ort(m, feeds=feeds)


def test_onnx_import_resize_modes_it_cannot_do_fail_naming_the_node():
    inits = [("r", np.zeros(0, np.float32)), ("s", np.array([1, 1, 2, 2], np.float32))]
    for attrs, why in ((dict(coordinate_transformation_mode="tf_crop_and_resize"), "tf_crop_and_resize"),
                       (dict(mode="area"), "mode 'area'")):
        with pytest.raises(ConversionError, match=f"Resize 'the_node': .*{why}"):
            from_onnx(single_op_model("Resize", [(1, 2, 3, 4)], inits, attrs))


def test_onnx_import_opset18_reduce_mean_and_split_num_outputs():
    m = single_op_model("ReduceMean", [(2, 3, 4)], [("a", i64(-1))], dict(keepdims=1), opset=18)
    check_against_ort(m)
    m = single_op_model("Split", [(2, 7)], [], dict(axis=1, num_outputs=3), opset=18, n_out=3)
    check_against_ort(m)


def test_onnx_import_split_sizes_and_gelu_opset20():
    check_against_ort(single_op_model("Split", [(6, 2)], [("s", i64(1, 2, 3))], {}, n_out=3))
    check_against_ort(single_op_model("Gelu", [(3, 4)], [], {}, opset=20))
    check_against_ort(single_op_model("Gelu", [(3, 4)], [], dict(approximate="tanh"), opset=20))


def test_onnx_import_constant_and_shape_subgraph_fold_at_import():
    """Reshape's target computed from Shape -> Gather -> Concat (as torch exports) resolves statically."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"], name="shape"),
        helper.make_node("Constant", [], ["idx"], name="c_idx", value=helper.make_tensor("i", TensorProto.INT64, [1], [0])),
        helper.make_node("Gather", ["shp", "idx"], ["n"], name="gather", axis=0),
        helper.make_node("Constant", [], ["m1"], name="c_m1", value_ints=[-1]),
        helper.make_node("Concat", ["n", "m1"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
    ]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    check_against_ort(m)
    g = from_onnx(m)
    assert g.outputs[0].op == "reshape" and g.outputs[0].shape == (2, 12)



def test_onnx_import_unsupported_ops_on_constants_fold_at_import():
    """Ops without a converter whose inputs are all constant (PyTorch's MultiheadAttention exports
    Mod on two constants) are evaluated by onnx's reference evaluator, chains included; the same
    op on a graph input is still reported, with its node name."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    i64 = lambda name, v: helper.make_node("Constant", [], [name], name=f"c_{name}",
                                           value=helper.make_tensor(name, TensorProto.INT64, [len(v)], v))
    nodes = [i64("a", [14]), i64("b", [4]),
             helper.make_node("Mod", ["a", "b"], ["r"], name="mod"),                 # 2
             helper.make_node("Max", ["r", "three"], ["s"], name="max"),              # 3, an initializer input
             helper.make_node("Concat", ["s", "m1"], ["target"], name="concat", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    inits = [onnx.numpy_helper.from_array(np.array([3], np.int64), "three"),
             onnx.numpy_helper.from_array(np.array([-1], np.int64), "m1")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                                            inits), opset_imports=[helper.make_opsetid("", 17)])
    check_against_ort(m)
    assert from_onnx(m).outputs[0].shape == (3, 4)
    with pytest.raises(UnsupportedOpError) as e:   # on a graph input: not constant, not folded
        from_onnx(single_op_model("Tan", [(3,)], [], {}))
    assert e.value.unsupported == {"Tan": ["the_node"]}

@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_onnx_import_zoo_network_matches_onnxruntime(name):
    m = zoo.MODELS[name]()
    for feeds in zoo.sample_inputs(m, 2, seed=5):
        check_against_ort(m, feeds=feeds)


def test_onnx_import_unsupported_ops_listed_in_one_error():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("Tan", ["a"], ["b"], name="hm1"),
             helper.make_node("Det", ["b"], ["c"], name="det"),
             helper.make_node("Tan", ["c"], ["d"], name="hm2"),
             helper.make_node("MyCustomOp", ["d"], ["e"], name="custom", domain="com.example")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, 4])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError) as e:
        from_onnx(m)
    msg = str(e.value)
    assert "3 unsupported op type(s)" in msg
    assert "Det (node 'det')" in msg and "Tan (nodes 'hm1', 'hm2')" in msg
    assert "needs a converter" in msg
    assert e.value.unsupported == {"Det": ["det"], "Tan": ["hm1", "hm2"], "com.example.MyCustomOp": ["custom"]}


def test_onnx_import_truncated_file_fails_clearly(tmp_path):
    data = zoo.residual_block().SerializeToString()
    for cut in (len(data) // 2, len(data) - 7, 3):
        p = tmp_path / f"cut{cut}.onnx"
        p.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match=r"cut\d+\.onnx"):
            from_onnx(p)


def test_onnx_import_garbage_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="empty file"):
        from_onnx(tmp_path / "empty.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\xff\xfe not a model at all \x00" * 10)
    with pytest.raises(ModelLoadError, match="junk.onnx"):
        from_onnx(tmp_path / "junk.onnx")
    with pytest.raises(ModelLoadError, match="cannot read"):
        from_onnx(tmp_path / "missing.onnx")


def test_onnx_import_path_and_bytes_agree(tmp_path):
    m = zoo.mlp()
    p = tmp_path / "mlp.onnx"
    onnx.save(m, p)
    assert structural_equal(from_onnx(p), from_onnx(m.SerializeToString()))


def test_onnx_import_old_opset_is_upgraded():
    """Opset 11: Squeeze/Unsqueeze/ReduceMean take axes as attributes; the version converter upgrades."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4])
    nodes = [helper.make_node("Squeeze", ["x"], ["a"], name="sq", axes=[0]),
             helper.make_node("ReduceMean", ["a"], ["b"], name="rm", axes=[1], keepdims=1),
             helper.make_node("Unsqueeze", ["b"], ["c"], name="usq", axes=[0])]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 3, 1])]),
                          opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 7
    g = from_onnx(m)
    assert g.meta["onnx_opset"] == 13
    check_against_ort(m)


def test_onnx_import_symbolic_dims_need_shapes():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g", [x],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ConversionError, match="input 'x' has a symbolic dimension 'batch'"):
        from_onnx(m)
    assert from_onnx(m, shapes={"x": (3, 4)}).outputs[0].shape == (3, 4)


def test_onnx_import_training_outputs_and_dynamic_shapes_rejected_with_node_name():
    m = single_op_model("MaxPool", [(1, 2, 4, 4)], [], {"kernel_shape": [2, 2]}, n_out=2)
    with pytest.raises(ConversionError, match="MaxPool 'the_node': output 1 .*Indices"):
        from_onnx(m)
    m = single_op_model("Reshape", [(2, 3), (2,)], [], {}, in_dtype=TensorProto.FLOAT)
    m.graph.input[1].type.tensor_type.elem_type = TensorProto.INT64
    with pytest.raises(ConversionError, match="Reshape 'the_node': shape .* must be constant.*graph input 'x1'"):
        from_onnx(m)


def test_onnx_import_keeps_onnx_names_and_op_types():
    g = from_onnx(zoo.conv_bn_relu_pool())
    conv = g.find("conv1")
    assert conv.op == "conv2d" and conv.origin == "Conv" and conv.shape == (1, 16, 16, 16)
    assert g.output_names == [zoo.conv_bn_relu_pool().graph.output[0].name]
    text = str(g)
    assert "%conv1 = conv2d(%image" in text and "@" not in text
