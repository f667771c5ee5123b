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
UOP/ACC) -> compute; compute's command queue entries carry the instruction's index above its
128 bits (INDEX_BITS), for the faults compute reports.
Faults (accel/hw/params.py): each instruction is checked in the cycle after it enters the
buffer, from a register copy (the check's adders and multiply start at a flip-flop, for Fmax),
and its code goes into a small register FIFO beside the buffer, in step with it: an entry
reaches the buffer's head two cycles after its write at the earliest, its code one cycle after,
so the head's code is always there and the check is off the dispatch path; a faulting instruction at the head is
not dispatched: fetch raises `fault` with its code and index and dispatches nothing more. So
does reaching INSN_COUNT without a FINISH (NO_FINISH, index INSN_COUNT). halt (In) stops
dispatch and refill (another unit's fault).
"""
from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig, AluOp, MemType, Opcode, buffer_depth, formats_for
from accel.isa.config import INSN_BITS, OPCODE_BITS

from .axi import ReadClientSignature
from .dma import ReadDMA
from .layouts import decode, mem_type_of
from .params import CODE_BITS, INDEX_BITS, ErrorCode, ibuf_depth
from .queues import Queue, QueueWriteSignature
from .stage import POP_NEXT, POP_PREV, PUSH_NEXT, PUSH_PREV

INSN_BYTES = INSN_BITS // 8


def tile_dims(m: Module, cfg: AccelConfig, word):
    """(rows, cols) of a LOAD's or STORE's padded tile (a STORE's pads are zero unless BAD_FIELD):
    static_check's adders, which fetch computes a cycle ahead of the rest."""
    ld = decode(cfg, "LOAD", word)
    rows, cols = Signal(len(ld.y_size) + 2), Signal(len(ld.y_size) + 2)
    m.d.comb += [rows.eq(ld.y_pad0 + ld.y_size + ld.y_pad1), cols.eq(ld.x_pad0 + ld.x_size + ld.x_pad1)]
    return rows, cols


def static_check(m: Module, cfg: AccelConfig, word, dims=None, nonzero=None):
    """The ErrorCode (CODE_BITS) of an instruction word as fetch sees it: accel.hw.params.
    static_fault's checks, with decoding's (ILLEGAL_INSN) first and BAD_FIELD before SRAM_RANGE.
    dims: the word's tile_dims, when computed elsewhere (a pipeline register); nonzero: rows and
    cols both nonzero, likewise (see Fetch: its own register, not a read of dims')."""
    code = Signal(CODE_BITS)
    opcode = word[:OPCODE_BITS]
    fmts = formats_for(cfg)
    ld, st, g = decode(cfg, "LOAD", word), decode(cfg, "STORE", word), decode(cfg, "GEMM", word)
    a = decode(cfg, "ALU", word)
    illegal, bad, over = Signal(), Signal(), Signal()
    rows, cols = dims if dims is not None else tile_dims(m, cfg, word)
    n = Signal(2 * len(rows))
    nz = Signal()
    m.d.comb += [n.eq(rows * cols), nz.eq(((rows != 0) & (cols != 0)) if nonzero is None else nonzero)]
    m.d.comb += illegal.eq(1)
    with m.Switch(opcode):
        for op in Opcode:
            with m.Case(op):
                used = sum(w for _, w in fmts[op.name])
                m.d.comb += illegal.eq(word[used:] != 0)
                if op == Opcode.LOAD:
                    mem = ld.mem_type
                    with m.If(mem > max(MemType)):
                        m.d.comb += illegal.eq(1)
                    load_stage = (mem == MemType.INP) | (mem == MemType.WGT)
                    m.d.comb += bad.eq((load_stage & (word[POP_PREV] | word[PUSH_PREV])) | (mem == MemType.OUT))
                    with m.Switch(mem):
                        for t in (MemType.UOP, MemType.WGT, MemType.INP, MemType.ACC):
                            with m.Case(t):
                                m.d.comb += over.eq(nz & _beyond(ld.sram_base, n, buffer_depth(cfg, t)))
                elif op == Opcode.STORE:
                    with m.If(st.mem_type > max(MemType)):
                        m.d.comb += illegal.eq(1)
                    m.d.comb += [bad.eq(word[POP_NEXT] | word[PUSH_NEXT] | (st.mem_type != MemType.OUT) |
                                        (st.y_pad0 != 0) | (st.y_pad1 != 0) | (st.x_pad0 != 0) | (st.x_pad1 != 0)),
                                 over.eq(nz & _beyond(st.sram_base, n, cfg.out_depth))]
                elif op in (Opcode.GEMM, Opcode.ALU):
                    f = g if op == Opcode.GEMM else a
                    if op == Opcode.ALU:
                        with m.If(a.alu_op > max(AluOp)):
                            m.d.comb += illegal.eq(1)
                    m.d.comb += [bad.eq(f.uop_bgn > f.uop_end), over.eq(f.uop_end > cfg.uop_depth)]
    with m.If(illegal):
        m.d.comb += code.eq(ErrorCode.ILLEGAL_INSN)
    with m.Elif(bad):
        m.d.comb += code.eq(ErrorCode.BAD_FIELD)
    with m.Elif(over):
        m.d.comb += code.eq(ErrorCode.SRAM_RANGE)
    return code


def _beyond(base, n, depth: int):
    """base + n > depth without an adder after the multiply: n > depth - base (a narrow
    subtract beside it), or base alone beyond the buffer."""
    return (base > depth) | (n > Mux(base > depth, 0, depth - base))


class Fetch(wiring.Component):
    """run (In): the accelerator is busy; insn_addr / insn_count (In). dma: read client.
    ld_cmd / cp_cmd / st_cmd: command queue producers (cp_cmd's entries: instruction, index).
    dma_idle (Out): no DMA in progress. stopped (Out): FINISH has been dispatched (nothing more
    will be). dispatch (Out): an instruction is dispatched this cycle. halt (In): stop.
    fault (Out, strobe) / fault_code / fault_index (Out): a static fault or NO_FINISH.
    next_index (Out): the index of the next instruction to dispatch."""

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        super().__init__({"run": In(1), "insn_addr": In(cfg.dram_addr_width), "insn_count": In(32),
                          "dma": Out(ReadClientSignature(cfg)),
                          "ld_cmd": Out(QueueWriteSignature(INSN_BITS)),
                          "cp_cmd": Out(QueueWriteSignature(INSN_BITS + INDEX_BITS)),
                          "st_cmd": Out(QueueWriteSignature(INSN_BITS)), "dma_idle": Out(1),
                          "stopped": Out(1), "dispatch": Out(1), "halt": In(1),
                          "fault": Out(1), "fault_code": Out(CODE_BITS), "fault_index": Out(INDEX_BITS),
                          "next_index": Out(INDEX_BITS)})

    def elaborate(self, platform):
        m = Module()
        cfg = self.cfg
        depth = ibuf_depth(cfg)
        m.submodules.dma = dma = ReadDMA(cfg, (INSN_BYTES,), count_width=depth.bit_length())
        m.submodules.ibuf = ibuf = Queue(INSN_BITS, depth)
        wiring.connect(m, wiring.flipped(self.dma), dma.bus)
        m.d.comb += [ibuf.w.en.eq(dma.out_valid), ibuf.w.data.eq(dma.out_data[:INSN_BITS]),
                     self.dma_idle.eq(~dma.busy)]
        # the fault codes of the buffered instructions, checked a cycle after the write (see above)
        # (the tile's rows and columns, adders, from the DMA's entry; the multiply and compares from
        # those registers in the next cycle)
        chk_valid, chk_word = Signal(), Signal(INSN_BITS)
        dims_now = tile_dims(m, cfg, dma.out_data[:INSN_BITS])
        chk_dims = tuple(Signal.like(d, name=f"chk_{n}") for d, n in zip(dims_now, ("rows", "cols")))
        # 'rows and cols nonzero' gets its own register: where anything else reads the multiply's
        # operand registers, yosys' xilinx_dsp absorbs them (with the adders, as the DSP's pre-adder
        # and AD register), opt then folds the flip-flops left behind to 0 and the SRAM_RANGE check
        # vanishes from the netlist, DSPs included (yosys 0.70 synth_xilinx)
        chk_nz = Signal()
        m.d.sync += chk_valid.eq(dma.out_valid)
        with m.If(dma.out_valid):
            m.d.sync += [chk_word.eq(dma.out_data[:INSN_BITS]), *(r.eq(d) for r, d in zip(chk_dims, dims_now)),
                         chk_nz.eq((dims_now[0] != 0) & (dims_now[1] != 0))]
        codes = Array(Signal(CODE_BITS, name=f"code{i}") for i in range(depth))
        c_wr, c_rd = Signal(range(depth)), Signal(range(depth))
        with m.If(chk_valid):
            m.d.sync += [codes[c_wr].eq(static_check(m, cfg, chk_word, chk_dims, chk_nz)),
                         c_wr.eq(Mux(c_wr == depth - 1, 0, c_wr + 1))]
        with m.If(ibuf.r.en & ibuf.r.rdy):
            m.d.sync += c_rd.eq(Mux(c_rd == depth - 1, 0, c_rd + 1))

        addr = Signal(cfg.dram_addr_width)
        remaining = Signal(32)
        free = Signal(range(depth + 1))
        n = Signal(range(depth + 1))
        threshold = Signal(range(depth + 1))
        # rem_sat = min(remaining, depth), kept beside the 32-bit count: the refill decision then
        # compares narrow values only (for Fmax)
        rem_sat = Signal(range(depth + 1))

        def sat(v):
            return Mux(v > depth, depth, v)
        m.d.comb += [free.eq(depth - ibuf.level),
                     n.eq(Mux(rem_sat < free, rem_sat, free)),
                     threshold.eq(Mux(rem_sat < depth // 2, rem_sat, depth // 2))]
        stopped = Signal()
        count, index = Signal(32), Signal(INDEX_BITS)     # INSN_COUNT; index of the next dispatch
        with m.FSM():
            with m.State("INIT"):
                with m.If(self.run):
                    m.d.sync += [addr.eq(self.insn_addr), remaining.eq(self.insn_count), count.eq(self.insn_count),
                                 rem_sat.eq(sat(self.insn_count))]
                    m.next = "FETCH"
            with m.State("FETCH"):
                with m.If((rem_sat == 0) | stopped | self.halt):
                    m.next = "DONE"
                with m.Elif(~dma.busy & (free >= threshold)):
                    m.d.comb += [dma.start.eq(1), dma.addr.eq(addr), dma.count.eq(n)]
                    m.d.sync += [addr.eq(addr + n * INSN_BYTES), remaining.eq(remaining - n),
                                 rem_sat.eq(sat(remaining - n))]
            with m.State("DONE"):
                pass

        # ---- dispatch ----------------------------------------------------------------------------
        word, code = ibuf.r.data, Signal(CODE_BITS)
        m.d.comb += code.eq(codes[c_rd])
        opcode = word[:OPCODE_BITS]
        mem = mem_type_of(cfg, word)
        to_load = (opcode == Opcode.LOAD) & ((mem == MemType.INP) | (mem == MemType.WGT))
        to_store = opcode == Opcode.STORE
        to_compute = ~to_load & ~to_store
        dest_rdy = Mux(to_load, self.ld_cmd.rdy, Mux(to_store, self.st_cmd.rdy, self.cp_cmd.rdy))
        live = ~stopped & ~self.halt
        go = ibuf.r.rdy & dest_rdy & live & (code == 0)
        for q, sel in ((self.ld_cmd, to_load), (self.cp_cmd, to_compute), (self.st_cmd, to_store)):
            m.d.comb += [q.data.eq(word), q.en.eq(go & sel)]
        m.d.comb += self.cp_cmd.data.eq(Cat(word, index))
        with m.If(go):
            m.d.sync += index.eq(index + 1)
        with m.If(go & (opcode == Opcode.FINISH)):
            m.d.sync += stopped.eq(1)
        # a faulting head, or every instruction dispatched and none a FINISH (count latched from
        # the FETCH state on: INIT holds index = count = 0)
        started = Signal()
        with m.If(self.run):
            m.d.sync += started.eq(1)
        with m.If(live & started & ((ibuf.r.rdy & (code != 0)) | (index == count))):
            m.d.comb += [self.fault.eq(1), self.fault_code.eq(Mux(index == count, ErrorCode.NO_FINISH, code)),
                         self.fault_index.eq(index)]
            m.d.sync += stopped.eq(1)
        m.d.comb += [ibuf.r.en.eq(go), self.stopped.eq(stopped), self.dispatch.eq(go), self.next_index.eq(index)]
        return m
