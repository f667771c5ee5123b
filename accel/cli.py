"""The `accel` command line: one subcommand per entry of COMMANDS (name -> help, add_arguments).

    accel config show [--config C]        accel config validate FILE
    accel asm IN.s -o OUT.accp [--config C] [--data ADDR=FILE] [--symbol NAME=ADDR:DTYPE:SHAPE]
    accel disasm IN.accp                  accel run PROG.accp [--driver fsim] [--dump SYMBOL] [--dump-dram F]
    accel run ... --check-races           (fsim: fail on a buffer entry two stages touch unordered by tokens)
    accel compile MODEL.onnx --target accel|cpu|opencl|cuda [--config C] -o MODEL.accm [--emit DIR] [--calibration S.npz]
    accel run MODEL.accm --input x.npy|name=x.npy|in.npz --output y.npy|out.npz [--driver fsim|tsim|rtl] [--profile]
    accel demo [--config C] [--driver fsim]   (residual CNN end to end; --m M --k K --n N: the matmul demo)
    accel verilog --config C -o DIR           (accel_top.v, accel_top.json: ports + register map, accel_top.vlt)
    accel build --board pynq-z1|ultra96|zcu104 --config C -o DIR    accel estimate --config C [--board B]
    accel synth --config C --family xc7|ecp5 [--part P]   (FPGA flow: accel/hw/fpga, docs/fpga.md)

Each add_arguments fills its parser and sets `func`, the handler returning the exit status.
To add a subcommand, write add_arguments + handler and register it with @command. Errors the
kit raises on purpose (AccelError) print one line `error: ...` and exit with status 2.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from accel import progress
from accel.isa import INSN_BYTES, AccelConfig, Program, Symbol, assemble_file, disassemble, resolve_config
from accel.isa.errors import AccelError
from accel.isa.files import write_atomic
from accel.isa.program import MAX_DRAM_BYTES
from accel.isa.schema import read_bounded
from flows.inputs import calibration as _calibration
from flows.inputs import force_specs, shape_specs
from flows.inputs import read_inputs as _read_inputs
from flows.inputs import same_file as _same_file
from flows.inputs import spec_file as _spec_file

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}


class CliError(AccelError):
    """A command-line argument or input file is unusable (the message says which and why)."""


def command(name: str, help: str):
    """Register `add_arguments(parser)` as the subcommand `name`."""
    def deco(add_arguments):
        COMMANDS[name] = (help, add_arguments)
        return add_arguments
    return deco


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="default", metavar="C",
                   help="preset name or JSON file (default: %(default)s)")


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _write_atomic(path: Path, data: bytes) -> None:
    try:
        write_atomic(path, data)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror}") from None


# ---- config ---------------------------------------------------------------------------------------
@command("config", "show or validate an accelerator configuration")
def _config_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="config_cmd", metavar="{show,validate}", required=True)
    show = sub.add_parser("show", help="print a config and its derived values as JSON",
                          description="Print a config (preset or JSON file) and its derived values as JSON.")
    _config_arg(show)
    show.set_defaults(func=_config_show)
    val = sub.add_parser("validate", help="check a config JSON file",
                         description="Check a config JSON file; prints its digest, exits 2 naming the bad key.")
    val.add_argument("file", help="config JSON file")
    val.set_defaults(func=_config_validate)


def _config_show(args) -> int:
    print(json.dumps(resolve_config(args.config).summary(), indent=2))
    return 0


def _config_validate(args) -> int:
    cfg = AccelConfig.load(args.file)
    print(f"{args.file}: valid (digest {cfg.digest()}, {cfg.macs_per_cycle} MACs/cycle, {cfg.peak_gops:g} GOPS peak)")
    return 0


# ---- asm / disasm ---------------------------------------------------------------------------------
@command("asm", "assemble a text program into a program file")
def _asm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="assembly text (one instruction per line)")
    p.add_argument("-o", "--output", required=True, help="program file to write (.accp)")
    _config_arg(p)
    p.add_argument("--data", action="append", default=[], metavar="ADDR=FILE",
                   help="place FILE's bytes (raw, or an .npy array's data) at DRAM byte address ADDR; repeatable")
    p.add_argument("--symbol", action="append", default=[], metavar="NAME=ADDR:DTYPE:SHAPE",
                   help="name a DRAM region, e.g. out=0x1000:int8:4x16; repeatable")
    p.add_argument("--insn-addr", type=_int, default=None,
                   help="DRAM byte address of the instructions (default: after the data)")
    p.add_argument("--dram-bytes", type=_int, default=1 << 24, help="DRAM size in bytes (default: %(default)s)")
    p.set_defaults(func=_asm)


def _read_data(spec: str, dram_bytes: int) -> tuple[int, bytes]:
    """--data ADDR=FILE -> (addr, bytes); the file is read no further than the DRAM could hold."""

    addr_s, sep, file = spec.partition("=")
    if not sep or not file:
        raise CliError(f"--data {spec!r}: expected ADDR=FILE")
    try:
        addr = int(addr_s, 0)
    except ValueError:
        raise CliError(f"--data {spec!r}: address {addr_s!r} is not an integer") from None
    if not 0 <= addr < dram_bytes:
        raise CliError(f"--data {spec!r}: address {addr:#x} outside the DRAM [0, {dram_bytes:#x})")
    raw = read_bounded(file, dram_bytes, f"--data {spec!r}: {file}", CliError)
    if not file.endswith(".npy"):
        return addr, raw
    try:
        return addr, np.ascontiguousarray(np.load(io.BytesIO(raw), allow_pickle=False)).tobytes()
    except (ValueError, EOFError, OSError) as e:
        raise CliError(f"--data {spec!r}: {file} is not a valid .npy file ({e})") from None


def _parse_symbol(spec: str):
    name, sep, rest = spec.partition("=")
    parts = rest.split(":")
    if not sep or not name or len(parts) != 3:
        raise CliError(f"--symbol {spec!r}: expected NAME=ADDR:DTYPE:SHAPE, e.g. out=0x1000:int8:4x16")
    try:
        addr = int(parts[0], 0)
        dtype = np.dtype(parts[1]).name
        shape = tuple(int(d) for d in parts[2].split("x"))
    except (ValueError, TypeError) as e:
        raise CliError(f"--symbol {spec!r}: {e}") from None
    return name, Symbol(addr, shape, dtype)


def _asm(args) -> int:
    if not 0 < args.dram_bytes <= MAX_DRAM_BYTES:
        raise CliError(f"--dram-bytes {args.dram_bytes}: allowed range is [1, {MAX_DRAM_BYTES}]")
    cfg = resolve_config(args.config)
    insns = assemble_file(args.input, cfg)
    if not insns:
        raise CliError(f"{args.input}: no instructions")
    segments = sorted(_read_data(d, args.dram_bytes) for d in args.data)
    symbols = dict(_parse_symbol(s) for s in args.symbol)
    top = max((a + len(d) for a, d in segments), default=0)
    insn_addr = args.insn_addr if args.insn_addr is not None else -(-top // 64) * 64
    if insn_addr % INSN_BYTES:
        raise CliError(f"--insn-addr {insn_addr:#x} is not a multiple of {INSN_BYTES}")
    regions = [(a, a + len(d), f"--data at {a:#x}") for a, d in segments]
    regions.append((insn_addr, insn_addr + len(insns) * INSN_BYTES, "the instructions"))
    regions.sort()
    for (a0, e0, w0), (a1, e1, w1) in zip(regions, regions[1:]):
        if a1 < e0:
            raise CliError(f"{w0} [{a0:#x}, {e0:#x}) overlaps {w1} [{a1:#x}, {e1:#x})")
    end = max(e for _, e, _ in regions)
    if end > args.dram_bytes:
        raise CliError(f"data and instructions reach byte {end:#x}, beyond --dram-bytes {args.dram_bytes:#x}")
    prog = Program(cfg, insns, insn_addr=insn_addr, dram_bytes=args.dram_bytes, segments=segments, symbols=symbols)
    prog.save(args.output)
    print(f"{args.output}: {len(insns)} instructions at {insn_addr:#x}, {len(segments)} data segment(s), "
          f"{len(symbols)} symbol(s)")
    return 0


@command("disasm", "print a program file's instructions as assembly")
def _disasm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="program file (.accp)")
    p.add_argument("--plain", action="store_true", help="no instruction numbers (text `accel asm` reads back)")
    p.set_defaults(func=_disasm)


def _disasm(args) -> int:
    prog = Program.load(args.input)
    print(f"# {args.input}: config {prog.config.digest()}, {len(prog.insns)} instructions at {prog.insn_addr:#x}, "
          f"{len(prog.segments)} data segment(s)")
    for name, s in prog.symbols.items():
        print(f"# symbol {name}: {s.addr:#x} {s.dtype} {'x'.join(map(str, s.shape))}")
    sys.stdout.write(disassemble(prog.insns, numbered=not args.plain))
    return 0


# ---- run ------------------------------------------------------------------------------------------
@command("run", "run a program file or a compiled model on a driver")
def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="program file (.accp) or compiled model (.accm, from `accel compile`)")
    p.add_argument("--driver", default="fsim", help="executor (default: %(default)s)")
    p.add_argument("--dump", action="append", default=[], metavar="SYMBOL", help="print a symbol's values after the run")
    p.add_argument("--dump-dram", metavar="FILE", help="write the whole DRAM after the run to FILE")
    p.add_argument("--check-races", action="store_true",
                   help="fsim: fail on any buffer entry two stages touch with no dependency token ordering them")
    p.add_argument("--lockstep", metavar="A,B",
                   help="run two executors (e.g. fsim,rtl) instruction by instruction; print the first instruction "
                        "whose effect (buffer entries, DRAM bytes written) differs and exit 1 (docs/bisect.md)")
    g = p.add_argument_group("timing drivers (tsim, rtl); for programs and compiled models")
    g.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace (one track per stage; a model adds a "
                                                   "track with one named span per layer) as JSON")
    g.add_argument("--timeline", metavar="FILE", help="write a timeline of the stages (and a model's layers) as a PNG")
    g.add_argument("--counters", nargs="?", const="-", metavar="FILE",
                   help="print the cycle counters (a model: per layer and in total), or write them as JSON to FILE")
    _dram_arg(g)
    _model_run_args(p)
    p.add_argument("--token-file", metavar="FILE",
                   help="--driver remote://HOST:PORT: file holding the server's token (else ACCEL_TOKEN)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    if getattr(args, "lockstep", None):
        from flows.lockstep import run_cli
        return run_cli(args)
    if args.check_races and args.driver != "fsim":
        raise CliError(f"--check-races is fsim's check; it needs --driver fsim, not {args.driver!r}")
    if args.token_file:   # read by host_runtime/remote.py's RemoteDriver, for programs and models alike
        if not args.driver.startswith("remote://"):
            raise CliError(f"--token-file is for --driver remote://HOST:PORT, not {args.driver!r}")
        os.environ["ACCEL_TOKEN_FILE"] = args.token_file
    if _is_module_file(args.input):
        return _run_model(args)
    if args.inputs or args.outputs or args.profile or args.profile_json:
        raise CliError(f"{args.input} is a program file; --input/--output/--profile apply to compiled models (.accm)")
    from host_runtime import get_driver
    prog = Program.load(args.input)
    for name in args.dump:  # fail before running
        if name not in prog.symbols:
            raise CliError(f"{args.input} has no symbol {name!r}; symbols are {', '.join(prog.symbols) or '(none)'}")
    dram = prog.dram_image()
    timing = bool(args.trace or args.timeline or args.counters)
    _check_timing_driver(args, timing)
    driver = get_driver(args.driver, prog.config, **({"trace": True} if args.trace or args.timeline else {}),
                        **({"check_races": True} if args.check_races else {}), **_dram_options(args))
    try:
        result = driver.run(dram, prog.insn_addr, len(prog.insns))
    finally:
        driver.close()
    if timing:
        _timing_outputs(args, prog, result)
    print(json.dumps({"driver": result.driver, "insns": result.insn_count, "wall_s": round(result.wall_s, 6),
                      "cycles": result.cycles, "stats": result.stats}, indent=2, default=str))
    with np.printoptions(threshold=1 << 16, linewidth=120):
        for name in args.dump:
            print(f"{name} =")
            print(prog.read_symbol(dram, name))
    if args.dump_dram:
        _write_atomic(Path(args.dump_dram), dram.tobytes())
        print(f"wrote {dram.size} bytes of DRAM to {args.dump_dram}")
    return 0


# ---- demo -----------------------------------------------------------------------------------------
@command("demo", "compile a small residual CNN, run it on the simulator, compare with onnxruntime "
                 "(with --m/--k/--n: a blocked int8 matmul checked against numpy)")
def _demo_args(p: argparse.ArgumentParser) -> None:
    _config_arg(p)
    p.add_argument("--driver", default="fsim", help="executor (default: %(default)s)")
    p.add_argument("--matmul", action="store_true", help="the matmul demo (implied by --m, --k or --n)")
    p.add_argument("--m", type=int, default=None, help="matmul: rows of A and C (default: 16)")
    p.add_argument("--k", type=int, default=None, help="matmul: columns of A, rows of B (default: 70)")
    p.add_argument("--n", type=int, default=None, help="matmul: columns of B and C (default: 20)")
    p.add_argument("--shift", type=int, default=8, help="matmul: right shift after the bias add (default: %(default)s)")
    p.add_argument("--virtual-threads", type=int, default=2, choices=(1, 2),
                   help="matmul: 2 double-buffers loads against compute (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random operands' seed (default: %(default)s)")
    p.add_argument("--save", metavar="FILE", help="CNN: also save the compiled model (.accm) and the ONNX model next to it")
    p.set_defaults(func=_demo)


def _demo(args) -> int:
    if not (args.matmul or any(getattr(args, k) is not None for k in ("m", "k", "n"))):
        return _demo_cnn(args)
    from host_runtime import Device
    from host_runtime.matmul import matmul, matmul_reference, plan_matmul
    cfg = resolve_config(args.config)
    for name, default in (("m", 16), ("k", 70), ("n", 20)):
        if getattr(args, name) is None:
            setattr(args, name, default)
    for name in ("m", "k", "n"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name} must be >= 1, got {getattr(args, name)}")
    rng = np.random.default_rng(args.seed)
    a = rng.integers(-128, 128, (args.m, args.k), dtype=np.int8)
    b = rng.integers(-128, 128, (args.k, args.n), dtype=np.int8)
    bias = rng.integers(-(1 << 14), 1 << 14, args.n).astype(np.int32)
    plan = plan_matmul(cfg, args.m, args.k, args.n, args.virtual_threads)
    need = 2 * (a.nbytes + b.nbytes + 4 * bias.size + 4 * args.m * args.n) + (8 << 20)
    with Device(cfg, driver=args.driver, dram_bytes=min(1 << cfg.dram_addr_width, max(16 << 20, need))) as dev:
        c, result = matmul(dev, a, b, bias, shift=args.shift, virtual_threads=args.virtual_threads)
    ref = matmul_reference(a, b, bias, args.shift, acc_width=cfg.acc_width, out_width=cfg.out_width)
    print(f"C = clip((A @ B + bias) >> {args.shift}, -128, 127) with A {args.m}x{args.k}, B {args.k}x{args.n} "
          f"int8 on config {args.config!r} ({cfg.batch}x{cfg.block_in}x{cfg.block_out}), driver {result.driver}")
    print(f"tiling: {plan.tm}x{plan.tn} output blocks per tile, {plan.tk} K blocks per GEMM, "
          f"{plan.slots} virtual thread(s), {plan.steps} load/GEMM steps")
    with np.printoptions(threshold=400, linewidth=120, edgeitems=4):
        print(c)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(result.stats.get("insns", {}).items()))
    print(f"instructions: {result.insn_count} ({counts})")
    for key in ("gemm_uops", "macs", "alu_uops", "bytes_read", "bytes_written"):
        if key in result.stats:
            print(f"{key}: {result.stats[key]}")
    if not np.array_equal(c, ref):
        bad = np.argwhere(c != ref)
        i, j = bad[0]
        print(f"MISMATCH: {len(bad)} of {c.size} values differ from numpy, first at [{i}, {j}]: "
              f"{c[i, j]} != {ref[i, j]}", file=sys.stderr)
        return 1
    print(f"OK: matches numpy ({c.size} values)")
    return 0


# ---- compiled models: compile, run, the CNN demo ---------------------------------------------------
class _Progress:
    """build_model's progress(stage, k, n) and Executor.run's progress(k, n, step name) shown as
    accel.progress tasks (a bar per stage on a terminal; nothing with -q or without a terminal)."""

    def __init__(self, what: str):
        self.what, self.stage, self.task = what, None, None
        self.stack = contextlib.ExitStack()

    def __call__(self, *args) -> None:
        if not progress.showing():
            return
        if len(args) == 3 and isinstance(args[0], str):  # build: (stage, k, n)
            stage, k, n = args
            label = None
        else:  # run: (k, n, step name)
            k, n, label = args
            stage = ""
        if stage != self.stage or self.task is None:
            self.stack.close()
            self.stage = stage
            self.task = self.stack.enter_context(progress.task(f"{self.what} {stage}".strip(), n))
        self.task.update(k, n, label)

    def close(self) -> None:
        self.stack.close()


def _dram_arg(p) -> None:
    from sim.dram import DRAM_PRESETS
    p.add_argument("--dram", metavar="NAME", help=f"DRAM timing preset of a timing driver (tsim, rtl, vboard): "
                                                  f"{', '.join(DRAM_PRESETS)} (docs/dram.md; default: default)")


def _dram_options(args) -> dict:
    """{"dram": NAME} for the driver when --dram is given; a one-line error for an unknown preset or a
    driver without DRAM timing."""
    name = getattr(args, "dram", None)
    if name is None:
        return {}
    from sim.dram import DRAM_PRESETS
    if name.lower() not in DRAM_PRESETS:
        raise CliError(f"--dram {name}: unknown DRAM preset; presets are {', '.join(DRAM_PRESETS)}")
    if args.driver not in ("tsim", "rtl", "vboard"):
        raise CliError(f"--dram sets the DRAM timing of tsim, rtl or vboard, not of driver {args.driver!r}")
    return {"dram": name.lower()}


def _check_timing_driver(args, timing: bool) -> None:
    """tsim and rtl give traces, timelines and counters; the board drivers (vboard, board) and
    remote:// devices give counters (a remote one when it runs a timing driver)."""
    if not timing or args.driver in ("tsim", "rtl"):
        return
    counters_only = args.driver in ("vboard", "board") or args.driver.startswith("remote://")
    if not counters_only:
        raise CliError(f"--trace, --timeline and --counters need a timing driver (tsim or rtl), not {args.driver!r}")
    if args.trace or args.timeline:
        raise CliError(f"--trace and --timeline need tsim or rtl; {args.driver!r} gives --counters only")


