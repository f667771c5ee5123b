"""Amaranth-simulator unit tests of the smaller blocks: queues, the GEMM core, the tensor ALU,
the burst reader and the stage sequencer, each against a reference model."""
from __future__ import annotations

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module, Signal, signed, unsigned
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from accel.hw.alu import TensorAlu, alu_lane
from accel.hw.axi import READ_ID, AxiMaster
from accel.hw.dma import ReadDMA
from accel.hw.gemm import DSP_A_BITS, GemmCore, packed_dots, packed_weights, packing_shift, split_packed, split_pair
from accel.hw.queues import Queue
from accel.hw.stage import POP_PREV, PUSH_NEXT, StageControl
from accel.isa import AccelConfig, AluOp, flush_immediate, preset
from accel.isa.config import ALU_OPCODE_BITS
from accel.isa.errors import ConfigError
from sim.fsim import alu_apply, flush_requant

CFG = preset("tiny")
BATCH2 = AccelConfig(batch=2, block_in=4, block_out=4, uop_buff_bytes=1024, inp_buff_bytes=1024, wgt_buff_bytes=2048,
                     acc_buff_bytes=4096, out_buff_bytes=1024, cmd_queue_depth=8, dep_queue_depth=8)


def pack(values, width: int) -> int:
    """Element k of the flattened array at bits [k*width, (k+1)*width) (the buffers' layout)."""
    out = 0
    for k, v in enumerate(np.asarray(values).reshape(-1).tolist()):
        out |= (int(v) & ((1 << width) - 1)) << (k * width)
    return out


def unpack(word: int, n: int, width: int) -> np.ndarray:
    vals = [(word >> (k * width)) & ((1 << width) - 1) for k in range(n)]
    return np.array([v - (1 << width) if v >> (width - 1) else v for v in vals], dtype=np.int64)


def simulate(dut, testbench, vcd=None):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()


# ---- Queue -------------------------------------------------------------------------------------
def test_queue_holds_depth_entries_in_order_with_two_cycle_latency():
    q = Queue(8, 4)
    log = {}

    async def tb(ctx):
        assert not ctx.get(q.r.rdy)
        ctx.set(q.w.data, 0xA1)
        ctx.set(q.w.en, 1)
        await ctx.tick()
        ctx.set(q.w.en, 0)
        log["r1"] = ctx.get(q.r.rdy)                 # cycle t+1: not yet visible
        await ctx.tick()
        log["r2"] = ctx.get(q.r.rdy), ctx.get(q.r.data)  # cycle t+2: visible
        for v in (0xB2, 0xC3, 0xD4):
            ctx.set(q.w.data, v)
            ctx.set(q.w.en, 1)
            await ctx.tick()
        ctx.set(q.w.en, 0)
        log["full"] = ctx.get(q.w.rdy), ctx.get(q.level)
        got = []
        ctx.set(q.r.en, 1)
        for _ in range(6):
            if ctx.get(q.r.rdy):
                got.append(ctx.get(q.r.data))
            await ctx.tick()
        log["got"] = got

    simulate(q, tb)
    assert log["r1"] == 0 and log["r2"] == (1, 0xA1)
    assert log["full"] == (0, 4)
    assert log["got"] == [0xA1, 0xB2, 0xC3, 0xD4]


def test_queue_rejects_bad_shapes():
    q = Queue.__new__(Queue)
    q._MustUse__silence = True          # never elaborated: no "created but never used" warning
    with pytest.raises(ValueError, match="depth >= 2, got width=1, depth=1"):
        q.__init__(1, 1)


# ---- GEMM core ---------------------------------------------------------------------------------
class _GemmHarness(Elaboratable):
    def __init__(self, cfg, inp, wgt, acc):
        self.cfg, self.core = cfg, GemmCore(cfg)
        c = cfg
        self.inp = Memory(shape=unsigned(c.inp_elem_bytes * 8), depth=c.inp_depth,
                          init=[pack(t, c.inp_width) for t in inp])
        self.wgt = Memory(shape=unsigned(c.wgt_elem_bytes * 8), depth=c.wgt_depth,
                          init=[pack(t, c.wgt_width) for t in wgt])
        self.acc = Memory(shape=unsigned(c.acc_elem_bytes * 8), depth=c.acc_depth,
                          init=[pack(t, c.acc_width) for t in acc])

    def elaborate(self, platform):
        m = Module()
        core = m.submodules.core = self.core
        m.submodules.inp, m.submodules.wgt, m.submodules.acc = self.inp, self.wgt, self.acc
        wiring.connect(m, core.inp_rd, self.inp.read_port())
        wiring.connect(m, core.wgt_rd, self.wgt.read_port())
        wp = self.acc.write_port()
        wiring.connect(m, core.acc_rd, self.acc.read_port(transparent_for=(wp,)))
        m.d.comb += [wp.en.eq(core.wb_valid), wp.addr.eq(core.wb_idx), wp.data.eq(core.wb_data)]
        return m


