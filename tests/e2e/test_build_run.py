"""End to end: ONNX models built with onnx.helper -> compiler.build_model -> file -> host_runtime executor,
against onnxruntime (the oracle) and the graph interpreter's int8 reference (bit for bit)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.frontend import zoo
from compiler.graph import run as reference_run
from compiler.graph_build import BuildError
from compiler.module import CompiledModule, ModuleFormatError
from host_runtime import Device
from host_runtime.executor import FORMAT_VERSION, MAGIC, Executor, ExecutorError, format_profile

NETS = sorted(zoo.MODELS)


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def ort_run(model, feeds, fuse_qdq: bool = True):
    """onnxruntime's outputs; fuse_qdq=False runs a QDQ model as written (DequantizeLinear, the
    float op, QuantizeLinear) instead of its fused int8 kernels."""
    so = ort.SessionOptions()
    if not fuse_qdq:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.fixture(scope="module", params=NETS)
def net(request):
    m = zoo.MODELS[request.param]()
    feeds = zoo.sample_inputs(m, 6, seed=11)
    return request.param, m, feeds[:4], feeds[4:]


def test_e2e_cpu_target_matches_onnxruntime(net):
    name, m, _, tests = net
    mod = compiler.build(m, target="cpu")
    assert mod.target == "cpu" and mod.count("llvm") >= 1 and mod.count("accel") == 0
    for feeds in tests:
        outs, profile = mod.run(feeds)
        ref = ort_run(m, feeds)
        for got, want in zip(outs.values(), ref):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        assert all(r["target"] == "cpu" and r["time_s"] >= 0 for r in profile)
    assert sum(r["macs"] for r in profile) > 0 or name == "mlp"


def _run_bit_exact(mod, feeds, name):
    """Run on fsim; every int8 tensor the module computed must equal the int8 reference bit for
    bit. Returns (first output, reference outputs, executor)."""
    with Executor(mod, driver="fsim") as ex:
        outs = ex.run(feeds, keep=True)
    ref_out, env = reference_run(mod.graph, feeds, keep=True)
    ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
    checked = [k for k in ex.values if k in ints]
    assert len(checked) >= mod.count("accel")
    for k in checked:
        np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=f"{name}: int8 tensor {k}")
    return next(iter(outs.values())), ref_out, ex


@pytest.mark.parametrize("config", ["tiny"])
def test_e2e_accel_target_bit_exact_and_within_quantization_error(net, config):
    name, m, calib, tests = net
    mod = compiler.build_model(m, target="accel", config=config, calibration=calib)
    assert mod.count("accel") >= 1, mod.meta["partition"]
    for feeds in tests:
        got, ref_out, ex = _run_bit_exact(mod, feeds, name)
        np.testing.assert_allclose(got, ref_out[0], rtol=1e-5, atol=1e-5 * np.abs(ref_out[0]).max())
        assert cosine(got, ort_run(m, feeds)[0]) >= 0.99
    accel_rows = [r for r in ex.profile if r["target"] == "accel"]
    assert accel_rows and all(r["insns"] > 0 and r["driver"] == "fsim" for r in accel_rows)
    assert sum(r["macs"] for r in accel_rows) == mod.meta["macs"]["accel"] > 0
    assert "total:" in format_profile(ex.profile, mod.config)


def test_e2e_token_ids_through_an_embedding_table():
    """A BERT-style front end: int64 token ids (an input) gather rows of an embedding table, then
    a dense layer; cpu matches onnxruntime, accel is bit-exact against the int8 reference."""
    b = zoo.ModelBuilder("embed", seed=4)
    ids = b.input("ids", (2, 8), TensorProto.INT64)
    x = b.op("Gather", [b.init(b.rng.standard_normal((50, 32)).astype(np.float32)), ids], name="embedding", axis=0)
    x = b.op("Relu", [b.linear(x, 32, 48, name="proj")], name="relu")
    m = b.build([b.op("ReduceMean", [x], name="pool", axes=[1], keepdims=0)])
    rng = np.random.default_rng(5)
    feeds = [{"ids": rng.integers(-50, 50, (2, 8)).astype(np.int64)} for _ in range(6)]
    cpu = compiler.build(m, target="cpu")
    for f in feeds[4:]:
        np.testing.assert_allclose(next(iter(cpu.run(f)[0].values())), ort_run(m, f)[0], rtol=1e-4, atol=1e-5)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:4], force_target={"qdense": "accel"})
    assert mod.count("accel") == 1
    for f in feeds[4:]:
        got, _, _ = _run_bit_exact(mod, f, "embed")
        assert cosine(got, ort_run(m, f)[0]) >= 0.99
    with pytest.raises(ExecutorError, match=r"step 'embedding' \(gather\): gather: index 50 out of range \[-50, 49\]"):
        mod.run({"ids": np.full((2, 8), 50, np.int64)})


def _dilated_head(seed: int = 3):
    """DeepLab-style: a dilated ResNet conv (dilation 2, stride 2), an ASPP over its map (a 1x1 conv
    beside 3x3 convs at dilations 6 and 18, whose pads reach past a LOAD's padding fields and past
    the map itself), a causal 1-D dilated conv (left pads only), concatenated, a 1x1 classifier."""
    b = zoo.ModelBuilder("dilated_head", seed)
    x = b.input("x", (1, 24, 26, 26))

    def conv(t, cin, cout, k, d, pads, stride=1):
        w = b.weight((cout, cin, *k))
        return b.op("Relu", [b.op("Conv", [t, w, b.init((b.rng.standard_normal(cout) * 0.1).astype(np.float32))],
                                  kernel_shape=list(k), dilations=list(d), pads=pads, strides=[stride, stride])])
    t = conv(x, 24, 32, (3, 3), (2, 2), [2] * 4, stride=2)
    outs = [conv(t, 32, 16, (1, 1), (1, 1), [0] * 4)]
    outs += [conv(t, 32, 16, (3, 3), (r, r), [r] * 4) for r in (6, 18)]
    outs.append(conv(t, 32, 16, (1, 3), (1, 4), [0, 8, 0, 0]))
    return b.build([b.conv(b.op("Concat", outs, axis=1), 64, 10, k=1)])


@pytest.mark.parametrize("config", ["tiny", "default"])
def test_e2e_dilated_convs_run_on_the_accelerator(config):
    m = _dilated_head()
    feeds = zoo.sample_inputs(m, 4, seed=2)
    mod = compiler.build_model(m, target="accel", config=config, calibration=feeds[:2])
    convs = [r for r in mod.meta["partition"] if r["op"] == "qconv2d"]
    assert len(convs) == 6 and all(r["target"] == "accel" for r in convs), convs
    assert not mod.meta["fallbacks"]
    for f in feeds[2:]:
        got, _, _ = _run_bit_exact(mod, f, "dilated_head")
        assert cosine(got, ort_run(m, f)[0]) >= 0.99


def test_e2e_pytorch_export_patterns_group_norm_max_pool_log_softmax():
    """What PyTorch's exporters emit for GroupNorm (Reshape - InstanceNormalization - Reshape),
    torch.maximum / abs, adaptive max pooling, sum pooling and log_softmax: cpu matches onnxruntime,
    accel (the convs offloaded, and on the tiny config the classifier) is bit-exact against the int8 reference and close to onnxruntime."""
    b = zoo.ModelBuilder("export_patterns", seed=6)
    x = b.input("x", (1, 3, 16, 16))
    y = b.conv(x, 3, 16, name="conv1")
    g = b.op("Reshape", [y, b.init(np.array([1, 4, -1], np.int64))], name="gn_groups")
    g = b.op("InstanceNormalization", [g, b.init(np.ones(4, np.float32)), b.init(np.zeros(4, np.float32))],
             name="gn", epsilon=1e-5)
    g = b.op("Reshape", [g, b.init(np.array([1, 16, 16, 16], np.int64))], name="gn_back")
    g = b.op("Add", [b.op("Mul", [g, b.init(b.rng.uniform(0.5, 1.5, (16, 1, 1)).astype(np.float32))]),
                     b.init((b.rng.standard_normal((16, 1, 1)) * 0.1).astype(np.float32))], name="gn_affine")
    y = b.op("Max", [g, b.op("Mul", [b.op("Abs", [g], name="abs"), b.init(np.float32(0.1))])], name="maximum")
    y = b.conv(y, 16, 32, stride=2, name="conv2")
    mx = b.op("Flatten", [b.op("GlobalMaxPool", [y], name="gmp")], name="flat")
    sm = b.op("ReduceSum", [y, b.init(np.array([2, 3], np.int64))], name="sum_pool", keepdims=0)
    z = b.op("Concat", [mx, sm], name="concat", axis=1)
    z = b.op("Gemm", [z, b.weight((4, 64)), b.init(np.zeros(4, np.float32))], name="fc", transB=1)
    m = b.build([b.op("LogSoftmax", [z], name="log_softmax", axis=-1)])
    feeds = zoo.sample_inputs(m, 6, seed=7)
    cpu = compiler.build(m, target="cpu")
    for f in feeds[4:]:
        np.testing.assert_allclose(next(iter(cpu.run(f)[0].values())), ort_run(m, f)[0], rtol=1e-4, atol=1e-4)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:4])
    assert mod.count("accel") >= 2
    for f in feeds[4:]:
        got, _, _ = _run_bit_exact(mod, f, "export_patterns")
        assert cosine(got, ort_run(m, f)[0]) >= 0.99


def test_ort_quantize_refuses_an_unknown_activation_type():
    with pytest.raises(ValueError, match=r"activations='fp8'; choose int8, uint8 or symmetric"):
        zoo.ort_quantize(zoo.mlp(), [], activations="fp8")


def _pow2_scales(qm):
    """The accelerator requantizes by shifts: round the QDQ model's scales up to powers of two, so
    onnxruntime's int8 arithmetic and ours use the same scales (ties may round differently)."""
    scales = {n.input[1] for n in qm.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    for t in qm.graph.initializer:
        if t.name in scales and t.data_type == onnx.TensorProto.FLOAT:
            s = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array((2.0 ** np.ceil(np.log2(s))).astype(np.float32), t.name))
    return qm


