"""Each tir pass on a small Before function, compared structurally with the Expected one."""
import logging

import pytest

from compiler.errors import PassError
from compiler.tir import (
    Allocate,
    Buffer,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    PrimFunc,
    SeqStmt,
    Var,
    assert_structural_equal,
    const,
    seq,
)
from compiler.tir import expr as E
from compiler.tir.passes import PIPELINES, get_pass, run_pipeline


def func(body, *params):
    return PrimFunc("f", list(params), body)


def flat(f):
    f.attrs["flattened"] = True
    return f


def test_simplify_folds_unit_loops_and_true_guards():
    A, B = Buffer("A", (8,)), Buffer("B", (32,))
    i, j = Var("i"), Var("j")
    before = func(For(i, 0, 8, "serial", For(j, 0, 1, "serial", IfThenElse(
        i * 4 + j < 100, BufferStore(B, A.vload([i + 0]), [i * 4 + j * 2])))), A, B)
    expected = func(For(i, 0, 8, "serial", BufferStore(B, A.vload([i]), [i * 4])), A, B)
    assert_structural_equal(get_pass("Simplify")(before), expected)


def test_simplify_drops_false_branch_and_empty_loop():
    B = Buffer("B", (8,))
    i = Var("i")
    before = func(seq(For(i, 0, 8, "serial", IfThenElse(i >= 8, B.vstore([i], 1.0))),
                      B.vstore([0], 2.0)), B)
    expected = func(B.vstore([0], 2.0), B)
    assert_structural_equal(get_pass("Simplify")(before), expected)


def test_flatten_storage_row_major_and_views():
    Bf = Buffer("B", (4, 8))
    i, j = Var("i"), Var("j")
    view = Buffer("B.v", (2, 2), strides=(8, 1), elem_offset=8, base=Bf)
    before = func(seq(For(i, 0, 4, "serial", For(j, 0, 8, "serial", Bf.vstore([i, j], 0.0))),
                      view.vstore([1, 1], 1.0)), Bf)
    after = get_pass("Simplify")(get_pass("FlattenStorage")(before))
    expected = func(seq(For(i, 0, 4, "serial", For(j, 0, 8, "serial", BufferStore(Bf, const(0.0), [i * 8 + j]))),
                        BufferStore(Bf, const(1.0), [const(17)])), Bf)
    assert_structural_equal(after, expected)
    assert after.attrs["flattened"]


def test_partition_loops_peels_split_tail():
    B = Buffer("B", (10,))
    io, ii = Var("io"), Var("ii")
    before = func(For(io, 0, 3, "serial", For(ii, 0, 4, "serial",
                                              IfThenElse(io * 4 + ii < 10, B.vstore([io * 4 + ii], 1.0)))), B)
    after = get_pass("Simplify")(get_pass("PartitionLoops")(before))
    expected = func(seq(For(io, 0, 2, "serial", For(ii, 0, 4, "serial", B.vstore([io * 4 + ii], 1.0))),
                        For(ii, 0, 2, "serial", B.vstore([ii + 8], 1.0))), B)
    assert_structural_equal(after, expected)


def test_partition_loops_padding_window():
    A, P = Buffer("A", (6,)), Buffer("P", (8,))
    i = Var("i")
    before = func(For(i, 0, 8, "serial", P.vstore([i], E.select(E.logical_and(i >= 1, i < 7),
                                                                A.vload([i - 1]), 0.0))), A, P)
    after = get_pass("Simplify")(get_pass("PartitionLoops")(before))
    expected = func(seq(P.vstore([0], 0.0), For(i, 1, 6, "serial", P.vstore([i], A.vload([i - 1]))),
                        P.vstore([7], 0.0)), A, P)
    assert_structural_equal(after, expected)


def test_unroll_loops():
    A, B = Buffer("A", (3,)), Buffer("B", (3,))
    k = Var("k")
    before = func(For(k, 0, 3, "unrolled", B.vstore([k], A.vload([k]))), A, B)
    expected = func(seq(*[B.vstore([c], A.vload([c])) for c in range(3)]), A, B)
    assert_structural_equal(get_pass("Simplify")(get_pass("UnrollLoops")(before)), expected)


