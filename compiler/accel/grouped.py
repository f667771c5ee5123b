"""Grouped and depthwise convolutions on the GEMM core, as one ordinary conv per channel slice.

A grouped conv (groups g, cin/g input and cout/g output channels per group) runs as g' GEMM convs
over contiguous channel slices of the packed input and output: each reads its input-channel
blocks and writes straight into its output-channel blocks of the layer's output buffer (no
concat copy). Groups whose slices do not fill whole blocks are merged k at a time into one
"super-group" whose weights are block-diagonal (zeros between the merged groups), k the smallest
number that aligns both slices to the blocks (g' = ceil(g / k) slices over the block-padded
channels, the last one partly padding); when none does, k = g and the layer is one dense conv
with block-diagonal weights. A depthwise
conv (one channel per group) thus becomes a diagonal GEMM over block_in-channel slices:
1/block_in of the MACs are useful but they run on the fast core; grouped_waste is what the
placement weighs against the CPU.

The packed graph node keeps groups = g' and the expanded weights (O, k cin/g, KH, KW), so the
graph reference (conv2d with g' groups on the unpacked tensors) stays the oracle.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from accel.isa import Stage, deps
from host_runtime.memory import Buffer

from .emit import emit_conv2d
from .layout import pack_activation, pack_bias, pack_weight, unpack_activation
from .plan import plan_conv2d
from .spec import Conv2dSpec, ConvTiling, Requant, ResidualAdd, TilingError, _ceil, int_conv2d

__all__ = ["merge_factor", "grouped_layout", "grouped_waste", "windowed_chunks", "group_blocks", "block_windows", "emit_windowed_conv2d", "window_spec",
           "expand_grouped_weight", "group_spec", "emit_grouped_conv2d",
           "grouped_reference", "layer_barrier", "run_grouped_conv2d"]


def merge_factor(groups: int, cin: int, cout: int, block_in: int, block_out: int) -> int:
    """k: how many consecutive groups share one GEMM so that both channel slices fill whole blocks
    and ceil(groups / k) slices tile the packed (block-padded) channels exactly; the last slice may
    hold fewer groups (its missing ones are zero padding). The smallest such k; groups itself (one
    dense conv) when none fits."""
    if groups < 1 or cin % groups or cout % groups:
        raise TilingError(f"groups={groups} does not divide {cin} input and {cout} output channels")
    cpg, opg = cin // groups, cout // groups
    cpad, opad = _ceil(cin, block_in) * block_in, _ceil(cout, block_out) * block_out
    for k in range(1, groups):
        gp = _ceil(groups, k)
        if ((k * cpg) % block_in == 0 and (k * opg) % block_out == 0 and gp * k * cpg == cpad
                and gp * k * opg == opad):
            return k
    return groups


def grouped_layout(groups: int, cin: int, cout: int, block_in: int, block_out: int) -> tuple[int, float]:
    """(k, waste): how a grouped conv goes onto the core and the fraction of its MACs wasted on
    padding and zeros. k < groups: k groups merged per slice (emit_grouped_conv2d); k == groups:
    one dense conv with block-diagonal weights, each run of output blocks reading only its input
    window (emit_windowed_conv2d). The cheaper of the two."""
    cpg = cin // groups
    k = merge_factor(groups, cin, cout, block_in, block_out)
    windowed = sum((o1 - o0) * block_out * (i1 - i0) * block_in
                   for o0, o1, i0, i1 in block_windows(group_blocks(groups, cin, cout, block_in, block_out)))
    gp = _ceil(groups, k)
    merged = gp * _ceil(k * cpg, block_in) * block_in * _ceil(k * cout // groups, block_out) * block_out
    useful = cout * cpg
    return (k, 1.0 - useful / merged) if merged <= windowed else (groups, 1.0 - useful / windowed)


def grouped_waste(groups: int, cin: int, cout: int, block_in: int, block_out: int) -> float:
    """Fraction of the GEMM core's MACs that multiply padding or zeros (grouped_layout)."""
    return grouped_layout(groups, cin, cout, block_in, block_out)[1]


def windowed_chunks(wgt_packed: np.ndarray) -> list[tuple[int, int, int, int]] | None:
    """The block_windows of packed weights (O' I' KH KW bo bi) when skipping their zero blocks saves
    at least a quarter of the MACs, else None (the plain dense emitter)."""
    nz = np.abs(wgt_packed).reshape(wgt_packed.shape[0], wgt_packed.shape[1], -1).max(axis=2) > 0
    chunks = block_windows(nz)
    executed = sum((o1 - o0) * (i1 - i0) for o0, o1, i0, i1 in chunks)
    return chunks if executed <= 0.75 * nz.size else None


