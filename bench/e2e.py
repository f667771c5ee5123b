"""End-to-end benchmark of the cpu and accel targets on networks from plain ONNX ops with seeded random
weights: the zoo's tiny CNN, MLP and transformer encoder, ResNet-18 (224x224) and a MobileNetV2-like
network; with --nets also MobileNetV3-, EfficientNet-, U-Net-, YOLO- and ViT-style networks;
optionally the classic vision models shipped in the onnx wheel (--light).

Per network, printed as a table and written as JSON (bench/results/e2e.json):
  cpu target: latency against onnxruntime, measured alternately in the same run, quiet and while a
    busy-loop process holds one core (--busy-pin CPU pins it), each condition repeated --cycles
    times in turn (ratio = median of the per-cycle ratios; the machine's load average is recorded
    alongside, since other programs move both sides), with the parallel runtime's counters;
  accel target: fraction of MACs offloaded; host time (the CPU steps of a run on fsim); tsim cycles
    against the ideal (offloaded MACs / peak MACs per cycle), per layer with the lower bounds of
    the chosen mapping (compute-stage micro-ops, bus beats) and the floor of any layer-by-layer
    mapping; the same cycles under each DRAM preset of sim.dram (a column per preset; skipped
    where the presets or the tsim driver are absent); where GEMM layers keep their weights on chip
    across inferences (build_model's resident_weights), "resident": the first (cold) run's and the
    second (warm, steady-state) run's cycles against the ideal, on two different inputs;
  compile times, activation memory planned vs naive, and (unless --no-qdq) the net as
    onnxruntime's default QDQ export compiled for the accelerator (bench_qdq).
A section that fails is recorded as "<section>_error" and the run goes on.

    python bench/e2e.py [--nets tiny_cnn,mlp,...] [--light [NAMES|all]] [--quick] [--repeat 10]
                        [--cycles 2] [--busy-pin CPU] [--no-busy] [--no-tsim] [--dram all|none|NAMES]
                        [--no-qdq] [--config default] [--tune [LOG]] [-o PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from accel.isa import INSN_BYTES, decode_program, resolve_config  # noqa: E402
from accel.isa.files import write_atomic  # noqa: E402
from compiler import build_model  # noqa: E402
from compiler.frontend import from_onnx, zoo  # noqa: E402
from compiler.frontend.zoo import ModelBuilder, ort_quantize, sample_inputs  # noqa: E402
from host_runtime import available_drivers  # noqa: E402
from host_runtime.executor import Executor, profile_summary  # noqa: E402
from host_runtime.kernel_cache import runtime_settings  # noqa: E402
from sim.tsim import Tsim  # noqa: E402

#: cpu target / onnxruntime, quiet and under one busy core (issue 34)
CPU_BAR = 1.5
ACCEL_BAR = 1.15


# ---- the networks -------------------------------------------------------------------------------
def resnet18(seed: int = 0, size: int = 224):
    b = ModelBuilder("resnet18", seed)
    x = b.input("image", (1, 3, size, size))

    def cbr(x, cin, cout, k, s, relu=True, name=None):
        y = b.bn(b.conv(x, cin, cout, k=k, stride=s, bias=False, name=name), cout)
        return b.op("Relu", [y]) if relu else y
    y = cbr(x, 3, 64, 7, 2, name="conv1")
    y = b.op("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="pool1")
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for blk in range(2):
            s = 2 if stage > 0 and blk == 0 else 1
            name = f"layer{stage + 1}.{blk}"
            z = cbr(y, cin, cout, 3, s, name=f"{name}.conv1")
            z = cbr(z, cout, cout, 3, 1, relu=False, name=f"{name}.conv2")
            sc = y if (s == 1 and cin == cout) else cbr(y, cin, cout, 1, s, relu=False, name=f"{name}.down")
            y = b.op("Relu", [b.op("Add", [z, sc], name=f"{name}.add")])
            cin = cout
    y = b.op("GlobalAveragePool", [y], name="gap")
    y = b.op("Flatten", [y], axis=1, name="flatten")
    y = b.op("Gemm", [y, b.weight((1000, 512)), b.init(np.zeros(1000, np.float32))], transB=1, name="fc")
    return b.build([y])


def mobilenetv2(seed: int = 0, size: int = 224, width: float = 1.0):
    """MobileNetV2's inverted residual blocks (expand 1x1 - depthwise 3x3 - project 1x1, ReLU6,
    residual when shapes match), the standard stage table."""
    b = ModelBuilder("mobilenetv2", seed)
    x = b.input("image", (1, 3, size, size))

    def ch(c):
        return max(8, int(c * width + 4) // 8 * 8)

    def cbr(x, cin, cout, k, s, group=1, relu6=True, name=None):
        y = b.bn(b.conv(x, cin, cout, k=k, stride=s, group=group, bias=False, name=name), cout)
        return b.op("Clip", [y, b.init(np.float32(0.0)), b.init(np.float32(6.0))]) if relu6 else y
    cin = ch(32)
    y = cbr(x, 3, cin, 3, 2, name="stem")
    table = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    for i, (t, c, n, s) in enumerate(table):
        cout = ch(c)
        for j in range(n):
            stride = s if j == 0 else 1
            name = f"block{i}.{j}"
            hid = cin * t
            z = cbr(y, cin, hid, 1, 1, name=f"{name}.expand") if t != 1 else y
            z = cbr(z, hid, hid, 3, stride, group=hid, name=f"{name}.dw")
            z = cbr(z, hid, cout, 1, 1, relu6=False, name=f"{name}.project")
            y = b.op("Add", [z, y], name=f"{name}.add") if stride == 1 and cin == cout else z
            cin = cout
    y = cbr(y, cin, 1280, 1, 1, name="head")
    y = b.op("GlobalAveragePool", [y], name="gap")
    y = b.op("Flatten", [y], axis=1, name="flatten")
    y = b.op("Gemm", [y, b.weight((1000, 1280)), b.init(np.zeros(1000, np.float32))], transB=1, name="fc")
    return b.build([y])


def mobilenetv3(seed: int = 0, size: int = 224):
    """MobileNetV3-Large's block table: HardSwish or ReLU, 3x3/5x5 depthwise convs, squeeze-
    excitation gates closed by HardSigmoid."""
    b = ModelBuilder("mobilenetv3", seed)
    x = b.input("image", (1, 3, size, size))

    def act(y, hswish):
        return b.op("HardSwish", [y]) if hswish else b.op("Relu", [y])
    y = act(b.bn(b.conv(x, 3, 16, k=3, stride=2, bias=False), 16), True)
    cin = 16
    # kernel, expansion, out channels, SE, HardSwish, stride
    table = [(3, 16, 16, 0, 0, 1), (3, 64, 24, 0, 0, 2), (3, 72, 24, 0, 0, 1), (5, 72, 40, 1, 0, 2),
             (5, 120, 40, 1, 0, 1), (5, 120, 40, 1, 0, 1), (3, 240, 80, 0, 1, 2), (3, 200, 80, 0, 1, 1),
             (3, 184, 80, 0, 1, 1), (3, 184, 80, 0, 1, 1), (3, 480, 112, 1, 1, 1), (3, 672, 112, 1, 1, 1),
             (5, 672, 160, 1, 1, 2), (5, 960, 160, 1, 1, 1), (5, 960, 160, 1, 1, 1)]
    for k, e, c, se, hs, s in table:
        z = act(b.bn(b.conv(y, cin, e, k=1, bias=False), e), hs) if e != cin else y
        z = act(b.bn(b.conv(z, e, e, k=k, stride=s, group=e, bias=False), e), hs)
        if se:
            r = max(8, e // 4)
            g = b.op("Relu", [b.conv(b.op("GlobalAveragePool", [z]), e, r, k=1)])
            z = b.op("Mul", [z, b.op("HardSigmoid", [b.conv(g, r, e, k=1)], alpha=1 / 6, beta=0.5)])
        z = b.bn(b.conv(z, e, c, k=1, bias=False), c)
        y = b.op("Add", [z, y]) if s == 1 and cin == c else z
        cin = c
    y = act(b.bn(b.conv(y, cin, 960, k=1, bias=False), 960), True)
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])])
    return b.build([b.op("Gemm", [y, b.weight((1000, 960)), b.init(np.zeros(1000, np.float32))], transB=1)])


def efficientnet(seed: int = 0, size: int = 224):
    """EfficientNet-B0's block table: SiLU (x * sigmoid(x), as exported), 3x3/5x5 depthwise
    convs, a squeeze-excitation gate in every block."""
    b = ModelBuilder("efficientnet", seed)
    x = b.input("image", (1, 3, size, size))

    def silu(y):
        return b.op("Mul", [y, b.op("Sigmoid", [y])])
    y = silu(b.bn(b.conv(x, 3, 32, k=3, stride=2, bias=False), 32))
    cin = 32
    for t, c, n, s, k in [(1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
                          (6, 192, 4, 2, 5), (6, 320, 1, 1, 3)]:
        for j in range(n):
            stride, hid = (s if j == 0 else 1), cin * t
            z = silu(b.bn(b.conv(y, cin, hid, k=1, bias=False), hid)) if t != 1 else y
            z = silu(b.bn(b.conv(z, hid, hid, k=k, stride=stride, group=hid, bias=False), hid))
            g = silu(b.conv(b.op("GlobalAveragePool", [z]), hid, max(1, cin // 4), k=1))
            z = b.op("Mul", [z, b.op("Sigmoid", [b.conv(g, max(1, cin // 4), hid, k=1)])])
            z = b.bn(b.conv(z, hid, c, k=1, bias=False), c)
            y = b.op("Add", [z, y]) if stride == 1 and cin == c else z
            cin = c
    y = silu(b.bn(b.conv(y, cin, 1280, k=1, bias=False), 1280))
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y])])
    return b.build([b.op("Gemm", [y, b.weight((1000, 1280)), b.init(np.zeros(1000, np.float32))], transB=1)])


def unet(seed: int = 0, size: int = 128):
    """U-Net: conv-BN-ReLU pairs down three levels by max pooling, up by 2x2 stride-2 transposed
    convs concatenated with the skip paths, a 1x1 conv to two classes."""
    b = ModelBuilder("unet", seed)
    x = b.input("image", (1, 3, size, size))

    def cbr(t, ci, co):
        return b.op("Relu", [b.bn(b.conv(t, ci, co), co)])
    skips, c, t = [], 3, x
    for co in (32, 64, 128):
        t = cbr(cbr(t, c, co), co, co)
        skips.append((t, co))
        c = co
        t = b.op("MaxPool", [t], kernel_shape=[2, 2], strides=[2, 2])
    t, c = cbr(t, c, 256), 256
    for s, co in reversed(skips):
        t = b.op("ConvTranspose", [t, b.weight((c, co, 2, 2))], kernel_shape=[2, 2], strides=[2, 2])
        t = cbr(cbr(b.op("Concat", [t, s], axis=1), 2 * co, co), co, co)
        c = co
    return b.build([b.conv(t, c, 2, k=1)])


def yolo(seed: int = 0, size: int = 256):
    """A YOLO-style detector: SiLU conv stages with residual bottlenecks, an SPP block (chained
    5x5 max pools, concatenated), a nearest 2x upsampling to a second scale, LeakyReLU, and
    255-channel heads (3 anchors x 85)."""
    b = ModelBuilder("yolo", seed)
    x = b.input("image", (1, 3, size, size))

    def cbl(t, ci, co, k=3, s=1):
        y = b.conv(t, ci, co, k=k, stride=s)
        return b.op("Mul", [y, b.op("Sigmoid", [y])])
    t = cbl(cbl(x, 3, 16, s=2), 16, 32, s=2)
    c, feats = 32, []
    for co in (64, 128, 256):
        t = cbl(t, c, co, s=2)
        t = b.op("Add", [t, cbl(cbl(t, co, co // 2, k=1), co // 2, co)])
        c = co
        feats.append(t)
    p1 = b.op("MaxPool", [t], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])
    p2 = b.op("MaxPool", [p1], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])
    t = cbl(b.op("Concat", [t, p1, p2], axis=1), 3 * c, c, k=1)
    up = b.op("Resize", [cbl(t, c, 128, k=1), b.init(np.zeros(0, np.float32)),
                         b.init(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    t2 = b.op("LeakyRelu", [b.conv(cbl(b.op("Concat", [up, feats[1]], axis=1), 256, 128), 128, 64)], alpha=0.1)
    return b.build([b.conv(t, c, 255, k=1), b.conv(t2, 64, 255, k=1)])


def vit(seed: int = 0, size: int = 224, dim: int = 192, layers: int = 2, heads: int = 3):
    """ViT-Tiny-like: a 16x16 patch-embedding conv, pre-norm encoder layers over 196 tokens
    (a width no vector divides), GELU (erf form), a mean over the tokens, a linear head."""
    b = ModelBuilder("vit", seed)
    x = b.input("image", (1, 3, size, size))
    n, dh = (size // 16) ** 2, dim // heads
    t = b.op("Reshape", [b.conv(x, 3, dim, k=16, stride=16, pad=0), b.init(np.array([1, dim, n], np.int64))])
    t = b.op("Transpose", [t], perm=[0, 2, 1])

    def norm(z):
        return b.op("LayerNormalization", [z, b.init(np.ones(dim, np.float32)), b.init(np.zeros(dim, np.float32))],
                    axis=-1)

    def heads_first(z, perm):
        return b.op("Transpose", [b.op("Reshape", [z, b.init(np.array([1, n, heads, dh], np.int64))])], perm=perm)
    for _ in range(layers):
        q, k, v = b.op("Split", [b.linear(norm(t), dim, 3 * dim), b.init(np.array([dim] * 3, np.int64))], n_out=3,
                       axis=-1)
        q, k, v = heads_first(q, [0, 2, 1, 3]), heads_first(k, [0, 2, 3, 1]), heads_first(v, [0, 2, 1, 3])
        a = b.op("Softmax", [b.op("Mul", [b.op("MatMul", [q, k]), b.init(np.float32(dh ** -0.5))])], axis=-1)
        o = b.op("Transpose", [b.op("MatMul", [a, v])], perm=[0, 2, 1, 3])
        t = b.op("Add", [t, b.linear(b.op("Reshape", [o, b.init(np.array([1, n, dim], np.int64))]), dim, dim)])
        h = b.linear(norm(t), dim, 4 * dim)
        g = b.op("Erf", [b.op("Div", [h, b.init(np.float32(np.sqrt(2.0)))])])
        g = b.op("Mul", [b.op("Mul", [h, b.op("Add", [g, b.init(np.float32(1.0))])]), b.init(np.float32(0.5))])
        t = b.op("Add", [t, b.linear(g, 4 * dim, dim)])
    return b.build([b.linear(b.op("ReduceMean", [t], axes=[1], keepdims=0), dim, 1000)])


def aspp(seed: int = 0, size: int = 65, c: int = 256):
    """DeepLab's atrous spatial pyramid pooling head: a 1x1 conv beside 3x3 convs at dilations 6,
    12 and 18 over one map (65x65: output stride 8 of a 513 image), concatenated, then a 1x1
    classifier over 21 classes. Much of the dilated taps fall in the padding."""
    b = ModelBuilder("aspp", seed)
    x = b.input("x", (1, c, size, size))
    outs = [b.op("Relu", [b.conv(x, c, 64, k=1)])]
    for r in (6, 12, 18):
        w = b.weight((64, c, 3, 3))
        outs.append(b.op("Relu", [b.op("Conv", [x, w], kernel_shape=[3, 3], dilations=[r, r], pads=[r] * 4)]))
    return b.build([b.conv(b.op("Concat", outs, axis=1), 256, 21, k=1)])


def rnn(kind: str = "LSTM", seed: int = 0, steps: int = 32, features: int = 64, hidden: int = 128,
        layers: int = 2):
    """A speech-style recurrent encoder: stacked bidirectional LSTM or GRU layers (PyTorch's gate
    layout, linear_before_reset for GRU) over `steps` frames, then a per-frame linear head."""
    b = ModelBuilder(kind.lower(), seed)
    t = b.input("frames", (steps, 1, features))
    gates, c = {"LSTM": 4, "GRU": 3}[kind], features
    attrs = {"hidden_size": hidden, "direction": "bidirectional"}
    if kind == "GRU":
        attrs["linear_before_reset"] = 1
    for _ in range(layers):
        w, r = b.weight((2, gates * hidden, c), fan_in=c), b.weight((2, gates * hidden, hidden), fan_in=hidden)
        y = b.op(kind, [t, w, r, b.init(np.zeros((2, 2 * gates * hidden), np.float32))], n_out=2, **attrs)[0]
        # Y is (T, 2, 1, H): directions next to each other per frame, as the next layer reads them
        t = b.op("Reshape", [b.op("Transpose", [y], perm=[0, 2, 1, 3]), b.init(np.array([steps, 1, 2 * hidden],
                                                                                           np.int64))])
        c = 2 * hidden
    frames = b.op("Reshape", [t, b.init(np.array([steps, c], np.int64))])
    return b.build([b.linear(frames, c, 40)])


NETS = {"tiny_cnn": zoo.conv_bn_relu_pool, "mlp": zoo.mlp, "transformer_encoder": zoo.transformer_encoder,
        "resnet18": resnet18, "mobilenetv2": mobilenetv2, "mobilenetv3": mobilenetv3, "efficientnet": efficientnet,
        "unet": unet, "yolo": yolo, "vit": vit, "lstm": partial(rnn, "LSTM"), "gru": partial(rnn, "GRU"), "aspp": aspp}
#: the issue's five; the other model classes (not in the issue's set) with --nets
DEFAULT_NETS = "tiny_cnn,mlp,transformer_encoder,resnet18,mobilenetv2"
#: the classic vision models in the onnx wheel (onnx/backend/test/data/light), weights ConstantOfShape
LIGHT = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet",
         "vgg19", "zfnet512")


def load_net(name: str):
    """The ONNX model of a net: a key of NETS, light:<model> (one of LIGHT), or a path ending in
    .onnx (a model of your own with static input shapes, measured the same way)."""
    if name.endswith(".onnx"):
        return onnx.load(name)
    if name.startswith("light:"):
        model = name.split(":", 1)[1]
        path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{model}.onnx"
        if model not in LIGHT or not path.exists():
            raise SystemExit(f"--light {model}: not a light model of this onnx wheel ({', '.join(LIGHT)})")
        return onnx.load(str(path))
    if name not in NETS:
        raise SystemExit(f"--nets {name}: unknown net; nets are {', '.join(NETS)} (and light:<model>)")
    return NETS[name]()


# ---- measurements -------------------------------------------------------------------------------
def timeit_pair(fa, fb, repeat: int, rounds: int = 3) -> tuple[float, float]:
    """Median seconds of fa and fb, measured in alternating blocks (so load from other processes
    hits both alike), each block after a pause and one untimed call: onnxruntime's pool spin-waits
    after a run, and timing the other side right after it would charge that spinning to it."""
    ta, tb = [], []
    per = max(1, -(-repeat // rounds))
    for _ in range(rounds):
        for f, ts in ((fa, ta), (fb, tb)):
            time.sleep(0.1)
            f()
            for _ in range(per):
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
    return float(np.median(ta)), float(np.median(tb))


def cosine(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def tsim_cycles(mod, step) -> tuple[int, str]:
    """Cycles of one accelerator step from the timing model: through the tsim driver when one is
    registered, else sim.tsim directly on the step's instructions decoded from the DRAM image."""
    if "tsim" in available_drivers():
        return None, "driver"
    code = None
    for addr, data in mod.segments:
        if addr <= step.insn_addr < addr + len(data):
            off = step.insn_addr - addr
            code = data[off:off + step.insn_count * INSN_BYTES]
    insns = decode_program(code, mod.config)
    return Tsim(mod.config).run_insns(insns, step.insn_addr).cycles, "sim.tsim"


