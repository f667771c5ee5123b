"""NVPTX back end: the GPU-lowered loop IR (compiler.codegen.opencl.lower_gpu) -> LLVM IR for
nvptx64-nvidia-cuda -> PTX text (sm_70 and newer) through llvmlite.

The CPU code generator is reused; what differs: the function is a kernel (ptx_kernel calling
convention), loops bound to blockIdx/threadIdx read the special registers (ctaid, tid) instead of
looping, "shared" allocations are addrspace(3) globals, the lowering's barrier is bar.sync 0,
and float math that has no PTX instruction uses the approximate hardware units (ex2, lg2, sin,
cos: about 2 ulp, well inside the 1e-4 the model tests allow). The PTX is loaded by the CUDA
driver where the model runs (host_runtime.gpu.CudaDevice); tests run ptxas on it when the
nvidia-cuda-nvcc-cu12 wheel is installed.
"""
from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir

from ..build import _init_llvm, optimize
from ..errors import CodegenError
from ..tir import dtype as dt
from ..tir import expr as E
from ..tir.stmt import Allocate, Evaluate, For, ForKind, PrimFunc
from .llvm import CodegenLLVM, _FnState, llvm_type
from .opencl import BARRIER, GpuKernel, aligned_ramp, launch_shape, shared_bytes

TRIPLE = "nvptx64-nvidia-cuda"
#: the oldest architecture the PTX targets (Volta)
SM = "sm_70"
_SREG = {"threadIdx": "tid", "blockIdx": "ctaid"}
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


