"""The operator schema: every op is declared here once - its attributes (defaults and allowed
values), arity, type and shape inference, NumPy reference semantics and fusion pattern.

Targets add kernels for a declared op in compiler.ops (`register_kernel(op, target kind)`); they
take their attributes from this schema (normalize_attrs), never with defaults of their own.
Ops come in groups (the table of contents below): leaves, float operators as imported from ONNX,
ONNX's own QDQ ops, the shift-quantized int8 ops the accelerator runs, layout ops, and `fused`.
The reference implementations define what every backend must compute; the int8 ones are exact
integer arithmetic in the order the accelerator's ALU applies it (GEMM into int32, ADD bias, SHR,
CLIP), so their results are bit-exact. Fusion patterns follow TVM's OpPattern.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from numbers import Integral
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from accel.isa.layout import pack_blocked, unpack_blocked

from .errors import OpError
from .ir import Node, TensorType


class _Required:
    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()
INT8_MIN, INT8_MAX = -127, 127  # symmetric: -128 is never produced, so CLIP(dst, 127) suffices


class Pattern(IntEnum):
    """TVM's OpPattern: how an op may fuse. Lower is more fusable."""
    ELEMWISE = 0  # out[i] = f(in[i])
    BROADCAST = 1  # out[i] = f(a[i], b[broadcast(i)])
    INJECTIVE = 2  # each output element reads one input element (reshape, transpose, pad)
    COMM_REDUCE = 3  # commutative reduction (sum, mean, softmax's max/sum)
    OUT_ELEMWISE_FUSABLE = 4  # conv/dense: elementwise followers fuse into its output
    OPAQUE = 8  # never fused


@dataclass(frozen=True)
class Attr:
    """One attribute: its default (REQUIRED: none) and, where not every value is legal, a test of
    the value plus the words an error shows for what is allowed."""
    default: object = REQUIRED
    allowed: str = ""
    test: Callable[[object], bool] | None = None

    def problem(self, v) -> str | None:
        """None when v is legal, else what is allowed."""
        if self.test is None:
            return None
        try:
            ok = bool(self.test(v))
        except Exception:  # noqa: BLE001 - a value the test cannot even look at is not allowed
            ok = False
        return None if ok else self.allowed


def one_of(default, *choices) -> Attr:
    """An attribute that takes one of a few values."""
    return Attr(default, "one of " + ", ".join(repr(c) for c in choices),
                lambda v: any(isinstance(v, str) == isinstance(c, str) and bool(v == c) for c in choices))


def ints(default, n: int, lo: int) -> Attr:
    """n integers, each at least lo (strides, pads, kernel sizes)."""
    return Attr(default, f"{n} integers >= {lo}",
                lambda v: len(v) == n and all(isinstance(x, Integral) and x >= lo for x in v))


def int_in(default, lo: int, hi: int | None = None, what: str = "") -> Attr:
    """An integer in [lo, hi] (hi None: no upper bound)."""
    words = what or (f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]")
    return Attr(default, words, lambda v: isinstance(v, Integral) and lo <= v and (hi is None or v <= hi))


def _zero_point() -> Attr:
    return int_in(0, -128, 127, "an int8 zero point in [-128, 127]")


def _as_attr(v) -> Attr:
    return v if isinstance(v, Attr) else Attr(v)


def _where(op: str, node_name: str | None) -> str:
    return op if node_name is None else f"{op} '{node_name}'"


@dataclass
class OpDef:
    """A declared op. infer(node) -> TensorType; impl(attrs, *arrays) -> array is the reference
    semantics every kernel must match; attrs maps each attribute name to its Attr."""
    name: str
    pattern: Pattern
    infer: Callable[[Node], TensorType]
    impl: Callable[..., np.ndarray] | None
    arity: tuple[int, int]
    attrs: dict = field(default_factory=dict)
    doc: str = ""

    def __post_init__(self):
        self.attrs = {k: _as_attr(v) for k, v in self.attrs.items()}

    @property
    def reference(self):
        return self.impl

    def defaults(self) -> dict:
        """attribute -> default (REQUIRED where there is none)."""
        return {k: a.default for k, a in self.attrs.items()}

    def normalize(self, attrs: dict | None, node_name: str | None = None) -> dict:
        """Every attribute of the op, defaults filled in, lists as tuples; an unknown or missing
        attribute or a value outside the allowed ones raises OpError naming op, node and attribute."""
        attrs = dict(attrs or {})
        where = _where(self.name, node_name)
        unknown = sorted(set(attrs) - set(self.attrs))
        if unknown:
            raise OpError(f"{where}: unknown attribute(s) {', '.join(unknown)}; "
                          f"{self.name} takes {', '.join(self.attrs) or 'none'}")
        out = {}
        for k, spec in self.attrs.items():
            if k in attrs:
                v = attrs[k]
                v = tuple(v) if isinstance(v, list) else v
                why = spec.problem(v)
                if why is not None:
                    shown = " ".join(repr(v).split())        # one line, however the value prints
                    shown = shown if len(shown) <= 60 else shown[:57] + "..."
                    raise OpError(f"{where}: {k}={shown} must be {why}")
                out[k] = v
            elif spec.default is REQUIRED:
                raise OpError(f"{where}: missing required attribute {k!r}")
            else:
                out[k] = spec.default
        return out

    def check_arity(self, n_inputs: int, node_name: str | None = None) -> None:
        lo, hi = self.arity
        if not lo <= n_inputs <= hi:
            want = str(lo) if lo == hi else f"{lo}..{hi}"
            raise OpError(f"{_where(self.name, node_name)}: takes {want} inputs, got {n_inputs}")

    def check_attrs(self, node: Node, attrs: dict) -> dict:
        out = self.normalize(attrs, node.name)
        self.check_arity(len(node.inputs), node.name)
        return out


REGISTRY: dict[str, OpDef] = {}
#: called with each OpDef declared from now on (compiler.module makes its reference a host op)
_ON_DECLARE: list[Callable[[OpDef], None]] = []


def on_declare(fn: Callable[[OpDef], None]) -> None:
    """Call fn(opdef) for every op declared already and every op declared later, so a consumer of
    the schema never depends on which was imported first."""
    _ON_DECLARE.append(fn)
    for d in list(REGISTRY.values()):
        fn(d)


def declare(name: str, pattern: Pattern, arity, attrs: dict | None = None, *, infer: Callable,
            reference: Callable | None, doc: str, replace: bool = False) -> OpDef:
    """Declare op `name` once: attrs maps attribute -> default or Attr; arity an int or (lo, hi);
    infer(node) -> TensorType; reference(attrs, *arrays) -> array (None only for leaves)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise OpError(f"declare: op name {name!r} must be an identifier")
    if name in REGISTRY and not replace:
        raise OpError(f"declare: op {name!r} is already declared")
    if not doc:
        raise OpError(f"declare: op {name!r} needs a doc line")
    lo_hi = arity if isinstance(arity, tuple) else (arity, arity)
    d = OpDef(name, Pattern(pattern), infer, reference, lo_hi, dict(attrs or {}), doc)
    REGISTRY[name] = d
    for fn in _ON_DECLARE:
        fn(d)
    return d


def register(name: str, pattern: Pattern, arity, attrs: dict | None = None, doc: str = ""):
    """Decorator over a factory returning (infer, reference): declare() for the table below."""
    def deco(fn):
        infer, impl = fn()
        declare(name, pattern, arity, attrs, infer=infer, reference=impl, doc=doc or (fn.__doc__ or "").strip())
        return fn
    return deco


def get_op(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise OpError(f"unknown operator {name!r}; declared ops are {', '.join(sorted(REGISTRY))}") from None


def normalize_attrs(name: str, attrs: dict | None, node_name: str | None = None) -> dict:
    """The schema's attributes of op `name` (defaults filled in, values checked)."""
    return get_op(name).normalize(attrs, node_name)


def fail(node: Node, msg: str):
    raise OpError(f"{node.op} '{node.name}': {msg}")


def _t(shape, dtype) -> TensorType:
    return TensorType(tuple(shape), dtype)


def _same_dtype(node: Node) -> str:
    dts = {i.dtype for i in node.inputs}
    if len(dts) != 1:
        fail(node, f"inputs have different dtypes {[i.dtype for i in node.inputs]}")
    return dts.pop()


def _float_input(node: Node, k: int = 0) -> str:
    dt = node.inputs[k].dtype
    if not dt.startswith("float"):
        fail(node, f"input {k} must be float, got {dt}")
    return dt


# ---- leaves ------------------------------------------------------------------------------------
@register("input", Pattern.OPAQUE, 0, doc="a graph input; its type is given at construction")
def _input():
    def infer(n):
        fail(n, "an input node needs an explicit type")
    return infer, None


