"""onnxruntime's QOperator format (quantize_static(..., quant_format=QuantFormat.QOperator)):
QLinearConv, QLinearMatMul, QGemm, QLinearAdd/Mul, QLinearGlobalAveragePool, QLinearAveragePool,
QLinearConcat, QLinearSoftmax, QLinearLeakyRelu, QLinearSigmoid, and the
QuantizeLinear/DequantizeLinear that frame them.

Each QLinear op imports as the QDQ form of the same arithmetic, which is what the rest of the
compiler already runs in int8 without a float round trip: its quantized inputs as
dequantize_linear, its int8 weights and int32 bias as dequantize_linear of constants (folded to
the weight scales, graph.meta['weight_scales']), the float op made by the plain op's converter, and
a quantize_linear/dequantize_linear pair carrying the output's scale and zero point. The
import_qdq pass strips the pairs and the quantize pass turns each layer back into qconv2d/qdense/
qadd with the model's own int8 weights, bias and scales (fixed-point SCALE/REQUANT where a scale
is not a power of two, zero points folded into the bias).

A quantized tensor is represented at import by its dequantized value (a dequantize_linear of the
quantize_linear that made it), so the ops onnxruntime leaves on integers (MaxPool, Reshape,
Flatten, Transpose, Slice, Split, nearest Resize...) import with the float converters and stay
exact on int8; a QLinear op whose input is not the dequantized value at its own parameters
rounds it to them first (as onnxruntime's integer result of such an op is).

Against onnxruntime on the same QOperator model (max |difference| in output units, int8/uint8,
symmetric/asymmetric, per-tensor/per-channel): 0 on the CNN and MLP of
tests/compiler/frontend/test_qoperator.py and on zoo's conv_bn_relu_pool, residual_block and
depthwise_separable (1 unit in one per-channel symmetric case) and zoo.mlp (QLinearSoftmax); on
zoo.transformer_encoder, whose output is a float LayerNorm, 2e-7 with int8 activations. The layers
requantize with a 24-bit fixed-point multiplier (round half up), onnxruntime in float (round half
to even): ties and the multiplier's last bit can move a value one unit. Ops the quantize pass keeps
in float (asymmetric adds and concats, Mul, Softmax, Sigmoid, average pools) compute from the
model's int8 inputs and round at the model's output scale. Known larger difference: onnxruntime's
linear Resize on int8/uint8 (NCHW) truncates the interpolated integers toward zero where this
import rounds to nearest: 3 units on zoo.upsample_decoder.
"""
from __future__ import annotations

import logging

import numpy as np

from ..graph.ir import Node
from .errors import ConversionError
from .onnx_import import CONVERTERS, _Ctx, _onnx, converter

log = logging.getLogger(__name__)

MS = "com.microsoft"
#: graph ops whose result is exact on the integers at the input's scale and zero point
EXACT_ON_INT = ("max_pool2d", "global_max_pool", "reshape", "transpose", "slice", "take", "relu")

_plain_quantize = CONVERTERS["QuantizeLinear"]
_plain_dequantize = CONVERTERS["DequantizeLinear"]


def _register(*op_types, domain: str = ""):
    """Register under the op type (how from_onnx looks a node up) and, for a contrib domain,
    under domain.op (how check_supported names it)."""
    names = list(op_types) + ([f"{domain}.{t}" for t in op_types] if domain else [])
    return converter(*names)


def _is_float(n: Node) -> bool:
    return n.dtype.startswith("float")


def _qparams(c: _Ctx, ks: int, kz: int, what: str):
    """(scale, zero point or None) of the scale/zero-point inputs at positions ks, kz."""
    s = c.value(ks, f"{what} scale")
    if s is None:
        c.fail(f"{what} scale (input {ks}) is missing")
    s = np.asarray(s)
    if not np.issubdtype(s.dtype, np.floating) or not np.all(s > 0) or not np.all(np.isfinite(s)):
        c.fail(f"{what} scale (input {ks}) must be positive finite floats, got {s.reshape(-1)[:4].tolist()}")
    z = c.value(kz, f"{what} zero point")
    return s, (None if z is None else np.asarray(z))


