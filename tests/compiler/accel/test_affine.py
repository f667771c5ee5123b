"""A batch norm that cannot fold into a conv (pre-activation after a concat, as in DenseNet)
becomes a 1x1 depthwise int8 conv (compiler.graph.passes.quantize.affine_as_depthwise): int8 in
and out with its ReLU fused, on the accelerator when the target takes it, bit-exact on fsim."""
import importlib

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compiler
from compiler.frontend.zoo import ModelBuilder, sample_inputs
from compiler.graph import run as reference_run
from compiler.graph.ir import Graph, Node
from compiler.graph.passes import calibrate, quantize
from compiler.graph.passes.quantize import affine_as_depthwise
from host_runtime.executor import Executor

# the module (the package re-exports its function under the same name)
quantize_pass = importlib.import_module("compiler.graph.passes.quantize")


@pytest.fixture
def int8_affines(monkeypatch):
    """Batch norms as int8 depthwise convs (quantize.INT8_AFFINES, the default: kept on here)."""
    monkeypatch.setattr(quantize_pass, "INT8_AFFINES", True)


def dense_block(seed: int = 0, c1: int = 16, c2: int = 8, hw: int = 6, relu: bool = True, bias: bool = True):
    """Two convs concatenated, then batch norm (+ ReLU) before a 1x1 conv: the BN cannot fold."""
    b = ModelBuilder("dense_block", seed)
    x = b.input("image", (1, 3, hw, hw))
    a = b.op("Relu", [b.conv(x, 3, c1, name="conv_a")])
    c = b.op("Relu", [b.conv(x, 3, c2, name="conv_b")])
    y = b.op("Concat", [a, c], name="cat", axis=1)
    y = b.bn(y, c1 + c2, name="bn")
    if relu:
        y = b.op("Relu", [y], name="bn_relu")
    y = b.conv(y, c1 + c2, 16, k=1, name="conv_c", bias=bias)
    return b.build([y])


def _build(m, config="tiny"):
    feeds = sample_inputs(m, 6, seed=5)
    return compiler.build_model(m, target="accel", config=config, calibration=feeds[:4]), feeds[4:]


@pytest.mark.parametrize("relu", [True, False])
def test_unfoldable_batch_norm_is_an_int8_depthwise_conv_on_the_accelerator(relu, int8_affines):
    m = dense_block(relu=relu)
    mod, tests = _build(m)
    steps = {s.name: s for s in mod.steps}
    assert steps["bn"].op == ("qconv2d+relu" if relu else "qconv2d"), steps["bn"]
    assert steps["bn"].kind == "accel", mod.meta["partition"]
    assert not any(s.op.split("+")[0] in ("mul", "add", "batch_norm", "dequantize") for s in mod.steps[:-1])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in tests:
        with Executor(mod, driver="fsim") as ex:
            outs = ex.run(feeds, keep=True)
        _, env = reference_run(mod.graph, feeds, keep=True)
        ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
        assert ("bn_relu" if relu else "bn") in ex.values
        for k in ex.values:
            if k in ints:
                np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=k)
        got, want = next(iter(outs.values())).ravel(), sess.run(None, feeds)[0].ravel()
        assert got @ want / (np.linalg.norm(got) * np.linalg.norm(want)) >= 0.99


