"""Results of a sweep in its folder, written as points finish so that an interrupted sweep resumes.

results.jsonl: one JSON object per finished point (the record of flows.point, plus its config);
the source of truth, appended and fsynced per point. results.csv: the same points as a table with
a fixed header (point, swept parameters, status, error, cycles, cycles:<model>, metrics), rewritten
at the start of a run from the points it reuses, then appended per point. A line cut short by a
kill is dropped on the next start; every file is valid after Ctrl-C.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import os
from pathlib import Path

import numpy as np

from accel.isa.files import write_atomic

from .errors import SweepError

log = logging.getLogger(__name__)

METRICS = ("cycles", "latency_ms", "lut", "ff", "dsp", "bram", "fmax_mhz", "fits", "gops", "energy_uj")
EXTRA = ("accel_macs", "cpu_macs", "meets_clock")


def columns(params: list[str], models: list[str]) -> list[str]:
    return (["point", *params, "status", "error", "cycles", *[f"cycles:{m}" for m in models],
             *METRICS[1:], *EXTRA])


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


class ResultStore:
    """The results files of one sweep folder."""

    def __init__(self, out_dir: str | Path, params: list[str], models: list[str]):
        self.dir = Path(out_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SweepError(f"output folder {self.dir}: cannot create it ({e.strerror})") from None
        self.jsonl = self.dir / "results.jsonl"
        self.csv = self.dir / "results.csv"
        self.params, self.models = params, models
        self.header = columns(params, models)
        self.records = self._read()

    def _read(self) -> dict[str, dict]:
        """Finished points by key (the last record of a key wins); drops a torn last line."""
        if not self.jsonl.exists():
            return {}
        good, out, bad = [], {}, 0
        for line in self.jsonl.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
                key = rec["point"]
            except (json.JSONDecodeError, KeyError, TypeError):
                bad += 1
                continue
            good.append(line)
            out[key] = rec
        if bad:
            log.warning("%s: dropped %d unreadable line(s) (an interrupted write)", self.jsonl, bad)
            write_atomic(self.jsonl, "".join(g + "\n" for g in good))
        return out

    def start(self, keep: list[str]) -> None:
        """Rewrite results.csv with the reused points `keep` (in order), atomically."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(self.header)
        for k in keep:
            w.writerow(self.row(self.records[k]))
        write_atomic(self.csv, buf.getvalue())

    def row(self, rec: dict) -> list[str]:
        """CSV cells: a swept key shows its resolved value (what `auto` became) where the point had one."""
        params = rec.get("params", {}) | (rec.get("config") or {})
        return [_cell(params.get(c)) if c in self.params else _cell(rec.get(c)) for c in self.header]

    def append(self, rec: dict) -> None:
        """Add one finished point to both files (each one write, flushed and fsynced)."""
        self.records[rec["point"]] = rec
        line = json.dumps(rec, sort_keys=False, default=_json_default) + "\n"
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(self.row(rec))
        for path, text in ((self.jsonl, line), (self.csv, buf.getvalue())):
            with open(path, "a", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())


def _json_default(v):
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"cannot write {type(v).__name__} to JSON")


def read_csv(path: str | Path) -> list[dict]:
    """results.csv as a list of dicts (strings), for tests and tools."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
