"""Patchify convs as 1x1 convs over patches: a conv whose kernel equals its stride, with no padding
(a ViT's patch embedding, ConvNeXt's and Swin's 4x4 stems), reads each input pixel once. Over
an image of few channels its input channels fill a sliver of the accelerator's GEMM core (3 of
16 lanes: the conv stays on the CPU). Space-to-depth first, a reshape and a transpose on the host,
turns it into a 1x1 conv over C x kh x kw channels (768 for a 16x16 patch of RGB), which fills
the core. Same sums, same int8 arithmetic: the patch's pixels keep their scale."""
from __future__ import annotations

from accel.isa import AccelConfig

from ..ir import Graph, Node, rewrite
from .import_qdq import rename_range


def _waste(channels: int, block: int) -> float:
    """The share of the GEMM core's input lanes that padding the channels to whole blocks wastes."""
    return 1 - channels / (-(-channels // block) * block)


def is_patchify(n: Node) -> bool:
    """A float conv2d with constant weights whose kernel is its stride: no padding, no dilation,
    one group (every input pixel in exactly one window, but those past the last whole window)."""
    if n.op != "conv2d" or n.dtype != "float32" or not all(i.is_const for i in n.inputs[1:]):
        return False
    a, w = n.attrs, n.inputs[1]
    kh, kw = w.shape[2:]
    return (tuple(a["strides"]) == (kh, kw) and kh * kw > 1 and not any(a["pads"])
            and tuple(a["dilations"]) == (1, 1) and a["groups"] == 1 and len(n.inputs[0].shape) == 4)


def patchify_convs(graph: Graph, cfg: AccelConfig) -> Graph:
    """Rewrite each patchify conv whose input channels waste more of the config's GEMM core than
    the patches' would (see the module doc) as slice (whole windows only), space-to-depth and a
    1x1 conv; other convs stay."""
    def fn(n: Node, old: Node):
        if not is_patchify(n):
            return None
        x, w = n.inputs[:2]
        N, C, H, W = x.shape
        O, _, kh, kw = w.shape
        if _waste(C, cfg.block_in) <= _waste(C * kh * kw, cfg.block_in):
            return None
        OH, OW = n.shape[2:]
        if (H, W) != (OH * kh, OW * kw):   # the rows and columns past the last window
            x = Node("slice", [x], {"starts": (0, 0), "ends": (OH * kh, OW * kw), "axes": (2, 3), "steps": (1, 1)},
                     name=f"{n.name}/whole_windows", origin=n.origin)
        x = Node("reshape", [x], {"shape": (N, C, OH, kh, OW, kw)}, name=f"{n.name}/windows", origin=n.origin)
        x = Node("transpose", [x], {"perm": (0, 1, 3, 5, 2, 4)}, name=f"{n.name}/space_to_depth", origin=n.origin)
        x = Node("reshape", [x], {"shape": (N, C * kh * kw, OH, OW)}, name=f"{n.name}/patches", origin=n.origin)
        rename_range(graph, n.inputs[0].name, x.name)   # a QDQ model's input range: the same values
        wp = Node.const(w.value.reshape(O, C * kh * kw, 1, 1), name=f"{n.name}/patch_weights")
        scales = graph.meta.get("weight_scales")
        if scales is not None and w.name in scales:   # per output channel: unchanged by the reshape
            scales[wp.name] = scales[w.name]
        return Node("conv2d", [x, wp, *n.inputs[2:]], {**n.attrs, "strides": (1, 1)}, name=n.name,
                    origin=n.origin)
    return rewrite(graph, fn)
