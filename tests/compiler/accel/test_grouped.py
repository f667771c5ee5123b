"""Grouped and depthwise convolutions on the accelerator (compiler.accel.grouped) through the
functional simulator, bit-exact against the numpy reference; the merge rule and its waste; concats
of accelerator outputs by address planning (plan_memory)."""
import dataclasses

import numpy as np
import pytest
from conv_cases import ODD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compiler
from accel.isa import PRESETS
from compiler.accel import depthwise_cost
from compiler.accel.conv2d import Conv2dSpec, Requant, TilingError
from compiler.accel.grouped import (
    block_windows,
    expand_grouped_weight,
    group_blocks,
    grouped_layout,
    grouped_reference,
    grouped_waste,
    merge_factor,
    run_grouped_conv2d,
)
from compiler.frontend import zoo
from compiler.graph import run as reference_run
from compiler.graph.ops import conv2d_ref
from compiler.targets import accel as accel_target
from compiler.targets.accel import ACCEL_RULES
from host_runtime import Device
from host_runtime.executor import Executor


def _check(cfg, spec, groups, rq, seed=0, bias=True):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c // groups, spec.kh, spec.kw), dtype=np.int8)
    b = rng.integers(-20000, 20000, spec.o).astype(np.int32) if bias else None
    y, res, gp = run_grouped_conv2d(Device(cfg, dram_bytes=32 << 20), x, w, b, spec, groups, rq)
    ref = grouped_reference(x, w, b, spec, groups, rq)
    assert y.shape == ref.shape and np.array_equal(y, ref), f"{spec} groups={groups} merged to {gp}: mismatch"
    return res, gp


def test_reference_matches_graph_conv():
    rng = np.random.default_rng(1)
    spec = Conv2dSpec(1, 12, 5, 5, 6, 3, 3, (1, 1, 1, 1), (2, 2))
    x = rng.integers(-128, 128, (1, 12, 5, 5)).astype(np.int8)
    w = rng.integers(-128, 128, (6, 4, 3, 3)).astype(np.int8)
    acc = conv2d_ref(x, w, (2, 2), (1, 1, 1, 1), (1, 1), 3, np.int64)
    assert np.array_equal(grouped_reference(x, w, None, spec, 3, Requant(0, -127, 127)), np.clip(acc, -127, 127))


def test_merge_factor_and_waste():
    assert merge_factor(3, 240, 240, 16, 16) == 1            # ShuffleNet: 80 channels a group, whole blocks
    assert merge_factor(32, 32, 32, 16, 16) == 16            # depthwise: 16 channels a diagonal GEMM
    assert grouped_waste(32, 32, 32, 16, 16) == pytest.approx(15 / 16)
    assert merge_factor(3, 24, 24, 16, 16) == 2              # two slices, the second half padding
    assert grouped_waste(3, 24, 24, 16, 16) == pytest.approx(1 - 24 * 8 / (2 * 16 * 16))
    assert merge_factor(136, 136, 136, 16, 16) == 16         # 9 diagonal slices, the last one half padding
    assert merge_factor(3, 24, 36, 16, 16) == 3              # nothing aligns: one conv, block-diagonal
    assert grouped_waste(3, 240, 240, 16, 16) == 0.0
    with pytest.raises(TilingError, match="groups=5"):
        merge_factor(5, 12, 10, 16, 16)


def test_expand_weight_is_the_same_conv():
    rng = np.random.default_rng(2)
    x = rng.integers(-9, 9, (1, 8, 4, 4)).astype(np.int64)
    w = rng.integers(-9, 9, (8, 2, 3, 3)).astype(np.int64)
    wm = expand_grouped_weight(w, 4, 2)
    assert wm.shape == (8, 4, 3, 3)
    a = conv2d_ref(x, w, (1, 1), (0, 0, 0, 0), (1, 1), 4, np.int64)
    b = conv2d_ref(x, wm, (1, 1), (0, 0, 0, 0), (1, 1), 2, np.int64)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("c,o,groups,k", [(48, 48, 3, 3), (32, 32, 32, 3), (64, 128, 64, 3), (240, 240, 3, 1),
                                          (24, 24, 3, 1), (32, 64, 2, 1), (40, 40, 40, 3), (24, 36, 3, 1),
                                          (80, 80, 4, 1), (136, 136, 4, 3)])
