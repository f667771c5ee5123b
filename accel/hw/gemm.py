"""GemmCore: the BATCH x BLOCK_IN x BLOCK_OUT multiply-accumulate pipeline, one micro-op per cycle.

Stages (cycle of the micro-op's indices = S1): S1 presents inp/wgt/acc addresses to the buffers'
synchronous read ports; S2 multiplies and reduces each dot product (registered) and takes the
old accumulator value; S3 adds and writes back (wb_*: written at the end of S3, to acc and, by
compute, narrowed to out). Read-after-write on the same accumulator index: the micro-op right
behind (in S2 while its predecessor is in S3) takes the S3 result through a bypass; the one two
behind reads in S1 while S3 writes, which the acc read port's write-transparency covers. So the
core never stalls; a micro-op whose indices arrive in cycle t is written back in cycle t+2.
A flushing micro-op (in_flush: the last of a pass of a GEMM with flush) reads its seed entry on
the second acc port in S1 (with the same S3 bypass) and writes the seed to the accumulator and
the FLUSH requantization of its sum (flush_imm) to the output buffer (with flush_to_acc, to the
accumulator too, sign-extended, instead of the seed); other micro-ops give the
output buffer their narrowed sum. The bypass forwards what was written to the accumulator.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig
from accel.isa.config import ALU_IMM_BITS

from .alu import flush_lane
from .layouts import lanes, read_signature


def tree_sum(values: list):
    """Balanced adder tree (shallower than a chain of additions)."""
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


class GemmCore(wiring.Component):
    """in_valid / in_acc / in_inp / in_wgt / in_reset / in_flush / in_seed (In): a micro-op's
    resolved indices in S1. flush_imm, flush_to_acc (In): the current EPILOGUE's immediate and mode.
    inp_rd, wgt_rd, acc_rd, seed_rd (read ports, driven by the core). wb_valid / wb_idx / wb_data
    (Out): the accumulator entry written this cycle; wb_out: the output buffer's (out_width lanes).
    busy (Out): a micro-op is in S2 or S3. reset micro-ops sum to zero.
    """

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
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

        # S1: addresses
        m.d.comb += [self.inp_rd.addr.eq(self.in_inp), self.wgt_rd.addr.eq(self.in_wgt),
                     self.acc_rd.addr.eq(self.in_acc), self.seed_rd.addr.eq(self.in_seed),
                     self.inp_rd.en.eq(1), self.wgt_rd.en.eq(1), self.acc_rd.en.eq(1), self.seed_rd.en.eq(1)]
        p2_valid, p2_idx, p2_reset, p2_flush = Signal(), Signal(cfg.acc_idx_bits), Signal(), Signal()
        p2_seed = Signal(cfg.acc_idx_bits)
        m.d.sync += [p2_valid.eq(self.in_valid), p2_idx.eq(self.in_acc), p2_reset.eq(self.in_reset),
                     p2_flush.eq(self.in_valid & self.in_flush), p2_seed.eq(self.in_seed)]

        # S3 registers and result (declared first: S2 bypasses from the S3 write)
        p3_valid, p3_idx, p3_reset, p3_flush = Signal(), Signal(cfg.acc_idx_bits), Signal(), Signal()
        dot_w = cfg.inp_width + cfg.wgt_width + max(1, (ni - 1).bit_length())
        p3_dot = [Signal(signed(dot_w), name=f"dot_{k}") for k in range(nb * no)]
        p3_acc, p3_seed = Signal(self.acc_bits), Signal(self.acc_bits)
        result = Signal(self.acc_bits)
        old = lanes(p3_acc, nb * no, aw)
        for k in range(nb * no):
            m.d.comb += result[k * aw:(k + 1) * aw].eq(Mux(p3_reset, 0, old[k] + p3_dot[k]))
        # the output buffer: the narrowed sum, or a flushing micro-op's requantized sum; with
        # flush_to_acc the accumulator gets that sign-extended (an int8 clamp fits any out_width).
        # Each lane's requantization sits in a narrow select that Verilator evaluates only for
        # flushing micro-ops; as a named signal over the whole entry it was computed on every cycle
        # (the rtl model ran ResNet-18's C2 layer at 1.50 M cycles/s, 1.61 M this way)
        ow = cfg.out_width
        for k, lane in enumerate(lanes(result, nb * no, aw)):
            m.d.comb += self.wb_out[k * ow:(k + 1) * ow].eq(Mux(p3_flush, flush_lane(lane, self.flush_imm), lane)[:ow])
        # lane by lane, so that each select stays narrow (a simulator evaluates a wide one's operands whole)
        seeds, sums = lanes(p3_seed, nb * no, aw, sign=False), lanes(result, nb * no, aw, sign=False)
        outs = lanes(self.wb_out, nb * no, ow, sign=False)
        written = Cat(*[Mux(p3_flush, Mux(self.flush_to_acc, Cat(q, q[-1].replicate(aw - ow)), seeds[k]), sums[k])
                        for k, q in enumerate(outs)])
        m.d.comb += [self.wb_valid.eq(p3_valid), self.wb_idx.eq(p3_idx), self.wb_data.eq(written)]

        # S2: products and dot products; accumulator value with the S3 -> S2 bypass
        inp = lanes(self.inp_rd.data, nb * ni, cfg.inp_width)
        wgt = lanes(self.wgt_rd.data, no * ni, cfg.wgt_width)
        for b in range(nb):
            for o in range(no):
                prods = [inp[b * ni + i] * wgt[o * ni + i] for i in range(ni)]
                m.d.sync += p3_dot[b * no + o].eq(tree_sum(prods))
        bypass = p3_valid & (p3_idx == p2_idx)
        seed_bypass = p3_valid & (p3_idx == p2_seed)
        m.d.sync += [p3_valid.eq(p2_valid), p3_idx.eq(p2_idx), p3_reset.eq(p2_reset), p3_flush.eq(p2_flush),
                     p3_acc.eq(Mux(bypass, written, self.acc_rd.data))]
        with m.If(p2_flush):   # (only a flushing micro-op reads its seed)
            m.d.sync += p3_seed.eq(Mux(seed_bypass, written, self.seed_rd.data))
        m.d.comb += self.busy.eq(p2_valid | p3_valid)
        return m
