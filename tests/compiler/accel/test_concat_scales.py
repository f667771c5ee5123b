"""A batch norm after a concat (DenseNet's pre-activation, any net with an affine after a concat):
the concat's int8 keeps each input at its own scale (a scale per channel) when only depthwise convs
(the affines) and other such concats read it, so a small-range input is not rounded to the
coarsest input's step before the batch norm's large gain amplifies it; the affines run as int8
depthwise convs on the accelerator, bit-exact against the int8 reference, near onnxruntime."""
import importlib

import numpy as np
import onnxruntime as ort
import pytest

import compiler
from compiler.frontend import from_onnx
from compiler.frontend.zoo import ModelBuilder, sample_inputs
from compiler.graph import run as reference_run
from compiler.graph.ir import Graph, Node
from compiler.graph.passes import Calibration, calibrate, eliminate_dead_code, infer_types, optimize, quantize
from compiler.graph.passes.fold_batchnorm import fold_batchnorm
from compiler.graph.passes.quantize import affine_as_depthwise, channel_scaled_concats
from host_runtime.executor import Executor

# the module (the package re-exports its function under the same name)
quantize_pass = importlib.import_module("compiler.graph.passes.quantize")


def _bn(b, x, std, name):
    """A batch norm normalizing channels of standard deviation std (as training leaves it)."""
    c = len(std)
    ps = [np.ones(c), np.full(c, 0.1), np.zeros(c), np.asarray(std, np.float64) ** 2]
    return b.op("BatchNormalization", [x] + [b.init(p.astype(np.float32)) for p in ps], name=name, epsilon=1e-5)


