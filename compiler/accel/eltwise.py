"""Elementwise int8 add (residual connections) on the accelerator, through the GEMM core.

The tensor ALU only reads the accumulator, so the two int8 operands enter through the input
buffer and reach the accumulator by GEMMs against an identity weight tile:
acc = a; acc <<= (ka - kb); acc += b; acc <<= kb (operands ordered so ka >= kb), which is
(a << ka) + (b << kb) modulo 2^32 as the int32 reference computes it; then the requantization
epilogue. Operands and result share the packed activation layout (N/b, C/bo, H, W, b, bo), so
block_in must equal block_out.
"""
from __future__ import annotations

import numpy as np

from accel.isa import AccelConfig, AluOp, MemType

from .conv2d import Requant, TilingError, emit_requant
from .layout import pack_activation, unpack_activation
from .pipeline import TokenPipeline


def identity_weights(cfg: AccelConfig) -> np.ndarray:
    """One weight tile holding the identity (int8)."""
    return np.eye(cfg.block_out, cfg.block_in, dtype=np.int8)[None]


def emit_add(stream, n_entries: int, a, b, out, ident, ka: int = 0, kb: int = 0, requant: Requant = Requant(),
             vt: int = 2, name: str = "add") -> dict[str, int]:
    """Append out = requant((a << ka) + (b << kb)) over n_entries packed entries.
    `ident` is a DRAM buffer holding identity_weights(cfg)."""
    cfg = stream.cfg
    if cfg.block_in != cfg.block_out:
        raise TilingError(f"{name}: needs block_in == block_out to add packed activations "
                          f"(config has {cfg.block_in} and {cfg.block_out})")
    for k in (ka, kb):
        if not 0 <= k < cfg.acc_width:
            raise TilingError(f"{name}: operand shift {k} outside [0, {cfg.acc_width - 1}]")
    if ka < kb:  # the operand shifted more enters first
        a, b, ka, kb = b, a, kb, ka
    e_t = min(n_entries, cfg.inp_depth // (2 * vt), cfg.acc_depth // vt, (1 << 14) - 1)
    if e_t < 1:
        raise TilingError(f"{name}: input buffer of {cfg.inp_depth} entries cannot hold {2 * vt} operand tiles")
    starts = list(range(0, n_entries, e_t))
    pipe = TokenPipeline(stream, vt, len(starts), len(starts))

    def walk(k, src):
        k.loop_begin(n, dst_factor=1, src_factor=1)
        k.push(acc_base, src, 0)
        k.loop_end()
    for t, e0 in enumerate(starts):
        n = min(e_t, n_entries - e0)
        inp_base, acc_base = (t % vt) * 2 * e_t, (t % vt) * e_t
        pipe.before_load(t)
        stream.load_2d(MemType.INP, inp_base, a, e0, x_size=n)
        stream.load_2d(MemType.INP, inp_base + e_t, b, e0, x_size=n)
        if t == 0:
            stream.load_2d(MemType.WGT, 0, ident, 0, x_size=1)
        pipe.after_load()
        pipe.before_compute()
        pipe.before_tile(t)
        ew = stream.kernel(("add.ew", acc_base, n), lambda k: walk(k, 0))
        stream.push_gemm(ew, reset=True)
        stream.push_gemm(stream.kernel(("add.gemm", acc_base, inp_base, n), lambda k: walk(k, inp_base)))
        if ka > kb:
            stream.push_alu(ew, AluOp.SHR, -(ka - kb))
        stream.push_gemm(stream.kernel(("add.gemm", acc_base, inp_base + e_t, n), lambda k: walk(k, inp_base + e_t)))
        if kb:
            stream.push_alu(ew, AluOp.SHR, -kb)
        pipe.after_chunk(t)
        emit_requant(stream, ew, requant)
        pipe.after_tile()
        pipe.before_store()
        stream.store_2d(acc_base, out, e0, x_size=n)
        pipe.after_store(t)
    return {"tiles": len(starts)}


def run_add(device, a: np.ndarray, b: np.ndarray, ka: int = 0, kb: int = 0, requant: Requant = Requant(),
            vt: int = 2):
    """int8 NCHW a + b on the device -> (int8 NCHW, RunResult)."""
    cfg = device.cfg
    if a.shape != b.shape:
        raise TilingError(f"add: operand shapes differ: {a.shape} vs {b.shape}")
    mem = device.memory
    pa, pb = (pack_activation(t, cfg.batch, cfg.block_out) for t in (a, b))
    bufs = [mem.alloc_array(p, align=cfg.inp_elem_bytes, name=f"add.{i}") for i, p in enumerate((pa, pb))]
    bufs.append(mem.alloc_array(identity_weights(cfg), align=cfg.wgt_elem_bytes, name="add.identity"))
    out = mem.alloc(pa.nbytes, align=cfg.out_elem_bytes, name="add.out")
    try:
        stream = device.stream()
        emit_add(stream, pa.size // cfg.inp_elem_bytes, bufs[0], bufs[1], out, bufs[2], ka, kb, requant, vt)
        result = stream.synchronize()
        y = unpack_activation(out.read(np.int8, pa.shape), a.shape[0], a.shape[1])
    finally:
        for buf in bufs + [out]:
            buf.free()
    return y, result


def add_reference(a, b, ka=0, kb=0, requant: Requant = Requant()) -> np.ndarray:
    acc = ((a.astype(np.int64) << ka) + (b.astype(np.int64) << kb)).astype(np.int32)
    return requant.apply(acc).astype(np.int8)