def bench_qdq(model, feeds, cfg, log, name: str) -> dict:
    """The network as onnxruntime's quantizer exports it by default (pre-processing, static QDQ,
    asymmetric int8 activations with zero points, int8 weights; calibrated on feeds[:-1]), compiled
    for the accelerator with its own scales and zero points and run on fsim: the output's distance
    from onnxruntime's own int8 result in output units (its unfused QDQ arithmetic, and its fused
    kernels), the cosine to the float model, the MACs offloaded and the CPU steps holding the zero-point
    pads (the accelerator's LOAD pads with 0)."""

    qm = ort_quantize(model, feeds[:-1])
    feed = feeds[-1]
    t0 = time.perf_counter()
    mod = build_model(qm, target="accel", config=cfg)
    r = {"compile_s": time.perf_counter() - t0}
    got = next(iter(mod.run(feed)[0].values()))
    inits = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}
    dq = [n for n in qm.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == qm.graph.output[0].name]
    unit = float(inits[dq[0].input[1]]) if dq else None
    for key, level in (("unfused", ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                       ("fused", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        want = ort.InferenceSession(qm.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feed)[0]
        r[f"max_units_vs_ort_{key}"] = float(np.abs(got - want).max() / unit) if unit else None
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    r["cosine_vs_float"] = cosine(got, ref)
    macs = mod.meta["macs"]
    r["offload_fraction"] = macs["accel"] / (macs["accel"] + macs["cpu"])
    r["zero_point_pad_steps"] = sum(1 for s in mod.steps if "pad_zero_point" in s.name)
    log(f"{name}: onnxruntime's default QDQ export (asymmetric int8): {r['max_units_vs_ort_unfused']:.2f} output "
        f"units from its unfused int8 result, {r['max_units_vs_ort_fused']:.2f} from its fused kernels; cosine vs "
        f"float {r['cosine_vs_float']:.4f}; {r['offload_fraction']:.1%} of MACs offloaded; "
        f"{r['zero_point_pad_steps']} CPU steps holding zero-point pads")
    return r


@contextlib.contextmanager
def busy_core(pin: int | None):
    """A process spinning on one core (pinned to CPU `pin`, or where the scheduler puts it) while
    the block runs."""
    code = "while True: pass"
    if pin is not None:
        code = f"import os\nos.sched_setaffinity(0, {{{int(pin)}}})\n" + code
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.3)   # let it start and settle on a core
        yield
    finally:
        p.kill()
        p.wait()


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def runtime_counters(ex) -> dict:
    """The parallel runtime's counters of an executor's kernel library ({} where it has none)."""
    lib = getattr(ex, "lib", None)
    return lib.stats() if lib is not None and hasattr(lib, "stats") else {}


def bench_cpu(name, model, graph, feed, ref, sess, args, log) -> dict:
    """cpu target vs onnxruntime, alternated, quiet and under one busy core, --cycles times each."""
    r = {}
    t0 = time.perf_counter()
    cpu = build_model(graph, target="cpu")
    r["cpu_compile_s"] = time.perf_counter() - t0
    r["cpu_numpy_fallbacks"] = cpu.meta.get("fallbacks")
    r["memory_cpu_target"] = {k: cpu.meta["memory"][k] for k in ("planned_bytes", "naive_bytes")
                              if k in cpu.meta.get("memory", {})}
    log(f"{name}: cpu compile {r['cpu_compile_s']:.1f} s ({cpu.count('llvm')} kernel calls, "
        f"{cpu.count('numpy')} numpy)")
    conditions = ["quiet"] + ([] if args.no_busy else ["busy"])
    runs = {c: [] for c in conditions}
    with Executor(cpu) as ex:
        got = next(iter(ex.run(feed).values()))
        r["cpu_max_rel_err"] = float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-30))
        for _ in range(args.cycles):
            for cond in conditions:
                before = runtime_counters(ex)
                ctx = busy_core(args.busy_pin) if cond == "busy" else contextlib.nullcontext()
                with ctx:
                    load = load_average()
                    t_cpu, t_ort = timeit_pair(lambda: ex.run(feed), lambda: sess.run(None, feed), args.repeat)
                after = runtime_counters(ex)
                runs[cond].append({"cpu_s": t_cpu, "ort_s": t_ort, "ratio": t_cpu / t_ort, "load_avg_1m": load,
                                   "runtime": {k: after[k] - before.get(k, 0) for k in after
                                               if k.endswith(("launches", "chunks"))}})
    for cond, rs in runs.items():
        r[f"cpu_{cond}"] = {"latency_s": float(np.median([x["cpu_s"] for x in rs])),
                            "ort_latency_s": float(np.median([x["ort_s"] for x in rs])),
                            "ratio": float(np.median([x["ratio"] for x in rs])), "runs": rs}
        log(f"{name}: {cond}: cpu {r[f'cpu_{cond}']['latency_s'] * 1e3:.3f} ms vs onnxruntime "
            f"{r[f'cpu_{cond}']['ort_latency_s'] * 1e3:.3f} ms = {r[f'cpu_{cond}']['ratio']:.2f}x "
            f"(per cycle: {', '.join(format(x['ratio'], '.2f') for x in rs)})")
    r["cpu_vs_ort"] = r["cpu_quiet"]["ratio"]
    if "cpu_busy" in r:
        r["cpu_vs_ort_busy"] = r["cpu_busy"]["ratio"]
    r["cpu_bar"] = CPU_BAR
    r["cpu_meets_bar"] = all(r[f"cpu_{c}"]["ratio"] <= CPU_BAR for c in conditions)
    return r


