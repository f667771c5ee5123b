"""Dilated convolutions on the accelerator: windowed and gathered (a band per tap) input tiles, and
paddings wider than a LOAD's padding fields, bit for bit against the int8 reference."""
import numpy as np
import pytest
from conv_cases import ODD, rand_conv
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from accel.isa import PRESETS, Load, MemType
from compiler.accel.conv2d import (
    Conv2dSpec,
    ConvTiling,
    Requant,
    TilingError,
    conv2d_candidates,
    conv2d_reference,
    plan_conv2d,
    run_conv2d,
)
from compiler.accel.eltwise import add_reference
from compiler.accel.emit import PAD_MAX
from compiler.accel.grouped import grouped_reference, run_grouped_conv2d
from compiler.accel.lower import LowerError, lower_conv2d
from compiler.accel.spec import input_entries
from compiler.accel.tune import _key
from host_runtime import Device


def _run(cfg, spec, tiling, rq=Requant(9, -127, 127), seed=0, residual=False, bias=True):
    """Run on fsim with `tiling`; assert the output equals the reference. Returns the stream."""
    rng = np.random.default_rng(seed)
    x, w, b = rand_conv(rng, spec, bias)
    want = conv2d_reference(x, w, b, spec, rq)
    fused = None
    if residual:
        r = rng.integers(-127, 128, (spec.n, spec.o, spec.oh, spec.ow), dtype=np.int8)
        fused = (r, 0, 1, Requant(1, -127, 127, True))
        want = add_reference(want, r, 0, 1, fused[3])
    y, _, stream = run_conv2d(Device(cfg, dram_bytes=8 << 20), x, w, b, spec, rq, tiling.vt, tiling, residual=fused)
    assert np.array_equal(y, want), f"{spec} {tiling.describe()}"
    return stream


def _loads(stream) -> list[Load]:
    return [i for i in stream.last_insns if isinstance(i, Load)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.sampled_from([PRESETS["tiny"], ODD, PRESETS["default"]]), n=st.integers(1, 2), c=st.integers(1, 40),
       h=st.integers(1, 14), w=st.integers(1, 14), o_blocks=st.integers(1, 3),
       k=st.tuples(st.sampled_from([1, 2, 3]), st.sampled_from([1, 2, 3])),
       dil=st.tuples(st.integers(1, 6), st.integers(1, 6)), pads=st.tuples(*[st.integers(0, 20)] * 4),
       strides=st.tuples(st.integers(1, 2), st.integers(1, 2)), residual=st.booleans(), vt=st.sampled_from([1, 2]),
       gather=st.booleans(), pick=st.integers(0, 29), seed=st.integers(0, 99))
def test_dilated_conv_any_candidate_tiling_is_bit_exact(cfg, n, c, h, w, o_blocks, k, dil, pads, strides, residual,
                                                        vt, gather, pick, seed):
    """Any of the planner's candidates (windowed or gathered input tiles, several chunks, edge
    tiles wholly in the padding, pads past the LOAD fields), with or without a fused residual."""
    residual = residual and cfg.block_in == cfg.block_out
    try:
        spec = Conv2dSpec(n, c, h, w, o_blocks * cfg.block_out, *k, pads, strides, "dil", dil)
        cands = conv2d_candidates(spec, cfg, vt, residual)
    except TilingError:   # a window larger than the padded input, or no tile fits the buffers
        event("no tiling")
        return
    mode = [t for _, t in cands if t.gather == gather] or [t for _, t in cands]
    t = mode[pick % len(mode)]
    event("gathered" if t.gather else "windowed")
    # without a bias, or with a fixed-point requantization, tiles end in ALU passes (no FLUSH on
    # the last GEMM), and the GEMM walks output rows and columns in two loops
    rq = Requant(9, -127, 127) if seed % 3 else Requant(20, -127, 127, mul=181 + seed)
    stream = _run(cfg, spec, t, rq, seed, residual, bias=seed % 2 == 0)
    assert all(max(i.y_pad0, i.y_pad1, i.x_pad0, i.x_pad1) <= PAD_MAX for i in _loads(stream))


