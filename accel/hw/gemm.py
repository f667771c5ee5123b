"""GemmCore: the BATCH x BLOCK_IN x BLOCK_OUT multiply-accumulate pipeline, one micro-op per cycle.

Stages (cycle of the micro-op's indices = S1): S1 presents inp/wgt addresses to the buffers'
synchronous read ports; S2 multiplies (registered: the products, or the packed pair sums below,
which a DSP48E1 holds in its P register) and presents the accumulator address; S3 reduces each dot
product (registered) and takes the old accumulator value; S4 adds and writes back (wb_*: written
at the end of S4, to acc and, by compute, narrowed to out). Three cycles between the buffers and
the write keep the read, the multiply, the adder tree and the accumulate in different cycles (in
two, the wgt read -> packed multiply -> split -> adder tree path was the longest by yosys' estimate
once the ALU was pipelined). Read-after-write on the same accumulator index: the micro-op right
behind (in S3 while its predecessor is in S4) takes the S4 result through a bypass; the one two
behind reads in S2 while S4 writes, which the acc read port's write-transparency covers. So the
core never stalls; a micro-op whose indices arrive in cycle t is written back in cycle t+3.
A flushing micro-op (in_flush: the last of a pass of a GEMM with flush) reads its seed entry on
the second acc port in S2 (with the same S4 bypass) and writes the seed to the accumulator and
the FLUSH requantization of its sum (flush_imm) to the output buffer (with flush_to_acc, to the
accumulator too, sign-extended, instead of the seed); other micro-ops give the
output buffer their narrowed sum. The bypass forwards what was written to the accumulator.

DSP packing (two products per multiplier, as Xilinx packs INT8 into its DSPs): output lanes 2j and
2j+1 multiply the same input element, so S2 computes inp * ((w_{2j+1} << S) + w_{2j}) once, with
S = inp_width + wgt_width (each product fits S signed bits). The packed operand is wiring and a
narrow subtract (packed_operand). Two packed products are summed before they are split: the low S
bits of the sum, read as signed (100...0 as +2^(S-1), the one sum out of that range), are the even
lane's two products; the bits above them, floored, are the odd lane's minus 1 where the even sum is
negative, a borrow that is added back once per dot product (a count of the borrow bits) instead of
per pair. Bit-exact; same cycles. Packing is used where the packed
operand fits a DSP48E1's 25-bit port and the input its 18-bit one (8-bit inputs and weights).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig
from accel.isa.config import ALU_IMM_BITS

from .alu import flush_lane, tree_sum
from .layouts import lanes, read_signature

# the DSP48E1 multiplier's signed port widths (25 x 18): packing must fit them to save DSPs
DSP_A_BITS, DSP_B_BITS = 25, 18


def packing_shift(inp_width: int, wgt_width: int) -> int | None:
    """S for two inp x wgt products per multiply, or None where the packed weight operand
    ((w_hi << S) + w_lo: wgt_width + S + 1 signed bits) or the input would not fit the DSP."""
    s = inp_width + wgt_width
    return s if wgt_width + s + 1 <= DSP_A_BITS and inp_width <= DSP_B_BITS else None


def packed_weights(w_hi: int, w_lo: int, shift: int) -> int:
    """Python model of the packed operand (w_hi << shift) + w_lo (signed integers)."""
    return (w_hi << shift) + w_lo


def split_packed(p: int, shift: int) -> tuple[int, int]:
    """Python model of the bit slicing: the packed product p's (hi, lo) products. lo: the low
    `shift` bits as signed; hi: the bits above them (floored) plus the borrow, lo's sign bit."""
    low = p & ((1 << shift) - 1)
    borrow = low >> (shift - 1)
    return (p >> shift) + borrow, low - (borrow << shift)


def split_pair(q: int, shift: int) -> tuple[int, int]:
    """Python model of the split of a sum of two packed products: its low sum lies in
    (-2^(shift-1), 2^(shift-1)] (each product's magnitude is at most 2^(shift-2)), so the low `shift`
    bits read as signed except that 100...0 is +2^(shift-1); hi takes the borrow where lo < 0."""
    low = q & ((1 << shift) - 1)
    borrow = int(low >> (shift - 1) == 1 and low != 1 << (shift - 1))
    return (q >> shift) + borrow, low - (borrow << shift)


def packed_operand(w_hi, w_lo, shift: int):
    """Amaranth: (w_hi << shift) + w_lo as wires and a narrow subtract (no shift-wide adder): the low
    `shift` bits are w_lo sign-extended, the bits above w_hi - (w_lo < 0)."""
    top = (w_hi - w_lo[-1])[:len(w_hi) + 1]
    return Cat(w_lo, w_lo[-1].replicate(shift - len(w_lo)), top).as_signed()


