"""Schedules: how the operations of a tensor-expression graph become loops.

`create_schedule(outputs)` makes one Stage per operation (producers first). A Stage keeps its
loops as IterVars: the root axes of the op, and the leaves left after split / fuse, in loop
order; annotations (vectorize, unroll, parallel, bind, tensorize, pragma) attach to leaves;
compute_at / compute_inline / compute_root decide where the stage is computed. Schedule-level
cache_read / cache_write add copy stages into a named memory scope. Every primitive checks its
arguments and raises ScheduleError naming the stage, the primitive and the axis.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..errors import ScheduleError
from ..tir import expr as E
from ..tir.functor import Mutator, substitute
from ..tir.stmt import ForKind
from .tensor import ComputeOp, IterVar, Operation, PlaceholderOp, Tensor
from .tensorize import TensorIntrin


@dataclass
class Split:
    parent: IterVar
    outer: IterVar
    inner: IterVar
    factor: int | None
    nparts: int | None


@dataclass
class Fuse:
    outer: IterVar
    inner: IterVar
    fused: IterVar


@dataclass
class IterAttr:
    kind: ForKind = ForKind.SERIAL
    thread: IterVar | None = None          # bind target
    tensor_intrin: object | None = None    # tensorize
    pragmas: list = field(default_factory=list)   # [(key, value)]


class Stage:
    """Scheduling state of one operation. Obtain it as `s[tensor]`."""

    def __init__(self, op: Operation, schedule: "Schedule"):
        self.op = op                 # current op (cache_read/cache_write may replace it)
        self.origin_op = op
        self.schedule = schedule
        if isinstance(op, ComputeOp):
            self.all_iter_vars = list(op.axis) + list(op.reduce_axis)
        else:
            self.all_iter_vars = []
        self.leaf_iter_vars = list(self.all_iter_vars)
        self.relations: list = []
        self.iter_attrs: dict = {}
        self.attach_type = "root"   # "root" | "inline" | "scope"
        self.attach_stage: Stage | None = None
        self.attach_ivar: IterVar | None = None
        self.scope = "global"
        self.is_output = False
        self._consumed: dict = {}   # IterVar -> description of the primitive that replaced it

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def is_placeholder(self) -> bool:
        return isinstance(self.op, PlaceholderOp)

    def __repr__(self):
        return f"Stage({self.name}, loops=[{', '.join(iv.name for iv in self.leaf_iter_vars)}])"

    # ------------------------------------------------------------ checking helpers
    def _err(self, prim: str, msg: str) -> ScheduleError:
        return ScheduleError(f"stage '{self.name}': {prim}: {msg}")

    def _loops(self) -> str:
        return ", ".join(iv.name for iv in self.leaf_iter_vars) or "(none)"

    def _leaf(self, iv, prim: str) -> IterVar:
        if self.is_placeholder:
            raise self._err(prim, "a placeholder has no loops to schedule")
        if not isinstance(iv, IterVar):
            raise self._err(prim, f"expected an axis (IterVar), got {iv!r}")
        if iv in self.leaf_iter_vars:
            return iv
        if iv in self._consumed:
            raise self._err(prim, f"axis '{iv.name}' is no longer a loop of this stage: "
                                  f"{self._consumed[iv]} (current loops: {self._loops()})")
        owner = self.schedule._owner_of(iv)
        where = f" it belongs to stage '{owner.name}'" if owner is not None else ""
        raise self._err(prim, f"axis '{iv.name}' is not a loop of this stage;{where} "
                              f"(current loops: {self._loops()})")

    def _check_not_inline(self, prim: str):
        if self.attach_type == "inline":
            raise self._err(prim, "the stage is inlined into its consumers and has no loops")

    def _replace_leaf(self, old: IterVar, new: list[IterVar]) -> None:
        k = self.leaf_iter_vars.index(old)
        self.leaf_iter_vars[k:k + 1] = new
        self.all_iter_vars.extend(new)
        self.iter_attrs.pop(old, None)

    # ------------------------------------------------------------ loop structure
    def split(self, parent: IterVar, factor: int | None = None, nparts: int | None = None):
        """Split a loop into (outer, inner): by inner extent `factor`, or `nparts` outer iterations."""
        self._check_not_inline("split")
        parent = self._leaf(parent, "split")
        if (factor is None) == (nparts is None):
            raise self._err("split", f"axis '{parent.name}': give exactly one of factor= or nparts=")
        val = factor if factor is not None else nparts
        if isinstance(val, E.IntImm):
            val = val.value
        if not isinstance(val, int) or val <= 0:
            raise self._err("split", f"axis '{parent.name}': {'factor' if factor is not None else 'nparts'} "
                                     f"must be a positive int, got {val!r}")
        if parent in self.iter_attrs and self.iter_attrs[parent].tensor_intrin is not None:
            raise self._err("split", f"axis '{parent.name}' is tensorized")
        outer = IterVar(None, E.Var(parent.name + ".outer"), parent.iter_type)
        inner = IterVar(None, E.Var(parent.name + ".inner"), parent.iter_type)
        self.relations.append(Split(parent, outer, inner,
                                    val if factor is not None else None, val if nparts is not None else None))
        self._replace_leaf(parent, [outer, inner])
        self._consumed[parent] = f"it was split into '{outer.name}' and '{inner.name}'"
        return outer, inner

    def tile(self, x_parent: IterVar, y_parent: IterVar, x_factor: int, y_factor: int):
        """Split two loops and order them (x.outer, y.outer, x.inner, y.inner)."""
        xo, xi = self.split(x_parent, x_factor)
        yo, yi = self.split(y_parent, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def fuse(self, *args: IterVar) -> IterVar:
        """Fuse adjacent loops (outermost first) into one."""
        self._check_not_inline("fuse")
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            args = tuple(args[0])
        if not args:
            raise self._err("fuse", "needs at least one axis")
        ivs = [self._leaf(a, "fuse") for a in args]
        if len(set(map(id, ivs))) != len(ivs):
            raise self._err("fuse", "an axis is given twice")
        pos = [self.leaf_iter_vars.index(iv) for iv in ivs]
        for a, b, p, q in zip(ivs, ivs[1:], pos, pos[1:]):
            if q != p + 1:
                raise self._err("fuse", f"'{a.name}' and '{b.name}' are not adjacent loops in that "
                                        f"order (current loops: {self._loops()}); reorder first")
        types = {iv.iter_type for iv in ivs}
        if len(types) > 1:
            raise self._err("fuse", "cannot fuse a reduction axis with a data-parallel axis ("
                            + ", ".join(f"{iv.name}: {iv.iter_type}" for iv in ivs) + ")")
        fused = ivs[0]
        for nxt in ivs[1:]:
            new = IterVar(None, E.Var(f"{fused.name}.{nxt.name}.fused"), fused.iter_type)
            self.relations.append(Fuse(fused, nxt, new))
            k = self.leaf_iter_vars.index(fused)
            self.leaf_iter_vars[k:k + 2] = [new]
            self.all_iter_vars.append(new)
            for old in (fused, nxt):
                self.iter_attrs.pop(old, None)
                self._consumed[old] = f"it was fused into '{new.name}'"
            fused = new
        return fused

    def reorder(self, *args: IterVar) -> None:
        """Put the given loops in this order, in the positions they occupy together."""
        self._check_not_inline("reorder")
        if len(args) == 1 and isinstance(args[0], (list, tuple)):
            args = tuple(args[0])
        ivs = [self._leaf(a, "reorder") for a in args]
        if len(set(map(id, ivs))) != len(ivs):
            raise self._err("reorder", "an axis is given twice")
        pos = sorted(self.leaf_iter_vars.index(iv) for iv in ivs)
        for p, iv in zip(pos, ivs):
            self.leaf_iter_vars[p] = iv

    # ------------------------------------------------------------ placement
    def compute_at(self, parent: "Stage", scope: IterVar) -> None:
        """Compute this stage inside loop `scope` of consumer stage `parent`, only the region
        that one iteration of that loop needs."""
        prim = "compute_at"
        if self.is_placeholder:
            raise self._err(prim, "a placeholder is an input; it is not computed")
        if isinstance(parent, (Tensor, Operation)):
            parent = self.schedule[parent]
        if not isinstance(parent, Stage):
            raise self._err(prim, f"parent must be a Stage (s[tensor]), got {parent!r}")
        if parent is self:
            raise self._err(prim, "cannot attach a stage to itself")
        if parent.attach_type == "inline":
            raise self._err(prim, f"stage '{parent.name}' is inlined and has no loops")
        if not isinstance(scope, IterVar) or scope not in parent.leaf_iter_vars:
            nm = getattr(scope, "name", repr(scope))
            why = ""
            if isinstance(scope, IterVar) and scope in parent._consumed:
                why = f" ({parent._consumed[scope]})"
            elif isinstance(scope, IterVar) and scope in self.all_iter_vars:
                why = f" (it is an axis of '{self.name}' itself)"
            raise self._err(prim, f"axis '{nm}' is not a loop of stage '{parent.name}'{why}; "
                                  f"its loops are: {parent._loops()}")
        consumers = self.schedule._consumers(self)
        if parent not in self.schedule._consumers_transitive(self):
            names = ", ".join(c.name for c in consumers) or "none (it is an output)"
            raise self._err(prim, f"stage '{parent.name}' does not read '{self.name}'; compute_at "
                                  f"must target a consumer (consumers of '{self.name}': {names})")
        if parent.iter_attrs.get(scope) is not None and parent.iter_attrs[scope].tensor_intrin is not None:
            raise self._err(prim, f"loop '{scope.name}' of '{parent.name}' is tensorized")
        self.attach_type, self.attach_stage, self.attach_ivar = "scope", parent, scope

    def compute_inline(self) -> None:
        """Substitute this stage's body into its consumers; it gets no loops nor buffer."""
        prim = "compute_inline"
        if self.is_placeholder:
            raise self._err(prim, "a placeholder cannot be inlined")
        if self.op.reduce_axis:
            raise self._err(prim, "a reduction cannot be inlined (its consumers would "
                                  "recompute it per element); use compute_at")
        if self.is_output:
            raise self._err(prim, "an output of the schedule cannot be inlined")
        for st in self.schedule.stages:
            if st.attach_stage is self:
                raise self._err(prim, f"stage '{st.name}' is attached to it with compute_at")
        self.attach_type, self.attach_stage, self.attach_ivar = "inline", None, None

    def compute_root(self) -> None:
        """Compute the whole tensor at the top level (undo compute_at / compute_inline)."""
        if self.is_placeholder:
            raise self._err("compute_root", "a placeholder is not computed")
        self.attach_type, self.attach_stage, self.attach_ivar = "root", None, None

    def set_scope(self, scope: str) -> None:
        """Memory scope of this stage's buffer ("global", "local", "acc_buffer", ...)."""
        if self.is_output and scope != "global":
            raise self._err("set_scope", "an output lives in global memory")
        self.scope = scope

    # ------------------------------------------------------------ annotations
    def _annotate(self, iv, prim: str, kind: ForKind) -> IterAttr:
        self._check_not_inline(prim)
        iv = self._leaf(iv, prim)
        attr = self.iter_attrs.setdefault(iv, IterAttr())
        if attr.kind not in (ForKind.SERIAL, kind) and kind != ForKind.SERIAL:
            raise self._err(prim, f"axis '{iv.name}' is already marked {attr.kind.value}")
        attr.kind = kind
        return attr

    def vectorize(self, iv: IterVar) -> None:
        """Run this (innermost, constant-extent) loop as SIMD lanes."""
        self._annotate(iv, "vectorize", ForKind.VECTORIZED)

    def unroll(self, iv: IterVar) -> None:
        """Fully unroll this constant-extent loop."""
        self._annotate(iv, "unroll", ForKind.UNROLLED)

    def parallel(self, iv: IterVar) -> None:
        """Run the iterations of this loop on all cores."""
        iv = self._leaf(iv, "parallel")
        if iv.iter_type == IterVar.REDUCE:
            raise self._err("parallel", f"axis '{iv.name}' is a reduction axis; its iterations "
                                        f"all update the same element of '{self.name}'")
        self._annotate(iv, "parallel", ForKind.PARALLEL)

    def bind(self, iv: IterVar, thread_ivar: IterVar) -> None:
        """Bind a loop to a thread axis (te.thread_axis): GPU block/thread indices, or a
        virtual thread ("vthread") that backends interleave for latency hiding."""
        iv = self._leaf(iv, "bind")
        if not isinstance(thread_ivar, IterVar) or thread_ivar.thread_tag is None:
            raise self._err("bind", f"axis '{iv.name}': bind target must be a te.thread_axis, "
                                    f"got {thread_ivar!r}")
        if iv.iter_type == IterVar.REDUCE:
            raise self._err("bind", f"axis '{iv.name}' is a reduction axis; cross-thread "
                                    "reductions are not supported")
        kind = ForKind.VTHREAD if thread_ivar.iter_type == IterVar.VTHREAD else ForKind.THREAD_BINDING
        attr = self._annotate(iv, "bind", kind)
        attr.thread = thread_ivar

    def tensorize(self, iv: IterVar, intrin) -> None:
        """Replace the loop nest from `iv` inwards by a declared intrinsic (te.decl_tensor_intrin).
        The nest must compute exactly what the intrinsic declares; lowering checks it."""
        iv = self._leaf(iv, "tensorize")
        if not isinstance(intrin, TensorIntrin):
            raise self._err("tensorize", f"axis '{iv.name}': expected a TensorIntrin "
                                         f"(te.decl_tensor_intrin), got {intrin!r}")
        attr = self.iter_attrs.setdefault(iv, IterAttr())
        attr.tensor_intrin = intrin

    def pragma(self, iv: IterVar, key: str, value=None) -> None:
        """Annotate a loop with `pragma_<key>` (an AttrStmt around the loop) for later passes."""
        iv = self._leaf(iv, "pragma")
        if not isinstance(key, str) or not key:
            raise self._err("pragma", f"axis '{iv.name}': key must be a non-empty string")
        self.iter_attrs.setdefault(iv, IterAttr()).pragmas.append((key, value))