def dense_block(seed=0, small=1 / 200, hw=6, c=8, extra_consumer=False):
    """x -> two conv branches (one of small range) -> cat1 -> bn1 -> relu -> 1x1 -> 3x3 (small) ->
    cat2 = concat(cat1, it) -> bn2 -> relu -> 1x1 conv: cat1 has two readers (bn1 and cat2).
    extra_consumer: cat2 is also read by a plain conv (its int8 then needs one scale)."""
    b = ModelBuilder("concat_bn", seed)
    x = b.input("image", (1, 3, hw, hw))
    a = b.op("Relu", [b.conv(x, 3, c, name="conv_a")], name="relu_a")
    w = b.init((b.rng.standard_normal((c, 3, 3, 3)) * small).astype(np.float32))
    s = b.op("Relu", [b.op("Conv", [x, w], name="conv_b", kernel_shape=[3, 3], pads=[1] * 4)], name="relu_b")
    cat1 = b.op("Concat", [a, s], name="cat1", axis=1)
    std1 = [0.6] * c + [0.6 * small * 3] * c
    y = b.op("Relu", [_bn(b, cat1, std1, "bn1")], name="bn1_relu")
    y = b.op("Relu", [b.conv(y, 2 * c, 2 * c, k=1, name="conv_1x1")], name="relu_1x1")
    w3 = b.init((b.rng.standard_normal((c, 2 * c, 3, 3)) * small * 0.3).astype(np.float32))
    z = b.op("Conv", [y, w3], name="conv_3x3", kernel_shape=[3, 3], pads=[1] * 4)
    cat2 = b.op("Concat", [cat1, z], name="cat2", axis=1)
    y = b.op("Relu", [_bn(b, cat2, std1 + [small * 2] * c, "bn2")], name="bn2_relu")
    outs = [b.conv(y, 3 * c, c, k=1, name="conv_out")]
    if extra_consumer:
        outs.append(b.conv(cat2, 3 * c, c, k=1, name="conv_raw"))
    return b.build(outs)


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _cos(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("config", ["tiny", "default"])
def test_concat_before_batch_norm_keeps_input_scales_and_is_exact(config):
    m = dense_block(c=16 if config == "default" else 8)
    feeds = sample_inputs(m, 5, seed=3)
    mod = compiler.build_model(m, target="accel", config=config, calibration=feeds[:3])
    g = mod.graph
    assert not [n.name for n in g.nodes if n.op in ("requantize", "mul", "add", "dequantize")
                and "conv_out" not in n.name], "the concat inputs are rounded or an affine runs in float"
    steps = {s.name: s for s in mod.steps}
    for bn in ("bn1", "bn2"):
        assert steps[bn].kind == "accel" and steps[bn].op == "qconv2d+relu", steps[bn]
    assert not mod.meta["fallbacks"], mod.meta["fallbacks"]
    for feed in feeds[3:]:
        _, env = reference_run(g, feed, keep=True)
        with Executor(mod, driver="fsim") as ex:
            outs = ex.run(feed, keep=True)
        checked, by_name = 0, {n.name: n for n in g.nodes}
        for name, v in ex.values.items():   # every int8 tensor the run kept, bit-exact
            node = by_name.get(name)
            if node is not None and node.dtype == "int8" and id(node) in env:
                np.testing.assert_array_equal(np.asarray(v).reshape(env[id(node)].shape), env[id(node)], err_msg=name)
                checked += 1
        assert checked >= 4, sorted(ex.values)
        assert _cos(next(iter(outs.values())), _ort(m, feed)[0]) >= 0.99


def test_one_coarse_scale_would_lose_the_small_input(monkeypatch):
    """The same graph with its concats at their coarsest input's scale (as before) loses the small
    branch: what the per-channel scales buy, measured on the int8 reference."""
    m = dense_block()
    feeds = sample_inputs(m, 4, seed=3)
    want = _ort(m, feeds[3])[0]
    g = optimize(from_onnx(m), quantize=True, calibration_samples=feeds[:3])
    assert any(n.op == "concat" for n in g.nodes) and not any(n.op == "requantize" for n in g.nodes)
    assert _cos(reference_run(g, feeds[3])[0], want) >= 0.995
    monkeypatch.setattr(quantize_pass, "channel_scaled_concats", lambda graph, cal: set())
    coarse = optimize(from_onnx(m), quantize=True, calibration_samples=feeds[:3])
    assert _cos(reference_run(coarse, feeds[3])[0], want) < 0.97


def test_concat_with_another_reader_takes_one_scale():
    """cat2 also feeds a plain conv: its inputs, and cat1's, share one scale, as before."""
    m = dense_block(extra_consumer=True, small=1 / 40)
    feeds = sample_inputs(m, 4, seed=3)
    graph = from_onnx(m)
    g = optimize(graph, quantize=True, calibration_samples=feeds[:3])
    names = channel_scaled_concats(affine_as_depthwise(optimize(graph))[0], Calibration())
    assert names == set(), names   # cat2 feeds a plain conv, cat1 feeds cat2: both take one scale
    outs = reference_run(g, feeds[3])
    for got, want in zip(outs, _ort(m, feeds[3])):
        assert _cos(got, want) >= 0.98


def test_channel_scaled_concats_rules():
    x = Node.input("x", (1, 4, 3, 3), "float32")
    y = Node.input("y", (1, 4, 3, 3), "float32")
    cat = Node("concat", [x, y], {"axis": 1}, name="cat")
    dw = Node("conv2d", [cat, Node.const(np.ones((8, 1, 1, 1), np.float32), name="w")], {"groups": 8}, name="dw")
    full = Node("conv2d", [cat, Node.const(np.ones((2, 8, 1, 1), np.float32), name="w2")], name="full")
    only_dw = infer_types(Graph.from_outputs([x, y], [dw]))
    assert channel_scaled_concats(only_dw, Calibration()) == {"cat"}
    both = infer_types(Graph.from_outputs([x, y], [dw, full]))
    assert channel_scaled_concats(both, Calibration()) == set()
    out = infer_types(Graph.from_outputs([x, y], [dw, cat]))   # a graph output needs one scale
    assert channel_scaled_concats(out, Calibration()) == set()


def test_scale_layer_after_conv_folds_into_it():
    """conv -> per-channel mul -> per-channel add (Caffe's Scale after a folded batch norm) becomes
    one conv with the same float result; a mul by a full tensor or a shared conv is left alone."""
    rng = np.random.default_rng(0)
    x = Node.input("x", (1, 3, 5, 5), "float32")
    conv = Node("conv2d", [x, Node.const(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), name="w"),
                           Node.const(rng.standard_normal(4).astype(np.float32), name="b")], {"pads": (1, 1, 1, 1)},
                name="c")
    g = Node.const(rng.uniform(0.5, 1.5, (4, 1, 1)).astype(np.float32), name="g")
    beta = Node.const(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), name="beta")
    y = Node("add", [Node("mul", [conv, g], name="m"), beta], name="a")
    graph = infer_types(Graph.from_outputs([x], [Node("relu", [y], name="r")]))
    folded = eliminate_dead_code(fold_batchnorm(graph))
    assert [n.op for n in folded.nodes if not n.is_const and n.op != "input"] == ["conv2d", "relu"]
    feed = {"x": rng.standard_normal((1, 3, 5, 5)).astype(np.float32)}
    np.testing.assert_allclose(reference_run(folded, feed)[0], reference_run(graph, feed)[0], rtol=1e-5, atol=1e-5)
    shared = infer_types(Graph.from_outputs([x], [Node("mul", [conv, g], name="m2"), conv]))
    assert any(n.op == "mul" for n in eliminate_dead_code(fold_batchnorm(shared)).nodes)


