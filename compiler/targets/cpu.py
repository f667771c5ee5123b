"""The CPU target: every node can run here (the partition's fallback). Each fused group becomes
one kernel: the group's ops composed as tensor expressions from the operator library
(compiler.ops), scheduled by the group's anchor op, lowered to LLVM IR. The module carries the IR
(and each kernel's parameter shapes), never machine code: the runtime verifies it and compiles it
where the module runs (host_runtime.kernel_cache, docs/trust.md); the build checks each kernel
passes that verifier and compiles here. When a group has no compiled form its ops become separate
steps, and an op with no kernel falls back to the graph IR's NumPy reference (kind 'numpy', with
the reason); pack/unpack (the accelerator's blocked layout) are kernels of their own (OPAQUE to
fusion); without a kernel they are the runtime's own (kind 'native').
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

import llvmlite.binding as llvm
import numpy as np

from host_runtime.executor import KernelSource, Step
from host_runtime.kernel_cache import compile_ir, verify_ir

from .. import te
from ..accel.depthwise_cost import cpu_depthwise_seconds, is_depthwise
from ..autotune import CpuTuner
from ..build import build, parse_target
from ..errors import CompilerError
from ..graph.ir import Graph, Node, format_graph
from ..graph.ops import Pattern, get_op
from ..ops.cpu import schedule_config
from ..ops.registry import normalize_attrs, select
from .base import PlacementContext, Target, register_target, single_body, write_source

if TYPE_CHECKING:
    from ..graph_build import Builder

log = logging.getLogger(__name__)

#: ops the runtime can execute itself (layout conversions at the accelerator boundary), where no
#: kernel compiles for them
NATIVE_OPS = ("pack", "unpack")


class KernelDeclined(Exception):
    """A group has no compiled form (an op the library lacks, or a build failure); says why."""


def kernel_symbol(prefix: str, n: int, hint: str) -> str:
    """The n-th kernel's exported name: kit_<prefix><n>_ and the layer's name in identifier characters
    (the trust check accepts only kit_ functions)."""
    return f"kit_{prefix}{n}_{''.join(c if c.isascii() and c.isalnum() else '_' for c in hint)[:40]}"


class Kernels:
    """Composes fused groups from the operator library into verified LLVM IR modules."""

    kind = "llvm"   # the operator library's target kind the bodies are composed from

    def __init__(self, cpu_tuner: CpuTuner | None = None):
        self.cache: dict = {}
        self.sources: list[KernelSource] = []
        self._target = None
        self.cpu_tuner = cpu_tuner   # chooses each kernel's schedule configuration (compiler.autotune)

    def target(self):
        if self._target is None:
            self._target = parse_target("llvm")
        return self._target

    def trace(self, body: Graph, consts: dict[int, np.ndarray]):
        """te tensors for the body: ([(placeholder, ("p", k) | ("c", array))], output, anchor impl)."""
        params = {id(p): k for k, p in enumerate(body.inputs)}
        env, args, ph = {}, [], {}
        anchor, anchor_pattern = None, -1
        for n in body.ops:
            shapes = [tuple(i.shape) for i in n.inputs]
            dtypes = [i.dtype for i in n.inputs]
            try:
                attrs = normalize_attrs(n.op, n.attrs)
                impl = select(n.op, self.kind, shapes, dtypes, attrs)
            except CompilerError as e:
                raise KernelDeclined(str(e)) from None
            call_attrs = dict(attrs)
            ins = []
            for k, i in enumerate(n.inputs):
                if id(i) in env:
                    ins.append(env[id(i)])
                    continue
                p = params[id(i)]
                if p in consts:
                    arr = consts[p]
                    if k in impl.prepack:
                        arr, extra = impl.prepack[k](arr, shapes, dtypes, attrs)
                        call_attrs.update(extra)
                    arr = np.ascontiguousarray(arr)
                    t = te.placeholder(arr.shape, str(arr.dtype), f"c{len(args)}")
                    args.append((t, ("c", arr)))
                    ins.append(t)
                else:
                    if p not in ph:
                        ph[p] = te.placeholder(i.shape, i.dtype, f"p{p}")
                        args.append((ph[p], ("p", p)))
                    ins.append(ph[p])
            env[id(n)] = impl.compute(*ins, **call_attrs)
            pat = get_op(n.op).pattern
            if pat != Pattern.OPAQUE and pat > anchor_pattern or anchor is None:
                anchor, anchor_pattern = impl, (pat if pat != Pattern.OPAQUE else anchor_pattern)
        out = env[id(body.outputs[0])]
        want = body.outputs[0].type
        if tuple(out.shape) != want.shape or str(out.dtype) != want.dtype:
            raise KernelDeclined(f"library compute gives {out.dtype}{list(out.shape)}, the graph says {want}")
        return args, out, anchor

    def traced(self, body: Graph, consts: dict[int, np.ndarray]):
        """(args, out, anchor, key): the body composed from library implementations, and its
        signature, the key under which one kernel serves every group like it; KernelDeclined says
        why it cannot be composed."""
        try:
            args, out, anchor = self.trace(body, consts)
        except KernelDeclined:
            raise
        except Exception as e:  # noqa: BLE001 - any failure of composition declines with its reason
            raise KernelDeclined(f"{type(e).__name__}: {e}") from None
        key = (format_graph(body, canonical=True), tuple(sorted(consts)),
               tuple((tuple(t.shape), str(t.dtype)) for t, _ in args))
        return args, out, anchor, key

    def compile(self, body: Graph, consts: dict[int, np.ndarray], symbol_hint: str):
        """(symbol, args) for the body, compiling once per distinct signature, with the schedule
        configuration the tuner chose (tuning log or measured); the heuristics if that one fails."""
        cfg = self.cpu_tuner.config_for(body, consts, self) if self.cpu_tuner is not None else {}
        if cfg:
            try:
                with schedule_config(cfg):
                    return self._compile(body, consts, symbol_hint)
            except KernelDeclined as why:
                log.warning("%s: tuned schedule %s failed (%s); heuristic schedule used", symbol_hint, cfg, why)
                self.cpu_tuner.forget(body, consts)
        return self._compile(body, consts, symbol_hint)

    def _compile(self, body: Graph, consts: dict[int, np.ndarray], symbol_hint: str):
        args, out, anchor, key = self.traced(body, consts)
        sym = self.cache.get(key)
        if sym is None:
            sym = kernel_symbol("k", len(self.cache), symbol_hint)
            try:
                sch = anchor.schedule([out])
                mod = build(sch, [t for t, _ in args] + [out], target="llvm", name=sym)
                ir = mod.get_source("ll")
                compile_ir(verify_ir(ir, f"kernel {sym}"))   # what the runtime will accept and compile
            except Exception as e:  # noqa: BLE001
                raise KernelDeclined(f"compilation failed: {type(e).__name__}: {e}") from None
            sig = [(tuple(int(d) for d in t.shape), str(t.dtype)) for t, _ in args] + \
                [(tuple(int(d) for d in out.shape), str(out.dtype))]
            self.sources.append(KernelSource(ir, {sym: sig}))
            self.cache[key] = sym
        return sym, [src for _, src in args]

    def link(self) -> list[KernelSource]:
        """The kernels as the module carries them (the runtime builds the library from them)."""
        return list(self.sources)


def library_form(body: Graph) -> Graph:
    """The body as the library takes it: a lone matmul over more than one batch dimension (same
    batch dims on both sides) becomes a 3-d batched matmul on the same bytes (a reshape is free)."""
    ops = body.ops
    if len(ops) == 1 and ops[0].op == "matmul" and ops[0].type.rank > 3:
        a, b = (i.shape for i in ops[0].inputs)
        if a[:-2] == b[:-2] and all(not i.is_const for i in ops[0].inputs):
            batch = math.prod(a[:-2])
            p0 = Node.input("p0", (batch, *a[-2:]), ops[0].inputs[0].dtype)
            p1 = Node.input("p1", (batch, *b[-2:]), ops[0].inputs[1].dtype)
            mm = ops[0].with_inputs([p0, p1])
            return Graph([p0, p1, mm], [p0, p1], [mm], body.output_names, body.name)
    return body


def host_asm(ir_text: str) -> str:
    """This host's assembly of an LLVM IR module (for --emit; the module carries the IR)."""
    tm = parse_target("llvm").target_machine()
    return tm.emit_assembly(llvm.parse_assembly(ir_text))


