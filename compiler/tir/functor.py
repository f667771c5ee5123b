"""Generic walking and rewriting of expressions and statements, driven by each node's `_fields`.

`Mutator` rebuilds only what changed (unchanged subtrees keep their identity), so passes are
cheap to chain. Override `visit_<NodeClass>` for the nodes a pass cares about.
"""
from __future__ import annotations

import copy
from typing import Callable

from . import expr as E
from . import stmt as S


def _rebuild(node, changes: dict):
    new = copy.copy(node)
    for k, v in changes.items():
        setattr(new, k, v)
    return new


class Mutator:
    """Rewrites expressions and statements; `visit` dispatches on the class name."""

    def visit(self, node):
        if node is None:
            return None
        m = getattr(self, "visit_" + type(node).__name__, None)
        if m is not None:
            return m(node)
        return self.generic_visit(node)

    def generic_visit(self, node):
        changes = {}
        for f in node._fields:
            old = getattr(node, f)
            if isinstance(old, tuple):
                new = tuple(self.visit(x) for x in old)
                if any(a is not b for a, b in zip(new, old)):
                    changes[f] = new
            elif old is not None:
                new = self.visit(old)
                if new is not old:
                    changes[f] = new
        if not changes:
            return node
        out = _rebuild(node, changes)
        if isinstance(out, E.BinaryOp) and not isinstance(out, E.CmpOp):
            out.dtype = out.a.dtype
        elif isinstance(out, E.CmpOp):
            out.dtype = E.dt.with_lanes("bool", E.dt.lanes(out.a.dtype))
        elif isinstance(out, E.Select):
            out.dtype = out.true_value.dtype
        elif isinstance(out, E.Not):
            out.dtype = out.a.dtype
        return out


class Visitor:
    """Walks every node; override `visit_<NodeClass>` and call `generic_visit` to recurse."""

    def visit(self, node):
        if node is None:
            return
        m = getattr(self, "visit_" + type(node).__name__, None)
        if m is not None:
            m(node)
        else:
            self.generic_visit(node)

    def generic_visit(self, node):
        for f in node._fields:
            v = getattr(node, f)
            if isinstance(v, tuple):
                for x in v:
                    self.visit(x)
            elif v is not None:
                self.visit(v)


def post_order_visit(node, fn: Callable) -> None:
    """Call fn on every node below and including `node`, children first."""

    def rec(n):
        for f in n._fields:
            v = getattr(n, f)
            if isinstance(v, tuple):
                for x in v:
                    rec(x)
            elif v is not None:
                rec(v)
        fn(n)

    rec(node)


class _Substitute(Mutator):
    def __init__(self, vmap):
        self.vmap = vmap

    def visit_Var(self, v):
        return self.vmap.get(v, v)

    def _view(self, buf):
        """A tensorize view whose offset uses a substituted variable gets a substituted copy."""
        if buf.base is None:
            return buf
        base = self._view(buf.base)
        off = self.visit(buf.elem_offset)
        if off is buf.elem_offset and base is buf.base:
            return buf
        memo = self.__dict__.setdefault("_views", {})
        if id(buf) not in memo:
            nb = copy.copy(buf)
            nb.elem_offset, nb.base = off, base
            memo[id(buf)] = nb
        return memo[id(buf)]

    def visit_BufferLoad(self, e):
        out = self.generic_visit(e)
        buf = self._view(e.buffer)
        if buf is not e.buffer:
            out = E.BufferLoad(buf, out.indices, lanes=E.dt.lanes(e.dtype) if E.dt.lanes(e.dtype) > 1 else None)
        return out

    def visit_BufferStore(self, s):
        out = self.generic_visit(s)
        buf = self._view(s.buffer)
        return out if buf is s.buffer else S.BufferStore(buf, out.value, out.indices)


def substitute(node, vmap: dict):
    """Replace Vars by expressions (keys are Var objects) in an expression or statement."""
    if not vmap:
        return node
    return _Substitute(vmap).visit(node)


