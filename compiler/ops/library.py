"""The operator table: every op's attributes (the graph IR's names) and its CPU implementations.

Each `add_impl` line pairs a compute (te, from nn / elemwise / transform) with a schedule (cpu);
`check` says why an implementation declines a signature; `prepack` transforms an input bound as
a constant at compile time (a weight's layout) once, in numpy.
"""
from __future__ import annotations

import numpy as np

from .. import te
from . import cpu, elemwise as ew, nn, transform as tf
from .registry import REQUIRED, OpError, add_impl, decline, define

CONV = {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1), "groups": 1, "out_dtype": None}
POOL = {"kernel": REQUIRED, "strides": (1, 1), "pads": (0, 0, 0, 0), "ceil_mode": 0}
QSHIFTS = {"in_shift": REQUIRED, "w_shift": REQUIRED, "out_shift": REQUIRED, "mul": 1, "out_zp": 0}


def _bias_nchw(out, bias):
    if bias is None:
        return out
    return te.compute(out.shape, lambda n, c, y, x: out[n, c, y, x] + nn._c(bias[c], out.dtype),
                      name="bias_add", tag="injective,bias")


# ---------------------------------------------------------------- conv2d
define("conv2d", CONV, (2, 3), "2-D convolution, NCHW x OIHW (+ bias O)", onnx="Conv")


def _conv_direct(data, weight, bias=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1,
                 out_dtype=None):
    return _bias_nchw(nn.conv2d(data, weight, strides, pads, dilations, groups, out_dtype), bias)


def _conv_nchwc_blocks(shapes, dtypes):
    """(ic_bn, oc_bn) from the unpacked signature: data NCHW, weight OIHW."""
    return cpu.conv_blocks(shapes[0][1], shapes[1][0], dtypes[0])


def _conv_nchwc(data, weight, bias=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1,
                out_dtype=None, kernel_packed=False):
    C = data.shape[1]
    if kernel_packed:
        ic_bn, oc_bn = weight.shape[4], weight.shape[5]
    else:
        ic_bn, oc_bn = cpu.conv_blocks(C, weight.shape[0], data.dtype)
    out = nn.conv2d_via_nchwc(data, weight, strides, pads, dilations, groups, out_dtype, ic_bn, oc_bn,
                              kernel_packed=kernel_packed)
    return _bias_nchw(out, bias)


def _conv_nchwc_check(shapes, dtypes, attrs):
    if attrs["groups"] != 1:
        return f"groups={attrs['groups']} (the blocked layout needs groups == 1; the direct schedule handles groups)"
    ic, oc = _conv_nchwc_blocks(shapes, dtypes)
    if oc < 4:
        return f"output channels {shapes[1][0]} have no block of 4 or more lanes"
    return None


def _conv_prepack(w, shapes, dtypes, attrs):
    ic, oc = _conv_nchwc_blocks(shapes, dtypes)
    return nn.pack_kernel_np(w, ic, oc), {"kernel_packed": True}


def _float_check(dtypes):
    if any(d not in ("float32", "float64") for d in dtypes):
        return f"float inputs only (got {', '.join(dtypes)}); int8 convs take the blocked/direct paths"
    return None


def _conv_pw(data, weight, bias=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1,
             out_dtype=None, kernel_packed=False):
    return _bias_nchw(nn.conv2d_pointwise(data, weight, strides, out_dtype), bias)


def _conv_pw_check(shapes, dtypes, attrs):
    w = shapes[1]
    if attrs["groups"] != 1 or tuple(w[2:]) != (1, 1) or any(attrs["pads"]):
        return "not a 1x1, unpadded, groups=1 conv"
    return _float_check(dtypes)


def _conv_pw_prepack(w, shapes, dtypes, attrs):
    return w.reshape(w.shape[0], w.shape[1]), {"kernel_packed": True}


def _conv_dw(data, weight, bias=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1,
             out_dtype=None):
    return _bias_nchw(nn.depthwise_conv2d_flat(data, weight, strides, pads, out_dtype), bias)


def _conv_dw_check(shapes, dtypes, attrs):
    C, (O, Cg, KH, KW) = shapes[0][1], shapes[1]
    if not (attrs["groups"] == C == O and Cg == 1):
        return "not depthwise (groups == channels == outputs)"
    if tuple(attrs["dilations"]) != (1, 1):
        return f"dilations {attrs['dilations']} (the flat-plane form needs 1)"
    if max(attrs["strides"]) > 4:
        return f"strides {attrs['strides']} (one phase plane per stride^2)"
    return _float_check(dtypes)


