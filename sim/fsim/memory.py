"""fsim's DRAM side: LOAD and STORE tiles as strided views of the DRAM array."""
from __future__ import annotations

import numpy as np

from accel.isa import Load, MemType, Store, decode_uops

from ..errors import ExecError, SimError
from .stats import FsimStats

# Buffer element types, little-endian as the DRAM is (the native types on x86 and ARM), so a LOAD
# writes an entry's bytes in place.
INT = {bits: np.dtype(f"<i{bits // 8}") for bits in (8, 16, 32)}


def wrap(x: np.ndarray, bits: int) -> np.ndarray:
    """Two's-complement wrap of integer values to `bits`, as the narrow int dtype."""
    return np.asarray(x, dtype=np.int64).astype(INT[bits])


def check_dram(dram: np.ndarray) -> None:
    """LOAD and STORE tiles are strided views into the DRAM array, so it must be one flat buffer."""
    if not isinstance(dram, np.ndarray) or dram.dtype != np.uint8 or dram.ndim != 1 or not dram.flags.c_contiguous:
        what = f"{dram.dtype} with shape {dram.shape}" if isinstance(dram, np.ndarray) else type(dram).__name__
        raise SimError(f"DRAM must be a contiguous 1-D uint8 array, got {what}")



def _dram_rows(insn, eb: int) -> tuple[np.ndarray, np.ndarray]:
    """The DRAM byte ranges [starts, ends) of a LOAD's or STORE's rows (for the race checker)."""
    starts = (insn.dram_base + np.arange(insn.y_size, dtype=np.int64) * insn.x_stride) * eb
    return starts, starts + insn.x_size * eb



class MemoryOps:
    """LOAD and STORE (a mixin of Fsim: its buffers, depths and race checker)."""

    def _dram_tile(self, idx, insn, dram, eb) -> np.ndarray:
        """The bytes of a 2-D tile as a (y_size, x_size, eb) strided view of the DRAM (no index
        arrays), bounds-checked. Rows overlap where x_stride < x_size."""
        last = (insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size) * eb
        if last > dram.size:
            raise ExecError(f"instruction {idx} ({insn.opcode.name}): dram_base={insn.dram_base} "
                            f"y_size={insn.y_size} x_size={insn.x_size} x_stride={insn.x_stride} reaches "
                            f"byte {last:#x}, beyond the {dram.size:#x}-byte DRAM")
        return np.ndarray((insn.y_size, insn.x_size, eb), np.uint8, dram, insn.dram_base * eb,
                          (insn.x_stride * eb, eb, 1))

    def _load(self, idx: int, insn: Load, dram: np.ndarray, stats: FsimStats) -> None:
        mem = insn.mem_type
        if mem == MemType.OUT:
            raise ExecError(f"instruction {idx} (LOAD): field mem_type=OUT; LOAD writes UOP, WGT, INP or ACC")
        rows = insn.y_pad0 + insn.y_size + insn.y_pad1
        cols = insn.x_pad0 + insn.x_size + insn.x_pad1
        if rows * cols == 0:
            return  # a no-op carrying dependency flags
        depth, eb = self._depth[mem], self._elem_bytes[mem]
        if insn.sram_base + rows * cols > depth:
            raise ExecError(f"instruction {idx} (LOAD {mem.name}): sram_base={insn.sram_base} + {rows}x{cols} "
                            f"entries exceeds the {mem.name} buffer depth {depth}")
        lo, hi = insn.sram_base, insn.sram_base + rows * cols
        src = self._dram_tile(idx, insn, dram, eb) if insn.y_size and insn.x_size else None   # checked first
        if self.races:
            self.races.write(mem.name.lower(), slice(lo, hi))
            if src is not None:
                self.races.dram_access("read", *_dram_rows(insn, eb))
        padded = rows != insn.y_size or cols != insn.x_size
        if src is not None:
            stats.bytes_read += insn.y_size * insn.x_size * eb
        if mem == MemType.UOP:
            if padded:
                tile = np.zeros((rows, cols, eb), np.uint8)
                if src is not None:
                    tile[insn.y_pad0:insn.y_pad0 + insn.y_size, insn.x_pad0:insn.x_pad0 + insn.x_size] = src
                src = tile
            self.uop[lo:hi] = decode_uops(src.reshape(-1), self.cfg)
            return
        # the entries' bytes, written in place
        tile = self._buffers[mem][lo:hi].view(np.uint8).reshape(rows, cols, eb)
        if padded:
            tile[...] = 0
        if src is not None:
            tile[insn.y_pad0:insn.y_pad0 + insn.y_size, insn.x_pad0:insn.x_pad0 + insn.x_size] = src
        if mem == MemType.INP and self._inp_f is not None:
            self._inp_f[lo:hi] = self.inp[lo:hi]
        elif mem == MemType.WGT and self._wgt_ft is not None:
            self._wgt_ft[:, lo:hi] = self.wgt[lo:hi].transpose(1, 0, 2)

    def _store(self, idx: int, insn: Store, dram: np.ndarray, stats: FsimStats) -> None:
        c = self.cfg
        if insn.mem_type != MemType.OUT:
            raise ExecError(f"instruction {idx} (STORE): field mem_type={insn.mem_type.name}; STORE reads OUT")
        if insn.y_pad0 or insn.y_pad1 or insn.x_pad0 or insn.x_pad1:
            raise ExecError(f"instruction {idx} (STORE): padding fields must be zero")
        if insn.y_size == 0 or insn.x_size == 0:
            return
        n = insn.y_size * insn.x_size
        if insn.sram_base + n > c.out_depth:
            raise ExecError(f"instruction {idx} (STORE): sram_base={insn.sram_base} + {n} entries exceeds the "
                            f"OUT buffer depth {c.out_depth}")
        eb = c.out_elem_bytes
        view = self._dram_tile(idx, insn, dram, eb)
        if self.races:
            self.races.read("out", slice(insn.sram_base, insn.sram_base + n))
            self.races.dram_access("write", *_dram_rows(insn, eb))
        data = self.out[insn.sram_base:insn.sram_base + n].astype(f"<i{c.out_width // 8}").view(np.uint8)
        data = data.reshape(insn.y_size, insn.x_size, eb)
        if insn.y_size == 1 or insn.x_stride >= insn.x_size:
            view[...] = data
        else:
            for r in range(insn.y_size):    # overlapping rows: in order, as the hardware writes them
                view[r] = data[r]
        stats.bytes_written += n * eb
