"""Tsim: the cycle-accurate timing model of the accelerator (sim/tsim/model.py), event by event.

    stats = Tsim(cfg, DramModel()).run_insns(insns, insn_addr, trace=True)
    stats.cycles, stats.counters(), stats.spans
"""
from .model import STAGE_NAMES, Tsim, TsimStats, stage_of

__all__ = ["STAGE_NAMES", "Tsim", "TsimStats", "stage_of"]