def _source(x: Node):
    """The dequantize_linear whose value x is, through ops exact on integers, and whether x is it."""
    cur = x
    while cur.op in EXACT_ON_INT:
        cur = cur.inputs[0]
    return (cur if cur.op == "dequantize_linear" and cur.inputs[0].op == "quantize_linear" else None), cur is x


def _params_of(dq: Node):
    s = dq.inputs[1].value if dq.inputs[1].is_const else None
    z = dq.inputs[2].value if len(dq.inputs) == 3 and dq.inputs[2].is_const else None
    return s, z, dq.inputs[0].dtype


def _same(a, b) -> bool:
    if a is None or b is None:
        return (a is None or not np.any(a)) and (b is None or not np.any(b))
    return np.asarray(a).shape == np.asarray(b).shape and np.array_equal(np.asarray(a, np.float64),
                                                                          np.asarray(b, np.float64))


def _pair(c: _Ctx, x: Node, s, z, dtype: str, tag: str, axis: int = 1, deq=None) -> Node:
    """dequantize_linear(quantize_linear(x)): x rounded to (s, z) of `dtype`, as a float value;
    deq: the dequantize's (scale, zero point) where they differ from the quantize's."""
    sc = c.const(np.asarray(s, np.float32), f"{tag}_scale")
    zp = c.const(np.asarray(0 if z is None else z, dtype), f"{tag}_zero_point")
    q = c.add("quantize_linear", [x, sc, zp], {"axis": axis, "dtype": dtype}, suffix=f"{tag}_quantize")
    if deq is not None:
        sc = c.const(np.asarray(deq[0], np.float32), f"{tag}_rescale")
        zp = c.const(np.asarray(0 if deq[1] is None else deq[1], dtype), f"{tag}_rezero_point")
    return c.add("dequantize_linear", [q, sc, zp], {"axis": axis}, suffix=f"{tag}_dequantize")


def _qin(c: _Ctx, k: int, ks: int, kz: int, what: str) -> Node:
    """The float value of quantized activation input k at its scale (input ks) and zero point (kz)."""
    x = c.input(k)
    if x is None:
        c.fail(f"{what} (input {k}) is missing")
    s, z = _qparams(c, ks, kz, what)
    if not _is_float(x):   # an integer tensor of the model itself (a graph input or a constant)
        ins = [x, c.const(s.astype(np.float32), f"{what}_scale")] + \
            ([c.const(z.astype(x.dtype), f"{what}_zero_point")] if z is not None else [])
        return c.add("dequantize_linear", ins, {"axis": 1}, suffix=f"{what}_dequantize")
    src, is_src = _source(x)
    dtype = str(z.dtype) if z is not None else (src.inputs[0].dtype if src is not None else "uint8")
    if src is not None:
        s0, z0, dt0 = _params_of(src)
        if s0 is not None and not (_same(s0, s) and _same(z0, z) and dt0 == dtype):
            # the integers of x, read at other parameters: requantize them at the producer's, read at ours
            return _pair(c, x, s0, z0, dt0, what, deq=(s, z))
        if is_src:
            return x
    return _pair(c, x, s, z, dtype, what)


def _qout(c: _Ctx, y: Node, ks: int, kz: int, dtype: str | None = None) -> Node:
    """y (float) quantized at the output scale (input ks) and zero point (kz), as its float value."""
    s, z = _qparams(c, ks, kz, "output")
    dt = str(z.dtype) if z is not None else (dtype or "uint8")
    if dt not in ("int8", "uint8"):
        c.fail(f"output zero point has type {dt}; only int8 and uint8 activations are supported")
    if s.size != 1:
        c.fail(f"output scale has {s.size} values; only per-tensor activation scales are supported")
    return _pair(c, y, s.reshape(()), None if z is None else z.reshape(()), dt, "output")


