"""One counter schema for the timing executors (tsim, rtl), and their exports: JSON, a Chrome/Perfetto
trace (one track per stage, one slice per instruction, plus the DRAM read bursts) and a timeline PNG.

    counters = Counters.from_hw(cfg, hw, insns)     # hw: the RTL's counter registers (regs.COUNTERS)
    counters.to_dict()                              # cycles, per stage busy/stall_token/stall_queue, ...
    write_perfetto(path, cfg, counters, timeline)   # open in ui.perfetto.dev or chrome://tracing
    write_timeline_png(path, cfg, counters, timeline)
    layers = model_layers(executor.profile, executor.results, cfg.clock_mhz)   # a compiled model's run:
    write_model_perfetto(path, cfg, layers); write_model_timeline_png(...); model_counters_table(layers)

Per stage: busy = cycles holding an instruction and not stalled (its pop cycle, EXEC, its retire
cycle); stall_token = cycles waiting for a dependency token to pop, or for space to push one;
stall_queue = the rest: no instruction to work on (command queue empty, including before the
first and after the last instruction). macs counts non-reset GEMM micro-ops x the core's MACs
(from the program's loop bounds); gemm_utilization = macs / (cycles x peak MACs per cycle); gops is
2 x macs per second at the config's clock. DRAM bytes are whole bus beats, instruction fetch included.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from accel.isa import AccelConfig, Gemm, Insn, decode_program, disassemble
from accel.isa.errors import EncodingError
from accel.isa.files import write_atomic
from accel.isa.isa import INSN_BYTES

from .errors import ExecError, SimError
from .tsim import stage_of

log = logging.getLogger(__name__)

SCHEMA = "accel-counters/1"
STAGES = ("load", "compute", "store")
READ_CLIENTS = ("fetch", "load", "compute")   # accel/hw/top.py READ_CLIENTS (ARID order)


def program_at(cfg: AccelConfig, dram: np.ndarray, insn_addr: int, insn_count: int) -> list[Insn]:
    """Decode the program a driver is asked to run, with the functional simulator's checks."""
    if dram.dtype != np.uint8 or dram.ndim != 1:
        raise SimError(f"DRAM must be a 1-D uint8 array, got {dram.dtype} with shape {dram.shape}")
    end = insn_addr + insn_count * INSN_BYTES
    if insn_addr < 0 or insn_count < 0 or end > dram.size:
        raise ExecError(f"instruction stream [{insn_addr:#x}, {end:#x}) lies outside the {dram.size}-byte DRAM")
    try:
        return decode_program(dram[insn_addr:end].tobytes(), cfg)
    except EncodingError as e:
        raise ExecError(f"cannot decode the program: {e}") from None


def program_macs(cfg: AccelConfig, insns: list[Insn]) -> int:
    """MACs of the program's non-reset GEMM micro-ops."""
    n = 0
    for i in insns:
        if isinstance(i, Gemm) and not i.reset and i.uop_end > i.uop_bgn:
            n += (i.uop_end - i.uop_bgn) * i.iter_out * i.iter_in
    return n * cfg.macs_per_cycle


@dataclass
class StageCounters:
    busy: int = 0
    stall_token: int = 0
    stall_queue: int = 0

    def to_dict(self) -> dict:
        return {"busy": self.busy, "stall_token": self.stall_token, "stall_queue": self.stall_queue}


