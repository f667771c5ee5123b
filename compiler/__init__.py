"""The compiler: tensor expressions and schedules (te), the loop IR (tir) and its passes,
lowering, code generation (LLVM CPU), and build()."""
from . import te, tir  # noqa: E402
from .lower import lower  # noqa: E402
from .build import build, parse_target, Target, TARGETS  # noqa: E402
