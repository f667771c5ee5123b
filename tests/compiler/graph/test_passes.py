"""One focused test (or a few) per graph pass: Before/Expected structure and numerics."""
from dataclasses import replace

import numpy as np
import pytest

from accel.isa.config import PRESETS
from compiler.frontend import from_onnx, zoo
from compiler.graph import Graph, GraphError, GraphPassError, Node, OpError, run, structural_equal
from compiler.graph.passes import (
    PIPELINE,
    calibrate,
    eliminate_dead_code,
    fold_batchnorm,
    fold_constants,
    fuse_ops,
    infer_types,
    optimize,
    pack_layout,
    partition,
    partition_table,
    plan_memory,
    quantize,
    simplify,
)
from compiler.graph.passes.partition import ACCEL_RULES, decide, gemm_waste

RNG = np.random.default_rng(0)


def f32(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def const(v, name=""):
    return Node.const(v, name=name)


# ---- pipeline ----------------------------------------------------------------------------------
def test_pipeline_is_a_named_list_with_reasons_and_options_switch_steps():
    names = [s.name for s in PIPELINE]
    assert names[0] == "infer_types" and names[-1] == "plan_memory"
    assert names.index("fold_batchnorm") < names.index("quantize") < names.index("partition") \
        < names.index("pack_layout") < names.index("fuse_ops") < names.index("plan_memory")
    assert all(s.why for s in PIPELINE)
    g = from_onnx(zoo.mlp())
    ran = [r["pass"] for r in optimize(g).meta["passes"]]
    assert "quantize" not in ran and "partition" not in ran and "fuse_ops" in ran
    ran = [r["pass"] for r in optimize(g, fuse=False, disabled=("simplify",)).meta["passes"]]
    assert "fuse_ops" not in ran and "simplify" not in ran
    with pytest.raises(GraphPassError, match="unknown pass.*fold_everything; passes are infer_types"):
        optimize(g, disabled=("fold_everything",))


# ---- infer_types -------------------------------------------------------------------------------
def test_infer_types_propagates_new_input_shapes_and_reports_conflicts():
    g = from_onnx(zoo.depthwise_separable())
    g2 = infer_types(g, {"x": (1, 16, 20, 20)})
    assert g2.outputs[0].shape == (1, 32, 10, 10)
    with pytest.raises(OpError, match="conv2d 'dw': input channels 8"):
        infer_types(g, {"x": (1, 8, 12, 12)})
    with pytest.raises(GraphError, match="no graph input named y"):
        infer_types(g, {"y": (1,)})


# ---- fold_constants ----------------------------------------------------------------------------
def test_fold_constants_before_expected():
    x = Node.input("x", (2, 3))
    w = const(f32(3, 4), "w")
    wt = Node("transpose", [w], {"perm": (1, 0)}, name="wt")          # constant: folds
    scale = Node("mul", [const(np.float32(2.0)), const(np.float32(3.0))])  # constant: folds
    y = Node("mul", [Node("dense", [x, wt]), scale], name="y")
    before = Graph.from_outputs([x], [y])
    after = eliminate_dead_code(fold_constants(before))
    x2 = Node.input("x", (2, 3))
    expected = Graph.from_outputs([x2], [Node("mul", [Node("dense", [x2, const(np.ascontiguousarray(w.value.T))]),
                                                      const(np.float32(6.0))])])
    assert structural_equal(after, expected), str(after)


# ---- eliminate_dead_code -----------------------------------------------------------------------
def test_eliminate_dead_code_drops_unused_branch_keeps_inputs():
    x = Node.input("x", (4,))
    unused_in = Node.input("unused", (4,))
    dead = Node("exp", [x], name="dead")
    live = Node("neg", [x], name="live")
    g = Graph([x, unused_in, dead, live], [x, unused_in], [live])
    g2 = eliminate_dead_code(g)
    assert [n.name for n in g2.nodes] == ["x", "unused", "live"]


# ---- simplify ----------------------------------------------------------------------------------
def test_simplify_moves_bias_into_dense_through_reshape_and_merges_reshapes():
    x = Node.input("x", (1, 8, 32))
    flat = Node("reshape", [x], {"shape": (8, 32)})
    d = Node("dense", [flat, const(f32(16, 32))], name="d")
    back = Node("reshape", [d], {"shape": (1, 8, 16)}, name="back")
    y = Node("add", [back, const(f32(16))], name="bias")
    z = Node("reshape", [Node("reshape", [y], {"shape": (8, 16)}), ], {"shape": (128,)}, name="z")
    g = Graph.from_outputs([x], [z])
    s = simplify(g)
    ops = [n.op for n in eliminate_dead_code(s).ops]
    assert ops == ["reshape", "dense", "reshape"], ops  # the three reshapes after the dense merged
    assert len(eliminate_dead_code(s).find("d").inputs) == 3
    v = f32(1, 8, 32)
    np.testing.assert_allclose(run(s, [v])[0], run(g, [v])[0], rtol=1e-5, atol=1e-6)


def test_simplify_moves_channel_bias_into_conv():
    x = Node.input("x", (1, 4, 5, 5))
    c = Node("conv2d", [x, const(f32(6, 4, 3, 3))], name="conv")
    y = Node("add", [const(f32(1, 6, 1, 1)), c], name="bias")
    g = eliminate_dead_code(simplify(Graph.from_outputs([x], [y])))
    assert [n.op for n in g.ops] == ["conv2d"] and g.ops[0].name == "conv"


# ---- fold_batchnorm ----------------------------------------------------------------------------
def test_fold_batchnorm_into_conv_matches_and_lone_bn_becomes_affine():
    g = from_onnx(zoo.residual_block())
    before = {n.op for n in g.ops}
    assert "batch_norm" in before
    g2 = eliminate_dead_code(fold_batchnorm(g))
    assert "batch_norm" not in {n.op for n in g2.ops}
    assert g2.op_counts()["conv2d"] == g.op_counts()["conv2d"]
    assert g2.find("conv1").inputs[1].name == "conv1/w_bn"  # the conv keeps its name
    x = zoo.sample_inputs(zoo.residual_block(), 1)[0]
    np.testing.assert_allclose(run(g2, x)[0], run(g, x)[0], rtol=1e-4, atol=1e-5)
    # a batch norm after a non-conv producer: per-channel multiply-add
    xin = Node.input("x", (1, 3, 2, 2))
    bn = Node("batch_norm", [Node("relu", [xin]), *(const(np.abs(f32(3)) + 0.5) for _ in range(4))], name="bn")
    g3 = fold_batchnorm(Graph.from_outputs([xin], [bn]))
    assert [n.op for n in eliminate_dead_code(g3).ops] == ["relu", "mul", "add"]
    v = f32(1, 3, 2, 2)
    np.testing.assert_allclose(run(g3, [v])[0], run(Graph.from_outputs([xin], [bn]), [v])[0], rtol=1e-5)


def test_fold_batchnorm_skips_conv_with_other_users():
    x = Node.input("x", (1, 2, 4, 4))
    c = Node("conv2d", [x, const(f32(2, 2, 1, 1))], name="c")
    bn = Node("batch_norm", [c, *(const(np.ones(2, np.float32)) for _ in range(4))], name="bn")
    y = Node("add", [bn, c])
    g = fold_batchnorm(Graph.from_outputs([x], [y]))
    assert g.find("bn").op == "add"  # became the affine form, the conv is untouched
    assert g.find("c").op == "conv2d" and len(g.find("c").inputs) == 2


# ---- partition ---------------------------------------------------------------------------------
def quantized(model, samples=2):
    g = optimize(from_onnx(model), fuse=False, disabled=("plan_memory",))
    return quantize(g, calibrate(g, zoo.sample_inputs(model, samples)))


def test_partition_declines_with_reasons_from_one_rule_table():
    q = quantized(zoo.conv_bn_relu_pool())
    ds = {d.name: d for d in decide(q, PRESETS["default"])}
    assert ds["conv1"].target == "cpu"
    assert ds["conv1"].reason == "Conv 'conv1': 3 input channels < block_in 16 wastes 81% of the GEMM core"
    assert ds["conv2"].target == "accel"
    # a batch-1 classifier streams each weight byte for one MAC: the roofline keeps it off the core
    assert ds["fc"].target == "cpu" and ds["fc"].reason.startswith(
        "Gemm 'fc': memory-bound, 0.8 MACs per DRAM byte keep the GEMM core at most 2% busy (32 needed on the 8-byte bus)")
    assert ds["relu2"].target == "accel"  # follows its accelerator producer
    assert ds["relu1"].target == "cpu" and "not fed by an accelerator layer" in ds["relu1"].reason
    # max pooling has an ALU lowering, but rides only with an accelerator producer
    assert ds["pool1"].target == "cpu" and "not fed by an accelerator layer" in ds["pool1"].reason
    assert ds["gap"].op == "qconv2d"   # an int8 depthwise conv (quantize.affine_as_depthwise); placed by its cost
    assert gemm_waste(3, 16) == pytest.approx(13 / 16) and ACCEL_RULES.max_gemm_waste == 0.5
    # the tiny config (4x4 core) takes the 3-channel conv: 25% waste
    assert {d.name: d.target for d in decide(q, PRESETS["tiny"])}["conv1"] == "accel"
    g = partition(q, PRESETS["default"])
    assert g.find("conv2").target == "accel" and g.find("conv1").target == "cpu"
    assert "Conv 'conv1': 3 input channels" in partition_table(g)
    dw = {d.name: d for d in decide(quantized(zoo.depthwise_separable()), PRESETS["default"],
                                    rules=replace(ACCEL_RULES, depthwise_by_cost=False))}   # the waste rule
    assert dw["dw"].reason == ("Conv 'dw': depthwise convolution (groups=16) as GEMMs on channel slices wastes 94% "
                               "of the GEMM core (max_grouped_waste 75%)") and dw["dw"].kind == "depthwise"


def test_partition_user_overrides_per_op_type():
    q = quantized(zoo.conv_bn_relu_pool())
    cfg = PRESETS["default"]
    ds = {d.name: d for d in decide(q, cfg, force={"Conv": "accel", "qdense": "accel"})}
    assert ds["conv1"].target == "accel" and "forced onto the accelerator" in ds["conv1"].reason
    assert ds["fc"].target == "accel" and "forced onto the accelerator by the user (Gemm 'fc': memory-bound" in ds["fc"].reason
    ds = {d.name: d for d in decide(q, cfg, force={"qconv2d": "cpu"})}
    assert ds["conv2"].target == "cpu" and "forced to the CPU" in ds["conv2"].reason
    assert {d.name: d for d in decide(q, cfg, force={"MaxPool": "accel"})}["pool1"].target == "accel"
    with pytest.raises(GraphPassError, match="cannot force Flatten 'flatten' onto the accelerator: .*no accelerator"):
        decide(q, cfg, force={"Flatten": "accel"})
    with pytest.raises(GraphPassError, match="force targets must be"):
        decide(q, cfg, force={"Conv": "gpu"})


# ---- pack_layout -------------------------------------------------------------------------------
def test_pack_layout_cancels_between_adjacent_accel_layers_and_is_bit_exact():
    m = zoo.residual_block()
    q = quantized(m)
    g = pack_layout(partition(q, PRESETS["default"]), PRESETS["default"])
    counts = g.op_counts()
    # one pack at the entry (the input feeds conv1 and the residual add), one unpack at the exit
    assert counts["pack"] == 1 and counts["unpack"] == 1 and g.meta["layout"]["cancelled"] >= 5
    conv = g.find("conv2")
    assert conv.attrs["layout"] == "NCHWnc" and conv.shape == (1, 1, 8, 8, 1, 16)
    assert conv.inputs[1].shape == (1, 1, 3, 3, 16, 16)  # O I H W o i
    x = zoo.sample_inputs(m, 1, seed=9)[0]
    np.testing.assert_array_equal(run(g, x)[0], run(q, x)[0])


def test_pack_layout_pads_channels_for_the_tiny_and_default_cores():
    m = zoo.conv_bn_relu_pool()
    q = quantized(m)
    x = zoo.sample_inputs(m, 1, seed=4)[0]
    for cfg in (PRESETS["default"], PRESETS["tiny"]):
        g = pack_layout(partition(q, cfg, force={"Conv": "accel"}), cfg)
        conv1 = g.find("conv1")
        assert conv1.inputs[0].op == "pack" and conv1.inputs[0].shape[-1] == cfg.block_in
        np.testing.assert_array_equal(run(g, x)[0], run(q, x)[0])


# ---- fuse_ops ----------------------------------------------------------------------------------
def test_fuse_ops_conv_absorbs_elementwise_chain_before_expected():
    x = Node.input("x", (1, 4, 6, 6))
    c = Node("conv2d", [x, const(f32(4, 4, 3, 3)), const(f32(4))], {"pads": (1, 1, 1, 1)}, name="c")
    a = Node("add", [c, x], name="res")
    r = Node("relu", [a], name="r")
    t = Node("transpose", [r], {"perm": (0, 2, 3, 1)}, name="t")  # injective: not into the conv
    s = Node("sigmoid", [t], name="s")                           # elementwise: fuses with t
    g = fuse_ops(Graph.from_outputs([x], [s]))
    assert [n.op for n in g.ops] == ["fused", "fused"]
    conv_group, inj_group = g.ops
    assert [n.op for n in conv_group.attrs["body"].ops] == ["conv2d", "add", "relu"]
    assert conv_group.attrs["pattern"] == "OUT_ELEMWISE_FUSABLE" and conv_group.name == "r"
    assert [n.op for n in inj_group.attrs["body"].ops] == ["transpose", "sigmoid"]
    assert [i.op for i in conv_group.inputs] == ["input", "const", "const"]  # weights stay outside
    v = f32(1, 4, 6, 6)
    np.testing.assert_array_equal(run(g, [v])[0], run(Graph.from_outputs([x], [s]), [v])[0])


def test_fuse_ops_respects_multiple_users_opaque_ops_and_targets():
    x = Node.input("x", (1, 8))
    d = Node("dense", [x, const(f32(8, 8))], name="d")
    r = Node("relu", [d], name="r")
    sm = Node("softmax", [r], name="sm")          # opaque: alone
    e = Node("exp", [r], name="e")                # r has two users: r does not fuse into e
    g = fuse_ops(Graph.from_outputs([x], [sm, e]))
    assert [n.op for n in g.ops] == ["fused", "softmax", "exp"]
    # different targets never share a group
    d2 = d.with_inputs(d.inputs, target="accel")
    r2 = Node("relu", [d2], name="r2", target="cpu")
    g2 = fuse_ops(Graph.from_outputs([x], [r2]))
    assert [n.op for n in g2.ops] == ["dense", "relu"]


def test_fuse_ops_joins_a_silu_diamond_into_the_conv():
    """x * sigmoid(x) after a conv: the sigmoid (a lone user of the conv's result feeding only the
    multiply) and the multiply join the conv's group; a third user, an accelerator target or a
    sigmoid read elsewhere keeps the diamond apart."""
    x = Node.input("x", (1, 4, 6, 6))
    c = Node("conv2d", [x, const(f32(4, 4, 3, 3)), const(f32(4))], {"pads": (1, 1, 1, 1)}, name="c")
    sg = Node("sigmoid", [c], name="sg")
    m = Node("mul", [c, sg], name="silu")
    g = fuse_ops(Graph.from_outputs([x], [m]))
    assert [n.op for n in g.ops] == ["fused"]
    assert [n.op for n in g.ops[0].attrs["body"].ops] == ["conv2d", "sigmoid", "mul"]
    v = f32(1, 4, 6, 6)
    np.testing.assert_array_equal(run(g, [v])[0], run(Graph.from_outputs([x], [m]), [v])[0])
    assert [n.op for n in fuse_ops(Graph.from_outputs([x], [m, sg])).ops] == ["conv2d", "sigmoid", "mul"]  # sg: an output
    r = Node("relu", [c], name="r")
    assert "conv2d" in [n.op for n in fuse_ops(Graph.from_outputs([x], [m, r])).ops]                # a third user
    h = Node("clip", [Node("add", [Node("mul", [c, const(np.float32(1 / 6))]), const(np.float32(0.5))])],
             {"min": 0.0, "max": 1.0}, name="hsig")
    hs = Node("mul", [c, h], name="hswish")   # HardSwish as the importer writes it: a chain arm
    g = fuse_ops(Graph.from_outputs([x], [hs]))
    assert [n.op for n in g.ops] == ["fused"] and [n.op for n in g.ops[0].attrs["body"].ops][-1] == "mul"
    np.testing.assert_allclose(run(g, [v])[0], run(Graph.from_outputs([x], [hs]), [v])[0], rtol=1e-6)
    qd = Node("dequantize", [Node("quantize", [c], {"shift": 4}, name="q")], {"shift": 4}, name="dq")
    qs = Node("mul", [qd, Node("sigmoid", [qd], name="qsg")], name="qsilu")   # after an int8 step: chains only
    assert "fused" in [n.op for n in fuse_ops(Graph.from_outputs([x], [qs])).ops]
    assert not any(n.op == "fused" and [b.op for b in n.attrs["body"].ops][-1] == "mul" and
                   "quantize" in [b.op for b in n.attrs["body"].ops] for n in fuse_ops(Graph.from_outputs([x], [qs])).ops)
    ca = c.with_inputs(c.inputs, target="accel")
    sa = Node("sigmoid", [ca], name="sa", target="accel")
    ma = Node("mul", [ca, sa], name="ma", target="accel")
    assert "conv2d" in [n.op for n in fuse_ops(Graph.from_outputs([x], [ma])).ops]


def test_fuse_ops_merges_elementwise_arms_into_one_kernel():
    """An LSTM cell's C = sigmoid(f) * C' + sigmoid(i) * tanh(c), each gate a slice of one dense:
    the add's two arms become one group (not one kernel per arm), and a slice feeding a dense's
    bias add joins the dense. An arm read elsewhere, or a second dense, stays out."""
    h, xs, c0 = Node.input("h", (1, 8)), Node.input("xs", (3, 32)), Node.input("c0", (1, 8))
    xrow = Node("slice", [xs], {"starts": (1,), "ends": (2,), "axes": (0,), "steps": (1,)}, name="xrow")
    gates = Node("add", [Node("dense", [h, const(f32(32, 8))], name="rec"), xrow], name="gates")

    def cols(k, name):
        return Node("slice", [gates], {"starts": (8 * k,), "ends": (8 * k + 8,), "axes": (1,), "steps": (1,)}, name=name)
    i, f = Node("sigmoid", [cols(0, "i_pre")], name="i"), Node("sigmoid", [cols(1, "f_pre")], name="f")
    cc = Node("tanh", [cols(2, "c_pre")], name="cc")
    new_c = Node("add", [Node("mul", [f, c0], name="fc"), Node("mul", [i, cc], name="ic")], name="C")
    graph = Graph.from_outputs([h, xs, c0], [new_c])
    g = fuse_ops(graph)
    assert [n.op for n in g.ops] == ["fused", "fused"]
    dense_group, cell = g.ops
    assert sorted(n.op for n in dense_group.attrs["body"].ops) == ["add", "dense", "slice"]
    assert sorted(n.op for n in cell.attrs["body"].ops) == sorted(
        ["slice", "sigmoid", "mul", "slice", "sigmoid", "slice", "tanh", "mul", "add"])
    feeds = [f32(1, 8), f32(3, 32), f32(1, 8)]
    np.testing.assert_allclose(run(g, feeds)[0], run(graph, feeds)[0], rtol=1e-6)
    # i read twice (C and an output): its arm stays its own group
    assert len(fuse_ops(Graph.from_outputs([h, xs, c0], [new_c, i])).ops) > 2
    # two dense arms: a group holds one anchor
    two = Node("add", [Node("dense", [h, const(f32(4, 8))]), Node("dense", [h, const(f32(4, 8))])])
    assert [n.op for n in fuse_ops(Graph.from_outputs([h], [two])).ops] == ["dense", "fused"]


@pytest.mark.parametrize("parts", [3, 4, 8, 64])
def test_fuse_ops_a_wide_concat_ends_its_kernel_before_a_shape_change(parts):
    """An LSTM's outputs: its steps' rows concatenated, then transposed. A concat of more than
    CONCAT_FUSE_INPUTS inputs keeps its own shape as its kernel's output (the cpu schedule copies
    each input's run), so the transpose starts a kernel of its own; an elementwise consumer still
    joins, and a narrow concat still fuses with the transpose."""
    x = Node.input("x", (parts, 2, 8))
    rows = [Node("tanh", [Node("slice", [x], {"starts": (k,), "ends": (k + 1,), "axes": (0,), "steps": (1,)})])
            for k in range(parts)]
    cat = Node("concat", rows, {"axis": 0}, name="cat")
    t = Node("transpose", [cat], {"perm": (1, 0, 2)}, name="t")
    e = Node("relu", [cat], name="e")
    for out, closes in ((t, parts > 4), (e, False)):
        graph = Graph.from_outputs([x], [out])
        g = fuse_ops(graph)
        kernels = [n for n in g.ops if n.op == "fused"]
        last = [[b.op for b in n.attrs["body"].ops][-1] for n in kernels]
        assert ("concat" in last) == closes and (g.ops[-1].op == "transpose") == closes, [n.op for n in g.ops]
        feed = [f32(parts, 2, 8)]
        np.testing.assert_allclose(run(g, feed)[0], run(graph, feed)[0], rtol=1e-6)


def test_fuse_ops_reduction_absorbs_injective_producers():
    x = Node.input("x", (2, 3, 4))
    t = Node("transpose", [x], {"perm": (0, 2, 1)})
    m = Node("reduce_mean", [t], {"axes": (2,)}, name="m")
    g = fuse_ops(Graph.from_outputs([x], [m]))
    assert [n.op for n in g.ops] == ["fused"] and g.ops[0].attrs["pattern"] == "COMM_REDUCE"


# ---- plan_memory -------------------------------------------------------------------------------
def _check_no_overlap(g: Graph):
    """No two tensors live at the same time share a buffer."""
    plan = g.meta["memory_plan"]
    last = {}
    for k, n in enumerate(g.nodes):
        for i in n.inputs:
            last[id(i)] = k
    for o in g.outputs:
        last[id(o)] = len(g.nodes)
    spans = {k: (k, last.get(id(n), k)) for k, n in enumerate(g.nodes) if k in plan.assignment}
    for a, (sa, ea) in spans.items():
        for b, (sb, eb) in spans.items():
            if a < b and plan.assignment[a] == plan.assignment[b]:
                assert ea <= sb, f"{g.nodes[a].name} and {g.nodes[b].name} share buffer {plan.assignment[a]}"
        assert plan.buffers[plan.assignment[a]] >= g.nodes[a].type.nbytes


def test_plan_memory_reuses_buffers_in_a_chain():
    x = Node.input("x", (1024,))
    y = x
    for k in range(6):
        y = Node("neg", [y], name=f"n{k}")
    g = plan_memory(Graph.from_outputs([x], [y]))
    plan = g.meta["memory_plan"]
    assert plan.naive_bytes == 7 * 4096
    assert plan.planned_bytes == 3 * 4096  # input + two ping-pong buffers
    assert plan.peak_live_bytes == 2 * 4096  # an op's input and output
    _check_no_overlap(g)
    assert "planned 12288 B in 3 buffers vs naive 28672 B" in plan.summary()


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_plan_memory_on_networks_beats_naive_without_overlap(name):
    m = zoo.MODELS[name]()
    g = optimize(from_onnx(m), quantize=True, calibration_samples=zoo.sample_inputs(m, 2), accel="default")
    plan = g.meta["memory_plan"]
    assert plan.peak_live_bytes <= plan.planned_bytes < plan.naive_bytes
    _check_no_overlap(g)
