"""Accelerator weights resident across inferences: the dense emitter's two programs (the first run's
loads the weights into a fixed place of the weight buffer, later runs' skip them), the plan that
places them, and whole modules run several times in a row on fsim (race checks on), tsim and the
RTL: every run bit-exact with the same module built without residency."""
import json

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compiler.targets.accel as accel_target
from accel.cli import main
from accel.isa import INSN_BYTES, PRESETS, AccelConfig, MemType, decode_program, encode_program
from accel.isa.isa import Load
from compiler import build_model
from compiler.accel.conv2d import (
    Conv2dSpec,
    Requant,
    TilingError,
    conv2d_candidates,
    conv2d_reference,
    dense_reference,
    emit_conv2d,
)
from compiler.accel.dense import resident_dense_tiling
from compiler.accel.layout import pack_activation, pack_bias, pack_weight, unpack_activation
from compiler.accel.plan import plan_conv2d, plan_resident_weights
from compiler.accel.spec import WeightRegion, dense_view, weight_region_entries
from compiler.errors import TargetError
from compiler.frontend import zoo
from compiler.frontend.zoo import ModelBuilder, mlp, sample_inputs, transformer_encoder
from compiler.targets.accel import program_bytes
from host_runtime import Device
from host_runtime.executor import Executor, ModuleFormatError, ModuleImage, warm_program
from sim.tsim import Tsim
from sim.verilator.build import tools_available

SQUARE_ODD = AccelConfig(batch=2, block_in=8, block_out=8, acc_buff_bytes=16 * 1024, out_buff_bytes=4 * 1024,
                         inp_buff_bytes=2 * 1024, wgt_buff_bytes=4 * 1024)
BATCH2 = AccelConfig(batch=2)
BLOCK8 = AccelConfig(block_in=8, block_out=8, uop_buff_bytes=8192, inp_buff_bytes=16384, wgt_buff_bytes=32768,
                     acc_buff_bytes=65536, out_buff_bytes=16384)


# ---- the plan ------------------------------------------------------------------------------------
def test_plan_packs_largest_first_below_the_identity_entry():
    plan = plan_resident_weights({"a": (10, 4), "b": (30, 8), "c": (5, 2)}, 64, others_need=6)
    assert plan == {"b": 33, "a": 23, "c": 18}   # from entry 62 down; 63 is the residual identity's
    assert min(plan.values()) >= 6


def test_plan_keeps_room_for_what_stays_non_resident():
    # b (40) and a (20) cannot both stay: 63 - 60 < the 8 entries c's tiling needs; c fits with b
    plan = plan_resident_weights({"a": (20, 4), "b": (40, 8), "c": (30, 8)}, 64, others_need=2)
    assert set(plan) == {"b"} or sum(plan.values()) >= 0
    ends = sorted((base, base + {"a": 20, "b": 40, "c": 30}[k]) for k, base in plan.items())
    assert all(z <= a2 for (_, z), (a2, _) in zip(ends, ends[1:])) and ends[-1][1] <= 63
    need_left = max([2] + [{"a": 4, "b": 8, "c": 8}[k] for k in "abc" if k not in plan])
    assert ends[0][0] >= need_left


def test_plan_none_fit():
    assert plan_resident_weights({"a": (200, 4)}, 128, 2) == {}
    assert plan_resident_weights({}, 128, 2) == {}


# ---- the dense emitter's two programs ----------------------------------------------------------
def _program(device, emit):
    s = device.stream()
    s.emit_preloaded(emit)
    insns = s.finish()
    code = encode_program(insns, device.cfg)
    buf = device.memory.alloc(code.nbytes, align=64, name="insns")
    buf.write(code)
    return buf.addr, len(insns), insns


def _wgt_loads(insns):
    return [i for i in insns if isinstance(i, Load) and i.mem_type == MemType.WGT]


