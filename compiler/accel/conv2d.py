"""conv2d and dense layers on the accelerator, from the host: run_conv2d / run_dense pack the
operands, emit the layer and unpack the result; numpy references define the results. The layer's
parts live in their own modules, re-exported here for the callers that name this one:

    spec.py      Conv2dSpec, ConvTiling, Requant, ResidualAdd: what a layer is
    plan.py      what a tiling needs and costs; plan_conv2d picks the cheapest that fits
    emit.py      emit_conv2d: the conv's instruction stream (dense layers go to dense.py)
    dense.py     emit_dense: resident weight tiles, rows streamed past them
    epilogue.py  requantization on the accumulator (REQUANT, SCALE, FLUSH, ALU passes)

Beside them (not re-exported): grouped.py, grouped and depthwise convs as emit_conv2d calls over
channel slices or per-block input windows of the same buffers (run_grouped_conv2d).
"""
from __future__ import annotations

import numpy as np

from ..graph.ops import shift_right_round
from .emit import FILL_BANDS, emit_conv2d, loop_nest_text
from .epilogue import channel_scale_operands, emit_requant, flush_params, requant_operand, set_requant_operand
from .layout import pack_activation, pack_bias, pack_weight, unpack_activation
from .plan import (
    CHUNK_CYCLES,
    INSN_CYCLES,
    OVERLAP_LOSS,
    _fits,
    _needs,
    _ranked_tilings,
    conv2d_candidates,
    estimate_cycles,
    input_resident,
    linear_pixels,
    plan_conv2d,
)
from .spec import (
    PARAM_ENTRIES,
    Conv2dSpec,
    ConvTiling,
    Requant,
    ResidualAdd,
    TilingError,
    _ceil,
    _Geom,
    int_conv2d,
    is_dense,
    residual_identity,
)

__all__ = ["CHUNK_CYCLES", "FILL_BANDS", "INSN_CYCLES", "OVERLAP_LOSS", "PARAM_ENTRIES", "Conv2dSpec",
           "ConvTiling", "Requant", "ResidualAdd", "TilingError", "_Geom", "_ceil", "_fits", "_needs",
           "_ranked_tilings", "channel_scale_operands", "conv2d_candidates", "conv2d_reference",
           "dense_reference", "emit_conv2d", "emit_requant", "estimate_cycles", "flush_params", "input_resident",
           "int_conv2d", "is_dense", "linear_pixels", "loop_nest_text", "plan_conv2d", "requant_operand", "residual_identity",
           "run_conv2d", "run_dense", "set_requant_operand"]


def conv2d_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, spec: Conv2dSpec,
                     requant: Requant = Requant(), channel_muls: tuple[np.ndarray, int] | None = None) -> np.ndarray:
    """numpy int reference: NCHW int8 x OIHW int8 (+ int32 bias) -> requantized int8 NCHW, with the
    accumulator's int32 wraparound; channel_muls (multipliers, shift): per-channel fixed point
    (round_half_up(acc * m_c * 2^-shift)) before requant's clamp."""
    acc = int_conv2d(x, w, spec).astype(np.int32)  # wrap like the accumulator
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
              vt: int = 2):
    """int8 (rows x k) @ int8 weights (m x k, as ONNX Gemm with transB) -> (int8 rows x m, RunResult, stream).

    Runs as networks run it: a 1x1 conv over rows 1x1 images (spec.is_dense, emitted by
    compiler.accel.dense with the rows streamed past resident weights)."""
    rows, k = x.shape
    m = w.shape[0]
    spec = Conv2dSpec(n=rows, c=k, h=1, w=1, o=m, kh=1, kw=1, name="dense")
    y, result, stream = run_conv2d(device, x[:, :, None, None], w.reshape(m, k, 1, 1), bias, spec, requant, vt)
    return y[:, :, 0, 0], result, stream


def dense_reference(x, w, bias, requant: Requant = Requant()) -> np.ndarray:
    acc = (x.astype(np.int64) @ w.astype(np.int64).T).astype(np.int32)
    if bias is not None:
        acc = (acc.astype(np.int64) + bias.astype(np.int64)).astype(np.int32)
    return requant.apply(acc).astype(np.int8)