@dataclass
class Counters:
    """The counters of one run on a timing executor (same fields from tsim and rtl)."""
    cycles: int
    clock_mhz: float
    macs_per_cycle: int
    stages: dict[str, StageCounters]
    gemm_uops: int
    alu_uops: int
    macs: int
    bytes_read: int
    bytes_written: int
    insns: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_hw(cls, cfg: AccelConfig, hw: dict[str, int], insns: list[Insn]) -> "Counters":
        """From the RTL's counter registers (accel/hw/regs.py COUNTERS; tsim produces the same names)."""
        cyc = hw["cycles"]
        stages = {s: StageCounters(hw[f"{s}_busy"], hw[f"{s}_stall"], cyc - hw[f"{s}_busy"] - hw[f"{s}_stall"])
                  for s in STAGES}
        by_op: dict = {}
        for i in insns:          # by the enum member, named once each (an enum's .name costs ~1 us)
            by_op[i.opcode] = by_op.get(i.opcode, 0) + 1
        counts = {op.name: n for op, n in by_op.items()}
        return cls(cycles=cyc, clock_mhz=cfg.clock_mhz, macs_per_cycle=cfg.macs_per_cycle, stages=stages,
                   gemm_uops=hw["gemm_uops"], alu_uops=hw["alu_uops"], macs=program_macs(cfg, insns),
                   bytes_read=hw["bytes_read"], bytes_written=hw["bytes_written"], insns=counts)

    @property
    def seconds(self) -> float:
        return self.cycles / (self.clock_mhz * 1e6)

    @property
    def gemm_utilization(self) -> float:
        return self.macs / (self.cycles * self.macs_per_cycle) if self.cycles else 0.0

    @property
    def gops(self) -> float:
        return 2 * self.macs / self.seconds / 1e9 if self.cycles else 0.0

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "cycles": self.cycles, "clock_mhz": self.clock_mhz,
                "stages": {s: c.to_dict() for s, c in self.stages.items()},
                "gemm_uops": self.gemm_uops, "alu_uops": self.alu_uops, "macs": self.macs,
                "macs_per_cycle": self.macs_per_cycle,
                "gemm_utilization": round(self.gemm_utilization, 6),
                "dram_bytes": {"read": self.bytes_read, "written": self.bytes_written},
                "seconds": self.seconds, "gops": round(self.gops, 6), "insns": dict(self.insns)}

    def table(self) -> str:
        """Human-readable summary (the CLI's --counters)."""
        w = max(1, self.cycles)
        lines = [f"cycles {self.cycles} ({self.seconds * 1e6:.2f} us at {self.clock_mhz:g} MHz)",
                 f"{'stage':<8} {'busy':>10} {'stall_token':>12} {'stall_queue':>12}"]
        for s, c in self.stages.items():
            lines.append(f"{s:<8} {c.busy:>10} {c.stall_token:>12} {c.stall_queue:>12}   "
                         f"({100 * c.busy / w:.1f}% busy)")
        lines.append(f"GEMM micro-ops {self.gemm_uops}, ALU micro-ops {self.alu_uops}, MACs {self.macs}: "
                     f"utilization {100 * self.gemm_utilization:.1f}% of {self.macs_per_cycle} MACs/cycle, "
                     f"{self.gops:.3f} GOPS")
        lines.append(f"DRAM bytes read {self.bytes_read}, written {self.bytes_written}")
        return "\n".join(lines)


@dataclass
class Slice:
    stage: str
    index: int        # instruction index in the program
    opcode: str
    start: int        # cycle the stage took the instruction (with its tokens)
    end: int          # cycle after it retired (pushed its tokens)


@dataclass
class Timeline:
    slices: list[Slice]
    bursts: list[tuple[str, int, int]] = field(default_factory=list)   # (read client, AR cycle, RLAST cycle)

    @classmethod
    def from_spans(cls, insns: list[Insn], spans, bursts=None) -> "Timeline":
        """spans: (stage index, start, end) in retire order per stage (rtl), or (stage, insn, start, end)."""
        per = {0: [], 1: [], 2: []}
        for i, insn in enumerate(insns):
            per[int(stage_of(insn))].append(i)
        nxt = {0: 0, 1: 0, 2: 0}
        out = []
        for sp in spans:
            if len(sp) == 3:
                s, a, b = sp
                if nxt[s] >= len(per[s]):
                    continue
                idx = per[s][nxt[s]]
                nxt[s] += 1
            else:
                s, idx, a, b = sp
            out.append(Slice(STAGES[s], idx, insns[idx].opcode.name, int(a), int(b)))
        out.sort(key=lambda x: (x.start, x.stage))
        return cls(out, [(READ_CLIENTS[c], int(a), int(b)) for c, a, b in (bursts or [])])


