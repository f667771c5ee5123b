"""The timing model in a helper process, overlapped with the functional simulation.

A tsim run is two independent computations: the data (sim.fsim, mostly numpy) and the cycles (the
timing model, pure Python). With a second core the helper process runs the model while the caller
runs fsim, so a run takes about as long as the longer of the two instead of their sum (bench/
sim_speed.py: 1.4x on ResNet-18 layers on 2 cores).

    job = submit(cfg, dram_model, program_bytes, insn_addr, max_cycles, trace)   # None: run it here
    ... fsim ...
    stats = job.result()   # TsimStats; the model's own error (DeadlockError, ...) is raised here;
                           # None when the helper failed (then run the model here)
    job.cancel()           # instead, when the caller's fsim failed

One helper per process, shared by every tsim driver: a plain `python -c` subprocess (not
multiprocessing, whose spawn would re-run the user's __main__ in the child), fed length-prefixed
pickles on its stdin. It keeps one Tsim per (config, DRAM model) and exits when its stdin closes,
so it never outlives its parent. It starts in the background on the first submit; a run that finds
it not ready yet, or busy with another thread's run, gets None and runs the model itself. A helper
that cannot start, dies or replies garbage is dropped with one warning and not tried again in this
process (reset() clears that). Off with ACCEL_TSIM_HELPER=0, on one core, and off POSIX (the
readiness check polls a pipe).
"""
from __future__ import annotations

import atexit
import functools
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

from accel.isa import AccelConfig

from .. import errors
from ..dram import DramModel
from ..errors import SimError
from ..fsim import decode_fetched
from .model import Tsim

log = logging.getLogger(__name__)

_LEN = struct.Struct("<Q")
_READY = b"ready"
_PIPE_ERRORS = (OSError, EOFError, ValueError, pickle.UnpicklingError, struct.error)


_SWITCH = {"": True, "1": True, "true": True, "yes": True, "on": True,
           "0": False, "false": False, "no": False, "off": False}


def enabled() -> bool:
    """Whether runs may use a helper: POSIX, two or more cores, ACCEL_TSIM_HELPER not off, and no
    failed helper in this process. A value of ACCEL_TSIM_HELPER it does not know is an error."""
    value = os.environ.get("ACCEL_TSIM_HELPER", "1")
    switch = _SWITCH.get(value.strip().lower())
    if switch is None:
        raise SimError(f"ACCEL_TSIM_HELPER={value!r}: expected one of 1, 0, true, false, yes, no, on, off")
    return switch and _failed is None and os.name == "posix" and (os.cpu_count() or 1) > 1


def _write_frame(f, obj) -> None:
    data = obj if isinstance(obj, bytes) else pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_LEN.pack(len(data)) + data)
    f.flush()


