"""The transformer ops of opsets 23-25 that torch.onnx's dynamo exporter emits (Attention,
RMSNormalization, RotaryEmbedding, Swish), checked against onnx's ReferenceEvaluator (and
onnxruntime where it runs the case) on the graph interpreter and compiled for the cpu target with
no numpy step; then onnx's own node test cases for these ops. Before, each was an unsupported op."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.backend.test.case import node as onnx_node_cases
from onnx.reference import ReferenceEvaluator

import compiler
from compiler.frontend import ConversionError, from_onnx
from compiler.graph import run

RNG = np.random.default_rng(29)
F, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
_ELEM = {np.dtype(np.float32): F, np.dtype(np.float64): TensorProto.DOUBLE, np.dtype(np.int64): I64,
         np.dtype(np.bool_): BOOL}


def _model(op, inputs, outputs, attrs=None, inits=(), opset=23):
    """One `op` node. inputs: [(name, array)] in the node's order, ("", None) skipping one;
    outputs: [(name, shape)], ("", None) skipping one, of the first input's type; inits: the input
    names that are initializers."""
    node = helper.make_node(op, [n for n, _ in inputs], [n for n, _ in outputs], **(attrs or {}))
    feeds = [helper.make_tensor_value_info(n, _ELEM[np.asarray(v).dtype], list(np.shape(v)))
             for n, v in inputs if n and n not in inits]
    out_type = _ELEM[np.asarray(inputs[0][1]).dtype]
    outs = [helper.make_tensor_value_info(n, out_type, list(s)) for n, s in outputs if n]
    g = helper.make_graph([node], "g", feeds, outs,
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in inputs if n in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    return m


def _unary_model(op, inputs, attrs=None, inits=(), opset=23):
    """A node of one output Y shaped as its first input; inputs as name -> array."""
    items = list(inputs.items())
    return _model(op, items, [("y", np.shape(items[0][1]))], attrs, inits, opset)


def _check(m, feeds, with_ort=True, fallbacks=0):
    """The interpreter and the cpu module equal the ReferenceEvaluator (and onnxruntime); the cpu
    module has `fallbacks` numpy steps (0 but for a gather at run-time indices)."""
    ref = ReferenceEvaluator(m).run(None, feeds)
    refs = [ref]
    if with_ort:
        refs.append(ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds))
    got = run(from_onnx(m), feeds)
    mod = compiler.build_model(m, target="cpu")
    assert len(mod.meta["fallbacks"]) == fallbacks and mod.count("numpy") == fallbacks, mod.meta["fallbacks"]
    compiled = [np.asarray(v) for v in mod.run(feeds)[0].values()]
    for expected in refs:
        assert len(got) == len(expected) == len(compiled)
        for a, cpu, r in zip(got, compiled, expected):
            r = np.asarray(r)
            assert a.shape == r.shape and a.dtype == r.dtype, (a.dtype, a.shape, r.dtype, r.shape)
            tol = 1e-5 * max(1.0, float(np.abs(r[np.isfinite(r)]).max(initial=0)))   # -inf in mode 2 scores
            np.testing.assert_allclose(a, r, rtol=1e-5, atol=tol)
            np.testing.assert_allclose(cpu.reshape(r.shape), r, rtol=1e-5, atol=tol)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _refused(m, match):
    with pytest.raises(ConversionError, match=match) as e:
        from_onnx(m)
    assert "\n" not in str(e.value).strip()


# ---- Swish, RMSNormalization ----------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [None, 1.0, 0.5, -1.5])
def test_swish(alpha):
    x = _x(2, 3, 7) * 3
    _check(_unary_model("Swish", {"x": x}, {} if alpha is None else {"alpha": alpha}, opset=24), {"x": x})


@pytest.mark.parametrize("shape, axis, scale_shape, eps", [
    ((2, 5, 16), None, (16,), None),               # LLaMA's RMSNorm: the last axis, default epsilon
    ((2, 5, 16), -2, (5, 16), 1e-3),
    ((2, 5, 16), 1, (1, 16), None),
    ((3, 4, 2, 6), 0, (4, 2, 6), 1e-6),
    ((3, 8), -1, (1,), 0.1),
])
def test_rms_normalization(shape, axis, scale_shape, eps):
    x, s = _x(*shape) * 2, _x(*scale_shape)
    attrs = {k: v for k, v in (("axis", axis), ("epsilon", eps)) if v is not None}
    _check(_unary_model("RMSNormalization", {"x": x, "s": s}, attrs, inits=("s",)), {"x": x})


def test_rms_normalization_runtime_scale():
    x, s = _x(2, 3, 8), _x(8)
    _check(_unary_model("RMSNormalization", {"x": x, "s": s}), {"x": x, "s": s})


def test_rms_normalization_refusals():
    x, s = _x(2, 8), _x(8)
    _refused(_unary_model("RMSNormalization", {"x": x, "s": s}, {"stash_type": 11}), "stash_type=11")
    _refused(_unary_model("RMSNormalization", {"x": x, "s": _x(2, 2, 8)}), "does not broadcast")
    x64 = x.astype(np.float64)
    _refused(_unary_model("RMSNormalization", {"x": x64, "s": s.astype(np.float64)}), "only float32")


# ---- RotaryEmbedding ------------------------------------------------------------------------------------
def _caches(rows_or_b, half, s=None):
    """cos/sin of angles: (rows, half) for position_ids, (B, S, half) without."""
    shape = (rows_or_b, half) if s is None else (rows_or_b, s, half)
    theta = RNG.uniform(0, 2 * np.pi, shape)
    return np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)


@pytest.mark.parametrize("rank", [4, 3])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot", [0, 4])
@pytest.mark.parametrize("positions", ["none", "constant", "runtime"])
def test_rotary_embedding(rank, interleaved, rot, positions):
    b, h, s, d = 2, 3, 5, 8
    x = _x(b, h, s, d) if rank == 4 else _x(b, s, h * d)
    half = (rot or d) // 2
    attrs = {"interleaved": interleaved}
    if rot:
        attrs["rotary_embedding_dim"] = rot
    if rank == 3:
        attrs["num_heads"] = h
    if positions == "none":
        cos, sin = _caches(b, half, s)
        inputs = {"x": x, "cos": cos, "sin": sin}
    else:
        cos, sin = _caches(16, half)
        inputs = {"x": x, "cos": cos, "sin": sin, "pos": RNG.integers(0, 16, (b, s)).astype(np.int64)}
    inits = {"cos": cos, "sin": sin}
    if positions == "constant":
        inits["pos"] = inputs["pos"]
    m = _unary_model("RotaryEmbedding", inputs, attrs, inits=tuple(inits))
    feeds = {k: v for k, v in inputs.items() if k not in inits}
    # run-time position_ids gather the caches with the `gather` op, which the cpu target runs on numpy
    _check(m, feeds, fallbacks=2 if positions == "runtime" else 0)


def test_rotary_embedding_runtime_caches_at_constant_positions():
    """Caches fed at run time, positions constant: a `take` of constant rows, compiled where every
    batch has the same consecutive positions (the cpu take kernel wants 1-D affine indices), else
    run on numpy."""
    x = _x(2, 2, 4, 6)
    cos, sin = _caches(9, 3)
    for pos, fallbacks in (([[2, 3, 4, 5]] * 2, 0), ([[2, 3, 4, 5], [0, 0, 1, 8]], 2)):
        pos = np.array(pos, np.int64)
        m = _unary_model("RotaryEmbedding", {"x": x, "cos": cos, "sin": sin, "pos": pos}, inits=("pos",))
        _check(m, {"x": x, "cos": cos, "sin": sin}, fallbacks=fallbacks)


def test_rotary_embedding_refusals():
    x3, x4 = _x(1, 4, 12), _x(1, 2, 4, 6)
    cos, sin = _caches(8, 3)
    pos = np.array([[0, 1, 2, 9]], np.int64)
    _refused(_unary_model("RotaryEmbedding", {"x": x3, "cos": cos, "sin": sin, "pos": pos % 8}, {"num_heads": 5},
                          inits=("cos", "sin")), "needs num_heads dividing it")
    _refused(_unary_model("RotaryEmbedding", {"x": x4, "cos": cos, "sin": sin, "pos": pos},
                          inits=("cos", "sin", "pos")), r"position_ids span \[0, 9\]")
    _refused(_unary_model("RotaryEmbedding", {"x": x4, "cos": cos, "sin": sin, "pos": pos % 8},
                          {"rotary_embedding_dim": 3}), "must be even")
    _refused(_unary_model("RotaryEmbedding", {"x": x4, "cos": cos, "sin": sin}),
             "without position_ids it must be")


# ---- Attention ------------------------------------------------------------------------------------------
B, HQ, SQ, SKV, D = 2, 4, 3, 5, 8
OUTPUTS = ("Y", "present_key", "present_value", "qk_matmul_output")


def _attention(attrs=None, hkv=HQ, dv=D, rank=4, past=0, mask=None, nonpad=None, consts=(), outputs=("Y",),
               opset=23, sq=SQ, skv=SKV):
    """An Attention model and its feeds: B x HQ query heads over hkv key/value heads, 3-D or 4-D,
    past: the cached length; mask, nonpad: arrays or None; consts: input names made initializers."""
    attrs = dict(attrs or {})
    if rank == 4:
        q, k, v = _x(B, HQ, sq, D), _x(B, hkv, skv, D), _x(B, hkv, skv, dv)
        y_shape = (B, HQ, sq, dv)
    else:
        q, k, v = _x(B, sq, HQ * D), _x(B, skv, hkv * D), _x(B, skv, hkv * dv)
        y_shape = (B, sq, HQ * dv)
        attrs.update(q_num_heads=HQ, kv_num_heads=hkv)
    t = past + skv
    ins = [("Q", q), ("K", k), ("V", v), ("mask", mask) if mask is not None else ("", None)]
    if past:
        ins += [("past_key", _x(B, hkv, past, D)), ("past_value", _x(B, hkv, past, dv))]
    elif nonpad is not None:
        ins += [("", None), ("", None)]
    if nonpad is not None:
        ins.append(("nonpad", np.asarray(nonpad, np.int64)))
    while not ins[-1][0]:
        ins.pop()
    shapes = dict(zip(OUTPUTS, (y_shape, (B, hkv, t, D), (B, hkv, t, dv), (B, HQ, sq, t))))
    outs = [(n, shapes[n]) if n in outputs else ("", None) for n in OUTPUTS]
    while not outs[-1][0]:
        outs.pop()
    m = _model("Attention", ins, outs, attrs, consts, opset)
    return m, {n: a for n, a in ins if n and n not in consts}


def _bool_mask(shape, dead_row=False):
    """A random keep-mask; dead_row: query row 1 attends nothing (a zero output row)."""
    m = RNG.random(shape) < 0.7
    m[..., 0] = True
    if dead_row:
        m[..., 1, :] = False
    return m


T_PAST = 4 + SKV


@pytest.mark.parametrize("kw", [
    {},                                                                    # multi-head, default scale
    {"hkv": 2, "attrs": {"scale": 0.3}},                                   # grouped-query
    {"hkv": 1, "attrs": {"is_causal": 1}, "dv": 6},                        # multi-query, causal
    {"rank": 3, "hkv": 2, "dv": 6, "attrs": {"is_causal": 1}},
    {"rank": 3, "hkv": 4, "sq": 1, "skv": 1, "past": 4, "attrs": {"is_causal": 1},   # one decode step
     "outputs": ("Y", "present_key", "present_value")},
    {"past": 4, "hkv": 2, "attrs": {"is_causal": 1}, "outputs": ("Y", "present_key", "present_value")},
    {"past": 4, "rank": 3, "mask": _bool_mask((B, 1, SQ, T_PAST)), "outputs": ("Y", "present_key", "present_value")},
    {"mask": _x(SQ, SKV), "attrs": {"softcap": 2.5}},                      # float mask fed at run time
    {"mask": _x(B, 1, SQ, SKV), "consts": ("mask",), "attrs": {"is_causal": 1}},
    {"mask": _bool_mask((SQ, SKV), dead_row=True), "consts": ("mask",)},   # a constant fully masked row
    {"mask": _bool_mask((B, HQ, SQ, SKV), dead_row=True), "hkv": 2},      # ... fed at run time
    {"mask": _bool_mask((SKV,)), "ort": False},                            # one row for every query
    {"hkv": 2, "mask": _x(HQ, SQ, SKV), "attrs": {"softcap": 1.5, "qk_matmul_output_mode": 1},
     "outputs": ("Y", "qk_matmul_output")},
    {"mask": _bool_mask((SQ, SKV)), "attrs": {"qk_matmul_output_mode": 2, "is_causal": 1},   # onnxruntime writes
     "outputs": ("Y", "qk_matmul_output"), "ort": False},                                  # -3.4e38 for -inf
    {"past": 4, "mask": _bool_mask((B, 1, SQ, T_PAST), dead_row=True), "attrs": {"qk_matmul_output_mode": 3},
     "outputs": ("Y", "present_key", "present_value", "qk_matmul_output")},
    {"mask": _bool_mask((SQ, SKV)), "outputs": ("Y", "qk_matmul_output")},  # mode 0: the raw scores
    {"attrs": {"softmax_precision": 1}, "hkv": 2},
])
def test_attention(kw):
    kw = dict(kw)
    with_ort = kw.pop("ort", True)
    _check(*_attention(**kw), with_ort=with_ort)


@pytest.mark.parametrize("kw", [
    {"mask": _x(B, 1, SQ, 3)},                                             # a short mask, padded with -inf
    {"mask": _bool_mask((SQ, 4)), "consts": ("mask",), "attrs": {"is_causal": 1}},
    {"mask": np.array([[1, 0, 2, -3, 0]] * SQ, np.int64), "consts": ("mask",)},   # an integer (additive) mask
])
def test_attention_masks_onnxruntime_does_not_take(kw):
    """onnxruntime 1.32 refuses a mask shorter than the keys (opset 24 pads it) and integer masks."""
    _check(*_attention(**kw), with_ort=False)


@pytest.mark.parametrize("kw", [
    {"nonpad": [5, 3], "attrs": {"is_causal": 1}, "hkv": 2},              # an external cache, fed
    {"nonpad": [2, 5], "consts": ("nonpad",), "attrs": {"is_causal": 1}},  # ... constant
    {"nonpad": [4, 1], "sq": 1},                                           # padding only, one query
    {"nonpad": [5, 4], "mask": _bool_mask((B, 1, SQ, SKV)), "attrs": {"is_causal": 1}},
    {"nonpad": [1, 5], "attrs": {"is_causal": 1}},                         # offset < 0: rows attend nothing
])
def test_attention_nonpad_kv_seqlen(kw):
    m, feeds = _attention(opset=24, **kw)
    _check(m, feeds, with_ort=False)


@pytest.mark.parametrize("kw", [
    {"attrs": {"is_causal": 1, "left_window_size": 1}},
    {"attrs": {"left_window_size": 2, "right_window_size": 1}, "mask": _x(SQ, SKV)},
    {"attrs": {"is_causal": 1, "left_window_size": 2}, "past": 4, "outputs": ("Y", "present_key", "present_value")},
    {"attrs": {"is_causal": 1, "left_window_size": 1}, "nonpad": [5, 4]},
    {"attrs": {"right_window_size": 0, "left_window_size": 0}, "nonpad": [3, 5], "consts": ("nonpad",)},
])
def test_attention_sliding_window(kw):
    m, feeds = _attention(opset=25, **kw)
    _check(m, feeds, with_ort=False)


def test_attention_mode_0_with_softcap_is_the_raw_scores():
    """The spec, the op's function body and onnxruntime give mode 0 the scores before the softcap;
    onnx 1.23's reference returns them softcapped. The spec is followed."""
    m, feeds = _attention(attrs={"softcap": 1.0}, outputs=("Y", "qk_matmul_output"))
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = run(from_onnx(m), feeds)
    for a, r in zip(got, ref):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(r).max())))
    assert np.abs(got[1]).max() > 1.0    # beyond the cap: not softcapped


