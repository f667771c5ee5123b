"""Models compiled for --target opencl run on PoCL within 1e-4 of onnxruntime; --target cuda
emits PTX that ptxas accepts; GPU modules save, load and are validated like any module."""
import numpy as np
import pytest

import compiler
from compiler.autotune import TuneOptions
from compiler.frontend import zoo
from compiler.module import CompiledModule
from compiler.ops import gpu, gpu_tune, registry  # noqa: F401 - gpu registers the GPU kernels
from compiler.ops.gpu_tune import GpuTuneError, GpuTuner
from host_runtime.executor import TRUST_PTX_ENV, ExecutorError, ModuleFormatError, format_profile, profile_summary
from host_runtime.gpu import CudaDevice
from tests.compiler.gpu.gpu_helpers import opencl_or_skip, ptxas_check

# PoCL compiles each kernel at its first launch (seconds for a conv; cached in ~/.cache/pocl), so
# two nets run by default and the rest under -m slow; every conv/dense variant runs in test_gpu_kernels.
FAST = ["mlp", "conv_bn_relu_pool"]
SLOW = ["depthwise_separable", "residual_block", "transformer_encoder", "upsample_decoder"]


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _check(name):
    opencl_or_skip()
    m = zoo.MODELS[name]()
    feeds = zoo.sample_inputs(m, 1)[0]
    mod = compiler.build_model(m, target="opencl")
    outs, rows = mod.run(feeds)
    ref = _ort(m, feeds)
    for k, r in ref.items():
        err = np.abs(outs[k] - r).max() / max(1e-12, np.abs(r).max())
        assert err <= 1e-4, f"{name}/{k}: relative error {err}"
    assert any(s.kind == "gpu" for s in mod.steps)
    assert any(r["target"] == "gpu" for r in rows)
    return mod


@pytest.mark.parametrize("name", FAST)
def test_zoo_model_on_opencl(name):
    mod = _check(name)
    for s in mod.steps:
        if s.op.split("+")[0] in ("conv2d", "dense", "matmul", "batch_matmul"):
            assert s.kind == "gpu" and "__local" in s.attrs["source"], s.name


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_zoo_model_on_opencl_slow(name):
    _check(name)


def test_op_without_gpu_kernel_falls_back_to_cpu_with_reason(monkeypatch):
    opencl_or_skip()
    monkeypatch.setitem(registry.IMPLS, ("softmax", "cuda"), [])
    monkeypatch.setitem(registry.DECLINED, ("softmax", "cuda"), "declined for the test")
    m = zoo.mlp()
    feeds = zoo.sample_inputs(m, 1)[0]
    mod = compiler.build_model(m, target="opencl")
    kinds = {s.op: s.kind for s in mod.steps}
    assert kinds["softmax"] == "llvm"
    assert any("declined for the test" in f for f in mod.meta["fallbacks"])
    row = next(r for r in mod.meta["partition"] if r["op"] == "softmax")
    assert row["target"] == "cpu" and "declined for the test" in row["reason"]
    outs, _ = mod.run(feeds)
    ref = _ort(m, feeds)
    for k, r in ref.items():
        assert np.abs(outs[k] - r).max() <= 1e-4 * np.abs(r).max()


def test_gpu_module_saves_loads_and_rejects_crafted_launch(tmp_path):
    opencl_or_skip()
    m = zoo.mlp()
    feeds = zoo.sample_inputs(m, 1)[0]
    mod = compiler.build_model(m, target="opencl")
    p = tmp_path / "mlp.accm"
    mod.save(p)
    back = CompiledModule.load(p)
    assert back.target == "opencl"
    a, _ = mod.run(feeds)
    b, _ = back.run(feeds)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    k = next(i for i, s in enumerate(back.steps) if s.kind == "gpu")
    back.steps[k].attrs["block"] = [4096, 1, 1]
    with pytest.raises(ModuleFormatError, match=rf"step {k} .*attrs.block"):
        back.validate()
    back.steps[k].attrs["block"] = mod.steps[k].attrs["block"]
    back.steps[k].attrs["params"] = [[[1], "float32"]] * len(back.steps[k].attrs["params"])
    with pytest.raises(ModuleFormatError, match=rf"step {k} .*(GPU kernel takes|clamped to its size)"):
        back.validate()


