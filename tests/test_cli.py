"""The `accel` command line: every subcommand, its errors (one line, exit 2) and round trips."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from randprog import random_program

import host_runtime.matmul as mm
from accel.cli import COMMANDS, main
from accel.isa import PRESETS, Program
from compiler.frontend import zoo
from compiler.module import CompiledModule
from host_runtime import Device
from sim.reference import run_reference

TINY = PRESETS["tiny"]


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def _error(capsys, match, *argv):
    rc, out, err = _run(capsys, *argv)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], err
    return lines[0]


@pytest.mark.parametrize("argv", [[], *([name] for name in COMMANDS), ["config", "show"], ["config", "validate"]])
def test_cli_help_on_every_subcommand(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv + ["--help"])
    assert e.value.code == 0
    assert "usage: accel" in capsys.readouterr().out


def test_cli_help_loads_no_subcommand_package():
    """`accel --help` builds no subcommand's arguments, so it imports none of the packages they use
    (build_parser fills only the parser argv names); flows.inputs, numpy-only, is the CLI's own."""
    code = ("import sys\nfrom accel.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in {'compiler', 'host_runtime', 'flows', 'sim', "
            "'amaranth', 'onnx', 'dask', 'matplotlib', 'llvmlite'} and m not in {'flows', 'flows.errors', "
            "'flows.inputs'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("launcher", ["module", "console-script"])
def test_cli_entry_points(launcher):
    if launcher == "module":
        cmd = [sys.executable, "-m", "accel.cli"]
    else:
        exe = shutil.which("accel")
        if exe is None:
            pytest.skip("the `accel` console script is not installed (pip install -e .)")
        cmd = [exe]
    r = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and all(name in r.stdout for name in COMMANDS)


def test_cli_config_show_and_validate(capsys, tmp_path):
    rc, out, _ = _run(capsys, "config", "show", "--config", "tiny")
    d = json.loads(out)
    assert rc == 0 and d["config"]["block_in"] == 4 and d["derived"]["inp_depth"] == TINY.inp_depth
    good = tmp_path / "c.json"
    TINY.save(good)
    rc, out, _ = _run(capsys, "config", "validate", str(good))
    assert rc == 0 and TINY.digest() in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**TINY.to_dict(), "block_in": 3}))
    _error(capsys, "block_in=3", "config", "validate", str(bad))
    _error(capsys, "neither a preset", "config", "show", "--config", "nonesuch")


def test_cli_run_random_program_matches_reference(capsys, tmp_path):
    prog, regions = random_program(TINY, 3)
    path = tmp_path / "p.accp"
    prog.save(path)
    name = next(iter(regions))
    dump = tmp_path / "dram.bin"
    rc, out, _ = _run(capsys, "run", str(path), "--driver", "fsim", "--dump", name, "--dump-dram", str(dump))
    assert rc == 0 and f"{name} =" in out and '"FINISH": 1' in out
    want = run_reference(TINY, prog.insns, prog.dram_image())
    assert np.array_equal(np.fromfile(dump, np.uint8), want)
    _error(capsys, "symbols are", "run", str(path), "--dump", "nope")
    _error(capsys, "unknown driver 'warp'", "run", str(path), "--driver", "warp")


def test_cli_run_check_races(capsys, tmp_path, monkeypatch):
    """--check-races: a program whose GEMM reads an input LOAD it never waited for fails naming both;
    the same program with the token runs."""
    paths = {}
    for ordered in (False, True):
        s = Device(TINY, dram_bytes=1 << 16).stream()
        x = s.device.memory.alloc(64, align=64)
        s.load_2d("inp", 0, x, x_size=1)
        if ordered:
            s.dep_push("load", "compute")
            s.dep_pop("load", "compute")
        s.push_gemm(s.kernel("k", lambda k: k.push(0, 0, 0)))
        paths[ordered] = tmp_path / f"p{int(ordered)}.accp"
        s.program().save(paths[ordered])
    _error(capsys, "race on inp buffer entry 0", "run", str(paths[False]), "--check-races")
    rc, out, _ = _run(capsys, "run", str(paths[True]), "--check-races")
    assert rc == 0 and '"GEMM": 1' in out
    monkeypatch.delenv("ACCEL_CHECK_RACES", raising=False)   # the tests turn the check on everywhere
    rc, _, _ = _run(capsys, "run", str(paths[False]))   # unchecked, fsim's interleaving runs it
    assert rc == 0
    _error(capsys, "needs --driver fsim", "run", str(paths[True]), "--check-races", "--driver", "tsim")


