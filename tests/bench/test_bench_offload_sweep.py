"""bench/offload_sweep.py stays runnable: the MLP row on two non-default configs, every MAC offloaded."""
import json

import pytest
from benchmod import load_bench


def test_offload_sweep_mlp(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ACCEL_HOST_MODEL", raising=False)
    bench = load_bench("offload_sweep")
    out = tmp_path / "sweep.json"
    assert bench.main(["--nets", "mlp", "--configs", "batch2,block32", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["host"] == "pynq-z1"
    for cell in doc["results"]["mlp"].values():
        assert cell["offload_fraction"] == 1.0 and cell["cpu_gemms"] == [] and cell["macs_total"] == 69632
    assert "100.0%" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--configs huge: unknown"):
        bench.main(["--configs", "huge", "-o", str(out)])
