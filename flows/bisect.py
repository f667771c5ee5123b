"""`accel bisect`: find the first ONNX node where two executors of one model disagree.

The model runs on a chain of executors with every intermediate tensor kept:
  ort      onnxruntime, every node output added as a graph output (the float reference);
  cpu      the model compiled for the CPU target (float; int8 for a QDQ model), its steps' outputs;
  int8ref  the accelerator build's quantized graph run by the graph IR's NumPy interpreter;
  fsim, tsim, rtl (or any registered driver)  the accelerator build run on that driver, every
           step's output kept (host_runtime.Executor(keep=True)).
Neighbours in the chain are compared node by node (rows in ONNX order): two integer executors
(int8ref and the drivers run the same compiled graph) bit for bit on every tensor they share;
otherwise by cosine and relative error after dequantizing an int8 tensor (its scale from the
graph's quantization attributes, or fitted by least squares where the graph does not say) and
unpacking a blocked one. The first row where a pair fails names the node (and the ONNX nodes the
compiler folded or fused into it). Float-vs-int8 error is quantization (or the quantizer);
int8ref-vs-driver error is the compiler's lowering or the simulator; driver-vs-driver error is the
hardware (docs/bisect.md).
"""
from __future__ import annotations

import functools
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from accel.isa import resolve_config
from accel.isa.errors import AccelError
from accel.isa.files import write_atomic
from accel.isa.layout import unpack_blocked
from compiler.errors import CompilerError
from compiler.frontend import from_onnx
from compiler.frontend.onnx_import import load_model
from compiler.graph import run as reference_run
from compiler.graph_build import build_model
from host_runtime import available_drivers
from host_runtime.executor import Executor

from .errors import InputError
from .inputs import calibration, force_specs, read_inputs, same_file, shape_specs, spec_file

log = logging.getLogger(__name__)

#: the order executors are compared in (neighbours); a driver name not listed goes after these
CHAIN = ("ort", "cpu", "int8ref", "fsim", "tsim", "rtl")
DEFAULT_EXECUTORS = ("ort", "cpu", "int8ref", "fsim")
FLOAT_EXECUTORS = ("ort", "cpu")
#: ops whose int8 output keeps its input's scale (walked through to find a tensor's scale)
SCALE_PRESERVING = ("relu", "clip", "pack", "unpack", "reshape", "transpose", "slice", "take", "max_pool2d",
                    "flatten", "squeeze", "unsqueeze", "identity", "pad")


class BisectError(AccelError, ValueError):
    """A bisect request is unusable (executor, tolerance, model, input); the message names it."""


@dataclass
class Tolerance:
    """When a float comparison counts as a divergence: cosine below *_cos or relative error above
    *_rel (and the largest difference above `lsb` quantization steps, so an all-but-zero tensor
    does not fail on noise). `float_*` between two float executors, `quant_*` where one side is
    int8 (quantization error accumulates through the network: loose on purpose)."""
    float_cos: float = 0.9999
    float_rel: float = 1e-3
    quant_cos: float = 0.9
    quant_rel: float = 0.5
    lsb: float = 2.0

    KEYS = {"cos": "quant_cos", "rel": "quant_rel", "float_cos": "float_cos", "float_rel": "float_rel",
            "quant_cos": "quant_cos", "quant_rel": "quant_rel", "lsb": "lsb"}

    @classmethod
    def parse(cls, text: str | None) -> "Tolerance":
        """'cos=0.97,rel=0.3,float_cos=0.9999,float_rel=1e-3,lsb=2' (cos/rel are the int8-vs-float ones)."""
        t = cls()
        if not text:
            return t
        for part in text.split(","):
            key, sep, val = part.strip().partition("=")
            if not sep or key not in cls.KEYS:
                raise BisectError(f"--tolerance {part.strip()!r}: expected KEY=VALUE with KEY one of "
                                  f"{', '.join(cls.KEYS)}")
            try:
                v = float(val)
            except ValueError:
                raise BisectError(f"--tolerance {key}={val!r}: not a number") from None
            attr = cls.KEYS[key]
            lo, hi = (0.0, 1.0) if attr.endswith("cos") else (0.0, float("inf"))
            if not (lo <= v <= hi) or v != v:
                raise BisectError(f"--tolerance {key}={val}: must lie in [{lo:g}, {hi:g}]")
            setattr(t, attr, v)
        return t

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("float_cos", "float_rel", "quant_cos", "quant_rel", "lsb")}