def test_attention_refusals():
    q3 = _x(1, 3, 12)
    _refused(_model("Attention", [("Q", q3), ("K", q3), ("V", q3)], [("Y", (1, 3, 10))],
                    {"q_num_heads": 5, "kv_num_heads": 5}), "hidden size 12 is not a multiple of its 5 heads")
    q, k = _x(1, 3, 2, 4), _x(1, 2, 2, 4)
    _refused(_model("Attention", [("Q", q), ("K", k), ("V", k)], [("Y", q.shape)]), "not a multiple")
    _refused(_attention(attrs={"softmax_precision": 10})[0], "softmax_precision=10")
    _refused(_attention(mask=_x(SQ, SKV + 2))[0], "at most the total sequence length")
    _refused(_attention(mask=_x(B + 1, 1, SQ, SKV))[0], "does not broadcast")
    q64 = _x(1, 2, 2, 4).astype(np.float64)
    _refused(_model("Attention", [("Q", q64), ("K", q64), ("V", q64)], [("Y", q64.shape)]), "only float32")
    m = _model("Attention", [("Q", q), ("K", q), ("V", q)], [("Y", q.shape)], {"q_num_heads": 2, "kv_num_heads": 3})
    _refused(m, "q_num_heads=2 disagrees with the 3 heads")


