"""build_model: an ONNX model (or graph IR) -> CompiledModule, for target "accel" or "cpu" (like relay.build).

1. import and optimize (compiler.graph.passes.PIPELINE): float for "cpu" (int8 when the model
   is QDQ); for "accel" quantized (calibration samples, or a QDQ model's scales), partitioned,
   packed into the accelerator's layouts, fused, memory-planned.
2. lay out one DRAM arena: the memory plan's activation buffers, then per accelerator operation its
   weights/bias and its instruction program (one CommandStream each, so each has its own profile
   row), micro-op kernels, scratch buffers for values inside fused groups.
3. per CPU step one kernel: the fused group's ops composed as tensor expressions from the
   operator library (compiler.ops), scheduled by the group's anchor op, lowered to LLVM IR. The
   module carries the IR (and each kernel's parameter shapes), never machine code: the runtime
   verifies it and compiles it where the module runs (host_runtime.kernel_cache, docs/trust.md);
   the build checks each kernel passes that verifier and compiles here. When a group has no
   compiled form its ops become separate steps, and an op with no kernel falls back to the graph
   IR's NumPy reference (kind 'numpy', with the reason); pack/unpack are the runtime's own.
   An accelerator operation that cannot be lowered (a tiling that does not fit, a shift beyond
   the ALU immediate) runs on the CPU the same way, the reason kept in meta['fallbacks'].
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np

from accel.isa import AccelConfig, resolve_config
from host_runtime.executor import KernelSource, Step, TensorSpec
from host_runtime.kernel_cache import compile_ir, verify_ir

from .errors import CompilerError
from .graph.ir import Graph, Node, format_graph
from .graph.ops import Pattern, get_op
from .module import CompiledModule
from .targets import BuildError, get_target, node_macs

log = logging.getLogger(__name__)

TARGETS = ("accel", "cpu", "opencl", "cuda")
#: GPU targets: float like "cpu", each step a GPU kernel where the op has one (compiler.gpu_build)
GPU_TARGETS = ("opencl", "cuda")
#: DRAM reserved while building (the module records only what it uses)
BUILD_DRAM_BYTES = 1 << 30
#: ops the runtime executes itself (layout conversions at the accelerator boundary)
NATIVE_OPS = ("pack", "unpack")


def _true_macs(graph: Graph) -> dict[str, int]:
    """MACs by node name in the imported graph (before channel padding)."""
    return {n.name: node_macs(n) for n in graph.ops if node_macs(n)}


class KernelDeclined(Exception):
    """A group has no compiled form (an op the library lacks, or a build failure); says why."""


def kernel_symbol(prefix: str, n: int, hint: str) -> str:
    """The n-th kernel's exported name: kit_<prefix><n>_ and the layer's name in identifier characters
    (the trust check accepts only kit_ functions)."""
    return f"kit_{prefix}{n}_{''.join(c if c.isascii() and c.isalnum() else '_' for c in hint)[:40]}"


class _Kernels:
    """Composes fused groups from the operator library into verified LLVM IR modules."""

    kind = "llvm"   # the operator library's target kind the bodies are composed from

    def __init__(self):
        self.cache: dict = {}
        self.sources: list[KernelSource] = []
        self._target = None

    def target(self):
        if self._target is None:
            from .build import parse_target
            self._target = parse_target("llvm")
        return self._target

    def trace(self, body: Graph, consts: dict[int, np.ndarray]):
        """te tensors for the body: ([(placeholder, ("p", k) | ("c", array))], output, anchor impl)."""
        from . import te
        from .ops.registry import normalize_attrs, select
        params = {id(p): k for k, p in enumerate(body.inputs)}
        env, args, ph = {}, [], {}
        anchor, anchor_pattern = None, -1
        for n in body.ops:
            if n.op in NATIVE_OPS:
                raise KernelDeclined(f"{n.op} is done by the runtime (native)")
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
        """(symbol, args) for the body, compiling once per distinct signature."""
        args, out, anchor, key = self.traced(body, consts)
        sym = self.cache.get(key)
        if sym is None:
            sym = kernel_symbol("k", len(self.cache), symbol_hint)
            try:
                from .build import build
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


def _single_body(n: Node) -> Graph:
    params = [Node.input(f"p{k}", i.shape, i.dtype) for k, i in enumerate(n.inputs)]
    b = n.with_inputs(params)
    return Graph(params + [b], params, [b], [n.name], f"single_{n.op}")


def _library_form(body: Graph) -> Graph:
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


class Builder:
    """The services every target lowers into: tensors and their DRAM, scratch, constants, steps,
    fallbacks and the --explain rows; per node it calls the node's target."""

    def __init__(self, graph: Graph, cfg: AccelConfig | None, true_macs: dict[str, int], progress=None):
        self.g, self.cfg, self.true_macs, self.progress = graph, cfg, true_macs, progress
        self.tuning: dict[str, dict] = {}   # meta['tuning']: per layer or kernel what tuning chose
        if cfg is not None:
            from host_runtime import Device
            self.dev = Device(cfg, driver=None, dram_bytes=min(BUILD_DRAM_BYTES, 1 << cfg.dram_addr_width))
            self.mem = self.dev.memory
            sizes = [cfg.inp_elem_bytes, cfg.wgt_elem_bytes, cfg.acc_elem_bytes, cfg.out_elem_bytes, 64]
            self.align = math.lcm(*sizes)
        else:
            from host_runtime.memory import DeviceMemory
            self.dev, self.mem, self.align = None, DeviceMemory(BUILD_DRAM_BYTES), 64
        self.tensors: list[TensorSpec] = []
        self.tbuf: list = []  # tensor id -> Buffer
        self.data_bufs: set[int] = set()  # addresses of buffers whose bytes go into the image
        self.tid: dict[int, int] = {}  # id(graph node) -> tensor id
        self.steps: list[Step] = []
        self.consts: dict[str, np.ndarray] = {}
        self.kernels = _Kernels()
        self.fallbacks: list[str] = []
        # why an op runs on the CPU (partition's reason, or a failed accelerator lowering): step notes
        from .graph.passes.partition import bare_reason
        self.cpu_reason = {d.name: bare_reason(d.name, d.reason) for d in graph.meta.get("partition", [])
                           if d.target == "cpu" and d.reason}
        self.declined: dict[str, dict] = {}   # op name -> its --explain row after a target gave it up
        self.target_state: dict[str, dict] = {}
        self.scratch_bytes = 0

    # ---- tensors ------------------------------------------------------------------------------
    def _add_tensor(self, name: str, t, buf) -> int:
        self.tensors.append(TensorSpec(name, tuple(t.shape), t.dtype, buf.addr))
        self.tbuf.append(buf)
        return len(self.tensors) - 1

    def plan_tensors(self) -> None:
        plan = self.g.meta.get("memory_plan")
        bufs = {}
        if plan is not None:
            for b, size in enumerate(plan.buffers):
                bufs[b] = self.mem.alloc(max(1, size), align=self.align, name=f"activation{b}")
        for k, n in enumerate(self.g.nodes):
            if n.op == "const":
                continue
            if plan is not None:
                buf = bufs[plan.assignment[k]]
            else:
                buf = self.mem.alloc(max(1, n.type.nbytes), align=self.align, name=n.name)
            self.tid[id(n)] = self._add_tensor(n.name, n.type, buf)

    def scratch(self, name: str, t) -> int:
        buf = self.mem.alloc(max(1, t.nbytes), align=self.align, name=f"scratch {name}")
        self.scratch_bytes += t.nbytes
        return self._add_tensor(name, t, buf)

    def const_tensor(self, n: Node) -> int:
        """A constant used where a tensor is expected (a graph output): its bytes go into the image."""
        if id(n) not in self.tid:
            buf = self.mem.alloc_array(n.value, align=self.align, name=f"const {n.name}")
            self.data_bufs.add(buf.addr)
            self.tid[id(n)] = self._add_tensor(n.name, n.type, buf)
        return self.tid[id(n)]

    def const_name(self, arr: np.ndarray, hint: str) -> str:
        name = f"{len(self.consts)}:{hint}"
        self.consts[name] = np.ascontiguousarray(arr)
        return name

    # ---- steps --------------------------------------------------------------------------------
    def macs_of(self, n: Node) -> int:
        return self.true_macs.get(n.name, node_macs(n)) if node_macs(n) else 0

    def lower(self) -> None:
        self.plan_tensors()
        ops = self.g.ops
        for k, n in enumerate(ops):
            if self.progress:
                self.progress("lower", k, len(ops))
            if n.target == "accel" and self.cfg is not None:
                get_target("accel").lower(self, n)
            else:
                self.lower_cpu(n)
        if self.progress:
            self.progress("lower", len(ops), len(ops))

    # CPU ----------------------------------------------------------------------------------------
    def lower_cpu(self, n: Node) -> None:
        body = n.attrs["body"] if n.op == "fused" else _single_body(n)
        ins = list(n.inputs)
        anchor = next((o for o in body.ops if node_macs(o)), None)  # a fused conv is named after the conv
        self.cpu_body(anchor.name if anchor is not None else n.name, body, ins, self.tid[id(n)])

    def cpu_body(self, name: str, body: Graph, outer: list, out_tid: int) -> None:
        """Steps computing `body` with inputs `outer` (graph nodes, or tensor ids) into out_tid."""
        ops = body.ops
        macs = sum(self.macs_of(o) for o in ops)
        label = "+".join(o.op for o in ops)
        if len(ops) == 1 and ops[0].op in NATIVE_OPS:
            self.simple_step(name, ops[0], outer, out_tid, "native", "")
            return
        consts = {k: o.value for k, o in enumerate(outer) if isinstance(o, Node) and o.is_const}
        try:
            sym, srcs = self.kernels.compile(_library_form(body), consts, name)
        except KernelDeclined as why:
            if len(ops) > 1:
                log.info("%s: group %s split into its ops: %s", name, label, why)
                self.split_body(name, body, outer, out_tid)
                return
            note = "; ".join(filter(None, (self._why_cpu(ops), f"no compiled kernel: {why}")))
            self.fallbacks.append(f"{name} ({label}) runs on numpy: {why}")
            self.simple_step(name, ops[0], outer, out_tid, "numpy", note)
            return
        args = []
        for kind, ref in srcs:
            if kind == "c":
                args.append(("c", self.const_name(ref, name)))
            else:
                args.append(("t", self.tensor_of(outer[ref])))
        self.steps.append(Step(name, "llvm", label, [a[1] for a in args if a[0] == "t"], out_tid, args, sym,
                               macs=macs, note=self._why_cpu(ops)))

    def _why_cpu(self, ops: list) -> str:
        """The reason the first of `ops` that has one is kept off the accelerator ('' if none)."""
        return next((self.cpu_reason[o.name] for o in ops if o.name in self.cpu_reason), "")

    def tensor_of(self, o) -> int:
        if isinstance(o, int):
            return o
        if o.is_const:
            return self.const_tensor(o)
        return self.tid[id(o)]

    def simple_step(self, name: str, op: Node, outer: list, out_tid: int, kind: str, note: str) -> None:
        args = []
        for o in outer:
            if isinstance(o, Node) and o.is_const:
                args.append(("c", self.const_name(o.value, name)))
            else:
                args.append(("t", self.tensor_of(o)))
        attrs = dict(op.attrs)
        self.steps.append(Step(name, kind, op.op, [a[1] for a in args if a[0] == "t"], out_tid, args, None, attrs,
                               macs=self.macs_of(op), note=note))

    def split_body(self, name: str, body: Graph, outer: list, out_tid: int) -> None:
        env = {id(p): o for p, o in zip(body.inputs, outer)}
        last = body.outputs[0]
        for op in body.ops:
            t = out_tid if op is last else self.scratch(op.name, op.type)
            self.cpu_body(op.name, _single_body(op), [env[id(i)] for i in op.inputs], t)
            env[id(op)] = t

    def buf(self, o) -> object:
        """The DRAM buffer of a tensor (graph node or tensor id)."""
        return self.tbuf[self.tensor_of(o)]

    def weight_buf(self, arr: np.ndarray, align: int, name: str):
        """A constant array placed in the module's DRAM image."""
        buf = self.mem.alloc_array(arr, align=align, name=name)
        self.data_bufs.add(buf.addr)
        return buf

    # ---- services for targets -----------------------------------------------------------------
    def state(self, target: str) -> dict:
        """Per-build state of a target (kernel caches, shared constants)."""
        return self.target_state.setdefault(target, {})

    def decline(self, op: Node, kind: str, row_reason: str, note: str) -> None:
        """Record that `op` runs on the CPU after all: its --explain row (kind, sentence) and its step note."""
        self.declined[op.name] = {"target": "cpu", "kind": kind, "reason": row_reason}
        self.cpu_reason[op.name] = note

    def fallback_body(self, name: str, body: Graph, outer: list, out_tid: int) -> None:
        """Steps computing `body` on the CPU (a target's fallback when it cannot take a group)."""
        self.cpu_body(name, body, outer, out_tid)

    # ---- the module ---------------------------------------------------------------------------
    def explained(self, graph_in: Graph) -> dict:
        """meta['partition']: per op its target and why (partition's decision, a failed accelerator
        lowering, or --target cpu); meta['folded']: imported ops the graph passes folded away."""
        rows = []
        for d in self.g.meta.get("partition", []):
            row = {"name": d.name, "op": d.op, "origin": d.origin, "target": d.target, "reason": d.reason,
                   "kind": d.kind}
            row.update(self.declined.get(d.name, {}))
            rows.append(row)
        if not rows:   # no partition ran: the CPU target
            for n in self.g.ops:
                for o in (n.attrs["body"].ops if n.op == "fused" else [n]):
                    rows.append({"name": o.name, "op": o.op, "origin": o.origin, "target": "cpu",
                                 "reason": f"{o.origin or o.op} '{o.name}': compiled for --target cpu",
                                 "kind": "target"})
        seen = {r["name"] for r in rows}
        folded = [{"name": n.name, "op": n.origin or n.op} for n in graph_in.ops if n.name not in seen]
        return {"partition": rows, "folded": folded}

    def finish(self, name: str, target: str, graph_in: Graph, compile_t0: float, extra_meta: dict) -> CompiledModule:
        g = self.g
        outputs = []
        for o, oname in zip(g.outputs, g.output_names):
            outputs.append({"name": oname, "tensor": self.tensor_of(o), "shift": _dequant_shift(o)})
        cal = g.meta.get("quantize", {}).get("calibration")
        inputs = [{"name": i.name, "tensor": self.tid[id(i)],
                   "shift": None if cal is None else cal.shifts.get(i.name)} for i in g.inputs]
        if self.progress:
            self.progress("link", 0, 1)
        kernels = self.kernels.link()
        segments = []
        top = 64
        for b in self.mem.buffers():
            top = max(top, b.end)
            if b.addr in self.data_bufs or (b.name or "").startswith("uops"):
                segments.append((b.addr, self.mem.array[b.addr:b.end].tobytes()))
        dram_bytes = -(-top // 4096) * 4096
        plan = g.meta.get("memory_plan")
        acc_macs = sum(s.macs for s in self.steps if s.kind == "accel")
        cpu_macs = sum(s.macs for s in self.steps if s.kind != "accel")
        t = self.kernels.target() if kernels else None
        meta = {
            "compile_s": time.perf_counter() - compile_t0,
            "passes": [{k: v for k, v in p.items()} for p in g.meta.get("passes", [])],
            "memory": None if plan is None else {
                "planned_bytes": plan.planned_bytes, "naive_bytes": plan.naive_bytes,
                "peak_live_bytes": plan.peak_live_bytes, "constant_bytes": plan.constant_bytes,
                "buffers": len(plan.buffers), "scratch_bytes": self.scratch_bytes},
            "macs": {"accel": acc_macs, "cpu": cpu_macs},
            **self.explained(graph_in),
            "fallbacks": self.fallbacks,
            "kernels": len(self.kernels.cache),
            **extra_meta,
        }
        return CompiledModule(name, target, self.cfg, dram_bytes, segments, self.tensors, inputs, outputs, self.steps,
                              self.consts, kernels, None if t is None else {"triple": t.triple, "cpu": t.cpu}, meta)


def _dequant_shift(o: Node):
    n = o
    if n.op == "fused":
        n = n.attrs["body"].outputs[0]
    return n.attrs["shift"] if n.op == "dequantize" else None


def _load(model, shapes) -> Graph:
    if isinstance(model, Graph):
        return model
    from .frontend import from_onnx
    return from_onnx(model, shapes=shapes)


def _random_calibration(graph: Graph, n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in graph.inputs} for _ in range(n)]


