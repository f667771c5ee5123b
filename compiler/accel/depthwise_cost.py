"""Where a depthwise convolution runs: the host CPU's int8 kernel or the accelerator's diagonal GEMM,
by a cost estimate of each (seconds), which the targets' estimate_cost report to the partition.

A depthwise conv (one group per channel) goes onto the GEMM core as channel slices of block_in
groups with diagonal weights (compiler.accel.grouped): one GEMM micro-op per pixel, tap and channel
block, 1/block_in of its MACs useful. On the CPU it is the int8 qconv2d kernel, at the host's
depthwise throughput, plus what leaving the accelerator costs: the runtime unpacks its input from
and packs its output back to the blocked layout (a read and a write of each tensor) and runs two
more host steps. No quantize/dequantize: both sides compute int8 and exchange int8 tensors.

The host's figures are a HostModel: modelled ones for the board's own CPU (the default,
HOST_MODELS["pynq-z1"], the Cortex-A9 beside the core the kit targets) or measured ones for a
machine that runs the module (HOST_MODELS["x86-dev"], this project's 2-core build machine;
bench/depthwise_host.py measures another); $ACCEL_HOST_MODEL names the one builds use. One host
answers every placement question of a build. The accelerator's side is the planner's cycle
estimate of the layer's lowering (the grouped one for a depthwise conv, compiler.accel.plan) at
the config's clock.

The same comparison places every other int8 GEMM layer (conv, dense): the planner's estimate of the
layer's own lowering at the config's clock against its MACs at the host's int8 GEMM rate
(gemm_costs). Against the development machine's x86 kernels, which run int8 convs about as fast as
the default core's peak, every layer of a 100 MHz core would be a coin flip and the 4x4 test core
would take none: that is a question about the simulator's host, not the board, and
$ACCEL_HOST_MODEL=x86-dev asks it.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import numpy as np

from accel.isa import AccelConfig

from ..errors import TargetError
from ..graph.ir import Node
from .conv2d import Conv2dSpec, TilingError
from .grouped import group_spec, grouped_layout
from .plan import estimate_cycles, plan_conv2d


@dataclass(frozen=True)
class HostModel:
    """The host CPU as the partition sees it. macs_per_s: the cpu target's int8 depthwise kernel
    (MACs per second) at stride 1, strided_macs_per_s at larger strides (its schedule runs them far
    slower); bytes_per_s: tensor bytes the runtime's pack/unpack convert per second; step_s: the
    fixed cost of one host step (dispatch, threads); gemm_macs_per_s: its int8 conv/dense kernels
    (None: no figure, GEMM layers are not weighed against this host and stay on the accelerator)."""
    name: str
    macs_per_s: float
    strided_macs_per_s: float
    bytes_per_s: float
    step_s: float
    gemm_macs_per_s: float | None = None


HOST_MODELS = {
    # measured (bench/depthwise_host.py measures these): best of 6 runs of MobileNetV2's
    # (bench/e2e.py) depthwise layers and their pack/unpack steps on the fsim driver, 2-core x86
    # build machine shared with other jobs: stride 1 at 3.2-4.0 GMAC/s (the best layers), stride 2
    # at 0.2-1.1, pack/unpack 1.1-1.75 GB/s of tensor, the smallest step 27 us
    # GEMM: the cpu target's int8 qconv2d/qdense steps of ResNet-18 at 64x64 and the zoo MLP and
    # encoder (best of 8 on fsim): convs 18-28 GMAC/s, dense layers of 4-8 rows 6-17 GMAC/s
    "x86-dev": HostModel("x86-dev", macs_per_s=3.5e9, strided_macs_per_s=0.8e9, bytes_per_s=1.5e9, step_s=30e-6,
                         gemm_macs_per_s=20e9),
    # modelled: a 650 MHz Cortex-A9 with NEON, 8 int8 MACs per cycle at best, a quarter of that
    # reached on a 3x3 window (strided: half again); 32-bit DDR3, about 0.5 GB/s for copies. GEMM:
    # NEON int8 kernels widen each product to 16 bits and pair-add into 32 (vmull.s8 + vpadal.s16,
    # 8 MACs per two instructions: 2.6 GMAC/s a core at most); assumed a fifth of that on a layer's
    # small matrices (loads, edges, requantization), 0.5 GMAC/s a core, both cores (not measured)
    "pynq-z1": HostModel("pynq-z1", macs_per_s=1.3e9, strided_macs_per_s=0.65e9, bytes_per_s=0.5e9, step_s=50e-6,
                         gemm_macs_per_s=1.0e9),
}
#: the host every placement is weighed against unless $ACCEL_HOST_MODEL names one: the board's CPU
DEFAULT_HOST = "pynq-z1"


#: names the host model builds use instead of DEFAULT_HOST (a board's CPU when compiling for it)
HOST_ENV = "ACCEL_HOST_MODEL"


def host_model(name: str | None = None) -> HostModel:
    """The HostModel `name` (default: $ACCEL_HOST_MODEL, else DEFAULT_HOST); TargetError (a
    ValueError) names the known ones."""
    env = os.environ.get(HOST_ENV) if name is None else None
    key = name or env or DEFAULT_HOST
    try:
        return HOST_MODELS[key]
    except KeyError:
        where = f"${HOST_ENV}={env!r}" if env else f"host model {key!r}"
        raise TargetError(f"{where}: unknown host model; models are {', '.join(HOST_MODELS)}") from None


def _channels(t: Node) -> int:
    return t.shape[1] * t.shape[-1] if len(t.shape) == 6 else t.shape[1]


def is_depthwise(n: Node) -> bool:
    """An int8 conv with one group per channel (input channels == groups) whose weights vary over
    the window: not a channel epilogue (a batch norm or average pool as a depthwise conv, one weight
    per channel), which the accelerator takes by its own rule."""
    if n.op != "qconv2d" or n.attrs.get("groups", 1) == 1 or n.attrs["groups"] != _channels(n.inputs[0]):
        return False
    w = n.inputs[1]
    return not (w.is_const and w.value.ndim == 4 and bool(np.all(w.value == w.value[:, :, :1, :1])))


def _spec(n: Node) -> Conv2dSpec:
    """The layer as the accelerator lowering sees it (NCHW shapes, before packing)."""
    x, w = n.inputs[0].shape, n.inputs[1].shape
    return Conv2dSpec.from_attrs(x[0], x[1], x[2], x[3], n.shape[1], w[2], w[3], n.attrs, n.name)


def accel_depthwise_cycles(n: Node, cfg: AccelConfig) -> float:
    """Cycles of the diagonal-GEMM lowering (compiler.accel.grouped): the planner's estimate of one
    channel slice's program times the slices and batch blocks; where no tiling fits, the GEMM
    micro-ops alone (one per output pixel, tap and channel block)."""
    spec = _spec(n)
    groups = n.attrs["groups"]
    k, _ = grouped_layout(groups, spec.c, spec.o, cfg.block_in, cfg.block_out)
    batches = -(-spec.n // cfg.batch)
    slices = -(-groups // k)
    try:
        gs = group_spec(spec, slices, cfg.batch) if k < groups else spec
        cyc = estimate_cycles(gs, cfg, plan_conv2d(gs, cfg, 2, False))["cycles"]
        return cyc * (slices if k < groups else 1) * batches
    except (TilingError, ValueError):
        oh, ow = n.shape[2:]
        return batches * oh * ow * spec.kh * spec.kw * -(-spec.o // cfg.block_out)


def accel_depthwise_seconds(n: Node, cfg: AccelConfig, beside_cpu: bool = False,
                            host: HostModel | None = None) -> float:
    """accel_depthwise_cycles at the config's clock; beside_cpu (its producer on the CPU): plus
    boundary_seconds, the pack of its input and the unpack of its output."""
    t = accel_depthwise_cycles(n, cfg) / (cfg.clock_mhz * 1e6)
    return t + (boundary_seconds(n, host) if beside_cpu else 0.0)


def boundary_seconds(n: Node, host: HostModel | None = None) -> float:
    """Host time to cross the accelerator boundary around n: its input converted to one layout and
    its output back (two host steps, each int8 tensor converted once)."""
    host = host or host_model()
    nbytes = math.prod(n.inputs[0].shape) + math.prod(n.shape)
    return nbytes / host.bytes_per_s + 2 * host.step_s


def cpu_depthwise_seconds(n: Node, host: HostModel | None = None, beside_accel: bool = True) -> float:
    """The int8 kernel's MACs at the host's rate; beside_accel (its producer on the accelerator):
    plus boundary_seconds, the unpack of its input and the pack of its output."""
    host = host or host_model()
    w = n.inputs[1].shape
    macs = math.prod(n.shape) * math.prod(w[1:])
    rate = host.macs_per_s if tuple(n.attrs["strides"]) == (1, 1) else host.strided_macs_per_s
    t = macs / rate   # its own step is not counted: running it on the accelerator is one host step too
    return t + (boundary_seconds(n, host) if beside_accel else 0.0)


def depthwise_costs(n: Node, cfg: AccelConfig, host: HostModel | None = None) -> dict[str, float]:
    """Both estimates of a depthwise layer (seconds), for reports and --explain."""
    return {"cpu_s": cpu_depthwise_seconds(n, host), "accel_s": accel_depthwise_seconds(n, cfg)}


# ---- GEMM layers (conv, dense) ---------------------------------------------------------------------
def _pad(v: int, block: int) -> int:
    return -(-v // block) * block


def gemm_macs(n: Node) -> int:
    """MACs of an int8 conv or dense layer before packing (NCHW / rows x features)."""
    w = n.inputs[1].shape
    return math.prod(n.shape) * math.prod(w[1:])


def gemm_spec(n: Node, cfg: AccelConfig) -> Conv2dSpec:
    """The layer as its accelerator lowering runs it: rows, channels padded to the config's blocks
    (a dense layer as a 1x1 conv over 1x1 images, its rows the batch)."""
    if n.op == "qdense":
        rows = math.prod(n.shape[:-1])
        return Conv2dSpec(_pad(rows, cfg.batch), _pad(n.inputs[1].shape[1], cfg.block_in), 1, 1,
                          _pad(n.shape[-1], cfg.block_out), 1, 1, name=n.name)
    s = _spec(n)
    return replace(s, n=_pad(s.n, cfg.batch), c=_pad(s.c, cfg.block_in), o=_pad(s.o, cfg.block_out))


def accel_gemm_cycles(n: Node, cfg: AccelConfig) -> tuple[float, bool]:
    """(cycles, memory-bound) of an int8 conv or dense layer on the accelerator: the planner's
    estimate of its best tiling (grouped convs: accel_depthwise_cycles' channel slices); where no
    tiling fits, its padded MACs at the peak or its least DRAM traffic at the bus width, the larger.
    Memory-bound: the DRAM traffic alone takes longer than the GEMM micro-ops."""
    if n.op == "qconv2d" and n.attrs.get("groups", 1) != 1:
        return accel_depthwise_cycles(n, cfg), False
    try:
        spec = gemm_spec(n, cfg)
        est = estimate_cycles(spec, cfg, plan_conv2d(spec, cfg, 2, False))
        return est["cycles"], est["dram_bytes"] / cfg.bus_bytes > est["gemm_uops"]
    except (TilingError, ValueError):
        uops = gemm_macs(n) / cfg.macs_per_cycle
        dram = (math.prod(n.inputs[0].shape) + math.prod(n.inputs[1].shape) + math.prod(n.shape)) / cfg.bus_bytes
        return max(uops, dram), dram > uops


def accel_gemm_seconds(n: Node, cfg: AccelConfig) -> float:
    """accel_gemm_cycles at the config's clock."""
    return accel_gemm_cycles(n, cfg)[0] / (cfg.clock_mhz * 1e6)


def cpu_gemm_seconds(n: Node, host: HostModel, beside_accel: bool = False) -> float:
    """The layer's MACs at the host's int8 GEMM rate; beside_accel (its producer on the
    accelerator): plus boundary_seconds, the unpack of its input and the pack of its output."""
    if host.gemm_macs_per_s is None:
        return math.inf
    return gemm_macs(n) / host.gemm_macs_per_s + (boundary_seconds(n, host) if beside_accel else 0.0)


def gemm_costs(n: Node, cfg: AccelConfig, beside_accel: bool = False, host: HostModel | None = None) -> dict:
    """Both estimates of an int8 GEMM layer (seconds), the accelerator's cycles and whether they
    are memory-bound, and the host weighed: what the GEMM placement rule compares.

    The accelerator's side pays no boundary: a run of accelerator layers packs its input and
    unpacks its output once, whatever its length, and the partition decides node by node, so the
    crossing charged to the run's first layer would keep every run on the CPU. A CPU layer between
    accelerator layers pays both crossings (beside_accel), as in the depthwise rule."""
    host = host or host_model()
    cycles, bound = accel_gemm_cycles(n, cfg)
    return {"accel_s": cycles / (cfg.clock_mhz * 1e6), "cycles": cycles, "memory_bound": bound,
            "cpu_s": cpu_gemm_seconds(n, host, beside_accel), "host": host}
