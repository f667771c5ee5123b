"""The interface every compilation target implements, and the registry that names them.

A target is one place code can run: "cpu" (LLVM kernels), "accel" (the accelerator's
instruction stream), "opencl" and "cuda" (GPU kernels). The graph builder and the partition
pass only talk to targets through `Target`; adding a target is one new package that subclasses
it and calls `register_target` (or is installed with an entry point in the group
`accel_kit.targets`, found when its name is first asked for). The names live in one registry
shared with the runtime (host_runtime.targets), so a module built for a plug-in target records
the plug-in's name and version and runs through the same Executor, calling the plug-in's kernels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from host_runtime.targets import (
    BUILTIN_TARGETS,
    RuntimeTarget,
    TargetError,
    UnknownTargetError,
    installed_targets,
    register_runtime_target,
    resolve_target,
    unregister_runtime_target,
)

from ..errors import CompilerError
from ..graph.ir import Graph, Node

if TYPE_CHECKING:   # the builder imports the targets; only the type is needed here
    from ..graph_build import Builder


class BuildError(CompilerError):
    """A model cannot be built for the target (bad target, missing calibration, link failure)."""


class Decline(str):
    """Why a target does not take a node (the sentence `accel compile --explain` shows).

    kind: a word from the explain legend (why, in one word); hard: no user override may put the
    node on the target anyway (a soft decline, such as channel waste, can be forced)."""

    kind: str
    hard: bool

    def __new__(cls, reason: str, kind: str = "unsupported", hard: bool = True) -> Decline:
        s = super().__new__(cls, reason)
        s.kind, s.hard = kind, hard
        return s


@dataclass
class PlacementContext:
    """What a target may read when it decides about one node during partitioning.

    where: id(graph node) -> the target already chosen for it (producers come first)."""
    config: object = None
    where: dict[int, str] = field(default_factory=dict)
    rules: object = None


def node_macs(n: Node) -> int:
    """Multiply-accumulates of a GEMM-like node (padded channels included for packed layouts)."""
    if n.op in ("conv2d", "qconv2d"):
        w = n.inputs[1].shape
        if n.op == "qconv2d" and n.attrs["layout"] == "NCHWnc":
            return math.prod(n.shape) * w[1] * w[2] * w[3] * w[5]
        return math.prod(n.shape) * math.prod(w[1:])
    if n.op == "conv2d_NCHWc":   # kernel (O', C', KH, KW, ic, oc)
        return math.prod(n.shape) * math.prod(n.inputs[1].shape[1:5])
    if n.op == "depthwise_conv2d_NCHWc":   # kernel (C', KH, KW, c)
        return math.prod(n.shape) * math.prod(n.inputs[1].shape[1:3])
    if n.op in ("dense", "qdense"):
        w = n.inputs[1].shape
        if n.op == "qdense" and n.attrs["layout"] == "NCnc":
            return math.prod(n.shape) * w[1] * w[3]
        return math.prod(n.shape) * w[1]
    if n.op == "matmul":
        return math.prod(n.shape) * n.inputs[0].shape[-1]
    return 0


def single_body(n: Node) -> Graph:
    """A lone op as a body of its own (its inputs become parameters), as fused groups are."""
    params = [Node.input(f"p{k}", i.shape, i.dtype) for k, i in enumerate(n.inputs)]
    b = n.with_inputs(params)
    return Graph(params + [b], params, [b], [n.name], f"single_{n.op}")


def write_source(out_dir: Path, name: str, text: str) -> Path:
    """Write one generated source file for --emit; CompilerError names the file on failure."""
    p = Path(out_dir) / name
    try:
        p.write_text(text)
    except OSError as e:
        raise CompilerError(f"--emit {out_dir}: cannot write {name} ({e.strerror})") from None
    return p


class Target:
    """One place graph nodes can run. Subclasses override what differs from these defaults.

    name: what --target and node.target say. label: the target column of --explain rows for
    nodes it runs ("cpu", "accel", "gpu"). kinds: legend entries (kind -> meaning) this target's
    explain rows use."""

    name: str = ""
    label: str = ""
    #: the module's DRAM is laid out for an AccelConfig (the default preset when none is given)
    needs_config: bool = False
    #: the target a module built for this one records; None: this target's own name (and, for a
    #: plug-in, its version). Another name (say "cpu" for a target that emits only CPU kernels)
    #: lets the module run where this plug-in is not installed.
    module_target: str | None = None
    #: a plug-in's version, recorded in the modules built for it (the runtime refuses a module of
    #: another major version unless runtime().accepts says otherwise); the built-ins need none
    version: str = ""
    #: kernel name -> fn(attrs, *inputs) -> array: what this target's 'plugin' steps call at run time
    #: (kernel_step appends one), and kernel name -> check(attrs, inputs, out) -> why refused or None
    runtime_kernels: dict = {}
    runtime_checks: dict = {}
    kinds: dict[str, str] = {}
    #: option name -> default: what build_model(target_options=...) may set for this target
    #: (Builder.option reads them); any other name is refused before work starts
    build_options: dict = {}

    @property
    def title(self) -> str:
        """The target in sentences ("forced onto the accelerator"); subclasses set a class attribute."""
        return self.name

    # ---- placement (the partition pass asks these) ---------------------------------------------
    def supports(self, node: Node, ctx: PlacementContext) -> str | None:
        """None if `node` can run here, else why not (a Decline carries kind and hardness)."""
        return None

    def placement_kind(self, node: Node, ctx: PlacementContext) -> str:
        """The explain kind of a node this target takes."""
        return "offload"

    def estimate_cost(self, node: Node, ctx: PlacementContext) -> float | None:
        """Estimated seconds for `node` here, or None when the target has no cost model (then the
        partition keeps the preference order)."""
        return None

    # ---- building ------------------------------------------------------------------------------
    def graph_options(self, request: dict) -> dict:
        """Keywords of the compiler.graph.passes.GraphOptions a build for this target optimizes with.
        request: cfg, calibration, has_qdq, force_target, fuse, random_calibration(n), warnings (a
        list to append to), target_options (build_options with build_model's values). The default: float, int8 where the model is QDQ, no partition (a
        target that adds targets=(its name, "cpu") gets one, and --force applies to it)."""
        return {"quantize": request["has_qdq"], "calibration_samples": request["calibration"] or None,
                "fuse": request["fuse"], "force_target": dict(request["force_target"] or {})}

    def prepare(self, builder: Builder, tune) -> None:
        """Per-build set-up before any node lowers (tuning logs, kernel caches in builder.state)."""

    def lower(self, builder: Builder, node: Node) -> None:
        """Append the steps that compute `node` (an op or a fused group) to builder.steps. The
        default passes the group's body to lower_body, named after its GEMM-like op if any."""
        body = node.attrs["body"] if node.op == "fused" else single_body(node)
        anchor = next((o for o in body.ops if node_macs(o)), None)  # a fused conv is named after the conv
        self.lower_body(builder, anchor.name if anchor is not None else node.name, body, list(node.inputs),
                        builder.tid[id(node)])

    def lower_body(self, builder: Builder, name: str, body: Graph, outer: list, out_tid: int) -> None:
        """Steps computing `body` (a Graph of ops) from `outer` (its inputs: graph nodes or tensor
        ids) into tensor out_tid. The fallback target's is what other targets fall back to."""
        raise BuildError(f"target {self.name!r} cannot lower {body.name} ({'+'.join(o.op for o in body.ops)}) "
                         f"'{name}'")

    def placed_row(self, node: Node) -> dict:
        """The --explain row of a node this target ran without a partition decision."""
        return {"target": self.label or self.name, "kind": "target",
                "reason": f"{node.origin or node.op} '{node.name}': compiled for --target {self.name}"}

    def link(self, builder: Builder) -> None:
        """After every node lowered: hand finished kernels to the builder (builder.kernel_sources)."""

    def kernel_step(self, builder: Builder, op: Node, outer: list, out_tid: int, kernel: str | None = None) -> None:
        """Append a step that runs `op` (from the graph nodes or tensor ids `outer` into out_tid) with
        this target's runtime kernel `kernel` (default: the op's name), its attributes as the kernel's."""
        kernel = kernel or op.op
        if kernel not in self.runtime_kernels:
            raise BuildError(f"target {self.name!r} has no runtime kernel {kernel!r} for {op.op} '{op.name}'; "
                             f"its kernels are {', '.join(self.runtime_kernels) or 'none'}")
        builder.simple_step(op.name, op, outer, out_tid, "plugin", "")
        builder.steps[-1].symbol = f"{self.name}:{kernel}"

    def runtime(self) -> RuntimeTarget:
        """What the runtime needs to run this target's modules (registered with the target)."""
        return RuntimeTarget(self.name, self.version, dict(self.runtime_kernels), dict(self.runtime_checks))

    # ---- output --------------------------------------------------------------------------------
    def emit(self, module, out_dir: Path) -> list[Path]:
        """Write this target's generated sources of `module` under out_dir (accel compile --emit)."""
        return []


