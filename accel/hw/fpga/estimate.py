"""Resource and clock estimate from the config alone: milliseconds, no elaboration, no synthesis.

What is exact and what is fitted:
- Block RAM and LUT RAM: the RTL's memories (inventory below, derived from the config the way
  accel/hw builds them) mapped with memmap.py, a model of yosys' memory_libmap: exact.
- DSPs: the RTL's multipliers (GEMM products, ALU lanes, fetch's check, the tile loaders) split
  into DSP-sized pieces the way yosys' mul2dsp does, narrow products left in LUTs: exact.
- LUTs and flip-flops: per module group, a linear model in a few structural features of the
  config (multiply-accumulates x product bits, lanes x accumulator bits, bus width, ...), its
  coefficients fitted by calibrate.py to yosys results of several configurations
  (estimate_model.json records which, and the errors on configurations left out of the fit).
  ECP5 LUTs/FFs are the 7-series logic estimate times fitted ratios, plus exact LUT RAM.
- Clock: ECP5 Fmax from a fit to nextpnr-ecp5 results (the critical path runs from the
  accumulator RAM through the compute write-back into it; a fixed delay plus a term growing with
  the MACs per cycle, fitted to few routed runs: rough);
  for 7-series parts the longest path yosys' sta finds after synth_xilinx (estimate_timing.py;
  cell delays, no routing: optimistic), stored by `calibrate sta` for a few configs; for other
  Xilinx families the ECP5 estimate scaled by a stated factor, marked uncalibrated. Vivado's
  reports/timing.json is the measure.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from accel.hw.boards import Part, default_part
from accel.hw.params import INDEX_BITS, ibuf_depth
from accel.hw.verilog import source_key
from accel.isa import PRESETS, AccelConfig, formats_for
from accel.isa.config import INSN_BITS, SIZE_BITS

from .errors import FpgaError
from .memmap import MemShape, map_memory
from .rtl import family_config
from .synth import fit_check

MODEL_PATH = Path(__file__).resolve().parent / "estimate_model.json"
XILINX_SPEED_FACTOR = 1.6
"""Uncalibrated: typical 7-series -1 logic+routing delay per level relative to ECP5 -6 (LUT6 and
faster carry chains); used only because no open 7-series timing tool exists."""


# ---- inventory: what the RTL instantiates, derived from the config ---------------------------------
@dataclass(frozen=True)
class Mul:
    """A multiplier: a_width x b_width (signed), y_width result bits kept, `count` instances."""

    module: str
    a_width: int
    b_width: int
    y_width: int
    count: int


def memories(cfg: AccelConfig) -> list[tuple[str, MemShape]]:
    """(module, shape) of every memory yosys infers in accel_top for `cfg`.

    Buffers live in the top module (accel/hw/top.py): one write port each; the accumulator has
    two read ports (GEMM/ALU operands) transparent to its write port. Queues are SyncFIFOBuffered,
    whose storage is depth - 1 entries plus an output register: the load and store command queues
    hold instructions, compute's also each instruction's index, and fetch's buffer (ibuf_depth
    entries) instructions (their fault codes are registers beside it). The dependency-token queues carry a constant bit, so
    yosys removes their storage.
    """
    top = ""
    mems = [(top, MemShape("uop_buf", cfg.uop_depth, cfg.uop_bits)),
            (top, MemShape("inp_buf", cfg.inp_depth, cfg.inp_elem_bytes * 8)),
            (top, MemShape("wgt_buf", cfg.wgt_depth, cfg.wgt_elem_bytes * 8)),
            (top, MemShape("acc_buf", cfg.acc_depth, cfg.acc_elem_bytes * 8, n_read=2, transparent=True)),
            (top, MemShape("out_buf", cfg.out_depth, cfg.out_elem_bytes * 8))]
    queues = (("load_cmd.fifo", cfg.cmd_queue_depth, INSN_BITS),
              ("compute_cmd.fifo", cfg.cmd_queue_depth, INSN_BITS + INDEX_BITS),
              ("store_cmd.fifo", cfg.cmd_queue_depth, INSN_BITS),
              ("fetch.ibuf.fifo", ibuf_depth(cfg), INSN_BITS))
    for q, depth, width in queues:
        if depth > 1:
            mems.append((q, MemShape(f"{q}.storage", depth - 1, width)))
    return mems


def multipliers(cfg: AccelConfig, family: str = "xc7") -> list[Mul]:
    """GEMM: one inp x wgt product per MAC, or per two MACs where GemmCore packs two products into
    one inp x (packed weights) multiply (accel.hw.gemm.packing_shift); ALU per lane: one acc x M
    product, M = SCALE's unsigned multiplier of up to 24 bits (entering signed, one bit wider),
    whose low bits MUL shares (accel.hw.alu.alu_lane: MUL's remaining term is a narrow shift-add
    in LUTs)."""
    lanes = cfg.batch * cfg.block_out
    m = min(24, cfg.acc_width) + 1
    gemm = Mul("compute.gemm", cfg.inp_width, cfg.wgt_width, cfg.inp_width + cfg.wgt_width, cfg.macs_per_cycle)
    from accel.hw.gemm import packing_shift  # noqa: PLC0415 - accel.hw.gemm pulls in amaranth on import
    shift = packing_shift(cfg.inp_width, cfg.wgt_width)
    if shift is not None and cfg.block_out > 1 and cfg.dsp_packing:  # two products per multiply
        packed = cfg.wgt_width + shift + 1
        gemm = Mul("compute.gemm", cfg.inp_width, packed, cfg.inp_width + packed, cfg.macs_per_cycle // 2)
    # fetch's fault check: a LOAD's padded rows x columns against the buffer (accel.hw.fetch.
    # static_check), unsigned: one bit wider where the DSPs are signed-only (yosys DSP_SIGNEDONLY:
    # Xilinx), as it is on ECP5's MULT18X18D
    size = dict(formats_for(cfg)["LOAD"])["y_size"] + 2
    signed_only = family != "ecp5"
    check = Mul("fetch.check", size + signed_only, size + signed_only, 2 * size, 1)
    # each TileLoader's first data entry (accel.hw.load): y_pad0 x the padded row length, unsigned, kept
    # to the SRAM index width; a DSP where that is wide enough for mul2dsp (Y_MIN)
    pad = dict(formats_for(cfg)["LOAD"])["y_pad0"]
    loaders = [Mul(f"{s}.loader", pad + signed_only, SIZE_BITS + 2 + signed_only, cfg.sram_idx_bits, 1)
               for s in ("load", "compute")]
    return [gemm, Mul("compute.alu", cfg.acc_width, m, cfg.acc_width + m - 1, lanes), check, *loaders]


# yosys mul2dsp parameters per family: (A max, B max, A partial, B partial); signed-only DSPs keep
# one bit of each partial slice for the sign (sign_headroom = 1).
_DSP = {"xc7": (25, 18, 18, 18), "xcup": (27, 18, 18, 18), "ecp5": (18, 18, 18, 18)}
# DSP_Y_MINWIDTH: narrower products stay in LUTs (synth_xilinx sets 9; synth_ecp5 sets none)
Y_MIN = {"xc7": 9, "xcup": 9, "ecp5": 0}


def dsp_count(m: Mul, family: str) -> int:
    """DSP cells for one multiplier: slices of A and B whose partial product lands below y_width."""
    amax, bmax, apart, bpart = _DSP[family]
    a, b = max(m.a_width, m.b_width), min(m.a_width, m.b_width)
    if m.y_width < Y_MIN[family]:
        return 0

    def slices(width, mx, part):
        if width <= mx:
            return [0]
        n = (width - mx + part - 2) // (part - 1)
        return [i * (part - 1) for i in range(n + 1)]
    return sum(1 for sa in slices(a, amax, apart) for sb in slices(b, bmax, bpart) if sa + sb < m.y_width)


# ---- LUT/FF model: module groups and their features ----------------------------------------------
def _clog2(v: int) -> int:
    return max(1, (v - 1).bit_length())


def _dma_sizes(cfg: AccelConfig) -> list[tuple[int, ...]]:
    """Element sizes (bytes) of the three read DMAs: fetch (instructions), load (inp, wgt),
    compute (uop, acc)."""
    return [(INSN_BITS // 8,), (cfg.inp_elem_bytes, cfg.wgt_elem_bytes), (cfg.uop_elem_bytes, cfg.acc_elem_bytes)]


def features(cfg: AccelConfig) -> dict[str, dict[str, float]]:
    """Per module group, the structural quantities its LUT and FF counts are modelled on."""
    lanes = cfg.batch * cfg.block_out
    prod = cfg.inp_width + cfg.wgt_width
    dot = prod + _clog2(cfg.block_in)
    bus = cfg.bus_width
    wide = sum(max(e for e in sizes) * 8 for sizes in _dma_sizes(cfg) if max(sizes) * 8 >= bus)
    elem_bits = cfg.inp_elem_bytes * 8 + cfg.wgt_elem_bytes * 8 + cfg.uop_bits + cfg.acc_elem_bytes * 8
    idx = cfg.inp_idx_bits + cfg.wgt_idx_bits + cfg.acc_idx_bits + cfg.uop_idx_bits
    qd = _clog2(cfg.cmd_queue_depth)
    acc_bits = cfg.acc_elem_bytes * 8
    return {
        "gemm": {"mac_bits": cfg.macs_per_cycle * prod, "lane_bits": lanes * (cfg.acc_width + dot), "one": 1},
        "alu": {"lane_bits": lanes * cfg.acc_width, "shift_bits": lanes * cfg.acc_width * _clog2(cfg.acc_width),
                "one": 1},
        "dma": {"bus": 3 * bus, "wide": wide, "one": 1},
        "loaders": {"elem_bits": elem_bits, "idx": idx, "one": 1},
        "queues": {"queues": 4, "depth_bits": 4 * qd, "insn": 4 * INSN_BITS},
        "compute": {"acc_bits": acc_bits + cfg.out_elem_bytes * 8, "idx": idx, "one": 1},
        "store": {"bus": bus, "out_bits": cfg.out_elem_bytes * 8, "one": 1},
        "fetch": {"bus": bus, "queue": qd, "one": 1},
        "regs": {"addr": cfg.dram_addr_width, "one": 1},
        "axi": {"bus": bus, "addr": cfg.dram_addr_width, "one": 1},
        "ctrl": {"one": 3},
        "top": {"acc_bits": acc_bits, "mux_bits": _mux_bits(cfg), "one": 1},
        "other": {"one": 1},
    }


def _mux_bits(cfg: AccelConfig) -> float:
    """Read-data bits yosys multiplexes between block RAMs that split a buffer's depth."""
    total = 0.0
    for _mod, shape in memories(cfg):
        m = map_memory(shape, "xc7")
        if m.target == "bram" and m.cells:
            per_port = m.cells / shape.n_read
            cols = max(1, math.ceil(shape.width / 72))
            rows = max(1.0, per_port / cols)
            total += shape.width * (rows - 1) * shape.n_read
    return total


