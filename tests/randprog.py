"""Seeded random programs, built through the host runtime's CommandStream, for differential tests.

    prog, regions = random_program(cfg, seed)
    # prog: accel.isa.Program (instructions + DRAM image); regions: {name: (byte addr, nbytes)}
    # of every DRAM area a STORE writes (also prog.symbols, as int8 byte arrays)
    want = expected_outputs(prog, regions)   # {name: bytes} from the reference model

A program is a few blocks. Block b uses slot b % slots (slots = 1 or 2) of each on-chip buffer:
the load stage fills the slot's input/weight area with random padded tiles, compute loads
accumulator tiles and runs random GEMMs (random loops, factors, reset) and ALU ops (every op,
register and immediate operands) inside the slot, and the store stage writes random tiles of
the slot's output area to fresh DRAM regions (pre-filled with noise, so gaps must survive).
Dependency tokens order block b's stages and keep block b + slots off a slot still in use, so
with two slots the stages overlap, and program order stays a valid (race-free) order.
"""
from __future__ import annotations

import numpy as np

from accel.isa import AccelConfig, AluOp, MemType, Program, Stage, Symbol, flush_immediate
from host_runtime import Device
from host_runtime.commands import CommandStream
from sim.reference import run_reference

L, C, S = Stage.LOAD, Stage.COMPUTE, Stage.STORE

MAX_REGION = 48      # entries of each buffer a slot uses (keeps the reference model fast)
MAX_ITERATIONS = 96  # micro-op iterations of one GEMM/ALU


