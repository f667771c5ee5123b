"""build_model for the GPU targets ("opencl", "cuda"): each fused group becomes one GPU kernel.

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

from .graph.ir import Graph, Node
from .graph_build import KernelDeclined, Builder, _Kernels, _library_form, kernel_symbol
from host_runtime.executor import Step

log = logging.getLogger(__name__)


class GpuKernels(_Kernels):
    """Fused bodies composed from the library's GPU implementations -> GpuKernel (source text)."""
    kind = "cuda"

    def __init__(self, target: str, check: bool = True, tune=None):
        super().__init__()
        self.gpu_target = target
        self.check = check
        self.built: dict = {}
        self.tuner = None
        self.tuning: dict[str, dict] = {}
        if tune and target == "opencl":
            from .ops.gpu_tune import GpuTuner
            self.tuner = GpuTuner(None if tune is True else tune)
        elif tune:
            log.warning("--tune: GPU kernels for %s are timed on a device of that kind; none here, defaults kept",
                        target)

    def compile_gpu(self, body: Graph, consts: dict, symbol_hint: str):
        """(symbol, args, GpuKernel) for the body; KernelDeclined says why there is none."""
        from . import ops  # noqa: F401 - fills the registry, GPU implementations included
        args, out, anchor, key = self.traced(body, consts)
        hit = self.built.get(key)
        if hit is None:
            sym = kernel_symbol("g", len(self.built), symbol_hint)
            try:
                from .codegen.opencl import build_gpu
                from .ops.gpu import schedule_gpu, schedule_kind
                params = [t for t, _ in args] + [out]
                if self.tuner is not None and anchor.schedule is schedule_gpu:
                    k, rec = self.tuner.best(self.tuner.key(repr(key)), schedule_kind([out]), lambda knobs: build_gpu(
                        schedule_gpu([out], knobs), params, self.gpu_target, name=sym))
                    self.tuning[sym] = {"knobs": rec["knobs"], "seconds": rec["seconds"],
                                        "candidates": len(rec.get("trials", []))}
                else:
                    k = build_gpu(anchor.schedule([out]), params, self.gpu_target, name=sym)
                if self.check:
                    _check_locally(k)
            except Exception as e:  # noqa: BLE001 - a schedule or back end that fails declines with why
                raise KernelDeclined(f"GPU kernel failed to build: {type(e).__name__}: {str(e)[:300]}") from None
            hit = self.built[key] = (sym, k)
        return hit[0], [src for _, src in args], hit[1]


def _check_locally(k) -> None:
    """Compile the kernel with this host's OpenCL (PoCL here) when there is one: a kernel the
    driver refuses declines at build time, not at run time. PTX is checked by ptxas in tests."""
    if k.lang != "opencl":
        return
    try:
        from host_runtime.gpu import GpuError, open_device
        dev = open_device("opencl")
    except Exception:  # noqa: BLE001 - no OpenCL here: the device where the model runs compiles it
        return
    try:
        dev.kernel(k.source, k.name)
    except GpuError:
        raise


class GpuBuilder(Builder):
    def __init__(self, graph, cfg, true_macs, progress=None, tune=None, gpu_target: str = "opencl"):
        super().__init__(graph, cfg, true_macs, progress)
        self.gpu_target = gpu_target
        self.gpu = GpuKernels(gpu_target, tune=tune)
        self.tuning = self.gpu.tuning
        self.on_cpu: dict[str, str] = {}    # op name -> why it has no GPU kernel

    def cpu_body(self, name: str, body: Graph, outer: list, out_tid: int) -> None:
        ops = body.ops
        label = "+".join(o.op for o in ops)
        if len(ops) == 1 and ops[0].op in ("pack", "unpack"):
            super().cpu_body(name, body, outer, out_tid)
            return
        consts = {k: o.value for k, o in enumerate(outer) if isinstance(o, Node) and o.is_const}
        try:
            sym, srcs, k = self.gpu.compile_gpu(_library_form(body), consts, name)
        except KernelDeclined as why:
            if len(ops) > 1:
                log.info("%s: group %s split into its ops for the GPU: %s", name, label, why)
                self.split_body(name, body, outer, out_tid)
                return
            reason = f"no GPU kernel: {why}"
            self.on_cpu[ops[0].name] = reason
            self.cpu_reason[ops[0].name] = reason
            self.fallbacks.append(f"{name} ({label}) runs on the CPU: {reason}")
            log.info("%s (%s) runs on the CPU: %s", name, label, reason)
            super().cpu_body(name, body, outer, out_tid)
            return
        args = []
        for kind, ref in srcs:
            args.append(("c", self.const_name(ref, name)) if kind == "c" else ("t", self.tensor_of(outer[ref])))
        macs = sum(self.macs_of(o) for o in ops)
        self.steps.append(Step(name, "gpu", label, [a[1] for a in args if a[0] == "t"], out_tid, args, k.name,
                               k.to_attrs(), macs=macs))

    def explained(self, graph_in: Graph) -> dict:
        rows = []
        for n in self.g.ops:
            for o in (n.attrs["body"].ops if n.op == "fused" else [n]):
                why = self.on_cpu.get(o.name)
                rows.append({"name": o.name, "op": o.op, "origin": o.origin, "target": "cpu" if why else "gpu",
                             "reason": f"{o.origin or o.op} '{o.name}': " + (
                                 f"runs on the CPU: {why}" if why else f"compiled for --target {self.gpu_target}"),
                             "kind": "fallback" if why else "gpu"})
        seen = {r["name"] for r in rows}
        folded = [{"name": n.name, "op": n.origin or n.op} for n in graph_in.ops if n.name not in seen]
        return {"partition": rows, "folded": folded}


__all__ = ["GpuBuilder", "GpuKernels"]
