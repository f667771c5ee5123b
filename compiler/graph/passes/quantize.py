"""Quantize: float graph -> int8 whose GEMM layers requantize with an arithmetic shift, as the
accelerator does: int32 accumulation, bias added in int32 (with the rounding half folded in), SHR
by in_shift + w_shift - out_shift, CLIP to [-127, 127]. Tensors that an int8 add or concat ties
together have power-of-two scales (value = q * 2^-shift); the others their exact step, max |x| /
127, with the weight step of the layer between two such tensors absorbing the ratio of their
steps, so that its requantization stays one shift (exact_steps, EXACT_STEPS).

Activation shifts come from calibration on sample inputs (`calibrate`) or from a QDQ model's own
scales (`import_qdq`); weight shifts from the weights. A QDQ model's scales are kept exactly
(Calibration.scales, and the int8 weights of its folded DequantizeLinear, graph.meta['weight_scales']):
where one is not a power of two the layer requantizes in fixed point instead (a 24-bit multiplier
and a rounding shift, compiler.graph.ops.fixed_multiplier; qadd and concat likewise), as the model's int8
arithmetic does. Its asymmetric activations keep their zero points (onnxruntime's default export):
a conv/dense folds the input's into its bias (-zx sum(w); a padded conv reads an explicit pad holding
zx), adds the output's before saturating to [-128, 127] (attr out_zp); ReLU becomes the clamp at the
zero point; adds and concats of asymmetric tensors run in float, from the model's rounded inputs.
conv2d/dense with constant weights become qconv2d/qdense; add of activations becomes qadd; ops
exact on int8 with an unchanged scale (relu, clip, max pooling, reshape, transpose, slice, pad by
zero, concat) stay int8; an average pool with one divisor becomes an int8 depthwise conv, as does a
per-channel multiply-add (a batch norm that could not fold, INT8_AFFINES) (affine_as_depthwise);
a channel concat read only by such depthwise convs keeps each input at its own scale, a scale per
channel that their multipliers absorb (channel_scaled_concats); everything else runs in float
between dequantize/quantize nodes.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import QuantizeError
from ..interpret import run
from ..ir import Graph, Node, rewrite
from ..ops import INT8_MAX, fixed_multiplier, int8_min
from .eliminate_dead_code import eliminate_dead_code

log = logging.getLogger(__name__)

#: activation/weight shifts outside this are clamped (calibrate logs it). Every int8 op uses shift
#: differences only, so the coarse end is float32's: 127 * 2^120 and 2^-120 are normal float32s. It
#: was -8 (steps of at most 256): residual nets with random weights grow past 127 * 256 (ShuffleNet
#: 9e4, ResNet-50 1e5), and every tensor beyond saturated (logit cosine 0.80 against float, not 0.999).
SHIFT_RANGE = (-120, 24)
#: per-channel affines (unfoldable batch norms) as int8 depthwise convs. Their int8 output makes
#: the concats after them int8; a concat read only by depthwise convs (the affines) and other such
#: concats keeps each input at its own scale (a scale per channel, channel_scaled_concats), which the
#: depthwise conv's per-channel multipliers absorb. A concat requantized to its coarsest input's
#: scale lost so much that the next batch norm's gain amplified it (DenseNet-121, random weights:
#: cosine 0.78 against onnxruntime instead of 0.99).
INT8_AFFINES = True
#: GEMM layers read only by channel concats and depthwise convs write a scale per output channel
#: (channel_scaled_outputs)
CHANNEL_OUTPUTS = True
#: a channel's step is at most 2^this finer than the layer's coarsest one
CHANNEL_STEP_SPREAD = 12
#: the most of an output step an int8 affine (a batch norm as a depthwise conv) may lose to its
#: bias's rounding; coarser ones stay float (_Quantizer.affine_precise)
AFFINE_BIAS_ERROR = 1 / 16
SHR_RANGE = (-32, 31)  # what one SHR of a 32-bit accumulator can do (AluOp.SHR, acc_width 32)
#: calibrated tensors that no int8 add or concat ties to another take their exact step, max |x| /
#: 127, not the power of two above it (which leaves up to half of int8's range unused); a GEMM
#: layer between such steps still requantizes by a plain shift, its weight step absorbing the
#: ratio of its output and input steps (_Quantizer.ratio_weights). Tied tensors keep power-of-two
#: steps, so that the int8 add and concat align them by shifts (exact_steps)
EXACT_STEPS = True

#: ops whose int8 result is exact at the input's scale (attrs adjusted by _int8_attrs).
SCALE_PRESERVING = ("relu", "clip", "max_pool2d", "reshape", "transpose", "slice", "take", "pad")
#: ops that keep a scale per channel (channel_scaled_concats, channel_scaled_outputs) as it is
CHANNEL_OPS = ("concat", "relu", "max_pool2d")
#: ops whose output values are a subset of their input's (a missing range is the input's).
RANGE_PRESERVING = ("reshape", "transpose", "slice", "take", "max_pool2d")
#: consumers whose range, not the producer's, sets a conv/dense/add output shift (saturating
#: before them is harmless: they clamp anyway).
CLAMPING = ("relu", "clip")


def pow2_exponent(scale: float) -> int | None:
    """k when scale is exactly 2^-k, else None."""
    m, e = math.frexp(scale)
    return 1 - e if m == 0.5 else None


def pow2_shift(absmax: float) -> int:
    """The largest k with absmax * 2^k <= 127 (so absmax is representable), clamped to SHIFT_RANGE."""
    if not absmax > 0 or not math.isfinite(absmax):
        return 0
    k = math.floor(math.log2(INT8_MAX / absmax))
    return max(SHIFT_RANGE[0], min(SHIFT_RANGE[1], k))


@dataclass
class Calibration:
    """Per-tensor ranges and shifts, from sample inputs or a QDQ model's scales."""
    absmax: dict[str, float] = field(default_factory=dict)
    shifts: dict[str, int] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)
    samples: int = 0
    #: a QDQ model's exact scales (where present they win over 2^-shift)
    scales: dict[str, float] = field(default_factory=dict)
    #: a QDQ model's zero points of asymmetric activations, as int8 (a uint8 one minus 128)
    zero_points: dict[str, int] = field(default_factory=dict)
    #: per-channel max |value| of calibrated N C H W tensors (for channel_scaled_outputs)
    channel_absmax: dict[str, np.ndarray] = field(default_factory=dict)

    def scale(self, name: str) -> float | None:
        if name in self.scales:
            return self.scales[name]
        return 2.0 ** -self.shifts[name] if name in self.shifts else None

    def table(self) -> str:
        rows = [f"{'tensor':32} {'source':11} {'absmax':>10} {'shift':>5} {'step':>10} {'max':>10} {'use':>5}"]
        for name, k in self.shifts.items():
            a = self.absmax.get(name, float("nan"))
            step = self.scale(name)
            top = INT8_MAX * step
            rows.append(f"{name[:32]:32} {self.source.get(name, ''):11} {a:10.4g} {k:5d} {step:10.4g} "
                        f"{top:10.4g} {a / top:5.0%}")
        return "\n".join(rows)

    def merged(self, other: "Calibration") -> "Calibration":
        """self's entries, with other's filling the gaps."""
        c = Calibration(dict(other.absmax), dict(other.shifts), dict(other.source), max(self.samples, other.samples),
                        {k: v for k, v in other.scales.items() if k not in self.shifts},
                        {k: v for k, v in other.zero_points.items() if k not in self.shifts})
        c.absmax.update(self.absmax)
        c.shifts.update(self.shifts)
        c.source.update(self.source)
        c.scales.update(self.scales)
        c.zero_points.update(self.zero_points)
        c.channel_absmax = {**other.channel_absmax, **self.channel_absmax}
        return c


