"""TensorAlu: element-wise ALU over accumulator entries, every AluOp of the ISA, pipelined.

Stages (S1 = cycle of the micro-op's resolved indices): S1 presents dst and src addresses to the
two acc read ports; S2 takes the read entries, selects the operands and multiplies (a x M, below)
into registers; S3 computes the rest (add, shift, saturate or clamp) and writes back at its end
(wb_*). A micro-op two behind reads in S1 while S3 writes, which the read ports'
write-transparency covers; the micro-op right behind (in S2 while its predecessor is in S3) takes
the S3 result through a bypass into its operand registers. The multiplier works on the entries as
read in S2, before that bypass, so MUL and SCALE are not accepted in S1 while a micro-op is in S2
(in_ready low): they issue every other cycle, whatever the indices. The split keeps the acc read,
the multiply and the add/shift/saturate of one micro-op in different cycles (the single-cycle
path was 13.9 ns by yosys' estimate of the default core, S3 is 9.2 ns: docs/hardware.md).
Lane semantics (acc_width w, wrapping): MIN, MAX signed; ADD, MUL low w bits; SHR by
s = signed low log2(w)+1 bits of b (arithmetic right by s, or left by -s when s < 0);
CLIP min(max(a, -b), b); MOV b; CLAMP min(max(a, lo), hi), lo/hi = b's bytes 0/1 as signed;
REQUANT the CLAMP of (a + r) >> s, s = b[20:16], r = 2^(s-1) when b[21] (neither when w < 22);
SCALE sat((a * M + 2^(k-1)) >> k), M = b[23:0], k = b[29:24] (b unsigned; a w+24-bit product).
FLUSH gives the output buffer the clamp of (a + r) >> s with s, r, lo, hi from the immediate (its
lanes' result) and the accumulator the source entry (wb_data: the entry written; wb_out: the
output buffer's narrowed lanes).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig, AluOp
from accel.isa.config import ALU_IMM_BITS, ALU_OPCODE_BITS

from .layouts import lanes, read_signature
from .params import MUL_OPS

IDLE_OP = (1 << ALU_OPCODE_BITS) - 1   # an op code the ISA leaves undefined (idle S2; see TensorAlu)
if IDLE_OP in set(AluOp):
    raise RuntimeError(f"ALU op code {IDLE_OP} is defined by the ISA; the ALU needs an undefined one to idle on")


def lane_product(a, b, width: int):
    """The multiplier's part of a lane (S2): (a x M, M = b[23:0] unsigned, signed(width + 24) or
    narrower; MUL's correction term, the low bits of a x b[w-1:24] above bit 24, or None where
    width <= 24). a, b: signed(width)."""
    mbits = min(24, width)
    prod = a * b.as_unsigned()[:mbits]
    if width <= mbits:
        return prod, None
    nb = width - mbits       # a * b mod 2^w = a * M + (a[:w-24] * b[24:w] mod 2^(w-24)) << 24
    b_hi = b.as_unsigned()[mbits:width]
    return prod, tree_sum([Mux(b_hi[i], a.as_unsigned()[:nb - i] << i, 0) for i in range(nb)])[:nb]


def alu_lane(m: Module, op, a, b, width: int, imm=None, product=None):
    """One lane of the ALU: returns a signed(width) signal = op(a, b), for FLUSH its requantized
    value (what the output buffer gets; the accumulator gets the source entry). a, b, imm:
    signed(width), imm FLUSH's parameters. product: lane_product(a, b)'s pair, registered by the
    caller (TensorAlu's S2), or None to multiply here.

    The ops share one datapath, since no two of them run in the same cycle: one a x M multiplier
    (SCALE's product, M = b[23:0]; MUL's low bits are that product plus a narrow correction), one
    adder (ADD's a + b, or the rounding term of SCALE, REQUANT, FLUSH), one arithmetic right
    shifter (those three and SHR by s >= 0), one saturation (SCALE) and one clamp between bounds
    that each op picks (MIN: hi = b; MAX: lo = b; CLIP: [-b, b]; CLAMP, REQUANT: b's bytes; FLUSH:
    the immediate's). Separate units per op made the ALU 59% of the default core's LUTs and 7 DSPs
    per lane (a 32x32 MUL and a 32x25 SCALE multiplier); shared, a lane takes 4 DSPs. Only MOV and
    SHR's left shift (s < 0) bypass it."""
    out = Signal(signed(width))
    sbits = (width - 1).bit_length() + 1
    top, bottom = (1 << (width - 1)) - 1, -(1 << (width - 1))
    is_scale, is_rq, is_flush = op == AluOp.SCALE, op == AluOp.REQUANT, op == AluOp.FLUSH
    is_min, is_max, is_clip = op == AluOp.MIN, op == AluOp.MAX, op == AluOp.CLIP
    is_clamp = op == AluOp.CLAMP
    imm = b if imm is None else imm

    def left():                  # SHR by s < 0: (a << -s) wrapped to width bits; -s <= 2^(sbits-1),
        n = (-b[:sbits].as_signed())[:sbits]      # and a shift by that much (its top bit) leaves 0,
        return Mux(n[sbits - 1], 0, (a << n[:sbits - 1])[:width])   # so the shifter takes the low bits

    # ---- the multiplier: a * M, M = b[23:0] unsigned (SCALE), whose low bits MUL also uses ----------
    mbits = min(24, width)
    p_bits = width + mbits                 # |a * M| < 2^(p_bits - 1)
    prod_v, corr = lane_product(a, b, width) if product is None else product
    prod = Signal(signed(p_bits))
    m.d.comb += prod.eq(prod_v)
    mul = Signal(signed(width))
    if corr is not None:
        m.d.comb += mul.eq(Cat(prod[:mbits], prod[mbits:width] + corr))
    else:                # b mod 2^w = M
        m.d.comb += mul.eq(prod[:width])

    # ---- the adder and the rounding right shift: (x + r) >> k --------------------------------------------
    # SCALE: x = a * M (not wrapped), k = b[29:24], r = 2^(k-1); REQUANT (w >= 22): x = a, k = b[20:16],
    # r = 2^(k-1) if b[21]; FLUSH: k = imm[4:0], r = 2^(k-1) if imm[5]; SHR by s >= 0: k = s; ADD: r = b.
    # Sums other than SCALE's wrap to width bits. For SCALE with k >= p_bits the result is 0, which a
    # rounding term of 2^(p_bits-1) gives too (the sum is then in (0, 2^p_bits)).
    sc_k = b.as_unsigned()[24:30] if width > 24 else Const(0, 1)
    rq_k = b.as_unsigned()[16:21] if width >= 22 else Const(0, 1)
    rq_rnd = b[21] if width >= 22 else Const(0, 1)
    k = Signal(6)
    m.d.comb += k.eq(Mux(is_scale, sc_k, Mux(is_rq, rq_k, Mux(is_flush, imm.as_unsigned()[0:5],
                         Mux((op == AluOp.SHR) & ~b[sbits - 1], b.as_unsigned()[:sbits - 1], 0)))))
    k_half = Signal(range(p_bits + 1))
    m.d.comb += k_half.eq(Mux(is_scale & (sc_k > p_bits), p_bits, k))
    rnd = is_scale | (is_rq & rq_rnd) | (is_flush & imm[5])
    # 2^(k-1) as 2^p_bits >> (p_bits + 1 - k) (0 for k = 0): a right shift keeps its operand's width,
    # where 1 << k would widen to 2^len(k) bits, a term Verilator evaluates every cycle
    half_shift = Signal(range(p_bits + 2))
    m.d.comb += half_shift.eq(p_bits + 1 - k_half)
    addend = Signal(signed(p_bits + 1))     # ADD's b, else 2^(k-1) when rounding (0 for k = 0)
    m.d.comb += addend.eq(Mux(op == AluOp.ADD, b, Mux(rnd, Const(1 << p_bits, p_bits + 1) >> half_shift, 0)))
    total = Signal(signed(p_bits + 1))
    m.d.comb += total.eq(Mux(is_scale, prod, a) + addend)
    shifted = Signal(signed(p_bits + 1))
    m.d.comb += shifted.eq(Mux(is_scale, total, total[:width].as_signed()) >> k)
    # ---- SCALE: saturation to width bits (only its shifted sum can exceed them); the other ops: the
    # clamp min(max(v, lo), hi) of v = the shifted value's low bits. Side by side, and the clamp's three
    # comparisons at once: hi where v > hi or lo > hi (max(v, lo) >= lo > hi), else lo where v < lo.
    over = shifted[width - 1:]
    sat = Signal(signed(width))
    m.d.comb += sat.eq(Mux((over == 0) | (over == (1 << len(over)) - 1), shifted[:width],
                           Mux(shifted[-1], bottom, top)))
    f_lo, f_hi = flush_bounds(imm)
    lo, hi = Signal(signed(width)), Signal(signed(width))
    m.d.comb += [lo.eq(Mux(is_max, b, Mux(is_clip, (-b)[:width].as_signed(),
                                          Mux(is_flush, f_lo, b[0:8].as_signed())))),
                 hi.eq(Mux(is_min | is_clip, b, Mux(is_flush, f_hi, b[8:16].as_signed())))]
    bounded = is_clamp | is_rq | is_flush | is_clip
    v = shifted[:width].as_signed()
    lo_on, hi_on = bounded | is_max, bounded | is_min
    to_hi = hi_on & ((v > hi) | (lo_on & (lo > hi)))
    clamped = Signal(signed(width))
    m.d.comb += clamped.eq(Mux(to_hi, hi, Mux(lo_on & (v < lo), lo, v)))
    rsh = Signal(signed(width))
    m.d.comb += rsh.eq(Mux(is_scale, sat, clamped))

    with m.Switch(op):
        with m.Case(AluOp.SHR):
            m.d.comb += out.eq(Mux(b[sbits - 1], left(), rsh))
        with m.Case(AluOp.MUL):
            m.d.comb += out.eq(mul)
        with m.Case(AluOp.MOV):
            m.d.comb += out.eq(b)
        with m.Case(AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.CLIP, AluOp.CLAMP, AluOp.REQUANT, AluOp.SCALE,
                    AluOp.FLUSH):
            m.d.comb += out.eq(rsh)
        with m.Default():   # undefined op codes leave dst unchanged
            m.d.comb += out.eq(a)
    return out


def flush_bounds(imm):
    """FLUSH's clamp bounds (lo, hi) from its immediate: hi = imm[14:7] signed; lo = 0 (imm[6]),
    -hi (imm[15]: symmetric) or -hi - 1."""
    def f_hi():
        return imm[7:15].as_signed()
    return Mux(imm[6], 0, Mux(imm[15], -f_hi(), ~f_hi())), f_hi()


def tree_sum(values: list):
    """Balanced adder tree (shallower than a chain of additions)."""
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def flush_lane(a, imm):
    """FLUSH's output-buffer value of one lane: clamp((a + r) >> s) to [lo, hi], the parameters
    from the immediate (see AluOp.FLUSH); GemmCore's flushing micro-ops. a, imm: signed(width). Every
    term is built per use: a term with two readers is evaluated on every cycle in simulation."""
    width = len(a)

    def f_s():
        return imm[0:5]

    def f_lo():
        return flush_bounds(imm)[0]

    def f_hi():
        return flush_bounds(imm)[1]

    def shifted():
        return (a + Mux(imm[5], (Const(1, 33) << f_s())[1:width + 1], 0))[:width].as_signed() >> f_s()

    def up():
        return Mux(shifted() < f_lo(), f_lo(), shifted())
    return Mux(up() > f_hi(), f_hi(), up())


class TensorAlu(wiring.Component):
    """in_valid / in_dst / in_src / in_op / in_use_imm / in_imm (In): a micro-op in S1, taken when
    in_ready (Out: low for a MUL or SCALE while a micro-op is in S2; the op held constant by the
    caller is what decides it). acc_rd_a (dst) and acc_rd_b (src): acc read ports driven by the
    ALU, write-transparent. wb_valid / wb_idx / wb_data (Out): the accumulator entry written this
    cycle (a FLUSH's: its source entry); wb_out (Out): the output buffer's entry, the lanes'
    results narrowed to out_width. busy (Out): a micro-op is in S2 or S3.
    """

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        self.acc_bits = cfg.batch * cfg.block_out * cfg.acc_width
        rs = read_signature(cfg.acc_idx_bits, self.acc_bits)
        super().__init__({
            "in_valid": In(1), "in_ready": Out(1), "in_dst": In(cfg.acc_idx_bits), "in_src": In(cfg.acc_idx_bits),
            "in_op": In(ALU_OPCODE_BITS), "in_use_imm": In(1), "in_imm": In(signed(ALU_IMM_BITS)),
            "acc_rd_a": In(rs), "acc_rd_b": In(rs),
            "wb_valid": Out(1), "wb_idx": Out(cfg.acc_idx_bits), "wb_data": Out(self.acc_bits),
            "wb_out": Out(cfg.batch * cfg.block_out * cfg.out_width), "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        n, w, ow = cfg.batch * cfg.block_out, cfg.acc_width, cfg.out_width
        # ---- S1: addresses; a multiplying op waits until S2 is empty --------------------------------
        p2_valid = Signal()
        in_mul = Signal()
        m.d.comb += in_mul.eq(self.in_op.matches(*MUL_OPS))
        m.d.comb += [self.acc_rd_a.addr.eq(self.in_dst), self.acc_rd_b.addr.eq(self.in_src),
                     self.acc_rd_a.en.eq(1), self.acc_rd_b.en.eq(1), self.in_ready.eq(~(in_mul & p2_valid))]
        take = self.in_valid & self.in_ready
        p2_dst, p2_src = Signal(cfg.acc_idx_bits), Signal(cfg.acc_idx_bits)
        # an idle stage holds an undefined op (dst unchanged): a simulator then evaluates no lane arithmetic
        p2_op, p2_imm_b, p2_imm = Signal(ALU_OPCODE_BITS, init=IDLE_OP), Signal(), Signal(signed(w))
        m.d.sync += [p2_valid.eq(take), p2_dst.eq(self.in_dst), p2_src.eq(self.in_src),
                     p2_op.eq(Mux(take, self.in_op, IDLE_OP)), p2_imm.eq(self.in_imm),
                     # b is the immediate, except FLUSH's (its immediate holds parameters; b the source entry)
                     p2_imm_b.eq(self.in_use_imm & (self.in_op != AluOp.FLUSH))]

        # ---- S3 registers and results (declared first: S2 forwards the S3 write) --------------------
        p3_valid, p3_dst = Signal(), Signal(cfg.acc_idx_bits)
        p3_op, p3_imm = Signal(ALU_OPCODE_BITS, init=IDLE_OP), Signal(signed(w))
        mbits = min(24, w)
        p3_a = [Signal(signed(w), name=f"a_{k}") for k in range(n)]
        p3_b = [Signal(signed(w), name=f"b_{k}") for k in range(n)]
        p3_prod = [Signal(signed(w + mbits), name=f"prod_{k}") for k in range(n)]
        p3_corr = [Signal(w - mbits, name=f"corr_{k}") if w > mbits else None for k in range(n)]
        written = []
        is_flush = p3_op == AluOp.FLUSH
        for k in range(n):
            r = alu_lane(m, p3_op, p3_a[k], p3_b[k], w, p3_imm, (p3_prod[k], p3_corr[k]))
            wk = Signal(signed(w), name=f"wb_{k}")
            m.d.comb += [wk.eq(Mux(is_flush, p3_b[k], r)), self.wb_data[k * w:(k + 1) * w].eq(wk),
                         self.wb_out[k * ow:(k + 1) * ow].eq(r[:ow])]
            written.append(wk)
        m.d.comb += [self.wb_valid.eq(p3_valid), self.wb_idx.eq(p3_dst), self.busy.eq(p2_valid | p3_valid)]

        # ---- S2: operands (the S3 result bypassed where S3 writes what S2 read) and the multiply ----
        fwd_a, fwd_b = p3_valid & (p3_dst == p2_dst), p3_valid & (p3_dst == p2_src)
        a_rd, b_rd = lanes(self.acc_rd_a.data, n, w), lanes(self.acc_rd_b.data, n, w)
        m.d.sync += [p3_valid.eq(p2_valid), p3_dst.eq(p2_dst), p3_op.eq(p2_op), p3_imm.eq(p2_imm)]
        for k in range(n):
            # the multiplier reads the entries as read: no micro-op is in S3 behind a MUL or SCALE in S2
            b_mul = Signal(signed(w), name=f"bm_{k}")
            m.d.comb += b_mul.eq(Mux(p2_imm_b, p2_imm, b_rd[k]))
            prod, corr = lane_product(a_rd[k], b_mul, w)
            m.d.sync += [p3_a[k].eq(Mux(fwd_a, written[k], a_rd[k])),
                         p3_b[k].eq(Mux(p2_imm_b, p2_imm, Mux(fwd_b, written[k], b_rd[k])))]
            with m.If(p2_valid):   # (only a micro-op's product is kept: an idle cycle multiplies nothing)
                m.d.sync += p3_prod[k].eq(prod)
                if corr is not None:
                    m.d.sync += p3_corr[k].eq(corr)
        return m
