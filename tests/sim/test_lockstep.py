"""Lockstep co-simulation (sim/lockstep.py, flows/lockstep.py, `accel run --lockstep`): no
divergence on correct random programs and compiled layers; a fault injected into one executor is
named at its instruction (stepped executors) or at the STORE that writes its damage, with the
instruction behind it (executors run as a whole: prefixes); prefixes are valid programs."""
from __future__ import annotations

import json

import numpy as np
import pytest
from benchmod import load_bench
from randprog import random_program

from accel.cli import main
from accel.isa import PRESETS, Store, Uop, encode_program, encode_uops
from accel.isa.asm import format_insn
from compiler.frontend import zoo
from compiler.graph_build import build_model
from flows.lockstep import factory, lockstep_model
from host_runtime.device import _DRIVERS, RunResult, register_driver
from host_runtime.drivers.fsim import FsimDriver
from sim.errors import ExecError
from sim.fsim import Fsim
from sim.lockstep import LockstepError, RecordingFsim, _run_prefix, dump_layout, lockstep, prefix_program
from sim.verilator.build import tools_available

CONFIGS = ["tiny", "default"]


def _stored_writer(cfg, prog):
    """(store index, OUT entry, last instruction changing that entry before the store) such that
    flipping a bit of the entry after that instruction changes the DRAM the program leaves (a later
    write of the same value would mask it)."""
    dram = prog.dram_image()
    ref = RecordingFsim(cfg)
    good = dram.copy()
    ref.run(good, prog.insn_addr, len(prog.insns))
    for st, x in enumerate(prog.insns):
        if isinstance(x, Store) and x.y_size and x.x_size:
            for e in range(x.sram_base, x.sram_base + x.y_size * x.x_size):
                w = [i for i, eff in ref.effects.items()
                     if i < st and "out" in eff.writes and e in eff.writes["out"][0]]
                if w:
                    bad = dram.copy()
                    RecordingFsim(cfg, fault=_fault(max(w), e)).run(bad, prog.insn_addr, len(prog.insns))
                    if not np.array_equal(bad, good):
                        return st, e, max(w)
    pytest.skip("the program stores nothing it computed")


def _fault(at: int, entry: int, insn=None):
    """Flip a bit of OUT entry `entry` after instruction `at` (and only that instruction, where a
    prefix program puts other instructions at the same index)."""
    def plain(i):   # a prefix drops the token pushes nothing in it pops
        return i.with_deps(pop_prev=False, pop_next=False, push_prev=False, push_next=False)

    def f(idx, ins, sim, dram):
        if idx == at and (insn is None or plain(ins) == plain(insn)):
            sim.out[entry] ^= 1
    return f


class _Whole:
    """An executor that cannot be single-stepped (no effect log): forces the prefix mode."""

    def __init__(self, cfg, fault=None):
        self.sim = RecordingFsim(cfg, fault=fault)

    def run(self, dram, insn_addr, insn_count):
        return self.sim.run(dram, insn_addr, insn_count)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_correct_program_has_no_divergence(config, seed):
    cfg = PRESETS[config]
    prog, _ = random_program(cfg, seed)
    r = lockstep(cfg, prog.insns, prog.dram_image(), prog.insn_addr, lambda: RecordingFsim(cfg),
                 lambda: RecordingFsim(cfg), ("fsim", "fsim2"))
    assert r.mode == "effects" and not r.diverged, r.text()
    r = lockstep(cfg, prog.insns, prog.dram_image(), prog.insn_addr, lambda: RecordingFsim(cfg),
                 lambda: _Whole(cfg), ("fsim", "whole"))
    assert r.mode == "prefix" and not r.diverged, r.text()


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", [3, 4])
def test_fault_named_at_its_instruction(config, seed):
    cfg = PRESETS[config]
    prog, _ = random_program(cfg, seed)
    st, entry, writer = _stored_writer(cfg, prog)
    fault = _fault(writer, entry, prog.insns[writer])
    r = lockstep(cfg, prog.insns, prog.dram_image(), prog.insn_addr, lambda: RecordingFsim(cfg),
                 lambda: RecordingFsim(cfg, fault=fault), ("fsim", "bad"))
    assert r.diverged and r.divergence.index == writer, r.text()
    assert any(line.startswith(f"out[{entry}]:") for line in r.divergence.lines), r.text()
    assert f"instruction {writer}:" in r.text()
    # run as a whole: prefixes with the OUT buffer dumped name the same instruction and entry
    r = lockstep(cfg, prog.insns, prog.dram_image(), prog.insn_addr, lambda: RecordingFsim(cfg),
                 lambda: _Whole(cfg, fault), ("fsim", "whole"))
    assert r.mode == "prefix" and r.diverged, r.text()
    assert r.divergence.index == writer, r.text()
    assert any(line.startswith(f"out[{entry}]:") for line in r.divergence.lines), r.text()


