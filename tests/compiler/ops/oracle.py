"""Oracles for the operator tests: numpy references (float64) and onnxruntime one-node models."""
from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

_ONNX_TYPES = {"float32": TensorProto.FLOAT, "int8": TensorProto.INT8, "int32": TensorProto.INT32,
               "int64": TensorProto.INT64}


def run_onnx(op_type, inputs, attrs=None, opset=17, consts=()):
    """Run one ONNX node on numpy inputs with onnxruntime; indices in `consts` become initializers."""
    names = [f"x{k}" for k in range(len(inputs))]
    node = helper.make_node(op_type, names, ["y"], **(attrs or {}))
    feeds, vis, inits = {}, [], []
    for k, (n, a) in enumerate(zip(names, inputs)):
        if k in consts:
            inits.append(numpy_helper.from_array(a, n))
        else:
            vis.append(helper.make_tensor_value_info(n, _ONNX_TYPES[str(a.dtype)], a.shape))
            feeds[n] = a
    out = helper.make_tensor_value_info("y", _ONNX_TYPES[str(inputs[0].dtype)], None)
    g = helper.make_graph([node], "g", vis, [out], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = min(m.ir_version, 10)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0]


def conv2d_ref(x, w, strides, pads, dilations, groups):
    """Direct convolution in float64 (or exact int64 for integer inputs)."""
    acc = np.int64 if np.issubdtype(x.dtype, np.integer) else np.float64
    pt, pl, pb, pr = pads
    xp = np.pad(x.astype(acc), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    N, C, H, W = xp.shape
    O, Cg, KH, KW = w.shape
    sh, sw = strides
    dh, dw = dilations
    OH = (H - (KH - 1) * dh - 1) // sh + 1
    OW = (W - (KW - 1) * dw - 1) // sw + 1
    out = np.zeros((N, O, OH, OW), acc)
    og = O // groups
    for o in range(O):
        g = o // og
        for ky in range(KH):
            for kx in range(KW):
                patch = xp[:, g * Cg:(g + 1) * Cg, ky * dh: ky * dh + (OH - 1) * sh + 1: sh,
                           kx * dw: kx * dw + (OW - 1) * sw + 1: sw]
                out[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, ky, kx].astype(acc))
    return out


def close(y, r, rtol=1e-5):
    """fp32 within rtol of the float64 reference, relative to the tensor's scale."""
    r = np.asarray(r, np.float64)
    scale = max(1.0, float(np.max(np.abs(r)))) if r.size else 1.0
    np.testing.assert_allclose(y.astype(np.float64), r, rtol=rtol, atol=rtol * scale)


def erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)
