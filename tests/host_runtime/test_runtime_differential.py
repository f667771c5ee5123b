"""Random programs built through the command stream: the functional simulator against the plain
reference model (sim/reference.py), bit for bit over the whole DRAM."""
import numpy as np
import pytest
from randprog import expected_outputs, random_program

import sim.fsim as fsim_mod
from accel.isa import PRESETS, AccelConfig, Alu, Gemm, Load, MemType, Store
from sim.fsim import Fsim
from sim.reference import run_reference

ODD = AccelConfig(batch=2, block_in=8, block_out=16)
CONFIGS = {"tiny": PRESETS["tiny"], "default": PRESETS["default"], "odd": ODD}
SEEDS = range(60)


def _both(cfg, prog):
    want = run_reference(cfg, prog.insns, prog.dram_image())
    got = prog.dram_image()
    stats = Fsim(cfg).run(got, prog.insn_addr, len(prog.insns))
    return got, want, stats


def _first_diff(got, want, regions):
    i = int(np.flatnonzero(got != want)[0])
    where = [n for n, (a, nb) in regions.items() if a <= i < a + nb]
    return f"first differing byte {i:#x} ({where[0] if where else 'outside the output regions'})"


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seed", SEEDS)
def test_fsim_matches_reference_on_random_programs(name, seed):
    cfg = CONFIGS[name]
    prog, regions = random_program(cfg, seed)
    got, want, stats = _both(cfg, prog)
    assert np.array_equal(got, want), f"{name} seed {seed}: {_first_diff(got, want, regions)}"
    assert not stats.leftover_tokens


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_fsim_matches_reference_on_many_random_programs(name):
    cfg = CONFIGS[name]
    for seed in range(1000, 1500):
        prog, regions = random_program(cfg, seed, n_blocks=6)
        got, want, _ = _both(cfg, prog)
        assert np.array_equal(got, want), f"{name} seed {seed}: {_first_diff(got, want, regions)}"


def test_randprog_is_deterministic_and_writes_its_regions():
    cfg = CONFIGS["tiny"]
    a, ra = random_program(cfg, 7)
    b, rb = random_program(cfg, 7)
    assert a.to_bytes() == b.to_bytes() and ra == rb
    got = a.dram_image()
    Fsim(cfg).run(got, a.insn_addr, len(a.insns))
    for name, data in expected_outputs(a, ra).items():
        addr, n = ra[name]
        assert np.array_equal(got[addr:addr + n], data), name
    changed = 0
    for seed in SEEDS:
        prog, regions = random_program(cfg, seed)
        start = prog.dram_image()
        end = run_reference(cfg, prog.insns, prog.dram_image())
        assert regions and set(regions) == set(prog.symbols)
        assert not np.array_equal(start, end)
        changed += sum(not np.array_equal(start[a:a + n], end[a:a + n]) for a, n in regions.values())
        outside = np.ones(start.size, bool)
        for a, n in regions.values():
            outside[a:a + n] = False
        assert np.array_equal(start[outside], end[outside]), f"seed {seed}: a store wrote outside its region"
    assert changed >= len(SEEDS)  # stores overwrite the noise in their regions


def test_randprog_covers_the_isa():
    """Over the default seeds: every ALU op with both operand kinds, padding on every side of
    INP/WGT/ACC loads, GEMM with and without reset over two loop levels, overlap (two slots),
    strided stores, the micro-op buffer starting over, and flushing GEMMs over two loop levels."""
    seen = set()
    for seed in SEEDS:
        prog, _ = random_program(CONFIGS["tiny"], seed)
        uop_top = 0
        for i in prog.insns:
            if isinstance(i, Alu) and i.uop_end > i.uop_bgn:
                seen.add(("alu", i.alu_op.name, i.use_imm))
            elif isinstance(i, Gemm) and i.uop_end > i.uop_bgn:
                seen.add(("gemm", i.reset, i.iter_out > 1 and i.iter_in > 1))
                if i.flush and i.iter_out > 1 and i.iter_in > 1:
                    seen.add("gemm flush")
            elif isinstance(i, Load) and i.mem_type == MemType.UOP:
                if i.sram_base < uop_top:
                    seen.add("uop restart")
                uop_top = i.sram_base + i.x_size
            elif isinstance(i, Load) and i.y_size:
                for pad in ("y_pad0", "y_pad1", "x_pad0", "x_pad1"):
                    if getattr(i, pad):
                        seen.add((i.mem_type.name, pad))
            elif isinstance(i, Store) and i.x_stride > i.x_size and i.y_size > 1:
                seen.add("strided store")
        n_load = sum(isinstance(i, Load) and i.mem_type in (MemType.INP, MemType.WGT) for i in prog.insns)
        if n_load and any(i.pop_next for i in prog.insns if isinstance(i, Load)):
            seen.add("load waits on compute")
    want = {("alu", op, imm) for op in ("MIN", "MAX", "ADD", "SHR", "MUL", "CLIP", "MOV", "CLAMP") for imm in (False, True)}
    want |= {(m, p) for m in ("INP", "WGT", "ACC") for p in ("y_pad0", "y_pad1", "x_pad0", "x_pad1")}
    want |= {("gemm", True, True), ("gemm", False, True), "uop restart", "strided store", "load waits on compute",
             "gemm flush"}
    assert want <= seen, f"not covered: {sorted(map(str, want - seen))}"


def test_differential_check_catches_a_wrong_simulator(monkeypatch):
    """The comparison can fail: an fsim whose ALU immediates are off by one is caught."""
    orig = fsim_mod.Fsim._alu_operand

    def off_by_one(self, insn, src):
        b = orig(self, insn, src)
        return b + 1 if insn.use_imm else b
    monkeypatch.setattr(fsim_mod.Fsim, "_alu_operand", off_by_one)
    caught = 0
    for seed in range(40):
        prog, _ = random_program(CONFIGS["tiny"], seed)
        got, want, _ = _both(CONFIGS["tiny"], prog)
        caught += not np.array_equal(got, want)
    assert caught >= 5