# ---- the four together ----------------------------------------------------------------------------------
def test_a_llama_style_decoder_block():
    """RMSNorm, q/k/v projections, RoPE on 3-D q and k, grouped-query causal attention over a kv
    cache, the output projection and a SiLU-gated MLP, with residuals: a decoder block as the
    dynamo exporter writes one at opset 24. Compiled whole with no numpy step."""
    s, e, hq, hkv, d, past, ff = 6, 32, 4, 2, 8, 3, 48
    w = {name: (RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32) for name, shape in (
        ("wq", (e, hq * d)), ("wk", (e, hkv * d)), ("wv", (e, hkv * d)), ("wo", (hq * d, e)),
        ("wg", (e, ff)), ("wu", (e, ff)), ("wd", (ff, e)))}
    w["g1"], w["g2"] = 1 + 0.1 * _x(e), 1 + 0.1 * _x(e)
    cos, sin = _caches(16, d // 2)
    w.update(cos=cos, sin=sin, pos=np.arange(past, past + s, dtype=np.int64).reshape(1, s))
    n = helper.make_node
    nodes = [
        n("RMSNormalization", ["x", "g1"], ["h"], epsilon=1e-6),
        n("MatMul", ["h", "wq"], ["q"]), n("MatMul", ["h", "wk"], ["k"]), n("MatMul", ["h", "wv"], ["v"]),
        n("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["qr"], num_heads=hq),
        n("RotaryEmbedding", ["k", "cos", "sin", "pos"], ["kr"], num_heads=hkv),
        n("Attention", ["qr", "kr", "v", "", "past_key", "past_value"], ["a", "present_key", "present_value"],
          q_num_heads=hq, kv_num_heads=hkv, is_causal=1),
        n("MatMul", ["a", "wo"], ["o"]), n("Add", ["x", "o"], ["x2"]),
        n("RMSNormalization", ["x2", "g2"], ["h2"], epsilon=1e-6),
        n("MatMul", ["h2", "wg"], ["gate"]), n("MatMul", ["h2", "wu"], ["up"]), n("Swish", ["gate"], ["act"]),
        n("Mul", ["act", "up"], ["m"]), n("MatMul", ["m", "wd"], ["down"]), n("Add", ["x2", "down"], ["y"]),
    ]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "block", [vi("x", F, [1, s, e]), vi("past_key", F, [1, hkv, past, d]),
                                           vi("past_value", F, [1, hkv, past, d])],
                          [vi("y", F, [1, s, e]), vi("present_key", F, [1, hkv, past + s, d]),
                           vi("present_value", F, [1, hkv, past + s, d])],
                          [numpy_helper.from_array(v, k) for k, v in w.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 24)])
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    _check(m, {"x": _x(1, s, e), "past_key": _x(1, hkv, past, d), "past_value": _x(1, hkv, past, d)})


