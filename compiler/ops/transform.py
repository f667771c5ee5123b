"""Compute declarations of data-movement operators: reshape, transpose, concat, pad (constant,
reflect, edge), strided slice, take by constant indices of an affine-floor form, the
NCHW <-> NCHW[x]c layout transforms and the accelerator's blocked layout (pack, unpack). Each output element
reads one input element (the graph IR's INJECTIVE pattern)."""
from __future__ import annotations

import math

import numpy as np

from .. import te
from ..graph.ops import packed_shape
from .nn import pack_nchwc, unpack_nchwc
from .registry import OpError


def _unravel(flat, shape):
    idx = []
    for n in reversed(shape):
        idx.append(flat % n if n > 1 else te.const(0))
        flat = flat // n
    return tuple(reversed(idx))


def reshape(x, shape):
    shape = tuple(int(s) for s in shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape = tuple(math.prod(x.shape) // known if s == -1 else s for s in shape)
    if math.prod(shape) != math.prod(x.shape):
        raise OpError(f"reshape: cannot reshape {list(x.shape)} to {list(shape)}")
    # trailing axes both shapes share are read as they are: only the leading ones go through a
    # flat index, so a vectorized last axis loads whole vectors (an unravelled lane index is a
    # gather: a reshape around an elementwise group ran 4x slower)
    keep = 0
    while keep < min(len(shape), x.ndim) - 1 and shape[-1 - keep] == x.shape[-1 - keep]:
        keep += 1
    lead, xlead = shape[:len(shape) - keep], tuple(x.shape[:x.ndim - keep])
    strides = [math.prod(lead[d + 1:]) for d in range(len(lead))]

    def f(*i):
        if not lead:     # a 0-d result: the one element of a size-1 tensor
            return x[(0,) * x.ndim]
        flat = i[0] * strides[0]
        for d in range(1, len(lead)):
            flat = flat + i[d] * strides[d]
        return x[_unravel(flat, xlead) + tuple(i[len(lead):])]
    return te.compute(shape, f, name="reshape", tag="injective,reshape")


def transpose(x, perm):
    perm = tuple(int(p) for p in perm)
    if sorted(perm) != list(range(x.ndim)):
        raise OpError(f"transpose: perm {list(perm)} is not a permutation of {x.ndim} axes")
    inv = [perm.index(d) for d in range(x.ndim)]
    return te.compute(tuple(x.shape[p] for p in perm), lambda *i: x[tuple(i[inv[d]] for d in range(x.ndim))],
                      name="transpose", tag="injective,transpose")


def concat(*xs, axis=0):
    r = xs[0].ndim
    if not -r <= axis < r:
        raise OpError(f"concat: axis {axis} out of range for rank {r}")
    ax = axis % r
    for t in xs:
        if t.ndim != r or any(t.shape[d] != xs[0].shape[d] for d in range(r) if d != ax) or t.dtype != xs[0].dtype:
            raise OpError(f"concat: inputs {[list(t.shape) for t in xs]} {[t.dtype for t in xs]} differ "
                          f"outside axis {ax}")
    offs = [0]
    for t in xs:
        offs.append(offs[-1] + t.shape[ax])
    shape = list(xs[0].shape)
    shape[ax] = offs[-1]

    def f(*i):
        def read(k):
            j = list(i)
            j[ax] = i[ax] - offs[k]
            return xs[k][tuple(j)]
        def pick(lo, hi):   # inputs lo..hi-1: a balanced tree of selects, log2(n) deep, not n
            if hi - lo == 1:
                return read(lo)
            mid = (lo + hi) // 2
            return te.select(i[ax] < offs[mid], pick(lo, mid), pick(mid, hi))
        return pick(0, len(xs))
    return te.compute(tuple(shape), f, name="concat", tag="injective,concat", attrs={"axis": ax})


def pad(x, pads, mode="constant", value=0.0):
    """pads = (begin_0..begin_{r-1}, end_0..end_{r-1}) as ONNX."""
    r = x.ndim
    pads = tuple(int(p) for p in pads)
    if len(pads) != 2 * r or min(pads) < 0:
        raise OpError(f"pad: pads {list(pads)} must be 2 x rank {r} non-negative values")
    shape = tuple(x.shape[d] + pads[d] + pads[d + r] for d in range(r))
    if mode == "constant":
        val = te.const(value, x.dtype)

        def f(*i):
            conds, src = [], []
            for d in range(r):
                lo, n = pads[d], x.shape[d]
                src.append(i[d] - lo)
                if lo:
                    conds.append(i[d] >= lo)
                if pads[d + r]:
                    conds.append(i[d] < lo + n)
            return te.select(te.all(*conds), x[tuple(src)], val) if conds else x[tuple(src)]
    elif mode in ("edge", "reflect"):
        for d in range(r):
            if mode == "reflect" and (pads[d] >= x.shape[d] or pads[d + r] >= x.shape[d]):
                raise OpError(f"pad: reflect padding {pads[d]}/{pads[d + r]} must be smaller than axis "
                              f"{d} of size {x.shape[d]}")

        def f(*i):
            src = []
            for d in range(r):
                n, j = x.shape[d], i[d] - pads[d]
                if mode == "edge":
                    j = te.elem_min(te.elem_max(j, 0), n - 1)
                else:
                    j = te.abs(j)                       # reflect below 0
                    j = (n - 1) - te.abs((n - 1) - j)    # reflect above n - 1
                    # a no-op clamp: te's bound check cannot see through the selects of abs
                    j = te.elem_min(te.elem_max(j, 0), n - 1)
                src.append(j)
            return x[tuple(src)]
    else:
        raise OpError(f"pad: unknown mode {mode!r}; modes are constant, reflect, edge")
    return te.compute(shape, f, name="pad", tag="injective,pad")


def strided_slice(x, starts, ends, axes, steps):
    """Graph-IR slice: starts/ends normalized to [0, dim] (ends may be -1 for negative steps)."""
    shape = list(x.shape)
    begin = [0] * x.ndim
    step = [1] * x.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        if not 0 <= ax < x.ndim or st == 0:
            raise OpError(f"slice: bad axis {ax} or step {st} for rank {x.ndim}")
        n = len(range(s, e, st))
        if n <= 0:
            raise OpError(f"slice: axis {ax} range({s}, {e}, {st}) is empty")
        shape[ax], begin[ax], step[ax] = n, s, st
    return te.compute(tuple(shape), lambda *i: x[tuple(begin[d] + i[d] * step[d] for d in range(x.ndim))],
                      name="slice", tag="injective,slice")


def layout_transform(x, src, dst):
    """'NCHW' <-> 'NCHW{n}c' (e.g. 'NCHW16c')."""
    if src == "NCHW" and dst.startswith("NCHW") and dst.endswith("c"):
        return pack_nchwc(x, int(dst[4:-1]), name="layout_transform")
    if dst == "NCHW" and src.startswith("NCHW") and src.endswith("c"):
        if x.ndim != 5 or x.shape[4] != int(src[4:-1]):
            raise OpError(f"layout_transform: input {list(x.shape)} is not {src}")
        return unpack_nchwc(x, name="layout_transform")
    raise OpError(f"layout_transform: {src} -> {dst} is not supported (NCHW <-> NCHW<n>c)")


def pack_blocked(x, block):
    """N C ... -> N' C' ... b0 b1, N and C zero-padded to whole blocks: the accelerator's blocked
    activation layout (accel.isa.layout.pack_blocked is its NumPy twin)."""
    b0, b1 = (int(b) for b in block)
    if x.ndim < 2 or b0 < 1 or b1 < 1:
        raise OpError(f"pack: needs an input of rank 2 or more and positive blocks, got {list(x.shape)}, {block}")
    n, c = x.shape[:2]
    shape = packed_shape(tuple(x.shape), (b0, b1))
    pad_n, pad_c = shape[0] * b0 != n, shape[1] * b1 != c
    zero = te.const(0, x.dtype)

    def f(*i):
        nb, cb, *sp, j0, j1 = i
        src_n, src_c = nb * b0 + j0, cb * b1 + j1
        v = x[(src_n, src_c, *sp)]
        conds = ([src_n < n] if pad_n else []) + ([src_c < c] if pad_c else [])
        return te.select(te.all(*conds), v, zero) if conds else v
    return te.compute(shape, f, name="pack", tag="injective,pack")


def unpack_blocked(x, shape):
    """N' C' ... b0 b1 -> N C ... cropped to `shape` (the inverse of pack_blocked)."""
    shape = tuple(int(d) for d in shape)
    if x.ndim != len(shape) + 2 or len(shape) < 2 or packed_shape(shape, x.shape[-2:]) != tuple(x.shape):
        raise OpError(f"unpack: {list(x.shape)} is not a blocked layout of {list(shape)}")
    b0, b1 = x.shape[-2:]

    def f(*i):
        n, c, *sp = i
        return x[(n // b0, c // b1, *sp, n % b0, c % b1)]
    return te.compute(shape, f, name="unpack", tag="injective,unpack")


def affine_floor(indices) -> tuple[int, int, int] | None:
    """(a, b, c) with indices[i] == (a * i + b) // c for every i (1-D, c up to 16, a up to 16 c):
    the index maps of nearest resizes by rational factors and of strided gathers; else None.
    Candidates are tried on a prefix first, so a long map costs a few whole-array checks."""
    idx = np.asarray(indices, np.int64).reshape(-1)
    if not idx.size or idx.min() < 0:
        return None
    n, first, last = idx.size, int(idx[0]), int(idx[-1])
    i = np.arange(n, dtype=np.int64)
    head = slice(0, 64)
    for c in range(1, 17):
        for b in range(c * first, c * first + c):
            # the last index bounds a: c * last <= a * (n - 1) + b < c * (last + 1)
            lo, hi = (0, 0) if n == 1 else (-(-(c * last - b) // (n - 1)), (c * last + c - 1 - b) // (n - 1))
            for a in range(max(lo, 0), min(hi, 16 * c) + 1):
                if (np.array_equal((a * i[head] + b) // c, idx[head])
                        and np.array_equal((a * i + b) // c, idx)):
                    return a, b, c
    return None


def take(x, indices, axis=0):
    """x gathered along `axis` at constant indices whose flat order has an affine-floor form
    (affine_floor; any shape: torch.export writes a reshape as a gather at arange(C)[:, None, None]),
    or at one scalar index (the axis goes away: torch's h_n[-1])."""
    ax = axis % x.ndim
    if np.ndim(indices) == 0:
        k = int(indices)
        shape = tuple(x.shape[:ax]) + tuple(x.shape[ax + 1:])
        return te.compute(shape, lambda *i: x[i[:ax] + (k,) + i[ax:]], name="take", tag="injective,take")
    form = affine_floor(indices)
    if form is None:
        raise OpError("take: the indices have no affine-floor form (a * i + b) // c")
    a, b, c = form
    ishape = tuple(int(d) for d in np.shape(indices))
    strides = [math.prod(ishape[k + 1:]) for k in range(len(ishape))]
    shape = tuple(x.shape[:ax]) + ishape + tuple(x.shape[ax + 1:])

    def f(*i):
        flat = sum((i[ax + k] * st if st != 1 else i[ax + k] for k, st in enumerate(strides) if ishape[k] != 1),
                   te.const(0, "int32"))
        return x[i[:ax] + ((flat * a + b) // c,) + i[ax + len(ishape):]]
    return te.compute(shape, f, name="take", tag="injective,take")
