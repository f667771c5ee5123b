"""Tiling by measurement on the timing model, and the tuning log."""
import json

from accel.isa import PRESETS
from compiler.accel.conv2d import Conv2dSpec, conv2d_candidates, plan_conv2d
from compiler.accel.tune import measure_conv2d, tune_conv2d


def test_tune_picks_the_fastest_measured_candidate_and_logs_it(tmp_path):
    cfg = PRESETS["tiny"]
    spec = Conv2dSpec(1, 8, 10, 10, 12, 3, 3, (1, 1, 1, 1), (1, 1), name="t")
    log = tmp_path / "tune.json"
    tiling, rec = tune_conv2d(spec, cfg, vt=2, top=4, log_path=log)
    assert len(rec["trials"]) == 4
    assert rec["cycles"] == min(t["cycles"] for t in rec["trials"])
    assert rec["cycles"] <= measure_conv2d(spec, cfg, plan_conv2d(spec, cfg, 2))
    assert rec["cycles"] == measure_conv2d(spec, cfg, tiling)  # deterministic
    book = json.loads(log.read_text())
    assert len(book) == 1
    again, rec2 = tune_conv2d(spec, cfg, vt=2, top=4, log_path=log)  # served from the log
    assert again == tiling and rec2 == next(iter(book.values()))


def test_candidates_are_sorted_and_all_fit():
    cfg = PRESETS["tiny"]
    cands = conv2d_candidates(Conv2dSpec(1, 16, 12, 12, 16, 3, 3, (1, 1, 1, 1)), cfg)
    costs = [c for c, _ in cands]
    assert costs == sorted(costs) and len(cands) > 3
