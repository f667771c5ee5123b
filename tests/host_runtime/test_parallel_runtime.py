"""The C parallel runtime (kernel_cache.RUNTIME_C): every chunk runs exactly once whatever the
thread count, nesting, concurrent callers, fork or shutdown; settings come from the environment;
kernels of compiled models and JIT modules run on it. No test asserts a time."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from compiler import build, build_model, te
from compiler.codegen import runtime
from compiler.frontend.zoo import conv_bn_relu_pool, sample_inputs
from host_runtime import kernel_cache as kc
from host_runtime.executor import Executor, ExecutorError, cgroup_cpu_limit, default_num_threads

ROOT = Path(__file__).resolve().parents[2]

#: a test kernel in C, linked with the runtime: worker(chunk, nchunk) adds 1 to each of its rows
#: (nested: launches an inner parallel loop over the row's columns), optionally spinning per chunk
HARNESS_C = r"""
#include <time.h>
int __kit_parallel_launch(void *fn, void *closure, int n);
typedef struct { int *out; int n, m, spin_us, nested; } job_t;
typedef struct { int *row; int m; } row_t;
static void spin(int us) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  do clock_gettime(CLOCK_MONOTONIC, &b);
  while ((b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000 < us);
}
static void span(int t, int nt, int n, int *lo, int *hi) {
  int chunk = (n + nt - 1) / nt;
  *lo = t * chunk;
  *hi = *lo + chunk < n ? *lo + chunk : n;
}
static void inner(int t, int nt, void *c) {
  row_t *r = c; int lo, hi;
  span(t, nt, r->m, &lo, &hi);
  for (int j = lo; j < hi; j++) r->row[j] += 1;
}
static void body(int t, int nt, void *c) {
  job_t *jb = c; int lo, hi;
  span(t, nt, jb->n, &lo, &hi);
  for (int i = lo; i < hi; i++) {
    if (jb->nested) {
      row_t r = {jb->out + (long)i * jb->m, jb->m};
      __kit_parallel_launch((void *)inner, &r, jb->m);
    } else {
      for (int j = 0; j < jb->m; j++) jb->out[(long)i * jb->m + j] += 1;
    }
  }
  if (jb->spin_us) spin(jb->spin_us);
}
int harness_run(int *out, int n, int m, int spin_us, int nested) {
  job_t jb = {out, n, m, spin_us, nested};
  return __kit_parallel_launch((void *)body, &jb, n);
}
"""


def build_harness(dirpath: Path) -> Path:
    (dirpath / "runtime.c").write_text(kc.RUNTIME_C)
    (dirpath / "harness.c").write_text(HARNESS_C)
    so = dirpath / "harness.so"
    subprocess.run([kc._c_compiler(), "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(so),
                    str(dirpath / "runtime.c"), str(dirpath / "harness.c"), "-lpthread"], check=True)
    return so


class Harness:
    def __init__(self, so: Path):
        self.lib = ctypes.CDLL(str(so))
        self.lib.harness_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]

    def run(self, out: np.ndarray, spin_us: int = 0, nested: bool = False) -> None:
        n, m = out.shape
        assert self.lib.harness_run(out.ctypes.data, n, m, spin_us, int(nested)) == 0

    def threads(self, n: int) -> None:
        self.lib.kit_set_num_threads(n)

    def config(self, adaptive: int = 1, spin_us: int = 200) -> None:
        self.lib.kit_parallel_config(adaptive, spin_us)

    def stats(self) -> dict:
        return kc.runtime_stats(self.lib)


@pytest.fixture(scope="module")
def harness_so(tmp_path_factory):
    return build_harness(tmp_path_factory.mktemp("parallel-runtime"))


@pytest.fixture
def harness(harness_so, tmp_path):
    # a private copy: the runtime's state is per loaded library
    so = tmp_path / "h.so"
    so.write_bytes(harness_so.read_bytes())
    h = Harness(so)
    yield h
    h.lib.kit_parallel_shutdown()


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8])
def test_every_chunk_runs_exactly_once(harness, threads):
    harness.threads(threads)
    for n in (1, 2, 3, 7, 16, 17, 64, 1000):
        out = np.zeros((n, 3), np.int32)
        for _ in range(40):
            harness.run(out)
        assert (out == 40).all(), f"n={n}: rows ran {sorted(set(out.ravel().tolist()))} times, not 40"
    s = harness.stats()
    assert s["threads"] == threads
    assert (s["parallel_launches"] + s["backed_off_launches"] > 0) == (threads > 1)


def test_nested_loops_run_serially_inside_and_completely(harness):
    harness.threads(4)
    out = np.zeros((13, 29), np.int32)
    for _ in range(30):
        harness.run(out, nested=True)
    assert (out == 30).all()
    assert harness.stats()["serial_launches"] >= 30 * 13   # each inner loop ran on its chunk's thread


def test_concurrent_callers_share_the_pool_safely(harness):
    harness.threads(3)
    outs = [np.zeros((50, 4), np.int32) for _ in range(4)]
    errors = []

    def caller(out):
        try:
            for _ in range(150):
                harness.run(out, spin_us=5)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    ts = [threading.Thread(target=caller, args=(o,)) for o in outs]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in ts)
    for o in outs:
        assert (o == 150).all()


def test_helpers_take_chunks_when_cores_are_free(harness):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    harness.threads(2)
    harness.config(adaptive=0)
    out = np.zeros((16, 1), np.int32)
    runs = 0
    while runs < 300 and harness.stats()["helper_chunks"] == 0:
        harness.run(out, spin_us=300)
        runs += 1
    assert (out == runs).all()
    s = harness.stats()
    assert s["helper_chunks"] > 0 and s["helpers_started"] == 1 and s["backed_off_launches"] == 0


def test_shutdown_joins_helpers_and_the_pool_restarts(harness):
    harness.threads(4)
    out = np.zeros((64, 2), np.int32)
    for _ in range(5):
        harness.run(out)
    assert harness.stats()["helpers_started"] == 3
    assert harness.lib.kit_parallel_shutdown() == 0
    assert harness.stats()["helpers_started"] == 0
    assert harness.lib.kit_parallel_shutdown() == 0   # twice is harmless
    for _ in range(5):
        harness.run(out)
    assert (out == 10).all() and harness.stats()["helpers_started"] == 3


def test_shutdown_leaves_a_launch_that_does_not_end(harness):
    """At exit a daemon thread may be inside a launch: shutdown gives up after a second."""
    harness.threads(2)
    out = np.zeros((2, 1), np.int32)
    t = threading.Thread(target=harness.run, args=(out,), kwargs={"spin_us": 3_000_000})
    t.start()
    while harness.stats()["helpers_started"] == 0:
        threading.Event().wait(0.001)
    assert harness.lib.kit_parallel_shutdown() == 1
    t.join(30)
    assert (out == 1).all()
    assert harness.lib.kit_parallel_shutdown() == 0


def _child_script(body: str) -> str:
    return (f"import sys, numpy as np\nsys.path.insert(0, {str(ROOT)!r})\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"from test_parallel_runtime import Harness\n" + body)


def _run_child(script: str, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_a_forked_child_runs_parallel_loops(harness_so):
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    _run_child(_child_script(f"""
import os, time
h = Harness({str(harness_so)!r})
h.threads(3)
out = np.zeros((40, 2), np.int32)
for _ in range(20):
    h.run(out)
