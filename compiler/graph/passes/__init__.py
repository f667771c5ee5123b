"""Graph passes and the pipeline that orders them.

PIPELINE is a named list: each step says why it sits where it does and when it runs; optional
steps are switched by GraphOptions, never by editing the list. `optimize(graph, **options)` runs
it and leaves each pass's report in graph.meta (calibration, partition, layout, fusion,
memory_plan) and the steps that ran in graph.meta['passes'].
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from accel.isa.config import AccelConfig, resolve_config

from ...accel.avgpool import int8_avg_pools
from ..errors import GraphPassError
from ..ir import Graph
from .eliminate_dead_code import eliminate_dead_code
from .fold_batchnorm import fold_batchnorm
from .fold_constants import fold_constants
from .fuse_ops import fuse_ops
from .import_qdq import import_qdq
from .infer_types import infer_types
from .nchwc_layout import nchwc_layout
from .pack_layout import pack_layout
from .partition import ACCEL_RULES, TARGETS, AccelRules, default_targets, partition, partition_table
from .plan_memory import MemoryPlan, plan_memory
from .quantize import Calibration, calibrate, pow2_shift, quantize
from .simplify import simplify
from .space_to_depth import space_to_depth_convs

log = logging.getLogger(__name__)


@dataclass
class GraphOptions:
    """What the pipeline does. accel=None keeps everything on the CPU in NCHW."""
    quantize: bool = False
    calibration_samples: list | None = None  # feeds (dicts by input name) for calibration
    accel: AccelConfig | str | None = None  # preset name, JSON path or config
    force_target: dict[str, str] = field(default_factory=dict)  # op type -> target name
    #: partition candidates (registered target names, preferred first, the fallback "cpu" last);
    #: empty: "accel" then "cpu" when `accel` is set, else no partition
    targets: tuple[str, ...] = ()
    rules: AccelRules = ACCEL_RULES
    fuse: bool = True
    #: convs keep the CPU's blocked layout between layers (the cpu target asks for it; only a build
    #: with no partition, where every op runs on the CPU)
    nchwc: bool = False
    disabled: tuple[str, ...] = ()  # step names to skip

    def config(self) -> AccelConfig | None:
        return None if self.accel is None else resolve_config(self.accel)


def _has_qdq(g: Graph) -> bool:
    return any(n.op == "dequantize_linear" for n in g.nodes)


def _quantize_step(g: Graph, o: GraphOptions) -> Graph:
    cal = g.meta.get("qdq") or Calibration()
    if o.calibration_samples:
        cal = cal.merged(calibrate(g, o.calibration_samples))
    elif not cal.shifts:
        if o.accel is None and any(n.op in ("quantize_linear", "dequantize_linear") for n in g.nodes):
            # Q or DQ with no pair around a tensor (a model that only quantizes its output, or
            # dequantizes an int8 input): nothing to run in int8, so the ops stay as they are
            return g
        raise GraphPassError("quantize: needs calibration_samples (or a QDQ model's scales)")
    return quantize(g, cal)


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Graph, GraphOptions], Graph]
    why: str
    when: Callable[[Graph, GraphOptions], bool] = lambda g, o: True


PIPELINE: list[Step] = [
    Step("infer_types", lambda g, o: infer_types(g), "every later pass reads shapes; catches inconsistent graphs first"),
    Step("fold_constants", lambda g, o: fold_constants(g), "shape subgraphs and DequantizeLinear of int8 weights become constants"),
    Step("import_qdq", lambda g, o: import_qdq(g), "a QDQ model's scales replace calibration; the Q/DQ pairs would block the patterns below",
         lambda g, o: o.quantize and _has_qdq(g)),
    Step("simplify", lambda g, o: simplify(g), "bias adds move into conv/dense, reshapes merge: exposes folding and fusion"),
    Step("fold_batchnorm", lambda g, o: fold_batchnorm(g), "batch norm disappears into the conv weights before quantization sees it"),
    Step("fold_constants_again", lambda g, o: fold_constants(g), "folding the batch norm leaves constant arithmetic"),
    Step("space_to_depth_convs", lambda g, o: space_to_depth_convs(g, o.config(), o.rules.min_space_to_depth_fill),
         "a strided conv over few channels (a stem, a patch embedding) reads s x s blocks as channels: fills the GEMM core",
         lambda g, o: o.accel is not None),
    Step("eliminate_dead_code", lambda g, o: eliminate_dead_code(g), "drop what the rewrites orphaned, so calibration runs only live ops"),
    Step("quantize", _quantize_step, "int8 with power-of-two scales, before partitioning decides by dtype",
         lambda g, o: o.quantize),
    Step("int8_avg_pools", lambda g, o: eliminate_dead_code(int8_avg_pools(g, o.config())),
         "border-divisor average pools in int8, uniform ones off the diagonal GEMM, where the ALU takes them",
         lambda g, o: o.quantize and o.accel is not None),
    Step("nchwc_layout", lambda g, o: nchwc_layout(g),
         "a CPU build keeps convs' blocked layout between layers; after the rewrites, before fusion",
         lambda g, o: o.nchwc and o.accel is None and not o.targets),
    Step("partition", lambda g, o: partition(g, o.config(), o.force_target, o.rules,
                                             default_targets(o.targets or TARGETS)),
         "targets decide layouts and fusion boundaries", lambda g, o: o.accel is not None or bool(o.targets)),
    Step("pack_layout", lambda g, o: pack_layout(g, o.config()), "blocked layouts for accelerator ops; pack/unpack only at CPU boundaries",
         lambda g, o: o.accel is not None),
    Step("fuse_ops", lambda g, o: fuse_ops(g), "one kernel per group, within one target", lambda g, o: o.fuse),
    Step("plan_memory", lambda g, o: plan_memory(g), "last: buffers are planned over the final op order"),
]

PASSES = {s.name: s for s in PIPELINE}


def optimize(graph: Graph, options: GraphOptions | None = None, **kw) -> Graph:
    """Run PIPELINE under options (a GraphOptions, or its fields as keywords)."""
    if options is None:
        options = GraphOptions(**kw)
    elif kw:
        raise GraphPassError("optimize: give either options or keywords, not both")
    unknown = sorted(set(options.disabled) - set(PASSES))
    if unknown:
        raise GraphPassError(f"optimize: unknown pass(es) {', '.join(unknown)}; passes are {', '.join(PASSES)}")
    ran = []
    for step in PIPELINE:
        if step.name in options.disabled or not step.when(graph, options):
            continue
        t0 = time.perf_counter()
        before = len(graph.ops)
        graph = step.run(graph, options)
        ran.append({"pass": step.name, "ops_before": before, "ops_after": len(graph.ops),
                    "seconds": time.perf_counter() - t0})
        log.debug("%s: %d -> %d ops", step.name, before, len(graph.ops))
    graph.meta["passes"] = ran
    return graph


__all__ = ["PIPELINE", "PASSES", "Step", "GraphOptions", "optimize", "infer_types", "fold_constants",
           "fold_batchnorm", "space_to_depth_convs", "eliminate_dead_code", "simplify", "import_qdq", "calibrate", "quantize",
           "Calibration", "pow2_shift", "partition", "partition_table", "AccelRules", "ACCEL_RULES", "pack_layout",
           "fuse_ops", "plan_memory", "MemoryPlan", "nchwc_layout"]
