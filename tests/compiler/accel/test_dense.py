"""Dense layers (compiler.accel.dense): rows streamed past resident weights, bit-exact on fsim for any
candidate tiling and every epilogue form, with the weights loaded once per output-channel group."""
import numpy as np
import pytest
from conv_cases import ODD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel.isa import PRESETS, AccelConfig, MemType
from compiler import build_model
from compiler.accel.conv2d import (
    Conv2dSpec,
    ConvTiling,
    Requant,
    TilingError,
    conv2d_candidates,
    conv2d_reference,
    dense_reference,
    estimate_cycles,
    plan_conv2d,
    run_conv2d,
    run_dense,
)
from compiler.accel.eltwise import add_reference
from compiler.accel.spec import dense_view, is_dense
from compiler.accel.tune import tune_conv2d
from compiler.frontend import from_onnx
from compiler.frontend.zoo import conv_bn_relu_pool, mlp, sample_inputs
from host_runtime import Device

SQUARE_ODD = AccelConfig(batch=2, block_in=8, block_out=8, acc_buff_bytes=16 * 1024, out_buff_bytes=4 * 1024,
                         inp_buff_bytes=2 * 1024, wgt_buff_bytes=4 * 1024)


def _spec(rows, k, m):
    return Conv2dSpec(rows, k, 1, 1, m, 1, 1, name="fc")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.sampled_from([PRESETS["tiny"], ODD, SQUARE_ODD, PRESETS["default"]]), rows=st.integers(1, 40),
       k=st.integers(1, 70), m=st.integers(1, 50), vt=st.sampled_from([1, 2]), pick=st.integers(0, 19),
       form=st.sampled_from(["flush", "nobias", "fixed", "zp", "residual", "residual_shift", "scales"]),
       seed=st.integers(0, 99))
def test_dense_any_candidate_tiling_every_epilogue_bit_exact(cfg, rows, k, m, vt, pick, form, seed):
    """Any of the 20 best-estimated tilings (several row tiles, channel groups, input chunks, edge
    tiles), each epilogue (flushing GEMM, no bias, fixed point, zero point, fused residual with and
    without a shift after the add, per-channel scales) matches the int8 reference."""
    residual = form.startswith("residual")
    if residual and cfg.block_in != cfg.block_out:
        cfg = SQUARE_ODD
    spec = _spec(rows, k, m)
    cands = conv2d_candidates(spec, cfg, vt, residual)
    t = cands[pick % len(cands)][1]
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (rows, k, 1, 1), dtype=np.int8)
    w = rng.integers(-128, 128, (m, k, 1, 1), dtype=np.int8)
    b = None if form == "nobias" else rng.integers(-3000, 3000, m).astype(np.int32)
    rq = {"fixed": Requant(12, -127, 127, True, 2731), "zp": Requant(8, -128, 127, zero_point=-5),
          "scales": Requant(0, 0, 127)}.get(form, Requant(8, 0 if seed % 2 else -127, 127, round=seed % 3 == 0))
    muls = None
    if form == "scales":
        muls = (rng.integers(1 << 10, 1 << 16, m), 24)
    want = conv2d_reference(x, w, b, spec, rq, muls)
    fused = None
    if residual:
        r = rng.integers(-127, 128, (rows, m, 1, 1), dtype=np.int8)
        ka, kb = ((0, 1), (1, 0), (0, 0))[seed % 3] if form == "residual" else (1, 2)
        fused = (r, ka, kb, Requant(2, -127, 127, True))
        want = add_reference(want, r, ka, kb, fused[3])
    y, _, _ = run_conv2d(Device(cfg, dram_bytes=8 << 20), x, w, b, spec, rq, vt, t, residual=fused,
                         channel_muls=muls)
    assert np.array_equal(y, want), (t.describe(), form)


