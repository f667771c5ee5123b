"""Lowering: a te Schedule -> a tir PrimFunc.

Steps, in order: inline (substitute compute_inline stages into their readers), bound inference
(consumers first: the region of every compute_at stage that one iteration of its attach loop
needs; leaf loop extents from split/fuse), then build each stage's loop nest (every leaf loop
runs from 0; root indices are recomputed from the leaves; a guard where a split does not
divide), place attached stages with their buffers at the start of their attach loop, and
replace tensorized nests by the intrinsic's statements. `lower()` then runs the generic tir
pipeline (compiler.tir.passes) unless raw=True.
"""
from __future__ import annotations

import logging
from typing import Sequence

from .errors import LowerError, ScheduleError, TensorizeError
from .te.schedule import ProducerMutator, Schedule, Split, Stage
from .te.tensor import ComputeOp, IterVar, Tensor
from .te.tensorize import match_bodies
from .tir import dtype as dt
from .tir import expr as E
from .tir import passes
from .tir.arith import Analyzer, Linear, linear
from .tir.functor import Mutator, post_order_visit, substitute
from .tir.stmt import Allocate, AttrStmt, Buffer, BufferStore, Evaluate, For, ForKind, IfThenElse, PrimFunc, Stmt, seq

log = logging.getLogger(__name__)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _StageInfo:
    """Bound-inference results of one stage."""

    def __init__(self):
        self.region_min: list = []          # per data axis, absolute min (expr)
        self.region_ext: list[int] = []     # per data axis
        self.ext: dict = {}                 # IterVar -> int, for root and derived iter vars
        self.rel: dict = {}                 # root IterVar -> expr of leaf vars (from 0)
        self.abs: dict = {}                 # root IterVar -> absolute index expr
        self.preds: list = []               # guards (expr), with the leaf vars they use
        self.buffer: Buffer | None = None


class _Inliner(ProducerMutator):
    def __init__(self, low: "_Lowering"):
        self.low = low

    def rewrite_load(self, e, idx):
        st = self.low.stage_of(e.producer)
        if st.attach_type == "inline":
            body = self.low.eff_body(st)
            return substitute(body, {a.var: i for a, i in zip(st.op.axis, idx)})
        return super().rewrite_load(e, idx)


class _ToBuffer(Mutator):
    """ProducerLoad -> BufferLoad at indices relative to the producer's region."""

    def __init__(self, low: "_Lowering"):
        self.low = low

    def visit_ProducerLoad(self, e):
        idx = [self.visit(i) for i in e.indices]
        st = self.low.stage_of(e.producer)
        info = self.low.info.get(st)
        buf = self.low.buf_of(st)
        if info is not None and info.region_min:
            idx = [i - m if not E.is_const(m, 0) else i for i, m in zip(idx, info.region_min)]
        return E.BufferLoad(buf, idx)


