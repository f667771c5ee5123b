"""CPU kernels of a compiled model: verified LLVM IR, built here into a per-user cache by content hash.

Why: a compiled model (.accm) is shared like an ONNX file, so opening one must run no native code
that the file chose. The file carries its CPU kernels as LLVM IR text, never machine code:
  verify_ir()      parses the IR, runs the LLVM verifier and admits only what the kit's code
                   generator emits: functions defined in the IR, direct calls (no inline or module
                   assembly, no indirect calls), declared externals from an allow-list (libm, malloc/
                   free/memset/memcpy and the runtime's __kit_parallel_launch, each with its
                   signature), math and memory intrinsics, and no constructors, sections, prologue
                   data, aliases, ifuncs or external globals;
  load_kernels()   compiles the verified IR with this host's LLVM target machine, links it with the
                   kit's own C runtime (RUNTIME_C, the parallel-loop thread pool) and loads the
                   result from the verified bytes (a memfd, so the file checked is the file loaded);
  KernelCache      the per-user cache of linked libraries: $ACCEL_KIT_CACHE, else
                   $XDG_CACHE_HOME/accel-kit, else ~/.cache/accel-kit; directories 0700 and owned by
                   the user (anything else is refused), entries named <key>-<sha256 of content>.so
                   and re-hashed on every load (a wrong one is deleted and rebuilt), least recently
                   used entries pruned beyond a size limit ($ACCEL_KIT_CACHE_MAX_BYTES, default
                   512 MiB). `accel cache info|clear` show and empty it.
What is not claimed: the IR's loads and stores are not proven in bounds (docs/trust.md).
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from .errors import HostRuntimeError

log = logging.getLogger(__name__)


class KernelIRError(HostRuntimeError, ValueError):
    """A module's kernel IR is malformed or uses something outside the allow-list (names what)."""


class KernelBuildError(HostRuntimeError):
    """Verified kernel IR could not be compiled or linked here (no C compiler, LLVM failure)."""


class KernelCacheError(HostRuntimeError):
    """The kernel cache directory or an entry is unsafe to use (owner, permissions, type)."""


class KernelCacheUnavailable(KernelCacheError):
    """The cache directory cannot be created or read (read-only or missing home): kernels are then
    built for this process only, never refused for it."""


#: the runtime symbol kernels call to run a parallel loop: i32 (worker, closure, n)
PARALLEL_LAUNCH = "__kit_parallel_launch"
#: prefix of every function a kernel module makes visible (the code generator's kit_k<n>_<name>)
KERNEL_PREFIX = "kit_"
#: symbols RUNTIME_C defines (an IR may not define them itself)
RUNTIME_SYMBOLS = frozenset({PARALLEL_LAUNCH, "kit_set_num_threads"})

