"""Grouped 1x1 convs on the pointwise schedule (ShuffleNet's group-4 convs ran on the direct
kernel at 3-6x onnxruntime), and the NCHWc output block kept a power of two (a 24-lane block
compiled to cross-register shuffles): both against numpy (float64) and onnxruntime."""
import numpy as np
import pytest

from compiler import ops
from compiler.ops import cpu
from tests.compiler.ops.oracle import close, conv2d_ref, run_onnx


@pytest.mark.parametrize("c,o,g,hw,strides,n", [(272, 272, 4, (14, 14), (1, 1), 1), (24, 112, 4, (9, 7), (1, 1), 2),
                                                (12, 18, 3, (5, 11), (2, 2), 1), (16, 8, 8, (4, 4), (1, 1), 1),
                                                (6, 9, 3, (3, 5), (1, 2), 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_grouped_pointwise_matches_numpy_and_onnxruntime(c, o, g, hw, strides, n, bias):
    rng = np.random.default_rng(70)
    x = rng.standard_normal((n, c) + hw).astype("float32")
    w = rng.standard_normal((o, c // g, 1, 1)).astype("float32")
    b = rng.standard_normal((o,)).astype("float32")
    attrs = {"strides": strides, "groups": g}
    f = ops.compile_op("conv2d", [x.shape, w.shape] + ([b.shape] if bias else []), attrs, consts={1: w})
    assert f.impl.name == "conv2d_nchw.pointwise"
    y = f(x, b) if bias else f(x)
    ref = conv2d_ref(x, w, strides, (0, 0, 0, 0), (1, 1), g) + (b.reshape(1, -1, 1, 1) if bias else 0)
    close(y, ref)
    close(y, run_onnx("Conv", [x, w] + ([b] if bias else []), {"strides": list(strides), "group": g}, consts=(1, 2)))


def test_one_channel_groups_stay_depthwise_or_direct():
    x = np.ones((1, 8, 4, 4), "float32")
    w = np.ones((8, 1, 1, 1), "float32")
    f = ops.compile_op("conv2d", [x.shape, w.shape], {"groups": 8}, consts={1: w})
    assert f.impl.name != "conv2d_nchw.pointwise"
    close(f(x), x)


@pytest.mark.parametrize("o,block", [(24, 8), (12, 4), (96, 32), (48, 16), (40, 8), (64, 32)])
def test_nchwc_output_block_is_a_power_of_two(o, block):
    assert cpu.conv_blocks(16, o, oc_bn=32)[1] == block


@pytest.mark.parametrize("o", [24, 12, 40])
def test_nchwc_conv_with_non_power_of_two_channels(o):
    rng = np.random.default_rng(71)
    x = rng.standard_normal((1, 3, 19, 17)).astype("float32")
    w = rng.standard_normal((o, 3, 3, 3)).astype("float32")
    a = {"strides": (2, 2), "pads": (1, 1, 1, 1)}
    f = ops.compile_op("conv2d", [x.shape, w.shape], a, consts={1: w})
    assert f.impl.name == "conv2d_nchw.nchwc"
    close(f(x), conv2d_ref(x, w, (2, 2), (1, 1, 1, 1), (1, 1), 1))
