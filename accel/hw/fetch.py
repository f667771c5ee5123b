"""Fetch: reads the instruction stream from DRAM and dispatches each instruction to the load,
compute or store command queue.

Instructions (16 bytes each) go through an instruction buffer (a Queue of cmd_queue_depth) so
that a full command queue never holds the read bus. Timing: in the cycle after the core's reset
(start pulse) fetch latches insn_addr/insn_count; then, whenever its ReadDMA is idle and
F = depth - buffer level >= min(remaining, depth / 2) (and remaining > 0), it starts a DMA of
min(remaining, F) instructions. Dispatch: one instruction per cycle from the buffer head to its
command queue when that queue has space. Routing: LOAD of INP/WGT -> load; STORE -> store;
everything else (GEMM, ALU, FINISH, LOAD of UOP/ACC, unknown) -> compute.
"""
from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig, MemType, Opcode
from accel.isa.config import INSN_BITS, OPCODE_BITS

from .axi import ReadClientSignature
from .dma import ReadDMA
from .layouts import mem_type_of
from .queues import Queue, QueueWriteSignature

INSN_BYTES = INSN_BITS // 8


class Fetch(wiring.Component):
    """run (In): the accelerator is busy; insn_addr / insn_count (In). dma: read client.
    ld_cmd / cp_cmd / st_cmd: command queue producers. dma_idle (Out): no DMA in progress."""

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        super().__init__({"run": In(1), "insn_addr": In(cfg.dram_addr_width), "insn_count": In(32),
                          "dma": Out(ReadClientSignature(cfg)),
                          "ld_cmd": Out(QueueWriteSignature(INSN_BITS)), "cp_cmd": Out(QueueWriteSignature(INSN_BITS)),
                          "st_cmd": Out(QueueWriteSignature(INSN_BITS)), "dma_idle": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        depth = cfg.cmd_queue_depth
        m.submodules.dma = dma = ReadDMA(cfg, (INSN_BYTES,), count_width=depth.bit_length())
        m.submodules.ibuf = ibuf = Queue(INSN_BITS, depth)
        wiring.connect(m, wiring.flipped(self.dma), dma.bus)
        m.d.comb += [ibuf.w.en.eq(dma.out_valid), ibuf.w.data.eq(dma.out_data), self.dma_idle.eq(~dma.busy)]

        addr = Signal(cfg.dram_addr_width)
        remaining = Signal(32)
        free = Signal(range(depth + 1))
        n = Signal(range(depth + 1))
        threshold = Signal(range(depth + 1))
        m.d.comb += [free.eq(depth - ibuf.level),
                     n.eq(Mux(remaining < free, remaining, free)),
                     threshold.eq(Mux(remaining < depth // 2, remaining, depth // 2))]
        with m.FSM():
            with m.State("INIT"):
                with m.If(self.run):
                    m.d.sync += [addr.eq(self.insn_addr), remaining.eq(self.insn_count)]
                    m.next = "FETCH"
            with m.State("FETCH"):
                with m.If(remaining == 0):
                    m.next = "DONE"
                with m.Elif(~dma.busy & (free >= threshold)):
                    m.d.comb += [dma.start.eq(1), dma.addr.eq(addr), dma.count.eq(n)]
                    m.d.sync += [addr.eq(addr + n * INSN_BYTES), remaining.eq(remaining - n)]
            with m.State("DONE"):
                pass

        # ---- dispatch ----------------------------------------------------------------------------
        word = ibuf.r.data
        opcode = word[:OPCODE_BITS]
        mem = mem_type_of(cfg, word)
        to_load = (opcode == Opcode.LOAD) & ((mem == MemType.INP) | (mem == MemType.WGT))
        to_store = opcode == Opcode.STORE
        to_compute = ~to_load & ~to_store
        dest_rdy = Mux(to_load, self.ld_cmd.rdy, Mux(to_store, self.st_cmd.rdy, self.cp_cmd.rdy))
        go = ibuf.r.rdy & dest_rdy
        for q, sel in ((self.ld_cmd, to_load), (self.cp_cmd, to_compute), (self.st_cmd, to_store)):
            m.d.comb += [q.data.eq(word), q.en.eq(go & sel)]
        m.d.comb += ibuf.r.en.eq(go)
        return m
