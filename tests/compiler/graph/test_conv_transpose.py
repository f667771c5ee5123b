"""Transposed convs become a stride-1 conv over the output phases plus a pixel shuffle
(simplify): against onnxruntime over kernels, strides, pads, output padding, groups, dilations
and bias; compiled on the cpu target with no numpy step (the numpy reference made a U-Net 2.7x
slower than onnxruntime); quantized for the accelerator, where the phase conv is offloaded."""
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from compiler import build_model
from compiler.frontend import from_onnx
from compiler.frontend.zoo import ModelBuilder, sample_inputs
from compiler.graph import run
from compiler.graph.passes import optimize
from host_runtime.executor import Executor


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def conv_transpose_model(c, o, hw, k, s, pads, out_pad, group, dil, bias, seed=0):
    b = ModelBuilder("ct", seed)
    x = b.input("x", (1, c, *hw))
    ins = [x, b.weight((c, o // group, *k))] + ([b.init(np.linspace(-1, 1, o, dtype=np.float32))] if bias else [])
    y = b.op("ConvTranspose", ins, kernel_shape=list(k), strides=list(s), pads=list(pads), output_padding=list(out_pad),
             group=group, dilations=list(dil))
    return b.build([y])


@settings(max_examples=30, deadline=None)
@given(k=st.tuples(st.integers(1, 5), st.integers(1, 5)), s=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       pads=st.tuples(*[st.integers(0, 2)] * 4), op=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       group=st.sampled_from([1, 2]), dil=st.sampled_from([(1, 1), (2, 1)]), bias=st.booleans(),
       hw=st.tuples(st.integers(1, 6), st.integers(1, 6)))
def test_conv_transpose_as_phase_conv_matches_onnxruntime(k, s, pads, op, group, dil, bias, hw):
    assume(all(op[d] < s[d] for d in range(2)))
    assume(all(pads[d] + pads[d + 2] < (hw[d] - 1) * s[d] + (k[d] - 1) * dil[d] + 1 + op[d] for d in range(2)))
    m = conv_transpose_model(4, 6, hw, k, s, pads, op, group, dil, bias)
    feed = sample_inputs(m)[0]
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    g = optimize(from_onnx(m))
    assert "conv2d_transpose" not in g.op_counts()
    scale = max(1.0, float(np.abs(ref).max()))
    np.testing.assert_allclose(run(g, feed)[0], ref, rtol=1e-5, atol=1e-5 * scale)
    mod = build_model(m, target="cpu")
    assert mod.count("numpy") == 0
    with Executor(mod) as ex:
        np.testing.assert_allclose(next(iter(ex.run(feed).values())), ref, rtol=1e-5, atol=1e-5 * scale)


def test_conv_transpose_keeps_its_name_and_a_following_bias_add():
    """The crop carries the transposed conv's name (outputs, bisect and --explain rows find it)."""
    m = conv_transpose_model(3, 4, (5, 5), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, (1, 1), True)
    g = optimize(from_onnx(m))
    out = g.outputs[0]
    assert out.name == "convtranspose0" and out.shape == (1, 4, 10, 10)


@pytest.mark.parametrize("config", ["default", "tiny"])
def test_decoder_with_transposed_convs_offloads_them_within_quantization_error(config):
    b = ModelBuilder("decoder", 1)
    x = b.input("x", (1, 16, 8, 8))
    y = b.op("Relu", [b.conv(x, 16, 32)])
    y = b.op("ConvTranspose", [y, b.weight((32, 16, 4, 4)), b.init(np.zeros(16, np.float32))],
             kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1])
    y = b.op("ConvTranspose", [b.op("Relu", [y]), b.weight((16, 16, 2, 2))], kernel_shape=[2, 2], strides=[2, 2])
    m = b.build([b.conv(y, 16, 16, k=1)])
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = sample_inputs(m, 6, seed=3)
    q = optimize(from_onnx(m), quantize=True, calibration_samples=feeds[:4], accel=config)
    phase_convs = [n for n in q.nodes if n.name.endswith("/conv")]
    assert len(phase_convs) == 2 and all(n.target == "accel" for n in phase_convs)
    for f in feeds[4:]:
        assert cosine(run(q, f)[0], sess.run(None, f)[0]) >= 0.99
