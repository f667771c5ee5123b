"""Timing of the accelerator's queues (accel/hw/queues.py: amaranth SyncFIFOBuffered) from their
write and read cycles, without stepping cycles.

The FIFO is an inner memory of depth-1 entries plus an output register. With W[j] the cycle entry
j is written and R[j] the cycle it is read:
  entry j is visible to the reader from V[j] = max(W[j] + 2, R[j-1] + 1);
  the writer may write in cycle t iff the inner level, #{W < t} - #{j: V[j] <= t}, is < depth-1
  (so a read in cycle t frees a slot from t + 1, and a full queue holds `depth` entries).
Writes and reads are recorded in the cycle they happen; each side has one waiter slot, called
(one shot) with the cycle of the other side's next write or read.
"""
from __future__ import annotations

from bisect import bisect_left


class TimedFifo:
    __slots__ = ("name", "depth", "W", "R", "cons_wait", "prod_wait")

    def __init__(self, name: str, depth: int):
        self.name, self.depth = name, depth
        self.W: list[int] = []
        self.R: list[int] = []
        self.cons_wait = None   # called with the cycle of the next write
        self.prod_wait = None   # called with the cycle of the next read

    def visible_at(self, j: int) -> int:
        """Cycle from which entry j (written; entry j-1 read) is at the reader's side."""
        v = self.W[j] + 2
        if j:
            r = self.R[j - 1] + 1
            if r > v:
                return r
        return v

    def can_write(self, t: int) -> bool:
        """Space for a write in cycle t (writes and reads of cycles < t decide it)."""
        W, R = self.W, self.R
        nw = len(W)
        before = nw if not nw or W[-1] < t else bisect_left(W, t)
        nr = len(R)
        vis = nr
        if nr < nw and W[nr] + 2 <= t and (nr == 0 or R[nr - 1] < t):
            vis += 1
        return before - vis < self.depth - 1

    def retry_time(self, t: int) -> int | None:
        """After can_write(t) failed: the next cycle space may appear without a new read (the head
        entry moving to the output register frees an inner slot, or a read of cycle t already
        recorded), or None: space needs a read not yet made (wait for prod_wait)."""
        nr = len(self.R)
        if nr < len(self.W):
            v = self.visible_at(nr)
            if v > t:
                return v
        return None

    def level(self, t: int) -> int:
        """Entries held at the start of cycle t (the `level` port)."""
        return bisect_left(self.W, t) - bisect_left(self.R, t)

    def write(self, t: int) -> None:
        self.W.append(t)
        cb = self.cons_wait
        if cb is not None:
            self.cons_wait = None
            cb(t)

    def read(self, t: int) -> None:
        self.R.append(t)
        cb = self.prod_wait
        if cb is not None:
            self.prod_wait = None
            cb(t)
