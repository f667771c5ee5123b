"""The GPU targets ("opencl", "cuda"): each fused group becomes one GPU kernel.

The graph is optimized as for "cpu" (float; int8 for QDQ models). Per group the ops are composed
from the operator library's GPU implementations (compiler.ops.gpu, target kind "cuda"), scheduled
by the group's anchor, lowered once and printed as OpenCL C or PTX (compiler.codegen.opencl,
compiler.codegen.nvptx). A group with no GPU form is split into its ops; an op with no GPU kernel
(or whose kernel fails to build) runs on the CPU target's LLVM kernel (or NumPy), and the reason
is recorded like a partition reason: meta['fallbacks'], meta['partition'] rows (target 'cpu',
kind 'fallback'; GPU rows: target and kind 'gpu'), the step's note. Kernels travel as source
text in the step (docs/gpu.md, docs/trust.md).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from host_runtime.executor import Step
from host_runtime.gpu import GpuError, open_device

from ..autotune import TuneOptions
from ..codegen.opencl import build_gpu
from ..errors import CompilerError
from ..graph.ir import Graph, Node
from ..ops.gpu import VEC, schedule_gpu, schedule_kind
from ..ops.gpu_tune import GpuTuneError, GpuTuner
from .base import get_target, register_target, write_source
from .cpu import NATIVE_OPS, CpuTarget, KernelDeclined, Kernels, kernel_symbol, library_form

if TYPE_CHECKING:
    from ..graph_build import Builder

log = logging.getLogger(__name__)


class GpuKernels(Kernels):
    """Fused bodies composed from the library's GPU implementations -> GpuKernel (source text)."""
    kind = "cuda"

    def __init__(self, target: str, check: bool = True, tune=None, tuning: dict | None = None):
        super().__init__()
        self.gpu_target = target
        self.check = check
        self.built: dict = {}
        self.tuner = None
        self.tuning: dict[str, dict] = {} if tuning is None else tuning
        if tune and target == "opencl" and not _has_opencl():
            log.warning("--tune: no OpenCL device here to time kernels on; defaults kept")
        elif isinstance(tune, TuneOptions) and target == "opencl":   # the CPU tuner's options, same meaning
            self.tuner = GpuTuner(tune.log, tune.trials, tune.batch, tune.explore, tune.seed)
        elif tune and target == "opencl":
            self.tuner = GpuTuner(None if tune is True else tune)
        elif tune:
            log.warning("--tune: GPU kernels for %s are timed on a device of that kind; none here, defaults kept",
                        target)

    def compile_gpu(self, body: Graph, consts: dict, symbol_hint: str):
        """(symbol, args, GpuKernel) for the body; KernelDeclined says why there is none."""
        args, out, anchor, key = self.traced(body, consts)
        hit = self.built.get(key)
        if hit is None:
            sym = kernel_symbol("g", len(self.built), symbol_hint)
            try:
                params = [t for t, _ in args] + [out]
                if self.tuner is not None and anchor.schedule is schedule_gpu:
                    k, rec = self.tuner.best(self.tuner.key(repr(key)), schedule_kind([out]),
                                             lambda knobs: self._build(out, params, sym, knobs))
                    self.tuning[sym] = {"knobs": rec["knobs"], "seconds": rec["seconds"],
                                        "candidates": len(rec.get("trials", []))}
                elif anchor.schedule is schedule_gpu:
                    k = self._build(out, params, sym, {})
                else:
                    k = build_gpu(anchor.schedule([out]), params, self.gpu_target, name=sym)
                    if self.check:
                        _check_locally(k)
            except GpuTuneError:
                raise   # the tuning log: one error, not a CPU fallback per kernel
            except Exception as e:  # noqa: BLE001 - a schedule or back end that fails declines with why
                raise KernelDeclined(f"GPU kernel failed to build: {type(e).__name__}: {str(e)[:300]}") from None
            hit = self.built[key] = (sym, k)
        return hit[0], [src for _, src in args], hit[1]


    def _build(self, out, params, sym: str, knobs: dict):
        """The kernel for `knobs`; when its vector loads and stores have no form here (a gather the
        back end cannot print, a vector the local OpenCL compiler refuses), the same schedule with
        scalar accesses (vec=1)."""
        try:
            k = build_gpu(schedule_gpu([out], knobs), params, self.gpu_target, name=sym)
            if self.check:
                _check_locally(k)
            return k
        except (CompilerError, GpuError) as e:   # codegen, lowering or the vectorizer
            if knobs.get("vec", VEC) == 1:
                raise
            log.info("%s: vector accesses declined (%s); scalar loads and stores", sym, str(e)[:200])
        k = build_gpu(schedule_gpu([out], {**knobs, "vec": 1}), params, self.gpu_target, name=sym)
        if self.check:
            _check_locally(k)
        return k


