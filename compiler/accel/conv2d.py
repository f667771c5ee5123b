"""conv2d and dense on the accelerator: tiling to fit the buffers, and the instruction stream.

A layer is cut into output tiles (o_t channel blocks x h_t rows x w_t columns), each summed
over input-channel chunks of ic_t blocks. Per chunk the load stage brings an input tile (the
conv padding is folded into the LOAD's padding, never materialized in DRAM) and, unless they
stay resident for the whole output-channel tile, the weights; compute runs one GEMM whose
micro-ops enumerate (o, ic, kh, kw) and whose two affine loops walk output rows and columns;
the epilogue (bias add, shift, clip) runs on the ALU and the store stage writes int8 rows.
With virtual threads vt=2 the on-chip buffers are split in two slots and dependency tokens
let the loads of one tile and the stores of another overlap compute on a third.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
from dataclasses import dataclass

import numpy as np

from accel.isa import AccelConfig, AluOp, EncodingError, MemType, Stage, flush_immediate
from accel.isa.config import PAD_BITS, SIZE_BITS

from ..errors import CompilerError
from ..graph.ops import shift_right_round
from .pipeline import TokenPipeline

log = logging.getLogger(__name__)


class TilingError(CompilerError):
    """A layer cannot be tiled into the config's buffers; says which buffer is short and by how much."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Conv2dSpec:
    """A conv2d layer in NCHW/OIHW terms (channels before blocking); pads are (top, bottom, left, right)."""
    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    strides: tuple[int, int] = (1, 1)
    name: str = "conv2d"

    def __post_init__(self):
        for k in ("n", "c", "h", "w", "o", "kh", "kw"):
            if getattr(self, k) < 1:
                raise TilingError(f"{self.name}: {k}={getattr(self, k)} must be >= 1")
        if min(self.strides) < 1 or min(self.pads) < 0:
            raise TilingError(f"{self.name}: strides {self.strides} must be >= 1 and pads {self.pads} >= 0")
        if self.oh < 1 or self.ow < 1:
            raise TilingError(f"{self.name}: kernel {self.kh}x{self.kw} larger than the padded input")

    @property
    def oh(self) -> int:
        return (self.h + self.pads[0] + self.pads[1] - self.kh) // self.strides[0] + 1

    @property
    def ow(self) -> int:
        return (self.w + self.pads[2] + self.pads[3] - self.kw) // self.strides[1] + 1

    @property
    def macs(self) -> int:
        return self.n * self.o * self.oh * self.ow * self.c * self.kh * self.kw

    @classmethod
    def dense(cls, rows: int, k: int, m: int, cfg: AccelConfig, name: str = "dense") -> "Conv2dSpec":
        """Dense (rows x k) @ (k x m) as a 1x1 conv over one image block whose pixels are the
        row blocks: the packing of compiler.accel.layout.pack_dense_input."""
        return cls(n=cfg.batch, c=k, h=1, w=_ceil(rows, cfg.batch), o=m, kh=1, kw=1, name=name)

    @classmethod
    def from_workload(cls, fields: list[int], name: str, n: int = 1) -> "Conv2dSpec":
        """A row of a workload file (compiler/accel/resnet18_conv.json): h, w, c, o, kh, kw, pad_h, pad_w, sh, sw."""
        h, w, c, o, kh, kw, ph, pw, sh, sw = fields
        return cls(n=n, c=c, h=h, w=w, o=o, kh=kh, kw=kw, pads=(ph, ph, pw, pw), strides=(sh, sw), name=name)


@dataclass(frozen=True)
class Requant:
    """Epilogue on the int32 accumulator: out = clip((acc + half) >> shift, lo, hi) as int8, acc
    already holding the bias; half = 2^(shift-1) when `round` (round half up), else 0; a negative
    shift shifts left. With a fixed-point multiplier (mul != 1, for scales that are not powers of
    two: compiler.graph.ops.fixed_multiplier) it is clip(sat((acc * mul + 2^(shift-1)) >> shift)),
    the ALU's SCALE then a clamp. A zero point (an asymmetric output) is added before the clamp.
    Every other step wraps at 32 bits like the ALU."""
    shift: int = 0
    lo: int = -128
    hi: int = 127
    round: bool = False
    mul: int = 1
    zero_point: int = 0

    @property
    def fixed_point(self) -> bool:
        return self.mul != 1

    def apply(self, acc: np.ndarray) -> np.ndarray:
        def wrap(v):
            return v.astype(np.int64).astype(np.int32).astype(np.int64)
        acc = acc.astype(np.int64)
        if self.fixed_point:   # as SCALE (saturating to 32 bits), then the zero point and the clamp
            v = np.clip(shift_right_round(acc * self.mul, self.shift), -(1 << 31), (1 << 31) - 1)
            return np.clip(wrap(v + self.zero_point), self.lo, self.hi)
        if self.round and self.shift > 0:
            acc = wrap(acc + (1 << (self.shift - 1)))
        acc = acc >> self.shift if self.shift >= 0 else wrap(acc << -self.shift)
        return np.clip(wrap(acc + self.zero_point), self.lo, self.hi)


@dataclass(frozen=True)
class ConvTiling:
    o_t: int     # output-channel blocks per tile
    h_t: int     # output rows per tile
    w_t: int     # output columns per tile
    ic_t: int    # input-channel blocks per chunk
    vt: int      # virtual threads: buffer slots that tiles rotate through

    def describe(self) -> str:
        return f"o_t={self.o_t} h_t={self.h_t} w_t={self.w_t} ic_t={self.ic_t} vt={self.vt}"


@dataclass(frozen=True)
class ResidualAdd:
    """A residual add fused into the conv epilogue: out = requant((y << ka) + (r << kb)), y the
    conv's own requantized result (still in the accumulator), r an int8 tensor in the output's
    packed layout (N/b, O/bo, OH, OW, b, bo). r enters the input buffer beside the last input
    chunk of each tile and is summed by a GEMM against an identity tile (2^(kb-ka) I when
    kb > ka) kept in the weight buffer's last entry. Needs block_in == block_out, kb - ka <= 6."""
    buf: object
    ident: object   # DRAM buffer holding residual_identity(cfg, ka, kb)
    ka: int = 0
    kb: int = 0
    requant: Requant = Requant()


def residual_identity(cfg: AccelConfig, ka: int, kb: int) -> np.ndarray:
    """The one weight tile a fused residual add multiplies r by: 2^max(kb - ka, 0) * I."""
    if cfg.block_in != cfg.block_out:
        raise TilingError(f"a fused residual add needs block_in == block_out ({cfg.block_in} != {cfg.block_out})")
    if kb - ka > 6 or min(ka, kb) < 0:
        raise TilingError(f"a fused residual add needs 0 <= kb - ka <= 6 and shifts >= 0 (ka={ka}, kb={kb})")
    return (np.eye(cfg.block_out, cfg.block_in, dtype=np.int8) << max(kb - ka, 0))[None].astype(np.int8)


@dataclass(frozen=True)
class _Geom:
    """Blocked sizes of a layer under a config."""
    nb: int
    cb: int
    ob: int

    @classmethod
    def of(cls, spec: Conv2dSpec, cfg: AccelConfig) -> "_Geom":
        return cls(_ceil(spec.n, cfg.batch), _ceil(spec.c, cfg.block_in), _ceil(spec.o, cfg.block_out))


#: accumulator entries per tile slot after the bias entries that hold REQUANT operands (one for
#: the conv's requantization, one for a fused residual's)
PARAM_ENTRIES = 2


