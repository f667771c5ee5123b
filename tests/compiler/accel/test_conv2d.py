"""conv2d / dense on the accelerator through the functional simulator, bit-exact against numpy."""
import numpy as np
import pytest
from conv_cases import ODD, check_conv, rand_conv, resnet_layer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accel.isa import PRESETS, AluOp, Epilogue, Gemm, Load, MemType, Store, flush_immediate
from compiler.accel import plan as conv_plan
from compiler.accel.conv2d import (
    FILL_BANDS,
    Conv2dSpec,
    ConvTiling,
    Requant,
    TilingError,
    _ceil,
    _fits,
    conv2d_candidates,
    conv2d_reference,
    dense_reference,
    flush_params,
    input_resident,
    plan_conv2d,
    run_conv2d,
    run_dense,
)
from compiler.accel.eltwise import add_reference
from compiler.accel.layout import pack_activation, pack_weight, unpack_activation, unpack_weight
from compiler.accel.tune import measure_conv2d
from compiler.graph.ops import fixed_multiplier
from host_runtime import Device

_rand = rand_conv


def _check(cfg, spec, rq, vt=2, seed=0, bias=True):
    return check_conv(run_conv2d, cfg, spec, rq, vt, seed, bias)[1]


@pytest.mark.parametrize("name", [f"C{i}" for i in range(2, 12)])
def test_conv2d_resnet18_layer_default_config_bit_exact(name):
    spec = resnet_layer(name)
    res = _check(PRESETS["default"], spec, Requant(shift=11, lo=0, hi=127))
    assert res.stats["macs"] >= spec.macs  # padded channels only add work


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.sampled_from([PRESETS["tiny"], ODD, PRESETS["default"]]), n=st.integers(1, 3), c=st.integers(1, 40),
       h=st.integers(1, 12), w=st.integers(1, 12), o=st.integers(1, 40), k=st.sampled_from([1, 2, 3, 5]),
       pads=st.tuples(*[st.integers(0, 3)] * 4), strides=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       shift=st.integers(0, 16), relu=st.booleans(), vt=st.sampled_from([1, 2]), seed=st.integers(0, 9))
def test_conv2d_random_shapes_and_configs(cfg, n, c, h, w, o, k, pads, strides, shift, relu, vt, seed):
    if h + pads[0] + pads[1] < k or w + pads[2] + pads[3] < k:
        return
    spec = Conv2dSpec(n, c, h, w, o, k, k, pads, strides)
    zp = (0, 0, -128, 9, -3)[seed % 5]   # an asymmetric output's zero point, added before the clamp
    _check(cfg, spec, Requant(shift, 0 if relu else (-128 if zp else -127), 127, round=seed % 3 == 0 and shift <= 15,
                              mul=(1, 3, 181, (1 << 23) + 4321)[seed % 4], zero_point=zp), vt, seed, bias=seed % 2 == 0)


def test_conv2d_candidates_keep_the_tallest_balanced_row_tiles():
    """For each (o_t, ic_t, w_t) the candidates reach the tallest row tile that fits, balanced over
    the image, also on an image taller than the 64 splits the candidate heights come from."""
    cfg = PRESETS["tiny"]
    spec = Conv2dSpec(1, 4, 200, 200, 4, 3, 3, (1, 1, 1, 1))
    heights: dict = {}
    for _, t in conv2d_candidates(spec, cfg):
        heights.setdefault((t.o_t, t.ic_t, t.w_t), set()).add(t.h_t)
    for (o_t, ic_t, w_t), hs in heights.items():
        lo = max(h for h in range(1, spec.oh + 1) if _fits(spec, cfg, ConvTiling(o_t, h, w_t, ic_t, 2)))
        assert max(hs) == _ceil(spec.oh, _ceil(spec.oh, lo)), (o_t, ic_t, w_t, lo, sorted(hs))


