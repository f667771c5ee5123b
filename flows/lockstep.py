"""`accel run PROG.accp|MODEL.accm --lockstep A,B`: two executors compared instruction by
instruction (sim/lockstep.py does the comparing; this module names executors and walks a
compiled model's accelerator steps).

Executor names: "fsim" is the recording functional simulator (stepped: every instruction's
effect compared); any other driver name (tsim, rtl, vboard, a registered one) runs as a whole
and, when it disagrees, on prefixes bisected over the STOREs (sim.lockstep module doc).
For a compiled model each accelerator step is compared from the same DRAM (the arena as the
first executor leaves it after the steps before), and the first step that diverges is reported
with its instruction.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from accel.isa import AccelConfig, Program
from compiler.module import CompiledModule
from host_runtime import available_drivers, get_driver
from host_runtime.device import Device, Driver, RunResult
from host_runtime.executor import Executor, is_module_file
from sim.fsim import Fsim
from sim.lockstep import LockstepError, LockstepResult, RecordingFsim, decode_at, lockstep

from .errors import InputError
from .inputs import read_inputs

log = logging.getLogger(__name__)


def parse_pair(text: str) -> tuple[str, str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if len(names) != 2:
        raise LockstepError(f"--lockstep {text!r}: name two executors, e.g. fsim,rtl")
    for n in names:
        if n not in available_drivers():
            raise LockstepError(f"--lockstep: unknown executor {n!r}; executors are {', '.join(available_drivers())}")
    return names[0], names[1]


def factory(name: str, cfg: AccelConfig, **options) -> Callable[[], object]:
    """A maker of fresh executors called `name`: fsim records effects; others are drivers."""
    if name == "fsim" and not options:
        return lambda: RecordingFsim(cfg)
    return lambda: get_driver(name, cfg, **options)


def lockstep_program(prog, a: str, b: str, make_a=None, make_b=None) -> LockstepResult:
    """Lockstep of a program file (accel.isa.Program) from its DRAM image."""
    cfg = prog.config
    return lockstep(cfg, list(prog.insns), prog.dram_image(), prog.insn_addr, make_a or factory(a, cfg),
                    make_b or factory(b, cfg), (a, b))


@dataclass
class ModelLockstep:
    names: tuple[str, str]
    steps: list[tuple[str, LockstepResult]] = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return any(r.diverged for _, r in self.steps)

    def text(self) -> str:
        lines = []
        for name, r in self.steps:
            t = r.text().replace(f"lockstep {self.names[0]}~{self.names[1]}:", f"step '{name}':", 1)
            lines.append(t)
        a, b = self.names
        bad = next((n for n, r in self.steps if r.diverged), None)
        lines.append(f"lockstep {a}~{b}: " + (f"first divergence in step '{bad}'" if bad else
                                              f"no divergence in {len(self.steps)} accelerator step(s)"))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"executors": list(self.names), "diverged": self.diverged,
                "steps": [{"step": n, **r.to_dict()} for n, r in self.steps]}


class _Stop(Exception):
    pass


def lockstep_model(mod, inputs, a: str, b: str, make_a=None, make_b=None) -> ModelLockstep:
    """Every accelerator step of a compiled model in lockstep (from the same DRAM for both);
    stops at the first step that diverges."""
    cfg = mod.config
    if cfg is None or not mod.count("accel"):
        raise LockstepError(f"model '{mod.name}' has no accelerator steps to run in lockstep (target {mod.target})")
    make_a, make_b = make_a or factory(a, cfg), make_b or factory(b, cfg)
    names = {s.insn_addr: s.name for s in mod.steps if s.kind == "accel"}
    report = ModelLockstep((a, b))

    class LockstepDriver(Driver):
        name = "lockstep"

        def __init__(self):
            super().__init__(cfg)
            self.golden = Fsim(cfg, check_races=False)

        def run(self, dram, insn_addr, insn_count):
            t0 = time.perf_counter()
            insns = decode_at(dram, insn_addr, insn_count, cfg)
            r = lockstep(cfg, insns, dram, insn_addr, make_a, make_b, (a, b))
            step = names.get(insn_addr, f"program at {insn_addr:#x}")
            report.steps.append((step, r))
            log.info("%s", r.text())
            if r.diverged:
                raise _Stop
            stats = self.golden.run(dram, insn_addr, insn_count)   # go on from the same DRAM for both
            return RunResult("lockstep", insn_count, time.perf_counter() - t0, stats.to_dict())

    dev = Device(cfg, driver=LockstepDriver(), dram_bytes=max(mod.dram_bytes, 4096))
    try:
        with Executor(mod, device=dev) as ex:
            ex.run(inputs)
    except _Stop:
        pass
    return report


def run_cli(args) -> int:
    """accel run ... --lockstep A,B (program file or compiled model)."""
    a, b = parse_pair(args.lockstep)
    if getattr(args, "trace", None) or getattr(args, "timeline", None) or getattr(args, "counters", None) \
            or getattr(args, "dump_dram", None) or getattr(args, "outputs", None):
        raise InputError("--lockstep compares two executors; it takes no --trace/--timeline/--counters/--dump-dram/"
                       "--output")
    if is_module_file(args.input):
        mod = CompiledModule.load(args.input)
        report = lockstep_model(mod, read_inputs(mod, args.inputs), a, b)
    else:
        if args.inputs:
            raise InputError(f"{args.input} is a program file; --input applies to compiled models (.accm)")
        report = lockstep_program(Program.load(args.input), a, b)
    print(report.text())
    return 1 if report.diverged else 0


__all__ = ["lockstep_program", "lockstep_model", "parse_pair", "factory", "run_cli", "ModelLockstep"]
