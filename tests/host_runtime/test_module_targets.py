"""A module file names its target; loading resolves the name in the one target registry
(host_runtime.targets) and never imports what the file names. Crafted headers of a module built
for the toy plug-in target (tests/fixtures/toy_target) are refused, one line naming the field."""
import hashlib
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.frontend.zoo import ModelBuilder
from compiler.graph_build import build_model
from compiler.targets import unregister_target
from host_runtime.executor import FORMAT_VERSION, MAGIC, Executor, ModuleFormatError, ModuleImage
from host_runtime.targets import (
    RuntimeTarget,
    TargetError,
    register_runtime_target,
    resolve_target,
    unregister_runtime_target,
)

TOY_PACKAGE = Path(__file__).resolve().parents[1] / "fixtures" / "toy_target"


def split(data: bytes):
    hlen = struct.unpack("<I", data[12:16])[0]
    return json.loads(data[48:48 + hlen]), data[48 + hlen:]


def seal(h: dict, payload: bytes) -> bytes:
    """A file whose hashes all match: the header as given, the blobs re-hashed from `payload`."""
    for b in h["blobs"]:
        b["sha256"] = hashlib.sha256(payload[b["offset"]:b["offset"] + b["size"]]).hexdigest()
    hj = json.dumps(h).encode()
    return MAGIC + struct.pack("<II", FORMAT_VERSION, len(hj)) + hashlib.sha256(hj).digest() + hj + payload


@pytest.fixture(scope="module")
def toy_file():
    """(file bytes, input) of a model built for the toy target, registered from its package."""
    sys.path.insert(0, str(TOY_PACKAGE))
    try:
        import kit_toy_target  # noqa: PLC0415 - the fixture package is importable only once on sys.path
    finally:
        sys.path.remove(str(TOY_PACKAGE))
    kit_toy_target.register()
    b = ModelBuilder("toy_net", seed=3)
    x = b.input("x", (2, 8))
    h = b.op("Relu", [b.op("MatMul", [x, b.weight((8, 16))], name="mm")], name="act")
    m = b.build([b.op("Sigmoid", [b.op("Add", [h, h], name="sum")], name="out")])
    data = build_model(m, target="toy", fuse=False).to_bytes()
    yield data, np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    unregister_target("toy")


def _step(h, name):
    return next(s for s in h["steps"] if s["name"] == name)


EVIL = "evil_target_mod"