pid = os.fork()
if pid == 0:
    code = 0
    try:
        o = np.zeros((40, 2), np.int32)
        for _ in range(20):
            h.run(o, spin_us=20)
        code = 0 if (o == 20).all() else 3
    except BaseException:
        code = 4
    os._exit(code)
for _ in range(20):
    h.run(out)
deadline = time.time() + 60
while time.time() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    sys.exit("the forked child hung in a parallel loop")
assert os.waitstatus_to_exitcode(status) == 0, status
assert (out == 40).all()
"""))


def test_pool_on_one_cpu_stays_exact_and_mode_2_backs_off(harness_so):
    """Four threads pinned to one CPU: helpers only run while the caller is preempted. Results stay
    exact in every mode; adaptation off never backs off; mode 2 (back off when the caller is
    preempted) does."""
    cpu = min(os.sched_getaffinity(0))
    r = _run_child(_child_script(f"""
import os
os.sched_setaffinity(0, {{{cpu}}})
h = Harness({str(harness_so)!r})
h.threads(4)
out = np.zeros((32, 1), np.int32)
h.config(adaptive=0)
for _ in range(100):
    h.run(out, spin_us=50)
assert (out == 100).all()
assert h.stats()["backed_off_launches"] == 0
h.config(adaptive=1)
for _ in range(100):
    h.run(out, spin_us=50)
