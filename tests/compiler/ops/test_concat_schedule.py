"""The concat schedule (outer axes, the concat axis split at input boundaries, the rest one
vectorized run) against numpy: every axis, ragged inner sizes, int8, a fused epilogue, and the
generic fallback when another stage stays at root."""
import numpy as np
import pytest

from compiler import build, lower, ops, te
from compiler.ops import cpu
from compiler.ops import elemwise as ew
from compiler.ops import transform as tf


@pytest.mark.parametrize("shapes,axis", [([(1, 64, 28, 28), (1, 32, 28, 28), (1, 16, 28, 28)], 1),
                                         ([(2, 3, 5, 7), (2, 4, 5, 7)], 1),
                                         ([(2, 3, 5), (2, 3, 9)], 2),
                                         ([(3, 4), (5, 4), (1, 4)], 0),
                                         ([(1, 8, 3, 3), (1, 8, 3, 3)], -3)])
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_concat_matches_numpy(shapes, axis, dtype):
    rng = np.random.default_rng(60)
    xs = [rng.integers(-100, 100, s).astype(dtype) for s in shapes]
    f = ops.compile_op("concat", shapes, {"axis": axis}, dtype=dtype)
    np.testing.assert_array_equal(f(*xs), np.concatenate(xs, axis))


def test_concat_of_hundreds_of_inputs_compiles():
    """A select tree, not a chain: 400 inputs once made a select 400 deep, and lowering recursed
    past Python's limit (the kernel fell back to numpy)."""
    rng = np.random.default_rng(62)
    shapes = [(2, int(rng.integers(1, 4)), 3) for _ in range(400)]
    xs = [rng.standard_normal(s).astype("float32") for s in shapes]
    f = ops.compile_op("concat", shapes, {"axis": 1})
    np.testing.assert_array_equal(f(*xs), np.concatenate(xs, 1))


def test_concat_fused_relu_and_per_channel_affine():
    rng = np.random.default_rng(61)
    a, b = rng.standard_normal((1, 16, 6, 8)).astype("float32"), rng.standard_normal((1, 8, 6, 8)).astype("float32")
    sc = rng.standard_normal((24,)).astype("float32")
    A, B, S = te.placeholder(a.shape, "float32", "a"), te.placeholder(b.shape, "float32", "b"), te.placeholder((24,), "float32", "s")
    c = tf.concat(A, B, axis=1)
    y = ew.relu(te.compute(c.shape, lambda n, k, i, j: c[n, k, i, j] * S[k], name="scale", tag="elemwise"))
    s = cpu.schedule_concat([y])
    text = str(lower(s, [A, B, S, y]))
    assert "ramp(" in text
    mod = build(cpu.schedule_concat([y]), [A, B, S, y], target="llvm")
    out = np.empty((1, 24, 6, 8), "float32")
    mod(a, b, sc, out)
    np.testing.assert_allclose(out, np.maximum(np.concatenate([a, b], 1) * sc.reshape(1, -1, 1, 1), 0), rtol=1e-6)


def test_first_input_copies_without_select():
    A, B = te.placeholder((1, 32, 4, 8), "float32", "a"), te.placeholder((1, 16, 4, 8), "float32", "b")
    y = tf.concat(A, B, axis=1)
    text = str(lower(cpu.schedule_concat([y]), [A, B, y]))
    first = [ln for ln in text.splitlines() if "] = " in ln][0]
    assert "select" not in first and "a[ramp(" in first
