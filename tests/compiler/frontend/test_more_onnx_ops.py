"""ONNX ops met in models outside the ones the compiler was built on: comparisons, logic and Where
(attention masks), ArgMax/ArgMin (classifier and segmentation heads), Floor/Ceil/Round/Sign/Sin/Cos,
the Reduce* family, Softsign, ThresholdedRelu, Celu, Shrink, LpNormalization,
MeanVarianceNormalization, GroupNormalization, Size and Range. Each against onnxruntime on the graph
interpreter and compiled for the cpu target with no numpy step."""
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import compiler
from compiler.frontend import ConversionError, ModelLoadError, from_onnx
from compiler.graph import OpError, run
from tests.compiler.frontend import onnx_helpers

RNG = np.random.default_rng(23)
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def model(nodes, inputs, outputs, inits=(), opset=17):
    return onnx_helpers.model(nodes, inputs, outputs, inits, opset=opset, ir_version=8)


def check(m, feeds, rtol=1e-5, atol=1e-5, build=True):
    """The interpreter and the compiled cpu module (all kernels compiled) equal onnxruntime."""
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = run(from_onnx(m), feeds)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype, (g.shape, r.shape, g.dtype, r.dtype)
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    if build:
        mod = compiler.build_model(m, target="cpu")
        assert mod.meta["fallbacks"] == [] and mod.count("numpy") == 0, mod.meta["fallbacks"]
        outs, _ = mod.run(feeds)
        for g, r in zip(outs.values(), ref):
            g = np.asarray(g)
            assert g.dtype == r.dtype and g.size == r.size
            np.testing.assert_allclose(g.reshape(r.shape), r, rtol=rtol, atol=atol)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---- comparisons, logic, Where ----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_comparison_then_where(op):
    """A comparison with broadcasting feeds Where, the way an exported attention mask does."""
    a = np.round(_x(2, 3, 5) * 2)          # rounded so Equal has ties to find
    b = np.round(_x(1, 5) * 2)
    m = model([helper.make_node(op, ["a", "b"], ["c"]),
               helper.make_node("Where", ["c", "a", "fill"], ["y"])],
              [("a", F, [2, 3, 5]), ("b", F, [1, 5])], [("y", F, [2, 3, 5])],
              inits=[("fill", np.float32(-1e9))])
    check(m, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic_ops_on_bool_inputs(op):
    p, q = RNG.random((3, 4)) > 0.5, RNG.random((4,)) > 0.5
    m = model([helper.make_node(op, ["p", "q"], ["r"]), helper.make_node("Not", ["r"], ["y"])],
              [("p", B, [3, 4]), ("q", B, [4])], [("y", B, [3, 4])])
    check(m, {"p": p, "q": q})


def test_integer_mask_input_becomes_additive_mask():
    """A BERT-style int64 attention mask: Equal(mask, 0) -> Where(-inf-ish, scores) -> Softmax."""
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int64)
    scores = _x(2, 5, 5)
    m = model([helper.make_node("Unsqueeze", ["mask", "ax"], ["m3"]),
               helper.make_node("Equal", ["m3", "zero"], ["pad"]),
               helper.make_node("Where", ["pad", "neg", "scores"], ["masked"]),
               helper.make_node("Softmax", ["masked"], ["y"], axis=-1)],
              [("mask", I64, [2, 5]), ("scores", F, [2, 5, 5])], [("y", F, [2, 5, 5])],
              inits=[("ax", np.array([1], np.int64)), ("zero", np.int64(0)), ("neg", np.float32(-1e4))])
    check(m, {"mask": mask, "scores": scores})


def test_where_broadcasts_all_three_inputs():
    c = RNG.random((4, 1)) > 0.5
    m = model([helper.make_node("Where", ["c", "x", "y"], ["z"])],
              [("c", B, [4, 1]), ("x", F, [1, 6]), ("y", F, [4, 6])], [("z", F, [4, 6])])
    check(m, {"c": c, "x": _x(1, 6), "y": _x(4, 6)})


# ---- ArgMax / ArgMin --------------------------------------------------------------------------------
@given(axis=st.integers(-3, 2), keepdims=st.sampled_from([0, 1]), last=st.sampled_from([0, 1]),
       op=st.sampled_from(["ArgMax", "ArgMin"]))
@settings(max_examples=24, deadline=None)
def test_arg_max_min_against_onnxruntime_interpreted(axis, keepdims, last, op):
    x = np.round(_x(3, 4, 5))             # ties, so select_last_index matters
    m = model([helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)],
              [("x", F, [3, 4, 5])], [("y", I64, None)])
    check(m, {"x": x}, build=False)


