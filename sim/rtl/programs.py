"""Directed programs for the RTL: tests (tests/hw) and figures (bench/rtl_report.py) share them.

Built from accel.isa instructions only; each returns an accel.isa.Program whose DRAM image holds
its data, output areas filled with noise so that bytes a STORE must not touch are checked too.
Every program is race-free in program order (its dependency tokens order the stages), so the
functional simulator's DRAM is the expected result byte for byte.
"""
from __future__ import annotations

import numpy as np

from accel.isa import AccelConfig, Alu, AluOp, Finish, Gemm, Load, MemType, Program, Store, Uop, elem_bytes, encode_uops
from accel.isa.operands import clamp_immediate


class Builder:
    """Collects DRAM segments and instructions; program() places the code after the data."""

    def __init__(self, cfg: AccelConfig, seed: int = 0, dram_bytes: int = 1 << 16):
        self.cfg, self.rng = cfg, np.random.default_rng(seed)
        self.segments: list[tuple[int, bytes]] = []
        self.insns = []
        self.top = 0x100
        self.dram_bytes = dram_bytes

    def put(self, data, align: int = 64) -> int:
        """Place bytes in DRAM; returns the byte address."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1).tobytes()
        addr = -(-self.top // align) * align
        self.segments.append((addr, raw))
        self.top = addr + len(raw)
        return addr

    def noise(self, nbytes: int, align: int = 64) -> int:
        return self.put(self.rng.integers(0, 256, nbytes, dtype=np.uint8), align)

    def ent(self, addr: int, mem: MemType) -> int:
        """Byte address -> entry address (LOAD/STORE dram_base) for the buffer's entry size."""
        eb = elem_bytes(self.cfg, mem)
        assert addr % eb == 0, (addr, eb)
        return addr // eb

    def uops(self, uops: list[Uop], sram_base: int, **deps) -> None:
        addr = self.put(encode_uops(uops, self.cfg))
        self.insns.append(Load(mem_type=MemType.UOP, sram_base=sram_base, dram_base=self.ent(addr, MemType.UOP),
                               y_size=1, x_size=len(uops), x_stride=len(uops), **deps))

    def random_tile(self, mem: MemType, n: int, lo: int | None = None, hi: int | None = None) -> np.ndarray:
        c = self.cfg
        width = {MemType.INP: c.inp_width, MemType.WGT: c.wgt_width, MemType.ACC: c.acc_width}[mem]
        lo = -(1 << (width - 1)) if lo is None else lo
        hi = (1 << (width - 1)) - 1 if hi is None else hi
        shape = {MemType.INP: (c.batch, c.block_in), MemType.WGT: (c.block_out, c.block_in),
                 MemType.ACC: (c.batch, c.block_out)}[mem]
        return self.rng.integers(lo, hi + 1, (n, *shape)).astype(f"<i{width // 8}")

    def emit(self, *insns) -> None:
        self.insns.extend(insns)

    def program(self) -> Program:
        addr = -(-self.top // 64) * 64
        return Program(self.cfg, list(self.insns), insn_addr=addr, dram_bytes=self.dram_bytes,
                       segments=list(self.segments))


def _store_out(b: Builder, sram_base: int, rows: int, cols: int, stride_extra: int = 1, **deps) -> None:
    """STORE rows x cols out entries to a fresh noisy DRAM area (row gaps stay noise)."""
    eb = b.cfg.out_elem_bytes
    stride = cols + stride_extra
    addr = b.noise(((rows - 1) * stride + cols) * eb, align=max(64, eb))
    b.emit(Store(sram_base=sram_base, dram_base=b.ent(addr, MemType.OUT), y_size=rows, x_size=cols,
                 x_stride=stride, **deps))


def _flush_to_out(b: Builder, base: int, n: int, uop_slot: int, **deps) -> None:
    """ALU ADD imm 0 over acc[base:base+n]: writes their narrowed values to out."""
    b.uops([Uop(acc=base, src=base)], uop_slot)
    b.emit(Alu(uop_bgn=uop_slot, uop_end=uop_slot + 1, iter_out=n, dst_factor_out=1, src_factor_out=1,
               alu_op=AluOp.ADD, use_imm=True, imm=0, **deps))


# ---- the directed programs --------------------------------------------------------------------
def every_kind(cfg: AccelConfig, seed: int = 0) -> Program:
    """LOAD of each buffer, GEMM (accumulating onto a loaded accumulator tile), ALU with register
    and immediate operands, STORE, FINISH; the stages hand over through tokens."""
    b = Builder(cfg, seed)
    n = 4
    inp = b.put(b.random_tile(MemType.INP, n), align=cfg.inp_elem_bytes)
    wgt = b.put(b.random_tile(MemType.WGT, 2), align=cfg.wgt_elem_bytes)
    acc = b.put(b.random_tile(MemType.ACC, n, -1000, 1000), align=cfg.acc_elem_bytes)
    b.emit(Load(mem_type=MemType.INP, sram_base=0, dram_base=b.ent(inp, MemType.INP), y_size=1, x_size=n, x_stride=n),
           Load(mem_type=MemType.WGT, sram_base=0, dram_base=b.ent(wgt, MemType.WGT), y_size=1, x_size=2, x_stride=2,
                push_next=True))
    b.uops([Uop(acc=i, src=i, wgt=i % 2) for i in range(n)], 0, pop_prev=True)
    b.emit(Load(mem_type=MemType.ACC, sram_base=0, dram_base=b.ent(acc, MemType.ACC), y_size=1, x_size=n, x_stride=n),
           Gemm(uop_bgn=0, uop_end=n))
    b.uops([Uop(acc=i, src=(i + 1) % n) for i in range(n)], n)
    b.emit(Alu(uop_bgn=n, uop_end=2 * n, alu_op=AluOp.ADD),                       # register operand
           Alu(uop_bgn=n, uop_end=2 * n, alu_op=AluOp.SHR, use_imm=True, imm=6, push_next=True))
    _store_out(b, 0, 2, 2, pop_prev=True, push_prev=True)
    b.emit(Finish(pop_next=True))
    return b.program()


PAD_CASES = [(1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 2, 3, 1), (2, 0, 0, 3), (0, 1, 2, 0)]


def padding(cfg: AccelConfig, seed: int = 0) -> Program:
    """Loads with zero padding on every side, alone and combined, into ACC (seen directly through
    the ALU), INP (through a GEMM with an identity weight) and WGT (through one-hot inputs),
    plus a padded micro-op load and a padding-only load."""
    b = Builder(cfg, seed)
    c = cfg
    y, x = 2, 3
    acc_src = b.put(b.random_tile(MemType.ACC, 16, -100, 100), align=c.acc_elem_bytes)
    inp_src = b.put(b.random_tile(MemType.INP, 16), align=c.inp_elem_bytes)
    wgt_src = b.put(b.random_tile(MemType.WGT, 8), align=c.wgt_elem_bytes)
    # ACC: padded tile -> out via ALU -> DRAM
    base = 0
    for i, (yp0, yp1, xp0, xp1) in enumerate(PAD_CASES):
        rows, cols = yp0 + y + yp1, xp0 + x + xp1
        b.emit(Load(mem_type=MemType.ACC, sram_base=base, dram_base=b.ent(acc_src, MemType.ACC) + i, y_size=y,
                    x_size=x, x_stride=x + 1, y_pad0=yp0, y_pad1=yp1, x_pad0=xp0, x_pad1=xp1))
        _flush_to_out(b, base, rows * cols, uop_slot=i)
        base += rows * cols
    n_acc = base
    # INP: padded tile; identity weight (block_out x block_in, ones on the diagonal) at wgt[0]
    eye = np.zeros((1, c.block_out, c.block_in), dtype=f"<i{c.wgt_width // 8}")
    for k in range(min(c.block_out, c.block_in)):
        eye[0, k, k] = 1
    eye_addr = b.put(eye, align=c.wgt_elem_bytes)
    b.emit(Load(mem_type=MemType.WGT, sram_base=0, dram_base=b.ent(eye_addr, MemType.WGT), y_size=1, x_size=1,
                x_stride=1))
    ibase = 0
    for i, (yp0, yp1, xp0, xp1) in enumerate(PAD_CASES[:4] + PAD_CASES[4:5]):
        rows, cols = yp0 + y + yp1, xp0 + x + xp1
        b.emit(Load(mem_type=MemType.INP, sram_base=ibase, dram_base=b.ent(inp_src, MemType.INP) + i, y_size=y,
                    x_size=x, x_stride=x + 2, y_pad0=yp0, y_pad1=yp1, x_pad0=xp0, x_pad1=xp1))
        ibase += rows * cols
    # one-hot inputs after the padded ones, padded weights after the identity
    onehot = np.zeros((c.block_in, c.batch, c.block_in), dtype=f"<i{c.inp_width // 8}")
    for j in range(c.block_in):
        onehot[j, :, j] = 1
    oh_addr = b.put(onehot, align=c.inp_elem_bytes)
    b.emit(Load(mem_type=MemType.INP, sram_base=ibase, dram_base=b.ent(oh_addr, MemType.INP), y_size=1,
                x_size=c.block_in, x_stride=c.block_in))
    wbase = 1
    b.emit(Load(mem_type=MemType.WGT, sram_base=wbase, dram_base=b.ent(wgt_src, MemType.WGT), y_size=2, x_size=1,
                x_stride=3, y_pad0=1, y_pad1=1, x_pad0=1, x_pad1=0, push_next=True))
    n_wgt = (1 + 2 + 1) * (1 + 1)
    # compute: GEMM inp -> acc (identity), then one-hot x padded weights -> acc
    b.uops([Uop(acc=n_acc, src=0, wgt=0)], 10, pop_prev=True)
    b.emit(Gemm(uop_bgn=10, uop_end=11, iter_out=ibase, dst_factor_out=1, src_factor_out=1, reset=True),
           Gemm(uop_bgn=10, uop_end=11, iter_out=ibase, dst_factor_out=1, src_factor_out=1))
    gbase = n_acc + ibase
    b.uops([Uop(acc=gbase + j, src=ibase + j, wgt=wbase) for j in range(c.block_in)], 11)
    b.emit(Gemm(uop_bgn=11, uop_end=11 + c.block_in, iter_out=n_wgt, dst_factor_out=c.block_in, wgt_factor_out=1,
                reset=True),
           Gemm(uop_bgn=11, uop_end=11 + c.block_in, iter_out=n_wgt, dst_factor_out=c.block_in, wgt_factor_out=1))
    total = gbase + n_wgt * c.block_in
    # a padded micro-op load (the pads are zero micro-ops) and a padding-only ACC load
    b.uops([Uop(acc=total, src=0, wgt=0)], 20)
    b.emit(Load(mem_type=MemType.UOP, sram_base=30, dram_base=b.ent(b.put(encode_uops([Uop(acc=total + 1)], c)),
                                                                    MemType.UOP),
                y_size=1, x_size=1, x_stride=1, x_pad0=1, x_pad1=2),
           Gemm(uop_bgn=30, uop_end=34),
           Load(mem_type=MemType.ACC, sram_base=total + 2, dram_base=0, y_size=0, x_size=0, y_pad0=2, x_pad0=1,
                push_next=True))
    # store everything: out[0:total + 4]
    rows = -(-(total + 4) // 8)
    _store_out(b, 0, rows, 8, stride_extra=0, pop_prev=True, push_prev=True)
    b.emit(Finish(pop_next=True))
    return b.program()


IMMEDIATES = {AluOp.MIN: [-5, 300], AluOp.MAX: [-5, 300], AluOp.ADD: [-32768, 12345], AluOp.SHR: [3, -4, 31, -32],
              AluOp.MUL: [-3, 32767], AluOp.CLIP: [100, -7], AluOp.MOV: [-32768, 77],
              AluOp.CLAMP: [clamp_immediate(-10, 100), clamp_immediate(5, -3), clamp_immediate(-128, 127)]}


def alu_ops(cfg: AccelConfig, seed: int = 0) -> Program:
    """Every ALU op with a register operand and with immediates. Each result R is shown in full:
    out holds the low byte of R (narrowing), and of copies of R shifted right by 8, 16 and 24,
    all stored after each case. Operands include the extremes and SHR amounts beyond +-width."""
    b = Builder(cfg, seed, dram_bytes=1 << 17)
    c = cfg
    n = 4
    extremes = np.array([-(1 << 31), (1 << 31) - 1, -1, 0, 1, 255, -256, 1 << 20])
    a = b.random_tile(MemType.ACC, n)
    a.reshape(-1)[:len(extremes)] = extremes.astype(a.dtype)
    bv = b.random_tile(MemType.ACC, n)
    bv.reshape(-1)[:5] = np.array([-33, 40, 7, -1, -(1 << 31)]).astype(bv.dtype)
    a_addr, b_addr = b.put(a, align=c.acc_elem_bytes), b.put(bv, align=c.acc_elem_bytes)
    A, B, R = 0, n, 2 * n                       # acc areas: operand a, operand b, result; R + s*n: R >> 8s
    b.emit(Load(mem_type=MemType.ACC, sram_base=A, dram_base=b.ent(a_addr, MemType.ACC), y_size=1, x_size=n,
                x_stride=n),
           Load(mem_type=MemType.ACC, sram_base=B, dram_base=b.ent(b_addr, MemType.ACC), y_size=1, x_size=n,
                x_stride=n))
    b.uops([Uop(acc=R, src=A), Uop(acc=R, src=B)] + [Uop(acc=R + s * n, src=R) for s in (1, 2, 3)], 0)
    loop = dict(iter_out=n, dst_factor_out=1, src_factor_out=1)
    cases = [(op, None) for op in AluOp] + [(op, imm) for op, imms in IMMEDIATES.items() for imm in imms]
    for k, (op, imm) in enumerate(cases):
        b.emit(Alu(uop_bgn=0, uop_end=1, alu_op=AluOp.MOV, pop_next=k > 0, **loop))          # R = A
        if imm is None:
            b.emit(Alu(uop_bgn=1, uop_end=2, alu_op=op, **loop))                             # R = op(R, B)
        else:
            b.emit(Alu(uop_bgn=0, uop_end=1, alu_op=op, use_imm=True, imm=imm, **loop))       # R = op(R, imm)
        for s in (1, 2, 3):
            b.emit(Alu(uop_bgn=1 + s, uop_end=2 + s, alu_op=AluOp.MOV, **loop),
                   Alu(uop_bgn=1 + s, uop_end=2 + s, alu_op=AluOp.SHR, use_imm=True, imm=8 * s,
                       push_next=s == 3, **loop))
        _store_out(b, R, 1, 4 * n, pop_prev=True, push_prev=True)
    b.emit(Finish(pop_next=True))
    return b.program()


def uop_loops(cfg: AccelConfig, seed: int = 0) -> Program:
    """GEMM and ALU micro-op ranges inside both loop levels, with every index factor non-zero,
    reset GEMMs, an empty range and zero iteration counts (no-ops), and back-to-back micro-ops on
    the same accumulator (the GEMM core's read-after-write bypass)."""
    b = Builder(cfg, seed)
    c = cfg
    inp = b.put(b.random_tile(MemType.INP, 32), align=c.inp_elem_bytes)
    wgt = b.put(b.random_tile(MemType.WGT, 8), align=c.wgt_elem_bytes)
    acc = b.put(b.random_tile(MemType.ACC, 48, -5000, 5000), align=c.acc_elem_bytes)
    b.emit(Load(mem_type=MemType.INP, sram_base=0, dram_base=b.ent(inp, MemType.INP), y_size=4, x_size=8, x_stride=8),
           Load(mem_type=MemType.WGT, sram_base=0, dram_base=b.ent(wgt, MemType.WGT), y_size=1, x_size=8, x_stride=8,
                push_next=True))
    b.uops([Uop(acc=0, src=0, wgt=0), Uop(acc=1, src=2, wgt=1), Uop(acc=1, src=3, wgt=2),   # 1, 2: same acc
            Uop(acc=0, src=1, wgt=3)], 0, pop_prev=True)
    b.emit(Load(mem_type=MemType.ACC, sram_base=0, dram_base=b.ent(acc, MemType.ACC), y_size=1, x_size=48,
                x_stride=48),
           Gemm(uop_bgn=0, uop_end=4, iter_out=3, iter_in=2, dst_factor_out=6, dst_factor_in=2,
                src_factor_out=5, src_factor_in=1, wgt_factor_out=1, wgt_factor_in=2),
           Gemm(uop_bgn=0, uop_end=3, iter_out=2, iter_in=3, dst_factor_out=20, dst_factor_in=7, reset=True),
           Gemm(uop_bgn=1, uop_end=3, iter_out=4, iter_in=1, dst_factor_out=0, src_factor_out=1,   # same acc, 8 in a row
                wgt_factor_out=1),
           Gemm(uop_bgn=2, uop_end=2, iter_out=5),                # empty micro-op range
           Gemm(uop_bgn=0, uop_end=4, iter_out=0, iter_in=3))     # zero iterations
    b.uops([Uop(acc=30, src=0), Uop(acc=31, src=30)], 4)          # 31 reads what 30 just wrote
    b.emit(Alu(uop_bgn=4, uop_end=6, iter_out=3, iter_in=2, dst_factor_out=4, dst_factor_in=1, src_factor_out=2,
               src_factor_in=5, alu_op=AluOp.ADD),
           Alu(uop_bgn=4, uop_end=6, iter_out=2, iter_in=3, dst_factor_out=1, dst_factor_in=3, alu_op=AluOp.MUL,
               use_imm=True, imm=-3),
           Alu(uop_bgn=4, uop_end=6, iter_out=4, iter_in=4, alu_op=AluOp.ADD, use_imm=True, imm=1),  # same dst 16x
           Alu(uop_bgn=0, uop_end=4, iter_out=3, iter_in=2, dst_factor_out=6, dst_factor_in=2, alu_op=AluOp.SHR,
               use_imm=True, imm=4, push_next=True))
    _store_out(b, 0, 6, 8, pop_prev=True, push_prev=True)
    b.emit(Finish(pop_next=True))
    return b.program()


def pipelined_matmul(cfg: AccelConfig, n_tiles: int = 6, overlap: bool = True, k_blocks: int = 4,
                     seed: int = 0) -> Program:
    """The same work overlapped or serialized: per tile, load an input tile (m x k_blocks) and a
    weight tile (k_blocks), GEMM them into m accumulator entries, shift, store.

    overlap=True: two slots of every buffer area (slot = tile % 2); load of tile t waits only for
    compute to release slot t % 2 (tile t-2), compute of tile t for its load and for the store of
    tile t-2, so loads of t+1 and stores of t-1 run while tile t computes.
    overlap=False: one slot and a fully serial chain: tile t's load starts after tile t-1's store.
    """
    b = Builder(cfg, seed, dram_bytes=1 << 18)
    c = cfg
    m = 4
    inp = b.put(b.random_tile(MemType.INP, n_tiles * m * k_blocks), align=c.inp_elem_bytes)
    wgt = b.put(b.random_tile(MemType.WGT, n_tiles * k_blocks), align=c.wgt_elem_bytes)
    out = b.noise(n_tiles * m * c.out_elem_bytes, align=64)
    slots = 2 if overlap else 1
    islot, wslot, aslot = m * k_blocks, k_blocks, m
    for sl in range(slots):     # kernel of slot sl: for i0 < m, u < k_blocks: acc[i0] += inp[i0, u] @ wgt[u]
        b.uops([Uop(acc=sl * aslot, src=sl * islot + k, wgt=sl * wslot + k) for k in range(k_blocks)], sl * k_blocks)
    shr0 = slots * k_blocks
    b.uops([Uop(acc=sl * aslot) for sl in range(slots)], shr0)

    def noop(**deps):   # a compute instruction that only moves tokens (zero iterations)
        return Alu(uop_bgn=shr0, uop_end=shr0 + 1, iter_out=0, alu_op=AluOp.ADD, use_imm=True, **deps)

    for t in range(n_tiles):
        sl = t % slots
        if not overlap and t > 0:
            b.emit(noop(pop_next=True, push_prev=True))       # tile t-1 stored: let the load go on
        b.emit(Load(mem_type=MemType.INP, sram_base=sl * islot,
                    dram_base=b.ent(inp, MemType.INP) + t * m * k_blocks, y_size=1, x_size=m * k_blocks,
                    x_stride=m * k_blocks, pop_next=t >= slots or (not overlap and t > 0)),
               Load(mem_type=MemType.WGT, sram_base=sl * wslot, dram_base=b.ent(wgt, MemType.WGT) + t * k_blocks,
                    y_size=1, x_size=k_blocks, x_stride=k_blocks, push_next=True))
        kern = dict(uop_bgn=sl * k_blocks, uop_end=(sl + 1) * k_blocks, iter_out=m, dst_factor_out=1,
                    src_factor_out=k_blocks)
        b.emit(Gemm(reset=True, pop_prev=True, pop_next=overlap and t >= slots, **kern),
               Gemm(push_prev=overlap and t + slots < n_tiles, **kern),
               Alu(uop_bgn=shr0 + sl, uop_end=shr0 + sl + 1, iter_out=m, dst_factor_out=1, alu_op=AluOp.SHR,
                   use_imm=True, imm=9, push_next=True))
        b.emit(Store(sram_base=sl * aslot, dram_base=b.ent(out, MemType.OUT) + t * m, y_size=1, x_size=m,
                     x_stride=m, pop_prev=True, push_prev=True))
    for _ in range(min(slots, n_tiles) - 1):
        b.emit(noop(pop_next=True))     # drain the store tokens compute has not popped ...
    b.emit(Finish(pop_next=True))       # ... so that FINISH waits for the last store
    return b.program()


def gemm_only(cfg: AccelConfig, n_uops: int = 16, iters: int = 256, seed: int = 0) -> Program:
    """One LOAD UOP, one long GEMM (n_uops micro-ops x iters iterations), FINISH: the GEMM core's
    utilisation test (inputs and weights are whatever the buffers hold)."""
    b = Builder(cfg, seed)
    b.uops([Uop(acc=i % 8, src=i, wgt=i % 4) for i in range(n_uops)], 0)
    b.emit(Gemm(uop_bgn=0, uop_end=n_uops, iter_out=iters, dst_factor_out=1 if iters <= cfg.acc_depth - 8 else 0),
           Finish())
    return b.program()



def long_rows(cfg: AccelConfig, seed: int = 0) -> Program:
    """Rows longer than one burst (the 256-beat limit) and rows crossing 4 KiB boundaries, on
    loads (accumulator tiles) and stores."""
    b = Builder(cfg, seed, dram_bytes=1 << 16)
    c = cfg
    eb_acc, eb_out = c.acc_elem_bytes, c.out_elem_bytes
    n = min(c.acc_depth, (3 * 256 * c.bus_bytes) // eb_acc)      # about three bursts' worth
    # accumulator tile placed to start just below a 4 KiB boundary
    b.top = 4096 * 2 - 3 * eb_acc * 2
    acc = b.put(b.random_tile(MemType.ACC, n, -100, 100), align=eb_acc)
    b.emit(Load(mem_type=MemType.ACC, sram_base=0, dram_base=b.ent(acc, MemType.ACC), y_size=1, x_size=n,
                x_stride=n))
    b.uops([Uop(acc=0, src=0)], 0)
    b.emit(Alu(uop_bgn=0, uop_end=1, iter_out=n, dst_factor_out=1, alu_op=AluOp.ADD, use_imm=True, imm=3,
               push_next=True))
    # store rows: one long row from just below a 4 KiB boundary, then two rows straddling another
    b.top = 4096 * 5 - 5 * eb_out
    out1 = b.noise(n * eb_out, align=eb_out)
    b.emit(Store(sram_base=0, dram_base=b.ent(out1, MemType.OUT), y_size=1, x_size=n, x_stride=n, pop_prev=True))
    b.top = 4096 * 7 - 7 * eb_out
    rows, cols = 2, n // 2 - 1
    out2 = b.noise((rows * (cols + 3)) * eb_out, align=eb_out)
    b.emit(Store(sram_base=1, dram_base=b.ent(out2, MemType.OUT), y_size=rows, x_size=cols, x_stride=cols + 3,
                 push_prev=True))
    b.emit(Finish(pop_next=True))
    return b.program()
