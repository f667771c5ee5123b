"""Simplify: fold and normalise every expression under the ranges of the enclosing loops;
drop guards that are provably true (or whole branches provably false), substitute loops of
extent 1, delete loops of extent 0. RemoveNoOp: drop statements that do nothing."""
from __future__ import annotations

from .. import expr as E
from ..arith import Analyzer
from ..functor import Mutator, substitute
from ..stmt import AttrStmt, Evaluate, For, ForKind, IfThenElse, PrimFunc, SeqStmt, seq
from . import register_pass


def is_no_op(s) -> bool:
    return s is None or (isinstance(s, Evaluate) and isinstance(s.value, (E.IntImm, E.FloatImm)))


class StmtSimplifier(Mutator):
    def __init__(self, ana: Analyzer | None = None):
        self.ana = ana or Analyzer()

    def visit(self, node):
        if isinstance(node, E.PrimExpr):
            return self.ana.simplify(node)
        return super().visit(node)

    def visit_For(self, s: For):
        mn, ext = self.visit(s.min), self.visit(s.extent)
        if isinstance(ext, E.IntImm) and ext.value <= 0:
            return Evaluate(0)
        if E.is_const(ext, 1) and s.kind in (ForKind.SERIAL, ForKind.UNROLLED, ForKind.VECTORIZED,
                                             ForKind.PARALLEL):
            return self.visit(substitute(s.body, {s.loop_var: mn}))
        old = self.ana.ranges.get(s.loop_var)
        self.ana.bind_range(s.loop_var, mn, ext)
        body = self.visit(s.body)
        if old is None:
            self.ana.ranges.pop(s.loop_var, None)
        else:
            self.ana.ranges[s.loop_var] = old
        if is_no_op(body):
            return Evaluate(0)
        if body is s.body and mn is s.min and ext is s.extent:
            return s
        return For(s.loop_var, mn, ext, s.kind, body, s.thread_tag, s.annotations)

    def visit_IfThenElse(self, s: IfThenElse):
        cond = self.visit(s.condition)
        if isinstance(cond, E.IntImm):
            return self.visit(s.then_case) if cond.value else (
                self.visit(s.else_case) if s.else_case is not None else Evaluate(0))
        then = self.visit(s.then_case)
        els = self.visit(s.else_case) if s.else_case is not None else None
        if is_no_op(els):
            els = None
        if is_no_op(then) and els is None:
            return Evaluate(0)
        return IfThenElse(cond, then, els)

    def visit_SeqStmt(self, s: SeqStmt):
        return seq(*[self.visit(x) for x in s.seq])

    def visit_AttrStmt(self, s: AttrStmt):
        body = self.visit(s.body)
        if is_no_op(body):
            return body
        return s if body is s.body else AttrStmt(s.node, s.key, s.value, body)


class NoOpRemover(Mutator):
    def visit_SeqStmt(self, s):
        return seq(*[self.visit(x) for x in s.seq])

    def visit_For(self, s):
        body = self.visit(s.body)
        if is_no_op(body):
            return Evaluate(0)
        return s if body is s.body else For(s.loop_var, s.min, s.extent, s.kind, body, s.thread_tag, s.annotations)

    def visit_Allocate(self, s):
        body = self.visit(s.body)
        if is_no_op(body):
            return body
        return s if body is s.body else type(s)(s.buffer, body)

    def visit_IfThenElse(self, s):
        then = self.visit(s.then_case)
        els = self.visit(s.else_case) if s.else_case is not None else None
        if is_no_op(els):
            els = None
        if is_no_op(then) and els is None:
            return Evaluate(0)
        return IfThenElse(s.condition, then, els)


@register_pass("Simplify")
def Simplify():
    """Arithmetic simplification of every expression plus guard/loop cleanup."""
    def run(func: PrimFunc) -> PrimFunc:
        return func.with_body(StmtSimplifier().visit(func.body))
    return run


@register_pass("RemoveNoOp")
def RemoveNoOp():
    """Delete loops, branches and allocations whose body does nothing."""
    def run(func: PrimFunc) -> PrimFunc:
        return func.with_body(NoOpRemover().visit(func.body))
    return run
