"""Passes over PrimFuncs, registered by name, and the named pipelines that chain them.

A pass is a callable PrimFunc -> PrimFunc. `PIPELINES[name]` lists pass names with the reason
each sits where it does; backends add their own lowering passes after these (the CPU backend
lowers virtual threads and outlines parallel loops in compiler.codegen).
"""
from __future__ import annotations

import logging
from typing import Callable

from ...errors import PassError
from ..stmt import PrimFunc

log = logging.getLogger(__name__)

PASSES: dict[str, Callable[[], Callable[[PrimFunc], PrimFunc]]] = {}


def register_pass(name: str):
    def deco(factory):
        PASSES[name] = factory
        return factory
    return deco


from .flatten import FlattenStorage  # noqa: E402
from .loop_partition import PartitionLoops  # noqa: E402
from .simplify import RemoveNoOp, Simplify  # noqa: E402
from .unroll import UnrollLoops  # noqa: E402
from .vectorize import VectorizeLoops  # noqa: E402
from .vthread import LowerVirtualThread  # noqa: E402

#: name -> [(pass, why it is here)]
PIPELINES: dict[str, list[tuple[str, str]]] = {
    "default": [
        ("Simplify", "fold the index arithmetic that split/fuse/compute_at produce"),
        ("PartitionLoops", "peel loop tails so guards from non-dividing splits and padding leave the main body"),
        ("Simplify", "drop guards the partition made provably true"),
        ("FlattenStorage", "n-d buffer accesses -> one flat index per buffer (tensorize views resolved)"),
        ("Simplify", "merge the stride arithmetic into affine indices"),
        ("UnrollLoops", "replicate unrolled loops so their bodies see constant indices"),
        ("VectorizeLoops", "turn vectorized loops into vector expressions (ramp/broadcast)"),
        ("Simplify", "fold constants exposed by unrolling"),
        ("RemoveNoOp", "drop empty loops and no-op statements"),
    ],
    "raw": [],
}


def get_pass(name: str):
    if name not in PASSES:
        raise PassError(f"unknown pass {name!r}; registered: {', '.join(sorted(PASSES))}")
    return PASSES[name]()


def run_pipeline(func: PrimFunc, pipeline: str | list = "default") -> PrimFunc:
    """Run a named pipeline (or a list of pass names) on func."""
    if isinstance(pipeline, str):
        if pipeline not in PIPELINES:
            raise PassError(f"unknown pipeline {pipeline!r}; known: {', '.join(PIPELINES)}")
        names = [n for n, _ in PIPELINES[pipeline]]
    else:
        names = list(pipeline)
    for n in names:
        func = get_pass(n)(func)
        log.debug("after %s:\n%s", n, func)
    return func
