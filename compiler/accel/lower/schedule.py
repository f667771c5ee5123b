"""conv2d (and dense, as a 1x1 conv) for the accelerator as tensor expressions and a schedule.

compute: packed input (N/b, C/bi, H, W, b, bi) int8 -> zero-padded view (inlined) -> conv
(N/b, O/bo, OH, OW, b, bo) int32 summed over (C/bi, KH, KW, bi) -> epilogue stages (bias add,
rounding add, shift, clip) -> cast to the output dtype. schedule (VTA's recipe): tile the output
with the factors plan_conv2d chose, one tile axis split off as a virtual thread when vt=2;
cache_read the input and weights into inp_buffer/wgt_buffer per input-channel chunk, the bias
into acc_buffer per tile; the conv and epilogue stages live in acc_buffer; pragma dma_copy on
copy stages, pragma alu on epilogue stages, tensorize the (b, bo, bi) GEMM.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ... import te
from ...te.schedule import Schedule
from ...te.tensor import Tensor
from ..spec import Conv2dSpec, ConvTiling, Requant, TilingError, _ceil
from .env import ACC_SCOPE, INP_SCOPE, WGT_SCOPE, AccelEnv

DMA_COPY = "dma_copy"
ALU = "alu"


@dataclass
class Conv2dTE:
    """The tensors of one conv2d: args in call order, and the stages the schedule needs."""
    data: Tensor
    kernel: Tensor
    bias: Tensor | None
    res: Tensor
    data_pad: Tensor | None
    conv: Tensor
    epilogue: list[Tensor] = field(default_factory=list)

    @property
    def args(self) -> list[Tensor]:
        return [self.data, self.kernel] + ([self.bias] if self.bias is not None else []) + [self.res]


def conv2d_compute(env: AccelEnv, spec: Conv2dSpec, requant: Requant = Requant(), bias: bool = True) -> Conv2dTE:
    """Tensor expressions of a packed conv2d with its requantizing epilogue (shift requantization;
    the fixed-point multiplier is the template's, compiler.accel.conv2d)."""
    if requant.fixed_point:
        raise TilingError(f"{spec.name}: the TE lowering requantizes by shifts only; a fixed-point "
                          f"multiplier needs compiler.accel.conv2d")
    b, bi, bo = env.batch, env.block_in, env.block_out
    nb, cb, ob = _ceil(spec.n, b), _ceil(spec.c, bi), _ceil(spec.o, bo)
    pt, pb, pl, pr = spec.pads
    sh, sw = spec.strides
    data = te.placeholder((nb, cb, spec.h, spec.w, b, bi), env.inp_dtype, "data")
    kernel = te.placeholder((ob, cb, spec.kh, spec.kw, bo, bi), env.wgt_dtype, "kernel")
    src, data_pad = data, None
    if any(spec.pads):
        h, w = spec.h, spec.w
        zero = te.const(0, env.inp_dtype)
        data_pad = te.compute(
            (nb, cb, h + pt + pb, w + pl + pr, b, bi),
            lambda n, c, y, x, i, j: te.if_then_else(te.all(y >= pt, y < h + pt, x >= pl, x < w + pl),
                                                     data[n, c, y - pt, x - pl, i, j], zero), name="data_pad")
        src = data_pad
    ic = te.reduce_axis(cb, "ic")
    dy = te.reduce_axis(spec.kh, "dy")
    dx = te.reduce_axis(spec.kw, "dx")
    k = te.reduce_axis(bi, "ic_tns")
    acc = env.acc_dtype
    conv = te.compute(
        (nb, ob, spec.oh, spec.ow, b, bo),
        lambda n, o, y, x, i, j: te.sum(src[n, ic, y * sh + dy, x * sw + dx, i, k].astype(acc) *
                                        kernel[o, ic, dy, dx, j, k].astype(acc), axis=[ic, dy, dx, k]),
        name="conv")
    shape = conv.shape

    def stage(name, f, prev):
        return te.compute(shape, lambda *i: f(prev[i], i), name=name)
    t, epilogue, bias_t = conv, [], None
    if bias:
        bias_t = te.placeholder((ob, b, bo), acc, "bias")
        t = stage("bias_add", lambda v, i: v + bias_t[i[1], i[4], i[5]], t)
        epilogue.append(t)
    if requant.round and requant.shift > 0:
        half = te.const(1 << (requant.shift - 1), acc)
        t = stage("round", lambda v, i: v + half, t)
        epilogue.append(t)
    if requant.shift > 0:
        t = stage("shr", lambda v, i: v >> te.const(requant.shift, acc), t)
        epilogue.append(t)
    elif requant.shift < 0:
        t = stage("shl", lambda v, i: v << te.const(-requant.shift, acc), t)
        epilogue.append(t)
    lo, hi = te.const(requant.lo, acc), te.const(requant.hi, acc)
    t = stage("clip", lambda v, i: te.elem_max(te.elem_min(v, hi), lo), t)
    epilogue.append(t)
    res = te.compute(shape, lambda *i: t[i].astype(env.out_dtype), name="res")
    return Conv2dTE(data, kernel, bias_t, res, data_pad, conv, epilogue)


def _vthread_axis(s, stage, tiles: list, vt: int):
    """Split the tile axis with the most tiles into (outer, 2) and bind the inner part to a
    virtual thread; returns the new tile axes (the last one is where tile stages attach)."""
    counts = [c for _, c in tiles]
    if vt == 1 or max(counts) < 2:
        return [a for a, _ in tiles]
    k = max(range(len(tiles)), key=lambda i: (counts[i] % 2 == 0, counts[i], i))
    outer, inner = s[stage].split(tiles[k][0], factor=vt)
    s[stage].bind(inner, te.thread_axis((0, vt), "vthread", name="vthread"))
    axes = [a for a, _ in tiles]
    axes[k] = outer
    return axes + [inner]


def schedule_conv2d(env: AccelEnv, spec: Conv2dSpec, tiling: ConvTiling, requant: Requant = Requant(),
                    bias: bool = True) -> tuple[Schedule, Conv2dTE]:
    """The accelerator schedule of conv2d_compute with the factors of `tiling`."""
    t = conv2d_compute(env, spec, requant, bias)
    ob, cb = t.conv.shape[1], t.kernel.shape[1]
    if tiling.vt not in (1, 2):
        raise TilingError(f"{spec.name}: virtual threads must be 1 or 2, got {tiling.vt}")
    s = te.create_schedule(t.res)
    conv, res = t.conv, t.res
    # memory scopes: copies into the input/weight buffers, everything on the tile in the accumulator
    if t.data_pad is not None:
        dbuf = s.cache_read(t.data_pad, INP_SCOPE, [conv])
        s[t.data_pad].compute_inline()
    else:
        dbuf = s.cache_read(t.data, INP_SCOPE, [conv])
    kbuf = s.cache_read(t.kernel, WGT_SCOPE, [conv])
    s[conv].set_scope(ACC_SCOPE)
    for e in t.epilogue:
        s[e].set_scope(ACC_SCOPE)
    bbuf = s.cache_read(t.bias, ACC_SCOPE, [t.epilogue[0]]) if t.bias is not None else None
    # output tiles: (n, o-tile, row-tile, column-tile[, virtual thread]) then the tile's loops
    n, o, y, x, i, j = s[res].op.axis
    oo, oi = s[res].split(o, tiling.o_t)
    yo, yi = s[res].split(y, tiling.h_t)
    xo, xi = s[res].split(x, tiling.w_t)
    s[res].reorder(n, oo, yo, xo, oi, yi, xi, i, j)
    tiles = [(oo, _ceil(ob, tiling.o_t)), (yo, _ceil(spec.oh, tiling.h_t)), (xo, _ceil(spec.ow, tiling.w_t))]
    axes = _vthread_axis(s, res, tiles, tiling.vt)
    s[res].reorder(n, *axes, oi, yi, xi, i, j)
    tile = axes[-1]
    s[res].pragma(oi, DMA_COPY)
    for e in t.epilogue:
        s[e].compute_at(s[res], tile)
        s[e].pragma(s[e].op.axis[0], ALU)
    if bbuf is not None:
        s[bbuf].compute_at(s[res], tile)
        s[bbuf].pragma(s[bbuf].op.axis[0], DMA_COPY)
    # the conv on one tile: input-channel chunks outermost, then the GEMM instruction's two
    # affine loops (rows, columns), then what its micro-ops enumerate (o, ic, dy, dx)
    s[conv].compute_at(s[res], tile)
    cn, co, cy, cx, ci, cj = s[conv].op.axis
    ic, dy, dx, k = s[conv].op.reduce_axis
    ico, ici = s[conv].split(ic, tiling.ic_t)
    s[conv].reorder(cn, ico, cy, cx, co, ici, dy, dx, ci, cj, k)
    s[conv].tensorize(ci, env.gemm)
    for buf in (dbuf, kbuf):
        s[buf].compute_at(s[conv], ico)
        s[buf].pragma(s[buf].op.axis[0], DMA_COPY)
    del cb
    return s, t
