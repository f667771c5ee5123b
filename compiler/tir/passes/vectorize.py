"""VectorizeLoops: a loop marked `vectorized` with constant bounds becomes one vector statement.

The loop variable becomes Ramp(min, 1, lanes); arithmetic on a Ramp and an invariant scalar
stays a Ramp (so `A[i*64 + j]` over j is one contiguous vector load), other mixes broadcast
the scalar side. Invariant subexpressions stay scalar. When the body cannot be vectorized
(a store whose index does not vary with the loop but whose value does, a condition that
varies per lane, a load under a per-lane select, a nested allocation) the loop is left serial
and the reason is logged; LLVM's own loop vectorizer may still pick it up.
"""
from __future__ import annotations

import logging

from .. import dtype as dt
from .. import expr as E
from ..functor import Mutator, post_order_visit, uses_var
from ..stmt import Allocate, AttrStmt, BufferStore, Evaluate, For, ForKind, IfThenElse, LetStmt, PrimFunc, SeqStmt
from . import register_pass

log = logging.getLogger(__name__)


class _Cannot(Exception):
    pass


def _lanes(e) -> int:
    return dt.lanes(e.dtype)


def _bcast(e, n):
    return e if _lanes(e) == n else E.Broadcast(e, n)


class _Vectorizer:
    def __init__(self, var: E.Var, start, n: int):
        self.var, self.start, self.n = var, start, n

    # ------------------------------------------------------------ expressions
    def expr(self, e):
        if not uses_var(e, self.var):
            return e
        if e is self.var:
            return E.Ramp(self.start, E.const(1, e.dtype), self.n)
        m = getattr(self, "e_" + type(e).__name__, None)
        if m is None:
            raise _Cannot(f"{type(e).__name__} ({e})")
        return m(e)

    def _binary(self, e):
        a, b = self.expr(e.a), self.expr(e.b)
        n = self.n
        if isinstance(e, (E.Add, E.Sub)) and dt.is_int(e.dtype):
            if isinstance(a, E.Ramp) and _lanes(b) == 1:
                return E.Ramp(type(e)(a.base, b), a.stride, n)
            if isinstance(b, E.Ramp) and _lanes(a) == 1:
                if isinstance(e, E.Add):
                    return E.Ramp(E.Add(a, b.base), b.stride, n)
                return E.Ramp(E.Sub(a, b.base), E.Sub(E.const(0, b.stride.dtype), b.stride), n)
            if isinstance(a, E.Ramp) and isinstance(b, E.Ramp):
                return E.Ramp(type(e)(a.base, b.base), type(e)(a.stride, b.stride), n)
        if isinstance(e, E.Mul) and dt.is_int(e.dtype):
            if isinstance(a, E.Ramp) and _lanes(b) == 1:
                return E.Ramp(E.Mul(a.base, b), E.Mul(a.stride, b), n)
            if isinstance(b, E.Ramp) and _lanes(a) == 1:
                return E.Ramp(E.Mul(b.base, a), E.Mul(b.stride, a), n)
        a, b = _bcast(a, n), _bcast(b, n)
        out = type(e)(a, b)
        if not isinstance(e, E.CmpOp):
            out.dtype = a.dtype
        return out

    e_Add = e_Sub = e_Mul = e_Div = e_FloorDiv = e_FloorMod = e_Min = e_Max = _binary
    e_BitAnd = e_BitOr = e_BitXor = e_Shl = e_Shr = e_And = e_Or = _binary
    e_EQ = e_NE = e_LT = e_LE = e_GT = e_GE = _binary

    def e_Not(self, e):
        return E.Not(_bcast(self.expr(e.a), self.n))

    def e_Cast(self, e):
        v = _bcast(self.expr(e.value), self.n)
        return E.Cast(dt.with_lanes(e.dtype, self.n), v)

    def e_Call(self, e):
        if e.op in E.MATH_INTRINSICS:
            args = [_bcast(self.expr(a), self.n) for a in e.args]
            return E.Call(dt.with_lanes(e.dtype, self.n), e.op, args)
        raise _Cannot(f"call {e.op} varies with the loop")

    def e_Select(self, e):
        cond = self.expr(e.cond)
        if _lanes(cond) > 1:
            loads = []
            for side in (e.true_value, e.false_value):
                post_order_visit(side, lambda x: loads.append(x) if isinstance(x, E.BufferLoad) else None)
            if loads:
                raise _Cannot(f"select with a per-lane condition guards a load ({e.cond})")
        # a scalar condition may pick between vectors (LLVM select allows it)
        return E.Select(cond, _bcast(self.expr(e.true_value), self.n), _bcast(self.expr(e.false_value), self.n))

    def e_BufferLoad(self, e):
        if len(e.indices) != 1:
            raise _Cannot("load not flattened")
        idx = self.expr(e.indices[0])
        if _lanes(idx) == 1:
            return E.BufferLoad(e.buffer, [idx])
        return E.BufferLoad(e.buffer, [idx], lanes=self.n)

    def e_Ramp(self, e):
        raise _Cannot("already vectorized")

    e_Broadcast = e_Ramp

    # ------------------------------------------------------------ statements
    def stmt(self, s):
        if isinstance(s, SeqStmt):
            return SeqStmt([self.stmt(x) for x in s.seq])
        if isinstance(s, BufferStore):
            if len(s.indices) != 1:
                raise _Cannot("store not flattened")
            idx = self.expr(s.indices[0])
            val = self.expr(s.value)
            if _lanes(idx) == 1:
                if _lanes(val) > 1 or uses_var(s.value, self.var):
                    raise _Cannot(f"store to {s.buffer.name}[{s.indices[0]}] does not vary with the "
                                  "loop but its value does (a reduction over the vectorized axis)")
                return s
            return BufferStore(s.buffer, _bcast(val, self.n), [idx])
        if isinstance(s, For):
            if uses_var(s.min, self.var) or uses_var(s.extent, self.var):
                raise _Cannot(f"inner loop '{s.loop_var.name}' bounds vary with the loop")
            return For(s.loop_var, s.min, s.extent, s.kind if s.kind != ForKind.PARALLEL else ForKind.SERIAL,
                       self.stmt(s.body), s.thread_tag, s.annotations)
        if isinstance(s, IfThenElse):
            if uses_var(s.condition, self.var):
                raise _Cannot(f"condition varies per lane ({s.condition})")
            return IfThenElse(s.condition, self.stmt(s.then_case),
                              self.stmt(s.else_case) if s.else_case is not None else None)
        if isinstance(s, AttrStmt):
            return AttrStmt(s.node, s.key, s.value, self.stmt(s.body))
        if isinstance(s, Evaluate):
            if uses_var(s.value, self.var):
                raise _Cannot(f"call varies with the loop ({s.value})")
            return s
        if isinstance(s, LetStmt):
            if uses_var(s.value, self.var):
                raise _Cannot("let binding varies with the loop")
            return LetStmt(s.var, s.value, self.stmt(s.body))
        if isinstance(s, Allocate):
            raise _Cannot(f"allocation '{s.buffer.name}' inside the loop")
        raise _Cannot(type(s).__name__)


class _Vectorize(Mutator):
    def visit_For(self, s: For):
        body = self.visit(s.body)
        if s.kind == ForKind.VECTORIZED:
            if not isinstance(s.extent, E.IntImm):
                log.info("VectorizeLoops: loop '%s' left serial: extent %s is not constant",
                         s.loop_var.name, s.extent)
            elif s.extent.value > 1:
                try:
                    return _Vectorizer(s.loop_var, s.min, s.extent.value).stmt(body)
                except _Cannot as why:
                    log.info("VectorizeLoops: loop '%s' left serial: %s", s.loop_var.name, why)
            return For(s.loop_var, s.min, s.extent, ForKind.SERIAL, body, None, s.annotations)
        return s if body is s.body else For(s.loop_var, s.min, s.extent, s.kind, body, s.thread_tag, s.annotations)


@register_pass("VectorizeLoops")
def VectorizeLoops():
    """Lower loops of kind `vectorized` to vector expressions (Ramp / Broadcast)."""
    def run(func: PrimFunc) -> PrimFunc:
        return func.with_body(_Vectorize().visit(func.body))
    return run
