"""InferTypes: re-derive every node's type from its inputs (optionally with new input shapes)."""
from __future__ import annotations

from ..errors import GraphError
from ..ir import Graph, Node


def infer_types(graph: Graph, input_shapes: dict | None = None) -> Graph:
    """Re-infer all types; raises OpError naming the first node whose inputs do not fit."""
    input_shapes = input_shapes or {}
    unknown = sorted(set(input_shapes) - {i.name for i in graph.inputs})
    if unknown:
        raise GraphError(f"infer_types: no graph input named {', '.join(unknown)}; inputs are "
                         f"{', '.join(i.name for i in graph.inputs)}")
    mapping: dict[int, Node] = {}
    nodes = []
    for n in graph.nodes:
        if n.op == "input":
            m = Node.input(n.name, input_shapes.get(n.name, n.shape), n.dtype)
        elif n.op == "const":
            m = n
        else:
            m = n.with_inputs([mapping[id(i)] for i in n.inputs])
        mapping[id(n)] = m
        nodes.append(m)
    return Graph(nodes, [mapping[id(i)] for i in graph.inputs], [mapping[id(o)] for o in graph.outputs],
                 graph.output_names, graph.name, graph.meta)
