"""FlattenStorage: every n-d buffer access becomes one flat element index,
sum(index_d * stride_d) + elem_offset, and accesses through tensorize views (Buffer.base) are
redirected to the underlying buffer. Buffers keep their n-d shape (for allocation sizes and
argument checks); after this pass every BufferLoad/BufferStore has exactly one index."""
from __future__ import annotations

from .. import expr as E
from ..functor import Mutator
from ..stmt import Buffer, BufferStore, PrimFunc
from . import register_pass


def flat_index(buf: Buffer, indices) -> tuple[Buffer, E.PrimExpr]:
    """(root buffer, flat element index) of an n-d access of buf."""
    if len(indices) != len(buf.shape):
        if len(indices) == 1 and getattr(buf, "_flat", False):
            return buf, indices[0]
        raise ValueError(f"buffer '{buf.name}' has {len(buf.shape)} dims, accessed with {len(indices)} indices")
    idx = buf.elem_offset
    for i, s in zip(indices, buf.get_strides()):
        idx = idx + i * s if not E.is_const(s, 1) else idx + i
    if buf.base is not None:
        return flat_index(buf.base, [idx]) if len(buf.base.shape) == 1 else _flat_base(buf.base, idx)
    return buf, idx


def _flat_base(base: Buffer, idx):
    # idx is already a flat offset into base (views carry base strides)
    if base.base is not None:
        return _flat_base(base.base, base.elem_offset + idx)
    return base, (base.elem_offset + idx) if not E.is_const(base.elem_offset, 0) else idx


class _Flatten(Mutator):
    def visit_BufferLoad(self, e):
        idx = [self.visit(i) for i in e.indices]
        if len(idx) == 1 and e.buffer.base is None and len(e.buffer.shape) != 1 and getattr(e, "_flat", False):
            return e
        buf, flat = flat_index(e.buffer, idx)
        return E.BufferLoad(buf, [flat], lanes=E.dt.lanes(e.dtype) if E.dt.lanes(e.dtype) > 1 else None)

    def visit_BufferStore(self, s):
        idx = [self.visit(i) for i in s.indices]
        buf, flat = flat_index(s.buffer, idx)
        return BufferStore(buf, self.visit(s.value), [flat])


@register_pass("FlattenStorage")
def FlattenStorage():
    """n-d buffer accesses -> flat element indices on the underlying buffers."""
    def run(func: PrimFunc) -> PrimFunc:
        if func.attrs.get("flattened"):
            return func
        out = func.with_body(_Flatten().visit(func.body))
        out.attrs["flattened"] = True
        return out
    return run