#: the C runtime linked into every kernel library (the kit's own code, never from a file)
RUNTIME_C = r"""
/* Parallel-loop launcher for generated kernels. A launch cuts the loop into up to
   CHUNKS_PER_THREAD chunks per thread, and the calling thread plus a persistent pthread pool take
   chunks from an atomic counter until none is left: worker(chunk, nchunk, closure). A thread that
   is preempted then delays one small chunk, not its whole static share. Nested launches run serially. */
#include <pthread.h>
#include <time.h>
#define CHUNKS_PER_THREAD 4
typedef void (*kit_worker)(int, int, void *);
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER, launch_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_start = PTHREAD_COND_INITIALIZER, cv_done = PTHREAD_COND_INITIALIZER;
static int n_threads = 1, n_started = 0, job_nchunk = 0, job_helpers = 0, pending = 0;
static int next_chunk = 0;
static long generation = 0;
static kit_worker job_fn;
static void *job_closure;
static __thread int in_parallel = 0;

void kit_set_num_threads(int n) { n_threads = n < 1 ? 1 : n; }

static void run_chunks(kit_worker f, void *c, int nchunk) {
  for (;;) {
    int t = __atomic_fetch_add(&next_chunk, 1, __ATOMIC_RELAXED);
    if (t >= nchunk) break;
    f(t, nchunk, c);
  }
}

/* Wait up to SPIN_NS for *v to leave `old` before sleeping: consecutive kernels launch every few
   tens of microseconds, and a condition-variable wake-up costs about as much (as onnxruntime's
   pool, which spins likewise). */
#define SPIN_NS 200000L
static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}
#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#else
#define CPU_RELAX() ((void)0)
#endif
#define SPIN_UNTIL(cond) do { long until_ = now_ns() + SPIN_NS; \
    for (int i_ = 0; !(cond); i_++) { CPU_RELAX(); if ((i_ & 63) == 63 && now_ns() > until_) break; } } while (0)

static void *pool_main(void *arg) {
  int id = (int)(long)arg;
  long seen = 0;
  in_parallel = 1;
  for (;;) {
    SPIN_UNTIL(__atomic_load_n(&generation, __ATOMIC_ACQUIRE) != seen);
    pthread_mutex_lock(&mu);
    while (generation == seen) pthread_cond_wait(&cv_start, &mu);
    seen = generation;
    if (id <= job_helpers) {
      kit_worker f = job_fn; void *c = job_closure; int nc = job_nchunk;
      pthread_mutex_unlock(&mu);
      run_chunks(f, c, nc);
      pthread_mutex_lock(&mu);
      if (__atomic_sub_fetch(&pending, 1, __ATOMIC_ACQ_REL) == 0) pthread_cond_signal(&cv_done);
    }
    pthread_mutex_unlock(&mu);
  }
  return 0;
}

int __kit_parallel_launch(void *fn, void *closure, int n) {
  kit_worker f = (kit_worker)fn;
  int nthread = n < n_threads ? n : n_threads;
  if (nthread <= 1 || in_parallel) {
    f(0, 1, closure);
    return 0;
  }
  int nchunk = n < nthread * CHUNKS_PER_THREAD ? n : nthread * CHUNKS_PER_THREAD;
  pthread_mutex_lock(&launch_mu);
  pthread_mutex_lock(&mu);
  while (n_started < nthread - 1) {
    pthread_t th;
    if (pthread_create(&th, 0, pool_main, (void *)(long)(n_started + 1)) != 0) break;
    pthread_detach(th);
    n_started++;
  }
  if (nthread - 1 > n_started) nthread = n_started + 1;
  job_fn = f; job_closure = closure; job_nchunk = nchunk; job_helpers = nthread - 1;
  pending = nthread - 1; next_chunk = 0;
  __atomic_store_n(&generation, generation + 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&cv_start);
  pthread_mutex_unlock(&mu);
  in_parallel = 1;
  run_chunks(f, closure, nchunk);
  in_parallel = 0;
  SPIN_UNTIL(__atomic_load_n(&pending, __ATOMIC_ACQUIRE) == 0);
  pthread_mutex_lock(&mu);
  while (pending > 0) pthread_cond_wait(&cv_done, &mu);
  pthread_mutex_unlock(&mu);
  pthread_mutex_unlock(&launch_mu);
  return 0;
}
"""


_F, _D = "float", "double"
#: externals a kernel may declare, with the exact LLVM function type each must have
ALLOWED_EXTERNS: dict[str, str] = {
    PARALLEL_LAUNCH: "i32 (ptr, ptr, i32)",
    "malloc": "ptr (i64)", "free": "void (ptr)",
    "memset": "ptr (ptr, i32, i64)", "memcpy": "ptr (ptr, ptr, i64)", "memmove": "ptr (ptr, ptr, i64)",
}
for _fn in ("exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt", "sin", "cos", "tan", "asin",
            "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "fabs", "floor", "ceil",
            "round", "trunc", "rint", "nearbyint"):
    ALLOWED_EXTERNS[_fn] = f"{_D} ({_D})"
    ALLOWED_EXTERNS[_fn + "f"] = f"{_F} ({_F})"
for _fn in ("pow", "atan2", "fmod", "fmin", "fmax", "copysign", "hypot"):
    ALLOWED_EXTERNS[_fn] = f"{_D} ({_D}, {_D})"
    ALLOWED_EXTERNS[_fn + "f"] = f"{_F} ({_F}, {_F})"

