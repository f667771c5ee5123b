"""User-facing views of the `accel` command line: cycle-accurate views of compiled models (trace,
timeline, counters per layer), `compile --explain` and the reasons in `run --profile`, progress
bars (on a terminal only, never with -q), and `build`/`synth` refusing designs that do not fit."""
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from accel import progress
from accel.cli import main
from accel.hw.boards import board, part
from accel.hw.fpga import synth
from accel.hw.fpga.estimate import estimate
from accel.isa import preset
from compiler.frontend import zoo
from compiler.module import CompiledModule
from sim.verilator.build import tools_available

STALE = "warning: the RTL changed since the estimator was calibrated"   # a note, not the verdict


def _run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def _error(capsys, match, *argv, status=2):
    rc, out, err = _run(capsys, *argv)
    assert rc == status, (out, err)
    lines = [x for x in err.strip().splitlines() if not x.startswith(STALE)]
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err
    return lines[0]


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    """The residual block compiled for the tiny config (three accelerator layers, CPU steps around)."""
    d = tmp_path_factory.mktemp("residual")
    m = zoo.residual_block()
    (d / "m.onnx").write_bytes(m.SerializeToString())
    feeds = zoo.sample_inputs(m, 3, seed=2)
    np.savez(d / "cal.npz", x=np.stack([f["x"] for f in feeds[:2]]))
    np.save(d / "x.npy", feeds[2]["x"])
    assert main(["compile", str(d / "m.onnx"), "--config", "tiny", "-o", str(d / "m.accm"),
                 "--calibration", str(d / "cal.npz")]) == 0
    return d