assert (out == 200).all()
h.config(adaptive=2)
for _ in range(300):
    h.run(out, spin_us=50)
assert (out == 500).all()
print(h.stats())
"""))
    assert eval(r.stdout.strip().splitlines()[-1])["backed_off_launches"] > 0


def test_a_helper_on_the_callers_cpu_is_moved_off_it(harness_so):
    """A helper stuck on the caller's CPU never runs while the caller does: the next launch moves it
    to the pool's other CPUs (the kernel seldom moves a cache-hot caller), and results stay exact."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    r = _run_child(_child_script(f"""
import os, time
me = os.getpid()
before = set(map(int, os.listdir(f"/proc/{{me}}/task")))
h = Harness({str(harness_so)!r})
h.threads(2)
h.config(adaptive=0)
out = np.zeros((16, 1), np.int32)
h.run(out)
helper, = set(map(int, os.listdir(f"/proc/{{me}}/task"))) - before
os.sched_setaffinity(helper, {{{cpus[0]}}})
os.sched_setaffinity(0, {{{cpus[0]}}})
runs = 1
while runs < 200 and h.stats()["helpers_moved"] == 0:
    time.sleep(0.002)   # the helper runs on the caller's CPU meanwhile, and says so
    h.run(out, spin_us=20)
    runs += 1
assert (out == runs).all()
print(h.stats()["helpers_moved"], sorted(os.sched_getaffinity(helper)))
"""))
    moved, allowed = r.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(moved) >= 1 and eval(allowed) == cpus[1:]


#: a C program that drives the runtime from one and from three threads, nested loops included,
#: every thread count 1-4 and adaptive mode 0-2, reading the counters meanwhile
STRESS_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
int __kit_parallel_launch(void *fn, void *closure, int n);
void kit_set_num_threads(int n);
void kit_parallel_stats(long long *out);
void kit_parallel_config(int adapt, int spin_us);
int kit_parallel_shutdown(void);
typedef struct { int *out; int n; int nested; } job_t;
static void inner(int t, int nt, void *c) {
  int *row = ((int **)c)[0]; int m = 7; int chunk = (m + nt - 1) / nt, lo = t * chunk, hi = lo + chunk < m ? lo + chunk : m;
  for (int j = lo; j < hi; j++) row[j] += 1;
}
static void body(int t, int nt, void *c) {
  job_t *jb = c; int chunk = (jb->n + nt - 1) / nt, lo = t * chunk, hi = lo + chunk < jb->n ? lo + chunk : jb->n;
  for (int i = lo; i < hi; i++) {
    if (jb->nested) { int *row = jb->out + i * 7; __kit_parallel_launch((void *)inner, &row, 7); }
    else for (int j = 0; j < 7; j++) jb->out[i * 7 + j] += 1;
  }
}
static int check(int *out, int n, int want) { for (int i = 0; i < n * 7; i++) if (out[i] != want) return 1; return 0; }
static void *caller(void *arg) {
  long id = (long)arg; int bad = 0;
  for (int n = 1; n < 80; n += 3) {
    int *out = calloc(n * 7, sizeof(int));
    for (int r = 0; r < 200; r++) { job_t jb = {out, n, (int)((r + id) % 3 == 0)}; __kit_parallel_launch((void *)body, &jb, n); }
    bad |= check(out, n, 200);
    free(out);
  }
  return (void *)(long)bad;
}
int main(void) {
  int bad = 0;
  for (int threads = 1; threads <= 4; threads++) {
    kit_set_num_threads(threads);
    kit_parallel_config(threads % 3, threads == 2 ? 0 : 50);
    bad |= (int)(long)caller((void *)1L);   /* one caller: the pool is used */
    pthread_t th[3];
    for (long i = 0; i < 3; i++) pthread_create(&th[i], 0, caller, (void *)i);
    long long st[10];
    for (int k = 0; k < 100; k++) kit_parallel_stats(st);
    for (int i = 0; i < 3; i++) { void *r; pthread_join(th[i], &r); bad |= (int)(long)r; }
    kit_parallel_stats(st);
    printf("threads %d: parallel %lld serial %lld backed-off %lld late %lld helper chunks %lld / %lld\n",
           threads, st[2], st[3], st[4], st[5], st[6], st[7]);
    if (threads == 3) bad |= kit_parallel_shutdown();
  }
  bad |= kit_parallel_shutdown();
  printf("%s\n", bad ? "BAD" : "ok");
  return bad;
}
"""


