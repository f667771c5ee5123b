"""Accelerator code generation: walk the final TIR with concrete loop values, emit CommandStream calls.

Loops run here (the accelerator has no branches); on-chip buffers get base entries in their
scope (allocated once per buffer, bump order, checked against the config's depth); intrinsic
calls become load_2d / store_2d / dep_push / dep_pop; a micro-op kernel statement becomes one
push_gemm or push_alu over a kernel recorded from its micro-op loop nest, cached by content on
the Device (so every distinct kernel is stored and loaded once); synchronize() ends the stream.
"""
from __future__ import annotations

import logging

from accel.isa import AluOp, MemType

from ...tir import expr as E
from ...tir.functor import post_order_visit
from ...tir.printer import stmt_str
from ...tir.stmt import Allocate, AttrStmt, Buffer, BufferStore, Evaluate, For, IfThenElse, LetStmt, PrimFunc, SeqStmt
from .env import DEP_POP, DEP_PUSH, LOAD_2D, STORE_2D, UOP, UOP_KERNEL, UOP_LOOP, AccelEnv, LowerError, UopOp

log = logging.getLogger(__name__)

_BIN = {E.Add: lambda a, b: a + b, E.Sub: lambda a, b: a - b, E.Mul: lambda a, b: a * b,
        E.FloorDiv: lambda a, b: a // b, E.FloorMod: lambda a, b: a % b, E.Min: min, E.Max: max,
        E.LT: lambda a, b: a < b, E.LE: lambda a, b: a <= b, E.GT: lambda a, b: a > b,
        E.GE: lambda a, b: a >= b, E.EQ: lambda a, b: a == b, E.NE: lambda a, b: a != b,
        E.And: lambda a, b: a and b, E.Or: lambda a, b: a or b}


def evaluate(e, env: dict) -> int:
    """Integer value of an index expression under concrete loop values."""
    if isinstance(e, E.IntImm):
        return e.value
    if isinstance(e, E.Var):
        try:
            return env[e]
        except KeyError:
            raise LowerError(f"codegen: variable '{e.name}' has no value here") from None
    f = _BIN.get(type(e))
    if f is not None:
        return int(f(evaluate(e.a, env), evaluate(e.b, env)))
    if isinstance(e, E.Not):
        return int(not evaluate(e.a, env))
    if isinstance(e, E.Select):
        return evaluate(e.true_value, env) if evaluate(e.cond, env) else evaluate(e.false_value, env)
    if isinstance(e, E.Cast):
        return evaluate(e.value, env)
    raise LowerError(f"codegen: cannot evaluate `{e}` on the host")


