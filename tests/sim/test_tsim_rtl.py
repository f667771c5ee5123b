"""Timing model against the RTL (Verilator) on micro-benchmarks: every counter must be equal, and the
per-instruction spans too. Each instruction kind alone, token chains, full queues, DRAM models."""
import numpy as np
import pytest

from accel.isa import PRESETS, Alu, AluOp, Finish, Gemm, Load, MemType, Store, Uop, encode_program, flush_immediate
from sim.dram import DramModel, dram_preset
from sim.fsim import Fsim
from sim.reference import run_reference
from sim.rtl import RtlProgram, run_programs
from sim.rtl.programs import Builder
from sim.tsim import Tsim, stage_of
from sim.verilator.build import tools_available
from sim.verilator.model import VerilatorModel

TINY = PRESETS["tiny"]
pytestmark = [pytest.mark.rtl,
              pytest.mark.skipif(tools_available() is not None, reason=f"rtl driver: {tools_available()}")]

DRAMS = {"default": DramModel(), "fast": DramModel(read_latency=1, write_latency=1),
         "narrow": DramModel(read_latency=5, write_latency=3, bytes_per_cycle=3),
         "pynq-z1": dram_preset("pynq-z1", TINY.clock_mhz)}     # a board preset (docs/dram.md)


def _agree(insns, dram=DramModel(), cfg=TINY):
    code = encode_program(insns, cfg).reshape(-1)
    image = np.zeros(1 << 16, np.uint8)
    image[0x1000:0x1000 + code.size] = code
    rtl = VerilatorModel(cfg, dram=dram, probes=True).run(image, 0x1000, len(insns))
    ts = Tsim(cfg, dram).run_insns(insns, 0x1000, trace=True)
    assert ts.counters() == rtl.counters
    per = {0: [], 1: [], 2: []}
    for i, insn in enumerate(insns):
        per[int(stage_of(insn))].append(i)
    got = sorted((s, i, a, b) for s, i, a, b in ts.spans)
    nxt, want = {0: 0, 1: 0, 2: 0}, []
    for s, a, b in rtl.stage_spans:
        want.append((s, per[s][nxt[s]], a, b))
        nxt[s] += 1
    assert got == sorted(want)
    assert sorted(ts.bursts) == sorted(rtl.bursts)
    return rtl.counters["cycles"]


FIN = Finish(pop_prev=True)
LOADS = [dict(y_size=1, x_size=1), dict(y_size=2, x_size=3, x_stride=5),
         dict(y_size=2, x_size=2, y_pad0=1, y_pad1=2, x_pad0=1, x_pad1=3, x_stride=3),
         dict(y_size=0, x_size=0, y_pad0=2, x_pad0=1), dict(y_size=3, x_size=3, dram_base=3, x_stride=7),
         dict(y_size=1, x_size=100, dram_base=250)]          # crosses a 4 KiB boundary


@pytest.mark.parametrize("dram", DRAMS)
@pytest.mark.parametrize("mem", [MemType.INP, MemType.WGT])
@pytest.mark.parametrize("shape", range(len(LOADS)))
def test_tsim_rtl_load_alone(dram, mem, shape):
    kw = dict(LOADS[shape])
    _agree([Load(mem_type=mem, dram_base=kw.pop("dram_base", 0x100), push_next=True, **kw), FIN], DRAMS[dram])


@pytest.mark.parametrize("dram", DRAMS)
@pytest.mark.parametrize("mem", [MemType.UOP, MemType.ACC])
@pytest.mark.parametrize("kw", [dict(y_size=1, x_size=1, dram_base=1), dict(y_size=2, x_size=3, x_stride=5, dram_base=3),
                                dict(y_size=1, x_size=200, dram_base=0x7f)])   # ACC: more than 256 beats
def test_tsim_rtl_compute_load_alone(dram, mem, kw):
    kw = dict(kw)
    _agree([Load(mem_type=mem, dram_base=kw.pop("dram_base"), **kw), Finish()], DRAMS[dram])


