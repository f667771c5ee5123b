"""Integer arithmetic on index expressions: linear normal form, interval bounds, simplification.

Index expressions are affine in loop variables plus floordiv/floormod by constants (from split
and fuse). An integer expression is read as a linear form sum(coef * atom) + const, where
atoms are variables or non-linear subterms; that makes `(jo*4 + 3) - jo*4 + 1` fold to 4 and
`(f // 8) * 8 + f % 8` to `f`. Bounds are intervals of Python ints (None = unbounded) under
the loop-variable ranges the Analyzer knows. Float arithmetic is only constant-folded.
"""
from __future__ import annotations

import copy
from typing import Optional

from . import dtype as dt
from . import expr as E

Interval = tuple[Optional[int], Optional[int]]


def skey(e) -> tuple:
    """Structural hash key of an expression (variables and buffers by identity)."""
    if isinstance(e, E.Var):
        return ("V", id(e))
    if isinstance(e, (E.IntImm, E.FloatImm)):
        return (type(e).__name__, e.value, e.dtype)
    if isinstance(e, E.StringImm):
        return ("S", e.value)
    parts: list = [type(e).__name__, e.dtype]
    if isinstance(e, E.Call):
        parts.append(e.op)
    elif isinstance(e, (E.BufferLoad,)):
        parts.append(id(e.buffer))
    elif isinstance(e, E.ProducerLoad):
        parts.append(id(e.producer))
    elif isinstance(e, (E.Ramp, E.Broadcast)):
        parts.append(e.lanes)
    elif isinstance(e, E.Reduce):
        parts.append(e.combiner)
        parts.append(tuple(id(a) for a in e.axis))
    for f in e._fields:
        v = getattr(e, f)
        if isinstance(v, tuple):
            parts.append(tuple(skey(x) for x in v))
        else:
            parts.append(skey(v) if v is not None else None)
    return tuple(parts)


class Linear:
    """sum(coef * atom) + const over one integer dtype; terms keep first-seen order."""
    __slots__ = ("terms", "const", "dtype")

    def __init__(self, dtype: str, const: int = 0):
        self.terms: dict = {}   # skey -> [atom, coef]
        self.const = const
        self.dtype = dtype

    def copy(self) -> "Linear":
        out = Linear(self.dtype, self.const)
        out.terms = {k: [a, c] for k, (a, c) in self.terms.items()}
        return out

    def add_term(self, atom, coef: int) -> None:
        if coef == 0:
            return
        k = skey(atom)
        if k in self.terms:
            self.terms[k][1] += coef
            if self.terms[k][1] == 0:
                del self.terms[k]
        else:
            self.terms[k] = [atom, coef]

    def iadd(self, other: "Linear", scale: int = 1) -> "Linear":
        for a, c in other.terms.values():
            self.add_term(a, c * scale)
        self.const += other.const * scale
        return self

    def scaled(self, s: int) -> "Linear":
        out = Linear(self.dtype)
        return out.iadd(self, s)

    def is_const(self) -> bool:
        return not self.terms

    def coef_of(self, var) -> int:
        t = self.terms.get(skey(var))
        return t[1] if t else 0

    def to_expr(self) -> E.PrimExpr:
        pos = [(a, c) for a, c in self.terms.values() if c > 0]
        neg = [(a, -c) for a, c in self.terms.values() if c < 0]

        def term(a, c):
            return a if c == 1 else E.Mul(a, E.IntImm(c, self.dtype))

        out = None
        for a, c in pos:
            t = term(a, c)
            out = t if out is None else E.Add(out, t)
        if out is None and (neg or self.const != 0):
            if not neg:
                return E.IntImm(self.const, self.dtype)
            out = E.IntImm(self.const, self.dtype)
            for a, c in neg:
                out = E.Sub(out, term(a, c))
            return out
        if out is None:
            return E.IntImm(0, self.dtype)
        for a, c in neg:
            out = E.Sub(out, term(a, c))
        if self.const > 0:
            out = E.Add(out, E.IntImm(self.const, self.dtype))
        elif self.const < 0:
            out = E.Sub(out, E.IntImm(-self.const, self.dtype))
        return out