add_impl("conv2d", "llvm", "conv2d_nchw.pointwise", _conv_pw, cpu.schedule_conv2d_pointwise, plevel=30,
         check=_conv_pw_check, prepack={1: _conv_pw_prepack})
add_impl("conv2d", "llvm", "conv2d_nchw.depthwise", _conv_dw, cpu.schedule_depthwise_flat, plevel=30,
         check=_conv_dw_check)
add_impl("conv2d", "llvm", "conv2d_nchw.nchwc", _conv_nchwc, cpu.schedule_conv2d_NCHWc, plevel=20,
         check=_conv_nchwc_check, prepack={1: _conv_prepack})
add_impl("conv2d", "llvm", "conv2d_nchw.direct", _conv_direct, cpu.schedule_conv2d_nchw, plevel=10)

define("conv2d_NCHWc", {k: v for k, v in CONV.items() if k != "groups"}, 2,
       "blocked conv2d: (N, C/ic, H, W, ic) x (O/oc, C/ic, KH, KW, ic, oc) -> (N, O/oc, OH, OW, oc)")
add_impl("conv2d_NCHWc", "llvm", "conv2d_NCHWc.x86", nn.conv2d_NCHWc, cpu.schedule_conv2d_NCHWc)


# ---------------------------------------------------------------- dense / matmul
define("dense", {"out_dtype": None}, (2, 3), "y = x @ w.T (+ b); x (M, K), w (N, K)", onnx="Gemm")


def _dense_pack(data, weight, bias=None, out_dtype=None, weight_packed=False, n_out=None):
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


def _dense_direct(data, weight, bias=None, out_dtype=None):
    return nn.dense(data, weight, bias, out_dtype)


add_impl("dense", "llvm", "dense.pack", _dense_pack, cpu.schedule_dense_pack, plevel=20,
         prepack={1: _dense_prepack})
add_impl("dense", "llvm", "dense.direct", _dense_direct, cpu.schedule_reduce, plevel=5)

define("matmul", {"out_dtype": None}, 2, "numpy matmul of 2-d or 3-d (batched) operands", onnx="MatMul")
add_impl("matmul", "llvm", "matmul.tiled", lambda a, b, out_dtype=None: nn.matmul(a, b, out_dtype),
         cpu.schedule_matmul)
define("batch_matmul", {"out_dtype": None}, 2, "(B, M, K) x (B, K, N) -> (B, M, N)", onnx="MatMul")
add_impl("batch_matmul", "llvm", "batch_matmul.tiled",
         lambda a, b, out_dtype=None: nn.batch_matmul(a, b, out_dtype), cpu.schedule_matmul)


# ---------------------------------------------------------------- pooling
define("max_pool2d", POOL, 1, "2-D max pooling, NCHW", onnx="MaxPool")
add_impl("max_pool2d", "llvm", "max_pool2d.generic",
         lambda x, **a: nn.pool2d(x, a["kernel"], a["strides"], a["pads"], a["ceil_mode"], "max"),
         cpu.schedule_pool)
define("avg_pool2d", {**POOL, "count_include_pad": 0}, 1, "2-D average pooling, NCHW", onnx="AveragePool")
add_impl("avg_pool2d", "llvm", "avg_pool2d.generic",
         lambda x, **a: nn.pool2d(x, a["kernel"], a["strides"], a["pads"], a["ceil_mode"], "avg",
                                  a["count_include_pad"]), cpu.schedule_pool)
define("global_avg_pool", {}, 1, "mean over H, W keeping dims", onnx="GlobalAveragePool")
add_impl("global_avg_pool", "llvm", "global_avg_pool.generic", lambda x: nn.global_pool2d(x, "avg"),
         cpu.schedule_pool)
define("global_max_pool", {}, 1, "max over H, W keeping dims", onnx="GlobalMaxPool")
add_impl("global_max_pool", "llvm", "global_max_pool.generic", lambda x: nn.global_pool2d(x, "max"),
         cpu.schedule_pool)


# ---------------------------------------------------------------- normalization
define("softmax", {"axis": -1}, 1, "softmax along one axis", onnx="Softmax")
add_impl("softmax", "llvm", "softmax.generic", lambda x, axis=-1: nn.softmax(x, axis), cpu.schedule_reduce)
define("layer_norm", {"axis": -1, "epsilon": 1e-5}, (2, 3), "normalize over [axis, rank), * scale + bias",
       onnx="LayerNormalization")
add_impl("layer_norm", "llvm", "layer_norm.generic",
         lambda x, s, b=None, axis=-1, epsilon=1e-5: nn.layer_norm(x, s, b, axis, epsilon), cpu.schedule_reduce)
