"""Driver "tsim": the cycle-accurate timing model (sim.tsim) for cycles and counters, the functional
simulator (sim.fsim) for the data, so it leaves exactly fsim's DRAM bytes.

    get_driver("tsim", cfg, dram={"read_latency": 16}, trace=True)
Options: dram (sim.dram.DramModel or its dict; default DramModel()), trace (keep per-instruction
slices and read bursts in RunResult.raw.timeline), max_cycles (a run past it raises CycleLimitError).
RunResult.stats is sim.trace.Counters.to_dict(); RunResult.cycles its total cycles.

The two halves are independent (the timing is data-independent), so where the process may use
more than one CPU the functional simulation runs on a worker thread while the timing model runs
on the caller's: fsim spends most of a layer in BLAS and numpy, which release the GIL, so the two
overlap. Errors are reported as if fsim had run first (its deadlock and range checks win).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

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
        from ..executor import default_num_threads
        self._data_thread = ThreadPoolExecutor(1, thread_name_prefix="tsim-fsim") if default_num_threads() > 1 else None

    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int) -> RunResult:
        from sim.trace import Counters, Timeline, TimingRun, program_at
        t0 = time.perf_counter()
        insns = program_at(self.cfg, dram, insn_addr, insn_count)
        if self._data_thread is None:
            self.fsim.run_insns(dram, insns)         # data, and the program's checks (deadlock, ranges)
            st = self.tsim.run_insns(insns, insn_addr, self.max_cycles, trace=self.trace)
        else:
            data = self._data_thread.submit(self.fsim.run_insns, dram, insns)
            try:
                st = self.tsim.run_insns(insns, insn_addr, self.max_cycles, trace=self.trace)
            except BaseException:
                data.result()                        # fsim's error, when it has one, comes first
                raise
            data.result()
        counters = Counters.from_hw(self.cfg, st.counters(), insns)
        timeline = Timeline.from_spans(insns, st.spans, st.bursts) if self.trace else None
        wall = time.perf_counter() - t0
        return RunResult(driver=self.name, insn_count=insn_count, wall_s=wall, stats=counters.to_dict(),
                         cycles=counters.cycles, raw=TimingRun(counters, timeline))

    def close(self) -> None:
        if self._data_thread is not None:
            self._data_thread.shutdown()
