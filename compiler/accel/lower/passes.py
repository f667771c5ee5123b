"""Accelerator lowering passes over the TIR of an accelerator schedule (VTA's hardware passes).

Each pass is a small factory returning PrimFunc -> PrimFunc. They run after FlattenStorage, so
every buffer access has one flat element index; the passes turn element indices into entry
indices (one entry = one (batch, block) tile, env.entry_elems). PIPELINE lists them in order.
"""
from __future__ import annotations

from typing import Callable

from accel.isa import AluOp, Stage
from accel.isa.config import PAD_BITS

from ...tir import expr as E
from ...tir.arith import Analyzer, linear
from ...tir.functor import Mutator, collect, post_order_visit, substitute
from ...tir.passes import get_pass
from ...tir.stmt import (
    Allocate,
    AttrStmt,
    Buffer,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    PrimFunc,
    SeqStmt,
    Stmt,
    seq,
)
from .env import (
    ACC_SCOPE,
    DEP_POP,
    DEP_PUSH,
    GEMM,
    GEMM_RESET,
    LOAD_2D,
    SCOPES,
    STORE_2D,
    UOP,
    UOP_KERNEL,
    UOP_LOOP,
    AccelEnv,
    LowerError,
    UopOp,
)

Pass = Callable[[PrimFunc], PrimFunc]


# ---- helpers ------------------------------------------------------------------------------------
def _uses(node, vars_: set) -> bool:
    hit = []
    post_order_visit(node, lambda n: hit.append(1) if isinstance(n, E.Var) and n in vars_ else None)
    return bool(hit)


def _conjuncts(c) -> list:
    if isinstance(c, E.And):
        return _conjuncts(c.a) + _conjuncts(c.b)
    return [c]


def _as_upper(c, v):
    """c as `coef*v + rest < 0` (a Linear rest) when it bounds v; None otherwise."""
    if not isinstance(c, (E.LT, E.LE, E.GT, E.GE)) or not E.dt.is_int(c.a.dtype):
        return None
    d = linear(E.Sub(c.a, c.b))
    if isinstance(c, E.LE):
        d.const -= 1
    elif isinstance(c, E.GT):
        d = d.scaled(-1)
    elif isinstance(c, E.GE):   # b - a <= 0  ->  b - a - 1 < 0
        d = d.scaled(-1)
        d.const -= 1
    coef = d.coef_of(v)
    if coef == 0:
        return None
    rest = d.copy()
    rest.add_term(v, -coef)
    return coef, rest


def _chain(stmt):
    """Loops of a perfect nest (outer first) and the innermost statement."""
    loops = []
    while isinstance(stmt, For):
        loops.append(stmt)
        stmt = stmt.body
    return loops, stmt


def _entry_index(idx, elems: int, what: str):
    """Flat element index -> (entry index Linear) when it addresses whole entries."""
    lin = linear(idx)
    if lin.const % elems or any(c % elems for _, c in lin.terms.values()):
        raise LowerError(f"{what}: index `{idx}` does not address whole {elems}-element entries")
    out = lin.copy()
    out.const //= elems
    for t in out.terms.values():
        t[1] //= elems
    return out


def _split_lanes(loops, elems: int, indices: list, what: str):
    """Separate the innermost loops that walk the elements of one entry (identically in every
    index) from the entry loops; returns (entry loops, indices with lane vars set to 0)."""
    lanes, n = [], 1
    for lp in reversed(loops):
        if n == elems:
            break
        coefs = {linear(i).coef_of(lp.loop_var) for i in indices}
        if len(coefs) != 1 or not isinstance(lp.extent, E.IntImm) or coefs.pop() != n:
            raise LowerError(f"{what}: loop '{lp.loop_var.name}' does not walk the elements of one entry "
                             f"contiguously (entries hold {elems} elements)")
        lanes.append(lp)
        n *= lp.extent.value
    if n != elems:
        raise LowerError(f"{what}: the innermost loops cover {n} elements, an entry holds {elems}")
    zero = {lp.loop_var: E.const(0) for lp in lanes}
    return loops[:len(loops) - len(lanes)], [substitute(i, zero) for i in indices]


class _Merged:
    """An entry loop, possibly several adjacent loops merged into one affine level."""

    def __init__(self, loops: list, extent, coefs: tuple):
        self.loops, self.extent, self.coefs = loops, extent, coefs


def _merge(levels: list[_Merged]) -> list[_Merged]:
    """Merge adjacent levels when the outer one's factors are the inner one's times its extent."""
    out: list[_Merged] = []
    for m in levels:
        if out and isinstance(m.extent, E.IntImm) and \
                all(a == b * m.extent.value for a, b in zip(out[-1].coefs, m.coefs)):
            p = out.pop()
            out.append(_Merged(p.loops + m.loops, p.extent * m.extent, m.coefs))
        else:
            out.append(m)
    return out


