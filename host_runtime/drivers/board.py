"""Driver "board": runs programs on the accelerator through its register map (MMIO) and one
physically contiguous DMA buffer, as on a Zynq board.

    get_driver("board", cfg, backend="pynq", bitstream="accel.bit")      # PYNQ image on the board
    get_driver("board", cfg, backend="linux", uio="accel", udmabuf="udmabuf0")   # plain Linux
    get_driver("vboard", cfg)       # the same driver against the Verilated shell (vboard.py)

A back end (BoardBackend) does four things only: map the registers (read32/write32), allocate a
buffer (DmaBuffer: a CPU view, a physical address), sync it (flush before a run, invalidate
after: the HP port does not snoop the CPU caches) and close. Everything else is this driver's,
so the virtual board runs the same code a board does:

1. The bitstream's CONFIG_ID register (the first 32 bits of the config digest) must match the
   driver's config, or the driver refuses to start (a program built for another bitstream).
2. Per run the Device's DRAM image is copied into the DMA buffer. The accelerator addresses
   physical memory, the program DRAM offsets from 0, so LOAD/STORE addresses are relocated by
   the buffer's physical address (in entries of each buffer type) and INSN_ADDR points into it.
3. Start (CTRL), poll STATUS with a timeout, read the error bits and the 64-bit counters,
   clear done, copy the buffer back (the instruction words as they were).
4. A fault (STATUS.error with ERROR/ERROR_INSN) raises BoardFault, a BoardError that is also
   sim.errors.ProgramFault with the code and instruction index fsim and rtl report; a bus error
   or a timeout raises BoardError. Either way the driver soft-resets the core (SOFT_RESET) so the
   next program starts clean. WATCHDOG is set at open (option watchdog, cycles; 0 turns it off).
"""
from __future__ import annotations

import abc
import dataclasses
import logging
import mmap
import os
import time
from pathlib import Path

import numpy as np

from accel.isa import AccelConfig
from accel.isa.isa import INSN_BYTES, Load, MemType, Store, elem_bytes, encode_program
from sim.errors import ProgramFault, SimError
from sim.trace import Counters, TimingRun, program_at

from ..device import Driver, RunResult, register_driver
from ..errors import HostRuntimeError

log = logging.getLogger(__name__)

STATUS_BUSY, STATUS_DONE, STATUS_BUS_ERROR = 1, 2, 4
STATUS_ERROR_MASK = ~(STATUS_BUSY | STATUS_DONE) & 0xFFFFFFFF   # every bit above done reports an error
CTRL_START, CTRL_IRQ_ENABLE = 1, 2
RESET_REGISTERS = ("SOFT_RESET", "RESET")    # whichever the register map has (accel/hw/regs.py)


class BoardError(HostRuntimeError):
    """A board run failed: config mismatch, accelerator error status, timeout, buffer or mapping problem."""


class BoardFault(BoardError, ProgramFault):
    """The program faulted as the hardware reports it (STATUS.error, ERROR, ERROR_INSN): `code`
    (accel.hw.params.ErrorCode) and the faulting instruction's `index`, as fsim and rtl raise it."""

    def __init__(self, code, index: int, message: str):
        ProgramFault.__init__(self, code, index, message)


# ---- back-end interface ---------------------------------------------------------------------------
class DmaBuffer(abc.ABC):
    """A physically contiguous buffer: `array` (np.uint8, the CPU's view) at `phys_addr`."""
    array: np.ndarray
    phys_addr: int

    def flush(self) -> None:
        """Make the CPU's writes visible to the device (before a run)."""

    def invalidate(self) -> None:
        """Make the device's writes visible to the CPU (after a run)."""

    def free(self) -> None:
        pass


class BoardBackend(abc.ABC):
    """Registers and DMA memory of one accelerator."""
    name = "?"

    @abc.abstractmethod
    def read32(self, offset: int) -> int: ...

    @abc.abstractmethod
    def write32(self, offset: int, value: int) -> None: ...

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> DmaBuffer: ...

    def close(self) -> None:
        pass


