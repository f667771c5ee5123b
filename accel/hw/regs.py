"""Control/status registers on AXI4-Lite, the run state (start/done/interrupt) and the counters.

Register map: REGISTERS below (32-bit words, byte offsets); 64-bit counters are LO/HI pairs,
and reading a LO word latches the HI word so that LO-then-HI reads are consistent.
AXI4-Lite timing: a write is accepted when AW and W are both valid (1 cycle), its B response
is valid the next cycle; a read's R is valid the cycle after the AR handshake.
Run state: writing CTRL.start (bit 0) while not busy sets busy and clears done, bus_error and
every counter in the cycle of the write; `start` pulses high in the next cycle (the core is
reset by it) and every counter counts from that cycle while busy; `finish` (In) ends the run:
busy falls and done rises in the cycle after the one where finish is seen (that cycle counts).
irq = done & CTRL.irq_enable.
Errors (params.ErrorCode): a fault (In) latches its code and instruction index into ERROR /
ERROR_INSN unless one of a lower index is latched; STATUS.error is set while a code is latched.
(Which is lower needs no comparator: the only faults that can follow a latched one are compute's
INDEX_RANGE after one of fetch's, and compute's are in dispatched instructions, below fetch's
index; the top level gives compute's fault priority in a cycle with both. So an INDEX_RANGE
replaces a latched code other than INDEX_RANGE; this keeps the late fault strobe off a carry
chain, for Fmax.)
The run then ends (busy falls, done and error rise) once the core is quiet (`quiet` In high for
QUIET_CYCLES cycles in a row: no stage executing or taking an instruction, no fetch DMA, no
read burst), or at once for the watchdog: with WATCHDOG = N > 0, N cycles in a row while busy
without `progress` (In) raise a WATCHDOG fault (index: `wd_index`, the next instruction fetch
would dispatch). halt (Out): an INDEX_RANGE or WATCHDOG fault is latched (every stage stops).
SOFT_RESET: writing 1 clears busy, done and the error and requests `reset_core` (as `start` does),
returning every queue and state machine of the core to idle; the counters and buffers are kept.
Both requests wait (`quiesce`) until the AXI master is idle (`bus_idle`), so that no transaction
on the bus is cut; after a normal run the bus is idle and start keeps its timing.
"""
from __future__ import annotations

from dataclasses import dataclass

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig

from .axi import AXI4LiteSignature
from .params import CODE_BITS, INDEX_BITS, ErrorCode

REG_ADDR_WIDTH = 8
COUNTER_BITS = 64
QUIET_CYCLES = 4     # > the 2-cycle queue latency: a token pushed is popped within the window
STATUS_BUSY, STATUS_DONE, STATUS_BUS_ERROR, STATUS_ERROR = 1, 2, 4, 8

COUNTERS: dict[str, str] = {
    "cycles": "cycles while busy (from the start pulse to done)",
    "load_busy": "cycles the load stage holds an instruction and is not token-stalled",
    "load_stall": "cycles the load stage waits for a token to pop or for space to push one",
    "compute_busy": "cycles the compute stage holds an instruction and is not token-stalled",
    "compute_stall": "cycles the compute stage waits on dependency tokens",
    "store_busy": "cycles the store stage holds an instruction and is not token-stalled",
    "store_stall": "cycles the store stage waits on dependency tokens",
    "gemm_uops": "GEMM micro-ops issued",
    "alu_uops": "ALU micro-ops issued",
    "bytes_read": "bytes read from DRAM (R beats x bus bytes, instruction fetch included)",
    "bytes_written": "bytes written to DRAM (W beats x bus bytes)",
}
COUNTER_BASE = 0x40


@dataclass(frozen=True)
class Register:
    offset: int
    name: str
    access: str           # "rw", "ro", "w1c" ...
    description: str


