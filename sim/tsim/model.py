"""Tsim: the cycle-accurate timing model of the accelerator (accel/hw), event by event.

Components and the RTL they stand for (each module's docstring gives the timing used here):
  fetch (fetch.py): refill rule, instruction DMA on the read bus, the instruction buffer, dispatch
    one instruction per cycle into the load/compute/store command queues;
  stages (stage.py): WAIT (pop instruction + tokens) -> EXEC (unit) -> PUSH (tokens), with the
    token queues l2c, c2l, c2s, s2c (queues.py timing, sim/tsim/queues.py);
  units: TileLoader (load.py, sim/tsim/load.py) on the read bus, GEMM n+5 and ALU n+4 cycles from the
    loop bounds, ALU MUL and SCALE 2n+3 (compute.py), the store unit from sim/tsim/store.py;
  the read bus and DRAM (axi.py, dma.py, sim/dram.py) in sim/tsim/bus.py.
Cycle 0 is the start pulse (the first cycle the `cycles` counter counts); the run ends in the
cycle after `finish` is first seen: FINISH retired, load and store idle with empty command
queues, no instruction DMA in flight.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from accel.hw.params import MUL_OPS, ibuf_depth
from accel.isa import AccelConfig, Alu, Finish, Gemm, Insn, Load, MemType, Stage, Store, elem_bytes
from accel.isa.deps import POPS, PUSHES, QUEUE_NAMES
from accel.isa.isa import INSN_BYTES

from ..dram import DramModel
from ..errors import CycleLimitError, DeadlockError
from ..fsim import first_fault
from .bus import ReadBus, dma_bursts
from .events import EventLoop
from .load import TileLoad
from .queues import TimedFifo
from .store import store_key, store_timing

FETCH, LOAD_CLIENT, COMPUTE_CLIENT = 0, 1, 2
STAGE_NAMES = ("load", "compute", "store")
# (stage, flag) -> token queue name (accel.isa.deps); flags naming a missing neighbour are ignored, as in the RTL
_POP, _PUSH = POPS, PUSHES


@dataclass
class TsimStats:
    """Counters of one run, named as the RTL's (accel/hw/regs.py COUNTERS), plus instruction spans."""
    cycles: int = 0
    busy: list = field(default_factory=lambda: [0, 0, 0])
    stall: list = field(default_factory=lambda: [0, 0, 0])
    gemm_uops: int = 0
    alu_uops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    events: int = 0
    spans: list | None = None       # (stage, insn index, start, end) when traced
    bursts: list | None = None      # (client, grant, rlast) when traced

    def counters(self) -> dict[str, int]:
        out = {"cycles": self.cycles}
        for i, s in enumerate(STAGE_NAMES):
            out[f"{s}_busy"] = self.busy[i]
            out[f"{s}_stall"] = self.stall[i]
        out.update(gemm_uops=self.gemm_uops, alu_uops=self.alu_uops, bytes_read=self.bytes_read,
                   bytes_written=self.bytes_written)
        return out


_LOAD_STAGE_MEMS = frozenset((MemType.INP, MemType.WGT))


def stage_of(insn: Insn) -> Stage:
    """Fetch's routing: LOAD of INP/WGT -> load, STORE -> store, the rest -> compute."""
    if isinstance(insn, Load):
        return Stage.LOAD if insn.mem_type in _LOAD_STAGE_MEMS else Stage.COMPUTE
    if isinstance(insn, Store):
        return Stage.STORE
    return Stage.COMPUTE


