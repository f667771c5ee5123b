"""Schedule spaces of the CPU ("llvm") kernels: per tunable kernel the knobs its compute, prepack
and schedule read through compiler.ops.cpu.knob, and every valid point of them.

A workload is the anchor op of a fused group (the conv, dense or matmul whose schedule the group
takes) with its input shapes, dtypes, attributes and which inputs are compile-time constants; the
fused epilogue is not part of the key (it rides along in the same loop nest whatever the point).
The heuristic point (what a build without a tuning log uses) is always the space's first.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field

from ..graph.ir import Graph
from ..ops import cpu
from ..ops.registry import normalize_attrs, select

#: kernel name -> the family of its space
FAMILIES = {
    "conv2d_nchw.nchwc": "conv_nchwc", "qconv2d.nchwc": "conv_nchwc", "conv2d_NCHWc.x86": "conv_blocked",
    "conv2d_nchw.pointwise": "pointwise", "conv2d_nchw.depthwise": "depthwise", "depthwise_NCHWc.x86": "dw_blocked",
    "dense.pack": "dense", "qdense.pack": "dense", "matmul.tiled": "matmul",
}


@dataclass(frozen=True)
class Workload:
    """One tunable kernel signature: what a tuning-log record is keyed by (with the ISA)."""
    op: str
    impl: str
    shapes: tuple
    dtypes: tuple
    attrs: dict = field(hash=False, compare=False)
    consts: tuple = ()
    out_shape: tuple = ()
    macs: int = 0

    @property
    def family(self) -> str:
        return FAMILIES[self.impl]

    def as_json(self) -> dict:
        return {"op": self.op, "impl": self.impl, "shapes": [list(s) for s in self.shapes],
                "dtypes": list(self.dtypes), "attrs": _jsonable(self.attrs), "consts": list(self.consts),
                "out_shape": list(self.out_shape), "macs": self.macs}

    @property
    def key(self) -> str:
        d = self.as_json()
        del d["macs"], d["out_shape"]   # derived from the rest
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, d: dict) -> Workload:
        return cls(d["op"], d["impl"], tuple(tuple(s) for s in d["shapes"]), tuple(d["dtypes"]),
                   dict(d.get("attrs", {})), tuple(d.get("consts", ())), tuple(d.get("out_shape", ())),
                   int(d.get("macs", 0)))


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if hasattr(v, "item"):   # numpy scalar
        return v.item()
    return str(v)


def extract_workload(body: Graph, consts: dict | None = None) -> Workload | None:
    """The tunable anchor of a fused body (the op with the most MACs whose kernel has a space),
    or None when the body has none (elementwise, pooling, ...)."""
    consts = consts or {}
    params = {id(p): k for k, p in enumerate(body.inputs)}
    best = None
    for n in body.ops:
        shapes = [tuple(int(d) for d in i.shape) for i in n.inputs]
        dtypes = [i.dtype for i in n.inputs]
        try:
            attrs = normalize_attrs(n.op, n.attrs)
            impl = select(n.op, "llvm", shapes, dtypes, attrs)
        except Exception:  # noqa: BLE001 - an op the library lacks is simply not tunable
            continue
        if impl.name not in FAMILIES:
            continue
        const_in = tuple(k for k, i in enumerate(n.inputs) if id(i) in params and params[id(i)] in consts)
        wl = Workload(n.op, impl.name, tuple(shapes), tuple(dtypes), attrs, const_in,
                      tuple(int(d) for d in n.shape), _macs(n.op, shapes, n.shape))
        if best is None or wl.macs > best.macs:
            best = wl
    return best


#: the anchor loop on the thread pool: the heuristic, never, always
PARALLEL = ["auto", False, True]

_POSITIVE = "a positive integer"
#: every knob a configuration may hold: name -> (what it must be, check)
KNOBS = {
    **{k: (_POSITIVE, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
       for k in ("oc_bn", "ic_bn", "reg_n", "pw_oc", "pw_vecs", "dw_vecs", "mi", "bn", "nj", "k_unroll")},
    "order": ("'ic_outer' or 'kernel_outer'", lambda v: v in ("ic_outer", "kernel_outer")),
    **{k: ("true or false", lambda v: isinstance(v, bool)) for k in ("unroll_kw", "dw_unroll")},
    "parallel": ("'auto', true or false", lambda v: v == "auto" or isinstance(v, bool)),
}


def check_config(cfg: dict) -> str | None:
    """None, or what is wrong with the first bad knob ('config.<name>: ...')."""
    for k, v in cfg.items():
        if k not in KNOBS:
            return f"config.{k}: unknown knob (knobs: {', '.join(sorted(KNOBS))})"
        what, ok = KNOBS[k]
        if not ok(v):
            return f"config.{k}: expected {what}, got {v!r}"
    return None


def _macs(op: str, shapes: list, out_shape) -> int:
    """Multiply-accumulates of the anchor (orders workloads; a cost-model feature)."""
    out = math.prod(out_shape)
    w = shapes[1]
    if op in ("conv2d", "qconv2d"):
        return out * math.prod(w[1:])
    if op == "conv2d_NCHWc":
        return out * math.prod(w[1:5])
    if op == "depthwise_conv2d_NCHWc":   # kernel (C', KH, KW, c)
        return out * w[1] * w[2]
    return out * shapes[0][-1]   # dense, qdense, matmul: the reduction is the input's last axis


def _distinct(values) -> list[int]:
    """values without repeats, in order."""
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _divs(n: int, wants) -> list[int]:
    """The distinct largest divisors of n at most each of `wants`, in order."""
    return _distinct(cpu.largest_divisor(n, max(1, int(w))) for w in wants)


def _extents(n: int, wants, unit: int) -> list[int]:
    """The distinct split factors cpu.tile_extent picks for n at each of `wants`, in order."""
    return _distinct(cpu.tile_extent(n, max(1, int(w)), unit) for w in wants)


def _product(default: dict, **axes) -> list[dict]:
    """default first, then every combination of the axes (default excluded once)."""
    names = list(axes)
    pts = [dict(zip(names, vals)) for vals in itertools.product(*(axes[n] for n in names))]
    return [default] + [p for p in pts if p != default]


def space(wl: Workload) -> list[dict]:
    """Every valid configuration of the workload's kernel, the heuristic point first. Each is
    a complete knob dict (what compiler.ops.cpu.schedule_config takes)."""
    t = cpu.TILES
    fam = wl.family
    vl = cpu.lanes(wl.dtypes[0] if wl.dtypes[0].startswith("float") else "float32")
    regs = t.registers
    if fam in ("conv_nchwc", "conv_blocked"):
        if fam == "conv_nchwc":   # blocks divide one group's channels: C and O per group
            (_, Call, _, _), (O, C, KH, KW) = wl.shapes[0], wl.shapes[1]
            O //= Call // C
            OW = wl.out_shape[3]
        else:   # already blocked: data (N, C/ic, H, W, ic), kernel (O/oc, C/ic, KH, KW, ic, oc)
            C, O = wl.shapes[0][1] * wl.shapes[0][4], wl.shapes[1][0] * wl.shapes[1][5]
            KH, KW = wl.shapes[1][2], wl.shapes[1][3]
            OW = wl.out_shape[3]
        ic_d, oc_d = cpu.conv_blocks(C, O)
        default = {"reg_n": cpu.tile_extent(OW, t.conv_reg_n, 1), "order": "ic_outer", "unroll_kw": False,
                   "parallel": "auto"}
        axes = {"reg_n": _extents(OW, (t.conv_reg_n, 4, 7, 8, 16, 28), 1),
                "order": ["ic_outer", "kernel_outer"] if KH * KW > 1 else ["ic_outer"],
                "unroll_kw": [False, True] if KW > 1 else [False], "parallel": PARALLEL}
        if fam == "conv_nchwc":
            default.update(ic_bn=ic_d, oc_bn=oc_d)
            axes["ic_bn"] = _divs(C, (t.conv_ic_bn, 4, 8, 32, 64))
            axes["oc_bn"] = [d for d in _divs(O, (t.conv_oc_bn, vl // 2, vl, 2 * vl, 4 * vl)) if d >= 4]
        pts = _product(default, **axes)
        bn = (lambda p: p["oc_bn"]) if fam == "conv_nchwc" else (lambda p: wl.shapes[1][5])
        return [p for k, p in enumerate(pts) if k == 0 or p["reg_n"] * -(-bn(p) // vl) <= regs - 2]
    if fam == "pointwise":
        O = wl.shapes[1][0]
        P = wl.out_shape[2] * wl.out_shape[3]
        d_oc, d_v = t.pointwise
        default = {"pw_oc": d_oc, "pw_vecs": d_v, "parallel": "auto"}
        pts = _product(default, pw_oc=_divs(O, (d_oc, 2, 4, 8, 16)), pw_vecs=[1, 2, 3, 4, 6], parallel=PARALLEL)
        return [p for k, p in enumerate(pts) if k == 0 or (
            cpu.largest_divisor(O, p["pw_oc"]) * p["pw_vecs"] <= regs - 2 and vl * p["pw_vecs"] <= 2 * P)]
    if fam == "depthwise":
        return _product({"dw_vecs": cpu.DW_FLAT_VECS, "dw_unroll": True, "parallel": "auto"}, dw_vecs=[1, 2, 4, 8],
                        dw_unroll=[True, False], parallel=PARALLEL)
    if fam == "dw_blocked":   # data (N, C', H, W, c), kernel (C', KH, KW, c): one vector per pixel
        OW = wl.out_shape[3]
        default = {"reg_n": cpu.tile_extent(OW, cpu.DW_REG_N, 1), "dw_unroll": True, "parallel": "auto"}
        pts = _product(default, reg_n=_extents(OW, (cpu.DW_REG_N, 2, 4, 7, 14), 1), dw_unroll=[True, False],
                       parallel=PARALLEL)
        bn = wl.shapes[1][3]
        return [p for k, p in enumerate(pts) if k == 0 or p["reg_n"] * -(-bn // vl) <= regs - 2]
    if fam == "dense":
        (M, K), N = wl.shapes[0], wl.shapes[1][0]
        mi, bn = cpu.dense_block(M, N)
        default = {"mi": mi, "bn": bn, "k_unroll": 4 if K % 4 == 0 else 1,
                   "parallel": "auto"}
        pts = _product(default, mi=_extents(M, (t.rows, 1, 2, 4, 6, 8, 12, 16), 1),
                       bn=[b for b in (8, 16, 32, 64) if b <= max(16, 2 * N)],
                       k_unroll=[u for u in (1, 2, 4, 8) if K % u == 0], parallel=PARALLEL)
        return [p for k, p in enumerate(pts) if k == 0 or p["mi"] * -(-p["bn"] // vl) <= regs - 2]
    if fam == "matmul":
        M, N = wl.shapes[0][-2], wl.shapes[1][-1]
        default = {"mi": cpu.tile_extent(M, t.rows, 1), "nj": cpu.tile_extent(N, 2 * vl, vl), "parallel": "auto"}
        pts = _product(default, mi=_extents(M, (t.rows, 1, 2, 4, 6, 8, 12, 16), 1),
                       nj=_extents(N, (2 * vl, vl // 2, vl, 4 * vl), vl), parallel=PARALLEL)
        return [p for k, p in enumerate(pts) if k == 0 or p["mi"] * -(-p["nj"] // vl) <= regs - 2]
    raise KeyError(fam)   # pragma: no cover - FAMILIES and this function list the same families


def tile_regs(wl: Workload, cfg: dict) -> float:
    """Vector registers the configuration's accumulator tile takes (a cost-model feature)."""
    vl = cpu.lanes("float32")
    if "reg_n" in cfg:
        bn = cfg.get("oc_bn") or (wl.shapes[1][5] if len(wl.shapes[1]) == 6
                                  else wl.shapes[1][3] if wl.family == "dw_blocked" else vl)
        return cfg["reg_n"] * math.ceil(bn / vl)
    if "pw_oc" in cfg:
        return cfg["pw_oc"] * cfg["pw_vecs"]
    if "dw_vecs" in cfg:
        return cfg["dw_vecs"]
    if "bn" in cfg:
        return cfg["mi"] * math.ceil(cfg["bn"] / vl)
    if "nj" in cfg:
        return cfg["mi"] * math.ceil(cfg["nj"] / vl)
    return 0.0
