"""Average pools with border divisors (compiler.accel.avgpool): the int8 reference against the float
pool, the ALU program against the reference (bit-exact), and crafted ONNX models built for the
accelerator against the graph's int8 reference and onnxruntime."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compiler
from accel.isa import PRESETS, AccelConfig
from compiler.accel.avgpool import (
    avg_multipliers,
    avg_pool_cycles,
    check_avg_pool,
    divisor_counts,
    int8_avg_pools,
    qavg_attrs,
    qavg_pool2d_ref,
    run_avg_pool,
    uniform_pool,
)
from compiler.accel.layout import pack_activation, unpack_activation
from compiler.frontend.zoo import ModelBuilder, ort_quantize, sample_inputs
from compiler.graph import run as reference_run
from compiler.graph.errors import GraphError
from compiler.graph.ir import Graph, Node
from compiler.graph.ops import get_op, normalize_attrs
from host_runtime import Device
from host_runtime.executor import Executor
from sim.verilator.build import tools_available


def float_pool(x, a):
    """The float avg_pool2d of the dequantized input, at the output scale (ratio) plus its zero point."""
    fa = normalize_attrs("avg_pool2d", {k: a[k] for k in ("kernel", "strides", "pads", "ceil_mode",
                                                          "count_include_pad")})
    return get_op("avg_pool2d").reference(fa, x.astype(np.float64) - a["in_zp"]) * a["ratio"] + a["out_zp"]


@st.composite
def pools(draw):
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = (draw(st.integers(0, kh - 1)), draw(st.integers(0, kw - 1)), draw(st.integers(0, kh - 1)),
            draw(st.integers(0, kw - 1)))
    h, w = draw(st.integers(kh, 11)), draw(st.integers(kw, 11))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 20)), h, w)
    zp = draw(st.sampled_from([(0, 0), (0, 0), (7, -5), (-128, 3)]))
    return shape, qavg_attrs((kh, kw), (sh, sw), pads, draw(st.integers(0, 1)), draw(st.integers(0, 1)),
                             draw(st.sampled_from([1.0, 0.75, 2.0, 1 / 3, 0.05])), *zp)


@settings(max_examples=40, deadline=None)
@given(p=pools(), seed=st.integers(0, 99))
def test_reference_within_one_step_of_the_float_pool(p, seed):
    shape, a = p
    x = np.random.default_rng(seed).integers(-128, 128, shape, dtype=np.int8)
    want = np.clip(float_pool(x, a), -128 if a["out_zp"] else -127, 127)
    got = qavg_pool2d_ref(a, x)
    assert got.dtype == np.int8 and got.shape == want.shape
    # the rounding's half step, plus each multiplier's own rounding (half a unit of 2^-k) times |sum|
    taps = a["kernel"][0] * a["kernel"][1]
    cy, cx = divisor_counts(shape[2:], a)
    k = avg_multipliers(a["ratio"], np.outer(cy, cx).reshape(-1), taps, a["in_zp"])[0]
    assert np.abs(got - want).max() <= 0.5 + 1e-9 + (128 + abs(a["in_zp"])) * taps * 0.5 * 2.0 ** -k


@settings(max_examples=14, deadline=None)
@given(p=pools(), relu=st.booleans(), vt=st.sampled_from([1, 2]),
       cfg=st.sampled_from([PRESETS["tiny"], PRESETS["default"]]), seed=st.integers(0, 99))
def test_alu_program_bit_exact(p, relu, vt, cfg, seed):
    shape, a = p
    x = np.random.default_rng(seed).integers(-128, 128, shape, dtype=np.int8)
    lo = 0 if relu else None
    y, _ = run_avg_pool(Device(cfg), x, a, lo, 127, vt)
    want = qavg_pool2d_ref(a, x)
    assert np.array_equal(y, np.maximum(want, 0) if relu else want)


@pytest.mark.parametrize("cfg,hw", [("tiny", (30, 28)), ("default", (61, 60))])
def test_row_bands_on_fsim_and_tsim(cfg, hw):
    """A plane too large for one tile runs in bands of output rows; each band's divisor
    rectangles start at its own first row."""
    x = np.random.default_rng(1).integers(-127, 128, (1, 8, *hw), dtype=np.int8)
    a = qavg_attrs((3, 3), (2, 2), (1, 1, 1, 1), 1, 0, 0.5)
    want = qavg_pool2d_ref(a, x)
    for driver in ("fsim", "tsim"):
        y, res = run_avg_pool(Device(PRESETS[cfg], driver), x, a)
        assert res is not None
        assert np.array_equal(y, want), driver


def test_divisors_interior_edges_corners():
    a = qavg_attrs((3, 3), (1, 1), (1, 1, 1, 1), count_include_pad=0)
    cy, cx = divisor_counts((5, 4), a)
    assert cy.tolist() == [2, 3, 3, 3, 2] and cx.tolist() == [2, 3, 3, 2]
    a = qavg_attrs((3, 3), (2, 2), (1, 1, 1, 1), ceil_mode=1, count_include_pad=1)
    cy, _ = divisor_counts((6, 6), a)   # ceil_mode's last window overhangs the padding: not counted
    assert cy.tolist() == [3, 3, 3, 2]
    k, muls = avg_multipliers(1.0, [4, 6, 9], 9)
    assert k == 15 and muls == {4: 8192, 6: 5461, 9: 3641}


def test_packed_reference_matches_nchw():
    x = np.random.default_rng(3).integers(-128, 128, (2, 20, 7, 6), dtype=np.int8)
    a = qavg_attrs((3, 2), (2, 1), (1, 0, 1, 1), 1, 0, 0.8, 3, -2)
    got = unpack_activation(qavg_pool2d_ref(a, pack_activation(x, 1, 16)), 2, 20)
    assert np.array_equal(got, qavg_pool2d_ref(a, x))


def test_errors_name_the_fault():
    with pytest.raises(GraphError, match="ratio"):
        Node("qavg_pool2d", [Node.input("x", (1, 4, 5, 5), "int8")], {"kernel": (2, 2), "ratio": -1.0})
    with pytest.raises(GraphError, match="int8 input"):
        Node("qavg_pool2d", [Node.input("x", (1, 4, 5, 5))], {"kernel": (2, 2), "ratio": 1.0})
    with pytest.raises(ValueError, match="16-bit multiplier"):
        avg_multipliers(1e6, [1], 9)
    n = Node("qavg_pool2d", [Node.input("x", (1, 16, 5, 5), "int8")], {"kernel": (2, 2), "ratio": 1.0})
    assert check_avg_pool(n, PRESETS["default"]) is None
    cfg = AccelConfig(block_in=8, block_out=16, acc_buff_bytes=64 * 1024, out_buff_bytes=16 * 1024)
    assert "block_in == block_out" in check_avg_pool(n, cfg)
    wide = Node("qavg_pool2d", [Node.input("x", (1, 16, 3, 5000), "int8")], {"kernel": (3, 3), "ratio": 1.0})
    assert "does not fit" in check_avg_pool(wide, PRESETS["tiny"])


def border_model(kernel, strides, pads, ceil_mode, cip, hw=(9, 11), seed=3):
    """conv-relu, the border average pool, a 1x1 conv: the pool sits between accelerator layers."""
    b = ModelBuilder("avgpool_border", seed=seed)
    x = b.input("x", (1, 4, *hw))
    y = b.op("Relu", [b.conv(x, 4, 8, 3)])
    y = b.op("AveragePool", [y], name="pool", kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
             ceil_mode=ceil_mode, count_include_pad=cip)
    return b.build([b.conv(y, 8, 8, 1)])


CASES = [((3, 3), (1, 1), (1, 1, 1, 1), 0, 0),     # Inception's pool branch
         ((3, 3), (2, 2), (1, 1, 1, 1), 1, 0),     # ceil_mode and pads
         ((2, 2), (2, 2), (0, 0, 0, 0), 1, 0),     # ceil_mode overhang only
         ((3, 2), (2, 1), (1, 0, 0, 1), 1, 1)]     # count_include_pad with overhang, kernel > stride


@pytest.mark.parametrize("cfg", ["tiny", "default"])
@pytest.mark.parametrize("case", CASES)
def test_model_pool_on_the_accelerator(case, cfg):
    m = border_model(*case)
    feeds = sample_inputs(m, 5, seed=2)
    mod = compiler.build_model(m, target="accel", config=cfg, calibration=feeds[:4])
    pool = [s for s in mod.steps if s.name == "pool"]
    assert [s.kind for s in pool] == ["accel"] and pool[0].op == "qavg_pool2d" and not mod.meta["fallbacks"]
    assert not any(n.op in ("avg_pool2d", "dequantize") and n.name.startswith("pool") for n in mod.graph.nodes)
    with Executor(mod, driver="fsim") as ex:
        out = ex.run(feeds[4], keep=True)
    _, env = reference_run(mod.graph, feeds[4], keep=True)
    ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
    assert "pool" in ex.values
    for k in ex.values:
        if k in ints:
            np.testing.assert_array_equal(ex.values[k], ints[k], err_msg=k)
    want = ort.InferenceSession(m.SerializeToString()).run(None, feeds[4])[0]
    got = next(iter(out.values())) if isinstance(out, dict) else out[0]
    cos = float(np.dot(want.ravel(), got.ravel()) / np.linalg.norm(want) / np.linalg.norm(got))
    assert cos > 0.995 and np.abs(want - got).max() < 0.1 * np.abs(want).max()


def test_rewrite_only_for_int8_chains():
    """A float pool whose input is not dequantized int8 stays; the CPU target keeps its float pool."""
    x = Node.input("x", (1, 4, 6, 6))
    p = Node("avg_pool2d", [x], {"kernel": (3, 3), "pads": (1, 1, 1, 1)}, name="p")
    q = Node("quantize", [p], {"shift": 4}, name="q")
    g = Graph([x, p, q], [x], [q], ["q"], "g")
    assert [n.op for n in int8_avg_pools(g).ops] == ["avg_pool2d", "quantize"]
    xi = Node.input("x", (1, 4, 6, 6), "int8")
    d = Node("dequantize", [xi], {"shift": 3}, name="d")
    p = Node("avg_pool2d", [d], {"kernel": (3, 3), "pads": (1, 1, 1, 1)}, name="p")
    q = Node("quantize", [p], {"shift": 4}, name="q")
    g2 = int8_avg_pools(Graph([xi, d, p, q], [xi], [q], ["q"], "g"))
    out = g2.outputs[0]
    assert out.op == "qavg_pool2d" and out.attrs["ratio"] == 2.0 and out.name == "p"
    # a config whose ALU cannot pool keeps the float pool (its CPU kernel, not the int8 op's NumPy one)
    odd = AccelConfig(block_in=8, block_out=16, acc_buff_bytes=64 * 1024, out_buff_bytes=16 * 1024)
    g3 = int8_avg_pools(Graph([xi, d, p, q], [xi], [q], ["q"], "g"), odd)
    assert g3.outputs[0].op == "quantize"
    assert int8_avg_pools(Graph([xi, d, p, q], [xi], [q], ["q"], "g"), PRESETS["tiny"]).outputs[0].op == "qavg_pool2d"
    m = border_model(*CASES[0])
    mod = compiler.build_model(m, target="cpu")
    assert not any(s.op == "qavg_pool2d" for s in mod.steps)


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_onnxruntime_quantized_model_with_zero_points(fmt):
    """onnxruntime's quantized export (asymmetric activations: zero point -128, scales that are not
    powers of two): the pool runs on the accelerator with both zero points, bit-exact with the
    reference and within onnxruntime's own int8 result."""
    m = border_model(*CASES[1])
    feeds = sample_inputs(m, 5, seed=2)
    q = ort_quantize(m, feeds[:4], quant_format=fmt)
    mod = compiler.build_model(q, target="accel", config="tiny")
    pool = [n for n in mod.graph.nodes if n.op == "qavg_pool2d"]
    assert len(pool) == 1 and pool[0].attrs["in_zp"] != 0 and not mod.meta["fallbacks"]
    assert [s.kind for s in mod.steps if s.op == "qavg_pool2d"] == ["accel"]
    run_and_compare(mod, q, feeds[4], cos_min=0.999)