def _has_opencl() -> bool:
    try:
        open_device("opencl")
        return True
    except GpuError:
        return False


def _check_locally(k) -> None:
    """Compile the kernel with this host's OpenCL (PoCL here) when there is one: a kernel the
    driver refuses declines at build time, not at run time. PTX is checked by ptxas in tests."""
    if k.lang != "opencl":
        return
    try:
        dev = open_device("opencl")
    except Exception:  # noqa: BLE001 - no OpenCL here: the device where the model runs compiles it
        return
    try:
        dev.kernel(k.source, k.name)
    except GpuError:
        raise


class GpuTarget(CpuTarget):
    """GPU kernels as source text (OpenCL C or PTX); ops without one run on the CPU target."""

    label = "gpu"
    title = "the GPU"
    module_target = None
    kinds = {}

    def __init__(self, name: str, lang_ext: str):
        self.name = name
        self.ext = lang_ext

    def placement_kind(self, node: Node, ctx) -> str:
        return "gpu"

    def prepare(self, b: Builder, tune) -> None:
        b.state(self.name)["gpu_kernels"] = GpuKernels(self.name, tune=tune, tuning=b.tuning)

    def lower_body(self, b: Builder, name: str, body: Graph, outer: list, out_tid: int) -> None:
        ops = body.ops
        label = "+".join(o.op for o in ops)
        cpu = get_target("cpu")
        if len(ops) == 1 and ops[0].op in NATIVE_OPS:
            cpu.lower_body(b, name, body, outer, out_tid)
            return
        consts = {k: o.value for k, o in enumerate(outer) if isinstance(o, Node) and o.is_const}
        try:
            sym, srcs, k = b.state(self.name)["gpu_kernels"].compile_gpu(library_form(body), consts, name)
        except KernelDeclined as why:
            if len(ops) > 1:
                log.info("%s: group %s split into its ops for the GPU: %s", name, label, why)
                self.split_body(b, name, body, outer, out_tid)
                return
            reason = f"no GPU kernel: {why}"
            o = ops[0]
            b.decline(o, "fallback", f"{o.origin or o.op} '{o.name}': runs on the CPU: {reason}", reason)
            b.fallbacks.append(f"{name} ({label}) runs on the CPU: {reason}")
            log.info("%s (%s) runs on the CPU: %s", name, label, reason)
            b.fallback_body(name, body, outer, out_tid)
            return
        args = [("c", b.const_name(ref, name)) if kind == "c" else ("t", b.tensor_of(outer[ref]))
                for kind, ref in srcs]
        macs = sum(b.macs_of(o) for o in ops)
        b.steps.append(Step(name, "gpu", label, [a[1] for a in args if a[0] == "t"], out_tid, args, k.name,
                            k.to_attrs(), macs=macs))

    def placed_row(self, node: Node) -> dict:
        return {"target": "gpu", "kind": "gpu",
                "reason": f"{node.origin or node.op} '{node.name}': compiled for --target {self.name}"}

    def link(self, b: Builder) -> None:
        """GPU kernels travel in their steps; nothing to link."""

    def emit(self, module, out_dir: Path) -> list[Path]:
        """Per GPU step of this language its kernel: <symbol>.cl (OpenCL C) or <symbol>.ptx."""
        written, seen = [], set()
        lang = "opencl" if self.ext == ".cl" else "ptx"
        for s in module.steps:
            if s.kind != "gpu" or s.symbol in seen or (s.attrs.get("lang") == "opencl") != (lang == "opencl"):
                continue
            seen.add(s.symbol)
            written.append(write_source(out_dir, f"{s.symbol}{self.ext}", s.attrs["source"]))
        return written


register_target(GpuTarget("opencl", ".cl"))
register_target(GpuTarget("cuda", ".ptx"))

__all__ = ["GpuTarget", "GpuKernels"]