def tsim_layers(acc, feed, dram=None) -> tuple[list[dict], str]:
    """Per offloaded layer: name, op, MACs, cycles (and micro-op/bus counters where the tsim driver
    reports them), under DRAM model `dram` (a sim.dram preset name; None: the default)."""
    layers = []
    if "tsim" in available_drivers():
        with Executor(acc, driver="tsim", **({} if dram is None else {"dram": dram})) as ex:
            ex.run(feed)
            rows = [x for x in ex.profile if x["target"] == "accel"]
        for row in rows:
            layers.append({k: row[k] for k in ("name", "op", "macs", "cycles", "gemm_uops", "alu_uops",
                                                "bytes_read", "bytes_written") if k in row})
        return layers, "tsim driver"
    if dram is not None:
        raise RuntimeError("no tsim driver registered: DRAM presets need it")
    for s in acc.steps:
        if s.kind == "accel":
            cyc, _ = tsim_cycles(acc, s)
            layers.append({"name": s.name, "op": s.op, "macs": s.macs, "cycles": cyc})
    return layers, "sim.tsim on the decoded programs (no tsim driver registered)"


def tsim_resident(acc, feeds, ideal: float) -> dict | None:
    """Cycles of the first run (loads the resident weights) and of the second (steady state, with
    them on chip) on one executor, each on its own input; None where no layer keeps its weights."""
    kept = acc.meta.get("resident_weights", {}).get("layers")
    if not kept or "tsim" not in available_drivers():
        return None
    runs = []
    with Executor(acc, driver="tsim") as ex:
        for f in feeds[:2]:
            ex.run(f)
            runs.append({r["name"]: r["cycles"] for r in ex.profile if r["target"] == "accel"})
    cold, warm = (sum(r.values()) for r in runs)
    return {"layers": sorted(kept), "weight_entries": acc.meta["resident_weights"]["entries"],
            "cold_cycles": cold, "warm_cycles": warm, "cold_vs_ideal": cold / ideal if ideal else None,
            "warm_vs_ideal": warm / ideal if ideal else None, "warm_layer_cycles": runs[1]}