def register_map(cfg: AccelConfig) -> list[Register]:
    """Every register with its offset; the single source for the RTL, the JSON and the docs."""
    regs = [
        Register(0x00, "CTRL", "rw", "bit 0 start: write 1 to start a run (ignored while busy; reads 0); "
                                     "bit 1 irq_enable"),
        Register(0x04, "STATUS", "ro/w1c", "bit 0 busy (ro); bit 1 done (write 1 to clear); "
                                           "bit 2 bus_error: an AXI response other than OKAY, or with an unexpected ID "
                                           "(write 1 to clear); bit 3 error: the run ended on a fault, see ERROR "
                                           "(ro; cleared by start and SOFT_RESET)"),
        Register(0x08, "INSN_ADDR_LO", "rw", "DRAM byte address of the first instruction, bits 31:0 "
                                             "(a multiple of 16)"),
        Register(0x0C, "INSN_ADDR_HI", "rw", f"bits {cfg.dram_addr_width - 1}:32 of the instruction address"
                 if cfg.dram_addr_width > 32 else "instruction address bits 63:32 (unused: reads 0)"),
        Register(0x10, "INSN_COUNT", "rw", "number of instructions to fetch"),
        Register(0x14, "CONFIG_ID", "ro", f"first 32 bits of the AccelConfig digest "
                                          f"(0x{cfg.digest()[:8]}), to check the driver's config"),
        Register(0x18, "ERROR", "ro", "bits 2:0 the fault's code: " +
                 ", ".join(f"{e.value} {e.name}" for e in ErrorCode) + " (accel.hw.params.ErrorCode)"),
        Register(0x1C, "ERROR_INSN", "ro", "index of the faulting instruction (for NO_FINISH: INSN_COUNT; "
                                           "for WATCHDOG: the next instruction fetch would dispatch)"),
        Register(0x20, "WATCHDOG", "rw", "cycles in a row without progress (an instruction dispatched, taken or "
                                         "retired, a micro-op, a bus beat) that end a run with a WATCHDOG fault; "
                                         "0 (after reset) disables it"),
        Register(0x24, "SOFT_RESET", "wo", "bit 0: write 1 to return every queue and state machine of the core to "
                                           "idle and clear busy, done and the error (reads 0)"),
    ]
    for i, (name, desc) in enumerate(COUNTERS.items()):
        off = COUNTER_BASE + 8 * i
        regs.append(Register(off, f"{name.upper()}_LO", "ro", f"{desc}, bits 31:0 (reading it latches _HI)"))
        regs.append(Register(off + 4, f"{name.upper()}_HI", "ro", f"{desc}, bits 63:32"))
    return regs


