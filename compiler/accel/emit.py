"""The conv2d instruction stream: a layer is cut into output tiles (o_t channel blocks x h_t rows x
w_t columns), each summed over input-channel chunks of ic_t blocks. Per chunk the load stage brings
an input tile (the conv padding is folded into the LOAD's padding, never materialized in DRAM) and,
unless they stay resident for the whole output-channel tile, the weights; compute runs one GEMM
whose micro-ops enumerate (o, ic, kh, kw) and whose two affine loops walk output rows and columns;
the epilogue (bias add, shift, clip) runs on the ALU and the store stage writes int8 rows. With
virtual threads vt=2 the on-chip buffers are split in two slots and dependency tokens let the loads
of one tile and the stores of another overlap compute on a third. Dense layers go to
compiler.accel.dense."""
from __future__ import annotations

import logging

from accel.isa import AccelConfig, AluOp, MemType, Stage
from accel.isa.config import PAD_BITS, SIZE_BITS

from .dense import dense_loop_nest_text, emit_dense
from .epilogue import _operand_kernel, emit_requant, flush_params, set_requant_operand
from .pipeline import TokenPipeline
from .plan import _fits, input_resident, linear_pixels
from .spec import (
    PARAM_ENTRIES,
    Conv2dSpec,
    ConvTiling,
    Requant,
    ResidualAdd,
    TilingError,
    _ceil,
    _Geom,
    can_gather,
    input_entries,
    is_dense,
    weight_region_entries,
)

log = logging.getLogger(__name__)


