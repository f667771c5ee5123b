"""At the accelerator boundary the host converts layouts in compiled kernels: pack and unpack are
LLVM kernels of their own (a transposition runs best alone), and the dequantize, float activation
and quantize between them fuse into one flat kernel. Where no pack kernel compiles, the runtime's
own conversion (kind 'native') takes the step and the module's results do not change."""
import numpy as np
import pytest

from compiler import build_model
from compiler.frontend import from_onnx, zoo
from compiler.frontend.zoo import ModelBuilder
from compiler.ops.registry import IMPLS


def silu_net():
    """Two accelerator convs with SiLU (x * sigmoid(x)) after each, a depthwise conv between them
    (the CPU's by the cost rule on small images) and a residual add: the EfficientNet pattern."""
    b = ModelBuilder("silu_block", 7)
    x = b.input("image", (1, 8, 10, 10))

    def silu(y):
        return b.op("Mul", [y, b.op("Sigmoid", [y])])
    y = silu(b.conv(x, 8, 32, k=1))
    z = silu(b.conv(y, 32, 32, k=3, group=32))
    z = silu(b.conv(z, 32, 32, k=3))
    return b.build([b.op("Add", [b.conv(z, 32, 8, k=1), x])])


@pytest.fixture(scope="module")
def model():
    m = silu_net()
    feeds = zoo.sample_inputs(m, 3, seed=2)
    return from_onnx(m), feeds


def _build(model):
    g, feeds = model
    return build_model(g, target="accel", config="tiny", calibration=feeds[:2])


def test_pack_and_unpack_are_kernels_and_the_float_math_between_fuses(model):
    mod = _build(model)
    labels = [s.op for s in mod.steps if s.kind == "llvm"]
    assert not [s for s in mod.steps if s.kind in ("native", "numpy")]
    assert "pack" in labels and "unpack" in labels
    assert not [op for op in labels if "pack" in op and op not in ("pack", "unpack")]   # never fused
    assert "dequantize+sigmoid+mul+quantize" in labels


def test_the_runtimes_own_conversion_takes_over_where_no_kernel_compiles(model, monkeypatch):
    compiled = _build(model)
    monkeypatch.delitem(IMPLS, ("pack", "llvm"))
    monkeypatch.delitem(IMPLS, ("unpack", "llvm"))
    native = _build(model)
    assert [s.op for s in native.steps if s.kind == "native"] and not native.count("numpy")
    assert native.count("native") == sum(s.op in ("pack", "unpack") for s in compiled.steps)
    feed = model[1][2]
    got, want = native.run(feed)[0], compiled.run(feed)[0]
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