def calibrate(graph: Graph, samples) -> Calibration:
    """Run the float graph on sample feeds; record every float tensor's max |value| and its shift."""
    samples = list(samples)
    if not samples:
        raise QuantizeError("calibrate: no sample inputs given")
    cal = Calibration(samples=len(samples))
    for feed in samples:
        _, env = run(graph, feed, keep=True)
        for n in graph.nodes:
            if n.op == "const" or not n.dtype.startswith("float"):
                continue
            v = env[id(n)]
            a = float(np.max(np.abs(v))) if n.type.size else 0.0
            cal.absmax[n.name] = max(cal.absmax.get(n.name, 0.0), a)
            if v.ndim == 4 and v.size:
                ca = np.max(np.abs(v), axis=(0, 2, 3)).astype(np.float64)
                prev = cal.channel_absmax.get(n.name)
                cal.channel_absmax[n.name] = ca if prev is None else np.maximum(prev, ca)
    for name, a in cal.absmax.items():
        cal.shifts[name] = pow2_shift(a)
        cal.source[name] = "calibration"
        if a > 0 and math.isfinite(a) and a * 2.0 ** cal.shifts[name] > INT8_MAX:
            log.warning("calibrate: tensor '%s' reaches %.4g, beyond int8 at the coarsest step 2^%d: it saturates",
                        name, a, -SHIFT_RANGE[0])
    return cal


def _qparam_attrs(scale: float, zero_point: int = 0) -> dict:
    """quantize/dequantize attrs for a tensor scale (a shift when it is a power of two) and zero point."""
    k = pow2_exponent(scale)
    attrs = {"shift": k} if k is not None else {"scale": scale}
    return {**attrs, "zero_point": zero_point} if zero_point else attrs


class Unrepresentable(QuantizeError):
    """A layer's scales that its int8 form cannot carry (a bias beyond int32, a shift or multiplier
    beyond the ALU's): that layer stays float, the rest of the model quantizes."""


def _fixed(real: float, what: str) -> tuple[int, int]:
    """compiler.graph.ops.fixed_multiplier, its error as Unrepresentable."""
    try:
        return fixed_multiplier(real, what)
    except ValueError as e:
        raise Unrepresentable(f"quantize: {e}") from None