@pytest.mark.rtl
@pytest.mark.skipif(tools_available() is not None, reason=f"rtl driver: {tools_available()}")
@pytest.mark.parametrize("attrs,lo", [(qavg_attrs((3, 3), (2, 2), (1, 1, 1, 1), 1, 0, 0.7), None),     # FLUSH
                                      (qavg_attrs((3, 2), (1, 2), (1, 0, 1, 1), 0, 1, 1.3, 4, -3), None),  # zero points
                                      (qavg_attrs((3, 3), (1, 1), (1, 1, 1, 1), 0, 0, 0.9), 0)])          # fused ReLU
def test_rtl_matches_reference_and_tsim_cycles(attrs, lo):
    """The Verilated RTL leaves the reference's bytes, in tsim's cycles within 1% (the contract on
    whole layers; they were equal when written) on the tiny config."""
    x = np.random.default_rng(3).integers(-127, 128, (1, 8, 7, 6), dtype=np.int8)
    y, res = run_avg_pool(Device(PRESETS["tiny"], "rtl"), x, attrs, lo)
    _, ts = run_avg_pool(Device(PRESETS["tiny"], "tsim"), x, attrs, lo)
    want = qavg_pool2d_ref(attrs, x)
    assert np.array_equal(y, np.maximum(want, 0) if lo == 0 else want)
    assert abs(res.cycles - ts.cycles) <= 0.01 * ts.cycles, (res.cycles, ts.cycles)


