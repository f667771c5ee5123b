"""ONNX Einsum lowered to transposes, reshapes, strided slices, reduce_sum and matmul/mul
(compiler/frontend/einsum.py): the equations real models export, checked against onnxruntime
interpreted and compiled for the cpu target; random two-operand equations against numpy.einsum;
the graph each lowering makes; and one error per way an equation can be wrong."""
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import compiler
from compiler.frontend import CONVERTERS, from_onnx
from compiler.frontend.einsum import EinsumError, check_syntax, parse_equation
from compiler.frontend.errors import ConversionError, ModelLoadError
from compiler.frontend.onnx_import import _Ctx
from compiler.graph import run
from compiler.graph.ir import Graph, Node, topo_order

RNG = np.random.default_rng(7)


def _model(eq, shapes, out_rank=None, elem=TensorProto.FLOAT, opset=17):
    """One Einsum node 'ein' on inputs x0, x1, ...; the output's dims are symbolic (its rank from
    numpy unless given), so that onnx's checker never disagrees about the output shape."""
    if out_rank is None:
        out_rank = np.einsum(eq.replace(" ", ""), *(np.zeros(s) for s in shapes)).ndim
    ins = [helper.make_tensor_value_info(f"x{k}", elem, list(s)) for k, s in enumerate(shapes)]
    node = helper.make_node("Einsum", [f"x{k}" for k in range(len(shapes))], ["y"], equation=eq, name="ein")
    g = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info("y", elem, [f"d{i}" for i in range(out_rank)])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _feeds(shapes):
    return {f"x{k}": RNG.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes)}


def _close(got, ref):
    assert got.shape == ref.shape
    scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * scale)


def _check(eq, shapes, compile_too=True, against_ort=True):
    m = _model(eq, shapes)
    feeds = _feeds(shapes)
    if against_ort:
        ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    else:
        ref = np.einsum(eq.replace(" ", ""), *feeds.values())
    _close(run(from_onnx(m), feeds)[0], ref)
    if compile_too:
        mod = compiler.build_model(m, target="cpu")
        assert mod.meta["fallbacks"] == [] and mod.count("numpy") == 0
        _close(next(iter(mod.run(feeds)[0].values())), ref)


def _convert(eq, shapes):
    """The Einsum converter alone on graph inputs x0, x1, ... (for what onnx's checker reports
    before the converter sees it); its output node."""
    c = _Ctx(17)
    c.onnx_node = helper.make_node("Einsum", [f"x{k}" for k in range(len(shapes))], ["y"], equation=eq, name="ein")
    c.node_name = "ein"
    for k, s in enumerate(shapes):
        c.env[f"x{k}"] = Node.input(f"x{k}", s)
        c.nodes.append(c.env[f"x{k}"])
    return CONVERTERS["Einsum"](c)


def _graph_of(y):
    nodes = topo_order([y])
    return Graph(nodes, [n for n in nodes if n.op == "input"], [y])


MODEL_EQUATIONS = [
    ("bhid,bhjd->bhij", [(2, 3, 4, 5), (2, 3, 6, 5)]),        # attention scores
    ("bhij,bhjd->bhid", [(2, 3, 4, 6), (2, 3, 6, 5)]),        # attention context
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bi,bi->b", [(3, 4), (3, 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii->", [(4, 4)]),
    ("bnqd,bnkd->bnqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 2)]),
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),
    ("nchw,kc->nkhw", [(2, 3, 4, 5), (6, 3)]),
    ("b i d, b j d -> b i j", [(2, 3, 4), (2, 5, 4)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 5)]),
]


@pytest.mark.parametrize("eq, shapes", MODEL_EQUATIONS, ids=[e.replace(" ", "") for e, _ in MODEL_EQUATIONS])
def test_model_equations_match_onnxruntime(eq, shapes):
    _check(eq, shapes)


def test_an_opset_12_einsum_imports_after_the_upgrade():
    shapes = [(2, 3, 4), (2, 4, 5)]
    feeds = _feeds(shapes)
    _close(run(from_onnx(_model("bij,bjk->bik", shapes, opset=12)), feeds)[0], np.einsum("bij,bjk->bik", *feeds.values()))


