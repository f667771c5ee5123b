"""GPU schedules (target kind "cuda", shared by the OpenCL and NVPTX back ends), as TVM's CUDA TOPI.

- injective / elementwise / fused epilogues: every stage but the output inlined (pads too: a GPU
  recomputes rather than stores), the output's axes fused, split into blocks of THREADS threads.
- conv2d NCHW (any groups, depthwise, dilation): a block computes TO*RO output channels x TY rows x
  TX columns; each thread RO channels in registers (cache_write "local"); per RC-channel step of
  the reduction the block loads the padded input tile and the weight tile into shared memory
  cooperatively (every thread copies a strided share), between work-group barriers.
- dense / matmul / batch_matmul: (TM*RM x TN*RN) output tile per block, (RM x RN) per thread in
  registers, A and B tiles of KT along the reduction staged in shared memory.
- reductions (pooling, reduce_*, softmax, layer norm, lrn): one thread per output row: the rows
  are the output's leading axes that every intermediate reduction keeps, the intermediates live in
  registers at the thread ("local"), the row's axes run serially.

Every schedule takes knobs (tile sizes, threads) with defaults; `GPU_KNOBS` lists their ranges
for the tuner. `register()` adds an implementation under ("op", "cuda") for each op of the
library whose CPU compute is in a plain layout (no pre-packed weights); the others decline.
"""
from __future__ import annotations

import math

from .. import te
from ..errors import ScheduleError
from ..te.tensor import ComputeOp
from ..tir import expr as E
from ..tir.functor import post_order_visit
from . import registry
from .library import _q_check, _requant
from .nn import dense

THREADS = 256
#: threadIdx.z's limit on CUDA (and most OpenCL GPUs: max work-item sizes (1024, 1024, 64))
MAX_Z = 64
#: knob -> allowed values (the tuner's search space)
GPU_KNOBS = {"threads": (64, 128, 256, 512), "tile": (4, 8, 16), "reg": (1, 2, 4), "kt": (4, 8, 16),
             "rc": (1, 4, 8), "vec": (1, 4)}
#: vector width of global loads and stores where the innermost axis allows (float4, ld.global.v4)
VEC = 4


def _as_list(outs):
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


def _stages(s):
    return [st for st in s.stages if not st.is_placeholder and st.attach_type != "inline"]


def inline_all(s, outs, keep=()) -> None:
    """compute_inline every stage without a reduction that is not an output (or kept)."""
    out_ops = {o.op for o in outs}
    for st in s.stages:
        op = st.op
        if st.is_placeholder or op in out_ops or any(op is k for k in keep) or st.attach_type == "inline":
            continue
        if isinstance(op, ComputeOp) and not op.reduce_axis:
            st.compute_inline()


def _bind_flat(st, threads: int = THREADS, vec: int = 1):
    """Fuse the stage's axes and spread them over blocks of `threads` threads; the thread axis.
    vec > 1: each thread takes `vec` consecutive elements of the innermost axis as one vector
    (when that axis is a multiple of vec), so its loads and stores are vector accesses."""
    axes = list(st.op.axis)
    size = math.prod(int(a.dom.extent.value) for a in axes) if axes else 1
    if vec > 1 and axes and int(axes[-1].dom.extent.value) % vec == 0 and size >= vec:
        outer, lane = st.split(axes[-1], vec)
        axes = axes[:-1] + [outer]
        size //= vec
        st.vectorize(lane)
    f = st.fuse(*axes) if len(axes) > 1 else axes[0]
    t = min(threads, max(1, size))
    bo, ti = st.split(f, t)
    st.bind(bo, te.thread_axis("blockIdx.x"))
    st.bind(ti, te.thread_axis("threadIdx.x"))
    return ti


