"""Driver "vboard": the board driver (board.py), unchanged, against a virtual board: the Verilated
accelerator in a separate shell process, its DRAM in shared memory, its registers over a socket.

    get_driver("vboard", cfg, dram={"read_latency": 16}, phys_base=0x10000, timeout_s=600)

The shell (`python -m host_runtime.drivers.vboard --shell`, started by the back end) loads a
library built from the rtl driver's harness (sim/verilator/harness.cpp, same model, same AXI
memory timing) plus vboard_shell.cpp: one AXI4-Lite access per request and a clock that runs
while the core is busy and no request is pending, as on a board. The DMA buffer lives at
`phys_base` inside the shared "physical" memory, so the driver's relocation of DRAM addresses
runs here as it does on a board; outputs and counters equal the rtl driver's.

Shell protocol (a socketpair, little-endian): request <B op, I addr, I data> with op R (read),
W (write), A (attach: data = length of the shared memory's name that follows, then <Q size,
I read_latency, I write_latency, I bytes_per_cycle>), Q (quit); answer <B ok, I value>.
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import logging
import select
import socket
import struct
import subprocess
import sys
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import numpy as np

from accel.isa import AccelConfig, resolve_config
from sim.dram import DramModel
from sim.verilator import build as vb

from ..device import register_driver
from .board import BoardBackend, BoardDriver, BoardError, DmaBuffer

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SHELL_CPP = HERE / "vboard_shell.cpp"
_REQ = struct.Struct("<BII")
_ANS = struct.Struct("<BI")
_ATTACH = struct.Struct("<QIII")
CHUNK_CYCLES = 4096          # cycles the shell clocks between looks at the socket while the core is busy
DEFAULT_PHYS_BASE = 0x10000  # where the DMA buffer sits in the virtual physical memory
BUILD_RECIPE = "vboard-shell-2"   # bump when build_shell_library's commands change (part of the cache key)


# ---- the shell's library ----------------------------------------------------------------------------
def build_shell_library(config) -> Path:
    """sim/verilator/build.py's model with vboard_shell.cpp as the harness (build_cached, keyed by the
    rtl library's key, the shell source and BUILD_RECIPE); returns the library's path."""
    missing = vb.tools_available()
    if missing:
        raise BoardError(f"driver 'vboard' needs Verilator and a C++ compiler: {missing}")
    cfg = resolve_config(config)
    h = hashlib.sha256(vb.library_key(cfg).encode())
    h.update(SHELL_CPP.read_bytes())
    h.update(BUILD_RECIPE.encode())
    key = h.hexdigest()[:16]
    try:
        return vb.build_cached(cfg, key, "vboard", SHELL_CPP, what="Verilator build of the vboard shell")
    except vb.BuildError as e:
        raise BoardError(str(e)) from None


# ---- the parent's side: a BoardBackend talking to the shell -------------------------------------------
class _ShmBuffer(DmaBuffer):
    def __init__(self, shm: shared_memory.SharedMemory, base: int, nbytes: int):
        self.shm = shm
        self.array = np.frombuffer(shm.buf, np.uint8, count=nbytes, offset=base)
        self.phys_addr = base

    def free(self) -> None:
        self.array = None
        try:
            self.shm.close()
        except BufferError:          # a caller still holds a view: the mapping goes with the last one
            self.shm.close = lambda: None
        try:
            self.shm.unlink()
        except FileNotFoundError:
            pass


class VboardBackend(BoardBackend):
    """Starts the shell process; registers over a socketpair, DMA memory in shared memory."""
    name = "vboard"

    def __init__(self, cfg: AccelConfig, dram=None, phys_base: int = DEFAULT_PHYS_BASE, start_timeout_s: float = 120):
        self.cfg = cfg
        self.dram_model = DramModel.from_dict(dram, cfg.clock_mhz)
        if phys_base < 0 or phys_base % 4096:
            raise BoardError(f"vboard: phys_base={phys_base:#x} must be a non-negative multiple of 4096")
        self.phys_base = phys_base
        lib = build_shell_library(cfg)
        parent, child = socket.socketpair()
        self.sock = parent
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "host_runtime.drivers.vboard", "--shell",
                                          "--fd", str(child.fileno()), "--lib", str(lib),
                                          "--bus-bytes", str(cfg.bus_bytes)],
                                         pass_fds=[child.fileno()], cwd=str(HERE.parents[1]))
        finally:
            child.close()
        self.sock.settimeout(start_timeout_s)
        self._call(b"R", 0x04)     # the shell answers once its model is out of reset
        self.sock.settimeout(None)
        self._shm: _ShmBuffer | None = None

    def _call(self, op: bytes, addr: int = 0, data: int = 0, tail: bytes = b"") -> int:
        try:
            self.sock.sendall(_REQ.pack(op[0], addr, data & 0xFFFFFFFF) + tail)
            ans = b""
            while len(ans) < _ANS.size:
                chunk = self.sock.recv(_ANS.size - len(ans))
                if not chunk:
                    raise BoardError(f"vboard: the shell process exited (code {self.proc.poll()})")
                ans += chunk
        except OSError as e:
            raise BoardError(f"vboard: the shell does not answer: {e}") from None
        ok, value = _ANS.unpack(ans)
        if not ok:
            raise BoardError(f"vboard: register access {op.decode()} {addr:#x} got no AXI4-Lite answer within 64 cycles")
        return value

    def read32(self, offset: int) -> int:
        return self._call(b"R", offset)

    def write32(self, offset: int, value: int) -> None:
        self._call(b"W", offset, value)

    def alloc(self, nbytes: int) -> DmaBuffer:
        if self.phys_base + nbytes > 1 << self.cfg.dram_addr_width:
            raise BoardError(f"vboard: {nbytes} bytes at {self.phys_base:#x} exceed the config's "
                             f"{self.cfg.dram_addr_width}-bit address space; use phys_base=0")
        shm = shared_memory.SharedMemory(create=True, size=self.phys_base + nbytes)
        buf = _ShmBuffer(shm, self.phys_base, nbytes)
        name = shm.name.encode()
        d = self.dram_model
        self._call(b"A", 0, len(name), name + _ATTACH.pack(self.phys_base + nbytes, d.read_latency, d.write_latency,
                                                          d.bytes_per_cycle))
        if self._shm is not None:
            self._shm.free()
        self._shm = buf
        return buf

    def close(self) -> None:
        if self.sock is None:
            return
        try:
            self.sock.sendall(_REQ.pack(ord("Q"), 0, 0))
        except OSError:
            pass
        self.sock.close()
        self.sock = None
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._shm is not None:
            self._shm.free()
            self._shm = None


@register_driver("vboard")
class VboardDriver(BoardDriver):
    """The board driver with the virtual board's back end. Options: dram (sim.dram.DramModel or its
    dict), phys_base (the DMA buffer's physical address), timeout_s (per run; default 600)."""
    default_timeout_s = 600.0

    def _open_backend(self, backend, **options) -> BoardBackend:
        if backend is not None:
            raise BoardError("driver 'vboard' has its own back end; use driver 'board' to pick one")
        return VboardBackend(self.cfg, **options)


# ---- the shell process ------------------------------------------------------------------------------
def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _shell(fd: int, lib_path: str, bus_bytes: int) -> int:
    lib = ctypes.CDLL(lib_path)
    lib.accel_create.restype = ctypes.c_void_p
    lib.accel_create.argtypes = [ctypes.c_char_p]
    lib.accel_destroy.argtypes = [ctypes.c_void_p]
    lib.accel_bus_bytes.restype = ctypes.c_uint32
    lib.accel_bus_bytes.argtypes = [ctypes.c_void_p]
    lib.vb_attach.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32,
                              ctypes.c_uint32]
    lib.vb_write.restype = ctypes.c_int
    lib.vb_write.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32]
    lib.vb_read.restype = ctypes.c_int
    lib.vb_read.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32)]
    lib.vb_tick.restype = ctypes.c_int
    lib.vb_tick.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    h = lib.accel_create(None)
    if lib.accel_bus_bytes(h) != bus_bytes:
        print(f"vboard shell: the model's bus is {lib.accel_bus_bytes(h)} bytes, the config says {bus_bytes}",
              file=sys.stderr)
        return 2
    sock = socket.socket(fileno=fd)
    shm, arr = None, None
    running = False
    value = ctypes.c_uint32()
    try:
        while True:
            if running and not select.select([sock], [], [], 0)[0]:
                if lib.vb_tick(h, CHUNK_CYCLES):
                    running = False
                continue
            req = _recv_exact(sock, _REQ.size)
            if req is None:
                return 0
            op, addr, data = _REQ.unpack(req)
            ok, out = 1, 0
            if op == ord("R"):
                ok = lib.vb_read(h, addr, ctypes.byref(value))
                out = value.value
            elif op == ord("W"):
                ok = lib.vb_write(h, addr, data)
                if addr == 0x00 and data & 1:
                    running = True
            elif op == ord("A"):
                name = _recv_exact(sock, data)
                tail = _recv_exact(sock, _ATTACH.size)
                if name is None or tail is None:
                    return 0
                size, rl, wl, bpc = _ATTACH.unpack(tail)
                lib.vb_attach(h, None, 0, rl, wl, bpc)
                if shm is not None:
                    arr = None
                    shm.close()
                shm = shared_memory.SharedMemory(name=name.decode())
                resource_tracker.unregister(shm._name, "shared_memory")   # the parent owns and unlinks it
                arr = np.frombuffer(shm.buf, np.uint8, count=size)
                lib.vb_attach(h, arr.ctypes.data, size, rl, wl, bpc)
            elif op == ord("Q"):
                return 0
            else:
                ok = 0
            sock.sendall(_ANS.pack(ok, out))
    except (BrokenPipeError, ConnectionResetError):
        return 0
    finally:
        lib.accel_destroy(h)
        arr = None
        if shm is not None:
            shm.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="the virtual board's shell process (started by driver 'vboard')")
    p.add_argument("--shell", action="store_true", required=True)
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--lib", required=True)
    p.add_argument("--bus-bytes", type=int, required=True)
    a = p.parse_args(argv)
    return _shell(a.fd, a.lib, a.bus_bytes)


if __name__ == "__main__":
    sys.exit(main())