def _read_exact(f, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            raise EOFError("the helper closed its pipe")
        buf += chunk
    return buf


def _read_frame(f) -> bytes:
    return _read_exact(f, _LEN.unpack(_read_exact(f, _LEN.size))[0])


class _Helper:
    """The helper process and its pipes; one job at a time (`busy`)."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])     # the tree this sim/ was imported from
        code = f"import sys; sys.path.insert(0, {root!r}); from sim.tsim.helper import serve; serve()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.ready = False
        self.busy = False

    def poll_ready(self, timeout: float = 0.0) -> bool:
        """True once the helper has said it is ready (its imports done); waits up to `timeout` s."""
        if not self.ready:
            if self.proc.poll() is not None:
                raise EOFError(f"the helper exited with status {self.proc.returncode} before it was ready")
            if select.select([self.proc.stdout], [], [], timeout)[0]:
                if _read_frame(self.proc.stdout) != _READY:
                    raise EOFError("the helper did not say it was ready")
                self.ready = True
        return self.ready

    def close(self) -> None:
        try:
            self.proc.stdin.close()                          # the helper exits at the end of its input
            self.proc.wait(timeout=2)
        except Exception:   # noqa: BLE001 - ending the process whatever state it is in
            self.proc.kill()


_helper: _Helper | None = None
_failed: str | None = None       # why the helper was given up in this process
_lock = threading.Lock()


def _stop(why: str, failure: bool = True) -> None:
    """Kill the helper (_lock held); after a failure, use none for the rest of the process."""
    global _helper, _failed
    if failure:
        log.warning("tsim helper %s; the timing model runs in-process from now on", why)
        _failed = why
    if _helper is not None:
        _helper.proc.kill()
        try:
            _helper.proc.wait(timeout=2)                     # reap it
        except subprocess.TimeoutExpired:
            pass
        _helper = None


def reset() -> None:
    """Forget a failure (and stop the helper): the next submit or start() makes a new one."""
    global _failed
    with _lock:
        _shutdown()
        _failed = None


def _shutdown() -> None:
    global _helper
    if _helper is not None:
        _helper.close()
        _helper = None


def _after_fork_in_child() -> None:
    """A forked child must not share its parent's helper: drop its copies of the pipes."""
    global _helper, _lock
    _lock = threading.Lock()
    if _helper is not None:
        for f in (_helper.proc.stdin, _helper.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        _helper = None


atexit.register(_shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def start(wait: float = 0.0) -> bool:
    """Start the helper if none is running; True once it is ready (waiting up to `wait` s)."""
    global _helper
    with _lock:
        if not enabled():
            return False
        try:
            if _helper is None:
                _helper = _Helper()
            return _helper.poll_ready(wait)
        except _PIPE_ERRORS as e:
            _stop(f"failed to start ({type(e).__name__}: {e})")
            return False


class Job:
    """One model run in the helper; result() or cancel() must follow submit(), once."""

    def __init__(self, helper: _Helper):
        self.helper = helper

    def _reply(self):
        h = self.helper
        try:
            return pickle.loads(_read_frame(h.proc.stdout))
        except BaseException as e:
            broken = isinstance(e, _PIPE_ERRORS)     # else an interrupt: the pipe is out of step now
            with _lock:
                if _helper is h:
                    _stop(f"failed ({type(e).__name__}: {e})", failure=broken)
            if broken:
                return None
            raise
        finally:
            h.busy = False

    def result(self):
        """The run's TsimStats; raises the model's error; None when the helper failed."""
        reply = self._reply()
        if reply is None:
            return None
        kind, payload = reply
        if kind == "ok":
            return payload
        cls_name, message = payload
        cls = getattr(errors, cls_name, None)
        if not (isinstance(cls, type) and issubclass(cls, errors.SimError)):
            raise errors.SimError(f"timing model: {cls_name}: {message}")
        raise cls(message)

    def cancel(self, wait: bool = True) -> None:
        """Drop the run: read its reply and throw it away (wait), or kill the helper (an interrupt
        should not wait for the model)."""
        if wait:
            self._reply()
            return
        with _lock:
            if _helper is self.helper:
                _stop("interrupted", failure=False)
        self.helper.busy = False


@functools.lru_cache(maxsize=64)
def _setup(cfg, dram) -> bytes:
    """The pickled (config, DRAM model) a request names its model by (to_dict is ~60 us a call)."""
    return pickle.dumps((cfg.to_dict(), dram.to_dict()), protocol=pickle.HIGHEST_PROTOCOL)


def submit(cfg, dram, program: bytes, insn_addr: int, max_cycles: int, trace: bool) -> Job | None:
    """Send one model run to the helper; None when there is no ready, idle helper (run it here)."""
    global _helper
    with _lock:
        if not enabled():
            return None
        try:
            if _helper is None:
                _helper = _Helper()              # starts in the background; this run goes without it
                return None
            h = _helper
            if h.busy or not h.poll_ready():
                return None
            _write_frame(h.proc.stdin, (_setup(cfg, dram), program, insn_addr, max_cycles, trace))
        except _PIPE_ERRORS as e:
            _stop(f"cannot be used ({type(e).__name__}: {e})")
            return None
        h.busy = True
    return Job(h)


def serve() -> None:
    """The helper's loop: requests from stdin, replies on stdout, until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C in a terminal is for the parent, which
    inp, out = sys.stdin.buffer, sys.stdout.buffer   # ends this helper by closing its pipe
    sys.stdout = sys.stderr                          # a stray print must not land in the replies
    models: dict[bytes, Tsim] = {}                    # by their pickled (config, DRAM model)

    def run(setup: bytes, program: bytes, insn_addr: int, max_cycles: int, trace: bool):
        model = models.get(setup)
        if model is None:
            if len(models) >= 16:                    # a test session's many configs: keep a few
                models.clear()
            cfg_d, dram_d = pickle.loads(setup)
            model = models[setup] = Tsim(AccelConfig.from_dict(cfg_d), DramModel.from_dict(dram_d))
        insns, illegal = decode_fetched(program, model.cfg)
        return model.run_insns(insns, insn_addr, max_cycles, trace=trace, illegal=illegal)

    try:
        _write_frame(out, _READY)
        while True:
            request = pickle.loads(_read_frame(inp))
            try:
                reply = ("ok", run(*request))
            except Exception as e:  # noqa: BLE001 - every failure goes back to the caller, by class name
                reply = ("err", (type(e).__name__, str(e)))
            _write_frame(out, reply)
    except (EOFError, OSError):       # the parent closed the pipe (or is gone): done
        return