class _Lowering:
    def __init__(self, sch: Schedule, args: Sequence[Tensor], name: str):
        self.sch, self.name = sch, name
        self.params: list[Buffer] = []
        self.buf: dict = {}
        self.info: dict = {}
        self._eff: dict = {}
        for t in args:
            if not isinstance(t, Tensor):
                raise LowerError(f"lower '{name}': arguments must be tensors, got {t!r}")
            st = sch[t]
            if st in self.buf:
                raise LowerError(f"lower '{name}': tensor '{t.name}' is given twice in args")
            if st.attach_type == "inline":
                raise LowerError(f"lower '{name}': '{t.name}' is inlined (compute_inline) so it "
                                 "has no buffer to pass as an argument")
            if st.attach_type == "scope":
                raise LowerError(f"lower '{name}': '{t.name}' is an argument, so it must be computed "
                                 f"whole; it is compute_at '{st.attach_stage.name}'")
            b = Buffer(t.name, t.shape, t.dtype)
            self.buf[st] = b
            self.params.append(b)
        for op in sch.outputs:
            if sch.stage_map[op] not in self.buf:
                raise LowerError(f"lower '{name}': output '{op.name}' is missing from args")
        self.stages = [st for st in sch.stages if not st.is_placeholder and st.attach_type != "inline"]

    # ------------------------------------------------------------ graph helpers
    def stage_of(self, t: Tensor) -> Stage:
        return self.sch.stage_map[t.op]

    def eff_body(self, st: Stage) -> E.PrimExpr:
        if st not in self._eff:
            self._eff[st] = _Inliner(self).visit(st.op.body)
        return self._eff[st]

    def buf_of(self, st: Stage) -> Buffer:
        if st in self.buf:
            return self.buf[st]
        if st.is_placeholder:
            readers = [r.name for r in self.stages if self._reads_stage(r, st)]
            raise LowerError(f"lower '{self.name}': placeholder '{st.name}' is read by "
                             f"{', '.join(readers) or 'the schedule'} but is not in args")
        info = self.info[st]
        b = Buffer(st.name, info.region_ext, st.op.dtype, scope=st.scope)
        self.buf[st] = b
        return b

    def loads_of(self, reader: Stage, producer: Stage) -> list[E.ProducerLoad]:
        out = []

        def f(n):
            if isinstance(n, E.ProducerLoad) and self.stage_of(n.producer) is producer:
                out.append(n)
        post_order_visit(self.eff_body(reader), f)
        return out

    def _reads_stage(self, reader: Stage, producer: Stage) -> bool:
        return bool(self.loads_of(reader, producer))

    def consumers(self, st: Stage) -> list[Stage]:
        return [r for r in self.stages if r is not st and self._reads_stage(r, st)]

    def attach_path(self, st: Stage) -> list[tuple[Stage, IterVar]]:
        """[(P, ivar), (P's parent, ivar'), ...] from st outwards."""
        out, cur = [], st
        while cur.attach_type == "scope":
            out.append((cur.attach_stage, cur.attach_ivar))
            cur = cur.attach_stage
            if len(out) > len(self.sch.stages):
                raise ScheduleError(f"stage '{st.name}': compute_at forms a cycle")
        return out

    def inside(self, q: Stage, p: Stage, pos: int) -> bool:
        """Is stage q computed inside loop number `pos` (or deeper) of stage p?"""
        for anc, iv in self.attach_path(q):
            if anc is p:
                return p.leaf_iter_vars.index(iv) >= pos
        return False

    # ------------------------------------------------------------ bound inference
    def infer(self) -> None:
        order = list(reversed(self.stages))
        for st in order:
            info = _StageInfo()
            op: ComputeOp = st.op
            if st.attach_type == "root":
                info.region_min = [E.const(0) for _ in op.axis]
                info.region_ext = list(op.shape)
            else:
                self._infer_region(st, info)
            self.info[st] = info
            for a, m, n in zip(op.axis, info.region_min, info.region_ext):
                info.ext[a] = n
            for r in op.reduce_axis:
                info.ext[r] = r.dom.extent.value
            self._derive(st, info)

    def _relax_vars(self, p: Stage, pos: int) -> dict:
        """Loop vars of p inside loop number pos, and of every stage computed in that loop."""
        out = {}
        pinfo = self.info[p]
        for iv in p.leaf_iter_vars[pos + 1:]:
            out[iv.var] = (0, pinfo.ext[iv] - 1)
        for q in self.stages:
            if q is not p and q in self.info and self.inside(q, p, pos):
                qi = self.info[q]
                for iv in q.leaf_iter_vars:
                    out[iv.var] = (0, qi.ext[iv] - 1)
        return out

    def _thread_vars_outside(self, st: Stage) -> dict:
        """GPU: loops bound to threadIdx.* around st's attach point. A shared-memory stage is
        filled by the whole thread block, so its region covers every thread's needs."""
        out = {}
        for anc, iv in self.attach_path(st):
            ainfo = self.info[anc]
            for v in anc.leaf_iter_vars[:anc.leaf_iter_vars.index(iv) + 1]:
                a = anc.iter_attrs.get(v)
                if a is not None and a.thread is not None and a.thread.thread_tag.startswith("threadIdx"):
                    out[v.var] = (0, ainfo.ext[v] - 1)
        return out

    def _infer_region(self, st: Stage, info: _StageInfo) -> None:
        p, ivar = st.attach_stage, st.attach_ivar
        if p not in self.info:
            raise ScheduleError(f"stage '{st.name}': compute_at '{p.name}' but '{p.name}' is not "
                                f"computed after it (is '{p.name}' a consumer of '{st.name}'?)")
        if ivar not in p.leaf_iter_vars:
            raise ScheduleError(f"stage '{st.name}': compute_at axis '{ivar.name}' is no longer a "
                                f"loop of '{p.name}' (loops: {', '.join(v.name for v in p.leaf_iter_vars)})")
        pos = p.leaf_iter_vars.index(ivar)
        consumers = self.consumers(st)
        for q in consumers:
            if q is not p and not self.inside(q, p, pos):
                raise ScheduleError(
                    f"stage '{st.name}': compute_at '{p.name}' loop '{ivar.name}', but '{q.name}' "
                    f"also reads '{st.name}' outside that loop; attach '{st.name}' at a common "
                    "consumer or compute it at root")
        relax = self._relax_vars(p, pos)
        if st.scope == "shared":
            relax.update(self._thread_vars_outside(st))
        ana = self.analyzer()
        op: ComputeOp = st.op
        mins: list = [None] * len(op.axis)
        maxs: list = [None] * len(op.axis)
        for q in consumers:
            qinfo = self.info[q]
            vmap = {r.var: qinfo.abs[r] for r in list(q.op.axis) + list(q.op.reduce_axis)}
            for ld in self.loads_of(q, st):
                for d, idx in enumerate(ld.indices):
                    e = ana.simplify(substitute(idx, vmap))
                    s = _eval_set(e, relax)
                    if s is None:
                        lo, hi = E.const(0), E.const(op.shape[d] - 1)
                    else:
                        lo, hi = ana.simplify(s[0]), ana.simplify(s[1])
                    mins[d] = lo if mins[d] is None else _union(mins[d], lo, ana, True)
                    maxs[d] = hi if maxs[d] is None else _union(maxs[d], hi, ana, False)
        for d in range(len(op.axis)):
            n = op.shape[d]
            lo = ana.simplify(E.max_expr(mins[d], 0))
            ext = ana.simplify(maxs[d] - mins[d] + 1)
            if not isinstance(ext, E.IntImm):
                ext = ana.simplify(E.min_expr(maxs[d], n - 1) - lo + 1)
            if not isinstance(ext, E.IntImm):
                ub = ana.bound(ext)[1]
                if ub is None:
                    raise LowerError(f"stage '{st.name}': cannot bound the region of axis {d} "
                                     f"needed by '{p.name}' at '{ivar.name}' ([{mins[d]}, {maxs[d]}])")
                ext = E.const(ub)
            info.region_min.append(lo)
            info.region_ext.append(max(1, min(ext.value, n)))

    def analyzer(self) -> Analyzer:
        ana = Analyzer()
        for st, info in self.info.items():
            for iv in st.leaf_iter_vars:
                if iv in info.ext:
                    ana.bind(iv.var, 0, info.ext[iv] - 1)
        return ana

    def _derive(self, st: Stage, info: _StageInfo) -> None:
        """Leaf extents, root index expressions and guards from split/fuse relations."""
        ext = info.ext
        for rel in st.relations:
            if isinstance(rel, Split):
                pe = ext[rel.parent]
                if rel.factor is not None:
                    ie = rel.factor
                    oe = _ceil_div(pe, ie)
                else:
                    oe = rel.nparts
                    ie = _ceil_div(pe, oe)
                ext[rel.outer], ext[rel.inner] = oe, ie
            else:
                ext[rel.fused] = ext[rel.outer] * ext[rel.inner]
        val = {iv: iv.var for iv in st.leaf_iter_vars}
        preds = []
        for rel in reversed(st.relations):
            if isinstance(rel, Split):
                val[rel.parent] = val[rel.outer] * ext[rel.inner] + val[rel.inner]
                if ext[rel.outer] * ext[rel.inner] > ext[rel.parent]:
                    preds.append(val[rel.parent] < ext[rel.parent])
            else:
                val[rel.outer] = E.floordiv(val[rel.fused], ext[rel.inner])
                val[rel.inner] = E.floormod(val[rel.fused], ext[rel.inner])
        ana = Analyzer({iv.var: (0, ext[iv] - 1) for iv in st.leaf_iter_vars})
        op: ComputeOp = st.op
        for d, a in enumerate(op.axis):
            info.rel[a] = ana.simplify(val[a])
            info.abs[a] = ana.simplify(info.region_min[d] + info.rel[a]) \
                if not E.is_const(info.region_min[d], 0) else info.rel[a]
            if st.attach_type == "scope":
                # the region may start below 0 or run past the end where it was over-estimated
                top = ana.simplify(info.region_min[d] + (info.region_ext[d] - 1))
                hi = self.analyzer().bound(top)[1]
                if hi is None or hi >= op.shape[d]:
                    preds.append(info.abs[a] < op.shape[d])
        for r in op.reduce_axis:
            info.rel[r] = ana.simplify(val[r])
            info.abs[r] = ana.simplify(info.rel[r] + r.dom.min) if not E.is_const(r.dom.min, 0) else info.rel[r]
        info.preds = [ana.simplify(p) for p in preds]
        info.preds = [p for p in info.preds if not E.is_const(p, 1)]

    # ------------------------------------------------------------ statements
    def run(self) -> PrimFunc:
        self.infer()
        for st in self.stages:
            self.buf_of(st)
        body = seq(*[self.make_stage(st) for st in self.stages if st.attach_type == "root"])
        for st in reversed(self.stages):
            if st.attach_type == "root" and self.buf[st] not in self.params:
                body = Allocate(self.buf[st], body)
        return PrimFunc(self.name, self.params, body)

    def _for(self, st: Stage, iv: IterVar, body: Stmt, var=None) -> Stmt:
        attr = st.iter_attrs.get(iv)
        kind = attr.kind if attr is not None else ForKind.SERIAL
        tag = attr.thread.thread_tag if attr is not None and attr.thread is not None else None
        if attr is not None and attr.thread is not None and attr.thread.dom is not None:
            want = attr.thread.dom.extent
            if isinstance(want, E.IntImm) and want.value != self.info[st].ext[iv]:
                raise ScheduleError(f"stage '{st.name}': bind '{iv.name}' (extent "
                                    f"{self.info[st].ext[iv]}) to '{attr.thread.var.name}' of extent {want.value}")
        loop: Stmt = For(var if var is not None else iv.var, 0, self.info[st].ext[iv], kind, body, thread_tag=tag)
        if attr is not None:
            for key, value in reversed(attr.pragmas):
                loop = AttrStmt(iv.var, "pragma_" + key, value, loop)
        return loop

    def _attached(self, st: Stage, iv: IterVar) -> list[Stage]:
        return [q for q in self.stages if q.attach_type == "scope" and q.attach_stage is st and q.attach_ivar is iv]

    def _nest(self, st: Stage, leaves: list[IterVar], body: Stmt, attach: bool = True,
              rename: dict | None = None) -> Stmt:
        for iv in reversed(leaves):
            if attach:
                kids = self._attached(st, iv)
                if kids:
                    body = seq(*[self.make_stage(q) for q in kids], body)
                    for q in reversed(kids):
                        body = Allocate(self.buf[q], body)
            body = self._for(st, iv, body, var=rename.get(iv.var) if rename else None)
        return body

    def _guard(self, preds, body: Stmt) -> Stmt:
        if not preds:
            return body
        return IfThenElse(E.logical_and(*preds), body)

    def make_stage(self, st: Stage) -> Stmt:
        info = self.info[st]
        op: ComputeOp = st.op
        buf = self.buf[st]
        leaves = list(st.leaf_iter_vars)
        tpos = next((k for k, iv in enumerate(leaves)
                     if st.iter_attrs.get(iv) is not None and st.iter_attrs[iv].tensor_intrin is not None), None)
        vmap = {a.var: info.abs[a] for a in list(op.axis) + list(op.reduce_axis)}
        body = self.eff_body(st)
        store_idx = [info.rel[a] for a in op.axis]
        outer = leaves if tpos is None else leaves[:tpos]
        red_pos = next((k for k, iv in enumerate(outer) if iv.iter_type == IterVar.REDUCE), None)
        reduce_leaf_vars = {iv.var for iv in leaves if iv.iter_type == IterVar.REDUCE}

        def uses_reduce(p):
            found = []
            post_order_visit(p, lambda n: found.append(n) if n in reduce_leaf_vars else None)
            return bool(found)
        data_preds = [p for p in info.preds if not uses_reduce(p)]

        if tpos is not None:
            intrin_body, reset, update = self._tensorize(st, tpos, vmap)
            inner_vars = {iv.var for iv in leaves[tpos:]}
            for p in info.preds:
                hit = []
                post_order_visit(p, lambda n: hit.append(n) if n in inner_vars else None)
                if hit:
                    raise TensorizeError(f"stage '{st.name}': tensorize at '{leaves[tpos].name}': the "
                                         f"tensorized loops need a guard ({p}); choose split factors "
                                         "that divide the extents")
            if isinstance(body, E.Reduce) and red_pos is not None:
                if reset is None or update is None:
                    raise TensorizeError(
                        f"stage '{st.name}': tensorize with '{st.iter_attrs[leaves[tpos]].tensor_intrin.name}': "
                        f"reduction loop '{outer[red_pos].name}' lies outside the tensorized region, so "
                        "the intrinsic must return (body, reset, update)")
                return self._reduce_nest(st, outer, red_pos, reset, update, data_preds, info.preds)
            return self._nest(st, outer, self._guard(info.preds, intrin_body))

        if not isinstance(body, E.Reduce):
            value = _ToBuffer(self).visit(substitute(body, vmap))
            return self._nest(st, leaves, self._guard(info.preds, BufferStore(buf, value, store_idx)))
        init = E.const(_identity(body.combiner, body.dtype), body.dtype)
        src = _ToBuffer(self).visit(substitute(body.source, vmap))
        cur = E.BufferLoad(buf, store_idx)
        new = _combine(body.combiner, cur, src)
        upd: Stmt = BufferStore(buf, new, store_idx)
        if not E.is_const(body.condition, 1):
            upd = IfThenElse(_ToBuffer(self).visit(substitute(body.condition, vmap)), upd)
        return self._reduce_nest(st, outer, red_pos, BufferStore(buf, init, store_idx), upd,
                                 data_preds, info.preds)

    def _reduce_nest(self, st, leaves, red_pos, init: Stmt, update: Stmt, data_preds, all_preds) -> Stmt:
        if red_pos is None:
            # no reduction loop outside (everything tensorized or reduction fully inside)
            return self._nest(st, leaves, self._guard(all_preds, seq(init, update)))
        inner = leaves[red_pos:]
        init_leaves = [iv for iv in inner if iv.iter_type != IterVar.REDUCE]
        rename = {iv.var: E.Var(iv.var.name + ".init") for iv in init_leaves}
        init_stmt = self._nest(st, init_leaves, substitute(self._guard(data_preds, init), rename),
                               attach=False, rename=rename)
        upd_stmt = self._nest(st, inner, self._guard(all_preds, update))
        return self._nest(st, leaves[:red_pos], seq(init_stmt, upd_stmt))

    # ------------------------------------------------------------ tensorize
    def _tensorize(self, st: Stage, tpos: int, vmap: dict):
        attr = st.iter_attrs[st.leaf_iter_vars[tpos]]
        intrin = attr.tensor_intrin
        info = self.info[st]
        op: ComputeOp = st.op
        where = f"stage '{st.name}': tensorize at '{st.leaf_iter_vars[tpos].name}' with '{intrin.name}'"
        inner = st.leaf_iter_vars[tpos:]
        inner_vars = {iv.var: iv for iv in inner}
        zero = {v: E.const(0) for v in inner_vars}
        # each root axis: base (outer loops only) + at most one inner leaf with coefficient 1
        root_inner: dict = {}
        base: dict = {}
        for r in list(op.axis) + list(op.reduce_axis):
            rel = info.rel[r]
            lin = linear(rel) if dt.is_int(rel.dtype) else None
            b = substitute(rel, zero)
            diff = Linear(rel.dtype)
            diff.iadd(lin)
            diff.iadd(linear(b), -1)
            hits = [(a, c) for a, c in diff.terms.values()]
            if not hits and diff.const == 0:
                base[r] = b
                continue
            if len(hits) != 1 or diff.const != 0 or not isinstance(hits[0][0], E.Var) or \
                    hits[0][1] != 1 or hits[0][0] not in inner_vars:
                raise TensorizeError(f"{where}: axis '{r.name}' is indexed as `{rel}` inside the "
                                     "tensorized region; each axis must map to one inner loop "
                                     "(split, not fused)")
            root_inner[r] = inner_vars[hits[0][0]]
            base[r] = b
        used = list(root_inner.values())
        for iv in inner:
            if iv not in used:
                raise TensorizeError(f"{where}: inner loop '{iv.name}' does not map to an axis")
        data_axes = [r for r in op.axis if r in root_inner]
        red_axes = [r for r in op.reduce_axis if r in root_inner]
        iop = intrin.op
        if len(data_axes) != len(iop.axis) or len(red_axes) != len(iop.reduce_axis):
            raise TensorizeError(
                f"{where}: the region has {len(data_axes)} data and {len(red_axes)} reduction "
                f"loop(s) ({', '.join(root_inner[r].name for r in data_axes + red_axes)}); the intrinsic "
                f"has {len(iop.axis)} and {len(iop.reduce_axis)}")
        imap = {}
        for r, ia in zip(data_axes + red_axes, list(iop.axis) + list(iop.reduce_axis)):
            n = info.ext[root_inner[r]]
            if n != ia.dom.extent.value:
                raise TensorizeError(f"{where}: loop '{root_inner[r].name}' has extent {n}, the "
                                     f"intrinsic's axis '{ia.name}' {ia.dom.extent.value}")
            imap[r] = ia.var
        # stage body in intrinsic variables
        svmap = {}
        for r in list(op.axis) + list(op.reduce_axis):
            off = info.region_min[op.axis.index(r)] if r in op.axis else r.dom.min
            b = base[r]
            e = b if r not in imap else b + imap[r]
            svmap[r.var] = e if E.is_const(off, 0) else off + e
        body = substitute(self.eff_body(st), svmap)
        ana = self.analyzer()
        ivars_zero = {ia.var: E.const(0) for ia in list(iop.axis) + list(iop.reduce_axis)}

        def region_rel(load, d):
            return load.indices[d] - substitute(load.indices[d], ivars_zero)

        pairs = match_bodies(st.name, intrin, body, region_rel)
        ins = []
        for s_t, i_t, ld in pairs:
            s_st = self.stage_of(s_t)
            ins.append(self._view(where, intrin, i_t, s_st,
                                  [ana.simplify(substitute(i, ivars_zero)) for i in ld.indices]))
        out_origin = [ana.simplify(info.region_min[k] + base[a]) for k, a in enumerate(op.axis)]
        outs = [self._view(where, intrin, intrin.output, st, out_origin)]
        res = intrin.fcompute(ins, outs)
        if isinstance(res, (tuple, list)):
            if len(res) != 3:
                raise TensorizeError(f"{where}: fcompute must return a statement or (body, reset, update)")
            return tuple(_as_stmt(x) for x in res)
        return _as_stmt(res), None, None

    def _view(self, where, intrin, i_t: Tensor, s_st: Stage, origin: list) -> Buffer:
        """A Buffer shaped like intrinsic tensor i_t at `origin` (absolute) of the stage's buffer."""
        base = self.buf_of(s_st)
        declared = intrin.buffer_for(i_t)
        if declared is not None and declared.scope != base.scope:
            raise TensorizeError(f"{where}: operand '{i_t.name}' must be in scope '{declared.scope}' "
                                 f"but '{s_st.name}' is in '{base.scope}'; use cache_read/cache_write")
        info = self.info.get(s_st)
        if info is not None and info.region_min:
            origin = [o - m for o, m in zip(origin, info.region_min)]
        strides = base.get_strides()
        off = E.const(0)
        for o, s in zip(origin, strides):
            off = off + o * s
        lead = len(base.shape) - len(i_t.shape)
        return Buffer(f"{s_st.name}.{i_t.name}", i_t.shape, base.dtype, scope=base.scope,
                      strides=strides[lead:], elem_offset=Analyzer().simplify(off), base=base)