def _output_scale(qm) -> float:
    inits = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    out = qm.graph.output[0].name
    dq = [n for n in qm.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == out]
    return float(inits[dq[0].input[1]]) if dq else None


@pytest.mark.parametrize("name", ["conv_bn_relu_pool", "mlp"])
def test_e2e_onnxruntime_qdq_model_matches_its_int8_result(name):
    m = zoo.MODELS[name]()
    feeds = zoo.sample_inputs(m, 6, seed=2)
    qm = _pow2_scales(zoo.ort_quantize(m, feeds[:4], activations="symmetric"))
    mod = compiler.build_model(qm, target="accel", config="default",  # no calibration: the QDQ scales
                               force_target={"qdense": "accel"})  # small-batch dense is memory-bound: on by force
    assert mod.count("accel") >= 1 and not mod.meta["warnings"]
    unit = _output_scale(qm) or 1.0 / 64  # mlp ends in softmax (float): 1/64 is its last quantized step
    for f in feeds[4:]:
        got = next(iter(mod.run(f)[0].values()))
        want = ort_run(qm, f)[0]
        assert np.abs(got - want).max() <= unit * (1 + 1e-6), np.abs(got - want).max() / unit


@pytest.mark.parametrize("target", ["accel", "cpu"])
@pytest.mark.parametrize("name", ["conv_bn_relu_pool", "mlp", "residual_block"])
def test_e2e_onnxruntime_qdq_model_own_scales_match_its_int8_result(name, target):
    """The model as onnxruntime's quantizer exports it (scales that are not powers of two): its
    own int8 weights and scales, fixed-point requantization (ALU SCALE on the accelerator, int64
    CPU kernels), equal to our int8 reference bit for bit and to onnxruntime's int8 result within
    one output unit."""
    m = zoo.MODELS[name]()
    feeds = zoo.sample_inputs(m, 6, seed=2)
    qm = zoo.ort_quantize(m, feeds[:4], activations="symmetric")
    mod = compiler.build_model(qm, target=target, config="default", force_target={"qdense": "accel"})
    assert (mod.count("accel") >= 1) == (target == "accel") and not mod.meta["warnings"]
    fixed = [n for n in _all_nodes(mod.graph) if n.op in ("qconv2d", "qdense") and n.attrs.get("mul", 1) != 1]
    assert fixed, "the exported scales are not powers of two: the layers requantize in fixed point"
    _check_qdq_outputs(mod, qm, feeds[4:], name, fuse_qdq=True)


