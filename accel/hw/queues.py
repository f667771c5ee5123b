"""Queues between the stages: command queues (128-bit instructions) and dependency-token queues.

`Queue` wraps amaranth.lib.fifo.SyncFIFOBuffered (block-RAM friendly) behind wiring interfaces.
Timing: an entry written in cycle t (w.en & w.rdy) is visible at the read side (r.rdy) in cycle
t+2; a read (r.en & r.rdy) in cycle t frees its slot for the writer from cycle t+1 (w.rdy); the
queue holds exactly `depth` entries. Token queues are 1 bit wide (the bit is always 0).
"""
from __future__ import annotations

from amaranth.hdl import Module
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out


class QueueWriteSignature(wiring.Signature):
    """Producer side of a queue: en (Out), data (Out, `width` bits), rdy (In: space available)."""

    def __init__(self, width: int):
        self.width = width
        super().__init__({"en": Out(1), "data": Out(width), "rdy": In(1)})


class QueueReadSignature(wiring.Signature):
    """Consumer side of a queue: rdy (In: an entry is available), data (In), en (Out: pop)."""

    def __init__(self, width: int):
        self.width = width
        super().__init__({"rdy": In(1), "data": In(width), "en": Out(1)})


class Queue(wiring.Component):
    """A first-in first-out queue of `depth` entries of `width` bits.

    w: producer interface (flipped QueueWriteSignature); r: consumer interface (flipped
    QueueReadSignature); level: entries held (0..depth).
    """

    def __init__(self, width: int, depth: int):
        if width < 1 or depth < 2:
            raise ValueError(f"Queue needs width >= 1 and depth >= 2, got width={width}, depth={depth}")
        self.width, self.depth = width, depth
        super().__init__({"w": In(QueueWriteSignature(width)), "r": In(QueueReadSignature(width)),
                          "level": Out(range(depth + 1))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = q = fifo.SyncFIFOBuffered(width=self.width, depth=self.depth)
        m.d.comb += [q.w_en.eq(self.w.en), q.w_data.eq(self.w.data), self.w.rdy.eq(q.w_rdy),
                     self.r.rdy.eq(q.r_rdy), self.r.data.eq(q.r_data), q.r_en.eq(self.r.en),
                     self.level.eq(q.level)]
        return m
