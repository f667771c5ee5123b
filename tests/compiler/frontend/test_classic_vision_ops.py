"""ONNX ops of the classic vision models (AlexNet, SqueezeNet, GoogLeNet, ResNet-50 as Caffe2 exported
them): Dropout in every form, Sum, Mean, LRN, and ReduceMean as a compiled kernel. Each against
onnxruntime, on the graph interpreter and, where it matters, compiled for the cpu target."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.frontend import ConversionError, from_onnx
from compiler.graph import run
from tests.compiler.frontend.onnx_helpers import model

RNG = np.random.default_rng(7)


def ort_run(m, feeds):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check(m, feeds, rtol=1e-5, atol=1e-6, build=False, oracle=ort_run):
    """The interpreter (and, with build, the compiled cpu module) equal onnxruntime (or onnx's
    reference evaluator where onnxruntime lacks the case)."""
    ref = oracle(m, feeds)
    got = run(from_onnx(m), feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, r.shape, g.dtype, r.dtype)
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    if build:
        mod = compiler.build_model(m, target="cpu")
        outs, _ = mod.run(feeds)
        for g, r in zip(outs.values(), ref):
            np.testing.assert_allclose(np.asarray(g).reshape(r.shape), r, rtol=rtol, atol=atol)
        return mod
    return None


F = TensorProto.FLOAT


# ---- Dropout -------------------------------------------------------------------------------------
def _dropout_model(opset, out_mask=True, attrs=None, extra_inputs=(), inits=(), inputs=()):
    outs = ["y", "mask"] if out_mask else ["y"]
    node = helper.make_node("Dropout", ["x", *extra_inputs], outs, name="drop", **(attrs or {}))
    relu = helper.make_node("Relu", ["y"], ["z"], name="relu")
    return model([node, relu], [("x", F, [2, 3, 4]), *inputs], [("z", F, [2, 3, 4])], inits, opset)


@pytest.mark.parametrize("opset,attrs,extra,inits", [
    (7, {"ratio": 0.3}, (), ()),                       # ratio attribute, mask output named, unused
    (10, {"ratio": 0.5}, (), ()),
    (12, {}, ("r",), (("r", np.float32(0.25)),)),      # ratio input
    (13, {}, ("r", "t"), (("r", np.float32(0.5)), ("t", np.bool_(False)))),   # training_mode false
    (13, {}, ("", "t"), (("t", np.bool_(False)),)),    # ratio omitted
    (13, {"seed": 3}, (), ()),
])
def test_dropout_forms_are_the_identity_at_inference(opset, attrs, extra, inits):
    m = _dropout_model(opset, attrs=attrs, extra_inputs=extra, inits=inits)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    check(m, {"x": x})


def test_dropout_mask_consumed_and_as_graph_output_is_all_true():
    """As ONNX defines it (opset 12+: training_mode false) and onnxruntime computes it at opset 13
    (at opset 10 onnxruntime returns an all-false mask; the spec's reference, all true, is kept)."""
    nodes = [helper.make_node("Dropout", ["x"], ["y", "mask"], name="drop"),
             helper.make_node("Cast", ["mask"], ["mf"], name="cast", to=F),
             helper.make_node("Mul", ["y", "mf"], ["z"], name="mul")]
    m = model(nodes, [("x", F, [2, 5])], [("z", F, [2, 5]), ("mask", TensorProto.BOOL, [2, 5])], opset=13)
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    z, mask = run(from_onnx(m), {"x": x})
    assert mask.dtype == np.bool_ and mask.shape == (2, 5) and mask.all()
    np.testing.assert_array_equal(z, x)
    check(m, {"x": x})
    mod = compiler.build_model(m, target="cpu")
    outs, _ = mod.run({"x": x})
    z2, mask2 = outs.values()
    np.testing.assert_array_equal(z2, x)
    assert np.asarray(mask2).all()


def test_dropout_in_training_mode_fails_naming_the_node():
    m = _dropout_model(13, extra_inputs=("r", "t"), inits=(("r", np.float32(0.5)), ("t", np.bool_(True))))
    with pytest.raises(ConversionError, match="Dropout 'drop': training_mode is true"):
        from_onnx(m)
    m = _dropout_model(13, extra_inputs=("r", "t"), inits=(("r", np.float32(0.5)),),
                       inputs=(("t", TensorProto.BOOL, []),))
    with pytest.raises(ConversionError, match="Dropout 'drop': training_mode .*must be constant.*graph input 't'"):
        from_onnx(m)


# ---- Sum / Mean ----------------------------------------------------------------------------------
def _variadic(op, shapes, opset=13):
    names = [f"x{k}" for k in range(len(shapes))]
    out = list(np.broadcast_shapes(*shapes))
    return model([helper.make_node(op, names, ["y"], name="the_node")], [(n, F, list(s)) for n, s in zip(names, shapes)],
                 [("y", F, out)], opset=opset)


@pytest.mark.parametrize("op", ["Sum", "Mean"])
@pytest.mark.parametrize("shapes", [[(2, 3)], [(2, 3, 4), (2, 3, 4)], [(2, 3, 4), (3, 1), (4,)], [(1, 4), (3, 1), (1, 1), (3, 4)]])
def test_sum_mean_variadic_broadcasting(op, shapes):
    m = _variadic(op, shapes)
    feeds = {f"x{k}": RNG.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}
    check(m, feeds)


def test_sum_mean_compile_for_cpu_and_old_opset():
    shapes = [(2, 3, 4), (3, 1), (4,)]
    feeds = {f"x{k}": RNG.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}
    for op in ("Sum", "Mean"):
        mod = check(_variadic(op, shapes, opset=8), feeds, build=True)
        assert mod.meta["fallbacks"] == []


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 4), dims=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data())
def test_sum_mean_random_broadcasts_match_onnxruntime(n, dims, data):
    shapes = []
    for _ in range(n):   # each input: a suffix of dims with some axes set to 1
        k = data.draw(st.integers(0, len(dims)))
        shapes.append(tuple(1 if data.draw(st.booleans()) else d for d in dims[len(dims) - k:]) or (1,))
    op = data.draw(st.sampled_from(["Sum", "Mean"]))
    feeds = {f"x{k}": RNG.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}
    check(_variadic(op, shapes), feeds)


