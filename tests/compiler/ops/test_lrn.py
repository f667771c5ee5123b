"""LRN's CPU kernel (per-channel plane sums in a local buffer, vectorized over flat pixels, the
usual betas by square roots) against onnxruntime and a float64 numpy reference, on planes whose
pixel count the vector width does not divide and channel counts smaller than the window."""
import numpy as np
import pytest

from compiler import ops
from tests.compiler.ops.oracle import close, run_onnx


def lrn_ref(x, size, alpha, beta, bias):
    x64 = x.astype(np.float64)
    c = x.shape[1]
    sq = np.zeros_like(x64)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    for k in range(c):
        sq[:, k] = (x64[:, max(0, k - lo):min(c, k + hi + 1)] ** 2).sum(axis=1)
    return x64 / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize("shape", [(1, 96, 13, 11), (2, 3, 7, 5), (1, 20, 16, 16)])
@pytest.mark.parametrize("beta", [0.75, 0.5, 1.0, 0.6])
def test_lrn_matches_numpy_and_onnxruntime(shape, beta):
    rng = np.random.default_rng(40)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    attrs = {"size": 5, "alpha": 0.3, "beta": beta, "bias": 1.5}
    f = ops.compile_op("lrn", [shape], attrs)
    y = f(x)
    close(y, lrn_ref(x, **attrs))
    close(y, run_onnx("LRN", [x], attrs))
    text = f.module.get_source("tir")
    assert "pow(" not in text if beta in (0.75, 0.5, 1.0) else "pow(" in text
    assert "ramp(" in text     # vectorized over the flat pixels