def test_no_data_race_under_thread_sanitizer(tmp_path):
    """The runtime and a stress program built with -fsanitize=thread: no race reported, no chunk
    lost or run twice. Skipped where the compiler or the kernel cannot run ThreadSanitizer."""
    (tmp_path / "runtime.c").write_text(kc.RUNTIME_C)
    (tmp_path / "stress.c").write_text(STRESS_C)
    exe = tmp_path / "stress"
    b = subprocess.run([kc._c_compiler(), "-O1", "-g", "-fsanitize=thread", "-o", str(exe), str(tmp_path / "runtime.c"),
                        str(tmp_path / "stress.c"), "-lpthread"], capture_output=True, text=True)
    if b.returncode != 0:
        pytest.skip(f"no ThreadSanitizer here: {b.stderr.strip()[:200]}")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66"))
    if "FATAL: ThreadSanitizer" in r.stderr:
        pytest.skip(f"ThreadSanitizer cannot run on this kernel: {r.stderr.strip()[:200]}")
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


# ---- settings ----------------------------------------------------------------------------------
def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.delenv(kc.SPIN_ENV, raising=False)
    monkeypatch.delenv(kc.ADAPTIVE_ENV, raising=False)
    assert kc.runtime_settings() == {"spin_us": kc.DEFAULT_SPIN_US, "adaptive": 1}
    monkeypatch.setenv(kc.SPIN_ENV, "0")
    monkeypatch.setenv(kc.ADAPTIVE_ENV, "2")
    assert kc.runtime_settings() == {"spin_us": 0, "adaptive": 2}


@pytest.mark.parametrize("var,value", [("KIT_SPIN_US", "-1"), ("KIT_SPIN_US", "fast"), ("KIT_SPIN_US", "999999999"),
                                       ("KIT_PARALLEL_ADAPTIVE", "3"), ("KIT_PARALLEL_ADAPTIVE", "yes")])
def test_bad_settings_name_the_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(kc.RuntimeSettingError, match=f"\\${var}="):
        kc.runtime_settings()


def test_ir_cannot_define_a_runtime_symbol():
    for sym in kc.RUNTIME_SYMBOLS - {kc.PARALLEL_LAUNCH}:
        ir = f"define void @{sym}() {{\n  ret void\n}}\n"
        with pytest.raises(kc.KernelIRError, match="runtime symbol"):
            kc.verify_ir(ir)


# ---- kernels of compiled models and JIT modules ------------------------------------------------
def test_compiled_model_is_exact_across_thread_counts_and_runs():
    model = conv_bn_relu_pool()
    feed = sample_inputs(model, 1, seed=3)[0]
    mod = build_model(model, target="cpu")
    outs = {}
    for threads in (1, 2, 3):
        with Executor(mod, num_threads=threads) as ex:
            first = next(iter(ex.run(feed).values())).copy()
            for _ in range(25):
                np.testing.assert_array_equal(next(iter(ex.run(feed).values())), first)
            s = ex.lib.stats()
            assert s["threads"] == threads
        outs[threads] = first
    np.testing.assert_array_equal(outs[1], outs[2])
    np.testing.assert_array_equal(outs[1], outs[3])


