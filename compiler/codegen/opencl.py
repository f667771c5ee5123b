"""GPU kernels from the loop IR: the shared GPU lowering (barriers, launch shape) and OpenCL C.

One lowering feeds both GPU back ends (this OpenCL C printer and compiler.codegen.nvptx): a te
schedule whose loops are bound to blockIdx.*/threadIdx.* is lowered by compiler.lower (a
"shared" cache stage's region covers the whole thread block), the default tir pipeline runs,
then `insert_barriers` puts a work-group barrier before and after every statement that fills a
shared buffer (the cooperative loads), so no thread reads a tile before all threads wrote it and
none overwrites it while others still read. Loops bound to thread axes are not loops: each
becomes the hardware index (with a guard when its extent is below the launch's).

The result is a `GpuKernel`: source text (OpenCL C or PTX), grid and block sizes and the
parameters' (shape, dtype). A compiled model carries that text, never machine code; the runtime
(host_runtime.gpu) compiles it with the device's own driver (docs/trust.md).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import CodegenError
from ..lower import lower
from ..tir import dtype as dt
from ..tir import expr as E
from ..tir.arith import Linear, linear
from ..tir.functor import Mutator
from ..tir.stmt import (
    Allocate,
    AttrStmt,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
)

#: the barrier call the GPU lowering inserts (both back ends print it)
BARRIER = "gpu_barrier"
#: most threads in one block any target here accepts (CUDA: 1024; PoCL's CPU device: 4096)
MAX_THREADS = 1024
#: shared memory one block may use (48 KiB: CUDA's static limit, OpenCL's minimum is 32 KiB)
MAX_SHARED_BYTES = 48 << 10
_DIMS = {"x": 0, "y": 1, "z": 2}


@dataclass
class GpuKernel:
    """A kernel as a compiled model carries it: source text and how to launch it."""
    name: str
    lang: str                      # "opencl" | "ptx"
    source: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: list = field(default_factory=list)   # [(shape, dtype)] in call order, output last
    shared_bytes: int = 0
    ir: str = ""                   # NVPTX: the LLVM IR the PTX came from (for --emit)

    def to_attrs(self) -> dict:
        return {"lang": self.lang, "source": self.source, "kernel": self.name, "grid": list(self.grid),
                "block": list(self.block), "params": [[list(s), d] for s, d in self.params]}


# ---------------------------------------------------------------- shared lowering
def _writes_shared(s: Stmt) -> bool:
    hit = []

    def f(n):
        if isinstance(n, BufferStore) and n.buffer.scope == "shared":
            hit.append(n)
    _visit_stmts(s, f)
    return bool(hit)


def _visit_stmts(s, f):
    f(s)
    for k in getattr(type(s), "_fields", ()):
        v = getattr(s, k, None)
        if isinstance(v, Stmt):
            _visit_stmts(v, f)
        elif isinstance(v, tuple):
            for x in v:
                if isinstance(x, Stmt):
                    _visit_stmts(x, f)


def _barrier() -> Stmt:
    return Evaluate(E.Call("void", BARRIER, []))


def _is_barrier(s) -> bool:
    return isinstance(s, Evaluate) and isinstance(s.value, E.Call) and s.value.op == BARRIER


class _Barriers(Mutator):
    """Barrier before and after each statement of a sequence that fills shared memory."""

    def visit_SeqStmt(self, s):
        out = []
        for x in s.seq:
            x = self.visit(x)
            if _writes_shared(x) and not isinstance(x, SeqStmt) and not _has_barrier(x):
                for y in (_barrier(), x, _barrier()):
                    if not (_is_barrier(y) and out and _is_barrier(out[-1])):
                        out.append(y)
            else:
                out.append(x)
        return SeqStmt(out)


def insert_barriers(func: PrimFunc) -> PrimFunc:
    return func.with_body(_Barriers().visit(func.body))


def launch_shape(func: PrimFunc) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) from the extents of the loops bound to blockIdx.* and threadIdx.*."""
    grid, block = [1, 1, 1], [1, 1, 1]

    def f(n):
        if isinstance(n, For) and n.kind == ForKind.THREAD_BINDING:
            tag = n.thread_tag or ""
            head, _, axis = tag.partition(".")
            if head not in ("blockIdx", "threadIdx") or axis not in _DIMS:
                raise CodegenError(f"kernel '{func.name}': loop '{n.loop_var.name}' bound to {tag!r}; GPU "
                                   "kernels bind to blockIdx.x/y/z and threadIdx.x/y/z")
            if not isinstance(n.extent, E.IntImm):
                raise CodegenError(f"kernel '{func.name}': loop '{n.loop_var.name}' ({tag}) has a non-constant extent")
            d = _DIMS[axis]
            if head == "blockIdx":
                if grid[d] not in (1, n.extent.value):
                    raise CodegenError(f"kernel '{func.name}': {tag} bound twice with extents {grid[d]} and "
                                       f"{n.extent.value}")
                grid[d] = n.extent.value
            else:
                block[d] = max(block[d], n.extent.value)
    _visit_stmts(func.body, f)
    if math.prod(block) > MAX_THREADS:
        raise CodegenError(f"kernel '{func.name}': {math.prod(block)} threads per block ({block}); at most "
                           f"{MAX_THREADS}")
    return tuple(grid), tuple(block)