def _qweight(c: _Ctx, k: int, ks: int, kz: int, axis: int, what: str = "weight") -> Node:
    """Constant integer weights (input k) at their scale: dequantize_linear of int8 values with no
    zero point (a nonzero one is subtracted here), which fold_constants turns into float weights
    and the weight scale the quantizer recovers the same int8 values from."""
    w = c.input(k)
    if w is None:
        c.fail(f"{what} (input {k}) is missing")
    s, z = _qparams(c, ks, kz, what)
    if _is_float(w):
        return _qin(c, k, ks, kz, what)   # an activation (QLinearMatMul of two activations)
    if not w.is_const:
        return _qin(c, k, ks, kz, what)
    wv = w.value.astype(np.int64)
    ax = axis % max(wv.ndim, 1)
    if s.size > 1 and (wv.ndim == 0 or s.size != wv.shape[ax]):
        c.fail(f"{what} scale has {s.size} values for {wv.shape[ax] if wv.ndim else 1} channels along axis {ax}")
    if z is not None and np.any(z):
        shape = [1] * wv.ndim
        if z.size > 1:
            shape[ax] = -1
        wv = wv - z.astype(np.int64).reshape(shape if z.size > 1 else ())
        lo, hi = int(wv.min(initial=0)), int(wv.max(initial=0))
        if lo < -127 or hi > 127:
            c.fail(f"{what} minus its zero point spans [{lo}, {hi}], outside int8 [-127, 127]: the accelerator "
                   f"multiplies int8 weights; quantize the weights as symmetric int8 (QuantType.QInt8, "
                   f"WeightSymmetric=True)")
    elif int(wv.min(initial=0)) < -127:
        log.info("%s '%s': %s holds -128; it is requantized to fit [-127, 127]", c.onnx_node.op_type,
                 c.node_name, what)
    wq = c.const(wv.astype(np.int8), f"{what}_int8")
    sc = c.const(s.astype(np.float32).reshape(-1) if s.size > 1 else s.astype(np.float32).reshape(()), f"{what}_scale")
    return c.add("dequantize_linear", [wq, sc], {"axis": ax}, suffix=f"{what}_dequantize")


def _qbias(c: _Ctx, k: int, scale: np.ndarray, axis: int = 0) -> Node | None:
    """int32 bias (input k) at scale (per tensor or per output channel) as a float value."""
    b = c.input(k)
    if b is None:
        return None
    if not b.is_const or _is_float(b):
        c.fail(f"bias (input {k}) must be a constant int32 tensor")
    sc = np.asarray(scale, np.float32).reshape(-1)
    sc = c.const(sc.reshape(()) if sc.size == 1 else sc, "bias_scale")
    bq = c.const(b.value.astype(np.int32), "bias_int32")
    return c.add("dequantize_linear", [bq, sc], {"axis": axis}, suffix="bias_dequantize")


def _as(c: _Ctx, op_type: str, inputs: list[Node | None], attrs: dict | None = None, drop: tuple = ()):
    """Run the plain op's converter on float inputs: a stand-in ONNX node with this node's name and
    attributes (less `drop`), its inputs bound to the float values under private names. Errors and
    node origins name the quantized op."""
    onnx = _onnx()
    real = c.onnx_node
    names = []
    for k, x in enumerate(inputs):
        if x is None:
            names.append("")
            continue
        names.append(f"\x00{c.node_name}/{k}")
        c.env[names[-1]] = x
    stand_in = onnx.helper.make_node(op_type, names, [f"\x00{c.node_name}/out"], name=c.node_name)
    stand_in.attribute.extend(a for a in real.attribute if a.name not in drop)
    for key, v in (attrs or {}).items():
        stand_in.attribute.append(onnx.helper.make_attribute(key, v))
    first = len(c.nodes)
    c.onnx_node = stand_in
    try:
        y = CONVERTERS[op_type](c)
    except ConversionError as e:
        msg, prefix = str(e), f"{op_type} '{c.node_name}': "
        msg = msg[len(prefix):] if msg.startswith(prefix) else msg
        raise ConversionError(f"{real.op_type} '{c.node_name}': {msg}") from None
    finally:
        c.onnx_node = real
        for n in names:
            c.env.pop(n, None)
    for n in c.nodes[first:]:
        if n.origin == op_type:
            n.origin = real.op_type
    return y


def _channels_first(c: _Ctx):
    if int(c.attr("channels_last", 0)):
        c.fail("channels_last=1 (NHWC) is not supported; export the model in NCHW")


