"""Synthesis figures: per preset LUT, FF, DSP, BRAM (yosys, xc7z020), the share of the part each
takes, Fmax (nextpnr after routing on ECP5; on xc7 the longest path of yosys' sta, cell delays
without routing; the estimator's figure where neither ran, labelled as such) and GOPS at it;
ECP5 place and route of the largest configuration that fits an LFE5U-85F; the estimator's error
on each; the tool run times.

    python bench/synth_report.py [--out bench/results] [--no-ecp5] [--ecp5-config NAME|FILE]
                                 [--configs tiny,default] [--no-sta] [--docs docs/fpga.md]
    python bench/synth_report.py --from-json bench/results/synth_report.json --docs docs/fpga.md

Every synthesis goes through the cache of accel.hw.fpga.calibrate (keyed by the Verilog, family,
part and options): a rerun with unchanged RTL costs nothing, and "cached": true marks figures
whose run times come from the original run. The largest ECP5 configuration is chosen with the
estimator (most MACs, then the largest buffers; LUTs and FFs within 90% of the part) and confirmed by
place and route; if the routed design does not fit, the next candidate is tried.
Writes <out>/synth_report.json, prints a table, and with --docs replaces the table between the
markers `<!-- synth_report:begin -->` and `<!-- synth_report:end -->` of that Markdown file, so
the reference figures in the docs are generated, never typed. --from-json regenerates the table
from a saved report without synthesizing.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from accel.hw.boards import part  # noqa: E402
from accel.hw.fpga.calibrate import cached_synthesize  # noqa: E402
from accel.hw.fpga.errors import FpgaError  # noqa: E402
from accel.hw.fpga.estimate import estimate  # noqa: E402
from accel.hw.fpga.estimate_timing import path_estimate  # noqa: E402
from accel.hw.fpga.rtl import family_config, rtl_for_config  # noqa: E402
from accel.isa import PRESETS, AccelConfig, ConfigError, resolve_config  # noqa: E402

KiB = 1024
XC7_CONFIGS = ("tiny", "pynq-z1", "default")
ECP5_PART = "LFE5U-85F-6BG381C"
HEADROOM = {"lut": 0.90, "ff": 0.90, "dsp": 1.0, "bram": 1.0}  # share of each resource a candidate may
# take by estimate: logic keeps 10% for routing; DSPs and block RAMs can be used up


def estimator_error(cfg: AccelConfig, family: str, rep: dict) -> dict:
    e = estimate(cfg, family, part(rep["part"]))
    y = rep["utilization"]
    out = {"estimate": {k: e.utilization[k] for k in ("lut", "ff", "dsp", "bram")}}
    out["error_pct"] = {k: round(100.0 * (e.utilization[k] - y[k]) / y[k], 1) if y[k] else 0.0
                        for k in ("lut", "ff", "dsp", "bram")}
    if rep.get("timing") and rep["timing"].get("fmax_mhz") and e.fmax_mhz:
        out["fmax_estimate_mhz"] = e.fmax_mhz
        out["error_pct"]["fmax"] = round(100.0 * (e.fmax_mhz - rep["timing"]["fmax_mhz"]) / rep["timing"]["fmax_mhz"], 1)
    return out


RESOURCES = ("lut", "ff", "dsp", "bram")
DOCS_BEGIN, DOCS_END = "<!-- synth_report:begin -->", "<!-- synth_report:end -->"


STA_SOURCE = "yosys sta after synth_xilinx (cell delays, no routing)"


def sta_of(cfg: AccelConfig, rep: dict, timeout: float | None) -> dict | None:
    """The longest path yosys' sta finds for a 7-series report (accel/hw/fpga/estimate_timing.py),
    kept beside the cached synthesis so a rerun costs nothing; None when yosys cannot run it."""
    out = Path(rep["out_dir"]) / "sta"
    done = out / "path.json"
    if done.exists():
        d = json.loads(done.read_text())
        return {"fmax_mhz": d["fmax_mhz"], "path_ns": d["path_ns"], "cached": True}
    try:
        rtl = rtl_for_config(cfg, out)
        est = path_estimate(out / rtl.file_name, rtl.top, out, timeout)
    except FpgaError as e:
        print(f"  sta: {e}", flush=True)
        return None
    return {"fmax_mhz": est.fmax_mhz, "path_ns": est.path_ns, "cached": False}


def fmax_of(cfg: AccelConfig, rep: dict) -> tuple[float | None, str]:
    """(Fmax in MHz, where it comes from): nextpnr's routed figure, else yosys' sta path (xc7),
    else the estimator's (for Xilinx parts an uncalibrated factor on the ECP5 fit)."""
    t = rep.get("timing") or {}
    if t.get("fmax_mhz"):
        return float(t["fmax_mhz"]), t.get("source", "synthesis timing")
    sta = rep.get("sta") or {}
    if sta.get("fmax_mhz"):
        return float(sta["fmax_mhz"]), STA_SOURCE
    e = estimate(cfg, rep["family"], part(rep["part"]))
    if e.fmax_mhz:
        return float(e.fmax_mhz), f"estimate ({e.fmax_basis})"
    return None, "none"


