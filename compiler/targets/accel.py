"""The accelerator target: which int8 nodes the accelerator takes (the partition rules), and
their lowering to one instruction program per layer.

Placement: int8 GEMM layers (qconv2d, qdense; dilated convs too) go to the accelerator unless they are
grouped so that their merged channel slices waste too much of the core (compiler.accel.grouped),
their channels fill the GEMM core too poorly, or the host CPU runs them faster by the cost
estimate (compiler.accel.depthwise_cost.gemm_costs: the planner's cycles at the config's clock
against the host's int8 GEMM rate; a batch-1 classifier streams each weight byte for one MAC, so
the core idles on DRAM and the classifier stays on the CPU, as in VTA); int8 elementwise ALU ops (relu, clip, qadd) and max pooling
(compiler.accel.pool) go where their producer is, so they fuse into an accelerator layer's
output; channel epilogue convs (a batch norm or average pool quantized as a depthwise conv) go
wherever they tile; everything else stays on the CPU.

Lowering: per fused group, a GEMM head with the clamps after it (and a residual qadd when the
group has one) becomes one program of compiler.accel.conv2d; a lone ALU op or qadd one of
compiler.accel.eltwise. A group the accelerator cannot take at build time (a tiling that does
not fit, a shift beyond the ALU immediate) runs on the CPU, the reason kept in meta['fallbacks'].
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from accel.isa import INSN_BYTES, AccelConfig, MemType, encode_program
from accel.isa.asm import disassemble_bytes
from accel.isa.errors import AccelError
from accel.isa.isa import Load
from host_runtime.executor import Step

from ..accel.avgpool import avg_pool_spec, check_avg_pool, emit_avg_pool, pool_weights
from ..accel.conv2d import (
    Conv2dSpec,
    Requant,
    ResidualAdd,
    TilingError,
    channel_scale_operands,
    emit_conv2d,
    plan_conv2d,
    residual_identity,
)
from ..accel.dense import resident_dense_tilings
from ..accel.depthwise_cost import accel_depthwise_seconds, accel_gemm_seconds, gemm_costs, is_depthwise
from ..accel.eltwise import emit_add, identity_weights
from ..accel.grouped import (
    emit_grouped_conv2d,
    emit_windowed_conv2d,
    group_spec,
    grouped_waste,
    window_spec,
    windowed_chunks,
)
from ..accel.layout import pack_bias
from ..accel.plan import _needs, plan_resident_weights
from ..accel.pool import PoolSpec, emit_max_pool, plan_pool
from ..accel.spec import WeightRegion, _Geom, dense_view, is_dense, weight_region_entries
from ..accel.tune import read_tuning_log, tune_conv2d
from ..errors import CompilerError
from ..graph.ir import Graph, Node
from ..graph.ops import INT8_MAX, int8_min, is_fixed_point, requant_shift
from .base import BuildError, Decline, PlacementContext, Target, register_target, single_body, write_source

if TYPE_CHECKING:
    from ..graph_build import Builder

log = logging.getLogger(__name__)

#: ALU ops folded into the requantization clamp of the accelerator operation before them
CLAMP_OPS = ("relu", "clip")
#: tilings measured per layer when tuning (the analytical ranking's best few)
TUNE_TOP = 6


# ---- placement rules -------------------------------------------------------------------------------
@dataclass(frozen=True)
class AccelRules:
    """What the partitioner accepts for the accelerator (one place; tests and docs read it)."""
    #: GEMM layers that would leave more than this fraction of the core's MACs idle go to the CPU.
    max_gemm_waste: float = 0.5
    #: GEMM layers (conv, dense) go to the CPU when the host runs them faster: the planner's cycle
    #: estimate at the config's clock against their MACs at the host's int8 GEMM rate
    #: (compiler.accel.depthwise_cost.gemm_costs), so the answer follows the config's core, bus and
    #: clock, not a fixed bound on MACs per DRAM byte; False: the accelerator takes them all
    gemm_by_cost: bool = True
    #: grouped convolutions run as GEMMs on channel slices, groups merged onto whole blocks
    #: (compiler.accel.grouped). Past this waste the layer runs below a quarter of the core's peak
    #: and stays on the CPU unless forced: a depthwise conv is a diagonal GEMM, 1/block_in of its
    #: MACs useful (15/16 wasted at block 16, 3/4 at block 4); offloading it would put a
    #: MobileNet's offloaded layers far above the ideal cycles.
    max_grouped_waste: float = 0.75
    #: depthwise convolutions (one group per channel) go by the cost estimate instead: the diagonal
    #: GEMM's cycles against the host's int8 kernel and the pack/unpack around it
    #: (compiler.accel.depthwise_cost, through both targets' estimate_cost); False: the waste rule
    depthwise_by_cost: bool = True
    #: a strided conv over few channels becomes a stride-1 conv over space-to-depth blocks
    #: (compiler.graph.passes.space_to_depth) where the blocked conv's GEMM micro-ops do at least
    #: this share of the core's MACs: a patch embedding (ViT, ConvNeXt, Swin) fills all of it.
    #: ResNet's 7x7 stem fills 57%: at 0.5 it offloads, and ResNet-18's host steps go from 4.5 ms
    #: to 0.4 ms (about 120 ms of a PYNQ-Z1's A9), but its 118 M MACs take 2.4x their ideal cycles
    #: and the network's cycles / ideal goes from 1.03 to 1.12
    min_space_to_depth_fill: float = 0.75
    #: int8 ops with an accelerator lowering: GEMM layers and ALU elementwise ops.
    gemm_ops: tuple[str, ...] = ("qconv2d", "qdense")
    alu_ops: tuple[str, ...] = ("relu", "clip", "qadd", "max_pool2d")
    #: conversions at the accelerator boundary, done by the host.
    host_ops: tuple[str, ...] = ("quantize", "dequantize", "requantize", "pack", "unpack")


ACCEL_RULES = AccelRules()


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


def _channels(t: Node) -> int:
    """Channels of a conv input, plain (N C H W) or packed (N C' H W n c)."""
    return t.shape[1] * t.shape[-1] if len(t.shape) == 6 else t.shape[1]


def check_gemm(n: Node, cfg: AccelConfig, rules: AccelRules) -> Decline | None:
    """None if the accelerator takes this int8 GEMM layer, else why not."""
    cin, cout = n.inputs[0].shape[1], n.shape[1]
    groups = n.attrs.get("groups", 1) if n.op == "qconv2d" else 1
    by_cost = rules.depthwise_by_cost and is_depthwise(n)   # the partition weighs both targets' estimates
    if groups != 1:   # GEMMs on merged channel slices (compiler.accel.grouped)
        kind = "depthwise" if groups == _channels(n.inputs[0]) else "grouped"
        w = grouped_waste(groups, cin, cout, cfg.block_in, cfg.block_out)
        if w > rules.max_grouped_waste and not by_cost:
            return Decline(f"{_label(n)}: {kind} convolution (groups={groups}) as GEMMs on channel slices wastes "
                           f"{w:.0%} of the GEMM core (max_grouped_waste {rules.max_grouped_waste:.0%})", kind,
                           hard=False)
    for what, c, block, key in (("input channels", cin, cfg.block_in, "block_in"),
                                ("output channels", cout, cfg.block_out, "block_out")):
        w = gemm_waste(c, block)
        if w > rules.max_gemm_waste and groups == 1:
            return Decline(f"{_label(n)}: {c} {what} {'<' if c < block else 'padded to'} {key} {block} wastes "
                           f"{w:.0%} of the GEMM core", "shape", hard=False)
    return None


def check_gemm_cost(n: Node, cfg: AccelConfig, beside_accel: bool = False) -> Decline | None:
    """None if the accelerator runs this int8 GEMM layer at least as fast as the host CPU by the
    cost estimate (compiler.accel.depthwise_cost.gemm_costs), else the decline naming both costs.
    beside_accel: its producer runs on the accelerator (the CPU would pay the layout boundary)."""
    c = gemm_costs(n, cfg, beside_accel)
    if c["cpu_s"] >= c["accel_s"]:
        return None
    eff, macs, nbytes = roofline_efficiency(n, cfg)
    bound = (f"memory-bound, {macs / nbytes:.1f} MACs per DRAM byte keep the GEMM core at most {eff:.0%} busy "
             f"({cfg.macs_per_cycle / cfg.bus_bytes:.0f} needed on the {cfg.bus_bytes}-byte bus); "
             if c["memory_bound"] else "")
    host = c["host"]
    return Decline(f"{_label(n)}: {bound}faster on the CPU by the cost estimate ({c['cpu_s'] * 1e6:.3g} us on the "
                   f"{host.name} host at {host.gemm_macs_per_s / 1e9:.3g} GMAC/s"
                   f"{', with the layout boundary' if beside_accel else ''} < {c['accel_s'] * 1e6:.3g} us on the "
                   f"accelerator: {c['cycles']:.0f} cycles at {cfg.clock_mhz:g} MHz)", "cost", hard=False)


def is_channel_epilogue(n: Node) -> bool:
    """A depthwise qconv2d whose weights are one value per channel over the window: a batch norm
    that could not fold, or an average pool (compiler.graph.passes.quantize.affine_as_depthwise).
    Its diagonal GEMM takes one cycle per pixel, channel block and tap, what one ALU pass over the
    same entries takes, so the waste rule that weighs real depthwise convs does not apply; it
    saves the host a dequantize, float pass and quantize between two accelerator layers."""
    if n.op != "qconv2d" or not n.inputs[1].is_const or n.attrs["groups"] == 1:
        return False
    w = n.inputs[1].value
    return (n.attrs["groups"] == _channels(n.inputs[0]) == n.shape[1] and w.ndim == 4 and w.shape[1] == 1
            and bool(np.all(w == w[:, :, :1, :1])))


def check_epilogue_tiling(n: Node, cfg: AccelConfig) -> Decline | None:
    """None if one diagonal block of a channel epilogue conv tiles into the config's buffers (a
    global average pool over a large image needs a weight tile per tap: it stays on the CPU,
    where its int8 kernel runs, rather than fail at build time and fall back to a slow one)."""
    x = n.inputs[0].shape
    kh, kw = n.inputs[1].shape[2:]
    spec = Conv2dSpec.from_attrs(min(cfg.batch, x[0]), cfg.block_in, x[2], x[3], cfg.block_out, kh, kw, n.attrs,
                                 n.name)
    try:
        plan_conv2d(spec, cfg, 2, False)
    except CompilerError as e:
        return Decline(f"{_label(n)}: {e}", "shape")
    return None


def pool_spec(n: Node, x_shape) -> PoolSpec:
    """The PoolSpec of a max_pool2d over x_shape, NCHW (planes counted as packed) or packed."""
    planes = math.prod(x_shape[:2])
    a = n.attrs
    return PoolSpec(planes, x_shape[2], x_shape[3], tuple(a["kernel"]), tuple(a["strides"]), tuple(a["pads"]),
                    a["ceil_mode"], n.name)


def check_pool(n: Node, cfg: AccelConfig) -> Decline | None:
    """None if the ALU pooling takes this int8 max_pool2d (checked before packing, so the lowering
    does not fall back to a CPU kernel that would see packed data)."""
    if cfg.block_in != cfg.block_out:
        return Decline(f"{_label(n)}: ALU pooling needs block_in == block_out ({cfg.block_in} != {cfg.block_out})",
                       "shape")
    x = n.inputs[0].shape
    if len(x) != 4:
        return Decline(f"{_label(n)}: max pooling of a rank-{len(x)} tensor has no ALU lowering", "shape")
    try:
        plan_pool(pool_spec(n, (-(-x[0] // cfg.batch), -(-x[1] // cfg.block_out), x[2], x[3])), cfg)
    except CompilerError as e:
        return Decline(f"{_label(n)}: {e}", "shape")
    return None


# ---- lowering helpers --------------------------------------------------------------------------
def _clamp(n: Node, lo: int, hi: int) -> tuple[int, int]:
    if n.op == "relu":
        return max(lo, 0), hi
    a = n.attrs
    if a["min"] is not None:
        lo = max(lo, math.ceil(a["min"]))
    if a["max"] is not None:
        hi = min(hi, math.floor(a["max"]))
    return lo, hi


class AccelTarget(Target):
    """int8 layers on the accelerator of the build's AccelConfig, one instruction program each."""

    name = "accel"
    label = "accel"
    title = "the accelerator"
    needs_config = True
    module_target = None
    kinds = {
        "offload": "int8 layer the accelerator runs",
        "fused": "int8 elementwise op fused into the accelerator layer that feeds it",
        "unsupported": "operator without an accelerator implementation",
        "float": "float32 op; the accelerator computes int8 only",
        "boundary": "precision or layout conversion at the accelerator boundary, done by the host",
        "grouped": "grouped convolution whose channel slices, merged onto whole blocks, waste most of the GEMM core",
        "depthwise": "depthwise convolution (one group per channel) as a diagonal GEMM wastes too much of the core",
        "shape": "shape the accelerator lowering cannot take or would waste most of the GEMM core on",
        "cost": "faster on the CPU by the cost estimate (a memory-bound GEMM layer, or a depthwise conv)",
        "placement": "elementwise op whose producer runs on the CPU stays beside it",
        "lowering": "the accelerator lowering failed at build time (the reason says why); runs on the CPU",
    }
    #: resident_weights: GEMM layers whose weights fit the weight buffer keep them there across
    #: inferences (the first run loads them; accel compile --no-resident-weights turns it off)
    build_options = {"resident_weights": True, "space_to_depth_fill": ACCEL_RULES.min_space_to_depth_fill}

    # ---- placement -------------------------------------------------------------------------------
    def supports(self, n: Node, ctx: PlacementContext) -> str | None:
        rules = ctx.rules or ACCEL_RULES
        if n.op == "qavg_pool2d":   # a layer of its own on the ALU (compiler.accel.avgpool), whatever feeds it
            why = check_avg_pool(n, ctx.config)
            return None if why is None else Decline(f"{_label(n)}: {why}", "shape")
        if is_channel_epilogue(n):   # before the waste rule: no ALU or CPU pass does it for less
            return check_gemm(n, ctx.config, replace(rules, max_grouped_waste=1.0)) \
                or check_epilogue_tiling(n, ctx.config)
        if n.op in rules.gemm_ops:
            why = check_gemm(n, ctx.config, rules)
            if why is None and rules.gemm_by_cost and not (rules.depthwise_by_cost and is_depthwise(n)):
                beside = any(ctx.where.get(id(i)) == self.name for i in n.inputs if not i.is_const)
                why = check_gemm_cost(n, ctx.config, beside)
            return why
        if n.op in rules.alu_ops and n.dtype == "int8":
            producers = [i for i in n.inputs if not i.is_const]
            if n.op == "qadd" and len({i.shape for i in producers}) != 1:
                return Decline(f"{_label(n)}: broadcasting add has no ALU lowering", "shape")
            if n.op == "max_pool2d":
                why = check_pool(n, ctx.config)
                if why is not None:
                    return why
            if n.op == "qadd" and n.attrs.get("a_mul"):
                return Decline(f"{_label(n)}: add at scales that are not powers of two needs two multipliers; the "
                               f"ALU lowering aligns by shifts", "unsupported")
            if any(ctx.where.get(id(i)) == self.name for i in producers):
                return None
            return Decline(f"{_label(n)}: elementwise op not fed by an accelerator layer stays on the CPU", "placement",
                           hard=False)
        if n.op in rules.host_ops:
            return Decline(f"{_label(n)}: precision/layout conversion at the accelerator boundary runs on the host",
                           "boundary")
        if n.dtype.startswith("float") or any(i.dtype.startswith("float") for i in n.inputs):
            return Decline(f"{_label(n)}: float32 op; the accelerator computes int8 only", "float")
        return Decline(f"{_label(n)}: no accelerator implementation of {n.op}", "unsupported")

    def placement_kind(self, n: Node, ctx: PlacementContext) -> str:
        return "offload" if n.op in (ctx.rules or ACCEL_RULES).gemm_ops + ("qavg_pool2d",) else "fused"

    def estimate_cost(self, n: Node, ctx: PlacementContext) -> float | None:
        """Seconds on the accelerator: the planner's estimate at the config's clock
        (compiler.accel.depthwise_cost: the diagonal GEMM of a depthwise conv, the layer's own
        lowering otherwise)."""
        cfg = ctx.config
        if n.op not in (ctx.rules or ACCEL_RULES).gemm_ops:
            return 0.0   # elementwise ops ride in the producer's program
        if (ctx.rules or ACCEL_RULES).depthwise_by_cost and is_depthwise(n):   # the diagonal GEMM's cycles
            beside_cpu = any(ctx.where.get(id(i), self.name) != self.name for i in n.inputs if not i.is_const)
            return accel_depthwise_seconds(n, cfg, beside_cpu)
        return accel_gemm_seconds(n, cfg)

    # ---- building --------------------------------------------------------------------------------
    def graph_options(self, request: dict) -> dict:
        samples = request["calibration"]
        if not samples and not request["has_qdq"]:
            samples = request["random_calibration"](8)
            request["warnings"].append("calibrated on 8 seeded random normal inputs; pass calibration samples for "
                                       "real data")
        fill = request["target_options"]["space_to_depth_fill"]
        if not (isinstance(fill, (int, float)) and 0 <= fill <= 1):
            raise BuildError(f"target option space_to_depth_fill={fill!r}: a fraction in [0, 1] expected")
        return {"quantize": True, "calibration_samples": samples or None, "accel": request["cfg"],
                "force_target": dict(request["force_target"] or {}), "fuse": request["fuse"],
                "rules": replace(ACCEL_RULES, min_space_to_depth_fill=float(fill))}

    def prepare(self, b: Builder, tune) -> None:
        if tune not in (None, False, True):
            try:
                read_tuning_log(tune)   # a broken log stops the build (a layer's tiling error falls back)
            except CompilerError as e:
                raise BuildError(str(e)) from None
        st = b.state(self.name)
        st["tune"] = tune   # None: analytical tilings; True or a tuning-log path: measured on tsim
        st["ident"] = None

    def lower(self, b: Builder, n: Node) -> None:
        body = n.attrs["body"] if n.op == "fused" else single_body(n)
        env = {id(p): o for p, o in zip(body.inputs, n.inputs)}
        users = body.users()
        ops = body.ops
        last = body.outputs[0]
        i = 0
        while i < len(ops):
            head = ops[i]
            lo, hi = int8_min(head.attrs.get("out_zp", 0)), INT8_MAX
            j = i + 1
            while (j < len(ops) and ops[j].op in CLAMP_OPS and ops[j].inputs[0] is ops[j - 1]
                   and len(users[id(ops[j - 1])]) == 1 and ops[j - 1] is not last):
                lo, hi = _clamp(ops[j], lo, hi)
                j += 1
            if head.op in CLAMP_OPS:
                lo, hi = _clamp(head, lo, hi)
            tail = ops[j - 1]
            if head.op in ("qconv2d", "qdense"):
                end = self.try_fused_residual(b, n, ops, i, j, env, users, lo, hi)
                if end is not None:
                    i = end
                    continue
            out_tid = b.tid[id(n)] if tail is last else b.scratch(tail.name, tail.type)
            group = ops[i:j]
            try:
                self.emit_accel(b, head, [env[id(x)] for x in head.inputs], out_tid, lo, hi,
                                "+".join(o.op for o in group), sum(b.macs_of(o) for o in group))
            except CompilerError as e:
                self.fall_back(b, head, group, env, out_tid, str(e))
            env[id(tail)] = out_tid
            i = j

    def fall_back(self, b: Builder, head: Node, group: list, env: dict, out_tid: int, why: str) -> None:
        """The group on the CPU after its accelerator lowering failed (meta['fallbacks'] says why)."""
        tail = group[-1]
        label = "+".join(o.op for o in group)
        b.fallbacks.append(f"{head.name} ({label}) on the CPU instead of the accelerator: {why}")
        log.warning("%s: accelerator lowering failed, running on the CPU: %s", head.name, why)
        for o in group:
            b.decline(o, "lowering", f"{o.origin or o.op} '{o.name}': accelerator lowering failed, runs on the CPU: "
                      f"{why}", f"accelerator lowering failed: {why}")
        params = [Node.input(f"p{k}", x.shape, x.dtype) for k, x in enumerate(head.inputs)]
        ext = [env[id(x)] for x in head.inputs]
        # the ops of this group as a body of their own: head's inputs, then its clamps
        mp = {id(x): p for x, p in zip(head.inputs, params)}
        nodes = list(params)
        for o in group:
            nb = o.with_inputs([mp[id(x)] for x in o.inputs], target="cpu")
            mp[id(o)] = nb
            nodes.append(nb)
        gbody = Graph(nodes, params, [mp[id(tail)]], [tail.name], "fallback")
        b.fallback_body(head.name, gbody, ext, out_tid)

    def try_fused_residual(self, b: Builder, n: Node, ops: list, i: int, j: int, env: dict, users: dict, lo: int,
                           hi: int) -> int | None:
        """conv/dense (+clamps) followed by a qadd (+clamps) of its result: one accelerator program
        with the add in the epilogue (compiler.accel.conv2d.ResidualAdd); the index after the group.
        None when the pattern is absent or the accelerator declines it (then the ops lower one by one)."""
        body_last = (n.attrs["body"] if n.op == "fused" else single_body(n)).outputs[0]
        tail = ops[j - 1]
        if j >= len(ops) or ops[j].op != "qadd" or tail is body_last or len(users[id(tail)]) != 1:
            return None
        add = ops[j]
        if sum(x is tail for x in add.inputs) != 1:
            return None
        k = j + 1
        lo2, hi2 = -INT8_MAX, INT8_MAX
        while (k < len(ops) and ops[k].op in CLAMP_OPS and ops[k].inputs[0] is ops[k - 1]
               and len(users[id(ops[k - 1])]) == 1 and ops[k - 1] is not body_last):
            lo2, hi2 = _clamp(ops[k], lo2, hi2)
            k += 1
        other = add.inputs[1] if add.inputs[0] is tail else add.inputs[0]
        at = add.attrs
        if at.get("a_mul") or len(ops[i].inputs) == 4:  # fixed-point scales: the epilogue aligns by shifts only
            return None
        m = max(at["a_shift"], at["b_shift"])
        k_conv, k_other = (m - at["a_shift"], m - at["b_shift"]) if add.inputs[0] is tail else \
            (m - at["b_shift"], m - at["a_shift"])
        rq2 = Requant(m - at["out_shift"], lo2, hi2, True)
        group = ops[i:k]
        end = ops[k - 1]
        out_tid = b.tid[id(n)] if end is body_last else b.scratch(end.name, end.type)
        head = ops[i]
        try:
            self.emit_accel(b, head, [env[id(x)] for x in head.inputs], out_tid, lo, hi,
                            "+".join(o.op for o in group), sum(b.macs_of(o) for o in group),
                            residual=(env[id(other)], k_conv, k_other, rq2))
        except CompilerError as e:
            log.info("%s: residual add not fused (%s); lowering the ops one by one", head.name, e)
            return None
        env[id(end)] = out_tid
        return k

    def program(self, b: Builder, name: str, emit: Callable) -> tuple[int, int]:
        """(address, count) of the instructions `emit` writes, encoded into the module's DRAM."""
        s = b.dev.stream()
        try:
            s.emit_preloaded(emit)   # the program's micro-op kernels load first, in one LOAD
            insns = s.finish()
            code = encode_program(insns, b.cfg)
            # the weight-buffer entries it loads: resident weights must lie outside every other program's
            # and the accumulator entries it writes: LOADs, and below the top any GEMM or ALU reaches
            def loads(mem):
                return [(i.sram_base, i.sram_base + (i.y_pad0 + i.y_size + i.y_pad1) * (i.x_pad0 + i.x_size + i.x_pad1))
                        for i in insns if isinstance(i, Load) and i.mem_type == mem]
            acc_top = max([k.max_dst + 1 for k in s.kernels_used.values()] + [0])
            b.state(self.name).setdefault("wgt_loads", []).append((name, loads(MemType.WGT)))
            b.state(self.name).setdefault("acc_writes", []).append((name, loads(MemType.ACC), acc_top))
        except AccelError as e:
            if isinstance(e, CompilerError):
                raise
            raise BuildError(f"{name}: {e}") from None
        buf = b.mem.alloc(code.nbytes, align=max(INSN_BYTES, 64), name=f"insns {name}")
        buf.write(code)
        b.data_bufs.add(buf.addr)
        return buf.addr, len(insns)

    def emit_accel(self, b: Builder, head: Node, ins: list, out_tid: int, lo: int, hi: int, label: str, macs: int,
                   residual: tuple | None = None) -> None:
        cfg = b.cfg
        out = b.tbuf[out_tid]
        step_attrs: dict = {}
        if head.op in ("qconv2d", "qdense"):
            spec = self.gemm_spec(b, head)
            groups = head.attrs.get("groups", 1) if head.op == "qconv2d" else 1
            # a grouped conv written as one dense conv: each run of output blocks reads only its input window
            chunks = windowed_chunks(ins[1].value) if head.op == "qconv2d" and groups == 1 else None
            if chunks:
                tiling = [self.tiling(b, window_spec(spec, c, cfg), residual is not None) for c in chunks]
            else:
                tiling = self.tiling(b, group_spec(spec, groups, cfg.batch) if groups > 1 else spec,
                                     residual is not None)
            fused = None
            if residual is not None:
                other, ka, kb, rq2 = residual
                ident = residual_identity(cfg, ka, kb)  # declines kb - ka > 6 before anything is allocated
                fused = ResidualAdd(b.buf(other), b.weight_buf(ident, cfg.wgt_elem_bytes, f"{head.name}.identity"),
                                    ka, kb, rq2)
            if chunks:
                w = [b.weight_buf(np.ascontiguousarray(ins[1].value[o0:o1, i0:i1]), cfg.wgt_elem_bytes,
                                  f"{head.name}.wgt{o0}") for o0, o1, i0, i1 in chunks]
            else:
                w = b.weight_buf(ins[1].value, cfg.wgt_elem_bytes, f"{head.name}.wgt")
            at = head.attrs
            bias, zp = ins[2].value, at.get("out_zp", 0)
            if zp and len(ins) == 3 and not is_fixed_point(at) and requant_shift(at) >= 0:
                # (acc + half + zp 2^s) >> s == ((acc + half) >> s) + zp: the zero point rides on the bias
                bias = bias.astype(np.int64) + (zp << requant_shift(at))
                if np.abs(bias).max() >= 1 << 31:
                    raise TilingError(f"{head.name}: bias with the output zero point {zp} does not fit int32")
                bias, zp = bias.astype(np.int32), 0
            bb = b.weight_buf(pack_bias(bias, cfg), cfg.acc_elem_bytes, f"{head.name}.bias")
            scales = None
            if len(ins) == 4:  # per-channel multipliers: SCALE operands per channel, then the clamp
                ops = channel_scale_operands(ins[3].value, requant_shift(at), cfg.acc_width)
                scales = b.weight_buf(pack_bias(ops, cfg), cfg.acc_elem_bytes, f"{head.name}.scales")
                rq = Requant(0, lo, hi, zero_point=zp)
            else:
                rq = Requant(requant_shift(at), lo, hi, is_fixed_point(at), at.get("mul", 1), zp)
            x = b.buf(ins[0])
            groups = at.get("groups", 1) if head.op == "qconv2d" else 1
            if chunks:
                addr, count = self.program(b, head.name, lambda s: emit_windowed_conv2d(s, spec, chunks, tiling, x, w,
                                                                                        out, bb, rq, scales, fused))
            elif groups > 1:
                addr, count = self.program(b, head.name, lambda s: emit_grouped_conv2d(s, spec, groups, tiling, x, w,
                                                                                       out, bb, rq, scales, fused))
            else:
                base = self.resident_plan(b).get(head.name)
                if base is not None:   # two programs: the first run's loads the weights, later runs' skip them
                    try:
                        st = b.state(self.name)
                        bias_at = st["resident_acc"].get(head.name, (None,))[0]
                        # the tile slots below the resident biases
                        acc_limit = min(a for a, _ in st["resident_acc"].values()) if bias_at is not None else None
                        tilings = (tiling, tiling)
                        if is_dense(spec) and (bias_at is not None or not st.get("tune")):
                            # each run's fastest (the later runs' without weight loads), same input chunks
                            tilings = resident_dense_tilings(spec, cfg, residual is not None, acc_limit=acc_limit)
                        (addr, count), (waddr, wcount) = [
                            self.program(b, head.name, lambda s, t=t, r=r: emit_conv2d(s, spec, t, x, w, out, bb, rq,
                                                                                       fused, scales, r))
                            for t, r in zip(tilings, [WeightRegion(base, load, bias_at) for load in (True, False)])]
                        step_attrs = {"warm_insn_addr": waddr, "warm_insn_count": wcount}
                    except CompilerError as e:
                        log.warning("%s: weights not kept resident: %s", head.name, e)
                        base = None
                if base is None:
                    addr, count = self.program(b, head.name, lambda s: emit_conv2d(s, spec, tiling, x, w, out, bb,
                                                                                   rq, fused, scales))
        elif head.op in ("max_pool2d", "qavg_pool2d"):
            what = "max" if head.op == "max_pool2d" else "average"
            if len(head.shape) != 6 or tuple(head.shape[-2:]) != (cfg.batch, cfg.block_out):
                raise TilingError(f"{head.name}: {what} pooling on the accelerator needs the packed (batch, "
                                  f"block_out) layout, got shape {list(head.shape)}")
            st = b.state(self.name)
            if st.get("ident") is None:
                st["ident"] = b.weight_buf(identity_weights(cfg), cfg.wgt_elem_bytes, "identity")
            ident, x = st["ident"], b.buf(ins[0])
            if head.op == "max_pool2d":
                spec = pool_spec(head, head.inputs[0].shape)
                addr, count = self.program(b, head.name, lambda s: emit_max_pool(s, spec, x, out, ident, lo, hi))
            else:
                spec = avg_pool_spec(head, head.inputs[0].shape)
                if head.attrs.get("gains"):   # per-channel gains: the pool's own diagonal weight tiles
                    ident = b.weight_buf(pool_weights(head.attrs, cfg), cfg.wgt_elem_bytes, f"{head.name}/gains")
                addr, count = self.program(b, head.name, lambda s: emit_avg_pool(s, spec, head.attrs, x, out, ident,
                                                                                 lo, hi))
        elif head.op in ("qadd",) + CLAMP_OPS:
            if cfg.block_in != cfg.block_out:
                raise TilingError(f"{head.name}: the accelerator adds packed tensors only when block_in == block_out "
                                  f"({cfg.block_in} != {cfg.block_out})")
            blk = head.shape[-2:]
            if tuple(blk) != (cfg.batch, cfg.block_out):
                raise TilingError(f"{head.name}: packed blocks {list(blk)} are not (batch, block_out)")
            n_entries = math.prod(head.shape) // (cfg.batch * cfg.block_out)
            st = b.state(self.name)
            if st.get("ident") is None:
                st["ident"] = b.weight_buf(identity_weights(cfg), cfg.wgt_elem_bytes, "identity")
            ident = st["ident"]
            if head.op == "qadd":
                x, y = b.buf(ins[0]), b.buf(ins[1])
                at = head.attrs
                m = max(at["a_shift"], at["b_shift"])
                ka, kb, rq = m - at["a_shift"], m - at["b_shift"], Requant(m - at["out_shift"], lo, hi, True)
            else:  # a clamp alone: (a + a + 1) >> 1 == a, then the clamp
                x = y = b.buf(ins[0])
                ka, kb, rq = 0, 0, Requant(1, lo, hi, True)
            addr, count = self.program(b, head.name, lambda s: emit_add(s, n_entries, x, y, out, ident, ka, kb, rq,
                                                                        name=head.name))
        else:
            raise TilingError(f"{head.name}: no accelerator lowering for {head.op}")
        inputs = [b.tensor_of(o) for o in ins if not (isinstance(o, Node) and o.is_const)]
        if residual is not None:
            inputs.append(b.tensor_of(residual[0]))
        b.steps.append(Step(head.name, "accel", label, inputs, out_tid, [], None, step_attrs, addr, count, macs))

    # ---- weights resident across inferences ------------------------------------------------------
    def resident_plan(self, b: Builder) -> dict[str, int]:
        """Layer name -> base weight-buffer entry of the GEMM layers whose weights stay on chip
        across inferences (compiler.accel.plan.plan_resident_weights), computed once per build from
        the partitioned graph; {} with build_model(target_options={"resident_weights": False})."""
        st = b.state(self.name)
        if "resident" not in st:
            st["resident"] = self._plan_resident(b) if b.option("resident_weights") else {}
        return st["resident"]

    def _plan_resident(self, b: Builder) -> dict[str, int]:
        cfg, layers, others = b.cfg, {}, 1   # others: the eltwise/pool identity tile at entry 0
        acc_layers, acc_others = {}, 0
        only_gemms = True   # every accelerator program a GEMM layer's: their accumulator use is known
        for n in b.g.ops:
            if (n.target or b.primary.name) != self.name:
                continue
            body = n.attrs["body"] if n.op == "fused" else single_body(n)
            outer = {id(p): o for p, o in zip(body.inputs, n.inputs)}
            # clamps and a residual add ride in a GEMM layer's program; alone they are programs of their own
            only_gemms = only_gemms and any(op.op in ("qconv2d", "qdense") for op in body.ops) and \
                all(op.op in ("qconv2d", "qdense", "qadd") + CLAMP_OPS for op in body.ops)
            for op in body.ops:
                if op.op not in ("qconv2d", "qdense"):
                    continue
                try:
                    spec = self.gemm_spec(b, op)
                    groups = op.attrs.get("groups", 1) if op.op == "qconv2d" else 1
                    view = dense_view(spec, cfg) if is_dense(spec) else spec
                    t = plan_conv2d(view if groups == 1 else group_spec(spec, groups, cfg.batch), cfg, 2, False)
                    needs = _needs(view, t)
                except CompilerError:   # lowers some other way or falls back; link() checks what it loads
                    only_gemms = False
                    continue
                need, g = needs["wgt"], _Geom.of(spec, cfg)
                ob = g.ob
                wconst = outer.get(id(op.inputs[1]), op.inputs[1])
                # a conv too, where its weights come in one input chunk and it is not a grouped conv in windows
                conv_ok = (op.op == "qconv2d" and groups == 1 and t.ic_t >= g.cb and wconst.is_const
                           and not windowed_chunks(wconst.value))
                if (op.op == "qdense" and is_dense(spec)) or conv_ok:
                    layers[op.name] = (weight_region_entries(spec, cfg), need)
                else:
                    others = max(others, need)
                if op.op == "qdense" and is_dense(spec) and len(op.inputs) == 3:
                    acc_layers[op.name] = (ob, needs["acc"] + ob)   # a bias, no per-channel scales: it may stay
                else:
                    acc_others = max(acc_others, needs["acc"] + 2 * ob)   # slots, the biases and scales past them
                only_gemms = only_gemms and groups == 1
        plan = plan_resident_weights(layers, cfg.wgt_depth, others)
        st = b.state(self.name)
        st["resident_entries"] = {k: layers[k][0] for k in plan}
        # their biases above every program's accumulator slots, where every program's use is known
        acc = {k: v for k, v in acc_layers.items() if k in plan} if only_gemms else {}
        acc_others = max([acc_others] + [v[1] for k, v in acc_layers.items() if k not in acc])
        acc_plan = plan_resident_weights(acc, cfg.acc_depth, acc_others, top=cfg.acc_depth)
        st["resident_acc"] = {k: (base, acc[k][0]) for k, base in acc_plan.items()}
        if layers and len(plan) < len(layers):
            log.info("resident weights: %d of %d dense layers fit the %d-entry weight buffer", len(plan), len(layers),
                     cfg.wgt_depth)
        return plan

    def link(self, b: Builder) -> None:
        """Check that no program loads weights into another layer's resident place (else every run
        loads every layer's weights, as without residency); meta['resident_weights'] says what stays."""
        st = b.state(self.name)
        plan = st.get("resident") or {}
        warm = [s for s in b.steps if s.kind == "accel" and "warm_insn_addr" in s.attrs]
        if not warm:
            return
        sizes = st["resident_entries"]
        kept = {s.name for s in warm}
        places = {k: (plan[k], plan[k] + sizes[k]) for k in kept}
        clash = next((f"{who} loads weights into {k}'s resident place" for who, ranges in st.get("wgt_loads", [])
                      for k, (a, z) in places.items() if k != who and any(lo < z and a < hi for lo, hi in ranges)),
                     None)
        biases = {k: (a, a + n) for k, (a, n) in st.get("resident_acc", {}).items() if k in kept}
        clash = clash or next((f"{who} writes accumulator entries of {k}'s resident bias"
                               for who, ranges, top in st.get("acc_writes", []) for k, (a, z) in biases.items()
                               if top > a or (k != who and any(lo < z and a < hi for lo, hi in ranges))), None)
        if clash is not None:
            why = clash
            log.warning("resident weights off: %s", why)
            for s in warm:
                del s.attrs["warm_insn_addr"], s.attrs["warm_insn_count"]
            b.target_meta["resident_weights"] = {"layers": {}, "entries": 0, "off": why}
            return
        b.target_meta["resident_weights"] = {
            "layers": {k: {"base": a, "entries": z - a} for k, (a, z) in sorted(places.items())},
            "entries": sum(z - a for a, z in places.values()), "wgt_depth": b.cfg.wgt_depth,
            "biases": {k: {"base": a, "entries": z - a} for k, (a, z) in sorted(biases.items())}}

    def tiling(self, b: Builder, spec, residual: bool):
        """The layer's tiling: the analytical best, or with `tune` the fastest of the best few on tsim."""
        tune = b.state(self.name).get("tune")
        if not tune:
            return plan_conv2d(spec, b.cfg, 2, residual)
        log_path = None if tune is True else tune
        tiling, record = tune_conv2d(spec, b.cfg, 2, TUNE_TOP, "tsim", log_path, residual)
        b.tuning[spec.name] = {"tiling": tiling.describe(), "cycles": record["cycles"],
                               "candidates": len(record.get("trials", []))}
        return tiling

    def gemm_spec(self, b: Builder, n: Node) -> Conv2dSpec:
        cfg = b.cfg
        x, w = n.inputs[0].shape, n.inputs[1].shape
        if n.op == "qconv2d":
            if n.attrs["layout"] != "NCHWnc":
                raise TilingError(f"{n.name}: qconv2d in layout {n.attrs['layout']} is not packed for the accelerator")
            nb, cb, h, wd, bn, bi = x
            ob, _, kh, kw, bo, _ = w
            spec = Conv2dSpec.from_attrs(nb * bn, cb * bi, h, wd, ob * bo, kh, kw, n.attrs, n.name)
        else:
            if n.attrs["layout"] != "NCnc":
                raise TilingError(f"{n.name}: qdense in layout {n.attrs['layout']} is not packed for the accelerator")
            nb, kb, bn, bi = x
            ob, _, bo, _ = w
            spec = Conv2dSpec(nb * bn, kb * bi, 1, 1, ob * bo, 1, 1, name=n.name)
        if (bn, bi, bo) != (cfg.batch, cfg.block_in, cfg.block_out):
            raise TilingError(f"{n.name}: packed blocks ({bn}, {bi}, {bo}) differ from the config's "
                              f"({cfg.batch}, {cfg.block_in}, {cfg.block_out})")
        return spec

    # ---- output ----------------------------------------------------------------------------------
    def emit(self, module, out_dir: Path) -> list[Path]:
        """Per accelerator step its program as assembly (accel<k>_<layer>.asm), decoded from the
        module's DRAM image (the text `accel asm` reads back)."""
        written = []
        for k, s in enumerate(module.steps):
            if s.kind != "accel":
                continue
            code = program_bytes(module.segments, s.insn_addr, s.insn_count * INSN_BYTES)
            if code is None:
                raise BuildError(f"--emit: step {s.name!r}: its program at {s.insn_addr:#x} is not in the module image")
            hint = "".join(c if c.isascii() and c.isalnum() else "_" for c in s.name)[:40]
            text = f"; {s.name}: {s.op}, {s.insn_count} instructions\n" + disassemble_bytes(code, module.config)
            written.append(write_source(out_dir, f"accel{k}_{hint}.asm", text))
        return written


def program_bytes(segments: list, addr: int, nbytes: int) -> bytes | None:
    """The nbytes at DRAM address addr from the module image's segments (None if no segment holds them)."""
    for start, data in segments:
        if start <= addr and addr + nbytes <= start + len(data):
            return bytes(data[addr - start:addr - start + nbytes])
    return None


register_target(AccelTarget())

__all__ = ["AccelTarget", "AccelRules", "ACCEL_RULES", "check_gemm", "check_gemm_cost", "gemm_waste",
           "roofline_efficiency"]