@pytest.mark.parametrize("target", ["accel", "cpu"])
def test_e2e_onnxruntime_qdq_model_leaves_unscaled_layers_float(target):
    """A linear Resize imports as one dense layer per axis; in onnxruntime's QDQ export only the
    Resize's output has a scale, so the first axis's layer has none: it runs in float (as
    onnxruntime runs what a QDQ model leaves unquantized), the second, whose input is that float
    result, too, and the output stays within one unit of onnxruntime's int8 result."""
    m = zoo.upsample_decoder()
    feeds = zoo.sample_inputs(m, 6, seed=2)
    qm = zoo.ort_quantize(m, feeds[:4])
    mod = compiler.build_model(qm, target=target, config="default")
    assert (mod.count("accel") >= 1) == (target == "accel") and not mod.meta["warnings"]
    ops = {n.name: n.op for n in _all_nodes(mod.graph)}
    assert ops["up_linear/axis2/dense"] == ops["up_linear/axis3/dense"] == "dense"
    assert [op for name, op in ops.items() if name.startswith("conv_fuse")].count("qconv2d") == 1
    unit = _output_scale(qm)
    for f in feeds[4:]:
        got = next(iter(mod.run(f)[0].values()))
        assert np.abs(got - ort_run(qm, f)[0]).max() <= unit * (1 + 1e-4)   # float32 differences of q * scale


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("activations", ["int8", "uint8"])
@pytest.mark.parametrize("target", ["accel", "cpu"])
@pytest.mark.parametrize("name", ["conv_bn_relu_pool", "mlp", "residual_block"])
def test_e2e_onnxruntime_qdq_model_asymmetric_activations(name, target, activations, per_channel):
    """onnxruntime's default export: asymmetric activations (int8 or uint8 with zero points). The
    zero points are kept: the input's folded into the bias (a padded conv reads an explicit pad with
    it), the output's added before the clamp to [-128, 127]; asymmetric adds run in float as the
    model defines them. Bit-exact against our reference, within one output unit of onnxruntime
    without its QDQ fusion (measured: 0.00 units on conv-bn-relu-pool and the residual block, 0.50
    of 1/64 on the MLP's float softmax; its fused kernels are up to 14 units from its own unfused
    result on these models, as in the per-channel test below)."""
    m = zoo.MODELS[name]()
    feeds = zoo.sample_inputs(m, 6, seed=2)
    qm = zoo.ort_quantize(m, feeds[:4], per_channel, activations)
    mod = compiler.build_model(qm, target=target, config="default", force_target={"qdense": "accel"})
    assert (mod.count("accel") >= 1) == (target == "accel") and not mod.meta["warnings"]
    zps = [n for n in _all_nodes(mod.graph) if n.attrs.get("out_zp") or n.attrs.get("zero_point")]
    assert zps, "the exported activations have zero points"
    _check_qdq_outputs(mod, qm, feeds[4:], name, fuse_qdq=False)


