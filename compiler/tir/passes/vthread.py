"""LowerVirtualThread (CPU): a loop bound to a virtual thread runs its iterations one after
another. Virtual threads exist for backends that interleave them to hide latency (the
accelerator turns them into dependency-token pipelines); on a CPU they are plain loops."""
from __future__ import annotations

from ..functor import Mutator
from ..stmt import For, ForKind, PrimFunc
from . import register_pass


class _Serialize(Mutator):
    def visit_For(self, s: For):
        body = self.visit(s.body)
        if s.kind == ForKind.VTHREAD:
            return For(s.loop_var, s.min, s.extent, ForKind.SERIAL, body, None, s.annotations)
        return s if body is s.body else For(s.loop_var, s.min, s.extent, s.kind, body, s.thread_tag, s.annotations)


@register_pass("LowerVirtualThread")
def LowerVirtualThread():
    """Virtual-thread loops -> serial loops (CPU backend)."""
    def run(func: PrimFunc) -> PrimFunc:
        return func.with_body(_Serialize().visit(func.body))
    return run
