"""ReadDMA: reads `count` consecutive entries of E bytes from DRAM, in one or more rows `stride`
bytes apart, and emits them one at a time.

Used by fetch (E = 16, instructions, one row), load (input/weight tiles) and compute (micro-ops
and accumulator tiles); E is picked per command from a static tuple (`sel`). Interfaces: a
start/addr/count/rows_minus1/stride/sel command, `busy`, the entry stream out_valid/out_data/
out_row_last/out_last (the consumer must take every entry the cycle it is offered), and a read
client of the AxiMaster.
Address side, command accepted in cycle c (start & ~busy): busy from c+1; the AR of the first
burst offered in c+1 and each next one in the cycle after the previous AR handshake, row after
row, without waiting for data (the AxiMaster bounds the bursts in flight). A row's bursts cover
exactly its beats (beat-aligned, at most min(256, 4096 / bus bytes) beats, never across 4 KiB).
Data side, independently: R beats are accepted as follows: if E >= bus bytes, every beat in
the cycle it arrives and an entry emitted with its last beat (so E/bus_bytes beats per entry);
if E < bus bytes, one entry per cycle, the beat held (RREADY low) until its last wanted entry of
the row is emitted. busy drops in the cycle after the last beat.
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from accel.isa import AccelConfig
from accel.isa.config import BOUNDARY_BYTES, SIZE_BITS

from .axi import ReadClientSignature


def log2(v: int) -> int:
    if v <= 0 or v & (v - 1):
        raise ValueError(f"expected a power of two, got {v}")
    return v.bit_length() - 1


class ReadDMA(wiring.Component):
    """Burst reader with a beat-to-entry unpacker.

    start (In): begin a command (ignored while busy or when count == 0); addr (In): byte
    address, a multiple of the selected entry size; count (In): entries per row; rows_minus1
    (In): rows after the first; stride (In): bytes from one row's start to the next's (a
    multiple of the entry size); sel (In): index into `elem_sizes`. busy (Out). out_valid /
    out_data (low E*8 bits hold the entry) / out_row_last (last of its row) / out_last (last
    of the command) (Out). bus: read client.
    """

    def __init__(self, cfg: AccelConfig, elem_sizes: tuple[int, ...], count_width: int = SIZE_BITS,
                 rows_width: int = 1):
        for e in elem_sizes:
            log2(e)
        self.cfg, self.elem_sizes, self.count_width = cfg, tuple(elem_sizes), count_width
        self.max_bits = max(elem_sizes) * 8
        super().__init__({
            "start": In(1), "addr": In(cfg.dram_addr_width), "count": In(count_width),
            "rows_minus1": In(rows_width), "stride": In(cfg.dram_addr_width),
            "sel": In(range(max(2, len(elem_sizes)))),
            "busy": Out(1), "out_valid": Out(1), "out_data": Out(self.max_bits), "out_row_last": Out(1),
            "out_last": Out(1), "bus": Out(ReadClientSignature(cfg))})

    def _first_pos(self, m, row_addr, sel):
        """Index of a row's first entry within its first beat (entries smaller than a beat)."""
        B, lb = self.cfg.bus_bytes, log2(self.cfg.bus_bytes)
        first_pos = Signal(range(max(2, B)))
        with m.Switch(sel):
            for i, e in enumerate(self.elem_sizes):
                with m.Case(i):
                    if e < B:
                        m.d.comb += first_pos.eq(row_addr[log2(e):lb])
        return first_pos

    def _row_beats(self, m, row_addr, count, sel):
        """Beats covering count (> 0) entries from row_addr: (offset in the first beat + bytes
        + B - 1) / B, which needs only the address's low bits (a narrow adder: this feeds ARLEN)."""
        B, lb = self.cfg.bus_bytes, log2(self.cfg.bus_bytes)
        sizes = self.elem_sizes
        nbytes = Signal(self.count_width + log2(max(sizes)) + 1)
        with m.Switch(sel):
            for i, e in enumerate(sizes):
                with m.Case(i):
                    m.d.comb += nbytes.eq(count << log2(e))
        span = Signal(len(nbytes) + 1)
        m.d.comb += span.eq(row_addr[:lb] + nbytes + (B - 1))
        beats = Signal(range(((1 << self.count_width) * max(sizes)) // B + 3))
        m.d.comb += beats.eq(span >> lb)
        return beats

    def elaborate(self, platform):
        m = Module()
        cfg, bus = self.cfg, self.bus
        B, lb = cfg.bus_bytes, log2(cfg.bus_bytes)
        aw = cfg.dram_addr_width
        sizes = self.elem_sizes
        wide_sizes = [e for e in sizes if e >= B]
        sr_bits = max(wide_sizes) * 8 if wide_sizes else 0
        maxb = cfg.max_burst_beats
        rw = len(self.rows_minus1)

        accept = Signal()
        m.d.comb += accept.eq(self.start & ~self.busy & (self.count != 0))
        sel = Signal.like(self.sel)
        stride = Signal(aw)
        count = Signal(self.count_width)
        with m.If(accept):
            m.d.sync += [sel.eq(self.sel), stride.eq(self.stride), count.eq(self.count)]

        # ---- address side: one AR per cycle while bursts remain ----------------------------------
        ar_active = Signal()
        ar_row = Signal(aw)                     # byte address of the row being requested
        ar_rows_left = Signal(rw)               # rows after it
        new_row = Signal()                      # ar_row's first burst is next: derive it from ar_row
        next_addr = Signal(aw)                  # beat-aligned address of the next burst (not new_row)
        row_beats = self._row_beats(m, ar_row, count, sel)
        beats_left = Signal.like(row_beats)
        beats_eff, addr_eff = Signal.like(beats_left), Signal(aw)
        m.d.comb += [beats_eff.eq(Mux(new_row, row_beats, beats_left)),
                     addr_eff.eq(Mux(new_row, Cat(Const(0, lb), ar_row[lb:]), next_addr))]
        to_boundary = Signal(range(BOUNDARY_BYTES // B + 1))
        m.d.comb += to_boundary.eq((BOUNDARY_BYTES // B) - addr_eff[lb:log2(BOUNDARY_BYTES)])
        cap = Signal(range(maxb + 1))
        blen = Signal(range(maxb + 1))
        m.d.comb += [cap.eq(Mux(to_boundary < maxb, to_boundary, maxb)),
                     blen.eq(Mux(beats_eff < cap, beats_eff, cap))]
        m.d.comb += [bus.ar_valid.eq(ar_active), bus.ar_addr.eq(addr_eff), bus.ar_len.eq(blen - 1)]
        with m.If(accept):
            m.d.sync += [ar_active.eq(1), ar_row.eq(self.addr), ar_rows_left.eq(self.rows_minus1), new_row.eq(1)]
        with m.Elif(ar_active & bus.ar_ready):
            m.d.sync += [next_addr.eq(addr_eff + (blen << lb)), beats_left.eq(beats_eff - blen), new_row.eq(0)]
            with m.If(beats_eff == blen):       # the row's last burst
                with m.If(ar_rows_left == 0):
                    m.d.sync += ar_active.eq(0)
                with m.Else():
                    m.d.sync += [ar_row.eq(ar_row + stride), ar_rows_left.eq(ar_rows_left - 1), new_row.eq(1)]

        # ---- data side: entries of each row in turn ----------------------------------------------
        rx_active = Signal()
        rx_row = Signal(aw)                     # byte address of the row being received
        rx_rows_left = Signal(rw)
        entries_left = Signal(self.count_width)  # of the row being received
        one_left = Signal()                     # entries_left == 1, kept as a register: it drives RREADY
        pos = Signal(range(max(2, B)))          # entry index within the current beat (E < B)
        k = Signal(range(max(2, max(sizes) // B + 1)))  # beat index within the entry (E >= B)
        sr = Signal(max(1, sr_bits))
        first_pos_cmd = self._first_pos(m, self.addr, self.sel)
        next_rx_row = Signal(aw)
        m.d.comb += next_rx_row.eq(rx_row + stride)
        first_pos_next = self._first_pos(m, next_rx_row, sel)
        with m.If(accept):
            m.d.sync += [rx_active.eq(1), rx_row.eq(self.addr), rx_rows_left.eq(self.rows_minus1),
                         entries_left.eq(self.count), one_left.eq(self.count == 1), pos.eq(first_pos_cmd), k.eq(0)]
        with m.If(rx_active):
            with m.Switch(sel):
                for i, e in enumerate(sizes):
                    with m.Case(i):
                        self._unpack(m, e, B, sr, sr_bits, k, pos, one_left)
        row_end = self.out_valid & one_left
        m.d.comb += [self.out_row_last.eq(row_end), self.out_last.eq(row_end & (rx_rows_left == 0))]
        with m.If(self.out_valid):
            m.d.sync += [entries_left.eq(entries_left - 1), one_left.eq(entries_left == 2)]
        with m.If(row_end):
            with m.If(rx_rows_left == 0):
                m.d.sync += rx_active.eq(0)
            with m.Else():
                m.d.sync += [rx_row.eq(next_rx_row), rx_rows_left.eq(rx_rows_left - 1),
                             entries_left.eq(count), one_left.eq(count == 1), pos.eq(first_pos_next), k.eq(0)]
        m.d.comb += self.busy.eq(ar_active | rx_active)
        return m

    def _unpack(self, m, e, B, sr, sr_bits, k, pos, one_left):
        bus, eb, bb = self.bus, e * 8, B * 8
        if e >= B:
            per = e // B
            new_sr = Cat(sr[bb:sr_bits], bus.r_data)
            m.d.comb += [bus.r_ready.eq(1), self.out_data.eq(new_sr[sr_bits - eb:sr_bits])]
            with m.If(bus.r_valid):
                m.d.sync += [sr.eq(new_sr), k.eq(Mux(k == per - 1, 0, k + 1))]
                m.d.comb += self.out_valid.eq(k == per - 1)
        else:
            per = B // e
            m.d.comb += [bus.r_ready.eq((pos == per - 1) | one_left),
                         self.out_data.eq(bus.r_data.word_select(pos[:(per - 1).bit_length()], eb)),
                         self.out_valid.eq(bus.r_valid)]
            with m.If(bus.r_valid):
                m.d.sync += pos.eq(Mux(bus.r_ready, 0, pos + 1))
