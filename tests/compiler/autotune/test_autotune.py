"""CPU schedules found by search (compiler.autotune): every point of a space computes what the
reference does, the heuristic point is today's schedule, the tuning log round-trips and rejects
malformed lines by line and field, a rebuild with the log measures nothing, and the cost model
ranks better than chance."""
import json
import logging

import numpy as np
import pytest

from compiler import build_model
from compiler.autotune import (
    CostModel,
    CpuTuner,
    TuneOptions,
    TuningBook,
    TuningLogError,
    default_log_path,
    extract_workload,
    features,
    host_isa,
    read_log,
    space,
)
from compiler.autotune import tuner as tuner_mod
from compiler.autotune.space import Workload, check_config
from compiler.autotune.tuning_log import append_records, make_record
from compiler.build import build
from compiler.frontend import from_onnx, zoo
from compiler.graph import Graph, Node, run
from compiler.ops import cpu
from compiler.targets.cpu import Kernels
from host_runtime.executor import Executor


@pytest.fixture(autouse=True)
def tune_dir(tmp_path, monkeypatch):
    """The default log lives under the test's folder (never the user's cache)."""
    monkeypatch.setenv("KIT_TUNE_DIR", str(tmp_path / "default"))
    return tmp_path


def _conv_body(c=8, o=16, hw=10, k=3, stride=1, groups=1, relu=True):
    rng = np.random.default_rng(0)
    x = Node.input("p0", (1, c, hw, hw))
    w = Node.input("p1", (o, c // groups, k, k))
    b = Node.input("p2", (o,))
    pad = k // 2
    y = Node("conv2d", [x, w, b], {"strides": (stride, stride), "pads": (pad,) * 4, "dilations": (1, 1),
                                   "groups": groups}, name="conv")
    nodes = [x, w, b, y]
    if relu:
        y = Node("relu", [y], name="relu")
        nodes.append(y)
    consts = {1: rng.standard_normal(w.shape).astype("float32"), 2: rng.standard_normal(b.shape).astype("float32")}
    return Graph(nodes, [x, w, b], [y]), consts


def _dense_body(m=4, k=24, n=20):
    rng = np.random.default_rng(1)
    x, w, b = Node.input("p0", (m, k)), Node.input("p1", (n, k)), Node.input("p2", (n,))
    y = Node("dense", [x, w, b], name="fc")
    consts = {1: rng.standard_normal(w.shape).astype("float32"), 2: rng.standard_normal(b.shape).astype("float32")}
    return Graph([x, w, b, y], [x, w, b], [y]), consts


def _matmul_body(m=6, k=16, n=24):
    a, b = Node.input("p0", (2, m, k)), Node.input("p1", (2, k, n))
    y = Node("matmul", [a, b], name="mm")
    return Graph([a, b, y], [a, b], [y]), {}


def _dw_blocked_body(cb=2, hw=9, lanes=8, stride=2):
    rng = np.random.default_rng(2)
    x, w = Node.input("p0", (1, cb, hw, hw, lanes)), Node.input("p1", (cb, 3, 3, lanes))
    y = Node("depthwise_conv2d_NCHWc", [x, w], {"strides": (stride, stride), "pads": (0, 1, 1, 0)}, name="dw")
    return Graph([x, w, y], [x, w], [y]), {1: rng.standard_normal(w.shape).astype("float32")}


BODIES = {
    "conv_nchwc": lambda: _conv_body(),
    "conv_nchwc_stride": lambda: _conv_body(c=6, o=12, hw=9, stride=2, relu=False),
    "conv_nchwc_grouped": lambda: _conv_body(c=16, o=24, hw=9, groups=2),
    "pointwise": lambda: _conv_body(c=8, o=12, hw=7, k=1),
    "pointwise_grouped": lambda: _conv_body(c=8, o=12, hw=7, k=1, groups=4),
    "depthwise": lambda: _conv_body(c=8, o=8, hw=9, groups=8),
    "dw_blocked": lambda: _dw_blocked_body(),
    "dense": lambda: _dense_body(),
    "dense_row": lambda: _dense_body(m=1, k=32, n=300),
    "matmul": lambda: _matmul_body(),
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_space_points_match_reference(name):
    """The heuristic point first, then a few random points: each builds and equals the reference."""
    body, consts = BODIES[name]()
    wl = extract_workload(body, consts)
    assert wl is not None and wl.family == name.split("_stride")[0].split("_row")[0].split("_grouped")[0]
    pts = space(wl)
    assert len(pts) >= 2 and len({json.dumps(p, sort_keys=True) for p in pts}) == len(pts)
    assert all(check_config(p) is None for p in pts)
    rng = np.random.default_rng(7)
    pick = [pts[0]] + [pts[i] for i in rng.choice(np.arange(1, len(pts)), size=min(3, len(pts) - 1), replace=False)]
    m = tuner_mod._Measure(body, consts, Kernels(), repeats=1)
    for cfg in pick:
        assert m.measure(cfg) > 0    # CandidateError if the result differs from the reference


@pytest.mark.parametrize("name", ["conv_nchwc", "conv_nchwc_grouped", "pointwise", "pointwise_grouped", "dense", "dw_blocked",
                                  "matmul"])
def test_heuristic_is_the_default_point(name):
    """space()[0] spells out today's heuristics: the same kernel as no configuration at all."""
    body, consts = BODIES[name]()
    wl = extract_workload(body, consts)
    irs = []
    for cfg in ({}, space(wl)[0]):
        with cpu.schedule_config(cfg):
            args, out, anchor, _ = Kernels().traced(body, consts)
            mod = build(anchor.schedule([out]), [t for t, _ in args] + [out], target="llvm", name="kit_same")
        irs.append(mod.get_source("ll"))
    assert irs[0] == irs[1]


def test_not_tunable_bodies_have_no_workload():
    x = Node.input("p0", (1, 8, 4, 4))
    y = Node("relu", [x])
    assert extract_workload(Graph([x, y], [x], [y]), {}) is None


# ---- the log ------------------------------------------------------------------------------------------
def _wl():
    body, consts = BODIES["dense"]()
    return extract_workload(body, consts)


def test_log_round_trip(tmp_path):
    wl, isa = _wl(), host_isa()
    path = tmp_path / "t.jsonl"
    cfgs = space(wl)[:3]
    append_records(path, [make_record(isa, wl, cfgs[0], 3e-5), make_record(isa, wl, cfgs[1], 1e-5),
                          make_record(isa, wl, cfgs[2], None, "ValueError: no")])
    recs = read_log(path)
    assert len(recs) == 3 and recs[2]["time_s"] is None and recs[2]["error"].startswith("ValueError")
    book = TuningBook(isa).load(path)
    assert book.lookup(wl) == cfgs[1]
    assert Workload.from_json(recs[0]["workload"]).key == wl.key


def test_confirmed_records_win_the_lookup(tmp_path):
    """A search's end re-times its best against the heuristic; a lucky early sample loses."""
    wl, isa = _wl(), host_isa()
    path = tmp_path / "t.jsonl"
    a, b = space(wl)[1:3]
    append_records(path, [make_record(isa, wl, a, 1e-7), make_record(isa, wl, b, 2e-5),
                          make_record(isa, wl, a, 3e-5, confirmed=True), make_record(isa, wl, b, 2e-5, confirmed=True),
                          make_record(isa, wl, a, 1e-8)])
    assert TuningBook(isa).load(path).lookup(wl) == b


def test_heuristic_kept_unless_clearly_beaten(tmp_path):
    wl, isa = _wl(), host_isa()
    h, a = space(wl)[0], space(wl)[1]
    path = tmp_path / "t.jsonl"
    append_records(path, [make_record(isa, wl, h, 1.00e-5, confirmed=True, heuristic=True),
                          make_record(isa, wl, a, 0.99e-5, confirmed=True)])
    assert TuningBook(isa).load(path).lookup(wl) == h     # 1% is noise
    append_records(path, [make_record(isa, wl, a, 0.80e-5, confirmed=True)])
    assert TuningBook(isa).load(path).lookup(wl) == a


def test_other_isa_ignored_with_a_message(tmp_path, caplog):
    wl, isa = _wl(), host_isa()
    other = dict(isa, cpu="some-other-cpu")
    path = tmp_path / "t.jsonl"
    append_records(path, [make_record(other, wl, space(wl)[1], 1e-6)])
    with caplog.at_level(logging.INFO, logger="compiler.autotune"):
        book = TuningBook(isa).load(path)
    assert book.lookup(wl) is None
    assert "another ISA" in caplog.text


@pytest.mark.parametrize("mutate, field", [
    (lambda r: "{not json", "not JSON"),
    (lambda r: json.dumps([1, 2]), "expected a JSON object"),
    (lambda r: json.dumps({**r, "version": 9}), "'version'"),
    (lambda r: json.dumps({**r, "isa": "x86"}), "'isa'"),
    (lambda r: json.dumps({**r, "workload": {**r["workload"], "impl": "nope"}}), "'workload.impl'"),
    (lambda r: json.dumps({**r, "workload": {**r["workload"], "shapes": [[1, -2]]}}), "'workload.shapes'"),
    (lambda r: json.dumps({**r, "workload": {**r["workload"], "attrs": [1]}}), "'workload.attrs'"),
    (lambda r: json.dumps({**r, "workload": {**r["workload"], "dtypes": [3]}}), "'workload.dtypes'"),
    (lambda r: json.dumps({**r, "workload": {**r["workload"], "macs": "many"}}), "'workload.macs'"),
    (lambda r: json.dumps({**r, "config": {"mi": 0}}), "'config.mi'"),
    (lambda r: json.dumps({**r, "config": {"mi": [1]}}), "'config.mi'"),
    (lambda r: json.dumps({**r, "config": []}), "'config'"),
    (lambda r: json.dumps({**r, "config": {"tile": 4}}), "'config.tile': unknown knob"),
    (lambda r: json.dumps({**r, "config": {"order": "sideways"}}), "'config.order'"),
    (lambda r: json.dumps({**r, "config": {"parallel": "sometimes"}}), "'config.parallel'"),
    (lambda r: json.dumps({**r, "config": {"unroll_kw": 1}}), "'config.unroll_kw'"),
    (lambda r: json.dumps({**r, "time_s": "fast"}), "'time_s'"),
    (lambda r: json.dumps({**r, "time_s": -1}), "'time_s'"),
    (lambda r: json.dumps({**r, "confirmed": "yes"}), "'confirmed'"),
])
def test_malformed_log_line_named(tmp_path, mutate, field):
    wl, isa = _wl(), host_isa()
    good = make_record(isa, wl, space(wl)[0], 2e-5)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + mutate(good) + "\n")
    with pytest.raises(TuningLogError, match=rf"bad.jsonl:3: .*{field}"):
        read_log(path)
    with pytest.raises(TuningLogError):   # a build naming the log stops with the same message
        CpuTuner(TuneOptions(log=path))


# ---- tuning and rebuilding ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_cnn():
    m = zoo.conv_bn_relu_pool()
    return from_onnx(m), zoo.sample_inputs(m)[0]


def _run(mod, feed):
    with Executor(mod) as ex:
        return next(iter(ex.run(feed).values()))


def test_tune_then_rebuild_is_a_lookup(tiny_cnn, tmp_path, monkeypatch):
    graph, feed = tiny_cnn
    calls = []
    real = tuner_mod._Measure.measure

    def counting(self, cfg):
        calls.append(cfg)
        return real(self, cfg)
    monkeypatch.setattr(tuner_mod._Measure, "measure", counting)
    log_path = tmp_path / "tiny.jsonl"
    tuned = build_model(graph, target="cpu", tune=TuneOptions(log=log_path, trials=2, repeats=1))
    n_workloads = len({json.dumps(r["workload"], sort_keys=True) for r in read_log(log_path)})
    assert n_workloads >= 2 and len(calls) == 2 * n_workloads
    rows = tuned.meta["tuning"]
    assert rows and all(r["source"] == "measured" for r in rows.values())
    want = run(graph, feed)[0]
    np.testing.assert_allclose(_run(tuned, feed), want, rtol=1e-4, atol=1e-4)

    calls.clear()
    again = build_model(graph, target="cpu", tune=TuneOptions(log=log_path))   # --tuning-log: lookup only
    assert calls == []
    assert {k: r["config"] for k, r in again.meta["tuning"].items()} == {k: r["config"] for k, r in rows.items()}
    assert all(r["source"] == "log" for r in again.meta["tuning"].values())
    build_model(graph, target="cpu", tune=TuneOptions(log=log_path, trials=2))   # budget already spent
    assert calls == []
    np.testing.assert_allclose(_run(again, feed), want, rtol=1e-4, atol=1e-4)


def test_default_log_of_the_isa_is_used(tiny_cnn, tmp_path):
    """A plain build (no tune argument) looks up this ISA's default log."""
    graph, feed = tiny_cnn
    assert build_model(graph, target="cpu").meta["tuning"] == {}
    path = default_log_path()
    mod = build_model(graph, target="cpu", tune=TuneOptions(log=tmp_path / "x.jsonl", trials=1, repeats=1))
    recs = read_log(tmp_path / "x.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    plain = build_model(graph, target="cpu")
    assert plain.meta["tuning"] and all(r["source"] == "log" for r in plain.meta["tuning"].values())
    np.testing.assert_allclose(_run(plain, feed), _run(mod, feed), rtol=1e-5, atol=1e-5)


def test_default_log_off(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_TUNE_DIR", "off")
    assert default_log_path() is None
    assert CpuTuner(TuneOptions()).book.best == {}
    with pytest.raises(Exception, match="needs a log"):
        CpuTuner(TuneOptions(trials=2))


def test_failing_logged_config_falls_back(tiny_cnn, tmp_path):
    """A logged configuration the kernel cannot take (stale log) gives the heuristic schedule."""
    graph, feed = tiny_cnn
    path = tmp_path / "t.jsonl"
    build_model(graph, target="cpu", tune=TuneOptions(log=path, trials=1, repeats=1))
    lines = [json.loads(s) for s in path.read_text().splitlines()]
    for r in lines:
        r["config"] = {**r["config"], "reg_n": 10 ** 6, "oc_bn": 3, "mi": 10 ** 6, "bn": 3}
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    mod = build_model(graph, target="cpu", tune=TuneOptions(log=path))
    np.testing.assert_allclose(_run(mod, feed), run(graph, feed)[0], rtol=1e-4, atol=1e-4)


# ---- the cost model --------------------------------------------------------------------------------------
def test_cost_model_ranks_better_than_random():
    """Synthetic times that depend on the register tile (spills hurt, small tiles waste issue
    slots) and the loop order: trained on half the space, the model's top pick on the other half
    beats the mean of random picks, and its ranking correlates with the truth."""
    body, consts = BODIES["conv_nchwc"]()
    base = extract_workload(body, consts)
    rng = np.random.default_rng(3)
    rows = []
    for c, o, hw in ((8, 16, 10), (16, 32, 14), (32, 32, 28), (16, 64, 7)):
        b, cs = _conv_body(c=c, o=o, hw=hw)
        wl = extract_workload(b, cs)
        for cfg in space(wl):
            regs = cfg["reg_n"] * -(-cfg["oc_bn"] // 16)
            t = wl.macs * 1e-9 * (1 + 0.15 * abs(np.log2(regs / 20)) + (0.5 if regs > 30 else 0)
                                  + (0.1 if cfg["order"] == "kernel_outer" else 0)) * np.exp(rng.normal(0, 0.03))
            rows.append((wl, cfg, t))
    assert base is not None
    idx = rng.permutation(len(rows))
    train, test = [rows[i] for i in idx[: len(rows) // 2]], [rows[i] for i in idx[len(rows) // 2:]]
    X = [features(w, c) for w, c, _ in train]
    y = [np.log(t / w.macs) for w, _, t in train]
    model = CostModel().fit(X, y)
    pred = model.predict([features(w, c) for w, c, _ in test])
    truth = np.array([np.log(t / w.macs) for w, _, t in test])
    rank = lambda v: np.argsort(np.argsort(v))  # noqa: E731
    spearman = np.corrcoef(rank(pred), rank(truth))[0, 1]
    assert spearman > 0.6
    top = truth[np.argsort(pred)[:5]].mean()
    assert top < truth.mean()


def test_tuner_options_checked():
    with pytest.raises(Exception, match="trials"):
        TuneOptions(trials=-1)


def test_int8_kernels_tune_and_match(tmp_path):
    """A QDQ model's qconv2d / qdense kernels have spaces too; tuned and heuristic builds agree."""
    m = zoo.conv_bn_relu_pool()
    feeds = zoo.sample_inputs(m, n=3)
    graph = from_onnx(zoo.ort_quantize(m, feeds[:-1]))
    tuned = build_model(graph, target="cpu", tune=TuneOptions(log=tmp_path / "q.jsonl", trials=2, repeats=1))
    assert {r["impl"] for r in tuned.meta["tuning"].values()} >= {"qconv2d.nchwc", "qdense.pack"}
    plain = build_model(graph, target="cpu", tune=TuneOptions(log=tmp_path / "none.jsonl"))
    np.testing.assert_array_equal(_run(tuned, feeds[-1]), _run(plain, feeds[-1]))
