"""A hand-written blocked int8 matmul over the command stream (until the compiler generates these):

    C = clip((A @ B + bias) >> shift, lo, hi)      A: int8 (M, K), B: int8 (K, N), bias: int32 (N,)

Operands are padded to whole blocks and packed into the accelerator's layouts on the host; the
output is tiled (tm x tn blocks held in the accumulator, K walked in chunks of tk blocks), each
GEMM covering a whole tile with both affine loop levels, so a kernel has only tk micro-ops.
Bias is added by ALU ADD from an ACC-loaded bias row, then SHR and MIN/MAX (or CLIP).
virtual_threads=2 double-buffers the input/weight tiles and the accumulator tiles, with
dependency tokens letting loads run ahead of compute and compute ahead of stores.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from accel.isa import AccelConfig, AluOp, MemType, Stage, layout
from accel.isa.config import ALU_IMM_BITS, LOOP_ITER_BITS

from .errors import CommandError

log = logging.getLogger(__name__)

L, C, S = Stage.LOAD, Stage.COMPUTE, Stage.STORE
_INT = {8: np.int8, 16: np.int16, 32: np.int32}


@dataclass(frozen=True)
class MatmulPlan:
    """Tiling of an (M, K) @ (K, N) matmul, all sizes in blocks (batch rows, block_in, block_out)."""
    mt: int          # row blocks of A (ceil(M / batch))
    kt: int          # K blocks (ceil(K / block_in))
    nt: int          # column blocks of B (ceil(N / block_out))
    tm: int          # row blocks per output tile
    tn: int          # column blocks per output tile
    tk: int          # K blocks per GEMM
    slots: int       # 1, or 2 with virtual threads (double buffering)
    inp_slot: int    # input-buffer entries per slot
    wgt_slot: int    # weight-buffer entries per slot
    acc_slot: int    # accumulator entries per slot
    bias_base: int   # accumulator index of the bias row (tn entries)

    @property
    def steps(self) -> int:
        return -(-self.mt // self.tm) * -(-self.nt // self.tn) * -(-self.kt // self.tk)


def _splits(x: int) -> list[int]:
    """Tile sizes that split x into equal-ish parts: ceil(x / d) for every part count d."""
    return sorted({-(-x // d) for d in range(1, x + 1)} if x <= 4096 else
                  {-(-x // d) for d in range(1, 4097)} | {1})


def plan_matmul(cfg: AccelConfig, m: int, k: int, n: int, virtual_threads: int = 2) -> MatmulPlan:
    """Choose tile sizes that fit the config's buffers and minimise DRAM traffic plus a per-step cost."""
    if virtual_threads not in (1, 2):
        raise CommandError(f"matmul: virtual_threads={virtual_threads}; allowed values are 1, 2")
    if min(m, k, n) < 1:
        raise CommandError(f"matmul: shape M={m}, K={k}, N={n} must be positive")
    ns = virtual_threads
    mt, kt, nt = -(-m // cfg.batch), -(-k // cfg.block_in), -(-n // cfg.block_out)
    inp_slot, wgt_slot = cfg.inp_depth // ns, cfg.wgt_depth // ns
    max_iter = (1 << LOOP_ITER_BITS) - 1
    step_cost = 4096  # bytes-equivalent overhead of one load/GEMM step
    best = None
    for tk in _splits(kt):
        if tk > cfg.uop_depth - 2 or tk > inp_slot or tk > wgt_slot:
            continue
        tn_max = min(nt, wgt_slot // tk, max_iter)
        for tn in (t for t in _splits(nt) if t <= tn_max):
            acc_slot = (cfg.acc_depth - tn) // ns
            tm_max = min(mt, inp_slot // tk, acc_slot // tn if tn else 0, max_iter)
            if tm_max < 1:
                continue
            tm = -(-mt // -(-mt // tm_max))  # balance the row tiles
            mtiles, ntiles, ksteps = -(-mt // tm), -(-nt // tn), -(-kt // tk)
            traffic = (cfg.inp_elem_bytes * mt * kt * ntiles + cfg.wgt_elem_bytes * nt * kt * mtiles
                       + step_cost * mtiles * ntiles * ksteps)
            cost = (traffic, -tk, -tm * tn)
            if best is None or cost < best[0]:
                best = (cost, tm, tn, tk, acc_slot)
    if best is None:
        raise CommandError(f"matmul: no tiling fits config {cfg.digest()} (inp {cfg.inp_depth}, wgt {cfg.wgt_depth}, "
                           f"acc {cfg.acc_depth}, uop {cfg.uop_depth} entries) with virtual_threads={ns}")
    _, tm, tn, tk, acc_slot = best
    return MatmulPlan(mt, kt, nt, tm, tn, tk, ns, inp_slot, wgt_slot, acc_slot, bias_base=ns * acc_slot)


# ---- host-side packing ------------------------------------------------------------------------
def pack_inp(cfg: AccelConfig, a: np.ndarray, mt: int, kt: int) -> np.ndarray:
    """(M, K) -> (mt, kt, batch, block_in) INP entries, zero-padded (accel.isa.layout's dense input)."""
    return layout.pack_blocked(np.asarray(a).astype(np.int8, copy=False), layout.inp_block(cfg), (mt, kt))


def pack_wgt(cfg: AccelConfig, b: np.ndarray, kt: int, nt: int) -> np.ndarray:
    """(K, N) -> (nt, kt, block_out, block_in) WGT entries, zero-padded: B's transpose as O I."""
    return layout.pack_blocked(np.asarray(b).astype(np.int8, copy=False).T, layout.wgt_block(cfg), (nt, kt))


def pack_bias(cfg: AccelConfig, bias: np.ndarray, nt: int) -> np.ndarray:
    """(N,) -> (nt, batch, block_out) ACC entries, the bias repeated for every batch row."""
    return layout.pack_bias(bias, cfg, _INT[cfg.acc_width], out_blocks=nt)


def unpack_out(cfg: AccelConfig, c: np.ndarray, m: int, n: int) -> np.ndarray:
    """(mt, nt, batch, block_out) OUT entries -> (M, N)."""
    return layout.unpack_blocked(c, (m, n))


def matmul_reference(a, b, bias=None, shift: int = 0, lo: int | None = -128, hi: int | None = 127,
                     acc_width: int = 32, out_width: int = 8) -> np.ndarray:
    """The same computation in numpy, with the accelerator's wrap-around arithmetic."""
    acc = a.astype(np.int64) @ b.astype(np.int64)
    if bias is not None:
        acc = acc + np.asarray(bias, np.int64)
    acc = acc.astype(_INT[acc_width]).astype(np.int64)  # accumulation wraps to acc_width
    acc = acc >> shift
    if hi is not None:
        acc = np.minimum(acc, hi)
    if lo is not None:
        acc = np.maximum(acc, lo)
    return acc.astype(_INT[out_width])


# ---- the command stream -------------------------------------------------------------------------
def _check_args(cfg, a, b, bias, shift, lo, hi):
    if cfg.inp_width != 8 or cfg.wgt_width != 8:
        raise CommandError(f"matmul: needs inp_width=wgt_width=8, config has {cfg.inp_width}/{cfg.wgt_width}")
    for name, x in (("A", a), ("B", b)):
        if x.ndim != 2 or x.dtype != np.int8:
            raise CommandError(f"matmul: {name} must be a 2-D int8 array, got {x.dtype} with shape {x.shape}")
    if a.shape[1] != b.shape[0]:
        raise CommandError(f"matmul: inner dimensions differ: A is {a.shape}, B is {b.shape}")
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != b.shape[1] or bias.dtype.kind != "i"):
        raise CommandError(f"matmul: bias must be a 1-D integer array of length N={b.shape[1]}, got "
                           f"{bias.dtype} with shape {bias.shape}")
    if not 0 <= shift < cfg.acc_width:
        raise CommandError(f"matmul: shift={shift} outside [0, {cfg.acc_width - 1}]")
    imm_lo, imm_hi = -(1 << (ALU_IMM_BITS - 1)), (1 << (ALU_IMM_BITS - 1)) - 1
    for name, v in (("lo", lo), ("hi", hi)):
        if v is not None and not imm_lo <= v <= imm_hi:
            raise CommandError(f"matmul: {name}={v} outside the ALU immediate range [{imm_lo}, {imm_hi}]")
    if lo is not None and hi is not None and lo > hi:
        raise CommandError(f"matmul: lo={lo} > hi={hi}")


def matmul(device, a: np.ndarray, b: np.ndarray, bias: np.ndarray | None = None, shift: int = 0,
           lo: int | None = -128, hi: int | None = 127, virtual_threads: int = 2):
    """Run C = clip((A @ B + bias) >> shift, lo, hi) on `device`; returns (C, RunResult).

    C has the output width's integer type (int8 by default). lo/hi of None skip that bound.
    """
    cfg = device.cfg
    a, b = np.asarray(a), np.asarray(b)
    bias = None if bias is None else np.asarray(bias)
    _check_args(cfg, a, b, bias, shift, lo, hi)
    m, k = a.shape
    n = b.shape[1]
    p = plan_matmul(cfg, m, k, n, virtual_threads)
    log.info("matmul %dx%dx%d: %s", m, k, n, p)
    mem = device.memory
    bufs = []
    try:
        def put(arr, eb, name):
            buf = mem.alloc_array(arr, align=max(64, eb), name=name)
            bufs.append(buf)
            return buf
        abuf = put(pack_inp(cfg, a, p.mt, p.kt), cfg.inp_elem_bytes, "matmul A")
        bbuf = put(pack_wgt(cfg, b, p.kt, p.nt), cfg.wgt_elem_bytes, "matmul B")
        biasbuf = None if bias is None else put(pack_bias(cfg, bias, p.nt), cfg.acc_elem_bytes, "matmul bias")
        cbuf = put(np.zeros((p.mt, p.nt, cfg.batch, cfg.block_out), _INT[cfg.out_width]), cfg.out_elem_bytes,
                   "matmul C")
        s = device.stream()
        _emit(s, p, abuf, bbuf, biasbuf, cbuf, shift, lo, hi)
        result = s.synchronize()
        out = cbuf.read(_INT[cfg.out_width], (p.mt, p.nt, cfg.batch, cfg.block_out))
    finally:
        for buf in bufs:
            buf.free()
    return unpack_out(cfg, out, m, n), result


def _emit(s, p: MatmulPlan, abuf, bbuf, biasbuf, cbuf, shift, lo, hi) -> None:
    ns = p.slots
    tiles = [(ni, mi) for ni in range(0, p.nt, p.tn) for mi in range(0, p.mt, p.tm)]
    ksteps = list(range(0, p.kt, p.tk))
    nsteps = len(tiles) * len(ksteps)
    j = 0
    bias_loaded = None
    for i, (n0, m0) in enumerate(tiles):
        tm, tn = min(p.tm, p.mt - m0), min(p.tn, p.nt - n0)
        acc_base = (i % ns) * p.acc_slot
        reset_k = s.kernel(("matmul.reset", tm, tn, acc_base), lambda kb: (
            kb.loop_begin(tm, dst_factor=tn), kb.loop_begin(tn, dst_factor=1), kb.push(acc_base)))
        for k0 in ksteps:
            tk = min(p.tk, p.kt - k0)
            inp_base, wgt_base = (j % ns) * p.inp_slot, (j % ns) * p.wgt_slot
            # load stage: wait until compute has released this slot (step j - ns)
            if j >= ns:
                s.dep_pop(C, L)
            s.load_2d(MemType.INP, inp_base, abuf, m0 * p.kt + k0, y_size=tm, x_size=tk, x_stride=p.kt)
            s.load_2d(MemType.WGT, wgt_base, bbuf, n0 * p.kt + k0, y_size=tn, x_size=tk, x_stride=p.kt)
            s.dep_push(L, C)
            # compute: the first K step starts the tile once the store of tile i - ns is done
            if k0 == 0:
                if i >= ns:
                    s.dep_pop(S, C)
                s.push_gemm(reset_k, reset=True)
            gemm_k = s.kernel(("matmul.gemm", tm, tn, tk, acc_base, inp_base, wgt_base), lambda kb: (
                kb.loop_begin(tm, dst_factor=tn, src_factor=tk),
                kb.loop_begin(tn, dst_factor=1, wgt_factor=tk),
                [kb.push(acc_base, inp_base + kk, wgt_base + kk) for kk in range(tk)]))
            s.dep_pop(L, C)
            s.push_gemm(gemm_k)
            if j + ns < nsteps:
                s.dep_push(C, L)
            j += 1
        # epilogue on compute: bias, shift, clip; then hand the tile to the store stage
        alu_k = s.kernel(("matmul.alu", tm, tn, acc_base, p.bias_base), lambda kb: (
            kb.loop_begin(tm, dst_factor=tn), kb.loop_begin(tn, dst_factor=1, src_factor=1),
            kb.push(acc_base, p.bias_base)))
        if biasbuf is not None:
            if bias_loaded != (n0, tn):
                s.load_2d(MemType.ACC, p.bias_base, biasbuf, n0, y_size=1, x_size=tn)
                bias_loaded = (n0, tn)
            s.push_alu(alu_k, AluOp.ADD)
        if shift:
            s.push_alu(alu_k, AluOp.SHR, shift)
        if lo is not None and hi is not None and lo == -hi:
            s.push_alu(alu_k, AluOp.CLIP, hi)
        else:
            if hi is not None:
                s.push_alu(alu_k, AluOp.MIN, hi)
            if lo is not None:
                s.push_alu(alu_k, AluOp.MAX, lo)
        s.dep_push(C, S)
        s.dep_pop(C, S)
        s.store_2d(acc_base, cbuf, m0 * p.nt + n0, y_size=tm, x_size=tn, x_stride=p.nt)
        if i + ns < len(tiles):
            s.dep_push(S, C)
