"""`accel tune M.onnx --target cpu --trials N --log F` and `accel compile --tuning-log F`."""
import json

import onnx
import pytest

from accel.cli import main
from compiler.autotune import read_log
from compiler.frontend import zoo


@pytest.fixture
def mlp(tmp_path, monkeypatch):
    monkeypatch.setenv("KIT_TUNE_DIR", str(tmp_path / "default"))
    path = tmp_path / "mlp.onnx"
    onnx.save(zoo.mlp(), str(path))
    return path


def test_tune_then_compile_with_the_log(mlp, tmp_path, capsys):
    log = tmp_path / "t.jsonl"
    assert main(["tune", str(mlp), "--target", "cpu", "--trials", "2", "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and "kernel signature(s)" in out
    recs = read_log(log)
    searched = [r for r in recs if not r.get("confirmed")]
    assert searched and len(searched) == 2 * len({json.dumps(r["workload"], sort_keys=True) for r in recs})
    assert main(["compile", str(mlp), "--target", "cpu", "--tuning-log", str(log), "-o", str(tmp_path / "m.accm")]) == 0
    assert len(read_log(log)) == len(recs)   # a lookup: nothing appended


def test_malformed_log_is_one_line_error(mlp, tmp_path, capsys):
    log = tmp_path / "bad.jsonl"
    log.write_text('{"version": 1, "isa": {"triple": "x", "cpu": "y", "features": "z"}}\n')
    rc = main(["compile", str(mlp), "--target", "cpu", "--tuning-log", str(log), "-o", str(tmp_path / "m.accm")])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.jsonl:1" in err and "'workload'" in err and len(err.strip().splitlines()) == 1


def test_tuning_log_is_for_the_cpu_target(mlp, tmp_path, capsys):
    rc = main(["compile", str(mlp), "--target", "accel", "--tuning-log", str(tmp_path / "t.jsonl"),
               "-o", str(tmp_path / "m.accm")])
    assert rc == 2 and "--tuning-log is for --target cpu" in capsys.readouterr().err
    assert main(["tune", str(mlp), "--trials", "0"]) == 2