#: LLVM intrinsic families a kernel may call (llvm.<family>.<type suffixes>): math, integer and
#: vector arithmetic, memory transfer within the kernel's own pointers, and optimizer hints
ALLOWED_INTRINSICS = frozenset("""
exp exp2 exp10 log log2 log10 sqrt fabs floor ceil round roundeven trunc rint nearbyint lround llround lrint llrint
pow powi sin cos tan asin acos atan atan2 sinh cosh tanh fma fmuladd minnum maxnum minimum maximum minimumnum
maximumnum copysign ldexp frexp is.fpclass canonicalize smin smax umin umax abs scmp ucmp ctpop ctlz cttz bswap
bitreverse fshl fshr sadd.with.overflow uadd.with.overflow ssub.with.overflow usub.with.overflow
smul.with.overflow umul.with.overflow sadd.sat uadd.sat ssub.sat usub.sat sshl.sat ushl.sat memset memcpy
memmove memset.inline memcpy.inline lifetime.start lifetime.end assume expect experimental.noalias.scope.decl
masked.load masked.store masked.gather masked.scatter masked.expandload masked.compressstore vector.reduce.add
vector.reduce.mul vector.reduce.and vector.reduce.or vector.reduce.xor vector.reduce.smax vector.reduce.smin
vector.reduce.umax vector.reduce.umin vector.reduce.fadd vector.reduce.fmul vector.reduce.fmax vector.reduce.fmin
vector.reduce.fmaximum vector.reduce.fminimum vector.insert vector.extract vector.reverse vector.splice
convert.to.fp16 convert.from.fp16 fptosi.sat fptoui.sat prefetch invariant.start invariant.end
""".split())

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,199}")
_FORBIDDEN_DEFINE = re.compile(r"\b(section|prologue|prefix|personality|comdat|partition|gc)\b")
_FORBIDDEN_OPCODES = frozenset({"invoke", "callbr", "landingpad", "resume", "catchswitch", "catchpad", "cleanuppad",
                                "catchret", "cleanupret"})
#: largest IR text of one kernel module (the kit's own are tens of KiB)
MAX_IR_BYTES = 64 << 20


def _intrinsic_allowed(name: str) -> bool:
    rest = name[len("llvm."):]
    parts = rest.split(".")
    return any(".".join(parts[:k]) in ALLOWED_INTRINSICS for k in range(1, len(parts) + 1))


@dataclass(frozen=True)
class VerifiedIR:
    """IR text that passed verify_ir: `exports` maps each callable kernel (external linkage, void
    return, pointer parameters only) to a tuple with, per parameter, the bytes it declares it may
    access (its dereferenceable(N) attribute; None where it declares none)."""
    text: str
    sha256: str
    exports: dict


_VERIFIED: "OrderedDict[str, VerifiedIR]" = OrderedDict()
_LOCK = threading.RLock()


def _llvm():
    import llvmlite.binding as llvm
    try:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
    except Exception:  # noqa: BLE001 - llvmlite >= 0.44 initializes itself and warns/raises here
        pass
    return llvm