def _needs(spec: Conv2dSpec, t: ConvTiling, residual: bool = False) -> dict[str, int]:
    """Buffer entries one tiling needs (all slots; a fused residual adds its tile to each input
    slot and the identity tile to the weights)."""
    rows_in = (t.h_t - 1) * spec.strides[0] + spec.kh
    cols_in = (t.w_t - 1) * spec.strides[1] + spec.kw
    return {"inp": t.vt * (t.ic_t * rows_in * cols_in + (t.o_t * t.h_t * t.w_t if residual else 0)),
            "wgt": t.vt * t.o_t * t.ic_t * spec.kh * spec.kw + (1 if residual else 0),
            "acc": t.vt * (t.o_t * t.h_t * t.w_t + t.o_t + PARAM_ENTRIES),
            "uop": 2 * (t.o_t * t.ic_t * spec.kh * spec.kw + t.o_t + 1 + 2 * PARAM_ENTRIES)}


def _fits(spec, cfg, t, residual=False) -> bool:
    n = _needs(spec, t, residual)
    return (n["inp"] <= cfg.inp_depth and n["wgt"] <= cfg.wgt_depth and n["acc"] <= cfg.acc_depth
            and n["uop"] <= cfg.uop_depth)


#: compute-stage cycles an instruction costs beyond its micro-ops (issue, pipeline fill), a load
#: chunk's beyond its instructions (the token hand-offs between the stages), and the fraction of the
#: non-critical stages' time that two virtual threads fail to hide; fitted by bench/tiling_fit.py
#: --grid (every accelerator layer of ResNet-18 and MobileNetV2 in bench/e2e.py, fused residuals
#: included, 16 best-estimated tilings each measured on tsim, default and ultra96 configs): the
#: picks' total is 0.24% / 0.28% above the best measured, 0.20% / 0.25% with the merged transfers
#: (10, 10, 0.1, fitted before the row bands and resident biases: 0.52% / 0.40%)
INSN_CYCLES, CHUNK_CYCLES, OVERLAP_LOSS = 5, 5, 0.05


def estimate_cycles(spec: Conv2dSpec, cfg: AccelConfig, t: ConvTiling, residual: bool = False) -> dict[str, float]:
    """Analytical cost of a tiling, to rank tilings (the timing model gives real cycles).

    Per tile: the load stage's time (its input rows, each a DMA row waited on to the end; weights
    per chunk, or once per output-channel group when they stay resident), the compute stage's (GEMM
    micro-ops, the FLUSH pass and the bias MOVs it leaves, instruction overhead) and the store stage's
    (output rows). With two virtual threads the stages overlap, so tiles go at the slowest stage's
    pace, plus the pipeline's fill (the first chunk's loads, weights included, before any compute)
    and drain (the last tile's epilogue and store); with one they add up."""
    from sim.dram import DramModel
    g = _Geom.of(spec, cfg)
    n_o, n_h, n_w = _ceil(g.ob, t.o_t), _ceil(spec.oh, t.h_t), _ceil(spec.ow, t.w_t)
    n_ic = _ceil(g.cb, t.ic_t)
    tiles = g.nb * n_o * n_h * n_w
    khw = spec.kh * spec.kw
    rows_in = min(spec.h, (t.h_t - 1) * spec.strides[0] + spec.kh)
    cols_in = min(spec.w, (t.w_t - 1) * spec.strides[1] + spec.kw)
    dram, bus = DramModel(), cfg.bus_bytes
    read_row, write_row = dram.read_latency + 1, dram.write_latency + 1   # each DMA burst waits its latency
    burst = cfg.max_burst_beats * bus
    entries = t.o_t * t.h_t * t.w_t

    def rows(n, row_bytes, latency, back_to_back=False):
        """A transfer of n rows: its beats and a latency per burst (rows back to back in DRAM go
        as one row: CommandStream._one_row)."""
        if back_to_back:
            n, row_bytes = 1, n * row_bytes
        return n * (row_bytes / bus + latency * _ceil(int(row_bytes), burst))
    whole_rows = not any(spec.pads) and cols_in == spec.w            # the tile's input rows are whole rows
    inp_chunk = t.ic_t * rows(rows_in, cols_in * cfg.inp_elem_bytes, read_row, whole_rows)
    wgt_chunk = t.o_t * rows(1, t.ic_t * khw * cfg.wgt_elem_bytes, read_row)
    res_tile = t.o_t * rows(t.h_t, t.w_t * cfg.inp_elem_bytes, read_row, t.w_t == spec.ow) if residual else 0
    if n_ic == 1:   # resident weights: a group's are loaded with its first tile (one row: all its channels)
        wgt_group = rows(t.o_t, g.cb * khw * cfg.wgt_elem_bytes, read_row, True)
        inp_tile = inp_chunk / tiles if input_resident(spec, cfg, t) else inp_chunk
        load_tile = inp_tile + CHUNK_CYCLES + res_tile + wgt_group * g.nb * n_o / tiles
        first_load = inp_chunk + wgt_group
    else:
        load_tile = n_ic * (inp_chunk + wgt_chunk + CHUNK_CYCLES) + res_tile
        first_load = inp_chunk + wgt_chunk
    gemm_tile = entries * (g.cb * khw + (1 if residual else 0)) + n_ic * (INSN_CYCLES + CHUNK_CYCLES)
    # one pass (the FLUSH, or with a residual the conv's REQUANT) unless the last GEMM does it
    # (linear_pixels), and a bias MOV on the tiles FLUSH did not seed: each slot's first, and those
    # next to a shape change
    full = g.nb * (g.ob // t.o_t) * (spec.oh // t.h_t) * (spec.ow // t.w_t)
    passes = (0 if linear_pixels(spec, t.h_t, t.w_t) else 1) + min(tiles, t.vt + 2 * (tiles - full)) / tiles
    epilogue = passes * entries + t.o_t * cfg.acc_elem_bytes / bus + read_row + 3 * INSN_CYCLES
    store_tile = t.o_t * rows(t.h_t, t.w_t * cfg.out_elem_bytes, write_row, t.w_t == spec.ow)
    compute_tile = gemm_tile + epilogue
    if t.vt > 1:   # the stages overlap, but not perfectly: the others cost a fraction beyond the slowest
        stages = (load_tile, compute_tile, store_tile)
        pace = max(stages) + OVERLAP_LOSS * (sum(stages) - max(stages))
        total = first_load + tiles * pace + epilogue + store_tile
    else:
        total = tiles * (load_tile + compute_tile + store_tile)
    inp_bytes = tiles * g.cb * rows_in * cols_in * cfg.inp_elem_bytes
    wgt_loads = g.nb * n_o if n_ic == 1 else tiles * n_ic
    wgt_bytes = wgt_loads * t.o_t * t.ic_t * khw * cfg.wgt_elem_bytes
    out_bytes = g.nb * g.ob * spec.oh * spec.ow * cfg.out_elem_bytes
    uops = g.nb * g.ob * g.cb * khw * spec.oh * spec.ow
    return {"gemm_uops": uops, "dram_bytes": inp_bytes + wgt_bytes + out_bytes, "cycles": total}


def conv2d_candidates(spec: Conv2dSpec, cfg: AccelConfig, vt: int = 2, residual: bool = False
                      ) -> list[tuple[float, ConvTiling]]:
    """Every tiling that fits the buffers (for each o_t, ic_t, w_t every balanced h_t up to the
    tallest that fits: fewer rows can pace the stages better, e.g. a store-bound 1x1 layer), with its
    estimate_cycles cost, cheapest first; TilingError naming the short buffer if none fits."""
    if vt not in (1, 2):
        raise TilingError(f"{spec.name}: virtual threads must be 1 or 2, got {vt}")
    if max(spec.pads) >= 1 << PAD_BITS:
        raise TilingError(f"{spec.name}: padding {spec.pads} exceeds the LOAD padding field's maximum "
                          f"{(1 << PAD_BITS) - 1}")
    # the estimate's constants are part of the key: bench/tiling_fit.py --grid varies them
    ranked = _ranked_tilings(dataclasses.replace(spec, name="conv2d"), cfg, vt, residual,
                             (INSN_CYCLES, CHUNK_CYCLES, OVERLAP_LOSS))
    if not ranked:
        need = _needs(spec, ConvTiling(1, 1, 1, 1, vt), residual)
        have = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth, "uop": cfg.uop_depth}
        short = [f"{k} buffer needs {need[k]} entries for the smallest tile, has {have[k]} (short by "
                 f"{need[k] - have[k]})" for k in need if need[k] > have[k]]
        raise TilingError(f"{spec.name}: cannot be tiled into the config with vt={vt}: " + "; ".join(short))
    return list(ranked)