class ProducerMutator(Mutator):
    """A Mutator that also walks tensor-expression loads and reductions, rebuilding a node only
    when a child changed; subclasses rewrite a load with its visited indices in rewrite_load."""

    def visit_ProducerLoad(self, e):
        return self.rewrite_load(e, tuple(self.visit(i) for i in e.indices))

    def rewrite_load(self, e, idx):
        if any(a is not b for a, b in zip(idx, e.indices)):
            return E.ProducerLoad(e.producer, idx)
        return e

    def visit_Reduce(self, e):
        src, cond = self.visit(e.source), self.visit(e.condition)
        if src is e.source and cond is e.condition:
            return e
        return E.Reduce(e.combiner, src, e.axis, cond)


class _ReplaceLoads(ProducerMutator):
    def __init__(self, old: set, new: Tensor):
        self.old, self.new = old, new

    def rewrite_load(self, e, idx):
        if e.producer in self.old:
            return E.ProducerLoad(self.new, idx)
        return super().rewrite_load(e, idx)


class Schedule:
    """Stages of every operation reachable from the outputs, producers first. `s[T]` is the
    stage of tensor T (or operation)."""

    def __init__(self, outputs: Sequence[Operation]):
        self.outputs = list(outputs)
        self.stages: list[Stage] = []
        self.stage_map: dict = {}
        seen: set = set()

        def visit(op: Operation):
            if op in seen:
                return
            seen.add(op)
            for t in op.input_tensors():
                visit(t.op)
            st = Stage(op, self)
            self.stages.append(st)
            self.stage_map[op] = st

        for op in self.outputs:
            visit(op)
        for op in self.outputs:
            self.stage_map[op].is_output = True

    def __getitem__(self, key) -> Stage:
        op = key.op if isinstance(key, Tensor) else key
        if op in self.stage_map:
            return self.stage_map[op]
        names = ", ".join(s.name for s in self.stages)
        raise ScheduleError(f"'{getattr(key, 'name', key)}' is not part of this schedule "
                            f"(stages: {names})")

    def stage_of(self, t: Tensor) -> Stage:
        return self[t]

    def _owner_of(self, iv: IterVar) -> Stage | None:
        for st in self.stages:
            if iv in st.all_iter_vars:
                return st
        return None

    def _reads(self, reader: Stage, producer: Stage) -> bool:
        if reader.is_placeholder:
            return False
        return any(self.stage_map.get(t.op) is producer for t in reader.op.input_tensors())

    def _consumers(self, st: Stage) -> list[Stage]:
        """Stages that read st, looking through inlined stages."""
        out = []
        for r in self.stages:
            if r is st or not self._reads(r, st):
                continue
            if r.attach_type == "inline":
                out.extend(x for x in self._consumers(r) if x not in out)
            elif r not in out:
                out.append(r)
        return out

    def _consumers_transitive(self, st: Stage) -> list[Stage]:
        """Stages that read st directly or through other stages (a chain of elementwise stages
        may all be computed at one loop of the last consumer, as VTA's epilogues are)."""
        out, todo = [], list(self._consumers(st))
        while todo:
            c = todo.pop()
            if c not in out:
                out.append(c)
                todo.extend(self._consumers(c))
        return out

    # ------------------------------------------------------------ caches
    def cache_read(self, tensor: Tensor, scope: str, readers) -> Tensor:
        """A copy of `tensor` in memory `scope`, read by `readers` instead of the original.
        Returns the cache tensor; schedule it like any stage (compute_at, pragma ...)."""
        src = self[tensor]
        if isinstance(readers, (Tensor, Operation, Stage)):
            readers = [readers]
        rstages = [r if isinstance(r, Stage) else self[r] for r in readers]
        if not rstages:
            raise ScheduleError(f"cache_read of '{tensor.name}': give at least one reader")
        for r in rstages:
            if not self._reads(r, src):
                raise ScheduleError(f"cache_read of '{tensor.name}': stage '{r.name}' does not read it")
        name = f"{tensor.name}.{scope}"
        cache = _copy_compute(tensor, name)
        cst = Stage(cache.op, self)
        cst.scope = scope
        olds = {src.op.output(0), src.origin_op.output(0)}
        for r in rstages:
            op = r.op
            body = _ReplaceLoads(olds, cache).visit(op.body)
            new_op = ComputeOp.__new__(ComputeOp)
            new_op.__dict__.update(op.__dict__)
            new_op.body = body
            new_op._outputs = [Tensor(new_op, 0)]
            r.op = new_op
            self.stage_map[new_op] = r
        first = min(self.stages.index(r) for r in rstages)
        self.stages.insert(first, cst)
        self.stage_map[cache.op] = cst
        return cache

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Compute `tensor` into a buffer in `scope` and copy it out: returns the cache tensor,
        whose stage now does the computation; s[tensor] becomes the copy."""
        st = self[tensor]
        if st.is_placeholder:
            raise ScheduleError(f"cache_write of '{tensor.name}': it is a placeholder")
        if st.relations or any(a.kind != ForKind.SERIAL or a.tensor_intrin or a.pragmas
                               for a in st.iter_attrs.values()) or st.attach_type != "root":
            raise ScheduleError(f"cache_write of '{tensor.name}': apply cache_write before other "
                                "primitives on that stage")
        op: ComputeOp = st.op
        vmap, axis, raxis = {}, [], []
        for a in op.axis:
            na = IterVar(a.dom, E.Var(a.var.name + ".c"), a.iter_type)
            vmap[a.var] = na.var
            axis.append(na)
        for a in op.reduce_axis:
            na = IterVar(a.dom, E.Var(a.var.name + ".c"), a.iter_type)
            vmap[a.var] = na.var
            raxis.append(na)
        body = substitute(op.body, vmap)
        if isinstance(body, E.Reduce):
            body = E.Reduce(body.combiner, body.source, raxis, body.condition)
        cache_op = ComputeOp(f"{op.name}.{scope}", axis, raxis, body, op.tag, op.attrs)
        cache = cache_op.output(0)
        copy_op = ComputeOp.__new__(ComputeOp)
        copy_op.__dict__.update(op.__dict__)
        copy_op.reduce_axis = []
        copy_op.body = E.ProducerLoad(cache, [a.var for a in op.axis])
        copy_op._outputs = [Tensor(copy_op, 0)]
        st.op = copy_op
        st.all_iter_vars = list(op.axis)
        st.leaf_iter_vars = list(op.axis)
        self.stage_map[copy_op] = st
        cst = Stage(cache_op, self)
        cst.scope = scope
        self.stages.insert(self.stages.index(st), cst)
        self.stage_map[cache_op] = cst
        return cache


def _copy_compute(tensor: Tensor, name: str) -> Tensor:
    axis = [IterVar(E.Range(0, n), E.Var(f"ax{d}"), IterVar.DATA_PAR) for d, n in enumerate(tensor.shape)]
    body = E.ProducerLoad(tensor, [a.var for a in axis])
    return ComputeOp(name, axis, [], body).output(0)


def create_schedule(outputs) -> Schedule:
    """Schedule for the graph ending in `outputs` (a tensor/operation or a list of them)."""
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    ops = []
    for o in outputs:
        op = o.op if isinstance(o, Tensor) else o
        if not isinstance(op, Operation):
            raise ScheduleError(f"create_schedule: expected tensors or operations, got {o!r}")
        ops.append(op)
    return Schedule(ops)