def verify_ir(text: str, what: str = "kernel IR") -> VerifiedIR:
    """Parse and check one kernel module's IR (see module doc); KernelIRError names what is refused."""
    if not isinstance(text, str):
        raise KernelIRError(f"{what}: expected LLVM IR text, got {type(text).__name__}")
    if len(text) > MAX_IR_BYTES:
        raise KernelIRError(f"{what}: {len(text)} bytes of IR, more than the {MAX_IR_BYTES} allowed")
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    with _LOCK:
        hit = _VERIFIED.get(digest)
        if hit is not None:
            _VERIFIED.move_to_end(digest)
            return hit
    llvm = _llvm()
    if "\0" in text:
        raise KernelIRError(f"{what}: NUL byte in the IR text")
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise KernelIRError(f"{what}: not valid LLVM IR ({' '.join(first[:2])[:200] or 'parse error'})") from None
    printed = str(mod)
    for line in printed.splitlines():
        s = line.lstrip()
        if s.startswith("module asm"):
            raise KernelIRError(f"{what}: module-level assembly is not allowed")
        if s.startswith("@") and re.search(r"=\s.*\b(alias|ifunc)\b", s.split('"')[0]):
            raise KernelIRError(f"{what}: aliases and ifuncs are not allowed ({s[:80]})")
    for g in mod.global_variables:
        gtext = str(g)
        if g.name.startswith("llvm."):
            raise KernelIRError(f"{what}: global '{g.name}' (constructors, destructors, used lists) is not allowed")
        if g.is_declaration:
            raise KernelIRError(f"{what}: external global '{g.name}' is not allowed")
        if re.search(r"\bsection\b|\bpartition\b", gtext) or "@" in gtext.split("=", 1)[1]:
            raise KernelIRError(f"{what}: global '{g.name}' has a section or refers to a symbol; not allowed")
    defined: dict[str, str] = {}
    for f in mod.functions:
        name, fty = f.name, str(f.global_value_type)
        if f.is_declaration:
            if name.startswith("llvm."):
                if not _intrinsic_allowed(name):
                    raise KernelIRError(f"{what}: intrinsic '{name}' is not on the allow-list")
            elif name not in ALLOWED_EXTERNS:
                raise KernelIRError(f"{what}: declares external function '{name}', which is not on the allow-list "
                                    f"(libm, malloc/free/memset/memcpy/memmove, {PARALLEL_LAUNCH})")
            elif fty != ALLOWED_EXTERNS[name]:
                raise KernelIRError(f"{what}: external '{name}' declared as '{fty}', expected '{ALLOWED_EXTERNS[name]}'")
            continue
        if not _NAME.fullmatch(name) or name.startswith("llvm.") or name in ALLOWED_EXTERNS \
                or name in RUNTIME_SYMBOLS:
            raise KernelIRError(f"{what}: defines function {name[:80]!r}; kernel names are identifiers that do not "
                                f"start with '_' or 'llvm.' and shadow no allowed external or runtime symbol")
        if f.linkage.name not in ("internal", "private") and not name.startswith(KERNEL_PREFIX):
            # a visible definition named like a C library function could stand in for it
            raise KernelIRError(f"{what}: defines visible function {name[:80]!r}; visible kernel names start with "
                                f"'{KERNEL_PREFIX}' (others must be internal)")
        header = next((ln for ln in str(f).splitlines() if ln.startswith("define")), "")
        header = re.sub(r'[%@]?"[^"]*"|[%@#!][-\w.$]*', " ", header)   # strings and names cannot hide a keyword
        bad = _FORBIDDEN_DEFINE.search(header)
        if bad:
            raise KernelIRError(f"{what}: function '{name}' has a '{bad.group(1)}' attribute; not allowed")
        defined[name] = fty
    for f in mod.functions:
        if f.is_declaration:
            continue
        for block in f.blocks:
            for ins in block.instructions:
                op = ins.opcode
                if op in _FORBIDDEN_OPCODES:
                    raise KernelIRError(f"{what}: function '{f.name}' uses '{op}'; not allowed")
                ops = list(ins.operands)
                if op == "call":
                    callee = ops[-1] if ops else None
                    if callee is None or callee.value_kind.name != "function":
                        kind = "inline assembly" if callee is not None and callee.value_kind.name == "inline_asm" \
                            else "an indirect call"
                        raise KernelIRError(f"{what}: function '{f.name}' makes {kind}; only direct calls are allowed")
                    args = ops[:-1]
                    if callee.name == PARALLEL_LAUNCH:
                        w = args[0] if args else None
                        if w is None or w.value_kind.name != "function" or w.name not in defined \
                                or defined[w.name] != "void (i32, i32, ptr)":
                            raise KernelIRError(f"{what}: function '{f.name}' launches a parallel loop whose worker "
                                                f"is not a function defined in the module as void (i32, i32, ptr)")
                        args = args[1:]
                else:
                    args = ops
                for o in args:
                    kind = o.value_kind.name
                    if kind == "function":
                        raise KernelIRError(f"{what}: function '{f.name}' takes the address of function '{o.name}' "
                                            f"({op}); only the parallel launch may")
                    if kind == "inline_asm":
                        raise KernelIRError(f"{what}: function '{f.name}' uses inline assembly")
                    if kind in ("constant_expr", "global_alias", "global_ifunc") and "@" in str(o):
                        raise KernelIRError(f"{what}: function '{f.name}' uses a constant expression on a symbol "
                                            f"({str(o)[:80]}); not allowed")
    exports = {}
    for name, fty in defined.items():
        f = mod.get_function(name)
        m = re.fullmatch(r"void \(((?:ptr(?:, )?)*)\)", fty)
        if m and f.linkage.name == "external":
            sizes = []
            for a in f.arguments:
                deref = [re.fullmatch(rb"dereferenceable\((\d+)\)", x) for x in a.attributes]
                sizes.append(next((int(d.group(1)) for d in deref if d), None))
            exports[name] = tuple(sizes)
    v = VerifiedIR(text, digest, exports)
    with _LOCK:
        _VERIFIED[digest] = v
        while len(_VERIFIED) > 512:
            _VERIFIED.popitem(last=False)
    return v