# ---- QuantizeLinear / DequantizeLinear (both formats) -------------------------------------------
@_register("QuantizeLinear")
def _quantize_linear(c):
    """QuantizeLinear, as the float value of its result (its consumers read it so)."""
    x = c.input(0)
    if not _is_float(x):
        c.fail(f"input has type {x.dtype}; only float inputs are quantized")
    q = _plain_quantize(c)
    if q.dtype not in ("int8", "uint8"):
        c.fail(f"output type {q.dtype}; only int8 and uint8 are supported")
    ins = list(q.inputs[1:])
    if len(ins) == 1:
        ins.append(c.const(np.zeros((), q.dtype), "zero_point"))
    return c.add("dequantize_linear", [q, *ins], {"axis": q.attrs["axis"]}, suffix="dequantize")


@_register("DequantizeLinear")
def _dequantize_linear(c):
    """An integer tensor of the model (int8 weights, an int32 bias): the plain converter. A
    quantized activation is already its float value: rounded at these parameters if it is not."""
    x = c.input(0)
    if not _is_float(x):
        return _plain_dequantize(c)
    if c.attr("block_size", 0):
        c.fail("blocked quantization is not supported")
    s, z = _qparams(c, 1, 2, "input")
    if s.size != 1:
        src, is_src = _source(x)
        if src is not None and is_src and _same(_params_of(src)[0], s) and _same(_params_of(src)[1], z):
            return x
        c.fail("per-axis dequantization of an activation is not supported (per-tensor scales only)")
    return _qin(c, 0, 1, 2, "input")


# ---- QLinear operators -----------------------------------------------------------------------------
@_register("QLinearConv")
def _qlinear_conv(c):
    """x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp[, B (int32 at x_scale * w_scale)]."""
    x = _qin(c, 0, 1, 2, "input")
    xs, _ = _qparams(c, 1, 2, "input")
    ws, _ = _qparams(c, 4, 5, "weight")
    w = _qweight(c, 3, 4, 5, axis=0)
    b = _qbias(c, 8, xs.astype(np.float64).reshape(()) * ws.astype(np.float64).reshape(-1))
    return _qout(c, _as(c, "Conv", [x, w, b]), 6, 7)


@_register("QLinearMatMul")
def _qlinear_matmul(c):
    """a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp; b constant (weights, per column scales
    allowed) or an activation."""
    a = _qin(c, 0, 1, 2, "input")
    b = _qweight(c, 3, 4, 5, axis=-1, what="weight")
    return _qout(c, _as(c, "MatMul", [a, b]), 6, 7)


@_register("QGemm", domain=MS)
def _qgemm(c):
    """A, a_scale, a_zp, B, b_scale, b_zp[, C (int32 at alpha a_scale b_scale)][, y_scale, y_zp]:
    alpha A' B' + C; without y_scale the output is float."""
    a = _qin(c, 0, 1, 2, "input")
    as_, _ = _qparams(c, 1, 2, "input")
    bs, _ = _qparams(c, 4, 5, "weight")
    alpha = float(c.attr("alpha", 1.0))
    b = _qweight(c, 3, 4, 5, axis=0 if int(c.attr("transB", 0)) else -1)
    bias = _qbias(c, 6, alpha * float(as_.reshape(())) * bs.astype(np.float64).reshape(-1))
    y = _as(c, "Gemm", [a, b, bias], {"beta": 1.0}, drop=("beta",))
    if c.input(7) is None:
        return y
    return _qout(c, y, 7, 8)


def _binary(op_type: str):
    def conv(c):
        """A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp."""
        a = _qin(c, 0, 1, 2, "A")
        b = _qin(c, 3, 4, 5, "B")
        return _qout(c, _as(c, op_type, [a, b]), 6, 7)
    return conv


_register("QLinearAdd", domain=MS)(_binary("Add"))
_register("QLinearMul", domain=MS)(_binary("Mul"))