@dataclass
class TimingRun:
    """RunResult.raw of the timing drivers: the counters and, when traced, the timeline."""
    counters: Counters
    timeline: Timeline | None = None
    model_in_helper: bool = False       # tsim: the timing model ran in sim/tsim/helper.py's process


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        write_atomic(path, data)
    except OSError as e:
        raise SimError(f"cannot write {path}: {e.strerror}") from None


def _save_png(fig, path: str | Path) -> None:
    """Lay out, write atomically (a temporary file renamed into place) and close a figure."""
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib loads only to draw a plot
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.png")
    try:
        fig.savefig(tmp, dpi=110)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SimError(f"cannot write {path}: {e.strerror}") from None
    finally:
        plt.close(fig)


def write_counters(path: str | Path, counters: Counters, driver: str | None = None) -> None:
    d = counters.to_dict()
    if driver:
        d["driver"] = driver
    _write_atomic(Path(path), (json.dumps(d, indent=2) + "\n").encode())


def perfetto(cfg: AccelConfig, counters: Counters, timeline: Timeline, insns: list[Insn] | None = None,
             driver: str | None = None) -> dict:
    """Chrome trace-event JSON: process 'accelerator', one thread (track) per stage and one for the
    read bus; timestamps in microseconds at the config's clock, cycles in each slice's args."""
    us = 1.0 / cfg.clock_mhz
    text = disassemble(insns).splitlines() if insns is not None else None
    ev = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"accelerator ({driver or 'timing'})"}}]
    tracks = list(STAGES) + ["dram read"]
    for tid, name in enumerate(tracks):
        ev.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}})
        ev.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    for s in timeline.slices:
        args = {"insn": s.index, "start_cycle": s.start, "end_cycle": s.end}
        if text is not None:
            args["asm"] = text[s.index]
        ev.append({"ph": "X", "pid": 1, "tid": STAGES.index(s.stage), "name": s.opcode, "ts": s.start * us,
                   "dur": (s.end - s.start) * us, "args": args})
    for client, a, b in timeline.bursts:
        ev.append({"ph": "X", "pid": 1, "tid": len(STAGES), "name": client, "ts": a * us, "dur": (b - a + 1) * us,
                   "args": {"ar_cycle": a, "rlast_cycle": b}})
    return {"traceEvents": ev, "displayTimeUnit": "ns",
            "metadata": {"counters": counters.to_dict(), "config": cfg.to_dict(), "driver": driver}}


def write_perfetto(path: str | Path, cfg: AccelConfig, counters: Counters, timeline: Timeline,
                   insns: list[Insn] | None = None, driver: str | None = None) -> None:
    _write_atomic(Path(path), json.dumps(perfetto(cfg, counters, timeline, insns, driver)).encode())


OPCODE_COLORS = {"LOAD": "tab:blue", "GEMM": "tab:red", "ALU": "tab:orange", "STORE": "tab:green",
                 "FINISH": "black"}


def write_timeline_png(path: str | Path, cfg: AccelConfig, counters: Counters, timeline: Timeline,
                       title: str | None = None) -> None:
    """A Gantt chart: one row per stage (slices coloured by opcode) and one for the read bus."""
    import matplotlib  # noqa: PLC0415 - matplotlib loads only to draw a plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib loads only to draw a plot
    from matplotlib.patches import Patch  # noqa: PLC0415 - matplotlib loads only to draw a plot
    rows = list(STAGES) + ["dram read"]
    fig, ax = plt.subplots(figsize=(12, 3.2))
    for r, stage in enumerate(STAGES):
        by_op: dict[str, list] = {}
        for s in timeline.slices:
            if s.stage == stage:
                by_op.setdefault(s.opcode, []).append((s.start, max(1, s.end - s.start)))
        for op, bars in by_op.items():
            ax.broken_barh(bars, (r - 0.4, 0.8), facecolors=OPCODE_COLORS.get(op, "gray"), edgecolor="white", linewidth=0.3)
    client_colors = {"fetch": "tab:gray", "load": "tab:blue", "compute": "tab:purple"}
    by_client: dict[str, list] = {}
    for c, a, b in timeline.bursts:
        by_client.setdefault(c, []).append((a, b - a + 1))
    for c, bars in by_client.items():
        ax.broken_barh(bars, (len(STAGES) - 0.4, 0.8), facecolors=client_colors.get(c, "gray"), linewidth=0)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlim(0, max(1, counters.cycles))
    ax.set_xlabel("cycle")
    ax.set_title(title or f"{counters.cycles} cycles, GEMM utilization {100 * counters.gemm_utilization:.1f}%, "
                          f"{counters.gops:.2f} GOPS at {cfg.clock_mhz:g} MHz")
    handles = [Patch(color=c, label=o) for o, c in OPCODE_COLORS.items()]
    handles += [Patch(color=c, label=f"read: {n}") for n, c in client_colors.items()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=len(handles), fontsize=8,
              frameon=False)
    _save_png(fig, path)


