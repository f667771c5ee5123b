"""Exceptions of the graph IR and its passes; each message names the node (and op) at fault."""
from ..errors import CompilerError


class GraphError(CompilerError):
    """The graph is malformed (an input that is not defined earlier, a duplicate name)."""


class OpError(GraphError, ValueError):
    """An op cannot be applied to its inputs (unknown op, bad attribute, incompatible shapes/dtypes)."""


class GraphPassError(GraphError):
    """A graph pass met a graph it cannot transform; names the pass and the node."""


class QuantizeError(GraphPassError):
    """Quantization lacks a scale for a tensor, or a shift does not fit the accelerator's ALU."""