class _Quantizer:
    def __init__(self, graph: Graph, cal: Calibration):
        self.graph, self.cal = graph, cal
        self.users = graph.users()
        self.weight_scales: dict[str, float] = graph.meta.get("weight_scales", {})
        self.scale: dict[int, float] = {}  # id(new int8 node) -> its scale (2^-shift unless a QDQ model's)
        self.zp: dict[int, int] = {}       # id(new int8 node) -> its zero point, where not 0
        self.deq: dict[int, Node] = {}
        self.q: dict[int, Node] = {}
        self.layers: list[dict] = []
        self.affine: set[str] = set()   # weights of affine_as_depthwise's convs (float where they cannot be int8)
        self.channel_concats: set[str] = set()   # concats whose int8 has a scale per channel (channel_scaled_concats)
        self.channel_out: set[str] = set()   # GEMM layers writing a scale per channel (channel_scaled_outputs)

    def qparams_for(self, old: Node, why: str) -> tuple[float, int]:
        """(scale, zero point) to quantize tensor `old` at."""
        src = old
        while self.cal.scale(src.name) is None and src.op in RANGE_PRESERVING:
            src = src.inputs[0]  # values are a subset of the input's: its scale fits
        s = self.cal.scale(src.name)
        if s is not None:
            return s, self.cal.zero_points.get(src.name, 0)
        raise QuantizeError(f"quantize: no scale for tensor '{old.name}' ({old.op}), needed {why}; "
                            f"calibrate with sample inputs or give a QDQ model")

    def out_qparams(self, old: Node) -> tuple[float, int]:
        """(scale, zero point) of a conv/dense/add result: the range of a clamping sole consumer
        (reached through reshapes/transposes) if there is one, else its own, else that of the reshape
        holding its value (a QDQ model names the tensor after the reshape). The zero point is that
        of the tensor whose scale is taken (a QDQ model's asymmetric activation; else 0)."""
        chain, cur = [], old
        while len(self.users[id(cur)]) == 1 and not any(cur is o for o in self.graph.outputs):
            u = self.users[id(cur)][0]
            if u.op not in CLAMPING + ("reshape", "transpose"):
                break
            chain.append(u)
            if u.op in CLAMPING:
                break
            cur = u
        scale = self.cal.scale

        def of(name: str) -> tuple[float, int]:
            return scale(name), self.cal.zero_points.get(name, 0)
        if self.model_scale(old.name) is not None:  # a QDQ model rounds here (and again after a clamp)
            return of(old.name)
        if chain and chain[-1].op in CLAMPING and scale(chain[-1].name) is not None:
            return of(chain[-1].name)
        if scale(old.name) is not None:
            return of(old.name)
        for c in chain:
            if scale(c.name) is not None:
                return of(c.name)
        return self.qparams_for(old, "for its output")

    def has_scales(self, old: Node, ins: list[Node]) -> bool:
        """Whether a conv/dense has scales for its input and result, to run in int8. Calibration
        gives every tensor one; a QDQ model quantizes only where it says (onnxruntime runs the rest
        in float), and a layer the import made (a linear Resize's interpolation along one axis) may
        have none: it stays float."""
        if "qdq" not in self.cal.source.values():
            return True
        try:
            self.out_qparams(old)
            if id(ins[0]) not in self.scale:
                self.qparams_for(old.inputs[0], "")
        except QuantizeError:
            return False
        return True

    def model_scale(self, name: str) -> float | None:
        """The scale a QDQ model gives this tensor, where it gives one."""
        return self.cal.scales.get(name) if self.cal.source.get(name) == "qdq" else None

    def as_float(self, n: Node) -> Node:
        if id(n) not in self.scale:
            return n
        if id(n) not in self.deq:
            s = self.scale[id(n)]
            if isinstance(s, np.ndarray):   # a scale per channel: the int8 values times each channel's step
                deq = Node("dequantize", [n], {"shift": 0}, name=f"{n.name}/dequantize")
                step = Node.const(s.reshape(1, -1, 1, 1).astype(np.float32), name=f"{n.name}/steps")
                self.deq[id(n)] = Node("mul", [deq, step], name=f"{n.name}/dequantize_channels")
            else:
                attrs = _qparam_attrs(s, self.zp.get(id(n), 0))
                self.deq[id(n)] = Node("dequantize", [n], attrs, name=f"{n.name}/dequantize")
        return self.deq[id(n)]

    def channel_scaled(self, n: Node) -> bool:
        """Whether int8 node n carries a scale per channel (a channel_scaled_concats concat)."""
        return isinstance(self.scale.get(id(n)), np.ndarray)

    def as_int8(self, n: Node, old: Node, consumer: Node, channels: bool = False) -> tuple[Node, float, int]:
        """(int8 node, scale, zero point) of consumer input n (old: the float graph's node). The scale
        is an array (one per channel) only where `channels` says the consumer takes that; else such
        an input is requantized to one scale (through float)."""
        if self.channel_scaled(n) and not channels:
            n = self.as_float(n)
        if id(n) in self.scale:
            return n, self.scale[id(n)], self.zp.get(id(n), 0)
        if n.is_const:
            k = pow2_shift(float(np.max(np.abs(n.value))) if n.value.size else 0.0)
            return Node.const(np.clip(np.rint(n.value * 2.0 ** k), -INT8_MAX, INT8_MAX).astype(np.int8),
                              name=f"{n.name}/q"), 2.0 ** -k, 0
        if id(n) not in self.q:
            s, z = self.qparams_for(old, f"as input of {consumer.op} '{consumer.name}'")
            q = Node("quantize", [n], _qparam_attrs(s, z), name=f"{n.name}/quantize")
            self.q[id(n)] = self.mark(q, s, z)
        q = self.q[id(n)]
        return q, self.scale[id(q)], self.zp.get(id(q), 0)

    def mark(self, n: Node, s: float, z: int = 0) -> Node:
        self.scale[id(n)] = s
        if z:
            self.zp[id(n)] = z
        return n

    def floating(self, ins: list[Node], n: Node) -> Node:
        """n computed in float from dequantized inputs (its consumers quantize again where they need to).
        A float input that a QDQ model quantizes is rounded as the model's Q/DQ pair rounds it."""
        new_ins = []
        for i, o in zip(ins, n.inputs):
            if id(i) not in self.scale and not i.is_const and self.model_scale(o.name) is not None:
                i = self.as_int8(i, o, n)[0]
            new_ins.append(self.as_float(i))
        return n if all(a is b for a, b in zip(new_ins, n.inputs)) else n.with_inputs(new_ins)

    def weights(self, n: Node) -> tuple[np.ndarray, np.ndarray]:
        """(int8 weights, scale: one, or one per output channel): a QDQ model's own int8 values when
        its weight scale (per tensor, or per output channel) reproduces them, else the finest power
        of two that holds the weights."""
        w = n.inputs[1].value.astype(np.float64)
        s = self.weight_scales.get(n.inputs[1].name)
        per_out = s is not None and (s.size == 1 or (s.shape[0] == w.shape[0] and s.size == w.shape[0]))
        if per_out and np.all(s > 0):
            q = np.rint(w / s)
            if np.abs(q).max(initial=0) <= INT8_MAX and np.allclose(q * s, w, rtol=1e-5, atol=0):
                return q.astype(np.int8), (s.reshape(()) if s.size == 1 else s.reshape(-1))
        k = pow2_shift(float(np.max(np.abs(w))))
        return np.clip(np.rint(w * 2.0 ** k), -INT8_MAX, INT8_MAX).astype(np.int8), np.array(2.0 ** -k)

    def ratio_weights(self, n: Node, sx: float, so: float) -> tuple[np.ndarray, np.ndarray, int] | None:
        """(int8 weights, weight step, shift m) with the step so / sx * 2^-m, the finest of that form
        that holds the weights: the layer then requantizes by a plain shift of m whatever its input
        and output steps are (exact_steps). None when the weights are 0 or m is beyond SHR_RANGE."""
        w = n.inputs[1].value.astype(np.float64)
        a = float(np.max(np.abs(w))) if w.size else 0.0
        r = so / sx
        if not a > 0 or not math.isfinite(r) or not r > 0:
            return None
        m = math.floor(math.log2(INT8_MAX * r / a))
        while a / (r * 2.0 ** -m) > INT8_MAX:   # float rounding at the boundary
            m -= 1
        if not SHR_RANGE[0] <= m <= SHR_RANGE[1]:
            return None
        sw = r * 2.0 ** -m
        return np.clip(np.rint(w / sw), -INT8_MAX, INT8_MAX).astype(np.int8), np.array(sw), m

    def channel_weights(self, n: Node) -> tuple[np.ndarray, np.ndarray]:
        """(int8 weights, scale per output channel): each output channel's weights at the finest
        power of two that holds them (a layer with per-channel multipliers loses nothing by it,
        and a batch norm or Scale folded into the weights leaves their channels far apart)."""
        w = n.inputs[1].value.astype(np.float64)
        ks = np.array([pow2_shift(float(np.max(np.abs(c)))) for c in w.reshape(w.shape[0], -1)])
        q = np.rint(w * (2.0 ** ks).reshape((-1,) + (1,) * (w.ndim - 1)))
        return np.clip(q, -INT8_MAX, INT8_MAX).astype(np.int8), 2.0 ** -ks.astype(np.float64)

    def per_channel(self, n: Node, sx: float, sw: np.ndarray, so) -> tuple[int, np.ndarray]:
        """(shift k, int64 multipliers M_c) with M_c 2^-k ~ sx sw_c / so_c for each output channel
        (so: one output scale, or one per channel): each channel's own 24-bit multiplier, aligned to
        the largest shift the int64 product allows (channels whose scale is over 2^7 times smaller
        keep fewer bits)."""
        real = [sx * float(c) / float(o) for c, o in zip(sw, np.broadcast_to(np.asarray(so, np.float64), sw.shape))]
        pairs = [_fixed(r, f"{n.op} '{n.name}' channel {i}") for i, r in enumerate(real)]
        k = min(max(kc for _, kc in pairs), min(kc for _, kc in pairs) + 7)
        muls = [m << (k - kc) if kc <= k else max(1, round(r * 2.0 ** k)) for (m, kc), r in zip(pairs, real)]
        return k, np.array(muls, np.int64)

    def channel_steps(self, old: Node) -> np.ndarray | None:
        """Per-channel output steps of GEMM layer `old` (channel_scaled_outputs), from the
        per-channel range of the tensor whose scale it takes (its ReLU's, else its own)."""
        if old.name not in self.channel_out:
            return None
        us = self.users[id(old)]
        name = us[0].name if len(us) == 1 and us[0].op == "relu" else old.name
        a = self.cal.channel_absmax.get(name)
        if a is None or a.shape != (old.shape[1],):
            return None
        top = 2.0 ** -pow2_shift(float(a.max()))   # the tensor's own step: no channel is coarser
        steps = np.array([2.0 ** -pow2_shift(float(v)) if v > 0 else top for v in a])
        steps = np.clip(steps, top * 2.0 ** -CHANNEL_STEP_SPREAD, top)   # multipliers stay in range
        return None if np.all(steps == steps[0]) else steps

    # ---- per-op rules ------------------------------------------------------------------------
    def gemm(self, ins: list[Node], old: Node) -> Node:
        n = old
        x, sx, zx = self.as_int8(ins[0], old.inputs[0], n, channels=is_depthwise(old))
        wq, sw = self.weights(n)
        so, zo = self.out_qparams(old)
        steps = self.channel_steps(old) if not zo else None
        if steps is not None:   # a scale per output channel (its readers take one): per-channel multipliers
            so = steps
            if n.inputs[1].name not in self.weight_scales:   # so each output channel's weights at its own step
                wq, sw = self.channel_weights(n)
            sw = np.broadcast_to(np.asarray(sw, np.float64).reshape(-1), steps.shape)
        # after the weights are settled: a depthwise conv that both reads and writes a scale per
        # channel keeps its input's steps (channel_weights re-derives sw from the weights alone)
        if isinstance(sx, np.ndarray):   # one input channel per output channel: its step joins the weight's
            sw, sx = np.broadcast_to(np.asarray(sw, np.float64).reshape(-1), sx.shape) * sx, 1.0
        ratio_shift = None   # exact input or output steps: the weight step absorbs their ratio, this shift remains
        if (steps is None and not zx and not zo and not np.ndim(sw) and not np.ndim(sx) and not np.ndim(so)
                and n.inputs[1].name not in self.weight_scales
                and (pow2_exponent(float(sx)) is None or pow2_exponent(float(so)) is None)):
            absorbed = self.ratio_weights(n, float(sx), float(so))
            if absorbed is not None:
                wq, sw, ratio_shift = absorbed
        b = n.inputs[2].value.astype(np.float64) if len(n.inputs) == 3 else np.zeros(wq.shape[0])
        attrs = {k: v for k, v in n.attrs.items()}
        if zx and n.op == "conv2d" and any(attrs["pads"]):
            # the input's zero point is its real 0: pad with it explicitly (the conv's own padding is 0s)
            pt, pl, pb, pr = attrs["pads"]
            x = self.mark(Node("pad", [x], {"pads": (0, 0, pt, pl, 0, 0, pb, pr), "mode": "constant",
                                             "value": float(zx)}, name=f"{n.name}/pad_zero_point"), sx, zx)
            attrs["pads"] = (0, 0, 0, 0)
        if zo:
            attrs["out_zp"] = zo
        extra: list[Node] = []   # per-channel multipliers, the fourth input
        if sw.ndim:  # per output channel (a QDQ model's): one multiplier per channel, no rounding half in the bias
            s, muls = self.per_channel(n, sx, sw, so)
            half, mul, at_scale = 0, "per channel", "its per-channel scales"
            attrs.update(in_shift=s, w_shift=0, out_shift=0)
            extra.append(Node.const(muls, name=f"{n.name}/muls"))
        else:
            sw = float(sw)
            at_scale = f"scale {sx * sw:.6g}"
            kx, kw, ko = pow2_exponent(sx), pow2_exponent(sw), pow2_exponent(so)
            if ratio_shift is not None:   # sx sw / so = 2^-m by construction
                s, mul = ratio_shift, 1
                half = 1 << (s - 1) if s > 0 else 0
                attrs.update(in_shift=s, w_shift=0, out_shift=0)
            elif None not in (kx, kw, ko):
                s, mul = kx + kw - ko, 1
                if not SHR_RANGE[0] <= s <= SHR_RANGE[1]:
                    raise Unrepresentable(f"quantize: {n.op} '{n.name}': requantize shift {s} = in {kx} + weight {kw} - out {ko} "
                                        f"is outside the ALU's SHR range {list(SHR_RANGE)}")
                half = 1 << (s - 1) if s > 0 else 0  # rounding half rides on the bias
                attrs.update(in_shift=kx, w_shift=kw, out_shift=ko)
            else:  # fixed point: the shift is carried as in_shift (w_shift = out_shift = 0); SCALE rounds
                mul, s = _fixed(sx * sw / so, f"{n.op} '{n.name}'")
                half = 0
                attrs.update(in_shift=s, w_shift=0, out_shift=0, mul=mul)
        bq = np.rint(b / (sx * sw)) + half
        if zx:  # sum(w (x - zx)) = sum(w x) - zx sum(w): the input zero point's share, per output channel
            bq = bq - zx * wq.reshape(wq.shape[0], -1).astype(np.int64).sum(axis=1)
        if np.abs(bq).max(initial=0) >= 2 ** 31:
            raise Unrepresentable(f"quantize: {n.op} '{n.name}': bias does not fit int32 at {at_scale}")
        q = Node("q" + n.op, [x, Node.const(wq, name=f"{n.name}/wq"), Node.const(bq.astype(np.int32), name=f"{n.name}/bq"),
                              *extra], attrs, name=n.name, origin=n.origin)
        self.layers.append({"name": n.name, "op": q.op, "in_scale": float(np.max(sx)), "w_scale": float(np.max(sw)),
                            "out_scale": float(np.max(so)),
                            "shr": s, "mul": mul, "w_absmax": float(np.max(np.abs(n.inputs[1].value))),
                            "w_use": float(np.max(np.abs(wq))) / INT8_MAX, "in_zp": zx, "out_zp": zo})
        return self.mark(q, so, zo)

    def add(self, ins: list[Node], old: Node) -> Node:
        n = old
        (a, sa, za), (b, sb, zb) = (self.as_int8(i, o, n) for i, o in zip(ins, old.inputs))
        so, zo = self.out_qparams(old)
        if za or zb or zo:   # asymmetric operands: in float, as the QDQ model's arithmetic defines it
            return self.floating(ins, n)
        ka, kb, ko = pow2_exponent(sa), pow2_exponent(sb), pow2_exponent(so)
        if None not in (ka, kb, ko):
            attrs = {"a_shift": ka, "b_shift": kb, "out_shift": ko}
            shr = max(ka, kb) - ko
        else:
            _, shr = _fixed(max(sa, sb) / so, f"add '{n.name}'")   # the shift that fits the larger multiplier
            ma, mb = (max(1, round(r / so * 2.0 ** shr)) for r in (sa, sb))
            attrs = {"a_shift": 0, "b_shift": 0, "out_shift": shr, "a_mul": ma, "b_mul": mb}
        q = Node("qadd", [a, b], attrs, name=n.name, origin=n.origin)
        self.layers.append({"name": n.name, "op": "qadd", "in_scale": max(sa, sb), "w_scale": 1.0, "out_scale": so,
                            "shr": shr})
        return self.mark(q, so)

    def preserving(self, ins: list[Node], n: Node) -> Node:
        s, z = self.scale[id(ins[0])], self.zp.get(id(ins[0]), 0)
        t = self.model_scale(n.name) if n.op in CLAMPING else None
        zt = self.cal.zero_points.get(n.name, 0) if t is not None else z
        if (z or zt) and t is not None and (t, zt) != (s, z):
            return self.floating(ins, n)   # a clamp the model quantizes anew, asymmetric: as it does, in float
        attrs = dict(n.attrs)
        lo = int8_min(z)
        if n.op == "relu" and z:   # max(x, 0) at a zero point: the clamp at z
            n, attrs = Node("clip", n.inputs, {"min": 0.0, "max": None}, name=n.name, origin=n.origin), \
                {"min": 0.0, "max": None}
        if n.op == "clip":
            for key in ("min", "max"):
                if attrs[key] is not None:
                    attrs[key] = float(max(lo, min(INT8_MAX, round(attrs[key] / s) + z)))
        if n.op == "pad":
            attrs["value"] = float(np.clip(np.rint(attrs["value"] / s) + z, lo, INT8_MAX))
        out = n.with_inputs(ins, attrs=attrs)
        if t is None or t == s:
            return self.mark(out, s, z)
        # a QDQ model quantizes the clamp's output at a scale of its own: requantize as it does
        return self.mark(Node("requantize", [out], self.requant_attrs(s, t, f"{n.op} '{n.name}'"),
                              name=f"{n.name}/requantize"), t)

    def requant_attrs(self, s_in: float, s_out: float, what: str) -> dict:
        """requantize attrs taking int8 at scale s_in to s_out (shifts when both are powers of two)."""
        ki, ko = pow2_exponent(s_in), pow2_exponent(s_out)
        if ki is not None and ko is not None:
            return {"in_shift": ki, "out_shift": ko}
        mul, sh = _fixed(s_in / s_out, what)
        return {"in_shift": sh, "out_shift": 0, "mul": mul}

    def concat(self, ins: list[Node], n: Node) -> Node:
        if n.name in self.channel_concats and not any(self.zp.get(id(i), 0) for i in ins):
            # each input at its own scale: a scale per channel (one scalar when they all agree)
            ins = [self.as_int8(i, o, n, channels=True)[0] for i, o in zip(ins, n.inputs)]
            steps = np.concatenate([np.broadcast_to(np.asarray(self.scale[id(i)], np.float64).reshape(-1), (i.shape[1],))
                                    for i in ins])
            return self.mark(n.with_inputs(ins), float(steps[0]) if np.all(steps == steps[0]) else steps)
        if any(self.zp.get(id(i), 0) for i in ins):
            qp = {(self.scale[id(i)], self.zp.get(id(i), 0)) for i in ins}
            return self.mark(n.with_inputs(ins), *qp.pop()) if len(qp) == 1 else self.floating(ins, n)
        ins = [self.as_int8(i, o, n)[0] for i, o in zip(ins, n.inputs)]   # one scale per input
        s = max(self.scale[id(i)] for i in ins)  # the coarsest scale holds every input's range
        out = []
        for i in ins:
            si = self.scale[id(i)]
            if si == s:
                out.append(i)
                continue
            out.append(Node("requantize", [i], self.requant_attrs(si, s, f"concat '{n.name}'"),
                            name=f"{i.name}/requantize"))
        return self.mark(n.with_inputs(out), s)

    def affine_precise(self, ins: list[Node], old: Node) -> bool:
        """Whether an affine_as_depthwise conv loses at most AFFINE_BIAS_ERROR of an output step to
        its bias: the int32 bias counts steps of in_scale x |g_c| / 127 (the weight is +-127), so a
        channel whose gain is large against out_scale / in_scale rounds its shift coarsely, an
        error a deep stack of such layers (DenseNet's) compounds; those stay float."""
        try:
            sx = self.scale[id(ins[0])] if id(ins[0]) in self.scale else self.qparams_for(old.inputs[0], "")[0]
            sx = sx if isinstance(sx, np.ndarray) and is_depthwise(old) else float(np.max(sx))
            so = self.out_qparams(old)[0]
        except QuantizeError:
            return False
        if old.inputs[1].shape[2:] != (1, 1):
            return True    # an average pool: its bias is 0
        sw = np.asarray(self.weight_scales[old.inputs[1].name], np.float64).reshape(-1)
        return float(np.max(sx * sw / so)) / 2 <= AFFINE_BIAS_ERROR

    def affine_float(self, ins: list[Node], old: Node) -> Node:
        """An affine_as_depthwise conv back in float: x * g + beta (average pools: the conv)."""
        if old.inputs[1].shape[2:] != (1, 1):
            return self.floating(ins, old)
        x, ch = self.as_float(ins[0]), old.shape[1]
        mul = Node("mul", [x, Node.const(old.inputs[1].value.reshape(1, ch, 1, 1), name=f"{old.name}/g")],
                   name=f"{old.name}/mul", origin=old.origin)
        return Node("add", [mul, Node.const(old.inputs[2].value.reshape(1, ch, 1, 1), name=f"{old.name}/beta")],
                    name=old.name, origin=old.origin)

    def node(self, old: Node, ins: list[Node]) -> Node:
        """The replacement of `old` given its inputs' replacements."""
        n = old
        if n.op in ("input", "const"):
            return n
        if any(self.channel_scaled(i) for i in ins) and n.op not in CHANNEL_OPS and not is_depthwise(old):
            return self.floating(ins, n)   # only these read a scale per channel
        if n.op in ("conv2d", "dense") and n.inputs[1].is_const and all(i.is_const for i in n.inputs[2:]) \
                and n.dtype == "float32" and self.has_scales(old, ins):
            if old.inputs[1].name in self.affine and not self.affine_precise(ins, old):
                return self.affine_float(ins, old)
            try:
                return self.gemm(ins, old)
            except Unrepresentable as e:
                if old.inputs[1].name in self.affine:
                    return self.affine_float(ins, old)   # an affine whose bias does not fit int32 at its scale
                # a layer its scales cannot carry in int8 (a bias beyond int32 at a tiny input step, a
                # shift beyond the ALU's): the rest of the model still quantizes
                log.warning("%s; it is computed in float on the host", e)
                return self.floating(ins, old)
        if n.op == "add" and not any(i.is_const for i in ins) and any(id(i) in self.scale for i in ins):
            return self.add(ins, old)
        if n.op in SCALE_PRESERVING and id(ins[0]) in self.scale and (n.op != "pad" or n.attrs["mode"] == "constant"):
            return self.preserving(ins, n)
        if n.op == "concat" and (all(id(i) in self.scale for i in ins) or n.name in self.channel_concats):
            return self.concat(ins, n)
        return self.floating(ins, n)


