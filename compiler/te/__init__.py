"""Tensor expressions and schedules (TVM-style `te`).

    A = te.placeholder((n, k), "float32", "A"); B = te.placeholder((k, m), "float32", "B")
    r = te.reduce_axis(k, "r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = te.create_schedule(C)
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 32, 32)
    s[C].vectorize(ji); s[C].parallel(io)
"""
from ..tir.expr import (const, cast, select, if_then_else, Var, Range, call_extern, call_intrin,
                        floordiv, floormod)
from ..tir.expr import min_expr as elem_min, max_expr as elem_max
from .tensor import (Tensor, IterVar, Operation, PlaceholderOp, ComputeOp, placeholder, compute,
                     reduce_axis, thread_axis, sum, max, min, prod, exp, log, sqrt, tanh, floor, ceil,
                     round, power, abs, sigmoid, rsqrt, max_value, min_value, all, any)
from .schedule import Schedule, Stage, create_schedule
from .tensorize import TensorIntrin, decl_tensor_intrin


def var(name: str = "v", dtype: str = "int32") -> Var:
    return Var(name, dtype)
