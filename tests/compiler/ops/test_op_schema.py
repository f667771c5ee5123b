"""One operator schema: an op is declared once (compiler.graph.ops) and each target kind registers
kernels for it (compiler.ops.registry). Adding an op is one declaration plus one kernel per target."""
import numpy as np
import pytest

import compiler
import compiler.module  # noqa: F401 - imported before the toy op is declared, as in a real program
from compiler import ops, te
from compiler.graph import Graph, Node, OpError, Pattern, run
from compiler.graph import ops as schema
from compiler.ops import cpu, gpu, registry
from host_runtime import executor
from tests.compiler.gpu.gpu_helpers import opencl_or_skip


@pytest.fixture
def scratch():
    """Declarations and kernels a test makes are gone after it."""
    saved = [(d, dict(d)) for d in (schema.REGISTRY, registry.IMPLS, registry.DECLINED, executor.HOST_OPS,
                                    executor.HOST_OP_CHECKS)]
    yield
    for d, old in saved:
        d.clear()
        d.update(old)


def declare_softsign2():
    """The toy op: y = x / (beta + |x|), beta > 0 (one declaration: schema, inference, reference)."""
    def infer(n):
        x = n.inputs[0].type
        if not x.dtype.startswith("float"):
            schema.fail(n, f"input must be float, got {x.dtype}")
        return x

    schema.declare("softsign2", Pattern.ELEMWISE, 1,
                   {"beta": schema.Attr(1.0, "a number > 0", lambda v: v > 0)},
                   infer=infer, reference=lambda a, x: (x / (a["beta"] + np.abs(x))).astype(x.dtype),
                   doc="x / (beta + |x|)")


def softsign2(x, *, beta):
    """The toy op's compute (te), shared by its CPU and GPU kernels."""
    b = te.const(beta, x.dtype)
    return te.compute(x.shape, lambda *i: x[i] / (b + te.abs(x[i])), name="softsign2", tag="elemwise,softsign2")


def register_softsign2_llvm():
    """The toy op's one CPU kernel: the compute and a CPU schedule."""
    registry.register_kernel("softsign2", "llvm", schedule=cpu.schedule_injective)(softsign2)


def test_new_op_is_one_declaration_plus_one_kernel(scratch):
    declare_softsign2()
    register_softsign2_llvm()
    x = Node.input("x", (3, 16))
    w = Node.const(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32), "w")
    d = Node("dense", [x, w], name="fc")
    y = Node("softsign2", [d], {"beta": 0.5}, name="s")
    z = Node("softsign2", [Node("relu", [y], name="r")], name="s2")     # the default beta
    g = Graph.from_outputs([x], [z], ["z"], name="toy")
    assert z.attrs == {"beta": 1.0}

    mod = compiler.build_model(g, target="cpu")
    assert mod.meta["fallbacks"] == [], mod.meta["fallbacks"]
    feed = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32) * 3
    outs, _ = mod.run({"x": feed})
    want = run(g, [feed])[0]
    np.testing.assert_allclose(outs["z"], want, rtol=1e-5, atol=1e-6)
    assert np.abs(want).max() > 0.1                                       # not a degenerate check

    f = ops.compile_op("softsign2", [(4, 5)], {"beta": 2.0})              # the library API sees it too
    a = np.linspace(-3, 3, 20, dtype=np.float32).reshape(4, 5)
    np.testing.assert_allclose(f(a), a / (2 + np.abs(a)), rtol=1e-6)
    assert "softsign2" in ops.list_ops("llvm")


def test_new_op_gets_a_gpu_kernel_by_one_more_registration(scratch):
    """One kernel per target: the same compute with the GPU schedule runs the op on OpenCL (PoCL)."""
    opencl_or_skip()
    declare_softsign2()
    registry.register_kernel("softsign2", "cuda", schedule=gpu.schedule_gpu)(softsign2)
    x = Node.input("x", (4, 64))
    g = Graph.from_outputs([x], [Node("softsign2", [Node("relu", [x], name="r")], {"beta": 2.0}, name="s")], ["y"])
    mod = compiler.build_model(g, target="opencl")
    assert mod.meta["fallbacks"] == [] and {p["target"] for p in mod.meta["partition"]} == {"gpu"}
    feed = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32) * 4
    np.testing.assert_allclose(mod.run({"x": feed})[0]["y"], run(g, [feed])[0], rtol=1e-5, atol=1e-6)