def test_conv2d_candidates_searched_once_per_shape(monkeypatch):
    """The tiling search runs once per layer shape (names aside) and estimate constants; errors
    still name the layer asked about."""
    cfg = PRESETS["default"]
    a, b = Conv2dSpec(1, 64, 14, 14, 96, 1, 1, name="a"), Conv2dSpec(1, 64, 14, 14, 96, 1, 1, name="b")
    conv_plan._ranked_tilings.cache_clear()
    first = conv_plan.conv2d_candidates(a, cfg)
    assert conv_plan.conv2d_candidates(b, cfg) == first and conv_plan._ranked_tilings.cache_info().hits == 1
    monkeypatch.setattr(conv_plan, "INSN_CYCLES", conv_plan.INSN_CYCLES + 1000)   # another estimate: searched again
    again = conv_plan.conv2d_candidates(a, cfg)
    assert conv_plan._ranked_tilings.cache_info().misses == 2 and [c for c, _ in again] != [c for c, _ in first]
    for name in ("x", "y"):   # nothing fits: each error names its own layer
        with pytest.raises(TilingError, match=f"^{name}: cannot be tiled .*short by 194"):
            conv_plan.conv2d_candidates(Conv2dSpec(1, 4, 8, 8, 4, 15, 15, (7, 7, 7, 7), name=name), PRESETS["tiny"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.sampled_from([PRESETS["tiny"], PRESETS["default"]]), n=st.integers(1, 2), c=st.integers(1, 48),
       h=st.integers(2, 12), w=st.integers(2, 12), o_blocks=st.integers(1, 4), k=st.sampled_from([1, 1, 3]),
       stride=st.sampled_from([1, 1, 2]), residual=st.booleans(), vt=st.sampled_from([1, 2]),
       pick=st.integers(0, 19), seed=st.integers(0, 99))
def test_conv2d_any_candidate_tiling_is_bit_exact(cfg, n, c, h, w, o_blocks, k, stride, residual, vt, pick, seed):
    """Not only the planner's pick: any of the 20 best-estimated tilings (row bands of the first and
    last tiles, merged transfers, resident inputs, several chunks, edge tiles), with or without a
    fused residual, is bit-exact against the int8 reference (and race-free: the tests run fsim's
    race check)."""
    spec = Conv2dSpec(n, c, h, w, o_blocks * cfg.block_out, k, k, (k // 2,) * 4, (stride, stride))
    cands = conv2d_candidates(spec, cfg, vt, residual)
    t = cands[pick % len(cands)][1]
    rng = np.random.default_rng(seed)
    x, wt, b = _rand(rng, spec)
    rq = Requant(9, -127, 127)
    want = conv2d_reference(x, wt, b, spec, rq)
    fused = None
    if residual:
        r = rng.integers(-127, 128, (n, spec.o, spec.oh, spec.ow), dtype=np.int8)
        ka, kb = ((0, 0), (0, 1), (1, 0))[seed % 3]
        fused = (r, ka, kb, Requant(2, -127, 127, True))
        want = add_reference(want, r, ka, kb, fused[3])
    y, _, _ = run_conv2d(Device(cfg, dram_bytes=8 << 20), x, wt, b, spec, rq, vt, t, residual=fused)
    assert np.array_equal(y, want), t.describe()


@pytest.mark.parametrize("vt", [1, 2])
@pytest.mark.parametrize("rq", [Requant(7, 0, 127, round=True), Requant(0, -128, 127), Requant(12, 0, 6),
                                Requant(5, -6, 5)], ids=["relu", "shift0", "relu6", "narrow"])
def test_conv2d_flush_seeds_the_next_tile_of_its_slot(vt, rq):
    """FLUSH ends each tile (requantized into the output buffer) and seeds its slot's next tile with
    that tile's bias, loading it first when the channels change, so only each slot's first tile
    takes a bias MOV (3 channel groups x 2 row tiles). With edge tiles (5 channel blocks: groups of
    2, 2, 1; rows 4, 4, 1) a tile shaped unlike its slot's previous one takes a MOV. Bit-exact
    against the reference either way."""
    cfg = PRESETS["tiny"]
    for blocks, rows in ((6, 8), (5, 9)):
        spec = Conv2dSpec(1, 8, rows, 6, blocks * cfg.block_out, 3, 3, (1, 1, 1, 1), name="flush")
        x, w, b = _rand(np.random.default_rng(11), spec)
        y, res, stream = run_conv2d(Device(cfg), x, w, b, spec, rq, vt, ConvTiling(2, 4, 6, 1, vt))
        assert np.array_equal(y, conv2d_reference(x, w, b, spec, rq)), (blocks, rows)
        ops = [i.alu_op for i in stream.last_insns if getattr(i, "alu_op", None) is not None]
        tiles = 3 * ((rows + 3) // 4)
        # a one-row tile (rows 9: the last row tile) flushes on its GEMM (linear_pixels), the others in a pass
        one_row = 3 * (rows % 4 == 1)
        assert ops.count(AluOp.FLUSH) == tiles - one_row
        assert sum(getattr(i, "flush", False) for i in stream.last_insns) == one_row
        if blocks == 6:
            assert ops.count(AluOp.MOV) == vt and res.stats["alu_uops"] == blocks * rows * 6 + vt * 2 * 4 * 6


@pytest.mark.parametrize("vt", [1, 2])
@pytest.mark.parametrize("rq", [Requant(7, 0, 127, round=True), Requant(5, -6, 5)], ids=["relu", "narrow"])
def test_conv2d_1x1_flushes_on_its_gemm(vt, rq):
    """A 1x1 stride-1 conv ends each tile's sums on the last chunk's GEMM (Gemm.flush after an
    EPILOGUE naming the slot's bias entries), so it runs no FLUSH pass: its only ALU micro-ops are
    each slot's first bias MOV (and the MOVs of tiles shaped unlike their slot's previous one).
    Several input-channel chunks (only the last flushes), edge tiles, bit-exact."""
    cfg = PRESETS["tiny"]
    spec = Conv2dSpec(1, 3 * cfg.block_in, 5, 7, 5 * cfg.block_out, 1, 1, name="pointwise")
    x, w, b = _rand(np.random.default_rng(5), spec)
    t = ConvTiling(2, 2, 7, 2, vt)   # channel groups 2, 2, 1; rows 2, 2, 1; input chunks 2, 1
    y, res, stream = run_conv2d(Device(cfg), x, w, b, spec, rq, vt, t)
    assert np.array_equal(y, conv2d_reference(x, w, b, spec, rq))
    insns = stream.last_insns
    tiles = 3 * 3
    assert not [i for i in insns if getattr(i, "alu_op", None) == AluOp.FLUSH]
    assert sum(isinstance(i, Gemm) and i.flush for i in insns) == tiles
    # the first input chunk's, the layer's first one in row bands (FILL_BANDS, its tile has 2 rows)
    assert sum(isinstance(i, Gemm) and not i.flush for i in insns) == tiles + min(FILL_BANDS, 2) - 1
    assert sum(isinstance(i, Epilogue) for i in insns) == tiles
    movs = [i for i in insns if getattr(i, "alu_op", None) == AluOp.MOV]
    assert vt <= len(movs) < tiles and res.stats["alu_uops"] < spec.oh * spec.ow * 5


@pytest.mark.parametrize("vt", [1, 2])
def test_conv2d_whole_row_tiles_load_their_channel_blocks_in_one_load(vt):
    """A tile of whole unpadded rows loads all the channel blocks of its chunk in one LOAD (one DMA
    row per block) and stores its output blocks in one STORE; the layer's first chunk, in row bands,
    loads a block per band, and its last tile stores a block per band; a padded 3x3 conv keeps a LOAD
    per block. Bit-exact."""
    cfg = PRESETS["tiny"]
    for spec, t, want in ((Conv2dSpec(1, 3 * cfg.block_in, 6, 5, 2 * cfg.block_out, 1, 1, name="rows"),
                           ConvTiling(2, 2, 5, 3, vt), 3 * min(FILL_BANDS, 2) + 2),   # 3 row tiles, tile 0 banded
                          (Conv2dSpec(1, 3 * cfg.block_in, 6, 5, 2 * cfg.block_out, 3, 3, (1, 1, 1, 1), name="pad"),
                           ConvTiling(2, 2, 5, 3, vt), 3 * 3)):
        x, w, b = _rand(np.random.default_rng(3), spec)
        rq = Requant(8, -127, 127)
        y, _, stream = run_conv2d(Device(cfg), x, w, b, spec, rq, vt, t)
        assert np.array_equal(y, conv2d_reference(x, w, b, spec, rq)), spec.name
        loads = [i for i in stream.last_insns if isinstance(i, Load) and i.mem_type == MemType.INP]
        assert len(loads) == want, spec.name
        if spec.kh == 1:   # 3 row tiles of 2 output blocks: one STORE each but the banded last
            assert sum(isinstance(i, Store) for i in stream.last_insns) == 2 + min(FILL_BANDS, 2) * 2


@pytest.mark.parametrize("vt", [1, 2])
@pytest.mark.parametrize("residual", [False, True])
def test_conv2d_one_spatial_tile_loads_its_input_once(vt, residual):
    """One tile of rows and columns and one input chunk: every output-channel group reads the same
    input, which is loaded once (input_resident); with a fused residual, each tile's residual still
    goes to its own slot. Bit-exact against the reference."""
    cfg = PRESETS["tiny"]
    spec = Conv2dSpec(1, 2 * cfg.block_in, 4, 5, 5 * cfg.block_out, 1, 1, name="resident")
    x, w, b = _rand(np.random.default_rng(8), spec)
    t = ConvTiling(2, 4, 5, 2, vt)   # output-channel groups 2, 2, 1
    assert input_resident(spec, cfg, t)
    rq = Requant(6, -127, 127)
    if residual:
        r = np.random.default_rng(9).integers(-127, 128, (1, spec.o, spec.oh, spec.ow), dtype=np.int8)
        rq2 = Requant(1, -127, 127, True)
        y, _, stream = run_conv2d(Device(cfg), x, w, b, spec, rq, vt, t, residual=(r, 0, 0, rq2))
        want = add_reference(conv2d_reference(x, w, b, spec, rq), r, 0, 0, rq2)
    else:
        y, _, stream = run_conv2d(Device(cfg), x, w, b, spec, rq, vt, t)
        want = conv2d_reference(x, w, b, spec, rq)
    assert np.array_equal(y, want)
    inp_loads = [i for i in stream.last_insns if isinstance(i, Load) and i.mem_type == MemType.INP]
    # the input's two channel blocks of 4x5 pixels once (the first tile loads them in row bands),
    # and each of the five output blocks' residual
    assert sum(i.y_size * i.x_size for i in inp_loads) == (2 + (5 if residual else 0)) * 20


@pytest.mark.parametrize("cfg", [PRESETS["tiny"], ODD], ids=["tiny", "b2x8x16"])
def test_conv2d_virtual_threads_give_identical_bytes(cfg):
    spec = Conv2dSpec(2, 24, 14, 14, 20, 3, 3, (1, 1, 1, 1), (1, 1))
    x, w, b = _rand(np.random.default_rng(3), spec)
    outs = []
    for vt in (1, 2):
        y, res, stream = run_conv2d(Device(cfg), x, w, b, spec, Requant(9), vt)
        outs.append(y)
        flags = sum(i.pop_prev or i.pop_next for i in stream.last_insns)
        assert flags > 0
    assert np.array_equal(outs[0], outs[1])


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 40), k=st.integers(1, 70), m=st.integers(1, 40), seed=st.integers(0, 99),
       cfg=st.sampled_from([PRESETS["tiny"], ODD]))
def test_dense_random(rows, k, m, seed, cfg):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (rows, k), dtype=np.int8)
    w = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-999, 999, m).astype(np.int32)
    y, _, _ = run_dense(Device(cfg), x, w, b, Requant(6, -90, 90))
    assert np.array_equal(y, dense_reference(x, w, b, Requant(6, -90, 90)))


