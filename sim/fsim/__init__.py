"""Functional simulator: the fast bit-exact executor of the ISA (checked against sim/reference.py).

Runs a program from a DRAM image and leaves the bytes the hardware leaves. It models fetch,
the three decoupled stages with their command queues, and the four dependency-token queues,
so a program whose tokens can never be satisfied is reported as a deadlock (naming each
blocked instruction and the queue it waits on) instead of hanging. Data paths are vectorized
across micro-ops and loop iterations: GEMM products are float BLAS matmuls, exact because each
dot product is bounded below the float mantissa (see gemm_float_dtype), then summed in int64
and wrapped to acc_width, which is order-independent modular arithmetic. A layer runs the same
micro-ops and loop fields on many tiles, so each GEMM/ALU shape's index arrays are built,
bounds-checked and analysed once (_plan); LOAD and STORE tiles are strided views of the DRAM.

The package, by concern: dispatch (fetch, stages, token queues), memory (LOAD/STORE), loops
(GEMM/ALU index plans and chunking), gemm and alu (the vectorized data paths), blas (exact float
matmuls, threads). The plain model they are checked against is sim/reference.py.
"""
from __future__ import annotations

import os

import numpy as np

from accel.isa import AccelConfig, Epilogue, MemType, buffer_depth, elem_bytes
from accel.isa.deps import QUEUES, token_queue

from .alu import AluPaths, alu_apply, alu_apply_int32, flush_requant, scale_fixed
from .blas import IDLE_RECOUNT_S, THREADED_MATMUL_MACS, BlasThreads, blas_threads, gemm_float_dtype, idle_cores
from .dispatch import Dispatch, decode_fetched, first_fault, label
from .gemm import GemmPaths
from .loops import CHUNK_ELEMS, PLAN_CACHE_ELEMS, LoopPlan, LoopPlans
from .memory import INT, MemoryOps, check_dram, wrap
from .stats import FsimStats

__all__ = ["CHUNK_ELEMS", "IDLE_RECOUNT_S", "PLAN_CACHE_ELEMS", "QUEUES", "THREADED_MATMUL_MACS", "BlasThreads",
           "Fsim", "FsimStats", "alu_apply", "alu_apply_int32", "blas_threads", "check_dram", "decode_fetched",
           "first_fault", "flush_requant", "gemm_float_dtype", "idle_cores", "label", "run_program", "scale_fixed",
           "token_queue", "wrap"]


class Fsim(Dispatch, MemoryOps, LoopPlans, GemmPaths, AluPaths):
    """Functional simulator for one AccelConfig. Buffers persist across run() calls of an
    instance, as SRAM does across runs of the hardware; a new instance starts from zeros."""

    def __init__(self, cfg: AccelConfig, check_races: bool | None = None):
        """check_races: run the token protocol's happens-before check (sim.races) on every program;
        None reads the environment variable ACCEL_CHECK_RACES (1 turns it on, as the tests do)."""
        self.cfg = cfg
        c = cfg
        if check_races is None:
            check_races = os.environ.get("ACCEL_CHECK_RACES", "") == "1"
        self.check_races = check_races
        self.races = None   # the RaceChecker of the run in progress
        self.inp = np.zeros((c.inp_depth, c.batch, c.block_in), INT[c.inp_width])
        self.wgt = np.zeros((c.wgt_depth, c.block_out, c.block_in), INT[c.wgt_width])
        self.acc = np.zeros((c.acc_depth, c.batch, c.block_out), INT[c.acc_width])
        self.out = np.zeros((c.out_depth, c.batch, c.block_out), INT[c.out_width])
        self.uop = np.zeros((c.uop_depth, 3), np.int64)  # decoded (acc, src, wgt)
        self.epilogue = Epilogue()   # the registers a flushing GEMM reads (zero, as after reset)
        self._fdt = gemm_float_dtype(c)
        # float copies of inp/wgt for the BLAS paths, made on first use, then kept current by loads;
        # the weights as (block_out, depth, block_in), so that a gather of weight tiles along axis 1
        # is already the transposed operand BLAS reads in place (see _gemm_clustered)
        self._inp_f = None
        self._wgt_ft = None
        self._plans: dict[tuple, LoopPlan] = {}     # see _plan
        self._iter_base = None   # loop iteration (i0, i1) of the block _in_chunks runs, if it runs one
        self._plan_elems = 0
        self._depth = {m: buffer_depth(c, m) for m in MemType}
        self._elem_bytes = {m: elem_bytes(c, m) for m in MemType}
        self._buffers = {MemType.INP: self.inp, MemType.WGT: self.wgt, MemType.ACC: self.acc}

    # ---- top level ------------------------------------------------------------------------


def run_program(cfg: AccelConfig, dram: np.ndarray, insn_addr: int, insn_count: int) -> FsimStats:
    """Convenience: a fresh simulator runs one program."""
    return Fsim(cfg).run(dram, insn_addr, insn_count)
