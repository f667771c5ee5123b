"""Functional simulator: exactness of the float GEMM paths, ALU arithmetic, hazards, errors, deadlocks."""
import builtins
import dataclasses
import io
import tracemalloc
from dataclasses import asdict, fields

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_info

from accel.hw.params import ErrorCode
from accel.isa import (
    PRESETS,
    AccelConfig,
    Alu,
    AluOp,
    Finish,
    Gemm,
    Load,
    MemType,
    Store,
    Uop,
    encode_program,
    encode_uops,
    flush_immediate,
)
from sim.errors import DeadlockError, ExecError, ProgramFault, SimError
from sim.fsim import (
    IDLE_RECOUNT_S,
    THREADED_MATMUL_MACS,
    BlasThreads,
    Fsim,
    FsimStats,
    alu_apply,
    alu_apply_int32,
    flush_requant,
    gemm_float_dtype,
    idle_cores,
)
from sim.fsim import blas as fsim_blas
from sim.fsim import loops as fsim_loops
from sim.reference import ReferenceMachine

TINY = PRESETS["tiny"]
TINY_ACC16 = dataclasses.replace(TINY, acc_width=16, out_buff_bytes=2048)


def _run(cfg, prog, dram=None, sim=None):
    dram = np.zeros(1 << 16, np.uint8) if dram is None else dram
    code = encode_program(prog, cfg).reshape(-1)
    dram[:code.size] = code
    sim = sim or Fsim(cfg)
    return sim, sim.run(dram, 0, len(prog))


@pytest.mark.parametrize("cfg", [PRESETS["default"], AccelConfig(block_in=256, block_out=4, wgt_buff_bytes=64 * 1024,
                                                                 acc_buff_bytes=16 * 1024, out_buff_bytes=4 * 1024),
                                 AccelConfig(inp_width=16, wgt_width=16, block_in=16)])
