"""Tensors stay on the device between GPU steps (host_runtime.gpu.DeviceTensors): constants go up
once, inputs once per run, intermediates never come down unless a CPU step or a kept value needs
them, and only the outputs are downloaded."""
import numpy as np
import pytest

import compiler
from compiler.frontend import zoo
from compiler.ops import gpu, registry  # noqa: F401 - gpu registers the GPU kernels
from host_runtime.gpu import DeviceTensors
from tests.compiler.gpu.gpu_helpers import opencl_or_skip


class FakeDevice:
    """Host memory standing in for a device: records every copy."""
    kind = "fake"

    def __init__(self):
        self.log = []

    def alloc(self, nbytes):
        return bytearray(max(1, nbytes))

    def upload(self, buf, a):
        buf[:a.nbytes] = a.tobytes()
        self.log.append("up")

    def download(self, a, buf):
        a[...] = np.frombuffer(bytes(buf[:a.nbytes]), a.dtype).reshape(a.shape)
        self.log.append("down")

    def prepare_kernel(self, attrs):
        def launch(bufs):   # out = sum of the inputs, elementwise (float32)
            xs = [np.frombuffer(bytes(b), np.float32) for b in bufs[:-1]]
            bufs[-1][:] = sum(xs).astype(np.float32).tobytes()
        return launch


def test_device_tensors_copy_only_what_the_other_side_reads():
    views = [np.zeros(4, np.float32) for _ in range(4)]
    const = [np.full(4, 10, np.float32)]
    dt, dev = DeviceTensors(views, const), FakeDevice()
    k1 = dt.gpu_step(dev, {}, [("t", 0), ("c", 0)], 1)       # t1 = x + 10
    k2 = dt.gpu_step(dev, {}, [("t", 1), ("t", 1)], 2)       # t2 = 2 * t1: t1 stays on the device

    def cpu():
        views[3][...] = views[2] + 1
    k3 = dt.host_step(cpu, [2], 3)                            # t3 = t2 + 1 on the host: t2 comes down
    for run in range(2):
        views[0][...] = run + 1
        dt.host_wrote(0)
        k1()
        k2()
        assert dt.host_stale == {1, 2}
        k3()
        dt.to_host(3)                                         # host-made: nothing to copy
        np.testing.assert_array_equal(views[3], 2 * (run + 1 + 10) + 1)
    # run 1: x and the constant up, t2 down; run 2: only x up and t2 down
    assert dev.log == ["up", "up", "down", "up", "down"]
    assert dt.counts == {"uploads": 3, "downloads": 2, "upload_bytes": 48, "download_bytes": 32}


def test_host_write_makes_the_device_copy_stale():
    views = [np.ones(4, np.float32), np.zeros(4, np.float32)]
    dt, dev = DeviceTensors(views, []), FakeDevice()
    k = dt.gpu_step(dev, {}, [("t", 0)], 1)
    k()
    views[0][...] = 5
    dt.host_wrote(0)
    k()
    dt.to_host(1)
    np.testing.assert_array_equal(views[1], 5)
    assert dt.counts["uploads"] == 2 and dt.counts["downloads"] == 1


def _consts_used(mod):
    return len({a[1] for s in mod.steps if s.kind == "gpu" for a in s.args if a[0] == "c"})


def _ref(m, feeds):
    return compiler.build_model(m, target="cpu").run(feeds)[0]


@pytest.mark.parametrize("name", ["mlp", "conv_bn_relu_pool"])
def test_model_uploads_inputs_and_constants_once_downloads_outputs(name):
    opencl_or_skip()
    m = zoo.MODELS[name]()
    feeds = zoo.sample_inputs(m, 2)
    mod = compiler.build_model(m, target="opencl")
    assert all(s.kind == "gpu" for s in mod.steps), [(s.name, s.kind) for s in mod.steps]
    ex = mod.executor()
    n_in, n_out, n_c = len(mod.inputs), len(mod.outputs), _consts_used(mod)
    for k, f in enumerate(feeds):
        outs = ex.run(f)
        want = _ref(m, f)
        for key in want:
            assert np.abs(outs[key] - want[key]).max() <= 1e-5 * max(1.0, np.abs(want[key]).max())
        c = ex.gpu.counts
        assert c["uploads"] == n_c + (k + 1) * n_in, c
        assert c["downloads"] == (k + 1) * n_out, c
    # keep=True brings every step's output down
    ex.run(feeds[0], keep=True)
    assert ex.gpu.counts["downloads"] == 2 * n_out + len(mod.steps)
    assert len(ex.values) == len(mod.steps)


def test_cpu_fallback_step_downloads_what_it_reads(monkeypatch):
    opencl_or_skip()
    monkeypatch.setitem(registry.IMPLS, ("softmax", "cuda"), [])
    monkeypatch.setitem(registry.DECLINED, ("softmax", "cuda"), "declined for the test")
    m = zoo.mlp()
    feeds = zoo.sample_inputs(m, 1)[0]
    mod = compiler.build_model(m, target="opencl")
    assert [s.kind for s in mod.steps][-1] == "llvm"
    ex = mod.executor()
    outs = ex.run(feeds)
    want = _ref(m, feeds)
    for key in want:
        assert np.abs(outs[key] - want[key]).max() <= 1e-5
    # the softmax's input comes down for the CPU; the output is the CPU's own: no download
    assert ex.gpu.counts["downloads"] == 1
    assert ex.gpu.counts["uploads"] == _consts_used(mod) + 1


def test_tensors_in_one_planned_slot_share_a_device_buffer():
    """t1 and t3 share a slot (the memory plan reuses t1's place for t3): one buffer; filling it
    for t3 drops t1's device copy. A step whose output shares an input's slot (planned in place)
    gets a buffer of its own."""
    views = [np.zeros(4, np.float32) for _ in range(5)]
    slots = ["x", "A", "B", "A", "B"]
    dt, dev = DeviceTensors(views, [], slots), FakeDevice()
    views[0][...] = 1
    dt.gpu_step(dev, {}, [("t", 0)], 1)()          # t1 = x
    dt.gpu_step(dev, {}, [("t", 1), ("t", 1)], 2)()  # t2 = 2 * t1
    dt.gpu_step(dev, {}, [("t", 2), ("t", 2)], 3)()  # t3 = 2 * t2, into t1's slot
    assert 1 not in dt.on_device and dt.on_device[3] is dev
    assert len(dt.bufs) == 3                         # x, A, B
    inplace = dt.gpu_step(dev, {}, [("t", 3), ("t", 2)], 4)  # t4 in t2's slot B, which it reads
    inplace()
    dt.to_host(4)
    np.testing.assert_array_equal(views[4], 4 + 2)
    assert len(dt.bufs) == 4 and dt.slots[4] == ("own", 4)
