"""host_runtime.commands: instruction emission, dependency-flag placement, kernels, errors."""
import numpy as np
import pytest

from accel.isa import PRESETS, Alu, AluOp, Finish, Gemm, Load, MemType, Program, Stage, Store
from compiler.accel.conv2d import Conv2dSpec, Requant, emit_conv2d, plan_conv2d
from host_runtime import CommandError, Device

TINY = PRESETS["tiny"]
L, C, S = Stage.LOAD, Stage.COMPUTE, Stage.STORE


@pytest.fixture
def dev():
    return Device(TINY, dram_bytes=1 << 16)


def _one(kb):
    kb.push(0, 0, 0)


def test_commands_dep_push_flags_last_instruction_of_stage(dev):
    s = dev.stream()
    buf = dev.memory.alloc(1024)
    s.load_2d(MemType.INP, 0, buf, x_size=2)
    s.load_2d(MemType.WGT, 0, buf, x_size=1)
    s.dep_push(L, C)
    assert s.insns[1].push_next and not s.insns[0].push_next
    s.dep_pop(L, C)
    s.push_gemm(s.kernel("k", _one))
    # the first compute instruction (the micro-op LOAD the kernel needs) pops the token
    assert isinstance(s.insns[2], Load) and s.insns[2].mem_type == MemType.UOP and s.insns[2].pop_prev
    assert isinstance(s.insns[3], Gemm) and not s.insns[3].pop_prev


def test_commands_dep_push_inserts_noop_when_stage_has_no_free_instruction(dev):
    s = dev.stream()
    s.dep_push(C, S)  # no compute instruction yet
    s.dep_push(C, S)  # the no-op already pushes: another one
    assert len(s) == 2 and all(isinstance(i, Gemm) and i.uop_bgn == i.uop_end and i.push_next for i in s.insns)
    s.dep_pop(C, S)
    s.dep_pop(C, S)  # two pops for the next store: the first goes on a no-op
    s.store_2d(0, dev.memory.alloc(64), x_size=1)
    assert [type(i) for i in s.insns[2:]] == [Store, Store] and s.insns[2].pop_prev and s.insns[3].pop_prev
    assert s.insns[2].y_size == 0


def test_commands_push_after_pending_pop_commits_the_pop_first(dev):
    s = dev.stream()
    s.push_gemm(s.kernel("k", _one))
    s.dep_push(C, L)
    s.dep_pop(C, L)      # pending on the load stage
    s.dep_push(L, C)     # must come after that pop: a load no-op carrying both
    last = s.insns[-1]
    assert isinstance(last, Load) and last.pop_next and last.push_next and last.y_size == 0


def test_commands_finish_waits_for_loads_and_stores(dev):
    s = dev.stream()
    buf, out = dev.memory.alloc(1024), dev.memory.alloc(1024)
    s.load_2d(MemType.INP, 0, buf, x_size=1)
    s.dep_push(C, S)
    s.dep_pop(C, S)
    s.store_2d(0, out, x_size=1)   # not over what the load reads: no token orders the two
    insns = s.finish()
    assert insns[0].push_next and insns[2].push_prev
    assert isinstance(insns[-1], Finish) and insns[-1].pop_prev and insns[-1].pop_next
    assert s.finish() is insns  # idempotent
    r = s.synchronize()
    assert r.stats["insns"]["FINISH"] == 1 and not r.stats.get("leftover_tokens")
    assert len(s) == 0 and len(s.last_insns) == len(insns)  # reset, reusable


def test_commands_finish_reuses_outstanding_store_token(dev):
    s = dev.stream()
    s.dep_push(C, S)
    s.dep_pop(C, S)
    s.store_2d(0, dev.memory.alloc(64), x_size=1)
    s.dep_push(S, C)  # pushed but not popped: FINISH takes it
    insns = s.finish()
    assert sum(isinstance(i, Store) for i in insns) == 1 and insns[-1].pop_next