@dataclass
class Observed:
    """One executor's tensors: values by tensor name; graph (for int8 scales) where it has one."""
    name: str
    values: dict[str, np.ndarray]
    graph: Any = None
    integer: bool = False          # runs the accelerator build's int8 graph (bit-exact among these)
    nodes: dict[str, Any] = field(default_factory=dict)   # graph node by name
    #: tensor name -> the ONNX node whose value it holds, where that is not its namesake (a conv
    #: whose batch norm was folded into it holds the batch norm's output)
    alias: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.graph is not None and not self.nodes:
            self.nodes = {n.name: n for n in self.graph.nodes}

    @functools.cached_property
    def out_scales(self) -> dict[str, float]:
        """Output scale of each int8 layer, as the quantizer recorded it (graph.meta['quantize'])."""
        layers = (getattr(self.graph, "meta", None) or {}).get("quantize", {}).get("layers", [])
        return {L["name"]: L["out_scale"] for L in layers if isinstance(L.get("out_scale"), float)}

    @property
    def quantized(self) -> bool:
        """Whether it computes in int8 (its float tensors then carry quantization error too)."""
        return self.integer or (self.graph is not None and any(str(n.dtype) in ("int8", "uint8")
                                                               for n in self.graph.nodes))

    def tensor_of(self, row: str) -> str | None:
        """The tensor holding ONNX node `row`'s value, by name (None when folded into another)."""
        for t, r in self.alias.items():
            if r == row:
                return t
        return None if self.alias.get(row, row) != row else row


def folded_aliases(onnx_nodes, graph) -> dict[str, str]:
    """{compiled node name: ONNX node it really holds}: where ONNX node X's only consumer Y left no
    node of its own in the compiled graph (a batch norm, a constant Mul/Add folded into X), X's
    tensor holds Y's value (and so on along a chain of such nodes)."""
    if graph is None:
        return {}
    names = set()
    for n in graph.nodes:
        names.add(n.name)
        if n.op == "fused":
            names.update(o.name for o in n.attrs["body"].nodes)
    present = lambda x: x in names or any(k.startswith(x + "/") for k in names)   # noqa: E731
    users: dict[str, list] = {}
    for n in onnx_nodes:
        for i in n[2]:
            users.setdefault(i, []).append(n)
    by_name = {n[0]: n for n in onnx_nodes}
    out = {}
    for name, _, _, outs in onnx_nodes:
        if name not in names or not outs:
            continue
        cur, seen = by_name[name], {name}
        while cur[3]:
            u = users.get(cur[3][0], [])
            if len(u) != 1 or u[0][0] in seen or present(u[0][0]) or len(users.get(cur[3][0], [])) != 1:
                break
            cur = u[0]
            seen.add(cur[0])
        if cur[0] != name:
            out[name] = cur[0]
    return out


@dataclass
class BisectReport:
    model: str
    executors: list[str]
    tolerance: Tolerance
    rows: list[dict]             # per ONNX node: name, op, per pair key a cell dict (or absent)
    pairs: list[dict]            # a, b, kind, first (node name or None), covers, compared

    @property
    def diverged(self) -> bool:
        return any(p["first"] is not None for p in self.pairs)

    def to_dict(self) -> dict:
        """Plain JSON data (an infinite or undefined figure becomes null)."""
        return _finite({"model": self.model, "executors": self.executors, "tolerance": self.tolerance.to_dict(),
                        "diverged": self.diverged, "pairs": self.pairs, "rows": self.rows})

    def write_json(self, path: str | Path) -> None:
        write_atomic(Path(path), json.dumps(self.to_dict(), indent=1, default=_json_default,
                                            allow_nan=False).encode())

    def table(self) -> str:
        keys = [p["key"] for p in self.pairs]
        w = max([4] + [len(r["name"]) for r in self.rows])
        wo = max([2] + [len(r["op"]) for r in self.rows])
        cw = max([24] + [len(k) for k in keys])
        lines = [f"{'node':{w}}  {'op':{wo}}  " + "  ".join(f"{k:{cw}}" for k in keys)]
        firsts = {p["key"]: p["first"] for p in self.pairs}
        for r in self.rows:
            cells = []
            for k in keys:
                c = r["pairs"].get(k)
                text = "-" if c is None else c["text"]
                if c is not None and firsts[k] == r["name"]:
                    text += " <- first"
                cells.append(f"{text:{cw}}")
            lines.append(f"{r['name']:{w}}  {r['op']:{wo}}  " + "  ".join(cells))
        lines.append("")
        for p in self.pairs:
            lines.append(p["summary"])
        return "\n".join(lines)