# ---- LRN -----------------------------------------------------------------------------------------
def spec_lrn_run(m, feeds):
    """ONNX's LRN formula written out channel by channel (onnx's reference evaluator loops over the
    batch axis instead of the channels, and onnxruntime takes odd sizes on 4-D inputs only)."""
    (node,) = m.graph.node
    a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
    size, alpha, beta, bias = a["size"], a.get("alpha", 1e-4), a.get("beta", 0.75), a.get("bias", 1.0)
    x = feeds["x"].astype(np.float64)
    sq = np.zeros_like(x)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(x.shape[1] - 1, c + int(np.ceil((size - 1) / 2)))
        sq[:, c] = (x[:, lo:hi + 1] ** 2).sum(axis=1)
    return [(x / (bias + alpha / size * sq) ** beta).astype(np.float32)]


def _lrn(shape, **attrs):
    return model([helper.make_node("LRN", ["x"], ["y"], name="norm", **attrs)], [("x", F, list(shape))],
                 [("y", F, list(shape))])


@pytest.mark.parametrize("shape,attrs", [
    ((1, 16, 6, 6), dict(size=5, alpha=1e-4, beta=0.75, bias=1.0)),     # AlexNet's
    ((2, 7, 5, 3), dict(size=4, alpha=0.3, beta=0.6, bias=2.0)),        # even size: window asymmetric
    ((1, 3, 4, 4), dict(size=9)),                                       # window wider than the channels
    ((1, 6, 5), dict(size=3, alpha=0.5, beta=1.5)),                     # rank 3
    ((1, 4, 2, 3, 3), dict(size=2, alpha=1.0, beta=0.5, bias=0.5)),     # rank 5
    ((1, 5, 3, 3), dict(size=1, alpha=2.0)),
])
def test_lrn_matches_onnxruntime_interpreted_and_compiled(shape, attrs):
    """onnxruntime takes odd sizes on 4-D inputs only; onnx's reference evaluator checks the rest."""
    x = (RNG.standard_normal(shape) * 3).astype(np.float32)
    oracle = ort_run if attrs["size"] % 2 and len(shape) == 4 else spec_lrn_run
    mod = check(_lrn(shape, **attrs), {"x": x}, rtol=1e-5, build=True, oracle=oracle)
    assert mod.meta["fallbacks"] == []


@settings(max_examples=20, deadline=None)
@given(c=st.integers(1, 9), size=st.integers(1, 7), alpha=st.floats(1e-5, 2.0), beta=st.floats(0.1, 2.0),
       bias=st.floats(0.5, 3.0), scale=st.floats(0.1, 10.0))