def _uop_kernel(op: UopOp, loops: list[For], refs: list, affine: str) -> Stmt:
    """A micro-op kernel statement: up to two affine loop levels (chosen among `loops`, merged
    where possible) around the micro-op loop nest. refs: [(buffer Var or None, entry Linear)]
    for dst, src, wgt."""
    levels = [_Merged([lp], lp.extent, tuple(r.coef_of(lp.loop_var) if b is not None else 0 for b, r in refs))
              for lp in loops]
    merged = _merge(levels)
    if len(merged) <= 2:
        aff = merged
    else:
        aff = merged[:2] if affine == "outer" else merged[-2:]
    aff_vars = {lp.loop_var for m in aff for lp in m.loops}
    zero = {v: E.const(0) for v in aff_vars}
    args = []
    for b, r in refs:
        if b is None:
            args += [E.const(0), E.const(0)]
        else:
            args += [b, substitute(r.to_expr(), zero)]
    body: Stmt = Evaluate(E.Call("void", UOP, args))
    for lp in reversed([lp for lp in loops if lp.loop_var not in aff_vars]):
        body = For(lp.loop_var, lp.min, lp.extent, ForKind.SERIAL, body)
    for m in reversed(aff):
        var = m.loops[0].loop_var if len(m.loops) == 1 else E.Var("_".join(lp.loop_var.name for lp in m.loops))
        body = For(var, 0, m.extent, ForKind.SERIAL, body, annotations={UOP_LOOP: m.coefs})
    return AttrStmt(op, UOP_KERNEL, 0, body)


# ---- LiftGuards ---------------------------------------------------------------------------------
class _Lift(Mutator):
    def visit_For(self, s: For):
        body = self.visit(s.body)
        inner: set = set()
        node, path = body, []
        while isinstance(node, (For, AttrStmt)):
            if isinstance(node, For):
                inner.add(node.loop_var)
            path.append(node)
            node = node.body
        ext = s.extent
        if isinstance(node, IfThenElse) and node.else_case is None:
            keep = []
            for c in _conjuncts(node.condition):
                u = _as_upper(c, s.loop_var)
                if u is not None and u[0] == 1 and not _uses(u[1].to_expr(), inner) and s.min.value == 0:
                    ext = E.min_expr(ext, E.sub(E.const(0), u[1].to_expr()))
                else:
                    keep.append(c)
            if len(keep) != len(_conjuncts(node.condition)):
                new = node.then_case if not keep else IfThenElse(E.logical_and(*keep), node.then_case)
                for p in reversed(path):
                    new = For(p.loop_var, p.min, p.extent, p.kind, new, p.thread_tag, p.annotations) \
                        if isinstance(p, For) else AttrStmt(p.node, p.key, p.value, new)
                body = new
        hoist = []
        if isinstance(body, IfThenElse) and body.else_case is None and s.kind != ForKind.VTHREAD:
            conj = _conjuncts(body.condition)
            hoist = [c for c in conj if not _uses(c, {s.loop_var})]
            if hoist:   # guards that do not depend on this loop move above it
                rest = [c for c in conj if _uses(c, {s.loop_var})]
                body = body.then_case if not rest else IfThenElse(E.logical_and(*rest), body.then_case)
        if body is s.body and ext is s.extent:
            return s
        out = For(s.loop_var, s.min, Analyzer().simplify(ext), s.kind, body, s.thread_tag, s.annotations)
        return IfThenElse(E.logical_and(*hoist), out) if hoist else out

    def visit_AttrStmt(self, s: AttrStmt):
        body = self.visit(s.body)
        if s.key.startswith("pragma_") and isinstance(body, IfThenElse) and body.else_case is None:
            return IfThenElse(body.condition, AttrStmt(s.node, s.key, s.value, body.then_case))
        return s if body is s.body else AttrStmt(s.node, s.key, s.value, body)


def LiftGuards() -> Pass:
    """Guards `if v + c < B` that bound a loop variable (from splits that do not divide and from
    tiles that overhang the tensor) become the loop's extent min(extent, B - c), evaluated per
    iteration of the outer loops: the nest stays a perfect loop nest for the instruction passes.

    Before: for x in range(3): if t*3 + x < 5: body     After: for x in range(min(3, 5 - t*3)): body
    """
    def run(f: PrimFunc) -> PrimFunc:
        return f.with_body(_Lift().visit(f.body))
    return run


# ---- InjectALU ----------------------------------------------------------------------------------
_BIN = {E.Add: AluOp.ADD, E.Min: AluOp.MIN, E.Max: AluOp.MAX, E.Mul: AluOp.MUL}


def _alu_ops(value, where: str):
    """(lhs load, [(AluOp, imm or None, rhs load or None)]) of an elementwise value."""
    if isinstance(value, E.Max) and isinstance(value.a, E.Min) and isinstance(value.b, E.IntImm) \
            and isinstance(value.a.b, E.IntImm) and isinstance(value.a.a, E.BufferLoad):
        lo, hi = value.b.value, value.a.b.value
        if lo == -hi:
            return value.a.a, [(AluOp.CLIP, hi, None)]
        return value.a.a, [(AluOp.MIN, hi, None), (AluOp.MAX, lo, None)]
    if isinstance(value, (E.Shr, E.Shl)) and isinstance(value.a, E.BufferLoad) and isinstance(value.b, E.IntImm):
        k = value.b.value
        return value.a, [(AluOp.SHR, k if isinstance(value, E.Shr) else -k, None)]
    op = _BIN.get(type(value))
    if op is not None:
        a, b = value.a, value.b
        if not isinstance(a, E.BufferLoad):
            a, b = b, a
        if isinstance(a, E.BufferLoad):
            if isinstance(b, E.IntImm):
                return a, [(op, b.value, None)]
            if isinstance(b, E.BufferLoad):
                return a, [(op, None, b)]
    raise LowerError(f"{where}: `{value}` is not an accelerator ALU operation (dst = op(dst, acc or imm) "
                     f"with op one of {', '.join(o.name for o in AluOp)})")


