"""Targets as plug-ins (compiler.targets): the registry, the interface the partition and the
builder use, and a toy target registered from this file that builds and runs a model."""
import numpy as np
import onnxruntime as ort
import pytest

from accel.isa import INSN_BYTES, assemble_text, decode_program
from compiler.emit import emit_sources
from compiler.frontend import from_onnx, zoo
from compiler.frontend.zoo import ModelBuilder
from compiler.graph.errors import GraphPassError
from compiler.graph.passes import infer_types, optimize
from compiler.graph.passes.partition import decide, explain_table
from compiler.graph_build import BuildError, build_model
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
