"""Layout helpers: NCHW/OIHW <-> the accelerator's blocked layouts, channels padded to the block.

Activations: N C H W n c with (n, c) = (BATCH, BLOCK_IN) for inputs and (BATCH, BLOCK_OUT) for
outputs; one DRAM entry of the accelerator is one (n, c) tile. Weights: O I H W o i with
(o, i) = (BLOCK_OUT, BLOCK_IN); one entry is an (o, i) tile. Padding is zero, so padded input
channels contribute nothing and padded output channels are cut off by unpack.
"""
from __future__ import annotations

import numpy as np

from accel.isa import AccelConfig


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def pad_to(x: np.ndarray, axis: int, multiple: int) -> np.ndarray:
    extra = (-x.shape[axis]) % multiple
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return np.pad(x, widths)


def pack_activation(x: np.ndarray, batch: int, block: int) -> np.ndarray:
    """(N, C, H, W) -> (N/batch, C/block, H, W, batch, block), N and C zero-padded up."""
    if x.ndim != 4:
        raise ValueError(f"pack_activation expects NCHW (4-D), got shape {x.shape}")
    x = pad_to(pad_to(x, 0, batch), 1, block)
    n, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(n // batch, batch, c // block, block, h, w).transpose(0, 2, 4, 5, 1, 3))


def unpack_activation(p: np.ndarray, n: int, c: int) -> np.ndarray:
    """(N/batch, C/block, H, W, batch, block) -> (n, c, H, W), cutting the padding."""
    nb, cb, h, w, b, k = p.shape
    return np.ascontiguousarray(p.transpose(0, 4, 1, 5, 2, 3).reshape(nb * b, cb * k, h, w)[:n, :c])


def pack_weight(w: np.ndarray, block_out: int, block_in: int) -> np.ndarray:
    """(O, I, KH, KW) -> (O/bo, I/bi, KH, KW, bo, bi), O and I zero-padded up."""
    if w.ndim != 4:
        raise ValueError(f"pack_weight expects OIHW (4-D), got shape {w.shape}")
    w = pad_to(pad_to(w, 0, block_out), 1, block_in)
    o, i, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(o // block_out, block_out, i // block_in, block_in, kh, kw)
                                .transpose(0, 2, 4, 5, 1, 3))


def unpack_weight(p: np.ndarray, o: int, i: int) -> np.ndarray:
    ob, ib, kh, kw, bo, bi = p.shape
    return np.ascontiguousarray(p.transpose(0, 4, 1, 5, 2, 3).reshape(ob * bo, ib * bi, kh, kw)[:o, :i])


def pack_bias(bias: np.ndarray, cfg: AccelConfig) -> np.ndarray:
    """(O,) int32 -> (O/bo, batch, bo): one accumulator entry per output block, same for every row."""
    b = pad_to(np.asarray(bias, np.int32), 0, cfg.block_out).reshape(-1, 1, cfg.block_out)
    return np.ascontiguousarray(np.broadcast_to(b, (b.shape[0], cfg.batch, cfg.block_out)))


def blocks(n: int, block: int) -> int:
    return _ceil(n, block)

