"""Driver "tsim": the cycle-accurate timing model (sim.tsim) for cycles and counters, the functional
simulator (sim.fsim) for the data, so it leaves exactly fsim's DRAM bytes.

    get_driver("tsim", cfg, dram={"read_latency": 16}, trace=True)
Options: dram (sim.dram.DramModel, its dict, or a DRAM preset name such as "pynq-z1" taken at the
config's clock; default DramModel()), trace (keep per-instruction slices and read bursts in
RunResult.raw.timeline), max_cycles (a run past it raises CycleLimitError),
helper (default True: the timing model runs in a helper process while fsim runs here, see
sim/tsim/helper.py; the results are the same either way).
RunResult.stats is sim.trace.Counters.to_dict(); RunResult.cycles its total cycles;
RunResult.raw.model_in_helper says where the model ran.
"""
from __future__ import annotations

import time

import numpy as np

from accel.isa.isa import INSN_BYTES
from sim.dram import DramModel
from sim.fsim import Fsim
from sim.trace import Counters, Timeline, TimingRun
from sim.tsim import Tsim, helper

from ..device import Driver, RunResult, register_driver
from ..errors import DriverError
from .faults import fetched_program


@register_driver("tsim")
class TsimDriver(Driver):
    def __init__(self, cfg, dram=None, trace: bool = False, max_cycles: int = 1 << 40, helper: bool = True):
        super().__init__(cfg)
        if not isinstance(helper, bool):
            raise DriverError(f"driver 'tsim': option helper={helper!r} must be True or False")
        self.dram_model = DramModel.from_dict(dram, cfg.clock_mhz)
        self.fsim = Fsim(cfg)        # on-chip buffers persist across runs, as on the hardware
        self.tsim = Tsim(cfg, self.dram_model)
        self.trace = trace
        self.max_cycles = max_cycles
        self.helper = helper

    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int) -> RunResult:
        t0 = time.perf_counter()
        insns, illegal = fetched_program(self.cfg, dram, insn_addr, insn_count)
        job = None
        if self.helper:   # the model's input is the program as fetched, before fsim's stores can touch it
            program = dram[insn_addr:insn_addr + insn_count * INSN_BYTES].tobytes()
            job = helper.submit(self.cfg, self.dram_model, program, insn_addr, self.max_cycles, self.trace)
        try:
            # data, and the program's checks (deadlock, ranges); BLAS leaves the helper its core
            self.fsim.run_insns(dram, insns, single_thread=job is not None, illegal=illegal)
        except BaseException as e:
            if job is not None:
                job.cancel(wait=isinstance(e, Exception))   # an interrupt does not wait for the model
            raise
        st = job.result() if job is not None else None
        in_helper = st is not None
        if st is None:
            st = self.tsim.run_insns(insns, insn_addr, self.max_cycles, trace=self.trace, illegal=illegal)
        counters = Counters.from_hw(self.cfg, st.counters(), insns)
        timeline = Timeline.from_spans(insns, st.spans, st.bursts) if self.trace else None
        wall = time.perf_counter() - t0
        return RunResult(driver=self.name, insn_count=insn_count, wall_s=wall, stats=counters.to_dict(),
                         cycles=counters.cycles, raw=TimingRun(counters, timeline, in_helper))
