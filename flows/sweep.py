"""`accel sweep`: design-space exploration of the accelerator, one Dask task per design point.

    result = run_sweep(load_space("space.toml"), ["net.onnx"], "out/", workers=4)

Each point is keyed by content: its resolved AccelConfig, the models' hashes, the kit's version
and source digest, and the evaluation options (driver, synthesis mode, part, energy table). A
point already in out/results.jsonl is reused, so a rerun into the same folder runs only the rest.
Points run on a distributed.LocalCluster (one single-threaded worker process per core by
default) or on an existing cluster given by its scheduler address (`tcp://host:port`); with
workers=0 they run one after another in this process (debugging, and the bench's baseline).
Strategies: grid (every combination), random:N (N distinct combinations), optuna:N (N trials of
optuna's TPE sampler minimizing latency, with not fitting the part as a constraint).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Callable

from accel.hw.boards import BOARDS, PARTS, BoardError
from accel.hw.boards import board as lookup_board
from accel.hw.boards import part as lookup_part
from accel.isa.files import write_atomic
from sim.dram import DRAM_PRESETS

from . import pareto
from .errors import SweepError
from .point import energy_table, evaluate_point
from .space import (
    Layer,
    Space,
    load_space,
    model_inputs,
    model_layers,
    parse_shape,
    resolve_point,
    resolve_values,
    violated,
)
from .store import ResultStore

log = logging.getLogger(__name__)

DRIVERS = ("tsim", "rtl")
SYNTH = ("estimate", "yosys", "none")
_SOURCE_PACKAGES = ("accel", "sim", "compiler", "host_runtime", "flows")


# ---- identity -------------------------------------------------------------------------------------
def kit_version() -> str:
    """The kit's version plus a digest of its Python and JSON sources (results depend on both)."""
    try:
        ver = version("accel-kit")
    except Exception:  # not installed: running from a checkout
        ver = "0+checkout"
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pkg in _SOURCE_PACKAGES:
        for p in sorted((root / pkg).rglob("*")):
            if p.suffix in (".py", ".json") and "__pycache__" not in p.parts and p.is_file():
                h.update(str(p.relative_to(root)).encode())
                h.update(p.read_bytes())
    return f"{ver}+{h.hexdigest()[:12]}"


@dataclass(frozen=True)
class Model:
    name: str
    blob: bytes
    sha: str
    layers: tuple[Layer, ...]
    shapes: dict = field(default_factory=dict)   # static shapes given for its inputs


def load_models(paths: list[str | Path], shapes: dict | None = None) -> list[Model]:
    """Read each ONNX file once; names are file stems (made unique), layers for `auto` sizes.
    shapes: {input name: dims} for inputs with symbolic dimensions (applied where a model has them)."""
    if not paths:
        raise SweepError("no model given: pass at least one --model M.onnx")
    out, names = [], set()
    for p in paths:
        p = Path(p)
        try:
            blob = p.read_bytes()
        except OSError as e:
            raise SweepError(f"model {p}: cannot read it ({e.strerror})") from None
        inputs = model_inputs(blob, str(p))
        mine = {k: list(v) for k, v in (shapes or {}).items() if k in inputs}
        for k, dims in inputs.items():
            sym = [d for d in dims if not isinstance(d, int) or d < 1]
            if sym and k not in mine:
                raise SweepError(f"model {p}: input '{k}' has a symbolic dimension {sym[0]!r}; give its shape "
                                 f"with --shape {k}=1x... or [compile] shapes in the space file")
        name, k = p.stem, 2
        while name in names:
            name, k = f"{p.stem}_{k}", k + 1
        names.add(name)
        out.append(Model(name, blob, hashlib.sha256(blob).hexdigest(), tuple(model_layers(blob, str(p), mine)), mine))
    return out


def resolve_target(board: str) -> tuple[str, float | None, str]:
    """(part name, fabric clock limit or None, label) for a board name, or a part name."""
    try:
        b = lookup_board(board)
        return b.part.name, b.max_fabric_mhz, b.name
    except BoardError:
        pass
    try:
        return lookup_part(board).name, None, board
    except BoardError:
        raise SweepError(f"--board {board!r}: not a board ({', '.join(BOARDS)}) or a part "
                         f"({', '.join(PARTS)})") from None


