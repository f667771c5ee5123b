"""Loading ONNX files the kit did not write: external data stays inside the model's directory and
is size-checked, ONNX's full checker speaks first (one line naming the model), an initializer
that a graph input also names is a default (constant unless asked for at run time), and no
mutation of a model's bytes gives anything but the frontend's own error."""
import hashlib
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from compiler.errors import CompilerError
from compiler.frontend import ConversionError, ModelLoadError, UnsupportedOpError, from_onnx, load_model, zoo
from compiler.graph import run


def _matmul_model(w: np.ndarray, ir_version: int = 8, w_as_input: bool = False):
    """y = x @ w + b: w is an initializer (also listed as a graph input when w_as_input)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, w.shape[0]])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, w.shape[1]])
    inputs = [x] + ([helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape))] if w_as_input else [])
    if ir_version < 4:    # IR 3 lists every initializer among the inputs
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [w.shape[1]]))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
             helper.make_node("Add", ["xw", "b"], ["y"], name="add")]
    inits = [numpy_helper.from_array(w.astype(np.float32), "w"),
             numpy_helper.from_array(np.arange(w.shape[1], dtype=np.float32), "b")]
    m = helper.make_model(helper.make_graph(nodes, "mm", inputs, [y], inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = ir_version
    return m


W = np.arange(48, dtype=np.float32).reshape(8, 6) / 10
X = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)


def _save_external(m, path, location="weights.bin"):
    """Save m with every initializer in one external file `location` beside it."""
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)


def _set_location(path, **fields):
    """Rewrite the external-data fields of initializer 'w' in the saved model at path."""
    m = onnx.load_model(str(path), load_external_data=False)
    t = next(t for t in m.graph.initializer if t.name == "w")
    info = {e.key: e.value for e in t.external_data}
    info.update({k: str(v) for k, v in fields.items()})
    del t.external_data[:]
    for k, v in info.items():
        t.external_data.add(key=k, value=v)
    onnx.save_model(m, str(path))


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


# ---- external data ----------------------------------------------------------------------------------
def test_external_data_is_read_beside_the_model_not_from_the_working_directory(tmp_path, monkeypatch):
    d = tmp_path / "model"
    d.mkdir()
    _save_external(_matmul_model(W), d / "m.onnx")
    decoy = tmp_path / "cwd"
    decoy.mkdir()   # a file of the same name in the working directory must not be used
    (decoy / "weights.bin").write_bytes(np.full(1000, 7, np.float32).tobytes())
    monkeypatch.chdir(decoy)
    got = run(from_onnx(d / "m.onnx"), {"x": X})[0]
    np.testing.assert_allclose(got, X @ W + np.arange(6), rtol=1e-6)
    # a relative path to the model works the same
    monkeypatch.chdir(tmp_path)
    np.testing.assert_allclose(run(from_onnx("model/m.onnx"), {"x": X})[0], got)


def test_external_data_of_bytes_or_proto_needs_base_dir(tmp_path):
    _save_external(_matmul_model(W), tmp_path / "m.onnx")
    data = (tmp_path / "m.onnx").read_bytes()
    with pytest.raises(ModelLoadError, match="tensor '(w|b)' keeps its data in an external file"):
        from_onnx(data)
    proto = onnx.load_model(str(tmp_path / "m.onnx"), load_external_data=False)
    before = proto.SerializeToString()
    got = run(from_onnx(proto, base_dir=tmp_path), {"x": X})[0]
    np.testing.assert_allclose(got, X @ W + np.arange(6), rtol=1e-6)
    assert proto.SerializeToString() == before      # the caller's proto is not filled in


@pytest.mark.parametrize("location, message", [
    ("/etc/passwd", "absolute path"),
    ("../outside.bin", r"leaves the model's directory \('\.\.'\)"),
    ("sub/../../outside.bin", r"leaves the model's directory"),
    ("C:\\weights.bin", "absolute path"),
    ("\\\\server\\share\\w.bin", "absolute path"),
    ("missing.bin", "cannot read 'missing.bin'"),
    ("", "no file location"),
])
def test_external_data_location_must_stay_inside_the_model_directory(tmp_path, location, message):
    d = tmp_path / "model"
    d.mkdir()
    (tmp_path / "outside.bin").write_bytes(W.tobytes())
    _save_external(_matmul_model(W), d / "m.onnx")
    _set_location(d / "m.onnx", location=location)
    with pytest.raises(ModelLoadError, match=message) as e:
        from_onnx(d / "m.onnx")
    assert "m.onnx" in str(e.value) and "tensor 'w'" in str(e.value) and "\n" not in str(e.value)


def test_external_data_symlink_out_of_the_directory_is_refused(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (tmp_path / "secret.bin").write_bytes(W.tobytes())
    _save_external(_matmul_model(W), d / "m.onnx")
    os.symlink(tmp_path / "secret.bin", d / "link.bin")
    _set_location(d / "m.onnx", location="link.bin", offset=0, length=W.nbytes)
    with pytest.raises(ModelLoadError, match="outside the model's directory"):
        from_onnx(d / "m.onnx")
    os.symlink(d / "weights.bin", d / "inside.bin")      # a link that stays inside is fine
    _set_location(d / "m.onnx", location="inside.bin")
    from_onnx(d / "m.onnx")


def test_external_data_fifo_or_directory_is_refused_without_hanging(tmp_path):
    _save_external(_matmul_model(W), tmp_path / "m.onnx")
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "dir").mkdir()
    for loc in ("pipe", "dir"):
        _set_location(tmp_path / "m.onnx", location=loc)
        with pytest.raises(ModelLoadError, match=f"'{loc}'"):
            from_onnx(tmp_path / "m.onnx")


@pytest.mark.parametrize("fields, message", [
    ({"offset": 10 ** 9}, "beyond the end of 'weights.bin'"),
    ({"length": 10 ** 9}, "beyond the end"),
    ({"length": 4}, r"4 bytes in 'weights.bin', but dims \[8, 6\] of FLOAT need 192"),
    ({"offset": -4}, "negative offset"),
    ({"offset": "12abc"}, "not integers"),
    ({"checksum": "0" * 40}, "SHA-1 checksum"),
])
def test_external_data_offsets_and_sizes_are_checked_against_the_file(tmp_path, fields, message):
    _save_external(_matmul_model(W), tmp_path / "m.onnx")
    _set_location(tmp_path / "m.onnx", **fields)
    with pytest.raises(ModelLoadError, match=message):
        from_onnx(tmp_path / "m.onnx")


def test_external_data_in_a_constant_node_and_with_a_correct_checksum(tmp_path):
    """Tensors in node attributes (Constant's value) are resolved too; a matching SHA-1 passes."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])
    const = helper.make_node("Constant", [], ["w"], name="wconst", value=numpy_helper.from_array(W, "wv"))
    m = helper.make_model(helper.make_graph([const, helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                                            "c", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    t = m.graph.node[0].attribute[0].t
    (tmp_path / "c.bin").write_bytes(b"\0" * 16 + W.tobytes())
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "c.bin"), ("offset", "16"), ("length", str(W.nbytes)),
                 ("checksum", hashlib.sha1(W.tobytes()).hexdigest())):
        t.external_data.add(key=k, value=v)
    onnx.save_model(m, str(tmp_path / "c.onnx"))
    np.testing.assert_allclose(run(from_onnx(tmp_path / "c.onnx"), {"x": X})[0], X @ W, rtol=1e-6)


# ---- the checker ------------------------------------------------------------------------------------
def test_checker_message_is_shown_on_one_line_naming_the_model(tmp_path):
    m = _matmul_model(W)
    m.graph.node[0].input.append("b")          # MatMul with three inputs: the checker says so
    onnx.save_model(m, str(tmp_path / "bad.onnx"))
    with pytest.raises(ModelLoadError) as e:
        from_onnx(tmp_path / "bad.onnx")
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'bad.onnx'}: malformed ONNX model") and "ONNX checker:" in msg
    assert "MatMul" in msg and "\n" not in msg


def test_an_output_declared_without_a_shape_is_accepted_as_onnxruntime_accepts_it():
    """onnx's checker wants every graph output's shape field; shape inference supplies it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 13)])
    xv = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    expected = ort.InferenceSession(m.SerializeToString()).run(None, {"x": xv})[0]
    np.testing.assert_array_equal(run(from_onnx(m), {"x": xv})[0], expected)


def test_full_checker_catches_what_only_shape_inference_sees(tmp_path):
    """full_check: a declared output shape that contradicts the inferred one is refused."""
    m = _matmul_model(W)
    m.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 7     # inferred: 6
    onnx.checker.check_model(m)                                        # the plain check passes
    with pytest.raises(ModelLoadError, match="ONNX checker: .*(7|6)"):
        load_model(m.SerializeToString())


def test_unknown_domain_still_lists_unsupported_ops_not_the_checker():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    m = helper.make_model(helper.make_graph([helper.make_node("Mystery", ["x"], ["y"], name="n", domain="com.x")],
                                            "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]),
                          opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError, match="com.x.Mystery"):
        from_onnx(m)


# ---- inputs that an initializer also names ----------------------------------------------------------
@pytest.mark.parametrize("ir_version", [3, 8])
def test_initializer_named_by_an_input_is_a_constant_default(ir_version):
    m = _matmul_model(W, ir_version=ir_version, w_as_input=True)
    g = from_onnx(m)
    assert [i.name for i in g.inputs] == ["x"]
    np.testing.assert_allclose(run(g, {"x": X})[0], _ort(m, {"x": X}), rtol=1e-6)


def test_initializer_named_by_an_input_can_be_fed_at_run_time_when_asked():
    m = _matmul_model(W, w_as_input=True)
    g = from_onnx(m, runtime_inputs=["w"])
    assert [i.name for i in g.inputs] == ["x", "w"]
    w2 = -W[::-1].copy()
    np.testing.assert_allclose(run(g, {"x": X, "w": w2})[0], _ort(m, {"x": X, "w": w2}), rtol=1e-6)
    with pytest.raises(ConversionError, match="runtime_inputs 'b': not graph inputs"):
        from_onnx(m, runtime_inputs=["b"])


# ---- fuzz: mutated bytes load or fail with the frontend's error ------------------------------------
_SEED = _matmul_model(W[:4, :3]).SerializeToString()


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.lists(st.tuples(st.integers(0, len(_SEED) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(0, len(_SEED)))
def test_fuzz_mutated_model_bytes_load_or_raise_the_kits_error(edits, cut):
    data = bytearray(_SEED)
    for pos, val in edits:
        data[pos] = val
    data = bytes(data[:cut] if cut > 8 else data)
    try:
        g = from_onnx(data)
    except CompilerError:
        return
    assert g.outputs      # it loaded: a graph with outputs


def _conv_seed():
    return zoo.conv_bn_relu_pool()


_FIELD_VALUES = [-1, 0, 1, 3, 7, 10 ** 6, 2 ** 40]


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["dims", "dtype", "raw", "attr", "input", "op", "ir", "opset"]),
                          st.integers(0, 1000), st.sampled_from(_FIELD_VALUES)), min_size=1, max_size=3))
def test_fuzz_crafted_model_fields_load_or_raise_the_kits_error(edits):
    """Field-level edits a crafted file can make (bad dims, dtypes, short data, attribute values,
    dangling inputs, unknown op types, IR/opset versions): only the kit's errors come out."""
    m = _conv_seed()
    g = m.graph
    for kind, k, v in edits:
        if kind in ("dims", "dtype", "raw") and g.initializer:
            t = g.initializer[k % len(g.initializer)]
            if kind == "dims" and t.dims:
                t.dims[k % len(t.dims)] = v
            elif kind == "dtype":
                t.data_type = abs(v) % 30
            elif kind == "raw":
                t.raw_data = t.raw_data[:abs(v) % (len(t.raw_data) + 1)]
        elif kind == "attr":
            n = g.node[k % len(g.node)]
            for a in n.attribute:
                if a.ints:
                    a.ints[k % len(a.ints)] = v
                elif a.type == onnx.AttributeProto.INT:
                    a.i = v
        elif kind == "input":
            n = g.node[k % len(g.node)]
            if n.input:
                n.input[k % len(n.input)] = ["", "nowhere", g.node[0].output[0]][k % 3]
        elif kind == "op":
            g.node[k % len(g.node)].op_type = ["Relu", "Conv", "Gemm", "MaxPool", "Reshape", "NoSuchOp"][k % 6]
        elif kind == "ir":
            m.ir_version = abs(v) % 12
        else:
            m.opset_import[0].version = abs(v) % 25
    try:
        g = from_onnx(m)
    except CompilerError:
        return
    assert g.outputs