def _is_index_int(e) -> bool:
    return dt.is_int(e.dtype) and dt.lanes(e.dtype) == 1


def linear(e: E.PrimExpr) -> Linear:
    """Linear form of an integer scalar expression (non-linear parts become atoms)."""
    out = Linear(e.dtype)
    _linear_into(e, 1, out)
    _merge_div_mod(out)
    return out


def _linear_into(e, scale: int, out: Linear) -> None:
    if isinstance(e, E.IntImm):
        out.const += e.value * scale
    elif isinstance(e, E.Add):
        _linear_into(e.a, scale, out)
        _linear_into(e.b, scale, out)
    elif isinstance(e, E.Sub):
        _linear_into(e.a, scale, out)
        _linear_into(e.b, -scale, out)
    elif isinstance(e, E.Mul) and isinstance(e.b, E.IntImm):
        _linear_into(e.a, scale * e.b.value, out)
    elif isinstance(e, E.Mul) and isinstance(e.a, E.IntImm):
        _linear_into(e.b, scale * e.a.value, out)
    elif isinstance(e, E.Mul):
        la, lb = linear(e.a), linear(e.b)
        if la.is_const():
            out.iadd(lb, scale * la.const)
        elif lb.is_const():
            out.iadd(la, scale * lb.const)
        else:
            out.add_term(e, scale)
    else:
        out.add_term(e, scale)


def _merge_div_mod(lin: Linear) -> None:
    """(x // c) * c * k + (x % c) * k  ->  x * k."""
    mods = [(k, a, c) for k, (a, c) in lin.terms.items()
            if isinstance(a, E.FloorMod) and isinstance(a.b, E.IntImm)]
    for k, a, c in mods:
        if k not in lin.terms:
            continue
        m = a.b.value
        dkey = skey(E.FloorDiv(a.a, a.b))
        if dkey in lin.terms and lin.terms[dkey][1] == c * m:
            del lin.terms[k]
            del lin.terms[dkey]
            lin.iadd(linear(a.a), c)
            continue
        # the simplifier reduces a mod's operand modulo m ((y*16 + x) % 14 -> (y*2 + x) % 14), so
        # also merge with a div whose operand d is congruent: (d // m) * m + (d' % m) = d when d = d' (mod m)
        for dk, (da, dc) in list(lin.terms.items()):
            if not (isinstance(da, E.FloorDiv) and isinstance(da.b, E.IntImm) and da.b.value == m
                    and dc == c * m):
                continue
            diff = linear(da.a).iadd(linear(a.a), -1)
            if diff.const % m == 0 and all(cf % m == 0 for _, cf in diff.terms.values()):
                del lin.terms[k]
                del lin.terms[dk]
                lin.iadd(linear(da.a), c)
                break


def _floordiv(a: int, b: int) -> int:
    return a // b


