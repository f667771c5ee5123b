"""Tensors and operations: placeholder, compute (from a Python lambda), reductions, math.

A Tensor is output 0 of an Operation: PlaceholderOp (an input) or ComputeOp (axis IterVars,
optional reduction IterVars, a body expression). Shapes are constant positive ints. compute
checks its body at construction: reductions only at the top, every read has one index per
dimension, and unguarded reads provably outside a dimension raise ShapeError naming the
tensor, the axis and the range.
"""
from __future__ import annotations

import builtins
import inspect
import itertools
from typing import Callable, Sequence

from ..errors import DTypeError, ExprError, ShapeError
from ..tir import dtype as dt
from ..tir import expr as E
from ..tir.arith import Analyzer
from ..tir.functor import post_order_visit

_name_counter = itertools.count()


class IterVar(E.ExprOp):
    """A loop: its variable, its domain (Range, None until bound inference for derived ones),
    and its type: "data_par", "reduce", "thread" (thread_axis) or "vthread"."""
    DATA_PAR, REDUCE, THREAD, VTHREAD = "data_par", "reduce", "thread", "vthread"
    __slots__ = ("var", "dom", "iter_type", "thread_tag")

    def __init__(self, dom, var: E.Var, iter_type: str, thread_tag: str | None = None):
        self.var, self.dom, self.iter_type, self.thread_tag = var, dom, iter_type, thread_tag

    @property
    def name(self) -> str:
        return self.var.name

    @property
    def dtype(self) -> str:
        return self.var.dtype

    def __repr__(self):
        dom = f", {self.dom.min}..{self.dom.min + self.dom.extent}" if self.dom is not None else ""
        return f"IterVar({self.var.name}{dom}, {self.iter_type})"


class Operation:
    name: str
    tag: str = ""

    def __init__(self):
        self._outputs = [Tensor(self, 0)]

    def output(self, i: int = 0) -> "Tensor":
        return self._outputs[i]

    @property
    def num_outputs(self) -> int:
        return 1

    def input_tensors(self) -> list["Tensor"]:
        return []


class PlaceholderOp(Operation):
    def __init__(self, name: str, shape: tuple[int, ...], dtype: str):
        self.name, self.shape, self.dtype = name, shape, dtype
        self.attrs: dict = {}
        super().__init__()

    def __repr__(self):
        return f"placeholder({self.name}, {list(self.shape)}, {self.dtype})"


class ComputeOp(Operation):
    def __init__(self, name: str, axis: Sequence[IterVar], reduce_axis: Sequence[IterVar],
                 body: E.PrimExpr, tag: str = "", attrs: dict | None = None):
        self.name, self.tag = name, tag
        self.axis, self.reduce_axis = list(axis), list(reduce_axis)
        self.body = body
        self.attrs = dict(attrs or {})
        self.shape = tuple(a.dom.extent.value for a in self.axis)
        self.dtype = body.dtype
        super().__init__()

    def input_tensors(self) -> list["Tensor"]:
        seen: dict = {}

        def f(n):
            if isinstance(n, E.ProducerLoad) and n.producer not in seen:
                seen[n.producer] = None
        post_order_visit(self.body, f)
        return list(seen)

    def __repr__(self):
        return f"compute({self.name}, {list(self.shape)}, {self.body})"


class Tensor:
    """Output of an operation; index it (`A[i, j]`) to read it inside a compute body."""

    def __init__(self, op: Operation, value_index: int = 0):
        self.op, self.value_index = op, value_index

    @property
    def shape(self) -> tuple[int, ...]:
        return self.op.shape

    @property
    def dtype(self) -> str:
        return self.op.dtype

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def ndim(self) -> int:
        return len(self.op.shape)

    def __getitem__(self, indices) -> E.ProducerLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        if len(indices) != self.ndim:
            raise ShapeError(f"tensor '{self.name}' has {self.ndim} dimension(s) {list(self.shape)} "
                             f"but is indexed with {len(indices)} index(es)")
        out = []
        for d, idx in enumerate(indices):
            if isinstance(idx, slice):
                raise ShapeError(f"tensor '{self.name}' axis {d}: slices are not supported in "
                                 "tensor expressions; index with expressions")
            e = E.convert(idx)
            if not dt.is_int(e.dtype) or dt.lanes(e.dtype) != 1:
                raise DTypeError(f"tensor '{self.name}' axis {d}: index {e} has dtype {e.dtype}; "
                                 "indices must be integers")
            if isinstance(e, E.IntImm) and not 0 <= e.value < self.shape[d]:
                raise ShapeError(f"tensor '{self.name}' axis {d}: constant index {e.value} is "
                                 f"outside [0, {self.shape[d]})")
            out.append(e)
        return E.ProducerLoad(self, out)

    def __repr__(self):
        return f"Tensor({self.name}, {list(self.shape)}, {self.dtype})"

    __hash__ = object.__hash__


# ---------------------------------------------------------------- construction

