"""How yosys maps an inferred memory to block RAM, LUT RAM or flip-flops, from its shape alone.

A model of yosys' memory_libmap pass (passes/memory/memory_libmap.cc) for the memories the
accelerator has: one synchronous write port (one enable for the whole word), one or two
synchronous read ports at their own addresses, optionally transparent to the write port.
memory_libmap scores every RAM cell definition of the family's library (every option and
every base width), and the flip-flop fallback at one cost unit per bit, then takes the cheapest;
this module repeats that arithmetic with the definitions of yosys' xilinx/brams_xc4v.txt +
lutrams_xc5v.txt (7-series) and lattice/brams_16kd.txt + lutrams_trellis.txt (ECP5).
The result is exact for these port patterns (tests/fpga/test_estimate.py checks it against yosys
on a grid of shapes); other patterns are outside its scope.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

FACTOR_MUX = 0.5
FACTOR_DEMUX = 0.5
FACTOR_EMU = 2
LOGIC_COST_PER_BIT = 1.0


@dataclass(frozen=True)
class MemShape:
    """depth entries of width bits; n_read synchronous read ports; transparent: reads see the
    word written in the same cycle."""

    name: str
    depth: int
    width: int
    n_read: int = 1
    transparent: bool = False

    @property
    def bits(self) -> int:
        return self.depth * self.width


@dataclass(frozen=True)
class RamDef:
    """One option of a library RAM: dbits (widths, narrowest first) at abits address bits.

    groups: port groups as (kind, count) with kind in sw, sr, srsw, ar, arsw.
    resource: what the cell is counted as ("bram" units or "lutram" LUTs per cell).
    fixed_port_width: SDP-style ports that only come at one width (index into dbits), or None.
    wrtrans_new: the write port can make another port's read see the new data (no emulation).
    """

    name: str
    kind: str  # "block" | "distributed"
    abits: int
    dbits: tuple[int, ...]
    cost: float
    widthscale: float
    byte: int
    groups: tuple[tuple[str, int], ...]
    per_port: bool
    units: float  # BRAM units (block) or LUTs (distributed) per cell
    wrtrans_new: bool = False
    rdinit_ok: bool = True


def _xc7_defs() -> list[RamDef]:
    tdp = (("srsw", 2),)
    sdp = (("sw", 1), ("sr", 1))
    d = [
        RamDef("RAMB18_TDP", "block", 14, (1, 2, 4, 9, 18), 129, 0, 9, tdp, True, 0.5),
        RamDef("RAMB36_TDP", "block", 15, (1, 2, 4, 9, 18, 36), 257, 0, 9, tdp, True, 1.0),
        RamDef("RAMB36_TDP_CASCADE", "block", 16, (1, 2, 4, 9), 513, 0, 9, tdp, True, 2.0),
        RamDef("RAMB18_SDP", "block", 14, (1, 2, 4, 9, 18, 36), 129, 0, 9, sdp, True, 0.5),
        RamDef("RAMB36_SDP", "block", 15, (1, 2, 4, 9, 18, 36, 72), 257, 0, 9, sdp, True, 1.0),
    ]
    # LUT RAMs: every 7-series mapping of these options is one 4-LUT cell (RAM32M, RAM64M,
    # 2x RAM64X1D, RAM128X1D).
    for ab, w in ((5, 4), (6, 2), (7, 1)):
        d.append(RamDef(f"LUTRAM_DP{ab}", "distributed", ab, (w,), 8, 8, 0, (("arsw", 1), ("ar", 1)), False, 4))
    for ab, w in ((5, 2), (6, 1)):
        d.append(RamDef(f"LUTRAM_QP{ab}", "distributed", ab, (w,), 7, 7, 0, (("arsw", 1), ("ar", 3)), False, 4))
    for ab, w in ((5, 6), (6, 3)):
        d.append(RamDef(f"LUTRAM_SDP{ab}", "distributed", ab, (w,), 8, 7, 0, (("sw", 1), ("ar", 1)), False, 4))
    return d


def _ecp5_defs() -> list[RamDef]:
    return [
        RamDef("DP16KD", "block", 14, (1, 2, 4, 9, 18), 128, 0, 9, (("srsw", 2),), True, 1.0),
        RamDef("PDPW16KD", "block", 14, (1, 2, 4, 9, 18, 36), 128, 0, 9, (("sw", 1), ("sr", 1)), True, 1.0),
        RamDef("DPR16X4", "distributed", 4, (4,), 4, 0, 0, (("sw", 1), ("ar", 1)), False, 4),
    ]


LIBRARIES = {"xc7": _xc7_defs(), "ecp5": _ecp5_defs()}
LIBRARIES["xcup"] = LIBRARIES["xc7"]  # UltraScale+ has more LUT RAM shapes; this is the 7-series view


@dataclass(frozen=True)
class MemMapping:
    shape: MemShape
    target: str  # "bram" | "lutram" | "ff"
    cell: str
    cells: int
    bram: float
    lutram_luts: int
    ff_bits: int
    cost: float

    def to_dict(self) -> dict:
        return {"name": self.shape.name, "depth": self.shape.depth, "width": self.shape.width,
                "read_ports": self.shape.n_read, "target": self.target, "cell": self.cell, "cells": self.cells,
                "bram": self.bram, "lutram_luts": self.lutram_luts, "ff_bits": self.ff_bits}


def _port_config(d: RamDef, mem: MemShape):
    """(repl_port, score_emu) of the cheapest port assignment, or None if the RAM cannot host mem."""
    can_write = [i for i, (k, _) in enumerate(d.groups) if k in ("sw", "srsw", "arsw")]
    can_read = [i for i, (k, _) in enumerate(d.groups) if k in ("sr", "srsw", "ar", "arsw")]
    best = None
    for wg in can_write:
        space = [n for _, n in d.groups]
        space[wg] -= 1
        readers = [i for i in can_read if space[i] > 0]
        if not readers:
            continue
        # All read ports go to the group with the most room (the pass spreads them the same way).
        rg = max(readers, key=lambda i: space[i])
        repl = math.ceil(mem.n_read / space[rg])
        score = mem.n_read  # one point per read port not shared with the write port
        if mem.transparent and not d.wrtrans_new and d.groups[rg][0] in ("sr", "srsw"):
            score += 3 * mem.n_read  # soft transparency logic per read port
        cand = (repl, score)
        if best is None or (cand[0] * d.cost + FACTOR_EMU * cand[1]) < (best[0] * d.cost + FACTOR_EMU * best[1]):
            best = cand
    return best


def _geometry_cost(d: RamDef, mem: MemShape, repl_port: int, score_emu: int) -> tuple[float, int]:
    """(cost, cells) of the best base width, as memory_libmap's handle_geom computes them."""
    best = None
    for b in range(len(d.dbits)):
        unit = d.dbits[b]
        eff_byte = d.byte if (d.byte and d.byte <= unit) else unit
        # One write enable for the whole word: bits pack densely, padded to the byte size.
        swizzle = math.ceil(mem.width / eff_byte) * eff_byte
        addrs = 1 << (d.abits - b)
        mult_a = (mem.depth - 1) // addrs + 1
        bits = mult_a * swizzle
        repl = math.ceil(bits / unit)
        score_demux = mult_a * 1 if mult_a != 1 else 0
        score_mux = (mult_a - 1) * mem.width * mem.n_read
        cost = (d.cost - d.widthscale) * repl * repl_port
        cost += d.widthscale * mult_a * mem.width / unit * repl_port
        cost += score_mux * FACTOR_MUX + score_demux * FACTOR_DEMUX + score_emu * FACTOR_EMU
        if best is None or cost < best[0]:
            best = (cost, repl * repl_port)
    return best


def map_memory(mem: MemShape, family: str) -> MemMapping:
    """Where yosys puts `mem` for `family` (xc7, xcup, ecp5), and how many cells it takes."""
    lib = LIBRARIES[family]
    logic_cost = mem.bits * LOGIC_COST_PER_BIT
    best = ("ff", "FF", 0, logic_cost, None)
    # memory_libmap keeps, per resource kind, the cheapest definition, then compares those and FFs.
    for d in lib:
        pc = _port_config(d, mem)
        if pc is None:
            continue
        cost, cells = _geometry_cost(d, mem, *pc)
        if cost < best[3]:
            best = ("bram" if d.kind == "block" else "lutram", d.name, cells, cost, d)
    target, name, cells, cost, d = best
    if target == "ff":
        return MemMapping(mem, "ff", "FF", 0, 0.0, 0, mem.bits, cost)
    if target == "bram":
        return MemMapping(mem, "bram", name, cells, cells * d.units, 0, 0, cost)
    return MemMapping(mem, "lutram", name, cells, 0.0, int(cells * d.units), 0, cost)