@pytest.mark.parametrize("eq, shapes", [
    ("ij,jk", [(3, 4), (4, 5)]),                    # implicit output
    ("ij,ij->ij", [(3, 4), (3, 4)]),                # elementwise
    ("ij,ij->ji", [(3, 4), (3, 4)]),
    ("ijk,ijk->", [(2, 3, 4), (2, 3, 4)]),          # full contraction
    ("ij,jk->ik", [(3, 1), (5, 4)]),                # a size-1 index broadcasts
    ("...ij,...jk->...ik", [(2, 1, 4, 5), (1, 3, 5, 2)]),   # '...' broadcasts
    ("iij->ji", [(3, 3, 2)]),
    ("iii->i", [(3, 3, 3)]),
    ("...ii->...i", [(2, 3, 3)]),
    (",ij->ij", [(), (2, 3)]),                      # a scalar operand
    ("nchw,c->nchw", [(2, 3, 4, 5), (3,)]),
    ("ij,jk,kl->li", [(2, 3), (3, 4), (4, 5)]),
    ("a,b,c->abc", [(2,), (3,), (4,)]),
    ("Ba->aB", [(2, 3)]),
])
def test_more_equations_match_onnxruntime(eq, shapes):
    _check(eq, shapes, compile_too=False)


@pytest.mark.parametrize("eq, shapes", [
    ("Ba", [(2, 3)]),                               # implicit output, ASCII order (onnxruntime refuses capitals here)
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (3, 5, 2)]),   # '...' of different ranks, right-aligned
])
def test_numpy_semantics_beyond_onnxruntime(eq, shapes):
    """What numpy accepts and this lowering follows ('...' of different ranks onnx's checker
    refuses: it goes through the converter alone)."""
    feeds = _feeds(shapes)
    ref = np.einsum(eq, *feeds.values())
    if eq == "Ba":
        _close(run(from_onnx(_model(eq, shapes)), feeds)[0], ref)
    else:
        y = _convert(eq, shapes)
        _close(run(_graph_of(y), feeds)[0], ref)


@pytest.mark.parametrize("eq, shapes", [
    ("i,i->", [(4,), (4,)]),
    ("ij,kj", [(2, 3), (4, 1)]),
    ("nchw,c->nchw", [(2, 3, 4, 5), (3,)]),
    (",ij->ij", [(), (2, 3)]),
    ("abcde,abcde->edcba", [(2, 3, 2, 3, 2), (2, 3, 2, 3, 2)]),
    ("iij->ji", [(3, 3, 2)]),
    ("ii->i", [(40, 40)]),                          # a diagonal step past what a take kernel maps
    ("iii->i", [(4, 4, 4)]),
])
def test_compiled_lowerings_match_numpy(eq, shapes):
    _check(eq, shapes, against_ort=False)


def _ops(eq, shapes):
    return [(n.op, n.name) for n in from_onnx(_model(eq, shapes)).ops]


