"""Driver "tsim": the cycle-accurate timing model (sim.tsim) for cycles and counters, the functional
simulator (sim.fsim) for the data, so it leaves exactly fsim's DRAM bytes.

    get_driver("tsim", cfg, dram={"read_latency": 16}, trace=True)
Options: dram (sim.dram.DramModel or its dict; default DramModel()), trace (keep per-instruction
slices and read bursts in RunResult.raw.timeline), max_cycles (a run past it raises CycleLimitError).
RunResult.stats is sim.trace.Counters.to_dict(); RunResult.cycles its total cycles.
"""
from __future__ import annotations

import time

import numpy as np

from ..device import Driver, RunResult, register_driver


@register_driver("tsim")
class TsimDriver(Driver):
    def __init__(self, cfg, dram=None, trace: bool = False, max_cycles: int = 1 << 40):
        super().__init__(cfg)
        from sim.dram import DramModel
        from sim.fsim import Fsim
        from sim.tsim import Tsim
        self.dram_model = DramModel.from_dict(dram)
        self.fsim = Fsim(cfg)        # on-chip buffers persist across runs, as on the hardware
        self.tsim = Tsim(cfg, self.dram_model)
        self.trace = trace
        self.max_cycles = max_cycles

    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int) -> RunResult:
        from sim.trace import Counters, Timeline, TimingRun, program_at
        t0 = time.perf_counter()
        insns = program_at(self.cfg, dram, insn_addr, insn_count)
        self.fsim.run_insns(dram, insns)             # data, and the program's checks (deadlock, ranges)
        st = self.tsim.run_insns(insns, insn_addr, self.max_cycles, trace=self.trace)
        counters = Counters.from_hw(self.cfg, st.counters(), insns)
        timeline = Timeline.from_spans(insns, st.spans, st.bursts) if self.trace else None
        wall = time.perf_counter() - t0
        return RunResult(driver=self.name, insn_count=insn_count, wall_s=wall, stats=counters.to_dict(),
                         cycles=counters.cycles, raw=TimingRun(counters, timeline))
