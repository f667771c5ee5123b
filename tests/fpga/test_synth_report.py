"""bench/synth_report.py without the tools: summaries of synthesis reports (utilization of the
part, Fmax and where it comes from, GOPS at Fmax) and the docs table it writes between markers."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmod import load_bench

from accel.isa import preset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sr():
    return load_bench("synth_report")


def _report(family, part_name, lut, dsp, fmax=None, fits=True):
    res = {k: {"used": v, "available": a, "percent": round(100 * v / a, 1), "margin": a - v}
           for k, v, a in (("lut", lut, 53200), ("ff", 3000, 106400), ("dsp", dsp, 220), ("bram", 7.5, 140))}
    return {"part": part_name, "family": family,
            "utilization": {"lut": lut, "ff": 3000, "dsp": dsp, "bram": 7.5, "lutram": 10},
            "fit": {"fits": fits, "limiting": "dsp" if not fits else "lut", "resources": res},
            "timing": {"fmax_mhz": fmax, "source": "nextpnr-ecp5 timing analysis after routing"} if fmax else None,
            "tools": {"yosys": {"seconds": 120.4, "version": "0.70"}}, "cached": False, "out_dir": "x"}


def test_summary_has_utilization_fmax_and_gops(sr):
    tiny = preset("tiny")
    s = sr.summary("tiny", tiny, _report("xc7", "xc7z020clg400-1", 10640, 44))
    assert s["utilization_pct"]["lut"] == 20.0 and s["utilization_pct"]["dsp"] == 20.0
    assert s["fmax_source"].startswith("estimate") and s["fmax_mhz"] > 0
    assert s["gops_at_fmax"] == round(2 * tiny.macs_per_cycle * s["fmax_mhz"] / 1000, 2)
    with_sta = dict(_report("xc7", "xc7z020clg400-1", 10640, 44), sta={"fmax_mhz": 95.2, "path_ns": 10.5})
    s = sr.summary("tiny", tiny, with_sta)
    assert (s["fmax_mhz"], s["fmax_source"]) == (95.2, sr.STA_SOURCE) and s["gops_at_fmax"] == round(32 * 95.2 / 1000, 2)
    assert "| 95.2 (yosys sta) |" in sr.docs_table({"xc7": {"tiny": s}})
    routed = sr.summary("tiny", tiny, _report("ecp5", "LFE5U-85F-6BG381C", 12000, 20, fmax=50.0))
    assert routed["fmax_mhz"] == 50.0 and routed["fmax_source"].startswith("nextpnr")
    assert routed["gops_at_fmax"] == 2 * 16 * 50 / 1000


def test_sta_result_is_kept_beside_the_cached_synthesis(sr, tmp_path):
    (tmp_path / "sta").mkdir()
    (tmp_path / "sta" / "path.json").write_text(json.dumps({"fmax_mhz": 80.0, "path_ns": 12.5}))
    assert sr.sta_of(preset("tiny"), {"out_dir": str(tmp_path)}, None) == {"fmax_mhz": 80.0, "path_ns": 12.5,
                                                                          "cached": True}


def test_docs_table_replaces_what_lies_between_the_markers(sr, tmp_path):
    tiny, dflt = preset("tiny"), preset("default")
    r = {"xc7": {"tiny": sr.summary("tiny", tiny, _report("xc7", "xc7z020clg400-1", 10640, 44)),
                 "default": sr.summary("default", dflt, _report("xc7", "xc7z020clg400-1", 34759, 368, fits=False))},
         "ecp5": sr.summary("tiny", tiny, _report("ecp5", "LFE5U-85F-6BG381C", 12000, 20, fmax=50.0)),
         "notes": ["the pynq-z1 preset equals the default config; one synthesis serves both"]}
    table = sr.docs_table(r)
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 3 and "GOPS at Fmax" in rows[0]
    assert "| tiny | xc7z020clg400-1 | 10640 (20%) |" in table and "**no** (dsp)" in table
    assert "| 50.0 | 1.6 |" in table and "(estimate)" in rows[1]
    doc = tmp_path / "fpga.md"
    doc.write_text(f"intro\n\n{sr.DOCS_BEGIN}\n| old | typed | table |\n{sr.DOCS_END}\n\nafter\n")
    path = tmp_path / "synth_report.json"
    path.write_text(json.dumps(r))
    assert sr.main(["--from-json", str(path), "--docs", str(doc)]) == 0
    text = doc.read_text()
    assert "old | typed" not in text and text.startswith("intro\n\n") and text.endswith("\nafter\n")
    assert text.count(sr.DOCS_BEGIN) == 1 and table in text
    sr.main(["--from-json", str(path), "--docs", str(doc)])       # idempotent
    assert doc.read_text() == text
    bare = tmp_path / "bare.md"
    bare.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no '<!-- synth_report:begin -->'"):
        sr.update_docs(bare, table)
    assert bare.read_text() == "no markers\n"


def test_fpga_docs_have_the_markers(sr):
    text = (ROOT / "docs" / "fpga.md").read_text()
    assert text.count(sr.DOCS_BEGIN) == 1 and text.index(sr.DOCS_BEGIN) < text.index(sr.DOCS_END)
