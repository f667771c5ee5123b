"""FoldConstants: evaluate every op whose inputs are all constants (shape subgraphs, DQ of int8
weights, transposed weights) and replace it by a constant. A folded DequantizeLinear with no zero
point leaves its scale (one, or one per axis entry in a shape that broadcasts against the values)
in graph.meta['weight_scales'] by the constant's name: the quantizer then recovers the model's own
int8 values instead of choosing a scale of its own."""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, rewrite
from ..ops import get_op

#: ops never folded (none yet; the hook for ops whose folded value would be huge or target-specific).
NO_FOLD: tuple[str, ...] = ()


def fold_constants(graph: Graph, max_bytes: int = 64 << 20) -> Graph:
    """Replace ops with only constant inputs by their computed value."""
    scales = dict(graph.meta.get("weight_scales", {}))

    def fn(n: Node, old: Node):
        if n.op in ("input", "const", *NO_FOLD) or not n.inputs or not all(i.is_const for i in n.inputs):
            return None
        if n.type.nbytes > max_bytes:
            return None
        v = get_op(n.op).impl(n.attrs, *(i.value for i in n.inputs))
        if n.op == "dequantize_linear" and (len(n.inputs) == 2 or not np.any(n.inputs[2].value)):
            s = n.inputs[1].value.astype(np.float64)
            if s.size == 1:
                scales[n.name] = s.reshape(())
            else:  # per axis: kept in a shape that broadcasts against the values
                shape = [1] * n.type.rank
                shape[n.attrs["axis"] % n.type.rank] = -1
                scales[n.name] = s.reshape(shape)
        elif n.op in ("transpose", "reshape", "squeeze", "unsqueeze") and n.inputs[0].name in scales:
            s = scales[n.inputs[0].name]  # the same values, moved: a transpose moves a per-axis scale along
            if n.op == "transpose":
                scales[n.name] = np.transpose(s, n.attrs["perm"]) if s.ndim else s
            elif s.size == 1:
                scales[n.name] = s
        return Node.const(np.asarray(v).astype(n.dtype, copy=False), name=n.name)
    return rewrite(graph, fn, {"weight_scales": scales})