def test_pool_forced_to_the_cpu_saves_and_runs_in_a_fresh_process(tmp_path):
    """Forced off the accelerator, qavg_pool2d is a host step (its NumPy reference); a module that
    names it loads and runs where only compiler.module was imported."""
    m = border_model(*CASES[0])
    feeds = sample_inputs(m, 3, seed=2)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:2],
                               force_target={"AveragePool": "cpu"})
    assert [s.kind for s in mod.steps if s.op == "qavg_pool2d"] == ["numpy"]
    want, _ = mod.run(feeds[2])
    path = tmp_path / "pool.accm"
    mod.save(path)
    np.save(tmp_path / "x.npy", feeds[2]["x"])
    code = ("import sys, numpy as np; from compiler.module import CompiledModule; "
            f"m = CompiledModule.load({str(path)!r}, config='tiny'); "
            f"outs, _ = m.run({{'x': np.load({str(tmp_path / 'x.npy')!r})}}); "
            f"np.save({str(tmp_path / 'y.npy')!r}, next(iter(outs.values())))")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(compiler.__file__).parent.parent)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), next(iter(want.values())))


def test_pool_feeding_a_float_concat_runs_on_the_accelerator():
    """ShuffleNet's stride-2 unit: the pool's consumer is a concat the quantizer leaves in float;
    the pool still runs on the accelerator (at its calibrated scale) and a dequantize follows
    (fused into the concat's kernel)."""
    b = ModelBuilder("shuffle_pool", seed=1)
    x = b.input("x", (1, 8, 10, 10))
    y = b.op("Relu", [b.conv(x, 8, 16, 3)])
    p = b.op("AveragePool", [y], name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    z = b.op("Relu", [b.op("Concat", [p, b.conv(y, 16, 16, 3, stride=2, name="branch")], axis=1, name="cat")])
    m = b.build([b.conv(z, 32, 16, 1)])
    feeds = sample_inputs(m, 4, seed=2)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:3])
    steps = {s.name: s for s in mod.steps}
    assert steps["pool"].op == "qavg_pool2d" and steps["pool"].kind == "accel"
    unpacked = next(k for k, t in enumerate(mod.tensors) if t.name == "pool/unpack")
    readers = [s.op.split("+") for s in mod.steps if ("t", unpacked) in [tuple(a) for a in s.args]]
    assert readers and all(ops[0] == "dequantize" for ops in readers) and not mod.meta["fallbacks"]
    run_and_compare(mod, m, feeds[3])