class Analyzer:
    """Bounds and simplification under known ranges of variables (inclusive int intervals)."""

    def __init__(self, ranges: dict | None = None):
        self.ranges: dict = dict(ranges or {})

    def bind(self, var: E.Var, lo: int, hi: int) -> None:
        self.ranges[var] = (lo, hi)

    def bind_range(self, var: E.Var, min_e, extent_e) -> None:
        """Bind var to [min, min+extent) when both bounds are known."""
        lo = self.bound(min_e)[0]
        hi_min = self.bound(min_e)[1]
        ext = self.bound(extent_e)[1]
        hi = None if hi_min is None or ext is None else hi_min + ext - 1
        self.ranges[var] = (lo, hi)

    # ------------------------------------------------------------ bounds
    def bound(self, e) -> Interval:
        if isinstance(e, E.IntImm):
            return (e.value, e.value)
        if not _is_index_int(e):
            return (None, None)
        if isinstance(e, (E.Add, E.Sub, E.Mul)):
            lin = linear(e)
            lo = hi = lin.const
            for a, c in lin.terms.values():
                blo, bhi = self._atom_bound(a)
                if c > 0:
                    lo = None if lo is None or blo is None else lo + c * blo
                    hi = None if hi is None or bhi is None else hi + c * bhi
                else:
                    lo = None if lo is None or bhi is None else lo + c * bhi
                    hi = None if hi is None or blo is None else hi + c * blo
            return (lo, hi)
        return self._atom_bound(e)

    def _atom_bound(self, e) -> Interval:
        if isinstance(e, E.IntImm):
            return (e.value, e.value)
        if isinstance(e, E.Var):
            return self.ranges.get(e, (None, None))
        if isinstance(e, (E.Add, E.Sub)):
            return self.bound(e)
        if isinstance(e, E.Mul):
            a, b = self.bound(e.a), self.bound(e.b)
            if None in a or None in b:
                return (None, None)
            ps = [x * y for x in a for y in b]
            return (min(ps), max(ps))
        if isinstance(e, (E.FloorDiv, E.Shr)) and isinstance(e.b, E.IntImm):
            c = e.b.value if isinstance(e, E.FloorDiv) else 1 << e.b.value
            if c > 0:
                lo, hi = self.bound(e.a)
                return (None if lo is None else lo // c, None if hi is None else hi // c)
        if isinstance(e, E.FloorMod) and isinstance(e.b, E.IntImm) and e.b.value > 0:
            c = e.b.value
            lo, hi = self.bound(e.a)
            if lo is not None and hi is not None and lo // c == hi // c:
                return (lo % c, hi % c)
            return (0, c - 1)
        if isinstance(e, (E.Min, E.Max)):
            (alo, ahi), (blo, bhi) = self.bound(e.a), self.bound(e.b)
            if isinstance(e, E.Min):
                lo = None if alo is None or blo is None else min(alo, blo)
                hi = bhi if ahi is None else ahi if bhi is None else min(ahi, bhi)
            else:
                lo = blo if alo is None else alo if blo is None else max(alo, blo)
                hi = None if ahi is None or bhi is None else max(ahi, bhi)
            return (lo, hi)
        if isinstance(e, E.Select):
            a, b = self.bound(e.true_value), self.bound(e.false_value)
            lo = None if a[0] is None or b[0] is None else min(a[0], b[0])
            hi = None if a[1] is None or b[1] is None else max(a[1], b[1])
            return (lo, hi)
        if isinstance(e, E.Cast) and _is_index_int(e.value):
            return self.bound(e.value)
        if isinstance(e, E.BitAnd) and isinstance(e.b, E.IntImm) and e.b.value >= 0:
            return (0, e.b.value)
        if dt.is_int(e.dtype) and dt.bits(e.dtype) <= 16:
            return (dt.min_value(e.dtype), dt.max_value(e.dtype))
        return (None, None)

    def can_prove(self, cond) -> bool:
        s = self.simplify(cond)
        return isinstance(s, E.IntImm) and s.value == 1

    def can_prove_nonneg(self, e) -> bool:
        lo = self.bound(e)[0]
        return lo is not None and lo >= 0

    # ------------------------------------------------------------ simplification
    def simplify(self, e):
        return _Simplifier(self).visit(e)


class _Simplifier:
    def __init__(self, ana: Analyzer):
        self.ana = ana

    def visit(self, e):
        if isinstance(e, (E.IntImm, E.FloatImm, E.StringImm, E.Var)):
            return e
        m = getattr(self, "s_" + type(e).__name__, None)
        # children first
        changes = {}
        for f in e._fields:
            v = getattr(e, f)
            if isinstance(v, tuple):
                nv = tuple(self.visit(x) for x in v)
                if any(a is not b for a, b in zip(nv, v)):
                    changes[f] = nv
            elif v is not None:
                nv = self.visit(v)
                if nv is not v:
                    changes[f] = nv
        if changes:
            e = copy.copy(e)
            for k, v in changes.items():
                setattr(e, k, v)
        return m(e) if m is not None else e

    # integer linear arithmetic
    def _lin(self, e):
        if not _is_index_int(e):
            return self._float_fold(e)
        return self._from_linear(linear(e))

    def _from_linear(self, lin: Linear):
        return lin.to_expr()

    def _float_fold(self, e):
        a, b = e.a, e.b
        if isinstance(a, (E.IntImm, E.FloatImm)) and isinstance(b, (E.IntImm, E.FloatImm)) and dt.lanes(e.dtype) == 1:
            f = {"Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y}
            return E.const(f[type(e).__name__](a.value, b.value), e.dtype)
        if isinstance(e, E.Add):
            if E.is_const(b, 0):
                return a
            if E.is_const(a, 0):
                return b
        if isinstance(e, E.Sub) and E.is_const(b, 0):
            return a
        if isinstance(e, E.Mul):
            if E.is_const(b, 1):
                return a
            if E.is_const(a, 1):
                return b
        return e

    s_Add = s_Sub = s_Mul = _lin

    def s_FloorDiv(self, e):
        if not (_is_index_int(e) and isinstance(e.b, E.IntImm) and e.b.value > 0):
            return e
        c = e.b.value
        if c == 1:
            return e.a
        if isinstance(e.a, E.IntImm):
            return E.IntImm(e.a.value // c, e.dtype)
        lin = linear(e.a)
        q, r = Linear(e.dtype), Linear(e.dtype)
        for a, k in lin.terms.values():
            if k % c == 0:
                q.add_term(a, k // c)
            else:
                r.add_term(a, k)
        q.const, r.const = lin.const // c, lin.const % c
        lo, hi = self.ana.bound(r.to_expr())
        if lo is not None and hi is not None and 0 <= lo and hi < c:
            return q.to_expr()
        if lo is not None and hi is not None and lo // c == hi // c:
            q.const += lo // c
            return q.to_expr()
        rex = r.to_expr()
        # floordiv(floordiv(x, a), b) = floordiv(x, a*b) for positive a, b
        if isinstance(rex, E.FloorDiv) and isinstance(rex.b, E.IntImm) and rex.b.value > 0:
            rex = E.FloorDiv(rex.a, E.IntImm(rex.b.value * c, e.dtype))
        else:
            rex = E.FloorDiv(rex, e.b)
        if q.is_const() and q.const == 0:
            return rex
        out = q.copy()
        out.add_term(rex, 1)
        return out.to_expr()

    def s_FloorMod(self, e):
        if not (_is_index_int(e) and isinstance(e.b, E.IntImm) and e.b.value > 0):
            return e
        c = e.b.value
        if c == 1:
            return E.IntImm(0, e.dtype)
        if isinstance(e.a, E.IntImm):
            return E.IntImm(e.a.value % c, e.dtype)
        lin = linear(e.a)
        r = Linear(e.dtype)
        for a, k in lin.terms.values():
            if k % c != 0:
                r.add_term(a, k % c)
        r.const = lin.const % c
        lo, hi = self.ana.bound(r.to_expr())
        if lo is not None and hi is not None and lo // c == hi // c:
            r.const -= (lo // c) * c
            return r.to_expr()
        rex = r.to_expr()
        # floormod(floormod(x, a), c) = floormod(x, c) when c divides a
        if isinstance(rex, E.FloorMod) and isinstance(rex.b, E.IntImm) and rex.b.value % c == 0:
            rex = rex.a
        return E.FloorMod(rex, e.b)

    def s_Min(self, e):
        return self._minmax(e, True)

    def s_Max(self, e):
        return self._minmax(e, False)

    def _minmax(self, e, is_min):
        a, b = e.a, e.b
        if isinstance(a, (E.IntImm, E.FloatImm)) and isinstance(b, (E.IntImm, E.FloatImm)):
            return E.const((min if is_min else max)(a.value, b.value), e.dtype)
        if _is_index_int(e):
            lo, hi = self.ana.bound(E.Sub(a, b))
            if hi is not None and hi <= 0:
                return a if is_min else b
            if lo is not None and lo >= 0:
                return b if is_min else a
        return e

    def _cmp(self, e):
        a, b = e.a, e.b
        if isinstance(a, (E.IntImm, E.FloatImm)) and isinstance(b, (E.IntImm, E.FloatImm)):
            f = {"LT": lambda x, y: x < y, "LE": lambda x, y: x <= y, "GT": lambda x, y: x > y,
                 "GE": lambda x, y: x >= y, "EQ": lambda x, y: x == y, "NE": lambda x, y: x != y}
            return E.IntImm(int(f[type(e).__name__](a.value, b.value)), "bool")
        if not (_is_index_int(a) and dt.lanes(a.dtype) == 1):
            return e
        diff = linear(E.Sub(a, b))
        lo, hi = self.ana.bound(diff.to_expr())
        t = type(e).__name__
        verdict = None
        if t == "LT":
            verdict = True if hi is not None and hi < 0 else False if lo is not None and lo >= 0 else None
        elif t == "LE":
            verdict = True if hi is not None and hi <= 0 else False if lo is not None and lo > 0 else None
        elif t == "GT":
            verdict = True if lo is not None and lo > 0 else False if hi is not None and hi <= 0 else None
        elif t == "GE":
            verdict = True if lo is not None and lo >= 0 else False if hi is not None and hi < 0 else None
        elif t == "EQ":
            verdict = True if lo == hi == 0 else False if (lo is not None and lo > 0) or (hi is not None and hi < 0) else None
        elif t == "NE":
            verdict = False if lo == hi == 0 else True if (lo is not None and lo > 0) or (hi is not None and hi < 0) else None
        if verdict is not None:
            return E.IntImm(int(verdict), "bool")
        # normal form: positive terms on the left, the rest and the constant on the right
        left, right = Linear(a.dtype), Linear(a.dtype)
        for atom, c in diff.terms.values():
            if c > 0:
                left.add_term(atom, c)
            else:
                right.add_term(atom, -c)
        right.const = -diff.const
        if left.is_const():
            # P empty: `0 op N - k`  <=>  `N flip(op) k`
            left, right = Linear(a.dtype), Linear(a.dtype, diff.const)
            for atom, c in diff.terms.values():
                left.add_term(atom, -c)
            t = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ", "NE": "NE"}[t]
        out = getattr(E, t)(left.to_expr(), right.to_expr())
        return out

    s_LT = s_LE = s_GT = s_GE = s_EQ = s_NE = _cmp

    def s_And(self, e):
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(x, E.IntImm):
                return y if x.value else E.IntImm(0, "bool")
        return e

    def s_Or(self, e):
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(x, E.IntImm):
                return E.IntImm(1, "bool") if x.value else y
        return e

    def s_Not(self, e):
        if isinstance(e.a, E.IntImm):
            return E.IntImm(1 - e.a.value, "bool")
        if isinstance(e.a, E.Not):
            return e.a.a
        return e

    def s_Select(self, e):
        if isinstance(e.cond, E.IntImm):
            return e.true_value if e.cond.value else e.false_value
        return e

    def s_Cast(self, e):
        if isinstance(e.value, (E.IntImm, E.FloatImm)) and dt.lanes(e.dtype) == 1:
            return E.cast(e.value, e.dtype)
        return e

    def s_Div(self, e):
        if isinstance(e.a, E.FloatImm) and isinstance(e.b, E.FloatImm) and e.b.value != 0:
            return E.FloatImm(e.a.value / e.b.value, e.dtype)
        if E.is_const(e.b, 1):
            return e.a
        return e


def simplify(e, ranges: dict | None = None):
    """Simplify an expression given optional var -> (lo, hi) ranges."""
    return Analyzer(ranges).simplify(e)