@settings(max_examples=15, deadline=None)
@given(c=st.integers(1, 40), hw=st.integers(1, 5), lone_mul=st.booleans(), zero=st.booleans(), seed=st.integers(0, 99))
def test_affine_as_depthwise_computes_the_same_float(c, hw, lone_mul, zero, seed):
    rng = np.random.default_rng(seed)
    x = Node.input("x", (2, c, hw, hw), "float32")
    g = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
    if zero:
        g[0, 0] = 0
    y = Node("mul", [x, Node.const(g, name="g")], name="m")
    if not lone_mul:
        y = Node("add", [Node.const(rng.standard_normal((c, 1, 1)).astype(np.float32), name="beta"), y], name="bn")
    out = Node("relu", [y], name="r")
    graph = Graph.from_outputs([x], [out])
    new, scales = affine_as_depthwise(graph)
    convs = [n for n in new.ops if n.op == "conv2d"]
    assert len(convs) == 1 and convs[0].attrs["groups"] == c and not any(n.op in ("mul", "add") for n in new.ops)
    assert np.all(scales[convs[0].inputs[1].name] > 0)
    feed = rng.standard_normal((2, c, hw, hw)).astype(np.float32)
    np.testing.assert_allclose(reference_run(new, {"x": feed})[0], reference_run(graph, {"x": feed})[0],
                               rtol=1e-5, atol=1e-5)


def test_affine_as_depthwise_leaves_other_products_alone():
    x = Node.input("x", (1, 4, 3, 3), "float32")
    z = Node.input("z", (1, 4, 3, 3), "float32")
    spatial = Node("mul", [x, Node.const(np.ones((1, 1, 3, 3), np.float32), name="s")], name="spatial")
    both = Node("mul", [spatial, z], name="both")
    shared = Node("mul", [both, Node.const(np.ones((1, 4, 1, 1), np.float32), name="g")], name="shared")
    out1 = Node("add", [shared, Node.const(np.ones((1, 4, 1, 1), np.float32), name="b")], name="out1")
    graph = Graph.from_outputs([x, z], [out1, shared])
    new, _ = affine_as_depthwise(graph)
    ops = [n.op for n in new.ops]
    # the shared multiply (two users) becomes a lone depthwise conv; the add after it stays an add
    assert ops.count("mul") == 2 and ops.count("conv2d") == 1 and ops.count("add") == 1, ops


@settings(max_examples=20, deadline=None)
@given(c=st.integers(1, 20), h=st.integers(2, 7), k=st.integers(1, 3), s=st.integers(1, 3), pad=st.integers(0, 1),
       incl=st.integers(0, 1), ceil=st.integers(0, 1), glob=st.booleans(), seed=st.integers(0, 99))
def test_average_pools_as_depthwise_compute_the_same_float(c, h, k, s, pad, incl, ceil, glob, seed):
    k, pad = min(k, h), min(pad, k - 1)
    x = Node.input("x", (1, c, h, h + 1), "float32")
    if glob:
        y = Node("global_avg_pool", [x], name="p")
    else:
        y = Node("avg_pool2d", [x], {"kernel": (k, k), "strides": (s, s), "pads": (pad,) * 4, "ceil_mode": ceil,
                                     "count_include_pad": incl}, name="p")
    graph = Graph.from_outputs([x], [Node("relu", [y], name="r")])
    new, scales = affine_as_depthwise(graph)
    convs = [n for n in new.ops if n.op == "conv2d"]
    assert len(convs) <= 1 and (convs or not glob)
    feed = np.random.default_rng(seed).standard_normal((1, c, h, h + 1)).astype(np.float32)
    np.testing.assert_allclose(reference_run(new, {"x": feed})[0], reference_run(graph, {"x": feed})[0],
                               rtol=1e-5, atol=1e-5)
    if not glob and pad and not incl:
        assert not convs   # border windows divide by fewer elements: stays a pool


