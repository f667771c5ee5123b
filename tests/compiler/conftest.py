"""Shared helpers of the compiler tests: build a schedule and run it on numpy arrays."""
import numpy as np
import pytest

from compiler import build


def run_schedule(s, args, inputs, target="llvm"):
    """Build s for args, call it on `inputs` (arrays for the leading args) and fresh zero
    outputs for the remaining args; return the outputs."""
    mod = build(s, args, target=target)
    outs = [np.zeros(t.shape, t.dtype) for t in args[len(inputs):]]
    mod(*inputs, *outs)
    return outs[0] if len(outs) == 1 else outs


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
