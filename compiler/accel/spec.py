"""An accelerator GEMM layer's description: the layer (Conv2dSpec), its tiling (ConvTiling), its
requantization (Requant) and a fused residual add (ResidualAdd), shared by the planner
(plan.py), the emitters (emit.py for convolutions, dense.py for dense layers) and the epilogue
(epilogue.py)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accel.isa import AccelConfig

from ..errors import CompilerError
from ..graph.ops import conv2d_ref, shift_right_round


class TilingError(CompilerError):
    """A layer cannot be tiled into the config's buffers; says which buffer is short and by how much."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Conv2dSpec:
    """A conv2d layer in NCHW/OIHW terms (channels before blocking); pads are (top, bottom, left, right).
    A dilated kernel's taps sit `dilations` apart: it spans span_h x span_w input pixels, and the
    emitter reads tap (y, x) at offset (y * dh, x * dw) of an output pixel's window."""
    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    strides: tuple[int, int] = (1, 1)
    name: str = "conv2d"
    dilations: tuple[int, int] = (1, 1)

    def __post_init__(self):
        for k in ("n", "c", "h", "w", "o", "kh", "kw"):
            if getattr(self, k) < 1:
                raise TilingError(f"{self.name}: {k}={getattr(self, k)} must be >= 1")
        if min(self.strides) < 1 or min(self.pads) < 0 or min(self.dilations) < 1:
            raise TilingError(f"{self.name}: strides {self.strides} and dilations {self.dilations} must be >= 1 "
                              f"and pads {self.pads} >= 0")
        if self.oh < 1 or self.ow < 1:
            raise TilingError(f"{self.name}: kernel {self.kh}x{self.kw} (spanning {self.span_h}x{self.span_w}) "
                              f"larger than the padded input")

    @property
    def span_h(self) -> int:
        """Input rows one output pixel's window spans: the kernel's height, dilated."""
        return (self.kh - 1) * self.dilations[0] + 1

    @property
    def span_w(self) -> int:
        """Input columns one output pixel's window spans."""
        return (self.kw - 1) * self.dilations[1] + 1

    @property
    def oh(self) -> int:
        return (self.h + self.pads[0] + self.pads[1] - self.span_h) // self.strides[0] + 1

    @property
    def ow(self) -> int:
        return (self.w + self.pads[2] + self.pads[3] - self.span_w) // self.strides[1] + 1

    @property
    def macs(self) -> int:
        return self.n * self.o * self.oh * self.ow * self.c * self.kh * self.kw

    @classmethod
    def dense(cls, rows: int, k: int, m: int, cfg: AccelConfig, name: str = "dense") -> "Conv2dSpec":
        """Dense (rows x k) @ (k x m) as a 1x1 conv over one image block whose pixels are the
        row blocks: the packing of compiler.accel.layout.pack_dense_input."""
        return cls(n=cfg.batch, c=k, h=1, w=_ceil(rows, cfg.batch), o=m, kh=1, kw=1, name=name)

    @classmethod
    def from_attrs(cls, n: int, c: int, h: int, w: int, o: int, kh: int, kw: int, attrs: dict,
                   name: str) -> "Conv2dSpec":
        """A conv node's layer: its graph attributes give the pads in ONNX order (begin rows, begin
        columns, end rows, end columns), the strides and the dilations."""
        pt, pl, pb, pr = attrs["pads"]
        return cls(n, c, h, w, o, kh, kw, (pt, pb, pl, pr), tuple(attrs["strides"]), name,
                   tuple(attrs.get("dilations", (1, 1))))

    @classmethod
    def from_workload(cls, fields: list[int], name: str, n: int = 1) -> "Conv2dSpec":
        """A row of a workload file (compiler/accel/resnet18_conv.json): h, w, c, o, kh, kw, pad_h, pad_w, sh, sw."""
        h, w, c, o, kh, kw, ph, pw, sh, sw = fields
        return cls(n=n, c=c, h=h, w=w, o=o, kh=kh, kw=kw, pads=(ph, ph, pw, pw), strides=(sh, sw), name=name)