@pytest.mark.parametrize("target", ["accel", "cpu"])
def test_e2e_qdq_model_mixing_symmetric_and_asymmetric_activations(target):
    """A hand-written QDQ model: symmetric int8 into and out of a padded conv, then a ReLU whose
    output the model quantizes asymmetrically (its own scale, zero point -128), then a second conv
    reading that asymmetric tensor. The clamp is requantized as the model does it (in float), the
    second conv folds the zero point and pads with it: within one output unit of onnxruntime."""
    rng = np.random.default_rng(4)
    inits, nodes = [], []

    def qdq(name, scale, zp):
        inits.extend([numpy_helper.from_array(np.float32(scale), f"{name}_s"),
                      numpy_helper.from_array(np.int8(zp), f"{name}_z")])
        nodes.append(helper.make_node("QuantizeLinear", [name, f"{name}_s", f"{name}_z"], [f"{name}_q"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"]))
        return f"{name}_dq"

    def conv(name, x, xs, c, o, ws):   # int8 weights and an int32 bias at xs * ws, as onnxruntime stores them
        w = rng.integers(-127, 128, (o, c, 3, 3)).astype(np.int8)
        b = rng.integers(-2000, 2000, o).astype(np.int32)
        inits.extend([numpy_helper.from_array(w, f"{name}_wq"), numpy_helper.from_array(np.float32(ws), f"{name}_ws"),
                      numpy_helper.from_array(np.int8(0), f"{name}_wz"), numpy_helper.from_array(b, f"{name}_bq"),
                      numpy_helper.from_array(np.float32(xs * ws), f"{name}_bs"),
                      numpy_helper.from_array(np.int32(0), f"{name}_bz")])
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_wq", f"{name}_ws", f"{name}_wz"], [f"{name}_w"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_bq", f"{name}_bs", f"{name}_bz"], [f"{name}_b"]))
        nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], pads=[1, 1, 1, 1]))
        return name
    # scales like a calibrator's (round ones would make exact ties, which onnxruntime rounds to even)
    y = qdq(conv("c1", qdq("x", 0.0513, 0), 0.0513, 16, 16, 0.00417), 0.0937, 0)
    nodes.append(helper.make_node("Relu", [y], ["r"]))
    out = qdq(conv("c2", qdq("r", 0.0351, -128), 0.0351, 16, 16, 0.00293), 0.0811, 0)
    g = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 6, 6])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 16, 6, 6])], inits)
    qm = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    mod = compiler.build_model(qm, target=target, config="default")
    assert (mod.count("accel") >= 1) == (target == "accel") and not mod.meta["warnings"]
    for seed in range(3):
        # inside x's range: symmetric int8 saturates at -127 here, at -128 in onnxruntime
        f = {"x": np.random.default_rng(seed).normal(0, 1, (1, 16, 6, 6)).astype(np.float32)}
        got, _, _ = _run_bit_exact(mod, f, "mixed")
        want = ort_run(qm, f, False)[0]
        assert np.abs(got - want).max() <= 0.0811 * (1 + 1e-5), np.abs(got - want).max() / 0.0811


