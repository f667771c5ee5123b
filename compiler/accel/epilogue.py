"""The requantizing epilogue on the accumulator, shared by every GEMM emitter: the register
operands of REQUANT and SCALE, the FLUSH immediate, and the ALU passes when one pass cannot do it."""
from __future__ import annotations

import numpy as np

from accel.isa import AluOp, EncodingError, OperandError, flush_immediate, operands

from .spec import Requant, TilingError


def requant_operand(requant: Requant, acc_width: int) -> int | None:
    """The lane value of the epilogue's register operand, or None when there is none: for a
    fixed-point requantization SCALE's (shift in bits 29:24, multiplier in 23:0; acc_width >= 30),
    else REQUANT's when one pass can do the rounding shift and clamp (round in bit 21, shift in
    bits 20:16, hi and lo as bytes)."""
    try:   # the lane layouts and their ranges are accel.isa.operands'
        if requant.fixed_point:
            return operands.scale_operand(requant.mul, requant.shift, acc_width)
        if requant.shift <= 0 or requant.lo > requant.hi:
            return None
        return operands.requant_operand(requant.shift, requant.lo, requant.hi, requant.round, acc_width)
    except OperandError:
        return None


def flush_params(requant: Requant) -> int | None:
    """The ALU FLUSH immediate doing this requantization in one pass (shift, rounding, a clamp to
    [0, hi], [-hi, hi] or [-hi-1, hi]), or None when FLUSH cannot (a multiplier, a zero point, a left
    shift, other bounds)."""
    if requant.fixed_point or requant.zero_point or requant.lo not in (0, -requant.hi, -requant.hi - 1):
        return None
    try:   # flush_immediate checks the shift's and hi's ranges
        return flush_immediate(requant.shift, requant.hi, requant.lo == 0, requant.round and requant.shift > 0,
                               symmetric=requant.lo == -requant.hi != 0)
    except EncodingError:
        return None


def channel_scale_operands(muls: np.ndarray, shift: int, acc_width: int) -> np.ndarray:
    """Per-channel SCALE lane operands (int32, one per output channel) for multipliers muls[c] with
    a shared shift: each written as M * 2^-k with M < 2^24 (the low bits a shared shift adds are
    zeros: compiler.graph.passes.quantize builds them so), the product exactly as the reference's."""
    try:
        return operands.channel_scale_operands(muls, shift, acc_width)
    except OperandError as e:
        raise TilingError(f"per-channel scales: {e}") from None


def set_requant_operand(stream, idx: int, requant: Requant) -> None:
    """Every lane of accumulator entry idx := the REQUANT operand (MOV, SHL 16, ADD of immediates)."""
    v = requant_operand(requant, stream.cfg.acc_width)
    if v is None:
        return
    one = stream.kernel(("conv.entry", idx), lambda k: k.push(idx))
    for op, imm in operands.lane_immediates(v):
        stream.push_alu(one, AluOp[op], imm)


def _operand_kernel(stream, acc_base: int, n: int, operand: int):
    """One micro-op walking n accumulator entries from acc_base, every one reading `operand`."""
    def build(k):
        k.loop_begin(n, dst_factor=1, src_factor=0)
        k.push(acc_base, operand)
        k.loop_end()
    return stream.kernel(("conv.operand", acc_base, n, operand), build)


def emit_requant(stream, kernel, requant: Requant, operand_kernel=None) -> None:
    """Scale, round, shift, then clamp every accumulator entry the kernel walks (a fixed-point
    requantization: SCALE, then the clamp): one REQUANT pass
    when operand_kernel is given and the requantization fits it (operand_kernel() records the same
    walk reading an entry set by set_requant_operand; called only then, so no unused micro-ops
    land in DRAM), else ALU ADD (the half), SHR, then CLIP for a symmetric range, CLAMP for an int8
    one, MIN+MAX otherwise."""
    if requant.fixed_point:  # SCALE (register operand) rounds and shifts; the clamp follows
        if operand_kernel is None or requant_operand(requant, stream.cfg.acc_width) is None:
            raise TilingError(f"fixed-point requantization (multiplier {requant.mul}, shift {requant.shift}) needs "
                              f"SCALE's register operand, a 30-bit accumulator lane (acc_width "
                              f"{stream.cfg.acc_width})")
        stream.push_alu(operand_kernel(), AluOp.SCALE)
        requant = Requant(0, requant.lo, requant.hi, zero_point=requant.zero_point)
    elif (operand_kernel is not None and not requant.zero_point
          and requant_operand(requant, stream.cfg.acc_width) is not None):
        stream.push_alu(operand_kernel(), AluOp.REQUANT)
        return
    if requant.round and requant.shift > 0:
        if requant.shift > 15:
            raise TilingError(f"rounding for shift {requant.shift} needs an immediate 2^{requant.shift - 1} "
                              f"beyond the 16-bit ALU immediate")
        stream.push_alu(kernel, AluOp.ADD, 1 << (requant.shift - 1))
    if requant.shift:
        stream.push_alu(kernel, AluOp.SHR, requant.shift)
    if requant.zero_point:   # an asymmetric output (a QDQ model's): its zero point, then the clamp
        stream.push_alu(kernel, AluOp.ADD, requant.zero_point)
    if requant.lo == -requant.hi:
        stream.push_alu(kernel, AluOp.CLIP, requant.hi)
    elif -128 <= requant.lo <= requant.hi <= 127:  # both bounds in one pass: CLAMP's imm holds them as bytes
        stream.push_alu(kernel, AluOp.CLAMP, operands.clamp_immediate(requant.lo, requant.hi))
    else:
        stream.push_alu(kernel, AluOp.MIN, requant.hi)
        stream.push_alu(kernel, AluOp.MAX, requant.lo)