def int_conv2d(x: np.ndarray, w: np.ndarray, spec: Conv2dSpec, groups: int = 1) -> np.ndarray:
    """The exact int64 sums of a conv (NCHW x OIHW, `groups` groups) with the spec's strides, pads
    and dilations."""
    pt, pb, pl, pr = spec.pads
    return conv2d_ref(x, w, spec.strides, (pt, pl, pb, pr), spec.dilations, groups, acc=np.int64)


@dataclass(frozen=True)
class Requant:
    """Epilogue on the int32 accumulator: out = clip((acc + half) >> shift, lo, hi) as int8, acc
    already holding the bias; half = 2^(shift-1) when `round` (round half up), else 0; a negative
    shift shifts left. With a fixed-point multiplier (mul != 1, for scales that are not powers of
    two: compiler.graph.ops.fixed_multiplier) it is clip(sat((acc * mul + 2^(shift-1)) >> shift)),
    the ALU's SCALE then a clamp. A zero point (an asymmetric output) is added before the clamp.
    Every other step wraps at 32 bits like the ALU."""
    shift: int = 0
    lo: int = -128
    hi: int = 127
    round: bool = False
    mul: int = 1
    zero_point: int = 0

    @property
    def fixed_point(self) -> bool:
        return self.mul != 1

    def apply(self, acc: np.ndarray) -> np.ndarray:
        def wrap(v):
            return v.astype(np.int64).astype(np.int32).astype(np.int64)
        acc = acc.astype(np.int64)
        if self.fixed_point:   # as SCALE (saturating to 32 bits), then the zero point and the clamp
            v = np.clip(shift_right_round(acc * self.mul, self.shift), -(1 << 31), (1 << 31) - 1)
            return np.clip(wrap(v + self.zero_point), self.lo, self.hi)
        if self.round and self.shift > 0:
            acc = wrap(acc + (1 << (self.shift - 1)))
        acc = acc >> self.shift if self.shift >= 0 else wrap(acc << -self.shift)
        return np.clip(wrap(acc + self.zero_point), self.lo, self.hi)


@dataclass(frozen=True)
class ConvTiling:
    o_t: int     # output-channel blocks per tile
    h_t: int     # output rows per tile
    w_t: int     # output columns per tile
    ic_t: int    # input-channel blocks per chunk
    vt: int      # virtual threads: buffer slots that tiles rotate through
    #: the input tile holds, per input block, one h_t x w_t band per kernel tap: the pixels that tap
    #: reads (an im2col by tap), instead of the window the tile's taps span; for dilated convs,
    #: whose windows span many more pixels than their taps read (stride 1 across columns)
    gather: bool = False

    def describe(self) -> str:
        return (f"o_t={self.o_t} h_t={self.h_t} w_t={self.w_t} ic_t={self.ic_t} vt={self.vt}"
                + (" gather" if self.gather else ""))


@dataclass(frozen=True)
class ResidualAdd:
    """A residual add fused into the conv epilogue: out = requant((y << ka) + (r << kb)), y the
    conv's own requantized result (still in the accumulator), r an int8 tensor in the output's
    packed layout (N/b, O/bo, OH, OW, b, bo). r enters the input buffer beside the last input
    chunk of each tile and is summed by a GEMM against an identity tile (2^(kb-ka) I when
    kb > ka) kept in the weight buffer's last entry. Needs block_in == block_out, kb - ka <= 6."""
    buf: object
    ident: object   # DRAM buffer holding residual_identity(cfg, ka, kb)
    ka: int = 0
    kb: int = 0
    requant: Requant = Requant()