def _timing_outputs(args, prog, result) -> None:
    """--trace / --timeline / --counters of `accel run` (sim.trace)."""
    from sim.trace import write_counters, write_perfetto, write_timeline_png
    if result.raw is None:
        raise CliError(f"{result.driver} reported no counters (a remote server running fsim); serve tsim, rtl, "
                       f"vboard or board")
    counters, timeline = result.raw.counters, result.raw.timeline
    if args.trace:
        write_perfetto(args.trace, prog.config, counters, timeline, prog.insns, result.driver)
        print(f"wrote {args.trace} ({len(timeline.slices)} instruction slices; open in ui.perfetto.dev)")
    if args.timeline:
        write_timeline_png(args.timeline, prog.config, counters, timeline, title=f"{Path(args.input).name} on "
                           f"{result.driver}: {counters.cycles} cycles")
        print(f"wrote {args.timeline}")
    if args.counters == "-":
        print(counters.table())
    elif args.counters:
        write_counters(args.counters, counters, result.driver)
        print(f"wrote {args.counters}")


def _is_module_file(path: str) -> bool:
    from host_runtime.executor import is_module_file
    return is_module_file(path)


def _model_run_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("compiled models (.accm)")
    g.add_argument("--input", dest="inputs", action="append", default=[], metavar="[NAME=]FILE",
                   help="an input: NAME=x.npy, x.npy (inputs in order), one .npz holding every input by name, or "
                        "'random' (seeded normal values for every input); repeatable")
    g.add_argument("--output", dest="outputs", action="append", default=[], metavar="[NAME=]FILE",
                   help="where outputs go: NAME=y.npy, y.npy (outputs in order), or one .npz of every output")
    g.add_argument("--profile", action="store_true", help="print the per-step profile (time, instructions, cycles)")
    g.add_argument("--profile-json", metavar="FILE", help="write the profile and its totals as JSON")


