"""A plain, slow, obviously-correct model of the ISA for differential tests.

It executes the instructions one by one in program order (ignoring dependency tokens: for a
race-free program, program order is a valid order), every LOAD/STORE entry by entry and every
GEMM/ALU micro-op by micro-op inside its two loops, on Python-level loops over small numpy
arrays. It shares nothing with sim/fsim.py except the ISA definitions in accel.isa. Element
widths 8, 16 and 32 are supported (4-bit packing is not).

    ReferenceMachine(cfg).run(insns, dram)   # dram: 1-D np.uint8, modified in place
"""
from __future__ import annotations

import numpy as np

from accel.isa import AccelConfig, Alu, AluOp, Epilogue, Finish, Gemm, Insn, Load, MemType, Store, decode_uops


class ReferenceError(ValueError):
    """The reference model cannot execute an instruction (bad index, address or width)."""


def wrap(v: int, bits: int) -> int:
    """Two's-complement wrap of a Python int to `bits`."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


_wrap_vec = np.vectorize(wrap, otypes=[object])


def _wrap_arr(a: np.ndarray, bits: int) -> np.ndarray:
    return _wrap_vec(a.astype(object), bits).astype(np.int64)


def _dtype(width: int) -> str:
    if width not in (8, 16, 32):
        raise ReferenceError(f"reference model supports 8/16/32-bit elements, not {width}")
    return f"<i{width // 8}"


def _flush_requant(a: int, imm: int, w: int) -> int:
    """FLUSH's requantization of one lane: clamp((a + r) >> s, lo, hi), parameters from imm."""
    s, hi = imm & 31, wrap((imm >> 7) & 0xFF, 8)
    lo = 0 if (imm >> 6) & 1 else -hi if (imm >> 15) & 1 else -hi - 1
    half = 1 << (s - 1) if s > 0 and (imm >> 5) & 1 else 0
    return min(max(wrap(a + half, w) >> s, lo), hi)