class AccelCodegen:
    """Emits one PrimFunc into a CommandStream. `dram` maps each parameter Buffer to a device
    Buffer (or None for an absent optional operand)."""

    def __init__(self, env: AccelEnv, func: PrimFunc, stream, dram: dict):
        self.env, self.func, self.stream = env, func, stream
        self.dram = {b.data: dram[b] for b in func.params}
        self.sram: dict = {}      # data Var -> base entry
        self.top = {sc: 0 for sc in ("inp_buffer", "wgt_buffer", "acc_buffer")}
        self._kernels: dict = {}  # (node id, free values) -> UopKernel
        self._free: dict = {}     # node id -> free vars of its micro-op nest
        self._text: dict = {}

    # ---- statements -----------------------------------------------------------------------
    def run(self) -> None:
        self.stmt(self.func.body, {})

    def stmt(self, s, env: dict) -> None:
        if isinstance(s, SeqStmt):
            for x in s.seq:
                self.stmt(x, env)
        elif isinstance(s, For):
            lo, n = evaluate(s.min, env), evaluate(s.extent, env)
            for i in range(lo, lo + n):
                env[s.loop_var] = i
                self.stmt(s.body, env)
            env.pop(s.loop_var, None)
        elif isinstance(s, IfThenElse):
            if evaluate(s.condition, env):
                self.stmt(s.then_case, env)
            elif s.else_case is not None:
                self.stmt(s.else_case, env)
        elif isinstance(s, Allocate):
            self.allocate(s.buffer)
            self.stmt(s.body, env)
        elif isinstance(s, LetStmt):
            env[s.var] = evaluate(s.value, env)
            self.stmt(s.body, env)
        elif isinstance(s, AttrStmt):
            if s.key == UOP_KERNEL:
                self.uop_kernel(s, env)
            else:
                self.stmt(s.body, env)
        elif isinstance(s, Evaluate):
            if isinstance(s.value, E.Call):
                self.call(s.value, env)
        elif isinstance(s, BufferStore):
            raise LowerError(f"codegen: `{stmt_str(s)}` is a scalar store the accelerator cannot run "
                             f"(a loop nest no pass turned into an instruction)")
        else:
            raise LowerError(f"codegen: unexpected statement {type(s).__name__}")

    def allocate(self, b: Buffer) -> None:
        if b.data in self.sram:
            return
        n = b.numel() // self.env.entry_elems(b.scope)
        base = self.top[b.scope]
        if base + n > self.env.depth(b.scope):
            raise LowerError(f"{self.func.name}: buffer '{b.name}' needs {n} entries of {b.scope} at {base}, "
                             f"beyond its {self.env.depth(b.scope)} entries")
        self.sram[b.data] = base
        self.top[b.scope] = base + n

    def base(self, v) -> int:
        if v not in self.sram:
            raise LowerError(f"codegen: '{v.name}' is not an allocated on-chip buffer")
        return self.sram[v]

    def call(self, c: E.Call, env: dict) -> None:
        a = c.args
        if c.op == LOAD_2D:
            v = [evaluate(x, env) for x in a[5:]]
            ys, xs, stride, yp0, yp1, xp0, xp1 = v
            if (max(ys, 0) + yp0 + yp1) * (max(xs, 0) + xp0 + xp1) == 0:
                return
            mem = MemType[a[0].value.upper()]
            src = self.dram[a[3]] if isinstance(a[3], E.Var) else 0   # 0: padding only, no DRAM read
            self.stream.load_2d(mem, self.base(a[1]) + evaluate(a[2], env), src, evaluate(a[4], env),
                                y_size=max(ys, 0), x_size=max(xs, 0), x_stride=max(stride, 1), y_pad0=yp0,
                                y_pad1=yp1, x_pad0=xp0, x_pad1=xp1)
        elif c.op == STORE_2D:
            ys, xs, stride = (evaluate(x, env) for x in a[4:])
            if ys <= 0 or xs <= 0:
                return
            self.stream.store_2d(self.base(a[0]) + evaluate(a[1], env), self.dram[a[2]], evaluate(a[3], env),
                                 y_size=ys, x_size=xs, x_stride=stride)
        elif c.op == DEP_PUSH:
            self.stream.dep_push(a[0].value, a[1].value)
        elif c.op == DEP_POP:
            self.stream.dep_pop(a[0].value, a[1].value)
        else:
            raise LowerError(f"codegen: call {c.op} is not an accelerator intrinsic")

    # ---- micro-op kernels -----------------------------------------------------------------
    def uop_kernel(self, s: AttrStmt, env: dict) -> None:
        op: UopOp = s.node
        loops, body = [], s.body
        while isinstance(body, For) and UOP_LOOP in body.annotations:
            loops.append(body)
            body = body.body
        exts = [evaluate(lp.extent, env) for lp in loops]
        if any(n <= 0 for n in exts):
            return
        key_id = id(s)
        if key_id not in self._free:
            bound = {lp.loop_var for lp in loops}
            inner = set()
            post_order_visit(body, lambda n: inner.add(n.loop_var) if isinstance(n, For) else None)
            free = []
            post_order_visit(s.body, lambda n: free.append(n) if isinstance(n, E.Var) and n not in bound
                             and n not in inner and n not in self.sram and n not in free else None)
            for lp in loops:
                post_order_visit(lp.extent, lambda n: free.append(n) if isinstance(n, E.Var) and n not in free
                                 else None)
            self._free[key_id] = free
            self._text[key_id] = stmt_str(s)
        vals = tuple(env[v] for v in self._free[key_id])
        ck = (key_id, vals)
        k = self._kernels.get(ck)
        if k is None:
            uops: list = []
            self._uops(body, dict(env), uops)
            if not uops:
                return
            levels = tuple((n, *lp.annotations[UOP_LOOP]) for n, lp in zip(exts, loops))
            key = ("te", op.kind, op.reset, levels, tuple(uops))

            def build(kb, levels=levels, uops=uops):
                for n, df, sf, wf in levels:
                    kb.loop_begin(n, dst_factor=df, src_factor=sf, wgt_factor=wf)
                for u in uops:
                    kb.push(*u)
                for _ in levels:
                    kb.loop_end()
            k = self.stream.kernel(key, build)
            self._kernels[ck] = k
        if op.kind == "gemm":
            self.stream.push_gemm(k, reset=op.reset)
        else:
            self.stream.push_alu(k, AluOp[op.alu_op], op.imm)

    def _uops(self, s, env: dict, out: list) -> None:
        if isinstance(s, SeqStmt):
            for x in s.seq:
                self._uops(x, env, out)
        elif isinstance(s, For):
            lo, n = evaluate(s.min, env), evaluate(s.extent, env)
            for i in range(lo, lo + n):
                env[s.loop_var] = i
                self._uops(s.body, env, out)
        elif isinstance(s, IfThenElse):
            if evaluate(s.condition, env):
                self._uops(s.then_case, env, out)
            elif s.else_case is not None:
                self._uops(s.else_case, env, out)
        elif isinstance(s, Evaluate) and isinstance(s.value, E.Call) and s.value.op == UOP:
            a = s.value.args
            idx = []
            for bv, off in ((a[0], a[1]), (a[2], a[3]), (a[4], a[5])):
                idx.append(self.base(bv) + evaluate(off, env) if isinstance(bv, E.Var) else 0)
            out.append(tuple(idx))
        else:
            raise LowerError(f"codegen: unexpected `{stmt_str(s)}` inside a micro-op kernel")