@pytest.mark.parametrize("clamp", ["Relu", "Clip"])
def test_pool_then_relu_fuses_into_one_program(clamp):
    """AveragePool -> ReLU (or ReLU6 as Clip) -> conv: the clamp is int8 after the pool and rides in
    its ALU program (one step), bit-exact with the reference."""
    b = ModelBuilder("pool_relu", seed=4)
    x = b.input("x", (1, 4, 9, 9))
    y = b.op("AveragePool", [b.conv(x, 4, 8, 3)], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    if clamp == "Relu":
        y = b.op("Relu", [y], name="act")
    else:
        y = b.op("Clip", [y, b.init(np.float32(0.0)), b.init(np.float32(0.5))], name="act")
    m = b.build([b.conv(y, 8, 8, 1)])
    feeds = sample_inputs(m, 4, seed=2)
    mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:3])
    assert [(s.op, s.kind) for s in mod.steps if s.name == "pool"] == [(f"qavg_pool2d+{clamp.lower()}", "accel")]
    assert not any(s.name.startswith("act") for s in mod.steps) and not mod.meta["fallbacks"]
    run_and_compare(mod, m, feeds[3])


# ---- uniform pools (global, border-free): the quantizer's window-sum depthwise conv -> the ALU ------------
def qconv_pool(shape, kernel, strides, pads, zx=0, path="pow2", seed=0):
    """The qconv2d the quantizer makes of a uniform average pool (weights 127 / taps each, one bias
    holding the rounding half less zx's share; a zero-point pad before it where zx and pads)."""
    rng = np.random.default_rng(seed)
    c, taps = shape[1], kernel[0] * kernel[1]
    x = xin = Node.input("x", shape, "int8")
    if zx and any(pads):
        x = Node("pad", [xin], {"pads": (0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]), "mode": "constant",
                                "value": float(zx)}, name="p/pad_zero_point")
        pads = (0, 0, 0, 0)
    attrs = {"strides": strides, "pads": pads, "groups": c, "in_shift": 7 + int(rng.integers(0, 4)), "w_shift": 0,
             "out_shift": 0}
    extra, half = [], 0
    if path == "pow2":
        half = 1 << (attrs["in_shift"] - 1)
    elif path == "fixed":
        attrs.update(mul=int(rng.integers(2, 200)), in_shift=attrs["in_shift"] + 6)
    else:   # per channel: one multiplier times a power of two per channel (an input scale per channel)
        attrs["in_shift"] += 9
        muls = int(rng.integers(2, 200)) << rng.integers(0, 4 if path == "channels" else 1, c)
        extra = [Node.const(muls.astype(np.int64), name="p/muls")]
    w = Node.const(np.full((c, 1, *kernel), 127, np.int8), name="p/wq")
    b = Node.const(np.full(c, half - zx * 127 * taps, np.int32), name="p/bq")
    return Node("qconv2d", [x, w, b, *extra], attrs, name="p"), xin


