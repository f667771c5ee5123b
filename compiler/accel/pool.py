"""Max pooling on the accelerator's tensor ALU, over packed int8 activations.

The ALU only reads the accumulator, so each tile's input rows enter through the input buffer and
reach the accumulator by a GEMM against the identity tile (as compiler.accel.eltwise does), into
a padded window region pre-filled with -128 (the int8 minimum: max pooling's padding). Then one
ALU MOV takes each window's first element and one ALU MAX, whose micro-ops are the other window
offsets under the two affine loops (output rows, output columns), folds in the rest; a fused
clamp (ReLU/clip after the pool) is one more pass. Every ALU pass writes its narrowed result to
the output buffer too, so the last one is what the STORE writes. Bit-exact with the graph's int8
max_pool2d (compiler.graph.ops), ceil_mode's extra bottom/right windows included.

Tiles are (planes, output rows) of the packed layout (N/b, C/bo, H, W, b, bo): several whole
planes when one fits, else bands of output rows of one plane (input rows overlap by the halo).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from accel.isa import AccelConfig, AluOp, MemType, operands
from accel.isa.widths import LOOP_ITER_BITS

from ..graph.ops import pool_out_hw
from .eltwise import identity_weights
from .layout import pack_activation, unpack_activation
from .pipeline import TokenPipeline
from .spec import TilingError

INT8_MIN = -128


@dataclass(frozen=True)
class PoolSpec:
    """A max pooling over `planes` packed planes of h x w entries; pads are (top, left, bottom, right)
    as the graph op's, ceil_mode as ONNX's."""
    planes: int
    h: int
    w: int
    kernel: tuple[int, int]
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    ceil_mode: int = 0
    name: str = "max_pool2d"

    def __post_init__(self):
        for k, v in (("planes", self.planes), ("h", self.h), ("w", self.w), ("kernel", min(self.kernel)),
                     ("strides", min(self.strides))):
            if v < 1:
                raise TilingError(f"{self.name}: {k} must be >= 1, got {v}")
        if min(self.pads) < 0:
            raise TilingError(f"{self.name}: pads {list(self.pads)} must be >= 0")
        for k in range(2):
            if max(self.pads[k], self.pads[k + 2]) >= self.kernel[k]:
                raise TilingError(f"{self.name}: pads {list(self.pads)} must be smaller than the kernel "
                                  f"{list(self.kernel)} (a window of padding only)")

    @property
    def out_hw(self) -> tuple[int, int]:
        attrs = {"kernel": self.kernel, "strides": self.strides, "pads": self.pads, "ceil_mode": self.ceil_mode}
        oh, ow = pool_out_hw(None, (self.h, self.w), attrs)
        return oh, ow

    @property
    def padded_w(self) -> int:
        """Columns of the window region: every window's columns, ceil_mode's extra ones included."""
        return (self.out_hw[1] - 1) * self.strides[1] + self.kernel[1]

    def rows_in(self, rows_out: int) -> int:
        return (rows_out - 1) * self.strides[0] + self.kernel[0]


@dataclass(frozen=True)
class PoolTiling:
    planes: int      # planes per tile (> 1 only with whole planes)
    rows: int        # output rows per tile
    vt: int

    def needs(self, spec: PoolSpec) -> dict[str, int]:
        """Entries of each buffer the tiling occupies (all slots)."""
        oh, ow = spec.out_hw
        g, r = self.planes, self.rows
        o_sz, p_sz = g * r * ow, g * spec.rows_in(r) * spec.padded_w
        return {"inp": self.vt * g * min(spec.h, spec.rows_in(r)) * spec.w, "acc": self.vt * (o_sz + p_sz),
                "out": self.vt * o_sz}


def plan_pool(spec: PoolSpec, cfg: AccelConfig, vt: int = 2) -> PoolTiling:
    """The largest tile that fits: whole planes (as many as fit), else bands of output rows."""
    oh, ow = spec.out_hw
    depth = {"inp": cfg.inp_depth, "acc": cfg.acc_depth, "out": cfg.out_depth}

    def fits(t: PoolTiling) -> bool:
        return all(v <= depth[k] for k, v in t.needs(spec).items()) and \
            t.planes * spec.rows_in(t.rows) * spec.padded_w < 1 << LOOP_ITER_BITS

    whole = [g for g in range(1, spec.planes + 1) if fits(PoolTiling(g, oh, vt))]
    if whole:
        return PoolTiling(max(whole), oh, vt)
    rows = [r for r in range(1, oh) if fits(PoolTiling(1, r, vt))]
    if not rows:
        need = PoolTiling(1, 1, vt).needs(spec)
        short = ", ".join(f"{k} {need[k]} > {depth[k]}" for k in need if need[k] > depth[k])
        raise TilingError(f"{spec.name}: one output row of a {spec.h}x{spec.w} plane does not fit the buffers "
                          f"({short or 'loop extent'} entries)")
    return PoolTiling(1, max(rows), vt)


def emit_max_pool(stream, spec: PoolSpec, x, out, ident, lo: int = INT8_MIN, hi: int = 127, vt: int = 2,
                  tiling: PoolTiling | None = None) -> dict[str, int]:
    """Append out = clamp(max_pool(x), lo, hi) for packed int8 x and out (planes of h x w and oh x ow
    entries); `ident` is a DRAM buffer holding identity_weights(cfg)."""
    cfg = stream.cfg
    check_square_blocks(spec, cfg)
    if not INT8_MIN <= lo <= hi <= 127:
        raise TilingError(f"{spec.name}: clamp [{lo}, {hi}] outside the int8 range")
    t = tiling or plan_pool(spec, cfg, vt)

    def clamp(o_base, g, r, r0):
        if lo > INT8_MIN or hi < 127:
            ow = spec.out_hw[1]
            ok = stream.kernel(("pool.out", o_base, g * r * ow), lambda k: walk(k, o_base, g * r * ow))
            stream.push_alu(ok, AluOp.CLAMP, operands.clamp_immediate(lo, hi))
    tiles = emit_window_tiles(stream, spec, t, x, out, ident, "pool", INT8_MIN, AluOp.MAX, clamp)
    return {"tiles": tiles, "planes_per_tile": t.planes, "rows_per_tile": t.rows}


def check_square_blocks(spec: PoolSpec, cfg: AccelConfig) -> None:
    """Packed activations pass the identity GEMM unchanged only with block_in == block_out."""
    if cfg.block_in != cfg.block_out:
        raise TilingError(f"{spec.name}: needs block_in == block_out to pool packed activations "
                          f"(config has {cfg.block_in} and {cfg.block_out})")


def emit_window_tiles(stream, spec: PoolSpec, t: PoolTiling, x, out, ident, name: str, fill: int,
                      reduce_op: AluOp, epilogue, plane_weights=None, weight_tiles: int = 1) -> int:
    """The tile scheme max and average pooling share (module doc); returns the tile count.

    Per tile: the input rows (and, on the first tile, `weight_tiles` weight tiles) load; the window
    region is pre-filled with `fill` where windows overhang the input; the rows reach it by a GEMM
    against weight tile plane_weights(plane) (0, the identity, if None); ALU MOV takes each
    window's first tap and `reduce_op` the others into the output; epilogue(o_base, planes, rows,
    first_row) appends the tile's remaining ALU passes; the STORE writes the output rows.
    `name` prefixes the micro-op kernels' cache keys."""
    vt = t.vt
    oh, ow = spec.out_hw
    (kh, kw), (sh, sw) = spec.kernel, spec.strides
    pt, pl = spec.pads[0], spec.pads[1]
    wp = spec.padded_w
    o_sz = t.planes * t.rows * ow
    rin = spec.rows_in(t.rows)
    p_sz = t.planes * rin * wp
    inp_sz = t.planes * min(spec.h, rin) * spec.w
    tiles = [(p0, r0) for p0 in range(0, spec.planes, t.planes) for r0 in range(0, oh, t.rows)]
    pipe = TokenPipeline(stream, vt, len(tiles), len(tiles))
    cols = min(spec.w, wp - pl)   # input columns some window reads
    offsets = [(dy, dx) for dy in range(kh) for dx in range(kw)]

    for ti, (p0, r0) in enumerate(tiles):
        g = min(t.planes, spec.planes - p0)
        r = min(t.rows, oh - r0)
        ri = spec.rows_in(r)
        y_lo = r0 * sh - pt                        # the first input row the band's windows read
        y0, y1 = max(0, y_lo), min(spec.h, y_lo + ri)
        nr = y1 - y0
        s = ti % vt
        inp_base, o_base, p_base = s * inp_sz, s * o_sz, vt * o_sz + s * p_sz
        padded = y_lo < 0 or y_lo + ri > spec.h or pl > 0 or wp > spec.w
        pipe.before_load(ti)
        if nr > 0:
            stream.load_2d(MemType.INP, inp_base, x, p0 * spec.h * spec.w + y0 * spec.w, y_size=g,
                           x_size=nr * spec.w, x_stride=spec.h * spec.w)
        if ti == 0:
            stream.load_2d(MemType.WGT, 0, ident, 0, x_size=weight_tiles)
        pipe.after_load()
        pipe.before_compute()
        pipe.before_tile(ti)
        if padded:   # taps outside the input hold `fill` (the input rows then overwrite theirs)
            fk = stream.kernel((f"{name}.fill", p_base, g * ri * wp), lambda k: walk(k, p_base, g * ri * wp))
            stream.push_alu(fk, AluOp.MOV, fill)
        if nr > 0 and cols > 0:
            dst0 = p_base + (y0 - y_lo) * wp + pl
            key = (p_base, inp_base, g, nr, cols, dst0, wp, spec.w, ri)
            wgts = (0,) * g
            if plane_weights is not None:
                wgts = tuple(plane_weights(p0 + q) for q in range(g))
                key += (wgts,)

            def copy(k, src_on):
                k.loop_begin(nr, dst_factor=wp, src_factor=spec.w if src_on else 0)
                k.loop_begin(cols, dst_factor=1, src_factor=1 if src_on else 0)
                for q in range(g):
                    k.push(dst0 + q * ri * wp, inp_base + q * nr * spec.w if src_on else 0, wgts[q])
            stream.push_gemm(stream.kernel((f"{name}.reset",) + key, lambda k: copy(k, False)), reset=True)
            stream.push_gemm(stream.kernel((f"{name}.copy",) + key, lambda k: copy(k, True)))

        def window(k, offs):
            k.loop_begin(r, dst_factor=ow, src_factor=sh * wp)
            k.loop_begin(ow, dst_factor=1, src_factor=sw)
            for q in range(g):
                for dy, dx in offs:
                    k.push(o_base + q * r * ow, p_base + q * ri * wp + dy * wp + dx)
        wkey = (o_base, p_base, g, r, ow, ri, wp, sh, sw)
        stream.push_alu(stream.kernel((f"{name}.first",) + wkey, lambda k: window(k, offsets[:1])), AluOp.MOV)
        if len(offsets) > 1:
            rk = stream.kernel((f"{name}.{reduce_op.name.lower()}", kh, kw) + wkey, lambda k: window(k, offsets[1:]))
            stream.push_alu(rk, reduce_op)
        epilogue(o_base, g, r, r0)
        pipe.after_chunk(ti)
        pipe.after_tile()
        pipe.before_store()
        stream.store_2d(o_base, out, p0 * oh * ow + r0 * ow, y_size=g, x_size=r * ow, x_stride=oh * ow)
        pipe.after_store(ti)
    return len(tiles)


