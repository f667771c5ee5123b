"""Focused tests of each accelerator lowering pass (Before/Expected or behaviour), and of the two
compiler-core fixes the TE path needed."""
import pytest

from accel.isa import PRESETS
from compiler import lower, te, tir
from compiler.accel.conv2d import Conv2dSpec, ConvTiling, Requant
from compiler.accel.lower import lower_conv2d
from compiler.accel.lower.env import DEP_POP, DEP_PUSH, LOAD_2D, STORE_2D, UOP_KERNEL, UOP_LOOP, AccelEnv, LowerError
from compiler.accel.lower.passes import InjectALU, InjectDMA, LiftGuards
from compiler.tir import expr as E
from compiler.tir.functor import assert_structural_equal, collect
from compiler.tir.stmt import Allocate, AttrStmt, Buffer, BufferStore, Evaluate, For, ForKind, IfThenElse, PrimFunc

TINY = PRESETS["tiny"]          # 1x4x4: entries of 4 (inp, acc) and 16 (wgt) elements
ENV = AccelEnv(TINY)


def _calls(f, op):
    return [c for c in collect(f.body, (E.Call,)) if c.op == op]


def _ints(args):
    return [a.value if isinstance(a, E.IntImm) else a for a in args]


# ---- LiftGuards ---------------------------------------------------------------------------------
def test_lift_guards_turns_a_tail_guard_into_the_loop_extent():
    t, x = tir.Var("t"), tir.Var("x")
    a = Buffer("a", (20,), "int32")
    before = PrimFunc("f", [a], For(t, 0, 2, ForKind.SERIAL, For(x, 0, 3, ForKind.SERIAL,
                      IfThenElse(t * 3 + x < 5, BufferStore(a, E.const(1), [t * 3 + x])))))
    expected = PrimFunc("f", [a], For(t, 0, 2, ForKind.SERIAL, For(x, 0, E.min_expr(E.const(3), 5 - t * 3),
                        ForKind.SERIAL, BufferStore(a, E.const(1), [t * 3 + x]))))
    got = LiftGuards()(before)
    assert_structural_equal(tir.simplify(got.body.body.extent), tir.simplify(expected.body.body.extent))
    assert isinstance(got.body.body.body, BufferStore)


def test_lift_guards_hoists_a_guard_that_does_not_use_the_loop():
    t, x, n = tir.Var("t"), tir.Var("x"), tir.Var("n")
    a = Buffer("a", (20,), "int32")
    f = PrimFunc("f", [a], For(t, 0, 4, ForKind.SERIAL, For(x, 0, 3, ForKind.SERIAL,
                 IfThenElse(n < 3, BufferStore(a, E.const(1), [x])))))
    got = LiftGuards()(f)
    assert isinstance(got.body, IfThenElse) and isinstance(got.body.then_case, For)


# ---- InjectDMA ----------------------------------------------------------------------------------
def _copy(extents, value_fn, sram_shape, scope="inp_buffer", dram_shape=(1, 10, 10, 4)):
    vars_ = [tir.Var(f"ax{i}") for i in range(len(extents))]
    sram = Buffer("s", sram_shape, "int8", scope=scope)
    dram = Buffer("d", dram_shape, "int8")
    idx = E.const(0)
    stride = 1
    for v, n in reversed(list(zip(vars_, extents))):
        idx = idx + v * stride
        stride *= n
    body = BufferStore(sram, value_fn(dram, vars_), [idx])
    for v, n in reversed(list(zip(vars_, extents))):
        body = For(v, 0, n, ForKind.SERIAL, body)
    body = Allocate(sram, AttrStmt(vars_[0], "pragma_dma_copy", 1, body))
    return PrimFunc("f", [dram], body)


def test_inject_dma_folds_padding_into_the_load():
    # a 5x5 window at rows/cols -1.. of a 10x10 image: one row and one column of padding
    def value(d, v):
        y, x, c = v
        return E.select(E.logical_and(y >= 1, x >= 1), d.vload([0])[()] if False else
                        E.BufferLoad(d, [(y - 1) * 40 + (x - 1) * 4 + c]), E.const(0, "int8"))
    f = _copy((5, 5, 4), value, (100,))
    out = InjectDMA(ENV)(tir.passes.get_pass("Simplify")(f))
    (c,) = _calls(out, LOAD_2D)
    mem, sram, off, dram, doff, *sizes = c.args
    assert mem.value == "inp" and _ints([off]) == [0]
    assert _ints([tir.simplify(a) for a in sizes]) == [4, 4, 10, 1, 0, 1, 0]   # y, x, stride, pads
    assert tir.simplify(doff).value == 0                                     # first unpadded entry