def _unary(op_type: str, drop: tuple = ()):
    def conv(c):
        """X, X_scale, X_zp, Y_scale, Y_zp (the plain op's attributes)."""
        _channels_first(c)
        x = _qin(c, 0, 1, 2, "input")
        return _qout(c, _as(c, op_type, [x], drop=drop + ("channels_last",)), 3, 4)
    return conv


_register("QLinearGlobalAveragePool", domain=MS)(_unary("GlobalAveragePool"))
_register("QLinearAveragePool", domain=MS)(_unary("AveragePool"))
_register("QLinearLeakyRelu", domain=MS)(_unary("LeakyRelu"))
_register("QLinearSigmoid", domain=MS)(_unary("Sigmoid"))


@_register("QLinearSoftmax", domain=MS)
def _qlinear_softmax(c):
    """X, X_scale, X_zp, Y_scale, Y_zp; attributes axis and opset (the Softmax opset whose
    semantics apply: before 13, softmax over the flattened axes from `axis` on)."""
    x = _qin(c, 0, 1, 2, "input")
    axis = int(c.attr("axis", -1 if int(c.attr("opset", 13)) >= 13 else 1)) % x.type.rank
    if int(c.attr("opset", 13)) < 13 and axis != x.type.rank - 1:
        c.fail(f"opset {c.attr('opset')} softmax over the flattened axes {axis}.. is not supported (last axis only)")
    return _qout(c, _as(c, "Softmax", [x], {"axis": axis}, drop=("axis", "opset")), 3, 4)


@_register("QLinearConcat", domain=MS)
def _qlinear_concat(c):
    """Y_scale, Y_zp, then (X, X_scale, X_zp) per input."""
    n = len(c.onnx_node.input) - 2
    if n < 1 or n % 3:
        c.fail(f"expects Y_scale, Y_zero_point and triples (X, X_scale, X_zero_point); got {n + 2} inputs")
    xs = [_qin(c, 2 + 3 * k, 3 + 3 * k, 4 + 3 * k, f"input{k}") for k in range(n // 3)]
    return _qout(c, _as(c, "Concat", xs), 0, 1)


_plain_pad = CONVERTERS["Pad"]


@_register("Pad")
def _pad(c):
    """Pad of a quantized tensor (onnxruntime's QOperator keeps Pad on the integers): its constant
    value is an integer at the tensor's scale and zero point, read here as the float it stands for."""
    x, v = c.input(0), c.input(2)
    if v is None or not _is_float(x) or _is_float(v):
        return _plain_pad(c)
    src, _ = _source(x)
    if src is None:
        c.fail(f"integer constant_value on a float tensor '{c.onnx_node.input[0]}' whose quantization is unknown")
    s, z, _ = _params_of(src)
    if s is None or np.size(s) != 1:
        c.fail("integer constant_value on a tensor without a constant per-tensor scale")
    q = np.asarray(c.value(2, "constant_value")).astype(np.int64).reshape(-1)
    value = (q - (0 if z is None else int(np.asarray(z).reshape(-1)[0]))) * float(np.asarray(s).reshape(-1)[0])
    ins = [x, c.input(1), c.const(value.astype(np.float32).reshape(()), "constant_value")] + \
        ([c.input(3)] if len(c.onnx_node.input) > 3 and c.onnx_node.input[3] else [])
    return _as(c, "Pad", ins)


def integer_output(c: _Ctx, vi) -> Node:
    """The node for graph output `vi` (a ValueInfoProto): a quantized tensor, carried at import as
    its dequantized value, becomes the model's integers again where the model declares them."""
    y = c.env[vi.name]
    elem = vi.type.tensor_type.elem_type
    dtype = str(_onnx().helper.tensor_dtype_to_np_dtype(elem)) if elem else None
    if dtype not in ("int8", "uint8") or not _is_float(y):
        return y
    src, is_src = _source(y)
    if src is None:
        raise ConversionError(f"graph output '{vi.name}' is declared {dtype} but its quantization is unknown")
    if is_src and src.inputs[0].dtype == dtype:
        return src.inputs[0]
    q = src.inputs[0]
    out = Node("quantize_linear", [y, *q.inputs[1:]], q.attrs, name=f"{vi.name}/quantize", origin="QuantizeLinear")
    c.nodes.append(out)
    return out