@functools.lru_cache(maxsize=256)
def _ranked_tilings(spec: Conv2dSpec, cfg: AccelConfig, vt: int, residual: bool, _constants: tuple
                    ) -> tuple[tuple[float, ConvTiling], ...]:
    """conv2d_candidates' search, once per layer shape: networks repeat shapes (MobileNetV2's 34
    accelerator layers have 19), and the search is most of the accelerator compile's time."""
    g = _Geom.of(spec, cfg)

    def cands(n: int) -> list[int]:
        s = {n, 1}
        s.update(_ceil(n, k) for k in range(1, min(n, 64) + 1))
        return sorted(s)
    found: dict[ConvTiling, float] = {}
    heights = cands(spec.oh)
    for o_t, ic_t, w_t in itertools.product(cands(g.ob), cands(g.cb), cands(spec.ow)):
        # the largest h_t that fits, found by bisection (needs grow with h_t)
        lo, hi = 0, spec.oh
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _fits(spec, cfg, ConvTiling(o_t, mid, w_t, ic_t, vt), residual):
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            continue
        # balanced row tiles, up to the tallest that fits (itself, though cands() may not list it)
        for h_t in {h for h in heights if h <= lo} | {_ceil(spec.oh, _ceil(spec.oh, lo))}:
            t = ConvTiling(o_t, h_t, w_t, ic_t, vt)
            found[t] = estimate_cycles(spec, cfg, t, residual)["cycles"]
    return tuple(sorted(((c, t) for t, c in found.items()), key=lambda ct: (ct[0], ct[1].describe())))


def plan_conv2d(spec: Conv2dSpec, cfg: AccelConfig, vt: int = 2, residual: bool = False) -> ConvTiling:
    """The cheapest tiling by estimate_cycles that fits every buffer (with room for a fused
    residual add when asked); TilingError if none does. compiler.accel.tune measures instead."""
    best = conv2d_candidates(spec, cfg, vt, residual)[0][1]
    log.debug("%s: tiling %s", spec.name, best.describe())
    return best


