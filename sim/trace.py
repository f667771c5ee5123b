"""One counter schema for the timing executors (tsim, rtl), and their exports: JSON, a Chrome/Perfetto
trace (one track per stage, one slice per instruction, plus the DRAM read bursts) and a timeline PNG.

    counters = Counters.from_hw(cfg, hw, insns)     # hw: the RTL's counter registers (regs.COUNTERS)
    counters.to_dict()                              # cycles, per stage busy/stall_token/stall_queue, ...
    write_perfetto(path, cfg, counters, timeline)   # open in ui.perfetto.dev or chrome://tracing
    write_timeline_png(path, cfg, counters, timeline)

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

from accel.isa import AccelConfig, Gemm, Insn, decode_program
from accel.isa.errors import EncodingError
from accel.isa.isa import INSN_BYTES

from .errors import ExecError, SimError

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
        from .tsim import stage_of
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
    from accel.isa.files import write_atomic
    try:
        write_atomic(path, data)
    except OSError as e:
        raise SimError(f"cannot write {path}: {e.strerror}") from None


def write_counters(path: str | Path, counters: Counters, driver: str | None = None) -> None:
    d = counters.to_dict()
    if driver:
        d["driver"] = driver
    _write_atomic(Path(path), (json.dumps(d, indent=2) + "\n").encode())


def perfetto(cfg: AccelConfig, counters: Counters, timeline: Timeline, insns: list[Insn] | None = None,
             driver: str | None = None) -> dict:
    """Chrome trace-event JSON: process 'accelerator', one thread (track) per stage and one for the
    read bus; timestamps in microseconds at the config's clock, cycles in each slice's args."""
    from accel.isa import disassemble
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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
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