def walk(k, base: int, n: int, src_on: int = 0) -> None:
    """n consecutive accumulator entries from base (src_on: each reading itself)."""
    k.loop_begin(n, dst_factor=1, src_factor=src_on)
    k.push(base, base if src_on else 0)


def run_max_pool(device, x: np.ndarray, kernel, strides=(1, 1), pads=(0, 0, 0, 0), ceil_mode: int = 0,
                 lo: int = INT8_MIN, hi: int = 127, vt: int = 2):
    """int8 NCHW max pooling on the device -> (int8 NCHW, RunResult)."""
    def make_spec(planes):
        return PoolSpec(planes, x.shape[2], x.shape[3], tuple(kernel), tuple(strides), tuple(pads), ceil_mode)
    return run_pool(device, x, make_spec, identity_weights(device.cfg),
                    lambda st, spec, xb, ob, wb: emit_max_pool(st, spec, xb, ob, wb, lo, hi, vt), "pool")


def run_pool(device, x: np.ndarray, make_spec, weights: np.ndarray, emit, name: str):
    """Runs one pool program on the device -> (int8 NCHW, RunResult): x packed into DRAM beside
    `weights`, make_spec(packed planes) its PoolSpec, emit(stream, spec, x, out, weights) its program."""
    cfg = device.cfg
    px = pack_activation(x, cfg.batch, cfg.block_out)
    spec = make_spec(px.shape[0] * px.shape[1])
    oh, ow = spec.out_hw
    oshape = px.shape[:2] + (oh, ow) + px.shape[4:]
    mem = device.memory
    bufs = [mem.alloc_array(px, align=cfg.inp_elem_bytes, name=f"{name}.inp"),
            mem.alloc_array(weights, align=cfg.wgt_elem_bytes, name=f"{name}.identity"),
            mem.alloc(math.prod(oshape), align=cfg.out_elem_bytes, name=f"{name}.out")]
    try:
        stream = device.stream()
        stream.emit_preloaded(lambda st: emit(st, spec, bufs[0], bufs[2], bufs[1]))
        result = stream.synchronize()
        y = unpack_activation(bufs[2].read(np.int8, oshape), x.shape[0], x.shape[1])
    finally:
        for buf in bufs:
            buf.free()
    return y, result