def run_resident_dense(cfg, rows, k, m, tiling, base, runs, seed, rq=Requant(8, -127, 127), driver="fsim"):
    """A dense layer's cold program once, then its warm one, each on new rows: outputs and references."""
    dev = Device(cfg, driver, check_races=True) if driver == "fsim" else Device(cfg, driver)
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (m, k, 1, 1), dtype=np.int8)
    b = rng.integers(-3000, 3000, m).astype(np.int32)
    spec = Conv2dSpec(rows, k, 1, 1, m, 1, 1, name="fc")
    mem = dev.memory
    xs = [rng.integers(-128, 128, (rows, k, 1, 1), dtype=np.int8) for _ in range(runs)]
    inp = mem.alloc_array(pack_activation(xs[0], cfg.batch, cfg.block_in), align=cfg.inp_elem_bytes)
    wb = mem.alloc_array(pack_weight(w, cfg.block_out, cfg.block_in), align=cfg.wgt_elem_bytes)
    bb = mem.alloc_array(pack_bias(b, cfg), align=cfg.acc_elem_bytes)
    nb, ob = -(-rows // cfg.batch), -(-m // cfg.block_out)
    oshape = (nb, ob, 1, 1, cfg.batch, cfg.block_out)
    out = mem.alloc(int(np.prod(oshape)), align=cfg.out_elem_bytes)
    progs = [_program(dev, lambda s, load=load: emit_conv2d(s, spec, tiling, inp, wb, out, bb, rq,
                                                            region=WeightRegion(base, load)))
             for load in (True, False)]
    got, want = [], []
    for r, x in enumerate(xs):
        inp.write(pack_activation(x, cfg.batch, cfg.block_in))
        addr, count, _ = progs[min(r, 1)]
        dev.run(addr, count)
        got.append(unpack_activation(out.read(np.int8, oshape), rows, m)[:, :, 0, 0])
        want.append(dense_reference(x[:, :, 0, 0], w[:, :, 0, 0], b, rq))
    return got, want, progs, spec


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.sampled_from([PRESETS["tiny"], SQUARE_ODD, BLOCK8, BATCH2, PRESETS["default"]]), rows=st.integers(1, 24),
       k=st.integers(1, 48), m=st.integers(1, 40), pick=st.integers(0, 9), at_top=st.booleans(),
       seed=st.integers(0, 99))
def test_resident_dense_bit_exact_over_runs_and_tilings(cfg, rows, k, m, pick, at_top, seed):
    """Any of the 10 best tilings (input chunks, channel groups, row tiles), the region low or right
    below the identity entry: the first run loads the weights, the next two load none and still
    match the reference on new rows (fsim with its race check)."""
    spec = Conv2dSpec(rows, k, 1, 1, m, 1, 1, name="fc")
    cands = conv2d_candidates(dense_view(spec, cfg), cfg, 2)
    t = cands[pick % len(cands)][1]
    size = weight_region_entries(spec, cfg)
    base = cfg.wgt_depth - 1 - size if at_top else 0
    if size > cfg.wgt_depth - 1:   # entry wgt_depth - 1 is the residual identity's
        with pytest.raises(TilingError, match="leave the weight buffer"):
            run_resident_conv(cfg, spec, t, base, 1, seed)
        return
    got, want, progs, _ = run_resident_dense(cfg, rows, k, m, t, base, 3, seed)
    for r, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(a, b, err_msg=f"run {r}")
    cold, warm = _wgt_loads(progs[0][2]), _wgt_loads(progs[1][2])
    assert not warm
    assert all(base <= i.sram_base and i.sram_base + i.y_size * i.x_size <= base + size for i in cold)
    assert sum(i.y_size * i.x_size for i in cold) == size


def test_resident_region_past_the_buffer_is_refused():
    cfg = PRESETS["tiny"]
    spec = Conv2dSpec(4, 16, 1, 1, 16, 1, 1, name="fc")
    t = conv2d_candidates(dense_view(spec, cfg), cfg, 2)[0][1]
    dev = Device(cfg, None)
    with pytest.raises(TilingError, match="fc: resident weights at entries"):
        s = dev.stream()
        emit_conv2d(s, spec, t, None, None, None, region=WeightRegion(cfg.wgt_depth - 4))
    conv = Conv2dSpec(1, 16, 4, 4, 16, 3, 3, name="conv")
    chunked = next(t for _, t in conv2d_candidates(conv, cfg, 2) if t.ic_t < 4)
    with pytest.raises(TilingError, match="conv: a conv keeps its weights across inferences with one input-channel"):
        emit_conv2d(dev.stream(), conv, chunked, None, None, None, region=WeightRegion(0))