@pytest.mark.parametrize("axis, keepdims, last", [(1, 1, 0), (-1, 0, 1), (0, 0, 0)])
@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_max_min_compiled(op, axis, keepdims, last):
    """A segmentation head: per-pixel class over the channel axis, compiled."""
    x = np.round(_x(2, 7, 6, 5))
    m = model([helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)],
              [("x", F, [2, 7, 6, 5])], [("y", I64, None)])
    check(m, {"x": x})


@pytest.mark.parametrize("k, axis, largest, outs", [(3, -1, 1, ["v", "i"]), (2, 1, 0, ["v", "i"]),
                                                     (5, 0, 1, ["i"]), (1, 2, 1, ["v"])])
def test_topk(k, axis, largest, outs):
    """Ties go to the lower index; either output alone as the graph's output."""
    x = np.round(_x(5, 4, 6))
    shape = [5, 4, 6]
    shape[axis] = k
    m = model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)], [("x", F, [5, 4, 6])],
              [(o, F if o == "v" else I64, shape) for o in outs], inits=[("k", np.array([k], np.int64))])
    check(m, {"x": x}, build=False)
    mod = compiler.build_model(m, target="cpu")
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, r in zip(mod.run({"x": x})[0].values(), ref):
        np.testing.assert_array_equal(np.asarray(got).reshape(r.shape), r)


# ---- elementwise math --------------------------------------------------------------------------------
@pytest.mark.parametrize("op, attrs", [("Floor", {}), ("Ceil", {}), ("Round", {}), ("Sign", {}), ("Sin", {}),
                                       ("Cos", {}), ("Softsign", {}), ("ThresholdedRelu", {"alpha": 0.3}),
                                       ("Celu", {"alpha": 0.7}), ("Shrink", {"lambd": 0.4, "bias": 0.1}),
                                       ("Shrink", {})])
def test_unary_ops(op, attrs):
    x = _x(3, 37) * 3
    x[0, :6] = [0.5, 1.5, 2.5, -0.5, -1.5, 0.0]    # Round's ties go to even; Sign of 0
    m = model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", F, [3, 37])], [("y", F, [3, 37])])
    check(m, {"x": x}, rtol=1e-5, atol=2e-6)


# ---- reductions ---------------------------------------------------------------------------------------
REDUCE_OPS = ["ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
              "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceSum"]


def _reduce_model(op, axes, keepdims, opset):
    inits, ins = [], ["x"]
    attrs = {"keepdims": keepdims}
    if axes is not None:
        if opset >= 18 or op == "ReduceSum":
            inits, ins = [("axes", np.asarray(axes, np.int64))], ["x", "axes"]
        else:
            attrs["axes"] = axes
    kept = [1 if keepdims else None if axes is None or k in [a % 4 for a in axes] else d
            for k, d in enumerate([2, 3, 4, 5])]
    shape = [1] * 4 if keepdims and axes is None else [d for d in kept if d is not None] if not keepdims else \
        [1 if k in [a % 4 for a in axes] else d for k, d in enumerate([2, 3, 4, 5])]
    return model([helper.make_node(op, ins, ["y"], **attrs)], [("x", F, [2, 3, 4, 5])], [("y", F, shape)],
                 inits=inits, opset=opset)


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes, keepdims, opset", [([1], 1, 13), ([-1, 2], 0, 18), (None, 0, 18), ([0, 3], 1, 18)])
def test_reductions(op, axes, keepdims, opset):
    x = _x(2, 3, 4, 5)
    if op in ("ReduceLogSum",):
        x = np.abs(x) + 0.1
    if op == "ReduceLogSumExp":
        x = x * 30                       # large enough that exp without the max shift overflows
    build = axes == [1] or op in ("ReduceLogSumExp", "ReduceProd", "ReduceMin")
    check(_reduce_model(op, axes, keepdims, opset), {"x": x}, rtol=2e-5, atol=1e-5, build=build)


