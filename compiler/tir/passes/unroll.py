"""UnrollLoops: replace a loop marked `unrolled` (constant bounds) by copies of its body with
the loop variable substituted, so each copy sees constant indices. Loops longer than
MAX_UNROLL stay loops (logged)."""
from __future__ import annotations

import logging

from .. import expr as E
from ..functor import Mutator, substitute
from ..stmt import For, ForKind, PrimFunc, seq
from . import register_pass

log = logging.getLogger(__name__)

MAX_UNROLL = 512


class _Unroll(Mutator):
    def visit_For(self, s: For):
        body = self.visit(s.body)
        if s.kind == ForKind.UNROLLED:
            if isinstance(s.min, E.IntImm) and isinstance(s.extent, E.IntImm) and s.extent.value <= MAX_UNROLL:
                return seq(*[substitute(body, {s.loop_var: E.const(s.min.value + k, s.loop_var.dtype)})
                             for k in range(s.extent.value)])
            log.info("UnrollLoops: loop '%s' (extent %s) left as a loop: not constant or longer than %d",
                     s.loop_var.name, s.extent, MAX_UNROLL)
            return For(s.loop_var, s.min, s.extent, ForKind.SERIAL, body, None, s.annotations)
        return s if body is s.body else For(s.loop_var, s.min, s.extent, s.kind, body, s.thread_tag, s.annotations)


@register_pass("UnrollLoops")
def UnrollLoops():
    """Fully unroll loops of kind `unrolled`."""
    def run(func: PrimFunc) -> PrimFunc:
        return func.with_body(_Unroll().visit(func.body))
    return run
