"""The GPU tuner searches its knob space with autotune's cost model and logs every measurement
in autotune's JSON-lines format, keyed by the OpenCL device."""
import json
import math

import numpy as np
import pytest

import compiler
from compiler import te
from compiler.codegen.opencl import build_gpu
from compiler.frontend import zoo
from compiler.ops import gpu, gpu_tune, nn
from compiler.ops.gpu import GPU_KNOBS, SCHEDULES
from compiler.ops.gpu_tune import GpuTuneError, GpuTuner, read_log, space
from tests.compiler.gpu.gpu_helpers import opencl_or_skip

FAKE_ISA = {"triple": "opencl", "cpu": "fake", "features": "0" * 16}


def test_space_is_every_knob_combination_default_first():
    for kind, (_, names) in SCHEDULES.items():
        sp = space(kind)
        assert sp[0] == {} and len(sp) == (1 + math.prod(len(GPU_KNOBS[n]) for n in names) if names else 1)
        assert len({json.dumps(c, sort_keys=True) for c in sp}) == len(sp)


def _rec(cfg, t, kind="gemm", key="k0"):
    return {"version": 1, "isa": FAKE_ISA, "workload": {"op": kind, "impl": f"gpu.{kind}", "shapes": [[64, 64]] * 3,
                                                        "dtypes": [], "key": key}, "config": cfg, "time_s": t}


def test_next_batch_follows_the_cost_model():
    """Trained on records where bigger tiles and k steps are faster, the batch (no exploration)
    is the model's fastest candidates, not a fixed list."""
    tuner = GpuTuner(trials=8, explore=0.0)
    tuner._isa = FAKE_ISA
    rng = np.random.default_rng(0)
    grid = space("gemm")[1:]
    for cfg in [grid[i] for i in rng.permutation(len(grid))[:20]]:
        tuner.records.append(_rec(cfg, 1e-3 / (cfg["tile"] * cfg["kt"])))
    todo = [c for c in grid if c not in [r["config"] for r in tuner.records]]
    picked = tuner.next_batch("gemm", [[64, 64]] * 3, todo, 3)
    assert all(c["tile"] == 16 and c["kt"] == 16 for c in picked), picked


def _dense_build(bad=lambda knobs: False):
    a = te.placeholder((16, 32), "float32", name="a")
    w = te.placeholder((24, 32), "float32", name="w")
    out = nn.dense(a, w)

    def build(knobs):
        o = te.compute(out.shape, lambda i, j: out[i, j] + 1.0) if bad(knobs) else out
        return build_gpu(gpu.schedule_gpu([o], knobs), [a, w, o], "opencl", "k_tune")
    return build


def test_search_measures_its_budget_logs_it_and_a_rebuild_looks_up(tmp_path):
    opencl_or_skip()
    log = tmp_path / "gpu.jsonl"
    t = GpuTuner(log, trials=5, seed=1)
    k, rec = t.best("key-a", "gemm", _dense_build())
    assert t.measurements == 5 and len(rec["trials"]) == 5
    recs = read_log(log)
    assert len(recs) == 5 and recs[0]["config"] == {} and all(r["workload"]["key"] == "key-a" for r in recs)
    timed = [r for r in recs if r["time_s"]]
    assert rec["seconds"] == min(r["time_s"] for r in timed)
    again = GpuTuner(log, trials=5)
    calls = []
    orig = gpu_tune.measure
    gpu_tune.measure = lambda kk, **kw: calls.append(kk) or orig(kk, **kw)
    try:
        k2, rec2 = again.best("key-a", "gemm", _dense_build())
    finally:
        gpu_tune.measure = orig
    assert not calls and rec2["knobs"] == rec["knobs"] and k2.source == k.source


def test_a_candidate_with_a_wrong_result_is_recorded_failed(tmp_path):
    opencl_or_skip()
    t = GpuTuner(tmp_path / "g.jsonl", trials=3, seed=0)
    _, rec = t.best("key-b", "gemm", _dense_build(bad=lambda knobs: bool(knobs)))   # every non-default is wrong
    recs = read_log(tmp_path / "g.jsonl")
    assert rec["knobs"] == {} and len(recs) == 3
    assert all(r["time_s"] is None and "differs" in r["error"] for r in recs[1:])


@pytest.mark.parametrize("line, field", [
    ('{"version": 2}', "version"),
    (json.dumps({**_rec({}, 1e-3), "config": {"tile": 5}}), "config.tile"),
    (json.dumps({**_rec({}, 1e-3), "time_s": -1}), "time_s"),
    (json.dumps({**_rec({}, 1e-3), "workload": {"op": "fft", "key": "x"}}), "workload"),
])
def test_malformed_log_line_names_line_and_field(tmp_path, line, field):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(_rec({}, 1e-3)) + "\n" + line + "\n")
    with pytest.raises(GpuTuneError, match=rf"t.jsonl:2: field '{field}"):
        GpuTuner(p)


def test_look_up_only_builds_the_defaults_without_measuring(tmp_path):
    t = GpuTuner(tmp_path / "none.jsonl", trials=0)
    t._isa = FAKE_ISA
    k, rec = t.best("key-c", "gemm", _dense_build())
    assert rec["knobs"] == {} and t.measurements == 0 and not (tmp_path / "none.jsonl").exists()


def test_unwritable_log_is_one_error_not_a_cpu_fallback(tmp_path):
    opencl_or_skip()
    f = tmp_path / "a_file"
    f.write_text("")
    with pytest.raises(GpuTuneError, match="cannot be written"):
        compiler.build_model(zoo.mlp(), target="opencl", tune=str(f / "log.jsonl"))   # under a file