def _channel_const(n: Node, channels: int) -> np.ndarray | None:
    """The per-channel values of a constant broadcast over axis 1 of an N C H W tensor, else None."""
    if not n.is_const or n.value.size != channels or n.value.ndim > 4:
        return None
    shape = (1,) * (4 - n.value.ndim) + n.value.shape
    return n.value.reshape(-1).astype(np.float64) if shape[1] == channels else None


def affine_as_depthwise(graph: Graph, pools: bool = True, affines: bool = True) -> tuple[Graph, dict[str, np.ndarray]]:
    """A per-channel multiply (+ per-channel add) of an N C H W tensor, as fold_batchnorm leaves a
    batch norm it cannot fold (pre-activation after a concat), becomes a 1x1 depthwise conv2d so
    that it quantizes as a GEMM layer: int8 in and out, per-channel weights at +-127 and fixed-point
    multipliers (SCALE on the accelerator, a ReLU after it fused as the clamp) instead of float
    arithmetic between dequantize and quantize. An average pool whose windows all divide by the
    same count (global ones included) becomes a depthwise conv with weights 1/count likewise.
    Returns the graph and the weights' per-channel scales (shaped C 1 1 1, for _Quantizer.weights)."""
    users = graph.users()
    scales: dict[str, np.ndarray] = {}
    made: dict[int, tuple] = {}   # id(conv made here) -> (its input, g, beta, the node it replaced)

    def affine(mul: Node):
        """(index of x, g) of a per-channel multiply x * g, else None."""
        if mul.op != "mul" or mul.dtype != "float32":
            return None
        for k in (0, 1):
            x, c = mul.inputs[k], mul.inputs[1 - k]
            if not x.is_const and x.type.rank == 4 and x.shape == mul.shape:
                g = _channel_const(c, x.shape[1])
                if g is not None:
                    return k, g
        return None

    def with_add(add: Node):
        """(index of the multiply, its affine(), beta) of a per-channel add after a sole-use multiply."""
        if add.op != "add" or any(add is o for o in graph.outputs):
            return None
        for k in (0, 1):
            m, c = add.inputs[k], add.inputs[1 - k]
            a = affine(m)
            if a is not None and len(users[id(m)]) == 1 and m.shape == add.shape:
                beta = _channel_const(c, m.shape[1])
                if beta is not None:
                    return k, a, beta
        return None

    def fn(n: Node, old: Node):
        if old.op in ("avg_pool2d", "global_avg_pool"):
            return pool(n, old) if pools else None
        if not affines:
            return None
        found = with_add(old)
        if found is not None:
            k, (xk, g), beta = found
            x = n.inputs[k].inputs[xk]
        else:
            a = affine(old)
            if a is None or (len(users[id(old)]) == 1 and with_add(users[id(old)][0]) is not None):
                return None   # not an affine, or the add after it takes it
            (xk, g), beta = a, np.zeros(old.shape[1])
            x = n.inputs[xk]
        prev = made.get(id(x))
        if prev is not None and len(users[id(prev[3])]) == 1:   # affine of an affine: one conv, one rounding
            x, g, beta = prev[0], prev[1] * g, prev[2] * g + beta
        ch = x.shape[1]
        w = Node.const(g.reshape(ch, 1, 1, 1).astype(np.float32), name=f"{old.name}/affine_w")
        scales[w.name] = np.where(g != 0, np.abs(g) / INT8_MAX, 1.0).reshape(ch, 1, 1, 1)
        b = Node.const(beta.astype(np.float32), name=f"{old.name}/affine_b")
        conv = Node("conv2d", [x, w, b], {"groups": ch}, name=old.name, origin=old.origin)
        made[id(conv)] = (x, g, beta, old)
        return conv
    def pool(n: Node, old: Node):
        """An average pool with one divisor for every window: a depthwise conv with weights 1/k."""
        x = n.inputs[0]
        if x.type.rank != 4 or old.dtype != "float32":
            return None
        ch, h, w = x.shape[1:]
        if old.op == "global_avg_pool":
            attrs, (kh, kw) = {}, (h, w)
        else:
            a = old.attrs
            (kh, kw), pads = a["kernel"], tuple(a["pads"])
            oh, ow = old.shape[2:]
            spans = ((oh - 1) * a["strides"][0] + kh, (ow - 1) * a["strides"][1] + kw)
            if (any(pads) and not a["count_include_pad"]) or spans[0] > h + pads[0] + pads[2] \
                    or spans[1] > w + pads[1] + pads[3]:
                return None   # windows with fewer elements divide by less
            attrs = {"strides": tuple(a["strides"]), "pads": pads}
        wt = Node.const(np.full((ch, 1, kh, kw), 1.0 / (kh * kw), np.float32), name=f"{old.name}/avg_w")
        scales[wt.name] = np.full((ch, 1, 1, 1), 1.0 / (kh * kw) / INT8_MAX)
        b = Node.const(np.zeros(ch, np.float32), name=f"{old.name}/avg_b")
        return Node("conv2d", [x, wt, b], {**attrs, "groups": ch}, name=old.name, origin=old.origin)
    return eliminate_dead_code(rewrite(graph, fn)), scales


