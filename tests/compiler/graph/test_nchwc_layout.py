"""The CPU target's blocked layout between convs (compiler.graph.passes.nchwc_layout): where the
layout conversions go (graph inputs and outputs, NCHW-only readers, blocks that do not meet), that
the rewritten graph means the same as the original (graph interpreter), and that the cpu target
runs it to the same numbers (compiled kernels: blocked convs, pools, concats, epilogues)."""
import numpy as np
import pytest

import compiler
from compiler.graph import run as reference_run
from compiler.graph.ir import Graph, Node
from compiler.graph.passes import GraphOptions, fuse_ops, nchwc_layout, optimize
from compiler.ops.cpu import TILES, conv_blocks, lanes

RNG = np.random.default_rng(7)


class Net:
    """A small graph under construction (Node API), weights seeded."""

    def __init__(self, shape):
        self.x = Node.input("x", shape)
        self.n = 0

    def name(self, what):
        self.n += 1
        return f"{what}{self.n}"

    def conv(self, x, out, k=3, stride=1, pad=None, bias=True, groups=1):
        pad = k // 2 if pad is None else pad
        w = Node.const((RNG.standard_normal((out, x.shape[1] // groups, k, k)) / np.sqrt(x.shape[1] * k * k))
                       .astype(np.float32))
        ins = [x, w] + ([Node.const(RNG.standard_normal(out).astype(np.float32) * 0.1)] if bias else [])
        return Node("conv2d", ins, {"pads": (pad,) * 4, "strides": (stride, stride), "groups": groups},
                    name=self.name("conv"))

    def op(self, op, *ins, **attrs):
        return Node(op, list(ins), attrs, name=self.name(op))

    def graph(self, *outs):
        return Graph.from_outputs([self.x], list(outs))


def ops_of(g):
    return [n.op for n in g.ops]


def transforms(g):
    return [(n.inputs[0].op, n.attrs["src_layout"], n.attrs["dst_layout"]) for n in g.ops
            if n.op == "layout_transform"]


def check_same(g, q, batch=None, rtol=1e-4):
    """The rewritten graph q computes what g computes (interpreter), and so does the cpu target."""
    shape = g.inputs[0].shape
    x = RNG.standard_normal(shape).astype(np.float32)
    want = reference_run(g, {"x": x})[0]
    got = reference_run(q, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max()))
    mod = compiler.build_model(g, target="cpu")
    assert mod.meta["fallbacks"] == []
    out = next(iter(mod.run({"x": x})[0].values()))
    np.testing.assert_allclose(out.reshape(want.shape), want, rtol=rtol, atol=rtol * float(np.abs(want).max()))
    return mod


def test_chain_packs_at_the_graph_input_and_unpacks_at_its_output():
    t = Net((1, 16, 12, 12))
    y = t.op("relu", t.conv(t.x, 32))
    y = t.op("relu", t.conv(y, 32, k=1))
    y = t.conv(y, 32, stride=2)
    g = t.graph(y)
    q = nchwc_layout(g)
    assert ops_of(q).count("conv2d_NCHWc") == 3 and "conv2d" not in ops_of(q)
    oc = conv_blocks(32, 32)[1]
    assert transforms(q) == [("input", "NCHW", f"NCHW{conv_blocks(16, 32)[0]}c"), ("add", f"NCHW{oc}c", "NCHW")]
    assert q.outputs[0].shape == (1, 32, 6, 6)
    check_same(g, q)


def test_last_conv_with_a_narrow_block_keeps_its_nchw_kernel():
    """A last conv (its result reaches no conv) whose output block is below a vector of floats
    (12 channels: 4 lanes) reads its input unpacked and runs NCHW."""
    if lanes("float32") <= 4:
        pytest.skip("a 4-float vector: no conv block is narrower than a vector")
    t = Net((1, 16, 12, 12))
    y = t.op("relu", t.conv(t.x, 32))
    y = t.conv(t.op("relu", t.conv(y, 32)), 12, k=1)
    g = t.graph(y)
    q = nchwc_layout(g)
    assert ops_of(q).count("conv2d_NCHWc") == 2 and ops_of(q).count("conv2d") == 1
    assert transforms(q)[-1] == ("relu", f"NCHW{conv_blocks(32, 32)[1]}c", "NCHW")
    check_same(g, q)


def test_residual_add_and_pools_stay_blocked():
    t = Net((1, 8, 16, 16))
    a = t.op("relu", t.conv(t.x, 16))
    b = t.op("relu", t.op("add", t.conv(t.op("relu", t.conv(a, 16)), 16), a))
    p = t.op("max_pool2d", b, kernel=(3, 3), strides=(2, 2), pads=(0, 0, 0, 0), ceil_mode=1)
    p = t.op("avg_pool2d", p, kernel=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1), count_include_pad=0)
    y = t.conv(p, 16)
    g = t.graph(y)
    q = nchwc_layout(g)
    blocked = {n.op for n in q.ops if n.type.rank == 5}
    assert {"conv2d_NCHWc", "add", "relu", "max_pool2d", "avg_pool2d"} <= blocked
    assert len(transforms(q)) == 2   # the input's pack, the last conv's unpack
    check_same(g, q)


@pytest.mark.parametrize("width, groups", [(64, 4), (96, 6), (128, 4), (48, 3)])
def test_grouped_convs_with_whole_blocks_per_group_stay_blocked(width, groups):
    """RegNet's and ResNeXt's blocks: 1x1, a grouped 3x3 (strided or not), 1x1, a residual add. The
    grouped conv runs blocked, and the 1x1 before it writes the grouped conv's input block, so
    nothing is unpacked between them."""
    t = Net((1, 16, 12, 12))
    a = t.op("relu", t.conv(t.x, width, k=1))
    b = t.op("relu", t.conv(t.op("relu", t.conv(a, width, k=1)), width, groups=groups))
    c = t.op("relu", t.op("add", t.conv(b, width, k=1), a))
    s = t.op("relu", t.conv(t.op("relu", t.conv(c, width, k=1)), width, stride=2, groups=groups))
    g = t.graph(t.conv(s, 32, k=1))
    q = nchwc_layout(g)
    grouped = [n for n in q.ops if n.op == "conv2d_NCHWc" and n.attrs["groups"] != 1]
    assert len(grouped) == 2 and all(n.attrs["groups"] == groups for n in grouped)
    assert len(transforms(q)) == 2   # the input's pack, the last conv's unpack
    check_same(g, q)


def test_grouped_conv_narrower_than_a_block_keeps_its_nchw_kernel():
    t = Net((1, 16, 8, 8))
    y = t.conv(t.op("relu", t.conv(t.x, 32, k=1)), 32, groups=16)    # two channels per group
    g = t.graph(t.conv(t.op("relu", y), 32, k=1))
    q = nchwc_layout(g)
    assert any(n.op == "conv2d" and n.attrs["groups"] == 16 for n in q.ops)
    check_same(g, q)


def test_concat_on_block_boundaries_stays_blocked():
    t = Net((1, 16, 10, 10))
    s = t.op("relu", t.conv(t.x, 16, k=1))
    y = t.op("concat", t.op("relu", t.conv(s, 32, k=1)), t.op("relu", t.conv(s, 32)), axis=1)
    y = t.conv(y, 16, k=1)
    g = t.graph(y)
    q = nchwc_layout(g)
    cat = next(n for n in q.ops if n.op == "concat")
    assert cat.type.rank == 5 and cat.attrs["axis"] == 1
    check_same(g, q)


def test_concat_of_two_blockings_converts_to_the_smaller_block():
    """12 channels take a block of 4, 32 channels a larger one (a block of 4 is below a vector, so
    that conv keeps its own): the 32-channel input is converted, the concat stays blocked by 4."""
    t = Net((1, 8, 9, 9))
    a, b = t.conv(t.x, 12), t.conv(t.x, 32)
    if not conv_blocks(8, 12)[1] == 4 < conv_blocks(8, 32)[1]:
        pytest.skip("this host's tiles give 12 and 32 channels the same block")
    y = t.conv(t.op("relu", t.op("concat", a, b, axis=1)), 16)
    g = t.graph(y)
    q = nchwc_layout(g)
    cat = next(n for n in q.ops if n.op == "concat")
    assert cat.shape == (1, 11, 9, 9, 4)
    check_same(g, q)


def test_concat_whose_channels_share_no_block_runs_nchw():
    """12 channels (block 4) and 6 (block 6, no power of two of 4 or more divides it): NCHW."""
    t = Net((1, 8, 9, 9))
    a, b = t.conv(t.x, 12), t.conv(t.x, 6)
    if conv_blocks(8, 6)[1] != 6 or conv_blocks(8, 12)[1] != 4:
        pytest.skip("this host's tiles give 6 or 12 channels other blocks")
    y = t.conv(t.op("relu", t.op("concat", a, b, axis=1)), 16)
    g = t.graph(y)
    q = nchwc_layout(g)
    cat = next(n for n in q.ops if n.op == "concat")
    assert cat.type.rank == 4 and all(i.type.rank == 4 for i in cat.inputs)
    # the convs feeding it unpack in their own kernels: no separate conversion pass over memory
    fused = fuse_ops(q)
    assert [n.inputs[0].op for n in fused.ops if n.op == "layout_transform"] == ["input"]
    check_same(g, q)


def test_convs_feeding_one_concat_agree_on_a_block():
    """A 16- and a 32-channel conv into one concat: both write the same block (the smaller, when it
    is still a whole vector), so the concat copies blocks with no conversion."""
    t = Net((1, 16, 8, 8))
    s = t.op("relu", t.conv(t.x, 16, k=1))
    y = t.op("concat", t.op("relu", t.conv(s, 16)), t.op("max_pool2d", t.op("relu", t.conv(s, 32, k=1)),
                                                         kernel=(3, 3), pads=(1, 1, 1, 1)), axis=1)
    g = t.graph(t.conv(y, 16))
    q = nchwc_layout(g)
    cat = next(n for n in q.ops if n.op == "concat")
    assert cat.type.rank == 5 and len(transforms(q)) == 2
    check_same(g, q)


def test_odd_channel_counts_and_an_nchw_reader_between():
    """3 output channels have no block of 4: that conv stays NCHW; a global pool and a reshape read
    NCHW; 5 channels make a block of 5 lanes; 6 lanes in a last conv: its NCHW kernel."""
    t = Net((1, 5, 11, 7))
    a = t.op("relu", t.conv(t.x, 5, bias=False))
    b = t.conv(a, 3)
    c = t.conv(t.op("relu", t.conv(a, 20)), 6)   # a block of 6 lanes, below a vector: NCHW
    gp = t.op("reshape", t.op("global_avg_pool", c), shape=(1, 6))
    g = t.graph(b, gp)
    q = nchwc_layout(g)
    ops = ops_of(q)
    if TILES.conv_oc_bn >= 8:   # 5 channels block by 5 lanes, 6 by 6 (below a vector of 8 or 16)
        assert ops.count("conv2d_NCHWc") == 2 and ops.count("conv2d") == 2
    assert all(n.shape[4] >= 4 for n in q.ops if n.op == "conv2d_NCHWc")
    assert all(o.type.rank == 4 for o in q.ops if o.op in ("global_avg_pool",))
    x = RNG.standard_normal(g.inputs[0].shape).astype(np.float32)
    for got, want in zip(reference_run(q, {"x": x}), reference_run(g, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    mod = compiler.build_model(g, target="cpu")
    outs = list(mod.run({"x": x})[0].values())
    for got, want in zip(outs, reference_run(g, {"x": x})):
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [2, 3])
def test_batch_above_one(batch):
    t = Net((batch, 16, 8, 8))
    y = t.op("relu", t.conv(t.x, 16))
    y = t.op("clip", t.op("add", t.conv(y, 16), y), min=0.0, max=6.0)
    y = t.conv(t.op("max_pool2d", y, kernel=(2, 2), strides=(2, 2)), 8)
    g = t.graph(y)
    q = nchwc_layout(g)
    assert q.ops[0].shape[0] == batch and "conv2d_NCHWc" in ops_of(q)
    check_same(g, q)


def test_batch_norm_and_channel_constants_as_blocked_affines():
    t = Net((1, 16, 6, 6))
    a = t.conv(t.x, 16)
    c = 16
    bn = Node("batch_norm", [a, Node.const(RNG.uniform(0.5, 1.5, c).astype(np.float32)),
                             Node.const(RNG.standard_normal(c).astype(np.float32)),
                             Node.const(RNG.standard_normal(c).astype(np.float32)),
                             Node.const(RNG.uniform(0.5, 2, c).astype(np.float32))], {"epsilon": 1e-3}, name="bn")
    m = t.op("mul", bn, Node.const(RNG.standard_normal((c, 1, 1)).astype(np.float32)))
    s = t.op("sub", m, Node.const(np.float32(0.5)))
    y = t.conv(t.op("relu", s), 16)
    g = t.graph(y)
    q = nchwc_layout(g)
    assert "batch_norm" not in ops_of(q) and len(transforms(q)) == 2
    check_same(g, q)


def test_fusion_writes_the_unpack_from_the_conv_kernel():
    """A blocked conv whose result leaves the blocked layout (a graph output) unpacks in its own
    kernel: fuse_ops puts the layout_transform in the conv's group."""
    t = Net((1, 8, 8, 8))
    a = t.op("relu", t.conv(t.x, 16))
    g = t.graph(t.conv(a, 16), a)
    q = fuse_ops(nchwc_layout(g))
    assert any(f["ops"][:1] == ["conv2d_NCHWc"] and f["ops"][-1] == "layout_transform" for f in q.meta["fusion"])


def test_only_the_cpu_targets_own_builds_block():
    """optimize() with default options (a graph later quantized and partitioned) keeps NCHW; the
    cpu target's build asks for the pass."""
    t = Net((1, 8, 8, 8))
    g = t.graph(t.conv(t.op("relu", t.conv(t.x, 16)), 16))
    assert "conv2d_NCHWc" not in ops_of(optimize(g, fuse=False))
    assert "conv2d_NCHWc" in ops_of(optimize(g, GraphOptions(fuse=False, nchwc=True)))
    assert "conv2d_NCHWc" not in ops_of(optimize(g, GraphOptions(fuse=False, nchwc=True, targets=("cpu",))))
    mod = compiler.build_model(g, target="cpu")
    assert mod.graph.meta["nchwc"]["convs"] == 2


def _clip6(t, x):
    return t.op("clip", x, min=0.0, max=6.0)


@pytest.mark.parametrize("stride,pad", [(1, 1), (2, (0, 1, 1, 0))])
def test_inverted_residual_stays_blocked_through_the_depthwise_conv(stride, pad):
    """expand 1x1 - depthwise 3x3 - project 1x1 (MobileNetV2): the depthwise conv runs blocked in its
    producer's blocking, so the only conversions are at the graph's input and output."""
    t = Net((1, 16, 10, 10))
    e = _clip6(t, t.conv(t.x, 48, k=1))
    w = Node.const(RNG.standard_normal((48, 1, 3, 3)).astype(np.float32))
    d = Node("conv2d", [e, w], {"pads": (pad,) * 4 if isinstance(pad, int) else pad, "strides": (stride, stride),
                                "groups": 48}, name="dw")
    p = t.conv(_clip6(t, d), 16, k=1)
    g = t.graph(t.op("add", p, t.x) if stride == 1 else p)
    q = nchwc_layout(g)
    assert ops_of(q).count("depthwise_conv2d_NCHWc") == 1 and "conv2d" not in ops_of(q)
    tr = transforms(q)   # the input's pack (the residual reads it too) and the output's unpack
    assert len(tr) == 2 and tr[0][0] == "input" and tr[1][2] == "NCHW"
    assert q.meta["nchwc"]["depthwise"] == 1
    check_same(g, q)


def test_depthwise_at_the_input_packs_it_when_its_result_reaches_a_blocked_conv():
    t = Net((1, 12, 9, 9))
    d = t.conv(t.x, 12, k=3, stride=2, groups=12)          # 12 channels: blocks of 4
    g = t.graph(t.conv(t.op("relu", d), 16))
    q = nchwc_layout(g)
    assert "depthwise_conv2d_NCHWc" in ops_of(q)
    assert transforms(q)[0] == ("input", "NCHW", "NCHW4c")
    check_same(g, q)


def test_depthwise_with_nchw_neighbours_or_narrow_channels_keeps_its_nchw_kernel():
    t = Net((1, 16, 8, 8))
    g = t.graph(t.op("relu", t.conv(t.x, 16, groups=16)))   # NCHW in, graph output out
    assert "depthwise_conv2d_NCHWc" not in ops_of(nchwc_layout(g))
    t = Net((1, 6, 8, 8))
    d = t.conv(t.x, 6, groups=6)                            # 6 channels: no block of 4 or more
    g = t.graph(t.conv(d, 16))
    q = nchwc_layout(g)
    assert "depthwise_conv2d_NCHWc" not in ops_of(q)
    check_same(g, q)


def test_dilated_depthwise_between_blocked_convs():
    t = Net((2, 8, 11, 11))
    a = t.op("relu", t.conv(t.x, 16))
    w = Node.const(RNG.standard_normal((16, 1, 3, 3)).astype(np.float32))
    d = Node("conv2d", [a, w, Node.const(RNG.standard_normal(16).astype(np.float32))],
             {"pads": (2, 2, 2, 2), "dilations": (2, 2), "groups": 16}, name="dw")
    g = t.graph(t.conv(t.op("relu", d), 8))
    q = nchwc_layout(g)
    assert ops_of(q).count("depthwise_conv2d_NCHWc") == 1
    check_same(g, q)


def test_squeeze_excitation_stays_blocked():
    """EfficientNet's block: SiLU, depthwise conv, a squeeze-excitation gate (global mean, two 1x1
    convs, sigmoid) multiplying the planes per channel, project 1x1: the mean runs over the blocked
    planes and the gate is applied blocked, so the only conversions are at the input and output."""
    t = Net((1, 16, 10, 10))
    e = t.conv(t.x, 64, k=1)
    e = t.op("mul", e, t.op("sigmoid", e))
    w = Node.const(RNG.standard_normal((64, 1, 3, 3)).astype(np.float32))
    d = Node("conv2d", [e, w], {"pads": (1, 1, 1, 1), "groups": 64}, name="dw")
    d = t.op("mul", d, t.op("sigmoid", d))
    se = t.op("relu", t.conv(t.op("global_avg_pool", d), 8, k=1))
    se = t.op("sigmoid", t.conv(se, 64, k=1))
    g = t.graph(t.op("add", t.conv(t.op("mul", d, se), 16, k=1), t.x))
    q = nchwc_layout(g)
    assert len(transforms(q)) == 2 and "global_avg_pool" not in ops_of(q) and "reduce_mean" in ops_of(q)
    check_same(g, q)


def test_global_pool_of_a_blocked_tensor_unpacks_only_its_result():
    t = Net((2, 8, 9, 9))
    a = t.op("relu", t.conv(t.op("relu", t.conv(t.x, 32)), 32))
    g = t.graph(t.op("reshape", t.op("global_avg_pool", a), shape=(2, 32)))
    q = nchwc_layout(g)
    assert [src for src, _, dst in transforms(q) if dst == "NCHW"] == ["reduce_mean"]
    check_same(g, q)


@pytest.mark.parametrize("out", [255, 19, 21, 9])
def test_heads_with_no_vector_block_get_zero_filters_and_a_slice(out):
    """A detection head's 255 channels blocked by 15 lanes (or a 19-class head by 1) ran 10-20x
    slower than the same conv padded to whole vectors: the pass pads, the slice keeps the name."""
    t = Net((1, 32, 6, 6))
    head = t.conv(t.op("relu", t.conv(t.x, 32)), out, k=1)
    g = t.graph(t.op("sigmoid", head))
    q = nchwc_layout(g)
    padded = next(n for n in q.ops if n.name == f"{head.name}/padded")
    channels = padded.shape[1] * (padded.shape[4] if padded.type.rank == 5 else 1)
    assert channels % lanes("float32") == 0 and channels - out < lanes("float32")
    sl = next(n for n in q.ops if n.name == head.name)
    assert sl.op == "slice" and sl.shape[1] == out
    check_same(g, q)