def test_fsim_float_gemm_paths_exact_at_extremes(cfg):
    """Worst case for the float paths: every product is (-2^(w-1))^2 and all of one sign, so each
    dot product is at the bound gemm_float_dtype reasons about; all paths must equal int64."""
    dt = gemm_float_dtype(cfg)
    bound = cfg.block_in * 2 ** (cfg.inp_width - 1) * 2 ** (cfg.wgt_width - 1)
    assert bound <= {np.float32: 2 ** 24, np.float64: 2 ** 53}[dt]
    sim = Fsim(cfg)
    lo_i, lo_w = -(1 << (cfg.inp_width - 1)), -(1 << (cfg.wgt_width - 1))
    rng = np.random.default_rng(1)
    sim.inp[:] = lo_i
    sim.wgt[:] = lo_w
    sim.inp[1] = rng.integers(lo_i, -lo_i, sim.inp[1].shape)
    n = 8
    sim.uop[:n] = [(0, k % 2, k % 3) for k in range(n)]
    ref = np.zeros(sim.acc.shape, np.int64)
    for insn in (Gemm(uop_bgn=0, uop_end=n, iter_out=3, iter_in=2, dst_factor_out=1, dst_factor_in=0),  # gathered
                 Gemm(uop_bgn=0, uop_end=1, iter_out=4, iter_in=8, dst_factor_out=8, dst_factor_in=1),  # grouped
                 Gemm(uop_bgn=0, uop_end=n, iter_out=2, iter_in=3, dst_factor_out=3, dst_factor_in=1,
                      src_factor_out=1, wgt_factor_in=1)):  # separable matmul
        sim._gemm(0, insn, None, _Stats())
        _gemm_per_uop(sim, insn, ref)
        assert (sim.acc == _wrapped(ref, cfg.acc_width)).all(), insn
    # the convolution pattern: 2 destinations x 8 taps, every dst distinct across the loops
    sim.uop[:16] = [(k // 8 * 64, k % 8, k) for k in range(16)]
    insn = Gemm(uop_bgn=0, uop_end=16, iter_out=4, iter_in=8, dst_factor_out=8, dst_factor_in=1,
                src_factor_out=9, src_factor_in=1)
    assert sim._gemm_clustered(insn, sim._plan(0, insn, "GEMM"))
    _gemm_per_uop(sim, insn, ref)
    assert (sim.acc == _wrapped(ref, cfg.acc_width)).all()


def test_fsim_clustered_gemm_goes_float64_past_float32s_exact_range():
    """A convolution-pattern GEMM whose destinations sum 512 micro-ops x 16 odd products near 127^2
    (2^27: float32 sums round there, measured; at 2^24-2^25 BLAS's blocked sums happened to stay
    exact); the clustered path must switch to float64."""
    cfg = PRESETS["default"]
    sim = Fsim(cfg)
    rng = np.random.default_rng(7)
    sim.inp[:] = rng.choice([-127, -125, -123], sim.inp.shape)
    sim.wgt[:] = rng.choice([-127, -125], sim.wgt.shape)
    k = 512
    sim.uop[:k] = [(0, t, t) for t in range(k)]
    insn = Gemm(uop_bgn=0, uop_end=k, iter_out=3, iter_in=1, dst_factor_out=1, src_factor_out=k)
    assert sim._make_cluster_plan(insn, sim.uop[:k])[0] == np.float64
    ref = np.zeros(sim.acc.shape, np.int64)
    assert sim._gemm_clustered(insn, sim._plan(0, insn, "GEMM"))
    _gemm_per_uop(sim, insn, ref)
    assert np.abs(ref).max() > 1 << 24
    assert (sim.acc == _wrapped(ref, cfg.acc_width)).all()


class _Stats:
    gemm_uops = macs = 0


def _wrapped(ref, bits):
    return ((ref + 2 ** (bits - 1)) % 2 ** bits) - 2 ** (bits - 1)


def _gemm_per_uop(sim, insn, ref):
    """The GEMM's definition, one micro-op at a time in int64, added into `ref`."""
    for i0 in range(insn.iter_out):
        for i1 in range(insn.iter_in):
            for u in sim.uop[insn.uop_bgn:insn.uop_end]:
                d = u[0] + i0 * insn.dst_factor_out + i1 * insn.dst_factor_in
                s = u[1] + i0 * insn.src_factor_out + i1 * insn.src_factor_in
                w = u[2] + i0 * insn.wgt_factor_out + i1 * insn.wgt_factor_in
                ref[d] += sim.inp[s].astype(np.int64) @ sim.wgt[w].astype(np.int64).T


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_fsim_gemm_every_path_matches_per_uop_definition(data):
    """Random GEMMs shaped to reach each vectorized path (clustered convolution pattern with
    distinct or colliding destinations, heads reading the same or different inputs, separable,
    grouped, gathered): acc equals the per-micro-op
    definition and out the narrowed acc of every touched entry, with 32- and 16-bit accumulators
    (the float paths' int32 sums must wrap to either)."""
    cfg = data.draw(st.sampled_from([TINY, TINY_ACC16]))
    sim = Fsim(cfg)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    sim.inp[:] = rng.integers(-128, 128, sim.inp.shape)
    sim.wgt[:] = rng.integers(-128, 128, sim.wgt.shape)
    sim.acc[:] = rng.integers(-2 ** (cfg.acc_width - 1), 2 ** (cfg.acc_width - 1), sim.acc.shape)
    heads = data.draw(st.integers(1, 4))
    taps = data.draw(st.integers(1, 9))
    nu = heads * taps
    it_o, it_i = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    f = st.integers(0, 5)
    head_gap = data.draw(st.sampled_from([0, 1, 16]))   # 0 and 1 make destinations collide
    # shared: every head reads the same inputs (a convolution's output-channel blocks: one matmul)
    srcs = rng.integers(0, 8, (1 if data.draw(st.booleans()) else heads, taps))
    sim.uop[:nu] = [(h * head_gap, int(srcs[h % len(srcs), t]), int(rng.integers(0, 16)))
                    for h in range(heads) for t in range(taps)]
    insn = Gemm(uop_bgn=0, uop_end=nu, iter_out=it_o, iter_in=it_i, dst_factor_out=data.draw(f),
                dst_factor_in=data.draw(f), src_factor_out=data.draw(f), src_factor_in=data.draw(f),
                wgt_factor_out=data.draw(st.sampled_from([0, 0, 1])), wgt_factor_in=data.draw(st.sampled_from([0, 0, 1])))
    ref = sim.acc.astype(np.int64)
    sim._gemm(0, insn, None, _Stats())
    _gemm_per_uop(sim, insn, ref)
    assert (sim.acc == _wrapped(ref, cfg.acc_width)).all(), insn
    touched = sorted({int(u[0]) + i0 * insn.dst_factor_out + i1 * insn.dst_factor_in
                      for u in sim.uop[:nu] for i0 in range(it_o) for i1 in range(it_i)})
    assert (sim.out[touched] == _wrapped(ref[touched], cfg.out_width)).all()


def test_fsim_plan_cache_follows_the_micro_ops_and_stays_bounded(monkeypatch):
    """Index plans are cached by micro-op contents and loop fields: the same instruction after a
    micro-op changed must use the new indices (GEMM and ALU), and the cache holds at most
    PLAN_CACHE_ELEMS index elements."""
    monkeypatch.setattr(fsim_loops, "PLAN_CACHE_ELEMS", 64)
    cfg = TINY
    sim = Fsim(cfg)
    rng = np.random.default_rng(3)
    sim.inp[:] = rng.integers(-128, 128, sim.inp.shape)
    sim.wgt[:] = rng.integers(-128, 128, sim.wgt.shape)
    ref = sim.acc.astype(np.int64)
    gemm = Gemm(uop_bgn=0, uop_end=8, iter_out=2, iter_in=3, dst_factor_out=3, dst_factor_in=1,
                src_factor_out=4, src_factor_in=1)
    alu = Alu(alu_op=AluOp.ADD, uop_bgn=8, uop_end=9, iter_out=6, dst_factor_out=1)
    for step in range(4):
        sim.uop[:8] = [(k // 4 * 32, (k + step) % 5, (3 * k + step) % 16) for k in range(8)]
        sim.uop[8] = (40, step, 0)   # acc[40 + i] += acc[step]: a new operand entry each time
        sim._gemm(0, gemm, None, _Stats())
        _gemm_per_uop(sim, gemm, ref)
        assert (sim.acc == _wrapped(ref, cfg.acc_width)).all(), step
        before = sim.acc[:, 0, 0].astype(np.int64).tolist()
        sim._alu(0, alu, None, FsimStats())
        assert sim.acc[40:46, 0, 0].tolist() == [_wrapped(before[40 + i] + before[step], 32) for i in range(6)]
        ref[40:46] = sim.acc[40:46]
        assert sum(p.dst.size for p in sim._plans.values()) <= 64


def _py_alu(op, a, b, w):
    def wr(x):
        return ((x + (1 << (w - 1))) % (1 << w)) - (1 << (w - 1))
    b = wr(b)
    if op == AluOp.MIN: return min(a, b)
    if op == AluOp.MAX: return max(a, b)
    if op == AluOp.ADD: return wr(a + b)
    if op == AluOp.MUL: return wr(a * b)
    if op in (AluOp.MOV, AluOp.FLUSH): return b   # FLUSH's accumulator side (its output side: _py_flush)
    if op == AluOp.CLIP: return min(max(a, wr(-b)), b)
    if op == AluOp.CLAMP: return min(max(a, ((b & 255) ^ 128) - 128), (((b >> 8) & 255) ^ 128) - 128)
    if op == AluOp.SCALE:
        bu = b % (1 << w)
        k = (bu >> 24) & 63
        v = (a * (bu & 0xFFFFFF) + (1 << (k - 1) if k else 0)) >> k
        return min(max(v, -(1 << (w - 1))), (1 << (w - 1)) - 1)
    if op == AluOp.REQUANT:
        s = (b >> 16) & 31 if w >= 22 else 0
        a = wr(a + (1 << (s - 1) if s > 0 and (b >> 21) & 1 else 0)) >> s
        return min(max(a, ((b & 255) ^ 128) - 128), (((b >> 8) & 255) ^ 128) - 128)
    sb = w.bit_length()
    s = b & ((1 << sb) - 1)
    s = s - (1 << sb) if s >= 1 << (sb - 1) else s
    return a >> s if s >= 0 else wr(a << -s)


def _py_flush(a, imm, w):
    """FLUSH's output buffer value, from the ISA text with Python integers."""
    s, hi = imm & 31, (((imm >> 7) & 255) ^ 128) - 128
    lo = 0 if (imm >> 6) & 1 else -hi if (imm >> 15) & 1 else -hi - 1   # imm < 0: bit 15 set (symmetric)
    half = 1 << (s - 1) if s > 0 and (imm >> 5) & 1 else 0
    v = ((a + half + (1 << (w - 1))) % (1 << w)) - (1 << (w - 1))
    return min(max(v >> s, lo), hi)


def _alu_values(w):
    """Operands of a w-bit lane: any value, and the edges of the shifts and the range."""
    lo, hi = -(1 << (w - 1)), (1 << (w - 1)) - 1
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, -1, 1, 31, 32, -32, 33]))


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(list(AluOp)), w=st.sampled_from([16, 32]), data=st.data())
def test_fsim_alu_matches_python_integers(op, w, data):
    lo = -(1 << (w - 1))
    vals = _alu_values(w)
    scale_operands = st.builds(lambda k, m: (((k << 24) | m) - lo) % (1 << w) + lo,  # SCALE's fields, wrapped
                               st.integers(0, 63), st.integers(0, (1 << 24) - 1))
    a, b = data.draw(vals), data.draw(st.one_of(vals, scale_operands))
    got = int(alu_apply(op, np.array([a], dtype=np.int64), np.array([b], dtype=np.int64), w)[0])
    assert got == _py_alu(op, a, b, w), (op, a, b)