class _Stage:
    """StageControl of one stage: WAIT -> EXEC -> PUSH, counters, spans."""

    __slots__ = ("m", "sid", "insns", "cmdq", "k", "w0", "v_cmd", "t_pop", "p", "halted", "pops", "pushes",
                 "units", "last_retire", "loader", "spans")

    def __init__(self, model, sid: Stage, insns, cmdq: TimedFifo, tokq: dict, loader):
        self.m, self.sid, self.insns, self.cmdq = model, int(sid), insns, cmdq
        self.k = 0
        self.w0 = 1                  # WAIT from the first cycle after the start pulse's reset
        self.halted = False
        self.last_retire = -1
        self.loader = loader
        # the token queues each instruction pops and pushes, looked up by its two flags of each kind
        flags = ((False, False), (False, True), (True, False), (True, True))
        pop_by = {fl: tuple(tokq[q] for f, q in _POP[sid].items() if fl[f == "pop_next"]) for fl in flags}
        push_by = {fl: tuple(tokq[q] for f, q in _PUSH[sid].items() if fl[f == "push_next"]) for fl in flags}
        self.pops = [pop_by[insn.pop_prev, insn.pop_next] for _, insn in insns]
        self.pushes = [push_by[insn.push_prev, insn.push_next] for _, insn in insns]
        self.units = [self._unit(insn) for _, insn in insns]
        self.spans = model.stats.spans

    def _unit(self, insn: Insn) -> tuple[int | None, int, int, int]:
        """What EXEC does for an instruction, known before the run: (cycles the unit is busy, or None
        for a load the tile loader times on the bus; GEMM micro-ops, ALU micro-ops, bytes written).
        GEMM takes n + 5 cycles for n micro-op iterations, ALU n + 4, an ALU MUL or SCALE 2n + 3 (its
        micro-ops issue every other cycle: accel/hw/alu.py); a STORE's time depends on
        its shape only (store.py); FINISH, EPILOGUE and LOADs of buffers this stage does not serve, 1."""
        m = self.m
        if isinstance(insn, (Gemm, Alu)):
            n = 0
            if insn.uop_end > insn.uop_bgn and insn.iter_out and insn.iter_in:
                n = (insn.uop_end - insn.uop_bgn) * insn.iter_out * insn.iter_in
            if isinstance(insn, Gemm):
                return (n + 5 if n else 1), n, 0, 0
            return ((2 * n + 3 if insn.alu_op in MUL_OPS else n + 4) if n else 1), 0, n, 0
        if isinstance(insn, Load) and self.loader is not None and insn.mem_type in m.loader_types[self.sid]:
            return None, 0, 0, 0
        if isinstance(insn, Store):
            u, beats = store_timing(store_key(m.cfg, m.dram, insn.y_size, insn.x_size, insn.dram_base, insn.x_stride))
            return u, 0, 0, beats * m.cfg.bus_bytes
        return 1, 0, 0, 0

    # WAIT: the instruction and its tokens are popped in the first cycle all are visible
    def try_pop(self, now: int, _=None) -> None:
        k = self.k
        if k == len(self.insns) or self.halted:
            return
        cq = self.cmdq
        if len(cq.W) <= k:
            cq.cons_wait = self.try_pop
            return
        v_cmd = cq.visible_at(k)
        v = v_cmd if v_cmd > self.w0 else self.w0
        for q in self.pops[k]:
            j = len(q.R)
            if len(q.W) <= j:
                q.cons_wait = self.try_pop
                return
            vt = q.visible_at(j)
            if vt > v:
                v = vt
        self.v_cmd = v_cmd
        self.m.loop.at(v if v > now else now, self._pop)

    def _pop(self, t: int, _=None) -> None:
        stats = self.m.stats
        ready = self.v_cmd if self.v_cmd > self.w0 else self.w0
        stats.stall[self.sid] += t - ready
        self.t_pop = t
        self.cmdq.read(t)
        k = self.k
        for q in self.pops[k]:
            q.read(t)
        u, gemm_uops, alu_uops, written = self.units[k]
        if u is None:
            self.loader.start(t + 1, self.insns[k][1], self._unit_done)
            return
        if gemm_uops:
            stats.gemm_uops += gemm_uops
        elif alu_uops:
            stats.alu_uops += alu_uops
        elif written:
            stats.bytes_written += written
        self._unit_done(t + 1 + u)

    def _unit_done(self, c: int) -> None:
        # EXEC ends in cycle c (first cycle the unit is not busy); PUSH from c + 1
        self.p = c + 1
        self.m.loop.at(c + 1, self._push)

    def _push(self, now: int, _=None) -> None:
        for q in self.pushes[self.k]:
            if not q.can_write(now):
                r = q.retry_time(now)
                if r is None:
                    q.prod_wait = self._push_retry
                else:
                    self.m.loop.at(r, self._push)
                return
        m = self.m
        m.stats.busy[self.sid] += self.p - self.t_pop + 1
        m.stats.stall[self.sid] += now - self.p
        for q in self.pushes[self.k]:
            q.write(now)
        if self.spans is not None:
            self.spans.append((self.sid, self.insns[self.k][0], self.t_pop, now + 1))
        insn = self.insns[self.k][1]
        self.k += 1
        self.w0 = now + 1
        self.last_retire = now
        if isinstance(insn, Finish):
            self.halted = True
            m.finish_retired = now
            return
        self.try_pop(now)

    def _push_retry(self, r: int) -> None:
        self.m.loop.at(r + 1, self._push)