# ---- PYNQ -----------------------------------------------------------------------------------------
class _PynqBuffer(DmaBuffer):
    def __init__(self, buf):
        self._buf = buf
        self.array = np.asarray(buf).view(np.uint8).reshape(-1)
        self.phys_addr = int(getattr(buf, "physical_address", None) or buf.device_address)

    def flush(self) -> None:
        self._buf.flush()

    def invalidate(self) -> None:
        self._buf.invalidate()

    def free(self) -> None:
        self._buf.freebuffer()


class PynqBackend(BoardBackend):
    """pynq.Overlay(bitstream) for the registers (the IP named `ip`, else the one named accel*),
    pynq.allocate for the buffer (CMA). Needs the board's PYNQ image."""
    name = "pynq"

    def __init__(self, cfg: AccelConfig, bitstream: str | None = None, ip: str | None = None):
        try:
            import pynq  # noqa: PLC0415 - optional dep pynq (on the board)
        except ImportError:
            raise BoardError("backend 'pynq' needs the pynq package (the board's PYNQ image); "
                             "use backend='linux' on other Linux images") from None
        bitstream = bitstream or os.environ.get("ACCEL_BITSTREAM")
        if not bitstream:
            raise BoardError("backend 'pynq': give the bitstream (bitstream=... / --bitstream / ACCEL_BITSTREAM), "
                             "the overlay/accel.bit that `accel build` produces")
        if not Path(bitstream).is_file():
            raise BoardError(f"backend 'pynq': bitstream {bitstream} does not exist")
        self._pynq = pynq
        self.overlay = pynq.Overlay(str(bitstream))
        ips = {k: v for k, v in self.overlay.ip_dict.items() if "phys_addr" in v}
        names = [ip] if ip else [k for k in ips if k.split("/")[-1].startswith("accel")]
        if len(names) != 1 or names[0] not in ips:
            raise BoardError(f"backend 'pynq': cannot pick the accelerator's IP in {bitstream} "
                             f"(asked {ip!r}; IPs are {', '.join(sorted(ips)) or 'none'}); pass ip=NAME")
        d = ips[names[0]]
        self.mmio = pynq.MMIO(int(d["phys_addr"]), int(d.get("addr_range", 0x10000)))
        log.info("pynq: %s registers at %#x", names[0], int(d["phys_addr"]))

    def read32(self, offset: int) -> int:
        return int(self.mmio.read(offset)) & 0xFFFFFFFF

    def write32(self, offset: int, value: int) -> None:
        self.mmio.write(offset, int(value) & 0xFFFFFFFF)

    def alloc(self, nbytes: int) -> DmaBuffer:
        try:
            return _PynqBuffer(self._pynq.allocate(shape=(nbytes,), dtype=np.uint8))
        except Exception as e:   # pynq raises plain RuntimeError/MemoryError for CMA exhaustion
            raise BoardError(f"backend 'pynq': cannot allocate a {nbytes}-byte contiguous buffer: {e}") from None


