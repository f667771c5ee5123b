"""space_to_depth_convs: a strided conv over few channels becomes space-to-depth and a stride-1
conv over s x s blocks (a CNN's stem; a patch embedding, ViT's, ConvNeXt's or Swin's, becomes a
1x1 conv over its patches)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import compiler
from accel.isa.config import PRESETS
from compiler.frontend import from_onnx, zoo
from compiler.graph import Graph, Node, run
from compiler.graph.passes import optimize, space_to_depth_convs
from compiler.graph.passes.space_to_depth import block_weights, blocked_fill
from compiler.graph_build import BuildError

RNG = np.random.default_rng(3)


def _conv(c, o, k, hw, stride=None, pads=(0, 0, 0, 0), groups=1, dilations=(1, 1)):
    x = Node.input("x", (1, c, *hw))
    w = Node.const(RNG.standard_normal((o, c // groups, k, k)).astype(np.float32), name="w")
    b = Node.const(RNG.standard_normal(o).astype(np.float32), name="b")
    y = Node("conv2d", [x, w, b], {"strides": (stride or k,) * 2, "pads": pads, "dilations": dilations,
                                   "groups": groups}, name="patch_embed")
    return Graph.from_outputs([x], [y])


@pytest.mark.parametrize("c,k,s,hw,pads", [
    (3, 16, 16, (32, 48), (0, 0, 0, 0)),    # ViT: 1x1 over the patches
    (3, 4, 4, (18, 22), (0, 0, 0, 0)),      # ConvNeXt, columns and rows past the last window
    (3, 7, 2, (32, 30), (3, 3, 3, 3)),      # ResNet's stem
    (3, 3, 2, (17, 16), (1, 1, 1, 1)),      # MobileNet's
    (1, 5, 3, (20, 19), (2, 0, 1, 4)),      # uneven pads
    (2, 2, 2, (9, 9), (0, 0, 0, 0))])
def test_a_strided_conv_becomes_a_stride_1_conv_over_blocks(c, k, s, hw, pads):
    g = _conv(c, 24, k, hw, stride=s, pads=pads)
    p = space_to_depth_convs(g, PRESETS["default"], min_fill=0.0)
    conv = next(n for n in p.ops if n.op == "conv2d")
    q = -(-k // s)
    assert conv.name == "patch_embed" and conv.attrs["strides"] == (1, 1) and not any(conv.attrs["pads"])
    assert conv.inputs[1].shape == (24, c * s * s, q, q) and conv.shape == g.outputs[0].shape
    assert [n.op for n in p.ops if n.op != "conv2d"][-3:] == ["reshape", "transpose", "reshape"]
    x = RNG.standard_normal((1, c, *hw)).astype(np.float32)
    np.testing.assert_allclose(run(p, [x])[0], run(g, [x])[0], rtol=1e-4, atol=1e-4)


def test_block_weights_zero_the_taps_past_the_kernel():
    w = RNG.standard_normal((2, 3, 7, 7)).astype(np.float32)
    b = block_weights(w, 2)
    assert b.shape == (2, 12, 4, 4)
    # channel (c, ry, rx) = c * 4 + ry * 2 + rx; tap (qy, qx) holds w[.., 2 qy + ry, 2 qx + rx], 0 past 7
    for c, ry, rx, qy, qx in np.ndindex(3, 2, 2, 4, 4):
        y, x = 2 * qy + ry, 2 * qx + rx
        assert b[1, c * 4 + ry * 2 + rx, qy, qx] == (w[1, c, y, x] if y < 7 and x < 7 else 0)


@pytest.mark.parametrize("what", ["full_blocks", "stride_1", "grouped", "dilated", "uneven_strides", "1x1_s2_wide"])
def test_other_convs_stay(what):
    g = {"full_blocks": lambda: _conv(16, 8, 4, (8, 8)),               # 16 channels fill the lanes
         "stride_1": lambda: _conv(3, 8, 3, (9, 9), stride=1),
         "grouped": lambda: _conv(4, 8, 2, (8, 8), groups=2),
         "dilated": lambda: _conv(3, 8, 2, (8, 8), dilations=(2, 2)),
         "uneven_strides": lambda: _strided(3, 8, 3, (9, 9), (2, 1)),
         "1x1_s2_wide": lambda: _conv(32, 8, 1, (8, 8), stride=2)}[what]()
    assert [n.op for n in space_to_depth_convs(g, PRESETS["default"]).ops] == ["conv2d"]


def test_by_default_only_convs_whose_blocks_fill_the_core_are_rewritten():
    """The fill rule (AccelRules.min_space_to_depth_fill, 0.75): patch embeddings fill the core;
    ResNet's 7x7 stem (57%) and MobileNet's 3x3 one (42%) keep their conv unless asked."""
    cfg = PRESETS["default"]
    for c, k, s, pads, fill in ((3, 16, 16, (0,) * 4, 1.0), (3, 4, 4, (0,) * 4, 1.0), (3, 7, 2, (3,) * 4, 0.574),
                                (3, 3, 2, (1,) * 4, 0.422)):
        assert round(blocked_fill(c, k, k, s, cfg.block_in), 3) == fill
        g = _conv(c, 8, k, (32, 32), stride=s, pads=pads)
        rewritten = space_to_depth_convs(g, cfg).ops[-1].attrs["strides"] == (1, 1)
        assert rewritten == (fill >= 0.75)
        assert space_to_depth_convs(g, cfg, min_fill=0.5).ops[-1].attrs["strides"] == ((1, 1) if fill >= 0.5 else (s, s))


def _strided(c, o, k, hw, strides):
    g = _conv(c, o, k, hw)
    n = g.outputs[0]
    y = Node("conv2d", n.inputs, {**n.attrs, "strides": strides}, name=n.name)
    return Graph.from_outputs(g.inputs, [y])


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
    assert "space_to_depth_convs" not in [p["pass"] for p in cpu.graph.meta["passes"]]
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
    assert "patch_embed/block_weights" in g.meta["weight_scales"]
    assert g.meta["quantize"]["calibration"].source.get("patch_embed") == "qdq"


def _resnet_stem(seed=6):
    b = zoo.ModelBuilder("resnet_stem", seed)
    x = b.input("image", (1, 3, 40, 40))
    t = b.op("Relu", [b.conv(x, 3, 32, k=7, stride=2, pad=3, name="stem")])
    t = b.op("MaxPool", [t], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    return b.build([b.conv(t, 32, 16, k=3, name="conv1")])


def test_a_resnet_stem_runs_on_the_accelerator_when_asked():
    m = _resnet_stem()
    feeds = zoo.sample_inputs(m, 3, seed=1)
    default = compiler.build_model(m, target="accel", config="default", calibration=feeds[:2])
    assert next(r for r in default.meta["partition"] if r["name"] == "stem")["target"] == "cpu"
    mod = compiler.build_model(m, target="accel", config="default", calibration=feeds[:2],
                               target_options={"space_to_depth_fill": 0.5})
    assert next(r for r in mod.meta["partition"] if r["name"] == "stem")["target"] == "accel"
    assert mod.meta["macs"] == default.meta["macs"] | {"accel": sum(default.meta["macs"].values()), "cpu": 0}
    got = next(iter(mod.run(feeds[2])[0].values()))
    np.testing.assert_array_equal(got, run(mod.graph, feeds[2])[0])
    with pytest.raises(BuildError, match="space_to_depth_fill=2"):
        compiler.build_model(m, target="accel", config="default", calibration=feeds[:2],
                             target_options={"space_to_depth_fill": 2})