def test_quantized_affine_reads_per_channel_steps():
    """quantize() directly: concat of two inputs of different scales -> affine -> relu: the concat
    carries no requantize and the affine is one int8 depthwise conv with per-channel multipliers."""
    rng = np.random.default_rng(1)
    x = Node.input("x", (1, 4, 3, 3), "float32")
    y = Node.input("y", (1, 4, 3, 3), "float32")
    cat = Node("concat", [x, y], {"axis": 1}, name="cat")
    g = np.concatenate([np.full(4, 1.0), np.full(4, 50.0)]).reshape(1, 8, 1, 1).astype(np.float32)
    a = Node("add", [Node("mul", [cat, Node.const(g, name="g")], name="m"),
                     Node.const(np.full((1, 8, 1, 1), 0.1, np.float32), name="beta")], name="bn")
    graph = infer_types(Graph.from_outputs([x, y], [Node("relu", [a], name="r")]))
    samples = [{"x": rng.standard_normal((1, 4, 3, 3)).astype(np.float32),
                "y": (rng.standard_normal((1, 4, 3, 3)) / 50).astype(np.float32)} for _ in range(4)]
    q = quantize(graph, calibrate(graph, samples[:3]))
    assert q.find("bn").op == "qconv2d" and len(q.find("bn").inputs) == 4
    assert not any(n.op == "requantize" for n in q.nodes)
    # a calibrated sample: a held-out one may pass the ReLU's exact range and saturate
    got, want = reference_run(q, samples[2])[0], reference_run(graph, samples[2])[0]
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()