# ---- planning -------------------------------------------------------------------------------------
@dataclass
class Point:
    key: str
    values: dict
    config: dict | None = None
    error: str = ""


@dataclass
class Plan:
    """What every point shares: the evaluation options and the models."""

    space: Space
    models: list[Model]
    part: str
    board_max_mhz: float | None
    board: str
    synth: str
    driver: str
    kit: str
    energy: dict = field(default_factory=dict)
    dram: str | None = None      # DRAM preset of the timing driver (sim/dram.py); None: the default

    def identity(self) -> dict:
        """Everything besides the config that a point's results depend on (part of its key)."""
        ident = {"models": [m.sha for m in self.models], "shapes": [m.shapes for m in self.models], "kit": self.kit,
                 "driver": self.driver, "synth": self.synth, "part": self.part, "board_max_mhz": self.board_max_mhz,
                 "energy": self.energy, "force": self.space.force}
        if self.dram is not None:      # absent otherwise, so that earlier sweeps keep their keys
            ident["dram"] = self.dram
        return ident

    def point(self, values: dict) -> Point | None:
        """The point of `values`, or None when it breaks a constraint of the space."""
        layers = [ly for m in self.models for ly in m.layers]
        d = resolve_values(self.space, values, layers)
        if violated(self.space.constraints, {k: v for k, v in d.items() if v != "auto"}):
            return None
        try:
            cfg = resolve_point(self.space, values, layers, d)
        except SweepError as e:
            ident = {"invalid": values, "base": self.space.base.to_dict()} | self.identity()
            return Point(_digest(ident), values, None, str(e))
        if violated(self.space.constraints, cfg):
            return None
        return Point(_digest({"config": cfg.to_dict()} | self.identity()), values, cfg.to_dict())

    def task(self, p: Point, out_dir: Path) -> dict:
        return {"point": p.key, "params": p.values, "config": p.config, "models": [m.name for m in self.models],
                "driver": self.driver, "synth": self.synth, "part": self.part, "board_max_mhz": self.board_max_mhz,
                "energy": self.energy, "force": self.space.force, "shapes": [m.shapes for m in self.models],
                "work_dir": str(out_dir / "synth" / p.key), "dram": self.dram}


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def parse_strategy(text: str) -> tuple[str, int | None]:
    name, _, n = text.partition(":")
    if name == "grid" and not n:
        return "grid", None
    if name in ("random", "optuna"):
        try:
            k = int(n)
        except ValueError:
            k = 0
        if k >= 1:
            return name, k
    raise SweepError(f"--strategy {text!r}: use grid, random:N or optuna:N with N >= 1")


# ---- running --------------------------------------------------------------------------------------
@dataclass
class SweepResult:
    out_dir: Path
    records: list[dict]          # this sweep's points, in plan order
    evaluated: int               # points run now
    reused: int                  # points found in the folder
    skipped: int                 # combinations a constraint excluded
    params: list[str]
    best: dict | None = None
    plot: Path | None = None

    @property
    def failed(self) -> int:
        return sum(r.get("status") == "failed" for r in self.records)


class _Runner:
    """Where tasks run: a Dask client (LocalCluster or an existing scheduler), or this process."""

    def __init__(self, scheduler: str | None, workers: int | None, memory_limit: str | None = None):
        self.client = self.cluster = None
        if scheduler is None and workers == 0:
            return
        try:
            from distributed import Client, LocalCluster  # noqa: PLC0415 - Dask loads only for sweeps
        except ImportError:
            raise SweepError("the sweep needs dask and distributed: pip install dask distributed") from None
        try:
            if scheduler:
                self.client = Client(scheduler, timeout="30s")
            else:
                n = workers or os.cpu_count() or 1
                quiet = logging.ERROR if logging.getLogger().level >= logging.WARNING else logging.INFO
                self.cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                            dashboard_address=None, memory_limit=memory_limit or "auto",
                                            silence_logs=quiet)
                self.client = Client(self.cluster)
        except (OSError, TimeoutError, ValueError) as e:
            self.close()
            raise SweepError(f"cannot reach the Dask scheduler {scheduler or '(local cluster)'}: {e}") from None

    @property
    def n_workers(self) -> int:
        if self.client is None:
            return 1
        return max(1, len(self.client.scheduler_info().get("workers", {})))

    def close(self) -> None:
        # a busy worker that takes over the nanny's 4 s to exit is killed, with a warning: expected here
        nanny = logging.getLogger("distributed.nanny")
        level = nanny.level
        nanny.setLevel(max(level, logging.ERROR))
        try:
            for obj in (self.client, self.cluster):
                if obj is not None:
                    try:
                        obj.close()
                    except Exception as e:  # shutting down after Ctrl-C can race the workers
                        log.debug("closing %s: %s", type(obj).__name__, e)
        finally:
            nanny.setLevel(level)


