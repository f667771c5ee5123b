"""The sweep space: which accelerator parameters vary, over which values, under which constraints.

A SPACE file (TOML or JSON) holds:

    base = "default"                  # preset or config JSON the unswept keys come from
    constraints = ["block_out >= block_in"]   # expressions over config keys and derived values
    [params]                          # AccelConfig key -> value, list of values, range, or "auto"
    block_in = [8, 16, 32]
    wgt_buff_bytes = {range = [8192, 262144], pow2 = true}
    clock_mhz = {range = [100, 200], step = 50}
    inp_buff_bytes = "auto"
    [energy]                          # overrides of flows.point.ENERGY_PJ (per-access energies)
    dram_pj_per_byte = 100.0
    [compile]
    force = {Conv = "accel"}          # compiler.build's force_target

`auto` (buffer keys only) derives a buffer's size from the block sizes and the models' layers:
the smallest power-of-two number of entries that holds the largest layer's whole operand,
never more than the base config's depth. out_buff_bytes is always `auto` unless given, since it
must mirror the accumulator's entries.
"""
from __future__ import annotations

import ast
import itertools
import json
import math
import operator
import random
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from accel.isa import AccelConfig
from accel.isa.config import resolve_config
from accel.isa.errors import AccelError

from .errors import SweepError
from .point import ENERGY_PJ

CONFIG_KEYS = tuple(f.name for f in fields(AccelConfig))
BUFFER_KEYS = ("inp_buff_bytes", "wgt_buff_bytes", "acc_buff_bytes", "out_buff_bytes", "uop_buff_bytes")
AUTO = "auto"
TOP_KEYS = ("base", "params", "constraints", "energy", "compile")
DERIVED = ("inp_depth", "wgt_depth", "acc_depth", "out_depth", "uop_depth", "inp_elem_bytes", "wgt_elem_bytes",
           "acc_elem_bytes", "out_elem_bytes", "uop_bits", "macs_per_cycle", "peak_gops", "bus_bytes")
MAX_RANGE_VALUES = 4096


@dataclass
class Space:
    """A parsed SPACE file: params maps each swept key to its candidate values (numbers or "auto")."""

    params: dict[str, list]
    base: AccelConfig
    base_name: str = "default"
    constraints: list[str] = field(default_factory=list)
    energy: dict[str, float] = field(default_factory=dict)
    force: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, list[int]] = field(default_factory=dict)
    source: str = ""

    @property
    def swept(self) -> list[str]:
        """Keys with more than one candidate: the CSV's parameter columns (plus fixed keys given)."""
        return list(self.params)

    @property
    def size(self) -> int:
        return math.prod(len(v) for v in self.params.values())

    def grid(self):
        """Every combination, in file order (the last key varies fastest)."""
        keys = list(self.params)
        for combo in itertools.product(*(self.params[k] for k in keys)):
            yield dict(zip(keys, combo))

    def sample(self, n: int, seed: int = 0) -> list[dict]:
        """n distinct combinations drawn uniformly (all of them when the grid is no larger)."""
        if n >= self.size:
            return list(self.grid())
        rng = random.Random(seed)
        keys = list(self.params)
        seen, out = set(), []
        while len(out) < n:
            idx = tuple(rng.randrange(len(self.params[k])) for k in keys)
            if idx not in seen:
                seen.add(idx)
                out.append({k: self.params[k][i] for k, i in zip(keys, idx)})
        return out

    def to_dict(self) -> dict:
        return {"base": self.base_name, "params": self.params, "constraints": self.constraints,
                "energy": self.energy, "compile": {"force": self.force, "shapes": self.shapes}}


