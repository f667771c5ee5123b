"""The accelerator's configuration and ISA: the one source of every size and bit layout.

Depends on numpy only; nothing here imports another package of the kit.
"""
from . import deps, layout, operands
from .asm import assemble_file, assemble_text, disassemble, format_insn, parse_insn
from .config import PRESETS, AccelConfig, preset, resolve_config
from .deps import pop_flag, push_flag, token_queue
from .errors import AccelError, AsmError, ConfigError, EncodingError, LayoutError, OperandError, ProgramFormatError
from .isa import (
                  DEP_FLAGS,
                  INSN_BYTES,
                  MAX_INSNS,
                  Alu,
                  AluOp,
                  Epilogue,
                  Finish,
                  Gemm,
                  Insn,
                  Load,
                  MemType,
                  Opcode,
                  Stage,
                  Store,
                  Uop,
                  buffer_depth,
                  decode_insn,
                  decode_program,
                  decode_uops,
                  elem_bytes,
                  encode_insn,
                  encode_program,
                  encode_uops,
                  flush_immediate,
                  formats_for,
                  uop_format,
)
from .layout import pack_blocked, unpack_blocked
from .program import Program, Symbol

__all__ = [n for n in dir() if not n.startswith("_")]
