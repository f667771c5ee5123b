"""Schedule primitives: each gives the right result, shows up in the loop IR, and refuses
illegal uses with a message naming the stage, the primitive and the axis."""
import numpy as np
import pytest

from compiler import lower, te
from compiler.errors import CodegenError, LowerError, ScheduleError
from compiler.tir import Allocate, For, ForKind, collect
from tests.compiler.conftest import run_schedule


def matmul(n=16, m=12, k=8, name="C"):
    A = te.placeholder((n, k), name="A")
    B = te.placeholder((k, m), name="B")
    r = te.reduce_axis(k, "r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name=name)
    return A, B, C


def check_matmul(s, A, B, C, rng):
    a = rng.random(A.shape, dtype=np.float32)
    b = rng.random(B.shape, dtype=np.float32)
    np.testing.assert_allclose(run_schedule(s, [A, B, C], [a, b]), a @ b, rtol=1e-5, atol=1e-5)


def loops(func):
    return {f.loop_var.name: f for f in collect(func.body, (For,))}


def test_split_factor_and_nparts(rng):
    A, B, C = matmul(n=10)
    s = te.create_schedule(C)
    io, ii = s[C].split(C.op.axis[0], factor=4)
    jo, ji = s[C].split(C.op.axis[1], nparts=5)
    f = lower(s, [A, B, C], raw=True)
    ls = loops(f)
    assert ls["i.outer"].extent.value == 3 and ls["i.inner"].extent.value == 4
    assert ls["j.outer"].extent.value == 5 and ls["j.inner"].extent.value == 3
    check_matmul(s, A, B, C, rng)


def test_tile_reorder_orders_loops(rng):
    A, B, C = matmul()
    s = te.create_schedule(C)
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], 4, 4)
    assert s[C].leaf_iter_vars == [xo, yo, xi, yi, C.op.reduce_axis[0]]
    s[C].reorder(C.op.reduce_axis[0], xi)
    assert s[C].leaf_iter_vars == [xo, yo, C.op.reduce_axis[0], yi, xi]   # the named loops swap slots
    check_matmul(s, A, B, C, rng)


def test_fuse_then_split(rng):
    A, B, C = matmul()
    s = te.create_schedule(C)
    f = s[C].fuse(C.op.axis[0], C.op.axis[1])
    fo, fi = s[C].split(f, 5)
    assert f.name == "i.j.fused"
    check_matmul(s, A, B, C, rng)


def test_split_of_fused_axis_names_the_fusion():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].fuse(C.op.axis[0], C.op.axis[1])
    with pytest.raises(ScheduleError, match=r"stage 'C': split: axis 'i' is no longer a loop of this "
                                            r"stage: it was fused into 'i.j.fused'"):
        s[C].split(C.op.axis[0], 2)


def test_fuse_requires_adjacent_loops():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].reorder(C.op.axis[0], C.op.reduce_axis[0], C.op.axis[1])
    with pytest.raises(ScheduleError, match="not adjacent"):
        s[C].fuse(C.op.axis[0], C.op.axis[1])


def test_fuse_reduce_with_data_axis_refused():
    A, B, C = matmul()
    s = te.create_schedule(C)
    with pytest.raises(ScheduleError, match="reduction axis with a data-parallel"):
        s[C].fuse(C.op.axis[1], C.op.reduce_axis[0])


def test_axis_of_another_stage_is_named():
    A, B, C = matmul()
    D = te.compute(C.shape, lambda i, j: C[i, j] * 2.0, name="D")
    s = te.create_schedule(D)
    with pytest.raises(ScheduleError, match="belongs to stage 'C'"):
        s[D].split(C.op.axis[0], 2)


def test_parallel_on_reduction_axis_refused():
    A, B, C = matmul()
    s = te.create_schedule(C)
    with pytest.raises(ScheduleError, match="'r' is a reduction axis"):
        s[C].parallel(C.op.reduce_axis[0])


def test_compute_inline(rng):
    A = te.placeholder((8, 8), name="A")
    B = te.compute((8, 8), lambda i, j: A[i, j] * 3.0, name="B")
    C = te.compute((8, 8), lambda i, j: B[j, i] + 1.0, name="C")
    s = te.create_schedule(C)
    s[B].compute_inline()
    f = lower(s, [A, C])
    assert "B" not in f.script()
    a = rng.random((8, 8), dtype=np.float32)
    np.testing.assert_allclose(run_schedule(s, [A, C], [a]), a.T * 3 + 1, rtol=1e-6)


def test_compute_inline_of_reduction_refused():
    A, B, C = matmul()
    D = te.compute(C.shape, lambda i, j: C[i, j] * 2.0, name="D")
    s = te.create_schedule(D)
    with pytest.raises(ScheduleError, match="stage 'C': compute_inline: a reduction"):
        s[C].compute_inline()


def test_compute_at_shrinks_the_buffer(rng):
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] * A[i], name="B")
    k = te.reduce_axis(3, "k")
    C = te.compute((62,), lambda i: te.sum(B[i + k], axis=k), name="C")
    s = te.create_schedule(C)
    io, ii = s[C].split(C.op.axis[0], 8)
    s[B].compute_at(s[C], io)
    f = lower(s, [A, C])
    allocs = [a.buffer for a in collect(f.body, (te_alloc(),))]
    assert allocs and all(b.const_shape() == (10,) for b in allocs)
    a = rng.random(64, dtype=np.float32)
    ref = np.array([(a[i:i + 3] ** 2).sum() for i in range(62)])
    np.testing.assert_allclose(run_schedule(s, [A, C], [a]), ref, rtol=1e-5)


def te_alloc():
    return Allocate