def _finite(v):
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, (float, np.floating)):
        return float(v) if np.isfinite(v) else None
    return v


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


# ---- the ONNX side ---------------------------------------------------------------------------
def _onnx_nodes(model) -> list[tuple[str, str, list[str], list[str]]]:
    """(name, op type, inputs, outputs) per node, named as the frontend names them."""
    return [(n.name or f"{n.op_type}_{k}", n.op_type, [i for i in n.input if i], [o for o in n.output if o])
            for k, n in enumerate(model.graph.node)]


def run_ort(model, feed: dict) -> dict[str, np.ndarray]:
    """Every node's first output under onnxruntime, by node name (the float reference)."""
    import onnx  # noqa: PLC0415 - onnx loads only when a model is read
    import onnxruntime as ort  # noqa: PLC0415 - optional dep onnxruntime
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    names = _onnx_nodes(model)
    for _, _, _, outs in names:
        if outs and outs[0] not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=outs[0]))
            have.add(outs[0])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every node's output
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        want = [o.name for o in sess.get_outputs()]
        res = dict(zip(want, sess.run(want, {k: np.asarray(v) for k, v in feed.items()})))
    except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types; one line naming the executor
        raise BisectError(f"executor 'ort': onnxruntime cannot run the model: {str(e).splitlines()[0][:300]}") from None
    # a QDQ model rounds (and clamps) a node's output where a QuantizeLinear -> DequantizeLinear
    # pair follows it: the int8 executors hold that value, so it is the node's reference
    users: dict[str, list] = {}
    for n in names:
        for i in n[2]:
            users.setdefault(i, []).append(n)
    out = {}
    for name, op, _, outs in names:
        if not outs or outs[0] not in res:
            continue
        o = outs[0]
        u = users.get(o, [])
        if op not in QUIET_OPS and len(u) == 1 and u[0][1] == "QuantizeLinear" and u[0][3]:
            d = users.get(u[0][3][0], [])
            if d and d[0][1] == "DequantizeLinear" and d[0][3] and d[0][3][0] in res:
                o = d[0][3][0]
        out[name] = np.asarray(res[o])
    return out


# ---- the compiled side -----------------------------------------------------------------------
def build_accel(model, feed: dict, config=None, calibration: list | None = None, fuse: bool = True,
                shapes: dict | None = None, force_target: dict | None = None):
    """The accelerator build of `model`; calibrated on `calibration`, else on the input itself
    (so the scales fit the data bisected: a quantization divergence is then the quantizer's)."""
    return build_model(model, target="accel", config=config, calibration=calibration or [feed], fuse=fuse,
                       shapes=shapes, force_target=force_target)


def run_int8ref(mod, feed: dict) -> Observed:
    g = getattr(mod, "graph", None)
    if g is None:
        raise BisectError("executor 'int8ref' needs the module's quantized graph (a module loaded from a file has "
                          "none); let bisect compile the model")
    _, env = reference_run(g, feed, keep=True)
    vals = {n.name: env[id(n)] for n in g.nodes if id(n) in env and n.op != "const"}
    return Observed("int8ref", vals, g, integer=True)


def run_driver(mod, feed: dict, driver: str, **options) -> Observed:
    with Executor(mod, driver=driver, **options) as ex:
        ex.run(feed, keep=True)
        vals = dict(ex.values)
    for i in mod.inputs:   # inputs are tensors too (not step outputs)
        vals.setdefault(mod.tensors[i["tensor"]].name, np.asarray(feed[i["name"]]))
    return Observed(driver, vals, getattr(mod, "graph", None), integer=True)


