"""The CPU target: every node can run here (the partition's fallback); each fused group becomes
one LLVM kernel composed from the operator library, or NumPy reference steps where it has none."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..graph.ir import Node
from .base import PlacementContext, Target, register_target

if TYPE_CHECKING:
    from ..graph_build import Builder


class CpuTarget(Target):
    """LLVM kernels on the host CPU; takes every node."""

    name = "cpu"
    label = "cpu"
    title = "the CPU"

    def supports(self, node: Node, ctx: PlacementContext) -> str | None:
        return None

    def placement_kind(self, node: Node, ctx: PlacementContext) -> str:
        return "target"

    def lower(self, builder: Builder, node: Node) -> None:
        builder.lower_cpu(node)


register_target(CpuTarget())

__all__ = ["CpuTarget"]
