"""The accelerator's Verilog as the FPGA flow consumes it: one source file, its top module, the
grouped top-level ports and the generator's description (register map).

`rtl_for_config` asks the kit's generator (accel.hw.verilog) for a config (`family_config` first
adapts it to the FPGA family: no DSP packing on ECP5); `rtl_from_files` reads a
Verilog file (and optionally its description JSON) written elsewhere, which is also how tests feed
the flow a stand-in core.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from accel.isa import AccelConfig

from .errors import FpgaError, RtlUnavailableError
from .ports import TopPorts, read_top_ports

log = logging.getLogger(__name__)


def family_config(cfg: AccelConfig, family: str | None) -> AccelConfig:
    """The config as built for `family`. ECP5: dsp_packing off, because a MULT18X18D cannot hold
    the two int8 products of the Xilinx packing (no 25x18 multiplier with a wide enough output),
    so packing saves no DSP there and only adds the split's LUTs. The JSON key is kept; the
    change is logged. Other families: unchanged."""
    if family == "ecp5" and cfg.dsp_packing:
        log.info("ecp5: building config %s without dsp_packing (a MULT18X18D holds one int8 product; "
                 "packing would add LUTs, save no DSP)", cfg.digest())
        return cfg.replace(dsp_packing=False)
    return cfg


@dataclass
class RtlSource:
    """Verilog of one accelerator build plus what the shells and reports need to know about it."""

    verilog: str
    top: str
    ports: TopPorts
    description: dict = field(default_factory=dict)
    origin: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.verilog.encode()).hexdigest()

    @property
    def registers(self) -> list | dict | None:
        """The control register map from the generator's description, if it gave one."""
        for key in ("registers", "register_map", "regs"):
            if key in self.description:
                return self.description[key]
        return None

    @property
    def file_name(self) -> str:
        return f"{self.top.lstrip(chr(92)).replace('.', '_')}.v"


def make_rtl(verilog: str, description: dict | None = None, *, top: str | None = None, origin: str = "") -> RtlSource:
    description = dict(description or {})
    top = top or description.get("top") or description.get("module") or None
    ports = read_top_ports(verilog, top)
    return RtlSource(verilog=verilog, top=ports.module, ports=ports, description=description, origin=origin)


def rtl_from_files(verilog_path: str | Path, description_path: str | Path | None = None,
                   *, top: str | None = None) -> RtlSource:
    verilog_path = Path(verilog_path)
    try:
        text = verilog_path.read_text()
    except OSError as e:
        raise FpgaError(f"cannot read Verilog {verilog_path}: {e.strerror}") from None
    desc = {}
    if description_path is None:
        guess = verilog_path.with_suffix(".json")
        description_path = guess if guess.exists() else None
    if description_path is not None:
        try:
            desc = json.loads(Path(description_path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise FpgaError(f"cannot read the port/register description {description_path}: {e}") from None
    return make_rtl(text, desc, top=top, origin=str(verilog_path))


# ---- the kit's generator --------------------------------------------------------------------
_GENERATOR_MODULE = "accel.hw.verilog"


def _call_generator(cfg: AccelConfig, out_dir: Path):
    """Run accel.hw.verilog for `cfg`, writing into out_dir; returns (verilog text, description)."""
    try:
        gen = importlib.import_module(_GENERATOR_MODULE)
    except ImportError as e:
        raise RtlUnavailableError(f"the Verilog generator {_GENERATOR_MODULE} cannot be imported ({e}); "
                                  f"pass --verilog FILE to use Verilog generated elsewhere") from None
    fn = getattr(gen, "generate", None) or getattr(gen, "write_verilog", None)
    if fn is None:
        raise RtlUnavailableError(f"{_GENERATOR_MODULE} has no generate() or write_verilog() function")
    try:
        params = inspect.signature(fn).parameters
        result = fn(cfg, out_dir) if len(params) >= 2 else fn(cfg)
    except FpgaError:
        raise
    except Exception as e:  # the generator's own errors carry their message; name the stage
        raise RtlUnavailableError(f"{_GENERATOR_MODULE}.{fn.__name__} failed for config {cfg.digest()}: "
                                  f"{type(e).__name__}: {e}") from e
    return _normalize_result(result, out_dir)


def _normalize_result(result, out_dir: Path):
    """Accept the generator's result as paths, texts, or an object with those attributes."""
    verilog = desc = None
    if isinstance(result, dict):
        verilog = result.get("verilog") or result.get("verilog_path")
        desc = result.get("json") or result.get("description")
    elif isinstance(result, tuple) and len(result) == 2:
        verilog, desc = result
    elif isinstance(result, (str, Path)):
        verilog = result
    elif result is not None:
        verilog = getattr(result, "verilog_path", None) or getattr(result, "verilog", None)
        desc = (getattr(result, "description_path", None) or getattr(result, "json_path", None)
                or getattr(result, "description", None) or getattr(result, "ports", None))
    if verilog is None:
        vs = sorted(out_dir.glob("*.v"))
        if len(vs) != 1:
            raise RtlUnavailableError(f"{_GENERATOR_MODULE} returned nothing usable and wrote {len(vs)} .v files")
        verilog = vs[0]
    if isinstance(verilog, Path) or (isinstance(verilog, str) and "\n" not in verilog and Path(verilog).exists()):
        vpath = Path(verilog)
        verilog = vpath.read_text()
        if desc is None and vpath.with_suffix(".json").exists():
            desc = vpath.with_suffix(".json")
    if isinstance(desc, (str, Path)) and "\n" not in str(desc) and Path(desc).exists():
        desc = json.loads(Path(desc).read_text())
    elif isinstance(desc, str):
        desc = json.loads(desc)
    return verilog, (desc if isinstance(desc, dict) else {})


def rtl_for_config(cfg: AccelConfig, work_dir: str | Path | None = None, *, family: str | None = None) -> RtlSource:
    """Generate the accelerator's Verilog for `cfg` with the kit's generator (as built for
    `family`, when given: `family_config`)."""
    cfg = family_config(cfg, family)
    with tempfile.TemporaryDirectory(prefix="accel-rtl-") as tmp:
        out = Path(work_dir) if work_dir is not None else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        verilog, desc = _call_generator(cfg, out)
        return make_rtl(verilog, desc, origin=f"{_GENERATOR_MODULE} (config {cfg.digest()})")