def test_grouped_default_config_bit_exact(c, o, groups, k):
    spec = Conv2dSpec(1, c, 7, 6, o, k, k, (k // 2,) * 4, (1, 1), "g")
    res, _ = _check(PRESETS["default"], spec, groups, Requant(shift=9, lo=0, hi=127))
    assert res.stats["macs"] >= spec.macs // groups


def test_groups_off_the_blocks_run_in_input_windows():
    """ShuffleNet's 4 groups of 68 channels: no merge aligns; as one dense conv each run of output
    blocks reads only the input blocks its groups cover (a quarter of the MACs wasted, not 3/4)."""
    k, waste = grouped_layout(4, 272, 272, 16, 16)
    assert k == 4 and waste < 0.3
    nz = group_blocks(4, 272, 272, 16, 16)
    chunks = block_windows(nz)
    assert all(nz[o0:o1, :i0].sum() == 0 and nz[o0:o1, i1:].sum() == 0 for o0, o1, i0, i1 in chunks)
    assert [c[:2] for c in chunks] == [(c[0], c[1]) for c in chunks] and chunks[-1][1] == 17
    spec = Conv2dSpec(1, 80, 5, 5, 80, 1, 1, name="g4")
    res, slices = _check(PRESETS["default"], spec, 4, Requant(shift=8, lo=-127, hi=127))
    assert slices < 0 and res.stats["macs"] < 80 * 80 * 25 * 0.8


def test_depthwise_strided_merges_to_block_slices():
    spec = Conv2dSpec(1, 64, 9, 9, 64, 3, 3, (1, 1, 1, 1), (2, 2), "dw")
    _, gp = _check(PRESETS["default"], spec, 64, Requant(shift=7, lo=-127, hi=127))
    assert gp == 4


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.sampled_from([PRESETS["tiny"], ODD, PRESETS["default"]]), n=st.integers(1, 3),
       cpg=st.sampled_from([1, 2, 3, 4, 8, 16]), opg=st.sampled_from([1, 2, 3, 4, 8, 16]), groups=st.integers(1, 12),
       h=st.integers(1, 8), w=st.integers(1, 8), k=st.sampled_from([1, 3]), pad=st.integers(0, 1),
       stride=st.integers(1, 2), shift=st.integers(0, 12), seed=st.integers(0, 9))
def test_grouped_random_shapes_and_configs(cfg, n, cpg, opg, groups, h, w, k, pad, stride, shift, seed):
    if h + 2 * pad < k or w + 2 * pad < k or cpg * opg * groups > 256:
        return
    spec = Conv2dSpec(n, cpg * groups, h, w, opg * groups, k, k, (pad,) * 4, (stride, stride), "g")
    _check(cfg, spec, groups, Requant(shift, -127, 127), seed, bias=seed % 2 == 0)


def _grouped_model(seed=0):
    """ShuffleNet-like: grouped 1x1 (3 groups of 16), a depthwise 3x3, a grouped 3x3
    whose groups (3 of 8 channels) merge into one block-diagonal conv."""
    b = zoo.ModelBuilder("grouped", seed)
    x = b.input("x", (1, 48, 10, 10))
    y = b.op("Relu", [b.conv(x, 48, 48, k=1, group=3, name="gconv")], name="r0")
    y = b.conv(y, 48, 48, k=3, group=48, name="dw")
    y = b.op("Relu", [b.conv(y, 48, 24, k=1, name="pw")], name="r1")
    y = b.conv(y, 24, 24, k=3, group=3, name="g8")
    return b.build([y])


def _shuffle_model(seed=0):
    """ShuffleNet v1's grouped convs off the blocks: 4 groups of 20 channels, 1x1 then 3x3, the
    unit's residual add and ReLU after the second."""
    b = zoo.ModelBuilder("shuffle", seed)
    x = b.input("x", (1, 80, 6, 6))
    y = b.op("Relu", [b.conv(x, 80, 80, k=1, group=4, name="g4a")], name="r0")
    y = b.op("Add", [b.conv(y, 80, 80, k=3, group=4, name="g4b"), x], name="res")
    return b.build([b.op("Relu", [y], name="r1")])


def _grouped_residual_model(seed=0):
    """Groups on whole blocks (3 of 16 channels), the second conv's output added to the input."""
    b = zoo.ModelBuilder("grouped_res", seed)
    x = b.input("x", (1, 48, 6, 6))
    y = b.op("Relu", [b.conv(x, 48, 48, k=1, group=3, name="g3a")], name="r0")
    y = b.op("Add", [b.conv(y, 48, 48, k=3, group=3, name="g3b"), x], name="res")
    return b.build([b.op("Relu", [y], name="r1")])


@pytest.mark.parametrize("model,cfg,force", [("grouped", "default", True), ("grouped", "tiny", False),
                                             ("depthwise_separable", "tiny", False), ("shuffle", "default", False),
                                             ("grouped_res", "default", False)])
def test_built_model_runs_grouped_convs_on_the_accelerator_bit_exact(model, cfg, force, monkeypatch):
    """Grouped and depthwise convs are placed on the accelerator (a depthwise one at block 16 only
    when forced: a diagonal GEMM wastes 15/16 of the core) and every int8 tensor the module
    computes on fsim equals the graph's int8 reference; tsim runs the same module."""
    m = {"grouped": _grouped_model, "shuffle": _shuffle_model, "grouped_res": _grouped_residual_model}.get(
        model, zoo.depthwise_separable)()
    feeds = zoo.sample_inputs(m, 5, seed=3)
    # a host far slower than the core: the depthwise cost estimate places depthwise convs on the accelerator
    slow = depthwise_cost.HostModel("slow", 1e7, 1e7, 1e8, 1e-4)
    monkeypatch.setitem(depthwise_cost.HOST_MODELS, "slow", slow)
    monkeypatch.setattr(depthwise_cost, "DEFAULT_HOST", "slow")
    used = {"sliced": 0, "windowed": 0}

    def counting(key, fn):
        def wrapped(*a, **k):
            used[key] += 1
            return fn(*a, **k)
        return wrapped
    monkeypatch.setattr(accel_target, "emit_grouped_conv2d", counting("sliced", accel_target.emit_grouped_conv2d))
    monkeypatch.setattr(accel_target, "emit_windowed_conv2d", counting("windowed", accel_target.emit_windowed_conv2d))
    mod = compiler.build_model(m, target="accel", config=cfg, calibration=feeds[:4],
                               force_target={"Conv": "accel"} if force else None)
    assert used["windowed" if model == "shuffle" else "sliced"], used
    if model in ("shuffle", "grouped_res"):   # the residual add rides in the sliced or windowed conv's epilogue
        last = "g4b" if model == "shuffle" else "g3b"
        assert any(s.kind == "accel" and "qadd" in s.op for s in mod.steps if s.name == last), mod.steps
    convs = [s for s in mod.steps if s.op.startswith("qconv2d")]
    assert convs and all(s.kind == "accel" for s in convs), [(s.name, s.kind) for s in convs]
    assert not mod.meta["fallbacks"]
    with Executor(mod, driver="fsim") as ex:
        out = ex.run(feeds[4], keep=True)
    _, env = reference_run(mod.graph, feeds[4], keep=True)
    ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
    checked = 0
    for k in ex.values:
        if k in ints:
            np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=k)
            checked += 1
    assert checked
    with Executor(mod, driver="tsim") as ex:
        out2 = ex.run(feeds[4])
    assert out.keys() == out2.keys()
    for k in out:
        np.testing.assert_array_equal(out[k], out2[k], err_msg=k)


