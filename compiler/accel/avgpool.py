"""Average pools whose divisor varies at the borders, in int8 on the accelerator's tensor ALU.

An AveragePool with pads and count_include_pad=0, or with ceil_mode windows that overhang the
input, divides its border windows by fewer taps than its interior ones, so it is no depthwise conv
with one weight (compiler.graph.passes.quantize.affine_as_depthwise leaves it float, between a
dequantize and a quantize). `int8_avg_pools` turns that dequantize -> avg_pool2d -> quantize chain
(or, where the pool's consumers stay float, the pool alone, at its calibrated scale, then a
dequantize) into the int8 op `qavg_pool2d`, declared here with its reference semantics (g_c: the
channel's gain, 1 unless `gains` gives one per channel, for inputs with a scale per channel, in_zp 0):

    acc[p] = sum over the window of g_c (x - in_zp), taps outside the input adding 0 (int32)
    y[p]   = clamp(((acc[p] * M[cnt(p)] + 2^(k-1)) >> k) + out_zp)                  (int8)

cnt(p) is the window's divisor (taps inside the input, or inside input and explicit pads with
count_include_pad=1; it is rows(p) x cols(p), so positions group into rectangles: interior, edges,
corners) and M[c] = round(ratio 2^k / c) with ratio = in_scale / out_scale; k is the largest shift
(<= 15) that keeps every M in the ALU's signed 16-bit immediate and acc x M inside int32.

On the accelerator (emit_avg_pool) the sum is max pooling's scheme (compiler.accel.pool) with ADD
for MAX: input rows reach the accumulator by an identity GEMM into a window region pre-filled with
in_zp, one ALU MOV takes each window's first tap and one ALU ADD the others; then one ALU MUL per
rectangle of equal divisor (immediate M), and the rounding shift and clamp (with a fused ReLU/clip)
as one FLUSH, or where FLUSH cannot say the clamp or there is an output zero point, ADD 2^(k-1),
SHR k, ADD out_zp and CLAMP. Bit-exact with the reference; run_avg_pool runs it on a device for tests.

Uniform pools (global, or without border windows) the quantizer makes int8 depthwise convs with one
weight (affine_as_depthwise); the diagonal GEMM loads a weight tile per tap and reuses it only over
the outputs, so a global pool costs ~36 cycles per tap and channel block there against ~2 here.
With a config, int8_avg_pools turns such a qconv2d (uniform_pool) into qavg_pool2d where the ALU
program's estimate (avg_pool_cycles) beats the conv's (compiler.accel.depthwise_cost): global pools,
not 3x3/1 or 2x2/2 pools over large planes, which reuse each weight tile over many outputs.
"""
from __future__ import annotations

import math
from itertools import groupby

import numpy as np

from accel.isa import AccelConfig, AluOp, operands
from accel.isa.widths import LOOP_ITER_BITS
from sim.dram import DramModel

from ..graph.ir import Graph, Node, TensorType, rewrite
from ..graph.ops import (
    POOL_ATTRS,
    REQUIRED,
    Attr,
    Pattern,
    declare,
    fail,
    get_op,
    int8_min,
    is_fixed_point,
    one_of,
    pool_out_hw,
    requant_shift,
)
from .depthwise_cost import accel_depthwise_cycles
from .eltwise import identity_weights
from .grouped import group_spec, grouped_layout
from .plan import plan_conv2d
from .pool import PoolSpec, PoolTiling, check_square_blocks, emit_window_tiles, plan_pool, run_pool, walk
from .spec import Conv2dSpec, TilingError

#: the largest rounding shift: ADD 2^(k-1) must fit the ALU's signed 16-bit immediate
MAX_SHIFT = 15
#: the largest multiplier: MUL's signed 16-bit immediate
MAX_MUL = (1 << 15) - 1
IMM_MAX = (1 << 15) - 1