class CpuTarget(Target):
    """LLVM kernels on the host CPU; takes every node."""

    name = "cpu"
    label = "cpu"
    title = "the CPU"
    kinds = {"target": "compiled with --target cpu"}

    def supports(self, node: Node, ctx: PlacementContext) -> str | None:
        return None

    def graph_options(self, request: dict) -> dict:
        """The base options; the CPU's own builds keep convs in the blocked layout between layers
        (compiler.graph.passes.nchwc_layout); the GPU targets deriving from this one keep NCHW."""
        return {**super().graph_options(request), "nchwc": self.name == "cpu"}

    def placement_kind(self, node: Node, ctx: PlacementContext) -> str:
        return "target"

    def estimate_cost(self, node: Node, ctx: PlacementContext) -> float | None:
        """Seconds of an int8 depthwise conv (compiler.accel.depthwise_cost: the kernel, and the
        unpack/pack when its producer runs elsewhere); no model (None) for other nodes."""
        if not is_depthwise(node):
            return None
        beside = any(ctx.where.get(id(i), self.name) != self.name for i in node.inputs if not i.is_const)
        return cpu_depthwise_seconds(node, beside_accel=beside)

    def kernels(self, b: Builder) -> Kernels:
        """This build's LLVM kernels (made on first use: other targets fall back to the CPU too)."""
        st = b.state("cpu")
        if "kernels" not in st:
            st["kernels"] = Kernels(st.get("tuner"))
        return st["kernels"]

    def prepare(self, b: Builder, tune) -> None:
        """The build's CPU tuner: the tuning log of this ISA (or `tune`'s) looked up, or measured."""
        b.state("cpu")["tuner"] = CpuTuner.for_build(tune)

    def lower_body(self, b: Builder, name: str, body: Graph, outer: list, out_tid: int) -> None:
        """Steps computing `body` with inputs `outer` (graph nodes, or tensor ids) into out_tid."""
        ops = body.ops
        macs = sum(b.macs_of(o) for o in ops)
        label = "+".join(o.op for o in ops)
        consts = {k: o.value for k, o in enumerate(outer) if isinstance(o, Node) and o.is_const}
        try:
            sym, srcs = self.kernels(b).compile(library_form(body), consts, name)
        except KernelDeclined as why:
            if len(ops) > 1:
                log.info("%s: group %s split into its ops: %s", name, label, why)
                self.split_body(b, name, body, outer, out_tid)
                return
            if ops[0].op in NATIVE_OPS:   # the runtime's own conversion
                log.info("%s: %s runs natively: %s", name, label, why)
                b.simple_step(name, ops[0], outer, out_tid, "native", "")
                return
            note = "; ".join(filter(None, (b.why_cpu(ops), f"no compiled kernel: {why}")))
            b.fallbacks.append(f"{name} ({label}) runs on numpy: {why}")
            b.simple_step(name, ops[0], outer, out_tid, "numpy", note)
            return
        args = [("c", b.const_name(ref, name)) if kind == "c" else ("t", b.tensor_of(outer[ref]))
                for kind, ref in srcs]
        b.steps.append(Step(name, "llvm", label, [a[1] for a in args if a[0] == "t"], out_tid, args, sym,
                            macs=macs, note=b.why_cpu(ops)))

    def split_body(self, b: Builder, name: str, body: Graph, outer: list, out_tid: int) -> None:
        """The group's ops one by one (scratch tensors between them), each through lower_body."""
        env = {id(p): o for p, o in zip(body.inputs, outer)}
        last = body.outputs[0]
        for op in body.ops:
            t = out_tid if op is last else b.scratch(op.name, op.type)
            self.lower_body(b, op.name, single_body(op), [env[id(i)] for i in op.inputs], t)
            env[id(op)] = t

    def link(self, b: Builder) -> None:
        k = self.kernels(b)
        b.kernel_sources = k.link()
        b.kernel_count = len(k.cache)
        if k.cpu_tuner is not None:
            b.tuning.update(k.cpu_tuner.report())
        if b.kernel_sources:
            t = k.target()
            b.kernel_host = {"triple": t.triple, "cpu": t.cpu}

    def emit(self, module, out_dir: Path) -> list[Path]:
        """Per CPU kernel module its LLVM IR (kernels<k>.ll) and this host's assembly (kernels<k>.s)."""
        written = []
        for k, ks in enumerate(module.kernels):
            written.append(write_source(out_dir, f"kernels{k}.ll", ks.ir))
            try:
                written.append(write_source(out_dir, f"kernels{k}.s", host_asm(ks.ir)))
            except RuntimeError as e:   # the IR is the module's; assembly is a convenience
                log.warning("kernels%d.s not written: %s", k, e)
        return written


register_target(CpuTarget())

__all__ = ["CpuTarget", "Kernels", "KernelDeclined", "kernel_symbol", "library_form", "NATIVE_OPS"]
