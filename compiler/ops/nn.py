"""Compute declarations (te) of the neural-network operators: conv2d (NCHW, grouped, depthwise,
dilated; blocked NCHW[x]c), dense and matmul, pooling, softmax, layer and batch norm.

Attribute names follow the graph IR (compiler.graph.ops): pads are (top, left, bottom, right).
int8 inputs accumulate in int32 (out_dtype); every other dtype accumulates in itself.
Each compute carries a tag (the op it implements) that schedules look for.
"""
from __future__ import annotations

import math

import numpy as np

from .. import te
from ..tir import dtype as dt
from .registry import OpError


def acc_dtype(dtype: str, out_dtype: str | None = None) -> str:
    """int8/uint8 inputs accumulate in int32; others in their own dtype."""
    if out_dtype:
        return out_dtype
    return "int32" if dtype in ("int8", "uint8") else dtype


def _c(x, dtype):
    return x if x.dtype == dtype else x.astype(dtype)


def conv_out_size(size: int, k: int, stride: int, pad_lo: int, pad_hi: int, dilation: int) -> int:
    eff = (k - 1) * dilation + 1
    span = size + pad_lo + pad_hi - eff
    if span < 0:
        raise OpError(f"conv2d: kernel {k} (dilated {eff}) is larger than the padded input {size}+{pad_lo}+{pad_hi}")
    return span // stride + 1


def window_out_hw(H: int, W: int, KH: int, KW: int, strides, pads, dilations) -> tuple[int, int]:
    """(OH, OW) of a convolution window over H x W; pads are (top, left, bottom, right)."""
    return (conv_out_size(H, KH, strides[0], pads[0], pads[2], dilations[0]),
            conv_out_size(W, KW, strides[1], pads[1], pads[3], dilations[1]))


def pad_nchw(data, pads, value=0.0, name="data_pad", axes=(2, 3)):
    """Pad two spatial axes of `data` by (top, left, bottom, right) with `value` (a select, so
    the read is guarded)."""
    pt, pl, pb, pr = pads
    if not any(pads):
        return data
    ya, xa = axes
    shape = list(data.shape)
    H, W = shape[ya], shape[xa]
    shape[ya] += pt + pb
    shape[xa] += pl + pr
    val = te.const(value, data.dtype)

    def f(*idx):
        y, x = idx[ya], idx[xa]
        src = list(idx)
        src[ya], src[xa] = y - pt, x - pl
        conds = []
        if pt:
            conds.append(y >= pt)
        if pb:
            conds.append(y < H + pt)
        if pl:
            conds.append(x >= pl)
        if pr:
            conds.append(x < W + pl)
        return te.select(te.all(*conds), data[tuple(src)], val)
    return te.compute(tuple(shape), f, name=name, tag="injective,pad")


