"""Vector global loads and stores: elementwise kernels and the conv/dense/matmul cooperative tile loads
move 4 floats at a time (vload4/vstore4 in OpenCL C, ld.global.nc.v4 / st.v4 in PTX) where the
innermost axis allows; checked on PoCL against numpy and with ptxas; the runtime's verifier only
accepts vector accesses clamped to their array."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import compiler
from compiler import te
from compiler.codegen.opencl import build_gpu
from compiler.errors import CodegenError
from compiler.ops import gpu, nn
from compiler.targets.gpu import GpuKernels
from host_runtime.gpu import GpuError, check_gpu_attrs, run_kernel, verify_opencl
from tests.compiler.gpu.gpu_helpers import opencl_or_skip, ptxas_check
from tests.compiler.gpu.test_gpu_kernels import conv_ref


def _ew(shape):
    a = te.placeholder(shape, "float32", name="a")
    c = te.placeholder(shape[-1:], "float32", name="c")
    out = te.compute(shape, lambda *i: te.max(te.tanh(a[i]) * 2.0 + c[i[-1]], 0.1), name="y")
    ref = lambda x, y: np.maximum(np.tanh(x) * 2 + y, 0.1)  # noqa: E731
    return [a, c], out, ref


def _mm(m, k, n):
    a = te.placeholder((m, k), "float32", name="a")
    b = te.placeholder((k, n), "float32", name="b")
    return [a, b], nn.matmul(a, b), lambda x, y: x @ y


def _dense(m, k, n):
    a = te.placeholder((m, k), "float32", name="a")
    w = te.placeholder((n, k), "float32", name="w")
    return [a, w], nn.dense(a, w), lambda x, y: x @ y.T


def _conv(xs, ws, strides=(1, 1), pads=(0, 0, 0, 0)):
    x = te.placeholder(xs, "float32", name="x")
    w = te.placeholder(ws, "float32", name="w")
    return [x, w], nn.conv2d(x, w, strides, pads), lambda a, b: conv_ref(a, b, strides, pads)


CASES = {   # name: (inputs, output, reference, whether the loads are whole aligned vectors)
    "elementwise_3x64": (*_ew((3, 64)), True),
    "elementwise_2x5x12": (*_ew((2, 5, 12)), True),
    "elementwise_odd_70": (*_ew((3, 70)), False),      # 70 % 4: scalar
    "matmul_k20": (*_mm(33, 20, 18), True),            # A tiles: rows of 8 = 2 vectors
    "dense_k32": (*_dense(6, 32, 24), True),
    "dense_k18_unaligned": (*_dense(5, 18, 12), False),  # row stride 18: lanes one by one
    "conv1x1_w16": (*_conv((1, 16, 8, 16), (32, 16, 1, 1)), True),   # input tile rows of 8
    "conv3x3_padded": (*_conv((1, 4, 3, 3), (4, 4, 3, 3), pads=(1, 1, 1, 1)), False),
}


def _build(name, target):
    ins, out, ref, aligned = CASES[name]
    return build_gpu(gpu.schedule_gpu([out]), ins + [out], target, f"k_{name}"), ins, out, ref, aligned


@pytest.mark.parametrize("name", sorted(CASES))
def test_vector_kernel_matches_numpy(name, rng):
    opencl_or_skip()
    k, ins, out, ref, aligned = _build(name, "opencl")
    assert check_gpu_attrs(k.to_attrs()) is None
    assert ("vload4(" in k.source) == aligned, k.source
    xs = [rng.standard_normal(tuple(int(d) for d in t.shape)).astype("float32") for t in ins]
    y = np.full(tuple(int(d) for d in out.shape), np.nan, "float32")
    run_kernel(k.to_attrs(), xs, y)
    r = ref(*xs)
    assert np.abs(y - r).max() <= 1e-5 * max(1.0, np.abs(r).max()), name


def test_elementwise_stores_vectors_and_gemm_stages_vectors_in_shared():
    k, *_ = _build("elementwise_3x64", "opencl")
    assert "vstore4(" in k.source and "vload4(" in k.source
    k, *_ = _build("dense_k32", "opencl")
    assert "_shared);" in k.source and "vstore4(vload4(" in k.source   # global -> shared, 4 at a time


@pytest.mark.parametrize("name", sorted(CASES))
def test_vector_ptx_uses_v4_accesses_and_passes_ptxas(name, tmp_path):
    k, *_, aligned = _build(name, "cuda")
    v4 = [ln for ln in k.source.splitlines() if ".v4." in ln and ("ld.global" in ln or "st." in ln)]
    assert bool(v4) == aligned or not aligned, k.source
    if aligned:
        assert any("ld.global" in ln for ln in v4)
    ptxas_check(k.source, tmp_path, name)


def test_gather_has_no_opencl_vector_form_and_the_target_keeps_it_scalar(rng):
    """a[i, j // 2]: the vectorized index is no ramp; the OpenCL printer refuses it and the GPU
    target rebuilds the kernel with scalar accesses (vec=1)."""
    a = te.placeholder((4, 8), "float32", name="a")
    b = te.compute((4, 16), lambda i, j: a[i, j // 2] * 2.0, name="b")
    with pytest.raises(CodegenError, match="gather from 'a'"):
        build_gpu(gpu.schedule_gpu([b]), [a, b], "opencl", "k")
    k = build_gpu(gpu.schedule_gpu([b], {"vec": 1}), [a, b], "opencl", "k")
    assert "vload" not in k.source
    opencl_or_skip()
    x = rng.standard_normal((4, 8)).astype("float32")
    y = np.zeros((4, 16), "float32")
    run_kernel(k.to_attrs(), [x], y)
    np.testing.assert_array_equal(y, np.repeat(x, 2, axis=1) * 2)


def test_gpu_target_rebuilds_a_gather_with_scalar_accesses(rng):
    """The target's kernel builder: the default (vec=4) fails to print, vec=1 is built instead."""
    a = te.placeholder((4, 8), "float32", name="a")
    b = te.compute((4, 16), lambda i, j: a[i, j // 2] + 1.0, name="b")
    k = GpuKernels("opencl", check=False)._build(b, [a, b], "k_gather", {})
    assert "vload" not in k.source and "vstore" not in k.source
    k = GpuKernels("cuda")._build(b, [a, b], "k_gather", {})   # LLVM gathers lane by lane: vectors kept
    assert k.lang == "ptx" and ".v4." in k.source


def _attrs_with(body_line: str, n: int = 16) -> dict:
    k, *_ = _build("elementwise_3x64", "opencl")
    attrs = k.to_attrs()
    head = attrs["source"][:attrs["source"].index("{\n", attrs["source"].index("__kernel")) + 2]
    attrs["source"] = head + body_line + "\n}\n"
    return attrs


@pytest.mark.parametrize("line, why", [
    ("  vstore4(vload4(5, a), kit_idx(0, 48), y);", "array as its last argument"),
    ("  vstore4(vload4(kit_idx(0, 49), a), kit_idx(0, 48), y);", "clamped to its size 48"),
    ("  vstore4(vload4(kit_idx(0, 48), a), 0, y);", "clamped|array as its last"),
    ("  vstore4(vload4(kit_idx(0, 48), a), kit_idx(0, 48), y + 4);", "array"),
    ("  vstore4(kit_idx(0, 48), vload4(kit_idx(0, 48), a), y);", "clamped|order"),
    ("  vstore4(vload4(kit_idx(0, 1), c), kit_idx(0, 48), y);", "clamped to its size 16"),
    ("  vstore16(vload16(kit_idx(0, 12), a), kit_idx(0, 12), y);", None),
    ("  vstore8(vload8(kit_idx(0, 6), a), kit_idx(0, 6), y);", "clamped to its size 24"),
])
def test_verifier_accepts_only_clamped_vector_accesses(line, why):
    attrs = _attrs_with(line)
    if why is None:
        verify_opencl(attrs)
        return
    with pytest.raises(GpuError, match=why):
        verify_opencl(attrs)


def _onnx_case(name):
    vi = helper.make_tensor_value_info
    rng = np.random.default_rng(3)
    if name == "cast":      # float4 -> int4 -> float4 (convert_*), truncation as onnxruntime
        nodes = [helper.make_node("Mul", ["x", "y"], ["m"]), helper.make_node("Cast", ["m"], ["i"], to=TensorProto.INT32),
                 helper.make_node("Cast", ["i"], ["o"], to=TensorProto.FLOAT)]
        ins = [vi("x", TensorProto.FLOAT, [2, 3, 8]), vi("y", TensorProto.FLOAT, [8])]
        feeds = {"x": 5 * rng.standard_normal((2, 3, 8)).astype("f4"), "y": rng.standard_normal(8).astype("f4")}
        out = vi("o", TensorProto.FLOAT, [2, 3, 8])
    elif name == "transpose":   # strided lanes: built lane by lane, stored as a vector
        nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]), helper.make_node("Sigmoid", ["t"], ["o"])]
        ins, out = [vi("x", TensorProto.FLOAT, [2, 4, 8])], vi("o", TensorProto.FLOAT, [2, 8, 4])
        feeds = {"x": rng.standard_normal((2, 4, 8)).astype("f4")}
    else:                   # int64 vectors
        nodes = [helper.make_node("Add", ["a", "b"], ["o"])]
        ins = [vi("a", TensorProto.INT64, [4, 8]), vi("b", TensorProto.INT64, [4, 8])]
        out = vi("o", TensorProto.INT64, [4, 8])
        feeds = {"a": rng.integers(-9, 9, (4, 8)), "b": rng.integers(-9, 9, (4, 8))}
    g = helper.make_graph(nodes, name, ins, [out])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), feeds


@pytest.mark.parametrize("name", ["cast", "transpose", "int64"])
def test_vectorized_elementwise_models_match_onnxruntime(name):
    opencl_or_skip()
    ort = pytest.importorskip("onnxruntime")
    m, feeds = _onnx_case(name)
    mod = compiler.build_model(m, target="opencl")
    (s,) = mod.steps
    assert s.kind == "gpu" and "vstore4(" in s.attrs["source"]
    got, _ = mod.run(feeds)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got["o"], want, rtol=1e-6, atol=1e-6)
