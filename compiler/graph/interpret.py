"""The graph interpreter: runs any graph (before or after passes, fused or not, float or int8)
with the ops' NumPy reference implementations. It is the oracle the executors are checked against.

run(graph, feeds) -> list of output arrays; feeds is a list (in graph.inputs order) or a dict by
input name. keep=True also returns every node's value (calibration reads them).
"""
from __future__ import annotations

import numpy as np

from .errors import GraphError, OpError
from .ir import Graph
from .ops import get_op


def _feeds(graph: Graph, feeds) -> list[np.ndarray]:
    if isinstance(feeds, dict):
        missing = [i.name for i in graph.inputs if i.name not in feeds]
        if missing:
            raise GraphError(f"graph '{graph.name}': no value fed for input(s) {', '.join(missing)}")
        feeds = [feeds[i.name] for i in graph.inputs]
    feeds = list(feeds)
    if len(feeds) != len(graph.inputs):
        raise GraphError(f"graph '{graph.name}' takes {len(graph.inputs)} inputs, got {len(feeds)}")
    out = []
    for node, v in zip(graph.inputs, feeds):
        v = np.asarray(v)
        if tuple(v.shape) != node.shape:
            raise GraphError(f"input '{node.name}': expected shape {list(node.shape)}, got {list(v.shape)}")
        out.append(v.astype(node.dtype, copy=False))
    return out


def run(graph: Graph, feeds, keep: bool = False):
    """Evaluate the graph. Returns the outputs, or (outputs, {id(node): value}) with keep=True."""
    env: dict[int, np.ndarray] = {}
    for node, v in zip(graph.inputs, _feeds(graph, feeds)):
        env[id(node)] = v
    last_use: dict[int, int] = {}
    if not keep:
        for k, n in enumerate(graph.nodes):
            for i in n.inputs:
                last_use[id(i)] = k
        for o in graph.outputs:
            last_use[id(o)] = len(graph.nodes)
    for k, n in enumerate(graph.nodes):
        if n.op == "input":
            continue
        opdef = get_op(n.op)
        args = [env[id(i)] for i in n.inputs]
        try:
            v = opdef.impl(n.attrs, *args)
        except OpError:
            raise
        except Exception as e:  # a reference implementation failing names the node
            raise OpError(f"{n.op} '{n.name}': reference implementation failed: {type(e).__name__}: {e}") from e
        v = np.asarray(v)
        if v.shape != n.shape or str(v.dtype) != n.dtype:
            raise OpError(f"{n.op} '{n.name}': computed {v.dtype}{list(v.shape)} but its type is {n.type}")
        env[id(n)] = v
        if not keep:
            for i in n.inputs:
                if last_use.get(id(i)) == k and i.op != "const":
                    env.pop(id(i), None)
    outs = [env[id(o)] for o in graph.outputs]
    return (outs, env) if keep else outs