def test_compute_at_outside_consumer_refused():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((8,), lambda i: A[i] * 2.0, name="C")
    D = te.compute((8,), lambda i: B[i] + C[i], name="D")
    s = te.create_schedule(D)
    with pytest.raises(ScheduleError, match=r"stage 'B': compute_at: stage 'C' does not read 'B'.*consumers of 'B': D"):
        s[B].compute_at(s[C], C.op.axis[0])


def test_compute_at_axis_not_of_parent():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((8,), lambda i: B[i] * 2.0, name="C")
    s = te.create_schedule(C)
    io, ii = s[C].split(C.op.axis[0], 2)
    with pytest.raises(ScheduleError, match=r"axis 'i' is not a loop of stage 'C' \(it was split"):
        s[B].compute_at(s[C], C.op.axis[0])
    with pytest.raises(ScheduleError, match="it is an axis of 'B' itself"):
        s[B].compute_at(s[C], B.op.axis[0])


def test_compute_at_with_second_reader_outside_refused_at_lowering():
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((8,), lambda i: B[i] * 2.0, name="C")
    D = te.compute((8,), lambda i: B[i] + C[i], name="D")
    s = te.create_schedule(D)
    s[B].compute_at(s[C], C.op.axis[0])
    with pytest.raises(ScheduleError, match="'D' also reads 'B' outside that loop"):
        lower(s, [A, D])


def test_cache_read_and_cache_write(rng):
    A, B, C = matmul(16, 16, 16)
    s = te.create_schedule(C)
    CL = s.cache_write(C, "local")
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], 8, 8)
    s[CL].compute_at(s[C], jo)
    AA = s.cache_read(A, "shared", [CL])
    ko, ki = s[CL].split(s[CL].op.reduce_axis[0], 4)
    s[AA].compute_at(s[CL], ko)
    f = lower(s, [A, B, C])
    scopes = {a.buffer.name: (a.buffer.scope, a.buffer.const_shape()) for a in collect(f.body, (te_alloc(),))}
    assert scopes["C.local"] == ("local", (8, 8))
    assert scopes["A.shared"] == ("shared", (1, 4))
    check_matmul(s, A, B, C, rng)


def test_cache_write_after_split_refused():
    A, B, C = matmul()
    s = te.create_schedule(C)
    s[C].split(C.op.axis[0], 2)
    with pytest.raises(ScheduleError, match="before other primitives"):
        s.cache_write(C, "local")


def test_annotations_appear_in_loop_ir(rng):
    A = te.placeholder((16, 16), name="A")
    B = te.compute((16, 16), lambda i, j: A[i, j] + 1.0, name="B")
    s = te.create_schedule(B)
    xo, xi = s[B].split(B.op.axis[0], nparts=2)
    s[B].bind(xo, te.thread_axis("vthread"))
    s[B].pragma(xi, "dma_copy")
    s[B].unroll(B.op.axis[1])
    f = lower(s, [A, B], raw=True)
    ls = loops(f)
    assert ls["i.outer"].kind == ForKind.VTHREAD and ls["i.outer"].thread_tag == "vthread"
    assert ls["j"].kind == ForKind.UNROLLED
    assert "with attr(i.inner, 'pragma_dma_copy', 1):" in f.script()
    a = rng.random((16, 16), dtype=np.float32)
    np.testing.assert_allclose(run_schedule(s, [A, B], [a]), a + 1)


def test_bind_gpu_thread_is_lowered_but_not_built_for_cpu():
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B)
    bx, tx = s[B].split(B.op.axis[0], 32)
    s[B].bind(bx, te.thread_axis("blockIdx.x"))
    s[B].bind(tx, te.thread_axis("threadIdx.x"))
    f = lower(s, [A, B])
    assert loops(f)["i.inner"].thread_tag == "threadIdx.x"
    with pytest.raises(CodegenError, match="'threadIdx.x'|'blockIdx.x'"):
        run_schedule(s, [A, B], [np.zeros(64, np.float32)])


def test_missing_argument_named():
    A, B, C = matmul()
    s = te.create_schedule(C)
    with pytest.raises(LowerError, match="placeholder 'B' is read by C but is not in args"):
        lower(s, [A, C])
    with pytest.raises(LowerError, match="output 'C' is missing"):
        lower(s, [A, B])


def test_unknown_tensor_in_schedule():
    A, B, C = matmul()
    X = te.placeholder((2,), name="X")
    s = te.create_schedule(C)
    with pytest.raises(ScheduleError, match="'X' is not part of this schedule"):
        s[X]


def test_multi_stage_root_pipeline(rng):
    A = te.placeholder((32, 32), name="A")
    P = te.compute((34, 34), lambda i, j: te.if_then_else(
        te.all(i >= 1, i < 33, j >= 1, j < 33), A[i - 1, j - 1], 0.0), name="P")
    kh, kw = te.reduce_axis(3, "kh"), te.reduce_axis(3, "kw")
    C = te.compute((32, 32), lambda i, j: te.sum(P[i + kh, j + kw], axis=[kh, kw]), name="C")
    R = te.compute((32, 32), lambda i, j: te.max(C[i, j], 0.0) if False else te.elem_max(C[i, j], 4.0), name="R")
    s = te.create_schedule(R)
    s[C].compute_at(s[R], R.op.axis[0])
    s[P].compute_at(s[C], C.op.axis[0])
    s[R].parallel(R.op.axis[0])
    s[C].vectorize(C.op.axis[1])
    a = rng.random((32, 32), dtype=np.float32)
    pa = np.pad(a, 1)
    ref = np.maximum(sum(pa[i:i + 32, j:j + 32] for i in range(3) for j in range(3)), 4.0)
    np.testing.assert_allclose(run_schedule(s, [A, R], [a]), ref, rtol=1e-5)
