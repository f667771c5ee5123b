"""Compute declarations of elementwise and broadcasting operators, activations, casts and the
shift-based int8 quantization ops of the quantized flow (compiler.graph.passes.quantize):
quantize, dequantize, requantize, qadd. Integer results are exact; rounding is spelled out.
"""
from __future__ import annotations

import math

from .. import te
from ..graph.ops import INT8_MAX, int8_min
from ..tir import dtype as dt
from .registry import OpError


def _tag(name):
    return f"elemwise,{name}"


def unary(x, fn, name):
    return te.compute(x.shape, lambda *i: fn(x[i]), name=name, tag=_tag(name))


def _float(x, what):
    if not dt.is_float(x.dtype):
        raise OpError(f"{what}: needs a float input, got {x.dtype}")


def float_unary(x, fn, name):
    """unary() on a float tensor (OpError naming the op otherwise)."""
    _float(x, name)
    return unary(x, fn, name)


def relu(x):
    return unary(x, lambda v: te.elem_max(v, te.const(0, x.dtype)), "relu")


def leaky_relu(x, alpha=0.01):
    _float(x, "leaky_relu")
    a = te.const(alpha, x.dtype)
    return unary(x, lambda v: te.select(v >= te.const(0, x.dtype), v, v * a), "leaky_relu")


def clip(x, min=None, max=None):  # noqa: A002 - ONNX names
    def f(v):
        if min is not None:
            v = te.elem_max(v, te.const(min, x.dtype))
        if max is not None:
            v = te.elem_min(v, te.const(max, x.dtype))
        return v
    return unary(x, f, "clip")


def sigmoid(x):
    return float_unary(x, te.sigmoid, "sigmoid")


def tanh(x):
    return float_unary(x, te.tanh, "tanh")


def exp(x):
    return float_unary(x, te.exp, "exp")


def sqrt(x):
    return float_unary(x, te.sqrt, "sqrt")


def neg(x):
    return unary(x, lambda v: -v, "neg")


def abs_(x):
    return float_unary(x, te.abs, "abs")


def log(x):
    return float_unary(x, te.log, "log")


def reciprocal(x):
    return float_unary(x, lambda v: te.const(1.0, x.dtype) / v, "reciprocal")


def erf_expr(v):
    """erf(v) for float32: the rational approximation Eigen and XLA use (max error a few ulp),
    on v clamped to [-4, 4] where erf is +-1 in float32. Vectorizes (no libm call)."""
    d = v.dtype
    c = lambda a: te.const(a, d)  # noqa: E731
    x = te.elem_max(te.elem_min(v, c(4.0)), c(-4.0))
    x2 = x * x
    alpha = [-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
             -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02]
    beta = [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
            -7.37332916720468e-03, -1.42647390514189e-02]
    p = c(alpha[0])
    for a in alpha[1:]:
        p = p * x2 + c(a)
    p = p * x
    q = c(beta[0])
    for b in beta[1:]:
        q = q * x2 + c(b)
    return p / q


def erf(x):
    return float_unary(x, erf_expr, "erf")


def gelu(x, approximate="none"):
    """0.5 x (1 + erf(x / sqrt 2)), or with approximate='tanh' the tanh form (ONNX Gelu-20)."""
    _float(x, "gelu")
    d = x.dtype
    half, one = te.const(0.5, d), te.const(1.0, d)
    if approximate == "none":
        s = te.const(1.0 / math.sqrt(2.0), d)
        return unary(x, lambda v: half * v * (one + erf_expr(v * s)), "gelu")
    if approximate == "tanh":
        k, c = te.const(math.sqrt(2.0 / math.pi), d), te.const(0.044715, d)
        return unary(x, lambda v: half * v * (one + te.tanh(k * (v + c * v * v * v))), "gelu")
    raise OpError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def floor(x):
    return float_unary(x, te.floor, "floor")


def ceil(x):
    return float_unary(x, te.ceil, "ceil")


def round_(x):
    """Ties to even, as ONNX Round (LLVM's round goes away from zero)."""
    return float_unary(x, round_half_even, "round")


def sign(x):
    def f(v):
        zero = te.const(0, x.dtype)
        return te.select(v > zero, te.const(1, x.dtype), te.select(v < zero, te.const(-1, x.dtype), zero))
    return unary(x, f, "sign")


def sin(x):
    return float_unary(x, lambda v: te.call_intrin("sin", v), "sin")


def cos(x):
    return float_unary(x, lambda v: te.call_intrin("cos", v), "cos")


def logical_not(x):
    return unary(x, lambda v: ~v, "logical_not")


def cast(x, to):
    dt.check(to)
    return unary(x, lambda v: v.astype(to), "cast")


# ---------------------------------------------------------------- broadcasting binary ops

