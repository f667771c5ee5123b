"""The graph IR: one Node type for every op (inputs, constants, operators, fused groups) and a Graph.

A Node produces exactly one tensor; its `type` (shape, dtype) is inferred from the op registry
when the node is built, so a graph is always typed. A Graph holds its nodes in topological order
(inputs and constants included), its input nodes, and named outputs. Passes never mutate nodes
in place: they build new ones (`Node.with_inputs`, `rewrite`). `format_graph` prints the text
form, which is also the structural-equality key of the Before/Expected tests.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from .errors import GraphError

#: dtypes a graph tensor can have (names as numpy spells them).
DTYPES = ("float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")
#: the largest one graph tensor may be (the DRAM a build reserves, compiler.graph_build): checked
#: when a type is made, before any pass or constant folding allocates it (docs/limits.md)
MAX_TENSOR_BYTES = 1 << 30


@dataclass(frozen=True)
class TensorType:
    """Static shape and dtype of one tensor."""
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if self.dtype not in DTYPES:
            raise GraphError(f"unknown dtype {self.dtype!r}; graph dtypes are {', '.join(DTYPES)}")
        if any(d < 0 for d in self.shape):
            raise GraphError(f"negative dimension in shape {list(self.shape)}")
        nbytes = math.prod(self.shape) * np.dtype(self.dtype).itemsize
        if nbytes > MAX_TENSOR_BYTES:
            raise GraphError(f"tensor {self} holds {nbytes} bytes, above the limit of {MAX_TENSOR_BYTES} bytes "
                             f"for one tensor")

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self):
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


class Node:
    """One tensor-producing operation. `op` is a key of `ops.REGISTRY` ("input", "const",
    "conv2d", "fused", ...); `attrs` follow that op's schema; `target` is set by partitioning
    ("accel" or "cpu", None before); `origin` is the ONNX op type the node came from, if any."""

    __slots__ = ("op", "name", "inputs", "attrs", "type", "target", "origin")

    def __init__(self, op: str, inputs: Iterable["Node"] = (), attrs: dict | None = None, *,
                 name: str = "", type: TensorType | None = None, target: str | None = None,
                 origin: str | None = None):
        from .ops import get_op  # noqa: PLC0415 - import cycle: ops imports ir
        opdef = get_op(op)
        self.op = op
        self.name = name
        self.inputs = tuple(inputs)
        for i in self.inputs:
            if not isinstance(i, Node):
                raise GraphError(f"{op} '{name}': inputs must be Nodes, got {type_name(i)}")
        self.attrs = opdef.check_attrs(self, dict(attrs or {}))
        self.target = target
        self.origin = origin
        self.type = type if type is not None else opdef.infer(self)

    # ---- constructors of the leaf nodes ------------------------------------------------------
    @staticmethod
    def input(name: str, shape, dtype: str = "float32") -> "Node":
        return Node("input", (), {}, name=name, type=TensorType(tuple(shape), dtype))

    @staticmethod
    def const(value, name: str = "", dtype: str | None = None) -> "Node":
        arr = np.asarray(value, dtype=dtype)
        if arr.dtype == np.float64 and dtype is None:
            arr = arr.astype(np.float32)
        if not arr.flags.c_contiguous:   # (np.ascontiguousarray would make a scalar 1-d)
            arr = np.ascontiguousarray(arr)
        arr.setflags(write=False)
        return Node("const", (), {"value": arr}, name=name)

    # ---- derived views ------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def value(self) -> np.ndarray:
        """The array of a const node."""
        if self.op != "const":
            raise GraphError(f"{self.op} '{self.name}' is not a constant")
        return self.attrs["value"]

    def with_inputs(self, inputs: Iterable["Node"], **changes) -> "Node":
        """A copy with other inputs (and optionally other op/attrs/name/target); type re-inferred."""
        kw = dict(op=self.op, attrs=self.attrs, name=self.name, target=self.target, origin=self.origin)
        kw.update(changes)
        op = kw.pop("op")
        keep_type = self.type if op in ("input",) else None
        return Node(op, tuple(inputs), kw.pop("attrs"), type=keep_type, **kw)

    def __repr__(self):
        return f"<Node {self.op} '{self.name}' {self.type}>"


def type_name(x) -> str:
    return type(x).__name__


class Graph:
    """A typed dataflow graph: `nodes` in topological order, `inputs` (op "input"), and
    `outputs` with their names. `meta` carries pass reports (calibration, partition, memory plan)."""

    def __init__(self, nodes: Iterable[Node], inputs: Iterable[Node], outputs: Iterable[Node],
                 output_names: Iterable[str] | None = None, name: str = "graph", meta: dict | None = None):
        self.nodes = list(nodes)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.output_names = list(output_names) if output_names is not None else [o.name for o in self.outputs]
        self.name = name
        self.meta = dict(meta or {})
        self.validate()

    @staticmethod
    def from_outputs(inputs: Iterable[Node], outputs: Iterable[Node], output_names=None,
                     name: str = "graph", meta: dict | None = None) -> "Graph":
        """A graph of exactly the nodes the outputs depend on (in depth-first topological order)."""
        inputs, outputs = list(inputs), list(outputs)
        return Graph(topo_order(outputs, inputs), inputs, outputs, output_names, name, meta)

    def validate(self) -> None:
        seen: set[int] = set()
        for n in self.nodes:
            for i in n.inputs:
                if id(i) not in seen:
                    raise GraphError(f"graph '{self.name}': {n.op} '{n.name}' uses '{i.name}' ({i.op}) "
                                     f"before it is defined (nodes are not in topological order)")
            seen.add(id(n))
        for n in self.inputs:
            if n.op != "input":
                raise GraphError(f"graph '{self.name}': input '{n.name}' is a {n.op} node, not an input")
            if id(n) not in seen:
                raise GraphError(f"graph '{self.name}': input '{n.name}' is missing from the node list")
        for n in self.outputs:
            if id(n) not in seen:
                raise GraphError(f"graph '{self.name}': output '{n.name}' is missing from the node list")
        for n in self.nodes:
            if n.op == "input" and not any(n is i for i in self.inputs):
                raise GraphError(f"graph '{self.name}': input node '{n.name}' is not a graph input")
        if len(self.output_names) != len(self.outputs):
            raise GraphError(f"graph '{self.name}': {len(self.outputs)} outputs but "
                             f"{len(self.output_names)} output names")

    # ---- queries ----------------------------------------------------------------------------
    @property
    def constants(self) -> list[Node]:
        return [n for n in self.nodes if n.op == "const"]

    @property
    def ops(self) -> list[Node]:
        """The operator nodes (neither input nor const), in topological order."""
        return [n for n in self.nodes if n.op not in ("input", "const")]

    def users(self) -> dict[int, list[Node]]:
        """id(node) -> the nodes that consume it (a node consuming twice is listed twice)."""
        out: dict[int, list[Node]] = {id(n): [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                out[id(i)].append(n)
        return out

    def find(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise GraphError(f"graph '{self.name}' has no node named {name!r}")

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.ops:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def replace(self, nodes=None, inputs=None, outputs=None, meta=None) -> "Graph":
        return Graph(self.nodes if nodes is None else nodes, self.inputs if inputs is None else inputs,
                     self.outputs if outputs is None else outputs, self.output_names, self.name,
                     self.meta if meta is None else meta)

    def __str__(self):
        return format_graph(self)

    def __repr__(self):
        return f"<Graph '{self.name}': {len(self.ops)} ops, {len(self.inputs)} inputs, {len(self.outputs)} outputs>"


def topo_order(outputs: Iterable[Node], inputs: Iterable[Node] = ()) -> list[Node]:
    """Depth-first post-order of everything the outputs depend on, graph inputs first."""
    order: list[Node] = list(inputs)
    seen = {id(n) for n in order}
    for root in outputs:
        stack = [(root, False)]
        while stack:
            n, done = stack.pop()
            if done:
                if id(n) not in seen:
                    seen.add(id(n))
                    order.append(n)
                continue
            if id(n) in seen:
                continue
            stack.append((n, True))
            for i in reversed(n.inputs):
                if id(i) not in seen:
                    stack.append((i, False))
    return order


def rewrite(graph: Graph, fn: Callable[[Node, Node], Node | None], meta: dict | None = None) -> Graph:
    """Rebuild `graph` node by node in order. Each node first gets its already-rewritten inputs,
    then fn(node, old) returns its replacement (None keeps it); `old` is the node of the input
    graph (for queries such as its users). Replacements may be new subgraphs; their new
    ancestors are added before them. Unused nodes stay (dead-code elimination is its own pass)."""
    mapping: dict[int, Node] = {}
    nodes: list[Node] = []
    placed: set[int] = set()

    def place(root: Node):
        stack = [(root, False)]
        while stack:
            m, done = stack.pop()
            if id(m) in placed:
                continue
            if not done:
                stack.append((m, True))
                stack.extend((i, False) for i in reversed(m.inputs) if id(i) not in placed)
                continue
            if m.op == "input" and not any(m is i for i in new_inputs):
                raise GraphError(f"rewrite of '{graph.name}': replacement uses an unknown input '{m.name}'")
            placed.add(id(m))
            nodes.append(m)

    new_inputs = list(graph.inputs)
    for n in graph.nodes:
        if n.inputs:
            new_in = tuple(mapping[id(i)] for i in n.inputs)
            cur = n if all(a is b for a, b in zip(new_in, n.inputs)) else n.with_inputs(new_in)
        else:
            cur = n
        r = fn(cur, n)
        r = cur if r is None else r
        mapping[id(n)] = r
        place(r)
    outputs = [mapping[id(o)] for o in graph.outputs]
    return Graph(nodes, new_inputs, outputs, graph.output_names, graph.name, {**graph.meta, **(meta or {})})


# ---- text form ---------------------------------------------------------------------------------
def format_attr(v) -> str:
    """An attribute value in one short line: arrays over four elements by dtype, shape and digest."""
    if isinstance(v, np.ndarray):
        if v.size <= 4:
            return f"{v.dtype}{np.array2string(v.reshape(-1), separator=',')}"
        return f"{v.dtype}[{','.join(map(str, v.shape))}]#{hashlib.sha1(v.tobytes()).hexdigest()[:8]}"
    if isinstance(v, Graph):
        return f"<graph {v.name}>"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (tuple, list)):
        return "[" + ",".join(format_attr(x) for x in v) + "]"
    return repr(v) if isinstance(v, str) else str(v)


def format_graph(graph: Graph, canonical: bool = False, indent: str = "") -> str:
    """Readable text of a graph. canonical=True numbers the values (%0, %1, ...) instead of
    using node names, so two graphs print the same iff they are structurally equal."""
    names: dict[int, str] = {}
    used: set[str] = set()
    for k, n in enumerate(graph.nodes):
        if canonical:
            nm = f"%{k}"
        else:
            base = n.name or f"{n.op}{k}"
            nm, j = f"%{base}", 1
            while nm in used:
                nm, j = f"%{base}.{j}", j + 1
        used.add(nm)
        names[id(n)] = nm
    head = ", ".join(f"{names[id(i)]}: {i.type}" for i in graph.inputs)
    lines = [f"{indent}graph {'' if canonical else graph.name}({head}) {{"]
    for n in graph.nodes:
        if n.op == "input":
            continue
        if n.op == "const":
            v = n.value
            shown = f"{format_attr(v)}" if v.size <= 4 else f"#{hashlib.sha1(v.tobytes()).hexdigest()[:8]}"
            lines.append(f"{indent}  {names[id(n)]} = const {shown} : {n.type}")
            continue
        args = ", ".join(names[id(i)] for i in n.inputs)
        attrs = {k: v for k, v in n.attrs.items() if k != "body"}
        astr = (" {" + ", ".join(f"{k}={format_attr(v)}" for k, v in sorted(attrs.items())) + "}") if attrs else ""
        tgt = f" @{n.target}" if n.target else ""
        lines.append(f"{indent}  {names[id(n)]} = {n.op}({args}){astr} : {n.type}{tgt}")
        if "body" in n.attrs:
            lines.append(format_graph(n.attrs["body"], canonical, indent + "    "))
    outs = ", ".join(names[id(o)] if canonical else f"{names[id(o)]} as {nm!r}"
                     for o, nm in zip(graph.outputs, graph.output_names))
    lines.append(f"{indent}  return {outs}")
    lines.append(f"{indent}}}")
    return "\n".join(lines)


def structural_equal(a: Graph, b: Graph) -> bool:
    """Same ops, attrs, types, constants and wiring (names ignored)."""
    def canon(g: Graph) -> str:
        return format_graph(Graph.from_outputs(g.inputs, g.outputs, g.output_names, g.name), canonical=True)
    return canon(a) == canon(b)
