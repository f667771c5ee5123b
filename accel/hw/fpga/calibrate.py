"""Calibrate the resource estimator: synthesize a set of configurations with yosys, keep their
per-module results, fit the LUT/FF model, and record its error on configurations left out.

    python -m accel.hw.fpga.calibrate run [--family xc7 ecp5] [--pnr] [--only NAME ...]
    python -m accel.hw.fpga.calibrate fit
    python -m accel.hw.fpga.calibrate rekey        # sources changed, Verilog did not: keep the records
    python -m accel.hw.fpga.calibrate check        # estimator vs the stored yosys results
    python -m accel.hw.fpga.calibrate sta [--only NAME ...]   # 7-series clock: yosys sta path estimates

`run` appends to calibration_data.json (one record per config and family, with the RTL's hash,
so stale records are visible); `fit` writes estimate_model.json from the CALIBRATION records and
reports errors on the HOLDOUT records. Synthesis results are cached under
<cache>/synth/<key> (key: Verilog, family, part, flow options), so a rerun costs nothing.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

from accel.hw.boards import default_part
from accel.hw.verilog import cache_root as hw_cache_root
from accel.isa import PRESETS, AccelConfig

from . import estimate as est
from .estimate_timing import path_estimate
from .memmap import map_memory
from .rtl import family_config, rtl_for_config
from .synth import synthesize

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
DATA_PATH = HERE / "calibration_data.json"
FLOW_VERSION = {"xc7": "1", "xcup": "1", "ecp5": "2"}  # bump when synth.py changes what a report measures

KiB = 1024


def _cfg(**kw) -> AccelConfig:
    return PRESETS["tiny"].replace(**kw)


# Configurations the model is fitted on: each varies a different structural feature of the tiny core.
CALIBRATION: dict[str, AccelConfig] = {
    "tiny": PRESETS["tiny"],
    "b8": _cfg(block_in=8, block_out=8, inp_buff_bytes=8 * KiB, wgt_buff_bytes=32 * KiB, acc_buff_bytes=16 * KiB,
               out_buff_bytes=4 * KiB, uop_buff_bytes=2 * KiB, cmd_queue_depth=16),
    "bus128": _cfg(bus_width=128, inp_buff_bytes=4 * KiB, wgt_buff_bytes=8 * KiB, acc_buff_bytes=16 * KiB,
                   out_buff_bytes=4 * KiB, cmd_queue_depth=32),
    "batch2": _cfg(batch=2, inp_buff_bytes=2 * KiB, acc_buff_bytes=8 * KiB, out_buff_bytes=2 * KiB),
    "in4out8": _cfg(block_out=8, wgt_buff_bytes=4 * KiB, acc_buff_bytes=8 * KiB, out_buff_bytes=2 * KiB),
    "in8w16": _cfg(block_in=8, inp_width=16, wgt_width=16, inp_buff_bytes=4 * KiB, wgt_buff_bytes=8 * KiB),
    "addr40": _cfg(dram_addr_width=40, cmd_queue_depth=4, uop_buff_bytes=4 * KiB),
    "acc16": _cfg(block_in=8, block_out=8, acc_width=16, bus_width=32, inp_buff_bytes=2 * KiB,
                  wgt_buff_bytes=8 * KiB, acc_buff_bytes=4 * KiB, out_buff_bytes=2 * KiB, cmd_queue_depth=64),
}
# Configurations never used for fitting: the estimator's error is measured on these.
HOLDOUT: dict[str, AccelConfig] = {
    "b8bus128": _cfg(block_in=8, block_out=8, bus_width=128, inp_buff_bytes=16 * KiB, wgt_buff_bytes=64 * KiB,
                     acc_buff_bytes=32 * KiB, out_buff_bytes=8 * KiB, uop_buff_bytes=4 * KiB, cmd_queue_depth=32),
    "b2in8out4": _cfg(batch=2, block_in=8, block_out=4, inp_buff_bytes=4 * KiB, wgt_buff_bytes=4 * KiB,
                      acc_buff_bytes=8 * KiB, out_buff_bytes=2 * KiB, dram_addr_width=40),
    "default": PRESETS["default"],
    # 1x16x8 with half the default buffers: what bench/synth_report.py found as the largest core for an
    # LFE5U-85F before the ALU gained SCALE (152 of its 156 multipliers; 160 since); its routed ECP5
    # run is also an Fmax point.
    "b16x8": PRESETS["default"].replace(block_out=8, uop_buff_bytes=16 * KiB, inp_buff_bytes=16 * KiB,
                                        wgt_buff_bytes=128 * KiB, acc_buff_bytes=64 * KiB, out_buff_bytes=16 * KiB),
    "ultra96": PRESETS["ultra96"],   # every preset is measured (pynq-z1 equals default)
}
ALL = {**CALIBRATION, **HOLDOUT}


# ---- synthesis with a cache ---------------------------------------------------------------------------
def cache_root() -> Path:
    return hw_cache_root()


def synth_key(verilog: str, family: str, part: str, pnr: bool) -> str:
    h = hashlib.sha256(verilog.encode())
    h.update(f"|{family}|{part}|pnr={pnr}|flow={FLOW_VERSION[family]}".encode())
    return h.hexdigest()[:16]


def cached_synthesize(cfg: AccelConfig, family: str, *, part=None, pnr: bool = False, rtl=None,
                      timeout: float | None = None) -> dict:
    """The report dict of synthesizing `cfg` for `family`, from the cache when the same Verilog,
    family, part and options were synthesized before. Adds "cached" and "out_dir"."""
    cfg = family_config(cfg, family)    # ECP5: no DSP packing; a passed `rtl` must be of this config
    rtl = rtl or rtl_for_config(cfg)
    p = part or default_part(family)
    pname = p if isinstance(p, str) else p.name
    out = cache_root() / "synth" / synth_key(rtl.verilog, family, pname, pnr)
    rep_path = out / "report.json"
    if rep_path.exists():
        rep = json.loads(rep_path.read_text())
        return dict(rep, cached=True, out_dir=str(out))
    rep = synthesize(rtl, family, out, part=part, config=cfg, pnr=pnr, bitstream=pnr, timeout=timeout).to_dict()
    return dict(rep, cached=False, out_dir=str(out))


# ---- records ------------------------------------------------------------------------------------------
def load_data(path: Path = DATA_PATH) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"format": "accel-calibration/1", "runs": []}


def save_data(data: dict, path: Path = DATA_PATH) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def record_of(name: str, cfg: AccelConfig, rep: dict, rtl_sha: str) -> dict:
    return {"name": name, "family": rep["family"], "part": rep["part"], "config": cfg.to_dict(),
            "rtl_sha256": rtl_sha, "rtl_source_key": est.current_source_key(),
            "yosys": rep["tools"]["yosys"]["version"],
            "seconds": {k: v["seconds"] for k, v in rep["tools"].items()},
            "utilization": rep["utilization"], "modules": rep["modules"], "timing": rep.get("timing"),
            "pnr": rep.get("pnr"), "fits": rep["fit"]["fits"]}


def run(names: list[str], families: list[str], pnr: bool, path: Path = DATA_PATH) -> None:
    for name in names:
        rtls = {}
        for fam in families:
            cfg = family_config(ALL[name], fam)
            rtl = rtls.get(cfg) or rtls.setdefault(cfg, rtl_for_config(cfg))
            t0 = time.monotonic()
            rep = cached_synthesize(cfg, fam, pnr=pnr and fam == "ecp5", rtl=rtl)
            rec = record_of(name, cfg, rep, rtl.sha256)
            data = load_data(path)  # re-read: another run may have added records meanwhile
            data["runs"] = [r for r in data["runs"] if not (r["name"] == name and r["family"] == fam)] + [rec]
            save_data(data, path)
            print(f"{name:>10} {fam}: {rep['utilization']} ({'cached' if rep['cached'] else f'{time.monotonic() - t0:.0f} s'})",
                  flush=True)


def rekey(path: Path = DATA_PATH) -> list[str]:
    """Records whose config still generates the Verilog they were synthesized from (same sha256) get
    today's RTL source key: a change under accel/ that leaves the Verilog alone (a refactor, a faster
    decoder) would otherwise cost a full re-synthesis when the synthesis cache is gone. Returns the
    "name family" of the records whose Verilog changed; those need `run`."""
    data = load_data(path)
    key, sha, stale = est.current_source_key(), {}, []
    for rec in data["runs"]:
        name = rec["name"]
        if name not in sha:
            sha[name] = rtl_for_config(AccelConfig.from_dict(rec["config"])).sha256
        if sha[name] == rec["rtl_sha256"]:
            rec["rtl_source_key"] = key
        else:
            stale.append(f"{name} {rec['family']}")
    save_data(data, path)
    return stale


# ---- fitting --------------------------------------------------------------------------------------------
def nnls(a: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """Non-negative least squares (Lawson-Hanson active set), small problems only."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    for _ in range(iters):
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-9:
            break
        j = np.where(~passive, w, -np.inf).argmax()
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-12
        w = a.T @ (b - a @ x)
    return x