def test_reduce_axis_out_of_range_is_refused():
    g = helper.make_graph([helper.make_node("ReduceL2", ["x"], ["y"], axes=[4])], "g",
                          [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises((ConversionError, ModelLoadError), match=r"ReduceL2.*axis"):
        from_onnx(m)


# ---- normalizations ----------------------------------------------------------------------------------
@pytest.mark.parametrize("p, axis", [(2, -1), (1, 1), (2, 0)])
def test_lp_normalization(p, axis):
    m = model([helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis)],
              [("x", F, [3, 8, 5])], [("y", F, [3, 8, 5])])
    check(m, {"x": _x(3, 8, 5)})


def test_mean_variance_normalization():
    m = model([helper.make_node("MeanVarianceNormalization", ["x"], ["y"])],
              [("x", F, [2, 3, 4, 5])], [("y", F, [2, 3, 4, 5])],
              opset=11)     # onnx's checker fails on the op's own function body from opset 13 on
    check(m, {"x": _x(2, 3, 4, 5) * 2 + 1}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("groups", [1, 2, 8])
def test_group_normalization(groups):
    c = 8
    scale, bias = _x(c), _x(c)
    m = model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups, epsilon=1e-5)],
              [("x", F, [2, c, 5, 6])], [("y", F, [2, c, 5, 6])], inits=[("s", scale), ("b", bias)], opset=21)
    check(m, {"x": _x(2, c, 5, 6) * 3 + 2}, rtol=1e-4, atol=1e-4)


def test_group_normalization_bad_groups_is_refused():
    m = model([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3)],
              [("x", F, [1, 8, 4, 4])], [("y", F, [1, 8, 4, 4])],
              inits=[("s", np.ones(8, np.float32)), ("b", np.zeros(8, np.float32))], opset=21)
    with pytest.raises(ConversionError, match="num_groups=3 must be >= 1 and divide the 8 channels"):
        from_onnx(m)


def test_size_is_a_constant():
    m = model([helper.make_node("Size", ["x"], ["n"]), helper.make_node("Cast", ["n"], ["f"], to=F),
               helper.make_node("Div", ["x", "f"], ["y"])],
              [("x", F, [3, 4])], [("y", F, [3, 4])])
    check(m, {"x": _x(3, 4)})


@pytest.mark.parametrize("dtype, start, limit, delta", [
    (np.int64, 0, 7, 1), (np.int64, 10, 2, -3), (np.int32, 3, 3, 1), (np.float32, 0.5, 2.0, 0.25),
    (np.float32, 1.0, 0.0, -0.3)])
def test_range_of_constants_is_a_constant(dtype, start, limit, delta):
    """As Swin's shifted-window masks use it: the result added to a cast input."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    n = max(int(np.ceil((limit - start) / delta)), 0)
    m = model([helper.make_node("Range", ["a", "b", "d"], ["r"]), helper.make_node("Cast", ["x"], ["xc"], to=t),
               helper.make_node("Add", ["r", "xc"], ["y"])],
              [("x", F, [max(n, 1)])], [("y", t, [n])],
              inits=[(k, np.array(v, dtype)) for k, v in (("a", start), ("b", limit), ("d", delta))])
    check(m, {"x": np.arange(max(n, 1), dtype=np.float32)}, build=n > 0)


@pytest.mark.parametrize("inits, match", [
    ([("a", np.array(0, np.int64)), ("b", np.array(4, np.int64)), ("d", np.array(0, np.int64))], "delta other than 0"),
    ([("a", np.array(0, np.int64)), ("b", np.array(1 << 40, np.int64)), ("d", np.array(1, np.int64))], "above the limit")])
def test_a_bad_range_is_one_error(inits, match):
    m = model([helper.make_node("Range", ["a", "b", "d"], ["y"])], [], [("y", I64, ["n"])], inits=inits)
    with pytest.raises(ConversionError, match=match):
        from_onnx(m)


def test_a_range_over_a_graph_input_is_refused():
    m = model([helper.make_node("Range", ["a", "n", "d"], ["y"])], [("n", I64, [])], [("y", I64, ["m"])],
              inits=[("a", np.array(0, np.int64)), ("d", np.array(1, np.int64))])
    with pytest.raises(ConversionError, match="limit .* must be constant, but it depends on graph input 'n'"):
        from_onnx(m)


@pytest.mark.parametrize("index, axis", [(-1, 0), (1, 1), (0, 2)])
def test_gather_at_one_constant_index_compiles(index, axis):
    """torch's h_n[-1]: a Gather at a 0-d constant index drops the axis, in a compiled kernel."""
    m = model([helper.make_node("Gather", ["x", "i"], ["g"], axis=axis), helper.make_node("Relu", ["g"], ["y"])],
              [("x", F, [2, 3, 4])], [("y", F, [d for k, d in enumerate([2, 3, 4]) if k != axis])],
              inits=[("i", np.int64(index))])
    check(m, {"x": _x(2, 3, 4)})