def is_depthwise(n: Node) -> bool:
    """A float conv2d with constant weights, one group per channel and as many outputs as inputs
    (an affine or average pool of affine_as_depthwise, or the model's own): each output channel
    reads one input channel, so its per-channel multipliers can absorb a per-channel input scale."""
    return (n.op == "conv2d" and n.dtype == "float32" and n.inputs[1].is_const and n.inputs[0].type.rank == 4
            and n.attrs.get("groups", 1) == n.inputs[0].shape[1] == n.shape[1] and n.inputs[1].shape[1] == 1)


def channel_scaled_concats(graph: Graph, cal: Calibration) -> set[str]:
    """Names of the channel concats whose inputs keep their own scales (the concat's int8 carries a
    scale per channel): those read only by depthwise convs (as input 0) and by other such concats,
    none a graph output, none holding a QDQ model's scale (its concat requantizes as the model
    says). Their producers write their own int8 straight into their slice; no input is rounded to
    the coarsest one's step."""
    users = graph.users()
    cands = {id(n): n for n in graph.nodes if n.op == "concat" and n.dtype == "float32" and n.type.rank == 4
             and n.attrs.get("axis") in (1, -3) and cal.source.get(n.name) != "qdq"
             and not any(cal.source.get(i.name) == "qdq" for i in n.inputs)
             and not any(n is o for o in graph.outputs)}
    changed = True
    while changed:
        changed = False
        for k, n in list(cands.items()):
            ok = all((u.op == "concat" and id(u) in cands) or (is_depthwise(u) and u.inputs[0] is n
                                                             and all(i is not n for i in u.inputs[1:]))
                     for u in users[id(n)])
            if not ok or not users[id(n)]:
                del cands[k]
                changed = True
    return {n.name for n in cands.values()}


