"""NchwcLayout: the CPU target keeps convolutions in the blocked layout N C' H W c (c channel lanes
last) between layers, as onnxruntime's NCHWc transformer does, instead of each conv kernel
packing its NCHW input and unpacking its output (a full pass over memory on both sides).

A float conv2d (constant weight; grouped ones where whole blocks fit in each group) becomes
conv2d_NCHWc on a blocked input, its weight packed here once (OIHW -> O' I' KH KW i o) and its bias
a blocked broadcast add. The layout then
flows through the ops that work per channel block unchanged: elementwise ops, binary ops of two
tensors of the same blocking or with a per-channel/scalar constant, batch norm (as a blocked
multiply-add), max/avg pooling, depthwise convs (depthwise_conv2d_NCHWc: each lane its own channel,
so any blocking serves), and a channel concat of inputs of one blocking. Every other reader
(reshape, gemm, global pools, LRN, narrow grouped convs, graph outputs) gets a layout_transform back to
NCHW, made once per tensor; a pack of a tensor that was just unpacked with the same block cancels.
A conv goes blocked when its result reaches another blocked conv through such ops, or when its
input is blocked and its output block is at least a vector of floats (its epilogue, a residual add
included, runs blocked, and the unpack is written from its registers); else it runs its NCHW kernel
(for a 1x1 conv with a narrow block, the pointwise kernel: faster there). Blocks are the conv kernel's own choice (compiler.ops.cpu.conv_blocks): the output
block from the output channels; an input block is whatever its producer gives, or, after a
boundary, the kernel's input block. graph.meta['nchwc'] counts what was converted.
"""
from __future__ import annotations

import numpy as np

from ...ops.cpu import conv_blocks, lanes
from ...ops.nn import pack_depthwise_kernel_np, pack_kernel_np
from ..ir import Graph, Node, rewrite
from .eliminate_dead_code import eliminate_dead_code

#: per-element ops with no channel dependence (float in, float out)
UNARY = frozenset({"relu", "sigmoid", "tanh", "exp", "sqrt", "neg", "abs", "log", "reciprocal", "erf", "gelu",
                   "leaky_relu", "clip"})
BINARY = frozenset({"add", "sub", "mul", "div", "maximum", "minimum"})
POOLS = frozenset({"max_pool2d", "avg_pool2d"})
FLOATS = ("float32",)


def _layout(b: int) -> str:
    return f"NCHW{b}c"


def _is_nchw_float(n: Node) -> bool:
    return n.type.rank == 4 and n.dtype in FLOATS