# ---- compiled models: one span per layer ------------------------------------------------------------
MODEL_SCHEMA = "accel-model-counters/1"


def sum_counters(parts: list[Counters]) -> Counters:
    """The counters of runs made one after the other (a model's layers): every count adds up."""
    if not parts:
        raise SimError("no accelerator runs to total")
    first = parts[0]
    stages = {s: StageCounters(sum(p.stages[s].busy for p in parts), sum(p.stages[s].stall_token for p in parts),
                               sum(p.stages[s].stall_queue for p in parts)) for s in first.stages}
    insns: dict[str, int] = {}
    for p in parts:
        for k, v in p.insns.items():
            insns[k] = insns.get(k, 0) + v
    return Counters(cycles=sum(p.cycles for p in parts), clock_mhz=first.clock_mhz,
                    macs_per_cycle=first.macs_per_cycle, stages=stages,
                    gemm_uops=sum(p.gemm_uops for p in parts), alu_uops=sum(p.alu_uops for p in parts),
                    macs=sum(p.macs for p in parts), bytes_read=sum(p.bytes_read for p in parts),
                    bytes_written=sum(p.bytes_written for p in parts), insns=insns)


@dataclass
class LayerRun:
    """One step of a compiled model on the model's time axis. Accelerator steps last their cycles at
    the config's clock and carry their counters (and timeline when traced); CPU steps last the wall
    time this host measured for them (a stand-in for the board's CPU)."""
    name: str
    op: str
    target: str
    impl: str
    start_us: float
    dur_us: float
    start_cycle: int = 0                # accelerator cycles of the layers before this one
    counters: Counters | None = None
    timeline: Timeline | None = None
    note: str = ""


def model_layers(rows: list[dict], results: list, clock_mhz: float) -> list[LayerRun]:
    """LayerRuns of one model run: `rows` an executor's profile, `results` its per-step RunResults
    (None for CPU steps; a timing driver's raw is a TimingRun)."""
    if len(rows) != len(results):
        raise SimError(f"profile has {len(rows)} steps but {len(results)} run results")
    out, t, cyc = [], 0.0, 0
    for row, res in zip(rows, results):
        raw = getattr(res, "raw", None)
        counters = getattr(raw, "counters", None)
        if row["target"] == "accel" and counters is None:
            raise SimError(f"step '{row['name']}' ran on driver {getattr(res, 'driver', None)!r}, which reports no "
                           f"cycle counters; use a timing driver (tsim or rtl)")
        dur = counters.cycles / clock_mhz if counters is not None else row["time_s"] * 1e6
        out.append(LayerRun(row["name"], row["op"], row["target"], row.get("impl", ""), t, dur, cyc, counters,
                            getattr(raw, "timeline", None), row.get("note", "")))
        t += dur
        cyc += counters.cycles if counters is not None else 0
    return out


def model_counters(layers: list[LayerRun], driver: str | None = None, model: str | None = None) -> dict:
    """Per accelerator layer its counters (Counters.to_dict) and start cycle, the CPU steps' wall times,
    and the total over the layers."""
    acc = [lr for lr in layers if lr.counters is not None]
    return {"schema": MODEL_SCHEMA, "model": model, "driver": driver,
            "layers": [{"name": lr.name, "op": lr.op, "start_cycle": lr.start_cycle, "counters": lr.counters.to_dict()}
                       for lr in acc],
            "cpu_steps": [{"name": lr.name, "op": lr.op, "impl": lr.impl, "time_s": lr.dur_us * 1e-6, "note": lr.note}
                          for lr in layers if lr.counters is None],
            "total": sum_counters([lr.counters for lr in acc]).to_dict() if acc else None}


