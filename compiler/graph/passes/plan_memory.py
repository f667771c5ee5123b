"""PlanMemory: static activation buffers with reuse. Liveness over the topological order (a tensor
lives from its producer to its last consumer; graph outputs to the end); each op's output takes the
smallest free buffer that fits, else the largest free one grown to fit, else a new one. Inputs are
the caller's and never reused; constants (weights) are not activations. Reports the planned total
and the peak of live bytes against the naive sum of all activations."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import Graph


@dataclass
class MemoryPlan:
    buffers: list[int] = field(default_factory=list)  # buffer id -> bytes
    assignment: dict[int, int] = field(default_factory=dict)  # index in graph.nodes -> buffer id
    naive_bytes: int = 0  # every activation in its own buffer
    planned_bytes: int = 0  # sum of the planned buffers
    peak_live_bytes: int = 0  # max over steps of the bytes of live tensors (a lower bound)
    constant_bytes: int = 0

    def summary(self) -> str:
        saved = 1 - self.planned_bytes / self.naive_bytes if self.naive_bytes else 0.0
        return (f"activations: planned {self.planned_bytes} B in {len(self.buffers)} buffers vs naive "
                f"{self.naive_bytes} B ({saved:.0%} saved); peak live {self.peak_live_bytes} B; "
                f"weights {self.constant_bytes} B")


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
    free: list[int] = []
    live = 0
    for k, n in enumerate(graph.nodes):
        if n.op == "const":
            plan.constant_bytes += n.type.nbytes
            continue
        size = n.type.nbytes
        plan.naive_bytes += size
        if n.op == "input":
            buf = len(plan.buffers)
            plan.buffers.append(size)
        else:
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
        plan.assignment[k] = buf
        live += size
        plan.peak_live_bytes = max(plan.peak_live_bytes, live)
        if id(n) not in last:  # dead value: released at once
            last[id(n)] = k
        for t in {id(i): i for i in list(n.inputs) + [n]}.values():
            if t.op != "const" and last.get(id(t)) == k:
                live -= t.type.nbytes
                if t.op != "input":
                    free.append(plan.assignment[index[id(t)]])
    plan.planned_bytes = sum(plan.buffers)
    return graph.replace(meta={**graph.meta, "memory_plan": plan})