define("lrn", {"size": REQUIRED, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}, 1,
       "local response normalization across channels", onnx="LRN")
add_impl("lrn", "llvm", "lrn.generic", lambda x, **a: nn.lrn(x, **a), cpu.schedule_reduce)
for _kind in ("sum", "mean", "max"):
    define(f"reduce_{_kind}", {"axes": None, "keepdims": 1}, 1, f"{_kind} over axes (None: all)",
           onnx=f"Reduce{_kind.capitalize()}")
    add_impl(f"reduce_{_kind}", "llvm", f"reduce_{_kind}.generic",
             lambda x, axes=None, keepdims=1, kind=_kind: nn.reduce(x, axes, keepdims, kind), cpu.schedule_reduce)
define("batch_norm", {"epsilon": 1e-5}, 5, "inference batch norm over axis 1", onnx="BatchNormalization")
add_impl("batch_norm", "llvm", "batch_norm.injective",
         lambda x, s, b, m, v, epsilon=1e-5: nn.batch_norm(x, s, b, m, v, epsilon), cpu.schedule_injective)


# ---------------------------------------------------------------- elementwise
_UNARY = {
    "relu": (ew.relu, {}, "Relu"), "sigmoid": (ew.sigmoid, {}, "Sigmoid"), "tanh": (ew.tanh, {}, "Tanh"),
    "exp": (ew.exp, {}, "Exp"), "sqrt": (ew.sqrt, {}, "Sqrt"), "neg": (ew.neg, {}, "Neg"),
    "reciprocal": (ew.reciprocal, {}, "Reciprocal"), "erf": (ew.erf, {}, "Erf"),
    "abs": (ew.abs_, {}, "Abs"), "log": (ew.log, {}, "Log"),
    "gelu": (ew.gelu, {"approximate": "none"}, "Gelu"),
    "leaky_relu": (ew.leaky_relu, {"alpha": 0.01}, "LeakyRelu"),
    "clip": (ew.clip, {"min": None, "max": None}, "Clip"),
    "cast": (ew.cast, {"to": REQUIRED}, "Cast"),
    "quantize": (ew.quantize, {"shift": 0, "scale": 0.0, "zero_point": 0}, None),
    "dequantize": (ew.dequantize, {"shift": 0, "scale": 0.0, "zero_point": 0}, None),
    "requantize": (ew.requantize, {"in_shift": REQUIRED, "out_shift": REQUIRED, "mul": 1}, None),
}
for _name, (_fn, _attrs, _onnx) in _UNARY.items():
    define(_name, _attrs, 1, (_fn.__doc__ or _name).strip().split("\n")[0], onnx=_onnx)
    add_impl(_name, "llvm", f"{_name}.injective", _fn, cpu.schedule_injective)

_BINARY = {"add": (ew.add, "Add"), "sub": (ew.sub, "Sub"), "mul": (ew.mul, "Mul"), "div": (ew.div, "Div"),
           "pow": (ew.pow, "Pow"), "maximum": (ew.maximum, "Max"), "minimum": (ew.minimum, "Min")}
for _name, (_fn, _onnx) in _BINARY.items():
    define(_name, {}, 2, f"numpy-broadcasting {_name}", onnx=_onnx)
    add_impl(_name, "llvm", f"{_name}.injective", _fn, cpu.schedule_injective)
define("qadd", {"a_shift": REQUIRED, "b_shift": REQUIRED, "out_shift": REQUIRED, "a_mul": 0, "b_mul": 0}, 2,
       "int8 + int8 at power-of-two scales (or fixed-point multipliers) -> int8")
add_impl("qadd", "llvm", "qadd.injective", ew.qadd, cpu.schedule_injective)


# ---------------------------------------------------------------- quantized conv / dense
def _requant(acc, in_shift, w_shift, out_shift, mul, muls=None, out_zp=0):
    """qconv2d/qdense's requantization (compiler.graph.ops.requant_acc); muls: per-channel multipliers."""
    if muls is not None:
        return ew.requantize_per_channel(acc, muls, in_shift + w_shift - out_shift, zero_point=out_zp)
    if mul != 1:  # fixed point: the rounding is explicit
        return ew.requantize(acc, in_shift + w_shift, out_shift, rounding=True, mul=mul, zero_point=out_zp)
    return ew.requantize(acc, in_shift + w_shift, out_shift, rounding=False, zero_point=out_zp)  # half in b


