"""Blocked layouts: how tensors sit in DRAM so that one LOAD/STORE entry is one on-chip tile.

One contract for the compiler, the runtime and the tests:

- activations N C H W -> N' C' H W n c, (n, c) = (batch, block_in) for inputs and
  (batch, block_out) for outputs: one INP/OUT entry is an (n, c) tile;
- weights O I H W -> O' I' H W o i, (o, i) = (block_out, block_in): one WGT entry;
- dense operands: an (M, K) input is N C with no spatial axes, an (K, N) weight is its
  transpose's O I; biases (O,) -> (O', batch, block_out): one ACC entry per output block, the
  same values in every batch row.

N and C are zero-padded up to whole blocks, so padded input channels add nothing to a GEMM and
padded output channels are cut off by unpack.
"""
from __future__ import annotations

import operator

import numpy as np

from .config import AccelConfig
from .errors import LayoutError


def blocks(n: int, block: int) -> int:
    """Whole blocks of `block` that hold n elements."""
    return -(-n // block)


def inp_block(cfg: AccelConfig) -> tuple[int, int]:
    """(n, c) of an INP entry."""
    return cfg.batch, cfg.block_in


def out_block(cfg: AccelConfig) -> tuple[int, int]:
    """(n, c) of an ACC/OUT entry."""
    return cfg.batch, cfg.block_out


def wgt_block(cfg: AccelConfig) -> tuple[int, int]:
    """(o, i) of a WGT entry."""
    return cfg.block_out, cfg.block_in


def _block_pair(block, what: str) -> tuple[int, int]:
    try:
        b0, b1 = (operator.index(b) for b in block)
    except (TypeError, ValueError):
        raise LayoutError(f"{what}: block {block!r} must be two positive integers") from None
    if b0 < 1 or b1 < 1:
        raise LayoutError(f"{what}: block {block!r} must be two positive integers")
    return b0, b1


def pack_blocked(x: np.ndarray, block, out_blocks: tuple[int, int] | None = None) -> np.ndarray:
    """N C ... -> N' C' ... b0 b1 (contiguous, x's dtype), N and C zero-padded to whole blocks.
    out_blocks: (N', C') when more blocks than the data needs are wanted (zeros)."""
    x = np.asarray(x)
    b0, b1 = _block_pair(block, "pack")
    if x.ndim < 2:
        raise LayoutError(f"pack: needs at least 2 dims (N C ...), got shape {x.shape}")
    n, c = x.shape[:2]
    rest = x.shape[2:]
    n2, c2 = blocks(n, b0), blocks(c, b1)
    if out_blocks is not None:
        if out_blocks[0] < n2 or out_blocks[1] < c2:
            raise LayoutError(f"pack: out_blocks {tuple(out_blocks)} cannot hold shape {x.shape} in "
                              f"blocks {(b0, b1)} (needs at least {(n2, c2)})")
        n2, c2 = out_blocks
    if (n2 * b0, c2 * b1) == (n, c):
        xp = x
    else:
        xp = np.zeros((n2 * b0, c2 * b1, *rest), x.dtype)
        xp[:n, :c] = x
    r = len(rest)
    return np.ascontiguousarray(xp.reshape(n2, b0, c2, b1, *rest).transpose(0, 2, *range(4, 4 + r), 1, 3))


def unpack_blocked(x: np.ndarray, shape=None) -> np.ndarray:
    """N' C' ... b0 b1 -> N C ... (contiguous), cropped to shape[:2] (None keeps the padding; a crop
    beyond the packed extent keeps all of it, as the runtime's step check assumes)."""
    x = np.asarray(x)
    if x.ndim < 4:
        raise LayoutError(f"unpack: needs at least 4 dims (N' C' ... b0 b1), got shape {x.shape}")
    r = x.ndim - 4
    n2, c2, b0, b1 = x.shape[0], x.shape[1], x.shape[-2], x.shape[-1]
    rest = x.shape[2:2 + r]
    y = x.transpose(0, 2 + r, 1, 3 + r, *range(2, 2 + r)).reshape(n2 * b0, c2 * b1, *rest)
    if shape is None:
        return np.ascontiguousarray(y)
    try:
        n, c = operator.index(shape[0]), operator.index(shape[1])
    except (TypeError, ValueError, IndexError):
        raise LayoutError(f"unpack: shape {shape!r} must start with two integers (N, C)") from None
    if n < 0 or c < 0:
        raise LayoutError(f"unpack: shape {tuple(shape)} has a negative extent")
    return np.ascontiguousarray(y[:n, :c])   # (a crop beyond the packed extent keeps all of it)


def pack_activation(x: np.ndarray, cfg: AccelConfig, channels: str = "in") -> np.ndarray:
    """(N, C, H, W) -> INP (channels='in') or OUT/ACC ('out') entries (N', C', H, W, n, c)."""
    x = np.asarray(x)
    if x.ndim != 4:
        raise LayoutError(f"pack_activation: expects NCHW (4-D), got shape {x.shape}")
    if channels not in ("in", "out"):
        raise LayoutError(f"pack_activation: channels={channels!r} must be 'in' or 'out'")
    return pack_blocked(x, inp_block(cfg) if channels == "in" else out_block(cfg))


def pack_weight(w: np.ndarray, cfg: AccelConfig) -> np.ndarray:
    """(O, I, KH, KW) or a dense (O, I) -> WGT entries (O', I', [KH, KW,] o, i)."""
    w = np.asarray(w)
    if w.ndim not in (2, 4):
        raise LayoutError(f"pack_weight: expects OIHW (4-D) or OI (2-D), got shape {w.shape}")
    return pack_blocked(w, wgt_block(cfg))


def pack_bias(bias: np.ndarray, cfg: AccelConfig, dtype=None, out_blocks: int | None = None) -> np.ndarray:
    """(O,) -> ACC entries (O', batch, block_out), each block's values repeated in every batch row.
    dtype: the accumulator's (int<acc_width>) unless given; out_blocks: O' when more are wanted."""
    b = np.asarray(bias)
    if b.ndim != 1:
        raise LayoutError(f"pack_bias: expects a 1-D (O,) bias, got shape {b.shape}")
    dtype = np.dtype(f"<i{cfg.acc_width // 8}") if dtype is None else dtype
    nb = blocks(b.shape[0], cfg.block_out)
    if out_blocks is not None:
        if out_blocks < nb:
            raise LayoutError(f"pack_bias: out_blocks {out_blocks} cannot hold {b.shape[0]} channels "
                              f"(needs {nb} blocks of {cfg.block_out})")
        nb = out_blocks
    p = np.zeros(nb * cfg.block_out, dtype)
    p[:b.shape[0]] = b
    return np.ascontiguousarray(np.broadcast_to(p.reshape(nb, 1, cfg.block_out), (nb, cfg.batch, cfg.block_out)))
