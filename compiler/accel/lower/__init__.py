"""conv2d and dense reach the accelerator through tensor expressions, a schedule and loop-IR passes.

    func = lower_conv2d(spec, cfg, Requant(8, 0, 127), vt=2)   # printable PrimFunc
    y, result, stream = run_conv2d(device, x, w, bias, spec, requant, vt=2)

Pipeline: schedule.schedule_conv2d (te) -> compiler.lower (raw loop nests) -> FlattenStorage,
Simplify -> passes.pipeline (LiftGuards, InjectALU, InjectDMA, FoldUopLoop, InjectTokens,
LowerVirtualThreads, Simplify) -> codegen.AccelCodegen (CommandStream calls).
"""
from __future__ import annotations

import logging

import numpy as np

from accel.isa import AccelConfig

from ...lower import lower
from ...tir.passes import get_pass
from ...tir.stmt import PrimFunc
from ..layout import pack_activation, pack_bias, pack_weight, pad_to, unpack_activation
from ..plan import plan_conv2d
from ..spec import Conv2dSpec, ConvTiling, Requant, _ceil
from .codegen import AccelCodegen
from .env import AccelEnv, LowerError
from .passes import pipeline
from .schedule import conv2d_compute, schedule_conv2d

log = logging.getLogger(__name__)

__all__ = ["AccelEnv", "LowerError", "lower_conv2d", "build_conv2d", "run_conv2d", "run_dense",
           "conv2d_compute", "schedule_conv2d", "PASSES"]


def _run_passes(func: PrimFunc, env: AccelEnv, stop_after: str | None = None) -> PrimFunc:
    for name in ("FlattenStorage", "Simplify"):
        func = get_pass(name)(func)
    for name, p, _why in pipeline(env):
        func = p(func)
        log.debug("after %s:\n%s", name, func)
        if name == stop_after:
            break
    return func


def lower_conv2d(spec: Conv2dSpec, cfg: AccelConfig, requant: Requant = Requant(), vt: int = 2,
                 bias: bool = True, tiling: ConvTiling | None = None, stop_after: str | None = None) -> PrimFunc:
    """The lowered TIR of a conv2d on the accelerator (tiling from plan_conv2d unless given)."""
    if spec.dilations != (1, 1):
        raise LowerError(f"{spec.name}: the tensor-expression lowering has no dilated convolution (dilations "
                         f"{spec.dilations}); compiler.accel.emit has")
    env = AccelEnv(cfg)
    tiling = tiling or plan_conv2d(spec, cfg, vt)
    s, t = schedule_conv2d(env, spec, tiling, requant, bias)
    func = lower(s, t.args, name=spec.name, raw=True)
    func = _run_passes(func, env, stop_after)
    func.attrs["tiling"] = tiling
    return func


def build_conv2d(spec: Conv2dSpec, cfg: AccelConfig, requant: Requant = Requant(), vt: int = 2, bias: bool = True,
                 tiling: ConvTiling | None = None) -> "AccelModule":
    return AccelModule(AccelEnv(cfg), lower_conv2d(spec, cfg, requant, vt, bias, tiling))


class AccelModule:
    """A lowered accelerator function: emit(stream, *device buffers) appends its instructions."""

    def __init__(self, env: AccelEnv, func: PrimFunc):
        self.env, self.func = env, func

    def emit(self, stream, *bufs) -> None:
        if len(bufs) != len(self.func.params):
            raise LowerError(f"{self.func.name}: {len(self.func.params)} buffers expected "
                             f"({', '.join(b.name for b in self.func.params)}), got {len(bufs)}")
        AccelCodegen(self.env, self.func, stream, dict(zip(self.func.params, bufs))).run()


def run_conv2d(device, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, spec: Conv2dSpec,
               requant: Requant = Requant(), vt: int = 2, tiling: ConvTiling | None = None):
    """As compiler.accel.conv2d.run_conv2d, through the TE pipeline: (int8 NCHW, RunResult, stream)."""
    cfg = device.cfg
    mod = build_conv2d(spec, cfg, requant, vt, bias is not None, tiling)
    nb, ob = _ceil(spec.n, cfg.batch), _ceil(spec.o, cfg.block_out)
    mem = device.memory
    bufs = [mem.alloc_array(pack_activation(x, cfg.batch, cfg.block_in), align=cfg.inp_elem_bytes,
                            name=f"{spec.name}.inp"),
            mem.alloc_array(pack_weight(w, cfg.block_out, cfg.block_in), align=cfg.wgt_elem_bytes,
                            name=f"{spec.name}.wgt")]
    if bias is not None:
        bufs.append(mem.alloc_array(pack_bias(bias, cfg), align=cfg.acc_elem_bytes, name=f"{spec.name}.bias"))
    oshape = (nb, ob, spec.oh, spec.ow, cfg.batch, cfg.block_out)
    out = mem.alloc(int(np.prod(oshape)) * cfg.out_width // 8, align=cfg.out_elem_bytes, name=f"{spec.name}.out")
    bufs.append(out)
    try:
        stream = device.stream()
        mod.emit(stream, *bufs)
        result = stream.synchronize()
        y = unpack_activation(out.read(np.int8, oshape), spec.n, spec.o)
    finally:
        for b in bufs:
            b.free()
    return y, result, stream


def run_dense(device, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, requant: Requant = Requant(),
              vt: int = 2):
    """int8 (rows x k) @ int8 (m x k)^T through the TE pipeline, as the 1x1 conv of Conv2dSpec.dense
    (one image whose pixel p holds row p*batch + n)."""
    cfg = device.cfg
    rows, k = x.shape
    m = w.shape[0]
    spec = Conv2dSpec.dense(rows, k, m, cfg)
    nchw = pad_to(x, 0, cfg.batch).reshape(spec.w, cfg.batch, k).transpose(1, 2, 0)[:, :, None, :]
    y, result, stream = run_conv2d(device, nchw, w.reshape(m, k, 1, 1), bias, spec, requant, vt)
    return y[:, :, 0, :].transpose(2, 0, 1).reshape(-1, m)[:rows], result, stream