# ---- compiling and linking ---------------------------------------------------------------------
_TM = None
_OBJECTS: "OrderedDict[str, bytes]" = OrderedDict()


def host_target() -> dict:
    """This host's LLVM target: triple, cpu, features (kernels are compiled for it, never carried)."""
    llvm = _llvm()
    return {"triple": llvm.get_process_triple(), "cpu": llvm.get_host_cpu_name(),
            "features": llvm.get_host_cpu_features().flatten()}


def _target_machine():
    global _TM
    if _TM is None:
        llvm = _llvm()
        t = host_target()
        _TM = llvm.Target.from_triple(t["triple"]).create_target_machine(
            cpu=t["cpu"], features=t["features"], opt=3, reloc="pic", codemodel="default")
    return _TM


def compile_ir(v: VerifiedIR) -> bytes:
    """Object code of verified IR for this host (memoized in the process by the IR's hash)."""
    with _LOCK:
        obj = _OBJECTS.get(v.sha256)
        if obj is not None:
            _OBJECTS.move_to_end(v.sha256)
            return obj
    llvm = _llvm()
    tm = _target_machine()
    try:
        mod = llvm.parse_assembly(v.text)
        mod.triple = tm.triple
        mod.data_layout = str(tm.target_data)
        obj = tm.emit_object(mod)
    except RuntimeError as e:
        raise KernelBuildError(f"LLVM could not compile a kernel module: {str(e).strip()[:300]}") from None
    with _LOCK:
        _OBJECTS[v.sha256] = obj
        while len(_OBJECTS) > 256:
            _OBJECTS.popitem(last=False)
    return obj


#: seconds LLVM may take to compile the kernels of one module read from a file
COMPILE_TIMEOUT_S = 600.0