def _write_npy_atomic(path: Path, arrays) -> None:
    buf = io.BytesIO()
    if isinstance(arrays, dict):
        np.savez(buf, **arrays)
    else:
        np.save(buf, arrays, allow_pickle=False)
    _write_atomic(path, buf.getvalue())


def _write_outputs(outs: dict, specs: list[str]) -> list[str]:
    names = list(outs)
    written, positional = [], []
    plan: list[tuple[Path, object]] = []
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep:
            name, file = None, spec
        if name is None and file.endswith(".npz"):
            plan.append((Path(file), dict(outs)))
        elif name is not None:
            if name not in outs:
                raise CliError(f"--output {spec!r}: the model has no output {name!r}; outputs are {', '.join(names)}")
            plan.append((Path(file), outs[name]))
        else:
            positional.append(file)
    if len(positional) > len(names):
        raise CliError(f"{len(positional)} unnamed --output files for {len(names)} output(s) ({', '.join(names)})")
    plan += [(Path(f), outs[n]) for f, n in zip(positional, names)]
    for path, data in plan:
        _write_npy_atomic(path, data)
        written.append(str(path))
    return written


def _run_model(args) -> int:
    from compiler.module import CompiledModule
    from host_runtime.executor import Executor, format_profile, profile_summary
    if args.dump or args.dump_dram:
        raise CliError("--dump and --dump-dram apply to program files (.accp); use --output for a model's outputs")
    mod = CompiledModule.load(args.input)
    timing = bool(args.trace or args.timeline or args.counters)
    _check_timing_driver(args, timing)
    if timing and not mod.count("accel"):
        raise CliError(f"{args.input}: --trace/--timeline/--counters show accelerator layers; this model has none "
                       f"(target {mod.target}); use --profile")
    feeds = _read_inputs(mod, args.inputs)
    options = {"check_races": True} if args.check_races else {}
    options.update(_dram_options(args))
    if args.trace or args.timeline:
        options["trace"] = True
    bar = _Progress("run")
    try:
        with Executor(mod, driver=args.driver, **options) as ex:
            outs = ex.run(feeds, progress=bar)
    finally:
        bar.close()
    where = f"driver {ex.driver_name}" if ex.driver_name else "the CPU"
    print(f"{args.input}: {mod.name} ({mod.target}) on {where}, {len(mod.steps)} steps")
    with np.printoptions(threshold=20, edgeitems=3, linewidth=120, precision=5):
        for name, y in outs.items():
            print(f"output {name}: {y.dtype}{list(y.shape)} {np.array2string(y.ravel()[:8])}"
                  f"{' ...' if y.size > 8 else ''}")
    for path in _write_outputs(outs, args.outputs):
        print(f"wrote {path}")
    if args.profile:
        print(format_profile(ex.profile, mod.config))
    if args.profile_json:
        data = {"model": mod.name, "target": mod.target, "driver": ex.driver_name, "steps": ex.profile,
                "totals": profile_summary(ex.profile, mod.config)}
        _write_atomic(Path(args.profile_json), json.dumps(data, indent=2, default=str).encode())
        print(f"wrote {args.profile_json}")
    if timing:
        _model_timing_outputs(args, mod, ex)
    return 0


