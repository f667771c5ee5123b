"""Graph IR, op registry, reference interpreter and graph passes (see passes.PIPELINE)."""
from .errors import GraphError, GraphPassError, OpError, QuantizeError
from .interpret import run
from .ir import Graph, Node, TensorType, format_graph, rewrite, structural_equal, topo_order
from .ops import REGISTRY, Pattern, get_op

__all__ = ["Graph", "Node", "TensorType", "format_graph", "rewrite", "structural_equal", "topo_order", "run",
           "REGISTRY", "Pattern", "get_op", "GraphError", "GraphPassError", "OpError", "QuantizeError"]
