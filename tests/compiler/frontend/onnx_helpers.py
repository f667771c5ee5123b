"""Small ONNX models for the frontend's tests, built with onnx.helper."""
import numpy as np
import onnx
from onnx import helper, numpy_helper


def model(nodes, inputs, outputs, inits=(), opset=13, ir_version=7):
    """inputs/outputs: (name, elem_type, shape); inits: (name, array). Checked with onnx's full
    checker when every output's shape is given (it wants them)."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    if all(s is not None for _, _, s in outputs):
        onnx.checker.check_model(m, full_check=True)
    return m
