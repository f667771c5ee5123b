"""Tuning CPU kernels by search: per workload (compiler.autotune.space) the heuristic point is
measured first, then batches of the candidates the cost model (compiler.autotune.cost) ranks
fastest plus a few chosen at random (exploration), refitting after each batch, until the trial
budget is spent. Each candidate is composed, scheduled and compiled the way the CPU target does
(the build's Kernels), checked once against the graph's NumPy reference and timed (median of
repeats); every measurement is appended to the tuning log, so a rebuild is a lookup.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from host_runtime.kernel_cache import verify_ir

from ..build import build
from ..errors import CompilerError
from ..graph import interpret
from ..graph.ir import Graph
from ..ops import cpu
from .cost import CostModel, features
from .space import Workload, extract_workload, space
from .tuning_log import TuningBook, append_records, default_log_path, host_isa, make_record

log = logging.getLogger(__name__)

#: measurements per workload when tuning is asked for without a count
DEFAULT_TRIALS = 12


class CandidateError(CompilerError):
    """A candidate configuration that fails to build or computes a wrong result."""


@dataclass
class TuneOptions:
    """log: the JSON-lines log to read (and, when trials > 0, extend); None: this ISA's default
    log. trials: measurements per workload (0: look up only). batch/explore: candidates per cost
    model round and the share of them picked at random. repeats: timing repeats (median)."""
    log: str | Path | None = None
    trials: int = 0
    batch: int = 4
    explore: float = 0.25
    repeats: int = 5
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.trials, int) or self.trials < 0:
            raise CompilerError(f"tuning trials: expected an integer >= 0, got {self.trials!r}")
        if self.batch < 1 or not 0 <= self.explore <= 1 or self.repeats < 1:
            raise CompilerError("tuning options: batch >= 1, 0 <= explore <= 1 and repeats >= 1 required")


def _canon(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True)


class CpuTuner:
    """Chooses the schedule configuration of each CPU kernel for one build: from the tuning log
    when it has the workload, by measuring when trials > 0, else the heuristic point ({})."""

    def __init__(self, options: TuneOptions | None = None):
        self.opts = options or TuneOptions()
        self.isa = host_isa()
        self.path = Path(self.opts.log) if self.opts.log is not None else default_log_path(self.isa)
        if self.path is None and self.opts.trials > 0:
            raise CompilerError("tuning needs a log to write: KIT_TUNE_DIR=off turns the default one off; name one")
        self.book = TuningBook(self.isa)
        if self.path is not None:
            self.book.load(self.path)
        self.measurements = 0          # candidates built and timed by this tuner (tests count them)
        self.chosen: dict[str, dict] = {}   # workload key -> report row
        self._rng = np.random.default_rng(self.opts.seed)

    @classmethod
    def for_build(cls, tune) -> CpuTuner:
        """build_model's tune argument for the cpu target: None -> the default log, looked up only;
        True -> tune into the default log; a path -> tune into that log; TuneOptions as given."""
        if isinstance(tune, TuneOptions):
            return cls(tune)
        if tune is None or tune is False:
            return cls(TuneOptions())
        if tune is True:
            return cls(TuneOptions(trials=DEFAULT_TRIALS))
        if isinstance(tune, (str, Path)):
            return cls(TuneOptions(log=tune, trials=DEFAULT_TRIALS))
        raise CompilerError(f"tune: expected None, True, a log path or TuneOptions, got {type(tune).__name__}")

    # ---- choosing ---------------------------------------------------------------------------
    def config_for(self, body: Graph, consts: dict, kernels) -> dict:
        """The knob dict for the body's kernel ({}: the heuristics). kernels: the build's
        compiler.targets.cpu.Kernels (its traced() composes a candidate as the build does)."""
        wl = extract_workload(body, consts)
        if wl is None:
            return {}
        row = self.chosen.get(wl.key)
        if row is not None:
            return dict(row["config"])
        cfg = self.book.lookup(wl)
        source = "log"
        if cfg is None and self.opts.trials > 0:
            cfg, source = self.tune(wl, body, consts, kernels), "measured"
        elif cfg is None:
            cfg, source = {}, "default"
        self.chosen[wl.key] = {"op": wl.op, "impl": wl.impl, "shapes": [list(s) for s in wl.shapes],
                               "config": dict(cfg), "source": source, "time_s": self.book.time_of(wl, cfg)}
        return dict(cfg)

    def forget(self, body: Graph, consts: dict) -> None:
        """Drop the body's choice (it failed to build): later bodies like it take the heuristics."""
        wl = extract_workload(body, consts)
        if wl is not None and wl.key in self.chosen:
            self.chosen[wl.key].update(config={}, source="default (logged config failed)")

    def report(self) -> dict[str, dict]:
        """meta['tuning'] rows: per tuned kernel signature what was chosen and where from."""
        return {f"cpu:{r['impl']}:" + ",".join("x".join(map(str, s)) for s in r["shapes"]): r
                for r in self.chosen.values() if r["source"] != "default"}

    # ---- searching ----------------------------------------------------------------------------
    def _training_set(self):
        X, y = [], []
        regs = cpu.TILES.registers
        for r in self.book.records:
            t = r.get("time_s")
            if t is None:
                continue
            w = Workload.from_json(r["workload"])
            X.append(features(w, r["config"], regs))
            y.append(math.log(t / max(1, w.macs)))
        return X, y

    def next_batch(self, wl: Workload, todo: list[dict], n: int) -> list[dict]:
        """n candidates of `todo`: the cost model's fastest, plus a share at random."""
        X, y = self._training_set()
        if len(y) < 4:
            idx = self._rng.permutation(len(todo))[:n]
            return [todo[i] for i in idx]
        model = CostModel().fit(X, y)
        pred = model.predict([features(wl, c, cpu.TILES.registers) for c in todo])
        order = list(np.argsort(pred, kind="stable"))
        n_explore = min(int(round(n * self.opts.explore)), max(0, len(todo) - n))
        picked = order[:n - n_explore]
        rest = order[n - n_explore:]
        if n_explore:
            picked += list(self._rng.choice(rest, size=n_explore, replace=False))
        return [todo[i] for i in picked]

    def tune(self, wl: Workload, body: Graph, consts: dict, kernels) -> dict:
        cands = space(wl)
        done = self.book.measured(wl)
        budget = min(self.opts.trials, len(cands))
        ctx = _Measure(body, consts, kernels, self.opts.repeats)
        t0 = time.perf_counter()
        while sum(1 for c in cands if _canon(c) in done) < budget:
            todo = [c for c in cands if _canon(c) not in done]
            if not todo:
                break
            left = budget - sum(1 for c in cands if _canon(c) in done)
            batch = [cands[0]] if _canon(cands[0]) not in done else self.next_batch(wl, todo, min(self.opts.batch, left))
            new = []
            for cfg in batch:
                try:
                    t, err = ctx.measure(cfg), None
                except Exception as e:  # noqa: BLE001 - a failing candidate is recorded, not fatal
                    t, err = None, f"{type(e).__name__}: {e}"
                    log.debug("%s %s: %s", wl.impl, cfg, err)
                self.measurements += 1
                rec = make_record(self.isa, wl, cfg, t, err)
                self.book.add(rec)
                new.append(rec)
                done[_canon(cfg)] = rec["time_s"]
            append_records(self.path, new)
            if done.get(_canon(cands[0]), 0) is None:   # the heuristic kernel fails: so does the build's
                break
        self.confirm(wl, cands[0], done, ctx)
        timed = {c: t for c, t in done.items() if t is not None}
        if not timed:
            log.info("%s %s: the kernel does not build; nothing tuned", wl.impl, list(wl.shapes))
            return {}
        best = self.book.lookup(wl) or json.loads(min(timed, key=timed.get))   # what a rebuild will pick
        dflt = done.get(_canon(cands[0]))
        t_best = timed.get(_canon(best))
        log.info("tuned %s %s: %s (heuristic %s) over %d trial(s) in %.1f s", wl.impl, list(wl.shapes),
                 f"{t_best * 1e6:.1f} us" if t_best else "?", f"{dflt * 1e6:.1f} us" if dflt else "failed",
                 len(done), time.perf_counter() - t0)
        return best


    def confirm(self, wl: Workload, default: dict, done: dict, ctx: _Measure, top: int = 2, rounds: int = 3) -> None:
        """Re-time the heuristic point and the `top` fastest of this run in alternation and log
        the confirmed times (the least of the rounds' medians: others' load only ever adds time,
        and it moves one round, rarely all of them). A lookup prefers confirmed records and keeps
        the heuristic unless a candidate beats it by a margin (tuning_log.MARGIN)."""
        mine = [c for c in done if c in ctx.built and done[c] is not None]
        if len(mine) < 2:
            return
        pick = sorted(mine, key=done.get)[:top]
        if _canon(default) in ctx.built and _canon(default) not in pick:
            pick.append(_canon(default))
        times = {c: [] for c in pick}
        for _ in range(rounds):
            for c in pick:
                times[c].append(ctx.time_of(json.loads(c)))
        recs = []
        for c in pick:
            t = float(min(times[c]))
            recs.append(make_record(self.isa, wl, json.loads(c), t, confirmed=True, heuristic=c == _canon(default)))
            done[c] = t
        for r in recs:
            self.book.add(r)
        append_records(self.path, recs)


