"""The nine classic vision models shipped in the onnx wheel (onnx/backend/test/data/light: AlexNet,
DenseNet-121, GoogLeNet, Inception-v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19, ZFNet-512, all
Caffe2 exports at opset 9) compile and run.

cpu target: the output equals the shipped *_output_0.pb on onnx's backend-test input (the
runner's generate_dummy_data: arange(n) / n in the input's shape) and onnxruntime's. Those models
hold every weight as ConstantOfShape(0.02), which makes the shipped output a uniform softmax, so
each model is also run with the same graph and seeded random weights against onnxruntime: that
is what checks the converters (LRN, Sum, grouped and padded convs, ceil-mode pools, Dropout);
their batch-norm statistics are set from a sample, as training would leave them.
accel target (int8, calibrated on two samples, run on fsim): SqueezeNet, AlexNet and ResNet-50,
by cosine of the logits against onnxruntime.

A build takes 5 s (SqueezeNet) to 2 minutes (VGG-19) on one core, so only SqueezeNet runs by
default; the rest are marked slow (pytest -m slow).
"""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import compiler
from host_runtime.executor import Executor

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
          "squeezenet", "vgg19", "zfnet512"]
FAST = {"squeezenet"}
#: model -> least cosine of the int8 logits against onnxruntime. ResNet-50 with random weights is
#: looser: its BN layers (statistics from a sample) lift channels of small variance, and their int8
#: noise, to unit scale, 16 residual blocks deep (0.972 measured; SqueezeNet 0.9995, AlexNet 0.9986)
ACCEL = {"squeezenet": 0.99, "bvlc_alexnet": 0.99, "resnet50": 0.95}


def _param(name):
    return pytest.param(name, marks=() if name in FAST else pytest.mark.slow, id=name)


def model_path(name):
    return os.path.join(LIGHT, f"light_{name}.onnx")


def backend_test_input(m):
    """The input onnx's backend test runner feeds light models (generate_dummy_data, random=False)."""
    inits = {t.name for t in m.graph.initializer}
    feeds = {}
    for x in m.graph.input:
        if x.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in x.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        feeds[x.name] = (np.arange(n).reshape(shape) / n).astype(np.float32)
    return feeds


def with_random_weights(m, seed=0, logits=False):
    """The model with every ConstantOfShape weight replaced by a seeded random initializer: He-scaled
    normal for conv/dense weights, 0.5..1.5 for batch-norm scales and variances (and the densenet's
    unsqueezed scales), small normal for biases and means. logits: the final Softmax becomes an
    Identity (int8 error is judged on the logits, not on a near one-hot softmax)."""
    rng = np.random.default_rng(seed)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    uses = {}
    for n in m.graph.node:
        for k, i in enumerate(n.input):
            uses.setdefault(i, []).append((n.op_type, k))
    out = onnx.ModelProto()
    out.CopyFrom(m)
    del out.graph.node[:]
    for n in m.graph.node:
        if logits and n.op_type == "Softmax" and n.output[0] in {o.name for o in m.graph.output}:
            out.graph.node.append(onnx.helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name))
            continue
        if n.op_type != "ConstantOfShape" or n.input[0] not in inits:
            out.graph.node.append(n)
            continue
        shape = tuple(int(d) for d in inits[n.input[0]])
        use = uses.get(n.output[0], [])
        if len(shape) >= 2:
            v = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        elif any(u in (("BatchNormalization", 1), ("BatchNormalization", 4), ("Unsqueeze", 0)) for u in use):
            v = rng.uniform(0.5, 1.5, shape)
        else:
            v = rng.standard_normal(shape) * 0.1
        out.graph.initializer.append(numpy_helper.from_array(v.astype(np.float32), n.output[0]))
        if m.ir_version < 4:   # IR 3: every initializer is a graph input too
            out.graph.input.append(onnx.helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, shape))
    return out