def _model_timing_outputs(args, mod, ex) -> None:
    """--trace / --timeline / --counters of `accel run MODEL.accm`: every step a named span (sim.trace)."""
    from sim.trace import (
        model_counters_table,
        model_layers,
        sum_counters,
        write_model_counters,
        write_model_perfetto,
        write_model_timeline_png,
    )
    layers = model_layers(ex.profile, ex.results, mod.config.clock_mhz)
    if args.trace:
        write_model_perfetto(args.trace, mod.config, layers, ex.driver_name, mod.name)
        n = sum(len(lr.timeline.slices) for lr in layers if lr.timeline is not None)
        print(f"wrote {args.trace} ({len(layers)} layer spans, {n} instruction slices; open in ui.perfetto.dev)")
    if args.timeline:
        total = sum_counters([lr.counters for lr in layers if lr.counters is not None])
        write_model_timeline_png(args.timeline, mod.config, layers, title=f"{mod.name} on {ex.driver_name}: "
                                 f"{len(layers)} steps, {total.cycles} accelerator cycles")
        print(f"wrote {args.timeline}")
    if args.counters == "-":
        print(model_counters_table(layers))
    elif args.counters:
        write_model_counters(args.counters, layers, ex.driver_name, mod.name)
        print(f"wrote {args.counters}")


