"""Program files: instructions, the DRAM image they run on, and the config they were built for.

Layout (little endian): magic b"ACCPROG\\0", u32 format version, u32 header length, a UTF-8
JSON header {config, insn_addr, insn_count, dram_bytes, segments: [{addr, size}], symbols},
then the encoded instructions (16 bytes each), then each segment's bytes in header order.
Loading under a different config, or a file of another version, fails with a clear error. A file
is untrusted: every header field's type and range is checked (accel.isa.schema), regions must lie
inside the DRAM and not overlap, sizes must match the bytes present, and the maxima below bound
what a file can make the kit allocate; a program is checked the same way before it is written.
Saving writes a temporary file and renames it, so a failed save leaves nothing half-written.
"""
from __future__ import annotations

import io
import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .config import AccelConfig
from .errors import ConfigError, EncodingError, ProgramFormatError
from .files import write_atomic
from .isa import INSN_BYTES, MAX_INSNS, Insn, decode_program, encode_program
from .schema import MAX_JSON_BYTES, Fields, check_int, describe, parse_json

MAGIC = b"ACCPROG\0"
FORMAT_VERSION = 1

# Documented maxima (docs/limits.md), enforced when a program is read or written, so no file can
# make the kit allocate without bound: the DRAM image is allocated whole.
MAX_DRAM_BYTES = 1 << 30        # a program's DRAM image
MAX_SEGMENTS = 1 << 16
MAX_SYMBOLS = 1 << 16
MAX_SYMBOL_RANK = 32
SYMBOL_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                 "float16", "float32", "float64")
_HEADER_KEYS = frozenset({"config", "insn_addr", "insn_count", "dram_bytes", "segments"})


@dataclass
class Symbol:
    """A named DRAM region, so tools can show results by name (e.g. a matrix and its shape)."""
    addr: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class Program:
    config: AccelConfig
    insns: list[Insn]
    insn_addr: int = 0
    dram_bytes: int = 1 << 24
    segments: list[tuple[int, bytes]] = field(default_factory=list)
    symbols: dict[str, Symbol] = field(default_factory=dict)

    def dram_image(self) -> np.ndarray:
        """The initial DRAM: segments written, instructions placed at insn_addr."""
        self.validate()     # every region inside dram_bytes, dram_bytes bounded: before allocating
        dram = np.zeros(self.dram_bytes, dtype=np.uint8)
        for addr, data in self.segments:
            dram[addr:addr + len(data)] = np.frombuffer(data, dtype=np.uint8)
        code = encode_program(self.insns, self.config).reshape(-1)
        dram[self.insn_addr:self.insn_addr + code.size] = code
        return dram

    def read_symbol(self, dram: np.ndarray, name: str) -> np.ndarray:
        try:
            s = self.symbols[name]
        except KeyError:
            raise ProgramFormatError(f"program has no symbol {name!r}; symbols are "
                                     f"{', '.join(self.symbols) or '(none)'}") from None
        return dram[s.addr:s.addr + s.nbytes].view(s.dtype).reshape(s.shape)

    # ---- validation -----------------------------------------------------------------------
    def header(self) -> dict:
        """The file header: plain JSON values (numpy integers converted, anything else kept as is
        for validate() to name)."""
        return {
            "config": self.config.to_dict(), "insn_addr": _plain(self.insn_addr), "insn_count": len(self.insns),
            "dram_bytes": _plain(self.dram_bytes),
            "segments": [{"addr": _plain(a), "size": len(d)} for a, d in self.segments],
            "symbols": {k: {"addr": _plain(s.addr), "dtype": s.dtype,
                            "shape": [_plain(d) for d in s.shape] if isinstance(s.shape, (tuple, list)) else s.shape}
                        for k, s in self.symbols.items()},
        }

    def validate(self, source: str = "program") -> None:
        """Raise ProgramFormatError naming the first field outside its range: the limits a loaded
        file must meet hold for a program built in memory too."""
        if not isinstance(self.config, AccelConfig):
            raise ProgramFormatError(f"{source}: config is a {type(self.config).__name__}, not an AccelConfig")
        h = self.header()
        del h["config"]
        _check_layout(Fields(h, f"{source}: header", ProgramFormatError), self.config)

    # ---- file I/O -------------------------------------------------------------------------
    def to_bytes(self, source: str = "program") -> bytes:
        self.validate(source)
        hj = json.dumps(self.header()).encode()
        parts = [MAGIC, struct.pack("<II", FORMAT_VERSION, len(hj)), hj,
                 encode_program(self.insns, self.config).tobytes()]
        parts += [bytes(d) for _, d in self.segments]
        return b"".join(parts)

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_bytes(str(path)))  # encoded first: an encoding error leaves no file

    @classmethod
    def from_bytes(cls, data: bytes, config: AccelConfig | None = None, source: str = "program") -> "Program":
        """Parse and check a program file's bytes: every header field's type and range, the regions
        inside the DRAM and apart, the sizes matching the bytes present, every instruction decodable."""
        return cls._read(io.BytesIO(bytes(data)), config, source)

    @classmethod
    def load(cls, path: str | Path, config: AccelConfig | None = None) -> "Program":
        try:
            with open(path, "rb") as f:
                return cls._read(f, config, str(path))
        except OSError as e:
            raise ProgramFormatError(f"cannot read {path}: {e.strerror or e}") from None

    @classmethod
    def _read(cls, f: BinaryIO, config: AccelConfig | None, source: str) -> "Program":
        """Read the file piece by piece, each piece's size checked before it is read: a device or
        FIFO named as a program never makes the kit read more than a valid header accounts for."""
        head = f.read(16)
        if len(head) < 16 or head[:8] != MAGIC:
            raise ProgramFormatError(f"{source}: not a program file (bad magic)")
        version, hlen = struct.unpack_from("<II", head, 8)
        if version != FORMAT_VERSION:
            raise ProgramFormatError(f"{source}: format version {version}, this kit reads version {FORMAT_VERSION}")
        if hlen > MAX_JSON_BYTES:
            raise ProgramFormatError(f"{source}: header of {hlen} bytes, more than the {MAX_JSON_BYTES} allowed")
        raw = f.read(hlen)
        if len(raw) < hlen:
            raise ProgramFormatError(f"{source}: truncated header ({hlen} bytes announced, {len(raw)} present)")
        where = f"{source}: header"
        h = Fields(parse_json(raw, where, ProgramFormatError), where, ProgramFormatError)
        h.require_keys(_HEADER_KEYS, {"symbols"})
        try:
            file_cfg = AccelConfig.from_dict(h.get("config"))
        except ConfigError as e:
            raise ProgramFormatError(f"{where}.config: {e}") from None
        if config is not None and file_cfg != config:
            diff = {k: (v, getattr(config, k)) for k, v in file_cfg.to_dict().items() if getattr(config, k) != v}
            raise ProgramFormatError(
                f"{source}: built for another config; differing keys (file, wanted): "
                + ", ".join(f"{k}={a!r} vs {b!r}" for k, (a, b) in diff.items()))
        insn_addr, n, dram_bytes, seg_hdr, symbols = _check_layout(h, file_cfg)
        need = n * INSN_BYTES + sum(size for _, size in seg_hdr)
        body = f.read(need + 1)
        if len(body) < need:
            raise ProgramFormatError(f"{source}: truncated ({len(body)} bytes after the header, the "
                                     f"{n} instructions and {len(seg_hdr)} segment(s) need {need})")
        if len(body) > need:
            raise ProgramFormatError(f"{source}: unexpected bytes after the last segment (the header accounts "
                                     f"for {16 + hlen + need} bytes)")
        pos = n * INSN_BYTES
        segments = []
        for addr, size in seg_hdr:
            segments.append((addr, body[pos:pos + size]))
            pos += size
        try:
            insns = decode_program(body[:n * INSN_BYTES], file_cfg)
        except EncodingError as e:
            raise ProgramFormatError(f"{source}: {e}") from None
        return cls(file_cfg, insns, insn_addr, dram_bytes, segments, symbols)


