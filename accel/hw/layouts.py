"""Bit layouts of instructions and micro-ops as Amaranth data layouts, derived from accel.isa.

The RTL never writes a field position by hand: every layout here is built from
`accel.isa.formats_for(cfg)` and `accel.isa.uop_format(cfg)`, so the hardware decodes exactly
what the encoder packs (fields LSB first, `imm` signed).
"""
from __future__ import annotations

from amaranth.hdl import signed, unsigned
from amaranth.lib import data
from amaranth.lib.memory import ReadPort

from accel.isa import AccelConfig, MemType, formats_for, uop_format
from accel.isa.isa import SIGNED_FIELDS


def _struct(fmt: list[tuple[str, int]]) -> data.StructLayout:
    return data.StructLayout({name: (signed(w) if name in SIGNED_FIELDS else unsigned(w)) for name, w in fmt})


def insn_layout(cfg: AccelConfig, kind: str) -> data.StructLayout:
    """Layout of one instruction format ("LOAD", "STORE", "GEMM", "ALU", "FINISH")."""
    return _struct(formats_for(cfg)[kind])


def uop_layout(cfg: AccelConfig) -> data.StructLayout:
    """Layout of a micro-op word (acc, src, wgt), cfg.uop_bits wide."""
    return _struct(uop_format(cfg))


def decode(cfg: AccelConfig, kind: str, word) -> data.View:
    """View a 128-bit instruction word through the format of `kind`."""
    layout = insn_layout(cfg, kind)
    return data.View(layout, word[:layout.size])


def mem_type_of(cfg: AccelConfig, word):
    """mem_type field of a LOAD/STORE word (same position in both formats)."""
    return decode(cfg, "LOAD", word).mem_type


def idx_bits(cfg: AccelConfig, mem: MemType) -> int:
    """Address bits of the named on-chip buffer (OUT mirrors ACC)."""
    return {MemType.UOP: cfg.uop_idx_bits, MemType.WGT: cfg.wgt_idx_bits, MemType.INP: cfg.inp_idx_bits,
            MemType.ACC: cfg.acc_idx_bits, MemType.OUT: cfg.acc_idx_bits}[mem]


def read_signature(addr_width: int, bits: int) -> ReadPort.Signature:
    return ReadPort.Signature(addr_width=addr_width, shape=unsigned(bits))


def lanes(value, count: int, width: int, sign: bool = True) -> list:
    """Split a packed entry into `count` elements of `width` bits, element 0 in the low bits."""
    return [value[i * width:(i + 1) * width].as_signed() if sign else value[i * width:(i + 1) * width]
            for i in range(count)]


__all__ = ["decode", "idx_bits", "insn_layout", "lanes", "mem_type_of", "read_signature", "uop_layout"]
