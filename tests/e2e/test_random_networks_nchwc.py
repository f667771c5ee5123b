"""The cpu target's blocked layout between convs (compiler.graph.passes.nchwc_layout) on random
networks (the strategy of test_random_networks: convs of random widths, 24 and 3 channels among
them, batch norms, activations, residual adds, channel concats that may not meet on a block, pools),
at batch 1 and 2: the output matches onnxruntime (float, 1e-4), with and without the pass."""
import numpy as np
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compiler
from compiler.frontend import zoo

from .test_random_networks import networks


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(net=networks(), batch=st.sampled_from([1, 2]))
def test_random_network_blocked_layout_matches_onnxruntime(net, batch):
    for v in (net.graph.input[0], net.graph.output[0]):
        v.type.tensor_type.shape.dim[0].dim_value = batch
    del net.graph.value_info[:]
    f = zoo.sample_inputs(net, 1, seed=4)[0]
    so = ort.SessionOptions()   # as test_random_networks: onnxruntime's own NCHWc rewrite off
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    want = ort.InferenceSession(net.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, f)[0]
    mod = compiler.build_model(net, target="cpu")
    assert mod.meta["fallbacks"] == []
    got = next(iter(mod.run(f)[0].values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@st.composite
def inverted_residual_nets(draw):
    """MobileNet/EfficientNet-style stacks: expand 1x1 - depthwise kxk (stride, dilation, asymmetric
    pads as TF exports them, bias or not) - activation - squeeze-excitation or not - project 1x1,
    residual when shapes allow,
    with channel counts that give blocks of 4, 8, 16 or none (6)."""
    b = zoo.ModelBuilder("inverted_residual", seed=draw(st.integers(0, 999)))
    c, h, w = draw(st.sampled_from([4, 8, 16, 24])), draw(st.integers(5, 12)), draw(st.integers(5, 12))
    x = b.input("x", (1, c, h, w))
    for k in range(draw(st.integers(1, 3))):
        h_in, w_in = h, w
        hid = draw(st.sampled_from([6, 12, 16, 24, 40, 48]))
        y = b.op("Relu", [b.conv(x, c, hid, k=1, bias=draw(st.booleans()), name=f"expand{k}")])
        ks, dil = draw(st.sampled_from([(3, 1), (5, 1), (3, 2)]))
        stride = draw(st.sampled_from([1, 2])) if dil == 1 and min(h, w) >= 6 else 1
        span = (ks - 1) * dil
        pads = [draw(st.integers(0, span)) for _ in range(4)]
        pads[0], pads[1] = max(pads[0], span + 1 - h - pads[2]), max(pads[1], span + 1 - w - pads[3])   # it fits
        wt = b.weight((hid, 1, ks, ks))
        ins = [y, wt] + ([b.init((b.rng.standard_normal(hid) * 0.1).astype(np.float32))] if draw(st.booleans()) else [])
        y = b.op("Conv", ins, name=f"dw{k}", kernel_shape=[ks, ks], strides=[stride, stride], pads=pads,
                 dilations=[dil, dil], group=hid)
        h, w = (h + pads[0] + pads[2] - span - 1) // stride + 1, (w + pads[1] + pads[3] - span - 1) // stride + 1
        y = b.bn(y, hid, name=f"bn{k}")
        act = draw(st.sampled_from(["Clip", "Sigmoid", "Relu"]))
        if act == "Clip":
            y = b.op("Clip", [y, b.init(np.float32(0.0)), b.init(np.float32(6.0))])
        elif act == "Sigmoid":   # SiLU, as EfficientNet exports it
            y = b.op("Mul", [y, b.op("Sigmoid", [y])])
        else:
            y = b.op("Relu", [y])
        if draw(st.booleans()):   # squeeze-excitation: a per-channel gate from the global mean
            r = max(2, hid // 4)
            se = b.op("Relu", [b.conv(b.op("GlobalAveragePool", [y]), hid, r, k=1)])
            y = b.op("Mul", [y, b.op("Sigmoid", [b.conv(se, r, hid, k=1)])])
        out = draw(st.sampled_from([c, 8, 16]))
        y = b.conv(y, hid, out, k=1, name=f"project{k}")
        x = b.op("Add", [y, x]) if (out, h, w) == (c, h_in, w_in) else y
        c = out
    y = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    return b.build([b.op("Gemm", [y, b.weight((5, c)), b.init(np.zeros(5, np.float32))], transB=1)])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(net=inverted_residual_nets())
def test_random_inverted_residuals_blocked_match_onnxruntime(net):
    """Depthwise convs run blocked between the 1x1 convs wherever their channels allow a block."""
    f = zoo.sample_inputs(net, 1, seed=5)[0]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    want = ort.InferenceSession(net.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, f)[0]
    mod = compiler.build_model(net, target="cpu")
    assert mod.meta["fallbacks"] == []
    got = next(iter(mod.run(f)[0].values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
