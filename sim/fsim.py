"""Functional simulator: the bit-exact reference executor of the ISA (the living spec).

Runs a program from a DRAM image and leaves the bytes the hardware leaves. It models fetch,
the three decoupled stages with their command queues, and the four dependency-token queues,
so a program whose tokens can never be satisfied is reported as a deadlock (naming each
blocked instruction and the queue it waits on) instead of hanging. Data paths are vectorized
across micro-ops and loop iterations: GEMM products are float BLAS matmuls, exact because each
dot product is bounded below the float mantissa (see gemm_float_dtype), then summed in int64
and wrapped to acc_width, which is order-independent modular arithmetic. A layer runs the same
micro-ops and loop fields on many tiles, so each GEMM/ALU shape's index arrays are built,
bounds-checked and analysed once (_plan); LOAD and STORE tiles are strided views of the DRAM.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from accel.isa import (AccelConfig, Alu, AluOp, Epilogue, Finish, Gemm, Insn, Load, MemType, Stage, Store,
                       buffer_depth, decode_program, decode_uops, elem_bytes)
from accel.hw.params import ErrorCode, static_fault
from accel.isa.deps import QUEUES, token_queue
from accel.isa.errors import EncodingError
from accel.isa.isa import INSN_BYTES, decode_insn

from .errors import DeadlockError, ExecError, ProgramFault, SimError
from .races import RaceChecker

log = logging.getLogger(__name__)

# Buffer element types, little-endian as the DRAM is (the native types on x86 and ARM), so a LOAD
# writes an entry's bytes in place.
_INT = {bits: np.dtype(f"<i{bits // 8}") for bits in (8, 16, 32)}
#: index elements the plan cache may hold (three int64 arrays each: 48 MB)
PLAN_CACHE_ELEMS = 1 << 21
#: micro-op iterations of a GEMM/ALU executed at once: a longer one (up to 16383 x 16383 loop
#: iterations of uop_depth micro-ops are legal) runs as consecutive blocks of whole passes, so
#: the index arrays, whatever the loop counts, stay bounded (three int64 arrays: 24 MB)
CHUNK_ELEMS = 1 << 20

@functools.lru_cache(maxsize=None)
def _routing(stage: Stage, opcode, pop_prev: bool, pop_next: bool, push_prev: bool, push_next: bool):
    """(stage, op name, queues popped, queues pushed) of an instruction, by its routing fields: a
    program has a handful of distinct ones, so the scheduler's per-run tables cost a lookup each."""
    pops = [token_queue(stage, f) for f, on in (("pop_prev", pop_prev), ("pop_next", pop_next)) if on]
    pushes = [token_queue(stage, f) for f, on in (("push_prev", push_prev), ("push_next", push_next)) if on]
    return stage, opcode.name, pops, pushes


def gemm_float_dtype(cfg: AccelConfig):
    """Float type in which every block_in-long int dot product is exact: its magnitude is at
    most block_in * 2^(inp_width-1) * 2^(wgt_width-1), which must fit the mantissa."""
    bound = cfg.block_in * (1 << (cfg.inp_width - 1)) * (1 << (cfg.wgt_width - 1))
    if bound <= 1 << 24:
        return np.float32
    if bound <= 1 << 53:
        return np.float64
    return None  # fall back to int64 einsum


#: a matmul of at least this many multiply-adds may use the idle cores (2 threads: 1.4x at 0.5M, 1.9x at 4M)
THREADED_MATMUL_MACS = 1 << 18
#: a run within this many seconds of the last idle-core count reuses it (a count reads /proc for
#: ~0.13 ms, a tenth of a small program's run; a network makes one run per accelerator layer)
IDLE_RECOUNT_S = 0.5


