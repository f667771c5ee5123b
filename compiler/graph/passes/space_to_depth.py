"""Strided convs over few channels as stride-1 convs over space-to-depth blocks. An image's
3 channels fill 3 of the accelerator's 16 input lanes: the stem conv of a CNN (7x7 stride 2) or a
ViT's patch embedding (16x16 stride 16) would stay on the CPU. With stride s, output pixel
(y, x) reads input rows s*y + ky: writing ky = s*qy + ry, each s x s block of the (padded) input
becomes C*s*s channels of a smaller image, and the conv becomes a stride-1 conv over them with a
ceil(k/s) kernel, whose taps past k have zero weights (the MLPerf ResNet stem's rewrite; for a
patch embedding, kernel = stride, a 1x1 conv over the patches). The padding, a reshape and a
transpose run on the host; the sums are the same, and the pixels keep their scale."""
from __future__ import annotations

import numpy as np

from accel.isa import AccelConfig

from ..ir import Graph, Node, rewrite
from .import_qdq import rename_range


def _gemm_steps(channels: int, taps: int, block: int) -> int:
    """GEMM micro-ops per output pixel and output block: input blocks x kernel taps."""
    return -(-channels // block) * taps


def blocked_fill(c: int, kh: int, kw: int, s: int, block: int) -> float:
    """The share of the GEMM core's input lanes x taps that hold real MACs in the blocked conv."""
    return c * kh * kw / (_gemm_steps(c * s * s, -(-kh // s) * -(-kw // s), block) * block)


def candidate(n: Node) -> bool:
    """A float conv2d with constant weights, one group, no dilation and one stride s >= 2 across
    rows and columns."""
    if n.op != "conv2d" or n.dtype != "float32" or not all(i.is_const for i in n.inputs[1:]):
        return False
    a = n.attrs
    sh, sw = a["strides"]
    return (sh == sw >= 2 and tuple(a["dilations"]) == (1, 1) and a["groups"] == 1
            and len(n.inputs[0].shape) == 4)


def block_weights(w: np.ndarray, s: int) -> np.ndarray:
    """OIHW weights of a stride-s conv -> those of the stride-1 conv over s x s blocks:
    w'[o, (c, ry, rx), qy, qx] = w[o, c, s*qy + ry, s*qx + rx], zero past the kernel."""
    o, c, kh, kw = w.shape
    qh, qw = -(-kh // s), -(-kw // s)
    full = np.zeros((o, c, qh * s, qw * s), w.dtype)
    full[:, :, :kh, :kw] = w
    return np.ascontiguousarray(full.reshape(o, c, qh, s, qw, s).transpose(0, 1, 3, 5, 2, 4)
                                .reshape(o, c * s * s, qh, qw))


def space_to_depth_convs(graph: Graph, cfg: AccelConfig, min_fill: float = 0.75) -> Graph:
    """Rewrite each candidate conv whose blocked form takes fewer GEMM micro-ops per output pixel
    on the config's core (its channels padded to whole blocks of block_in) and fills at least
    min_fill of them with real MACs (blocked_fill; AccelRules.min_space_to_depth_fill) as pad
    (or crop), space-to-depth and a stride-1 conv (see the module doc); other convs stay."""
    def fn(n: Node, old: Node):
        if not candidate(n):
            return None
        x, w = n.inputs[:2]
        N, C, H, W = x.shape
        O, _, kh, kw = w.shape
        s = n.attrs["strides"][0]
        qh, qw = -(-kh // s), -(-kw // s)
        if (_gemm_steps(C * s * s, qh * qw, cfg.block_in) >= _gemm_steps(C, kh * kw, cfg.block_in)
                or blocked_fill(C, kh, kw, s, cfg.block_in) < min_fill):
            return None
        OH, OW = n.shape[2:]
        pt, pl, _, _ = n.attrs["pads"]
        bh, bw = OH + qh - 1, OW + qw - 1           # the blocked image the stride-1 conv reads
        pb, pr = s * bh - H - pt, s * bw - W - pl   # < 0: rows/columns no window reaches
        if pb < 0 or pr < 0:
            x = Node("slice", [x], {"starts": (0, 0), "ends": (H + min(pb, 0), W + min(pr, 0)), "axes": (2, 3),
                                    "steps": (1, 1)}, name=f"{n.name}/reached", origin=n.origin)
        if pt or pl or pb > 0 or pr > 0:
            x = Node("pad", [x], {"pads": (0, 0, pt, pl, 0, 0, max(pb, 0), max(pr, 0)), "mode": "constant",
                                  "value": 0.0}, name=f"{n.name}/padded", origin=n.origin)
        x = Node("reshape", [x], {"shape": (N, C, bh, s, bw, s)}, name=f"{n.name}/blocks", origin=n.origin)
        x = Node("transpose", [x], {"perm": (0, 1, 3, 5, 2, 4)}, name=f"{n.name}/space_to_depth", origin=n.origin)
        x = Node("reshape", [x], {"shape": (N, C * s * s, bh, bw)}, name=f"{n.name}/depth", origin=n.origin)
        rename_range(graph, n.inputs[0].name, x.name)   # a QDQ model's input range: the same values
        wb = Node.const(block_weights(w.value, s), name=f"{n.name}/block_weights")
        scales = graph.meta.get("weight_scales")
        if scales is not None and w.name in scales:   # per output channel: unchanged by the rewrite
            scales[wb.name] = scales[w.name]
        return Node("conv2d", [x, wb, *n.inputs[2:]], {**n.attrs, "strides": (1, 1), "pads": (0, 0, 0, 0)},
                    name=n.name, origin=n.origin)
    return rewrite(graph, fn)
