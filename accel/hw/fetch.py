"""Fetch: reads the instruction stream from DRAM and dispatches each instruction to the load,
compute or store command queue.

Instructions (16 bytes each) go through an instruction buffer (a Queue of depth
ibuf_depth(cfg) = max(cmd_queue_depth, 3)) so that a full command queue never holds the read bus.
The DMA's entries are written without back-pressure, so a DMA asks for at most the free slots;
a Queue of depth 2 cannot take writes in consecutive cycles from empty (its head moves to the
output register in the cycle after a write, with the inner slot still counted), which a 16-byte
entry per cycle (a bus of 128 bits or more) would need: hence depth 3 at least.
Timing: in the cycle after the core's reset (start pulse) fetch latches insn_addr/insn_count;
then, whenever its ReadDMA is idle and F = depth - buffer level >= min(remaining, depth / 2)
(and remaining > 0, FINISH not dispatched), it starts a DMA of min(remaining, F) instructions.
Dispatch: one instruction per cycle from the buffer head to its command queue when that queue
has space, up to and including the first FINISH: instructions after it are never dispatched
(those already read are dropped), and no DMA starts from the cycle after it is dispatched.
Routing: LOAD of INP/WGT -> load; STORE -> store; everything else (GEMM, ALU, FINISH, LOAD of
UOP/ACC, unknown) -> compute.
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
from .params import ibuf_depth
from .queues import Queue, QueueWriteSignature

INSN_BYTES = INSN_BITS // 8


class Fetch(wiring.Component):
    """run (In): the accelerator is busy; insn_addr / insn_count (In). dma: read client.
    ld_cmd / cp_cmd / st_cmd: command queue producers. dma_idle (Out): no DMA in progress.
    stopped (Out): FINISH has been dispatched (nothing more will be)."""

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        super().__init__({"run": In(1), "insn_addr": In(cfg.dram_addr_width), "insn_count": In(32),
                          "dma": Out(ReadClientSignature(cfg)),
                          "ld_cmd": Out(QueueWriteSignature(INSN_BITS)), "cp_cmd": Out(QueueWriteSignature(INSN_BITS)),
                          "st_cmd": Out(QueueWriteSignature(INSN_BITS)), "dma_idle": Out(1),
                          "stopped": Out(1)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        depth = ibuf_depth(cfg)
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
        stopped = Signal()
        with m.FSM():
            with m.State("INIT"):
                with m.If(self.run):
                    m.d.sync += [addr.eq(self.insn_addr), remaining.eq(self.insn_count)]
                    m.next = "FETCH"
            with m.State("FETCH"):
                with m.If((remaining == 0) | stopped):
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
        go = ibuf.r.rdy & dest_rdy & ~stopped
        for q, sel in ((self.ld_cmd, to_load), (self.cp_cmd, to_compute), (self.st_cmd, to_store)):
            m.d.comb += [q.data.eq(word), q.en.eq(go & sel)]
        with m.If(go & (opcode == Opcode.FINISH)):
            m.d.sync += stopped.eq(1)
        m.d.comb += [ibuf.r.en.eq(go), self.stopped.eq(stopped)]
        return m
