"""Random-program differential test: RTL (cocotb bench) vs the functional simulator, every DRAM
byte, on programs from tests/randprog.py (the generator the fsim and runtime tests share)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import require
from randprog import random_program

from accel.isa import preset
from sim.fsim import Fsim
from sim.rtl import RtlProgram, run_programs

pytestmark = pytest.mark.rtl


def differential(cfg, seeds, simulator: str, stall_seed=None) -> None:
    fs = Fsim(cfg)           # one instance: buffers carry over between programs, as on the RTL
    progs, refs = [], []
    for seed in seeds:
        prog, _ = random_program(cfg, seed)
        dram = prog.dram_image()
        ref = dram.copy()
        fs.run(ref, prog.insn_addr, len(prog.insns))
        progs.append(RtlProgram(f"seed {seed}", dram, prog.insn_addr, len(prog.insns), max_cycles=400_000))
        refs.append(ref)
    runs = run_programs(cfg, progs, simulator, stall_seed=stall_seed, timeout_s=3000)
    bad = []
    for run, ref in zip(runs, refs):
        if not np.array_equal(run.dram, ref):
            diff = np.flatnonzero(run.dram != ref)
            bad.append(f"{run.name}: {diff.size} bytes differ, first at 0x{diff[0]:x}")
    assert not bad, f"{len(bad)} of {len(runs)} random programs differ on {simulator}: " + "; ".join(bad[:5])


def test_rtl_random_programs_tiny_verilator():
    require("verilator")
    differential(preset("tiny"), range(50), "verilator")


@pytest.mark.slow
def test_rtl_random_programs_tiny_verilator_many():
    require("verilator")
    differential(preset("tiny"), range(50, 300), "verilator")


@pytest.mark.slow
def test_rtl_random_programs_tiny_icarus():
    require("icarus")
    differential(preset("tiny"), range(300, 330), "icarus")


@pytest.mark.slow
def test_rtl_random_programs_tiny_with_bus_stalls():
    require("verilator")
    differential(preset("tiny"), range(400, 440), "verilator", stall_seed=11)


@pytest.mark.slow
def test_rtl_random_programs_default_config():
    require("verilator")
    differential(preset("default"), range(500, 520), "verilator")


@pytest.mark.slow
@pytest.mark.parametrize("bus", [64, 128, 256, 512])
def test_rtl_random_programs_two_entry_queues_with_bus_stalls(bus):
    """Two-entry command and token queues (fetch's buffer was overfilled at 128 bits and more),
    every AXI channel stalling at random (the AR payload must hold while ARREADY is low: the
    bench's AXI model reports any change as a protocol error)."""
    require("verilator")
    cfg = dataclasses.replace(preset("tiny"), cmd_queue_depth=2, dep_queue_depth=2, bus_width=bus)
    differential(cfg, range(600, 616), "verilator", stall_seed=bus)