def test_average_pools_run_int8_on_the_accelerator():
    """DenseNet's transition (conv, 2x2 average pool) and head (global average pool): int8 depthwise
    convs on the accelerator, bit-exact on fsim, near onnxruntime."""
    b = ModelBuilder("transition", 3)
    x = b.input("image", (1, 3, 8, 8))
    y = b.op("Relu", [b.conv(x, 3, 16, name="conv_a")])
    y = b.conv(y, 16, 16, k=1, name="conv_t")
    y = b.op("AveragePool", [y], name="avg", kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("Relu", [b.conv(y, 16, 16, name="conv_b")])
    y = b.op("GlobalAveragePool", [y], name="gap")
    m = b.build([y])
    mod, tests = _build(m)
    steps = {s.name: s for s in mod.steps}
    assert steps["avg"].kind == "accel" and steps["gap"].kind == "accel", mod.meta["partition"]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in tests:
        with Executor(mod, driver="fsim") as ex:
            outs = ex.run(feeds, keep=True)
        _, env = reference_run(mod.graph, feeds, keep=True)
        for k in ("avg", "gap"):
            np.testing.assert_array_equal(ex.values[k], env[id(mod.graph.find(k))], err_msg=k)
        got, want = next(iter(outs.values())).ravel(), sess.run(None, feeds)[0].ravel()
        assert got @ want / (np.linalg.norm(got) * np.linalg.norm(want)) >= 0.99


def test_channel_epilogues_go_to_the_accelerator_past_the_depthwise_waste_rule(int8_affines):
    """On the default config (block 16) a real depthwise conv wastes too much of the core to go
    there, but an affine or average pool as a depthwise conv costs the core no more than an ALU
    pass would: placed on the accelerator, and bit-exact there."""
    m = dense_block(c1=32, c2=16, hw=4)
    mod, tests = _build(m, "default")
    steps = {s.name: s for s in mod.steps}
    assert steps["bn"].kind == "accel" and not mod.meta["fallbacks"], mod.meta["partition"]
    _, env = reference_run(mod.graph, tests[0], keep=True)
    for driver in ("fsim", "tsim"):
        with Executor(mod, driver=driver) as ex:
            ex.run(tests[0], keep=True)
        np.testing.assert_array_equal(ex.values["bn_relu"], env[id(mod.graph.find("bn_relu"))], err_msg=driver)


def test_global_pool_too_large_to_tile_stays_on_the_cpu_without_fallback():
    """A global average pool over 40x40 needs a weight tile per tap, more than the default config's
    buffers: placement keeps it on the CPU (its int8 kernel) instead of failing at build time."""
    b = ModelBuilder("gap", 1)
    x = b.input("image", (1, 3, 40, 40))
    y = b.op("GlobalAveragePool", [b.op("Relu", [b.conv(x, 3, 32, name="c")])], name="gap")
    mod, _ = _build(b.build([y]), "default")
    steps = {s.name: s for s in mod.steps}
    assert steps["gap"].kind == "llvm" and mod.meta["fallbacks"] == []


def test_affine_with_a_large_gain_stays_float(int8_affines):
    """A channel whose gain is large against out_scale / in_scale (tiny inputs amplified, as a
    batch norm of a nearly constant channel does) would round the int32 bias to a coarse fraction
    of an output step (the bias counts in_scale |g| / 127): that affine stays float; a mild one
    becomes the int8 conv."""
    rng = np.random.default_rng(0)
    for gain, want in ((200.0, "add"), (2.0, "qconv2d")):
        x = Node.input("x", (1, 4, 3, 3), "float32")
        g = np.array([gain, 1, 1, 1], np.float32).reshape(1, 4, 1, 1)
        y = Node("mul", [x, Node.const(g, name="g")], name="m")
        y = Node("add", [y, Node.const(np.full((1, 4, 1, 1), 0.3, np.float32), name="beta")], name="bn")
        graph = Graph.from_outputs([x], [Node("relu", [y], name="r")])
        samples = [{"x": (rng.standard_normal((1, 4, 3, 3)) * np.array([0.01, 1, 1, 1]).reshape(1, 4, 1, 1)
                          ).astype(np.float32)} for _ in range(3)]
        q = quantize(graph, calibrate(graph, samples))
        assert q.find("bn").op == want, gain
        np.testing.assert_allclose(reference_run(q, samples[0])[0], reference_run(graph, samples[0])[0], atol=0.2)


def test_batch_norms_are_int8_by_default():
    mod, _ = _build(dense_block())
    assert quantize_pass.INT8_AFFINES is True
    assert any(s.name == "bn" and s.op.startswith("qconv2d") for s in mod.steps)
