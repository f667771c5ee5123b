"""Graph IR: typed node construction, graph validation, the printer, rewrite, the interpreter."""
import numpy as np
import pytest

from compiler.graph import (
    REGISTRY,
    Graph,
    GraphError,
    Node,
    OpError,
    Pattern,
    TensorType,
    format_graph,
    get_op,
    rewrite,
    run,
    structural_equal,
)
from compiler.graph.ops import pack_ref, unpack_ref


def small_graph():
    x = Node.input("x", (1, 4, 6, 6))
    w = Node.const(np.ones((8, 4, 3, 3), np.float32), name="w")
    c = Node("conv2d", [x, w], {"pads": (1, 1, 1, 1)}, name="conv")
    r = Node("relu", [c], name="relu")
    return Graph.from_outputs([x], [r], ["y"], name="small")


def test_ir_node_type_is_inferred_at_construction():
    g = small_graph()
    assert g.find("conv").type == TensorType((1, 8, 6, 6), "float32")
    assert g.outputs[0].shape == (1, 8, 6, 6) and g.outputs[0].dtype == "float32"
    assert TensorType((2, 3), "int8").nbytes == 6


def test_ir_bad_nodes_name_node_and_op():
    x = Node.input("x", (1, 4, 6, 6))
    with pytest.raises(OpError, match=r"conv2d 'c1': input channels 4 != weight in-channels 3"):
        Node("conv2d", [x, Node.const(np.ones((8, 3, 3, 3), np.float32))], name="c1")
    with pytest.raises(OpError, match=r"relu 'r': unknown attribute\(s\) alpha"):
        Node("relu", [x], {"alpha": 1.0}, name="r")
    with pytest.raises(OpError, match=r"reshape 'rs': missing required attribute 'shape'"):
        Node("reshape", [x], name="rs")
    with pytest.raises(OpError, match=r"add 'a': shapes \[\[1, 4, 6, 6\], \[5\]\] do not broadcast"):
        Node("add", [x, Node.const(np.ones(5, np.float32))], name="a")
    xb = Node.input("xb", (1, 4, 6, 6, 16))   # 64 channels in blocks of 16
    with pytest.raises(OpError, match=r"conv2d_NCHWc 'g': .* groups=3 dividing C' and O'"):
        Node("conv2d_NCHWc", [xb, Node.const(np.ones((4, 1, 3, 3, 16, 16), np.float32))], {"groups": 3}, name="g")
    with pytest.raises(OpError, match="unknown operator 'frobnicate'; declared ops are"):
        Node("frobnicate", [x])
    with pytest.raises(GraphError, match="unknown dtype 'float8'"):
        TensorType((1,), "float8")


def test_ir_graph_validation_catches_order_and_foreign_inputs():
    x = Node.input("x", (2, 2))
    a = Node("relu", [x], name="a")
    b = Node("neg", [a], name="b")
    with pytest.raises(GraphError, match="'b' uses 'a'.*before it is defined"):
        Graph([x, b, a], [x], [b])
    other = Node.input("other", (2, 2))
    with pytest.raises(GraphError, match="input node 'other' is not a graph input"):
        Graph([x, other, Node("add", [x, other])], [x], [])


def test_ir_printer_is_readable_and_canonical_form_ignores_names():
    g = small_graph()
    text = str(g)
    assert text.splitlines()[0] == "graph small(%x: float32[1,4,6,6]) {"
    assert "%conv = conv2d(%x, %w) {dilations=[1,1], groups=1, pads=[1,1,1,1], strides=[1,1]} : float32[1,8,6,6]" in text
    assert "return %relu as 'y'" in text
    g2 = rewrite(g, lambda n, old: n.with_inputs(n.inputs, name=n.name + "_renamed") if n.op == "relu" else None)
    assert structural_equal(g, g2) and str(g) != str(g2)
    g3 = rewrite(g, lambda n, old: Node("sigmoid", n.inputs, name=n.name) if n.op == "relu" else None)
    assert not structural_equal(g, g3)
    assert format_graph(g, canonical=True).count("%") == format_graph(g2, canonical=True).count("%")


def test_ir_rewrite_places_new_subgraphs_before_their_users():
    g = small_graph()

    def split_relu(n, old):
        if n.op == "relu":  # relu(x) = max(x, 0) written as clip(min=0)
            return Node("clip", [Node("neg", [Node("neg", n.inputs)])], {"min": 0.0}, name=n.name)
    g2 = rewrite(g, split_relu)
    assert [n.op for n in g2.ops] == ["conv2d", "neg", "neg", "clip"]
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype(np.float32)
    np.testing.assert_array_equal(run(g, [x])[0], run(g2, {"x": x})[0])


def test_ir_interpreter_checks_feeds():
    g = small_graph()
    with pytest.raises(GraphError, match=r"input 'x': expected shape \[1, 4, 6, 6\], got \[1, 4, 6\]"):
        run(g, [np.zeros((1, 4, 6))])
    with pytest.raises(GraphError, match="no value fed for input"):
        run(g, {})
    outs, env = run(g, [np.zeros((1, 4, 6, 6))], keep=True)
    assert len(env) == len(g.nodes)


def test_ir_registry_has_pattern_reference_and_schema_for_every_op():
    for name, op in REGISTRY.items():
        assert isinstance(op.pattern, Pattern) and op.doc, name
        assert op.impl is not None or name == "input", name
    assert get_op("conv2d").pattern == Pattern.OUT_ELEMWISE_FUSABLE
    assert get_op("relu").pattern == Pattern.ELEMWISE and get_op("add").pattern == Pattern.BROADCAST
    assert get_op("transpose").pattern == Pattern.INJECTIVE and get_op("reduce_mean").pattern == Pattern.COMM_REDUCE
    assert get_op("softmax").pattern == Pattern.OPAQUE


@pytest.mark.parametrize("shape,block", [((1, 3, 5, 5), (1, 16)), ((3, 40, 2, 2), (2, 16)), ((8, 33), (4, 8))])
def test_ir_pack_unpack_round_trip_with_padding(shape, block):
    x = np.random.default_rng(1).integers(-127, 128, shape).astype(np.int8)
    p = pack_ref(x, block)
    assert p.shape[-2:] == block and p.shape[0] * block[0] >= shape[0] and p.shape[1] * block[1] >= shape[1]
    np.testing.assert_array_equal(unpack_ref(p, shape), x)
    # padding is zero
    assert np.count_nonzero(p) == np.count_nonzero(x)
    # element (n, c, ...) lives at [n // b0, c // b1, ..., n % b0, c % b1]
    n, c = shape[0] - 1, shape[1] - 1
    assert p[(n // block[0], c // block[1]) + (0,) * (len(shape) - 2) + (n % block[0], c % block[1])] == \
        x[(n, c) + (0,) * (len(shape) - 2)]