def graph_of(out: Node, xin: Node) -> Graph:
    """The graph computing out from input xin (its nodes in topological order)."""
    order: list[Node] = []

    def visit(n: Node):
        if all(n is not m for m in order):
            for i in n.inputs:
                visit(i)
            order.append(n)
    visit(out)
    return Graph(order, [xin], [out], ["y"], "g")


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 4), s=st.integers(1, 3), pad=st.integers(0, 1), hw=st.integers(4, 9), zx=st.sampled_from([0, 0, -128, 9]),
       path=st.sampled_from(["pow2", "fixed", "channel", "channels", "channels"]), seed=st.integers(0, 99))
def test_uniform_pool_is_the_conv_within_one_step(k, s, pad, hw, zx, path, seed):
    """qavg_pool2d from a window-sum qconv2d (any requantize form, zero-point pad folded) computes the
    conv's result but for the rounding of one multiplier: at most one step apart."""
    zx = 0 if path == "channels" else zx   # gains only with in_zp 0 (the quantizer's per-channel scales)
    conv, xin = qconv_pool((1, 5, hw, hw + 1), (k, k), (s, s), (pad,) * 4, zx, path, seed)
    q = uniform_pool(conv)
    assert q is not None and q.inputs[0] is xin and q.attrs["in_zp"] == zx and tuple(q.attrs["pads"]) == (pad,) * 4
    x = np.random.default_rng(seed).integers(-128, 128, xin.shape, dtype=np.int8)
    _, env = reference_run(graph_of(conv, xin), {"x": x}, keep=True)
    want = env[id(conv)]
    got = qavg_pool2d_ref(q.attrs, x)
    assert got.shape == want.shape and np.abs(got.astype(int) - want).max() <= 1


