"""The executor's run loop: the profile it reports (built when read, for the last run only), the
results it keeps (accelerator steps' RunResults, None for host steps), its input checks, and the
batches of CPU kernel steps it runs in one call into the runtime."""
import ctypes

import numpy as np
import pytest

from compiler import build_model
from compiler.frontend import zoo
from host_runtime import executor as executor_mod
from host_runtime.executor import Executor, ExecutorError
from host_runtime.kernel_cache import RUN_STEPS_MAX_ARGS


@pytest.fixture(scope="module")
def mixed():
    """The tiny CNN on the accel target: accelerator and host steps in one module."""
    m = zoo.conv_bn_relu_pool()
    feeds = zoo.sample_inputs(m, 3, seed=2)
    return build_model(m, target="accel", config="tiny", calibration=feeds[:2]), feeds


def test_profile_is_the_last_runs_and_results_keep_only_accelerator_steps(mixed):
    mod, feeds = mixed
    ex = Executor(mod)
    assert ex.profile == []
    a = ex.run(feeds[0])
    first = ex.profile
    b = ex.run(feeds[1])
    rows = ex.profile
    assert rows is ex.profile and rows is not first   # rebuilt once per run, then the same rows
    kinds = [s.kind for s in mod.steps]
    assert [r["impl"] for r in rows] == kinds and [r["name"] for r in rows] == [s.name for s in mod.steps]
    assert all(r["time_s"] >= 0 for r in rows)
    assert [r is not None for r in ex.results] == [k == "accel" for k in kinds] and "accel" in kinds
    for r, res in zip(rows, ex.results):
        if res is not None:
            assert r["cycles"] == res.cycles and r["insns"] == res.insn_count
    assert any(not np.array_equal(a[k], b[k]) for k in a)
    kept = ex.run(feeds[1], keep=True)
    assert all(np.array_equal(kept[k], b[k]) for k in b) and len(ex.profile) == len(rows)
    steps = []
    ex.run(feeds[0], progress=lambda k, n, name: steps.append((k, name)))
    assert steps[-1] == (len(mod.steps), "done") and len(ex.profile) == len(rows)


def test_inputs_are_checked_by_name_count_and_shape(mixed):
    mod, feeds = mixed
    ex = Executor(mod)
    (name, x), = feeds[0].items()
    with pytest.raises(ExecutorError, match=r"has no input\(s\) other"):
        ex.run({name: x, "other": x})
    with pytest.raises(ExecutorError, match=r"no value given for input\(s\) image"):
        ex.run({})
    with pytest.raises(ExecutorError, match=r"takes 1 input\(s\) \(image\), got 2"):
        ex.run([x, x])
    with pytest.raises(ExecutorError, match=r"input 'image': expected shape \[1, 3, 16, 16\], got \[1, 3, 16\]"):
        ex.run({name: x[..., 0]})
    out = ex.run([x.astype(np.float64)])   # another dtype is cast, as before
    np.testing.assert_array_equal(next(iter(out.values())), next(iter(ex.run(feeds[0]).values())))


@pytest.fixture(scope="module")
def cpu_encoder():
    """A transformer encoder on the cpu target: runs of consecutive CPU kernel steps."""
    m = zoo.transformer_encoder()
    return build_model(m, target="cpu"), zoo.sample_inputs(m, 2, seed=3)


def test_kernel_steps_run_in_batches_exactly_as_one_by_one(cpu_encoder, monkeypatch):
    mod, feeds = cpu_encoder
    ex = Executor(mod)
    batches = [seg for seg in ex._segments if seg[0] == "batch"]
    assert batches and sum(k1 - k0 for _, k0, k1, _ in batches) >= len(mod.steps) // 2
    covered = sorted([seg[1] for seg in ex._segments if seg[0] == "call"] +
                     [k for _, k0, k1, _ in batches for k in range(k0, k1)])
    assert covered == list(range(len(mod.steps)))   # every step once, in order
    for feed in feeds:
        lean = ex.run(feed)
        assert all(r["time_s"] > 0 for r in ex.profile)   # the batch's own per-step times
        one_by_one = ex.run(feed, progress=lambda *a: None)   # the per-step loop
        assert all(np.array_equal(lean[k], one_by_one[k]) for k in lean)
    # a kernel with more pointers than the runner's calls take runs on its own, with the same result
    monkeypatch.setattr(executor_mod, "RUN_STEPS_MAX_ARGS", 2)
    narrow = Executor(mod)
    for seg in narrow._segments:
        if seg[0] == "batch":
            assert all(len(narrow._kernel_ptrs[id(s)][1]) <= 2 for s in mod.steps[seg[1]:seg[2]])
    assert any(seg[0] == "call" and mod.steps[seg[1]].kind == "llvm" for seg in narrow._segments)
    got = narrow.run(feeds[0])
    assert all(np.array_equal(got[k], ex.run(feeds[0])[k]) for k in got)


def test_runner_refuses_an_argument_count_it_cannot_call(cpu_encoder):
    mod, _ = cpu_encoder
    ex = Executor(mod)
    run = ex.lib.lib.kit_run_steps
    fns = (ctypes.c_void_p * 1)(ex._kernel_ptrs[id(mod.steps[0])][0])
    for bad in (0, RUN_STEPS_MAX_ARGS + 1):
        nargs = (ctypes.c_int * 1)(bad)
        ns = (ctypes.c_longlong * 1)()
        assert run(1, fns, nargs, (ctypes.c_void_p * 1)(), ns) == 0   # stops before the call


def test_steps_that_share_a_name_each_run_their_own_kernel(cpu_encoder):
    """Step names are labels, not keys: a module whose kernel steps all carry one name (a file may
    say so) runs each step with its own kernel and arguments, as the step-by-step loop does."""
    mod, feeds = cpu_encoder
    want = Executor(mod).run(feeds[0])
    same = type(mod).from_bytes(mod.to_bytes())
    for s in same.steps:
        if s.kind == "llvm":
            s.name = "one name"
    ex = Executor(same)
    assert any(seg[0] == "batch" for seg in ex._segments)
    got = ex.run(feeds[0])
    assert all(np.array_equal(got[k], want[k]) for k in want)
