"""The index arrays of a GEMM/ALU (micro-ops inside two affine loops), built, bounds-checked and
cached once per shape; long instructions run as blocks of whole passes so memory stays bounded."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from accel.hw.params import ErrorCode
from accel.isa import AluOp, Gemm

from ..errors import ProgramFault
from .stats import FsimStats

#: index elements the plan cache may hold (three int64 arrays each: 48 MB)
PLAN_CACHE_ELEMS = 1 << 21
#: micro-op iterations of a GEMM/ALU executed at once: a longer one (up to 16383 x 16383 loop
#: iterations of uop_depth micro-ops are legal) runs as consecutive blocks of whole passes, so
#: the index arrays, whatever the loop counts, stay bounded (three int64 arrays: 24 MB)
CHUNK_ELEMS = 1 << 20


@dataclass(eq=False)
class LoopPlan:
    """Index arrays of one GEMM/ALU shape in execution order (wgt None for ALU), bounds-checked,
    with what the vectorized paths derive from them (cluster plan, ALU hazard, ...)."""
    dst: np.ndarray
    src: np.ndarray
    wgt: np.ndarray | None
    run: slice | None                     # dst as a slice when it is lo, lo+1, ... (all distinct)
    derived: dict = field(default_factory=dict)

    def derive(self, key: str, make):
        """A fact the vectorized paths derive from the plan, computed by make() on first use."""
        if key not in self.derived:
            self.derived[key] = make()
        return self.derived[key]



def contiguous_run(idx: np.ndarray) -> slice | None:
    """idx as a slice when it is lo, lo+1, ..., hi (a view instead of a gather), else None."""
    if idx.size and int(idx[-1]) - int(idx[0]) == idx.size - 1 and (np.diff(idx) == 1).all():
        return slice(int(idx[0]), int(idx[-1]) + 1)
    return None



class LoopPlans:
    """Plans and chunking (a mixin of Fsim)."""

    def _plan(self, idx: int, insn, name: str) -> LoopPlan:
        """The bounds-checked index arrays of a GEMM/ALU, cached by its micro-ops and loop fields
        (a layer runs the same shape on many tiles, so each is built and checked once)."""
        c = self.cfg
        self._check_uop_range(idx, insn, name)
        u = self.uop[insn.uop_bgn:insn.uop_end]
        gemm = isinstance(insn, Gemm)
        # what the plan's checks and derived facts (hazards, runs) depend on: an ALU's source is read
        # unless the immediate replaces it, and FLUSH reads it whatever use_imm says
        reads_src = not gemm and not (insn.use_imm and insn.alu_op != AluOp.FLUSH)
        key = (u.tobytes(), insn.iter_out, insn.iter_in, insn.dst_factor_out, insn.dst_factor_in,
               insn.src_factor_out, insn.src_factor_in,
               (insn.wgt_factor_out, insn.wgt_factor_in, insn.reset) if gemm else reads_src)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        i0 = np.arange(insn.iter_out, dtype=np.int64)[:, None, None]
        i1 = np.arange(insn.iter_in, dtype=np.int64)[None, :, None]
        dst = (u[:, 0] + i0 * insn.dst_factor_out + i1 * insn.dst_factor_in).reshape(-1)
        src = (u[:, 1] + i0 * insn.src_factor_out + i1 * insn.src_factor_in).reshape(-1)
        wgt = (u[:, 2] + i0 * insn.wgt_factor_out + i1 * insn.wgt_factor_in).reshape(-1) if gemm else None
        checks = [("accumulator (dst)", dst, c.acc_depth)]
        if gemm and not insn.reset:
            checks += [("input (src)", src, c.inp_depth), ("weight (wgt)", wgt, c.wgt_depth)]
        elif reads_src:
            checks += [("accumulator (src)", src, c.acc_depth)]
        for what, arr, depth in checks:
            if arr.size and int(arr.max()) >= depth:
                k = int(np.argmax(arr >= depth))
                ui = k % len(u)
                b0, b1 = self._iter_base or (0, 0)
                raise ProgramFault(ErrorCode.INDEX_RANGE, idx,
                                   f"instruction {idx} ({name}): {what} index {int(arr[k])} out of range "
                                   f"[0, {depth}) at micro-op {insn.uop_bgn + ui}, iteration "
                                   f"({b0 + k // len(u) // insn.iter_in}, {b1 + k // len(u) % insn.iter_in})")
        plan = LoopPlan(dst, src, wgt, contiguous_run(dst))
        if dst.size <= PLAN_CACHE_ELEMS:
            self._plan_elems += dst.size
            if self._plan_elems > PLAN_CACHE_ELEMS:   # bound the memory the cache holds
                self._plans.clear()
                self._plan_elems = dst.size
            self._plans[key] = plan
        return plan

    def _check_uop_range(self, idx: int, insn, name: str) -> None:
        if not 0 <= insn.uop_bgn <= insn.uop_end <= self.cfg.uop_depth:   # (fetch checks it first)
            raise ProgramFault(ErrorCode.SRAM_RANGE, idx, f"instruction {idx} ({name}): micro-op range "
                               f"[uop_bgn={insn.uop_bgn}, uop_end={insn.uop_end}) outside [0, {self.cfg.uop_depth}]")

    def _in_chunks(self, idx: int, insn, dram: np.ndarray, stats: FsimStats, run) -> bool:
        """Run a GEMM/ALU of more than CHUNK_ELEMS micro-op iterations as consecutive blocks of whole
        passes (the loops' (i0, i1) iterations, in order): each block is the same instruction with
        fewer iterations on micro-ops (and a flush's seed base) shifted by the block's first
        iteration's offsets, which is what in-order execution does. False: small enough to run whole."""
        nu = insn.uop_end - insn.uop_bgn
        if self._iter_base is not None or nu <= 0 or nu * insn.iter_out * insn.iter_in <= CHUNK_ELEMS:
            return False   # (a block runs whole: at least one pass, at most uop_depth iterations)
        self._check_uop_range(idx, insn, insn.opcode.name)
        gemm = isinstance(insn, Gemm)
        if nu * insn.iter_in <= CHUNK_ELEMS:
            rows = CHUNK_ELEMS // (nu * insn.iter_in)
            blocks = [(a, min(rows, insn.iter_out - a), 0, insn.iter_in) for a in range(0, insn.iter_out, rows)]
        else:
            cols = max(1, CHUNK_ELEMS // nu)
            blocks = [(a, 1, b, min(cols, insn.iter_in - b))
                      for a in range(insn.iter_out) for b in range(0, insn.iter_in, cols)]
        uop, epi = self.uop, self.epilogue
        base = uop[insn.uop_bgn:insn.uop_end]
        try:
            for a, r, b, q in blocks:
                shift = [a * insn.dst_factor_out + b * insn.dst_factor_in,
                         a * insn.src_factor_out + b * insn.src_factor_in,
                         a * insn.wgt_factor_out + b * insn.wgt_factor_in if gemm else 0]
                self.uop = uop.copy()
                self.uop[insn.uop_bgn:insn.uop_end] = base + np.array(shift, np.int64)
                if gemm and insn.flush:
                    self.epilogue = dataclasses.replace(
                        epi, seed_base=epi.seed_base + a * epi.seed_factor_out + b * epi.seed_factor_in)
                self._iter_base = (a, b)
                run(idx, dataclasses.replace(insn, iter_out=r, iter_in=q), dram, stats)
        finally:
            self.uop, self.epilogue, self._iter_base = uop, epi, None
        return True
