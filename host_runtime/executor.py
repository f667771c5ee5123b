"""Executing compiled modules: the module file format and the Executor that runs one on a driver.

A module is data (built by compiler.build_model): one arena of bytes that is the device DRAM
(weights, micro-op kernels and instruction programs placed at build time, activations at the
addresses of the memory plan), a list of steps, and a shared library of CPU kernels. Steps run
in order and exchange tensors only through the arena:
  accel   an instruction program already in DRAM (insn_addr, insn_count), run on the driver;
  llvm    a CPU kernel of the module's shared library (LLVM object code linked with the system C
          compiler), called with pointers into the arena and to its bound constants;
  native  a layout conversion the runtime does itself (pack/unpack at accelerator boundaries);
  numpy   a fallback for an op with no compiled kernel: a host op registered by name
          (register_host_op; compiler.module registers the graph IR's NumPy references).
Executor(module, driver="fsim").run(inputs) -> {output name: array}; `profile` then holds one row
per step: name, op, target, impl, time_s, MACs, and for accelerator steps instructions, GEMM and ALU
micro-ops, DRAM bytes read and written (fsim: the data moved; tsim and rtl: bus bytes, instruction
fetch and whole beats included), cycles and utilization (when the driver reports cycles) and the
latency they imply at the config's clock.

File layout (little endian): magic b"ACCMODL\\0", u32 format version, u32 header length, UTF-8
JSON header, then the blobs the header lists (name, offset, size) back to back. Loading checks the
magic, the version and (when asked) the config digest; saving is atomic (temporary file + rename).
This module never imports the compiler (arrows point down: compiler -> host_runtime).
"""
from __future__ import annotations

import ctypes
import hashlib
import io
import json
import logging
import os
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from accel.isa import AccelConfig
from accel.isa.files import write_atomic

from .errors import HostRuntimeError

log = logging.getLogger(__name__)

MAGIC = b"ACCMODL\0"
FORMAT_VERSION = 1
KINDS = ("accel", "llvm", "native", "numpy")


class ModuleFormatError(HostRuntimeError):
    """A module file is unreadable, of another format version, or built for another config."""


class ExecutorError(HostRuntimeError):
    """A module cannot run here (bad inputs, missing host op, library that does not load)."""


# ---- host ops: NumPy-level implementations the runtime calls by name -----------------------------
HOST_OPS: dict[str, Callable[..., np.ndarray]] = {}


def register_host_op(name: str, fn: Callable[..., np.ndarray]) -> None:
    """fn(attrs, *arrays) -> array. Used by steps of kind 'numpy' (the compiler registers its
    reference implementations here when compiler.module is imported)."""
    HOST_OPS[name] = fn


