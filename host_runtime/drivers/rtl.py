"""Driver "rtl": the accelerator's generated Verilog compiled by Verilator, run by a C++ harness
(sim/verilator) whose AXI4 memory model works on the DRAM array in place.

    get_driver("rtl", cfg, dram={"read_latency": 16}, trace=True, waves="run.fst")
Options: dram (sim.dram.DramModel, its dict or a DRAM preset name: the same timing tsim uses), trace (per-instruction
slices from the stage controllers' state, and read bursts, in RunResult.raw.timeline), waves (a
.vcd or .fst path for the whole driver's lifetime), max_cycles (cycle limit per run), watchdog (cycles
without progress that end a run with a WATCHDOG fault, as on a board; default 2**20, 0: off). The first use
of a config builds the model (seconds for `tiny`, a minute or two for `default`), cached by config and source hash.
RunResult.stats is sim.trace.Counters.to_dict() from the RTL's counter registers. A run that ends
on a fault (STATUS.error) raises sim.errors.ProgramFault with the ERROR code and the instruction's
index, naming the instruction (and the field, where the instruction alone shows it).
"""
from __future__ import annotations

import time

import numpy as np

from sim.dram import DramModel
from sim.errors import ProgramFault
from sim.trace import Counters, Timeline, TimingRun
from sim.verilator.build import BuildError, tools_available
from sim.verilator.model import DEFAULT_MAX_CYCLES, DEFAULT_WATCHDOG, RtlRunError, VerilatorModel

from ..device import Driver, RunResult, register_driver
from ..errors import DriverError
from .faults import dram_range_fault, fetched_program, name_fault


@register_driver("rtl")
class RtlDriver(Driver):
    def __init__(self, cfg, dram=None, trace: bool = False, waves=None, max_cycles: int | None = None,
                 watchdog: int = DEFAULT_WATCHDOG):
        super().__init__(cfg)
        missing = tools_available()
        if missing:
            raise DriverError(f"driver 'rtl' needs Verilator and a C++ compiler: {missing}")
        self.trace = trace
        try:
            self.model = VerilatorModel(cfg, DramModel.from_dict(dram, cfg.clock_mhz), waves=waves, probes=trace,
                                        max_cycles=max_cycles or DEFAULT_MAX_CYCLES, watchdog=watchdog)
        except BuildError as e:
            raise DriverError(f"driver 'rtl' cannot build the Verilator model: {e}") from None

    def run(self, dram: np.ndarray, insn_addr: int, insn_count: int) -> RunResult:
        t0 = time.perf_counter()
        insns, _ = fetched_program(self.cfg, dram, insn_addr, insn_count)
        try:
            res = self.model.run(dram, insn_addr, insn_count)
        except ProgramFault as e:      # STATUS.error: ERROR / ERROR_INSN, named
            raise name_fault(self.cfg, insns, e, "rtl") from None
        except RtlRunError as e:       # an AXI error response: name the transfer past the DRAM, as fsim does
            named = dram_range_fault(self.cfg, insns, dram.size, "rtl")
            if named is None:
                raise
            raise named from e
        counters = Counters.from_hw(self.cfg, res.counters, insns)
        timeline = Timeline.from_spans(insns, res.stage_spans, res.bursts) if self.trace else None
        wall = time.perf_counter() - t0
        return RunResult(driver=self.name, insn_count=insn_count, wall_s=wall, stats=counters.to_dict(),
                         cycles=counters.cycles, raw=TimingRun(counters, timeline))

    def close(self) -> None:
        self.model.close()