def test_lrn_random_attributes_match_onnxruntime(c, size, alpha, beta, bias, scale):
    """The data is seeded by the example (a shared generator made replays differ). onnxruntime's
    float32 power is off by up to 2e-5 relative against float64 (beta 2, alpha 2), hence rtol."""
    x = (np.random.default_rng(c * 31 + size).standard_normal((2, c, 3, 4)) * scale).astype(np.float32)
    check(_lrn((2, c, 3, 4), size=size, alpha=alpha, beta=beta, bias=bias), {"x": x}, rtol=1e-4, atol=1e-6,
          oracle=ort_run if size % 2 else spec_lrn_run)


def test_lrn_without_size_fails_naming_the_node():
    m = _lrn((1, 4, 3, 3), size=3)
    del m.graph.node[0].attribute[:]
    with pytest.raises((ConversionError, compiler.frontend.ModelLoadError), match="norm|size"):
        from_onnx(m)


# ---- ReduceMean compiled ------------------------------------------------------------------------
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([2, 3], 0), ([-1, 0], 1), (None, 0), (None, 1)])
@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
def test_reductions_compile_to_llvm_kernels(op, axes, keepdims):
    attrs = {"keepdims": keepdims}
    if axes is not None:
        attrs["axes"] = axes
    shape = (2, 5, 3, 4)
    ref_shape = np.mean(np.zeros(shape), axis=None if axes is None else tuple(axes), keepdims=bool(keepdims)).shape
    # a 0-d result is left as the graph output: host_runtime's executor cannot yet pass a 0-d tensor
    # to a kernel (np.ascontiguousarray makes it 1-d)
    tail = [helper.make_node("Relu", ["y"], ["z"], name="r")] if ref_shape else []
    m = model([helper.make_node(op, ["x"], ["y"], name="red", **attrs), *tail],
              [("x", F, list(shape))], [("z" if tail else "y", F, list(ref_shape))],
              opset=13 if op != "ReduceSum" or axes is None else 11)
    x = RNG.standard_normal(shape).astype(np.float32)
    mod = check(m, {"x": x}, rtol=1e-5, atol=1e-6, build=True)
    assert mod.meta["fallbacks"] == []
    assert mod.count("numpy") == 0


# ---- ConstantOfShape (how Caffe2-era exports hold their weights) ---------------------------------
@pytest.mark.parametrize("value", [None, np.array([0.02], np.float32), np.array([3], np.int64), np.array([-1.5], np.float32)])
def test_constant_of_shape_is_a_constant_at_import(value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    dtype = TensorProto.FLOAT if value is None else helper.np_dtype_to_tensor_dtype(value.dtype)
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"], name="fill", **attrs),
             helper.make_node("Cast", ["c"], ["cf"], name="cast", to=F),
             helper.make_node("Add", ["x", "cf"], ["y"], name="add")]
    m = model(nodes, [("x", F, [2, 3, 4])], [("y", F, [2, 3, 4]), ("c", dtype, [3, 4])], [("s", np.array([3, 4], np.int64))])
    feeds = {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)}
    check(m, feeds)
    g = from_onnx(m)
    assert g.find("fill/value").is_const


def test_constant_of_shape_of_a_runtime_shape_fails_naming_the_node():
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill")]
    m = model(nodes, [("s", TensorProto.INT64, [2])], [("y", F, ["a", "b"])])
    with pytest.raises(ConversionError, match="ConstantOfShape 'fill': shape .*must be constant.*graph input 's'"):
        from_onnx(m)


# ---- other ops of older vision exports -----------------------------------------------------------
def _one(op, in_shape, opset, attrs=None, inits=()):
    """One node on input x (plus initializers); the output's type from onnxruntime's result."""
    node = helper.make_node(op, ["x", *[n for n, _ in inits]], ["y"], name="the_node", **(attrs or {}))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, list(in_shape))], [],
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    if opset < 9:   # IR 3: initializers are graph inputs too
        m.ir_version = 3
        for n, v in inits:
            m.graph.input.append(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype),
                                                               list(np.shape(v))))
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    m.graph.output.extend(vi for vi in inferred.graph.value_info if vi.name == "y")
    if not m.graph.output:   # experimental ops (ImageScaler) have no shape inference: same as x
        m.graph.output.append(helper.make_tensor_value_info("y", F, list(in_shape)))
    return m