# ---- compiled models on the timing drivers -------------------------------------------------
def _check_model_views(capsys, d: Path, driver: str):
    mod = CompiledModule.load(d / "m.accm")
    accel_steps = [s.name for s in mod.steps if s.kind == "accel"]
    all_steps = [s.name for s in mod.steps]
    assert len(accel_steps) == 3
    rc, out, _ = _run(capsys, "run", d / "m.accm", "--input", d / "x.npy", "--driver", driver, "--trace",
                      d / "t.json", "--timeline", d / "t.png", "--counters", "--profile-json", d / "p.json",
                      "--output", d / "y.npy")
    assert rc == 0
    prof = {r["name"]: r for r in json.loads((d / "p.json").read_text())["steps"]}
    # the printed table: a row per accelerator layer (its cycles as the profile measured them), the total
    for name in accel_steps:
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert str(prof[name]["cycles"]) in row.split()
    total_cycles = sum(prof[n]["cycles"] for n in accel_steps)
    total_row = next(line for line in out.splitlines() if line.startswith("total "))
    assert str(total_cycles) in total_row.split() and f"cycles {total_cycles} " in out
    # the trace: every step a named span on the layers track, back to back; instruction slices per stage
    trace = json.loads((d / "t.json").read_text())
    ev = trace["traceEvents"]
    layers_tid = next(e["tid"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"
                      and e["args"]["name"] == "layers")
    spans = [e for e in ev if e["ph"] == "X" and e["pid"] == 1 and e["tid"] == layers_tid]
    assert [e["name"] for e in spans] == all_steps
    for a, b in zip(spans, spans[1:]):
        assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
    for e in spans:
        if e["name"] in accel_steps:
            assert e["args"]["counters"]["cycles"] == prof[e["name"]]["cycles"]
            assert e["dur"] == pytest.approx(prof[e["name"]]["cycles"] / mod.config.clock_mhz)
    insn_slices = [e for e in ev if e["ph"] == "X" and e["pid"] == 2 and "insn" in e["args"]]
    assert {e["args"]["layer"] for e in insn_slices} == set(accel_steps)
    for e in insn_slices:   # each slice inside its layer's span
        span = next(s for s in spans if s["name"] == e["args"]["layer"])
        assert span["ts"] - 1e-6 <= e["ts"] and e["ts"] + e["dur"] <= span["ts"] + span["dur"] + 1e-6
    meta = trace["metadata"]["counters"]
    assert meta["total"]["cycles"] == total_cycles and [x["name"] for x in meta["layers"]] == accel_steps
    assert (d / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --counters FILE: the same numbers as JSON, per layer and in total
    rc, out, _ = _run(capsys, "run", d / "m.accm", "--input", d / "x.npy", "--driver", driver, "--counters",
                      d / "c.json")
    c = json.loads((d / "c.json").read_text())
    assert rc == 0 and c["schema"] == "accel-model-counters/1" and c["driver"] == driver
    assert [x["name"] for x in c["layers"]] == accel_steps
    assert [x["start_cycle"] for x in c["layers"]] == [0, prof[accel_steps[0]]["cycles"],
                                                       prof[accel_steps[0]]["cycles"] + prof[accel_steps[1]]["cycles"]]
    for key in ("cycles", "gemm_uops", "alu_uops", "macs"):
        assert c["total"][key] == sum(x["counters"][key] for x in c["layers"])
    for s in ("load", "compute", "store"):
        assert c["total"]["stages"][s]["busy"] == sum(x["counters"]["stages"][s]["busy"] for x in c["layers"])
    assert {x["name"] for x in c["cpu_steps"]} == set(all_steps) - set(accel_steps)
    return np.load(d / "y.npy")


def test_cli_run_model_on_tsim_shows_every_layer_with_counters(capsys, residual):
    y = _check_model_views(capsys, residual, "tsim")
    rc, _, _ = _run(capsys, "run", residual / "m.accm", "--input", residual / "x.npy", "--output",
                    residual / "f.npy")
    np.testing.assert_array_equal(y, np.load(residual / "f.npy"))   # the views do not change the data


@pytest.mark.rtl
def test_cli_run_model_on_rtl_shows_every_layer_with_counters(capsys, residual):
    if tools_available() is not None:
        pytest.skip(f"rtl driver: {tools_available()}")
    _check_model_views(capsys, residual, "rtl")


def test_cli_run_model_views_need_a_timing_driver_and_accelerator_layers(capsys, residual, tmp_path):
    _error(capsys, "need a timing driver (tsim or rtl), not 'fsim'", "run", residual / "m.accm", "--input",
           "random", "--counters")
    assert main(["compile", str(residual / "m.onnx"), "--target", "cpu", "-o", str(tmp_path / "c.accm")]) == 0
    capsys.readouterr()
    _error(capsys, "this model has none", "run", tmp_path / "c.accm", "--input", "random", "--driver", "tsim",
           "--trace", tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


# ---- --explain and the reasons at run time ------------------------------------------------
def _explain_model():
    """One node for each reason a node stays off the accelerator of the tiny config (block 4)."""
    b = zoo.ModelBuilder("explain", 3)
    x = b.input("x", (1, 1, 12, 12))
    y = b.op("Relu", [b.conv(x, 1, 8, name="c_thin")], name="r_thin")            # 1 channel < block_in 4
    y = b.op("Relu", [b.conv(y, 8, 16, name="c_ok")], name="r_ok")               # offloaded
    y = b.op("MaxPool", [y], name="pool", kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1])
    y = b.op("Relu", [b.conv(y, 16, 16, group=2, name="c_group")], name="r_group")   # two GEMMs
    y = b.op("Relu", [b.conv(y, 16, 16, group=16, name="c_dw")], name="r_dw")
    y = b.op("Relu", [b.conv(y, 16, 16, k=11, pad=5, name="c_big")], name="r_big")  # no tiling fits
    y = b.op("Flatten", [b.op("GlobalAveragePool", [y], name="gap")], name="flat", axis=1)
    y = b.op("Gemm", [y, b.weight((64, 16)), b.init(np.zeros(64, np.float32))], name="fc", transB=1)
    y = b.op("Softmax", [y], name="sm", axis=-1)
    return b.build([y])


def _rows(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    head = next(k for k, line in enumerate(lines) if line.startswith("node ") and "why" in line)
    rows = {}
    for line in lines[head + 1:]:
        if not line or line.startswith(" ") or " nodes: " in line:
            break
        parts = line.split()
        rows[parts[0]] = parts[1:]
    return rows


def test_cli_compile_explain_gives_each_node_its_target_and_reason(capsys, tmp_path):
    m = _explain_model()
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    rc, out, _ = _run(capsys, "compile", tmp_path / "m.onnx", "--config", "tiny", "-o", tmp_path / "m.accm",
                      "--explain")
    assert rc == 0
    rows = _rows(out)
    want = {"c_thin": ("cpu", "shape", "wastes"), "c_ok": ("accel", "offload", ""),
            "r_ok": ("accel", "fused", ""), "pool": ("accel", "fused", ""),   # ALU max pooling
            "c_group": ("accel", "offload", ""),   # GEMMs on channel slices
            # a diagonal GEMM wastes 15/16, yet beats the board's A9 here (the host wins others:
            # tests/compiler/accel/test_depthwise_cost.py)
            "c_dw": ("accel", "offload", ""),
            "c_big": ("cpu", "lowering", "lowering failed"), "sm": ("cpu", "float", "float32")}
    for name, (target, kind, words) in want.items():
        assert name in rows, (name, out)
        r = rows[name]
        assert target in r and kind in r and words in " ".join(r), (name, r)
    mod = CompiledModule.load(tmp_path / "m.accm")
    # every op of the optimized graph has a row; ONNX nodes folded away are listed as such
    assert {r["name"] for r in mod.meta["partition"]} <= set(rows)
    assert all(r[3] == "folded" for name, r in rows.items() if name not in {d["name"] for d in mod.meta["partition"]})
    assert "would waste most of the GEMM core on" in out   # the legend of the kinds shown
    # run --profile: the same reasons next to the steps
    rc, out, _ = _run(capsys, "run", tmp_path / "m.accm", "--input", "random", "--profile")
    assert rc == 0
    prof = {line.split()[0]: line for line in out.splitlines() if line and not line.startswith(("output", "total"))}
    assert "wastes" in prof["c_thin"] and "wastes" not in prof["c_dw"]
    assert "accelerator lowering failed" in prof["c_big"] and "float32" in prof["sm"]
    assert "why on the CPU" in out
    # --force Conv=cpu: the offloaded conv is forced off, and says so
    rc, out, _ = _run(capsys, "compile", tmp_path / "m.onnx", "--config", "tiny", "-o", tmp_path / "f.accm",
                      "--explain", "--force", "Conv=cpu")
    rows = _rows(out)
    assert rc == 0 and rows["c_ok"][2:4] == ["cpu", "forced"] and "forced to the CPU" in " ".join(rows["c_ok"])
    # a batch-1 classifier on the default config's 256-MAC core: slower there by the cost estimate
    (tmp_path / "cls.onnx").write_bytes(zoo.conv_bn_relu_pool().SerializeToString())
    rc, out, _ = _run(capsys, "compile", tmp_path / "cls.onnx", "-o", tmp_path / "cls.accm", "--explain")
    rows = _rows(out)
    assert rc == 0 and rows["fc"][2:4] == ["cpu", "cost"] and "memory-bound" in " ".join(rows["fc"])
    assert rows["conv2"][2:4] == ["accel", "offload"]


def test_cli_compile_explain_on_the_cpu_target(capsys, residual, tmp_path):
    rc, out, _ = _run(capsys, "compile", residual / "m.onnx", "--target", "cpu", "-o", tmp_path / "c.accm",
                      "--explain")
    rows = _rows(out)
    assert rc == 0 and {"conv1", "conv2", "conv3", "residual"} <= set(rows)
    assert all(r[2:4] == ["cpu", "target"] for name, r in rows.items() if name not in ("bn1", "bn2"))
    assert rows["bn1"][1:3] == ["-", "-"] and "folded" in rows["bn1"]


# ---- --calibration's shape ------------------------------------------------------------------
def test_cli_calibration_help_and_shape_check(capsys, residual, tmp_path):
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "of shape (S, *input shape): S samples stacked on a new first axis" in text
    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 16, 8, 8), np.float32))   # no sample axis
    _error(capsys, "input 'x' must have shape (S, 1, 16, 8, 8) (S samples of shape [1, 16, 8, 8]), got "
           "[1, 16, 8, 8]", "compile", residual / "m.onnx", "--config", "tiny", "-o", tmp_path / "b.accm",
           "--calibration", tmp_path / "bad.npz")
    np.savez(tmp_path / "other.npz", y=np.zeros((2, 1, 16, 8, 8), np.float32))
    _error(capsys, "no samples for input(s) x (arrays in the file: y)", "compile", residual / "m.onnx", "--config",
           "tiny", "-o", tmp_path / "b.accm", "--calibration", tmp_path / "other.npz")
    np.save(tmp_path / "good.npy", np.zeros((2, 1, 16, 8, 8), np.float32))
    rc, _, _ = _run(capsys, "compile", residual / "m.onnx", "--config", "tiny", "-o", tmp_path / "g.accm",
                    "--calibration", tmp_path / "good.npy")
    assert rc == 0 and not (tmp_path / "b.accm").exists()