@pytest.mark.parametrize("insn", [Gemm(uop_end=1), Gemm(uop_bgn=2, uop_end=7, iter_out=3, iter_in=2, reset=True),
                                  Gemm(), Alu(uop_end=4, iter_out=2, alu_op=AluOp.MAX),
                                  Alu(uop_end=1, use_imm=True, imm=-3, alu_op=AluOp.SHR), Alu(iter_in=0, uop_end=3)])
def test_tsim_rtl_gemm_alu_alone(insn):
    _agree([insn, Finish()])


@pytest.mark.parametrize("dram", DRAMS)
@pytest.mark.parametrize("kw", [dict(y_size=1, x_size=1), dict(y_size=3, x_size=5, x_stride=7, dram_base=1),
                                dict(y_size=1, x_size=250, x_stride=250, dram_base=1000),   # 4 KiB crossing
                                dict(y_size=4, x_size=2, x_stride=3, dram_base=3)])
def test_tsim_rtl_store_alone(dram, kw):
    kw = dict(kw)
    _agree([Store(dram_base=kw.pop("dram_base", 0x400), **kw), Finish()], DRAMS[dram])


def test_tsim_rtl_token_chain():
    ld = Load(mem_type=MemType.INP, dram_base=0x100, y_size=2, x_size=4, x_stride=4)
    st = Store(dram_base=0x800, y_size=1, x_size=4)
    prog = []
    for _ in range(3):   # load -> compute -> store -> compute -> load, three times round
        prog += [ld.with_deps(push_next=True), Gemm(uop_end=2, pop_prev=True, push_next=True),
                 st.with_deps(pop_prev=True, push_prev=True), Alu(uop_end=3, pop_next=True, push_prev=True),
                 ld.with_deps(pop_next=True, push_next=True), Gemm(uop_end=1, pop_prev=True)]
    _agree(prog + [Finish()])


@pytest.mark.parametrize("dram", DRAMS)
def test_tsim_rtl_command_queue_full(dram):
    """A long GEMM holds compute while 20 more compute instructions queue up behind it (queue of 8):
    fetch stalls on the full command queue, the load stage's instructions wait behind them."""
    prog = [Gemm(uop_end=4, iter_out=40)] + [Alu(uop_end=1) for _ in range(20)]
    prog += [Load(mem_type=MemType.WGT, dram_base=0x40, y_size=1, x_size=2, push_next=True)] * 3
    prog += [Gemm(uop_end=1, pop_prev=True) for _ in range(3)] + [Finish()]
    _agree(prog, DRAMS[dram])


def test_tsim_rtl_token_queue_full():
    """The load stage pushes 12 tokens before compute pops any (token queue of 8): PUSH stalls."""
    prog = [Gemm(uop_end=8, iter_out=20)]
    prog += [Load(mem_type=MemType.INP, dram_base=0x40, y_size=1, x_size=1, push_next=True) for _ in range(12)]
    prog += [Gemm(uop_end=1, pop_prev=True) for _ in range(12)] + [Finish()]
    _agree(prog)