def shared_bytes(func: PrimFunc) -> int:
    total = [0]

    def f(n):
        if isinstance(n, Allocate) and n.buffer.scope == "shared":
            total[0] += n.buffer.numel() * max(1, dt.bits(n.buffer.dtype) // 8)
    _visit_stmts(func.body, f)
    return total[0]


def lower_gpu(sch, args, name: str) -> PrimFunc:
    """Schedule -> PrimFunc ready for a GPU code generator (pipeline run, barriers in place)."""
    func = lower(sch, args, name=name)
    func = insert_barriers(func)
    nbytes = shared_bytes(func)
    if nbytes > MAX_SHARED_BYTES:
        raise CodegenError(f"kernel '{name}': {nbytes} bytes of shared memory per block; at most {MAX_SHARED_BYTES}")
    return func


# ---------------------------------------------------------------- OpenCL C
_CTYPES = {"float32": "float", "float64": "double", "float16": "half", "int8": "char", "uint8": "uchar",
           "int16": "short", "uint16": "ushort", "int32": "int", "uint32": "uint", "int64": "long",
           "uint64": "ulong", "bool": "bool"}
_MATH = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "floor": "floor", "ceil": "ceil",
         "round": "rint", "trunc": "trunc", "pow": "pow", "exp2": "exp2", "log2": "log2", "sin": "sin", "cos": "cos"}

from host_runtime.gpu import FP64_PRAGMA  # noqa: E402 - the runtime verifies it
from host_runtime.gpu import OPENCL_PREAMBLE as _PREAMBLE

_RESERVED = {"if", "else", "for", "while", "do", "return", "break", "continue", "switch", "case", "default", "goto",
             "const", "static", "inline", "restrict", "volatile", "void", "struct", "union", "enum", "typedef",
             "sizeof", "kernel", "global", "local", "private", "constant", "generic", "barrier", "min", "max",
             "fmin", "fmax", "abs", "fabs", "exp", "log", "sqrt", "tanh", "floor", "ceil", "rint", "trunc", "pow",
             "exp2", "log2", "sin", "cos", "clamp", "select", "INFINITY", "NAN", "CLK_LOCAL_MEM_FENCE", "true",
             "false", "signed", "unsigned", "auto", "extern", "register", "asm", "printf"}


def _is_type_name(name: str) -> bool:
    return re.match(r"(u?char|u?short|u?int|u?long|float|double|half|bool|size_t|ptrdiff_t|u?intptr_t)\d*$",
                    name) is not None


def mtype(dtype: str, where: str = "") -> str:
    """The element type of a buffer: bool is stored as uchar (OpenCL has no bool in memory)."""
    return "uchar" if dtype == "bool" else ctype(dtype, where)


#: vector widths OpenCL C has types (floatN) and vloadN/vstoreN for
VECTOR_LANES = (2, 4, 8, 16)


