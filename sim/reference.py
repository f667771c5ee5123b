"""The plain model of the ISA: its executable specification.

What an instruction does, written as directly as the ISA's definitions say it (accel.isa.isa's
instruction and AluOp docstrings, accel.isa.operands' operand layouts): instructions one by one
in program order, every LOAD/STORE entry by entry, every GEMM/ALU micro-op by micro-op inside
its two loops, every ALU lane by lane in Python integers. It shares nothing with sim/fsim/
(whose vectorized fast paths are checked against it by tests/differential), so a fast path
that is wrong shows up as a difference in the DRAM bytes.

Scope: every opcode and field fsim executes, on every valid AccelConfig (8/16-bit operands,
16/32-bit accumulators). Dependency tokens are not modelled: for a race-free program (one whose
tokens order every conflicting pair of accesses, as fsim's race checker verifies) program order
is one of the orders the hardware may take, and every order leaves the same bytes. Execution
stops at the first FINISH (or after the last instruction).

Bounded: the on-chip buffers are the config's, loops are walked lazily (no index arrays), and
`max_insns` caps the instructions run. Out-of-range accesses raise ReferenceError naming the
instruction, the field and the range.

    ReferenceMachine(cfg).run(insns, dram)   # dram: 1-D np.uint8, modified in place
"""
from __future__ import annotations

import numpy as np

from accel.isa import (
    INSN_BYTES,
    AccelConfig,
    Alu,
    AluOp,
    Epilogue,
    Finish,
    Gemm,
    Insn,
    Load,
    MemType,
    Store,
    decode_insn,
    decode_uops,
    elem_bytes,
)
from accel.isa.operands import decode_clamp, decode_flush, decode_requant, decode_scale

from .errors import SimError


class ReferenceError(SimError):
    """The reference model cannot execute an instruction (an index, address or field out of range)."""


def wrap(v: int, bits: int) -> int:
    """Two's-complement wrap of a Python int to `bits`."""
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def shift_amount(b: int, acc_width: int) -> int:
    """SHR's shift: b's low log2(acc_width)+1 bits read as signed (negative: a left shift)."""
    return wrap(b, acc_width.bit_length())


def flush_lane(a: int, imm: int, acc_width: int) -> int:
    """FLUSH's requantization of one lane: clamp((a + r) >> s, lo, hi), the sum wrapping."""
    s, r, lo, hi = decode_flush(imm)
    return min(max(wrap(a + r, acc_width) >> s, lo), hi)


def alu_lane(op: AluOp, a: int, b: int, w: int) -> int:
    """One ALU lane: op(a, b) on w-bit two's-complement values, before the final wrap to w bits
    (AluOp's docstring). FLUSH's accumulator side is b (its output side is flush_lane)."""
    if op == AluOp.MIN:
        return min(a, b)
    if op == AluOp.MAX:
        return max(a, b)
    if op == AluOp.ADD:
        return a + b
    if op == AluOp.MUL:
        return a * b
    if op == AluOp.SHR:
        s = shift_amount(b, w)
        return a >> s if s >= 0 else a << -s
    if op == AluOp.CLIP:
        return min(max(a, wrap(-b, w)), b)
    if op in (AluOp.MOV, AluOp.FLUSH):
        return b
    if op == AluOp.CLAMP:
        lo, hi = decode_clamp(b)
        return min(max(a, lo), hi)
    if op == AluOp.REQUANT:
        s, r, lo, hi = decode_requant(b, w)
        return min(max(wrap(a + r, w) >> s, lo), hi)
    if op == AluOp.SCALE:    # exact product and sum, then saturation (not a wrap)
        m, k = decode_scale(b, w)
        v = (a * m + ((1 << (k - 1)) if k else 0)) >> k
        return min(max(v, -(1 << (w - 1))), (1 << (w - 1)) - 1)
    raise ReferenceError(f"unknown ALU op {op!r}")


