"""ReadDMA: reads `count` consecutive entries of E bytes from DRAM and emits them one at a time.

Used by fetch (E = 16, instructions), load (input/weight tiles) and compute (micro-ops and
accumulator tiles); E is picked per command from a static tuple (`sel`). Interfaces: a
start/addr/count/sel command, `busy`, the entry stream out_valid/out_data/out_last (the
consumer must take every entry the cycle it is offered), and a read client of the AxiMaster.
Timing, command accepted in cycle c (start & ~busy): busy from c+1; AR of the first burst
offered in c+1; one burst in flight at a time, the next AR offered in the cycle after the
previous burst's RLAST beat. R beats are accepted as follows: if E >= bus bytes, every beat
in the cycle it arrives and an entry emitted with its last beat (so E/bus_bytes beats per
entry); if E < bus bytes, one entry per cycle, the beat held (RREADY low) until its last
wanted entry is emitted. busy drops in the cycle after the last beat. Bursts: at most
min(256, 4096 / bus bytes) beats and never across a 4 KiB boundary.
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
    address, a multiple of the selected entry size; count (In): entries; sel (In): index into
    `elem_sizes`. busy (Out). out_valid / out_data (low E*8 bits hold the entry) / out_last
    (Out). bus: read client.
    """

    def __init__(self, cfg: AccelConfig, elem_sizes: tuple[int, ...], count_width: int = SIZE_BITS):
        for e in elem_sizes:
            log2(e)
        self.cfg, self.elem_sizes, self.count_width = cfg, tuple(elem_sizes), count_width
        self.max_bits = max(elem_sizes) * 8
        super().__init__({
            "start": In(1), "addr": In(cfg.dram_addr_width), "count": In(count_width),
            "sel": In(range(max(2, len(elem_sizes)))),
            "busy": Out(1), "out_valid": Out(1), "out_data": Out(self.max_bits), "out_last": Out(1),
            "bus": Out(ReadClientSignature(cfg))})

    def elaborate(self, platform):
        m = Module()
        cfg, bus = self.cfg, self.bus
        B, lb = cfg.bus_bytes, log2(cfg.bus_bytes)
        aw = cfg.dram_addr_width
        sizes = self.elem_sizes
        wide_sizes = [e for e in sizes if e >= B]
        sr_bits = max(wide_sizes) * 8 if wide_sizes else 0
        max_beats = ((1 << self.count_width) * max(sizes)) // B + 2
        maxb = cfg.max_burst_beats

        sel = Signal.like(self.sel)
        next_addr = Signal(aw)                  # beat-aligned address of the next burst
        beats_left = Signal(range(max_beats + 1))  # beats not yet requested
        entries_left = Signal(self.count_width)
        pos = Signal(range(max(2, B)))          # entry index within the current beat (E < B)
        k = Signal(range(max(2, max(sizes) // B + 1)))  # beat index within the entry (E >= B)
        sr = Signal(max(1, sr_bits))

        # ---- command: beats covering [addr, addr + count * E) --------------------------------
        nbytes = Signal(self.count_width + log2(max(sizes)) + 1)
        first_pos = Signal.like(pos)
        with m.Switch(self.sel):
            for i, e in enumerate(sizes):
                with m.Case(i):
                    m.d.comb += nbytes.eq(self.count << log2(e))
                    if e < B:
                        m.d.comb += first_pos.eq(self.addr[log2(e):lb])
        end = Signal(aw + len(nbytes) + 1)
        m.d.comb += end.eq(self.addr + nbytes - 1)
        beats = Signal.like(beats_left)
        m.d.comb += beats.eq((end >> lb) - (self.addr >> lb) + 1)

        # ---- burst length: min(beats left, max burst, beats to the 4 KiB boundary) ----------
        to_boundary = Signal(range(BOUNDARY_BYTES // B + 1))
        m.d.comb += to_boundary.eq((BOUNDARY_BYTES // B) - next_addr[lb:log2(BOUNDARY_BYTES)])
        cap = Signal(range(maxb + 1))
        blen = Signal(range(maxb + 1))
        m.d.comb += [cap.eq(Mux(to_boundary < maxb, to_boundary, maxb)),
                     blen.eq(Mux(beats_left < cap, beats_left, cap))]

        r_fire = Signal()
        m.d.comb += r_fire.eq(bus.r_valid & bus.r_ready)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start & (self.count != 0)):
                    m.d.sync += [sel.eq(self.sel), next_addr.eq(Cat(Const(0, lb), self.addr[lb:])),
                                 beats_left.eq(beats), entries_left.eq(self.count), pos.eq(first_pos), k.eq(0)]
                    m.next = "AR"
            with m.State("AR"):
                m.d.comb += [self.busy.eq(1), bus.ar_valid.eq(1), bus.ar_addr.eq(next_addr),
                             bus.ar_len.eq(blen - 1)]
                with m.If(bus.ar_ready):
                    m.d.sync += [next_addr.eq(next_addr + (blen << lb)), beats_left.eq(beats_left - blen)]
                    m.next = "R"
            with m.State("R"):
                m.d.comb += self.busy.eq(1)
                with m.Switch(sel):
                    for i, e in enumerate(sizes):
                        with m.Case(i):
                            self._unpack(m, e, B, sr, sr_bits, k, pos, entries_left)
                with m.If(self.out_valid):
                    m.d.sync += entries_left.eq(entries_left - 1)
                with m.If(r_fire & bus.r_last):
                    with m.If(beats_left == 0):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "AR"
        return m

    def _unpack(self, m, e, B, sr, sr_bits, k, pos, entries_left):
        bus, eb, bb = self.bus, e * 8, B * 8
        if e >= B:
            per = e // B
            new_sr = Cat(sr[bb:sr_bits], bus.r_data)
            m.d.comb += [bus.r_ready.eq(1), self.out_data.eq(new_sr[sr_bits - eb:sr_bits])]
            with m.If(bus.r_valid):
                m.d.sync += [sr.eq(new_sr), k.eq(Mux(k == per - 1, 0, k + 1))]
                m.d.comb += [self.out_valid.eq(k == per - 1), self.out_last.eq((k == per - 1) & (entries_left == 1))]
        else:
            per = B // e
            m.d.comb += [bus.r_ready.eq((pos == per - 1) | (entries_left == 1)),
                         self.out_data.eq(bus.r_data.word_select(pos[:(per - 1).bit_length()], eb)),
                         self.out_valid.eq(bus.r_valid), self.out_last.eq(bus.r_valid & (entries_left == 1))]
            with m.If(bus.r_valid):
                m.d.sync += pos.eq(Mux(bus.r_ready, 0, pos + 1))