def test_cuda_target_emits_ptx_that_ptxas_accepts(tmp_path):
    m = zoo.conv_bn_relu_pool()
    mod = compiler.build_model(m, target="cuda")
    gpu_steps = [s for s in mod.steps if s.kind == "gpu"]
    assert gpu_steps and all(s.attrs["lang"] == "ptx" for s in gpu_steps)
    for s in gpu_steps:
        ptxas_check(s.attrs["source"], tmp_path, s.symbol)


def test_cuda_module_without_a_cuda_device_says_so():
    try:
        CudaDevice()
        pytest.skip("a CUDA device exists here")
    except Exception:  # noqa: BLE001
        pass
    mod = compiler.build_model(zoo.mlp(), target="cuda")
    with pytest.raises(ExecutorError, match="CUDA"):
        mod.run(zoo.sample_inputs(zoo.mlp(), 1)[0])


def test_ptx_from_a_file_runs_only_when_the_user_trusts_the_file(tmp_path, monkeypatch):
    """PTX cannot be verified on load (unlike OpenCL C and CPU kernel IR): refused by default,
    named with the option that accepts it."""
    mod = compiler.build_model(zoo.mlp(), target="cuda")
    p = tmp_path / "mlp_cuda.accm"
    mod.save(p)
    monkeypatch.delenv(TRUST_PTX_ENV, raising=False)
    with pytest.raises(ModuleFormatError, match=f"PTX kernels .* {TRUST_PTX_ENV}=1"):
        CompiledModule.load(p)
    monkeypatch.setenv(TRUST_PTX_ENV, "1")
    assert CompiledModule.load(p).target == "cuda"


def test_qdq_model_on_opencl_matches_cpu_target_exactly():
    opencl_or_skip()
    pytest.importorskip("onnxruntime")
    m = zoo.conv_bn_relu_pool()
    feeds = zoo.sample_inputs(m, 4)
    q = zoo.ort_quantize(m, feeds)
    mod = compiler.build_model(q, target="opencl")
    assert not mod.meta["fallbacks"], mod.meta["fallbacks"]
    got, _ = mod.run(feeds[0])
    want, _ = compiler.build_model(q, target="cpu").run(feeds[0])
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_tuning_log_makes_a_rebuild_a_lookup(tmp_path):
    opencl_or_skip()
    m = zoo.mlp()
    log = tmp_path / "gpu_tune.jsonl"
    mod = compiler.build_model(m, target="opencl", tune=TuneOptions(log=log, trials=4))
    assert mod.meta["tuning"] and all(r["candidates"] >= 1 for r in mod.meta["tuning"].values())
    recs = gpu_tune.read_log(log)
    assert {r["workload"]["key"] for r in recs if r["time_s"]} and len(recs) >= len(mod.meta["tuning"])
    assert all(r["isa"]["triple"] == "opencl" and r["workload"]["impl"].startswith("gpu.") for r in recs)
    calls = []
    orig = gpu_tune.measure
    gpu_tune.measure = lambda k, **kw: calls.append(k) or orig(k, **kw)
    try:
        again = compiler.build_model(m, target="opencl", tune=str(log))
    finally:
        gpu_tune.measure = orig
    assert not calls
    assert {k: r["knobs"] for k, r in again.meta["tuning"].items()} == {k: r["knobs"] for k, r in mod.meta["tuning"].items()}
    feeds = zoo.sample_inputs(m, 1)[0]
    a, _ = again.run(feeds)
    b, _ = compiler.build_model(m, target="cpu").run(feeds)
    for k in a:
        assert np.abs(a[k] - b[k]).max() <= 1e-5


def test_broken_tuning_log_is_one_error(tmp_path):
    p = tmp_path / "t.json"
    p.write_text("[1, 2")
    with pytest.raises(GpuTuneError, match="t.json"):
        GpuTuner(p)


def test_profile_counts_gpu_time():
    opencl_or_skip()
    m = zoo.mlp()
    mod = compiler.build_model(m, target="opencl")
    _, rows = mod.run(zoo.sample_inputs(m, 1)[0])
    s = profile_summary(rows)
    assert s["gpu_macs"] == sum(r["macs"] for r in rows) > 0 and s["gpu_time_s"] > 0
    assert "GPU " in format_profile(rows).splitlines()[-1]