def group_blocks(groups: int, cin: int, cout: int, block_in: int, block_out: int) -> np.ndarray:
    """bool (output blocks, input blocks): which weight blocks of the grouped conv, written as one
    dense conv, hold weights of some group (the rest are zeros)."""
    cpg, opg = cin // groups, cout // groups
    ob, ib = _ceil(cout, block_out), _ceil(cin, block_in)
    nz = np.zeros((ob, ib), bool)
    for j in range(ob):
        g0, g1 = j * block_out // opg, (min((j + 1) * block_out, cout) - 1) // opg
        nz[j, g0 * cpg // block_in:_ceil((g1 + 1) * cpg, block_in)] = True
    return nz


def block_windows(nz: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Runs of output blocks that read one window of input blocks: (ob0, ob1, ib0, ib1) covering
    every nonzero weight block of nz (bool, output blocks x input blocks); a block row of zeros
    still gets a one-block window (its output is the bias)."""
    chunks: list[tuple[int, int, int, int]] = []
    for j in range(nz.shape[0]):
        idx = np.flatnonzero(nz[j])
        lo, hi = (int(idx[0]), int(idx[-1]) + 1) if idx.size else (0, 1)
        if chunks and chunks[-1][1] == j and chunks[-1][2:] == (lo, hi):
            chunks[-1] = (chunks[-1][0], j + 1, lo, hi)
        else:
            chunks.append((j, j + 1, lo, hi))
    return chunks


def emit_windowed_conv2d(stream, spec: Conv2dSpec, chunks: list, tilings: list, inp, wgts: list, out, bias=None,
                         requant: Requant = Requant(), channel_scales=None,
                         residual: ResidualAdd | None = None) -> dict[str, int]:
    """A conv whose weights are zero outside each output-block run's input window (a grouped conv
    written as one dense conv): per (batch block, chunk) one emit_conv2d over the window's input
    blocks, with that chunk's packed weights (wgts[i]: (ob1-ob0) x (ib1-ib0) blocks), storing
    into the chunk's output blocks (and adding the same blocks of a fused residual: tilings then
    planned with residual=True). spec: the whole layer (block-padded channels)."""
    cfg = stream.cfg
    bn = cfg.batch
    nb, cb, ob = _ceil(spec.n, bn), _ceil(spec.c, cfg.block_in), _ceil(spec.o, cfg.block_out)
    inp_plane = spec.h * spec.w * cfg.inp_elem_bytes
    out_plane = spec.oh * spec.ow * cfg.out_elem_bytes
    acc = cfg.acc_elem_bytes
    counts: dict[str, int] = {}
    first = True
    for b in range(nb):
        for (o0, o1, i0, i1), tiling, w in zip(chunks, tilings, wgts):
            if not first:
                layer_barrier(stream)
            first = False
            sub = replace(spec, n=min(bn, spec.n), c=(i1 - i0) * cfg.block_in, o=(o1 - o0) * cfg.block_out,
                          name=f"{spec.name}/o{o0}")
            x = _view(inp, (b * cb + i0) * inp_plane, (i1 - i0) * inp_plane, f"{spec.name}.inp")
            y = _view(out, (b * ob + o0) * out_plane, (o1 - o0) * out_plane, f"{spec.name}.out")
            bv = None if bias is None else _view(bias, o0 * acc, (o1 - o0) * acc, f"{spec.name}.bias")
            sv = None if channel_scales is None else _view(channel_scales, o0 * acc, (o1 - o0) * acc,
                                                          f"{spec.name}.scales")
            rv = None if residual is None else replace(
                residual, buf=_view(residual.buf, (b * ob + o0) * out_plane, (o1 - o0) * out_plane,
                                    f"{spec.name}.residual"))
            for key, v in emit_conv2d(stream, sub, tiling, x, w, y, bv, requant, rv, sv).items():
                counts[key] = counts.get(key, 0) + v
    return counts


def window_spec(spec: Conv2dSpec, chunk: tuple[int, int, int, int], cfg) -> Conv2dSpec:
    """The conv one chunk of emit_windowed_conv2d runs (for planning its tiling)."""
    o0, o1, i0, i1 = chunk
    return replace(spec, n=min(cfg.batch, spec.n), c=(i1 - i0) * cfg.block_in, o=(o1 - o0) * cfg.block_out)


def expand_grouped_weight(w: np.ndarray, groups: int, k: int) -> np.ndarray:
    """OIHW weights of a conv with `groups` groups -> those of the same conv with ceil(groups / k)
    groups over the block-padded channels: each output channel's cin/g weights at its group's slot
    in the merged slice, zeros elsewhere."""
    o, cpg = w.shape[:2]
    if not 1 <= k <= groups or o % groups:
        raise TilingError(f"cannot merge {k} of {groups} groups over {o} output channels")
    opg = o // groups
    out = np.zeros((o, k * cpg, *w.shape[2:]), w.dtype)
    for oc in range(o):
        j = (oc // opg) % k
        out[oc, j * cpg:(j + 1) * cpg] = w[oc]
    return out


def group_spec(spec: Conv2dSpec, groups: int, batch: int) -> Conv2dSpec:
    """The conv one (batch block, group) runs: spec holds the whole layer's (padded) channels and
    the groups after merging; channels must split into whole slices."""
    if spec.c % groups or spec.o % groups:
        raise TilingError(f"{spec.name}: {groups} groups do not split {spec.c} input and {spec.o} output channels")
    return replace(spec, n=min(batch, spec.n), c=spec.c // groups, o=spec.o // groups)


def _view(buf, offset: int, nbytes: int, what: str) -> Buffer:
    """A window of a DRAM buffer (same memory) that the emitter addresses like a buffer of its own."""
    if offset + nbytes > buf.nbytes:
        raise TilingError(f"{what}: slice [{offset}, {offset + nbytes}) exceeds the buffer's {buf.nbytes} bytes")
    return Buffer(buf.memory, buf.addr + offset, nbytes, f"{buf.name}[{offset}:]")


def layer_barrier(stream) -> None:
    """Order everything emitted so far before what comes next: compute waits for every load and
    store, the next loads wait for all compute (emit_conv2d assumes it starts on idle buffers).
    Reads the stream's token counts the way CommandStream.finish does."""
    for s in (Stage.LOAD, Stage.STORE):
        last = stream._last[s]
        pushes = last is not None and getattr(stream._insns[last], deps.push_flag(s, Stage.COMPUTE))
        for _ in range(stream._tokens[(s, Stage.COMPUTE)]):
            stream.dep_pop(s, Stage.COMPUTE)
        if last is not None and not pushes:
            stream.dep_push(s, Stage.COMPUTE)
            stream.dep_pop(s, Stage.COMPUTE)
    stream.dep_push(Stage.COMPUTE, Stage.LOAD)
    stream.dep_pop(Stage.COMPUTE, Stage.LOAD)