def emit_conv2d(stream, spec: Conv2dSpec, tiling: ConvTiling, inp, wgt, out, bias=None,
                requant: Requant = Requant(), residual: ResidualAdd | None = None,
                channel_scales=None) -> dict[str, int]:
    """Append a conv2d to a host_runtime CommandStream.

    inp: DRAM buffer of the packed input (N/b, C/bi, H, W, b, bi) int8; wgt: (O/bo, I/bi, KH, KW,
    bo, bi) int8; out: (N/b, O/bo, OH, OW, b, bo) int8; bias: (O/bo, b, bo) int32 or None;
    residual: an add fused into the epilogue (the tiling must be planned with residual=True);
    channel_scales: per-output-channel SCALE operands in the bias layout (channel_scale_operands),
    loaded into the bias entries once the MOV has used them; then `requant` only clamps.
    A tile's sums start from its bias (an ALU MOV) and end in one FLUSH when the last requantization
    (a fused residual's, if any) fits its immediate (flush_params) and there is a bias but no channel
    scales; FLUSH also seeds the next tile of the slot with its bias, so that tile skips the MOV.
    Without a residual, when the tile's output pixels read its input rows at one stride
    (linear_pixels), the FLUSH rides on the last chunk's GEMM (Gemm.flush after an EPILOGUE): the
    GEMM goes over (output-channel block, pixel) with the input channels and taps as its
    micro-ops, so each pass ends one sum, and there is no FLUSH pass. With a residual, the last
    GEMM requantizes into the accumulator instead (EPILOGUE to_acc) and the identity GEMM that adds
    the residual flushes.
    Every output-channel block's bias is loaded into the accumulator once, past the slots, when it
    fits (MOVs and seeds read it there). A tile starts its sums before it waits for its loads. On 1x1
    stride-1 layers the layer's first chunk and its last tile go in FILL_BANDS row bands with a token
    per band, so compute starts on the first band's input and the store drains the last tile band by
    band (the pipeline's fill and drain). A tile of whole unpadded rows moves all its channel blocks
    in one LOAD (its input chunk, its residual) and one STORE.
    Returns counts (tiles, chunks) for reporting."""
    cfg, t = stream.cfg, tiling
    g = _Geom.of(spec, cfg)
    sh, sw = spec.strides
    pt, _, pl, _ = spec.pads
    khw = spec.kh * spec.kw
    S = t.vt
    rows_max = (t.h_t - 1) * sh + spec.kh
    cols_max = (t.w_t - 1) * sw + spec.kw
    res_off = t.ic_t * rows_max * cols_max  # a fused residual's tile follows the input chunk
    inp_slot, wgt_slot = res_off + (t.o_t * t.h_t * t.w_t if residual else 0), t.o_t * t.ic_t * khw
    ident_idx = cfg.wgt_depth - 1
    if channel_scales is not None and (residual is not None or requant.shift or requant.fixed_point):
        raise TilingError(f"{spec.name}: per-channel scales take the whole requantization (no fused residual, "
                          f"no other shift or multiplier)")
    if residual is not None:
        if cfg.block_in != cfg.block_out:
            raise TilingError(f"{spec.name}: a fused residual add needs block_in == block_out")
        if not _fits(spec, cfg, t, True):
            raise TilingError(f"{spec.name}: tiling {t.describe()} leaves no room for the fused residual; "
                              f"plan it with residual=True")
    acc_slot = t.o_t * t.h_t * t.w_t + t.o_t + PARAM_ENTRIES
    # FLUSH ends a tile's sums and seeds the slot's next tile with its bias in one pass, so that tile
    # needs no bias MOV of its own when it has the same shape (seeds[slot]: the (o0, shape) seeded)
    last_requant = requant if residual is None else residual.requant   # the one that makes the int8 output
    flush = flush_params(last_requant) if bias is not None and channel_scales is None else None
    seeds: dict[int, tuple] = {}
    # every output-channel block's bias stays in the accumulator past the slots (one LOAD for the
    # layer) when there is room: seeds and bias MOVs read it there, so no tile waits on a DRAM read
    # in the compute stage for its bias
    bias_all = (S * acc_slot if bias is not None and channel_scales is None and S * acc_slot + g.ob <= cfg.acc_depth
                else None)
    # a fused residual's conv requantization into the accumulator on the last GEMM (EPILOGUE to_acc)
    conv_to_acc = flush_params(requant) if residual is not None else None
    if flush is None:
        ends = f"in requantization passes ({last_requant})"
    elif residual is None:
        ends = "in a FLUSH on the last GEMM where pixels are linear (else a FLUSH pass)"
    else:
        ends = ("in a FLUSH on the identity GEMM" if not min(residual.ka, residual.kb) else "in a FLUSH pass") + \
            (", the conv's requantization into the accumulator on its last GEMM where pixels are linear"
             if conv_to_acc is not None else "")
    log.debug("%s: tiles end %s", spec.name, ends)
    n_ic = _ceil(g.cb, t.ic_t)
    resident = n_ic == 1  # weights of an output-channel tile stay for all its row/column tiles
    # one spatial tile and one input chunk: every tile reads the same input, loaded once into slot 0
    inp_resident = resident and input_resident(spec, cfg, t)

    tiles = [(n, o0, h0, w0) for n in range(g.nb) for o0 in range(0, g.ob, t.o_t)
             for h0 in range(0, spec.oh, t.h_t) for w0 in range(0, spec.ow, t.w_t)]

    def shape(i):   # channel blocks, rows and columns of tile i (smaller at the edges)
        _, o0, h0, w0 = tiles[i]
        return min(t.o_t, g.ob - o0), min(t.h_t, spec.oh - h0), min(t.w_t, spec.ow - w0)
    n_loads = len(tiles) * n_ic
    pipe = TokenPipeline(stream, S, n_loads, len(tiles))
    if bias_all is not None:
        stream.load_2d(MemType.ACC, bias_all, bias, 0, y_size=1, x_size=g.ob)
    j = 0  # load/compute iteration (one input-channel chunk of one tile)
    group, last_group = -1, None
    for ti, (n, o0, h0, w0) in enumerate(tiles):
        o_a, h_a, w_a = shape(ti)
        acc_base = (ti % S) * acc_slot
        bias_base = acc_base + t.o_t * t.h_t * t.w_t
        param_base = bias_base + t.o_t   # REQUANT operands, set when the slot is first used
        r0, c0 = h0 * sh - pt, w0 * sw - pl
        rows, cols = (h_a - 1) * sh + spec.kh, (w_a - 1) * sw + spec.kw
        y0, y1 = max(r0, 0), min(r0 + rows, spec.h)
        x0, x1 = max(c0, 0), min(c0 + cols, spec.w)
        # padding above/left of the image rows/cols the tile reads, then below/right; a tile may lie
        # wholly in the padding (pads wider than the kernel reaches), then it loads only zeros
        yp0, xp0 = min(y0 - r0, rows), min(x0 - c0, cols)
        yp1, xp1 = rows - yp0 - max(0, y1 - y0), cols - xp0 - max(0, x1 - x0)
        if (n, o0) != last_group:
            group, last_group = group + 1, (n, o0)
            new_group = True
        else:
            new_group = False
        linear = linear_pixels(spec, h_a, w_a)
        fused = flush is not None and residual is None and linear
        # a residual's conv requantizes into the accumulator on its last GEMM (EPILOGUE to_acc)
        conv_in_gemm = conv_to_acc is not None and linear
        # with a residual, the FLUSH rides on the identity GEMM that adds it, unless a shift follows the add
        fused_res = flush is not None and residual is not None and not min(residual.ka, residual.kb)

        def seed_next() -> int:
            """The first seed entry of this tile's FLUSH: the bias the slot's next tile starts from."""
            seeds.pop(ti % S, None)
            o_next = o0
            if ti + S < len(tiles) and shape(ti + S) == (o_a, h_a, w_a):
                o_next = tiles[ti + S][1]
                if bias_all is None and o_next != o0:   # the next tile's channels: its bias replaces this one's
                    stream.load_2d(MemType.ACC, bias_base, bias, o_next, y_size=1, x_size=o_a)
                seeds[ti % S] = (o_next, o_a, h_a, w_a)
            return bias_base if bias_all is None else bias_all + o_next
        def blocks_in_one(band_rows: int) -> bool:
            """Whether the tile's output-shaped transfers (its stores, its residual) can move all its
            channel blocks in one instruction: whole rows, the band the whole tile, more than one block."""
            return o_a > 1 and w_a == spec.ow and band_rows == h_a and h_a * w_a < 1 << SIZE_BITS
        # the layer's first chunk and last tile go in row bands when every step of theirs is a GEMM on
        # whole rows: compute starts on the first band's input, and the store drains the last tile band
        # by band (the pipeline's fill and drain)
        last_tile = ti == len(tiles) - 1
        banded = (h_a > 1 and (ti == 0 or last_tile) and spec.kh == spec.kw == 1 and (sh, sw) == (1, 1)
                  and not any(spec.pads) and (fused or (conv_in_gemm and fused_res and residual.ka == 0)))
        whole = [(0, h_a)]
        bands = _row_bands(h_a, min(FILL_BANDS, cfg.dep_queue_depth - 2)) if banded else whole
        store_bands = bands if last_tile else whole
        tail_banded = False   # whether the last chunk's GEMMs did the whole epilogue band by band
        for ci, ic0 in enumerate(range(0, g.cb, t.ic_t)):
            ic_a = min(t.ic_t, g.cb - ic0)
            islot = j % S
            wslot = (group % S) if resident else islot
            inp_base, wgt_base = (0 if inp_resident else islot * inp_slot), wslot * wgt_slot
            res_base = islot * inp_slot + res_off   # a fused residual's tile, beside the last chunk

            def gemm_by_block(band=None):   # the chunk's GEMM over (block, pixel); band: pixels p0..p1-1
                return stream.kernel(
                    ("conv.gemm_by_block", o_a, ic_a, spec.kh, spec.kw, rows, cols, h_a * w_a, sw, inp_base,
                     wgt_base, acc_base, band),
                    lambda k: _build_gemm_by_block(k, o_a, ic_a, spec.kh, spec.kw, rows, cols, h_a * w_a, sw,
                                                   inp_base, wgt_base, acc_base, band))

            def residual_by_block(band=None):   # the residual's identity GEMM over (block, pixel)
                return stream.kernel(("conv.residual_by_block", acc_base, res_base, ident_idx, o_a, h_a * w_a, band),
                                     lambda k: _build_residual_by_block(k, o_a, h_a * w_a, acc_base, res_base,
                                                                        ident_idx, band))
            last_chunk = ci == n_ic - 1
            load_bands = bands if ti == 0 and ci == 0 else whole
            chunk_bands = bands if (ti == 0 and ci == 0) or (last_tile and last_chunk) else whole
            # ---- load stage
            pipe.before_load(j)
            if len(load_bands) > 1:   # 1x1, stride 1, no padding: a band's input rows are its output rows
                if new_group or not resident:
                    stream.load_2d(MemType.WGT, wgt_base, wgt, (o0 * g.cb + ic0) * khw,
                                   y_size=o_a, x_size=ic_a * khw, x_stride=g.cb * khw)
                if residual is not None and j == 0:
                    stream.load_2d(MemType.WGT, ident_idx, residual.ident, 0, x_size=1)
                for b, (a, z) in enumerate(load_bands):
                    for ic in range(ic_a):
                        entry = ((n * g.cb + ic0 + ic) * spec.h + y0 + a) * spec.w + x0
                        stream.load_2d(MemType.INP, inp_base + ic * rows * cols + a * cols, inp, entry,
                                       y_size=z - a, x_size=cols, x_stride=spec.w)
                    if residual is not None and last_chunk:
                        for o in range(o_a):
                            entry = ((n * g.ob + o0 + o) * spec.oh + h0 + a) * spec.ow + w0
                            stream.load_2d(MemType.INP, res_base + o * h_a * w_a + a * w_a, residual.buf, entry,
                                           y_size=z - a, x_size=w_a, x_stride=spec.ow)
                    if b < len(load_bands) - 1:
                        stream.dep_push(Stage.LOAD, Stage.COMPUTE)
            else:
                if (not (inp_resident and j) and ic_a > 1 and cols == spec.w and not (yp0 or yp1 or xp0 or xp1)
                        and rows * cols < 1 << SIZE_BITS):   # whole unpadded rows: every channel block in one LOAD
                    entry = ((n * g.cb + ic0) * spec.h + y0) * spec.w
                    stream.load_2d(MemType.INP, inp_base, inp, entry, y_size=ic_a, x_size=rows * cols,
                                   x_stride=spec.h * spec.w)
                else:
                    for ic in range(0 if inp_resident and j else ic_a):
                        entry = ((n * g.cb + ic0 + ic) * spec.h + y0) * spec.w + x0
                        stream.load_2d(MemType.INP, inp_base + ic * rows * cols, inp, entry,
                                       y_size=max(0, y1 - y0), x_size=max(0, x1 - x0), x_stride=spec.w,
                                       y_pad0=yp0, y_pad1=yp1, x_pad0=xp0, x_pad1=xp1)
                if new_group or not resident:
                    stream.load_2d(MemType.WGT, wgt_base, wgt, (o0 * g.cb + ic0) * khw,
                                   y_size=o_a, x_size=ic_a * khw, x_stride=g.cb * khw)
                if residual is not None:
                    if j == 0:
                        stream.load_2d(MemType.WGT, ident_idx, residual.ident, 0, x_size=1)
                    if last_chunk and blocks_in_one(h_a):
                        stream.load_2d(MemType.INP, res_base, residual.buf, ((n * g.ob + o0) * spec.oh + h0) * spec.ow,
                                       y_size=o_a, x_size=h_a * w_a, x_stride=spec.oh * spec.ow)
                    elif last_chunk:
                        for o in range(o_a):
                            entry = ((n * g.ob + o0 + o) * spec.oh + h0) * spec.ow + w0
                            stream.load_2d(MemType.INP, res_base + o * h_a * w_a, residual.buf, entry,
                                           y_size=h_a, x_size=w_a, x_stride=spec.ow)
            new_group = False
            pipe.after_load()
            # ---- compute stage: a tile's first chunk starts its sums (they need no input) while its loads run
            if ci == 0:
                pipe.before_tile(ti)
                if ti < S:
                    if flush is None or residual is not None:
                        set_requant_operand(stream, param_base, requant)
                    if residual is not None and flush is None:
                        set_requant_operand(stream, param_base + 1, residual.requant)
                if bias is None:
                    stream.push_gemm(_tile_kernel(stream, "reset", acc_base, o_a, h_a, w_a), reset=True)
                elif seeds.get(ti % S) == (o0, o_a, h_a, w_a):
                    pass   # the slot's previous tile left this tile's bias in its accumulators (FLUSH)
                else:  # start the sums from the bias: one ALU MOV pass instead of a reset and an ADD
                    if bias_all is None:
                        stream.load_2d(MemType.ACC, bias_base, bias, o0, y_size=1, x_size=o_a)
                    src = bias_base if bias_all is None else bias_all + o0
                    stream.push_alu(_bias_kernel(stream, acc_base, src, o_a, h_a * w_a), AluOp.MOV)
            pipe.before_compute()
            if len(chunk_bands) > 1:   # GEMMs band by band; on the last chunk every step is one: the conv
                # (flushing, or into the accumulator with a residual), then the residual's flushing identity GEMM
                tail_banded = last_chunk
                seed = seed_next() if last_chunk else None
                for b, (a, z) in enumerate(chunk_bands):
                    if 0 < b < len(load_bands):
                        stream.dep_pop(Stage.LOAD, Stage.COMPUTE)
                    px = (a * w_a, z * w_a)
                    if last_chunk and fused:
                        stream.push_epilogue(flush, seed, seed_factor_out=1)
                    elif last_chunk:
                        stream.push_epilogue(conv_to_acc, to_acc=True)
                    stream.push_gemm(gemm_by_block(px), flush=last_chunk)
                    if last_chunk and residual is not None:
                        stream.push_epilogue(flush, seed, seed_factor_out=1)
                        stream.push_gemm(residual_by_block(px), flush=True)
                    if last_chunk and b < len(store_bands) - 1:
                        stream.dep_push(Stage.COMPUTE, Stage.STORE)
                pipe.after_chunk(j)
                j += 1
                continue
            if fused or conv_in_gemm:
                if last_chunk and fused:
                    stream.push_epilogue(flush, seed_next(), seed_factor_out=1)
                elif last_chunk:
                    stream.push_epilogue(conv_to_acc, to_acc=True)
                stream.push_gemm(gemm_by_block(), flush=last_chunk)
            else:
                stream.push_gemm(stream.kernel(
                    ("conv.gemm", o_a, ic_a, spec.kh, spec.kw, rows, cols, h_a, w_a, sh, sw, inp_base, wgt_base,
                     acc_base),
                    lambda k: _build_gemm(k, o_a, ic_a, spec.kh, spec.kw, rows, cols, h_a, w_a, sh, sw,
                                          inp_base, wgt_base, acc_base)))
            if not (residual is not None and last_chunk):
                pipe.after_chunk(j)  # with a residual, the slot is released after the residual GEMM
            j += 1
        # ---- epilogue on the accumulator tile (a banded tile's was its GEMMs)
        if not tail_banded and (flush is None or residual is not None):
            ew = _tile_kernel(stream, "ew", acc_base, o_a, h_a, w_a)
            if channel_scales is not None:  # the bias entries are free again: one SCALE operand per channel block
                stream.load_2d(MemType.ACC, bias_base, channel_scales, o0, y_size=1, x_size=o_a)
                stream.push_alu(_bias_kernel(stream, acc_base, bias_base, o_a, h_a * w_a),
                                AluOp.SCALE)
            if not conv_in_gemm:   # else the last GEMM did it
                emit_requant(stream, ew, requant,
                             lambda: _operand_kernel(stream, acc_base, o_a * h_a * w_a, param_base))
            if residual is not None:   # (res_base, residual_by_block: the last chunk's slot, which holds the residual)
                r = residual
                if r.ka > r.kb:
                    stream.push_alu(ew, AluOp.SHR, -(r.ka - r.kb))
                if fused_res:   # by channel block, so that the seeds follow the blocks
                    stream.push_epilogue(flush, seed_next(), seed_factor_out=1)
                    stream.push_gemm(residual_by_block(), flush=True)
                else:
                    stream.push_gemm(stream.kernel(
                        ("conv.residual", acc_base, res_base, ident_idx, o_a * h_a * w_a),
                        lambda k: _build_walk(k, o_a * h_a * w_a, acc_base, res_base, ident_idx)))
                if min(r.ka, r.kb):
                    stream.push_alu(ew, AluOp.SHR, -min(r.ka, r.kb))
                pipe.after_chunk(j - 1)
                if flush is None:
                    emit_requant(stream, ew, r.requant,
                                 lambda: _operand_kernel(stream, acc_base, o_a * h_a * w_a, param_base + 1))
        if flush is not None and not (fused or fused_res or tail_banded):   # the last requantization, the next seeds
            stream.push_alu(_bias_kernel(stream, acc_base, seed_next(), o_a, h_a * w_a),
                            AluOp.FLUSH, flush, use_imm=False)
        pipe.after_tile()
        # ---- store stage
        for a, z in store_bands:
            pipe.before_store()
            if blocks_in_one(z - a):
                stream.store_2d(acc_base, out, ((n * g.ob + o0) * spec.oh + h0) * spec.ow, y_size=o_a,
                                x_size=h_a * w_a, x_stride=spec.oh * spec.ow)
                continue
            for o in range(o_a):
                entry = ((n * g.ob + o0 + o) * spec.oh + h0 + a) * spec.ow + w0
                stream.store_2d(acc_base + o * h_a * w_a + a * w_a, out, entry, y_size=z - a, x_size=w_a,
                                x_stride=spec.ow)
        pipe.after_store(ti)
    return {"tiles": len(tiles), "chunks": n_loads}


