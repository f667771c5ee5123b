"""Store stage: 2-D strided DMA from the output buffer to DRAM.

StoreUnit reads y_size x x_size entries from sram_base up (one out-buffer read per cycle, read
data held in the port while the beat register is busy) and packs them into bus beats with byte
strobes (entries < bus width: several per beat; larger: split into several beats). A burst FSM,
independently: per burst one AW (the first offered the cycle after `start`), then that burst's W
beats, one per cycle whenever a packed beat is ready; the next burst's AW the cycle after the
previous WLAST beat. Bursts never cross a row, a 4 KiB boundary or 256 beats. The instruction
completes after the last write response: busy drops in the cycle after the last B beat is seen
(or after the last W beat, if every B came back before it).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig, MemType, elem_bytes
from accel.isa.config import BOUNDARY_BYTES, INSN_BITS

from .axi import WriteClientSignature
from .dma import log2
from .layouts import decode, read_signature
from .queues import QueueReadSignature, QueueWriteSignature
from .stage import StageControl

OUTSTANDING_BITS = 24   # write bursts awaiting their response; no memory holds anywhere near 2**24


class StoreUnit(wiring.Component):
    """start (In), insn (In, STORE held while busy), busy (Out), out_rd (out-buffer read port),
    wr (write client)."""

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        super().__init__({"start": In(1), "insn": In(INSN_BITS), "busy": Out(1),
                          "out_rd": In(read_signature(cfg.acc_idx_bits, cfg.out_elem_bytes * 8)),
                          "wr": Out(WriteClientSignature(cfg))})

    def elaborate(self, platform):
        m = Module()
        cfg, wr = self.cfg, self.wr
        st = decode(cfg, "STORE", self.insn)
        E, B = elem_bytes(cfg, MemType.OUT), cfg.bus_bytes
        le, lb = log2(E), log2(B)
        eb, bb = E * 8, B * 8
        aw = cfg.dram_addr_width
        maxb = cfg.max_burst_beats
        go = self.start & (st.y_size != 0) & (st.x_size != 0)

        # ---- W beat register -------------------------------------------------------------------
        w_full, w_data, w_strb = Signal(), Signal(bb), Signal(B)
        in_w_phase = Signal()
        w_fire = Signal()
        m.d.comb += [wr.w_valid.eq(w_full & in_w_phase), wr.w_data.eq(w_data), wr.w_strb.eq(w_strb),
                     w_fire.eq(wr.w_valid & wr.w_ready)]
        w_free = ~w_full | w_fire
        w_load = Signal()
        with m.If(w_load):
            m.d.sync += w_full.eq(1)
        with m.Elif(w_fire):
            m.d.sync += w_full.eq(0)

        # ---- entry reader ------------------------------------------------------------------------
        per = max(B // E, E // B)
        rd_more, rd_valid = Signal(), Signal()
        rd_addr = Signal(cfg.acc_idx_bits)
        rd_x, rd_y = Signal.like(st.x_size), Signal.like(st.y_size)
        lane = Signal(range(max(2, per)))        # beat lane of the next entry (E < B)
        row_ent = Signal(aw)                      # DRAM entry address of the reader's row
        m_lane, m_row_last = Signal.like(lane), Signal()   # metadata of the entry in the read port
        take, issue = Signal(), Signal()
        m.d.comb += issue.eq(rd_more & (~rd_valid | take))
        m.d.comb += [self.out_rd.addr.eq(rd_addr), self.out_rd.en.eq(issue)]
        row_end = rd_x + 1 == st.x_size
        with m.If(go):
            m.d.sync += [rd_more.eq(1), rd_valid.eq(0), rd_addr.eq(st.sram_base), rd_x.eq(0), rd_y.eq(0),
                         row_ent.eq(st.dram_base), w_full.eq(0)]
            if E < B:
                m.d.sync += lane.eq(st.dram_base[:log2(per)])
        with m.Else():
            m.d.sync += rd_valid.eq(issue | (rd_valid & ~take))
            with m.If(issue):
                m.d.sync += [rd_addr.eq(rd_addr + 1), m_lane.eq(lane), m_row_last.eq(row_end)]
                if E < B:
                    m.d.sync += lane.eq(lane + 1)
                with m.If(row_end):
                    nrow = row_ent + st.x_stride
                    m.d.sync += [rd_x.eq(0), rd_y.eq(rd_y + 1), row_ent.eq(nrow)]
                    if E < B:
                        m.d.sync += lane.eq(nrow[:log2(per)])
                    with m.If(rd_y + 1 == st.y_size):
                        m.d.sync += rd_more.eq(0)
                with m.Else():
                    m.d.sync += rd_x.eq(rd_x + 1)

        # ---- packer --------------------------------------------------------------------------------
        entry = self.out_rd.data
        if E < B:
            acc_data, acc_strb = Signal(bb), Signal(B)
            new_data, new_strb = Signal(bb), Signal(B)
            for l in range(per):
                hit = m_lane == l
                m.d.comb += [new_data[l * eb:(l + 1) * eb].eq(Mux(hit, entry, acc_data[l * eb:(l + 1) * eb])),
                             new_strb[l * E:(l + 1) * E].eq(Mux(hit, Const(-1, E), acc_strb[l * E:(l + 1) * E]))]
            completes = (m_lane == per - 1) | m_row_last
            m.d.comb += take.eq(rd_valid & (~completes | w_free))
            with m.If(take):
                with m.If(completes):
                    m.d.comb += w_load.eq(1)
                    m.d.sync += [w_data.eq(new_data), w_strb.eq(new_strb), acc_data.eq(0), acc_strb.eq(0)]
                with m.Else():
                    m.d.sync += [acc_data.eq(new_data), acc_strb.eq(new_strb)]
            with m.If(go):
                m.d.sync += [acc_data.eq(0), acc_strb.eq(0)]
        else:
            piece = Signal(range(max(2, per)))
            with m.If(rd_valid & w_free):
                m.d.comb += [w_load.eq(1), take.eq(piece == per - 1)]
                m.d.sync += [w_data.eq(entry.word_select(piece, bb) if per > 1 else entry), w_strb.eq(Const(-1, B)),
                             piece.eq(Mux(piece == per - 1, 0, piece + 1))]
            with m.If(go):
                m.d.sync += piece.eq(0)

        # ---- burst FSM: AW, W beats, B responses -------------------------------------------------
        b_row = Signal.like(st.y_size)
        b_row_ent = Signal(aw)
        new_row = Signal()
        beats_bits = st.x_size.shape().width + le + 1
        beats_left = Signal(beats_bits)
        next_addr = Signal(aw)
        burst_left = Signal(range(maxb + 1))
        outstanding = Signal(OUTSTANDING_BITS)
        row_bytes = Signal(aw)
        m.d.comb += row_bytes.eq(b_row_ent << le)
        # a row's beats: (its offset in the first beat + its bytes + B - 1) / B, a narrow adder on
        # the address's low bits (it feeds AWLEN; x_size > 0: a STORE of nothing never starts)
        row_span = Signal(beats_bits + 1)
        m.d.comb += row_span.eq(row_bytes[:lb] + (st.x_size << le) + (B - 1))
        beats_eff, addr_eff = Signal.like(beats_left), Signal(aw)
        m.d.comb += [beats_eff.eq(Mux(new_row, row_span >> lb, beats_left)),
                     addr_eff.eq(Mux(new_row, Cat(Const(0, lb), row_bytes[lb:]), next_addr))]
        to_boundary = Signal(range(BOUNDARY_BYTES // B + 1))
        m.d.comb += to_boundary.eq((BOUNDARY_BYTES // B) - addr_eff[lb:log2(BOUNDARY_BYTES)])
        cap, blen = Signal(range(maxb + 1)), Signal(range(maxb + 1))
        m.d.comb += [cap.eq(Mux(to_boundary < maxb, to_boundary, maxb)),
                     blen.eq(Mux(beats_eff < cap, beats_eff, cap))]

        aw_fire = wr.aw_valid & wr.aw_ready
        b_fire = wr.b_valid & wr.b_ready
        m.d.comb += wr.b_ready.eq(1)
        with m.If(aw_fire & ~b_fire):
            m.d.sync += outstanding.eq(outstanding + 1)
        with m.Elif(b_fire & ~aw_fire):
            m.d.sync += outstanding.eq(outstanding - 1)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(go):
                    m.d.sync += [b_row.eq(0), b_row_ent.eq(st.dram_base), new_row.eq(1)]
                    m.next = "AW"
            with m.State("AW"):
                m.d.comb += [self.busy.eq(1), wr.aw_valid.eq(1), wr.aw_addr.eq(addr_eff), wr.aw_len.eq(blen - 1)]
                with m.If(wr.aw_ready):
                    m.d.sync += [next_addr.eq(addr_eff + (blen << lb)), beats_left.eq(beats_eff - blen),
                                 burst_left.eq(blen), new_row.eq(0)]
                    m.next = "W"
            with m.State("W"):
                m.d.comb += [self.busy.eq(1), in_w_phase.eq(1), wr.w_last.eq(burst_left == 1)]
                with m.If(w_fire):
                    m.d.sync += burst_left.eq(burst_left - 1)
                    with m.If(burst_left == 1):
                        with m.If(beats_left != 0):
                            m.next = "AW"
                        with m.Elif(b_row + 1 != st.y_size):
                            m.d.sync += [b_row.eq(b_row + 1), b_row_ent.eq(b_row_ent + st.x_stride), new_row.eq(1)]
                            m.next = "AW"
                        with m.Else():
                            m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += self.busy.eq(1)
                with m.If(outstanding == b_fire):
                    m.next = "IDLE"
        return m


class StoreStage(wiring.Component):
    """The store stage: cmd (command queue), prev_in / prev_out (tokens from / to compute), wr
    (write client), out_rd (out-buffer read port), idle, busy_cycle, stall_cycle; halt, event,
    executing: as StageControl's."""

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        super().__init__({"cmd": Out(QueueReadSignature(INSN_BITS)),
                          "prev_in": Out(QueueReadSignature(1)), "prev_out": Out(QueueWriteSignature(1)),
                          "wr": Out(WriteClientSignature(cfg)),
                          "out_rd": In(read_signature(cfg.acc_idx_bits, cfg.out_elem_bytes * 8)),
                          "idle": Out(1), "busy_cycle": Out(1), "stall_cycle": Out(1),
                          "halt": In(1), "event": Out(1), "executing": Out(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.ctrl = ctrl = StageControl(has_prev=True, has_next=False)
        m.submodules.unit = unit = StoreUnit(self.cfg)
        for name in ("cmd", "prev_in", "prev_out"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(ctrl, name))
        wiring.connect(m, wiring.flipped(self.wr), unit.wr)
        wiring.connect(m, wiring.flipped(self.out_rd), unit.out_rd)
        m.d.comb += [unit.start.eq(ctrl.start), unit.insn.eq(ctrl.insn), ctrl.unit_busy.eq(unit.busy),
                     ctrl.halt.eq(self.halt), self.idle.eq(ctrl.idle), self.event.eq(ctrl.event),
                     self.executing.eq(ctrl.executing),
                     self.busy_cycle.eq(ctrl.busy_cycle), self.stall_cycle.eq(ctrl.stall_cycle)]
        return m
