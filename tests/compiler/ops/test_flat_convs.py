"""The flat-pixel conv schedules: 1x1 (conv2d_nchw.pointwise) and depthwise (conv2d_nchw.depthwise),
against numpy (float64) and onnxruntime, alone and with the epilogues graph_build fuses after them
(bias, clip, residual add); and the index simplification they rely on."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import build, lower, ops, te
from compiler.ops import cpu, nn, registry
from compiler.ops import elemwise as ew
from compiler.tir import arith
from compiler.tir import expr as E
from tests.compiler.ops.oracle import close, conv2d_ref, run_onnx

SETTINGS = settings(max_examples=6, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def rnd(rng, shape):
    return rng.standard_normal(shape).astype("float32")


@SETTINGS
@given(st.sampled_from([1, 3, 8, 24]), st.sampled_from([8, 16, 24, 40]), st.integers(1, 13), st.integers(1, 21),
       st.sampled_from([(1, 1), (2, 2), (1, 2)]), st.sampled_from([1, 2]), st.booleans(), st.booleans())
def test_pointwise_matches_numpy_and_onnxruntime(c, o, h, w, strides, n, bias, const_weight):
    rng = np.random.default_rng(20)
    x, wt, b = rnd(rng, (n, c, h, w)), rnd(rng, (o, c, 1, 1)), rnd(rng, (o,))
    shapes = [x.shape, wt.shape] + ([b.shape] if bias else [])
    f = ops.compile_op("conv2d", shapes, {"strides": strides}, consts={1: wt} if const_weight else None)
    assert f.impl.name == "conv2d_nchw.pointwise"
    args = [x] + ([] if const_weight else [wt]) + ([b] if bias else [])
    y = f(*args)
    ref = conv2d_ref(x, wt, strides, (0, 0, 0, 0), (1, 1), 1) + (b.reshape(1, -1, 1, 1) if bias else 0)
    close(y, ref)
    ort_in = [x, wt] + ([b] if bias else [])
    close(y, run_onnx("Conv", ort_in, {"strides": list(strides)}, consts=(1, 2)))


@SETTINGS
@given(st.sampled_from([4, 16, 24]), st.sampled_from([1, 3, 5]), st.integers(0, 12), st.integers(0, 20),
       st.sampled_from([(1, 1), (2, 2), (1, 2), (3, 3)]), st.data(), st.booleans())
def test_depthwise_matches_numpy_and_onnxruntime(c, k, h, w, strides, data, bias):
    h, w = h + k, w + k
    pads = tuple(data.draw(st.integers(0, k // 2 + 1)) for _ in range(4))
    rng = np.random.default_rng(21)
    x, wt, b = rnd(rng, (1, c, h, w)), rnd(rng, (c, 1, k, k)), rnd(rng, (c,))
    a = {"strides": strides, "pads": pads, "groups": c}
    f = ops.compile_op("conv2d", [x.shape, wt.shape] + ([b.shape] if bias else []), a, consts={1: wt})
    assert f.impl.name == "conv2d_nchw.depthwise"
    y = f(x, b) if bias else f(x)
    ref = conv2d_ref(x, wt, strides, pads, (1, 1), c) + (b.reshape(1, -1, 1, 1) if bias else 0)
    close(y, ref)
    ort_in = [x, wt] + ([b] if bias else [])
    close(y, run_onnx("Conv", ort_in, {"strides": list(strides), "pads": list(pads), "group": c}, consts=(1, 2)))


def _fused(impl_name, x, wt, b, res, attrs):
    """conv + bias -> clip(0, 6) (+ residual), composed and scheduled as graph_build does."""
    impl = next(i for i in registry.implementations("conv2d") if i.name == impl_name)
    X = te.placeholder(x.shape, "float32", "x")
    W = te.placeholder(wt.shape, "float32", "w")
    B = te.placeholder(b.shape, "float32", "b")
    y = ew.clip(impl.compute(X, W, B, **registry.normalize_attrs("conv2d", attrs)), min=0.0, max=6.0)
    args = [X, W, B]
    if res is not None:
        R = te.placeholder(res.shape, "float32", "r")
        y = ew.add(y, R)
        args.append(R)
    mod = build(impl.schedule([y]), args + [y], target="llvm")
    out = np.empty(tuple(y.shape), "float32")
    mod(*([x, wt, b] + ([res] if res is not None else [])), out)
    return out


@pytest.mark.parametrize("shape,o,strides,residual", [((1, 24, 14, 14), 24, (1, 1), True),
                                                      ((1, 16, 7, 9), 40, (1, 1), False),
                                                      ((1, 8, 10, 10), 16, (2, 2), False)])
def test_pointwise_fused_epilogue(shape, o, strides, residual):
    rng = np.random.default_rng(22)
    x, wt, b = rnd(rng, shape), rnd(rng, (o, shape[1], 1, 1)), rnd(rng, (o,))
    ref = np.clip(conv2d_ref(x, wt, strides, (0, 0, 0, 0), (1, 1), 1) + b.reshape(1, -1, 1, 1), 0, 6)
    res = rnd(rng, ref.shape) if residual else None
    y = _fused("conv2d_nchw.pointwise", x, wt, b, res, {"strides": strides})
    close(y, ref + (res if residual else 0))


@pytest.mark.parametrize("shape,strides", [((1, 16, 14, 14), (1, 1)), ((1, 8, 15, 9), (2, 2)), ((2, 4, 7, 7), (1, 1))])
def test_depthwise_fused_epilogue(shape, strides):
    rng = np.random.default_rng(23)
    c = shape[1]
    x, wt, b = rnd(rng, shape), rnd(rng, (c, 1, 3, 3)), rnd(rng, (c,))
    a = {"strides": strides, "pads": (1, 1, 1, 1), "groups": c}
    y = _fused("conv2d_nchw.depthwise", x, wt, b, None, a)
    close(y, np.clip(conv2d_ref(x, wt, strides, (1, 1, 1, 1), (1, 1), c) + b.reshape(1, -1, 1, 1), 0, 6))


def test_flat_schedules_vectorize_contiguously():
    """The pixel index y*W + x of a fused (y, x) loop folds back to one ramp (no per-lane gather)."""
    X = te.placeholder((1, 8, 14, 14), "float32", "x")
    W = te.placeholder((16, 8), "float32", "w")
    y = nn.conv2d_pointwise(X, W)
    text = str(lower(cpu.schedule_conv2d_pointwise([y]), [X, W, y]))
    assert "ramp(" in text and "// broadcast(14" not in text and "% broadcast(14" not in text


def test_simplify_merges_div_mod_with_reduced_operand():
    v, u = E.Var("v", "int32"), E.Var("u", "int32")
    e = (v * 16 + u) // 14 * 14 + (v * 2 + u) % 14      # what the simplifier leaves of a split fused index
    lin = arith.linear(e)
    assert not any(isinstance(a, (E.FloorDiv, E.FloorMod)) for a, _ in lin.terms.values())
    assert lin.coef_of(v) == 16 and lin.coef_of(u) == 1
    bad = (v * 16 + u) // 14 * 14 + (v * 3 + u) % 14    # not congruent: must stay
    assert any(isinstance(a, E.FloorMod) for a, _ in arith.linear(bad).terms.values())


@pytest.mark.parametrize("vector_bytes, registers", [(16, 16), (32, 16), (64, 32)], ids=["sse", "avx2", "avx512"])
def test_register_tiles_of_every_vector_unit_compute_the_same(monkeypatch, vector_bytes, registers):
    """The schedules size register tiles by the host's vector unit (cpu.TILES); every sizing
    (SSE, AVX2, AVX-512) must give the same results, whichever machine runs the tests."""
    monkeypatch.setattr(cpu, "TILES", cpu.Tiles(vector_bytes, registers))
    ops.api.clear_cache()   # compiled kernels are cached by shape, not by tile sizes
    try:
        rng = np.random.default_rng(4)
        x, w3, w1 = rnd(rng, (1, 24, 11, 30)), rnd(rng, (40, 24, 3, 3)), rnd(rng, (40, 24, 1, 1))
        f = ops.compile_op("conv2d", [x.shape, w3.shape], {"pads": (1, 1, 1, 1)}, consts={1: w3})
        assert f.impl.name == "conv2d_nchw.nchwc"
        close(f(x), conv2d_ref(x, w3, (1, 1), (1, 1, 1, 1), (1, 1), 1))
        f = ops.compile_op("conv2d", [x.shape, w1.shape], {}, consts={1: w1})
        assert f.impl.name == "conv2d_nchw.pointwise"
        close(f(x), conv2d_ref(x, w1, (1, 1), (0, 0, 0, 0), (1, 1), 1))
        a, b = rnd(rng, (13, 70)), rnd(rng, (35, 70))
        close(ops.compile_op("dense", [a.shape, b.shape], consts={1: b})(a), a @ b.T)
        c = rnd(rng, (70, 29))
        close(ops.compile_op("matmul", [a.shape, c.shape])(a, c), a @ c)
    finally:
        ops.api.clear_cache()


def test_host_simd_override_is_checked(monkeypatch):
    """$KIT_VECTOR_BYTES sizes the register tiles for another vector unit; a bad value is refused by name."""
    monkeypatch.setenv("KIT_VECTOR_BYTES", "64")
    assert cpu.host_simd() == (64, 32)
    monkeypatch.setenv("KIT_VECTOR_BYTES", "16")
    assert cpu.host_simd() == (16, 16)
    monkeypatch.setenv("KIT_VECTOR_BYTES", "48")
    with pytest.raises(ValueError, match=r"KIT_VECTOR_BYTES='48': expected 16, 32 or 64"):
        cpu.host_simd()