# ---- onnx's own node test cases -------------------------------------------------------------------------
PREFIXES = ("test_attention", "test_rms_normalization", "test_rotary_embedding", "test_swish")
CASES = {tc.name: tc for tc in onnx_node_cases.collect_testcases(None)
         if tc.name.startswith(PREFIXES) and not tc.name.endswith("_expanded") and tc.data_sets}
#: half-precision cases: computed in float32 (onnx_import._half_to_float), within half's rounding
HALF = {name for name, tc in CASES.items()
        if any(i.type.tensor_type.elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16) for i in tc.model.graph.input)}
#: a few also compiled for the cpu target (every case would cost a minute of compiling)
COMPILED = ("test_attention_4d_gqa_with_past_and_present", "test_attention_3d_with_past_and_present_qk_matmul_softmax",
            "test_attention_4d_causal_nonpad_attn_mask_composition", "test_attention_local_window_gqa_rank4_mask",
            "test_attention_4d_diff_heads_mask4d_padded_kv", "test_rms_normalization_4d_axis1",
            "test_rotary_embedding_with_interleaved_rotary_dim", "test_swish")


def test_the_node_cases_are_there():
    assert len(CASES) >= 100 and len(HALF) >= 10, (len(CASES), len(HALF))


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_node_case(name):
    tc = CASES[name]
    inputs, outputs = tc.data_sets[0]
    inits = {t.name for t in tc.model.graph.initializer}
    feeds = dict(zip([i.name for i in tc.model.graph.input if i.name not in inits], inputs))
    results = [run(from_onnx(tc.model), feeds)]
    if name in COMPILED:
        mod = compiler.build_model(tc.model, target="cpu")
        assert mod.count("numpy") == (2 if name.startswith("test_rotary") else 0), mod.meta["fallbacks"]
        results.append([np.asarray(v).reshape(np.shape(r)) for v, r in zip(mod.run(feeds)[0].values(), outputs)])
    for got in results:
        for a, r in zip(got, outputs):
            if name in HALF:
                assert a.shape == r.shape and a.dtype == np.float32
                np.testing.assert_allclose(a, np.asarray(r, np.float32), rtol=2e-2, atol=2e-2, equal_nan=True)
                continue
            assert a.shape == r.shape and a.dtype == r.dtype
            np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-5, equal_nan=True)
