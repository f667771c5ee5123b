"""A compiled model is untrusted data: opening one runs no native code the file chose (docs/trust.md).

Attacks on the header alone (a step's symbol set to "system"), on the kernel IR (a declared libc
function, inline assembly, a constructor), tampered bytes in every section, malformed header
values, a poisoned or unsafe kernel cache, and random mutations of real modules: each is refused
with one ModuleFormatError (or the cache's error) naming what is wrong, with no crash and no hang.
"""
import hashlib
import json
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto

import compiler
from accel.cli import main
from accel.isa import resolve_config
from accel.isa.errors import AccelError
from compiler.frontend import zoo
from compiler.module import CompiledModule
from compiler.ops.registry import IMPLS
from host_runtime import kernel_cache as kc
from host_runtime.executor import FORMAT_VERSION, MAGIC, Executor, ExecutorError, ModuleFormatError, ModuleImage
from host_runtime.kernel_cache import KernelCache, KernelCacheError, KernelIRError, verify_ir


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Every test builds kernels into a cache of its own, not the user's."""
    monkeypatch.setenv("ACCEL_KIT_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="module")
def cpu_mod():
    m = zoo.residual_block()
    feeds = zoo.sample_inputs(m, 1, seed=3)[0]
    mod = compiler.build_model(m, target="cpu")
    assert mod.consts and mod.kernels
    return mod, feeds, mod.run(feeds)[0]


@pytest.fixture(scope="module")
def accel_mod():
    """An accel module with every kind of step: its layout conversions are the runtime's own
    (native) steps, as where no pack kernel compiles, so that their checks are attacked too."""
    m = zoo.residual_block()
    feeds = zoo.sample_inputs(m, 3, seed=3)
    with pytest.MonkeyPatch.context() as mp:
        mp.delitem(IMPLS, ("pack", "llvm"))
        mp.delitem(IMPLS, ("unpack", "llvm"))
        mod = compiler.build_model(m, target="accel", config="tiny", calibration=feeds[:2])
    assert mod.count("accel") and mod.count("llvm") and mod.count("native") and mod.segments
    return mod, feeds[2], mod.run(feeds[2])[0]


# ---- helpers: take a file apart and put it back together with valid hashes (what an attacker does)
def split(data: bytes):
    hlen = struct.unpack("<I", data[12:16])[0]
    h = json.loads(data[48:48 + hlen])
    return h, data[48 + hlen:]


def seal(h: dict, payload: bytes) -> bytes:
    """A file whose hashes all match: the header as given, the blobs re-hashed from `payload`."""
    for b in h.get("blobs", []) if isinstance(h, dict) else []:
        if isinstance(b, dict) and isinstance(b.get("offset"), int) and isinstance(b.get("size"), int):
            b["sha256"] = hashlib.sha256(payload[b["offset"]:b["offset"] + b["size"]]).hexdigest()
    hj = json.dumps(h).encode()
    return MAGIC + struct.pack("<II", FORMAT_VERSION, len(hj)) + hashlib.sha256(hj).digest() + hj + payload


def replace_blob(h: dict, payload: bytes, name: str, new: bytes) -> bytes:
    """payload with blob `name` replaced by `new`, the blob table moved to match."""
    out, off = [], 0
    for b in h["blobs"]:
        data = new if b["name"] == name else payload[b["offset"]:b["offset"] + b["size"]]
        b["offset"], b["size"] = off, len(data)
        off += len(data)
        out.append(data)
    return b"".join(out)


# ---- the "system" attack and other native code chosen by the file ---------------------------------
def test_header_symbol_system_is_refused(cpu_mod, tmp_path):
    mod, feeds, _ = cpu_mod
    h, payload = split(mod.to_bytes())
    k = next(i for i, s in enumerate(h["steps"]) if s["kind"] == "llvm")
    h["steps"][k]["symbol"] = "system"
    marker = tmp_path / "pwned"
    (tmp_path / "m.accm").write_bytes(seal(h, payload))
    with pytest.raises(ModuleFormatError, match=r"kernel 'system' is not a function defined in the module's kernel IR"):
        CompiledModule.load(tmp_path / "m.accm")
    assert not marker.exists()
    # the same on a module changed in memory: the executor checks before it loads anything
    other = CompiledModule.from_bytes(mod.to_bytes())
    other.steps[k].symbol = "system"
    with pytest.raises(ModuleFormatError, match="system"):
        Executor(other)


def test_symbol_of_a_runtime_or_libc_function_is_refused(cpu_mod):
    mod, _, _ = cpu_mod
    for sym in ("kit_set_num_threads", "__kit_parallel_launch", "malloc", "free", "exit"):
        h, payload = split(mod.to_bytes())
        k = next(i for i, s in enumerate(h["steps"]) if s["kind"] == "llvm")
        h["steps"][k]["symbol"] = sym
        with pytest.raises(ModuleFormatError, match="not a function defined"):
            ModuleImage.from_bytes(seal(h, payload))


EVIL_IR = {
    "declares external function 'system'":
        'declare i32 @system(ptr)\ndefine void @{s}(ptr %a, ptr %b, ptr %c, ptr %d) {{\n'
        '  %r = call i32 @system(ptr %a)\n  ret void\n}}\n',
    "inline assembly":
        'define void @{s}(ptr %a, ptr %b, ptr %c, ptr %d) {{\n  call void asm sideeffect "syscall", ""()\n'
        '  ret void\n}}\n',
    "indirect call":
        'define void @{s}(ptr %a, ptr %b, ptr %c, ptr %d) {{\n  call void %b()\n  ret void\n}}\n',
    "constructors":
        '@llvm.global_ctors = appending global [1 x {{ i32, ptr, ptr }}] [{{ i32, ptr, ptr }} '
        '{{ i32 65535, ptr @{s}, ptr null }}]\ndefine void @{s}(ptr %a, ptr %b, ptr %c, ptr %d) {{\n  ret void\n}}\n',
    "section":
        '@p = global ptr @{s}, section ".init_array"\n'
        'define void @{s}(ptr %a, ptr %b, ptr %c, ptr %d) {{\n  ret void\n}}\n',
    "module-level assembly":
        'module asm ".section .init_array"\ndefine void @{s}(ptr %a, ptr %b, ptr %c, ptr %d) {{\n  ret void\n}}\n',
    "external global":
        '@environ = external global ptr\ndefine void @{s}(ptr %a, ptr %b, ptr %c, ptr %d) {{\n'
        '  %e = load ptr, ptr @environ\n  store ptr %e, ptr %d\n  ret void\n}}\n',
    "not valid LLVM IR": 'this is not IR @{s}',
    "prologue": 'define void @{s}(ptr %a, ptr %b, ptr %c, ptr %d) prologue i8 204 {{\n  ret void\n}}\n',
}


@pytest.mark.parametrize("why", sorted(EVIL_IR))
def test_kernel_ir_outside_the_allow_list_is_refused(cpu_mod, why):
    mod, _, _ = cpu_mod
    h, payload = split(mod.to_bytes())
    kd = h["kernels"][0]
    sym = next(iter(kd["signatures"]))
    ir = EVIL_IR[why].format(s=sym).encode()
    payload = replace_blob(h, payload, kd["blob"], ir)
    with pytest.raises(ModuleFormatError, match=why):
        ModuleImage.from_bytes(seal(h, payload))


def test_verified_ir_exports_only_its_kernels():
    v = verify_ir("declare float @expf(float)\n"
                  "define void @kit_k0(ptr dereferenceable(64) %a, ptr %b) {\n  ret void\n}\n"
                  "define internal void @helper(ptr %a) {\n  ret void\n}\n"
                  "define i32 @kit_notakernel(i32 %x) {\n  ret i32 %x\n}\n")
    with pytest.raises(KernelIRError, match="defines visible function 'pthread_create'"):
        verify_ir("define i32 @pthread_create(ptr %a, ptr %b, ptr %c, ptr %d) {\n  ret i32 0\n}\n")
    assert v.exports == {"kit_k0": (64, None)}
    with pytest.raises(KernelIRError, match="declared as"):
        verify_ir("declare i32 @expf(ptr)\ndefine void @kit_k() {\n  ret void\n}\n")
    with pytest.raises(KernelIRError, match="launches a parallel loop"):
        verify_ir("declare i32 @__kit_parallel_launch(ptr, ptr, i32)\ndeclare ptr @malloc(i64)\n"
                  "define void @kit_k(ptr %a) {\n  %r = call i32 @__kit_parallel_launch(ptr @malloc, ptr %a, i32 4)\n"
                  "  ret void\n}\n")


def test_no_prebuilt_library_in_the_file(cpu_mod):
    mod, _, _ = cpu_mod
    h, payload = split(mod.to_bytes())
    assert {b["name"].split("/")[0] for b in h["blobs"]} <= {"segment", "const", "kernel"}
    assert b"\x7fELF" not in payload
    h["blobs"].append({"name": "library", "offset": len(payload), "size": 4, "sha256": ""})
    with pytest.raises(ModuleFormatError, match=r"blobs\[\d+\]\.name"):
        ModuleImage.from_bytes(seal(h, payload + b"\x7fELF"))


# ---- hashes -------------------------------------------------------------------------------------
@pytest.mark.parametrize("section", ["header", "segment/", "const/", "kernel/"])
def test_a_flipped_byte_in_any_section_is_refused(cpu_mod, accel_mod, section):
    mod = (accel_mod if section == "segment/" else cpu_mod)[0]
    data = bytearray(mod.to_bytes())
    h, _ = split(bytes(data))
    base = len(data) - sum(b["size"] for b in h["blobs"])
    if section == "header":
        pos = 48 + 10
        want = "header fails its SHA-256 check"
    else:
        b = next(b for b in h["blobs"] if b["name"].startswith(section) and b["size"])
        pos = base + b["offset"] + b["size"] // 2
        want = f"blob '{b['name']}' fails its SHA-256 check"
    data[pos] ^= 0x01
    with pytest.raises(ModuleFormatError, match=want):
        ModuleImage.from_bytes(bytes(data))


def test_trailing_bytes_and_truncation_are_refused(accel_mod):
    data = accel_mod[0].to_bytes()
    with pytest.raises(ModuleFormatError, match="after the last blob"):
        ModuleImage.from_bytes(data + b"\0")
    with pytest.raises(ModuleFormatError, match="truncated"):
        ModuleImage.from_bytes(data[:-1])
    with pytest.raises(ModuleFormatError, match="truncated"):
        ModuleImage.from_bytes(data[:60])


# ---- header values (hashes recomputed: the checks themselves must refuse) -------------------------
def _first(h, kind):
    return next(i for i, s in enumerate(h["steps"]) if s["kind"] == kind)


def _swap_first_arg(h):
    """The first llvm step's first argument pointed at a tensor of another size."""
    s = h["steps"][_first(h, "llvm")]
    size = lambda t: np.prod(h["tensors"][t]["shape"])   # noqa: E731
    s["args"][0] = ["t", next(t for t in range(len(h["tensors"])) if size(t) != size(s["args"][0][1]))]


HEADER_CASES = [
    (lambda h: h["tensors"][0].__setitem__("addr", -64), r"tensors\[0\]\.addr' = -64 is out of range"),
    (lambda h: h["tensors"][0].__setitem__("addr", h["dram_bytes"]), r"tensors\[0\].*lies outside"),
    (lambda h: h["tensors"][0].__setitem__("shape", [1 << 20, 1 << 20]), r"outside the .*arena"),
    (lambda h: h["tensors"][0].__setitem__("shape", [1 << 32] * 8), r"outside the .*arena"),   # no int64 wrap
    (lambda h: h["tensors"][0].__setitem__("shape", [1] * 9), r"tensors\[0\]\.shape' has 9 items"),
    (lambda h: h["tensors"][0].__setitem__("dtype", "object"), r"tensors\[0\]\.dtype' = 'object'"),
    (lambda h: h["tensors"][0].__setitem__("shape", "1x2"), r"tensors\[0\]\.shape' must be an array"),
    (lambda h: h.__setitem__("dram_bytes", 1 << 50), r"'dram_bytes' = \d+ is out of range"),
    (lambda h: h.__setitem__("dram_bytes", 64), r"lies outside"),
    (lambda h: h["segments"][0].__setitem__("addr", -1), r"segments\[0\]\.addr' = -1"),
    (lambda h: h["steps"][0].__setitem__("output", 10 ** 6), r"tensor id 1000000 is out of range"),
    (lambda h: h["steps"][0].__setitem__("output", True), r"steps\[0\]\.output' must be an integer"),
    (lambda h: h["steps"][0].__setitem__("kind", "shell"), r"steps\[0\]\.kind' = 'shell'"),
    (lambda h: h["steps"][0].pop("args"), r"steps\[0\]\.args' is missing"),
    (lambda h: h["steps"][_first(h, "accel")].__setitem__("insn_count", 0), r"program .* is empty"),
    (lambda h: h["steps"][_first(h, "accel")].__setitem__("insn_addr", h["dram_bytes"]), r"outside the"),
    (lambda h: h["steps"][_first(h, "accel")].__setitem__("insn_count", -5), r"insn_count' = -5"),
    (lambda h: h["steps"][_first(h, "accel")].__setitem__("insn_addr", h["tensors"][0]["addr"]),
     r"is not inside one segment"),
    (lambda h: _swap_first_arg(h), r"argument 0 is \w+\[.*\], kernel \w+ takes"),
    (lambda h: h["steps"][_first(h, "llvm")]["args"].pop(), r"takes \d+ arguments, the step passes"),
    (lambda h: h["steps"][_first(h, "llvm")]["args"].__setitem__(0, ["c", "nope"]), r"constant 'nope'"),
    (lambda h: h["steps"][_first(h, "llvm")]["args"].__setitem__(0, ["x", 0]), r"args\[0\]' = \['x', 0\]"),
    (lambda h: h["steps"][_first(h, "native")]["attrs"].__setitem__("block", [1, 64]), r"pack of .* gives"),
    (lambda h: h["steps"][_first(h, "native")]["attrs"].__setitem__("block", [0, 1]), r"attrs\.block"),
    (lambda h: h["config"].__setitem__("block_in", 9999), r"'config' is not a valid configuration"),
    (lambda h: h.__setitem__("config_digest", "0" * 16), r"'config_digest' = .* does not match"),
    (lambda h: h["outputs"][0].__setitem__("tensor", 99999), r"outputs\[0\]\.tensor = 99999 is out of range"),
    (lambda h: h["blobs"][0].__setitem__("offset", 1), r"blobs\[0\]\.offset' = 1; blobs lie back to back"),
    (lambda h: h.__setitem__("target", "gpu"), r"'target' = 'gpu'"),
    (lambda h: h.__setitem__("version", 1), r"'version' = 1 disagrees"),
]


@pytest.mark.parametrize("case", range(len(HEADER_CASES)))
def test_bad_header_values_are_refused_naming_the_field(accel_mod, case):
    mutate, want = HEADER_CASES[case]
    h, payload = split(accel_mod[0].to_bytes())
    mutate(h)
    with pytest.raises(ModuleFormatError, match=want):
        ModuleImage.from_bytes(seal(h, payload), "m.accm")


def test_header_cannot_shrink_a_kernel_buffer(cpu_mod):
    """Shrinking a tensor and its recorded signature together passes the shape check; the size
    each parameter declares in the IR (dereferenceable) still refuses it."""
    h, payload = split(cpu_mod[0].to_bytes())
    s = h["steps"][_first(h, "llvm")]
    sig = next(kd["signatures"][s["symbol"]] for kd in h["kernels"] if s["symbol"] in kd["signatures"])
    t = s["output"]
    h["tensors"][t]["shape"] = [1] * len(h["tensors"][t]["shape"])
    sig[-1]["shape"] = [1] * len(sig[-1]["shape"])
    h["tensors"][t]["addr"] = h["dram_bytes"] - 64   # the kernel would write past the arena
    with pytest.raises(ModuleFormatError, match=r"argument \d+ holds 4 bytes, kernel \w+'s IR accesses \d+"):
        ModuleImage.from_bytes(seal(h, payload))


def test_every_kernel_parameter_declares_its_size(cpu_mod):
    for kd in cpu_mod[0].kernels:
        v = verify_ir(kd.ir)
        for sym, sig in kd.signatures.items():
            assert all(n is not None for n in v.exports[sym])


def test_overlapping_output_and_input_of_a_kernel_is_refused(cpu_mod):
    h, payload = split(cpu_mod[0].to_bytes())
    s = h["steps"][_first(h, "llvm")]
    t = next(a[1] for a in s["args"] if a[0] == "t")
    h["tensors"][s["output"]]["addr"] = h["tensors"][t]["addr"]
    with pytest.raises(ModuleFormatError, match="overlaps argument tensor"):
        ModuleImage.from_bytes(seal(h, payload))


def test_config_in_use_is_compared(accel_mod):
    data = accel_mod[0].to_bytes()
    with pytest.raises(ModuleFormatError, match="compiled for config .* recompile it"):
        ModuleImage.from_bytes(data, "m.accm", resolve_config("default"))
    assert ModuleImage.from_bytes(data, "m.accm", resolve_config("tiny")).config.digest() == \
        resolve_config("tiny").digest()


# ---- the kernel cache ---------------------------------------------------------------------------
def test_cache_location_and_permissions(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCEL_KIT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    c = KernelCache()
    assert c.dir == tmp_path / "xdg" / "accel-kit" / "kernels"
    p = c.put("a" * 64, b"library bytes")
    assert p.name == "a" * 64 + "-" + hashlib.sha256(b"library bytes").hexdigest() + ".so"
    assert os.stat(c.dir).st_mode & 0o777 == 0o700 and os.stat(c.root).st_mode & 0o777 == 0o700
    assert os.stat(p).st_mode & 0o777 == 0o600
    assert c.get("a" * 64) == b"library bytes" and c.get("b" * 64) is None
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert KernelCache().dir == tmp_path / "home" / ".cache" / "accel-kit" / "kernels"


def test_cache_with_bad_permissions_or_owner_is_refused(tmp_path, monkeypatch, cpu_mod):
    root = tmp_path / "c"
    c = KernelCache(root)
    c.put("a" * 64, b"x")
    os.chmod(c.dir, 0o777)
    with pytest.raises(KernelCacheError, match="writable by group or others"):
        c.get("a" * 64)
    os.chmod(c.dir, 0o700)
    os.chmod(root, 0o770)
    with pytest.raises(KernelCacheError, match=r"writable by group or others \(mode 0770\)"):
        c.info()
    os.chmod(root, 0o700)
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 4242)
    with pytest.raises(KernelCacheError, match="not by you"):
        c.get("a" * 64)
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    # through the executor: a module's kernels are never loaded from an unsafe cache
    monkeypatch.setenv("ACCEL_KIT_CACHE", str(root))
    os.chmod(root, 0o777)
    monkeypatch.setattr(kc, "_LIBS", {})
    with pytest.raises(ExecutorError, match="writable by group or others"):
        Executor(cpu_mod[0])
    os.chmod(root, 0o700)


def test_cache_entry_that_is_a_symlink_or_foreign_is_not_loaded(tmp_path):
    c = KernelCache(tmp_path / "c")
    c.put("a" * 64, b"x")
    p = next(c.dir.iterdir())
    target = tmp_path / "evil.so"
    target.write_bytes(b"x")
    p.unlink()
    p.symlink_to(target)
    assert c.get("a" * 64) is None and not p.exists()


def test_poisoned_cache_entry_is_refused_and_rebuilt(cpu_mod, monkeypatch):
    mod, feeds, want = cpu_mod
    cache = KernelCache()
    monkeypatch.setattr(kc, "_LIBS", {})
    mod.run(feeds)
    (entry,) = list(cache.dir.iterdir())
    entry.write_bytes(b"\x7fELF not the library this name promises")   # same name, other content
    monkeypatch.setattr(kc, "_LIBS", {})
    got = mod.run(feeds)[0]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    (rebuilt,) = list(cache.dir.iterdir())
    assert rebuilt.name == entry.name and hashlib.sha256(rebuilt.read_bytes()).hexdigest() in rebuilt.name
    assert cache.info()["entries"] == 1


def test_cache_prunes_least_recently_used(tmp_path):
    c = KernelCache(tmp_path / "c", max_bytes=250)
    paths = []
    for k, key in enumerate("abc"):
        paths.append(c.put(key * 64, bytes([k]) * 100))
        os.utime(paths[-1], (1000 + k, 1000 + k))
    # 300 bytes > 250: the oldest ('a') went when 'c' came in
    assert not paths[0].exists() and paths[1].exists() and paths[2].exists()
    assert c.get("b" * 64) == b"\x01" * 100            # 'b' used now: 'c' is the least recently used
    c.put("d" * 64, b"\x03" * 100)
    assert paths[1].exists() and not paths[2].exists()
    info = c.info()
    assert info == {"path": str(c.dir), "entries": 2, "bytes": 200, "limit": 250}
    assert c.clear() == 2 and c.info()["entries"] == 0


def test_cache_limit_from_the_environment(monkeypatch):
    monkeypatch.setenv("ACCEL_KIT_CACHE_MAX_BYTES", "3M")
    assert KernelCache().max_bytes == 3 << 20
    monkeypatch.setenv("ACCEL_KIT_CACHE_MAX_BYTES", "lots")
    with pytest.raises(KernelCacheError, match="ACCEL_KIT_CACHE_MAX_BYTES"):
        KernelCache()


def test_cli_cache_info_and_clear(cpu_mod, capsys, monkeypatch):
    monkeypatch.setattr(kc, "_LIBS", {})
    cpu_mod[0].run(cpu_mod[1])
    assert main(["cache", "info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 1 and info["bytes"] > 0 and info["path"].endswith("kernels")
    assert main(["cache", "clear"]) == 0
    assert "removed 1 kernel library" in capsys.readouterr().out
    os.chmod(KernelCache().root, 0o777)
    assert main(["cache", "info"]) == 2
    assert capsys.readouterr().err.startswith("error: kernel cache directory")
    os.chmod(KernelCache().root, 0o700)


# ---- fuzzing: random mutations of real modules ----------------------------------------------------
def mutate_bytes(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for kind, pos, val in ops:
        if not b:
            break
        p = pos % len(b)
        if kind == "flip":
            b[p] ^= 1 << (val % 8)
        elif kind == "set":
            b[p] = val % 256
        elif kind == "insert":
            b[p:p] = bytes([val % 256])
        elif kind == "delete":
            del b[p:p + 1 + val % 16]
        elif kind == "truncate":
            del b[p:]
    return bytes(b)


_OPS = st.lists(st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
                          st.integers(0, 1 << 30), st.integers(0, 255)), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(ops=_OPS, which=st.sampled_from(["accel", "cpu"]))
def test_fuzz_random_byte_mutations(accel_mod, cpu_mod, ops, which):
    """Every mutation of the file either loads and gives the same outputs or is refused."""
    mod, feeds, want = accel_mod if which == "accel" else cpu_mod
    data = mod.to_bytes()
    bad = mutate_bytes(data, ops)
    try:
        back = ModuleImage.from_bytes(bad)
    except ModuleFormatError:
        return
    with Executor(back) as ex:
        got = ex.run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def _leaves(o, path=()):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(o, list):
        for k, v in enumerate(o):
            yield from _leaves(v, path + (k,))
    yield path


_VALUES = st.one_of(st.integers(-(1 << 70), 1 << 70), st.integers(-3, 300), st.none(), st.booleans(),
                    st.floats(allow_nan=True), st.text(max_size=8), st.just([]), st.just({}),
                    st.lists(st.integers(-2, 70), max_size=5))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data(), which=st.sampled_from(["cpu", "cpu", "accel", "numpy"]))
def test_fuzz_header_values_with_valid_hashes(cpu_mod, accel_mod, numpy_mod, data, which):
    """An attacker re-seals the hashes: any header value is then refused with ModuleFormatError,
    or the module loads, runs and fails only with the kit's own one-line errors (the runtime's,
    or the simulator's for a program a changed header makes it read)."""
    mod, feeds, _ = {"cpu": cpu_mod, "accel": accel_mod, "numpy": numpy_mod}[which]
    h, payload = split(mod.to_bytes())
    paths = [p for p in _leaves(h) if p and p[0] not in ("meta", "library_target")]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        value = data.draw(_VALUES)
        node = h
        try:
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    try:
        back = ModuleImage.from_bytes(seal(h, payload))
    except ModuleFormatError:
        return
    try:
        with Executor(back) as ex:
            ex.run(feeds)
    except AccelError:
        pass


# ---- compiling IR from a file happens in a child process --------------------------------------------
def test_kernels_from_a_file_compile_in_a_child_process(cpu_mod, monkeypatch):
    mod, feeds, want = cpu_mod
    monkeypatch.setattr(kc, "_LIBS", {})
    monkeypatch.setattr(kc, "_OBJECTS", kc.OrderedDict())   # as in a process that did not build it
    back = ModuleImage.from_bytes(mod.to_bytes())
    with Executor(back) as ex:
        got = ex.run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert len(kc._OBJECTS) == len(mod.kernels)


def test_a_compile_that_runs_too_long_is_refused(cpu_mod, monkeypatch):
    monkeypatch.setattr(kc, "_LIBS", {})
    monkeypatch.setattr(kc, "_OBJECTS", kc.OrderedDict())
    monkeypatch.setenv("ACCEL_KIT_COMPILE_TIMEOUT", "0.01")
    with pytest.raises(ModuleFormatError, match="took more than 0.01 s; refused"):
        Executor(ModuleImage.from_bytes(cpu_mod[0].to_bytes()))


def test_a_compiler_crash_is_refused_not_fatal(monkeypatch):
    """LLVM stopping the compiling process (here: a child that dies) is one error for the caller."""
    monkeypatch.setattr(kc, "_OBJECTS", kc.OrderedDict())
    monkeypatch.setattr(kc.sys, "executable", "/bin/false")
    v = verify_ir("define void @kit_k(ptr %a) {\n  ret void\n}\n")
    with pytest.raises(KernelIRError, match="LLVM could not compile the module's kernel IR"):
        kc.compile_isolated([v])


def test_an_unwritable_cache_location_builds_without_caching(cpu_mod, tmp_path, monkeypatch, caplog):
    """A read-only or missing home must not make models unrunnable (unsafe permissions still refuse)."""
    mod, feeds, want = cpu_mod
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "file").write_text("")
    monkeypatch.setenv("ACCEL_KIT_CACHE", str(ro / "file" / "cache"))   # a path under a regular file
    monkeypatch.setattr(kc, "_LIBS", {})
    with caplog.at_level("WARNING", logger="host_runtime.kernel_cache"):
        got = mod.run(feeds)[0]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert "building the kernels without a cache" in caplog.text


def test_summary_of_a_module_with_malformed_meta(cpu_mod):
    h, payload = split(cpu_mod[0].to_bytes())
    h["meta"] = {"memory": {"planned_bytes": 1}, "macs": "lots", "fallbacks": 5}
    mod = CompiledModule.from_bytes(seal(h, payload))
    assert mod.summary().startswith("<CompiledModule 'residual_block' target=cpu")
    assert "MACs" in cpu_mod[0].summary()


# ---- numpy steps: a file's attributes are vetted by the op's own checks -----------------------------
@pytest.fixture(scope="module")
def numpy_mod():
    b = zoo.ModelBuilder("embed", seed=4)
    ids = b.input("ids", (2, 8), TensorProto.INT64)
    x = b.op("Gather", [b.init(b.rng.standard_normal((50, 32)).astype(np.float32)), ids], name="embedding", axis=0)
    mod = compiler.build_model(b.build([b.op("Relu", [x], name="relu")]), target="cpu")
    assert mod.count("numpy") == 1
    feeds = {"ids": np.arange(16, dtype=np.int64).reshape(2, 8) % 50}
    return mod, feeds, mod.run(feeds)[0]


@pytest.mark.parametrize("attrs, want", [
    ({"axis": 1}, r"step 'embedding' \(gather\): gives float32\[50, 2, 8\], the output buffer is float32\[2, 8, 32\]"),
    ({"axis": 7}, r"step 'embedding' \(gather\): .*axis"),
    ({"axis": 0, "evil": 1}, r"unknown attribute\(s\) evil"),
])
def test_numpy_step_attributes_are_checked_before_running(numpy_mod, attrs, want):
    mod, feeds, _ = numpy_mod
    h, payload = split(mod.to_bytes())
    h["steps"][_first(h, "numpy")]["attrs"] = attrs
    back = ModuleImage.from_bytes(seal(h, payload))
    with pytest.raises(ModuleFormatError, match=want):
        Executor(back)


def test_numpy_step_from_a_file_runs(numpy_mod):
    mod, feeds, want = numpy_mod
    with Executor(ModuleImage.from_bytes(mod.to_bytes())) as ex:
        got = ex.run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
