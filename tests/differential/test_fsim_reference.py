"""fsim's fast paths against the plain ISA model (sim/reference.py), bit for bit.

Random programs (hypothesis draws the seed) are built from the patterns each vectorized path of
fsim recognises: the convolution pattern (micro-op clusters per destination, shared inputs,
repeated destinations), the separable matmul, weight-moving loops (grouped), arbitrary loops
(gathered), reset, flushing GEMMs with their EPILOGUE (in order and overlapping), and ALU ops of
every kind with an immediate, one broadcast register, a contiguous run, bias-style MOV broadcasts
and read-after-write hazards. Each runs on fsim and on the reference over several configs (batch
> 1, 16-bit accumulators, 16-bit operands), with fsim's chunk size at its default and tiny (so
that long instructions run in blocks and long immediate ALUs in closed form); the DRAM, the
accumulator and the output buffer must be equal. test_a_wrong_fast_path_is_caught breaks each
fast path in turn and checks that these programs see it.
"""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel.isa import (
    PRESETS,
    AccelConfig,
    Alu,
    AluOp,
    Epilogue,
    Finish,
    Gemm,
    Load,
    MemType,
    Store,
    encode_uops,
    flush_immediate,
)
from sim.fsim import Fsim
from sim.fsim import alu as fsim_alu
from sim.fsim import gemm as fsim_gemm
from sim.fsim import loops as fsim_loops
from sim.reference import ReferenceMachine

CONFIGS = {
    "tiny": PRESETS["tiny"],
    "batch2": AccelConfig(batch=2, block_in=8, block_out=4, uop_buff_bytes=1024, inp_buff_bytes=2048,
                          wgt_buff_bytes=2048, acc_buff_bytes=4096, out_buff_bytes=1024),
    "acc16": AccelConfig(block_in=4, block_out=4, acc_width=16, uop_buff_bytes=1024, inp_buff_bytes=1024,
                         wgt_buff_bytes=1024, acc_buff_bytes=2048, out_buff_bytes=1024),
    "wide": AccelConfig(block_in=4, block_out=4, inp_width=16, wgt_width=16, out_width=16, uop_buff_bytes=1024,
                        inp_buff_bytes=1024, wgt_buff_bytes=1024, acc_buff_bytes=2048, out_buff_bytes=1024),
}
NI, NW, NA = 24, 24, 48         # INP, WGT and ACC entries the programs use (keeps the reference fast)