def model_counters_table(layers: list[LayerRun]) -> str:
    """Text: one row per accelerator layer (cycles, stage busy shares, GEMM utilization, DRAM bytes),
    the total row, then the total's Counters.table()."""
    acc = [lr for lr in layers if lr.counters is not None]
    if not acc:
        return "no accelerator steps (every step ran on the CPU)"
    w = min(40, max(len("layer"), *(len(lr.name) for lr in acc)))
    lines = [f"{'layer':{w}} {'op':20} {'cycles':>10} {'load':>6} {'compute':>8} {'store':>6} {'util':>6} "
             f"{'MACs':>11} {'read B':>10} {'written B':>10}"]

    def row(name, op, c):
        busy = {s: 100 * c.stages[s].busy / max(1, c.cycles) for s in STAGES}
        return (f"{name[:w]:{w}} {op[:20]:20} {c.cycles:>10} {busy['load']:>5.0f}% {busy['compute']:>7.0f}% "
                f"{busy['store']:>5.0f}% {100 * c.gemm_utilization:>5.1f}% {c.macs:>11} {c.bytes_read:>10} "
                f"{c.bytes_written:>10}")
    lines += [row(lr.name, lr.op, lr.counters) for lr in acc]
    total = sum_counters([lr.counters for lr in acc])
    lines.append(row("total", f"{len(acc)} layers", total))
    cpu = [lr for lr in layers if lr.counters is None]
    if cpu:
        lines.append(f"(+ {len(cpu)} CPU steps, {sum(lr.dur_us for lr in cpu) / 1e3:.3f} ms on this host)")
    return "\n".join(lines) + "\n" + total.table()