def test_a_batched_matmul_is_one_matmul_named_as_the_onnx_node():
    assert _ops("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]) == [("matmul", "ein")]
    assert _ops("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]) == [("matmul", "ein/matmul1"), ("matmul", "ein")]


def test_an_elementwise_product_is_one_mul():
    assert _ops("ij,ij->ij", [(3, 4), (3, 4)]) == [("mul", "ein")]


def test_attention_scores_transpose_only_the_keys():
    ops = [op for op, _ in _ops("bhid,bhjd->bhij", [(2, 3, 4, 5), (2, 3, 6, 5)])]
    assert ops.count("transpose") == 1 and ops.count("matmul") == 1 and set(ops) <= {"transpose", "matmul", "reshape"}


def test_a_1x1_projection_broadcasts_the_weight_without_transposes():
    """N C H W x K C -> N K H W: (1, K, C) @ (N, C, HW), no transpose on either side."""
    ops = [op for op, _ in _ops("nchw,kc->nkhw", [(2, 3, 4, 5), (6, 3)])]
    assert "transpose" not in ops and ops.count("matmul") == 1


def test_a_diagonal_is_one_strided_slice_and_a_trace_adds_one_sum():
    assert [op for op, _ in _ops("ii->i", [(4, 4)])] == ["reshape", "slice"]
    assert [op for op, _ in _ops("ii->", [(4, 4)])] == ["reshape", "slice", "reduce_sum"]
    assert [op for op, _ in _ops("iijj->ij", [(3, 3, 2, 2)])] == ["reshape", "slice"]


def test_an_identity_equation_adds_no_node():
    assert _ops("ij->ij", [(2, 3)]) == [] and _ops("ij", [(2, 3)]) == []


# ---- random two-operand equations --------------------------------------------------------------------
@st.composite
def _equations(draw, operands=2):
    """(equation, shapes): `operands` operands over up to 5 letters (repeats: diagonals), sizes 1-5, a
    size-1 dim now and then (broadcast), '...' sometimes, an implicit or an explicit output."""
    letters = draw(st.lists(st.sampled_from("abcdijkXY"), min_size=1, max_size=5, unique=True))
    size = {x: draw(st.integers(1, 5)) for x in letters}
    ell = draw(st.lists(st.integers(1, 3), max_size=2)) if draw(st.booleans()) else None
    texts, shapes = [], []
    for _ in range(operands):
        term = draw(st.lists(st.sampled_from(letters), max_size=4))
        dims = [size[x] if term.count(x) > 1 or draw(st.integers(0, 5)) else 1 for x in term]
        if ell is not None and draw(st.booleans()):
            at = draw(st.integers(0, len(term)))
            ell_dims = [d if draw(st.integers(0, 3)) else 1 for d in ell]
            term, dims = term[:at] + ["..."] + term[at:], dims[:at] + ell_dims + dims[at:]
        texts.append("".join(term))
        shapes.append(tuple(dims))
    eq = ",".join(texts)
    if draw(st.booleans()):
        used = sorted({x for t in texts for x in t if x != "."})
        out = draw(st.permutations(used))[:draw(st.integers(0, len(used)))]
        if "..." in eq:
            at = draw(st.integers(0, len(out)))
            out = out[:at] + ["..."] + out[at:]
        eq += "->" + "".join(out)
    if draw(st.booleans()):
        eq = eq.replace(",", " , ").replace("->", " -> ")
    return eq, shapes


@settings(max_examples=60, deadline=None)
@given(case=_equations())
def test_random_equations_match_numpy(case):
    eq, shapes = case
    feeds = _feeds(shapes)
    ref = np.einsum(eq.replace(" ", ""), *feeds.values())
    _close(run(from_onnx(_model(eq, shapes, ref.ndim)), feeds)[0], ref)


# ---- errors ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eq, shapes, message", [
    ("ij->j->i", [(2, 3)], r"equation 'ij->j->i' has more than one '->'"),
    ("i$j->ij", [(2, 3)], r"input 0's term 'i\$j' has the character '\$'; indices are letters"),
    ("i..j->ij", [(2, 3)], r"input 0's term 'i\.\.j' has a '\.' that is not part of '\.\.\.'"),
    ("...i...->i", [(2, 3)], r"input 0's term '\.\.\.i\.\.\.' has '\.\.\.' twice"),
    ("ij->i,j", [(2, 3)], r"the output 'i,j' has the character ','"),
    ("ij,jk", [(2, 3)], r"equation 'ij,jk' has 2 operand\(s\) but the node has 1 input\(s\)"),
    ("ij->ik", [(2, 3)], r"output index 'k' appears in no input"),
    ("ij->ii", [(2, 3)], r"output index 'i' appears 2 times in 'ii'"),
    ("ijk->i", [(2, 3)], r"input 0 has rank 2 but its term 'ijk' names 3 indices"),
    ("ij...->i", [(2,)], r"input 0 has rank 1, less than the 2 indices of its term 'ij\.\.\.'"),
    ("...ij->ij", [(4, 2, 3)], r"the inputs' '\.\.\.' covers 1 dimension\(s\) but the output 'ij' has no '\.\.\.'"),
    ("ij,jk->ik", [(2, 3), (4, 5)], r"index 'j' has size 3 in input 0 \('x0'\) and 4 in input 1 \('x1'\)"),
    ("ii->i", [(3, 1)], r"index 'i' repeats in input 0 \('x0'\) with sizes 3 and 1"),
    ("...i,...i->...i", [(2, 3), (4, 3)], r"the '\.\.\.' dimensions of input 0 \('x0'\) \[2\] and input 1 "
                                          r"\('x1'\) \[4\] do not broadcast"),
])
def test_a_bad_equation_is_one_error_naming_the_problem(eq, shapes, message):
    with pytest.raises(ConversionError, match=r"^Einsum 'ein': " + message) as e:
        _convert(eq, shapes)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("eq, shapes, out_rank, message", [
    ("ij->j->i", [(2, 3)], 2, "more than one '->'"),
    ("ij->ii", [(2, 3)], 2, "output index 'i' appears 2 times"),
    ("ij,jk->ik", [(2, 3), (4, 5)], 2, "index 'j' has size 3 in input 0"),
    ("ii->i", [(3, 1)], 1, "index 'i' repeats in input 0"),
])
def test_bad_equations_that_pass_onnx_checker_fail_at_import(eq, shapes, out_rank, message):
    """A malformed equation fails when the model loads (ModelLoadError), one that does not fit its
    operands when it converts (ConversionError); both name the node."""
    with pytest.raises((ConversionError, ModelLoadError), match=r"Einsum 'ein': .*" + message):
        from_onnx(_model(eq, shapes, out_rank=out_rank))