def emit_grouped_conv2d(stream, spec: Conv2dSpec, groups: int, tiling: ConvTiling, inp, wgt, out, bias=None,
                        requant: Requant = Requant(), channel_scales=None,
                        residual: ResidualAdd | None = None) -> dict[str, int]:
    """Append a grouped conv (groups already merged: spec.c / groups input channels per slice, a
    multiple of block_in unless groups == 1) to a CommandStream, one emit_conv2d per (batch block,
    group) over windows of the packed buffers (layouts as emit_conv2d's; wgt holds the merged
    weights, O/bo x (C/groups)/bi blocks). tiling: planned for group_spec(spec, groups, batch)
    (with residual=True when a residual add is fused: each slice adds its own output blocks)."""
    cfg = stream.cfg
    bn, bi, bo = cfg.batch, cfg.block_in, cfg.block_out
    sub = group_spec(spec, groups, bn)
    if groups > 1 and (sub.c % bi or sub.o % bo):
        raise TilingError(f"{spec.name}: group slices of {sub.c} input / {sub.o} output channels are not whole "
                          f"blocks ({bi} / {bo})")
    nb, cb, ob = _ceil(spec.n, bn), _ceil(spec.c, bi), _ceil(spec.o, bo)
    sib, sob = _ceil(sub.c, bi), _ceil(sub.o, bo)
    inp_plane = spec.h * spec.w * cfg.inp_elem_bytes
    out_plane = sub.oh * sub.ow * cfg.out_elem_bytes
    wgt_block = sib * spec.kh * spec.kw * cfg.wgt_elem_bytes
    counts: dict[str, int] = {}
    for ib in range(nb):
        for gi in range(groups):
            if ib or gi:
                layer_barrier(stream)
            x = _view(inp, (ib * cb + gi * sib) * inp_plane, sib * inp_plane, f"{spec.name}.inp")
            y = _view(out, (ib * ob + gi * sob) * out_plane, sob * out_plane, f"{spec.name}.out")
            w = _view(wgt, gi * sob * wgt_block, sob * wgt_block, f"{spec.name}.wgt")
            b = None if bias is None else _view(bias, gi * sob * cfg.acc_elem_bytes, sob * cfg.acc_elem_bytes,
                                                f"{spec.name}.bias")
            s = None if channel_scales is None else _view(channel_scales, gi * sob * cfg.acc_elem_bytes,
                                                          sob * cfg.acc_elem_bytes, f"{spec.name}.scales")
            r = None if residual is None else replace(
                residual, buf=_view(residual.buf, (ib * ob + gi * sob) * out_plane, sob * out_plane,
                                    f"{spec.name}.residual"))
            for key, v in emit_conv2d(stream, replace(sub, name=f"{spec.name}/g{gi}"), tiling, x, w, y, b, requant,
                                      r, s).items():
                counts[key] = counts.get(key, 0) + v
    return counts


