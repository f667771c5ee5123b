"""Targets as plug-ins (compiler.targets): the registry, the interface the partition and the
builder use, a toy target registered from this file that builds and runs a model, and the toy
target package of tests/fixtures/toy_target installed by its entry point, run in fresh processes."""
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from accel.cli import main as cli_main
from accel.isa import INSN_BYTES, assemble_text, decode_program
from compiler.emit import emit_sources
from compiler.frontend import from_onnx, zoo
from compiler.frontend.zoo import ModelBuilder
from compiler.graph.errors import GraphPassError
from compiler.graph.passes import infer_types, optimize
from compiler.graph.passes.partition import decide, explain_table
from compiler.graph_build import BuildError, build_model
from compiler.module import CompiledModule, ModuleFormatError
from compiler.targets import (
    Decline,
    PlacementContext,
    Target,
    get_target,
    register_target,
    target_names,
    unregister_target,
)
from compiler.targets.accel import program_bytes


class NumpyTarget(Target):
    """Runs relu and add steps by the graph IR's reference semantics (runtime step kind 'numpy')."""

    name = "numpy_toy"
    label = "numpy_toy"
    version = "0.1.0"
    title = "the NumPy toy"
    kinds = {"toy": "op the test's NumPy target runs"}
    OPS = ("relu", "add")

    def __init__(self):
        self.lowered: list[str] = []

    def supports(self, node, ctx):
        if node.op in self.OPS:
            return None
        return Decline(f"{node.origin or node.op} '{node.name}': numpy_toy runs only {', '.join(self.OPS)}",
                       "unsupported")

    def placement_kind(self, node, ctx):
        return "toy"

    def graph_options(self, request):
        return {**super().graph_options(request), "targets": (self.name, "cpu")}

    def lower_body(self, b, name, body, outer, out_tid):
        env = {id(p): o for p, o in zip(body.inputs, outer)}
        for op in body.ops:
            t = out_tid if op is body.outputs[0] else b.scratch(op.name, op.type)
            b.simple_step(op.name, op, [env[id(i)] for i in op.inputs], t, "numpy", "numpy_toy")
            self.lowered.append(op.name)
            env[id(op)] = t

    def emit(self, module, out_dir):
        p = out_dir / "numpy_toy.txt"
        p.write_text("\n".join(s.name for s in module.steps if s.note == "numpy_toy"))
        return [p]


@pytest.fixture
def toy():
    t = register_target(NumpyTarget())
    yield t
    unregister_target(t.name)


def _model():
    """dense -> relu -> add(relu, x@w2) -> sigmoid: relu and add for the toy, the rest on the CPU."""
    b = ModelBuilder("toy_net", seed=3)
    x = b.input("x", (2, 8))
    h = b.op("Relu", [b.op("MatMul", [x, b.weight((8, 16))], name="mm1")], name="act")
    y = b.op("Add", [h, b.op("MatMul", [x, b.weight((8, 16))], name="mm2")], name="sum")
    return b.build([b.op("Sigmoid", [y], name="out")])


def test_builtin_targets_are_registered_in_order():
    assert target_names()[:4] == ("accel", "cpu", "opencl", "cuda")
    assert all(get_target(n).name == n for n in target_names())
    with pytest.raises(BuildError, match="unknown target 'nope'; targets are accel, cpu, opencl, cuda"):
        get_target("nope")
    with pytest.raises(BuildError, match="registered already"):
        register_target(type(get_target("cpu"))())
    with pytest.raises(BuildError, match="not an identifier"):
        register_target(Target())


def test_unknown_build_target_names_the_registered_ones():
    with pytest.raises(BuildError, match="unknown target 'tpu'"):
        build_model(_model(), target="tpu")


