"""Dilated convs guard their kernel rows instead of padding rows (nn.guards_rows): a kernel row
that falls in the top or bottom padding adds nothing and is skipped, the columns are padded as
before. Against numpy (float64) and onnxruntime over dilations, pads larger and smaller than the
dilation, strides, groups and widths with a tail tile, on the NCHW path (conv2d.nchwc) and on
the blocked layout a whole net takes (an ASPP head, compiled)."""
import numpy as np
import onnxruntime as ort
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler import ops
from compiler.ops import nn
from tests.compiler.ops.oracle import close, conv2d_ref

SETTINGS = settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def test_which_convs_guard_their_rows():
    assert nn.guards_rows((6, 6, 6, 6), (6, 6)) and nn.guards_rows((0, 1, 2, 1), (2, 1))
    assert not nn.guards_rows((1, 1, 1, 1), (1, 1)) and not nn.guards_rows((0, 3, 0, 3), (3, 3))


@SETTINGS
@given(st.sampled_from([16, 32]), st.sampled_from([16, 32]), st.integers(7, 23), st.integers(7, 23),
       st.sampled_from([2, 3, 6, 9]), st.sampled_from([(1, 1), (2, 2), (2, 1)]), st.sampled_from([1, 2]), st.data())
def test_dilated_conv_matches_numpy(c, o, h, w, d, strides, groups, data):
    pads = tuple(data.draw(st.integers(0, d + 1)) for _ in range(4))
    if (h + pads[0] + pads[2] - 2 * d - 1) < 0 or (w + pads[1] + pads[3] - 2 * d - 1) < 0:
        pads = (d, d, d, d)
    rng = np.random.default_rng(30)
    x, wt = rng.standard_normal((1, c, h, w)).astype("float32"), rng.standard_normal((o, c // groups, 3, 3)).astype(
        "float32")
    a = {"strides": strides, "pads": pads, "dilations": (d, d), "groups": groups}
    f = ops.compile_op("conv2d", [x.shape, wt.shape], a, consts={1: wt})
    close(f(x), conv2d_ref(x, wt, strides, pads, (d, d), groups))


def test_an_aspp_head_compiles_and_matches_onnxruntime():
    """Three dilated 3x3 convs beside a 1x1 over one map (DeepLab's ASPP at output stride 16: 33x33,
    dilations 6/12/18, most of whose taps fall in the padding), in the blocked layout."""
    rng = np.random.default_rng(31)
    c, s = 32, 17
    inits, nodes, outs = [], [], []
    for k, d in enumerate((1, 3, 6, 9)):
        kk = 1 if d == 1 else 3
        inits.append(numpy_helper.from_array((rng.standard_normal((16, c, kk, kk)) * 0.1).astype(np.float32), f"w{k}"))
        nodes.append(helper.make_node("Conv", ["x", f"w{k}"], [f"c{k}"], kernel_shape=[kk, kk], dilations=[d, d],
                                      pads=[0 if d == 1 else d] * 4))
        nodes.append(helper.make_node("Relu", [f"c{k}"], [f"r{k}"]))
        outs.append(f"r{k}")
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=1))
    g = helper.make_graph(nodes, "aspp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, s, s])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, s, s])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    x = rng.standard_normal((1, c, s, s)).astype(np.float32)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    mod = compiler.build_model(m, target="cpu")
    assert mod.meta["fallbacks"] == [] and mod.count("numpy") == 0
    got = np.asarray(next(iter(mod.run({"x": x})[0].values())))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
