"""Partition: give every op a target, "accel" or "cpu", with the reason whenever the accelerator
declines. The rules are data (ACCEL_RULES, the checks below) read against one AccelConfig:
int8 GEMM layers go to the accelerator unless they are grouped/dilated, their channels fill the
GEMM core too poorly, or they are so memory-bound that the core would idle (a batch-1 dense layer
streams each weight byte for one MAC; VTA likewise leaves the classifier on the CPU); int8
elementwise ops (ALU: relu, clip, qadd) go where their producer is, so
they fuse into an accelerator layer's output; everything else (float ops, pooling, softmax,
quantize/dequantize, layout transforms) runs on the CPU. `force` maps an op type (graph op name
or ONNX op type) to a target and overrides soft declines (such as channel waste); it cannot put
an op on the accelerator that has no accelerator implementation. Every decision carries a
`kind` from KINDS (why it went where it went, in one word) beside its sentence, so that
`accel compile --explain` and the run-time profile can group and show them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from accel.isa.config import AccelConfig

from ..errors import GraphPassError
from ..ir import Graph, Node, rewrite

ACCEL, CPU = "accel", "cpu"
TARGETS = (ACCEL, CPU)

#: Why a node went where it went: kind -> what it means (the legend of `accel compile --explain`).
KINDS = {
    "offload": "int8 layer the accelerator runs",
    "fused": "int8 elementwise op fused into the accelerator layer that feeds it",
    "unsupported": "operator without an accelerator implementation",
    "float": "float32 op; the accelerator computes int8 only",
    "boundary": "precision or layout conversion at the accelerator boundary, done by the host",
    "grouped": "grouped convolution does not map onto the GEMM core",
    "depthwise": "depthwise convolution (one group per channel) does not map onto the GEMM core",
    "dilated": "dilated convolution has no accelerator lowering",
    "shape": "shape the accelerator lowering cannot take or would waste most of the GEMM core on",
    "cost": "slower on the accelerator by the cost estimate (memory-bound)",
    "placement": "elementwise op whose producer runs on the CPU stays beside it",
    "forced": "forced by --force OP=TARGET",
    "lowering": "the accelerator lowering failed at build time (the reason says why); runs on the CPU",
    "target": "compiled with --target cpu",
}


@dataclass(frozen=True)
class AccelRules:
    """What the partitioner accepts for the accelerator (one place; tests and docs read it)."""
    #: GEMM layers that would leave more than this fraction of the core's MACs idle go to the CPU.
    max_gemm_waste: float = 0.5
    #: GEMM layers whose DRAM traffic would keep the core busier than this (the roofline bound:
    #: MACs per byte x bus bytes per cycle / peak MACs per cycle) stay on the accelerator.
    min_roofline_efficiency: float = 0.25
    #: int8 ops with an accelerator lowering: GEMM layers and ALU elementwise ops.
    gemm_ops: tuple[str, ...] = ("qconv2d", "qdense")
    alu_ops: tuple[str, ...] = ("relu", "clip", "qadd")
    #: conversions at the accelerator boundary, done by the host.
    host_ops: tuple[str, ...] = ("quantize", "dequantize", "requantize", "pack", "unpack")


ACCEL_RULES = AccelRules()


@dataclass
class Decision:
    name: str
    op: str
    origin: str | None
    target: str
    reason: str = ""
    hard: bool = False  # a hard decline cannot be forced onto the accelerator
    kind: str = ""      # a key of KINDS


def gemm_waste(channels: int, block: int) -> float:
    """Fraction of a GEMM core dimension left idle when `channels` are padded to whole blocks."""
    padded = -(-channels // block) * block
    return 1.0 - channels / padded


def roofline_efficiency(n: Node, cfg: AccelConfig) -> tuple[float, int, int]:
    """(bound on the GEMM core's busy fraction from DRAM traffic, MACs, bytes) of an int8 GEMM
    layer that reads its input and weights and writes its output once (the least it can move)."""
    x, w = n.inputs[0].shape, n.inputs[1].shape
    macs = math.prod(n.shape) * math.prod(w[1:])
    nbytes = math.prod(x) + math.prod(w) + math.prod(n.shape) + 4 * n.shape[1]  # int8 data, int32 bias
    return min(1.0, macs / nbytes * cfg.bus_bytes / cfg.macs_per_cycle), macs, nbytes


def _label(n: Node) -> str:
    return f"{n.origin or n.op} '{n.name}'"


def _check_gemm(n: Node, cfg: AccelConfig, rules: AccelRules) -> tuple[str, bool, str] | None:
    """None if the accelerator takes this int8 GEMM layer, else (reason, hard, kind)."""
    if n.op == "qconv2d":
        if n.attrs["groups"] != 1:
            dw = n.attrs["groups"] == _channels(n.inputs[0])
            return (f"{_label(n)}: grouped convolution (groups={n.attrs['groups']}) does not map onto the GEMM core",
                    True, "depthwise" if dw else "grouped")
        if tuple(n.attrs["dilations"]) != (1, 1):
            return f"{_label(n)}: dilated convolution is not supported by the accelerator lowering", True, "dilated"
        cin, cout = n.inputs[0].shape[1], n.shape[1]
    else:
        cin, cout = n.inputs[0].shape[1], n.shape[1]
    for what, c, block, key in (("input channels", cin, cfg.block_in, "block_in"),
                                ("output channels", cout, cfg.block_out, "block_out")):
        w = gemm_waste(c, block)
        if w > rules.max_gemm_waste:
            return (f"{_label(n)}: {c} {what} {'<' if c < block else 'padded to'} {key} {block} wastes "
                    f"{w:.0%} of the GEMM core"), False, "shape"
    eff, macs, nbytes = roofline_efficiency(n, cfg)
    if eff < rules.min_roofline_efficiency:
        return (f"{_label(n)}: memory-bound, {macs / nbytes:.1f} MACs per DRAM byte keep the GEMM core at most "
                f"{eff:.0%} busy ({cfg.macs_per_cycle / cfg.bus_bytes:.0f} needed on the {cfg.bus_bytes}-byte bus)"), \
            False, "cost"
    return None


def _channels(t: Node) -> int:
    """Channels of a conv input, plain (N C H W) or packed (N C' H W n c)."""
    return t.shape[1] * t.shape[-1] if len(t.shape) == 6 else t.shape[1]


def decide(graph: Graph, cfg: AccelConfig, force: dict[str, str] | None = None,
           rules: AccelRules = ACCEL_RULES) -> list[Decision]:
    """A Decision per op node, in order."""
    force = dict(force or {})
    bad = {k: v for k, v in force.items() if v not in TARGETS}
    if bad:
        raise GraphPassError(f"partition: force targets must be {' or '.join(TARGETS)}, got {bad}")
    decisions: list[Decision] = []
    where: dict[int, str] = {}
    for n in graph.ops:
        forced = force.get(n.op, force.get(n.origin or ""))
        d = Decision(n.name, n.op, n.origin, CPU)
        if n.op in rules.gemm_ops:
            declined = _check_gemm(n, cfg, rules)
            if declined is None:
                d.target, d.kind = ACCEL, "offload"
            else:
                d.reason, d.hard, d.kind = declined
        elif n.op in rules.alu_ops and n.dtype == "int8":
            producers = [i for i in n.inputs if not i.is_const]
            if n.op == "qadd" and len({i.shape for i in producers}) != 1:
                d.reason, d.hard, d.kind = f"{_label(n)}: broadcasting add has no ALU lowering", True, "shape"
            elif n.op == "qadd" and n.attrs.get("a_mul"):
                d.reason, d.hard, d.kind = (f"{_label(n)}: add at scales that are not powers of two needs two "
                                            f"multipliers; the ALU lowering aligns by shifts"), True, "unsupported"
            elif any(where.get(id(i)) == ACCEL for i in producers):
                d.target, d.kind = ACCEL, "fused"
            else:
                d.reason, d.kind = f"{_label(n)}: elementwise op not fed by an accelerator layer stays on the CPU", \
                    "placement"
        elif n.op in rules.host_ops:
            d.reason, d.hard, d.kind = (f"{_label(n)}: precision/layout conversion at the accelerator boundary runs "
                                        f"on the host"), True, "boundary"
        elif n.dtype.startswith("float") or any(i.dtype.startswith("float") for i in n.inputs):
            d.reason, d.hard, d.kind = f"{_label(n)}: float32 op; the accelerator computes int8 only", True, "float"
        else:
            d.reason, d.hard, d.kind = f"{_label(n)}: no accelerator implementation of {n.op}", True, "unsupported"
        if forced == CPU and d.target == ACCEL:
            d.target, d.reason, d.kind = CPU, f"{_label(n)}: forced to the CPU by the user", "forced"
        elif forced == ACCEL and d.target == CPU:
            if d.hard:
                raise GraphPassError(f"partition: cannot force {_label(n)} onto the accelerator: {d.reason}")
            d.target, d.reason, d.kind = ACCEL, f"{_label(n)}: forced onto the accelerator by the user ({d.reason})", \
                "forced"
        where[id(n)] = d.target
        decisions.append(d)
    return decisions


def partition(graph: Graph, cfg: AccelConfig, force: dict[str, str] | None = None,
              rules: AccelRules = ACCEL_RULES) -> Graph:
    """Annotate every op's target; the decisions (with reasons) go to graph.meta['partition']."""
    decisions = iter(decide(graph, cfg, force, rules))
    table = []

    def fn(n: Node, old: Node):
        if n.op in ("input", "const"):
            return None
        d = next(decisions)
        table.append(d)
        return n.with_inputs(n.inputs, target=d.target) if n.target != d.target else n
    g = rewrite(graph, fn)
    g.meta["partition"] = table
    return g


def partition_table(graph: Graph) -> str:
    rows = [f"{'node':28} {'op':12} {'target':6} {'why':11} reason"]
    for d in graph.meta.get("partition", []):
        rows.append(f"{d.name[:28]:28} {d.op:12} {d.target:6} {d.kind:11} {d.reason}")
    return "\n".join(rows)


def bare_reason(name: str, reason: str) -> str:
    """A decision's sentence without its "Op 'name': " label (for rows that show the name already)."""
    head = f"'{name}': "
    return reason.split(head, 1)[1] if head in reason else reason


def explain_table(rows: list[dict], folded: list[dict] | None = None) -> str:
    """`accel compile --explain`: one row per node of a module's meta['partition'] (name, onnx op,
    graph op, target, kind, reason), then the ONNX nodes the graph passes folded away, then the
    legend of the kinds that occur."""
    def short(r):
        return bare_reason(r["name"], r.get("reason", ""))
    w = max([len("node")] + [len(r["name"]) for r in rows] + [len(f["name"]) for f in folded or []])
    w = min(w, 60)   # longer names widen their own row only: a name is never cut
    lines = [f"{'node':{w}} {'onnx op':18} {'graph op':18} {'target':6} {'why':11} reason"]
    for r in rows:
        lines.append(f"{r['name']:{w}} {(r.get('origin') or '-')[:18]:18} {r['op'][:18]:18} {r['target']:6} "
                     f"{r.get('kind', ''):11} {short(r)}")
    for f in folded or []:
        lines.append(f"{f['name']:{w}} {(f.get('op') or '-')[:18]:18} {'-':18} {'-':6} {'folded':11} "
                     f"{f.get('reason', 'folded into another op or removed by the graph passes')}")
    kinds = [k for k in KINDS if any(r.get("kind") == k for r in rows)]
    n_acc = sum(r["target"] == ACCEL for r in rows)
    n_gpu = sum(r["target"] == "gpu" for r in rows)   # --target opencl|cuda (compiler.gpu_build)
    lines.append(f"{len(rows)} nodes: {n_acc} on the accelerator, " + (f"{n_gpu} on the GPU, " if n_gpu else "")
                 + f"{len(rows) - n_acc - n_gpu} on the CPU"
                 + (f", {len(folded)} folded away" if folded else ""))
    lines += [f"  {k:11} {KINDS[k]}" for k in kinds]
    return "\n".join(lines)
