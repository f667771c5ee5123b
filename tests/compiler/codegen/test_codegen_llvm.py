"""LLVM CPU code generation: vector instructions, parallel execution, cross-compiled ARM
objects, integer semantics, intrinsics, runtime argument checks."""
import ctypes
import re
import struct
import threading

import numpy as np
import pytest

from compiler import build, lower, ops, te, tir
from compiler.codegen import register_extern, runtime
from compiler.errors import CodegenError
from tests.compiler.conftest import run_schedule


def vec_add(n=256, lanes=16):
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] * B[i] + 1.0, name="C")
    s = te.create_schedule(C)
    xo, xi = s[C].split(C.op.axis[0], lanes)
    s[C].vectorize(xi)
    return s, [A, B, C]


def elf_header(obj: bytes):
    assert obj[:4] == b"\x7fELF"
    ei_class = obj[4]           # 1: 32-bit, 2: 64-bit
    (e_machine,) = struct.unpack_from("<H", obj, 18)
    return ei_class, e_machine


def test_vectorize_emits_vector_ir_and_simd_asm(rng):
    s, args = vec_add()
    mod = build(s, args)
    ll = mod.get_source("ll")
    assert "<16 x float>" in ll
    asm = mod.get_source("asm")
    assert re.search(r"v(fmadd\w*|mulps|addps)\s.*%(zmm|ymm)", asm), "no packed SIMD arithmetic"
    a, b = rng.random(256, dtype=np.float32), rng.random(256, dtype=np.float32)
    c = np.zeros(256, np.float32)
    mod(a, b, c)
    np.testing.assert_allclose(c, a * b + 1, rtol=1e-6)


def test_unvectorized_schedule_has_no_explicit_vectors_before_llvm():
    A = te.placeholder((8,), name="A")
    C = te.compute((8,), lambda i: A[i] + 1.0, name="C")
    s = te.create_schedule(C)
    mod = build(s, [A, C], target="llvm -O0")
    assert "x float>" not in mod.get_source("ll")


def test_parallel_matches_serial_and_uses_threads(rng):
    n = 64
    A = te.placeholder((n, n), name="A")
    seen = set()

    @ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int32)
    def record(i):
        seen.add(threading.get_ident())
        return 0
    register_extern("kit_test_record_tid", record)
    B = te.compute((n, n), lambda i, j: A[i, j] * 3.0 + j, name="B")
    s_ser = te.create_schedule(B)
    s_par = te.create_schedule(B)
    s_par[B].parallel(B.op.axis[0])
    a = rng.random((n, n), dtype=np.float32)
    ser = run_schedule(s_ser, [A, B], [a])
    par = run_schedule(s_par, [A, B], [a])
    np.testing.assert_array_equal(ser, par)
    mod = build(s_par, [A, B])
    assert "__kit_parallel_launch" in mod.get_source("ll")

    # an extern call inside the parallel loop records which threads ran the chunks
    f = lower(s_par, [A, B])
    body = f.body
    assert isinstance(body, tir.For) and body.kind == tir.ForKind.PARALLEL
    probe = tir.For(body.loop_var, body.min, body.extent, tir.ForKind.PARALLEL,
                    tir.seq(tir.Evaluate(tir.call_extern("int32", "kit_test_record_tid", body.loop_var)), body.body))
    old = runtime.num_threads()
    runtime.set_num_threads(4)
    native = runtime.native_runtime()
    if native is not None:   # no backing off to the caller alone on a loaded machine
        native.configure(adaptive=0)
    try:
        m2 = build(f.with_body(probe), target="llvm")
        out = np.zeros((n, n), np.float32)
        # helpers join a loop only while chunks are left: the first launch starts them, later
        # ones find them spinning (a late helper is never waited for)
        for _ in range(2000):
            m2(a, out)
            if len(seen) >= 2:
                break
    finally:
        runtime.set_num_threads(old)
        if native is not None:
            native.configure()
    np.testing.assert_array_equal(out, ser)
    assert len(seen) >= 2, "the parallel loop ran on one thread only"


def test_parallel_loop_with_tail_and_intermediate_buffer(rng):
    A = te.placeholder((30, 7), name="A")
    B = te.compute((30, 7), lambda i, j: A[i, j] + 1.0, name="B")
    C = te.compute((30, 7), lambda i, j: B[i, j] * B[i, j], name="C")
    s = te.create_schedule(C)
    io, ii = s[C].split(C.op.axis[0], 4)
    s[C].parallel(io)
    s[B].compute_at(s[C], io)
    a = rng.random((30, 7), dtype=np.float32)
    np.testing.assert_allclose(run_schedule(s, [A, C], [a]), (a + 1) ** 2, rtol=1e-6)