@pytest.mark.parametrize("calls, match", [
    (lambda s: s.dep_pop(L, C), "no token is outstanding"),
    (lambda s: s.dep_push(L, S), "neighbouring stages"),
    (lambda s: s.dep_push("load", "fetch"), "unknown stage"),
    (lambda s: [s.dep_push(C, L) for _ in range(TINY.dep_queue_depth + 1)], "queue of depth"),
    (lambda s: (s.dep_push(C, L), s.finish()), "compute->load are never popped"),
    (lambda s: (s.dep_push(S, C), s.dep_push(S, C), s.finish()), "store->compute are never popped"),
    (lambda s: (s.finish(), s.dep_push(C, S)), "finished"),
])
def test_commands_bad_tokens_raise(dev, calls, match):
    with pytest.raises(CommandError, match=match):
        calls(dev.stream())


@pytest.mark.parametrize("call, match", [
    (lambda s, b: s.load_2d(MemType.INP, TINY.inp_depth - 4, b, y_size=2, x_size=2, x_pad1=1), "exceeds the INP"),
    (lambda s, b: s.load_2d(MemType.ACC, 0, b.addr + 4, x_size=1), "not aligned"),
    (lambda s, b: s.load_2d(MemType.WGT, 0, b, 60, x_size=8), "outside Buffer"),
    (lambda s, b: s.load_2d(MemType.INP, 0, b, x_size=1, y_pad0=16), "y_pad0=16"),
    (lambda s, b: s.load_2d(MemType.INP, 0, b, x_size=1 << 16), "x_size=65536"),
    (lambda s, b: s.load_2d(MemType.UOP, 0, b, x_size=1), "kernels"),
    (lambda s, b: s.load_2d(MemType.OUT, 0, b, x_size=1), "cannot write the output"),
    (lambda s, b: s.load_2d("bogus", 0, b, x_size=1), "unknown memory type"),
    (lambda s, b: s.load_2d(MemType.INP, 0, 1 << 20, x_size=1), "outside DRAM"),
    (lambda s, b: s.store_2d(TINY.out_depth - 1, b, y_size=2, x_size=1), "exceeds the OUT"),
    (lambda s, b: s.push_gemm(s.kernel("far", lambda k: (k.loop_begin(4, dst_factor=100), k.push(0)))), "dst index"),
    (lambda s, b: s.push_gemm(s.kernel("wgt", lambda k: (k.loop_begin(2, wgt_factor=TINY.wgt_depth - 1),
                                                          k.push(0, 0, 1)))), "wgt index reaches"),
    (lambda s, b: s.kernel("field", lambda k: k.push(0, 0, TINY.wgt_depth)), "field wgt=128"),
    (lambda s, b: s.push_alu(s.kernel("k", lambda k: k.push(0)), AluOp.ADD, 1 << 15), "imm=32768"),
    (lambda s, b: s.push_alu(s.kernel("k", lambda k: k.push(0)), "pow"), "unknown ALU op"),
    (lambda s, b: s.push_alu(s.kernel("k", lambda k: k.push(0)), AluOp.ADD, use_imm=True), "use_imm=True needs an imm"),
    (lambda s, b: s.kernel("big", lambda k: [k.push(0) for _ in range(TINY.uop_depth + 1)]), "micro-op buffer"),
    (lambda s, b: s.kernel("order", lambda k: (k.push(0), k.loop_begin(2))), "loop_begin after push"),
    (lambda s, b: s.kernel("three", lambda k: [k.loop_begin(2) for _ in range(3)]), "more than 2 loops"),
    (lambda s, b: s.kernel("zero", lambda k: k.loop_begin(0)), "extent 0"),
    (lambda s, b: s.kernel("neg", lambda k: k.push(-1)), "dst=-1"),
    (lambda s, b: s.kernel("end", lambda k: k.loop_end()), "without a matching"),
])
def test_commands_bad_input_raises(dev, call, match):
    buf = dev.memory.alloc(64 * TINY.wgt_elem_bytes, align=64)
    with pytest.raises(CommandError, match=match):
        call(dev.stream(), buf)