@register("const", Pattern.OPAQUE, 0, {"value": REQUIRED}, doc="a constant tensor")
def _const():
    def infer(n):
        v = n.attrs["value"]
        if not isinstance(v, np.ndarray):
            fail(n, "value must be a numpy array")
        return _t(v.shape, str(v.dtype))
    return infer, lambda a: a["value"]


# ---- float elementwise -------------------------------------------------------------------------
def _unary(name: str, f, attrs=None, floats_only=True, doc=""):
    def factory():
        def infer(n):
            dt = _float_input(n) if floats_only else n.inputs[0].dtype
            return _t(n.inputs[0].shape, dt)

        def impl(a, x):
            return np.asarray(f(a, x)).astype(x.dtype, copy=False)
        return infer, impl
    register(name, Pattern.ELEMWISE, 1, attrs, doc or f"elementwise {name}")(factory)


_erf = np.vectorize(math.erf, otypes=[np.float64])
_unary("relu", lambda a, x: np.maximum(x, np.zeros((), x.dtype)), floats_only=False,
       doc="max(x, 0); exact on int8 (the scale is positive)")
_unary("sigmoid", lambda a, x: 1.0 / (1.0 + np.exp(-x.astype(np.float64))))
_unary("tanh", lambda a, x: np.tanh(x))
_unary("exp", lambda a, x: np.exp(x))
_unary("sqrt", lambda a, x: np.sqrt(x))
_unary("neg", lambda a, x: -x, floats_only=False)
_unary("abs", lambda a, x: np.abs(x))
_unary("log", lambda a, x: np.log(x))
_unary("reciprocal", lambda a, x: 1.0 / x)
_unary("erf", lambda a, x: _erf(x.astype(np.float64)))
_unary("gelu", lambda a, x: (0.5 * x * (1 + _erf(x.astype(np.float64) / math.sqrt(2))) if a["approximate"] == "none"
                             else 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)))),
       {"approximate": one_of("none", "none", "tanh")})
_unary("leaky_relu", lambda a, x: np.where(x >= 0, x, x * a["alpha"]), {"alpha": 0.01})
_unary("floor", lambda a, x: np.floor(x))
_unary("ceil", lambda a, x: np.ceil(x))
_unary("round", lambda a, x: np.rint(x), doc="round to the nearest integer, ties to even (ONNX Round)")
_unary("sign", lambda a, x: np.sign(x), floats_only=False)
_unary("sin", lambda a, x: np.sin(x))
_unary("cos", lambda a, x: np.cos(x))
_unary("clip", lambda a, x: np.clip(x, -np.inf if a["min"] is None else a["min"], np.inf if a["max"] is None else a["max"]),
       {"min": None, "max": None}, floats_only=False)


@register("cast", Pattern.ELEMWISE, 1, {"to": REQUIRED}, doc="dtype conversion (ONNX Cast)")
def _cast():
    return (lambda n: _t(n.inputs[0].shape, n.attrs["to"]),
            lambda a, x: x.astype(a["to"]))


def _broadcast(n: Node) -> tuple[int, ...]:
    """The numpy broadcast of the inputs' shapes (OpError naming the node when they do not)."""
    try:
        return np.broadcast_shapes(*(i.shape for i in n.inputs))
    except ValueError:
        fail(n, f"shapes {[list(i.shape) for i in n.inputs]} do not broadcast")


def _binary(name: str, f):
    def factory():
        def infer(n):
            return _t(_broadcast(n), _same_dtype(n))

        def impl(a, x, y):
            return np.asarray(f(x, y)).astype(x.dtype, copy=False)
        return infer, impl
    register(name, Pattern.BROADCAST, 2, doc=f"numpy-broadcasting {name}")(factory)


_binary("add", np.add)
_binary("sub", np.subtract)
_binary("mul", np.multiply)
_binary("div", np.divide)
_binary("pow", np.power)
_binary("maximum", np.maximum)
_binary("minimum", np.minimum)


def _mod_ref(a, x, y):
    if a["fmod"]:
        return np.fmod(x, y)     # the sign of the dividend (C fmod)
    return np.mod(x, y)          # the sign of the divisor (Python %)


@register("mod", Pattern.BROADCAST, 2, {"fmod": one_of(0, 0, 1)},
          doc="numpy-broadcasting remainder with the divisor's sign (fmod=0) or the dividend's (fmod=1, C fmod)")
def _mod():
    def infer(n):
        return _t(_broadcast(n), _same_dtype(n))
    return infer, lambda a, x, y: np.asarray(_mod_ref(a, x, y)).astype(x.dtype, copy=False)


def _compare(name: str, f):
    """A broadcasting comparison of two tensors of one dtype: a bool tensor (ONNX Equal, Less...)."""
    def factory():
        def infer(n):
            _same_dtype(n)
            return _t(_broadcast(n), "bool")
        return infer, lambda a, x, y: np.asarray(f(x, y))
    register(name, Pattern.BROADCAST, 2, doc=f"numpy-broadcasting {name}, a bool result")(factory)


def _logic(name: str, f, arity: int):
    """Elementwise logic on bool tensors (ONNX And, Or, Xor, Not)."""
    def factory():
        def infer(n):
            for k, i in enumerate(n.inputs):
                if i.dtype != "bool":
                    fail(n, f"input {k} must be bool, got {i.dtype}")
            return _t(_broadcast(n), "bool")
        return infer, lambda a, *xs: np.asarray(f(*xs))
    register(name, Pattern.ELEMWISE if arity == 1 else Pattern.BROADCAST, arity, doc=f"elementwise logical {name}")(
        factory)


for _name, _f in {"equal": np.equal, "less": np.less, "greater": np.greater, "less_equal": np.less_equal,
                  "greater_equal": np.greater_equal}.items():
    _compare(_name, _f)
_logic("logical_and", np.logical_and, 2)
_logic("logical_or", np.logical_or, 2)
_logic("logical_xor", np.logical_xor, 2)
_logic("logical_not", np.logical_not, 1)


@register("where", Pattern.BROADCAST, 3, doc="cond ? x : y elementwise, numpy-broadcasting (ONNX Where)")
def _where_op():
    def infer(n):
        c, x, y = n.inputs
        if c.dtype != "bool":
            fail(n, f"the condition (input 0) must be bool, got {c.dtype}")
        if x.dtype != y.dtype:
            fail(n, f"inputs 1 and 2 have different dtypes {x.dtype} and {y.dtype}")
        return _t(_broadcast(n), x.dtype)
    return infer, lambda a, c, x, y: np.where(c, x, y)


# ---- conv / dense --------------------------------------------------------------------------------
CONV_ATTRS = {"strides": ints((1, 1), 2, 1), "pads": ints((0, 0, 0, 0), 4, 0), "dilations": ints((1, 1), 2, 1),
              "groups": int_in(1, 1)}