def requant_operand(requant: Requant, acc_width: int) -> int | None:
    """The lane value of the epilogue's register operand, or None when there is none: for a
    fixed-point requantization SCALE's (shift in bits 29:24, multiplier in 23:0; acc_width >= 30),
    else REQUANT's when one pass can do the rounding shift and clamp (round in bit 21, shift in
    bits 20:16, hi and lo as bytes)."""
    if requant.fixed_point:
        ok = acc_width >= 30 and 0 <= requant.shift < 64 and 0 < requant.mul < 1 << 24
        return (requant.shift << 24) | requant.mul if ok else None
    if not 0 < requant.shift < 32 or not -128 <= requant.lo <= requant.hi <= 127 or acc_width < 22:
        return None
    return (int(requant.round) << 21) | (requant.shift << 16) | ((requant.hi & 0xFF) << 8) | (requant.lo & 0xFF)


def flush_params(requant: Requant) -> int | None:
    """The ALU FLUSH immediate doing this requantization in one pass (shift, rounding, a clamp to
    [0, hi], [-hi, hi] or [-hi-1, hi]), or None when FLUSH cannot (a multiplier, a zero point, a left
    shift, other bounds)."""
    if requant.fixed_point or requant.zero_point or requant.lo not in (0, -requant.hi, -requant.hi - 1):
        return None
    try:   # flush_immediate checks the shift's and hi's ranges
        return flush_immediate(requant.shift, requant.hi, requant.lo == 0, requant.round and requant.shift > 0,
                               symmetric=requant.lo == -requant.hi != 0)
    except EncodingError:
        return None


