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

import atexit
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

import llvmlite.binding as llvm

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
RUNTIME_SYMBOLS = frozenset({PARALLEL_LAUNCH, "kit_set_num_threads", "kit_parallel_config", "kit_parallel_stats",
                             "kit_parallel_shutdown", "kit_run_steps"})
#: the most pointer arguments a kernel may take to run in a batch of steps (kit_run_steps)
RUN_STEPS_MAX_ARGS = 24

#: the C runtime linked into every kernel library (the kit's own code, never from a file)
RUNTIME_C = r"""
/* Parallel-loop runtime for generated kernels: the kit's own code, compiled on this machine.

   A launch cuts the loop into chunks; the calling thread and every pool helper that joins in time
   take chunks from an atomic counter until none is left: worker(chunk, nchunk, closure). Once the
   counter is exhausted the caller closes the job and waits only for helpers already inside it
   (each finishing its last chunk): a helper that is asleep or descheduled and has not joined costs
   nothing. A launch that did not pay (see LATE_NS: the caller waited on a preempted helper, or
   the helpers' chunks did not make it faster than the caller alone would have been) sends the
   following launches to the caller alone for a back-off time that doubles with each such launch
   and halves with each launch that paid; then a parallel launch probes again. Helpers spin briefly
   between launches, then sleep on a condition variable (no spinning while the pool is backed off).
   A helper found on the caller's CPU is moved to the pool's other CPUs (move_helpers_off).
   Nested launches, and launches from a second thread while the pool is busy, run serially. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>

typedef void (*kit_worker)(int, int, void *);

#define MAX_THREADS 256
#define CHUNKS_PER_THREAD 8
#define OPEN_BIT ((uint64_t)1 << 31)
#define COUNT_MASK (OPEN_BIT - 1)
/* A launch is late when (a) after its own chunks the caller waited on joined helpers more than
   LATE_NS plus two of its chunks' time (WAKE_NS more when it had to wake or start helpers), or
   (b) it took over LATE_NS and more than 90% of the time the caller alone would have taken at the
   rate it ran its own chunks (the helpers came too late or ran too slowly to pay), or, only in
   adaptive mode 2, (c) the caller was on a CPU less than PREEMPT_PCT% of the time it ran its
   chunks (other programs hold the cores; checked on launches over PREEMPT_MIN_NS). */
#define LATE_NS 30000L
#define WAKE_NS 150000L
#define PREEMPT_PCT 75
#define PREEMPT_MIN_NS 50000L
#define BACKOFF_MIN_NS 1000000L
#define BACKOFF_MAX_NS 200000000L

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER, launch_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv_start = PTHREAD_COND_INITIALIZER, cv_done = PTHREAD_COND_INITIALIZER;
static pthread_t helpers[MAX_THREADS];
static int n_threads = 1, n_started = 0, stop = 0, adaptive = 1;
static long spin_ns = 200000L;
/* join word: generation (bits 32-63), job open (bit 31), helpers inside the job (bits 0-30) */
static uint64_t join_word = 0;
static int n_sleeping = 0, caller_waiting = 0;
static kit_worker job_fn;
static void *job_closure;
static int job_nchunk = 0, job_nthread = 0, next_chunk = 0;
static long helper_chunks = 0;
static long degraded_until = 0, backoff_ns = BACKOFF_MIN_NS;
/* statistics: parallel, serial (n <= 1, nested or pool busy), backed-off launches; late launches;
   chunks run by helpers; chunks in parallel launches */
static long st_parallel, st_serial, st_backed_off, st_late, st_helper_chunks, st_chunks, st_moved;
static __thread int in_parallel = 0;
/* the CPU each helper last ran on (-1: unknown), and the CPUs the pool may use (the caller's
   when it started the helpers), for keeping helpers off the caller's CPU */
static int helper_cpu[MAX_THREADS];
static cpu_set_t pool_cpus;
static int pool_cpus_known = 0;

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}
static long thread_cpu_ns(void) {
  struct timespec t;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return -1;
  return t.tv_sec * 1000000000L + t.tv_nsec;
}
#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif
#define LOAD(p) __atomic_load_n(p, __ATOMIC_SEQ_CST)
#define STORE(p, v) __atomic_store_n(p, v, __ATOMIC_SEQ_CST)
#define ADD(p, v) __atomic_fetch_add(p, v, __ATOMIC_RELAXED)

static int run_chunks(kit_worker f, void *c, int nchunk) {
  int done = 0;
  for (;;) {
    int t = __atomic_fetch_add(&next_chunk, 1, __ATOMIC_RELAXED);
    if (t >= nchunk) return done;
    f(t, nchunk, c);
    done++;
  }
}

/* Helper: wait for a generation after `seen` (spin, then sleep); join it if it is still open. */
static void *pool_main(void *arg) {
  int id = (int)(long)arg;
  uint32_t seen = (uint32_t)(LOAD(&join_word) >> 32);
  in_parallel = 1;
  for (;;) {
    STORE(&helper_cpu[id - 1], sched_getcpu());
    long t = now_ns();   /* no spinning while the pool is backed off: cores are busy */
    long until = t + (LOAD(&adaptive) && t < LOAD(&degraded_until) ? 0 : LOAD(&spin_ns));
    for (int i = 0; (uint32_t)(LOAD(&join_word) >> 32) == seen && !LOAD(&stop); i++) {
      CPU_RELAX();
      /* yield now and then: a helper spinning on the core the caller runs on (another program
         holds the other) would take half the caller's time (an LSTM's serial steps ran 1.7x
         slower beside a busy core); alone on its core, sched_yield returns at once */
      if ((i & 63) != 63) continue;
      sched_yield();
      STORE(&helper_cpu[id - 1], sched_getcpu());
      if (now_ns() > until) {
        pthread_mutex_lock(&mu);
        STORE(&n_sleeping, LOAD(&n_sleeping) + 1);
        while ((uint32_t)(LOAD(&join_word) >> 32) == seen && !LOAD(&stop)) pthread_cond_wait(&cv_start, &mu);
        STORE(&n_sleeping, LOAD(&n_sleeping) - 1);
        pthread_mutex_unlock(&mu);
        break;
      }
    }
    if (LOAD(&stop)) return 0;
    uint64_t w = LOAD(&join_word);
    seen = (uint32_t)(w >> 32);
    int joined = 0;
    while ((uint32_t)(w >> 32) == seen && (w & OPEN_BIT)) {
      if (__atomic_compare_exchange_n(&join_word, &w, w + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        joined = 1;
        break;
      }
    }
    if (!joined) continue;
    if (id < job_nthread) {
      int k = run_chunks(job_fn, job_closure, job_nchunk);
      if (k) __atomic_fetch_add(&helper_chunks, k, __ATOMIC_RELAXED);
    }
    uint64_t after = __atomic_sub_fetch(&join_word, 1, __ATOMIC_SEQ_CST);
    if ((after & COUNT_MASK) == 0 && !(after & OPEN_BIT) && LOAD(&caller_waiting)) {
      pthread_mutex_lock(&mu);
      pthread_cond_broadcast(&cv_done);
      pthread_mutex_unlock(&mu);
    }
  }
}

static void atfork_prepare(void) { pthread_mutex_lock(&launch_mu); pthread_mutex_lock(&mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&mu); pthread_mutex_unlock(&launch_mu); }
static void atfork_child(void) {
  /* the child has no helpers: start afresh (threads are created again on its first launch) */
  n_started = 0; n_sleeping = 0; caller_waiting = 0; stop = 0;
  join_word &= ~(OPEN_BIT | COUNT_MASK);
  STORE(&degraded_until, 0L); backoff_ns = BACKOFF_MIN_NS;
  pthread_mutex_init(&mu, 0); pthread_mutex_init(&launch_mu, 0);
  pthread_cond_init(&cv_start, 0); pthread_cond_init(&cv_done, 0);
}
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

void kit_set_num_threads(int n) { STORE(&n_threads, n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n); }

/* adapt: 0 never backs off to the caller alone, 1 backs off after launches that did not pay, 2 also
   when the caller was preempted; spin_us: how long idle helpers spin before they sleep */
void kit_parallel_config(int adapt, int spin_us) {
  STORE(&adaptive, adapt < 0 ? 0 : adapt > 2 ? 2 : adapt);
  STORE(&spin_ns, spin_us < 0 ? 0L : (long)spin_us * 1000L);
}

/* out[0..9]: threads, helpers started, parallel, serial, backed-off and late launches, chunks run
   by helpers, chunks of parallel launches, current back-off (ns), helpers moved off the caller's CPU */
void kit_parallel_stats(long long *out) {
  long v[10] = {LOAD(&n_threads), LOAD(&n_started), ADD(&st_parallel, 0), ADD(&st_serial, 0),
                ADD(&st_backed_off, 0), ADD(&st_late, 0), ADD(&st_helper_chunks, 0), ADD(&st_chunks, 0),
                LOAD(&backoff_ns), ADD(&st_moved, 0)};
  for (int i = 0; i < 10; i++) out[i] = v[i];
}

/* Stop and join the helpers (they are started again by the next parallel launch). A launch still
   running after a second (a daemon thread's, at exit) is left alone: returns 1, else 0. */
int kit_parallel_shutdown(void) {
  struct timespec pause = {0, 1000000L};
  long give_up = now_ns() + 1000000000L;
  while (pthread_mutex_trylock(&launch_mu) != 0) {
    if (now_ns() > give_up) return 1;
    nanosleep(&pause, 0);
  }
  pthread_mutex_lock(&mu);
  STORE(&stop, 1);
  STORE(&join_word, (LOAD(&join_word) & ~(OPEN_BIT | COUNT_MASK)) + ((uint64_t)1 << 32));
  pthread_cond_broadcast(&cv_start);
  pthread_mutex_unlock(&mu);
  for (int i = 0; i < n_started; i++) pthread_join(helpers[i], 0);
  STORE(&n_started, 0);
  STORE(&stop, 0);
  pthread_mutex_unlock(&launch_mu);
  return 0;
}

/* A helper on the caller's CPU cannot run while the caller does, and the kernel rarely moves the
   caller (it is cache-hot): the launch would run alone and back the pool off, and the helper,
   woken on that CPU again, would keep it backed off (ViT ran 1.7x slower after its first
   hundred runs). Such a helper is moved: its affinity becomes the pool's CPUs but this one. */
static void move_helpers_off(int cpu) {
  if (cpu < 0 || !pool_cpus_known) return;
  for (int i = 0; i < n_started; i++) {
    if (LOAD(&helper_cpu[i]) != cpu) continue;
    cpu_set_t set = pool_cpus;
    CPU_CLR(cpu, &set);
    if (CPU_COUNT(&set) == 0) return;
    STORE(&helper_cpu[i], -1);   /* until the helper reports again */
    if (pthread_setaffinity_np(helpers[i], sizeof set, &set) == 0) ADD(&st_moved, 1);
  }
}

static int serial(kit_worker f, void *closure) {
  ADD(&st_serial, 1);
  f(0, 1, closure);
  return 0;
}

int __kit_parallel_launch(void *fn, void *closure, int n) {
  kit_worker f = (kit_worker)fn;
  int nthread = n < LOAD(&n_threads) ? n : LOAD(&n_threads);
  if (nthread <= 1 || in_parallel) return serial(f, closure);
  if (pthread_mutex_trylock(&launch_mu) != 0) return serial(f, closure);
  long t0 = now_ns(), c0 = LOAD(&adaptive) > 1 ? thread_cpu_ns() : -1;
  if (LOAD(&adaptive) && t0 < LOAD(&degraded_until)) {
    pthread_mutex_unlock(&launch_mu);
    ADD(&st_backed_off, 1);
    f(0, 1, closure);
    return 0;
  }
  int woke = 0;   /* helpers had to be woken or started: they join later */
  if (n_started < nthread - 1) {
    woke = 1;
    pthread_once(&atfork_once, register_atfork);
    if (n_started == 0) pool_cpus_known = sched_getaffinity(0, sizeof pool_cpus, &pool_cpus) == 0;
    while (n_started < nthread - 1) {
      STORE(&helper_cpu[n_started], -1);
      if (pthread_create(&helpers[n_started], 0, pool_main, (void *)(long)(n_started + 1)) != 0) break;
      STORE(&n_started, n_started + 1);
    }
    if (n_started == 0) {
      pthread_mutex_unlock(&launch_mu);
      return serial(f, closure);
    }
  }
  if (nthread - 1 > n_started) nthread = n_started + 1;
  move_helpers_off(sched_getcpu());
  int nchunk = n < nthread * CHUNKS_PER_THREAD ? n : nthread * CHUNKS_PER_THREAD;
  job_fn = f; job_closure = closure; job_nchunk = nchunk; job_nthread = nthread;
  __atomic_store_n(&next_chunk, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&helper_chunks, 0, __ATOMIC_RELAXED);
  uint64_t gen = (LOAD(&join_word) >> 32) + 1;
  STORE(&join_word, (gen << 32) | OPEN_BIT);   /* publishes the job (sequentially consistent) */
  if (LOAD(&n_sleeping) > 0) {
    woke = 1;
    pthread_mutex_lock(&mu);
    pthread_cond_broadcast(&cv_start);
    pthread_mutex_unlock(&mu);
  }
  in_parallel = 1;
  int own = run_chunks(f, closure, nchunk);
  in_parallel = 0;
  long t1 = now_ns();
  /* the caller's CPU time for its chunks (wall time where short or not measured) */
  long c1 = c0 >= 0 && t1 - t0 > PREEMPT_MIN_NS ? thread_cpu_ns() : -1;
  long own_cpu = c1 >= 0 ? c1 - c0 : t1 - t0;
  uint64_t w = __atomic_fetch_and(&join_word, ~OPEN_BIT, __ATOMIC_SEQ_CST);   /* no helper joins now */
  if (w & COUNT_MASK) {
    /* spin as helpers do (spin_ns): a sleeping caller may wait long for a CPU once woken */
    long until = t1 + LOAD(&spin_ns);
    for (int i = 0; LOAD(&join_word) & COUNT_MASK; i++) {
      CPU_RELAX();
      if ((i & 63) == 63 && now_ns() > until) {
        STORE(&caller_waiting, 1);
        pthread_mutex_lock(&mu);
        while (LOAD(&join_word) & COUNT_MASK) pthread_cond_wait(&cv_done, &mu);
        pthread_mutex_unlock(&mu);
        STORE(&caller_waiting, 0);
        break;
      }
    }
  }
  long t2 = now_ns();
  long hc = __atomic_load_n(&helper_chunks, __ATOMIC_RELAXED);
  ADD(&st_parallel, 1);
  ADD(&st_chunks, nchunk);
  ADD(&st_helper_chunks, hc);
  /* late (see LATE_NS): a helper inside the job kept the caller waiting, the caller itself was
     preempted, or spinning helpers never came; then the caller runs alone for backoff_ns */
  long per_chunk = (t1 - t0) / (own > 0 ? own : 1), serial_est = per_chunk * nchunk;
  int late = t2 - t1 > LATE_NS + (woke ? WAKE_NS : 0) + 2 * per_chunk
             || (!woke && t2 - t0 > LATE_NS && (t2 - t0) * 10 > serial_est * 9)
             || (LOAD(&adaptive) > 1 && c1 >= 0 && own_cpu * 100 < (t1 - t0) * PREEMPT_PCT);
  if (late) {
    ADD(&st_late, 1);
    STORE(&degraded_until, t2 + backoff_ns);
    STORE(&backoff_ns, backoff_ns * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : backoff_ns * 2);
  } else if (backoff_ns > BACKOFF_MIN_NS) {
    STORE(&backoff_ns, backoff_ns / 2);
  }
  pthread_mutex_unlock(&launch_mu);
  return 0;
}

/* Run n kernel steps in order: step k calls fns[k] with nargs[k] pointers, the next ones of args,
   and records its time in ns[k]. A model's small kernels take about a microsecond each; a call
   from Python through ctypes cost as much again (an unrolled LSTM's 192 steps spent more time
   in the calls than onnxruntime in the whole net). Returns the first step whose argument count
   is out of range (its call skipped), or n. */
int kit_run_steps(int n, void **fns, const int *nargs, void **args, long long *ns) {
  void **a = args;
  for (int k = 0; k < n; k++) {
    void *f = fns[k];
    long t0 = now_ns();
    switch (nargs[k]) {
""" + "".join(
    f"      case {n}: ((void (*)({', '.join(['void *'] * n)}))f)({', '.join(f'a[{i}]' for i in range(n))}); break;\n"
    for n in range(1, RUN_STEPS_MAX_ARGS + 1)) + r"""      default: return k;
    }
    ns[k] = now_ns() - t0;
    a += nargs[k];
  }
  return n;
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


# ---- the parallel runtime's settings -----------------------------------------------------------
#: microseconds an idle helper thread spins for the next parallel loop before it sleeps
SPIN_ENV = "KIT_SPIN_US"
DEFAULT_SPIN_US = 200
#: 0: parallel loops always use every thread; 1 (default): a loop whose helpers did not pay (late or
#: preempted: cores busy) sends the next ones to the calling thread alone for a while; 2: also when
#: the calling thread itself was preempted (others hold the cores, or a CPU quota below the CPU count)
ADAPTIVE_ENV = "KIT_PARALLEL_ADAPTIVE"
_STATS = ("threads", "helpers_started", "parallel_launches", "serial_launches", "backed_off_launches",
          "late_launches", "helper_chunks", "chunks", "backoff_ns", "helpers_moved")


class RuntimeSettingError(HostRuntimeError, ValueError):
    """An environment variable of the parallel runtime has a value outside its range (names it)."""


def _env_int(name: str, default: int, lo: int, hi: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        v = int(raw)
    except ValueError:
        v = None
    if v is None or not lo <= v <= hi:
        raise RuntimeSettingError(f"${name}={raw!r}: expected an integer from {lo} to {hi}")
    return v


def runtime_settings() -> dict:
    """The parallel runtime's settings from the environment: spin_us ($KIT_SPIN_US, 0..100000,
    default 200) and adaptive ($KIT_PARALLEL_ADAPTIVE, 0, 1 or 2, default 1)."""
    return {"spin_us": _env_int(SPIN_ENV, DEFAULT_SPIN_US, 0, 100_000),
            "adaptive": _env_int(ADAPTIVE_ENV, 1, 0, 2)}


def configure_runtime(lib: ctypes.CDLL) -> None:
    """Apply runtime_settings() to a library linked with RUNTIME_C, and stop its helper threads
    at interpreter exit (joined, so none runs while the interpreter tears down)."""
    s = runtime_settings()
    lib.kit_parallel_config(ctypes.c_int(s["adaptive"]), ctypes.c_int(s["spin_us"]))
    atexit.register(lib.kit_parallel_shutdown)


def runtime_stats(lib: ctypes.CDLL) -> dict:
    """Counters of a library's parallel runtime: threads, helpers_started, parallel_launches,
    serial_launches (one thread, nested, or the pool busy with another caller), backed_off_launches
    (run on the caller alone because helpers were late), late_launches, helper_chunks, chunks,
    backoff_ns, helpers_moved (off the caller's CPU)."""
    out = (ctypes.c_longlong * len(_STATS))()
    lib.kit_parallel_stats(out)
    return dict(zip(_STATS, map(int, out)))


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

    def set_num_threads(self, n: int) -> None:
        """Threads the library's parallel loops use (the caller plus n - 1 helpers)."""
        if not 1 <= int(n) <= 256:
            raise RuntimeSettingError(f"num_threads={n}: expected 1 to 256")
        self.lib.kit_set_num_threads(ctypes.c_int(int(n)))

    def configure(self, adaptive: int | None = None, spin_us: int | None = None) -> None:
        """Set the parallel runtime's adaptive mode (0, 1, 2) and helper spin (us); None: from
        the environment (runtime_settings())."""
        s = runtime_settings()
        adaptive = s["adaptive"] if adaptive is None else adaptive
        spin_us = s["spin_us"] if spin_us is None else spin_us
        if adaptive not in (0, 1, 2) or not 0 <= spin_us <= 100_000:
            raise RuntimeSettingError(f"configure(adaptive={adaptive}, spin_us={spin_us}): adaptive is 0, 1 or 2, "
                                      f"spin_us 0 to 100000")
        self.lib.kit_parallel_config(ctypes.c_int(adaptive), ctypes.c_int(spin_us))

    def stats(self) -> dict:
        """runtime_stats() of this library."""
        return runtime_stats(self.lib)


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
        configure_runtime(lib)
        kl = KernelLibrary(lib, exports, key)
        _LIBS[key] = kl
        return kl


if __name__ == "__main__" and sys.argv[1:] == ["--emit-objects"]:
    _emit_objects_main()