def conv_out_hw(n: Node, hw, khw, strides, pads, dilations):
    out = []
    for k in range(2):
        eff = (khw[k] - 1) * dilations[k] + 1
        size = hw[k] + pads[k] + pads[k + 2] - eff
        if size < 0:
            fail(n, f"kernel {list(khw)} (dilated {eff}) larger than the padded input {list(hw)}")
        out.append(size // strides[k] + 1)
    return out


def _conv_infer_common(n: Node, x: TensorType, w: TensorType, packed: bool):
    a = n.attrs
    if packed:  # x: N' C' H W bn bc ; w: O' I' KH KW bo bi
        if x.rank != 6 or w.rank != 6:
            fail(n, f"packed conv expects 6-d input and weight, got {x} and {w}")
        if x.shape[1] * x.shape[5] != w.shape[1] * w.shape[5] * a["groups"]:
            fail(n, f"packed input channels {x.shape[1]}x{x.shape[5]} != weight's {w.shape[1]}x{w.shape[5]} x "
                    f"groups {a['groups']}")
        ho, wo = conv_out_hw(n, x.shape[2:4], w.shape[2:4], a["strides"], a["pads"], a["dilations"])
        return (x.shape[0], w.shape[0], ho, wo, x.shape[4], w.shape[4])
    if x.rank != 4 or w.rank != 4:
        fail(n, f"conv2d expects NCHW input and OIHW weight, got {x} and {w}")
    g = a["groups"]
    if x.shape[1] != w.shape[1] * g or w.shape[0] % g:
        fail(n, f"input channels {x.shape[1]} != weight in-channels {w.shape[1]} x groups {g}")
    ho, wo = conv_out_hw(n, x.shape[2:], w.shape[2:], a["strides"], a["pads"], a["dilations"])
    return (x.shape[0], w.shape[0], ho, wo)


def conv2d_ref(x, w, strides, pads, dilations, groups, acc=np.float64):
    """Direct conv (NCHW, OIHW) in `acc` precision via a windowed einsum."""
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(acc), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    kh, kw = w.shape[2:]
    eh, ew = (kh - 1) * dilations[0] + 1, (kw - 1) * dilations[1] + 1
    win = sliding_window_view(xp, (eh, ew), axis=(2, 3))[:, :, ::strides[0], ::strides[1], ::dilations[0], ::dilations[1]]
    n, c, ho, wo = win.shape[:4]
    o = w.shape[0]
    win = win.reshape(n, groups, c // groups, ho, wo, kh, kw)
    wg = w.astype(acc).reshape(groups, o // groups, c // groups, kh, kw)
    y = np.einsum("ngchwkl,gockl->ngohw", win, wg, optimize=True)
    return y.reshape(n, o, ho, wo)


@register("conv2d", Pattern.OUT_ELEMWISE_FUSABLE, (2, 3), CONV_ATTRS, doc="2-D convolution, NCHW x OIHW (+ bias O)")
def _conv2d():
    def infer(n):
        dt = _same_dtype(n)
        return _t(_conv_infer_common(n, n.inputs[0].type, n.inputs[1].type, False), dt)

    def impl(a, x, w, b=None):
        y = conv2d_ref(x, w, a["strides"], a["pads"], a["dilations"], a["groups"])
        if b is not None:
            y = y + b.reshape(1, -1, 1, 1)
        return y.astype(x.dtype)
    return infer, impl


@register("conv2d_transpose", Pattern.OUT_ELEMWISE_FUSABLE, (2, 3), {**CONV_ATTRS, "output_padding": ints((0, 0), 2, 0)},
          doc="2-D transposed convolution, NCHW x (C, O/groups, KH, KW) (+ bias)")
def _conv2d_transpose():
    def infer(n):
        dt = _same_dtype(n)
        x, w, a = n.inputs[0].type, n.inputs[1].type, n.attrs
        if x.rank != 4 or w.rank != 4 or x.shape[1] != w.shape[0]:
            fail(n, f"expects NCHW input and (C, O/g, KH, KW) weight with matching C, got {x} and {w}")
        hw = [(x.shape[2 + k] - 1) * a["strides"][k] + (w.shape[2 + k] - 1) * a["dilations"][k] + 1
              + a["output_padding"][k] - a["pads"][k] - a["pads"][k + 2] for k in range(2)]
        return _t((x.shape[0], w.shape[1] * a["groups"], *hw), dt)

    def impl(a, x, w, b=None):
        n_, c, h, wd = x.shape
        g = a["groups"]
        _, og, kh, kw = w.shape
        (sh, sw), (dh, dw), (oph, opw) = a["strides"], a["dilations"], a["output_padding"]
        hf, wf = (h - 1) * sh + (kh - 1) * dh + 1 + oph, (wd - 1) * sw + (kw - 1) * dw + 1 + opw
        full = np.zeros((n_, g, og, hf, wf))
        xg = x.astype(np.float64).reshape(n_, g, c // g, h, wd)
        wg = w.astype(np.float64).reshape(g, c // g, og, kh, kw)
        for i in range(kh):
            for j in range(kw):
                full[:, :, :, i * dh:i * dh + (h - 1) * sh + 1:sh, j * dw:j * dw + (wd - 1) * sw + 1:sw] += \
                    np.einsum("ngchw,gco->ngohw", xg, wg[:, :, :, i, j])
        pt, pl, pb, pr = a["pads"]
        y = full.reshape(n_, g * og, hf, wf)[:, :, pt:hf - pb, pl:wf - pr]
        if b is not None:
            y = y + b.reshape(1, -1, 1, 1)
        return y.astype(x.dtype)
    return infer, impl


@register("dense", Pattern.OUT_ELEMWISE_FUSABLE, (2, 3), doc="y = x @ w.T (+ b); x (N, K), w (O, K)")
def _dense():
    def infer(n):
        dt = _same_dtype(n)
        x, w = n.inputs[0].type, n.inputs[1].type
        if x.rank != 2 or w.rank != 2 or x.shape[1] != w.shape[1]:
            fail(n, f"expects x (N, K) and w (O, K), got {x} and {w}")
        return _t((x.shape[0], w.shape[0]), dt)

    def impl(a, x, w, b=None):
        y = x.astype(np.float64) @ w.astype(np.float64).T
        return (y if b is None else y + b).astype(x.dtype)
    return infer, impl


@register("matmul", Pattern.OUT_ELEMWISE_FUSABLE, 2, doc="numpy matmul with broadcasting batch dims")
def _matmul():
    def infer(n):
        dt = _same_dtype(n)
        a, b = n.inputs[0].shape, n.inputs[1].shape
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            fail(n, f"cannot multiply {list(a)} by {list(b)}")
        try:
            batch = np.broadcast_shapes(a[:-2], b[:-2])
        except ValueError:
            fail(n, f"batch dims of {list(a)} and {list(b)} do not broadcast")
        return _t((*batch, a[-2], b[-1]), dt)
    return infer, lambda a, x, y: np.matmul(x.astype(np.float64), y.astype(np.float64)).astype(x.dtype)


@register("batch_norm", Pattern.BROADCAST, 5, {"epsilon": 1e-5},
          doc="inference batch norm over axis 1: (x - mean) / sqrt(var + eps) * scale + bias")
def _batch_norm():
    def infer(n):
        return _t(n.inputs[0].shape, _float_input(n))

    def impl(a, x, s, b, m, v):
        sh = (1, -1) + (1,) * (x.ndim - 2)
        inv = s.astype(np.float64) / np.sqrt(v.astype(np.float64) + a["epsilon"])
        return ((x - m.reshape(sh)) * inv.reshape(sh) + b.reshape(sh)).astype(x.dtype)
    return infer, impl


# ---- pooling / reductions -----------------------------------------------------------------------
POOL_ATTRS = {"kernel": ints(REQUIRED, 2, 1), "strides": ints((1, 1), 2, 1), "pads": ints((0, 0, 0, 0), 4, 0),
              "ceil_mode": one_of(0, 0, 1)}


def pool_out_hw(n, hw, a):
    out = []
    for k in range(2):
        span = hw[k] + a["pads"][k] + a["pads"][k + 2] - a["kernel"][k]
        o = (-(-span // a["strides"][k]) if a["ceil_mode"] else span // a["strides"][k]) + 1
        if a["ceil_mode"] and (o - 1) * a["strides"][k] >= hw[k] + a["pads"][k]:
            o -= 1  # the last window must start inside the input or its left padding
        if o < 1:
            fail(n, f"kernel {list(a['kernel'])} larger than the padded input {list(hw)}")
        out.append(o)
    return out


def _pool_windows(x, a, fill, out_hw):
    pt, pl, pb, pr = a["pads"]
    eb = max(0, (out_hw[0] - 1) * a["strides"][0] + a["kernel"][0] - (x.shape[2] + pt + pb))
    er = max(0, (out_hw[1] - 1) * a["strides"][1] + a["kernel"][1] - (x.shape[3] + pl + pr))
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb + eb), (pl, pr + er)), constant_values=fill)
    win = sliding_window_view(xp, tuple(a["kernel"]), axis=(2, 3))[:, :, ::a["strides"][0], ::a["strides"][1]]
    return win[:, :, :out_hw[0], :out_hw[1]], (eb, er)


def _pool_infer(n):
    x = n.inputs[0].type
    if x.rank != 4:
        fail(n, f"expects an NCHW input, got {x}")
    return _t((*x.shape[:2], *pool_out_hw(n, x.shape[2:], n.attrs)), x.dtype)


def _max_pool_infer(n):
    """NCHW, the CPU's blocked N C' H W c or the accelerator's packed N' C' H W n c (pooled over H,
    W alike)."""
    x = n.inputs[0].type
    if x.rank in (5, 6):
        return _t((*x.shape[:2], *pool_out_hw(n, x.shape[2:4], n.attrs), *x.shape[4:]), x.dtype)
    return _pool_infer(n)


def _blocked_pool_infer(n):
    """NCHW, or the CPU's blocked N C' H W c (compiler.graph.passes.nchwc_layout)."""
    x = n.inputs[0].type
    if x.rank == 5:
        return _t((*x.shape[:2], *pool_out_hw(n, x.shape[2:4], n.attrs), x.shape[4]), x.dtype)
    return _pool_infer(n)


def _on_planes(impl, a, x):
    """impl (NCHW) on a blocked N C' H W c input: the lanes as channels, then blocked again."""
    y = impl(a, _unblock_nchwc(x))
    n_, c, h, w = y.shape
    return np.ascontiguousarray(y.reshape(n_, c // x.shape[4], x.shape[4], h, w).transpose(0, 1, 3, 4, 2))


@register("max_pool2d", Pattern.OUT_ELEMWISE_FUSABLE, 1, POOL_ATTRS, doc="2-D max pooling (exact on int8)")
def _max_pool():
    def impl(a, x):
        if x.ndim == 5:
            return _on_planes(impl, a, x)
        if x.ndim == 6:   # packed: the blocks' lanes as channels
            p = x.transpose(0, 1, 4, 5, 2, 3)
            y = impl(a, p.reshape(p.shape[0] * p.shape[1], -1, *p.shape[4:]))
            return y.reshape(*p.shape[:4], *y.shape[2:]).transpose(0, 1, 4, 5, 2, 3)
        fill = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        win, _ = _pool_windows(x, a, fill, pool_out_hw(None, x.shape[2:], a))
        return win.max(axis=(-2, -1)).astype(x.dtype)
    return _max_pool_infer, impl


@register("avg_pool2d", Pattern.OUT_ELEMWISE_FUSABLE, 1, {**POOL_ATTRS, "count_include_pad": one_of(0, 0, 1)},
          doc="2-D average pooling")
def _avg_pool():
    def impl(a, x):
        if x.ndim == 5:
            return _on_planes(impl, a, x)
        out_hw = pool_out_hw(None, x.shape[2:], a)
        win, (eb, er) = _pool_windows(x.astype(np.float64), a, 0.0, out_hw)
        ones = np.ones((1, 1) + x.shape[2:])
        pt, pl, pb, pr = a["pads"]
        if a["count_include_pad"]:
            ones = np.pad(ones, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=1.0)
            cnt, _ = _pool_windows(ones, {**a, "pads": (0, 0, 0, 0)}, 0.0, out_hw)
        else:
            cnt, _ = _pool_windows(ones, a, 0.0, out_hw)
        return (win.sum(axis=(-2, -1)) / cnt.sum(axis=(-2, -1))).astype(x.dtype)
    return _blocked_pool_infer, impl


def _global_pool_infer(n):
    x = n.inputs[0].type
    if x.rank < 3:
        fail(n, f"expects N C spatial..., got {x}")
    return _t(x.shape[:2] + (1,) * (x.rank - 2), _float_input(n))


@register("global_avg_pool", Pattern.OUT_ELEMWISE_FUSABLE, 1, doc="mean over H, W keeping dims")
def _gap():
    return _global_pool_infer, lambda a, x: x.mean(axis=tuple(range(2, x.ndim)), keepdims=True,
                                                  dtype=np.float64).astype(x.dtype)


@register("global_max_pool", Pattern.OUT_ELEMWISE_FUSABLE, 1, doc="max over H, W keeping dims")
def _gmp():
    return _global_pool_infer, lambda a, x: x.max(axis=tuple(range(2, x.ndim)), keepdims=True)


def _norm_axes(n, axes, rank):
    out = []
    for ax in axes:
        if not -rank <= ax < rank:
            fail(n, f"axis {ax} out of range for rank {rank}")
        out.append(ax % rank)
    return tuple(sorted(set(out)))


def _reduction(name: str, f, doc: str):
    def factory():
        def infer(n):
            x = n.inputs[0].type
            axes = tuple(range(x.rank)) if n.attrs["axes"] is None else _norm_axes(n, n.attrs["axes"], x.rank)
            shape = [1 if k in axes else d for k, d in enumerate(x.shape)] if n.attrs["keepdims"] else \
                [d for k, d in enumerate(x.shape) if k not in axes]
            return _t(shape, _float_input(n))

        def impl(a, x):
            axes = None if a["axes"] is None else tuple(ax % x.ndim for ax in a["axes"])
            return np.asarray(f(x, axes, bool(a["keepdims"]))).astype(x.dtype)
        return infer, impl
    register(name, Pattern.COMM_REDUCE, 1, {"axes": None, "keepdims": one_of(1, 0, 1)}, doc)(factory)


_reduction("reduce_mean", lambda x, ax, kd: x.mean(axis=ax, keepdims=kd, dtype=np.float64), "mean over axes (None: all)")
_reduction("reduce_sum", lambda x, ax, kd: x.sum(axis=ax, keepdims=kd, dtype=np.float64), "sum over axes (None: all)")
_reduction("reduce_max", lambda x, ax, kd: x.max(axis=ax, keepdims=kd), "max over axes (None: all)")
_reduction("reduce_min", lambda x, ax, kd: x.min(axis=ax, keepdims=kd), "min over axes (None: all)")
_reduction("reduce_prod", lambda x, ax, kd: x.prod(axis=ax, keepdims=kd, dtype=np.float64),
           "product over axes (None: all)")


def _arg_reduction(name: str, f):
    def factory():
        def infer(n):
            x = n.inputs[0].type
            if x.dtype == "bool":
                fail(n, "input must be numeric, got bool")
            if x.rank == 0:
                fail(n, "input must have at least one axis")
            ax = _norm_axes(n, [n.attrs["axis"]], x.rank)[0]
            shape = [1 if k == ax else d for k, d in enumerate(x.shape)] if n.attrs["keepdims"] else \
                [d for k, d in enumerate(x.shape) if k != ax]
            return _t(shape, "int64")

        def impl(a, x):
            ax = a["axis"] % x.ndim
            if a["select_last_index"]:   # the first of the reversed axis, counted from the end
                idx = x.shape[ax] - 1 - f(np.flip(x, ax), axis=ax)
            else:
                idx = f(x, axis=ax)
            idx = np.asarray(idx, np.int64)
            return np.expand_dims(idx, ax) if a["keepdims"] else idx
        return infer, impl
    register(name, Pattern.OPAQUE, 1, {"axis": 0, "keepdims": one_of(1, 0, 1), "select_last_index": one_of(0, 0, 1)},
             f"the index (int64) of the {name[3:]} along one axis, the first or last of ties (ONNX Arg{name[3:].title()})"
             )(factory)


_arg_reduction("argmax", np.argmax)
_arg_reduction("argmin", np.argmin)


@register("topk", Pattern.OPAQUE, 1, {"k": int_in(REQUIRED, 1), "axis": -1, "largest": one_of(1, 0, 1),
                                      "output": one_of("values", "values", "indices")},
          doc="the k largest (or smallest) along one axis, sorted, ties to the lower index: their values or "
              "int64 indices (ONNX TopK's two outputs)")
def _topk():
    def infer(n):
        x = n.inputs[0].type
        if x.dtype == "bool" or x.rank == 0:
            fail(n, f"input must be a numeric tensor with an axis, got {x}")
        ax = _norm_axes(n, [n.attrs["axis"]], x.rank)[0]
        if n.attrs["k"] > x.shape[ax]:
            fail(n, f"k={n.attrs['k']} exceeds axis {ax}'s size {x.shape[ax]}")
        shape = x.shape[:ax] + (n.attrs["k"],) + x.shape[ax + 1:]
        return _t(shape, "int64" if n.attrs["output"] == "indices" else x.dtype)

    def impl(a, x):
        ax = a["axis"] % x.ndim
        key = x.astype(np.float64)
        order = np.argsort(-key if a["largest"] else key, axis=ax, kind="stable")   # stable: lower index first
        idx = np.take(order, np.arange(a["k"]), axis=ax)
        return idx.astype(np.int64) if a["output"] == "indices" else np.take_along_axis(x, idx, axis=ax)
    return infer, impl


@register("softmax", Pattern.OPAQUE, 1, {"axis": -1}, doc="softmax along one axis")
def _softmax():
    def infer(n):
        _norm_axes(n, [n.attrs["axis"]], n.inputs[0].type.rank)
        return _t(n.inputs[0].shape, _float_input(n))

    def impl(a, x):
        z = x.astype(np.float64)
        e = np.exp(z - z.max(axis=a["axis"], keepdims=True))
        return (e / e.sum(axis=a["axis"], keepdims=True)).astype(x.dtype)
    return infer, impl


@register("layer_norm", Pattern.OPAQUE, (2, 3), {"axis": -1, "epsilon": 1e-5},
          doc="normalize over axes [axis, rank), then * scale + bias")
def _layer_norm():
    def infer(n):
        _norm_axes(n, [n.attrs["axis"]], n.inputs[0].type.rank)
        return _t(n.inputs[0].shape, _float_input(n))

    def impl(a, x, s, b=None):
        axes = tuple(range(a["axis"] % x.ndim, x.ndim))
        z = x.astype(np.float64)
        m = z.mean(axis=axes, keepdims=True)
        v = ((z - m) ** 2).mean(axis=axes, keepdims=True)
        y = (z - m) / np.sqrt(v + a["epsilon"]) * s
        return (y if b is None else y + b).astype(x.dtype)
    return infer, impl


def lrn_window(size: int) -> tuple[int, int]:
    """Channels (before, after) a channel in ONNX LRN's window: floor and ceil of (size-1)/2."""
    return (size - 1) // 2, size - 1 - (size - 1) // 2


@register("lrn", Pattern.OPAQUE, 1, {"size": int_in(REQUIRED, 1), "alpha": 1e-4, "beta": 0.75, "bias": 1.0},
          doc="local response normalization across channels (axis 1), ONNX LRN")
def _lrn():
    def infer(n):
        if n.inputs[0].type.rank < 3:
            fail(n, f"expects N C spatial..., got {n.inputs[0].type}")
        if not isinstance(n.attrs["size"], int) or n.attrs["size"] < 1:
            fail(n, f"size must be a positive integer, got {n.attrs['size']!r}")
        return _t(n.inputs[0].shape, _float_input(n))

    def impl(a, x):
        before, after = lrn_window(a["size"])
        sq = np.square(x.astype(np.float64))
        pad = [(0, 0)] * x.ndim
        pad[1] = (before, after)
        c = np.cumsum(np.pad(sq, pad), axis=1)
        c = np.concatenate([np.zeros_like(c[:, :1]), c], axis=1)
        win = c[:, a["size"]:] - c[:, :-a["size"]]          # sum over each channel's window
        return (x / (a["bias"] + a["alpha"] / a["size"] * win) ** a["beta"]).astype(x.dtype)
    return infer, impl


# ---- injective ---------------------------------------------------------------------------------
@register("reshape", Pattern.INJECTIVE, 1, {"shape": REQUIRED}, doc="reshape to a static shape")
def _reshape():
    def infer(n):
        x = n.inputs[0].type
        shape = tuple(n.attrs["shape"])
        if int(np.prod(shape, dtype=np.int64)) != x.size:
            fail(n, f"cannot reshape {x} to {list(shape)}")
        return _t(shape, x.dtype)
    return infer, lambda a, x: x.reshape(a["shape"])


@register("transpose", Pattern.INJECTIVE, 1, {"perm": REQUIRED}, doc="permute axes")
def _transpose():
    def infer(n):
        x = n.inputs[0].type
        if sorted(n.attrs["perm"]) != list(range(x.rank)):
            fail(n, f"perm {list(n.attrs['perm'])} is not a permutation of {x.rank} axes")
        return _t([x.shape[p] for p in n.attrs["perm"]], x.dtype)
    return infer, lambda a, x: np.transpose(x, a["perm"]).copy()   # C order; a scalar stays 0-d


@register("concat", Pattern.INJECTIVE, (1, 1 << 16), {"axis": REQUIRED}, doc="concatenate along one axis")
def _concat():
    def infer(n):
        dt = _same_dtype(n)
        r = n.inputs[0].type.rank
        ax = _norm_axes(n, [n.attrs["axis"]], r)[0]
        shapes = [list(i.shape) for i in n.inputs]
        for s in shapes:
            if len(s) != r or any(s[k] != shapes[0][k] for k in range(r) if k != ax):
                fail(n, f"shapes {shapes} differ outside axis {ax}")
        out = list(shapes[0])
        out[ax] = sum(s[ax] for s in shapes)
        return _t(out, dt)
    return infer, lambda a, *xs: np.concatenate(xs, axis=a["axis"])


def _slice_index(starts, ends, axes, steps, shape):
    idx = [slice(None)] * len(shape)
    for s, e, ax, st in zip(starts, ends, axes, steps):
        idx[ax] = slice(s, None if e < 0 else e, st)  # ends are normalized: -1 means "past index 0"
    return tuple(idx)


@register("slice", Pattern.INJECTIVE, 1, {"starts": REQUIRED, "ends": REQUIRED, "axes": REQUIRED, "steps": REQUIRED},
          doc="strided slice; starts/ends normalized to [0, dim] (ends may be -1 for negative steps)")
def _slice():
    def infer(n):
        x = n.inputs[0].type
        a = n.attrs
        shape = list(x.shape)
        for s, e, ax, st in zip(a["starts"], a["ends"], a["axes"], a["steps"]):
            if not 0 <= ax < x.rank or st == 0:
                fail(n, f"bad axis {ax} or step {st}")
            shape[ax] = len(range(s, e, st))
        return _t(shape, x.dtype)
    return infer, lambda a, x: np.ascontiguousarray(x[_slice_index(a["starts"], a["ends"], a["axes"], a["steps"], x.shape)])


@register("pad", Pattern.INJECTIVE, 1, {"pads": REQUIRED, "mode": one_of("constant", "constant", "reflect", "edge"), "value": 0.0},
          doc="pads = (begin_0..begin_r-1, end_0..end_r-1) as ONNX; modes constant, reflect, edge")
def _pad():
    def infer(n):
        x = n.inputs[0].type
        p = n.attrs["pads"]
        if len(p) != 2 * x.rank or min(p) < 0:
            fail(n, f"pads {list(p)} must be 2 x rank {x.rank} non-negative values")
        return _t([d + p[k] + p[k + x.rank] for k, d in enumerate(x.shape)], x.dtype)

    def impl(a, x):
        r = x.ndim
        widths = [(a["pads"][k], a["pads"][k + r]) for k in range(r)]
        if a["mode"] == "constant":
            return np.pad(x, widths, constant_values=np.asarray(a["value"]).astype(x.dtype))
        return np.pad(x, widths, mode=a["mode"])
    return infer, impl


# ---- ONNX QDQ (affine, as in the model file) ---------------------------------------------------
def _qparam_shape(x_ndim, axis, scale):
    if scale.ndim == 0 or scale.size == 1:
        return scale.reshape(())
    sh = [1] * x_ndim
    sh[axis % x_ndim] = -1
    return scale.reshape(sh)


@register("quantize_linear", Pattern.ELEMWISE, (2, 3), {"axis": 1, "dtype": "uint8"},
          doc="ONNX QuantizeLinear: saturate(round_half_even(x / scale) + zero_point)")
def _quantize_linear():
    def infer(n):
        dt = n.inputs[2].dtype if len(n.inputs) == 3 else n.attrs["dtype"]
        return _t(n.inputs[0].shape, dt)

    def impl(a, x, s, zp=None):
        dt = np.dtype(a["dtype"] if zp is None else zp.dtype)
        zp = np.zeros((), dt) if zp is None else zp
        q = np.rint(x.astype(np.float64) / _qparam_shape(x.ndim, a["axis"], s)) + _qparam_shape(x.ndim, a["axis"], zp)
        info = np.iinfo(dt)
        return np.clip(q, info.min, info.max).astype(dt)
    return infer, impl


@register("dequantize_linear", Pattern.ELEMWISE, (2, 3), {"axis": 1},
          doc="ONNX DequantizeLinear: (x - zero_point) * scale")
def _dequantize_linear():
    def infer(n):
        return _t(n.inputs[0].shape, n.inputs[1].dtype)

    def impl(a, x, s, zp=None):
        z = 0 if zp is None else _qparam_shape(x.ndim, a["axis"], zp).astype(np.float64)
        return ((x.astype(np.float64) - z) * _qparam_shape(x.ndim, a["axis"], s)).astype(s.dtype)
    return infer, impl


# ---- shift-quantized int8 (what the accelerator computes) --------------------------------------
def shift_right_round(acc: np.ndarray, s: int) -> np.ndarray:
    """acc * 2^-s rounded half up, as ADD 2^(s-1) then SHR s (SHR by a negative s shifts left)."""
    acc = acc.astype(np.int64)
    if s > 0:
        return (acc + (1 << (s - 1))) >> s
    return acc << (-s)


def shift_floor(acc: np.ndarray, s: int) -> np.ndarray:
    """acc * 2^-s rounded down: one SHR by s (a negative s shifts left)."""
    acc = acc.astype(np.int64)
    return acc >> s if s >= 0 else acc << (-s)


def int8_min(zero_point: int = 0) -> int:
    """The lowest int8 value of a tensor: -127 in the symmetric flow; a tensor with a zero point (a
    QDQ model's asymmetric activations) uses the whole [-128, 127], as ONNX QuantizeLinear does."""
    return -128 if zero_point else INT8_MIN


def clip_int8(v: np.ndarray, zero_point: int = 0) -> np.ndarray:
    """Saturate to int8: [int8_min(zero_point), 127]."""
    return np.clip(v, int8_min(zero_point), INT8_MAX).astype(np.int8)


def wrap_int32(v: np.ndarray) -> np.ndarray:
    return v.astype(np.int64).astype(np.int32).astype(np.int64)


#: Fixed-point requantization, for scales that are not powers of two (a QDQ model's): the value
#: times a multiplier M of FIXED_MUL_BITS bits, rounded half up and shifted right by k - the ALU's
#: SCALE op on the accelerator (its operand holds M and k), exact int64 arithmetic on the CPU.
FIXED_MUL_BITS = 24


def fixed_multiplier(real: float, what: str) -> tuple[int, int]:
    """(M, k) with M * 2^-k ~ real, M in [2^23, 2^24) (as fine as 24 bits allow), 0 <= k <= 63.
    `what` names the layer in errors."""
    if not (real > 0 and math.isfinite(real)):
        raise ValueError(f"{what}: requantization scale {real} must be positive and finite")
    k = FIXED_MUL_BITS - 1 - math.floor(math.log2(real))
    if round(real * 2.0 ** k) >= 1 << FIXED_MUL_BITS:
        k -= 1
    k = min(k, 63)
    mul = round(real * 2.0 ** k)
    if k < 0 or mul < 2:
        raise ValueError(f"{what}: requantization scale {real:.6g} is outside what a {FIXED_MUL_BITS}-bit "
                         f"multiplier and a shift of 0..63 can express")
    return mul, k


@register("quantize", Pattern.ELEMWISE, 1, {"shift": 0, "scale": 0.0, "zero_point": _zero_point()},
          doc="float -> int8: clip(round_half_even(x * 2^shift), -127, 127); with a scale "
              "(non-zero) clip(round_half_even(x / scale) + zero_point) in float32 as ONNX "
              "QuantizeLinear (to [-128, 127] when zero_point is not 0)")
def _quantize():
    def impl(a, x):
        z = a["zero_point"]
        if a["scale"]:
            return clip_int8(np.rint(x.astype(np.float32) / np.float32(a["scale"])) + z, z)
        return clip_int8(np.rint(x.astype(np.float64) * 2.0 ** a["shift"]) + z, z)

    def infer(n):
        return _t(n.inputs[0].shape, "int8")
    return infer, impl


@register("dequantize", Pattern.ELEMWISE, 1, {"shift": 0, "scale": 0.0, "zero_point": _zero_point()},
          doc="int8 -> float32: (q - zero_point) * 2^-shift, or (q - zero_point) * scale when a scale "
              "(non-zero) is given")
def _dequantize():
    def impl(a, x):
        q = x.astype(np.int32) - a["zero_point"]
        if a["scale"]:
            return q.astype(np.float32) * np.float32(a["scale"])
        return (q.astype(np.float64) * 2.0 ** -a["shift"]).astype(np.float32)

    def infer(n):
        return _t(n.inputs[0].shape, "float32")
    return infer, impl


@register("requantize", Pattern.ELEMWISE, 1, {"in_shift": REQUIRED, "out_shift": REQUIRED, "mul": 1},
          doc="int8 at 2^-in_shift -> int8 at 2^-out_shift (round, SHR, CLIP); with mul, "
              "round_half_up(x * mul * 2^-(in_shift - out_shift))")
def _requantize():
    return (lambda n: _t(n.inputs[0].shape, "int8"),
            lambda a, x: clip_int8(shift_right_round(x.astype(np.int64) * a["mul"], a["in_shift"] - a["out_shift"])))


QCONV_ATTRS = {**CONV_ATTRS, "in_shift": REQUIRED, "w_shift": REQUIRED, "out_shift": REQUIRED,
               "layout": one_of("NCHW", "NCHW", "NCHWnc"), "mul": 1, "out_zp": _zero_point()}


def requant_shift(a) -> int:
    return a["in_shift"] + a["w_shift"] - a["out_shift"]


def is_fixed_point(a) -> bool:
    """True when a qconv2d/qdense requantizes with a fixed-point multiplier (mul != 1): then
    y = clip(round_half_up(acc * mul * 2^-in_shift)) with w_shift = out_shift = 0 and no rounding
    half in the bias; else y = clip(acc >> (in_shift + w_shift - out_shift)), the half in the bias."""
    return a.get("mul", 1) != 1


def requant_acc(acc: np.ndarray, a, muls: np.ndarray | None = None) -> np.ndarray:
    """The int8 result of a qconv2d/qdense accumulator (bias included, channels on axis 1) under
    attrs a; muls: per-output-channel multipliers (the optional fourth input), a shared shift."""
    z = a.get("out_zp", 0)   # the output's zero point (a QDQ model's asymmetric activation)
    if muls is not None:
        m = muls.astype(np.int64).reshape((1, -1) + (1,) * (acc.ndim - 2))
        return clip_int8(shift_right_round(acc.astype(np.int64) * m, requant_shift(a)) + z, z)
    if is_fixed_point(a):
        return clip_int8(shift_right_round(acc.astype(np.int64) * a["mul"], requant_shift(a)) + z, z)
    return clip_int8(shift_floor(acc, requant_shift(a)) + z, z)  # the rounding half is in b


#: per-channel multipliers (a fourth qconv2d/qdense input, M_c * 2^-in_shift ~ the channel's scale)
#: stay below this, so acc * M_c is exact in int64
PER_CHANNEL_MUL_LIMIT = 1 << 31


def _check_qint(n):
    x, w, b = (i.dtype for i in n.inputs[:3])
    if (x, w, b) != ("int8", "int8", "int32"):
        fail(n, f"expects int8 input, int8 weight, int32 bias; got {x}, {w}, {b}")
    if len(n.inputs) == 4:
        m = n.inputs[3]
        if m.dtype != "int64" or m.type.rank != 1:
            fail(n, f"per-channel multipliers must be an int64 vector, got {m.type}")
        if m.is_const and (np.any(m.value <= 0) or np.any(m.value >= PER_CHANNEL_MUL_LIMIT)):
            fail(n, f"per-channel multipliers must lie in [1, 2^31), got [{m.value.min()}, {m.value.max()}]")
        if is_fixed_point(n.attrs) or n.attrs["w_shift"] or n.attrs["out_shift"]:
            fail(n, "per-channel multipliers take the shift from in_shift alone (mul = 1, w_shift = out_shift = 0)")


@register("qconv2d", Pattern.OUT_ELEMWISE_FUSABLE, (3, 4), QCONV_ATTRS,
          doc="int8 conv: acc = conv(x, w) + b in int32 (b holds the rounding half), "
              "then SHR (in_shift + w_shift - out_shift), CLIP to [-127, 127]; fixed point with mul; "
              "with out_zp (an asymmetric output), + out_zp and CLIP to [-128, 127]; "
              "per output channel with a fourth input of multipliers (round_half_up(acc m_c 2^-in_shift))")
def _qconv2d():
    def infer(n):
        _check_qint(n)
        packed = n.attrs["layout"] == "NCHWnc"
        return _t(_conv_infer_common(n, n.inputs[0].type, n.inputs[1].type, packed), "int8")

    def impl(a, x, w, b, muls=None):
        packed = a["layout"] == "NCHWnc"
        if packed:
            bn, bo = x.shape[4], w.shape[4]
            x, w = unpack_ref(x, None), unpack_ref(w, None)
        acc = np.rint(conv2d_ref(x, w, a["strides"], a["pads"], a["dilations"], a["groups"])).astype(np.int64)
        acc = wrap_int32(acc + b.astype(np.int64).reshape(1, -1, 1, 1))
        y = requant_acc(acc, a, muls)
        return pack_ref(y, (bn, bo)) if packed else y
    return infer, impl


@register("qdense", Pattern.OUT_ELEMWISE_FUSABLE, (3, 4),
          {"in_shift": REQUIRED, "w_shift": REQUIRED, "out_shift": REQUIRED, "layout": one_of("NC", "NC", "NCnc"), "mul": 1,
           "out_zp": _zero_point()},
          doc="int8 dense: acc = x @ w.T + b in int32, then SHR, CLIP (+ out_zp, to [-128, 127], when non-zero)")
def _qdense():
    def infer(n):
        _check_qint(n)
        x, w = n.inputs[0].type, n.inputs[1].type
        if n.attrs["layout"] == "NCnc":
            if x.rank != 4 or w.rank != 4 or x.shape[1] * x.shape[3] != w.shape[1] * w.shape[3]:
                fail(n, f"packed dense expects x (N', K', bn, bi), w (O', K', bo, bi), got {x} and {w}")
            return _t((x.shape[0], w.shape[0], x.shape[2], w.shape[2]), "int8")
        if x.rank != 2 or w.rank != 2 or x.shape[1] != w.shape[1]:
            fail(n, f"expects x (N, K) and w (O, K), got {x} and {w}")
        return _t((x.shape[0], w.shape[0]), "int8")

    def impl(a, x, w, b, muls=None):
        packed = a["layout"] == "NCnc"
        if packed:
            bn, bo = x.shape[2], w.shape[2]
            x, w = unpack_ref(x, None), unpack_ref(w, None)
        acc = np.rint(x.astype(np.float64) @ w.astype(np.float64).T).astype(np.int64)
        acc = wrap_int32(acc + b.astype(np.int64))
        y = requant_acc(acc, a, muls)
        return pack_ref(y, (bn, bo)) if packed else y
    return infer, impl


@register("qadd", Pattern.BROADCAST, 2,
          {"a_shift": REQUIRED, "b_shift": REQUIRED, "out_shift": REQUIRED, "a_mul": 0, "b_mul": 0},
          doc="int8 + int8: align both to the finer scale by left shifts, ADD, round, SHR, CLIP; with "
              "multipliers (a_mul, b_mul non-zero): round_half_up((a a_mul + b b_mul) 2^-out_shift), CLIP")
def _qadd():
    def infer(n):
        if [i.dtype for i in n.inputs] != ["int8", "int8"]:
            fail(n, f"expects two int8 inputs, got {[i.dtype for i in n.inputs]}")
        try:
            return _t(np.broadcast_shapes(*(i.shape for i in n.inputs)), "int8")
        except ValueError:
            fail(n, f"shapes {[list(i.shape) for i in n.inputs]} do not broadcast")

    def impl(a, x, y):
        if a["a_mul"]:
            s = x.astype(np.int64) * a["a_mul"] + y.astype(np.int64) * a["b_mul"]
            return clip_int8(shift_right_round(s, a["out_shift"]))
        m = max(a["a_shift"], a["b_shift"])
        s = (x.astype(np.int64) << (m - a["a_shift"])) + (y.astype(np.int64) << (m - a["b_shift"]))
        return clip_int8(shift_right_round(wrap_int32(s), m - a["out_shift"]))
    return infer, impl


# ---- layout ------------------------------------------------------------------------------------
def packed_shape(shape, block):
    """(N, C, *rest) -> (ceil(N/b0), ceil(C/b1), *rest, b0, b1)."""
    b0, b1 = block
    return (-(-shape[0] // b0), -(-shape[1] // b1), *shape[2:], b0, b1)


def pack_ref(x, block):
    """N C ... -> N' C' ... b0 b1 with zero padding (the runtime's own packing, contiguous)."""
    return np.ascontiguousarray(pack_blocked(x, block))


def unpack_ref(x, shape):
    """Inverse of pack_ref; shape=None keeps the padding."""
    return np.ascontiguousarray(unpack_blocked(x, shape))


# pack and unpack are OPAQUE: a transposition runs best as its own kernel (elementwise math fused
# into the transposing loop ran slower than the two kernels apart: its stores or loads go one byte
# per lane), and it keeps the math beside it fused into one flat kernel.
@register("pack", Pattern.OPAQUE, 1, {"block": REQUIRED},
          doc="N C ... -> N' C' ... b0 b1 with zero padding to whole blocks (activations NCHWnc, weights OIHWoi)")
def _pack():
    def infer(n):
        x = n.inputs[0].type
        if x.rank < 2:
            fail(n, f"needs at least 2 dims, got {x}")
        return _t(packed_shape(x.shape, n.attrs["block"]), x.dtype)
    return infer, lambda a, x: pack_ref(x, a["block"])


@register("unpack", Pattern.OPAQUE, 1, {"shape": REQUIRED}, doc="inverse of pack, cropping to `shape`")
def _unpack():
    def infer(n):
        x = n.inputs[0].type
        shape = tuple(n.attrs["shape"])
        if x.rank != len(shape) + 2 or packed_shape(shape, x.shape[-2:]) != x.shape:
            fail(n, f"{x} is not a packing of shape {list(shape)}")
        return _t(shape, x.dtype)
    return infer, lambda a, x: unpack_ref(x, a["shape"])


def _blocked_layout(v) -> int:
    """'NCHW' -> 0, 'NCHW<n>c' -> n (n >= 1); anything else raises."""
    if v == "NCHW":
        return 0
    if not (v.startswith("NCHW") and v.endswith("c") and v[4:-1].isdigit() and int(v[4:-1]) >= 1):
        raise ValueError(v)
    return int(v[4:-1])


_LAYOUT = dict(allowed="'NCHW' or 'NCHW<n>c' (n >= 1)", test=lambda v: _blocked_layout(v) >= 0)


@register("layout_transform", Pattern.INJECTIVE, 1,
          {"src_layout": Attr(REQUIRED, **_LAYOUT), "dst_layout": Attr(REQUIRED, **_LAYOUT)},
          doc="NCHW <-> NCHW<n>c: channels split into blocks of n, the lane last (the CPU's blocked layout)")
def _layout_transform():
    def infer(n):
        x, a = n.inputs[0].type, n.attrs
        src, dst = _blocked_layout(a["src_layout"]), _blocked_layout(a["dst_layout"])
        if (src == 0) == (dst == 0):
            fail(n, f"{a['src_layout']} -> {a['dst_layout']}: one side must be NCHW, the other NCHW<n>c")
        if src == 0:
            if x.rank != 4 or x.shape[1] % dst:
                fail(n, f"input {x} is not NCHW with channels divisible by {dst}")
            return _t((x.shape[0], x.shape[1] // dst, *x.shape[2:], dst), x.dtype)
        if x.rank != 5 or x.shape[4] != src:
            fail(n, f"input {x} is not {a['src_layout']}")
        return _t((x.shape[0], x.shape[1] * src, *x.shape[2:4]), x.dtype)

    def impl(a, x):
        dst = _blocked_layout(a["dst_layout"])
        if dst:
            n, c, h, w = x.shape
            return np.ascontiguousarray(x.reshape(n, c // dst, dst, h, w).transpose(0, 1, 3, 4, 2))
        return _unblock_nchwc(x)
    return infer, impl


def _unblock_nchwc(x):
    """(N, C', H, W, c) -> (N, C' c, H, W)."""
    n, cb, h, w, c = x.shape
    return np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3).reshape(n, cb * c, h, w))


@register("conv2d_NCHWc", Pattern.OUT_ELEMWISE_FUSABLE, 2,
          {k: CONV_ATTRS[k] for k in ("strides", "pads", "dilations", "groups")},
          doc="blocked conv2d: (N, C/ic, H, W, ic) x (O/oc, C/groups/ic, KH, KW, ic, oc) -> (N, O/oc, OH, OW, oc), "
              "whole blocks in each group; int8 accumulates into int32")
def _conv2d_nchwc():
    def infer(n):
        x, w, a = n.inputs[0].type, n.inputs[1].type, n.attrs
        g = a["groups"]
        if x.rank != 5 or w.rank != 6 or x.shape[1] != w.shape[1] * g or x.shape[4] != w.shape[4] or w.shape[0] % g:
            fail(n, f"expects data (N, C', H, W, ic) and kernel (O', C'/groups, KH, KW, ic, oc) with matching ic, "
                    f"groups={g} dividing C' and O'; got {x} and {w}")
        if x.dtype != w.dtype:
            fail(n, f"data {x.dtype} and kernel {w.dtype} differ")
        ho, wo = conv_out_hw(n, x.shape[2:4], w.shape[2:4], a["strides"], a["pads"], a["dilations"])
        return _t((x.shape[0], w.shape[0], ho, wo, w.shape[5]), "int32" if x.dtype in ("int8", "uint8") else x.dtype)

    def impl(a, x, w):
        ob, cb, kh, kw, ic, oc = w.shape
        w4 = w.transpose(0, 5, 1, 4, 2, 3).reshape(ob * oc, cb * ic, kh, kw)
        y = conv2d_ref(_unblock_nchwc(x), w4, a["strides"], a["pads"], a["dilations"], a.get("groups", 1))
        dt = np.int32 if x.dtype in (np.int8, np.uint8) else x.dtype
        n_, _, ho, wo = y.shape
        y = np.rint(y) if dt == np.int32 else y
        return np.ascontiguousarray(y.reshape(n_, ob, oc, ho, wo).transpose(0, 1, 3, 4, 2)).astype(dt)
    return infer, impl


@register("depthwise_conv2d_NCHWc", Pattern.OUT_ELEMWISE_FUSABLE, 2,
          {k: CONV_ATTRS[k] for k in ("strides", "pads", "dilations")},
          doc="blocked depthwise conv2d: (N, C/c, H, W, c) x (C/c, KH, KW, c) -> (N, C/c, OH, OW, c)")
def _depthwise_conv2d_nchwc():
    def infer(n):
        x, w, a = n.inputs[0].type, n.inputs[1].type, n.attrs
        if x.rank != 5 or w.rank != 4 or x.shape[1] != w.shape[0] or x.shape[4] != w.shape[3]:
            fail(n, f"expects data (N, C', H, W, c) and kernel (C', KH, KW, c) with matching C', c; got {x} and {w}")
        if x.dtype != w.dtype or x.dtype in ("int8", "uint8"):
            fail(n, f"data {x.dtype} and kernel {w.dtype}: one float dtype expected")
        ho, wo = conv_out_hw(n, x.shape[2:4], w.shape[1:3], a["strides"], a["pads"], a["dilations"])
        return _t((x.shape[0], x.shape[1], ho, wo, x.shape[4]), x.dtype)

    def impl(a, x, w):
        cb, kh, kw, c = w.shape
        w4 = w.transpose(0, 3, 1, 2).reshape(cb * c, 1, kh, kw)
        y = conv2d_ref(_unblock_nchwc(x), w4, a["strides"], a["pads"], a["dilations"], cb * c)
        n_, _, ho, wo = y.shape
        return np.ascontiguousarray(y.reshape(n_, cb, c, ho, wo).transpose(0, 1, 3, 4, 2)).astype(x.dtype)
    return infer, impl


# ---- fused groups ------------------------------------------------------------------------------
@register("fused", Pattern.OPAQUE, (0, 1 << 16), {"body": REQUIRED, "pattern": REQUIRED},
          doc="a fused group: its body graph's inputs are this node's inputs")
def _fused():
    def infer(n):
        body = n.attrs["body"]
        if len(body.inputs) != len(n.inputs) or len(body.outputs) != 1:
            fail(n, f"body has {len(body.inputs)} inputs / {len(body.outputs)} outputs for {len(n.inputs)} inputs")
        for bi, i in zip(body.inputs, n.inputs):
            if bi.type != i.type:
                fail(n, f"body input '{bi.name}' is {bi.type}, given {i.type}")
        return body.outputs[0].type

    def impl(a, *xs):
        body = a["body"]
        env = {id(p): x for p, x in zip(body.inputs, xs)}
        for n in body.nodes:       # in order; compiler.graph.interpret runs whole graphs the same way
            if id(n) not in env:
                env[id(n)] = np.asarray(get_op(n.op).impl(n.attrs, *(env[id(i)] for i in n.inputs)))
        return env[id(body.outputs[0])]
    return infer, impl


def _in_range(op: str, idx: np.ndarray, n: int, where: str) -> np.ndarray:
    """Run-time indices into an axis of n, negative ones counted from the end, as int64; one out of
    [-n, n) is an IndexError naming it (the NumPy step never reads outside the tensor)."""
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        raise IndexError(f"{op}: index {int(idx[bad].flat[0])} out of range [-{n}, {n - 1}] for {where}")
    return np.where(idx < 0, idx + n, idx).astype(np.int64)


#: ONNX's scatter reductions (reduction="none" writes)
_SCATTER_REDUCTIONS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
_SCATTER_REDUCTION = one_of("none", "none", *_SCATTER_REDUCTIONS)


def _scatter(x: np.ndarray, where: tuple, upd: np.ndarray, reduction: str) -> np.ndarray:
    """A copy of x with upd written at the index arrays `where`, or combined there by the
    reduction (repeated indices each combine; with "none" ONNX leaves them undefined)."""
    out = x.copy()
    if reduction == "none":
        out[where] = upd
    else:
        _SCATTER_REDUCTIONS[reduction].at(out, where, upd)
    return out


@register("gather", Pattern.OPAQUE, 2, {"axis": 0},
          doc="gather along one axis at indices computed at run time (ONNX Gather: an embedding lookup)")
def _gather():
    def infer(n):
        x, idx = n.inputs[0].type, n.inputs[1].type
        if idx.dtype not in ("int32", "int64"):
            fail(n, f"indices must be int32 or int64, got {idx.dtype}")
        ax = _norm_axes(n, [n.attrs["axis"]], x.rank)[0]
        return _t(x.shape[:ax] + idx.shape + x.shape[ax + 1:], x.dtype)

    def impl(a, x, idx):
        ax = a["axis"] % x.ndim
        return np.take(x, _in_range("gather", idx, x.shape[ax], f"axis {ax}"), axis=ax)
    return infer, impl


@register("gather_elements", Pattern.OPAQUE, 2, {"axis": 0},
          doc="out[i][j][k] = x[idx[i][j][k]][j][k] along one axis (ONNX GatherElements); a NumPy step")
def _gather_elements():
    def infer(n):
        x, idx = n.inputs[0].type, n.inputs[1].type
        if idx.dtype not in ("int32", "int64") or idx.rank != x.rank:
            fail(n, f"indices must be int32/int64 of the data's rank {x.rank}, got {idx}")
        ax = _norm_axes(n, [n.attrs["axis"]], x.rank)[0]
        if any(i > d for k, (i, d) in enumerate(zip(idx.shape, x.shape)) if k != ax):
            fail(n, f"indices {list(idx.shape)} exceed the data {list(x.shape)} outside axis {ax}")
        return _t(idx.shape, x.dtype)

    def impl(a, x, idx):
        ax = a["axis"] % x.ndim
        sub = x[tuple(slice(0, d) if k != ax else slice(None) for k, d in enumerate(idx.shape))]
        return np.take_along_axis(sub, _in_range("gather_elements", idx, x.shape[ax], f"axis {ax}"), axis=ax)
    return infer, impl


@register("gather_nd", Pattern.OPAQUE, 2, {"batch_dims": int_in(0, 0)},
          doc="x at index tuples along the last axis of idx (ONNX GatherND); a NumPy step")
def _gather_nd():
    def infer(n):
        x, idx = n.inputs[0].type, n.inputs[1].type
        b, q = n.attrs["batch_dims"], idx.shape[-1] if idx.rank else 0
        if idx.dtype not in ("int32", "int64") or idx.rank < 1 or b >= min(x.rank, idx.rank) or b + q > x.rank \
                or tuple(idx.shape[:b]) != tuple(x.shape[:b]):
            fail(n, f"indices {idx} do not index data {x} with batch_dims {b}")
        return _t(idx.shape[:-1] + x.shape[b + q:], x.dtype)

    def impl(a, x, idx):
        b, q = a["batch_dims"], idx.shape[-1]
        idx = np.stack([_in_range("gather_nd", idx[..., k], x.shape[b + k], f"axis {b + k}") for k in range(q)], -1)
        bshape = x.shape[:b]
        xb = x.reshape((-1,) + x.shape[b:])
        ib = idx.reshape((xb.shape[0], -1, q))
        out = np.stack([xb[k][tuple(ib[k].T)] for k in range(xb.shape[0])])
        return out.reshape(bshape + idx.shape[b:-1] + x.shape[b + q:])
    return infer, impl


@register("scatter_nd", Pattern.OPAQUE, 3, {"reduction": _SCATTER_REDUCTION},
          doc="x with updates written (or combined by the reduction) at index tuples (ONNX ScatterND); a NumPy step")
def _scatter_nd():
    def infer(n):
        x, idx, upd = (i.type for i in n.inputs)
        q = idx.shape[-1] if idx.rank else 0
        if idx.dtype not in ("int32", "int64") or idx.rank < 1 or q > x.rank or upd.dtype != x.dtype \
                or tuple(upd.shape) != tuple(idx.shape[:-1]) + tuple(x.shape[q:]):
            fail(n, f"indices {idx} and updates {upd} do not fit data {x}")
        return _t(x.shape, x.dtype)

    def impl(a, x, idx, upd):
        q = idx.shape[-1]
        where = tuple(_in_range("scatter_nd", idx[..., k], x.shape[k], f"axis {k}").reshape(-1) for k in range(q))
        return _scatter(x, where, upd.reshape((where[0].size,) + x.shape[q:]), a["reduction"])
    return infer, impl


@register("scatter_elements", Pattern.OPAQUE, 3,
          {"axis": 0, "reduction": _SCATTER_REDUCTION},
          doc="x with updates written at idx along one axis (ONNX ScatterElements); a NumPy step")
def _scatter_elements():
    def infer(n):
        x, idx, upd = (i.type for i in n.inputs)
        ax = _norm_axes(n, [n.attrs["axis"]], x.rank)[0]
        if idx.dtype not in ("int32", "int64") or idx.rank != x.rank or tuple(upd.shape) != tuple(idx.shape) \
                or upd.dtype != x.dtype or any(i > d for k, (i, d) in enumerate(zip(idx.shape, x.shape)) if k != ax):
            fail(n, f"indices {idx} and updates {upd} do not fit data {x} along axis {ax}")
        return _t(x.shape, x.dtype)

    def impl(a, x, idx, upd):
        ax = a["axis"] % x.ndim
        where = list(np.indices(idx.shape, sparse=True))
        where[ax] = _in_range("scatter_elements", idx, x.shape[ax], f"axis {ax}")
        return _scatter(x, tuple(where), upd, a["reduction"])
    return infer, impl


FLOAT_OPS = ("conv2d", "conv2d_transpose", "dense", "matmul", "batch_norm", "add", "sub", "mul", "div")
QUANT_OPS = ("qconv2d", "qdense", "qadd", "quantize", "dequantize", "requantize")


@register("take", Pattern.INJECTIVE, 1, {"indices": REQUIRED, "axis": 0},
          doc="gather constant indices along one axis (ONNX Gather with constant indices)")
def _take():
    def infer(n):
        x = n.inputs[0].type
        ax = _norm_axes(n, [n.attrs["axis"]], x.rank)[0]
        idx = np.asarray(n.attrs["indices"])
        if idx.size and (idx.min() < -x.shape[ax] or idx.max() >= x.shape[ax]):
            fail(n, f"indices out of range for axis {ax} of size {x.shape[ax]}")
        return _t(x.shape[:ax] + idx.shape + x.shape[ax + 1:], x.dtype)
    return infer, lambda a, x: np.take(x, np.asarray(a["indices"]), axis=a["axis"])