# ---- the arithmetic (shared by the reference and the emitter, so they cannot drift) -----------------
def divisor_counts(hw, attrs) -> tuple[np.ndarray, np.ndarray]:
    """(rows per output row, columns per output column) each window divides by: the taps inside
    the input, or inside the input and its explicit pads with count_include_pad (never ceil_mode's
    overhang, as ONNX and the float avg_pool2d count)."""
    out = pool_out_hw(None, hw, attrs)
    counts = []
    for k in range(2):
        lo, hi = (-attrs["pads"][k], hw[k] + attrs["pads"][k + 2]) if attrs["count_include_pad"] else (0, hw[k])
        s, kk = attrs["strides"][k], attrs["kernel"][k]
        start = np.arange(out[k]) * s - attrs["pads"][k]
        counts.append(np.maximum(0, np.minimum(start + kk, hi) - np.maximum(start, lo)).astype(np.int64))
    return counts[0], counts[1]


def avg_multipliers(ratio: float, counts, taps: int, in_zp: int = 0, acc_bits: int = 32) -> tuple[int, dict[int, int]]:
    """(k, {divisor: M}) with M ~ ratio 2^k / divisor: the finest shift <= MAX_SHIFT whose
    multipliers fit MUL's immediate and whose products (|acc| <= (128 + |in_zp|) taps) and rounding
    half stay inside acc_bits signed bits. ValueError when not even k = 0 fits."""
    if not (ratio > 0 and math.isfinite(ratio)):
        raise ValueError(f"scale ratio {ratio} must be positive and finite")
    divs = sorted({int(c) for c in counts if c > 0})
    if not divs:
        raise ValueError("no window has a tap inside the input")
    bound = (128 + abs(in_zp)) * taps
    for k in range(MAX_SHIFT, -1, -1):
        muls = {c: int(round(ratio * 2.0 ** k / c)) for c in divs}
        top = max(muls.values())
        if top <= MAX_MUL and bound * top + (1 << k >> 1) < 1 << (acc_bits - 1):
            return k, muls
    raise ValueError(f"scale ratio {ratio:.6g} over a {taps}-tap window does not fit a 16-bit multiplier "
                     f"in {acc_bits}-bit accumulators")


def _max_gain(a: dict) -> int:
    return max(a.get("gains") or (1,))


def _attrs_hw(a: dict, hw) -> tuple[int, dict[int, int], np.ndarray]:
    """(k, multipliers, the divisor of every output position) of a qavg_pool2d over an hw input."""
    cy, cx = divisor_counts(hw, a)
    grid = np.outer(cy, cx)
    k, muls = avg_multipliers(a["ratio"], grid.reshape(-1), a["kernel"][0] * a["kernel"][1] * _max_gain(a),
                              a["in_zp"])
    return k, muls, grid


def qavg_pool2d_ref(a: dict, x: np.ndarray) -> np.ndarray:
    """The int8 semantics of qavg_pool2d (module doc), on N C H W or the packed N' C' H W n c."""
    if x.ndim == 6 and a.get("gains"):   # packed, gains per channel: through NCHW
        n_, c_, h_, w_, bn, bc = x.shape
        flat = x.transpose(0, 4, 1, 5, 2, 3).reshape(n_ * bn, c_ * bc, h_, w_)
        g = np.ones(c_ * bc, np.int64)
        g[:len(a["gains"])] = a["gains"]
        y = qavg_pool2d_ref({**a, "gains": tuple(int(v) for v in g)}, flat)
        return y.reshape(n_, bn, c_, bc, *y.shape[2:]).transpose(0, 2, 4, 5, 1, 3)
    if x.ndim == 6:   # packed: the blocks' lanes as channels
        p = x.transpose(0, 1, 4, 5, 2, 3)
        y = qavg_pool2d_ref(a, p.reshape(p.shape[0] * p.shape[1], -1, *p.shape[4:]))
        return y.reshape(*p.shape[:4], *y.shape[2:]).transpose(0, 1, 4, 5, 2, 3)
    hw = x.shape[2:]
    oh, ow = pool_out_hw(None, hw, a)
    (kh, kw), (sh, sw), (pt, pl, _, _) = a["kernel"], a["strides"], a["pads"]
    k, muls, grid = _attrs_hw(a, hw)
    eh, ew = (oh - 1) * sh + kh, (ow - 1) * sw + kw
    xp = np.zeros(x.shape[:2] + (eh, ew), np.int64)
    rows, cols = min(hw[0], eh - pt), min(hw[1], ew - pl)
    xp[:, :, pt:pt + rows, pl:pl + cols] = x[:, :, :rows, :cols].astype(np.int64) - a["in_zp"]
    if a.get("gains"):
        xp *= np.asarray(a["gains"], np.int64).reshape(1, -1, 1, 1)
    acc = np.zeros(x.shape[:2] + (oh, ow), np.int64)
    for dy in range(kh):
        for dx in range(kw):
            acc += xp[:, :, dy:dy + (oh - 1) * sh + 1:sh, dx:dx + (ow - 1) * sw + 1:sw]
    m = np.vectorize(muls.__getitem__, otypes=[np.int64])(grid)
    y = (acc * m + (1 << k >> 1)) >> k
    return np.clip(y + a["out_zp"], int8_min(a["out_zp"]), 127).astype(np.int8)