class _Gen:
    def __init__(self, cfg: AccelConfig, seed: int, dram_bytes: int):
        self.cfg = cfg
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.dev = Device(cfg, driver=None, dram_bytes=dram_bytes)
        self.s: CommandStream = self.dev.stream()
        self.slots = int(self.rng.integers(1, 3))
        self.regions: dict[str, tuple[int, int]] = {}
        self.kernels = []
        c = cfg
        self.size = {m: min(MAX_REGION, d // self.slots) for m, d in
                     ((MemType.INP, c.inp_depth), (MemType.WGT, c.wgt_depth), (MemType.ACC, c.acc_depth))}
        # DRAM sources: random bytes, accumulator values a mix of full-range and small ones
        mem = self.dev.memory
        self.src = {}
        for m, n in ((MemType.INP, 96), (MemType.WGT, 96), (MemType.ACC, 96)):
            eb = {MemType.INP: c.inp_elem_bytes, MemType.WGT: c.wgt_elem_bytes, MemType.ACC: c.acc_elem_bytes}[m]
            data = self.rng.integers(0, 256, n * eb, dtype=np.uint8)
            if m == MemType.ACC:
                vals = data.view(f"<i{c.acc_width // 8}").copy()
                small = self.rng.random(vals.size) < 0.5
                vals[small] = self.rng.integers(-300, 300, int(small.sum()))
                data = vals.view(np.uint8)
            self.src[m] = mem.alloc_array(data, align=max(64, eb), name=f"src {m.name}")

    def r(self, lo: int, hi: int) -> int:
        """Random integer in [lo, hi]."""
        return int(self.rng.integers(lo, hi + 1))

    # ---- pieces ---------------------------------------------------------------------------
    def load(self, mem: MemType, slot: int) -> None:
        size = self.size[mem]
        base = slot * size
        if self.rng.random() < 0.1:  # a padding-only or empty load
            ypad = self.r(0, 2)
            self.s.load_2d(mem, base, self.src[mem], y_size=0, x_size=0, y_pad0=ypad, x_pad0=min(ypad, 1))
            return
        for _ in range(20):
            y, x = self.r(1, 4), self.r(1, 6)
            pads = [self.r(0, 2) for _ in range(4)]
            if self.rng.random() < 0.05:
                pads[self.r(0, 3)] = 15
            rows, cols = pads[0] + y + pads[1], pads[2] + x + pads[3]
            if rows * cols <= size:
                break
        else:
            y, x, pads, rows, cols = 1, 1, [0, 0, 0, 0], 1, 1
        stride = x + self.r(0, 3)
        n_src = self.src[mem].nbytes // {MemType.INP: self.cfg.inp_elem_bytes, MemType.WGT: self.cfg.wgt_elem_bytes,
                                         MemType.ACC: self.cfg.acc_elem_bytes}[mem]
        span = (y - 1) * stride + x
        self.s.load_2d(mem, base + self.r(0, size - rows * cols), self.src[mem], self.r(0, n_src - span),
                       y_size=y, x_size=x, x_stride=stride, y_pad0=pads[0], y_pad1=pads[1], x_pad0=pads[2],
                       x_pad1=pads[3])

    def _kernel(self, slot: int, gemm: bool):
        """A random kernel whose every index stays inside the slot's areas."""
        if self.kernels and self.rng.random() < 0.25:  # reuse one (resident or evicted)
            k, kslot, kgemm = self.kernels[self.r(0, len(self.kernels) - 1)]
            if kslot == slot and kgemm == gemm:
                return k
        acc_n = self.size[MemType.ACC]
        src_n = self.size[MemType.INP] if gemm else acc_n
        wgt_n = self.size[MemType.WGT]
        nloops = self.r(0, 2)
        big = self.rng.random() < 0.15
        nuops = self.r(60, 160) if big else self.r(0, 4)
        nuops = min(nuops, self.cfg.uop_depth)
        budget = max(1, MAX_ITERATIONS // max(1, nuops))
        loops = []
        for _ in range(nloops):
            e = self.r(1, max(1, min(4, budget)))
            budget = max(1, budget // e)
            loops.append([e, self.r(0, 3), self.r(0, 3), self.r(0, 3)])
        reach = [sum((l[0] - 1) * l[1 + i] for l in loops) for i in range(3)]
        # shrink factors until every loop fits its area
        for i, n in enumerate((acc_n, src_n, wgt_n)):
            while reach[i] >= n:
                for l in loops:
                    l[1 + i] = max(0, l[1 + i] - 1)
                reach[i] = sum((l[0] - 1) * l[1 + i] for l in loops)
        uops = [(slot * acc_n + self.r(0, acc_n - 1 - reach[0]),
                 slot * src_n + self.r(0, src_n - 1 - reach[1]),
                 slot * wgt_n + self.r(0, wgt_n - 1 - reach[2])) for _ in range(nuops)]
        key = ("randprog", self.seed, len(self.kernels))

        def build(kb):
            for e, fd, fs, fw in loops:
                kb.loop_begin(e, fd, fs, fw)
            for d, s_, w in uops:
                kb.push(d, s_, w)
            for _ in loops:
                kb.loop_end()
        k = self.s.kernel(key, build)
        self.kernels.append((k, slot, gemm))
        return k

    def gemm(self, slot: int) -> None:
        k = self._kernel(slot, True)
        flush = self.rng.random() < 0.15
        if flush:
            self.epilogue(slot, k)
        self.s.push_gemm(k, reset=self.rng.random() < 0.2, flush=flush)

    def epilogue(self, slot: int, k) -> None:
        """EPILOGUE for a flushing GEMM over kernel k: random FLUSH parameters and seeds inside the
        slot's accumulator area (which may be the entries the GEMM writes: the in-order case)."""
        acc_n = self.size[MemType.ACC]
        loops = k.loop_fields()
        f = [self.r(0, 3), self.r(0, 3)]
        reach = lambda: (loops["iter_out"] - 1) * f[0] + (loops["iter_in"] - 1) * f[1]   # noqa: E731
        while reach() >= acc_n:
            f = [max(0, v - 1) for v in f]
        hi = self.r(-128, 127) if self.rng.random() < 0.3 else self.r(0, 127)
        imm = flush_immediate(self.r(0, 31), hi, self.rng.random() < 0.5, self.rng.random() < 0.5,
                              self.rng.random() < 0.3)
        self.s.push_epilogue(imm, slot * acc_n + self.r(0, acc_n - 1 - reach()), *f, to_acc=self.rng.random() < 0.3)

    def alu(self, slot: int, op: AluOp | None = None) -> None:
        op = AluOp(self.r(0, len(AluOp) - 1)) if op is None else op
        imm = None
        if op == AluOp.FLUSH:   # the immediate holds its parameters; FLUSH reads the register even with use_imm
            hi = self.r(-128, 127) if self.rng.random() < 0.3 else self.r(0, 127)
            imm = flush_immediate(self.r(0, 31), hi, self.rng.random() < 0.5, self.rng.random() < 0.5,
                                  self.rng.random() < 0.3)
            self.s.push_alu(self._kernel(slot, False), op, imm, use_imm=self.rng.random() < 0.2)
            return
        if self.rng.random() < 0.5:
            if op == AluOp.SHR:
                imm = self.r(-40, 40)
            elif self.rng.random() < 0.3:
                imm = self.r(-(1 << 15), (1 << 15) - 1)
            else:
                imm = self.r(-200, 200)
        self.s.push_alu(self._kernel(slot, False), op, imm)

    def store(self, slot: int) -> None:
        size = self.size[MemType.ACC]
        y, x = self.r(1, 4), self.r(1, 6)
        while y * x > size:
            y, x = max(1, y - 1), max(1, x - 1)
        stride = x + self.r(0, 2)
        eb = self.cfg.out_elem_bytes
        nbytes = ((y - 1) * stride + x) * eb
        name = f"out{len(self.regions)}"
        buf = self.dev.memory.alloc_array(self.rng.integers(0, 256, nbytes, dtype=np.uint8), align=max(64, eb),
                                          name=name)
        self.regions[name] = (buf.addr, buf.nbytes)
        self.s.store_2d(slot * size + self.r(0, size - y * x), buf, y_size=y, x_size=x, x_stride=stride)

    # ---- the program ----------------------------------------------------------------------
    def build(self, n_blocks: int | None) -> tuple[Program, dict[str, tuple[int, int]]]:
        s, ns = self.s, self.slots
        nb = self.r(1, 5) if n_blocks is None else n_blocks
        for b in range(nb):
            slot = b % ns
            if b >= ns:
                s.dep_pop(C, L)  # compute is done with this slot's inputs and weights
            for _ in range(self.r(0, 3)):
                self.load(MemType.INP if self.rng.random() < 0.5 else MemType.WGT, slot)
            s.dep_push(L, C)
            if b >= ns:
                s.dep_pop(S, C)  # the store stage is done with this slot's outputs
            s.dep_pop(L, C)
            for _ in range(self.r(1, 8)):
                p = self.rng.random()
                if p < 0.2:
                    self.load(MemType.ACC, slot)
                elif p < 0.55:
                    self.gemm(slot)
                else:
                    self.alu(slot)
            if self.rng.random() < 0.2:  # a redundant extra round trip with the load stage
                s.dep_push(C, L)
                s.dep_pop(C, L)
                s.dep_push(L, C)
                s.dep_pop(L, C)
            if b + ns < nb:
                s.dep_push(C, L)
            s.dep_push(C, S)
            s.dep_pop(C, S)
            for _ in range(self.r(1, 3)):
                self.store(slot)
            if b + ns < nb:
                s.dep_push(S, C)
        symbols = {name: Symbol(addr, (n,), "int8") for name, (addr, n) in self.regions.items()}
        return s.program(symbols), dict(self.regions)


def random_program(cfg: AccelConfig, seed: int, n_blocks: int | None = None,
                   dram_bytes: int = 1 << 20) -> tuple[Program, dict[str, tuple[int, int]]]:
    """A random race-free program for `cfg` (same seed, same program) and its output regions
    {name: (byte address, nbytes)}; prog.dram_image() is the DRAM it starts from."""
    return _Gen(cfg, seed, dram_bytes).build(n_blocks)


def expected_outputs(prog: Program, regions: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
    """The bytes each output region holds after the program, from sim/reference.py."""
    dram = run_reference(prog.config, prog.insns, prog.dram_image())
    return {name: dram[a:a + n].copy() for name, (a, n) in regions.items()}