def test_vectorize_contiguous_loop_becomes_ramp():
    A, B = Buffer("A", (64,)), Buffer("B", (64,))
    i, j = Var("i"), Var("j")
    before = flat(func(For(i, 0, 8, "serial", For(j, 0, 8, "vectorized",
                                                  B.vstore([i * 8 + j], A.vload([i * 8 + j]) * 2.0))), A, B))
    r = E.Ramp(i * 8, const(1), 8)
    expected = func(For(i, 0, 8, "serial", BufferStore(
        B, E.Mul(E.BufferLoad(A, [r]), E.Broadcast(const(2.0), 8)), [r])), A, B)
    assert_structural_equal(get_pass("Simplify")(get_pass("VectorizeLoops")(before)), expected)


def test_vectorize_strided_access_is_gather_ramp():
    A, B = Buffer("A", (64,)), Buffer("B", (8,))
    j = Var("j")
    before = flat(func(For(j, 0, 8, "vectorized", B.vstore([j], A.vload([j * 8]))), A, B))
    after = get_pass("Simplify")(get_pass("VectorizeLoops")(before))
    expected = func(BufferStore(B, E.BufferLoad(A, [E.Ramp(const(0), const(8), 8)]),
                                [E.Ramp(const(0), const(1), 8)]), A, B)
    assert_structural_equal(after, expected)


def test_vectorize_reduction_axis_falls_back_to_serial(caplog):
    A, C = Buffer("A", (4,)), Buffer("C", (1,))
    k = Var("k")
    before = flat(func(For(k, 0, 4, "vectorized", C.vstore([0], C.vload([0]) + A.vload([k]))), A, C))
    with caplog.at_level(logging.INFO, logger="compiler.tir.passes.vectorize"):
        after = get_pass("VectorizeLoops")(before)
    expected = func(For(k, 0, 4, "serial", C.vstore([0], C.vload([0]) + A.vload([k]))), A, C)
    assert_structural_equal(after, expected)
    assert "reduction over the vectorized axis" in caplog.text


def test_lower_virtual_thread_serializes():
    B = Buffer("B", (4,))
    v = Var("vt")
    before = func(For(v, 0, 4, ForKind.VTHREAD, B.vstore([v], 1.0), thread_tag="vthread"), B)
    expected = func(For(v, 0, 4, "serial", B.vstore([v], 1.0)), B)
    assert_structural_equal(get_pass("LowerVirtualThread")(before), expected)


def test_remove_no_op():
    B = Buffer("B", (4,))
    i, j = Var("i"), Var("j")
    T = Buffer("T", (4,))
    before = func(SeqStmt([For(i, 0, 4, "serial", Evaluate(0)), Allocate(T, Evaluate(0)),
                           For(j, 0, 4, "serial", B.vstore([j], 1.0))]), B)
    expected = func(For(j, 0, 4, "serial", B.vstore([j], 1.0)), B)
    assert_structural_equal(get_pass("RemoveNoOp")(before), expected)


def test_structural_equal_detects_differences():
    B = Buffer("B", (4,))
    i = Var("i")
    a = func(For(i, 0, 4, "serial", B.vstore([i], 1.0)), B)
    b = func(For(i, 0, 4, "serial", B.vstore([i + 1], 1.0)), B)
    with pytest.raises(AssertionError, match="IR differs"):
        assert_structural_equal(a, b)


def test_pipeline_registry_errors_name_the_options():
    B = Buffer("B", (4,))
    f = func(B.vstore([0], 1.0), B)
    with pytest.raises(PassError, match="unknown pass 'Nope'; registered: .*Simplify"):
        run_pipeline(f, ["Nope"])
    with pytest.raises(PassError, match="unknown pipeline 'fast'; known: default"):
        run_pipeline(f, "fast")
    assert all(reason for _, reason in PIPELINES["default"])


def test_printer_is_readable():
    A, B = Buffer("A", (4, 4)), Buffer("B", (4,))
    i, k = Var("i"), Var("k")
    T = Buffer("T", (4,), scope="acc_buffer")
    f = func(Allocate(T, For(i, 0, 4, ForKind.PARALLEL, seq(
        T.vstore([i], 0.0),
        For(k, 0, 4, "serial", T.vstore([i], T.vload([i]) + A.vload([i, k]))),
        B.vstore([i], E.select(T.vload([i]) > 0.0, T.vload([i]), 0.0))))), A, B)
    text = f.script()
    assert text.splitlines() == [
        "def f(A: float32[4, 4], B: float32[4]):",
        "  T = allocate(float32[4], scope='acc_buffer')",
        "  for i in parallel(4):",
        "    T[i] = 0.0f",
        "    for k in range(4):",
        "      T[i] = T[i] + A[i, k]",
        "    B[i] = select(T[i] > 0.0f, T[i], 0.0f)",
    ]
