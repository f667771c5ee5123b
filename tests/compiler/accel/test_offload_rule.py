"""The GEMM placement rule (compiler.accel.depthwise_cost.gemm_costs, used by the accel target's
supports): a conv/dense layer goes to the CPU only where the host runs it faster than the
planner's estimate of the accelerator, on every configuration; the zoo MLP offloads its Gemms
on configs other than the default, and its results still match the int8 reference."""
from dataclasses import replace

import numpy as np
import pytest

import compiler
from accel.isa import PRESETS, AccelConfig
from compiler.accel import depthwise_cost as dc
from compiler.errors import TargetError
from compiler.frontend import from_onnx, zoo
from compiler.graph import run as reference_run
from compiler.graph.ir import Node
from compiler.graph.passes import GraphOptions, optimize
from compiler.graph.passes.partition import ACCEL_RULES
from compiler.targets.accel import check_gemm_cost
from host_runtime.executor import Executor

CONFIGS = {
    "tiny": PRESETS["tiny"],
    "default": PRESETS["default"],
    "batch2": AccelConfig(batch=2),
    "block32": AccelConfig(block_in=32, block_out=32),
    "block8": AccelConfig(block_in=8, block_out=8, inp_buff_bytes=16384, wgt_buff_bytes=131072,
                          acc_buff_bytes=65536, out_buff_bytes=16384, uop_buff_bytes=16384),
    "bus128": AccelConfig(bus_width=128),
}


@pytest.fixture(autouse=True)
def _board_host(monkeypatch):
    """The rule's default host (DEFAULT_HOST), whatever the environment names."""
    monkeypatch.delenv(dc.HOST_ENV, raising=False)


def placed(model, cfg, rules=ACCEL_RULES):
    """The model through the graph passes up to the partition: (graph, decisions by node name)."""
    g = optimize(from_onnx(model), GraphOptions(quantize=True, calibration_samples=zoo.sample_inputs(model, 2, seed=1),
                                                accel=cfg, rules=rules,
                                                disabled=("pack_layout", "fuse_ops", "plan_memory")))
    return g, {d.name: d for d in g.meta["partition"]}


def dense_node(rows, k, m):
    x = Node.input("x", (rows, k), "int8")
    rng = np.random.default_rng(0)
    w = Node.const(rng.integers(-127, 128, (m, k), dtype=np.int8), name="w")
    return Node("qdense", [x, w, Node.const(np.zeros(m, np.int32), name="b")],
                {"in_shift": 7, "w_shift": 7, "out_shift": 7}, name="fc", origin="Gemm")


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_mlp_offloads_its_gemms_on_every_config(config):
    _, ds = placed(zoo.mlp(), CONFIGS[config])
    gemms = [d for d in ds.values() if d.op == "qdense"]
    assert len(gemms) == 3 and all(d.target == "accel" and d.kind == "offload" for d in gemms), \
        [(d.name, d.reason) for d in gemms]


def test_a_gemm_that_loses_by_the_model_stays_on_the_cpu_with_both_costs():
    """A batch-1 classifier (one MAC per weight byte) on the default core: the planner's cycles
    at 100 MHz are more than the board CPU's time for its MACs; the reason names both."""
    n = dense_node(1, 512, 1000)
    cfg = PRESETS["default"]
    c = dc.gemm_costs(n, cfg)
    assert c["memory_bound"] and c["host"].name == dc.DEFAULT_HOST
    assert c["cpu_s"] == pytest.approx(512 * 1000 / c["host"].gemm_macs_per_s)
    assert c["accel_s"] == pytest.approx(c["cycles"] / 100e6) and c["accel_s"] > c["cpu_s"]
    why = check_gemm_cost(n, cfg)
    assert why.kind == "cost" and not why.hard
    text = str(why)
    assert text.startswith("Gemm 'fc': memory-bound, ") and "faster on the CPU by the cost estimate" in text
    assert f"{c['cpu_s'] * 1e6:.3g} us on the pynq-z1 host at 1 GMAC/s" in text
    assert f"{c['accel_s'] * 1e6:.3g} us on the accelerator: {c['cycles']:.0f} cycles at 100 MHz" in text
    # the same layer on a core with four times the clock and twice the bus wins: the rule follows the config
    assert check_gemm_cost(n, AccelConfig(bus_width=128, clock_mhz=400.0)) is None


def test_the_partition_keeps_the_classifier_on_the_cpu_by_its_costs():
    _, ds = placed(zoo.conv_bn_relu_pool(), PRESETS["default"])
    assert ds["fc"].target == "cpu" and ds["fc"].kind == "cost"
    assert "us on the pynq-z1 host" in ds["fc"].reason and "cycles at 100 MHz" in ds["fc"].reason
    assert ds["conv2"].target == "accel"


