"""What the drivers share about a program as fetch sees it: the instructions it decodes (through
the first FINISH, or up to an undecodable word), and a fault reported by the hardware turned into
an error naming the instruction and, where the instruction alone shows it, the field at fault."""
from __future__ import annotations

import numpy as np

from accel.hw.params import ERROR_TEXT, ErrorCode, static_fault
from accel.isa import AccelConfig, Insn
from accel.isa.isa import INSN_BYTES, Load, MemType, Store, elem_bytes
from sim.errors import ExecError, ProgramFault, SimError
from sim.fsim import decode_fetched, label


def fetched_program(cfg: AccelConfig, dram: np.ndarray, insn_addr: int,
                    insn_count: int) -> tuple[list[Insn], ProgramFault | None]:
    """(instructions, the ILLEGAL_INSN fault of the word after them or None): sim.fsim.decode_fetched
    on the stream, which must lie inside DRAM."""
    if not isinstance(dram, np.ndarray) or dram.dtype != np.uint8 or dram.ndim != 1:
        raise SimError(f"DRAM must be a 1-D uint8 array, got {getattr(dram, 'dtype', type(dram).__name__)}")
    end = insn_addr + insn_count * INSN_BYTES
    if insn_addr < 0 or insn_count < 0 or end > dram.size:
        raise ExecError(f"instruction stream [{insn_addr:#x}, {end:#x}) lies outside the {dram.size}-byte DRAM")
    return decode_fetched(dram[insn_addr:end].tobytes(), cfg)


def name_fault(cfg: AccelConfig, insns: list[Insn], fault: ProgramFault, driver: str) -> ProgramFault:
    """The hardware's (code, index) as an error naming the instruction, e.g. "rtl: instruction 7
    (LOAD INP) faulted: SRAM_RANGE (on-chip buffer range exceeded): sram_base=250 + 1x10 entries
    exceeds the INP buffer depth 256"."""
    code, index = ErrorCode(fault.code), fault.index
    what = f"instruction {index}"
    why = ""
    if index < len(insns):
        what += f" ({label(insns[index])})"
        f = static_fault(insns[index], cfg)
        if f is not None and f[0] == code:
            why = f": {f[1]}"
    elif code == ErrorCode.NO_FINISH:
        what = f"the end of the program ({index} instructions)"
    return ProgramFault(code, index, f"{driver}: {what} faulted: {code.name} ({ERROR_TEXT[code]}){why}")


def dram_range_fault(cfg: AccelConfig, insns: list[Insn], dram_bytes: int, driver: str) -> ExecError | None:
    """The first LOAD/STORE whose transfer reaches past the DRAM, as the error fsim raises for it
    (the hardware only sees an AXI error response, without the instruction); None if none does."""
    for i, insn in enumerate(insns):
        if isinstance(insn, (Load, Store)) and insn.y_size and insn.x_size:
            eb = elem_bytes(cfg, insn.mem_type if isinstance(insn, Load) else MemType.OUT)
            last = (insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size) * eb
            if last > dram_bytes:
                return ExecError(f"{driver}: instruction {i} ({insn.opcode.name}): dram_base={insn.dram_base} "
                                 f"y_size={insn.y_size} x_size={insn.x_size} x_stride={insn.x_stride} reaches byte "
                                 f"{last:#x}, beyond the {dram_bytes:#x}-byte DRAM")
    return None
