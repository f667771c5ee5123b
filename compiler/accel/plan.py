"""Tiling a conv2d or dense layer into the accelerator's buffers: what a tiling needs, what it
costs (an analytical estimate that ranks tilings; compiler.accel.tune measures the best few), and
the cheapest that fits. A dense layer (a 1x1 conv over 1x1 images, rows as batch blocks) is
planned on its transposed view (rows as the pixels of one image) so that a tile streams rows past
resident weights (compiler.accel.dense)."""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging

from accel.isa import AccelConfig
from sim.dram import DramModel

from .spec import (
    PARAM_ENTRIES,
    Conv2dSpec,
    ConvTiling,
    TilingError,
    _ceil,
    _Geom,
    can_gather,
    dense_view,
    input_entries,
    is_dense,
)

log = logging.getLogger(__name__)


def _needs(spec: Conv2dSpec, t: ConvTiling, residual: bool = False) -> dict[str, int]:
    """Buffer entries one tiling needs (all slots; a fused residual adds its tile to each input
    slot and the identity tile to the weights)."""
    return {"inp": t.vt * (t.ic_t * input_entries(spec, t) + (t.o_t * t.h_t * t.w_t if residual else 0)),
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
#: (10, 10, 0.1, fitted before the row bands and resident biases: 0.52% / 0.40%). Refit (default
#: config, top 12) once transfers were costed with the read bursts in flight: the picks are 0.22%
#: above the best measured at these constants, 0.19% at the grid's best (10, 10, 0.0): kept
INSN_CYCLES, CHUNK_CYCLES, OVERLAP_LOSS = 5, 5, 0.05


def estimate_cycles(spec: Conv2dSpec, cfg: AccelConfig, t: ConvTiling, residual: bool = False) -> dict[str, float]:
    """Analytical cost of a tiling, to rank tilings (the timing model gives real cycles).

    Per tile: the load stage's time (its input rows and weights per chunk, the weights once per
    output-channel group when they stay resident; a transfer's bursts wait their latency
    AccelConfig.read_outstanding at a time, as the AXI master keeps them in flight, so transfers of
    many short rows cost their beats, not a latency a row), the compute stage's (GEMM
    micro-ops, the FLUSH pass and the bias MOVs it leaves, instruction overhead) and the store stage's
    (output rows). With two virtual threads the stages overlap, so tiles go at the slowest stage's
    pace, plus the pipeline's fill (the first chunk's loads, weights included, before any compute)
    and drain (the last tile's epilogue and store); with one they add up."""
    if is_dense(spec):
        return _estimate_dense(dense_view(spec, cfg), cfg, t, residual)
    g = _Geom.of(spec, cfg)
    n_o, n_h, n_w = _ceil(g.ob, t.o_t), _ceil(spec.oh, t.h_t), _ceil(spec.ow, t.w_t)
    n_ic = _ceil(g.cb, t.ic_t)
    tiles = g.nb * n_o * n_h * n_w
    khw = spec.kh * spec.kw
    rows_in = min(spec.h, (t.h_t - 1) * spec.strides[0] + spec.span_h)
    cols_in = min(spec.w, (t.w_t - 1) * spec.strides[1] + spec.span_w)
    dram, bus = DramModel(), cfg.bus_bytes
    read_row, write_row = dram.read_latency + 1, dram.write_latency + 1   # each DMA burst waits its latency
    burst = cfg.max_burst_beats * bus
    entries = t.o_t * t.h_t * t.w_t

    k_rd, k_wr = cfg.read_outstanding, cfg.write_outstanding

    def rows(n, row_bytes, latency, back_to_back=False, outstanding=k_rd):
        """One transfer of n rows (rows back to back in DRAM go as one row: CommandStream._one_row):
        its beats and a cycle per burst (its request), or when bursts are short the latency each
        `outstanding` of them wait together (the AXI master keeps that many in flight), then the
        last one's latency."""
        if back_to_back:
            n, row_bytes = 1, n * row_bytes
        bursts = n * _ceil(int(row_bytes), burst)
        return max(n * row_bytes / bus + bursts, latency * bursts / outstanding) + latency
    whole_rows = not any(spec.pads) and cols_in == spec.w and not t.gather   # the tile's input rows are whole rows
    inp_row = cols_in * cfg.inp_elem_bytes
    if t.gather:   # a LOAD of h_t rows of w_t pixels per tap
        inp_chunk = t.ic_t * khw * rows(t.h_t, t.w_t * cfg.inp_elem_bytes, read_row)
    elif whole_rows and t.ic_t > 1:   # one LOAD, all blocks
        inp_chunk = rows(t.ic_t, rows_in * inp_row, read_row)
    else:
        inp_chunk = t.ic_t * rows(rows_in, inp_row, read_row, whole_rows)
    wgt_chunk = rows(t.o_t, t.ic_t * khw * cfg.wgt_elem_bytes, read_row, n_ic == 1)   # one LOAD of o_t rows
    res_tile = (rows(t.o_t, t.h_t * t.w_t * cfg.inp_elem_bytes, read_row) if t.w_t == spec.ow
                else t.o_t * rows(t.h_t, t.w_t * cfg.inp_elem_bytes, read_row)) if residual else 0
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
    passes = (0 if linear_pixels(spec, t.h_t, t.w_t, t.gather) else 1) + min(tiles, t.vt + 2 * (tiles - full)) / tiles
    epilogue = passes * entries + t.o_t * cfg.acc_elem_bytes / bus + read_row + 3 * INSN_CYCLES
    store_tile = (rows(t.o_t, t.h_t * t.w_t * cfg.out_elem_bytes, write_row, False, k_wr) if t.w_t == spec.ow
                  else t.o_t * rows(t.h_t, t.w_t * cfg.out_elem_bytes, write_row, False, k_wr))
    compute_tile = gemm_tile + epilogue
    if t.vt > 1:   # the stages overlap, but not perfectly: the others cost a fraction beyond the slowest
        stages = (load_tile, compute_tile, store_tile)
        pace = max(stages) + OVERLAP_LOSS * (sum(stages) - max(stages))
        total = first_load + tiles * pace + epilogue + store_tile
    else:
        total = tiles * (load_tile + compute_tile + store_tile)
    inp_bytes = tiles * g.cb * (khw * t.h_t * t.w_t if t.gather else rows_in * cols_in) * cfg.inp_elem_bytes
    wgt_loads = g.nb * n_o if n_ic == 1 else tiles * n_ic
    wgt_bytes = wgt_loads * t.o_t * t.ic_t * khw * cfg.wgt_elem_bytes
    out_bytes = g.nb * g.ob * spec.oh * spec.ow * cfg.out_elem_bytes
    uops = g.nb * g.ob * g.cb * khw * spec.oh * spec.ow
    return {"gemm_uops": uops, "dram_bytes": inp_bytes + wgt_bytes + out_bytes, "cycles": total}


def dense_input_kept(row_blocks: int, in_blocks: int, cfg: AccelConfig, t: ConvTiling, residual: bool = False
                     ) -> bool:
    """Whether compiler.accel.dense keeps a dense layer's whole input on chip for every output-channel
    group: one chunk covers K, and every row block fits in the input buffer beside each slot's
    residual tile (always so with one row tile)."""
    if t.ic_t < in_blocks:
        return False
    return t.w_t >= row_blocks or row_blocks * in_blocks + t.vt * (t.w_t * t.o_t if residual else 0) <= cfg.inp_depth


#: cycles a dense tile (or input chunk) costs beyond its stages' transfers and micro-ops (the
#: token hand-offs between the stages, which small tiles do not hide); fitted on tsim (four read
#: bursts in flight) over 13 layers of bench/accel_dense.py: the picks average 5.23x the ideal at
#: 0, 5.01x at 10, 4.87x at 20, 4.88x at 40
DENSE_TILE_CYCLES = 20


def _estimate_dense(view: Conv2dSpec, cfg: AccelConfig, t: ConvTiling, residual: bool = False,
                    resident: bool = False) -> dict[str, float]:
    """estimate_cycles of a dense layer (given as its dense_view; t.w_t row blocks a tile) as
    compiler.accel.dense emits it: a tile's input is r rows of its chunk (one run when the chunk is
    all of K), a group's weights load once when one chunk covers K (else each chunk's, every tile),
    the last GEMM flushes and seeds, and the store writes r rows of the group's output blocks.
    resident: the weights are on chip already (a module's later runs): no weight loads."""
    g = _Geom.of(view, cfg)
    rows_b = view.w
    n_o, n_r, n_ic = _ceil(g.ob, t.o_t), _ceil(rows_b, t.w_t), _ceil(g.cb, t.ic_t)
    tiles = n_o * n_r
    dram, bus = DramModel(), cfg.bus_bytes
    read_row, write_row = dram.read_latency + 1, dram.write_latency + 1
    burst = cfg.max_burst_beats * bus

    def rows(n, row_bytes, latency, back_to_back=False, outstanding=1):
        """n rows of a transfer: their beats, or when bursts are short the latency each
        `outstanding` of them wait together (the AXI master keeps that many in flight), then the
        last one's latency."""
        if back_to_back:
            n, row_bytes = 1, n * row_bytes
        bursts = n * _ceil(int(row_bytes), burst)
        return max(n * row_bytes / bus, latency * bursts / outstanding) + latency
    k_rd, k_wr = cfg.read_outstanding, cfg.write_outstanding
    whole_k = t.ic_t >= g.cb
    inp_chunk = rows(t.w_t, t.ic_t * cfg.inp_elem_bytes, read_row, whole_k, k_rd)
    wgt_chunk = 0 if resident else rows(t.o_t, t.ic_t * cfg.wgt_elem_bytes, read_row, whole_k, k_rd)
    whole_o = t.o_t >= g.ob
    res_tile = rows(t.w_t, t.o_t * cfg.inp_elem_bytes, read_row, whole_o, k_rd) if residual else 0
    kept = dense_input_kept(rows_b, g.cb, cfg, t, residual)
    if n_ic == 1:   # resident weights (the next group's in pieces beside this one's tiles)
        load_tile = inp_chunk + CHUNK_CYCLES + res_tile + wgt_chunk / n_r
        # a kept input is read by the first group only: the later groups' tiles load no rows
        load_later = load_tile - (inp_chunk if kept else 0)
    else:
        load_tile = load_later = n_ic * (inp_chunk + wgt_chunk + CHUNK_CYCLES) + res_tile
    first_load = inp_chunk + wgt_chunk
    entries = t.o_t * t.w_t
    gemm_tile = entries * (g.cb + (1 if residual else 0)) + n_ic * (INSN_CYCLES + CHUNK_CYCLES)
    epilogue = min(tiles, t.vt) / tiles * entries + 3 * INSN_CYCLES
    store_tile = rows(t.w_t, t.o_t * cfg.out_elem_bytes, write_row, whole_o, k_wr)
    compute_tile = gemm_tile + epilogue
    if t.vt > 1 and n_ic > 1:   # chunks pipeline within a tile: each at the pace of its load or GEMM
        stages = (inp_chunk + wgt_chunk + CHUNK_CYCLES, entries * t.ic_t + INSN_CYCLES + CHUNK_CYCLES)
        chunk = max(stages) + OVERLAP_LOSS * min(stages) + DENSE_TILE_CYCLES   # a chunk hands off like a tile
        tile = max(n_ic * chunk + res_tile + epilogue, store_tile)
        total = first_load + tiles * tile + epilogue + store_tile
    elif t.vt > 1:   # the first group's tiles at their pace, the later groups' at theirs
        def pace(load):
            stages = (load, compute_tile, store_tile)
            return max(stages) + OVERLAP_LOSS * (sum(stages) - max(stages)) + DENSE_TILE_CYCLES
        total = first_load + n_r * pace(load_tile) + (tiles - n_r) * pace(load_later) + epilogue + store_tile
    else:
        total = n_r * load_tile + (tiles - n_r) * load_later + tiles * (compute_tile + store_tile)
    inp_bytes = (1 if kept else n_o) * rows_b * g.cb * cfg.inp_elem_bytes
    wgt_bytes = 0 if resident else (n_o if n_ic == 1 else tiles * n_ic) * t.o_t * t.ic_t * cfg.wgt_elem_bytes
    out_bytes = rows_b * g.ob * cfg.out_elem_bytes
    return {"gemm_uops": rows_b * g.ob * g.cb, "dram_bytes": inp_bytes + wgt_bytes + out_bytes, "cycles": total}


def conv2d_candidates(spec: Conv2dSpec, cfg: AccelConfig, vt: int = 2, residual: bool = False,
                      resident: bool = False) -> list[tuple[float, ConvTiling]]:
    """Every tiling that fits the buffers (for each o_t, ic_t, w_t every balanced h_t up to the
    tallest that fits: fewer rows can pace the stages better, e.g. a store-bound 1x1 layer), with its
    estimate_cycles cost, cheapest first; TilingError naming the short buffer if none fits.
    resident: a dense layer's cost with its weights already on chip (compiler.accel.dense)."""
    if vt not in (1, 2):
        raise TilingError(f"{spec.name}: virtual threads must be 1 or 2, got {vt}")
    dense = is_dense(spec)
    if dense:   # tiles stream row blocks: planned as the pixels of one image
        spec = dense_view(spec, cfg)
    # the estimate's constants are part of the key: bench/tiling_fit.py --grid varies them
    ranked = _ranked_tilings(dataclasses.replace(spec, name="conv2d"), cfg, vt, residual,
                             (INSN_CYCLES, CHUNK_CYCLES, OVERLAP_LOSS), dense, dense and resident)
    if not ranked:
        need = _needs(spec, ConvTiling(1, 1, 1, 1, vt, can_gather(spec)), residual)
        have = {"inp": cfg.inp_depth, "wgt": cfg.wgt_depth, "acc": cfg.acc_depth, "uop": cfg.uop_depth}
        short = [f"{k} buffer needs {need[k]} entries for the smallest tile, has {have[k]} (short by "
                 f"{need[k] - have[k]})" for k in need if need[k] > have[k]]
        raise TilingError(f"{spec.name}: cannot be tiled into the config with vt={vt}: " + "; ".join(short))
    return list(ranked)


@functools.lru_cache(maxsize=256)
def _ranked_tilings(spec: Conv2dSpec, cfg: AccelConfig, vt: int, residual: bool, _constants: tuple,
                    dense: bool = False, resident: bool = False) -> tuple[tuple[float, ConvTiling], ...]:
    """conv2d_candidates' search, once per layer shape: networks repeat shapes (MobileNetV2's 34
    accelerator layers have 19), and the search is most of the accelerator compile's time. dense:
    spec is a dense layer's dense_view, costed by _estimate_dense."""
    estimate = functools.partial(_estimate_dense, resident=resident) if dense else estimate_cycles
    g = _Geom.of(spec, cfg)

    def cands(n: int) -> list[int]:
        s = {n, 1}
        s.update(_ceil(n, k) for k in range(1, min(n, 64) + 1))
        return sorted(s)
    found: dict[ConvTiling, float] = {}
    heights = cands(spec.oh)
    gathers = (False, True) if can_gather(spec) else (False,)
    for o_t, ic_t, w_t, gather in itertools.product(cands(g.ob), cands(g.cb), cands(spec.ow), gathers):
        # the largest h_t that fits, found by bisection (needs grow with h_t)
        lo, hi = 0, spec.oh
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _fits(spec, cfg, ConvTiling(o_t, mid, w_t, ic_t, vt, gather), residual):
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            continue
        # balanced row tiles, up to the tallest that fits (itself, though cands() may not list it)
        for h_t in {h for h in heights if h <= lo} | {_ceil(spec.oh, _ceil(spec.oh, lo))}:
            t = ConvTiling(o_t, h_t, w_t, ic_t, vt, gather)
            found[t] = estimate(spec, cfg, t, residual)["cycles"]
    return tuple(sorted(((c, t) for t, c in found.items()), key=lambda ct: (ct[0], ct[1].describe())))


def plan_conv2d(spec: Conv2dSpec, cfg: AccelConfig, vt: int = 2, residual: bool = False) -> ConvTiling:
    """The cheapest tiling by estimate_cycles that fits every buffer (with room for a fused
    residual add when asked); TilingError if none does. compiler.accel.tune measures instead."""
    best = conv2d_candidates(spec, cfg, vt, residual)[0][1]
    log.debug("%s: tiling %s", spec.name, best.describe())
    return best


def input_resident(spec: Conv2dSpec, cfg: AccelConfig, t: ConvTiling) -> bool:
    """Whether every tile of this tiling reads the same input (one batch block, one tile of rows and
    columns, one input-channel chunk): then it is loaded once and the output-channel groups reuse it."""
    return (_ceil(spec.n, cfg.batch) == 1 and t.h_t >= spec.oh and t.w_t >= spec.ow
            and t.ic_t >= _ceil(spec.c, cfg.block_in))


def linear_pixels(spec: Conv2dSpec, h_a: int, w_a: int, gather: bool = False) -> bool:
    """Whether an h_a x w_a output tile's pixels, in row-major order, start their input windows at
    one stride (the tile's input rows are (w_a - 1) * sw + span_w entries wide): one loop level can
    then walk them (_build_gemm_by_block). True for 1x1 stride-1 convs and dense layers, one-row
    tiles, and gathered input tiles (a tap's band holds the tile's pixels in order)."""
    sh, sw = spec.strides
    return gather or h_a == 1 or sh * ((w_a - 1) * sw + spec.span_w) == w_a * sw


def plan_resident_weights(layers: dict[str, tuple[int, int]], wgt_depth: int, others_need: int = 0,
                          top: int | None = None) -> dict[str, int]:
    """Weight-buffer places for the layers whose weights stay on chip across inferences.

    layers: name -> (entries its whole weights take, entries its own tiling needs when they are not
    resident); others_need: entries every other program of the module loads weights into (from
    entry 0). Each resident entry saves one weight-tile load per inference, so the largest layers
    go first; they pack downward from below the last entry (a fused residual's identity tile; `top`:
    from below another entry, e.g. the accumulator's depth for resident biases), and every program
    that stays non-resident must still fit below them. Returns name -> base entry."""
    top = wgt_depth - 1 if top is None else top
    order = sorted(layers, key=lambda n: (-layers[n][0], n))
    chosen: set[str] = set()
    for _ in range(3):   # the reserve shrinks as layers are chosen: a later pass may fit more
        for name in order:
            size = layers[name][0]
            if name in chosen or size < 1:
                continue
            used = sum(layers[c][0] for c in chosen)
            reserve = max([others_need] + [layers[n][1] for n in layers if n not in chosen and n != name])
            if top - used - size >= reserve:
                chosen.add(name)
    bases, at = {}, top
    for name in order:
        if name in chosen:
            at -= layers[name][0]
            bases[name] = at
    return bases
