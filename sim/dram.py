"""DramModel: the one definition of the DRAM's timing, shared by the Verilator harness (sim/verilator,
through ctypes arguments) and the timing model (sim/tsim). Both must implement exactly this:

Reads (the AXI read channel; the accelerator keeps up to AccelConfig.read_outstanding bursts
in flight): ARREADY is always high; bursts are answered in AR order. A burst whose AR handshake
is in cycle a starts its data in cycle s = a + read_latency, or, when throttled, not before the
previous burst's data is produced: s = max(a + read_latency, s_prev + floor(beats_prev * bus_bytes
/ bytes_per_cycle)). Its beat k (k = 0, 1, ...) is *available* from s + floor(k * bus_bytes /
bytes_per_cycle); RVALID shows it from max(available, cycle after the previous beat, of this or
the previous burst, was taken), and holds it until RREADY.
Writes (the AXI write channel, independent of reads):
  AWREADY is always high. For a burst whose AW handshake is in cycle w, WREADY accepts beat k
  from cycle w + 1 + floor(k * bus_bytes / bytes_per_cycle). Its write response (BVALID) comes
  write_latency cycles after the cycle of its last W beat, in order, at most one per cycle.
bytes_per_cycle = 0 means one full bus beat per cycle (the bus is the only limit).
Addresses outside the DRAM answer SLVERR (read data zero, writes dropped).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .errors import SimError


@dataclass(frozen=True)
class DramModel:
    """DRAM timing in accelerator clock cycles. The defaults are the cocotb bench's memory
    (sim/rtl/axi_model.py READ_LATENCY, WRITE_LATENCY: same rules), so every executor agrees."""

    read_latency: int = 8      # AR handshake -> first R beat available, cycles (>= 1)
    write_latency: int = 2     # last W beat -> its B response, cycles (>= 1)
    bytes_per_cycle: int = 0   # sustained bandwidth per direction; 0 = one bus beat per cycle

    def __post_init__(self):
        for key, lo in (("read_latency", 1), ("write_latency", 1), ("bytes_per_cycle", 0)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= 1 << 20:
                raise SimError(f"DramModel.{key}={v!r}: must be an integer in [{lo}, {1 << 20}]")

    def beat_offset(self, k: int, bus_bytes: int) -> int:
        """Cycles after the first beat's earliest slot at which beat k of a burst may move."""
        # Unthrottled, beat k can never move before cycle (first + k) anyway (one beat per cycle).
        return (k * bus_bytes) // self.bytes_per_cycle if self.throttled(bus_bytes) else 0

    def throttled(self, bus_bytes: int) -> bool:
        """True when bandwidth, not the one-beat-per-cycle bus, paces the beats of a burst."""
        return 0 < self.bytes_per_cycle < bus_bytes

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: "dict | str | DramModel | None", clock_mhz: float = 100.0) -> "DramModel":
        """A DramModel, its dict, or a preset's name (DRAM_PRESETS, taken at clock_mhz); None: the default."""
        if d is None:
            return cls()
        if isinstance(d, DramModel):
            return d
        if isinstance(d, str):
            return dram_preset(d, clock_mhz)
        if not isinstance(d, dict):
            raise SimError(f"DramModel: expected a dict of timings or a preset name ({', '.join(DRAM_PRESETS)}), "
                           f"got {type(d).__name__}")
        unknown = sorted(set(d) - {"read_latency", "write_latency", "bytes_per_cycle"})
        if unknown:
            raise SimError(f"DramModel: unknown key(s) {', '.join(unknown)}; keys are read_latency, "
                           f"write_latency, bytes_per_cycle")
        return cls(**d)


DEFAULT_DRAM = DramModel()


@dataclass(frozen=True)
class DramPreset:
    """A board's DRAM as the accelerator sees it through its PL port, in physical units, so that the
    cycle figures follow the accelerator's clock. Sources and reasoning: docs/dram.md."""

    board: str
    memory: str              # the part and interface, for the record
    read_latency_ns: float   # AR accepted at the port -> first R beat
    write_latency_ns: float  # last W beat -> B response
    read_mb_s: float         # sustained bandwidth per direction (peak x controller efficiency), MB/s

    def model(self, clock_mhz: float) -> DramModel:
        """The preset in cycles of a clock_mhz accelerator clock: latencies rounded up, bandwidth down."""
        if not (isinstance(clock_mhz, (int, float)) and 1.0 <= clock_mhz <= 1000.0):
            raise SimError(f"DRAM preset {self.board}: clock_mhz={clock_mhz!r} must be in [1, 1000]")
        return DramModel(read_latency=max(1, math.ceil(self.read_latency_ns * clock_mhz / 1000 - 1e-9)),
                         write_latency=max(1, math.ceil(self.write_latency_ns * clock_mhz / 1000 - 1e-9)),
                         bytes_per_cycle=max(1, int(self.read_mb_s / clock_mhz + 1e-9)))


#: "default" is the RTL test bench's memory (DramModel()); the others are real boards (docs/dram.md).
DRAM_PRESETS: dict[str, DramPreset | None] = {
    "default": None,
    # DDR3-1050, 16 bits (Digilent PYNQ-Z1 reference manual): 2,100 MB/s peak x 75% DDRC efficiency (UG585 22.3.2)
    "pynq-z1": DramPreset("pynq-z1", "DDR3 x16 at 1050 MT/s behind a 64-bit AXI_HP port (Zynq-7020)",
                          read_latency_ns=200.0, write_latency_ns=100.0, read_mb_s=1575.0),
    # LPDDR4-2133, 32 bits (Ultra96-V2 hardware user guide): 8,532 MB/s peak x 75%
    "ultra96": DramPreset("ultra96", "LPDDR4 x32 at 2133 MT/s behind a 128-bit S_AXI_HP port (ZU3EG)",
                          read_latency_ns=250.0, write_latency_ns=120.0, read_mb_s=6399.0),
    # DDR4-2400, 64 bits (ZCU104 user guide UG1267): 19,200 MB/s peak x 75%
    "zcu104": DramPreset("zcu104", "DDR4 x64 at 2400 MT/s behind a 128-bit S_AXI_HP port (ZU7EV)",
                         read_latency_ns=200.0, write_latency_ns=100.0, read_mb_s=14400.0),
}


def dram_preset(name: str, clock_mhz: float = 100.0) -> DramModel:
    """The DramModel of preset `name` at the accelerator's clock; an unknown name lists the presets."""
    key = name.lower() if isinstance(name, str) else name
    if key not in DRAM_PRESETS:
        raise SimError(f"unknown DRAM preset {name!r}; presets are {', '.join(DRAM_PRESETS)}")
    p = DRAM_PRESETS[key]
    return DEFAULT_DRAM if p is None else p.model(clock_mhz)