def summary(name: str, cfg: AccelConfig, rep: dict) -> dict:
    fmax, fmax_source = fmax_of(cfg, rep)
    return {"config": name, "config_digest": cfg.digest(), "part": rep["part"], "family": rep["family"],
            "fmax_mhz": fmax, "fmax_source": fmax_source, "macs_per_cycle": cfg.macs_per_cycle,
            "gops_at_fmax": round(2 * cfg.macs_per_cycle * fmax / 1000.0, 2) if fmax else None,
            "utilization_pct": {k: rep["fit"]["resources"][k]["percent"] for k in RESOURCES
                                if k in rep["fit"]["resources"]},
            "utilization": {k: rep["utilization"][k] for k in ("lut", "ff", "dsp", "bram", "lutram")},
            "fit": {"fits": rep["fit"]["fits"], "limiting": rep["fit"]["limiting"],
                    "percent": {k: r["percent"] for k, r in rep["fit"]["resources"].items()},
                    "margin": {k: r["margin"] for k, r in rep["fit"]["resources"].items()}},
            "timing": rep.get("timing"), "placed": (rep.get("pnr") or {}).get("utilization"),
            "tool_seconds": {k: v["seconds"] for k, v in rep["tools"].items()},
            "tool_versions": {k: v.get("version", "") for k, v in rep["tools"].items()},
            "cached": rep.get("cached", False), "out_dir": rep.get("out_dir"),
            "estimator": estimator_error(cfg, rep["family"], rep)}


def ecp5_candidates() -> list[tuple[str, AccelConfig]]:
    """Configurations by decreasing MACs; for each shape, buffers shrunk until the estimate fits."""
    p = part(ECP5_PART)
    shapes = [(1, 16, 16), (1, 16, 8), (1, 8, 16), (2, 8, 8), (1, 8, 8), (1, 8, 4), (1, 4, 4)]
    out = []
    for batch, bi, bo in shapes:
        for s in (1.0, 0.5, 0.25, 0.125, 0.0625):
            try:
                c = _scaled(batch, bi, bo, s)
            except ConfigError:
                continue
            e = estimate(c, "ecp5", p)
            if all(r["used"] <= HEADROOM[k] * r["available"] for k, r in e.fit["resources"].items()):
                out.append((f"{batch}x{bi}x{bo}" + ("" if s == 1.0 else f"-buf{s:g}"), c))
                break
    return out


