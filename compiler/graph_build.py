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

from accel.isa import INSN_BYTES, AccelConfig, encode_program, resolve_config
from host_runtime.executor import KernelSource, Step, TensorSpec
from host_runtime.kernel_cache import compile_ir, verify_ir

from .errors import CompilerError
from .graph.ir import Graph, Node, format_graph
from .graph.ops import INT8_MAX, Pattern, get_op, int8_min, is_fixed_point, requant_shift
from .module import CompiledModule

log = logging.getLogger(__name__)

TARGETS = ("accel", "cpu", "opencl", "cuda")
#: GPU targets: float like "cpu", each step a GPU kernel where the op has one (compiler.gpu_build)
GPU_TARGETS = ("opencl", "cuda")
#: DRAM reserved while building (the module records only what it uses)
BUILD_DRAM_BYTES = 1 << 30
#: tilings measured per layer when tuning (the analytical ranking's best few)
TUNE_TOP = 6
#: ops the runtime executes itself (layout conversions at the accelerator boundary)
NATIVE_OPS = ("pack", "unpack")
#: ALU ops folded into the requantization clamp of the accelerator operation before them
CLAMP_OPS = ("relu", "clip")


class BuildError(CompilerError):
    """A model cannot be built for the target (bad target, missing calibration, link failure)."""


# ---- MAC accounting ----------------------------------------------------------------------------
def node_macs(n: Node) -> int:
    """Multiply-accumulates of a GEMM-like node (padded channels included for packed layouts)."""
    if n.op in ("conv2d", "qconv2d"):
        w = n.inputs[1].shape
        if n.op == "qconv2d" and n.attrs["layout"] == "NCHWnc":
            return math.prod(n.shape) * w[1] * w[2] * w[3] * w[5]
        return math.prod(n.shape) * math.prod(w[1:])
    if n.op in ("dense", "qdense"):
        w = n.inputs[1].shape
        if n.op == "qdense" and n.attrs["layout"] == "NCnc":
            return math.prod(n.shape) * w[1] * w[3]
        return math.prod(n.shape) * w[1]
    if n.op == "matmul":
        return math.prod(n.shape) * n.inputs[0].shape[-1]
    return 0


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


def _clamp(n: Node, lo: int, hi: int) -> tuple[int, int]:
    if n.op == "relu":
        return max(lo, 0), hi
    a = n.attrs
    if a["min"] is not None:
        lo = max(lo, math.ceil(a["min"]))
    if a["max"] is not None:
        hi = min(hi, math.floor(a["max"]))
    return lo, hi


