"""Compilation targets as plug-ins: one interface (compiler.targets.base.Target), one registry.

The built-in targets register themselves when their module is imported, which this package does.
A new target is a new package that subclasses Target and calls register_target, or that is
installed with an entry point in the group `accel_kit.targets` (docs/compiler.md, "Adding a
target"); get_target loads an installed one by its name on first use.
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
                   installed_targets,
                   node_macs,
                   register_target,
                   target_names,
                   unregister_target,
)

__all__ = ["BuildError", "Decline", "PlacementContext", "Target", "get_target", "installed_targets", "node_macs",
           "register_target", "target_names", "unregister_target"]
