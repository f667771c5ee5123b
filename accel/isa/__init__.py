"""The accelerator's configuration and ISA: the one source of every size and bit layout.

Depends on numpy only; nothing here imports another package of the kit.
"""
from .config import PRESETS, AccelConfig, preset, resolve_config
from .errors import AccelError, AsmError, ConfigError, EncodingError, LayoutError, OperandError, ProgramFormatError
from .isa import (DEP_FLAGS, INSN_BYTES, MAX_INSNS, Alu, AluOp, Epilogue, Finish, Gemm, Insn, Load, MemType, Opcode,
                  Stage, Store, Uop, buffer_depth, decode_insn, decode_program, decode_uops, elem_bytes, flush_immediate,
                  encode_insn, encode_program, encode_uops, formats_for, uop_format)
from .asm import assemble_file, assemble_text, disassemble, format_insn, parse_insn
from .program import Program, Symbol
from . import deps, layout, operands
from .deps import pop_flag, push_flag, token_queue
from .layout import pack_blocked, unpack_blocked

__all__ = [n for n in dir() if not n.startswith("_")]