def build_model(model, target: str = "accel", config: AccelConfig | str | None = None, *,
                calibration: list | None = None, shapes: dict | None = None, name: str | None = None,
                fuse: bool = True, force_target: dict | None = None, tune: bool | str | Path | None = None,
                progress: Callable[[str, int, int], None] | None = None) -> CompiledModule:
    """Compile `model` (ONNX path, bytes, ModelProto, or a compiler.graph Graph) for `target`.

    target "accel": int8 on the accelerator of `config` (preset name, JSON path or AccelConfig;
    default "default") with CPU fallback; calibration is a list of feeds (dicts by input name) for
    the int8 scales; a QDQ model brings its own; without either, seeded random normal inputs are
    used (and meta['warnings'] says so). target "cpu": float32 (int8 for QDQ models) on this
    host's CPU; `config` is recorded if given. tune: True or a JSON tuning-log path measures the
    best few tilings of each accelerator conv/dense on the timing model and keeps the fastest
    (compiler.accel.tune; the log makes a rebuild a lookup); meta['tuning'] lists the choices.
    progress(stage, k, n) reports long work."""
    from .graph.passes import GraphOptions, optimize
    t0 = time.perf_counter()
    if target not in TARGETS:
        raise BuildError(f"unknown target {target!r}; targets are {', '.join(TARGETS)}")
    if progress:
        progress("import", 0, 1)
    g = _load(model, shapes)
    true_macs = _true_macs(g)
    has_qdq = any(n.op == "dequantize_linear" for n in g.nodes)
    warnings = []
    cfg = None if config is None and target == "cpu" else resolve_config(config)
    if target == "accel":
        samples = calibration
        if not samples and not has_qdq:
            samples = _random_calibration(g, 8)
            warnings.append("calibrated on 8 seeded random normal inputs; pass calibration samples for real data")
        opts = GraphOptions(quantize=True, calibration_samples=samples or None, accel=cfg,
                            force_target=dict(force_target or {}), fuse=fuse)
    else:
        opts = GraphOptions(quantize=has_qdq, calibration_samples=calibration or None, fuse=fuse)
    if progress:
        progress("optimize", 0, 1)
    q = optimize(g, opts)
    if target in GPU_TARGETS:
        from .gpu_build import GpuBuilder
        b = GpuBuilder(q, None, true_macs, progress, tune, gpu_target=target)
    else:
        b = Builder(q, cfg if target == "accel" else None, true_macs, progress)
        if target == "accel":
            get_target("accel").prepare(b, tune)
    b.lower()
    mod = b.finish(name or g.name, target, g, t0, {"warnings": warnings, "graph_ops": len(q.ops),
                                                   "tuning": b.tuning})
    if cfg is not None and target == "cpu":
        mod.config = cfg
    mod.graph = q  # the optimized graph (not saved; for inspection and reference runs)
    log.info("built %r in %.2f s", mod, mod.meta["compile_s"])
    return mod


__all__ = ["build_model", "BuildError", "TARGETS", "node_macs"]