class ReferenceMachine:
    def __init__(self, cfg: AccelConfig):
        c = self.cfg = cfg
        self.inp = np.zeros((c.inp_depth, c.batch, c.block_in), np.int64)
        self.wgt = np.zeros((c.wgt_depth, c.block_out, c.block_in), np.int64)
        self.acc = np.zeros((c.acc_depth, c.batch, c.block_out), np.int64)
        self.out = np.zeros((c.out_depth, c.batch, c.block_out), np.int64)
        self.uop = [(0, 0, 0)] * c.uop_depth
        self.epilogue = Epilogue()

    # ---- memory helpers ------------------------------------------------------------------
    def _entry_shape(self, mem: MemType):
        c = self.cfg
        return {MemType.INP: ((c.batch, c.block_in), c.inp_width), MemType.WGT: ((c.block_out, c.block_in), c.wgt_width),
                MemType.ACC: ((c.batch, c.block_out), c.acc_width), MemType.OUT: ((c.batch, c.block_out), c.out_width),
                MemType.UOP: ((1,), c.uop_bits)}[mem]

    def _entry_bytes(self, mem: MemType) -> int:
        shape, width = self._entry_shape(mem)
        return int(np.prod(shape)) * width // 8

    def _buffer(self, mem: MemType):
        return {MemType.INP: self.inp, MemType.WGT: self.wgt, MemType.ACC: self.acc, MemType.OUT: self.out,
                MemType.UOP: self.uop}[mem]

    def _read_entry(self, dram: np.ndarray, mem: MemType, entry: int):
        eb = self._entry_bytes(mem)
        lo = entry * eb
        if lo < 0 or lo + eb > dram.size:
            raise ReferenceError(f"{mem.name} entry {entry} lies outside DRAM")
        raw = dram[lo:lo + eb]
        if mem == MemType.UOP:
            return tuple(int(x) for x in decode_uops(raw.copy(), self.cfg)[0])
        shape, width = self._entry_shape(mem)
        return raw.view(_dtype(width)).astype(np.int64).reshape(shape)

    # ---- execution -----------------------------------------------------------------------
    def run(self, insns: list[Insn], dram: np.ndarray) -> np.ndarray:
        for idx, insn in enumerate(insns):
            if isinstance(insn, Finish):
                break
            if isinstance(insn, Load):
                self.load(idx, insn, dram)
            elif isinstance(insn, Store):
                self.store(idx, insn, dram)
            elif isinstance(insn, Gemm):
                self.gemm(idx, insn)
            elif isinstance(insn, Alu):
                self.alu(idx, insn)
            elif isinstance(insn, Epilogue):
                self.epilogue = insn
        return dram

    def load(self, idx: int, insn: Load, dram: np.ndarray) -> None:
        mem = insn.mem_type
        buf = self._buffer(mem)
        rows = insn.y_pad0 + insn.y_size + insn.y_pad1
        cols = insn.x_pad0 + insn.x_size + insn.x_pad1
        for r in range(rows):
            for col in range(cols):
                sram = insn.sram_base + r * cols + col
                if sram >= len(buf):
                    raise ReferenceError(f"instruction {idx}: LOAD writes {mem.name} entry {sram}, beyond the buffer")
                y, x = r - insn.y_pad0, col - insn.x_pad0
                if 0 <= y < insn.y_size and 0 <= x < insn.x_size:
                    value = self._read_entry(dram, mem, insn.dram_base + y * insn.x_stride + x)
                elif mem == MemType.UOP:
                    value = (0, 0, 0)
                else:
                    value = 0
                buf[sram] = value

    def store(self, idx: int, insn: Store, dram: np.ndarray) -> None:
        shape, width = self._entry_shape(MemType.OUT)
        eb = self._entry_bytes(MemType.OUT)
        for y in range(insn.y_size):
            for x in range(insn.x_size):
                sram = insn.sram_base + y * insn.x_size + x
                if sram >= len(self.out):
                    raise ReferenceError(f"instruction {idx}: STORE reads OUT entry {sram}, beyond the buffer")
                entry = insn.dram_base + y * insn.x_stride + x
                if (entry + 1) * eb > dram.size:
                    raise ReferenceError(f"instruction {idx}: STORE writes outside DRAM")
                data = self.out[sram].astype(_dtype(width)).view(np.uint8).reshape(-1)
                dram[entry * eb:(entry + 1) * eb] = data

    def _iterations(self, insn):
        for i0 in range(insn.iter_out):
            for i1 in range(insn.iter_in):
                for u in range(insn.uop_bgn, insn.uop_end):
                    acc, src, wgt = self.uop[u]
                    dst = acc + i0 * insn.dst_factor_out + i1 * insn.dst_factor_in
                    src = src + i0 * insn.src_factor_out + i1 * insn.src_factor_in
                    if isinstance(insn, Gemm):
                        wgt = wgt + i0 * insn.wgt_factor_out + i1 * insn.wgt_factor_in
                    yield dst, src, wgt

    def gemm(self, idx: int, insn: Gemm) -> None:
        c, e = self.cfg, self.epilogue
        nu = insn.uop_end - insn.uop_bgn
        for k, (dst, src, wgt) in enumerate(self._iterations(insn)):
            if insn.reset:
                v = np.zeros_like(self.acc[dst])
            else:
                product = self.inp[src] @ self.wgt[wgt].T  # (batch, block_out), exact in int64
                v = _wrap_arr(self.acc[dst] + product, c.acc_width)
            if insn.flush and k % nu == nu - 1:   # the pass's last micro-op: requantize, then the seed
                p = k // nu
                seed = e.seed_base + p // insn.iter_in * e.seed_factor_out + p % insn.iter_in * e.seed_factor_in
                q = [[_flush_requant(int(x), e.imm, c.acc_width) for x in row] for row in v]
                self.out[dst] = q
                self.acc[dst] = q if e.to_acc else self.acc[seed].copy()
            else:
                self.acc[dst] = v
                self.out[dst] = _wrap_arr(v, c.out_width)

    def alu(self, idx: int, insn: Alu) -> None:
        c = self.cfg
        w = c.acc_width
        shift_bits = w.bit_length()  # log2(acc_width) + 1
        for dst, src, _ in self._iterations(insn):
            for b_ in range(c.batch):
                for o in range(c.block_out):
                    a = int(self.acc[dst, b_, o])
                    imm_operand = insn.use_imm and insn.alu_op != AluOp.FLUSH   # FLUSH: always the register
                    b = wrap(insn.imm, w) if imm_operand else int(self.acc[src, b_, o])
                    op = insn.alu_op
                    if op == AluOp.MIN:
                        r = min(a, b)
                    elif op == AluOp.MAX:
                        r = max(a, b)
                    elif op == AluOp.ADD:
                        r = a + b
                    elif op == AluOp.MUL:
                        r = a * b
                    elif op == AluOp.SHR:
                        s = wrap(b, shift_bits)
                        r = a >> s if s >= 0 else a << -s
                    elif op == AluOp.CLIP:
                        r = min(max(a, wrap(-b, w)), b)
                    elif op == AluOp.MOV:
                        r = b
                    elif op == AluOp.CLAMP:
                        r = min(max(a, wrap(b & 0xFF, 8)), wrap((b >> 8) & 0xFF, 8))
                    elif op == AluOp.REQUANT:
                        s = (b >> 16) & 31 if w >= 22 else 0
                        half = 1 << (s - 1) if s > 0 and (b >> 21) & 1 else 0
                        r = min(max(wrap(a + half, w) >> s, wrap(b & 0xFF, 8)), wrap((b >> 8) & 0xFF, 8))
                    elif op == AluOp.SCALE:
                        bu = b % (1 << w)
                        k = (bu >> 24) & 63
                        r = (a * (bu & 0xFFFFFF) + (1 << (k - 1) if k else 0)) >> k
                        r = min(max(r, -(1 << (w - 1))), (1 << (w - 1)) - 1)
                    elif op == AluOp.FLUSH:   # out: the requantized sum; acc: the seed b
                        q = _flush_requant(a, insn.imm, w)
                        r = b
                    else:
                        raise ReferenceError(f"instruction {idx}: unknown ALU op {op}")
                    self.acc[dst, b_, o] = wrap(r, w)
                    self.out[dst, b_, o] = wrap(q if op == AluOp.FLUSH else r, c.out_width)


def run_reference(cfg: AccelConfig, insns: list[Insn], dram: np.ndarray) -> np.ndarray:
    """A fresh reference machine runs `insns` on `dram` (in place); returns dram."""
    return ReferenceMachine(cfg).run(insns, dram)
