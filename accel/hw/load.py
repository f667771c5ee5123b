"""Load stage: 2-D strided DMA from DRAM into the input and weight buffers, zero padding on the fly.

TileLoader (also used by compute for micro-op and accumulator loads) walks the padded tile
row-major, writing one buffer entry per cycle from sram_base up. Timing, after `start` in
cycle s: the first column is handled in s+1. A zero (padding) entry takes 1 cycle. A data
segment (the x_size entries of a non-padding row) takes 1 cycle to start the ReadDMA, then
the DMA's time (see dma.py): entries are written in the cycle they arrive and the next column
(right padding or next row) is handled in the cycle after the last one. busy drops in the
cycle after the last entry is written. LoadStage = StageControl + TileLoader(INP, WGT).
"""
from __future__ import annotations

from amaranth.hdl import Module, Signal, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import WritePort
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig, MemType, elem_bytes
from accel.isa.config import INSN_BITS, SIZE_BITS

from .axi import ReadClientSignature
from .dma import ReadDMA, log2
from .layouts import decode, idx_bits
from .queues import QueueReadSignature, QueueWriteSignature
from .stage import StageControl


def buffer_write_signature(cfg: AccelConfig, mem: MemType) -> WritePort.Signature:
    """Write port of an on-chip buffer: idx_bits address, one entry wide."""
    return WritePort.Signature(addr_width=idx_bits(cfg, mem), shape=unsigned(elem_bytes(cfg, mem) * 8))


def port_name(mem: MemType) -> str:
    return f"wr_{mem.name.lower()}"


class TileLoader(wiring.Component):
    """start (In): begin the LOAD held in `insn` (In, 128 bits, stable while busy); a LOAD whose
    mem_type is not in `mem_types`, or whose padded tile is empty, does nothing. busy (Out).
    dma: read client. wr_<mem> (Out, a memory write port) for each mem type served.
    """

    def __init__(self, cfg: AccelConfig, mem_types: tuple[MemType, ...]):
        self.cfg, self.mem_types = cfg, tuple(mem_types)
        members = {"start": In(1), "insn": In(INSN_BITS), "busy": Out(1), "dma": Out(ReadClientSignature(cfg))}
        for mt in self.mem_types:
            members[port_name(mt)] = In(buffer_write_signature(cfg, mt))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        aw = cfg.dram_addr_width
        m.submodules.dma = dma = ReadDMA(cfg, tuple(elem_bytes(cfg, mt) for mt in self.mem_types))
        wiring.connect(m, wiring.flipped(self.dma), dma.bus)

        ld = decode(cfg, "LOAD", self.insn)
        dim = SIZE_BITS + 1
        n_rows, n_cols = Signal(dim + 1), Signal(dim + 1)
        data_y_end, data_x_end = Signal(dim + 1), Signal(dim + 1)
        m.d.comb += [n_rows.eq(ld.y_pad0 + ld.y_size + ld.y_pad1), n_cols.eq(ld.x_pad0 + ld.x_size + ld.x_pad1),
                     data_y_end.eq(ld.y_pad0 + ld.y_size), data_x_end.eq(ld.x_pad0 + ld.x_size)]

        sel = Signal(range(max(2, len(self.mem_types))))   # mem type being loaded (index)
        served = Signal()
        dram_base_bytes, stride_bytes = Signal(aw), Signal(aw)
        with m.Switch(ld.mem_type):
            for i, mt in enumerate(self.mem_types):
                with m.Case(mt):
                    le = log2(elem_bytes(cfg, mt))
                    m.d.comb += [served.eq(1), dram_base_bytes.eq(ld.dram_base << le)]
                    m.d.sync += [sel.eq(i), stride_bytes.eq(ld.x_stride << le)]

        y, x = Signal(dim + 1), Signal(dim + 1)
        sram_addr = Signal(cfg.sram_idx_bits)
        dram_row = Signal(aw)
        write, wdata = Signal(), Signal(dma.max_bits)

        def advance(nx):
            with m.If(nx == n_cols):
                m.d.sync += [y.eq(y + 1), x.eq(0)]
                with m.If(y + 1 == n_rows):
                    m.next = "IDLE"
            with m.Else():
                m.d.sync += x.eq(nx)

        data_row = (y >= ld.y_pad0) & (y < data_y_end)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start & served & (n_rows != 0) & (n_cols != 0)):
                    m.d.sync += [y.eq(0), x.eq(0), sram_addr.eq(ld.sram_base), dram_row.eq(dram_base_bytes)]
                    m.next = "RUN"
            with m.State("RUN"):
                m.d.comb += self.busy.eq(1)
                with m.If(data_row & (x == ld.x_pad0) & (ld.x_size != 0)):
                    m.d.comb += [dma.start.eq(1), dma.addr.eq(dram_row), dma.count.eq(ld.x_size), dma.sel.eq(sel)]
                    m.next = "DATA"
                with m.Else():
                    m.d.comb += [write.eq(1), wdata.eq(0)]
                    m.d.sync += sram_addr.eq(sram_addr + 1)
                    advance(x + 1)
            with m.State("DATA"):
                m.d.comb += self.busy.eq(1)
                with m.If(dma.out_valid):
                    m.d.comb += [write.eq(1), wdata.eq(dma.out_data)]
                    m.d.sync += sram_addr.eq(sram_addr + 1)
                with m.If(dma.out_valid & dma.out_last):
                    m.d.sync += dram_row.eq(dram_row + stride_bytes)
                    advance(data_x_end)
                    with m.If(data_x_end != n_cols):
                        m.next = "RUN"
                    with m.Elif(y + 1 != n_rows):
                        m.next = "RUN"

        for i, mt in enumerate(self.mem_types):
            port = getattr(self, port_name(mt))
            m.d.comb += [port.en.eq(write & (sel == i)), port.addr.eq(sram_addr[:idx_bits(cfg, mt)]),
                         port.data.eq(wdata[:elem_bytes(cfg, mt) * 8])]
        return m


