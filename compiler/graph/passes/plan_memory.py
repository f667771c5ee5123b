"""PlanMemory: static activation buffers with reuse. Liveness over the topological order (a tensor
lives from its producer to its last consumer; graph outputs to the end); each op's output takes the
smallest free buffer that fits, else the largest free one grown to fit, else a new one. Inputs are
the caller's and never reused; constants (weights) are not activations. Reports the planned total
and the peak of live bytes against the naive sum of all activations.

Concat by address planning: a concat of the accelerator's packed tensors along channel blocks
(N C' H W n c with one batch block, so each input is one contiguous slice of the result) gets no
buffer copy: each input is placed at its byte offset inside the concat's buffer, its producer
writes there, and the concat is elided (MemoryPlan.elided: the builder emits no step for it).
The shared buffer lives from the first producer of any of its slices to the last reader."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Graph, Node


@dataclass
class MemoryPlan:
    buffers: list[int] = field(default_factory=list)  # buffer id -> bytes
    assignment: dict[int, int] = field(default_factory=dict)  # index in graph.nodes -> buffer id
    naive_bytes: int = 0  # every activation in its own buffer
    planned_bytes: int = 0  # sum of the planned buffers
    peak_live_bytes: int = 0  # max over steps of the bytes of live tensors (a lower bound)
    constant_bytes: int = 0
    offsets: dict[int, int] = field(default_factory=dict)  # index in graph.nodes -> byte offset in its buffer
    elided: set[str] = field(default_factory=set)  # concats whose inputs are written in place (no step)

    def summary(self) -> str:
        saved = 1 - self.planned_bytes / self.naive_bytes if self.naive_bytes else 0.0
        return (f"activations: planned {self.planned_bytes} B in {len(self.buffers)} buffers vs naive "
                f"{self.naive_bytes} B ({saved:.0%} saved); peak live {self.peak_live_bytes} B; "
                f"weights {self.constant_bytes} B")


def _in_place_concats(graph: Graph) -> dict[int, tuple[Node, int]]:
    """id(input) -> (the concat it is written into, byte offset) for every packed channel concat
    whose inputs can all be placed inside its buffer: each input an op result (not a graph input
    or constant), used once by this concat and by no other elided concat."""
    taken: dict[int, tuple[Node, int]] = {}
    for n in graph.nodes:
        if n.op != "concat" or n.attrs["axis"] != 1 or len(n.shape) != 6 or n.shape[0] != 1:
            continue
        ins = n.inputs
        if len({id(i) for i in ins}) != len(ins) or any(i.op in ("input", "const") or id(i) in taken for i in ins):
            continue
        if any(len(i.shape) != 6 or i.dtype != n.dtype or tuple(i.shape[2:]) != tuple(n.shape[2:]) for i in ins):
            continue
        off = 0
        for i in ins:
            taken[id(i)] = (n, off)
            off += i.type.nbytes
    return taken


def plan_memory(graph: Graph) -> Graph:
    """Assign activation buffers (graph.meta['memory_plan'] holds the MemoryPlan)."""
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    end = len(graph.nodes)
    last = {}
    for k, n in enumerate(graph.nodes):
        for i in n.inputs:
            last[id(i)] = k
    for o in graph.outputs:
        last[id(o)] = end
    plan = MemoryPlan()
    # in-place concats: each slice's root (the outermost concat) and its offset in the root's buffer
    alias = _in_place_concats(graph)
    root: dict[int, tuple[int, int]] = {}   # index -> (root index, byte offset)
    for k, n in enumerate(graph.nodes):
        r, off, x = n, 0, n
        while id(x) in alias:
            x, o = alias[id(x)]
            r, off = x, off + o
        root[k] = (index[id(r)], off)
    first_def: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for k, n in enumerate(graph.nodes):
        if n.op == "const":
            continue
        r = root[k][0]
        first_def[r] = min(first_def.get(r, k), k)
        last_use[r] = max(last_use.get(r, k), last.get(id(n), k))
    plan.elided = {n.name for n in graph.nodes if any(alias.get(id(i), (None,))[0] is n for i in n.inputs)}
    free: list[int] = []
    live = 0
    for k, n in enumerate(graph.nodes):
        if n.op == "const":
            plan.constant_bytes += n.type.nbytes
            continue
        r, off = root[k]
        plan.naive_bytes += n.type.nbytes
        if r != k:   # a slice of a concat's buffer, allocated with the concat
            if first_def[r] == k:
                plan.assignment[r] = _take(plan, free, graph.nodes[r].type.nbytes)
                live += graph.nodes[r].type.nbytes
            plan.assignment[k] = plan.assignment[r]
            if off:
                plan.offsets[k] = off
        elif n.op == "input":
            plan.assignment[k] = len(plan.buffers)
            plan.buffers.append(n.type.nbytes)
            live += n.type.nbytes
        elif first_def[k] == k:
            plan.assignment[k] = _take(plan, free, n.type.nbytes)
            live += n.type.nbytes
        plan.peak_live_bytes = max(plan.peak_live_bytes, live)
        done = {root[index[id(t)]][0] for t in list(n.inputs) + [n] if t.op != "const"}
        for r2 in done:
            if last_use[r2] == k and graph.nodes[r2].op != "input":
                live -= graph.nodes[r2].type.nbytes
                free.append(plan.assignment[r2])
            elif last_use[r2] == k:
                live -= graph.nodes[r2].type.nbytes
    plan.planned_bytes = sum(plan.buffers)
    return graph.replace(meta={**graph.meta, "memory_plan": plan})


def _take(plan: MemoryPlan, free: list[int], size: int) -> int:
    """The smallest free buffer that fits, else the largest free one grown to fit, else a new one."""
    fits = [b for b in free if plan.buffers[b] >= size]
    if fits:
        buf = min(fits, key=lambda b: plan.buffers[b])
    elif free:
        buf = max(free, key=lambda b: plan.buffers[b])
        plan.buffers[buf] = size
    else:
        buf = len(plan.buffers)
        plan.buffers.append(size)
    if buf in free:
        free.remove(buf)
    return buf