def channel_scaled_outputs(graph: Graph, cal: Calibration, concats: set[str]) -> set[str]:
    """Names of the conv layers whose int8 result may carry a scale per output channel (each from
    its channel's calibrated range): those whose readers, through ReLUs and max pools, are only
    channel_scaled_concats concats and depthwise convs, which absorb such scales. A DenseNet
    layer's new channels then keep their own precision into every later batch norm, whose gain
    would amplify a channel quantized at the tensor's coarsest step."""
    users = graph.users()
    outputs = {id(o) for o in graph.outputs}
    memo: dict[int, bool] = {}

    def takes_channels(t: Node) -> bool:
        if id(t) not in memo:
            memo[id(t)] = bool(users[id(t)]) and id(t) not in outputs and all(
                (u.op == "concat" and u.name in concats)
                or (is_depthwise(u) and u.inputs[0] is t and all(i is not t for i in u.inputs[1:]))
                or (u.op in ("relu", "max_pool2d") and takes_channels(u)) for u in users[id(t)])
        return memo[id(t)]
    return {n.name for n in graph.nodes
            if n.op == "conv2d" and n.dtype == "float32" and n.inputs[1].is_const and n.type.rank == 4
            and n.name in cal.channel_absmax and cal.source.get(n.name) != "qdq" and takes_channels(n)}