def test_cli_disasm_then_asm_round_trips(capsys, tmp_path):
    prog, _ = random_program(TINY, 5)
    src = tmp_path / "p.accp"
    prog.save(src)
    rc, out, _ = _run(capsys, "disasm", str(src))
    assert rc == 0 and "    0: " in out and out.rstrip().splitlines()[-1].split(": ", 1)[1].startswith("finish")
    rc, text, _ = _run(capsys, "disasm", "--plain", str(src))
    (tmp_path / "p.s").write_text(text)
    data = []
    for i, (addr, seg) in enumerate(prog.segments):
        f = tmp_path / f"seg{i}.bin"
        f.write_bytes(seg)
        data += ["--data", f"{addr:#x}={f}"]
    syms = [a for n, s in prog.symbols.items() for a in ("--symbol", f"{n}={s.addr:#x}:{s.dtype}:{s.shape[0]}")]
    out_path = tmp_path / "q.accp"
    rc, out, _ = _run(capsys, "asm", str(tmp_path / "p.s"), "-o", str(out_path), "--config", "tiny",
                      "--insn-addr", hex(prog.insn_addr), "--dram-bytes", str(prog.dram_bytes), *data, *syms)
    assert rc == 0, out
    again = Program.load(out_path)
    assert again.insns == prog.insns and again.symbols == prog.symbols
    assert np.array_equal(again.dram_image(), prog.dram_image())


def test_cli_asm_errors(capsys, tmp_path):
    s = tmp_path / "a.s"
    s.write_text("gemm\nfrobnicate 3\nfinish\n")
    _error(capsys, "line 2", "asm", str(s), "-o", str(tmp_path / "a.accp"))
    assert not (tmp_path / "a.accp").exists()
    s.write_text("load inp sram_base=5000\nfinish\n")
    _error(capsys, "sram_base=5000", "asm", str(s), "-o", str(tmp_path / "a.accp"), "--config", "tiny")
    s.write_text("finish\n")
    blob = tmp_path / "d.bin"
    blob.write_bytes(bytes(64))
    _error(capsys, "overlaps", "asm", str(s), "-o", str(tmp_path / "a.accp"), "--data", f"0={blob}",
           "--data", f"32={blob}")
    _error(capsys, "cannot read", "asm", str(tmp_path / "missing.s"), "-o", str(tmp_path / "a.accp"))
    _error(capsys, "NAME=ADDR:DTYPE:SHAPE", "asm", str(s), "-o", str(tmp_path / "a.accp"), "--symbol", "x=1")
    rc, _, _ = _run(capsys, "asm", str(s), "-o", str(tmp_path / "f.accp"))
    assert rc == 0 and len(Program.load(tmp_path / "f.accp").insns) == 1


def test_cli_disasm_rejects_non_program(capsys, tmp_path):
    f = tmp_path / "x.accp"
    f.write_bytes(b"not a program at all")
    _error(capsys, "bad magic", "disasm", str(f))


def test_cli_demo_checks_against_numpy(capsys, monkeypatch):
    rc, out, _ = _run(capsys, "demo", "--config", "tiny", "--m", "5", "--k", "9", "--n", "7")
    assert rc == 0 and "OK: matches numpy" in out and "instructions:" in out and "GEMM" in out
    real = mm.matmul_reference
    monkeypatch.setattr(mm, "matmul_reference", lambda *a, **k: real(*a, **k) ^ 1)
    rc, out, err = _run(capsys, "demo", "--config", "tiny", "--m", "3", "--k", "4", "--n", "5")
    assert rc == 1 and "MISMATCH" in err
    _error(capsys, "--n must be >= 1", "demo", "--n", "0")
    _error(capsys, "unknown driver", "demo", "--driver", "nope")


def test_cli_compile_op_prints_loop_nest_and_instructions(capsys, tmp_path):
    code, out, _ = _run(capsys, "compile-op", "conv2d", "--te", "--config", "tiny", "--c", "8", "--o", "8", "--h", "6",
                     "--w", "6", "--relu", "--max-insns", "0")
    assert code == 0  # --te: the tensor-expression path, printing the lowered loop IR
    assert "attr(gemm, 'accel.uop_kernel'" in out and "accel.load_2d('inp'" in out and "OK: bit-exact" in out
    code, out, _ = _run(capsys, "compile-op", "conv2d", "--config", "tiny", "--c", "8", "--o", "8",
                     "--h", "6", "--w", "6", "--relu", "--max-insns", "0")
    assert code == 0   # the default: the emitter networks use, its loop nest
    assert "for ic0 in range(0, 2, 1)" in out and "gemm: for oh in range(h_a)" in out
    assert "load inp y_size=6 x_size=6 x_stride=6 y_pad0=1 y_pad1=1 x_pad0=1 x_pad1=1" in out
    assert "finish pop_next" in out and "OK: bit-exact" in out
    code, out, _ = _run(capsys, "compile-op", "dense", "--config", "tiny", "--rows", "5", "--c", "9", "--o", "6")
    assert code == 0 and "OK: bit-exact" in out and "// dense: dense rows=5 K=9 -> M=6" in out
    code, out, _ = _run(capsys, "compile-op", "dense", "--te", "--config", "tiny", "--rows", "5", "--c", "9", "--o", "6")
    assert code == 0 and "OK: bit-exact" in out
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps({"layers": {"L1": [6, 6, 8, 8, 3, 3, 1, 1, 1, 1]}}))
    code, out, _ = _run(capsys, "compile-op", "conv2d", "--template", "--config", "tiny", "--layer", "L1",
                        "--workloads", str(wl))
    assert code == 0 and "// L1: N=1 C=8 H=6 W=6 -> O=8" in out
    _error(capsys, "--layer 'C99' is not in", "compile-op", "conv2d", "--layer", "C99", "--workloads", str(wl))
    _error(capsys, "cannot be tiled", "compile-op", "conv2d", "--config", "tiny", "--k", "15", "--pad", "7",
           "--h", "8", "--w", "8", "--c", "4", "--o", "4")