def test_toy_target_builds_runs_and_is_explained(toy, tmp_path):
    m = _model()
    mod = build_model(m, target="numpy_toy")
    rows = {r["name"]: r for r in mod.meta["partition"]}
    assert rows["act"]["target"] == rows["sum"]["target"] == "numpy_toy" and rows["act"]["kind"] == "toy"
    assert rows["out"]["target"] == "cpu" and "numpy_toy runs only relu, add" in rows["out"]["reason"]
    assert sorted(toy.lowered) == ["act", "sum"]
    assert {s.name for s in mod.steps if s.note == "numpy_toy"} == {"act", "sum"}
    assert mod.count("llvm") >= 1    # the CPU target took the matmuls and the sigmoid
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    outs, _ = mod.run(feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(next(iter(outs.values())), want, rtol=1e-5, atol=1e-6)
    table = explain_table(mod.meta["partition"], mod.meta["folded"])
    assert "2 on numpy_toy" in table and "op the test's NumPy target runs" in table
    assert any(line.startswith("act") and "numpy_toy" in line for line in table.splitlines())
    files = emit_sources(mod, tmp_path / "src")
    assert (tmp_path / "src" / "numpy_toy.txt").read_text().split() == ["act", "sum"]
    assert any(f.suffix == ".ll" for f in files)


def test_partition_asks_the_targets_and_force_respects_hard_declines(toy):
    g = optimize(from_onnx(_model()), targets=("numpy_toy", "cpu"), fuse=False)
    assert {n.name: n.target for n in g.ops}["act"] == "numpy_toy"
    ds = {d.name: d for d in decide(g, None, force={"Relu": "cpu"}, targets=[toy, get_target("cpu")])}
    assert ds["act"].target == "cpu" and ds["act"].kind == "forced" and "forced to the CPU" in ds["act"].reason
    with pytest.raises(GraphPassError, match="cannot force Sigmoid 'out' onto the NumPy toy"):
        decide(g, None, force={"Sigmoid": "numpy_toy"}, targets=[toy, get_target("cpu")])


class _Cheap(Target):
    """Takes every op and says it is cheaper than the toy: the partition must pick it."""
    name = "cheap_toy"

    def estimate_cost(self, node, ctx):
        return 0.0


def test_partition_compares_cost_estimates_between_takers(toy):
    class Costly(NumpyTarget):
        def estimate_cost(self, node, ctx):
            return 1.0
    g = infer_types(from_onnx(_model()))
    ds = decide(g, None, targets=[Costly(), _Cheap(), get_target("cpu")])
    assert {d.target for d in ds} == {"cheap_toy"}
    act = next(d for d in ds if d.name == "act")   # the toy takes relu but loses on cost
    assert act.kind == "cost" and "by the cost estimate (0 s < 1 s)" in act.reason and not act.hard
    assert next(d for d in ds if d.name == "out").kind == "unsupported"   # the toy declined sigmoid first
    ctx = PlacementContext()
    assert NumpyTarget().supports(g.ops[0], ctx).kind == "unsupported"


def test_accel_emit_writes_each_program_as_assembly_that_reads_back(tmp_path):
    mod = build_model(zoo.mlp(), target="accel", config="tiny")
    acc = [s for s in mod.steps if s.kind == "accel"]
    assert acc
    files = emit_sources(mod, tmp_path)
    asm = sorted(f for f in files if f.suffix == ".asm")
    assert len(asm) == len(acc)
    for f, s in zip(sorted(asm, key=lambda p: int(p.name[5:].split("_")[0])), acc):
        code = program_bytes(mod.segments, s.insn_addr, s.insn_count * INSN_BYTES)
        assert assemble_text(f.read_text(), mod.config) == decode_program(code, mod.config)


def test_partition_without_a_fallback_names_the_node_no_target_takes(toy):
    g = infer_types(from_onnx(_model()))
    with pytest.raises(GraphPassError, match="no target takes MatMul 'mm1': MatMul 'mm1': numpy_toy runs only"):
        decide(g, None, targets=[toy])
    with pytest.raises(GraphPassError, match="force targets must be numpy_toy or cpu"):
        decide(g, None, force={"Relu": "accel"}, targets=[toy, get_target("cpu")])


def test_force_reaches_a_plug_in_targets_partition(toy):
    mod = build_model(_model(), target="numpy_toy", force_target={"Add": "cpu"})
    rows = {r["name"]: r for r in mod.meta["partition"]}
    assert rows["sum"]["target"] == "cpu" and rows["sum"]["kind"] == "forced"
    assert rows["act"]["target"] == "numpy_toy" and sorted(toy.lowered) == ["act"]


# ---- plug-in targets from their own package -------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
TOY_PACKAGE = ROOT / "tests" / "fixtures" / "toy_target"


def make_dist(site: Path, dist: str, version: str, entry_points: dict[str, str], files: dict | None = None) -> None:
    """What `pip install` leaves for importlib.metadata: a .dist-info folder with the entry points
    (group accel_kit.targets), plus the given module files."""
    d = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (d / "entry_points.txt").write_text("[accel_kit.targets]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items()))
    for name, text in (files or {}).items():
        (site / name).write_text(text)


def install_toy_package(site: Path) -> dict:
    """Install tests/fixtures/toy_target the way its pyproject.toml declares it (entry points
    included), without pip; returns the environment of a process that has it installed."""
    project = tomllib.loads((TOY_PACKAGE / "pyproject.toml").read_text())["project"]
    make_dist(site, project["name"], project["version"], project["entry-points"]["accel_kit.targets"])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(TOY_PACKAGE), str(ROOT)])
    return env