def _as_stmt(x) -> Stmt:
    if x is None:
        return Evaluate(0)
    if isinstance(x, Stmt):
        return x
    if isinstance(x, E.PrimExpr):
        return Evaluate(x)
    raise TensorizeError(f"tensor intrinsic returned {x!r}; expected a tir statement")


def _identity(combiner: str, dtype: str):
    return {"sum": 0, "prod": 1, "max": dt.min_value(dtype), "min": dt.max_value(dtype)}[combiner]


def _combine(combiner: str, a, b):
    if combiner == "sum":
        return E.Add(a, b)
    if combiner == "prod":
        return E.Mul(a, b)
    if combiner == "max":
        return E.Max(a, b)
    return E.Min(a, b)


def _union(a, b, ana: Analyzer, is_min: bool):
    d = ana.simplify(a - b)
    if isinstance(d, E.IntImm):
        return (b if d.value > 0 else a) if is_min else (a if d.value > 0 else b)
    return ana.simplify(E.min_expr(a, b) if is_min else E.max_expr(a, b))


def _eval_set(e, relax: dict):
    """Symbolic [lo, hi] of integer expression e when the vars in `relax` range over their
    (int) intervals and all other vars stay fixed. None when unknown."""
    if isinstance(e, E.IntImm):
        return e, e
    if not dt.is_int(e.dtype):
        return None
    lin = linear(e)
    lo, hi = Linear(e.dtype, lin.const), Linear(e.dtype, lin.const)
    for atom, c in lin.terms.values():
        s = _atom_set(atom, relax)
        if s is None:
            return None
        a_lo, a_hi = s
        if c > 0:
            lo.iadd(linear(a_lo), c)
            hi.iadd(linear(a_hi), c)
        else:
            lo.iadd(linear(a_hi), c)
            hi.iadd(linear(a_lo), c)
    return lo.to_expr(), hi.to_expr()


