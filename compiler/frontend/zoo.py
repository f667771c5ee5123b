"""Small ONNX models built with onnx.helper, seeded: the networks the compiler is tested and
demonstrated on (conv-bn-relu-pool, a residual block, an MLP, a depthwise-separable block, a
transformer encoder layer, an upsampling decoder). Each builder returns an onnx.ModelProto; MODELS maps name -> builder.
ort_quantize gives any model as onnxruntime's quantization tools export it (QDQ).
"""
from __future__ import annotations

import tempfile

import numpy as np
import onnx
from onnx import TensorProto, checker, helper, numpy_helper, shape_inference


class ModelBuilder:
    """Collects nodes and initializers; names every node; makes a checked ModelProto."""

    def __init__(self, name: str, seed: int = 0, opset: int = 17):
        self.name, self.opset = name, opset
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs, self.count = [], [], [], {}

    def _name(self, op: str) -> str:
        k = self.count.get(op, 0)
        self.count[op] = k + 1
        return f"{op.lower()}{k}"

    def input(self, name: str, shape, elem_type=None) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type or TensorProto.FLOAT, list(shape)))
        return name

    def init(self, value, name: str | None = None) -> str:
        name = name or f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, shape, fan_in: int | None = None, scale: float = 1.0) -> str:
        fan_in = fan_in or int(np.prod(shape[1:]))
        return self.init((self.rng.standard_normal(shape) * scale * np.sqrt(2.0 / fan_in)).astype(np.float32))

    def op(self, op_type: str, inputs, n_out: int = 1, name: str | None = None, **attrs):
        name = name or self._name(op_type)
        outs = [f"{name}_out{k}" if n_out > 1 else f"{name}_out" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs if n_out > 1 else outs[0]

    # common blocks
    def conv(self, x, cin, cout, k=3, stride=1, pad=None, group=1, bias=True, name=None, dilation=1):
        pad = k // 2 * dilation if pad is None else pad
        w = self.weight((cout, cin // group, k, k))
        ins = [x, w] + ([self.init((self.rng.standard_normal(cout) * 0.1).astype(np.float32))] if bias else [])
        return self.op("Conv", ins, name=name, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group,
                       **({"dilations": [dilation, dilation]} if dilation != 1 else {}))

    def bn(self, x, c, name=None):
        r = self.rng
        ps = [(r.uniform(0.5, 1.5, c)), r.standard_normal(c) * 0.1, r.standard_normal(c) * 0.1, r.uniform(0.5, 1.5, c)]
        return self.op("BatchNormalization", [x] + [self.init(p.astype(np.float32)) for p in ps], name=name, epsilon=1e-5)

    def linear(self, x, k, n, name=None):
        """MatMul + Add, as PyTorch exports nn.Linear on 3-d inputs."""
        y = self.op("MatMul", [x, self.weight((k, n), fan_in=k)], name=name)
        return self.op("Add", [y, self.init((self.rng.standard_normal(n) * 0.1).astype(np.float32))])

    def build(self, outputs, output_shapes=None):
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        g = helper.make_graph(self.nodes, self.name, self.inputs, [], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset)], producer_name="accel-kit zoo")
        m.ir_version = 8
        inferred = shape_inference.infer_shapes(m, strict_mode=True)
        types = {vi.name: vi for vi in inferred.graph.value_info}
        m.graph.output.extend(types[o] if o in types else vi for o, vi in zip(outputs, outs))
        checker.check_model(m)
        return m


def conv_bn_relu_pool(seed: int = 0):
    """3-channel image -> conv-bn-relu-maxpool x2 -> global pool -> flatten -> dense (10 classes)."""
    b = ModelBuilder("conv_bn_relu_pool", seed)
    x = b.input("image", (1, 3, 16, 16))
    y = b.op("Relu", [b.bn(b.conv(x, 3, 16, name="conv1"), 16, name="bn1")], name="relu1")
    y = b.op("MaxPool", [y], name="pool1", kernel_shape=[2, 2], strides=[2, 2])
    y = b.op("Relu", [b.bn(b.conv(y, 16, 32, name="conv2", bias=False), 32, name="bn2")], name="relu2")
    y = b.op("GlobalAveragePool", [y], name="gap")
    y = b.op("Flatten", [y], name="flatten", axis=1)
    y = b.op("Gemm", [y, b.weight((10, 32)), b.init(np.zeros(10, np.float32))], name="fc", transB=1)
    return b.build([y])


def residual_block(seed: int = 0):
    """ResNet basic block: conv-bn-relu-conv-bn + identity, relu; then a strided conv."""
    b = ModelBuilder("residual_block", seed)
    x = b.input("x", (1, 16, 8, 8))
    y = b.op("Relu", [b.bn(b.conv(x, 16, 16, name="conv1"), 16, name="bn1")], name="relu1")
    y = b.bn(b.conv(y, 16, 16, name="conv2"), 16, name="bn2")
    y = b.op("Relu", [b.op("Add", [y, x], name="residual")], name="relu2")
    y = b.op("Relu", [b.conv(y, 16, 32, stride=2, name="conv3")], name="relu3")
    return b.build([y])


def mlp(seed: int = 0):
    """Three dense layers with Relu and Clip (ReLU6) on a batch of 4, softmax at the end."""
    b = ModelBuilder("mlp", seed)
    x = b.input("x", (4, 64))
    y = b.op("Gemm", [x, b.weight((128, 64)), b.init(np.full(128, 0.05, np.float32))], name="fc1", transB=1)
    y = b.op("Relu", [y], name="relu1")
    y = b.op("Gemm", [y, b.weight((128, 64), fan_in=128), b.init(np.zeros(64, np.float32))], name="fc2")
    y = b.op("Clip", [y, b.init(np.float32(0.0)), b.init(np.float32(6.0))], name="relu6")
    y = b.op("Gemm", [y, b.weight((16, 64)), b.init(np.zeros(16, np.float32))], name="fc3", transB=1)
    y = b.op("Softmax", [y], name="softmax", axis=-1)
    return b.build([y])


def depthwise_separable(seed: int = 0):
    """MobileNet block: depthwise 3x3 - bn - relu6, pointwise 1x1 - bn - relu, average pool."""
    b = ModelBuilder("depthwise_separable", seed)
    x = b.input("x", (1, 16, 12, 12))
    y = b.bn(b.conv(x, 16, 16, group=16, name="dw", bias=False), 16, name="bn_dw")
    y = b.op("Clip", [y, b.init(np.float32(0.0)), b.init(np.float32(6.0))], name="relu6")
    y = b.bn(b.conv(y, 16, 32, k=1, name="pw", bias=False), 32, name="bn_pw")
    y = b.op("Relu", [y], name="relu")
    y = b.op("AveragePool", [y], name="avgpool", kernel_shape=[2, 2], strides=[2, 2])
    return b.build([y])


def transformer_encoder(seed: int = 0, seq: int = 8, dim: int = 32, heads: int = 2, ffn: int = 64):
    """Post-norm transformer encoder layer: fused QKV projection split in three, multi-head
    attention, residual + LayerNorm, GELU (erf form) feed-forward, residual + LayerNorm."""
    b = ModelBuilder("transformer_encoder", seed)
    dh = dim // heads
    x = b.input("x", (1, seq, dim))
    qkv = b.linear(x, dim, 3 * dim, name="qkv")
    q, k, v = b.op("Split", [qkv, b.init(np.array([dim] * 3, np.int64))], n_out=3, name="split_qkv", axis=-1)

    def heads_first(t, perm):
        t = b.op("Reshape", [t, b.init(np.array([1, seq, heads, dh], np.int64))])
        return b.op("Transpose", [t], perm=perm)
    q, k, v = heads_first(q, [0, 2, 1, 3]), heads_first(k, [0, 2, 3, 1]), heads_first(v, [0, 2, 1, 3])
    s = b.op("MatMul", [q, k], name="scores")
    s = b.op("Div", [s, b.init(np.float32(np.sqrt(dh)))], name="scale")
    a = b.op("Softmax", [s], name="attn", axis=-1)
    o = b.op("MatMul", [a, v], name="context")
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])
    o = b.op("Reshape", [o, b.init(np.array([1, seq, dim], np.int64))], name="merge_heads")
    o = b.linear(o, dim, dim, name="out_proj")
    y = b.op("Add", [o, x], name="residual1")
    y = b.op("LayerNormalization", [y, b.init(np.ones(dim, np.float32)), b.init(np.zeros(dim, np.float32))],
             name="ln1", axis=-1, epsilon=1e-5)
    h = b.linear(y, dim, ffn, name="ffn1")
    g = b.op("Erf", [b.op("Div", [h, b.init(np.float32(np.sqrt(2.0)))])])
    g = b.op("Mul", [b.op("Mul", [h, b.op("Add", [g, b.init(np.float32(1.0))])]), b.init(np.float32(0.5))], name="gelu")
    h = b.linear(g, ffn, dim, name="ffn2")
    z = b.op("Add", [h, y], name="residual2")
    z = b.op("LayerNormalization", [z, b.init(np.ones(dim, np.float32)), b.init(np.zeros(dim, np.float32))],
             name="ln2", axis=-1, epsilon=1e-5)
    return b.build([z])


