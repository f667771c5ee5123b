"""One design point, evaluated where a Dask worker runs it: compile each model for the point's
config, run it on the timing model for cycles and counters, estimate (or synthesize) resources for
the board's part, and turn the counters into energy with a per-access energy table.

The energy table (ENERGY_PJ, overridable from the SPACE file's [energy] table) follows Accelergy's
method: energy = sum over actions of (count x energy per action). Defaults are 45 nm figures from
Horowitz, "Computing's energy problem" (ISSCC 2014): an 8-bit multiply 0.2 pJ plus a 32-bit add
0.1 pJ per MAC; a 64-bit read of a 32 KiB SRAM 20 pJ (2.5 pJ/byte), scaled by the square root of
the buffer's size relative to 32 KiB (CACTI's trend for wordline/bitline length); DRAM about
2 nJ per 64-bit access (250 pJ/byte). They rank design points; they are not an FPGA power report.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import time
import traceback

import numpy as np

import compiler
from accel.hw.boards import part as lookup_part
from accel.hw.fpga import rtl as fpga_rtl
from accel.hw.fpga import synth as fpga_synth
from accel.hw.fpga.estimate import estimate
from accel.isa import AccelConfig
from accel.isa.errors import AccelError

log = logging.getLogger(__name__)

ENERGY_PJ: dict[str, float] = {
    "mac_pj": 0.3,               # one int8 x int8 MAC into int32 (GEMM core; padded lanes count)
    "alu_lane_pj": 0.1,          # one 32-bit ALU lane operation
    "sram_pj_per_byte": 2.5,     # an SRAM access of sram_ref_bytes capacity, per byte
    "sram_ref_bytes": 32768.0,   # capacity at which sram_pj_per_byte holds (scaled by sqrt(size/ref))
    "dram_pj_per_byte": 250.0,   # DRAM traffic, per byte read or written (instruction fetch included)
    "static_mw": 0.0,            # static power charged over the accelerator's latency (0: dynamic only)
}


def energy_table(overrides: dict | None = None) -> dict[str, float]:
    return ENERGY_PJ | dict(overrides or {})


def sram_pj_per_byte(size_bytes: int, table: dict) -> float:
    return table["sram_pj_per_byte"] * math.sqrt(size_bytes / table["sram_ref_bytes"])


def energy_pj(cfg, counters: dict, latency_s: float, table: dict) -> dict[str, float]:
    """Energy per action class (pJ) from a run's counters: gemm_uops, alu_uops, bytes_read, bytes_written."""
    g, a = counters.get("gemm_uops", 0) or 0, counters.get("alu_uops", 0) or 0
    rd, wr = counters.get("bytes_read", 0) or 0, counters.get("bytes_written", 0) or 0
    e_inp = sram_pj_per_byte(cfg.inp_buff_bytes, table)
    e_wgt = sram_pj_per_byte(cfg.wgt_buff_bytes, table)
    e_acc = sram_pj_per_byte(cfg.acc_buff_bytes, table)
    e_out = sram_pj_per_byte(cfg.out_buff_bytes, table)
    lanes = cfg.batch * cfg.block_out
    return {
        "mac": g * cfg.macs_per_cycle * table["mac_pj"],
        "alu": a * lanes * table["alu_lane_pj"],
        # per GEMM micro-op: read an input and a weight entry, read and write an accumulator entry
        "sram_gemm": g * (cfg.inp_elem_bytes * e_inp + cfg.wgt_elem_bytes * e_wgt + 2 * cfg.acc_elem_bytes * e_acc),
        # per ALU micro-op: read two accumulator entries, write one (and its narrowed output entry)
        "sram_alu": a * (3 * cfg.acc_elem_bytes * e_acc + cfg.out_elem_bytes * e_out),
        # DMA: each loaded byte is written into a buffer, each stored byte read from the output buffer
        "sram_dma": rd * e_inp + wr * e_out,
        "dram": (rd + wr) * table["dram_pj_per_byte"],
        "static": table["static_mw"] * 1e-3 * latency_s * 1e12,
    }


