"""AccelConfig: every hardware parameter of the accelerator, validated, with JSON in/out and presets.

Everything else (instruction field widths, buffer depths, RTL port widths, the simulators, the
compiler's tiling) derives from one AccelConfig; nothing else stores a size. Derived values are
properties, computed on access, never stored twice.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path

from .errors import ConfigError
from .files import write_atomic
from .isa import formats_for
from .schema import describe, json_type, parse_json, read_bounded

# the fixed field widths, importable from here as before
from .widths import (  # noqa: F401
    ALU_IMM_BITS,
    ALU_OPCODE_BITS,
    DEP_FLAG_BITS,
    INSN_BITS,
    LOOP_ITER_BITS,
    MEM_TYPE_BITS,
    OPCODE_BITS,
    PAD_BITS,
    SIZE_BITS,
)

KiB = 1024


# Documented maxima (docs/limits.md): every size the kit allocates or elaborates is bounded
# here, so no config or file can make it use unbounded memory. `accel verilog` needs about 1 KiB
# of host memory per byte of on-chip buffer beyond a few hundred KiB (measured: 0.35 GB for the
# default's 480 KiB, 1.15 GB with a 1 MiB weight buffer; a 64 MiB one ran out of 3.9 GB).
MAX_BUFF_BYTES = 1 << 20        # one on-chip buffer (VTA's largest published buffer is 256 KiB)
MAX_ONCHIP_BYTES = 2 << 20      # the five buffers together: elaboration stays under about 2.5 GB

# The AXI4 bus the DMAs (accel/hw/dma.py, store.py) and the timing model (sim/tsim) share.
MAX_BURST_BEATS = 256       # AXI4 INCR limit
BOUNDARY_BYTES = 4096        # an AXI burst must not cross a 4 KiB boundary
MAX_OUTSTANDING = 8          # bursts in flight per direction (accel/hw/axi.py counters, Vivado NUM_*_OUTSTANDING)


BUFFER_KEYS = ("uop_buff_bytes", "inp_buff_bytes", "wgt_buff_bytes", "acc_buff_bytes", "out_buff_bytes")

#: Each key's rule in words, for the message of a value of the wrong type.
_RULES = {
    **{k: "a power of two in [1, 256]" for k in ("batch", "block_in", "block_out")},
    **{k: "allowed values are 8, 16" for k in ("inp_width", "wgt_width", "out_width")},
    "acc_width": "allowed values are 16, 32",
    **{k: f"bytes, a power-of-two number of entries, at most {MAX_BUFF_BYTES}" for k in BUFFER_KEYS},
    "bus_width": "allowed values are 32, 64, 128, 256, 512",
    **{k: "a power of two in [2, 4096]" for k in ("cmd_queue_depth", "dep_queue_depth")},
    "dram_addr_width": "allowed range is [16, 48]",
    **{k: f"allowed range is [1, {MAX_OUTSTANDING}]" for k in ("read_outstanding", "write_outstanding")},
    "clock_mhz": "allowed range is [1, 1000]",
    "dsp_packing": "true or false",
}


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _clog2(v: int) -> int:
    """Bits needed to index v entries (at least 1)."""
    return max(1, (v - 1).bit_length())


@dataclass(frozen=True)
class AccelConfig:
    """The accelerator's parameters. Field names are the JSON keys.

    batch, block_in, block_out: GEMM core shape; a GEMM micro-op computes a
        (batch x block_in) @ (block_in x block_out) product into a (batch x block_out) accumulator tile.
    inp_width, wgt_width, acc_width, out_width: element bit widths (signed).
    *_buff_bytes: on-chip buffer sizes in bytes. The output buffer mirrors the accumulator's
        index space (compute writes the narrowed result of acc[i] to out[i]), so it must hold
        exactly as many entries as the accumulator.
    bus_width: memory bus data width in bits (AXI data width).
    cmd_queue_depth: depth of the fetch -> load/compute/store command queues.
    dep_queue_depth: depth of each of the four dependency-token queues.
    read_outstanding: read bursts the AXI master keeps in flight at once (all clients together),
        so that loads are bound by DRAM bandwidth rather than latency.
    write_outstanding: write bursts whose B response may be pending at once.
    dram_addr_width: DRAM address width in bits (byte addresses).
    clock_mhz: target clock, used for GOPS figures and board clocking.
    dsp_packing: the GEMM core computes two products per multiplier where the widths allow it
        (8-bit inputs and weights: two int8 products per DSP48E1, accel/hw/gemm.py); false, one
        product per multiplier (fewer LUTs, twice the DSPs).
    """

    batch: int = 1
    block_in: int = 16
    block_out: int = 16
    inp_width: int = 8
    wgt_width: int = 8
    acc_width: int = 32
    out_width: int = 8
    uop_buff_bytes: int = 32 * KiB
    inp_buff_bytes: int = 32 * KiB
    wgt_buff_bytes: int = 256 * KiB
    acc_buff_bytes: int = 128 * KiB
    out_buff_bytes: int = 32 * KiB
    bus_width: int = 64
    cmd_queue_depth: int = 32
    dep_queue_depth: int = 32
    read_outstanding: int = 4
    write_outstanding: int = 4
    dram_addr_width: int = 32
    clock_mhz: float = 100.0
    dsp_packing: bool = True

    def __post_init__(self):
        self._validate()

    # ---- validation -------------------------------------------------------------------------
    def _fail(self, key: str, why: str):
        raise ConfigError(f"AccelConfig.{key}={describe(getattr(self, key))}: {why}")

    def _validate(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in ("bool", bool):
                if not isinstance(v, bool):
                    self._fail(f.name, "must be true or false")
                continue
            want = float if f.type in ("float", float) else int
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (want is int and not isinstance(v, int)):
                self._fail(f.name, f"must be {'a number' if want is float else 'an integer'} "
                                   f"({_RULES.get(f.name, 'see AccelConfig')})")
        for key in ("batch", "block_in", "block_out"):
            v = getattr(self, key)
            if not _is_pow2(v) or v > 256:
                self._fail(key, "must be a power of two in [1, 256]")
        for key in ("inp_width", "wgt_width", "out_width"):
            if getattr(self, key) not in (8, 16):
                self._fail(key, "allowed values are 8, 16 (whole bytes keep DRAM tiles plain arrays)")
        if self.acc_width not in (16, 32):
            self._fail("acc_width", "allowed values are 16, 32")
        for key in ("inp_width", "wgt_width", "out_width"):
            if getattr(self, key) > self.acc_width:
                self._fail(key, f"must not exceed acc_width={self.acc_width}")
        for key, elem in (("uop_buff_bytes", self.uop_elem_bytes), ("inp_buff_bytes", self.inp_elem_bytes),
                          ("wgt_buff_bytes", self.wgt_elem_bytes), ("acc_buff_bytes", self.acc_elem_bytes),
                          ("out_buff_bytes", self.out_elem_bytes)):
            v = getattr(self, key)
            if not elem <= v <= MAX_BUFF_BYTES:
                self._fail(key, f"allowed range is [{elem}, {MAX_BUFF_BYTES}] bytes (one {elem}-byte entry to "
                                f"{MAX_BUFF_BYTES >> 20} MiB)")
            if v % elem:
                self._fail(key, f"must be a positive multiple of its entry size ({elem} bytes)")
            if not _is_pow2(v // elem):
                self._fail(key, f"must hold a power-of-two number of {elem}-byte entries (holds {v / elem:g})")
        if self.out_depth != self.acc_depth:
            self._fail("out_buff_bytes", f"the output buffer mirrors the accumulator's {self.acc_depth} entries, "
                                         f"so it must be {self.acc_depth * self.out_elem_bytes} bytes")
        onchip = sum(getattr(self, k) for k in BUFFER_KEYS)
        if onchip > MAX_ONCHIP_BYTES:
            big = max(BUFFER_KEYS, key=lambda k: getattr(self, k))
            self._fail(big, f"the five buffers total {onchip} bytes, more than the {MAX_ONCHIP_BYTES} "
                            f"({MAX_ONCHIP_BYTES >> 20} MiB) allowed on chip")
        if self.bus_width not in (32, 64, 128, 256, 512):
            self._fail("bus_width", "allowed values are 32, 64, 128, 256, 512")
        for key in ("cmd_queue_depth", "dep_queue_depth"):
            v = getattr(self, key)
            if not _is_pow2(v) or not 2 <= v <= 4096:
                self._fail(key, "must be a power of two in [2, 4096]")
        for key in ("read_outstanding", "write_outstanding"):
            if not 1 <= getattr(self, key) <= MAX_OUTSTANDING:
                self._fail(key, f"allowed range is [1, {MAX_OUTSTANDING}]")
        if not 16 <= self.dram_addr_width <= 48:
            self._fail("dram_addr_width", "allowed range is [16, 48]")
        if not 1.0 <= self.clock_mhz <= 1000.0:   # False for NaN
            self._fail("clock_mhz", "allowed range is [1, 1000]")
        # Index fields must fit the 128-bit instruction word.
        for name, bits in self.insn_bits_used().items():
            if bits > INSN_BITS:
                key = "dram_addr_width" if name in ("LOAD", "STORE") else (
                    "uop_buff_bytes" if self.uop_idx_bits >= self.acc_idx_bits else "acc_buff_bytes")
                self._fail(key, f"the {name} instruction would need {bits} bits, more than the "
                                f"{INSN_BITS}-bit instruction word (index widths: acc {self.acc_idx_bits}, "
                                f"inp {self.inp_idx_bits}, wgt {self.wgt_idx_bits}, uop {self.uop_idx_bits} bits)")

    # ---- derived: element sizes and depths ----------------------------------------------------
    @cached_property
    def inp_elem_bytes(self) -> int:
        """Bytes of one input-buffer entry: a batch x block_in tile."""
        return self.batch * self.block_in * self.inp_width // 8

    @cached_property
    def wgt_elem_bytes(self) -> int:
        """Bytes of one weight-buffer entry: a block_out x block_in tile."""
        return self.block_out * self.block_in * self.wgt_width // 8

    @cached_property
    def acc_elem_bytes(self) -> int:
        """Bytes of one accumulator entry: a batch x block_out tile of acc_width values."""
        return self.batch * self.block_out * self.acc_width // 8

    @cached_property
    def out_elem_bytes(self) -> int:
        """Bytes of one output-buffer entry: a batch x block_out tile of out_width values."""
        return self.batch * self.block_out * self.out_width // 8

    @cached_property
    def acc_idx_bits(self) -> int:
        return _clog2(self.acc_buff_bytes // self.acc_elem_bytes)

    @cached_property
    def inp_idx_bits(self) -> int:
        return _clog2(self.inp_buff_bytes // self.inp_elem_bytes)

    @cached_property
    def wgt_idx_bits(self) -> int:
        return _clog2(self.wgt_buff_bytes // self.wgt_elem_bytes)

    @cached_property
    def src_idx_bits(self) -> int:
        """Micro-op source index: an input index for GEMM, an accumulator index for ALU."""
        return max(self.inp_idx_bits, self.acc_idx_bits)

    @cached_property
    def uop_bits(self) -> int:
        """Micro-op word width: the three index fields rounded up to 32 or 64 bits."""
        used = self.acc_idx_bits + self.src_idx_bits + self.wgt_idx_bits
        return 32 if used <= 32 else 64

    @cached_property
    def uop_elem_bytes(self) -> int:
        return self.uop_bits // 8

    @cached_property
    def uop_idx_bits(self) -> int:
        return _clog2(self.uop_depth)

    @cached_property
    def uop_depth(self) -> int:
        return self.uop_buff_bytes // self.uop_elem_bytes

    @cached_property
    def inp_depth(self) -> int:
        return self.inp_buff_bytes // self.inp_elem_bytes

    @cached_property
    def wgt_depth(self) -> int:
        return self.wgt_buff_bytes // self.wgt_elem_bytes

    @cached_property
    def acc_depth(self) -> int:
        return self.acc_buff_bytes // self.acc_elem_bytes

    @cached_property
    def out_depth(self) -> int:
        return self.out_buff_bytes // self.out_elem_bytes

    @cached_property
    def sram_idx_bits(self) -> int:
        """Width of the sram_base field of LOAD/STORE: indexes the deepest buffer."""
        return max(self.uop_idx_bits, self.inp_idx_bits, self.wgt_idx_bits, self.acc_idx_bits)

    @cached_property
    def bus_bytes(self) -> int:
        return self.bus_width // 8

    @cached_property
    def max_burst_beats(self) -> int:
        """Longest burst the DMAs issue: the AXI4 limit, and never more than 4 KiB."""
        return min(MAX_BURST_BEATS, BOUNDARY_BYTES // self.bus_bytes)

    # ---- derived: performance ---------------------------------------------------------------
    @cached_property
    def macs_per_cycle(self) -> int:
        """Peak multiply-accumulates per cycle of the GEMM core (one micro-op per cycle)."""
        return self.batch * self.block_in * self.block_out

    @cached_property
    def peak_gops(self) -> float:
        """Peak giga-operations per second at clock_mhz (one MAC = two operations)."""
        return 2 * self.macs_per_cycle * self.clock_mhz / 1e3

    def insn_bits_used(self) -> dict[str, int]:
        """Bits each instruction format needs under this config (all must be <= 128)."""
        return {name: sum(w for _, w in fmt) for name, fmt in formats_for(self).items()}

    # ---- JSON and identity ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict) -> "AccelConfig":
        """A parsed JSON object -> config; keys left out keep their defaults."""
        if not isinstance(d, dict):
            raise ConfigError(f"AccelConfig: expected a JSON object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(describe(k, 40) for k in set(d) - known)
        if unknown:
            raise ConfigError(f"AccelConfig: unknown key(s) {', '.join(unknown)}; "
                              f"allowed keys are {', '.join(sorted(known))}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "AccelConfig") -> "AccelConfig":
        """JSON text (str, or bytes that must be UTF-8) -> config; `source` names it in errors."""
        d = parse_json(text, source, ConfigError, max_depth=4, max_bytes=1 << 20)
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a JSON object of config keys, got {json_type(d)}")
        try:
            return cls.from_dict(d)
        except ConfigError as e:
            if source == "AccelConfig":
                raise
            raise ConfigError(f"{source}: {e}") from None   # name the file the bad key is in

    def save(self, path: str | Path) -> None:
        write_atomic(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "AccelConfig":
        data = read_bounded(path, 1 << 20, str(path), ConfigError)
        return cls.from_json(data, source=str(path))

    def replace(self, **changes) -> "AccelConfig":
        return dataclasses.replace(self, **changes)

    def digest(self) -> str:
        """Short stable hash of the config, used to key caches of generated artefacts."""
        return hashlib.sha256(self.to_json(indent=None).encode()).hexdigest()[:16]

    def summary(self) -> dict:
        """The config with its derived values, for `accel config show`."""
        derived = {k: getattr(self, k) for k in (
            "inp_depth", "wgt_depth", "acc_depth", "out_depth", "uop_depth",
            "inp_elem_bytes", "wgt_elem_bytes", "acc_elem_bytes", "out_elem_bytes", "uop_bits",
            "acc_idx_bits", "inp_idx_bits", "wgt_idx_bits", "uop_idx_bits", "sram_idx_bits",
            "macs_per_cycle", "peak_gops")}
        derived["insn_bits_used"] = self.insn_bits_used()
        return {"config": self.to_dict(), "derived": derived}


# ---- presets ----------------------------------------------------------------------------------
PRESETS: dict[str, AccelConfig] = {
    # VTA's published default (vta_config.json): 1x16x16, int8 x int8 -> int32.
    "default": AccelConfig(),
    # The PYNQ-Z1 build of VTA: the default core at 100 MHz on a 64-bit HP port.
    "pynq-z1": AccelConfig(clock_mhz=100.0, bus_width=64),
    # Larger core for Zynq UltraScale+ boards (Ultra96, ZCU104).
    "ultra96": AccelConfig(block_in=16, block_out=16, batch=1, wgt_buff_bytes=256 * KiB, bus_width=128, clock_mhz=200.0),
    # Small and fast for RTL tests: 1x4x4 with small buffers.
    "tiny": AccelConfig(block_in=4, block_out=4, uop_buff_bytes=1 * KiB, inp_buff_bytes=1 * KiB,
                        wgt_buff_bytes=2 * KiB, acc_buff_bytes=4 * KiB, out_buff_bytes=1 * KiB,
                        bus_width=64, cmd_queue_depth=8, dep_queue_depth=8, clock_mhz=100.0),
}


def preset(name: str) -> AccelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown config preset {name!r}; presets are {', '.join(PRESETS)}") from None


def resolve_config(spec: "str | Path | AccelConfig | None") -> AccelConfig:
    """A preset name, a JSON file path, or a config itself -> AccelConfig (CLI and API entry)."""
    if spec is None:
        return PRESETS["default"]
    if isinstance(spec, AccelConfig):
        return spec
    s = str(spec)
    if s in PRESETS:
        return PRESETS[s]
    try:
        is_file = s.endswith(".json") or Path(s).exists()
    except (OSError, ValueError):     # a name too long, or with a NUL byte
        is_file = False
    if is_file:
        return AccelConfig.load(s)
    raise ConfigError(f"config {s!r} is neither a preset ({', '.join(PRESETS)}) nor a JSON file")