def _python(env, *args, cwd=None):
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


RUN_WITH_THE_RUNTIME_API = """
import json, sys
import numpy as np
from compiler.module import CompiledModule
mod = CompiledModule.load(sys.argv[1])
outs, profile = mod.run({"x": np.load(sys.argv[2])})
import kit_toy_target
print(json.dumps({"target": mod.target, "versions": mod.target_versions, "calls": kit_toy_target.CALLS,
                  "rows": [[r["name"], r["target"], r["impl"]] for r in profile],
                  "out": next(iter(outs.values())).tolist()}))
"""


def test_installed_plug_in_package_compiles_saves_and_runs_in_fresh_processes(tmp_path):
    """The toy target's own package, installed by entry point: `accel compile --target toy`, then
    `accel run` and the runtime API in fresh processes run its kernels; the module records toy
    1.2.0. Here, where it is not installed, the same file is refused naming the target."""
    env = install_toy_package(tmp_path / "site")
    m = _model()
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    out = _python(env, "-m", "accel.cli", "compile", "m.onnx", "--target", "toy", "-o", "m.accm", "--explain",
                  "--emit", "src", cwd=tmp_path)
    assert "target=toy" in out and "plug-in targets: toy 1.2.0" in out and "3 on toy" in out
    assert (tmp_path / "src" / "toy_steps.txt").read_text().split() == ["act", "toy:relu", "sum", "toy:add",
                                                                          "out", "toy:sigmoid"]
    out = _python(env, "-m", "accel.cli", "targets")
    assert "toy          1.2.0      accel_kit.targets entry point kit_toy_target:register" in out.splitlines()
    out = _python(env, "-m", "accel.cli", "run", "m.accm", "--input", "x.npy", "--output", "y.npy", "--profile",
                  cwd=tmp_path)
    assert "m.accm: toy_net (toy) on the CPU" in out
    assert [line.split()[2:4] for line in out.splitlines() if line.startswith(("act ", "sum ", "out "))] == \
        [["toy", "plugin"]] * 3
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-6)

    r = json.loads(_python(env, "-c", RUN_WITH_THE_RUNTIME_API, str(tmp_path / "m.accm"), str(tmp_path / "x.npy")))
    assert r["target"] == "toy" and r["versions"] == {"toy": "1.2.0"}
    assert r["calls"] == {"relu": 1, "add": 1, "sigmoid": 1}
    assert ["act", "toy", "plugin"] in r["rows"] and ["mm1", "cpu", "llvm"] in r["rows"]
    np.testing.assert_allclose(np.asarray(r["out"], np.float32), want, rtol=1e-5, atol=1e-6)

    assert "toy" not in target_names()
    with pytest.raises(ModuleFormatError, match=r"m\.accm: header field 'target' = 'toy': target 'toy' is not "
                                                r"registered or installed here; targets are accel, cpu, opencl, cuda"):
        CompiledModule.load(tmp_path / "m.accm")