def shared_concat_shifts(graph: Graph, cal: Calibration, keep: set[str] = frozenset()) -> Calibration:
    """Calibrated concat inputs take the concat's coarsest shift (as TFLite shares a concat's
    quantization), so that their producers write the concat's scale directly: no requantize
    between, and the accelerator build can place them inside the concat's buffer (plan_memory).
    Nested concats settle to one shift. A QDQ model's own scales are kept, as are the inputs of
    the concats in `keep` (channel_scaled_concats: each input at its own scale)."""
    shifts = dict(cal.shifts)
    concats = [n for n in graph.nodes if n.op == "concat" and n.name in shifts and cal.source.get(n.name) != "qdq"
               and n.name not in keep]
    changed = True
    while changed:
        changed = False
        for n in concats:
            names = [n.name] + [i.name for i in n.inputs if not i.is_const]
            if any(k not in shifts or cal.source.get(k) == "qdq" for k in names):
                continue
            k = min(shifts[m] for m in names)
            for m in names:
                if shifts[m] != k:
                    shifts[m], changed = k, True
    return replace(cal, shifts=shifts) if shifts != cal.shifts else cal


def exact_steps(graph: Graph, cal: Calibration) -> Calibration:
    """cal with each calibrated tensor that no int8 add or concat ties to another at its exact
    step, max |x| / 127 (Calibration.scales). Ties run through the ops that keep their input's
    scale (relu, clip, pooling, reshape...), both ways: a conv whose ReLU feeds a residual add is
    tied too. Steps finer than 2^-SHIFT_RANGE[1] or coarser than 2^-SHIFT_RANGE[0] stay shifts."""
    tied: set[int] = set()
    for n in graph.nodes:
        if (n.op == "add" and not any(i.is_const for i in n.inputs)) or n.op == "concat":
            tied.update(id(m) for m in (n, *n.inputs) if not m.is_const)
    users = graph.users()
    keeps = set(SCALE_PRESERVING) | set(RANGE_PRESERVING) | set(CLAMPING)
    todo = [n for n in graph.nodes if id(n) in tied]
    while todo:
        n = todo.pop()
        near = ([n.inputs[0]] if n.op in keeps and n.inputs else []) + [u for u in users[id(n)] if u.op in keeps]
        for m in near:
            if id(m) not in tied and not m.is_const:
                tied.add(id(m))
                todo.append(m)
    lo, hi = 2.0 ** -SHIFT_RANGE[1], 2.0 ** -SHIFT_RANGE[0]
    scales = dict(cal.scales)
    for n in graph.nodes:
        a = cal.absmax.get(n.name)
        if id(n) in tied or cal.source.get(n.name) != "calibration" or a is None or not math.isfinite(a):
            continue
        if lo <= a / INT8_MAX <= hi:
            scales[n.name] = a / INT8_MAX
    return replace(cal, scales=scales)