class _Builder:
    def __init__(self, graph: Graph, cfg: AccelConfig | None, true_macs: dict[str, int], progress=None,
                 tune=None):
        self.g, self.cfg, self.true_macs, self.progress = graph, cfg, true_macs, progress
        self.tune = tune  # None: analytical tilings; True or a tuning-log path: measured on tsim
        self.tuning: dict[str, dict] = {}
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
        self.lowering_failed: dict[str, str] = {}   # op name -> why its accelerator lowering failed
        self.ident = None
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
                self.lower_accel(n)
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

    # accelerator ----------------------------------------------------------------------------------
    def lower_accel(self, n: Node) -> None:
        body = n.attrs["body"] if n.op == "fused" else _single_body(n)
        env = {id(p): o for p, o in zip(body.inputs, n.inputs)}
        users = body.users()
        ops = body.ops
        last = body.outputs[0]
        i = 0
        while i < len(ops):
            head = ops[i]
            lo, hi = int8_min(head.attrs.get("out_zp", 0)), INT8_MAX
            j = i + 1
            while (j < len(ops) and ops[j].op in CLAMP_OPS and ops[j].inputs[0] is ops[j - 1]
                   and len(users[id(ops[j - 1])]) == 1 and ops[j - 1] is not last):
                lo, hi = _clamp(ops[j], lo, hi)
                j += 1
            if head.op in CLAMP_OPS:
                lo, hi = _clamp(head, lo, hi)
            tail = ops[j - 1]
            if head.op in ("qconv2d", "qdense") and self.try_fused_residual(n, ops, i, j, env, users, lo, hi):
                i = self._fused_end
                continue
            out_tid = self.tid[id(n)] if tail is last else self.scratch(tail.name, tail.type)
            group = ops[i:j]
            try:
                self.emit_accel(head, [env[id(x)] for x in head.inputs], out_tid, lo, hi,
                                "+".join(o.op for o in group), sum(self.macs_of(o) for o in group))
            except CompilerError as e:
                why = str(e)
                self.fallbacks.append(f"{head.name} ({'+'.join(o.op for o in group)}) on the CPU instead of the "
                                      f"accelerator: {why}")
                log.warning("%s: accelerator lowering failed, running on the CPU: %s", head.name, why)
                for o in group:
                    self.lowering_failed[o.name] = why
                    self.cpu_reason[o.name] = f"accelerator lowering failed: {why}"
                params = [Node.input(f"p{k}", x.shape, x.dtype) for k, x in enumerate(head.inputs)]
                ext = [env[id(x)] for x in head.inputs]
                # the ops of this group as a body of their own: head's inputs, then its clamps
                mp = {id(x): p for x, p in zip(head.inputs, params)}
                nodes = list(params)
                for o in group:
                    b = o.with_inputs([mp[id(x)] for x in o.inputs], target="cpu")
                    mp[id(o)] = b
                    nodes.append(b)
                gbody = Graph(nodes, params, [mp[id(tail)]], [tail.name], "fallback")
                self.cpu_body(head.name, gbody, ext, out_tid)
            env[id(tail)] = out_tid
            i = j

    def try_fused_residual(self, n: Node, ops: list, i: int, j: int, env: dict, users: dict, lo: int,
                           hi: int) -> bool:
        """conv/dense (+clamps) followed by a qadd (+clamps) of its result: one accelerator program
        with the add in the epilogue (compiler.accel.conv2d.ResidualAdd). False when the pattern
        is absent or the accelerator declines it (then the ops lower one by one)."""
        from .accel.conv2d import Requant
        body_last = (n.attrs["body"] if n.op == "fused" else _single_body(n)).outputs[0]
        tail = ops[j - 1]
        if j >= len(ops) or ops[j].op != "qadd" or tail is body_last or len(users[id(tail)]) != 1:
            return False
        add = ops[j]
        if sum(x is tail for x in add.inputs) != 1:
            return False
        k = j + 1
        lo2, hi2 = -INT8_MAX, INT8_MAX
        while (k < len(ops) and ops[k].op in CLAMP_OPS and ops[k].inputs[0] is ops[k - 1]
               and len(users[id(ops[k - 1])]) == 1 and ops[k - 1] is not body_last):
            lo2, hi2 = _clamp(ops[k], lo2, hi2)
            k += 1
        other = add.inputs[1] if add.inputs[0] is tail else add.inputs[0]
        at = add.attrs
        if at.get("a_mul") or len(ops[i].inputs) == 4:  # fixed-point scales: the epilogue aligns by shifts only
            return False
        m = max(at["a_shift"], at["b_shift"])
        k_conv, k_other = (m - at["a_shift"], m - at["b_shift"]) if add.inputs[0] is tail else \
            (m - at["b_shift"], m - at["a_shift"])
        rq2 = Requant(m - at["out_shift"], lo2, hi2, True)
        group = ops[i:k]
        end = ops[k - 1]
        out_tid = self.tid[id(n)] if end is body_last else self.scratch(end.name, end.type)
        head = ops[i]
        try:
            self.emit_accel(head, [env[id(x)] for x in head.inputs], out_tid, lo, hi,
                            "+".join(o.op for o in group), sum(self.macs_of(o) for o in group),
                            residual=(env[id(other)], k_conv, k_other, rq2))
        except CompilerError as e:
            log.info("%s: residual add not fused (%s); lowering the ops one by one", head.name, e)
            return False
        env[id(end)] = out_tid
        self._fused_end = k
        return True

    def buf(self, o) -> object:
        return self.tbuf[self.tensor_of(o)]

    def program(self, name: str, emit: Callable) -> tuple[int, int]:
        from accel.isa.errors import AccelError
        s = self.dev.stream()
        try:
            s.emit_preloaded(emit)   # the program's micro-op kernels load first, in one LOAD
            insns = s.finish()
            code = encode_program(insns, self.cfg)
        except AccelError as e:
            if isinstance(e, CompilerError):
                raise
            raise BuildError(f"{name}: {e}") from None
        buf = self.mem.alloc(code.nbytes, align=max(INSN_BYTES, 64), name=f"insns {name}")
        buf.write(code)
        self.data_bufs.add(buf.addr)
        return buf.addr, len(insns)

    def weight_buf(self, arr: np.ndarray, align: int, name: str):
        buf = self.mem.alloc_array(arr, align=align, name=name)
        self.data_bufs.add(buf.addr)
        return buf

    def emit_accel(self, head: Node, ins: list, out_tid: int, lo: int, hi: int, label: str, macs: int,
                   residual: tuple | None = None) -> None:
        from .accel.conv2d import (Requant, ResidualAdd, TilingError, channel_scale_operands, emit_conv2d,
                                   residual_identity)
        from .accel.eltwise import emit_add, identity_weights
        from .accel.layout import pack_bias
        cfg = self.cfg
        out = self.tbuf[out_tid]
        if head.op in ("qconv2d", "qdense"):
            spec = self.gemm_spec(head)
            tiling = self.tiling(spec, residual is not None)
            fused = None
            if residual is not None:
                other, ka, kb, rq2 = residual
                ident = residual_identity(cfg, ka, kb)  # declines kb - ka > 6 before anything is allocated
                fused = ResidualAdd(self.buf(other), self.weight_buf(ident, cfg.wgt_elem_bytes,
                                                                      f"{head.name}.identity"), ka, kb, rq2)
            w = self.weight_buf(ins[1].value, cfg.wgt_elem_bytes, f"{head.name}.wgt")
            at = head.attrs
            bias, zp = ins[2].value, at.get("out_zp", 0)
            if zp and len(ins) == 3 and not is_fixed_point(at) and requant_shift(at) >= 0:
                # (acc + half + zp 2^s) >> s == ((acc + half) >> s) + zp: the zero point rides on the bias
                bias = bias.astype(np.int64) + (zp << requant_shift(at))
                if np.abs(bias).max() >= 1 << 31:
                    raise TilingError(f"{head.name}: bias with the output zero point {zp} does not fit int32")
                bias, zp = bias.astype(np.int32), 0
            b = self.weight_buf(pack_bias(bias, cfg), cfg.acc_elem_bytes, f"{head.name}.bias")
            scales = None
            if len(ins) == 4:  # per-channel multipliers: SCALE operands per channel, then the clamp
                ops = channel_scale_operands(ins[3].value, requant_shift(at), cfg.acc_width)
                scales = self.weight_buf(pack_bias(ops, cfg), cfg.acc_elem_bytes, f"{head.name}.scales")
                rq = Requant(0, lo, hi, zero_point=zp)
            else:
                rq = Requant(requant_shift(at), lo, hi, is_fixed_point(at), at.get("mul", 1), zp)
            x = self.buf(ins[0])
            addr, count = self.program(head.name, lambda s: emit_conv2d(s, spec, tiling, x, w, out, b, rq, fused,
                                                                        scales))
        elif head.op in ("qadd",) + CLAMP_OPS:
            if cfg.block_in != cfg.block_out:
                raise TilingError(f"{head.name}: the accelerator adds packed tensors only when block_in == block_out "
                                  f"({cfg.block_in} != {cfg.block_out})")
            blk = head.shape[-2:]
            if tuple(blk) != (cfg.batch, cfg.block_out):
                raise TilingError(f"{head.name}: packed blocks {list(blk)} are not (batch, block_out)")
            n_entries = math.prod(head.shape) // (cfg.batch * cfg.block_out)
            if self.ident is None:
                self.ident = self.weight_buf(identity_weights(cfg), cfg.wgt_elem_bytes, "identity")
            ident = self.ident
            if head.op == "qadd":
                a, b = self.buf(ins[0]), self.buf(ins[1])
                at = head.attrs
                m = max(at["a_shift"], at["b_shift"])
                ka, kb, rq = m - at["a_shift"], m - at["b_shift"], Requant(m - at["out_shift"], lo, hi, True)
            else:  # a clamp alone: (a + a + 1) >> 1 == a, then the clamp
                a = b = self.buf(ins[0])
                ka, kb, rq = 0, 0, Requant(1, lo, hi, True)
            addr, count = self.program(head.name, lambda s: emit_add(s, n_entries, a, b, out, ident, ka, kb, rq,
                                                                     name=head.name))
        else:
            raise TilingError(f"{head.name}: no accelerator lowering for {head.op}")
        inputs = [self.tensor_of(o) for o in ins if not (isinstance(o, Node) and o.is_const)]
        if residual is not None:
            inputs.append(self.tensor_of(residual[0]))
        self.steps.append(Step(head.name, "accel", label, inputs, out_tid, [], None, {}, addr, count, macs))

    def tiling(self, spec, residual: bool):
        """The layer's tiling: the analytical best, or with `tune` the fastest of the best few on tsim."""
        from .accel.conv2d import plan_conv2d
        if not self.tune:
            return plan_conv2d(spec, self.cfg, 2, residual)
        from .accel.tune import tune_conv2d
        log_path = None if self.tune is True else self.tune
        tiling, record = tune_conv2d(spec, self.cfg, 2, TUNE_TOP, "tsim", log_path, residual)
        self.tuning[spec.name] = {"tiling": tiling.describe(), "cycles": record["cycles"],
                                  "candidates": len(record.get("trials", []))}
        return tiling

    def gemm_spec(self, n: Node):
        from .accel.conv2d import Conv2dSpec, TilingError
        cfg = self.cfg
        x, w = n.inputs[0].shape, n.inputs[1].shape
        if n.op == "qconv2d":
            if n.attrs["layout"] != "NCHWnc":
                raise TilingError(f"{n.name}: qconv2d in layout {n.attrs['layout']} is not packed for the accelerator")
            nb, cb, h, wd, bn, bi = x
            ob, _, kh, kw, bo, _ = w
            pt, pl, pb, pr = n.attrs["pads"]
            spec = Conv2dSpec(nb * bn, cb * bi, h, wd, ob * bo, kh, kw, (pt, pb, pl, pr), tuple(n.attrs["strides"]),
                              n.name)
        else:
            if n.attrs["layout"] != "NCnc":
                raise TilingError(f"{n.name}: qdense in layout {n.attrs['layout']} is not packed for the accelerator")
            nb, kb, bn, bi = x
            ob, _, bo, _ = w
            spec = Conv2dSpec(nb * bn, kb * bi, 1, 1, ob * bo, 1, 1, name=n.name)
        if (bn, bi, bo) != (cfg.batch, cfg.block_in, cfg.block_out):
            raise TilingError(f"{n.name}: packed blocks ({bn}, {bi}, {bo}) differ from the config's "
                              f"({cfg.batch}, {cfg.block_in}, {cfg.block_out})")
        return spec

    # ---- the module ---------------------------------------------------------------------------
    def explained(self, graph_in: Graph) -> dict:
        """meta['partition']: per op its target and why (partition's decision, a failed accelerator
        lowering, or --target cpu); meta['folded']: imported ops the graph passes folded away."""
        rows = []
        for d in self.g.meta.get("partition", []):
            row = {"name": d.name, "op": d.op, "origin": d.origin, "target": d.target, "reason": d.reason,
                   "kind": d.kind}
            if d.name in self.lowering_failed:
                row.update(target="cpu", kind="lowering", reason=f"{d.origin or d.op} '{d.name}': accelerator "
                           f"lowering failed, runs on the CPU: {self.lowering_failed[d.name]}")
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
    if target == "accel" and tune not in (None, False, True):
        from .accel.tune import read_tuning_log
        try:
            read_tuning_log(tune)   # a broken log stops the build (a layer's tiling error falls back)
        except CompilerError as e:
            raise BuildError(str(e)) from None
    if target in GPU_TARGETS:
        from .gpu_build import GpuBuilder
        b = GpuBuilder(q, None, true_macs, progress, tune, gpu_target=target)
    else:
        b = _Builder(q, cfg if target == "accel" else None, true_macs, progress, tune if target == "accel" else None)
    b.lower()
    mod = b.finish(name or g.name, target, g, t0, {"warnings": warnings, "graph_ops": len(q.ops),
                                                   "tuning": b.tuning})
    if cfg is not None and target == "cpu":
        mod.config = cfg
    mod.graph = q  # the optimized graph (not saved; for inspection and reference runs)
    log.info("built %r in %.2f s", mod, mod.meta["compile_s"])
    return mod


__all__ = ["build_model", "BuildError", "TARGETS", "node_macs"]
