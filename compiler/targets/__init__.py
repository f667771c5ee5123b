"""Compilation targets as plug-ins: one interface (compiler.targets.base.Target), one registry.

The built-in targets register themselves when their module is imported, which this package does;
a new target is a new module that subclasses Target and calls register_target.
"""
from . import (
                   accel,  # noqa: F401 - registers "accel"
                   cpu,  # noqa: F401 - registers "cpu"
                   gpu,  # noqa: F401 - registers "opencl" and "cuda"
)
from .base import (
                   BuildError,
                   Decline,
                   PlacementContext,
                   Target,
                   get_target,
                   node_macs,
                   register_target,
                   target_names,
                   unregister_target,
)

__all__ = ["BuildError", "Decline", "PlacementContext", "Target", "get_target", "node_macs", "register_target",
           "target_names", "unregister_target"]