def blocked_conv(n: Node) -> tuple[int, int] | None:
    """(ic, oc): the blocks of a conv2d the pass may run blocked, else None. A grouped conv qualifies
    when whole blocks fit in each group (RegNet's groups of 16 channels, ResNeXt's wider stages);
    depthwise convs have their own kernel (blocked_depthwise)."""
    g = n.attrs.get("groups", 1)
    if n.op != "conv2d" or n.dtype not in FLOATS:
        return None
    x, w = n.inputs[0], n.inputs[1]
    if not (_is_nchw_float(x) and w.is_const and w.type.rank == 4) or (len(n.inputs) > 2 and not n.inputs[2].is_const):
        return None
    if g != 1 and (w.shape[1] < lanes("float32") or x.shape[1] % g or n.shape[1] % g):
        return None   # narrower groups: blocks under a vector ran slower than the NCHW kernel (ResNeXt's 4 and 8)
    ic, oc = conv_blocks(w.shape[1], n.shape[1] // g, n.dtype)
    return (ic, oc) if oc >= 4 and (n.shape[1] // g) % oc == 0 and w.shape[1] % ic == 0 else None


def blocked_depthwise(n: Node) -> bool:
    """A float depthwise conv2d (groups == C == O, constant weight and bias) the pass may run blocked:
    each lane is its own channel, so any block of its input serves."""
    if n.op != "conv2d" or n.dtype not in FLOATS or not _is_nchw_float(n.inputs[0]):
        return False
    w, C = n.inputs[1], n.inputs[0].shape[1]
    return (n.attrs.get("groups", 1) == C == n.shape[1] > 1 and w.is_const and w.type.rank == 4
            and w.shape[1] == 1 and (len(n.inputs) < 3 or n.inputs[2].is_const))


def _channel_const(c: Node, channels: int) -> np.ndarray | None:
    """A constant operand as (1, C, 1, 1) (or (1, 1, 1, 1) for a scalar) if it broadcasts per channel
    over an NCHW tensor of `channels` channels, else None."""
    v = np.asarray(c.value)
    if v.ndim > 4:
        return None
    v4 = v.reshape((1,) * (4 - v.ndim) + v.shape)
    if v4.shape[0] != 1 or v4.shape[2:] != (1, 1) or v4.shape[1] not in (1, channels):
        return None
    return v4


def _blocked_const(v4: np.ndarray, b: int) -> np.ndarray:
    """(1, C, 1, 1) -> (1, C/b, 1, 1, b); a scalar stays (1, 1, 1, 1, 1)."""
    if v4.shape[1] == 1:
        return v4.reshape(1, 1, 1, 1, 1)
    return np.ascontiguousarray(v4.reshape(1, v4.shape[1] // b, b, 1, 1).transpose(0, 1, 3, 4, 2))


def _per_channel(i: Node, n: Node) -> bool:
    """A computed (N, C, 1, 1) operand of n: a per-channel scale such as a squeeze-excitation gate."""
    return not i.is_const and i.type.rank == 4 and i.shape == n.shape[:2] + (1, 1) != n.shape


def _flexible(n: Node) -> bool:
    """An op that may run on a blocked tensor (whether it does depends on its inputs' layouts)."""
    if n.dtype not in FLOATS or n.type.rank != 4:
        return False
    if n.op in UNARY or n.op in POOLS:
        return True
    if n.op in BINARY:
        return all(i.is_const or i.shape == n.shape or _per_channel(i, n) for i in n.inputs) and \
            any(i.shape == n.shape and not i.is_const for i in n.inputs)
    if n.op == "batch_norm":
        return all(i.is_const for i in n.inputs[1:])
    return n.op == "concat" and n.attrs["axis"] % 4 == 1


def _through_elementwise(n: Node) -> Node:
    """The producer of n's values through per-element ops and pools (which keep any blocking)."""
    while n.op in UNARY or n.op in POOLS:
        n = n.inputs[0]
    return n


def _block_fits(conv: Node, b: int) -> bool:
    """Whether output block b holds whole blocks of each of the conv's groups."""
    return (conv.shape[1] // conv.attrs.get("groups", 1)) % b == 0


def _concat_blocks(graph: Graph) -> dict[int, int]:
    """id(conv) -> a smaller output block than its own, so that the channel concats it feeds (through
    elementwise ops and pools) meet on one block: the least block of the concat's convs, where it
    divides every input's channels and is at least a vector of floats (or the conv's own block)."""
    prefer: dict[int, int] = {}
    vl = lanes("float32")
    for n in graph.nodes:
        if n.op != "concat" or not _flexible(n):
            continue
        convs = [i for i in map(_through_elementwise, n.inputs) if blocked_conv(i) is not None]
        if len(convs) < 2:
            continue
        b = min(prefer.get(id(c), blocked_conv(c)[1]) for c in convs)
        if any(i.shape[1] % b for i in n.inputs):
            continue
        for c in convs:
            own = blocked_conv(c)[1]
            if b < own and b >= min(own, vl) and _block_fits(c, b):
                prefer[id(c)] = min(b, prefer.get(id(c), own))
    return prefer


def _grouped_input_blocks(graph: Graph, prefer: dict[int, int]) -> None:
    """A conv feeding a grouped conv (through elementwise ops and pools) writes the grouped conv's
    input block, which divides a group's channels: else the tensor was unpacked and packed again
    between them (RegNet's 1x1 convs write 32 or 64 lanes, its groups hold 16 channels)."""
    for n in graph.nodes:
        cb = blocked_conv(n)
        if cb is None or n.attrs.get("groups", 1) == 1:
            continue
        i = _through_elementwise(n.inputs[0])
        own = blocked_conv(i)
        if own is not None and cb[0] >= 4 and _block_fits(i, cb[0]):
            prefer[id(i)] = min(cb[0], prefer.get(id(i), own[1]))


def _pad_output_channels(graph: Graph) -> Graph:
    """A conv whose output channels have no block of a power of two of at least 4 lanes (a
    detection head's 255, a segmentation head's 19 or 21 classes) gets zero filters up to a
    multiple of the vector width, and a slice keeps the real channels: 15- or 1-lane kernels ran
    10-20x slower than the padded conv."""
    vl = lanes("float32")

    def fn(n: Node, old: Node):
        if n.op != "conv2d" or n.attrs.get("groups", 1) != 1 or n.dtype not in FLOATS:
            return None
        x, w = n.inputs[:2]
        O = n.shape[1]
        oc = conv_blocks(x.shape[1], O, n.dtype)[1]
        if O < 8 or (oc >= 4 and oc & (oc - 1) == 0) or not all(i.is_const for i in n.inputs[1:]):
            return None
        P = -(-O // vl) * vl
        ins = [x, Node.const(np.concatenate([w.value, np.zeros((P - O, *w.shape[1:]), w.value.dtype)]),
                             name=f"{w.name}/padded")]
        if len(n.inputs) > 2:
            b = n.inputs[2].value
            ins.append(Node.const(np.concatenate([b, np.zeros(P - O, b.dtype)]), name=f"{n.inputs[2].name}/padded"))
        conv = Node("conv2d", ins, n.attrs, name=f"{n.name}/padded", origin=n.origin)
        return Node("slice", [conv], {"starts": (0,), "ends": (O,), "axes": (1,), "steps": (1,)}, name=n.name,
                    origin=n.origin)
    return rewrite(graph, fn)


def nchwc_layout(graph: Graph) -> Graph:
    """Blocked layouts between convs (module doc); graph.meta['nchwc'] reports the conversion."""
    graph = _pad_output_channels(graph)
    users = graph.users()
    # does this node's result reach a blocked conv's data input through flexible ops?
    reaches: dict[int, bool] = {}
    for n in reversed(graph.nodes):
        reaches[id(n)] = any((blocked_conv(u) is not None and u.inputs[0] is n)
                             or (_flexible(u) and reaches[id(u)])
                             or (blocked_depthwise(u) and u.inputs[0] is n and reaches[id(u)])
                             for u in users.get(id(n), ()))

    prefer = _concat_blocks(graph)
    _grouped_input_blocks(graph, prefer)

    mapping: dict[int, Node] = {}
    block: dict[int, int] = {}        # id(new node) -> its lane block (blocked nodes only)
    unpacked_of: dict[int, Node] = {}  # id(unpack node) -> the blocked tensor it unpacks
    to_nchw_cache: dict[int, Node] = {}
    to_blocked_cache: dict[tuple[int, int], Node] = {}
    nodes: list[Node] = []
    stats = {"convs": 0, "depthwise": 0, "blocked_ops": 0, "packs": 0, "unpacks": 0}

    def emit(n: Node) -> Node:
        nodes.append(n)
        return n

    def nchw(x: Node) -> Node:
        if id(x) not in block:
            return x
        if id(x) not in to_nchw_cache:
            u = emit(Node("layout_transform", [x], {"src_layout": _layout(block[id(x)]), "dst_layout": "NCHW"},
                          name=f"{x.name}/nchw", target=x.target))
            unpacked_of[id(u)] = x
            to_nchw_cache[id(x)] = u
            stats["unpacks"] += 1
        return to_nchw_cache[id(x)]

    def blocked(x: Node, b: int) -> Node:
        if block.get(id(x)) == b:
            return x
        x = nchw(x)
        src = unpacked_of.get(id(x))
        if src is not None and block[id(src)] == b:
            return src
        key = (id(x), b)
        if key not in to_blocked_cache:
            p = emit(Node("layout_transform", [x], {"src_layout": "NCHW", "dst_layout": _layout(b)},
                          name=f"{x.name}/nchw{b}c", target=x.target))
            block[id(p)] = b
            to_blocked_cache[key] = p
            stats["packs"] += 1
        return to_blocked_cache[key]

    def const(value: np.ndarray, name: str) -> Node:
        return emit(Node.const(np.ascontiguousarray(value), name=name))

    def out(n: Node, b: int) -> Node:
        block[id(n)] = b
        stats["blocked_ops"] += 1
        return n

    def depthwise(old: Node, ins: list[Node]) -> Node | None:
        """Blocked depthwise in its input's blocking (or, when its result reaches a blocked conv, a
        vector's worth of lanes); else None: NCHW in and out stays with the NCHW kernel."""
        x = ins[0]
        if id(x) in block:
            b = block[id(x)]
        else:
            b = min(old.shape[1] & -old.shape[1], lanes("float32"))   # a power of two: others shuffle
            if not reaches[id(old)] or b < 4:
                return None
            x = blocked(x, b)
        w = const(pack_depthwise_kernel_np(np.asarray(ins[1].value), b), f"{ins[1].name}/c{b}c")
        stats["depthwise"] += 1
        return conv_node("depthwise_conv2d_NCHWc", old, ins, x, w, b)

    def conv_node(op: str, old: Node, ins: list[Node], x: Node, w: Node, b: int) -> Node:
        """The blocked conv `op` of `old` (and its bias, a blocked add). The node holding the conv's
        whole result keeps the conv's name: per-node values (Executor keep=True, accel bisect) find
        it under that name."""
        biased = len(ins) > 2
        keys = ("strides", "pads", "dilations") + (("groups",) if op == "conv2d_NCHWc" else ())
        y = out(emit(Node(op, [x, w], {k: old.attrs[k] for k in keys},
                          name=f"{old.name}/conv" if biased else old.name, origin=old.origin,
                          target=old.target)), b)
        if biased:
            c = const(_blocked_const(np.asarray(ins[2].value).reshape(1, -1, 1, 1), b), f"{ins[2].name}/{b}c")
            y = out(emit(Node("add", [y, c], name=old.name, origin=old.origin, target=old.target)), b)
        return y

    def convert(old: Node, ins: list[Node]) -> Node | None:
        """The blocked form of `old` over its mapped inputs, or None (old runs in NCHW)."""
        blks = [block[id(i)] for i in ins if id(i) in block]
        cb = blocked_conv(old)
        if cb is not None:
            x = ins[0]
            if not reaches[id(old)] and (id(x) not in block or prefer.get(id(old), cb[1]) < lanes("float32")):
                return None   # its NCHW kernel writes NCHW from registers (1x1: the pointwise kernel)
            if id(x) in block and old.inputs[1].shape[1] % block[id(x)] == 0:   # whole blocks in each group
                ic = block[id(x)]
            else:
                ic = cb[0]
                x = blocked(x, ic)
            oc = prefer.get(id(old), cb[1])
            w = const(pack_kernel_np(np.asarray(ins[1].value), ic, oc), f"{ins[1].name}/oihw{ic}i{oc}o")
            stats["convs"] += 1
            return conv_node("conv2d_NCHWc", old, ins, x, w, oc)
        if blocked_depthwise(old):
            return depthwise(old, ins)
        if old.op == "global_avg_pool" and blks and old.inputs[0].type.rank == 4 and old.dtype in FLOATS:
            # a mean over the blocked planes (lanes kept): an NCHW reader then unpacks C values,
            # not the whole tensor
            return out(emit(Node("reduce_mean", [ins[0]], {"axes": (2, 3), "keepdims": 1}, name=old.name,
                                 origin=old.origin, target=old.target)), blks[0])
        if not blks or not _flexible(old):
            return None
        # the block of a full-size blocked input (a per-channel operand follows it, re-blocked if need be)
        b = next((block[id(i)] for i, o in zip(ins, old.inputs) if id(i) in block and o.shape == old.shape),
                 blks[0])
        if old.op in UNARY or old.op in POOLS:
            return out(emit(old.with_inputs([ins[0]])), b)
        if old.op == "concat":
            b = min(blks)   # inputs of another blocking (or NCHW) are converted to the smallest block
            if any(i.is_const or o.shape[1] % b for i, o in zip(ins, old.inputs)):
                return None
            if any(block.get(id(i)) != b for i in ins) and not reaches[id(old)]:
                return None   # converting inputs only pays if a blocked conv reads the result
            return out(emit(old.with_inputs([blocked(i, b) for i in ins], attrs={**old.attrs, "axis": 1})), b)
        C = old.shape[1]
        if old.op == "batch_norm":
            s, bias, mean, var = (np.asarray(i.value, dtype=np.float64) for i in ins[1:])
            inv = s / np.sqrt(var + old.attrs["epsilon"])
            dt = old.dtype
            a = const(_blocked_const((inv).reshape(1, C, 1, 1).astype(dt), b), f"{old.name}/scale{b}c")
            c = const(_blocked_const((bias - mean * inv).reshape(1, C, 1, 1).astype(dt), b), f"{old.name}/shift{b}c")
            y = out(emit(Node("mul", [ins[0], a], name=f"{old.name}/mul", origin=old.origin, target=old.target)), b)
            return out(emit(Node("add", [y, c], name=old.name, origin=old.origin, target=old.target)), b)
        # binary
        new_ins = []
        for i, o in zip(ins, old.inputs):
            if i.is_const:
                v4 = _channel_const(i, C)
                if v4 is None:
                    return None
                new_ins.append(const(_blocked_const(v4, b), f"{i.name}/{b}c"))
            elif _per_channel(o, old):
                new_ins.append(None)   # C values: packed (or re-blocked) to b below
            elif id(i) in block:
                if block[id(i)] != b:
                    return None
                new_ins.append(i)
            elif reaches[id(old)] and o.shape[1] % b == 0:
                new_ins.append(None)   # an NCHW tensor packed to b below
            else:
                return None
        new_ins = [blocked(i, b) if n is None else n for i, n in zip(ins, new_ins)]
        return out(emit(old.with_inputs(new_ins)), b)

    for old in graph.nodes:
        if old.op in ("input", "const"):
            mapping[id(old)] = emit(old)
            continue
        ins = [mapping[id(i)] for i in old.inputs]
        y = convert(old, ins) if old.target in (None, "cpu") else None
        if y is None:
            ins = [nchw(i) for i in ins]
            y = old if all(a is b for a, b in zip(ins, old.inputs)) else old.with_inputs(ins)
            y = emit(y)
        mapping[id(old)] = y
    outputs = [nchw(mapping[id(o)]) for o in graph.outputs]
    g = eliminate_dead_code(Graph(nodes, [mapping[id(i)] for i in graph.inputs], outputs, graph.output_names,
                                  graph.name, graph.meta))
    counts = g.op_counts()
    # blocked: the tensors held as N C' H W c, by name (a per-node view such as flows.bisect
    # reads them back as NCHW: c' * c is exactly the channel count, blocks never pad)
    g.meta["nchwc"] = {**stats, "layout_transforms": counts.get("layout_transform", 0),
                       "blocked": sorted(n.name for n in g.nodes if id(n) in block)}
    return g


def is_unpack(n: Node) -> bool:
    """A layout_transform back to NCHW (fuse_ops lets it join its producer's kernel, whose tile
    is then written straight to NCHW)."""
    return n.op == "layout_transform" and n.attrs.get("dst_layout") == "NCHW"


__all__ = ["nchwc_layout", "blocked_conv", "is_unpack"]
