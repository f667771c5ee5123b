"""Tensor expressions and schedules (TVM-style `te`).

    A = te.placeholder((n, k), "float32", "A"); B = te.placeholder((k, m), "float32", "B")
    r = te.reduce_axis(k, "r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = te.create_schedule(C)
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 32, 32)
    s[C].vectorize(ji); s[C].parallel(io)
"""
from ..tir.expr import Range, Var, call_extern, call_intrin, cast, const, floordiv, floormod, if_then_else, select
from ..tir.expr import max_expr as elem_max
from ..tir.expr import min_expr as elem_min
from .schedule import Schedule, Stage, create_schedule
from .tensor import (
    ComputeOp,
    IterVar,
    Operation,
    PlaceholderOp,
    Tensor,
    abs,
    all,
    any,
    ceil,
    compute,
    exp,
    floor,
    log,
    max,
    max_value,
    min,
    min_value,
    placeholder,
    power,
    prod,
    reduce_axis,
    round,
    rsqrt,
    sigmoid,
    sqrt,
    sum,
    tanh,
    thread_axis,
)
from .tensorize import TensorIntrin, decl_tensor_intrin


def var(name: str = "v", dtype: str = "int32") -> Var:
    return Var(name, dtype)