def dram_presets(choice: str) -> list[str]:
    """The DRAM presets to report besides the default: --dram all | none | a comma list; [] where
    sim.dram has no presets (older trees)."""
    try:
        from sim.dram import DRAM_PRESETS  # noqa: PLC0415 - optional: older trees have no presets
    except ImportError:
        return []
    names = [n for n in DRAM_PRESETS if n != "default"]
    if choice == "none":
        return []
    if choice == "all":
        return names
    want = [n.strip().lower() for n in choice.split(",") if n.strip()]
    bad = [n for n in want if n not in DRAM_PRESETS]
    if bad:
        raise SystemExit(f"--dram {','.join(bad)}: unknown DRAM preset; presets are {', '.join(DRAM_PRESETS)}")
    return [n for n in want if n != "default"]


def bench_accel(name, graph, feeds, feed, ref, cfg, args, log) -> dict:
    """accel target: offload, host time on fsim, tsim cycles vs ideal (default DRAM and presets)."""
    r = {}
    t0 = time.perf_counter()
    acc = build_model(graph, target="accel", config=cfg, calibration=feeds[:2], tune=args.tune)
    r["accel_compile_s"] = time.perf_counter() - t0
    mem = acc.meta["memory"]
    r["memory"] = {"activation_planned_bytes": mem["planned_bytes"], "activation_naive_bytes": mem["naive_bytes"],
                   "activation_peak_live_bytes": mem["peak_live_bytes"], "weight_bytes": mem["constant_bytes"],
                   "scratch_bytes": mem["scratch_bytes"], "dram_image_bytes": acc.dram_bytes,
                   "planned_vs_naive": mem["planned_bytes"] / mem["naive_bytes"] if mem["naive_bytes"] else None}
    macs = acc.meta["macs"]
    r["macs_total"] = macs["accel"] + macs["cpu"]
    r["macs_offloaded"] = macs["accel"]
    r["offload_fraction"] = macs["accel"] / r["macs_total"] if r["macs_total"] else 0.0
    r["accel_fallbacks"] = acc.meta["fallbacks"]
    log(f"{name}: accel compile {r['accel_compile_s']:.1f} s; {r['offload_fraction']:.1%} of MACs offloaded; "
        f"activations planned {mem['planned_bytes']} B vs naive {mem['naive_bytes']} B")
    t0 = time.perf_counter()
    host = []
    with Executor(acc, driver="fsim") as ex:
        for _ in range(max(1, args.accel_runs)):
            got = next(iter(ex.run(feed).values()))
            host.append(profile_summary(ex.profile)["cpu_time_s"])
    r["fsim_run_s"] = (time.perf_counter() - t0) / max(1, args.accel_runs)
    r["accel_cosine_vs_ort"] = cosine(got, ref)
    r["accel_same_top1"] = bool(np.argmax(got) == np.argmax(ref))
    r["accel_host_s"] = min(host)   # the CPU steps of the accel target (best of --accel-runs runs)
    r["cpu_part_time_s"] = r["accel_host_s"]
    log(f"{name}: fsim run {r['fsim_run_s']:.1f} s, cosine vs onnxruntime {r['accel_cosine_vs_ort']:.4f}, host "
        f"steps {r['accel_host_s'] * 1e3:.2f} ms")
    if args.no_tsim:
        return r
    t0 = time.perf_counter()
    layers, src = tsim_layers(acc, feed)
    r["tsim_s"] = time.perf_counter() - t0
    r["accel"] = summarize_layers(name, acc, cfg, layers, src, log)
    log(f"{name}: tsim {r['accel']['cycles']} cycles = {r['accel']['latency_s'] * 1e3:.2f} ms at "
        f"{cfg.clock_mhz:g} MHz; ideal {r['accel']['ideal_cycles']:.0f} -> "
        f"{_fmt(r['accel']['vs_ideal'], '.3f')}x (bar {ACCEL_BAR}x) [{r['tsim_s']:.0f} s]")
    if not layers:
        return r
    res = tsim_resident(acc, feeds[1:], r["accel"]["ideal_cycles"])
    if res is not None:
        r["accel"]["resident"] = res
        log(f"{name}: weights resident ({len(res['layers'])} layers, {res['weight_entries']} weight entries): "
            f"first run {res['cold_cycles']} cycles = {_fmt(res['cold_vs_ideal'], '.3f')}x ideal, steady state "
            f"{res['warm_cycles']} = {_fmt(res['warm_vs_ideal'], '.3f')}x")
    r["dram"] = {}
    for preset in dram_presets(args.dram):
        try:
            pl, _ = tsim_layers(acc, feed, dram=preset)
        except Exception as e:  # noqa: BLE001 - a preset the driver cannot take: recorded, the run goes on
            r["dram"][preset] = {"error": f"{type(e).__name__}: {e}"}
            log(f"{name}: DRAM preset {preset}: {e}")
            continue
        cyc = sum(L["cycles"] for L in pl)
        ideal = r["accel"]["ideal_cycles"]
        r["dram"][preset] = {"cycles": cyc, "vs_ideal": cyc / ideal if ideal else None,
                             "vs_default_dram": cyc / r["accel"]["cycles"] if r["accel"]["cycles"] else None}
        log(f"{name}: DRAM {preset}: {cyc} cycles = {_fmt(r['dram'][preset]['vs_ideal'], '.3f')}x ideal")
    return r


