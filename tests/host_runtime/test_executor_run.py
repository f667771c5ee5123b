"""The executor's run loop: the profile it reports (built when read, for the last run only), the
results it keeps (accelerator steps' RunResults, None for host steps) and its input checks."""
import numpy as np
import pytest

from compiler import build_model
from compiler.frontend import zoo
from host_runtime.executor import Executor, ExecutorError


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
