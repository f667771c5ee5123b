"""Host side of the RTL simulations: builds the accelerator's Verilog for Verilator or Icarus
(once per config and source hash, cached under .cache/rtl/), runs a batch of programs through
the cocotb testbench in one simulator process, and returns each program's DRAM and counters.

A build is keyed by the Verilog's source key (accel.hw.verilog.source_key), the simulator and
the waveform option, and guarded by a file lock so concurrent test processes share it. Every
run has a simulated-cycle limit per program (a hang is reported as RtlError naming the
program, not a stuck process) and a wall-clock limit for the simulator process.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import find_libpython
import numpy as np

from accel.hw.verilog import LINT_WAIVERS, cache_root, generate
from accel.isa import AccelConfig, resolve_config
from accel.isa.files import file_lock
from accel.progress import task

from ..dram import DramModel
from ..errors import CycleLimitError, SimError
from ..tools import install_hint

log = logging.getLogger(__name__)

SIMULATORS = ("verilator", "icarus")
TOP = "accel_top"
TB_TOP = "accel_tb"       # generated testbench top: clock generator + the accelerator
CLOCK_NS = 10
TB_MODULE = "sim.rtl.tb_accel"
DEFAULT_MAX_CYCLES = 200_000
WAVES_ENV = "ACCEL_RTL_WAVES"   # a directory: every run_programs call then dumps an FST waveform there
_ROOT = Path(__file__).resolve().parents[2]


class RtlError(SimError):
    """An RTL simulation could not be built or run, or a program hung (names which and why)."""


class RtlHang(RtlError, CycleLimitError):
    """A program did not raise done within its cycle limit."""


@dataclass
class RtlProgram:
    name: str
    dram: np.ndarray            # uint8 DRAM image
    insn_addr: int
    insn_count: int
    max_cycles: int = DEFAULT_MAX_CYCLES
    watchdog: int = 0           # the WATCHDOG register (0: off)
    soft_reset: bool = False    # after a hang, SOFT_RESET the core and go on with the next program


@dataclass
class RtlRun:
    name: str
    status: str                 # "done", "fault" (STATUS.error: see `error`), "hang", "reset" (hang, soft reset)
    dram: np.ndarray | None     # DRAM after the run (None after a hang)
    counters: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    bus_error: bool = False
    sim_cycles: int = 0         # clock edges from the start write to irq seen by the bench
    cpu_s: float = 0.0          # simulator process CPU time of the run (speed figures)
    steps: int = 0              # cycles the bus model woke up for
    error: tuple[int, int] = (0, 0)   # (ERROR, ERROR_INSN) after the run

    @property
    def cycles(self) -> int:
        return self.counters.get("cycles", 0)


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)[:40]


def simulators_available() -> dict[str, str | None]:
    """{simulator: None if usable, else why not}."""
    why = {}
    try:
        import cocotb  # noqa: PLC0415, F401 - optional dep cocotb
        missing = None
    except ImportError as e:
        missing = f"python package missing ({e.name}); pip install 'cocotb>=1.8,<1.9'"
    for sim, exe in (("verilator", "verilator"), ("icarus", "iverilog")):
        why[sim] = missing or (None if shutil.which(exe) else f"{exe} not found ({install_hint(exe)})")
    return why


def _cache() -> Path:
    return cache_root() / "rtl"




def _run_cmd(cmd: list[str], cwd: Path, what: str, env=None, timeout=None) -> str:
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RtlError(f"{what}: timed out after {timeout} s: {' '.join(cmd)}") from None
    if p.returncode != 0:
        tail = (p.stdout + p.stderr)[-4000:]
        raise RtlError(f"{what} failed (exit {p.returncode}): {' '.join(cmd[:3])} ...\n{tail}")
    return p.stdout + p.stderr


def testbench_top(description: dict, waves: bool = False) -> str:
    """Verilog of the simulation top: a free-running clock (the clock runs in the simulator, not
    in Python, which makes a cocotb cycle several times cheaper), `rst` high until the bench
    drops it, and every other port of the accelerator as a same-named reg (inputs, driven by
    cocotb) or wire (outputs)."""
    lines = ["`timescale 1ns/1ps", f"module {TB_TOP};", "  reg clk = 1'b0;",
             f"  always #{CLOCK_NS // 2} clk = ~clk;", "  reg rst = 1'b1;"]
    conns = []
    for p in description["ports"]:
        name, width = p["name"], p["width"]
        conns.append(f".{name}({name})")
        if name in ("clk", "rst"):
            continue
        rng = f"[{width - 1}:0] " if width > 1 else ""
        lines.append(f"  reg {rng}{name} = 0;" if p["direction"] == "input" else f"  wire {rng}{name};")
    lines.append(f"  {TOP} dut ({', '.join(conns)});")
    if waves:
        lines += ["`ifndef VERILATOR", '  initial begin $dumpfile("dump.fst"); $dumpvars(0, dut); end', "`endif"]
    return "\n".join(lines + ["endmodule", ""])


# Everything below decides the build; its text is part of the build key.
VERILATOR_FLAGS = ("--timing", "--vpi", "-CFLAGS", "-O1", "-Wno-fatal")
ICARUS_FLAGS = ("-g2005",)   # not -g2012: with it Icarus never runs Yosys' always @* blocks at time 0


def build(config, simulator: str = "verilator", waves: bool = False) -> Path:
    """Build (or reuse) the simulation model for `config`; returns its directory."""
    import cocotb  # noqa: PLC0415 - optional dep cocotb
    import cocotb.config  # noqa: PLC0415 - optional dep cocotb
    if simulator not in SIMULATORS:
        raise RtlError(f"unknown simulator {simulator!r}; simulators are {', '.join(SIMULATORS)}")
    cfg = resolve_config(config)
    gen = generate(cfg)
    desc = json.loads(Path(gen["json"]).read_text())
    tb_text = testbench_top(desc, waves)
    recipe = hashlib.sha256(repr((gen["key"], tb_text, VERILATOR_FLAGS, ICARUS_FLAGS, waves)).encode()).hexdigest()[:16]
    bdir = _cache() / f"{simulator}{'-waves' if waves else ''}" / recipe
    stamp = bdir / "built.ok"
    with file_lock(_cache() / f"{simulator}-{recipe}.lock"):
        if stamp.exists():
            return bdir
        if bdir.exists():
            shutil.rmtree(bdir)
        bdir.mkdir(parents=True)
        t0 = time.perf_counter()
        src = bdir / f"{TOP}.v"
        shutil.copyfile(gen["verilog"], src)
        tb = bdir / f"{TB_TOP}.v"
        tb.write_text(tb_text)
        if simulator == "verilator":
            vlt = bdir / "build.vlt"
            # cocotb reaches only the testbench top's signals: making just those public keeps
            # Verilator free to optimise the design (--public-flat-rw would expose everything).
            vlt.write_text(Path(LINT_WAIVERS).read_text() + f'public_flat_rw -module "{TB_TOP}" -var "*"\n')
            main_cpp = Path(cocotb.__file__).parent / "share" / "lib" / "verilator" / "verilator.cpp"
            libs = cocotb.config.libs_dir
            cmd = [shutil.which("verilator"), "-cc", "--exe", "-Mdir", str(bdir), "-DCOCOTB_SIM=1",
                   "--top-module", TB_TOP, "--prefix", "Vtop", "-o", TB_TOP,
                   "-LDFLAGS", f"-Wl,-rpath,{libs} -L{libs} -lcocotbvpi_verilator", *VERILATOR_FLAGS]
            if waves:
                cmd += ["--trace-fst", "--trace-structs"]
            cmd += [str(vlt), str(main_cpp), str(tb), str(src)]
            with task(f"Verilator build of the cocotb model of {TOP} ({cfg.digest()})", 2) as t:
                t.update(0, detail="verilating")
                _run_cmd(cmd, bdir, f"verilator build of {TOP}")
                t.update(1, detail="compiling C++")
                _run_cmd(["make", "-C", str(bdir), "-f", "Vtop.mk", f"-j{min(2, os.cpu_count() or 1)}"], bdir,
                         f"C++ build of the Verilator model of {TOP}")
                t.update(2)
        else:
            with task(f"iverilog build of {TOP} ({cfg.digest()})"):
                _run_cmd(["iverilog", "-o", str(bdir / "sim.vvp"), "-D", "COCOTB_SIM=1", *ICARUS_FLAGS, "-s", TB_TOP,
                          str(tb), str(src)], bdir, f"iverilog build of {TOP}")
        stamp.write_text(json.dumps({"config": cfg.to_dict(), "seconds": time.perf_counter() - t0}))
        log.info("built %s model in %.1f s: %s", simulator, time.perf_counter() - t0, bdir)
    return bdir


def _sim_env(job_dir: Path) -> dict[str, str]:
    import cocotb  # noqa: PLC0415 - optional dep cocotb
    import cocotb.config  # noqa: PLC0415 - optional dep cocotb
    env = dict(os.environ)
    env.setdefault("LIBPYTHON_LOC", find_libpython.find_libpython())
    env["PATH"] = env.get("PATH", "") + os.pathsep + cocotb.config.libs_dir
    env["PYTHONPATH"] = os.pathsep.join([str(_ROOT)] + [p for p in sys.path if p])
    env["PYTHONHOME"] = sys.prefix
    env.update({"TOPLEVEL": TB_TOP, "TOPLEVEL_LANG": "verilog", "MODULE": TB_MODULE, "ACCEL_RTL_JOB": str(job_dir),
                "COCOTB_RESULTS_FILE": str(job_dir / "results.xml"), "COCOTB_REDUCED_LOG_FMT": "1"})
    return env


def run_programs(config, programs: list[RtlProgram], simulator: str = "verilator", *, waves: str | Path | None = None,
                 stall_seed: int | None = None, dram=None, timeout_s: float | None = 600.0,
                 check: bool = True) -> list[RtlRun]:
    """Run `programs` in order on one simulated accelerator (buffers persist between them).

    waves: a path (.fst) to write a waveform of the whole job to (or set ACCEL_RTL_WAVES to a
    directory to get one for every call, e.g. while running the tests). stall_seed: a seed for random
    stalls on every AXI channel. dram: the memory's timing (sim.dram.DramModel or its dict).
    check: raise RtlHang if a program hangs (else status "hang").
    """
    import cocotb  # noqa: PLC0415 - optional dep cocotb
    import cocotb.config  # noqa: PLC0415 - optional dep cocotb
    cfg: AccelConfig = resolve_config(config)
    if not programs:
        return []
    bdir = build(cfg, simulator, waves=waves is not None)
    jobs = _cache() / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    job_dir = Path(tempfile.mkdtemp(prefix=f"{simulator}-", dir=jobs))
    try:
        dram_bytes = max(p.dram.size for p in programs)
        spec = {"dram_bytes": dram_bytes, "stall_seed": stall_seed,
                "dram": DramModel.from_dict(dram).to_dict(), "programs": []}
        for i, p in enumerate(programs):
            if p.dram.dtype != np.uint8 or p.dram.ndim != 1:
                raise RtlError(f"program {p.name!r}: DRAM must be a 1-D uint8 array")
            fname = f"p{i}.bin"
            (job_dir / fname).write_bytes(p.dram.tobytes())
            spec["programs"].append({"name": f"p{i}", "dram": fname, "insn_addr": int(p.insn_addr),
                                     "insn_count": int(p.insn_count), "max_cycles": int(p.max_cycles),
                                     "watchdog": int(p.watchdog), "soft_reset": bool(p.soft_reset)})
        (job_dir / "job.json").write_text(json.dumps(spec))
        if simulator == "verilator":
            cmd = [str(bdir / TB_TOP)]
        else:
            cmd = ["vvp", "-M", cocotb.config.libs_dir, "-m", cocotb.config.lib_name("vpi", "icarus"),
                   str(bdir / "sim.vvp")] + (["-fst"] if waves else [])
        t0 = time.perf_counter()
        output = _run_cmd(cmd, job_dir, f"{simulator} simulation of {len(programs)} program(s)", env=_sim_env(job_dir),
                 timeout=timeout_s)
        wall = time.perf_counter() - t0
        (job_dir / "sim.log").write_text(output)
        res_file = job_dir / "result.json"
        if not res_file.exists():
            raise RtlError(f"{simulator} simulation ended without results:\n{output[-4000:]}")
        res = json.loads(res_file.read_text())
        runs = []
        for p, r in zip(programs, res["programs"]):
            out = job_dir / f"{r['name']}.out.bin"
            dram = np.frombuffer(out.read_bytes(), dtype=np.uint8).copy() if out.exists() else None
            runs.append(RtlRun(p.name, r["status"], dram, r["counters"], r["wall_s"], r["bus_error"], r["sim_cycles"],
                               r["cpu_s"], r["steps"], tuple(r["error"])))
            if check and r["status"] == "hang":
                raise RtlHang(f"{simulator}: program {p.name!r} did not finish within {p.max_cycles} cycles "
                              f"(STATUS=0x{r['status_reg']:x}, counters {r['counters']})")
            if check and r["bus_error"]:
                raise RtlError(f"{simulator}: program {p.name!r} saw an AXI error response")
            if check and r["protocol_errors"]:
                raise RtlError(f"{simulator}: program {p.name!r} broke the AXI protocol: {r['protocol_errors'][:3]}")
        if check and len(runs) < len(programs):
            raise RtlError(f"{simulator}: only {len(runs)} of {len(programs)} programs ran (see {job_dir})")
        if waves is not None:
            shutil.copyfile(job_dir / "dump.fst", waves)
        log.info("%s ran %d program(s) in %.1f s", simulator, len(runs), wall)
        return runs
    finally:
        if not os.environ.get("ACCEL_RTL_KEEP_JOBS"):
            shutil.rmtree(job_dir, ignore_errors=True)