def test_commands_kernels_recorded_once_loaded_once_per_stream(dev):
    calls = []

    def build(kb):
        calls.append(1)
        kb.loop_begin(3, dst_factor=1, src_factor=1)
        kb.push(0, 5)
    s = dev.stream()
    k = s.kernel("add", build)
    assert s.kernel("add", build) is k and len(calls) == 1
    s.push_alu(k, AluOp.ADD)
    s.push_alu(k, AluOp.SHR, 3)
    uop_loads = [i for i in s.insns if isinstance(i, Load) and i.mem_type == MemType.UOP]
    assert len(uop_loads) == 1
    alus = [i for i in s.insns if isinstance(i, Alu)]
    assert alus[0].iter_out == 3 and alus[0].dst_factor_out == 1 and not alus[0].use_imm
    assert alus[1].use_imm and alus[1].imm == 3 and alus[1].uop_bgn == alus[0].uop_bgn
    s.synchronize()
    s.push_alu(dev.stream().kernel("add", build), AluOp.MOV, 1)  # a new stream loads it again
    assert len(calls) == 1 and isinstance(s.insns[0], Load) and s.insns[0].mem_type == MemType.UOP


def test_commands_uop_buffer_starts_over_when_full(dev):
    n = TINY.uop_depth * 2 // 3
    s = dev.stream()
    ka = s.kernel("a", lambda k: [k.push(i % 8) for i in range(n)])
    kb = s.kernel("b", lambda k: [k.push(i % 8) for i in range(n)])
    for k in (ka, kb, ka):
        s.push_gemm(k, reset=True)
    loads = [i for i in s.insns if isinstance(i, Load)]
    gemms = [i for i in s.insns if isinstance(i, Gemm)]
    assert len(loads) == 3 and all(g.uop_bgn == 0 and g.uop_end == n for g in gemms)
    r = s.synchronize()
    assert r.stats["gemm_uops"] == 3 * n


