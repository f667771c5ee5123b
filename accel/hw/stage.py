"""StageControl: the instruction sequencer shared by the load, compute and store stages.

It pops an instruction from the stage's command queue together with the dependency tokens
the instruction names, runs the stage's unit (start pulse, then wait for ~unit_busy), and
pushes the tokens the instruction names. States and cycles:
  WAIT  1 cycle per instruction at least; the instruction and its tokens are popped in the same
        cycle, once the command queue and every named token queue are non-empty
        (a cycle with an instruction present but a token missing is a token stall).
  EXEC  1 cycle with `start` high, then as long as the unit reports busy (at least 1 more cycle).
  PUSH  1 cycle if every named token queue has space, else a token stall until it has.
Flags naming a neighbour the stage does not have (load: prev, store: next) are ignored.
Counter strobes: busy_cycle = an instruction is held and not stalled; stall_cycle = token stall.
"""
from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig, formats_for
from accel.isa.config import INSN_BITS

from .queues import QueueReadSignature, QueueWriteSignature


def _head_positions() -> dict[str, int]:
    """Bit positions of the opcode and flags: the common head of every format (config-independent)."""
    pos, out = 0, {}
    for name, width in formats_for(AccelConfig())["FINISH"]:
        out[name] = pos
        pos += width
    return out


_HEAD = _head_positions()
POP_PREV, POP_NEXT, PUSH_PREV, PUSH_NEXT = (_HEAD[f] for f in ("pop_prev", "pop_next", "push_prev", "push_next"))


class StageControl(wiring.Component):
    """cmd: command queue (consumer). prev_in / next_in: token queues popped (pop_prev / pop_next);
    prev_out / next_out: token queues pushed (push_prev / push_next); present only where the
    stage has that neighbour. insn (Out, 128): the instruction being executed. start (Out): first
    EXEC cycle. unit_busy (In). halt (In): stop taking instructions. idle (Out): in WAIT.
    busy_cycle / stall_cycle (Out): counter strobes. retire (Out): the PUSH cycle that completes.
    event (Out): an instruction popped or retired this cycle (progress, for the watchdog).
    executing (Out): in EXEC (the unit may be working).
    """

    def __init__(self, *, has_prev: bool, has_next: bool, width: int = INSN_BITS):
        """width: bits of a command queue entry (the instruction, and what fetch adds above it)."""
        self.has_prev, self.has_next = has_prev, has_next
        members = {"cmd": Out(QueueReadSignature(width)), "insn": Out(width), "start": Out(1),
                   "unit_busy": In(1), "halt": In(1), "idle": Out(1), "retire": Out(1),
                   "busy_cycle": Out(1), "stall_cycle": Out(1), "event": Out(1), "executing": Out(1)}
        if has_prev:
            members.update({"prev_in": Out(QueueReadSignature(1)), "prev_out": Out(QueueWriteSignature(1))})
        if has_next:
            members.update({"next_in": Out(QueueReadSignature(1)), "next_out": Out(QueueWriteSignature(1))})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cmd, insn = self.cmd, self.insn
        first = Signal()   # the EXEC cycle that carries `start`

        tokens_ok = Signal()
        space_ok = Signal()
        pop_ok, push_ok = [], []
        if self.has_prev:
            pop_ok.append(~cmd.data[POP_PREV] | self.prev_in.rdy)
            push_ok.append(~insn[PUSH_PREV] | self.prev_out.rdy)
        if self.has_next:
            pop_ok.append(~cmd.data[POP_NEXT] | self.next_in.rdy)
            push_ok.append(~insn[PUSH_NEXT] | self.next_out.rdy)
        m.d.comb += [tokens_ok.eq(1), space_ok.eq(1)]
        for c in pop_ok:
            with m.If(~c):
                m.d.comb += tokens_ok.eq(0)
        for c in push_ok:
            with m.If(~c):
                m.d.comb += space_ok.eq(0)

        with m.FSM():
            with m.State("WAIT"):
                m.d.comb += self.idle.eq(1)
                with m.If(cmd.rdy & ~self.halt):
                    with m.If(tokens_ok):
                        m.d.comb += [cmd.en.eq(1), self.busy_cycle.eq(1)]
                        if self.has_prev:
                            m.d.comb += self.prev_in.en.eq(cmd.data[POP_PREV])
                        if self.has_next:
                            m.d.comb += self.next_in.en.eq(cmd.data[POP_NEXT])
                        m.d.sync += [insn.eq(cmd.data), first.eq(1)]
                        m.next = "EXEC"
                    with m.Else():
                        m.d.comb += self.stall_cycle.eq(1)
            with m.State("EXEC"):
                m.d.comb += [self.busy_cycle.eq(1), self.start.eq(first), self.executing.eq(1)]
                m.d.sync += first.eq(0)
                with m.If(~first & ~self.unit_busy):
                    m.next = "PUSH"
            with m.State("PUSH"):
                with m.If(space_ok):
                    m.d.comb += [self.busy_cycle.eq(1), self.retire.eq(1)]
                    if self.has_prev:
                        m.d.comb += self.prev_out.en.eq(insn[PUSH_PREV])
                    if self.has_next:
                        m.d.comb += self.next_out.en.eq(insn[PUSH_NEXT])
                    m.next = "WAIT"
                with m.Else():
                    m.d.comb += self.stall_cycle.eq(1)
        m.d.comb += self.event.eq(cmd.en | self.retire)
        return m