def test_jit_modules_run_parallel_loops_on_the_c_runtime():
    A = te.placeholder((97, 33), name="A")
    B = te.compute((97, 33), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    s = te.create_schedule(B)
    s[B].parallel(B.op.axis[0])
    mod = build(s, [A, B])
    native = runtime.native_runtime()
    assert native is not None
    before = native.stats()
    a = np.random.default_rng(0).random((97, 33), dtype=np.float32)
    for _ in range(20):
        b = np.zeros_like(a)
        mod(a, b)
        np.testing.assert_array_equal(b, a * 2.0 + 1.0)
    after = native.stats()
    launched = sum(after[k] - before[k] for k in ("parallel_launches", "serial_launches", "backed_off_launches"))
    assert launched == 20


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_python_launcher_runs_every_chunk_once(threads):
    """The launcher JIT modules fall back to without a C compiler: same contract."""
    counts = {}
    lock = threading.Lock()

    @ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
    def worker(t, nt, _closure):
        with lock:
            counts[(t, nt)] = counts.get((t, nt), 0) + 1
    addr = ctypes.cast(worker, ctypes.c_void_p).value
    old = runtime.num_threads()
    runtime.set_num_threads(threads)
    try:
        for n in (1, 2, 5, 64):
            counts.clear()
            for _ in range(10):
                assert runtime._launch(addr, None, n) == 0
            nts = {nt for _, nt in counts}
            assert len(nts) == 1
            nt = nts.pop()
            assert nt == (1 if min(threads, n) == 1 else min(n, threads * runtime._CHUNKS_PER_THREAD))
            assert counts == {(t, nt): 10 for t in range(nt)}
    finally:
        runtime.set_num_threads(old)
        runtime._workers.pop(addr, None)


# ---- threads a process may use ------------------------------------------------------------------
def _cgroup_files(tmp_path, v2=None, v1=None):
    """Fake cgroup files: v2's cpu.max text, or v1's (quota, period); absent ones are not written."""
    f2, q1, p1 = tmp_path / "cpu.max", tmp_path / "quota", tmp_path / "period"
    if v2 is not None:
        f2.write_text(v2)
    if v1 is not None:
        q1.write_text(v1[0])
        p1.write_text(v1[1])
    return (str(f2), (str(q1), str(p1)))


@pytest.mark.parametrize("v2, v1, want", [
    ("max 100000\n", None, None),            # v2 without a quota
    ("150000 100000\n", None, 2),           # 1.5 CPUs: two threads, the second partly
    ("50000 100000", None, 1),
    (None, ("-1", "100000"), None),          # v1 without a quota
    (None, ("300000", "100000"), 3),
    (None, None, None),                      # no cgroup files at all
    ("garbage", None, None),
])
def test_cgroup_cpu_limit_reads_v2_then_v1(tmp_path, v2, v1, want):
    assert cgroup_cpu_limit(_cgroup_files(tmp_path, v2, v1)) == want


def test_default_threads_capped_by_the_quota_and_env_checked(monkeypatch):
    monkeypatch.delenv("KIT_NUM_THREADS", raising=False)
    monkeypatch.setattr("host_runtime.executor.cgroup_cpu_limit", lambda: 1)
    assert default_num_threads() == 1
    monkeypatch.setattr("host_runtime.executor.cgroup_cpu_limit", lambda: None)
    assert default_num_threads() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("KIT_NUM_THREADS", "3")
    assert default_num_threads() == 3
    monkeypatch.setenv("KIT_NUM_THREADS", "three")
    with pytest.raises(ExecutorError, match="KIT_NUM_THREADS='three'"):
        default_num_threads()