# ---- parsing --------------------------------------------------------------------------------------
def load_space(path: str | Path) -> Space:
    """Read and check a SPACE file (.toml or .json)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise SweepError(f"space file {p}: cannot read it ({e.strerror})") from None
    try:
        data = json.loads(text) if p.suffix.lower() == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        kind = "JSON" if p.suffix.lower() == ".json" else "TOML"
        raise SweepError(f"space file {p}: not valid {kind} ({e})") from None
    return parse_space(data, source=str(p))


def parse_space(data: dict, source: str = "space") -> Space:
    if not isinstance(data, dict):
        raise SweepError(f"{source}: expected a table/object at the top level")
    top_params = {k: v for k, v in data.items() if k in CONFIG_KEYS}   # params may sit at the top level
    data = {k: v for k, v in data.items() if k not in CONFIG_KEYS}
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise SweepError(f"{source}: unknown key(s) {', '.join(unknown)}; allowed are {', '.join(TOP_KEYS)} "
                         f"and AccelConfig keys")
    base_name = data.get("base", "default")
    try:
        base = resolve_config(base_name)
    except AccelError as e:
        raise SweepError(f"{source}: base: {e}") from None
    raw = data.get("params", {})
    if not isinstance(raw, dict):
        raise SweepError(f"{source}: [params] must map AccelConfig keys to their values")
    both = sorted(set(raw) & set(top_params))
    if both:
        raise SweepError(f"{source}: {', '.join(both)} given both at the top level and in [params]")
    raw = top_params | raw
    if not raw:
        raise SweepError(f"{source}: [params] must map at least one AccelConfig key to its values")
    params = {}
    for key, spec in raw.items():
        if key not in CONFIG_KEYS:
            raise SweepError(f"{source}: params.{key}: not an AccelConfig key; keys are {', '.join(CONFIG_KEYS)}")
        params[key] = _values(f"{source}: params.{key}", key, spec)
    cons = data.get("constraints", [])
    if isinstance(cons, str):
        cons = [cons]
    if not isinstance(cons, list) or not all(isinstance(c, str) for c in cons):
        raise SweepError(f"{source}: constraints must be a list of expressions (strings)")
    for c in cons:
        _check_expr(c, f"{source}: constraint {c!r}")
    energy = data.get("energy", {})
    if not isinstance(energy, dict):
        raise SweepError(f"{source}: [energy] must be a table of per-access energies in pJ")
    for k, v in energy.items():
        if k not in ENERGY_PJ:
            raise SweepError(f"{source}: energy.{k}: unknown entry; entries are {', '.join(ENERGY_PJ)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise SweepError(f"{source}: energy.{k}={v!r}: must be a number >= 0")
    comp = data.get("compile", {})
    if not isinstance(comp, dict) or set(comp) - {"force", "shapes"}:
        raise SweepError(f"{source}: [compile] takes force = {{OpType = \"accel\"|\"cpu\"}} and "
                         f"shapes = {{input = [1, 3, 224, 224]}}")
    force = comp.get("force", {})
    if not isinstance(force, dict) or any(v not in ("accel", "cpu") for v in force.values()):
        raise SweepError(f"{source}: compile.force must map op types to \"accel\" or \"cpu\", got {force!r}")
    shapes = comp.get("shapes", {})
    if not isinstance(shapes, dict):
        raise SweepError(f"{source}: compile.shapes must map input names to shapes")
    shapes = {k: parse_shape(v, f"{source}: compile.shapes.{k}") for k, v in shapes.items()}
    return Space(params=params, base=base, base_name=str(base_name), constraints=cons,
                 energy={k: float(v) for k, v in energy.items()}, force=dict(force), shapes=shapes, source=source)


def parse_shape(v, where: str) -> list[int]:
    """[1, 3, 224, 224] or "1x3x224x224" -> a list of positive ints."""
    if isinstance(v, str):
        try:
            v = [int(x) for x in v.lower().split("x")]
        except ValueError:
            v = None
    if (not isinstance(v, list) or not v
            or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in v)):
        raise SweepError(f"{where}: a shape is a list of positive integers like [1, 3, 224, 224] or \"1x3x224x224\"")
    return list(v)


def _values(where: str, key: str, spec) -> list:
    want_float = key == "clock_mhz"
    if isinstance(spec, dict):
        vals = _range(where, spec)
    elif isinstance(spec, list):
        if not spec:
            raise SweepError(f"{where}: empty list of values")
        vals = spec
    else:
        vals = [spec]
    out = []
    for v in vals:
        if v == AUTO:
            if key not in BUFFER_KEYS:
                raise SweepError(f"{where}: \"auto\" is allowed for {', '.join(BUFFER_KEYS)} only")
        elif isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SweepError(f"{where}: value {v!r} is not a number")
        elif not want_float and v != int(v):
            raise SweepError(f"{where}: value {v!r} must be an integer")
        else:
            v = float(v) if want_float else int(v)
        if v not in out:
            out.append(v)
    return out


def _range(where: str, spec: dict) -> list:
    """{range = [lo, hi], step = s} (inclusive) or {range = [lo, hi], pow2 = true}; lo and hi may
    also be given as min/max or start/stop."""
    spec = dict(spec)
    for lo_k, hi_k in (("min", "max"), ("start", "stop")):
        if lo_k in spec and hi_k in spec and "range" not in spec:
            spec["range"] = [spec.pop(lo_k), spec.pop(hi_k)]
    extra = sorted(set(spec) - {"range", "step", "pow2"})
    if extra or "range" not in spec:
        raise SweepError(f"{where}: a range is {{range = [lo, hi], step = s}} or {{range = [lo, hi], pow2 = true}}")
    r = spec["range"]
    if (not isinstance(r, list) or len(r) != 2 or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in r)
            or r[0] > r[1]):
        raise SweepError(f"{where}: range must be [lo, hi] with lo <= hi, got {r!r}")
    lo, hi = r
    if spec.get("pow2"):
        if "step" in spec or lo <= 0:
            raise SweepError(f"{where}: a pow2 range takes no step and needs lo > 0")
        v, vals = 1 << max(0, math.ceil(math.log2(lo))), []
        while v <= hi:
            if v >= lo:
                vals.append(v)
            v *= 2
        if not vals:
            raise SweepError(f"{where}: no power of two in [{lo}, {hi}]")
        return vals
    step = spec.get("step", 1)
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
        raise SweepError(f"{where}: step must be a number > 0, got {step!r}")
    n = int(math.floor((hi - lo) / step + 1e-9)) + 1
    if n > MAX_RANGE_VALUES:
        raise SweepError(f"{where}: the range has {n} values, more than {MAX_RANGE_VALUES}")
    return [lo + i * step for i in range(n)]


# ---- constraints -----------------------------------------------------------------------------------
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge}
_FUNCS = {"min": min, "max": max, "abs": abs, "log2": math.log2}
NAMES = set(CONFIG_KEYS) | set(DERIVED)


def _check_expr(text: str, where: str) -> ast.Expression:
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise SweepError(f"{where}: not an expression ({e.msg})") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id not in NAMES and node.id not in _FUNCS:
            raise SweepError(f"{where}: unknown name {node.id!r}; names are config keys and "
                             f"{', '.join(DERIVED)}")
        if not isinstance(node, (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub,
                                 ast.BinOp, ast.Compare, ast.Name, ast.Load, ast.Constant, ast.Call,
                                 *_BIN, *_CMP)):
            raise SweepError(f"{where}: {type(node).__name__} is not allowed in a constraint")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS):
            raise SweepError(f"{where}: only {', '.join(_FUNCS)} may be called")
    return tree


def _eval(node, env):
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id] if node.id in env else _FUNCS[node.id]
    if isinstance(node, ast.BoolOp):
        vals = (_eval(v, env) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        return (not v) if isinstance(node.op, ast.Not) else -v
    if isinstance(node, ast.BinOp):
        return _BIN[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call):
        return _eval(node.func, env)(*[_eval(a, env) for a in node.args])
    raise SweepError(f"cannot evaluate {type(node).__name__}")


def violated(constraints: list[str], cfg: "AccelConfig | dict") -> str | None:
    """The first constraint `cfg` breaks, or None. Given a plain dict of config keys (a config not
    yet validated), only the constraints that use no derived value are checked."""
    if isinstance(cfg, AccelConfig):
        env = cfg.to_dict() | {k: getattr(cfg, k) for k in DERIVED}
    else:
        env = dict(cfg)
    for c in constraints:
        tree = _check_expr(c, c)
        if any(isinstance(n, ast.Name) and n.id not in env and n.id not in _FUNCS for n in ast.walk(tree)):
            continue
        try:
            ok = _eval(tree, env)
        except (ArithmeticError, ValueError, TypeError) as e:
            raise SweepError(f"constraint {c!r}: {e}") from None
        if not ok:
            return c
    return None


# ---- layers and auto sizes -------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    """A GEMM layer's operand extents: rows (batch rows times output pixels), K and N in elements.

    in_pixels: input pixels per image (padded), for the input buffer; kernel: kh * kw."""

    name: str
    batch: int
    in_ch: int
    in_pixels: int
    out_ch: int
    out_pixels: int
    kernel: int


def model_inputs(model_bytes: bytes, name: str = "model") -> dict[str, list]:
    """The graph inputs (initializers excluded) and their dims (a str for a symbolic one)."""
    m = _load_onnx(model_bytes, name)
    inits = {t.name for t in m.graph.initializer}
    return {vi.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                      for d in vi.type.tensor_type.shape.dim]
            for vi in m.graph.input if vi.name not in inits}


def _load_onnx(model_bytes: bytes, name: str):
    import onnx  # noqa: PLC0415 - onnx loads only when a model is read
    try:
        return onnx.load_from_string(model_bytes)
    except Exception as e:  # onnx raises several unrelated types for bad files
        raise SweepError(f"model {name}: not a readable ONNX model ({type(e).__name__}: {e})") from None


def model_layers(model_bytes: bytes, name: str = "model", shapes: dict | None = None) -> list[Layer]:
    """The conv and dense layers of an ONNX model, with shapes from onnx shape inference (inputs
    given in `shapes` take those)."""
    import onnx  # noqa: PLC0415 - onnx loads only when a model is read
    from onnx import shape_inference  # noqa: PLC0415 - onnx loads only when a model is read
    m = _load_onnx(model_bytes, name)
    for vi in m.graph.input:
        if shapes and vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            del dims[:]
            for d in shapes[vi.name]:
                dims.add().dim_value = d
    try:
        m = shape_inference.infer_shapes(m)
    except Exception as e:  # onnx raises several unrelated types for bad files
        raise SweepError(f"model {name}: onnx shape inference failed ({type(e).__name__}: {e})") from None
    shapes = {}
    for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[vi.name] = [d.dim_value for d in dims]
    for t in m.graph.initializer:
        shapes[t.name] = list(t.dims)
    # a weight behind DequantizeLinear (QDQ models) has the initializer's shape
    for n in m.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in shapes:
            shapes.setdefault(n.output[0], shapes[n.input[0]])
    layers = []
    for n in m.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        ins = [shapes.get(i) for i in n.input]
        if n.op_type == "Conv" and len(ins) >= 2 and ins[0] and ins[1] and len(ins[0]) == 4:
            x, w = ins[0], ins[1]
            y = shapes.get(n.output[0])
            pads = attrs.get("pads", [0, 0, 0, 0])
            hp, wp = x[2] + pads[0] + pads[2], x[3] + pads[1] + pads[3]
            out_px = y[2] * y[3] if y and len(y) == 4 else hp * wp
            if attrs.get("group", 1) != 1:   # grouped convs run on the CPU (partition's hard decline)
                continue
            layers.append(Layer(n.name, x[0], x[1], hp * wp, w[0], out_px, w[2] * w[3]))
        elif n.op_type in ("Gemm", "MatMul") and len(ins) >= 2 and ins[0] and ins[1] and len(ins[1]) == 2:
            a, b = ins[0], ins[1]
            k, nn = (b[1], b[0]) if attrs.get("transB") else (b[0], b[1])
            rows = math.prod(a[:-1]) if len(a) > 1 else 1
            layers.append(Layer(n.name, rows, k, 1, nn, 1, 1))
    return layers


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


def auto_depths(batch: int, block_in: int, block_out: int, layers: list[Layer]) -> dict[str, int]:
    """Entries each buffer needs to hold the largest layer's whole operand (0 without layers)."""
    def cdiv(a, b):
        return -(-a // b)
    need = {"inp": 0, "wgt": 0, "acc": 0}
    for ly in layers:
        rows = cdiv(ly.batch, batch)
        need["inp"] = max(need["inp"], rows * cdiv(ly.in_ch, block_in) * ly.in_pixels)
        need["wgt"] = max(need["wgt"], cdiv(ly.out_ch, block_out) * cdiv(ly.in_ch, block_in) * ly.kernel)
        need["acc"] = max(need["acc"], rows * cdiv(ly.out_ch, block_out) * ly.out_pixels)
    return need


AUTO_MIN_ENTRIES = 64
"""Auto never sizes a buffer below this many entries (room for the compiler's double buffering)."""


def resolve_values(space: Space, values: dict, layers: list[Layer]) -> dict:
    """The config keys of one point, not yet validated: base config, the point's values, then
    `auto` buffer sizes (uop_buff_bytes's needs the config: see resolve_point)."""
    fixed = {k: v for k, v in values.items() if v != AUTO}
    autos = [k for k, v in values.items() if v == AUTO]
    if "out_buff_bytes" not in values:
        autos.append("out_buff_bytes")
    d = space.base.to_dict() | fixed
    b, bi, bo = d["batch"], d["block_in"], d["block_out"]
    if min(b, bi, bo) < 1:
        return d          # AccelConfig names the key at fault
    elem = {"inp": b * bi * d["inp_width"] // 8, "wgt": bo * bi * d["wgt_width"] // 8,
            "acc": b * bo * d["acc_width"] // 8, "out": b * bo * d["out_width"] // 8}
    need = auto_depths(b, bi, bo, layers)
    base = space.base
    ref = {"inp": base.inp_depth, "wgt": base.wgt_depth, "acc": base.acc_depth}
    for key in ("inp_buff_bytes", "wgt_buff_bytes", "acc_buff_bytes"):
        if key in autos:
            m = key[:3]
            depth = min(ref[m], max(AUTO_MIN_ENTRIES, _pow2_at_least(need[m]))) if layers else ref[m]
            d[key] = depth * max(1, elem[m])
    if "out_buff_bytes" in autos:
        d["out_buff_bytes"] = d["acc_buff_bytes"] // max(1, elem["acc"]) * max(1, elem["out"])
    if "uop_buff_bytes" in autos:
        d["uop_buff_bytes"] = AUTO   # resolve_point sizes it at the config's micro-op width
    return d


def resolve_point(space: Space, values: dict, layers: list[Layer], d: dict | None = None) -> AccelConfig:
    """The AccelConfig of one point (d: its resolve_values, when already computed).

    Raises SweepError naming the point's parameters when the combination is invalid."""
    d = dict(d if d is not None else resolve_values(space, values, layers))
    try:
        if d.get("uop_buff_bytes") == AUTO:
            d["uop_buff_bytes"] = space.base.uop_depth * 4
            probe = AccelConfig(**d)
            d["uop_buff_bytes"] = space.base.uop_depth * probe.uop_elem_bytes
        return AccelConfig(**d)
    except AccelError as e:
        raise SweepError(f"{point_label(values)}: {e}") from None


def point_label(values: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
