"""FuseOps: group ops into fused kernels by TVM's rules on op patterns. A conv/dense/pool
(OUT_ELEMWISE_FUSABLE) absorbs the elementwise and broadcast ops after it (bias, relu, residual
add, requantize); chains of injective/elementwise ops fuse together; injective ops fuse into the
reduction they feed. A producer fuses when the consumer is its single user, or when its other
users head elementwise groups feeding only that consumer (a diamond such as SiLU, x * sigmoid(x),
or HardSwish: the cases of TVM's post-dominator rule the kit needs); the elementwise groups that
end at a node's other inputs join it too when it is their only user (a tree such as an LSTM
cell's f * C + i * tanh(c)); only within one target, and a group has at most one
conv/dense/pool/reduce. Each group of two or more ops becomes one `fused`
node whose body is a graph; constants stay outside as its inputs (weights live in their own
buffers)."""
from __future__ import annotations

from ..ir import Graph, Node
from ..ops import Pattern, get_op
from .nchwc_layout import is_unpack

#: a concat of more inputs than this ends its kernel before a consumer that changes its shape (a
#: reshape, a transpose): the cpu schedule splits the concat axis at the input boundaries only when
#: the kernel writes the concat's own shape (compiler.ops.cpu.schedule_concat); past a transpose
#: every element would pick its input through a tree of selects, whose arms the codegen loads
#: eagerly (an LSTM's 64 step outputs: 128 us a kernel, against 2 us copied)
CONCAT_FUSE_INPUTS = 4


def _closed(g: list, n: Node) -> bool:
    """Whether group g ends in a concat of many inputs whose shape consumer n would change."""
    last = g[-1]
    return last.op == "concat" and len(last.inputs) > CONCAT_FUSE_INPUTS and tuple(n.shape) != tuple(last.shape)


def _fusable(group_pattern: Pattern, consumer: Pattern) -> bool:
    if group_pattern == Pattern.OUT_ELEMWISE_FUSABLE:
        return consumer <= Pattern.BROADCAST
    if group_pattern <= Pattern.INJECTIVE:
        return consumer <= Pattern.INJECTIVE or consumer == Pattern.COMM_REDUCE
    return False


def _join_diamond(n: Node, p: Pattern, group: dict, pattern: dict, users: dict, outputs: set):
    """The group n joins where its inputs form a diamond over one group's output i: i's other
    users each head a group of elementwise ops over i (and constants) whose result only n reads,
    as in SiLU, x * sigmoid(x), and HardSwish, x * clip(x / 6 + 1/2, 0, 1). Those groups and n
    join i's group (TVM fuses to the post-dominator the same way); None when n's inputs form no
    such diamond. Float CPU kernels only: their schedules inline an epilogue that reads the
    anchor's result twice; int8 kernels (requantize, quantize steps) and the accelerator's and
    GPU's lowerings expect chains (an int8 conv with a HardSwish diamond took 150 s to compile)."""
    if n.target not in (None, "cpu") or n.dtype != "float32":
        return None
    for i in n.inputs:
        if id(i) not in group or id(i) in outputs or i.target != n.target or group[id(i)][-1] is not i:
            continue
        if any(m.dtype != "float32" for m in group[id(i)]):
            continue   # an int8 kernel's epilogue (its requantize and dequantize steps) takes chains only
        others = [u for u in users[id(i)] if u is not n]
        if not others or len(users[id(i)]) != len(others) + 1:
            continue
        arms: list[list[Node]] = []
        for u in others:
            arm = group.get(id(u))
            if arm is None or arm[0] is not u or any(arm is a for a in arms):
                break
            members = {id(m) for m in arm}
            tail = users[id(arm[-1])]
            if not (len(tail) == 1 and tail[0] is n and all(
                    get_op(m.op).pattern <= Pattern.BROADCAST and m.target == n.target and id(m) not in outputs
                    and m.dtype == "float32"
                    and all(x is i or x.is_const or id(x) in members for x in m.inputs) for m in arm)):
                break
            arms.append(arm)
        else:
            if not all(x is i or x.is_const or any(x is a[-1] for a in arms) for x in n.inputs):
                continue
            q = max([p] + [pattern[id(a)] for a in arms])
            g = group[id(i)]
            if not _fusable(pattern[id(g)], q) or _closed(g, n):
                continue
            for a in arms:
                for m in a:
                    g.append(m)
                    group[id(m)] = g
            g.append(n)
            pattern[id(g)] = max(pattern[id(g)], q)
            return g
    return None


