"""The accelerator as the compiler sees it: sizes from one AccelConfig, the on-chip memory scopes,
and the GEMM tensor intrinsic, declared once (as VTA's Environment).

    env = AccelEnv(cfg)
    env.gemm          # te TensorIntrin: (batch x block_in) . (block_out x block_in)^T -> acc tile
    env.entry_elems("inp_buffer")   # elements of one on-chip entry (batch * block_in)

Every buffer index the lowering passes produce counts entries of the scope's memory; an entry is
one (batch, block) tile, the unit LOAD/STORE/GEMM/ALU address.
"""
from __future__ import annotations

from dataclasses import dataclass

from accel.isa import AccelConfig, MemType

from ... import te
from ...errors import CompilerError
from ...tir import expr as E
from ...tir.stmt import Buffer, Evaluate, seq

INP_SCOPE = "inp_buffer"
WGT_SCOPE = "wgt_buffer"
ACC_SCOPE = "acc_buffer"
SCOPES = (INP_SCOPE, WGT_SCOPE, ACC_SCOPE)

# intrinsic call names of the lowered IR (codegen.py executes them)
GEMM = "accel.gemm"                # gemm(&acc[.], &inp[.], &wgt[.]) after tensorize
GEMM_RESET = "accel.gemm_reset"    # gemm_reset(&acc[.])
LOAD_2D = "accel.load_2d"          # load_2d(mem, sram, sram_off, dram, dram_off, y, x, stride, yp0, yp1, xp0, xp1)
STORE_2D = "accel.store_2d"        # store_2d(sram, sram_off, dram, dram_off, y, x, stride)
UOP = "accel.uop"                  # uop(dst_buf, dst, src_buf, src, wgt_buf, wgt) inside a uop kernel
DEP_PUSH = "accel.dep_push"        # dep_push(from_stage, to_stage)
DEP_POP = "accel.dep_pop"          # dep_pop(from_stage, to_stage)
UOP_KERNEL = "accel.uop_kernel"    # AttrStmt key: a GEMM/ALU instruction over a micro-op kernel
UOP_LOOP = "accel.uop_loop"        # For annotation: (dst, src, wgt) factors of an affine loop level


class LowerError(CompilerError):
    """The accelerator lowering cannot map a loop nest onto an instruction; says which and why."""


def _int_dtype(bits: int) -> str:
    return f"int{bits}"


@dataclass(frozen=True)
class UopOp:
    """What a micro-op kernel drives: a GEMM (reset or accumulate) or an ALU op with an immediate
    or accumulator operand. Printed as the node of the accel.uop_kernel attribute."""
    kind: str                  # "gemm" | "alu"
    reset: bool = False
    alu_op: str | None = None  # AluOp name
    imm: int | None = None

    @property
    def name(self) -> str:
        if self.kind == "gemm":
            return "gemm.reset" if self.reset else "gemm"
        return f"alu.{self.alu_op.lower()}" + (f"(imm={self.imm})" if self.imm is not None else "(src)")


class AccelEnv:
    """Sizes, dtypes and scopes of one AccelConfig, and the GEMM intrinsic."""

    def __init__(self, cfg: AccelConfig):
        self.cfg = cfg
        self.batch, self.block_in, self.block_out = cfg.batch, cfg.block_in, cfg.block_out
        self.inp_dtype = _int_dtype(cfg.inp_width)
        self.wgt_dtype = _int_dtype(cfg.wgt_width)
        self.acc_dtype = _int_dtype(cfg.acc_width)
        self.out_dtype = _int_dtype(cfg.out_width)
        self.gemm = self._declare_gemm()

    # ---- scopes ----------------------------------------------------------------------------
    def entry_elems(self, scope: str) -> int:
        """Elements of one entry of the scope's on-chip memory (or of its DRAM counterpart)."""
        return {INP_SCOPE: self.batch * self.block_in, WGT_SCOPE: self.block_out * self.block_in,
                ACC_SCOPE: self.batch * self.block_out}[self._check(scope)]

    def mem_type(self, scope: str) -> MemType:
        return {INP_SCOPE: MemType.INP, WGT_SCOPE: MemType.WGT, ACC_SCOPE: MemType.ACC}[self._check(scope)]

    def depth(self, scope: str) -> int:
        c = self.cfg
        return {INP_SCOPE: c.inp_depth, WGT_SCOPE: c.wgt_depth, ACC_SCOPE: c.acc_depth}[self._check(scope)]

    def _check(self, scope: str) -> str:
        if scope not in SCOPES:
            raise LowerError(f"'{scope}' is not an accelerator scope; scopes are {', '.join(SCOPES)}")
        return scope

    # ---- the GEMM intrinsic ------------------------------------------------------------------
    def _declare_gemm(self):
        b, bi, bo = self.batch, self.block_in, self.block_out
        inp = te.placeholder((b, bi), self.inp_dtype, "inp")
        wgt = te.placeholder((bo, bi), self.wgt_dtype, "wgt")
        k = te.reduce_axis(bi, "k")
        out = te.compute((b, bo), lambda i, j: te.sum(inp[i, k].astype(self.acc_dtype) *
                                                      wgt[j, k].astype(self.acc_dtype), axis=k), name="gemm")

        def emit(ins, outs):
            x, w = ins
            y = outs[0]
            reset = Evaluate(E.Call("void", GEMM_RESET, [y.access_ptr()]))
            update = Evaluate(E.Call("void", GEMM, [y.access_ptr(), x.access_ptr(), w.access_ptr()]))
            return seq(reset, update), reset, update

        binds = {inp: Buffer("inp", (b, bi), self.inp_dtype, scope=INP_SCOPE),
                 wgt: Buffer("wgt", (bo, bi), self.wgt_dtype, scope=WGT_SCOPE),
                 out: Buffer("gemm", (b, bo), self.acc_dtype, scope=ACC_SCOPE)}
        return te.decl_tensor_intrin(out.op, emit, name="accel.gemm", binds=binds)
