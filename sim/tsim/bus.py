"""The AXI read path: ReadDMA bursts (accel/hw/dma.py), the round-robin arbiter with up to
read_outstanding bursts in flight (accel/hw/axi.py) and the DRAM's read timing (sim/dram.py), one
event per burst.

A DMA command (addr, count entries of E bytes, per row) becomes bursts (beat-aligned, at most
max_burst_beats, never across 4 KiB). A client requests AR from cycle q (the cycle after its
command, or after its previous AR handshake); the arbiter grants in cycle g >= q while fewer than
read_outstanding bursts are in flight (a burst counts up to its RLAST cycle), the first requester
in round-robin order after the last one granted, one grant per cycle. The data of a burst starts
at g + read_latency (throttled: not before the previous burst's data is produced); beat k is
available from that start + offset(k); it moves when available, not before the cycle after the
previous beat (of any burst) moved, and stays on the bus for as many cycles as it carries wanted
entries when E < B (the DMA emits one entry per cycle and holds the beat).
"""
from __future__ import annotations

from collections import deque
from functools import lru_cache

from accel.isa.config import BOUNDARY_BYTES

from ..dram import DramModel

ARBITRATE = 1   # event priority: after every other event of the same cycle


def plan_bursts(addr: int, count: int, E: int, B: int, maxb: int) -> list[tuple[int, tuple[int, ...] | None]]:
    """Bursts of a DMA command: (beats, wanted entries per beat or None when E >= B (one beat each
    of E/B per entry)). Depends on addr only modulo 4 KiB (memoized on that)."""
    base = addr - addr % BOUNDARY_BYTES
    return _plan(addr - base, count, E, B, maxb)