def packed_pairs(inp: list, w_lo: list, w_hi: list, shift: int) -> list:
    """Amaranth: the products a * ((w_hi << S) + w_lo), one multiply per element pair, summed two by
    two (an add a DSP's post-adder can take): the terms split_sums splits."""
    prods = [a * packed_operand(wh, wl, shift) for a, wl, wh in zip(inp, w_lo, w_hi)]
    return [prods[i] + prods[i + 1] if i + 1 < len(prods) else prods[i] for i in range(0, len(prods), 2)]


def split_sums(qs: list, shift: int, n: int) -> tuple:
    """Amaranth: (sum inp*w_hi, sum inp*w_lo) from packed_pairs' terms over n elements (the last term
    a single product when n is odd): each split (split_pair) before the two adder trees, the borrows
    counted once."""
    lo, hi, borrows = [], [], []
    for j, q in enumerate(qs):
        if 2 * j + 1 < n:
            low = q[:shift]
            borrow = low[shift - 1] & (low[:shift - 1] != 0)     # 100...0 is +2^(shift-1)
            lo.append(Cat(low, borrow).as_signed())
        else:
            borrow = q[shift - 1]
            lo.append(q[:shift].as_signed())
        hi.append(q[shift:].as_signed())
        borrows.append(borrow.as_unsigned())
    return tree_sum(hi) + tree_sum(borrows), tree_sum(lo)


def packed_dots(inp: list, w_lo: list, w_hi: list, shift: int) -> tuple:
    """Amaranth: (sum inp*w_hi, sum inp*w_lo) with one multiply per element pair, combinationally
    (packed_pairs then split_sums; GemmCore registers between the two). Summing two products before
    the split halves the inputs of the two adder trees and of the borrow count."""
    return split_sums(packed_pairs(inp, w_lo, w_hi, shift), shift, len(inp))


