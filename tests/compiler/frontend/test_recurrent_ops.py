"""ONNX LSTM, GRU and RNN, unrolled at import (compiler.frontend.recurrent): checked against
onnxruntime interpreted (every direction, layout, optional input and gate option) and compiled for
the cpu target (a representative subset: compiling is the cost). onnxruntime runs only layout 0,
so a layout-1 layer is checked against its layout-0 twin with transposed inputs and outputs."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import compiler
from compiler.frontend import from_onnx, recurrent
from compiler.frontend.errors import ConversionError
from compiler.graph import run

RNG = np.random.default_rng(23)
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
OUTPUTS = {"LSTM": ("Y", "Y_h", "Y_c"), "GRU": ("Y", "Y_h"), "RNN": ("Y", "Y_h")}
DIRECTIONS = ("forward", "reverse", "bidirectional")


def _f32(shape, scale=0.5):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _layer(op, direction="forward", t=4, b=2, i=3, h=4, bias=True, init=None, peep=False):
    """Random weights (initializers) and time-major feeds of one layer. init: None (zeros), "input"
    (graph inputs) or "const" (initializers)."""
    nd, g = (2 if direction == "bidirectional" else 1), GATES[op]
    w = {"W": _f32((nd, g * h, i)), "R": _f32((nd, g * h, h))}
    if bias:
        w["B"] = _f32((nd, 2 * g * h))
    if peep:
        w["P"] = _f32((nd, 3 * h))
    states = {}
    if init:
        states["h0"] = _f32((nd, b, h), 1.0)
        if op == "LSTM":
            states["c0"] = _f32((nd, b, h), 1.0)
    return {"op": op, "direction": direction, "hidden": h, "w": w, "states": states, "init": init,
            "x": _f32((t, b, i), 1.0)}


def _model(spec, layout=0, outputs=None, attrs=None, extra_inputs=None):
    """The layer as an ONNX model (opset 14) and its feeds, in `layout`."""
    op = spec["op"]
    outputs = list(OUTPUTS[op] if outputs is None else outputs)
    swap = (lambda a: np.ascontiguousarray(a.transpose(1, 0, 2))) if layout else (lambda a: a)
    feeds = {"x": swap(spec["x"])}
    inits = [numpy_helper.from_array(v, k) for k, v in spec["w"].items()]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(feeds["x"].shape))]
    for k, v in spec["states"].items():
        if spec["init"] == "const":
            inits.append(numpy_helper.from_array(swap(v), k))
        else:
            feeds[k] = swap(v)
            graph_inputs.append(helper.make_tensor_value_info(k, TensorProto.FLOAT, list(feeds[k].shape)))
    ins = ["x", "W", "R", "B" if "B" in spec["w"] else "", "", "h0" if spec["states"] else "",
           "c0" if "c0" in spec["states"] else "", "P" if "P" in spec["w"] else ""]
    for k, (name, value) in (extra_inputs or {}).items():
        ins[k] = name
        if isinstance(value, np.ndarray):
            inits.append(numpy_helper.from_array(value, name))
        else:
            feeds[name] = value[1]
            graph_inputs.append(helper.make_tensor_value_info(name, value[0], list(value[1].shape)))
    while not ins[-1]:
        ins.pop()
    node = helper.make_node(op, ins, outputs, name="rnn", hidden_size=spec["hidden"], direction=spec["direction"],
                            layout=layout, **(attrs or {}))
    g = helper.make_graph([node], "g", graph_inputs,
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs if o], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m, feeds


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _reference(spec, layout, outputs=None, attrs=None):
    """onnxruntime's outputs of the layer, in `layout` (layout 1 from the layout-0 twin)."""
    outputs = list(OUTPUTS[spec["op"]] if outputs is None else outputs)
    refs = _ort(*_model(spec, 0, outputs, attrs))
    if layout:
        perms = {"Y": (2, 0, 1, 3), "Y_h": (1, 0, 2), "Y_c": (1, 0, 2)}
        refs = [r.transpose(perms[o]) for r, o in zip(refs, [o for o in outputs if o])]
    return refs


def _close(got, ref):
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def _check(spec, layout=0, outputs=None, attrs=None, compiled=False):
    m, feeds = _model(spec, layout, outputs, attrs)
    refs = _reference(spec, layout, outputs, attrs)
    got = run(from_onnx(m), feeds)
    assert len(got) == len(refs)
    for a, r in zip(got, refs):
        _close(a, r)
    if compiled:
        mod = compiler.build_model(m, target="cpu")
        assert mod.meta["fallbacks"] == []
        outs = mod.run(feeds)[0]
        for vi, r in zip(m.graph.output, refs):
            _close(outs[vi.name], r)