def _mentions(e, relax) -> bool:
    hit = []
    post_order_visit(e, lambda n: hit.append(n) if isinstance(n, E.Var) and n in relax else None)
    return bool(hit)


def _atom_set(atom, relax):
    if isinstance(atom, E.Var):
        if atom in relax:
            lo, hi = relax[atom]
            return E.const(lo, atom.dtype), E.const(hi, atom.dtype)
        return atom, atom
    if not _mentions(atom, relax):
        return atom, atom
    if isinstance(atom, E.FloorDiv) and isinstance(atom.b, E.IntImm) and atom.b.value > 0:
        s = _eval_set(atom.a, relax)
        if s is None:
            return None
        return E.floordiv(s[0], atom.b), E.floordiv(s[1], atom.b)
    if isinstance(atom, E.FloorMod) and isinstance(atom.b, E.IntImm) and atom.b.value > 0:
        return E.const(0, atom.dtype), E.const(atom.b.value - 1, atom.dtype)
    if isinstance(atom, (E.Min, E.Max)):
        a, b = _eval_set(atom.a, relax), _eval_set(atom.b, relax)
        if a is None or b is None:
            return None
        f = E.min_expr if isinstance(atom, E.Min) else E.max_expr
        return f(a[0], b[0]), f(a[1], b[1])
    if isinstance(atom, E.Select):
        a, b = _eval_set(atom.true_value, relax), _eval_set(atom.false_value, relax)
        if a is None or b is None:
            return None
        return E.min_expr(a[0], b[0]), E.max_expr(a[1], b[1])
    if isinstance(atom, E.Mul):
        a, b = _eval_set(atom.a, relax), _eval_set(atom.b, relax)
        if a is None or b is None:
            return None
        if all(isinstance(x, E.IntImm) for x in (*a, *b)):
            ps = [x.value * y.value for x in a for y in b]
            return E.const(min(ps), atom.dtype), E.const(max(ps), atom.dtype)
        return None
    return None


def lower(sch: Schedule, args: Sequence[Tensor], name: str = "main", raw: bool = False,
          pipeline: str = "default") -> PrimFunc:
    """Lower a schedule to a PrimFunc whose parameters are `args` (inputs and outputs, in call
    order). raw=True returns the loop nest before any tir pass; otherwise the named pass
    pipeline of compiler.tir.passes runs (see `passes.PIPELINES`)."""
    if not isinstance(sch, Schedule):
        raise LowerError(f"lower: expected a Schedule (te.create_schedule), got {sch!r}")
    func = _Lowering(sch, list(args), name).run()
    if raw:
        return func
    return passes.run_pipeline(func, pipeline)