def broadcast_shape(a, b, what="broadcast"):
    ra, rb = len(a), len(b)
    r = max(ra, rb)
    a = (1,) * (r - ra) + tuple(a)
    b = (1,) * (r - rb) + tuple(b)
    out = []
    for d, (x, y) in enumerate(zip(a, b)):
        if x != y and 1 not in (x, y):
            raise OpError(f"{what}: shapes {list(a)} and {list(b)} do not broadcast (axis {d}: {x} vs {y})")
        out.append(max(x, y))
    return tuple(out)


def _bindex(t, idx):
    """Index of tensor t (right-aligned, size-1 axes read at 0) for output index idx."""
    off = len(idx) - t.ndim
    return tuple(0 if t.shape[d] == 1 else idx[off + d] for d in range(t.ndim))


def broadcast_binary(a, b, fn, name):
    if a.dtype != b.dtype:
        raise OpError(f"{name}: operand dtypes differ ({a.dtype} vs {b.dtype}); cast one")
    shape = broadcast_shape(a.shape, b.shape, name)
    return te.compute(shape, lambda *i: fn(a[_bindex(a, i)], b[_bindex(b, i)]), name=name,
                      tag=f"broadcast,{name}")


def add(a, b):
    return broadcast_binary(a, b, lambda x, y: x + y, "add")


def sub(a, b):
    return broadcast_binary(a, b, lambda x, y: x - y, "sub")


def mul(a, b):
    return broadcast_binary(a, b, lambda x, y: x * y, "mul")