def test_concat_of_a_cpu_result_and_an_accelerator_result_is_planned_in_place():
    """A concat input computed on the CPU (a 3-channel stem conv, which wastes the core) is packed
    into its slice of the concat's buffer: no concat step runs, and the result stays exact."""
    b = ModelBuilder("cpu_concat", 2)
    x = b.input("image", (1, 3, 8, 8))
    a = b.op("Relu", [b.conv(x, 3, 16, name="stem")], name="stem_relu")
    y = b.conv(a, 16, 16, name="conv_b")
    cat = b.op("Concat", [a, y], name="cat", axis=1)
    out = b.conv(b.op("Relu", [_bn(b, cat, [0.5] * 16 + [0.3] * 16, "bn")], name="bn_relu"), 32, 16, k=1, name="head")
    m = b.build([out])
    feeds = sample_inputs(m, 4, seed=1)
    mod = compiler.build_model(m, target="accel", config="default", calibration=feeds[:3])
    steps = {s.name: s for s in mod.steps}
    assert steps["stem"].kind != "accel" and steps["conv_b"].kind == "accel", mod.meta["partition"]
    assert "cat" not in steps and "cat" in mod.graph.meta["memory_plan"].elided
    g = mod.graph
    _, env = reference_run(g, feeds[3], keep=True)
    with Executor(mod, driver="fsim") as ex:
        outs = ex.run(feeds[3], keep=True)
    by_name = {n.name: n for n in g.nodes}
    for name in ("bn_relu", "head"):
        node = by_name[name] if name in by_name else None
        if node is not None and name in ex.values:
            np.testing.assert_array_equal(np.asarray(ex.values[name]).reshape(env[id(node)].shape), env[id(node)])
    np.testing.assert_allclose(next(iter(outs.values())), reference_run(g, feeds[3])[0], rtol=0, atol=0)
    assert _cos(next(iter(outs.values())), _ort(m, feeds[3])[0]) >= 0.99


def _uneven_block(seed=4, c=8, hw=6):
    """A conv whose output channels span ranges 1 .. 1/300, concatenated with another conv, then a
    batch norm that normalizes every channel (as training leaves it), ReLU and a 1x1 conv."""
    b = ModelBuilder("uneven", seed)
    x = b.input("image", (1, 3, hw, hw))
    gains = np.geomspace(1.0, 1 / 300, c)
    w = (b.rng.standard_normal((c, 3, 3, 3)) * 0.4 * gains.reshape(-1, 1, 1, 1)).astype(np.float32)
    u = b.op("Conv", [x, b.init(w)], name="conv_u", kernel_shape=[3, 3], pads=[1] * 4)
    v = b.op("Relu", [b.conv(x, 3, c, name="conv_v")], name="relu_v")
    cat = b.op("Concat", [u, v], name="cat", axis=1)
    y = b.op("Relu", [_bn(b, cat, list(gains * 1.2) + [0.6] * c, "bn")], name="bn_relu")
    return b.build([b.conv(y, 2 * c, c, k=1, name="head")])


def test_conv_read_by_a_channel_concat_writes_a_scale_per_channel(monkeypatch):
    """conv_u's channels differ 300x in range; it writes each at its own step (per-channel
    multipliers, each channel's weights at their own power of two), so the batch norm after the
    concat sees every channel at full precision."""
    m = _uneven_block()
    feeds = sample_inputs(m, 4, seed=3)
    want = _ort(m, feeds[3])[0]
    g = optimize(from_onnx(m), quantize=True, calibration_samples=feeds[:3])
    assert len(g.find("conv_u").inputs) == 4, "per-channel multipliers expected"
    wq = g.find("conv_u").inputs[1].value.reshape(8, -1)   # each channel's weights at its own step
    assert np.abs(wq).max(axis=1).min() >= 64, np.abs(wq).max(axis=1)
    fine = _cos(reference_run(g, feeds[3])[0], want)
    monkeypatch.setattr(quantize_pass, "CHANNEL_OUTPUTS", False)
    coarse = optimize(from_onnx(m), quantize=True, calibration_samples=feeds[:3])
    assert len(coarse.find("conv_u").inputs) == 3
    assert fine >= 0.995 and _cos(reference_run(coarse, feeds[3])[0], want) < fine - 0.01
    monkeypatch.undo()
    # forced: on the tiny core a 3-channel conv loses to the board's CPU by the cost rule
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:3],
                               force_target={"Conv": "accel"})
    steps = {s.name: s for s in mod.steps}
    assert steps["conv_u"].kind == "accel" and not mod.meta["fallbacks"]
    with Executor(mod, driver="fsim") as ex:
        got = next(iter(ex.run(feeds[3]).values()))
    np.testing.assert_array_equal(got, reference_run(mod.graph, feeds[3])[0])


