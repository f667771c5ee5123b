"""FoldConstants: evaluate every op whose inputs are all constants (shape subgraphs, DQ of int8
weights, transposed weights) and replace it by a constant."""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, rewrite
from ..ops import get_op

#: ops never folded (none yet; the hook for ops whose folded value would be huge or target-specific).
NO_FOLD: tuple[str, ...] = ()


def fold_constants(graph: Graph, max_bytes: int = 64 << 20) -> Graph:
    """Replace ops with only constant inputs by their computed value."""
    def fn(n: Node, old: Node):
        if n.op in ("input", "const", *NO_FOLD) or not n.inputs or not all(i.is_const for i in n.inputs):
            return None
        if n.type.nbytes > max_bytes:
            return None
        v = get_op(n.op).impl(n.attrs, *(i.value for i in n.inputs))
        return Node.const(np.asarray(v).astype(n.dtype, copy=False), name=n.name)
    return rewrite(graph, fn)
