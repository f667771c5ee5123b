"""GPU schedules lowered to OpenCL C (run on PoCL) and PTX (ptxas), checked against numpy."""

import re

import numpy as np
import pytest

from compiler import te
from compiler.codegen.opencl import build_gpu
from compiler.errors import CodegenError, ScheduleError
from compiler.ops import elemwise as ew
from compiler.ops import gpu, nn, registry
from host_runtime.gpu import check_gpu_attrs, run_kernel
from tests.compiler.gpu.gpu_helpers import opencl_or_skip, ptxas_check


def conv_ref(x, w, strides=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1):
    N, C, H, W = x.shape
    O, Cg, KH, KW = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    OH = (xp.shape[2] - dil[0] * (KH - 1) - 1) // strides[0] + 1
    OW = (xp.shape[3] - dil[1] * (KW - 1) - 1) // strides[1] + 1
    y = np.zeros((N, O, OH, OW))
    og = O // groups
    for o in range(O):
        g = o // og
        for kh in range(KH):
            for kw in range(KW):
                h0, w0 = kh * dil[0], kw * dil[1]
                patch = xp[:, g * Cg:(g + 1) * Cg, h0:h0 + strides[0] * OH:strides[0], w0:w0 + strides[1] * OW:strides[1]]
                y[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, kh, kw])
    return y


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _pool_max(a, k=3, s=2, p=1):
    ap = np.pad(a, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
    OH = (ap.shape[2] - k) // s + 1
    OW = (ap.shape[3] - k) // s + 1
    return np.stack([ap[:, :, i:i + s * OH:s, j:j + s * OW:s] for i in range(k) for j in range(k)]).max(0)


CASES = {
    "dense": (lambda a, b: nn.dense(a, b), [(5, 37), (19, 37)], lambda a, b: a @ b.T),
    "dense_bias_relu": (lambda a, b, c: te.compute((4, 24), lambda i, j: te.max(nn.dense(a, b, c)[i, j], 0.0)),
                        [(4, 16), (24, 16), (24,)], lambda a, b, c: np.maximum(a @ b.T + c, 0)),
    "matmul": (lambda a, b: nn.matmul(a, b), [(33, 20), (20, 18)], lambda a, b: a @ b),
    "batch_matmul": (lambda a, b: nn.matmul(a, b), [(3, 17, 9), (3, 9, 13)], lambda a, b: a @ b),
    "conv3x3": (lambda a, b: nn.conv2d(a, b, (1, 1), (1, 1, 1, 1)), [(1, 8, 12, 12), (16, 8, 3, 3)],
                lambda a, b: conv_ref(a, b, (1, 1), (1, 1, 1, 1))),
    "conv_stride_grouped": (lambda a, b: nn.conv2d(a, b, (2, 2), (1, 0, 1, 1), (1, 1), 2),
                            [(2, 6, 9, 11), (8, 3, 3, 3)], lambda a, b: conv_ref(a, b, (2, 2), (1, 0, 1, 1), groups=2)),
    "conv_depthwise": (lambda a, b: nn.conv2d(a, b, (1, 1), (1, 1, 1, 1), (1, 1), 8), [(1, 8, 10, 10), (8, 1, 3, 3)],
                       lambda a, b: conv_ref(a, b, (1, 1), (1, 1, 1, 1), groups=8)),
    "conv_dilated_1x1out": (lambda a, b: nn.conv2d(a, b, (1, 1), (2, 2, 2, 2), (2, 2)), [(1, 3, 7, 5), (5, 3, 3, 3)],
                            lambda a, b: conv_ref(a, b, (1, 1), (2, 2, 2, 2), (2, 2))),
    "conv_1x1_spatial": (lambda a, b: nn.conv2d(a, b), [(1, 32, 1, 1), (300, 32, 1, 1)], lambda a, b: conv_ref(a, b)),
    "softmax": (lambda a: nn.softmax(a, -1), [(4, 37)], _softmax),
    "softmax_workgroup": (lambda a: gpu.softmax_wg(a, -1), [(3, 300)], _softmax),
    "softmax_workgroup_axis1": (lambda a: gpu.softmax_wg(a, 1), [(2, 70, 3, 5)],
                                lambda a: np.moveaxis(_softmax(np.moveaxis(a, 1, -1)), -1, 1)),
    "layer_norm_workgroup": (lambda a, s, b: gpu.layer_norm_wg(a, s, b, 1), [(2, 8, 12), (8, 12), (8, 12)],
                             lambda a, s, b: (a - a.mean((1, 2), keepdims=True))
                             / np.sqrt(a.var((1, 2), keepdims=True) + 1e-5) * s + b),
    "layer_norm": (lambda a, s, b: nn.layer_norm(a, s, b, -1), [(6, 20), (20,), (20,)],
                   lambda a, s, b: (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5) * s + b),
    "max_pool": (lambda a: nn.pool2d(a, (3, 3), (2, 2), (1, 1, 1, 1), 0, "max"), [(1, 4, 9, 9)], _pool_max),
    "global_avg_pool": (lambda a: nn.global_pool2d(a, "avg"), [(2, 5, 7, 7)], lambda a: a.mean((2, 3), keepdims=True)),
    "injective_tanh": (lambda a: te.compute((3, 70), lambda i, j: te.tanh(a[i, j]) * 2.0), [(3, 70)],
                       lambda a: np.tanh(a) * 2),
}


def _build(name, target):
    fn, shapes, ref = CASES[name]
    phs = [te.placeholder(s, "float32", name=f"p{i}") for i, s in enumerate(shapes)]
    out = fn(*phs)
    k = build_gpu(gpu.schedule_gpu([out]), phs + [out], target, f"k_{name}")
    return k, shapes, ref, tuple(int(d) for d in out.shape)


@pytest.mark.parametrize("name", sorted(CASES))
def test_opencl_kernel_matches_numpy(name, rng):
    opencl_or_skip()
    k, shapes, ref, oshape = _build(name, "opencl")
    xs = [rng.standard_normal(s).astype("float32") for s in shapes]
    y = np.full(oshape, np.nan, "float32")
    run_kernel(k.to_attrs(), xs, y)
    r = ref(*xs)
    assert np.abs(y - r).max() <= 1e-5 * max(1.0, np.abs(r).max()), name


@pytest.mark.parametrize("name", ["dense", "batch_matmul", "conv3x3", "conv_stride_grouped", "conv_depthwise"])
def test_conv_and_dense_use_local_memory(name):
    k, *_ = _build(name, "opencl")
    assert k.shared_bytes > 0
    assert "__local float" in k.source and "barrier(CLK_LOCAL_MEM_FENCE);" in k.source
    assert k.block[0] * k.block[1] * k.block[2] > 1


def test_blocks_fit_cuda_limits():
    """threadIdx.z at most 64 and at most 1024 threads, whatever the shape (a 1x1 feature map
    puts every thread of a conv block on the channel axis)."""
    k, *_ = _build("conv_1x1_spatial", "cuda")
    assert k.block[2] <= 64 and k.block[0] * k.block[1] * k.block[2] <= 1024


@pytest.mark.parametrize("name", sorted(CASES))
def test_ptx_passes_ptxas(name, tmp_path):
    k, *_ = _build(name, "cuda")
    assert k.lang == "ptx" and ".target sm_70" in k.source and ".entry k_" in k.source
    info = ptxas_check(k.source, tmp_path, name)
    if k.shared_bytes:
        assert "bar.sync" in k.source and "smem" in info


def test_too_many_threads_is_a_codegen_error():
    a = te.placeholder((64, 64), "float32", name="a")
    b = te.compute((64, 64), lambda i, j: a[i, j] + 1.0, name="b")
    s = te.create_schedule(b)
    i, j = s[b].op.axis
    s[b].bind(i, te.thread_axis("threadIdx.y"))
    s[b].bind(j, te.thread_axis("threadIdx.x"))
    with pytest.raises(CodegenError, match="4096 threads per block"):
        build_gpu(s, [a, b], "opencl", "big")


def test_unknown_gpu_target():
    a = te.placeholder((4,), "float32", name="a")
    b = te.compute((4,), lambda i: a[i] * 2.0, name="b")
    with pytest.raises(CodegenError, match="GPU targets are opencl, cuda"):
        build_gpu(gpu.schedule_injective([b]), [a, b], "metal", "k")


@pytest.mark.parametrize("name", ["softmax_workgroup", "layer_norm_workgroup"])
def test_workgroup_reductions_use_shared_partials(name):
    k, *_ = _build(name, "opencl")
    assert k.block[0] >= 64 and k.shared_bytes >= 4 * k.block[0]
    assert "barrier(CLK_LOCAL_MEM_FENCE);" in k.source


def test_library_picks_workgroup_softmax_for_long_rows():
    impl = registry.select("softmax", "cuda", [(2, 500)], ["float32"], {"axis": -1})
    assert impl.name == "softmax.workgroup"
    impl = registry.select("softmax", "cuda", [(2, 10)], ["float32"], {"axis": -1})
    assert impl.name != "softmax.workgroup"


def test_body_needing_two_kernels_is_declined():
    a = te.placeholder((8, 8), "float32", name="a")
    w = te.placeholder((8, 8), "float32", name="w")
    d = nn.dense(a, w)
    k = te.reduce_axis(8, "k")
    tot = te.compute((8,), lambda i: te.sum(d[i, k], axis=k), name="tot")
    out = te.compute((8, 8), lambda i, j: d[i, j] / tot[i], name="out")
    with pytest.raises(ScheduleError, match="one kernel computes one|not bound"):
        gpu.schedule_gpu([out])


def test_bool_and_double_buffers(rng):
    """bool tensors are uchar in OpenCL memory; float64 enables cl_khr_fp64."""
    opencl_or_skip()
    a = te.placeholder((5, 7), "float32", name="a")
    c = te.placeholder((5, 7), "bool", name="c")
    m = te.compute((5, 7), lambda i, j: te.select(c[i, j], a[i, j], -a[i, j]), name="m")
    b = te.compute((5, 7), lambda i, j: a[i, j] > 0.5, name="b")
    x = rng.random((5, 7)).astype("float32")
    cc = rng.random((5, 7)) > 0.5
    k = build_gpu(gpu.schedule_gpu([m]), [a, c, m], "opencl", "bsel")
    o = np.zeros((5, 7), "float32")
    run_kernel(k.to_attrs(), [x, cc], o)
    np.testing.assert_array_equal(o, np.where(cc, x, -x))
    k = build_gpu(gpu.schedule_gpu([b]), [a, b], "opencl", "bcmp")
    ob = np.zeros((5, 7), bool)
    run_kernel(k.to_attrs(), [x], ob)
    np.testing.assert_array_equal(ob, x > 0.5)
    d = te.placeholder((6,), "float64", name="d")
    e = te.compute((6,), lambda i: te.exp(d[i]) * 2.0, name="e")
    k = build_gpu(gpu.schedule_gpu([e]), [d, e], "opencl", "dbl")
    assert "cl_khr_fp64" in k.source
    xd = rng.random(6)
    od = np.zeros(6)
    run_kernel(k.to_attrs(), [xd], od)
    np.testing.assert_allclose(od, np.exp(xd) * 2, rtol=1e-12)


def _in_body(src, old, new):
    head, sep, body = src.partition("__kernel")
    return head + sep + body.replace(old, new, 1)


def _attrs_of(name):
    k, *_ = _build(name, "opencl")
    return k.to_attrs()


@pytest.mark.parametrize("edit, why", [
    (lambda s: _in_body(s, "[kit_idx(", "[("), "not clamped"),
    (lambda s: s.replace("__local float", "__local float *", 1), "pointer|declared|__local"),
    (lambda s: s.rstrip().rstrip("}") + " float* p = (float*)1234; p[0] = 1.0f; }", "pointer|not allowed|\\["),
    (lambda s: s.replace("/* generated", "#include <x>\n/* generated", 1), "preamble"),
    (lambda s: s.replace("barrier(CLK_LOCAL_MEM_FENCE);", "printf(CLK_LOCAL_MEM_FENCE);", 1), "call of 'printf'"),
])
def test_crafted_opencl_source_is_refused(edit, why):
    attrs = _attrs_of("dense")
    assert check_gpu_attrs(attrs) is None
    bad = dict(attrs, source=edit(attrs["source"]))
    assert bad["source"] != attrs["source"]
    msg = check_gpu_attrs(bad)
    assert msg is not None and __import__("re").search(why, msg), msg


def test_opencl_clamp_must_match_the_array_size():
    attrs = _attrs_of("dense")
    n = attrs["params"][0][0][0] * attrs["params"][0][0][1]
    src = re.sub(rf", {n}\)\]", f", {n * 1000})]", attrs["source"], count=1)
    assert src != attrs["source"]
    assert "must be clamped to its size" in check_gpu_attrs(dict(attrs, source=src))
    assert "signature" in check_gpu_attrs(dict(attrs, block=[attrs["block"][0] * 2, *attrs["block"][1:]]))


def test_tensor_names_do_not_shadow_builtins(rng):
    """An input named 'int' and an output named 'tanh' (the elementwise op's compute name) get
    renamed in the OpenCL C, so the call to tanh() still means the builtin."""
    opencl_or_skip()
    a = te.placeholder((3, 70), "float32", name="int")
    y = ew.tanh(a)
    k = build_gpu(gpu.schedule_gpu([y]), [a, y], "opencl", "k_tanh")
    assert "restrict v_int" in k.source and "restrict v_tanh" in k.source
    x = rng.standard_normal((3, 70)).astype("float32")
    o = np.zeros((3, 70), "float32")
    run_kernel(k.to_attrs(), [x], o)
    np.testing.assert_allclose(o, np.tanh(x), atol=1e-6)
