"""Compute stage: micro-op and accumulator loads, GEMM, ALU and FINISH.

A GEMM/ALU instruction runs the loop i0 < iter_out, i1 < iter_in, u in [uop_bgn, uop_end):
the cycle after `start` (S0) the first micro-op address goes to the uop buffer, then one per
cycle; S1 adds the loop offsets (kept as running sums, no multipliers) and hands the indices to
GemmCore (written back 3 cycles after S1) or TensorAlu (2 cycles). TensorAlu takes a MUL or SCALE
micro-op only with its S2 empty (in_ready): S1 and S0 then hold for a cycle (the uop buffer's
read port keeps its data), so those ops issue every other cycle; the cycles depend on the op,
never on the indices. The instruction ends when the pipeline has drained: with n micro-ops the
unit is busy for n + 4 cycles after `start` for GEMM, n + 3 for ALU, 2n + 2 for an ALU MUL or
SCALE (none when n = 0). LOADs of UOP/ACC tiles use
a TileLoader (see load.py). FINISH does nothing but raise `finished` when it retires, after which no more
instructions are taken. Other opcodes and LOADs of other buffers retire as no-ops.
Every GEMM/ALU write-back also writes the narrowed value (low out_width bits of each lane)
to the same index of the output buffer; an ALU FLUSH writes its requantized value there and the
entry its source read (acc_rd_b) to the accumulator. EPILOGUE retires as a no-op that sets the
epilogue registers; a flushing GEMM's last micro-op of each pass gets its seed index from them
(kept as running sums like the other indices) and reads the seed on acc_rd_b (GemmCore).
Index faults: the running sums are LOOP_ITER_BITS + 2 bits wider than the buffer indices, so S1
sees each micro-op's exact indices; the first whose dst, read source, weight or flush seed is
beyond its buffer is not issued (nor is any after it, nor another instruction): `fault` pulses
with the instruction's index (carried in the command queue entry above its 128 bits).
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig, AluOp, MemType, Opcode
from accel.isa.config import INSN_BITS, LOOP_ITER_BITS, OPCODE_BITS

from .alu import TensorAlu
from .axi import ReadClientSignature
from .gemm import GemmCore
from .layouts import decode, read_signature, uop_layout
from .load import TileLoader, buffer_write_signature, port_name
from .params import INDEX_BITS
from .queues import QueueReadSignature, QueueWriteSignature
from .stage import StageControl


class ComputeStage(wiring.Component):
    """cmd: command queue. prev_in / prev_out: tokens from / to load; next_in / next_out: from / to
    store. dma: read client (uop and acc loads). wr_uop, wr_acc, wr_out: buffer write ports.
    uop_rd, inp_rd, wgt_rd, acc_rd_a, acc_rd_b: buffer read ports (acc ones write-transparent).
    finished (Out): FINISH retired. idle, busy_cycle, stall_cycle (Out): as StageControl.
    gemm_uop / alu_uop (Out): one cycle per micro-op issued. halt (In): take no instruction.
    event / executing (Out): as StageControl's. fault (Out, strobe) / fault_index (Out): a
    micro-op index out of range, in the instruction of that index.
    """

    LOAD_TYPES = (MemType.UOP, MemType.ACC)

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        acc_bits = cfg.acc_elem_bytes * 8
        super().__init__({
            "cmd": Out(QueueReadSignature(INSN_BITS + INDEX_BITS)),
            "prev_in": Out(QueueReadSignature(1)), "prev_out": Out(QueueWriteSignature(1)),
            "next_in": Out(QueueReadSignature(1)), "next_out": Out(QueueWriteSignature(1)),
            "dma": Out(ReadClientSignature(cfg)),
            "wr_uop": In(buffer_write_signature(cfg, MemType.UOP)),
            "wr_acc": In(buffer_write_signature(cfg, MemType.ACC)),
            "wr_out": In(buffer_write_signature(cfg, MemType.OUT)),
            "uop_rd": In(read_signature(cfg.uop_idx_bits, cfg.uop_bits)),
            "inp_rd": In(read_signature(cfg.inp_idx_bits, cfg.inp_elem_bytes * 8)),
            "wgt_rd": In(read_signature(cfg.wgt_idx_bits, cfg.wgt_elem_bytes * 8)),
            "acc_rd_a": In(read_signature(cfg.acc_idx_bits, acc_bits)),
            "acc_rd_b": In(read_signature(cfg.acc_idx_bits, acc_bits)),
            "finished": Out(1), "idle": Out(1), "busy_cycle": Out(1), "stall_cycle": Out(1),
            "gemm_uop": Out(1), "alu_uop": Out(1), "halt": In(1), "event": Out(1), "executing": Out(1),
            "fault": Out(1), "fault_index": Out(INDEX_BITS)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        m.submodules.ctrl = ctrl = StageControl(has_prev=True, has_next=True, width=INSN_BITS + INDEX_BITS)
        m.submodules.loader = loader = TileLoader(cfg, self.LOAD_TYPES)
        m.submodules.gemm = gemm = GemmCore(cfg)
        m.submodules.alu = alu = TensorAlu(cfg)
        for name in ("cmd", "prev_in", "prev_out", "next_in", "next_out"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(ctrl, name))
        wiring.connect(m, wiring.flipped(self.dma), loader.dma)
        wiring.connect(m, wiring.flipped(self.wr_uop), getattr(loader, port_name(MemType.UOP)))

        insn = ctrl.insn[:INSN_BITS]
        opcode = insn[:OPCODE_BITS]
        is_gemm, is_alu = opcode == Opcode.GEMM, opcode == Opcode.ALU
        g, a, e = decode(cfg, "GEMM", insn), decode(cfg, "ALU", insn), decode(cfg, "EPILOGUE", insn)
        # ---- epilogue registers (EPILOGUE) ---------------------------------------------------------
        epi_imm, epi_to_acc = Signal.like(e.imm), Signal()
        epi_base, epi_fo, epi_fi = (Signal(cfg.acc_idx_bits, name=n) for n in ("seed_base", "seed_fo", "seed_fi"))
        with m.If(ctrl.start & (opcode == Opcode.EPILOGUE)):
            m.d.sync += [epi_imm.eq(e.imm), epi_base.eq(e.seed_base), epi_fo.eq(e.seed_factor_out),
                         epi_fi.eq(e.seed_factor_in), epi_to_acc.eq(e.to_acc)]
        m.d.comb += [loader.start.eq(ctrl.start & (opcode == Opcode.LOAD)), loader.insn.eq(insn)]

        # ---- loop sequencer (S0) -------------------------------------------------------------
        def pick(field):
            return Mux(is_gemm, getattr(g, field), getattr(a, field))
        bgn, end = pick("uop_bgn"), pick("uop_end")
        iter_out, iter_in = pick("iter_out"), pick("iter_in")
        sb = cfg.src_idx_bits
        wide = LOOP_ITER_BITS + 2      # room for (iter - 1) * factor above an index: sums never wrap
        active = Signal()
        u = Signal(cfg.uop_idx_bits + 1)
        i0, i1 = Signal.like(g.iter_out), Signal.like(g.iter_in)
        d_out, d_in = Signal(cfg.acc_idx_bits + wide), Signal(cfg.acc_idx_bits + wide)
        s_out, s_in = Signal(sb + wide), Signal(sb + wide)
        w_out, w_in = Signal(cfg.wgt_idx_bits + wide), Signal(cfg.wgt_idx_bits + wide)
        e_out, e_in = Signal(cfg.acc_idx_bits + wide), Signal(cfg.acc_idx_bits + wide)   # seed offsets
        dfo, dfi = pick("dst_factor_out"), pick("dst_factor_in")
        sfo, sfi = pick("src_factor_out"), pick("src_factor_in")

        hold = Signal()   # S1 holds its micro-op (TensorAlu not ready): S0 and the uop read wait too
        with m.If(ctrl.start & (is_gemm | is_alu)):
            m.d.sync += [active.eq((end > bgn) & (iter_out != 0) & (iter_in != 0)), u.eq(bgn), i0.eq(0), i1.eq(0),
                         d_out.eq(0), d_in.eq(0), s_out.eq(0), s_in.eq(0), w_out.eq(0), w_in.eq(0),
                         e_out.eq(0), e_in.eq(0)]
        with m.Elif(active & ~hold):
            with m.If(u + 1 == end):
                m.d.sync += u.eq(bgn)
                with m.If(i1 + 1 == iter_in):
                    m.d.sync += i1.eq(0)
                    nd, ns, nw, ne = d_out + dfo, s_out + sfo, w_out + g.wgt_factor_out, e_out + epi_fo
                    m.d.sync += [d_out.eq(nd), d_in.eq(nd), s_out.eq(ns), s_in.eq(ns), w_out.eq(nw), w_in.eq(nw),
                                 e_out.eq(ne), e_in.eq(ne)]
                    with m.If(i0 + 1 == iter_out):
                        m.d.sync += active.eq(0)
                    with m.Else():
                        m.d.sync += i0.eq(i0 + 1)
                with m.Else():
                    m.d.sync += [i1.eq(i1 + 1), d_in.eq(d_in + dfi), s_in.eq(s_in + sfi),
                                 w_in.eq(w_in + g.wgt_factor_in), e_in.eq(e_in + epi_fi)]
            with m.Else():
                m.d.sync += u.eq(u + 1)
        m.d.comb += [self.uop_rd.addr.eq(u), self.uop_rd.en.eq(~hold),
                     self.gemm_uop.eq(active & is_gemm), self.alu_uop.eq(active & is_alu & ~hold)]

        # ---- S1: resolve indices -----------------------------------------------------------
        p1_valid, p1_last = Signal(), Signal()
        p1_d, p1_s, p1_w, p1_e = Signal.like(d_in), Signal.like(s_in), Signal.like(w_in), Signal.like(e_in)
        with m.If(~hold):
            m.d.sync += [p1_valid.eq(active), p1_d.eq(d_in), p1_s.eq(s_in), p1_w.eq(w_in), p1_e.eq(e_in),
                         p1_last.eq(u + 1 == end)]
        ul = uop_layout(cfg)
        uop = data.View(ul, self.uop_rd.data[:ul.size])
        dst_full, src_full = Signal(len(p1_d) + 1), Signal(len(p1_s) + 1)
        wgt_full, seed_full = Signal(len(p1_w) + 1), Signal(len(p1_e) + 1)
        m.d.comb += [dst_full.eq(uop.acc + p1_d), src_full.eq(uop.src + p1_s), wgt_full.eq(uop.wgt + p1_w),
                     seed_full.eq(epi_base + p1_e)]
        dst, src = dst_full[:cfg.acc_idx_bits], src_full[:sb]
        # ---- index faults (the checks of fsim's _plan and _flush_plan) -----------------------
        reads_src = Mux(is_gemm, ~g.reset, ~a.use_imm | (a.alu_op == AluOp.FLUSH))
        src_depth = Mux(is_gemm, cfg.inp_depth, cfg.acc_depth)
        bad_idx = Signal()
        m.d.comb += bad_idx.eq((dst_full >= cfg.acc_depth) | (reads_src & (src_full >= src_depth)) |
                               (is_gemm & ~g.reset & (wgt_full >= cfg.wgt_depth)) |
                               (is_gemm & g.flush & p1_last & ~epi_to_acc & (seed_full >= cfg.acc_depth)))
        faulted = Signal()
        m.d.comb += hold.eq(p1_valid & is_alu & ~alu.in_ready)
        issue = p1_valid & ~faulted & ~bad_idx & ~hold
        with m.If(p1_valid & ~faulted & bad_idx):
            m.d.comb += [self.fault.eq(1), self.fault_index.eq(ctrl.insn[INSN_BITS:])]
            m.d.sync += [faulted.eq(1), active.eq(0)]
        m.d.comb += [gemm.in_valid.eq(issue & is_gemm), gemm.in_acc.eq(dst), gemm.in_inp.eq(src[:cfg.inp_idx_bits]),
                     gemm.in_wgt.eq(wgt_full[:cfg.wgt_idx_bits]), gemm.in_reset.eq(g.reset),
                     gemm.in_flush.eq(g.flush & p1_last), gemm.in_seed.eq(seed_full[:cfg.acc_idx_bits]),
                     gemm.flush_imm.eq(epi_imm), gemm.flush_to_acc.eq(epi_to_acc),
                     alu.in_valid.eq(issue & is_alu), alu.in_dst.eq(dst), alu.in_src.eq(src[:cfg.acc_idx_bits]),
                     alu.in_op.eq(a.alu_op), alu.in_use_imm.eq(a.use_imm), alu.in_imm.eq(a.imm)]

        # ---- buffer ports --------------------------------------------------------------------
        m.d.comb += [self.inp_rd.addr.eq(gemm.inp_rd.addr), self.inp_rd.en.eq(gemm.inp_rd.en),
                     gemm.inp_rd.data.eq(self.inp_rd.data),
                     self.wgt_rd.addr.eq(gemm.wgt_rd.addr), self.wgt_rd.en.eq(gemm.wgt_rd.en),
                     gemm.wgt_rd.data.eq(self.wgt_rd.data),
                     self.acc_rd_a.addr.eq(Mux(is_gemm, gemm.acc_rd.addr, alu.acc_rd_a.addr)), self.acc_rd_a.en.eq(1),
                     gemm.acc_rd.data.eq(self.acc_rd_a.data), alu.acc_rd_a.data.eq(self.acc_rd_a.data),
                     self.acc_rd_b.addr.eq(Mux(is_gemm, gemm.seed_rd.addr, alu.acc_rd_b.addr)), self.acc_rd_b.en.eq(1),
                     alu.acc_rd_b.data.eq(self.acc_rd_b.data), gemm.seed_rd.data.eq(self.acc_rd_b.data)]

        ld_acc = getattr(loader, port_name(MemType.ACC))
        wb_valid = gemm.wb_valid | alu.wb_valid
        wb_idx = Mux(gemm.wb_valid, gemm.wb_idx, alu.wb_idx)
        wb_data = Mux(gemm.wb_valid, gemm.wb_data, alu.wb_data)
        m.d.comb += [self.wr_acc.en.eq(ld_acc.en | wb_valid),
                     self.wr_acc.addr.eq(Mux(ld_acc.en, ld_acc.addr, wb_idx)),
                     self.wr_acc.data.eq(Mux(ld_acc.en, ld_acc.data, wb_data)),
                     self.wr_out.en.eq(wb_valid), self.wr_out.addr.eq(wb_idx),
                     self.wr_out.data.eq(Mux(gemm.wb_valid, gemm.wb_out, alu.wb_out))]

        # ---- sequencing ----------------------------------------------------------------------
        finished = Signal()
        with m.If(ctrl.retire & (opcode == Opcode.FINISH)):
            m.d.sync += finished.eq(1)
        m.d.comb += [ctrl.unit_busy.eq(loader.busy | active | p1_valid | gemm.busy | alu.busy),
                     ctrl.halt.eq(finished | faulted | self.halt), self.finished.eq(finished), self.idle.eq(ctrl.idle),
                     self.event.eq(ctrl.event), self.executing.eq(ctrl.executing),
                     self.busy_cycle.eq(ctrl.busy_cycle), self.stall_cycle.eq(ctrl.stall_cycle)]
        return m
