"""take by constant indices (ONNX Gather with constant indices; Resize's nearest map, one take
per resized axis) as an LLVM kernel where the indices have an affine-floor form; the numpy
reference ran two steps per nearest upsampling and split the kernels around it."""
import numpy as np
import pytest

from compiler import ops
from compiler.ops.transform import affine_floor


@pytest.mark.parametrize("indices, form", [
    ([0, 0, 1, 1, 2, 2], (1, 0, 2)),           # nearest 2x upsampling
    ([0, 2, 4, 6], (2, 0, 1)),                 # a strided gather (nearest downsampling)
    ([0, 1, 1, 2, 3, 3, 4], (2, 1, 3)),        # a rational factor, 1.5x
    ([5], (0, 5, 1)), ([3, 1, 2], None), ([0, 3, 3, 3], None), ([0, 0, 0, 1], (1, 0, 3)),
])
def test_affine_floor_forms(indices, form):
    assert affine_floor(indices) == form


@pytest.mark.parametrize("axis", [0, 2, -1])
@pytest.mark.parametrize("factor", [2, 3])
def test_take_by_an_affine_map_compiles_and_matches_numpy(axis, factor):
    """Nearest upsampling as the ONNX import writes it (a take per axis) runs as an LLVM kernel."""
    x = np.random.default_rng(3).standard_normal((3, 4, 5)).astype(np.float32)
    idx = np.arange(factor * x.shape[axis]) // factor
    f = ops.compile_op("take", [x.shape], {"indices": idx.tolist(), "axis": axis})
    assert f.impl.name == "take.affine"
    np.testing.assert_array_equal(f(x), np.take(x, idx, axis=axis))


def test_take_by_an_irregular_map_has_no_llvm_kernel():
    with pytest.raises(Exception, match="affine-floor"):
        ops.compile_op("take", [(3, 4)], {"indices": [3, 0, 2], "axis": 1})