@pytest.mark.parametrize("target,ei_class,machine,simd", [
    ("llvm -mtriple=armv7a-linux-gnueabihf -mcpu=cortex-a9 -mattr=+neon", 1, 40, r"v(mla|mul)\.f32\s+q"),
    ("pynq", 1, 40, r"v(mla|mul)\.f32\s+q"),
    ("aarch64-linux-gnu cortex-a53", 2, 183, r"f(mla|mul)\s+v\d+\.4s"),
    ("ultra96", 2, 183, r"f(mla|mul)\s+v\d+\.4s"),
])
def test_cross_compile_arm_objects(target, ei_class, machine, simd, tmp_path):
    s, args = vec_add(lanes=4)
    mod = build(s, args, target=target)
    assert elf_header(mod.object_code) == (ei_class, machine)
    asm = mod.get_source("asm")
    assert re.search(simd, asm), "no NEON vector arithmetic in the object"
    path = tmp_path / "f.o"
    mod.save(str(path))
    assert path.read_bytes() == mod.object_code
    with pytest.raises(CodegenError, match="cannot run on this host"):
        mod()


def test_host_object_is_x86_64():
    s, args = vec_add()
    mod = build(s, args, target="llvm")
    obj = mod.target.target_machine().emit_object(mod._llvm_module)
    assert elf_header(obj) == (2, 62)