def quantize(graph: Graph, calibration: Calibration) -> Graph:
    """Rewrite the float graph into shift-quantized int8 ops (see module doc)."""
    graph, affine_scales = affine_as_depthwise(graph, affines=INT8_AFFINES)
    channel_concats = channel_scaled_concats(graph, calibration)
    calibration = shared_concat_shifts(graph, calibration, channel_concats)
    if EXACT_STEPS:
        calibration = exact_steps(graph, calibration)
    qz = _Quantizer(graph, calibration)
    qz.channel_concats = channel_concats
    qz.channel_out = channel_scaled_outputs(graph, calibration, channel_concats) if CHANNEL_OUTPUTS else set()
    qz.weight_scales = {**qz.weight_scales, **affine_scales}
    qz.affine = set(affine_scales)
    mapping: dict[int, Node] = {}
    nodes: list[Node] = []
    placed: set[int] = set()

    def place(n: Node):
        for i in n.inputs:
            if id(i) not in placed:
                place(i)
        if id(n) not in placed:
            placed.add(id(n))
            nodes.append(n)

    for old in graph.nodes:
        new = qz.node(old, [mapping[id(i)] for i in old.inputs])
        mapping[id(old)] = new
        place(new)
    outputs = []
    for o in graph.outputs:
        new = mapping[id(o)]
        if id(new) not in qz.scale and not new.is_const and qz.model_scale(o.name) is not None:
            # a float result the model rounds before it dequantizes its output (a softmax at the end)
            new = qz.as_int8(new, o, o)[0]
        f = qz.as_float(new)
        place(f)
        outputs.append(f)
    meta = {**graph.meta, "quantize": {"layers": qz.layers, "calibration": calibration}}
    return Graph(nodes, graph.inputs, outputs, graph.output_names, graph.name, meta)