@pytest.mark.parametrize("peep", [False, True])
@pytest.mark.parametrize("init", [None, "input", "const"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_lstm_interpreted_matches_onnxruntime(direction, layout, bias, init, peep):
    _check(_layer("LSTM", direction, bias=bias, init=init, peep=peep), layout)


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("init", [None, "input", "const"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gru_interpreted_matches_onnxruntime(direction, layout, bias, init, lbr):
    _check(_layer("GRU", direction, bias=bias, init=init), layout, attrs={"linear_before_reset": lbr})


@pytest.mark.parametrize("init", [None, "input"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_rnn_interpreted_matches_onnxruntime(direction, layout, bias, init):
    _check(_layer("RNN", direction, bias=bias, init=init), layout)


@pytest.mark.parametrize("op, t, b, h, attrs", [
    ("LSTM", 1, 1, 1, {}),
    ("LSTM", 8, 3, 16, {"clip": 0.7}),
    ("LSTM", 5, 2, 6, {"input_forget": 1}),
    ("GRU", 7, 1, 9, {"clip": 0.4, "linear_before_reset": 1}),
    ("GRU", 2, 4, 1, {}),
    ("RNN", 8, 2, 12, {"clip": 0.9}),
    ("LSTM", 32, 2, 5, {}),
])
@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_sizes_and_gate_options_match_onnxruntime(op, t, b, h, attrs, direction):
    _check(_layer(op, direction, t=t, b=b, h=h, init="input", peep=op == "LSTM"), 0, attrs=attrs)


@pytest.mark.parametrize("op, acts, alpha, beta", [
    ("RNN", ["Relu"], [], []),
    ("RNN", ["Sigmoid"], [], []),
    ("RNN", ["LeakyRelu"], [0.2], []),
    ("RNN", ["LeakyRelu"], [], []),
    ("RNN", ["ThresholdedRelu"], [0.3], []),
    ("RNN", ["Affine"], [0.6], [0.1]),
    ("RNN", ["ScaledTanh"], [1.5], [0.7]),
    ("RNN", ["HardSigmoid"], [0.3], [0.4]),
    ("RNN", ["Elu"], [0.8], []),
    ("RNN", ["Softsign"], [], []),
    ("RNN", ["Softplus"], [], []),
    ("GRU", ["HardSigmoid", "Softsign"], [], []),
    ("GRU", ["Sigmoid", "Affine"], [0.5], [0.25]),
    ("LSTM", ["HardSigmoid", "Elu", "Softplus"], [0.25, 0.9], [0.45]),
    ("LSTM", ["Sigmoid", "LeakyRelu", "ScaledTanh"], [0.1, 1.2], [0.8]),
])
def test_activations_match_onnxruntime(op, acts, alpha, beta):
    attrs = {"activations": acts}
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    _check(_layer(op, "forward", t=5, init="input"), 0, attrs=attrs)


def test_bidirectional_activations_per_direction_match_onnxruntime():
    """Six LSTM activations: the forward direction's three, then the reverse's; alphas and betas
    are consumed in order by those that take them."""
    attrs = {"activations": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "LeakyRelu", "Affine"],
             "activation_alpha": [0.3, 0.05, 0.9], "activation_beta": [0.4, 0.1]}
    _check(_layer("LSTM", "bidirectional", t=4, peep=True, init="input"), 1, attrs=attrs)


@pytest.mark.parametrize("op, outputs", [
    ("LSTM", ["", "Y_h"]), ("LSTM", ["", "", "Y_c"]), ("LSTM", ["Y"]), ("LSTM", ["Y", "", "Y_c"]),
    ("GRU", ["", "Y_h"]), ("RNN", ["Y"]),
])
def test_only_the_named_outputs(op, outputs):
    _check(_layer(op, "bidirectional", t=3, init="input"), 1, outputs=outputs)


@pytest.mark.parametrize("op, direction, layout, init, peep, attrs", [
    ("LSTM", "forward", 0, None, False, {}),
    ("LSTM", "bidirectional", 1, "input", True, {}),
    ("LSTM", "reverse", 0, "const", False, {"clip": 0.5, "input_forget": 1}),
    ("GRU", "bidirectional", 0, "input", False, {"linear_before_reset": 0}),
    ("GRU", "reverse", 1, None, False, {"linear_before_reset": 1}),
    ("GRU", "forward", 0, "input", False, {"linear_before_reset": 1, "clip": 0.6}),
    ("RNN", "bidirectional", 1, "input", False, {}),
    ("RNN", "forward", 0, None, False, {"activations": ["ThresholdedRelu"], "activation_alpha": [0.2]}),
    ("LSTM", "forward", 0, "input", False, {"activations": ["HardSigmoid", "Softsign", "Elu"]}),
    ("GRU", "forward", 0, None, False, {"activations": ["Sigmoid", "Softplus"]}),
])
def test_compiled_matches_onnxruntime(op, direction, layout, init, peep, attrs):
    _check(_layer(op, direction, t=6, b=2, i=5, h=8, init=init, peep=peep), layout, attrs=attrs, compiled=True)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_opset_9_layers_import_after_the_upgrade(op):
    """Opset-9 layers (no layout attribute) import once onnx's version converter lifts them to 13."""
    spec = _layer(op, "bidirectional", init="input", peep=op == "LSTM")
    m, feeds = _model(spec)
    refs = _ort(m, feeds)
    node = m.graph.node[0]
    node.attribute.remove(next(a for a in node.attribute if a.name == "layout"))
    del m.opset_import[:]
    m.opset_import.append(helper.make_opsetid("", 9))
    for a, r in zip(run(from_onnx(m), feeds), refs):
        _close(a, r)


def test_constant_sequence_lens_equal_to_the_length_is_accepted():
    spec = _layer("GRU", "bidirectional", t=5, b=3)
    m, feeds = _model(spec, extra_inputs={4: ("lens", np.full(3, 5, np.int32))})
    for a, r in zip(run(from_onnx(m), feeds), _reference(spec, 0)):
        _close(a, r)


def test_variable_sequence_lens_are_refused():
    spec = _layer("LSTM", t=5, b=3)
    m, _ = _model(spec, extra_inputs={4: ("lens", np.array([5, 3, 5], np.int32))})
    with pytest.raises(ConversionError, match=r"LSTM 'rnn': sequence_lens \[5, 3, 5\] is not the sequence length 5 "
                                              r"for each of the 3 batch entries: variable sequence lengths"):
        from_onnx(m)
    m, _ = _model(spec, extra_inputs={4: ("lens", (TensorProto.INT32, np.full(3, 5, np.int32)))})
    with pytest.raises(ConversionError, match=r"LSTM 'rnn': sequence_lens \(input 4, 'lens'\) is computed at run "
                                              r"time: variable sequence lengths are not supported"):
        from_onnx(m)


def test_a_huge_sequence_is_refused_before_unrolling():
    spec = _layer("LSTM", "bidirectional", t=100_000, b=1, i=1, h=2)
    m, _ = _model(spec)
    with pytest.raises(ConversionError, match=r"^LSTM 'rnn': sequence length 100000 is above the limit of 1024 "
                                              r"steps \(recurrent layers are unrolled at import; MAX_UNROLLED_STEPS\)$"):
        from_onnx(m)


def test_too_many_unrolled_nodes_are_refused(monkeypatch):
    monkeypatch.setattr(recurrent, "MAX_UNROLLED_NODES", 500)
    m, _ = _model(_layer("LSTM", "bidirectional", t=64, b=1, peep=True))
    with pytest.raises(ConversionError, match=r"^LSTM 'rnn': unrolling 64 steps x 2 direction\(s\) takes about "
                                              r"\d+ graph nodes, above the limit of 500 \(MAX_UNROLLED_NODES\)$"):
        from_onnx(m)


@pytest.mark.parametrize("attrs, msg", [
    ({"activations": ["Sigmoid", "Tanh", "Swish"]}, r"activation 'Swish' is not supported \(supported: Sigmoid"),
    ({"activations": ["ThresholdedRelu", "Tanh", "Tanh"]},
     r"activation 'ThresholdedRelu' needs its alpha in activation_alpha: its default is not the same"),
    ({"activations": ["Sigmoid", "Tanh"]}, r"activations lists 2 functions; LSTM with 1 direction\(s\) takes 3"),
])
def test_unsupported_activations_are_one_error(attrs, msg):
    m, _ = _model(_layer("LSTM"), attrs=attrs)
    with pytest.raises(ConversionError, match="^LSTM 'rnn': " + msg):
        from_onnx(m)


def test_runtime_weights_are_refused():
    spec = _layer("RNN")
    m, _ = _model(spec)
    w = m.graph.initializer[0]
    m.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(w.dims)))
    with pytest.raises(ConversionError, match=r"RNN 'rnn': W \(input 1, 'W'\) must be constant"):
        from_onnx(m, runtime_inputs=["W"])


def _torch_style_stack():
    """What torch.onnx exports for nn.LSTM(5, 8, num_layers=2, bidirectional=True) then a Linear
    on the last hidden state, and an nn.GRU on the LSTM's output: zero initial states as
    initializers, each layer's Y (T, 2, B, H) transposed and reshaped into the next layer's
    (T, B, 2H), the last layer's backward Y_h sliced and squeezed into a Gemm."""
    t, b, i, h = 6, 2, 5, 8
    inits, nodes = [], []

    def init(name, value):
        inits.append(numpy_helper.from_array(value, name))
        return name

    x = "x"
    for layer, n_in in enumerate((i, 2 * h)):
        p = f"l{layer}_"
        ins = [x, init(p + "W", _f32((2, 4 * h, n_in))), init(p + "R", _f32((2, 4 * h, h))),
               init(p + "B", _f32((2, 8 * h))), "", init(p + "h0", np.zeros((2, b, h), np.float32)),
               init(p + "c0", np.zeros((2, b, h), np.float32))]
        nodes.append(helper.make_node("LSTM", ins, [p + "Y", p + "Yh", p + "Yc"], name=f"/lstm/LSTM_{layer}",
                                      hidden_size=h, direction="bidirectional"))
        nodes.append(helper.make_node("Transpose", [p + "Y"], [p + "Yt"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", [p + "Yt", init(p + "shape", np.array([0, 0, -1], np.int64))],
                                      [p + "out"]))
        x = p + "out"
    nodes.append(helper.make_node("GRU", [x, init("gW", _f32((1, 3 * h, 2 * h))), init("gR", _f32((1, 3 * h, h))),
                                          init("gB", _f32((1, 6 * h))), "", init("gh0", np.zeros((1, b, h), np.float32))],
                                  ["gY", "gYh"], name="/gru/GRU", hidden_size=h, linear_before_reset=1))
    nodes.append(helper.make_node("Squeeze", ["gY", init("ax1", np.array([1], np.int64))], ["seq"]))
    nodes.append(helper.make_node("Slice", ["l1_Yh", init("one", np.array([1], np.int64)), init("two", np.array([2], np.int64)),
                                            init("ax0", np.array([0], np.int64))], ["back1"]))
    nodes.append(helper.make_node("Squeeze", ["back1", "ax0"], ["back"]))
    nodes.append(helper.make_node("Gemm", ["back", init("fcW", _f32((3, h))), init("fcB", _f32(3))], ["logits"],
                                  transB=1))
    g = helper.make_graph(nodes, "torch_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [t, b, i])],
                          [helper.make_tensor_value_info("seq", TensorProto.FLOAT, [t, b, h]),
                           helper.make_tensor_value_info("logits", TensorProto.FLOAT, [b, 3])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m, {"x": _f32((t, b, i), 1.0)}


def test_torch_style_two_layer_bidirectional_lstm_then_gru_and_gemm():
    m, feeds = _torch_style_stack()
    refs = _ort(m, feeds)
    for a, r in zip(run(from_onnx(m), feeds), refs):
        _close(a, r)
    mod = compiler.build_model(m, target="cpu")
    assert mod.meta["fallbacks"] == []
    outs = mod.run(feeds)[0]
    _close(outs["seq"], refs[0])
    _close(outs["logits"], refs[1])


def test_unrolled_steps_share_their_weights_and_fuse_each_cell():
    """Every step's dense reads one packed R per direction (each step once packed its own copy, and
    62 copies fell out of cache), and an LSTM step is four kernels: the step's input rows, the
    recurrent dense, C_t and H_t; all but the first hold no step offset, so one compiled kernel
    serves every step (a kernel per step took 13 s to build at 128 steps)."""
    spec = _layer("LSTM", "bidirectional", t=7, b=1, i=5, h=16)
    m, feeds = _model(spec, outputs=["Y"])
    mod = compiler.build_model(m, target="cpu")
    r_bytes = spec["w"]["R"][0].nbytes
    assert sum(1 for v in mod.consts.values() if v.nbytes >= r_bytes) <= 3     # W, and R once per direction
    cells = [s for s in mod.steps if "/t3/" in s.name]
    assert [s.name.rsplit("/", 1)[1] for s in cells] == ["x", "rec", "C", "H"] * 2
    # between each direction's first and last steps: one kernel each for rec, C and H
    ends = ("rnn/d0/t0/", "rnn/d0/t6/", "rnn/d1/t6/", "rnn/d1/t0/")
    shared = {s.symbol for s in mod.steps if s.name.rsplit("/", 1)[1] in ("rec", "C", "H")
              and not s.name.startswith(ends)}
    assert len(shared) == 3, shared
    got = next(iter(mod.run(feeds)[0].values()))
    _close(np.asarray(got), _ort(m, feeds)[0])
