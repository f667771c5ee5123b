"""Partition: give every op a target, with the reason whenever a preferred target declines.

The pass only orders and compares: the candidate targets (compiler.targets, in preference order,
the last one the fallback that takes everything, "cpu") say per node whether they can run it and,
if not, why (Target.supports: a sentence with a kind and whether it is hard); among those that
can, the first in order wins unless another one's cost estimate (Target.estimate_cost) is lower.
The accelerator's own rules (which int8 layers it takes, channel waste, the roofline bound) live
in compiler.targets.accel. `force` maps an op type (graph op name or ONNX op type) to a target
and overrides soft declines (such as channel waste); it cannot put an op on a target that declines
it hard. Every decision carries a `kind` from KINDS (why it went where it went, in one word)
beside its sentence, so that `accel compile --explain` and the run-time profile can group and
show them.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from accel.isa.config import AccelConfig

from ...targets import PlacementContext, Target, get_target, target_names
from ...targets.accel import ACCEL_RULES, AccelRules, gemm_waste, roofline_efficiency
from ..errors import GraphPassError
from ..ir import Graph, Node, rewrite

ACCEL, CPU = "accel", "cpu"
TARGETS = (ACCEL, CPU)

#: Why a node went where it went: kind -> what it means (the legend of `accel compile --explain`);
#: each target adds its own kinds (Target.kinds).
KINDS = {k: v for k, v in get_target(ACCEL).kinds.items() if k != "lowering"}
KINDS.update(forced="forced by --force OP=TARGET", lowering=get_target(ACCEL).kinds["lowering"],
             target="compiled with --target cpu")


@dataclass
class Decision:
    name: str
    op: str
    origin: str | None
    target: str
    reason: str = ""
    hard: bool = False  # a hard decline cannot be forced onto the accelerator
    kind: str = ""      # a key of KINDS


def _label(n: Node) -> str:
    return f"{n.origin or n.op} '{n.name}'"


def default_targets(names=TARGETS) -> list[Target]:
    """The registered targets of `names`, in that (preference) order."""
    return [get_target(t) for t in names]


def _choose(n: Node, targets: list[Target], ctx: PlacementContext) -> tuple[Target, dict[str, str], str]:
    """The target for `n`, per target that declined it why, and (when a preferred target that
    takes it lost on cost) the sentence that says so."""
    declines: dict[str, str] = {}
    best, best_cost, first, first_cost = None, None, None, None
    for t in targets:
        why = t.supports(n, ctx)
        if why is not None:
            declines[t.name] = why
            continue
        cost = t.estimate_cost(n, ctx)
        if best is None:
            first, first_cost = t, cost
        if best is None or (cost is not None and best_cost is not None and cost < best_cost):
            best, best_cost = t, cost
    if best is None:
        raise GraphPassError(f"partition: no target takes {_label(n)}: " + "; ".join(declines.values()))
    cheaper = "" if best is first else (f"{_label(n)}: faster on {best.title} than on {first.title} by the cost "
                                        f"estimate ({best_cost:.3g} s < {first_cost:.3g} s)")
    return best, declines, cheaper


def decide(graph: Graph, cfg: AccelConfig | None, force: dict[str, str] | None = None,
           rules: AccelRules = ACCEL_RULES, targets: list[Target] | None = None) -> list[Decision]:
    """A Decision per op node, in order. targets: the candidates in preference order (default
    accel, then cpu); cfg and rules are what the accelerator target reads."""
    targets = list(targets) if targets else default_targets()
    names = [t.name for t in targets]
    force = dict(force or {})
    bad = {k: v for k, v in force.items() if v not in names}
    if bad:
        raise GraphPassError(f"partition: force targets must be {' or '.join(names)}, got {bad}")
    by_name = {t.name: t for t in targets}
    ctx = PlacementContext(cfg, {}, rules)
    decisions: list[Decision] = []
    for n in graph.ops:
        forced = force.get(n.op, force.get(n.origin or ""))
        chosen, declines, cheaper = _choose(n, targets, ctx)
        d = Decision(n.name, n.op, n.origin, chosen.name)
        first = next((declines[t] for t in names[:names.index(chosen.name)] if t in declines), None)
        if first is not None:   # a preferred target declined: its reason is the decision's
            d.reason, d.hard, d.kind = str(first), getattr(first, "hard", True), getattr(first, "kind", "unsupported")
        elif cheaper:
            d.reason, d.kind = cheaper, "cost"
        elif chosen is not targets[-1] or len(targets) == 1:
            d.kind = chosen.placement_kind(n, ctx)
        if forced is not None and forced != d.target:
            f = by_name[forced]
            if forced == names[-1]:
                d.target, d.reason, d.kind = forced, f"{_label(n)}: forced to {f.title} by the user", "forced"
            else:
                why = declines.get(forced)
                if why is not None and getattr(why, "hard", True):
                    raise GraphPassError(f"partition: cannot force {_label(n)} onto {f.title}: {why}")
                d.target, d.reason, d.kind = forced, f"{_label(n)}: forced onto {f.title} by the user ({d.reason})", \
                    "forced"
        ctx.where[id(n)] = d.target
        decisions.append(d)
    return decisions


def partition(graph: Graph, cfg: AccelConfig | None, force: dict[str, str] | None = None,
              rules: AccelRules = ACCEL_RULES, targets: list[Target] | None = None) -> Graph:
    """Annotate every op's target; the decisions (with reasons) go to graph.meta['partition']."""
    decisions = iter(decide(graph, cfg, force, rules, targets))
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
    legend = dict(KINDS)
    for t in target_names():   # kinds of plug-in targets
        legend.update({k: v for k, v in get_target(t).kinds.items() if k not in legend})
    kinds = [k for k in legend if any(r.get("kind") == k for r in rows)]
    n_acc = sum(r["target"] == ACCEL for r in rows)
    n_gpu = sum(r["target"] == "gpu" for r in rows)   # --target opencl|cuda (compiler.targets.gpu)
    others = Counter(r["target"] for r in rows if r["target"] not in (ACCEL, "gpu", CPU))
    lines.append(f"{len(rows)} nodes: {n_acc} on the accelerator, " + (f"{n_gpu} on the GPU, " if n_gpu else "")
                 + "".join(f"{c} on {t}, " for t, c in others.items())
                 + f"{len(rows) - n_acc - n_gpu - sum(others.values())} on the CPU"
                 + (f", {len(folded)} folded away" if folded else ""))
    lines += [f"  {k:11} {legend[k]}" for k in kinds]
    return "\n".join(lines)


__all__ = ["ACCEL", "CPU", "TARGETS", "KINDS", "ACCEL_RULES", "AccelRules", "Decision", "decide", "default_targets",
           "gemm_waste", "roofline_efficiency", "partition", "partition_table", "explain_table", "bare_reason"]
