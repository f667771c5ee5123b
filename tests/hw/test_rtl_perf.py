"""Performance counters and latency hiding on the RTL, and the cycle counts of micro-benchmarks
that docs/hardware.md derives (the contract the timing model reproduces)."""
from __future__ import annotations

import hw_programs as hp
import pytest
from conftest import require

from accel.isa import Alu, AluOp, Finish, Gemm, Load, MemType, Store
from sim.rtl import RtlProgram, run_programs

pytestmark = pytest.mark.rtl


def run(cfg, named_programs, simulator="verilator"):
    progs = [RtlProgram(name, p.dram_image(), p.insn_addr, len(p.insns), max_cycles=200_000)
             for name, p in named_programs.items()]
    return {r.name: r for r in run_programs(cfg, progs, simulator)}


def test_gemm_core_busy_at_least_95_percent_on_a_gemm_only_program(tiny):
    require("verilator")
    runs = run(tiny, {"gemm": hp.gemm_only(tiny, n_uops=16, iters=256)})
    c = runs["gemm"].counters
    assert c["gemm_uops"] == 16 * 256
    assert c["gemm_uops"] / c["cycles"] >= 0.95, c


def test_token_synchronized_loads_overlap_compute_and_finish_sooner(tiny):
    require("verilator")
    runs = run(tiny, {"overlapped": hp.pipelined_matmul(tiny, overlap=True),
                      "serialized": hp.pipelined_matmul(tiny, overlap=False)})
    ov, ser = runs["overlapped"].counters, runs["serialized"].counters
    assert ov["gemm_uops"] == ser["gemm_uops"] and ov["bytes_written"] == ser["bytes_written"]
    assert ov["cycles"] < ser["cycles"], (ov, ser)
    # overlap shows in the counters: the stages' busy cycles add up to well over the run's cycles
    assert ov["load_busy"] + ov["compute_busy"] + ov["store_busy"] > 1.3 * ov["cycles"], ov


def _micro(cfg, insns):
    b = hp.Builder(cfg)
    b.emit(*insns)
    return b.program()


# Exact cycle counts: see docs/hardware.md, "Cycle behaviour". (cycles, load_busy, compute_busy, store_busy)
MICRO = {
    "finish": ([Finish()], (21, 0, 4, 0)),
    "alu_zero_iterations": ([Alu(iter_out=0), Finish()], (25, 0, 8, 0)),
    "gemm_1": ([Gemm(uop_bgn=0, uop_end=1), Finish()], (30, 0, 13, 0)),
    "gemm_10": ([Gemm(uop_bgn=0, uop_end=10), Finish()], (39, 0, 22, 0)),
    "gemm_2x3x2": ([Gemm(uop_bgn=0, uop_end=2, iter_out=2, iter_in=3), Finish()], (41, 0, 24, 0)),
    "alu_10": ([Alu(uop_bgn=0, uop_end=10), Finish()], (38, 0, 21, 0)),
    # MUL and SCALE micro-ops issue every other cycle: 9 more cycles for 10 of them
    "alu_mul_10": ([Alu(uop_bgn=0, uop_end=10, alu_op=AluOp.MUL), Finish()], (47, 0, 30, 0)),
    "alu_scale_2x3": ([Alu(uop_bgn=0, uop_end=2, iter_out=3, alu_op=AluOp.SCALE, use_imm=True, imm=5), Finish()],
                      (39, 0, 22, 0)),
    "load_inp_4": ([Load(mem_type=MemType.INP, y_size=1, x_size=4, x_stride=4, push_next=True),
                    Finish(pop_prev=True)], (38, 16, 4, 0)),
    "load_inp_2x4": ([Load(mem_type=MemType.INP, y_size=2, x_size=4, x_stride=4, push_next=True),
                      Finish(pop_prev=True)], (42, 20, 4, 0)),
    "load_inp_padded": ([Load(mem_type=MemType.INP, y_size=1, x_size=4, x_stride=4, x_pad0=2, push_next=True),
                         Finish(pop_prev=True)], (38, 16, 4, 0)),
    "load_wgt_2": ([Load(mem_type=MemType.WGT, y_size=1, x_size=2, x_stride=2, push_next=True),
                    Finish(pop_prev=True)], (38, 16, 4, 0)),
    "store_4": ([Alu(iter_out=0, push_next=True), Store(dram_base=0x800, y_size=1, x_size=4, x_stride=4,
                                                        pop_prev=True, push_prev=True),
                 Finish(pop_next=True)], (39, 0, 8, 12)),
}


def test_micro_benchmark_cycle_counts_are_the_documented_ones(tiny):
    require("verilator")
    runs = run(tiny, {name: _micro(tiny, insns) for name, (insns, _) in MICRO.items()})
    got = {name: (r.counters["cycles"], r.counters["load_busy"], r.counters["compute_busy"], r.counters["store_busy"])
           for name, r in runs.items()}
    want = {name: counts for name, (_, counts) in MICRO.items()}
    assert got == want


def test_counters_are_consistent(tiny):
    require("verilator")
    prog = hp.every_kind(tiny)
    r = run(tiny, {"p": prog})["p"]
    c = r.counters
    for stage in ("load", "compute", "store"):
        assert c[f"{stage}_busy"] + c[f"{stage}_stall"] <= c["cycles"]
    assert c["gemm_uops"] == 4 and c["alu_uops"] == 8
    assert c["bytes_read"] % tiny.bus_bytes == 0 and c["bytes_read"] >= 16 * len(prog.insns)
    # two rows of 2 four-byte entries, 12 bytes apart from a 64-byte aligned start: row 0 is one
    # beat, row 1 (bytes 12..19) straddles two; bytes count whole bus beats
    assert c["bytes_written"] == 3 * tiny.bus_bytes
