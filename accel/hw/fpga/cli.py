"""`accel build`, `accel synth` and `accel estimate`: add_arguments + handler for each (registered
in accel/cli.py, like `accel verilog`).

    accel build --board pynq-z1|ultra96|zcu104 --config C -o DIR [--verilog FILE [--description JSON]]
    accel synth --config C --family xc7|ecp5 [--part P] [-o DIR] [--no-pnr] [--seed N] [--timeout S]
    accel estimate --config C [--family xc7|ecp5] [--part P | --board B] [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="default", metavar="C", help="preset name or JSON file (default: %(default)s)")


def _rtl(args, cfg):
    from .rtl import rtl_for_config, rtl_from_files
    if getattr(args, "verilog", None):
        return rtl_from_files(args.verilog, args.description)
    return rtl_for_config(cfg)


class _Ticker:
    """Prints elapsed seconds on one line while a long tool runs (stderr, only on a terminal)."""

    def __init__(self, what: str):
        self.what, self._stop = what, threading.Event()
        self._tty = sys.stderr.isatty()

    def __enter__(self):
        self.t0 = time.monotonic()
        print(f"{self.what} ...", file=sys.stderr, end="" if self._tty else "\n", flush=True)
        if self._tty:
            threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self):
        while not self._stop.wait(1.0):
            print(f"\r{self.what} ... {time.monotonic() - self.t0:.0f} s", file=sys.stderr, end="", flush=True)

    def __exit__(self, *exc):
        self._stop.set()
        end = f" {time.monotonic() - self.t0:.0f} s"
        print(f"\r{self.what} ...{end}" if self._tty else f"{self.what}:{end}", file=sys.stderr, flush=True)


def _estimate_or_none(cfg, family, part):
    from .errors import FpgaError
    from .estimate import estimate
    try:
        e = estimate(cfg, family, part)
    except FpgaError:
        return None
    _warn_if_stale()
    return e


def _warn_if_stale() -> None:
    from .estimate import model_is_current
    if model_is_current() is False:
        print("warning: the RTL changed since the estimator was calibrated; LUT/FF estimates may be off "
              "(python -m accel.hw.fpga.calibrate run && ... fit)", file=sys.stderr)


# ---- build ----------------------------------------------------------------------------------------
def build_add_arguments(p: argparse.ArgumentParser) -> None:
    from accel.hw.boards import BOARDS
    p.add_argument("--board", required=True, metavar="B", help=f"one of {', '.join(BOARDS)}")
    _config_arg(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="build directory to write")
    p.add_argument("--verilog", metavar="FILE", help="use this accelerator Verilog instead of generating it")
    p.add_argument("--description", metavar="JSON", help="its port/register description (default: FILE.json)")
    p.set_defaults(func=build_run)


def build_run(args) -> int:
    from accel.hw.boards import board
    from accel.isa import resolve_config
    from .vivado import write_project
    b = board(args.board)
    cfg = resolve_config(args.config)
    rtl = _rtl(args, cfg)
    est = _estimate_or_none(cfg, b.part.family, b.part)
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
    p.set_defaults(func=synth_run)


def synth_run(args) -> int:
    from accel.hw.boards import default_part, part
    from accel.isa import resolve_config
    from .synth import format_table, synthesize, write_report
    cfg = resolve_config(args.config)
    p = part(args.part) if args.part else default_part(args.family)
    out = Path(args.output or f"synth-{args.family}-{cfg.digest()}")
    rtl = _rtl(args, cfg)
    steps = "yosys" + (" + nextpnr-ecp5 + ecppack" if args.family == "ecp5" and not args.no_pnr else "")
    with _Ticker(f"{steps} for {rtl.top} on {p.name} in {out}"):
        rep = synthesize(rtl, args.family, out, part=p, config=cfg, pnr=not args.no_pnr, seed=args.seed,
                         timeout=args.timeout)
    est = _estimate_or_none(cfg, args.family, p)
    if est:
        rep.estimate = {"utilization": est.utilization, "fmax_mhz": est.fmax_mhz, "basis": est.fmax_basis}
        write_report(rep)
    d = rep.to_dict()
    print(json.dumps(d, indent=2) if args.json else format_table(d))
    if not args.json:
        print(f"report: {out / 'report.json'} (table: report.txt; tool logs beside them)")
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
    from accel.hw.boards import board, default_part, part
    from accel.isa import resolve_config
    from .estimate import estimate
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