@pytest.mark.parametrize("cfg_name, relu", [("tiny", True), ("default", False)])
def test_fixed_point_requantization_matches_reference(cfg_name, relu):
    """A scale that is not a power of two: SCALE (24-bit multiplier, rounding shift) then the
    clamp, per tile slot, bit-exact against the numpy reference; the dense path too."""
    cfg = PRESETS[cfg_name]
    mul, k = fixed_multiplier(0.0123456, "test")
    rq = Requant(k, 0 if relu else -127, 127, True, mul)
    spec = Conv2dSpec(1, 2 * cfg.block_in, 9, 7, 3 * cfg.block_out, 3, 3, (1, 1, 1, 1), name="fx")
    _, _, stream = check_conv(run_conv2d, cfg, spec, rq)
    assert any(getattr(i, "alu_op", None) == AluOp.SCALE for i in stream.last_insns)
    rng = np.random.default_rng(5)
    x = rng.integers(-128, 128, (5, 3 * cfg.block_in), dtype=np.int8)
    w = rng.integers(-128, 128, (2 * cfg.block_out, 3 * cfg.block_in), dtype=np.int8)
    b = rng.integers(-9999, 9999, 2 * cfg.block_out).astype(np.int32)
    y, _, _ = run_dense(Device(cfg), x, w, b, rq)
    assert np.array_equal(y, dense_reference(x, w, b, rq))


