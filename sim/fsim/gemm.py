"""fsim's GEMM: the vectorized paths (convolution clusters, separable matmul, grouped, gathered)
and the flushing GEMM's requantization. Products go to BLAS in float, exact by the bound of
blas.gemm_float_dtype, and are summed in integers that wrap as the accumulator does."""
from __future__ import annotations

import math

import numpy as np

from accel.hw.params import ErrorCode
from accel.isa import Gemm

from ..errors import ProgramFault
from .alu import flush_requant
from .blas import blas_threads
from .loops import LoopPlan, contiguous_run
from .memory import wrap
from .stats import FsimStats


class GemmPaths:
    """GEMM (a mixin of Fsim)."""

    def _gemm(self, idx: int, insn: Gemm, dram: np.ndarray, stats: FsimStats) -> None:
        c = self.cfg
        if self._in_chunks(idx, insn, dram, stats, self._gemm):
            return
        plan = self._plan(idx, insn, "GEMM")
        dst = plan.dst
        if dst.size == 0:
            return
        stats.gemm_uops += dst.size
        if not insn.reset:
            stats.macs += dst.size * c.macs_per_cycle
        flushed, seeds, in_order = self._flush_plan(idx, insn, plan) if insn.flush else (None, None, True)
        if self.races:   # a flush reads its seeds, unless it requantizes into the accumulator
            self._race_accesses(insn, plan, gemm=True, seeds=None if self.epilogue.to_acc else seeds)
        if insn.flush:
            if in_order:   # each flushed sum's value depends on the micro-ops before it only
                self._gemm_sums(insn, plan)
                self._flush(flushed, seeds, self.acc[flushed])
                return
            self._gemm_in_order(insn, plan, flushed, seeds)
            return
        self._gemm_sums(insn, plan)

    def _race_accesses(self, insn, plan: LoopPlan, gemm: bool, use_imm: bool = False, seeds=None) -> None:
        """A GEMM's or ALU's buffer accesses, for the race checker: its micro-ops, its operands and
        the accumulator entries it updates (and a flush's seeds, from _flush_plan), then the entries
        it writes."""
        r = self.races
        u = plan.derive("race", lambda: {k: np.unique(a) for k, a in
                                         (("dst", plan.dst), ("src", plan.src), ("wgt", plan.wgt)) if a is not None})
        r.read("uop", slice(insn.uop_bgn, insn.uop_end))
        if gemm and not insn.reset:
            r.read("inp", u["src"])
            r.read("wgt", u["wgt"])
        if not (gemm and insn.reset):
            r.read("acc", u["dst"])
        if not gemm and not use_imm:
            r.read("acc", u["src"])
        if seeds is not None:
            r.read("acc", np.unique(seeds))
        r.write("acc", u["dst"])
        r.write("out", u["dst"])

    def _gemm_sums(self, insn: Gemm, plan: LoopPlan) -> None:
        """Every micro-op's sum, and out = narrow(acc) on the entries they write."""
        c = self.cfg
        dst, src, wgt = plan.dst, plan.src, plan.wgt
        if insn.reset:
            d = plan.run or dst
            self.acc[d] = 0
            self.out[d] = 0
            return
        if self._gemm_clustered(insn, plan):
            return  # updated acc and out itself
        # wgt varies over the loop dims with a non-zero factor; group rows by those dims so
        # each group is one (rows x block_in) @ (block_in x block_out) matmul.
        nu = insn.uop_end - insn.uop_bgn
        shape = (insn.iter_out, insn.iter_in, nu)
        vary = [insn.wgt_factor_out != 0 and insn.iter_out > 1, insn.wgt_factor_in != 0 and insn.iter_in > 1, nu > 1]
        ngroups = math.prod(n for n, v in zip(shape, vary) if v)
        if self._gemm_separable(insn, dst, shape):
            pass
        elif self._fdt is not None and ngroups * 4 <= dst.size:
            self._gemm_grouped(dst, src, wgt, shape, vary)
        else:
            self._gemm_gathered(dst, src, wgt)
        touched = plan.derive("touched", lambda: plan.run or np.unique(dst))
        self.out[touched] = wrap(self.acc[touched], c.out_width)

    def _flush_plan(self, idx: int, insn: Gemm, plan: LoopPlan):
        """A flushing GEMM's (flushed entries, seed entries, in_order) for the current EPILOGUE:
        each pass's last micro-op flushes; in_order when no flushed entry is flushed twice or
        written after its flush and no seed is written by the instruction, so that the sums can
        go first and the flushes after them."""
        e = self.epilogue
        nu = insn.uop_end - insn.uop_bgn

        def make():
            i0 = np.arange(insn.iter_out, dtype=np.int64)[:, None]
            i1 = np.arange(insn.iter_in, dtype=np.int64)[None, :]
            seeds = (e.seed_base + i0 * e.seed_factor_out + i1 * e.seed_factor_in).reshape(-1)
            if not e.to_acc and seeds.size and int(seeds.max()) >= self.cfg.acc_depth:
                k = int(np.argmax(seeds >= self.cfg.acc_depth))
                raise ProgramFault(ErrorCode.INDEX_RANGE, idx,
                                   f"instruction {idx} (GEMM): flush seed index {int(seeds[k])} out of range "
                                   f"[0, {self.cfg.acc_depth}) at iteration ({k // insn.iter_in}, "
                                   f"{k % insn.iter_in}) (EPILOGUE seed_base {e.seed_base}, factors "
                                   f"{e.seed_factor_out}, {e.seed_factor_in})")
            flushed = plan.dst.reshape(-1, nu)[:, -1]
            at = np.arange(nu - 1, plan.dst.size, nu)
            last = np.full(self.cfg.acc_depth, -1, np.int64)
            last[plan.dst] = np.arange(plan.dst.size)   # the last write of each entry (later ones win)
            in_order = (np.unique(flushed).size == flushed.size and (last[flushed] == at).all()
                        and (e.to_acc or not np.isin(seeds, plan.dst).any()))
            return flushed, seeds % self.cfg.acc_depth, bool(in_order)   # (to_acc reads no seed)
        return plan.derive(("flush", e.seed_base, e.seed_factor_out, e.seed_factor_in, e.to_acc), make)

    def _flush(self, flushed, seeds, sums: np.ndarray) -> None:
        """out[flushed] = the FLUSH requantization of their sums; acc[flushed] = acc[seeds], or with
        the EPILOGUE's to_acc the requantized sums."""
        q = flush_requant(sums, self.epilogue.imm, self.cfg.acc_width)
        self.out[flushed] = q.astype(self.out.dtype)
        self.acc[flushed] = q.astype(self.acc.dtype) if self.epilogue.to_acc else self.acc[seeds]

    def _gemm_in_order(self, insn: Gemm, plan: LoopPlan, flushed, seeds) -> None:
        """A flushing GEMM whose writes and seeds overlap: one micro-op after another, as the
        hardware runs them (the slow path; compilers do not emit this)."""
        w, nu = self.cfg.acc_width, insn.uop_end - insn.uop_bgn
        for k in range(plan.dst.size):
            d = plan.dst[k]
            if insn.reset:
                v = np.zeros(self.acc[d].shape, np.int64)
            else:
                v = self.acc[d].astype(np.int64) + (self.inp[plan.src[k]].astype(np.int64)
                                                    @ self.wgt[plan.wgt[k]].astype(np.int64).T)
            v = wrap(v, w)
            if k % nu == nu - 1:
                self._flush([d], [seeds[k // nu]], v[None])
            else:
                self.acc[d] = v
                self.out[d] = v.astype(self.out.dtype)

    def _gemm_clustered(self, insn: Gemm, loop: LoopPlan) -> bool:
        """The convolution pattern: weights do not move with the loops, so the micro-ops that
        share a destination (one output tile: its input channels and kernel taps) are one
        im2col row block. Clusters that read the same input micro-ops (the output-channel blocks
        of one tile) share the gathered rows and go to BLAS as ONE (loop rows x K*block_in) @
        (K*block_in x clusters*block_out) matmul, exact in float32 or float64 by the same bound
        as gemm_float_dtype with K*block_in terms. Sums are added to acc once (a slice or plain
        indexing when every destination is distinct)."""
        if insn.wgt_factor_out or insn.wgt_factor_in or self._fdt is None:
            return False
        plan = loop.derive("cluster", lambda: self._make_cluster_plan(insn, self.uop[insn.uop_bgn:insn.uop_end]))
        if plan is None:
            return False
        c, (fdt, groups, dst, touched) = self.cfg, plan
        inp_f, wgt_ft = self._floats()
        if len(groups) == 1 and isinstance(dst, slice) and fdt == np.float32 and self.acc.dtype == np.int32:
            # one matmul into one run of a 32-bit accumulator: its exact int32 sums added in place
            # (int32 adds wrap as the accumulator does), no staging array
            (src_idx, wgt_idx), n = groups[0], groups[0][1].shape[0]
            rows = src_idx.shape[0]
            part = self._cluster_matmul(fdt, inp_f, wgt_ft, src_idx, wgt_idx).astype(np.int32)
            acc = self.acc[dst]
            acc.reshape(n, rows, c.batch, c.block_out)[...] += part.reshape(rows, c.batch, c.block_out, n).transpose(3, 0, 1, 2)
            self.out[dst] = acc
            return True
        # exact integers: int32 holds any float32-exact sum and wraps like a 32-bit accumulator
        y = np.empty((sum(s.shape[0] * w.shape[0] for s, w in groups), c.batch, c.block_out),
                     np.int32 if fdt == np.float32 else np.int64)
        at = 0
        for src_idx, wgt_idx in groups:
            rows, n = src_idx.shape[0], wgt_idx.shape[0]
            part = self._cluster_matmul(fdt, inp_f, wgt_ft, src_idx, wgt_idx).reshape(rows, c.batch, c.block_out, n)
            part = part.transpose(3, 0, 1, 2)
            np.copyto(y[at:at + n * rows].reshape(n, rows, c.batch, c.block_out), part, casting="unsafe")
            at += n * rows
        if touched is not None:   # destinations repeat: sum per entry first
            self._accumulate_sorted(dst, y)
            self.out[touched] = wrap(self.acc[touched], c.out_width)
            return True
        self._add_to_acc(dst, y)
        self.out[dst] = self.acc[dst].astype(self.out.dtype)
        return True

    def _cluster_matmul(self, fdt, inp_f, wgt_ft, src_idx: np.ndarray, wgt_idx: np.ndarray) -> np.ndarray:
        """One group of _gemm_clustered: its gathered input rows (rows x K micro-ops) times the
        weights of its n clusters (n x K micro-ops), as (rows * batch, block_out * n) floats of
        type fdt (float64 where K * block_in products could pass float32's exact range)."""
        c = self.cfg
        rows, k = src_idx.shape
        n = wgt_idx.shape[0]
        x = np.take(inp_f, src_idx, axis=0)                                     # (rows, K, batch, bin)
        x = x.transpose(0, 2, 1, 3).reshape(rows * c.batch, k * c.block_in).astype(fdt, copy=False)
        w = np.take(wgt_ft, wgt_idx, axis=1)                                    # (bout, n, K, bin)
        w = w.reshape(c.block_out * n, k * c.block_in).astype(fdt, copy=False).T   # a transposed view
        return blas_threads().matmul(x, w)

    def _make_cluster_plan(self, insn: Gemm, u: np.ndarray):
        """Index plan of _gemm_clustered: (float type, [(src rows x K, wgt n x K) per group of
        clusters], destinations as a slice or index array, the distinct entries when some repeat,
        else None), or None when the instruction does not fit the pattern."""
        c = self.cfg
        heads, inverse = np.unique(u[:, 0], return_inverse=True)
        counts = np.bincount(inverse)
        bound = int(counts.max()) * c.block_in * (1 << (c.inp_width - 1)) * (1 << (c.wgt_width - 1))
        fdt = np.float32 if bound <= 1 << 24 else np.float64 if bound <= 1 << 53 else None
        if fdt is None or len(heads) > 64:
            return None  # many clusters: building the plan costs more than the other paths save
        i0 = np.arange(insn.iter_out, dtype=np.int64)[:, None]
        i1 = np.arange(insn.iter_in, dtype=np.int64)[None, :]
        off_d = (i0 * insn.dst_factor_out + i1 * insn.dst_factor_in).reshape(-1)
        off_s = (i0 * insn.src_factor_out + i1 * insn.src_factor_in).reshape(-1)
        order = np.argsort(inverse, kind="stable")
        starts = np.r_[0, np.cumsum(counts)]
        by_src: dict[bytes, list[int]] = {}        # clusters by their input micro-ops, in head order
        for ci in range(len(heads)):
            by_src.setdefault(u[order[starts[ci]:starts[ci + 1]], 1].tobytes(), []).append(ci)
        if len(by_src) > 1 and len(by_src) * 4 > len(u):
            return None  # many small matmuls (clusters reading different inputs): one Python step each
        groups, dsts = [], []
        for members in by_src.values():
            sel = np.stack([order[starts[ci]:starts[ci + 1]] for ci in members])   # (n, K) micro-ops
            groups.append((u[sel[0], 1][None, :] + off_s[:, None], u[sel, 2]))
            dsts.append((heads[members][:, None] + off_d[None, :]).reshape(-1))
        dst = np.concatenate(dsts)
        if np.bincount(dst).max() > 1:
            return fdt, groups, dst, np.unique(dst)
        return fdt, groups, contiguous_run(dst) or dst, None   # one contiguous run: views, no gathers

    def _add_to_acc(self, dst, y: np.ndarray) -> None:
        """acc[dst] += y wrapped to acc_width (dst a slice or distinct indices). A 32-bit accumulator
        adds in place, numpy's int32 add wrapping as the hardware's does; integer casts in numpy are
        modular, so an int32 sum that wraps mod 2^32 narrows to a 16- or 8-bit accumulator exactly."""
        if self.acc.dtype == y.dtype:
            self.acc[dst] += y
        elif self.acc.dtype.itemsize <= 4 and y.dtype == np.int32:
            self.acc[dst] = (self.acc[dst].astype(np.int32) + y).astype(self.acc.dtype)
        else:
            self.acc[dst] = wrap(self.acc[dst].astype(np.int64) + y, self.cfg.acc_width)

    def _gemm_separable(self, insn: Gemm, dst, shape) -> bool:
        """The matmul pattern: every micro-op adds into the same dst, the input tile depends on
        one loop level and the micro-op, the weight tile on the other level and the micro-op.
        Then the instruction is ONE (rows x nu*block_in) @ (nu*block_in x cols) matmul, done in
        float64, exact for any sum of up to 2^39 int8 x int8 products."""
        c = self.cfg
        u = self.uop[insn.uop_bgn:insn.uop_end]
        if len(u) < 2 or (u[:, 0] != u[0, 0]).any():
            return False
        if insn.src_factor_in == 0 and insn.wgt_factor_out == 0:
            i_src, i_wgt = 0, 1
        elif insn.src_factor_out == 0 and insn.wgt_factor_in == 0:
            i_src, i_wgt = 1, 0
        else:
            return False
        n_src, n_wgt, nu = shape[i_src], shape[i_wgt], len(u)
        f_src = (insn.src_factor_out, insn.src_factor_in)[i_src]
        f_wgt = (insn.wgt_factor_out, insn.wgt_factor_in)[i_wgt]
        src = u[None, :, 1] + np.arange(n_src)[:, None] * f_src            # (n_src, nu)
        wgt = u[None, :, 2] + np.arange(n_wgt)[:, None] * f_wgt            # (n_wgt, nu)
        x = self.inp[src].astype(np.float64)                               # (n_src, nu, batch, bin)
        x = x.transpose(0, 2, 1, 3).reshape(n_src * c.batch, nu * c.block_in)
        w = self.wgt[wgt].astype(np.float64)                               # (n_wgt, nu, bout, bin)
        w = w.transpose(1, 3, 0, 2).reshape(nu * c.block_in, n_wgt * c.block_out)
        y = blas_threads().matmul(x, w).astype(np.int64).reshape(n_src, c.batch, n_wgt, c.block_out)
        y = y.transpose(0, 2, 1, 3) if i_src == 0 else y.transpose(2, 0, 1, 3)  # (iter_out, iter_in, b, o)
        d = dst.reshape(shape)[:, :, 0].reshape(-1)
        self._accumulate_sorted(d, y.reshape(-1, c.batch, c.block_out))
        return True

    def _floats(self):
        if self._inp_f is None:
            self._inp_f = self.inp.astype(self._fdt)
        if self._wgt_ft is None:
            self._wgt_ft = self.wgt.transpose(1, 0, 2).astype(self._fdt, order="C")
        return self._inp_f, self._wgt_ft

    def _gemm_grouped(self, dst, src, wgt, shape, vary) -> None:
        c = self.cfg
        inp_f, wgt_ft = self._floats()
        # Move the loop dims the weight index varies over first: each group of rows shares one
        # weight tile, and all groups go to BLAS as one stacked (G, rows*batch, block_in) matmul.
        order = [d for d in range(3) if vary[d]] + [d for d in range(3) if not vary[d]]
        nvary = sum(vary)
        d3, s3, w3 = (a.reshape(shape).transpose(order) for a in (dst, src, wgt))
        d3 = d3.reshape(-1, int(np.prod(d3.shape[nvary:])))
        s3 = s3.reshape(d3.shape)
        w3 = w3.reshape(d3.shape)
        groups, rows = d3.shape
        x = inp_f[s3].reshape(groups, rows * c.batch, c.block_in)
        w = np.take(wgt_ft, w3[:, 0], axis=1).transpose(1, 2, 0)   # (G, block_in, block_out)
        y = np.matmul(x, w)                                    # exact: see gemm_float_dtype
        total = y.astype(np.int64).reshape(groups * rows, c.batch, c.block_out)
        # Sum contributions per destination in int64, then one wrapped update.
        self._accumulate_sorted(d3.reshape(-1), total)

    def _accumulate_sorted(self, dst: np.ndarray, contrib: np.ndarray) -> None:
        order = np.argsort(dst, kind="stable")
        ds = dst[order]
        starts = np.concatenate(([0], np.flatnonzero(ds[1:] != ds[:-1]) + 1))   # (np.r_ costs ~10 us a call)
        summed = np.add.reduceat(contrib[order], starts, axis=0)
        uniq = ds[starts]
        self.acc[uniq] = wrap(self.acc[uniq].astype(np.int64) + summed, self.cfg.acc_width)

    def _gemm_gathered(self, dst, src, wgt) -> None:
        if self._fdt is not None:
            inp_f, wgt_ft = self._floats()
            prod = np.matmul(inp_f[src], np.take(wgt_ft, wgt, axis=1).transpose(1, 2, 0)).astype(np.int64)
        else:
            prod = np.einsum("nbk,nok->nbo", self.inp[src].astype(np.int64), self.wgt[wgt].astype(np.int64))
        self._accumulate_sorted(dst, prod)
