"""ctypes front of the Verilator harness: one simulated accelerator (buffers persist across runs).

    model = VerilatorModel(cfg, waves="out.fst")       # builds or reuses the cached library
    res = model.run(dram, insn_addr, insn_count)       # dram: 1-D uint8, read and written in place
    res.counters["cycles"], res.stage_spans            # counters of accel/hw/regs.py

The DRAM buffer is handed to the harness by pointer: the AXI memory model reads and writes it
directly, no copy per run. Timing of the memory follows sim.dram.DramModel.
"""
from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from accel.hw.params import ERROR_TEXT, ErrorCode
from accel.isa import AccelConfig, resolve_config

from ..dram import DramModel
from ..errors import CycleLimitError, ProgramFault, SimError
from .build import build_library

log = logging.getLogger(__name__)

DEFAULT_MAX_CYCLES = 50_000_000
#: cycles without progress before the RTL ends a run with a WATCHDOG fault, as the board driver sets it
DEFAULT_WATCHDOG = 1 << 20
_RUN_DONE, _RUN_CYCLE_LIMIT, _RUN_AXIL_STUCK = 0, 1, 2
_STATUS_BUS_ERROR = 4
STATUS_ERROR = 8            # accel/hw/regs.py STATUS bit 3
_REG_ERROR = 0x18           # ERROR, then ERROR_INSN
_U64P = ctypes.POINTER(ctypes.c_uint64)
_U32P = ctypes.POINTER(ctypes.c_uint32)


class RtlRunError(SimError):
    """The RTL run failed: an AXI error response, a stuck register access (the message says which)."""


@dataclass
class RtlResult:
    counters: dict[str, int]
    wall_s: float
    harness_cycles: int                       # cycles simulated, register accesses included
    stage_spans: list[tuple[int, int, int]] | None = field(default=None)  # (stage, start, end)
    bursts: list[tuple[int, int, int]] | None = field(default=None)       # (client, AR cycle, RLAST cycle)


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.accel_create.restype = ctypes.c_void_p
    lib.accel_create.argtypes = [ctypes.c_char_p]
    lib.accel_destroy.argtypes = [ctypes.c_void_p]
    lib.accel_bus_bytes.restype = ctypes.c_uint32
    lib.accel_bus_bytes.argtypes = [ctypes.c_void_p]
    lib.accel_run.restype = ctypes.c_int
    lib.accel_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32,
                              ctypes.c_uint64, ctypes.c_uint32, _U32P, _U32P, ctypes.c_int, _U64P, _U64P, ctypes.c_int]
    lib.accel_probe_count.restype = ctypes.c_uint64
    lib.accel_probe_count.argtypes = [ctypes.c_void_p]
    lib.accel_probes.restype = ctypes.c_uint64
    lib.accel_probes.argtypes = [ctypes.c_void_p, _U64P, ctypes.c_uint64]
    lib.accel_has_probes.restype = ctypes.c_int
    return lib


