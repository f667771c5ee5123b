"""The data contracts in accel/isa: blocked layouts, ALU operand packing, token routing."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accel.isa import PRESETS, AccelConfig, LayoutError, OperandError, Stage, deps, layout, operands

TINY, ODD = PRESETS["tiny"], AccelConfig(batch=2, block_in=8, block_out=16)


# ---- blocked layouts -------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5), c=st.integers(1, 20), rest=st.lists(st.integers(1, 3), max_size=2),
       b0=st.integers(1, 4), b1=st.integers(1, 8), seed=st.integers(0, 2**31))
def test_pack_blocked_places_each_element_and_unpack_inverts_it(n, c, rest, b0, b1, seed):
    x = np.random.default_rng(seed).integers(-128, 128, (n, c, *rest)).astype(np.int8)
    p = layout.pack_blocked(x, (b0, b1))
    assert p.shape == (-(-n // b0), -(-c // b1), *rest, b0, b1) and p.flags.c_contiguous and p.dtype == x.dtype
    for idx in np.ndindex(x.shape):           # element (i, j, ...) at block (i // b0, j // b1), lane (i % b0, j % b1)
        i, j, *r = idx
        assert p[(i // b0, j // b1, *r, i % b0, j % b1)] == x[idx]
    assert int(np.abs(p.astype(int)).sum()) == int(np.abs(x.astype(int)).sum())   # padding is zeros
    assert np.array_equal(layout.unpack_blocked(p, x.shape), x)
    assert layout.unpack_blocked(p).shape == (p.shape[0] * b0, p.shape[1] * b1, *rest)


def test_pack_blocked_to_more_blocks_and_the_named_layouts():
    x = np.arange(2 * 5 * 3 * 3).reshape(2, 5, 3, 3)
    p = layout.pack_blocked(x, (1, 4), out_blocks=(3, 4))
    assert p.shape == (3, 4, 3, 3, 1, 4) and not p[2].any() and not p[:, 2:].any()
    assert layout.unpack_blocked(p, (99, 99)).shape == (3, 16, 3, 3)   # a crop beyond the extent keeps it all
    assert np.array_equal(layout.pack_activation(x, ODD), layout.pack_blocked(x, (2, 8)))
    assert np.array_equal(layout.pack_activation(x, ODD, "out"), layout.pack_blocked(x, (2, 16)))
    assert np.array_equal(layout.pack_weight(x, ODD), layout.pack_blocked(x, (16, 8)))
    b = layout.pack_bias(np.arange(1, 20), ODD)
    assert b.shape == (2, 2, 16) and b.dtype == np.int32
    assert (b[:, 0] == b[:, 1]).all() and b[1, 0, 2] == 19 and not b[1, 0, 3:].any()


@pytest.mark.parametrize("call, match", [
    (lambda: layout.pack_blocked(np.zeros(3), (1, 4)), r"pack: needs at least 2 dims"),
    (lambda: layout.pack_blocked(np.zeros((2, 2)), (0, 4)), r"pack: block \(0, 4\) must be two positive"),
    (lambda: layout.pack_blocked(np.zeros((2, 9)), (1, 4), out_blocks=(2, 2)), r"out_blocks \(2, 2\) cannot hold"),
    (lambda: layout.unpack_blocked(np.zeros((1, 1, 1)), None), r"unpack: needs at least 4 dims"),
    (lambda: layout.unpack_blocked(np.zeros((1, 1, 2, 4)), (-1, 4)), r"shape \(-1, 4\) has a negative extent"),
    (lambda: layout.unpack_blocked(np.zeros((1, 1, 2, 4)), (2.0, 4)), r"must start with two integers"),
    (lambda: layout.pack_blocked(np.zeros((2, 2)), (1.5, 4)), r"pack: block \(1.5, 4\) must be two positive"),
    (lambda: layout.pack_activation(np.zeros((1, 2, 3)), TINY), r"pack_activation: expects NCHW"),
    (lambda: layout.pack_activation(np.zeros((1, 2, 3, 3)), TINY, "mid"), r"channels='mid'"),
    (lambda: layout.pack_weight(np.zeros((1, 2, 3)), TINY), r"pack_weight: expects OIHW"),
    (lambda: layout.pack_bias(np.zeros((2, 2)), TINY), r"pack_bias: expects a 1-D"),
    (lambda: layout.pack_bias(np.zeros(9), TINY, out_blocks=2), r"out_blocks 2 cannot hold 9 channels"),
])
def test_layout_errors_name_the_argument(call, match):
    with pytest.raises(LayoutError, match=match):
        call()


# ---- ALU operands ----------------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(shift=st.integers(0, 31), lo=st.integers(-128, 127), hi=st.integers(-128, 127), rnd=st.booleans())
def test_requant_and_clamp_operands_round_trip(shift, lo, hi, rnd):
    b = operands.requant_operand(shift, lo, hi, rnd, 32)
    assert 0 <= b < 1 << 22
    assert operands.decode_requant(b, 32) == (shift, (1 << (shift - 1)) if rnd and shift else 0, lo, hi)
    assert operands.decode_requant(b, 16)[:2] == (0, 0)
    imm = operands.clamp_immediate(lo, hi)
    assert operands.IMM_MIN <= imm <= operands.IMM_MAX and operands.decode_clamp(imm) == (lo, hi)


@settings(max_examples=80, deadline=None)
@given(shift=st.integers(0, 31), hi=st.integers(-128, 127), lo_zero=st.booleans(), rnd=st.booleans(),
       sym=st.booleans())
def test_flush_immediate_round_trips(shift, hi, lo_zero, rnd, sym):
    imm = operands.flush_immediate(shift, hi, lo_zero, rnd, sym)
    s, r, lo, h = operands.decode_flush(imm)
    assert (s, h) == (shift, hi) and r == ((1 << (shift - 1)) if rnd and shift else 0)
    assert lo == (0 if lo_zero else -hi if sym else -hi - 1)


@settings(max_examples=80, deadline=None)
@given(mul=st.integers(1, (1 << 24) - 1), shift=st.integers(0, 63), zeros=st.integers(0, 6))
def test_scale_operand_and_its_normal_form(mul, shift, zeros):
    b = operands.scale_operand(mul, shift, 32)
    assert operands.decode_scale(b, 32) == (mul, shift)
    if shift + zeros < 64:    # a multiplier with low zero bits: the same product, 24 bits
        m, k = operands.scale_form(mul << zeros, shift + zeros)
        assert m < 1 << 24 and m * 2 ** (shift + zeros - k) == mul << zeros
    ops = operands.channel_scale_operands([mul, mul << 24], 30, 32)
    m, k = operands.decode_scale(int(ops[1]), 32)
    assert ops.dtype == np.int32 and m < 1 << 24 and m << (30 - k) == mul << 24


def test_lane_immediates_build_the_value():
    for v in (0, 1, -1, 0x7FFF, 0x8000, 0x3F00_1234, -(1 << 31), (1 << 31) - 0x8001):
        steps = operands.lane_immediates(v)
        assert [s[0] for s in steps] == ["MOV", "SHR", "ADD"]
        x = steps[0][1] << 16
        assert ((x + steps[2][1] + (1 << 31)) % (1 << 32)) - (1 << 31) == v
        assert all(operands.IMM_MIN <= imm <= operands.IMM_MAX for _, imm in steps)


@pytest.mark.parametrize("call, match", [
    (lambda: operands.alu_immediate(40000, "ADD"), r"ADD immediate=40000 outside its range \[-32768, 32767\]"),
    (lambda: operands.alu_immediate(1.5), r"ALU immediate=1.5 is not an integer"),
    (lambda: operands.shr_immediate(33, 32), r"SHR shift=33 outside its range \[-32, 31\]"),
    (lambda: operands.clamp_immediate(-129, 0), r"CLAMP lo=-129 outside its range \[-128, 127\]"),
    (lambda: operands.requant_operand(32, 0, 1, False, 32), r"REQUANT shift=32 outside its range \[0, 31\]"),
    (lambda: operands.requant_operand(3, 0, 1, False, 16), r"REQUANT operand needs acc_width >= 22"),
    (lambda: operands.scale_operand(1 << 24, 3, 32), r"SCALE multiplier=16777216 outside its range"),
    (lambda: operands.scale_operand(5, 64, 32), r"SCALE shift=64 outside its range \[0, 63\]"),
    (lambda: operands.scale_operand(5, 3, 16), r"SCALE operand needs acc_width >= 30"),
    (lambda: operands.channel_scale_operands([3, (1 << 24) + 1], 8, 32), r"channel 1: multiplier 16777217 with shift 8 has no 24-bit SCALE form"),
    (lambda: operands.channel_scale_operands([3, -2], 8, 32), r"channel 1: multiplier -2"),
    (lambda: operands.flush_immediate(4, 200), r"FLUSH hi=200 outside its range"),
])
def test_operand_errors_name_the_operand_and_its_range(call, match):
    with pytest.raises(OperandError, match=match):
        call()


# ---- dependency-token routing ----------------------------------------------------------------
def test_token_routing_table():
    L, C, S = Stage.LOAD, Stage.COMPUTE, Stage.STORE
    assert deps.POPS == {L: {"pop_next": "c2l"}, C: {"pop_prev": "l2c", "pop_next": "s2c"}, S: {"pop_prev": "c2s"}}
    assert deps.PUSHES == {L: {"push_next": "l2c"}, C: {"push_prev": "c2l", "push_next": "c2s"},
                           S: {"push_prev": "s2c"}}
    assert deps.dead_flags(L) == ("pop_prev", "push_prev") and deps.dead_flags(S) == ("pop_next", "push_next")
    assert deps.dead_flags(C) == ()
    for (frm, to), q in deps.QUEUES.items():   # a push and its pop meet in the same queue
        assert deps.token_queue(frm, deps.push_flag(frm, to)) == q == deps.token_queue(to, deps.pop_flag(frm, to))
    with pytest.raises(ValueError, match="tokens only flow between neighbouring stages"):
        deps.push_flag(L, S)
    with pytest.raises(ValueError, match="dependency flag 'pop_up' is not one of"):
        deps.token_queue(C, "pop_up")