def test_inject_dma_merges_contiguous_rows_and_keeps_outer_loops():
    # weights (o=2, ic=2, kh*kw=3) of a (4, 4, 3) tensor: ic and k merge into one x row of 6 entries
    def value(d, v):
        o, i, k, e = v
        return E.BufferLoad(d, [o * 192 + i * 48 + k * 16 + e])
    f = _copy((2, 2, 3, 16), value, (192,), scope="wgt_buffer", dram_shape=(4 * 4 * 3 * 16,))
    out = InjectDMA(ENV)(tir.passes.get_pass("Simplify")(f))
    (c,) = _calls(out, LOAD_2D)
    assert _ints([tir.simplify(a) for a in c.args[5:8]]) == [2, 6, 12]   # 2 rows of 6, DRAM stride 12


def test_inject_dma_store_from_accumulator():
    a = Buffer("acc", (2 * 3 * 4,), "int32", scope="acc_buffer")
    out_ = Buffer("out", (2 * 5 * 4,), "int8")
    y, x, e = tir.Var("y"), tir.Var("x"), tir.Var("e")
    body = AttrStmt(y, "pragma_dma_copy", 1, For(y, 0, 2, ForKind.SERIAL, For(x, 0, 3, ForKind.SERIAL, For(
        e, 0, 4, ForKind.SERIAL, BufferStore(out_, E.cast(E.BufferLoad(a, [y * 12 + x * 4 + e]), "int8"),
                                             [y * 20 + x * 4 + e])))))
    f = PrimFunc("f", [out_], Allocate(a, body))
    (c,) = _calls(InjectDMA(ENV)(f), STORE_2D)
    assert _ints([tir.simplify(v) for v in c.args[4:]]) == [2, 3, 5]


def test_inject_dma_rejects_a_non_copy():
    def value(d, v):
        return E.BufferLoad(d, [v[0] * 4 + v[1]]) + E.const(1, "int8")
    f = _copy((3, 4), value, (12,))
    with pytest.raises(LowerError, match="is not a copy"):
        InjectDMA(ENV)(f)


# ---- InjectALU ----------------------------------------------------------------------------------
def _alu_func(value_fn):
    src = Buffer("conv", (3 * 4,), "int32", scope="acc_buffer")
    dst = Buffer("clip", (3 * 4,), "int32", scope="acc_buffer")
    i, e = tir.Var("i"), tir.Var("e")
    body = AttrStmt(i, "pragma_alu", 1, For(i, 0, 3, ForKind.SERIAL, For(e, 0, 4, ForKind.SERIAL, BufferStore(
        dst, value_fn(E.BufferLoad(src, [i * 4 + e])), [i * 4 + e]))))
    return PrimFunc("f", [], Allocate(src, Allocate(dst, body)))


@pytest.mark.parametrize("lo,ops", [(-127, ["alu.clip(imm=127)"]), (0, ["alu.min(imm=127)", "alu.max(imm=0)"])])
def test_inject_alu_clip_and_in_place(lo, ops):
    out = InjectALU(ENV)(_alu_func(lambda v: E.max_expr(E.min_expr(v, 127), lo)))
    kernels = [n for n in collect(out.body, (AttrStmt,)) if n.key == UOP_KERNEL]
    assert [k.node.name for k in kernels] == ops
    # in place: the clip buffer is gone, the micro-ops address conv; one loop level of 3 entries
    assert "clip = allocate" not in out.script() and "conv" in out.script()
    lp = kernels[0].body
    assert lp.annotations[UOP_LOOP] == (1, 0, 0) and lp.extent.value == 3


def test_inject_alu_shift_left_is_a_negative_shr():
    out = InjectALU(ENV)(_alu_func(lambda v: v << E.const(2)))
    assert [n.node.name for n in collect(out.body, (AttrStmt,)) if n.key == UOP_KERNEL] == ["alu.shr(imm=-2)"]


