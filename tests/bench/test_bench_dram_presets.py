"""bench/dram_presets.py stays runnable: its quick form times two small layers under every DRAM
preset with one and with read_outstanding bursts in flight."""
import json

from benchmod import load_bench


def test_dram_presets_quick(tmp_path, capsys):
    bench = load_bench("dram_presets")
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "dram_presets.json").read_text())
    assert doc["read_outstanding"] == 4 and len(doc["layers"]) == 2
    for lay in doc["layers"].values():
        rows = lay["presets"]
        assert list(rows) == ["default", "pynq-z1", "ultra96", "zcu104"]
        for row in rows.values():
            one, four = row["outstanding_1"], row["outstanding_4"]
            assert four["cycles"] <= one["cycles"] and four["bytes_read"] == one["bytes_read"]
            assert four["over_ideal"] >= 1.0
        # a board's memory is slower than the bench's: never fewer cycles
        assert all(r["outstanding_4"]["cycles"] >= rows["default"]["outstanding_4"]["cycles"] for r in rows.values())
    assert "pynq-z1" in capsys.readouterr().out