def _scaled(batch: int, bi: int, bo: int, s: float) -> AccelConfig:
    """The default config with another GEMM shape and its buffer bytes scaled by s (whole entries)."""
    d = PRESETS["default"].to_dict()
    d.update(batch=batch, block_in=bi, block_out=bo)
    inp_e, wgt_e, acc_e, out_e = batch * bi, bo * bi, batch * bo * 4, batch * bo

    def sz(v, elem):
        n = max(2, int(v * s) // elem)
        return (1 << (n.bit_length() - 1)) * elem
    acc = sz(d["acc_buff_bytes"], acc_e)
    d.update(uop_buff_bytes=sz(d["uop_buff_bytes"], 4), inp_buff_bytes=sz(d["inp_buff_bytes"], inp_e),
             wgt_buff_bytes=sz(d["wgt_buff_bytes"], wgt_e), acc_buff_bytes=acc, out_buff_bytes=acc // acc_e * out_e)
    return AccelConfig.from_dict(d)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--no-ecp5", action="store_true", help="skip the ECP5 place and route")
    ap.add_argument("--ecp5-config", default=None, help="synthesize this config for ECP5 instead of searching")
    ap.add_argument("--timeout", type=float, default=None, help="limit per tool run, seconds")
    ap.add_argument("--no-sta", action="store_true", help="skip yosys' sta path estimate of the xc7 configs")
    ap.add_argument("--configs", default=",".join(XC7_CONFIGS),
                    help="presets or config files for the xc7z020, comma-separated (default: %(default)s)")
    ap.add_argument("--docs", default=None, metavar="MD",
                    help="replace the table between the synth_report markers of this Markdown file")
    ap.add_argument("--from-json", default=None, metavar="FILE",
                    help="take the figures from a saved synth_report.json instead of synthesizing")
    args = ap.parse_args(argv)
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        print_table(result)
        if args.docs:
            update_docs(Path(args.docs), docs_table(result))
            print(f"updated {args.docs}")
        return 0
    t_start = time.monotonic()
    result: dict = {"machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
                    "xc7": {}, "ecp5": None}
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    for name in names:
        cfg = resolve_config(name)
        print(f"xc7: {name} ({cfg.digest()}) ...", flush=True)
        rep = cached_synthesize(cfg, "xc7", timeout=args.timeout)
        if not args.no_sta:
            rep["sta"] = sta_of(cfg, rep, args.timeout)
        result["xc7"][name] = summary(name, cfg, rep)
    same = [n for n in names if n != "default" and resolve_config(n) == resolve_config("default")]
    if same:
        result["notes"] = [f"the {', '.join(same)} preset equals the default config; one synthesis serves both"]
    if not args.no_ecp5:
        cands = [(args.ecp5_config, resolve_config(args.ecp5_config))] if args.ecp5_config else ecp5_candidates()
        tried = []
        for name, asked in cands:
            cfg = family_config(asked, "ecp5")   # as the ECP5 flow builds it: no DSP packing
            print(f"ecp5: {name} ({cfg.digest()}) synthesis + place and route ...", flush=True)
            rep = cached_synthesize(cfg, "ecp5", part=part(ECP5_PART), pnr=True, timeout=args.timeout)
            s = summary(name, cfg, rep)
            s["config_values"] = cfg.to_dict()
            tried.append({"config": name, "fits": s["fit"]["fits"]})
            if s["fit"]["fits"]:
                result["ecp5"] = s
                break
        result["ecp5_tried"] = tried
    result["seconds_total"] = round(time.monotonic() - t_start, 1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "synth_report.json").write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {out / 'synth_report.json'}")
    if args.docs:
        update_docs(Path(args.docs), docs_table(result))
        print(f"updated {args.docs}")
    return 0


def _rows(r: dict) -> list[dict]:
    return list(r["xc7"].values()) + ([r["ecp5"]] if r.get("ecp5") else [])


def docs_table(r: dict) -> str:
    """The Markdown table of a report: one row per synthesized config."""
    lines = ["| config | part | LUT | FF | DSP | BRAM | fits | Fmax MHz | GOPS at Fmax | estimator LUT error | tool time |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in _rows(r):
        u, pct = s["utilization"], s.get("utilization_pct") or s["fit"]["percent"]
        cells = [f"{u[k]:g} ({pct[k]:.0f}%)" if k in pct else f"{u[k]:g}" for k in RESOURCES]
        fits = "yes" if s["fit"]["fits"] else f"**no** ({s['fit']['limiting']})"
        fmax = s.get("fmax_mhz")
        src = s.get("fmax_source", "")
        label = "" if src.startswith("nextpnr") else " (yosys sta)" if src == STA_SOURCE else " (estimate)"
        fmax_txt = "-" if not fmax else f"{fmax:.1f}{label}"
        gops = s.get("gops_at_fmax")
        secs = " + ".join(f"{k} {v:.0f} s" for k, v in s["tool_seconds"].items())
        lines.append(f"| {s['config']} | {s['part']} | " + " | ".join(cells) +
                     f" | {fits} | {fmax_txt} | {'-' if gops is None else f'{gops:g}'} | "
                     f"{s['estimator']['error_pct']['lut']:+.1f}% | {secs} |")
    notes = r.get("notes") or []
    return "\n".join(lines + ([""] + [f"Note: {n}." for n in notes] if notes else [])) + "\n"


def update_docs(path: Path, table: str) -> None:
    """Replace what lies between the synth_report markers of `path` with `table` (written whole or
    not at all)."""
    text = path.read_text()
    i, j = text.find(DOCS_BEGIN), text.find(DOCS_END)
    if i < 0 or j < i:
        raise SystemExit(f"{path}: no '{DOCS_BEGIN}' ... '{DOCS_END}' markers to put the table between")
    new = text[:i + len(DOCS_BEGIN)] + "\n" + table + text[j:]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


def print_table(r: dict) -> None:
    print(f"\n{'config':<14}{'part':<20}{'LUT':>8}{'FF':>8}{'DSP':>6}{'BRAM':>7}  fits  {'est. LUT err':>12}"
          f"{'Fmax':>8}{'GOPS':>8}  tool s")
    for s in _rows(r):
        u = s["utilization"]
        fmax = f"{s['fmax_mhz']:.1f}" if s.get("fmax_mhz") else "-"
        gops = f"{s['gops_at_fmax']:g}" if s.get("gops_at_fmax") else "-"
        secs = "+".join(f"{v:.0f}" for v in s["tool_seconds"].values()) + (" (cached)" if s["cached"] else "")
        print(f"{s['config']:<14}{s['part']:<20}{u['lut']:>8g}{u['ff']:>8g}{u['dsp']:>6g}{u['bram']:>7g}  "
              f"{'yes ' if s['fit']['fits'] else 'NO  '}  {s['estimator']['error_pct']['lut']:>11}%{fmax:>8}{gops:>8}  "
              f"{secs}")


if __name__ == "__main__":
    sys.exit(main())