# ---- compiled models: compile, run, demo ------------------------------------------------------------
def test_cli_compile_then_run_model_by_name_and_npz(capsys, tmp_path):
    m = zoo.residual_block()
    (tmp_path / "m.onnx").write_bytes(m.SerializeToString())
    feeds = zoo.sample_inputs(m, 5, seed=4)
    np.savez(tmp_path / "calib.npz", x=np.stack([f["x"] for f in feeds[:4]]))
    np.save(tmp_path / "x.npy", feeds[4]["x"])
    rc, out, _ = _run(capsys, "compile", str(tmp_path / "m.onnx"), "--target", "accel", "--config", "tiny",
                      "-o", str(tmp_path / "m.accm"), "--calibration", str(tmp_path / "calib.npz"))
    assert rc == 0 and "offloaded" in out and (tmp_path / "m.accm").exists()
    rc, out, _ = _run(capsys, "run", str(tmp_path / "m.accm"), "--input", str(tmp_path / "x.npy"),
                      "--output", str(tmp_path / "y.npy"), "--driver", "fsim", "--profile",
                      "--profile-json", str(tmp_path / "p.json"))
    assert rc == 0 and "qconv2d" in out and "accel" in out and "total:" in out
    want = next(iter(CompiledModule.load(tmp_path / "m.accm").run(feeds[4])[0].values()))
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)
    prof = json.loads((tmp_path / "p.json").read_text())
    assert prof["driver"] == "fsim" and any(r["target"] == "accel" and r["insns"] for r in prof["steps"])
    np.savez(tmp_path / "in.npz", x=feeds[4]["x"])
    rc, out, _ = _run(capsys, "run", str(tmp_path / "m.accm"), "--input", str(tmp_path / "in.npz"),
                      "--output", str(tmp_path / "out.npz"))
    with np.load(tmp_path / "out.npz") as z:
        np.testing.assert_array_equal(z[z.files[0]], want)
    _error(capsys, "no input 'nope'", "run", str(tmp_path / "m.accm"), "--input", f"nope={tmp_path / 'x.npy'}")
    _error(capsys, "give the model's inputs", "run", str(tmp_path / "m.accm"))
    # --tune LOG: same bytes out, the log written, the choices in the module's meta
    rc, out, _ = _run(capsys, "compile", str(tmp_path / "m.onnx"), "--target", "accel", "--config", "tiny",
                      "-o", str(tmp_path / "t.accm"), "--calibration", str(tmp_path / "calib.npz"),
                      "--tune", str(tmp_path / "tuning.json"))
    tuned = CompiledModule.load(tmp_path / "t.accm")
    assert rc == 0 and (tmp_path / "tuning.json").exists() and tuned.meta["tuning"]
    np.testing.assert_array_equal(next(iter(tuned.run(feeds[4])[0].values())), want)
    _error(capsys, "unknown driver", "run", str(tmp_path / "m.accm"), "--input", "random", "--driver", "warp")
    rc, out, _ = _run(capsys, "compile", str(tmp_path / "m.onnx"), "--target", "cpu", "-o", str(tmp_path / "c.accm"))
    assert rc == 0
    rc, out, _ = _run(capsys, "run", str(tmp_path / "c.accm"), "--input", f"x={tmp_path / 'x.npy'}", "--profile")
    assert rc == 0 and "llvm" in out and "on the CPU" in out
    _error(capsys, "cannot read", "compile", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "z.accm"))
    assert not (tmp_path / "z.accm").exists()


def test_cli_demo_runs_residual_cnn_end_to_end(capsys):
    rc, out, _ = _run(capsys, "demo")
    assert rc == 0 and "OK: bit-exact against the int8 reference" in out
    assert "qconv2d" in out and "onnxruntime" in out and "total:" in out
