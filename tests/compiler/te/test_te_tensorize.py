"""tensorize: a loop nest replaced by a declared intrinsic, checked for semantic match."""
import numpy as np
import pytest

from compiler import lower, te, tir
from compiler.errors import TensorizeError
from tests.compiler.conftest import run_schedule


def gemm_intrin(n=4, scope=None, split_reduction=True):
    """y[i, j] = sum_k x[i, k] * w[j, k], emitted as plain tir loops (a stand-in kernel)."""
    x = te.placeholder((n, n), name="x")
    w = te.placeholder((n, n), name="w")
    k = te.reduce_axis(n, "k")
    y = te.compute((n, n), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="y")
    calls = []

    def emit(ins, outs):
        X, W = ins
        Y = outs[0]
        calls.append((X, W, Y))
        i, j, kk = tir.Var("ii"), tir.Var("jj"), tir.Var("kk")
        update = tir.For(i, 0, n, "serial", tir.For(j, 0, n, "serial", tir.For(kk, 0, n, "serial",
                 Y.vstore([i, j], Y.vload([i, j]) + X.vload([i, kk]) * W.vload([j, kk])))))
        i2, j2 = tir.Var("ii"), tir.Var("jj")
        reset = tir.For(i2, 0, n, "serial", tir.For(j2, 0, n, "serial", Y.vstore([i2, j2], 0.0)))
        if not split_reduction:
            return tir.seq(reset, update)
        return tir.seq(reset, update), reset, update

    binds = {}
    if scope is not None:
        binds = {x: tir.Buffer("xb", (n, n), scope=scope)}
    intrin = te.decl_tensor_intrin(y.op, emit, name="gemm4", binds=binds)
    return intrin, calls


def dense(n=16, transposed=True):
    A = te.placeholder((n, n), name="A")
    W = te.placeholder((n, n), name="W")
    k = te.reduce_axis(n, "k")
    if transposed:
        C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * W[j, k], axis=k), name="C")
    else:
        C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), name="C")
    return A, W, C


def schedule(C, intrin, tile=4):
    s = te.create_schedule(C)
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], tile, tile)
    ko, ki = s[C].split(C.op.reduce_axis[0], tile)
    s[C].reorder(io, jo, ko, ii, ji, ki)
    s[C].tensorize(ii, intrin)
    return s


def test_tensorize_gemm_runs_and_replaces_the_nest(rng):
    intrin, calls = gemm_intrin()
    A, W, C = dense()
    s = schedule(C, intrin)
    f = lower(s, [A, W, C])
    assert calls, "the intrinsic's fcompute was not called"
    X, Wv, Y = calls[-1]
    assert X.base is not None and X.shape[0].value == 4   # views of the real buffers
    assert "kk" in f.script() and "k.inner" not in f.script()
    a, w = rng.random((16, 16), dtype=np.float32), rng.random((16, 16), dtype=np.float32)
    np.testing.assert_allclose(run_schedule(s, [A, W, C], [a, w]), a @ w.T, rtol=1e-5)


def test_tensorize_mismatching_body_says_which_index():
    intrin, _ = gemm_intrin()
    A, W, C = dense(transposed=False)
    s = schedule(C, intrin)
    with pytest.raises(TensorizeError, match=r"stage 'C' tensorize with 'gemm4'.*index 0 of 'W' is `k` "
                                             r"relative to the region, the intrinsic reads 'w' at `j`"):
        lower(s, [A, W, C])


def test_tensorize_mismatching_operation():
    intrin, _ = gemm_intrin()
    A = te.placeholder((16, 16), name="A")
    W = te.placeholder((16, 16), name="W")
    k = te.reduce_axis(16, "k")
    C = te.compute((16, 16), lambda i, j: te.sum(A[i, k] + W[j, k], axis=k), name="C")
    s = schedule(C, intrin)
    with pytest.raises(TensorizeError, match="Add .* where the intrinsic has Mul"):
        lower(s, [A, W, C])


def test_tensorize_wrong_extent():
    intrin, _ = gemm_intrin(n=4)
    A, W, C = dense()
    s = schedule(C, intrin, tile=8)
    with pytest.raises(TensorizeError, match="has extent 8, the intrinsic's axis 'i' 4"):
        lower(s, [A, W, C])


def test_tensorize_needs_reset_update_when_reduction_outside():
    intrin, _ = gemm_intrin(split_reduction=False)
    A, W, C = dense()
    s = schedule(C, intrin)
    with pytest.raises(TensorizeError, match="reduction loop 'k.outer' lies outside"):
        lower(s, [A, W, C])


def test_tensorize_operand_scope_checked():
    intrin, _ = gemm_intrin(scope="inp_buffer")
    A, W, C = dense()
    s = schedule(C, intrin)
    with pytest.raises(TensorizeError, match="operand 'x' must be in scope 'inp_buffer' but 'A' is in 'global'"):
        lower(s, [A, W, C])


def test_tensorize_with_cache_read_into_scope(rng):
    intrin, _ = gemm_intrin(scope="inp_buffer")
    A, W, C = dense()
    s = te.create_schedule(C)
    AB = s.cache_read(A, "inp_buffer", [C])
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 4)
    ko, ki = s[C].split(C.op.reduce_axis[0], 4)
    s[C].reorder(io, jo, ko, ii, ji, ki)
    s[AB].compute_at(s[C], ko)
    s[C].tensorize(ii, intrin)
    f = lower(s, [A, W, C])
    assert "scope='inp_buffer'" in f.script()
    a, w = rng.random((16, 16), dtype=np.float32), rng.random((16, 16), dtype=np.float32)
    np.testing.assert_allclose(run_schedule(s, [A, W, C], [a, w]), a @ w.T, rtol=1e-5)


def test_tensorize_extern_call_is_emitted():
    """An intrinsic that calls an external function: the call and pointer arguments appear in the IR."""
    n = 4
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: x[i] * 2.0, name="y")

    def emit(ins, outs):
        return tir.Evaluate(tir.call_extern("int32", "scale2", outs[0].access_ptr(), ins[0].access_ptr()))

    intrin = te.decl_tensor_intrin(y.op, emit, name="scale2")
    A = te.placeholder((16,), name="A")
    B = te.compute((16,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B)
    io, ii = s[B].split(B.op.axis[0], n)
    s[B].tensorize(ii, intrin)
    f = lower(s, [A, B])
    assert "@scale2(address_of(B[i.outer * 4]), address_of(A[i.outer * 4]))" in f.script()
