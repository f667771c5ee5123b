"""Driver "fsim": runs programs on the functional simulator (sim.fsim), bit-exact, no cycles.

One Fsim instance per driver, so on-chip buffers persist across runs as they do on hardware.
"""
from __future__ import annotations

import time

import numpy as np

from sim.fsim import Fsim

from ..device import Driver, RunResult, register_driver


@register_driver("fsim")
class FsimDriver(Driver):
    def __init__(self, cfg, max_insns: int | None = None, check_races: bool | None = None):
        super().__init__(cfg)
        self.sim = Fsim(cfg, check_races=check_races)
        self.max_insns = max_insns

    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int) -> RunResult:
        t0 = time.perf_counter()
        stats = self.sim.run(dram, insn_addr, insn_count, max_insns=self.max_insns)
        wall = time.perf_counter() - t0
        return RunResult(driver=self.name, insn_count=insn_count, wall_s=wall, stats=stats.to_dict(), raw=stats)