def _group_targets(rec: dict) -> dict[str, dict[str, float]]:
    """Per group: yosys LUTs minus the LUT RAM the memory model accounts for exactly, and FFs."""
    cfg = AccelConfig.from_dict(rec["config"])
    out: dict[str, dict[str, float]] = {g: {"lut": 0.0, "ff": 0.0} for g, _ in est.GROUPS}
    for mod, u in rec["modules"].items():
        g = est.group_of(mod)
        out[g]["lut"] += u["lut"] - u.get("lutram", 0)
        out[g]["ff"] += u["ff"]
    # Memories mapped to flip-flops are estimated exactly too; take them out of their group.
    for mod, shape in est.memories(cfg):
        mm = map_memory(shape, rec["family"])
        if mm.ff_bits:
            g = est.group_of(mod, "")
            out[g]["ff"] -= mm.ff_bits
            out[g]["lut"] -= mm.ff_bits
    return out


def fit(data: dict | None = None, calibration: list[str] | None = None, model_before: dict | None = None) -> dict:
    """Fit the model on the CALIBRATION records of `data`; returns the model dict (not written).
    model_before: the model being replaced, whose Fmax fit is kept (marked stale) when `data` has
    no routed runs."""
    data = data or load_data()
    calibration = calibration or list(CALIBRATION)
    xc7 = {r["name"]: r for r in data["runs"] if r["family"] == "xc7"}
    cal = [xc7[n] for n in calibration if n in xc7]
    if len(cal) < 3:
        raise SystemExit(f"need at least 3 calibration records for xc7, have {len(cal)} ({', '.join(xc7)})")
    groups = {}
    for g, _ in est.GROUPS:
        names = list(est.features(AccelConfig.from_dict(cal[0]["config"]))[g])
        a = np.array([[est.features(AccelConfig.from_dict(r["config"]))[g][k] for k in names] for r in cal], float)
        coefs = {}
        for res in ("lut", "ff"):
            b = np.array([_group_targets(r)[g][res] for r in cal], float)
            # Scale columns so one large feature does not swamp the others.
            scale = np.maximum(np.abs(a).max(axis=0), 1e-9)
            x = nnls(a / scale, b) / scale
            coefs[res] = {k: float(v) for k, v in zip(names, x)}
        groups[g] = coefs
    model = {"format": "accel-estimate-model/1", "families": {"xc7": {"groups": groups}}}
    # ECP5: its logic LUTs and FFs as a combination of the 7-series estimate and the GEMM's product
    # bits (7-series DSPs absorb pipeline registers and adders that ECP5 multipliers leave to the fabric).
    ecp5 = [r for r in data["runs"] if r["family"] == "ecp5" and r["name"] in calibration]
    unit = dict(model, families={**model["families"], "ecp5": {"scale": {}}})
    rows_l, rows_f, tl, tf = [], [], [], []
    for r in ecp5:
        cfg = AccelConfig.from_dict(r["config"])
        e = est.estimate(cfg, "xc7", model=unit)
        mac_bits = est.features(cfg)["gemm"]["mac_bits"]
        lutram5 = sum(map_memory(s_, "ecp5").lutram_luts for _, s_ in est.memories(cfg))
        rows_l.append([e.utilization["lut"] - e.utilization["lutram"], mac_bits])
        rows_f.append([e.utilization["ff"], mac_bits])
        tl.append(r["utilization"]["lut"] - lutram5)
        tf.append(r["utilization"]["ff"])
    if len(ecp5) >= 2:
        xl = nnls(np.array(rows_l, float), np.array(tl, float))
        xf = nnls(np.array(rows_f, float), np.array(tf, float))
        scale = {"lut": float(xl[0]), "lut_mac_bits": float(xl[1]), "ff": float(xf[0]), "ff_mac_bits": float(xf[1])}
    else:
        scale = {"lut": 1.45, "lut_mac_bits": 0.0, "ff": 1.1, "ff_mac_bits": 0.0}
    fmax = _fit_fmax(data)
    old = model_before.get("families", {}).get("ecp5", {}).get("fmax") if model_before else None
    if fmax is None and old:   # no routed runs of this RTL: keep the last fit, marked as older
        fmax = {**old, "stale": "fitted on routed runs of an earlier RTL; rerun `calibrate run --family ecp5 --pnr`"}
    model["families"]["ecp5"] = {"scale": scale, "fmax": fmax}
    sta = (model_before or {}).get("families", {}).get("xc7", {}).get("sta")
    if sta:   # the yosys path estimates (`calibrate sta`) are measured apart from the records
        model["families"]["xc7"]["sta"] = sta
    rtl = {r["rtl_sha256"] for r in data["runs"]}
    model["calibrated_on"] = sorted({r["name"] for r in cal} | {r["name"] for r in ecp5})
    model["yosys"] = sorted({r["yosys"] for r in data["runs"]})
    model["rtl_key"] = sorted(rtl)[0][:16] if len(rtl) == 1 else "mixed"
    model["errors"] = errors(data, model)
    model["rtl_source_key"] = _source_key_if_records_current(data)
    return model