def run_sweep(space: Space, models: list[str | Path] | list[Model], out_dir: str | Path, *,
              scheduler: str | None = None, workers: int | None = None, board: str = "pynq-z1",
              synth: str = "estimate", driver: str = "tsim", strategy: str = "grid", seed: int = 0,
              retry_failed: bool = False, memory_limit: str | None = None, kit: str | None = None,
              combos: list[dict] | None = None, shapes: dict | None = None,
              on_start: Callable[[int], None] | None = None,
              on_record: Callable[[dict], None] | None = None, plot: bool = True,
              dram: str | None = None) -> SweepResult:
    """Run (or resume) a sweep into out_dir; see the module doc. on_start(n) gets the number of
    points about to run, on_record(rec) each record as it lands (for a progress bar). kit: the
    kit identity in point keys (default kit_version()). combos: run exactly these parameter
    combinations instead of the strategy's (grid/random only). shapes: static input shapes, over
    the space file's [compile] shapes."""
    if synth not in SYNTH:
        raise SweepError(f"--synth {synth!r}: choose {', '.join(SYNTH)}")
    if driver not in DRIVERS:
        raise SweepError(f"--driver {driver!r}: choose {', '.join(DRIVERS)}")
    if dram is not None:
        if not isinstance(dram, str) or dram.lower() not in DRAM_PRESETS:
            raise SweepError(f"--dram {dram}: unknown DRAM preset; presets are {', '.join(DRAM_PRESETS)}")
        dram = dram.lower()
    if workers is not None and workers < 0:
        raise SweepError(f"--workers {workers}: must be >= 0 (0 runs the points in this process)")
    strat, n = parse_strategy(strategy)
    if strat == "optuna":
        _need_optuna()
    models = models if models and isinstance(models[0], Model) else load_models(models, space.shapes | (shapes or {}))
    part, max_mhz, label = resolve_target(board)
    plan = Plan(space, models, part, max_mhz, label, synth, driver, kit or kit_version(), energy_table(space.energy),
                dram)
    out = Path(out_dir)
    store = ResultStore(out, space.swept, [m.name for m in models])
    write_atomic(out / "sweep.json", json.dumps({"space": space.to_dict(), "models": {m.name: m.sha for m in models},
                                                  "board": label, "part": part, "synth": synth, "driver": driver,
                                                  "dram": dram,
                                                  "strategy": strategy, "kit": plan.kit}, indent=2, default=str) + "\n")
    runner = _Runner(scheduler, workers, memory_limit)
    try:
        if strat == "optuna":
            res = _run_optuna(plan, store, runner, n, seed, retry_failed, on_start, on_record)
        else:
            if combos is None:
                combos = list(space.grid()) if strat == "grid" else space.sample(n, seed)
            res = _run_points(plan, store, runner, combos, retry_failed, on_start, on_record)
    finally:
        runner.close()
    res.best = pareto.best(res.records)
    if plot:
        res.plot = pareto.plot(res.records, out / "pareto.png",
                               title=f"{', '.join(m.name for m in models)} on {label} ({len(res.records)} points)")
    return res


def plan_points(plan: Plan, combos: list[dict]) -> tuple[list[Point], int]:
    """The distinct points of `combos` and how many a constraint excluded."""
    points, seen, skipped = [], set(), 0
    for values in combos:
        p = plan.point(values)
        if p is None:
            skipped += 1
        elif p.key not in seen:
            seen.add(p.key)
            points.append(p)
    return points, skipped


