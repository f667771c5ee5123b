"""Builds the Verilator model of accel_top with the C++ harness (harness.cpp) into a shared library.

    path = build_library(cfg, waves=None | "vcd" | "fst")

The Verilog comes from accel.hw.verilog.generate (cached by its source key). The library is
cached under <cache root>/verilator/<key>/ (ACCEL_CACHE_DIR, default <repo>/.cache), the key
hashing the Verilog's source key, this harness, the build flags and the Verilator version, and
the build runs under a file lock so concurrent processes (pytest workers) share one build.
Needs only `verilator` and a C++ compiler. A build of the tiny config takes about a minute.

Variants: waves adds Verilator's VCD or FST tracing (slower). Every build lets the harness read
each stage controller's state (probes: per-instruction spans when asked for; negligible cost).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path

from accel.isa import AccelConfig, resolve_config
from accel.isa.files import file_lock

from ..errors import SimError

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
HARNESS = HERE / "harness.cpp"
TOP = "accel_top"
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
    for exe, pkg in (("verilator", "verilator"), ("g++", "g++"), ("make", "make")):
        if shutil.which(exe) is None:
            return f"{exe} not found (apt-get install {pkg})"
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
    flags = ["-O3", "--x-assign", "fast", "--x-initial", "fast", "--noassert", "--output-split", "20000",
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
        lines.append(f"#define ACCEL_PROBE_STATE_{i} (r->{TOP}__DOT__{stage}__DOT__ctrl__DOT__{PROBE_SIGNAL})")
    return "\n".join(lines) + "\n"


def library_key(cfg: AccelConfig, waves: str | None = None) -> str:
    from accel.hw.verilog import source_key
    h = hashlib.sha256(source_key(cfg).encode())
    h.update(HARNESS.read_bytes())
    h.update(Path(__file__).read_bytes())
    h.update(json.dumps([waves, _flags(waves)]).encode())
    h.update(verilator_version().encode())
    return h.hexdigest()[:16]


def build_library(config, waves: str | None = None) -> Path:
    """The shared library for `config` (built once, then from the cache); returns its path."""
    if waves not in WAVE_FORMATS:
        raise BuildError(f"waves={waves!r}: formats are {', '.join(map(str, WAVE_FORMATS))}")
    missing = tools_available()
    if missing:
        raise BuildError(f"the rtl driver needs Verilator and a C++ compiler: {missing}")
    from accel.hw.verilog import LINT_WAIVERS, cache_root, generate
    cfg = resolve_config(config)
    key = library_key(cfg, waves)
    bdir = cache_root() / "verilator" / key
    lib = bdir / LIB_NAME
    if lib.exists():
        return lib
    with file_lock(cache_root() / "verilator" / f"{key}.lock"):
        if lib.exists():
            return lib
        t0 = time.perf_counter()
        gen = generate(cfg)
        if bdir.exists():
            shutil.rmtree(bdir)
        obj = bdir / "obj"
        obj.mkdir(parents=True)
        src = bdir / f"{TOP}.v"
        shutil.copyfile(gen["verilog"], src)
        vlts = [LINT_WAIVERS]
        (bdir / "probes.h").write_text(_probe_header(src.read_text()))
        cflags = ["-fPIC", "-O2", "-DACCEL_PROBES", "-include", str(bdir / "probes.h")]
        cmd = ["verilator", "--cc", "--exe", "--build", "-j", "2", "--top-module", TOP, "--prefix", "Vtop",
               "-Mdir", str(obj), "-o", str(lib), "-Wno-fatal", *_flags(waves),
               "-CFLAGS", " ".join(cflags), "-LDFLAGS", "-shared",
               *map(str, vlts), str(HARNESS), str(src)]
        log.info("building the Verilator model of %s for config %s", TOP, cfg.digest())
        _run(cmd, bdir, f"Verilator build of {TOP}")
        if not lib.exists():
            raise BuildError(f"Verilator build of {TOP} finished without {lib}")
        shutil.rmtree(obj, ignore_errors=True)   # keep only the library
        (bdir / "build.json").write_text(json.dumps({"config": cfg.to_dict(), "waves": waves,
                                                     "seconds": round(time.perf_counter() - t0, 1)}))
        log.info("built %s in %.1f s", lib, time.perf_counter() - t0)
    return lib
