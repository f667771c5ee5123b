"""Operator library (TVM's TOPI): compute declarations (te) plus schedules per target.

    from compiler import ops
    compute, schedule = ops.get("conv2d", target="llvm")          # best implementation
    f = ops.compile_op("conv2d", [(1, 64, 56, 56), (64, 64, 3, 3)],
                       {"pads": (1, 1, 1, 1)}, "float32", "llvm")
    y = f(x, w)                                                    # numpy in, numpy out
    g = ops.compile_op("conv2d", [...], {...}, consts={1: w})     # weight bound (and pre-packed)
    y = g(x)

Ops are declared once, in compiler.graph.ops (attributes, inference, reference semantics); this
package holds their kernels per target kind (registry.register_kernel). `ops.list_ops(target)`
lists the ops with kernels there, and a lookup for an unsupported (op, target) raises
OpNotSupported with the reason.
"""
from . import gpu as _gpu  # noqa: F401  (the GPU schedules, so a lookup never depends on import order)
from . import library as _library  # noqa: F401  (fills the registry)
from .api import CompiledOp, clear_cache, compile_op, get, list_ops
from .registry import (
                       DECLINED,
                       IMPLS,
                       OPS,
                       Implementation,
                       Kernel,
                       OpDef,
                       OpError,
                       OpNotSupported,
                       add_impl,
                       decline,
                       implementations,
                       normalize_attrs,
                       register_kernel,
                       select,
)

__all__ = ["get", "compile_op", "list_ops", "clear_cache", "CompiledOp", "OpError", "OpNotSupported",
           "Implementation", "Kernel", "OpDef", "OPS", "IMPLS", "DECLINED", "add_impl", "register_kernel", "decline",
           "implementations", "normalize_attrs", "select"]