def grouped_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, spec: Conv2dSpec, groups: int,
                      requant: Requant = Requant()) -> np.ndarray:
    """numpy int reference of a grouped conv: NCHW int8 x (spec.c channels), OIHW int8 w (O, c/groups)."""
    acc = int_conv2d(x, w, spec, groups).astype(np.int32)
    if bias is not None:
        acc = (acc.astype(np.int64) + bias.astype(np.int64)[None, :, None, None]).astype(np.int32)
    return requant.apply(acc).astype(np.int8)


def run_grouped_conv2d(device, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, spec: Conv2dSpec,
                       groups: int, requant: Requant = Requant(), vt: int = 2):
    """Pack NCHW int8 x and grouped OIHW int8 w (O, C/groups), lay the groups onto the blocks
    (grouped_layout), run on the device, unpack: (int8 NCHW, RunResult, slices: the merged groups,
    or -(number of windowed chunks))."""
    cfg = device.cfg
    k = grouped_layout(groups, spec.c, spec.o, cfg.block_in, cfg.block_out)[0]
    gp = _ceil(groups, k)
    wm = expand_grouped_weight(w, groups, k)
    cpad, opad = _ceil(spec.c, cfg.block_in) * cfg.block_in, _ceil(spec.o, cfg.block_out) * cfg.block_out
    pspec = replace(spec, c=cpad, o=opad)
    wp = pack_weight(wm, cfg.block_out, cfg.block_in)
    chunks = windowed_chunks(wp) if gp == 1 else None
    mem = device.memory
    xb = mem.alloc_array(pack_activation(x, cfg.batch, cfg.block_in), align=cfg.inp_elem_bytes, name="g.inp")
    if chunks:
        tilings = [plan_conv2d(window_spec(pspec, c, cfg), cfg, vt) for c in chunks]
        wbs = [mem.alloc_array(np.ascontiguousarray(wp[o0:o1, i0:i1]), align=cfg.wgt_elem_bytes, name="g.wgt")
               for o0, o1, i0, i1 in chunks]
        wb = None
    else:
        tiling = plan_conv2d(group_spec(pspec, gp, cfg.batch), cfg, vt)
        wb, wbs = mem.alloc_array(wp, align=cfg.wgt_elem_bytes, name="g.wgt"), []
    bb = None if bias is None else mem.alloc_array(pack_bias(bias, cfg), align=cfg.acc_elem_bytes, name="g.bias")
    oshape = (_ceil(spec.n, cfg.batch), opad // cfg.block_out, spec.oh, spec.ow, cfg.batch, cfg.block_out)
    out = mem.alloc(int(np.prod(oshape)) * cfg.out_width // 8, align=cfg.out_elem_bytes, name="g.out")
    try:
        stream = device.stream()
        if chunks:
            stream.emit_preloaded(lambda s: emit_windowed_conv2d(s, pspec, chunks, tilings, xb, wbs, out, bb, requant))
        else:
            stream.emit_preloaded(lambda s: emit_grouped_conv2d(s, pspec, gp, tiling, xb, wb, out, bb, requant))
        result = stream.synchronize()
        y = unpack_activation(out.read(np.int8, oshape), spec.n, spec.o)
    finally:
        for buf in (xb, wb, bb, out, *wbs):
            if buf is not None:
                buf.free()
    return y, result, -len(chunks) if chunks else gp