@settings(max_examples=300, deadline=None)
@given(w=st.sampled_from([16, 32]), imm=st.integers(-(1 << 15), (1 << 15) - 1), data=st.data())
def test_fsim_flush_output_matches_python_integers(w, imm, data):
    """FLUSH's output side (requantize by the immediate's shift, rounding and clamp) on a w-bit lane,
    from int64 entries and (a 32-bit accumulator's own) int32 ones."""
    a = data.draw(st.lists(_alu_values(w), min_size=1, max_size=6))
    want = [_py_flush(x, imm, w) for x in a]
    assert flush_requant(np.array(a, np.int64), imm, w).tolist() == want, (a, imm)
    if w == 32:
        assert flush_requant(np.array(a, np.int32), imm, w).tolist() == want, (a, imm)


@settings(max_examples=200, deadline=None)
@given(op=st.sampled_from(list(AluOp)), w=st.sampled_from([16, 32]), data=st.data())
def test_fsim_alu_one_operand_for_all_elements_matches_python_integers(op, w, data):
    """alu_apply takes an operand shared by every element (immediates, a tile's requantization
    operand) as a scalar: same results as element by element, in the shape of the accumulator side."""
    vals = _alu_values(w)
    a = data.draw(st.lists(vals, min_size=2, max_size=8))
    b = data.draw(st.one_of(vals, st.integers(0, (1 << 30) - 1)))
    got = alu_apply(op, np.array(a, dtype=np.int64).reshape(-1, 1, 1), np.full((len(a), 1, 1), b, np.int64), w)
    assert got.shape == (len(a), 1, 1)
    assert got.reshape(-1).tolist() == [_py_alu(op, x, b, w) for x in a], (op, a, b)


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(list(AluOp)), shared=st.booleans(), data=st.data())
def test_fsim_alu_int32_path_matches_python_integers(op, shared, data):
    """The int32 path of a 32-bit accumulator (wrapping array arithmetic, no int64 passes) gives
    the ALU's results; it takes every op but SCALE with one operand for all elements (an immediate
    or a requantization register), and MIN, MAX, ADD, MUL with one operand per element."""
    vals = _alu_values(32)
    a = data.draw(st.lists(vals, min_size=1, max_size=8))
    if shared:
        b = data.draw(st.one_of(vals, st.integers(0, (1 << 22) - 1), st.integers(-(1 << 40), 1 << 40)))
        operand, want = np.int64(b), [_py_alu(op, x, b, 32) for x in a]
    else:
        b = data.draw(st.lists(vals, min_size=len(a), max_size=len(a)))
        operand, want = np.array(b, np.int64).reshape(-1, 1, 1), [_py_alu(op, x, y, 32) for x, y in zip(a, b)]
    got = alu_apply_int32(op, np.array(a, np.int32).reshape(-1, 1, 1), operand)
    if op == AluOp.SCALE or (not shared and len(set(b)) > 1 and op not in (AluOp.MIN, AluOp.MAX, AluOp.ADD, AluOp.MUL)):
        assert got is None
        return
    assert got is not None and got.dtype == np.int32 and got.shape == (len(a), 1, 1)
    assert got.reshape(-1).tolist() == want, (op, a, b)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_fsim_alu_instruction_matches_in_order_micro_ops(data):
    """Random ALU instructions (every op, immediate or accumulator operand, loop factors of 0 that
    repeat sources, e.g. a bias MOV over a tile, and overlapping dst/src ranges) give what running
    their micro-ops one at a time in loop order gives, on acc and out."""
    cfg = data.draw(st.sampled_from([TINY, TINY_ACC16]))
    sim = Fsim(cfg)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    sim.acc[:] = rng.integers(-2 ** (cfg.acc_width - 1), 2 ** (cfg.acc_width - 1), sim.acc.shape)
    nu = data.draw(st.integers(1, 4))
    f = st.sampled_from([0, 0, 1, 2, nu, 5])
    lo = data.draw(st.sampled_from([0, 8, 40]))            # dst range vs the sources at 0..15
    bias = data.draw(st.booleans())    # a bias MOV: the same sources every iteration
    # destinations: free; one contiguous tile in micro-op order; or a contiguous block per micro-op
    layout = data.draw(st.sampled_from(["tile", "blocks"] if bias else ["free", "tile", "blocks"]))
    it_o, it_i = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    base = {"free": lambda k: data.draw(st.sampled_from([k, int(rng.integers(0, 8))])), "tile": lambda k: k,
            "blocks": lambda k: k * it_o * it_i}[layout]
    sim.uop[:nu] = [(lo + base(k), int(rng.integers(0, 16)), 0) for k in range(nu)]
    factors = {"free": (data.draw(f), data.draw(f)), "tile": (nu * it_i, nu), "blocks": (it_i, 1)}[layout]
    op = data.draw(st.sampled_from([AluOp.MOV, AluOp.FLUSH])) if bias else data.draw(st.sampled_from(list(AluOp)))
    # (FLUSH without the bias layout too, reading the register whatever use_imm says)
    imm = int(rng.integers(-(1 << 15), 1 << 15)) if op == AluOp.FLUSH else int(rng.integers(-64, 64))
    insn = Alu(alu_op=op, use_imm=not bias and data.draw(st.booleans()), imm=imm, uop_bgn=0, uop_end=nu,
               iter_out=it_o, iter_in=it_i, dst_factor_out=factors[0], dst_factor_in=factors[1],
               src_factor_out=0 if bias else data.draw(f), src_factor_in=0 if bias else data.draw(f))
    acc, out = sim.acc.copy(), sim.out.copy()
    for i0 in range(insn.iter_out):
        for i1 in range(insn.iter_in):
            for u in sim.uop[:nu]:
                d = u[0] + i0 * insn.dst_factor_out + i1 * insn.dst_factor_in
                s = u[1] + i0 * insn.src_factor_out + i1 * insn.src_factor_in
                b = np.int64(insn.imm) if insn.use_imm and op != AluOp.FLUSH else acc[s].astype(np.int64)
                q = flush_requant(acc[d], insn.imm, cfg.acc_width) if op == AluOp.FLUSH else None
                acc[d] = alu_apply(insn.alu_op, acc[d].astype(np.int64), b, cfg.acc_width)
                out[d] = (acc[d] if q is None else q).astype(out.dtype)
    sim._alu(0, insn, None, FsimStats())
    assert (sim.acc == acc).all() and (sim.out == out).all(), insn


