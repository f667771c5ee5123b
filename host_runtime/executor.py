"""Executing compiled modules: the module file format and the Executor that runs one on a driver.

A module is data (built by compiler.build_model): one arena of bytes that is the device DRAM
(weights, micro-op kernels and instruction programs placed at build time, activations at the
addresses of the memory plan), a list of steps, and its CPU kernels as LLVM IR. Steps run
in order and exchange tensors only through the arena:
  accel   an instruction program already in DRAM (insn_addr, insn_count), run on the driver;
  llvm    a CPU kernel: a function defined in the module's verified IR, compiled on this host
          (host_runtime.kernel_cache), called with pointers into the arena and to its constants;
  native  a layout conversion the runtime does itself (pack/unpack at accelerator boundaries);
  numpy   a fallback for an op with no compiled kernel: a host op registered by name
          (register_host_op; compiler.module registers the graph IR's NumPy references);
  plugin  a kernel of a plug-in target, symbol "target:kernel": the function the installed,
          registered plug-in gave for that name (host_runtime.targets).
Executor(module, driver="fsim").run(inputs) -> {output name: array}; `profile` then holds one row
per step: name, op, target, impl, time_s, MACs, and for accelerator steps instructions, GEMM and ALU
micro-ops, DRAM bytes read and written (fsim: the data moved; tsim and rtl: bus bytes, instruction
fetch and whole beats included), cycles and utilization (when the driver reports cycles) and the
latency they imply at the config's clock.

File layout (little endian): magic b"ACCMODL\\0", u32 format version, u32 header length, the
header's SHA-256 (32 bytes), UTF-8 JSON header, then the blobs the header lists (name, offset,
size, sha256) back to back, exactly filling the rest of the file: segment/<k> (the DRAM image:
weights, micro-ops, instruction programs), const/<name> (.npy kernel constants), kernel/<k>
(LLVM IR text). A module is untrusted data (docs/trust.md): loading checks the magic, the
version, every hash, every header field's type and range, the config digest (and, when asked,
that it is the config in use), verifies the kernel IR and checks each step against the buffers
and its kernel's signature before anything runs; every refusal is one ModuleFormatError naming
the field. The header names the build's target and records each plug-in target's version; a
target that is neither built in nor registered nor installed is refused (host_runtime.targets).
Saving is atomic (temporary file + rename).
This module never imports the compiler (arrows point down: compiler -> host_runtime).
"""
from __future__ import annotations

import ctypes
import hashlib
import io
import json
import logging
import math
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from accel.isa import INSN_BYTES, AccelConfig
from accel.isa.files import write_atomic
from accel.isa.layout import pack_blocked, unpack_blocked

from .device import Device
from .errors import HostRuntimeError
from .gpu import DeviceTensors, GpuError, check_gpu_attrs, open_device
from .kernel_cache import RUN_STEPS_MAX_ARGS, KernelBuildError, KernelCacheError, KernelIRError, load_kernels, verify_ir
from .targets import _VERSION, TargetError, check_versions, current_versions, plugin_kernel, resolve_target

log = logging.getLogger(__name__)

MAGIC = b"ACCMODL\0"
FORMAT_VERSION = 2
KINDS = ("accel", "llvm", "native", "numpy", "gpu", "plugin")
#: bounds on what a module file may ask for (checked before anything is allocated)
MAX_HEADER_BYTES = 64 << 20
MAX_DRAM_BYTES = 1 << 32
MAX_RANK = 8
MAX_ITEMS = 1 << 20          # steps, tensors, segments, constants, blobs, kernels
MAX_NAME = 4096              # characters of a name, op, symbol or note
MAX_INSNS = 1 << 24          # instructions of one accelerator step
MAX_TARGETS = 64             # plug-in targets one module may record
#: element types a tensor or constant may have
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64")
_PREAMBLE = 16 + 32          # magic, version, header length, header SHA-256


def is_module_file(path) -> bool:
    """True when `path` starts with a compiled model's magic (a cheap test before a full load)."""
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


class ModuleFormatError(HostRuntimeError):
    """A module file is unreadable, corrupt (a hash), malformed (a header field, a step, its kernel
    IR), of another format version, or built for another config; the message names the field."""


class ExecutorError(HostRuntimeError):
    """A module cannot run here (bad inputs, missing host op, library that does not load)."""


# ---- host ops: NumPy-level implementations the runtime calls by name -----------------------------
HOST_OPS: dict[str, Callable[..., np.ndarray]] = {}
#: per host op, check(attrs, inputs, out) -> None or why the step is refused; inputs are a
#: constant's array or a tensor's (shape, dtype), out the output's (shape, dtype)
HOST_OP_CHECKS: dict[str, Callable[..., str | None]] = {}


def register_host_op(name: str, fn: Callable[..., np.ndarray],
                     check: Callable[..., str | None] | None = None) -> None:
    """fn(attrs, *arrays) -> array. Used by steps of kind 'numpy' (the compiler registers its
    reference implementations here when compiler.module is imported). `check` vets a step's
    attributes and input types before anything runs: a file's attributes then cannot make the
    op compute a result larger than its output buffer (nor allocate its way there)."""
    HOST_OPS[name] = fn
    if check is not None:
        HOST_OP_CHECKS[name] = check


NATIVE_OPS: dict[str, Callable[..., np.ndarray]] = {
    "pack": lambda a, x: pack_blocked(x, a["block"]),
    "unpack": lambda a, x: unpack_blocked(x, a["shape"]),
}


