"""Tensor expressions: dtype rules, compute construction and the errors for bad bodies."""
import numpy as np
import pytest

from compiler import te
from compiler.errors import DTypeError, ExprError, ShapeError
from compiler.tir import dtype as dt
from compiler.tir import expr as E
from tests.compiler.conftest import run_schedule


def test_dtype_promote_rules():
    assert dt.promote("int8", "int32") == "int32"
    assert dt.promote("int32", "float16") == "float16"
    assert dt.promote("float16", "float32") == "float32"
    assert dt.promote("int8", "uint8") == "int16"
    with pytest.raises(DTypeError, match="bool"):
        dt.promote("bool", "int32")
    with pytest.raises(DTypeError, match="unknown dtype 'float8'"):
        dt.check("float8")


def test_expr_python_constants_take_the_other_operand_dtype():
    x = E.Var("x", "int8")
    assert (x + 1).dtype == "int8"
    y = E.Var("y", "float16")
    assert (y * 2.0).dtype == "float16"
    assert (E.Var("i") + 1.5).dtype == "float32"


def test_integer_true_division_is_refused():
    i = E.Var("i")
    with pytest.raises(DTypeError, match="use //"):
        i / 2
    assert isinstance(i // 2, E.FloorDiv) and isinstance(i % 2, E.FloorMod)


def test_symbolic_condition_has_no_python_truth_value():
    i = E.Var("i")
    with pytest.raises(ExprError, match="te.select"):
        bool(i < 3)
    assert bool(i == i) and not bool(i == E.Var("j"))


def test_compute_builds_axes_from_lambda_names():
    A = te.placeholder((3, 4), name="A")
    B = te.compute((3, 4), lambda row, col: A[row, col] + 1.0, name="B")
    assert [a.var.name for a in B.op.axis] == ["row", "col"]
    assert B.shape == (3, 4) and B.dtype == "float32"
    assert B.op.input_tensors() == [A]


def test_wrong_number_of_indices_names_the_tensor():
    A = te.placeholder((3, 4), name="A")
    with pytest.raises(ShapeError, match="tensor 'A' has 2 dimension"):
        te.compute((3,), lambda i: A[i], name="B")


def test_out_of_bounds_read_names_tensor_and_axis():
    A = te.placeholder((8, 8), name="A")
    with pytest.raises(ShapeError, match=r"axis 1 of 'A' has extent 8") as ei:
        te.compute((8, 8), lambda i, j: A[i, j + 1], name="B")
    assert "compute 'B'" in str(ei.value) and "[1, 8]" in str(ei.value)


def test_guarded_read_is_allowed():
    A = te.placeholder((8,), name="A")
    P = te.compute((10,), lambda i: te.if_then_else(te.all(i >= 1, i < 9), A[i - 1], 0.0), name="P")
    assert P.shape == (10,)


def test_constant_index_outside_shape():
    A = te.placeholder((4,), name="A")
    with pytest.raises(ShapeError, match="constant index 4"):
        A[4]


def test_lambda_arity_must_match_shape():
    with pytest.raises(ShapeError, match="2 dimension"):
        te.compute((2, 2), lambda i: i, name="X")


def test_reduction_must_be_whole_body():
    A = te.placeholder((4, 4), name="A")
    k = te.reduce_axis(4, "k")
    with pytest.raises(ExprError, match="whole body"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) * 2.0, name="B")


def test_reduce_axis_outside_reduction_is_rejected():
    A = te.placeholder((4, 4), name="A")
    k = te.reduce_axis(4, "k")
    with pytest.raises(ExprError, match="variable 'k'"):
        te.compute((4,), lambda i: A[i, k], name="B")


def test_bad_shapes_are_named():
    with pytest.raises(ShapeError, match="tensor 'A' axis 1: extent 0"):
        te.placeholder((2, 0), name="A")
    with pytest.raises(ShapeError, match="symbolic"):
        te.placeholder((E.Var("n"),), name="A")


def test_select_cast_and_math_compute(rng):
    A = te.placeholder((64,), "float32", name="A")
    B = te.compute((64,), lambda i: te.select(A[i] > 0.5, te.exp(A[i]), te.sqrt(A[i])), name="B")
    C = te.compute((64,), lambda i: (B[i] * 10.0).astype("int32"), name="C")
    s = te.create_schedule(C)
    a = rng.random(64, dtype=np.float32)
    out = run_schedule(s, [A, C], [a])
    ref = (np.where(a > 0.5, np.exp(a), np.sqrt(a)) * 10).astype(np.int32)
    assert np.abs(out - ref).max() <= 1


@pytest.mark.parametrize("red,npf", [(te.sum, np.sum), (te.max, np.max), (te.min, np.min)])
def test_reductions(red, npf, rng):
    A = te.placeholder((6, 10), name="A")
    k = te.reduce_axis((2, 9), "k")
    B = te.compute((6,), lambda i: red(A[i, k], axis=k), name="B")
    a = rng.random((6, 10), dtype=np.float32)
    out = run_schedule(te.create_schedule(B), [A, B], [a])
    np.testing.assert_allclose(out, npf(a[:, 2:9], axis=1), rtol=1e-5)


def test_reduction_where_condition(rng):
    A = te.placeholder((8, 8), name="A")
    k = te.reduce_axis(8, "k")
    B = te.compute((8,), lambda i: te.sum(A[i, k], axis=k, where=k <= i), name="B")
    a = rng.random((8, 8), dtype=np.float32)
    out = run_schedule(te.create_schedule(B), [A, B], [a])
    np.testing.assert_allclose(out, np.tril(a).sum(1), rtol=1e-5)


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"])
def test_dtypes_roundtrip(dtype, rng):
    A = te.placeholder((16,), dtype, name="A")
    B = te.compute((16,), lambda i: A[i] + A[i], name="B")
    a = rng.integers(0, 50, 16).astype(dtype)
    out = run_schedule(te.create_schedule(B), [A, B], [a])
    np.testing.assert_array_equal(out, a + a)


def test_bool_tensor(rng):
    A = te.placeholder((16,), "float32", name="A")
    M = te.compute((16,), lambda i: A[i] > 0.5, name="M")
    B = te.compute((16,), lambda i: te.select(M[i], 1, 0), name="B")
    s = te.create_schedule(B)
    a = rng.random(16, dtype=np.float32)
    out = run_schedule(s, [A, B], [a])
    np.testing.assert_array_equal(out, (a > 0.5).astype(np.int32))
