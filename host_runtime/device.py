"""Device: DRAM + a driver + micro-op kernel cache; and the driver registry.

A driver executes an encoded program that already sits in DRAM:
    driver = get_driver("fsim", cfg)
    result = driver.run(dram, insn_addr, insn_count)   # dram: 1-D np.uint8, modified in place
Drivers register by name with @register_driver("name"); the built-in ones live in
host_runtime/drivers/ (fsim, tsim, rtl, board, vboard) and are imported on first lookup;
"remote://HOST:PORT" names the device an `accel serve` exposes (host_runtime/remote.py).
"""
from __future__ import annotations

import abc
import importlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np

from accel.isa import AccelConfig, resolve_config

from .errors import DriverError
from .memory import DeviceMemory

log = logging.getLogger(__name__)

DEFAULT_DRAM_BYTES = 64 << 20


@dataclass
class RunResult:
    """What a driver reports for one run.

    stats: the driver's counters as plain data. Every driver fills `insns` (opcode name ->
        count); fsim adds per_stage, gemm_uops, macs, alu_uops, bytes_read, bytes_written.
    cycles: total cycles for timing-accurate drivers, None for the functional simulator.
    raw: the driver's native stats object (e.g. sim.fsim.FsimStats), for callers that know it.
    """
    driver: str
    insn_count: int
    wall_s: float
    stats: dict[str, Any] = field(default_factory=dict)
    cycles: int | None = None
    raw: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {"driver": self.driver, "insn_count": self.insn_count, "wall_s": self.wall_s,
                "stats": self.stats, "cycles": self.cycles}


class Driver(abc.ABC):
    """An executor of instruction streams for one AccelConfig.

    Subclasses set `name` (via @register_driver) and implement run(). A driver may keep state
    between runs (on-chip buffers persist, as on the hardware); close() releases resources.
    """
    name: ClassVar[str] = "?"
    #: whether on-chip buffers keep their contents from one run to the next for this caller alone
    #: (False where other clients' programs may run in between, as on a shared remote device):
    #: a module's weights resident across inferences are used only where this holds
    keeps_buffers: ClassVar[bool] = True

    def __init__(self, cfg: AccelConfig, **options):
        self.cfg = cfg
        if options:
            raise DriverError(f"driver {self.name!r} takes no options; got {', '.join(sorted(options))}")

    @abc.abstractmethod
    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int) -> RunResult:
        """Execute `insn_count` instructions at byte address `insn_addr` of `dram` (in place)."""

    def close(self) -> None:
        pass


_DRIVERS: dict[str, Callable[..., Driver]] = {}
# Built-in drivers: name -> module that registers it (imported on first lookup, so a driver
# whose dependencies are missing never breaks the others).
_BUILTIN: dict[str, str] = {"fsim": "host_runtime.drivers.fsim", "tsim": "host_runtime.drivers.tsim",
                            "rtl": "host_runtime.drivers.rtl", "board": "host_runtime.drivers.board",
                            "vboard": "host_runtime.drivers.vboard"}


def register_driver(name: str):
    """Class decorator: make a Driver subclass available as get_driver(name, cfg)."""
    def deco(cls):
        if name in _DRIVERS and _DRIVERS[name] is not cls:
            raise DriverError(f"driver name {name!r} is already registered by {_DRIVERS[name].__qualname__}")
        cls.name = name
        _DRIVERS[name] = cls
        return cls
    return deco


def available_drivers() -> list[str]:
    """Names get_driver accepts: registered drivers plus built-ins not imported yet."""
    return sorted(set(_DRIVERS) | set(_BUILTIN))


def get_driver(name: str, cfg: AccelConfig | None, **options) -> Driver:
    if isinstance(name, str) and name.startswith("remote://"):   # `accel serve` elsewhere (host_runtime/remote.py)
        from .remote import RemoteDriver  # noqa: PLC0415 - import cycle: remote imports this module
        return RemoteDriver(cfg, name, **options)
    if name not in _DRIVERS and name in _BUILTIN:
        try:
            importlib.import_module(_BUILTIN[name])
        except ImportError as e:
            raise DriverError(f"driver {name!r} cannot be loaded: {e}") from None
    try:
        cls = _DRIVERS[name]
    except KeyError:
        raise DriverError(f"unknown driver {name!r}; drivers are {', '.join(available_drivers())}, "
                          f"or remote://HOST:PORT (accel serve)") from None
    return cls(cfg, **options)


class Device:
    """One accelerator as software sees it: DRAM, a driver, and the micro-op kernels recorded so far.

    Device(cfg, driver="fsim", dram_bytes=64 MiB); driver=None builds programs without running
    them. `memory` allocates DRAM buffers; stream()
    starts a CommandStream; run() executes a program already in DRAM. Kernels are cached per
    device (they live in its DRAM) and shared by all its streams.
    """

    def __init__(self, cfg: AccelConfig | str | None = None, driver: str | Driver | None = "fsim",
                 dram_bytes: int = DEFAULT_DRAM_BYTES, **driver_options):
        if isinstance(cfg, str) and cfg.startswith("remote://"):   # Device("remote://HOST:PORT"): the server's config
            driver = get_driver(cfg, None, **driver_options)
            cfg, driver_options = driver.cfg, {}
        self.cfg = resolve_config(cfg)
        if dram_bytes > 1 << self.cfg.dram_addr_width:
            raise DriverError(f"dram_bytes={dram_bytes} exceeds the {1 << self.cfg.dram_addr_width} bytes "
                              f"a {self.cfg.dram_addr_width}-bit dram_addr_width can address")
        self.memory = DeviceMemory(dram_bytes)
        # driver=None: a device that only builds programs (to save them), never runs them
        self.driver = driver if driver is None or isinstance(driver, Driver) else get_driver(
            driver, self.cfg, **driver_options)
        self.kernels: dict[Any, Any] = {}  # key -> UopKernel, or a preload bundle's Buffer (see commands.py)
        # who last left weights resident in the on-chip weight buffer (an Executor's token), None when
        # unknown: any program run for another owner clears it (host_runtime.executor)
        self.weights_owner: object | None = None

    def stream(self):
        from .commands import CommandStream  # noqa: PLC0415 - import cycle: commands imports this module
        return CommandStream(self)

    def run(self, insn_addr: int, insn_count: int, owner: object | None = None) -> RunResult:
        """Run a program in DRAM. owner: the token of the caller whose resident weights the program
        keeps (an Executor's); a program run for anyone else may overwrite them, so the record clears."""
        if owner is None or owner is not self.weights_owner:
            self.weights_owner = None
        if self.driver is None:
            raise DriverError("this Device was made with driver=None (build only); give it a driver to run "
                              f"programs ({', '.join(available_drivers())})")
        log.info("running %d instructions at %#x on %s", insn_count, insn_addr, self.driver.name)
        return self.driver.run(self.memory.array, insn_addr, insn_count)

    def close(self) -> None:
        if self.driver is not None:
            self.driver.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
