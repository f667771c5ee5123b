"""bench/e2e.py: a quick run writes the JSON and prints the table; bad flags name themselves."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from benchmod import load_bench

from compiler import build_model
from compiler.frontend.zoo import sample_inputs
from host_runtime.executor import Executor


@pytest.fixture(scope="module")
def e2e():
    return load_bench("e2e")


def test_quick_run_writes_json_and_table(e2e, tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert e2e.main(["--nets", "mlp", "--quick", "--repeat", "2", "--no-tsim", "-o", str(out)]) == 0
    res = json.loads(out.read_text())
    (net,) = res["nets"]
    assert net["net"] == "mlp" and not [k for k in net if k.endswith("_error")]
    for cond in ("cpu_quiet", "cpu_busy"):
        assert net[cond]["ratio"] > 0 and len(net[cond]["runs"]) == 1
        assert net[cond]["runs"][0]["runtime"].keys() >= {"parallel_launches", "backed_off_launches"}
    assert net["cpu_max_rel_err"] < 1e-4 and 0.0 <= net["offload_fraction"] <= 1.0 and net["accel_host_s"] >= 0
    assert res["parallel_runtime"]["adaptive"] in (0, 1, 2)
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:4] == ["net", "cpu", "ms", "ort"] and "\nmlp " in table


def test_a_model_file_of_your_own_is_measured_the_same_way(e2e, tmp_path):
    """A held-out model: any .onnx path with static shapes takes the nets' measurements."""
    path = tmp_path / "own.onnx"
    onnx.save(e2e.load_net("mlp"), str(path))
    out = tmp_path / "e2e.json"
    assert e2e.main(["--nets", str(path), "--quick", "--repeat", "2", "--no-tsim", "--no-busy", "-o", str(out)]) == 0
    (net,) = json.loads(out.read_text())["nets"]
    assert net["net"] == str(path) and not [k for k in net if k.endswith("_error")]
    assert net["cpu_quiet"]["ratio"] > 0 and net["offload_fraction"] == 1.0


def test_table_has_a_column_per_dram_preset(e2e):
    res = {"nets": [{"net": "a", "cpu_quiet": {"latency_s": 1e-3, "ort_latency_s": 2e-3, "ratio": 0.5},
                     "offload_fraction": 0.5, "accel": {"vs_ideal": 1.2, "resident": {"warm_vs_ideal": 1.1}},
                     "dram": {"zcu104": {"vs_ideal": 1.5}}, "accel_host_s": 1e-3},
                    {"net": "b", "cpu_error": "x"}]}
    lines = e2e.table(res).splitlines()
    assert "zcu104" in lines[0] and "warm" in lines[0]
    assert lines[1].split() == ["a", "1.000", "2.000", "0.50", "-", "50.0%", "1.200", "1.100", "1.500", "1.00"]
    assert lines[2].split()[0] == "b" and set(lines[2].split()[1:]) == {"-"}


@pytest.mark.parametrize("argv,what", [(["--nets", "nosuchnet"], "--nets nosuchnet"),
                                       (["--dram", "nosuchboard"], "--dram nosuchboard"),
                                       (["--repeat", "0"], "--repeat"),
                                       (["--light", "nosuchmodel", "--nets", ""], "--light nosuchmodel"),
                                       (["--nets", "/no/such/model.onnx"], "--nets /no/such/model.onnx: no such")])
def test_bad_flags_are_refused_by_name(e2e, argv, what, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        e2e.main(argv + ["-o", str(tmp_path / "x.json")])
    msg = str(e.value) if not isinstance(e.value.code, int) else capsys.readouterr().err
    assert what in msg
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("net, size", [("unet", {"size": 32}), ("yolo", {"size": 64}), ("vit", {"size": 48}),
                                       ("lstm", {"steps": 5}), ("gru", {"steps": 5}),
                                       ("aspp", {"size": 19, "c": 32})])
def test_model_class_nets_compile_and_match_onnxruntime(e2e, net, size):
    """The U-Net, YOLO-, ViT-style, recurrent and ASPP nets (smaller than the benchmark's) on the
    cpu target, with no numpy step: transposed convs, nearest resizes, 255-channel heads, row
    softmax, stacked bidirectional LSTM and GRU layers, dilated convs."""
    m = e2e.NETS[net](**size)
    feed = sample_inputs(m)[0]
    refs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
    mod = build_model(m, target="cpu")
    assert mod.count("numpy") == 0
    with Executor(mod) as ex:
        for got, ref in zip(ex.run(feed).values(), refs):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