class GemmCore(wiring.Component):
    """in_valid / in_acc / in_inp / in_wgt / in_reset / in_flush / in_seed (In): a micro-op's
    resolved indices in S1. flush_imm, flush_to_acc (In): the current EPILOGUE's immediate and mode.
    inp_rd, wgt_rd, acc_rd, seed_rd (read ports, driven by the core). wb_valid / wb_idx / wb_data
    (Out): the accumulator entry written this cycle; wb_out: the output buffer's (out_width lanes).
    busy (Out): a micro-op is in S2 or S3. reset micro-ops sum to zero.
    """

    def __init__(self, cfg: AccelConfig, *, dsp_packing: bool | None = None):
        """dsp_packing: two products per multiplier; None: the config's dsp_packing, which applies
        wherever packing_shift allows it (True where it cannot is a ValueError)."""
        self.cfg = cfg
        shift = packing_shift(cfg.inp_width, cfg.wgt_width)
        if dsp_packing and shift is None:
            raise ValueError(f"dsp_packing: inp_width {cfg.inp_width} x wgt_width {cfg.wgt_width} does not "
                             f"fit a {DSP_A_BITS}x{DSP_B_BITS} multiplier packed (8 x 8 does)")
        packing = cfg.dsp_packing if dsp_packing is None else dsp_packing
        self.pack_shift = shift if packing and cfg.block_out > 1 else None
        self.acc_bits = cfg.batch * cfg.block_out * cfg.acc_width
        super().__init__({
            "in_valid": In(1), "in_acc": In(cfg.acc_idx_bits), "in_inp": In(cfg.inp_idx_bits),
            "in_wgt": In(cfg.wgt_idx_bits), "in_reset": In(1), "in_flush": In(1),
            "in_seed": In(cfg.acc_idx_bits), "flush_imm": In(signed(ALU_IMM_BITS)), "flush_to_acc": In(1),
            "inp_rd": In(read_signature(cfg.inp_idx_bits, cfg.inp_elem_bytes * 8)),
            "wgt_rd": In(read_signature(cfg.wgt_idx_bits, cfg.wgt_elem_bytes * 8)),
            "acc_rd": In(read_signature(cfg.acc_idx_bits, self.acc_bits)),
            "seed_rd": In(read_signature(cfg.acc_idx_bits, self.acc_bits)),
            "wb_valid": Out(1), "wb_idx": Out(cfg.acc_idx_bits), "wb_data": Out(self.acc_bits),
            "wb_out": Out(cfg.batch * cfg.block_out * cfg.out_width), "busy": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        nb, ni, no, aw = cfg.batch, cfg.block_in, cfg.block_out, cfg.acc_width

        # S1: inp/wgt addresses; S2: acc and seed addresses (read in S3, beside the S4 write)
        p2_valid, p2_idx, p2_reset, p2_flush = Signal(), Signal(cfg.acc_idx_bits), Signal(), Signal()
        p2_seed = Signal(cfg.acc_idx_bits)
        m.d.comb += [self.inp_rd.addr.eq(self.in_inp), self.wgt_rd.addr.eq(self.in_wgt),
                     self.acc_rd.addr.eq(p2_idx), self.seed_rd.addr.eq(p2_seed),
                     self.inp_rd.en.eq(1), self.wgt_rd.en.eq(1), self.acc_rd.en.eq(1), self.seed_rd.en.eq(1)]
        m.d.sync += [p2_valid.eq(self.in_valid), p2_idx.eq(self.in_acc), p2_reset.eq(self.in_reset),
                     p2_flush.eq(self.in_valid & self.in_flush), p2_seed.eq(self.in_seed)]
        p3_valid, p3_idx, p3_reset, p3_flush = Signal(), Signal(cfg.acc_idx_bits), Signal(), Signal()
        p3_seed = Signal(cfg.acc_idx_bits)
        m.d.sync += [p3_valid.eq(p2_valid), p3_idx.eq(p2_idx), p3_reset.eq(p2_reset), p3_flush.eq(p2_flush),
                     p3_seed.eq(p2_seed)]

        # S4 registers and result (declared first: S3 bypasses from the S4 write)
        p4_valid, p4_idx, p4_reset, p4_flush = Signal(), Signal(cfg.acc_idx_bits), Signal(), Signal()
        dot_w = cfg.inp_width + cfg.wgt_width + max(1, (ni - 1).bit_length())
        p4_dot = [Signal(signed(dot_w), name=f"dot_{k}") for k in range(nb * no)]
        p4_acc, p4_seed = Signal(self.acc_bits), Signal(self.acc_bits)
        result = Signal(self.acc_bits)
        old = lanes(p4_acc, nb * no, aw)
        for k in range(nb * no):
            m.d.comb += result[k * aw:(k + 1) * aw].eq(Mux(p4_reset, 0, old[k] + p4_dot[k]))
        # the output buffer: the narrowed sum, or a flushing micro-op's requantized sum; with
        # flush_to_acc the accumulator gets that sign-extended (an int8 clamp fits any out_width).
        # Each lane's requantization sits in a narrow select that Verilator evaluates only for
        # flushing micro-ops; as a named signal over the whole entry it was computed on every cycle
        # (the rtl model ran ResNet-18's C2 layer at 1.50 M cycles/s, 1.61 M this way)
        ow = cfg.out_width
        for k, lane in enumerate(lanes(result, nb * no, aw)):
            m.d.comb += self.wb_out[k * ow:(k + 1) * ow].eq(Mux(p4_flush, flush_lane(lane, self.flush_imm), lane)[:ow])
        # lane by lane, so that each select stays narrow (a simulator evaluates a wide one's operands whole)
        seeds, sums = lanes(p4_seed, nb * no, aw, sign=False), lanes(result, nb * no, aw, sign=False)
        outs = lanes(self.wb_out, nb * no, ow, sign=False)
        written = Cat(*[Mux(p4_flush, Mux(self.flush_to_acc, Cat(q, q[-1].replicate(aw - ow)), seeds[k]), sums[k])
                        for k, q in enumerate(outs)])
        m.d.comb += [self.wb_valid.eq(p4_valid), self.wb_idx.eq(p4_idx), self.wb_data.eq(written)]

        # S2: products (packed: pair sums), registered; S3: dot products, registered
        inp = lanes(self.inp_rd.data, nb * ni, cfg.inp_width)
        wgt = lanes(self.wgt_rd.data, no * ni, cfg.wgt_width)
        shift = self.pack_shift
        for b in range(nb):
            row = inp[b * ni:(b + 1) * ni]
            for o in range(no):
                if shift is not None and o % 2 == 0 and o + 1 < no:
                    qs = packed_pairs(row, wgt[o * ni:(o + 1) * ni], wgt[(o + 1) * ni:(o + 2) * ni], shift)
                    regs = [Signal(signed(len(q)), name=f"pq_{b}_{o}_{j}") for j, q in enumerate(qs)]
                    m.d.sync += [r.eq(q) for r, q in zip(regs, qs)]
                    hi, lo = split_sums(regs, shift, ni)
                    m.d.sync += [p4_dot[b * no + o].eq(lo), p4_dot[b * no + o + 1].eq(hi)]
                elif shift is None or o % 2 == 0:    # (odd lanes of a pair are written with the even one)
                    prods = [row[i] * wgt[o * ni + i] for i in range(ni)]
                    regs = [Signal(signed(len(q)), name=f"p_{b}_{o}_{i}") for i, q in enumerate(prods)]
                    m.d.sync += [r.eq(q) for r, q in zip(regs, prods)]
                    m.d.sync += p4_dot[b * no + o].eq(tree_sum(regs))
        bypass = p4_valid & (p4_idx == p3_idx)
        seed_bypass = p4_valid & (p4_idx == p3_seed)
        m.d.sync += [p4_valid.eq(p3_valid), p4_idx.eq(p3_idx), p4_reset.eq(p3_reset), p4_flush.eq(p3_flush),
                     p4_acc.eq(Mux(bypass, written, self.acc_rd.data))]
        with m.If(p3_flush):   # (only a flushing micro-op reads its seed)
            m.d.sync += p4_seed.eq(Mux(seed_bypass, written, self.seed_rd.data))
        m.d.comb += self.busy.eq(p2_valid | p3_valid | p4_valid)
        return m