def _infer(n: Node) -> TensorType:
    x = n.inputs[0].type
    if x.dtype != "int8":
        fail(n, f"expects an int8 input, got {x.dtype}")
    gains = n.attrs.get("gains") or ()
    if gains and x.rank in (4, 6) and not (
            len(gains) == x.shape[1] if x.rank == 4 else (x.shape[1] - 1) * x.shape[5] < len(gains) <= x.shape[1] * x.shape[5]):
        fail(n, f"gains: {len(gains)} values for the input's channels ({x})")
    if gains and n.attrs.get("in_zp"):
        fail(n, f"gains need in_zp 0 (the program offsets the window sums by one immediate), got {n.attrs['in_zp']}")
    if x.rank == 6:
        return TensorType((*x.shape[:2], *pool_out_hw(n, x.shape[2:4], n.attrs), *x.shape[4:]), "int8")
    if x.rank != 4:
        fail(n, f"expects an NCHW or packed input, got {x}")
    return TensorType((*x.shape[:2], *pool_out_hw(n, x.shape[2:], n.attrs)), "int8")


def _zp() -> Attr:
    return Attr(0, "an int8 zero point in [-128, 127]", lambda v: isinstance(v, int) and -128 <= v <= 127)


declare("qavg_pool2d", Pattern.OUT_ELEMWISE_FUSABLE, 1,
        {**POOL_ATTRS, "count_include_pad": one_of(0, 0, 1),
         "ratio": Attr(REQUIRED, "a positive finite float (in_scale / out_scale)",
                       lambda v: float(v) > 0 and math.isfinite(float(v))),
         "in_zp": _zp(), "out_zp": _zp(),
         "gains": Attr((), "one int in [1, 127] per channel (empty: all 1)",
                       lambda v: isinstance(v, (tuple, list)) and all(isinstance(g, int) and 1 <= g <= 127 for g in v))},
        infer=_infer, reference=qavg_pool2d_ref,
        doc="int8 average pooling with per-position divisors (border windows): window sum, a fixed-point "
            "multiply per divisor, rounding shift (compiler.accel.avgpool)")


# ---- the graph rewrite -----------------------------------------------------------------------------
def _qparams(n: Node) -> tuple[float, int]:
    a = n.attrs
    return (float(a["scale"]) if a["scale"] else 2.0 ** -a["shift"]), int(a["zero_point"])


def _dequantize_attrs(scale: float, zero_point: int) -> dict:
    m, e = math.frexp(scale)
    attrs = {"shift": 1 - e} if m == 0.5 else {"scale": scale}
    return {**attrs, "zero_point": zero_point} if zero_point else attrs


