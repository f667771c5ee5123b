"""accel compile --target opencl|cuda --emit DIR, and accel run of the compiled GPU model."""
import numpy as np
import pytest

from accel.cli import main
from compiler.frontend import zoo
from tests.compiler.gpu.gpu_helpers import opencl_or_skip


@pytest.fixture
def mlp_files(tmp_path):
    m = zoo.mlp()
    p = tmp_path / "mlp.onnx"
    p.write_bytes(m.SerializeToString())
    feeds = zoo.sample_inputs(m, 1)[0]
    (name, x), = feeds.items()
    np.save(tmp_path / "x.npy", x)
    return m, p, tmp_path


def test_compile_opencl_emit_and_run(mlp_files, capsys):
    opencl_or_skip()
    m, onnx_path, d = mlp_files
    out = d / "mlp.accm"
    assert main(["compile", str(onnx_path), "--target", "opencl", "-o", str(out), "--emit", str(d / "src"),
                 "--explain"]) == 0
    text = capsys.readouterr().out
    assert "compiled for --target opencl" in text
    cl = sorted((d / "src").glob("*.cl"))
    assert cl and all("__kernel" in f.read_text() for f in cl)
    assert main(["run", str(out), "--input", str(d / "x.npy"), "--output", str(d / "y.npy")]) == 0
    ort = pytest.importorskip("onnxruntime")
    x = np.load(d / "x.npy")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert np.abs(np.load(d / "y.npy") - ref).max() <= 1e-4 * np.abs(ref).max()


def test_compile_cuda_emits_ptx(mlp_files):
    m, onnx_path, d = mlp_files
    assert main(["compile", str(onnx_path), "--target", "cuda", "-o", str(d / "m.accm"), "--emit", str(d / "src")]) == 0
    ptx = sorted((d / "src").glob("*.ptx"))
    assert ptx and all(".entry" in f.read_text() for f in ptx)


def test_compile_cpu_emits_ll_and_asm(mlp_files):
    m, onnx_path, d = mlp_files
    assert main(["compile", str(onnx_path), "--target", "cpu", "-o", str(d / "m.accm"), "--emit", str(d / "src")]) == 0
    assert list((d / "src").glob("*.ll")) and list((d / "src").glob("*.s"))
