"""Statements of the loop IR, buffers and PrimFunc.

A PrimFunc is a list of parameter Buffers and a statement tree. Buffers carry their memory
scope ("global", or an accelerator scope such as "acc_buffer"); loops carry a ForKind and, for
thread binding, a thread tag; AttrStmt carries pragmas and other annotations that later
passes and backends read. Like expressions, nodes list their children in `_fields`.
"""
from __future__ import annotations

import enum
import itertools
from typing import Sequence

from . import dtype as dt
from .expr import BufferLoad, Call, IntImm, PrimExpr, StringImm, Var, const, convert

_uid = itertools.count()


class ForKind(str, enum.Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"
    VECTORIZED = "vectorized"
    UNROLLED = "unrolled"
    THREAD_BINDING = "thread_binding"
    VTHREAD = "vthread"


class Buffer:
    """A region of memory viewed as an n-d array.

    `base` is None for a real allocation or parameter; a view (made by tensorize binding
    an intrinsic's operands to a region) points at its base buffer with an element offset
    and strides, and storage flattening rewrites accesses of views to their base.
    """

    def __init__(self, name: str, shape: Sequence, dtype: str = "float32", scope: str = "global",
                 strides: Sequence | None = None, elem_offset=0, base: "Buffer | None" = None):
        self.name = name
        self.shape = tuple(convert(s) for s in shape)
        self.dtype = dt.check(dtype)
        self.scope = scope
        self.strides = tuple(convert(s) for s in strides) if strides is not None else None
        self.elem_offset = convert(elem_offset)
        self.base = base
        self.data = Var(name, "int64")   # the pointer, as codegen sees it
        self.uid = next(_uid)

    def access_ptr(self, offset=0) -> PrimExpr:
        """Address of element `offset` (flat, relative to this buffer/view) as a pointer value,
        for extern calls: `call_extern("void", "gemm", out.access_ptr(), a.access_ptr(), ...)`."""
        idx = [const(0)] * len(self.shape)
        if offset:
            idx[-1] = convert(offset)
        return Call("handle", "address_of", [BufferLoad(self, idx)])

    def vload(self, indices) -> PrimExpr:
        return BufferLoad(self, [convert(i) for i in indices])

    def vstore(self, indices, value) -> "BufferStore":
        return BufferStore(self, convert(value, self.dtype), [convert(i) for i in indices])

    def default_strides(self) -> tuple[PrimExpr, ...]:
        strides, acc = [], const(1)
        for s in reversed(self.shape):
            strides.append(acc)
            acc = acc * s
        return tuple(reversed(strides))

    def get_strides(self) -> tuple[PrimExpr, ...]:
        return self.strides if self.strides is not None else self.default_strides()

    def const_shape(self) -> tuple[int, ...]:
        out = []
        for s in self.shape:
            if not isinstance(s, IntImm):
                raise ValueError(f"buffer {self.name}: shape {self.shape} is not constant")
            out.append(s.value)
        return tuple(out)

    def numel(self) -> int:
        n = 1
        for s in self.const_shape():
            n *= s
        return n

    def __repr__(self):
        return f"Buffer({self.name}, {[str(s) for s in self.shape]}, {self.dtype}, scope={self.scope})"


class Stmt:
    _fields: tuple[str, ...] = ()

    def __repr__(self):
        from .printer import stmt_str  # noqa: PLC0415 - import cycle: printer imports stmt
        return stmt_str(self)


class For(Stmt):
    _fields = ("min", "extent", "body")

    def __init__(self, loop_var: Var, min, extent, kind: ForKind, body: Stmt,
                 thread_tag: str | None = None, annotations: dict | None = None):
        self.loop_var = loop_var
        self.min, self.extent = convert(min), convert(extent)
        self.kind = ForKind(kind)
        self.body = body
        self.thread_tag = thread_tag
        self.annotations = dict(annotations or {})


class Allocate(Stmt):
    """Allocate `buffer` (its shape, dtype and scope) for the duration of body."""
    _fields = ("body",)

    def __init__(self, buffer: Buffer, body: Stmt):
        self.buffer, self.body = buffer, body


class BufferStore(Stmt):
    _fields = ("value", "indices")

    def __init__(self, buffer: Buffer, value: PrimExpr, indices: Sequence[PrimExpr]):
        self.buffer, self.value, self.indices = buffer, value, tuple(indices)


class Evaluate(Stmt):
    _fields = ("value",)

    def __init__(self, value):
        self.value = convert(value)


class SeqStmt(Stmt):
    _fields = ("seq",)

    def __init__(self, seq: Sequence[Stmt]):
        self.seq = tuple(seq)


class IfThenElse(Stmt):
    _fields = ("condition", "then_case", "else_case")

    def __init__(self, condition: PrimExpr, then_case: Stmt, else_case: Stmt | None = None):
        self.condition, self.then_case, self.else_case = condition, then_case, else_case


class AttrStmt(Stmt):
    """An annotation on a region: pragmas ("pragma_<key>"), "virtual_thread", backend keys."""
    _fields = ("value", "body")

    def __init__(self, node, key: str, value, body: Stmt):
        self.node, self.key, self.body = node, key, body
        if value is None:
            value = const(1)
        elif isinstance(value, str):
            value = StringImm(value)
        self.value = convert(value)


class LetStmt(Stmt):
    _fields = ("value", "body")

    def __init__(self, var: Var, value: PrimExpr, body: Stmt):
        self.var, self.value, self.body = var, value, body


class PrimFunc:
    """A lowered function: parameter buffers (in call order) and a body."""

    def __init__(self, name: str, params: Sequence[Buffer], body: Stmt, attrs: dict | None = None):
        self.name, self.params, self.body = name, list(params), body
        self.attrs = dict(attrs or {})

    def with_body(self, body: Stmt) -> "PrimFunc":
        return PrimFunc(self.name, self.params, body, self.attrs)

    def script(self) -> str:
        from .printer import func_str  # noqa: PLC0415 - import cycle: printer imports stmt
        return func_str(self)

    def __repr__(self):
        return self.script()


def seq(*stmts) -> Stmt:
    """SeqStmt of the non-empty statements, flattened; a single statement stays itself."""
    flat = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, (list, tuple)):
            s = seq(*s)
            if s is None:
                continue
        if isinstance(s, SeqStmt):
            flat.extend(s.seq)
        elif isinstance(s, Evaluate) and isinstance(s.value, IntImm):
            continue   # no-op
        else:
            flat.append(s)
    if not flat:
        return Evaluate(0)
    return flat[0] if len(flat) == 1 else SeqStmt(flat)