def int8_avg_pools(graph: Graph, cfg: AccelConfig | None = None) -> Graph:
    """dequantize -> avg_pool2d -> quantize (an average pool the quantizer left in float: its
    divisors vary) becomes one int8 qavg_pool2d, so the accelerator can take it (and the host
    skips a float round trip), likewise with a ReLU or clip before the quantize (int8 after the pool,
    fused into its program). A pool of dequantized int8 whose consumers stay float (a concat with
    other float inputs, ShuffleNet's) becomes qavg_pool2d at the pool's calibrated scale and a
    dequantize: the window sums leave the host, a rounding to that scale is the price. Pools on
    float tensors stay; with a cfg, so do those the accelerator would decline (the host's float
    kernel beats the int8 op's NumPy reference). With a cfg, a uniform pool's window-sum qconv2d
    (uniform_pool) becomes qavg_pool2d where its ALU program is estimated cheaper. The replaced
    nodes stay in the graph: run eliminate_dead_code after it."""
    users = graph.users()
    cal = graph.meta.get("quantize", {}).get("calibration")

    def qpool(pool: Node, so: float, zo: int) -> Node | None:
        deq = pool.inputs[0]
        if deq.op != "dequantize" or deq.inputs[0].dtype != "int8" or deq.type.rank != 4 or not so > 0:
            return None
        sx, zx = _qparams(deq)
        a = dict(pool.attrs)
        a.update(ratio=sx / so, in_zp=zx, out_zp=zo)
        try:
            _attrs_hw({**get_op("avg_pool2d").normalize(pool.attrs), **a}, deq.shape[2:])
        except ValueError:
            return None   # a scale ratio no 16-bit multiplier holds: stays float
        q = Node("qavg_pool2d", [deq.inputs[0]], a, name=pool.name, origin=pool.origin)
        return q if cfg is None or check_avg_pool(q, cfg) is None else None

    def quantized(old: Node) -> bool:
        """Whether every reader of `old` quantizes it, directly or after a ReLU/clip (rules 1, 2)."""
        return all(u.op == "quantize" or (u.op in ("relu", "clip") and users[id(u)]
                                          and all(v.op == "quantize" for v in users[id(u)])) for u in users[id(old)])

    def fn(n: Node, old: Node):
        if n.op == "qconv2d":   # a uniform pool the quantizer made a depthwise conv: the ALU where cheaper
            q = uniform_pool(n) if cfg is not None else None
            if q is None or check_avg_pool(q, cfg) is not None:
                return None
            conv = _conv_cycles(old, cfg)
            return q if conv is not None and avg_pool_cycles(q, cfg) < conv else None
        if n.op == "quantize" and n.inputs[0].op == "avg_pool2d":
            return qpool(n.inputs[0], *_qparams(n))
        if n.op == "quantize" and n.inputs[0].op in ("relu", "clip") and n.inputs[0].inputs[0].op == "avg_pool2d":
            c = n.inputs[0]    # a ReLU/clip between: int8 at the quantize's scale (the accelerator fuses it)
            so, zo = _qparams(n)
            q = None if zo else qpool(c.inputs[0], so, 0)
            if q is None:
                return None
            attrs = {} if c.op == "relu" else {k: None if c.attrs[k] is None else
                                               float(max(-127, min(127, round(c.attrs[k] / so)))) for k in ("min", "max")}
            return Node(c.op, [q], attrs, name=c.name, origin=c.origin)
        if n.op != "avg_pool2d" or cal is None or quantized(old):
            return None   # (a pool that only quantizes: the rules above, at its consumers' scale)
        so = cal.scale(old.name)
        if so is None:
            return None
        zo = cal.zero_points.get(old.name, 0)
        q = qpool(n, so, zo)
        return None if q is None else Node("dequantize", [q], _dequantize_attrs(so, zo), name=f"{old.name}/dequantize")
    return rewrite(graph, fn)


# ---- uniform pools: the quantizer's window-sum depthwise convs -------------------------------------
def _same(v: np.ndarray) -> bool:
    return v.size > 0 and bool(np.all(v == v.flat[0]))


