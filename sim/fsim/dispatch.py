"""Fetch, the three decoupled stages and the four token queues: which instruction runs when.

Fetch decodes the stream and dispatches in order to each stage's command queue (stalling when
one is full); each stage pops its instruction's tokens, runs it, and pushes. The routing of
flags to queues is accel.isa.deps'; a program whose tokens can never be satisfied is reported
as a deadlock naming each blocked instruction and its queue.
"""
from __future__ import annotations

import functools
import logging
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from accel.hw.params import ErrorCode, static_fault
from accel.isa import AccelConfig, Alu, Epilogue, Finish, Gemm, Insn, Load, Stage, Store, decode_program
from accel.isa.deps import QUEUES, token_queue
from accel.isa.errors import EncodingError
from accel.isa.isa import INSN_BYTES, decode_insn

from ..errors import DeadlockError, ExecError, ProgramFault, SimError
from ..races import RaceChecker
from .blas import blas_threads
from .memory import check_dram
from .stats import FsimStats

log = logging.getLogger("sim.fsim")


@functools.lru_cache(maxsize=None)
def _routing(stage: Stage, opcode, pop_prev: bool, pop_next: bool, push_prev: bool, push_next: bool):
    """(stage, op name, queues popped, queues pushed) of an instruction, by its routing fields: a
    program has a handful of distinct ones, so the scheduler's per-run tables cost a lookup each."""
    pops = [token_queue(stage, f) for f, on in (("pop_prev", pop_prev), ("pop_next", pop_next)) if on]
    pushes = [token_queue(stage, f) for f, on in (("push_prev", push_prev), ("push_next", push_next)) if on]
    return stage, opcode.name, pops, pushes


@dataclass
class _StageState:
    queue: deque = field(default_factory=deque)  # indices of instructions fetched, not yet started
    current: int | None = None                    # index of the instruction started
    popped: bool = False
    executed: bool = False


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



class Dispatch:
    """Fsim's top level: run a program through fetch and the stages (a mixin of Fsim, whose
    _load, _store, _gemm, _alu and _set_epilogue execute the instructions)."""

    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int, max_insns: int | None = None) -> FsimStats:
        """Execute insn_count instructions at byte address insn_addr of `dram` (uint8, in place)."""
        check_dram(dram)
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
        check_dram(dram)
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


    def _set_epilogue(self, idx: int, insn: Epilogue, dram: np.ndarray, stats: FsimStats) -> None:
        self.epilogue = insn