def test_uniform_pool_declines_what_is_no_window_sum():
    conv, xin = qconv_pool((1, 4, 6, 6), (3, 3), (1, 1), (0,) * 4)
    w = conv.inputs[1].value.copy()
    w[1, 0, 1, 1] = 100   # a real depthwise conv
    other = Node("qconv2d", [xin, Node.const(w, name="w2"), conv.inputs[2]], conv.attrs, name="dw")
    assert uniform_pool(other) is None
    for m in ((2, 3, 4, 5), (1, 2, 4, 256)):   # per-channel scales: no integer gains, or gains past int8
        muls = Node.const(np.array(m, np.int64), name="m")
        per = Node("qconv2d", [xin, conv.inputs[1], conv.inputs[2], muls], {**conv.attrs, "in_shift": 12}, name="pc")
        assert uniform_pool(per) is None
    muls = Node.const(np.array((3, 6, 12, 3), np.int64), name="m")   # no rounding half in the bias with these
    zero = Node.const(np.zeros(4, np.int32), name="b0")
    per = Node("qconv2d", [xin, conv.inputs[1], zero, muls], {**conv.attrs, "in_shift": 12}, name="pc")
    assert uniform_pool(per).attrs["gains"] == (1, 2, 4, 1)
    zp_share = Node.const(np.full(4, -7 * 127 * 9, np.int32), name="bz")   # in_zp 7: not with gains
    assert uniform_pool(Node("qconv2d", [xin, conv.inputs[1], zp_share, muls], per.attrs, name="pz")) is None
    odd_bias = Node.const(np.full(4, 5, np.int32), name="b5")   # not half less a whole zero point share
    assert uniform_pool(Node("qconv2d", [xin, conv.inputs[1], odd_bias], conv.attrs, name="ob")) is None


@pytest.mark.parametrize("shape,kernel,stride,pads,alu", [
    ((1, 1280, 7, 7), 7, 1, 0, True),      # MobileNetV2's global pool
    ((1, 64, 8, 8), 8, 1, 0, True),        # a small global pool
    ((1, 96, 14, 14), 3, 1, 1, False),     # 3x3 stride 1: the diagonal GEMM reuses its weights enough
    ((1, 64, 56, 56), 2, 2, 0, False),     # 2x2 stride 2 on a large plane: likewise
    ((1, 1000, 13, 13), 13, 1, 0, False)])  # SqueezeNet's: the conv's tiles do not fit, it stays on the CPU
def test_cost_rule_picks_the_cheaper_program(shape, kernel, stride, pads, alu):
    """Measured on tsim (default config): ALU 16.4k vs diagonal GEMM 143k, 1.7k vs 9.3k, 19.9k vs
    16.0k, 49.9k vs 28.7k cycles; int8_avg_pools follows the estimates to the same choices."""
    conv, xin = qconv_pool(shape, (kernel, kernel), (stride, stride), (pads,) * 4)
    g = int8_avg_pools(graph_of(conv, xin), PRESETS["default"])
    assert g.outputs[0].op == ("qavg_pool2d" if alu else "qconv2d")
    assert int8_avg_pools(graph_of(conv, xin)).outputs[0].op == "qconv2d"  # no config: as the quantizer left it


@pytest.mark.parametrize("cfg,shape,attrs", [
    ("tiny", (1, 32, 8, 8), qavg_attrs((8, 8), count_include_pad=1)),
    ("tiny", (1, 16, 10, 10), qavg_attrs((3, 3), (1, 1), (1, 1, 1, 1), 0, 1, 0.5)),
    ("tiny", (1, 8, 20, 20), qavg_attrs((2, 2), (2, 2), ratio=0.5, in_zp=-128, out_zp=3)),
    ("default", (1, 256, 7, 7), qavg_attrs((7, 7), count_include_pad=1))])