def _finish(plan: Plan, p: Point, rec: dict) -> dict:
    rec = dict(rec)
    rec["params"] = p.values
    rec["config"] = p.config
    rec["models"] = {m.name: m.sha for m in plan.models}
    rec["kit"] = plan.kit
    rec["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return rec


def _failed(p: Point, error: str) -> dict:
    return {"point": p.key, "params": p.values, "status": "failed", "error": error}


class _Submitter:
    """Submits points to the runner and yields their records as they finish."""

    def __init__(self, plan: Plan, runner: _Runner, out_dir: Path):
        self.plan, self.runner, self.out = plan, runner, out_dir
        self.blobs = None
        self.futures: dict = {}
        self._n = 0

    def submit(self, p: Point):
        task = self.plan.task(p, self.out)
        self._n += 1
        if self.runner.client is None:
            self.futures[self._n] = (p, task)
            return
        if self.blobs is None:   # the models travel to the workers once, not with every task
            self.blobs = [self.runner.client.scatter(m.blob, hash=True) for m in self.plan.models]
        fut = self.runner.client.submit(evaluate_point, task, *self.blobs, pure=False,
                                        key=f"sweep-point-{p.key}-{os.getpid()}-{self._n}-{time.monotonic_ns()}")
        self.futures[fut] = p

    def results(self):
        """(point, record) of every submitted point, as each finishes."""
        if self.runner.client is None:
            while self.futures:
                k = next(iter(self.futures))
                p, task = self.futures.pop(k)
                yield p, evaluate_point(task, *[m.blob for m in self.plan.models])
            return
        from distributed import as_completed  # noqa: PLC0415 - Dask loads only for sweeps
        ac = as_completed(list(self.futures))
        self._ac = ac
        for fut in ac:
            p = self.futures.pop(fut)
            try:
                rec = fut.result()
            except Exception as e:  # the worker died or the task could not run: this point failed
                rec = _failed(p, f"task failed on the cluster: {type(e).__name__}: {e}".splitlines()[0])
            yield p, rec

    def add(self, p: Point):
        """Submit one more point while results() is being consumed (optuna)."""
        self.submit(p)
        if self.runner.client is not None:
            fut = next(reversed(self.futures))
            self._ac.add(fut)

    def cancel(self):
        if self.runner.client is not None and self.futures:
            self.runner.client.cancel(list(self.futures))
        self.futures.clear()


def _run_points(plan, store, runner, combos, retry_failed, on_start, on_record) -> SweepResult:
    points, skipped = plan_points(plan, combos)
    if not points:
        raise SweepError(f"{plan.space.source}: no point of the space satisfies its constraints")

    def done(p):
        r = store.records.get(p.key)
        return r is not None and not (retry_failed and r.get("status") == "failed")
    keep = [p.key for p in points if done(p)]
    store.start(keep)
    todo = [p for p in points if not done(p)]
    log.info("sweep: %d points (%d reused, %d to run, %d excluded by constraints)", len(points), len(keep),
             len(todo), skipped)
    if on_start:
        on_start(len(todo))
    sub = _Submitter(plan, runner, store.dir)
    evaluated = 0
    try:
        for p in todo:
            if p.config is None:
                rec = _finish(plan, p, _failed(p, p.error))
                store.append(rec)
                evaluated += 1
                if on_record:
                    on_record(rec)
            else:
                sub.submit(p)
        for p, rec in sub.results():
            rec = _finish(plan, p, rec)
            store.append(rec)
            evaluated += 1
            if on_record:
                on_record(rec)
    except BaseException:
        sub.cancel()
        raise
    recs = [store.records[p.key] for p in points if p.key in store.records]
    return SweepResult(store.dir, recs, evaluated, len(keep), skipped, plan.space.swept)


# ---- optuna ---------------------------------------------------------------------------------------
def _need_optuna():
    try:
        import optuna  # noqa: PLC0415, F401 - optional dep optuna
    except ImportError:
        raise SweepError("--strategy optuna:N needs optuna: pip install 'accel-kit[sweep]' "
                         "(or pip install optuna)") from None


def _constraints(rec: dict, most_macs: int) -> list[float]:
    """optuna constraint values (<= 0 is feasible): fits the part; offloads as much as the best."""
    fits = 0.0 if rec.get("fits") is not False else 1.0
    short = (most_macs - (rec.get("accel_macs") or 0)) / most_macs if most_macs else 0.0
    return [fits, max(0.0, short - pareto.OFFLOAD_TOLERANCE)]


def _run_optuna(plan, store, runner, n_trials, seed, retry_failed, on_start, on_record) -> SweepResult:
    import optuna  # noqa: PLC0415 - optional dep optuna
    from optuna.distributions import CategoricalDistribution  # noqa: PLC0415 - optional dep optuna
    from optuna.trial import TrialState  # noqa: PLC0415 - optional dep optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # optuna >= 5 takes constraints from the trial; older ones from a constraints_func
    native = hasattr(optuna.trial.Trial, "set_constraint")
    extra = {} if native else {"constraints_func": lambda t: t.user_attrs.get("constraints", [1.0, 1.0])}
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(2, n_trials // 3)), **extra)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    dists = {k: CategoricalDistribution(v) for k, v in plan.space.params.items()}
    store.start([])
    if on_start:
        on_start(n_trials)
    sub = _Submitter(plan, runner, store.dir)
    points: dict[str, Point] = {}
    pending: dict[str, list] = {}     # point key -> trials waiting for it
    state = {"asked": 0, "evaluated": 0, "skipped": 0, "most": 0}
    initial, reused, retried = set(store.records), set(), set()
    max_asks = n_trials * 20   # a space its constraints mostly exclude must not loop for ever

    def tell(trial, rec):
        if rec.get("status") != "ok":
            study.tell(trial, state=TrialState.FAIL)
        else:
            state["most"] = max(state["most"], rec.get("accel_macs") or 0)
            c = _constraints(rec, state["most"])
            if native:
                trial.set_constraint("fits", c[0])
                trial.set_constraint("offload", c[1])
            else:
                trial.set_user_attr("constraints", c)
            study.tell(trial, rec["latency_ms"])

    def land(p, rec):
        rec = _finish(plan, p, rec)
        store.append(rec)
        state["evaluated"] += 1
        if on_record:
            on_record(rec)
        for t in pending.pop(p.key, []):
            tell(t, rec)

    def ask_more(limit):
        """Ask trials until `limit` points are in flight or the budget is spent."""
        while (state["asked"] < n_trials and len(sub.futures) < limit
               and state["asked"] + state["skipped"] < max_asks):
            trial = study.ask(dists)
            p = plan.point(dict(trial.params))
            if p is None:
                state["skipped"] += 1
                study.tell(trial, state=TrialState.PRUNED)
                continue
            state["asked"] += 1
            points.setdefault(p.key, p)
            if p.key in pending:            # in flight for an earlier trial: share its result
                pending[p.key].append(trial)
                continue
            rec = store.records.get(p.key)
            if rec is not None and not (retry_failed and rec.get("status") == "failed" and p.key not in retried):
                if p.key in initial:
                    reused.add(p.key)
                tell(trial, rec)
                if on_record:
                    on_record(rec)
                continue
            retried.add(p.key)
            pending[p.key] = [trial]
            if p.config is None:
                land(p, _failed(p, p.error))
            elif hasattr(sub, "_ac"):
                sub.add(p)
            else:
                sub.submit(p)

    limit = runner.n_workers
    try:
        ask_more(limit)
        while sub.futures:
            if runner.client is None:
                p, rec = next(sub.results())
                land(p, rec)
                ask_more(limit)
                continue
            for p, rec in sub.results():
                land(p, rec)
                ask_more(limit)
            break
    except BaseException:
        sub.cancel()
        raise
    keys = [k for k in points if k in store.records]
    store.start(keys)   # the CSV in trial order, each point once
    recs = [store.records[k] for k in keys]
    return SweepResult(store.dir, recs, state["evaluated"], len(reused), state["skipped"], plan.space.swept)


def summary_line(res: SweepResult) -> str:
    ok = sum(r.get("status") == "ok" for r in res.records)
    fits = sum(r.get("status") == "ok" and r.get("fits") is not False for r in res.records)
    return (f"{len(res.records)} points: {ok} ok ({fits} fit), {res.failed} failed; {res.evaluated} run now, "
            f"{res.reused} reused" + (f", {res.skipped} excluded by constraints" if res.skipped else ""))


def _fmt_best(res: SweepResult) -> str:
    b = res.best
    if b is None:
        return "fastest that fits: none"
    cfg = b.get("config") or {}
    vals = ", ".join(f"{k}={cfg.get(k, b['params'].get(k))}" for k in res.params)
    return (f"fastest that fits: {vals}: {b['latency_ms']:.4g} ms, {b['cycles']} cycles, LUT {b.get('lut')}, "
            f"DSP {b.get('dsp')}, BRAM {b.get('bram')} (point {b['point']})")


# ---- command line ---------------------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("space", metavar="SPACE", help="TOML or JSON file: parameters and their values (docs/sweep.md)")
    p.add_argument("--model", action="append", required=True, metavar="M.onnx", help="model to compile and run "
                   "at every point (repeatable)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="results folder (a rerun resumes it)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="an existing Dask scheduler (tcp://host:port); default: "
                   "a local cluster")
    p.add_argument("--workers", type=int, metavar="N", help="local worker processes (default: one per core; "
                   "0: run in this process)")
    p.add_argument("--board", default="pynq-z1", metavar="B", help="board or part the resources are checked "
                   "against (default: %(default)s)")
    p.add_argument("--synth", default="estimate", choices=SYNTH, help="resources: the estimate, yosys, or none "
                   "(default: %(default)s)")
    p.add_argument("--driver", default="tsim", choices=DRIVERS, help="cycle source (default: %(default)s)")
    p.add_argument("--dram", metavar="NAME", help=f"DRAM timing preset of the driver: {', '.join(DRAM_PRESETS)} "
                                                  f"(docs/dram.md; default: default)")
    p.add_argument("--strategy", default="grid", metavar="S", help="grid, random:N or optuna:N (default: %(default)s)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=1x3x224x224",
                   help="static shape of a model input with symbolic dimensions (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of random and optuna strategies")
    p.add_argument("--retry-failed", action="store_true", help="run again the points that failed before")
    p.add_argument("--memory-limit", metavar="M", help="per local worker, e.g. 2GiB (default: Dask's auto)")
    p.add_argument("--no-plot", action="store_true", help="do not write pareto.png")
    p.set_defaults(func=main)


def main(args) -> int:
    """The CLI's handler: run, show a progress bar on a terminal, print the Pareto table."""
    verbose = logging.getLogger().level < logging.WARNING
    # Dask reads its logging levels when distributed is first imported (here, and in each worker)
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "info" if verbose else "warning")
    space = load_space(args.space)
    shapes = {}
    for spec in args.shape:
        name, eq, dims = spec.partition("=")
        if not eq or not name:
            raise SweepError(f"--shape {spec!r}: use NAME=1x3x224x224")
        shapes[name] = parse_shape(dims, f"--shape {spec}")
    bar = {"bar": None}
    tty = sys.stderr.isatty() and not getattr(args, "quiet", False)

    def on_start(n):
        if tty and n:
            try:
                from tqdm import tqdm  # noqa: PLC0415 - the bar is optional: a sweep runs without tqdm
                bar["bar"] = tqdm(total=n, unit="point", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def on_record(rec):
        if bar["bar"] is not None:
            bar["bar"].update(1)
            if bar["bar"].n >= bar["bar"].total:   # the plot and table follow: stop the clock
                bar["bar"].close()
            if rec.get("status") == "failed":
                bar["bar"].write(f"failed {rec['point']}: {rec.get('error')}")
        elif rec.get("status") == "failed":
            log.info("point %s failed: %s", rec["point"], rec.get("error"))

    try:
        res = run_sweep(space, args.model, args.output, scheduler=args.scheduler, workers=args.workers,
                        board=args.board, synth=args.synth, driver=args.driver, strategy=args.strategy,
                        seed=args.seed, retry_failed=args.retry_failed, memory_limit=args.memory_limit,
                        shapes=shapes, dram=args.dram,
                        on_start=on_start, on_record=on_record, plot=not args.no_plot)
    except KeyboardInterrupt:
        if bar["bar"] is not None:
            bar["bar"].close()
        print(f"interrupted: finished points are in {Path(args.output) / 'results.csv'}; rerun to resume",
              file=sys.stderr)
        return 130
    finally:
        if bar["bar"] is not None:
            bar["bar"].close()
    print(summary_line(res))
    print(pareto.table(res.records, res.params))
    print(_fmt_best(res))
    print(f"results: {res.out_dir / 'results.csv'}, {res.out_dir / 'results.jsonl'}"
          + (f", plot: {res.plot}" if res.plot else ""))
    return 0


__all__ = ["SweepResult", "kit_version", "load_models", "parse_strategy", "run_sweep", "summary_line"]