def _plain(v):
    """numpy integers -> int (what a header holds); other values unchanged, for the check to name."""
    return int(v) if isinstance(v, np.integer) else v


def _check_layout(h: Fields, cfg: AccelConfig) -> tuple[int, int, int, list[tuple[int, int]], dict[str, Symbol]]:
    """Check a header's sizes and addresses (everything but its config) against the limits and
    each other: (insn_addr, insn_count, dram_bytes, [(addr, size)], symbols)."""
    dram = h.int("dram_bytes", 0, MAX_DRAM_BYTES)
    n = h.int("insn_count", 0, MAX_INSNS)
    insn_addr = h.int("insn_addr", 0, dram)
    if insn_addr % INSN_BYTES:
        h.fail("insn_addr", insn_addr, f"must be a multiple of {INSN_BYTES}")
    if insn_addr + n * INSN_BYTES > dram:
        h.fail("insn_addr", insn_addr, f"the {n} instructions end at byte {insn_addr + n * INSN_BYTES:#x}, "
                                       f"beyond dram_bytes={dram:#x}")
    regions = [(insn_addr, insn_addr + n * INSN_BYTES, "the instructions")] if n else []
    segments = []
    for i, seg in enumerate(h.list("segments", MAX_SEGMENTS)):
        s = Fields(seg, f"{h.where}.segments[{i}]", h.error)
        s.require_keys({"addr", "size"})
        addr = s.int("addr", 0, dram)
        size = s.int("size", 0, dram - addr)
        segments.append((addr, size))
        if size:
            regions.append((addr, addr + size, f"segments[{i}]"))
    regions.sort()
    for (a0, e0, w0), (a1, e1, w1) in zip(regions, regions[1:]):
        if a1 < e0:
            raise h.error(f"{h.where}: {w0} [{a0:#x}, {e0:#x}) overlaps {w1} [{a1:#x}, {e1:#x})")
    symbols = {}
    for name, sym in h.dict("symbols", MAX_SYMBOLS, {}).items():
        if (not isinstance(name, str) or not 1 <= len(name) <= 128 or not name.isprintable()
                or any(c.isspace() for c in name)):
            raise h.error(f"{h.where}.symbols: name {describe(name)} must be 1 to 128 printable characters "
                          f"without spaces")
        s = Fields(sym, f"{h.where}.symbols[{name!r}]", h.error)
        s.require_keys({"addr", "shape", "dtype"})
        dtype = s.str("dtype", 16, choices=SYMBOL_DTYPES)
        shape = tuple(check_int(d, f"{s.where}.shape[{j}]", 0, dram, h.error)
                      for j, d in enumerate(s.list("shape", MAX_SYMBOL_RANK)))
        addr = s.int("addr", 0, dram)
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if addr + nbytes > dram:
            s.fail("shape", list(shape), f"{nbytes} bytes of {dtype} at {addr:#x} end beyond dram_bytes={dram:#x}")
        symbols[name] = Symbol(addr, shape, dtype)
    return insn_addr, n, dram, segments, symbols
