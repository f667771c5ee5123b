"""The CPU kernels (target kind "llvm") of the ops declared in compiler.graph.ops.

Each `add_impl` line pairs a compute (te, from nn / elemwise / transform) with a schedule (cpu);
`check` says why a kernel declines a signature; `prepack` transforms an input bound as a constant
at compile time (a weight's layout) once, in numpy. Attributes, their defaults and allowed values
come from the op's declaration; a compute takes each of them as a keyword, with no default of its
own (the only defaults are the schema's). Keywords after them (kernel_packed, ...) come from prepack.
"""
from __future__ import annotations

import numpy as np

from .. import te
from . import cpu, nn
from . import elemwise as ew
from . import transform as tf
from .registry import add_impl, decline


def _bias_nchw(out, bias):
    if bias is None:
        return out
    return te.compute(out.shape, lambda n, c, y, x: out[n, c, y, x] + nn._c(bias[c], out.dtype),
                      name="bias_add", tag="injective,bias")


# ---------------------------------------------------------------- conv2d


def _conv_direct(data, weight, bias=None, *, strides, pads, dilations, groups, out_dtype=None):
    return _bias_nchw(nn.conv2d(data, weight, strides, pads, dilations, groups, out_dtype), bias)


def _conv_nchwc_blocks(shapes, dtypes, groups=1):
    """(ic_bn, oc_bn) from the unpacked signature: data NCHW, weight OIHW (I = C / groups); the
    blocks divide one group's channels."""
    return cpu.conv_blocks(shapes[1][1], shapes[1][0] // groups, dtypes[0])


def _conv_nchwc(data, weight, bias=None, *, strides, pads, dilations, groups, out_dtype=None, kernel_packed=False):
    if kernel_packed:
        ic_bn, oc_bn = weight.shape[4], weight.shape[5]
    else:
        ic_bn, oc_bn = cpu.conv_blocks(weight.shape[1], weight.shape[0] // groups, data.dtype)
    out = nn.conv2d_via_nchwc(data, weight, strides, pads, dilations, groups, out_dtype, ic_bn, oc_bn,
                              kernel_packed=kernel_packed)
    return _bias_nchw(out, bias)


def _conv_nchwc_check(shapes, dtypes, attrs):
    g = attrs["groups"]
    if g != 1 and (shapes[1][1] < 2 or shapes[0][1] % g or shapes[1][0] % g):
        return f"groups={g} with {shapes[1][1]} input channel(s) per group (depthwise/direct take those)"
    ic, oc = _conv_nchwc_blocks(shapes, dtypes, g)
    if oc < 4:
        return f"output channels {shapes[1][0]} have no block of 4 or more lanes"
    return None


def _conv_prepack(w, shapes, dtypes, attrs):
    ic, oc = _conv_nchwc_blocks(shapes, dtypes, attrs["groups"])
    return nn.pack_kernel_np(w, ic, oc), {"kernel_packed": True}


def _float_check(dtypes):
    if any(d not in ("float32", "float64") for d in dtypes):
        return f"float inputs only (got {', '.join(dtypes)}); int8 convs take the blocked/direct paths"
    return None


def _conv_pw(data, weight, bias=None, *, strides, pads, dilations, groups, out_dtype=None, kernel_packed=False):
    return _bias_nchw(nn.conv2d_pointwise(data, weight, strides, out_dtype, groups), bias)


def _conv_pw_check(shapes, dtypes, attrs):
    w = shapes[1]
    g = attrs["groups"]
    if tuple(w[2:]) != (1, 1) or any(attrs["pads"]):
        return "not a 1x1, unpadded conv"
    if g != 1 and (w[1] < 2 or shapes[0][1] % g or w[0] % g):
        return f"groups={g} with {w[1]} input channel(s) per group (depthwise takes 1)"
    return _float_check(dtypes)


def _conv_pw_prepack(w, shapes, dtypes, attrs):
    return w.reshape(w.shape[0], w.shape[1]), {"kernel_packed": True}


def _conv_dw(data, weight, bias=None, *, strides, pads, dilations, groups, out_dtype=None):
    return _bias_nchw(nn.depthwise_conv2d_flat(data, weight, strides, pads, out_dtype), bias)


#: the flat depthwise form's largest window (a global average pool as an int8 depthwise conv, a
#: 112x112 window, took 586 s to compile unrolled and would compute 112 columns to keep one)
DW_FLAT_MAX_TAPS = 64


def _dw_shape_check(shapes, attrs):
    """None if the flat phase-plane form (nn.depthwise_conv2d_flat) computes this conv, else why not."""
    C, (O, Cg, _, _) = shapes[0][1], shapes[1]
    if not (attrs["groups"] == C == O and Cg == 1):
        return "not depthwise (groups == channels == outputs)"
    if tuple(attrs["dilations"]) != (1, 1):
        return f"dilations {attrs['dilations']} (the flat-plane form needs 1)"
    if max(attrs["strides"]) > 4:
        return f"strides {attrs['strides']} (one phase plane per stride^2)"
    if shapes[1][2] * shapes[1][3] > DW_FLAT_MAX_TAPS:
        return (f"a {shapes[1][2]}x{shapes[1][3]} window (the flat form unrolls its taps and computes whole rows: "
                f"at most {DW_FLAT_MAX_TAPS} taps)")
    return None


def _conv_dw_check(shapes, dtypes, attrs):
    return _dw_shape_check(shapes, attrs) or _float_check(dtypes)


add_impl("conv2d", "llvm", "conv2d_nchw.pointwise", _conv_pw, cpu.schedule_conv2d_pointwise, plevel=30,
         check=_conv_pw_check, prepack={1: _conv_pw_prepack})
add_impl("conv2d", "llvm", "conv2d_nchw.depthwise", _conv_dw, cpu.schedule_depthwise_flat, plevel=30,
         check=_conv_dw_check)
add_impl("conv2d", "llvm", "conv2d_nchw.nchwc", _conv_nchwc, cpu.schedule_conv2d_NCHWc, plevel=20,
         check=_conv_nchwc_check, prepack={1: _conv_prepack})
add_impl("conv2d", "llvm", "conv2d_nchw.direct", _conv_direct, cpu.schedule_conv2d_nchw, plevel=10)

add_impl("depthwise_conv2d_NCHWc", "llvm", "depthwise_NCHWc.x86",
         lambda x, w, *, strides, pads, dilations: nn.depthwise_conv2d_NCHWc(x, w, strides, pads, dilations),
         cpu.schedule_depthwise_NCHWc)
add_impl("conv2d_NCHWc", "llvm", "conv2d_NCHWc.x86",
         lambda x, w, *, strides, pads, dilations, groups: nn.conv2d_NCHWc(x, w, strides, pads, dilations,
                                                                           groups=groups),
         cpu.schedule_conv2d_NCHWc)


# ---------------------------------------------------------------- dense / matmul


def _dense_pack(data, weight, bias=None, *, out_dtype=None, weight_packed=False, n_out=None):
    M, K = data.shape
    if weight_packed:
        wp = weight
    else:
        N = weight.shape[0]
        _, bn = cpu.dense_block(M, N)
        nb = -(-N // bn)
        zero = te.const(0, weight.dtype)
        wp = te.compute((nb, K, bn), lambda jo, k, ji: te.select(jo * bn + ji < N, weight[te.elem_min(jo * bn + ji, N - 1), k], zero)
                        if N % bn else weight[jo * bn + ji, k], name="weight_pack", tag="injective,pack")
        n_out = N
    return nn.dense_packed(data, wp, n_out, bias, out_dtype)


def _dense_prepack(w, shapes, dtypes, attrs):
    M, N = shapes[0][0], shapes[1][0]
    _, bn = cpu.dense_block(M, N)
    return nn.pack_dense_weight_np(w, bn), {"weight_packed": True, "n_out": N}


def _dense_direct(data, weight, bias=None, *, out_dtype=None):
    return nn.dense(data, weight, bias, out_dtype)


add_impl("dense", "llvm", "dense.pack", _dense_pack, cpu.schedule_dense_pack, plevel=20,
         prepack={1: _dense_prepack})
add_impl("dense", "llvm", "dense.direct", _dense_direct, cpu.schedule_reduce, plevel=5)

add_impl("matmul", "llvm", "matmul.tiled", lambda a, b: nn.matmul(a, b),
         cpu.schedule_matmul)


# ---------------------------------------------------------------- pooling
add_impl("max_pool2d", "llvm", "max_pool2d.generic",
         lambda x, **a: nn.pool2d(x, a["kernel"], a["strides"], a["pads"], a["ceil_mode"], "max"),
         cpu.schedule_pool)
add_impl("avg_pool2d", "llvm", "avg_pool2d.generic",
         lambda x, **a: nn.pool2d(x, a["kernel"], a["strides"], a["pads"], a["ceil_mode"], "avg",
                                  a["count_include_pad"]), cpu.schedule_pool)


def _blocked_check(shapes, dtypes, attrs):
    return None if len(shapes[0]) == 5 else "not a blocked N C' H W c input"


add_impl("max_pool2d", "llvm", "max_pool2d.nchwc",
         lambda x, **a: nn.pool2d_nchwc(x, a["kernel"], a["strides"], a["pads"], a["ceil_mode"], "max"),
         cpu.schedule_pool_nchwc, plevel=20, check=_blocked_check)
add_impl("avg_pool2d", "llvm", "avg_pool2d.nchwc",
         lambda x, **a: nn.pool2d_nchwc(x, a["kernel"], a["strides"], a["pads"], a["ceil_mode"], "avg",
                                        a["count_include_pad"]), cpu.schedule_pool_nchwc, plevel=20,
         check=_blocked_check)
add_impl("global_avg_pool", "llvm", "global_avg_pool.generic", lambda x: nn.global_pool2d(x, "avg"),
         cpu.schedule_pool)
add_impl("global_max_pool", "llvm", "global_max_pool.generic", lambda x: nn.global_pool2d(x, "max"),
         cpu.schedule_pool)


# ---------------------------------------------------------------- normalization
add_impl("softmax", "llvm", "softmax.generic", lambda x, *, axis: nn.softmax(x, axis), cpu.schedule_reduce)
add_impl("layer_norm", "llvm", "layer_norm.generic",
         lambda x, s, b=None, *, axis, epsilon: nn.layer_norm(x, s, b, axis, epsilon), cpu.schedule_reduce)


def _rows_check(last_only: bool):
    def check(shapes, dtypes, attrs):
        rank = len(shapes[0])
        ax = attrs["axis"] % rank if rank else 0
        if rank < 2 or ax == 0 or (last_only and ax != rank - 1):
            return ("not a reduction over the last axis of a rank >= 2 tensor" if last_only
                    else "not a reduction over trailing axes after at least one outer axis")
        return None if dtypes[0].startswith("float") else f"{dtypes[0]} input"
    return check


add_impl("softmax", "llvm", "softmax.rows", lambda x, *, axis: nn.softmax_rows(x, cpu.lanes(x.dtype)),
         cpu.schedule_rows, plevel=20, check=_rows_check(last_only=True))
add_impl("layer_norm", "llvm", "layer_norm.rows",
         lambda x, s, b=None, *, axis, epsilon: nn.layer_norm_rows(x, s, b, axis, epsilon, cpu.lanes(x.dtype)),
         cpu.schedule_rows, plevel=20, check=_rows_check(last_only=False))
add_impl("lrn", "llvm", "lrn.generic", lambda x, **a: nn.lrn(x, **a), cpu.schedule_lrn)
for _kind in ("sum", "mean", "max", "min", "prod"):
    add_impl(f"reduce_{_kind}", "llvm", f"reduce_{_kind}.generic",
             lambda x, *, axes, keepdims, kind=_kind: nn.reduce(x, axes, keepdims, kind), cpu.schedule_reduce)
for _kind in ("max", "min"):
    add_impl(f"arg{_kind}", "llvm", f"arg{_kind}.generic",
             lambda x, *, axis, keepdims, select_last_index, kind=_kind: nn.arg_reduce(
                 x, axis, keepdims, select_last_index, kind), cpu.schedule_reduce)
add_impl("batch_norm", "llvm", "batch_norm.injective",
         lambda x, s, b, m, v, *, epsilon: nn.batch_norm(x, s, b, m, v, epsilon), cpu.schedule_injective)


# ---------------------------------------------------------------- elementwise
_UNARY = {"relu": ew.relu, "sigmoid": ew.sigmoid, "tanh": ew.tanh, "exp": ew.exp, "sqrt": ew.sqrt, "neg": ew.neg,
          "reciprocal": ew.reciprocal, "erf": ew.erf, "abs": ew.abs_, "log": ew.log, "gelu": ew.gelu,
          "leaky_relu": ew.leaky_relu, "clip": ew.clip, "cast": ew.cast, "quantize": ew.quantize,
          "dequantize": ew.dequantize, "requantize": ew.requantize, "floor": ew.floor, "ceil": ew.ceil,
          "round": ew.round_, "sign": ew.sign, "sin": ew.sin, "cos": ew.cos, "logical_not": ew.logical_not}
_BINARY = {"add": ew.add, "sub": ew.sub, "mul": ew.mul, "div": ew.div, "pow": ew.pow, "maximum": ew.maximum,
           "minimum": ew.minimum, "where": ew.where, "mod": ew.mod, **ew.COMPARE}
for _name, _fn in {**_UNARY, **_BINARY}.items():
    add_impl(_name, "llvm", f"{_name}.injective", _fn, cpu.schedule_injective)
add_impl("qadd", "llvm", "qadd.injective", ew.qadd, cpu.schedule_injective)


# ---------------------------------------------------------------- quantized conv / dense
def _requant(acc, in_shift, w_shift, out_shift, mul, muls, out_zp):
    """qconv2d/qdense's requantization (compiler.graph.ops.requant_acc); muls: per-channel multipliers."""
    if muls is not None:
        return ew.requantize_per_channel(acc, muls, in_shift + w_shift - out_shift, zero_point=out_zp)
    if mul != 1:  # fixed point: the rounding is explicit
        return ew.requantize(acc, in_shift + w_shift, out_shift, rounding=True, mul=mul, zero_point=out_zp)
    return ew.requantize(acc, in_shift + w_shift, out_shift, rounding=False, zero_point=out_zp)  # half in b


def _qconv(x, w, b, muls=None, *, strides, pads, dilations, groups, in_shift, w_shift, out_shift, layout, mul,
           out_zp):
    acc = nn.conv2d(x, w, strides, pads, dilations, groups, "int32")
    acc = _bias_nchw(acc, b)
    return _requant(acc, in_shift, w_shift, out_shift, mul, muls, out_zp)


def _qconv_nchwc(x, w, b, muls=None, *, strides, pads, dilations, groups, in_shift, w_shift, out_shift, layout,
                 mul, out_zp, kernel_packed=False):
    acc = _conv_nchwc(x, w, b, strides=strides, pads=pads, dilations=dilations, groups=groups, out_dtype="int32",
                      kernel_packed=kernel_packed)
    return _requant(acc, in_shift, w_shift, out_shift, mul, muls, out_zp)


def _q_check(shapes, dtypes, attrs):
    if attrs["layout"] not in ("NCHW", "NC"):
        return (f"layout {attrs['layout']} (blocked NCHWnc/NCnc) is the accelerator's; compiler.accel "
                "lowers it")
    if tuple(dtypes) not in (("int8", "int8", "int32"), ("int8", "int8", "int32", "int64")):
        return f"expects int8 input, int8 weight, int32 bias (and int64 multipliers); got {', '.join(dtypes)}"
    return None


def _qconv_nchwc_check(shapes, dtypes, attrs):
    return _q_check(shapes, dtypes, attrs) or _conv_nchwc_check(shapes, dtypes, attrs)


def _qconv_dw(x, w, b, muls=None, *, strides, pads, dilations, groups, in_shift, w_shift, out_shift, layout, mul,
              out_zp):
    acc = _bias_nchw(nn.depthwise_conv2d_flat(x, w, strides, pads, "int32"), b)
    return _requant(acc, in_shift, w_shift, out_shift, mul, muls, out_zp)


def _qconv_dw_check(shapes, dtypes, attrs):
    return _q_check(shapes, dtypes, attrs) or _dw_shape_check(shapes, attrs)


add_impl("qconv2d", "llvm", "qconv2d.depthwise", _qconv_dw, cpu.schedule_depthwise_flat, plevel=30,
         check=_qconv_dw_check)
add_impl("qconv2d", "llvm", "qconv2d.nchwc", _qconv_nchwc, cpu.schedule_conv2d_NCHWc, plevel=20,
         check=_qconv_nchwc_check, prepack={1: _conv_prepack})
add_impl("qconv2d", "llvm", "qconv2d.direct", _qconv, cpu.schedule_conv2d_nchw, check=_q_check)


def _qdense(x, w, b, muls=None, *, in_shift, w_shift, out_shift, layout, mul, out_zp, weight_packed=False,
            n_out=None):
    acc = _dense_pack(x, w, b, out_dtype="int32", weight_packed=weight_packed, n_out=n_out)
    return _requant(acc, in_shift, w_shift, out_shift, mul, muls, out_zp)


add_impl("qdense", "llvm", "qdense.pack", _qdense, cpu.schedule_dense_pack, check=_q_check,
         prepack={1: _dense_prepack})


# ---------------------------------------------------------------- data movement
add_impl("reshape", "llvm", "reshape.injective", tf.reshape, cpu.schedule_injective)
add_impl("transpose", "llvm", "transpose.injective", tf.transpose, cpu.schedule_injective)
add_impl("concat", "llvm", "concat.injective", tf.concat, cpu.schedule_concat)
add_impl("pad", "llvm", "pad.injective", tf.pad, cpu.schedule_injective)
add_impl("slice", "llvm", "slice.injective", tf.strided_slice, cpu.schedule_injective)


def _take_check(shapes, dtypes, attrs):
    idx = np.asarray(attrs["indices"])
    if idx.ndim == 0:
        return None
    if tf.affine_floor(idx % shapes[0][attrs["axis"] % len(shapes[0])]) is None:
        return "indices with no affine-floor form (a * i + b) // c"
    return None


add_impl("take", "llvm", "take.affine", lambda x, *, indices, axis: tf.take(
    x, np.asarray(indices) % x.shape[axis % x.ndim], axis), cpu.schedule_injective, check=_take_check)
add_impl("layout_transform", "llvm", "layout_transform.injective",
         lambda x, src_layout, dst_layout: tf.layout_transform(x, src_layout, dst_layout), cpu.schedule_layout_transform)
add_impl("pack", "llvm", "pack.injective", lambda x, block: tf.pack_blocked(x, block), cpu.schedule_layout_transform)
add_impl("unpack", "llvm", "unpack.injective", lambda x, shape: tf.unpack_blocked(x, shape), cpu.schedule_unpack_blocked)


# ---------------------------------------------------------------- other targets
decline("*", "vta", "accelerator operators are lowered by compiler.accel (int8 conv2d, dense, add in the "
                    "packed layout); this library provides their CPU fallback under target 'llvm'")