# ---- plain Linux: UIO or /dev/mem for the registers, u-dma-buf for the buffer ----------------------
def _read_attr(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        raise BoardError(f"backend 'linux': cannot read {path}: {e.strerror}") from None


class _MappedRegs:
    def __init__(self, path: str, offset: int, size: int, what: str):
        try:
            fd = os.open(path, os.O_RDWR | os.O_SYNC)
        except OSError as e:
            raise BoardError(f"backend 'linux': cannot open {path} ({what}): {e.strerror}") from None
        try:
            page = mmap.PAGESIZE
            base = offset - offset % page
            self._map = mmap.mmap(fd, size + offset - base, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                                  offset=base)
        except (OSError, ValueError) as e:
            raise BoardError(f"backend 'linux': cannot map {size} bytes of {path} at {offset:#x} ({what}): {e}") from None
        finally:
            os.close(fd)
        self.words = np.frombuffer(self._map, np.uint32, count=size // 4, offset=offset - base)
        self.size = size

    def close(self) -> None:
        self.words = None
        try:
            self._map.close()
        except BufferError:
            pass


class _UdmaBuffer(DmaBuffer):
    def __init__(self, backend: "LinuxBackend", nbytes: int):
        self._b = backend
        self.array = backend.dma[:nbytes]
        self.phys_addr = backend.dma_phys
        self.nbytes = nbytes

    def _sync(self, direction: int, attr: str) -> None:
        d = self._b.dma_sysfs
        if d is None:
            return                      # opened O_SYNC: the mapping is uncached
        try:
            (d / "sync_offset").write_text("0")
            (d / "sync_size").write_text(str(self.nbytes))
            (d / "sync_direction").write_text(str(direction))
            (d / attr).write_text("1")
        except OSError as e:
            raise BoardError(f"backend 'linux': cache sync through {d / attr} failed: {e.strerror}") from None

    def flush(self) -> None:
        self._sync(1, "sync_for_device")

    def invalidate(self) -> None:
        self._sync(2, "sync_for_cpu")


class LinuxBackend(BoardBackend):
    """Registers: a UIO device (uio="uio0" or the device's name, e.g. "accel", looked up in
    /sys/class/uio) or /dev/mem at regs_base (e.g. 0x43C00000, the address `accel build` assigns).
    Memory: one u-dma-buf device (udmabuf="udmabuf0"; its size is set when the module loads), its
    caches synced through sysfs. `root` prefixes /dev and /sys (tests)."""
    name = "linux"

    def __init__(self, cfg: AccelConfig, uio: str | None = None, regs_base: int | None = None,
                 regs_size: int = 0x10000, udmabuf: str = "udmabuf0", root: str = "/"):
        r = Path(root)
        if uio is None and regs_base is None:
            uio = "accel"
        if uio is not None:
            uio_dir = r / "sys/class/uio"
            if not (uio_dir / uio).is_dir():
                named = [d.name for d in sorted(uio_dir.glob("uio*")) if _read_attr(d / "name") == uio] \
                    if uio_dir.is_dir() else []
                if len(named) != 1:
                    raise BoardError(f"backend 'linux': no UIO device {uio!r} in {uio_dir} (give uio=uioN, or "
                                     f"regs_base=ADDR for /dev/mem)")
                uio = named[0]
            size = int(_read_attr(uio_dir / uio / "maps/map0/size"), 0)
            self.regs = _MappedRegs(str(r / "dev" / uio), 0, min(size, regs_size), f"UIO {uio}")
        else:
            self.regs = _MappedRegs(str(r / "dev/mem"), int(regs_base), regs_size, "/dev/mem registers")
        self.dma_sysfs = None
        for cls in ("u-dma-buf", "udmabuf"):
            if (r / "sys/class" / cls / udmabuf).is_dir():
                self.dma_sysfs = r / "sys/class" / cls / udmabuf
        if self.dma_sysfs is None:
            raise BoardError(f"backend 'linux': no u-dma-buf device {udmabuf!r} in {r / 'sys/class/u-dma-buf'} "
                             f"(load the u-dma-buf module: insmod u-dma-buf.ko {udmabuf}=SIZE)")
        self.dma_phys = int(_read_attr(self.dma_sysfs / "phys_addr"), 0)
        self.dma_size = int(_read_attr(self.dma_sysfs / "size"), 0)
        self._dma_map = _MappedRegs(str(r / "dev" / udmabuf), 0, self.dma_size, f"u-dma-buf {udmabuf}")
        self.dma = np.frombuffer(self._dma_map._map, np.uint8, count=self.dma_size)
        self.udmabuf = udmabuf

    def read32(self, offset: int) -> int:
        return int(self.regs.words[offset >> 2])

    def write32(self, offset: int, value: int) -> None:
        self.regs.words[offset >> 2] = int(value) & 0xFFFFFFFF

    def alloc(self, nbytes: int) -> DmaBuffer:
        if nbytes > self.dma_size:
            raise BoardError(f"backend 'linux': {nbytes} bytes asked, u-dma-buf {self.udmabuf} holds {self.dma_size}; "
                             f"reload the module with a larger {self.udmabuf}=SIZE")
        return _UdmaBuffer(self, nbytes)

    def close(self) -> None:
        self.dma = None
        self.regs.close()
        self._dma_map.close()


BACKENDS = {"pynq": PynqBackend, "linux": LinuxBackend}


def open_backend(name: str | None, cfg: AccelConfig, **options) -> BoardBackend:
    """A back end by name; None picks pynq when it is installed, else linux."""
    if name is None:
        try:
            import pynq  # noqa: PLC0415, F401 - optional dep pynq (on the board)
            name = "pynq"
        except ImportError:
            name = "linux"
    if name not in BACKENDS:
        raise BoardError(f"unknown board backend {name!r}; backends are {', '.join(BACKENDS)}")
    try:
        return BACKENDS[name](cfg, **options)
    except TypeError as e:
        raise BoardError(f"board backend {name!r}: {e}") from None


# ---- program relocation -----------------------------------------------------------------------------
def relocate(cfg: AccelConfig, insns, base: int, dram_bytes: int | None = None) -> np.ndarray:
    """The program's encoded words with every LOAD/STORE DRAM address moved up by `base` bytes.
    With dram_bytes, every transfer must lie inside [0, dram_bytes) first: the accelerator reaches
    all physical memory, so a program must not reach past its own buffer."""
    limit = 1 << cfg.dram_addr_width
    out = []
    for i, insn in enumerate(insns):
        if isinstance(insn, (Load, Store)):
            eb = elem_bytes(cfg, insn.mem_type if isinstance(insn, Load) else MemType.OUT)
            if dram_bytes is not None and insn.y_size and insn.x_size:
                last = (insn.dram_base + (insn.y_size - 1) * insn.x_stride + insn.x_size) * eb
                if last > dram_bytes:
                    raise BoardError(f"instruction {i} ({insn.opcode.name}): dram_base={insn.dram_base} "
                                     f"y_size={insn.y_size} x_size={insn.x_size} x_stride={insn.x_stride} reaches "
                                     f"byte {last:#x}, beyond the {dram_bytes:#x}-byte DRAM")
            if base == 0:
                out.append(insn)
                continue
            moved = insn.dram_base + base // eb
            if (moved + 1) * eb > limit:
                raise BoardError(f"instruction {i} ({insn.opcode.name}): DRAM address {moved * eb:#x} after "
                                 f"relocation by {base:#x} is beyond the {cfg.dram_addr_width}-bit dram_addr_width")
            insn = dataclasses.replace(insn, dram_base=moved)
        out.append(insn)
    return encode_program(out, cfg)


# ---- the driver -----------------------------------------------------------------------------------
@register_driver("board")
class BoardDriver(Driver):
    """Options: backend ("pynq" | "linux" | a BoardBackend; default pynq when installed), timeout_s
    (per run, wall clock), and the back end's own options (bitstream, ip, uio, regs_base, udmabuf)."""
    default_timeout_s = 60.0

    def __init__(self, cfg: AccelConfig, backend: str | BoardBackend | None = None, timeout_s: float | None = None,
                 watchdog: int = 1 << 20, **backend_options):
        super().__init__(cfg)
        from accel.hw.regs import COUNTER_BASE, COUNTERS, register_map  # noqa: PLC0415 - accel.hw.regs pulls in amaranth on import
        self.regs = {r.name: r.offset for r in register_map(cfg)}
        self.counter_regs = {name: COUNTER_BASE + 8 * i for i, name in enumerate(COUNTERS)}
        self.timeout_s = float(timeout_s if timeout_s is not None else self.default_timeout_s)
        if not self.timeout_s > 0:
            raise BoardError(f"timeout_s={timeout_s}: must be > 0")
        if type(watchdog) is not int or not 0 <= watchdog < 1 << 32:
            raise BoardError(f"watchdog={watchdog!r}: cycles without progress before a fault, 0..2**32-1 (0: off)")
        self.backend = backend if isinstance(backend, BoardBackend) else self._open_backend(backend, **backend_options)
        self._buf: DmaBuffer | None = None
        try:
            self._check_config()
            if self.read32("STATUS") & STATUS_BUSY:
                log.warning("%s: the accelerator is busy at open; soft reset", self.name)
                self._recover("busy at open")
            if "WATCHDOG" in self.regs:      # a hung token protocol ends in a WATCHDOG fault, not a timeout
                self.write32("WATCHDOG", watchdog)
        except BaseException:
            self.backend.close()
            raise

    def _open_backend(self, backend, **options) -> BoardBackend:
        return open_backend(backend, self.cfg, **options)

    def read32(self, name: str) -> int:
        return self.backend.read32(self.regs[name])

    def write32(self, name: str, value: int) -> None:
        self.backend.write32(self.regs[name], value)

    def _check_config(self) -> None:
        """The bitstream's CONFIG_ID against this config's digest (a host never runs a program built
        for another bitstream)."""
        want = int(self.cfg.digest()[:8], 16)
        if "CONFIG_ID" not in self.regs:
            log.warning("%s: the register map has no CONFIG_ID; the bitstream's config is not checked", self.name)
            return
        got = self.read32("CONFIG_ID")
        if got != want:
            raise BoardError(f"{self.name}: the bitstream's CONFIG_ID is 0x{got:08x}, the program's config digest "
                             f"starts 0x{want:08x}: load the bitstream built for this config (accel build --config)")

    def _recover(self, why: str) -> None:
        """Soft reset where the hardware has one; clear done and the error bits either way."""
        for name in RESET_REGISTERS:
            if name in self.regs:
                self.write32(name, 1)
                break
        else:
            log.warning("%s: no soft-reset register in the register map (%s); clearing STATUS only", self.name, why)
        self.write32("STATUS", 0xFFFFFFFE)

    def _buffer(self, nbytes: int) -> DmaBuffer:
        if self._buf is None or self._buf.array.size < nbytes:
            if self._buf is not None:
                self._buf.free()
                self._buf = None
            buf = self.backend.alloc(-(-nbytes // 4096) * 4096)   # whole pages: loads read whole bus beats
            base = buf.phys_addr
            align = max(INSN_BYTES, self.cfg.bus_bytes, *(elem_bytes(self.cfg, m) for m in MemType))
            problem = None
            if base % align:
                problem = (f"DMA buffer at {base:#x} is not aligned to {align} bytes (the largest entry or bus "
                           f"beat of config {self.cfg.digest()[:8]})")
            elif base + nbytes > 1 << self.cfg.dram_addr_width:
                problem = (f"DMA buffer [{base:#x}, {base + nbytes:#x}) is beyond the {self.cfg.dram_addr_width}-bit "
                           f"dram_addr_width of the config")
            if problem:
                buf.free()
                raise BoardError(f"{self.name}: {problem}")
            self._buf = buf
            log.info("%s: DMA buffer of %d bytes at %#x", self.name, nbytes, base)
        return self._buf

    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int) -> RunResult:
        t0 = time.perf_counter()
        try:
            insns = program_at(self.cfg, dram, insn_addr, insn_count)
        except SimError as e:
            raise BoardError(f"{self.name}: {e}") from None
        end = insn_addr + insn_count * INSN_BYTES
        if insn_addr % INSN_BYTES:
            raise BoardError(f"{self.name}: insn_addr {insn_addr:#x} is not a multiple of {INSN_BYTES}")
        buf = self._buffer(dram.size)
        base = buf.phys_addr
        view = buf.array[:dram.size]
        view[:] = dram
        view[insn_addr:end] = relocate(self.cfg, insns, base, dram.size).reshape(-1)
        buf.flush()
        status = self.read32("STATUS")
        if status & STATUS_BUSY:
            self._recover("busy before start")
            if self.read32("STATUS") & STATUS_BUSY:
                raise BoardError(f"{self.name}: the accelerator is still busy (STATUS=0x{status:x}) and cannot be reset")
        phys = base + insn_addr
        self.write32("INSN_ADDR_LO", phys & 0xFFFFFFFF)
        self.write32("INSN_ADDR_HI", phys >> 32)
        self.write32("INSN_COUNT", insn_count)
        self.write32("CTRL", CTRL_START | CTRL_IRQ_ENABLE)
        status = self._wait(t0)
        hw = {}
        for name, off in self.counter_regs.items():
            lo = self.backend.read32(off)          # reading LO latches HI
            hw[name] = self.backend.read32(off + 4) << 32 | lo
        if status & STATUS_ERROR_MASK:
            self._raise_error(status, hw["cycles"])
        self.write32("STATUS", STATUS_DONE)
        buf.invalidate()
        keep = dram[insn_addr:end].copy()
        dram[:] = view
        dram[insn_addr:end] = keep
        counters = Counters.from_hw(self.cfg, hw, insns)
        return RunResult(driver=self.name, insn_count=insn_count, wall_s=time.perf_counter() - t0,
                         stats=counters.to_dict(), cycles=counters.cycles, raw=TimingRun(counters, None))

    def _raise_error(self, status: int, cycles: int):
        """Read ERROR/ERROR_INSN, reset the core, raise BoardFault (a program fault) or BoardError."""
        extra = {n: self.read32(n) for n in ("ERROR", "ERROR_INSN") if n in self.regs}
        self._recover("error status")
        if status & STATUS_BUS_ERROR:
            raise BoardError(f"{self.name}: an AXI error response on the accelerator's memory port "
                             f"(STATUS=0x{status:x}) after {cycles} cycles; the core was reset")
        code = extra.get("ERROR", 0) & 0xFF
        try:
            from accel.hw.params import ERROR_TEXT, ErrorCode  # noqa: PLC0415 - a board's install may lack accel.hw: then the raw code
            ec = ErrorCode(code)
        except (ImportError, ValueError):
            raise BoardError(f"{self.name}: the accelerator reported an error: STATUS=0x{status:x}, "
                             f"ERROR=0x{code:x}, ERROR_INSN={extra.get('ERROR_INSN')}; the core was reset") from None
        index = extra.get("ERROR_INSN", -1)
        raise BoardFault(ec, index, f"{self.name}: instruction {index}: {ec.name} ({ERROR_TEXT.get(ec, '?')}), "
                                        f"STATUS=0x{status:x} after {cycles} cycles; the core was reset")

    def _wait(self, t0: float) -> int:
        """Poll STATUS until done or an error bit, backing off to 1 ms; soft reset on timeout."""
        deadline = t0 + self.timeout_s
        pause, polls = 0.0, 0
        while True:
            status = self.read32("STATUS")
            if not status & STATUS_BUSY and status & (STATUS_DONE | STATUS_ERROR_MASK):
                return status              # a fault ends the run too, once the core is quiet
            if time.perf_counter() > deadline:
                self._recover("timeout")
                raise BoardError(f"{self.name}: the accelerator did not raise done within {self.timeout_s:g} s "
                                 f"(STATUS=0x{status:x}); a dependency-token deadlock, a program without a reachable "
                                 f"FINISH, or a hung bus; the core was reset")
            polls += 1
            if polls > 100:
                pause = min(1e-3, pause * 2 or 1e-5)
                time.sleep(pause)

    def close(self) -> None:
        if self.backend is not None:
            if self._buf is not None:
                self._buf.free()
                self._buf = None
            self.backend.close()
            self.backend = None
