"""accel sweep --dram: the points run under a DRAM preset, keyed apart from the default's."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from accel.cli import main
from compiler.frontend import zoo
from flows.errors import SweepError
from flows.space import parse_space
from flows.sweep import run_sweep

KIT = "0.0.0+test"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("models") / "res.onnx"
    p.write_bytes(zoo.residual_block().SerializeToString())
    return p


@pytest.fixture(autouse=True)
def _fast(monkeypatch):
    monkeypatch.setenv("ACCEL_CHECK_RACES", "0")


def test_sweep_under_a_dram_preset(model, tmp_path):
    space = parse_space({"base": "tiny", "params": {"block_out": [4]}})
    out = tmp_path / "s"
    base = run_sweep(space, [model], out, workers=0, synth="none", plot=False, kit=KIT)
    slow = run_sweep(space, [model], out, workers=0, synth="none", plot=False, kit=KIT, dram="PYNQ-Z1")
    assert slow.evaluated == 1                              # not the default's result again
    a, b = base.records[0], slow.records[0]
    assert a["status"] == b["status"] == "ok" and a["point"] != b["point"]
    assert b["cycles"] > a["cycles"]
    assert json.loads((out / "sweep.json").read_text())["dram"] == "pynq-z1"
    again = run_sweep(space, [model], out, workers=0, synth="none", plot=False, kit=KIT)
    assert again.evaluated == 0                             # the default's key did not change
    with pytest.raises(SweepError, match="--dram ddr9: unknown DRAM preset; presets are default, pynq-z1"):
        run_sweep(space, [model], tmp_path / "x", workers=0, dram="ddr9")


def test_cli_sweep_dram(model, tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text('base = "tiny"\n[params]\nblock_out = [4]\n')
    assert main(["sweep", str(f), "--model", str(model), "-o", str(tmp_path / "o"), "--workers", "0",
                 "--dram", "zcu104", "--no-plot"]) == 0
    assert json.loads((tmp_path / "o" / "sweep.json").read_text())["dram"] == "zcu104"
    capsys.readouterr()
    assert main(["sweep", str(f), "--model", str(model), "-o", str(tmp_path / "p"), "--dram", "x"]) != 0
    assert "unknown DRAM preset" in capsys.readouterr().err
