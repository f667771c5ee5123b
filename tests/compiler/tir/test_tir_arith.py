"""Arithmetic on index expressions: linear normal form, bounds, simplification rules."""
import pytest

from compiler.tir import expr as E
from compiler.tir.arith import Analyzer, linear
from compiler.tir.functor import structural_equal


@pytest.fixture
def v():
    return {n: E.Var(n) for n in ("i", "j", "f", "x")}


def ana(v, **ranges):
    return Analyzer({v[k]: r for k, r in ranges.items()})


def same(a, b):
    return structural_equal(a, b, map_free_vars=False)


def test_linear_cancels_terms(v):
    i = v["i"]
    lin = linear((i * 4 + 3) - i * 4 + 1)
    assert lin.is_const() and lin.const == 4


def test_split_index_divmod_folds(v):
    a = ana(v, i=(0, 7), j=(0, 3))
    i, j = v["i"], v["j"]
    assert a.simplify((i * 4 + j) // 4) is i
    assert a.simplify((i * 4 + j) % 4) is j


def test_fuse_index_recombines(v):
    f = v["f"]
    a = ana(v, f=(0, 63))
    assert a.simplify((f // 8) * 8 + f % 8) is f


def test_nested_floordiv_merges(v):
    a = ana(v, f=(0, 63))
    out = a.simplify(E.floordiv(E.floordiv(v["f"], 4), 2))
    assert same(out, E.FloorDiv(v["f"], E.const(8)))


def test_divisible_part_pulled_out_of_floordiv(v):
    a = Analyzer()
    out = a.simplify((v["x"] * 8 + v["j"]) // 8)
    assert same(out, E.Add(v["x"], E.FloorDiv(v["j"], E.const(8))))


def test_comparisons_decided_by_ranges(v):
    a = ana(v, i=(0, 7), j=(0, 3))
    i, j = v["i"], v["j"]
    assert E.is_const(a.simplify(i * 4 + j < 32), 1)
    assert E.is_const(a.simplify(i * 4 + j >= 32), 0)
    assert same(a.simplify(i * 4 + j + 3 < 20), E.LT(E.Add(E.Mul(i, E.const(4)), j), E.const(17)))


def test_min_max_resolved_by_bounds(v):
    a = ana(v, i=(0, 7))
    assert a.simplify(E.max_expr(v["i"], 0)) is v["i"]
    assert same(a.simplify(E.min_expr(v["i"] + 10, 3)), E.const(3))


def test_bounds_of_affine_and_divmod(v):
    a = ana(v, i=(0, 7), j=(-2, 3))
    assert a.bound(v["i"] * 3 - v["j"]) == (-3, 23)
    assert a.bound(v["i"] // 2) == (0, 3)
    assert a.bound((v["i"] + 8) % 4) == (0, 3)
    assert a.bound(v["x"]) == (None, None)


def test_float_arithmetic_only_folds_constants():
    x = E.Var("x", "float32")
    a = Analyzer()
    assert a.simplify(x * 1.0) is x
    assert same(a.simplify((x + 1.0) - 1.0), (x + 1.0) - 1.0)   # not associative
    assert same(a.simplify(E.FloatImm(2.0) * E.FloatImm(3.0)), E.FloatImm(6.0))