@pytest.mark.parametrize("gather", [False, True])
def test_padding_wider_than_a_load_goes_in_pieces(gather):
    """Pads of 16-20 (a dilation-18 conv's, a causal 1-D conv's) exceed a LOAD's 4-bit padding
    fields: the input tile is written as data rows between zero runs (LOADs that read no DRAM)."""
    cfg = PRESETS["default"]
    for spec in (Conv2dSpec(1, 32, 15, 15, 16, 3, 3, (20, 17, 16, 19), (1, 1), "wide", (4, 5)),
                 Conv2dSpec(1, 16, 1, 40, 16, 1, 3, (0, 0, 36, 0), (1, 1), "causal", (1, 18))):
        t = next(t for _, t in conv2d_candidates(spec, cfg, 2) if t.gather == gather)
        loads = _loads(_run(cfg, spec, t))
        fills = [i for i in loads if i.mem_type == MemType.INP and i.y_size == 0]
        assert fills and all(max(i.y_pad0, i.y_pad1, i.x_pad0, i.x_pad1) <= PAD_MAX for i in loads)


def test_a_wide_dilation_gathers_its_taps():
    """Dilation 18 (DeepLab's ASPP): one output pixel's window spans 37 x 37 input pixels, more than
    a buffer slot holds, while its taps read 9. The planner tiles by tap, and each input block of
    a tile holds a band per tap."""
    cfg = PRESETS["default"]
    spec = Conv2dSpec(1, 32, 33, 33, 32, 3, 3, (18,) * 4, (1, 1), "aspp18", (18, 18))
    assert (spec.span_h, spec.oh) == (37, 33)
    t = plan_conv2d(spec, cfg, 2)
    assert t.gather and input_entries(spec, t) == 9 * t.h_t * t.w_t
    assert all(c[1].gather for c in conv2d_candidates(spec, cfg, 2))   # no window fits
    _run(cfg, spec, t, Requant(8, 0, 127, round=True), residual=True)


def test_gathering_needs_unit_column_stride():
    cfg = PRESETS["default"]
    spec = Conv2dSpec(1, 16, 20, 20, 16, 3, 3, (2,) * 4, (1, 2), "s2", (2, 2))
    assert not any(t.gather for _, t in conv2d_candidates(spec, cfg, 2))
    _run(cfg, spec, plan_conv2d(spec, cfg, 2))
    with pytest.raises(TilingError, match="column stride 1"):
        _run(cfg, spec, ConvTiling(1, 2, 2, 1, 2, gather=True))
    plain = Conv2dSpec(1, 16, 20, 20, 16, 3, 3, (1,) * 4)
    assert not any(t.gather for _, t in conv2d_candidates(plain, cfg, 2))


def test_dilation_is_part_of_the_layer():
    a = Conv2dSpec(1, 16, 20, 20, 16, 3, 3, (2,) * 4)
    b = Conv2dSpec(1, 16, 20, 20, 16, 3, 3, (2,) * 4, dilations=(2, 2))
    assert (a.oh, b.oh, b.macs) == (22, 20, a.macs * 400 // 484)
    cfg = PRESETS["default"]
    assert _key(a, cfg, 2) != _key(b, cfg, 2)   # tuning records are per dilation
    with pytest.raises(TilingError, match=r"dilations \(0, 1\)"):
        Conv2dSpec(1, 16, 20, 20, 16, 3, 3, dilations=(0, 1))
    with pytest.raises(TilingError, match="spanning 21x3"):
        Conv2dSpec(1, 16, 20, 20, 16, 3, 3, dilations=(10, 1))
    with pytest.raises(LowerError, match="no dilated convolution"):
        lower_conv2d(b, cfg)


@pytest.mark.parametrize("groups,c,o", [(2, 32, 32), (32, 32, 32), (3, 24, 48)], ids=["grouped", "depthwise", "narrow"])
def test_grouped_and_depthwise_dilated_convs(groups, c, o):
    """Channel slices (and per-block windows of narrow groups) keep the layer's dilation."""
    cfg = PRESETS["default"]
    spec = Conv2dSpec(1, c, 13, 11, o, 3, 3, (4, 4, 17, 17), (1, 1), "g", (4, 17))
    rng = np.random.default_rng(groups)
    x = rng.integers(-128, 128, (1, c, 13, 11), dtype=np.int8)
    w = rng.integers(-128, 128, (o, c // groups, 3, 3), dtype=np.int8)
    b = rng.integers(-20000, 20000, o).astype(np.int32)
    rq = Requant(8, -127, 127)
    y, _, _ = run_grouped_conv2d(Device(cfg, dram_bytes=32 << 20), x, w, b, spec, groups, rq)
    assert np.array_equal(y, grouped_reference(x, w, b, spec, groups, rq))
