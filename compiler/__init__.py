"""The compiler: tensor expressions and schedules (te), the loop IR (tir) and its passes,
lowering, code generation (LLVM CPU), and build(); graph-level build_model (ONNX -> CompiledModule)."""
from . import te, tir  # noqa: E402
from .build import TARGETS, Target, parse_target
from .build import build as build_te  # noqa: E402
from .lower import lower  # noqa: E402
from .te.schedule import Schedule
from .tir.stmt import PrimFunc


def build(obj, *args, **kwargs):
    """A te Schedule or loop-IR PrimFunc -> build_te (like tvm.build); an ONNX model (path, bytes,
    ModelProto) or a graph IR Graph -> build_model(model, target="accel"|"cpu", config=...)
    returning a CompiledModule (like relay.build)."""
    if isinstance(obj, (Schedule, PrimFunc)):
        return build_te(obj, *args, **kwargs)
    return build_model(obj, *args, **kwargs)


def build_model(model, *args, **kwargs):
    """See compiler.graph_build.build_model."""
    from .graph_build import build_model as _build_model  # noqa: PLC0415 - graph_build imports the whole compiler and host_runtime; `import compiler.x` stays light
    return _build_model(model, *args, **kwargs)
