"""Device DRAM: one contiguous np.uint8 array addressed by physical byte address, and an aligned
first-fit allocator handing out Buffers (address, size) with numpy views for typed reads/writes.

Drivers receive the whole array and modify it in place, so a Buffer's view always shows what
the accelerator last wrote. Allocation is O(holes); free merges neighbouring holes.
"""
from __future__ import annotations

import bisect
import logging

import numpy as np

from .errors import MemoryAccessError, OutOfMemoryError

log = logging.getLogger(__name__)

DEFAULT_ALIGN = 64
"""Default buffer alignment in bytes: a multiple of every entry size of the default configs."""


class Buffer:
    """A DRAM allocation: `addr` (physical byte address) and `nbytes`, valid until freed."""

    def __init__(self, memory: "DeviceMemory", addr: int, nbytes: int, name: str | None = None):
        self.memory = memory
        self.addr = addr
        self.nbytes = nbytes
        self.name = name
        self.freed = False

    def __repr__(self) -> str:
        state = ", freed" if self.freed else ""
        return f"Buffer({self.name or 'unnamed'}, addr={self.addr:#x}, nbytes={self.nbytes}{state})"

    def _check_live(self) -> None:
        if self.freed:
            raise MemoryAccessError(f"{self!r} was freed; allocate a new buffer")

    @property
    def end(self) -> int:
        return self.addr + self.nbytes

    def view(self, dtype=np.uint8, shape=None) -> np.ndarray:
        """A numpy view of the buffer's bytes (no copy): writes go straight to DRAM."""
        self._check_live()
        dt = np.dtype(dtype)
        if self.nbytes % dt.itemsize:
            raise MemoryAccessError(f"{self!r}: {self.nbytes} bytes are not a whole number of {dt} items")
        v = self.memory.array[self.addr:self.end].view(dt)
        if shape is not None:
            try:
                v = v.reshape(shape)
            except ValueError:
                raise MemoryAccessError(f"{self!r}: cannot view {v.size} {dt} items as shape {tuple(shape)}") from None
        return v

    def write(self, data, offset: int = 0) -> None:
        """Copy an array's bytes (C order, its own dtype) into the buffer at byte `offset`."""
        self._check_live()
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if offset < 0 or offset + raw.size > self.nbytes:
            raise MemoryAccessError(f"{self!r}: writing {raw.size} bytes at offset {offset} does not fit "
                                    f"its {self.nbytes} bytes")
        self.memory.array[self.addr + offset:self.addr + offset + raw.size] = raw

    def read(self, dtype=np.uint8, shape=None, offset: int = 0) -> np.ndarray:
        """A copy of the buffer's contents as `dtype` (all of it, or `shape` starting at byte `offset`)."""
        self._check_live()
        dt = np.dtype(dtype)
        count = (self.nbytes - offset) // dt.itemsize if shape is None else int(np.prod(shape, dtype=np.int64))
        nbytes = count * dt.itemsize
        if offset < 0 or offset + nbytes > self.nbytes:
            raise MemoryAccessError(f"{self!r}: reading {nbytes} bytes at offset {offset} exceeds its "
                                    f"{self.nbytes} bytes")
        out = self.memory.array[self.addr + offset:self.addr + offset + nbytes].view(dt).copy()
        return out if shape is None else out.reshape(shape)

    def entry_index(self, entry_bytes: int, offset_entries: int = 0) -> int:
        """The buffer's address counted in entries of `entry_bytes` (the unit of LOAD/STORE
        dram_base), plus `offset_entries`. Fails if the buffer is not aligned to the entry size."""
        self._check_live()
        if self.addr % entry_bytes:
            raise MemoryAccessError(f"{self!r} is not aligned to the {entry_bytes}-byte entry size; allocate it "
                                    f"with align={entry_bytes} (or a multiple)")
        return self.addr // entry_bytes + offset_entries

    def free(self) -> None:
        self.memory.free(self)


