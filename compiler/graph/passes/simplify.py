"""Simplify: local rewrites that expose fusion and quantization: merge chained reshapes, drop
no-op reshapes/transposes, turn a matmul by a constant matrix into dense, and move a constant
bias add into the conv/dense before it (also through the reshape around a 3-d MatMul)."""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, rewrite
from .import_qdq import carry_weight_scale, rename_range


def _bias_vector(b: Node, channels: int, axis: int, rank: int):
    """b's values if b broadcasts only along `axis` (of a rank-`rank` result) with `channels` entries."""
    if not b.is_const or b.dtype != "float32" or b.type.rank > rank:
        return None
    shape = (1,) * (rank - b.type.rank) + b.shape
    if any(d != 1 for k, d in enumerate(shape) if k != axis) or shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(b.value.reshape(-1), (channels,)).astype(np.float32)


def _matmul_to_dense(graph: Graph, n: Node) -> Node:
    """x @ W with constant 2-d W (as QDQ models leave Gemm/MatMul once their weights fold) -> dense."""
    x, w = n.inputs
    wt = Node.const(np.ascontiguousarray(w.value.T), name=f"{w.name}/T")
    carry_weight_scale(graph, w.name, wt.name)
    if x.type.rank == 2:
        return Node("dense", [x, wt], name=n.name, origin=n.origin)
    lead = x.shape[:-1]
    flat = Node("reshape", [x], {"shape": (int(np.prod(lead)), x.shape[-1])}, name=f"{n.name}/flatten", origin=n.origin)
    d = Node("dense", [flat, wt], name=f"{n.name}/dense", origin=n.origin)
    return Node("reshape", [d], {"shape": n.shape}, name=n.name, origin=n.origin)


def simplify(graph: Graph) -> Graph:
    """Reshape/transpose cleanup and bias folding into conv2d/dense."""
    users = graph.users()

    def single(old: Node) -> bool:
        return len(users[id(old)]) == 1 and not any(old is o for o in graph.outputs)

    def fn(n: Node, old: Node):
        if n.op == "reshape":
            x = n.inputs[0]
            if x.op == "reshape":
                n = n.with_inputs([x.inputs[0]])
            return n.inputs[0] if n.inputs[0].shape == n.shape else n
        if n.op == "transpose" and list(n.attrs["perm"]) == list(range(n.type.rank)):
            return n.inputs[0]
        if n.op == "matmul" and n.inputs[1].is_const and n.inputs[1].type.rank == 2:
            return _matmul_to_dense(graph, n)
        if n.op != "add":
            return None
        for k in (0, 1):
            p, b, oldp = n.inputs[k], n.inputs[1 - k], old.inputs[k]
            if not single(oldp):
                continue
            if p.op == "conv2d" and len(p.inputs) == 2:
                bias = _bias_vector(b, p.shape[1], 1, 4)
                if bias is not None and n.shape == p.shape:
                    rename_range(graph, n.name, p.name)
                    return p.with_inputs([*p.inputs, Node.const(bias, name=f"{p.name}/bias")])
            inner = p
            if p.op == "reshape" and p.inputs[0].op == "dense" and single(oldp.inputs[0]):
                inner = p.inputs[0]
            if inner.op == "dense" and len(inner.inputs) == 2 and p.shape[-1] == inner.shape[-1]:
                bias = _bias_vector(b, p.shape[-1], p.type.rank - 1, p.type.rank)
                if bias is not None and n.shape == p.shape:
                    d = inner.with_inputs([*inner.inputs, Node.const(bias, name=f"{inner.name}/bias")])
                    if inner is p:
                        rename_range(graph, n.name, p.name)
                        return d
                    return p.with_inputs([d], name=n.name)
        return None
    return rewrite(graph, fn)
