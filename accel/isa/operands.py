"""Operand packing of the tensor ALU: how each op's immediate or register lane value is laid out.

AluOp's docstring defines what each op computes; this module is the one place that turns the
parameters a compiler has (a shift, a clamp range, a fixed-point multiplier) into the bits an
instruction or an accumulator lane carries, and back (for the simulators). Each encoder checks
its ranges and raises OperandError naming the operand, its value and the allowed range.

    immediate (16-bit, signed): ADD/MIN/MAX/MUL/CLIP/MOV value; SHR shift; CLAMP lo | hi << 8;
                                FLUSH shift | round << 5 | lo_zero << 6 | hi << 7 | symmetric << 15
    register lane (acc_width):  REQUANT lo | hi << 8 | shift << 16 | round << 21   (acc_width >= 22)
                                SCALE   mul | shift << 24                           (acc_width >= 30)
"""
from __future__ import annotations

import numpy as np

from .errors import OperandError
from .widths import ALU_IMM_BITS

IMM_MIN, IMM_MAX = -(1 << (ALU_IMM_BITS - 1)), (1 << (ALU_IMM_BITS - 1)) - 1
#: accumulator widths the register operands need: REQUANT's round bit is bit 21, SCALE's shift ends at bit 29
REQUANT_MIN_ACC_WIDTH, SCALE_MIN_ACC_WIDTH = 22, 30
SCALE_MUL_BITS, SCALE_SHIFT_BITS = 24, 6                     # SCALE lane: mul | shift << 24
REQUANT_SHIFT_LSB, REQUANT_SHIFT_BITS, REQUANT_ROUND_BIT = 16, 5, 21   # REQUANT lane, above lo | hi << 8


def _check(what: str, v, lo: int, hi: int) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise OperandError(f"{what}={v!r} is not an integer")
    v = int(v)
    if not lo <= v <= hi:
        raise OperandError(f"{what}={v} outside its range [{lo}, {hi}]")
    return v


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def alu_immediate(value, op: str = "ALU", name: str = "immediate") -> int:
    """A plain immediate (ADD, MIN, MAX, MUL, CLIP, MOV): a signed 16-bit value. op and name say
    how the error names it ("<op> <name>=<value> ...")."""
    return _check(f"{op} {name}", value, IMM_MIN, IMM_MAX)


def shr_immediate(shift, acc_width: int) -> int:
    """SHR's immediate: shifts right by `shift` (left when negative); the ALU reads the low
    log2(acc_width)+1 bits as signed, so shift must be in [-acc_width, acc_width - 1]."""
    return _check("SHR shift", shift, -acc_width, acc_width - 1)


def clamp_immediate(lo, hi) -> int:
    """CLAMP's immediate: min(max(x, lo), hi) with lo, hi signed bytes."""
    lo, hi = _check("CLAMP lo", lo, -128, 127), _check("CLAMP hi", hi, -128, 127)
    return _signed((hi & 0xFF) << 8 | (lo & 0xFF), 16)


def decode_clamp(b: int) -> tuple[int, int]:
    """(lo, hi) of a CLAMP immediate or REQUANT lane (its low 16 bits)."""
    return _signed(b & 0xFF, 8), _signed((b >> 8) & 0xFF, 8)


def flush_immediate(shift: int, hi: int, lo_zero: bool = False, round_half: bool = False,
                    symmetric: bool = False) -> int:
    """The (signed 16-bit) immediate of an ALU FLUSH or an EPILOGUE: shift 0..31, hi a signed byte,
    lo = 0 when lo_zero, else -hi when symmetric, else -hi - 1; round half up when round_half."""
    shift, hi = _check("FLUSH shift", shift, 0, 31), _check("FLUSH hi", hi, -128, 127)
    v = shift | int(bool(round_half)) << 5 | int(bool(lo_zero)) << 6 | (hi & 0xFF) << 7 | int(bool(symmetric)) << 15
    return _signed(v, 16)


def decode_flush(imm: int) -> tuple[int, int, int, int]:
    """(shift, rounding term, lo, hi) of a FLUSH immediate: the rounding term is 2^(shift-1) when
    round is set and shift > 0, else 0."""
    s, hi = imm & 31, _signed((imm >> 7) & 0xFF, 8)
    lo = 0 if (imm >> 6) & 1 else -hi if (imm >> 15) & 1 else -hi - 1
    return s, (1 << (s - 1)) if s > 0 and (imm >> 5) & 1 else 0, lo, hi


