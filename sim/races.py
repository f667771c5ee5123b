"""A happens-before checker for the dependency-token protocol, run inside the functional simulator.

The three stages run concurrently on the hardware (and in tsim); only dependency tokens order
them. fsim executes one valid interleaving, so a program that forgets a token can still give the
right bytes there, and on tsim or the RTL too when the timing happens to hide it. This checker
finds such races whatever the timing: each stage keeps a vector clock (one counter per stage),
a token carries its producer's clock to the consumer, and every on-chip buffer entry remembers
the clock of its last write and of each stage's last read. An access by one stage that another
stage's earlier access of the same entry does not happen before (a read of an entry written by
another stage, or a write of an entry another stage wrote or read) is a race, reported with both
instructions. It is the FastTrack scheme with three threads and FIFO channels.

DRAM is tracked by byte ranges: each LOAD's and STORE's rows (an instruction's bounding range
first, its rows only where those overlap), so a load of bytes a store of another stage writes, or a
store over bytes another stage still reads, needs a token chain between them too.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from accel.isa import Stage

from .errors import SimError

_STAGES = (Stage.LOAD, Stage.COMPUTE, Stage.STORE)
_INDEX = {s: i for i, s in enumerate(_STAGES)}


def _entries(entries) -> np.ndarray:
    """entries: a slice, or an array of distinct entries."""
    if isinstance(entries, slice):
        return np.arange(entries.start, entries.stop)
    return entries


class RaceError(SimError):
    """Two stages access one buffer entry without a token ordering them."""


class RaceChecker:
    """The happens-before state of one program run: fsim calls pop/begin/push as its scheduler moves
    tokens and starts instructions, and read/write/dram_access for each instruction's accesses.
    depths: entries of each on-chip buffer by name (uop, inp, wgt, acc, out)."""

    def __init__(self, depths: dict[str, int]):
        self.clock = np.zeros((3, 3), np.int64)   # clock[stage] = that stage's vector clock
        self.tokens: dict[str, deque] = {}
        # per buffer: the last writer's stage (-1: none) and clock; each stage's last read clock
        self.w_stage = {b: np.full(d, -1, np.int8) for b, d in depths.items()}
        self.w_clock = {b: np.zeros(d, np.int64) for b, d in depths.items()}
        self.w_insn = {b: np.full(d, -1, np.int64) for b, d in depths.items()}
        self.r_clock = {b: np.zeros((3, d), np.int64) for b, d in depths.items()}
        self.r_insn = {b: np.full((3, d), -1, np.int64) for b, d in depths.items()}
        self.stage, self.insn, self.describe = 0, -1, None
        # DRAM accesses per kind ("read", "write"): bounding ranges, stage, clock and instruction as
        # growing arrays (the first n rows in use), and each access's row ranges
        self.dram = {k: {"n": 0, "meta": np.zeros((64, 5), np.int64), "rows": []} for k in ("read", "write")}

    # ---- the scheduler's hooks
    def pop(self, stage: Stage, queue: str) -> None:
        """`stage` took a token from `queue`: it now knows all its producer knew when it pushed."""
        np.maximum(self.clock[_INDEX[stage]], self.tokens[queue].popleft(), out=self.clock[_INDEX[stage]])

    def begin(self, stage: Stage, idx: int, describe) -> None:
        """`stage` starts instruction idx (describe(i) names instruction i in a report)."""
        self.stage, self.insn, self.describe = _INDEX[stage], idx, describe
        self.clock[self.stage, self.stage] += 1

    def push(self, stage: Stage, queue: str) -> None:
        self.tokens.setdefault(queue, deque()).append(self.clock[_INDEX[stage]].copy())

    # ---- accesses of the instruction begun last
    def read(self, buf: str, entries) -> None:
        e = _entries(entries)
        self._against_writes(buf, e, "reads")
        self.r_clock[buf][self.stage, e] = self.clock[self.stage, self.stage]
        self.r_insn[buf][self.stage, e] = self.insn

    def write(self, buf: str, entries) -> None:
        e = _entries(entries)
        self._against_writes(buf, e, "writes")
        me = self.clock[self.stage]
        for s in range(3):
            if s != self.stage:
                late = self.r_clock[buf][s, e] > me[s]
                if late.any():
                    k = e[np.argmax(late)]
                    self._report(buf, k, "writes", "read", _STAGES[s], int(self.r_insn[buf][s, k]))
        self.w_stage[buf][e] = self.stage
        self.w_clock[buf][e] = me[self.stage]
        self.w_insn[buf][e] = self.insn

    def dram_access(self, kind: str, starts: np.ndarray, ends: np.ndarray) -> None:
        """The instruction begun last reads ("read") or writes ("write") DRAM bytes [starts[i], ends[i])."""
        if not starts.size:
            return
        lo, hi = int(starts.min()), int(ends.max())
        me = self.clock[self.stage]
        against = (("write", "wrote"),) if kind == "read" else (("write", "wrote"), ("read", "read"))
        for other, verb in against:
            d = self.dram[other]
            m = d["meta"][:d["n"]]   # lo, hi, stage, clock, insn
            late = (m[:, 2] != self.stage) & (m[:, 0] < hi) & (lo < m[:, 1]) & (m[:, 3] > me[m[:, 2]])
            for k in np.flatnonzero(late):
                o_starts, o_ends = d["rows"][k]
                hit = (starts[:, None] < o_ends[None, :]) & (o_starts[None, :] < ends[:, None])
                if hit.any():
                    i, j = np.argwhere(hit)[0]
                    at = max(int(starts[i]), int(o_starts[j]))
                    self._report("DRAM", f"byte {at:#x}", f"{kind}s", verb, _STAGES[int(m[k, 2])], int(m[k, 4]))
        d = self.dram[kind]
        if d["n"] == len(d["meta"]):
            d["meta"] = np.concatenate([d["meta"], np.zeros_like(d["meta"])])
        d["meta"][d["n"]] = (lo, hi, self.stage, me[self.stage], self.insn)
        d["n"] += 1
        d["rows"].append((starts, ends))

    def _against_writes(self, buf: str, e: np.ndarray, verb: str) -> None:
        ws = self.w_stage[buf][e]
        other = (ws >= 0) & (ws != self.stage)
        if not other.any():
            return
        known = self.clock[self.stage][np.where(other, ws, 0)]
        late = other & (self.w_clock[buf][e] > known)
        if late.any():
            k = e[np.argmax(late)]
            self._report(buf, k, verb, "wrote", _STAGES[int(self.w_stage[buf][k])], int(self.w_insn[buf][k]))

    def _report(self, buf, entry, verb, other_verb, other_stage, other_insn):
        me = _STAGES[self.stage].name.lower()
        where = f"{buf} {entry}" if buf == "DRAM" else f"{buf} buffer entry {int(entry)}"
        raise RaceError(
            f"race on {where}: instruction {self.insn} ({self.describe(self.insn)}, "
            f"{me} stage) {verb} it, and instruction {other_insn} ({self.describe(other_insn)}, "
            f"{other_stage.name.lower()} stage) {other_verb} it with no dependency token ordering the two")