def test_resident_tiling_no_slower_warm_than_the_cold_pick():
    """resident_dense_tiling measures the best few tilings without weight loads: its pick's later
    runs are never slower than the cold estimate's pick (and faster on the encoder's qkv shape)."""
    cfg = PRESETS["default"]
    for rows, k, m in ((8, 32, 96), (4, 64, 128), (4, 64, 16)):
        spec = Conv2dSpec(rows, k, 1, 1, m, 1, 1, name="fc")
        warm = []
        for t in (resident_dense_tiling(spec, cfg), plan_conv2d(spec, cfg, 2)):
            got, want, progs, _ = run_resident_dense(cfg, rows, k, m, t, 0, 2, 0, driver="tsim")
            np.testing.assert_array_equal(got[1], want[1])
            warm.append(Tsim(cfg).run_insns(progs[1][2]).cycles)
        assert warm[0] <= warm[1]
        if (rows, k, m) == (8, 32, 96):
            assert warm[0] < warm[1]


def test_resident_dense_on_tsim_cheaper_when_warm():
    cfg = PRESETS["default"]
    spec = Conv2dSpec(8, 64, 1, 1, 96, 1, 1, name="fc")
    t = conv2d_candidates(dense_view(spec, cfg), cfg, 2)[0][1]
    got, want, _, _ = run_resident_dense(cfg, 8, 64, 96, t, 100, 3, 1, driver="tsim")
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


# ---- whole modules -----------------------------------------------------------------------------
def _runs(mod, feeds, driver="fsim", **kw):
    outs, warm, cycles = [], [], []
    opts = {"check_races": True} if driver == "fsim" else {}
    with Executor(mod, driver=driver, **opts, **kw) as ex:
        for f in feeds:
            outs.append(next(iter(ex.run(f).values())))
            warm.append(ex.warm)
            cycles.append(sum(r.get("cycles") or 0 for r in ex.profile if r["target"] == "accel"))
    return outs, warm, cycles


#: every dense layer on the accelerator, whatever the placement rule's cost estimate says
DENSE_ON_ACCEL = {"qdense": "accel"}


def _both(model, cfg, feeds):
    on = build_model(model, target="accel", config=cfg, calibration=feeds[:2], force_target=DENSE_ON_ACCEL)
    off = build_model(model, target="accel", config=cfg, calibration=feeds[:2], target_options={"resident_weights": False},
                      force_target=DENSE_ON_ACCEL)
    return on, off


@pytest.mark.parametrize("net", ["mlp", "transformer_encoder"])
def test_module_resident_bit_exact_over_runs_fsim(net):
    model = {"mlp": mlp, "transformer_encoder": transformer_encoder}[net]()
    feeds = sample_inputs(model, 4, seed=3)
    on, off = _both(model, "default", feeds)
    dense = [s.name for s in on.steps if s.kind == "accel" and s.op.startswith("qdense")]
    assert dense and set(on.meta["resident_weights"]["layers"]) == set(dense)
    biases = on.meta["resident_weights"]["biases"]   # every layer here has a bias and no channel scales
    assert set(biases) == set(dense)
    assert all(v["base"] + v["entries"] <= on.config.acc_depth for v in biases.values())
    assert not [s for s in off.steps if warm_program(s)] and "resident_weights" not in off.meta
    for s in on.steps:
        if warm_program(s):
            addr, count = warm_program(s)
            insns = decode_program(program_bytes(on.segments, addr, count * INSN_BYTES), on.config)
            assert not _wgt_loads(insns), s.name
            assert not [i for i in insns if isinstance(i, Load) and i.mem_type == MemType.ACC], s.name
            cold = decode_program(program_bytes(on.segments, s.insn_addr, s.insn_count * INSN_BYTES), on.config)
            assert _wgt_loads(cold), s.name
    got, warm, _ = _runs(on, feeds[1:])
    want, _, _ = _runs(off, feeds[1:])
    assert warm == [False, True, True]
    for r, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(a, b, err_msg=f"run {r}")
    assert not np.array_equal(got[0], got[1])   # different inputs, different outputs


def test_module_resident_tsim_warm_runs_cost_less():
    model = transformer_encoder()
    feeds = sample_inputs(model, 4, seed=5)
    on, off = _both(model, "default", feeds)
    got, warm, cyc = _runs(on, feeds[1:], "tsim")
    want, _, cyc_off = _runs(off, feeds[1:], "tsim")
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert warm == [False, True, True]
    assert cyc[1] == cyc[2] < cyc[0] and cyc[1] < cyc_off[1]


def tiny_encoder():
    return transformer_encoder(seq=4, dim=16, heads=2, ffn=32)