# Module path (relative to the top, "" for the top itself) -> group. First match wins.
GROUPS = [
    ("gemm", r"^compute\.gemm$"),
    ("alu", r"^compute\.alu$"),
    ("dma", r"\.dma$"),
    ("loaders", r"\.loader$"),
    ("queues", r"(_cmd|\.ibuf)(\.fifo)?$|^tok_"),
    ("ctrl", r"\.ctrl$"),
    ("regs", r"^regs$"),
    ("store", r"^store(\.unit)?$"),
    ("compute", r"^compute$"),
    ("fetch", r"^fetch$"),
    ("axi", r"^axi$"),
    ("top", r"^$"),
    ("other", r".*"),
]


def group_of(module: str, top: str = "accel_top") -> str:
    rel = module[len(top):].lstrip(".") if module.startswith(top) else module
    for g, pat in GROUPS:
        if re.search(pat, rel):
            return g
    return "other"


# ---- the model -----------------------------------------------------------------------------------
@lru_cache(maxsize=4)
def _load_model(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FpgaError(f"no estimate model at {path}; run `python -m accel.hw.fpga.calibrate` to fit one") from None


def load_model(path: str | Path | None = None) -> dict:
    return _load_model(str(path or MODEL_PATH))


def _linear(coefs: dict[str, float], feats: dict[str, float]) -> float:
    return sum(c * feats.get(k, 0.0) for k, c in coefs.items())


@dataclass
class Estimate:
    family: str
    part: Part
    utilization: dict
    modules: dict
    memories: list[dict]
    fmax_mhz: float | None
    fmax_basis: str
    fit: dict
    model: dict

    def to_dict(self) -> dict:
        return {"source": "estimate (accel.hw.fpga.estimate, no synthesis)", "family": self.family,
                "part": self.part.name, "utilization": self.utilization, "fit": self.fit,
                "fmax_mhz": self.fmax_mhz, "fmax_basis": self.fmax_basis, "modules": self.modules,
                "memories": self.memories, "model": self.model}


def estimate(cfg: AccelConfig, family: str = "xc7", part: Part | None = None,
             model: dict | None = None) -> Estimate:
    """Estimated utilization (lut, ff, dsp, bram, lutram) and Fmax of the accelerator for `cfg`."""
    if family not in _DSP:
        raise FpgaError(f"unknown FPGA family {family!r}; families are {', '.join(_DSP)}")
    part = part or default_part(family)
    model = model or load_model()
    cfg = family_config(cfg, family)     # what the flow builds for the family (ECP5: no DSP packing)
    base = "xc7"  # LUT/FF groups are fitted on 7-series results
    groups = model["families"][base]["groups"]
    feats = features(cfg)
    mems = [(mod, map_memory(shape, family)) for mod, shape in memories(cfg)]
    dsp_by_module: dict[str, int] = {}
    for m in multipliers(cfg, family):
        dsp_by_module[m.module] = dsp_by_module.get(m.module, 0) + m.count * dsp_count(m, family)
    lutram_by_group: dict[str, int] = {}
    for mod, mm in mems:
        g = group_of(mod, "")
        lutram_by_group[g] = lutram_by_group.get(g, 0) + mm.lutram_luts
    modules = {}
    lut_logic = ff = 0.0
    for g, f in feats.items():
        coef = groups.get(g, {"lut": {}, "ff": {}})
        lut_g = max(0.0, _linear(coef["lut"], f))
        ff_g = max(0.0, _linear(coef["ff"], f))
        modules[g] = {"lut_logic": round(lut_g), "ff": round(ff_g)}
        lut_logic += lut_g
        ff += ff_g
    for mod, n in dsp_by_module.items():
        modules.setdefault(group_of(mod, ""), {})["dsp"] = n
    lutram = sum(mm.lutram_luts for _, mm in mems)
    # Memories left to flip-flops cost their bits as FFs (and about as many LUTs for the muxes).
    ff_mem = sum(mm.ff_bits for _, mm in mems)
    if family == "ecp5":
        sc = model["families"]["ecp5"]["scale"]
        mac_bits = feats["gemm"]["mac_bits"]
        lut_logic = lut_logic * sc.get("lut", 1.0) + mac_bits * sc.get("lut_mac_bits", 0.0)
        ff = ff * sc.get("ff", 1.0) + mac_bits * sc.get("ff_mac_bits", 0.0)
    util = {"lut": round(lut_logic + lutram + ff_mem), "ff": round(ff + ff_mem),
            "dsp": sum(dsp_by_module.values()), "bram": sum(mm.bram for _, mm in mems), "lutram": lutram}
    fmax, basis = _fmax(cfg, family, model)
    return Estimate(family=family, part=part, utilization=util, modules=modules,
                    memories=[dict(mm.to_dict(), module=mod or "(top)") for mod, mm in mems],
                    fmax_mhz=fmax, fmax_basis=basis, fit=fit_check(util, part),
                    model={k: model.get(k) for k in ("rtl_key", "yosys", "calibrated_on", "errors")})


def _fmax(cfg: AccelConfig, family: str, model: dict) -> tuple[float | None, str]:
    sta = model["families"].get("xc7", {}).get("sta")
    if family == "xc7" and sta and sta.get("points"):
        # the longest path is the ALU lane's write-back cycle, nearly the same at every size: a line
        # in the MACs per cycle through the measured points (flat beyond them)
        pts = sorted((p["macs"], p["path_ns"]) for p in sta["points"].values())
        (m0, t0), (m1, t1) = pts[0], pts[-1]
        slope = (t1 - t0) / (m1 - m0) if m1 != m0 else 0.0
        path = t0 + slope * (min(max(cfg.macs_per_cycle, m0), m1) - m0)
        when = f"; {sta['measured_on']}" if sta.get("measured_on") else ""
        return (round(1000.0 / path, 1),
                f"{sta['basis']}: {path:.1f} ns, from {', '.join(sorted(sta['points']))}{when}")
    fm = model["families"].get("ecp5", {}).get("fmax")
    if not fm:
        return None, "no Fmax calibration in the model"
    # Path delay (ns) = fixed part (RAM clock-to-out, logic, routing) + a part growing with the GEMM core.
    delay = fm["t0_ns"] + fm["t_mac_ns"] * cfg.macs_per_cycle
    ecp5 = 1000.0 / delay
    stale = f"; {fm['stale']}" if fm.get("stale") else ""
    if family == "ecp5":
        return round(ecp5, 1), f"fit to nextpnr-ecp5 results (max error {fm.get('max_error_pct', '?')}%{stale})"
    return (round(ecp5 * XILINX_SPEED_FACTOR, 1),
            f"uncalibrated: ECP5 estimate x {XILINX_SPEED_FACTOR} (yosys sta is calibrated for 7-series only; "
            "Vivado measures it)")


def current_source_key() -> str | None:
    """Hash of the RTL and ISA sources (accel.hw.verilog's cache key of the tiny config), or None."""
    try:
        return source_key(PRESETS["tiny"])
    except Exception:  # no Amaranth or no readable RTL sources here: nothing to compare with
        return None


def model_is_current(model: dict | None = None) -> bool | None:
    """False when the RTL sources changed since the model was calibrated (re-run calibrate.py)."""
    model = model or load_model()
    now, then = current_source_key(), model.get("rtl_source_key")
    return None if now is None or then is None else now == then


# ---- the RTL's memories as written in its Verilog (for checking the inventory) ----------------------
_MEM_DECL = re.compile(r"^\s*reg\s*\[(\d+):0\]\s*(\S+)\s*\[(\d+):0\]\s*;", re.M)
_MODULE = re.compile(r"^module\s+(\\\S+|[\w$]+)", re.M)


def verilog_memories(text: str) -> list[tuple[str, str, int, int, int]]:
    """(module, memory, depth, width, read ports) of each memory array in a yosys-written Verilog file."""
    out = []
    starts = [(m.start(), m.group(1).lstrip("\\")) for m in _MODULE.finditer(text)] + [(len(text), "")]
    for (pos, mod), (end, _) in zip(starts, starts[1:]):
        body = text[pos:end]
        for d in _MEM_DECL.finditer(body):
            name = d.group(2)
            reads = len(re.findall(rf"=\s*{re.escape(name)}\[", body))
            out.append((mod, name, int(d.group(3)) + 1, int(d.group(1)) + 1, reads))
    return out