@pytest.mark.parametrize("name", ["conv_bn_relu_pool"])
def test_e2e_asymmetric_activations_at_power_of_two_scales(name):
    """The shift path with zero points: the output's zero point rides on the bias (zp 2^s added before
    the REQUANT shift), so the accelerator still requantizes in one pass. (As in the symmetric test
    above, deeper nets at power-of-two scales meet exact ties, which onnxruntime rounds to even.)"""
    m = zoo.MODELS[name]()
    feeds = zoo.sample_inputs(m, 6, seed=2)
    qm = _pow2_scales(zoo.ort_quantize(m, feeds[:4]))
    mod = compiler.build_model(qm, target="accel", config="default")
    shifted = [n for n in _all_nodes(mod.graph) if n.op == "qconv2d" and n.attrs.get("out_zp")
               and n.attrs.get("mul", 1) == 1]
    assert shifted and {n.name for n in shifted} & {s.name for s in mod.steps if s.kind == "accel"}
    _check_qdq_outputs(mod, qm, feeds[4:], name, fuse_qdq=False)


@pytest.mark.parametrize("name", ["conv_bn_relu_pool", "mlp", "residual_block"])
def test_e2e_onnxruntime_qdq_model_per_channel_weights(name):
    """Per-output-channel weight scales (what PyTorch exports): one fixed-point multiplier per
    channel (per-lane SCALE operands on the accelerator), bit-exact against the reference, within
    one output unit of the QDQ model as written.
    The oracle is onnxruntime without its QDQ fusion: its fused s8 kernels differ from its own
    unfused result by tens of units on x86 without VNNI (16-bit saturation; measured on Zen 3)."""
    m = zoo.MODELS[name]()
    feeds = zoo.sample_inputs(m, 6, seed=2)
    qm = zoo.ort_quantize(m, feeds[:4], per_channel=True, activations="symmetric")
    mod = compiler.build_model(qm, target="accel", config="default", force_target={"qdense": "accel"})
    per_channel = [n for n in _all_nodes(mod.graph) if n.op in ("qconv2d", "qdense") and len(n.inputs) == 4]
    assert per_channel and not mod.meta["warnings"]
    assert {n.name for n in per_channel} & {s.name for s in mod.steps if s.kind == "accel"}
    _check_qdq_outputs(mod, qm, feeds[4:], name, fuse_qdq=False)


