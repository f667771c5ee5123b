"""DramModel: the one definition of the DRAM's timing, shared by the Verilator harness (sim/verilator,
through ctypes arguments) and the timing model (sim/tsim). Both must implement exactly this:

Reads (the AXI read channel; the accelerator keeps at most one read burst in flight):
  ARREADY is always high. For a burst whose AR handshake is in cycle a, beat k (k = 0, 1, ...)
  is *available* from cycle a + read_latency + floor(k * bus_bytes / bytes_per_cycle); RVALID
  shows it from max(available, cycle after beat k-1 was taken), and holds it until RREADY.
Writes (the AXI write channel, independent of reads):
  AWREADY is always high. For a burst whose AW handshake is in cycle w, WREADY accepts beat k
  from cycle w + 1 + floor(k * bus_bytes / bytes_per_cycle). Its write response (BVALID) comes
  write_latency cycles after the cycle of its last W beat, in order, at most one per cycle.
bytes_per_cycle = 0 means one full bus beat per cycle (the bus is the only limit).
Addresses outside the DRAM answer SLVERR (read data zero, writes dropped).
"""
from __future__ import annotations

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
    def from_dict(cls, d: dict | None) -> "DramModel":
        if d is None:
            return cls()
        if isinstance(d, DramModel):
            return d
        unknown = sorted(set(d) - {"read_latency", "write_latency", "bytes_per_cycle"})
        if unknown:
            raise SimError(f"DramModel: unknown key(s) {', '.join(unknown)}; keys are read_latency, "
                           f"write_latency, bytes_per_cycle")
        return cls(**d)


DEFAULT_DRAM = DramModel()
