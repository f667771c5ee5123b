"""accel bisect (flows/bisect.py): a correct model shows no divergence; a broken layer - weights
corrupted in the compiled module (compiler), a driver that corrupts one layer's output
(hardware), a layer the int8 quantizer cannot represent (quantization) - is named as the first
divergence of the right pair, and only of that pair."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from accel.cli import demo_model, main
from compiler.frontend import zoo
from compiler.frontend.zoo import ModelBuilder
from flows.bisect import BisectError, Tolerance, bisect, build_accel, compare_float, parse_executors
from host_runtime.device import _DRIVERS, register_driver
from host_runtime.drivers.fsim import FsimDriver


@pytest.fixture(scope="module")
def demo():
    model = demo_model(0)
    feed = zoo.sample_inputs(model, 5, seed=1)[4]
    return model, feed


@pytest.fixture(scope="module")
def demo_module(demo):
    model, feed = demo
    return build_accel(model, feed, "default")


def _pair(report, key):
    return next(p for p in report.pairs if p["key"] == key)


def test_correct_model_has_no_divergence(demo, tmp_path):
    model, feed = demo
    r = bisect(model, feed, executors="ort,cpu,int8ref,fsim")
    assert not r.diverged, r.table()
    assert [p["key"] for p in r.pairs] == ["ort~cpu", "cpu~int8ref", "int8ref~fsim"]
    assert all(p["compared"] >= 5 for p in r.pairs)
    # every compared row of the integer pair is bit-exact, the float ones close
    assert all(row["pairs"]["int8ref~fsim"]["differ"] == 0 for row in r.rows if "int8ref~fsim" in row["pairs"])
    cos = [row["pairs"]["cpu~int8ref"]["cos"] for row in r.rows if "cpu~int8ref" in row["pairs"]]
    assert min(cos) > 0.99


def test_cli_exit_status_and_json(demo, tmp_path, capsys):
    model, feed = demo
    m, x, j = tmp_path / "m.onnx", tmp_path / "x.npy", tmp_path / "b.json"
    m.write_bytes(model.SerializeToString())
    np.save(x, feed["image"])
    assert main(["-q", "bisect", str(m), "--input", str(x), "--executors", "cpu,int8ref,fsim", "--json", str(j)]) == 0
    out = capsys.readouterr().out
    assert "cpu~int8ref: no divergence" in out and "int8ref~fsim: no divergence" in out
    d = json.loads(j.read_text())
    assert d["diverged"] is False and [p["first"] for p in d["pairs"]] == [None, None]
    assert {r["name"] for r in d["rows"]} >= {"stem", "stem_relu", "classifier"}
    # bad requests: one line, exit 2
    assert main(["bisect", str(m), "--input", str(x), "--executors", "fsim"]) == 2
    assert main(["bisect", str(m), "--input", str(x), "--executors", "ort,nope"]) == 2
    assert main(["bisect", str(m), "--input", str(x), "--tolerance", "cos=1.5"]) == 2
    before = m.read_bytes()
    assert main(["bisect", str(m), "--input", str(x), "--json", str(m)]) == 2   # never over an input
    assert m.read_bytes() == before
    err = capsys.readouterr().err
    assert all(line.startswith("error: ") for line in err.strip().splitlines())   # one line per failure
    assert "at least two" in err and "unknown executor 'nope'" in err and "cos=1.5" in err
    assert "refusing to overwrite" in err


def test_corrupted_weights_named_on_the_compiled_pair(demo, demo_module):
    """A compiler fault: one accelerator layer's weights in the module's DRAM image are wrong."""
    model, feed = demo
    mod = demo_module
    w = next(n for n in mod.graph.nodes if n.name == "block_conv1/wq/packed").value.tobytes()
    saved = list(mod.segments)
    k = next(k for k, (_, data) in enumerate(mod.segments) if w in data)
    addr, data = mod.segments[k]
    bad = bytearray(data)
    i = data.find(w)
    bad[i:i + len(w)] = (np.frombuffer(w, np.int8) // 2).tobytes()   # halve every weight of block_conv1
    mod.segments[k] = (addr, bytes(bad))
    try:
        r = bisect(model, feed, executors="int8ref,fsim", module=mod)
    finally:
        mod.segments[:] = saved
    p = _pair(r, "int8ref~fsim")
    assert r.diverged and p["first"] == "block_relu1", r.table()
    assert "block_conv1" in p["covers"] and "block_conv1" in p["summary"]
    # what came before is still bit-exact
    stem = next(row for row in r.rows if row["name"] == "stem_relu")
    assert stem["pairs"]["int8ref~fsim"]["diverged"] is False


def test_unfused_build_observes_every_layer(demo):
    """Without fusion the conv itself is observed: a fault in its weights is named at the conv."""
    model, feed = demo
    mod = build_accel(model, feed, "default", fuse=False)
    w = next(n for n in mod.graph.nodes if n.name == "down/wq/packed").value.tobytes()
    k = next(k for k, (_, data) in enumerate(mod.segments) if w in data)
    addr, data = mod.segments[k]
    i = data.find(w)
    mod.segments[k] = (addr, data[:i] + (np.frombuffer(w, np.int8) // 3).tobytes() + data[i + len(w):])
    r = bisect(model, feed, executors="int8ref,fsim", module=mod)
    p = _pair(r, "int8ref~fsim")
    assert p["first"] == "down" and p["covers"] == ["down"], r.table()
    assert next(row for row in r.rows if row["name"] == "block_relu2")["pairs"]["int8ref~fsim"]["differ"] == 0


class _Faulty(FsimDriver):
    """fsim that flips one output byte of its third accelerator program (a hardware fault)."""
    fault_at = 2

    def __init__(self, cfg, **kw):
        super().__init__(cfg, **kw)
        self.runs = 0

    def run(self, dram, insn_addr, insn_count):
        r = super().run(dram, insn_addr, insn_count)
        if self.runs == self.fault_at:
            dram[self.target] ^= 0x40
        self.runs += 1
        return r


@pytest.fixture
def faulty_driver():
    """_Faulty as driver 'faulty_fsim_test' for one test (the registry is global)."""
    register_driver("faulty_fsim_test")(_Faulty)
    yield _Faulty
    _DRIVERS.pop("faulty_fsim_test", None)


def test_faulty_driver_named_on_the_hardware_pair(demo, demo_module, faulty_driver):
    model, feed = demo
    mod = demo_module
    out = next(t for t in mod.tensors if t.name == "block_relu2")
    _Faulty.target = out.addr + 5
    try:
        r = bisect(model, feed, executors="int8ref,fsim,faulty_fsim_test", module=mod)
    finally:
        del _Faulty.target
    assert _pair(r, "int8ref~fsim")["first"] is None
    p = _pair(r, "fsim~faulty_fsim_test")
    assert p["first"] == "block_relu2", r.table()
    assert {"block_conv2", "residual"} <= set(p["covers"])
    cell = next(row for row in r.rows if row["name"] == "block_relu2")["pairs"][p["key"]]
    assert cell["differ"] >= 1 and cell["differing"] == ["block_relu2"]


def _outlier_model(seed: int = 0):
    """x -> conv a -> relu -> conv b -> relu -> conv c: channel 0 of a's output is always zero and b
    weighs it by 1000, so b's float output ignores the outlier while the per-tensor int8 weight
    scale it forces rounds every other weight of b to zero."""
    rng = np.random.default_rng(seed)
    c = 16
    inits, nodes, prev = [], [], "x"
    for name in "abc":
        w = (rng.standard_normal((c, c, 3, 3)) * 0.15).astype(np.float32)
        b = (rng.standard_normal(c) * 0.1).astype(np.float32)
        if name == "a":
            w[0] = 0
            b[0] = -1.0
        if name == "b":
            w[:, 0] = 0
            w[0, 0, 1, 1] = 1000.0
        inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
        nodes.append(helper.make_node("Conv", [prev, f"{name}_w", f"{name}_b"], [f"{name}_out"], name=f"conv_{name}",
                                      pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"{name}_out"], [f"{name}_r"], name=f"relu_{name}"))
        prev = f"{name}_r"
    g = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, c, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(m)
    return m, {"x": rng.standard_normal((1, c, 8, 8)).astype(np.float32)}


def test_quantization_damage_named_on_the_float_int8_pair():
    model, feed = _outlier_model()
    r = bisect(model, feed, executors="ort,cpu,int8ref,fsim")
    assert _pair(r, "ort~cpu")["first"] is None
    assert _pair(r, "int8ref~fsim")["first"] is None      # the compiled code does what the int8 graph says
    p = _pair(r, "cpu~int8ref")
    assert p["first"] == "relu_b", r.table()
    assert "conv_b" in p["covers"] and "conv_a" not in p["covers"]


def test_tolerance_and_executor_parsing():
    t = Tolerance.parse("cos=0.9,float_rel=0.01,lsb=0")
    assert (t.quant_cos, t.float_rel, t.lsb, t.float_cos) == (0.9, 0.01, 0.0, 0.9999)
    for bad in ("cos", "speed=1", "rel=x", "float_cos=-1"):
        with pytest.raises(BisectError):
            Tolerance.parse(bad)
    assert parse_executors("fsim,ort,int8ref") == ["ort", "int8ref", "fsim"]
    with pytest.raises(BisectError, match="twice"):
        parse_executors("fsim,fsim")
    # metrics: identical, scaled by two (relative error, not cosine), orthogonal
    x = np.arange(1, 9, dtype=np.float64)
    tol = Tolerance()
    assert not compare_float(x, x, None, "float", False, tol)["diverged"]
    two = compare_float(x, 2 * x, None, "float", False, tol)
    assert two["diverged"] and two["cos"] == 1.0 and two["rel"] == pytest.approx(1.0)
    assert compare_float(x, x[::-1] - 4.5, None, "float", True, tol)["diverged"]
    # a fitted scale absorbs a uniform factor: only the shape of the values counts
    assert not compare_float(x, 3 * x, 0.0, "fitted", True, tol)["diverged"]


def test_folded_batch_norm_is_compared_at_the_batch_norm():
    """A conv whose batch norm is folded into it holds the batch norm's output: that row, not the
    conv's, is compared (against onnxruntime's pre-norm conv output it would look broken)."""
    b = ModelBuilder("conv_bn", 0)
    x = b.input("x", (1, 16, 8, 8))
    y = b.bn(b.conv(x, 16, 16, name="c1"), 16, name="bn1")
    y = b.conv(y, 16, 16, name="c2")
    model = b.build([y])
    feed = zoo.sample_inputs(model, 1, seed=2)[0]
    r = bisect(model, feed, executors="ort,cpu,int8ref")
    assert not r.diverged, r.table()
    rows = {row["name"]: row["pairs"] for row in r.rows}
    assert "ort~cpu" in rows["bn1"] and "ort~cpu" not in rows["c1"]
    assert rows["bn1"]["ort~cpu"]["cos"] > 0.9999


def test_per_channel_steps_over_channels_padded_to_the_block_are_fitted_per_channel():
    """An expand conv read only by a depthwise conv writes a step per channel; with 40 channels its
    multipliers cover 48 (three blocks of 16). Its tensor is still fitted channel by channel, so a
    correct build shows no divergence there (it read as cosine 0.83 on MobileNetV3's 72 channels)."""
    b = ModelBuilder("expand_dw", 3)
    x = b.input("x", (1, 8, 10, 10))
    y = b.op("Relu", [b.bn(b.conv(x, 8, 40, k=1, bias=False, name="expand"), 40)], name="relu_e")
    y = b.op("Relu", [b.bn(b.conv(y, 40, 40, k=3, group=40, bias=False, name="dw"), 40)], name="relu_dw")
    model = b.build([b.conv(y, 40, 8, k=1, name="project")])
    feed = zoo.sample_inputs(model, 1, seed=4)[0]
    r = bisect(model, feed, executors="ort,int8ref", config="default")
    rows = {row["name"]: row["pairs"] for row in r.rows}
    assert rows["relu_e"]["ort~int8ref"]["cos"] > 0.99, r.table()
    assert not r.diverged, r.table()


def test_per_channel_int8_is_fitted_channel_by_channel():
    """A tensor written with a step per channel (per-channel multipliers) is scaled channel by
    channel: one fitted scale would make it look diverged; a corrupted channel still diverges."""
    rng = np.random.default_rng(0)
    ref = np.abs(rng.normal(size=(1, 4, 6, 6))) * np.array([1.0, 8.0, 0.1, 3.0]).reshape(1, -1, 1, 1)
    steps = np.array([2.0 ** -7, 2.0 ** -4, 2.0 ** -10, 2.0 ** -5]).reshape(1, -1, 1, 1)
    q = np.clip(np.rint(ref / steps), -127, 127)
    tol = Tolerance()
    assert not compare_float(ref, q, 0.0, "fitted_channels", True, tol)["diverged"]
    assert compare_float(ref, q, 0.0, "fitted", True, tol)["diverged"]
    bad = q.copy()
    bad[0, 1] = rng.permutation(bad[0, 1].ravel()).reshape(6, 6)
    assert compare_float(ref, bad, 0.0, "fitted_channels", True, tol)["diverged"]