@command("compile", "compile an ONNX model for the accelerator (with CPU fallback) or the CPU into one file")
def _compile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model file")
    p.add_argument("--target", default="accel", metavar="TARGET",
                   help="a registered or installed target (`accel targets` lists them; plug-ins: "
                        "docs/compiler.md): accel (int8, CPU fallback), cpu, or a GPU: opencl (OpenCL C; PoCL runs it on the CPU where there "
                        "is no GPU) or cuda (PTX); ops without a GPU kernel run on the CPU (default: %(default)s)")
    _config_arg(p)
    p.add_argument("-o", "--output", required=True, help="compiled model file to write (.accm)")
    p.add_argument("--emit", metavar="DIR", help="also write the generated sources there: GPU kernels (.cl, .ptx), "
                                                 "CPU kernels' LLVM IR (.ll) and assembly (.s)")
    p.add_argument("--calibration", metavar="FILE",
                   help="sample inputs for the int8 scales. An .npz with one array per model input, stored under the "
                        "input's name, of shape (S, *input shape): S samples stacked on a new first axis, the same S "
                        "for every input (e.g. x of shape 1x3x224x224 -> an array of shape (S, 1, 3, 224, 224)); or a "
                        ".npy of that shape for a one-input model. Default: 8 seeded random normal samples. QDQ and "
                        "QOperator models bring their own scales")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DxDx..",
                   help="static shape of an input with symbolic dimensions, e.g. x=1x3x224x224; repeatable")
    p.add_argument("--force", action="append", default=[], metavar="OP=TARGET",
                   help="put every op of a type on a target (e.g. Conv=cpu); repeatable")
    p.add_argument("--tune", nargs="?", const=True, default=None, metavar="LOG",
                   help="measure the best few tilings of each accelerator layer on the timing model and keep "
                        "the fastest; with LOG, read and extend that JSON tuning log")
    p.add_argument("--no-resident-weights", dest="resident_weights", action="store_false",
                   help="reload every accelerator layer's weights on each inference (default: the weights "
                        "that fit the weight buffer stay there from the first run on)")
    p.add_argument("--space-to-depth-fill", type=float, default=None, metavar="F",
                   help="--target accel: rewrite a strided conv over few channels (a stem, a patch embedding) as a "
                        "stride-1 conv over space-to-depth blocks where those fill at least F of the GEMM core "
                        "(default 0.75: patch embeddings; 0.5 also takes ResNet's 7x7 stem)")
    p.add_argument("--tuning-log", metavar="F",
                   help="--target cpu: take each kernel's schedule from the JSON-lines log `accel tune` wrote "
                        "(a lookup, nothing is measured; records of another ISA are ignored). Default: this "
                        "machine's own log, where one exists")
    p.add_argument("--explain", action="store_true",
                   help="print one row per node: the target chosen and, for a node kept off the accelerator, why "
                        "(unsupported operator, grouped/depthwise, shape, slower by the cost estimate, --force, ...)")
    p.set_defaults(func=_compile)


def _accel_options(args) -> dict:
    """The accel target's build options from `accel compile`'s flags."""
    opts = {"resident_weights": args.resident_weights}
    if args.space_to_depth_fill is not None:
        opts["space_to_depth_fill"] = args.space_to_depth_fill
    return opts


def _compile(args) -> int:
    from compiler.frontend import from_onnx
    from compiler.graph_build import build_model
    from compiler.targets import get_target
    needs_config = get_target(args.target).needs_config   # an unknown TARGET: the registered ones, before any work
    shapes, force = shape_specs(args.shape), force_specs(args.force)
    t0 = time.perf_counter()
    with progress.task(f"compile import {Path(args.model).name}"):
        graph = from_onnx(args.model, shapes=shapes or None)
    cal = _calibration(args.calibration, list(graph.inputs))
    bar = _Progress("compile" if not args.tune else "compile (tuning each accelerator layer on tsim)")
    try:
        mod = build_model(graph, target=args.target, config=args.config if needs_config else None,
                          calibration=cal, force_target=force, tune=_cpu_tuning(args), progress=bar,
                          target_options=_accel_options(args) if args.target == "accel" else None)
    finally:
        bar.close()
    mod.save(args.output)
    print(mod.summary())
    if getattr(args, "emit", None):
        from compiler.emit import emit_sources
        files = emit_sources(mod, args.emit)
        print(f"wrote {len(files)} source file(s) to {args.emit}")
    for w in mod.meta.get("warnings", []):
        print(f"warning: {w}")
    if args.explain:
        from compiler.graph.passes.partition import explain_table
        print(explain_table(mod.meta.get("partition", []), mod.meta.get("folded")))
    print(f"wrote {args.output} ({Path(args.output).stat().st_size} bytes) in {time.perf_counter() - t0:.2f} s")
    return 0


@command("targets", "list the compilation targets: built-in, registered and installed plug-ins, with versions")
def _targets_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=_targets)


def _targets(args) -> int:
    """Each target's name, version and where it comes from; loads installed plug-ins (a plug-in
    that fails to load is listed with its error)."""
    from compiler.targets import BuildError, get_target, installed_targets, target_names
    from host_runtime.targets import BUILTIN_TARGETS, ENTRY_POINT_GROUP
    installed = installed_targets()
    rows = []
    for name in dict.fromkeys([*target_names(), *installed]):
        row = {"name": name, "version": "", "from": "built-in" if name in BUILTIN_TARGETS else
               f"{ENTRY_POINT_GROUP} entry point {installed[name]}" if name in installed else "registered"}
        try:
            t = get_target(name)
            row.update(version=t.version, title=t.title)
        except BuildError as e:
            row["error"] = str(e)
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['name']:12} {r['version'] or '-':10} {r['from']}" + (f"  error: {r['error']}" if "error" in r else ""))
    return 0