@pytest.mark.parametrize("cfg", [CFG, BATCH2], ids=["1x4x4", "2x4x4"])
def test_gemm_core_one_uop_per_cycle_with_back_to_back_hazards(cfg):
    c = cfg
    rng = np.random.default_rng(1)
    n_acc = 8
    inp = rng.integers(-128, 128, (16, c.batch, c.block_in))
    wgt = rng.integers(-128, 128, (8, c.block_out, c.block_in))
    acc0 = rng.integers(-(1 << 31), 1 << 31, (n_acc, c.batch, c.block_out))
    # dst sequence with distance-1 and distance-2 repeats, and a reset in the middle
    uops = [(d, int(rng.integers(16)), int(rng.integers(8)), False) for d in (0, 0, 1, 0, 1, 1, 1, 2, 3, 2, 4, 5, 4)]
    uops.insert(6, (1, 0, 0, True))
    h = _GemmHarness(cfg, inp, wgt, acc0)
    final = {}

    async def tb(ctx):
        core = h.core
        for d, s, w, r in uops:            # one micro-op per cycle, no gaps
            ctx.set(core.in_valid, 1)
            ctx.set(core.in_acc, d)
            ctx.set(core.in_inp, s)
            ctx.set(core.in_wgt, w)
            ctx.set(core.in_reset, r)
            await ctx.tick()
        ctx.set(core.in_valid, 0)
        for _ in range(4):
            await ctx.tick()
        assert not ctx.get(core.busy)
        for i in range(n_acc):
            final[i] = ctx.get(h.acc.data[i])

    simulate(h, tb)
    ref = acc0.astype(np.int64).copy()
    for d, s, w, r in uops:
        ref[d] = 0 if r else ref[d] + inp[s] @ wgt[w].T
    ref = ((ref + (1 << 31)) % (1 << 32)) - (1 << 31)
    for i in range(n_acc):
        assert unpack(final[i], c.batch * c.block_out, c.acc_width).tolist() == ref[i].reshape(-1).tolist(), i


# ---- GEMM core: two int8 products per DSP ---------------------------------------------------------
def test_dsp_packing_model_is_exact_for_every_int8_triple():
    """The bit slicing's Python model against plain products for all 2**24 (inp, w_hi, w_lo);
    the packed operand stays within the DSP48E1's 25-bit signed port."""
    shift = packing_shift(8, 8)
    assert shift == 16
    w = np.arange(-128, 128, dtype=np.int64)
    wh, wl = np.meshgrid(w, w, indexing="ij")
    packed = packed_weights(wh, wl, shift)
    assert packed.min() >= -(1 << (DSP_A_BITS - 1)) and packed.max() < 1 << (DSP_A_BITS - 1)
    for a in range(-128, 128):
        hi, lo = split_packed(a * packed, shift)
        assert np.array_equal(hi, a * wh) and np.array_equal(lo, a * wl), a


def test_dsp_packing_shift_only_where_the_packed_operand_fits():
    assert [packing_shift(i, w) for i, w in ((8, 8), (8, 16), (16, 8), (16, 16))] == [16, None, None, None]
    wide = AccelConfig(inp_width=16, wgt_width=16, block_in=4, block_out=4, uop_buff_bytes=1024,
                       inp_buff_bytes=1024, wgt_buff_bytes=2048, acc_buff_bytes=4096, out_buff_bytes=1024)
    assert GemmCore(wide).pack_shift is None
    assert GemmCore(CFG).pack_shift == 16 and GemmCore(CFG, dsp_packing=False).pack_shift is None
    off = CFG.replace(dsp_packing=False)     # the config's switch, kept through JSON
    assert GemmCore(AccelConfig.from_json(off.to_json())).pack_shift is None
    assert GemmCore(off, dsp_packing=True).pack_shift == 16
    assert GemmCore(wide.replace(dsp_packing=True)).pack_shift is None   # True applies where it fits
    with pytest.raises(ConfigError, match="dsp_packing.*true or false"):
        AccelConfig(dsp_packing=1)
    with pytest.raises(ValueError, match="inp_width 16 x wgt_width 16"):
        GemmCore(wide, dsp_packing=True)