# ---- progress on a terminal only ------------------------------------------------------------
class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_cli_progress_bars_on_a_terminal_only_and_never_with_quiet(capsys, residual, tmp_path, monkeypatch):
    args = ["compile", str(residual / "m.onnx"), "--config", "tiny", "-o", str(tmp_path / "p.accm"), "--calibration",
            str(residual / "cal.npz")]
    fake = _Tty()
    monkeypatch.setattr(sys, "stderr", fake)
    assert main(args) == 0
    shown = fake.getvalue()
    assert "compile lower" in shown and "compile optimize" in shown and "%|" in shown
    fake.seek(0)
    fake.truncate()
    assert main(["-q"] + args) == 0 and main(["--quiet", "run", str(tmp_path / "p.accm"), "--input", "random"]) == 0
    assert fake.getvalue() == ""
    monkeypatch.undo()
    capsys.readouterr()
    assert main(args) == 0   # stderr is not a terminal under capsys: no bar
    assert capsys.readouterr().err == ""


def test_progress_tasks_report_to_the_installed_reporter_only():
    seen = []

    class Rec:
        def __init__(self, name, total):
            seen.append(("open", name, total))

        def update(self, k, total, detail):
            seen.append(("update", k, total, detail))

        def close(self):
            seen.append(("close",))
    with progress.task("quiet step", 2) as t:   # nothing installed: no reporter, no output
        t.update(1, detail="x")
    assert seen == [] and not progress.showing()
    with progress.reporting(Rec):
        with progress.task("synthesis", None) as t:
            t.update(detail="SYNTH_XILINX")
            t.update(3, 4)
    assert seen == [("open", "synthesis", None), ("update", None, None, "SYNTH_XILINX"), ("update", 3, 4, None),
                    ("close",)]
    assert not progress.showing()
    out = _Tty()
    with progress.reporting(progress.terminal_reporter(out)):
        with progress.task("place and route", 2) as t:
            t.update(1, detail="Placing")
    assert "place and route" in out.getvalue() and "Placing" in out.getvalue()
    assert progress.terminal_reporter(io.StringIO()) is None


