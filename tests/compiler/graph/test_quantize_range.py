"""Calibrated steps follow the activations however large they grow: a residual stack whose values
pass 127 * 256 (ShuffleNet and ResNet-50 with random weights reach 1e5) kept steps of at most 256
and saturated every tensor beyond, so the int8 graph drifted from the float one (cosine 0.90 here,
0.80 at ShuffleNet's logits)."""
import logging
import sys

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from compiler.frontend import from_onnx
from compiler.graph import run
from compiler.graph.passes import calibrate, optimize, pow2_shift

#: the module (compiler.graph.passes.quantize is also the name of its quantize function)
QUANTIZE = sys.modules["compiler.graph.passes.quantize"]


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _growing_residual_model(gain: float = 2e4, c: int = 8):
    """conv (a large gain) -> relu -> two residual blocks: activations of about 1e5."""
    rng = np.random.default_rng(7)

    def he(shape, g=1.0):
        return (rng.standard_normal(shape) * np.sqrt(2 / np.prod(shape[1:])) * g).astype(np.float32)
    inits = [numpy_helper.from_array(he((c, c, 3, 3), gain), "w0"), numpy_helper.from_array(he((c, c, 3, 3)), "w1"),
             numpy_helper.from_array(he((c, c, 1, 1)), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c1", "r0"], ["a1"]),
             helper.make_node("Conv", ["a1", "w2"], ["c2"]),
             helper.make_node("Add", ["c2", "a1"], ["y"])]
    g = helper.make_graph(nodes, "growing_residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _feeds(n):
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((1, 8, 8, 8)).astype(np.float32)} for _ in range(n)]


def test_large_activations_get_steps_that_hold_them():
    m = _growing_residual_model()
    feeds = _feeds(3)
    q = optimize(from_onnx(m), quantize=True, calibration_samples=feeds[:2])
    cal = q.meta["quantize"]["calibration"]
    assert max(cal.absmax.values()) > 127 * 256 * 2   # the case: beyond the old coarsest step
    for name, a in cal.absmax.items():
        assert a * 2.0 ** cal.shifts[name] <= 127, name   # no calibrated tensor saturates
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds[2])[0]
    got = run(q, feeds[2])[0]
    assert cosine(got, want) > 0.998
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()


def test_pow2_shift_reaches_float32_sized_ranges():
    for a in (4e4, 1e6, 3e9, 1e30):
        k = pow2_shift(a)
        assert a * 2.0 ** k <= 127 < a * 2.0 ** (k + 1)


def test_calibrate_logs_a_tensor_that_saturates_at_the_clamp(monkeypatch, caplog):
    monkeypatch.setattr(QUANTIZE, "SHIFT_RANGE", (-8, 24))
    g = from_onnx(_growing_residual_model())
    with caplog.at_level(logging.WARNING, logger=QUANTIZE.__name__):
        cal = calibrate(g, _feeds(1))
    assert cal.shifts["Conv_0"] == -8
    assert any("'Conv_0'" in r.getMessage() and "saturates" in r.getMessage() for r in caplog.records)
