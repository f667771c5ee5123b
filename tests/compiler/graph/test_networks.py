"""The five networks end to end through the graph pipeline, with onnxruntime as the oracle:
float pipelines within 1e-4, int8 pipelines within quantization error (cosine >= 0.99), and the
int8 result unchanged bit for bit by partitioning, layout packing and fusion."""
import numpy as np
import onnxruntime as ort
import pytest

from compiler.accel import avgpool
from compiler.frontend import from_onnx, zoo
from compiler.graph import run
from compiler.graph.passes import optimize, partition_table

NETS = sorted(zoo.MODELS)


def cosine(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module", params=NETS)
def net(request):
    m = zoo.MODELS[request.param]()
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = zoo.sample_inputs(m, 6, seed=11)
    calib, test = feeds[:4], feeds[4:]
    return request.param, from_onnx(m), calib, [(f, sess.run(None, f)[0]) for f in test]


def test_network_float_pipeline_matches_onnxruntime(net):
    name, g, _, cases = net
    for opts in ({}, {"accel": "default"}, {"fuse": False}):
        opt = optimize(g, **opts)
        assert "batch_norm" not in opt.op_counts()
        for feeds, ref in cases:
            got = run(opt, feeds)[0]
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
            assert cosine(got, ref) > 1 - 1e-6


@pytest.mark.parametrize("config", ["default", "tiny"])
def test_network_int8_pipeline_within_quantization_error(net, config):
    name, g, calib, cases = net
    # dense layers at these small batches are memory-bound on the default core (the roofline rule
    # sends them to the CPU); force them on so every network exercises the accelerator path
    q = optimize(g, quantize=True, calibration_samples=calib, accel=config, force_target={"qdense": "accel"})
    assert any(n.target == "accel" for n in q.nodes), partition_table(q)
    for feeds, ref in cases:
        assert cosine(run(q, feeds)[0], ref) >= 0.99


def test_network_int8_layout_and_fusion_are_bit_exact(net, monkeypatch):
    name, g, calib, cases = net
    # Turning a uniform pool's window-sum conv into the ALU's qavg_pool2d is a requantization
    # choice of the accel target (its 16-bit multiplier can differ from the conv's by one step at
    # rounding ties; tests/compiler/accel/test_avgpool.py bounds it), not layout or fusion: off here.
    monkeypatch.setattr(avgpool, "uniform_pool", lambda conv: None)
    plain = optimize(g, quantize=True, calibration_samples=calib, fuse=False)  # int8, NCHW, unfused
    full = optimize(g, quantize=True, calibration_samples=calib, accel="default", force_target={"qdense": "accel"})
    assert full.meta["fusion"] and full.meta["layout"]["packs"] >= 1
    for feeds, _ in cases:
        np.testing.assert_array_equal(run(full, feeds)[0], run(plain, feeds)[0])


def test_network_reports_are_complete(net):
    name, g, calib, _ = net
    q = optimize(g, quantize=True, calibration_samples=calib, accel="default")
    cal = q.meta["quantize"]["calibration"]
    assert cal.samples == len(calib) and len(cal.table().splitlines()) > 2
    assert all(set(layer) >= {"name", "in_scale", "w_scale", "out_scale", "shr"} for layer in q.meta["quantize"]["layers"])
    decisions = q.meta["partition"]
    assert all(d.target in ("accel", "cpu") and (d.target == "accel" or d.reason) for d in decisions)
    plan = q.meta["memory_plan"]
    assert plan.planned_bytes < plan.naive_bytes and "saved" in plan.summary()
    assert [p["pass"] for p in q.meta["passes"]][-1] == "plan_memory"