def test_integer_floor_division_semantics():
    A = te.placeholder((1,), "int32", name="A")   # unused input keeps the signature simple
    D = te.compute((20,), lambda i: (i - 10) // 3 + A[0] * 0, name="D")
    M = te.compute((20,), lambda i: (i - 10) % 3 + D[i] * 0, name="M")
    s = te.create_schedule(M)
    out = run_schedule(s, [A, M], [np.zeros(1, np.int32)])
    ref = (np.arange(20) - 10) % 3
    np.testing.assert_array_equal(out, ref)
    s = te.create_schedule(D)
    np.testing.assert_array_equal(run_schedule(s, [A, D], [np.zeros(1, np.int32)]), (np.arange(20) - 10) // 3)


@pytest.mark.parametrize("heads", [2, 4, 8])
def test_select_with_out_of_range_loads_on_the_side_not_taken(heads, rng):
    """A concat read through a reshape (ONNX RotaryEmbedding's): each side of the select loads at
    an index that is out of its buffer on the lanes of the other side. Loads clamp their index
    and a select picks, so LLVM's loop vectorizer has no predicated load to widen; with a branch
    per element, LLVM 20-22 vectorized it for znver4 into a contiguous masked load of the
    broadcast operand and lanes 8-11 of every 16 read the wrong row."""
    x = te.placeholder((2, 3, heads, 4), name="x")
    c = te.placeholder((2, 3, 1, 4), name="c")
    y = te.compute((2, 3, heads * 8), lambda n, t, j: te.select(
        j % 8 < 4, c[n, t, 0, j % 8] * x[n, t, j // 8, j % 8], x[n, t, j // 8, j % 8 - 4] + 1.0), name="y")
    s = te.create_schedule(y)
    jo, ji = s[y].split(y.op.axis[2], 16 if heads > 2 else 8)
    xv, cv = rng.standard_normal((2, 3, heads, 4)).astype(np.float32), rng.standard_normal((2, 3, 1, 4)).astype(np.float32)
    want = np.concatenate([cv * xv, xv + 1], axis=3).reshape(2, 3, -1)
    np.testing.assert_array_equal(run_schedule(s, [x, c, y], [xv, cv]), want)


def test_select_guarding_an_integer_division_still_branches():
    """x // d where d may be 0 stays on the side taken (a division by zero traps on x86)."""
    a = te.placeholder((64,), "int32", name="a")
    d = te.placeholder((64,), "int32", name="d")
    y = te.compute((64,), lambda i: te.select(d[i] != 0, a[i] // d[i], a[i]), name="y")
    av, dv = np.arange(64, dtype=np.int32) - 20, np.tile(np.array([0, 3, -2, 0], np.int32), 16)
    want = np.where(dv != 0, av // np.where(dv != 0, dv, 1), av)
    np.testing.assert_array_equal(run_schedule(te.create_schedule(y), [a, d, y], [av, dv]), want)


def test_math_intrinsics(rng):
    A = te.placeholder((32,), name="A")
    B = te.compute((32,), lambda i: te.exp(A[i]) + te.log(A[i] + 1.0) + te.tanh(A[i]) + te.sigmoid(A[i]), name="B")
    s = te.create_schedule(B)
    xo, xi = s[B].split(B.op.axis[0], 8)
    s[B].vectorize(xi)
    a = rng.random(32, dtype=np.float32)
    ref = np.exp(a) + np.log(a + 1) + np.tanh(a) + 1 / (1 + np.exp(-a))
    np.testing.assert_allclose(run_schedule(s, [A, B], [a]), ref, rtol=1e-5)


def test_large_intermediate_goes_to_heap(rng):
    n = 200 * 200   # 160 kB of float32, above the stack limit
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((n,), lambda i: B[i] + 1.0, name="C")
    s = te.create_schedule(C)
    mod = build(s, [A, C])
    assert "@malloc" in mod.get_source("ll") and "@free" in mod.get_source("ll")
    a = rng.random(n, dtype=np.float32)
    out = np.zeros(n, np.float32)
    mod(a, out)
    np.testing.assert_allclose(out, a * 2 + 1)


def test_extern_call_from_generated_code():
    calls = []

    @ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32)
    def fill(ptr, n):
        arr = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n,))
        arr[:] = 7.0
        calls.append(n)
        return 0
    register_extern("kit_test_fill", fill)
    B = tir.Buffer("B", (8,))
    f = tir.PrimFunc("fill8", [B], tir.Evaluate(tir.call_extern("int32", "kit_test_fill", B.access_ptr(), 8)))
    mod = build(f, target="llvm")
    out = np.zeros(8, np.float32)
    mod(out)
    assert calls == [8] and (out == 7).all()


def test_argument_checks_name_the_parameter():
    s, args = vec_add()
    mod = build(s, args)
    a = np.zeros(256, np.float32)
    with pytest.raises(CodegenError, match="argument 'B' has shape \\(255,\\), expected \\(256,\\)"):
        mod(a, np.zeros(255, np.float32), a.copy())
    with pytest.raises(CodegenError, match="argument 'A' has dtype float64"):
        mod(np.zeros(256), a.copy(), a.copy())
    with pytest.raises(CodegenError, match="takes 3 arrays"):
        mod(a)
    with pytest.raises(CodegenError, match="not C-contiguous"):
        mod(np.zeros(512, np.float32)[::2], a.copy(), a.copy())


def test_time_and_sources():
    s, args = vec_add()
    mod = build(s, args)
    arrs = [np.ones(256, np.float32) for _ in range(3)]
    assert mod.time(*arrs, number=2, repeat=1) > 0
    assert "def main" in mod.get_source("tir")
    with pytest.raises(CodegenError, match="unknown format"):
        mod.get_source("ptx")


@pytest.mark.parametrize("lanes", [1, 8, 16])
def test_float32_exp_is_inline_and_within_two_ulp(lanes):
    """exp on float32 is emitted in registers (no libm call per lane), within 2 ulp of float64 over
    the whole normal range, with exp(+inf) = inf, exp(-inf) = 0, NaN kept and overflow to inf."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-87.3, 88.7, 4000), rng.standard_normal(4000) * 3, np.arange(-87, 89, 0.25),
                        [0.0, 1e-30, -1e-30, 88.72, -87.33]]).astype(np.float32)
    x = np.resize(x, (len(x) // 16) * 16).reshape(-1, lanes)   # lanes 1: the scalar form
    f = ops.compile_op("exp", [x.shape])
    assert not any("call" in ln and "exp" in ln for ln in f.module.get_source("asm").splitlines())
    want = np.exp(x.astype(np.float64))
    got = f(x).astype(np.float64)
    normal = (want >= np.finfo(np.float32).tiny) & (want <= np.finfo(np.float32).max)
    assert np.isinf(got[want > np.finfo(np.float32).max]).all()
    ulp = np.spacing(want[normal].astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got[normal] - want[normal]) / ulp) <= 2.0
    special = np.array([np.inf, -np.inf, np.nan, 88.73, 1e30, -1e30, -100.0, 0.0], np.float32)
    g = ops.compile_op("exp", [special.shape])
    out = g(special)
    np.testing.assert_array_equal(out[[0, 1, 3, 4, 5, 6, 7]], np.float32([np.inf, 0, np.inf, np.inf, 0, 0, 1]))
    assert np.isnan(out[2])


@pytest.mark.parametrize("lanes", [1, 16])
def test_float32_tanh_is_inline_and_within_two_ulp(lanes):
    """tanh on float32 is emitted in registers (a libm call per lane made ESPCN's tanh convs 5x
    slower than onnxruntime): within 2 ulp of float64 on both sides of the branch at 0.625,
    saturating to +-1, odd (tiny values keep their sign), NaN kept."""
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.uniform(-10, 10, 4000), rng.standard_normal(4000) * 0.5, np.arange(-9, 9, 0.01),
                        [0.0, 1e-30, -1e-30, 1e-8, 0.6249, 0.625, 0.6251, -0.625, 44.0, 89.0]]).astype(np.float32)
    x = np.resize(x, (len(x) // 16) * 16).reshape(-1, lanes)
    f = ops.compile_op("tanh", [x.shape])
    assert not any("call" in ln and "tanh" in ln for ln in f.module.get_source("asm").splitlines())
    want = np.tanh(x.astype(np.float64))
    got = f(x).astype(np.float64)
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - want) / ulp) <= 2.0
    special = np.array([np.inf, -np.inf, np.nan, 1e30, -1e30, 1e-30, -1e-30, 0.0], np.float32)
    out = ops.compile_op("tanh", [special.shape])(special)
    np.testing.assert_array_equal(out[[0, 1, 3, 4, 5, 6, 7]], np.float32([1, -1, 1, -1, 1e-30, -1e-30, 0]))
    assert np.isnan(out[2])