class _InjectALU(Mutator):
    def __init__(self, env: AccelEnv):
        self.env = env
        self.alias: dict = {}     # Buffer -> Buffer it now lives in (in-place epilogue)

    def visit_AttrStmt(self, s: AttrStmt):
        if s.key != "pragma_alu":
            return self.generic_visit(s)
        loops, st = _chain(s.body)
        where = f"ALU stage at {getattr(s.node, 'name', s.node)}"
        if not isinstance(st, BufferStore):
            raise LowerError(f"{where}: expected a perfect loop nest around one store, got `{st}`")
        lhs, ops = _alu_ops(st.value, where)
        dst, src = st.buffer, lhs.buffer
        for b in (dst, src) + tuple(r.buffer for _, _, r in ops if r is not None):
            if b.scope != ACC_SCOPE:
                raise LowerError(f"{where}: buffer '{b.name}' is in '{b.scope}'; the ALU works on {ACC_SCOPE}")
        E_ = self.env.entry_elems(ACC_SCOPE)
        idx = [st.indices[0], lhs.indices[0]] + [r.indices[0] for _, _, r in ops if r is not None]
        if linear(E.Sub(idx[0], idx[1])).terms or linear(E.Sub(idx[0], idx[1])).const:
            raise LowerError(f"{where}: the ALU updates in place; '{dst.name}' and '{src.name}' are indexed "
                             f"differently (`{idx[0]}` vs `{idx[1]}`)")
        if dst is not src:
            self.alias[dst] = self.alias.get(src, src)
        buf = self.alias.get(dst, dst)
        entry_loops, idx = _split_lanes(loops, E_, idx, where)
        out = []
        for op, imm, rhs in ops:
            refs = [(buf.data, _entry_index(idx[0], E_, where))]
            if rhs is not None:
                refs.append((self.alias.get(rhs.buffer, rhs.buffer).data, _entry_index(idx[2], E_, where)))
            else:
                refs.append((None, None))
            refs.append((None, None))
            out.append(_uop_kernel(UopOp("alu", alu_op=op.name, imm=imm), entry_loops, refs, "inner"))
        return seq(*out)


class _Rename(Mutator):
    def __init__(self, alias):
        self.alias = alias

    def visit_BufferLoad(self, e):
        idx = tuple(self.visit(i) for i in e.indices)
        b = self.alias.get(e.buffer, e.buffer)
        return e if b is e.buffer and idx == e.indices else E.BufferLoad(b, idx)

    def visit_BufferStore(self, s):
        b = self.alias.get(s.buffer, s.buffer)
        v, idx = self.visit(s.value), tuple(self.visit(i) for i in s.indices)
        return BufferStore(b, v, idx)

    def visit_Var(self, v):
        for old, new in self.alias.items():
            if v is old.data:
                return new.data
        return v

    def visit_Allocate(self, s):
        body = self.visit(s.body)
        return body if s.buffer in self.alias else Allocate(s.buffer, body)


def InjectALU(env: AccelEnv) -> Pass:
    """Elementwise loop nests under pragma "alu" -> ALU instructions over micro-op kernels.

    Each store dst[i] = op(src[i], acc[j] or imm) over acc_buffer becomes one ALU instruction per
    operation (clip(lo, hi) is CLIP when lo == -hi, else MIN then MAX; x << k is SHR by -k). The
    ALU updates in place, so dst is renamed to src from here on (the epilogue chain shares one
    buffer, as VTA's storage rewrite does). Innermost loops over one entry's elements are the
    vector lanes; the entry loops fold into the two affine loop levels (merged where contiguous),
    outer ones enumerate micro-ops.
    """
    def run(f: PrimFunc) -> PrimFunc:
        m = _InjectALU(env)
        body = m.visit(f.body)
        # chains: bias_add -> conv, shr -> bias_add -> conv
        for k in list(m.alias):
            v = m.alias[k]
            while v in m.alias:
                v = m.alias[v]
            m.alias[k] = v
        return f.with_body(_Rename(m.alias).visit(body)) if m.alias else f.with_body(body)
    return run


# ---- InjectDMA ----------------------------------------------------------------------------------
def _dma_value(value):
    """(source load, padding condition or None) of a copy's stored value."""
    if isinstance(value, E.Cast):
        value = value.value
    if isinstance(value, E.BufferLoad):
        return value, None
    if isinstance(value, E.Select) and isinstance(value.true_value, (E.BufferLoad, E.Cast)) and \
            isinstance(value.false_value, E.IntImm) and value.false_value.value == 0:
        tv = value.true_value.value if isinstance(value.true_value, E.Cast) else value.true_value
        return tv, value.cond
    return None, None


