"""LLVM code generation for CPUs with llvmlite's IR builder.

One PrimFunc (flattened: one index per access) becomes `void name(T* noalias p0, ...)`. Vector
expressions (Ramp/Broadcast from VectorizeLoops) become LLVM vector values: a Ramp of stride 1
is one vector load/store, other vector indices gather/scatter lane by lane. A parallel loop is
outlined into `name_par<k>_body(lo, hi, captured...)` (buffers keep noalias there) plus a
worker `name_par<k>(task, ntask, closure*)`, started by calling the runtime's
`__kit_parallel_launch(worker, closure, n)`. Integer index math is i32 with nsw, widened only
at the address; floor division by a positive constant of a provably non-negative value is a
plain sdiv. Float add/mul carry `contract` so LLVM may fuse them into FMAs.

NaN and Inf propagate as in onnxruntime (no fast-math unless asked): a float max/min is NaN when
either operand is (ReLU, Clip, Max/Min); so is a max-reduction or max-pooling window holding a
NaN, as numpy and PyTorch define it (onnxruntime's own answer there depends on its SIMD path).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..errors import CodegenError
from ..tir import dtype as dt
from ..tir import expr as E
from ..tir.arith import Analyzer
from ..tir.functor import post_order_visit
from ..tir.stmt import (
    Allocate,
    AttrStmt,
    Buffer,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
)

PARALLEL_LAUNCH = "__kit_parallel_launch"
#: allocations up to this many bytes live on the stack, bigger ones on the heap
STACK_LIMIT = 64 * 1024

_INTRIN = {"exp": "llvm.exp", "log": "llvm.log", "sqrt": "llvm.sqrt", "fabs": "llvm.fabs",
           "floor": "llvm.floor", "ceil": "llvm.ceil", "round": "llvm.round", "trunc": "llvm.trunc",
           "pow": "llvm.pow", "exp2": "llvm.exp2", "log2": "llvm.log2", "sin": "llvm.sin",
           "cos": "llvm.cos", "tanh": "llvm.tanh"}


def llvm_type(dtype: str, memory: bool = False) -> ir.Type:
    """LLVM type of a dtype; bool is i1 in registers and i8 in memory."""
    base, lanes = dt.split_lanes(dtype)
    k, nb = dt.SCALARS[base]
    if k == "float":
        t = {16: ir.HalfType(), 32: ir.FloatType(), 64: ir.DoubleType()}[nb]
    elif k == "bool":
        t = ir.IntType(8) if memory else ir.IntType(1)
    else:
        t = ir.IntType(nb)
    return ir.VectorType(t, lanes) if lanes > 1 else t


def _param_bytes(buf) -> int | None:
    """Bytes a parameter buffer holds when its shape is constant (None when symbolic)."""
    try:
        n = buf.numel()
    except (ValueError, TypeError):
        return None
    return int(n) * max(1, dt.bits(buf.dtype) // 8) if isinstance(n, int) and n > 0 else None


def _intrinsic_suffix(t: ir.Type) -> str:
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{_intrinsic_suffix(t.element)}"
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    if isinstance(t, ir.HalfType):
        return "f16"
    return f"i{t.width}"


class _FnState:
    """Per-LLVM-function codegen state (the entry function or an outlined parallel body)."""

    def __init__(self, fn: ir.Function, in_parallel: bool):
        self.fn = fn
        self.entry = fn.append_basic_block("entry")
        self.body_block = fn.append_basic_block("body")
        self.builder = ir.IRBuilder(self.body_block)
        self.env: dict = {}         # Var -> ir.Value
        self.bufptr: dict = {}      # Buffer -> ir.Value (typed pointer to element)
        self.ana = Analyzer()
        self.in_parallel = in_parallel
        self.heap: list = []        # heap allocations to free at function exit
        self.clamp_loads = 0        # > 0: loads clamp their index into the buffer (a select's arms)


class CodegenLLVM:
    def __init__(self, triple: str, data_layout: str = "", fast_math: bool = False):
        self.module = ir.Module(name="kit")
        self.module.triple = triple
        if data_layout:
            self.module.data_layout = data_layout
        self.fp_flags = ("fast",) if fast_math else ("contract",)
        self.n_parallel = 0
        self.externs: set = set()
        self.st: _FnState | None = None

    # ------------------------------------------------------------ entry points
    def add_function(self, func: PrimFunc) -> str:
        if not func.attrs.get("flattened"):
            raise CodegenError(f"function '{func.name}': run FlattenStorage before codegen")
        self.func_name = func.name
        ptr_types = [ir.PointerType(llvm_type(b.dtype, memory=True)) for b in func.params]
        fnty = ir.FunctionType(ir.VoidType(), ptr_types)
        fn = ir.Function(self.module, fnty, name=func.name)
        st = _FnState(fn, in_parallel=False)
        for arg, b in zip(fn.args, func.params):
            arg.name = b.name
            arg.add_attribute("noalias")
            nbytes = _param_bytes(b)
            if nbytes:   # the runtime checks every buffer passed holds this much (docs/trust.md)
                arg.attributes.dereferenceable = nbytes
            st.bufptr[b] = arg
        self._run_function(st, func.body)
        return func.name

    def _run_function(self, st: _FnState, body) -> None:
        saved = self.st
        self.st = st
        self.stmt(body)
        self._finish_fn(st)
        self.st = saved

    def _libc(self, name: str, ret, args) -> ir.Function:
        if name in self.module.globals:
            return self.module.globals[name]
        return ir.Function(self.module, ir.FunctionType(ret, args), name=name)

    @property
    def b(self) -> ir.IRBuilder:
        return self.st.builder

    # ------------------------------------------------------------ statements
    def stmt(self, s) -> None:
        m = getattr(self, "s_" + type(s).__name__, None)
        if m is None:
            raise CodegenError(f"function '{self.func_name}': cannot generate code for {type(s).__name__}")
        m(s)

    def s_SeqStmt(self, s: SeqStmt):
        for x in s.seq:
            self.stmt(x)

    def s_Evaluate(self, s: Evaluate):
        if isinstance(s.value, (E.IntImm, E.FloatImm)):
            return
        self.expr(s.value)

    def s_AttrStmt(self, s: AttrStmt):
        self.stmt(s.body)

    def s_LetStmt(self, s: LetStmt):
        old = self.st.env.get(s.var)
        self.st.env[s.var] = self.expr(s.value)
        self.stmt(s.body)
        if old is None:
            del self.st.env[s.var]
        else:
            self.st.env[s.var] = old

    def s_IfThenElse(self, s: IfThenElse):
        cond = self.expr(s.condition)
        if isinstance(cond.type, ir.VectorType):
            raise CodegenError(f"function '{self.func_name}': vector condition in if: {s.condition}")
        if s.else_case is None:
            with self.b.if_then(cond):
                self.stmt(s.then_case)
        else:
            with self.b.if_else(cond) as (then, other):
                with then:
                    self.stmt(s.then_case)
                with other:
                    self.stmt(s.else_case)

    def s_Allocate(self, s: Allocate):
        buf = s.buffer
        try:
            n = buf.numel()
        except ValueError:
            raise CodegenError(f"function '{self.func_name}': allocation '{buf.name}' has a "
                               f"non-constant shape {buf.shape}") from None
        ety = llvm_type(buf.dtype, memory=True)
        nbytes = n * max(1, dt.bits(buf.dtype) // 8)
        if nbytes <= STACK_LIMIT:
            eb = ir.IRBuilder(self.st.entry)
            ptr = eb.alloca(ir.ArrayType(ety, n), name=buf.name)
            ptr.align = 64
            ptr = eb.bitcast(ptr, ety.as_pointer())
        else:
            i8p = ir.IntType(8).as_pointer()
            malloc = self._libc("malloc", i8p, [ir.IntType(64)])
            eb = ir.IRBuilder(self.st.entry)
            raw = eb.call(malloc, [ir.Constant(ir.IntType(64), nbytes)])
            self.st.heap.append(raw)
            ptr = eb.bitcast(raw, ety.as_pointer())
        old = self.st.bufptr.get(buf)
        self.st.bufptr[buf] = ptr
        self.stmt(s.body)
        if old is None:
            del self.st.bufptr[buf]
        else:
            self.st.bufptr[buf] = old

    def s_BufferStore(self, s: BufferStore):
        val = self.expr(s.value)
        self._store(s.buffer, s.indices, val, s.value.dtype)

    def s_For(self, s: For):
        if s.kind == ForKind.THREAD_BINDING:
            raise CodegenError(f"function '{self.func_name}': loop '{s.loop_var.name}' is bound to "
                               f"'{s.thread_tag}'; thread binding needs the GPU backend")
        if s.kind == ForKind.PARALLEL and not self.st.in_parallel:
            self._parallel_for(s)
            return
        lo = self.expr(s.min)
        ext = self.expr(s.extent)
        self._loop(s.loop_var, lo, ext, s, lambda: self.stmt(s.body))

    def _loop(self, var: E.Var, lo, ext, s: For | None, body_fn, hi=None) -> None:
        b = self.b
        ity = llvm_type(var.dtype)
        if hi is None:
            hi = b.add(lo, ext, flags=("nsw",))
        pre = b.block
        head = b.append_basic_block(f"for_{var.name}")
        body = b.append_basic_block(f"for_{var.name}.body")
        end = b.append_basic_block(f"for_{var.name}.end")
        b.branch(head)
        b.position_at_end(head)
        phi = b.phi(ity, name=var.name)
        phi.add_incoming(lo, pre)
        b.cbranch(b.icmp_signed("<", phi, hi), body, end)
        b.position_at_end(body)
        old = self.st.env.get(var)
        self.st.env[var] = phi
        if s is not None:
            old_r = self.st.ana.ranges.get(var)
            self.st.ana.bind_range(var, s.min, s.extent)
        body_fn()
        nxt = b.add(phi, ir.Constant(ity, 1), flags=("nsw",))
        phi.add_incoming(nxt, b.block)
        b.branch(head)
        b.position_at_end(end)
        if old is not None:
            self.st.env[var] = old
        else:
            del self.st.env[var]
        if s is not None:
            if old_r is None:
                self.st.ana.ranges.pop(var, None)
            else:
                self.st.ana.ranges[var] = old_r

    # ------------------------------------------------------------ parallel loops
    def _parallel_for(self, s: For) -> None:
        k = self.n_parallel
        self.n_parallel += 1
        name = f"{self.func_name}_par{k}"
        # free values of the loop: buffers and variables bound outside it
        bufs, vars_ = [], []

        def f(n):
            if isinstance(n, (E.BufferLoad, BufferStore)) and n.buffer not in bufs:
                bufs.append(n.buffer)
            elif isinstance(n, E.Var) and n in self.st.env and n not in vars_:
                vars_.append(n)
        post_order_visit(s, f)
        # buffers allocated inside the loop are not captured
        cap_bufs = [bb for bb in bufs if bb in self.st.bufptr]
        i32 = ir.IntType(32)
        # body function: (lo, hi, bufs..., vars...)
        btys = [i32, i32] + [self.st.bufptr[bb].type for bb in cap_bufs] + [self.st.env[v].type for v in vars_]
        body_fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), btys), name=name + "_body")
        body_fn.linkage = "internal"
        bst = _FnState(body_fn, in_parallel=True)
        bst.ana.ranges = dict(self.st.ana.ranges)
        for arg, bb in zip(body_fn.args[2:], cap_bufs):
            arg.add_attribute("noalias")
            bst.bufptr[bb] = arg
        for arg, v in zip(body_fn.args[2 + len(cap_bufs):], vars_):
            bst.env[v] = arg
        saved = self.st
        self.st = bst
        lo_v, hi_v = body_fn.args[0], body_fn.args[1]
        self._loop(s.loop_var, lo_v, None, s, lambda: self.stmt(s.body), hi=hi_v)
        self.st = saved
        self._finish_fn(bst)
        # worker(task, ntask, closure): unpack, compute its chunk of [min, min+extent), call the body
        i8p = ir.IntType(8).as_pointer()
        i64 = ir.IntType(64)
        wfn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [i32, i32, i8p]), name=name)
        wb = ir.IRBuilder(wfn.append_basic_block("entry"))
        task, ntask, clo = wfn.args
        slots = wb.bitcast(clo, i64.as_pointer())
        unpacked = []
        for j, t in enumerate([i32, i32] + btys[2:]):
            raw = wb.load(wb.gep(slots, [ir.Constant(i64, j)]))
            if isinstance(t, ir.PointerType):
                unpacked.append(wb.inttoptr(raw, t))
            else:
                unpacked.append(wb.trunc(raw, t) if t.width < 64 else raw)
        n_min, n_ext, cargs = unpacked[0], unpacked[1], unpacked[2:]
        chunk = wb.sdiv(wb.add(n_ext, wb.sub(ntask, ir.Constant(i32, 1))), ntask)
        lo = wb.mul(task, chunk)
        hi = wb.add(lo, chunk)
        hi = wb.select(wb.icmp_signed("<", hi, n_ext), hi, n_ext)
        with wb.if_then(wb.icmp_signed("<", lo, hi)):
            wb.call(body_fn, [wb.add(lo, n_min), wb.add(hi, n_min)] + cargs)
        wb.ret_void()
        # caller: closure = [min, extent, bufs..., vars...] as i64 slots
        b = self.b
        n_slots = 2 + len(cap_bufs) + len(vars_)
        eb = ir.IRBuilder(self.st.entry)
        clo_mem = eb.alloca(ir.ArrayType(i64, n_slots), name=name + "_closure")
        base = b.bitcast(clo_mem, i64.as_pointer())
        ext_v = self.expr(s.extent)
        vals = [self.expr(s.min), ext_v] + [self.st.bufptr[bb] for bb in cap_bufs] + [self.st.env[v] for v in vars_]
        for j, v in enumerate(vals):
            if isinstance(v.type, ir.PointerType):
                v = b.ptrtoint(v, i64)
            elif v.type.width < 64:
                v = b.sext(v, i64)
            b.store(v, b.gep(base, [ir.Constant(i64, j)]))
        launch_ty = ir.FunctionType(i32, [i8p, i8p, i32])
        launch = self.module.globals.get(PARALLEL_LAUNCH) or ir.Function(self.module, launch_ty, name=PARALLEL_LAUNCH)
        b.call(launch, [b.bitcast(wfn, i8p), b.bitcast(clo_mem, i8p), ext_v])

    def _finish_fn(self, st: _FnState) -> None:
        b = st.builder
        for p in st.heap:
            b.call(self._libc("free", ir.VoidType(), [ir.IntType(8).as_pointer()]), [p])
        b.ret_void()
        ir.IRBuilder(st.entry).branch(st.body_block)

    # ------------------------------------------------------------ memory
    def _ptr(self, buf: Buffer):
        p = self.st.bufptr.get(buf)
        if p is None:
            raise CodegenError(f"function '{self.func_name}': buffer '{buf.name}' is used outside "
                               "its allocation")
        return p

    def _addr(self, buf: Buffer, idx_val, span: int = 1):
        """Address of element idx_val of buf; inside a select's arms (st.clamp_loads) the index is
        clamped so that `span` elements from it lie in the buffer."""
        i64 = ir.IntType(64)
        if self.st.clamp_loads:
            t = idx_val.type
            lo, hi = ir.Constant(t, 0), ir.Constant(t, max(0, self._numel(buf) - span))
            idx_val = self.b.select(self.b.icmp_signed("<", idx_val, lo), lo, idx_val)
            idx_val = self.b.select(self.b.icmp_signed(">", idx_val, hi), hi, idx_val)
        if idx_val.type.width < 64:
            idx_val = self.b.sext(idx_val, i64)
        return self.b.gep(self._ptr(buf), [idx_val], inbounds=True)

    def _load(self, e: E.BufferLoad):
        buf = e.buffer
        if len(e.indices) != 1:
            raise CodegenError(f"load of '{buf.name}' has {len(e.indices)} indices; flatten first")
        idx = e.indices[0]
        lanes = dt.lanes(e.dtype)
        ety = llvm_type(buf.dtype, memory=True)
        align = max(1, dt.bits(buf.dtype) // 8)
        if lanes == 1:
            v = self.b.load(self._addr(buf, self.expr(idx)), align=align)
            return self._from_mem(v, buf.dtype)
        if isinstance(idx, E.Ramp) and E.is_const(idx.stride, 1):
            p = self._addr(buf, self.expr(idx.base), span=lanes)
            vp = self.b.bitcast(p, ir.VectorType(ety, lanes).as_pointer())
            return self._from_mem(self.b.load(vp, align=align), e.dtype)
        iv = self.expr(idx)
        out = ir.Constant(ir.VectorType(ety, lanes), ir.Undefined)
        for l in range(lanes):
            il = self.b.extract_element(iv, ir.Constant(ir.IntType(32), l))
            out = self.b.insert_element(out, self.b.load(self._addr(buf, il), align=align),
                                        ir.Constant(ir.IntType(32), l))
        return self._from_mem(out, e.dtype)

    def _store(self, buf: Buffer, indices, val, vdtype: str) -> None:
        if len(indices) != 1:
            raise CodegenError(f"store to '{buf.name}' has {len(indices)} indices; flatten first")
        idx = indices[0]
        lanes = dt.lanes(vdtype)
        align = max(1, dt.bits(buf.dtype) // 8)
        val = self._to_mem(val, vdtype)
        if lanes == 1:
            self.b.store(val, self._addr(buf, self.expr(idx)), align=align)
            return
        if isinstance(idx, E.Ramp) and E.is_const(idx.stride, 1):
            p = self._addr(buf, self.expr(idx.base))
            self.b.store(val, self.b.bitcast(p, val.type.as_pointer()), align=align)
            return
        iv = self.expr(idx)
        for l in range(lanes):
            c = ir.Constant(ir.IntType(32), l)
            self.b.store(self.b.extract_element(val, c), self._addr(buf, self.b.extract_element(iv, c)),
                         align=align)

    def _from_mem(self, v, dtype):
        if dt.is_bool(dtype):
            return self.b.icmp_unsigned("!=", v, ir.Constant(v.type, None))
        return v

    def _to_mem(self, v, dtype):
        if dt.is_bool(dtype):
            t = ir.VectorType(ir.IntType(8), dt.lanes(dtype)) if dt.lanes(dtype) > 1 else ir.IntType(8)
            return self.b.zext(v, t)
        return v

    # ------------------------------------------------------------ expressions
    def expr(self, e):
        m = getattr(self, "e_" + type(e).__name__, None)
        if m is None:
            raise CodegenError(f"function '{self.func_name}': cannot generate code for expression "
                               f"{type(e).__name__} ({e})")
        return m(e)

    def e_IntImm(self, e):
        return ir.Constant(llvm_type(e.dtype), e.value)

    def e_FloatImm(self, e):
        return ir.Constant(llvm_type(e.dtype), e.value)

    def e_Var(self, e):
        v = self.st.env.get(e)
        if v is None:
            raise CodegenError(f"function '{self.func_name}': variable '{e.name}' is not bound here")
        return v

    def e_BufferLoad(self, e):
        return self._load(e)

    def e_Ramp(self, e):
        base, stride = self.expr(e.base), self.expr(e.stride)
        vt = ir.VectorType(base.type, e.lanes)
        vb = self._splat(base, e.lanes)
        if isinstance(stride, ir.Constant):
            steps = ir.Constant(vt, [ir.Constant(base.type, k * e.stride.value) for k in range(e.lanes)]) \
                if isinstance(e.stride, E.IntImm) else None
            if steps is not None:
                return self.b.add(vb, steps)
        ks = ir.Constant(vt, [ir.Constant(base.type, k) for k in range(e.lanes)])
        return self.b.add(vb, self.b.mul(ks, self._splat(stride, e.lanes)))

    def _splat(self, v, lanes: int):
        vt = ir.VectorType(v.type, lanes)
        if isinstance(v, ir.Constant):
            return ir.Constant(vt, [v] * lanes)
        one = self.b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(ir.IntType(32), 0))
        return self.b.shuffle_vector(one, ir.Constant(vt, ir.Undefined),
                                     ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))

    def e_Broadcast(self, e):
        return self._splat(self.expr(e.value), e.lanes)

    def _arith(self, e, iop, fop, uop=None):
        a, b = self.expr(e.a), self.expr(e.b)
        if dt.is_float(e.dtype):
            return getattr(self.b, fop)(a, b, flags=self.fp_flags)
        if iop in ("add", "sub", "mul"):
            return getattr(self.b, iop)(a, b, flags=("nsw",) if dt.is_signed(e.dtype) else ())
        return getattr(self.b, iop)(a, b)

    def e_Add(self, e): return self._arith(e, "add", "fadd")
    def e_Sub(self, e): return self._arith(e, "sub", "fsub")
    def e_Mul(self, e): return self._arith(e, "mul", "fmul")

    def e_Div(self, e):
        if not dt.is_float(e.dtype):
            return self._floordiv(e, mod=False)
        return self.b.fdiv(self.expr(e.a), self.expr(e.b), flags=self.fp_flags)

    def e_FloorDiv(self, e):
        if dt.is_float(e.dtype):
            q = self.b.fdiv(self.expr(e.a), self.expr(e.b))
            return self._call_intrin("llvm.floor", q.type, [q])
        return self._floordiv(e, mod=False)

    def e_FloorMod(self, e):
        if dt.is_float(e.dtype):
            a, b = self.expr(e.a), self.expr(e.b)
            q = self._call_intrin("llvm.floor", a.type, [self.b.fdiv(a, b)])
            return self.b.fsub(a, self.b.fmul(q, b))
        return self._floordiv(e, mod=True)

    def _floordiv(self, e, mod: bool):
        a, b = self.expr(e.a), self.expr(e.b)
        if not dt.is_signed(e.dtype):
            return self.b.urem(a, b) if mod else self.b.udiv(a, b)
        if dt.lanes(e.dtype) == 1 and isinstance(e.b, E.IntImm) and e.b.value > 0 \
                and self.st.ana.can_prove_nonneg(e.a):
            return self.b.srem(a, b) if mod else self.b.sdiv(a, b)
        q, r = self.b.sdiv(a, b), self.b.srem(a, b)
        zero = ir.Constant(a.type, None) if not isinstance(a.type, ir.VectorType) else \
            ir.Constant(a.type, [ir.Constant(a.type.element, 0)] * a.type.count)
        adjust = self.b.and_(self.b.icmp_signed("!=", r, zero),
                             self.b.icmp_signed("!=", self.b.icmp_signed("<", r, zero),
                                                self.b.icmp_signed("<", b, zero)))
        if mod:
            return self.b.select(adjust, self.b.add(r, b), r)
        one = ir.Constant(a.type, 1) if not isinstance(a.type, ir.VectorType) else \
            ir.Constant(a.type, [ir.Constant(a.type.element, 1)] * a.type.count)
        return self.b.select(adjust, self.b.sub(q, one), q)

    def _minmax(self, e, is_min):
        a, b = self.expr(e.a), self.expr(e.b)
        if dt.is_float(e.dtype):   # NaN if either is: a NaN a is picked, a NaN b fails the compare
            c = self.b.fcmp_ordered("<" if is_min else ">", a, b)
            c = self.b.or_(c, self.b.fcmp_unordered("uno", a, a))
        elif dt.is_signed(e.dtype):
            c = self.b.icmp_signed("<" if is_min else ">", a, b)
        else:
            c = self.b.icmp_unsigned("<" if is_min else ">", a, b)
        return self.b.select(c, a, b)

    def e_Min(self, e): return self._minmax(e, True)
    def e_Max(self, e): return self._minmax(e, False)

    def e_BitAnd(self, e): return self.b.and_(self.expr(e.a), self.expr(e.b))
    def e_BitOr(self, e): return self.b.or_(self.expr(e.a), self.expr(e.b))
    def e_BitXor(self, e): return self.b.xor(self.expr(e.a), self.expr(e.b))
    def e_Shl(self, e): return self.b.shl(self.expr(e.a), self.expr(e.b))

    def e_Shr(self, e):
        a, b = self.expr(e.a), self.expr(e.b)
        return self.b.ashr(a, b) if dt.is_signed(e.dtype) else self.b.lshr(a, b)

    def e_And(self, e): return self.b.and_(self.expr(e.a), self.expr(e.b))
    def e_Or(self, e): return self.b.or_(self.expr(e.a), self.expr(e.b))

    def e_Not(self, e):
        a = self.expr(e.a)
        return self.b.not_(a)

    def _cmp(self, e, op):
        a, b = self.expr(e.a), self.expr(e.b)
        t = e.a.dtype
        if dt.is_float(t):
            return self.b.fcmp_ordered(op, a, b) if op != "!=" else self.b.fcmp_unordered(op, a, b)
        if dt.is_signed(t):
            return self.b.icmp_signed(op, a, b)
        return self.b.icmp_unsigned(op, a, b)

    def e_EQ(self, e): return self._cmp(e, "==")
    def e_NE(self, e): return self._cmp(e, "!=")
    def e_LT(self, e): return self._cmp(e, "<")
    def e_LE(self, e): return self._cmp(e, "<=")
    def e_GT(self, e): return self._cmp(e, ">")
    def e_GE(self, e): return self._cmp(e, ">=")

    def e_Select(self, e):
        cond = self.expr(e.cond)
        loads, unsafe = [], []

        def visit(n):
            if isinstance(n, E.BufferLoad):
                loads.append(n)
            elif isinstance(n, E.Call) or (isinstance(n, (E.Div, E.FloorDiv, E.FloorMod)) and not dt.is_float(n.dtype)
                                           and not isinstance(n.b, E.IntImm)):
                unsafe.append(n)
        for side in (e.true_value, e.false_value):
            post_order_visit(side, visit)
        if not (loads or unsafe) or isinstance(cond.type, ir.VectorType):
            return self.b.select(cond, self.expr(e.true_value), self.expr(e.false_value))
        if not unsafe and all(self._numel(ld.buffer) for ld in loads):
            # the side not taken may index out of bounds: both sides load with their index clamped
            # into the buffer and a select picks one. Branch-free, so LLVM's loop vectorizer never
            # predicates these loads: LLVM 20-22 widened a masked load whose index it had proved in
            # range only under the branch's condition into a wrong contiguous one (the ONNX
            # RotaryEmbedding case on znver4).
            self.st.clamp_loads += 1
            try:
                tv, fv = self.expr(e.true_value), self.expr(e.false_value)
            finally:
                self.st.clamp_loads -= 1
            return self.b.select(cond, tv, fv)
        # an integer division by a variable or a call on the side not taken: branch
        b = self.b
        with b.if_else(cond) as (then, other):
            with then:
                tv = self.expr(e.true_value)
                tb = b.block
            with other:
                fv = self.expr(e.false_value)
                fb = b.block
        phi = b.phi(tv.type)
        phi.add_incoming(tv, tb)
        phi.add_incoming(fv, fb)
        return phi

    @staticmethod
    def _numel(buf: Buffer) -> int:
        """Elements of a buffer of constant shape, else 0."""
        try:
            return buf.numel()
        except ValueError:
            return 0

    def e_Cast(self, e):
        v = self.expr(e.value)
        src, dst = e.value.dtype, e.dtype
        tt = llvm_type(dst)
        b = self.b
        if dt.is_bool(dst):
            if dt.is_float(src):
                return b.fcmp_unordered("!=", v, ir.Constant(v.type, None) if not isinstance(v.type, ir.VectorType)
                                        else ir.Constant(v.type, [ir.Constant(v.type.element, 0)] * v.type.count))
            return b.icmp_unsigned("!=", v, ir.Constant(v.type, None) if not isinstance(v.type, ir.VectorType)
                                   else ir.Constant(v.type, [ir.Constant(v.type.element, 0)] * v.type.count))
        if dt.is_float(src) and dt.is_float(dst):
            return b.fpext(v, tt) if dt.bits(dst) > dt.bits(src) else b.fptrunc(v, tt)
        if dt.is_float(src):
            return b.fptosi(v, tt) if dt.is_signed(dst) else b.fptoui(v, tt)
        if dt.is_float(dst):
            return b.sitofp(v, tt) if dt.is_signed(src) else b.uitofp(v, tt)
        if dt.bits(dst) > dt.bits(src):
            return b.sext(v, tt) if dt.is_signed(src) else b.zext(v, tt)
        if dt.bits(dst) < dt.bits(src):
            return b.trunc(v, tt)
        return v

    def _call_intrin(self, name, ty, args):
        full = f"{name}.{_intrinsic_suffix(ty)}"
        fn = self.module.globals.get(full)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ty, [a.type for a in args]), name=full)
        return self.b.call(fn, args)

    def _exp_f32(self, x):
        """exp of float32 (scalar or vector) in registers: LLVM lowers its exp intrinsic on a vector
        to one libm call per lane (exp-heavy kernels such as SiLU and softmax ran 5-10x slower).
        Cephes' expf: n = round(x / ln 2), r = x - n ln 2 (ln 2 split in two), a degree-5
        polynomial, times 2^n built in the exponent bits (as two halves, so n = 128 and -126
        stay normal); error within 2 ulp. exp(+inf) = inf, exp(-inf) = 0, NaN stays NaN; results
        below the smallest normal float are 0."""
        b, ty = self.b, x.type
        lanes = ty.count if isinstance(ty, ir.VectorType) else None
        ity = ir.VectorType(ir.IntType(32), lanes) if lanes else ir.IntType(32)

        def c(v, t=ty):
            return ir.Constant(t, [v] * lanes) if lanes else ir.Constant(t, v)

        def fma(a, m, k):
            return b.fadd(b.fmul(a, m, flags=("contract",)), k, flags=("contract",))
        hi, lo = 88.72283172607421875, -87.33654022216796875
        xc = b.select(b.fcmp_ordered(">", x, c(hi)), c(hi), x)
        xc = b.select(b.fcmp_ordered("<", xc, c(lo)), c(lo), xc)
        fx = self._call_intrin("llvm.floor", ty, [fma(xc, c(1.44269504088896341), c(0.5))])
        r = b.fsub(b.fsub(xc, b.fmul(fx, c(0.693359375))), b.fmul(fx, c(-2.12194440e-4)))
        y = c(1.9875691500e-4)
        for k in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
            y = fma(y, r, c(k))
        y = b.fadd(fma(y, b.fmul(r, r), r), c(1.0))
        n = b.fptosi(fx, ity)
        n1 = b.ashr(n, c(1, ity))
        n2 = b.sub(n, n1)

        def pow2(k):
            return b.bitcast(b.shl(b.add(k, c(127, ity)), c(23, ity)), ty)
        res = b.fmul(b.fmul(y, pow2(n1)), pow2(n2))
        res = b.select(b.fcmp_ordered(">", x, c(hi)), c(float("inf")), res)
        res = b.select(b.fcmp_ordered("<", x, c(lo)), c(0.0), res)
        return b.select(b.fcmp_unordered("uno", x, x), x, res)

    def _tanh_f32(self, x):
        """tanh of float32 in registers (LLVM's tanh is one libm call per lane: a conv with a tanh
        epilogue ran 5x slower than onnxruntime). Cephes' tanhf: below |x| = 0.625 the odd
        polynomial x + x^3 P(x^2), above it 1 - 2 / (exp(2|x|) + 1) with x's sign (exp inline;
        it saturates to +-1). NaN stays NaN; within 2 ulp."""
        b, ty = self.b, x.type
        lanes = ty.count if isinstance(ty, ir.VectorType) else None

        def c(v):
            return ir.Constant(ty, [v] * lanes) if lanes else ir.Constant(ty, v)
        ax = self._call_intrin("llvm.fabs", ty, [x])
        big = b.fsub(c(1.0), b.fdiv(c(2.0), b.fadd(self._exp_f32(b.fadd(ax, ax)), c(1.0))))
        big = self._call_intrin("llvm.copysign", ty, [big, x])
        z = b.fmul(x, x)
        p = c(-5.70498872745e-3)
        for k in (2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1):
            p = b.fadd(b.fmul(p, z, flags=("contract",)), c(k), flags=("contract",))
        small = b.fadd(b.fmul(b.fmul(p, z), x, flags=("contract",)), x, flags=("contract",))
        return b.select(b.fcmp_ordered(">=", ax, c(0.625)), big, small)

    def e_Call(self, e):
        if e.op == "exp" and dt.split_lanes(e.dtype)[0] == "float32":
            return self._exp_f32(self.expr(e.args[0]))
        if e.op == "tanh" and dt.split_lanes(e.dtype)[0] == "float32":
            return self._tanh_f32(self.expr(e.args[0]))
        if e.op in _INTRIN:
            args = [self.expr(a) for a in e.args]
            return self._call_intrin(_INTRIN[e.op], args[0].type, args)
        if e.op == "call_extern":
            name = e.args[0].value
            args = [self.expr(a) for a in e.args[1:]]
            ret = ir.VoidType() if e.dtype == "void" else llvm_type(e.dtype)
            fn = self.module.globals.get(name)
            if fn is None:
                fn = ir.Function(self.module, ir.FunctionType(ret, [a.type for a in args]), name=name)
            self.externs.add(name)
            return self.b.call(fn, args)
        if e.op == "address_of":
            ld = e.args[0]
            p = self._addr(ld.buffer, self.expr(ld.indices[0]))
            return self.b.bitcast(p, ir.IntType(8).as_pointer())
        raise CodegenError(f"function '{self.func_name}': no LLVM lowering for call '{e.op}'")

    def e_StringImm(self, e):
        raise CodegenError(f"function '{self.func_name}': string {e.value!r} used as a value")