@pytest.fixture
def evil(tmp_path, monkeypatch):
    """A module on sys.path that leaves a mark when imported: no crafted file may import it."""
    mark = tmp_path / "imported"
    (tmp_path / f"{EVIL}.py").write_text(f"open({str(mark)!r}, 'w').write('x')\ndef run(*a):\n    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield mark
    assert not mark.exists() and EVIL not in sys.modules


CASES = [
    (lambda h: h.__setitem__("target", "nope"),
     r"^m\.accm: header field 'target' = 'nope': target 'nope' is not registered or installed here; "
     r"targets are accel, cpu, opencl, cuda, toy"),
    (lambda h: h.__setitem__("target", EVIL), f"target '{EVIL}' is not registered or installed here"),
    (lambda h: h.__setitem__("target", f"{EVIL}:run"), f"'{EVIL}:run' is not a target name; targets are"),
    (lambda h: h.__setitem__("target", "os.path"), r"'os\.path' is not a target name"),
    (lambda h: h.__setitem__("target", 7), r"header field 'target' must be a string, got an integer"),
    (lambda h: _step(h, "act").__setitem__("symbol", f"{EVIL}:run"),
     f"step 1 \\('act'\\): target '{EVIL}' is not registered or installed here"),
    (lambda h: _step(h, "act").__setitem__("symbol", "toy:system"),
     r"step 1 \('act'\): target 'toy' has no kernel 'system'; its kernels are relu, add, mul, sigmoid"),
    (lambda h: _step(h, "act").__setitem__("symbol", "toy"), r"step 1 \('act'\): plugin step symbol 'toy' is not "
                                                             r"'target:kernel'"),
    (lambda h: _step(h, "act").__setitem__("symbol", None), r"plugin step symbol None is not 'target:kernel'"),
    (lambda h: _step(h, "act").__setitem__("symbol", "cpu:relu"), r"target 'cpu' has no kernel 'relu'; its kernels "
                                                                  r"are none"),
    (lambda h: _step(h, "mm").__setitem__("kind", "plugin"), r"step 0 \('mm'\): plugin step symbol '\w+' is not"),
    (lambda h: h["target_versions"].__setitem__("toy", "2.0.0"),
     r"^m\.accm: module target 'toy': it was built with toy 2\.0\.0, the installed toy is 1\.2\.0 \(another major "
     r"version\); recompile the model with this one$"),
    (lambda h: h.__setitem__("target_versions", {}), r"module records no version of target 'toy'"),
    (lambda h: h["target_versions"].__setitem__("toy", 12), r"'target_versions\.toy' = 12; expected a version"),
    (lambda h: h["target_versions"].__setitem__("toy", "1.0; rm -rf"), r"'target_versions\.toy' = '1\.0; rm -rf'"),
    (lambda h: h["target_versions"].__setitem__("cpu", "1.0"), r"records a version for the built-in target 'cpu'"),
    (lambda h: h.__setitem__("target_versions", ["toy"]), r"'target_versions' must be an object"),
    (lambda h: h["target_versions"].__setitem__(EVIL, "1.0"), f"target '{EVIL}' is not registered or installed"),
    (lambda h: h.__setitem__("target_versions", {f"t{k}": "1.0" for k in range(10000)}),
     r"'target_versions' names 10000 targets, at most 64 allowed"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_crafted_target_fields_are_refused_and_import_nothing(toy_file, evil, case):
    mutate, want = CASES[case]
    h, payload = split(toy_file[0])
    mutate(h)
    with pytest.raises(ModuleFormatError, match=want) as e:
        ModuleImage.from_bytes(seal(h, payload), "m.accm")
    assert "\n" not in str(e.value)


def test_the_untouched_file_loads_and_runs_the_toys_kernels(toy_file):
    import kit_toy_target  # noqa: PLC0415 - imported by the fixture from the fixture package
    m = ModuleImage.from_bytes(toy_file[0], "m.accm")
    assert m.target == "toy" and m.target_versions == {"toy": "1.2.0"}
    before = dict(kit_toy_target.CALLS)
    with Executor(m) as ex:
        ex.run({"x": toy_file[1]})
    assert {k: kit_toy_target.CALLS[k] - before.get(k, 0) for k in ("relu", "add", "sigmoid")} == \
        {"relu": 1, "add": 1, "sigmoid": 1}
    assert [(r["name"], r["target"], r["impl"]) for r in ex.profile if r["impl"] == "plugin"] == \
        [("act", "toy", "plugin"), ("sum", "toy", "plugin"), ("out", "toy", "plugin")]


def test_a_kernels_own_check_refuses_a_step_before_it_runs(toy_file):
    h, payload = split(toy_file[0])
    _step(h, "sum")["args"][1] = ["t", 0]    # x (2x8) added to relu's 2x16 output: no broadcast
    m = ModuleImage.from_bytes(seal(h, payload), "m.accm")
    with pytest.raises(ModuleFormatError, match=r"step 'sum' \(add\): inputs \[\[2, 16\], \[2, 8\]\] do not "
                                                r"broadcast"):
        Executor(m)


def test_a_plug_in_may_accept_other_versions():
    class Lenient(RuntimeTarget):
        def accepts(self, built_with):
            return None if built_with in ("1.0", "2.0") else "only 1.0 and 2.0"
    register_runtime_target(Lenient("lenient", "2.0"))
    try:
        assert resolve_target("lenient").accepts("1.0") is None
        assert RuntimeTarget("strict", "2.0").accepts("1.9") is not None
        with pytest.raises(TargetError, match="registered already"):
            register_runtime_target(RuntimeTarget("lenient", "1.0"))
        with pytest.raises(TargetError, match="'cuda' is a built-in target"):
            register_runtime_target(RuntimeTarget("cuda", "1.0"))
    finally:
        unregister_runtime_target("lenient")
    unregister_runtime_target("cpu")   # the built-ins stay
    assert resolve_target("cpu").builtin