def test_partial_fit_and_none_fit_stay_right():
    """tiny (128 weight entries): the small encoder's dense layers do not all fit (some stay, the
    rest reload every run); the MLP's fit none. Either way every run matches the non-resident build."""
    model = tiny_encoder()
    feeds = sample_inputs(model, 4, seed=7)
    on, off = _both(model, "tiny", feeds)
    dense = {s.name for s in on.steps if s.kind == "accel" and s.op.startswith("qdense")}
    kept = set(on.meta["resident_weights"]["layers"])
    assert kept and kept < dense
    assert on.meta["resident_weights"]["entries"] < PRESETS["tiny"].wgt_depth
    got, warm, _ = _runs(on, feeds[1:])
    want, _, _ = _runs(off, feeds[1:])
    assert warm == [False, True, True]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    model = mlp()
    feeds = sample_inputs(model, 3, seed=8)
    on, off = _both(model, "tiny", feeds)
    assert not [s for s in on.steps if warm_program(s)]
    got, warm, _ = _runs(on, feeds[1:])
    want, _, _ = _runs(off, feeds[1:])
    assert warm == [False, False]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_another_program_on_the_device_makes_the_next_run_load_again():
    model = mlp()
    feeds = sample_inputs(model, 3, seed=9)
    on, off = _both(model, "default", feeds)
    want, _, _ = _runs(off, feeds)
    with Executor(on, driver="fsim") as ex:
        step = next(s for s in on.steps if warm_program(s))
        ex.run(feeds[0])
        ex.device.run(step.insn_addr, step.insn_count)   # someone else's program: the record clears
        np.testing.assert_array_equal(next(iter(ex.run(feeds[1]).values())), want[1])
        assert ex.warm is False
        np.testing.assert_array_equal(next(iter(ex.run(feeds[2]).values())), want[2])
        assert ex.warm is True


def test_saved_module_keeps_its_resident_programs(tmp_path):
    model = mlp()
    feeds = sample_inputs(model, 3, seed=4)
    on, off = _both(model, "default", feeds)
    on.save(tmp_path / "m.accm")
    img = ModuleImage.load(tmp_path / "m.accm")
    assert sum(1 for s in img.steps if warm_program(s)) == 3
    got, warm, _ = _runs(img, feeds)
    want, _, _ = _runs(off, feeds)
    assert warm == [False, True, True]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("attrs,match", [({"warm_insn_addr": 3, "warm_insn_count": 2}, "misaligned"),
                                          ({"warm_insn_addr": 0}, "without warm_insn_count"),
                                          ({"warm_insn_addr": "x", "warm_insn_count": 1}, "must be integers"),
                                          ({"warm_insn_addr": 1 << 30, "warm_insn_count": 1}, "outside|not inside")])
def test_crafted_resident_program_is_refused(tmp_path, attrs, match):
    model = mlp()
    feeds = sample_inputs(model, 2, seed=4)
    on = build_model(model, target="accel", config="default", calibration=feeds, force_target=DENSE_ON_ACCEL)
    on.save(tmp_path / "m.accm")
    data = (tmp_path / "m.accm").read_bytes()
    img = ModuleImage.from_bytes(data)
    step = next(s for s in img.steps if warm_program(s))
    step.attrs.pop("warm_insn_addr")
    step.attrs.pop("warm_insn_count")
    step.attrs.update(attrs)
    with pytest.raises(ModuleFormatError, match=match):
        img.validate()
    assert json.dumps(attrs)   # (plain data, as a file would carry it)


def test_cli_flag_turns_residency_off(tmp_path):
    model = mlp()
    onnx.save(model, tmp_path / "mlp.onnx")
    for flag, n in (([], 3), (["--no-resident-weights"], 0)):
        out = tmp_path / f"m{n}.accm"
        assert main(["compile", str(tmp_path / "mlp.onnx"), "-o", str(out), *flag]) == 0
        assert sum(1 for s in ModuleImage.load(out).steps if warm_program(s)) == n


# ---- the RTL -----------------------------------------------------------------------------------
def small_mlp(seed: int = 0):
    b = ModelBuilder("small_mlp", seed)
    x = b.input("x", (4, 16))
    y = b.op("Gemm", [x, b.weight((16, 16)), b.init(np.full(16, 0.05, np.float32))], name="fc1", transB=1)
    y = b.op("Relu", [y], name="relu1")
    y = b.op("Gemm", [y, b.weight((8, 16)), b.init(np.zeros(8, np.float32))], name="fc2", transB=1)
    return b.build([y])


