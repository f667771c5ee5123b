"""PartitionLoops: split a loop into a guard-free main part and its boundary parts.

Guards come from splits that do not divide (`if io*4 + ii < 10`) and from padding
(`select(h + kh >= 1 and h + kh < 57, A[...], 0)`). For loop v, each guard conjunct that is
affine in v, whose other terms are loops inside v with constant bounds, holds for every inner
iteration on an interval of v; the intersection of those intervals becomes the main loop and
the rest become prefix/suffix loops. The Simplify that runs on each part (this pass extends
it) then deletes the guards the part's range proves, and inner loops are partitioned in turn.
"""
from __future__ import annotations

from .. import expr as E
from ..arith import linear
from ..functor import Visitor
from ..stmt import For, ForKind, PrimFunc, seq
from . import register_pass
from .simplify import StmtSimplifier

_PARTITIONABLE = (ForKind.SERIAL, ForKind.VECTORIZED, ForKind.UNROLLED, ForKind.PARALLEL)


class _Conds(Visitor):
    """Collect (condition, ranges of loops between v and the condition)."""

    def __init__(self):
        self.inner: dict = {}
        self.found: list = []

    def visit_For(self, s):
        self.visit(s.min)
        self.visit(s.extent)
        ok = isinstance(s.min, E.IntImm) and isinstance(s.extent, E.IntImm)
        old = self.inner.get(s.loop_var)
        if ok:
            self.inner[s.loop_var] = (s.min.value, s.min.value + s.extent.value - 1)
        self.visit(s.body)
        if ok:
            if old is None:
                self.inner.pop(s.loop_var, None)
            else:
                self.inner[s.loop_var] = old

    def visit_IfThenElse(self, s):
        self.found.append((s.condition, dict(self.inner)))
        self.generic_visit(s)

    def visit_Select(self, e):
        self.found.append((e.cond, dict(self.inner)))
        self.generic_visit(e)


def _conjuncts(c):
    if isinstance(c, E.And):
        return _conjuncts(c.a) + _conjuncts(c.b)
    return [c]


def _true_interval(c, v, inner: dict):
    """Interval [lo, hi] of v (None = unbounded) on which conjunct c holds for every value of
    the inner loops, or None when c does not constrain v in a usable way."""
    if not isinstance(c, (E.LT, E.LE, E.GT, E.GE)) or not E.dt.is_int(c.a.dtype):
        return None
    d = linear(E.Sub(c.a, c.b))
    # canonical: e <= k
    if isinstance(c, E.LT):
        e, k = d, -1
    elif isinstance(c, E.LE):
        e, k = d, 0
    elif isinstance(c, E.GT):
        e, k = d.scaled(-1), -1
    else:
        e, k = d.scaled(-1), 0
    a = e.coef_of(v)
    if a == 0:
        return None
    k -= e.const
    rhi = 0
    for atom, coef in e.terms.values():
        if atom is v:
            continue
        if not isinstance(atom, E.Var) or atom not in inner:
            return None
        lo, hi = inner[atom]
        rhi += coef * (hi if coef > 0 else lo)
    if a > 0:
        return (None, (k - rhi) // a)
    return (-((k - rhi) // (-a)), None)   # ceil((rhi - k) / -a)


class _Partition(StmtSimplifier):
    def visit_For(self, s: For):
        if s.kind in _PARTITIONABLE and isinstance(s.min, E.IntImm) and isinstance(s.extent, E.IntImm):
            parts = self._parts(s)
            if parts is not None:
                return seq(*[super(_Partition, self).visit_For(p) for p in parts])
        return super().visit_For(s)

    def _parts(self, s: For):
        col = _Conds()
        col.visit(s.body)
        lo_v, hi_v = s.min.value, s.min.value + s.extent.value - 1
        L, H = lo_v, hi_v
        used = False
        for cond, inner in col.found:
            for c in _conjuncts(self.ana.simplify(cond)):
                iv = _true_interval(c, s.loop_var, inner)
                if iv is None:
                    continue
                used = True
                if iv[0] is not None:
                    L = max(L, iv[0])
                if iv[1] is not None:
                    H = min(H, iv[1])
        if not used or L > H or (L == lo_v and H == hi_v):
            return None
        out = []
        for a, b in ((lo_v, L - 1), (L, H), (H + 1, hi_v)):
            if a <= b:
                out.append(For(s.loop_var, a, b - a + 1, s.kind, s.body, s.thread_tag, s.annotations))
        return out


@register_pass("PartitionLoops")
def PartitionLoops():
    """Peel loop iterations where guards can fail, leaving a guard-free main loop."""
    def run(func: PrimFunc) -> PrimFunc:
        return func.with_body(_Partition().visit(func.body))
    return run