def pack_blocked(x: np.ndarray, block) -> np.ndarray:
    """N C ... -> N' C' ... b0 b1, zero-padding N and C to whole blocks (the accelerator layout)."""
    b0, b1 = block
    n, c = x.shape[:2]
    rest = x.shape[2:]
    n2, c2 = -(-n // b0), -(-c // b1)
    xp = np.zeros((n2 * b0, c2 * b1, *rest), x.dtype)
    xp[:n, :c] = x
    r = len(rest)
    return xp.reshape(n2, b0, c2, b1, *rest).transpose(0, 2, *range(4, 4 + r), 1, 3)


def unpack_blocked(x: np.ndarray, shape) -> np.ndarray:
    """Inverse of pack_blocked, cropping to `shape` (None keeps the padding)."""
    r = x.ndim - 4
    n2, c2, b0, b1 = x.shape[0], x.shape[1], x.shape[-2], x.shape[-1]
    rest = x.shape[2:2 + r]
    y = x.transpose(0, 2 + r, 1, 3 + r, *range(2, 2 + r)).reshape(n2 * b0, c2 * b1, *rest)
    return y if shape is None else y[:shape[0], :shape[1]]


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
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


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


class ModuleImage:
    """A compiled module as data: header fields plus arrays and the kernel library (see module doc).

    name, target ("accel" | "cpu"), config (AccelConfig or None), dram_bytes (arena size),
    segments [(addr, bytes)] (the DRAM image), tensors [TensorSpec], inputs / outputs
    [{"name", "tensor", "shift"}], steps [Step], consts {name: array} (kernel arguments bound at
    build time), library (bytes of a shared object or None), library_target {triple, cpu},
    meta (build reports: memory plan, partition, compile time)."""

    def __init__(self, name: str, target: str, config: AccelConfig | None, dram_bytes: int,
                 segments: list[tuple[int, bytes]], tensors: list[TensorSpec], inputs: list[dict],
                 outputs: list[dict], steps: list[Step], consts: dict[str, np.ndarray] | None = None,
                 library: bytes | None = None, library_target: dict | None = None, meta: dict | None = None):
        self.name, self.target, self.config, self.dram_bytes = name, target, config, int(dram_bytes)
        self.segments, self.tensors, self.inputs, self.outputs = segments, tensors, inputs, outputs
        self.steps, self.consts = steps, dict(consts or {})
        self.library, self.library_target, self.meta = library, dict(library_target or {}), dict(meta or {})

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
        if self.library is not None:
            blobs.append(("library", self.library))
        header = {
            "format": "accel-kit module", "version": FORMAT_VERSION, "name": self.name, "target": self.target,
            "config": None if self.config is None else self.config.to_dict(),
            "config_digest": None if self.config is None else self.config.digest(),
            "dram_bytes": self.dram_bytes, "segments": seg_hdr,
            "tensors": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "addr": t.addr} for t in self.tensors],
            "inputs": self.inputs, "outputs": self.outputs, "steps": [s.to_dict() for s in self.steps],
            "consts": list(self.consts), "library_target": self.library_target, "meta": self.meta,
            "blobs": [],
        }
        off = 0
        for name, data in blobs:
            header["blobs"].append({"name": name, "offset": off, "size": len(data)})
            off += len(data)
        hj = json.dumps(header, default=_json_default).encode()
        return b"".join([MAGIC, struct.pack("<II", FORMAT_VERSION, len(hj)), hj] + [d for _, d in blobs])

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
        if len(data) < 16 or data[:8] != MAGIC:
            raise ModuleFormatError(f"{source}: not a compiled module file (bad magic)")
        version, hlen = struct.unpack("<II", data[8:16])
        if version != FORMAT_VERSION:
            raise ModuleFormatError(f"{source}: module format version {version}, this kit reads version "
                                    f"{FORMAT_VERSION}; recompile the model with this kit")
        try:
            h = json.loads(data[16:16 + hlen].decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModuleFormatError(f"{source}: corrupt module header ({e})") from None
        base = 16 + hlen
        blobs = {}
        for b in h["blobs"]:
            s, e = base + b["offset"], base + b["offset"] + b["size"]
            if e > len(data):
                raise ModuleFormatError(f"{source}: truncated (blob {b['name']} ends at byte {e}, file has {len(data)})")
            blobs[b["name"]] = data[s:e]
        cfg = None if h["config"] is None else AccelConfig.from_dict(h["config"])
        if config is not None:
            if cfg is None:
                raise ModuleFormatError(f"{source}: module was compiled for the CPU only (no accelerator config); "
                                        f"expected config {config.digest()}")
            if cfg.digest() != config.digest():
                diff = {k: (v, config.to_dict().get(k)) for k, v in cfg.to_dict().items() if config.to_dict().get(k) != v}
                raise ModuleFormatError(f"{source}: module was compiled for config {cfg.digest()}, not {config.digest()} "
                                        f"(differs in {', '.join(f'{k}: {a} vs {b}' for k, (a, b) in diff.items())}); "
                                        f"recompile it for this config")
        segments = [(s["addr"], blobs[s["blob"]]) for s in h["segments"]]
        tensors = [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"], t["addr"]) for t in h["tensors"]]
        steps = [Step.from_dict(s) for s in h["steps"]]
        consts = {n: _npy_load(blobs[f"const/{n}"]) for n in h["consts"]}
        obj = cls.__new__(cls)
        ModuleImage.__init__(obj, h["name"], h["target"], cfg, h["dram_bytes"], segments, tensors, h["inputs"],
                             h["outputs"], steps, consts, blobs.get("library"), h["library_target"], h["meta"])
        return obj

    @classmethod
    def load(cls, path: str | Path, config: AccelConfig | None = None):
        """Read a module file; with `config`, refuse a module built for another config."""
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise ModuleFormatError(f"cannot read module {path}: {e.strerror}") from None
        return cls.from_bytes(data, str(path), config)


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


# ---- the kernel library ------------------------------------------------------------------------
_LIBS: dict[str, ctypes.CDLL] = {}


def load_library(data: bytes, target: dict | None = None) -> ctypes.CDLL:
    """dlopen a module's shared library (cached on disk by content hash, once per process)."""
    import platform
    digest = hashlib.sha256(data).hexdigest()[:24]
    if digest in _LIBS:
        return _LIBS[digest]
    arch = (target or {}).get("triple", "").split("-")[0]
    here = platform.machine()
    if arch and here and arch.replace("amd64", "x86_64") != here.replace("amd64", "x86_64"):
        raise ExecutorError(f"the module's CPU kernels are compiled for {target.get('triple')}, this host is {here}; "
                            f"recompile the model here")
    d = Path(os.environ.get("ACCEL_KIT_CACHE", Path(tempfile.gettempdir()) / "accel-kit-kernels"))
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"kernels-{digest}.so"
    if not path.exists():
        write_atomic(path, data)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise ExecutorError(f"cannot load the module's kernel library: {e}") from None
    _LIBS[digest] = lib
    return lib


def default_num_threads() -> int:
    """Threads for CPU kernels: $KIT_NUM_THREADS, else the CPUs this process may run on."""
    env = os.environ.get("KIT_NUM_THREADS")
    if env:
        return max(1, int(env))
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


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
        self.profile: list[dict] = []
        if m.count("accel"):
            from .device import Device
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
            self.arena = np.zeros(max(m.dram_bytes, 64), np.uint8)
            self.driver_name = None
        for addr, data in m.segments:
            self.arena[addr:addr + len(data)] = np.frombuffer(data, np.uint8)
        self.views = [self._view(t) for t in m.tensors]
        self.lib = None
        if m.library is not None:
            self.lib = load_library(m.library, m.library_target)
            setter = getattr(self.lib, "kit_set_num_threads", None)
            if setter is not None:
                setter(ctypes.c_int(num_threads or default_num_threads()))
        self._calls = [self._prepare(s) for s in m.steps]

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
            return self.module.consts[ref]
        raise ExecutorError(f"bad step argument {a!r}")

    def _prepare(self, s: Step) -> Callable[[], Any]:
        out = self.views[s.output]
        if s.kind == "accel":
            if self.device is None or self.device.driver is None:
                raise ExecutorError(f"step '{s.name}' runs on the accelerator; give the executor a driver")
            dev = self.device
            return lambda: dev.run(s.insn_addr, s.insn_count)
        if s.kind == "llvm":
            if self.lib is None:
                raise ExecutorError(f"step '{s.name}' calls kernel {s.symbol} but the module has no library")
            try:
                fn = getattr(self.lib, s.symbol)
            except AttributeError:
                raise ExecutorError(f"step '{s.name}': kernel {s.symbol} is missing from the module's library") from None
            arrays = [np.ascontiguousarray(self._arg(a)) for a in s.args] + [out]
            for a, arr in zip(s.args, arrays):
                if a[0] == "t" and arr is not self.views[a[1]]:
                    raise ExecutorError(f"step '{s.name}': argument tensor {a[1]} is not contiguous")
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p] * len(arrays)
            ptrs = [a.ctypes.data for a in arrays]
            keep = arrays  # the constants' arrays must outlive the pointers

            def call():
                fn(*ptrs)
                return keep
            return call
        if s.kind in ("native", "numpy"):
            table = NATIVE_OPS if s.kind == "native" else HOST_OPS
            impl = table.get(s.op)
            if impl is None:
                raise ExecutorError(f"step '{s.name}' needs host op {s.op!r}, which is not registered "
                                    f"({'import compiler.module, which registers the graph ops' if s.kind == 'numpy' else 'unknown native op'})")
            attrs = _decode_attrs(s.attrs)
            ins = [a for a in s.args]

            def call():
                try:
                    y = impl(attrs, *[self._arg(a) for a in ins])
                except (IndexError, ValueError) as e:   # bad data at run time (a gather index out of range)
                    raise ExecutorError(f"step '{s.name}' ({s.op}): {e}") from None
                out[...] = np.asarray(y).reshape(out.shape)
            return call
        raise ExecutorError(f"step '{s.name}': unknown kind {s.kind!r}; kinds are {', '.join(KINDS)}")

    def set_inputs(self, inputs) -> None:
        m = self.module
        if isinstance(inputs, dict):
            unknown = sorted(set(inputs) - set(m.input_names))
            if unknown:
                raise ExecutorError(f"module '{m.name}' has no input(s) {', '.join(unknown)}; inputs are "
                                    f"{', '.join(m.input_names)}")
            missing = [n for n in m.input_names if n not in inputs]
            if missing:
                raise ExecutorError(f"no value given for input(s) {', '.join(missing)} of module '{m.name}'")
            values = [inputs[n] for n in m.input_names]
        else:
            values = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            if len(values) != len(m.inputs):
                raise ExecutorError(f"module '{m.name}' takes {len(m.inputs)} input(s) "
                                    f"({', '.join(m.input_names)}), got {len(values)}")
        for spec, v in zip(m.inputs, values):
            view = self.views[spec["tensor"]]
            v = np.asarray(v)
            if v.shape != view.shape:
                raise ExecutorError(f"input '{spec['name']}': expected shape {list(view.shape)}, got {list(v.shape)}")
            view[...] = v.astype(view.dtype, copy=False)

    def run(self, inputs, progress: Callable[[int, int, str], None] | None = None,
            keep: bool = False) -> dict[str, np.ndarray]:
        """Run every step; keep=True also copies each step's output into `values` (by tensor name),
        since the memory plan lets later steps overwrite it. `results` then holds per step the
        driver's RunResult (None for CPU steps): a timing driver's counters and, made with
        trace=True, its timeline (sim.trace.model_layers turns them into a per-layer view)."""
        self.set_inputs(inputs)
        self.values: dict[str, np.ndarray] = {}
        m = self.module
        cfg = m.config
        rows = []
        results = []
        n = len(m.steps)
        for k, (s, call) in enumerate(zip(m.steps, self._calls)):
            if progress is not None:
                progress(k, n, s.name)
            t0 = time.perf_counter()
            r = call()
            dt = time.perf_counter() - t0
            if keep:
                self.values[m.tensors[s.output].name] = self.views[s.output].copy()
            results.append(r if s.kind == "accel" else None)
            row = {"name": s.name, "op": s.op, "target": "accel" if s.kind == "accel" else "cpu", "impl": s.kind,
                   "time_s": dt, "macs": s.macs}
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
        if progress is not None:
            progress(n, n, "done")
        self.profile, self.results = rows, results
        return {o["name"]: self.views[o["tensor"]].copy() for o in m.outputs}

    def close(self) -> None:
        if self.device is not None:
            self.device.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
    tail = (f"total: {s['steps']} steps, CPU {s['cpu_time_s'] * 1e3:.3f} ms, accelerator {s['accel_insns']} "
            f"instructions for {s['accel_macs']} MACs")
    if s.get("accel_cycles"):
        tail += f", {s['accel_cycles']} cycles"
        if "accel_latency_s" in s:
            tail += f" = {s['accel_latency_s'] * 1e3:.3f} ms at {config.clock_mhz:g} MHz, utilization " \
                    f"{s['accel_utilization']:.0%}"
    elif s["accel_insns"]:
        tail += " (this driver reports no cycles; use --driver tsim)"
    lines.append(tail)
    return "\n".join(lines)