def _all_nodes(g):
    """Every op node, those of fused groups (CPU kernels) from their body graphs."""
    for n in g.nodes:
        yield from _all_nodes(n.attrs["body"]) if n.op == "fused" else (n,)


def _check_qdq_outputs(mod, qm, feeds, name, fuse_qdq):
    unit = _output_scale(qm) or 1.0 / 64
    for f in feeds:
        got, _, _ = _run_bit_exact(mod, f, name)
        want = ort_run(qm, f, fuse_qdq)[0]
        assert np.abs(got - want).max() <= unit * (1 + 1e-6), np.abs(got - want).max() / unit


@pytest.fixture(scope="module")
def built():
    m = zoo.residual_block()
    feeds = zoo.sample_inputs(m, 5, seed=3)
    return m, feeds, compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:4])


def test_e2e_save_load_round_trip(tmp_path, built):
    m, feeds, mod = built
    path = tmp_path / "m.accm"
    mod.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["m.accm"]  # atomic: no temporary left
    back = CompiledModule.load(path, config="tiny")
    assert back.to_bytes() == mod.to_bytes()
    assert back.input_names == ["x"] and back.output_names == mod.output_names
    a, _ = mod.run(feeds[4])
    b, prof = back.run(feeds[4])
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert len(prof) == len(back.steps)


def test_e2e_load_refuses_other_config_version_or_garbage(tmp_path, built):
    _, _, mod = built
    path = tmp_path / "m.accm"
    mod.save(path)
    with pytest.raises(ModuleFormatError, match="compiled for config .* recompile"):
        CompiledModule.load(path, config="default")
    data = bytearray(path.read_bytes())
    data[8:12] = (FORMAT_VERSION + 1).to_bytes(4, "little")
    (tmp_path / "v.accm").write_bytes(bytes(data))
    with pytest.raises(ModuleFormatError, match="format version"):
        CompiledModule.load(tmp_path / "v.accm")
    (tmp_path / "t.accm").write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ModuleFormatError, match="truncated"):
        CompiledModule.load(tmp_path / "t.accm")
    (tmp_path / "g.accm").write_bytes(b"hello")
    with pytest.raises(ModuleFormatError, match="bad magic"):
        CompiledModule.load(tmp_path / "g.accm")
    assert path.read_bytes().startswith(MAGIC)