class ControlRegs(wiring.Component):
    """s_axil: AXI4-Lite slave. start (Out, pulse), busy (Out), insn_addr / insn_count (Out),
    irq (Out), finish (In), bus_error (In, strobe), ev_<counter> (In, strobes: count +1 per cycle
    high, bytes_* count + bus bytes). reset_core (Out, pulse: start or SOFT_RESET, once bus_idle).
    quiesce (Out): a reset is waiting for the bus; bus_idle (In): no AXI burst offered or open. fault /
    fault_code / fault_index (In), quiet, progress, wd_index (In), halt (Out): see Errors above."""

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        members = {"s_axil": In(AXI4LiteSignature(addr_width=REG_ADDR_WIDTH)),
                   "start": Out(1), "busy": Out(1), "insn_addr": Out(cfg.dram_addr_width), "insn_count": Out(32),
                   "irq": Out(1), "finish": In(1), "bus_error": In(1),
                   "reset_core": Out(1), "quiesce": Out(1), "bus_idle": In(1), "fault": In(1), "fault_code": In(CODE_BITS), "fault_index": In(INDEX_BITS),
                   "quiet": In(1), "progress": In(1), "wd_index": In(INDEX_BITS), "halt": Out(1)}
        for name in COUNTERS:
            if name != "cycles":
                members[f"ev_{name}"] = In(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg, bus = self.cfg, self.s_axil
        aw = cfg.dram_addr_width

        busy, done, bus_err, irq_en = Signal(), Signal(), Signal(), Signal()
        addr_lo, addr_hi, count = Signal(32), Signal(32), Signal(32)
        counters = {name: Signal(COUNTER_BITS, name=f"cnt_{name}") for name in COUNTERS}
        hi_shadow = Signal(32)
        # start and SOFT_RESET reset the core; a request waits (quiesce) until no AXI burst is
        # offered or open, since a reset mid-transaction would withdraw VALID or cut a burst.
        # The bus is idle whenever a run has ended normally, so start keeps its timing.
        start_req, soft_req = Signal(), Signal()
        start, soft = Signal(), Signal()
        m.d.comb += [start.eq(start_req & self.bus_idle), soft.eq(soft_req & self.bus_idle & ~start_req)]
        with m.If(start):
            m.d.sync += [start_req.eq(0), soft_req.eq(0)]
        with m.If(soft):
            m.d.sync += soft_req.eq(0)
        err_code, err_index = Signal(CODE_BITS), Signal(INDEX_BITS)
        wd_limit, wd_count = Signal(32), Signal(32)
        quiet_run = Signal(range(QUIET_CYCLES + 1))

        # ---- writes ---------------------------------------------------------------------------
        bvalid = Signal()
        w_fire = Signal()
        m.d.comb += [w_fire.eq(bus.awvalid & bus.wvalid & ~bvalid), bus.awready.eq(w_fire), bus.wready.eq(w_fire),
                     bus.bvalid.eq(bvalid), bus.bresp.eq(0)]
        with m.If(w_fire):
            m.d.sync += bvalid.eq(1)
        with m.Elif(bus.bready):
            m.d.sync += bvalid.eq(0)

        word = bus.awaddr[2:REG_ADDR_WIDTH]
        with m.If(w_fire):
            with m.Switch(word):
                for off, reg in ((0x08, addr_lo), (0x0C, addr_hi), (0x10, count), (0x20, wd_limit)):
                    with m.Case(off >> 2):
                        for i in range(4):
                            with m.If(bus.wstrb[i]):
                                m.d.sync += reg[8 * i:8 * i + 8].eq(bus.wdata[8 * i:8 * i + 8])
                with m.Case(0x00 >> 2):
                    with m.If(bus.wstrb[0]):
                        m.d.sync += irq_en.eq(bus.wdata[1])
                        with m.If(bus.wdata[0] & ~busy):
                            m.d.sync += [start_req.eq(1), busy.eq(1), done.eq(0), bus_err.eq(0), err_code.eq(0),
                                         err_index.eq(0)]
                            m.d.sync += [c.eq(0) for c in counters.values()]
                with m.Case(0x04 >> 2):
                    with m.If(bus.wstrb[0]):
                        with m.If(bus.wdata[1]):
                            m.d.sync += done.eq(0)
                        with m.If(bus.wdata[2]):
                            m.d.sync += bus_err.eq(0)
                with m.Case(0x24 >> 2):
                    with m.If(bus.wstrb[0] & bus.wdata[0]):
                        m.d.sync += [soft_req.eq(1), start_req.eq(0), busy.eq(0), done.eq(0), err_code.eq(0),
                                     err_index.eq(0)]

        # ---- run state, faults, watchdog and counters ------------------------------------------------
        with m.If(~self.progress & busy & ~start_req):
            m.d.sync += wd_count.eq(wd_count + 1)
        with m.Else():
            m.d.sync += wd_count.eq(0)
        with m.If(self.quiet & busy & ~start_req):
            m.d.sync += quiet_run.eq(Mux(quiet_run == QUIET_CYCLES, QUIET_CYCLES, quiet_run + 1))
        with m.Else():
            m.d.sync += quiet_run.eq(0)
        watchdog = (wd_limit != 0) & (wd_count >= wd_limit)
        with m.If(busy & ~start_req):
            with m.If(self.fault & ((err_code == 0) | ((self.fault_code == ErrorCode.INDEX_RANGE) &
                                                       (err_code != ErrorCode.INDEX_RANGE)))):
                m.d.sync += [err_code.eq(self.fault_code), err_index.eq(self.fault_index)]
            with m.If(self.finish):
                m.d.sync += [busy.eq(0), done.eq(1)]
            with m.Elif(watchdog):
                m.d.sync += [busy.eq(0), done.eq(1)]
                with m.If(err_code == 0):
                    m.d.sync += [err_code.eq(ErrorCode.WATCHDOG), err_index.eq(self.wd_index)]
            with m.Elif((err_code != 0) & (quiet_run == QUIET_CYCLES)):
                m.d.sync += [busy.eq(0), done.eq(1)]
        with m.If(self.bus_error):
            m.d.sync += bus_err.eq(1)
        with m.If(busy):
            m.d.sync += counters["cycles"].eq(counters["cycles"] + 1)
            for name, c in counters.items():
                if name.startswith("bytes_"):
                    with m.If(getattr(self, f"ev_{name}")):
                        m.d.sync += c.eq(c + cfg.bus_bytes)
                elif name != "cycles":
                    with m.If(getattr(self, f"ev_{name}")):
                        m.d.sync += c.eq(c + 1)
        m.d.comb += [self.start.eq(start), self.reset_core.eq(start | soft), self.busy.eq(busy),
                     self.quiesce.eq(start_req | soft_req),
                     self.halt.eq((err_code == ErrorCode.INDEX_RANGE) | (err_code == ErrorCode.WATCHDOG)),
                     self.insn_count.eq(count),
                     self.insn_addr.eq(Cat(addr_lo, addr_hi)[:aw]),
                     self.irq.eq(done & irq_en)]

        # ---- reads -------------------------------------------------------------------------------------
        rvalid, rdata = Signal(), Signal(32)
        ar_fire = bus.arvalid & ~rvalid
        m.d.comb += [bus.arready.eq(~rvalid), bus.rvalid.eq(rvalid), bus.rdata.eq(rdata), bus.rresp.eq(0)]
        with m.If(ar_fire):
            m.d.sync += rvalid.eq(1)
        with m.Elif(bus.rready):
            m.d.sync += rvalid.eq(0)
        rword = bus.araddr[2:REG_ADDR_WIDTH]
        with m.If(ar_fire):
            m.d.sync += rdata.eq(0)
            with m.Switch(rword):
                with m.Case(0x00 >> 2):
                    m.d.sync += rdata.eq(irq_en << 1)
                with m.Case(0x04 >> 2):
                    m.d.sync += rdata.eq(busy | (done << 1) | (bus_err << 2) | ((err_code != 0) << 3))
                with m.Case(0x08 >> 2):
                    m.d.sync += rdata.eq(addr_lo[:min(aw, 32)])
                with m.Case(0x0C >> 2):
                    if aw > 32:
                        m.d.sync += rdata.eq(addr_hi[:aw - 32])
                with m.Case(0x10 >> 2):
                    m.d.sync += rdata.eq(count)
                with m.Case(0x14 >> 2):
                    m.d.sync += rdata.eq(int(cfg.digest()[:8], 16))
                with m.Case(0x18 >> 2):
                    m.d.sync += rdata.eq(err_code)
                with m.Case(0x1C >> 2):
                    m.d.sync += rdata.eq(err_index)
                with m.Case(0x20 >> 2):
                    m.d.sync += rdata.eq(wd_limit)
                for i, c in enumerate(counters.values()):
                    off = COUNTER_BASE + 8 * i
                    with m.Case(off >> 2):
                        m.d.sync += [rdata.eq(c[:32]), hi_shadow.eq(c[32:])]
                    with m.Case((off + 4) >> 2):
                        m.d.sync += rdata.eq(hi_shadow)
        return m