def test_placement_declines_grouped_waste_beyond_the_rule():
    """Depthwise at block 16 wastes 15/16 of the core: placed by the cost estimate against the CPU
    (compiler.accel.depthwise_cost; with depthwise_by_cost=False the waste rule declines it, kind
    depthwise: tests/compiler/accel/test_depthwise_cost.py); the grouped 1x1 (3 groups of 16) and
    the grouped 3x3 of 3 groups of 8 channels (two 16-channel slices, the second half padding) go
    to the accelerator."""
    assert grouped_waste(64, 64, 64, 16, 16) > ACCEL_RULES.max_grouped_waste
    assert grouped_waste(64, 64, 64, 4, 4) <= ACCEL_RULES.max_grouped_waste
    m = _grouped_model()
    mod = compiler.build_model(m, target="accel", config="default", calibration=zoo.sample_inputs(m, 2, seed=3))
    part = {d["name"]: d for d in mod.meta["partition"]}
    assert part["dw"]["kind"] == ("offload" if part["dw"]["target"] == "accel" else "cost"), part["dw"]
    assert part["gconv"]["target"] == "accel" and part["g8"]["target"] == "accel"


def _fire_model(seed=0):
    """SqueezeNet's fire module twice: the second concat's input is the first's consumer's output."""
    b = zoo.ModelBuilder("fire", seed)
    y = b.input("x", (1, 16, 8, 8))
    for k in range(2):
        s = b.op("Relu", [b.conv(y, 16, 16, k=1, name=f"squeeze{k}")])
        e1 = b.op("Relu", [b.conv(s, 16, 16, k=1, name=f"e1_{k}")])
        e3 = b.op("Relu", [b.conv(s, 16, 32, k=3, name=f"e3_{k}")])
        y = b.op("Concat", [e1, e3], name=f"cat{k}", axis=1)
        y = b.conv(y, 48, 16, k=1, name=f"mix{k}")
    return b.build([y])


