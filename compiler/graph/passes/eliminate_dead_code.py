"""EliminateDeadCode: drop nodes no output depends on (unused branches, folded-away constants)."""
from __future__ import annotations

from ..ir import Graph, topo_order


def eliminate_dead_code(graph: Graph) -> Graph:
    """Keep only the inputs and what the outputs depend on, in the original order."""
    live = {id(n) for n in topo_order(graph.outputs, graph.inputs)}
    return graph.replace(nodes=[n for n in graph.nodes if id(n) in live])
