"""PackLayout: put accelerator ops in the accelerator's blocked layouts. Activations are N C H W n c
(blocks BATCH x BLOCK_IN for GEMM inputs, BATCH x BLOCK_OUT for GEMM outputs and ALU ops), weights
O I H W o i (BLOCK_OUT x BLOCK_IN), channels zero-padded to whole blocks; biases padded to match.
A pack is inserted before each accelerator op's activation input and an unpack after its output;
an unpack feeding a pack of the same blocking cancels, so adjacent accelerator layers exchange
packed tensors directly. Weight packing is done here on the constants (no runtime op); a grouped
conv's weights are first merged onto whole blocks (compiler.accel.grouped: the node keeps the
merged group count, so its reference stays exact). A channel concat of packed accelerator outputs
stays packed, so that plan_memory can place its inputs inside its buffer (no copy).
"""
from __future__ import annotations

import numpy as np

from accel.isa.config import AccelConfig

from ...accel.grouped import expand_grouped_weight, grouped_layout
from ..ir import Graph, Node
from ..ops import pack_ref, packed_shape
from .eliminate_dead_code import eliminate_dead_code
from .partition import ACCEL, CPU

PACKED_LAYOUT = {"qconv2d": "NCHWnc", "qdense": "NCnc"}


def pack_layout(graph: Graph, cfg: AccelConfig) -> Graph:
    """Blocked layouts for accelerator ops; pack/unpack at boundaries, cancelled between layers."""
    mapping: dict[int, Node] = {}
    packed_of: dict[int, Node] = {}  # id(unpack node) -> the packed tensor it unpacks
    nodes: list[Node] = []
    pack_cache: dict[tuple, Node] = {}
    stats = {"cancelled": 0}

    def emit(n: Node) -> Node:
        nodes.append(n)
        return n

    def packed(x: Node, block) -> Node:
        src = packed_of.get(id(x))
        if src is not None and tuple(src.shape[-2:]) == tuple(block):
            stats["cancelled"] += 1
            return src
        key = (id(x), tuple(block))
        if key not in pack_cache:
            # a tensor read in two blockings (a conv's input and an ALU op's) is packed twice: the
            # second gets its blocking in its name, as kept values and memory plans go by name
            twice = any(k[0] == id(x) for k in pack_cache)
            name = f"{x.name}/pack{block[0]}x{block[1]}" if twice else f"{x.name}/pack"
            pack_cache[key] = emit(Node("pack", [x], {"block": tuple(block)}, name=name, target=CPU))
        return pack_cache[key]

    def unpacked(y: Node, shape) -> Node:
        u = emit(Node("unpack", [y], {"shape": tuple(shape)}, name=f"{y.name}/unpack", target=CPU))
        packed_of[id(u)] = y
        return u

    def const(value: np.ndarray, name: str) -> Node:
        return emit(Node.const(value, name=name))

    def packed_concat(old: Node, ins: list) -> Node | None:
        """A channel concat of accelerator outputs, kept packed (each input whole blocks of one
        blocking, one batch block): plan_memory then places the inputs inside its buffer. An input
        the CPU computes (a stem's pooling) is packed into its slice, once, instead of the whole
        concat being copied on the CPU and packed again for its accelerator readers."""
        srcs = [packed_of.get(id(i)) for i in ins]
        if old.op != "concat" or old.attrs["axis"] != 1 or len(old.shape) != 4 or all(s is None for s in srcs) \
                or any(i.is_const for i in ins):
            return None
        blk = tuple(next(s for s in srcs if s is not None).shape[-2:])
        if any((s is not None and tuple(s.shape[-2:]) != blk) or i.shape[1] % blk[1] for s, i in zip(srcs, old.inputs)) \
                or old.shape[0] > blk[0]:
            return None
        srcs = [s if s is not None else packed(i, blk) for s, i in zip(srcs, ins)]
        y = emit(Node("concat", srcs, dict(old.attrs), name=old.name, origin=old.origin, target=CPU))
        return unpacked(y, old.shape)

    for old in graph.nodes:
        ins = [mapping[id(i)] for i in old.inputs]
        if old.target != ACCEL:
            u = packed_concat(old, ins)
            if u is not None:
                mapping[id(old)] = u
                continue
            n = old if all(a is b for a, b in zip(ins, old.inputs)) else old.with_inputs(ins)
            mapping[id(old)] = emit(n)
            continue
        if old.op in PACKED_LAYOUT:
            x, w, b, *muls = ins
            blk_x, blk_w = (cfg.batch, cfg.block_in), (cfg.block_out, cfg.block_in)
            xp = packed(x, blk_x)
            attrs = {**old.attrs, "layout": PACKED_LAYOUT[old.op]}
            wv = w.value
            if old.attrs.get("groups", 1) > 1:  # groups merged onto whole blocks (compiler.accel.grouped)
                g = old.attrs["groups"]
                k = grouped_layout(g, x.shape[1], old.shape[1], cfg.block_in, cfg.block_out)[0]
                wv, attrs["groups"] = expand_grouped_weight(wv, g, k), -(-g // k)
            wp = const(pack_ref(wv, blk_w), f"{w.name}/packed")
            o_pad = packed_shape(w.shape, blk_w)[0] * cfg.block_out
            bp = const(np.pad(b.value, (0, o_pad - b.shape[0])), f"{b.name}/packed")
            # per-channel multipliers (if any) cover the padding channels too (any positive value)
            mp = [const(np.pad(m.value, (0, o_pad - m.shape[0]), constant_values=1), f"{m.name}/packed")
                  for m in muls]
            y = emit(old.with_inputs([xp, wp, bp, *mp], attrs=attrs))
        else:  # ALU elementwise: work on whatever blocking the (first packed) producer has
            blocks = [tuple(packed_of[id(i)].shape[-2:]) for i in ins if id(i) in packed_of]
            blk = blocks[0] if blocks else (cfg.batch, cfg.block_out)
            y = emit(old.with_inputs([i if i.is_const else packed(i, blk) for i in ins]))
        mapping[id(old)] = unpacked(y, old.shape)
    outputs = [mapping[id(o)] for o in graph.outputs]
    g = eliminate_dead_code(Graph(nodes, [mapping[id(i)] for i in graph.inputs], outputs, graph.output_names,
                                  graph.name, graph.meta))
    counts = g.op_counts()
    g.meta["layout"] = {"packs": counts.get("pack", 0), "unpacks": counts.get("unpack", 0),
                        "cancelled": stats["cancelled"], "block": (cfg.batch, cfg.block_in, cfg.block_out)}
    return g