def summarize_layers(name, acc, cfg, layers, src, log) -> dict:
    """Totals of tsim's per-layer cycles against the ideal, the mapping's bounds and the DRAM floor."""
    steps = {s.name: s for s in acc.steps if s.kind == "accel"}
    for L in layers:
        L["ideal_cycles"] = L["macs"] / cfg.macs_per_cycle
        st = steps.get(L["name"])
        if st is not None:
            # what any mapping of this layer must move: its activations in once (read channel)
            # and its result out once (write channel), one bus beat per cycle each (weights not counted)
            L["dram_floor_cycles"] = max(L["ideal_cycles"],
                                         sum(acc.tensors[t].nbytes for t in st.inputs) / cfg.bus_bytes,
                                         acc.tensors[st.output].nbytes / cfg.bus_bytes)
        L["vs_ideal"] = L["cycles"] / L["ideal_cycles"] if L["ideal_cycles"] else None
        if "gemm_uops" in L:
            # lower bounds of this mapping: the compute stage issues one GEMM or ALU micro-op per
            # cycle, the read and the write channel move one bus beat per cycle each
            L["compute_bound_cycles"] = L["gemm_uops"] + L["alu_uops"]
            L["memory_bound_cycles"] = max(L["bytes_read"], L["bytes_written"]) / cfg.bus_bytes
            L["bound_cycles"] = max(L["compute_bound_cycles"], L["memory_bound_cycles"])
    gemm = [L for L in layers if L["macs"]]
    cycles = sum(L["cycles"] for L in layers)
    ideal = sum(L["ideal_cycles"] for L in layers)
    out = {"cycles_source": src, "cycles": cycles, "gemm_layer_cycles": sum(L["cycles"] for L in gemm),
           "ideal_cycles": ideal, "vs_ideal": cycles / ideal if ideal else None,
           "gemm_layers_vs_ideal": sum(L["cycles"] for L in gemm) / ideal if ideal else None,
           "latency_s": cycles / (cfg.clock_mhz * 1e6), "ideal_latency_s": ideal / (cfg.clock_mhz * 1e6),
           "bar": ACCEL_BAR, "meets_bar": bool(ideal and cycles / ideal <= ACCEL_BAR), "layers": layers}
    if layers and all("dram_floor_cycles" in L for L in layers) and ideal:
        floor = sum(L["dram_floor_cycles"] for L in layers)
        out.update(dram_floor_cycles=floor, dram_floor_vs_ideal=floor / ideal)
        log(f"{name}: floor of any layer-by-layer mapping (max of the ideal and the layer's activations in "
            f"and out once on the {cfg.bus_bytes}-byte bus): {floor / ideal:.3f}x ideal")
    if layers and all("bound_cycles" in L for L in layers) and ideal:
        bound = sum(L["bound_cycles"] for L in layers)
        out.update(bound_cycles=bound, bound_vs_ideal=bound / ideal, cycles_vs_bound=cycles / bound if bound else None,
                   compute_bound_vs_ideal=sum(L["compute_bound_cycles"] for L in layers) / ideal,
                   gemm_uop_vs_ideal=sum(L["gemm_uops"] for L in layers) / ideal)
        log(f"{name}: per-layer lower bounds of this mapping (max of compute-stage micro-ops and bus beats): "
            f"{bound:.0f} cycles = {out['bound_vs_ideal']:.3f}x ideal (GEMM micro-ops alone "
            f"{out['gemm_uop_vs_ideal']:.3f}x, GEMM+ALU {out['compute_bound_vs_ideal']:.3f}x); "
            f"tsim reaches {_fmt(out['cycles_vs_bound'], '.3f')}x the bound")
    return out