def _merge_arms(n: Node, p: Pattern, g: list, group: dict, pattern: dict, users: dict, outputs: set) -> None:
    """Before n joins group g (through one input), the groups ending at n's other inputs join too
    where n is their only user and they hold no conv/dense/pool/reduce: a tree of elementwise ops
    (an LSTM cell's f * C + i * tanh(c), a slice feeding a dense's bias add) becomes one kernel,
    not one per branch. Float CPU kernels only, as _join_diamond."""
    if n.target not in (None, "cpu") or n.dtype != "float32" or p > Pattern.BROADCAST:
        return
    for i in n.inputs:
        a = group.get(id(i))
        if (a is None or a is g or a[-1] is not i or len(users[id(i)]) != 1 or id(i) in outputs
                or i.target != n.target or pattern[id(a)] > Pattern.INJECTIVE or _closed(a, n)
                or any(m.dtype != "float32" for m in a)):
            continue
        for m in a:
            g.append(m)
            group[id(m)] = g
        pattern[id(g)] = max(pattern[id(g)], pattern[id(a)])


def fuse_ops(graph: Graph) -> Graph:
    """Fuse ops into `fused` nodes (see module doc); graph.meta['fusion'] lists the groups."""
    users = graph.users()
    outputs = {id(o) for o in graph.outputs}
    group: dict[int, list[Node]] = {}  # id(node) -> its group (a shared list)
    pattern: dict[int, Pattern] = {}  # id(group list) -> group pattern
    for n in graph.ops:
        # an unpack to NCHW joins its producer's kernel (the tile is written to NCHW directly)
        p = Pattern.ELEMWISE if is_unpack(n) else get_op(n.op).pattern
        joined = _join_diamond(n, p, group, pattern, users, outputs)
        for i in n.inputs if joined is None else ():
            if id(i) not in group or len(users[id(i)]) != 1 or id(i) in outputs or i.target != n.target:
                continue
            g = group[id(i)]
            gp = pattern[id(g)]
            if g[-1] is not i or not _fusable(gp, p) or _closed(g, n):
                continue
            joined = g
            _merge_arms(n, p, g, group, pattern, users, outputs)
            g.append(n)
            pattern[id(g)] = max(pattern[id(g)], p)
            break
        if joined is None:
            joined = [n]
            pattern[id(joined)] = p
        group[id(n)] = joined

    mapping: dict[int, Node] = {}
    nodes: list[Node] = []
    fusion = []
    for n in graph.nodes:
        g = group.get(id(n))
        if g is None or len(g) == 1:
            m = n if not n.inputs or all(mapping[id(i)] is i for i in n.inputs) else \
                n.with_inputs([mapping[id(i)] for i in n.inputs])
            mapping[id(n)] = m
            nodes.append(m)
            continue
        if n is not g[-1]:
            continue  # built when its group's output node is reached
        members = {id(m) for m in g}
        ext: list[Node] = []
        for m in g:
            for i in m.inputs:
                if id(i) not in members and not any(i is e for e in ext):
                    ext.append(i)
        params = [Node.input(f"p{k}", e.shape, e.dtype) for k, e in enumerate(ext)]
        inner: dict[int, Node] = {id(e): p for e, p in zip(ext, params)}
        body_nodes = list(params)
        for m in g:
            b = m.with_inputs([inner[id(i)] for i in m.inputs])
            inner[id(m)] = b
            body_nodes.append(b)
        label = "fused_" + "_".join(m.op for m in g)
        body = Graph(body_nodes, params, [inner[id(g[-1])]], [n.name], label)
        f = Node("fused", [mapping[id(e)] for e in ext], {"body": body, "pattern": pattern[id(g)].name},
                 name=n.name, target=n.target, origin=label)
        mapping[id(n)] = f
        nodes.append(f)
        fusion.append({"name": n.name, "ops": [m.op for m in g], "target": n.target, "pattern": pattern[id(g)].name})
    return Graph(nodes, [mapping[id(i)] for i in graph.inputs], [mapping[id(o)] for o in graph.outputs],
                 graph.output_names, graph.name, {**graph.meta, "fusion": fusion})
