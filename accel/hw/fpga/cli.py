"""`accel build`, `accel synth` and `accel estimate`: add_arguments + handler for each (registered
in accel/cli.py, like `accel verilog`).

    accel build --board pynq-z1|ultra96|zcu104 --config C -o DIR [--verilog FILE [--description JSON]] [--force]
    accel synth --config C --family xc7|ecp5 [--part P] [-o DIR] [--no-pnr] [--seed N] [--timeout S] [--force]

A design that does not fit its part makes `build` and `synth` exit with status 1, naming each
resource over its limit and by how much (build: the estimate, before anything is written; synth:
yosys's counts and, on ECP5, placement); --force writes the project (accepts the report) anyway.
    accel estimate --config C [--family xc7|ecp5] [--part P | --board B] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from accel.hw.boards import BOARDS, board, default_part, part
from accel.isa import resolve_config

from . import synth
from .errors import FpgaError
from .estimate import estimate, model_is_current
from .rtl import family_config, rtl_for_config, rtl_from_files
from .synth import format_table, over_limits, write_report
from .vivado import write_project


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="default", metavar="C", help="preset name or JSON file (default: %(default)s)")


def _rtl(args, cfg):
    if getattr(args, "verilog", None):
        return rtl_from_files(args.verilog, args.description)
    return rtl_for_config(cfg)


def _does_not_fit(fit: dict, what: str, notes=()) -> str:
    """The one-line verdict for a design over its part: every resource over the limit, by how much."""
    over = over_limits(fit) or list(notes) or [f"{fit.get('limiting')} over the limit"]
    return f"does not fit {fit['part']} ({what}): {'; '.join(over)}"


def _estimate_or_none(cfg, family, part):
    try:
        e = estimate(cfg, family, part)
    except FpgaError:
        return None
    _warn_if_stale()
    return e


def _warn_if_stale() -> None:
    if model_is_current() is False:
        print("warning: the RTL changed since the estimator was calibrated; LUT/FF estimates may be off "
              "(python -m accel.hw.fpga.calibrate run && ... fit)", file=sys.stderr)


# ---- build ----------------------------------------------------------------------------------------
def build_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--board", required=True, metavar="B", help=f"one of {', '.join(BOARDS)}")
    _config_arg(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="build directory to write")
    p.add_argument("--verilog", metavar="FILE", help="use this accelerator Verilog instead of generating it")
    p.add_argument("--description", metavar="JSON", help="its port/register description (default: FILE.json)")
    p.add_argument("--force", action="store_true",
                   help="write the project even when the estimate says the design does not fit the board's part "
                        "(otherwise: exit status 1, nothing written)")
    p.set_defaults(func=build_run)


def build_run(args) -> int:
    b = board(args.board)
    cfg = resolve_config(args.config)
    est = _estimate_or_none(cfg, b.part.family, b.part)   # before the (slow) Verilog: refuse early
    if est and not est.fit["fits"]:
        verdict = _does_not_fit(est.fit, f"estimate for config {cfg.digest()} on {b.name}, no synthesis")
        if not args.force:
            print(f"error: {verdict}; nothing written (--force writes the project anyway)", file=sys.stderr)
            return 1
        print(f"warning: {verdict}; writing the project anyway (--force)", file=sys.stderr)
    rtl = _rtl(args, cfg)
    res = write_project(b, cfg, rtl, args.output, estimate=est.to_dict() if est else None)
    print(f"wrote Vivado inputs for {b.name} ({b.part.name}) to {res.out_dir}:")
    for f in res.files:
        print(f"  {f.relative_to(res.out_dir)}")
    for w in res.warnings:
        print(f"warning: {w}")
    if est:
        f = est.fit
        print(f"estimate (no synthesis) against {b.part.name}: " +
              ", ".join(f"{k} {r['used']:g}/{r['available']} ({r['percent']:.0f}%)" for k, r in f["resources"].items()) +
              ("" if f["fits"] else f"  -- DOES NOT FIT ({f['limiting']})"))
    print(f"next: cd {res.out_dir} && vivado -mode batch -source build.tcl   (then copy overlay/ to the board; "
          f"see docs/fpga.md)")
    return 0


# ---- synth ----------------------------------------------------------------------------------------
def synth_add_arguments(p: argparse.ArgumentParser) -> None:
    _config_arg(p)
    p.add_argument("--family", required=True, choices=["xc7", "xcup", "ecp5"], help="FPGA family")
    p.add_argument("--part", metavar="P", help="part to check against (default: xc7z020 / xczu3eg / LFE5U-85F)")
    p.add_argument("-o", "--output", metavar="DIR", help="output folder (default: synth-<family>-<config digest>)")
    p.add_argument("--no-pnr", action="store_true", help="ECP5: stop after synthesis (no Fmax, no bitstream)")
    p.add_argument("--seed", type=int, default=1, help="nextpnr placement seed (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="limit for each tool run, seconds")
    p.add_argument("--verilog", metavar="FILE", help="synthesize this Verilog instead of generating it")
    p.add_argument("--description", metavar="JSON", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.add_argument("--force", action="store_true",
                   help="exit 0 even when the design does not fit the part (the report is written either way)")
    p.set_defaults(func=synth_run)


def synth_run(args) -> int:
    asked = resolve_config(args.config)
    cfg = family_config(asked, args.family)
    if cfg != asked and not getattr(args, "verilog", None):
        print(f"note: {args.family}: building without dsp_packing (no DSP saved on this family, only LUTs "
              f"spent); config {asked.digest()} as built is {cfg.digest()}", file=sys.stderr)
    p = part(args.part) if args.part else default_part(args.family)
    out = Path(args.output or f"synth-{args.family}-{cfg.digest()}")
    rtl = _rtl(args, cfg)
    rep = synth.synthesize(rtl, args.family, out, part=p, config=cfg, pnr=not args.no_pnr, seed=args.seed,
                     timeout=args.timeout)   # each tool shows as an accel.progress task
    est = _estimate_or_none(cfg, args.family, p)
    if est:
        rep.estimate = {"utilization": est.utilization, "fmax_mhz": est.fmax_mhz, "basis": est.fmax_basis}
        write_report(rep)
    d = rep.to_dict()
    print(json.dumps(d, indent=2) if args.json else format_table(d))
    if not args.json:
        print(f"report: {out / 'report.json'} (table: report.txt; tool logs beside them)")
    if not rep.fit["fits"]:
        verdict = _does_not_fit(rep.fit, "yosys" + (" + nextpnr-ecp5" if rep.pnr else ""), rep.notes)
        if not args.force:
            print(f"error: {verdict}", file=sys.stderr)
            return 1
        print(f"warning: {verdict} (--force: exit status 0)", file=sys.stderr)
    return 0


# ---- estimate -------------------------------------------------------------------------------------
def estimate_add_arguments(p: argparse.ArgumentParser) -> None:
    _config_arg(p)
    p.add_argument("--family", default=None, choices=["xc7", "xcup", "ecp5"], help="default: the part's, or xc7")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--part", metavar="P", help="part to check against")
    g.add_argument("--board", metavar="B", help="board whose part to check against")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=estimate_run)


def estimate_run(args) -> int:
    cfg = resolve_config(args.config)
    p = part(args.part) if args.part else board(args.board).part if args.board else None
    family = args.family or (p.family if p else "xc7")
    e = estimate(cfg, family, p or default_part(family))
    _warn_if_stale()
    d = e.to_dict()
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    f = d["fit"]
    print(f"estimate for config {cfg.digest()} on {d['part']} ({family}; no synthesis): "
          f"{'fits' if f['fits'] else 'DOES NOT FIT'} (limiting: {f['limiting']})")
    print(f"  {'resource':<8}{'estimate':>10}{'available':>11}{'used %':>9}")
    for k, r in f["resources"].items():
        print(f"  {k:<8}{r['used']:>10g}{r['available']:>11}{r['percent']:>8.1f}%")
    print(f"  clock: {'n/a' if e.fmax_mhz is None else f'{e.fmax_mhz:g} MHz'} ({e.fmax_basis}); "
          f"config asks {cfg.clock_mhz:g} MHz")
    errs = (d["model"].get("errors") or {}).get("xc7" if family != "ecp5" else "ecp5", {})
    ho = errs.get("max_abs_holdout")
    if ho:
        print(f"  model error on held-out configs (vs yosys): LUT {ho['lut']}%, FF {ho['ff']}%; BRAM and DSP exact")
    return 0