def run_cpu(model, feed: dict, calibration=None, fuse: bool = True, shapes: dict | None = None) -> Observed:
    mod = build_model(model, target="cpu", calibration=calibration, fuse=fuse, shapes=shapes)
    with Executor(mod) as ex:
        ex.run(feed, keep=True)
        vals = dict(ex.values)
    blocked = set((mod.graph.meta.get("nchwc") or {}).get("blocked", ())) if getattr(mod, "graph", None) else set()
    for name in list(vals):
        v = vals[name]
        if name in blocked and v.ndim == 5:   # N C' H W c (compiler.graph.passes.nchwc_layout) as NCHW
            vals[name] = np.moveaxis(v, 4, 2).reshape(v.shape[0], -1, *v.shape[2:4])
    for name in list(vals):   # a blocked tensor's NCHW copy holds its value where fusion hid the original
        if name.endswith("/nchw"):
            vals.setdefault(name[:-len("/nchw")], vals[name])
    return Observed("cpu", vals, getattr(mod, "graph", None), integer=False)


# ---- comparing ---------------------------------------------------------------------------------
def _qparams(n, out_scales: dict[str, float] | None = None, depth: int = 0) -> tuple[float | None, int | None] | None:
    """(scale, zero point) of an int8 graph node: the output scale the quantizer recorded for a
    layer (out_scales: exact steps are no power of two), else from its attributes (scale None: a
    fixed-point multiplier, the scale is not recorded), or None if they say nothing."""
    if n is None or depth > 64:
        return None
    a = n.attrs
    if n.op == "fused":
        return _qparams(a["body"].outputs[0], out_scales, depth + 1)
    if n.op == "quantize":
        s = a.get("scale") or (2.0 ** -a["shift"] if a.get("shift") is not None else None)
        return None if s is None else (float(s), int(a.get("zero_point", 0) or 0))
    if "out_shift" in a:
        zp = int(a.get("out_zp", 0) or 0)
        per_channel = n.op in ("qconv2d", "qdense") and len(n.inputs) > 3   # a 4th input: channel multipliers
        if a.get("mul", 1) != 1 or a.get("a_mul") or a.get("b_mul") or per_channel:
            return None, zp
        recorded = (out_scales or {}).get(n.name)
        return (recorded if recorded is not None else 2.0 ** -a["out_shift"]), zp
    if n.op in SCALE_PRESERVING and n.inputs:
        return _qparams(n.inputs[0], out_scales, depth + 1)
    return None


def _channel_count(n, depth: int = 0) -> int | None:
    """The channels of the per-channel multipliers behind int8 node n (a qconv2d/qdense with a
    4th input, through fused bodies and scale-preserving ops), or None: its int8 tensor then has
    one step per channel, which no single fitted scale matches."""
    if n is None or depth > 64:
        return None
    if n.op == "fused":
        return _channel_count(n.attrs["body"].outputs[0], depth + 1)
    if n.op in ("qconv2d", "qdense") and len(n.inputs) > 3:
        return int(np.prod(n.inputs[3].shape))   # (a parameter inside a fused body: its shape)
    if n.op in SCALE_PRESERVING and n.op not in ("reshape", "transpose") and n.inputs:
        return _channel_count(n.inputs[0], depth + 1)
    return None


#: ONNX ops left out of a divergence's "computed together with" line (still in the JSON's covers)
QUIET_OPS = ("QuantizeLinear", "DequantizeLinear", "Constant")
#: name parts a compiled tensor "X/part/..." may add and still hold ONNX node X's value
SAME_VALUE_PARTS = {"quantize", "dequantize", "pack", "unpack"}


def _unpack_like(x: np.ndarray, shape: tuple) -> np.ndarray | None:
    """x (possibly blocked N' C' ... b0 b1) in `shape`'s NC... layout, or None if it does not fit."""
    if x.shape == shape:
        return x
    if x.ndim == len(shape) + 2 and len(shape) >= 2:
        try:
            y = unpack_blocked(x, shape[:2])
        except Exception:  # noqa: BLE001 - not a blocked layout after all
            y = None
        if y is not None and y.shape == shape:
            return y
    if x.size == int(np.prod(shape)):
        return x.reshape(shape)
    return None