def test_batch_norm_after_a_residual_add_runs_int8_on_the_accelerator():
    """Pre-activation residual block (add -> BN -> ReLU -> conv): the batch norm is an int8
    depthwise conv after the add, on the accelerator, bit-exact, near onnxruntime."""
    b = ModelBuilder("preact", 3)
    x = b.input("image", (1, 3, 8, 8))
    a = b.op("Relu", [b.conv(x, 3, 16, name="conv_a")], name="relu_a")
    r = b.conv(b.op("Relu", [b.conv(a, 16, 16, name="conv_b")], name="relu_b"), 16, 16, name="conv_c")
    s = b.op("Add", [a, r], name="res")
    y = b.op("Relu", [_bn(b, s, list(np.linspace(0.3, 1.5, 16)), "bn")], name="bn_relu")
    m = b.build([b.conv(y, 16, 16, k=1, name="head")])
    feeds = sample_inputs(m, 5, seed=2)
    mod = compiler.build_model(m, target="accel", config="default", calibration=feeds[:3])
    steps = {s.name: s for s in mod.steps}
    assert steps["bn"].kind == "accel" and steps["bn"].op == "qconv2d+relu", steps.get("bn")
    assert not mod.meta["fallbacks"], mod.meta["fallbacks"]
    for feed in feeds[3:]:
        with Executor(mod, driver="fsim") as ex:
            got = next(iter(ex.run(feed).values()))
        np.testing.assert_array_equal(got, reference_run(mod.graph, feed)[0])
        assert _cos(got, _ort(m, feed)[0]) >= 0.99


def _chained_depthwise(seed=0):
    """conv (channels of very different ranges) -> relu -> max pool -> depthwise 3x3 -> relu ->
    global average pool -> fc: the depthwise conv reads a scale per channel (the conv's) and writes
    one per channel (the pool, a depthwise conv too, absorbs it)."""
    b = ModelBuilder("chained_depthwise", seed)
    x = b.input("x", (1, 16, 6, 6))
    gains = np.geomspace(1.0, 1 / 50, 16).reshape(-1, 1, 1, 1)
    w = (b.rng.standard_normal((16, 16, 1, 1)) * 0.3 * gains).astype(np.float32)
    y = b.op("Relu", [b.op("Conv", [x, b.init(w)], name="conv0", kernel_shape=[1, 1])], name="relu0")
    y = b.op("MaxPool", [y], name="pool1", kernel_shape=[2, 2], strides=[2, 2])
    wd = (b.rng.standard_normal((16, 1, 3, 3)) / gains[::-1] * 0.3).astype(np.float32)
    y = b.op("Relu", [b.op("Conv", [y, b.init(wd)], name="dw2", kernel_shape=[3, 3], group=16)], name="relu2")
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y], name="gap")], name="flat")
    return b.build([b.op("Gemm", [y, b.weight((5, 16)), b.init(np.zeros(5, np.float32))], name="fc", transB=1)])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_depthwise_reading_and_writing_channel_scales_keeps_its_input_steps(seed):
    """The depthwise conv's multipliers carry both its input's per-channel steps and its output's:
    dropping the input's (as channel_weights alone gives) scales every channel wrongly, which only
    onnxruntime, not the int8 reference, can see."""
    m = _chained_depthwise(seed)
    feeds = sample_inputs(m, 4, seed=3)
    g = optimize(from_onnx(m), quantize=True, calibration_samples=feeds)
    # conv0 and dw2, each fused with its ReLU, carry per-channel multipliers (a fourth input)
    assert len(g.find("relu2").inputs) == 4 and len(g.find("relu0").inputs) == 4, "per-channel scales expected"
    for f in feeds:
        assert _cos(reference_run(g, f)[0], _ort(m, f)[0]) >= 0.99