@dataclass(frozen=True)
class WeightRegion:
    """Where a layer's whole packed weights live in the weight buffer across inferences (weights
    resident between runs of a module): entry `base` on, chunk by input-channel chunk (chunk ic0's
    (output block, ic) rows at base + blocks_out * ic0). load=True: the program loads them there
    (a module's first run); False: they are already there and the program loads none.
    bias_base: the accumulator entry from which the layer's bias (a block per output-channel block)
    stays likewise (None: loaded every run, past the tile slots)."""
    base: int
    load: bool = True
    bias_base: int | None = None


def can_gather(spec: Conv2dSpec) -> bool:
    """Whether a layer can tile its input by tap (ConvTiling.gather): a dilated kernel with unit
    column stride (a tap's band then is a 2-D block of the input, one LOAD)."""
    return spec.dilations != (1, 1) and spec.strides[1] == 1


def input_entries(spec: Conv2dSpec, t: ConvTiling, h_a: int | None = None, w_a: int | None = None) -> int:
    """Input-buffer entries one input block of an h_a x w_a output tile takes (default the
    tiling's full tile): its window, or with t.gather a band per tap."""
    h_a, w_a = h_a or t.h_t, w_a or t.w_t
    if t.gather:
        return spec.kh * spec.kw * h_a * w_a
    return ((h_a - 1) * spec.strides[0] + spec.span_h) * ((w_a - 1) * spec.strides[1] + spec.span_w)


def weight_region_entries(spec: Conv2dSpec, cfg: AccelConfig) -> int:
    """Weight-buffer entries a layer's resident weights take (every output x input block, every tap)."""
    g = _Geom.of(spec, cfg)
    return g.ob * g.cb * spec.kh * spec.kw


def residual_identity(cfg: AccelConfig, ka: int, kb: int) -> np.ndarray:
    """The one weight tile a fused residual add multiplies r by: 2^max(kb - ka, 0) * I."""
    if cfg.block_in != cfg.block_out:
        raise TilingError(f"a fused residual add needs block_in == block_out ({cfg.block_in} != {cfg.block_out})")
    if kb - ka > 6 or min(ka, kb) < 0:
        raise TilingError(f"a fused residual add needs 0 <= kb - ka <= 6 and shifts >= 0 (ka={ka}, kb={kb})")
    return (np.eye(cfg.block_out, cfg.block_in, dtype=np.int8) << max(kb - ka, 0))[None].astype(np.int8)


@dataclass(frozen=True)
class _Geom:
    """Blocked sizes of a layer under a config."""
    nb: int
    cb: int
    ob: int

    @classmethod
    def of(cls, spec: Conv2dSpec, cfg: AccelConfig) -> "_Geom":
        return cls(_ceil(spec.n, cfg.batch), _ceil(spec.c, cfg.block_in), _ceil(spec.o, cfg.block_out))


#: accumulator entries per tile slot after the bias entries that hold REQUANT operands (one for
#: the conv's requantization, one for a fused residual's)
PARAM_ENTRIES = 2


def is_dense(spec: Conv2dSpec) -> bool:
    """Whether the layer is a dense one: a 1x1 conv over 1x1 images, whose packed input
    (N/b, C/bi, 1, 1, b, bi) is the dense packing (rows/b, K/bi, b, bi). compiler.accel.dense emits
    it with the rows streamed past resident weights instead of one image (one row block) a tile."""
    return spec.h == spec.w == spec.kh == spec.kw == 1 and not any(spec.pads)


def dense_view(spec: Conv2dSpec, cfg: AccelConfig) -> Conv2dSpec:
    """A dense layer as the planner sees it: one image whose pixels are the row blocks, so that a
    tiling's w_t is the row blocks a tile streams (ConvTiling of a dense layer: o_t output blocks,
    w_t row blocks, ic_t input blocks per chunk, h_t 1)."""
    return Conv2dSpec(n=cfg.batch, c=spec.c, h=1, w=_ceil(spec.n, cfg.batch), o=spec.o, kh=1, kw=1, name=spec.name)
