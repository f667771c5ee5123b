"""The stride-1 pooling schedule (a register tile of output pixels per (n, c) plane row, the
window accumulated in it) against onnxruntime and the generic schedule: max and average, pads on
either side, count_include_pad, a fused ReLU; strided and global pools keep the generic nest."""
import numpy as np
import pytest

from compiler import build, lower, ops, te
from compiler.ops import cpu, nn
from compiler.ops import elemwise as ew
from tests.compiler.ops.oracle import close, run_onnx


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("shape,k,pads,cip", [((1, 5, 9, 8), 3, (1, 1, 1, 1), 0), ((2, 3, 6, 16), 3, (0, 2, 2, 0), 1),
                                              ((1, 4, 12, 12), 5, (2, 2, 2, 2), 0), ((1, 2, 7, 4), 1, (0, 0, 0, 0), 0)])
def test_stride1_pool_matches_onnxruntime(kind, shape, k, pads, cip):
    rng = np.random.default_rng(50)
    x = rng.standard_normal(shape).astype(np.float32)
    attrs = {"kernel": (k, k), "strides": (1, 1), "pads": pads, "ceil_mode": 0}
    onnx_attrs = {"kernel_shape": [k, k], "strides": [1, 1], "pads": list(pads)}
    if kind == "avg":
        attrs["count_include_pad"] = cip
        onnx_attrs["count_include_pad"] = cip
    f = ops.compile_op(f"{kind}_pool2d", [shape], attrs)
    text = f.module.get_source("tir")
    assert "scope='local'" in text        # the register-tile schedule, not the generic one
    close(f(x), run_onnx("MaxPool" if kind == "max" else "AveragePool", [x], onnx_attrs))


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool_with_fused_relu_equals_generic(kind):
    rng = np.random.default_rng(51)
    x = rng.standard_normal((1, 6, 10, 16)).astype(np.float32)
    X = te.placeholder(x.shape, "float32", "x")
    y = ew.relu(nn.pool2d(X, (3, 3), (1, 1), (1, 1, 1, 1), 0, kind))
    outs = []
    for sched in (cpu.schedule_pool, cpu.schedule_pool_generic):
        mod = build(sched([y]), [X, y], target="llvm")
        o = np.empty(tuple(y.shape), np.float32)
        mod(x, o)
        outs.append(o)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)
    assert (outs[0] >= 0).all()


def test_strided_and_global_pools_use_the_generic_nest():
    X = te.placeholder((1, 4, 16, 16), "float32", "x")
    for y in (nn.pool2d(X, (3, 3), (2, 2), (1, 1, 1, 1), 0, "max"), nn.global_pool2d(X, "avg")):
        assert "scope='local'" not in str(lower(cpu.schedule_pool([y]), [X, y]))