def channel_scale_operands(muls: np.ndarray, shift: int, acc_width: int) -> np.ndarray:
    """Per-channel SCALE lane operands (int32, one per output channel) for multipliers muls[c] with
    a shared shift: each written as M * 2^-k with M < 2^24 (the low bits a shared shift adds are
    zeros: compiler.graph.passes.quantize builds them so), the product exactly as the reference's."""
    if acc_width < 30:
        raise TilingError(f"per-channel scales need SCALE's 30-bit operand (acc_width {acc_width})")
    ops = []
    for m in np.asarray(muls, np.int64).tolist():
        t = max(0, m.bit_length() - 24)
        if m <= 0 or m & ((1 << t) - 1) or not 0 <= shift - t < 64:
            raise TilingError(f"per-channel multiplier {m} with shift {shift} has no 24-bit SCALE form")
        ops.append(((shift - t) << 24) | (m >> t))
    return np.array(ops, np.int32)


def set_requant_operand(stream, idx: int, requant: Requant) -> None:
    """Every lane of accumulator entry idx := the REQUANT operand (MOV, SHL 16, ADD of immediates)."""
    v = requant_operand(requant, stream.cfg.acc_width)
    if v is None:
        return
    low = (v & 0xFFFF) - (1 << 16 if v & 0x8000 else 0)   # the immediate sign-extends
    one = stream.kernel(("conv.entry", idx), lambda k: k.push(idx))
    stream.push_alu(one, AluOp.MOV, (v - low) >> 16)
    stream.push_alu(one, AluOp.SHR, -16)
    stream.push_alu(one, AluOp.ADD, low)


def _operand_kernel(stream, acc_base: int, n: int, operand: int):
    """One micro-op walking n accumulator entries from acc_base, every one reading `operand`."""
    def build(k):
        k.loop_begin(n, dst_factor=1, src_factor=0)
        k.push(acc_base, operand)
        k.loop_end()
    return stream.kernel(("conv.operand", acc_base, n, operand), build)


def emit_requant(stream, kernel, requant: Requant, operand_kernel=None) -> None:
    """Scale, round, shift, then clamp every accumulator entry the kernel walks (a fixed-point
    requantization: SCALE, then the clamp): one REQUANT pass
    when operand_kernel is given and the requantization fits it (operand_kernel() records the same
    walk reading an entry set by set_requant_operand; called only then, so no unused micro-ops
    land in DRAM), else ALU ADD (the half), SHR, then CLIP for a symmetric range, CLAMP for an int8
    one, MIN+MAX otherwise."""
    if requant.fixed_point:  # SCALE (register operand) rounds and shifts; the clamp follows
        if operand_kernel is None or requant_operand(requant, stream.cfg.acc_width) is None:
            raise TilingError(f"fixed-point requantization (multiplier {requant.mul}, shift {requant.shift}) needs "
                              f"SCALE's register operand, a 30-bit accumulator lane (acc_width "
                              f"{stream.cfg.acc_width})")
        stream.push_alu(operand_kernel(), AluOp.SCALE)
        requant = Requant(0, requant.lo, requant.hi, zero_point=requant.zero_point)
    elif (operand_kernel is not None and not requant.zero_point
          and requant_operand(requant, stream.cfg.acc_width) is not None):
        stream.push_alu(operand_kernel(), AluOp.REQUANT)
        return
    if requant.round and requant.shift > 0:
        if requant.shift > 15:
            raise TilingError(f"rounding for shift {requant.shift} needs an immediate 2^{requant.shift - 1} "
                              f"beyond the 16-bit ALU immediate")
        stream.push_alu(kernel, AluOp.ADD, 1 << (requant.shift - 1))
    if requant.shift:
        stream.push_alu(kernel, AluOp.SHR, requant.shift)
    if requant.zero_point:   # an asymmetric output (a QDQ model's): its zero point, then the clamp
        stream.push_alu(kernel, AluOp.ADD, requant.zero_point)
    if requant.lo == -requant.hi:
        stream.push_alu(kernel, AluOp.CLIP, requant.hi)
    elif -128 <= requant.lo <= requant.hi <= 127:  # both bounds in one pass: CLAMP's imm holds them as bytes
        imm = ((requant.hi & 0xFF) << 8) | (requant.lo & 0xFF)
        stream.push_alu(kernel, AluOp.CLAMP, imm - (1 << 16) if imm >= 1 << 15 else imm)
    else:
        stream.push_alu(kernel, AluOp.MIN, requant.hi)
        stream.push_alu(kernel, AluOp.MAX, requant.lo)