def ctype(dtype: str, where: str = "") -> str:
    n = dt.lanes(dtype)
    base = dt.with_lanes(dtype, 1) if n != 1 else dtype
    if n != 1 and (n not in VECTOR_LANES or base == "bool"):
        raise CodegenError(f"{where}: vector type {dtype} has no OpenCL C form (lanes {', '.join(map(str, VECTOR_LANES))}"
                           ", not bool)")
    if base not in _CTYPES:
        raise CodegenError(f"{where}: type {dtype} has no OpenCL C type")
    return _CTYPES[base] + (str(n) if n != 1 else "")


def aligned_ramp(idx, lanes: int) -> E.PrimExpr | None:
    """For a unit-stride Ramp whose base is provably a multiple of `lanes` (every coefficient and
    the constant of its linear form are): the base divided by lanes, the vector's index in units
    of whole vectors (vloadN's offset; NVPTX: a lanes-aligned vector access). Else None."""
    if not isinstance(idx, E.Ramp) or not E.is_const(idx.stride, 1) or idx.lanes != lanes:
        return None
    lin = linear(idx.base)
    if lin.const % lanes or any(c % lanes for _, c in lin.terms.values()):
        return None
    out = Linear(lin.dtype, lin.const // lanes)
    out.terms = {k: [a, c // lanes] for k, (a, c) in lin.terms.items()}
    return out.to_expr()


class CodegenOpenCL:
    """PrimFunc (flattened, barriers inserted) -> one OpenCL C __kernel."""

    def __init__(self, func: PrimFunc, block: tuple[int, int, int]):
        self.func, self.block = func, block
        self.names: dict = {}
        self.used: set = set()
        self.lines: list[str] = []
        self.shared: list[str] = []
        self.uses_double = False
        self.declared: set = set()
        self.ind = 1

    def name(self, obj, hint: str) -> str:
        key = id(obj)
        if key not in self.names:
            base = "".join(c if c.isalnum() else "_" for c in hint) or "v"
            if base[0].isdigit() or base in _RESERVED or _is_type_name(base) or base.startswith(("kit_", "get_")):
                base = "v_" + base   # a tensor named 'tanh' or 'int' must not shadow a builtin
            n, k = base, 0
            while n in self.used:
                k += 1
                n = f"{base}_{k}"
            self.used.add(n)
            self.names[key] = n
        return self.names[key]

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.ind + line)

    def generate(self) -> str:
        f = self.func
        where = f"kernel '{f.name}'"
        params = []
        for b in f.params:
            params.append(f"__global {mtype(b.dtype, where)}* restrict {self.name(b, b.name)}")
        self.stmt(f.body)
        body = self.lines
        wg = f"__attribute__((reqd_work_group_size({self.block[0]}, {self.block[1]}, {self.block[2]})))"
        head = [f"__kernel {wg} void {f.name}({', '.join(params)}) {{"] + ["  " + s for s in self.shared]
        self.uses_double = any("double" in x for x in params + self.shared + body)
        fp64 = FP64_PRAGMA if self.uses_double else ""
        return fp64 + _PREAMBLE + "\n".join(head + body + ["}"]) + "\n"

    # statements
    def stmt(self, s) -> None:
        m = getattr(self, "s_" + type(s).__name__, None)
        if m is None:
            raise CodegenError(f"kernel '{self.func.name}': no OpenCL form for {type(s).__name__}")
        m(s)

    def s_SeqStmt(self, s: SeqStmt):
        for x in s.seq:
            self.stmt(x)

    def s_AttrStmt(self, s: AttrStmt):
        self.stmt(s.body)

    def s_LetStmt(self, s: LetStmt):
        self.emit(f"const {ctype(s.var.dtype)} {self.name(s.var, s.var.name)} = {self.expr(s.value)};")
        self.stmt(s.body)

    def s_Evaluate(self, s: Evaluate):
        v = s.value
        if isinstance(v, E.Call) and v.op == BARRIER:
            self.emit("barrier(CLK_LOCAL_MEM_FENCE);")
        elif isinstance(v, E.Call):
            self.emit(self.expr(v) + ";")

    def s_IfThenElse(self, s: IfThenElse):
        self.emit(f"if ({self.expr(s.condition)}) {{")
        self.block_of(s.then_case)
        if s.else_case is not None:
            self.emit("} else {")
            self.block_of(s.else_case)
        self.emit("}")

    def block_of(self, s):
        self.ind += 1
        self.stmt(s)
        self.ind -= 1

    def s_Allocate(self, s: Allocate):
        b = s.buffer
        where = f"kernel '{self.func.name}'"
        n = b.numel()
        name = self.name(b, b.name)
        if b.scope == "shared":
            if id(b) in self.declared:
                self.stmt(s.body)
                return
            self.declared.add(id(b))
            self.shared.append(f"__local {mtype(b.dtype, where)} {name}[{n}];")
        elif b.scope in ("local", "global", "warp"):
            if n * max(1, dt.bits(b.dtype) // 8) > 16384:
                raise CodegenError(f"{where}: allocation '{b.name}' ({n} elements, scope {b.scope}) is too big for "
                                   "registers; stage it at a deeper loop")
            self.emit(f"{mtype(b.dtype, where)} {name}[{n}];")
        else:
            raise CodegenError(f"{where}: allocation '{b.name}' in scope {b.scope!r}")
        self.stmt(s.body)

    def s_BufferStore(self, s: BufferStore):
        if len(s.indices) != 1:
            raise CodegenError(f"kernel '{self.func.name}': store to '{s.buffer.name}' is not flattened")
        v = self.expr(s.value)
        lanes = dt.lanes(s.value.dtype)
        if lanes != 1:
            self.emit(f"vstore{lanes}({v}, {self.vector_offset(s.buffer, s.indices[0], lanes)}, "
                      f"{self.name(s.buffer, s.buffer.name)});")
            return
        if s.buffer.dtype == "bool":
            v = f"(uchar)({v})"
        self.emit(f"{self.name(s.buffer, s.buffer.name)}[{self.index(s.buffer, s.indices[0])}] = {v};")

    def s_For(self, s: For):
        v = self.name(s.loop_var, s.loop_var.name)
        ty = ctype(s.loop_var.dtype)
        if s.kind == ForKind.THREAD_BINDING:
            head, _, axis = (s.thread_tag or "").partition(".")
            fn = "get_group_id" if head == "blockIdx" else "get_local_id"
            d = _DIMS[axis]
            self.emit("{")
            self.ind += 1
            self.emit(f"const {ty} {v} = ({ty}){fn}({d});")
            if head == "threadIdx" and s.extent.value < self.block[d]:
                if _has_barrier(s.body):
                    raise CodegenError(f"kernel '{self.func.name}': loop '{s.loop_var.name}' ({s.thread_tag}, "
                                       f"extent {s.extent.value} of {self.block[d]}) holds a barrier under a guard")
                self.emit(f"if ({v} < {s.extent.value}) {{")
                self.block_of(s.body)
                self.emit("}")
            else:
                self.stmt(s.body)
            self.ind -= 1
            self.emit("}")
            return
        lo, ext = self.expr(s.min), self.expr(s.extent)
        end = ext if E.is_const(s.min, 0) else f"{lo} + {ext}"
        self.emit(f"for ({ty} {v} = {lo}; {v} < {end}; ++{v}) {{")
        self.block_of(s.body)
        self.emit("}")

    # expressions
    def expr(self, e) -> str:
        m = getattr(self, "e_" + type(e).__name__, None)
        if m is None:
            raise CodegenError(f"kernel '{self.func.name}': no OpenCL form for expression {type(e).__name__} ({e})")
        return m(e)

    def e_IntImm(self, e):
        if e.dtype == "bool":
            return "1" if e.value else "0"
        if e.dtype in ("int64",):
            return f"{e.value}L"
        if e.dtype == "int32" and e.value == -(1 << 31):
            return "(-2147483647 - 1)"
        return f"(({ctype(e.dtype)}){e.value})" if e.dtype not in ("int32",) else str(e.value)

    def e_FloatImm(self, e):
        v = e.value
        if math.isnan(v):
            lit = "NAN"
        elif math.isinf(v):
            lit = "INFINITY" if v > 0 else "(-INFINITY)"
        else:
            lit = repr(float(v))
            if "e" not in lit and "." not in lit:
                lit += ".0"
            if e.dtype == "float32":
                lit += "f"
        return lit if e.dtype != "float16" else f"((half){lit})"

    def e_Var(self, e):
        if id(e) not in self.names:
            raise CodegenError(f"kernel '{self.func.name}': variable '{e.name}' is used outside its loop")
        return self.names[id(e)]

    def e_BufferLoad(self, e):
        if len(e.indices) != 1:
            raise CodegenError(f"kernel '{self.func.name}': load of '{e.buffer.name}' is not flattened")
        ctype(e.dtype, f"kernel '{self.func.name}'")
        lanes = dt.lanes(e.dtype)
        name = self.name(e.buffer, e.buffer.name)
        if lanes != 1:
            idx = e.indices[0]
            if aligned_ramp(idx, lanes) is not None:
                return f"vload{lanes}({self.vector_offset(e.buffer, idx, lanes)}, {name})"
            if isinstance(idx, E.Ramp) and isinstance(idx.stride, E.IntImm):
                # unaligned or strided: the lanes one by one (each index clamped), as a vector literal
                base = self.expr(idx.base)
                parts = [f"{name}[{self.index_text(e.buffer, f'({base} + {k * idx.stride.value})')}]"
                         for k in range(lanes)]
                return f"(({ctype(e.dtype)})({', '.join(parts)}))"
            raise CodegenError(f"kernel '{self.func.name}': gather from '{e.buffer.name}' with index {idx} has no "
                               "OpenCL form; keep this loop scalar")
        v = f"{name}[{self.index(e.buffer, e.indices[0])}]"
        return f"({v} != 0)" if e.buffer.dtype == "bool" else v

    def vector_offset(self, buf, idx, lanes: int) -> str:
        """vloadN/vstoreN's offset (in whole vectors), clamped so the vector lies in the array;
        the runtime's verifier requires exactly this form."""
        off = aligned_ramp(idx, lanes)
        n = max(1, buf.numel())
        if off is None or n < lanes:
            raise CodegenError(f"kernel '{self.func.name}': vector access of '{buf.name}' at {idx} is not a whole "
                               f"aligned {lanes}-vector inside its {n} elements")
        return f"kit_idx({self.expr(off)}, {n // lanes})"

    def index(self, buf, idx) -> str:
        """Every index clamped to its array (kit_idx): the runtime refuses kernels without it, so a
        kernel from a file cannot reach memory outside its buffers (host_runtime.gpu.verify_opencl)."""
        return self.index_text(buf, self.expr(idx))

    def index_text(self, buf, text: str) -> str:
        return f"kit_idx({text}, {max(1, buf.numel())})"

    def _bin(self, e, op):
        return f"({self.expr(e.a)} {op} {self.expr(e.b)})"

    def e_Add(self, e): return self._bin(e, "+")
    def e_Sub(self, e): return self._bin(e, "-")
    def e_Mul(self, e): return self._bin(e, "*")
    def e_Div(self, e): return self._bin(e, "/")
    def e_BitAnd(self, e): return self._bin(e, "&")
    def e_BitOr(self, e): return self._bin(e, "|")
    def e_BitXor(self, e): return self._bin(e, "^")
    def e_Shl(self, e): return self._bin(e, "<<")
    def e_Shr(self, e): return self._bin(e, ">>")
    def e_And(self, e): return self._bin(e, "&&")
    def e_Or(self, e): return self._bin(e, "||")
    def e_EQ(self, e): return self._bin(e, "==")
    def e_NE(self, e): return self._bin(e, "!=")
    def e_LT(self, e): return self._bin(e, "<")
    def e_LE(self, e): return self._bin(e, "<=")
    def e_GT(self, e): return self._bin(e, ">")
    def e_GE(self, e): return self._bin(e, ">=")

    def e_Not(self, e):
        return f"(!{self.expr(e.a)})"

    def _floor(self, e, mod: bool):
        a, b = self.expr(e.a), self.expr(e.b)
        if dt.is_float(e.dtype):
            return f"({a} - floor({a} / {b}) * {b})" if mod else f"floor({a} / {b})"
        if isinstance(e.b, E.IntImm) and e.b.value > 0 and _nonneg(e.a):
            return f"({a} {'%' if mod else '/'} {b})"
        if dt.lanes(e.dtype) != 1:
            raise CodegenError(f"kernel '{self.func.name}': vector floor division; keep this loop scalar")
        if e.dtype == "int64":
            return f"kit_f{'mod' if mod else 'div'}l({a}, {b})"
        return f"(({ctype(e.dtype)})kit_f{'mod' if mod else 'div'}((int)({a}), (int)({b})))" \
            if e.dtype != "int32" else f"kit_f{'mod' if mod else 'div'}({a}, {b})"

    def e_FloorDiv(self, e): return self._floor(e, False)
    def e_FloorMod(self, e): return self._floor(e, True)

    def _minmax(self, e, is_min):
        f = ("fmin" if is_min else "fmax") if dt.is_float(e.dtype) else ("min" if is_min else "max")
        return f"{f}({self.expr(e.a)}, {self.expr(e.b)})"

    def e_Min(self, e): return self._minmax(e, True)
    def e_Max(self, e): return self._minmax(e, False)

    def e_Select(self, e):
        if dt.lanes(e.cond.dtype) != 1:
            # component-wise: select(false, true, mask) needs a mask of the values' width
            if dt.bits(e.dtype) != 32:
                raise CodegenError(f"kernel '{self.func.name}': vector select on {e.dtype}; keep this loop scalar")
            return f"select({self.expr(e.false_value)}, {self.expr(e.true_value)}, {self.expr(e.cond)})"
        return f"(({self.expr(e.cond)}) ? {self.expr(e.true_value)} : {self.expr(e.false_value)})"

    def e_Cast(self, e):
        if dt.lanes(e.dtype) != 1:
            return f"convert_{ctype(e.dtype)}({self.expr(e.value)})"
        return f"(({ctype(e.dtype)})({self.expr(e.value)}))"

    def e_Broadcast(self, e):
        return f"(({ctype(e.dtype)})({self.expr(e.value)}))"

    def e_Ramp(self, e):
        if not isinstance(e.stride, E.IntImm):
            raise CodegenError(f"kernel '{self.func.name}': ramp with a variable stride; keep this loop scalar")
        base = self.expr(e.base)
        return f"(({ctype(e.dtype)})({', '.join(f'({base} + {k * e.stride.value})' for k in range(e.lanes))}))"

    def e_Call(self, e):
        if e.op == "fabs":
            x = self.expr(e.args[0])
            return f"fabs({x})" if dt.is_float(e.dtype) else f"abs({x})"
        if e.op in _MATH:
            return f"{_MATH[e.op]}({', '.join(self.expr(a) for a in e.args)})"
        raise CodegenError(f"kernel '{self.func.name}': call {e.op!r} has no OpenCL form (extern calls are not "
                           "allowed in GPU kernels)")


def _has_barrier(s) -> bool:
    hit = []
    _visit_stmts(s, lambda n: hit.append(n) if _is_barrier(n) else None)
    return bool(hit)


def _nonneg(e) -> bool:
    """True for index expressions built from loop variables, non-negative constants, + and *."""
    if isinstance(e, E.IntImm):
        return e.value >= 0
    if isinstance(e, E.Var):
        return True   # loop variables run from 0 (the lowering's loops all start there)
    if isinstance(e, (E.Add, E.Mul, E.FloorDiv, E.FloorMod)):
        return _nonneg(e.a) and _nonneg(e.b)
    if isinstance(e, E.Ramp):
        return _nonneg(e.base) and isinstance(e.stride, E.IntImm) and e.stride.value >= 0
    if isinstance(e, E.Broadcast):
        return _nonneg(e.value)
    return False


def build_opencl(func: PrimFunc) -> GpuKernel:
    """OpenCL C for a GPU-lowered PrimFunc (lower_gpu)."""
    grid, block = launch_shape(func)
    src = CodegenOpenCL(func, block).generate()
    params = [(b.const_shape(), b.dtype) for b in func.params]
    return GpuKernel(func.name, "opencl", src, grid, block, params, shared_bytes(func))



def build_gpu(sch, args, target: str = "opencl", name: str = "main") -> GpuKernel:
    """A GPU schedule -> GpuKernel for target "opencl" (OpenCL C) or "cuda" (PTX through NVPTX)."""
    func = lower_gpu(sch, args, name)
    if target == "opencl":
        return build_opencl(func)
    if target == "cuda":
        from .nvptx import build_ptx  # noqa: PLC0415 - import cycle: nvptx imports opencl
        return build_ptx(func)
    raise CodegenError(f"GPU target {target!r}; GPU targets are opencl, cuda")