def _float_view(obs: Observed, node: str, shape: tuple | None) -> tuple[np.ndarray, float | None, str] | None:
    """An executor's value of ONNX node `node` as float in the reference's layout: (array, one
    quantization step or None, how it was scaled)."""
    own = obs.tensor_of(node)
    if own is None:
        return None
    cands = [own] + [k for k in obs.values if k.startswith(own + "/")
                     and set(k[len(own) + 1:].split("/")) <= SAME_VALUE_PARTS][::-1]
    views = []
    for name in cands:
        x = obs.values.get(name)
        if x is None:
            continue
        if shape is not None:
            x = _unpack_like(x, tuple(shape))
            if x is None:
                continue
        views.append((name, x))
    for name, x in views:   # a float form first
        if x.dtype.kind == "f":
            return x.astype(np.float64), None, "float"
    for name, x in views:
        qp = _qparams(obs.nodes.get(name), obs.out_scales)
        s, z = qp if qp is not None else (None, None)
        if s is not None:
            return (x.astype(np.float64) - z) * s, s, "scale"
        if z is not None:    # scale fitted against the reference in compare_float
            # one scale per channel where it has them (the multipliers may cover channels padded
            # to the accelerator's block: 80 for a 72-channel tensor)
            c = _channel_count(obs.nodes.get(name))
            if c is not None and c > 1 and x.ndim >= 3 and c >= x.shape[1] > 1:
                return x.astype(np.float64) - z, 0.0, "fitted_channels"
            return x.astype(np.float64) - z, 0.0, "fitted"
        return x.astype(np.float64), 0.0, "affine"   # scale and zero point fitted
    return None


def compare_float(ref: np.ndarray, got: np.ndarray, step: float | None, how: str, quant: bool,
                  tol: Tolerance) -> dict:
    """Cosine, relative error and largest difference of `got` against `ref` (`how` "fitted_channels":
    got has a scale per channel, axis 1, each fitted by least squares)."""
    if how == "fitted_channels":
        g, r = np.moveaxis(got.astype(np.float64), 1, 0), np.moveaxis(ref.astype(np.float64), 1, 0)
        g, r = g.reshape(g.shape[0], -1), r.reshape(r.shape[0], -1)
        qq = np.einsum("ij,ij->i", g, g)
        s = np.where(qq > 0, np.einsum("ij,ij->i", g, r) / np.where(qq > 0, qq, 1.0), 1.0)
        got = np.moveaxis((g * s[:, None]).reshape(np.moveaxis(got, 1, 0).shape), 0, 1)
        step = float(np.max(np.abs(s)))
    ref = ref.astype(np.float64).ravel()
    got = got.astype(np.float64).ravel()
    if how == "fitted":      # least-squares scale
        qq = float(got @ got)
        s = float(got @ ref) / qq if qq else 1.0
        got = got * s
        step = abs(s)
    elif how == "affine":    # least-squares scale and offset
        if got.size > 1 and float(np.ptp(got)) > 0:
            s, c = np.polyfit(got, ref, 1)
        else:
            s, c = 1.0, float(np.mean(ref - got)) if got.size else 0.0
        got = got * s + c
        step = abs(float(s))
    nr, ng = float(np.linalg.norm(ref)), float(np.linalg.norm(got))
    if not np.all(np.isfinite(ref)) or not np.all(np.isfinite(got)):
        same = bool(np.array_equal(np.isnan(ref), np.isnan(got))
                    and np.allclose(np.nan_to_num(ref), np.nan_to_num(got)))
        return {"cos": None, "rel": None, "max_abs": None, "scale": how, "diverged": not same,
                "text": "nan/inf " + ("same" if same else "DIFF")}
    diff = float(np.linalg.norm(got - ref))
    cos = 1.0 if nr == 0 and ng == 0 else (float(got @ ref) / (nr * ng) if nr and ng else 0.0)
    rel = 0.0 if diff == 0 else (diff / nr if nr else float("inf"))
    max_abs = float(np.max(np.abs(got - ref))) if ref.size else 0.0
    cmin, rmax = (tol.quant_cos, tol.quant_rel) if quant else (tol.float_cos, tol.float_rel)
    atol = tol.lsb * step if step else 1e-6 * (1.0 + float(np.max(np.abs(ref))) if ref.size else 1.0)
    bad = (cos < cmin or rel > rmax) and max_abs > atol
    text = f"cos {cos:.4f} rel {rel:.3g}" + (" !" if bad else "")
    return {"cos": round(cos, 6), "rel": rel, "max_abs": max_abs, "scale": how, "diverged": bool(bad), "text": text}


