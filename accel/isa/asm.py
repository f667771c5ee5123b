"""Text assembly for the ISA: one instruction per line, `mnemonic [kind] key=value ... [flags]`.

    load inp sram_base=0 dram_base=0x40 y_size=2 x_size=4 x_stride=4 x_pad0=1 push_next
    gemm uop_bgn=0 uop_end=4 iter_out=2 dst_factor_out=4 reset pop_prev
    alu shr uop_bgn=4 uop_end=5 use_imm imm=8
    epilogue imm=645 seed_base=64 seed_factor_out=1
    gemm uop_bgn=5 uop_end=7 iter_in=16 dst_factor_in=1 src_factor_in=1 flush
    finish pop_next

Fields left out are zero (iter_out/iter_in: one); boolean fields are bare words. LOAD and ALU
name their kind first; STORE names one only when it is not `out` (what an executor rejects must
still disassemble to text that assembles back to the same word). `#` or `;`
starts a comment. disassemble() prints the canonical form, which assemble() reads back to the
same instructions, so text <-> binary round-trips.
"""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from .config import AccelConfig
from .errors import AsmError
from .schema import decode_text, describe, read_bounded

MAX_ASM_BYTES = 256 << 20
"""Largest assembly file read (2^20 instructions of about 100 characters, with comments)."""
from .isa import (
    DEP_FLAGS,
    INSN_CLASSES,
    MAX_INSNS,
    Alu,
    AluOp,
    Insn,
    Load,
    MemType,
    Opcode,
    Store,
    decode_program,
    encode_insn,
)

_BOOL_FIELDS = {"reset", "use_imm", "flush", "to_acc", *DEP_FLAGS}


def _kind_word(insn: Insn) -> str | None:
    if isinstance(insn, Load):
        return insn.mem_type.name.lower()
    if isinstance(insn, Store) and insn.mem_type != MemType.OUT:
        return insn.mem_type.name.lower()   # STORE reads OUT; any other type is written out to round-trip
    if isinstance(insn, Alu):
        return insn.alu_op.name.lower()
    return None


def format_insn(insn: Insn) -> str:
    """One instruction -> its canonical assembly line."""
    parts = [insn.opcode.name.lower()]
    kind = _kind_word(insn)
    if kind:
        parts.append(kind)
    defaults = {f.name: f.default for f in fields(insn)}
    for f in fields(insn):
        if f.name in ("mem_type", "alu_op") or f.name in _BOOL_FIELDS:
            continue
        v = getattr(insn, f.name)
        if v != defaults[f.name]:
            parts.append(f"{f.name}={int(v)}")
    for f in fields(insn):
        if f.name in _BOOL_FIELDS and getattr(insn, f.name):
            parts.append(f.name)
    return " ".join(parts)


def parse_insn(line: str, lineno: int = 1) -> Insn | None:
    """One assembly line -> instruction (None for blank or comment lines)."""
    text = line.split("#", 1)[0].split(";", 1)[0].strip()
    if not text:
        return None
    words = text.split()
    mnemonic = words[0].upper()
    try:
        opcode = Opcode[mnemonic]
    except KeyError:
        raise AsmError(f"line {lineno}: unknown mnemonic {describe(words[0])} (expected one of "
                       f"{', '.join(o.name.lower() for o in Opcode)})") from None
    cls = INSN_CLASSES[opcode]
    names = {f.name for f in fields(cls)}
    values: dict = {}
    rest = words[1:]
    if opcode == Opcode.LOAD or opcode == Opcode.ALU:
        enum, key = (MemType, "mem_type") if opcode == Opcode.LOAD else (AluOp, "alu_op")
        if not rest or "=" in rest[0] or (rest[0] in _BOOL_FIELDS and rest[0] in names):
            raise AsmError(f"line {lineno}: {words[0]} needs a kind first, one of "
                           f"{', '.join(e.name.lower() for e in enum)}")
        try:
            values[key] = enum[rest[0].upper()]
        except KeyError:
            raise AsmError(f"line {lineno}: unknown {words[0]} kind {describe(rest[0])} (expected one of "
                           f"{', '.join(e.name.lower() for e in enum)})") from None
        rest = rest[1:]
    elif opcode == Opcode.STORE and rest and rest[0].upper() in MemType.__members__:
        values["mem_type"] = MemType[rest[0].upper()]
        rest = rest[1:]
    for w in rest:
        if "=" in w:
            key, _, val = w.partition("=")
            if key not in names or key in _BOOL_FIELDS or key in ("mem_type", "alu_op"):
                raise AsmError(f"line {lineno}: {words[0]} has no field {describe(key)} "
                               f"(fields: {', '.join(sorted(names - _BOOL_FIELDS))})")
            try:
                values[key] = int(val, 0)
            except ValueError:
                raise AsmError(f"line {lineno}: field {key}={describe(val)} is not an integer") from None
        elif w in _BOOL_FIELDS and w in names:
            values[w] = True
        else:
            raise AsmError(f"line {lineno}: unexpected word {describe(w)} for {words[0]}")
    return cls(**values)


def assemble_text(text: str, cfg: AccelConfig | None = None) -> list[Insn]:
    """Assembly text -> instructions. With a config, every field is also checked to fit."""
    insns = []
    for lineno, line in enumerate(text.splitlines(), 1):
        insn = parse_insn(line, lineno)
        if insn is None:
            continue
        if len(insns) == MAX_INSNS:
            raise AsmError(f"line {lineno}: more than {MAX_INSNS} instructions, the most a program may hold")
        if cfg is not None:
            try:
                encode_insn(insn, cfg)
            except Exception as e:
                raise AsmError(f"line {lineno}: {e}") from None
        insns.append(insn)
    return insns


def assemble_file(path: str | Path, cfg: AccelConfig | None = None) -> list[Insn]:
    """An assembly file -> instructions; unreadable, oversized or non-UTF-8 files raise AsmError."""
    return assemble_text(decode_text(read_bounded(path, MAX_ASM_BYTES, str(path), AsmError), str(path), AsmError), cfg)


def disassemble(insns: list[Insn], numbered: bool = False) -> str:
    lines = [format_insn(i) for i in insns]
    if numbered:
        lines = [f"{n:5d}: {l}" for n, l in enumerate(lines)]
    return "\n".join(lines) + ("\n" if lines else "")


def disassemble_bytes(data: bytes, cfg: AccelConfig, numbered: bool = False) -> str:
    return disassemble(decode_program(data, cfg), numbered)


__all__ = ["format_insn", "parse_insn", "assemble_text", "assemble_file", "disassemble", "disassemble_bytes", "Store"]
