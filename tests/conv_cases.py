"""Shared conv2d test cases: random int8 operands, ResNet-18 layers (compiler/accel/workloads.py), and
a bit-exact check of any conv2d runner (the template's or the TE path's) against the numpy reference."""
import numpy as np

from accel.isa import AccelConfig
from compiler.accel.conv2d import Conv2dSpec, conv2d_reference
from compiler.accel.workloads import load_layers
from host_runtime import Device

#: a config whose blocks differ (batch 2, 8 input x 16 output lanes) and whose buffers are small
ODD = AccelConfig(batch=2, block_in=8, block_out=16, acc_buff_bytes=64 * 1024, out_buff_bytes=16 * 1024,
                  inp_buff_bytes=8 * 1024, wgt_buff_bytes=32 * 1024)


def resnet_layers() -> dict[str, list[int]]:
    return load_layers()


def resnet_layer(name: str) -> Conv2dSpec:
    return Conv2dSpec.from_workload(resnet_layers()[name], name)


def rand_conv(rng, spec, bias=True):
    x = rng.integers(-128, 128, (spec.n, spec.c, spec.h, spec.w), dtype=np.int8)
    w = rng.integers(-128, 128, (spec.o, spec.c, spec.kh, spec.kw), dtype=np.int8)
    b = rng.integers(-20000, 20000, spec.o).astype(np.int32) if bias else None
    return x, w, b


def check_conv(run_conv2d, cfg, spec, rq, vt=2, seed=0, bias=True):
    """run_conv2d(device, x, w, b, spec, rq, vt) -> (y, result, stream) must equal the reference."""
    x, w, b = rand_conv(np.random.default_rng(seed), spec, bias)
    y, res, stream = run_conv2d(Device(cfg, dram_bytes=32 << 20), x, w, b, spec, rq, vt)
    ref = conv2d_reference(x, w, b, spec, rq)
    assert y.shape == ref.shape and np.array_equal(y, ref), f"{spec} vt={vt} mismatch"
    return y, res, stream