_REGISTRY: dict[str, Target] = {}


def register_target(target: Target, replace: bool = False) -> Target:
    """Make `target` available by its name (to --target, node.target and the partition) and its
    runtime part (name, version, kernels) to the host runtime, so modules built for it load and run."""
    if not target.name or not target.name.isidentifier():
        raise BuildError(f"register_target: name {target.name!r} is not an identifier")
    if target.name in _REGISTRY and not replace and _REGISTRY[target.name] is not target:
        raise BuildError(f"register_target: target {target.name!r} is registered already (pass replace=True)")
    if target.name not in BUILTIN_TARGETS:   # the runtime runs the built-ins' steps itself
        try:
            register_runtime_target(target.runtime(), replace=True)
        except TargetError as e:
            raise BuildError(str(e).replace("register_runtime_target", "register_target", 1)) from None
    _REGISTRY[target.name] = target
    return target


def unregister_target(name: str) -> None:
    """Remove a target (tests that register toy targets clean up with this)."""
    _REGISTRY.pop(name, None)
    unregister_runtime_target(name)


def get_target(name: str) -> Target:
    """The registered target `name`, loading an installed plug-in of that name first if need be;
    BuildError lists the registered and installed ones otherwise."""
    if not isinstance(name, str):
        raise BuildError(f"target must be a name such as 'cpu', got {type(name).__name__}; targets are "
                         f"{', '.join(_REGISTRY)}")
    if name not in _REGISTRY and name.isidentifier():
        try:
            resolve_target(name)   # imports an installed plug-in, which registers itself here
        except UnknownTargetError:
            pass
        except TargetError as e:   # installed, but it does not load or register
            raise BuildError(str(e)) from None
    try:
        return _REGISTRY[name]
    except KeyError:
        names = list(_REGISTRY) + [n for n in installed_targets() if n not in _REGISTRY]
        raise BuildError(f"unknown target {name!r}; targets are {', '.join(names)}") from None


def target_names() -> tuple[str, ...]:
    """Registered target names, built-ins first."""
    return tuple(_REGISTRY)