def test_inject_alu_rejects_what_the_alu_cannot_do():
    with pytest.raises(LowerError, match="not an accelerator ALU operation"):
        InjectALU(ENV)(_alu_func(lambda v: v // E.const(3)))


# ---- FoldUopLoop (through the conv2d pipeline) --------------------------------------------------
def test_fold_uop_loop_uses_both_affine_levels():
    spec = Conv2dSpec(1, 8, 6, 6, 8, 3, 3, (1, 1, 1, 1), (1, 1))
    f = lower_conv2d(spec, TINY, Requant(4), vt=1, tiling=ConvTiling(2, 6, 6, 2, 1), stop_after="FoldUopLoop")
    (k,) = [n for n in collect(f.body, (AttrStmt,)) if n.key == UOP_KERNEL and n.node.name == "gemm"]
    outer, inner = k.body, k.body.body
    # rows: dst +6 (w_t), src +8 (padded columns); columns: dst +1, src +1; weights fixed
    assert (outer.extent.value, outer.annotations[UOP_LOOP]) == (6, (6, 8, 0))
    assert (inner.extent.value, inner.annotations[UOP_LOOP]) == (6, (1, 1, 0))
    n_uops = 1
    for lp in collect(inner.body, (For,)):
        n_uops *= lp.extent.value
    assert n_uops == 2 * 2 * 3 * 3   # o_t * ic_t * kh * kw, independent of the 6x6 tile


# ---- InjectTokens / LowerVirtualThreads ---------------------------------------------------------
def test_inject_tokens_brackets_producer_and_consumer():
    spec = Conv2dSpec(1, 8, 6, 6, 8, 3, 3, (1, 1, 1, 1), (1, 1))
    f = lower_conv2d(spec, TINY, Requant(4), vt=1, tiling=ConvTiling(2, 6, 6, 2, 1), stop_after="InjectTokens")
    deps = [(c.op, c.args[0].value, c.args[1].value) for c in collect(f.body, (E.Call,))
            if c.op in (DEP_PUSH, DEP_POP)]
    # program start primes one token per slot, the end drains it
    assert deps[0] == (DEP_PUSH, "compute", "load") and (DEP_POP, "compute", "load") in deps[-2:]
    text = f.script()
    assert text.index("dep_pop('compute', 'load')") < text.index("load_2d('inp'") < \
        text.index("dep_push('load', 'compute')") < text.index("dep_pop('load', 'compute')") < \
        text.index("attr(gemm,") < text.index("dep_push('compute', 'load')", text.index("attr(gemm,"))
    assert text.index("dep_pop('compute', 'store')") < text.index("store_2d(")


def test_lower_virtual_threads_interleaves_with_slot_offsets():
    spec = Conv2dSpec(1, 8, 6, 6, 8, 3, 3, (1, 1, 1, 1), (1, 1))
    f = lower_conv2d(spec, TINY, Requant(4), vt=2, tiling=ConvTiling(1, 6, 6, 2, 2))
    text = f.script()
    assert "vthread" not in text
    # thread 1's input slot follows thread 0's: ic_t x 8 x 8 padded rows/columns = 128 entries
    assert "load_2d('inp', data_pad.inp_buffer_1, ax1 * 64 + 128," in text
    # interleaved: both threads' loads come before either thread's GEMM in each chunk
    first_gemm = text.index("attr(gemm,")
    assert text.count("load_2d('inp'", 0, first_gemm) == 2


# ---- compiler-core fixes -------------------------------------------------------------------------
def test_core_compute_at_a_transitive_consumer():
    a = te.placeholder((8,), "int32", "a")
    b = te.compute((8,), lambda i: a[i] + 1, name="b")
    c = te.compute((8,), lambda i: b[i] * 2, name="c")
    d = te.compute((8,), lambda i: c[i] - 1, name="d")
    s = te.create_schedule(d)
    xo, xi = s[d].split(d.op.axis[0], 4)
    s[c].compute_at(s[d], xo)
    s[b].compute_at(s[d], xo)     # d reads b only through c
    f = lower(s, [a, d])
    assert "b = allocate(int32[4]" in f.script()


def test_core_substitute_reaches_tensorize_views():
    base = Buffer("acc", (16,), "int32")
    v = tir.Var("v")
    view = Buffer("acc.view", (4,), "int32", elem_offset=v * 4, base=base)
    st = Evaluate(E.Call("handle", "address_of", [E.BufferLoad(view, [E.const(0)])]))
    out = tir.substitute(st, {v: E.const(2)})
    assert tir.simplify(out.value.args[0].buffer.elem_offset).value == 8