def model_perfetto(cfg: AccelConfig, layers: list[LayerRun], driver: str | None = None,
                   model: str | None = None) -> dict:
    """Chrome trace-event JSON of a model run: process 'model' with one track of named layer spans (every
    step, accelerator and CPU), process 'accelerator' with one track per stage and the read bus, its
    instruction slices placed at their layer's start. Times in microseconds (see LayerRun)."""
    us = 1.0 / cfg.clock_mhz
    ev = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"model {model or ''}".strip()}},
          {"ph": "M", "pid": 1, "tid": 0, "name": "thread_name", "args": {"name": "layers"}},
          {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": f"accelerator ({driver or 'timing'})"}}]
    tracks = list(STAGES) + ["dram read"]
    for tid, name in enumerate(tracks):
        ev.append({"ph": "M", "pid": 2, "tid": tid, "name": "thread_name", "args": {"name": name}})
        ev.append({"ph": "M", "pid": 2, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    for k, lr in enumerate(layers):
        args = {"step": k, "op": lr.op, "target": lr.target, "impl": lr.impl}
        if lr.counters is not None:
            args.update(start_cycle=lr.start_cycle, counters=lr.counters.to_dict())
        else:
            args["host_time_s"] = lr.dur_us * 1e-6
        if lr.note:
            args["why_cpu"] = lr.note
        ev.append({"ph": "X", "pid": 1, "tid": 0, "name": lr.name, "cat": lr.target, "ts": lr.start_us,
                   "dur": lr.dur_us, "args": args})
        if lr.timeline is None:
            continue
        for s in lr.timeline.slices:
            ev.append({"ph": "X", "pid": 2, "tid": STAGES.index(s.stage), "name": s.opcode,
                       "ts": lr.start_us + s.start * us, "dur": (s.end - s.start) * us,
                       "args": {"layer": lr.name, "insn": s.index, "start_cycle": lr.start_cycle + s.start,
                                "end_cycle": lr.start_cycle + s.end}})
        for client, a, b in lr.timeline.bursts:
            ev.append({"ph": "X", "pid": 2, "tid": len(STAGES), "name": client, "ts": lr.start_us + a * us,
                       "dur": (b - a + 1) * us, "args": {"layer": lr.name}})
    return {"traceEvents": ev, "displayTimeUnit": "ns",
            "metadata": {"counters": model_counters(layers, driver, model), "config": cfg.to_dict(), "driver": driver,
                         "time_axis": "accelerator steps: cycles at the config's clock; CPU steps: wall time "
                                      "measured on the simulating host"}}


def write_model_perfetto(path: str | Path, cfg: AccelConfig, layers: list[LayerRun], driver: str | None = None,
                         model: str | None = None) -> None:
    _write_atomic(Path(path), json.dumps(model_perfetto(cfg, layers, driver, model)).encode())


def write_model_counters(path: str | Path, layers: list[LayerRun], driver: str | None = None,
                         model: str | None = None) -> None:
    _write_atomic(Path(path), (json.dumps(model_counters(layers, driver, model), indent=2) + "\n").encode())


def write_model_timeline_png(path: str | Path, cfg: AccelConfig, layers: list[LayerRun], title: str | None = None) -> None:
    """A Gantt chart of a model run: a row of named layer spans (accelerator and CPU), then the stages'
    instruction slices (coloured by opcode) and the read bus, on one time axis in microseconds."""
    import matplotlib  # noqa: PLC0415 - matplotlib loads only to draw a plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib loads only to draw a plot
    from matplotlib.patches import Patch  # noqa: PLC0415 - matplotlib loads only to draw a plot
    us = 1.0 / cfg.clock_mhz
    rows = ["layers"] + list(STAGES) + ["dram read"]
    end = max([lr.start_us + lr.dur_us for lr in layers] + [1e-3])
    fig, ax = plt.subplots(figsize=(14, 3.8))
    target_colors = {"accel": "tab:brown", "cpu": "silver"}
    for lr in layers:
        ax.broken_barh([(lr.start_us, max(lr.dur_us, end * 1e-4))], (-0.4, 0.8),
                       facecolors=target_colors.get(lr.target, "tab:gray"), edgecolor="white", linewidth=0.5)
        if lr.dur_us > end / 40:   # label the spans wide enough to hold a name
            ax.text(lr.start_us + lr.dur_us / 2, 0, lr.name, ha="center", va="center", fontsize=7, color="white",
                    clip_on=True)
    for r, stage in enumerate(STAGES, start=1):
        by_op: dict[str, list] = {}
        for lr in layers:
            for s in (lr.timeline.slices if lr.timeline is not None else []):
                if s.stage == stage:
                    by_op.setdefault(s.opcode, []).append((lr.start_us + s.start * us, max(1, s.end - s.start) * us))
        for op, bars in by_op.items():
            ax.broken_barh(bars, (r - 0.4, 0.8), facecolors=OPCODE_COLORS.get(op, "gray"), linewidth=0)
    client_colors = {"fetch": "tab:gray", "load": "tab:blue", "compute": "tab:purple"}
    by_client: dict[str, list] = {}
    for lr in layers:
        for c, a, b in (lr.timeline.bursts if lr.timeline is not None else []):
            by_client.setdefault(c, []).append((lr.start_us + a * us, (b - a + 1) * us))
    for c, bars in by_client.items():
        ax.broken_barh(bars, (len(rows) - 1 - 0.4, 0.8), facecolors=client_colors.get(c, "gray"), linewidth=0)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlim(0, end)
    ax.set_xlabel("time (us): accelerator cycles at the config's clock, CPU steps as measured on this host")
    acc = [lr.counters for lr in layers if lr.counters is not None]
    if title is None and acc:
        t = sum_counters(acc)
        title = f"{len(layers)} steps, {t.cycles} accelerator cycles, GEMM utilization {100 * t.gemm_utilization:.1f}%"
    ax.set_title(title or f"{len(layers)} steps")
    handles = [Patch(color=c, label=f"{t} layer") for t, c in target_colors.items()]
    handles += [Patch(color=c, label=o) for o, c in OPCODE_COLORS.items()]
    handles += [Patch(color=c, label=f"read: {n}") for n, c in client_colors.items()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=len(handles), fontsize=8,
              frameon=False)
    _save_png(fig, path)
