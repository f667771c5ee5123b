"""The depthwise decision (compiler.accel.depthwise_cost): both targets' estimates, the partition
choosing by them, and a layer the estimate puts on the accelerator built and run bit-exact."""
from dataclasses import replace

import numpy as np
import pytest

import compiler
from accel.isa import PRESETS
from compiler.accel import depthwise_cost as dc
from compiler.errors import TargetError
from compiler.frontend import from_onnx, zoo
from compiler.graph import run as reference_run
from compiler.graph.ir import Node
from compiler.graph.passes import calibrate, optimize, quantize
from compiler.graph.passes.partition import ACCEL_RULES, decide
from host_runtime.executor import Executor


def dw_node(c=32, hw=14, stride=1, k=3, weights=None):
    x = Node.input("x", (1, c, hw, hw), "int8")
    w = weights if weights is not None else np.random.default_rng(0).integers(-127, 128, (c, 1, k, k), dtype=np.int8)
    return Node("qconv2d", [x, Node.const(w, name="w"), Node.const(np.zeros(c, np.int32), name="b")],
                {"groups": c, "strides": (stride, stride), "pads": (k // 2,) * 4, "in_shift": 7, "w_shift": 7,
                 "out_shift": 7}, name="dw")


def test_which_convs_are_depthwise():
    assert dc.is_depthwise(dw_node())
    uniform = np.full((32, 1, 3, 3), 5, np.int8)          # an average pool as a depthwise conv: an epilogue
    assert not dc.is_depthwise(dw_node(weights=uniform))
    x = Node.input("x", (1, 32, 8, 8), "int8")
    grouped = Node("qconv2d", [x, Node.const(np.ones((32, 8, 3, 3), np.int8)), Node.const(np.zeros(32, np.int32))],
                   {"groups": 4, "pads": (1, 1, 1, 1), "in_shift": 7, "w_shift": 7, "out_shift": 7})
    assert not dc.is_depthwise(grouped)


def test_cpu_estimate_terms():
    host = dc.HostModel("h", macs_per_s=1e9, strided_macs_per_s=0.5e9, bytes_per_s=1e9, step_s=1e-5)
    n = dw_node(32, 14, 1)
    macs = 32 * 14 * 14 * 9
    assert dc.cpu_depthwise_seconds(n, host, beside_accel=False) == pytest.approx(macs / 1e9)
    assert dc.cpu_depthwise_seconds(n, host) == pytest.approx(macs / 1e9 + 2 * 32 * 14 * 14 / 1e9 + 2e-5)
    s2 = dw_node(32, 14, 2)
    assert dc.cpu_depthwise_seconds(s2, host, beside_accel=False) == pytest.approx(32 * 7 * 7 * 9 / 0.5e9)
    # the accelerator side pays the same boundary when its producer runs on the CPU
    cfg = PRESETS["default"]
    assert dc.accel_depthwise_seconds(n, cfg, True, host) - dc.accel_depthwise_seconds(n, cfg, False, host) == \
        pytest.approx(dc.boundary_seconds(n, host)) == pytest.approx(2 * 32 * 14 * 14 / 1e9 + 2e-5)
    with pytest.raises(TargetError, match="host model 'vax': unknown host model; models are x86-dev"):
        dc.host_model("vax")


def test_host_model_from_the_environment(monkeypatch):
    monkeypatch.setenv(dc.HOST_ENV, "pynq-z1")
    assert dc.host_model() is dc.HOST_MODELS["pynq-z1"]
    assert dc.host_model("x86-dev").name == "x86-dev"
    monkeypatch.setenv(dc.HOST_ENV, "z80")
    with pytest.raises(TargetError, match=r"\$ACCEL_HOST_MODEL='z80': unknown host model"):
        dc.host_model()
    # a slower host moves more of MobileNet's depthwise layers onto the accelerator
    n = dw_node(144, 56, 1)
    monkeypatch.setenv(dc.HOST_ENV, "x86-dev")
    fast = dc.cpu_depthwise_seconds(n)
    monkeypatch.delenv(dc.HOST_ENV)   # the default: the board's CPU
    assert dc.host_model().name == dc.DEFAULT_HOST == "pynq-z1" and dc.cpu_depthwise_seconds(n) > fast


@pytest.mark.parametrize("cfg", ["default", "tiny"])
def test_accel_estimate_is_at_least_the_gemm_micro_ops(cfg):
    """A diagonal GEMM issues one micro-op per output pixel, tap and channel block: the planner's
    cycles are no fewer, and not far above on a layer that tiles well."""
    c = PRESETS[cfg]
    for n in (dw_node(64, 14, 1), dw_node(96, 28, 2)):
        oh, ow = n.shape[2:]
        uops = oh * ow * 9 * -(-n.shape[1] // c.block_out)
        cyc = dc.accel_depthwise_cycles(n, c)
        assert uops <= cyc < 3 * uops
        assert dc.accel_depthwise_seconds(n, c) == pytest.approx(cyc / (c.clock_mhz * 1e6))


def mobile_block(stride=2, c=32, hw=16, seed=0):
    """expand 1x1 - depthwise 3x3 - project 1x1, ReLU6 after the first two (MobileNetV2's block)."""
    b = zoo.ModelBuilder("mobile_block", seed)
    x = b.input("x", (1, 16, hw, hw))
    y = b.op("Relu", [b.conv(x, 16, c, k=1, name="expand")], name="r0")
    y = b.op("Relu", [b.conv(y, c, c, k=3, stride=stride, group=c, name="dw")], name="r1")
    return b.build([b.conv(y, c, 16, k=1, name="project")])


def quantized(model):
    g = optimize(from_onnx(model), fuse=False, disabled=("plan_memory",))
    return quantize(g, calibrate(g, zoo.sample_inputs(model, 2)))


@pytest.fixture
def host(monkeypatch):
    """Select a host model by name for the partition (the targets read the default)."""
    monkeypatch.delenv(dc.HOST_ENV, raising=False)

    def use(model: dc.HostModel):
        monkeypatch.setitem(dc.HOST_MODELS, model.name, model)
        monkeypatch.setattr(dc, "DEFAULT_HOST", model.name)
    return use


def test_partition_weighs_both_estimates(host):
    q = quantized(mobile_block())
    cfg = PRESETS["default"]
    host(dc.HostModel("slow", 1e7, 1e7, 1e8, 1e-4))
    d = {x.name: x for x in decide(q, cfg)}["dw"]
    assert d.target == "accel" and d.kind == "offload"
    host(dc.HostModel("fast", 1e12, 1e12, 1e12, 0.0))
    d = {x.name: x for x in decide(q, cfg)}["dw"]
    assert d.target == "cpu" and d.kind == "cost"
    assert d.reason.startswith("Conv 'dw': faster on the CPU than on the accelerator by the cost estimate")
    # the old rule: the diagonal GEMM's waste declines it whatever the estimates say
    d = {x.name: x for x in decide(q, cfg, rules=replace(ACCEL_RULES, depthwise_by_cost=False))}["dw"]
    assert d.target == "cpu" and d.kind == "depthwise"
    # forcing either way still works
    d = {x.name: x for x in decide(q, cfg, force={"Conv": "accel"})}["dw"]
    assert d.target == "accel"


def test_moved_layer_runs_bit_exact(host):
    """A depthwise conv the estimate gives the accelerator builds as a diagonal GEMM and computes
    the graph's int8 reference exactly."""
    host(dc.HostModel("slow", 1e7, 1e7, 1e8, 1e-4))
    m = mobile_block()
    feeds = zoo.sample_inputs(m, 3, seed=4)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:2])
    steps = {s.name: s for s in mod.steps}
    assert steps["dw"].kind == "accel" and not mod.meta["fallbacks"]
    with Executor(mod, driver="fsim") as ex:
        ex.run(feeds[2], keep=True)
    _, env = reference_run(mod.graph, feeds[2], keep=True)
    ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
    assert "dw" in ex.values or "r1" in ex.values
    for k in ex.values:
        if k in ints:
            np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=k)
