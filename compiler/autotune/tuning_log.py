"""The CPU tuning log: JSON lines, one measured (workload, configuration) per line, keyed by the
machine's ISA (LLVM triple, CPU name and a digest of its feature string) so that a log carried to
another machine is ignored rather than trusted. A rebuild reads the best record per workload: a
lookup, no measuring. Each ISA also has a default log (default_log_path) a build consults when
none is named, so the untuned path is the tuned one wherever a log for the machine exists.

    {"version": 1, "isa": {"triple": ..., "cpu": ..., "features": "<sha256[:16]>"},
     "workload": {"op": ..., "impl": ..., "shapes": [...], ...}, "config": {...}, "time_s": 1.2e-4}
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
from pathlib import Path

from host_runtime.kernel_cache import default_cache_dir, host_target

from ..errors import CompilerError
from .space import FAMILIES, Workload, check_config

log = logging.getLogger(__name__)

VERSION = 1
#: a confirmed candidate replaces the heuristic point only when this much faster (time ratio)
MARGIN = 0.97


class TuningLogError(CompilerError):
    """A CPU tuning log that cannot be read or written (the message names the line and field)."""


def host_isa() -> dict:
    """This machine's ISA as the log keys it."""
    t = host_target()
    return {"triple": t["triple"], "cpu": t["cpu"],
            "features": hashlib.sha256(t["features"].encode()).hexdigest()[:16]}


def isa_slug(isa: dict) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{isa['triple']}-{isa['cpu']}-{isa['features']}")


def default_log_path(isa: dict | None = None) -> Path | None:
    """$KIT_TUNE_DIR/<isa>.jsonl, else <kernel cache dir>/cpu_tune/<isa>.jsonl; None when
    KIT_TUNE_DIR=off (builds then keep the heuristics unless given a log)."""
    env = os.environ.get("KIT_TUNE_DIR")
    if env == "off":
        return None
    root = Path(env) if env else default_cache_dir() / "cpu_tune"
    return root / f"{isa_slug(isa or host_isa())}.jsonl"


def _bad(path, lineno: int, what: str):
    return TuningLogError(f"tuning log {path}:{lineno}: {what}")


def check_header(rec, path, lineno: int, bad, version: int) -> None:
    """The fields every tuning-log record starts with (CPU and GPU logs): a JSON object, the log
    format version, the ISA it was measured on. bad(path, lineno, what) makes the caller's error."""
    if not isinstance(rec, dict):
        raise bad(path, lineno, f"expected a JSON object, got {type(rec).__name__}")
    if rec.get("version") != version:
        raise bad(path, lineno, f"field 'version': expected {version}, got {rec.get('version')!r}")
    isa = rec.get("isa")
    if not isinstance(isa, dict) or not all(isinstance(isa.get(k), str) for k in ("triple", "cpu", "features")):
        raise bad(path, lineno, "field 'isa': expected an object with string triple, cpu, features")


def _check_record(rec, path, lineno: int) -> dict:
    check_header(rec, path, lineno, _bad, VERSION)
    wl = rec.get("workload")
    if not isinstance(wl, dict):
        raise _bad(path, lineno, "field 'workload': expected an object")
    for k, typ in (("op", str), ("impl", str), ("shapes", list), ("dtypes", list)):
        if not isinstance(wl.get(k), typ):
            raise _bad(path, lineno, f"field 'workload.{k}': expected a {typ.__name__}, got {wl.get(k)!r}")
    if wl["impl"] not in FAMILIES:
        raise _bad(path, lineno, f"field 'workload.impl': {wl['impl']!r} is not a tunable kernel "
                                 f"(one of {', '.join(sorted(FAMILIES))})")
    if not all(isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in wl["shapes"]):
        raise _bad(path, lineno, "field 'workload.shapes': expected lists of non-negative integers")
    if not all(isinstance(d, str) for d in wl["dtypes"]):
        raise _bad(path, lineno, "field 'workload.dtypes': expected a list of dtype names")
    for k, ok, what in (("attrs", lambda v: isinstance(v, dict), "an object"),
                        ("consts", lambda v: isinstance(v, list) and all(isinstance(i, int) for i in v),
                         "a list of input indices"),
                        ("out_shape", lambda v: isinstance(v, list) and all(isinstance(i, int) and i >= 0 for i in v),
                         "a list of non-negative integers"),
                        ("macs", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                         "a non-negative integer")):
        if k in wl and not ok(wl[k]):
            raise _bad(path, lineno, f"field 'workload.{k}': expected {what}, got {wl[k]!r}")
    cfg = rec.get("config")
    if not isinstance(cfg, dict):
        raise _bad(path, lineno, "field 'config': expected an object of knobs")
    why = check_config(cfg)
    if why is not None:
        field, _, what = why.partition(": ")
        raise _bad(path, lineno, f"field '{field}': {what}")
    for k in ("confirmed", "heuristic"):
        if not isinstance(rec.get(k, False), bool):
            raise _bad(path, lineno, f"field '{k}': expected true or false, got {rec[k]!r}")
    t = rec.get("time_s")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0):
        raise _bad(path, lineno, f"field 'time_s': expected a positive number or null, got {t!r}")
    return rec