def compare_exact(a: Observed, b: Observed, names: list[str]) -> dict:
    """Bit for bit on integer tensors (float tensors of CPU steps: to float32 rounding)."""
    diff, total, worst, bad_names = 0, 0, 0.0, []
    for n in names:
        x, y = a.values[n], b.values[n]
        if x.shape != y.shape:
            bad_names.append(n)
            diff += max(x.size, y.size)
            total += max(x.size, y.size)
            continue
        total += x.size
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            ne = ~np.isclose(x.astype(np.float64), y.astype(np.float64), rtol=1e-5, atol=1e-6, equal_nan=True)
        else:
            ne = x != y
        k = int(np.count_nonzero(ne))
        if k:
            bad_names.append(n)
            diff += k
            worst = max(worst, float(np.max(np.abs(x[ne].astype(np.float64) - y[ne].astype(np.float64)))))
    bad = bool(bad_names)
    text = (f"DIFF {diff}/{total} max {worst:g} !" if bad else f"exact ({total})")
    return {"tensors": names, "differing": bad_names, "elements": total, "differ": diff, "max_abs": worst,
            "diverged": bad, "text": text}


def _row_of(name: str, rows: set[str]) -> str | None:
    """The ONNX node (or graph input) a compiled tensor belongs to: its name or its first path part."""
    if name in rows:
        return name
    parts = name.split("/")
    for k in range(len(parts) - 1, 0, -1):
        p = "/".join(parts[:k])
        if p in rows:
            return p
    return None


def _covers(first: str, onnx_nodes, observed: set[str]) -> list[str]:
    """ONNX nodes computed together with `first` as far as this pair can see: `first` and its
    producers back to the nearest observed node (folded batch norms, fused conv+relu...)."""
    producer = {o: (name, op, ins) for name, op, ins, outs in onnx_nodes for o in outs}
    by_name = {name: (op, ins) for name, op, ins, _ in onnx_nodes}
    out, todo, seen = [], [first], set()
    while todo:
        n = todo.pop()
        if n in seen or n not in by_name:
            continue
        seen.add(n)
        out.append(n)
        for i in by_name[n][1]:
            p = producer.get(i)
            if p is not None and p[0] not in observed:
                todo.append(p[0])
    order = {name: k for k, (name, *_rest) in enumerate(onnx_nodes)}
    return sorted(out, key=lambda n: order[n])


def _chain_order(executors: list[str]) -> list[str]:
    rank = {e: k for k, e in enumerate(CHAIN)}
    return sorted(executors, key=lambda e: (rank.get(e, len(CHAIN)), executors.index(e)))


def parse_executors(text: str | list[str] | None) -> list[str]:
    names = [e.strip() for e in (text.split(",") if isinstance(text, str) else text or DEFAULT_EXECUTORS)
             if e.strip()]
    if len(names) < 2:
        raise BisectError(f"--executors {','.join(names)!r}: name at least two executors to compare")
    allowed = list(FLOAT_EXECUTORS) + ["int8ref"] + available_drivers()
    for e in names:
        if e not in allowed:
            raise BisectError(f"--executors: unknown executor {e!r}; executors are {', '.join(allowed)}")
    if len(set(names)) != len(names):
        raise BisectError(f"--executors {','.join(names)!r}: an executor is named twice")
    return _chain_order(names)