def _cpu_tuning(args):
    """compile's tune argument: --tune [LOG] as given, or --tuning-log F (cpu: look up only)."""
    if getattr(args, "tuning_log", None) is None:
        return args.tune
    if args.target != "cpu":
        raise CliError(f"--tuning-log is for --target cpu (got {args.target}; the accelerator's log is --tune LOG)")
    if args.tune:
        raise CliError("--tuning-log F looks up, --tune [LOG] measures: give one")
    from compiler.autotune import TuneOptions
    return TuneOptions(log=args.tuning_log, trials=0)


@command("tune", "search CPU kernel schedules of a model by measuring on this machine; write a tuning log")
def _tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="ONNX model file")
    p.add_argument("--target", default="cpu", choices=("cpu",), help="the target whose kernels are tuned (cpu)")
    p.add_argument("--trials", type=_int, default=None, metavar="N",
                   help="measurements per kernel signature, the heuristic schedule first (default: 12)")
    p.add_argument("--log", metavar="F", help="JSON-lines tuning log to read and extend (default: this "
                                               "machine's log, which plain builds consult)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DxDx..",
                   help="static shape of an input with symbolic dimensions; repeatable")
    p.set_defaults(func=_tune)


def _tune(args) -> int:
    from compiler.autotune import DEFAULT_TRIALS, TuneOptions, default_log_path
    from compiler.frontend import from_onnx
    from compiler.graph_build import build_model
    trials = DEFAULT_TRIALS if args.trials is None else args.trials
    if trials < 1:
        raise CliError(f"--trials {trials}: must be at least 1")
    graph = from_onnx(args.model, shapes=shape_specs(args.shape) or None)
    bar = _Progress("tune (measuring CPU kernels)")
    try:
        mod = build_model(graph, target=args.target, tune=TuneOptions(log=args.log, trials=trials), progress=bar)
    finally:
        bar.close()
    rows = mod.meta.get("tuning", {})
    for key, r in rows.items():
        t = f"{r['time_s'] * 1e6:.1f} us" if r.get("time_s") else "-"
        print(f"{key}: {r['source']} {json.dumps(r['config'], sort_keys=True)} {t}")
    print(f"{len(rows)} kernel signature(s); log {args.log or default_log_path()}")
    return 0


def demo_model(seed: int = 0):
    """The demo's residual CNN (onnx.helper): conv-bn-relu stem, a basic residual block, a strided
    conv, global average pooling and a dense classifier; 1x16x16x16 input."""
    from compiler.frontend.zoo import ModelBuilder  # noqa: PLC0415 - compiler.frontend.zoo pulls in onnx on import
    b = ModelBuilder("residual_cnn", seed)
    x = b.input("image", (1, 16, 16, 16))
    y = b.op("Relu", [b.bn(b.conv(x, 16, 32, name="stem"), 32, name="stem_bn")], name="stem_relu")
    r = b.op("Relu", [b.bn(b.conv(y, 32, 32, name="block_conv1"), 32, name="block_bn1")], name="block_relu1")
    r = b.bn(b.conv(r, 32, 32, name="block_conv2"), 32, name="block_bn2")
    y = b.op("Relu", [b.op("Add", [r, y], name="residual")], name="block_relu2")
    y = b.op("Relu", [b.conv(y, 32, 64, stride=2, name="down")], name="down_relu")
    y = b.op("GlobalAveragePool", [y], name="gap")
    y = b.op("Flatten", [y], name="flatten", axis=1)
    y = b.op("Gemm", [y, b.weight((10, 64)), b.init(np.zeros(10, np.float32))], name="classifier", transB=1)
    return b.build([y])


def _demo_cnn(args) -> int:
    from compiler.frontend import zoo
    from compiler.graph import run as reference_run
    from compiler.graph_build import build_model
    from host_runtime import available_drivers
    from host_runtime.executor import Executor, format_profile
    cfg = resolve_config(args.config)
    if args.driver not in available_drivers():
        raise CliError(f"unknown driver {args.driver!r}; drivers are {', '.join(available_drivers())}")
    model = demo_model(args.seed)
    feeds = zoo.sample_inputs(model, 5, seed=args.seed + 1)
    calib, feed = feeds[:4], feeds[4]
    t0 = time.perf_counter()
    bar = _Progress("compile")
    try:
        mod = build_model(model, target="accel", config=cfg, calibration=calib, progress=bar)
    finally:
        bar.close()
    t_compile = time.perf_counter() - t0
    print(f"residual CNN ({len(model.graph.node)} ONNX nodes) compiled for config {args.config!r} "
          f"({cfg.batch}x{cfg.block_in}x{cfg.block_out}) in {t_compile:.2f} s")
    print(mod.summary())
    if args.save:
        mod.save(args.save)
        onnx_path = Path(args.save).with_suffix(".onnx")
        _write_atomic(onnx_path, model.SerializeToString())
        print(f"wrote {args.save} and {onnx_path}")
    bar = _Progress("run")
    try:
        with Executor(mod, driver=args.driver) as ex:
            outs = ex.run(feed, progress=bar, keep=True)
    finally:
        bar.close()
    print(format_profile(ex.profile, cfg))
    got = next(iter(outs.values()))
    import onnxruntime as ort  # noqa: PLC0415 - optional dep onnxruntime
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, feed)[0]
    _, env = reference_run(mod.graph, feed, keep=True)
    ints = {n.name: env[id(n)] for n in mod.graph.nodes if id(n) in env and env[id(n)].dtype == np.int8}
    checked = [k for k in ex.values if k in ints]
    bad = [k for k in checked if not np.array_equal(ex.values[k], ints[k])]
    cos = float(got.ravel() @ ref.ravel() / (np.linalg.norm(got) * np.linalg.norm(ref)))
    with np.printoptions(precision=4, suppress=True, linewidth=120):
        print(f"logits (accelerator): {got.ravel()}")
        print(f"logits (onnxruntime): {ref.ravel()}")
    print(f"vs onnxruntime fp32: cosine {cos:.5f}, max |diff| {np.abs(got - ref).max():.4g}, "
          f"same class: {bool(got.argmax() == ref.argmax())}")
    print(f"vs int8 reference: {len(checked) - len(bad)} of {len(checked)} int8 tensors bit-exact")
    if bad or cos < 0.99:
        print(f"MISMATCH: {'int8 tensors ' + ', '.join(bad) + ' differ' if bad else ''}"
              f"{'; ' if bad and cos < 0.99 else ''}{f'cosine {cos:.4f} < 0.99' if cos < 0.99 else ''}", file=sys.stderr)
        return 1
    print("OK: bit-exact against the int8 reference and within quantization error of onnxruntime")
    return 0