class _InjectDMA(Mutator):
    def __init__(self, env: AccelEnv):
        self.env = env
        self.ana = Analyzer()

    def visit_AttrStmt(self, s: AttrStmt):
        if s.key != "pragma_dma_copy":
            return self.generic_visit(s)
        loops, st = _chain(s.body)
        where = f"copy stage at {getattr(s.node, 'name', s.node)}"
        if not isinstance(st, BufferStore):
            raise LowerError(f"{where}: expected a perfect loop nest around one store, got `{st}`")
        src, cond = _dma_value(st.value)
        if src is None and isinstance(st.value, E.IntImm) and st.value.value == 0 and st.buffer.scope in SCOPES:
            return self._zero_fill(loops, st, where)
        if src is None:
            raise LowerError(f"{where}: `{st.value}` is not a copy (optionally zero-padded)")
        # a conjunct that no copy loop appears in decides for the whole tile (a tile lying wholly
        # in the padding): the copy runs under it, a zero fill of the region otherwise
        tile_preds, kept = [], []
        for c in (_conjuncts(cond) if cond is not None else []):
            whole = isinstance(c, E.CmpOp) and E.dt.is_int(c.a.dtype) and \
                not any(linear(E.Sub(c.a, c.b)).coef_of(lp.loop_var) for lp in loops)
            (tile_preds if whole else kept).append(c)
        cond = E.logical_and(*kept) if kept else None
        dst = st.buffer
        if tile_preds and not (dst.scope in SCOPES and src.buffer.scope == "global"):
            raise LowerError(f"{where}: a condition on the whole tile (`{tile_preds[0]}`) outside a LOAD")
        if dst.scope in SCOPES and src.buffer.scope == "global":
            load, sram, dram = True, dst, src.buffer
            sram_idx, dram_idx = st.indices[0], src.indices[0]
        elif dst.scope == "global" and src.buffer.scope == ACC_SCOPE:
            if cond is not None:
                raise LowerError(f"{where}: STORE has no padding")
            load, sram, dram = False, src.buffer, dst
            sram_idx, dram_idx = src.indices[0], st.indices[0]
        else:
            raise LowerError(f"{where}: copy from '{src.buffer.scope}' to '{dst.scope}' is not a DMA "
                             f"(LOAD: global -> {'/'.join(SCOPES)}, STORE: {ACC_SCOPE} -> global)")
        elems = self.env.entry_elems(sram.scope)
        entry_loops, (sram_idx, dram_idx) = _split_lanes(loops, elems, [sram_idx, dram_idx], where)
        si, di = _entry_index(sram_idx, elems, where), _entry_index(dram_idx, elems, where)
        # padding: each conjunct bounds one loop variable: v >= lo or v < hi
        bounds: dict = {}
        for c in (_conjuncts(cond) if cond is not None else []):
            hit = [lp for lp in entry_loops if linear(E.Sub(c.a, c.b)).coef_of(lp.loop_var)] \
                if isinstance(c, E.CmpOp) else []
            u = _as_upper(c, hit[0].loop_var) if len(hit) == 1 else None
            if u is None or abs(u[0]) != 1:
                raise LowerError(f"{where}: padding condition `{c}` must bound one loop variable")
            lp = hit[0]
            rest = u[1].to_expr()
            lo, hi = bounds.get(lp.loop_var, (E.const(0), lp.extent))
            if u[0] == 1:       # v + rest < 0
                hi = E.min_expr(hi, E.sub(E.const(0), rest))
            else:               # -v + rest < 0  ->  v > rest  ->  v >= rest + 1
                lo = E.max_expr(lo, rest + 1)
            bounds[lp.loop_var] = (lo, hi)
        if load and entry_loops and not isinstance(entry_loops[-1].extent, E.IntImm):
            # a narrowed row (tile overhanging the tensor) is loaded at full width, the overhang
            # as zero padding, so on-chip rows stay back to back
            lp = entry_loops[-1]
            ub = self.ana.bound(lp.extent)[1]
            if ub is not None:
                lo, hi = bounds.get(lp.loop_var, (E.const(0), lp.extent))
                bounds[lp.loop_var] = (lo, E.min_expr(hi, lp.extent))
                entry_loops = entry_loops[:-1] + [For(lp.loop_var, lp.min, ub, lp.kind, lp.body)]
        levels = [_Merged([lp], lp.extent, (si.coef_of(lp.loop_var), di.coef_of(lp.loop_var))) for lp in entry_loops]
        padded = set(bounds)
        merged: list[_Merged] = []
        for m in levels:
            if merged and not (padded & {lp.loop_var for lp in merged[-1].loops + m.loops}):
                merged = merged[:-1] + _merge([merged[-1], m])
            else:
                merged.append(m)
        # x: innermost level when contiguous on both sides; y: the next one
        x = merged[-1] if merged and merged[-1].coefs == (1, 1) else None
        rest_levels = merged[:-1] if x is not None else merged
        y = rest_levels[-1] if rest_levels else None
        outer = rest_levels[:-1] if y is not None else []
        one = E.const(1)

        def span(m):
            if m is None:
                return one, E.const(0), E.const(0), one
            lo, hi = bounds.get(m.loops[0].loop_var, (None, None)) if len(m.loops) == 1 else (None, None)
            # a narrowed extent is negative for a tile past the tensor's end (the loop ran no
            # iteration): nothing to transfer, and no negative padding
            ext = E.max_expr(m.extent, 0)   # folds to the constant when the extent is one
            if lo is None:
                return ext, E.const(0), E.const(0), ext
            p0 = E.min_expr(E.max_expr(lo, 0), ext)
            p1 = E.min_expr(E.max_expr(ext - hi, 0), ext - p0)
            return ext - p0 - p1, p0, p1, ext

        def call(y_lv, x_lv):
            ys, yp0, yp1, _ = span(y_lv)
            xs, xp0, xp1, xw = span(x_lv)
            zero, at = {}, {}
            for lv, p0 in ((y_lv, yp0), (x_lv, xp0)):
                for lp in (lv.loops if lv is not None else []):
                    zero[lp.loop_var] = E.const(0)
                    at[lp.loop_var] = p0 if len(lv.loops) == 1 else E.const(0)
            sram_off = self.ana.simplify(substitute(si.to_expr(), zero))
            dram_off = self.ana.simplify(substitute(di.to_expr(), at))
            stride = E.const(y_lv.coefs[1]) if y_lv is not None else xw
            if load:
                args = [E.StringImm(self.env.mem_type(sram.scope).name.lower()), sram.data, sram_off, dram.data,
                        dram_off] + [self.ana.simplify(a) for a in (ys, xs, stride, yp0, yp1, xp0, xp1)]
                return Evaluate(E.Call("void", LOAD_2D, args))
            return Evaluate(E.Call("void", STORE_2D, [sram.data, sram_off, dram.data, dram_off,
                                                      self.ana.simplify(ys), self.ana.simplify(xs), stride]))

        def rows(y_lv):
            """Fallback: one transfer per row (on-chip rows not back to back)."""
            body = call(None, x)
            for lp in reversed(y_lv.loops):
                body = For(lp.loop_var, lp.min, lp.extent, ForKind.SERIAL, body)
            return body

        if y is None:
            body = call(None, x)
        else:
            xw = span(x)[3]
            sram_row = E.const(y.coefs[0])
            same = self.ana.simplify(E.EQ(sram_row, xw)) if not isinstance(xw, E.IntImm) else \
                E.const(y.coefs[0] == xw.value, "bool")
            if y.loops and len(y.loops) == 1 and y.loops[0].loop_var in bounds:
                row_ok = False   # a padded y is only expressible in one 2-D transfer
            else:
                row_ok = True
            if isinstance(same, E.IntImm):
                if same.value:
                    body = call(y, x)
                elif row_ok:
                    body = rows(y)
                else:
                    raise LowerError(f"{where}: padded rows of {y.coefs[0]} entries in the on-chip buffer "
                                     f"but {xw} per transfer row")
            elif row_ok:
                body = IfThenElse(same, call(y, x), rows(y))
            else:
                raise LowerError(f"{where}: cannot prove on-chip rows ({y.coefs[0]} entries) match the "
                                 f"transfer rows ({xw})")
        for m in reversed(outer):
            for lp in reversed(m.loops):
                if lp.loop_var in bounds:
                    raise LowerError(f"{where}: padding on loop '{lp.loop_var.name}', outside the 2-D transfer")
                body = For(lp.loop_var, lp.min, lp.extent, ForKind.SERIAL, body)
        if tile_preds:
            zeros = BufferStore(st.buffer, E.const(0, st.buffer.dtype), st.indices)
            body = IfThenElse(E.logical_and(*tile_preds), body, self._zero_fill(loops, zeros, where))
        return body