def bisect(model, feed: dict, executors=None, config=None, tolerance: Tolerance | str | None = None,
           calibration: list | None = None, module=None, driver_options: dict | None = None,
           progress: Callable[[str], None] | None = None, fuse: bool = True, shapes: dict | None = None,
           force_target: dict | None = None) -> BisectReport:
    """Run `model` (ONNX path, bytes or ModelProto) on `feed` ({input name: array}) on each
    executor and compare neighbours node by node. module: a prebuilt accelerator build to use
    instead of compiling (its .graph is needed for int8ref). driver_options: per driver name,
    keyword options for get_driver. fuse=False compiles without operator fusion, so that every
    ONNX node's output is observable (a fault only the fused code has may then vanish: try both).
    shapes: static shapes of inputs with symbolic dimensions (default: the fed arrays' shapes);
    force_target: {ONNX op type: "accel" | "cpu"} as for accel compile --force."""
    import onnx  # noqa: PLC0415 - onnx loads only when a model is read
    if isinstance(model, (str, Path)):
        label = str(model)
        model = load_model(model)
    elif isinstance(model, bytes):
        label, model = "<bytes>", onnx.load_from_string(model)
    else:
        label = model.graph.name or "model"
    ex = parse_executors(executors)
    tol = tolerance if isinstance(tolerance, Tolerance) else Tolerance.parse(tolerance)
    onnx_nodes = _onnx_nodes(model)
    inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    missing = [n for n in inputs if n not in feed]
    if missing:
        raise BisectError(f"no input value for {', '.join(missing)} (model inputs: {', '.join(inputs)})")
    feed = {k: np.asarray(v) for k, v in feed.items() if k in inputs}
    shapes = dict(shapes or {k: list(v.shape) for k, v in feed.items()})
    say = progress or (lambda msg: log.info("%s", msg))
    obs: dict[str, Observed] = {}
    e = "accel build"
    try:
        if any(e not in FLOAT_EXECUTORS for e in ex) and module is None:
            say("compiling for the accelerator")
            module = build_accel(model, feed, config, calibration, fuse, shapes, force_target)
        for e in ex:
            say(f"running {e}")
            if e == "ort":
                obs[e] = Observed("ort", run_ort(model, feed))
            elif e == "cpu":
                obs[e] = run_cpu(model, feed, calibration, fuse, shapes)
            elif e == "int8ref":
                obs[e] = run_int8ref(module, feed)
            else:
                obs[e] = run_driver(module, feed, e, **(driver_options or {}).get(e, {}))
    except BisectError:
        raise
    except (AccelError, OSError) as err:   # the compiler's, the runtime's, a simulator's or a driver's error
        raise BisectError(f"executor {e!r}: {err}") from None
    for o in obs.values():
        o.alias = folded_aliases(onnx_nodes, o.graph)
    ref_shapes = {k: v.shape for k, v in obs["ort"].values.items()} if "ort" in obs else {}
    row_names = list(inputs) + [n for n, *_ in onnx_nodes]
    row_set = set(row_names)
    op_of = {**{n: "(input)" for n in inputs}, **{n: op for n, op, *_ in onnx_nodes}}
    rows = {n: {"name": n, "op": op_of[n], "pairs": {}} for n in row_names}
    pairs = []
    for a, b in zip(ex, ex[1:]):
        A, B = obs[a], obs[b]
        key = f"{a}~{b}"
        cells: dict[str, dict] = {}
        if A.integer and B.integer:
            kind = "exact"
            shared = [n for n in A.values if n in B.values]
            by_row: dict[str, list[str]] = {}
            for n in shared:
                r = _row_of(n, row_set)
                r = A.alias.get(r, r)
                if r is not None:
                    by_row.setdefault(r, []).append(n)
            for r, names in by_row.items():
                cells[r] = compare_exact(A, B, names)
        else:
            kind = "quant" if A.quantized or B.quantized else "float"
            for r in row_names:
                shape = ref_shapes.get(r)
                va = _float_view(A, r, shape)
                if va is None:
                    continue
                vb = _float_view(B, r, va[0].shape if shape is None else shape)
                if vb is None or vb[0].shape != va[0].shape:
                    continue
                quant = kind == "quant" or va[2] != "float" or vb[2] != "float"   # an int8 side
                kind = "quant" if quant else kind
                if va[2] in ("fitted", "fitted_channels", "affine"):   # fit the side without a scale to the other
                    cells[r] = compare_float(vb[0], va[0], va[1], va[2], quant, tol)
                else:
                    cells[r] = compare_float(va[0], vb[0], vb[1], vb[2], quant, tol)
        first = next((r for r in row_names if r in cells and cells[r]["diverged"]), None)
        for r, c in cells.items():
            rows[r]["pairs"][key] = c
        covers = _covers(first, onnx_nodes, set(cells)) if first is not None else []
        if first is None:
            summary = f"{key}: no divergence over {len(cells)} compared node(s)"
        else:
            others = [f"{n} ({op_of[n]})" for n in covers if n != first and op_of[n] not in QUIET_OPS]
            quiet = sum(1 for n in covers if n != first and op_of[n] in QUIET_OPS)
            if quiet:
                others.append(f"{quiet} QuantizeLinear/DequantizeLinear/Constant node(s)")
            summary = (f"{key}: first divergence at node '{first}' ({op_of[first]})"
                       + (f", computed together with {', '.join(others)}" if others else "")
                       + f": {cells[first]['text'].rstrip(' !')}")
        pairs.append({"key": key, "a": a, "b": b, "kind": kind, "first": first, "covers": covers,
                      "compared": len(cells), "summary": summary})
        log.info("%s", summary)
    return BisectReport(label, ex, tol, [rows[n] for n in row_names], pairs)


