"""Timing of one STORE in the store unit (accel/hw/store.py), as a function of its shape.

A STORE only talks to the write channel, which nothing else uses, so its duration does not depend
on when it starts: the unit is modelled cycle by cycle here, register for register, once per
distinct (y_size, x_size, DRAM row alignment) and memoized. An AW waits while write_outstanding
bursts await their B response (accel/hw/axi.py). Returns U (cycles from the unit's
start to the first cycle it is not busy) and the W beats it wrote.

Inside a burst on an unthrottled bus, with an output element of at least one beat, the unit
streams one beat a cycle and its registers move by a fixed rule; those stretches are advanced in
one step (`skip`), so a store costs a few steps per burst instead of one per beat. The keys differ
by DRAM address, so a network's first run meets hundreds of them.
"""
from __future__ import annotations

from functools import lru_cache

from accel.isa.config import BOUNDARY_BYTES

from ..dram import DramModel


def store_key(cfg, dram: DramModel, y_size: int, x_size: int, dram_base: int, x_stride: int) -> tuple:
    """What the store's timing depends on: shape, and DRAM addresses modulo 4 KiB (boundaries, lanes)."""
    E = cfg.out_elem_bytes
    return (cfg.bus_bytes, E, cfg.max_burst_beats, dram.write_latency, dram.bytes_per_cycle,
            y_size, x_size, (dram_base * E) % BOUNDARY_BYTES, (x_stride * E) % BOUNDARY_BYTES, cfg.write_outstanding)


@lru_cache(maxsize=4096)
def store_timing(key: tuple) -> tuple[int, int]:
    """(U, W beats) of a STORE, from store_key(...)."""
    return store_cycles(key)


def store_cycles(key: tuple, skip: bool = True) -> tuple[int, int]:
    """(U, W beats) of a STORE, mirroring StoreUnit's registers cycle by cycle; with `skip`, a burst's
    streaming stretch in one step (tests compare both ways)."""
    B, E, maxb, WL, bpc, y_size, x_size, base_b, stride_b, max_open = key
    if y_size == 0 or x_size == 0:
        return 1, 0
    throttled = 0 < bpc < B
    small = E < B
    per = B // E if small else E // B
    skip = skip and not small and not throttled
    n_elems = y_size * x_size
    # DRAM byte addresses modulo 4 KiB suffice: every quantity below is taken modulo a divisor of it.
    # ---- registers (state after the `go` cycle s) ----
    rd_more, rd_valid, rd_x, rd_y = True, False, 0, 0
    row_ent_b = base_b                       # reader's row, as a byte address
    lane = (base_b // E) % per if small else 0
    m_lane, m_row_last = 0, False
    piece = 0
    w_full = False
    state = "AW"
    b_row, b_row_b, new_row = 0, base_b, True
    beats_left, next_addr, burst_left = 0, 0, 0
    aw_cycle, k_in_burst = 0, 0
    b_times: list[int] = []
    b_next = 0                               # index of the next B response to arrive
    outstanding = 0
    beats = 0
    t = 1                                    # cycle relative to s
    while True:
        if skip and w_full and rd_valid and state == "W" and t > aw_cycle and burst_left > 1:
            # Streaming: each cycle a beat fires, the packer reloads W with the element's next piece and
            # takes a new element after its last piece. Run the burst up to its last beat: the reader
            # cannot run dry before then, since every beat of the burst is data still to be read.
            k = burst_left - 1
            takes = (piece + k) // per
            piece = (piece + k) % per
            if takes:
                issued = rd_y * x_size + rd_x
                rd_y, rd_x = divmod(issued + takes, x_size)
                row_ent_b = (row_ent_b + (rd_y - issued // x_size) * stride_b) % BOUNDARY_BYTES
                m_row_last = rd_x == 0
                rd_more = issued + takes < n_elems
            beats += k
            k_in_burst += k
            burst_left = 1
            t += k
            while b_next < len(b_times) and b_times[b_next] < t:   # B responses: only counted in W
                b_next += 1
                outstanding -= 1
            continue
        # ---- combinational ----
        b_fire = b_next < len(b_times) and b_times[b_next] == t
        in_w = state == "W"
        w_ready = in_w and t >= aw_cycle + 1 + ((k_in_burst * B) // bpc if throttled else 0)
        w_fire = w_full and in_w and w_ready
        w_free = (not w_full) or w_fire
        if small:
            completes = m_lane == per - 1 or m_row_last
            take = rd_valid and ((not completes) or w_free)
            w_load = take and completes
        else:
            w_load = rd_valid and w_free
            take = w_load and piece == per - 1
        issue = rd_more and ((not rd_valid) or take)
        busy = state != "IDLE"
        if not busy:
            return t, beats
        # ---- burst FSM ----
        aw_fire = False
        nstate = state
        if state == "AW" and outstanding < max_open:   # the AXI master holds AW while max_open Bs are due
            if new_row:
                row_end_b = b_row_b + x_size * E - 1
                beats_eff = row_end_b // B - b_row_b // B + 1
                addr_eff = (b_row_b // B) * B
            else:
                beats_eff, addr_eff = beats_left, next_addr
            to_boundary = BOUNDARY_BYTES // B - (addr_eff % BOUNDARY_BYTES) // B
            blen = min(beats_eff, to_boundary, maxb)
            aw_fire = True
            next_addr = (addr_eff + blen * B) % BOUNDARY_BYTES
            beats_left = beats_eff - blen
            burst_left = blen
            new_row = False
            aw_cycle, k_in_burst = t, 0
            nstate = "W"
        elif state == "W":
            if w_fire:
                beats += 1
                k_in_burst += 1
                burst_left -= 1
                if burst_left == 0:
                    at = t + WL
                    if b_times and at <= b_times[-1]:
                        at = b_times[-1] + 1
                    b_times.append(at)
                    if beats_left != 0:
                        nstate = "AW"
                    elif b_row + 1 != y_size:
                        b_row += 1
                        b_row_b = (b_row_b + stride_b) % BOUNDARY_BYTES
                        new_row = True
                        nstate = "AW"
                    else:
                        nstate = "DRAIN"
        elif state == "DRAIN":
            if outstanding == int(b_fire):
                nstate = "IDLE"
        if aw_fire and not b_fire:
            outstanding += 1
        elif b_fire and not aw_fire:
            outstanding -= 1
        if b_fire:
            b_next += 1
        # ---- reader and packer ----
        if w_load:
            w_full = True
        elif w_fire:
            w_full = False
        if not small and rd_valid and w_free:
            piece = 0 if piece == per - 1 else piece + 1
        n_rd_valid = issue or (rd_valid and not take)
        if issue:
            row_end = rd_x + 1 == x_size
            m_lane, m_row_last = lane, row_end
            if small:
                lane = (lane + 1) % per
            if row_end:
                rd_x = 0
                rd_y += 1
                row_ent_b = (row_ent_b + stride_b) % BOUNDARY_BYTES
                if small:
                    lane = (row_ent_b // E) % per
                if rd_y == y_size:
                    rd_more = False
            else:
                rd_x += 1
        rd_valid = n_rd_valid
        state = nstate
        t += 1
