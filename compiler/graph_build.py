"""build_model: an ONNX model (or graph IR) -> CompiledModule for one target (like relay.build).

1. import and optimize (compiler.graph.passes.PIPELINE) as the target asks (Target.graph_options):
   float for "cpu" and the GPU targets (int8 when the model is QDQ); for "accel" quantized
   (calibration samples, or a QDQ model's scales), partitioned, packed into the accelerator's
   layouts, fused, memory-planned.
2. lay out one DRAM arena: the memory plan's activation buffers, then what each target places
   there (weights, instruction programs, micro-op kernels, scratch buffers inside fused groups).
3. per graph node, its target (node.target, set by the partition; else the build's target)
   appends the steps that compute it: compiler.targets holds every target-specific part, this
   module only the builder services they call (tensors, scratch, constants, steps, fallbacks and
   the --explain rows). A target that gives a group up runs it on the CPU target, the reason
   kept in meta['fallbacks'] and the explain rows.
"""
from __future__ import annotations

import hashlib
import logging
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np

from accel.isa import AccelConfig, resolve_config
from host_runtime import Device
from host_runtime.executor import KernelSource, Step, TensorSpec
from host_runtime.memory import Buffer, DeviceMemory

from .errors import TargetError
from .frontend import from_onnx
from .graph.ir import Graph, Node
from .graph.passes import GraphOptions, optimize
from .graph.passes.partition import bare_reason
from .module import CompiledModule
from .targets import BuildError, Target, get_target, node_macs, target_names

log = logging.getLogger(__name__)

#: the built-in targets (compiler.targets.target_names() lists every registered one)
TARGETS = target_names()
#: DRAM reserved while building (the module records only what it uses)
BUILD_DRAM_BYTES = 1 << 30
#: the target a node runs on when every other one gives it up
FALLBACK_TARGET = "cpu"


def _true_macs(graph: Graph) -> dict[str, int]:
    """MACs by node name in the imported graph (before channel padding)."""
    return {n.name: node_macs(n) for n in graph.ops if node_macs(n)}