# ---- compile-op ----------------------------------------------------------------------------------
@command("compile-op", "compile one conv2d or dense layer for a config; print its loop nest and instructions")
def _compile_op_args(p: argparse.ArgumentParser) -> None:
    _config_arg(p)
    p.add_argument("op", choices=("conv2d", "dense"), help="operator")
    p.add_argument("--layer", help="a ResNet-18 layer (C2..C11, compiler/accel/resnet18_conv.json) instead of the sizes")
    p.add_argument("--workloads", default=None, help="workload JSON (default: compiler/accel/resnet18_conv.json)")
    for name, default in (("n", 1), ("c", 16), ("h", 8), ("w", 8), ("o", 16), ("k", 3), ("pad", 1), ("stride", 1),
                          ("dilation", 1), ("rows", 16)):
        p.add_argument(f"--{name}", type=int, default=default, help="(default: %(default)s)")
    p.add_argument("--shift", type=int, default=8, help="requantization shift (default: %(default)s)")
    p.add_argument("--relu", action="store_true", help="clip at 0 instead of -128")
    p.add_argument("--virtual-threads", type=int, default=2, choices=(1, 2))
    p.add_argument("--driver", default="fsim", help="executor that runs it for the check (default: %(default)s)")
    _dram_arg(p)
    p.add_argument("--max-insns", type=int, default=60, help="instructions to print, 0 for all (default: %(default)s)")
    p.add_argument("--te", action="store_true",
                   help="lower through tensor expressions (compiler.accel.lower) and print the loop IR, instead of "
                        "the emitter networks use (compiler.accel.emit / dense)")
    p.add_argument("--template", action="store_true", help=argparse.SUPPRESS)   # the default now; old scripts
    p.set_defaults(func=_compile_op)


def _compile_op(args) -> int:
    from compiler.accel.conv2d import Conv2dSpec, Requant, conv2d_reference, loop_nest_text, plan_conv2d, run_conv2d
    from compiler.accel.workloads import RESNET18_CONV, load_layers
    from host_runtime import Device
    cfg = resolve_config(args.config)
    if args.layer:
        wl = Path(args.workloads) if args.workloads else RESNET18_CONV
        layers = load_layers(wl)
        if args.layer not in layers:
            raise CliError(f"--layer {args.layer!r} is not in {wl}; layers are {', '.join(layers)}")
        spec = Conv2dSpec.from_workload(layers[args.layer], args.layer, n=args.n)
    elif args.op == "dense":   # as networks lay it out (rows as batch blocks); the TE path as one image of rows
        spec = (Conv2dSpec.dense(args.rows, args.c, args.o, cfg) if args.te else
                Conv2dSpec(args.rows, args.c, 1, 1, args.o, 1, 1, name="dense"))
    else:
        spec = Conv2dSpec(args.n, args.c, args.h, args.w, args.o, args.k, args.k, (args.pad,) * 4,
                          (args.stride,) * 2, dilations=(args.dilation,) * 2)
    rq = Requant(args.shift, 0 if args.relu else -128, 127)
    tiling = plan_conv2d(spec, cfg, args.virtual_threads)
    if not args.te:   # the emitter networks use: its loop nest
        print(loop_nest_text(spec, tiling, cfg, rq))
    else:  # tensor expressions -> schedule -> loop IR -> accelerator passes: print the lowered TIR
        from compiler.accel.lower import lower_conv2d, run_conv2d
        print(f"// {spec.name}: tiling {tiling.describe()}")
        print(lower_conv2d(spec, cfg, rq, args.virtual_threads, tiling=tiling).script())
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, spec.o).astype(np.int32)
    with Device(cfg, driver=args.driver, dram_bytes=min(1 << cfg.dram_addr_width, 256 << 20),
                **_dram_options(args)) as dev:
        y, result, stream = run_conv2d(dev, x, w, b, spec, rq, args.virtual_threads, tiling)
        insns = stream.last_insns
    text = disassemble(insns, numbered=True).splitlines()
    shown = text if not args.max_insns else text[:args.max_insns]
    print("\n".join(shown))
    if len(shown) < len(text):
        print(f"... {len(text) - len(shown)} more (--max-insns 0 prints all)")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(result.stats.get("insns", {}).items()))
    print(f"instructions: {len(insns)} ({counts}); GEMM micro-ops {result.stats.get('gemm_uops')}, "
          f"MACs {result.stats.get('macs')}" + (f", cycles {result.cycles}" if result.cycles else ""))
    ok = np.array_equal(y, conv2d_reference(x, w, b, spec, rq))
    print("OK: bit-exact against the numpy reference" if ok else "MISMATCH against the numpy reference")
    return 0 if ok else 1


# ---- verilog --------------------------------------------------------------------------------------
@command("verilog", "write the accelerator's Verilog, its port/register description (JSON) and lint waivers")
def _verilog_args(p: argparse.ArgumentParser) -> None:
    from accel.hw.verilog import add_arguments  # no Amaranth import until the command runs
    add_arguments(p)


# ---- FPGA flow (accel/hw/fpga/cli.py) --------------------------------------------------------------
@command("build", "write a Vivado project input (shell, block design, build script, overlay metadata) for a board")
def _build_args(p: argparse.ArgumentParser) -> None:
    from accel.hw.fpga.cli import build_add_arguments
    build_add_arguments(p)


@command("synth", "synthesize with yosys (ECP5: place and route with nextpnr, pack a bitstream); report fit and Fmax")
def _synth_args(p: argparse.ArgumentParser) -> None:
    from accel.hw.fpga.cli import synth_add_arguments
    synth_add_arguments(p)


@command("estimate", "estimate resources and clock from the config alone (no synthesis)")
def _estimate_args(p: argparse.ArgumentParser) -> None:
    from accel.hw.fpga.cli import estimate_add_arguments
    estimate_add_arguments(p)


# ---- design-space sweep (flows/sweep.py) ----------------------------------------------------------
@command("sweep", "sweep accelerator parameters over models on Dask: cycles, resources, energy, Pareto front")
def _sweep_args(p: argparse.ArgumentParser) -> None:
    from flows.sweep import add_arguments  # no Dask import until the command runs
    add_arguments(p)


