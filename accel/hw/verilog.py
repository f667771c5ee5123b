"""Verilog generation: the Accelerator top level as one Verilog file plus a JSON description.

generate(cfg, out_dir) writes <TOP>.v (ports named like Vivado's AXI inference expects:
m_axi_awaddr, s_axil_wdata, ...), <TOP>.json (ports with direction and width, the register
map, the config and its derived values) and <TOP>.vlt (the justified Verilator lint waivers:
`verilator --lint-only -Wall accel_top.vlt accel_top.v` passes). Results are cached under
.cache/verilog/<key>, the key hashing the config, the code of accel/hw and accel/isa (docstrings
and comments left out: editing documentation keeps every cached build) and the Amaranth
version, so a second call with the same inputs copies files instead of elaborating. The config
is resolved and validated before anything is elaborated, so a bad config fails with its
ConfigError.
`accel verilog` is add_arguments + run below.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

from accel.isa import AccelConfig, resolve_config
from accel.progress import task

from .params import ERROR_TEXT, ErrorCode

log = logging.getLogger(__name__)

TOP_NAME = "accel_top"
LINT_WAIVERS = Path(__file__).resolve().parent / "lint_waivers.vlt"
_ROOT = Path(__file__).resolve().parents[2]
_SOURCE_DIRS = (Path(__file__).resolve().parent, _ROOT / "accel" / "isa")


def cache_root() -> Path:
    """Where generated artefacts are cached (ACCEL_CACHE_DIR overrides <repo>/.cache)."""
    return Path(os.environ.get("ACCEL_CACHE_DIR", _ROOT / ".cache"))


def _code_text(path: Path) -> str:
    """A source file as far as it can change the Verilog: Python without comments and docstrings
    (so editing documentation does not invalidate every cached build), other files verbatim."""
    text = path.read_text()
    if path.suffix != ".py":
        return text
    tree = ast.parse(text)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def source_key(cfg: AccelConfig) -> str:
    """Hash of everything the Verilog depends on: config, RTL and ISA code, Amaranth version."""
    import amaranth  # noqa: PLC0415 - amaranth loads only when RTL is elaborated
    h = hashlib.sha256(cfg.to_json(indent=None).encode())
    h.update(amaranth.__version__.encode())
    for d in _SOURCE_DIRS:
        for p in sorted([*d.glob("*.py"), *d.glob("*.vlt")]):
            h.update(p.name.encode())
            h.update(_code_text(p).encode())
    return h.hexdigest()[:16]


def port_list(top) -> list[tuple[str, str, int, object]]:
    """(name, "input"/"output", width, signal) of the top level's interface ports, names joined with
    "_" (the Verilog module also has the `clk` and `rst` inputs of its sync domain)."""
    from amaranth.hdl import Value  # noqa: PLC0415 - amaranth loads only when RTL is elaborated
    from amaranth.lib import wiring  # noqa: PLC0415 - amaranth loads only when RTL is elaborated
    ports = []
    for path, member, value in top.signature.flatten(top):
        value = Value.cast(value)
        ports.append(("_".join(map(str, path)), "input" if member.flow == wiring.In else "output", len(value), value))
    return ports


def describe(cfg: AccelConfig, top=None) -> dict:
    """The JSON description: ports, register map, config, derived values, interface notes."""
    from .axi import AXI_CACHE_NORMAL, ID_WIDTH, READ_ID, WRITE_ID  # noqa: PLC0415 - accel.hw.axi pulls in amaranth on import
    from .regs import REG_ADDR_WIDTH, register_map  # noqa: PLC0415 - accel.hw.regs pulls in amaranth on import
    from .top import READ_CLIENTS, Accelerator  # noqa: PLC0415 - accel.hw.top pulls in amaranth on import
    if top is None:
        top = Accelerator(cfg)
        top._MustUse__silence = True   # only its signature is read here, it is not elaborated
    return {
        "top": TOP_NAME,
        "clock": {"name": "clk", "mhz": cfg.clock_mhz}, "reset": {"name": "rst", "active": "high", "sync": True},
        "ports": [{"name": "clk", "direction": "input", "width": 1},
                  {"name": "rst", "direction": "input", "width": 1}] +
                 [{"name": n, "direction": d, "width": w} for n, d, w, _ in port_list(top)],
        "interfaces": {
            "m_axi": {"protocol": "AXI4", "role": "master", "addr_width": cfg.dram_addr_width,
                      "data_width": cfg.bus_width, "max_burst_beats": cfg.max_burst_beats,
                      "id_width": ID_WIDTH, "arid": READ_ID, "awid": WRITE_ID,
                      "cache": AXI_CACHE_NORMAL, "read_clients": list(READ_CLIENTS)},
            "s_axil": {"protocol": "AXI4-Lite", "role": "slave", "addr_width": REG_ADDR_WIDTH, "data_width": 32},
            "irq": {"sense": "level-high", "meaning": "STATUS.done & CTRL.irq_enable"}},
        "registers": [{"offset": r.offset, "offset_hex": f"0x{r.offset:02X}", "name": r.name, "access": r.access,
                       "description": r.description} for r in register_map(cfg)],
        "error_codes": {e.name: {"code": int(e), "meaning": ERROR_TEXT.get(e, "none")} for e in ErrorCode},
        "config": cfg.to_dict(), "config_digest": cfg.digest(),
        "derived": cfg.summary()["derived"],
    }


def _elaborate(cfg: AccelConfig) -> tuple[str, dict]:
    from amaranth.back import verilog as amaranth_verilog  # noqa: PLC0415 - amaranth loads only when RTL is elaborated
    from amaranth.hdl._ir import PortDirection  # noqa: PLC0415 - amaranth loads only when RTL is elaborated; convert(ports={name: (value, direction)})

    from .top import Accelerator  # noqa: PLC0415 - accel.hw.top pulls in amaranth on import
    with task(f"Verilog elaboration of {TOP_NAME} ({cfg.digest()})", 3) as t:
        t.update(0, detail="building the design")
        top = Accelerator(cfg)
        ports = {name: (value, PortDirection(direction)) for name, direction, _w, value in port_list(top)}
        t.update(1, detail="elaborating and writing Verilog (Amaranth + yosys)")
        text = amaranth_verilog.convert(top, name=TOP_NAME, ports=ports, emit_src=False)
        t.update(2, detail="port and register description")
        desc = describe(cfg, top)
        t.update(3)
    return text, desc


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")   # per process: parallel test workers
    tmp.write_text(text)
    tmp.replace(path)


def generate(config, out_dir: str | Path | None = None, *, use_cache: bool = True) -> dict:
    """Verilog and JSON for `config` (preset name, JSON path or AccelConfig).

    Returns {"verilog": Path, "json": Path, "cached": bool, "seconds": float, "lines": int,
    "key": str}. With out_dir None the files stay in the cache directory.
    """
    cfg = resolve_config(config)   # validates: a bad config fails here, before elaboration
    t0 = time.perf_counter()
    key = source_key(cfg)
    cdir = cache_root() / "verilog" / key
    v_name, j_name = f"{TOP_NAME}.v", f"{TOP_NAME}.json"
    cached = use_cache and (cdir / v_name).exists() and (cdir / j_name).exists()
    if not cached:
        log.info("elaborating %s for config %s", TOP_NAME, cfg.digest())
        text, desc = _elaborate(cfg)
        cdir.mkdir(parents=True, exist_ok=True)
        _write_atomic(cdir / v_name, text)
        _write_atomic(cdir / j_name, json.dumps(desc, indent=2) + "\n")
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        for src, name in ((cdir / v_name, v_name), (cdir / j_name, j_name), (LINT_WAIVERS, f"{TOP_NAME}.vlt")):
            tmp = out / f"{name}.{os.getpid()}.tmp"
            shutil.copyfile(src, tmp)
            tmp.replace(out / name)
    else:
        out = cdir
    lines = (out / v_name).read_text().count("\n")
    return {"verilog": out / v_name, "json": out / j_name, "cached": cached, "key": key,
            "seconds": time.perf_counter() - t0, "lines": lines}


# ---- `accel verilog` ------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="default", metavar="C", help="preset name or JSON file (default: %(default)s)")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="directory for accel_top.v and accel_top.json")
    p.add_argument("--no-cache", action="store_true", help="elaborate even if a cached result exists")
    p.set_defaults(func=run)


def run(args) -> int:
    res = generate(args.config, args.output, use_cache=not args.no_cache)
    how = "from cache" if res["cached"] else "elaborated"
    print(f"wrote {res['verilog']} ({res['lines']} lines) and {res['json']} ({how} in {res['seconds']:.2f} s)")
    return 0
