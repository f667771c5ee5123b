"""Simplify: local rewrites that expose fusion and quantization: move a reshape below the
elementwise op that reads it and merge chained reshapes (a 1-D conv's reshapes around its ReLU
cancel), drop no-op reshapes/transposes, turn a matmul by a constant matrix into dense and a
transposed conv by constant weights into a conv and a pixel shuffle, and move a constant bias
add into the conv/dense before it (also through the reshape around a 3-d MatMul)."""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, rewrite
from ..ops import Pattern, get_op
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


def _conv_transpose_to_conv(graph: Graph, n: Node) -> Node:
    """A transposed conv (stride s, kernel k, constant weights) as a stride-1 conv to O*s*s
    channels, one per output phase (the sub-pixel form), then a pixel shuffle and a crop.
    Output row Y = q*s + r takes the taps i = m*s + r of input rows q - m, so every phase is a
    correlation with the kernel's taps r, r+s, ... reversed (ceil(k/s) of them, the kernel
    zero-padded to a multiple of s; a dilated kernel first spreads its taps). No MAC multiplies
    an inserted zero, and the conv runs on the fast conv kernels of every target."""
    x, w = n.inputs[:2]
    a = n.attrs
    N, C, H, W = x.shape
    g = a["groups"]
    wv = w.value.astype(np.float32)
    (sh, sw), (dh, dw) = a["strides"], a["dilations"]
    if (dh, dw) != (1, 1):
        kh, kw = wv.shape[2:]
        spread = np.zeros(wv.shape[:2] + ((kh - 1) * dh + 1, (kw - 1) * dw + 1), np.float32)
        spread[:, :, ::dh, ::dw] = wv
        wv = spread
    og, kh, kw = wv.shape[1:]
    mh, mw = -(-kh // sh), -(-kw // sw)
    taps = np.zeros((C, og, mh * sh, mw * sw), np.float32)
    taps[:, :, :kh, :kw] = wv
    # [c, o, m, r] -> reversed m -> weight [(group, o, rh, rw), c/g, mh', mw']
    t = taps.reshape(g, C // g, og, mh, sh, mw, sw)[:, :, :, ::-1, :, ::-1, :]
    wconv = np.ascontiguousarray(t.transpose(0, 2, 4, 6, 1, 3, 5).reshape(g * og * sh * sw, C // g, mh, mw))
    full_h = (H - 1) * sh + kh + a["output_padding"][0]
    full_w = (W - 1) * sw + kw + a["output_padding"][1]
    qh, qw = -(-full_h // sh), -(-full_w // sw)
    ins = [x, Node.const(wconv, name=f"{n.name}/phases")]
    if len(n.inputs) > 2:
        ins.append(Node.const(np.repeat(n.inputs[2].value.astype(np.float32), sh * sw), name=f"{n.name}/phase_bias"))
    conv = Node("conv2d", ins, {"strides": (1, 1), "pads": (mh - 1, mw - 1, qh - H, qw - W), "dilations": (1, 1),
                                "groups": g}, name=f"{n.name}/conv", origin=n.origin)
    O = g * og
    y = Node("reshape", [conv], {"shape": (N, O, sh, sw, qh, qw)}, name=f"{n.name}/phases_split", origin=n.origin)
    y = Node("transpose", [y], {"perm": (0, 1, 4, 2, 5, 3)}, name=f"{n.name}/shuffle", origin=n.origin)
    y = Node("reshape", [y], {"shape": (N, O, qh * sh, qw * sw)}, name=f"{n.name}/interleave", origin=n.origin)
    pt, pl = a["pads"][:2]
    OH, OW = n.shape[2:]
    for new in (conv.name, y.name):
        rename_range(graph, n.name, new)
    return Node("slice", [y], {"starts": (pt, pl), "ends": (pt + OH, pl + OW), "axes": (2, 3), "steps": (1, 1)},
                name=n.name, origin=n.origin)


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
        if (len(n.inputs) == 1 and n.inputs[0].op == "reshape" and get_op(n.op).pattern == Pattern.ELEMWISE
                and single(old.inputs[0])):
            # f(reshape(x)) = reshape(f(x)) for an op of one input read element by element
            inner = n.with_inputs([n.inputs[0].inputs[0]], name=f"{n.name}/unreshaped")
            rename_range(graph, n.name, inner.name)
            return Node("reshape", [inner], {"shape": n.shape}, name=n.name, origin=n.origin)
        if n.op == "matmul" and n.inputs[1].is_const and n.inputs[1].type.rank == 2:
            return _matmul_to_dense(graph, n)
        if (n.op == "conv2d_transpose" and all(i.is_const for i in n.inputs[1:]) and n.dtype == "float32"
                and n.inputs[1].dtype == "float32"):
            return _conv_transpose_to_conv(graph, n)
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