def _feeds(mod, seed: int = 0) -> dict:
    """Seeded random inputs of the module's shapes (cycles do not depend on the values)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in mod.inputs:
        t = mod.tensors[spec["tensor"]]
        dt = np.dtype(t.dtype)
        if dt.kind == "f":
            feeds[spec["name"]] = rng.standard_normal(t.shape).astype(dt)
        elif dt.kind in "iu":
            info = np.iinfo(dt)
            hi = min(int(info.max), 127)
            feeds[spec["name"]] = rng.integers(max(int(info.min), 0 if dt.kind == "u" else -hi), hi, t.shape).astype(dt)
        else:
            feeds[spec["name"]] = np.zeros(t.shape, dt)
    return feeds


def run_model(cfg, name: str, blob: bytes, driver: str, force: dict, shapes: dict | None = None,
              dram: str | None = None) -> dict:
    """Compile `blob` for cfg and run it once on `driver` (under DRAM preset `dram`, if given):
    cycles, counters and MACs by target."""
    mod = compiler.build(blob, target="accel", config=cfg, force_target=force or None, name=name,
                         shapes=shapes or None)
    opts = {"helper": False} if driver == "tsim" else {}
    if dram is not None:
        opts["dram"] = dram
    _, prof = mod.run(_feeds(mod), driver=driver, num_threads=1, **opts)
    acc = [r for r in prof if r.get("target") == "accel"]
    out = {"cycles": sum(int(r.get("cycles") or 0) for r in acc), "accel_steps": len(acc),
           "steps": len(prof)}
    for k in ("insns", "gemm_uops", "alu_uops", "bytes_read", "bytes_written"):
        out[k] = sum(int(r.get(k) or 0) for r in acc)
    macs = mod.meta.get("macs") or {}
    out["accel_macs"], out["cpu_macs"] = int(macs.get("accel", 0)), int(macs.get("cpu", 0))
    if acc and not out["cycles"]:
        raise RuntimeError(f"driver {driver!r} reported no cycles for model {name}")
    return out


def resources(cfg, part, synth: str, work_dir: str | None, board_max_mhz: float | None) -> dict:
    """lut, ff, dsp, bram, fmax_mhz and fits for the part: the estimate, yosys, or nothing."""
    if synth == "none":
        return {"lut": None, "ff": None, "dsp": None, "bram": None, "fmax_mhz": None, "fits": None}
    est = estimate(cfg, part.family, part)
    util, fit, fmax, basis = est.utilization, est.fit, est.fmax_mhz, est.fmax_basis
    if synth == "yosys":
        rep = fpga_synth.synthesize(fpga_rtl.rtl_for_config(fpga_rtl.family_config(cfg, part.family)), part.family, work_dir, part=part, config=cfg,
                         pnr=part.family == "ecp5", bitstream=False)
        util, fit = rep.utilization, rep.fit
        if rep.timing and rep.timing.get("fmax_mhz"):
            fmax, basis = rep.timing["fmax_mhz"], rep.timing.get("source", "nextpnr")
    fits = bool(fit["fits"]) and (board_max_mhz is None or cfg.clock_mhz <= board_max_mhz)
    return {"lut": util["lut"], "ff": util["ff"], "dsp": util["dsp"], "bram": util["bram"],
            "fmax_mhz": fmax, "fmax_basis": basis, "fits": fits, "limiting": fit.get("limiting")}


class _Capture(logging.Handler):
    """Collects the compiler's and runtime's warnings of one point (kept in the record's detail
    instead of interleaving on the workers' stderr)."""

    NAMES = ("compiler", "host_runtime", "sim")
    MAX = 20

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        if msg not in self.messages and len(self.messages) < self.MAX:
            self.messages.append(msg)

    def __enter__(self):
        self.saved = []
        for n in self.NAMES:
            lg = logging.getLogger(n)
            self.saved.append((lg, lg.propagate))
            lg.addHandler(self)
            lg.propagate = False
        return self

    def __exit__(self, *exc):
        for lg, prop in self.saved:
            lg.removeHandler(self)
            lg.propagate = prop


def evaluate_point(task: dict, *blobs: bytes) -> dict:
    """The result record of one point (status ok or failed, never raises for a bad point); the
    compiler's warnings go to the record's detail["warnings"]."""
    with _Capture() as cap:
        rec = _evaluate(task, blobs)
    if cap.messages:
        rec.setdefault("detail", {})["warnings"] = cap.messages
    return rec


def _evaluate(task: dict, blobs) -> dict:
    """task: point (key), params, config (dict), models (names, in blobs' order), driver, synth,
    part and board_max_mhz, energy (table), force, work_dir (for yosys runs)."""
    t0 = time.perf_counter()
    rec = {"point": task["point"], "params": task["params"], "status": "ok", "error": ""}
    stage = ""
    try:
        cfg = AccelConfig.from_dict(task["config"])
        counters: dict[str, int] = {}
        per_model = {}
        shapes = task.get("shapes") or [None] * len(blobs)
        for name, blob, shp in zip(task["models"], blobs, shapes):
            stage = f"model {name}: "
            r = run_model(cfg, name, blob, task["driver"], task.get("force") or {}, shp, task.get("dram"))
            per_model[name] = r
            rec[f"cycles:{name}"] = r["cycles"]
            for k, v in r.items():
                counters[k] = counters.get(k, 0) + v
        stage = "resources: "
        cycles = counters["cycles"]
        latency_s = cycles / (cfg.clock_mhz * 1e6)
        res = resources(cfg, lookup_part(task["part"]), task["synth"], task.get("work_dir"), task.get("board_max_mhz"))
        table = energy_table(task.get("energy"))
        parts = energy_pj(cfg, counters, latency_s, table)
        rec.update(cycles=cycles, latency_ms=latency_s * 1e3, **{k: res[k] for k in ("lut", "ff", "dsp", "bram",
                                                                                         "fmax_mhz", "fits")},
                   gops=(2 * counters["accel_macs"] / latency_s / 1e9) if latency_s else None,
                   energy_uj=sum(parts.values()) / 1e6, accel_macs=counters["accel_macs"],
                   cpu_macs=counters["cpu_macs"],
                   meets_clock=None if res["fmax_mhz"] is None else bool(res["fmax_mhz"] >= cfg.clock_mhz),
                   detail={"models": per_model, "energy_pj": parts, "fmax_basis": res.get("fmax_basis"),
                           "limiting": res.get("limiting")})
    except Exception as e:  # any failure is this point's result; the sweep goes on
        msg = str(e) or type(e).__name__
        if not _is_kit_error(e):
            msg = f"{type(e).__name__}: {msg}"
            log.debug("point %s failed:\n%s", task["point"], traceback.format_exc())
        rec.update(status="failed", error=stage + (msg.strip().splitlines() or [type(e).__name__])[0])
    rec["eval_s"] = round(time.perf_counter() - t0, 3)
    rec["host"] = f"{socket.gethostname()}:{os.getpid()}"
    return rec


def _is_kit_error(e: BaseException) -> bool:
    return isinstance(e, AccelError)