@lru_cache(maxsize=1 << 14)
def _plan(addr: int, count: int, E: int, B: int, maxb: int) -> tuple:
    first = addr - addr % B
    end = addr + count * E
    total = (end - 1) // B - first // B + 1
    out = []
    a = first
    if E >= B:
        while total:
            n = min(total, maxb, BOUNDARY_BYTES // B - (a % BOUNDARY_BYTES) // B)
            out.append((n, None))
            a += n * B
            total -= n
        return tuple(out)
    pos = addr
    while total:
        n = min(total, maxb, BOUNDARY_BYTES // B - (a % BOUNDARY_BYTES) // B)
        pk = []
        for _ in range(n):
            hi = min(a + B, end)
            pk.append((hi - max(a, pos)) // E)
            pos = hi
            a += B
        out.append((n, tuple(pk)))
        total -= n
    return out


@lru_cache(maxsize=1 << 14)
def row_plan(addr: int, count: int, E: int, B: int, maxb: int) -> tuple[tuple[int, tuple | None, int], ...]:
    """The bursts of a loader row, addr modulo 4 KiB: _plan's as (beats, wanted entries per beat,
    cycles from the first beat to RLAST on an unthrottled bus: one per beat, or one per wanted
    entry when E < B)."""
    return tuple((n, per, n if per is None else sum(per)) for n, per in _plan(addr, count, E, B, maxb))


class ReadBus:
    """Arbiter + DRAM read timing. Clients are 0 fetch, 1 load, 2 compute (accel/hw/top.py order)."""

    __slots__ = ("loop", "L", "B", "bpc", "throttled", "pending", "last", "n", "beats", "log", "arb_at",
                 "granting", "rlasts", "r_free", "data_end", "g_last")

    def __init__(self, loop, dram: DramModel, bus_bytes: int, n_clients: int = 3, log: list | None = None,
                 outstanding: int = 1):
        self.loop, self.L, self.B = loop, dram.read_latency, bus_bytes
        self.bpc = dram.bytes_per_cycle
        self.throttled = dram.throttled(bus_bytes)
        self.n = n_clients
        self.pending: list = [None] * n_clients   # per client: (q, on_grant) or None
        self.last = n_clients - 1
        self.beats = 0
        self.log = log                            # (client, grant, rlast) per burst, when tracing
        self.arb_at = None                        # cycle of the one live arbitration event
        self.granting = False
        self.rlasts = deque(maxlen=outstanding)   # RLAST cycles of the latest bursts (they come in order)
        self.r_free = 0                           # the next R beat moves from this cycle on
        self.data_end = 0                         # throttled: the DRAM has produced the last burst's data
        self.g_last = -1                          # cycle of the last grant (one AR per cycle)

    @property
    def free_from(self) -> int:
        """First cycle a burst slot is free: the cycle after the RLAST of the oldest of the latest
        read_outstanding bursts (all of them are in flight until then)."""
        r = self.rlasts
        f = r[0] + 1 if len(r) == r.maxlen else 0
        return f if f > self.g_last else self.g_last + 1

    def request(self, client: int, q: int, on_grant) -> None:
        """Client requests AR from cycle q; on_grant(g) returns the burst's RLAST cycle."""
        self.pending[client] = (q, on_grant)
        if not self.granting:
            ff = self.free_from
            t = q if q > ff else ff
            if self.arb_at is None or t < self.arb_at:
                self.arb_at = t
                self.loop.at(t, self._arbitrate, None, ARBITRATE)

    def _arbitrate(self, T: int, _=None) -> None:
        if T != self.arb_at:
            return                                # superseded by an earlier arbitration
        self.arb_at = None
        pend = self.pending
        n = self.n
        loop = self.loop
        while True:
            for i in range(1, n + 1):
                c = (self.last + i) % n
                p = pend[c]
                if p is not None and p[0] <= T:
                    pend[c] = None
                    self.last = c
                    self.granting = True
                    f = p[1](T)
                    self.granting = False
                    self.rlasts.append(f)
                    self.g_last = T
                    if self.log is not None:
                        self.log.append((c, T, f))
                    break
            nxt = None
            waiting = 0
            ff = self.free_from
            for r in pend:
                if r is not None:
                    waiting += 1
                    q = r[0] if r[0] > ff else ff
                    nxt = q if nxt is None or q < nxt else nxt
            if nxt is None:
                return
            heap = loop.heap
            if waiting == 1 and (not heap or heap[0][0] > nxt) and nxt <= loop.limit:
                T = nxt       # no event before nxt can add a rival request: grant it without the heap
                continue
            self.arb_at = nxt
            loop.at(nxt, self._arbitrate, None, ARBITRATE)
            return

    def _start(self, g: int, beats: int) -> int:
        """Cycle the data of a burst granted in g starts (sim/dram.py)."""
        first = g + self.L
        if self.throttled:
            if first < self.data_end:
                first = self.data_end
            self.data_end = first + (beats * self.B) // self.bpc
        return first

    def burst_times(self, g: int, beats: int, per_beat: tuple[int, ...] | None) -> int:
        """RLAST cycle of a burst granted in cycle g (counts its beats)."""
        self.beats += beats
        first = self._start(g, beats)
        if not self.throttled:
            if first < self.r_free:
                first = self.r_free
            f = first + (beats if per_beat is None else sum(per_beat)) - 1
            self.r_free = f + 1
            return f
        B, bpc = self.B, self.bpc
        f = self.r_free - 1
        for k in range(beats):
            v = first + (k * B) // bpc
            if v <= f:
                v = f + 1
            f = v + (per_beat[k] - 1 if per_beat is not None else 0)
        self.r_free = f + 1
        return f

    def beat_times(self, g: int, beats: int, per_beat) -> list[int]:
        """Cycle each beat of a burst granted in g moves (E < B: the first of its held cycles);
        counts its beats. The last beat's last cycle is its RLAST."""
        self.beats += beats
        B, bpc, thr = self.B, self.bpc, self.throttled
        first = self._start(g, beats)
        out = []
        f = self.r_free - 1
        for k in range(beats):
            v = first + ((k * B) // bpc if thr else 0)
            if v <= f:
                v = f + 1
            out.append(v)
            f = v + (per_beat[k] - 1 if per_beat is not None else 0)
        self.r_free = f + 1
        return out

    def entry_times(self, g: int, beats: int, per_beat, E: int, k0: int) -> tuple[list[int], int, int]:
        """Cycles each entry of a burst is emitted (fetch needs them), the RLAST cycle, and the beat
        index within the current entry after the burst (E >= B: entries may span bursts)."""
        moves = self.beat_times(g, beats, per_beat)
        times = []
        if per_beat is None:
            per = E // self.B
            k = k0
            for v in moves:
                k += 1
                if k == per:
                    times.append(v)
                    k = 0
            return times, moves[-1], k
        for v, p in zip(moves, per_beat):
            times.extend(range(v, v + p))
        return times, times[-1], 0


def dma_bursts(cfg, addr: int, count: int, E: int):
    """plan_bursts for the config's bus."""
    return plan_bursts(addr, count, E, cfg.bus_bytes, cfg.max_burst_beats)