def test_synth_progress_follows_the_tool_log(tmp_path):
    """While yosys or nextpnr runs, its task shows the pass or phase its log has reached."""
    details = []

    class Rec:
        def __init__(self, name, total):
            pass

        def update(self, k, total, detail):
            details.append(detail)

        def close(self):
            pass
    log_path = tmp_path / "yosys.log"
    log_path.write_text("")
    with progress.reporting(Rec), progress.task("synthesis") as t:
        with synth._following(t, log_path, synth._LOG_PROGRESS["yosys"]):
            with open(log_path, "a") as f:
                f.write("1. Executing Verilog-2005 frontend: accel_top.v\n-- noise --\n2.3. Executing SYNTH_XILINX pass.\n")
            deadline = time.monotonic() + 10
            while "SYNTH_XILINX" not in details and time.monotonic() < deadline:
                time.sleep(0.1)
    assert details[-1] == "SYNTH_XILINX"
    m = synth._LOG_PROGRESS["nextpnr-ecp5"].match("Info: Routing globals...")
    assert m and m.group(1).startswith("Routing")
    details.clear()
    with synth._following(None, log_path, synth._LOG_PROGRESS["yosys"]):   # nothing shown: nothing read
        pass
    assert details == []


# ---- designs that do not fit ----------------------------------------------------------------
def _standin_files(tmp_path, cfg):
    sys.path.insert(0, str(Path(__file__).resolve().parent / "fpga"))
    try:
        from standin import standin_verilog  # noqa: PLC0415 - tests/fpga joins sys.path just above
    finally:
        sys.path.pop(0)
    text, desc = standin_verilog(preset(cfg) if isinstance(cfg, str) else cfg)
    (tmp_path / "core.v").write_text(text)
    (tmp_path / "core.json").write_text(json.dumps(desc))
    return ["--verilog", str(tmp_path / "core.v"), "--description", str(tmp_path / "core.json")]