class LoadStage(wiring.Component):
    """The load stage: LOADs of INP and WGT tiles.

    cmd: its command queue; next_in / next_out: tokens from / to compute; dma: read client;
    wr_inp, wr_wgt: buffer write ports; idle, busy_cycle, stall_cycle, halt, event, executing: as
    StageControl's.
    """

    MEM_TYPES = (MemType.INP, MemType.WGT)

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        members = {"cmd": Out(QueueReadSignature(INSN_BITS)),
                   "next_in": Out(QueueReadSignature(1)), "next_out": Out(QueueWriteSignature(1)),
                   "dma": Out(ReadClientSignature(cfg)),
                   "idle": Out(1), "busy_cycle": Out(1), "stall_cycle": Out(1),
                   "halt": In(1), "event": Out(1), "executing": Out(1)}
        for mt in self.MEM_TYPES:
            members[port_name(mt)] = In(buffer_write_signature(cfg, mt))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ctrl = ctrl = StageControl(has_prev=False, has_next=True)
        m.submodules.loader = loader = TileLoader(self.cfg, self.MEM_TYPES)
        for name in ("cmd", "next_in", "next_out"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(ctrl, name))
        wiring.connect(m, wiring.flipped(self.dma), loader.dma)
        for mt in self.MEM_TYPES:
            wiring.connect(m, wiring.flipped(getattr(self, port_name(mt))), getattr(loader, port_name(mt)))
        m.d.comb += [loader.start.eq(ctrl.start), loader.insn.eq(ctrl.insn), ctrl.unit_busy.eq(loader.busy),
                     ctrl.halt.eq(self.halt), self.idle.eq(ctrl.idle), self.event.eq(ctrl.event),
                     self.executing.eq(ctrl.executing),
                     self.busy_cycle.eq(ctrl.busy_cycle), self.stall_cycle.eq(ctrl.stall_cycle)]
        return m