@pytest.mark.parametrize("config", CONFIGS)
def test_every_prefix_is_a_valid_program(config):
    """Each prefix runs to FINISH with no token left over, and the last one leaves the full
    program's DRAM."""
    cfg = PRESETS[config]
    prog, _ = random_program(cfg, 7)
    dram = prog.dram_image()
    full = dram.copy()
    Fsim(cfg).run(full, prog.insn_addr, len(prog.insns))

    def run_prefix(k, dump):
        p = prefix_program(prog.insns, k, cfg, layout if dump else None)
        d = np.concatenate([dram, np.zeros(end - dram.size, np.uint8), encode_program(p, cfg).reshape(-1)])
        d[layout.uop:layout.uop + cfg.uop_elem_bytes] = encode_uops([Uop(0, 0, 0)], cfg).reshape(-1)
        stats = Fsim(cfg, check_races=True).run(d, end, len(p))   # a race would fail the run
        return d, stats
    layout, end = dump_layout(cfg, dram.size)
    for k in range(len(prog.insns) - 1):
        for dump in (False, True):
            _, stats = run_prefix(k, dump)
            assert not stats.leftover_tokens, (k, stats.leftover_tokens)
    last = max(i for i, x in enumerate(prog.insns) if isinstance(x, Store))
    d, _ = run_prefix(last, True)
    assert np.array_equal(d[:dram.size], full)
    # the dumps hold the buffers as fsim leaves them after the whole program
    sim = Fsim(cfg)
    sim.run(dram.copy(), prog.insn_addr, len(prog.insns))
    eb = cfg.out_elem_bytes
    out = d[layout.out:layout.out + layout.out_entries * eb].view(sim.out.dtype).reshape(sim.out.shape)
    assert np.array_equal(out, sim.out)
    acc = d[layout.acc:layout.acc + layout.acc_entries * eb].view(sim.out.dtype)
    assert np.array_equal(acc.reshape(-1), sim.acc[:layout.acc_entries].astype(sim.out.dtype).reshape(-1))


class _FaultyDriver(FsimDriver):
    """The fsim driver with one OUT entry flipped after instruction `at` (set by the test)."""
    at = entry = -1
    insn = None

    def __init__(self, cfg, **kw):
        super().__init__(cfg, **kw)
        self.sim = RecordingFsim(cfg, fault=_fault(type(self).at, type(self).entry, type(self).insn))

    def run(self, dram, insn_addr, insn_count):
        self.sim.run(dram, insn_addr, insn_count)
        return RunResult(self.name, insn_count, 0.0, {})


@pytest.fixture
def faulty_driver():
    """_FaultyDriver as driver 'faulty_lockstep_test' for one test (the registry is global)."""
    register_driver("faulty_lockstep_test")(_FaultyDriver)
    yield _FaultyDriver
    _DRIVERS.pop("faulty_lockstep_test", None)


def test_cli_program_lockstep(tmp_path, capsys, faulty_driver):
    cfg = PRESETS["tiny"]
    prog, _ = random_program(cfg, 3)
    path = tmp_path / "p.accp"
    prog.save(path)
    assert main(["run", str(path), "--lockstep", "fsim,tsim"]) == 0
    assert "no divergence" in capsys.readouterr().out
    st, entry, writer = _stored_writer(cfg, prog)
    _FaultyDriver.at, _FaultyDriver.entry, _FaultyDriver.insn = writer, entry, prog.insns[writer]
    assert main(["run", str(path), "--lockstep", "fsim,faulty_lockstep_test"]) == 1
    out = capsys.readouterr().out
    assert f"first divergence at instruction {writer}: {format_insn(prog.insns[writer])}" in out
    assert f"out[{entry}]:" in out
    assert main(["run", str(path), "--lockstep", "fsim"]) == 2
    assert main(["run", str(path), "--lockstep", "fsim,nosuch"]) == 2
    err = capsys.readouterr().err
    assert "name two executors" in err and "unknown executor 'nosuch'" in err


