"""The `accel` command line: one subcommand per entry of COMMANDS (name -> help, add_arguments).

    accel config show [--config C]        accel config validate FILE
    accel asm IN.s -o OUT.accp [--config C] [--data ADDR=FILE] [--symbol NAME=ADDR:DTYPE:SHAPE]
    accel disasm IN.accp                  accel run PROG.accp [--driver fsim] [--dump SYMBOL] [--dump-dram F]
    accel demo [--config C] [--driver fsim] [--m M --k K --n N]

Each add_arguments fills its parser and sets `func`, the handler returning the exit status.
To add a subcommand, write add_arguments + handler and register it with @command. Errors the
kit raises on purpose (AccelError) print one line `error: ...` and exit with status 2.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from accel.isa.errors import AccelError

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
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
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
    from accel.isa import resolve_config
    print(json.dumps(resolve_config(args.config).summary(), indent=2))
    return 0


def _config_validate(args) -> int:
    from accel.isa import AccelConfig
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


def _read_data(spec: str) -> tuple[int, bytes]:
    addr_s, sep, file = spec.partition("=")
    if not sep or not file:
        raise CliError(f"--data {spec!r}: expected ADDR=FILE")
    try:
        addr = int(addr_s, 0)
    except ValueError:
        raise CliError(f"--data {spec!r}: address {addr_s!r} is not an integer") from None
    try:
        if file.endswith(".npy"):
            data = np.ascontiguousarray(np.load(file, allow_pickle=False)).tobytes()
        else:
            data = Path(file).read_bytes()
    except OSError as e:
        raise CliError(f"--data {spec!r}: cannot read {file}: {e.strerror}") from None
    except ValueError as e:
        raise CliError(f"--data {spec!r}: {file} is not a valid .npy file ({e})") from None
    return addr, data


def _parse_symbol(spec: str):
    from accel.isa import Symbol
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
    from accel.isa import INSN_BYTES, Program, assemble_text, resolve_config
    cfg = resolve_config(args.config)
    try:
        text = Path(args.input).read_text()
    except OSError as e:
        raise CliError(f"cannot read {args.input}: {e.strerror}") from None
    insns = assemble_text(text, cfg)
    if not insns:
        raise CliError(f"{args.input}: no instructions")
    segments = sorted(_read_data(d) for d in args.data)
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
    from accel.isa import Program, disassemble
    prog = Program.load(args.input)
    print(f"# {args.input}: config {prog.config.digest()}, {len(prog.insns)} instructions at {prog.insn_addr:#x}, "
          f"{len(prog.segments)} data segment(s)")
    for name, s in prog.symbols.items():
        print(f"# symbol {name}: {s.addr:#x} {s.dtype} {'x'.join(map(str, s.shape))}")
    sys.stdout.write(disassemble(prog.insns, numbered=not args.plain))
    return 0


# ---- run ------------------------------------------------------------------------------------------
@command("run", "run a program file on a driver")
def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="program file (.accp)")
    p.add_argument("--driver", default="fsim", help="executor (default: %(default)s)")
    p.add_argument("--dump", action="append", default=[], metavar="SYMBOL", help="print a symbol's values after the run")
    p.add_argument("--dump-dram", metavar="FILE", help="write the whole DRAM after the run to FILE")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from accel.isa import Program
    from host_runtime import get_driver
    prog = Program.load(args.input)
    for name in args.dump:  # fail before running
        if name not in prog.symbols:
            raise CliError(f"{args.input} has no symbol {name!r}; symbols are {', '.join(prog.symbols) or '(none)'}")
    dram = prog.dram_image()
    driver = get_driver(args.driver, prog.config)
    try:
        result = driver.run(dram, prog.insn_addr, len(prog.insns))
    finally:
        driver.close()
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
@command("demo", "run a blocked int8 matmul on the simulator and check it against numpy")
def _demo_args(p: argparse.ArgumentParser) -> None:
    _config_arg(p)
    p.add_argument("--driver", default="fsim", help="executor (default: %(default)s)")
    p.add_argument("--m", type=int, default=16, help="rows of A and C (default: %(default)s)")
    p.add_argument("--k", type=int, default=70, help="columns of A, rows of B (default: %(default)s)")
    p.add_argument("--n", type=int, default=20, help="columns of B and C (default: %(default)s)")
    p.add_argument("--shift", type=int, default=8, help="right shift after the bias add (default: %(default)s)")
    p.add_argument("--virtual-threads", type=int, default=2, choices=(1, 2),
                   help="2 double-buffers loads against compute (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random operands' seed (default: %(default)s)")
    p.set_defaults(func=_demo)


def _demo(args) -> int:
    from accel.isa import resolve_config
    from host_runtime import Device
    from host_runtime.matmul import matmul, matmul_reference, plan_matmul
    cfg = resolve_config(args.config)
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


# ---- compile-op ----------------------------------------------------------------------------------
@command("compile-op", "compile one conv2d or dense layer for a config; print its loop nest and instructions")
def _compile_op_args(p: argparse.ArgumentParser) -> None:
    _config_arg(p)
    p.add_argument("op", choices=("conv2d", "dense"), help="operator")
    p.add_argument("--layer", help="a layer of shared/workloads/resnet18_conv.json (C2..C11) instead of the sizes")
    p.add_argument("--workloads", default=None, help="workload JSON (default: ../shared/workloads/resnet18_conv.json)")
    for name, default in (("n", 1), ("c", 16), ("h", 8), ("w", 8), ("o", 16), ("k", 3), ("pad", 1), ("stride", 1),
                          ("rows", 16)):
        p.add_argument(f"--{name}", type=int, default=default, help=f"(default: %(default)s)")
    p.add_argument("--shift", type=int, default=8, help="requantization shift (default: %(default)s)")
    p.add_argument("--relu", action="store_true", help="clip at 0 instead of -128")
    p.add_argument("--virtual-threads", type=int, default=2, choices=(1, 2))
    p.add_argument("--driver", default="fsim", help="executor that runs it for the check (default: %(default)s)")
    p.add_argument("--max-insns", type=int, default=60, help="instructions to print, 0 for all (default: %(default)s)")
    p.set_defaults(func=_compile_op)


def _compile_op(args) -> int:
    from accel.isa import disassemble, resolve_config
    from compiler.accel.conv2d import (Conv2dSpec, Requant, conv2d_reference, loop_nest_text, plan_conv2d,
                                       run_conv2d)
    from host_runtime import Device
    cfg = resolve_config(args.config)
    if args.layer:
        wl = Path(args.workloads) if args.workloads else Path(__file__).resolve().parents[2] / "shared" / "workloads" / "resnet18_conv.json"
        layers = json.loads(wl.read_text())["layers"]
        if args.layer not in layers:
            raise CliError(f"--layer {args.layer!r} is not in {wl}; layers are {', '.join(layers)}")
        spec = Conv2dSpec.from_workload(layers[args.layer], args.layer, n=args.n)
    elif args.op == "dense":
        spec = Conv2dSpec.dense(args.rows, args.c, args.o, cfg)
    else:
        spec = Conv2dSpec(args.n, args.c, args.h, args.w, args.o, args.k, args.k, (args.pad,) * 4,
                          (args.stride,) * 2)
    rq = Requant(args.shift, 0 if args.relu else -128, 127)
    tiling = plan_conv2d(spec, cfg, args.virtual_threads)
    print(loop_nest_text(spec, tiling, cfg, rq))
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    b = rng.integers(-(1 << 14), 1 << 14, spec.o).astype(np.int32)
    with Device(cfg, driver=args.driver, dram_bytes=min(1 << cfg.dram_addr_width, 256 << 20)) as dev:
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


# ---- entry ----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accel", description="Open hardware/software co-design kit for deep "
                                     "learning: a VTA-style accelerator, its simulators and host runtime.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", required=True)
    for name, (help_, add_arguments) in COMMANDS.items():
        add_arguments(sub.add_parser(name, help=help_, description=help_[:1].upper() + help_[1:] + "."))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s")
    try:
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