def free_vars(node) -> set:
    """Vars used in node (loop variables bound inside it included)."""
    out = set()

    def f(n):
        if isinstance(n, E.Var):
            out.add(n)
    post_order_visit(node, f)
    for n in _collect(node, (S.For,)):
        out.add(n.loop_var)
    return out


def _collect(node, types):
    found = []

    def f(n):
        if isinstance(n, types):
            found.append(n)
    post_order_visit(node, f)
    return found


def collect(node, types) -> list:
    """Every node of the given types, in post order."""
    return _collect(node, types)


def uses_var(node, var: E.Var) -> bool:
    hit = []

    def f(n):
        if n is var:
            hit.append(n)
    post_order_visit(node, f)
    return bool(hit)


# ---------------------------------------------------------------- structural equality

_ATTRS = {
    "IntImm": ("value", "dtype"), "FloatImm": ("value", "dtype"), "StringImm": ("value",),
    "Cast": ("dtype",), "Call": ("op", "dtype"), "Reduce": ("combiner",),
    "Ramp": ("lanes",), "Broadcast": ("lanes",),
    "For": ("kind", "thread_tag"), "AttrStmt": ("key",),
}


def structural_equal(a, b, map_free_vars: bool = True) -> bool:
    """True when a and b are the same tree up to a consistent renaming of variables and
    buffers (when map_free_vars; otherwise free variables must be identical objects)."""
    vmap: dict = {}
    bmap: dict = {}

    def eq_var(x, y):
        if x is y:
            return True
        if x in vmap:
            return vmap[x] is y
        if not map_free_vars or x.dtype != y.dtype:
            return False
        vmap[x] = y
        return True

    def eq_buf(x, y):
        if x is y:
            return True
        if x in bmap:
            return bmap[x] is y
        if x.dtype != y.dtype or x.scope != y.scope or len(x.shape) != len(y.shape):
            return False
        bmap[x] = y
        return all(eq(p, q) for p, q in zip(x.shape, y.shape))

    def eq(x, y):
        if x is y:
            return True
        if x is None or y is None or type(x) is not type(y):
            return False
        name = type(x).__name__
        if isinstance(x, E.Var):
            return eq_var(x, y)
        if isinstance(x, E.PrimExpr) and x.dtype != y.dtype:
            return False
        for attr in _ATTRS.get(name, ()):
            if getattr(x, attr) != getattr(y, attr):
                return False
        if isinstance(x, S.For):
            if not eq_var(x.loop_var, y.loop_var):
                return False
        if isinstance(x, S.LetStmt) and not eq_var(x.var, y.var):
            return False
        if isinstance(x, (S.BufferStore, S.Allocate, E.BufferLoad)) and not eq_buf(x.buffer, y.buffer):
            return False
        if isinstance(x, E.ProducerLoad) and x.producer is not y.producer:
            return False
        for f in x._fields:
            u, v = getattr(x, f), getattr(y, f)
            if isinstance(u, tuple):
                if not isinstance(v, tuple) or len(u) != len(v) or not all(eq(p, q) for p, q in zip(u, v)):
                    return False
            elif isinstance(u, (E.PrimExpr, S.Stmt)) or isinstance(v, (E.PrimExpr, S.Stmt)):
                if not eq(u, v):
                    return False
            elif u != v:
                return False
        return True

    if isinstance(a, S.PrimFunc):
        if not isinstance(b, S.PrimFunc) or len(a.params) != len(b.params):
            return False
        if not all(eq_buf(p, q) for p, q in zip(a.params, b.params)):
            return False
        return eq(a.body, b.body)
    return eq(a, b)


def assert_structural_equal(a, b, map_free_vars: bool = True) -> None:
    """Raise AssertionError showing both sides when they differ (for Before/Expected tests)."""
    if not structural_equal(a, b, map_free_vars):
        raise AssertionError(f"IR differs.\n--- got:\n{a}\n--- expected:\n{b}")