def test_commands_preload_loads_kernels_once_up_front(dev):
    """preload: one LOAD for the kernels not yet resident (copied back to back into one DRAM block),
    none where they are used; kernels that do not all fit in the free entries load where used."""
    s = dev.stream()
    ks = [s.kernel(f"k{i}", lambda k, i=i: [k.push(j % 8, j % 4) for j in range(i + 2)]) for i in range(3)]
    s.push_alu(ks[0], AluOp.ADD, 1)
    s.preload(ks + [ks[0]])                     # k0 is resident already: k1 and k2 only
    assert len(s.insns) == 3 and s.insns[2].x_size == 3 + 4
    for k in ks:
        s.push_alu(k, AluOp.ADD)
    alus = [i for i in s.insns if isinstance(i, Alu)]
    assert len(s.insns) == 3 + 3 and [a.uop_end - a.uop_bgn for a in alus] == [2, 2, 3, 4]
    assert alus[2].uop_bgn == alus[1].uop_end == 2 and alus[3].uop_bgn == 5
    assert list(s.kernels_used) == ["k0", "k1", "k2"]
    s.synchronize()
    big = dev.stream()
    huge = [big.kernel(f"h{i}", lambda k: [k.push(0) for _ in range(TINY.uop_depth // 2 + 1)]) for i in range(2)]
    big.preload(huge)
    assert not big.insns                        # more than the buffer holds: nothing preloaded


@pytest.mark.parametrize("vt", [1, 2])
def test_commands_emit_preloaded_conv_loads_its_kernels_first(vt):
    """A conv emitted with its kernels preloaded (as compiled layers are): one micro-op LOAD, the
    first compute instruction; the bytes are those of the conv emitted without it."""
    spec = Conv2dSpec(1, 12, 6, 8, 8, 1, 1)
    outs = []
    for preload in (False, True):
        rng = np.random.default_rng(0)
        dev = Device(TINY, dram_bytes=1 << 20)
        bufs = {n: dev.memory.alloc_array(rng.integers(-128, 128, 4096, dtype=np.int8), align=64) for n in ("x", "w")}
        bias = dev.memory.alloc_array(rng.integers(-999, 999, 64, dtype=np.int32), align=64)
        out = dev.memory.alloc(8 * 6 * 8, align=64)
        t = plan_conv2d(spec, TINY, vt)
        s = dev.stream()

        def emit(st):
            return emit_conv2d(st, spec, t, bufs["x"], bufs["w"], out, bias, Requant(7, -127, 127))
        s.emit_preloaded(emit) if preload else emit(s)
        uop_loads = [k for k, i in enumerate(s.insns) if isinstance(i, Load) and i.mem_type == MemType.UOP]
        first_compute = next(k for k, i in enumerate(s.insns) if i.stage == Stage.COMPUTE)
        s.synchronize()
        outs.append(out.read(np.int8, (8 * 6 * 8,)))
        if preload:
            assert uop_loads == [first_compute]
        else:
            assert len(uop_loads) > 1
    assert np.array_equal(outs[0], outs[1])


def test_commands_program_matches_synchronize(dev):
    rng = np.random.default_rng(1)
    cfg = TINY
    x = rng.integers(-128, 128, (3, cfg.batch, cfg.block_in), dtype=np.int8)
    w = rng.integers(-128, 128, (2, cfg.block_out, cfg.block_in), dtype=np.int8)
    xb, wb = dev.memory.alloc_array(x, name="x"), dev.memory.alloc_array(w, name="w")
    ob = dev.memory.alloc(3 * 2 * cfg.out_elem_bytes, name="o")

    def emit(s):
        s.load_2d(MemType.INP, 0, xb, x_size=3)
        s.load_2d(MemType.WGT, 0, wb, x_size=2)
        s.dep_push(L, C)
        s.dep_pop(L, C)
        s.push_gemm(s.kernel("rst", lambda k: (k.loop_begin(6, dst_factor=1), k.push(0))), reset=True)
        s.push_gemm(s.kernel("mm", lambda k: (k.loop_begin(3, dst_factor=2, src_factor=1),
                                              k.loop_begin(2, dst_factor=1, wgt_factor=1), k.push(0, 0, 0))))
        s.dep_push(C, S)
        s.dep_pop(C, S)
        s.store_2d(0, ob, x_size=6)
    s = dev.stream()
    emit(s)
    prog = Program.from_bytes(s.program().to_bytes())
    emit(s2 := dev.stream())
    s2.synchronize()
    want = (x.reshape(3, -1).astype(np.int32) @ w.reshape(2, cfg.block_out, cfg.block_in).transpose(2, 0, 1)
            .reshape(cfg.block_in, -1)).astype(np.int8)
    assert np.array_equal(ob.read(np.int8, (3, 2 * cfg.block_out)), want)
    dram = prog.dram_image()
    Device(cfg, driver="fsim").driver.run(dram, prog.insn_addr, len(prog.insns))
    assert np.array_equal(dram[ob.addr:ob.end], dev.memory.array[ob.addr:ob.end])


def test_flushing_gemm_bad_input_is_named(dev):
    """A flushing GEMM with no EPILOGUE before it, an EPILOGUE field out of range, and seeds that
    the loops carry past the accumulator each fail at the call, naming what is wrong."""
    s = dev.stream()
    k = s.kernel("flush", lambda b: (b.loop_begin(4, 1, 1), b.push(0, 0, 0), b.loop_end()))
    with pytest.raises(CommandError, match="no push_epilogue"):
        s.push_gemm(k, flush=True)
    with pytest.raises(CommandError, match=r"seed_base=.* outside \[0, "):
        s.push_epilogue(0, TINY.acc_depth)
    with pytest.raises(CommandError, match="imm=70000 outside"):
        s.push_epilogue(70000, 0)
    s.push_epilogue(0, TINY.acc_depth - 2, seed_factor_out=1)   # seeds acc_depth-2 .. acc_depth+1
    with pytest.raises(CommandError, match="seed index reaches"):
        s.push_gemm(k, flush=True)
    s.push_epilogue(0, TINY.acc_depth - 2, seed_factor_out=1, to_acc=True)   # to_acc reads no seed
    s.push_gemm(k, flush=True)