def upsample_decoder(seed: int = 0):
    """Decoder of a segmentation net (FPN / U-Net style, MobileNetV3 activations): strided conv -
    HardSwish, nearest 2x upsampling (as PyTorch exports it) concatenated with the skip path, conv -
    HardSigmoid gate, bilinear 2x upsampling, 1x1 conv to 4 classes."""
    b = ModelBuilder("upsample_decoder", seed)
    x = b.input("x", (1, 16, 8, 8))
    skip = b.op("Relu", [b.conv(x, 16, 16, name="conv_skip")], name="relu_skip")
    y = b.op("HardSwish", [b.conv(skip, 16, 32, stride=2, name="conv_down")], name="hswish")
    no_roi = b.init(np.zeros(0, np.float32), "no_roi")
    y = b.op("Resize", [y, no_roi, b.init(np.array([1, 1, 2, 2], np.float32))], name="up_nearest", mode="nearest",
             coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    y = b.op("Concat", [y, skip], name="concat", axis=1)
    y = b.conv(y, 48, 16, name="conv_fuse")
    y = b.op("Mul", [y, b.op("HardSigmoid", [y], name="hsigmoid", alpha=0.2, beta=0.5)], name="gate")
    y = b.op("Resize", [y, no_roi, b.init(np.array([1, 1, 2, 2], np.float32))], name="up_linear", mode="linear")
    return b.build([b.conv(y, 16, 4, k=1, name="classes")])


MODELS = {
    "conv_bn_relu_pool": conv_bn_relu_pool,
    "residual_block": residual_block,
    "mlp": mlp,
    "depthwise_separable": depthwise_separable,
    "transformer_encoder": transformer_encoder,
    "upsample_decoder": upsample_decoder,
}


def sample_inputs(model, n: int = 1, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """n seeded random feeds (standard normal) for a model's inputs."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds = []
    for _ in range(n):
        f = {}
        for vi in model.graph.input:
            if vi.name in inits:
                continue
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            dt = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            f[vi.name] = rng.standard_normal(shape).astype(dt)
        feeds.append(f)
    return feeds


def ort_quantize(model, feeds, per_channel: bool = False, activations: str = "int8", quant_format: str = "qdq"):
    """The model quantized by onnxruntime's tools as their documentation says: pre-processing (which
    folds batch norms into convs; newer onnxruntime versions otherwise quantize the batch norm on its
    own), then static quantization calibrated on `feeds`, int8 weights (symmetric, per tensor or
    per output channel). activations: "int8" (the tool's default: asymmetric, with zero points),
    "uint8", or "symmetric" int8. quant_format: "qdq" (Quantize/DequantizeLinear pairs) or
    "qoperator" (QLinearConv, QGemm, ...)."""

    from onnxruntime.quantization import (  # noqa: PLC0415 - optional dep onnxruntime
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_static,
    )
    if activations not in ("int8", "uint8", "symmetric"):
        raise ValueError(f"ort_quantize: activations={activations!r}; choose int8, uint8 or symmetric")
    if quant_format not in ("qdq", "qoperator"):
        raise ValueError(f"ort_quantize: quant_format={quant_format!r}; choose qdq or qoperator")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)
    with tempfile.TemporaryDirectory() as d:
        onnx.save(model, f"{d}/m.onnx")
        quant_pre_process(f"{d}/m.onnx", f"{d}/p.onnx")
        fmt = QuantFormat.QDQ if quant_format == "qdq" else QuantFormat.QOperator
        quantize_static(f"{d}/p.onnx", f"{d}/q.onnx", Reader(), quant_format=fmt,
                        activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
                        weight_type=QuantType.QInt8, per_channel=per_channel,
                        extra_options={"ActivationSymmetric": activations == "symmetric", "WeightSymmetric": True})
        return onnx.load(f"{d}/q.onnx")
