"""The flushing GEMM (Gemm.flush with EPILOGUE) at its hazards, on the reference model, fsim, tsim and
the RTL (tiny config): a seed that the micro-op just ahead writes (the RTL's S3 -> S2 seed bypass),
a seed the micro-op two ahead writes (the read port's write-through), a flushed entry summed again
later in the same instruction, the conv pattern the compiler emits (a seed per output-channel
block), and a requantization into the accumulator (EPILOGUE to_acc) that the next GEMM adds to.
Every executor must leave the same DRAM bytes, and tsim the RTL's cycles."""
import numpy as np
import pytest

from accel.isa import PRESETS, MemType, flush_immediate
from host_runtime import Device, get_driver
from sim.reference import run_reference
from sim.verilator.build import tools_available

TINY = PRESETS["tiny"]


def _program(case: str, seed: int = 0):
    """A small program: random inputs, weights and accumulators loaded, one EPILOGUE and one
    flushing GEMM shaped by `case`, then the output and (through a MOV to out) the accumulator
    entries stored."""
    c, rng = TINY, np.random.default_rng(seed)
    dev = Device(c, driver=None, dram_bytes=1 << 18)
    s, mem = dev.stream(), dev.memory
    n = 16
    inp = mem.alloc_array(rng.integers(-128, 128, n * c.inp_elem_bytes).astype(np.int8), name="inp", align=64)
    wgt = mem.alloc_array(rng.integers(-128, 128, n * c.wgt_elem_bytes).astype(np.int8), name="wgt", align=64)
    acc = mem.alloc_array(rng.integers(-5000, 5000, 2 * n * c.acc_elem_bytes // 4).astype(np.int32), name="acc",
                          align=64)
    s.load_2d(MemType.INP, 0, inp, 0, x_size=n)
    s.load_2d(MemType.WGT, 0, wgt, 0, x_size=n)
    s.dep_push("load", "compute")
    s.dep_pop("load", "compute")
    s.load_2d(MemType.ACC, 0, acc, 0, x_size=2 * n)
    imm = flush_immediate(4, 100, lo_zero=False, round_half=True)

    def gemm(name, loops, uops):
        def build(k):
            for lp in loops:
                k.loop_begin(*lp)
            for u in uops:
                k.push(*u)
            for _ in loops:
                k.loop_end()
        s.push_gemm(s.kernel(name, build), flush=True)
    if case == "seed_just_ahead":       # pass p's seed is the entry pass p-1 flushed, one micro-op ahead
        s.push_epilogue(imm, 4, seed_factor_out=1)   # one loop level: the outer one
        gemm(case, [(6, 1, 1, 1)], [(5, 0, 0)])
        # passes write 5..10 and read seeds 4..9: each seed is the previous micro-op's destination
    elif case == "seed_two_ahead":      # two micro-ops per pass: pass p's seed 3+p is what pass p-1 flushed
        s.push_epilogue(imm, 3, seed_factor_out=1)
        gemm(case, [(6, 1, 1, 1)], [(2, 3, 1), (4, 0, 0)])
    elif case == "summed_after_flush":  # entry 8 flushed in pass 0, then summed into by later passes
        s.push_epilogue(imm, 20, seed_factor_out=1, seed_factor_in=2)
        gemm(case, [(2, 0, 1, 1), (3, 0, 2, 0)], [(8, 0, 2), (7, 3, 1), (8, 1, 0)])
    elif case == "conv":                # what compiler.accel.conv2d emits: o blocks x pixels, seeds per block
        s.push_epilogue(imm, 28, seed_factor_out=1)
        gemm(case, [(2, 8, 0, 2), (8, 1, 1, 0)], [(0, 0, 0), (0, 8, 1)])
    elif case == "to_acc_then_summed":  # requantized into acc (a fused residual's conv), then summed into again
        s.push_epilogue(flush_immediate(6, 127, symmetric=True), to_acc=True)
        gemm(case, [(2, 8, 0, 2), (8, 1, 1, 0)], [(0, 0, 0), (0, 8, 1)])
        s.push_epilogue(imm, 28, seed_factor_out=1)
        gemm(case + " 2", [(16, 1, 1, 0)], [(0, 0, 3)])   # entry p += inp[p] @ wgt[3], then flushed
    else:
        raise ValueError(case)
    s.push_alu(s.kernel("acc to out", lambda k: (k.loop_begin(2 * n, 1, 1), k.push(2 * n, 0), k.loop_end())),
               "MOV")   # the accumulator's entries 0..31 -> out 32..63
    s.dep_push("compute", "store")
    s.dep_pop("compute", "store")
    out = mem.alloc(4 * n * c.out_elem_bytes, name="out", align=64)
    s.store_2d(0, out, x_size=4 * n)
    return s.program({}), out


CASES = ["seed_just_ahead", "seed_two_ahead", "summed_after_flush", "conv", "to_acc_then_summed"]


@pytest.mark.parametrize("case", CASES)
def test_flushing_gemm_fsim_matches_reference(case):
    prog, out = _program(case)
    want = run_reference(TINY, prog.insns, prog.dram_image())
    got = prog.dram_image()
    get_driver("fsim", TINY).run(got, prog.insn_addr, len(prog.insns))
    assert np.array_equal(got, want)
    flushed = got[out.addr:out.addr + out.nbytes].view(np.int8)
    assert flushed.any()   # the program did store something


@pytest.mark.rtl
@pytest.mark.skipif(tools_available() is not None, reason=f"rtl driver: {tools_available()}")
@pytest.mark.parametrize("case", CASES)
def test_flushing_gemm_rtl_and_tsim_match_fsim(case):
    prog, _ = _program(case)
    images, stats = {}, {}
    for name in ("fsim", "tsim", "rtl"):
        images[name] = prog.dram_image()
        d = get_driver(name, TINY)
        try:
            stats[name] = d.run(images[name], prog.insn_addr, len(prog.insns)).stats
        finally:
            d.close()
    for name in ("tsim", "rtl"):
        bad = np.flatnonzero(images[name] != images["fsim"])
        assert bad.size == 0, f"{name}: DRAM differs from fsim at {bad.size} bytes, first {bad[:1]}"
    assert stats["tsim"]["cycles"] == stats["rtl"]["cycles"]
