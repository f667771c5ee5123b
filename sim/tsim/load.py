"""TileLoader timing (accel/hw/load.py): the data rows as one ReadDMA command on the read bus, the
padding zeros written in the cycles the data leaves the buffer's write port free.

After `start` in cycle s: the bursts of every data row, row after row, are requested from s+1,
each next one from the cycle after the previous grant; each data entry is written in the cycle
the DMA emits it (E >= B: with its last beat; E < B: one per cycle while its beat is held). The
padding walker, when the tile has padding (or no data), takes one step per cycle from s+1 in
row-major order: a padding entry is written in the first cycle at or after its turn that has no
data write, and a data row without padding columns is one step without a write. The unit is
busy until the cycle after the last write or step.
"""
from __future__ import annotations

from accel.isa.config import BOUNDARY_BYTES

from .bus import row_plan


class TileLoad:
    """One TileLoader (the load stage's, or compute's for UOP/ACC) on read-bus client `client`."""

    __slots__ = ("m", "client", "insn", "E", "s", "row", "bursts", "bi", "done", "addr0", "step", "walk",
                 "writes", "last")

    def __init__(self, model, client: int):
        self.m, self.client = model, client

    def start(self, s: int, insn, done) -> None:
        """Begin a LOAD whose start pulse is in cycle s; done(c) with c the first idle cycle."""
        n_rows = insn.y_pad0 + insn.y_size + insn.y_pad1
        n_cols = insn.x_pad0 + insn.x_size + insn.x_pad1
        if n_rows == 0 or n_cols == 0:
            done(s + 1)
            return
        if insn.y_size == 0 or insn.x_size == 0:
            done(s + 1 + n_rows * n_cols)          # padding only, one entry per cycle
            return
        self.insn, self.done, self.s = insn, done, s
        self.E = E = self.m.elem_bytes[insn.mem_type]
        self.addr0, self.step = insn.dram_base * E, insn.x_stride * E
        self.walk = bool(insn.y_pad0 or insn.y_pad1 or insn.x_pad0 or insn.x_pad1)
        self.writes = [] if self.walk else None    # data write cycles, when padding must avoid them
        self.row = 0
        self.bursts, self.bi = self._row_bursts(0), 0
        self.m.bus.request(self.client, s + 1, self._granted)

    def _row_bursts(self, row: int):
        cfg = self.m.cfg
        return row_plan((self.addr0 + row * self.step) % BOUNDARY_BYTES, self.insn.x_size, self.E, cfg.bus_bytes,
                        cfg.max_burst_beats)

    def _granted(self, g: int) -> int:
        bus = self.m.bus
        nb, per, _span = self.bursts[self.bi]
        if self.writes is None:
            f = bus.burst_times(g, nb, per)
        else:
            moves = bus.beat_times(g, nb, per)
            w = self.writes
            if per is None:
                k = self.E // self.m.cfg.bus_bytes
                w.extend(moves[k - 1::k])
            else:
                for v, p in zip(moves, per):
                    w.extend(range(v, v + p))
            f = w[-1]
        self.bi += 1
        if self.bi == len(self.bursts):
            self.row += 1
            if self.row == self.insn.y_size:
                self.done(max(f, self._walk_end()) + 1 if self.walk else f + 1)
                return f
            self.bursts, self.bi = self._row_bursts(self.row), 0
        bus.request(self.client, g + 1, self._granted)
        return f

    def _walk_end(self) -> int:
        """Last cycle of the padding walker, given the data write cycles (increasing)."""
        insn = self.insn
        n_cols = insn.x_pad0 + insn.x_size + insn.x_pad1
        side = insn.x_pad0 + insn.x_pad1
        D = self.writes
        nd, di = len(D), 0
        t = self.s + 1
        segments = [(n_cols, insn.y_pad0)] + ([(side, insn.y_size)] if side else [(0, insn.y_size)]) + \
                   [(n_cols, insn.y_pad1)]
        for width, rows in segments:
            if width == 0:            # data rows without padding columns: a step each, never blocked
                t += rows
                continue
            for _ in range(width * rows):
                while di < nd and D[di] < t:
                    di += 1
                while di < nd and D[di] == t:
                    t += 1
                    di += 1
                t += 1
        return t - 1