def _source_key_if_records_current(data: dict) -> str | None:
    """The RTL source key, if the stored tiny record was synthesized from today's Verilog."""
    tiny = next((r for r in data["runs"] if r["name"] == "tiny" and r["family"] == "xc7"), None)
    try:
        now = rtl_for_config(PRESETS["tiny"]).sha256
    except Exception:
        return None
    if tiny is None or tiny["rtl_sha256"] != now:
        log.warning("the stored records predate the current RTL; re-run `calibrate run` before trusting the fit")
        return None
    return est.current_source_key()


def _fit_fmax(data: dict) -> dict | None:
    """Critical-path delay = t0 + t_mac * MACs per cycle, fitted to the routed ECP5 runs.

    The routed paths run from the accumulator RAM through the compute write-back into the RAM;
    16- and 32-bit accumulators routed alike, while larger GEMM cores (more multipliers spread
    over the die, longer routes) are slower. Few points: a rough model, its error recorded.
    """
    pts = [(AccelConfig.from_dict(r["config"]), r["timing"]["fmax_mhz"]) for r in data["runs"]
           if r["family"] == "ecp5" and r.get("timing") and r["timing"].get("fmax_mhz")]
    if not pts:
        return None
    delays = np.array([1000.0 / f for _, f in pts])
    feats = np.array([[1.0, float(c.macs_per_cycle)] for c, _ in pts])
    cols = [0] + ([1] if len(set(feats[:, 1])) > 1 else [])
    x = np.zeros(2)
    x[cols] = nnls(feats[:, cols], delays)
    pred = feats @ x
    err = max(abs(1000.0 / p - f) / f * 100 for p, (_, f) in zip(pred, pts))
    return {"t0_ns": float(x[0]), "t_mac_ns": float(x[1]), "points": len(pts),
            "configs": sorted(r["name"] for r in data["runs"] if r["family"] == "ecp5" and (r.get("timing") or {}).get("fmax_mhz")),
            "max_error_pct": round(float(err), 1)}