def test_tsim_rtl_three_clients_on_the_bus():
    """Fetch, load and compute DMAs contend for the read bus (round robin, read_outstanding bursts
    in flight)."""
    prog = [Load(mem_type=MemType.WGT, dram_base=0x40 + 8 * i, y_size=4, x_size=6, x_stride=9) for i in range(4)]
    prog += [Load(mem_type=MemType.ACC, dram_base=0x100 + 4 * i, y_size=3, x_size=5, x_stride=7) for i in range(4)]
    prog += [Load(mem_type=MemType.UOP, dram_base=0x300 + i, y_size=1, x_size=9) for i in range(4)]
    prog = [prog[i % 3 * 4 + i // 3] for i in range(12)]
    _agree(prog + [Alu(uop_end=1) for _ in range(12)] + [Finish()])


TIGHT = TINY.replace(read_outstanding=2, write_outstanding=2)


@pytest.mark.parametrize("dram", [DramModel(read_latency=20, write_latency=30),
                                  DramModel(read_latency=12, write_latency=9, bytes_per_cycle=4)], ids=["slow", "narrow"])
def test_tsim_rtl_outstanding_limits_bind(dram):
    """Two bursts in flight per direction, slow DRAM: many-row loads from two clients and stores of
    one-beat rows wait for free slots (AR for an RLAST, AW for a B), alike in both executors."""
    prog = [Load(mem_type=MemType.INP, dram_base=0x100, y_size=6, x_size=2, x_stride=16, x_pad0=1, y_pad1=1),
            Load(mem_type=MemType.ACC, dram_base=0x80, y_size=5, x_size=1, x_stride=3),
            Load(mem_type=MemType.WGT, dram_base=0x200, y_size=3, x_size=3, x_stride=5, push_next=True),
            Store(dram_base=0x900, y_size=7, x_size=1, x_stride=4),
            Gemm(uop_end=1, pop_prev=True), Finish()]
    slow = _agree(prog, dram, cfg=TIGHT)
    assert slow > _agree(prog, dram)        # four slots each (the default) finish sooner


def test_tsim_cocotb_bench_throttled_overlapping_reads():
    """The cocotb bench's memory (sim/rtl/axi_model.py) implements the same DramModel: with reads
    overlapping and the DRAM slower than the bus, its counters equal tsim's."""
    pytest.importorskip("cocotb")
    dram = DramModel(read_latency=6, write_latency=4, bytes_per_cycle=3)
    insns = [Load(mem_type=MemType.WGT, dram_base=0x40, y_size=4, x_size=3, x_stride=5, x_pad1=1),
             Load(mem_type=MemType.INP, dram_base=0x100, y_size=5, x_size=2, x_stride=9, push_next=True),
             Load(mem_type=MemType.ACC, dram_base=0x80, y_size=3, x_size=2, x_stride=4),
             Store(dram_base=0x800, y_size=2, x_size=3), Gemm(uop_end=1, pop_prev=True), Finish()]
    code = encode_program(insns, TINY).reshape(-1)
    image = np.zeros(1 << 16, np.uint8)
    image[0x1000:0x1000 + code.size] = code
    run, = run_programs(TINY, [RtlProgram("overlap", image, 0x1000, len(insns))], "verilator", dram=dram)
    assert run.status == "done" and not run.bus_error
    want = Tsim(TINY, dram).run_insns(insns, 0x1000).counters()
    assert {k: run.counters[k] for k in want} == want


# ALU loops whose micro-ops read what the one right before (or two before) wrote: (uops, loop)
HAZARD_LOOPS = [
    ([Uop(acc=1, src=0)], dict(iter_out=7, dst_factor_out=1, src_factor_out=1)),      # src(i+1) = dst(i)
    ([Uop(acc=8, src=9)], dict(iter_out=6, src_factor_out=1)),                         # dst read every op
    ([Uop(acc=16, src=17), Uop(acc=17, src=16)], dict(iter_out=3, iter_in=2)),         # ping-pong: 1 and 2 apart
    ([Uop(acc=20, src=20)], dict(iter_out=2, iter_in=3)),                              # a and b: the last write
    ([Uop(acc=21, src=21), Uop(acc=22, src=23), Uop(acc=23, src=21)], dict(iter_out=2, dst_factor_out=0)),
]
HAZARD_IMM = {AluOp.SHR: 3, AluOp.ADD: -77, AluOp.FLUSH: flush_immediate(4, 100, False, True),
              AluOp.CLAMP: (5 << 8) | 0xF6, AluOp.MIN: 1000}


def _hazard_program(cfg, ops, seed: int = 0):
    """Per op: a fresh accumulator tile, the HAZARD_LOOPS on it (register operand; with an immediate
    too where HAZARD_IMM has one), then each entry shown in full in the output buffer: its low byte
    (the loops' writes) and copies shifted right by 8, 16 and 24, stored."""
    b = Builder(cfg, seed, dram_bytes=1 << 17)
    n = 24
    hazard = [u for uops, _ in HAZARD_LOOPS for u in uops]
    show = len(hazard)                      # slot of the copy acc[s*n + i] = acc[i], s = 1, 2, 3
    b.uops(hazard + [Uop(acc=s * n, src=0) for s in (1, 2, 3)], 0)
    walk = dict(iter_out=n, dst_factor_out=1, src_factor_out=1)
    for k, op in enumerate(ops):
        tile = b.random_tile(MemType.ACC, n) if op == AluOp.SCALE else b.random_tile(MemType.ACC, n, -3000, 3000)
        addr = b.put(tile, align=cfg.acc_elem_bytes)
        b.emit(Load(mem_type=MemType.ACC, sram_base=0, dram_base=b.ent(addr, MemType.ACC), y_size=1, x_size=n,
                    x_stride=n, pop_next=k > 0))
        slot = 0
        for uops, loop in HAZARD_LOOPS:
            b.emit(Alu(uop_bgn=slot, uop_end=slot + len(uops), alu_op=op, **loop))
            if op in HAZARD_IMM:
                b.emit(Alu(uop_bgn=slot, uop_end=slot + len(uops), alu_op=op, use_imm=True, imm=HAZARD_IMM[op],
                           **loop))
            slot += len(uops)
        for s in (1, 2, 3):
            b.emit(Alu(uop_bgn=show + s - 1, uop_end=show + s, alu_op=AluOp.MOV, **walk),
                   Alu(uop_bgn=show + s - 1, uop_end=show + s, alu_op=AluOp.SHR, use_imm=True, imm=8 * s,
                       push_next=s == 3, **walk))
        addr = b.noise(4 * n * cfg.out_elem_bytes)
        b.emit(Store(sram_base=0, dram_base=b.ent(addr, MemType.OUT), y_size=1, x_size=4 * n, x_stride=4 * n,
                     pop_prev=True, push_prev=True))
    b.emit(Finish(pop_next=True))
    return b.program()


@pytest.mark.parametrize("ops", [(AluOp.MUL, AluOp.SCALE), (AluOp.ADD, AluOp.SHR, AluOp.FLUSH),
                                 (AluOp.MIN, AluOp.CLAMP, AluOp.MOV, AluOp.REQUANT)], ids=["mul", "add", "clamp"])
def test_tsim_rtl_alu_read_after_write_in_flight(ops):
    """Back-to-back dependent ALU micro-ops (an operand written by the micro-op right before, in S3,
    or two before): the RTL's DRAM equals fsim's and the plain reference machine's, and its counters
    and spans tsim's (MUL and SCALE every other cycle, the others every cycle, whatever the indices)."""
    prog = _hazard_program(TINY, ops)
    image = prog.dram_image()
    want = image.copy()
    Fsim(TINY).run(want, prog.insn_addr, len(prog.insns))
    ref = run_reference(TINY, prog.insns, image.copy())
    assert np.array_equal(ref, want)
    got = image.copy()
    rtl = VerilatorModel(TINY, probes=True).run(got, prog.insn_addr, len(prog.insns))
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} DRAM bytes differ from fsim's, first at 0x{bad[0]:x}"
    ts = Tsim(TINY).run_insns(prog.insns, prog.insn_addr, trace=True)
    assert ts.counters() == rtl.counters
    per = [i for i, insn in enumerate(prog.insns) if int(stage_of(insn)) == 1]
    got_spans = sorted((i, a, b) for s, i, a, b in ts.spans if s == 1)
    assert got_spans == [(per[j], a, b) for j, (a, b) in enumerate((a, b) for s, a, b in rtl.stage_spans if s == 1)]
