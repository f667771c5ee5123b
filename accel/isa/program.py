"""Program files: instructions, the DRAM image they run on, and the config they were built for.

Layout (little endian): magic b"ACCPROG\\0", u32 format version, u32 header length, a UTF-8
JSON header {config, insn_addr, insn_count, dram_bytes, segments: [{addr, size}], symbols},
then the encoded instructions (16 bytes each), then each segment's bytes in header order.
Loading under a different config, or a file of another version, fails with a clear error.
Saving writes a temporary file and renames it, so a failed save leaves nothing half-written.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import AccelConfig
from .errors import ConfigError, ProgramFormatError
from .files import write_atomic
from .isa import INSN_BYTES, Insn, decode_program, encode_program

MAGIC = b"ACCPROG\0"
FORMAT_VERSION = 1


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

    # ---- file I/O -------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        header = {
            "config": self.config.to_dict(), "insn_addr": self.insn_addr, "insn_count": len(self.insns),
            "dram_bytes": self.dram_bytes, "segments": [{"addr": a, "size": len(d)} for a, d in self.segments],
            "symbols": {k: {"addr": s.addr, "shape": list(s.shape), "dtype": s.dtype} for k, s in self.symbols.items()},
        }
        hj = json.dumps(header).encode()
        parts = [MAGIC, struct.pack("<II", FORMAT_VERSION, len(hj)), hj,
                 encode_program(self.insns, self.config).tobytes()]
        parts += [bytes(d) for _, d in self.segments]
        return b"".join(parts)

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_bytes())  # encoded first: an encoding error leaves no file

    @classmethod
    def from_bytes(cls, data: bytes, config: AccelConfig | None = None, source: str = "program") -> "Program":
        if len(data) < 16 or data[:8] != MAGIC:
            raise ProgramFormatError(f"{source}: not a program file (bad magic)")
        version, hlen = struct.unpack_from("<II", data, 8)
        if version != FORMAT_VERSION:
            raise ProgramFormatError(f"{source}: format version {version}, this kit reads version {FORMAT_VERSION}")
        try:
            header = json.loads(data[16:16 + hlen])
            file_cfg = AccelConfig.from_dict(header["config"])
        except (ValueError, KeyError, ConfigError) as e:
            raise ProgramFormatError(f"{source}: corrupt header ({e})") from None
        if config is not None and file_cfg != config:
            diff = {k: (v, getattr(config, k)) for k, v in file_cfg.to_dict().items() if getattr(config, k) != v}
            raise ProgramFormatError(
                f"{source}: built for another config; differing keys (file, wanted): "
                + ", ".join(f"{k}={a!r} vs {b!r}" for k, (a, b) in diff.items()))
        pos = 16 + hlen
        n = header["insn_count"]
        code = data[pos:pos + n * INSN_BYTES]
        if len(code) != n * INSN_BYTES:
            raise ProgramFormatError(f"{source}: truncated (expected {n} instructions)")
        pos += n * INSN_BYTES
        segments = []
        for seg in header["segments"]:
            chunk = data[pos:pos + seg["size"]]
            if len(chunk) != seg["size"]:
                raise ProgramFormatError(f"{source}: truncated segment at DRAM address {seg['addr']:#x}")
            segments.append((seg["addr"], chunk))
            pos += seg["size"]
        symbols = {k: Symbol(v["addr"], tuple(v["shape"]), v["dtype"]) for k, v in header.get("symbols", {}).items()}
        return cls(file_cfg, decode_program(code, file_cfg), header["insn_addr"], header["dram_bytes"],
                   segments, symbols)

    @classmethod
    def load(cls, path: str | Path, config: AccelConfig | None = None) -> "Program":
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ProgramFormatError(f"cannot read {path}: {e.strerror}") from None
        return cls.from_bytes(data, config, str(path))
