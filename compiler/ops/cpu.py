"""CPU ("llvm") schedules, as TVM's x86 TOPI schedules.

- injective / elementwise / broadcast: intermediate injective stages inlined; the output's axes
  fused except the last, split by the vector width and vectorized; outer loop parallel when
  there is enough work (a launch costs tens of microseconds).
- conv2d NCHW[x]c: accumulators for a (reg_n x oc_bn) output tile in a local buffer (cache_write)
  that unrolling + vectorization turn into registers; loops oc, oh, ow-tile outer (fused and
  parallel), then ic-block, kh, kw, ic-lane, ow-lane (unrolled), oc-lane (vectorized); the tile
  is stored straight into the NCHW output (epilogue applied) when that is the only reader.
  Grouped convs (two or more input channels per group) take the same kernel.
- conv2d NCHW direct (depthwise with dilation, one-channel groups): padded input materialized,
  an ow-tile of accumulators vectorized over ow.
- dense with a packed weight (N/bn, K, bn): a (mi x bn) tile of accumulators, vectorized over bn.
- matmul / batch_matmul: (mi x nj) register tiles, vectorized over j.
- stride-1 pooling, LRN: per (n, c) plane, vectorized over pixels with a local accumulator;
  concat: the concat axis split at input boundaries, the rest one vector run.
- strided/global pooling, softmax, norms: one stage per reduction, parallel over the outer axes.

The sizes above are the default point of a schedule space (compiler.autotune): a tuned
configuration, active through `schedule_config`, overrides them per knob (`knob`); with none
active every schedule is today's heuristic.
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import llvmlite.binding as llvm

from .. import te
from ..build import _init_llvm
from ..te.tensor import ComputeOp, PlaceholderOp
from ..tir import dtype as dt
from ..tir import expr as E
from ..tir.functor import post_order_visit

#: minimum output elements for a parallel loop to pay for its launch
PARALLEL_MIN = 1 << 14

#: the schedule configuration in force (knob name -> value); empty: the heuristics
_CONFIG: ContextVar[dict | None] = ContextVar("cpu_schedule_config", default=None)


@contextmanager
def schedule_config(config: dict | None):
    """Make `config` the knobs the computes, prepacks and schedules read while tracing and
    scheduling one kernel (a tuned point of the space); None or {} means the defaults."""
    token = _CONFIG.set(dict(config) if config else None)
    try:
        yield
    finally:
        _CONFIG.reset(token)


def knob(name: str, default):
    """The active configuration's value of knob `name`, else `default` (the heuristic)."""
    cfg = _CONFIG.get()
    return default if cfg is None else cfg.get(name, default)


def parallel_knob(heuristic: bool) -> bool:
    """Whether the anchor's outer loop runs on the thread pool: knob "parallel" True/False, or
    "auto" (the default) for the heuristic (a launch costs tens of microseconds)."""
    v = knob("parallel", "auto")
    return heuristic if v == "auto" else bool(v)


def host_simd() -> tuple[int, int]:
    """(vector register bytes, vector registers) of the host the register tiles are sized for:
    AVX-512 64/32, AVX/AVX2 32/16, else 16/16. $KIT_VECTOR_BYTES (16, 32, 64) overrides."""
    env = os.environ.get("KIT_VECTOR_BYTES")
    if env:
        if env not in ("16", "32", "64"):
            raise ValueError(f"KIT_VECTOR_BYTES={env!r}: expected 16, 32 or 64")
        vb = int(env)
    else:
        try:
            _init_llvm()
            f = llvm.get_host_cpu_features()
            vb = 64 if f.get("avx512f") else 32 if (f.get("avx2") or f.get("avx")) else 16
        except RuntimeError:   # pragma: no cover - a host LLVM cannot describe
            vb = 16
    return vb, 32 if vb == 64 else 16


@dataclass(frozen=True)
class Tiles:
    """Register-tile sizes the schedules use, sized for one vector unit (measured best on an AVX-512
    and an AVX2 machine): accumulators fill most registers, a few stay for loads and broadcasts."""
    vector_bytes: int
    registers: int

    @property
    def wide(self) -> bool:
        return self.registers >= 32

    @property
    def rows(self) -> int:
        """rows of a dense/matmul register tile (each row one or two vectors of accumulators)"""
        return 8 if self.wide else 6

    @property
    def conv_oc_bn(self) -> int:
        """NCHWc output-channel block: two float vectors with 32 registers, one with 16"""
        return (2 if self.wide else 1) * self.vector_bytes // 4

    conv_reg_n = 14      # NCHWc pixels per tile: 28 accumulators of 32 registers, 14 of 16
    conv_ic_bn = 16

    @property
    def pointwise(self) -> tuple[int, int]:
        """pointwise conv tile: output channels x pixel vectors (24 of 32 registers, 12 of 16)"""
        return (8, 3) if self.wide else (4, 3)


TILES = Tiles(*host_simd())