def compile_isolated(irs: list[VerifiedIR], timeout: float | None = None) -> list[bytes]:
    """Object code of IR read from a file, compiled in a child process: IR the verifier accepts
    can still make LLVM stop the process (a fatal error) or run for ages; that ends the child, and
    the caller gets one KernelIRError. IR this process compiled already (a fresh build) is reused."""
    with _LOCK:
        todo = [v for v in irs if v.sha256 not in _OBJECTS]
    if todo:
        timeout = float(os.environ.get("ACCEL_KIT_COMPILE_TIMEOUT", COMPILE_TIMEOUT_S)) if timeout is None else timeout
        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        try:
            r = subprocess.run([sys.executable, "-m", "host_runtime.kernel_cache", "--emit-objects"],
                               input="\0".join(v.text for v in todo).encode(), capture_output=True,
                               timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise KernelIRError(f"compiling the module's kernel IR took more than {timeout:g} s; refused "
                                f"(ACCEL_KIT_COMPILE_TIMEOUT sets the limit)") from None
        err = r.stderr.decode(errors="replace").strip().splitlines()
        if r.returncode != 0:
            why = next((ln for ln in err if "LLVM ERROR" in ln or "Error" in ln), err[-1] if err else "")
            raise KernelIRError(f"LLVM could not compile the module's kernel IR (exit status {r.returncode}: "
                                f"{why[:300]})")
        out, pos = r.stdout, 0
        for v in todo:
            if pos + 8 > len(out):
                raise KernelBuildError("the kernel compiler process returned fewer objects than asked")
            n = struct.unpack("<Q", out[pos:pos + 8])[0]
            obj = out[pos + 8:pos + 8 + n]
            pos += 8 + n
            with _LOCK:
                _OBJECTS[v.sha256] = obj
    return [compile_ir(v) for v in irs]


def _emit_objects_main() -> None:
    """Child side of compile_isolated: NUL-separated IR texts on stdin, length-prefixed objects out."""
    texts = sys.stdin.buffer.read().decode().split("\0")
    for t in texts:
        obj = compile_ir(VerifiedIR(t, hashlib.sha256(t.encode()).hexdigest(), {}))
        sys.stdout.buffer.write(struct.pack("<Q", len(obj)) + obj)
    sys.stdout.buffer.flush()


def _c_compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise KernelBuildError("no C compiler found (cc, gcc or clang) to link the CPU kernels; install one or set CC")
    return cc


def library_key(irs: list[VerifiedIR]) -> str:
    """Content key of the library built from `irs` here: IR hashes, runtime source, target, tools."""
    llvm = _llvm()
    h = hashlib.sha256(b"accel-kit kernel library v1\0")
    t = host_target()
    cc = _c_compiler()
    for part in (RUNTIME_C, t["triple"], t["cpu"], t["features"], ".".join(map(str, llvm.llvm_version_info)),
                 os.path.realpath(shutil.which(cc) or cc)):
        h.update(part.encode() + b"\0")
    for v in irs:
        h.update(v.sha256.encode() + b"\0")
    return h.hexdigest()


def link_library(irs: list[VerifiedIR]) -> bytes:
    """A shared library of the kernels plus RUNTIME_C, linked with the system C compiler."""
    cc = _c_compiler()
    with tempfile.TemporaryDirectory(prefix="accel-kit-link-") as d:
        d = Path(d)
        (d / "runtime.c").write_text(RUNTIME_C)
        objs = []
        for k, obj in enumerate(compile_isolated(irs)):
            p = d / f"k{k}.o"
            p.write_bytes(obj)
            objs.append(str(p))
        cmd = [cc, "-shared", "-fPIC", "-O2", "-o", str(d / "kernels.so"), str(d / "runtime.c"), *objs,
               "-lm", "-lpthread"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise KernelBuildError(f"linking the CPU kernels failed ({' '.join(cmd[:2])} ...): {r.stderr.strip()[:2000]}")
        return (d / "kernels.so").read_bytes()


# ---- the per-user cache ------------------------------------------------------------------------
DEFAULT_MAX_BYTES = 512 << 20
_ENTRY = re.compile(r"([0-9a-f]{64})-([0-9a-f]{64})\.so")
#: largest cache entry read back (a kernel library of a big network is a few MiB)
MAX_ENTRY_BYTES = 1 << 30


def default_cache_dir() -> Path:
    """$ACCEL_KIT_CACHE, else $XDG_CACHE_HOME/accel-kit, else ~/.cache/accel-kit."""
    env = os.environ.get("ACCEL_KIT_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "accel-kit"
    return Path.home() / ".cache" / "accel-kit"


def _parse_size(text: str, what: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(?:i?[bB])?\s*", text)
    if not m:
        raise KernelCacheError(f"{what}: {text!r} is not a size (bytes, or a number with K, M or G)")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]


def _check_owned(st: os.stat_result, path: Path, what: str) -> None:
    uid = os.geteuid()
    if st.st_uid != uid:
        raise KernelCacheError(f"kernel cache {what} {path} is owned by uid {st.st_uid}, not by you (uid {uid}); "
                               f"refusing to use it (remove it, or set ACCEL_KIT_CACHE to a directory of yours)")
    if st.st_mode & 0o022:
        raise KernelCacheError(f"kernel cache {what} {path} is writable by group or others (mode "
                               f"{stat.S_IMODE(st.st_mode):04o}); refusing to use it (chmod 700 it)")


class KernelCache:
    """Per-user cache of linked kernel libraries (see module doc). KernelCache(path=None, max_bytes=None)."""

    def __init__(self, path: str | Path | None = None, max_bytes: int | None = None):
        self.root = Path(path) if path is not None else default_cache_dir()
        if max_bytes is None:
            env = os.environ.get("ACCEL_KIT_CACHE_MAX_BYTES")
            max_bytes = _parse_size(env, "ACCEL_KIT_CACHE_MAX_BYTES") if env else DEFAULT_MAX_BYTES
        if max_bytes < 0:
            raise KernelCacheError(f"kernel cache limit {max_bytes} is negative")
        self.max_bytes = int(max_bytes)

    @property
    def dir(self) -> Path:
        return self.root / "kernels"

    def _ensure(self, create: bool = True) -> bool:
        """Create (0700) or check the cache directories; False when absent and not created."""
        for p in (self.root, self.dir):
            try:
                if create:
                    p.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.mkdir(p, 0o700)
                    except FileExistsError:
                        pass
                st = os.stat(p)
            except FileNotFoundError:
                return False
            except OSError as e:
                raise KernelCacheUnavailable(f"kernel cache {p}: {e.strerror}") from None
            if not stat.S_ISDIR(st.st_mode):
                raise KernelCacheError(f"kernel cache {p} is not a directory")
            _check_owned(st, p, "directory")
        return True

    def _entries(self) -> list[tuple[Path, os.stat_result]]:
        out = []
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return out
        for n in names:
            if _ENTRY.fullmatch(n) or n.startswith(".tmp-"):
                p = self.dir / n
                try:
                    out.append((p, os.lstat(p)))
                except FileNotFoundError:
                    pass
        return out

    def get(self, key: str) -> bytes | None:
        """The verified bytes cached under `key`, or None (a bad entry is deleted and logged)."""
        hit = self.lookup(key)
        return None if hit is None else hit[0]

    def lookup(self, key: str) -> tuple[bytes, Path] | None:
        """(verified bytes, entry path) cached under `key`, or None."""
        if not self._ensure():
            return None
        for p, _ in self._entries():
            m = _ENTRY.fullmatch(p.name)
            if not m or m.group(1) != key:
                continue
            data = self._read_verified(p, m.group(2))
            if data is not None:
                try:
                    os.utime(p)   # least recently used = oldest mtime
                except OSError:
                    pass
                return data, p
        return None

    def _read_verified(self, p: Path, want: str) -> bytes | None:
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            log.warning("kernel cache: cannot open %s (%s); rebuilding", p, e.strerror)
            self._discard(p)
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_ENTRY_BYTES:
                log.warning("kernel cache: %s is not a regular file of bounded size; removing it", p)
                self._discard(p)
                return None
            _check_owned(st, p, "entry")
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(MAX_ENTRY_BYTES + 1)
        finally:
            os.close(fd)
        if hashlib.sha256(data).hexdigest() != want:
            log.warning("kernel cache: %s does not hash to its name (corrupt or tampered); removing it", p)
            self._discard(p)
            return None
        return data

    def _discard(self, p: Path) -> None:
        try:
            os.unlink(p)
        except OSError:
            pass

    def put(self, key: str, data: bytes) -> Path:
        """Store `data` under `key` (atomic, mode 0600), then prune to the size limit."""
        self._ensure()
        name = f"{key}-{hashlib.sha256(data).hexdigest()}.so"
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.dir / name)
        except BaseException:
            self._discard(Path(tmp))
            raise
        self.prune(keep=self.dir / name)
        return self.dir / name

    def prune(self, keep: Path | None = None) -> int:
        """Delete least recently used entries until the total fits the limit; returns how many."""
        entries = self._entries()
        now = time.time()
        removed = 0
        for p, st in list(entries):
            if p.name.startswith(".tmp-") and now - st.st_mtime > 3600:   # left by a killed writer
                self._discard(p)
                entries.remove((p, st))
        total = sum(st.st_size for _, st in entries)
        for p, st in sorted(entries, key=lambda e: e[1].st_mtime):
            if total <= self.max_bytes:
                break
            if p == keep or p.name.startswith(".tmp-"):
                continue
            self._discard(p)
            total -= st.st_size
            removed += 1
        return removed

    def info(self) -> dict:
        """path, entries, bytes, limit (the directory is checked, not created)."""
        exists = self._ensure(create=False)
        entries = [(p, st) for p, st in self._entries() if _ENTRY.fullmatch(p.name)] if exists else []
        return {"path": str(self.dir), "entries": len(entries), "bytes": sum(st.st_size for _, st in entries),
                "limit": self.max_bytes}

    def clear(self) -> int:
        """Delete every entry; returns how many."""
        if not self._ensure(create=False):
            return 0
        n = 0
        for p, _ in self._entries():
            self._discard(p)
            n += _ENTRY.fullmatch(p.name) is not None
        return n


# ---- loading -----------------------------------------------------------------------------------
@dataclass
class KernelLibrary:
    """A loaded kernel library: `lib` (ctypes), `exports` {kernel symbol: bytes per parameter}."""
    lib: ctypes.CDLL
    exports: dict
    key: str

    def function(self, symbol: str):
        """The kernel `symbol`; only names the verified IR defines (never a libc symbol)."""
        if symbol not in self.exports:
            raise KernelIRError(f"kernel {symbol!r} is not a function defined in the module's kernel IR")
        return getattr(self.lib, symbol)


_LIBS: dict[str, KernelLibrary] = {}


def _dlopen(data: bytes, fallback: Path | None) -> ctypes.CDLL:
    """Load a library from bytes already verified: through a memfd where there is one, so the
    bytes loaded are the bytes checked."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        # the descriptor stays open while the process lives: the dynamic loader knows a library by
        # its path, and a reused descriptor number would hand back the previous library
        fd = os.memfd_create("accel-kit-kernels", getattr(os, "MFD_CLOEXEC", 0))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            return ctypes.CDLL(f"/proc/self/fd/{fd}")
        except BaseException:
            os.close(fd)
            raise
    if fallback is None:
        raise KernelBuildError("cannot load a kernel library on this system without a cache directory")
    return ctypes.CDLL(str(fallback))


def load_kernels(texts: list[str], cache: KernelCache | None = None) -> KernelLibrary:
    """Verify, build (or take from the cache) and load the kernels of one module."""
    irs = [verify_ir(t, f"kernel module {k}") for k, t in enumerate(texts)]
    exports: dict[str, tuple] = {}
    for k, v in enumerate(irs):
        for name, n in v.exports.items():
            if name in exports:
                raise KernelIRError(f"kernel module {k}: function '{name}' is also defined by another kernel module")
            exports[name] = n
    key = library_key(irs)
    with _LOCK:
        if key in _LIBS:
            return _LIBS[key]
        cache = cache if cache is not None else KernelCache()
        try:
            hit = cache.lookup(key)
        except KernelCacheUnavailable as e:
            log.warning("%s; building the kernels without a cache", e)
            cache, hit = None, None
        data, path = hit if hit is not None else (None, None)
        if data is None:
            data = link_library(irs)
            if cache is not None:
                try:
                    path = cache.put(key, data)
                    log.info("kernel cache: built %s (%d bytes)", path.name, len(data))
                except (KernelCacheUnavailable, OSError) as e:   # a full or read-only disk: run uncached
                    log.warning("kernel cache: cannot store the library (%s)", e)
        try:
            lib = _dlopen(data, path)
        except OSError as e:
            raise KernelBuildError(f"cannot load the kernel library: {e}") from None
        kl = KernelLibrary(lib, exports, key)
        _LIBS[key] = kl
        return kl


if __name__ == "__main__" and sys.argv[1:] == ["--emit-objects"]:
    _emit_objects_main()