def read_records(path: str | Path, check, bad, unreadable) -> list[dict]:
    """The checked records of a JSON-lines log; [] when the file does not exist yet.
    check(rec, path, lineno) validates one record, bad(path, lineno, what) and unreadable(message)
    make the caller's one-line errors (the CPU and GPU tuners share this format)."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise unreadable(f"{path}: cannot read it ({e})") from None
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise bad(path, lineno, f"not JSON ({e.msg} at column {e.colno})") from None
        out.append(check(rec, path, lineno))
    return out


def read_log(path: str | Path) -> list[dict]:
    """Every record of the log (all ISAs); TuningLogError with the line number and field for a
    malformed line."""
    return read_records(path, _check_record, _bad, lambda msg: TuningLogError(f"tuning log {msg}"))


def make_record(isa: dict, wl: Workload, cfg: dict, time_s: float | None, error: str | None = None,
                confirmed: bool = False, heuristic: bool = False) -> dict:
    """One log line; confirmed: re-timed against the heuristic point at the end of a search
    (heuristic: this is that point)."""
    rec = {"version": VERSION, "isa": isa, "workload": wl.as_json(), "config": dict(cfg),
           "time_s": None if time_s is None or not math.isfinite(time_s) else float(time_s)}
    if error:
        rec["error"] = error[:300]
    if confirmed:
        rec["confirmed"] = True
    if heuristic:
        rec["heuristic"] = True
    return rec


def append_records(path: str | Path, records: list[dict]) -> None:
    """Append records (one JSON line each); the folder is made when missing."""
    if not records:
        return
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            for r in records:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    except OSError as e:
        raise TuningLogError(f"tuning log {path}: cannot write it ({e.strerror})") from None


class TuningBook:
    """The records of one or more logs for one ISA: the best configuration per workload key and
    the measurements the cost model trains on. Records of other ISAs are counted and ignored."""

    def __init__(self, isa: dict | None = None):
        self.isa = isa or host_isa()
        self.records: list[dict] = []
        self.best: dict[str, tuple[float, dict]] = {}
        self._confirmed: set[str] = set()   # workloads with confirmed records: only those compete
        self._heuristic: dict[str, tuple[float, dict]] = {}   # confirmed time of the heuristic point

    def load(self, path: str | Path) -> TuningBook:
        other = 0
        for rec in read_log(path):
            if rec["isa"] != self.isa:
                other += 1
                continue
            self.add(rec)
        if other:
            log.info("tuning log %s: %d record(s) for another ISA ignored (this machine: %s %s)", path, other,
                     self.isa["triple"], self.isa["cpu"])
        return self

    def add(self, rec: dict) -> None:
        self.records.append(rec)
        t = rec.get("time_s")
        if t is None:
            return
        key = Workload.from_json(rec["workload"]).key
        confirmed = bool(rec.get("confirmed"))
        if confirmed and key not in self._confirmed:
            self._confirmed.add(key)
            self.best.pop(key, None)
        elif key in self._confirmed and not confirmed:
            return
        if rec.get("heuristic") and confirmed:
            old = self._heuristic.get(key)
            if old is None or t < old[0]:
                self._heuristic[key] = (t, dict(rec["config"]))
        if key not in self.best or t < self.best[key][0]:
            self.best[key] = (t, dict(rec["config"]))

    def lookup(self, wl: Workload) -> dict | None:
        """The workload's configuration: the fastest confirmed one (the fastest measured when
        none is confirmed), or the heuristic point unless that one is MARGIN faster."""
        hit = self.best.get(wl.key)
        if hit is None:
            return None
        base = self._heuristic.get(wl.key)
        if base is not None and hit[0] > MARGIN * base[0]:
            return dict(base[1])
        return dict(hit[1])

    def time_of(self, wl: Workload, cfg: dict) -> float | None:
        """The logged time of one configuration (confirmed ones first), or None."""
        for entry in (self.best.get(wl.key), self._heuristic.get(wl.key)):
            if entry is not None and entry[1] == cfg:
                return entry[0]
        return None

    def measured(self, wl: Workload) -> dict[str, float | None]:
        """canonical config -> time (None: failed) of this workload's records."""
        key = wl.key
        return {json.dumps(r["config"], sort_keys=True): r["time_s"] for r in self.records
                if Workload.from_json(r["workload"]).key == key}