class _Measure:
    """Builds and times candidates of one body on random inputs, checked against the reference."""

    def __init__(self, body: Graph, consts: dict, kernels, repeats: int):
        self.body, self.consts, self.kernels, self.repeats = body, consts, kernels, repeats
        rng = np.random.default_rng(0)
        self.feeds = []
        for k, i in enumerate(body.inputs):
            if k in consts:
                self.feeds.append(np.asarray(consts[k]))
            elif np.dtype(i.dtype).kind == "f":
                self.feeds.append(rng.standard_normal(i.shape).astype(i.dtype))
            else:
                self.feeds.append(rng.integers(-8, 8, i.shape).astype(i.dtype))
        self._ref = None
        self.built: dict[str, tuple] = {}   # canonical config -> (module, arrays, output)

    def reference(self) -> np.ndarray:
        if self._ref is None:
            self._ref = np.asarray(interpret.run(self.body, self.feeds)[0])
        return self._ref

    def measure(self, cfg: dict) -> float:
        """Median seconds per call of the body's kernel under `cfg`; CandidateError when it does
        not match the reference."""
        with cpu.schedule_config(cfg):
            args, out, anchor, _ = self.kernels.traced(self.body, self.consts)
            sch = anchor.schedule([out])
            mod = build(sch, [t for t, _ in args] + [out], target="llvm", name="kit_tune_candidate")
        verify_ir(mod.get_source("ll"), "tuning candidate")
        arrays = [self.feeds[ref] if kind == "p" else np.ascontiguousarray(ref) for _, (kind, ref) in args]
        res = np.zeros(tuple(int(d) for d in out.shape), str(out.dtype))
        mod(*arrays, res)
        ref = self.reference()
        if res.shape != ref.shape:
            res = res.reshape(ref.shape)
        if np.dtype(ref.dtype).kind == "f":
            ok = np.allclose(res, ref, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(ref).max(initial=0))))
        else:
            ok = np.abs(res.astype(np.int64) - ref.astype(np.int64)).max(initial=0) <= 1
        if not ok:
            raise CandidateError(f"configuration {cfg} differs from the reference")
        self.built[_canon(cfg)] = (mod, arrays, res)
        return self.time_of(cfg)

    def time_of(self, cfg: dict) -> float:
        """Median seconds per call of an already built candidate (calls batched to >= 2 ms)."""
        mod, arrays, res = self.built[_canon(cfg)]
        t0 = time.perf_counter()
        mod(*arrays, res)
        first = max(time.perf_counter() - t0, 1e-7)
        number = max(1, min(100, int(2e-3 / first)))
        times = []
        for _ in range(self.repeats):
            t0 = time.perf_counter()
            for _ in range(number):
                mod(*arrays, res)
            times.append((time.perf_counter() - t0) / number)
        return float(np.median(times))
