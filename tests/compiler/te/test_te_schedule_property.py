"""Property: any legal schedule of the same computation gives the same numbers.

Random schedules of a three-stage graph (elementwise producer -> matmul -> epilogue) with
splits that do not divide, reorders, fusion, cache_write, compute_at / compute_inline at
random loops, vectorize / unroll / parallel, are built for the host and compared with numpy.
"""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import te
from compiler.te.tensor import IterVar
from tests.compiler.conftest import run_schedule

N, M, K = 12, 10, 6


def graph():
    A = te.placeholder((N, K), name="A")
    W = te.placeholder((K, M), name="W")
    B = te.compute((N, K), lambda i, r: A[i, r] * 2.0 + 1.0, name="B")
    r = te.reduce_axis(K, "r")
    C = te.compute((N, M), lambda i, j: te.sum(B[i, r] * W[r, j], axis=r), name="C")
    D = te.compute((N, M), lambda i, j: te.elem_max(C[i, j] * 0.5, 3.0), name="D")
    return A, W, B, C, D


def reference(a, w):
    return np.maximum(((a * 2 + 1) @ w) * 0.5, 3.0)


def shape_loops(data, stage, label):
    """Random splits, a random order, maybe one fusion of two adjacent data-parallel loops."""
    for iv in list(stage.leaf_iter_vars):
        if data.draw(st.booleans(), label=f"{label} split {iv.name}"):
            stage.split(iv, factor=data.draw(st.integers(1, 7), label="factor"))
    leaves = list(stage.leaf_iter_vars)
    order = data.draw(st.permutations(leaves), label=f"{label} order")
    stage.reorder(*order)
    leaves = stage.leaf_iter_vars
    pairs = [k for k in range(len(leaves) - 1)
             if leaves[k].iter_type == leaves[k + 1].iter_type == IterVar.DATA_PAR]
    if pairs and data.draw(st.booleans(), label=f"{label} fuse"):
        k = data.draw(st.sampled_from(pairs), label="fuse at")
        stage.fuse(leaves[k], leaves[k + 1])


def annotate(data, stage, label):
    leaves = stage.leaf_iter_vars
    vec = data.draw(st.booleans(), label=f"{label} vectorize innermost")
    if vec:
        stage.vectorize(leaves[-1])
    last = len(leaves) - (2 if vec else 1)
    if last >= 1 and data.draw(st.booleans(), label=f"{label} unroll"):
        stage.unroll(leaves[data.draw(st.integers(1, last), label="unroll at")])
    outer_free = not vec or len(leaves) > 1  # a single loop cannot be both vectorized and parallel
    if outer_free and leaves[0].iter_type == IterVar.DATA_PAR and data.draw(st.booleans(), label=f"{label} parallel"):
        stage.parallel(leaves[0])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_legal_schedules_agree_with_numpy(data):
    A, W, B, C, D = graph()
    s = te.create_schedule(D)
    compute_c = s[C]
    if data.draw(st.booleans(), label="cache_write C"):
        CL = s.cache_write(C, "local")
        compute_c = s[CL]
    shape_loops(data, s[D], "D")
    shape_loops(data, compute_c, "C")
    if compute_c is not s[C]:
        shape_loops(data, s[C], "C copy")
        cl_where = data.draw(st.sampled_from(["root", "at"]), label="CL placement")
        if cl_where == "at":
            compute_c.compute_at(s[C], data.draw(st.sampled_from(s[C].leaf_iter_vars), label="CL at"))
    c_where = data.draw(st.sampled_from(["root", "at", "inline_epilogue"]), label="C placement")
    if c_where == "at":
        s[C].compute_at(s[D], data.draw(st.sampled_from(s[D].leaf_iter_vars), label="C at"))
    b_where = data.draw(st.sampled_from(["root", "inline", "at"]), label="B placement")
    if b_where == "inline":
        s[B].compute_inline()
    elif b_where == "at":
        s[B].compute_at(compute_c, data.draw(st.sampled_from(compute_c.leaf_iter_vars), label="B at"))
    annotate(data, s[D], "D")
    annotate(data, compute_c, "C")
    if b_where != "inline":
        annotate(data, s[B], "B")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    a = rng.random((N, K), dtype=np.float32)
    w = rng.random((K, M), dtype=np.float32)
    out = run_schedule(s, [A, W, D], [a, w])
    np.testing.assert_allclose(out, reference(a, w), rtol=1e-5, atol=1e-5)
