"""Operator registry: op name -> declaration, and (op, target kind) -> implementations.

An OpDef names an op (the graph IR's names and attributes: compiler.graph.ops), its default
attributes and its numpy reference. An Implementation is one compute declaration (te) plus the
schedule for it on one target kind ("llvm" now; "cuda", "vta" later), with an optional `check`
that returns why it declines a given signature. Lookups that fail say what exists.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..errors import CompilerError


class OpError(CompilerError, ValueError):
    """Bad op name, attributes or shapes for an operator of the library."""


class OpNotSupported(CompilerError):
    """No implementation of an op for a target (or for that signature); the message says why."""


@dataclasses.dataclass
class OpDef:
    name: str
    attrs: dict                       # attribute -> default (REQUIRED if none)
    arity: tuple[int, int]
    doc: str = ""
    onnx: str | None = None           # ONNX op type with the same semantics, if any


@dataclasses.dataclass
class Implementation:
    """compute(*tensors, **attrs) -> Tensor; schedule(outs) -> Schedule.

    check(shapes, dtypes, attrs) -> None or the reason this implementation declines.
    prepack: {input index: fn(array, attrs) -> (array, attrs)} for inputs that may be bound as
    constants at compile time (weights): the array is transformed once (layout packing) and the
    compute is told so through the returned attrs.
    """
    name: str
    op: str
    target: str
    compute: Callable
    schedule: Callable
    plevel: int = 10
    check: Callable | None = None
    prepack: dict = dataclasses.field(default_factory=dict)


class _Required:
    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()
OPS: dict[str, OpDef] = {}
IMPLS: dict[tuple[str, str], list[Implementation]] = {}
#: (op or "*", target kind) -> why the pair is not supported
DECLINED: dict[tuple[str, str], str] = {}
TARGET_KINDS = ("llvm", "cuda", "vta")


def define(name: str, attrs: dict | None = None, arity=1, doc: str = "", onnx: str | None = None) -> OpDef:
    if isinstance(arity, int):
        arity = (arity, arity)
    d = OpDef(name, dict(attrs or {}), tuple(arity), doc, onnx)
    OPS[name] = d
    return d


def add_impl(op: str, target: str, name: str, compute, schedule, plevel: int = 10, check=None,
             prepack=None) -> Implementation:
    if op not in OPS:
        raise OpError(f"add_impl: unknown op {op!r}")
    impl = Implementation(name, op, target, compute, schedule, plevel, check, dict(prepack or {}))
    lst = IMPLS.setdefault((op, target), [])
    lst[:] = [i for i in lst if i.name != name] + [impl]
    lst.sort(key=lambda i: -i.plevel)
    return impl


def decline(op: str, target: str, reason: str) -> None:
    DECLINED[(op, target)] = reason


def target_kind(target) -> str:
    """'llvm -mcpu=skylake' -> 'llvm'; a Target object with .kind works too."""
    kind = getattr(target, "kind", None)
    if isinstance(kind, str):
        return kind
    if not isinstance(target, str) or not target.strip():
        raise OpError(f"target must be a string such as 'llvm', got {target!r}")
    return target.split()[0]


def get_def(name: str) -> OpDef:
    if name not in OPS:
        raise OpError(f"unknown operator {name!r}; the library has: {', '.join(sorted(OPS))}")
    return OPS[name]


def normalize_attrs(name: str, attrs: dict | None) -> dict:
    d = get_def(name)
    attrs = dict(attrs or {})
    unknown = sorted(set(attrs) - set(d.attrs))
    if unknown:
        raise OpError(f"{name}: unknown attribute(s) {', '.join(unknown)}; {name} takes "
                      f"{', '.join(d.attrs) or 'none'}")
    out = {}
    for k, default in d.attrs.items():
        if k in attrs:
            v = attrs[k]
            out[k] = tuple(v) if isinstance(v, list) else v
        elif default is REQUIRED:
            raise OpError(f"{name}: missing required attribute {k!r}")
        else:
            out[k] = default
    return out


def implementations(name: str, target="llvm") -> list[Implementation]:
    """Implementations of `name` for the target's kind, best first; raises OpNotSupported with
    the recorded reason (or the list of what exists) when there are none."""
    get_def(name)
    kind = target_kind(target)
    impls = IMPLS.get((name, kind))
    if impls:
        return list(impls)
    reason = DECLINED.get((name, kind)) or DECLINED.get(("*", kind))
    if reason is None:
        have = sorted({t for (o, t) in IMPLS if o == name})
        reason = (f"no implementation registered for target kind {kind!r}"
                  f" (it has: {', '.join(have) or 'none'})")
    raise OpNotSupported(f"operator {name!r} on target {kind!r}: {reason}")


def select(name: str, target, shapes, dtypes, attrs, impl_name: str | None = None) -> Implementation:
    """The best implementation that accepts this signature; the error lists every decline."""
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
        raise OpNotSupported(f"operator {name!r}: no implementation named {impl_name!r} (have: {have})")
    raise OpNotSupported(f"operator {name!r} with shapes {[list(s) for s in shapes]} {list(dtypes)} "
                         f"{attrs}: every implementation declined: " + "; ".join(reasons))
