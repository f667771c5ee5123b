"""The plain ISA model (sim/reference.py) against values worked out by hand from the ISA's text."""
import numpy as np
import pytest

from accel.isa import (
    PRESETS,
    Alu,
    AluOp,
    Epilogue,
    Finish,
    Gemm,
    Load,
    MemType,
    Opcode,
    Store,
    encode_program,
    encode_uops,
    operands,
)
from accel.isa.isa import INSN_CLASSES
from sim.reference import ReferenceError, ReferenceMachine, alu_lane, flush_lane, run_reference, wrap

TINY = PRESETS["tiny"]   # batch 1, 4 x 4, int8 operands, int32 accumulator


def lane(op, a, b, w=32):
    return wrap(alu_lane(op, a, b, w), w)


@pytest.mark.parametrize("op, a, b, w, want", [
    (AluOp.MIN, 3, -5, 32, -5), (AluOp.MAX, 3, -5, 32, 3),
    (AluOp.ADD, 2**31 - 1, 1, 32, -2**31), (AluOp.ADD, 2**15 - 1, 1, 16, -2**15),
    (AluOp.MUL, 0x10000, 0x10000, 32, 0), (AluOp.MUL, -7, 6, 32, -42),
    (AluOp.SHR, -100, 2, 32, -25), (AluOp.SHR, 5, -3, 32, 40),
    (AluOp.SHR, 5, 63, 32, 10),          # 63's low 6 bits read as signed: -1, a left shift
    (AluOp.SHR, 5, 31, 16, 10),          # a 16-bit lane reads 5 bits: 31 is -1
    (AluOp.CLIP, 200, 100, 32, 100), (AluOp.CLIP, -200, 100, 32, -100),
    (AluOp.MOV, 9, -4, 32, -4),
    (AluOp.CLAMP, 50, operands.clamp_immediate(-10, 20), 32, 20),
    (AluOp.CLAMP, -50, operands.clamp_immediate(-10, 20), 32, -10),
    (AluOp.REQUANT, 100, operands.requant_operand(4, -128, 127, True, 32), 32, 6),      # (100 + 8) >> 4
    (AluOp.REQUANT, -100, operands.requant_operand(4, -128, 127, True, 32), 32, -6),    # floor(-92 / 16)
    (AluOp.REQUANT, 10000, operands.requant_operand(4, -128, 127, False, 32), 32, 127),
    (AluOp.REQUANT, 100, 4 << 16 | 0x7F80, 16, 100),   # a 16-bit lane has no shift: the clamp alone
    (AluOp.SCALE, 5, operands.scale_operand(3, 1, 32), 32, 8),       # (15 + 1) >> 1
    (AluOp.SCALE, -5, operands.scale_operand(3, 1, 32), 32, -7),     # (-15 + 1) >> 1
    (AluOp.SCALE, 2**30, operands.scale_operand(1 << 23, 0, 32), 32, 2**31 - 1),   # saturates, no wrap
])
def test_alu_lanes(op, a, b, w, want):
    assert lane(op, a, b, w) == want


def test_flush_lane():
    imm = operands.flush_immediate(2, 100, lo_zero=True, round_half=True)
    assert [flush_lane(a, imm, 32) for a in (-50, 17, 1000)] == [0, 4, 100]     # (17 + 2) >> 2
    sym = operands.flush_immediate(0, 5, symmetric=True)
    assert [flush_lane(a, sym, 32) for a in (-9, 9)] == [-5, 5]
    assert flush_lane(-9, operands.flush_immediate(0, 5), 32) == -6


def _image(cfg, inp, wgt, uops, acc=None):
    """DRAM: inputs at entry 0.., weights, micro-ops, accumulators, then 64 bytes of output."""
    dram = np.zeros(4096, np.uint8)
    dram[0:inp.size] = inp.astype(np.int8).view(np.uint8).reshape(-1)
    dram[512:512 + wgt.size] = wgt.astype(np.int8).view(np.uint8).reshape(-1)
    u = encode_uops(np.array(uops), cfg)
    dram[1024:1024 + u.size] = u
    if acc is not None:
        raw = acc.astype("<i4").view(np.uint8).reshape(-1)
        dram[2048:2048 + raw.size] = raw
    return dram