@pytest.mark.parametrize("cfg_name", ["tiny", "default"])
def test_per_channel_scales_match_reference(cfg_name):
    """One SCALE operand per output channel, then the clamp; multipliers spanning 2^7 with a shared
    shift, some with low zero bits to strip. The biases and the SCALE operands load once for the
    layer into the accumulator past the slots (two ACC loads), not per tile."""
    cfg = PRESETS[cfg_name]
    spec = Conv2dSpec(1, 2 * cfg.block_in, 8, 6, 3 * cfg.block_out - 3, 3, 3, (1, 1, 1, 1), name="pc")
    x, w, b = rand_conv(np.random.default_rng(8), spec, True)
    rng = np.random.default_rng(9)
    muls = (rng.integers(1 << 23, 1 << 24, spec.o) << rng.integers(0, 8, spec.o)).astype(np.int64)
    rq = Requant(0, 0, 100)
    y, _, stream = run_conv2d(Device(cfg, dram_bytes=32 << 20), x, w, b, spec, rq, channel_muls=(muls, 38))
    ref = conv2d_reference(x, w, b, spec, rq, channel_muls=(muls, 38))
    assert np.array_equal(y, ref) and 0 < np.count_nonzero(ref) and np.count_nonzero(ref == 100) < ref.size
    assert sum(isinstance(i, Load) and i.mem_type == MemType.ACC for i in stream.last_insns) == 2
    with pytest.raises(TilingError, match="no 24-bit SCALE form"):
        run_conv2d(Device(cfg), x, w, b, spec, rq, channel_muls=(muls | 1 | (1 << 30), 38))