@pytest.mark.parametrize("vt", [1, 2])
def test_dense_loads_each_weight_once_and_streams_rows(vt):
    """Weights that fit stay on chip: every weight entry is loaded once (not once per row block as
    when each row block was a tile of its own), the input once when it fits, and the last
    chunk's GEMM flushes, so the compute stage runs only the GEMM's micro-ops and each slot's first
    bias MOV."""
    cfg = PRESETS["default"]
    rows, k, m = 64, 128, 96
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (rows, k), dtype=np.int8)
    w = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-999, 999, m).astype(np.int32)
    rq = Requant(9, 0, 127, True)
    y, res, stream = run_dense(Device(cfg), x, w, b, rq, vt)
    assert np.array_equal(y, dense_reference(x, w, b, rq))
    spec = _spec(rows, k, m)
    t = plan_conv2d(spec, cfg, vt)
    loads = [i for i in stream.last_insns if getattr(i, "mem_type", None) == MemType.WGT]
    assert sum(i.y_size * i.x_size for i in loads) == (m // cfg.block_out) * (k // cfg.block_in)
    inp = [i for i in stream.last_insns if getattr(i, "mem_type", None) == MemType.INP]
    # the whole input (512 entries) fits: it stays on chip for every group, read once
    assert sum(i.y_size * i.x_size for i in inp) == rows * (k // cfg.block_in)
    gemm = rows * (k // cfg.block_in) * (m // cfg.block_out)
    assert res.stats["gemm_uops"] == gemm and res.stats["alu_uops"] <= vt * t.w_t * t.o_t
    assert any(getattr(i, "flush", False) for i in stream.last_insns)


def test_dense_spec_is_planned_as_rows_of_one_image():
    """A dense layer is planned on its transposed view (w_t row blocks per tile), ranked by the dense
    estimate; a 1x1 conv on a bigger image is not dense."""
    cfg = PRESETS["default"]
    spec = _spec(256, 512, 512)
    assert is_dense(spec) and not is_dense(Conv2dSpec(1, 16, 2, 2, 16, 1, 1))
    view = dense_view(spec, cfg)
    assert (view.n, view.h, view.w) == (cfg.batch, 1, 256)
    t = plan_conv2d(spec, cfg)
    assert t.h_t == 1 and t.w_t > 1
    assert conv2d_candidates(spec, cfg)[0] == (estimate_cycles(spec, cfg, t)["cycles"], t)
    with pytest.raises(TilingError, match="^fc: a dense tiling streams row blocks in w_t; h_t must be 1"):
        run_conv2d(Device(cfg), np.zeros((4, 16, 1, 1), np.int8), np.zeros((16, 16, 1, 1), np.int8), None,
                   _spec(4, 16, 16), Requant(), 2, ConvTiling(1, 2, 1, 1, 2))


def test_dense_estimate_tracks_the_weight_reuse():
    """Streaming more rows past the same weights costs less per row: the estimate of the whole
    layer grows slower than its rows (weights loaded once per group, not per row block)."""
    cfg = PRESETS["default"]
    small, big = _spec(16, 256, 256), _spec(256, 256, 256)
    c_small = estimate_cycles(small, cfg, plan_conv2d(small, cfg))["cycles"]
    c_big = estimate_cycles(big, cfg, plan_conv2d(big, cfg))["cycles"]
    assert c_big < 16 * c_small * 0.5


@pytest.mark.parametrize("vt", [1, 2])
def test_dense_next_group_weights_load_beside_the_row_tiles(vt):
    """With two slots the next group's weights load in pieces beside this group's row tiles 1..
    (three groups of two blocks, four row tiles: pieces of one block), each weight entry once,
    bit-exact; with one slot each group loads its own weights with its first tile. The layer's
    first tile loads and computes in bands of output blocks (one each here)."""
    cfg = PRESETS["default"]
    rows, k, m = 64, 128, 96
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (rows, k, 1, 1), dtype=np.int8)
    w = rng.integers(-128, 128, (m, k, 1, 1), dtype=np.int8)
    b = rng.integers(-999, 999, m).astype(np.int32)
    spec, rq = _spec(rows, k, m), Requant(9, -127, 127)
    y, _, stream = run_conv2d(Device(cfg), x, w, b, spec, rq, vt, ConvTiling(2, 1, 16, 8, vt))
    assert np.array_equal(y, conv2d_reference(x, w, b, spec, rq))
    loads = [i for i in stream.last_insns if getattr(i, "mem_type", None) == MemType.WGT]
    assert sum(i.y_size * i.x_size for i in loads) == 6 * 8
    assert len(loads) == (2 + 2 * 2 if vt == 2 else 2 + 1 + 1)   # the first tile's in two bands


def test_mlp_gemms_offload_batch1_classifier_stays_on_the_cpu():
    """Dense layers with a few rows (the zoo MLP's batch of 4) pass the partitioner's roofline rule
    and all their MACs go to the accelerator; a batch-1 classifier (one MAC per weight byte) does not."""
    m = mlp()
    mod = build_model(from_onnx(m), target="accel", config="default", calibration=sample_inputs(m, 2, seed=1))
    assert mod.meta["macs"]["cpu"] == 0 and mod.meta["macs"]["accel"] > 0
    c = conv_bn_relu_pool()
    mod = build_model(from_onnx(c), target="accel", config="default", calibration=sample_inputs(c, 2, seed=1))
    fc = [r for r in mod.meta["partition"] if r["name"] == "fc"]
    assert fc and fc[0]["target"] == "cpu" and "memory-bound" in fc[0]["reason"]


def test_dense_tuning_measures_the_dense_candidates(tmp_path):
    """tune_conv2d on a dense layer measures its dense candidates on tsim and keeps the fastest;
    the log makes the second call a lookup."""
    cfg, spec = PRESETS["tiny"], _spec(24, 20, 12)
    log = tmp_path / "tune.json"
    t, rec = tune_conv2d(spec, cfg, top=3, log_path=log)
    cands = [c for _, c in conv2d_candidates(spec, cfg)[:3]]
    assert t in cands and rec["cycles"] == min(r["cycles"] for r in rec["trials"]) and t.h_t == 1
    assert tune_conv2d(spec, cfg, top=3, log_path=log) == (t, rec)