def test_declared_op_without_a_kernel_runs_from_its_reference(scratch):
    """The declaration alone is enough to run, whatever was imported first: the CPU target falls
    back to the reference (a host op from the moment it is declared) and says so; the kernel then
    replaces it."""
    declare_softsign2()
    x = Node.input("x", (2, 6))
    g = Graph.from_outputs([x], [Node("softsign2", [Node("relu", [x], name="r")], {"beta": 3.0}, name="s")], ["y"])
    feed = np.linspace(-4, 4, 12, dtype=np.float32).reshape(2, 6)
    mod = compiler.build_model(g, target="cpu")
    assert any("softsign2" in f and "no kernel" in f for f in mod.meta["fallbacks"]), mod.meta["fallbacks"]
    np.testing.assert_array_equal(mod.run({"x": feed})[0]["y"], run(g, [feed])[0])
    register_softsign2_llvm()
    mod = compiler.build_model(g, target="cpu")
    assert mod.meta["fallbacks"] == []
    np.testing.assert_allclose(mod.run({"x": feed})[0]["y"], run(g, [feed])[0], rtol=1e-6)


def test_kernel_for_undeclared_op_is_refused(scratch):
    with pytest.raises(OpError, match=r"^kernel 'softsign3.k': operator 'softsign3' is not declared; declare it in "
                                      r"compiler.graph.ops first$"):
        registry.add_impl("softsign3", "llvm", "softsign3.k", lambda x: x, cpu.schedule_injective)
    with pytest.raises(OpError, match="not declared"):
        @registry.register_kernel("softsign3", "llvm", schedule=cpu.schedule_injective)
        def k(x):
            return x
    assert ("softsign3", "llvm") not in registry.IMPLS


def test_kernel_that_misses_a_declared_attribute_is_refused(scratch):
    declare_softsign2()
    with pytest.raises(OpError, match=r"kernel 'softsign2.k' for 'softsign2' on 'llvm': compute does not take "
                                      r"attribute\(s\) beta declared by the op"):
        @registry.register_kernel("softsign2", "llvm", schedule=cpu.schedule_injective)
        def k(x):
            return x
    with pytest.raises(OpError, match="target kind must be a name"):
        registry.add_impl("softsign2", "llvm -mcpu=x", "k", lambda x, beta: x, cpu.schedule_injective)


def test_attributes_outside_the_schema_are_refused_in_one_line(scratch):
    declare_softsign2()
    register_softsign2_llvm()
    x = Node.input("x", (2, 2))
    cases = [({"beta": -1.0}, r"softsign2 's': beta=-1.0 must be a number > 0"),
             ({"gamma": 1}, r"softsign2 's': unknown attribute\(s\) gamma; softsign2 takes beta")]
    for attrs, msg in cases:
        with pytest.raises(OpError, match=f"^{msg}$"):
            Node("softsign2", [x], attrs, name="s")
    with pytest.raises(OpError, match=r"^softsign2: beta=0 must be a number > 0$"):
        ops.compile_op("softsign2", [(2, 2)], {"beta": 0})
    with pytest.raises(OpError, match="already declared"):
        declare_softsign2()


@pytest.mark.parametrize("op,attrs,msg", [
    ("pad", {"pads": (0, 0, 1, 1), "mode": "wrap"}, "mode='wrap' must be one of 'constant', 'reflect', 'edge'"),
    ("max_pool2d", {"kernel": (0, 2)}, r"kernel=\(0, 2\) must be 2 integers >= 1"),
    ("max_pool2d", {"kernel": (2, 2), "ceil_mode": 2}, "ceil_mode=2 must be one of 0, 1"),
    ("conv2d", {"strides": (1, 1, 1)}, r"strides=\(1, 1, 1\) must be 2 integers >= 1"),
    ("conv2d", {"groups": 0}, "groups=0 must be an integer >= 1"),
    ("gelu", {"approximate": "fast"}, "approximate='fast' must be one of 'none', 'tanh'"),
    ("qconv2d", {"in_shift": 1, "w_shift": 1, "out_shift": 1, "layout": "NHWC"},
     "layout='NHWC' must be one of 'NCHW', 'NCHWnc'"),
    ("layout_transform", {"src_layout": "NCHW", "dst_layout": "NHWC"}, "dst_layout='NHWC' must be 'NCHW' or"),
])
def test_declared_ops_check_allowed_values(op, attrs, msg):
    with pytest.raises(OpError, match=f"^{op}: {msg}"):
        schema.normalize_attrs(op, attrs)
    with pytest.raises(OpError, match=f"^{op}: {msg}"):
        ops.normalize_attrs(op, attrs)                      # the kernels' normalization is the schema's


