"""The NCHWc conv schedule's NCHW write-out (the register tile stored straight to the NCHW output
with the epilogue applied, no NCHWc intermediate) and its row-transpose input pack, against numpy
(float64), onnxruntime and the unfused schedule, on odd shapes: 3 input channels, output channels
that are not a multiple of the vector width, widths the register tile does not divide, batch 2,
strides, asymmetric pads; with the epilogues graph_build fuses (bias, clip, residual add)."""
import numpy as np
import pytest

from compiler import build, lower, ops, te
from compiler.ops import cpu, registry
from compiler.ops import elemwise as ew
from tests.compiler.ops.oracle import close, conv2d_ref, run_onnx

CASES = [((1, 3, 17, 23), 24, 3, (1, 1), (1, 1, 1, 1)),
         ((2, 8, 9, 14), 40, 3, (2, 2), (0, 1, 1, 0)),
         ((1, 3, 20, 20), 64, 7, (2, 2), (3, 3, 3, 3)),
         ((1, 32, 7, 7), 16, 3, (1, 1), (1, 1, 1, 1)),
         ((1, 20, 6, 11), 12, 5, (1, 2), (2, 0, 1, 2))]


def rnd(rng, shape):
    return rng.standard_normal(shape).astype("float32")


def _impl(name):
    return next(i for i in registry.implementations("conv2d") if i.name == name)


def _fused(x, wt, b, res, attrs, config=None):
    """conv + bias -> clip(0, 6) (+ residual) with the NCHWc schedule, composed as graph_build
    does; (output, lowered text)."""
    impl = _impl("conv2d_nchw.nchwc")
    with cpu.schedule_config(config):
        X, W, B = (te.placeholder(a.shape, "float32", n) for a, n in ((x, "x"), (wt, "w"), (b, "b")))
        y = ew.clip(impl.compute(X, W, B, **registry.normalize_attrs("conv2d", attrs)), min=0.0, max=6.0)
        args = [X, W, B]
        if res is not None:
            R = te.placeholder(res.shape, "float32", "r")
            y = ew.add(y, R)
            args.append(R)
        s = impl.schedule([y])
        text = str(lower(s, args + [y]))
        mod = build(impl.schedule([y]), args + [y], target="llvm")
    out = np.empty(tuple(y.shape), "float32")
    mod(*([x, wt, b] + ([res] if res is not None else [])), out)
    return out, text


@pytest.mark.parametrize("shape,o,k,strides,pads", CASES)
@pytest.mark.parametrize("residual", [False, True])
def test_writeout_with_epilogue_matches_numpy(shape, o, k, strides, pads, residual):
    rng = np.random.default_rng(31)
    x, wt, b = rnd(rng, shape), rnd(rng, (o, shape[1], k, k)), rnd(rng, (o,))
    attrs = {"strides": strides, "pads": pads}
    ref = np.clip(conv2d_ref(x, wt, strides, pads, (1, 1), 1) + b.reshape(1, -1, 1, 1), 0, 6)
    res = rnd(rng, ref.shape) if residual else None
    want = ref + (res if residual else 0)
    y, text = _fused(x, wt, b, res, attrs)
    close(y, want)
    # the write-out path: the conv lives in a register-tile buffer, not a whole NCHWc tensor
    assert "scope='local')" in text.split("conv2d_NCHWc = allocate")[1].split("\n")[0]
    y0, text0 = _fused(x, wt, b, res, attrs, config={"fuse_unpack": False})
    assert "conv2d_NCHWc = allocate" in text0 and "conv2d_NCHWc.local" in text0
    close(y0, want)
    np.testing.assert_allclose(y, y0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,o,k,strides,pads", CASES)
def test_conv_op_matches_onnxruntime(shape, o, k, strides, pads):
    rng = np.random.default_rng(32)
    x, wt = rnd(rng, shape), rnd(rng, (o, shape[1], k, k))
    f = ops.compile_op("conv2d", [x.shape, wt.shape], {"strides": strides, "pads": pads}, consts={1: wt})
    assert f.impl.name == "conv2d_nchw.nchwc"
    close(f(x), conv2d_ref(x, wt, strides, pads, (1, 1), 1))
    close(f(x), run_onnx("Conv", [x, wt], {"strides": list(strides), "pads": list(pads)}, consts=(1,)))


def test_pack_is_a_row_transpose_without_division():
    """The input pack runs per (n, block, row) with the channel lanes unrolled: no per-element
    division or modulo by the block, and the lanes are stored whole."""
    X = te.placeholder((1, 32, 10, 12), "float32", "x")
    W = te.placeholder((16, 32, 3, 3), "float32", "w")
    impl = _impl("conv2d_nchw.nchwc")
    y = impl.compute(X, W, **registry.normalize_attrs("conv2d", {"pads": (1, 1, 1, 1)}))
    text = str(lower(impl.schedule([y]), [X, W, y]))
    pack = text.split("data_vec[")[1].split("\n")[0]
    assert "// 16" not in pack and "% 16" not in pack


def test_unfused_consumer_keeps_the_nchwc_tensor():
    """Two outputs read the conv: the schedule keeps the NCHWc tensor (no write-out)."""
    X = te.placeholder((1, 8, 9, 9), "float32", "x")
    W = te.placeholder((16, 8, 3, 3), "float32", "w")
    impl = _impl("conv2d_nchw.nchwc")
    y = impl.compute(X, W, **registry.normalize_attrs("conv2d", {"pads": (1, 1, 1, 1)}))
    z = ew.relu(y)
    s = impl.schedule([y, z])
    mod = build(s, [X, W, y, z], target="llvm")
    rng = np.random.default_rng(33)
    x, wt = rnd(rng, (1, 8, 9, 9)), rnd(rng, (16, 8, 3, 3))
    oy, oz = np.empty((1, 16, 9, 9), "float32"), np.empty((1, 16, 9, 9), "float32")
    mod(x, wt, oy, oz)
    ref = conv2d_ref(x, wt, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    close(oy, ref)
    close(oz, np.maximum(ref, 0))


def test_qconv_nchwc_writeout_is_exact():
    """int8 conv through the NCHWc write-out with per-tensor requantization equals the direct kernel."""
    rng = np.random.default_rng(34)
    x = rng.integers(-127, 128, (1, 3, 13, 11), dtype=np.int8)
    w = rng.integers(-127, 128, (24, 3, 3, 3), dtype=np.int8)
    b = rng.integers(-1000, 1000, (24,), dtype=np.int32)
    attrs = {"strides": (1, 1), "pads": (1, 1, 1, 1), "in_shift": 0, "w_shift": 0, "out_shift": 8,
             "layout": "NCHW", "mul": 1, "out_zp": 0}
    shapes, dtypes = [x.shape, w.shape, b.shape], ["int8", "int8", "int32"]
    fb = ops.compile_op("qconv2d", shapes, attrs, dtype=dtypes, consts={1: w}, impl="qconv2d.nchwc")
    fd = ops.compile_op("qconv2d", shapes, attrs, dtype=dtypes, consts={1: w}, impl="qconv2d.direct")
    np.testing.assert_array_equal(fb(x, b), fd(x, b))
