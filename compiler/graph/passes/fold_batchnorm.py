"""FoldBatchNorm: merge an inference batch norm into the conv (or dense) that feeds it:
w' = w * g, b' = (b - mean) * g + beta with g = scale / sqrt(var + eps), per output channel.
A per-channel multiply or add by a constant after such a conv (a Caffe "Scale" layer after its
batch norm, as DenseNet-121's export has) folds the same way. A batch norm not after a foldable
producer becomes a per-channel multiply-add."""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, rewrite
from .import_qdq import rename_range

#: fold a per-channel constant mul/add after a conv into it (off: affine_as_depthwise takes it)
FOLD_SCALES = True


def _per_channel(c: Node, channels: int) -> np.ndarray | None:
    """The values of constant c if it broadcasts over axis 1 of a rank-4 N C H W result only."""
    if not c.is_const or not c.dtype.startswith("float") or c.value.ndim > 4 or c.value.size not in (1, channels):
        return None
    shape = (1,) * (4 - c.value.ndim) + c.value.shape
    if any(d != 1 for k, d in enumerate(shape) if k != 1):
        return None
    return np.broadcast_to(c.value.reshape(-1).astype(np.float64), (channels,))


def _foldable(p: Node, users, old_p: Node, graph: Graph) -> bool:
    """Whether p (a conv2d/dense with constant weights and bias) may absorb a per-channel affine:
    the affine is its only user and p is no graph output."""
    return (p.op in ("conv2d", "dense") and p.inputs[1].is_const and len(users[id(old_p)]) == 1
            and (len(p.inputs) < 3 or p.inputs[2].is_const) and not any(old_p is o for o in graph.outputs))


def _scaled(p: Node, g: np.ndarray, beta: np.ndarray, tag: str) -> Node:
    """p with its output channels scaled by g and shifted by beta."""
    w = p.inputs[1].value
    b = p.inputs[2].value.astype(np.float64) if len(p.inputs) == 3 else np.zeros(w.shape[0])
    w2 = (w.astype(np.float64) * g.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)
    b2 = (b * g + beta).astype(w.dtype)
    return p.with_inputs([p.inputs[0], Node.const(w2, name=f"{p.name}/w_{tag}"), Node.const(b2, name=f"{p.name}/b_{tag}")])


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold batch_norm (and a per-channel constant mul/add) into the preceding single-user
    conv2d/dense with constant weights."""
    users = graph.users()

    def fn(n: Node, old: Node):
        if n.op in ("mul", "add") and n.dtype == "float32" and n.type.rank == 4 and FOLD_SCALES:
            for k in (0, 1):
                p, c = n.inputs[k], n.inputs[1 - k]
                if p.op != "conv2d" or p.shape != n.shape or not _foldable(p, users, old.inputs[k], graph) \
                        or p.inputs[1].name in graph.meta.get("weight_scales", {}):
                    continue   # (a QDQ model's int8 weights stay as the model rounds them)
                v = _per_channel(c, n.shape[1])
                if v is None:
                    continue
                ch = n.shape[1]
                g, beta = (v, np.zeros(ch)) if n.op == "mul" else (np.ones(ch), v)
                rename_range(graph, n.name, p.name)
                return _scaled(p, g, beta, n.op)
            return None
        if n.op != "batch_norm" or not all(i.is_const for i in n.inputs[1:]):
            return None
        scale, beta, mean, var = (i.value.astype(np.float64) for i in n.inputs[1:])
        g = scale / np.sqrt(var + n.attrs["epsilon"])
        p = n.inputs[0]
        if _foldable(p, users, old.inputs[0], graph):
            rename_range(graph, n.name, p.name)
            return _scaled(p, g, beta - mean * g, "bn")
        sh = (1, -1) + (1,) * (n.inputs[0].type.rank - 2)
        dt = n.dtype
        mul = Node("mul", [p, Node.const(g.reshape(sh).astype(dt), name=f"{n.name}/scale")], name=f"{n.name}/mul",
                   origin=n.origin)
        return Node("add", [mul, Node.const(((beta - mean * g)).reshape(sh).astype(dt), name=f"{n.name}/shift")],
                    name=n.name, origin=n.origin)
    return rewrite(graph, fn)