def test_fsim_alu_chained_hazard_runs_in_order():
    """acc[i+1] += acc[i] over one instruction is a prefix sum only if executed in order."""
    cfg = TINY
    sim = Fsim(cfg)
    sim.acc[:8] = np.arange(1, 9)[:, None, None]
    sim.uop[0] = (1, 0, 0)
    _, stats = _run(cfg, [Alu(alu_op=AluOp.ADD, uop_bgn=0, uop_end=1, iter_out=7, dst_factor_out=1, src_factor_out=1),
                          Finish()], sim=sim)
    assert sim.acc[:8, 0, 0].tolist() == np.cumsum(np.arange(1, 9)).tolist()
    assert sim.out[1:8, 0, 0].tolist() == np.cumsum(np.arange(1, 9))[1:].astype(np.int8).tolist()
    assert stats.alu_uops == 7


def test_fsim_load_padding_and_store_roundtrip():
    cfg = TINY
    dram = np.zeros(1 << 16, np.uint8)
    src = np.arange(1, 1 + 2 * 3 * 4, dtype=np.int8).reshape(2, 3, 4)  # 2 rows x 3 entries (1x4)
    base = 0x800
    dram[base:base + src.size] = src.reshape(-1).view(np.uint8)
    prog = [Load(mem_type=MemType.INP, sram_base=0, dram_base=base // 4, y_size=2, x_size=3, x_stride=3,
                 y_pad0=1, y_pad1=2, x_pad0=2, x_pad1=1), Finish()]
    sim, stats = _run(cfg, prog, dram)
    tile = sim.inp[:5 * 6, 0].reshape(5, 6, 4)
    expect = np.zeros((5, 6, 4), np.int8)
    expect[1:3, 2:5] = src
    assert (tile == expect).all()
    assert stats.bytes_read == src.size


