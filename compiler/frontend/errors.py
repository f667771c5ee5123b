"""Exceptions of the ONNX frontend; each names the file, or the ONNX node and its op type."""
from ..errors import CompilerError


class FrontendError(CompilerError):
    """Base of the frontend's errors."""


class ModelLoadError(FrontendError, ValueError):
    """The file is missing, truncated, not an ONNX model, or fails ONNX's checker."""


class UnsupportedOpError(FrontendError):
    """The model uses op types the frontend cannot import; lists every one with its node names."""

    def __init__(self, unsupported: dict[str, list[str]]):
        self.unsupported = unsupported
        parts = [f"{op} (node{'s' if len(ns) > 1 else ''} {', '.join(repr(n) for n in ns)})"
                 for op, ns in sorted(unsupported.items())]
        super().__init__(f"model has {len(unsupported)} unsupported op type(s): {'; '.join(parts)}; "
                         f"each needs a converter (compiler/frontend/onnx_import.py CONVERTERS), or only "
                         f"constant inputs so that it folds at import")


class ConversionError(FrontendError, ValueError):
    """A supported op is used in a way the frontend cannot import (names the node and why)."""