def uniform_pool(conv: Node) -> Node | None:
    """The qavg_pool2d equal to `conv` up to the rounding of one multiplier, where conv is a window
    sum: an int8 NCHW depthwise qconv2d with one weight for every channel and tap, one bias, one
    multiplier (what compiler.graph.passes.quantize.affine_as_depthwise makes of a global or
    border-free average pool), else None. Its bias is the rounding half less the input zero
    point's share, which gives in_zp; a zero-point pad before it (the quantizer's) folds into the
    pool's pads, which count (count_include_pad=1: the conv's windows never overhang)."""
    a = conv.attrs
    if conv.op != "qconv2d" or a.get("layout", "NCHW") != "NCHW" or any(d != 1 for d in a.get("dilations", (1, 1))):
        return None
    x, w, b = conv.inputs[:3]
    if x.type.rank != 4 or x.dtype != "int8" or not (w.is_const and b.is_const) or w.value.ndim != 4:
        return None
    ch, (kh, kw) = x.shape[1], w.shape[2:]
    if not (a.get("groups", 1) == ch == conv.shape[1] == w.shape[0] and w.shape[1] == 1):
        return None
    wv, bv = w.value.astype(np.int64), b.value.astype(np.int64)
    if not (_same(wv) and _same(bv)) or wv.flat[0] <= 0:
        return None
    s, taps, wv, b0 = requant_shift(a), kh * kw, int(wv.flat[0]), int(bv.flat[0])
    gains: tuple[int, ...] = ()
    if len(conv.inputs) == 4:   # per-channel multipliers (no rounding half in the bias): integer gains
        m = conv.inputs[3]      # of the smallest, as a per-channel input scale in powers of two makes them
        if not m.is_const or m.value.shape != (ch,) or np.any(m.value <= 0):
            return None
        mv = m.value.astype(np.int64)
        mul, half = int(mv.min()), 0
        if not _same(mv):
            if np.any(mv % mul) or (mv // mul).max() > 127:
                return None   # not integer multiples of the smallest, or too far apart for int8 gains
            gains = tuple(int(v) for v in mv // mul)
    else:
        mul = int(a.get("mul", 1))
        half = 0 if is_fixed_point(a) or s <= 0 else 1 << (s - 1)
    zx, rem = divmod(half - b0, wv * taps)
    if rem or not -128 <= zx <= 127 or (gains and zx):
        return None
    pads = tuple(a["pads"])
    if x.op == "pad" and x.attrs.get("mode") == "constant" and x.attrs.get("value", 0) == zx:
        p = tuple(x.attrs["pads"])   # (N, C, H, W begins, then ends): only the spatial ones fold
        if len(p) == 8 and not any(p[i] for i in (0, 1, 4, 5)) and min(p) >= 0:
            pads = (pads[0] + p[2], pads[1] + p[3], pads[2] + p[6], pads[3] + p[7])
            x = x.inputs[0]
    attrs = qavg_attrs((kh, kw), tuple(a["strides"]), pads, 0, 1, mul * 2.0 ** -s * wv * taps, zx,
                       int(a.get("out_zp", 0)), gains)
    try:
        _attrs_hw(attrs, x.shape[2:])
    except ValueError:
        return None   # a scale ratio no 16-bit multiplier holds: stays a conv
    return Node("qavg_pool2d", [x], attrs, name=conv.name, origin=conv.origin)


def _conv_cycles(conv: Node, cfg: AccelConfig) -> float | None:
    """The diagonal-GEMM lowering's cycle estimate (depthwise_cost.accel_depthwise_cycles) where
    it tiles; None where it does not: that conv runs on the CPU, and stays there (its int8 kernel
    sums a pool the conv's tiles cannot hold, e.g. SqueezeNet's 13x13 global, in fewer host
    microseconds than the ALU program's cycles take)."""
    x, w = conv.inputs[0].shape, conv.inputs[1].shape
    spec = Conv2dSpec.from_attrs(x[0], x[1], x[2], x[3], conv.shape[1], w[2], w[3], conv.attrs, conv.name)
    groups = conv.attrs["groups"]
    k = grouped_layout(groups, spec.c, spec.o, cfg.block_in, cfg.block_out)[0]
    try:
        plan_conv2d(group_spec(spec, -(-groups // k), cfg.batch) if k < groups else spec, cfg, 2, False)
    except (TilingError, ValueError):
        return None
    return accel_depthwise_cycles(conv, cfg)


#: tsim cycles per micro-op of the pool program (its ALU and GEMM passes, one entry each) and per
#: tile (instructions, token waits), fitted to run_avg_pool on tsim (default and tiny presets)
UOP_CYCLES = 1.1
TILE_CYCLES = 60


def avg_pool_cycles(n: Node, cfg: AccelConfig) -> float:
    """Estimated cycles of emit_avg_pool for qavg_pool2d n (check_avg_pool must accept it), tile
    by tile as plan.estimate_cycles counts a conv: the load of the tile's input rows, its compute
    (the zero-point fill of padded tiles, the identity GEMM's reset and copy, one MOV or ADD per
    window tap, per output the offset, multiply and rounding) and the store of its outputs; the
    stages of consecutive tiles overlap, the first load and the last store do not."""
    a, x = n.attrs, n.inputs[0].shape
    spec = avg_pool_spec(n, (-(-x[0] // cfg.batch), -(-x[1] // cfg.block_out), x[2], x[3]))
    t = plan_pool(spec, cfg)
    k, _, _ = _attrs_hw(a, (spec.h, spec.w))
    (oh, ow), (kh, kw) = spec.out_hw, spec.kernel
    wp, pt, pl = spec.padded_w, spec.pads[0], spec.pads[1]
    cols = min(spec.w, wp - pl)
    imm = -(-abs(a["in_zp"] * kh * kw) // IMM_MAX)
    per_out = imm + 1 + (1 if _flush_form(k, a["out_zp"], int8_min(a["out_zp"]), 127) is not None
                         else 2 * (k > 0) + -(-abs(a["out_zp"]) // IMM_MAX) + 1)
    dram, bus, burst = DramModel(), cfg.bus_bytes, cfg.max_burst_beats * cfg.bus_bytes

    def move(rows: int, row_bytes: int, latency: int) -> float:
        return rows * row_bytes / bus + rows * -(-row_bytes // burst) + latency + 1
    total, first, last = 0.0, None, 0.0
    for p0 in range(0, spec.planes, t.planes):
        g = min(t.planes, spec.planes - p0)
        for r0 in range(0, oh, t.rows):
            r = min(t.rows, oh - r0)
            ri = spec.rows_in(r)
            y_lo = r0 * spec.strides[0] - pt
            nr = max(0, min(spec.h, y_lo + ri) - max(0, y_lo))
            padded = y_lo < 0 or y_lo + ri > spec.h or pl > 0 or wp > spec.w
            uops = g * (ri * wp * padded + 2 * nr * cols + r * ow * (kh * kw + per_out))
            load = move(g, nr * spec.w * cfg.inp_elem_bytes, dram.read_latency)
            last = move(g, r * ow * cfg.out_elem_bytes, dram.write_latency)
            first = load if first is None else first
            total += max(load, UOP_CYCLES * uops + TILE_CYCLES, last)
    return total + first + last


# ---- the accelerator -------------------------------------------------------------------------------
def avg_pool_spec(n: Node, x_shape) -> PoolSpec:
    """The PoolSpec (window geometry) of a qavg_pool2d over x_shape (its first two dims: planes)."""
    a = n.attrs
    return PoolSpec(math.prod(x_shape[:2]), x_shape[2], x_shape[3], tuple(a["kernel"]), tuple(a["strides"]),
                    tuple(a["pads"]), a["ceil_mode"], n.name)


def check_avg_pool(n: Node, cfg: AccelConfig) -> str | None:
    """None if the ALU takes this qavg_pool2d, else why not (a sentence without the node's label)."""
    if cfg.block_in != cfg.block_out:
        return f"ALU pooling needs block_in == block_out ({cfg.block_in} != {cfg.block_out})"
    x = n.inputs[0].shape
    if len(x) != 4:
        return f"average pooling of a rank-{len(x)} tensor has no ALU lowering"
    blocks = -(-len(n.attrs.get("gains") or ()) // cfg.block_out)
    if blocks > cfg.wgt_depth:
        return f"{blocks} channel blocks of gains exceed the weight buffer ({cfg.wgt_depth} tiles)"
    try:
        _attrs_hw_acc(n.attrs, x[2:], cfg.acc_width)
        plan_pool(avg_pool_spec(n, (-(-x[0] // cfg.batch), -(-x[1] // cfg.block_out), x[2], x[3])), cfg)
    except (TilingError, ValueError) as e:
        return str(e)
    return None


def _attrs_hw_acc(a: dict, hw, acc_width: int) -> tuple[int, dict[int, int], np.ndarray]:
    """_attrs_hw, refused (ValueError) where the products overflow acc_width-bit accumulators."""
    k, muls, grid = _attrs_hw(a, hw)
    bound = (128 + abs(a["in_zp"])) * a["kernel"][0] * a["kernel"][1] * _max_gain(a)
    if acc_width < 32 and bound * max(muls.values()) + (1 << k >> 1) >= 1 << (acc_width - 1):
        raise ValueError(f"window sums times the divisor multipliers overflow {acc_width}-bit accumulators")
    return k, muls, grid


def _runs(v) -> list[tuple[int, int, int]]:
    """(start, stop, value) of the maximal runs of equal values in v."""
    out, i = [], 0
    for val, grp in groupby(v):
        n = len(list(grp))
        out.append((i, i + n, int(val)))
        i += n
    return out


def _add_imm(stream, kern, value: int) -> None:
    """ADD value (any int) as immediates of at most 16 signed bits."""
    while value:
        step = max(-IMM_MAX, min(IMM_MAX, value))
        stream.push_alu(kern, AluOp.ADD, step)
        value -= step


def pool_weights(attrs: dict, cfg: AccelConfig) -> np.ndarray:
    """The weight tiles emit_avg_pool's copy GEMM reads: the identity, or with gains one diagonal
    tile per channel block (the gains of its channels; padding channels 1): the copy applies them."""
    gains = attrs.get("gains") or ()
    if not gains:
        return identity_weights(cfg)
    blocks = -(-len(gains) // cfg.block_out)
    g = np.ones(blocks * cfg.block_out, np.int64)
    g[:len(gains)] = gains
    w = np.zeros((blocks, cfg.block_out, cfg.block_in), np.int8)
    idx = np.arange(cfg.block_out)
    w[:, idx, idx] = g.reshape(blocks, cfg.block_out)
    return w


def emit_avg_pool(stream, spec: PoolSpec, attrs: dict, x, out, ident, lo: int | None = None, hi: int = 127,
                  vt: int = 2, tiling: PoolTiling | None = None) -> dict[str, int]:
    """Append out = clamp(qavg_pool2d(x), lo, hi) for packed int8 x and out (planes of h x w and
    oh x ow entries, channel blocks innermost); attrs are the qavg_pool2d's; `ident` a DRAM buffer
    of pool_weights(attrs, cfg)."""
    cfg = stream.cfg
    blocks = -(-len(attrs.get("gains") or ()) // cfg.block_out)   # weight tiles beyond the identity's one
    if blocks > cfg.wgt_depth:
        raise TilingError(f"{spec.name}: {blocks} channel blocks of gains exceed the weight buffer ({cfg.wgt_depth} tiles)")
    check_square_blocks(spec, cfg)
    zx, zo = attrs["in_zp"], attrs["out_zp"]
    lo = int8_min(zo) if lo is None else lo
    if not -128 <= lo <= hi <= 127:
        raise TilingError(f"{spec.name}: clamp [{lo}, {hi}] outside the int8 range")
    try:
        k, muls, grid = _attrs_hw_acc(attrs, (spec.h, spec.w), cfg.acc_width)
    except ValueError as e:
        raise TilingError(f"{spec.name}: {e}") from None
    cy, cx = divisor_counts((spec.h, spec.w), attrs)
    col_runs = _runs(cx)
    lo = max(lo, int8_min(zo))
    flush = _flush_form(k, zo, lo, hi)
    t = tiling or plan_pool(spec, cfg, vt)
    ow = spec.out_hw[1]
    kh, kw = spec.kernel
    if t.planes * spec.rows_in(t.rows) * spec.padded_w >= 1 << LOOP_ITER_BITS:
        raise TilingError(f"{spec.name}: window region of {t.planes * spec.rows_in(t.rows) * spec.padded_w} "
                          f"entries exceeds the loop extent")

    def divide(o_base, g, r, r0):   # offset, one MUL per rectangle of equal divisor, round/shift/clamp
        whole = stream.kernel(("avgpool.out", o_base, g * r * ow), lambda kk: walk(kk, o_base, g * r * ow))
        _add_imm(stream, whole, -zx * kh * kw)
        for a0, a1, vy in _runs(cy[r0:r0 + r]):
            for c0, c1, vx in col_runs:
                def rect(kk, a0=a0, a1=a1, c0=c0, c1=c1):
                    kk.loop_begin(a1 - a0, dst_factor=ow, src_factor=0)
                    kk.loop_begin(c1 - c0, dst_factor=1, src_factor=0)
                    for q in range(g):
                        kk.push(o_base + q * r * ow + a0 * ow + c0, 0)
                rk = stream.kernel(("avgpool.rect", o_base, g, r, ow, a0, a1, c0, c1), rect)
                stream.push_alu(rk, AluOp.MUL, muls[vy * vx])
        if flush is not None:   # round, shift and clamp in one pass (acc copies itself: src = dst)
            fk = stream.kernel(("avgpool.flush", o_base, g * r * ow), lambda kk: walk(kk, o_base, g * r * ow, 1))
            stream.push_alu(fk, AluOp.FLUSH, flush, use_imm=False)
        else:
            if k > 0:
                stream.push_alu(whole, AluOp.ADD, 1 << (k - 1))
                stream.push_alu(whole, AluOp.SHR, operands.shr_immediate(k, cfg.acc_width))
            _add_imm(stream, whole, zo)
            stream.push_alu(whole, AluOp.CLAMP, operands.clamp_immediate(lo, hi))

    # taps outside the input hold the input's zero point (they add 0 after the offset); each plane's
    # rows pass its channel block's gain tile
    tiles = emit_window_tiles(stream, spec, t, x, out, ident, "avgpool", zx, AluOp.ADD, divide,
                              plane_weights=lambda p: p % blocks if blocks else 0, weight_tiles=max(1, blocks))
    return {"tiles": tiles, "planes_per_tile": t.planes, "rows_per_tile": t.rows,
            "divisors": len(muls), "shift": k}


def _flush_form(k: int, zo: int, lo: int, hi: int) -> int | None:
    """The FLUSH immediate doing ADD 2^(k-1), SHR k and the clamp to [lo, hi] in one pass, where
    FLUSH can say it (no output zero point; lo 0, -hi or -hi - 1), else None."""
    if zo or k > 31:
        return None
    for lo_zero, symmetric in ((True, False), (False, True), (False, False)):
        if lo == (0 if lo_zero else -hi if symmetric else -hi - 1):
            return operands.flush_immediate(k, hi, lo_zero, k > 0, symmetric)
    return None


def qavg_attrs(kernel, strides=(1, 1), pads=(0, 0, 0, 0), ceil_mode: int = 0, count_include_pad: int = 0,
               ratio: float = 1.0, in_zp: int = 0, out_zp: int = 0, gains=()) -> dict:
    """The normalized attributes of a qavg_pool2d (tests and callers that build one by hand)."""
    return get_op("qavg_pool2d").normalize(
        {"kernel": tuple(kernel), "strides": tuple(strides), "pads": tuple(pads), "ceil_mode": ceil_mode,
         "count_include_pad": count_include_pad, "ratio": float(ratio), "in_zp": in_zp, "out_zp": out_zp,
         "gains": tuple(int(g) for g in gains)})


def run_avg_pool(device, x: np.ndarray, attrs: dict, lo: int | None = None, hi: int = 127, vt: int = 2):
    """int8 NCHW qavg_pool2d (attrs: qavg_attrs) on the device -> (int8 NCHW, RunResult)."""
    def make_spec(planes):
        return PoolSpec(planes, x.shape[2], x.shape[3], tuple(attrs["kernel"]), tuple(attrs["strides"]),
                        tuple(attrs["pads"]), attrs["ceil_mode"], "qavg_pool2d")
    return run_pool(device, x, make_spec, pool_weights(attrs, device.cfg),
                    lambda st, spec, xb, ob, wb: emit_avg_pool(st, spec, attrs, xb, ob, wb, lo, hi, vt), "avgpool")
