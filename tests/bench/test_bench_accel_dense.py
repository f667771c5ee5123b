"""bench/accel_dense.py: a quick run writes the JSON (bit-exact layers, cycles against the ideal
and the DRAM floor); a malformed shape names itself."""
import json

import pytest
from benchmod import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("accel_dense")


def test_quick_run_writes_json(bench, tmp_path, capsys):
    out = tmp_path / "dense.json"
    assert bench.main(["--config", "tiny", "--shapes", "6x16x8,20x12x24", "--encoders", "", "-o", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert [r["shape"] for r in rep["layers"]] == ["6x16x8", "20x12x24"]
    for r in rep["layers"]:
        assert r["bit_exact"] and r["cycles"] >= r["dram_floor"] >= r["ideal"] > 0
    assert "20x12x24" in capsys.readouterr().out


def test_bad_shape_names_itself(bench, tmp_path):
    with pytest.raises(SystemExit, match="--shapes: '6x16' is not ROWSxKxM"):
        bench.main(["--shapes", "6x16", "--encoders", "", "-o", str(tmp_path / "x.json")])
