"""FoldBatchNorm: merge an inference batch norm into the conv (or dense) that feeds it:
w' = w * g, b' = (b - mean) * g + beta with g = scale / sqrt(var + eps), per output channel.
A batch norm not after a foldable producer becomes a per-channel multiply-add."""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, rewrite
from .import_qdq import rename_range


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold batch_norm into the preceding single-user conv2d/dense with constant weights."""
    users = graph.users()

    def fn(n: Node, old: Node):
        if n.op != "batch_norm" or not all(i.is_const for i in n.inputs[1:]):
            return None
        scale, beta, mean, var = (i.value.astype(np.float64) for i in n.inputs[1:])
        g = scale / np.sqrt(var + n.attrs["epsilon"])
        p = n.inputs[0]
        if p.op in ("conv2d", "dense") and p.inputs[1].is_const and len(users[id(old.inputs[0])]) == 1 \
                and (len(p.inputs) < 3 or p.inputs[2].is_const):
            w = p.inputs[1].value
            b = p.inputs[2].value.astype(np.float64) if len(p.inputs) == 3 else np.zeros(w.shape[0])
            w2 = (w.astype(np.float64) * g.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
            b2 = ((b - mean) * g + beta).astype(w.dtype)
            rename_range(graph, n.name, p.name)
            return p.with_inputs([p.inputs[0], Node.const(w2, name=f"{p.name}/w_bn"), Node.const(b2, name=f"{p.name}/b_bn")])
        sh = (1, -1) + (1,) * (n.inputs[0].type.rank - 2)
        dt = n.dtype
        mul = Node("mul", [p, Node.const(g.reshape(sh).astype(dt), name=f"{n.name}/scale")], name=f"{n.name}/mul",
                   origin=n.origin)
        return Node("add", [mul, Node.const(((beta - mean * g)).reshape(sh).astype(dt), name=f"{n.name}/shift")],
                    name=n.name, origin=n.origin)
    return rewrite(graph, fn)
