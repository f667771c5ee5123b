"""High-level API: get(op, target) -> (compute, schedule), and compile_op -> a numpy callable.

compile_op builds placeholders for the given shapes, runs the selected implementation's compute
and schedule, and compiles with compiler.build; compiled modules are cached by signature (op,
target, implementation, shapes, dtypes, attributes, which inputs are constants), so the same
layer compiles once per process. Constant inputs (weights) are transformed once (prepack) and
bound; the callable then takes only the other inputs.
"""
from __future__ import annotations

import logging
import threading

import numpy as np

from .. import te
from ..build import build
from ..tir import dtype as dt
from .registry import OPS, OpError, OpNotSupported, get_def, implementations, normalize_attrs, select, target_kind

log = logging.getLogger(__name__)

_CACHE: dict = {}
_lock = threading.Lock()


def list_ops(target: str | None = None) -> list[str]:
    """Declared op names (the graph's structural input/const/fused left out); with a target, only
    those it has kernels for."""
    names = sorted(n for n in OPS if n not in ("input", "const", "fused"))
    if target is None:
        return names
    out = []
    for name in names:
        try:
            implementations(name, target)
            out.append(name)
        except OpNotSupported:
            pass
    return out


def get(name: str, target="llvm", shapes=None, dtypes=None, attrs=None, impl: str | None = None):
    """(compute_fn, schedule_fn) of the best implementation of `name` on `target`.

    compute_fn(*tensors, **attrs) -> Tensor; schedule_fn(outs) -> te Schedule. With shapes (and
    dtypes, attrs), the best implementation that accepts that signature."""
    if shapes is None:
        cands = implementations(name, target)
        if impl is not None:
            cands = [i for i in cands if i.name == impl] or cands[:0]
            if not cands:
                raise OpError(f"{name}: no kernel {impl!r} on {target_kind(target)}")
        chosen = cands[0]
    else:
        shapes = [tuple(s) for s in shapes]
        dtypes = _dtypes(dtypes or "float32", len(shapes))
        chosen = select(name, target, shapes, dtypes, normalize_attrs(name, attrs), impl)
    return chosen.compute, chosen.schedule


def _dtypes(dtype, n):
    if isinstance(dtype, str):
        return [dt.check(dtype)] * n
    dtypes = [dt.check(d) for d in dtype]
    if len(dtypes) != n:
        raise OpError(f"{len(dtypes)} dtypes given for {n} inputs")
    return dtypes


def _freeze(v):
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    return v


class CompiledOp:
    """A compiled operator: call it with the non-constant inputs (numpy), get the output.

    .module is the runtime.Module (get_source('tir' | 'll' | 'asm')); .run(*inputs, out=) writes
    into a given array; .time(*inputs) measures seconds per call."""

    def __init__(self, name, impl, module, in_specs, out_shape, out_dtype, consts):
        self.name, self.impl, self.module = name, impl, module
        self.in_specs = in_specs          # [(shape, dtype)] of every input, constants included
        self.out_shape, self.out_dtype = out_shape, out_dtype
        self.consts = consts              # index -> prepared array

    def _args(self, arrays):
        free = [k for k in range(len(self.in_specs)) if k not in self.consts]
        if len(arrays) != len(free):
            raise OpError(f"{self.name}: takes {len(free)} input array(s) (inputs {free}; "
                          f"{sorted(self.consts)} are bound constants), got {len(arrays)}")
        args = []
        it = iter(arrays)
        for k, (shape, dtype) in enumerate(self.in_specs):
            if k in self.consts:
                args.append(self.consts[k])
                continue
            a = next(it)
            if not isinstance(a, np.ndarray):
                a = np.asarray(a)
            if a.shape != tuple(shape) or a.dtype != np.dtype(dtype):
                raise OpError(f"{self.name}: input {k} has shape {a.shape} dtype {a.dtype}, "
                              f"expected {tuple(shape)} {dtype}")
            args.append(np.ascontiguousarray(a))
        return args

    def run(self, *arrays, out=None):
        args = self._args(arrays)
        if out is None:
            out = np.empty(self.out_shape, self.out_dtype)
        self.module(*args, out)
        return out

    __call__ = run

    def time(self, *arrays, number: int = 10, repeat: int = 3) -> float:
        args = self._args(arrays)
        out = np.empty(self.out_shape, self.out_dtype)
        return self.module.time(*args, out, number=number, repeat=repeat)

    def __repr__(self):
        return f"CompiledOp({self.name}, impl={self.impl.name}, out={list(self.out_shape)} {self.out_dtype})"


def compile_op(name: str, shapes, attrs: dict | None = None, dtype="float32", target="llvm",
               consts: dict | None = None, impl: str | None = None) -> CompiledOp:
    """Compile operator `name` for input `shapes` (a list of tuples) and `dtype` (one dtype or one
    per input) on `target`. consts {input index: array} binds inputs at compile time (weights; an
    implementation may re-layout them once). impl picks an implementation by name."""
    d = get_def(name)
    shapes = [tuple(int(x) for x in s) for s in shapes]
    d.check_arity(len(shapes))
    dtypes = _dtypes(dtype, len(shapes))
    attrs = normalize_attrs(name, attrs)
    chosen = select(name, target, shapes, dtypes, attrs, impl)
    call_attrs = dict(attrs)
    prepared: dict = {}
    ph_shapes = list(shapes)
    for k, arr in (consts or {}).items():
        if not 0 <= k < len(shapes):
            raise OpError(f"{name}: const index {k} out of range for {len(shapes)} inputs")
        arr = np.asarray(arr)
        if arr.shape != shapes[k] or arr.dtype != np.dtype(dtypes[k]):
            raise OpError(f"{name}: const input {k} has shape {arr.shape} dtype {arr.dtype}, expected "
                          f"{shapes[k]} {dtypes[k]}")
        if k in chosen.prepack:
            arr, extra = chosen.prepack[k](arr, shapes, dtypes, attrs)
            call_attrs.update(extra)
        prepared[k] = np.ascontiguousarray(arr)
        ph_shapes[k] = prepared[k].shape
    key = (name, str(target), chosen.name, tuple(ph_shapes), tuple(dtypes), _freeze(call_attrs),
           tuple(sorted(prepared)))
    with _lock:
        hit = _CACHE.get(key)
    if hit is None:
        ins = [te.placeholder(s, t, f"in{k}") for k, (s, t) in enumerate(zip(ph_shapes, dtypes))]
        out = chosen.compute(*ins, **call_attrs)
        sch = chosen.schedule([out])
        mod = build(sch, ins + [out], target=target, name=f"op_{name}")
        hit = (mod, tuple(out.shape), out.dtype)
        log.debug("compiled %s with %s: %s -> %s", name, chosen.name, ph_shapes, out.shape)
        with _lock:
            _CACHE[key] = hit
    mod, oshape, odtype = hit
    specs = [(s, t) for s, t in zip(ph_shapes, dtypes)]
    return CompiledOp(name, chosen, mod, specs, oshape, odtype, prepared)


def clear_cache() -> None:
    with _lock:
        _CACHE.clear()
