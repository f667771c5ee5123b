"""build(): schedule -> lowered PrimFunc -> machine code, through a registry of targets.

    mod = build(s, [A, B, C], target="llvm")     # host CPU, JIT: mod(a, b, c) on numpy arrays
    obj = build(s, [A, B, C], target="pynq")     # Cortex-A9 object: obj.save("f.o")

Targets are parsed from strings: a registry name ("llvm", "pynq", "ultra96", ...), or
"llvm -mtriple=<triple> -mcpu=<cpu> -mattr=<features> [-O<n>] [-fast-math]", or
"<triple> [<cpu>]". The host target uses the host CPU's name and features (AVX-512 here).
"""
from __future__ import annotations

import logging
import platform
from dataclasses import dataclass, field
from typing import Sequence

import llvmlite.binding as llvm

from .codegen.llvm import CodegenLLVM
from .codegen.runtime import CrossModule, Module, register_runtime_symbols
from .errors import CodegenError, TargetError
from .lower import lower
from .te.schedule import Schedule
from .tir import passes
from .tir.stmt import PrimFunc

log = logging.getLogger(__name__)

#: name -> target options. "host" means: the machine this runs on.
TARGETS: dict[str, dict] = {
    "llvm": {"triple": "host", "cpu": "host", "features": "host"},
    "pynq": {"triple": "armv7a-linux-gnueabihf", "cpu": "cortex-a9", "features": "+neon,+vfp3"},
    "zynq": {"triple": "armv7a-linux-gnueabihf", "cpu": "cortex-a9", "features": "+neon,+vfp3"},
    "cortex-a9": {"triple": "armv7a-linux-gnueabihf", "cpu": "cortex-a9", "features": "+neon,+vfp3"},
    "ultra96": {"triple": "aarch64-linux-gnu", "cpu": "cortex-a53", "features": "+neon"},
    "zcu104": {"triple": "aarch64-linux-gnu", "cpu": "cortex-a53", "features": "+neon"},
    "cortex-a53": {"triple": "aarch64-linux-gnu", "cpu": "cortex-a53", "features": "+neon"},
}

_initialized = False


def _init_llvm() -> None:
    global _initialized
    if not _initialized:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        _initialized = True


@dataclass
class Target:
    triple: str
    cpu: str = ""
    features: str = ""
    opt_level: int = 3
    fast_math: bool = False
    _tm: object = field(default=None, repr=False, compare=False)

    @property
    def is_host(self) -> bool:
        host = llvm.get_process_triple().split("-")[0]
        return self.triple.split("-")[0] == host

    @property
    def arch(self) -> str:
        return self.triple.split("-")[0]

    def target_machine(self):
        if self._tm is None:
            _init_llvm()
            try:
                t = llvm.Target.from_triple(self.triple)
            except RuntimeError as e:
                raise TargetError(f"target triple {self.triple!r} is not supported by this LLVM: {e}") from None
            self._tm = t.create_target_machine(cpu=self.cpu, features=self.features, opt=self.opt_level,
                                               reloc="pic" if not self.is_host else "default",
                                               codemodel="jitdefault" if self.is_host else "default")
        return self._tm

    def __str__(self):
        return f"llvm -mtriple={self.triple} -mcpu={self.cpu}"


def _resolve(opts: dict) -> dict:
    out = dict(opts)
    _init_llvm()
    if out.get("triple") == "host":
        out["triple"] = llvm.get_process_triple()
    if out.get("cpu") == "host":
        out["cpu"] = llvm.get_host_cpu_name()
    if out.get("features") == "host":
        out["features"] = llvm.get_host_cpu_features().flatten()
    return out


def parse_target(target) -> Target:
    """Target object from a string (see module doc) or a Target (returned as is)."""
    if isinstance(target, Target):
        return target
    if not isinstance(target, str) or not target.strip():
        raise TargetError(f"target must be a string such as 'llvm', got {target!r}")
    toks = target.split()
    head, rest = toks[0], toks[1:]
    if head in TARGETS:
        opts = dict(TARGETS[head])
    elif "-" in head and not head.startswith("-"):
        opts = {"triple": head, "cpu": "", "features": ""}
        if rest and not rest[0].startswith("-"):
            opts["cpu"] = rest.pop(0)
    else:
        raise TargetError(f"unknown target {head!r}; registered: {', '.join(TARGETS)}, or a triple "
                          "like 'aarch64-linux-gnu cortex-a53'")
    opt_level, fast = 3, False
    for t in rest:
        if t.startswith("-mtriple="):
            opts["triple"] = t.split("=", 1)[1]
            if opts.get("cpu") == "host":
                opts["cpu"], opts["features"] = "", ""
        elif t.startswith("-mcpu="):
            opts["cpu"] = t.split("=", 1)[1]
        elif t.startswith("-mattr="):
            opts["features"] = t.split("=", 1)[1]
        elif t.startswith("-O") and t[2:].isdigit():
            opt_level = int(t[2:])
        elif t == "-fast-math":
            fast = True
        else:
            raise TargetError(f"target {target!r}: unknown option {t!r} (known: -mtriple= -mcpu= "
                              "-mattr= -O<n> -fast-math)")
    opts = _resolve(opts)
    return Target(opts["triple"], opts.get("cpu", ""), opts.get("features", ""), opt_level, fast)


def optimize(mod, tm, opt_level: int = 3) -> None:
    """Run LLVM's standard O<n> pipeline (new pass manager) on a parsed module."""
    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    pto.loop_vectorization = opt_level >= 2
    pto.slp_vectorization = opt_level >= 2
    pto.loop_unrolling = opt_level >= 2
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)


#: passes the CPU backend runs after the generic pipeline
CPU_PASSES = ["LowerVirtualThread"]


def build(sch, args: Sequence | None = None, target="llvm", name: str = "main",
          pipeline: str = "default"):
    """Compile a schedule (with its argument tensors) or a lowered PrimFunc for `target`.

    Returns a callable runtime.Module for the host, a runtime.CrossModule (object code) for
    another architecture.
    """
    tgt = parse_target(target)
    if isinstance(sch, Schedule):
        if args is None:
            raise TargetError("build: give the argument tensors (inputs and outputs) with a schedule")
        func = lower(sch, args, name=name, pipeline=pipeline)
    elif isinstance(sch, PrimFunc):
        func = sch if sch.attrs.get("flattened") else passes.run_pipeline(sch, pipeline)
    else:
        raise TargetError(f"build: expected a Schedule or PrimFunc, got {sch!r}")
    func = passes.run_pipeline(func, CPU_PASSES)
    tm = tgt.target_machine()
    cg = CodegenLLVM(tgt.triple, str(tm.target_data), fast_math=tgt.fast_math)
    cg.add_function(func)
    text = str(cg.module)
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as e:
        raise CodegenError(f"function '{func.name}': LLVM rejected the generated IR: {e}") from None
    mod.triple = tgt.triple
    mod.data_layout = str(tm.target_data)
    optimize(mod, tm, tgt.opt_level)
    ir_text = str(mod)
    if tgt.is_host:
        register_runtime_symbols()
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.finalize_object()
        return Module(func, engine, mod, tgt, ir_text)
    return CrossModule(func, mod, tgt, ir_text)


_ = platform
