"""Tensor intrinsics: declare what a hardware (or hand-written) kernel computes, so a schedule
can replace a loop nest by it (Stage.tensorize).

    x = te.placeholder((16, 16), "int8", "x"); w = ...; k = te.reduce_axis(16, "k")
    y = te.compute((16, 16), lambda i, j: te.sum(x[i, k].astype("int32") * w[j, k].astype("int32"), k))
    def emit(ins, outs):            # tir Buffers bound to the matched regions
        return body, reset, update  # or one statement when no reduction lies outside the nest
    gemm = te.decl_tensor_intrin(y.op, emit, name="gemm", binds={x: tir.Buffer(..., scope="inp_buffer")})

Lowering matches the stage's body against the declared one (combiner, operations, dtypes,
input order, and each index relative to the region) and raises TensorizeError on a mismatch.
"""
from __future__ import annotations

from typing import Callable

from ..errors import TensorizeError
from ..tir import expr as E
from ..tir.arith import simplify
from ..tir.functor import structural_equal
from ..tir.stmt import Buffer
from .tensor import ComputeOp, Tensor


class TensorIntrin:
    def __init__(self, name: str, op: ComputeOp, fcompute: Callable, binds: dict):
        self.name, self.op, self.fcompute, self.binds = name, op, fcompute, dict(binds)
        self.inputs: list[Tensor] = op.input_tensors()
        self.output: Tensor = op.output(0)

    def buffer_for(self, t: Tensor) -> Buffer | None:
        return self.binds.get(t)

    def __repr__(self):
        return f"TensorIntrin({self.name})"


def decl_tensor_intrin(op, fcompute: Callable, name: str = "intrin", binds: dict | None = None) -> TensorIntrin:
    """Declare an intrinsic computing `op` (a ComputeOp over placeholders, or its tensor).

    fcompute(ins, outs) receives tir Buffers (views of the matched regions, in the order the
    inputs first appear in the body, then the output) and returns a tir statement, or a tuple
    (body, reset, update) when the reduction may be split around the intrinsic. `binds` maps
    the intrinsic's tensors to Buffers that fix the memory scope each operand must live in.
    """
    if isinstance(op, Tensor):
        op = op.op
    if not isinstance(op, ComputeOp):
        raise TensorizeError(f"decl_tensor_intrin '{name}': expected a compute op, got {op!r}")
    for t in op.input_tensors():
        if isinstance(t.op, ComputeOp):
            raise TensorizeError(f"decl_tensor_intrin '{name}': input '{t.name}' must be a placeholder")
    return TensorIntrin(name, op, fcompute, binds or {})


def match_bodies(stage_name: str, intrin: TensorIntrin, stage_body: E.PrimExpr,
                 region_rel: Callable) -> list:
    """Compare the stage body (root vars already replaced by base + intrinsic vars) with the
    intrinsic's body. `region_rel(load, dim)` gives the stage index of a load relative to the
    region origin. Returns [(stage_tensor, intrin_tensor, stage_load)] in order of appearance."""
    pairs: list = []
    where = f"stage '{stage_name}' tensorize with '{intrin.name}'"

    def fail(msg):
        raise TensorizeError(f"{where}: the loop body does not match the intrinsic: {msg}\n"
                             f"  stage computes:     {stage_body}\n"
                             f"  intrinsic declares: {intrin.op.body}")


    def eq(s, i):
        if type(s) is not type(i):
            fail(f"{type(s).__name__} `{s}` where the intrinsic has {type(i).__name__} `{i}`")
        if isinstance(s, E.PrimExpr) and s.dtype != i.dtype:
            fail(f"`{s}` has dtype {s.dtype}, the intrinsic's `{i}` has {i.dtype}")
        if isinstance(s, E.Reduce):
            if s.combiner != i.combiner:
                fail(f"reduction {s.combiner} vs {i.combiner}")
            eq(s.source, i.source)
            eq(s.condition, i.condition)
            return
        if isinstance(s, E.ProducerLoad):
            for st, it, _ in pairs:
                if it is i.producer and st is not s.producer:
                    fail(f"intrinsic input '{it.name}' matched both '{st.name}' and '{s.producer.name}'")
                if st is s.producer and it is not i.producer:
                    fail(f"'{st.name}' matched both intrinsic inputs '{it.name}' and '{i.producer.name}'")
            if not any(st is s.producer for st, _, _ in pairs):
                pairs.append((s.producer, i.producer, s))
            nd_s, nd_i = len(s.indices), len(i.indices)
            if nd_s < nd_i:
                fail(f"'{s.producer.name}' has {nd_s} dims, intrinsic input '{i.producer.name}' {nd_i}")
            lead = nd_s - nd_i
            for d in range(nd_s):
                rel = simplify(region_rel(s, d))
                if d < lead:
                    if not E.is_const(rel, 0):
                        fail(f"index {d} of '{s.producer.name}' ({s.indices[d]}) varies inside the "
                             f"tensorized region but the intrinsic operand has only {nd_i} dims")
                    continue
                want = simplify(i.indices[d - lead])
                if not structural_equal(rel, want, map_free_vars=False):
                    fail(f"index {d} of '{s.producer.name}' is `{rel}` relative to the region, "
                         f"the intrinsic reads '{i.producer.name}' at `{want}`")
            return
        if isinstance(s, (E.IntImm, E.FloatImm)):
            if s.value != i.value:
                fail(f"constant {s} vs {i}")
            return
        if isinstance(s, E.Var):
            if s is not i:
                fail(f"variable `{s}` vs `{i}`")
            return
        if isinstance(s, E.Call) and s.op != i.op:
            fail(f"call {s.op} vs {i.op}")
        for f in s._fields:
            a, b = getattr(s, f), getattr(i, f)
            if isinstance(a, tuple):
                if len(a) != len(b):
                    fail(f"arity of `{s}` vs `{i}`")
                for x, y in zip(a, b):
                    eq(x, y)
            elif a is not None or b is not None:
                if a is None or b is None:
                    fail(f"`{s}` vs `{i}`")
                eq(a, b)

    eq(stage_body, intrin.op.body)
    return pairs