class ReferenceMachine:
    """The machine state (on-chip buffers as Python-indexable int64 arrays, the micro-op buffer as
    (acc, src, wgt) tuples, the EPILOGUE registers) and one method per opcode."""

    def __init__(self, cfg: AccelConfig, max_insns: int = 1 << 20):
        c = self.cfg = cfg
        self.max_insns = max_insns
        self.inp = np.zeros((c.inp_depth, c.batch, c.block_in), np.int64)
        self.wgt = np.zeros((c.wgt_depth, c.block_out, c.block_in), np.int64)
        self.acc = np.zeros((c.acc_depth, c.batch, c.block_out), np.int64)
        self.out = np.zeros((c.out_depth, c.batch, c.block_out), np.int64)
        self.uop = [(0, 0, 0)] * c.uop_depth
        self.epilogue = Epilogue()
        self.index = 0     # the instruction being executed, for messages

    # ---- memory helpers ------------------------------------------------------------------
    def _fail(self, msg: str):
        raise ReferenceError(f"instruction {self.index}: {msg}")

    def _entry(self, mem: MemType):
        """(entry shape, element width) of the named buffer."""
        c = self.cfg
        return {MemType.INP: ((c.batch, c.block_in), c.inp_width),
                MemType.WGT: ((c.block_out, c.block_in), c.wgt_width),
                MemType.ACC: ((c.batch, c.block_out), c.acc_width),
                MemType.OUT: ((c.batch, c.block_out), c.out_width)}[mem]

    def _buffer(self, mem: MemType):
        return {MemType.INP: self.inp, MemType.WGT: self.wgt, MemType.ACC: self.acc, MemType.OUT: self.out,
                MemType.UOP: self.uop}[mem]

    def _dram_bytes(self, dram: np.ndarray, mem: MemType, entry: int, what: str) -> np.ndarray:
        eb = elem_bytes(self.cfg, mem)
        lo = entry * eb
        if lo + eb > dram.size:
            self._fail(f"{what} {mem.name} entry {entry} (bytes {lo:#x}..{lo + eb - 1:#x}) lies outside the "
                       f"{dram.size:#x}-byte DRAM")
        return dram[lo:lo + eb]

    def _read_entry(self, dram: np.ndarray, mem: MemType, entry: int):
        raw = self._dram_bytes(dram, mem, entry, "LOAD reads")
        if mem == MemType.UOP:
            return tuple(int(x) for x in decode_uops(raw.copy(), self.cfg)[0])
        shape, width = self._entry(mem)
        return raw.view(f"<i{width // 8}").astype(np.int64).reshape(shape)

    # ---- execution -----------------------------------------------------------------------
    def run(self, insns: list[Insn], dram: np.ndarray) -> np.ndarray:
        """Execute `insns` in program order on `dram` (1-D uint8, in place) until the first FINISH."""
        if not isinstance(dram, np.ndarray) or dram.dtype != np.uint8 or dram.ndim != 1:
            raise ReferenceError("DRAM must be a 1-D uint8 array")
        for idx, insn in enumerate(insns):
            if idx >= self.max_insns:
                raise ReferenceError(f"instruction limit {self.max_insns} reached")
            self.index = idx
            if isinstance(insn, Finish):
                break
            if isinstance(insn, Load):
                self.load(insn, dram)
            elif isinstance(insn, Store):
                self.store(insn, dram)
            elif isinstance(insn, Gemm):
                self.gemm(insn)
            elif isinstance(insn, Alu):
                self.alu(insn)
            elif isinstance(insn, Epilogue):
                self.epilogue = insn
            else:
                self._fail(f"unknown instruction {insn!r}")
        return dram

    def run_at(self, dram: np.ndarray, insn_addr: int, insn_count: int) -> np.ndarray:
        """Decode up to insn_count instructions at byte insn_addr of `dram` (through the first
        FINISH: what follows it is never fetched) and run them, as fsim's run does."""
        end = insn_addr + insn_count * INSN_BYTES
        if insn_addr < 0 or insn_count < 0 or end > dram.size:
            raise ReferenceError(f"instruction stream [{insn_addr:#x}, {end:#x}) lies outside the {dram.size}-byte DRAM")
        insns = []
        for k in range(insn_count):
            at = insn_addr + k * INSN_BYTES
            insns.append(decode_insn(int.from_bytes(dram[at:at + INSN_BYTES].tobytes(), "little"), self.cfg, k))
            if isinstance(insns[-1], Finish):
                break
        return self.run(insns, dram)

    def load(self, insn: Load, dram: np.ndarray) -> None:
        """The (y_pad0 + y_size + y_pad1) x (x_pad0 + x_size + x_pad1) entries from sram_base on, row
        by row: DRAM entry dram_base + y * x_stride + x inside the padding, zero (a zero micro-op) in it."""
        mem = insn.mem_type
        if mem == MemType.OUT:
            self._fail("LOAD field mem_type=OUT; LOAD writes UOP, WGT, INP or ACC")
        buf = self._buffer(mem)
        rows = insn.y_pad0 + insn.y_size + insn.y_pad1
        cols = insn.x_pad0 + insn.x_size + insn.x_pad1
        if rows * cols and insn.sram_base + rows * cols > len(buf):
            self._fail(f"LOAD {mem.name}: sram_base={insn.sram_base} + {rows}x{cols} entries exceeds the buffer "
                       f"depth {len(buf)}")
        for r in range(rows):
            for col in range(cols):
                y, x = r - insn.y_pad0, col - insn.x_pad0
                if 0 <= y < insn.y_size and 0 <= x < insn.x_size:
                    value = self._read_entry(dram, mem, insn.dram_base + y * insn.x_stride + x)
                else:
                    value = (0, 0, 0) if mem == MemType.UOP else 0
                buf[insn.sram_base + r * cols + col] = value

    def store(self, insn: Store, dram: np.ndarray) -> None:
        """OUT entries sram_base + y * x_size + x to DRAM entry dram_base + y * x_stride + x, in order
        (a later row overwrites an earlier one where x_stride < x_size)."""
        if insn.mem_type != MemType.OUT:
            self._fail(f"STORE field mem_type={insn.mem_type.name}; STORE reads OUT")
        if insn.y_pad0 or insn.y_pad1 or insn.x_pad0 or insn.x_pad1:
            self._fail("STORE padding fields must be zero")
        n = insn.y_size * insn.x_size
        if n and insn.sram_base + n > len(self.out):
            self._fail(f"STORE: sram_base={insn.sram_base} + {n} entries exceeds the OUT buffer depth {len(self.out)}")
        width = self._entry(MemType.OUT)[1]
        for y in range(insn.y_size):
            for x in range(insn.x_size):
                data = self.out[insn.sram_base + y * insn.x_size + x].astype(f"<i{width // 8}").view(np.uint8)
                self._dram_bytes(dram, MemType.OUT, insn.dram_base + y * insn.x_stride + x, "STORE writes")[...] = \
                    data.reshape(-1)

    def _iterations(self, insn, op: str):
        """(i0, i1, dst, src, wgt) of every micro-op of a GEMM/ALU in execution order."""
        if not 0 <= insn.uop_bgn <= insn.uop_end <= len(self.uop):
            self._fail(f"{op}: micro-op range [uop_bgn={insn.uop_bgn}, uop_end={insn.uop_end}) outside "
                       f"[0, {len(self.uop)}]")
        for i0 in range(insn.iter_out):
            for i1 in range(insn.iter_in):
                for u in range(insn.uop_bgn, insn.uop_end):
                    acc, src, wgt = self.uop[u]
                    dst = acc + i0 * insn.dst_factor_out + i1 * insn.dst_factor_in
                    src = src + i0 * insn.src_factor_out + i1 * insn.src_factor_in
                    if isinstance(insn, Gemm):
                        wgt = wgt + i0 * insn.wgt_factor_out + i1 * insn.wgt_factor_in
                    yield i0, i1, dst, src, wgt

    def _index(self, what: str, i: int, buf: np.ndarray, op: str) -> int:
        if not 0 <= i < len(buf):
            self._fail(f"{op}: {what} index {i} out of range [0, {len(buf)})")
        return i

    def gemm(self, insn: Gemm) -> None:
        """acc[dst] = 0 (reset) or acc[dst] + inp[src] @ wgt[wgt].T wrapped; out[dst] = narrow(acc[dst]).
        With flush, each pass's last micro-op ends its sum instead (see Gemm's docstring)."""
        c, e = self.cfg, self.epilogue
        nu = insn.uop_end - insn.uop_bgn
        for k, (i0, i1, dst, src, wgt) in enumerate(self._iterations(insn, "GEMM")):
            self._index("accumulator (dst)", dst, self.acc, "GEMM")
            if insn.reset:
                v = np.zeros_like(self.acc[dst])
            else:
                self._index("input (src)", src, self.inp, "GEMM")
                self._index("weight (wgt)", wgt, self.wgt, "GEMM")
                product = self.inp[src] @ self.wgt[wgt].T  # (batch, block_out), exact in int64
                v = np.array([[wrap(int(x), c.acc_width) for x in row] for row in self.acc[dst] + product])
            if insn.flush and k % nu == nu - 1:   # the pass's last micro-op: requantize, then the seed
                q = np.array([[flush_lane(int(x), e.imm, c.acc_width) for x in row] for row in v])
                self.out[dst] = q
                if e.to_acc:
                    self.acc[dst] = q
                else:
                    seed = e.seed_base + i0 * e.seed_factor_out + i1 * e.seed_factor_in
                    self.acc[dst] = self.acc[self._index("flush seed", seed, self.acc, "GEMM")].copy()
            else:
                self.acc[dst] = v
                self.out[dst] = [[wrap(int(x), c.out_width) for x in row] for row in v]

    def alu(self, insn: Alu) -> None:
        """acc[dst] = op(acc[dst], b) lane by lane, b = the immediate (sign-extended) or acc[src];
        out[dst] = narrow(acc[dst]), except FLUSH: out = its requantized value, acc = acc[src]."""
        c, w, op = self.cfg, self.cfg.acc_width, insn.alu_op
        imm_operand = insn.use_imm and op != AluOp.FLUSH   # FLUSH reads the register whatever use_imm says
        for _, _, dst, src, _ in self._iterations(insn, "ALU"):
            self._index("accumulator (dst)", dst, self.acc, "ALU")
            if not imm_operand:
                self._index("accumulator (src)", src, self.acc, "ALU")
            for lane_b in range(c.batch):
                for o in range(c.block_out):
                    a = int(self.acc[dst, lane_b, o])
                    b = wrap(insn.imm, w) if imm_operand else int(self.acc[src, lane_b, o])
                    r = wrap(alu_lane(op, a, b, w), w)
                    out = flush_lane(a, insn.imm, w) if op == AluOp.FLUSH else r
                    self.acc[dst, lane_b, o] = r
                    self.out[dst, lane_b, o] = wrap(out, c.out_width)


def run_reference(cfg: AccelConfig, insns: list[Insn], dram: np.ndarray) -> np.ndarray:
    """A fresh reference machine runs `insns` on `dram` (in place); returns dram."""
    return ReferenceMachine(cfg).run(insns, dram)