def _check_shape(shape, name: str) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise ShapeError(f"tensor '{name}': shape must be a tuple of ints, got {shape!r}") from None
    out = []
    for d, s in enumerate(shape):
        if isinstance(s, E.IntImm):
            s = s.value
        if not isinstance(s, int) or isinstance(s, bool):
            raise ShapeError(f"tensor '{name}' axis {d}: extent {s!r} is not a constant int "
                             "(symbolic shapes are not supported)")
        if s <= 0:
            raise ShapeError(f"tensor '{name}' axis {d}: extent {s} must be positive")
        out.append(s)
    return tuple(out)


def placeholder(shape, dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor of constant shape."""
    dt.check(dtype)
    if dt.lanes(dtype) != 1:
        raise DTypeError(f"placeholder '{name}': vector dtype {dtype} is not allowed")
    return PlaceholderOp(name, _check_shape(shape, name), dtype).output(0)


def reduce_axis(dom, name: str = "rv") -> IterVar:
    """A reduction axis over dom: an int n ([0, n)), a (lo, hi) pair, or a Range."""
    if isinstance(dom, int):
        dom = E.Range(0, dom)
    elif isinstance(dom, (tuple, list)):
        lo, hi = dom
        dom = E.Range(lo, E.convert(hi) - E.convert(lo))
    if not isinstance(dom, E.Range) or not isinstance(dom.extent, E.IntImm) or not isinstance(dom.min, E.IntImm):
        raise ShapeError(f"reduce_axis '{name}': domain must be constant, got {dom!r}")
    if dom.extent.value <= 0:
        raise ShapeError(f"reduce_axis '{name}': extent {dom.extent.value} must be positive")
    return IterVar(dom, E.Var(name), IterVar.REDUCE)


def thread_axis(dom=None, tag: str = "", name: str = "") -> IterVar:
    """A thread axis for `Stage.bind`: "blockIdx.x", "threadIdx.y", "vthread", "cthread"...
    `thread_axis("threadIdx.x")` or `thread_axis((0, 2), "vthread", name="vx")`."""
    if isinstance(dom, str):
        dom, tag = None, dom
    if isinstance(dom, (tuple, list)):
        dom = E.Range(dom[0], dom[1] - dom[0])
    elif isinstance(dom, int):
        dom = E.Range(0, dom)
    if not tag:
        raise ExprError("thread_axis needs a tag such as 'threadIdx.x' or 'vthread'")
    itype = IterVar.VTHREAD if tag in ("vthread", "cthread") else IterVar.THREAD
    return IterVar(dom, E.Var(name or tag), itype, thread_tag=tag)


def _fn_arg_names(fcompute: Callable, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        params = []
    if len(params) == n and builtins.all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        return [p.name for p in params]
    if params and params[0].kind == params[0].VAR_POSITIONAL:
        return [f"i{k}" for k in range(n)]
    if len(params) != n:
        raise ShapeError(f"compute: the function takes {len(params)} index argument(s) but the "
                         f"shape has {n} dimension(s)")
    return [p.name for p in params]


def compute(shape, fcompute: Callable, name: str = "compute", tag: str = "",
            attrs: dict | None = None) -> Tensor:
    """Tensor of `shape` whose element at (i, j, ...) is fcompute(i, j, ...).

    The body may be a reduction (te.sum / te.max / te.min over reduce_axis) only at the top.
    """
    shape = _check_shape(shape, name)
    names = _fn_arg_names(fcompute, len(shape))
    axis = [IterVar(E.Range(0, n), E.Var(nm), IterVar.DATA_PAR) for nm, n in zip(names, shape)]
    body = fcompute(*axis)
    if isinstance(body, (list, tuple)):
        raise ExprError(f"compute '{name}': multiple outputs are not supported; return one expression")
    body = E.convert(body)
    reduce_axes: list[IterVar] = []
    if isinstance(body, E.Reduce):
        reduce_axes = list(body.axis)
    _check_body(name, body, axis, reduce_axes)
    return ComputeOp(name, axis, reduce_axes, body, tag, attrs).output(0)


def _check_body(name: str, body: E.PrimExpr, axis, reduce_axes) -> None:
    top = body
    allowed = {a.var for a in axis} | {r.var for r in reduce_axes}

    def nested(n):
        if isinstance(n, E.Reduce) and n is not top:
            raise ExprError(f"compute '{name}': a reduction must be the whole body of the compute "
                            f"(found {n.combiner}(...) inside a larger expression); compute the "
                            "reduction as its own tensor")

    def visit(n):
        if isinstance(n, E.Var) and n not in allowed:
            raise ExprError(f"compute '{name}': variable '{n.name}' is neither an axis of the "
                            "compute nor a reduction axis of its reduction")
    post_order_visit(body, nested)
    post_order_visit(body, visit)
    ana = Analyzer()
    for a in list(axis) + list(reduce_axes):
        lo = a.dom.min.value
        ana.bind(a.var, lo, lo + a.dom.extent.value - 1)
    _check_loads(name, body, ana)


def _check_loads(name: str, e, ana: Analyzer) -> None:
    """Raise ShapeError for reads the bound analysis cannot prove inside a dimension (generated
    code has no bounds checks, so an unproven read could touch memory outside the tensor); reads
    under a select branch or a reduction's `where` are guarded by their condition and not checked.
    The analysis is an interval over-approximation: clamp an index (min/max) to prove it."""
    if isinstance(e, E.Select):
        _check_loads(name, e.cond, ana)
        return
    if isinstance(e, E.Reduce):
        _check_loads(name, e.condition, ana)
        if E.is_const(e.condition, 1):
            _check_loads(name, e.source, ana)
        return
    if isinstance(e, E.ProducerLoad):
        t = e.producer
        for d, idx in enumerate(e.indices):
            lo, hi = ana.bound(idx)
            if (lo is not None and lo >= t.shape[d]) or (hi is not None and hi < 0) or \
               (lo is not None and hi is not None and (lo < 0 or hi >= t.shape[d])):
                raise ShapeError(
                    f"compute '{name}': read {t.name}[{', '.join(str(i) for i in e.indices)}]: "
                    f"index {d} ({idx}) ranges over [{lo}, {hi}] but axis {d} of '{t.name}' "
                    f"has extent {t.shape[d]}; guard it with te.select/if_then_else if intended")
    for f in e._fields:
        v = getattr(e, f)
        for x in (v if isinstance(v, tuple) else (v,)):
            if x is not None:
                _check_loads(name, x, ana)


# ---------------------------------------------------------------- reductions and math

def _reduce(combiner: str, expr, axis, where):
    expr = E.convert(expr)
    if isinstance(axis, IterVar):
        axis = [axis]
    axis = list(axis)
    if not axis:
        raise ExprError(f"{combiner}: needs at least one reduce_axis")
    for a in axis:
        if not isinstance(a, IterVar) or a.iter_type != IterVar.REDUCE:
            raise ExprError(f"{combiner}: axis {a!r} is not a te.reduce_axis")
    cond = E.const(True) if where is None else E.convert(where)
    if not dt.is_bool(cond.dtype):
        raise DTypeError(f"{combiner}: where= must be a bool condition, got {cond.dtype}")
    if dt.is_bool(expr.dtype):
        raise DTypeError(f"{combiner}: cannot reduce a bool expression; cast it first")
    return E.Reduce(combiner, expr, axis, cond)


def sum(expr, axis, where=None) -> E.Reduce:  # noqa: A001 - te.sum like TVM
    """Sum of expr over the reduction axes (where given, only where it holds)."""
    return _reduce("sum", expr, axis, where)


def max(expr, axis=None, where=None):  # noqa: A001
    """Maximum over reduction axes: te.max(expr, axis=k). With two plain expressions and no
    axis, the elementwise maximum: te.max(a, b)."""
    if axis is None or not (isinstance(axis, IterVar) or (isinstance(axis, (list, tuple)) and axis
                                                          and isinstance(axis[0], IterVar))):
        if axis is None:
            raise ExprError("te.max needs axis= (a reduce_axis) or a second expression")
        return E.max_expr(expr, axis)
    return _reduce("max", expr, axis, where)


def min(expr, axis=None, where=None):  # noqa: A001
    """Minimum over reduction axes, or elementwise minimum of two expressions."""
    if axis is None or not (isinstance(axis, IterVar) or (isinstance(axis, (list, tuple)) and axis
                                                          and isinstance(axis[0], IterVar))):
        if axis is None:
            raise ExprError("te.min needs axis= (a reduce_axis) or a second expression")
        return E.min_expr(expr, axis)
    return _reduce("min", expr, axis, where)


def prod(expr, axis, where=None) -> E.Reduce:
    return _reduce("prod", expr, axis, where)


def exp(x): return E.call_intrin("exp", x)
def log(x): return E.call_intrin("log", x)
def sqrt(x): return E.call_intrin("sqrt", x)
def tanh(x): return E.call_intrin("tanh", x)
def floor(x): return E.call_intrin("floor", x)
def ceil(x): return E.call_intrin("ceil", x)
def round(x): return E.call_intrin("round", x)  # noqa: A001
def power(x, y): return E.call_intrin("pow", x, y)


def abs(x):  # noqa: A001
    x = E.convert(x)
    if dt.is_float(x.dtype):
        return E.call_intrin("fabs", x)
    return E.select(x < 0, -x, x)


def sigmoid(x):
    x = E.convert(x)
    one = E.const(1.0, x.dtype)
    return one / (one + exp(-x))


def rsqrt(x):
    x = E.convert(x)
    return E.const(1.0, x.dtype) / sqrt(x)


def max_value(dtype: str) -> E.PrimExpr:
    return E.const(dt.max_value(dtype), dtype)


def min_value(dtype: str) -> E.PrimExpr:
    return E.const(dt.min_value(dtype), dtype)


def all(*conds) -> E.PrimExpr:  # noqa: A001
    return E.logical_and(*conds)


def any(*conds) -> E.PrimExpr:  # noqa: A001
    out = E.convert(conds[0])
    for c in conds[1:]:
        out = E.logical_or(out, c)
    return out


_ = builtins  # builtins stay reachable despite the te-style names above