class VerilatorModel:
    """The accelerator's RTL compiled by Verilator, driven through the C harness."""

    def __init__(self, cfg: AccelConfig | str, dram: DramModel | None = None, waves: str | Path | None = None,
                 probes: bool = False, max_cycles: int = DEFAULT_MAX_CYCLES, watchdog: int = DEFAULT_WATCHDOG):
        from accel.hw.regs import COUNTER_BASE, COUNTERS  # noqa: PLC0415 - accel.hw.regs pulls in amaranth on import
        self.cfg = resolve_config(cfg)
        self.dram_model = dram or DramModel()
        self.max_cycles = max_cycles
        if type(watchdog) is not int or not 0 <= watchdog < 1 << 32:
            raise SimError(f"watchdog={watchdog!r}: cycles without progress before a fault, 0..2**32-1 (0: off)")
        self.watchdog = watchdog
        self.waves = Path(waves) if waves else None
        fmt = None
        if self.waves is not None:
            fmt = {".vcd": "vcd", ".fst": "fst"}.get(self.waves.suffix)
            if fmt is None:
                raise SimError(f"waveform file {self.waves}: the suffix must be .vcd or .fst")
        self.lib_path = build_library(self.cfg, waves=fmt)
        self._lib = _load(self.lib_path)
        self.probes = probes
        self._stuck = False    # the last run hit its cycle limit: restart before the next one
        self._h = self._create(self.waves)
        if self._lib.accel_bus_bytes(self._h) != self.cfg.bus_bytes:
            raise SimError(f"Verilator model bus is {self._lib.accel_bus_bytes(self._h)} bytes, the config says "
                           f"{self.cfg.bus_bytes}")
        self.counter_names = list(COUNTERS)
        # the harness reads each offset and the next word: ERROR and ERROR_INSN come as one "counter"
        self._offsets = (ctypes.c_uint32 * (len(COUNTERS) + 1))(*[COUNTER_BASE + 8 * i for i in range(len(COUNTERS))],
                                                                  _REG_ERROR)

    def _create(self, waves: Path | None):
        h = self._lib.accel_create(str(waves).encode() if waves else None)
        if not h:
            raise SimError("the Verilator harness could not create the model")
        return h

    def _restart(self) -> None:
        """A fresh model after a run that never finished: the hung one keeps its stages waiting on
        tokens and its queues full, so the next program would hang too (on-chip buffers are lost,
        as after a power cycle). The waveform of the hung run is kept; later runs are not traced."""
        self._lib.accel_destroy(self._h)
        self._h = None
        if self.waves is not None:
            log.warning("rtl: the model restarts after a hung run; %s keeps that run, later runs are not traced",
                        self.waves)
        self._h = self._create(None)

    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int, max_cycles: int | None = None) -> RtlResult:
        if self._h is None:
            raise SimError("the Verilator model is closed")
        if self._stuck:
            self._restart()
            self._stuck = False
        if dram.dtype != np.uint8 or dram.ndim != 1 or not dram.flags.c_contiguous or not dram.flags.writeable:
            raise SimError(f"DRAM must be a writable contiguous 1-D uint8 array, got {dram.dtype} {dram.shape}")
        limit = self.max_cycles if max_cycles is None else max_cycles
        d = self.dram_model
        params = (ctypes.c_uint32 * 3)(d.read_latency, d.write_latency, d.bytes_per_cycle)
        out = (ctypes.c_uint64 * (len(self.counter_names) + 1))()
        info = (ctypes.c_uint64 * 4)()
        t0 = time.perf_counter()
        rc = self._lib.accel_run(self._h, dram.ctypes.data, dram.size, insn_addr, insn_count, limit, self.watchdog,
                                 params,
                                 self._offsets, len(self.counter_names) + 1, out, info, int(self.probes))
        wall = time.perf_counter() - t0
        counters = dict(zip(self.counter_names, (int(v) for v in out)))
        self._stuck = rc in (_RUN_AXIL_STUCK, _RUN_CYCLE_LIMIT)
        if rc == _RUN_AXIL_STUCK:
            raise RtlRunError("the AXI4-Lite register interface did not answer within 64 cycles")
        if rc == _RUN_CYCLE_LIMIT:
            raise CycleLimitError(f"rtl: the accelerator did not raise done within {limit} cycles "
                                  f"(STATUS=0x{info[0]:x}, counters {counters}); a dependency-token deadlock or a "
                                  f"program without a reachable FINISH")
        if info[2] or info[0] & _STATUS_BUS_ERROR:
            raise RtlRunError(f"rtl: an access outside the {dram.size}-byte DRAM got an AXI error response")
        if info[0] & STATUS_ERROR:
            err = int(out[len(self.counter_names)])
            code, index = ErrorCode(err & 0xFF), err >> 32
            raise ProgramFault(code, index, f"rtl: instruction {index}: {code.name} ({ERROR_TEXT[code]}), "
                                            f"STATUS=0x{info[0]:x} after {counters['cycles']} cycles")
        spans, bursts = self._spans(int(info[3])) if self.probes else (None, None)
        return RtlResult(counters, wall, int(info[1]), spans, bursts)

    def _spans(self, start_cycle: int):
        n = self._lib.accel_probe_count(self._h)
        buf = (ctypes.c_uint64 * (3 * n))()
        n = self._lib.accel_probes(self._h, buf, n)
        ev = np.frombuffer(buf, dtype=np.uint64).reshape(-1, 3)[:n].astype(np.int64)
        spans, open_, bursts, ars = [], {}, [], []
        for cyc, stage, kind in ev.tolist():
            cyc -= start_cycle
            if kind == 0:
                open_[stage] = cyc
            elif kind == 1 and stage in open_:
                spans.append((stage, open_.pop(stage), cyc + 1))
            elif kind == 2:
                ars.append((stage, cyc))
            elif kind == 3 and ars:            # bursts end in the order they began (sim/dram.py)
                c, a = ars.pop(0)
                bursts.append((c, a, cyc))
        return spans, bursts

    def close(self) -> None:
        if self._h is not None:
            self._lib.accel_destroy(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