def errors(data: dict, model: dict) -> dict:
    """Per family and record: estimate vs yosys, in percent for LUT/FF, exact match for BRAM/DSP."""
    out: dict = {}
    for r in data["runs"]:
        cfg = AccelConfig.from_dict(r["config"])
        e = est.estimate(cfg, r["family"], model=model).utilization
        y = r["utilization"]
        row = {res: round(100.0 * (e[res] - y[res]) / y[res], 1) for res in ("lut", "ff")}
        row.update({f"{res}_exact": e[res] == y[res] for res in ("bram", "dsp")})
        row["set"] = "calibration" if r["name"] in model.get("calibrated_on", CALIBRATION) else "holdout"
        out.setdefault(r["family"], {})[r["name"]] = row
    for fam, rows in out.items():
        summary = {}
        for s in ("calibration", "holdout"):
            sel = [v for v in rows.values() if v["set"] == s]
            if sel:
                summary[f"max_abs_{s}"] = {res: max(abs(v[res]) for v in sel) for res in ("lut", "ff")}
        rows.update(summary)
    return out


def sta(names: list[str], model_path: Path | None = None) -> dict:
    """Time each named config's longest path with yosys sta (estimate_timing) and store the results
    in the model's xc7 "sta" entry, which estimate() turns into the 7-series clock estimate."""
    model_path = model_path or est.MODEL_PATH
    points = {}
    for name in names:
        cfg = ALL[name]
        rtl = rtl_for_config(cfg)
        out = cache_root() / "sta" / synth_key(rtl.verilog, "xc7", "sta", False)
        path = out / "path.json"
        if path.exists():
            d = json.loads(path.read_text())
        else:
            out.mkdir(parents=True, exist_ok=True)
            (out / rtl.file_name).write_text(rtl.verilog)
            d = path_estimate(out / rtl.file_name, rtl.top, out).to_dict()
        points[name] = {"macs": cfg.macs_per_cycle, "path_ns": d["path_ns"],
                        "end": d["steps"][0][2] if d["steps"] else "", "rtl_sha256": rtl.sha256}
        print(f"{name:>10}: {d['path_ns']:.2f} ns", flush=True)
    model = json.loads(model_path.read_text())
    model["families"].setdefault("xc7", {})["sta"] = {
        "points": points, "rtl_source_key": est.current_source_key(),
        "measured_on": f"RTL source key {est.current_source_key()}, {time.strftime('%Y-%m-%d')}",
        "basis": "yosys sta after synth_xilinx: 7-series cell delays (Project X-Ray), no routing"}
    model_path.write_text(json.dumps(model, indent=1) + "\n")
    return points


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m accel.hw.fpga.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="synthesize configurations and store their results")
    r.add_argument("--only", nargs="*", default=None, help=f"names among {', '.join(ALL)}")
    r.add_argument("--family", nargs="*", default=["xc7"], choices=["xc7", "ecp5"])
    r.add_argument("--pnr", action="store_true", help="also place and route ECP5 runs (Fmax; slow)")
    sub.add_parser("fit", help="fit estimate_model.json from the stored results")
    sub.add_parser("check", help="print the estimator's error on every stored result")
    sub.add_parser("rekey", help="give records whose Verilog is unchanged today's RTL source key")
    s = sub.add_parser("sta", help="time the longest path of configurations with yosys sta (7-series clock)")
    s.add_argument("--only", nargs="*", default=None, help=f"names among {', '.join(ALL)} (default: tiny default)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.cmd == "run":
        run(args.only or list(ALL), args.family, args.pnr)
    elif args.cmd == "fit":
        before = json.loads(est.MODEL_PATH.read_text()) if est.MODEL_PATH.exists() else None
        model = fit(model_before=before)
        est.MODEL_PATH.write_text(json.dumps(model, indent=1) + "\n")
        print(json.dumps(model["errors"], indent=1))
    elif args.cmd == "sta":
        sta(args.only or ["tiny", "default"])
    elif args.cmd == "rekey":
        stale = rekey()
        if stale:
            print(f"Verilog changed since synthesis, re-run `calibrate run` for: {', '.join(stale)}")
            return 1
        print("every record's Verilog is unchanged; records re-keyed (run `fit` next)")
    else:
        print(json.dumps(errors(load_data(), est.load_model()), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
