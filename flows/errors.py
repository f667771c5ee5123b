"""The exception type of the flows package."""
from __future__ import annotations

from accel.isa.errors import AccelError


class SweepError(AccelError, ValueError):
    """A sweep space, model, option or results folder is unusable (the message names which and why)."""


class InputError(AccelError, ValueError):
    """An input file or command-line spec is unusable (the message names the option, file and why)."""