def emit_conv2d(stream, spec: Conv2dSpec, tiling: ConvTiling, inp, wgt, out, bias=None,
                requant: Requant = Requant(), residual: ResidualAdd | None = None,
                channel_scales=None, region=None) -> dict[str, int]:
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
    fits (MOVs and seeds read it there), and so are channel_scales (SCALE reads them there). A tile starts its sums before it waits for its loads. On 1x1
    stride-1 layers the layer's first chunk and its last tile go in FILL_BANDS row bands with a token
    per band, so compute starts on the first band's input and the store drains the last tile band by
    band (the pipeline's fill and drain). A tile of whole unpadded rows moves all its channel blocks
    in one LOAD (its input chunk, its residual) and one STORE.
    region: a WeightRegion, the layer's weights resident across inferences at a fixed place of the
    weight buffer (a conv's group o0 at region.base + o0 * C/bi * kh * kw; one input chunk only),
    loaded there only with region.load (dense layers: emit_dense, which also keeps a bias).
    Returns counts (tiles, chunks) for reporting."""
    if is_dense(spec):   # rows streamed past resident weights
        return emit_dense(stream, spec, tiling, inp, wgt, out, bias, requant, residual, channel_scales, region)
    if region is not None:
        cfg = stream.cfg
        end = region.base + weight_region_entries(spec, cfg)
        if _ceil(_Geom.of(spec, cfg).cb, tiling.ic_t) != 1 or region.bias_base is not None:
            raise TilingError(f"{spec.name}: a conv keeps its weights across inferences with one input-channel "
                              f"chunk and its bias loaded every run (tiling {tiling.describe()})")
        if region.base < 0 or end > cfg.wgt_depth - 1:
            raise TilingError(f"{spec.name}: resident weights at entries {region.base}..{end - 1} leave the weight "
                              f"buffer (0..{cfg.wgt_depth - 2}, entry {cfg.wgt_depth - 1} is the residual identity's)")
    cfg, t = stream.cfg, tiling
    g = _Geom.of(spec, cfg)
    sh, sw = spec.strides
    pt, _, pl, _ = spec.pads
    khw = spec.kh * spec.kw
    S = t.vt
    dh, dw = spec.dilations
    if t.gather and not can_gather(spec):
        raise TilingError(f"{spec.name}: a gathered input tile needs a dilated kernel with column stride 1 "
                          f"(dilations {spec.dilations}, strides {spec.strides})")
    # input chunks rotate through S slots; a fused residual's tiles through S regions past them (one a
    # tile slot), so that a tile's residual can come in pieces beside its chunks, not all at its end
    inp_slot, wgt_slot = t.ic_t * input_entries(spec, t), t.o_t * t.ic_t * khw
    res_slot = t.o_t * t.h_t * t.w_t
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
    bias_all = S * acc_slot if bias is not None and S * acc_slot + g.ob <= cfg.acc_depth else None
    # per-channel SCALE operands likewise, past the biases: else each tile loads its own into its bias
    # entries, a compute-stage read that waits behind the load stage's bursts
    scales_end = S * acc_slot + (g.ob if bias_all is not None else 0)
    scales_all = scales_end if channel_scales is not None and scales_end + g.ob <= cfg.acc_depth else None
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
    # a kernel taller than one row with one chunk keeps its weights kernel row by kernel row ([y][o][ic][x]:
    # one LOAD a row, the chunk's rows at one stride), so that the layer's first chunk goes in kh pieces,
    # a GEMM and a token each: compute starts on the first kernel row's weights (the pipeline's fill)
    # (only where a kernel row's GEMM is long enough to pay for its instructions: not a global pool's
    # one pixel a window)
    by_rows = (spec.kh > 1 and n_ic == 1 and spec.kh <= cfg.dep_queue_depth - 2
               and t.o_t * t.ic_t * spec.kw * min(t.h_t, spec.oh) * min(t.w_t, spec.ow) >= BY_ROWS_MIN_UOPS)

    tiles = [(n, o0, h0, w0) for n in range(g.nb) for o0 in range(0, g.ob, t.o_t)
             for h0 in range(0, spec.oh, t.h_t) for w0 in range(0, spec.ow, t.w_t)]

    def shape(i):   # channel blocks, rows and columns of tile i (smaller at the edges)
        _, o0, h0, w0 = tiles[i]
        return min(t.o_t, g.ob - o0), min(t.h_t, spec.oh - h0), min(t.w_t, spec.ow - w0)
    n_loads = len(tiles) * n_ic
    pipe = TokenPipeline(stream, S, n_loads, len(tiles))
    if bias_all is not None:
        stream.load_2d(MemType.ACC, bias_all, bias, 0, y_size=1, x_size=g.ob)
    if scales_all is not None:
        stream.load_2d(MemType.ACC, scales_all, channel_scales, 0, y_size=1, x_size=g.ob)
    j = 0  # load/compute iteration (one input-channel chunk of one tile)
    group, last_group = -1, None
    for ti, (n, o0, h0, w0) in enumerate(tiles):
        o_a, h_a, w_a = shape(ti)
        acc_base = (ti % S) * acc_slot
        bias_base = acc_base + t.o_t * t.h_t * t.w_t
        param_base = bias_base + t.o_t   # REQUANT operands, set when the slot is first used
        r0, c0 = h0 * sh - pt, w0 * sw - pl
        rows, cols = (h_a - 1) * sh + spec.span_h, (w_a - 1) * sw + spec.span_w
        y0, y1 = max(r0, 0), min(r0 + rows, spec.h)
        x0, x1 = max(c0, 0), min(c0 + cols, spec.w)
        # padding above/left of the image rows/cols the tile reads, then below/right; a tile may lie
        # wholly in the padding (pads wider than the kernel reaches), then it loads only zeros
        yp0, xp0 = min(y0 - r0, rows), min(x0 - c0, cols)
        yp1, xp1 = rows - yp0 - max(0, y1 - y0), cols - xp0 - max(0, x1 - x0)
        # an input block's entries, and where tap (y, x) of the tile's first pixel reads: in its window
        # (y * dh rows and x * dw columns on, pixels sw apart), or at the start of the tap's band
        plane = input_entries(spec, t, h_a, w_a)
        steps = (1, plane, spec.kw * h_a * w_a, h_a * w_a) if t.gather else (sw, plane, dh * cols, dw)
        row_step = w_a if t.gather else sh * cols   # from one output row's first window to the next's
        if (n, o0) != last_group:
            group, last_group = group + 1, (n, o0)
            new_group = True
        else:
            new_group = False
        linear = linear_pixels(spec, h_a, w_a, t.gather)
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
            if region is not None:   # the group's weights at their place for every inference
                wgt_base = region.base + o0 * g.cb * khw
            # weights load with a group's first tile (a resident place: the first batch block's, first run only)
            load_w = (region.load and n == 0 and new_group) if region is not None else (new_group or not resident)
            res_base = S * inp_slot + (ti % S) * res_slot   # a fused residual's tile

            def gemm_by_block(band=None, taps=None):   # the chunk's GEMM over (block, pixel); band: pixels p0..p1-1
                return stream.kernel(
                    ("conv.gemm_by_block", o_a, ic_a, spec.kh, spec.kw, h_a * w_a, steps, inp_base, wgt_base,
                     acc_base, band, by_rows, taps),
                    lambda k: _build_gemm_by_block(k, o_a, ic_a, spec.kh, spec.kw, h_a * w_a, steps, inp_base,
                                                   wgt_base, acc_base, band, by_rows, taps))

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
                if load_w:
                    stream.load_2d(MemType.WGT, wgt_base, wgt, (o0 * g.cb + ic0) * khw,
                                   y_size=o_a, x_size=ic_a * khw, x_stride=g.cb * khw)
                if residual is not None and j == 0:
                    stream.load_2d(MemType.WGT, ident_idx, residual.ident, 0, x_size=1)
                for b, (a, z) in enumerate(load_bands):
                    for ic in range(ic_a):
                        entry = ((n * g.cb + ic0 + ic) * spec.h + y0 + a) * spec.w + x0
                        stream.load_2d(MemType.INP, inp_base + ic * plane + a * cols, inp, entry,
                                       y_size=z - a, x_size=cols, x_stride=spec.w)
                    if residual is not None and last_chunk:
                        for o in range(o_a):
                            entry = ((n * g.ob + o0 + o) * spec.oh + h0 + a) * spec.ow + w0
                            stream.load_2d(MemType.INP, res_base + o * h_a * w_a + a * w_a, residual.buf, entry,
                                           y_size=z - a, x_size=w_a, x_stride=spec.ow)
                    if b < len(load_bands) - 1:
                        stream.dep_push(Stage.LOAD, Stage.COMPUTE)
            else:
                if t.gather:   # a band per tap: the rows and columns it reads for the tile's pixels
                    for ic in range(0 if inp_resident and j else ic_a):
                        _load_bands(stream, spec, inp, inp_base + ic * plane, n * g.cb + ic0 + ic, h0, w0, h_a, w_a)
                elif (not (inp_resident and j) and ic_a > 1 and cols == spec.w and not (yp0 or yp1 or xp0 or xp1)
                        and rows * cols < 1 << SIZE_BITS):   # whole unpadded rows: every channel block in one LOAD
                    entry = ((n * g.cb + ic0) * spec.h + y0) * spec.w
                    stream.load_2d(MemType.INP, inp_base, inp, entry, y_size=ic_a, x_size=rows * cols,
                                   x_stride=spec.h * spec.w)
                else:
                    for ic in range(0 if inp_resident and j else ic_a):
                        entry = ((n * g.cb + ic0 + ic) * spec.h + y0) * spec.w + x0
                        load_padded(stream, MemType.INP, inp_base + ic * plane, inp, entry,
                                    max(0, y1 - y0), max(0, x1 - x0), spec.w, (yp0, yp1, xp0, xp1))
                if load_w and by_rows:   # kernel row by kernel row; the first chunk's
                    for y in range(spec.kh):                 # rows each with a token (split_taps)
                        stream.load_2d(MemType.WGT, wgt_base + y * o_a * ic_a * spec.kw, wgt,
                                       (o0 * g.cb + ic0) * khw + y * spec.kw, y_size=o_a * ic_a, x_size=spec.kw,
                                       x_stride=khw)
                        if j == 0 and y < spec.kh - 1:
                            stream.dep_push(Stage.LOAD, Stage.COMPUTE)
                elif load_w:
                    stream.load_2d(MemType.WGT, wgt_base, wgt, (o0 * g.cb + ic0) * khw,
                                   y_size=o_a, x_size=ic_a * khw, x_stride=g.cb * khw)
                if residual is not None:
                    if j == 0:
                        stream.load_2d(MemType.WGT, ident_idx, residual.ident, 0, x_size=1)
                    if n_ic == 1 and blocks_in_one(h_a):
                        stream.load_2d(MemType.INP, res_base, residual.buf, ((n * g.ob + o0) * spec.oh + h0) * spec.ow,
                                       y_size=o_a, x_size=h_a * w_a, x_stride=spec.oh * spec.ow)
                    elif n_ic == 1:
                        for o in range(o_a):
                            entry = ((n * g.ob + o0 + o) * spec.oh + h0) * spec.ow + w0
                            stream.load_2d(MemType.INP, res_base + o * h_a * w_a, residual.buf, entry,
                                           y_size=h_a, x_size=w_a, x_stride=spec.ow)
            new_group = False
            pipe.after_load()
            if residual is not None and not last_chunk:
                # with several chunks the residual comes in pieces (its rows, block by block), one after
                # each chunk but the last: the load stage moves them while it waits for the next slot,
                # and the last chunk's token covers them (one piece at the tile's end would stall compute)
                u0, u1 = o_a * h_a * ci // (n_ic - 1), o_a * h_a * (ci + 1) // (n_ic - 1)
                for o in range(u0 // h_a, _ceil(u1, h_a)):
                    a, z = max(u0 - o * h_a, 0), min(u1 - o * h_a, h_a)
                    entry = ((n * g.ob + o0 + o) * spec.oh + h0 + a) * spec.ow + w0
                    stream.load_2d(MemType.INP, res_base + (o * h_a + a) * w_a, residual.buf, entry,
                                   y_size=z - a, x_size=w_a, x_stride=spec.ow)
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
            # the layer's first chunk with weights by kernel row: a GEMM per row, each on its own token
            split_taps = ([(y, y + 1) for y in range(spec.kh)] if by_rows and j == 0 and (region is None or region.load)
                          else [None])
            for p, taps in enumerate(split_taps):
                final = p == len(split_taps) - 1
                if p:
                    stream.dep_pop(Stage.LOAD, Stage.COMPUTE)
                if fused or conv_in_gemm:
                    if final and last_chunk and fused:
                        stream.push_epilogue(flush, seed_next(), seed_factor_out=1)
                    elif final and last_chunk:
                        stream.push_epilogue(conv_to_acc, to_acc=True)
                    stream.push_gemm(gemm_by_block(taps=taps), flush=last_chunk and final)
                else:
                    stream.push_gemm(stream.kernel(
                        ("conv.gemm", o_a, ic_a, spec.kh, spec.kw, h_a, w_a, row_step, steps, inp_base, wgt_base,
                         acc_base, by_rows, taps),
                        lambda k, taps=taps: _build_gemm(k, o_a, ic_a, spec.kh, spec.kw, h_a, w_a, row_step, steps,
                                                         inp_base, wgt_base, acc_base, by_rows, taps)))
            if not (residual is not None and last_chunk):
                pipe.after_chunk(j)  # with a residual, the slot is released after the residual GEMM
            j += 1
        # ---- epilogue on the accumulator tile (a banded tile's was its GEMMs)
        if not tail_banded and (flush is None or residual is not None):
            ew = _tile_kernel(stream, "ew", acc_base, o_a, h_a, w_a)
            if channel_scales is not None:  # one SCALE operand per channel block
                if scales_all is None:   # into the bias entries, free again
                    stream.load_2d(MemType.ACC, bias_base, channel_scales, o0, y_size=1, x_size=o_a)
                src = bias_base if scales_all is None else scales_all + o0
                stream.push_alu(_bias_kernel(stream, acc_base, src, o_a, h_a * w_a), AluOp.SCALE)
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


def _load_bands(stream, spec: Conv2dSpec, inp, base: int, block: int, h0: int, w0: int, h_a: int, w_a: int) -> None:
    """A gathered input tile's block (ConvTiling.gather): for each tap (y, x), the h_a x w_a input
    pixels it reads for output rows h0.. and columns w0.. (rows sh apart, so one strided LOAD),
    in tap order from `base`; those outside the image are padding. block: the (batch block, channel
    block) plane of the packed input it reads."""
    sh = spec.strides[0]
    dh, dw = spec.dilations
    pt, _, pl, _ = spec.pads
    for y in range(spec.kh):
        r = [(h0 + i) * sh + y * dh - pt for i in range(h_a)]   # the input row of each output row
        ra = sum(1 for v in r if v < 0)
        rb = h_a - sum(1 for v in r if v >= spec.h)
        for x in range(spec.kw):
            c0 = w0 + x * dw - pl   # the input column of the first output column (column stride 1)
            ca, cb = min(max(-c0, 0), w_a), max(min(spec.w - c0, w_a), 0)
            rows, cols = max(rb - ra, 0), max(cb - ca, 0)
            dst = base + (y * spec.kw + x) * h_a * w_a
            if not (rows and cols):
                zero_fill(stream, MemType.INP, dst, h_a * w_a, inp)
                continue
            entry = (block * spec.h + r[ra]) * spec.w + c0 + ca
            load_padded(stream, MemType.INP, dst, inp, entry, rows, cols, sh * spec.w,
                        (ra, h_a - rb, ca, w_a - cb))


#: the most padding one LOAD writes on each side (its padding fields' width)
PAD_MAX = (1 << PAD_BITS) - 1


def load_padded(stream, mem, base: int, src, entry: int, y_size: int, x_size: int, x_stride: int,
                pads: tuple[int, int, int, int]) -> None:
    """LOAD a y_size x x_size tile surrounded by pads (top, bottom, left, right) of zeros into the
    buffer from `base` on, row-major, padding included: one LOAD where every pad fits its field;
    wider pads (a dilated conv's) as data rows between runs of zeros (zero_fill)."""
    yp0, yp1, xp0, xp1 = pads
    width = xp0 + x_size + xp1
    if max(pads) <= PAD_MAX:
        stream.load_2d(mem, base, src, entry, y_size=y_size, x_size=x_size, x_stride=x_stride,
                       y_pad0=yp0, y_pad1=yp1, x_pad0=xp0, x_pad1=xp1)
        return
    if not (y_size and x_size):   # padding only
        zero_fill(stream, mem, base, (yp0 + y_size + yp1) * width, src)
        return
    if max(xp0, xp1) <= PAD_MAX:   # the data rows in one LOAD, the zero rows beyond its fields apart
        top, bottom = (0 if yp0 <= PAD_MAX else yp0), (0 if yp1 <= PAD_MAX else yp1)
        zero_fill(stream, mem, base, top * width, src)
        stream.load_2d(mem, base + top * width, src, entry, y_size=y_size, x_size=x_size, x_stride=x_stride,
                       y_pad0=yp0 - top, y_pad1=yp1 - bottom, x_pad0=xp0, x_pad1=xp1)
        zero_fill(stream, mem, base + (yp0 + y_size + yp1 - bottom) * width, bottom * width, src)
        return
    at = base + yp0 * width + xp0   # row by row: a row's right padding and the next row's left are one run
    zero_fill(stream, mem, base, yp0 * width + xp0, src)
    for r in range(y_size):
        stream.load_2d(mem, at, src, entry + r * x_stride, y_size=1, x_size=x_size)
        last = r == y_size - 1
        zero_fill(stream, mem, at + x_size, xp1 + (yp1 * width if last else xp0), src)
        at += width


def zero_fill(stream, mem, base: int, n: int, src) -> None:
    """Zero n consecutive buffer entries from `base` with LOADs that read no DRAM (padding only)."""
    row = 2 * PAD_MAX   # one row of padding: x_pad0 + x_pad1
    while n > 0:
        q, rest = divmod(n, row)
        if q:
            y = min(q, PAD_MAX)
            stream.load_2d(mem, base, src, 0, y_size=0, x_size=0, y_pad0=y, x_pad0=PAD_MAX, x_pad1=PAD_MAX)
            base, n = base + y * row, n - y * row
        else:
            stream.load_2d(mem, base, src, 0, y_size=0, x_size=0, y_pad0=1, x_pad0=min(rest, PAD_MAX),
                           x_pad1=rest - min(rest, PAD_MAX))
            base, n = base + rest, n - rest


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


def _wgt_index(o, ic, y, x, o_a, ic_a, kh, kw, by_rows):
    """A weight's buffer entry in a chunk's slot: [o][ic][y][x], or with by_rows [y][o][ic][x]."""
    return ((y * o_a + o) * ic_a + ic) * kw + x if by_rows else ((o * ic_a + ic) * kh + y) * kw + x


def _build_gemm(k, o_a, ic_a, kh, kw, h_a, w_a, row_step, steps, inp_base, wgt_base, acc_base, by_rows=False,
                taps=None):
    """The chunk's GEMM: loops over output rows (their windows row_step entries apart) and columns,
    micro-ops over (o, ic, kernel row, x); taps=(y0, y1): only kernel rows y0..y1-1 (the first
    chunk's pieces). steps: (pixel, input block, kernel row, kernel column) input strides."""
    px, ic_step, y_step, x_step = steps
    k.loop_begin(h_a, dst_factor=w_a, src_factor=row_step)
    k.loop_begin(w_a, dst_factor=1, src_factor=px)
    for o in range(o_a):
        for ic in range(ic_a):
            for y in range(*(taps or (0, kh))):
                for x in range(kw):
                    k.push(acc_base + o * h_a * w_a, inp_base + ic * ic_step + y * y_step + x * x_step,
                           wgt_base + _wgt_index(o, ic, y, x, o_a, ic_a, kh, kw, by_rows))
    k.loop_end()
    k.loop_end()


#: micro-ops a kernel row's GEMM of the first tile needs for the first chunk to go kernel row by row
BY_ROWS_MIN_UOPS = 64


#: row bands the first and last tiles of a layer split into (where every step of theirs is a GEMM),
#: so that compute starts on the first band's input and the store drains the last tile band by band
#: (4 over 2: MobileNetV2 -1041 tsim cycles, SqueezeNet -483, ResNet-18 unchanged; more bands add
#: instructions faster than they shorten the fill)
FILL_BANDS = 4


def _row_bands(h: int, n: int) -> list[tuple[int, int]]:
    """n (at most h) contiguous row ranges covering 0..h-1, as even as can be."""
    n = max(1, min(n, h))
    return [(h * b // n, h * (b + 1) // n) for b in range(n)]


def _build_gemm_by_block(k, o_a, ic_a, kh, kw, pixels, steps, inp_base, wgt_base, acc_base,
                         band=None, by_rows=False, taps=None):
    """GEMM loops over (output-channel block, pixel), micro-ops over (input channel, tap): each pass
    is one output entry's whole sum (what a flushing GEMM needs). Pixels at one input stride only.
    band=(p0, p1): only the tile's pixels p0..p1-1 (a band of a tile split for the pipeline's fill
    and drain). steps: (pixel, input block, kernel row, kernel column) input strides."""
    px, ic_step, y_step, x_step = steps
    p0, p1 = band or (0, pixels)
    k.loop_begin(o_a, dst_factor=pixels, src_factor=0, wgt_factor=ic_a * (kw if by_rows else kh * kw))
    k.loop_begin(p1 - p0, dst_factor=1, src_factor=px)
    for ic in range(ic_a):
        for y in range(*(taps or (0, kh))):
            for x in range(kw):
                k.push(acc_base + p0, inp_base + p0 * px + ic * ic_step + y * y_step + x * x_step,
                       wgt_base + _wgt_index(0, ic, y, x, o_a, ic_a, kh, kw, by_rows))
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


def loop_nest_text(spec: Conv2dSpec, tiling: ConvTiling, cfg: AccelConfig, requant: Requant = Requant(),
                   bias: bool = True) -> str:
    """The lowered loop nest emit_conv2d walks, as readable pseudo-IR: tile loops, the DMA and GEMM/ALU
    intrinsics each iteration issues, buffer slots and token operations."""
    if is_dense(spec):
        return dense_loop_nest_text(spec, tiling, cfg, requant, bias)
    g, t = _Geom.of(spec, cfg), tiling
    sh, sw = spec.strides
    dh, dw = spec.dilations
    n_ic = _ceil(g.cb, t.ic_t)
    resident = n_ic == 1
    S = t.vt
    init = "dma_load acc[bias]; alu.mov(acc[tile], acc[bias])" if bias else "gemm.reset(acc[tile])"
    ep = [f"alu.shr(acc[tile], imm={requant.shift})"] if requant.shift else []
    ep += ([f"alu.clip(acc[tile], imm={requant.hi})"] if requant.lo == -requant.hi else
           [f"alu.clamp(acc[tile], lo={requant.lo}, hi={requant.hi})"] if -128 <= requant.lo <= requant.hi <= 127 else
           [f"alu.min(acc[tile], imm={requant.hi})", f"alu.max(acc[tile], imm={requant.lo})"])
    L = [f"// {spec.name}: N={spec.n} C={spec.c} H={spec.h} W={spec.w} -> O={spec.o} OH={spec.oh} OW={spec.ow}, "
         f"kernel {spec.kh}x{spec.kw}, strides {spec.strides}, pads {spec.pads}"
         + (f", dilations {spec.dilations}" if spec.dilations != (1, 1) else ""),
         f"// blocked: {g.nb} batch x {g.cb} in x {g.ob} out blocks of {cfg.batch}x{cfg.block_in}x{cfg.block_out}; "
         f"tiling {t.describe()}",
         f"// buffers per slot: inp_buffer {t.ic_t * input_entries(spec, t)} entries, wgt_buffer {t.o_t * t.ic_t * spec.kh * spec.kw}, "
         f"acc_buffer {t.o_t * t.h_t * t.w_t} (+{t.o_t} bias); {S} slot(s)",
         f"for n in range({g.nb}):",
         f"  for o0 in range(0, {g.ob}, {t.o_t}):            // o_a = min({t.o_t}, {g.ob} - o0)",
         f"    for h0 in range(0, {spec.oh}, {t.h_t}):        // h_a = min({t.h_t}, {spec.oh} - h0)",
         f"      for w0 in range(0, {spec.ow}, {t.w_t}):      // w_a = min({t.w_t}, {spec.ow} - w0); tile ti, slot ti % {S}",
         f"        for ic0 in range(0, {g.cb}, {t.ic_t}):    // iteration j, slot j % {S}",
         f"          load:    [pop compute->load if j >= {S}]",
         (f"                   for ic in range(ic_a): for (kh, kw) in taps: dma_load inp[n, ic0+ic, "
          f"(h0 .. +h_a)*{sh}+kh*{dh}-{spec.pads[0]}, w0+kw*{dw}-{spec.pads[2]} .. +w_a] -> inp_buffer[slot][tap] "
          f"(a band per tap; out-of-image rows/cols as LOAD padding)" if t.gather else
          f"                   for ic in range(ic_a): dma_load inp[n, ic0+ic, h0*{sh}-{spec.pads[0]} .. +rows, "
          f"w0*{sw}-{spec.pads[2]} .. +cols] -> inp_buffer[slot] (out-of-image rows/cols as LOAD padding)"),
         f"                   {'if first tile of (n, o0): ' if resident else ''}dma_load wgt[o0 .. +o_a, ic0 .. +ic_a, :, :]"
         f" -> wgt_buffer[{'o-tile % ' + str(S) if resident else 'slot'}]; push load->compute",
         f"          compute: pop load->compute; if ic0 == 0: [pop store->compute if ti >= {S}]; {init}",
         "                   gemm: for oh in range(h_a): for ow in range(w_a):  // the two affine loop levels",
         ("                           uops (o, ic, kh, kw): acc[o, oh, ow] += inp[ic][kh, kw][oh, ow] . "
          if t.gather else
          f"                           uops (o, ic, kh, kw): acc[o, oh, ow] += inp[ic, oh*{sh}+kh{f'*{dh}' if dh > 1 else ''}, "
          f"ow*{sw}+kw{f'*{dw}' if dw > 1 else ''}] . ")
         + f"wgt[o, ic, kh, kw]   // {t.o_t * t.ic_t * spec.kh * spec.kw} uops",
         f"                   [push compute->load if j + {S} < iterations]",
         f"        compute: {'; '.join(ep)}; push compute->store",
         f"        store:   pop compute->store; for o in range(o_a): dma_store acc[o] -> out[n, o0+o, h0 .. +h_a, "
         f"w0 .. +w_a]; [push store->compute if ti + {S} < tiles]",
         "finish: pop store->compute"]
    return "\n".join(L) + "\n"