def test_compiled_model_lockstep_names_the_step():
    model = zoo.residual_block()
    feeds = zoo.sample_inputs(model, 2, seed=0)
    mod = build_model(model, target="accel", config="tiny", calibration=feeds[:1])
    steps = [s for s in mod.steps if s.kind == "accel"]
    made = []

    def spy():
        made.append(RecordingFsim(mod.config))
        return made[-1]
    rep = lockstep_model(mod, feeds[1], "fsim", "fsim", make_a=spy)
    assert not rep.diverged and [n for n, _ in rep.steps] == [s.name for s in steps], rep.text()
    assert "no divergence in" in rep.text()
    # a fault in one step's computation (the last): that step and instruction are named
    t = len(steps) - 1
    j, eff = next((i, e) for i, e in sorted(made[t].effects.items()) if "out" in e.writes)
    entry = int(eff.writes["out"][0][0])
    calls = []

    def make_bad():
        calls.append(1)
        return RecordingFsim(mod.config, fault=_fault(j, entry) if len(calls) == t + 1 else None)
    rep = lockstep_model(mod, feeds[1], "fsim", "bad", make_b=make_bad)
    assert rep.diverged, rep.text()
    name, r = rep.steps[-1]
    assert name == steps[t].name and r.divergence.index == j, rep.text()
    assert f"first divergence in step '{steps[t].name}'" in rep.text()


def test_executor_failing_alone_is_named_at_its_instruction():
    """One executor faulting where the other runs is a divergence: the first prefix it fails names
    the instruction; both failing is an error naming both."""
    cfg = PRESETS["tiny"]
    prog, _ = random_program(cfg, 1)
    gemm = next(i for i, x in enumerate(prog.insns) if type(x).__name__ == "Gemm")

    def crash(idx, ins, sim, dram):
        if idx == gemm and type(ins).__name__ == "Gemm":
            raise ExecError(f"instruction {idx}: injected fault")
    r = lockstep(cfg, prog.insns, prog.dram_image(), prog.insn_addr, lambda: RecordingFsim(cfg),
                 lambda: _Whole(cfg, crash), ("fsim", "crashy"))
    assert r.diverged and r.divergence.index == gemm, r.text()
    assert "injected fault" in r.text()

    class Broken:
        def run(self, dram, a, n):
            raise ExecError("broken executor")
    with pytest.raises(LockstepError, match="neither executor"):
        lockstep(cfg, prog.insns, prog.dram_image(), prog.insn_addr, Broken, Broken, ("broken", "broken2"))


@pytest.mark.rtl
@pytest.mark.skipif(tools_available() is not None, reason=f"rtl driver: {tools_available()}")
def test_fsim_rtl_lockstep_tiny():
    """The RTL cannot be single-stepped: the whole run (and, on a difference, prefixes) compared."""
    cfg = PRESETS["tiny"]
    prog, _ = random_program(cfg, 2)
    r = lockstep(cfg, prog.insns, prog.dram_image(), prog.insn_addr, factory("fsim", cfg), factory("rtl", cfg),
                 ("fsim", "rtl"))
    assert r.mode == "prefix" and not r.diverged, r.text()
    # prefixes (with the buffer dumps) run on the RTL as on fsim
    dram = prog.dram_image()
    for k in (len(prog.insns) // 3, 2 * len(prog.insns) // 3, len(prog.insns) - 2):
        a, _ = _run_prefix(factory("fsim", cfg), cfg, prog.insns, k, dram, "fsim")
        b, _ = _run_prefix(factory("rtl", cfg), cfg, prog.insns, k, dram, "rtl")
        assert np.array_equal(a, b), k


def _bench():
    return load_bench("random_regression")


def test_random_regression_slice(tmp_path, faulty_driver):
    """bench/random_regression.py on a small slice: tsim, the plain ISA model and (where Verilator
    is installed) the RTL agree with fsim; a faulty executor is reported with seed, config and the
    first diverging instruction."""
    bench = _bench()
    executors = "tsim,ref" + (",rtl" if tools_available() is None else "")
    out = tmp_path / "rr.json"
    assert bench.main(["--seeds", "2", "--configs", "tiny", "--executors", executors, "-o", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["runs"] == 2 * len(executors.split(",")) and d["mismatches"] == [] and d["errors"] == []
    cfg = PRESETS["tiny"]
    prog, _ = random_program(cfg, 3)
    st, entry, writer = _stored_writer(cfg, prog)
    _FaultyDriver.at, _FaultyDriver.entry, _FaultyDriver.insn = writer, entry, prog.insns[writer]
    s = bench.regression(1, ["tiny"], ["faulty_lockstep_test"], first_seed=3)
    assert len(s["mismatches"]) == 1
    m = s["mismatches"][0]
    assert (m["config"], m["seed"], m["executor"], m["first_insn"]) == ("tiny", 3, "faulty_lockstep_test", writer)
    assert m["disasm"] == format_insn(prog.insns[writer])
    assert any(line.startswith(f"out[{entry}]:") for line in m["differences"])