def test_a_gemm_and_its_narrowing_store():
    """acc = inp @ wgt.T summed over two micro-ops, out = acc wrapped to int8, stored in order."""
    cfg = TINY
    rng = np.random.default_rng(1)
    inp = rng.integers(-128, 128, (2, 1, 4))
    wgt = rng.integers(-128, 128, (2, 4, 4))
    dram = _image(cfg, inp, wgt, [(0, 0, 0), (0, 1, 1)])
    prog = [Load(mem_type=MemType.INP, dram_base=0, y_size=1, x_size=2, x_stride=2),
            Load(mem_type=MemType.WGT, dram_base=512 // 16, y_size=1, x_size=2, x_stride=2),
            Load(mem_type=MemType.UOP, dram_base=1024 // 4, y_size=1, x_size=2, x_stride=2),
            Gemm(uop_bgn=0, uop_end=1, reset=True),
            Gemm(uop_bgn=0, uop_end=2),
            Store(sram_base=0, dram_base=3072 // 4, y_size=1, x_size=1, x_stride=1),
            Finish(),
            Store(sram_base=0, dram_base=3200 // 4, y_size=1, x_size=1, x_stride=1)]   # after FINISH: never runs
    m = ReferenceMachine(cfg)
    m.run(prog, dram)
    want = inp[0, 0] @ wgt[0].T + inp[1, 0] @ wgt[1].T
    assert m.acc[0, 0].tolist() == want.tolist()
    assert dram[3072:3076].view(np.int8).tolist() == want.astype(np.int8).tolist()
    assert not dram[3200:3204].any()


def test_load_padding_and_a_flushing_gemm_with_its_seed():
    """A padded ACC load (zeros around), then a flushing GEMM: out = the FLUSH requantization of the
    sum, acc = the seed entry (read before the write)."""
    cfg = TINY
    acc = np.array([[[40, -40, 7, 1000]], [[1, 2, 3, 4]]])
    dram = _image(cfg, np.ones((1, 1, 4)), np.eye(4)[None] * 0, [(1, 0, 0)], acc)
    imm = operands.flush_immediate(1, 100, round_half=True)
    prog = [Load(mem_type=MemType.ACC, sram_base=0, dram_base=2048 // 16, y_size=1, x_size=2, x_stride=2,
                 x_pad0=1),
            Load(mem_type=MemType.UOP, dram_base=1024 // 4, y_size=1, x_size=1, x_stride=1),
            Epilogue(imm=imm, seed_base=2),
            Gemm(uop_bgn=0, uop_end=1, flush=True)]
    m = ReferenceMachine(cfg)
    m.run(prog, dram)
    assert m.acc[0].tolist() == [[0, 0, 0, 0]]               # the padding entry
    assert m.out[1].tolist() == [[20, -20, 4, 100]]          # (x + 1) >> 1 clamped to [-101, 100]
    assert m.acc[1].tolist() == [[1, 2, 3, 4]]               # the seed: entry 2 as loaded


@pytest.mark.parametrize("prog, match", [
    ([Load(mem_type=MemType.OUT, y_size=1, x_size=1, x_stride=1)], r"instruction 0: LOAD field mem_type=OUT"),
    ([Store(y_size=1, x_size=1, x_stride=1, x_pad0=1)], r"instruction 0: STORE padding fields must be zero"),
    ([Load(mem_type=MemType.INP, sram_base=TINY.inp_depth - 1, y_size=1, x_size=2, x_stride=2)],
     r"LOAD INP: sram_base=\d+ \+ 1x2 entries exceeds the buffer depth"),
    ([Load(mem_type=MemType.INP, dram_base=10**6, y_size=1, x_size=1, x_stride=1)], r"lies outside the"),
    ([Alu(uop_bgn=0, uop_end=1, iter_out=2, dst_factor_out=TINY.acc_depth)],
     r"instruction 0: ALU: accumulator \(dst\) index \d+ out of range"),
    ([Gemm(uop_bgn=0, uop_end=TINY.uop_depth + 1)], r"micro-op range \[uop_bgn=0, uop_end=\d+\) outside"),
    ([Epilogue(seed_base=TINY.acc_depth - 1, seed_factor_out=1), Gemm(uop_bgn=0, uop_end=1, iter_out=2, flush=True)],
     r"instruction 1: GEMM: flush seed index \d+ out of range"),
])
def test_errors_name_the_instruction_and_field(prog, match):
    with pytest.raises(ReferenceError, match=match):
        run_reference(TINY, prog, np.zeros(4096, np.uint8))


def test_instruction_limit():
    with pytest.raises(ReferenceError, match="instruction limit 3 reached"):
        ReferenceMachine(TINY, max_insns=3).run([Gemm()] * 5 + [Finish()], np.zeros(64, np.uint8))


def test_run_at_decodes_from_dram_through_finish():
    """The program as bytes in DRAM, as fsim runs it: decoding stops at FINISH (garbage after it)."""
    cfg = TINY
    prog = [Alu(alu_op=AluOp.MOV, use_imm=True, imm=-3, uop_bgn=0, uop_end=1, iter_out=2, dst_factor_out=1),
            Store(sram_base=0, dram_base=1024 // 4, y_size=1, x_size=2, x_stride=2), Finish()]
    dram = np.zeros(4096, np.uint8)
    code = encode_program(prog, cfg).reshape(-1)
    dram[2048:2048 + code.size] = code
    dram[2048 + code.size:2048 + code.size + 16] = 0xFF            # not an instruction
    ReferenceMachine(cfg).run_at(dram, 2048, len(prog) + 1)
    assert dram[1024:1032].view(np.int8).tolist() == [-3] * 8
    with pytest.raises(ReferenceError, match="lies outside the 4096-byte DRAM"):
        ReferenceMachine(cfg).run_at(dram, 4000, 8)


def test_every_opcode_and_alu_op_is_specified():
    """A new opcode or ALU op must get its meaning here before fsim can be checked against it."""
    for op in AluOp:
        assert isinstance(alu_lane(op, 5, 3, 32), int), op.name
    prog = [cls() for op, cls in INSN_CLASSES.items() if op != Opcode.FINISH] + [Finish()]
    assert {type(i) for i in prog} == set(INSN_CLASSES.values())
    run_reference(TINY, prog, np.zeros(64, np.uint8))       # every kind runs (empty ranges)