def lanes(dtype: str) -> int:
    return max(1, TILES.vector_bytes // max(1, dt.bits(dtype) // 8))


def largest_divisor(n: int, at_most: int) -> int:
    for d in range(min(n, at_most), 0, -1):
        if n % d == 0:
            return d
    return 1


def tile_extent(n: int, want: int, unit: int) -> int:
    """A split factor for a loop of n, a multiple of `unit` (the vector length, for a vectorized
    loop): the largest such divisor of n in [want/2, want], else a tile whose tail PartitionLoops
    peels off: `want` itself, or for vectors the largest tile whose tail fits in one vector (a
    wider tail is an odd-width vector). Loops shorter than one unit are taken whole. (A divisor
    such as 28 lanes, or a prime n falling back to 1, made matmuls 20x slower.)"""
    if n <= unit:
        return n
    want = max(unit, min(want, n) // unit * unit)
    for d in range(want, want // 2 - 1, -unit):
        if n % d == 0:
            return d
    while unit > 1 and want > unit and n % want > unit:   # 49: 16 + a 1-lane tail, not 32 + 17
        want -= unit
    return want


def _is_injective(op) -> bool:
    return isinstance(op, ComputeOp) and not op.reduce_axis and op.tag.split(",")[0] in (
        "injective", "elemwise", "broadcast")


def _as_list(outs):
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


#: an injective stage stays a loop nest of its own when inlined it would grow past this many
#: expression nodes: ops that read their input several times compound along a fused chain
#: (a quantize reads it about 18 times; four of them in a row made a 13 MB loop body)
INLINE_NODES = 2048


def _body_size(op) -> tuple[int, dict]:
    """(expression nodes of a compute's body, {producer op: loads of it})."""
    count, loads = 0, {}

    def fn(n):
        nonlocal count
        count += 1
        if isinstance(n, E.ProducerLoad):
            loads[n.producer.op] = loads.get(n.producer.op, 0) + 1
    post_order_visit(op.body, fn)
    return count, loads


def inline_injective(s, outs, keep=()) -> None:
    """compute_inline every injective stage that is not an output (TOPI's traverse_inline), unless
    its body with its inlined producers substituted would exceed INLINE_NODES."""
    out_ops = {o.op for o in outs}
    expanded: dict = {}   # op -> nodes of its body with every inlined producer substituted
    for st in s.stages:   # producers first
        op = st.op
        if st.is_placeholder or not isinstance(op, ComputeOp):
            continue
        own, loads = _body_size(op)
        expanded[op] = own + sum(k * (expanded.get(p, 1) - 1) for p, k in loads.items())
        if op in out_ops or op in keep or st.attach_type == "inline":
            continue
        if (_is_injective(op) and "pack" not in op.tag.split(",") and "pad" not in op.tag.split(",")
                and expanded[op] <= INLINE_NODES):
            st.compute_inline()
        else:
            expanded[op] = 1   # read from its buffer


def schedule_flat(s, t, vector=True, parallel=True):
    """Fuse all but the last axis; vectorize the last (by a vector width that divides it, else by
    whole vectors and a tail PartitionLoops peels off); parallel outermost when big enough."""
    st = s[t]
    axes = list(st.op.axis)
    size = math.prod(t.shape)
    if vector and axes:
        n = t.shape[-1]
        vl = lanes(t.dtype)
        v = next((w for w in (vl, vl // 2, vl // 4) if w >= 4 and n % w == 0), None)
        if v is not None:
            lo, li = st.split(axes[-1], v)
            st.vectorize(li)
            axes = axes[:-1] + [lo]
        elif n >= 2 * vl:
            # whole vectors and a tail: the row's vector loop stays its own, so PartitionLoops can
            # peel the tail (fused into the outer loop, every element would carry the guard)
            lo, li = st.split(axes[-1], vl)
            st.vectorize(li)
            axes = axes[:-1] or [lo]
        elif len(axes) > 1 and n >= 4:
            axes = axes[:-1]    # keep the last axis its own (inner, stride-1) loop: no div/mod per element
    outer = st.fuse(*axes) if len(axes) > 1 else (axes[0] if axes else None)
    if parallel and outer is not None and size >= PARALLEL_MIN:
        st.parallel(outer)


def _schedule_stages(outs, special=None):
    """Inline the injective stages, then schedule each stage left at root: by special(s, stage)
    where that returns True, else flat (schedule_flat)."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    inline_injective(s, outs)
    for st in s.stages:
        if st.is_placeholder or st.attach_type == "inline":
            continue
        if special is None or not special(s, st):
            schedule_flat(s, st.op.output(0))
    return s


def schedule_injective(outs):
    return _schedule_stages(outs)


def schedule_layout_transform(outs):
    """NCHW -> NCHW[c]c as a row transpose (schedule_pack_nchwc: each source plane read as a
    stream); back to NCHW (with any epilogue inlined) flat, vectorized over the pixels."""
    return _schedule_stages(outs, lambda s, st: schedule_pack_nchwc(st))


def schedule_unpack_blocked(outs):
    """N'C'..[b0][b1] -> N C .. (transform.unpack_blocked, a kernel of its own: unpack is OPAQUE):
    per (n, channel block, row) parallel, pixels in order and the block's channel lanes unrolled
    inside, so each packed pixel is read whole and every output plane written as a stream;
    vectorizing over the pixels would gather one byte per lane (3x slower)."""
    def unpack_rows(s, st) -> bool:
        lanes = _unpack_lanes(st.op)
        if lanes is None:
            return False
        n, c, *rows, x = st.op.axis
        co, ci = st.split(c, lanes)
        st.reorder(n, co, *rows, x, ci)
        outer = st.fuse(n, co, *rows)
        st.unroll(ci)
        if math.prod(st.op.output(0).shape) >= PARALLEL_MIN:
            st.parallel(outer)
        return True
    return _schedule_stages(outs, unpack_rows)


def _unpack_lanes(op) -> int | None:
    """The channel block of the blocked tensor an unpack stage reads (N C H W.. from N'C'HW..b0 b1,
    batch block 1), when it divides the channels and the rows are at least 2-d, else None."""
    if not isinstance(op, ComputeOp) or op.reduce_axis or len(op.axis) < 3 or len(op.input_tensors()) != 1:
        return None
    shape, ts = tuple(op.shape), tuple(op.input_tensors()[0].shape)
    if len(ts) == len(shape) + 2 and ts[-2] == 1 and ts[2:-2] == shape[2:] and 1 < ts[-1] <= 64 \
            and shape[1] % ts[-1] == 0:
        return ts[-1]
    return None


def schedule_reduce(outs):
    """Generic: every stage at root, parallel over its fused data-parallel axes when big; the
    last data axis vectorized for injective stages."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    inline_injective(s, outs)
    for st in s.stages:
        if st.is_placeholder or st.attach_type == "inline":
            continue
        op = st.op
        if not op.axis:    # a 0-d result (a reduction over every axis): one scalar loop nest
            continue
        if op.reduce_axis:
            axes = list(op.axis)
            size = math.prod(op.shape)
            work = size * math.prod(r.dom.extent.value for r in op.reduce_axis)
            if _lanes_kept(op):
                # the blocked layout's lanes (last axis, not reduced): the reduction loops outside,
                # the lanes one vector inside, so each step reads a whole pixel of lanes
                st.reorder(*axes[:-1], *op.reduce_axis, axes[-1])
                st.vectorize(axes[-1])
                axes = axes[:-1]
            outer = st.fuse(*axes) if len(axes) > 1 else axes[0]
            if work >= PARALLEL_MIN and size > 1:
                st.parallel(outer)
        else:
            schedule_flat(s, op.output(0))
    return s


def schedule_rows(outs):
    """Row kernels (nn.softmax_rows, nn.layer_norm_rows): per row (the output's outer axes, those
    of the row statistics, fused: the parallel loop when big), each lane-partial reduction with
    its lanes as one vector inside the other loops, the short combines, row buffers and the
    row's output with the last axis as vectors, a tail peeled off by PartitionLoops. Any other
    shape of stages (an epilogue that reshapes): schedule_reduce."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    inline_injective(s, outs)
    out = outs[0]
    inner = [st for st in s.stages if not st.is_placeholder and st.attach_type != "inline" and st.op is not out.op]
    stats = [st for st in inner if st.op.tag == "row_combine"]
    rows = tuple(stats[0].op.shape) if stats else ()
    if (len(outs) != 1 or not isinstance(out.op, ComputeOp) or out.op.reduce_axis or not rows
            or tuple(out.shape[:len(rows)]) != rows or len(out.shape) == len(rows)
            or any(st.op.tag not in ("row_part", "row_combine", "row_map") for st in inner)
            or any(tuple(st.op.shape[:len(rows)]) != rows for st in inner)):
        return schedule_reduce(outs)
    n, vl = out.shape[-1], lanes(out.dtype)

    def row_vectors(t):
        _, ki = t.split(t.op.axis[-1], tile_extent(n, vl, vl))
        if min(n, vl) >= 4:
            t.vectorize(ki)
    st = s[out]
    row_axes = st.op.axis[:len(rows)]
    row = st.fuse(*row_axes) if len(row_axes) > 1 else row_axes[0]
    row_vectors(st)
    if math.prod(out.shape) >= PARALLEL_MIN and math.prod(rows) > 1:
        st.parallel(row)
    for t in inner:
        t.compute_at(st, row)
        if t.op.tag == "row_part":
            *o, lane = t.op.axis
            t.reorder(*o, *t.op.reduce_axis, lane)
            t.vectorize(lane)
        elif t.op.tag == "row_map":
            row_vectors(t)
    return s


def _lanes_kept(op) -> bool:
    """A reduction over a blocked tensor's spatial axes (N C' H W c -> N C' 1 1 c) that keeps the
    lanes: the last axis is not reduced and is a whole vector or a power of two of at least 4."""
    if len(op.axis) != 5 or len(op.reduce_axis) != 2 or tuple(op.shape[2:4]) != (1, 1):
        return False
    c = op.shape[-1]
    vl = lanes(op.output(0).dtype)
    return 4 <= c <= 4 * vl and (c & (c - 1) == 0 or c % vl == 0)


def schedule_concat(outs):
    """Concatenation (with any elementwise epilogue inlined): the axes before the concat axis,
    the concat axis as its own loop - split at the input boundaries by loop partitioning, so each
    part copies from one input with no per-element select - and the axes after it fused into one
    contiguous, vectorized run. Parallel over the outer axes, else over the concat axis."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    inline_injective(s, outs)
    cat = next((st.op for st in s.stages if not st.is_placeholder and "concat" in st.op.tag.split(",")), None)
    out = outs[0]
    if (len(outs) != 1 or cat is None or "axis" not in (cat.attrs or {}) or not isinstance(out.op, ComputeOp)
            or out.op.reduce_axis or tuple(out.shape) != tuple(cat.output(0).shape)
            or any(not st.is_placeholder and st.attach_type != "inline" and st.op is not out.op for st in s.stages)):
        return schedule_injective(outs)
    ax = cat.attrs["axis"]
    st = s[out]
    axes = list(st.op.axis)
    outer_axes, cax, rest = axes[:ax], axes[ax], axes[ax + 1:]
    inner = math.prod(out.shape[ax + 1:])
    vl = lanes(out.dtype)
    if len(out.shape) == 5 and len(rest) > 1 and out.shape[-1] % min(vl, out.shape[-1]) == 0 \
            and out.shape[-1] >= 4:
        # blocked N C' H W c: rows of whole pixels, the lanes one vector (a fused pixel index would
        # be split again by division per lane: a gather instead of a vector copy)
        _, ri = st.split(rest[-1], min(vl, out.shape[-1]))
        st.vectorize(ri)
        rest = []
    if rest:
        r = st.fuse(*rest) if len(rest) > 1 else rest[0]
        v = next((w for w in (vl, vl // 2, vl // 4) if w >= 4 and inner % w == 0), None)
        if v is not None:
            _, ri = st.split(r, v)
            st.vectorize(ri)
    big = math.prod(out.shape) >= PARALLEL_MIN
    if outer_axes:
        o = st.fuse(*outer_axes) if len(outer_axes) > 1 else outer_axes[0]
        if big and math.prod(out.shape[:ax]) > 1:
            st.parallel(o)
            return s
    if big:
        st.parallel(cax)
    return s


def _find(s, tag_head: str):
    for st in s.stages:
        if not st.is_placeholder and st.op.tag.split(",")[0] == tag_head:
            return st
    return None


# ---------------------------------------------------------------- conv2d

#: conv2d NCHWc knobs (the benchmark may override): max output-width tile and channel blocks


def _begin(outs, *tags, keep=None):
    """(outs as a list, their schedule with injective ops inlined, the stage of the first tag
    found). keep(main stage) names the ops to leave uninlined."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    main = next((st for st in (_find(s, t) for t in tags) if st is not None), None)
    inline_injective(s, outs, keep=keep(main) if keep is not None and main is not None else ())
    return outs, s, main


def _schedule_rest(s, keep, **flat):
    """Every stage but `keep` (pack, pad, unpack, epilogues) at root, flat: parallel, vectorized;
    an NCHW -> NCHWc input pack as a row transpose (schedule_pack_nchwc)."""
    for st in s.stages:
        if st.is_placeholder or st.attach_type == "inline" or any(st is k for k in keep):
            continue
        if not schedule_pack_nchwc(st, parallel=flat.get("parallel", True)):
            schedule_flat(s, st.op.output(0), **flat)


def schedule_pack_nchwc(st, parallel: bool = True) -> bool:
    """NCHW -> NCHW[bn]c (nn.pack_nchwc) or the accelerator's N'C'HW[b0][b1] (transform.pack_blocked):
    per (n, channel block, row) parallel, pixels in order and the block's lanes unrolled inside, so
    every source plane is read as a stream and each packed pixel written whole; flat vectorization
    over the lanes would gather from the block's planes with a division per element. False
    (nothing done) for any other stage."""
    op = st.op
    if not isinstance(op, ComputeOp) or op.reduce_axis or "pack" not in op.tag.split(",") \
            or len(op.input_tensors()) != 1:
        return False
    lanes = len(op.axis) - len(op.input_tensors()[0].shape)   # 1: NCHWc; 2: N'C'..b0 b1
    if lanes not in (1, 2) or len(op.axis) - lanes < 3 or not 1 < math.prod(op.shape[-lanes:]) <= 64:
        return False
    *rows, x = op.axis[:-lanes]
    outer = st.fuse(*rows)
    for ax in op.axis[-lanes:]:
        st.unroll(ax)
    if parallel and math.prod(op.shape) >= PARALLEL_MIN:
        st.parallel(outer)
    return True


def conv_blocks(C: int, O: int, dtype: str = "float32", oc_bn: int | None = None, ic_bn: int | None = None):
    """(ic_bn, oc_bn) for an NCHWc conv: oc_bn a multiple of the vector width when possible."""
    ob = oc_bn or knob("oc_bn", TILES.conv_oc_bn)
    oc = largest_divisor(O, ob)
    if oc & (oc - 1):
        # the block is the vector axis: 24 or 12 lanes compile to shuffles across registers
        # (a 3->24 conv ran 6x slower than with 8 lanes); the largest power of two instead
        p2 = min(O & -O, 1 << (ob.bit_length() - 1))
        if p2 >= 4:
            oc = p2
    ic = largest_divisor(C, ic_bn or knob("ic_bn", TILES.conv_ic_bn))
    return ic, oc


def _nchw_consumer(s, outs, conv):
    """The stage of the single NCHW output that is the only reader of the NCHWc conv (the unpack,
    with any elementwise epilogue inlined into it), else None."""
    if len(outs) != 1:
        return None
    out = outs[0]
    N, OCO, OH, OW, ocb = conv.op.output(0).shape
    if (out.op is conv.op or not isinstance(out.op, ComputeOp) or out.op.reduce_axis
            or tuple(out.shape) != (N, OCO * ocb, OH, OW)):
        return None
    ost = s[out]
    return ost if s._consumers(conv) == [ost] else None


def _nchwc_epilogue(s, outs, conv):
    """The stage of the single blocked output (same shape as the conv) that is the conv's only
    reader, with its elementwise epilogue (bias, ReLU, a residual add) inlined, else None."""
    if len(outs) != 1:
        return None
    out = outs[0]
    if (out.op is conv.op or not isinstance(out.op, ComputeOp) or out.op.reduce_axis
            or tuple(out.shape) != tuple(conv.op.output(0).shape)):
        return None
    ost = s[out]
    return ost if s._consumers(conv) == [ost] else None


#: weights up to this size stay in cache while all output-channel blocks of a row are computed
ROWS_OUTER_WEIGHT_BYTES = 256 << 10


def _rows_outer(conv) -> bool:
    """Output rows outside the output-channel blocks (each input row band read once, from cache,
    for every block) when the whole weight is small enough to stay in cache; else blocks outside
    (each block's weights stay in cache while the rows stream). Knob "rows_outer"."""
    w = conv.op.input_tensors()[1]
    nbytes = math.prod(w.shape) * max(1, dt.bits(w.dtype) // 8)
    return bool(knob("rows_outer", nbytes <= ROWS_OUTER_WEIGHT_BYTES and conv.op.output(0).shape[1] > 1))


def _register_tile(conv) -> None:
    """The NCHWc conv's register tile (computed at its output's pixel block): the reduction order
    the tuner picks, the window's columns unrolled, the channel block one vector. A depthwise
    conv reduces over its window only: the window outside, unrolled, each weight vector loaded
    once per tile."""
    n, oc, oh, ow, ob = conv.op.axis
    if len(conv.op.reduce_axis) == 2:
        ry, rx = conv.op.reduce_axis
        conv.reorder(n, oc, oh, ry, rx, ow, ob)
        if knob("dw_unroll", True):
            conv.unroll(ry)
            conv.unroll(rx)
        conv.unroll(ow)
        conv.vectorize(ob)
        return
    ico, ry, rx, ici = conv.op.reduce_axis
    if knob("order", "ic_outer") == "kernel_outer":
        conv.reorder(n, oc, oh, ry, rx, ico, ici, ow, ob)
    else:
        conv.reorder(n, oc, oh, ico, ry, rx, ici, ow, ob)
    if knob("unroll_kw", False):
        conv.unroll(rx)
    conv.unroll(ow)
    conv.vectorize(ob)


def _conv_NCHWc_epilogue(s, conv, ost, rn: int, rows_outer: bool | None = None):
    """A blocked conv whose output stays blocked (the layout kept between layers): the accumulator
    tile (rn pixels x oc block, in registers) goes through the epilogue straight to the output."""
    _schedule_rest(s, (conv, ost))
    n, oc, oh, ow, ob = ost.op.axis
    owo, owi = ost.split(ow, rn)
    if _rows_outer(conv) if rows_outer is None else rows_outer:
        ost.reorder(n, oh, oc, owo, owi, ob)
        fused = ost.fuse(n, oh, oc)
    else:
        ost.reorder(n, oc, oh, owo, owi, ob)
        fused = ost.fuse(n, oc, oh)
    if parallel_knob(True):
        ost.parallel(fused)
    ost.unroll(owi)
    ost.vectorize(ob)
    conv.set_scope("local")
    conv.compute_at(ost, owo)
    _register_tile(conv)
    return s


def schedule_conv2d_NCHWc(outs, reg_n: int | None = None):
    outs, s, conv = _begin(outs, "conv2d_NCHWc")
    C = conv.op.output(0)
    N, OCO, OH, OW, ocb = C.shape
    rn = tile_extent(OW, reg_n or knob("reg_n", TILES.conv_reg_n), 1)   # a peeled tail, not 1-pixel tiles
    ost = _nchw_consumer(s, outs, conv) if knob("fuse_unpack", True) else None
    if ost is not None:
        return _conv_NCHWc_to_nchw(s, conv, ost, rn)
    ost = _nchwc_epilogue(s, outs, conv)
    if ost is not None:
        return _conv_NCHWc_epilogue(s, conv, ost, rn)
    _schedule_rest(s, (conv,))
    CC = s.cache_write(C, "local")
    st = s[C]
    n, oc, oh, ow, ob = st.op.axis
    owo, owi = st.split(ow, rn)
    st.reorder(n, oc, oh, owo, owi, ob)
    fused = st.fuse(n, oc, oh)
    st.vectorize(ob)
    if parallel_knob(True):
        st.parallel(fused)
    s[CC].compute_at(st, owo)
    cst = s[CC]
    n, oc, oh, ow, ob = cst.op.axis
    ico, ry, rx, ici = cst.op.reduce_axis
    owo2, owi2 = cst.split(ow, rn)
    if knob("order", "ic_outer") == "kernel_outer":   # the window outside the input-channel blocks
        cst.reorder(n, oc, oh, owo2, ry, rx, ico, ici, owi2, ob)
    else:
        cst.reorder(n, oc, oh, owo2, ico, ry, rx, ici, owi2, ob)
    if knob("unroll_kw", False):
        cst.unroll(rx)
    cst.unroll(owi2)
    cst.vectorize(ob)
    return s


#: depthwise NCHWc pixels per register tile (one accumulator vector each; the window's weight and
#: input vectors take the other registers)
DW_REG_N = 8


def schedule_depthwise_NCHWc(outs):
    """Blocked depthwise conv: a register tile of rn pixels x one channel block, the window
    unrolled around it, through the epilogue to the blocked output (or straight to an NCHW one);
    parallel over (n, channel block, row), each block's planes streamed in order; padding read
    through a guard, not copied."""
    outs, s, conv = _begin(outs, "depthwise_NCHWc")
    for st in s.stages:
        if not st.is_placeholder and "pad" in st.op.tag.split(","):
            # a guarded read per tap: a padded copy would double the traffic of this memory-bound
            # kernel (measured 2.7x slower over MobileNetV2's depthwise layers)
            st.compute_inline()
    C = conv.op.output(0)
    rn = tile_extent(C.shape[3], knob("reg_n", DW_REG_N), 1)
    ost = _nchw_consumer(s, outs, conv) if knob("fuse_unpack", True) else None
    if ost is not None:
        return _conv_NCHWc_to_nchw(s, conv, ost, rn)
    ost = _nchwc_epilogue(s, outs, conv)
    if ost is None:   # the conv is the output: its accumulator tile is a local stage
        conv, ost = s[s.cache_write(C, "local")], s[C]
    return _conv_NCHWc_epilogue(s, conv, ost, rn, rows_outer=False)


def _conv_NCHWc_to_nchw(s, conv, ost, rn: int):
    """The NCHWc accumulator tile (rn pixels x oc block, in registers) written straight to the
    NCHW output with the epilogue applied, instead of a whole NCHWc tensor unpacked afterwards
    with strided gathers (a full pass over memory, and over cache lines re-read per channel)."""
    _schedule_rest(s, (conv, ost))
    ocb = conv.op.output(0).shape[4]
    n, c, y, x = ost.op.axis
    co, ci = ost.split(c, ocb)
    xo, xi = ost.split(x, rn)
    ost.reorder(n, co, y, xo, ci, xi)
    fused = ost.fuse(n, co, y)
    if parallel_knob(True):
        ost.parallel(fused)
    ost.unroll(ci)
    ost.unroll(xi)
    conv.set_scope("local")
    conv.compute_at(ost, xo)
    _register_tile(conv)
    return s


def schedule_conv2d_nchw(outs):
    """Direct NCHW conv (any groups): padded input at root; ow tile of accumulators vectorized."""
    outs, s, conv = _begin(outs, "conv2d_nchw")
    _schedule_rest(s, (conv,))
    C = conv.op.output(0)
    N, O, OH, OW = C.shape
    vl = lanes(C.dtype)
    xw = largest_divisor(OW, vl)
    CC = s.cache_write(C, "local")
    st = s[C]
    n, o, y, x = st.op.axis
    xo, xi = st.split(x, xw)
    fused = st.fuse(n, o, y)
    if xw >= 4:
        st.vectorize(xi)
    if math.prod(C.shape) >= 1024:
        st.parallel(fused)
    s[CC].compute_at(st, xo)
    cst = s[CC]
    n, o, y, x = cst.op.axis
    rc, ry, rx = cst.op.reduce_axis
    xo2, xi2 = cst.split(x, xw)
    cst.reorder(n, o, y, xo2, rc, ry, rx, xi2)
    if xw >= 4:
        cst.vectorize(xi2)
    return s


# ---------------------------------------------------------------- dense / matmul

def dense_block(M: int, N: int) -> tuple[int, int]:
    """(mi, bn): rows per register tile and the packed weight's output block."""
    if M <= 2:
        # a GEMV's only parallelism is the block's vectors: 64 lanes are four independent FMA
        # chains where 16 are one chain K long (a 1 x 128 x 128 dense: 1.34 -> 0.97 us)
        return M, knob("bn", 64 if N >= 256 or N % 64 == 0 else 32 if N % 32 == 0 else 16)
    return tile_extent(M, knob("mi", TILES.rows), 1), knob("bn", 32 if TILES.wide and N % 32 == 0 else 16)


def schedule_dense_pack(outs):
    outs, s, cp = _begin(outs, "dense_pack")
    _schedule_rest(s, (cp,), parallel=False)
    C = cp.op.output(0)
    M, NB, bn = C.shape
    K = cp.op.reduce_axis[0].dom.extent.value
    mi = dense_block(M, NB * bn)[0]
    ku = knob("k_unroll", 4)
    CC = s.cache_write(C, "local")
    st = s[C]
    i, jo, ji = st.op.axis
    io, ii = st.split(i, mi)
    st.reorder(jo, io, ii, ji)
    # rows in tiles of mi: with a tail (mi does not divide M) the row-tile loop stays its own, so
    # PartitionLoops peels the last tile off (a prime M once meant 1-row tiles: 2.6x slower)
    outer = st.fuse(jo, io) if M % mi == 0 else jo
    st.vectorize(ji)
    # a launch costs tens of microseconds, a 1 x 128 x 512 GEMV alone 8: below 2^18 MACs the pool
    # cannot pay off (an unrolled LSTM's per-step GEMVs ran 3x slower on it beside onnxruntime)
    if parallel_knob(M * NB * bn * K >= 1 << 18):
        st.parallel(outer)
    s[CC].compute_at(st, outer if M % mi == 0 else io)
    cst = s[CC]
    i, jo, ji = cst.op.axis
    (k,) = cst.op.reduce_axis
    ko, ki = cst.split(k, ku) if ku > 1 and K % ku == 0 else (k, None)
    if ki is not None:
        cst.reorder(i, jo, ko, ki, ji)
        cst.reorder(jo, ko, ki, i, ji)
        cst.unroll(ki)
    else:
        cst.reorder(jo, k, i, ji)
    cst.unroll(i)
    cst.vectorize(ji)
    return s


def _transposed_operand(mm) -> tuple:
    """The producer of a matmul's right operand (read along j, the vector axis) when a transpose
    feeds it: inlined, each vector of B would be a strided gather (Swin's Q.K^T, with K^T fused
    in, ran 10x slower than onnxruntime); kept, it is one transposing copy before the tiles."""
    b = mm.op.input_tensors()[-1].op
    stack, seen = [b], set()
    while stack:
        op = stack.pop()
        if op in seen or not _is_injective(op):
            continue
        seen.add(op)
        if "transpose" in op.tag.split(","):
            return (b,)
        stack.extend(t.op for t in op.input_tensors())
    return ()


def schedule_matmul(outs):
    """matmul / batch_matmul: (mi x nj) register tiles over (i, j), vectorized over j."""
    outs, s, mm = _begin(outs, "batch_matmul", "matmul", keep=_transposed_operand)
    _schedule_rest(s, (mm,))
    C = mm.op.output(0)
    M, N = C.shape[-2:]
    vl = lanes(C.dtype)
    nj = tile_extent(N, knob("nj", 2 * vl), vl)
    mi = tile_extent(M, knob("mi", TILES.rows), 1)
    K = mm.op.reduce_axis[0].dom.extent.value
    CC = s.cache_write(C, "local")
    st = s[C]
    axes = list(st.op.axis)
    i, j = axes[-2:]
    io, jo, ii, ji = st.tile(i, j, mi, nj)
    outer = st.fuse(*axes[:-2], io) if len(axes) > 2 else io
    if nj >= 4:
        st.vectorize(ji)
    if parallel_knob(math.prod(C.shape) * K >= 1 << 16 and math.prod(C.shape[:-1]) // mi > 1):
        st.parallel(outer)
    s[CC].compute_at(st, jo)
    cst = s[CC]
    caxes = list(cst.op.axis)
    (k,) = cst.op.reduce_axis
    cst.reorder(*caxes[:-2], k, caxes[-2], caxes[-1])
    cst.unroll(caxes[-2])
    if nj >= 4:
        cst.vectorize(caxes[-1])
    return s


def schedule_lrn(outs):
    """LRN over NCHW: per (n, channel), the parallel loop, the window's sum of squares over the
    plane into a local buffer (one plane, L1/L2), then the normalization; both vectorized over
    the flat pixels, the window unrolled."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    inline_injective(s, outs)
    out, sq = _find(s, "lrn"), _find(s, "lrn_sqsum")
    if out is None or sq is None or len(outs) != 1 or out.op is not outs[0].op or len(out.op.axis) != 4:
        return schedule_reduce(outs)
    _schedule_rest(s, (out, sq))
    vl = lanes(out.op.output(0).dtype)
    n, c, y, x = out.op.axis
    outer = out.fuse(n, c)
    po, pi = out.split(out.fuse(y, x), vl)
    out.vectorize(pi)
    if math.prod(out.op.shape) >= PARALLEL_MIN:
        out.parallel(outer)
    sq.set_scope("local")
    sq.compute_at(out, outer)
    n, c, y, x = sq.op.axis
    (rc,) = sq.op.reduce_axis
    qo, qi = sq.split(sq.fuse(y, x), vl)
    sq.reorder(n, c, qo, rc, qi)
    sq.unroll(rc)
    sq.vectorize(qi)
    return s


def schedule_pool(outs):
    """Stride-1 pooling over NCHW: per (n, c) plane, the parallel loop, rows, then a vector of
    output pixels whose window max or sum accumulates in registers (a local tile computed at that
    vector, the epilogue - the mean's division, a ReLU - applied on the way out). Global and
    strided pools, and shapes this does not cover: schedule_pool_generic."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    inline_injective(s, outs)
    red = [st for st in s.stages if not st.is_placeholder and st.attach_type != "inline" and st.op.reduce_axis]
    out = outs[0]
    if (len(outs) != 1 or len(red) != 1 or len(out.shape) != 4 or out.shape[3] < 4
            or tuple(red[0].op.output(0).shape) != tuple(out.shape)):
        return schedule_pool_generic(outs)
    r = red[0]
    ost = s[out]
    src = r.op.input_tensors()
    OW = out.shape[3]
    # measured: 4- and 8-lane tiles beat the generic nest on stride-1 windows; strided windows
    # (per-lane gathers) and 16-lane or ragged tiles were slower than it
    width = 8 if OW % 8 == 0 else 4 if OW % 4 == 0 else None
    if (width is None or len(src) != 1 or len(src[0].shape) != 4 or 2 * OW <= src[0].shape[3] + 2):
        return schedule_pool_generic(outs)
    if r is ost:
        r = s[s.cache_write(out, "local")]
    elif not isinstance(out.op, ComputeOp) or out.op.reduce_axis or s._consumers(r) != [ost]:
        return schedule_pool_generic(outs)
    else:
        r.set_scope("local")
    _schedule_rest(s, (r, ost))
    n, c, y, x = ost.op.axis
    outer = ost.fuse(n, c)
    xo, xi = ost.split(x, knob("pool_lanes", width))
    ost.vectorize(xi)
    if math.prod(out.shape) >= PARALLEL_MIN // 4:
        ost.parallel(outer)
    r.compute_at(ost, xo)
    n, c, y, x = r.op.axis
    ry, rx = r.op.reduce_axis
    r.reorder(n, c, y, ry, rx, x)
    r.vectorize(x)
    return s


def schedule_pool_nchwc(outs):
    """Pooling over a blocked N C' H W c input: per (n, block, row) parallel, a few output pixels
    whose window max or sum accumulates in registers, one vector of channel lanes each (a local
    tile), the epilogue (the mean's division, a ReLU, an unpack) applied on the way out."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    inline_injective(s, outs)
    red = [st for st in s.stages if not st.is_placeholder and st.attach_type != "inline" and st.op.reduce_axis]
    out = outs[0]
    if (len(outs) != 1 or len(red) != 1 or len(out.shape) != 5
            or tuple(red[0].op.output(0).shape) != tuple(out.shape)):
        return schedule_pool_generic(outs)
    r, ost = red[0], s[out]
    if r is ost:
        r = s[s.cache_write(out, "local")]
    elif not isinstance(out.op, ComputeOp) or out.op.reduce_axis or s._consumers(r) != [ost]:
        return schedule_pool_generic(outs)
    else:
        r.set_scope("local")
    _schedule_rest(s, (r, ost))
    cb = out.shape[4]
    n, c, y, x, ci = ost.op.axis
    outer = ost.fuse(n, c, y)
    xo, xi = ost.split(x, largest_divisor(out.shape[3], knob("pool_pixels", 4)))
    ost.unroll(xi)
    if cb >= 4:
        ost.vectorize(ci)
    if math.prod(out.shape) >= PARALLEL_MIN // 4:
        ost.parallel(outer)
    r.compute_at(ost, xo)
    n, c, y, x, ci = r.op.axis
    ry, rx = r.op.reduce_axis
    r.reorder(n, c, y, ry, rx, x, ci)
    r.unroll(x)
    if cb >= 4:
        r.vectorize(ci)
    return s


def schedule_pool_generic(outs):
    """Pooling: every reduction stage root, parallel over (n, c, oh) fused."""
    return schedule_reduce(outs)


_ = PlaceholderOp


# ---------------------------------------------------------------- pointwise / depthwise (flat pixels)



def _flat_pipeline(s, outs, tag):
    """(flat stage, 4-d output stage whose pixels map 1:1 onto the flat one, or None)."""
    inline_injective(s, outs)
    flat = _find(s, tag)
    out = outs[0]
    ok = (len(outs) == 1 and len(out.shape) == 4 and out.op is not flat.op
          and isinstance(out.op, ComputeOp) and not out.op.reduce_axis)
    return flat, (s[out] if ok else None)


def _pixel_tile(P: int, vl: int, vecs: int) -> int:
    """Pixels per register tile: `vecs` vectors, fewer when the plane is small."""
    return max(1, min(P, vl * vecs))


def schedule_conv2d_pointwise(outs):
    """1x1 conv over flat pixels: per (pixel tile, output-channel block) an (oc x vecs*lanes)
    tile of accumulators (local, promoted to registers) reduced over input channels with one
    broadcast weight per FMA row; the epilogue (bias, clip, residual add) reads the tile in place.
    The pixel tile loop is outer, so a tile of the input is read once for all output channels."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    flat, ost = _flat_pipeline(s, outs, "conv2d_pointwise")
    _schedule_rest(s, (flat, ost))
    F = flat.op.output(0)
    N, O, P = F.shape
    C = flat.op.reduce_axis[0].dom.extent.value
    vl = lanes(F.dtype)
    pw_oc, pw_vecs = knob("pw_oc", TILES.pointwise[0]), knob("pw_vecs", TILES.pointwise[1])
    # a tile of output channels stays inside one group: its input channels are then one range
    ob = largest_divisor(O // (flat.op.attrs or {}).get("groups", 1), pw_oc)
    pt = _pixel_tile(P, vl, pw_vecs)
    work = N * O * P * C
    if ost is None:     # unknown consumer: the flat result at root, tiled the same way
        ost, tile_stage = flat, None
        n, o, p = ost.op.axis
    else:
        tile_stage = flat
        n, o, y, x = ost.op.axis
        p = ost.fuse(y, x)
    oo, oi = ost.split(o, ob)
    po, pi = ost.split(p, pt)
    if -(-P // pt) >= 4:
        ost.reorder(n, po, oo, oi, pi)
        outer, at = ost.fuse(n, po), oo
    else:   # a small plane (7x7: one tile and a sliver) splits over channel blocks instead
        ost.reorder(n, oo, po, oi, pi)
        outer, at = ost.fuse(n, oo), po
    pv, pl = ost.split(pi, vl) if pt > vl else (None, pi)
    if pv is not None:
        ost.unroll(pv)
    if pt >= 4:
        ost.vectorize(pl)
    if parallel_knob(work >= 1 << 16):
        ost.parallel(outer)
    if tile_stage is None:
        return s
    flat.set_scope("local")
    flat.compute_at(ost, at)
    n, o, p = flat.op.axis
    (rc,) = flat.op.reduce_axis
    pv2, pl2 = flat.split(p, vl) if pt > vl else (None, p)
    if pv2 is not None:
        flat.reorder(n, rc, o, pv2, pl2)
        flat.unroll(pv2)
    else:
        flat.reorder(n, rc, o, pl2)
    flat.unroll(o)
    if pt >= 4:
        flat.vectorize(pl2)
    return s


#: vectors of flat pixels a depthwise tap accumulates at once: independent FMA chains over the
#: unrolled window (one vector: ConvNeXt's 7x7 depthwise at 96x56x56 took 2x onnxruntime's time;
#: eight: 1.3x, and no slower on 3x3 and 5x5)
DW_FLAT_VECS = 8


def schedule_depthwise_flat(outs):
    """Depthwise over flat phase planes: per (n, channel) — the parallel loop — the padded phase
    planes and the flat accumulation live in a per-channel local buffer (L1); the accumulation
    vectorizes over q with the kernel window unrolled; the epilogue drops the pitch padding."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    flat, ost = _flat_pipeline(s, outs, "depthwise_flat")
    pad = next((st for st in s.stages if not st.is_placeholder and st.op.name == "data_phase"), None)
    _schedule_rest(s, (flat, ost, pad))
    F = flat.op.output(0)
    N, C, Q = F.shape
    vl = lanes(F.dtype)
    if ost is None:
        ost = flat
        flat = None
        n, c, q = ost.op.axis
        outer = ost.fuse(n, c)
        qo, qi = ost.split(q, vl)
        ost.vectorize(qi)
    else:
        n, c, y, x = ost.op.axis
        outer = ost.fuse(n, c)
        OW = ost.op.output(0).shape[3]
        if OW >= 4:
            xo, xi = ost.split(x, min(vl, OW))
            ost.vectorize(xi)
    if parallel_knob(N * C * Q >= 1 << 13):
        ost.parallel(outer)
    if flat is not None:
        flat.set_scope("local")
        flat.compute_at(ost, outer)
        n, c, q = flat.op.axis
        ry, rx = flat.op.reduce_axis
        qo, qi = flat.split(q, vl * knob("dw_vecs", DW_FLAT_VECS))
        flat.reorder(n, c, qo, ry, rx, qi)
        if knob("dw_unroll", True):
            flat.unroll(ry)
            flat.unroll(rx)
        flat.vectorize(qi)
    if pad is not None:
        pad.set_scope("local")
        pad.compute_at(ost, outer)
        j = pad.op.axis[-1]
        jo, ji = pad.split(j, vl)
        pad.vectorize(ji)
    return s