class Builder:
    """The services every target lowers into: tensors and their DRAM, scratch, constants, steps,
    fallbacks and the --explain rows; per node it calls the node's target."""

    def __init__(self, graph: Graph, cfg: AccelConfig | None, true_macs: dict[str, int], progress=None,
                 target: Target | None = None, tune=None, target_options: dict | None = None):
        self.g, self.cfg, self.true_macs, self.progress = graph, cfg, true_macs, progress
        self.target_options = dict(target_options or {})   # the build's own target's (Target.build_options)
        self.target_meta: dict = {}   # module meta entries a target adds (its link() at the latest)
        self.primary = target or get_target(FALLBACK_TARGET)
        self.tune = tune   # for the build's own target only
        self.tuning: dict[str, dict] = {}   # meta['tuning']: per layer or kernel what tuning chose
        if cfg is not None:
            self.dev = Device(cfg, driver=None, dram_bytes=min(BUILD_DRAM_BYTES, 1 << cfg.dram_addr_width))
            self.mem = self.dev.memory
            sizes = [cfg.inp_elem_bytes, cfg.wgt_elem_bytes, cfg.acc_elem_bytes, cfg.out_elem_bytes, 64]
            self.align = math.lcm(*sizes)
        else:
            self.dev, self.mem, self.align = None, DeviceMemory(BUILD_DRAM_BYTES), 64
        self.tensors: list[TensorSpec] = []
        self.tbuf: list = []  # tensor id -> Buffer
        self.data_bufs: set[int] = set()  # addresses of buffers whose bytes go into the image
        self.tid: dict[int, int] = {}  # id(graph node) -> tensor id
        self.steps: list[Step] = []
        self.consts: dict[str, np.ndarray] = {}
        self._const_names: dict[tuple, str] = {}   # (dtype, shape, digest) -> name in consts
        self.fallbacks: list[str] = []
        # why an op runs on the CPU (partition's reason, or a target that gave it up): step notes
        self.cpu_reason = {d.name: bare_reason(d.name, d.reason) for d in graph.meta.get("partition", [])
                           if d.target == FALLBACK_TARGET and d.reason}
        self.declined: dict[str, dict] = {}   # op name -> its --explain row after a target gave it up
        self.target_state: dict[str, dict] = {}
        self.used: dict[str, Target] = {}
        self.scratch_bytes = 0
        # what the targets' link() hands over: LLVM kernels for the module, their host, their count
        self.kernel_sources: list[KernelSource] = []
        self.kernel_host: dict | None = None
        self.kernel_count = 0
        self.target(self.primary.name)

    def target(self, name: str) -> Target:
        """The registered target `name`, prepared for this build on first use."""
        t = self.used.get(name)
        if t is None:
            t = self.used[name] = get_target(name)
            t.prepare(self, self.tune if t is self.primary else None)
        return t

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
                off = plan.offsets.get(k, 0)
                if off:   # a slice of an in-place concat's buffer (plan_memory)
                    buf = Buffer(self.mem, buf.addr + off, n.type.nbytes, f"{buf.name}+{off}")
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
        """The name of a step's constant argument; equal arrays share one (an unrolled LSTM's steps
        each prepacked R again: 62 copies that fell out of cache, each GEMV 4x slower)."""
        arr = np.ascontiguousarray(arr)
        key = (arr.dtype.str, arr.shape, hashlib.sha1(arr.tobytes()).digest())
        name = self._const_names.get(key)
        if name is None:
            name = self._const_names[key] = f"{len(self.consts)}:{hint}"
            self.consts[name] = arr
        return name

    # ---- steps --------------------------------------------------------------------------------
    def macs_of(self, n: Node) -> int:
        return self.true_macs.get(n.name, node_macs(n)) if node_macs(n) else 0

    def lower(self) -> None:
        self.plan_tensors()
        ops = self.g.ops
        plan = self.g.meta.get("memory_plan")
        elided = plan.elided if plan is not None else set()
        for k, n in enumerate(ops):
            if self.progress:
                self.progress("lower", k, len(ops))
            if n.name in elided:   # a concat its producers wrote in place (plan_memory)
                continue
            self.target(n.target or self.primary.name).lower(self, n)
        if self.progress:
            self.progress("lower", len(ops), len(ops))

    def why_cpu(self, ops: list) -> str:
        """The reason the first of `ops` that has one runs on the CPU ('' if none): a step's note."""
        return next((self.cpu_reason[o.name] for o in ops if o.name in self.cpu_reason), "")

    def tensor_of(self, o) -> int:
        """The tensor id of a graph node (constants get one on first use) or of a tensor id."""
        if isinstance(o, int):
            return o
        if o.is_const:
            return self.const_tensor(o)
        return self.tid[id(o)]

    def simple_step(self, name: str, op: Node, outer: list, out_tid: int, kind: str, note: str) -> None:
        """A step the runtime runs by the op's name (kind 'numpy': the graph reference; 'native')."""
        args = []
        for o in outer:
            if isinstance(o, Node) and o.is_const:
                args.append(("c", self.const_name(o.value, name)))
            else:
                args.append(("t", self.tensor_of(o)))
        attrs = dict(op.attrs)
        self.steps.append(Step(name, kind, op.op, [a[1] for a in args if a[0] == "t"], out_tid, args, None, attrs,
                               macs=self.macs_of(op), note=note))

    def buf(self, o) -> object:
        """The DRAM buffer of a tensor (graph node or tensor id)."""
        return self.tbuf[self.tensor_of(o)]

    def weight_buf(self, arr: np.ndarray, align: int, name: str):
        """A constant array placed in the module's DRAM image."""
        buf = self.mem.alloc_array(arr, align=align, name=name)
        self.data_bufs.add(buf.addr)
        return buf

    # ---- services for targets -----------------------------------------------------------------
    def option(self, name: str):
        """The build's own target's option `name`: as build_model's target_options set it, else the
        target's default (Target.build_options)."""
        return self.target_options.get(name, self.primary.build_options[name])

    def state(self, target: str) -> dict:
        """Per-build state of a target (kernel caches, shared constants)."""
        return self.target_state.setdefault(target, {})

    def decline(self, op: Node, kind: str, row_reason: str, note: str) -> None:
        """Record that `op` runs on the fallback target (the CPU) after all: its --explain row (kind,
        sentence) and its step note."""
        self.declined[op.name] = {"target": get_target(FALLBACK_TARGET).label, "kind": kind, "reason": row_reason}
        self.cpu_reason[op.name] = note

    def fallback_body(self, name: str, body: Graph, outer: list, out_tid: int) -> None:
        """Steps computing `body` on the CPU (a target's fallback when it cannot take a group)."""
        self.target(FALLBACK_TARGET).lower_body(self, name, body, outer, out_tid)

    # ---- the module ---------------------------------------------------------------------------
    def explained(self, graph_in: Graph) -> dict:
        """meta['partition']: per op its target and why (partition's decision, a target that gave
        the op up, or the build's own target); meta['folded']: imported ops the passes folded away."""
        rows = []
        for d in self.g.meta.get("partition", []):
            row = {"name": d.name, "op": d.op, "origin": d.origin, "target": d.target, "reason": d.reason,
                   "kind": d.kind}
            row.update(self.declined.get(d.name, {}))
            rows.append(row)
        if not rows:   # no partition ran: every op went to the build's target
            for n in self.g.ops:
                for o in (n.attrs["body"].ops if n.op == "fused" else [n]):
                    row = {"name": o.name, "op": o.op, "origin": o.origin, **self.primary.placed_row(o)}
                    row.update(self.declined.get(o.name, {}))
                    rows.append(row)
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
        for t in list(self.used.values()):
            t.link(self)
        kernels = self.kernel_sources
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
            "kernels": self.kernel_count,
            **self.target_meta,
            **extra_meta,
        }
        return CompiledModule(name, target, self.cfg, dram_bytes, segments, self.tensors, inputs, outputs, self.steps,
                              self.consts, kernels, self.kernel_host, meta)