def test_tiling_error_names_buffer_and_shortfall():
    cfg = PRESETS["tiny"]
    spec = Conv2dSpec(1, 4, 8, 8, 4, 15, 15, (7, 7, 7, 7), (1, 1), name="big")
    with pytest.raises(TilingError, match=r"big: cannot be tiled .* inp buffer needs 450 entries for the smallest "
                                          r"tile, has 256 \(short by 194\)"):
        plan_conv2d(spec, cfg)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5), c=st.integers(1, 40), h=st.integers(1, 5), w=st.integers(1, 5),
       b=st.sampled_from([1, 2, 4]), k=st.sampled_from([4, 8, 16]))
def test_layout_pack_unpack_roundtrip(n, c, h, w, b, k):
    x = np.arange(n * c * h * w, dtype=np.int32).reshape(n, c, h, w)
    p = pack_activation(x, b, k)
    assert p.shape == (-(-n // b), -(-c // k), h, w, b, k)
    assert np.array_equal(unpack_activation(p, n, c), x)
    assert p[0, 0, 0, 0, 0, 0] == x[0, 0, 0, 0]
    wt = x.reshape(n, c, h, w)
    pw = pack_weight(wt, k, b)
    assert np.array_equal(unpack_weight(pw, n, c), wt)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=st.sampled_from([PRESETS["tiny"], PRESETS["default"]]), c=st.integers(1, 40), hw=st.integers(2, 10),
       o=st.integers(1, 40), k=st.sampled_from([1, 3]), stride=st.integers(1, 2), ka=st.integers(0, 4),
       d=st.integers(-3, 6), vt=st.sampled_from([1, 2]), seed=st.integers(0, 9))
def test_conv2d_fused_residual_add(cfg, c, hw, o, k, stride, ka, d, vt, seed):
    """conv -> requant -> (y << ka) + (r << kb) -> requant in one epilogue equals the two-step
    reference; the last requantization is a FLUSH (which also seeds the slot's next tile): on the
    identity GEMM that adds the residual (Gemm.flush) unless a left shift follows the add. A 1x1
    stride-1 conv requantizes into the accumulator on its last GEMM (EPILOGUE to_acc): no REQUANT pass."""
    kb = max(0, ka + d)
    spec = Conv2dSpec(1, c, hw, hw, o, k, k, (k // 2,) * 4, (stride, stride))
    x, w, b = _rand(np.random.default_rng(seed), spec)
    r = np.random.default_rng(seed + 1).integers(-127, 128, (1, o, spec.oh, spec.ow), dtype=np.int8)
    rq1, rq2 = Requant(10, -127, 127), Requant(1 + max(ka, kb), 0, 127, True)
    y, _, stream = run_conv2d(Device(cfg), x, w, b, spec, rq1, vt, residual=(r, ka, kb, rq2))
    ref = add_reference(conv2d_reference(x, w, b, spec, rq1), r, ka, kb, rq2)
    assert np.array_equal(y, ref)
    insns = stream.last_insns
    alu_flushes = sum(getattr(i, "alu_op", None) == AluOp.FLUSH for i in insns)
    to_acc = [i for i in insns if isinstance(i, Epilogue) and i.to_acc]
    seeding_flushes = sum(isinstance(i, Gemm) and i.flush for i in insns) - len(to_acc)
    assert (alu_flushes == 0, seeding_flushes > 0) == ((True, True) if min(ka, kb) == 0 else (False, False))
    if k == 1 and stride == 1:
        assert to_acc and not [i for i in insns if getattr(i, "alu_op", None) == AluOp.REQUANT]


def test_conv2d_tiles_wholly_in_the_padding():
    """Pads wider than the kernel reaches (1x1 kernel, pads 3): whole output rows and columns read
    only padding, and their tiles load zeros (found by the random-shape test)."""
    spec = Conv2dSpec(1, 1, 9, 12, 25, 1, 1, (3, 3, 2, 3))
    for cfg in (PRESETS["tiny"], PRESETS["default"]):
        _check(cfg, spec, Requant(4, -127, 127))


def test_flush_params_takes_only_what_one_flush_can_do():
    """flush_params gives FLUSH's immediate for a shift-round-clamp requantization (clamps [0, hi],
    [-hi, hi], [-hi-1, hi]), and None (MOV and
    REQUANT instead) for a multiplier, a zero point, a left shift, a shift past 31 or other bounds."""
    assert flush_params(Requant(8, 0, 127, True)) == flush_immediate(8, 127, lo_zero=True, round_half=True)
    assert flush_params(Requant(0, -128, 127, True)) == flush_immediate(0, 127)    # no rounding at shift 0
    assert flush_params(Requant(7, -127, 127)) == flush_immediate(7, 127, symmetric=True)   # the int8 flow's
    assert flush_params(Requant(8, -100, 100)) == flush_immediate(8, 100, symmetric=True)
    for r in (Requant(8, mul=3), Requant(8, zero_point=5), Requant(-2), Requant(32), Requant(8, -100, 90),
              Requant(8, 0, 200)):
        assert flush_params(r) is None, r


@pytest.mark.parametrize("vt", [1, 2])
@pytest.mark.parametrize("k", [1, 3])
def test_conv2d_residual_comes_in_pieces_beside_the_chunks(vt, k):
    """With several input chunks a fused residual is loaded in row pieces after each chunk but the
    last (into its own region past the chunk slots), not all beside the last chunk: no chunk's
    loads carry more than their share, every residual entry comes in once, and the result is
    bit-exact (the last chunk's token covers the pieces; the region is free once its slot's
    previous tile added its residual)."""
    cfg = PRESETS["tiny"]
    spec = Conv2dSpec(1, 4 * cfg.block_in, 6, 5, 3 * cfg.block_out, k, k, (k // 2,) * 4, name="res")
    t = ConvTiling(3, 2, 5, 1, vt)   # 3 row tiles, 4 chunks each
    x, w, b = _rand(np.random.default_rng(11), spec)
    r = np.random.default_rng(12).integers(-127, 128, (1, spec.o, spec.oh, spec.ow), dtype=np.int8)
    rq1, rq2 = Requant(9, -127, 127), Requant(1, -127, 127, True)
    y, _, stream = run_conv2d(Device(cfg), x, w, b, spec, rq1, vt, t, residual=(r, 0, 1, rq2))
    assert np.array_equal(y, add_reference(conv2d_reference(x, w, b, spec, rq1), r, 0, 1, rq2))
    region = vt * t.ic_t * (t.h_t - 1 + k) * (t.w_t - 1 + k)   # the residual regions start past the chunk slots
    pieces, entries = [0], 0
    for i in stream.last_insns:
        if isinstance(i, Load) and i.mem_type == MemType.INP and i.sram_base >= region:
            pieces[-1] += i.y_size * i.x_size
            entries += i.y_size * i.x_size
        if isinstance(i, Load) and i.push_next:   # a chunk's loads end: the next ones are the next chunk's
            pieces.append(0)
    assert entries == spec.o // cfg.block_out * spec.oh * spec.ow
    tile_rows = 3 * t.h_t   # blocks x rows of a tile, spread over its 3 chunks after the first
    assert max(pieces) <= _ceil(tile_rows, 3) * t.w_t


def test_plan_costs_short_transfers_with_their_bursts_in_flight():
    """The estimate lets a transfer's short bursts wait their latency read_outstanding at a time (the
    AXI master keeps them in flight), so a strided 1x1 layer (ResNet-18's last downsample) is not
    planned as one weight-heavy chunk a group loaded before any compute: its pick is faster on the
    timing model than that tiling (which serial per-row latencies used to rank first)."""
    cfg = PRESETS["default"]
    spec = Conv2dSpec(1, 256, 14, 14, 512, 1, 1, strides=(2, 2), name="down")
    pick, heavy = plan_conv2d(spec, cfg), ConvTiling(11, 1, 7, 16, 2)
    assert pick.ic_t < 16
    rq = Requant(9, -127, 127)
    assert measure_conv2d(spec, cfg, pick, requant=rq) < 0.9 * measure_conv2d(spec, cfg, heavy, requant=rq)


@pytest.mark.parametrize("vt", [1, 2])
@pytest.mark.parametrize("h_t", [1, 2])
@pytest.mark.parametrize("residual", [False, True])
def test_conv2d_first_chunk_goes_by_kernel_row(vt, h_t, residual):
    """A 3x3 conv with one input chunk keeps its weights kernel row by kernel row (one LOAD a row per
    group) and runs the layer's first chunk as one GEMM per kernel row on its own token, so compute
    starts on the first row's weights; one-row tiles (GEMMs that flush) and fused residuals too.
    Bit-exact. (Each kernel row's GEMM here has at least BY_ROWS_MIN_UOPS micro-ops.)"""
    cfg = PRESETS["tiny"]
    spec = Conv2dSpec(1, cfg.block_in, 4, 11, 4 * cfg.block_out, 3, 3, (1, 1, 1, 1), name="rows3")
    t = ConvTiling(2, h_t, 11, 1, vt)
    x, w, b = _rand(np.random.default_rng(21), spec)
    rq = Requant(9, -127, 127)
    if residual:
        r = np.random.default_rng(22).integers(-127, 128, (1, spec.o, spec.oh, spec.ow), dtype=np.int8)
        rq2 = Requant(1, -127, 127, True)
        y, _, stream = run_conv2d(Device(cfg), x, w, b, spec, rq, vt, t, residual=(r, 0, 1, rq2))
        ref = add_reference(conv2d_reference(x, w, b, spec, rq), r, 0, 1, rq2)
    else:
        y, _, stream = run_conv2d(Device(cfg), x, w, b, spec, rq, vt, t)
        ref = conv2d_reference(x, w, b, spec, rq)
    assert np.array_equal(y, ref)
    insns = stream.last_insns
    wloads = [i for i in insns if isinstance(i, Load) and i.mem_type == MemType.WGT and i.x_size == spec.kw]
    assert len(wloads) == 2 * spec.kh   # two output-channel groups, a LOAD per kernel row each
    gemms = [i for i in insns if isinstance(i, Gemm) and not getattr(i, "reset", False)]
    tiles = 2 * _ceil(spec.oh, h_t)
    assert len(gemms) == tiles - 1 + spec.kh + (tiles if residual else 0)
