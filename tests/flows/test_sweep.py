"""accel sweep (flows/): the space file, auto sizes, results files and resume, failed points, the
Pareto front, and the Dask runs: a two-worker LocalCluster and a separately started scheduler
with `dask worker` processes. The model is the zoo's residual block on small configs."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import types
from pathlib import Path

import onnx
import pytest
from distributed import Client

import accel.hw.fpga.rtl as rtl_mod
import accel.hw.fpga.synth as synth_mod
from accel.cli import main
from accel.hw.boards import part
from accel.isa import PRESETS
from compiler.frontend import zoo
from flows import pareto
from flows.errors import SweepError
from flows.point import ENERGY_PJ, energy_pj, resources
from flows.space import load_space, model_layers, parse_space, resolve_point
from flows.store import columns, read_csv
from flows.sweep import Plan, kit_version, load_models, parse_strategy, plan_points, run_sweep

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("models") / "res.onnx"
    p.write_bytes(zoo.residual_block().SerializeToString())
    return p


@pytest.fixture(autouse=True)
def _fast_workers(monkeypatch):
    # worker processes inherit the environment: the race checker (tests/conftest.py) slows every run
    monkeypatch.setenv("ACCEL_CHECK_RACES", "0")


KIT = "0.0.0+test"   # fixed kit identity: the real one hashes sources others may be editing


def space(params: dict, **kw):
    return parse_space({"base": "tiny", "params": params, **kw})


# ---- the space file ------------------------------------------------------------------------------
def test_space_file_ranges_and_constraints(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('base = "tiny"\nconstraints = ["block_out >= block_in"]\n[params]\n'
                 'block_in = {range = [4, 16], pow2 = true}\nblock_out = [4, 8]\n'
                 'clock_mhz = {range = [100, 200], step = 50}\nacc_buff_bytes = ["auto", 4096]\n')
    s = load_space(f)
    assert s.params["block_in"] == [4, 8, 16]
    assert s.params["clock_mhz"] == [100.0, 150.0, 200.0]
    assert s.size == 3 * 2 * 3 * 2
    j = tmp_path / "s.json"
    j.write_text(json.dumps({"params": {"block_in": [8, 16]}}))
    assert load_space(j).params == {"block_in": [8, 16]}
    assert len(s.sample(5, seed=1)) == 5 and len({json.dumps(p) for p in s.sample(5, seed=1)}) == 5
    assert len(s.sample(1000)) == s.size


def test_params_at_top_level_and_range_aliases():
    s = parse_space({"base": "tiny", "block_in": [4, 8], "params": {"block_out": {"min": 4, "max": 16, "pow2": True}},
                     "compile": {"shapes": {"x": "1x3x8x8"}}})
    assert s.params == {"block_in": [4, 8], "block_out": [4, 8, 16]} and s.shapes == {"x": [1, 3, 8, 8]}
    assert parse_space({"clock_mhz": {"start": 100, "stop": 150, "step": 25}}).params["clock_mhz"] == [100, 125, 150]
    with pytest.raises(SweepError, match="both at the top level"):
        parse_space({"block_in": [4], "params": {"block_in": [8]}})
    with pytest.raises(SweepError, match="compile.shapes.x"):
        parse_space({"block_in": [4], "compile": {"shapes": {"x": "1xAx3"}}})


def test_documented_spaces_parse():
    doc = (ROOT / "docs" / "sweep.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", doc, re.S)
    assert blocks
    for b in blocks:
        s = parse_space(tomllib.loads(b))
        assert s.size > 1 and s.constraints and s.energy and s.force and s.shapes
    ex = load_space(ROOT / "docs" / "sweep_example.toml")
    assert ex.size == 24 and ex.params["inp_buff_bytes"] == ["auto"]


@pytest.mark.parametrize("data, words", [
    ({"params": {"blok_in": [4]}}, ["params.blok_in", "block_in"]),
    ({"params": {"block_in": "auto"}}, ["params.block_in", "auto"]),
    ({"params": {"block_in": [4.5]}}, ["params.block_in", "integer"]),
    ({"params": {"block_in": {"range": [8, 4]}}}, ["params.block_in", "lo <= hi"]),
    ({"params": {"block_in": [4]}, "constraints": ["blockin > 2"]}, ["unknown name 'blockin'"]),
    ({"params": {"block_in": [4]}, "constraints": ["__import__('os')"]}, ["constraint"]),
    ({"params": {"block_in": [4]}, "energy": {"mac": 1}}, ["energy.mac", "mac_pj"]),
    ({"params": {"block_in": [4]}, "sweep": 1}, ["unknown key", "sweep"]),
    ({"params": {}}, ["[params]"]),
    ({"base": "huge", "params": {"block_in": [4]}}, ["base", "huge"]),
])
def test_space_errors_name_the_key(data, words):
    with pytest.raises(SweepError) as e:
        parse_space(data)
    for w in words:
        assert w in str(e.value)


def test_auto_sizes_follow_blocks_and_layers(model):
    layers = model_layers(model.read_bytes())
    assert layers and all(ly.kernel in (1, 9) for ly in layers)
    s = space({"block_in": [4, 8], "block_out": [4, 16], "inp_buff_bytes": "auto", "wgt_buff_bytes": "auto",
               "acc_buff_bytes": "auto"})
    for values in s.grid():
        cfg = resolve_point(s, values, layers)
        assert cfg.out_depth == cfg.acc_depth                     # the output buffer mirrors the accumulator
        for m in ("inp", "wgt", "acc"):
            depth = getattr(cfg, f"{m}_depth")
            assert depth & (depth - 1) == 0 and depth <= getattr(s.base, f"{m}_depth")
    small = resolve_point(s, {"block_in": 8, "block_out": 16, "wgt_buff_bytes": "auto"}, layers)
    # wider blocks: fewer, larger weight entries; the bytes follow the entry size
    assert small.wgt_elem_bytes == 128 and small.wgt_buff_bytes == small.wgt_depth * 128
    # a fixed out_buff_bytes that does not mirror the accumulator is an error naming the point and key
    with pytest.raises(SweepError, match=r"block_out=16.*out_buff_bytes"):
        resolve_point(s, {"block_out": 16, "out_buff_bytes": 512, "acc_buff_bytes": 4096}, layers)


def test_constraints_exclude_before_validation(model):
    s = space({"block_in": [4, 8], "block_out": [4, 8], "acc_buff_bytes": [4096, 3000]},
              constraints=["acc_buff_bytes != 3000 or block_in > 4", "acc_depth >= 64"])
    plan = Plan(s, load_models([model]), "xc7z020", None, "x", "estimate", "tsim", KIT)
    points, skipped = plan_points(plan, list(s.grid()))
    # block_in=4 with the invalid 3000 is excluded by the constraint, not recorded as failed;
    # block_in=8 with it fails; acc_depth (derived) excludes 4096 / 32 bytes = 128 >= 64 nothing
    assert skipped == 2 and len(points) == 6
    failed = [p for p in points if p.config is None]
    assert len(failed) == 2 and all(p.values["block_in"] == 8 and "acc_buff_bytes" in p.error for p in failed)
    tight = space({"block_out": [4, 16]}, constraints=["acc_depth >= 128"])
    plan = Plan(tight, plan.models, "xc7z020", None, "x", "estimate", "tsim", KIT)
    points, skipped = plan_points(plan, list(tight.grid()))
    assert [p.values["block_out"] for p in points] == [4] and skipped == 1


def test_energy_table_scales_with_counters():
    cfg = PRESETS["tiny"]
    c = {"gemm_uops": 100, "alu_uops": 10, "bytes_read": 1000, "bytes_written": 100}
    e1 = energy_pj(cfg, c, 1e-6, ENERGY_PJ)
    e2 = energy_pj(cfg, {k: 2 * v for k, v in c.items()}, 1e-6, ENERGY_PJ)
    assert e1["mac"] == 100 * 16 * ENERGY_PJ["mac_pj"]
    assert e1["dram"] == 1100 * ENERGY_PJ["dram_pj_per_byte"]
    assert all(abs(e2[k] - 2 * e1[k]) < 1e-9 for k in e1 if k != "static")
    big = cfg.replace(wgt_buff_bytes=cfg.wgt_buff_bytes * 4)
    assert energy_pj(big, c, 1e-6, ENERGY_PJ)["sram_gemm"] > e1["sram_gemm"]


def test_kit_version_names_the_package():
    v = kit_version()
    assert v.startswith("0.") and "+" in v


def test_yosys_mode_takes_synthesis_figures(monkeypatch, tmp_path):
    """--synth yosys: utilization and fit from the synthesis report, Fmax from routing when there is one."""

    calls = []

    def fake_synth(rtl, family, out_dir, **kw):
        calls.append((family, Path(out_dir), kw["part"].name, kw["pnr"]))
        util = {"lut": 123, "ff": 45, "dsp": 99, "bram": 2.0}
        return types.SimpleNamespace(utilization=util, fit=synth_mod.fit_check(util, kw["part"]),
                                     timing={"fmax_mhz": 77.5, "source": "nextpnr"} if kw["pnr"] else None)
    monkeypatch.setattr(rtl_mod, "rtl_for_config", lambda cfg: "verilog")
    monkeypatch.setattr(synth_mod, "synthesize", fake_synth)
    cfg = PRESETS["tiny"]
    r = resources(cfg, part("LFE5U-25F"), "yosys", str(tmp_path / "s"), None)
    assert calls == [("ecp5", tmp_path / "s", "LFE5U-25F-6BG381C", True)]
    assert (r["lut"], r["dsp"], r["fmax_mhz"], r["fits"], r["limiting"]) == (123, 99, 77.5, False, "dsp")
    r = resources(cfg, part("xc7z020"), "yosys", str(tmp_path / "x"), 50.0)
    assert r["lut"] == 123 and r["fits"] is False          # fits the part, but 100 MHz > the board's 50
    assert r["fmax_mhz"] is not None and "yosys sta" in r["fmax_basis"]   # no Xilinx routing: the estimate's


def test_strategy_and_pareto_front():
    assert parse_strategy("grid") == ("grid", None) and parse_strategy("optuna:7") == ("optuna", 7)
    for bad in ("grid:3", "random", "random:0", "optuna:x", "annealing:4"):
        with pytest.raises(SweepError, match="--strategy"):
            parse_strategy(bad)
    recs = [{"point": "a", "status": "ok", "latency_ms": 1.0, "lut": 100, "dsp": 10, "fits": True, "accel_macs": 50},
            {"point": "b", "status": "ok", "latency_ms": 2.0, "lut": 50, "dsp": 5, "fits": True, "accel_macs": 50},
            {"point": "c", "status": "ok", "latency_ms": 2.5, "lut": 120, "dsp": 12, "fits": True, "accel_macs": 50},
            {"point": "d", "status": "ok", "latency_ms": 0.1, "lut": 10, "dsp": 1, "fits": False, "accel_macs": 50},
            {"point": "e", "status": "ok", "latency_ms": 0.2, "lut": 10, "dsp": 1, "fits": True, "accel_macs": 10},
            {"point": "f", "status": "failed", "error": "x"}]
    assert [r["point"] for r in pareto.front(recs)] == ["a", "b"]
    assert pareto.best(recs)["point"] == "a"
    assert [line.split()[-1] for line in pareto.table(recs, []).splitlines()[1:]] == ["a", "b"]
    cpu_only = [dict(r, accel_macs=0, latency_ms=0.0) for r in recs[:3]]
    assert pareto.best(cpu_only) is None and "no point ran a layer on the accelerator" in pareto.table(cpu_only, [])


# ---- runs ---------------------------------------------------------------------------------------
def _check_files(out: Path, n: int, params: list[str]):
    rows = read_csv(out / "results.csv")
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(rows) == n and len(lines) >= n
    assert list(rows[0]) == columns(params, ["res"])
    return rows, [json.loads(x) for x in lines]


def test_local_cluster_two_workers_then_resume(model, tmp_path):
    s = space({"block_out": [4, 8], "acc_buff_bytes": [4096, 3000]})
    out = tmp_path / "sweep"
    seen = []
    res = run_sweep(s, [model], out, workers=2, memory_limit="1GiB", on_record=seen.append, kit=KIT)
    assert res.evaluated == 4 and res.reused == 0 and len(seen) == 4
    rows, recs = _check_files(out, 4, ["block_out", "acc_buff_bytes"])
    by = {(r["block_out"], r["acc_buff_bytes"]): r for r in rows}
    for bo in ("4", "8"):
        ok = by[(bo, "4096")]
        assert ok["status"] == "ok", ok["error"]
        assert int(ok["cycles"]) == int(ok["cycles:res"]) > 0
        assert float(ok["latency_ms"]) == pytest.approx(int(ok["cycles"]) / 100e3)
        assert int(ok["lut"]) > 0 and ok["fits"] == "true" and float(ok["energy_uj"]) > 0
        bad = by[(bo, "3000")]
        assert bad["status"] == "failed" and "acc_buff_bytes" in bad["error"] and bad["cycles"] == ""
    # a wider GEMM core takes fewer cycles and more LUTs
    assert int(by[("8", "4096")]["cycles"]) < int(by[("4", "4096")]["cycles"])
    assert int(by[("8", "4096")]["lut"]) > int(by[("4", "4096")]["lut"])
    assert {r["kit"] for r in recs} == {KIT}
    assert (out / "pareto.png").stat().st_size > 1000
    assert res.best is not None and res.best["status"] == "ok"

    # rerun into the same folder: nothing runs; a grown space runs only the new points
    again = run_sweep(s, [model], out, workers=0, plot=False, kit=KIT)
    assert again.evaluated == 0 and again.reused == 4
    _check_files(out, 4, ["block_out", "acc_buff_bytes"])
    grown = space({"block_out": [4, 8, 16], "acc_buff_bytes": [4096, 3000]})
    more = run_sweep(grown, [model], out, workers=0, plot=False, kit=KIT)
    assert more.evaluated == 2 and more.reused == 4
    rows, _ = _check_files(out, 6, ["block_out", "acc_buff_bytes"])
    assert sorted(r["point"] for r in rows) == sorted(r["point"] for r in more.records)


def test_interrupt_leaves_valid_files_and_resumes(model, tmp_path):
    s = space({"block_out": [4, 8, 16]})
    out = tmp_path / "sweep"

    def stop_after_first(rec):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(s, [model], out, workers=0, on_record=stop_after_first, kit=KIT)
    rows, _ = _check_files(out, 1, ["block_out"])
    # a line torn by a kill is dropped on the next start
    with open(out / "results.jsonl", "a") as f:
        f.write('{"point": "torn", "par')
    res = run_sweep(s, [model], out, workers=0, plot=False, kit=KIT)
    assert res.reused == 1 and res.evaluated == 2 and res.failed == 0
    _check_files(out, 3, ["block_out"])
    assert all(json.loads(x) for x in (out / "results.jsonl").read_text().splitlines())


def test_key_depends_on_energy_table_and_config(model, tmp_path):
    out = tmp_path / "sweep"
    a = run_sweep(space({"block_out": [4]}), [model], out, workers=0, synth="none", plot=False, kit=KIT)
    b = run_sweep(space({"block_out": [4]}, energy={"dram_pj_per_byte": 10.0}), [model], out, workers=0,
                  synth="none", plot=False, kit=KIT)
    assert run_sweep(space({"block_out": [4]}), [model], out, workers=0, synth="none", plot=False,
                     kit=KIT + "1").evaluated == 1          # another kit version: run again
    ra, rb = a.records[0], b.records[0]
    assert ra["point"] != rb["point"] and b.evaluated == 1
    assert ra["cycles"] == rb["cycles"] and rb["energy_uj"] < ra["energy_uj"]
    assert ra["lut"] is None and ra["fits"] is None      # --synth none


def test_failed_model_is_recorded_and_the_sweep_goes_on(model, tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(SweepError, match="broken.onnx"):
        run_sweep(space({"block_out": [4]}), [broken], tmp_path / "x", workers=0)
    with pytest.raises(SweepError, match="--board"):
        run_sweep(space({"block_out": [4]}), [model], tmp_path / "x", workers=0, board="pynq-z9")


def test_symbolic_input_needs_a_shape(tmp_path):
    m = zoo.residual_block()
    x = m.graph.input[0]
    x.type.tensor_type.shape.dim[0].dim_param = "N"
    f = tmp_path / "sym.onnx"
    onnx.save(m, f)
    with pytest.raises(SweepError, match=r"input '.+' has a symbolic dimension 'N'.*--shape"):
        run_sweep(space({"block_out": [4]}), [f], tmp_path / "o", workers=0)
    dims = [d.dim_value for d in x.type.tensor_type.shape.dim]
    dims[0] = 1
    res = run_sweep(space({"block_out": [4]}), [f], tmp_path / "o", workers=0, plot=False, kit=KIT,
                    shapes={x.name: dims, "unused": [1]})
    assert res.records[0]["status"] == "ok", res.records[0]["error"]


def test_random_strategy_runs_n_distinct_points(model, tmp_path):
    s = space({"block_out": [4, 8, 16], "acc_buff_bytes": [4096, 3000]})
    res = run_sweep(s, [model], tmp_path / "r", workers=0, strategy="random:2", seed=3, synth="none", plot=False,
                    kit=KIT)
    assert res.evaluated == 2 and len({r["point"] for r in res.records}) == 2
    assert len(read_csv(tmp_path / "r" / "results.csv")) == 2


def test_optuna_strategy(model, tmp_path):
    pytest.importorskip("optuna")
    s = space({"block_out": [4, 8], "block_in": [4]})
    res = run_sweep(s, [model], tmp_path / "o", workers=0, strategy="optuna:3", plot=False)
    assert 1 <= len(res.records) <= 2 and all(r["status"] == "ok" for r in res.records)
    assert res.best is not None
    assert len(read_csv(tmp_path / "o" / "results.csv")) == len(res.records)


def test_cli_sweep(model, tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text('base = "tiny"\n[params]\nblock_out = [4]\n')
    assert main(["sweep", str(f), "--model", str(model), "-o", str(tmp_path / "o"), "--workers", "0"]) == 0
    text = capsys.readouterr().out
    assert "fastest that fits: block_out=4" in text and "latency_ms" in text
    f.write_text('[params]\nblock_out = [4]\nbogus = 1\n')
    assert main(["sweep", str(f), "--model", str(model), "-o", str(tmp_path / "o")]) == 2
    assert "params.bogus" in capsys.readouterr().err


# ---- a separately started cluster ------------------------------------------------------------------
def _dask(*args) -> list[str]:
    """`dask scheduler ...` / `dask worker ...`, with this interpreter."""
    return [sys.executable, "-m", "dask", *args]


def test_external_scheduler_and_workers(model, tmp_path):
    sched_file = tmp_path / "scheduler.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               ACCEL_CHECK_RACES="0")
    procs = []

    def start(cmd):
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                      stderr=open(tmp_path / f"log{len(procs)}.txt", "w"), start_new_session=True))
    try:
        start(_dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                    "--scheduler-file", str(sched_file)))
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            assert procs[0].poll() is None, (tmp_path / "log0.txt").read_text()[-2000:]
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for _ in range(2):
            start(_dask("worker", "--scheduler-file", str(sched_file), "--host", "127.0.0.1", "--nthreads", "1",
                        "--nworkers", "1", "--no-dashboard", "--memory-limit", "1GiB"))
        with Client(address, timeout="30s") as c:
            c.wait_for_workers(2, timeout=60)
        res = run_sweep(space({"block_out": [4, 8]}), [model], tmp_path / "ext", scheduler=address, plot=False)
        assert res.evaluated == 2 and all(r["status"] == "ok" for r in res.records), res.records
        assert len({r["host"] for r in res.records}) >= 1
        _check_files(tmp_path / "ext", 2, ["block_out"])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