def test_every_kernel_takes_its_ops_attributes_from_the_schema():
    """Each registered kernel (CPU and GPU) accepts every declared attribute, and every op with a
    CPU kernel has a reference the kernel is checked against."""
    for (op, kind), kernels in registry.IMPLS.items():
        decl = schema.get_op(op)
        assert decl.reference is not None, op
        for k in kernels:
            registry._check_compute(decl, k.name, kind, k.compute)


def test_blocked_ops_have_reference_semantics():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    lt = schema.get_op("layout_transform").reference
    xb = lt({"src_layout": "NCHW", "dst_layout": "NCHW4c"}, x)
    assert xb.shape == (1, 2, 5, 5, 4)
    np.testing.assert_array_equal(lt({"src_layout": "NCHW4c", "dst_layout": "NCHW"}, xb), x)
    wb = ops.nn.pack_kernel_np(w, 4, 4)
    a = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1)}
    yb = schema.get_op("conv2d_NCHWc").reference(a, xb, wb)
    y = schema.get_op("conv2d").reference({**a, "groups": 1}, x, w)
    np.testing.assert_allclose(lt({"src_layout": "NCHW4c", "dst_layout": "NCHW"}, yb), y, rtol=1e-5, atol=1e-5)
    n = Node("conv2d_NCHWc", [Node.input("x", xb.shape), Node.const(wb)], a)
    assert n.shape == yb.shape
    f = ops.compile_op("conv2d_NCHWc", [xb.shape, wb.shape], a)
    np.testing.assert_allclose(f(xb, wb), yb, rtol=1e-4, atol=1e-4)


def test_schema_takes_numpy_scalars_and_lists_as_importers_give_them():
    a = schema.normalize_attrs("max_pool2d", {"kernel": [np.int64(3), 3], "ceil_mode": np.int64(1)})
    assert a["kernel"] == (3, 3) and a["ceil_mode"] == 1 and a["pads"] == (0, 0, 0, 0)
    assert schema.normalize_attrs("gelu", {"approximate": np.str_("tanh")}) == {"approximate": "tanh"}
    with pytest.raises(OpError, match=r"^gelu: approximate=b'tanh' must be one of 'none', 'tanh'$"):
        schema.normalize_attrs("gelu", {"approximate": b"tanh"})


def test_blocked_depthwise_has_reference_semantics_and_a_shape_check():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 8, 6, 7)).astype(np.float32)
    w = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)
    a = {"strides": (2, 1), "pads": (1, 0, 1, 2), "dilations": (1, 1)}
    xb = schema.get_op("layout_transform").reference({"src_layout": "NCHW", "dst_layout": "NCHW4c"}, x)
    wb = ops.nn.pack_depthwise_kernel_np(w, 4)
    assert wb.shape == (2, 3, 3, 4)
    yb = schema.get_op("depthwise_conv2d_NCHWc").reference(a, xb, wb)
    y = schema.get_op("conv2d").reference({**a, "groups": 8}, x, w)
    np.testing.assert_allclose(yb.transpose(0, 1, 4, 2, 3).reshape(y.shape), y, rtol=1e-5, atol=1e-5)
    n = Node("depthwise_conv2d_NCHWc", [Node.input("x", xb.shape), Node.const(wb)], a)
    assert n.shape == yb.shape
    with pytest.raises(OpError, match=r"depthwise_conv2d_NCHWc.*expects data \(N, C', H, W, c\)"):
        Node("depthwise_conv2d_NCHWc", [Node.input("x", xb.shape), Node.const(wb[:1])], a)