def test_the_cpu_side_pays_the_boundary_beside_an_accelerator_layer():
    n = dense_node(4, 64, 16)
    host = dc.host_model("pynq-z1")
    alone, beside = dc.cpu_gemm_seconds(n, host), dc.cpu_gemm_seconds(n, host, beside_accel=True)
    assert alone == pytest.approx(4 * 64 * 16 / host.gemm_macs_per_s)
    assert beside == pytest.approx(alone + (4 * 64 + 4 * 16) / host.bytes_per_s + 2 * host.step_s)
    why = check_gemm_cost(dense_node(1, 512, 1000), PRESETS["default"], beside_accel=True)
    assert why is not None and "on the pynq-z1 host at 1 GMAC/s, with the layout boundary <" in str(why)


@pytest.mark.parametrize("net", ["conv_bn_relu_pool", "mlp", "residual_block", "transformer_encoder"])
@pytest.mark.parametrize("config", ["tiny", "default", "batch2", "block32"])
def test_nothing_offloaded_is_slower_by_the_model(net, config):
    """Every GEMM layer the partition puts on the accelerator by the rule costs no more there than
    on the host (the CPU paying the boundary where its producer is on the accelerator)."""
    cfg = CONFIGS[config]
    q, ds = placed(zoo.MODELS[net](), cfg)
    where = {k: d.target for k, d in ds.items()}
    checked = 0
    for n in q.ops:
        if n.op not in ("qconv2d", "qdense") or where[n.name] != "accel" or n.attrs.get("groups", 1) != 1:
            continue
        beside = any(where.get(i.name) == "accel" for i in n.inputs if not i.is_const)
        c = dc.gemm_costs(n, cfg, beside)
        assert c["accel_s"] <= c["cpu_s"], (n.name, c)
        checked += 1
    assert checked


def test_host_choice_and_switches(monkeypatch):
    n = dense_node(4, 64, 128)
    cfg = PRESETS["default"]
    assert check_gemm_cost(n, cfg) is None   # the board's CPU: the accelerator is faster
    monkeypatch.setenv(dc.HOST_ENV, "x86-dev")   # the development machine's kernels win a 4-row layer
    assert dc.host_model().name == "x86-dev" and "on the x86-dev host at 20 GMAC/s" in str(check_gemm_cost(n, cfg))
    _, ds = placed(zoo.mlp(), cfg)
    assert [d.target for d in ds.values() if d.op == "qdense"] == ["cpu"] * 3
    off = replace(ACCEL_RULES, gemm_by_cost=False)   # the switch: the accelerator takes them all
    _, ds = placed(zoo.mlp(), cfg, off)
    assert [d.target for d in ds.values() if d.op == "qdense"] == ["accel"] * 3
    monkeypatch.setenv(dc.HOST_ENV, "nope")
    with pytest.raises(TargetError, match=r"\$ACCEL_HOST_MODEL='nope': unknown host model; models are x86-dev"):
        dc.host_model()
    # a host without a GEMM figure is not weighed: the accelerator keeps the layer
    none = dc.HostModel("no-gemm", 1e15, 1e15, 1e15, 0.0)
    assert dc.cpu_gemm_seconds(n, none) == float("inf")


def test_grouped_and_unplannable_layers_still_get_an_estimate():
    x = Node.input("x", (1, 32, 8, 8), "int8")
    grouped = Node("qconv2d", [x, Node.const(np.ones((32, 8, 3, 3), np.int8)), Node.const(np.zeros(32, np.int32))],
                   {"groups": 4, "strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "in_shift": 7,
                    "w_shift": 7, "out_shift": 7}, name="g")
    cyc, _ = dc.accel_gemm_cycles(grouped, PRESETS["default"])
    assert cyc > 0
    # a dense layer too wide for the tiny core's buffers: the bound of its MACs and its DRAM traffic
    big = dense_node(1, 4096, 4096)
    cyc, bound = dc.accel_gemm_cycles(big, PRESETS["tiny"])
    assert cyc >= 4096 * 4096 / PRESETS["tiny"].bus_bytes and bound


@pytest.mark.parametrize("config", ["batch2", "block32"])
def test_mlp_offloaded_on_other_configs_matches_the_int8_reference(config):
    """Built and run on fsim: every Gemm is an accelerator step, the int8 tensors equal the
    graph interpreter's bit for bit and the output matches the reference."""
    m = zoo.mlp()
    feeds = zoo.sample_inputs(m, 4, seed=3)
    mod = compiler.build_model(m, target="accel", config=CONFIGS[config], calibration=feeds[:2])
    assert mod.meta["macs"] == {"accel": 4 * (64 * 128 + 128 * 64 + 64 * 16), "cpu": 0}
    assert not mod.meta["fallbacks"]
    for f in feeds[2:]:
        with Executor(mod, driver="fsim") as ex:
            outs = ex.run(f, keep=True)
        ref_out, env = reference_run(mod.graph, f, keep=True)
        ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
        checked = [k for k in ex.values if k in ints]
        assert len(checked) >= mod.count("accel") == 3
        for k in checked:
            np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=k)
        np.testing.assert_allclose(next(iter(outs.values())), ref_out[0], rtol=1e-5, atol=1e-6)
