"""Exceptions of the compiler; each message names the tensor, stage, axis, pass or target at fault.

Every error derives from CompilerError (itself an accel AccelError), and the ones about bad
types or shapes also derive from the matching Python built-in so `except TypeError` works.
"""
from accel.isa.errors import AccelError


class CompilerError(AccelError):
    """Base of every error the compiler raises on purpose."""


class DTypeError(CompilerError, TypeError):
    """An unknown dtype, or an operation between dtypes that has no defined result."""


class ShapeError(CompilerError, ValueError):
    """A tensor is indexed with the wrong number of indices or provably outside an axis."""


class ExprError(CompilerError, ValueError):
    """A tensor expression is malformed (reduction not at the top, symbolic value used as bool)."""


class ScheduleError(CompilerError, ValueError):
    """A schedule primitive was applied where it is not legal; names the stage and axis."""


class TensorizeError(ScheduleError):
    """The loop nest under a tensorize point does not compute what the intrinsic declares."""


class LowerError(CompilerError):
    """A schedule cannot be lowered to the loop IR (unsupported combination, unbound region)."""


class PassError(CompilerError):
    """A loop-IR pass met IR it cannot handle; names the pass and the node."""


class CodegenError(CompilerError):
    """The code generator cannot emit the IR for its target (unknown intrinsic, thread binding on CPU)."""


class TargetError(CompilerError, ValueError):
    """An unknown target string or option; the message lists the registered targets."""