class BlasThreads:
    """BLAS threads for fsim's matmuls. Most are small (bounded by the on-chip buffers): threaded
    BLAS on them costs more in hand-offs than it gains, and on a loaded machine a descheduled BLAS
    thread stalls every call (measured: 4.7x slower bench/fsim_speed.py with a second process busy).
    So a run holds BLAS to one thread, and a matmul of at least THREADED_MATMUL_MACS also takes the
    cores no other process is running on, counted at the run's first such matmul unless a count is
    less than IDLE_RECOUNT_S old."""

    def __init__(self):
        from threadpoolctl import ThreadpoolController
        self.controller = ThreadpoolController()
        self.libs = self.controller.select(user_api="blas").lib_controllers
        self.threads = None
        self.counted_at = 0.0
        self.single = False

    @contextlib.contextmanager
    def run(self, single: bool = False):
        """The context of one run: one BLAS thread, the caller's setting given back after (set on
        the libraries directly: threadpoolctl's limit() re-reads every library's state, ~30 us).
        single: no extra threads for big matmuls either (the caller keeps the other cores busy)."""
        if time.monotonic() - self.counted_at > IDLE_RECOUNT_S:
            self.threads = None
        before = [lib.num_threads for lib in self.libs]
        for lib in self.libs:
            lib.set_num_threads(1)
        self.single = single
        try:
            yield
        finally:
            self.single = False
            for lib, n in zip(self.libs, before):
                lib.set_num_threads(n)

    def matmul(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if self.single or x.shape[0] * x.shape[1] * w.shape[1] < THREADED_MATMUL_MACS:
            return x @ w
        if self.threads is None:
            self.threads = idle_cores() + 1
            self.counted_at = time.monotonic()
        if self.threads == 1:
            return x @ w
        for lib in self.libs:
            lib.set_num_threads(self.threads)
        try:
            return x @ w
        finally:
            for lib in self.libs:
                lib.set_num_threads(1)


def idle_cores() -> int:
    """Cores of this process's CPU set that no other process's thread is running on now (Linux:
    the runnable count of /proc/loadavg less this process's running threads, which include
    BLAS's own spinning workers); 0 where that cannot be read."""
    try:
        cores = len(os.sched_getaffinity(0))
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
        own = 0
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/stat") as f:
                own += f.read().rsplit(")", 1)[1].split()[0] == "R"
    except (AttributeError, OSError, ValueError, IndexError):
        return 0
    return max(0, cores - 1 - max(0, running - own))


@functools.lru_cache(maxsize=None)
def blas_threads() -> BlasThreads:
    return BlasThreads()


def wrap(x: np.ndarray, bits: int) -> np.ndarray:
    """Two's-complement wrap of integer values to `bits`, as the narrow int dtype."""
    return np.asarray(x, dtype=np.int64).astype(_INT[bits])


def _check_dram(dram: np.ndarray) -> None:
    """LOAD and STORE tiles are strided views into the DRAM array, so it must be one flat buffer."""
    if not isinstance(dram, np.ndarray) or dram.dtype != np.uint8 or dram.ndim != 1 or not dram.flags.c_contiguous:
        what = f"{dram.dtype} with shape {dram.shape}" if isinstance(dram, np.ndarray) else type(dram).__name__
        raise SimError(f"DRAM must be a contiguous 1-D uint8 array, got {what}")


@dataclass
class FsimStats:
    insns: dict[str, int] = field(default_factory=dict)
    per_stage: dict[str, int] = field(default_factory=dict)
    gemm_uops: int = 0
    macs: int = 0
    alu_uops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    leftover_tokens: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """asdict's result (ints and dicts of ints, copied) without its recursive deep copy (60 us, a
        noticeable share of a small program's run)."""
        d = dict(self.__dict__)
        for k in ("insns", "per_stage", "leftover_tokens"):
            d[k] = dict(d[k])
        return d


@dataclass
class _StageState:
    queue: deque = field(default_factory=deque)  # indices of instructions fetched, not yet started
    current: int | None = None                    # index of the instruction started
    popped: bool = False
    executed: bool = False


@dataclass(eq=False)
class _LoopPlan:
    """Index arrays of one GEMM/ALU shape in execution order (wgt None for ALU), bounds-checked,
    with what the vectorized paths derive from them (cluster plan, ALU hazard, ...)."""
    dst: np.ndarray
    src: np.ndarray
    wgt: np.ndarray | None
    run: slice | None                     # dst as a slice when it is lo, lo+1, ... (all distinct)
    derived: dict = field(default_factory=dict)

    def derive(self, key: str, make):
        """A fact the vectorized paths derive from the plan, computed by make() on first use."""
        if key not in self.derived:
            self.derived[key] = make()
        return self.derived[key]


def label(insn: Insn) -> str:
    """How messages name an instruction: its opcode, and a LOAD's or STORE's buffer."""
    return insn.opcode.name + (f" {insn.mem_type.name}" if isinstance(insn, (Load, Store)) else "")


def decode_fetched(raw: bytes, cfg: AccelConfig) -> tuple[list[Insn], ProgramFault | None]:
    """The instructions of a fetched stream up to the first that cannot be decoded (with its
    ILLEGAL_INSN fault) or through the first FINISH, whichever comes first: what follows FINISH
    is never dispatched, so it may hold anything."""
    try:
        return decode_program(raw, cfg), None
    except EncodingError:
        pass
    insns = []
    for k in range(len(raw) // INSN_BYTES):
        try:
            insn = decode_insn(int.from_bytes(raw[k * INSN_BYTES:(k + 1) * INSN_BYTES], "little"), cfg, k)
        except EncodingError as e:
            return insns, ProgramFault(ErrorCode.ILLEGAL_INSN, k, str(e))
        insns.append(insn)
        if isinstance(insn, Finish):
            break
    return insns, None


def first_fault(insns: list[Insn], cfg: AccelConfig, illegal: ProgramFault | None = None):
    """(the fault fetch stops at, or None; how many instructions it dispatches): it dispatches
    in order through the first FINISH, and stops before an instruction with a static fault
    (accel.hw.params.static_fault), before an undecodable word (`illegal`, just after `insns`),
    or, with no FINISH, after the last instruction (NO_FINISH)."""
    for k, insn in enumerate(insns):
        if isinstance(insn, Finish):
            return None, k + 1
        f = static_fault(insn, cfg)
        if f is not None:
            return ProgramFault(f[0], k, f"instruction {k} ({label(insn)}): {f[1]}"), k
    if illegal is not None:
        return illegal, len(insns)
    return ProgramFault(ErrorCode.NO_FINISH, len(insns),
                        f"no FINISH among the program's {len(insns)} instructions: fetch dispatched them all and "
                        f"the accelerator would never raise done"), len(insns)


def _dram_rows(insn, eb: int) -> tuple[np.ndarray, np.ndarray]:
    """The DRAM byte ranges [starts, ends) of a LOAD's or STORE's rows (for the race checker)."""
    starts = (insn.dram_base + np.arange(insn.y_size, dtype=np.int64) * insn.x_stride) * eb
    return starts, starts + insn.x_size * eb


def _contiguous_run(idx: np.ndarray) -> slice | None:
    """idx as a slice when it is lo, lo+1, ..., hi (a view instead of a gather), else None."""
    if idx.size and int(idx[-1]) - int(idx[0]) == idx.size - 1 and (np.diff(idx) == 1).all():
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return None


class Fsim:
    """Functional simulator for one AccelConfig. Buffers persist across run() calls of an
    instance, as SRAM does across runs of the hardware; a new instance starts from zeros."""

    def __init__(self, cfg: AccelConfig, check_races: bool | None = None):
        """check_races: run the token protocol's happens-before check (sim.races) on every program;
        None reads the environment variable ACCEL_CHECK_RACES (1 turns it on, as the tests do)."""
        self.cfg = cfg
        c = cfg
        if check_races is None:
            check_races = os.environ.get("ACCEL_CHECK_RACES", "") == "1"
        self.check_races = check_races
        self.races = None   # the RaceChecker of the run in progress
        self.inp = np.zeros((c.inp_depth, c.batch, c.block_in), _INT[c.inp_width])
        self.wgt = np.zeros((c.wgt_depth, c.block_out, c.block_in), _INT[c.wgt_width])
        self.acc = np.zeros((c.acc_depth, c.batch, c.block_out), _INT[c.acc_width])
        self.out = np.zeros((c.out_depth, c.batch, c.block_out), _INT[c.out_width])
        self.uop = np.zeros((c.uop_depth, 3), np.int64)  # decoded (acc, src, wgt)
        self.epilogue = Epilogue()   # the registers a flushing GEMM reads (zero, as after reset)
        self._fdt = gemm_float_dtype(c)
        # float copies of inp/wgt for the BLAS paths, made on first use, then kept current by loads;
        # the weights as (block_out, depth, block_in), so that a gather of weight tiles along axis 1
        # is already the transposed operand BLAS reads in place (see _gemm_clustered)
        self._inp_f = None
        self._wgt_ft = None
        self._plans: dict[tuple, _LoopPlan] = {}     # see _plan
        self._iter_base = None   # loop iteration (i0, i1) of the block _in_chunks runs, if it runs one
        self._plan_elems = 0
        self._depth = {m: buffer_depth(c, m) for m in MemType}
        self._elem_bytes = {m: elem_bytes(c, m) for m in MemType}
        self._buffers = {MemType.INP: self.inp, MemType.WGT: self.wgt, MemType.ACC: self.acc}

    # ---- top level ------------------------------------------------------------------------
    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int, max_insns: int | None = None) -> FsimStats:
        """Execute insn_count instructions at byte address insn_addr of `dram` (uint8, in place)."""
        _check_dram(dram)
        end = insn_addr + insn_count * INSN_BYTES
        if insn_addr < 0 or insn_count < 0 or end > dram.size:
            raise ExecError(f"instruction stream [{insn_addr:#x}, {end:#x}) lies outside the "
                            f"{dram.size}-byte DRAM")
        insns, illegal = decode_fetched(dram[insn_addr:end].tobytes(), self.cfg)
        return self.run_insns(dram, insns, max_insns, illegal=illegal)

    def run_insns(self, dram: np.ndarray, insns: list[Insn], max_insns: int | None = None,
                  single_thread: bool = False, illegal: ProgramFault | None = None) -> FsimStats:
        """Execute decoded instructions with the decoupled stage/queue model. single_thread: BLAS
        on this thread only (the caller runs other work on the idle cores). illegal: the fault of
        the word after the last of `insns` that failed to decode (see decode_fetched)."""
        _check_dram(dram)
        with blas_threads().run(single_thread):
            return self._run_insns(dram, insns, max_insns, illegal)

    def _run_insns(self, dram: np.ndarray, insns: list[Insn], max_insns: int | None,
                   illegal: ProgramFault | None = None) -> FsimStats:
        stats = FsimStats()
        depth, tdepth = self.cfg.cmd_queue_depth, self.cfg.dep_queue_depth
        tokens = {q: 0 for q in QUEUES.values()}
        stages = {s: _StageState() for s in Stage}
        pc, executed, finished = 0, 0, False
        # fetch dispatches up to the first FINISH, or stops before an instruction that faults (the
        # instructions before it still run; a micro-op index fault among them is raised first)
        fault, n_insns = first_fault(insns, self.cfg, illegal)
        if n_insns < len(insns) and fault is None:
            log.warning("instructions %d..%d follow FINISH (instruction %d) and are not executed",
                        n_insns, len(insns) - 1, n_insns - 1)
        limit = max_insns if max_insns is not None else len(insns)
        # per instruction: its stage's command queue, its op name, its handler (None for FINISH) and the
        # token queues it pops and pushes (None: a flag naming a missing neighbour), from a few lookups
        handler = {Load: self._load, Store: self._store, Gemm: self._gemm, Alu: self._alu,
                   Epilogue: self._set_epilogue, Finish: None}
        routes = [_routing(i.stage, i.opcode, i.pop_prev, i.pop_next, i.push_prev, i.push_next) for i in insns]
        queue_of = [stages[r[0]].queue for r in routes]
        run_of = [handler[type(i)] for i in insns]
        order = [(s, stages[s]) for s in (Stage.LOAD, Stage.STORE, Stage.COMPUTE)]
        c = self.cfg
        races = self.races = RaceChecker({"uop": c.uop_depth, "inp": c.inp_depth, "wgt": c.wgt_depth,
                                          "acc": c.acc_depth, "out": c.out_depth}) if self.check_races else None

        def describe(i):
            ins = insns[i]
            return ins.opcode.name + (f" {ins.mem_type.name}" if isinstance(ins, (Load, Store)) else "")
        while not finished:
            progress = False
            # fetch: in order, stalls while the target command queue is full
            while pc < n_insns:
                q = queue_of[pc]
                if len(q) >= depth:
                    break
                q.append(pc)
                pc += 1
                progress = True
            # load and store first, so compute meets FINISH as late as the tokens allow
            for s, st in order:
                queue = st.queue
                while True:
                    idx = st.current
                    if idx is None:
                        if not queue:
                            break
                        st.current = idx = queue.popleft()
                        st.popped = st.executed = False
                    if not st.popped:
                        qs = routes[idx][2]
                        if qs:
                            if None in qs:
                                raise ExecError(f"instruction {idx} ({insns[idx].opcode.name}): {s.name.lower()} stage "
                                                f"has no {'prev' if s == Stage.LOAD else 'next'} neighbour to pop from")
                            if 0 in [tokens[q] for q in qs]:
                                break
                            for q in qs:
                                tokens[q] -= 1
                                if races:
                                    races.pop(s, q)
                        st.popped = True
                        progress = True
                    if not st.executed:
                        run = run_of[idx]
                        if run is None:   # FINISH
                            busy = [t.name.lower() for t in (Stage.LOAD, Stage.STORE)
                                    if stages[t].current is not None or stages[t].queue]
                            if busy:
                                pend = busy
                                raise ExecError(
                                    f"instruction {idx} (FINISH) ran while {' and '.join(pend)} still had "
                                    f"instructions pending; make FINISH wait for them with dependency tokens "
                                    f"(pop_next after the last store's push_prev) and put FINISH last")
                            finished = True
                        else:
                            if races:
                                races.begin(s, idx, describe)
                            run(idx, insns[idx], dram, stats)
                        st.executed = True
                        executed += 1
                        progress = True
                        if executed > limit:
                            raise SimError(f"instruction limit {limit} exceeded")
                    qs = routes[idx][3]
                    if qs:
                        if None in qs:
                            raise ExecError(f"instruction {idx} ({insns[idx].opcode.name}): {s.name.lower()} stage "
                                            f"has no {'prev' if s == Stage.LOAD else 'next'} neighbour to push to")
                        if max([tokens[q] for q in qs]) >= tdepth:
                            break
                        for q in qs:
                            tokens[q] += 1
                            if races:
                                races.push(s, q)
                    st.current = None
                    progress = True
                    if finished:
                        break
                if finished:
                    break
            if not finished and not progress:
                if fault is not None:   # what fetch dispatched before the fault has run or is stuck
                    raise fault
                raise DeadlockError(self._deadlock_report(stages, tokens, pc, insns[:n_insns]))
        # what ran: every instruction but those still queued behind FINISH
        left = {idx for st in stages.values() for idx in st.queue}
        ran: dict = {}                                   # (stage, op name) -> count; stages named once
        for idx, (stage, opname, _, _) in enumerate(routes[:n_insns]):
            if idx not in left:
                ran[stage, opname] = ran.get((stage, opname), 0) + 1
        for (stage, opname), n in ran.items():
            stats.insns[opname] = stats.insns.get(opname, 0) + n
            sname = stage.name.lower()
            stats.per_stage[sname] = stats.per_stage.get(sname, 0) + n
        stats.leftover_tokens = {q: n for q, n in tokens.items() if n}
        if stats.leftover_tokens:
            log.warning("program ended with unconsumed dependency tokens %s", stats.leftover_tokens)
        return stats

    def _deadlock_report(self, stages, tokens, pc, insns) -> str:
        lines = []
        for s, st in stages.items():
            if st.current is None:
                if st.queue:
                    lines.append(f"{s.name.lower()}: idle with queued work (internal error)")
                continue
            idx = st.current
            insn = insns[idx]
            if not st.popped:
                waits = [f"{f} on empty queue {token_queue(s, f)}" for f in ("pop_prev", "pop_next")
                         if getattr(insn, f) and tokens[token_queue(s, f)] == 0]
            else:
                waits = [f"{f} on full queue {token_queue(s, f)}" for f in ("push_prev", "push_next")
                         if getattr(insn, f)]
            lines.append(f"{s.name.lower()} stage blocked at instruction {idx} ({insn.opcode.name}): "
                         + ", ".join(waits))
        if pc < len(insns):
            lines.append(f"fetch blocked at instruction {pc} ({insns[pc].opcode.name}): "
                         f"{insns[pc].stage.name.lower()} command queue full")
        return "deadlock: " + "; ".join(lines) + f"; tokens {tokens}"

    # ---- instructions -----------------------------------------------------------------------
    def _dram_tile(self, idx, insn, dram, eb) -> np.ndarray:
        """The bytes of a 2-D tile as a (y_size, x_size, eb) strided view of the DRAM (no index
        arrays), bounds-checked. Rows overlap where x_stride < x_size."""
        last = (insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size) * eb
        if last > dram.size:
            raise ExecError(f"instruction {idx} ({insn.opcode.name}): dram_base={insn.dram_base} "
                            f"y_size={insn.y_size} x_size={insn.x_size} x_stride={insn.x_stride} reaches "
                            f"byte {last:#x}, beyond the {dram.size:#x}-byte DRAM")
        return np.ndarray((insn.y_size, insn.x_size, eb), np.uint8, dram, insn.dram_base * eb,
                          (insn.x_stride * eb, eb, 1))

    def _load(self, idx: int, insn: Load, dram: np.ndarray, stats: FsimStats) -> None:
        mem = insn.mem_type
        if mem == MemType.OUT:
            raise ExecError(f"instruction {idx} (LOAD): field mem_type=OUT; LOAD writes UOP, WGT, INP or ACC")
        rows = insn.y_pad0 + insn.y_size + insn.y_pad1
        cols = insn.x_pad0 + insn.x_size + insn.x_pad1
        if rows * cols == 0:
            return  # a no-op carrying dependency flags
        depth, eb = self._depth[mem], self._elem_bytes[mem]
        if insn.sram_base + rows * cols > depth:
            raise ExecError(f"instruction {idx} (LOAD {mem.name}): sram_base={insn.sram_base} + {rows}x{cols} "
                            f"entries exceeds the {mem.name} buffer depth {depth}")
        lo, hi = insn.sram_base, insn.sram_base + rows * cols
        src = self._dram_tile(idx, insn, dram, eb) if insn.y_size and insn.x_size else None   # checked first
        if self.races:
            self.races.write(mem.name.lower(), slice(lo, hi))
            if src is not None:
                self.races.dram_access("read", *_dram_rows(insn, eb))
        padded = rows != insn.y_size or cols != insn.x_size
        if src is not None:
            stats.bytes_read += insn.y_size * insn.x_size * eb
        if mem == MemType.UOP:
            if padded:
                tile = np.zeros((rows, cols, eb), np.uint8)
                if src is not None:
                    tile[insn.y_pad0:insn.y_pad0 + insn.y_size, insn.x_pad0:insn.x_pad0 + insn.x_size] = src
                src = tile
            self.uop[lo:hi] = decode_uops(src.reshape(-1), self.cfg)
            return
        # the entries' bytes, written in place
        tile = self._buffers[mem][lo:hi].view(np.uint8).reshape(rows, cols, eb)
        if padded:
            tile[...] = 0
        if src is not None:
            tile[insn.y_pad0:insn.y_pad0 + insn.y_size, insn.x_pad0:insn.x_pad0 + insn.x_size] = src
        if mem == MemType.INP and self._inp_f is not None:
            self._inp_f[lo:hi] = self.inp[lo:hi]
        elif mem == MemType.WGT and self._wgt_ft is not None:
            self._wgt_ft[:, lo:hi] = self.wgt[lo:hi].transpose(1, 0, 2)

    def _store(self, idx: int, insn: Store, dram: np.ndarray, stats: FsimStats) -> None:
        c = self.cfg
        if insn.mem_type != MemType.OUT:
            raise ExecError(f"instruction {idx} (STORE): field mem_type={insn.mem_type.name}; STORE reads OUT")
        if insn.y_pad0 or insn.y_pad1 or insn.x_pad0 or insn.x_pad1:
            raise ExecError(f"instruction {idx} (STORE): padding fields must be zero")
        if insn.y_size == 0 or insn.x_size == 0:
            return
        n = insn.y_size * insn.x_size
        if insn.sram_base + n > c.out_depth:
            raise ExecError(f"instruction {idx} (STORE): sram_base={insn.sram_base} + {n} entries exceeds the "
                            f"OUT buffer depth {c.out_depth}")
        eb = c.out_elem_bytes
        view = self._dram_tile(idx, insn, dram, eb)
        if self.races:
            self.races.read("out", slice(insn.sram_base, insn.sram_base + n))
            self.races.dram_access("write", *_dram_rows(insn, eb))
        data = self.out[insn.sram_base:insn.sram_base + n].astype(f"<i{c.out_width // 8}").view(np.uint8)
        data = data.reshape(insn.y_size, insn.x_size, eb)
        if insn.y_size == 1 or insn.x_stride >= insn.x_size:
            view[...] = data
        else:
            for r in range(insn.y_size):    # overlapping rows: in order, as the hardware writes them
                view[r] = data[r]
        stats.bytes_written += n * eb

    def _plan(self, idx: int, insn, name: str) -> _LoopPlan:
        """The bounds-checked index arrays of a GEMM/ALU, cached by its micro-ops and loop fields
        (a layer runs the same shape on many tiles, so each is built and checked once)."""
        c = self.cfg
        self._check_uop_range(idx, insn, name)
        u = self.uop[insn.uop_bgn:insn.uop_end]
        gemm = isinstance(insn, Gemm)
        # what the plan's checks and derived facts (hazards, runs) depend on: an ALU's source is read
        # unless the immediate replaces it, and FLUSH reads it whatever use_imm says
        reads_src = not gemm and not (insn.use_imm and insn.alu_op != AluOp.FLUSH)
        key = (u.tobytes(), insn.iter_out, insn.iter_in, insn.dst_factor_out, insn.dst_factor_in,
               insn.src_factor_out, insn.src_factor_in,
               (insn.wgt_factor_out, insn.wgt_factor_in, insn.reset) if gemm else reads_src)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        i0 = np.arange(insn.iter_out, dtype=np.int64)[:, None, None]
        i1 = np.arange(insn.iter_in, dtype=np.int64)[None, :, None]
        dst = (u[:, 0] + i0 * insn.dst_factor_out + i1 * insn.dst_factor_in).reshape(-1)
        src = (u[:, 1] + i0 * insn.src_factor_out + i1 * insn.src_factor_in).reshape(-1)
        wgt = (u[:, 2] + i0 * insn.wgt_factor_out + i1 * insn.wgt_factor_in).reshape(-1) if gemm else None
        checks = [("accumulator (dst)", dst, c.acc_depth)]
        if gemm and not insn.reset:
            checks += [("input (src)", src, c.inp_depth), ("weight (wgt)", wgt, c.wgt_depth)]
        elif reads_src:
            checks += [("accumulator (src)", src, c.acc_depth)]
        for what, arr, depth in checks:
            if arr.size and int(arr.max()) >= depth:
                k = int(np.argmax(arr >= depth))
                ui = k % len(u)
                b0, b1 = self._iter_base or (0, 0)
                raise ProgramFault(ErrorCode.INDEX_RANGE, idx,
                                   f"instruction {idx} ({name}): {what} index {int(arr[k])} out of range "
                                   f"[0, {depth}) at micro-op {insn.uop_bgn + ui}, iteration "
                                   f"({b0 + k // len(u) // insn.iter_in}, {b1 + k // len(u) % insn.iter_in})")
        plan = _LoopPlan(dst, src, wgt, _contiguous_run(dst))
        if dst.size <= PLAN_CACHE_ELEMS:
            self._plan_elems += dst.size
            if self._plan_elems > PLAN_CACHE_ELEMS:   # bound the memory the cache holds
                self._plans.clear()
                self._plan_elems = dst.size
            self._plans[key] = plan
        return plan

    def _check_uop_range(self, idx: int, insn, name: str) -> None:
        if not 0 <= insn.uop_bgn <= insn.uop_end <= self.cfg.uop_depth:   # (fetch checks it first)
            raise ProgramFault(ErrorCode.SRAM_RANGE, idx, f"instruction {idx} ({name}): micro-op range "
                               f"[uop_bgn={insn.uop_bgn}, uop_end={insn.uop_end}) outside [0, {self.cfg.uop_depth}]")

    def _in_chunks(self, idx: int, insn, dram: np.ndarray, stats: FsimStats, run) -> bool:
        """Run a GEMM/ALU of more than CHUNK_ELEMS micro-op iterations as consecutive blocks of whole
        passes (the loops' (i0, i1) iterations, in order): each block is the same instruction with
        fewer iterations on micro-ops (and a flush's seed base) shifted by the block's first
        iteration's offsets, which is what in-order execution does. False: small enough to run whole."""
        nu = insn.uop_end - insn.uop_bgn
        if self._iter_base is not None or nu <= 0 or nu * insn.iter_out * insn.iter_in <= CHUNK_ELEMS:
            return False   # (a block runs whole: at least one pass, at most uop_depth iterations)
        self._check_uop_range(idx, insn, insn.opcode.name)
        gemm = isinstance(insn, Gemm)
        if nu * insn.iter_in <= CHUNK_ELEMS:
            rows = CHUNK_ELEMS // (nu * insn.iter_in)
            blocks = [(a, min(rows, insn.iter_out - a), 0, insn.iter_in) for a in range(0, insn.iter_out, rows)]
        else:
            cols = max(1, CHUNK_ELEMS // nu)
            blocks = [(a, 1, b, min(cols, insn.iter_in - b))
                      for a in range(insn.iter_out) for b in range(0, insn.iter_in, cols)]
        uop, epi = self.uop, self.epilogue
        base = uop[insn.uop_bgn:insn.uop_end]
        try:
            for a, r, b, q in blocks:
                shift = [a * insn.dst_factor_out + b * insn.dst_factor_in,
                         a * insn.src_factor_out + b * insn.src_factor_in,
                         a * insn.wgt_factor_out + b * insn.wgt_factor_in if gemm else 0]
                self.uop = uop.copy()
                self.uop[insn.uop_bgn:insn.uop_end] = base + np.array(shift, np.int64)
                if gemm and insn.flush:
                    self.epilogue = dataclasses.replace(
                        epi, seed_base=epi.seed_base + a * epi.seed_factor_out + b * epi.seed_factor_in)
                self._iter_base = (a, b)
                run(idx, dataclasses.replace(insn, iter_out=r, iter_in=q), dram, stats)
        finally:
            self.uop, self.epilogue, self._iter_base = uop, epi, None
        return True

    def _set_epilogue(self, idx: int, insn: Epilogue, dram: np.ndarray, stats: FsimStats) -> None:
        self.epilogue = insn

    def _gemm(self, idx: int, insn: Gemm, dram: np.ndarray, stats: FsimStats) -> None:
        c = self.cfg
        if self._in_chunks(idx, insn, dram, stats, self._gemm):
            return
        plan = self._plan(idx, insn, "GEMM")
        dst, src, wgt = plan.dst, plan.src, plan.wgt
        if dst.size == 0:
            return
        stats.gemm_uops += dst.size
        if not insn.reset:
            stats.macs += dst.size * c.macs_per_cycle
        flushed, seeds, in_order = self._flush_plan(idx, insn, plan) if insn.flush else (None, None, True)
        if self.races:   # a flush reads its seeds, unless it requantizes into the accumulator
            self._race_accesses(insn, plan, gemm=True, seeds=None if self.epilogue.to_acc else seeds)
        if insn.flush:
            if in_order:   # each flushed sum's value depends on the micro-ops before it only
                self._gemm_sums(insn, plan)
                self._flush(flushed, seeds, self.acc[flushed])
                return
            self._gemm_in_order(insn, plan, flushed, seeds)
            return
        self._gemm_sums(insn, plan)

    def _race_accesses(self, insn, plan: _LoopPlan, gemm: bool, use_imm: bool = False, seeds=None) -> None:
        """A GEMM's or ALU's buffer accesses, for the race checker: its micro-ops, its operands and
        the accumulator entries it updates (and a flush's seeds, from _flush_plan), then the entries
        it writes."""
        r = self.races
        u = plan.derive("race", lambda: {k: np.unique(a) for k, a in
                                         (("dst", plan.dst), ("src", plan.src), ("wgt", plan.wgt)) if a is not None})
        r.read("uop", slice(insn.uop_bgn, insn.uop_end))
        if gemm and not insn.reset:
            r.read("inp", u["src"])
            r.read("wgt", u["wgt"])
        if not (gemm and insn.reset):
            r.read("acc", u["dst"])
        if not gemm and not use_imm:
            r.read("acc", u["src"])
        if seeds is not None:
            r.read("acc", np.unique(seeds))
        r.write("acc", u["dst"])
        r.write("out", u["dst"])

    def _gemm_sums(self, insn: Gemm, plan: _LoopPlan) -> None:
        """Every micro-op's sum, and out = narrow(acc) on the entries they write."""
        c = self.cfg
        dst, src, wgt = plan.dst, plan.src, plan.wgt
        if insn.reset:
            d = plan.run or dst
            self.acc[d] = 0
            self.out[d] = 0
            return
        if self._gemm_clustered(insn, plan):
            return  # updated acc and out itself
        # wgt varies over the loop dims with a non-zero factor; group rows by those dims so
        # each group is one (rows x block_in) @ (block_in x block_out) matmul.
        nu = insn.uop_end - insn.uop_bgn
        shape = (insn.iter_out, insn.iter_in, nu)
        vary = [insn.wgt_factor_out != 0 and insn.iter_out > 1, insn.wgt_factor_in != 0 and insn.iter_in > 1, nu > 1]
        ngroups = math.prod(n for n, v in zip(shape, vary) if v)
        if self._gemm_separable(insn, dst, shape):
            pass
        elif self._fdt is not None and ngroups * 4 <= dst.size:
            self._gemm_grouped(dst, src, wgt, shape, vary)
        else:
            self._gemm_gathered(dst, src, wgt)
        touched = plan.derive("touched", lambda: plan.run or np.unique(dst))
        self.out[touched] = wrap(self.acc[touched], c.out_width)

    def _flush_plan(self, idx: int, insn: Gemm, plan: _LoopPlan):
        """A flushing GEMM's (flushed entries, seed entries, in_order) for the current EPILOGUE:
        each pass's last micro-op flushes; in_order when no flushed entry is flushed twice or
        written after its flush and no seed is written by the instruction, so that the sums can
        go first and the flushes after them."""
        e = self.epilogue
        nu = insn.uop_end - insn.uop_bgn

        def make():
            i0 = np.arange(insn.iter_out, dtype=np.int64)[:, None]
            i1 = np.arange(insn.iter_in, dtype=np.int64)[None, :]
            seeds = (e.seed_base + i0 * e.seed_factor_out + i1 * e.seed_factor_in).reshape(-1)
            if not e.to_acc and seeds.size and int(seeds.max()) >= self.cfg.acc_depth:
                k = int(np.argmax(seeds >= self.cfg.acc_depth))
                raise ProgramFault(ErrorCode.INDEX_RANGE, idx,
                                   f"instruction {idx} (GEMM): flush seed index {int(seeds[k])} out of range "
                                   f"[0, {self.cfg.acc_depth}) at iteration ({k // insn.iter_in}, "
                                   f"{k % insn.iter_in}) (EPILOGUE seed_base {e.seed_base}, factors "
                                   f"{e.seed_factor_out}, {e.seed_factor_in})")
            flushed = plan.dst.reshape(-1, nu)[:, -1]
            at = np.arange(nu - 1, plan.dst.size, nu)
            last = np.full(self.cfg.acc_depth, -1, np.int64)
            last[plan.dst] = np.arange(plan.dst.size)   # the last write of each entry (later ones win)
            in_order = (np.unique(flushed).size == flushed.size and (last[flushed] == at).all()
                        and (e.to_acc or not np.isin(seeds, plan.dst).any()))
            return flushed, seeds % self.cfg.acc_depth, bool(in_order)   # (to_acc reads no seed)
        return plan.derive(("flush", e.seed_base, e.seed_factor_out, e.seed_factor_in, e.to_acc), make)

    def _flush(self, flushed, seeds, sums: np.ndarray) -> None:
        """out[flushed] = the FLUSH requantization of their sums; acc[flushed] = acc[seeds], or with
        the EPILOGUE's to_acc the requantized sums."""
        q = flush_requant(sums, self.epilogue.imm, self.cfg.acc_width)
        self.out[flushed] = q.astype(self.out.dtype)
        self.acc[flushed] = q.astype(self.acc.dtype) if self.epilogue.to_acc else self.acc[seeds]

    def _gemm_in_order(self, insn: Gemm, plan: _LoopPlan, flushed, seeds) -> None:
        """A flushing GEMM whose writes and seeds overlap: one micro-op after another, as the
        hardware runs them (the slow path; compilers do not emit this)."""
        w, nu = self.cfg.acc_width, insn.uop_end - insn.uop_bgn
        for k in range(plan.dst.size):
            d = plan.dst[k]
            if insn.reset:
                v = np.zeros(self.acc[d].shape, np.int64)
            else:
                v = self.acc[d].astype(np.int64) + (self.inp[plan.src[k]].astype(np.int64)
                                                    @ self.wgt[plan.wgt[k]].astype(np.int64).T)
            v = wrap(v, w)
            if k % nu == nu - 1:
                self._flush([d], [seeds[k // nu]], v[None])
            else:
                self.acc[d] = v
                self.out[d] = v.astype(self.out.dtype)

    def _gemm_clustered(self, insn: Gemm, loop: _LoopPlan) -> bool:
        """The convolution pattern: weights do not move with the loops, so the micro-ops that
        share a destination (one output tile: its input channels and kernel taps) are one
        im2col row block. Clusters that read the same input micro-ops (the output-channel blocks
        of one tile) share the gathered rows and go to BLAS as ONE (loop rows x K*block_in) @
        (K*block_in x clusters*block_out) matmul, exact in float32 or float64 by the same bound
        as gemm_float_dtype with K*block_in terms. Sums are added to acc once (a slice or plain
        indexing when every destination is distinct)."""
        if insn.wgt_factor_out or insn.wgt_factor_in or self._fdt is None:
            return False
        plan = loop.derive("cluster", lambda: self._make_cluster_plan(insn, self.uop[insn.uop_bgn:insn.uop_end]))
        if plan is None:
            return False
        c, (fdt, groups, dst, touched) = self.cfg, plan
        inp_f, wgt_ft = self._floats()
        if len(groups) == 1 and isinstance(dst, slice) and fdt == np.float32 and self.acc.dtype == np.int32:
            # one matmul into one run of a 32-bit accumulator: its exact int32 sums added in place
            # (int32 adds wrap as the accumulator does), no staging array
            (src_idx, wgt_idx), n = groups[0], groups[0][1].shape[0]
            rows = src_idx.shape[0]
            part = self._cluster_matmul(fdt, inp_f, wgt_ft, src_idx, wgt_idx).astype(np.int32)
            acc = self.acc[dst]
            acc.reshape(n, rows, c.batch, c.block_out)[...] += part.reshape(rows, c.batch, c.block_out, n).transpose(3, 0, 1, 2)
            self.out[dst] = acc
            return True
        # exact integers: int32 holds any float32-exact sum and wraps like a 32-bit accumulator
        y = np.empty((sum(s.shape[0] * w.shape[0] for s, w in groups), c.batch, c.block_out),
                     np.int32 if fdt == np.float32 else np.int64)
        at = 0
        for src_idx, wgt_idx in groups:
            rows, n = src_idx.shape[0], wgt_idx.shape[0]
            part = self._cluster_matmul(fdt, inp_f, wgt_ft, src_idx, wgt_idx).reshape(rows, c.batch, c.block_out, n)
            part = part.transpose(3, 0, 1, 2)
            np.copyto(y[at:at + n * rows].reshape(n, rows, c.batch, c.block_out), part, casting="unsafe")
            at += n * rows
        if touched is not None:   # destinations repeat: sum per entry first
            self._accumulate_sorted(dst, y)
            self.out[touched] = wrap(self.acc[touched], c.out_width)
            return True
        self._add_to_acc(dst, y)
        self.out[dst] = self.acc[dst].astype(self.out.dtype)
        return True

    def _cluster_matmul(self, fdt, inp_f, wgt_ft, src_idx: np.ndarray, wgt_idx: np.ndarray) -> np.ndarray:
        """One group of _gemm_clustered: its gathered input rows (rows x K micro-ops) times the
        weights of its n clusters (n x K micro-ops), as (rows * batch, block_out * n) floats of
        type fdt (float64 where K * block_in products could pass float32's exact range)."""
        c = self.cfg
        rows, k = src_idx.shape
        n = wgt_idx.shape[0]
        x = np.take(inp_f, src_idx, axis=0)                                     # (rows, K, batch, bin)
        x = x.transpose(0, 2, 1, 3).reshape(rows * c.batch, k * c.block_in).astype(fdt, copy=False)
        w = np.take(wgt_ft, wgt_idx, axis=1)                                    # (bout, n, K, bin)
        w = w.reshape(c.block_out * n, k * c.block_in).astype(fdt, copy=False).T   # a transposed view
        return blas_threads().matmul(x, w)

    def _make_cluster_plan(self, insn: Gemm, u: np.ndarray):
        """Index plan of _gemm_clustered: (float type, [(src rows x K, wgt n x K) per group of
        clusters], destinations as a slice or index array, the distinct entries when some repeat,
        else None), or None when the instruction does not fit the pattern."""
        c = self.cfg
        heads, inverse = np.unique(u[:, 0], return_inverse=True)
        counts = np.bincount(inverse)
        bound = int(counts.max()) * c.block_in * (1 << (c.inp_width - 1)) * (1 << (c.wgt_width - 1))
        fdt = np.float32 if bound <= 1 << 24 else np.float64 if bound <= 1 << 53 else None
        if fdt is None or len(heads) > 64:
            return None  # many clusters: building the plan costs more than the other paths save
        i0 = np.arange(insn.iter_out, dtype=np.int64)[:, None]
        i1 = np.arange(insn.iter_in, dtype=np.int64)[None, :]
        off_d = (i0 * insn.dst_factor_out + i1 * insn.dst_factor_in).reshape(-1)
        off_s = (i0 * insn.src_factor_out + i1 * insn.src_factor_in).reshape(-1)
        order = np.argsort(inverse, kind="stable")
        starts = np.r_[0, np.cumsum(counts)]
        by_src: dict[bytes, list[int]] = {}        # clusters by their input micro-ops, in head order
        for ci in range(len(heads)):
            by_src.setdefault(u[order[starts[ci]:starts[ci + 1]], 1].tobytes(), []).append(ci)
        if len(by_src) > 1 and len(by_src) * 4 > len(u):
            return None  # many small matmuls (clusters reading different inputs): one Python step each
        groups, dsts = [], []
        for members in by_src.values():
            sel = np.stack([order[starts[ci]:starts[ci + 1]] for ci in members])   # (n, K) micro-ops
            groups.append((u[sel[0], 1][None, :] + off_s[:, None], u[sel, 2]))
            dsts.append((heads[members][:, None] + off_d[None, :]).reshape(-1))
        dst = np.concatenate(dsts)
        if np.bincount(dst).max() > 1:
            return fdt, groups, dst, np.unique(dst)
        return fdt, groups, _contiguous_run(dst) or dst, None   # one contiguous run: views, no gathers

    def _add_to_acc(self, dst, y: np.ndarray) -> None:
        """acc[dst] += y wrapped to acc_width (dst a slice or distinct indices). A 32-bit accumulator
        adds in place, numpy's int32 add wrapping as the hardware's does; integer casts in numpy are
        modular, so an int32 sum that wraps mod 2^32 narrows to a 16- or 8-bit accumulator exactly."""
        if self.acc.dtype == y.dtype:
            self.acc[dst] += y
        elif self.acc.dtype.itemsize <= 4 and y.dtype == np.int32:
            self.acc[dst] = (self.acc[dst].astype(np.int32) + y).astype(self.acc.dtype)
        else:
            self.acc[dst] = wrap(self.acc[dst].astype(np.int64) + y, self.cfg.acc_width)

    def _gemm_separable(self, insn: Gemm, dst, shape) -> bool:
        """The matmul pattern: every micro-op adds into the same dst, the input tile depends on
        one loop level and the micro-op, the weight tile on the other level and the micro-op.
        Then the instruction is ONE (rows x nu*block_in) @ (nu*block_in x cols) matmul, done in
        float64, exact for any sum of up to 2^39 int8 x int8 products."""
        c = self.cfg
        u = self.uop[insn.uop_bgn:insn.uop_end]
        if len(u) < 2 or (u[:, 0] != u[0, 0]).any():
            return False
        if insn.src_factor_in == 0 and insn.wgt_factor_out == 0:
            i_src, i_wgt = 0, 1
        elif insn.src_factor_out == 0 and insn.wgt_factor_in == 0:
            i_src, i_wgt = 1, 0
        else:
            return False
        n_src, n_wgt, nu = shape[i_src], shape[i_wgt], len(u)
        f_src = (insn.src_factor_out, insn.src_factor_in)[i_src]
        f_wgt = (insn.wgt_factor_out, insn.wgt_factor_in)[i_wgt]
        src = u[None, :, 1] + np.arange(n_src)[:, None] * f_src            # (n_src, nu)
        wgt = u[None, :, 2] + np.arange(n_wgt)[:, None] * f_wgt            # (n_wgt, nu)
        x = self.inp[src].astype(np.float64)                               # (n_src, nu, batch, bin)
        x = x.transpose(0, 2, 1, 3).reshape(n_src * c.batch, nu * c.block_in)
        w = self.wgt[wgt].astype(np.float64)                               # (n_wgt, nu, bout, bin)
        w = w.transpose(1, 3, 0, 2).reshape(nu * c.block_in, n_wgt * c.block_out)
        y = blas_threads().matmul(x, w).astype(np.int64).reshape(n_src, c.batch, n_wgt, c.block_out)
        y = y.transpose(0, 2, 1, 3) if i_src == 0 else y.transpose(2, 0, 1, 3)  # (iter_out, iter_in, b, o)
        d = dst.reshape(shape)[:, :, 0].reshape(-1)
        self._accumulate_sorted(d, y.reshape(-1, c.batch, c.block_out))
        return True

    def _floats(self):
        if self._inp_f is None:
            self._inp_f = self.inp.astype(self._fdt)
        if self._wgt_ft is None:
            self._wgt_ft = self.wgt.transpose(1, 0, 2).astype(self._fdt, order="C")
        return self._inp_f, self._wgt_ft

    def _gemm_grouped(self, dst, src, wgt, shape, vary) -> None:
        c = self.cfg
        inp_f, wgt_ft = self._floats()
        # Move the loop dims the weight index varies over first: each group of rows shares one
        # weight tile, and all groups go to BLAS as one stacked (G, rows*batch, block_in) matmul.
        order = [d for d in range(3) if vary[d]] + [d for d in range(3) if not vary[d]]
        nvary = sum(vary)
        d3, s3, w3 = (a.reshape(shape).transpose(order) for a in (dst, src, wgt))
        d3 = d3.reshape(-1, int(np.prod(d3.shape[nvary:])))
        s3 = s3.reshape(d3.shape)
        w3 = w3.reshape(d3.shape)
        groups, rows = d3.shape
        x = inp_f[s3].reshape(groups, rows * c.batch, c.block_in)
        w = np.take(wgt_ft, w3[:, 0], axis=1).transpose(1, 2, 0)   # (G, block_in, block_out)
        y = np.matmul(x, w)                                    # exact: see gemm_float_dtype
        total = y.astype(np.int64).reshape(groups * rows, c.batch, c.block_out)
        # Sum contributions per destination in int64, then one wrapped update.
        self._accumulate_sorted(d3.reshape(-1), total)

    def _accumulate_sorted(self, dst: np.ndarray, contrib: np.ndarray) -> None:
        order = np.argsort(dst, kind="stable")
        ds = dst[order]
        starts = np.concatenate(([0], np.flatnonzero(ds[1:] != ds[:-1]) + 1))   # (np.r_ costs ~10 us a call)
        summed = np.add.reduceat(contrib[order], starts, axis=0)
        uniq = ds[starts]
        self.acc[uniq] = wrap(self.acc[uniq].astype(np.int64) + summed, self.cfg.acc_width)

    def _gemm_gathered(self, dst, src, wgt) -> None:
        if self._fdt is not None:
            inp_f, wgt_ft = self._floats()
            prod = np.matmul(inp_f[src], np.take(wgt_ft, wgt, axis=1).transpose(1, 2, 0)).astype(np.int64)
        else:
            prod = np.einsum("nbk,nok->nbo", self.inp[src].astype(np.int64), self.wgt[wgt].astype(np.int64))
        self._accumulate_sorted(dst, prod)

    def _alu(self, idx: int, insn: Alu, dram: np.ndarray, stats: FsimStats) -> None:
        n = (insn.uop_end - insn.uop_bgn) * insn.iter_out * insn.iter_in
        if (n > CHUNK_ELEMS and self._iter_base is None and self.races is None and insn.use_imm
                and insn.alu_op != AluOp.FLUSH and self._alu_repeated(insn, stats)):
            return
        if self._in_chunks(idx, insn, dram, stats, self._alu):
            return
        plan = self._plan(idx, insn, "ALU")
        dst, src = plan.dst, plan.src
        if dst.size == 0:
            return
        stats.alu_uops += dst.size
        op, w = insn.alu_op, self.cfg.acc_width
        use_imm = insn.use_imm and op != AluOp.FLUSH    # FLUSH seeds from the register whatever use_imm says
        if self.races:
            self._race_accesses(insn, plan, gemm=False, use_imm=use_imm)
        if not plan.derive("hazard", lambda: self._alu_hazard(plan, use_imm)):
            d = plan.run or dst
            # elements that only read their own entry and one operand for all can go in any order:
            # by the contiguous blocks of their entries, each a view (no gather and scatter)
            blocks = plan.derive("blocks", lambda: _entry_blocks(dst, plan.run)) or [d]
            if op == AluOp.FLUSH:   # the output buffer gets the requantized sums, then the seeds come
                for b in blocks:
                    self.out[b] = flush_requant(self.acc[b], insn.imm, w).astype(self.out.dtype)
            if op in (AluOp.MOV, AluOp.FLUSH) and not use_imm:   # a copy: acc_width values already
                if not self._mov_broadcast(insn, plan, write_out=op == AluOp.MOV):
                    res = self.acc[plan.src]
                    self.acc[d] = res
                    if op == AluOp.MOV:
                        self.out[d] = res.astype(self.out.dtype)
                return
            operand = self._alu_operand(insn, plan)
            if np.ndim(operand) == 3:    # one entry per element, in element order
                blocks = [d]
            for b in blocks:
                res = self._alu_apply(op, self.acc[b], operand)
                self.acc[b] = res
                self.out[b] = res.astype(self.out.dtype)
        else:   # in order, one vector step per run of elements that do not see each other's writes
            for seg in plan.derive("runs", lambda: _independent_runs(dst, src, use_imm)):
                d = dst[seg]
                b = np.int64(insn.imm) if use_imm else self.acc[src[seg]].astype(np.int64)
                q = flush_requant(self.acc[d], insn.imm, w) if op == AluOp.FLUSH else None
                res = self._alu_apply(op, self.acc[d], b)
                self.acc[d] = res
                self.out[d] = (res if q is None else q).astype(self.out.dtype)

    def _alu_repeated(self, insn: Alu, stats: FsimStats) -> bool:
        """A long immediate ALU (not FLUSH): each element reads only its own entry, so entry d ends
        as op applied count(d) times; counted per entry (in blocks) and applied in closed form (ADD,
        MUL; MIN, MAX, CLIP, CLAMP, MOV are idempotent) or until a fixed point (SHR, REQUANT, SCALE
        settle within a few dozen steps). What would take one Python step per element of a 16383 x
        16383 loop takes milliseconds. False (nothing done): an index out of range (the block path
        reports it) or no fixed point within 4096 steps."""
        c, w = self.cfg, self.cfg.acc_width
        u = self.uop[insn.uop_bgn:insn.uop_end, 0]
        if int(u.max()) + (insn.iter_out - 1) * insn.dst_factor_out + (insn.iter_in - 1) * insn.dst_factor_in \
                >= c.acc_depth:
            return False
        base = np.zeros(c.acc_depth, np.int64)        # entries one i0 pass writes, with their counts
        step = max(1, CHUNK_ELEMS // len(u))
        for b in range(0, insn.iter_in, step):
            i1 = np.arange(b, min(insn.iter_in, b + step), dtype=np.int64)[:, None]
            base += np.bincount((u[None, :] + i1 * insn.dst_factor_in).reshape(-1), minlength=c.acc_depth)
        if insn.dst_factor_out == 0:
            count = base * insn.iter_out
        else:
            count = np.zeros_like(base)
            for i0 in range(insn.iter_out):
                sh = i0 * insn.dst_factor_out
                count[sh:] += base[:c.acc_depth - sh]
        idx = np.flatnonzero(count)
        k = count[idx][:, None, None]
        a = self.acc[idx].astype(np.int64)
        op, imm, m = insn.alu_op, np.int64(insn.imm), (1 << w) - 1
        if op == AluOp.ADD:
            res = wrap(a + k * imm, w)
        elif op == AluOp.MUL:                          # a * imm^k mod 2^w, by squaring (w <= 32: exact in uint64)
            r, sq = (a & m).astype(np.uint64), np.full(a.shape, int(imm) & m, np.uint64)
            e = np.broadcast_to(k, a.shape).copy()
            while e.any():
                odd = (e & 1).astype(bool)
                r[odd] = (r[odd] * sq[odd]) & np.uint64(m)
                sq = (sq * sq) & np.uint64(m)
                e >>= 1
            res = wrap(r.astype(np.int64), w)
        elif op in (AluOp.MIN, AluOp.MAX, AluOp.CLIP, AluOp.CLAMP, AluOp.MOV):
            res = self._alu_apply(op, a, imm)
        else:
            left = np.broadcast_to(k, a.shape).copy()
            for _ in range(4096):
                live = left > 0
                if not live.any():
                    break
                nxt = self._alu_apply(op, a[live], imm).astype(np.int64)
                left[live] = np.where(nxt == a[live], 0, left[live] - 1)
                a[live] = nxt
            else:
                return False
            res = wrap(a, w)
        self.acc[idx] = res
        self.out[idx] = res.astype(self.out.dtype)
        stats.alu_uops += len(u) * insn.iter_out * insn.iter_in
        return True

    def _mov_broadcast(self, insn: Alu, plan: _LoopPlan, write_out: bool = True) -> bool:
        """A MOV whose every iteration copies the same micro-op sources (a bias over an output tile)
        as broadcast copies of those few entries into slices, instead of a gather and a scatter of
        every element: the iterations' destinations of the tile in micro-op order (plan.run), or of
        each micro-op a contiguous block (the compiler's channel-block-major tiles). Only without
        hazards (then every read precedes every write, as in-order execution gives). write_out=False:
        the accumulator only (a FLUSH writes its own output values)."""
        nu, n_it = insn.uop_end - insn.uop_bgn, insn.iter_out * insn.iter_in
        if insn.src_factor_out or insn.src_factor_in or nu > 64:
            return False
        blocks = plan.run is None
        if blocks and not ((insn.iter_in == 1 or insn.dst_factor_in == 1) and
                           (insn.iter_out == 1 or insn.dst_factor_out == insn.iter_in)):
            return False
        res = self.acc[plan.src[:nu]]
        res_out = res.astype(self.out.dtype) if write_out else None
        if not blocks:
            self.acc[plan.run].reshape(n_it, *res.shape)[...] = res
            if write_out:
                self.out[plan.run].reshape(n_it, *res.shape)[...] = res_out
            return True
        for k, lo in enumerate(plan.dst[:nu].tolist()):         # uop k writes lo .. lo + n_it - 1
            self.acc[lo:lo + n_it] = res[k]
            if write_out:
                self.out[lo:lo + n_it] = res_out[k]
        return True

    def _alu_apply(self, op: AluOp, a: np.ndarray, b) -> np.ndarray:
        """alu_apply, in int32 where alu_apply_int32 takes the op (a 32-bit accumulator)."""
        res = alu_apply_int32(op, a, b) if self.cfg.acc_width == 32 else None
        return alu_apply(op, a, b, self.cfg.acc_width) if res is None else res

    def _alu_hazard(self, plan: _LoopPlan, use_imm: bool) -> bool:
        """Whether an element reads or rewrites an accumulator entry that an earlier element of the
        instruction wrote: then execution order matters and the ALU runs element by element."""
        dst, src, n = plan.dst, plan.src, plan.dst.size
        if plan.run is not None:
            return not use_imm and bool(((src >= plan.run.start) & (src < plan.run.start + np.arange(n))).any())
        if np.bincount(dst).max() > 1:
            return True
        if use_imm:
            return False
        first_write = np.full(self.cfg.acc_depth, n, np.int64)
        first_write[dst[::-1]] = np.arange(n - 1, -1, -1)
        return bool((first_write[src] < np.arange(n)).any())

    def _alu_operand(self, insn: Alu, plan: _LoopPlan) -> np.ndarray:
        """The second operand: the immediate, one accumulator entry when every element reads the
        same one (it broadcasts), else one entry per element."""
        if insn.use_imm:
            return np.int64(insn.imm)
        one = plan.derive("one_src", lambda: int(plan.src[0]) if (plan.src == plan.src[0]).all() else -1)
        return self.acc[one if one >= 0 else plan.src].astype(np.int64)


def _entry_blocks(dst: np.ndarray, run: slice | None, most: int = 16) -> list[slice] | None:
    """The accumulator entries of dst (distinct) as contiguous blocks, in entry order; None when
    dst is one run already or has more than `most` blocks."""
    if run is not None:
        return None
    s = np.sort(dst)
    cuts = [0, *(np.flatnonzero(np.diff(s) != 1) + 1).tolist(), s.size]
    if len(cuts) - 1 > most:
        return None
    return [slice(int(s[a]), int(s[b - 1]) + 1) for a, b in zip(cuts, cuts[1:])]


def _independent_runs(dst: np.ndarray, src: np.ndarray, use_imm: bool) -> list[slice]:
    """The elements of an ALU instruction with hazards, in order, cut into runs in which no element
    reads or rewrites an entry an earlier element of its run wrote: each run is then one vector
    step (its reads all precede its writes, which is what in-order execution gives it)."""
    cuts, written = [0], set()
    for i, (d, s) in enumerate(zip(dst.tolist(), src.tolist())):
        if d in written or (not use_imm and s in written):
            cuts.append(i)
            written = set()
        written.add(d)
    cuts.append(len(dst))
    return [slice(lo, hi) for lo, hi in zip(cuts, cuts[1:])]


def alu_apply(op: AluOp, a: np.ndarray, b: np.ndarray, acc_width: int) -> np.ndarray:
    """One ALU operation on acc_width two's-complement values (see AluOp for the definitions)."""
    a = a.astype(np.int64)
    b = np.asarray(b)
    if b.size > 1 and (b == b.flat[0]).all():
        # one operand for every element (an immediate, a tile's requantization operand): a scalar,
        # so only the accumulator side costs array operations
        b = np.int64(wrap(b.flat[0], acc_width))
    else:
        b = wrap(b, acc_width).astype(np.int64)
    if op == AluOp.MIN:
        r = np.minimum(a, b)
    elif op == AluOp.MAX:
        r = np.maximum(a, b)
    elif op == AluOp.ADD:
        r = a + b
    elif op == AluOp.MUL:
        r = a * b  # |a*b| < 2^62 for acc_width <= 32
    elif op == AluOp.SHR:
        sbits = acc_width.bit_length()  # log2(acc_width) + 1
        s = b & ((1 << sbits) - 1)
        s = np.where(s >= 1 << (sbits - 1), s - (1 << sbits), s)
        r = np.where(s >= 0, a >> np.maximum(s, 0), a << np.maximum(-s, 0))
    elif op == AluOp.CLIP:
        nb = wrap(-b, acc_width).astype(np.int64)
        r = np.minimum(np.maximum(a, nb), b)
    elif op in (AluOp.MOV, AluOp.FLUSH):   # FLUSH's accumulator side; its output side is flush_requant
        r = np.broadcast_to(b, a.shape)
    elif op in (AluOp.CLAMP, AluOp.REQUANT):
        lo, hi = ((b & 0xFF) ^ 0x80) - 0x80, (((b >> 8) & 0xFF) ^ 0x80) - 0x80
        if op == AluOp.REQUANT and acc_width >= 22:
            s = (b >> 16) & 31
            half = ((b >> 21) & 1) * (np.left_shift(1, s) >> 1)          # 2^(s-1), 0 for s = 0
            m = 1 << acc_width                                          # wrap in int64: no casts
            a = (((a + half + (m >> 1)) & (m - 1)) - (m >> 1)) >> s
        r = np.minimum(np.maximum(a, lo), hi)
    elif op == AluOp.SCALE:
        r = scale_fixed(a, b & ((1 << acc_width) - 1), acc_width)
    else:
        raise SimError(f"unknown ALU op {op!r}")
    return wrap(r, acc_width)


_I32_OPS = {AluOp.MIN: np.minimum, AluOp.MAX: np.maximum, AluOp.ADD: np.add, AluOp.MUL: np.multiply}


def alu_apply_int32(op: AluOp, a: np.ndarray, b) -> np.ndarray | None:
    """alu_apply for a 32-bit accumulator computed in int32, whose array arithmetic wraps as the
    ALU's does: a fraction of the int64 path's passes over a layer-sized tile. None where it does
    not apply (SCALE; a per-element operand for anything but MIN, MAX, ADD, MUL): alu_apply then.
    a: int32 entries (not modified); b: an int64 scalar, or an array broadcasting against a."""
    b = np.asarray(b)
    if b.ndim and (b == b.flat[0]).all():
        b = b.flat[0]
    if b.ndim and op in _I32_OPS:
        return _I32_OPS[op](a, b.astype(np.int64).astype(np.int32))     # astype wraps to 32 bits
    if b.ndim:
        return None
    v = int(b) & 0xFFFFFFFF
    v -= (v >> 31) << 32                                                # b as a signed 32-bit value
    if op in _I32_OPS:
        return _I32_OPS[op](a, np.int32(v))
    if op == AluOp.SHR:
        sh = ((v & 63) ^ 32) - 32                                       # the signed low 6 bits
        return a >> np.int32(sh) if sh >= 0 else (a << np.int32(-sh) if sh > -32 else np.zeros_like(a))
    if op in (AluOp.MOV, AluOp.FLUSH):
        return np.full_like(a, v)
    if op == AluOp.CLIP:
        nv = -v if v != -(1 << 31) else v                               # -b wrapped to 32 bits
        r = np.maximum(a, np.int32(nv))
        return np.minimum(r, np.int32(v), out=r)
    if op in (AluOp.CLAMP, AluOp.REQUANT):
        lo, hi = ((v & 0xFF) ^ 0x80) - 0x80, (((v >> 8) & 0xFF) ^ 0x80) - 0x80
        if op == AluOp.REQUANT:
            sh = (v >> 16) & 31
            r = a + np.int32((1 << sh >> 1) if v >> 21 & 1 else 0)       # the rounding term, wrapping
            r >>= np.int32(sh)
        else:
            r = a.copy()
        np.maximum(r, np.int32(lo), out=r)
        return np.minimum(r, np.int32(hi), out=r)
    return None


def flush_requant(a: np.ndarray, imm: int, acc_width: int) -> np.ndarray:
    """AluOp.FLUSH's output side: clamp((a + r) >> s, lo, hi) with s = imm[4:0], r = 2^(s-1) when
    imm[5] (the sum wrapping to acc_width bits), hi = imm[14:7] signed, lo = 0 if imm[6], else -hi if
    imm[15], else -hi-1."""
    s, hi = imm & 31, (((imm >> 7) & 0xFF) ^ 0x80) - 0x80
    lo = 0 if imm >> 6 & 1 else -hi if imm >> 15 & 1 else -hi - 1
    m = 1 << acc_width
    half = ((1 << s >> 1) if imm >> 5 & 1 else 0) & (m - 1)
    if a.dtype == np.int32 and acc_width == 32:   # int32 arithmetic wraps as the lane's sum does
        v = a + np.int32(half - (m if half >> 31 else 0))
        v >>= np.int32(s)
        np.maximum(v, np.int32(lo), out=v)
        return np.minimum(v, np.int32(hi), out=v)
    v = (((a.astype(np.int64) + (half + (m >> 1))) & (m - 1)) - (m >> 1)) >> s
    return np.clip(v, lo, hi)


def scale_fixed(a: np.ndarray, b_unsigned: np.ndarray, acc_width: int) -> np.ndarray:
    """AluOp.SCALE: sat((a * M + 2^(k-1)) >> k), M = b[23:0], k = b[29:24]. a * M < 2^55: int64 is exact."""
    m, k = b_unsigned & ((1 << 24) - 1), (b_unsigned >> 24) & 63
    half = np.where(k > 0, np.left_shift(1, np.maximum(k - 1, 0)), 0)
    v = (a * m + half) >> k
    return np.clip(v, -(1 << (acc_width - 1)), (1 << (acc_width - 1)) - 1)


def run_program(cfg: AccelConfig, dram: np.ndarray, insn_addr: int, insn_count: int) -> FsimStats:
    """Convenience: a fresh simulator runs one program."""
    return Fsim(cfg).run(dram, insn_addr, insn_count)