def _dequant_shift(o: Node):
    n = o
    if n.op == "fused":
        n = n.attrs["body"].outputs[0]
    return n.attrs["shift"] if n.op == "dequantize" else None


def _load(model, shapes) -> Graph:
    if isinstance(model, Graph):
        return model
    return from_onnx(model, shapes=shapes)


def _random_calibration(graph: Graph, n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in graph.inputs} for _ in range(n)]


def build_model(model, target: str = "accel", config: AccelConfig | str | None = None, *,
                calibration: list | None = None, shapes: dict | None = None, name: str | None = None,
                fuse: bool = True, force_target: dict | None = None, tune: bool | str | Path | None = None,
                progress: Callable[[str, int, int], None] | None = None,
                target_options: dict | None = None) -> CompiledModule:
    """Compile `model` (ONNX path, bytes, ModelProto, or a compiler.graph Graph) for `target`
    (a name from compiler.targets.target_names()).

    target "accel": int8 on the accelerator of `config` (preset name, JSON path or AccelConfig;
    default "default") with CPU fallback; calibration is a list of feeds (dicts by input name) for
    the int8 scales; a QDQ model brings its own; without either, seeded random normal inputs are
    used (and meta['warnings'] says so). target "cpu" (and "opencl", "cuda"): float32 (int8 for
    QDQ models) on this host's CPU (or a GPU); `config` is recorded if given. tune: True or a JSON
    tuning-log path measures the best few tilings of each accelerator conv/dense on the timing
    model and keeps the fastest (compiler.accel.tune; the log makes a rebuild a lookup);
    meta['tuning'] lists the choices. progress(stage, k, n) reports long work. target_options: the
    target's own build options (its Target.build_options, with their defaults; accel:
    resident_weights=True, dense layers and one-chunk convs whose weights fit the weight buffer
    keep them there across inferences, meta['resident_weights'] lists them)."""
    t0 = time.perf_counter()
    primary = get_target(target)
    unknown = sorted(set(target_options or {}) - set(primary.build_options))
    if unknown:
        raise TargetError(f"target {primary.name!r}: unknown build option(s) {', '.join(unknown)}; its options are "
                          f"{', '.join(sorted(primary.build_options)) or 'none'}")
    if progress:
        progress("import", 0, 1)
    g = _load(model, shapes)
    true_macs = _true_macs(g)
    warnings: list[str] = []
    cfg = resolve_config(config) if config is not None or primary.needs_config else None
    request = {"cfg": cfg, "calibration": calibration, "has_qdq": any(n.op == "dequantize_linear" for n in g.nodes),
               "force_target": force_target, "fuse": fuse, "warnings": warnings,
               "random_calibration": lambda n: _random_calibration(g, n),
               "target_options": {**primary.build_options, **(target_options or {})}}
    opts = GraphOptions(**primary.graph_options(request))
    if progress:
        progress("optimize", 0, 1)
    q = optimize(g, opts)
    dev_cfg = cfg if primary.needs_config else None
    b = Builder(q, dev_cfg, true_macs, progress, primary, tune, target_options)
    b.lower()
    mod = b.finish(name or g.name, primary.module_target or primary.name, g, t0,
                   {"warnings": warnings, "graph_ops": len(q.ops), "tuning": b.tuning})
    if cfg is not None and dev_cfg is None:
        mod.config = cfg
    mod.graph = q  # the optimized graph (not saved; for inspection and reference runs)
    log.info("built %r in %.2f s", mod, mod.meta["compile_s"])
    return mod


__all__ = ["build_model", "Builder", "BuildError", "TARGETS", "node_macs"]
