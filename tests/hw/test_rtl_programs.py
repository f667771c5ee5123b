"""Directed programs on the RTL (Verilator and Icarus, cocotb bench): every DRAM byte after the run
equals the functional simulator's. One simulator process runs all the programs in order on one
accelerator, as one Fsim instance does, so buffer contents carry over identically."""
from __future__ import annotations

import hw_programs as hp
import numpy as np
import pytest
from conftest import require

from accel.hw.params import ErrorCode
from accel.isa import Finish, Load, MemType
from sim.fsim import Fsim
from sim.rtl import RtlHang, RtlProgram, run_programs

pytestmark = pytest.mark.rtl

DIRECTED = {
    "every_kind": hp.every_kind,
    "padding": hp.padding,
    "alu_ops": hp.alu_ops,
    "uop_loops": hp.uop_loops,
    "long_rows": hp.long_rows,
    "overlapped": lambda cfg: hp.pipelined_matmul(cfg, overlap=True),
    "serialized": lambda cfg: hp.pipelined_matmul(cfg, overlap=False),
    "conv2d": lambda cfg: hp.conv_layer(cfg)[0],
    "dilated_windowed": lambda cfg: hp.conv_layer(cfg, 1, hp.DILATED, gather=False)[0],
    "dilated_gathered": lambda cfg: hp.conv_layer(cfg, 2, hp.DILATED, gather=True)[0],
}


def first_differences(got: np.ndarray, want: np.ndarray, n: int = 6) -> str:
    bad = np.flatnonzero(got != want)
    return (f"{bad.size} DRAM bytes differ; first at " +
            ", ".join(f"0x{a:x} (rtl {got[a]}, fsim {want[a]})" for a in bad[:n]))


@pytest.fixture(scope="module", params=["verilator", "icarus"])
def directed(request, tiny):
    sim = request.param
    require(sim)
    fs = Fsim(tiny)
    progs, expected = [], {}
    for name, build in DIRECTED.items():
        prog = build(tiny)
        dram = prog.dram_image()
        ref = dram.copy()
        fs.run(ref, prog.insn_addr, len(prog.insns))
        expected[name] = ref
        progs.append(RtlProgram(name, dram, prog.insn_addr, len(prog.insns), max_cycles=100_000))
    runs = run_programs(tiny, progs, sim)
    return sim, expected, {r.name: r for r in runs}


@pytest.mark.parametrize("name", list(DIRECTED))
def test_rtl_directed_program_matches_fsim(directed, name):
    sim, expected, runs = directed
    run = runs[name]
    assert run.status == "done"
    assert np.array_equal(run.dram, expected[name]), f"{sim}, {name}: " + first_differences(run.dram, expected[name])


def test_rtl_conv_layer_matches_numpy(directed, tiny):
    """The convolution's output tensor, read back from the RTL's DRAM, is numpy's."""
    sim, _, runs = directed
    _, read_output, reference = hp.conv_layer(tiny)
    assert np.array_equal(read_output(runs["conv2d"].dram), reference)
    for name, seed, gather in (("dilated_windowed", 1, False), ("dilated_gathered", 2, True)):
        _, read_output, reference = hp.conv_layer(tiny, seed, hp.DILATED, gather)
        assert np.array_equal(read_output(runs[name].dram), reference), name


def test_rtl_same_results_under_random_bus_stalls(tiny):
    """AXI ready/valid of the memory dropped at random on every channel: same DRAM bytes."""
    require("verilator")
    fs = Fsim(tiny)
    progs, refs = [], []
    for name in ("every_kind", "padding", "overlapped", "conv2d"):
        prog = DIRECTED[name](tiny)
        dram = prog.dram_image()
        ref = dram.copy()
        fs.run(ref, prog.insn_addr, len(prog.insns))
        progs.append(RtlProgram(name, dram, prog.insn_addr, len(prog.insns), max_cycles=200_000))
        refs.append(ref)
    for run, ref in zip(run_programs(tiny, progs, "verilator", stall_seed=5), refs):
        assert np.array_equal(run.dram, ref), f"{run.name}: " + first_differences(run.dram, ref)


def test_rtl_hang_is_reported_within_the_cycle_limit(tiny):
    """A program whose tokens can never arrive stops at the cycle limit with a clear error."""
    require("verilator")
    b = hp.Builder(tiny)
    b.emit(Finish(pop_prev=True))          # no load ever pushes that token
    prog = b.program()
    with pytest.raises(RtlHang, match=r"program 'deadlock' did not finish within 2000 cycles"):
        run_programs(tiny, [RtlProgram("deadlock", prog.dram_image(), prog.insn_addr, 1, max_cycles=2000)],
                     "verilator")


def test_rtl_watchdog_fault_soft_reset_and_recovery(tiny):
    """A token deadlock ends with a WATCHDOG fault when WATCHDOG is set (STATUS.error, ERROR and
    ERROR_INSN: the next instruction fetch would dispatch); without it the core hangs, SOFT_RESET
    returns it to idle, and the next programs run: a faulting one reports its code and index, a
    good one leaves fsim's bytes."""
    require("verilator")
    b = hp.Builder(tiny)
    b.emit(Finish(pop_prev=True))          # no load ever pushes that token
    stuck = b.program()
    b = hp.Builder(tiny)
    b.emit(Load(mem_type=MemType.INP, y_size=1, x_size=1, x_stride=1))
    b.emit(Load(mem_type=MemType.OUT))
    b.emit(Finish())
    bad = b.program()
    good = DIRECTED["every_kind"](tiny)
    ref = good.dram_image()
    Fsim(tiny).run(ref, good.insn_addr, len(good.insns))
    runs = run_programs(tiny, [
        RtlProgram("watchdog", stuck.dram_image(), stuck.insn_addr, 1, max_cycles=5000, watchdog=300),
        RtlProgram("hang", stuck.dram_image(), stuck.insn_addr, 1, max_cycles=3000, soft_reset=True),
        RtlProgram("bad field", bad.dram_image(), bad.insn_addr, 3, max_cycles=5000),
        RtlProgram("good", good.dram_image(), good.insn_addr, len(good.insns), max_cycles=100_000)], "verilator")
    assert [r.status for r in runs] == ["fault", "reset", "fault", "done"]
    assert runs[0].error == (ErrorCode.WATCHDOG, 1) and runs[0].cycles < 400
    assert runs[2].error == (ErrorCode.BAD_FIELD, 1)
    assert np.array_equal(runs[3].dram, ref), first_differences(runs[3].dram, ref)