def test_cli_names_an_unknown_target_and_the_installed_ones(tmp_path, capsys, monkeypatch):
    make_dist(tmp_path, "kit-other", "0.3", {"other_tgt": "other_tgt_mod:register"})
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "m.onnx").write_bytes(_model().SerializeToString())
    assert cli_main(["compile", str(tmp_path / "m.onnx"), "--target", "tpu", "-o", str(tmp_path / "m.accm")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: unknown target 'tpu'; targets are accel, cpu, opencl, cuda, other_tgt"


SELF_REGISTERING = """
from compiler.targets import Target, register_target

class SelfReg(Target):
    name = "selfreg"
    version = "3.1"

    def lower_body(self, b, name, body, outer, out_tid):
        b.fallback_body(name, body, outer, out_tid)

register_target(SelfReg())
"""


def test_installed_plug_in_forms_and_failures(tmp_path, monkeypatch, capsys):
    """An entry point may name a module that registers on import; one that fails to import or
    registers nothing is one BuildError naming the target and its entry point."""
    make_dist(tmp_path, "kit-forms", "1.0", {"selfreg": "selfreg_mod", "broken_tgt": "broken_mod",
                                              "silent_tgt": "silent_mod:setup"},
              {"selfreg_mod.py": SELF_REGISTERING, "broken_mod.py": "raise RuntimeError('no device here')\n",
               "silent_mod.py": "def setup():\n    pass\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert get_target("selfreg").version == "3.1"
        mod = build_model(_model(), target="selfreg")
        assert mod.target == "selfreg" and mod.target_versions == {"selfreg": "3.1"}
        with pytest.raises(BuildError, match=r"^installed target 'broken_tgt' \(accel_kit.targets entry point "
                                             r"broken_mod\) failed to load: RuntimeError: no device here$"):
            build_model(_model(), target="broken_tgt")
        with pytest.raises(BuildError, match="failed to load: RuntimeError: no device here"):
            get_target("broken_tgt")   # asked again: the same error, not "not installed"
        with pytest.raises(BuildError, match=r"^installed target 'silent_tgt' \(accel_kit.targets entry point "
                                             r"silent_mod:setup\) loaded but registered no target of that name$"):
            get_target("silent_tgt")
        assert cli_main(["targets", "--json"]) == 0
        rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
        assert rows["selfreg"]["version"] == "3.1" and rows["cpu"]["from"] == "built-in"
        assert rows["silent_tgt"]["error"].endswith("registered no target of that name")
    finally:
        unregister_target("selfreg")


def test_a_plug_in_declares_a_version_and_a_name_of_its_own(toy, tmp_path):
    class NoVersion(Target):
        name = "no_version"
    with pytest.raises(BuildError, match="register_target: target 'no_version' has version ''; a plug-in declares"):
        register_target(NoVersion())
    assert "no_version" not in target_names()
    for reserved in ("numpy", "plugin", "llvm"):
        t = NoVersion()
        t.name, t.version = reserved, "1.0"
        with pytest.raises(BuildError, match=f"'{reserved}' is a built-in target or step kind"):
            register_target(t)
    mod = build_model(_model(), target="numpy_toy")
    assert mod.target == "numpy_toy" and mod.target_versions == {"numpy_toy": "0.1.0"}
    mod.save(tmp_path / "m.accm")
    back = CompiledModule.load(tmp_path / "m.accm")
    assert back.target == "numpy_toy" and back.target_versions == {"numpy_toy": "0.1.0"}
    assert "plug-in targets: numpy_toy 0.1.0" in back.summary()


def test_kernel_step_names_a_kernel_the_target_has(toy):
    class Partial(NumpyTarget):
        name, version = "partial_toy", "1.0"
        runtime_kernels = {"relu": lambda attrs, x: np.maximum(x, 0)}

        def lower_body(self, b, name, body, outer, out_tid):
            self.kernel_step(b, body.ops[0], outer, out_tid)
    register_target(Partial())
    try:
        with pytest.raises(BuildError, match="target 'partial_toy' has no runtime kernel 'add' for add 'sum'; its "
                                             "kernels are relu"):
            build_model(_model(), target="partial_toy", fuse=False)
    finally:
        unregister_target("partial_toy")


def test_built_in_modules_still_record_their_own_target():
    assert build_model(_model(), target="cpu").target == "cpu"
    mod = build_model(zoo.mlp(), target="accel", config="tiny")
    assert mod.target == "accel" and mod.target_versions == {}