__all__ = ["bisect", "BisectReport", "BisectError", "Tolerance", "parse_executors", "CHAIN", "DEFAULT_EXECUTORS"]


# ---- command line (accel bisect) ------------------------------------------------------------------
def add_arguments(p) -> None:
    p.add_argument("model", help="ONNX model")
    p.add_argument("--input", dest="inputs", action="append", default=[], metavar="x.npy|NAME=x.npy|in.npz|random",
                   help="the model's input(s), as for `accel run`")
    p.add_argument("--config", default="default", metavar="C", help="accelerator preset or JSON file "
                                                                     "(default: %(default)s)")
    p.add_argument("--executors", default=",".join(DEFAULT_EXECUTORS), metavar="E1,E2,...",
                   help=f"executors to compare, in the order {','.join(CHAIN)} (any registered driver after "
                        f"them; default: %(default)s)")
    p.add_argument("--tolerance", metavar="KEY=V,...",
                   help="float comparison limits: cos, rel (int8 vs float; default 0.9, 0.5), float_cos, float_rel "
                        "(float vs float; default 0.9999, 1e-3), lsb (differences within this many quantization "
                        "steps never count; default 2)")
    p.add_argument("--calibration", metavar="S.npz",
                   help="samples for the int8 scales (as for `accel compile`; default: the input itself)")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DxDx..",
                   help="static shape of an input with symbolic dimensions, e.g. x=1x3x224x224; repeatable")
    p.add_argument("--force", action="append", default=[], metavar="OP=TARGET",
                   help="put every op of a type on a target in the accelerator build (e.g. Conv=cpu); repeatable")
    p.add_argument("--no-fuse", action="store_true",
                   help="compile without operator fusion: every ONNX node's output observable (a fault in fused "
                        "code only may then vanish; compare both)")
    p.add_argument("--json", metavar="F", help="write the table and the first divergence of each pair as JSON")
    p.set_defaults(func=main)


def _say(msg: str) -> None:
    """Progress on a terminal (stderr stays one error line when redirected)."""
    print(f"{msg} ...", file=sys.stderr)


class _Inputs:
    """What accel.cli's input reader asks of a model: input names and their types."""

    def __init__(self, graph):
        self._in = {i.name: i for i in graph.inputs}
        self.input_names = list(self._in)

    def input_spec(self, name):
        return self._in[name].type


def main(args) -> int:
    if args.json:
        for src in [args.model, args.calibration] + [spec_file(x) for x in args.inputs]:
            if src and src != "random" and same_file(args.json, src):
                raise InputError(f"--json {args.json} is the same file as the input {src}; refusing to overwrite an "
                               f"input (choose another output path)")
    ex = parse_executors(args.executors)
    tol = Tolerance.parse(args.tolerance)
    cfg = resolve_config(args.config)
    shapes, force = shape_specs(args.shape), force_specs(args.force)
    try:
        model = load_model(args.model)
        graph = from_onnx(model, shapes=shapes or None)
    except CompilerError as e:
        hint = " (give it with --shape NAME=DxDx..)" if "symbolic" in str(e) else ""
        raise InputError(f"{args.model}: {e}{hint}") from None
    feed = read_inputs(_Inputs(graph), args.inputs)
    cal = calibration(args.calibration, graph.inputs)
    report = bisect(model, feed, executors=ex, config=cfg, tolerance=tol, calibration=cal,
                    progress=_say if sys.stderr.isatty() and not getattr(args, "quiet", False) else None,
                    fuse=not args.no_fuse,
                    shapes=shapes or None, force_target=force or None)
    report.model = args.model
    print(report.table())
    if args.json:
        report.write_json(args.json)
        print(f"wrote {args.json}")
    return 1 if report.diverged else 0
