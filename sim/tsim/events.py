"""The discrete-event loop of the timing model: callbacks ordered by (cycle, priority, insertion)."""
from __future__ import annotations

from heapq import heappop, heappush


class EventLoop:
    __slots__ = ("heap", "seq", "now", "events", "limit")

    def __init__(self):
        self.heap: list = []
        self.limit = 1 << 62        # the cycle limit of the current run (handlers that skip the heap honour it)
        self.seq = 0
        self.now = 0
        self.events = 0

    def at(self, t: int, fn, arg=None, prio: int = 0) -> None:
        self.seq += 1
        heappush(self.heap, (t, prio, self.seq, fn, arg))

    def run(self, limit: int) -> bool:
        """Run until no events are left (True) or the next one lies past `limit` (False)."""
        heap = self.heap
        self.limit = limit
        n = 0
        while heap:
            t, _, _, fn, arg = heappop(heap)
            if t > limit:
                heappush(heap, (t, 0, 0, fn, arg))
                self.events += n
                return False
            self.now = t
            fn(t, arg)
            n += 1
        self.events += n
        return True