class _Fetch:
    """Refill rule, instruction DMA and dispatch (fetch.py)."""

    __slots__ = ("m", "addr", "remaining", "depth", "ibuf", "dest", "dma_busy", "bursts", "bi", "k", "idle_from",
                 "waiting", "stopped_at")

    def __init__(self, model, insn_addr: int, dest: list, count: int):
        """dest: the command queue of each instruction up to the first FINISH (the last dispatched);
        count: instructions to read (INSN_COUNT)."""
        self.m = model
        self.addr, self.remaining = insn_addr, count
        self.stopped_at = None       # cycle FINISH was dispatched: no DMA starts after it
        self.depth = ibuf_depth(model.cfg)
        self.ibuf = TimedFifo("ibuf", self.depth)
        self.dest = dest             # command queue of each instruction, in program order
        self.dma_busy = False
        self.idle_from = 0
        self.k = 0

    def start(self) -> None:
        # cycle 1 latches the address and count; the FETCH state decides from cycle 2
        self.m.loop.at(2, self.refill)
        self.m.loop.at(2, self.dispatch)

    def refill(self, now: int, _=None) -> None:
        if self.remaining == 0 or self.dma_busy or (self.stopped_at is not None and self.stopped_at < now):
            return
        free = self.depth - self.ibuf.level(now)
        if free < min(self.remaining, self.depth // 2):
            R = self.ibuf.R
            if R and R[-1] >= now:        # a dispatch of this cycle frees its slot from the next one
                self.m.loop.at(now + 1, self.refill)
            else:
                self.ibuf.prod_wait = self._refill_later
            return
        n = min(self.remaining, free)
        self.remaining -= n
        self.bursts = dma_bursts(self.m.cfg, self.addr, n, INSN_BYTES)
        self.addr += n * INSN_BYTES
        self.bi, self.k = 0, 0
        self.dma_busy = True
        self.m.bus.request(FETCH, now + 1, self._granted)

    def _refill_later(self, r: int) -> None:
        self.m.loop.at(r + 1, self.refill)

    def _granted(self, g: int) -> int:
        nb, per = self.bursts[self.bi]
        times, f, self.k = self.m.bus.entry_times(g, nb, per, INSN_BYTES, self.k)
        self.bi += 1
        ib = self.ibuf
        cb = ib.cons_wait
        ib.cons_wait = None
        ib.W.extend(times)
        if self.bi < len(self.bursts):
            self.m.bus.request(FETCH, g + 1, self._granted)     # the next AR follows the last one
        else:
            self.dma_busy = False
            self.idle_from = f + 1
            self.m.loop.at(f + 1, self.refill)
        if cb is not None:
            cb(g)
        return f

    def dispatch(self, now: int, _=None) -> None:
        ib = self.ibuf
        j = len(ib.R)
        if j == len(self.dest):
            return
        if len(ib.W) <= j:
            ib.cons_wait = self.dispatch
            return
        v = ib.visible_at(j)
        if v > now:
            self.m.loop.at(v, self.dispatch)
            return
        q = self.dest[j]
        if not q.can_write(now):
            r = q.retry_time(now)
            if r is None:
                q.prod_wait = self._dispatch_later
            else:
                self.m.loop.at(r, self.dispatch)
            return
        ib.read(now)
        q.write(now)
        if j + 1 == len(self.dest) and self.m.finish_index is not None:
            self.stopped_at = now
            return
        self.m.loop.at(now + 1, self.dispatch)

    def _dispatch_later(self, r: int) -> None:
        self.m.loop.at(r + 1, self.dispatch)


class Tsim:
    """Timing model for one AccelConfig and DramModel. run_insns(insns, insn_addr) -> TsimStats."""

    def __init__(self, cfg: AccelConfig, dram: DramModel | None = None):
        self.cfg = cfg
        self.dram = dram or DramModel()
        self.elem_bytes = {m: elem_bytes(cfg, m) for m in MemType}

    def run_insns(self, insns: list[Insn], insn_addr: int = 0, max_cycles: int = 1 << 62,
                  trace: bool = False, illegal=None) -> TsimStats:
        """illegal: the ProgramFault of an undecodable word just after `insns` (sim.fsim.decode_fetched).
        A program fetch faults on (sim.fsim.first_fault) raises that ProgramFault once what was
        dispatched before it has run (its cycles are not modelled); micro-op index faults need the
        data, which only fsim has (the tsim driver runs both)."""
        cfg = self.cfg
        self.stats = stats = TsimStats(spans=[] if trace else None, bursts=[] if trace else None)
        self.loop = loop = EventLoop()
        self.bus = ReadBus(loop, self.dram, cfg.bus_bytes, log=stats.bursts, outstanding=cfg.read_outstanding)
        self.finish_retired = None
        self.loader_types = {int(Stage.LOAD): (MemType.INP, MemType.WGT),
                             int(Stage.COMPUTE): (MemType.UOP, MemType.ACC), int(Stage.STORE): ()}
        tokq = {name: TimedFifo(name, cfg.dep_queue_depth) for name in QUEUE_NAMES}
        cmdq = [TimedFifo(f"{s}_cmd", cfg.cmd_queue_depth) for s in STAGE_NAMES]
        routed = [[], [], []]
        dest = []
        # fetch dispatches up to the first FINISH (what follows it never executes), or up to a fault
        fault, n_dispatched = first_fault(insns, cfg, illegal)
        self.finish_index = None if fault is not None else n_dispatched - 1
        for i, insn in enumerate(insns[:n_dispatched]):
            s = int(stage_of(insn))
            routed[s].append((i, insn))
            dest.append(cmdq[s])
        self.stages = stages = [
            _Stage(self, Stage.LOAD, routed[0], cmdq[0], tokq, TileLoad(self, LOAD_CLIENT)),
            _Stage(self, Stage.COMPUTE, routed[1], cmdq[1], tokq, TileLoad(self, COMPUTE_CLIENT)),
            _Stage(self, Stage.STORE, routed[2], cmdq[2], tokq, None)]
        self.fetch = fetch = _Fetch(self, insn_addr, dest, len(insns))
        fetch.start()
        for st in stages:
            st.try_pop(0)
        if not loop.run(max_cycles):
            raise CycleLimitError(f"tsim: the program did not finish within {max_cycles} cycles")
        if fault is not None:
            raise fault
        stats.events = loop.events
        if self.finish_retired is None:
            raise DeadlockError("tsim: " + self._blocked_report())
        ld, cp, st = stages
        for s in (ld, st):
            if s.k < len(s.insns):
                raise DeadlockError("tsim: " + self._blocked_report())
        # finish is seen in the first cycle with compute finished (the cycle after FINISH retired), load and
        # store idle (WAIT, from the cycle after their last retire) with empty command queues, fetch's DMA idle
        f = max(self.finish_retired + 1, ld.last_retire + 1, st.last_retire + 1, fetch.idle_from)
        stats.cycles = f + 1
        stats.bytes_read = self.bus.beats * cfg.bus_bytes
        return stats

    def _blocked_report(self) -> str:
        parts = []
        for s in self.stages:
            if s.k < len(s.insns) and not s.halted:
                idx, insn = s.insns[s.k]
                parts.append(f"{STAGE_NAMES[s.sid]} stage blocked at instruction {idx} ({insn.opcode.name})")
        return "deadlock: " + ("; ".join(parts) or "FINISH never retired")
