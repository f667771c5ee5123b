"""Frontends: ONNX models -> the graph IR (compiler.graph)."""
from . import einsum, qoperator, recurrent, transformer_ops  # noqa: F401,E402  register their converters
from .errors import ConversionError, FrontendError, ModelLoadError, UnsupportedOpError
from .onnx_import import CONVERTERS, from_onnx, load_model

__all__ = ["from_onnx", "load_model", "CONVERTERS", "FrontendError", "ModelLoadError", "UnsupportedOpError",
           "ConversionError"]