def bench_net(name: str, cfg_name: str, args, log) -> dict:

    cfg = resolve_config(cfg_name)
    model = load_net(name)
    feeds = sample_inputs(model, 3, seed=5)
    feed = feeds[2]
    r = {"net": name, "onnx_nodes": len(model.graph.node)}
    sess = ort.InferenceSession(model.SerializeToString(), ort.SessionOptions(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, feed)[0]
    r["ort_threads"] = "default (all cores)"
    graph = from_onnx(model)
    sections = [("cpu", lambda: bench_cpu(name, model, graph, feed, ref, sess, args, log)),
                ("accel", lambda: bench_accel(name, graph, feeds, feed, ref, cfg, args, log))]
    if not args.no_qdq:
        sections.append(("qdq", lambda: {"qdq": bench_qdq(model, feeds, cfg, log, name)}))
    for section, run in sections:
        try:
            r.update(run())
        except Exception as e:  # noqa: BLE001 - one failing section of one net must not end the benchmark
            r[f"{section}_error"] = f"{type(e).__name__}: {e}"
            log(f"{name}: {section} failed: {r[f'{section}_error']}")
    return r


def _fmt(v, spec: str, scale: float = 1.0) -> str:
    return "-" if v is None else format(v * scale, spec)


def table(results: dict) -> str:
    """The per-net summary as a text table."""
    presets = sorted({p for n in results["nets"] for p in (n.get("dram") or {})})
    cols = [("net", 22), ("cpu ms", 9), ("ort ms", 9), ("cpu/ort", 8), ("busy", 6), ("offload", 8),
            ("cyc/ideal", 10), ("warm", 7)] + [(f"{p}", max(8, len(p) + 1)) for p in presets] + [("host ms", 9)]
    lines = [" ".join(f"{c:>{w}}" if i else f"{c:<{w}}" for i, (c, w) in enumerate(cols))]
    for n in results["nets"]:
        q, b = n.get("cpu_quiet") or {}, n.get("cpu_busy") or {}
        vals = [n["net"], _fmt(q.get("latency_s"), ".3f", 1e3), _fmt(q.get("ort_latency_s"), ".3f", 1e3),
                _fmt(q.get("ratio"), ".2f"), _fmt(b.get("ratio"), ".2f"), _fmt(n.get("offload_fraction"), ".1%"),
                _fmt((n.get("accel") or {}).get("vs_ideal"), ".3f"),
                _fmt(((n.get("accel") or {}).get("resident") or {}).get("warm_vs_ideal"), ".3f")]
        vals += [_fmt(((n.get("dram") or {}).get(p) or {}).get("vs_ideal"), ".3f") for p in presets]
        vals.append(_fmt(n.get("accel_host_s"), ".2f", 1e3))
        lines.append(" ".join(f"{v:>{w}}" if i else f"{v:<{w}}" for i, (v, (_, w)) in enumerate(zip(vals, cols))))
    lines.append("cpu/ort: quiet, busy: under one busy core (median of per-cycle ratios, bar "
                 f"{CPU_BAR}x); cyc/ideal: tsim cycles / (offloaded MACs / peak per cycle), default DRAM, "
                 "first run; warm: the same in the steady state (second run, weights resident)"
                 + (f", then per DRAM preset ({', '.join(presets)})" if presets else "")
                 + "; host ms: the accel target's CPU steps")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="default")
    p.add_argument("--nets", default=DEFAULT_NETS,
                   help=f"comma list of {', '.join(NETS)}, light:<model>, or paths to .onnx files (static shapes)")
    p.add_argument("--light", nargs="?", const="all", default=None, metavar="NAMES",
                   help=f"also the onnx wheel's classic models: all or a comma list of {', '.join(LIGHT)}")
    p.add_argument("--quick", action="store_true",
                   help="a short run: --repeat 4, --cycles 1, --accel-runs 1, no QDQ, default DRAM only")
    p.add_argument("--repeat", type=int, default=None, help="timed calls per side and condition (default 10)")
    p.add_argument("--cycles", type=int, default=None, help="quiet/busy measurement cycles (default 2)")
    p.add_argument("--busy-pin", type=int, default=None, metavar="CPU", help="pin the busy loop to this CPU")
    p.add_argument("--no-busy", action="store_true", help="skip the busy-core measurement")
    p.add_argument("--accel-runs", type=int, default=None, help="fsim runs for the host time (default 2)")
    p.add_argument("--no-tsim", action="store_true", help="skip the timing model (slow on whole networks)")
    p.add_argument("--dram", default=None, help="DRAM presets to run tsim under: all (default), none, or a list")
    p.add_argument("--tune", nargs="?", const=True, default=None, metavar="LOG",
                   help="tilings measured on tsim (build_model(tune=...)); with LOG, a tuning log")
    p.add_argument("--no-qdq", action="store_true", help="skip onnxruntime's quantized export of each net")
    p.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "e2e.json"))
    args = p.parse_args(argv)
    quick = args.quick
    for key, fast, full in (("repeat", 4, 10), ("cycles", 1, 2), ("accel_runs", 1, 2), ("dram", "none", "all")):
        if getattr(args, key) is None:
            setattr(args, key, fast if quick else full)
    args.no_qdq = args.no_qdq or quick
    for k in ("repeat", "cycles", "accel_runs"):
        if getattr(args, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be at least 1")
    if args.busy_pin is not None and args.busy_pin not in os.sched_getaffinity(0):
        p.error(f"--busy-pin {args.busy_pin}: not a CPU this process may use ({sorted(os.sched_getaffinity(0))})")
    nets = [n.strip() for n in args.nets.split(",") if n.strip()]
    if args.light:
        light = LIGHT if args.light == "all" else [n.strip() for n in args.light.split(",") if n.strip()]
        nets += [f"light:{n}" for n in light]
    for n in nets:
        if n.startswith("light:") and n.split(":", 1)[1] not in LIGHT:
            p.error(f"--light {n.split(':', 1)[1]}: not a light model ({', '.join(LIGHT)})")
        if n.endswith(".onnx") and not Path(n).is_file():
            p.error(f"--nets {n}: no such ONNX file")
        if not n.startswith("light:") and not n.endswith(".onnx") and n not in NETS:
            p.error(f"--nets {n}: unknown net; nets are {', '.join(NETS)} (and light:<model>, or a path to a .onnx file)")
    dram_presets(args.dram)   # an unknown preset is refused before any work

    def log(msg):
        print(msg, file=sys.stderr, flush=True)
    cfg = resolve_config(args.config)
    results = {"config": args.config, "config_digest": cfg.digest(), "clock_mhz": cfg.clock_mhz,
               "peak_macs_per_cycle": cfg.macs_per_cycle, "machine": platform.machine(),
               "cpus": len(os.sched_getaffinity(0)), "python": platform.python_version(),
               "onnxruntime": ort.__version__, "kit_num_threads": os.environ.get("KIT_NUM_THREADS"),
               "parallel_runtime": runtime_settings(), "busy_pin": args.busy_pin,
               "repeat": args.repeat, "cycles": args.cycles, "load_avg_1m_start": load_average(), "nets": []}
    for name in nets:
        results["nets"].append(bench_net(name, args.config, args, log))
    results["load_avg_1m_end"] = load_average()
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps(results, indent=2, default=str))
    print(table(results))
    log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