def test_a_rank_that_does_not_fit_the_term_fails_at_import():
    """onnx's checker checks ranks against the declared shapes; shapes= overrides them."""
    m = _model("ij,jk->ik", [("m", "k"), ("k", "n")], out_rank=2)
    with pytest.raises(ConversionError, match=r"Einsum 'ein': input 1 has rank 3 but its term 'jk' names 2 indices"):
        from_onnx(m, shapes={"x0": (2, 3), "x1": (3, 4, 5)})


def test_what_onnx_checker_refuses_is_a_load_error():
    with pytest.raises(ModelLoadError, match="Number of input tensors does not match"):
        from_onnx(_model("ij,jk->ik", [(2, 3)], out_rank=2))
    with pytest.raises(ModelLoadError, match="label missing from the inputs"):
        from_onnx(_model("ij->ik", [(2, 3)], out_rank=2))


def test_integer_inputs_are_refused():
    with pytest.raises(ConversionError, match=r"Einsum 'ein': input 0 \('x0'\) is int32; only float inputs"):
        from_onnx(_model("ij->ji", [(2, 3)], elem=TensorProto.INT32))


def test_parse_equation_expands_ellipsis_right_aligned():
    assert parse_equation("...ij,j...->...i", [4, 2]) == (
        [["...0", "...1", "i", "j"], ["j", "...1"]], ["...0", "...1", "i"])
    assert parse_equation("Ba", [2]) == ([["B", "a"]], ["B", "a"])
    assert parse_equation(" b i , b j ", [2, 2]) == ([["b", "i"], ["b", "j"]], ["i", "j"])
    with pytest.raises(EinsumError, match="has more than one"):
        parse_equation("i->i->i", [1])


@pytest.mark.parametrize("eq", ["i-j", "i$j->ij", "i..j->ij", ".ij->ij", "i...j...->ij", "ij->j->i"])
def test_check_syntax_refuses_what_hangs_onnx_shape_inference(eq):
    """onnx 1.23's Einsum shape inference (so its full checker, and onnxruntime) never returns on
    most of these; check_syntax answers without onnx."""
    with pytest.raises(EinsumError):
        check_syntax(eq)
    check_syntax("b i d, b j d -> b i j")


@pytest.mark.parametrize("eq", ["i$j->ij", "i..j->ij", "...i...->i"])
def test_the_loader_refuses_an_equation_that_would_hang_onnx(eq):
    """A crafted model must not stall load_model: the equation is checked before onnx's checker and
    shape inference run (they never return on these), in the main graph and inside subgraphs."""
    with pytest.raises(ModelLoadError, match=r"Einsum 'ein': input 0's term"):
        from_onnx(_model(eq, [(2, 2)], out_rank=2))
    inner = helper.make_graph([helper.make_node("Einsum", ["x0"], ["t"], name="ein", equation=eq)], "then", [],
                              [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    cond = helper.make_node("If", ["c"], ["y"], then_branch=inner, else_branch=inner)
    g = helper.make_graph([cond], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                        helper.make_tensor_value_info("x0", TensorProto.FLOAT, [2, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(ModelLoadError, match=r"Einsum 'ein'"):
        from_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