def test_e2e_executor_checks_inputs_and_device(built):
    _, feeds, mod = built
    with pytest.raises(ExecutorError, match="config"):
        Executor(mod, device=Device("default", driver="fsim"))
    with Executor(mod) as ex:
        with pytest.raises(ExecutorError, match="expected shape"):
            ex.run({"x": np.zeros((1, 2, 3), np.float32)})
        with pytest.raises(ExecutorError, match="no input"):
            ex.run({"y": feeds[0]["x"]})
        ex.run([feeds[0]["x"]])


def test_e2e_untileable_layer_falls_back_to_cpu_with_reason():
    b = zoo.ModelBuilder("big_kernel", 0)
    x = b.input("x", (1, 16, 12, 12))
    y = b.op("Relu", [b.conv(x, 16, 16, k=11, pad=5, name="conv")], name="relu")
    m = b.build([y])
    feeds = zoo.sample_inputs(m, 3, seed=1)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:2])
    assert mod.count("accel") == 0 and any("conv" in f and "CPU" in f for f in mod.meta["fallbacks"])
    got = next(iter(mod.run(feeds[2])[0].values()))
    np.testing.assert_allclose(got, reference_run(mod.graph, feeds[2])[0], rtol=1e-6)


def test_e2e_tuned_build_same_bytes_never_slower(tmp_path):
    """build_model(tune=log): each accelerator layer's tiling measured on tsim among the analytical
    best few (which include the untuned choice), so the module is no slower than the untuned one,
    its outputs are identical, and a rebuild reads the tuning log."""
    m = zoo.conv_bn_relu_pool()
    feeds = zoo.sample_inputs(m, 3, seed=7)
    log_path = tmp_path / "tuning.json"
    plain = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:2])
    tuned = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:2], tune=log_path)
    assert plain.meta["tuning"] == {} and tuned.meta["tuning"] and log_path.exists()
    runs = {}
    for name, mod in (("plain", plain), ("tuned", tuned)):
        with Executor(mod, driver="tsim") as ex:
            runs[name] = (ex.run(feeds[2]), {r["name"]: r["cycles"] for r in ex.profile if r["target"] == "accel"})
    for k in runs["plain"][0]:
        np.testing.assert_array_equal(runs["tuned"][0][k], runs["plain"][0][k])
    assert runs["tuned"][1].keys() == runs["plain"][1].keys()
    # measured in isolation (other DRAM addresses, so other burst splits): allow 2% per layer, and
    # 32 cycles (a few DMA rows' latency) on layers of a few hundred (the classifier: 448 against
    # 461 in the module where the isolated runs ranked them 403 against 399)
    assert all(runs["tuned"][1][k] <= 1.02 * runs["plain"][1][k] + 32 for k in runs["plain"][1])
    assert sum(runs["tuned"][1].values()) <= sum(runs["plain"][1].values())
    again = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:2], tune=log_path)
    assert again.meta["tuning"] == tuned.meta["tuning"]


def test_e2e_broken_tuning_log_stops_the_build(tmp_path):
    log_path = tmp_path / "tuning.json"
    log_path.write_text("{not json")
    m = zoo.conv_bn_relu_pool()
    with pytest.raises(BuildError, match=r"tuning log .*tuning.json: cannot read it as JSON"):
        compiler.build_model(m, target="accel", config="tiny", tune=log_path)
    log_path.write_text('{"k": 3}')
    with pytest.raises(BuildError, match="expected a JSON object of tuning records"):
        compiler.build_model(m, target="accel", config="tiny", tune=log_path)


def test_cpu_kernel_step_takes_a_scalar_tensor():
    """A 0-d tensor between two kernel steps (ReduceMean over every axis, then Relu) reaches the
    kernel as the tensor itself, not a 1-d copy."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    g = helper.make_graph([helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0),
                           helper.make_node("Relu", ["m"], ["y"])], "scalar", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    xv = np.arange(6, dtype=np.float32).reshape(2, 3) - 1
    out, _ = compiler.build(m.SerializeToString(), target="cpu").run({"x": xv})
    assert out["y"].shape == () and out["y"] == np.float32(1.5)
