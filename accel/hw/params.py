"""The RTL's contract with software beyond the ISA, free of Amaranth imports so that the
simulators and the runtime read one definition: the instruction buffer's depth (the timing model
mirrors it) and the error codes of the STATUS/ERROR registers with the checks behind them.

Errors (docs/hardware.md, "Errors"). Fetch checks each instruction before dispatching it
(static_fault: the word alone decides); compute checks every micro-op's indices as it issues it
(INDEX_RANGE). A static fault stops dispatch there and lets the instructions before it finish;
an INDEX_RANGE fault, or the watchdog, stops every stage. When more than one instruction faults,
the lowest index is reported: dispatch is in program order and compute runs in program order,
so the code and index do not depend on timing, and fsim, tsim and the RTL report the same.
"""
from __future__ import annotations

from enum import IntEnum

from accel.isa import AccelConfig, Alu, AluOp, Gemm, Insn, Load, MemType, Stage, Store, buffer_depth
from accel.isa.deps import dead_flags

CODE_BITS = 3         # ERROR code field
# ALU ops on the lanes' multiplier: TensorAlu issues them every other cycle (accel/hw/alu.py), the
# timing model times them so
MUL_OPS = frozenset((AluOp.MUL, AluOp.SCALE))
INDEX_BITS = 32       # instruction indices (INSN_COUNT is 32 bits)


class ErrorCode(IntEnum):
    """ERROR register codes (0: none)."""
    NONE = 0
    ILLEGAL_INSN = 1     # unknown opcode, mem_type or alu_op, or non-zero bits above the format
    BAD_FIELD = 2        # LOAD of OUT; STORE of another buffer or with padding; a token flag
                         # naming a neighbour the stage does not have; uop_bgn > uop_end
    SRAM_RANGE = 3       # a LOAD/STORE tile or a GEMM/ALU micro-op range beyond its on-chip buffer
    INDEX_RANGE = 4      # a GEMM/ALU micro-op's index (dst, src, wgt, flush seed) beyond its buffer
    NO_FINISH = 5        # INSN_COUNT instructions dispatched and none was FINISH
    WATCHDOG = 6         # no progress for WATCHDOG cycles


ERROR_TEXT = {
    ErrorCode.ILLEGAL_INSN: "illegal instruction",
    ErrorCode.BAD_FIELD: "field value the instruction cannot take",
    ErrorCode.SRAM_RANGE: "on-chip buffer range exceeded",
    ErrorCode.INDEX_RANGE: "micro-op index out of range",
    ErrorCode.NO_FINISH: "no FINISH among the instructions",
    ErrorCode.WATCHDOG: "watchdog: no progress",
}


def ibuf_depth(cfg: AccelConfig) -> int:
    """Entries of fetch's instruction buffer: cmd_queue_depth, but at least 3. Its DMA writes
    without back-pressure; a depth-2 Queue cannot take writes in consecutive cycles from empty
    (the head moves to the output register a cycle after its write, its inner slot still full),
    and a bus of 128 bits or more delivers one 16-byte instruction per cycle."""
    return max(cfg.cmd_queue_depth, 3)


def static_fault(insn: Insn, cfg: AccelConfig) -> tuple[ErrorCode, str] | None:
    """The fault fetch raises for a decoded instruction before dispatching it, with the reason,
    or None (what the RTL's fetch checks; ILLEGAL_INSN is decoding's)."""
    stage = insn.stage
    dead = dead_flags(stage)     # flags naming a neighbour the stage does not have
    if any(getattr(insn, f) for f in dead):
        side = "prev" if stage == Stage.LOAD else "next"
        what = "a load-stage LOAD" if stage == Stage.LOAD else "a STORE"
        return ErrorCode.BAD_FIELD, f"{'/'.join(dead)} set on {what} (the {stage.name.lower()} stage has no {side})"
    if isinstance(insn, Load):
        if insn.mem_type == MemType.OUT:
            return ErrorCode.BAD_FIELD, "field mem_type=OUT; LOAD writes UOP, WGT, INP or ACC"
        rows, cols = insn.y_pad0 + insn.y_size + insn.y_pad1, insn.x_pad0 + insn.x_size + insn.x_pad1
        depth = buffer_depth(cfg, insn.mem_type)
        if rows * cols and insn.sram_base + rows * cols > depth:
            return ErrorCode.SRAM_RANGE, (f"sram_base={insn.sram_base} + {rows}x{cols} entries exceeds the "
                                          f"{insn.mem_type.name} buffer depth {depth}")
    elif isinstance(insn, Store):
        if insn.mem_type != MemType.OUT:
            return ErrorCode.BAD_FIELD, f"field mem_type={insn.mem_type.name}; STORE reads OUT"
        if insn.y_pad0 or insn.y_pad1 or insn.x_pad0 or insn.x_pad1:
            return ErrorCode.BAD_FIELD, "padding fields must be zero on a STORE"
        n = insn.y_size * insn.x_size
        if n and insn.sram_base + n > cfg.out_depth:
            return ErrorCode.SRAM_RANGE, (f"sram_base={insn.sram_base} + {n} entries exceeds the OUT buffer "
                                          f"depth {cfg.out_depth}")
    elif isinstance(insn, (Gemm, Alu)):
        if insn.uop_bgn > insn.uop_end:
            return ErrorCode.BAD_FIELD, f"uop_bgn={insn.uop_bgn} > uop_end={insn.uop_end}"
        if insn.uop_end > cfg.uop_depth:
            return ErrorCode.SRAM_RANGE, (f"micro-op range [uop_bgn={insn.uop_bgn}, uop_end={insn.uop_end}) "
                                          f"outside [0, {cfg.uop_depth}]")
    return None