def div(a, b):
    if dt.is_float(a.dtype):
        return broadcast_binary(a, b, lambda x, y: x / y, "div")
    # integer division truncates toward zero (numpy // floors; ONNX Div truncates)
    return broadcast_binary(a, b, lambda x, y: te.select((x < 0) != (y < 0),
                                                         -((te.abs(x)) // te.abs(y)), x // y), "div")


def pow(a, b):  # noqa: A001
    _float(a, "pow")
    return broadcast_binary(a, b, lambda x, y: te.power(x, y), "pow")


def maximum(a, b):
    return broadcast_binary(a, b, te.elem_max, "maximum")


def minimum(a, b):
    return broadcast_binary(a, b, te.elem_min, "minimum")


def mod(a, b, fmod=0):
    """ONNX Mod: fmod=1 keeps the dividend's sign (C fmod), fmod=0 the divisor's (numpy's mod).
    Floats call libm's fmod, exact where x - trunc(x / y) y is not (an infinite divisor)."""
    if dt.is_float(a.dtype):
        zero = te.const(0, a.dtype)

        def f(x, y):
            r = te.call_extern(a.dtype, "fmodf" if a.dtype == "float32" else "fmod", x, y)
            if fmod:
                return r
            # numpy: a remainder of the dividend's sign moves by y; a zero takes y's sign
            return te.select(r == zero, te.select(y < zero, -zero, zero),
                             te.select((r < zero) != (y < zero), r + y, r))
        return broadcast_binary(a, b, f, "mod")
    if fmod:
        def g(x, y):
            return x - (te.abs(x) // te.abs(y)) * te.abs(y) * te.select(x < 0, te.const(-1, a.dtype), te.const(1, a.dtype))
        return broadcast_binary(a, b, g, "mod")
    return broadcast_binary(a, b, lambda x, y: x % y, "mod")


def _compare(fn, name):
    return lambda a, b: broadcast_binary(a, b, fn, name)


COMPARE = {"equal": _compare(lambda x, y: x == y, "equal"), "less": _compare(lambda x, y: x < y, "less"),
           "greater": _compare(lambda x, y: x > y, "greater"),
           "less_equal": _compare(lambda x, y: x <= y, "less_equal"),
           "greater_equal": _compare(lambda x, y: x >= y, "greater_equal"),
           "logical_and": _compare(lambda x, y: x & y, "logical_and"),
           "logical_or": _compare(lambda x, y: x | y, "logical_or"),
           "logical_xor": _compare(lambda x, y: x != y, "logical_xor")}


def where(cond, a, b):
    """cond ? a : b with numpy broadcasting over all three."""
    if a.dtype != b.dtype:
        raise OpError(f"where: operand dtypes differ ({a.dtype} vs {b.dtype}); cast one")
    shape = broadcast_shape(broadcast_shape(cond.shape, a.shape, "where"), b.shape, "where")
    return te.compute(shape, lambda *i: te.select(cond[_bindex(cond, i)], a[_bindex(a, i)], b[_bindex(b, i)]),
                      name="where", tag="broadcast,where")


# ---------------------------------------------------------------- int8 quantization

def round_half_even(v):
    """Round a float to the nearest integer, ties to even (numpy rint, ONNX QuantizeLinear)."""
    d = v.dtype
    f = te.floor(v)
    diff = v - f
    half, one, two = te.const(0.5, d), te.const(1.0, d), te.const(2.0, d)
    odd = (f - two * te.floor(f / two)) == one
    up = te.any(diff > half, te.all(diff == half, odd))
    return te.select(up, f + one, f)


def _clip_int8(v, zero_point: int = 0):
    """Saturate to int8 (compiler.graph.ops.clip_int8): [-127, 127], or with a zero point + zero_point
    and [-128, 127]."""
    if zero_point:
        v = v + te.const(zero_point, v.dtype)
    lo = te.const(int8_min(zero_point), v.dtype)
    return te.elem_min(te.elem_max(v, lo), te.const(INT8_MAX, v.dtype)).astype("int8")


def shift_right_round(v64, s: int):
    """v * 2^-s rounded half up (ADD 2^(s-1), arithmetic SHR s); s <= 0 shifts left. v is int64."""
    if s > 0:
        return (v64 + te.const(1 << (s - 1), "int64")) >> te.const(s, "int64")
    if s < 0:
        return v64 << te.const(-s, "int64")
    return v64


def quantize(x, shift=0, scale=0.0, zero_point=0):
    """float -> int8: clip(round_half_even(x * 2^shift), -127, 127), or of x / scale when a scale is
    given; + zero_point and [-128, 127] when it is not 0."""
    _float(x, "quantize")
    lo = te.const(float(int8_min(zero_point)), x.dtype)
    hi, z = te.const(float(INT8_MAX), x.dtype), te.const(float(zero_point), x.dtype)
    factor = te.const(float(scale) if scale else 2.0 ** shift, x.dtype)

    def f(v):   # a scale divides, as ONNX QuantizeLinear does (x * (1/scale) can round differently)
        r = round_half_even(v / factor if scale else v * factor)
        r = r + z if zero_point else r
        # NaN fails r >= lo and saturates low, as onnxruntime's QuantizeLinear (never NaN -> int8)
        return te.select(r >= lo, te.elem_min(r, hi), lo).astype("int8")
    return unary(x, f, "quantize")


def dequantize(x, shift=0, scale=0.0, zero_point=0):
    """int8 -> float32: (q - zero_point) * 2^-shift, or (q - zero_point) * scale when a scale is given."""
    s = float(scale) if scale else 2.0 ** -shift
    if zero_point:
        return unary(x, lambda v: (v.astype("int32") - te.const(zero_point, "int32")).astype("float32")
                     * te.const(s, "float32"), "dequantize")
    return unary(x, lambda v: v.astype("float32") * te.const(s, "float32"), "dequantize")


def shift_right_floor(v64, s: int):
    """v * 2^-s rounded down (one arithmetic SHR s); s <= 0 shifts left. v is int64."""
    if s > 0:
        return v64 >> te.const(s, "int64")
    if s < 0:
        return v64 << te.const(-s, "int64")
    return v64


def requantize(x, in_shift, out_shift, rounding: bool = True, mul: int = 1, zero_point: int = 0):
    """int (int8 or int32 accumulator) at 2^-in_shift -> int8 at 2^-out_shift: round (unless
    rounding=False, as for qconv2d/qdense whose int32 bias already holds the half), SHR, CLIP;
    mul multiplies first (a fixed-point scale); zero_point is added before the clip."""
    if not dt.is_int(x.dtype):
        raise OpError(f"requantize: needs an integer input, got {x.dtype}")
    s = in_shift - out_shift
    shift = shift_right_round if rounding else shift_right_floor
    def f(v):
        v = v.astype("int64")
        return _clip_int8(shift(v * te.const(mul, "int64") if mul != 1 else v, s), zero_point)
    return unary(x, f, "requantize")


def requantize_per_channel(acc, muls, shift: int, axis: int = 1, zero_point: int = 0):
    """int32 accumulator -> int8 with one multiplier per channel (muls, int64, along `axis`):
    round_half_up(acc * muls[c] * 2^-shift), CLIP (compiler.graph.ops.requant_acc)."""
    if not dt.is_int(acc.dtype):
        raise OpError(f"requantize: needs an integer input, got {acc.dtype}")
    return te.compute(acc.shape, lambda *i: _clip_int8(shift_right_round(acc[i].astype("int64") * muls[i[axis]], shift),
                                                       zero_point),
                      name="requantize", tag=_tag("requantize"))


def qadd(a, b, a_shift, b_shift, out_shift, a_mul=0, b_mul=0):
    """int8 + int8 at their own scales -> int8: align to the finer scale by left shifts, add (int32
    wrap, as the accelerator's accumulator), round, SHR, CLIP. With multipliers (a_mul non-zero):
    round_half_up((a a_mul + b b_mul) 2^-out_shift), CLIP."""
    if a_mul:
        def g(x, y):
            s = x.astype("int64") * te.const(a_mul, "int64") + y.astype("int64") * te.const(b_mul, "int64")
            return _clip_int8(shift_right_round(s, out_shift))
        return broadcast_binary(a, b, g, "qadd")
    m = max(a_shift, b_shift)

    def f(x, y):
        s = (x.astype("int32") << te.const(m - a_shift, "int32")) + (y.astype("int32") << te.const(m - b_shift, "int32"))
        return _clip_int8(shift_right_round(s.astype("int64"), m - out_shift))
    return broadcast_binary(a, b, f, "qadd")