@pytest.mark.parametrize("stride", [0, 1, 2, 3, 5])
def test_fsim_strided_tiles_overlapping_rows_match_reference(stride):
    """LOAD and STORE tiles are strided views of the DRAM; with x_stride < x_size the rows
    overlap: a load reads shared entries twice, a store's later row overwrites the earlier one
    (the reference model writes entry by entry in program order)."""
    cfg = TINY
    rng = np.random.default_rng(stride)
    dram = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
    prog = [Load(mem_type=MemType.INP, sram_base=0, dram_base=0x800 // 4, y_size=4, x_size=3, x_stride=stride),
            Load(mem_type=MemType.ACC, sram_base=0, dram_base=0x1000 // 16, y_size=4, x_size=3, x_stride=stride,
                 y_pad0=1, x_pad1=2),
            Alu(alu_op=AluOp.ADD, use_imm=True, imm=0, uop_bgn=0, uop_end=1, iter_out=25, dst_factor_out=1,
                push_next=True),
            Store(sram_base=0, dram_base=0x3000 // 4, y_size=4, x_size=3, x_stride=stride, pop_prev=True,
                  push_prev=True),
            Finish(pop_next=True)]
    ref_dram = dram.copy()
    sim, _ = _run(cfg, prog, dram)
    code = encode_program(prog, cfg).reshape(-1)
    ref_dram[:code.size] = code
    ref = ReferenceMachine(cfg)
    ref.run(prog, ref_dram)
    assert (sim.inp[:12] == ref.inp[:12]).all()
    assert np.array_equal(dram, ref_dram)


@pytest.mark.parametrize("dram", [np.zeros(1 << 12, np.int8), np.zeros((2, 1 << 11), np.uint8),
                                  np.zeros(1 << 13, np.uint8)[::2], bytearray(1 << 12)])
def test_fsim_refuses_a_dram_that_is_not_one_flat_byte_buffer(dram):
    prog = [Load(mem_type=MemType.INP, y_size=1, x_size=1, x_stride=1), Finish()]
    with pytest.raises(SimError, match="DRAM must be a contiguous 1-D uint8 array, got"):
        Fsim(TINY).run_insns(dram, prog)


def _deadlock(prog, match, cfg=TINY):
    with pytest.raises(DeadlockError, match=match):
        _run(cfg, prog)


def test_fsim_deadlock_on_missing_token_names_instruction_and_queue():
    _deadlock([Load(mem_type=MemType.INP), Gemm(pop_prev=True), Finish()],
              r"compute stage blocked at instruction 1 \(GEMM\): pop_prev on empty queue l2c")


def test_fsim_deadlock_on_full_command_queue_names_fetch():
    n = TINY.cmd_queue_depth + 2
    prog = [Load(mem_type=MemType.INP, pop_next=True) for _ in range(n)] + [Gemm(push_prev=True)] * n + [Finish()]
    _deadlock(prog, r"fetch blocked at instruction \d+ \(LOAD\): load command queue full")


def test_fsim_deadlock_on_full_token_queue():
    n = TINY.dep_queue_depth + 1
    prog = [Load(mem_type=MemType.INP, push_next=True) for _ in range(n)] + [Gemm(pop_prev=True)] * 0 + \
           [Gemm(pop_prev=True, pop_next=True), Finish()]
    _deadlock(prog, r"load stage blocked at instruction %d \(LOAD\): push_next on full queue l2c" % (n - 1))


@pytest.mark.parametrize("insn, code, match", [
    (Load(mem_type=MemType.INP, sram_base=250, y_size=1, x_size=10, x_stride=10), ErrorCode.SRAM_RANGE,
     r"instruction 0 \(LOAD INP\): sram_base=250 \+ 1x10 entries exceeds the INP buffer depth 256"),
    (Load(mem_type=MemType.WGT, dram_base=1 << 20, y_size=1, x_size=1, x_stride=1), None,
     r"instruction 0 \(LOAD\): dram_base=1048576 .* beyond the 0x10000-byte DRAM"),
    (Load(mem_type=MemType.OUT), ErrorCode.BAD_FIELD, r"instruction 0 \(LOAD OUT\): field mem_type=OUT"),
    (Store(y_size=1, x_size=1, x_pad0=1), ErrorCode.BAD_FIELD,
     r"instruction 0 \(STORE OUT\): padding fields must be zero"),
    (Store(mem_type=MemType.ACC, y_size=1, x_size=1), ErrorCode.BAD_FIELD, r"instruction 0 \(STORE ACC\): field "
                                                                           r"mem_type=ACC; STORE reads OUT"),
    (Store(y_size=3, x_size=100, sram_base=1), ErrorCode.SRAM_RANGE,
     r"instruction 0 \(STORE OUT\): sram_base=1 \+ 300 entries exceeds the OUT buffer depth 256"),
    (Load(mem_type=MemType.INP, pop_prev=True), ErrorCode.BAD_FIELD, r"instruction 0 \(LOAD INP\): pop_prev"),
    (Store(push_next=True), ErrorCode.BAD_FIELD, r"instruction 0 \(STORE OUT\): pop_next/push_next"),
    (Gemm(uop_bgn=3, uop_end=300), ErrorCode.SRAM_RANGE,
     r"instruction 0 \(GEMM\): micro-op range \[uop_bgn=3, uop_end=300\)"),
    (Alu(uop_bgn=3, uop_end=2), ErrorCode.BAD_FIELD, r"instruction 0 \(ALU\): uop_bgn=3 > uop_end=2"),
    (Gemm(uop_bgn=0, uop_end=1, iter_out=300, dst_factor_out=1), ErrorCode.INDEX_RANGE,
     r"instruction 0 \(GEMM\): accumulator \(dst\) index 256 out of range \[0, 256\) at micro-op 0, iteration \(256, 0\)"),
    (Alu(uop_bgn=0, uop_end=1, iter_in=200, src_factor_in=2), ErrorCode.INDEX_RANGE,
     r"instruction 0 \(ALU\): accumulator \(src\) index 256 out of range"),
])
def test_fsim_exec_errors_name_instruction_and_field(insn, code, match):
    with pytest.raises(ExecError, match=match) as e:
        _run(TINY, [insn, Finish()])
    if code is None:      # the DRAM's size is not the accelerator's to check: an AXI error response
        assert not isinstance(e.value, ProgramFault)
    else:
        assert (e.value.code, e.value.index) == (code, 0)


def test_fsim_finish_rules():
    with pytest.raises(ExecError, match="no FINISH"):
        _run(TINY, [Load(mem_type=MemType.INP)])
    # FINISH that does not wait for a store the compute stage feeds
    prog = [Gemm(push_next=True), Store(pop_prev=True, y_size=1, x_size=1, x_stride=1), Finish()]
    with pytest.raises(ExecError, match=r"instruction 2 \(FINISH\) ran while store still had instructions pending"):
        _run(TINY, prog)
    prog = [Gemm(push_next=True), Store(pop_prev=True, push_prev=True, y_size=1, x_size=1, x_stride=1),
            Finish(pop_next=True)]
    _, stats = _run(TINY, prog)
    assert stats.insns == {"GEMM": 1, "STORE": 1, "FINISH": 1} and stats.bytes_written == 4


def test_fsim_gemm_through_dram_end_to_end():
    """A 2-tile matmul loaded from DRAM, computed, narrowed and stored, against numpy."""
    cfg = TINY
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (3, 8), dtype=np.int8)         # 3 rows, K=8 (2 blocks)
    b = rng.integers(-128, 128, (8, 4), dtype=np.int8)         # N=4 (1 block)
    dram = np.zeros(1 << 16, np.uint8)
    dram[0x1000:0x1000 + a.size] = a.reshape(-1).view(np.uint8)
    w = b.reshape(2, 4, 4).transpose(0, 2, 1)                  # kb, o, i
    dram[0x2000:0x2000 + w.size] = np.ascontiguousarray(w).reshape(-1).view(np.uint8)
    u = encode_uops([Uop(0, 0, 0), Uop(0, 1, 1)], cfg)
    dram[0x3000:0x3000 + u.size] = u
    prog = [Load(mem_type=MemType.UOP, dram_base=0x3000 // 4, y_size=1, x_size=2, x_stride=2),
            Load(mem_type=MemType.INP, dram_base=0x1000 // 4, y_size=1, x_size=6, x_stride=6),
            Load(mem_type=MemType.WGT, dram_base=0x2000 // 16, y_size=1, x_size=2, x_stride=2, push_next=True),
            Gemm(reset=True, uop_bgn=0, uop_end=1, iter_out=3, dst_factor_out=1, pop_prev=True),
            Gemm(uop_bgn=0, uop_end=2, iter_out=3, dst_factor_out=1, src_factor_out=2),
            Alu(alu_op=AluOp.SHR, use_imm=True, imm=6, uop_bgn=0, uop_end=1, iter_out=3, dst_factor_out=1),
            Alu(alu_op=AluOp.CLIP, use_imm=True, imm=100, uop_bgn=0, uop_end=1, iter_out=3, dst_factor_out=1,
                push_next=True),
            Store(dram_base=0x4000 // 4, y_size=3, x_size=1, x_stride=1, pop_prev=True, push_prev=True),
            Finish(pop_next=True)]
    _run(cfg, prog, dram)
    got = dram[0x4000:0x4000 + 12].view(np.int8).reshape(3, 4)
    ref = np.clip((a.astype(np.int32) @ b.astype(np.int32)) >> 6, -100, 100)
    assert (got == ref).all()


class _FakeBlas:
    def __init__(self, num_threads=2):
        self.calls = []
        self.num_threads = num_threads

    def set_num_threads(self, n):
        self.calls.append(n)
        self.num_threads = n


@pytest.mark.parametrize("idle, threads", [(1, 2), (0, 1)])
def test_fsim_threads_only_big_matmuls_on_idle_cores(monkeypatch, idle, threads):
    """Only a matmul of THREADED_MATMUL_MACS or more runs on the idle cores, counted once per run at
    the first such matmul, and BLAS is back on one thread after it."""
    counted = []
    monkeypatch.setattr(fsim_blas, "idle_cores", lambda: counted.append(1) or idle)
    bt = BlasThreads()
    fake = _FakeBlas()
    bt.libs = [fake]
    rng = np.random.default_rng(0)
    small = rng.integers(-128, 128, (4, 64)).astype(np.float32), rng.integers(-128, 128, (64, 16)).astype(np.float32)
    k = THREADED_MATMUL_MACS // (64 * 64)
    big = rng.integers(-128, 128, (64, k)).astype(np.float32), rng.integers(-128, 128, (k, 64)).astype(np.float32)
    with bt.run():
        assert (bt.matmul(*small) == small[0] @ small[1]).all()
        assert fake.calls == [1] and counted == []
        for _ in range(2):
            assert (bt.matmul(*big) == big[0] @ big[1]).all()
        assert fake.calls == [1] + ([threads, 1] * 2 if threads > 1 else [])
        assert len(counted) == 1
    assert fake.num_threads == 2      # the caller's setting, given back


def test_fsim_recounts_idle_cores_only_after_the_window(monkeypatch):
    """Runs within IDLE_RECOUNT_S of the last count reuse it; a later run counts again."""
    counted, clock = [], [100.0]
    monkeypatch.setattr(fsim_blas, "idle_cores", lambda: counted.append(1) or 1)
    monkeypatch.setattr(fsim_blas.time, "monotonic", lambda: clock[0])
    bt = BlasThreads()
    bt.libs = [_FakeBlas()]
    k = THREADED_MATMUL_MACS // (64 * 64)
    big = np.ones((64, k), np.float32), np.ones((k, 64), np.float32)
    for dt, expect in ((0.0, 1), (IDLE_RECOUNT_S / 2, 1), (IDLE_RECOUNT_S * 2, 2)):
        clock[0] += dt
        with bt.run():
            bt.matmul(*big)
        assert len(counted) == expect, dt


def test_idle_cores_leaves_out_this_process_and_busy_ones(monkeypatch):
    """Two cores, this process running on one: one idle; a second process running: none."""
    real_open = builtins.open
    state = {"running": 1}

    def fake_open(path, *a, **kw):
        if path == "/proc/loadavg":
            return io.StringIO(f"0.50 0.40 0.30 {state['running']}/120 999\n")
        if str(path).startswith("/proc/self/task/"):
            return io.StringIO("123 (python3 x) R 1 2 3\n" if path.endswith("/1/stat") else "124 (th) S 1 2 3\n")
        return real_open(path, *a, **kw)
    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr("os.listdir", lambda path: ["1", "2"])
    assert idle_cores() == 1
    state["running"] = 2
    assert idle_cores() == 0


def test_fsim_limits_blas_threads_only_while_running():
    """fsim runs BLAS on one thread (its matmuls are small) and gives the caller's setting back."""
    before = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    seen = []
    sim = Fsim(TINY)
    orig = sim._gemm
    sim._gemm = lambda *a: (seen.append([p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]),
                            orig(*a))[1]
    prog = [Gemm(reset=True, uop_bgn=0, uop_end=1, iter_out=1, iter_in=1), Finish()]
    _run(TINY, prog, sim=sim)
    assert seen and all(n == 1 for n in seen[0])
    assert [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"] == before


def test_fsim_stats_to_dict_is_asdict_with_its_own_dicts():
    """to_dict (hand-written for speed) gives asdict's result, and its dicts are copies."""
    stats = FsimStats(**{f.name: ({"a": i} if f.type.startswith("dict") else i) for i, f in enumerate(fields(FsimStats))})
    d = stats.to_dict()
    assert d == asdict(stats) and list(d) == list(asdict(stats))
    for k, v in d.items():
        if isinstance(v, dict):
            v["a"] = -1
            assert getattr(stats, k)["a"] != -1, k


def test_fsim_flush_with_use_imm_after_an_immediate_alu_of_the_same_shape():
    """FLUSH reads its source whatever use_imm says: an immediate ADD of the same micro-ops and
    loops must not lend it its cached hazard analysis (it had: a chain copy ran vectorized and gave
    [5, 5, 0, 0] where in-order micro-ops give [5, 5, 5, 5])."""
    sim = Fsim(TINY)
    sim.acc[0] = 5
    sim.uop[0] = (1, 0, 0)
    kw = dict(use_imm=True, imm=0, uop_bgn=0, uop_end=1, iter_out=3, dst_factor_out=1, src_factor_out=1)
    sim._alu(0, Alu(alu_op=AluOp.ADD, **kw), None, FsimStats())
    sim._alu(1, Alu(alu_op=AluOp.FLUSH, **kw), None, FsimStats())
    assert sim.acc[:4, 0, 0].tolist() == [5, 5, 5, 5]
    # and its source range is checked although use_imm is set
    with pytest.raises(ExecError, match=r"accumulator \(src\) index 256 out of range"):
        sim._alu(2, Alu(alu_op=AluOp.FLUSH, use_imm=True, uop_bgn=0, uop_end=1, iter_in=200, src_factor_in=2),
                 None, FsimStats())


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_fsim_long_loops_run_in_blocks_as_in_one_piece(data):
    """A GEMM/ALU longer than CHUNK_ELEMS runs as blocks of whole passes: the same acc/out as in
    one piece, flushing GEMMs and ALU hazards included (the block size forced small here)."""
    cfg = TINY
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    nu, it_o, it_i = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6)), data.draw(st.integers(1, 6))
    f = st.integers(0, 3)
    gemm = data.draw(st.booleans())
    uops = [(int(rng.integers(0, 40)), int(rng.integers(0, 40)), int(rng.integers(0, 40))) for _ in range(nu)]
    if gemm:
        insn = Gemm(reset=data.draw(st.booleans()), flush=data.draw(st.booleans()), uop_bgn=0, uop_end=nu,
                    iter_out=it_o, iter_in=it_i, dst_factor_out=data.draw(f), dst_factor_in=data.draw(f),
                    src_factor_out=data.draw(f), src_factor_in=data.draw(f), wgt_factor_out=data.draw(f),
                    wgt_factor_in=data.draw(f))
    else:
        op = data.draw(st.sampled_from(list(AluOp)))
        insn = Alu(alu_op=op, use_imm=data.draw(st.booleans()), imm=int(rng.integers(-64, 64)), uop_bgn=0,
                   uop_end=nu, iter_out=it_o, iter_in=it_i, dst_factor_out=data.draw(f),
                   dst_factor_in=data.draw(f), src_factor_out=data.draw(f), src_factor_in=data.draw(f))
    sims = []
    for chunk in (fsim_loops.CHUNK_ELEMS, data.draw(st.integers(1, 2 * nu + 1))):
        sim = Fsim(cfg)
        sim.acc[:] = rng.integers(-1000, 1000, sim.acc.shape) if not sims else sims[0][1]
        sim.inp[:] = rng.integers(-128, 128, sim.inp.shape) if not sims else sims[0][2]
        sim.wgt[:] = rng.integers(-128, 128, sim.wgt.shape) if not sims else sims[0][3]
        sim.uop[:nu] = uops
        sim.epilogue = dataclasses.replace(sim.epilogue, seed_base=50, seed_factor_out=7, seed_factor_in=1,
                                           imm=flush_immediate(3, 100, round_half=True))
        before = (sim, sim.acc.copy(), sim.inp.copy(), sim.wgt.copy())
        old = fsim_loops.CHUNK_ELEMS
        fsim_loops.CHUNK_ELEMS = chunk
        try:
            (sim._gemm if gemm else sim._alu)(0, insn, None, FsimStats())
        finally:
            fsim_loops.CHUNK_ELEMS = old
        sims.append(before)
    a, b = sims[0][0], sims[1][0]
    assert (a.acc == b.acc).all() and (a.out == b.out).all(), insn


def test_fsim_memory_stays_bounded_whatever_the_loop_counts():
    """16 M micro-op iterations (legal: loop counts go to 16383) ran out of memory building
    whole-instruction index arrays; in blocks the peak stays near one block's arrays."""

    sim = Fsim(TINY)
    sim.uop[0] = (3, 0, 0)
    tracemalloc.start()
    try:
        sim._gemm(0, Gemm(reset=True, uop_bgn=0, uop_end=1, iter_out=4096, iter_in=4096), None, stats := FsimStats())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert stats.gemm_uops == 4096 * 4096
    assert peak < 8 * 8 * fsim_loops.CHUNK_ELEMS, peak     # one block's few int64 arrays, not 16 M of them
    # an error found in a later block names the iteration in the whole loop
    sim.uop[0] = (0, 0, 0)
    with pytest.raises(ExecError, match=r"accumulator \(dst\) index 256 out of range \[0, 256\) at micro-op 0, "
                                        r"iteration \(256, 0\)"):
        sim._gemm(0, Gemm(reset=True, uop_bgn=0, uop_end=1, iter_out=4096, iter_in=4096, dst_factor_out=1),
                  None, FsimStats())


@pytest.mark.parametrize("op", [op for op in AluOp if op != AluOp.FLUSH])
def test_fsim_long_immediate_alu_in_closed_form_matches_element_by_element(op):
    """An immediate ALU past CHUNK_ELEMS iterations applies op count(d) times to each entry in
    closed form or to a fixed point: the same acc/out as the element-by-element path (which took a
    Python step per element: hours at 16383 x 16383), and a maximal loop takes moments."""
    rng = np.random.default_rng(int(op))
    for trial in range(25):
        nu, it_o, it_i = (int(v) for v in rng.integers(1, 7, 3))
        nu = min(nu, 3)
        imm = int(rng.integers(-6, 7)) if op == AluOp.MUL else int(rng.integers(-40, 40)) if op == AluOp.SHR \
            else int(rng.integers(-(1 << 15), 1 << 15))
        insn = Alu(alu_op=op, use_imm=True, imm=imm, uop_bgn=0, uop_end=nu, iter_out=it_o, iter_in=it_i,
                   dst_factor_out=int(rng.integers(0, 3)), dst_factor_in=int(rng.integers(0, 3)))
        acc = rng.integers(-2 ** 31, 2 ** 31, Fsim(TINY).acc.shape)
        uops = [(int(d), 0, 0) for d in rng.integers(0, 30, nu)]
        sims = []
        for chunk in (fsim_loops.CHUNK_ELEMS, 0):
            sim = Fsim(TINY)
            sim.acc[:] = acc
            sim.uop[:nu] = uops
            old, fsim_loops.CHUNK_ELEMS = fsim_loops.CHUNK_ELEMS, chunk
            try:
                sim._alu(0, insn, None, stats := FsimStats())
            finally:
                fsim_loops.CHUNK_ELEMS = old
            assert stats.alu_uops == nu * it_o * it_i
            sims.append(sim)
        assert (sims[0].acc == sims[1].acc).all() and (sims[0].out == sims[1].out).all(), insn
    sim = Fsim(TINY)
    sim.uop[0] = (3, 0, 0)
    sim.acc[3] = 1000
    sim._alu(0, Alu(alu_op=op, use_imm=True, imm=3, uop_bgn=0, uop_end=1, iter_out=16383, iter_in=16383), None,
             FsimStats())
    if op == AluOp.ADD:
        assert sim.acc[3, 0, 0] == np.int32(np.int64(1000 + 3 * 16383 * 16383) % 2 ** 32 - 2 ** 32 * (
            (1000 + 3 * 16383 * 16383) % 2 ** 32 >= 2 ** 31))