class CodegenNVPTX(CodegenLLVM):
    def __init__(self, data_layout: str, block: tuple[int, int, int]):
        super().__init__(TRIPLE, data_layout)
        self.block = block

    def add_function(self, func: PrimFunc) -> str:
        if not func.attrs.get("flattened"):
            raise CodegenError(f"kernel '{func.name}': run FlattenStorage before codegen")
        self.func_name = func.name
        ptr_types = [ir.PointerType(llvm_type(b.dtype, memory=True)) for b in func.params]
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), ptr_types), name=func.name)
        fn.calling_convention = "ptx_kernel"
        st = _FnState(fn, in_parallel=True)    # no outlined parallel loops on the GPU
        for arg, b in zip(fn.args, func.params):
            arg.name = b.name
            arg.add_attribute("noalias")
            st.bufptr[b] = arg
        self._run_function(st, func.body)
        return func.name

    def _sreg(self, tag: str):
        head, _, axis = tag.partition(".")
        name = f"llvm.nvvm.read.ptx.sreg.{_SREG[head]}.{axis}"
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ir.IntType(32), []), name=name)
        return self.b.call(fn, [])

    def s_For(self, s: For):
        if s.kind != ForKind.THREAD_BINDING:
            if s.kind == ForKind.PARALLEL:
                raise CodegenError(f"kernel '{self.func_name}': parallel loop '{s.loop_var.name}' in a GPU kernel; "
                                   "bind it to threads instead")
            lo, ext = self.expr(s.min), self.expr(s.extent)
            self._loop(s.loop_var, lo, ext, s, lambda: self.stmt(s.body))
            return
        v = self._sreg(s.thread_tag)
        ty = llvm_type(s.loop_var.dtype)
        if ty.width > 32:
            v = self.b.sext(v, ty)
        elif ty.width < 32:
            v = self.b.trunc(v, ty)
        old = self.st.env.get(s.loop_var)
        self.st.env[s.loop_var] = v
        self.st.ana.bind_range(s.loop_var, s.min, s.extent)
        head, _, axis = s.thread_tag.partition(".")
        if head == "threadIdx" and s.extent.value < self.block["xyz".index(axis)]:
            cond = self.b.icmp_signed("<", v, ir.Constant(ty, s.extent.value))
            with self.b.if_then(cond):
                self.stmt(s.body)
        else:
            self.stmt(s.body)
        if old is None:
            del self.st.env[s.loop_var]
        else:
            self.st.env[s.loop_var] = old

    def s_Allocate(self, s: Allocate):
        buf = s.buffer
        if buf.scope != "shared":
            nbytes = buf.numel() * max(1, dt.bits(buf.dtype) // 8)
            if nbytes > 16384:
                raise CodegenError(f"kernel '{self.func_name}': allocation '{buf.name}' ({nbytes} bytes) is too big "
                                   "for registers")
            super().s_Allocate(s)
            return
        ety = llvm_type(buf.dtype, memory=True)
        name = f"{self.func_name}.{buf.name}".replace(".", "_")
        g = self.module.globals.get(name)
        if g is None:
            g = ir.GlobalVariable(self.module, ir.ArrayType(ety, buf.numel()), name, addrspace=3)
            g.linkage = "internal"
            g.initializer = ir.Constant(g.value_type, ir.Undefined)
            g.align = 16
        eb = ir.IRBuilder(self.st.entry)
        p = eb.addrspacecast(g, ir.PointerType(g.value_type))
        p = eb.bitcast(p, ety.as_pointer())
        old = self.st.bufptr.get(buf)
        self.st.bufptr[buf] = p
        self.stmt(s.body)
        if old is None:
            del self.st.bufptr[buf]
        else:
            self.st.bufptr[buf] = old

    def s_Evaluate(self, s: Evaluate):
        v = s.value
        if isinstance(v, E.Call) and v.op == BARRIER:
            name = "llvm.nvvm.barrier.cta.sync.aligned.all"
            fn = self.module.globals.get(name)
            if fn is None:
                fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [ir.IntType(32)]), name=name)
            self.b.call(fn, [ir.Constant(ir.IntType(32), 0)])
            return
        super().s_Evaluate(s)

    def _load(self, e: E.BufferLoad):
        """A unit-stride vector load whose start is a multiple of its lanes is one aligned vector
        load (ld.global.v4.f32 for float32x4): buffers start 256-byte aligned (cuMemAlloc), shared
        tiles 16-byte aligned. Anything else: the CPU code generator's element-aligned load."""
        lanes = dt.lanes(e.dtype)
        if lanes == 1 or aligned_ramp(e.indices[0], lanes) is None or dt.is_bool(e.buffer.dtype):
            return super()._load(e)
        ety = llvm_type(e.buffer.dtype, memory=True)
        p = self._addr(e.buffer, self.expr(e.indices[0].base))
        vp = self.b.bitcast(p, ir.VectorType(ety, lanes).as_pointer())
        return self.b.load(vp, align=lanes * max(1, dt.bits(e.buffer.dtype) // 8))

    def _store(self, buf, indices, val, vdtype: str) -> None:
        lanes = dt.lanes(vdtype)
        if lanes == 1 or len(indices) != 1 or aligned_ramp(indices[0], lanes) is None or dt.is_bool(buf.dtype):
            super()._store(buf, indices, val, vdtype)
            return
        p = self._addr(buf, self.expr(indices[0].base))
        self.b.store(val, self.b.bitcast(p, val.type.as_pointer()), align=lanes * max(1, dt.bits(buf.dtype) // 8))

    def _nvvm(self, name: str, x):
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ir.FloatType(), [ir.FloatType()]), name=name)
        return self.b.call(fn, [x])

    def _f(self, c: float):
        return ir.Constant(ir.FloatType(), c)

    def _exp2(self, x):
        return self._nvvm("llvm.nvvm.ex2.approx.f", x)

    def _log2(self, x):
        return self._nvvm("llvm.nvvm.lg2.approx.f", x)

    def e_Call(self, e):
        native = ("sqrt", "fabs", "floor", "ceil", "trunc", "round")
        if e.op in native or e.op == "call_extern" or e.op == "address_of":
            if e.op == "call_extern":
                raise CodegenError(f"kernel '{self.func_name}': extern call in a GPU kernel")
            return super().e_Call(e)
        lanes = dt.lanes(e.dtype)
        if (dt.with_lanes(e.dtype, 1) if lanes != 1 else e.dtype) != "float32":
            raise CodegenError(f"kernel '{self.func_name}': {e.op} on {e.dtype} has no PTX form here (float32 only)")
        args = [self.expr(a) for a in e.args]
        if lanes == 1:
            return self._call_f32(e.op, args)
        out = ir.Constant(ir.VectorType(ir.FloatType(), lanes), ir.Undefined)
        for k in range(lanes):   # the approximate units are scalar: lane by lane
            c = ir.Constant(ir.IntType(32), k)
            lane = [self.b.extract_element(a, c) if isinstance(a.type, ir.VectorType) else a for a in args]
            out = self.b.insert_element(out, self._call_f32(e.op, lane), c)
        return out

    def _call_f32(self, op: str, args):
        b = self.b
        x = args[0]
        if op == "exp":
            return self._exp2(b.fmul(x, self._f(_LOG2E)))
        if op == "exp2":
            return self._exp2(x)
        if op == "log":
            return b.fmul(self._log2(x), self._f(_LN2))
        if op == "log2":
            return self._log2(x)
        if op == "pow":
            return self._exp2(b.fmul(args[1], self._log2(x)))
        if op == "sin":
            return self._nvvm("llvm.nvvm.sin.approx.f", x)
        if op == "cos":
            return self._nvvm("llvm.nvvm.cos.approx.f", x)
        if op == "tanh":   # 1 - 2 / (exp(2x) + 1), saturating at +-1 for large |x|
            ex = self._exp2(b.fmul(x, self._f(2 * _LOG2E)))
            return b.fsub(self._f(1.0), b.fdiv(self._f(2.0), b.fadd(ex, self._f(1.0))))
        raise CodegenError(f"kernel '{self.func_name}': no PTX lowering for call '{op}'")


_TM = None


def target_machine():
    global _TM
    if _TM is None:
        _init_llvm()
        try:
            t = llvm.Target.from_triple(TRIPLE)
        except RuntimeError as e:
            raise CodegenError(f"this llvmlite has no NVPTX target: {e}") from None
        _TM = t.create_target_machine(cpu=SM, features="+ptx70", opt=3)
    return _TM


def build_ptx(func: PrimFunc) -> GpuKernel:
    """PTX for a GPU-lowered PrimFunc (compiler.codegen.opencl.lower_gpu)."""
    grid, block = launch_shape(func)
    tm = target_machine()
    cg = CodegenNVPTX(str(tm.target_data), block)
    cg.add_function(func)
    text = str(cg.module)
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as e:
        raise CodegenError(f"kernel '{func.name}': LLVM rejected the NVPTX IR: {e}") from None
    mod.triple = TRIPLE
    mod.data_layout = str(tm.target_data)
    optimize(mod, tm, 3)
    try:
        ptx = tm.emit_assembly(mod)
    except RuntimeError as e:
        raise CodegenError(f"kernel '{func.name}': NVPTX code generation failed: {e}") from None
    params = [(b.const_shape(), b.dtype) for b in func.params]
    return GpuKernel(func.name, "ptx", ptx, grid, block, params, shared_bytes(func), ir=str(mod))

