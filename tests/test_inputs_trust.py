"""Files and values the kit is handed: array files for `accel run --input` / `--calibration` (no
pickles, corrupt or truncated ones give one `error:` line naming the file), NaN and Inf (propagate
on the cpu target as in onnxruntime; saturate on the accelerator), and output files (the umask's
mode, never over one of the command's inputs, written whole or not at all)."""
import io
import os
import pickle
import shutil
import stat
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import accel.isa.files as files
import compiler
import flows.inputs
from accel.cli import main
from accel.isa.files import write_atomic
from compiler.frontend.zoo import ModelBuilder


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def _error(capsys, match, *argv):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err
    return lines[0]


# ---- NaN and Inf ------------------------------------------------------------------------------------
def _one_op(op, x_shape, attrs=None, inits=(), opset=17):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node(op, ["x", *(t.name for t in inits)], ["y"], name="n", **(attrs or {}))
    m = helper.make_model(helper.make_graph([node], op.lower(), [x], [y], list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return onnx.shape_inference.infer_shapes(m)


def _special_input(shape, seed=0):
    """Random normals with NaN, +Inf and -Inf sprinkled in (about one value in six special)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    kind = rng.integers(0, 18, shape)
    x[kind == 0] = np.nan
    x[kind == 1] = np.inf
    x[kind == 2] = -np.inf
    return x


_W = numpy_helper.from_array(np.random.default_rng(3).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
_B = numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "b")
_LO = numpy_helper.from_array(np.array(-0.5, np.float32), "lo")
_HI = numpy_helper.from_array(np.array(0.75, np.float32), "hi")
_Z = numpy_helper.from_array(np.zeros((), np.float32), "z")
SPECIAL_CASES = {
    "relu": ("Relu", {}, ()),
    "add": ("Add", {}, (_B,)),
    "conv": ("Conv", {"pads": [1, 1, 1, 1]}, (_W,)),
    "softmax": ("Softmax", {"axis": -1}, ()),
    "clip": ("Clip", {}, (_LO, _HI)),
    "max_elementwise": ("Max", {}, (_Z,)),
    "min_elementwise": ("Min", {}, (_Z,)),
    "leaky_relu": ("LeakyRelu", {"alpha": 0.1}, ()),
    "sigmoid": ("Sigmoid", {}, ()),
    "average_pool": ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2]}, ()),
    "global_average_pool": ("GlobalAveragePool", {}, ()),
    "hard_sigmoid": ("HardSigmoid", {}, ()),
}


@pytest.mark.parametrize("name", sorted(SPECIAL_CASES))
def test_nan_and_inf_on_the_cpu_target_match_onnxruntime(name):
    op, attrs, inits = SPECIAL_CASES[name]
    m = _one_op(op, (1, 3, 8, 8), attrs, inits)
    mod = compiler.build(m, target="cpu")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in range(3):
        x = _special_input((1, 3, 8, 8), seed)
        want = sess.run(None, {"x": x})[0]
        got = next(iter(mod.run({"x": x})[0].values()))
        assert np.isnan(want).any()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{name}: NaN positions")
        np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want), err_msg=f"{name}: +Inf positions")
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=f"{name}: -Inf positions")
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5)


_AXES = numpy_helper.from_array(np.array([2, 3], np.int64), "axes")
MAX_CASES = {
    "max_pool": ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}, ()),
    "max_pool_overlapping": ("MaxPool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}, ()),
    "global_max_pool": ("GlobalMaxPool", {}, ()),
    "reduce_max": ("ReduceMax", {"keepdims": 1}, (_AXES,)),
}


@pytest.mark.parametrize("name", sorted(MAX_CASES))
def test_max_pooling_and_reductions_with_inf_match_onnxruntime_and_nan_propagates(name):
    """A max over a window: +-Inf as onnxruntime gives them; a window holding a NaN gives NaN, as
    numpy's max and PyTorch's max_pool2d (onnxruntime's MLAS answer there depends on the tap order
    of its SIMD path: [[0.7, -0.8], [nan, -1.4]] pools to -0.8 on an 8x8 image, NaN on others)."""
    op, attrs, inits = MAX_CASES[name]
    m = _one_op(op, (1, 3, 8, 8), attrs, inits, opset=18)
    mod = compiler.build(m, target="cpu")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in range(3):
        x = _special_input((1, 3, 8, 8), seed)
        no_nan = np.where(np.isnan(x), np.float32(0.5), x)
        np.testing.assert_array_equal(next(iter(mod.run({"x": no_nan})[0].values())),
                                      sess.run(None, {"x": no_nan})[0])
        got = next(iter(mod.run({"x": x})[0].values()))
        np.testing.assert_array_equal(got, compiler.graph.run(compiler.frontend.from_onnx(m), {"x": x})[0])
        if op != "MaxPool":
            np.testing.assert_array_equal(got, x.max(axis=(2, 3), keepdims=True))
    x = np.array([[[[np.nan, 1.0, 2.0, np.nan], [3.0, 4.0, -np.inf, np.inf]]]], np.float32)
    pool = _one_op("MaxPool", x.shape, {"kernel_shape": [2, 2], "strides": [2, 2]})
    got = next(iter(compiler.build(pool, target="cpu").run({"x": x})[0].values()))
    np.testing.assert_array_equal(got.ravel(), [np.nan, np.nan])
    relu = next(iter(compiler.build(_one_op("Relu", x.shape), target="cpu").run({"x": x})[0].values()))
    np.testing.assert_array_equal(relu, np.maximum(x, 0))


def test_nan_and_inf_on_the_accelerator_saturate_when_quantized():
    """The accelerator computes on int8: quantizing its input, +Inf saturates to 127, -Inf to the
    lowest value and NaN to the lowest value too (as onnxruntime's QuantizeLinear does), so every
    output stays finite and only the outputs those pixels reach change."""
    b = ModelBuilder("special", 0)
    x = b.input("x", (1, 16, 8, 8))
    m = b.build([b.op("Relu", [b.conv(x, 16, 16, name="c1")], name="r1")])
    rng = np.random.default_rng(1)
    cal = [{"x": rng.standard_normal((1, 16, 8, 8)).astype(np.float32)} for _ in range(4)]
    mod = compiler.build(m, target="accel", config="tiny", calibration=cal)
    clean = cal[0]["x"].copy()
    base = next(iter(mod.run({"x": clean})[0].values()))
    lo = clean.copy()
    lo[0, 0, 4, 4] = -1e30      # what NaN and -Inf become: the lowest int8
    hi = clean.copy()
    hi[0, 0, 4, 4] = 1e30
    for special, same_as in ((np.nan, lo), (-np.inf, lo), (np.inf, hi)):
        xs = clean.copy()
        xs[0, 0, 4, 4] = special
        got = next(iter(mod.run({"x": xs})[0].values()))
        assert np.isfinite(got).all(), special
        np.testing.assert_array_equal(got, next(iter(mod.run({"x": same_as})[0].values())))
        changed = np.argwhere((got != base).any(axis=1)[0])     # a 3x3 conv: only the 3x3 neighbourhood
        assert len(changed) and (abs(changed - [4, 4]) <= 1).all(), (special, changed)


# ---- array files for --input and --calibration ------------------------------------------------------
@pytest.fixture(scope="module")
def cpu_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    b = ModelBuilder("tiny_cpu", 0)
    x = b.input("x", (1, 4, 4, 4))
    m = b.build([b.op("Relu", [b.conv(x, 4, 4, name="c")], name="r")])
    (d / "m.onnx").write_bytes(m.SerializeToString())
    compiler.build(m, target="cpu").save(d / "m.accm")
    return d


def _npy_bytes(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


GOOD = np.zeros((1, 4, 4, 4), np.float32)
BAD_FILES = {
    "truncated.npy": (_npy_bytes(GOOD)[:-10], "truncated .npy file: its header promises 256 bytes"),
    "header_only.npy": (_npy_bytes(GOOD)[:20], "not a valid .npy array"),
    "pickle.npy": (pickle.dumps({"x": 1}), "pickled or unknown data"),
    "object.npy": (_npy_bytes(np.array([1, "a", None], dtype=object)), "object arrays need pickle"),
    "text.npy": (b"1 2 3\n", "not an .npy or .npz file"),
    "strings.npy": (_npy_bytes(np.array(["ab", "cd"])), "is not numeric"),
    "empty.npy": (b"", "not an .npy or .npz file"),
    "bad_magic_version.npy": (b"\x93NUMPY\x09\x00" + _npy_bytes(GOOD)[8:], "unsupported .npy format version"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_npy_input_gives_one_error_line_naming_the_file(capsys, cpu_model, tmp_path, name):
    data, message = BAD_FILES[name]
    (tmp_path / name).write_bytes(data)
    line = _error(capsys, message, "run", cpu_model / "m.accm", "--input", f"x={tmp_path / name}")
    assert name in line


def _npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def test_bad_npz_inputs_give_one_error_line(capsys, cpu_model, tmp_path):
    good = _npz_bytes(x=GOOD)
    cases = {
        "cut.npz": (good[: len(good) // 2], "corrupt .npz file"),
        "object.npz": (_npz_bytes(x=np.array([{}], dtype=object)), "object arrays need pickle"),
    }
    flipped = bytearray(good)          # a corrupted compressed member: CRC or zlib error
    at = good.index(b"x.npy") + 40
    flipped[at:at + 8] = b"\xff" * 8
    cases["flipped.npz"] = (bytes(flipped), "corrupt .npz file")
    other = io.BytesIO()
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("x.npy", _npy_bytes(GOOD))
        z.writestr("notes.txt", b"hello")
    cases["member.npz"] = (other.getvalue(), "member 'notes.txt' is not an .npy array")
    lying = io.BytesIO()               # a header that promises far more than the member holds
    with zipfile.ZipFile(lying, "w") as z:
        z.writestr("x.npy", _npy_bytes(np.zeros((4,), np.float32)).replace(b"(4,)", b"(10000000000,)"))
    cases["lying.npz"] = (lying.getvalue(), "array 'x' is truncated")
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        line = _error(capsys, message, "run", cpu_model / "m.accm", "--input", tmp_path / name)
        assert name in line, line
    (tmp_path / "cal.npz").write_bytes(cases["object.npz"][0])
    _error(capsys, "--calibration", "compile", cpu_model / "m.onnx", "--target", "cpu", "-o", tmp_path / "o.accm",
           "--calibration", tmp_path / "cal.npz")
    (tmp_path / "cal.npy").write_bytes(BAD_FILES["truncated.npy"][0])
    _error(capsys, "truncated .npy", "compile", cpu_model / "m.onnx", "--target", "cpu", "-o", tmp_path / "o.accm",
           "--calibration", tmp_path / "cal.npy")
    assert not (tmp_path / "o.accm").exists()


def test_npz_size_cap_missing_files_and_directories(capsys, cpu_model, tmp_path, monkeypatch):
    np.savez_compressed(tmp_path / "x.npz", x=GOOD)
    monkeypatch.setattr(flows.inputs, "MAX_ARRAY_FILE_BYTES", 100)   # checked on the zip's declared sizes
    _error(capsys, "more than the 100 bytes an array file may hold", "run", cpu_model / "m.accm",
           "--input", tmp_path / "x.npz")
    monkeypatch.undo()
    _error(capsys, "cannot read", "run", cpu_model / "m.accm", "--input", f"x={tmp_path / 'missing.npy'}")
    _error(capsys, "cannot read", "run", cpu_model / "m.accm", "--input", f"x={tmp_path}")


def test_good_npy_and_npz_inputs_still_run(capsys, cpu_model, tmp_path):
    x = np.random.default_rng(0).standard_normal((1, 4, 4, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez_compressed(tmp_path / "x.npz", x=x)
    outs = []
    for spec in (f"x={tmp_path / 'x.npy'}", str(tmp_path / "x.npz")):
        out = tmp_path / f"y{len(outs)}.npy"
        rc, _, _ = _run(capsys, "run", cpu_model / "m.accm", "--input", spec, "--output", out)
        assert rc == 0
        outs.append(np.load(out))
    np.testing.assert_array_equal(outs[0], outs[1])


# ---- output files -----------------------------------------------------------------------------------
@pytest.fixture
def umask():
    def set_(mask):
        os.umask(mask)
    old = os.umask(0o022)
    yield set_
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_write_atomic_honours_the_umask(tmp_path, umask, mask):
    umask(mask)
    write_atomic(tmp_path / "f.bin", b"data")
    assert stat.S_IMODE(os.stat(tmp_path / "f.bin").st_mode) == 0o666 & ~mask
    assert (tmp_path / "f.bin").read_bytes() == b"data"
    assert os.listdir(tmp_path) == ["f.bin"]        # no temporary file left


def test_write_atomic_keeps_a_replaced_files_mode_or_takes_an_explicit_one(tmp_path, umask):
    p = tmp_path / "f.txt"
    p.write_text("old")
    os.chmod(p, 0o640)
    write_atomic(p, "new")
    assert p.read_text() == "new" and stat.S_IMODE(os.stat(p).st_mode) == 0o640
    write_atomic(p, "newer", mode=0o600)
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600


def test_write_atomic_leaves_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    """A failure after the data is written (here: the rename) leaves the old file whole and no
    temporary file behind; so does data that cannot be written at all."""
    p = tmp_path / "f.txt"
    p.write_text("old")

    def fail(*a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        write_atomic(p, b"new" * 1000)
    monkeypatch.undo()
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["f.txt"]
    with pytest.raises(TypeError):
        write_atomic(p, object())
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["f.txt"]


def test_cli_outputs_honour_the_umask(capsys, cpu_model, tmp_path, umask):
    umask(0o027)
    x = np.zeros((1, 4, 4, 4), np.float32)
    np.save(tmp_path / "x.npy", x)
    rc, _, _ = _run(capsys, "run", cpu_model / "m.accm", "--input", tmp_path / "x.npy", "--output",
                    tmp_path / "y.npy", "--profile-json", tmp_path / "p.json")
    assert rc == 0
    for f in ("y.npy", "p.json"):
        assert stat.S_IMODE(os.stat(tmp_path / f).st_mode) == 0o640, f
    rc, _, _ = _run(capsys, "compile", cpu_model / "m.onnx", "--target", "cpu", "-o", tmp_path / "c.accm")
    assert rc == 0 and stat.S_IMODE(os.stat(tmp_path / "c.accm").st_mode) == 0o640


def test_cli_refuses_an_output_that_is_an_input(capsys, cpu_model, tmp_path, monkeypatch):
    shutil.copy(cpu_model / "m.onnx", tmp_path / "m.onnx")
    before = (tmp_path / "m.onnx").read_bytes()
    monkeypatch.chdir(tmp_path)
    _error(capsys, "refusing to overwrite", "compile", "m.onnx", "--target", "cpu", "-o", "m.onnx")
    _error(capsys, "is the same file as the input", "compile", "m.onnx", "--target", "cpu", "-o", "./sub/../m.onnx")
    os.symlink(tmp_path / "m.onnx", tmp_path / "link.onnx")
    _error(capsys, "refusing to overwrite", "compile", "m.onnx", "--target", "cpu", "-o", "link.onnx")
    assert (tmp_path / "m.onnx").read_bytes() == before
    np.save(tmp_path / "x.npy", np.zeros((1, 4, 4, 4), np.float32))
    x_before = (tmp_path / "x.npy").read_bytes()
    _error(capsys, "refusing to overwrite", "run", cpu_model / "m.accm", "--input", "x=x.npy", "--output", "y=x.npy")
    _error(capsys, "refusing to overwrite", "run", cpu_model / "m.accm", "--input", "x.npy", "--output", "x.npy")
    _error(capsys, "refusing to overwrite", "run", cpu_model / "m.accm", "--input", "x.npy",
           "--profile-json", "x.npy")
    assert (tmp_path / "x.npy").read_bytes() == x_before
    _error(capsys, "refusing to overwrite", "run", cpu_model / "m.accm", "--input", "x.npy",
           "--output", cpu_model / "m.accm")