def test_concat_by_address_planning_writes_in_place_bit_exact():
    """Both concats of accelerator outputs are elided: their producers store into their channel
    slices of one buffer, no step copies; every int8 tensor equals the graph reference (fsim), and
    tsim runs the module."""
    m = _fire_model()
    feeds = zoo.sample_inputs(m, 5, seed=4)
    mod = compiler.build_model(m, target="accel", config="default", calibration=feeds[:4])
    plan = mod.graph.meta["memory_plan"]
    assert {"cat0", "cat1"} <= plan.elided, plan.elided
    assert not [s for s in mod.steps if s.name in ("cat0", "cat1") or s.op.startswith("concat")]
    t = {x.name: x for x in mod.tensors}
    for name in ("cat0", "cat1"):
        node = next(n for n in mod.graph.nodes if n.name == name)
        a, b = (t[i.name] for i in node.inputs)
        assert a.addr == t[name].addr and b.addr == t[name].addr + a.nbytes, name
    _, env = reference_run(mod.graph, feeds[4], keep=True)
    ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
    with Executor(mod, driver="fsim") as ex:
        out = ex.run(feeds[4], keep=True)
    # no step computes the concats: the convs that read them (mix0, mix1) see what their producers wrote
    assert {"mix0", "mix1"} <= set(ex.values) & set(ints)
    for k in ex.values:
        if k in ints:
            np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=k)
    with Executor(mod, driver="tsim") as ex:
        out2 = ex.run(feeds[4])
    for k in out:
        np.testing.assert_array_equal(out[k], out2[k], err_msg=k)


def _dense_model():
    b = zoo.ModelBuilder("dense", 1)
    x = b.input("x", (1, 16, 6, 6))
    a = b.op("Relu", [b.conv(x, 16, 16, k=1, name="a")])
    bb = b.op("Relu", [b.conv(x, 16, 16, k=3, name="b")])
    cat0 = b.op("Concat", [a, bb], name="cat0", axis=1)
    c = b.op("Relu", [b.conv(cat0, 32, 16, k=3, name="c")])
    cat1 = b.op("Concat", [cat0, c], name="cat1", axis=1)
    return b.build([b.conv(cat1, 48, 16, k=1, name="out")])