OLD_OPS = {
    "upsample9_nearest": ("Upsample", (1, 2, 3, 3), 9, {"mode": "nearest"}, [("s", np.array([1, 1, 2, 3], np.float32))]),
    "upsample9_linear": ("Upsample", (1, 2, 3, 4), 9, {"mode": "linear"}, [("s", np.array([1, 1, 2, 1.5], np.float32))]),
    "upsample7_attr": ("Upsample", (1, 2, 3, 3), 7, {"mode": "nearest", "scales": [1.0, 1.0, 2.0, 2.0]}, []),
    # onnx's version converter drops Resize-10's asymmetric coordinates; the import restores them
    "resize10_linear_down": ("Resize", (1, 2, 6, 8), 10, {"mode": "linear"}, [("s", np.array([1, 1, 0.5, 0.75], np.float32))]),
    "resize10_nearest_down": ("Resize", (1, 2, 6, 8), 10, {}, [("s", np.array([1, 1, 0.5, 0.75], np.float32))]),
    "resize10_linear_up": ("Resize", (1, 2, 3, 4), 10, {"mode": "linear"}, [("s", np.array([1, 1, 2, 1.5], np.float32))]),
    # ImageScaler (gone from opset 10) is rewritten before the upgrade, which cannot convert it
    "image_scaler": ("ImageScaler", (1, 3, 4, 4), 8, {"scale": 0.5, "bias": [1.0, -2.0, 3.0]}, []),
    "elu": ("Elu", (3, 5), 13, {"alpha": 0.7}, []),
    "selu": ("Selu", (3, 5), 13, {}, []),
    "selu_attrs": ("Selu", (3, 5), 13, {"alpha": 1.5, "gamma": 0.8}, []),
    "softplus": ("Softplus", (3, 5), 13, {}, []),
    "mish": ("Mish", (3, 5), 18, {}, []),
    "expand": ("Expand", (3, 1), 13, {}, [("s", np.array([2, 3, 4], np.int64))]),
    "expand_noop": ("Expand", (2, 3), 13, {}, [("s", np.array([1, 3], np.int64))]),
    "tile": ("Tile", (2, 3), 13, {}, [("r", np.array([2, 3], np.int64))]),
    "depth_to_space_dcr": ("DepthToSpace", (1, 8, 2, 3), 13, {"blocksize": 2}, []),
    "depth_to_space_crd": ("DepthToSpace", (2, 18, 2, 2), 13, {"blocksize": 3, "mode": "CRD"}, []),
    "space_to_depth": ("SpaceToDepth", (1, 2, 4, 6), 13, {"blocksize": 2}, []),
}


@pytest.mark.parametrize("case", sorted(OLD_OPS))
def test_older_vision_ops_match_onnxruntime(case):
    op, shape, opset, attrs, inits = OLD_OPS[case]
    x = (RNG.standard_normal(shape) * 4).astype(np.float32)   # large values: softplus/elu tails
    check(_one(op, shape, opset, attrs, inits), {"x": x}, rtol=1e-5, atol=1e-5)


def test_activation_compositions_compile_without_fallbacks():
    nodes = [helper.make_node("Elu", ["x"], ["a"], name="elu"), helper.make_node("Selu", ["a"], ["b"], name="selu"),
             helper.make_node("Softplus", ["b"], ["c"], name="softplus"), helper.make_node("Mish", ["c"], ["y"], name="mish")]
    m = model(nodes, [("x", F, [2, 16])], [("y", F, [2, 16])], opset=18)
    mod = check(m, {"x": (RNG.standard_normal((2, 16)) * 30).astype(np.float32)}, rtol=1e-5, atol=1e-5, build=True)
    assert mod.meta["fallbacks"] == []


def test_depth_to_space_bad_blocksize_fails_naming_the_node():
    m = _one("DepthToSpace", (1, 6, 2, 2), 13, {"blocksize": 2})
    with pytest.raises(ConversionError, match="DepthToSpace 'the_node': 6 channels are not a multiple"):
        from_onnx(m)


def test_dropout_mask_declared_float_at_old_opsets_is_float_ones():
    """Opsets 7-9 typed the mask like the input; declared so, it imports as float ones."""
    nodes = [helper.make_node("Dropout", ["x"], ["y", "mask"], name="drop", ratio=0.5),
             helper.make_node("Mul", ["y", "mask"], ["z"], name="mul")]
    m = model(nodes, [("x", F, [2, 5])], [("z", F, [2, 5]), ("mask", F, [2, 5])], opset=9)
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    z, mask = run(from_onnx(m), {"x": x})
    assert mask.dtype == np.float32 and (mask == 1).all()
    np.testing.assert_array_equal(z, x)
