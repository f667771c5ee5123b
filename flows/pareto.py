"""Pareto fronts of a sweep's results: latency against resources, as a table and as pareto.png.

Only comparable points compete: status ok, fits the part, and offloading (within 1%) as many MACs
to the accelerator as the best point does (a config whose layers the partitioner leaves on the CPU
has fewer accelerator cycles without being faster).
"""
from __future__ import annotations

import io
import logging
from pathlib import Path

from accel.isa.files import write_atomic

log = logging.getLogger(__name__)


OFFLOAD_TOLERANCE = 0.01
"""A point competes when it offloads at least (1 - this) of the best point's accelerator MACs."""


def candidates(records: list[dict]) -> list[dict]:
    ok = [r for r in records if r.get("status") == "ok" and r.get("latency_ms") is not None]
    if not ok:
        return []
    most = max(r.get("accel_macs") or 0 for r in ok)
    if not most:   # nothing ran on the accelerator: zero cycles are not a speed
        return []
    return [r for r in ok if r.get("fits") is not False
            and (r.get("accel_macs") or 0) >= (1 - OFFLOAD_TOLERANCE) * most]


def front(records: list[dict], keys: tuple[str, ...] = ("latency_ms", "lut", "dsp")) -> list[dict]:
    """Points no other point beats or equals on every key while beating on one (all minimized)."""
    pts = [r for r in candidates(records) if all(r.get(k) is not None for k in keys)]
    out = []
    for r in pts:
        v = [r[k] for k in keys]
        dominated = any(all(o[k] <= x for k, x in zip(keys, v)) and any(o[k] < x for k, x in zip(keys, v))
                        for o in pts if o is not r)
        if not dominated:
            out.append(r)
    # one row per distinct objective vector (equal points: the first)
    seen, uniq = set(), []
    for r in sorted(out, key=lambda r: tuple(r[k] for k in keys)):
        t = tuple(r[k] for k in keys)
        if t not in seen:
            seen.add(t)
            uniq.append(r)
    return uniq


def best(records: list[dict]) -> dict | None:
    """The fastest point that fits (ties: fewer LUTs)."""
    c = candidates(records)
    return min(c, key=lambda r: (r["latency_ms"], r.get("lut") or 0)) if c else None


def table(records: list[dict], params: list[str]) -> str:
    """The Pareto points (latency, LUT, DSP) as a text table, fastest first."""
    rows = front(records) or front(records, ("latency_ms",))
    if not rows:
        ok = [r for r in records if r.get("status") == "ok"]
        if ok and not any(r.get("accel_macs") for r in ok):
            return ("no point ran a layer on the accelerator (the partitioner left every conv/dense on the CPU: "
                    "see cpu_macs; [compile] force = {MatMul = \"accel\"} in the space file overrides soft declines)")
        return "no point finished ok and fits the part"
    cols = [*params, "latency_ms", "cycles", "lut", "dsp", "bram", "energy_uj", "point"]
    cells = [[_fmt((r.get("config") or r.get("params", {})).get(c, r.get(c)) if c in params else r.get(c))
              for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)[:12]


def plot(records: list[dict], path: str | Path, title: str = "") -> Path | None:
    """pareto.png: latency against LUT and against DSP; the front of each marked."""
    import matplotlib  # noqa: PLC0415 - matplotlib loads only to draw a plot
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib loads only to draw a plot

    ok = [r for r in records if r.get("status") == "ok" and r.get("latency_ms") is not None]
    if not ok:
        log.info("no finished point to plot")
        return None
    cand = {id(r) for r in candidates(records)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True)
    for ax, res in zip(axes, ("lut", "dsp")):
        have = [r for r in ok if r.get(res) is not None]
        if not have:
            ax.text(0.5, 0.5, f"no {res.upper()} figures (--synth none)", ha="center", transform=ax.transAxes)
            continue
        fit = [r for r in have if id(r) in cand]
        nofit = [r for r in have if r.get("fits") is False]
        less = [r for r in have if id(r) not in cand and r.get("fits") is not False]
        if nofit:
            ax.scatter([r[res] for r in nofit], [r["latency_ms"] for r in nofit], marker="x", c="tab:red",
                       label="does not fit the part", alpha=0.7)
        if less:
            ax.scatter([r[res] for r in less], [r["latency_ms"] for r in less], marker="^", c="tab:orange",
                       label="leaves more MACs on the CPU", alpha=0.7)
        if fit:
            ax.scatter([r[res] for r in fit], [r["latency_ms"] for r in fit], c="tab:gray", label="fits", alpha=0.7)
        f = front(records, ("latency_ms", res))
        if f:
            f = sorted(f, key=lambda r: r[res])
            ax.step([r[res] for r in f], [r["latency_ms"] for r in f], where="post", c="tab:blue")
            ax.scatter([r[res] for r in f], [r["latency_ms"] for r in f], c="tab:blue", marker="*", s=120,
                       label="Pareto front", zorder=3)
        ax.set_xlabel(res.upper())
        ax.set_ylabel("latency (ms)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
    return Path(path)
