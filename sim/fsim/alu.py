"""fsim's tensor ALU: the op definitions on arrays (int64, and int32 where arithmetic wraps as the
ALU's does) and the vectorized paths (hazard-free blocks, MOV broadcasts, closed forms of long
immediate loops, in-order runs where elements see each other's writes)."""
from __future__ import annotations

import numpy as np

from accel.isa import Alu, AluOp
from accel.isa.operands import (
    REQUANT_MIN_ACC_WIDTH,
    REQUANT_ROUND_BIT,
    REQUANT_SHIFT_BITS,
    REQUANT_SHIFT_LSB,
    SCALE_MUL_BITS,
    SCALE_SHIFT_BITS,
    decode_clamp,
    decode_flush,
    decode_requant,
)

from ..errors import SimError
from . import loops
from .loops import LoopPlan
from .memory import wrap
from .stats import FsimStats


class AluPaths:
    """ALU (a mixin of Fsim)."""

    def _alu(self, idx: int, insn: Alu, dram: np.ndarray, stats: FsimStats) -> None:
        n = (insn.uop_end - insn.uop_bgn) * insn.iter_out * insn.iter_in
        if (n > loops.CHUNK_ELEMS and self._iter_base is None and self.races is None and insn.use_imm
                and insn.alu_op != AluOp.FLUSH and self._alu_repeated(insn, stats)):
            return
        if self._in_chunks(idx, insn, dram, stats, self._alu):
            return
        plan = self._plan(idx, insn, "ALU")
        dst, src = plan.dst, plan.src
        if dst.size == 0:
            return
        stats.alu_uops += dst.size
        op, w = insn.alu_op, self.cfg.acc_width
        use_imm = insn.use_imm and op != AluOp.FLUSH    # FLUSH seeds from the register whatever use_imm says
        if self.races:
            self._race_accesses(insn, plan, gemm=False, use_imm=use_imm)
        if not plan.derive("hazard", lambda: self._alu_hazard(plan, use_imm)):
            d = plan.run or dst
            # elements that only read their own entry and one operand for all can go in any order:
            # by the contiguous blocks of their entries, each a view (no gather and scatter)
            blocks = plan.derive("blocks", lambda: _entry_blocks(dst, plan.run)) or [d]
            if op == AluOp.FLUSH:   # the output buffer gets the requantized sums, then the seeds come
                for b in blocks:
                    self.out[b] = flush_requant(self.acc[b], insn.imm, w).astype(self.out.dtype)
            if op in (AluOp.MOV, AluOp.FLUSH) and not use_imm:   # a copy: acc_width values already
                if not self._mov_broadcast(insn, plan, write_out=op == AluOp.MOV):
                    res = self.acc[plan.src]
                    self.acc[d] = res
                    if op == AluOp.MOV:
                        self.out[d] = res.astype(self.out.dtype)
                return
            operand = self._alu_operand(insn, plan)
            if np.ndim(operand) == 3:    # one entry per element, in element order
                blocks = [d]
            for b in blocks:
                res = self._alu_apply(op, self.acc[b], operand)
                self.acc[b] = res
                self.out[b] = res.astype(self.out.dtype)
        else:   # in order, one vector step per run of elements that do not see each other's writes
            for seg in plan.derive("runs", lambda: _independent_runs(dst, src, use_imm)):
                d = dst[seg]
                b = np.int64(insn.imm) if use_imm else self.acc[src[seg]].astype(np.int64)
                q = flush_requant(self.acc[d], insn.imm, w) if op == AluOp.FLUSH else None
                res = self._alu_apply(op, self.acc[d], b)
                self.acc[d] = res
                self.out[d] = (res if q is None else q).astype(self.out.dtype)

    def _alu_repeated(self, insn: Alu, stats: FsimStats) -> bool:
        """A long immediate ALU (not FLUSH): each element reads only its own entry, so entry d ends
        as op applied count(d) times; counted per entry (in blocks) and applied in closed form (ADD,
        MUL; MIN, MAX, CLIP, CLAMP, MOV are idempotent) or until a fixed point (SHR, REQUANT, SCALE
        settle within a few dozen steps). What would take one Python step per element of a 16383 x
        16383 loop takes milliseconds. False (nothing done): an index out of range (the block path
        reports it) or no fixed point within 4096 steps."""
        c, w = self.cfg, self.cfg.acc_width
        u = self.uop[insn.uop_bgn:insn.uop_end, 0]
        if int(u.max()) + (insn.iter_out - 1) * insn.dst_factor_out + (insn.iter_in - 1) * insn.dst_factor_in \
                >= c.acc_depth:
            return False
        base = np.zeros(c.acc_depth, np.int64)        # entries one i0 pass writes, with their counts
        step = max(1, loops.CHUNK_ELEMS // len(u))
        for b in range(0, insn.iter_in, step):
            i1 = np.arange(b, min(insn.iter_in, b + step), dtype=np.int64)[:, None]
            base += np.bincount((u[None, :] + i1 * insn.dst_factor_in).reshape(-1), minlength=c.acc_depth)
        if insn.dst_factor_out == 0:
            count = base * insn.iter_out
        else:
            count = np.zeros_like(base)
            for i0 in range(insn.iter_out):
                sh = i0 * insn.dst_factor_out
                count[sh:] += base[:c.acc_depth - sh]
        idx = np.flatnonzero(count)
        k = count[idx][:, None, None]
        a = self.acc[idx].astype(np.int64)
        op, imm, m = insn.alu_op, np.int64(insn.imm), (1 << w) - 1
        if op == AluOp.ADD:
            res = wrap(a + k * imm, w)
        elif op == AluOp.MUL:                          # a * imm^k mod 2^w, by squaring (w <= 32: exact in uint64)
            r, sq = (a & m).astype(np.uint64), np.full(a.shape, int(imm) & m, np.uint64)
            e = np.broadcast_to(k, a.shape).copy()
            while e.any():
                odd = (e & 1).astype(bool)
                r[odd] = (r[odd] * sq[odd]) & np.uint64(m)
                sq = (sq * sq) & np.uint64(m)
                e >>= 1
            res = wrap(r.astype(np.int64), w)
        elif op in (AluOp.MIN, AluOp.MAX, AluOp.CLIP, AluOp.CLAMP, AluOp.MOV):
            res = self._alu_apply(op, a, imm)
        else:
            left = np.broadcast_to(k, a.shape).copy()
            for _ in range(4096):
                live = left > 0
                if not live.any():
                    break
                nxt = self._alu_apply(op, a[live], imm).astype(np.int64)
                left[live] = np.where(nxt == a[live], 0, left[live] - 1)
                a[live] = nxt
            else:
                return False
            res = wrap(a, w)
        self.acc[idx] = res
        self.out[idx] = res.astype(self.out.dtype)
        stats.alu_uops += len(u) * insn.iter_out * insn.iter_in
        return True

    def _mov_broadcast(self, insn: Alu, plan: LoopPlan, write_out: bool = True) -> bool:
        """A MOV whose every iteration copies the same micro-op sources (a bias over an output tile)
        as broadcast copies of those few entries into slices, instead of a gather and a scatter of
        every element: the iterations' destinations of the tile in micro-op order (plan.run), or of
        each micro-op a contiguous block (the compiler's channel-block-major tiles). Only without
        hazards (then every read precedes every write, as in-order execution gives). write_out=False:
        the accumulator only (a FLUSH writes its own output values)."""
        nu, n_it = insn.uop_end - insn.uop_bgn, insn.iter_out * insn.iter_in
        if insn.src_factor_out or insn.src_factor_in or nu > 64:
            return False
        blocks = plan.run is None
        if blocks and not ((insn.iter_in == 1 or insn.dst_factor_in == 1) and
                           (insn.iter_out == 1 or insn.dst_factor_out == insn.iter_in)):
            return False
        res = self.acc[plan.src[:nu]]
        res_out = res.astype(self.out.dtype) if write_out else None
        if not blocks:
            self.acc[plan.run].reshape(n_it, *res.shape)[...] = res
            if write_out:
                self.out[plan.run].reshape(n_it, *res.shape)[...] = res_out
            return True
        for k, lo in enumerate(plan.dst[:nu].tolist()):         # uop k writes lo .. lo + n_it - 1
            self.acc[lo:lo + n_it] = res[k]
            if write_out:
                self.out[lo:lo + n_it] = res_out[k]
        return True

    def _alu_apply(self, op: AluOp, a: np.ndarray, b) -> np.ndarray:
        """alu_apply, in int32 where alu_apply_int32 takes the op (a 32-bit accumulator)."""
        res = alu_apply_int32(op, a, b) if self.cfg.acc_width == 32 else None
        return alu_apply(op, a, b, self.cfg.acc_width) if res is None else res

    def _alu_hazard(self, plan: LoopPlan, use_imm: bool) -> bool:
        """Whether an element reads or rewrites an accumulator entry that an earlier element of the
        instruction wrote: then execution order matters and the ALU runs element by element."""
        dst, src, n = plan.dst, plan.src, plan.dst.size
        if plan.run is not None:
            return not use_imm and bool(((src >= plan.run.start) & (src < plan.run.start + np.arange(n))).any())
        if np.bincount(dst).max() > 1:
            return True
        if use_imm:
            return False
        first_write = np.full(self.cfg.acc_depth, n, np.int64)
        first_write[dst[::-1]] = np.arange(n - 1, -1, -1)
        return bool((first_write[src] < np.arange(n)).any())

    def _alu_operand(self, insn: Alu, plan: LoopPlan) -> np.ndarray:
        """The second operand: the immediate, one accumulator entry when every element reads the
        same one (it broadcasts), else one entry per element."""
        if insn.use_imm:
            return np.int64(insn.imm)
        one = plan.derive("one_src", lambda: int(plan.src[0]) if (plan.src == plan.src[0]).all() else -1)
        return self.acc[one if one >= 0 else plan.src].astype(np.int64)


def _entry_blocks(dst: np.ndarray, run: slice | None, most: int = 16) -> list[slice] | None:
    """The accumulator entries of dst (distinct) as contiguous blocks, in entry order; None when
    dst is one run already or has more than `most` blocks."""
    if run is not None:
        return None
    s = np.sort(dst)
    cuts = [0, *(np.flatnonzero(np.diff(s) != 1) + 1).tolist(), s.size]
    if len(cuts) - 1 > most:
        return None
    return [slice(int(s[a]), int(s[b - 1]) + 1) for a, b in zip(cuts, cuts[1:])]


def _independent_runs(dst: np.ndarray, src: np.ndarray, use_imm: bool) -> list[slice]:
    """The elements of an ALU instruction with hazards, in order, cut into runs in which no element
    reads or rewrites an entry an earlier element of its run wrote: each run is then one vector
    step (its reads all precede its writes, which is what in-order execution gives it)."""
    cuts, written = [0], set()
    for i, (d, s) in enumerate(zip(dst.tolist(), src.tolist())):
        if d in written or (not use_imm and s in written):
            cuts.append(i)
            written = set()
        written.add(d)
    cuts.append(len(dst))
    return [slice(lo, hi) for lo, hi in zip(cuts, cuts[1:])]


def alu_apply(op: AluOp, a: np.ndarray, b: np.ndarray, acc_width: int) -> np.ndarray:
    """One ALU operation on acc_width two's-complement values (see AluOp for the definitions)."""
    a = a.astype(np.int64)
    b = np.asarray(b)
    if b.size > 1 and (b == b.flat[0]).all():
        # one operand for every element (an immediate, a tile's requantization operand): a scalar,
        # so only the accumulator side costs array operations
        b = np.int64(wrap(b.flat[0], acc_width))
    else:
        b = wrap(b, acc_width).astype(np.int64)
    if op == AluOp.MIN:
        r = np.minimum(a, b)
    elif op == AluOp.MAX:
        r = np.maximum(a, b)
    elif op == AluOp.ADD:
        r = a + b
    elif op == AluOp.MUL:
        r = a * b  # |a*b| < 2^62 for acc_width <= 32
    elif op == AluOp.SHR:
        sbits = acc_width.bit_length()  # log2(acc_width) + 1
        s = b & ((1 << sbits) - 1)
        s = np.where(s >= 1 << (sbits - 1), s - (1 << sbits), s)
        r = np.where(s >= 0, a >> np.maximum(s, 0), a << np.maximum(-s, 0))
    elif op == AluOp.CLIP:
        nb = wrap(-b, acc_width).astype(np.int64)
        r = np.minimum(np.maximum(a, nb), b)
    elif op in (AluOp.MOV, AluOp.FLUSH):   # FLUSH's accumulator side; its output side is flush_requant
        r = np.broadcast_to(b, a.shape)
    elif op in (AluOp.CLAMP, AluOp.REQUANT):
        lo, hi = ((b & 0xFF) ^ 0x80) - 0x80, (((b >> 8) & 0xFF) ^ 0x80) - 0x80     # (accel.isa.operands)
        if op == AluOp.REQUANT and acc_width >= REQUANT_MIN_ACC_WIDTH:
            s = (b >> REQUANT_SHIFT_LSB) & ((1 << REQUANT_SHIFT_BITS) - 1)
            half = ((b >> REQUANT_ROUND_BIT) & 1) * (np.left_shift(1, s) >> 1)   # 2^(s-1), 0 for s = 0
            m = 1 << acc_width                                          # wrap in int64: no casts
            a = (((a + half + (m >> 1)) & (m - 1)) - (m >> 1)) >> s
        r = np.minimum(np.maximum(a, lo), hi)
    elif op == AluOp.SCALE:
        r = scale_fixed(a, b & ((1 << acc_width) - 1), acc_width)
    else:
        raise SimError(f"unknown ALU op {op!r}")
    return wrap(r, acc_width)


_I32_OPS = {AluOp.MIN: np.minimum, AluOp.MAX: np.maximum, AluOp.ADD: np.add, AluOp.MUL: np.multiply}


def alu_apply_int32(op: AluOp, a: np.ndarray, b) -> np.ndarray | None:
    """alu_apply for a 32-bit accumulator computed in int32, whose array arithmetic wraps as the
    ALU's does: a fraction of the int64 path's passes over a layer-sized tile. None where it does
    not apply (SCALE; a per-element operand for anything but MIN, MAX, ADD, MUL): alu_apply then.
    a: int32 entries (not modified); b: an int64 scalar, or an array broadcasting against a."""
    b = np.asarray(b)
    if b.ndim and (b == b.flat[0]).all():
        b = b.flat[0]
    if b.ndim and op in _I32_OPS:
        return _I32_OPS[op](a, b.astype(np.int64).astype(np.int32))     # astype wraps to 32 bits
    if b.ndim:
        return None
    v = int(b) & 0xFFFFFFFF
    v -= (v >> 31) << 32                                                # b as a signed 32-bit value
    if op in _I32_OPS:
        return _I32_OPS[op](a, np.int32(v))
    if op == AluOp.SHR:
        sh = ((v & 63) ^ 32) - 32                                       # the signed low 6 bits
        return a >> np.int32(sh) if sh >= 0 else (a << np.int32(-sh) if sh > -32 else np.zeros_like(a))
    if op in (AluOp.MOV, AluOp.FLUSH):
        return np.full_like(a, v)
    if op == AluOp.CLIP:
        nv = -v if v != -(1 << 31) else v                               # -b wrapped to 32 bits
        r = np.maximum(a, np.int32(nv))
        return np.minimum(r, np.int32(v), out=r)
    if op in (AluOp.CLAMP, AluOp.REQUANT):
        lo, hi = decode_clamp(v)
        if op == AluOp.REQUANT:
            sh, half, lo, hi = decode_requant(v, 32)
            r = a + np.int32(half)                                      # the rounding term, wrapping
            r >>= np.int32(sh)
        else:
            r = a.copy()
        np.maximum(r, np.int32(lo), out=r)
        return np.minimum(r, np.int32(hi), out=r)
    return None


def flush_requant(a: np.ndarray, imm: int, acc_width: int) -> np.ndarray:
    """AluOp.FLUSH's output side: clamp((a + r) >> s, lo, hi) with s = imm[4:0], r = 2^(s-1) when
    imm[5] (the sum wrapping to acc_width bits), hi = imm[14:7] signed, lo = 0 if imm[6], else -hi if
    imm[15], else -hi-1."""
    s, half, lo, hi = decode_flush(imm)
    m = 1 << acc_width
    half &= m - 1
    if a.dtype == np.int32 and acc_width == 32:   # int32 arithmetic wraps as the lane's sum does
        v = a + np.int32(half - (m if half >> 31 else 0))
        v >>= np.int32(s)
        np.maximum(v, np.int32(lo), out=v)
        return np.minimum(v, np.int32(hi), out=v)
    v = (((a.astype(np.int64) + (half + (m >> 1))) & (m - 1)) - (m >> 1)) >> s
    return np.clip(v, lo, hi)


def scale_fixed(a: np.ndarray, b_unsigned: np.ndarray, acc_width: int) -> np.ndarray:
    """AluOp.SCALE: sat((a * M + 2^(k-1)) >> k), M = b[23:0], k = b[29:24]. a * M < 2^55: int64 is exact."""
    m, k = b_unsigned & ((1 << SCALE_MUL_BITS) - 1), (b_unsigned >> SCALE_MUL_BITS) & ((1 << SCALE_SHIFT_BITS) - 1)
    half = np.where(k > 0, np.left_shift(1, np.maximum(k - 1, 0)), 0)
    v = (a * m + half) >> k
    return np.clip(v, -(1 << (acc_width - 1)), (1 << (acc_width - 1)) - 1)