# ---- the module data ---------------------------------------------------------------------------
@dataclass
class TensorSpec:
    """An activation in the arena: `addr` is its byte address (the memory plan's buffer)."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    addr: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize   # Python ints: no overflow


@dataclass
class Step:
    """One unit of execution. `args` is the call order of a kernel: ("t", tensor id) or
    ("c", constant name); the output tensor comes last for llvm kernels. For accel steps
    insn_addr/insn_count locate the program in DRAM; `note` says why a fallback was taken."""
    name: str
    kind: str
    op: str
    inputs: list[int]
    output: int
    args: list = field(default_factory=list)
    symbol: str | None = None
    attrs: dict = field(default_factory=dict)
    insn_addr: int = 0
    insn_count: int = 0
    macs: int = 0
    note: str = ""

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("name", "kind", "op", "inputs", "output", "args", "symbol", "attrs",
                                          "insn_addr", "insn_count", "macs", "note")}
        d["attrs"] = _encode_attrs(self.attrs)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Step":
        d = dict(d)
        d["args"] = [tuple(a) for a in d.get("args", [])]
        return cls(**d)


def _encode_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, np.ndarray):
            out[k] = {"__ndarray__": v.tolist(), "dtype": str(v.dtype)}
        elif isinstance(v, np.generic):
            out[k] = v.item()
        elif isinstance(v, tuple):
            out[k] = {"__tuple__": [x.item() if isinstance(x, np.generic) else x for x in v]}
        else:
            out[k] = v
    return out


def _decode_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, dict) and "__ndarray__" in v:
            out[k] = np.asarray(v["__ndarray__"], dtype=v["dtype"])
        elif isinstance(v, dict) and "__tuple__" in v:
            out[k] = tuple(tuple(x) if isinstance(x, list) else x for x in v["__tuple__"])
        else:
            out[k] = v
    return out


def _npy_bytes(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, np.ascontiguousarray(a), allow_pickle=False)
    return f.getvalue()


def _npy_load(b: bytes) -> np.ndarray:
    return np.load(io.BytesIO(b), allow_pickle=False)


@dataclass
class KernelSource:
    """One LLVM IR module of CPU kernels, and per kernel symbol its parameters' (shape, dtype) in
    call order (the step's arguments, then its output): what steps are checked against."""
    ir: str
    signatures: dict[str, list[tuple[tuple[int, ...], str]]] = field(default_factory=dict)


class _Fields:
    """Typed, ranged reads of a parsed header; every error names the field (steps[3].output)."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, msg: str):
        raise ModuleFormatError(f"{self.source}: header field '{where}' {msg}")

    def get(self, d: dict, key: str, where: str):
        if key not in d:
            self.fail(f"{where}.{key}" if where else key, "is missing")
        return d[key]

    def obj(self, v, where: str) -> dict:
        if not isinstance(v, dict):
            self.fail(where, f"must be an object, got {_jtype(v)}")
        return v

    def lst(self, v, where: str, most: int = MAX_ITEMS) -> list:
        if not isinstance(v, list):
            self.fail(where, f"must be an array, got {_jtype(v)}")
        if len(v) > most:
            self.fail(where, f"has {len(v)} items, at most {most} allowed")
        return v

    def int(self, v, where: str, lo: int, hi: int) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            self.fail(where, f"must be an integer, got {_jtype(v)}")
        if not lo <= v <= hi:
            self.fail(where, f"= {_short(v)} is out of range {lo}..{hi}")
        return v

    def str(self, v, where: str, most: int = MAX_NAME, none: bool = False):
        if v is None and none:
            return None
        if not isinstance(v, str):
            self.fail(where, f"must be a string{' or null' if none else ''}, got {_jtype(v)}")
        if len(v) > most:
            self.fail(where, f"is {len(v)} characters long, at most {most} allowed")
        return v

    def choice(self, v, where: str, allowed) -> str:
        if not isinstance(v, str) or v not in allowed:
            self.fail(where, f"= {_short(v)}; allowed: {', '.join(map(str, allowed))}")
        return v


def _jtype(v) -> str:
    return {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(v), type(v).__name__)


def _short(v, n: int = 60) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 128:
        return f"<integer of {v.bit_length()} bits>"
    r = repr(v)
    return r if len(r) <= n else r[:n - 3] + "..."


class ModuleImage:
    """A compiled module as data: header fields plus arrays and the CPU kernels' IR (see module doc).

    name, target ("accel" | "cpu"), config (AccelConfig or None), dram_bytes (arena size),
    segments [(addr, bytes)] (the DRAM image), tensors [TensorSpec], inputs / outputs
    [{"name", "tensor", "shift"}], steps [Step], consts {name: array} (kernel arguments bound at
    build time), kernels [KernelSource] (LLVM IR, compiled where the module runs), library_target
    {triple, cpu} (the build host's, informative), meta (build reports: memory plan, partition,
    compile time), target_versions {plug-in target: version built with} (default: the registered
    versions of the build target and of the targets of its plugin steps)."""

    def __init__(self, name: str, target: str, config: AccelConfig | None, dram_bytes: int,
                 segments: list[tuple[int, bytes]], tensors: list[TensorSpec], inputs: list[dict],
                 outputs: list[dict], steps: list[Step], consts: dict[str, np.ndarray] | None = None,
                 kernels: list[KernelSource] | None = None, library_target: dict | None = None,
                 meta: dict | None = None, target_versions: dict[str, str] | None = None):
        self.name, self.target, self.config, self.dram_bytes = name, target, config, int(dram_bytes)
        self.segments, self.tensors, self.inputs, self.outputs = segments, tensors, inputs, outputs
        self.steps, self.consts = steps, dict(consts or {})
        self.kernels, self.library_target, self.meta = list(kernels or []), dict(library_target or {}), dict(meta or {})
        self.target_versions = dict(target_versions) if target_versions is not None else \
            current_versions({target} | self.plugin_targets())

    # ---- queries ----------------------------------------------------------------------------
    @property
    def input_names(self) -> list[str]:
        return [i["name"] for i in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.outputs]

    def input_spec(self, name: str) -> TensorSpec:
        for i in self.inputs:
            if i["name"] == name:
                return self.tensors[i["tensor"]]
        raise ExecutorError(f"module '{self.name}' has no input {name!r}; inputs are {', '.join(self.input_names)}")

    def count(self, kind: str) -> int:
        return sum(s.kind == kind for s in self.steps)

    def plugin_targets(self) -> set[str]:
        """The targets whose kernels the module's plugin steps call."""
        out = set()
        for s in self.steps:
            if s.kind == "plugin":
                try:
                    out.add(plugin_kernel(s.symbol)[0])
                except TargetError:
                    pass   # validate() names the step
        return out

    def __repr__(self):
        kinds = ", ".join(f"{self.count(k)} {k}" for k in KINDS if self.count(k))
        return f"<{type(self).__name__} '{self.name}' target={self.target}: {len(self.steps)} steps ({kinds})>"

    # ---- serialization ----------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        blobs: list[tuple[str, bytes]] = []
        seg_hdr = []
        for k, (addr, data) in enumerate(self.segments):
            blobs.append((f"segment/{k}", bytes(data)))
            seg_hdr.append({"addr": int(addr), "blob": f"segment/{k}"})
        for name, arr in self.consts.items():
            blobs.append((f"const/{name}", _npy_bytes(arr)))
        ker_hdr = []
        for k, ks in enumerate(self.kernels):
            blobs.append((f"kernel/{k}", ks.ir.encode()))
            ker_hdr.append({"blob": f"kernel/{k}", "signatures": {
                sym: [{"shape": [int(d) for d in shape], "dtype": str(dtype)} for shape, dtype in sig]
                for sym, sig in ks.signatures.items()}})
        header = {
            "format": "accel-kit module", "version": FORMAT_VERSION, "name": self.name, "target": self.target,
            "target_versions": self.target_versions,
            "config": None if self.config is None else self.config.to_dict(),
            "config_digest": None if self.config is None else self.config.digest(),
            "dram_bytes": self.dram_bytes, "segments": seg_hdr,
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "addr": t.addr} for t in self.tensors],
            "inputs": self.inputs, "outputs": self.outputs, "steps": [s.to_dict() for s in self.steps],
            "consts": list(self.consts), "kernels": ker_hdr, "library_target": self.library_target,
            "meta": self.meta, "blobs": [],
        }
        off = 0
        for name, data in blobs:
            header["blobs"].append({"name": name, "offset": off, "size": len(data),
                                    "sha256": hashlib.sha256(data).hexdigest()})
            off += len(data)
        hj = json.dumps(header, default=_json_default).encode()
        return b"".join([MAGIC, struct.pack("<II", FORMAT_VERSION, len(hj)), hashlib.sha256(hj).digest(), hj]
                        + [d for _, d in blobs])

    def save(self, path: str | Path) -> None:
        """Write the module to one file, atomically (a temporary file renamed into place)."""
        path = Path(path)
        data = self.to_bytes()
        try:
            write_atomic(path, data)
        except OSError as e:
            raise ModuleFormatError(f"cannot write module {path}: {e.strerror}") from None

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<bytes>", config: AccelConfig | None = None):
        """Parse and check a module file's bytes (see module doc); ModuleFormatError names what is wrong."""
        data = bytes(data)
        if len(data) < 16 or data[:8] != MAGIC:
            raise ModuleFormatError(f"{source}: not a compiled module file (bad magic)")
        version, hlen = struct.unpack("<II", data[8:16])
        if version != FORMAT_VERSION:
            raise ModuleFormatError(f"{source}: module format version {version}, this kit reads version "
                                    f"{FORMAT_VERSION}; recompile the model with this kit")
        if hlen > MAX_HEADER_BYTES:
            raise ModuleFormatError(f"{source}: header length {hlen} is over the {MAX_HEADER_BYTES}-byte limit")
        if len(data) < _PREAMBLE + hlen:
            raise ModuleFormatError(f"{source}: truncated (header ends at byte {_PREAMBLE + hlen}, file has {len(data)})")
        hj = data[_PREAMBLE:_PREAMBLE + hlen]
        if hashlib.sha256(hj).digest() != data[16:_PREAMBLE]:
            raise ModuleFormatError(f"{source}: header fails its SHA-256 check (the file is corrupt or was modified)")
        try:
            h = json.loads(hj.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ModuleFormatError(f"{source}: corrupt module header ({type(e).__name__}: {str(e)[:200]})") from None
        f = _Fields(source)
        f.obj(h, "header")
        if f.get(h, "format", "") != "accel-kit module":
            f.fail("format", f"= {_short(h['format'])}, expected 'accel-kit module'")
        if f.get(h, "version", "") != FORMAT_VERSION:
            f.fail("version", f"= {_short(h['version'])} disagrees with the file's format version {FORMAT_VERSION}")
        blobs = cls._blobs(f, h, data, _PREAMBLE + hlen)
        name = f.str(f.get(h, "name", ""), "name")
        target = cls._target(f, h)
        cfg = cls._config(f, h, config)
        dram = f.int(f.get(h, "dram_bytes", ""), "dram_bytes", 0, MAX_DRAM_BYTES)
        segments = []
        for k, s in enumerate(f.lst(f.get(h, "segments", ""), "segments")):
            w = f"segments[{k}]"
            s = f.obj(s, w)
            b = f.str(f.get(s, "blob", w), f"{w}.blob")
            if not b.startswith("segment/") or b not in blobs:
                f.fail(f"{w}.blob", f"= {_short(b)} names no segment blob")
            segments.append((f.int(f.get(s, "addr", w), f"{w}.addr", 0, MAX_DRAM_BYTES), blobs[b]))
        tensors = []
        for k, t in enumerate(f.lst(f.get(h, "tensors", ""), "tensors")):
            w = f"tensors[{k}]"
            t = f.obj(t, w)
            shape = tuple(f.int(d, f"{w}.shape[{j}]", 0, MAX_DRAM_BYTES)
                          for j, d in enumerate(f.lst(f.get(t, "shape", w), f"{w}.shape", MAX_RANK)))
            tensors.append(TensorSpec(f.str(f.get(t, "name", w), f"{w}.name"), shape,
                                      f.choice(f.get(t, "dtype", w), f"{w}.dtype", DTYPES),
                                      f.int(f.get(t, "addr", w), f"{w}.addr", 0, MAX_DRAM_BYTES)))
        ios = {}
        for io_key in ("inputs", "outputs"):
            rows = []
            for k, r in enumerate(f.lst(f.get(h, io_key, ""), io_key)):
                w = f"{io_key}[{k}]"
                r = f.obj(r, w)
                shift = r.get("shift")
                if shift is not None and (isinstance(shift, bool) or not isinstance(shift, (int, float))
                                          or not math.isfinite(shift) or abs(shift) > 1024):
                    f.fail(f"{w}.shift", f"= {_short(shift)}; allowed: null or a number in -1024..1024")
                rows.append({**r, "name": f.str(f.get(r, "name", w), f"{w}.name"),
                             "tensor": f.int(f.get(r, "tensor", w), f"{w}.tensor", 0, MAX_ITEMS), "shift": shift})
            ios[io_key] = rows
        steps = [cls._step(f, s, k) for k, s in enumerate(f.lst(f.get(h, "steps", ""), "steps"))]
        consts = {}
        for k, n in enumerate(f.lst(f.get(h, "consts", ""), "consts")):
            n = f.str(n, f"consts[{k}]")
            if f"const/{n}" not in blobs:
                f.fail(f"consts[{k}]", f"= {_short(n)} has no const blob")
            try:
                arr = _npy_load(blobs[f"const/{n}"])
            except Exception as e:  # noqa: BLE001 - numpy's reader raises several types on bad bytes
                raise ModuleFormatError(f"{source}: constant {n!r} is not a valid .npy array "
                                        f"({type(e).__name__}: {str(e)[:120]})") from None
            consts[n] = arr
        kernels = []
        for k, kd in enumerate(f.lst(f.get(h, "kernels", ""), "kernels")):
            w = f"kernels[{k}]"
            kd = f.obj(kd, w)
            b = f.str(f.get(kd, "blob", w), f"{w}.blob")
            if not b.startswith("kernel/") or b not in blobs:
                f.fail(f"{w}.blob", f"= {_short(b)} names no kernel blob")
            try:
                ir = blobs[b].decode("utf-8")
            except UnicodeDecodeError as e:
                raise ModuleFormatError(f"{source}: kernel blob {b!r} is not UTF-8 text (offset {e.start})") from None
            sigs = {}
            for sym, sig in f.obj(f.get(kd, "signatures", w), f"{w}.signatures").items():
                ws = f"{w}.signatures.{sym[:40]}"
                params = []
                for j, prm in enumerate(f.lst(sig, ws, 4096)):
                    prm = f.obj(prm, f"{ws}[{j}]")
                    shape = tuple(f.int(d, f"{ws}[{j}].shape", 0, MAX_DRAM_BYTES)
                                  for d in f.lst(f.get(prm, "shape", f"{ws}[{j}]"), f"{ws}[{j}].shape", MAX_RANK))
                    params.append((shape, f.choice(f.get(prm, "dtype", f"{ws}[{j}]"), f"{ws}[{j}].dtype", DTYPES)))
                sigs[f.str(sym, ws)] = params
            kernels.append(KernelSource(ir, sigs))
        versions = {}
        tv = f.obj(h.get("target_versions") or {}, "target_versions")
        if len(tv) > MAX_TARGETS:
            f.fail("target_versions", f"names {len(tv)} targets, at most {MAX_TARGETS} allowed")
        for t, v in tv.items():
            if not isinstance(v, str) or not _VERSION.fullmatch(v):
                f.fail(f"target_versions.{t[:40]}", f"= {_short(v)}; expected a version such as '1.0.0'")
            versions[t] = v
        lt = f.obj(h.get("library_target") or {}, "library_target")
        meta = f.obj(h.get("meta") or {}, "meta")
        obj = cls.__new__(cls)
        ModuleImage.__init__(obj, name, target, cfg, dram, segments, tensors, ios["inputs"], ios["outputs"], steps,
                             consts, kernels, lt, meta, versions)
        obj.validate(source)
        _refuse_untrusted_ptx(obj, source)
        return obj

    @staticmethod
    def _target(f: _Fields, h: dict) -> str:
        """The build target's name, resolved in the registry (an installed plug-in loads by its name)."""
        target = f.str(f.get(h, "target", ""), "target", 64)
        try:
            resolve_target(target)
        except TargetError as e:
            f.fail("target", f"= {_short(target)}: {e}")
        return target

    @staticmethod
    def _blobs(f: _Fields, h: dict, data: bytes, base: int) -> dict[str, bytes]:
        """The blob table: names unique and known, back to back to the end of the file, each hashed."""
        blobs: dict[str, bytes] = {}
        pos = base
        for k, b in enumerate(f.lst(f.get(h, "blobs", ""), "blobs")):
            w = f"blobs[{k}]"
            b = f.obj(b, w)
            name = f.str(f.get(b, "name", w), f"{w}.name")
            if not name.startswith(("segment/", "const/", "kernel/")) or name in blobs:
                f.fail(f"{w}.name", f"= {_short(name)}: unknown or repeated (segment/, const/, kernel/ blobs)")
            off = f.int(f.get(b, "offset", w), f"{w}.offset", 0, len(data))
            size = f.int(f.get(b, "size", w), f"{w}.size", 0, len(data))
            if base + off != pos:
                f.fail(f"{w}.offset", f"= {off}; blobs lie back to back, this one must start at {pos - base}")
            end = pos + size
            if end > len(data):
                raise ModuleFormatError(f"{f.source}: truncated (blob {name} ends at byte {end}, file has {len(data)})")
            digest = f.str(f.get(b, "sha256", w), f"{w}.sha256", 64)
            if hashlib.sha256(data[pos:end]).hexdigest() != digest:
                raise ModuleFormatError(f"{f.source}: blob {name!r} fails its SHA-256 check (the file is corrupt "
                                        f"or was modified)")
            blobs[name] = data[pos:end]
            pos = end
        if pos != len(data):
            raise ModuleFormatError(f"{f.source}: {len(data) - pos} bytes after the last blob (the file is corrupt)")
        return blobs

    @staticmethod
    def _config(f: _Fields, h: dict, config: AccelConfig | None) -> AccelConfig | None:
        raw, digest = f.get(h, "config", ""), f.get(h, "config_digest", "")
        cfg = None
        if raw is not None:
            try:
                cfg = AccelConfig.from_dict(f.obj(raw, "config"))
            except ModuleFormatError:
                raise
            except Exception as e:  # noqa: BLE001 - any refusal of the config's own checks
                raise ModuleFormatError(f"{f.source}: header field 'config' is not a valid configuration: "
                                        f"{str(e)[:300]}") from None
            if digest != cfg.digest():
                f.fail("config_digest", f"= {_short(digest)} does not match the recorded config ({cfg.digest()})")
        elif digest is not None:
            f.fail("config_digest", "is set but the module records no config")
        source = f.source
        if config is not None:
            if cfg is None:
                raise ModuleFormatError(f"{source}: module was compiled for the CPU only (no accelerator config); "
                                        f"expected config {config.digest()}")
            if cfg.digest() != config.digest():
                diff = {k: (v, config.to_dict().get(k)) for k, v in cfg.to_dict().items() if config.to_dict().get(k) != v}
                raise ModuleFormatError(f"{source}: module was compiled for config {cfg.digest()}, not {config.digest()} "
                                        f"(differs in {', '.join(f'{k}: {a} vs {b}' for k, (a, b) in diff.items())}); "
                                        f"recompile it for this config")
        return cfg

    @staticmethod
    def _step(f: _Fields, s, k: int) -> Step:
        w = f"steps[{k}]"
        s = f.obj(s, w)
        g = lambda key: f.get(s, key, w)   # noqa: E731
        args = []
        for j, a in enumerate(f.lst(g("args"), f"{w}.args", 4096)):
            if not isinstance(a, list) or len(a) != 2 or a[0] not in ("t", "c"):
                f.fail(f"{w}.args[{j}]", f"= {_short(a)}; expected [\"t\", tensor id] or [\"c\", constant name]")
            args.append(("t", f.int(a[1], f"{w}.args[{j}][1]", 0, MAX_ITEMS)) if a[0] == "t"
                        else ("c", f.str(a[1], f"{w}.args[{j}][1]")))
        attrs = f.obj(g("attrs"), f"{w}.attrs")
        try:
            _decode_attrs(attrs)
        except Exception as e:  # noqa: BLE001 - a crafted array or tuple encoding
            f.fail(f"{w}.attrs", f"cannot be decoded ({type(e).__name__}: {str(e)[:120]})")
        return Step(name=f.str(g("name"), f"{w}.name"), kind=f.choice(g("kind"), f"{w}.kind", KINDS),
                    op=f.str(g("op"), f"{w}.op"),
                    inputs=[f.int(i, f"{w}.inputs[{j}]", 0, MAX_ITEMS)
                            for j, i in enumerate(f.lst(g("inputs"), f"{w}.inputs", 4096))],
                    output=f.int(g("output"), f"{w}.output", 0, MAX_ITEMS), args=args,
                    symbol=f.str(g("symbol"), f"{w}.symbol", none=True), attrs=attrs,
                    insn_addr=f.int(g("insn_addr"), f"{w}.insn_addr", 0, MAX_DRAM_BYTES),
                    insn_count=f.int(g("insn_count"), f"{w}.insn_count", 0, MAX_INSNS),
                    macs=f.int(g("macs"), f"{w}.macs", 0, 1 << 62), note=f.str(g("note"), f"{w}.note", 1 << 16))

    @classmethod
    def load(cls, path: str | Path, config: AccelConfig | None = None):
        """Read a module file; with `config`, refuse a module built for another config."""
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ModuleFormatError(f"cannot read module {path}: {e.strerror}") from None
        return cls.from_bytes(data, str(path), config)

    # ---- checks before anything runs ----------------------------------------------------------
    def validate(self, source: str | None = None) -> dict[str, tuple]:
        """Check every cross-reference and bound: segments and tensors inside the arena, tensor ids,
        constants, accelerator programs inside DRAM, each llvm step against its kernel's signature
        (a function the verified IR defines; every buffer passed holds at least the bytes the IR's
        parameter declares, so a header cannot point a kernel at a smaller buffer), native steps'
        shapes. Returns {kernel symbol: bytes per parameter}. Raises ModuleFormatError naming the
        step and field."""
        src = source or f"module '{self.name}'"

        def fail(msg):
            raise ModuleFormatError(f"{src}: {msg}")
        cfg = self.config
        limit = MAX_DRAM_BYTES if cfg is None else min(MAX_DRAM_BYTES, 1 << cfg.dram_addr_width)
        if not 0 <= self.dram_bytes <= limit:
            fail(f"dram_bytes = {self.dram_bytes} is out of range 0..{limit}")
        for k, (addr, data) in enumerate(self.segments):
            if addr < 0 or addr + len(data) > self.dram_bytes:
                fail(f"segments[{k}] at {addr:#x} (+{len(data)} bytes) lies outside the {self.dram_bytes}-byte arena")
        nt = len(self.tensors)
        for k, t in enumerate(self.tensors):
            if t.dtype not in DTYPES or len(t.shape) > MAX_RANK or any(d < 0 for d in t.shape):
                fail(f"tensors[{k}] ('{t.name}'): bad type {t.dtype}{list(t.shape)}")
            isz = np.dtype(t.dtype).itemsize
            if t.addr < 0 or t.addr % isz or t.addr + t.nbytes > self.dram_bytes:
                fail(f"tensors[{k}] ('{t.name}') at {t.addr:#x} (+{t.nbytes} bytes) lies outside the "
                     f"{self.dram_bytes}-byte arena or is not aligned to its {isz}-byte elements")
        for key, rows in (("inputs", self.inputs), ("outputs", self.outputs)):
            names = [r["name"] for r in rows]
            if len(set(names)) != len(names):
                fail(f"{key}: repeated name")
            for k, r in enumerate(rows):
                if not 0 <= r["tensor"] < nt:
                    fail(f"{key}[{k}].tensor = {r['tensor']} is out of range 0..{nt - 1}")
        for n, a in self.consts.items():
            if not isinstance(a, np.ndarray) or str(a.dtype) not in DTYPES or a.ndim > MAX_RANK:
                fail(f"constant {n!r}: type {getattr(a, 'dtype', type(a).__name__)} is not a plain numeric array")
        exports: dict[str, tuple] = {}
        sigs: dict[str, list] = {}
        for k, ks in enumerate(self.kernels):
            try:
                v = verify_ir(ks.ir, f"kernel module {k}")
            except KernelIRError as e:
                fail(str(e))
            for sym, n in v.exports.items():
                if sym in exports:
                    fail(f"kernel module {k}: function '{sym}' is defined by two kernel modules")
                exports[sym] = n
            for sym, sig in ks.signatures.items():
                if sym not in v.exports:
                    fail(f"kernels[{k}].signatures: {_short(sym)} is not a kernel function the IR defines "
                         f"(void, pointer parameters)")
                if len(sig) != len(v.exports[sym]):
                    fail(f"kernels[{k}].signatures.{sym}: {len(sig)} parameters, the IR's function takes "
                         f"{len(v.exports[sym])}")
                sigs[sym] = sig
        for k, s in enumerate(self.steps):
            self._check_step(k, s, sigs, exports, fail)
        try:   # the build target and every plug-in the steps call: registered, of a version they accept
            why = check_versions(self.target, self.target_versions, self.plugin_targets())
        except TargetError as e:
            fail(str(e))
        if why:
            fail(f"module {why}")
        return exports

    def _check_step(self, k: int, s: Step, sigs: dict, exports: dict, fail) -> None:
        w = f"step {k} ('{s.name}')"
        nt = len(self.tensors)
        if s.kind not in KINDS:
            fail(f"{w}: kind {_short(s.kind)}; kinds are {', '.join(KINDS)}")
        for t in [s.output, *s.inputs, *(a[1] for a in s.args if a[0] == "t")]:
            if not isinstance(t, int) or not 0 <= t < nt:
                fail(f"{w}: tensor id {_short(t)} is out of range 0..{nt - 1}")
        for a in s.args:
            if a[0] == "c" and a[1] not in self.consts:
                fail(f"{w}: constant {_short(a[1])} is not in the module")
            if a[0] not in ("t", "c"):
                fail(f"{w}: argument {_short(a)} is neither a tensor nor a constant")
        out = self.tensors[s.output]
        if s.kind == "accel":
            if self.config is None:
                fail(f"{w}: an accelerator step in a module with no config")
            end = s.insn_addr + s.insn_count * INSN_BYTES
            if s.insn_count < 1 or s.insn_addr % INSN_BYTES or end > self.dram_bytes:
                fail(f"{w}: program at {s.insn_addr:#x} ({s.insn_count} instructions) is empty, misaligned or "
                     f"outside the {self.dram_bytes}-byte DRAM image")
            if not any(a <= s.insn_addr and end <= a + len(d) for a, d in self.segments):
                fail(f"{w}: program at {s.insn_addr:#x} ({s.insn_count} instructions) is not inside one segment "
                     f"of the module's DRAM image")
            self._check_warm(w, s, fail)
        elif s.kind == "llvm":
            if s.symbol not in sigs:
                fail(f"{w}: kernel {_short(s.symbol)} is not a function defined in the module's kernel IR")
            sig = sigs[s.symbol]
            have = [self._arg_type(a) for a in s.args] + [(tuple(out.shape), out.dtype)]
            if len(have) != len(sig):
                fail(f"{w}: kernel {s.symbol} takes {len(sig)} arguments, the step passes {len(have)}")
            for j, ((shape, dtype), (wshape, wdtype), need) in enumerate(zip(have, sig, exports[s.symbol])):
                if math.prod(shape) != math.prod(wshape) or dtype != wdtype:   # a kernel may view a reshape
                    fail(f"{w}: argument {j} is {dtype}{list(shape)}, kernel {s.symbol} takes "
                         f"{wdtype}{list(wshape)}")
                nbytes = math.prod(shape) * np.dtype(dtype).itemsize
                if need is None and nbytes:
                    fail(f"{w}: kernel {s.symbol} parameter {j} declares no size (dereferenceable) in its IR")
                if need is not None and nbytes < need:
                    fail(f"{w}: argument {j} holds {nbytes} bytes, kernel {s.symbol}'s IR accesses {need}")
            lo, hi = out.addr, out.addr + out.nbytes
            for a in s.args:
                t = self.tensors[a[1]] if a[0] == "t" else None
                if t is not None and t.nbytes and out.nbytes and t.addr < hi and lo < t.addr + t.nbytes:
                    fail(f"{w}: output tensor {s.output} overlaps argument tensor {a[1]} (kernels take "
                         f"distinct buffers)")
        elif s.kind == "native":
            self._check_native(w, s, fail)
        elif s.kind == "gpu":
            self._check_gpu(w, s, fail)
        elif s.kind == "plugin":
            try:
                t, kernel = plugin_kernel(s.symbol)
                rt = resolve_target(t)
            except TargetError as e:
                fail(f"{w}: {e}")
            if kernel not in rt.kernels:
                fail(f"{w}: target {t!r} has no kernel {_short(kernel)}; its kernels are "
                     f"{', '.join(rt.kernels) or 'none'}")

    def _check_warm(self, w: str, s: Step, fail) -> None:
        """An accelerator step's program for runs with its weights resident: both attrs or neither,
        ints, inside one segment of the image, as the step's own program."""
        keys = [k for k in ("warm_insn_addr", "warm_insn_count") if k in s.attrs]
        if not keys:
            return
        if len(keys) != 2:
            other = "warm_insn_count" if keys[0] == "warm_insn_addr" else "warm_insn_addr"
            fail(f"{w}: attrs has {keys[0]} without {other}")
        addr, count = s.attrs["warm_insn_addr"], s.attrs["warm_insn_count"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (addr, count)):
            fail(f"{w}: attrs warm_insn_addr/warm_insn_count = {_short(addr)}/{_short(count)} must be integers")
        end = addr + count * INSN_BYTES
        if not 1 <= count <= MAX_INSNS or addr < 0 or addr % INSN_BYTES or end > self.dram_bytes \
                or not any(a <= addr and end <= a + len(d) for a, d in self.segments):
            fail(f"{w}: resident-weights program at {addr:#x} ({count} instructions) is empty, misaligned or not "
                 f"inside one segment of the module's DRAM image")

    def _check_gpu(self, w: str, s: Step, fail) -> None:
        """A GPU kernel step: well-formed launch attributes, arguments matching its parameters."""
        why = check_gpu_attrs(s.attrs)
        if why:
            fail(f"{w}: {why}")
        out = self.tensors[s.output]
        have = [self._arg_type(a) for a in s.args] + [(tuple(out.shape), out.dtype)]
        want = s.attrs["params"]
        if len(have) != len(want):
            fail(f"{w}: GPU kernel takes {len(want)} arguments, the step passes {len(have)}")
        for j, ((shape, dtype), (wshape, wdtype)) in enumerate(zip(have, want)):
            if math.prod(shape) != math.prod(wshape) or dtype != wdtype:
                fail(f"{w}: argument {j} is {dtype}{list(shape)}, the GPU kernel takes {wdtype}{list(wshape)}")

    def _arg_type(self, a) -> tuple[tuple[int, ...], str]:
        if a[0] == "t":
            t = self.tensors[a[1]]
            return tuple(t.shape), t.dtype
        c = self.consts[a[1]]
        return tuple(c.shape), str(c.dtype)

    def _check_native(self, w: str, s: Step, fail) -> None:
        """pack/unpack: the output must hold exactly what the conversion of the input gives."""
        if s.op not in NATIVE_OPS:
            fail(f"{w}: native op {_short(s.op)}; native ops are {', '.join(NATIVE_OPS)}")
        if len(s.args) != 1 or s.args[0][0] != "t":
            fail(f"{w}: native {s.op} takes one tensor argument")
        shape = tuple(self.tensors[s.args[0][1]].shape)
        attrs = _decode_attrs(s.attrs)
        out = self.tensors[s.output]
        if s.op == "pack":
            blk = attrs.get("block")
            if not isinstance(blk, (list, tuple)) or len(blk) != 2 or \
                    not all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 4096 for b in blk):
                fail(f"{w}: attrs.block = {_short(blk)}; expected two integers 1..4096")
            if len(shape) < 2:
                fail(f"{w}: pack needs an input of rank 2 or more, got {list(shape)}")
            want = (-(-shape[0] // blk[0]), -(-shape[1] // blk[1]), *shape[2:], blk[0], blk[1])
        else:
            crop = attrs.get("shape")
            if len(shape) < 4:
                fail(f"{w}: unpack needs a blocked input (rank 4 or more), got {list(shape)}")
            r = len(shape) - 4
            full = (shape[0] * shape[-2], shape[1] * shape[-1], *shape[2:2 + r])
            if crop is None:
                want = full
            elif isinstance(crop, (list, tuple)) and len(crop) >= 2 and \
                    all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in crop[:2]):
                want = (min(crop[0], full[0]), min(crop[1], full[1]), *full[2:])
            else:
                fail(f"{w}: attrs.shape = {_short(crop)}; expected null or at least two sizes")
        if math.prod(want) != math.prod(out.shape):
            fail(f"{w}: {s.op} of {list(shape)} gives {list(want)}, the output tensor is {list(out.shape)}")


TRUST_PTX_ENV = "ACCEL_TRUST_PTX"


def _refuse_untrusted_ptx(module, source: str) -> None:
    """PTX is GPU machine code the kit cannot verify (OpenCL C is verified, CPU kernels travel as
    verified IR): a file's PTX runs only when the user says they trust the file."""
    ptx = [s.name for s in module.steps if s.kind == "gpu" and isinstance(s.attrs, dict) and s.attrs.get("lang") == "ptx"]
    if ptx and os.environ.get(TRUST_PTX_ENV) != "1":
        raise ModuleFormatError(f"{source}: {len(ptx)} step(s) carry PTX kernels (first: '{ptx[0]}'), which the kit "
                                f"cannot verify on load; recompile the model here (accel compile --target cuda), or "
                                f"set {TRUST_PTX_ENV}=1 if you trust this file")


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


# ---- the kernel library ------------------------------------------------------------------------
def load_library(kernels: list[KernelSource]):
    """The module's kernels verified, compiled here (or taken from the per-user cache) and loaded:
    a kernel_cache.KernelLibrary whose function(symbol) reaches only functions the IR defines."""
    try:
        return load_kernels([k.ir for k in kernels])
    except KernelIRError as e:
        raise ModuleFormatError(str(e)) from None
    except (KernelBuildError, KernelCacheError) as e:
        raise ExecutorError(str(e)) from None


#: where a container's CPU quota is read: cgroup v2, then v1 (quota and period in microseconds)
CGROUP_CPU_FILES = ("/sys/fs/cgroup/cpu.max",
                    ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def cgroup_cpu_limit(files=CGROUP_CPU_FILES) -> int | None:
    """CPUs the container's quota allows (rounded up), or None without a quota. A quota below the
    CPUs the process sees is why helper threads get descheduled in containers."""
    v2, (v1_quota, v1_period) = files
    try:
        quota, _, period = open(v2).read().strip().partition(" ")
    except OSError:
        try:
            quota, period = open(v1_quota).read().strip(), open(v1_period).read().strip()
        except OSError:
            return None
    try:
        q, p = int(quota), int(period)
    except ValueError:     # "max": no quota
        return None
    return max(1, math.ceil(q / p)) if q > 0 and p > 0 else None


#: start alignment of the CPU kernels' buffers: a cache line, the widest vector (AVX-512)
ALIGN = 64


def aligned_zeros(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """Zeroed bytes starting on an `align` boundary: numpy's own allocations are 16-byte aligned,
    and a 64-byte vector load or store that straddles two cache lines costs about twice as much."""
    raw = np.zeros(nbytes + align, np.uint8)
    off = -raw.ctypes.data % align
    return raw[off:off + nbytes]


def aligned(a: np.ndarray, align: int = ALIGN) -> np.ndarray:
    """`a` itself when C-contiguous and aligned, else an aligned copy."""
    if a.flags.c_contiguous and a.ctypes.data % align == 0:
        return a
    out = aligned_zeros(a.nbytes, align).view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def default_num_threads() -> int:
    """Threads for CPU kernels: $KIT_NUM_THREADS, else the CPUs this process may run on, capped by
    a container's CPU quota."""
    env = os.environ.get("KIT_NUM_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ExecutorError(f"KIT_NUM_THREADS={env!r}: expected a positive integer") from None
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return min(cpus, limit) if limit else cpus


# ---- the executor ------------------------------------------------------------------------------
class Executor:
    """Runs a ModuleImage (or CompiledModule) on a driver.

    Executor(module, driver="fsim" | "tsim" | "rtl" | Driver, device=None, num_threads=None).
    A module without accelerator steps needs no device (its arena is plain host memory).
    run(inputs, progress=None) -> {name: array}; inputs a dict by name or a list in input order;
    progress(k, n, step_name) is called before each step. `profile` holds the last run's rows."""

    def __init__(self, module: ModuleImage, driver="fsim", device=None, num_threads: int | None = None,
                 **driver_options):
        self.module = m = module
        self.device = None
        self._last: tuple[list[float], list] = ([], [])
        self._accel_steps = [k for k, s in enumerate(m.steps) if s.kind == "accel"]   # results keeps theirs
        self._profile: list[dict] | None = []
        m.validate()   # nothing is allocated or run for a module that fails its checks
        if m.count("accel"):
            if m.config is None:
                raise ExecutorError(f"module '{m.name}' has accelerator steps but no config")
            if device is None:
                need = max(m.dram_bytes, 4096)
                device = Device(m.config, driver=driver, dram_bytes=need, **driver_options)
            elif device.cfg.digest() != m.config.digest():
                raise ExecutorError(f"module '{m.name}' was compiled for config {m.config.digest()}, the device has "
                                    f"{device.cfg.digest()}; recompile the model for the device's config")
            if device.memory.nbytes < m.dram_bytes:
                raise ExecutorError(f"module '{m.name}' needs {m.dram_bytes} bytes of DRAM, the device has "
                                    f"{device.memory.nbytes}")
            self.device = device
            self.arena = device.memory.array
            self.driver_name = device.driver.name if device.driver is not None else None
        else:
            self.arena = aligned_zeros(max(m.dram_bytes, 64))
            self.driver_name = None
        for addr, data in m.segments:
            self.arena[addr:addr + len(data)] = np.frombuffer(data, np.uint8)
        self.views = [self._view(t) for t in m.tensors]
        # this executor's claim on the weights its accelerator steps leave resident (Device.weights_owner)
        self._weights = object()
        self.warm = False   # whether the last run found this executor's resident weights on chip
        self.resident = self.device is not None and any(warm_program(s) for s in m.steps) and \
            getattr(self.device.driver, "keeps_buffers", False)
        self.lib = None
        if m.kernels:
            self.lib = load_library(m.kernels)
            self.lib.lib.kit_set_num_threads(ctypes.c_int(num_threads or default_num_threads()))
        # GPU steps keep tensors on the device; CPU steps fetch what they read (host_runtime.gpu)
        self.gpu = DeviceTensors(self.views, m.consts, [(t.addr, t.nbytes) for t in m.tensors]) \
            if m.count("gpu") else None
        self._consts: dict[str, np.ndarray] = {}   # kernel constants, 64-byte aligned (aligned())
        # id(llvm step) -> (function address, argument pointers, arrays); by object, as names may repeat
        self._kernel_ptrs: dict[int, tuple] = {}
        self._calls = [self._prepare(s) for s in m.steps]
        self._row_target = [plugin_kernel(s.symbol)[0] if s.kind == "plugin" else
                            "accel" if s.kind == "accel" else "gpu" if s.kind == "gpu" else "cpu" for s in m.steps]
        if self.gpu is not None:
            self._calls = [c if s.kind == "gpu" else self.gpu.host_step(c, [a[1] for a in s.args if a[0] == "t"],
                                                                         s.output)
                           for s, c in zip(m.steps, self._calls)]
        self._segments = self._batch_kernel_steps()

    def _batch_kernel_steps(self) -> list:
        """The lean run's segments: ("call", k) runs step k from Python; ("batch", k0, k1, runner)
        runs steps k0..k1-1, each a CPU kernel, in one call into the runtime (kit_run_steps): a
        ctypes call costs about a microsecond, as much as a small kernel."""
        steps = self.module.steps
        batchable = [self.gpu is None and s.kind == "llvm" and id(s) in self._kernel_ptrs and
                     len(self._kernel_ptrs[id(s)][1]) <= RUN_STEPS_MAX_ARGS for s in steps]
        segments, k = [], 0
        while k < len(steps):
            end = k
            while end < len(steps) and batchable[end]:
                end += 1
            if end - k < 2:
                segments.append(("call", k))
                k += 1
                continue
            segments.append(("batch", k, end, self._step_runner([self._kernel_ptrs[id(s)] for s in steps[k:end]])))
            k = end
        return segments

    def _step_runner(self, kernels: list[tuple]) -> Callable[[], np.ndarray]:
        """One call that runs the kernels in order; returns each one's time (ns)."""
        n = len(kernels)
        fns = (ctypes.c_void_p * n)(*[f for f, _, _ in kernels])
        nargs = (ctypes.c_int * n)(*[len(p) for _, p, _ in kernels])
        flat = [p for _, ptrs, _ in kernels for p in ptrs]
        args = (ctypes.c_void_p * len(flat))(*flat)
        ns = np.zeros(n, np.int64)
        run = self.lib.lib.kit_run_steps
        run.restype = ctypes.c_int
        run.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        keep = (fns, nargs, args, ns, [arrays for _, _, arrays in kernels])
        ns_ptr = ns.ctypes.data

        def call():
            done = run(n, fns, nargs, args, ns_ptr)
            if done != n:
                raise ExecutorError(f"kernel batch stopped at its step {done} of {n}: argument count out of range")
            return ns
        call.keep = keep   # the arrays behind the pointers live as long as the runner
        return call

    def _view(self, t: TensorSpec) -> np.ndarray:
        if t.addr < 0 or t.addr + t.nbytes > self.arena.size:
            raise ExecutorError(f"tensor '{t.name}' at {t.addr:#x} (+{t.nbytes} bytes) lies outside the "
                                f"{self.arena.size}-byte arena")
        return self.arena[t.addr:t.addr + t.nbytes].view(t.dtype).reshape(t.shape)

    def _arg(self, a):
        kind, ref = a
        if kind == "t":
            return self.views[ref]
        if kind == "c":
            c = self._consts.get(ref)
            if c is None:
                c = self._consts[ref] = aligned(self.module.consts[ref])
            return c
        raise ExecutorError(f"bad step argument {a!r}")

    def _prepare(self, s: Step) -> Callable[[], Any]:
        out = self.views[s.output]
        if s.kind == "accel":
            if self.device is None or self.device.driver is None:
                raise ExecutorError(f"step '{s.name}' runs on the accelerator; give the executor a driver")
            dev = self.device
            warm = warm_program(s)
            if warm is None or not getattr(dev.driver, "keeps_buffers", False):
                return lambda: dev.run(s.insn_addr, s.insn_count, owner=self._weights)

            def call():   # the program without the weight loads once this executor's weights are on chip
                if dev.weights_owner is self._weights:
                    return dev.run(*warm, owner=self._weights)
                return dev.run(s.insn_addr, s.insn_count, owner=self._weights)
            return call
        if s.kind == "llvm":
            if self.lib is None or s.symbol not in self.lib.exports:
                raise ModuleFormatError(f"step '{s.name}': kernel {s.symbol!r} is not a function defined in the "
                                        f"module's kernel IR")
            fn = self.lib.function(s.symbol)   # only a function the verified IR defines, never libc's
            # np.require, not ascontiguousarray: that turns a 0-d tensor into a 1-d copy
            arrays = [np.require(self._arg(a), requirements='C') for a in s.args] + [out]
            for a, arr in zip(s.args, arrays):
                if a[0] == "t" and arr is not self.views[a[1]]:
                    raise ExecutorError(f"step '{s.name}': argument tensor {a[1]} is not contiguous")
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p] * len(arrays)
            ptrs = [a.ctypes.data for a in arrays]
            keep = arrays  # the constants' arrays must outlive the pointers
            self._kernel_ptrs[id(s)] = (ctypes.cast(fn, ctypes.c_void_p).value, ptrs, keep)

            def call():
                fn(*ptrs)
                return keep
            return call
        if s.kind in ("native", "numpy", "plugin"):
            if s.kind == "plugin":   # validate() checked that the registered target has this kernel
                t, kernel = plugin_kernel(s.symbol)
                rt = resolve_target(t)
                impl, check = rt.kernels[kernel], rt.checks.get(kernel)
            else:
                table = NATIVE_OPS if s.kind == "native" else HOST_OPS
                impl = table.get(s.op)
                check = HOST_OP_CHECKS.get(s.op) if s.kind == "numpy" else None
            if impl is None:
                raise ExecutorError(f"step '{s.name}' needs host op {s.op!r}, which is not registered "
                                    f"({'import compiler.module, which registers the graph ops' if s.kind == 'numpy' else 'unknown native op'})")
            attrs = _decode_attrs(s.attrs)
            ins = [a for a in s.args]
            if check is not None:
                types = [self.module.consts[a[1]] if a[0] == "c" else self.module._arg_type(a) for a in ins]
                try:
                    why = check(attrs, types, (tuple(out.shape), str(out.dtype)))
                except Exception as e:  # noqa: BLE001 - the op's own checks reject the attributes
                    why = " ".join(str(e).split())[:300] or type(e).__name__
                if why:
                    raise ModuleFormatError(f"step '{s.name}' ({s.op}): {why}")

            def call():
                try:
                    y = impl(attrs, *[self._arg(a) for a in ins])
                    out[...] = np.asarray(y).reshape(out.shape)
                except Exception as e:  # noqa: BLE001 - bad data at run time (a gather index out of
                    # range) or attributes a file got wrong: one error naming the step, whatever the type
                    why = str(e)[:300] if isinstance(e, (IndexError, ValueError)) else f"{type(e).__name__}: {str(e)[:300]}"
                    raise ExecutorError(f"step '{s.name}' ({s.op}): {why}") from None
            return call
        if s.kind == "gpu":
            return self._prepare_gpu(s, out)
        raise ExecutorError(f"step '{s.name}': unknown kind {s.kind!r}; kinds are {', '.join(KINDS)}")

    def _prepare_gpu(self, s: Step, out: np.ndarray) -> Callable[[], Any]:
        """A GPU kernel step: its source compiled by the device's driver (host_runtime.gpu); the
        device is opened on first use, so a module without GPU steps needs no GPU."""
        try:
            dev = open_device(s.attrs["lang"])
            return self.gpu.gpu_step(dev, s.attrs, [tuple(a) for a in s.args], s.output)
        except GpuError as e:
            raise ExecutorError(f"step '{s.name}' ({s.op}): {e}") from None

    def set_inputs(self, inputs) -> None:
        m = self.module
        names = m.input_names
        if isinstance(inputs, dict) and len(inputs) == len(names) and all(n in inputs for n in names):
            values = [inputs[n] for n in names]
        elif isinstance(inputs, dict):
            unknown = sorted(set(inputs) - set(names))
            if unknown:
                raise ExecutorError(f"module '{m.name}' has no input(s) {', '.join(unknown)}; inputs are "
                                    f"{', '.join(names)}")
            missing = [n for n in names if n not in inputs]
            if missing:
                raise ExecutorError(f"no value given for input(s) {', '.join(missing)} of module '{m.name}'")
            values = [inputs[n] for n in names]
        else:
            values = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            if len(values) != len(m.inputs):
                raise ExecutorError(f"module '{m.name}' takes {len(m.inputs)} input(s) "
                                    f"({', '.join(names)}), got {len(values)}")
        for spec, v in zip(m.inputs, values):
            view = self.views[spec["tensor"]]
            if np.shape(v) != view.shape:
                raise ExecutorError(f"input '{spec['name']}': expected shape {list(view.shape)}, "
                                    f"got {list(np.shape(v))}")
            np.copyto(view, v, casting="unsafe")
            if self.gpu is not None:
                self.gpu.host_wrote(spec["tensor"])

    def run(self, inputs, progress: Callable[[int, int, str], None] | None = None,
            keep: bool = False) -> dict[str, np.ndarray]:
        """Run every step; keep=True also copies each step's output into `values` (by tensor name),
        since the memory plan lets later steps overwrite it. `results` then holds per step the
        driver's RunResult (None for CPU steps): a timing driver's counters and, made with
        trace=True, its timeline (sim.trace.model_layers turns them into a per-layer view).
        A module with weights resident across inferences runs the programs that load them the first
        time (or after anything else ran on the device) and, once a run completed, the ones that
        skip those loads (`warm` says which the last run was)."""
        if self.resident:
            self.warm = self.device.weights_owner is self._weights
            try:
                out = self._run(inputs, progress, keep)
            except BaseException:
                self.device.weights_owner = None
                raise
            self.device.weights_owner = self._weights
            return out
        self.warm = False
        return self._run(inputs, progress, keep)

    def _run(self, inputs, progress, keep: bool) -> dict[str, np.ndarray]:
        self.set_inputs(inputs)
        self.values: dict[str, np.ndarray] = {}
        m = self.module
        n = len(m.steps)
        times, results = [0.0] * n, [None] * n
        perf = time.perf_counter
        if progress is None and not keep:
            # the lean loop: a small model's whole run is tens of microseconds, so per-step
            # bookkeeping waits until `profile` is read
            calls = self._calls
            for seg in self._segments:
                if seg[0] == "batch":
                    _, k0, k1, runner = seg
                    times[k0:k1] = (runner() * 1e-9).tolist()
                    continue
                k = seg[1]
                t0 = perf()
                results[k] = calls[k]()
                times[k] = perf() - t0
        else:
            # tensors no step writes as a whole (a concat its producers wrote in place, plan_memory's
            # elided ones): kept as the first step that reads them finds them
            unstepped = {t for s in m.steps for t in s.inputs} - {s.output for s in m.steps} - \
                {spec["tensor"] for spec in m.inputs} if keep else set()
            for k, (s, call) in enumerate(zip(m.steps, self._calls)):
                if progress is not None:
                    progress(k, n, s.name)
                for t in s.inputs if keep else ():
                    if t in unstepped and m.tensors[t].name not in self.values:
                        if self.gpu is not None:
                            self.gpu.to_host(t)
                        self.values[m.tensors[t].name] = self.views[t].copy()
                t0 = perf()
                results[k] = call()
                times[k] = perf() - t0
                if keep:
                    if self.gpu is not None:
                        self.gpu.to_host(s.output)
                    self.values[m.tensors[s.output].name] = self.views[s.output].copy()
            if progress is not None:
                progress(n, n, "done")
        self.results = [None] * n
        for k in self._accel_steps:
            self.results[k] = results[k]
        self._last, self._profile = (times, self.results), None
        if self.gpu is not None:
            for o in m.outputs:
                self.gpu.to_host(o["tensor"])
        return {o["name"]: self.views[o["tensor"]].copy() for o in m.outputs}

    @property
    def profile(self) -> list[dict]:
        """The last run's rows, one per step: name, op, impl, target, time_s, macs, and for
        accelerator steps the driver's counters (built on first read)."""
        if self._profile is None:
            self._profile = self._profile_rows(*self._last)
        return self._profile

    def _profile_rows(self, times: list[float], results: list) -> list[dict]:
        cfg = self.module.config
        rows = []
        for k, (s, dt, r) in enumerate(zip(self.module.steps, times, results)):
            row = {"name": s.name, "op": s.op, "impl": s.kind, "target": self._row_target[k], "time_s": dt,
                   "macs": s.macs}
            if s.note:
                row["note"] = s.note
            if s.kind == "accel":
                dram = r.stats.get("dram_bytes", {})   # the counter schema nests them; fsim's stats do not
                row.update(insns=r.insn_count, cycles=r.cycles, driver=r.driver, gemm_uops=r.stats.get("gemm_uops"),
                           alu_uops=r.stats.get("alu_uops"), bytes_read=r.stats.get("bytes_read", dram.get("read")),
                           bytes_written=r.stats.get("bytes_written", dram.get("written")))
                if r.cycles:
                    row["latency_s"] = r.cycles / (cfg.clock_mhz * 1e6)
                    row["utilization"] = s.macs / (r.cycles * cfg.macs_per_cycle) if s.macs else 0.0
            rows.append(row)
        return rows

    def close(self) -> None:
        if self.device is not None:
            self.device.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def warm_program(s: Step) -> tuple[int, int] | None:
    """(address, count) of an accelerator step's program for runs that find its weights resident
    (attrs warm_insn_addr/warm_insn_count), None where it has none."""
    if s.kind != "accel" or "warm_insn_addr" not in s.attrs:
        return None
    return int(s.attrs["warm_insn_addr"]), int(s.attrs["warm_insn_count"])


def run_module(module: ModuleImage, inputs, driver="fsim", **kw) -> tuple[dict[str, np.ndarray], list[dict]]:
    """One-shot: (outputs, profile) of running `module` on `driver`."""
    with Executor(module, driver=driver, **kw) as ex:
        outs = ex.run(inputs)
        return outs, ex.profile


def profile_summary(rows: list[dict], config: AccelConfig | None = None) -> dict:
    """Totals of a profile: CPU time, accelerator instructions/cycles, MACs per target."""
    acc = [r for r in rows if r["target"] == "accel"]
    cpu = [r for r in rows if r["target"] == "cpu"]
    cycles = [r.get("cycles") for r in acc]
    have_cycles = bool(acc) and all(c for c in cycles)
    out = {"steps": len(rows), "cpu_time_s": sum(r["time_s"] for r in cpu),
           "accel_wall_s": sum(r["time_s"] for r in acc), "accel_insns": sum(r.get("insns") or 0 for r in acc),
           "accel_macs": sum(r["macs"] for r in acc), "cpu_macs": sum(r["macs"] for r in cpu),
           "accel_cycles": sum(cycles) if have_cycles else None}
    gpu = [r for r in rows if r["target"] == "gpu"]
    if gpu:   # --target opencl|cuda: kernel launches with their copies in and out
        out.update(gpu_time_s=sum(r["time_s"] for r in gpu), gpu_macs=sum(r["macs"] for r in gpu))
    for r in rows:   # plug-in targets' kernels: plugin_time_s / plugin_macs by target name
        if r.get("impl") == "plugin":
            out.setdefault("plugin_time_s", {}).setdefault(r["target"], 0.0)
            out["plugin_time_s"][r["target"]] += r["time_s"]
            out.setdefault("plugin_macs", {}).setdefault(r["target"], 0)
            out["plugin_macs"][r["target"]] += r["macs"]
    if have_cycles and config is not None:
        out["accel_latency_s"] = out["accel_cycles"] / (config.clock_mhz * 1e6)
        out["accel_utilization"] = out["accel_macs"] / (out["accel_cycles"] * config.macs_per_cycle)
    return out


def format_profile(rows: list[dict], config: AccelConfig | None = None) -> str:
    """The profile as a text table (the CLI prints it)."""
    lines = [f"{'step':30} {'op':22} {'target':6} {'impl':6} {'time ms':>9} {'MACs':>11} {'insns':>7} "
             f"{'cycles':>10} {'util':>6}  why on the CPU"]
    for r in rows:
        cyc = r.get("cycles")
        util = r.get("utilization")
        lines.append((f"{r['name'][:30]:30} {r['op'][:22]:22} {r['target']:6} {r['impl']:6} {r['time_s'] * 1e3:9.3f} "
                      f"{r['macs']:11d} {r.get('insns') if r.get('insns') is not None else '':>7} "
                      f"{cyc if cyc else '':>10} {f'{util:.0%}' if util is not None else '':>6}  "
                      f"{r.get('note', '')}").rstrip())
    s = profile_summary(rows, config)
    tail = (f"total: {s['steps']} steps, CPU {s['cpu_time_s'] * 1e3:.3f} ms, "
            + (f"GPU {s['gpu_time_s'] * 1e3:.3f} ms for {s['gpu_macs']} MACs, " if "gpu_time_s" in s else "")
            + "".join(f"{t} {ts * 1e3:.3f} ms, " for t, ts in s.get("plugin_time_s", {}).items())
            + f"accelerator {s['accel_insns']} instructions for {s['accel_macs']} MACs")
    if s.get("accel_cycles"):
        tail += f", {s['accel_cycles']} cycles"
        if "accel_latency_s" in s:
            tail += f" = {s['accel_latency_s'] * 1e3:.3f} ms at {config.clock_mhz:g} MHz, utilization " \
                    f"{s['accel_utilization']:.0%}"
    elif s["accel_insns"]:
        tail += " (this driver reports no cycles; use --driver tsim)"
    lines.append(tail)
    return "\n".join(lines)