def _coop_load(s, cache, block: tuple[int, int, int], vec: int = 1) -> None:
    """A shared cache stage filled by the whole block: its elements spread over the block's threads;
    vec > 1: rows whose length is a multiple of vec are copied vec elements (one vector) per thread."""
    st = s[cache]
    axes = list(st.op.axis)
    bx, by, bz = block
    ext = [int(a.dom.extent.value) for a in axes]
    if vec > 1 and len(axes) > 1 and ext[-1] % vec == 0 and ext[-1] // vec >= 2:
        col, lane = st.split(axes[-1], vec)
        st.vectorize(lane)
        axes[-1] = col
        ext[-1] //= vec
        bx = _pow2_at_most(ext[-1], bx)
    if len(axes) > 1 and ext[-1] >= bx and math.prod(ext[:-1]) >= by * bz:
        # rows x columns: the row index over (tz, ty), the column over tx; no div/mod by the row length
        rows = st.fuse(*axes[:-1]) if len(axes) > 2 else axes[0]
        ro, ri = st.split(rows, by * bz)
        co, tx = st.split(axes[-1], bx)
        st.reorder(ro, co, ri, tx)
        if bz > 1:
            tz, ty = st.split(ri, by)
            st.bind(tz, te.thread_axis("threadIdx.z"))
        else:
            ty = ri
        st.bind(ty, te.thread_axis("threadIdx.y"))
        st.bind(tx, te.thread_axis("threadIdx.x"))
        return
    f = st.fuse(*axes) if len(axes) > 1 else axes[0]
    rest, tx = st.split(f, bx)
    if by > 1:
        rest, ty = st.split(rest, by)
    if bz > 1:
        rest, tz = st.split(rest, bz)
        st.bind(tz, te.thread_axis("threadIdx.z"))
    if by > 1:
        st.bind(ty, te.thread_axis("threadIdx.y"))
    st.bind(tx, te.thread_axis("threadIdx.x"))