@pytest.mark.parametrize("xshape, indices, axis", [
    ((96,), np.arange(96).reshape(96, 1, 1), 0),      # torch.export's reshape of a layer scale
    ((2, 12, 5), np.arange(12).reshape(3, 4) // 2, 1),
    ((3, 10), np.arange(0, 6).reshape(3, 2), 1),
    ((12, 4), np.arange(0, 12, 2).reshape(2, 3), 0),
    ((3, 10), np.array([[[7]]]), 1)])
def test_gather_at_constant_index_arrays_compiles(xshape, indices, axis):
    """Constant indices of any rank whose flat order is an affine-floor map: one kernel, no numpy."""
    out = list(xshape[:axis]) + list(indices.shape) + list(xshape[axis + 1:])
    m = model([helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)], [("x", F, list(xshape))], [("y", F, out)],
              inits=[("i", indices.astype(np.int64))])
    check(m, {"x": _x(*xshape)})


def test_a_declined_kernel_names_its_array_attributes_briefly():
    """A gather at scattered indices becomes a numpy step; its note names the indices by dtype and
    shape, not by printing a thousand of them."""
    idx = RNG.permutation(1000)
    m = model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], [("x", F, [1000])], [("y", F, [1000])],
              inits=[("i", idx.astype(np.int64))])
    mod = compiler.build_model(m, target="cpu")
    note = next(s.note for s in mod.steps if s.kind == "numpy")
    assert "int64[1000]#" in note and len(note) < 400, note


def test_a_float16_model_computes_in_float32():
    """Half models (weights, declared types, a Cast to float16) are widened at load: they compile
    with no numpy step, take a float16 feed, and match onnxruntime on the same model in float32."""
    w, b = (_x(8, 3, 3, 3) * 0.3).astype(np.float16), _x(8).astype(np.float16)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT16)]
    half = model(nodes, [("x", TensorProto.FLOAT16, [1, 3, 6, 6])], [("y", TensorProto.FLOAT16, [1, 8, 6, 6])],
                 inits=[("w", w), ("b", b)])
    wide = model(nodes[:2] + [helper.make_node("Identity", ["r"], ["y"])], [("x", F, [1, 3, 6, 6])],
                 [("y", F, [1, 8, 6, 6])], inits=[("w", w.astype(np.float32)), ("b", b.astype(np.float32))])
    x = _x(1, 3, 6, 6).astype(np.float16)
    ref = ort.InferenceSession(wide.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.float32)})[0]
    got = run(from_onnx(half), {"x": x.astype(np.float32)})[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    mod = compiler.build_model(half, target="cpu")
    assert mod.meta["fallbacks"] == [] and mod.count("numpy") == 0
    out = np.asarray(next(iter(mod.run({"x": x})[0].values())))
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [2, -3])
def test_an_axis_outside_the_rank_is_one_error(axis):
    """CumSum's axis is an input, which onnx's checker does not look at: the converter says which
    axis and rank."""
    m = model([helper.make_node("CumSum", ["x", "ax"], ["y"], name="cs")], [("x", F, [3, 4])], [("y", F, [3, 4])],
              inits=[("ax", np.array(axis, np.int64))])
    with pytest.raises(ConversionError, match=rf"^CumSum 'cs': axis {axis} out of range for rank 2$"):
        from_onnx(m)


@pytest.mark.parametrize("op, idx, upd", [("GatherElements", [[0, 3], [1, -4]], None),
                                          ("ScatterElements", [[0, 1], [5, 0]], [[1.0, 2.0], [3.0, 4.0]])])
def test_a_runtime_index_outside_its_axis_is_one_error(op, idx, upd):
    """Indices given at run time are checked against the axis before the NumPy step reads or writes
    (interpreted and compiled): the error names the op, the index and the range."""
    ins = [("x", F, [2, 3]), ("i", I64, [2, 2])] + ([("u", F, [2, 2])] if upd is not None else [])
    m = model([helper.make_node(op, [n for n, _, _ in ins], ["y"], axis=1)], ins,
              [("y", F, [2, 2] if upd is None else [2, 3])])
    feeds = {"x": _x(2, 3), "i": np.array(idx, np.int64)}
    if upd is not None:
        feeds["u"] = np.array(upd, np.float32)
    bad = 3 if upd is None else 5
    match = rf"{'gather' if upd is None else 'scatter'}_elements: index {bad} out of range \[-3, 2\] for axis 1"
    with pytest.raises(OpError, match=rf"^{'gather' if upd is None else 'scatter'}_elements '{op}_0': .*{match}"):
        run(from_onnx(m), feeds)
    mod = compiler.build_model(m, target="cpu")
    with pytest.raises(Exception, match=match):
        mod.run(feeds)
