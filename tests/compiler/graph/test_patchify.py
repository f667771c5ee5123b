"""patchify_convs: a conv whose kernel is its stride over few channels becomes space-to-depth and a
1x1 conv over the patches (ViT's patch embedding, ConvNeXt's and Swin's stems)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import compiler
from accel.isa.config import PRESETS
from compiler.frontend import from_onnx, zoo
from compiler.graph import Graph, Node, run
from compiler.graph.passes import optimize, patchify_convs

RNG = np.random.default_rng(3)


def _conv(c, o, k, hw, stride=None, pads=(0, 0, 0, 0), groups=1, dilations=(1, 1)):
    x = Node.input("x", (1, c, *hw))
    w = Node.const(RNG.standard_normal((o, c // groups, k, k)).astype(np.float32), name="w")
    b = Node.const(RNG.standard_normal(o).astype(np.float32), name="b")
    y = Node("conv2d", [x, w, b], {"strides": (stride or k,) * 2, "pads": pads, "dilations": dilations,
                                   "groups": groups}, name="patch_embed")
    return Graph.from_outputs([x], [y])


@pytest.mark.parametrize("c,k,hw", [(3, 16, (32, 48)), (3, 4, (18, 22)), (1, 2, (8, 8)), (3, 7, (14, 21))])
def test_a_patchify_conv_becomes_a_1x1_conv_over_its_patches(c, k, hw):
    g = _conv(c, 24, k, hw)
    p = patchify_convs(g, PRESETS["default"])
    conv = next(n for n in p.ops if n.op == "conv2d")
    assert conv.name == "patch_embed" and conv.attrs["strides"] == (1, 1)
    assert conv.inputs[1].shape == (24, c * k * k, 1, 1) and conv.shape == g.outputs[0].shape
    assert [n.op for n in p.ops if n.op != "conv2d"][-3:] == ["reshape", "transpose", "reshape"]
    assert any(n.op == "slice" for n in p.ops) == (hw[0] % k > 0 or hw[1] % k > 0)   # only whole windows
    x = RNG.standard_normal((1, c, *hw)).astype(np.float32)
    np.testing.assert_allclose(run(p, [x])[0], run(g, [x])[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("what", ["full_blocks", "overlapping", "padded", "grouped", "dilated", "1x1"])
def test_other_convs_stay(what):
    g = {"full_blocks": lambda: _conv(16, 8, 4, (8, 8)),               # 16 channels fill the lanes
         "overlapping": lambda: _conv(3, 8, 3, (9, 9), stride=2),
         "padded": lambda: _conv(3, 8, 4, (8, 8), pads=(1, 1, 1, 1)),
         "grouped": lambda: _conv(4, 8, 2, (8, 8), groups=2),
         "dilated": lambda: _conv(3, 8, 2, (8, 8), dilations=(2, 2)),
         "1x1": lambda: _conv(3, 8, 1, (8, 8))}[what]()
    assert [n.op for n in patchify_convs(g, PRESETS["default"]).ops] == ["conv2d"]


def _vit_stem(seed=5):
    """A ViT-style patch embedding (16x16 patches of an RGB image), tokens, a linear head."""
    b = zoo.ModelBuilder("vit_stem", seed)
    x = b.input("image", (1, 3, 64, 64))
    t = b.op("Reshape", [b.conv(x, 3, 48, k=16, stride=16, pad=0, name="patch_embed"),
                         b.init(np.array([1, 48, 16], np.int64))])
    t = b.op("Relu", [b.op("Transpose", [t], perm=[0, 2, 1])])
    return b.build([b.linear(b.op("ReduceMean", [t], axes=[1], keepdims=0), 48, 10)])


def test_a_vit_patch_embedding_runs_on_the_accelerator():
    m = _vit_stem()
    feeds = zoo.sample_inputs(m, 4, seed=1)
    mod = compiler.build_model(m, target="accel", config="default", calibration=feeds[:2])
    row = next(r for r in mod.meta["partition"] if r["name"] == "patch_embed")
    assert (row["op"], row["target"]) == ("qconv2d", "accel")
    cpu = compiler.build(m, target="cpu")   # the cpu target keeps its conv kernel
    assert "patchify_convs" not in [p["pass"] for p in cpu.graph.meta["passes"]]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for f in feeds[2:]:
        got = next(iter(mod.run(f)[0].values()))
        ref = run(mod.graph, f)[0]
        np.testing.assert_array_equal(got, ref)
        want = sess.run(None, f)[0]
        cos = float(np.ravel(got) @ np.ravel(want) / (np.linalg.norm(got) * np.linalg.norm(want)))
        assert cos >= 0.99


def test_a_qdq_models_weight_scale_follows_the_patch_weights(tmp_path):
    """onnxruntime's QDQ export of the stem: the quantizer still recovers the model's own int8
    weights (their per-channel scale moves to the 1x1 conv's reshaped weights)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static  # noqa: PLC0415 - optional dep onnxruntime
    m = _vit_stem()
    onnx.save(m, tmp_path / "m.onnx")
    feeds = zoo.sample_inputs(m, 3, seed=2)
    reader = type("Reader", (CalibrationDataReader,), {"it": iter(feeds[:2]),
                                                       "get_next": lambda self: next(self.it, None)})()
    quantize_static(str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx"), reader, quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})
    g = optimize(from_onnx(onnx.load(tmp_path / "q.onnx")), quantize=True, accel="default")
    assert "patch_embed/patch_weights" in g.meta["weight_scales"]
    assert g.meta["quantize"]["calibration"].source.get("patch_embed") == "qdq"
