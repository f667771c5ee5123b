"""Load stage: 2-D strided DMA from DRAM into the input and weight buffers, zero padding on the fly.

TileLoader (also used by compute for micro-op and accumulator loads) fills the padded tile
(row-major from sram_base up) from two sources that share the buffer's write port. Timing, after
`start` in cycle s: data rows go to the ReadDMA as one command in cycle s (its first AR in s+1,
the next bursts back to back, see dma.py), and each data entry is written in the cycle the DMA
emits it. Padding zeros are written one per cycle from s+1 in row-major order, each in the first
cycle whose write port the data leaves free; a data row without padding columns costs the
padding walker one cycle (no write), and a tile without any padding has no walker at all.
busy drops in the cycle after the last entry (data or padding) is written. LoadStage =
StageControl + TileLoader(INP, WGT).
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, unsigned
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
        m.submodules.dma = dma = ReadDMA(cfg, tuple(elem_bytes(cfg, mt) for mt in self.mem_types),
                                         rows_width=SIZE_BITS)
        wiring.connect(m, wiring.flipped(self.dma), dma.bus)

        ld = decode(cfg, "LOAD", self.insn)       # stable while busy
        dim = SIZE_BITS + 1
        n_rows, n_cols = Signal(dim + 1), Signal(dim + 1)
        data_y_end, data_x_end = Signal(dim + 1), Signal(dim + 1)
        m.d.comb += [n_rows.eq(ld.y_pad0 + ld.y_size + ld.y_pad1), n_cols.eq(ld.x_pad0 + ld.x_size + ld.x_pad1),
                     data_y_end.eq(ld.y_pad0 + ld.y_size), data_x_end.eq(ld.x_pad0 + ld.x_size)]

        sel_now = Signal(range(max(2, len(self.mem_types))))   # mem type of the instruction (index)
        served = Signal()
        dram_base_bytes, stride_bytes = Signal(aw), Signal(aw)
        with m.Switch(ld.mem_type):
            for i, mt in enumerate(self.mem_types):
                with m.Case(mt):
                    le = log2(elem_bytes(cfg, mt))
                    m.d.comb += [served.eq(1), sel_now.eq(i), dram_base_bytes.eq(ld.dram_base << le),
                                 stride_bytes.eq(ld.x_stride << le)]
        sel = Signal.like(sel_now)            # mem type being loaded
        go = Signal()
        has_data = Signal()
        any_pad = Signal()
        # n_rows, n_cols: sums of non-negative fields in a width that holds them, so non-zero iff
        # a field is (no adder on `go`'s path, which starts the DMA)
        rows_nz = (ld.y_pad0 != 0) | (ld.y_size != 0) | (ld.y_pad1 != 0)
        cols_nz = (ld.x_pad0 != 0) | (ld.x_size != 0) | (ld.x_pad1 != 0)
        m.d.comb += [go.eq(self.start & served & rows_nz & cols_nz),
                     has_data.eq((ld.y_size != 0) & (ld.x_size != 0)),
                     any_pad.eq((ld.y_pad0 != 0) | (ld.y_pad1 != 0) | (ld.x_pad0 != 0) | (ld.x_pad1 != 0))]
        with m.If(go):
            m.d.sync += sel.eq(sel_now)
        # the tile's geometry, latched at `go` (the instruction is stable, but its sums are a chain of
        # adders from the instruction register: off the walker's and write port's paths, for Fmax)
        geo_now = (n_rows, n_cols, data_y_end, data_x_end, ld.y_pad0, ld.x_pad0)
        geo = tuple(Signal.like(v, name=f"geo_{n}") for v, n in
                    zip(geo_now, ("n_rows", "n_cols", "data_y_end", "data_x_end", "y_pad0", "x_pad0")))
        # and the walker's compares as constants: wx + 1 == x_pad0 is wx == x_pad0 - 1 (all ones for
        # x_pad0 = 0: wx never gets there), wx + 1 == n_cols is wx == n_cols - 1, and a data row
        # ends at n_cols after its right padding iff x_pad1 == 0
        pad0_m1, cols_m1, no_right = Signal(dim + 1), Signal(dim + 1), Signal()
        with m.If(go):
            m.d.sync += [r.eq(v) for r, v in zip(geo, geo_now)]
            m.d.sync += [pad0_m1.eq(ld.x_pad0 - 1), cols_m1.eq(n_cols - 1), no_right.eq(ld.x_pad1 == 0)]
        r_rows, r_cols, r_y_end, r_x_end, r_y_pad0, r_x_pad0 = geo

        # ---- data: one DMA command for every row; each entry written in the cycle it arrives -------
        m.d.comb += [dma.start.eq(go & has_data), dma.addr.eq(dram_base_bytes), dma.count.eq(ld.x_size),
                     dma.rows_minus1.eq(ld.y_size - 1), dma.stride.eq(stride_bytes), dma.sel.eq(sel_now)]
        ib = cfg.sram_idx_bits
        dptr, drow = Signal(ib), Signal(ib)   # next data entry's address; its row's first data column
        first_data = Signal(ib)
        m.d.comb += first_data.eq(ld.sram_base + ld.y_pad0 * n_cols + ld.x_pad0)
        with m.If(go):
            m.d.sync += [dptr.eq(first_data), drow.eq(first_data)]
        with m.Elif(dma.out_valid & dma.out_row_last):     # (data comes from cycle s+2 on: geo is set)
            m.d.sync += [dptr.eq(drow + r_cols), drow.eq(drow + r_cols)]
        with m.Elif(dma.out_valid):
            m.d.sync += dptr.eq(dptr + 1)

        # ---- padding: zeros, row-major, in the cycles the data leaves the write port free ----------
        # (wy, wx): the next padding entry; wx == n_cols marks a data row without padding columns,
        # passed in one cycle. Padding rows: columns 0..n_cols-1; data rows: 0..x_pad0-1, then
        # data_x_end..n_cols-1. From s+1 on it reads the latched geometry.
        w_active = Signal()
        wy, wx = Signal(dim + 1), Signal(dim + 1)
        prow = Signal(ib)                     # address of row wy's first entry

        def is_data_row(y, g):
            return (y >= g[4]) & (y < g[2])

        def first_col(y, g):
            return Mux(is_data_row(y, g) & (g[5] == 0), g[3], 0)

        pad_here = Signal()
        m.d.comb += pad_here.eq(w_active & (wx != r_cols))
        write_pad = Signal()
        m.d.comb += write_pad.eq(pad_here & ~dma.out_valid)
        nx, nx_end, hit_pad0 = Signal(dim + 1), Signal(), Signal()
        m.d.comb += [hit_pad0.eq(is_data_row(wy, geo) & (wx == pad0_m1)),
                     nx.eq(Mux(hit_pad0, r_x_end, wx + 1)),
                     nx_end.eq(Mux(hit_pad0, no_right, wx == cols_m1))]      # nx == n_cols
        with m.If(go):
            m.d.sync += [w_active.eq(any_pad | ~has_data), wy.eq(0), wx.eq(first_col(0, geo_now)),
                         prow.eq(ld.sram_base)]
        with m.Elif(w_active & (~pad_here | write_pad)):
            with m.If((wx == r_cols) | nx_end):
                m.d.sync += [wy.eq(wy + 1), wx.eq(first_col(wy + 1, geo)), prow.eq(prow + r_cols)]
                with m.If(wy + 1 == r_rows):
                    m.d.sync += w_active.eq(0)
            with m.Else():
                m.d.sync += wx.eq(nx)

        write, waddr, wdata = Signal(), Signal(ib), Signal(dma.max_bits)
        m.d.comb += [write.eq(dma.out_valid | write_pad), waddr.eq(Mux(dma.out_valid, dptr, prow + wx)),
                     wdata.eq(Mux(dma.out_valid, dma.out_data, 0)), self.busy.eq(dma.busy | w_active)]
        for i, mt in enumerate(self.mem_types):
            port = getattr(self, port_name(mt))
            m.d.comb += [port.en.eq(write & (sel == i)), port.addr.eq(waddr[:idx_bits(cfg, mt)]),
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
