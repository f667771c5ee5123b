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
FLUSH gives the output buffer the clamp of (a + r) >> s with s, r, lo, hi from the immediate (its
lanes' result) and the accumulator the source entry (the compute stage's write mux; wb_flush).
"""
from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig, AluOp
from accel.isa.config import ALU_IMM_BITS, ALU_OPCODE_BITS

from .layouts import lanes, read_signature

IDLE_OP = (1 << ALU_OPCODE_BITS) - 1   # an op code the ISA leaves undefined (idle S2; see TensorAlu)
if IDLE_OP in set(AluOp):
    raise RuntimeError(f"ALU op code {IDLE_OP} is defined by the ISA; the ALU needs an undefined one to idle on")


def alu_lane(m: Module, op, a, b, width: int, imm=None):
    """One lane of the ALU: returns a signed(width) signal = op(a, b), for FLUSH its requantized
    value (what the output buffer gets; the accumulator gets the source entry). a, b, imm:
    signed(width), imm FLUSH's parameters.

    Each op's arithmetic is built inside its own case, by a helper called once per use (no named
    intermediate shared between cases), and only SCALE's sum is wider than 64 bits: synthesis
    merges the identical copies, while Verilator, which evaluates a wire with more than one reader
    (or wider than 64 bits) on every cycle, inlines the single-use expressions into their case, so a
    simulated lane does most of an op's arithmetic only when that op runs (the rtl model ran 1.24x
    faster). The narrower terms also took a lane from 2220 to 1854 LUT4s on ECP5 at the same
    routed Fmax (the lane alone, two placement seeds)."""
    out = Signal(signed(width))
    sbits = (width - 1).bit_length() + 1
    top, bottom = (1 << (width - 1)) - 1, -(1 << (width - 1))

    def s():                     # SHR: the signed shift count
        return b[:sbits].as_signed()

    def amount():
        return Mux(s() < 0, -s(), s())[:sbits]

    def left():                  # s < 0: (a << -s) wrapped to width bits; -s <= 2^(sbits-1), and a
        n = amount()             # shift by that much (its top bit) leaves 0, so the barrel shifter
        return Mux(n[sbits - 1], 0, (a << n[:sbits - 1])[:width])   # takes the low bits only

    def neg_b():                 # CLIP: -b wrapped to width bits
        return (-b)[:width].as_signed()

    def clip_lo():
        return Mux(a < neg_b(), neg_b(), a)

    def c_lo():
        return b[0:8].as_signed()

    def c_hi():
        return b[8:16].as_signed()

    def clamp(v):                # min(max(v(), lo), hi), v() built once per use
        def up():
            return Mux(v() < c_lo(), c_lo(), v())
        return Mux(up() > c_hi(), c_hi(), up())

    def requant_shifted():       # REQUANT: (a + r) >> s, the sum wrapped to width bits
        if width < 22:
            return a
        rq_s = b[16:21]
        rq_half = Mux(b[21], (Const(1, 33) << rq_s)[1:width + 1], 0)   # 2^(s-1), 0 for s = 0
        return (a + rq_half)[:width].as_signed() >> rq_s

    sc_m = b.as_unsigned()[:min(24, width)]
    sc_k = b.as_unsigned()[24:30] if width > 24 else Const(0, 1)

    # SCALE before saturation: (a * M + 2^(k-1)) >> k. |a * M| < 2^(p_bits-1), so for k >= p_bits the
    # result is 0, which a rounding term of 2^(p_bits-1) gives too (the sum is then in (0, 2^p_bits)):
    # the term saturates there instead of being a 127-bit shift. The sum stays wider than 64 bits, as
    # in the calibrated design (the product plus a 63-bit term): summed at the product's own width
    # (58 bits, what Verilator would evaluate cheaply) the routed ECP5 lane lost a quarter of its
    # Fmax (33 -> 26 MHz, two placement seeds each). Measured again (lane alone, seeds 1/2, against
    # 34.4/33.6 MHz here): a 64-bit sum 24.0/24.3 MHz, 65 bits 32.8/33.1, rounding after the shift
    # ((((a * M) << 1) >> k) + 1) >> 1 28.0-29.3. The cost in simulation: Verilator evaluates this
    # wide sum on every cycle in all lanes: at 64 bits the rtl model ran 1.29-1.36x faster (at 65,
    # 1.03-1.10x). A SCALE cheap for both needs its own pipeline stage (a cycle-count change).
    p_bits = width + len(sc_m)

    def scaled():
        k_half = Mux(sc_k > p_bits, p_bits, sc_k)
        sc_half = (Const(1, 1) << k_half)[1:p_bits + 1]   # 2^(k-1), 0 for k = 0
        return (a * sc_m + Const(0, 63) + sc_half) >> sc_k

    with m.Switch(op):
        with m.Case(AluOp.MIN):
            m.d.comb += out.eq(Mux(a < b, a, b))
        with m.Case(AluOp.MAX):
            m.d.comb += out.eq(Mux(a > b, a, b))
        with m.Case(AluOp.ADD):
            m.d.comb += out.eq(a + b)
        with m.Case(AluOp.SHR):
            m.d.comb += out.eq(Mux(s() < 0, left(), a >> amount()))
        with m.Case(AluOp.MUL):
            m.d.comb += out.eq(a * b)
        with m.Case(AluOp.CLIP):
            m.d.comb += out.eq(Mux(clip_lo() > b, b, clip_lo()))
        with m.Case(AluOp.MOV):
            m.d.comb += out.eq(b)
        with m.Case(AluOp.CLAMP):
            m.d.comb += out.eq(clamp(lambda: a))
        with m.Case(AluOp.REQUANT):
            m.d.comb += out.eq(clamp(requant_shifted))
        with m.Case(AluOp.SCALE):
            m.d.comb += out.eq(Mux(scaled() > top, top, Mux(scaled() < bottom, bottom, scaled()[:width])))
        with m.Case(AluOp.FLUSH):
            m.d.comb += out.eq(flush_lane(a, imm))
        with m.Default():   # undefined op codes leave dst unchanged
            m.d.comb += out.eq(a)
    return out


def flush_lane(a, imm):
    """FLUSH's output-buffer value of one lane: clamp((a + r) >> s) to [lo, hi], the parameters
    from the immediate (see AluOp.FLUSH). a, imm: signed(width). Every term is built per use, as
    alu_lane's: a term with two readers is evaluated on every cycle in simulation."""
    width = len(a)

    def f_s():
        return imm[0:5]

    def f_hi():
        return imm[7:15].as_signed()

    def f_lo():                  # 0, -hi (symmetric) or -hi - 1
        return Mux(imm[6], 0, Mux(imm[15], -f_hi(), ~f_hi()))

    def shifted():
        return (a + Mux(imm[5], (Const(1, 33) << f_s())[1:width + 1], 0))[:width].as_signed() >> f_s()

    def up():
        return Mux(shifted() < f_lo(), f_lo(), shifted())
    return Mux(up() > f_hi(), f_hi(), up())