def _qconv(x, w, b, muls=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1, in_shift=0,
           w_shift=0, out_shift=0, layout="NCHW", mul=1, out_zp=0):
    acc = nn.conv2d(x, w, strides, pads, dilations, groups, "int32")
    acc = _bias_nchw(acc, b)
    return _requant(acc, in_shift, w_shift, out_shift, mul, muls, out_zp)


def _qconv_nchwc(x, w, b, muls=None, strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), groups=1, in_shift=0,
                 w_shift=0, out_shift=0, layout="NCHW", kernel_packed=False, mul=1, out_zp=0):
    acc = _conv_nchwc(x, w, b, strides, pads, dilations, groups, "int32", kernel_packed)
    return _requant(acc, in_shift, w_shift, out_shift, mul, muls, out_zp)


def _q_check(shapes, dtypes, attrs):
    if attrs.get("layout", "NCHW") not in ("NCHW", "NC"):
        return (f"layout {attrs['layout']} (blocked NCHWnc/NCnc) is the accelerator's; compiler.accel "
                "lowers it")
    if tuple(dtypes) not in (("int8", "int8", "int32"), ("int8", "int8", "int32", "int64")):
        return f"expects int8 input, int8 weight, int32 bias (and int64 multipliers); got {', '.join(dtypes)}"
    return None


def _qconv_nchwc_check(shapes, dtypes, attrs):
    return _q_check(shapes, dtypes, attrs) or _conv_nchwc_check(shapes, dtypes, attrs)


define("qconv2d", {**{k: v for k, v in CONV.items() if k != "out_dtype"}, **QSHIFTS, "layout": "NCHW"}, (3, 4),
       "int8 conv, int32 accumulation + bias (holding the rounding half), SHR (in_shift + w_shift - out_shift), CLIP [-127, 127]")
add_impl("qconv2d", "llvm", "qconv2d.nchwc", _qconv_nchwc, cpu.schedule_conv2d_NCHWc, plevel=20,
         check=_qconv_nchwc_check, prepack={1: _conv_prepack})
add_impl("qconv2d", "llvm", "qconv2d.direct", _qconv, cpu.schedule_conv2d_nchw, check=_q_check)


def _qdense(x, w, b, muls=None, in_shift=0, w_shift=0, out_shift=0, layout="NC", weight_packed=False, n_out=None,
            mul=1, out_zp=0):
    acc = _dense_pack(x, w, b, "int32", weight_packed, n_out)
    return _requant(acc, in_shift, w_shift, out_shift, mul, muls, out_zp)


define("qdense", {**QSHIFTS, "layout": "NC"}, (3, 4), "int8 dense, int32 accumulation + bias, SHR, CLIP")
add_impl("qdense", "llvm", "qdense.pack", _qdense, cpu.schedule_dense_pack, check=_q_check,
         prepack={1: _dense_prepack})


# ---------------------------------------------------------------- data movement
define("reshape", {"shape": REQUIRED}, 1, "reshape to a static shape", onnx="Reshape")
add_impl("reshape", "llvm", "reshape.injective", tf.reshape, cpu.schedule_injective)
define("transpose", {"perm": REQUIRED}, 1, "permute axes", onnx="Transpose")
add_impl("transpose", "llvm", "transpose.injective", tf.transpose, cpu.schedule_injective)
define("concat", {"axis": REQUIRED}, (1, 1 << 16), "concatenate along one axis", onnx="Concat")
add_impl("concat", "llvm", "concat.injective", tf.concat, cpu.schedule_injective)
define("pad", {"pads": REQUIRED, "mode": "constant", "value": 0.0}, 1,
       "pads = (begins, ends) as ONNX; constant, reflect, edge", onnx="Pad")
add_impl("pad", "llvm", "pad.injective", tf.pad, cpu.schedule_injective)
define("slice", {"starts": REQUIRED, "ends": REQUIRED, "axes": REQUIRED, "steps": REQUIRED}, 1,
       "strided slice (graph IR: starts/ends normalized)", onnx="Slice")
add_impl("slice", "llvm", "slice.injective", tf.strided_slice, cpu.schedule_injective)
define("layout_transform", {"src_layout": REQUIRED, "dst_layout": REQUIRED}, 1, "NCHW <-> NCHW<n>c")
add_impl("layout_transform", "llvm", "layout_transform.injective",
         lambda x, src_layout, dst_layout: tf.layout_transform(x, src_layout, dst_layout), cpu.schedule_injective)


# ---------------------------------------------------------------- other targets
decline("*", "vta", "accelerator operators are lowered by compiler.accel (int8 conv2d, dense, add in the "
                    "packed layout); this library provides their CPU fallback under target 'llvm'")

_ = (np, OpError)