class _PackedDots(Elaboratable):
    """packed_dots over n elements, combinational: (sum inp*w_hi, sum inp*w_lo)."""
    def __init__(self, n):
        self.inp = [Signal(signed(8), name=f"a{i}") for i in range(n)]
        self.w_lo = [Signal(signed(8), name=f"wl{i}") for i in range(n)]
        self.w_hi = [Signal(signed(8), name=f"wh{i}") for i in range(n)]
        self.hi, self.lo = Signal(signed(32)), Signal(signed(32))

    def elaborate(self, platform):
        m = Module()
        hi, lo = packed_dots(self.inp, self.w_lo, self.w_hi, 16)
        m.d.comb += [self.hi.eq(hi), self.lo.eq(lo)]
        return m


def test_packed_products_rtl_every_input_and_weight_against_corner_partners():
    """The Amaranth unit, one element: every (inp, v) pair once, v as w_hi or w_lo (alternating)
    against a corner value as its partner, plus all corner triples (the model test covers all
    2**24 triples; simulating them would take minutes)."""
    dut = _PackedDots(1)
    corners = (-128, -127, -1, 0, 1, 127)
    cases = []
    for a in range(-128, 128):
        for v in range(-128, 128):
            k = (7 * a + v) % 12
            cases.append((a, v, corners[k // 2]) if k % 2 else (a, corners[k // 2], v))
    cases += [(a, h, lw) for a in corners for h in corners for lw in corners]
    bad = []

    async def tb(ctx):
        for a, h, lw in cases:
            ctx.set(dut.inp[0], a)
            ctx.set(dut.w_hi[0], h)
            ctx.set(dut.w_lo[0], lw)
            got = (ctx.get(dut.hi), ctx.get(dut.lo))
            if got != (a * h, a * lw):
                bad.append((a, h, lw, got))

    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()
    assert not bad, bad[:5]


def test_packed_dot_products_rtl_sum_the_borrows_once_per_dot():
    """16-element dot products (the default block_in) with inputs and weights drawn towards the
    extremes, so that many low products are negative (many borrows) and sums reach 16 * 2**14."""
    int8 = st.one_of(st.sampled_from([-128, -127, -1, 0, 1, 127]), st.integers(-128, 127))
    vec = st.lists(int8, min_size=16, max_size=16)
    dut = _PackedDots(16)

    def run(a, wh, wl):
        out = []

        async def tb(ctx):
            for sig, vals in ((dut.inp, a), (dut.w_hi, wh), (dut.w_lo, wl)):
                for s_, v in zip(sig, vals):
                    ctx.set(s_, v)
            out.append((ctx.get(dut.hi), ctx.get(dut.lo)))
        sim = Simulator(dut)
        sim.add_testbench(tb)
        sim.run()
        return out[0]

    @settings(max_examples=60, deadline=None, derandomize=True)
    @given(vec, vec, vec)
    def check(a, wh, wl):
        assert run(a, wh, wl) == (int(np.dot(a, wh)), int(np.dot(a, wl)))
    check()
    # every low product negative and the sums at their extremes
    assert run([-128] * 16, [-128] * 16, [127] * 16) == (16 << 14, -16 * 128 * 127)
    assert run([127] * 16, [-128] * 16, [-128] * 16) == (-16 * 127 * 128,) * 2
    # every pair's low sum at +2^15, the one value outside a signed 16-bit field, and at its minimum
    assert run([-128] * 16, [127] * 16, [-128] * 16) == (-16 * 128 * 127, 16 << 14)
    assert run([-128, 127] * 8, [-128, 127] * 8, [127, -128] * 8) == (8 * (1 << 14) + 8 * 127 * 127, -16 * 128 * 127)


def test_dsp_packing_pair_split_model_is_exact_over_the_whole_low_range():
    """split_pair for every low sum two int8 products can reach (-2^15, 2^15] and high sums at
    their extremes: the one pattern 100...0 reads as +2^15."""
    lo = np.arange(-(1 << 15) + 1, (1 << 15) + 1, dtype=np.int64)
    for hi in (-(1 << 15), -16256, -1, 0, 1, 16256, 1 << 15):
        q = (hi << 16) + lo
        got = [split_pair(int(v), 16) for v in q]
        assert [g[0] for g in got] == [hi] * len(lo) and [g[1] for g in got] == lo.tolist(), hi


def test_packed_dots_rtl_odd_length_mixes_pairs_and_a_single_product():
    """Three elements: one summed pair and one product split on its own, at the extremes."""
    dut = _PackedDots(3)
    vals = (-128, -127, -1, 0, 1, 127)
    rng = np.random.default_rng(3)
    cases = [tuple(int(v) for v in rng.choice(vals, 9)) for _ in range(300)]
    cases += [(-128,) * 9, (-128, -128, -128, 127, 127, 127, -128, -128, -128)]
    bad = []

    async def tb(ctx):
        for c in cases:
            a, wh, wl = c[0:3], c[3:6], c[6:9]
            for sig, vals_ in ((dut.inp, a), (dut.w_hi, wh), (dut.w_lo, wl)):
                for s_, v in zip(sig, vals_):
                    ctx.set(s_, v)
            got = (ctx.get(dut.hi), ctx.get(dut.lo))
            if got != (int(np.dot(a, wh)), int(np.dot(a, wl))):
                bad.append((c, got))

    sim = Simulator(dut)
    sim.add_testbench(tb)
    sim.run()
    assert not bad, bad[:5]


def test_gemm_core_default_shape_packed_equals_plain_products_at_the_extremes():
    """A 1x16x16 core (the default's shape) with and without packing, against numpy, on entries
    of extreme and random int8 values; the accumulator wraps at 32 bits."""
    c = AccelConfig(batch=1, block_in=16, block_out=16, uop_buff_bytes=1024, inp_buff_bytes=256,
                    wgt_buff_bytes=2048, acc_buff_bytes=1024, out_buff_bytes=256)
    rng = np.random.default_rng(7)
    ext = np.array([-128, -127, -1, 0, 1, 127])
    inp = np.concatenate([np.full((1, 1, 16), -128), np.full((1, 1, 16), 127), rng.choice(ext, (6, 1, 16)),
                          rng.integers(-128, 128, (8, 1, 16))])
    wgt = np.concatenate([np.full((1, 16, 16), -128), np.tile([127, -128], (1, 16, 8)), rng.choice(ext, (2, 16, 16)),
                          rng.integers(-128, 128, (4, 16, 16))])
    acc0 = rng.integers(-(1 << 31), 1 << 31, (c.acc_depth, 1, 16))
    uops = [(d % c.acc_depth, s, w) for d, (s, w) in enumerate((s, w) for s in range(16) for w in range(8))]
    results = {}
    for packing in (True, False):
        h = _GemmHarness(c, inp, wgt, acc0)
        h.core = GemmCore(c, dsp_packing=packing)
        final = results[packing] = {}

        async def tb(ctx, h=h, final=final):
            core = h.core
            for d, s, w in uops:
                ctx.set(core.in_valid, 1)
                ctx.set(core.in_acc, d)
                ctx.set(core.in_inp, s)
                ctx.set(core.in_wgt, w)
                await ctx.tick()
            ctx.set(core.in_valid, 0)
            for _ in range(3):
                await ctx.tick()
            for i in range(c.acc_depth):
                final[i] = ctx.get(h.acc.data[i])
        simulate(h, tb)
    ref = acc0.astype(np.int64).copy()
    for d, s, w in uops:
        ref[d] = ref[d] + inp[s] @ wgt[w].T
    ref = ((ref + (1 << 31)) % (1 << 32)) - (1 << 31)
    assert results[True] == results[False]
    for i in range(c.acc_depth):
        assert unpack(results[True][i], 16, 32).tolist() == ref[i].reshape(-1).tolist(), i


# ---- tensor ALU --------------------------------------------------------------------------------
class _AluHarness(Elaboratable):
    """TensorAlu on an accumulator memory (write-transparent read ports, as the compute stage's) and
    an output memory of what it writes there (FLUSH: its requantized value)."""
    def __init__(self, cfg, acc):
        self.cfg, self.alu = cfg, TensorAlu(cfg)
        self.acc = Memory(shape=unsigned(cfg.acc_elem_bytes * 8), depth=cfg.acc_depth,
                          init=[pack(t, cfg.acc_width) for t in acc])
        self.out = Memory(shape=unsigned(cfg.batch * cfg.block_out * 8), depth=cfg.acc_depth, init=[])

    def elaborate(self, platform):
        m = Module()
        alu = m.submodules.alu = self.alu
        m.submodules.acc, m.submodules.out = self.acc, self.out
        wp, op = self.acc.write_port(), self.out.write_port()
        wiring.connect(m, alu.acc_rd_a, self.acc.read_port(transparent_for=(wp,)))
        wiring.connect(m, alu.acc_rd_b, self.acc.read_port(transparent_for=(wp,)))
        m.d.comb += [wp.en.eq(alu.wb_valid), wp.addr.eq(alu.wb_idx), wp.data.eq(alu.wb_data),
                     op.en.eq(alu.wb_valid), op.addr.eq(alu.wb_idx), op.data.eq(alu.wb_out)]
        return m


EDGE = [-(1 << 31), (1 << 31) - 1, -1, 0, 1, 31, 32, -32, -33, 64, 255, -256, 1 << 16,
        # SCALE operands around the shift counts where the result reaches 0 (k >= 56)
        (55 << 24) | 0xFFFFFF, (56 << 24) | 0xFFFFFF, (57 << 24) | 0xFFFFFF, (63 << 24) | 0xFFFFFF, (1 << 24) | 1]


@pytest.mark.parametrize("op", list(AluOp), ids=[o.name for o in AluOp])
def test_tensor_alu_matches_the_isa_definition(op):
    c = CFG
    n = c.batch * c.block_out
    rng = np.random.default_rng(int(op))
    vals = np.array(EDGE + rng.integers(-(1 << 31), 1 << 31, 64).tolist() + rng.integers(-40, 40, 32).tolist())
    pairs = 24
    a = rng.choice(vals, (pairs, c.batch, c.block_out))
    b = rng.choice(vals, (pairs, c.batch, c.block_out))
    imms = [-(1 << 15), (1 << 15) - 1, -1, 0, 5, -33, 31, 40,
            flush_immediate(8, 127, True, True), flush_immediate(3, 5), flush_immediate(0, 127),
            flush_immediate(31, 100), flush_immediate(7, 127, symmetric=True), flush_immediate(2, -3, symmetric=True)]
    acc0 = np.concatenate([a, b])                 # acc[i] = a_i, acc[pairs + i] = b_i
    # micro-ops: register operand for each pair (with an immediate too: FLUSH's parameters), then
    # immediates; then dependent chains: on acc[0], then dst of each the src of the next, then one
    # and two apart (the S3 -> S2 bypass and the read ports' transparency)
    ops = [(i, pairs + i, False, imms[-1 - i % len(imms)]) for i in range(pairs)]
    ops += [(i, 0, True, imms[i % len(imms)]) for i in range(pairs)]
    ops += [(0, 0, False, 0), (0, 0, False, 0), (1, 0, False, 0)]   # back to back on the same entries
    ops += [(i + 1, i, False, imms[i % len(imms)]) for i in range(2, 8)]
    ops += [(9, 30, False, 3), (10, 9, False, 4), (9, 10, False, 5), (11, 31, False, 6), (9, 11, False, 7)]
    h = _AluHarness(c, acc0)
    final = {}
    taken = []

    async def tb(ctx):
        alu = h.alu
        ctx.set(alu.in_op, op)
        for d, s, use_imm, imm in ops:
            ctx.set(alu.in_valid, 1)
            ctx.set(alu.in_dst, d)
            ctx.set(alu.in_src, s)
            ctx.set(alu.in_use_imm, use_imm)
            ctx.set(alu.in_imm, imm)
            while True:        # held until in_ready (MUL, SCALE: every other cycle)
                ready = ctx.get(alu.in_ready)
                taken.append(ready)
                await ctx.tick()
                if ready:
                    break
        ctx.set(alu.in_valid, 0)
        for _ in range(4):
            await ctx.tick()
        for i in range(2 * pairs):
            final[i] = ctx.get(h.acc.data[i]), ctx.get(h.out.data[i])

    simulate(h, tb)
    assert len(taken) == (2 * len(ops) - 1 if op in (AluOp.MUL, AluOp.SCALE) else len(ops))
    ref = acc0.astype(np.int64).copy()
    out = {}
    for d, s, use_imm, imm in ops:
        bval = np.full(ref[d].shape, imm) if use_imm and op != AluOp.FLUSH else ref[s]
        q = flush_requant(ref[d], imm, c.acc_width) if op == AluOp.FLUSH else None
        ref[d] = alu_apply(op, ref[d:d + 1], bval[None], c.acc_width)[0]
        out[d] = ref[d] if q is None else q
    for i in range(2 * pairs):
        assert unpack(final[i][0], n, c.acc_width).tolist() == ref[i].reshape(-1).tolist(), (op.name, i)
        if i in out:
            assert unpack(final[i][1], n, 8).tolist() == ((np.asarray(out[i]) + 128) % 256 - 128).reshape(-1).tolist(), (op.name, i)


def _lane_outputs(width: int, cases: list[tuple]) -> list[int]:
    """alu_lane's output for each (op, a, b[, imm]), combinationally, in Amaranth's simulator."""
    class Lane(Elaboratable):
        def __init__(self):
            self.op, self.a, self.b = Signal(ALU_OPCODE_BITS), Signal(signed(width)), Signal(signed(width))
            self.imm = Signal(signed(width))
            self.out = Signal(signed(width))

        def elaborate(self, platform):
            m = Module()
            m.d.comb += self.out.eq(alu_lane(m, self.op, self.a, self.b, width, self.imm))
            return m
    lane = Lane()
    got = []

    async def tb(ctx):
        for op, a, b, *imm in cases:
            ctx.set(lane.op, op)
            ctx.set(lane.a, a)
            ctx.set(lane.b, b)
            ctx.set(lane.imm, imm[0] if imm else 0)
            await ctx.delay(1e-9)
            got.append(ctx.get(lane.out))

    sim = Simulator(lane)   # combinational: no clock
    sim.add_testbench(tb)
    sim.run()
    return got


def _assert_lane_matches(width: int, cases: list[tuple]) -> None:
    """Each case's result is alu_apply's; FLUSH's (its output-buffer side; TensorAlu writes b to
    the accumulator) flush_requant's."""
    got = _lane_outputs(width, cases)
    want = []
    for op, a, b, *imm in cases:
        if op == AluOp.FLUSH:
            want.append(int(flush_requant(np.array([a]), imm[0] if imm else 0, width)[0]))
        else:
            want.append(int(alu_apply(op, np.array([a]), np.array([b]), width)[0]))
    wrong = [(c, g, w) for c, g, w in zip(cases, got, want) if g != w]
    assert not wrong, wrong[:5]


@pytest.mark.parametrize("width", [16, 32])
def test_alu_lane_matches_the_isa_definition_at_each_accumulator_width(width):
    """One lane, combinationally, every op on edge and random operands at both accumulator widths
    (acc16 configs have 16-bit lanes: no REQUANT shift, a 16-bit SCALE multiplier, k = 0)."""
    rng = np.random.default_rng(width)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    vals = [lo, hi, 0, -1, 1, 15, 16, -16, -17, 31, 32, -32, -33, 255, -256] + rng.integers(lo, hi + 1, 100).tolist()
    if width == 32:   # SCALE operands around the shift counts where the result reaches 0
        vals += [(k << 24) | m for k in (0, 1, 23, 55, 56, 57, 63) for m in (1, 12345, 0xFFFFFF)]
    cases = [(op, int(rng.choice(vals)), int(rng.choice(vals))) for op in AluOp for _ in range(120)]
    cases += [(AluOp.FLUSH, int(rng.choice(vals)), int(rng.choice(vals)), int(rng.integers(-(1 << 15), 1 << 15)))
              for _ in range(200)]
    _assert_lane_matches(width, cases)


@pytest.mark.parametrize("width", [16, 32])
def test_alu_lane_shared_multiplier_and_clamp_on_full_range_operands(width):
    """The ops that share the lane's one multiplier (MUL's low bits: a x b[23:0] plus the narrow
    a x b[31:24] correction; SCALE) and its one clamp (MIN, MAX, CLIP, CLAMP) on operands drawn
    over the whole lane, each op right after another that uses the same unit differently."""
    rng = np.random.default_rng(11 + width)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    pairs = [(int(a), int(b)) for a, b in rng.integers(lo, hi + 1, (150, 2))]
    pairs += [(a, b) for a in (lo, hi, -1, 1) for b in (lo, hi, -1, 1, lo + 1, 1 << (width // 2))]
    ops = (AluOp.MUL, AluOp.SCALE, AluOp.MIN, AluOp.CLIP, AluOp.MAX, AluOp.CLAMP, AluOp.ADD)
    _assert_lane_matches(width, [(op, a, b) for a, b in pairs for op in ops])


@pytest.mark.parametrize("width", [16, 32])
def test_alu_lane_every_shift_count(width):
    """Every count the shifting ops can be given: SHR by each s in [-width, width) (left shifts up to
    the whole lane), REQUANT by each s < 32 with and without rounding, SCALE by each k < 64, each on
    extreme and random values (the lane computes these shifts in narrow pieces)."""
    rng = np.random.default_rng(7 + width)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    a_vals = [lo, hi, -1, 1] + rng.integers(lo, hi + 1, 4).tolist()
    as_lane = lambda v: int(np.array(v, dtype=np.int64).astype(np.dtype(f"int{width}")))
    cases = [(AluOp.SHR, a, s) for s in range(-width, width) for a in a_vals]
    for s in range(32):
        for rnd in (0, 1):   # hi = 127, lo = -128: the clamp only bounds the result
            cases += [(AluOp.REQUANT, a, as_lane(rnd << 21 | s << 16 | 0x7F80)) for a in a_vals]
    if width == 32:
        for k in range(64):
            for m in (1, 0x800000, 0xFFFFFF, int(rng.integers(1, 1 << 24))):
                cases += [(AluOp.SCALE, a, as_lane(k << 24 | m)) for a in a_vals[:5]]
    for s in range(32):   # FLUSH: every shift, rounding or not, with a relu clamp, the int8 ones, a narrow one
        for rnd, lo_zero, hi, sym in ((0, 0, 127, 0), (1, 1, 127, 0), (1, 0, 5, 0), (0, 1, -3, 0), (1, 0, 127, 1),
                                      (0, 0, 6, 1), (0, 1, 9, 1)):
            cases += [(AluOp.FLUSH, a, 7, flush_immediate(s, hi, bool(lo_zero), bool(rnd), bool(sym))) for a in a_vals]
    _assert_lane_matches(width, cases)


# ---- burst reader ------------------------------------------------------------------------------
def _run_dma(cfg, sizes, sel, addr, count, latency=3):
    """Drive a ReadDMA against a simple memory (bytes = address & 0xFF); returns (entries, bursts, cycles)."""
    dma = ReadDMA(cfg, sizes)
    B = cfg.bus_bytes
    out = {"entries": [], "bursts": []}

    async def tb(ctx):
        bus = dma.bus
        ctx.set(dma.start, 1)
        ctx.set(dma.addr, addr)
        ctx.set(dma.count, count)
        ctx.set(dma.sel, sel)
        await ctx.tick()
        ctx.set(dma.start, 0)
        pending, cycle = [], 0
        while cycle < 4000:
            ctx.set(bus.ar_ready, 1)
            beat = pending[0] if pending and pending[0][0] <= cycle else None
            ctx.set(bus.r_valid, beat is not None)
            if beat is not None:
                a = beat[1]
                ctx.set(bus.r_data, int.from_bytes(bytes((a + j) & 0xFF for j in range(B)), "little"))
                ctx.set(bus.r_last, beat[2])
            if ctx.get(dma.out_valid):
                out["entries"].append(ctx.get(dma.out_data))
            ar = ctx.get(bus.ar_valid)
            if ar:
                a0, n = ctx.get(bus.ar_addr), ctx.get(bus.ar_len) + 1
                out["bursts"].append((a0, n))
                pending += [(cycle + latency + k, a0 + k * B, k == n - 1) for k in range(n)]
            take = beat is not None and ctx.get(bus.r_ready)
            await ctx.tick()
            cycle += 1
            if take:
                pending.pop(0)
                for k in range(len(pending)):
                    pending[k] = (max(pending[k][0], cycle), *pending[k][1:])
            if not ctx.get(dma.busy) and not pending and cycle > 2:
                break
        out["cycles"] = cycle

    simulate(dma, tb)
    return out


@pytest.mark.parametrize("elem,addr,count", [(4, 0x104, 5), (4, 0x100, 4), (16, 0x40, 3), (8, 0x208, 2)])
def test_read_dma_unpacks_entries_smaller_and_larger_than_a_beat(elem, addr, count):
    sizes = (4, 8, 16)
    r = _run_dma(CFG, sizes, sizes.index(elem), addr, count)
    want = [int.from_bytes(bytes((addr + i * elem + j) & 0xFF for j in range(elem)), "little") for i in range(count)]
    assert [e & ((1 << (8 * elem)) - 1) for e in r["entries"]] == want


def test_read_dma_splits_bursts_at_4k_boundaries_and_256_beats():
    B = CFG.bus_bytes
    addr, count = 4096 - 3 * 16, 200        # 16-byte entries: crosses 4 KiB after 6 beats
    r = _run_dma(CFG, (16,), 0, addr, count)
    assert r["bursts"][0] == (addr, 6)
    for a, n in r["bursts"]:
        assert n <= 256 and (a % 4096) + n * B <= 4096
    assert sum(n for _, n in r["bursts"]) == count * 16 // B
    assert len(r["entries"]) == count


# ---- stage sequencer ---------------------------------------------------------------------------
def test_stage_control_pops_tokens_before_and_pushes_after_executing():
    ctrl = StageControl(has_prev=True, has_next=True)
    trace = []

    async def tb(ctx):
        insn = (1 << POP_PREV) | (1 << PUSH_NEXT)    # pop from prev, push to next
        ctx.set(ctrl.cmd.rdy, 1)
        ctx.set(ctrl.cmd.data, insn)
        for cycle in range(14):
            ctx.set(ctrl.prev_in.rdy, cycle >= 3)      # the token arrives in cycle 3
            ctx.set(ctrl.next_in.rdy, 0)               # not named by the instruction: never waited on
            ctx.set(ctrl.next_out.rdy, cycle >= 10)    # space to push from cycle 10
            ctx.set(ctrl.unit_busy, cycle in (5, 6))
            trace.append((cycle, ctx.get(ctrl.cmd.en), ctx.get(ctrl.prev_in.en), ctx.get(ctrl.start),
                          ctx.get(ctrl.next_out.en), ctx.get(ctrl.stall_cycle), ctx.get(ctrl.busy_cycle)))
            popped = ctx.get(ctrl.cmd.en)
            await ctx.tick()
            if popped:
                ctx.set(ctrl.cmd.rdy, 0)       # a one-entry command queue, now empty

    simulate(ctrl, tb)
    by = {t[0]: t[1:] for t in trace}
    assert [c for c in range(14) if by[c][4]] == [0, 1, 2, 8, 9]        # token stalls: pop, then push
    assert by[3][:2] == (1, 1)                                          # instruction + token popped together
    assert [c for c in range(14) if by[c][2]] == [4]                    # start: the first EXEC cycle
    assert [c for c in range(14) if by[c][3]] == [10]                   # pushed once space appeared
    assert [c for c in range(14) if by[c][5]] == [3, 4, 5, 6, 7, 10]    # busy: pop, EXEC (4..7), push


# ---- AXI read arbiter ---------------------------------------------------------------------------
def test_axi_read_address_stays_stable_while_arready_is_low():
    """AXI4: ARID/ARADDR/ARLEN must not change while ARVALID is high and ARREADY low. The
    combinational round robin switched to a higher-priority client that asked a cycle later."""
    axi = AxiMaster(CFG)
    seen = []

    async def tb(ctx):
        bus, rd = axi.bus, axi.rd
        ctx.set(bus.arready, 0)
        ctx.set(rd[1].ar_valid, 1)               # load asks first ...
        ctx.set(rd[1].ar_addr, 0x100)
        ctx.set(rd[1].ar_len, 3)
        for cycle in range(4):
            if cycle == 1:                        # ... fetch (first in round-robin order) a cycle later
                ctx.set(rd[0].ar_valid, 1)
                ctx.set(rd[0].ar_addr, 0x200)
                ctx.set(rd[0].ar_len, 0)
            if cycle == 3:
                ctx.set(bus.arready, 1)
            seen.append((ctx.get(bus.arvalid), ctx.get(bus.arid), ctx.get(bus.araddr), ctx.get(bus.arlen),
                         ctx.get(rd[1].ar_ready), ctx.get(rd[0].ar_ready)))
            await ctx.tick()

    simulate(axi, tb)
    assert seen[:3] == [(1, READ_ID, 0x100, 3, 0, 0)] * 3
    assert seen[3] == (1, READ_ID, 0x100, 3, 1, 0)      # accepted for the client it was offered for


def test_axi_reads_share_one_id_and_beats_go_to_clients_in_ar_order():
    """Three clients' bursts all carry READ_ID (one ID: the slave must answer in AR order, A5.3),
    and the R beats, answered in that order, reach the client that asked for each burst."""
    axi = AxiMaster(CFG.replace(read_outstanding=4))
    ids, got = [], {0: [], 1: [], 2: []}

    async def tb(ctx):
        bus, rd = axi.bus, axi.rd
        ctx.set(bus.arready, 1)
        for c in range(3):
            ctx.set(rd[c].ar_valid, 1)
            ctx.set(rd[c].ar_addr, 0x1000 * (c + 1))
            ctx.set(rd[c].ar_len, c)          # client c asks for c + 1 beats
            ctx.set(rd[c].r_ready, 1)
        order = []
        for _ in range(3):                    # one AR per cycle, round robin
            assert ctx.get(bus.arvalid)
            ids.append(ctx.get(bus.arid))
            order.append(next(c for c in range(3) if ctx.get(rd[c].ar_ready)))
            await ctx.tick()
            ctx.set(rd[order[-1]].ar_valid, 0)
        for c in order:                       # the slave answers in AR order, RID = the ARID
            for k in range(c + 1):
                ctx.set(bus.rvalid, 1)
                ctx.set(bus.rid, READ_ID)
                ctx.set(bus.rdata, 100 * c + k)
                ctx.set(bus.rlast, k == c)
                for d in range(3):
                    if ctx.get(rd[d].r_valid):
                        got[d].append(ctx.get(rd[d].r_data))
                assert ctx.get(bus.rready) and not ctx.get(axi.bus_error)
                await ctx.tick()
        ctx.set(bus.rvalid, 0)
        assert ctx.get(axi.rd_idle)

    simulate(axi, tb)
    assert ids == [READ_ID] * 3
    assert got == {0: [0], 1: [100, 101], 2: [200, 201, 202]}


def test_axi_flags_a_response_with_another_id_as_a_bus_error():
    axi = AxiMaster(CFG)

    async def tb(ctx):
        bus, rd = axi.bus, axi.rd
        ctx.set(bus.arready, 1)
        ctx.set(rd[1].ar_valid, 1)
        ctx.set(rd[1].r_ready, 1)
        await ctx.tick()
        ctx.set(rd[1].ar_valid, 0)
        ctx.set(bus.rvalid, 1)
        ctx.set(bus.rlast, 1)
        ctx.set(bus.rid, READ_ID ^ 1)
        assert ctx.get(axi.bus_error)
        ctx.set(bus.rid, READ_ID)
        assert not ctx.get(axi.bus_error)

    simulate(axi, tb)
