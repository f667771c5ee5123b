"""Kernel registry: (declared op, target kind) -> kernels, best first.

Ops, their attributes (defaults, allowed values), inference and reference semantics are declared
once, in compiler.graph.ops. A target kind ("llvm" for the CPU, "cuda" for the GPU back ends,
"vta" for the accelerator) registers kernels for a declared op here: a compute declaration (te)
plus its schedule, with an optional `check` that returns why the kernel declines a signature.
Kernels get their attributes from the schema (normalize_attrs); they keep no defaults of their own.

    @register_kernel("softsign2", "llvm", schedule=cpu.schedule_injective)
    def softsign2(x, beta=REQUIRED): ...
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

from ..errors import CompilerError
from ..graph.errors import OpError
from ..graph.ir import format_attr
from ..graph.ops import REGISTRY as OPS
from ..graph.ops import REQUIRED, OpDef, get_op, normalize_attrs

__all__ = ["OpError", "OpNotSupported", "Kernel", "Implementation", "OPS", "IMPLS", "DECLINED", "REQUIRED",
           "OpDef", "register_kernel", "add_impl", "decline", "target_kind", "get_def", "normalize_attrs",
           "implementations", "select"]


class OpNotSupported(CompilerError):
    """No kernel of an op for a target (or for that signature); the message says why."""


@dataclasses.dataclass
class Kernel:
    """compute(*tensors, **attrs) -> Tensor; schedule(outs) -> Schedule.

    check(shapes, dtypes, attrs) -> None or the reason this kernel declines.
    prepack: {input index: fn(array, shapes, dtypes, attrs) -> (array, extra attrs)} for inputs
    that may be bound as constants at compile time (weights): the array is transformed once
    (layout packing) and the compute is told so through the extra keyword arguments.
    """
    name: str
    op: str
    target: str
    compute: Callable
    schedule: Callable
    plevel: int = 10
    check: Callable | None = None
    prepack: dict = dataclasses.field(default_factory=dict)


Implementation = Kernel   # the name the CPU and GPU builders and older callers use

IMPLS: dict[tuple[str, str], list[Kernel]] = {}
#: (op or "*", target kind) -> why the pair is not supported
DECLINED: dict[tuple[str, str], str] = {}


def get_def(name: str) -> OpDef:
    """The op's declaration (compiler.graph.ops)."""
    return get_op(name)


def _check_kind(target: str) -> None:
    if not isinstance(target, str) or not target or not target.isidentifier():
        raise OpError(f"target kind must be a name such as 'llvm' or 'cuda', got {target!r}")


def _check_compute(op: OpDef, name: str, target: str, compute: Callable) -> None:
    """The compute must take every attribute the schema declares, as keywords."""
    if not callable(compute):
        raise OpError(f"kernel {name!r} for {op.name!r} on {target!r}: compute {compute!r} is not callable")
    try:
        params = inspect.signature(compute).parameters
    except (TypeError, ValueError):
        return   # a builtin without a signature: checked when it runs
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    missing = [a for a in op.attrs if a not in params or params[a].kind is inspect.Parameter.POSITIONAL_ONLY]
    if missing:
        raise OpError(f"kernel {name!r} for {op.name!r} on {target!r}: compute does not take attribute(s) "
                      f"{', '.join(missing)} declared by the op")


def add_impl(op: str, target: str, name: str, compute, schedule, plevel: int = 10, check=None,
             prepack=None) -> Kernel:
    """Register a kernel of declared op `op` for target kind `target`; a kernel of the same name
    replaces the old one. An undeclared op or a compute that misses a declared attribute is refused."""
    if op not in OPS:
        raise OpError(f"kernel {name!r}: operator {op!r} is not declared; declare it in compiler.graph.ops first")
    _check_kind(target)
    _check_compute(OPS[op], name, target, compute)
    if not callable(schedule):
        raise OpError(f"kernel {name!r} for {op!r} on {target!r}: schedule {schedule!r} is not callable")
    kernel = Kernel(name, op, target, compute, schedule, plevel, check, dict(prepack or {}))
    lst = IMPLS.setdefault((op, target), [])
    lst[:] = [k for k in lst if k.name != name] + [kernel]
    lst.sort(key=lambda k: -k.plevel)
    return kernel


def register_kernel(op: str, target: str, *, schedule: Callable, name: str | None = None, plevel: int = 10,
                    check: Callable | None = None, prepack: dict | None = None):
    """Decorator: the decorated function is the compute of a kernel of `op` on `target`, named
    `name` (default "<op>.<function name>")."""
    def deco(compute):
        add_impl(op, target, name or f"{op}.{compute.__name__.lstrip('_')}", compute, schedule, plevel, check,
                 prepack)
        return compute
    return deco


def decline(op: str, target: str, reason: str) -> None:
    """Record why `op` ("*": any op without kernels) has no kernel on `target`."""
    if op != "*" and op not in OPS:
        raise OpError(f"decline: operator {op!r} is not declared")
    DECLINED[(op, target)] = reason


def target_kind(target) -> str:
    """'llvm -mcpu=skylake' -> 'llvm'; a Target object with .kind works too."""
    kind = getattr(target, "kind", None)
    if isinstance(kind, str):
        return kind
    if not isinstance(target, str) or not target.strip():
        raise OpError(f"target must be a string such as 'llvm', got {target!r}")
    return target.split()[0]


def implementations(name: str, target="llvm") -> list[Kernel]:
    """Kernels of `name` for the target's kind, best first; raises OpNotSupported with the recorded
    reason (or the list of what exists) when there are none."""
    get_op(name)
    kind = target_kind(target)
    impls = IMPLS.get((name, kind))
    if impls:
        return list(impls)
    reason = DECLINED.get((name, kind)) or DECLINED.get(("*", kind))
    if reason is None:
        have = sorted({t for (o, t) in IMPLS if o == name})
        reason = (f"no kernel registered for target kind {kind!r}"
                  f" (it has: {', '.join(have) or 'none'})")
    raise OpNotSupported(f"operator {name!r} on target {kind!r}: {reason}")


def select(name: str, target, shapes, dtypes, attrs, impl_name: str | None = None) -> Kernel:
    """The best kernel that accepts this signature (attrs as normalize_attrs gives them); the error
    lists every decline."""
    reasons = []
    for impl in implementations(name, target):
        if impl_name is not None and impl.name != impl_name:
            continue
        why = impl.check(shapes, dtypes, attrs) if impl.check is not None else None
        if why is None:
            return impl
        reasons.append(f"{impl.name}: {why}")
    if impl_name is not None and not reasons:
        have = ", ".join(i.name for i in implementations(name, target))
        raise OpNotSupported(f"operator {name!r}: no kernel named {impl_name!r} (have: {have})")
    brief = "{" + ", ".join(f"{k}={format_attr(v)}" for k, v in attrs.items()) + "}"
    raise OpNotSupported(f"operator {name!r} with shapes {[list(s) for s in shapes]} {list(dtypes)} "
                         f"{brief}: every kernel declined: " + "; ".join(reasons))