def conv2d(data, weight, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1, out_dtype=None):
    """NCHW x OIHW -> NCHW, any groups (groups == C == O is depthwise)."""
    N, C, H, W = data.shape
    O, Cg, KH, KW = weight.shape
    if C != Cg * groups or O % groups:
        raise OpError(f"conv2d: input channels {C} != weight in-channels {Cg} x groups {groups} "
                      f"(or out channels {O} not divisible by groups)")
    sh, sw = strides
    dh, dw = dilations
    OH, OW = window_out_hw(H, W, KH, KW, strides, pads, dilations)
    acc = acc_dtype(data.dtype, out_dtype)
    dp = pad_nchw(data, pads)
    og = O // groups
    rc = te.reduce_axis(Cg, "rc")
    ry = te.reduce_axis(KH, "ry")
    rx = te.reduce_axis(KW, "rx")
    if groups == 1:
        def f(n, o, y, x):
            return te.sum(_c(dp[n, rc, y * sh + ry * dh, x * sw + rx * dw], acc) * _c(weight[o, rc, ry, rx], acc),
                          axis=[rc, ry, rx])
    else:
        def f(n, o, y, x):
            return te.sum(_c(dp[n, (o // og) * Cg + rc, y * sh + ry * dh, x * sw + rx * dw], acc)
                          * _c(weight[o, rc, ry, rx], acc), axis=[rc, ry, rx])
    return te.compute((N, O, OH, OW), f, name="conv2d", tag="conv2d_nchw",
                      attrs={"groups": groups, "depthwise": groups == C == O and Cg == 1})


def guards_rows(pads, dilations) -> bool:
    """Whether a conv skips the kernel rows that fall in its top/bottom padding instead of padding a
    copy: dilated convs (DeepLab's ASPP), where those rows are a large share of the taps (a third
    at dilation 18 on 65 rows) and the padded copy is large."""
    return dilations[0] > 1 and bool(pads[0] or pads[2])


def conv2d_NCHWc(data, kernel, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), out_dtype=None, groups=1):
    """Blocked conv: data (N, C/ic_bn, H, W, ic_bn) x kernel (O/oc_bn, C/groups/ic_bn, KH, KW, ic_bn,
    oc_bn) -> (N, O/oc_bn, OH, OW, oc_bn). The reduction over input channels is split into the block
    index and the lane, so no index needs a division. With groups (blocks inside groups), output
    block oc reads the input blocks of its group, oc // (output blocks per group). Where
    guards_rows, the top/bottom padding is a condition on the reduction (a kernel row outside the
    input adds nothing, and is skipped), not rows of the padded copy."""
    N, CO, H, W, icb = data.shape
    OCO, CO2, KH, KW, icb2, ocb = kernel.shape
    if CO != CO2 * groups or icb != icb2 or OCO % groups:
        raise OpError(f"conv2d_NCHWc: data channel blocks {CO}x{icb} != kernel's {CO2}x{icb2} x {groups} "
                      f"group(s) (or {OCO} output blocks do not split into the groups)")
    ob_per_g = OCO // groups
    sh, sw = strides
    dh, dw = dilations
    OH, OW = window_out_hw(H, W, KH, KW, strides, pads, dilations)
    acc = acc_dtype(data.dtype, out_dtype)
    rows = guards_rows(pads, dilations)
    pt = pads[0] if rows else 0
    dp = pad_nchw(data, (0, pads[1], 0, pads[3]) if rows else pads, axes=(2, 3))
    ico = te.reduce_axis(CO2, "ico")
    ici = te.reduce_axis(icb, "ici")
    ry = te.reduce_axis(KH, "ry")
    rx = te.reduce_axis(KW, "rx")

    def cblock(oc):
        return ico if groups == 1 else oc // ob_per_g * CO2 + ico

    def f(n, oc, y, x, ob):
        row = y * sh + ry * dh - pt
        term = _c(dp[n, cblock(oc), row, x * sw + rx * dw, ici], acc) * _c(kernel[oc, ico, ry, rx, ici, ob], acc)
        return te.sum(term, axis=[ico, ry, rx, ici], where=te.all(row >= 0, row < H) if rows else None)
    return te.compute((N, OCO, OH, OW, ocb), f, name="conv2d_NCHWc", tag="conv2d_NCHWc")


def depthwise_conv2d_NCHWc(data, kernel, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), out_dtype=None):
    """Blocked depthwise conv: data (N, C', H, W, c) x kernel (C', KH, KW, c) -> (N, C', OH, OW, c).
    Each lane is its own channel, so the c lanes are one vector and the window is the only
    reduction (no shuffles, unlike NCHW depthwise, which vectorizes over strided pixels)."""
    N, CB, H, W, bn = data.shape
    CB2, KH, KW, bn2 = kernel.shape
    if (CB, bn) != (CB2, bn2):
        raise OpError(f"depthwise_conv2d_NCHWc: data channel blocks {CB}x{bn} != kernel's {CB2}x{bn2}")
    sh, sw = strides
    dh, dw = dilations
    OH, OW = window_out_hw(H, W, KH, KW, strides, pads, dilations)
    acc = acc_dtype(data.dtype, out_dtype)
    dp = pad_nchw(data, pads, axes=(2, 3))
    ry = te.reduce_axis(KH, "ry")
    rx = te.reduce_axis(KW, "rx")
    return te.compute(
        (N, CB, OH, OW, bn),
        lambda n, c, y, x, lane: te.sum(_c(dp[n, c, y * sh + ry * dh, x * sw + rx * dw, lane], acc)
                                        * _c(kernel[c, ry, rx, lane], acc), axis=[ry, rx]),
        name="depthwise_NCHWc", tag="depthwise_NCHWc")


def pack_depthwise_kernel_np(w, bn: int):
    """Depthwise (C, 1, KH, KW) -> (C/bn, KH, KW, bn) (numpy), for weights bound at compile time."""
    C, _, KH, KW = w.shape
    return np.ascontiguousarray(w.reshape(C // bn, bn, KH, KW).transpose(0, 2, 3, 1))


def pack_nchwc(data, bn: int, pads=(0, 0, 0, 0), name="data_vec", strides=None):
    """NCHW -> NCHW[bn]c, with spatial zero padding folded into the copy; with strides (only
    without padding) every stride-th pixel is kept (a 1x1 strided conv reads nothing else)."""
    N, C, H, W = data.shape
    if C % bn:
        raise OpError(f"pack_nchwc: channels {C} not divisible by the block {bn}")
    if strides is not None and strides != (1, 1):
        sh, sw = strides
        return te.compute((N, C // bn, (H - 1) // sh + 1, (W - 1) // sw + 1, bn),
                          lambda n, co, y, x, ci: data[n, co * bn + ci, y * sh, x * sw],
                          name=name, tag="injective,pack")
    pt, pl, pb, pr = pads
    zero = te.const(0, data.dtype)

    def f(n, co, y, x, ci):
        v = data[n, co * bn + ci, y - pt, x - pl] if any(pads) else data[n, co * bn + ci, y, x]
        if not any(pads):
            return v
        return te.select(te.all(y >= pt, y < H + pt, x >= pl, x < W + pl), v, zero)
    return te.compute((N, C // bn, H + pt + pb, W + pl + pr, bn), f, name=name, tag="injective,pack")


def unpack_nchwc(data, name="unpack"):
    """NCHW[bn]c -> NCHW."""
    N, CO, H, W, bn = data.shape
    return te.compute((N, CO * bn, H, W), lambda n, c, y, x: data[n, c // bn, y, x, c % bn],
                      name=name, tag="injective,unpack")


def pack_kernel_oihwio(weight, ic_bn: int, oc_bn: int, name="kernel_vec"):
    """OIHW -> OIHW[ic_bn]i[oc_bn]o (te)."""
    O, C, KH, KW = weight.shape
    return te.compute((O // oc_bn, C // ic_bn, KH, KW, ic_bn, oc_bn),
                      lambda oo, co, y, x, ci, ob: weight[oo * oc_bn + ob, co * ic_bn + ci, y, x],
                      name=name, tag="injective,pack")


def pack_kernel_np(w, ic_bn: int, oc_bn: int):
    """OIHW -> OIHW[ic_bn]i[oc_bn]o (numpy), for weights bound at compile time."""
    O, C, KH, KW = w.shape
    return w.reshape(O // oc_bn, oc_bn, C // ic_bn, ic_bn, KH, KW).transpose(0, 2, 4, 5, 3, 1).copy()


def conv2d_via_nchwc(data, weight, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1,
                     out_dtype=None, ic_bn=16, oc_bn=16, kernel_packed=False):
    """NCHW conv2d computed in NCHW[x]c as TVM's x86 conv2d: pack the (padded) input, the kernel
    unless it comes packed (kernel_packed: weight is already OIHW[i]i[o]o), convolve, unpack."""
    if groups < 1 or data.shape[1] % groups or (data.shape[1] // groups) % ic_bn:
        raise OpError(f"conv2d_via_nchwc: {data.shape[1]} channels in {groups} group(s) do not split into "
                      f"blocks of {ic_bn}")
    kv = weight if kernel_packed else pack_kernel_oihwio(weight, ic_bn, oc_bn)
    if kv.shape[2:4] == (1, 1) and not any(pads) and tuple(strides) != (1, 1):
        # 1x1 strided: subsample while packing, then a stride-1 conv over 1/(sh*sw) of the input
        dv = pack_nchwc(data, ic_bn, strides=tuple(strides))
        conv = conv2d_NCHWc(dv, kv, (1, 1), (0, 0, 0, 0), dilations, out_dtype, groups)
    elif guards_rows(pads, dilations):   # the pack pads the columns, the conv guards the rows
        dv = pack_nchwc(data, ic_bn, (0, pads[1], 0, pads[3]))
        conv = conv2d_NCHWc(dv, kv, strides, (pads[0], 0, pads[2], 0), dilations, out_dtype, groups)
    else:
        dv = pack_nchwc(data, ic_bn, pads)
        conv = conv2d_NCHWc(dv, kv, strides, (0, 0, 0, 0), dilations, out_dtype, groups)
    return unpack_nchwc(conv, name="conv2d")


def dense(data, weight, bias=None, out_dtype=None):
    """y = x @ w.T (+ b): data (M, K), weight (N, K)."""
    M, K = data.shape
    N, K2 = weight.shape
    if K != K2:
        raise OpError(f"dense: data has K={K} but weight has K={K2}")
    acc = acc_dtype(data.dtype, out_dtype)
    k = te.reduce_axis(K, "k")
    out = te.compute((M, N), lambda i, j: te.sum(_c(data[i, k], acc) * _c(weight[j, k], acc), axis=k),
                     name="dense", tag="dense")
    if bias is not None:
        out = te.compute((M, N), lambda i, j: out[i, j] + _c(bias[j], acc), name="dense_bias",
                         tag="injective,bias")
    return out


def pack_dense_weight_np(w, bn: int):
    """(N, K) -> (ceil(N/bn), K, bn), zero-padded to whole blocks."""
    N, K = w.shape
    n2 = -(-N // bn)
    wp = np.zeros((n2 * bn, K), w.dtype)
    wp[:N] = w
    return wp.reshape(n2, bn, K).transpose(0, 2, 1).copy()


def dense_packed(data, wpack, n_out: int, bias=None, out_dtype=None):
    """dense with the weight packed as (N/bn, K, bn): the inner bn outputs are contiguous, so the
    vectorized loop reads the weight with stride 1. The padded columns are cropped by the
    output stage (which also adds the bias)."""
    M, K = data.shape
    NB, K2, bn = wpack.shape
    if K != K2:
        raise OpError(f"dense: data has K={K} but the packed weight has K={K2}")
    acc = acc_dtype(data.dtype, out_dtype)
    k = te.reduce_axis(K, "k")
    cp = te.compute((M, NB, bn), lambda i, jo, ji: te.sum(_c(data[i, k], acc) * _c(wpack[jo, k, ji], acc), axis=k),
                    name="dense_pack", tag="dense_pack")
    if bias is None:
        f = lambda i, j: cp[i, j // bn, j % bn]  # noqa: E731
    else:
        f = lambda i, j: cp[i, j // bn, j % bn] + _c(bias[j], acc)  # noqa: E731
    return te.compute((M, n_out), f, name="dense", tag="injective,unpack")


def batch_matmul(a, b, out_dtype=None):
    """(B, M, K) x (B, K, N) -> (B, M, N); a batch of 1 on either side broadcasts."""
    Ba, M, K = a.shape
    Bb, K2, N = b.shape
    if K != K2 or (Ba != Bb and 1 not in (Ba, Bb)):
        raise OpError(f"batch_matmul: cannot multiply {list(a.shape)} by {list(b.shape)}")
    B = max(Ba, Bb)
    acc = acc_dtype(a.dtype, out_dtype)
    k = te.reduce_axis(K, "k")

    def f(bb, i, j):
        ia = bb if Ba > 1 else 0
        ib = bb if Bb > 1 else 0
        return te.sum(_c(a[ia, i, k], acc) * _c(b[ib, k, j], acc), axis=k)
    return te.compute((B, M, N), f, name="batch_matmul", tag="batch_matmul")


def matmul(a, b, out_dtype=None):
    """numpy matmul for 2-d and 3-d operands (batch dims broadcast)."""
    if a.ndim == 2 and b.ndim == 2:
        M, K = a.shape
        K2, N = b.shape
        if K != K2:
            raise OpError(f"matmul: cannot multiply {list(a.shape)} by {list(b.shape)}")
        acc = acc_dtype(a.dtype, out_dtype)
        k = te.reduce_axis(K, "k")
        return te.compute((M, N), lambda i, j: te.sum(_c(a[i, k], acc) * _c(b[k, j], acc), axis=k),
                          name="matmul", tag="matmul")
    if a.ndim == 3 and b.ndim == 3:
        return batch_matmul(a, b, out_dtype)
    raise OpError(f"matmul: supports 2-d x 2-d and 3-d x 3-d, got {list(a.shape)} x {list(b.shape)}")


# ---------------------------------------------------------------- pooling

def pool_out_size(size, k, s, lo, hi, ceil_mode):
    span = size + lo + hi - k
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= size + lo:
        o -= 1
    if o < 1:
        raise OpError(f"pool: kernel {k} larger than the padded input {size}+{lo}+{hi}")
    return o


def pool2d(data, kernel, strides=(1, 1), pads=(0, 0, 0, 0), ceil_mode=0, pool_type="max",
           count_include_pad=0):
    """max/avg pooling over NCHW; out-of-input taps are -inf (max) or excluded from the mean
    (count_include_pad=0) / counted as zeros up to the explicit padding (count_include_pad=1)."""
    N, C, H, W = data.shape
    kh, kw = kernel
    sh, sw = strides
    pt, pl, pb, pr = pads
    OH = pool_out_size(H, kh, sh, pt, pb, ceil_mode)
    OW = pool_out_size(W, kw, sw, pl, pr, ceil_mode)
    ry = te.reduce_axis(kh, "ry")
    rx = te.reduce_axis(kw, "rx")
    dtype = data.dtype

    def inside(y, x):
        return te.all(y >= 0, y < H, x >= 0, x < W)

    if pool_type == "max":
        low = te.min_value(dtype)

        def f(n, c, oy, ox):
            y, x = oy * sh + ry - pt, ox * sw + rx - pl
            return te.max(te.select(inside(y, x), data[n, c, y, x], low), axis=[ry, rx])
        return te.compute((N, C, OH, OW), f, name="max_pool2d", tag="pool_max")
    if pool_type != "avg":
        raise OpError(f"pool2d: pool_type must be 'max' or 'avg', got {pool_type!r}")
    acc = acc_dtype(dtype)
    zero = te.const(0, acc)

    def s(n, c, oy, ox):
        y, x = oy * sh + ry - pt, ox * sw + rx - pl
        return te.sum(te.select(inside(y, x), _c(data[n, c, y, x], acc), zero), axis=[ry, rx])
    total = te.compute((N, C, OH, OW), s, name="avg_pool2d_sum", tag="pool_sum")

    def count(o, st, k, size, lo, hi):
        start = o * st - lo
        if count_include_pad:
            end = te.elem_min(start + k, size + hi)
            return end - start
        return te.elem_min(start + k, size) - te.elem_max(start, 0)

    def avg(n, c, oy, ox):
        cnt = count(oy, sh, kh, H, pt, pb) * count(ox, sw, kw, W, pl, pr)
        if dt.is_float(dtype):
            return total[n, c, oy, ox] / cnt.astype(dtype)
        return _c(total[n, c, oy, ox] // cnt, dtype)
    return te.compute((N, C, OH, OW), avg, name="avg_pool2d", tag="injective,pool_avg")


def pool2d_nchwc(data, kernel, strides=(1, 1), pads=(0, 0, 0, 0), ceil_mode=0, pool_type="max",
                 count_include_pad=0):
    """pool2d over a blocked N C' H W c input (the channel lanes last, so a window tap is one
    vector); the same window rules as pool2d."""
    N, CO, H, W, cb = data.shape
    kh, kw = kernel
    sh, sw = strides
    pt, pl, pb, pr = pads
    OH = pool_out_size(H, kh, sh, pt, pb, ceil_mode)
    OW = pool_out_size(W, kw, sw, pl, pr, ceil_mode)
    ry = te.reduce_axis(kh, "ry")
    rx = te.reduce_axis(kw, "rx")
    dtype = data.dtype
    shape = (N, CO, OH, OW, cb)

    def tap(n, c, oy, ox, ci, fill):
        y, x = oy * sh + ry - pt, ox * sw + rx - pl
        v = data[n, c, y, x, ci]
        conds = [e for e, need in ((y >= 0, pt), (y < H, pb or ceil_mode), (x >= 0, pl), (x < W, pr or ceil_mode))
                 if need]
        return te.select(te.all(*conds), v, fill) if conds else v

    if pool_type == "max":
        low = te.min_value(dtype)
        return te.compute(shape, lambda n, c, oy, ox, ci: te.max(tap(n, c, oy, ox, ci, low), axis=[ry, rx]),
                          name="max_pool2d", tag="pool_max,nchwc")
    if pool_type != "avg":
        raise OpError(f"pool2d_nchwc: pool_type must be 'max' or 'avg', got {pool_type!r}")
    acc = acc_dtype(dtype)
    total = te.compute(shape, lambda n, c, oy, ox, ci: te.sum(_c(tap(n, c, oy, ox, ci, te.const(0, dtype)), acc),
                                                              axis=[ry, rx]),
                       name="avg_pool2d_sum", tag="pool_sum,nchwc")

    def count(o, st, k, size, lo, hi):
        start = o * st - lo
        if count_include_pad:
            return te.elem_min(start + k, size + hi) - start
        return te.elem_min(start + k, size) - te.elem_max(start, 0)

    def avg(n, c, oy, ox, ci):
        cnt = count(oy, sh, kh, H, pt, pb) * count(ox, sw, kw, W, pl, pr)
        if dt.is_float(dtype):
            return total[n, c, oy, ox, ci] / cnt.astype(dtype)
        return _c(total[n, c, oy, ox, ci] // cnt, dtype)
    return te.compute(shape, avg, name="avg_pool2d", tag="injective,pool_avg")


def global_pool2d(data, pool_type="avg"):
    """Mean or max over H, W keeping the dims: (N, C, 1, 1)."""
    N, C, H, W = data.shape
    ry = te.reduce_axis(H, "ry")
    rx = te.reduce_axis(W, "rx")
    if pool_type == "max":
        return te.compute((N, C, 1, 1), lambda n, c, a, b: te.max(data[n, c, ry, rx], axis=[ry, rx]),
                          name="global_max_pool", tag="pool_max")
    acc = acc_dtype(data.dtype)
    s = te.compute((N, C, 1, 1), lambda n, c, a, b: te.sum(_c(data[n, c, ry, rx], acc), axis=[ry, rx]),
                   name="global_pool_sum", tag="pool_sum")
    if dt.is_float(data.dtype):
        inv = te.const(1.0 / (H * W), data.dtype)
        return te.compute((N, C, 1, 1), lambda n, c, a, b: s[n, c, a, b] * inv,
                          name="global_avg_pool", tag="injective,pool_avg")
    return te.compute((N, C, 1, 1), lambda n, c, a, b: _c(s[n, c, a, b] // (H * W), data.dtype),
                      name="global_avg_pool", tag="injective,pool_avg")


# ---------------------------------------------------------------- normalization

def _norm_axis(axis, ndim, what):
    if not -ndim <= axis < ndim:
        raise OpError(f"{what}: axis {axis} out of range for rank {ndim}")
    return axis % ndim


def softmax(x, axis=-1):
    """exp(x - max) / sum(exp(x - max)) along one axis."""
    ax = _norm_axis(axis, x.ndim, "softmax")
    shape = x.shape
    red_shape = tuple(1 if d == ax else n for d, n in enumerate(shape))

    def at(idx, r):
        i = list(idx)
        i[ax] = r
        return tuple(i)
    k1 = te.reduce_axis(shape[ax], "k1")
    mx = te.compute(red_shape, lambda *i: te.max(x[at(i, k1)], axis=k1), name="softmax_max", tag="softmax_max")
    k2 = te.reduce_axis(shape[ax], "k2")
    ex = te.compute(shape, lambda *i: te.exp(x[i] - mx[at(i, 0)]), name="softmax_exp", tag="softmax_exp")
    sm = te.compute(red_shape, lambda *i: te.sum(ex[at(i, k2)], axis=k2), name="softmax_sum", tag="softmax_sum")
    return te.compute(shape, lambda *i: ex[i] / sm[at(i, 0)], name="softmax", tag="softmax")


def _lane_sums(f, outer, inner, lanes: int, combiner, ident, name: str):
    """combiner over every index r of the `inner` shape of f(o, r), for each outer index o, as
    `lanes` partial results (partial[o, l] over the last inner index ko * lanes + l and all the
    others) then one short combine: a reduction along contiguous rows whose inner loop is a
    vector, with no rfactor primitive. Indices past the last axis read `ident`."""
    *lead, n = inner
    rs = [te.reduce_axis(m, f"{name}_r{d}") for d, m in enumerate(lead)]
    ko = te.reduce_axis(-(-n // lanes), f"{name}_ko")

    def part(*i):
        o, k = i[:-1], ko * lanes + i[-1]
        v = f(o, tuple(rs) + (k,))
        return combiner(v if n % lanes == 0 else te.select(k < n, v, ident), axis=rs + [ko])
    p = te.compute(tuple(outer) + (lanes,), part, name=f"{name}_part", tag="row_part")
    t = te.reduce_axis(lanes, f"{name}_l")
    return te.compute(tuple(outer), lambda *o: combiner(p[tuple(o) + (t,)], axis=t), name=name, tag="row_combine")


def softmax_rows(x, lanes: int):
    """softmax over the last axis of a rank >= 2 tensor: the row's max and sum as lane-partial
    reductions (_lane_sums), exp once per element into a row buffer that the sum and the
    scaling read."""
    *outer, n = x.shape
    dtype = x.dtype
    mx = _lane_sums(lambda o, k: x[o + k], outer, (n,), lanes, te.max, te.min_value(dtype), "softmax_max")
    ex = te.compute(x.shape, lambda *i: te.exp(x[i] - mx[i[:-1]]), name="softmax_exp", tag="row_map")
    sm = _lane_sums(lambda o, k: ex[o + k], outer, (n,), lanes, te.sum, te.const(0, dtype), "softmax_sum")
    inv = te.compute(tuple(outer), lambda *o: te.const(1, dtype) / sm[o], name="softmax_inv", tag="row_combine")
    return te.compute(x.shape, lambda *i: ex[i] * inv[i[:-1]], name="softmax", tag="softmax_rows")


def layer_norm_rows(x, scale, bias=None, axis=-1, epsilon=1e-5, lanes: int = 8):
    """layer_norm over axes [axis, rank) with axis >= 1 (two-pass: mean, then variance) with
    lane-partial sums along the last axis: LayerNormalization rows, InstanceNormalization planes."""
    ax = _norm_axis(axis, x.ndim, "layer_norm")
    outer, inner = tuple(x.shape[:ax]), tuple(x.shape[ax:])
    if tuple(scale.shape) != inner:
        raise OpError(f"layer_norm: scale shape {list(scale.shape)} != normalized shape {list(inner)}")
    dtype = x.dtype
    zero, inv_n = te.const(0, dtype), te.const(1.0 / math.prod(inner), dtype)
    total = _lane_sums(lambda o, r: x[o + r], outer, inner, lanes, te.sum, zero, "ln_sum")
    mean = te.compute(outer, lambda *o: total[o] * inv_n, name="ln_mean", tag="row_combine")

    def sq(o, r):
        d = x[o + r] - mean[o]
        return d * d
    var = _lane_sums(sq, outer, inner, lanes, te.sum, zero, "ln_var")
    eps = te.const(epsilon, dtype)
    rstd = te.compute(outer, lambda *o: te.rsqrt(var[o] * inv_n + eps), name="ln_rstd", tag="row_combine")

    def out(*i):
        o, r = i[:ax], i[ax:]
        y = (x[i] - mean[o]) * rstd[o] * scale[r]
        return y + bias[r] if bias is not None else y
    return te.compute(x.shape, out, name="layer_norm", tag="layer_norm_rows")


def layer_norm(x, scale, bias=None, axis=-1, epsilon=1e-5):
    """Normalize over axes [axis, rank) (two-pass: mean, then variance), * scale + bias; scale and
    bias have the normalized axes' shape."""
    ax = _norm_axis(axis, x.ndim, "layer_norm")
    inner = x.shape[ax:]
    if tuple(scale.shape) != tuple(inner):
        raise OpError(f"layer_norm: scale shape {list(scale.shape)} != normalized shape {list(inner)}")
    outer = x.shape[:ax]
    cnt = int(math.prod(inner))
    dtype = x.dtype
    inv_n = te.const(1.0 / cnt, dtype)

    def reds(prefix):
        return [te.reduce_axis(n, f"{prefix}{d}") for d, n in enumerate(inner)]
    r1 = reds("r")
    mean = te.compute(outer or (1,), lambda *o: te.sum(x[tuple(o[:len(outer)]) + tuple(r1)], axis=r1),
                      name="ln_sum", tag="ln_sum")   # the sum; scaled by 1/n where read
    r2 = reds("q")

    def var_f(*o):
        oo = tuple(o[:len(outer)])
        d = x[oo + tuple(r2)] - mean[o] * inv_n
        return te.sum(d * d, axis=r2)
    var = te.compute(outer or (1,), var_f, name="ln_var", tag="ln_var")
    eps = te.const(epsilon, dtype)

    def out_f(*i):
        o, r = i[:ax], i[ax:]
        oi = o if outer else (0,)
        y = (x[i] - mean[oi] * inv_n) * te.rsqrt(var[oi] * inv_n + eps) * scale[r]
        return y + bias[r] if bias is not None else y
    return te.compute(x.shape, out_f, name="layer_norm", tag="layer_norm")


def batch_norm(x, scale, bias, mean, var, epsilon=1e-5):
    """Inference batch norm over axis 1: (x - mean) / sqrt(var + eps) * scale + bias."""
    C = x.shape[1]
    for t, nm in ((scale, "scale"), (bias, "bias"), (mean, "mean"), (var, "var")):
        if tuple(t.shape) != (C,):
            raise OpError(f"batch_norm: {nm} has shape {list(t.shape)}, expected [{C}]")
    eps = te.const(epsilon, x.dtype)
    return te.compute(x.shape, lambda *i: (x[i] - mean[i[1]]) * (scale[i[1]] * te.rsqrt(var[i[1]] + eps))
                      + bias[i[1]], name="batch_norm", tag="injective,batch_norm")


# ---------------------------------------------------------------- pointwise / depthwise (NCHW, flat pixels)

def conv2d_pointwise(data, weight, strides=(1, 1), out_dtype=None, groups=1):
    """1x1 conv as a dense over pixels: data (N, C, H, W) x weight (O, C/groups) (or OIHW with
    1x1) -> (N, O, OH, OW). The reduction runs over a flat pixel axis p = y * OW + x
    ("conv2d_pointwise", (N, O, OH*OW)), so a schedule vectorizes contiguous pixels whatever the
    width; a strided conv first subsamples the input ("injective,pack"). With groups, output
    channel o reads input channels of group o // (O/groups) (attrs["groups"] tells the schedule
    to keep a tile of output channels inside one group)."""
    N, C, H, W = data.shape
    w2 = weight if weight.ndim == 2 else None
    O = weight.shape[0]
    if (groups < 1 or C % groups or O % groups or weight.shape[1] != C // groups
            or (weight.ndim == 4 and tuple(weight.shape[2:]) != (1, 1))):
        raise OpError(f"conv2d_pointwise: weight {list(weight.shape)} does not match {C} input channels "
                      f"in {groups} group(s), 1x1")
    Cg, Og = C // groups, O // groups
    sh, sw = strides
    if (sh, sw) != (1, 1):
        OH, OW = (H - 1) // sh + 1, (W - 1) // sw + 1
        data = te.compute((N, C, OH, OW), lambda n, c, y, x: data[n, c, y * sh, x * sw],
                          name="data_sub", tag="injective,pack")
    else:
        OH, OW = H, W
    acc = acc_dtype(data.dtype, out_dtype)
    rc = te.reduce_axis(Cg, "rc")

    def wt(o, c):
        return w2[o, c] if w2 is not None else weight[o, c, 0, 0]

    def cin(o):
        return rc if groups == 1 else o // Og * Cg + rc
    flat = te.compute((N, O, OH * OW), lambda n, o, p: te.sum(
        _c(data[n, cin(o), p // OW, p % OW], acc) * _c(wt(o, rc), acc), axis=rc),
        name="conv2d_pw", tag="conv2d_pointwise", attrs={"groups": groups})
    return te.compute((N, O, OH, OW), lambda n, o, y, x: flat[n, o, y * OW + x],
                      name="conv2d", tag="injective,unflatten")


def depthwise_geometry(H, W, KH, KW, strides, pads):
    """(OH, OW, Hh, P): output size, and the rows / pitch of each of the s*s phase planes."""
    sh, sw = strides
    OH = conv_out_size(H, KH, sh, pads[0], pads[2], 1)
    OW = conv_out_size(W, KW, sw, pads[1], pads[3], 1)
    Hp, Wp = H + pads[0] + pads[2], W + pads[1] + pads[3]
    P = max(-(-Wp // sw), OW + (KW - 1) // sw)
    Hh = max(-(-Hp // sh), OH + (KH - 1) // sh) + 1      # one spare row: garbage columns read past a row
    return OH, OW, Hh, P


def depthwise_conv2d_flat(data, weight, strides=(1, 1), pads=(0, 0, 0, 0), out_dtype=None):
    """Depthwise conv (groups == C == O, multiplier 1, no dilation), NCHW x (C, 1, KH, KW).

    The padded input is split into s_h x s_w phase planes (space-to-depth; one plane when stride 1)
    of pitch P, so every tap of every output pixel is one flat, stride-1 offset: the accumulation
    ("depthwise_flat", (N, C, OH*P)) runs over q = y*P + x and vectorizes over contiguous memory
    whatever the width; the P - OW columns past each row are computed and dropped."""
    N, C, H, W = data.shape
    O, one, KH, KW = weight.shape
    if O != C or one != 1:
        raise OpError(f"depthwise_conv2d_flat: weight {list(weight.shape)} is not depthwise for {C} channels")
    sh, sw = strides
    OH, OW, Hh, P = depthwise_geometry(H, W, KH, KW, strides, pads)
    pt, pl = pads[0], pads[1]
    zero = te.const(0, data.dtype)

    def fpad(n, c, py, px, i, j):
        y, x = i * sh + py - pt, j * sw + px - pl
        return te.select(te.all(y >= 0, y < H, x >= 0, x < W), data[n, c, y, x], zero)
    planes = te.compute((N, C, sh, sw, Hh, P), fpad, name="data_phase", tag="injective,pad")
    acc = acc_dtype(data.dtype, out_dtype)
    ry = te.reduce_axis(KH, "ry")
    rx = te.reduce_axis(KW, "rx")

    def f(n, c, q):
        r = q + (ry // sh) * P + rx // sw
        return te.sum(_c(planes[n, c, ry % sh, rx % sw, r // P, r % P], acc) * _c(weight[c, 0, ry, rx], acc),
                      axis=[ry, rx])
    flat = te.compute((N, C, OH * P), f, name="depthwise_flat", tag="depthwise_flat")
    return te.compute((N, C, OH, OW), lambda n, c, y, x: flat[n, c, y * P + x],
                      name="conv2d", tag="injective,unflatten")


# ---------------------------------------------------------------- reductions / LRN

#: the te reducer of each reduce kind (mean sums, then scales)
_REDUCERS = {"sum": te.sum, "mean": te.sum, "max": te.max, "min": te.min, "prod": te.prod}


def reduce(x, axes=None, keepdims=1, kind="sum"):
    """sum / mean / max of x over `axes` (None: all), keeping them as 1s when keepdims; float
    only (the graph IR's reductions are float ops)."""
    if not dt.is_float(x.dtype):
        raise OpError(f"reduce_{kind}: float input only, got {x.dtype}")
    if kind not in _REDUCERS:
        raise OpError(f"reduce: kind must be one of {', '.join(_REDUCERS)}, got {kind!r}")
    rank = x.ndim
    axes = tuple(range(rank)) if axes is None else tuple(sorted({_norm_axis(a, rank, f"reduce_{kind}")
                                                                 for a in axes}))
    red = [te.reduce_axis(x.shape[a], f"r{a}") for a in axes]
    out_shape = tuple(1 if a in axes else n for a, n in enumerate(x.shape)) if keepdims else \
        tuple(n for a, n in enumerate(x.shape) if a not in axes)

    def index(o):
        it, rit = iter(o), iter(red)
        idx = []
        for a in range(rank):
            if a in axes:
                if keepdims:
                    next(it)
                idx.append(next(rit))
            else:
                idx.append(next(it))
        return tuple(idx)
    red_fn = _REDUCERS[kind]
    total = te.compute(out_shape, lambda *o: red_fn(x[index(o)], axis=red), name=f"reduce_{kind}",
                       tag=f"reduce_{kind}")
    if kind != "mean":
        return total
    inv = te.const(1.0 / math.prod(x.shape[a] for a in axes), x.dtype)
    return te.compute(out_shape, lambda *o: total[o] * inv, name="reduce_mean", tag="injective,reduce_mean")


def arg_reduce(x, axis, keepdims, select_last_index, kind):
    """ONNX ArgMax/ArgMin: the extreme along `axis`, then the first (or last) index holding it, as
    two reductions; int64 indices."""
    if dt.is_bool(x.dtype):
        raise OpError(f"arg{kind}: numeric input only, got bool")
    rank = x.ndim
    ax = _norm_axis(axis, rank, f"arg{kind}")
    n = x.shape[ax]
    r1, r2 = te.reduce_axis(n, "r"), te.reduce_axis(n, "k")
    kept = tuple(d for a, d in enumerate(x.shape) if a != ax)

    def at(o, k):
        return x[tuple(o[:ax]) + (k,) + tuple(o[ax:])]
    extreme = te.compute(kept, lambda *o: _REDUCERS[kind](at(o, r1), axis=r1), name=f"arg{kind}_value",
                         tag=f"reduce_{kind}")
    # the last index holding it is the largest (positions elsewhere count as -1), the first the
    # smallest (elsewhere n)
    pick, elsewhere = (te.max, -1) if select_last_index else (te.min, n)
    k64 = r2.var.astype("int64")
    idx = te.compute(kept, lambda *o: pick(te.select(at(o, r2) == extreme[o], k64, te.const(elsewhere, "int64")),
                                           axis=r2), name=f"arg{kind}", tag=f"reduce_arg{kind}")
    if not keepdims:
        return idx
    return te.compute(tuple(1 if a == ax else d for a, d in enumerate(x.shape)),
                      lambda *o: idx[tuple(o[:ax]) + tuple(o[ax + 1:])], name=f"arg{kind}_keepdims",
                      tag="injective,keepdims")


def lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    """ONNX LRN across channels (axis 1): x / (bias + alpha/size * sum of x^2 over the window
    [c - floor((size-1)/2), c + ceil((size-1)/2)]) ** beta."""
    if not dt.is_float(x.dtype):
        raise OpError(f"lrn: float input only, got {x.dtype}")
    C = x.shape[1]
    before = (size - 1) // 2
    r = te.reduce_axis(size, "rc")
    zero = te.const(0.0, x.dtype)

    def sq(*i):
        c = i[1] + r - before
        v = x[(i[0], c) + tuple(i[2:])]
        return te.sum(te.select(te.all(c >= 0, c < C), v * v, zero), axis=r)
    ssum = te.compute(x.shape, sq, name="lrn_sqsum", tag="lrn_sqsum")
    k, a, b = (te.const(v, x.dtype) for v in (bias, alpha / size, beta))

    def denom(d):
        """d ** beta; the usual betas by square roots (vector instructions) instead of pow (a libm
        call per element)."""
        if beta == 0.75:
            r = te.sqrt(d)
            return r * te.sqrt(r)
        if beta == 0.5:
            return te.sqrt(d)
        if beta == 1.0:
            return d
        return te.power(d, b)
    return te.compute(x.shape, lambda *i: x[i] / denom(k + a * ssum[i]), name="lrn", tag="lrn")