def _bias_kernel(stream, acc_base, bias_base, o_a, hw):
    """The walk over a tile's entries reading each one's channel-block entry at bias_base (a bias
    MOV, per-channel SCALE operands, FLUSH's seeds)."""
    return stream.kernel(("conv.bias", acc_base, bias_base, o_a, hw),
                         lambda k: _build_bias(k, acc_base, bias_base, o_a, hw))


def _tile_kernel(stream, kind, acc_base, o_a, h_a, w_a):
    """One micro-op walking every accumulator entry of a tile (reset and elementwise ALU ops)."""
    n = o_a * h_a * w_a

    def build(k):
        k.loop_begin(n, dst_factor=1)
        k.push(acc_base)
        k.loop_end()
    return stream.kernel(("conv.tile", acc_base, n), build)


def _build_gemm(k, o_a, ic_a, kh, kw, rows, cols, h_a, w_a, sh, sw, inp_base, wgt_base, acc_base):
    k.loop_begin(h_a, dst_factor=w_a, src_factor=sh * cols)
    k.loop_begin(w_a, dst_factor=1, src_factor=sw)
    for o in range(o_a):
        for ic in range(ic_a):
            for y in range(kh):
                for x in range(kw):
                    k.push(acc_base + o * h_a * w_a, inp_base + ic * rows * cols + y * cols + x,
                           wgt_base + ((o * ic_a + ic) * kh + y) * kw + x)
    k.loop_end()
    k.loop_end()


#: row bands the first and last tiles of a layer split into (where every step of theirs is a GEMM),
#: so that compute starts on the first band's input and the store drains the last tile band by band
FILL_BANDS = 2