def requant_operand(shift, lo, hi, round_half: bool, acc_width: int) -> int:
    """REQUANT's register lane value: clamp((x + r) >> shift, lo, hi), r = 2^(shift-1) when round_half."""
    if acc_width < REQUANT_MIN_ACC_WIDTH:
        raise OperandError(f"REQUANT operand needs acc_width >= {REQUANT_MIN_ACC_WIDTH}, not {acc_width}")
    shift = _check("REQUANT shift", shift, 0, (1 << REQUANT_SHIFT_BITS) - 1)
    lo, hi = _check("REQUANT lo", lo, -128, 127), _check("REQUANT hi", hi, -128, 127)
    return int(bool(round_half)) << REQUANT_ROUND_BIT | shift << REQUANT_SHIFT_LSB | (hi & 0xFF) << 8 | (lo & 0xFF)


def decode_requant(b: int, acc_width: int) -> tuple[int, int, int, int]:
    """(shift, rounding term, lo, hi) of a REQUANT lane (shift and term 0 below 22-bit lanes)."""
    lo, hi = decode_clamp(b)
    if acc_width < REQUANT_MIN_ACC_WIDTH:
        return 0, 0, lo, hi
    s = (b >> REQUANT_SHIFT_LSB) & ((1 << REQUANT_SHIFT_BITS) - 1)
    return s, (1 << (s - 1)) if s > 0 and (b >> REQUANT_ROUND_BIT) & 1 else 0, lo, hi


def scale_operand(mul, shift, acc_width: int) -> int:
    """SCALE's register lane value: x * mul * 2^-shift rounded half up, saturated."""
    if acc_width < SCALE_MIN_ACC_WIDTH:
        raise OperandError(f"SCALE operand needs acc_width >= {SCALE_MIN_ACC_WIDTH}, not {acc_width}")
    mul = _check("SCALE multiplier", mul, 1, (1 << SCALE_MUL_BITS) - 1)
    shift = _check("SCALE shift", shift, 0, (1 << SCALE_SHIFT_BITS) - 1)
    return shift << SCALE_MUL_BITS | mul


def scale_form(mul, shift) -> tuple[int, int]:
    """(M, k) with M < 2^24 and M * 2^-k == mul * 2^-shift exactly, dropping mul's low zero bits
    (a product with M then rounds as one with mul); OperandError when there is no such form."""
    mul, shift = int(mul), int(shift)
    t = max(0, mul.bit_length() - SCALE_MUL_BITS)
    if mul <= 0 or mul & ((1 << t) - 1) or not 0 <= shift - t < 1 << SCALE_SHIFT_BITS:
        raise OperandError(f"multiplier {mul} with shift {shift} has no 24-bit SCALE form (multiplier in "
                           f"[1, 2^24) after dropping low zero bits, shift in [0, 63])")
    return mul >> t, shift - t


def decode_scale(b: int, acc_width: int) -> tuple[int, int]:
    """(mul, shift) of a SCALE lane, the lane read as an unsigned acc_width-bit value."""
    bu = b % (1 << acc_width)
    return bu & ((1 << SCALE_MUL_BITS) - 1), (bu >> SCALE_MUL_BITS) & ((1 << SCALE_SHIFT_BITS) - 1)


def channel_scale_operands(muls, shift: int, acc_width: int) -> np.ndarray:
    """Per-channel SCALE lane values (int32, one per channel) for multipliers muls[c] sharing `shift`."""
    out = []
    for c, m in enumerate(np.asarray(muls, np.int64).reshape(-1).tolist()):
        try:
            out.append(scale_operand(*scale_form(m, shift), acc_width))
        except OperandError as e:
            raise OperandError(f"channel {c}: {e}") from None
    return np.array(out, np.int32)


def lane_immediates(v: int) -> list[tuple[str, int]]:
    """ALU (op name, immediate) steps that set an accumulator lane to v (|v| < 2^31) from any
    value: MOV the high half, SHR -16 (a left shift), ADD the sign-extended low half."""
    v = _check("register operand", v, -(1 << 31), (1 << 31) - 1)
    low = _signed(v & 0xFFFF, 16)
    high = (v - low) >> 16
    if not IMM_MIN <= high <= IMM_MAX:    # v near 2^31: the high half with the carry of a negative low half
        raise OperandError(f"register operand={v} needs a high half {high} beyond the 16-bit immediate")
    return [("MOV", high), ("SHR", -16), ("ADD", low)]
