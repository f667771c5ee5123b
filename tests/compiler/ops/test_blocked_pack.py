"""The accelerator's blocked layout (pack N C .. -> N' C' .. b0 b1 with zero padding, and unpack)
as LLVM kernels: bit for bit what accel.isa.layout's NumPy twins give, for any rank, padding and
blocking, so the host converts at the accelerator boundary in compiled code."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel.isa.layout import pack_blocked, unpack_blocked
from compiler import ops
from compiler.ops.registry import OpError

SHAPES = st.sampled_from([(1, 16, 7, 9), (1, 40, 5, 5), (3, 20, 4, 6), (2, 33), (1, 16, 2, 3, 4), (5, 70, 1, 1)])
BLOCKS = st.sampled_from([(1, 16), (1, 8), (2, 16), (4, 4), (1, 32)])
DTYPES = st.sampled_from(["int8", "float32", "int32"])


def _data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    return rng.integers(-128, 128, shape).astype(dtype)


@settings(max_examples=25, deadline=None)
@given(shape=SHAPES, block=BLOCKS, dtype=DTYPES, seed=st.integers(0, 99))
def test_pack_and_unpack_kernels_match_the_layout_contract(shape, block, dtype, seed):
    x = _data(shape, dtype, seed)
    pack = ops.compile_op("pack", [shape], {"block": block}, dtype=dtype)
    assert pack.impl.name == "pack.injective"
    packed = pack(x)
    np.testing.assert_array_equal(packed, pack_blocked(x, block))   # padding is zeros
    unpack = ops.compile_op("unpack", [packed.shape], {"shape": shape}, dtype=dtype)
    np.testing.assert_array_equal(unpack(packed), unpack_blocked(packed, shape))
    np.testing.assert_array_equal(unpack(packed), x)


def test_unpack_reads_every_block_lane_whatever_the_padding_holds():
    """unpack crops: the padding lanes of its input never reach the output."""
    shape, block = (1, 20, 3, 5), (1, 16)
    x = _data(shape, "int8", 1)
    packed = pack_blocked(x, block)
    packed[:, -1, ..., 4:] = 99   # channels 20..31 are padding
    unpack = ops.compile_op("unpack", [packed.shape], {"shape": shape}, dtype="int8")
    np.testing.assert_array_equal(unpack(packed), x)


@pytest.mark.parametrize("op, shapes, attrs, match", [
    ("pack", [(4,)], {"block": (1, 16)}, r"pack: needs an input of rank 2 or more"),
    ("unpack", [(1, 2, 3, 1, 16)], {"shape": (1, 40, 3)}, r"unpack: \[1, 2, 3, 1, 16\] is not a blocked layout of \[1, 40, 3\]"),
    ("unpack", [(1, 2, 3, 1, 16)], {"shape": (1, 32, 3, 4)}, r"is not a blocked layout"),
])
def test_bad_blockings_are_refused_in_one_line(op, shapes, attrs, match):
    with pytest.raises(OpError, match=match):
        ops.compile_op(op, shapes, attrs, dtype="int8")