class _Gen:
    """One random program: loads, then GEMM/ALU instructions drawn from the fast-path patterns."""

    def __init__(self, cfg: AccelConfig, seed: int):
        self.cfg, self.rng = cfg, np.random.default_rng(seed)
        c = cfg
        self.na = min(NA, c.acc_depth, c.out_depth)
        self.ni, self.nw = min(NI, c.inp_depth), min(NW, c.wgt_depth)
        self.chunks: list[np.ndarray] = []
        self.at = 0
        self.compute: list = []

    def r(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def coin(self, p: float = 0.5) -> bool:
        return bool(self.rng.random() < p)

    def data(self, nbytes: int, align: int = 64) -> int:
        """Place bytes in the DRAM image; returns the byte address."""
        self.at = -(-self.at // align) * align
        addr = self.at
        self.chunks.append((addr, np.zeros(nbytes, np.uint8)))
        self.at += nbytes
        return addr

    def source(self, mem: MemType, n: int, eb: int) -> int:
        addr = self.data(n * eb, max(64, eb))
        buf = self.chunks[-1][1]
        buf[:] = self.rng.integers(0, 256, buf.size, dtype=np.uint8)
        if mem == MemType.ACC:    # half the lanes small, so that shifts, clamps and requantizations bite
            w = self.cfg.acc_width
            vals = buf.view(f"<i{w // 8}")
            small = self.rng.random(vals.size) < 0.5
            vals[small] = self.rng.integers(-300, 300, int(small.sum()))
        return addr // eb

    def load(self, mem: MemType, n: int, **deps) -> Load:
        """A LOAD filling entries [0, n) of the buffer, sometimes through padding or a 2-D tile."""
        eb = {MemType.INP: self.cfg.inp_elem_bytes, MemType.WGT: self.cfg.wgt_elem_bytes,
              MemType.ACC: self.cfg.acc_elem_bytes}[mem]
        base = self.source(mem, 2 * n, eb)
        if self.coin(0.3):
            return Load(mem_type=mem, sram_base=0, dram_base=base, y_size=1, x_size=n - 1, x_stride=n, x_pad0=1,
                        **deps)
        if self.coin(0.3) and n % 4 == 0:
            return Load(mem_type=mem, sram_base=0, dram_base=base, y_size=4, x_size=n // 4, x_stride=n // 4 + 1,
                        **deps)
        return Load(mem_type=mem, sram_base=0, dram_base=base, y_size=1, x_size=n, x_stride=n, **deps)

    # ---- micro-op patterns ----------------------------------------------------------------
    def loops(self, reach: tuple[int, int, int], gemm: bool, max_iter: int = 6):
        """Loop extents and factors whose reach stays inside (acc, src, wgt) areas."""
        fields = {"iter_out": self.r(1, max_iter), "iter_in": self.r(1, max_iter)}
        for name, lim in (("dst", reach[0]), ("src", reach[1]), ("wgt", reach[2] if gemm else None)):
            if lim is None:
                continue
            fo, fi = self.r(0, 3), self.r(0, 3)
            while (fields["iter_out"] - 1) * fo + (fields["iter_in"] - 1) * fi >= lim:
                fo, fi = max(0, fo - 1), max(0, fi - 1)
                if fo == fi == 0:
                    break
            fields[f"{name}_factor_out"], fields[f"{name}_factor_in"] = fo, fi
        return fields

    def reach(self, f: dict, name: str) -> int:
        return (f["iter_out"] - 1) * f.get(f"{name}_factor_out", 0) + (f["iter_in"] - 1) * f.get(f"{name}_factor_in", 0)

    def conv(self):
        """Clusters of micro-ops per destination, weights fixed over the loops."""
        n_cl, k = self.r(1, 4), self.r(1, 4)
        f = {"iter_out": self.r(1, 4), "iter_in": self.r(1, 5), "wgt_factor_out": 0, "wgt_factor_in": 0}
        distinct = self.coin(0.7)
        f["src_factor_in"], f["src_factor_out"] = self.r(0, 2), self.r(0, 3)
        while True:
            f["dst_factor_in"] = n_cl if distinct else self.r(0, 2)
            f["dst_factor_out"] = n_cl * f["iter_in"] if distinct else self.r(0, 2)
            if self.reach(f, "dst") + n_cl <= self.na and self.reach(f, "src") < self.ni:
                break
            f["iter_out"], f["iter_in"] = max(1, f["iter_out"] - 1), max(1, f["iter_in"] - 1)
        dbase = self.r(0, self.na - self.reach(f, "dst") - n_cl)
        shared = [self.r(0, self.ni - 1 - self.reach(f, "src")) for _ in range(k)]
        uops = []
        for c_ in range(n_cl):
            srcs = shared if self.coin(0.8) else [self.r(0, self.ni - 1 - self.reach(f, "src")) for _ in range(k)]
            uops += [(dbase + c_, s, self.r(0, self.nw - 1)) for s in srcs]
        if self.coin(0.2):
            self.rng.shuffle(uops)
        return uops, f

    def matmul(self):
        """Every micro-op into one destination, inputs moving with one loop and weights with the other."""
        nu = self.r(2, 5)
        f = {"iter_out": self.r(1, 5), "iter_in": self.r(1, 5)}
        if self.coin():
            f.update(src_factor_out=self.r(1, 3), src_factor_in=0, wgt_factor_out=0, wgt_factor_in=self.r(1, 3))
        else:
            f.update(src_factor_out=0, src_factor_in=self.r(1, 3), wgt_factor_out=self.r(1, 3), wgt_factor_in=0)
        f.update(dst_factor_out=self.r(0, 2) * f["iter_in"], dst_factor_in=self.r(0, 1))
        while self.reach(f, "src") + nu >= self.ni or self.reach(f, "wgt") + nu >= self.nw:
            f["iter_out"], f["iter_in"] = max(1, f["iter_out"] - 1), max(1, f["iter_in"] - 1)
        d = self.r(0, self.na - 1 - self.reach(f, "dst"))
        uops = [(d, self.r(0, self.ni - 1 - self.reach(f, "src")), self.r(0, self.nw - 1 - self.reach(f, "wgt")))
                for _ in range(nu)]
        return uops, f

    def anything(self, gemm: bool):
        """Random micro-ops and loops (the gathered and grouped paths)."""
        f = self.loops((self.na, self.ni if gemm else self.na, self.nw), gemm)
        src_n = self.ni if gemm else self.na
        uops = [(self.r(0, self.na - 1 - self.reach(f, "dst")), self.r(0, src_n - 1 - self.reach(f, "src")),
                 self.r(0, self.nw - 1 - self.reach(f, "wgt"))) for _ in range(self.r(1, 6))]
        return uops, f

    def alu_walk(self):
        """A tile walk: a contiguous run of destinations, the source one broadcast entry, a bias
        per micro-op (src fixed over the loops), or the destination shifted (a hazard)."""
        nu = self.r(1, 4)
        f = {"iter_out": self.r(1, 4), "iter_in": self.r(1, 6)}
        kind = self.r(0, 3)
        if kind == 0:     # micro-op major: uop k writes a block of iter_out * iter_in entries
            f.update(dst_factor_in=1, dst_factor_out=f["iter_in"], src_factor_in=0, src_factor_out=0)
            base = self.r(0, max(0, self.na - nu * f["iter_out"] * f["iter_in"]))
            uops = [(base + k * f["iter_out"] * f["iter_in"], self.r(0, self.na - 1), 0) for k in range(nu)]
        else:             # iteration major: a run lo, lo+1, ...
            f.update(dst_factor_in=nu, dst_factor_out=nu * f["iter_in"])
            f.update(src_factor_in=0, src_factor_out=0) if kind < 3 else f.update(src_factor_in=nu,
                                                                                 src_factor_out=nu * f["iter_in"])
            span = nu * f["iter_out"] * f["iter_in"]
            while span > self.na - 2:
                f["iter_in"] = max(1, f["iter_in"] - 1)
                f.update(dst_factor_out=nu * f["iter_in"], src_factor_out=f["src_factor_out"] and nu * f["iter_in"])
                span = nu * f["iter_out"] * f["iter_in"]
                if f["iter_in"] == 1:
                    f["iter_out"] = max(1, f["iter_out"] - 1)
            base = self.r(0, self.na - span)
            one = self.r(0, self.na - 1)
            if kind == 3:   # source = destination shifted by one (reads what an earlier element wrote)
                shift = self.r(-1, 1)
                uops = [(base + k, min(max(base + k + shift, 0), self.na - span), 0) for k in range(nu)]
            else:
                uops = [(base + k, one if kind == 1 else self.r(0, self.na - 1), 0) for k in range(nu)]
        return uops, f

    def long_imm(self):
        """An immediate ALU over many iterations of a few entries (the closed-form path when chunked)."""
        f = {"iter_out": self.r(2, 40), "iter_in": self.r(2, 40), "dst_factor_out": self.r(0, 1),
             "dst_factor_in": 0, "src_factor_out": 0, "src_factor_in": 0}
        while self.reach(f, "dst") >= self.na - 2:
            f["iter_out"] //= 2
        uops = [(self.r(0, self.na - 1 - self.reach(f, "dst")), 0, 0) for _ in range(self.r(1, 2))]
        return uops, f

    # ---- instructions ---------------------------------------------------------------------
    def uop_load(self, uops) -> tuple[Load, int]:
        arr = np.array(uops, np.int64).reshape(-1, 3)
        data = encode_uops(arr, self.cfg)
        addr = self.data(data.size, self.cfg.uop_elem_bytes)
        self.chunks[-1][1][:] = data
        sram = self.r(0, self.cfg.uop_depth - len(arr))
        return Load(mem_type=MemType.UOP, sram_base=sram, dram_base=addr // self.cfg.uop_elem_bytes, y_size=1,
                    x_size=len(arr), x_stride=len(arr)), sram

    def flush_imm(self) -> int:
        hi = self.r(-128, 127) if self.coin(0.3) else self.r(0, 127)
        return flush_immediate(self.r(0, 31), hi, self.coin(), self.coin(), self.coin(0.3))

    def gemm(self):
        p = self.rng.random()
        uops, f = self.conv() if p < 0.4 else self.matmul() if p < 0.6 else self.anything(True)
        load, sram = self.uop_load(uops)
        self.compute.append(load)
        flush = self.coin(0.25)
        if flush:
            so, si = self.r(0, 2), self.r(0, 2)
            while (f["iter_out"] - 1) * so + (f["iter_in"] - 1) * si >= self.na:
                so, si = max(0, so - 1), max(0, si - 1)
            seed = self.r(0, self.na - 1 - (f["iter_out"] - 1) * so - (f["iter_in"] - 1) * si)
            self.compute.append(Epilogue(imm=self.flush_imm(), seed_base=seed, seed_factor_out=so, seed_factor_in=si,
                                         to_acc=self.coin(0.3)))
        self.compute.append(Gemm(uop_bgn=sram, uop_end=sram + len(uops), reset=self.coin(0.1), flush=flush, **f))

    def alu(self):
        op = AluOp(self.r(0, len(AluOp) - 1))
        p = self.rng.random()
        uops, f = self.alu_walk() if p < 0.5 else self.long_imm() if p < 0.65 else self.anything(False)
        # (FLUSH reads the register whatever use_imm says: both settings must agree)
        use_imm = self.coin(0.3) if op == AluOp.FLUSH else self.coin() or 0.5 <= p < 0.65
        if op == AluOp.FLUSH:
            imm = self.flush_imm()
        elif op == AluOp.SHR:
            imm = self.r(-40, 40)
        elif op in (AluOp.REQUANT, AluOp.SCALE, AluOp.CLAMP) and self.coin():
            imm = self.r(-(1 << 15), (1 << 15) - 1)
        else:
            imm = self.r(-300, 300) if self.coin(0.7) else self.r(-(1 << 15), (1 << 15) - 1)
        load, sram = self.uop_load(uops)
        self.compute.append(load)
        if not use_imm and op in (AluOp.REQUANT, AluOp.SCALE) and self.coin(0.7):
            self.compute += self.operand_entry(op, uops)
        self.compute.append(Alu(uop_bgn=sram, uop_end=sram + len(uops), alu_op=op, use_imm=use_imm, imm=imm, **f))

    def operand_entry(self, op: AluOp, uops) -> list:
        """MOV/SHR/ADD setting the first micro-op's source to a meaningful REQUANT/SCALE operand."""
        w = self.cfg.acc_width
        if op == AluOp.REQUANT:
            v = self.r(0, 1) << 21 | self.r(0, 31) << 16 | self.r(0, 255) << 8 | self.r(0, 255)
        else:
            v = self.r(0, 63 if w >= 30 else 0) << 24 | self.r(1, (1 << 24) - 1)
        v &= (1 << (w - 1)) - 1
        low = (v & 0xFFFF) - (1 << 16 if v & 0x8000 else 0)
        load, sram = self.uop_load([(uops[0][1], 0, 0)])
        one = dict(uop_bgn=sram, uop_end=sram + 1)
        return [load, Alu(alu_op=AluOp.MOV, use_imm=True, imm=(v - low) >> 16, **one),
                Alu(alu_op=AluOp.SHR, use_imm=True, imm=-16, **one), Alu(alu_op=AluOp.ADD, use_imm=True, imm=low, **one)]

    def build(self):
        c = self.cfg
        insns = [self.load(MemType.INP, self.ni), self.load(MemType.WGT, self.nw, push_next=True)]
        self.compute.append(self.load(MemType.ACC, self.na, pop_prev=True))
        for _ in range(self.r(2, 7)):
            self.gemm() if self.coin() else self.alu()
        insns += self.compute
        insns.append(Gemm(push_next=True))       # an empty GEMM: compute's hand-over to store
        out = self.data(self.na * c.out_elem_bytes) // c.out_elem_bytes
        insns.append(Store(sram_base=0, dram_base=out, y_size=1, x_size=self.na, x_stride=self.na, pop_prev=True,
                           push_prev=True))
        insns.append(Finish(pop_next=True))
        dram = np.zeros(-(-self.at // 64) * 64 + 64, np.uint8)
        for addr, data in self.chunks:
            dram[addr:addr + data.size] = data
        return insns, dram


def program(cfg: AccelConfig, seed: int):
    return _Gen(cfg, seed).build()


def mismatch(cfg: AccelConfig, seed: int, chunk: int | None = None) -> str | None:
    """Where fsim and the reference differ on program `seed`, or None."""
    insns, dram = program(cfg, seed)
    ref_dram = dram.copy()
    ref = ReferenceMachine(cfg)
    ref.run(insns, ref_dram)
    sim = Fsim(cfg, check_races=chunk is None)   # (the closed-form ALU path runs without the race checker)
    with mock.patch.object(fsim_loops, "CHUNK_ELEMS", chunk or fsim_loops.CHUNK_ELEMS):
        sim.run_insns(dram, insns)
    for name, got, want in (("acc", sim.acc, ref.acc), ("out", sim.out, ref.out), ("dram", dram, ref_dram)):
        if not np.array_equal(got.astype(np.int64), want.astype(np.int64)):
            i = int(np.flatnonzero(got.reshape(-1).astype(np.int64) != want.reshape(-1).astype(np.int64))[0])
            return f"seed {seed}: {name} differs first at flat index {i}"
    return None


@pytest.mark.parametrize("chunk", [None, 16], ids=["whole", "chunked"])
@pytest.mark.parametrize("name", CONFIGS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_fsim_fast_paths_match_the_reference(name, chunk, seed):
    assert mismatch(CONFIGS[name], seed, chunk) is None


def _off_by_one(fn):
    """fn with its array result's first element plus one (a fast path that is slightly wrong)."""
    def wrong(*args, **kwargs):
        res = fn(*args, **kwargs)
        if isinstance(res, np.ndarray) and res.size:
            res = res.copy()
            res.reshape(-1)[0] += 1
        return res
    return wrong


def _bump_acc(fn):
    """A method that updates fsim's accumulator, followed by +1 on entry 0 when it took its path."""
    def wrong(self, *args, **kwargs):
        took = fn(self, *args, **kwargs)
        if took is not False:
            self.acc[0, 0, 0] += 1
        return took
    return wrong


MUTANTS = {   # name: (owner, attribute, how to break it)
    "gemm clustered": (Fsim, "_gemm_clustered", _bump_acc),
    "gemm separable": (Fsim, "_gemm_separable", _bump_acc),
    "gemm grouped": (Fsim, "_gemm_grouped", _bump_acc),
    "gemm gathered": (Fsim, "_gemm_gathered", _bump_acc),
    "gemm flush": (fsim_gemm, "flush_requant", _off_by_one),
    "flush seeds": (Fsim, "_flush", _bump_acc),
    "mov broadcast": (Fsim, "_mov_broadcast", _bump_acc),
    "alu repeated": (Fsim, "_alu_repeated", _bump_acc),
    "alu int32": (fsim_alu, "alu_apply_int32", _off_by_one),
    "alu int64": (fsim_alu, "alu_apply", _off_by_one),
    "alu flush": (fsim_alu, "flush_requant", _off_by_one),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_a_wrong_fast_path_is_caught(mutant):
    """Each fast path, broken on purpose, makes some of the first 40 programs differ (so the
    programs above reach it, and the comparison can fail)."""
    owner, attr, breaker = MUTANTS[mutant]
    with mock.patch.object(owner, attr, breaker(getattr(owner, attr))):
        for seed in range(40):
            for name in ("tiny", "acc16", "batch2"):
                if mismatch(CONFIGS[name], seed, 16 if mutant == "alu repeated" else None):
                    return
    pytest.fail(f"breaking {attr} changed none of the programs' results")


def test_programs_cover_the_alu_and_gemm_forms():
    """Over the seeds the mutants use: every ALU op with both operand kinds, and GEMMs with reset,
    flush (into the seed and into the accumulator) over two loop levels."""
    seen = set()
    for seed in range(40):
        insns, _ = program(CONFIGS["tiny"], seed)
        epi = None
        for i in insns:
            if isinstance(i, Epilogue):
                epi = i
            elif isinstance(i, Alu) and i.uop_end > i.uop_bgn:
                seen.add((i.alu_op.name, i.use_imm))
            elif isinstance(i, Gemm) and i.uop_end > i.uop_bgn and i.iter_out > 1 and i.iter_in > 1:
                seen.add(("gemm", i.reset, i.flush and ("to_acc" if epi.to_acc else "seed")))
    want = {(op.name, imm) for op in AluOp for imm in (False, True)}
    want |= {("gemm", False, False), ("gemm", True, False), ("gemm", False, "seed"), ("gemm", False, "to_acc")}
    assert want <= seen, f"not covered: {sorted(map(str, want - seen))}"