def test_cli_build_refuses_a_design_that_does_not_fit_unless_forced(capsys, tmp_path):
    p = board("pynq-z1").part
    assert estimate(preset("default"), p.family, p).fit["fits"]   # the default config fits the xc7z020
    unpacked = preset("default").replace(dsp_packing=False)   # one DSP per int8 product: too many DSPs
    fit = estimate(unpacked, p.family, p).fit
    over = {k: r for k, r in fit["resources"].items() if r["used"] > r["available"]}
    assert over and not fit["fits"]
    cfg_file = tmp_path / "unpacked.json"
    cfg_file.write_text(json.dumps(unpacked.to_dict()))
    rtl = _standin_files(tmp_path, unpacked)
    line = _error(capsys, "does not fit xc7z020", "build", "--board", "pynq-z1", "--config", cfg_file, "-o",
                  tmp_path / "out", *rtl, status=1)
    for k, r in over.items():
        assert f"{k} {r['used']:g} of {r['available']} ({r['used'] - r['available']:g} over" in line
    assert "--force" in line and not (tmp_path / "out").exists()
    rc, out, err = _run(capsys, "build", "--board", "pynq-z1", "--config", cfg_file, "-o", tmp_path / "out",
                        *rtl, "--force")
    assert rc == 0 and (tmp_path / "out" / "build.tcl").exists() and "DOES NOT FIT" in out
    assert "warning: does not fit" in err and "(--force)" in err
    rtl = _standin_files(tmp_path, "tiny")
    rc, out, err = _run(capsys, "build", "--board", "pynq-z1", "--config", "tiny", "-o", tmp_path / "tiny", *rtl)
    assert rc == 0 and "does not fit" not in err and (tmp_path / "tiny" / "build.tcl").exists()


def test_cli_synth_exits_1_naming_each_resource_over_the_part(capsys, tmp_path, monkeypatch):
    p = part("xc7z020")

    def fake_synthesize(rtl, family, out, *, part=None, config=None, **kw):
        used = {"lut": 60000.0, "ff": 1000, "dsp": 230, "bram": 12.5}
        rep = synth.SynthReport(family=family, part=part, config=config, top=rtl.top, utilization=used, cells={},
                                modules={}, fit=synth.fit_check(used, part), tools={}, out_dir=Path(out))
        Path(out).mkdir(parents=True, exist_ok=True)
        synth.write_report(rep)
        return rep
    monkeypatch.setattr(synth, "synthesize", fake_synthesize)
    rtl = _standin_files(tmp_path, "tiny")
    args = ["synth", "--config", "tiny", "--family", "xc7", "--part", "xc7z020", "-o", tmp_path / "s", *rtl]
    line = _error(capsys, f"does not fit {p.name}", *args, status=1)
    assert "lut 60000 of 53200 (6800 over, 113%)" in line and "dsp 230 of 220 (10 over, 105%)" in line
    assert "bram" not in line and "ff " not in line and (tmp_path / "s" / "report.json").exists()
    rc, out, err = _run(capsys, *args, "--force")
    assert rc == 0 and "DOES NOT FIT" in out and "warning: does not fit" in err
    assert preset("tiny")   # the config itself is fine: the verdict is the report's