def test_cycle_estimate_near_tsim(cfg, shape, attrs):
    """avg_pool_cycles (the cost rule's ALU side) within 25% of tsim, bit-exact program."""
    x = np.random.default_rng(0).integers(-128, 128, shape, dtype=np.int8)
    y, res = run_avg_pool(Device(PRESETS[cfg], "tsim"), x, attrs)
    assert np.array_equal(y, qavg_pool2d_ref(attrs, x))
    n = Node("qavg_pool2d", [Node.input("x", shape, "int8")], attrs)
    est = avg_pool_cycles(n, PRESETS[cfg])
    assert abs(est - res.cycles) <= 0.25 * res.cycles, (est, res.cycles)


def head_model(pool: str, hw=(7, 7), seed=5):
    """conv-batchnorm-ReLU6 (as Clip: one scale for the tensor), the pool, Flatten, Gemm: MobileNetV2's head."""
    b = ModelBuilder("pool_head", seed=seed)
    x = b.input("x", (1, 8, *hw))
    y = b.op("Clip", [b.bn(b.conv(x, 8, 24, 3), 24), b.init(np.float32(0.0)), b.init(np.float32(6.0))])
    if pool == "global":
        y = b.op("GlobalAveragePool", [y], name="pool")
    else:
        k, s = {"window": (hw, (1, 1)), "strided": ((4, 4), (4, 4))}[pool]
        y = b.op("AveragePool", [y], name="pool", kernel_shape=list(k), strides=list(s))
    y = b.op("Flatten", [y], axis=1, name="flatten")
    c = 24 * (1 if pool != "strided" else (hw[0] // 4) * (hw[1] // 4))
    return b.build([b.op("Gemm", [y, b.weight((10, c)), b.init(np.zeros(10, np.float32))], transB=1, name="fc")])


def run_and_compare(mod, m_float, feeds, cos_min=0.995):
    with Executor(mod, driver="fsim") as ex:
        out = ex.run(feeds, keep=True)
    _, env = reference_run(mod.graph, feeds, keep=True)
    for n in mod.graph.nodes:
        if n.name in ex.values and id(n) in env and env[id(n)].dtype == np.int8:
            np.testing.assert_array_equal(ex.values[n.name], env[id(n)], err_msg=n.name)
    want = ort.InferenceSession(m_float.SerializeToString()).run(None, feeds)[0]
    got = next(iter(out.values()))
    assert np.dot(want.ravel(), got.ravel()) / np.linalg.norm(want) / np.linalg.norm(got) > cos_min


@pytest.mark.parametrize("cfg", ["tiny", "default"])
@pytest.mark.parametrize("pool", ["global", "window", "strided"])
def test_uniform_pool_model_on_the_alu(pool, cfg):
    """GlobalAveragePool, and AveragePool without borders, run as qavg_pool2d on the accelerator
    where it is the cheaper program, bit-exact with the graph's int8 reference and close to
    onnxruntime's float model. The 4x4/4 pool of 8x8x24 on tiny stays the diagonal GEMM (tsim:
    1384 cycles, the ALU's 1651; on default 1607 against 857)."""
    m = head_model(pool, (7, 7) if pool != "strided" else (8, 8))
    feeds = sample_inputs(m, 5, seed=2)
    mod = compiler.build_model(m, target="accel", config=cfg, calibration=feeds[:4])
    op = "qconv2d" if (pool, cfg) == ("strided", "tiny") else "qavg_pool2d"
    assert [(s.op, s.kind) for s in mod.steps if s.name == "pool"] == [(op, "accel")]
    assert not mod.meta["fallbacks"]
    run_and_compare(mod, m, feeds[4])


def test_uniform_pool_with_zero_points_from_onnxruntime():
    """onnxruntime's QDQ export (zero point -128, scales not powers of two): the global pool is a
    qavg_pool2d with both zero points, bit-exact, within onnxruntime's own int8 result."""
    m = head_model("global")
    feeds = sample_inputs(m, 5, seed=2)
    q = ort_quantize(m, feeds[:4], quant_format="qdq")
    mod = compiler.build_model(q, target="accel", config="tiny")
    pool = [n for n in mod.graph.nodes if n.op == "qavg_pool2d"]
    assert len(pool) == 1 and pool[0].attrs["in_zp"] != 0
    assert [s.kind for s in mod.steps if s.op.startswith("qavg_pool2d")] == ["accel"]
    run_and_compare(mod, q, feeds[4], 0.999)


@settings(max_examples=12, deadline=None)
@given(p=pools(), cfg=st.sampled_from([PRESETS["tiny"], PRESETS["default"]]), vt=st.sampled_from([1, 2]),
       driver=st.sampled_from(["fsim", "tsim"]), seed=st.integers(0, 99))
def test_alu_program_with_channel_gains_bit_exact(p, cfg, vt, driver, seed):
    """Per-channel gains (an input with a scale per channel) ride in the copy GEMM's diagonal
    weight tiles, one per channel block: bit-exact with the reference, which is the float pool of
    the gained input within the multiplier's rounding."""
    shape, a = p
    rng = np.random.default_rng(seed)
    a = {**a, "in_zp": 0, "gains": tuple(int(g) for g in 1 << rng.integers(0, 5, shape[1]))}
    x = rng.integers(-128, 128, shape, dtype=np.int8)
    want = qavg_pool2d_ref(a, x)
    y, _ = run_avg_pool(Device(cfg, driver), x, a, None, 127, vt)
    assert np.array_equal(y, want)
    g = np.asarray(a["gains"]).reshape(1, -1, 1, 1)
    ref = np.clip((float_pool(x, a) - a["out_zp"]) * g + a["out_zp"], -128 if a["out_zp"] else -127, 127)
    assert np.abs(want - ref).max() <= 1 + (128 + abs(a["in_zp"])) * 4 * 16 * 16 * 2.0 ** -avg_multipliers(
        a["ratio"], [1], 16 * 16, a["in_zp"])[0]
    px = pack_activation(x, 1, 4)
    assert np.array_equal(unpack_activation(qavg_pool2d_ref(a, px), *shape[:2]), want)


def test_gains_errors_name_the_fault():
    x = Node.input("x", (1, 4, 5, 5), "int8")
    with pytest.raises(GraphError, match="gains"):
        Node("qavg_pool2d", [x], {"kernel": (2, 2), "ratio": 1.0, "gains": (1, 2, 3)})
    with pytest.raises(GraphError, match="gains"):
        Node("qavg_pool2d", [x], {"kernel": (2, 2), "ratio": 1.0, "gains": (1, 2, 3, 200)})
    with pytest.raises(GraphError, match="in_zp 0"):
        Node("qavg_pool2d", [x], {"kernel": (2, 2), "ratio": 1.0, "gains": (1, 2, 3, 4), "in_zp": 5})
    wide = Node("qavg_pool2d", [Node.input("x", (1, 4 * 600, 2, 2), "int8")],
                {"kernel": (2, 2), "ratio": 1.0, "gains": (2,) * 2400})
    assert "weight buffer" in check_avg_pool(wide, PRESETS["tiny"])


@pytest.mark.parametrize("cfg", ["tiny", "default"])
def test_pool_of_a_channel_scaled_input_on_the_alu(cfg):
    """The tiny CNN's head: conv-ReLU writes a scale per channel for the global pool (a depthwise
    reader absorbs it); the pool is qavg_pool2d with per-channel gains, bit-exact, near onnxruntime."""
    b = ModelBuilder("gain_head", seed=7)
    x = b.input("x", (1, 8, 6, 6))
    y = b.op("Relu", [b.conv(x, 8, 24, 3)])
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y], name="pool")], axis=1, name="flatten")
    m = b.build([b.op("Gemm", [y, b.weight((10, 24)), b.init(np.zeros(10, np.float32))], transB=1, name="fc")])
    feeds = sample_inputs(m, 5, seed=2)
    mod = compiler.build_model(m, target="accel", config=cfg, calibration=feeds[:4])
    assert [(s.op, s.kind) for s in mod.steps if s.name == "pool"] == [("qavg_pool2d", "accel")]
    assert len(set(mod.graph.find("pool").attrs["gains"])) > 1 and not mod.meta["fallbacks"]
    run_and_compare(mod, m, feeds[4])
