"""The compiler's names for the accelerator's blocked layouts (defined in accel.isa.layout).

Activations N C H W n c, weights O I H W o i, biases one accumulator entry per output block;
channels zero-padded to whole blocks. These keep the block sizes as arguments, as the compiler's
tiling code has them at hand.
"""
from __future__ import annotations

import numpy as np

from accel.isa import AccelConfig, LayoutError, layout
from accel.isa.layout import blocks  # noqa: F401  (re-exported: the compiler's callers import it here)


def pad_to(x: np.ndarray, axis: int, multiple: int) -> np.ndarray:
    """x zero-padded along `axis` to a multiple of `multiple`."""
    extra = (-x.shape[axis]) % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return np.pad(x, widths)


def _rank(x: np.ndarray, what: str, layout_name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 4:
        raise LayoutError(f"{what} expects {layout_name} (4-D), got shape {x.shape}")
    return x


def pack_activation(x: np.ndarray, batch: int, block: int) -> np.ndarray:
    """(N, C, H, W) -> (N/batch, C/block, H, W, batch, block), N and C zero-padded up."""
    return layout.pack_blocked(_rank(x, "pack_activation", "NCHW"), (batch, block))


def unpack_activation(p: np.ndarray, n: int, c: int) -> np.ndarray:
    """(N/batch, C/block, H, W, batch, block) -> (n, c, H, W), cutting the padding."""
    return layout.unpack_blocked(p, (n, c))


def pack_weight(w: np.ndarray, block_out: int, block_in: int) -> np.ndarray:
    """(O, I, KH, KW) -> (O/bo, I/bi, KH, KW, bo, bi), O and I zero-padded up."""
    return layout.pack_blocked(_rank(w, "pack_weight", "OIHW"), (block_out, block_in))


def unpack_weight(p: np.ndarray, o: int, i: int) -> np.ndarray:
    """(O/bo, I/bi, KH, KW, bo, bi) -> (o, i, KH, KW)."""
    return layout.unpack_blocked(p, (o, i))


def pack_bias(bias: np.ndarray, cfg: AccelConfig) -> np.ndarray:
    """(O,) int32 -> (O/bo, batch, bo): one accumulator entry per output block, same for every row."""
    return layout.pack_bias(np.asarray(bias), cfg, np.int32)
