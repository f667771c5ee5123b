"""Graph IR, op registry, reference interpreter and graph passes (see passes.PIPELINE).

    from compiler.frontend import from_onnx
    from compiler.graph import run
    from compiler.graph.passes import optimize
    g = from_onnx("model.onnx")                      # typed Graph of Nodes
    q = optimize(g, quantize=True, calibration_samples=feeds[:8], accel="default")
    y = run(q, feeds[0])[0]                          # NumPy reference of the compiled graph
    print(q)                                         # text form; q.meta holds the pass reports
"""
from .errors import GraphError, GraphPassError, OpError, QuantizeError
from .interpret import run
from .ir import Graph, Node, TensorType, format_graph, rewrite, structural_equal, topo_order
from .ops import REGISTRY, Pattern, get_op

__all__ = ["Graph", "Node", "TensorType", "format_graph", "rewrite", "structural_equal", "topo_order", "run",
           "REGISTRY", "Pattern", "get_op", "GraphError", "GraphPassError", "OpError", "QuantizeError"]