@pytest.mark.rtl
@pytest.mark.skipif(tools_available() is not None, reason=f"rtl driver: {tools_available()}")
@pytest.mark.parametrize("net,kept", [("small_mlp", {"fc1", "fc2"}), ("conv_bn_relu_pool", {"conv1"})])
def test_rtl_resident_runs_match_fsim_and_tsim_cycles(net, kept):
    """tiny config, a two-layer MLP (weights and biases kept) and the tiny CNN (a conv's weights
    kept, pools beside it): three runs on the RTL (the second and third with what the first left
    on chip), bit-exact with the non-resident build on fsim; the RTL's cycles agree with tsim's
    within 1% run by run."""
    model = small_mlp() if net == "small_mlp" else zoo.conv_bn_relu_pool()
    feeds = sample_inputs(model, 4, seed=2)
    on, off = _both(model, "tiny", feeds)
    assert set(on.meta["resident_weights"]["layers"]) == kept
    got, warm, cyc = _runs(on, feeds[1:], "rtl")
    _, _, tcyc = _runs(on, feeds[1:], "tsim")
    want, _, _ = _runs(off, feeds[1:])
    assert warm == [False, True, True]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    assert cyc[1] < cyc[0]
    for a, b in zip(cyc, tcyc):
        assert abs(a - b) <= 0.01 * b


def random_mlp(seed: int, rows: int, dims: list[int]):
    b = ModelBuilder("random_mlp", seed)
    y = b.input("x", (rows, dims[0]))
    for i, (k, n) in enumerate(zip(dims, dims[1:])):
        y = b.op("Gemm", [y, b.weight((n, k)), b.init(np.full(n, 0.02 * i, np.float32))], name=f"fc{i}", transB=1)
        if i < len(dims) - 2:
            y = b.op("Relu", [y], name=f"relu{i}")
    return b.build([y])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.sampled_from(["tiny", "default", BATCH2, BLOCK8]), rows=st.integers(1, 12),
       dims=st.lists(st.integers(4, 96), min_size=2, max_size=4), seed=st.integers(0, 99))
def test_random_mlps_resident_runs_match_non_resident(cfg, rows, dims, seed):
    """Random MLPs on four configs: three runs with residency (whatever fits) each bit-exact with
    the build without it (fsim, race check on)."""
    model = random_mlp(seed, rows, dims)
    feeds = sample_inputs(model, 4, seed=seed)
    on, off = _both(model, cfg, feeds)
    got, warm, _ = _runs(on, feeds[1:])
    want, _, _ = _runs(off, feeds[1:])
    for r, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(a, b, err_msg=f"run {r}")
    kept = on.meta.get("resident_weights", {}).get("layers", {})
    assert warm == [False] + [bool(kept)] * 2
    depth = on.config.wgt_depth
    assert all(0 <= v["base"] and v["base"] + v["entries"] <= depth - 1 for v in kept.values())


@pytest.mark.parametrize("where,why", [("weights", "loads weights into"),
                                       ("biases", "writes accumulator entries of")])
def test_overlapping_places_drop_residency_and_stay_right(monkeypatch, where, why):
    """The build's own check: a plan that put every layer's weights at entry 0, or every layer's
    bias at accumulator entry 40 (so each layer's first-run program loads over another's) is caught
    at link time; no step keeps a warm program, meta says why, and every run is right."""
    real = accel_target.plan_resident_weights

    def overlapping(layers, depth, others=0, top=None):
        if (top is None) == (where == "weights"):
            return {k: 0 if top is None else 40 for k in layers}
        return real(layers, depth, others, top)
    monkeypatch.setattr(accel_target, "plan_resident_weights", overlapping)
    model = mlp()
    feeds = sample_inputs(model, 4, seed=6)
    on, off = _both(model, "default", feeds)
    assert not [s for s in on.steps if warm_program(s)]
    assert why in on.meta["resident_weights"]["off"]
    got, warm, _ = _runs(on, feeds[1:])
    want, _, _ = _runs(off, feeds[1:])
    assert warm == [False] * 3
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def run_resident_conv(cfg, spec, tiling, base, runs, seed, rq=Requant(9, -127, 127)):
    """A conv's cold program once, then its warm one, each on a new input (fsim, race check)."""
    dev = Device(cfg, "fsim", check_races=True)
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    b = rng.integers(-3000, 3000, spec.o).astype(np.int32)
    xs = [rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8) for _ in range(runs)]
    mem = dev.memory
    inp = mem.alloc_array(pack_activation(xs[0], cfg.batch, cfg.block_in), align=cfg.inp_elem_bytes)
    wb = mem.alloc_array(pack_weight(w, cfg.block_out, cfg.block_in), align=cfg.wgt_elem_bytes)
    bb = mem.alloc_array(pack_bias(b, cfg), align=cfg.acc_elem_bytes)
    nb, ob = -(-spec.n // cfg.batch), -(-spec.o // cfg.block_out)
    oshape = (nb, ob, spec.oh, spec.ow, cfg.batch, cfg.block_out)
    out = mem.alloc(int(np.prod(oshape)), align=cfg.out_elem_bytes)
    progs = [_program(dev, lambda s, load=load: emit_conv2d(s, spec, tiling, inp, wb, out, bb, rq,
                                                            region=WeightRegion(base, load)))
             for load in (True, False)]
    for r, x in enumerate(xs):
        inp.write(pack_activation(x, cfg.batch, cfg.block_in))
        addr, count, _ = progs[min(r, 1)]
        dev.run(addr, count)
        got = unpack_activation(out.read(np.int8, oshape), spec.n, spec.o)
        np.testing.assert_array_equal(got, conv2d_reference(x, w, b, spec, rq), err_msg=f"run {r}")
    return progs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.sampled_from([PRESETS["tiny"], SQUARE_ODD, BLOCK8, BATCH2]), n=st.integers(1, 3),
       c=st.integers(1, 20), hw=st.integers(1, 7), o=st.integers(1, 24), k=st.sampled_from([1, 3]),
       stride=st.sampled_from([1, 2]), pad=st.integers(0, 1), pick=st.integers(0, 9), at_top=st.booleans(),
       seed=st.integers(0, 99))
