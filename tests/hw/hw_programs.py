"""Directed programs for the RTL tests: the accel.isa-only ones live in sim/rtl/programs.py (bench
uses them too); the convolution layer here goes through the compiler and the host runtime."""
from __future__ import annotations

import numpy as np

from accel.isa import AccelConfig
from compiler.accel.conv2d import Conv2dSpec, Requant, conv2d_candidates, conv2d_reference, emit_conv2d, plan_conv2d
from compiler.accel.layout import pack_activation, pack_bias, pack_weight, unpack_activation
from host_runtime import Device
from sim.rtl.programs import Builder, alu_ops, every_kind, gemm_only, long_rows, padding, pipelined_matmul, uop_loops  # noqa: F401

#: a dilated conv whose pads pass a LOAD's padding fields (zero runs written by LOADs of padding only)
DILATED = Conv2dSpec(n=1, c=8, h=6, w=6, o=8, kh=3, kw=3, pads=(2, 17, 3, 16), name="dilated", dilations=(2, 3))


def conv_layer(cfg: AccelConfig, seed: int = 0, spec: Conv2dSpec | None = None, gather: bool | None = None):
    """A small convolution layer (default: 8 -> 8 channels, 6x6, 3x3 kernel, padding 1, bias,
    requantized to int8) as the kit's compiler emits it (compiler.accel.conv2d, two virtual
    threads); gather: the best tiling with (True) or without (False) gathered input tiles.
    Returns (program, read_output(dram) -> NCHW int8, numpy reference NCHW int8)."""
    rng = np.random.default_rng(seed)
    spec = spec or Conv2dSpec(n=1, c=8, h=6, w=6, o=8, kh=3, kw=3, pads=(1, 1, 1, 1), name="conv")
    tiling = plan_conv2d(spec, cfg, vt=2) if gather is None else next(
        t for _, t in conv2d_candidates(spec, cfg, 2) if t.gather == gather)
    requant = Requant(shift=7, lo=-128, hi=127)
    x = rng.integers(-128, 128, (1, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    bias = rng.integers(-3000, 3000, spec.o).astype(np.int32)
    dev = Device(cfg, driver=None, dram_bytes=1 << 20)
    mem = dev.memory
    inp = mem.alloc_array(pack_activation(x, cfg.batch, cfg.block_in), align=64)
    wgt = mem.alloc_array(pack_weight(w, cfg.block_out, cfg.block_in), align=64)
    bb = mem.alloc_array(pack_bias(bias, cfg), align=64)
    oshape = (1, spec.o // cfg.block_out, spec.oh, spec.ow, cfg.batch, cfg.block_out)
    out = mem.alloc_array(rng.integers(-128, 128, oshape, dtype=np.int8), align=64)
    stream = dev.stream()
    emit_conv2d(stream, spec, tiling, inp, wgt, out, bb, requant)
    prog = stream.program()
    addr = out.addr

    def read_output(dram: np.ndarray) -> np.ndarray:
        n = int(np.prod(oshape))
        return unpack_activation(dram[addr:addr + n].view(np.int8).reshape(oshape), spec.n, spec.o)

    return prog, read_output, conv2d_reference(x, w, bias, spec, requant)