def test_nested_concats_share_one_buffer_bit_exact():
    """DenseNet's growth: cat1 = concat(cat0, c) where c is computed from cat0; cat0's slices and c
    all live in cat1's buffer, both concats elided, every step bit-exact on fsim."""
    m = _dense_model()
    feeds = zoo.sample_inputs(m, 5, seed=2)
    mod = compiler.build_model(m, target="accel", config="default", calibration=feeds[:4])
    assert {"cat0", "cat1"} <= mod.graph.meta["memory_plan"].elided
    t = {x.name: x for x in mod.tensors}
    assert t["cat0"].addr == t["cat1"].addr
    _, env = reference_run(mod.graph, feeds[4], keep=True)
    ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
    with Executor(mod, driver="fsim") as ex:
        ex.run(feeds[4], keep=True)
    assert "out" in ex.values and "out" in ints
    for k in ex.values:
        if k in ints:
            np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=k)


def _assert_no_live_overlap(mod):
    """No two activations live at once share bytes, except a concat and the slices inside it."""
    g = mod.graph
    t = {}
    for x in mod.tensors:
        t.setdefault(x.name, x)
    index = {id(n): k for k, n in enumerate(g.nodes)}
    last = {}
    for k, n in enumerate(g.nodes):
        for i in n.inputs:
            last[id(i)] = k
    for o in g.outputs:
        last[id(o)] = len(g.nodes)
    inside: dict[int, set] = {}   # id(node) -> ids of the concats whose buffer holds it
    for n in g.nodes:
        if n.name in g.meta["memory_plan"].elided:
            for i in n.inputs:
                inside.setdefault(id(i), set()).add(id(n))
    for _ in range(len(g.nodes)):   # transitive
        for k in list(inside):
            inside[k] |= set().union(*(inside.get(c, set()) for c in inside[k]))
    acts = [n for n in g.nodes if n.op not in ("const", "input") and n.name in t]
    for a in acts:
        for b in acts:
            if a is b or id(b) in inside.get(id(a), ()) or id(a) in inside.get(id(b), ()):
                continue
            live = index[id(a)] <= last.get(id(b), index[id(b)]) and index[id(b)] <= last.get(id(a), index[id(a)])
            ta, tb = t[a.name], t[b.name]
            if live and ta.addr < tb.addr + tb.nbytes and tb.addr < ta.addr + ta.nbytes:
                raise AssertionError(f"{a.name} and {b.name} are live together and share bytes")


def test_planned_concat_buffers_do_not_overlap_live_tensors():
    for m in (_fire_model(), _dense_model()):
        feeds = zoo.sample_inputs(m, 2, seed=4)
        mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds)
        assert mod.graph.meta["memory_plan"].elided
        _assert_no_live_overlap(mod)
    # the check itself: a slice moved onto its sibling is caught
    cat = next(n for n in mod.graph.nodes if n.name == "cat1")
    a, b = (next(k for k, x in enumerate(mod.tensors) if x.name == i.name) for i in cat.inputs)
    mod.tensors[b] = dataclasses.replace(mod.tensors[b], addr=mod.tensors[a].addr)
    with pytest.raises(AssertionError, match="share bytes"):
        _assert_no_live_overlap(mod)


@pytest.mark.parametrize("make", [_shuffle_model, _grouped_model])
def test_per_channel_qdq_grouped_convs_bit_exact(make):
    """A QDQ model with per-channel weight scales: the SCALE operands are sliced with the output
    blocks of each slice or window (depthwise forced at block 16); every int8 step is bit-exact."""
    m = make()
    feeds = zoo.sample_inputs(m, 5, seed=3)
    q = zoo.ort_quantize(m, feeds[:4], per_channel=True)
    mod = compiler.build_model(q, target="accel", config="default", force_target={"Conv": "accel"})
    heads = [o for n in mod.graph.nodes for o in (n.attrs["body"].ops if n.op == "fused" else [n])
             if o.op == "qconv2d"]
    assert heads and all(len(o.inputs) == 4 for o in heads)   # per-channel multipliers
    assert all(s.kind == "accel" for s in mod.steps if "conv" in s.op) and not mod.meta["fallbacks"]
    _, env = reference_run(mod.graph, feeds[4], keep=True)
    ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
    with Executor(mod, driver="fsim") as ex:
        ex.run(feeds[4], keep=True)
    assert any(k in ints for k in ex.values)
    for k in ex.values:
        if k in ints:
            np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=k)