def _zero_fill(self, loops, st, where):
    """A region that is all padding (folded to a constant 0): a LOAD of padding only."""
    sram = st.buffer
    elems = self.env.entry_elems(sram.scope)
    entry_loops, (idx,) = _split_lanes(loops, elems, [st.indices[0]], where)
    si = _entry_index(idx, elems, where)
    levels = _merge([_Merged([lp], lp.extent, (si.coef_of(lp.loop_var),)) for lp in entry_loops])
    x = levels[-1] if levels and levels[-1].coefs == (1,) else None
    rest = levels[:-1] if x is not None else levels
    xw = x.extent if x is not None else E.const(1)
    y = rest[-1] if rest and self.ana.can_prove(E.EQ(E.const(rest[-1].coefs[0]), xw)) else None
    outer = rest[:-1] if y is not None else rest
    yh = y.extent if y is not None else E.const(1)
    zero = {lp.loop_var: E.const(0) for m in (x, y) if m is not None for lp in m.loops}
    off = self.ana.simplify(substitute(si.to_expr(), zero))
    mem = E.StringImm(self.env.mem_type(sram.scope).name.lower())

    def fill(o, yp, xp):
        return Evaluate(E.Call("void", LOAD_2D, [mem, sram.data, o, E.const(0), E.const(0), E.const(0), E.const(0),
                                                  E.const(1), E.const(yp) if isinstance(yp, int) else yp,
                                                  E.const(0), E.const(xp) if isinstance(xp, int) else xp,
                                                  E.const(0)]))
    n = self.ana.simplify(yh * xw)
    lim = (1 << PAD_BITS) - 1
    if isinstance(n, E.IntImm):   # pads are PAD_BITS wide: fill in blocks of at most lim x lim
        fills, rem, at = [], n.value, 0
        while rem:
            xp = min(lim, rem)
            yp = min(lim, rem // xp)
            fills.append(fill(off + at, yp, xp))
            at, rem = at + xp * yp, rem - xp * yp
        body: Stmt = seq(*fills)
    elif all(b is not None and b <= lim for b in (self.ana.bound(yh)[1], self.ana.bound(xw)[1])):
        body = fill(off, yh, xw)
    else:   # a narrowed region that may pass the pads' width: rows of at most lim entries, enough for its
        ub = self.ana.bound(n)[1]   # largest size (a row past the region's size fills nothing)
        if ub is None:
            raise LowerError(f"{where}: cannot bound the zero-filled region's {n} entries")
        body = seq(*[fill(off + k * lim, 1, self.ana.simplify(E.min_expr(E.max_expr(n - k * lim, 0), lim)))
                     for k in range(-(-ub // lim))])
    for m in reversed(outer):
        for lp in reversed(m.loops):
            body = For(lp.loop_var, lp.min, lp.extent, ForKind.SERIAL, body)
    return body


_InjectDMA._zero_fill = _zero_fill


def InjectDMA(env: AccelEnv) -> Pass:
    """Copy loop nests under pragma "dma_copy" -> accel.load_2d / accel.store_2d calls.

    Loads copy global -> inp/wgt/acc_buffer, stores acc_buffer -> global (narrowed by the
    hardware). The innermost loops walking one entry's elements disappear; adjacent entry loops
    contiguous on both sides merge; the innermost contiguous level is the transfer row (x), the
    next one the rows (y, DRAM stride from the index); outer levels stay loops around the call.
    A zero-padding select(cond, src, 0) becomes the LOAD's pads: each conjunct bounding the y or
    x variable gives pad0 = clamp(lo, 0, ext), pad1 = clamp(ext - hi, 0, ext - pad0), and the
    DRAM offset starts at the first unpadded entry. When on-chip rows cannot be proven back to
    back (a narrowed tail tile) the call is versioned: one 2-D transfer if they are, else one
    transfer per row.
    """
    def run(f: PrimFunc) -> PrimFunc:
        return f.with_body(_InjectDMA(env).visit(f.body))
    return run


# ---- FoldUopLoop ------------------------------------------------------------------------------------
def _gemm_only(s) -> bool:
    if isinstance(s, For):
        return _gemm_only(s.body)
    if isinstance(s, Evaluate):
        return isinstance(s.value, E.Call) and s.value.op in (GEMM, GEMM_RESET)
    return False


def _ptr(arg):
    if not (isinstance(arg, E.Call) and arg.op == "address_of" and isinstance(arg.args[0], E.BufferLoad)):
        raise LowerError(f"GEMM operand `{arg}` is not an address of a buffer element")
    ld = arg.args[0]
    return ld.buffer, ld.indices[0]


class _FoldUop(Mutator):
    def __init__(self, env: AccelEnv):
        self.env = env

    def visit_For(self, s: For):
        if not _gemm_only(s):
            return self.generic_visit(s)
        return self._fold(s)

    def visit_Evaluate(self, s: Evaluate):
        if _gemm_only(s):
            return self._fold(s)
        return s

    def _fold(self, s) -> Stmt:
        loops, ev = _chain(s)
        c = ev.value
        reset = c.op == GEMM_RESET
        refs = []
        scopes = ("acc_buffer",) if reset else ("acc_buffer", "inp_buffer", "wgt_buffer")
        for arg, scope in zip(c.args, scopes):
            buf, idx = _ptr(arg)
            if buf.scope != scope:
                raise LowerError(f"GEMM operand '{buf.name}' is in '{buf.scope}', expected '{scope}'")
            refs.append((buf.data, _entry_index(idx, self.env.entry_elems(scope), f"GEMM on '{buf.name}'")))
        while len(refs) < 3:
            refs.append((None, None))
        return _uop_kernel(UopOp("gemm", reset=reset), loops, refs, "inner" if reset else "outer")


def FoldUopLoop(env: AccelEnv) -> Pass:
    """GEMM intrinsic calls inside a loop nest -> one GEMM instruction over a micro-op kernel.

    The accumulate nest keeps its two outermost loops (the schedule puts the output rows and
    columns there) as the instruction's affine loop levels, with the dst/src/wgt entry factors
    read off the indices; the loops inside enumerate the micro-ops (o, ic, dy, dx), so a
    kernel holds o*ic*kh*kw micro-ops whatever the tile's rows and columns. The reset nest
    merges contiguous loops first and keeps its two innermost levels.
    """
    def run(f: PrimFunc) -> PrimFunc:
        return f.with_body(_FoldUop(env).visit(f.body))
    return run


# ---- InjectTokens ------------------------------------------------------------------------------
def _call_stage(c: E.Call):
    if c.op == LOAD_2D:
        return Stage.COMPUTE if c.args[0].value == "acc" else Stage.LOAD
    if c.op == STORE_2D:
        return Stage.STORE
    return None


def _touch(stmt) -> dict:
    """{buffer data Var: set of stages} accessed by the statement."""
    out: dict = {}

    def add(v, st):
        if isinstance(v, E.Var):
            out.setdefault(v, set()).add(st)

    def f(n):
        if isinstance(n, AttrStmt) and n.key == UOP_KERNEL:
            for u in collect(n.body, (E.Call,)):
                if u.op == UOP:
                    for a in u.args[0::2]:
                        add(a, Stage.COMPUTE)
        elif isinstance(n, E.Call):
            st = _call_stage(n)
            if n.op == LOAD_2D:
                add(n.args[1], st)
            elif n.op == STORE_2D:
                add(n.args[0], st)
    post_order_visit(stmt, f)
    return out


def _dep(op: str, frm: Stage, to: Stage) -> Stmt:
    return Evaluate(E.Call("void", op, [E.StringImm(frm.name.lower()), E.StringImm(to.name.lower())]))


class _Tokens(Mutator):
    def __init__(self):
        self.vt = 1
        self.primes: list = []     # (producer, consumer, slots)

    def visit_For(self, s: For):
        if s.kind == ForKind.VTHREAD:
            old, self.vt = self.vt, s.extent.value
            out = self.generic_visit(s)
            self.vt = old
            return out
        return self.generic_visit(s)

    def visit_Allocate(self, s: Allocate):
        if s.buffer.scope not in SCOPES:
            return self.generic_visit(s)
        chain, node = [], s
        while isinstance(node, Allocate) and node.buffer.scope in SCOPES:
            chain.append(node.buffer)
            node = node.body
        body = self.visit(node)
        bufs = {b.data for b in chain}
        items = list(body.seq) if isinstance(body, SeqStmt) else [body]
        stages = []
        for it in items:
            t = _touch(it)
            stages.append(set().union(*[t[v] for v in t if v in bufs]) if any(v in bufs for v in t) else set())
        used = set().union(*stages) if stages else set()
        if len(used) == 2 and used in ({Stage.LOAD, Stage.COMPUTE}, {Stage.COMPUTE, Stage.STORE}):
            p, q = sorted(used)
            ps = [i for i, st in enumerate(stages) if p in st]
            qs = [i for i, st in enumerate(stages) if q in st]
            if any(p in stages[i] for i in qs) or max(ps) > min(qs):
                names = ", ".join(b.name for b in chain)
                raise LowerError(f"buffers {names}: {p.name.lower()} and {q.name.lower()} work interleave; the "
                                 f"token protocol needs all {p.name.lower()} work before the {q.name.lower()} work")
            if any((pp, qq) == (p, q) for pp, qq, _ in self.primes):
                raise LowerError(f"two buffer groups synchronize {p.name.lower()}->{q.name.lower()}; one per "
                                 f"token queue is supported")
            self.primes.append((p, q, self.vt))
            new = []
            for i, it in enumerate(items):
                if i == ps[0]:
                    new.append(_dep(DEP_POP, q, p))
                if i == qs[0]:
                    new.append(_dep(DEP_POP, p, q))
                new.append(it)
                if i == ps[-1]:
                    new.append(_dep(DEP_PUSH, p, q))
                if i == qs[-1]:
                    new.append(_dep(DEP_PUSH, q, p))
            body = SeqStmt(new)
        elif len(used) > 2:
            raise LowerError(f"buffers {', '.join(b.name for b in chain)} are used by three stages")
        for b in reversed(chain):
            body = Allocate(b, body)
        return body


def InjectTokens() -> Pass:
    """Dependency tokens between the load, compute and store stages (VTA's coproc sync).

    Each group of on-chip buffers allocated together is one generation of a slot, written by a
    producer stage and then read by a consumer stage (load -> compute for input/weight tiles,
    compute -> store for accumulator tiles). In its scope: pop(consumer->producer) before the
    producer's first statement, push(producer->consumer) after its last, pop(producer->consumer)
    before the consumer's first, push(consumer->producer) after its last. The program starts by
    pushing one consumer->producer token per slot (virtual threads give a group one slot each)
    and ends by popping them, so every queue ends empty and a slot is rewritten only after its
    previous reader is done.
    """
    def run(f: PrimFunc) -> PrimFunc:
        t = _Tokens()
        body = t.visit(f.body)
        pre = [_dep(DEP_PUSH, q, p) for p, q, n in t.primes for _ in range(n)]
        post = [_dep(DEP_POP, q, p) for p, q, n in t.primes for _ in range(n)]
        return f.with_body(seq(*pre, body, *post))
    return run


# ---- LowerVirtualThreads -------------------------------------------------------------------------
def _is_dep(s) -> str | None:
    if isinstance(s, Evaluate) and isinstance(s.value, E.Call) and s.value.op in (DEP_PUSH, DEP_POP):
        return s.value.op
    return None


def _has_dep(s) -> bool:
    return any(c.op in (DEP_PUSH, DEP_POP) for c in collect(s, (E.Call,)))


class _Slots(Mutator):
    """Offsets of the sram buffers allocated under a virtual thread by slot * entries."""

    def __init__(self, offs: dict):
        self.offs = offs   # data Var -> offset expr (entries)

    def visit_Call(self, c: E.Call):
        args = [self.visit(a) for a in c.args]
        pairs = {LOAD_2D: [(1, 2)], STORE_2D: [(0, 1)], UOP: [(0, 1), (2, 3), (4, 5)]}.get(c.op, [])
        for vi, oi in pairs:
            off = self.offs.get(args[vi])
            if off is not None:
                args[oi] = args[oi] + off
        return E.Call(c.dtype, c.op, args)


def _interleave(s: Stmt, tv: E.Var, vt: int) -> Stmt:
    items = list(s.seq) if isinstance(s, SeqStmt) else [s]
    groups, pre = [], []
    for it in items:   # pops go with the next statement, pushes with the previous one
        d = _is_dep(it)
        if d == DEP_POP:
            pre.append(it)
        elif d == DEP_PUSH and groups:
            groups[-1][2].append(it)
        else:
            groups.append((pre, it, []))
            pre = []
    if pre:
        groups.append((pre, None, []))
    out = []
    for pops, it, pushes in groups:
        if isinstance(it, For) and it.kind != ForKind.VTHREAD and _has_dep(it) and not _uses(it.extent, {tv}):
            out += [substitute(p, {tv: E.const(k)}) for k in range(vt) for p in pops]
            out.append(For(it.loop_var, it.min, it.extent, it.kind, _interleave(it.body, tv, vt), it.thread_tag,
                           it.annotations))
            out += [substitute(p, {tv: E.const(k)}) for k in range(vt) for p in pushes]
        else:
            if it is not None and _has_dep(it) and not (isinstance(it, For)):
                if isinstance(it, (SeqStmt,)):
                    it = _interleave(it, tv, vt)
            for k in range(vt):
                out += [substitute(x, {tv: E.const(k)}) for x in pops + ([it] if it is not None else []) + pushes]
    return seq(*out)


class _VThread(Mutator):
    def __init__(self, env: AccelEnv):
        self.env = env

    def visit_For(self, s: For):
        if s.kind != ForKind.VTHREAD:
            return self.generic_visit(s)
        body = self.visit(s.body)
        vt, tv = s.extent.value, s.loop_var
        bufs: list[Buffer] = []

        def strip(n):
            if isinstance(n, Allocate) and n.buffer.scope in SCOPES:
                bufs.append(n.buffer)
                return strip(n.body)
            if isinstance(n, Allocate):
                return Allocate(n.buffer, strip(n.body))
            if isinstance(n, SeqStmt):
                return seq(*[strip(x) for x in n.seq])
            if isinstance(n, For):
                return For(n.loop_var, n.min, n.extent, n.kind, strip(n.body), n.thread_tag, n.annotations)
            if isinstance(n, AttrStmt) and n.key != UOP_KERNEL:
                return AttrStmt(n.node, n.key, n.value, strip(n.body))
            if isinstance(n, IfThenElse):
                return IfThenElse(n.condition, strip(n.then_case),
                                  strip(n.else_case) if n.else_case is not None else None)
            return n
        body = strip(body)
        new_bufs, offs = [], {}
        for b in bufs:
            nb = Buffer(b.name, (vt * b.numel(),), b.dtype, scope=b.scope)
            nb.data = b.data
            new_bufs.append(nb)
            offs[b.data] = tv * (b.numel() // self.env.entry_elems(b.scope))
        body = _Slots(offs).visit(body)
        out = _interleave(body, tv, vt)
        for nb in reversed(new_bufs):
            out = Allocate(nb, out)
        return out


def LowerVirtualThreads(env: AccelEnv) -> Pass:
    """Virtual threads -> interleaved instruction streams (VTA's InjectVirtualThread).

    Buffers allocated under a virtual-thread loop get one slot per thread (offset thread *
    entries). The loop disappears: its body is emitted once per thread, interleaved statement
    by statement (each with the token pops before it and pushes after it); loops that carry
    tokens and do not depend on the thread are shared, with the threads interleaved inside. So
    the loads of thread 1 run while thread 0 computes, and the stores of one overlap the others.
    """
    def run(f: PrimFunc) -> PrimFunc:
        return f.with_body(_VThread(env).visit(f.body))
    return run


def pipeline(env: AccelEnv) -> list[tuple[str, Pass, str]]:
    """The accelerator passes in order, each with why it sits there (after Flatten + Simplify)."""
    return [
        ("LiftGuards", LiftGuards(), "tail guards -> loop extents, so every nest is a perfect loop nest"),
        ("InjectALU", InjectALU(env), "epilogue nests -> ALU kernels, in place (before DMA sees the store's source)"),
        ("InjectDMA", InjectDMA(env), "copy nests -> 2-D LOAD/STORE with padding"),
        ("FoldUopLoop", FoldUopLoop(env), "GEMM nests -> one instruction with micro-ops and two affine loops"),
        ("InjectTokens", InjectTokens(), "dependency tokens per buffer group (needs the virtual-thread loops)"),
        ("LowerVirtualThreads", LowerVirtualThreads(env), "slots per thread, interleaved streams"),
        ("Simplify", get_pass("Simplify"), "fold the slot offsets and thread indices"),
    ]