class DeviceMemory:
    """DRAM of `nbytes` with an aligned first-fit allocator.

    `array` is the whole DRAM (np.uint8, 1-D) as drivers see it. Holes are kept sorted by
    address; alloc takes the first hole that fits the aligned request, free merges neighbours.
    """

    def __init__(self, nbytes: int, default_align: int = DEFAULT_ALIGN):
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise MemoryAccessError(f"DRAM size must be a positive integer number of bytes, got {nbytes!r}")
        if default_align <= 0 or default_align & (default_align - 1):
            raise MemoryAccessError(f"default_align={default_align} must be a power of two")
        self.nbytes = nbytes
        self.default_align = default_align
        self.array = np.zeros(nbytes, dtype=np.uint8)
        self._holes: list[tuple[int, int]] = [(0, nbytes)]  # (start, end), sorted, disjoint, non-adjacent
        self._live: dict[int, Buffer] = {}

    # ---- accounting -------------------------------------------------------------------------
    @property
    def free_bytes(self) -> int:
        return sum(e - s for s, e in self._holes)

    @property
    def largest_hole(self) -> int:
        return max((e - s for s, e in self._holes), default=0)

    @property
    def used_bytes(self) -> int:
        return self.nbytes - self.free_bytes

    def buffers(self) -> list[Buffer]:
        """Live buffers, by address."""
        return [self._live[a] for a in sorted(self._live)]

    # ---- alloc / free -----------------------------------------------------------------------
    def alloc(self, nbytes: int, align: int | None = None, name: str | None = None) -> Buffer:
        """Allocate `nbytes` (> 0) at an address that is a multiple of `align` (any positive
        integer, e.g. an entry size of 48 bytes; default `default_align`)."""
        align = self.default_align if align is None else align
        if not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise MemoryAccessError(f"alloc({name or 'buffer'}): size must be a positive number of bytes, got {nbytes!r}")
        if not isinstance(align, (int, np.integer)) or align <= 0:
            raise MemoryAccessError(f"alloc({name or 'buffer'}): align must be a positive integer, got {align!r}")
        nbytes, align = int(nbytes), int(align)
        for i, (start, end) in enumerate(self._holes):
            addr = -(-start // align) * align
            if addr + nbytes <= end:
                pieces = [(s, e) for s, e in ((start, addr), (addr + nbytes, end)) if e > s]
                self._holes[i:i + 1] = pieces
                buf = Buffer(self, addr, nbytes, name)
                self._live[addr] = buf
                log.debug("alloc %s", buf)
                return buf
        raise OutOfMemoryError(
            f"out of device memory: cannot allocate {nbytes} bytes (align {align}) for {name or 'a buffer'}; "
            f"{self.free_bytes} of {self.nbytes} bytes free, largest hole {self.largest_hole} bytes, "
            f"{len(self._live)} buffers live")

    def alloc_array(self, data: np.ndarray, align: int | None = None, name: str | None = None) -> Buffer:
        """Allocate a buffer the size of `data` and copy `data` into it."""
        data = np.ascontiguousarray(data)
        buf = self.alloc(max(1, data.nbytes), align, name)
        buf.write(data)
        return buf

    def free(self, buf: Buffer) -> None:
        if buf.memory is not self:
            raise MemoryAccessError(f"{buf!r} belongs to another DeviceMemory")
        if buf.freed or self._live.get(buf.addr) is not buf:
            raise MemoryAccessError(f"double free of {buf!r}")
        del self._live[buf.addr]
        buf.freed = True
        start, end = buf.addr, buf.end
        i = bisect.bisect_left(self._holes, (start, end))
        # merge with the previous and next holes when they touch
        if i > 0 and self._holes[i - 1][1] == start:
            i -= 1
            start = self._holes[i][0]
            del self._holes[i]
        if i < len(self._holes) and self._holes[i][0] == end:
            end = self._holes[i][1]
            del self._holes[i]
        self._holes.insert(i, (start, end))
        log.debug("free %s", buf)

    def check_range(self, addr: int, nbytes: int, what: str) -> None:
        """Raise unless [addr, addr+nbytes) lies inside DRAM."""
        if addr < 0 or addr + nbytes > self.nbytes:
            raise MemoryAccessError(f"{what}: bytes [{addr:#x}, {addr + nbytes:#x}) lie outside the "
                                    f"{self.nbytes:#x}-byte DRAM")