class TensorAlu(wiring.Component):
    """in_valid / in_dst / in_src / in_op / in_use_imm / in_imm (In): a micro-op in S1.
    acc_rd_a (dst) and acc_rd_b (src): acc read ports driven by the ALU. wb_valid / wb_idx /
    wb_data (Out): the lanes' results written this cycle (the accumulator's entry, and narrowed the
    output buffer's); wb_flush (Out): they are a FLUSH's, whose accumulator entry is instead the
    source entry read on acc_rd_b. busy (Out): a micro-op is in S2.
    """

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        self.acc_bits = cfg.batch * cfg.block_out * cfg.acc_width
        rs = read_signature(cfg.acc_idx_bits, self.acc_bits)
        super().__init__({
            "in_valid": In(1), "in_dst": In(cfg.acc_idx_bits), "in_src": In(cfg.acc_idx_bits),
            "in_op": In(ALU_OPCODE_BITS), "in_use_imm": In(1), "in_imm": In(signed(ALU_IMM_BITS)),
            "acc_rd_a": In(rs), "acc_rd_b": In(rs),
            "wb_valid": Out(1), "wb_idx": Out(cfg.acc_idx_bits), "wb_data": Out(self.acc_bits),
            "wb_flush": Out(1), "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        n, w = cfg.batch * cfg.block_out, cfg.acc_width
        m.d.comb += [self.acc_rd_a.addr.eq(self.in_dst), self.acc_rd_b.addr.eq(self.in_src),
                     self.acc_rd_a.en.eq(1), self.acc_rd_b.en.eq(1)]
        p2_valid, p2_dst = Signal(), Signal(cfg.acc_idx_bits)
        p2_op, p2_use_imm, p2_imm = Signal(ALU_OPCODE_BITS, init=IDLE_OP), Signal(), Signal(signed(w))
        # an idle S2 holds an undefined op (dst unchanged): a simulator then evaluates no lane arithmetic
        m.d.sync += [p2_valid.eq(self.in_valid), p2_dst.eq(self.in_dst),
                     p2_op.eq(Mux(self.in_valid, self.in_op, IDLE_OP)),
                     p2_use_imm.eq(self.in_use_imm), p2_imm.eq(self.in_imm)]

        a = lanes(self.acc_rd_a.data, n, w)
        b = lanes(self.acc_rd_b.data, n, w)
        for k in range(n):
            bk = Signal(signed(w), name=f"b_{k}")
            m.d.comb += bk.eq(Mux(p2_use_imm, p2_imm, b[k]))
            m.d.comb += self.wb_data[k * w:(k + 1) * w].eq(alu_lane(m, p2_op, a[k], bk, w, p2_imm))
        # FLUSH: the lanes' results go to the output buffer, the source entry to the accumulator (the
        # compute stage picks it from acc_rd_b); one result per lane, so a simulator evaluates
        # FLUSH's arithmetic only when it runs
        m.d.comb += [self.wb_valid.eq(p2_valid), self.wb_idx.eq(p2_dst), self.busy.eq(p2_valid),
                     self.wb_flush.eq(p2_valid & (p2_op == AluOp.FLUSH))]
        return m