def _row_bands(h: int, n: int) -> list[tuple[int, int]]:
    """n (at most h) contiguous row ranges covering 0..h-1, as even as can be."""
    n = max(1, min(n, h))
    return [(h * b // n, h * (b + 1) // n) for b in range(n)]


def input_resident(spec: Conv2dSpec, cfg: AccelConfig, t: ConvTiling) -> bool:
    """Whether every tile of this tiling reads the same input (one batch block, one tile of rows and
    columns, one input-channel chunk): then it is loaded once and the output-channel groups reuse it."""
    return (_ceil(spec.n, cfg.batch) == 1 and t.h_t >= spec.oh and t.w_t >= spec.ow
            and t.ic_t >= _ceil(spec.c, cfg.block_in))


def linear_pixels(spec: Conv2dSpec, h_a: int, w_a: int) -> bool:
    """Whether an h_a x w_a output tile's pixels, in row-major order, start their input windows at
    one stride (the tile's input rows are (w_a - 1) * sw + kw entries wide): one loop level can then
    walk them (_build_gemm_by_block). True for 1x1 stride-1 convs and dense layers, and one-row tiles."""
    sh, sw = spec.strides
    return h_a == 1 or sh * ((w_a - 1) * sw + spec.kw) == w_a * sw


def _build_gemm_by_block(k, o_a, ic_a, kh, kw, rows, cols, pixels, sw, inp_base, wgt_base, acc_base,
                         band=None):
    """GEMM loops over (output-channel block, pixel), micro-ops over (input channel, tap): each pass
    is one output entry's whole sum (what a flushing GEMM needs). Pixels at one input stride only.
    band=(p0, p1): only the tile's pixels p0..p1-1 (a band of a tile split for the pipeline's fill
    and drain)."""
    p0, p1 = band or (0, pixels)
    k.loop_begin(o_a, dst_factor=pixels, src_factor=0, wgt_factor=ic_a * kh * kw)
    k.loop_begin(p1 - p0, dst_factor=1, src_factor=sw)
    for ic in range(ic_a):
        for y in range(kh):
            for x in range(kw):
                k.push(acc_base + p0, inp_base + p0 * sw + ic * rows * cols + y * cols + x,
                       wgt_base + (ic * kh + y) * kw + x)
    k.loop_end()
    k.loop_end()


def _build_residual_by_block(k, o_a, pixels, acc_base, res_base, ident, band=None):
    """A fused residual's identity GEMM over (output-channel block, pixel), one micro-op a pass (so
    a flushing GEMM's seeds can follow the blocks); the residual tile is laid out like the output's.
    band=(p0, p1): only pixels p0..p1-1."""
    p0, p1 = band or (0, pixels)
    k.loop_begin(o_a, dst_factor=pixels, src_factor=pixels)
    k.loop_begin(p1 - p0, dst_factor=1, src_factor=1)
    k.push(acc_base + p0, res_base + p0, ident)
    k.loop_end()
    k.loop_end()


def _build_walk(k, n, dst, src, wgt):
    k.loop_begin(n, dst_factor=1, src_factor=1)
    k.push(dst, src, wgt)
    k.loop_end()


def _build_bias(k, acc_base, bias_base, o_a, hw):
    k.loop_begin(hw, dst_factor=1, src_factor=0)
    for o in range(o_a):
        k.push(acc_base + o * hw, bias_base + o)
    k.loop_end()


def conv2d_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, spec: Conv2dSpec,
                     requant: Requant = Requant(), channel_muls: tuple[np.ndarray, int] | None = None) -> np.ndarray:
    """numpy int reference: NCHW int8 x OIHW int8 (+ int32 bias) -> requantized int8 NCHW, with the
    accumulator's int32 wraparound; channel_muls (multipliers, shift): per-channel fixed point
    (round_half_up(acc * m_c * 2^-shift)) before requant's clamp."""
    pt, pb, pl, pr = spec.pads
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    sh, sw = spec.strides
    acc = np.zeros((x.shape[0], spec.o, spec.oh, spec.ow), np.int64)
    wl = w.astype(np.int64)
    for y in range(spec.kh):
        for xx in range(spec.kw):
            patch = xp[:, :, y:y + sh * spec.oh:sh, xx:xx + sw * spec.ow:sw]
            acc += np.einsum("nchw,oc->nohw", patch, wl[:, :, y, xx], optimize=True)
    acc = acc.astype(np.int32)  # wrap like the accumulator
    if bias is not None:
        acc = (acc.astype(np.int64) + bias.astype(np.int64)[None, :, None, None]).astype(np.int32)
    if channel_muls is not None:
        muls, shift = channel_muls
        acc = shift_right_round(acc.astype(np.int64) * np.asarray(muls, np.int64)[None, :, None, None], shift)
    return requant.apply(acc).astype(np.int8)


def run_conv2d(device, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, spec: Conv2dSpec,
               requant: Requant = Requant(), vt: int = 2, tiling: ConvTiling | None = None,
               residual: tuple[np.ndarray, int, int, Requant] | None = None,
               channel_muls: tuple[np.ndarray, int] | None = None):
    """Pack NCHW int8 x and OIHW int8 w, run the layer on the device, unpack: (int8 NCHW, RunResult, stream).
    residual: (r NCHW int8, ka, kb, requant) to fuse out = requant((y << ka) + (r << kb));
    channel_muls: (multipliers, shift) for per-channel fixed point (see conv2d_reference)."""
    from .layout import pack_activation, pack_bias, pack_weight, unpack_activation
    cfg = device.cfg
    tiling = tiling or plan_conv2d(spec, cfg, vt, residual is not None)
    channel_ops = None if channel_muls is None else pack_bias(channel_scale_operands(*channel_muls, cfg.acc_width), cfg)
    g = _Geom.of(spec, cfg)
    mem = device.memory
    bufs = [mem.alloc_array(pack_activation(x, cfg.batch, cfg.block_in), align=cfg.inp_elem_bytes,
                            name=f"{spec.name}.inp"),
            mem.alloc_array(pack_weight(w, cfg.block_out, cfg.block_in), align=cfg.wgt_elem_bytes,
                            name=f"{spec.name}.wgt")]
    bufs.append(mem.alloc_array(pack_bias(bias, cfg), align=cfg.acc_elem_bytes, name=f"{spec.name}.bias")
                if bias is not None else None)
    oshape = (g.nb, g.ob, spec.oh, spec.ow, cfg.batch, cfg.block_out)
    out = mem.alloc(int(np.prod(oshape)) * cfg.out_width // 8, align=cfg.out_elem_bytes, name=f"{spec.name}.out")
    fused = None
    if residual is not None:
        r, ka, kb, rq2 = residual
        rb = mem.alloc_array(pack_activation(r, cfg.batch, cfg.block_out), align=cfg.out_elem_bytes,
                             name=f"{spec.name}.residual")
        ib = mem.alloc_array(residual_identity(cfg, ka, kb), align=cfg.wgt_elem_bytes, name=f"{spec.name}.identity")
        bufs += [rb, ib]
        fused = ResidualAdd(rb, ib, ka, kb, rq2)
    scales = None
    if channel_ops is not None:
        scales = mem.alloc_array(channel_ops, align=cfg.acc_elem_bytes, name=f"{spec.name}.scales")
        bufs.append(scales)
    try:
        stream = device.stream()
        stream.emit_preloaded(lambda s: emit_conv2d(s, spec, tiling, bufs[0], bufs[1], out, bufs[2], requant, fused,
                                                   scales))
        result = stream.synchronize()
        y = unpack_activation(out.read(np.int8, oshape), spec.n, spec.o)
    finally:
        for b in bufs + [out]:
            if b is not None:
                b.free()
    return y, result, stream


def run_dense(device, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, requant: Requant = Requant(),
              vt: int = 2, run_conv=None):
    """int8 (rows x k) @ int8 weights (m x k, as ONNX Gemm with transB) -> (int8 rows x m, RunResult, stream).

    Runs as the 1x1 conv of Conv2dSpec.dense (image n, pixel p holds row p*batch + n) through
    run_conv (this module's run_conv2d, or the TE path's)."""
    from .layout import pad_to
    cfg = device.cfg
    rows, k = x.shape
    m = w.shape[0]
    spec = Conv2dSpec.dense(rows, k, m, cfg)
    nchw = pad_to(x, 0, cfg.batch).reshape(spec.w, cfg.batch, k).transpose(1, 2, 0)[:, :, None, :]
    y, result, stream = (run_conv or run_conv2d)(device, nchw, w.reshape(m, k, 1, 1), bias, spec, requant, vt)
    return y[:, :, 0, :].transpose(2, 0, 1).reshape(-1, m)[:rows], result, stream


def dense_reference(x, w, bias, requant: Requant = Requant()) -> np.ndarray:
    acc = (x.astype(np.int64) @ w.astype(np.int64).T).astype(np.int32)
    if bias is not None:
        acc = (acc.astype(np.int64) + bias.astype(np.int64)).astype(np.int32)
    return requant.apply(acc).astype(np.int8)


def loop_nest_text(spec: Conv2dSpec, tiling: ConvTiling, cfg: AccelConfig, requant: Requant = Requant(),
                   bias: bool = True) -> str:
    """The lowered loop nest emit_conv2d walks, as readable pseudo-IR: tile loops, the DMA and GEMM/ALU
    intrinsics each iteration issues, buffer slots and token operations."""
    g, t = _Geom.of(spec, cfg), tiling
    sh, sw = spec.strides
    rows, cols = (t.h_t - 1) * sh + spec.kh, (t.w_t - 1) * sw + spec.kw
    n_ic = _ceil(g.cb, t.ic_t)
    resident = n_ic == 1
    S = t.vt
    init = "dma_load acc[bias]; alu.mov(acc[tile], acc[bias])" if bias else "gemm.reset(acc[tile])"
    ep = [f"alu.shr(acc[tile], imm={requant.shift})"] if requant.shift else []
    ep += ([f"alu.clip(acc[tile], imm={requant.hi})"] if requant.lo == -requant.hi else
           [f"alu.clamp(acc[tile], lo={requant.lo}, hi={requant.hi})"] if -128 <= requant.lo <= requant.hi <= 127 else
           [f"alu.min(acc[tile], imm={requant.hi})", f"alu.max(acc[tile], imm={requant.lo})"])
    L = [f"// {spec.name}: N={spec.n} C={spec.c} H={spec.h} W={spec.w} -> O={spec.o} OH={spec.oh} OW={spec.ow}, "
         f"kernel {spec.kh}x{spec.kw}, strides {spec.strides}, pads {spec.pads}",
         f"// blocked: {g.nb} batch x {g.cb} in x {g.ob} out blocks of {cfg.batch}x{cfg.block_in}x{cfg.block_out}; "
         f"tiling {t.describe()}",
         f"// buffers per slot: inp_buffer {t.ic_t * rows * cols} entries, wgt_buffer {t.o_t * t.ic_t * spec.kh * spec.kw}, "
         f"acc_buffer {t.o_t * t.h_t * t.w_t} (+{t.o_t} bias); {S} slot(s)",
         f"for n in range({g.nb}):",
         f"  for o0 in range(0, {g.ob}, {t.o_t}):            // o_a = min({t.o_t}, {g.ob} - o0)",
         f"    for h0 in range(0, {spec.oh}, {t.h_t}):        // h_a = min({t.h_t}, {spec.oh} - h0)",
         f"      for w0 in range(0, {spec.ow}, {t.w_t}):      // w_a = min({t.w_t}, {spec.ow} - w0); tile ti, slot ti % {S}",
         f"        for ic0 in range(0, {g.cb}, {t.ic_t}):    // iteration j, slot j % {S}",
         f"          load:    [pop compute->load if j >= {S}]",
         f"                   for ic in range(ic_a): dma_load inp[n, ic0+ic, h0*{sh}-{spec.pads[0]} .. +rows, "
         f"w0*{sw}-{spec.pads[2]} .. +cols] -> inp_buffer[slot] (out-of-image rows/cols as LOAD padding)",
         f"                   {'if first tile of (n, o0): ' if resident else ''}dma_load wgt[o0 .. +o_a, ic0 .. +ic_a, :, :]"
         f" -> wgt_buffer[{'o-tile % ' + str(S) if resident else 'slot'}]; push load->compute",
         f"          compute: pop load->compute; if ic0 == 0: [pop store->compute if ti >= {S}]; {init}",
         "                   gemm: for oh in range(h_a): for ow in range(w_a):  // the two affine loop levels",
         f"                           uops (o, ic, kh, kw): acc[o, oh, ow] += inp[ic, oh*{sh}+kh, ow*{sw}+kw] . "
         f"wgt[o, ic, kh, kw]   // {t.o_t * t.ic_t * spec.kh * spec.kw} uops",
         f"                   [push compute->load if j + {S} < iterations]",
         f"        compute: {'; '.join(ep)}; push compute->store",
         f"        store:   pop compute->store; for o in range(o_a): dma_store acc[o] -> out[n, o0+o, h0 .. +h_a, "
         f"w0 .. +w_a]; [push store->compute if ti + {S} < tiles]",
         "finish: pop store->compute"]
    return "\n".join(L) + "\n"