def test_resident_conv_bit_exact_over_runs_and_tilings(cfg, n, c, hw, o, k, stride, pad, pick, at_top, seed):
    """A conv keeps its weights across inferences (any of the 10 best tilings with one input chunk:
    output-channel groups, batch blocks, row tiles, kernel rows loaded one by one): the first run
    loads them, the next two load none, every run matches the reference."""
    try:
        spec = Conv2dSpec(n, c, hw, hw, o, k, k, (pad,) * 4, (stride, stride), name="conv")
        cands = [t for _, t in conv2d_candidates(spec, cfg, 2) if t.ic_t * cfg.block_in >= c]
    except TilingError:
        return
    if not cands:
        return
    t = cands[pick % len(cands)]
    size = weight_region_entries(spec, cfg)
    base = cfg.wgt_depth - 1 - size if at_top else 0
    if size > cfg.wgt_depth - 1:   # entry wgt_depth - 1 is the residual identity's
        with pytest.raises(TilingError, match="leave the weight buffer"):
            run_resident_conv(cfg, spec, t, base, 1, seed)
        return
    progs = run_resident_conv(cfg, spec, t, base, 3, seed)
    cold, warm = _wgt_loads(progs[0][2]), _wgt_loads(progs[1][2])
    assert not warm
    assert all(base <= i.sram_base and i.sram_base + i.y_size * i.x_size <= base + size for i in cold)
    assert sum(i.y_size * i.x_size for i in cold) == size


@pytest.mark.parametrize("net,cfg", [("conv_bn_relu_pool", "default"), ("residual_block", "default"),
                                     ("depthwise_separable", "default"), ("residual_block", "tiny")])
def test_conv_nets_resident_bit_exact_over_runs(net, cfg):
    """Conv layers with one input chunk keep their weights too (next to pools, fused residuals and
    depthwise layers): three runs each bit-exact with the build without residency."""
    model = getattr(zoo, net)()
    feeds = sample_inputs(model, 4, seed=11)
    on = build_model(model, target="accel", config=cfg, calibration=feeds[:2])
    off = build_model(model, target="accel", config=cfg, calibration=feeds[:2], target_options={"resident_weights": False})
    got, warm, _ = _runs(on, feeds[1:])
    want, _, _ = _runs(off, feeds[1:])
    for r, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(a, b, err_msg=f"run {r}")
    kept = on.meta.get("resident_weights", {}).get("layers", {})
    assert warm == [False] + [bool(kept)] * 2


def test_an_unknown_build_option_is_one_error_naming_the_allowed_ones():
    with pytest.raises(TargetError, match=r"target 'accel': unknown build option\(s\) resident; its options are "
                                          r"resident_weights"):
        build_model(zoo.mlp(), target="accel", config="tiny", target_options={"resident": False})
    with pytest.raises(TargetError, match=r"target 'cpu': unknown build option\(s\) resident_weights; its options "
                                          r"are none"):
        build_model(zoo.mlp(), target="cpu", target_options={"resident_weights": False})
