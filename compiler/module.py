"""CompiledModule: what compiler.build_model returns; saves to one file and loads back.

It is host_runtime's ModuleImage (the data the executor runs: DRAM image with instruction
programs and weights, step list with buffer assignments, kernel library, input/output names and
quantization shifts), plus the build's reports. Importing this module registers the graph IR's
NumPy reference implementations as host ops, the documented fallback for ops without a compiled
kernel (steps of kind 'numpy', labelled so in the profile).

    mod = compiler.build_model("net.onnx", target="accel", config="default")
    mod.save("net.accm")                                      # atomic, versioned, config recorded
    mod = CompiledModule.load("net.accm", config="default")   # refuses another config or version
    outs, profile = mod.run({"x": x}, driver="fsim")
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from accel.isa.config import AccelConfig, resolve_config
from host_runtime.executor import (
    Executor,
    ModuleFormatError,
    ModuleImage,
    format_profile,
    profile_summary,
    register_host_op,
)

from .accel import avgpool as _avgpool  # noqa: F401 - declares qavg_pool2d, which saved modules may name
from .graph.ir import Node
from .graph.ops import OpDef, on_declare

EXTENSION = ".accm"


def _host_op_check(op: str):
    """check(attrs, inputs, out) for a numpy step of graph op `op`: the op's own attribute checks
    and type inference on the step's inputs must give as many elements as the output buffer."""
    def check(attrs, inputs, out):
        # a constant goes in as a view: Node.const marks its array read-only, the module's stays as is
        ins = [Node.const(a.view()) if isinstance(a, np.ndarray) else Node.input(f"p{k}", a[0], a[1])
               for k, a in enumerate(inputs)]
        t = Node(op, ins, attrs, name="step").type
        if math.prod(t.shape) != math.prod(out[0]):
            return f"gives {t.dtype}{list(t.shape)}, the output buffer is {out[1]}{list(out[0])}"
        return None
    return check


def _register_graph_op(opdef: OpDef) -> None:
    """Each declared op's reference is a host op, also for ops declared after this import."""
    if opdef.impl is not None and opdef.name not in ("input", "const", "fused"):
        register_host_op(opdef.name, opdef.impl, _host_op_check(opdef.name))


on_declare(_register_graph_op)


class CompiledModule(ModuleImage):
    """A compiled model (see module doc). `meta` holds the build reports: compile_s, passes,
    memory (planned/naive activation bytes), partition (per-op target and reason), fallbacks."""

    @classmethod
    def load(cls, path: str | Path, config: AccelConfig | str | None = None) -> "CompiledModule":
        cfg = None if config is None else resolve_config(config)
        return super().load(path, cfg)

    def executor(self, driver="fsim", **kw) -> Executor:
        return Executor(self, driver=driver, **kw)

    def run(self, inputs, driver="fsim", **kw):
        """(outputs by name, profile rows) of one run on `driver`."""
        with Executor(self, driver=driver, **kw) as ex:
            outs = ex.run(inputs)
            return outs, ex.profile

    def summary(self) -> str:
        """Build reports as text; a loaded file's `meta` is free-form data, so a report it got wrong
        is left out rather than failing (the module itself was checked on load)."""
        try:
            return self._summary()
        except (TypeError, KeyError, ValueError, ZeroDivisionError, AttributeError):
            return repr(self)

    def _summary(self) -> str:
        m = self.meta
        lines = [repr(self)]
        if self.target_versions:
            lines.append("plug-in targets: " + ", ".join(f"{t} {v}" for t, v in sorted(self.target_versions.items())))
        if self.config is not None:
            c = self.config
            lines.append(f"config {c.digest()}: {c.batch}x{c.block_in}x{c.block_out}, {c.macs_per_cycle} MACs/cycle "
                         f"at {c.clock_mhz:g} MHz")
        mem = m.get("memory")
        if mem:
            lines.append(f"activations: planned {mem['planned_bytes']} B vs naive {mem['naive_bytes']} B; "
                         f"weights {mem['constant_bytes']} B; DRAM image {self.dram_bytes} B")
        macs = m.get("macs")
        if macs:
            total = macs["accel"] + macs["cpu"]
            lines.append(f"MACs: {total} total, {macs['accel']} offloaded ({macs['accel'] / total:.1%})" if total else
                         "MACs: none")
        for f in m.get("fallbacks", []):
            lines.append(f"fallback: {f}")
        if "compile_s" in m:
            lines.append(f"compiled in {m['compile_s']:.2f} s")
        return "\n".join(lines)


__all__ = ["CompiledModule", "ModuleFormatError", "EXTENSION", "format_profile", "profile_summary"]
