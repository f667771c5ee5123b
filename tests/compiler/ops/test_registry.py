"""The registry and the high-level API: lookups, declines with reasons, attribute checks, caching."""
import numpy as np
import pytest

from compiler import ops, te
from compiler.build import build


def test_get_returns_compute_and_schedule_usable_with_build():
    compute, schedule = ops.get("relu", target="llvm")
    x = te.placeholder((4, 16), "float32", "x")
    y = compute(x)
    mod = build(schedule([y]), [x, y], target="llvm")
    a = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)
    out = np.empty_like(a)
    mod(a, out)
    np.testing.assert_array_equal(out, np.maximum(a, 0))


def test_unsupported_target_is_declined_with_reason():
    with pytest.raises(ops.OpNotSupported, match="compiler.accel"):
        ops.get("dense", target="vta")


def test_gpu_schedules_are_registered_whatever_was_imported_first():
    assert ops.implementations("conv2d", target="cuda")
    with pytest.raises(ops.OpNotSupported, match="no GPU kernel for this operator"):
        ops.implementations("conv2d_transpose", target="cuda")    # declared, no kernel anywhere


def test_implementation_declines_explain_themselves():
    with pytest.raises(ops.OpNotSupported, match="accelerator"):
        ops.compile_op("qconv2d", [(1, 16, 4, 4), (16, 16, 1, 1), (16,)],
                       {"in_shift": 1, "w_shift": 1, "out_shift": 1, "layout": "NCHWnc"}, ["int8", "int8", "int32"])
    comp, _ = ops.get("conv2d", shapes=[(1, 8, 5, 5), (8, 1, 3, 3)], attrs={"groups": 8})
    assert comp is ops.IMPLS[("conv2d", "llvm")][1].compute   # grouped: the direct implementation
    with pytest.raises(ops.OpNotSupported, match="groups=8"):
        ops.compile_op("conv2d", [(1, 8, 5, 5), (8, 1, 3, 3)], {"groups": 8}, impl="conv2d_nchw.nchwc")


def test_unknown_op_and_attribute_messages():
    with pytest.raises(ops.OpError, match="unknown operator 'conv3d'.*conv2d"):
        ops.get("conv3d")
    with pytest.raises(ops.OpError, match="unknown attribute.*stride"):
        ops.compile_op("conv2d", [(1, 3, 4, 4), (4, 3, 1, 1)], {"stride": (1, 1)})
    with pytest.raises(ops.OpError, match="missing required attribute 'perm'"):
        ops.compile_op("transpose", [(2, 3)])
    with pytest.raises(ops.OpError, match="takes 2 inputs"):
        ops.compile_op("add", [(2, 3)])


def test_compile_cache_and_input_checks():
    f = ops.compile_op("add", [(2, 3), (3,)])
    g = ops.compile_op("add", [(2, 3), (3,)])
    assert f.module is g.module
    with pytest.raises(ops.OpError, match="input 1 has shape"):
        f(np.zeros((2, 3), np.float32), np.zeros((2,), np.float32))
    with pytest.raises(ops.OpError, match="takes 1 input"):
        ops.compile_op("dense", [(1, 4), (3, 4)], consts={1: np.ones((3, 4), np.float32)})(
            np.ones((1, 4), np.float32), np.ones((3, 4), np.float32))


def test_list_ops_and_docs():
    """list_ops() is every declared op; the CPU has kernels for all but those the runtime runs
    from the reference (numpy)."""
    every, cpu = set(ops.list_ops()), set(ops.list_ops("llvm"))
    assert cpu < every and {"conv2d", "qconv2d", "softmax", "conv2d_NCHWc", "layout_transform", "pack",
                            "unpack"} <= cpu
    assert "gather" in every - cpu
    for name in every:
        assert ops.OPS[name].doc, name
    for name in cpu:
        assert ops.implementations(name, "llvm"), name
