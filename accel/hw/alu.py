"""TensorAlu: element-wise ALU over accumulator entries, every AluOp of the ISA, one micro-op per cycle.

Stages (S1 = cycle of the micro-op's resolved indices): S1 presents dst and src addresses to the
two acc read ports; S2 computes op(acc[dst], acc[src] or sign-extended imm) on every lane and
writes back at the end of S2 (wb_*). The micro-op right behind reads in S1 while S2 writes, so
the read ports' write-transparency resolves back-to-back dependencies; no stall, no bypass.
Lane semantics (acc_width w, wrapping): MIN, MAX signed; ADD, MUL low w bits; SHR by
s = signed low log2(w)+1 bits of b (arithmetic right by s, or left by -s when s < 0);
CLIP min(max(a, -b), b); MOV b; CLAMP min(max(a, lo), hi), lo/hi = b's bytes 0/1 as signed;
REQUANT the CLAMP of (a + r) >> s, s = b[20:16], r = 2^(s-1) when b[21] (neither when w < 22);
SCALE sat((a * M + 2^(k-1)) >> k), M = b[23:0], k = b[29:24] (b unsigned; a w+24-bit product).
"""
from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig, AluOp
from accel.isa.config import ALU_IMM_BITS, ALU_OPCODE_BITS

from .gemm import lanes, read_signature


def alu_lane(m: Module, op, a, b, width: int):
    """One lane of the ALU: returns a signed(width) signal = op(a, b). a, b: signed(width)."""
    out = Signal(signed(width))
    sbits = (width - 1).bit_length() + 1
    s = b[:sbits].as_signed()
    amount = Signal(sbits)
    m.d.comb += amount.eq(Mux(s < 0, -s, s))
    shifted = Signal(signed(width))
    m.d.comb += shifted.eq(Mux(s < 0, (a << amount)[:width], a >> amount))
    neg_b = Signal(signed(width))
    m.d.comb += neg_b.eq(-b)
    lo = Signal(signed(width))
    m.d.comb += lo.eq(Mux(a < neg_b, neg_b, a))
    c_lo, c_hi, c_up = Signal(signed(8)), Signal(signed(8)), Signal(signed(width))
    m.d.comb += [c_lo.eq(b[0:8]), c_hi.eq(b[8:16]), c_up.eq(Mux(a < c_lo, c_lo, a))]
    rq_a, rq_up = Signal(signed(width)), Signal(signed(width))   # REQUANT: the clamp of (a + r) >> s
    if width >= 22:
        rq_s = b[16:21]
        rq_half = Signal(width)
        m.d.comb += rq_half.eq(Mux(b[21], (Const(1, 33) << rq_s)[1:width + 1], 0))   # 2^(s-1), 0 for s = 0
        rq_sum = Signal(signed(width))
        m.d.comb += [rq_sum.eq(a + rq_half), rq_a.eq(rq_sum >> rq_s)]
    else:
        m.d.comb += rq_a.eq(a)
    m.d.comb += rq_up.eq(Mux(rq_a < c_lo, c_lo, rq_a))
    # SCALE: the fixed-point multiply, saturated to width bits
    sc_m = b.as_unsigned()[:min(24, width)]
    sc_k = b.as_unsigned()[24:30] if width > 24 else Const(0, 1)
    sc_half = Signal(63)   # 2^(k-1) for every k < 64: the sum must not lose it, even past the product's width
    m.d.comb += sc_half.eq(Mux(sc_k != 0, (Const(1, 64) << sc_k)[1:64], 0))
    sc_v = Signal(signed(max(width + 26, 65)))
    m.d.comb += sc_v.eq((a * sc_m + sc_half) >> sc_k)
    top, bottom = (1 << (width - 1)) - 1, -(1 << (width - 1))
    sc_out = Mux(sc_v > top, top, Mux(sc_v < bottom, bottom, sc_v[:width]))
    with m.Switch(op):
        with m.Case(AluOp.MIN):
            m.d.comb += out.eq(Mux(a < b, a, b))
        with m.Case(AluOp.MAX):
            m.d.comb += out.eq(Mux(a > b, a, b))
        with m.Case(AluOp.ADD):
            m.d.comb += out.eq(a + b)
        with m.Case(AluOp.SHR):
            m.d.comb += out.eq(shifted)
        with m.Case(AluOp.MUL):
            m.d.comb += out.eq(a * b)
        with m.Case(AluOp.CLIP):
            m.d.comb += out.eq(Mux(lo > b, b, lo))
        with m.Case(AluOp.MOV):
            m.d.comb += out.eq(b)
        with m.Case(AluOp.CLAMP):
            m.d.comb += out.eq(Mux(c_up > c_hi, c_hi, c_up))
        with m.Case(AluOp.REQUANT):
            m.d.comb += out.eq(Mux(rq_up > c_hi, c_hi, rq_up))
        with m.Case(AluOp.SCALE):
            m.d.comb += out.eq(sc_out)
        with m.Default():   # undefined op codes leave dst unchanged
            m.d.comb += out.eq(a)
    return out


class TensorAlu(wiring.Component):
    """in_valid / in_dst / in_src / in_op / in_use_imm / in_imm (In): a micro-op in S1.
    acc_rd_a (dst) and acc_rd_b (src): acc read ports driven by the ALU. wb_valid / wb_idx /
    wb_data (Out): the entry written this cycle. busy (Out): a micro-op is in S2.
    """

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        self.acc_bits = cfg.batch * cfg.block_out * cfg.acc_width
        rs = read_signature(cfg.acc_idx_bits, self.acc_bits)
        super().__init__({
            "in_valid": In(1), "in_dst": In(cfg.acc_idx_bits), "in_src": In(cfg.acc_idx_bits),
            "in_op": In(ALU_OPCODE_BITS), "in_use_imm": In(1), "in_imm": In(signed(ALU_IMM_BITS)),
            "acc_rd_a": In(rs), "acc_rd_b": In(rs),
            "wb_valid": Out(1), "wb_idx": Out(cfg.acc_idx_bits), "wb_data": Out(self.acc_bits), "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        n, w = cfg.batch * cfg.block_out, cfg.acc_width
        m.d.comb += [self.acc_rd_a.addr.eq(self.in_dst), self.acc_rd_b.addr.eq(self.in_src),
                     self.acc_rd_a.en.eq(1), self.acc_rd_b.en.eq(1)]
        p2_valid, p2_dst = Signal(), Signal(cfg.acc_idx_bits)
        p2_op, p2_use_imm, p2_imm = Signal(ALU_OPCODE_BITS), Signal(), Signal(signed(w))
        m.d.sync += [p2_valid.eq(self.in_valid), p2_dst.eq(self.in_dst), p2_op.eq(self.in_op),
                     p2_use_imm.eq(self.in_use_imm), p2_imm.eq(self.in_imm)]

        a = lanes(self.acc_rd_a.data, n, w)
        b = lanes(self.acc_rd_b.data, n, w)
        for k in range(n):
            bk = Signal(signed(w), name=f"b_{k}")
            m.d.comb += bk.eq(Mux(p2_use_imm, p2_imm, b[k]))
            m.d.comb += self.wb_data[k * w:(k + 1) * w].eq(alu_lane(m, p2_op, a[k], bk, w))
        m.d.comb += [self.wb_valid.eq(p2_valid), self.wb_idx.eq(p2_dst), self.busy.eq(p2_valid)]
        return m
