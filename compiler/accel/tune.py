"""Tiling by measurement: run the best analytical candidates on the timing model, keep the fastest.

The analytical cost (conv2d.estimate_cycles) ranks tilings; the timing model (driver `tsim`,
cycle-exact with the RTL) decides among the top few. Results go to a JSON tuning log keyed by
config digest, layer and virtual threads, so a tuned layer costs one lookup the next time.
Cycle counts do not depend on the data, so candidates run on zero-filled buffers.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

from accel.isa import AccelConfig
from accel.isa.files import write_atomic
from host_runtime import Device

from .emit import emit_conv2d
from .plan import conv2d_candidates
from .spec import Conv2dSpec, ConvTiling, Requant, ResidualAdd, TilingError, _Geom, residual_identity

log = logging.getLogger(__name__)


def _key(spec: Conv2dSpec, cfg: AccelConfig, vt: int, residual: bool = False) -> str:
    return (f"{cfg.digest()}:{spec.n}x{spec.c}x{spec.h}x{spec.w}->{spec.o}:k{spec.kh}x{spec.kw}"
            f":p{','.join(map(str, spec.pads))}:s{spec.strides[0]},{spec.strides[1]}:vt{vt}"
            + (f":d{spec.dilations[0]},{spec.dilations[1]}" if spec.dilations != (1, 1) else "")
            + (":residual" if residual else ""))


def measure_conv2d(spec: Conv2dSpec, cfg: AccelConfig, tiling: ConvTiling, driver: str = "tsim",
                   bias: bool = True, requant: Requant = Requant(8, 0, 127), residual: bool = False) -> int:
    """Cycles of one conv2d with this tiling on a timing driver (zero data); with `residual`, a
    fused residual add as the compiler fuses MobileNetV2's (out = (y + 2 r) >> 1, clamped)."""
    g = _Geom.of(spec, cfg)
    out_bytes = g.nb * g.ob * spec.oh * spec.ow * cfg.out_elem_bytes
    sizes = {"inp": g.nb * g.cb * spec.h * spec.w * cfg.inp_elem_bytes,
             "wgt": g.ob * g.cb * spec.kh * spec.kw * cfg.wgt_elem_bytes,
             "out": out_bytes, "bias": g.ob * cfg.acc_elem_bytes, "res": out_bytes if residual else 0}
    need = sum(sizes.values()) + (16 << 20)
    with Device(cfg, driver=driver, dram_bytes=min(1 << cfg.dram_addr_width, need)) as dev:
        aligns = {"inp": cfg.inp_elem_bytes, "wgt": cfg.wgt_elem_bytes, "out": cfg.out_elem_bytes,
                  "bias": cfg.acc_elem_bytes, "res": cfg.out_elem_bytes}
        bufs = {k: dev.memory.alloc(v, align=aligns[k], name=k) for k, v in sizes.items() if v}
        fused = None
        if residual:
            ident = dev.memory.alloc_array(residual_identity(cfg, 0, 1), align=cfg.wgt_elem_bytes, name="identity")
            fused = ResidualAdd(bufs["res"], ident, 0, 1, Requant(1, -127, 127, True))
        stream = dev.stream()
        stream.emit_preloaded(lambda s: emit_conv2d(s, spec, tiling, bufs["inp"], bufs["wgt"], bufs["out"],
                                                   bufs["bias"] if bias else None, requant, fused))
        result = stream.synchronize()
    if result.cycles is None:
        raise ValueError(f"driver {driver!r} reports no cycles; tuning needs a timing driver")
    return int(result.cycles)


def read_tuning_log(path: str | Path) -> dict:
    """The records of a JSON tuning log ({} when the file does not exist yet); TilingError naming
    the file when it is not one."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        book = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TilingError(f"tuning log {path}: cannot read it as JSON ({e}); fix or delete it") from None
    if not isinstance(book, dict) or not all(isinstance(r, dict) and "tiling" in r for r in book.values()):
        raise TilingError(f"tuning log {path}: expected a JSON object of tuning records "
                          "(key -> {\"tiling\": ..., \"cycles\": ...}); fix or delete it")
    return book


def tune_conv2d(spec: Conv2dSpec, cfg: AccelConfig, vt: int = 2, top: int = 6, driver: str = "tsim",
                log_path: str | Path | None = None, residual: bool = False) -> tuple[ConvTiling, dict]:
    """The fastest of the `top` cheapest analytical tilings, measured on `driver`; with log_path,
    read and extend a JSON tuning log. Returns (tiling, record). With `residual`, only tilings
    that leave room for a fused residual add compete; they are measured without it (the add is
    one identity GEMM micro-op per output entry whatever the tiling)."""
    key = _key(spec, cfg, vt, residual)
    book = read_tuning_log(log_path) if log_path else {}
    if key in book:
        return ConvTiling(**book[key]["tiling"]), book[key]
    cands = conv2d_candidates(spec, cfg, vt, residual)[:top]
    trials = []
    for est, t in cands:
        cycles = measure_conv2d(spec, cfg, t, driver)
        trials.append({"tiling": asdict(t), "estimate": est, "cycles": cycles})
        log.info("%s %s: %d cycles (estimate %.0f)", spec.name, t.describe(), cycles, est)
    best = min(trials, key=lambda r: r["cycles"])
    record = {"tiling": best["tiling"], "cycles": best["cycles"], "driver": driver, "trials": trials}
    if log_path:
        book[key] = record
        path = Path(log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(book, indent=1))
    return ConvTiling(**best["tiling"]), record