def _pow2_at_most(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


def _find(s, tags):
    for st in _stages(s):
        if st.op.tag.split(",")[0] in tags:
            return st
    return None


def _main_and_out(outs, tags):
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    main = _find(s, tags)
    inline_all(s, outs, keep=(main.op,) if main is not None else ())
    return outs, s, main


def _to_local(s, main, out_t):
    """The reduction stage as registers at each thread: cache_write when it is the output, else
    its own stage in "local" scope (the epilogue, inlined into the output, reads it)."""
    if main.op is out_t.op:
        return s.cache_write(out_t, "local"), s[out_t]
    main.set_scope("local")
    return main.op.output(0), s[out_t]


# ---------------------------------------------------------------- injective
def schedule_injective(outs, threads: int = THREADS, vec: int = VEC):
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    inline_all(s, outs)
    for st in _stages(s):
        if st.op.axis:
            _bind_flat(st, threads, vec)
    return s


# ---------------------------------------------------------------- dense / matmul
def schedule_gemm(outs, tile: int = 8, reg: int = 2, kt: int = 8, vec: int = VEC):
    """(…, M, N) = sum_k: the last two output axes tiled over threads and registers, the leading
    (batch) axis over blockIdx.z; A and B tiles staged in shared memory per KT of k."""
    outs, s, main = _main_and_out(outs, ("dense", "matmul", "batch_matmul"))
    out_t = outs[0]
    D, ost = _to_local(s, main, out_t)
    shape = [int(a.dom.extent.value) for a in ost.op.axis]
    M, N = shape[-2], shape[-1]
    tm, tn = _pow2_at_most(M, tile), _pow2_at_most(N, tile)
    rm, rn = _pow2_at_most(max(1, M // tm), reg), _pow2_at_most(max(1, N // tn), reg)
    if rm * rn == 1 and (M % tm or N % tn):
        # a one-element register tile becomes a scalar, and PoCL miscompiles a scalar accumulator
        # of a partial tile (docs/gpu.md): two accumulators keep the tile an array (a 1 x 16 x 10
        # dense gave wrong columns)
        rn = 2
    axes = list(ost.op.axis)
    lead, i, j = axes[:-2], axes[-2], axes[-1]
    bi, ii = ost.split(i, tm * rm)
    bj, jj = ost.split(j, tn * rn)
    ti, ri = ost.split(ii, rm)
    tj, rj = ost.split(jj, rn)
    if lead:
        bz = ost.fuse(*lead) if len(lead) > 1 else lead[0]
        ost.reorder(bz, bi, bj, ti, tj, ri, rj)
        ost.bind(bz, te.thread_axis("blockIdx.z"))
    else:
        ost.reorder(bi, bj, ti, tj, ri, rj)
    ost.bind(bi, te.thread_axis("blockIdx.y"))
    ost.bind(bj, te.thread_axis("blockIdx.x"))
    ost.bind(ti, te.thread_axis("threadIdx.y"))
    ost.bind(tj, te.thread_axis("threadIdx.x"))
    dst = s[D]
    dst.compute_at(ost, tj)
    (k,) = dst.op.reduce_axis
    K = int(k.dom.extent.value)
    ko, ki = dst.split(k, min(kt, K))
    dax = list(dst.op.axis)
    dst.reorder(*dax[:-2], ko, ki, dax[-2], dax[-1])
    dst.unroll(dax[-2])   # the RM x RN accumulators stay in registers; the output copy stays rolled:
    dst.unroll(dax[-1])   # unrolled, PoCL miscompiles partial tiles (docs/gpu.md, test_pocl_repro.py)
    for t in _inputs(dst.op):
        c = s.cache_read(t, "shared", [dst])
        s[c].compute_at(dst, ko)
        _coop_load(s, c, (tn, tm, 1), vec)
    return s


def _inputs(op) -> list:
    seen, out = set(), []

    def f(n):
        if isinstance(n, E.ProducerLoad) and id(n.producer) not in seen:
            seen.add(id(n.producer))
            out.append(n.producer)
    post_order_visit(op.body, f)
    return out


# ---------------------------------------------------------------- conv2d
def schedule_conv2d(outs, tile: int = 8, reg: int = 4, rc: int = 4, threads: int = THREADS, vec: int = VEC):
    outs, s, main = _main_and_out(outs, ("conv2d_nchw",))
    out_t = outs[0]
    D, ost = _to_local(s, main, out_t)
    n, o, y, x = ost.op.axis
    _, O, OH, OW = [int(a.dom.extent.value) for a in ost.op.axis]
    tx = _pow2_at_most(OW, tile)
    ty = _pow2_at_most(OH, tile)
    ro = _pow2_at_most(O, reg)
    to = _pow2_at_most(max(1, O // ro), min(MAX_Z, max(1, threads // (tx * ty))))
    ob, oo = ost.split(o, to * ro)
    otz, oi = ost.split(oo, ro)
    yb, yt = ost.split(y, ty)
    xb, xt = ost.split(x, tx)
    bz = ost.fuse(n, ob)
    ost.reorder(bz, yb, xb, otz, yt, xt, oi)
    ost.bind(bz, te.thread_axis("blockIdx.z"))
    ost.bind(yb, te.thread_axis("blockIdx.y"))
    ost.bind(xb, te.thread_axis("blockIdx.x"))
    ost.bind(otz, te.thread_axis("threadIdx.z"))
    ost.bind(yt, te.thread_axis("threadIdx.y"))
    ost.bind(xt, te.thread_axis("threadIdx.x"))
    dst = s[D]
    dst.compute_at(ost, xt)
    c_ax, ry, rx = dst.op.reduce_axis
    C = int(c_ax.dom.extent.value)
    rco, rci = dst.split(c_ax, min(rc, C))
    dn, do, dy, dx = dst.op.axis
    dst.reorder(dn, rco, ry, rx, rci, do, dy, dx)
    dst.unroll(do)        # the RO accumulators stay in registers
    for t in _inputs(dst.op):
        c = s.cache_read(t, "shared", [dst])
        s[c].compute_at(dst, rco)
        _coop_load(s, c, (tx, ty, to), vec)   # rows of a multiple of 4 (1x1 convs) as vectors
    return s


# ---------------------------------------------------------------- reductions
def schedule_rows(outs, threads: int = THREADS):
    """One thread per output row; every reduction stage in registers at that thread."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    inline_all(s, outs)
    out_t = outs[0]
    ost = s[out_t]
    reds = [st for st in _stages(s) if st is not ost]
    shape = [int(a.dom.extent.value) for a in ost.op.axis]
    p = len(shape)
    for st in reds:    # keep only the leading axes every intermediate has in full
        rs = [int(a.dom.extent.value) for a in st.op.axis]
        q = 0
        while q < min(len(rs), len(shape)) and rs[q] == shape[q]:
            q += 1
        p = min(p, q)
    if not reds:
        p = len(shape)
    axes = list(ost.op.axis)
    row_axes, inner = axes[:p], axes[p:]
    rows = math.prod(shape[:p]) if p else 1
    if row_axes:
        f = ost.fuse(*row_axes) if len(row_axes) > 1 else row_axes[0]
    else:
        f, _ = ost.split(axes[0], shape[0]) if axes else (None, None)
    t = min(threads, max(1, rows))
    bo, ti = ost.split(f, t)
    ost.reorder(bo, ti, *inner)
    ost.bind(bo, te.thread_axis("blockIdx.x"))
    ost.bind(ti, te.thread_axis("threadIdx.x"))
    for st in reds:
        st.set_scope("local")
        st.compute_at(ost, ti)
    return s


_TAGS_CONV = ("conv2d_nchw",)
_TAGS_GEMM = ("dense", "matmul", "batch_matmul")


def schedule_kind(outs) -> str:
    """Which GPU schedule a composed body gets: conv, gemm, rows (reductions) or injective."""
    outs = _as_list(outs)
    s0 = te.create_schedule([o.op for o in outs])
    tags = {st.op.tag.split(",")[0] for st in _stages(s0)}
    if tags & set(_TAGS_CONV):
        return "conv"
    if tags & set(_TAGS_GEMM):
        return "gemm"
    if tags & {"softmax_wg", "layer_norm_wg"}:
        return "wg"
    if any(st.op.reduce_axis for st in _stages(s0)):
        return "rows"
    return "injective"


#: schedule kind -> (function, the knobs it takes)
SCHEDULES = {"conv": (schedule_conv2d, ("tile", "reg", "rc", "threads", "vec")),
             "gemm": (schedule_gemm, ("tile", "reg", "kt", "vec")),
             "rows": (schedule_rows, ("threads",)),
             "injective": (schedule_injective, ("threads", "vec"))}


def schedule_gpu(outs, knobs: dict | None = None):
    """The schedule for a composed body, chosen by its anchor stage (conv, gemm, reduction,
    injective); `knobs` (tile, reg, kt, rc, threads: see GPU_KNOBS) override the defaults."""
    fn, names = SCHEDULES[schedule_kind(outs)]
    kw = {k: v for k, v in (knobs or {}).items() if k in names}
    s = fn(_as_list(outs), **kw)
    _check_one_kernel(s)
    return s


def _check_one_kernel(s) -> None:
    """One kernel = one root stage bound to blocks/threads; a body needing several (stages the
    schedule left unbound, which would need a grid-wide barrier) is declined (the builder then
    splits the group into its ops)."""
    roots = [st for st in _stages(s) if st.attach_type == "root"]
    if len(roots) != 1:
        raise ScheduleError(f"GPU schedule: {len(roots)} stages at root ({', '.join(st.name for st in roots)}); "
                            "one kernel computes one")
    if not any(a.thread is not None for a in roots[0].iter_attrs.values()):
        raise ScheduleError(f"GPU schedule: stage '{roots[0].name}' is not bound to blocks or threads")


# ---------------------------------------------------------------- work-group reductions
#: rows shorter than this keep one thread per row (a block per row would idle most threads)
WG_MIN_ROW = 64


def _unravel(flat, dims):
    """Index tuple of a flat (row-major) index into dims (constant sizes)."""
    out = []
    for d in reversed(dims):
        out.append(flat % d if d > 1 else te.const(0))
        flat = flat // d if d > 1 else flat
    return list(reversed(out))


def _row_view(shape, axes_lo, axes_hi):
    """(rows, n, index(r, c)): rows are the axes outside [lo, hi), c runs over those inside."""
    outer, red, inner = shape[:axes_lo], shape[axes_lo:axes_hi], shape[axes_hi:]
    n_in = math.prod(inner)

    def index(r, c):
        o = _unravel(r // n_in, outer) if outer else []
        i = _unravel(r % n_in, inner) if inner else []
        return tuple(o + _unravel(c, red) + i)
    return math.prod(outer) * n_in, math.prod(red), index


def _partials(x_at, rows, n, T, combiner, name):
    """partial[r, t] = combine over j of x_at(r, j*T + t) (t < T): each thread's share of a row."""
    J = -(-n // T)
    j = te.reduce_axis(J, f"{name}_j")
    red = te.max if combiner == "max" else te.sum
    return te.compute((rows, T), lambda r, t: red(x_at(r, j * T + t), axis=j, where=j * T + t < n),
                      name=f"{name}_part", tag="wg_partial")


def _combine(part, T, combiner, name):
    t = te.reduce_axis(T, f"{name}_t")
    red = te.max if combiner == "max" else te.sum
    return te.compute((part.shape[0],), lambda r: red(part[r, t], axis=t), name=name, tag="wg_combine")


def softmax_wg(x, axis=-1, threads: int = THREADS):
    """softmax whose max and sum are work-group reductions: a block per row, each thread reduces a
    strided share into shared memory, then the block combines the shares."""
    ax = axis % x.ndim
    shape = tuple(int(d) for d in x.shape)
    rows, n, index = _row_view(shape, ax, ax + 1)
    T = _pow2_at_most(n, threads)
    safe = lambda r, c: x[index(r, te.elem_min(c, n - 1))]  # noqa: E731 - guarded by the where clause
    mx = _combine(_partials(safe, rows, n, T, "max", "sm_max"), T, "max", "sm_max")
    ex = lambda r, c: te.exp(safe(r, c) - mx[r])  # noqa: E731
    sm = _combine(_partials(ex, rows, n, T, "sum", "sm_sum"), T, "sum", "sm_sum")
    n_in = math.prod(shape[ax + 1:])

    def out(*i):
        o = 0
        for d in range(ax):
            o = o * shape[d] + i[d]
        inn = 0
        for d in range(ax + 1, len(shape)):
            inn = inn * shape[d] + i[d]
        r = o * n_in + inn
        return te.exp(x[i] - mx[r]) / sm[r]
    return te.compute(shape, out, name="softmax", tag="softmax_wg", attrs={"wg_lo": ax, "wg_hi": ax + 1})


def layer_norm_wg(x, scale, bias=None, axis=-1, epsilon=1e-5, threads: int = THREADS):
    """layer norm with work-group reductions for the mean and the variance (block per row)."""
    ax = axis % x.ndim
    shape = tuple(int(d) for d in x.shape)
    rows, n, index = _row_view(shape, ax, len(shape))
    T = _pow2_at_most(n, threads)
    inv_n = te.const(1.0 / n, x.dtype)
    safe = lambda r, c: x[index(r, te.elem_min(c, n - 1))]  # noqa: E731
    s1 = _combine(_partials(safe, rows, n, T, "sum", "ln_mean"), T, "sum", "ln_mean")
    dev = lambda r, c: (safe(r, c) - s1[r] * inv_n) * (safe(r, c) - s1[r] * inv_n)  # noqa: E731
    s2 = _combine(_partials(dev, rows, n, T, "sum", "ln_var"), T, "sum", "ln_var")
    eps = te.const(epsilon, x.dtype)
    inner = shape[ax:]

    def out(*i):
        r = 0
        for d in range(ax):
            r = r * shape[d] + i[d]
        c = i[ax:]
        y = (x[i] - s1[r] * inv_n) * te.rsqrt(s2[r] * inv_n + eps) * scale[c]
        return y + bias[c] if bias is not None else y
    _ = inner
    return te.compute(shape, out, name="layer_norm", tag="layer_norm_wg", attrs={"wg_lo": ax, "wg_hi": len(shape)})


def schedule_wg(outs):
    """Block per row (the output's axes outside the reduced ones fused), the row's elements over
    the block's threads; partial reductions in shared memory, one per thread, then combined."""
    outs = _as_list(outs)
    s = te.create_schedule([o.op for o in outs])
    inline_all(s, outs)
    out_t = outs[0]
    ost = s[out_t]
    parts = [st for st in _stages(s) if st.op.tag == "wg_partial"]
    combs = [st for st in _stages(s) if st.op.tag == "wg_combine"]
    T = int(parts[0].op.axis[1].dom.extent.value)
    lo, hi = ost.op.attrs["wg_lo"], ost.op.attrs["wg_hi"]
    axes = list(ost.op.axis)
    row_axes, red_axes = axes[:lo] + axes[hi:], axes[lo:hi]
    if row_axes:
        ost.reorder(*row_axes, *red_axes)
    f = ost.fuse(*row_axes) if len(row_axes) > 1 else (row_axes[0] if row_axes else None)
    c = ost.fuse(*red_axes) if len(red_axes) > 1 else red_axes[0]
    if f is None:
        f, c = ost.split(c, nparts=1)   # one row: a unit block axis
    co, ci = ost.split(c, T)
    ost.reorder(f, ci, co)
    ost.bind(f, te.thread_axis("blockIdx.x"))
    ost.bind(ci, te.thread_axis("threadIdx.x"))
    for st in sorted(parts + combs, key=lambda q: s.stages.index(q)):
        st.set_scope("shared")
        st.compute_at(ost, f)
        if st in parts:
            st.bind(st.op.axis[1], te.thread_axis("threadIdx.x"))
    return s


SCHEDULES["wg"] = (schedule_wg, ())


def _wg_check(n: int):
    return None if n >= WG_MIN_ROW else f"rows of {n} elements: one thread per row (schedule_rows) is the better fit"


def _qdense_plain(x, w, b, muls=None, *, in_shift, w_shift, out_shift, layout, mul, out_zp):
    """int8 dense on the unpacked (N, K) weight, int32 accumulation, the library's requantization."""
    return _requant(dense(x, w, b, "int32"), in_shift, w_shift, out_shift, mul, muls, out_zp)


def register() -> None:
    """("op", "cuda") kernels: each op's plain-layout CPU compute with schedule_gpu."""
    if not registry.IMPLS.get(("qdense", "cuda")):
        registry.add_impl("qdense", "cuda", "qdense.gpu", _qdense_plain, schedule_gpu, check=_q_check)
    for (op, target), impls in list(registry.IMPLS.items()):
        if target != "llvm" or registry.IMPLS.get((op, "cuda")):
            continue
        plain = [i for i in sorted(impls, key=lambda i: i.plevel) if not i.prepack]
        if not plain:
            registry.decline(op, "cuda", "its only compute takes pre-packed weights (CPU layout); no GPU kernel")
            continue
        i = plain[0]   # the plain compute (direct conv, not the CPU's specialized layouts)
        registry.add_impl(op, "cuda", f"{i.name}.gpu", i.compute, schedule_gpu, i.plevel, i.check)
    registry.add_impl("softmax", "cuda", "softmax.workgroup", lambda x, *, axis: softmax_wg(x, axis), schedule_gpu,
                      plevel=20, check=lambda shapes, dtypes, attrs: _wg_check(shapes[0][attrs["axis"]]))
    registry.add_impl("layer_norm", "cuda", "layer_norm.workgroup",
                      lambda x, s, b=None, *, axis, epsilon: layer_norm_wg(x, s, b, axis, epsilon), schedule_gpu,
                      plevel=20, check=lambda shapes, dtypes, attrs: _wg_check(math.prod(shapes[0][attrs["axis"]:])))


register()
registry.decline("*", "cuda", "no GPU kernel for this operator; it runs on the CPU")
