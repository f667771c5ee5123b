"""The accelerator's instruction set: opcodes, instruction and micro-op formats, binary encode/decode.

Semantics follow VTA's published ISA (LOAD/STORE 2-D strided tile moves, GEMM/ALU over a
micro-op range inside two affine loops, FINISH); the bit layout is ours and every index width
derives from the AccelConfig. An instruction is one 128-bit little-endian word, fields packed
from bit 0 upward in the order `formats_for` lists them; bits above the last field are zero.

Dependency flags: each instruction belongs to one stage (load, compute, store). Before it runs
it pops a token from each neighbour queue named by pop_prev/pop_next; after it finishes it
pushes a token to the queues named by push_prev/push_next. The neighbours are
load <-> compute <-> store (load has no prev, store no next); accel.isa.deps routes each flag to
its queue. ALU operand layouts are in accel.isa.operands, blocked data layouts in accel.isa.layout.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from enum import IntEnum
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from .errors import EncodingError
from .operands import flush_immediate  # noqa: F401  (defined with the other ALU operands)
from .schema import describe
from .widths import (
    ALU_IMM_BITS,
    ALU_OPCODE_BITS,
    INSN_BITS,
    LOOP_ITER_BITS,
    MEM_TYPE_BITS,
    OPCODE_BITS,
    PAD_BITS,
    SIZE_BITS,
)

if TYPE_CHECKING:   # (config imports this module: the formats decide whether a config fits)
    from .config import AccelConfig

INSN_BYTES = INSN_BITS // 8
MAX_INSNS = 1 << 20
"""Most instructions one program may hold (16 MiB of code): the assembler and program files stop
there (docs/limits.md), so no input makes the kit build an unbounded instruction list."""


class Opcode(IntEnum):
    LOAD = 0
    STORE = 1
    GEMM = 2
    ALU = 3
    FINISH = 4
    EPILOGUE = 5


class MemType(IntEnum):
    """On-chip buffer named by LOAD/STORE. STORE always reads OUT; LOAD writes the others."""
    UOP = 0
    WGT = 1
    INP = 2
    ACC = 3
    OUT = 4


class AluOp(IntEnum):
    """Tensor ALU operations: dst = op(dst, b), b = acc[src] or the immediate sign-extended.

    All arithmetic is two's complement in acc_width bits (results wrap):
    MIN/MAX: min/max(dst, b). ADD: dst + b. MUL: low acc_width bits of dst * b.
    SHR: s = b's low log2(acc_width)+1 bits read as signed; s >= 0 shifts dst right
    arithmetically by s, s < 0 shifts it left by -s (zeros in). CLIP: min(max(dst, -b), b),
    -b wrapped to acc_width. MOV: b. CLAMP: min(max(dst, lo), hi) with lo = b[7:0] and
    hi = b[15:8] read as signed bytes: the two-sided int8 clamp (relu + saturation) in one pass.
    REQUANT: CLAMP((dst + r) >> s) with s = b[20:16] and r = 2^(s-1) if b[21] and s > 0 else 0
    (the sum wraps like ADD; s = r = 0 when acc_width < 22): a requantization epilogue (round,
    shift, relu, saturation) in one pass; its operand needs 22 bits, so it reads a register (an
    accumulator entry holding it in every lane), not the 16-bit immediate.
    SCALE: (dst * M + r) >> k with M = b[23:0] (unsigned), k = b[29:24], r = 2^(k-1) if k > 0,
    the product and sum exact (64 bits), the result saturated to acc_width (not wrapped): a
    fixed-point multiply by M * 2^-k, rounded half up, for scales that are not powers of two
    (b is read as an unsigned acc_width-bit value, so narrower accumulators see k = 0); it reads a
    register operand like REQUANT.
    FLUSH: the end of a sum and the start of the next in one pass: out[dst] = the CLAMP of
    (dst + r) >> s as REQUANT computes it, with its parameters in the immediate (s = imm[4:0],
    r = 2^(s-1) if imm[5] and s > 0, hi = imm[14:7] as a signed byte, lo = 0 if imm[6], else -hi
    if imm[15] (the symmetric int8 range), else -hi - 1; the sum wraps like ADD, the shift is
    arithmetic), while acc[dst] = acc[src], whatever use_imm says (the next sum's seed: a bias).
    Its output buffer entry is that requantized value
    (narrowed), not the narrowed accumulator as for every other op. flush_immediate encodes it.
    """
    MIN = 0
    MAX = 1
    ADD = 2
    SHR = 3
    MUL = 4
    CLIP = 5
    MOV = 6
    CLAMP = 7
    REQUANT = 8
    SCALE = 9
    FLUSH = 10


class Stage(IntEnum):
    LOAD = 0
    COMPUTE = 1
    STORE = 2


DEP_FLAGS = ("pop_prev", "pop_next", "push_prev", "push_next")


@dataclass(frozen=True, kw_only=True)
class Insn:
    """Base of the instruction kinds: the four dependency flags every instruction carries."""
    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False

    opcode: ClassVar[Opcode]

    @property
    def stage(self) -> Stage:
        raise NotImplementedError

    def with_deps(self, **flags) -> "Insn":
        return replace(self, **flags)

    def field_values(self, what: str | None = None) -> dict[str, int]:
        """Every field as an int; a value that is not an integer (None, a float, a string: the
        dataclass does not check) raises EncodingError naming `what` and the field."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, np.integer)):
                raise EncodingError(f"{what or self.opcode.name + ' instruction'}: field {f.name}={describe(v)} "
                                    f"is not an integer")
            out[f.name] = int(v)
        return out


@dataclass(frozen=True, kw_only=True)
class MemInsn(Insn):
    """LOAD/STORE: a 2-D tile of y_size rows x x_size entries, DRAM rows x_stride entries apart.

    Addresses count entries of the buffer's type: DRAM byte address = dram_base * entry bytes.
    LOAD writes (y_pad0 + y_size + y_pad1) x (x_pad0 + x_size + x_pad1) entries starting at
    sram_base, row-major, zero in the padding. STORE reads y_size x x_size entries (no padding).
    """
    mem_type: MemType = MemType.INP
    sram_base: int = 0
    dram_base: int = 0
    y_size: int = 0
    x_size: int = 0
    x_stride: int = 0
    y_pad0: int = 0
    y_pad1: int = 0
    x_pad0: int = 0
    x_pad1: int = 0


@dataclass(frozen=True, kw_only=True)
class Load(MemInsn):
    opcode: ClassVar[Opcode] = Opcode.LOAD

    @property
    def stage(self) -> Stage:
        # Input and weight tiles are the load stage's; micro-ops and accumulator tiles are
        # loaded by compute, which owns those buffers (as in VTA).
        return Stage.LOAD if self.mem_type in (MemType.INP, MemType.WGT) else Stage.COMPUTE


@dataclass(frozen=True, kw_only=True)
class Store(MemInsn):
    opcode: ClassVar[Opcode] = Opcode.STORE
    mem_type: MemType = MemType.OUT

    @property
    def stage(self) -> Stage:
        return Stage.STORE


@dataclass(frozen=True, kw_only=True)
class LoopInsn(Insn):
    """GEMM/ALU: for i0 < iter_out, i1 < iter_in, u in [uop_bgn, uop_end):
    dst = uop.acc + i0*dst_factor_out + i1*dst_factor_in, likewise src and (GEMM) wgt."""
    uop_bgn: int = 0
    uop_end: int = 0
    iter_out: int = 1
    iter_in: int = 1
    dst_factor_out: int = 0
    dst_factor_in: int = 0
    src_factor_out: int = 0
    src_factor_in: int = 0

    @property
    def stage(self) -> Stage:
        return Stage.COMPUTE


@dataclass(frozen=True, kw_only=True)
class Gemm(LoopInsn):
    """acc[dst] += inp[src] @ wgt[wgt].T (or acc[dst] = 0 when reset); out[dst] = narrow(acc[dst]).

    flush: the last micro-op of each pass over [uop_bgn, uop_end) ends its destination's sum, with
    the parameters the latest EPILOGUE set: out[dst] = the FLUSH requantization (AluOp.FLUSH) of the
    value it computes, and acc[dst] = acc[seed], seed = seed_base + i0*seed_factor_out +
    i1*seed_factor_in, read before this micro-op writes (the next sum's bias); with the EPILOGUE's
    to_acc, acc[dst] = that requantized value instead (for a later GEMM to add to it, as a fused
    residual does). The requantization then costs no pass of its own: it rides on the GEMM's
    write-back."""
    opcode: ClassVar[Opcode] = Opcode.GEMM
    reset: bool = False
    wgt_factor_out: int = 0
    wgt_factor_in: int = 0
    flush: bool = False


@dataclass(frozen=True, kw_only=True)
class Alu(LoopInsn):
    """acc[dst] = op(acc[dst], acc[src] or imm); out[dst] = narrow(acc[dst])."""
    opcode: ClassVar[Opcode] = Opcode.ALU
    alu_op: AluOp = AluOp.ADD
    use_imm: bool = False
    imm: int = 0


@dataclass(frozen=True, kw_only=True)
class Epilogue(Insn):
    """Sets the compute stage's epilogue registers that a flushing GEMM uses (Gemm.flush): imm, the
    FLUSH immediate (flush_immediate); seed_base, seed_factor_out, seed_factor_in, the affine
    accumulator index of each pass's seed; to_acc, the requantized sum goes to the accumulator
    instead of the seed. They hold until the next EPILOGUE (zero after reset), like Gemmini's
    configuration instructions; the instruction itself takes one cycle."""
    opcode: ClassVar[Opcode] = Opcode.EPILOGUE
    imm: int = 0
    seed_base: int = 0
    seed_factor_out: int = 0
    seed_factor_in: int = 0
    to_acc: bool = False

    @property
    def stage(self) -> Stage:
        return Stage.COMPUTE


@dataclass(frozen=True, kw_only=True)
class Finish(Insn):
    """Ends the program (compute stage); the accelerator raises done."""
    opcode: ClassVar[Opcode] = Opcode.FINISH

    @property
    def stage(self) -> Stage:
        return Stage.COMPUTE


INSN_CLASSES: dict[Opcode, type[Insn]] = {Opcode.LOAD: Load, Opcode.STORE: Store, Opcode.GEMM: Gemm,
                                          Opcode.ALU: Alu, Opcode.FINISH: Finish, Opcode.EPILOGUE: Epilogue}
SIGNED_FIELDS = frozenset({"imm"})


def formats_for(cfg: AccelConfig) -> dict[str, list[tuple[str, int]]]:
    """Field (name, width) lists of each instruction format, LSB first; opcode is always first."""
    head = [("opcode", OPCODE_BITS)] + [(f, 1) for f in DEP_FLAGS]
    mem = head + [("mem_type", MEM_TYPE_BITS), ("sram_base", cfg.sram_idx_bits),
                  ("dram_base", cfg.dram_addr_width), ("y_size", SIZE_BITS), ("x_size", SIZE_BITS),
                  ("x_stride", SIZE_BITS), ("y_pad0", PAD_BITS), ("y_pad1", PAD_BITS),
                  ("x_pad0", PAD_BITS), ("x_pad1", PAD_BITS)]
    loop = [("uop_bgn", cfg.uop_idx_bits), ("uop_end", cfg.uop_idx_bits + 1),
            ("iter_out", LOOP_ITER_BITS), ("iter_in", LOOP_ITER_BITS),
            ("dst_factor_out", cfg.acc_idx_bits), ("dst_factor_in", cfg.acc_idx_bits)]
    gemm = head + [("reset", 1)] + loop + [
        ("src_factor_out", cfg.inp_idx_bits), ("src_factor_in", cfg.inp_idx_bits),
        ("wgt_factor_out", cfg.wgt_idx_bits), ("wgt_factor_in", cfg.wgt_idx_bits), ("flush", 1)]
    alu = head + loop + [("src_factor_out", cfg.acc_idx_bits), ("src_factor_in", cfg.acc_idx_bits),
                         ("alu_op", ALU_OPCODE_BITS), ("use_imm", 1), ("imm", ALU_IMM_BITS)]
    epilogue = head + [("imm", ALU_IMM_BITS), ("seed_base", cfg.acc_idx_bits),
                       ("seed_factor_out", cfg.acc_idx_bits), ("seed_factor_in", cfg.acc_idx_bits), ("to_acc", 1)]
    return {"LOAD": mem, "STORE": mem, "GEMM": gemm, "ALU": alu, "FINISH": head, "EPILOGUE": epilogue}


def uop_format(cfg: AccelConfig) -> list[tuple[str, int]]:
    """Micro-op fields, LSB first, in a cfg.uop_bits word. src is an input index for GEMM and
    an accumulator index for ALU."""
    return [("acc", cfg.acc_idx_bits), ("src", cfg.src_idx_bits), ("wgt", cfg.wgt_idx_bits)]


@dataclass(frozen=True)
class Uop:
    acc: int = 0
    src: int = 0
    wgt: int = 0


# ---- encode / decode ------------------------------------------------------------------------
_FORMAT_CACHE: dict[AccelConfig, dict[str, list[tuple[str, int]]]] = {}


def _formats(cfg: AccelConfig):
    f = _FORMAT_CACHE.get(cfg)
    if f is None:
        f = _FORMAT_CACHE[cfg] = formats_for(cfg)
    return f


def _pack(values: dict[str, int], fmt: list[tuple[str, int]], what: str) -> int:
    word, pos = 0, 0
    for name, width in fmt:
        v = int(values.get(name, 0))
        if name in SIGNED_FIELDS:
            lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
            if not lo <= v <= hi:
                raise EncodingError(f"{what}: field {name}={v} outside the signed {width}-bit range [{lo}, {hi}]")
            v &= (1 << width) - 1
        elif not 0 <= v < (1 << width):
            raise EncodingError(f"{what}: field {name}={v} outside the {width}-bit range [0, {(1 << width) - 1}]")
        word |= v << pos
        pos += width
    return word


def encode_insn(insn: Insn, cfg: AccelConfig, index: int | None = None) -> int:
    """Instruction -> 128-bit integer. Raises EncodingError naming the field that does not fit."""
    what = f"{insn.opcode.name} instruction" + (f" {index}" if index is not None else "")
    values = insn.field_values(what)
    values["opcode"] = int(insn.opcode)
    return _pack(values, _formats(cfg)[insn.opcode.name], what)


def decode_insn(word: int, cfg: AccelConfig, index: int | None = None) -> Insn:
    """128-bit integer -> instruction; the exact inverse of encode_insn."""
    op = word & ((1 << OPCODE_BITS) - 1)
    dec = _decoders(cfg).get(op)
    if dec is None:
        raise EncodingError(f"{_where(index)}: unknown opcode {op} (opcodes are "
                            f"{', '.join(f'{o.name}={o.value}' for o in Opcode)})")
    cls, used, plain, signed, flags, enums = dec
    if word >> used:
        raise EncodingError(f"{_where(index)}: {cls.opcode.name} has non-zero bits above bit {used - 1}")
    values = {name: (word >> pos) & mask for name, pos, mask in plain}
    for name, pos, width in signed:
        v = (word >> pos) & ((1 << width) - 1)
        values[name] = v - (1 << width) if v >> (width - 1) else v
    for name, pos in flags:
        values[name] = bool((word >> pos) & 1)
    for name, pos, mask, table in enums:
        v = (word >> pos) & mask
        if v not in table:
            enum = type(next(iter(table.values())))
            raise EncodingError(f"{_where(index)}: {cls.opcode.name} field {name}={v} is not one of "
                                f"{', '.join(f'{e.name}={e.value}' for e in enum)}")
        values[name] = table[v]
    insn = object.__new__(cls)      # every field is in `values` (checked in _decoders): the frozen
    insn.__dict__.update(values)    # dataclass's __init__ would only set them one by one, 3x slower
    return insn


def _where(index: int | None) -> str:
    return f"instruction {index}" if index is not None else "instruction"


@functools.lru_cache(maxsize=None)
def _decoders(cfg: AccelConfig) -> dict[int, tuple]:
    """Per opcode value, its field layout prepared for decode_insn: (class, bits used, plain fields
    (name, shift, mask), signed fields (name, shift, width), one-bit flags (name, shift), enum fields
    (name, shift, mask, value -> member)).
    Decoding is on every simulator's first run of a program (a network has thousands of instructions)."""
    bools = {"reset", "use_imm", "flush", "to_acc", *DEP_FLAGS}
    enums = {"mem_type": MemType, "alu_op": AluOp}
    out = {}
    for opcode in Opcode:
        plain, signed, flags, enum_fields, pos = [], [], [], [], 0
        for name, width in _formats(cfg)[opcode.name]:
            if name in SIGNED_FIELDS:
                signed.append((name, pos, width))
            elif name in bools:
                flags.append((name, pos))
            elif name in enums:
                enum_fields.append((name, pos, (1 << width) - 1, {int(e): e for e in enums[name]}))
            elif name != "opcode":
                plain.append((name, pos, (1 << width) - 1))
            pos += width
        cls = INSN_CLASSES[opcode]
        named = {f[0] for group in (plain, signed, flags, enum_fields) for f in group}
        assert named == {f.name for f in fields(cls)}, f"{opcode.name}: format and class fields differ"
        out[int(opcode)] = (cls, pos, tuple(plain), tuple(signed), tuple(flags),
                            tuple(enum_fields))
    return out


def encode_program(insns: list[Insn], cfg: AccelConfig) -> np.ndarray:
    """Instructions -> uint8 array of shape (n, 16): the bytes placed in DRAM."""
    out = np.zeros((len(insns), INSN_BYTES), dtype=np.uint8)
    for i, insn in enumerate(insns):
        out[i] = np.frombuffer(encode_insn(insn, cfg, i).to_bytes(INSN_BYTES, "little"), dtype=np.uint8)
    return out


def decode_program(data: bytes | np.ndarray, cfg: AccelConfig) -> list[Insn]:
    raw = bytes(np.asarray(data, dtype=np.uint8).tobytes()) if not isinstance(data, bytes) else data
    if len(raw) % INSN_BYTES:
        raise EncodingError(f"instruction stream of {len(raw)} bytes is not a multiple of {INSN_BYTES}")
    return list(_decode_cached(raw, cfg))


@functools.lru_cache(maxsize=256)
def _decode_cached(raw: bytes, cfg: AccelConfig) -> tuple[Insn, ...]:
    """Simulators decode the same program on every run; instructions are immutable, so share them.
    A network runs one program per accelerator layer, in order, so the cache holds a whole network's
    (MobileNetV2 has 34: with room for 32, every run decoded all of them again)."""
    return tuple(decode_insn(int.from_bytes(raw[i:i + INSN_BYTES], "little"), cfg, i // INSN_BYTES)
                 for i in range(0, len(raw), INSN_BYTES))


def encode_uops(uops: list[Uop] | np.ndarray, cfg: AccelConfig) -> np.ndarray:
    """Micro-ops (list of Uop or an (n, 3) int array of acc, src, wgt) -> uint8 bytes for DRAM."""
    try:
        rows = [(u.acc, u.src, u.wgt) for u in uops] if isinstance(uops, list) else uops
        arr = np.asarray(rows)
        if arr.size and arr.dtype.kind not in "iub":
            raise TypeError(f"micro-op fields must be integers, not {arr.dtype}")
        arr = arr.astype(np.int64, copy=False).reshape(-1, 3)
    except (TypeError, ValueError, OverflowError, AttributeError) as e:
        raise EncodingError(f"micro-ops: {e}") from None
    word = np.zeros(len(arr), dtype=np.uint64)
    pos = 0
    for col, (name, width) in enumerate(uop_format(cfg)):
        v = arr[:, col]
        bad = (v < 0) | (v >= (1 << width))
        if bad.any():
            i = int(np.argmax(bad))
            raise EncodingError(f"micro-op {i}: field {name}={int(v[i])} outside the {width}-bit range "
                                f"[0, {(1 << width) - 1}]")
        word |= v.astype(np.uint64) << np.uint64(pos)
        pos += width
    dtype = np.dtype("<u4") if cfg.uop_bits == 32 else np.dtype("<u8")
    return word.astype(dtype).view(np.uint8)


def decode_uops(data: bytes | np.ndarray, cfg: AccelConfig) -> np.ndarray:
    """uint8 bytes -> (n, 3) int64 array of (acc, src, wgt); the inverse of encode_uops."""
    raw = np.frombuffer(bytes(data), dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else np.asarray(data, np.uint8)
    if raw.size % cfg.uop_elem_bytes:
        raise EncodingError(f"micro-op data of {raw.size} bytes is not a multiple of {cfg.uop_elem_bytes}")
    shifts, masks = _uop_fields(cfg.uop_bits, tuple(width for _, width in uop_format(cfg)))
    # one shift and one mask over all fields (three passes: a micro-op load is a handful of words,
    # so numpy's per-call cost is what counts); 32-bit words widen to int64 first, 64-bit ones stay
    # unsigned until masked to their (narrower) fields
    word = raw.view("<u4").astype(np.int64) if cfg.uop_bits == 32 else raw.view("<u8")
    out = (word[:, None] >> shifts) & masks
    return out if out.dtype == np.int64 else out.astype(np.int64)


@functools.lru_cache(maxsize=None)
def _uop_fields(uop_bits: int, widths: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Shift and mask of each micro-op field (uop_format's order), in the word's integer type."""
    dt = np.int64 if uop_bits == 32 else np.uint64
    pos = np.cumsum((0,) + widths[:-1])
    return pos.astype(dt), ((np.ones(len(widths), np.uint64) << np.array(widths, np.uint64)) - np.uint64(1)).astype(dt)


def elem_bytes(cfg: AccelConfig, mem: MemType) -> int:
    """Bytes of one entry of the named buffer (the unit of LOAD/STORE addresses)."""
    return {MemType.UOP: cfg.uop_elem_bytes, MemType.WGT: cfg.wgt_elem_bytes, MemType.INP: cfg.inp_elem_bytes,
            MemType.ACC: cfg.acc_elem_bytes, MemType.OUT: cfg.out_elem_bytes}[mem]


def buffer_depth(cfg: AccelConfig, mem: MemType) -> int:
    """Entries of the named on-chip buffer."""
    return {MemType.UOP: cfg.uop_depth, MemType.WGT: cfg.wgt_depth, MemType.INP: cfg.inp_depth,
            MemType.ACC: cfg.acc_depth, MemType.OUT: cfg.out_depth}[mem]
