"""Builds the Verilator model of accel_top with the C++ harness (harness.cpp) into a shared library.

    path = build_library(cfg, waves=None | "vcd" | "fst")

The Verilog comes from accel.hw.verilog.generate (cached by its source key). The library is
cached under <cache root>/verilator/<key>/ (ACCEL_CACHE_DIR, default <repo>/.cache), the key
hashing the Verilog's source key, this harness, the build flags and the Verilator version, and
the build runs under a file lock so concurrent processes (pytest workers) share one build.
Needs only `verilator` and a C++ compiler. A build takes about 12 s for the tiny config, 1.4 minutes
for the default one (2 cores).

Variants: waves adds Verilator's VCD or FST tracing (slower). Every build lets the harness read
each stage controller's state (probes: per-instruction spans when asked for; negligible cost).

Speed (what a whole-network simulation needs): Verilator evaluates its input-combinational region
on every eval() call, and Amaranth's registers all take `rst`, so with `rst` a top-level input
nearly all logic landed there and ran three times a cycle. The model is therefore built from a
wrapper, accel_sim, that registers `rst` (one cycle later; the harness holds it for four) and
leaves only the AXI-facing logic input-combinational. The model's code is compiled with -O3
-march=native (Verilator's default is -Os); its run-once initialisation code (the buffers'
initial values, most of the C++) with -O0, which took the build of the default config from 6.5
minutes to 1.4. The library key includes the host's -march=native target. Together about 2x the
simulated cycles per second (bench/sim_speed.py). Since then: the model's Verilog writes sign
extensions as replications (collapse_repeats; Verilator had spelled them out bit by bit), the harness
clocks a run with one eval per cycle instead of two (harness.cpp, tick()), and the build uses
Verilator's -fno-table and -fno-semantic-interposition -fno-plt -flto for the library's C++.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from accel.hw.verilog import LINT_WAIVERS, cache_root, generate, source_key
from accel.isa import AccelConfig, resolve_config
from accel.isa.files import file_lock
from accel.progress import task

from ..errors import SimError
from ..tools import install_hint

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "harness.cpp"
TOP = "accel_top"
SIM_TOP = "accel_sim"      # the wrapper the model is built from (see above)
LIB_NAME = "libaccel_sim.so"
WAVE_FORMATS = (None, "vcd", "fst")

# Stage controllers (accel/hw/top.py instance names) whose FSM state the probe build samples:
# StageControl's states are encoded in the order they are declared, WAIT 0, EXEC 1, PUSH 2.
# Verilator flattens the hierarchy into members of the root class named <path>__DOT__<signal>;
# state registers always survive optimisation.
STAGES = ("load", "compute", "store")
PROBE_SIGNAL = "fsm_state"


class BuildError(SimError):
    """The Verilator model could not be built (the message carries the tool's output)."""


def tools_available() -> str | None:
    """None if verilator and a C++ compiler are on PATH, else what is missing."""
    for exe in ("verilator", "g++", "make"):
        if shutil.which(exe) is None:
            return f"{exe} not found ({install_hint(exe)})"
    return None


def verilator_version() -> str:
    try:
        return subprocess.run(["verilator", "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"cannot run verilator: {e}") from None




def _run(cmd: list[str], cwd: Path, what: str) -> None:
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise BuildError(f"{what} timed out: {' '.join(cmd[:4])} ...") from None
    if p.returncode != 0:
        raise BuildError(f"{what} failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}")


def _flags(waves: str | None) -> list[str]:
    # split the generated C++ so `make -j 2` compiles it in parallel (the default config's model is large)
    # -fno-table: Verilator's lookup tables for case logic (the FSMs) ran slower here than the logic
    flags = ["-O3", "-fno-table", "--x-assign", "fast", "--x-initial", "fast", "--noassert", "--output-split", "20000",
             "--output-split-cfuncs", "20000"]
    if waves == "vcd":
        flags.append("--trace")
    elif waves == "fst":
        flags.append("--trace-fst")
    return flags


def _probe_header(verilog: str) -> str:
    """Macros reading each stage controller's FSM state (the harness turns transitions into spans)."""
    lines = []
    for i, stage in enumerate(STAGES):
        module = f"{TOP}.{stage}.ctrl"
        if f"module \\{module} " not in verilog:
            raise BuildError(f"probe build: module {module} not found in the generated Verilog")
        lines.append(f"#define ACCEL_PROBE_STATE_{i} (r->{SIM_TOP}__DOT__dut__DOT__{stage}__DOT__ctrl__DOT__{PROBE_SIGNAL})")
    # every read carries ARID 0: the client of an AR comes from the AXI master's `held` register
    # (the grant, registered every cycle), read in the cycle after the handshake
    start = verilog.find(f"module \\{TOP}.axi ")
    body = verilog[start:verilog.find("endmodule", start)] if start >= 0 else ""
    if not re.search(r"\breg\b[^;]*\bheld\b", body):
        raise BuildError(f"probe build: register `held` of module {TOP}.axi not found in the generated Verilog")
    lines.append(f"#define ACCEL_PROBE_AR_CLIENT (r->{SIM_TOP}__DOT__dut__DOT__axi__DOT__held)")
    return "\n".join(lines) + "\n"


_CONCAT = re.compile(r"\{ ([^{}]*) \}")
# what a run may repeat: a (possibly escaped) name, maybe one bit of it, or a sized constant
_BIT = re.compile(r"(\\\S+ |[A-Za-z_][\w$]*)(\[\d+\])?|\d+'[bhd][0-9a-fA-F]+")


def collapse_repeats(verilog: str) -> str:
    """yosys writes a sign extension as a concatenation repeating the sign bit, `{ x[7], x[7], ...,
    x[7:0] }`; each run of three or more equal items becomes a replication, `{ {24{x[7]}}, x[7:0] }`.
    The same Verilog for Verilator, which evaluates a replication as one operation where it spelled
    out the repeated bits one by one (the model ran 1.2-1.3x faster). Only the model's copy is
    rewritten: the Verilog users synthesize stays byte for byte what the FPGA estimator measured."""
    def collapse(match: re.Match) -> str:
        out = []
        for item, run in itertools.groupby(match.group(1).split(", ")):
            n = len(list(run))
            out.append(f"{{{n}{{{item}}}}}" if n >= 3 and _BIT.fullmatch(item) else ", ".join([item] * n))
        return "{ " + ", ".join(out) + " }"
    return _CONCAT.sub(collapse, verilog)


def sim_wrapper(ports: list[dict]) -> str:
    """Verilog of accel_sim: accel_top as `dut` with the same ports, `rst` through a register (see
    the module docstring). `ports`: the generated JSON's port list (name, direction, width)."""
    if not any(p["name"] == "rst" for p in ports):
        raise BuildError("the generated accel_top has no rst port")
    def decl(p):
        rng = f"[{p['width'] - 1}:0] " if p["width"] > 1 else ""
        return f"  {p['direction']} {rng}{p['name']};"
    decls = [decl(p) for p in ports]
    conns = ", ".join(f".{p['name']}({'rst_q' if p['name'] == 'rst' else p['name']})" for p in ports)
    return "\n".join([f"module {SIM_TOP}({', '.join(p['name'] for p in ports)});", *decls,
                      "  reg rst_q = 1'b1;", "  always @(posedge clk) rst_q <= rst;",
                      f"  {TOP} dut({conns});", "endmodule", ""])


@functools.lru_cache(maxsize=None)
def native_target() -> str:
    """The CPU the compiler's -march=native means here (a library built for one host may not run on another)."""
    try:
        out = subprocess.run(["g++", "-march=native", "-Q", "--help=target"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"cannot run g++: {e}") from None
    for line in out.splitlines():
        if line.strip().startswith("-march="):
            return line.split()[-1]
    return "unknown"


def library_key(cfg: AccelConfig, waves: str | None = None) -> str:
    h = hashlib.sha256(source_key(cfg).encode())
    h.update(HARNESS.read_bytes())
    h.update(Path(__file__).read_bytes())
    h.update(json.dumps([waves, _flags(waves)]).encode())
    h.update(verilator_version().encode())
    h.update(native_target().encode())
    return h.hexdigest()[:16]


def build_library(config, waves: str | None = None) -> Path:
    """The shared library for `config` (built once, then from the cache); returns its path."""
    if waves not in WAVE_FORMATS:
        raise BuildError(f"waves={waves!r}: formats are {', '.join(map(str, WAVE_FORMATS))}")
    missing = tools_available()
    if missing:
        raise BuildError(f"the rtl driver needs Verilator and a C++ compiler: {missing}")
    cfg = resolve_config(config)
    return build_cached(cfg, library_key(cfg, waves), "verilator", HARNESS, waves=waves)


def build_cached(cfg: AccelConfig, key: str, kind: str, harness: Path, *, waves: str | None = None,
                 what: str = f"Verilator build of {TOP}") -> Path:
    """Build once, under a file lock, the shared library of the Verilated accelerator for `cfg`
    linked with `harness` (harness.cpp, or a file that includes it: the vboard shell); later calls
    find it in cache_root()/kind/key. Returns the library's path."""
    bdir = cache_root() / kind / key
    lib = bdir / LIB_NAME
    if lib.exists():
        return lib
    with file_lock(cache_root() / kind / f"{key}.lock"):
        if lib.exists():
            return lib
        t0 = time.perf_counter()
        gen = generate(cfg)
        if bdir.exists():
            shutil.rmtree(bdir)
        obj = bdir / "obj"
        obj.mkdir(parents=True)
        src = bdir / f"{SIM_TOP}.v"
        verilog = Path(gen["verilog"]).read_text()
        ports = json.loads(Path(gen["json"]).read_text())["ports"]
        src.write_text(collapse_repeats(verilog) + "\n" + sim_wrapper(ports))
        vlts = [LINT_WAIVERS]
        (bdir / "probes.h").write_text(_probe_header(verilog))
        # a shared library's code may call its own functions directly (no PLT, no interposition); link-time
        # optimisation across the split C++ files (--output-split) and the harness: 1.03-1.04x
        cflags = ["-fPIC", "-march=native", "-fno-semantic-interposition", "-fno-plt", "-flto=2", "-DACCEL_PROBES",
                  f"-I{HERE}", "-include", str(bdir / "probes.h")]
        cmd = ["verilator", "--cc", "--exe", "--build", "-j", "2", "--top-module", SIM_TOP, "--prefix", "Vtop",
               "-Mdir", str(obj), "-o", str(obj / LIB_NAME), "-Wno-fatal", *_flags(waves),
               "-CFLAGS", " ".join(cflags), "-LDFLAGS", "-shared -flto=2",
               "-MAKEFLAGS", "OPT_FAST=-O3 OPT_SLOW=-O0 OPT_GLOBAL=-O2",
               *map(str, vlts), str(harness), str(src)]
        log.info("%s for config %s", what, cfg.digest())
        with task(f"{what} ({cfg.digest()}; minutes the first time)"):
            _run(cmd, bdir, what)
        if not (obj / LIB_NAME).exists():
            raise BuildError(f"{what} finished without {obj / LIB_NAME}")
        # linked beside the objects, then moved into place in one rename: a process that finds the
        # library (the check before the lock) never loads one the linker is still writing
        os.replace(obj / LIB_NAME, lib)
        shutil.rmtree(obj, ignore_errors=True)   # keep only the library
        (bdir / "build.json").write_text(json.dumps({"config": cfg.to_dict(), "waves": waves,
                                                     "seconds": round(time.perf_counter() - t0, 1)}))
        log.info("built %s in %.1f s", lib, time.perf_counter() - t0)
    return lib
