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


@pytest.mark.parametrize("c,o,g,k,hw,strides,pads", [(96, 256, 2, 5, (13, 11), (1, 1), (2, 2, 2, 2)),
                                                     (16, 24, 4, 3, (9, 9), (2, 2), (1, 1, 1, 1)),
                                                     (12, 12, 3, 3, (7, 10), (1, 2), (0, 1, 1, 0)),
                                                     (64, 32, 2, 3, (6, 6), (1, 1), (1, 1, 1, 1))])
def test_grouped_spatial_conv_on_nchwc_matches_numpy_and_onnxruntime(c, o, g, k, hw, strides, pads):
    """AlexNet's group-2 5x5/3x3 convs: blocks inside each group, the output block picks its
    group's input blocks (was the direct kernel at 6-8x onnxruntime)."""
    rng = np.random.default_rng(72)
    x = rng.standard_normal((1, c) + hw).astype("float32")
    w = rng.standard_normal((o, c // g, k, k)).astype("float32")
    a = {"strides": strides, "pads": pads, "groups": g}
    f = ops.compile_op("conv2d", [x.shape, w.shape], a, consts={1: w})
    assert f.impl.name == "conv2d_nchw.nchwc"
    ref = conv2d_ref(x, w, strides, pads, (1, 1), g)
    close(f(x), ref)
    close(f(x), run_onnx("Conv", [x, w], {"strides": list(strides), "pads": list(pads), "group": g}, consts=(1,)))
    fn = ops.compile_op("conv2d", [x.shape, w.shape], a)    # weight not constant: packed in the kernel
    close(fn(x, w), ref)


def test_grouped_qconv_nchwc_is_exact():
    rng = np.random.default_rng(73)
    x = rng.integers(-127, 128, (1, 8, 9, 9), dtype=np.int8)
    w = rng.integers(-127, 128, (16, 4, 3, 3), dtype=np.int8)
    b = rng.integers(-1000, 1000, (16,), dtype=np.int32)
    attrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "groups": 2, "in_shift": 0, "w_shift": 0, "out_shift": 8,
             "layout": "NCHW", "mul": 1, "out_zp": 0}
    shapes, dtypes = [x.shape, w.shape, b.shape], ["int8", "int8", "int32"]
    fb = ops.compile_op("qconv2d", shapes, attrs, dtype=dtypes, consts={1: w}, impl="qconv2d.nchwc")
    fd = ops.compile_op("qconv2d", shapes, attrs, dtype=dtypes, consts={1: w}, impl="qconv2d.direct")
    np.testing.assert_array_equal(fb(x, b), fd(x, b))