# ---- first divergence between executors (flows/bisect.py) ---------------------------------------
@command("bisect", "run a model on several executors with every tensor kept; name the first node where "
                   "neighbouring executors disagree")
def _bisect_args(p: argparse.ArgumentParser) -> None:
    from flows.bisect import add_arguments
    add_arguments(p)


# ---- kernel cache (host_runtime/kernel_cache.py) -------------------------------------------------
@command("cache", "show or empty the per-user cache of CPU kernels compiled from models' verified IR")
def _cache_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="cache_command", metavar="{info,clear}", required=True)
    sub.add_parser("info", help="print the cache's path, entries, bytes and size limit as JSON").set_defaults(
        func=_cache_info)
    sub.add_parser("clear", help="delete every cached kernel library").set_defaults(func=_cache_clear)


def _cache_info(args) -> int:
    from host_runtime.kernel_cache import KernelCache
    print(json.dumps(KernelCache().info(), indent=2))
    return 0


def _cache_clear(args) -> int:
    from host_runtime.kernel_cache import KernelCache
    cache = KernelCache()
    n = cache.clear()
    print(f"removed {n} kernel librar{'y' if n == 1 else 'ies'} from {cache.dir}")
    return 0


# ---- serve one device (host_runtime/server.py, docs/board.md) -------------------------------------
@command("serve", "serve one device to remote clients (--driver remote://HOST:PORT): token authentication, "
                  "loopback by default")
def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--driver", default="fsim", choices=("fsim", "tsim", "rtl", "vboard", "board"),
                   help="the device served (default: %(default)s)")
    p.add_argument("--config", default="default", help="the device's config: preset name or JSON file "
                                                       "(default: %(default)s; a board checks its bitstream's)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s; any other "
                                                      "needs a token)")
    p.add_argument("--port", type=int, default=9091, help="TCP port (default: %(default)s; 0 picks a free one)")
    p.add_argument("--token-file", metavar="FILE", help="file holding the token clients must prove (else ACCEL_TOKEN)")
    p.add_argument("--bitstream", metavar="X.bit", help="--driver board with PYNQ: the overlay bitstream to load")
    p.add_argument("--max-bytes", type=int, default=256 << 20, help="largest DRAM image a request may carry "
                                                                   "(default: %(default)s)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="board/vboard: seconds a run may take before the core is reset (default 60 / 600)")
    p.add_argument("--max-clients", type=int, default=8, help="connections at once (default: %(default)s)")
    p.set_defaults(func=_serve)


def _serve(args) -> int:
    from host_runtime.remote import read_token_file
    from host_runtime.server import DeviceServer
    token = read_token_file(args.token_file) if args.token_file else (os.environ.get("ACCEL_TOKEN") or "").strip()
    options = {}
    if args.bitstream:
        if args.driver != "board":
            raise CliError(f"--bitstream is for --driver board, not {args.driver!r}")
        options["bitstream"] = args.bitstream
    if args.timeout is not None:
        if args.driver not in ("board", "vboard"):
            raise CliError(f"--timeout is for --driver board or vboard; {args.driver!r} has cycle limits")
        options["timeout_s"] = args.timeout
    if not 0 <= args.port < 65536:
        raise CliError(f"--port {args.port}: must be 0..65535")
    logging.getLogger("host_runtime.server").setLevel(logging.INFO)   # one log line per request

    def _stop(signum, frame):   # systemd stops with SIGTERM: close the device (board reset, vboard shell)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _stop)
    srv = DeviceServer(resolve_config(args.config), driver=args.driver, host=args.host, port=args.port,
                       token=token or None, max_payload=args.max_bytes, max_clients=args.max_clients, **options)
    host, port = srv.address[:2]
    print(f"serving driver {args.driver} on {host}:{port} (clients: --driver remote://{host}:{port}); Ctrl-C stops",
          flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.close()
    return 0


# ---- entry ----------------------------------------------------------------------------------------
def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser; given argv, only the subcommand it names gets its arguments (some
    add_arguments import their package), so `accel --help` and each command load only their own."""
    parser = argparse.ArgumentParser(prog="accel", description="Open hardware/software co-design kit for deep "
                                     "learning: a VTA-style accelerator, its simulators and host runtime.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bars (they show only when stderr is a terminal anyway)")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", required=True)
    wanted = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (help_, add_arguments) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_[:1].upper() + help_[1:] + ".")
        if wanted is None or name == wanted:
            add_arguments(p)
    return parser


#: argparse destinations naming files a command reads, and files or folders it writes
_INPUT_ARGS = ("input", "model", "file", "calibration", "config", "workloads")
_OUTPUT_ARGS = ("output", "dump_dram", "profile_json", "trace", "timeline", "counters", "save")


def _refuse_overwriting_inputs(args) -> None:
    """An output path that is one of the command's inputs (`accel compile m.onnx -o m.onnx`) is an
    error before any work: the write would destroy what it was made from."""
    ins = [v for k in _INPUT_ARGS if isinstance(v := getattr(args, k, None), str) and v and os.path.isfile(v)]
    for specs in (getattr(args, "inputs", None), getattr(args, "data", None)):
        ins += [_spec_file(x) for x in (specs if isinstance(specs, list) else ())
                if isinstance(x, str) and os.path.isfile(_spec_file(x))]
    outs = [v for k in _OUTPUT_ARGS if isinstance(v := getattr(args, k, None), str) and v and v != "-"]
    outs += [_spec_file(x) for x in getattr(args, "outputs", None) or () if isinstance(x, str)]
    if isinstance(getattr(args, "save", None), str) and args.save:
        outs.append(str(Path(args.save).with_suffix(".onnx")))   # the demo writes the ONNX model beside it
    for out in outs:
        for inp in ins:
            if _same_file(out, inp):
                raise CliError(f"output {out} is the same file as the input {inp}; refusing to overwrite an "
                               f"input (choose another output path)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser(sys.argv[1:] if argv is None else [str(a) for a in argv]).parse_args(argv)
    logging.basicConfig(level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        _refuse_overwriting_inputs(args)
        with progress.reporting(None if args.quiet else progress.terminal_reporter()):
            return args.func(args)
    except AccelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file the user named cannot be read or written
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
