"""Scalar and vector expressions shared by tensor expressions (te) and the loop IR (tir).

Every node is immutable, carries a dtype and lists its children in `_fields`, so one generic
visitor/mutator (tir.functor) walks them all. Python operators build nodes with the dtype rule
of `dtype.promote`; constant operands fold at construction. `==` builds an EQ node whose
truth value is object identity, so nodes stay usable as dict keys.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from ..errors import DTypeError, ExprError
from . import dtype as dt


class ExprOp:
    """Operator overloads, shared by PrimExpr and things convertible to one (IterVar)."""

    __slots__ = ()

    def __add__(self, o): return add(self, o)
    def __radd__(self, o): return add(o, self)
    def __sub__(self, o): return sub(self, o)
    def __rsub__(self, o): return sub(o, self)
    def __mul__(self, o): return mul(self, o)
    def __rmul__(self, o): return mul(o, self)
    def __truediv__(self, o): return div(self, o)
    def __rtruediv__(self, o): return div(o, self)
    def __floordiv__(self, o): return floordiv(self, o)
    def __rfloordiv__(self, o): return floordiv(o, self)
    def __mod__(self, o): return floormod(self, o)
    def __rmod__(self, o): return floormod(o, self)
    def __neg__(self): return sub(const(0, convert(self).dtype), self)
    def __lt__(self, o): return _cmp(LT, self, o)
    def __le__(self, o): return _cmp(LE, self, o)
    def __gt__(self, o): return _cmp(GT, self, o)
    def __ge__(self, o): return _cmp(GE, self, o)
    def __eq__(self, o): return _cmp(EQ, self, o, from_python_eq=True)
    def __ne__(self, o): return _cmp(NE, self, o, from_python_eq=True)
    def __and__(self, o): return _logic_or_bit(And, BitAnd, self, o)
    def __rand__(self, o): return _logic_or_bit(And, BitAnd, o, self)
    def __or__(self, o): return _logic_or_bit(Or, BitOr, self, o)
    def __ror__(self, o): return _logic_or_bit(Or, BitOr, o, self)
    def __xor__(self, o): return _binary(BitXor, self, o)
    def __invert__(self): return logical_not(self)
    def __lshift__(self, o): return _binary(Shl, self, o)
    def __rshift__(self, o): return _binary(Shr, self, o)
    __hash__ = object.__hash__

    def __bool__(self):
        raise ExprError(
            f"symbolic expression {self} has no Python truth value; use te.select / "
            "te.if_then_else for conditions, & | ~ for logic")

    def astype(self, dtype: str) -> "PrimExpr":
        return cast(self, dtype)


class PrimExpr(ExprOp):
    __slots__ = ("dtype",)
    _fields: tuple[str, ...] = ()

    def __repr__(self):
        from .printer import expr_str  # noqa: PLC0415 - import cycle: printer imports expr and stmt
        return expr_str(self)

    __str__ = __repr__


class IntImm(PrimExpr):
    __slots__ = ("value",)

    def __init__(self, value: int, dtype: str = "int32"):
        dt.check(dtype)
        if dt.is_float(dtype):
            raise DTypeError(f"IntImm cannot have float dtype {dtype}")
        self.value = int(value)
        self.dtype = dtype


class FloatImm(PrimExpr):
    __slots__ = ("value",)

    def __init__(self, value: float, dtype: str = "float32"):
        if not dt.is_float(dt.check(dtype)):
            raise DTypeError(f"FloatImm needs a float dtype, got {dtype}")
        self.value = float(value)
        self.dtype = dtype


class StringImm(PrimExpr):
    """A string argument (extern function names, pragma values)."""
    __slots__ = ("value",)

    def __init__(self, value: str):
        self.value = str(value)
        self.dtype = "int32"


class Var(PrimExpr):
    """A scalar variable (loop variable, index variable, scalar parameter). Identity matters."""
    __slots__ = ("name",)

    def __init__(self, name: str = "v", dtype: str = dt.INDEX):
        self.name = name
        self.dtype = dt.check(dtype)


class BinaryOp(PrimExpr):
    __slots__ = ("a", "b")
    _fields = ("a", "b")
    symbol = "?"

    def __init__(self, a: PrimExpr, b: PrimExpr, dtype: str | None = None):
        self.a, self.b = a, b
        self.dtype = dtype if dtype is not None else a.dtype


class Add(BinaryOp): symbol = "+"
class Sub(BinaryOp): symbol = "-"
class Mul(BinaryOp): symbol = "*"
class Div(BinaryOp):
    """Float division (integer division is FloorDiv)."""
    symbol = "/"
class FloorDiv(BinaryOp): symbol = "//"
class FloorMod(BinaryOp): symbol = "%"
class Min(BinaryOp): symbol = "min"
class Max(BinaryOp): symbol = "max"
class BitAnd(BinaryOp): symbol = "&"
class BitOr(BinaryOp): symbol = "|"
class BitXor(BinaryOp): symbol = "^"
class Shl(BinaryOp): symbol = "<<"
class Shr(BinaryOp):
    """Arithmetic shift right for signed, logical for unsigned."""
    symbol = ">>"


class CmpOp(BinaryOp):
    __slots__ = ("_py_eq",)

    def __init__(self, a, b, dtype=None):
        super().__init__(a, b, dt.with_lanes("bool", dt.lanes(a.dtype)))
        self._py_eq = None

    def __bool__(self):
        # Only `x == y` / `x != y` written in Python (dict lookups, `in`) have a truth value:
        # the identity of the two operands.
        if self._py_eq is not None:
            return self._py_eq
        return ExprOp.__bool__(self)


class EQ(CmpOp): symbol = "=="
class NE(CmpOp): symbol = "!="
class LT(CmpOp): symbol = "<"
class LE(CmpOp): symbol = "<="
class GT(CmpOp): symbol = ">"
class GE(CmpOp): symbol = ">="


class And(BinaryOp): symbol = "and"
class Or(BinaryOp): symbol = "or"


class Not(PrimExpr):
    __slots__ = ("a",)
    _fields = ("a",)

    def __init__(self, a: PrimExpr):
        self.a = a
        self.dtype = a.dtype


class Select(PrimExpr):
    """cond ? true_value : false_value. Only the chosen side is evaluated (loads are guarded)."""
    __slots__ = ("cond", "true_value", "false_value")
    _fields = ("cond", "true_value", "false_value")

    def __init__(self, cond, true_value, false_value):
        self.cond, self.true_value, self.false_value = cond, true_value, false_value
        self.dtype = true_value.dtype


class Cast(PrimExpr):
    __slots__ = ("value",)
    _fields = ("value",)

    def __init__(self, dtype: str, value: PrimExpr):
        self.dtype = dt.check(dtype)
        self.value = value


class Call(PrimExpr):
    """A call: math intrinsics ("exp", "sqrt", ...) or extern functions (op="call_extern",
    args[0] a StringImm naming the symbol). Accelerator backends add their own op names."""
    __slots__ = ("op", "args")
    _fields = ("args",)

    def __init__(self, dtype: str, op: str, args: Sequence[PrimExpr]):
        self.dtype = dtype if dtype in ("void", "handle") else dt.check(dtype)
        self.op = op
        self.args = tuple(args)


class Reduce(PrimExpr):
    """combiner ("sum" | "max" | "min" | "prod") of source over the reduction axes, where
    condition holds. Appears only as the whole body of a compute."""
    __slots__ = ("combiner", "source", "axis", "condition")
    _fields = ("source", "condition")

    def __init__(self, combiner: str, source: PrimExpr, axis: Sequence[Any], condition: PrimExpr):
        self.combiner, self.source, self.axis, self.condition = combiner, source, tuple(axis), condition
        self.dtype = source.dtype


class ProducerLoad(PrimExpr):
    """Read of a te.Tensor at indices (before lowering)."""
    __slots__ = ("producer", "indices")
    _fields = ("indices",)

    def __init__(self, producer, indices: Sequence[PrimExpr]):
        self.producer = producer
        self.indices = tuple(indices)
        self.dtype = producer.dtype


class BufferLoad(PrimExpr):
    """Read of a tir Buffer. Vector dtype when the (flat) index is a vector (Ramp, ...)."""
    __slots__ = ("buffer", "indices")
    _fields = ("indices",)

    def __init__(self, buffer, indices: Sequence[PrimExpr], lanes: int | None = None):
        self.buffer = buffer
        self.indices = tuple(indices)
        n = lanes if lanes is not None else (dt.lanes(self.indices[0].dtype) if self.indices else 1)
        self.dtype = dt.with_lanes(buffer.dtype, n)


class Ramp(PrimExpr):
    """The vector [base, base+stride, ..., base+(lanes-1)*stride]."""
    __slots__ = ("base", "stride", "lanes")
    _fields = ("base", "stride")

    def __init__(self, base: PrimExpr, stride: PrimExpr, lanes: int):
        self.base, self.stride, self.lanes = base, stride, int(lanes)
        self.dtype = dt.with_lanes(base.dtype, self.lanes)


class Broadcast(PrimExpr):
    """value replicated in every lane."""
    __slots__ = ("value", "lanes")
    _fields = ("value",)

    def __init__(self, value: PrimExpr, lanes: int):
        self.value, self.lanes = value, int(lanes)
        self.dtype = dt.with_lanes(value.dtype, self.lanes)


class Range:
    """[min, min + extent)."""
    __slots__ = ("min", "extent")

    def __init__(self, min, extent):
        self.min, self.extent = convert(min), convert(extent)

    @staticmethod
    def from_min_extent(min, extent) -> "Range":
        return Range(min, extent)

    def __repr__(self):
        return f"Range({self.min}, {self.extent})"


# ---------------------------------------------------------------- construction helpers

def const(value, dtype: str | None = None) -> PrimExpr:
    """A constant; dtype defaults to bool / int32 / float32 from the Python type."""
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else "int32" if isinstance(value, int) else "float32"
    dt.check(dtype)
    if dt.is_float(dtype):
        return FloatImm(value, dtype)
    if isinstance(value, float):
        if not value.is_integer():
            raise DTypeError(f"constant {value} does not fit integer dtype {dtype}")
        value = int(value)
    return IntImm(int(value), dtype)


def convert(value, like: str | None = None) -> PrimExpr:
    """Python number / IterVar / PrimExpr -> PrimExpr. `like` gives the dtype for numbers."""
    if isinstance(value, PrimExpr):
        return value
    var = getattr(value, "var", None)
    if isinstance(var, Var):   # IterVar
        return var
    if isinstance(value, bool):
        return IntImm(int(value), "bool")
    if isinstance(value, int):
        if like is not None and not dt.is_bool(like):
            return const(value, dt.element(like))
        return IntImm(value, "int32")
    if isinstance(value, float):
        if like is not None and dt.is_float(like):
            return FloatImm(value, dt.element(like))
        return FloatImm(value, "float32")
    raise ExprError(f"cannot convert {value!r} ({type(value).__name__}) to an expression")


def is_const(e, value=None) -> bool:
    if not isinstance(e, (IntImm, FloatImm)):
        return False
    return value is None or e.value == value


def _match(a, b, what: str):
    """Convert operands and insert casts so both have the promoted dtype."""
    if not isinstance(a, ExprOp) and not isinstance(b, ExprOp):
        a, b = convert(a), convert(b)
    elif not isinstance(a, ExprOp):
        b = convert(b)
        a = convert(a, b.dtype)
    elif not isinstance(b, ExprOp):
        a = convert(a)
        b = convert(b, a.dtype)
    else:
        a, b = convert(a), convert(b)
    if a.dtype != b.dtype:
        t = dt.promote(a.dtype, b.dtype, what)
        a = a if a.dtype == t else cast(a, t)
        b = b if b.dtype == t else cast(b, t)
    return a, b


def _wrap_int(value: int, dtype: str) -> int:
    nb = dt.bits(dtype)
    if dt.is_bool(dtype):
        return int(bool(value))
    value &= (1 << nb) - 1
    if dt.is_signed(dtype) and value >= 1 << (nb - 1):
        value -= 1 << nb
    return value


_FOLD = {
    "Add": lambda x, y: x + y, "Sub": lambda x, y: x - y, "Mul": lambda x, y: x * y,
    "Min": min, "Max": max,
}


def _binary(cls, a, b):
    a, b = _match(a, b, cls.__name__)
    if dt.is_bool(a.dtype) and cls not in (And, Or, EQ, NE):
        raise DTypeError(f"{cls.symbol}: operands are bool; cast them first")
    if cls in (BitAnd, BitOr, BitXor, Shl, Shr, FloorMod) and dt.is_float(a.dtype) and cls is not FloorMod:
        raise DTypeError(f"{cls.symbol} needs integer operands, got {a.dtype}")
    if isinstance(a, (IntImm, FloatImm)) and isinstance(b, (IntImm, FloatImm)) and cls.__name__ in _FOLD:
        v = _FOLD[cls.__name__](a.value, b.value)
        return const(v if dt.is_float(a.dtype) else _wrap_int(v, a.dtype), a.dtype)
    return cls(a, b)


def _cmp(cls, a, b, from_python_eq=False):
    if from_python_eq:
        # `==` / `!=` from Python (list membership, dict probes): the truth value is identity
        # of the original objects, and mixing with non-expressions never raises.
        same = a is b
        if not (isinstance(a, (ExprOp, int, float)) and isinstance(b, (ExprOp, int, float))):
            return same if cls is EQ else not same
        try:
            a2, b2 = _match(a, b, cls.__name__)
        except DTypeError:
            return same if cls is EQ else not same
        node = cls(a2, b2)
        node._py_eq = same if cls is EQ else not same
        return node
    node = cls(*_match(a, b, cls.__name__))
    node._py_eq = None
    return node


def _logic_or_bit(logic_cls, bit_cls, a, b):
    a, b = _match(a, b, logic_cls.__name__)
    if dt.is_bool(a.dtype):
        return logic_cls(a, b)
    return _binary(bit_cls, a, b)


def add(a, b): return _binary(Add, a, b)
def sub(a, b): return _binary(Sub, a, b)
def mul(a, b): return _binary(Mul, a, b)


def div(a, b):
    """True division; integer operands are refused (write // for floor division)."""
    a, b = _match(a, b, "/")
    if not dt.is_float(a.dtype):
        raise DTypeError(f"'/' on {a.dtype} operands ({a} / {b}); use // for integer "
                         "(floor) division or cast to a float dtype")
    if isinstance(a, FloatImm) and isinstance(b, FloatImm) and b.value != 0:
        return FloatImm(a.value / b.value, a.dtype)
    return Div(a, b)


def floordiv(a, b):
    a, b = _match(a, b, "//")
    if isinstance(a, IntImm) and isinstance(b, IntImm) and b.value != 0:
        return IntImm(a.value // b.value, a.dtype)
    return FloorDiv(a, b)


def floormod(a, b):
    a, b = _match(a, b, "%")
    if isinstance(a, IntImm) and isinstance(b, IntImm) and b.value != 0:
        return IntImm(a.value % b.value, a.dtype)
    return FloorMod(a, b)


def min_expr(a, b): return _binary(Min, a, b)
def max_expr(a, b): return _binary(Max, a, b)


def logical_and(*conds):
    out = None
    for c in conds:
        c = convert(c)
        out = c if out is None else And(out, c)
    return out if out is not None else const(True)


def logical_or(a, b): return Or(*_match(a, b, "or"))


def logical_not(a):
    a = convert(a)
    if not dt.is_bool(a.dtype):
        raise DTypeError(f"~ needs a bool operand, got {a.dtype}; compare it first")
    return Not(a)


def cast(value, dtype: str) -> PrimExpr:
    value = convert(value)
    dtype = dt.check(dtype)
    if value.dtype == dtype:
        return value
    if isinstance(value, (IntImm, FloatImm)) and dt.lanes(dtype) == 1:
        v = value.value
        if dt.is_float(dtype):
            return FloatImm(float(v), dtype)
        if dt.is_bool(dtype):
            return IntImm(int(bool(v)), "bool")
        if isinstance(v, float):
            if math.isinf(v) or math.isnan(v):
                return Cast(dtype, value)
            v = int(v)
        return IntImm(_wrap_int(v, dtype), dtype)
    return Cast(dtype, value)


def select(cond, true_value, false_value) -> PrimExpr:
    """cond ? t : f, with the dtype rule applied to t and f. Only the taken side is evaluated."""
    cond = convert(cond)
    if not dt.is_bool(cond.dtype):
        raise DTypeError(f"select condition must be bool, got {cond.dtype} ({cond})")
    t, f = _match(true_value, false_value, "select")
    return Select(cond, t, f)


if_then_else = select

#: math intrinsics: name -> whether integer inputs are allowed
MATH_INTRINSICS = {"exp": False, "log": False, "sqrt": False, "tanh": False, "fabs": True,
                   "floor": False, "ceil": False, "round": False, "trunc": False, "pow": False,
                   "exp2": False, "log2": False, "sin": False, "cos": False}


def call_intrin(name: str, *args) -> PrimExpr:
    if name not in MATH_INTRINSICS:
        raise ExprError(f"unknown math intrinsic {name!r}; known: {', '.join(MATH_INTRINSICS)}")
    cargs = [convert(a) for a in args]
    if len(cargs) == 2:
        cargs = list(_match(cargs[0], cargs[1], name))
    if not MATH_INTRINSICS[name] and not dt.is_float(cargs[0].dtype):
        raise DTypeError(f"{name} needs a float operand, got {cargs[0].dtype} ({cargs[0]}); cast it")
    return Call(cargs[0].dtype, name, cargs)


def call_extern(dtype: str, name: str, *args) -> PrimExpr:
    """Call of an external C symbol `name` (resolved by the code generator)."""
    return Call(dtype, "call_extern", [StringImm(name)] + [convert(a) for a in args])