def normalize_batch_norms(m, feeds):
    """Set every BatchNormalization's mean and variance to the statistics of its input on `feeds`
    (as training leaves them), so that activations keep their scale through deep residual stacks
    instead of growing ~sqrt(2) per block with random weights (int8 then saturates). One
    onnxruntime run of a probe model whose BNs normalize by the data's own per-channel statistics
    (4-D inputs: axes N, H, W) and which outputs every BN input."""
    helper = onnx.helper
    bns = {n.output[0]: n for n in m.graph.node if n.op_type == "BatchNormalization"}
    if not bns:
        return m
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    del probe.graph.node[:]
    for k, n in enumerate(m.graph.node):
        if n.output[0] not in bns:
            probe.graph.node.append(n)
            continue
        x, s, b = n.input[:3]
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
        t = [f"_bn{k}_{i}" for i in range(9)]
        probe.graph.node.extend([
            helper.make_node("ReduceMean", [x], [t[0]], axes=[0, 2, 3]),
            helper.make_node("Sub", [x, t[0]], [t[1]]),
            helper.make_node("Mul", [t[1], t[1]], [t[2]]),
            helper.make_node("ReduceMean", [t[2]], [t[3]], axes=[0, 2, 3]),
            helper.make_node("Constant", [], [t[4]], value=numpy_helper.from_array(np.float32(eps))),
            helper.make_node("Add", [t[3], t[4]], [t[5]]),
            helper.make_node("Sqrt", [t[5]], [t[6]]),
            helper.make_node("Div", [t[1], t[6]], [t[7]]),
            helper.make_node("Unsqueeze", [s], [t[8]], axes=[1, 2]),
            helper.make_node("Mul", [t[7], t[8]], [t[8] + "s"]),
            helper.make_node("Unsqueeze", [b], [t[8] + "b"], axes=[1, 2]),
            helper.make_node("Add", [t[8] + "s", t[8] + "b"], [n.output[0]])])
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n.input[0]) for n in bns.values()
                              if n.input[0] not in have)
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    vals = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    stats = {}
    for n in bns.values():
        x = vals[n.input[0]].astype(np.float64)
        var = x.var(axis=(0, 2, 3))
        stats[n.input[3]] = x.mean(axis=(0, 2, 3))
        stats[n.input[4]] = var + 0.01 * np.median(var) + 1e-6   # channels ReLU left constant: no 1/sqrt(0) gain
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for t in out.graph.initializer:
        if t.name in stats:
            t.CopyFrom(numpy_helper.from_array(stats[t.name].astype(np.float32), t.name))
    return out


def ort_run(m, feeds):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def assert_close(got, want, rtol=1e-4):
    got = np.asarray(got).reshape(want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max()))


@pytest.mark.parametrize("name", [_param(n) for n in MODELS])
def test_light_model_cpu_matches_shipped_output_and_onnxruntime(name):
    path = model_path(name)
    m = onnx.load(path)
    feeds = backend_test_input(m)
    want = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    mod = compiler.build_model(path, target="cpu")
    assert mod.meta["fallbacks"] == [], mod.meta["fallbacks"]
    outs, _ = mod.run(feeds)
    got = next(iter(outs.values()))
    assert_close(got, want)
    assert_close(got, ort_run(m, feeds)[0])


@pytest.mark.parametrize("name", [_param(n) for n in MODELS])
def test_light_model_cpu_with_random_weights_matches_onnxruntime(name):
    m = with_random_weights(onnx.load(model_path(name)))
    rng = np.random.default_rng(1)
    feeds, sample = ({k: rng.standard_normal(v.shape).astype(np.float32) for k, v in backend_test_input(m).items()}
                     for _ in range(2))
    m = normalize_batch_norms(m, sample)
    want = ort_run(m, feeds)[0]
    assert want.std() > 1e-4 * np.abs(want).max(), "degenerate output: the check would be weak"
    mod = compiler.build_model(m, target="cpu")
    assert mod.meta["fallbacks"] == [], mod.meta["fallbacks"]
    outs, _ = mod.run(feeds)
    assert_close(next(iter(outs.values())), want)


@pytest.mark.parametrize("name", [_param(n) for n in ACCEL])
def test_light_model_accel_on_fsim_near_onnxruntime(name):
    """int8 on the accelerator (calibrated on two samples), run on the functional simulator."""
    m = with_random_weights(onnx.load(model_path(name)), logits=True)
    shape = next(iter(backend_test_input(m).values())).shape
    key = next(iter(backend_test_input(m)))
    rng = np.random.default_rng(2)
    samples = [{key: rng.standard_normal(shape).astype(np.float32)} for _ in range(3)]
    m = normalize_batch_norms(m, samples[0])
    mod = compiler.build_model(m, target="accel", calibration=samples[:2])
    assert mod.count("accel") >= 1, mod.meta["partition"]
    with Executor(mod, driver="fsim") as ex:
        got = next(iter(ex.run(samples[2]).values()))
    want = ort_run(m, samples[2])[0]
    assert cosine(got, want) >= ACCEL[name], cosine(got, want)
