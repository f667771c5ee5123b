"""Progress of long steps: library code reports, the command line shows.

Library code (Verilog elaboration, the Verilator build, synthesis, place and route, compiling and
tuning models, running them) wraps long work in `with task("verilator build") as t:` and calls
`t.update(k, total, detail)` where it knows how far it is. It never prints: a task only logs its
start and duration until a front end installs a reporter (`install(terminal_reporter())`, which the
`accel` CLI does when stderr is a terminal and -q is not given). Stdlib only, so every package can
import it.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import Callable, Iterator, Protocol

log = logging.getLogger(__name__)


class Bar(Protocol):
    def update(self, k: int | None, total: int | None, detail: str | None) -> None: ...
    def close(self) -> None: ...


_factory: Callable[[str, int | None], Bar] | None = None


class Task:
    """A long step in progress; `update` moves its bar (if one is shown)."""

    def __init__(self, name: str, bar: Bar | None):
        self.name, self._bar = name, bar

    def update(self, k: int | None = None, total: int | None = None, detail: str | None = None) -> None:
        if self._bar is not None:
            self._bar.update(k, total, detail)


@contextlib.contextmanager
def task(name: str, total: int | None = None) -> Iterator[Task]:
    """Report a long step named `name` (of `total` units when known) while the block runs."""
    bar = _factory(name, total) if _factory is not None else None
    t0 = time.monotonic()
    log.info("%s ...", name)
    try:
        yield Task(name, bar)
    finally:
        if bar is not None:
            bar.close()
        log.info("%s: %.1f s", name, time.monotonic() - t0)


def install(factory: Callable[[str, int | None], Bar] | None) -> None:
    """Show tasks through `factory(name, total) -> Bar` from now on (None: log only)."""
    global _factory
    _factory = factory


def showing() -> bool:
    return _factory is not None


@contextlib.contextmanager
def reporting(factory: Callable[[str, int | None], Bar] | None) -> Iterator[None]:
    """install(factory) for the duration of a block (the CLI's main, tests)."""
    global _factory
    old, _factory = _factory, factory
    try:
        yield
    finally:
        _factory = old


class _TqdmBar:
    """A tqdm bar on a stream; a shared ticker thread redraws it every half second so the elapsed
    time moves while a tool runs without reporting (yosys, the Verilator build)."""
    _live: set = set()
    _lock = threading.Lock()
    _ticker: threading.Thread | None = None

    def __init__(self, name: str, total: int | None, stream):
        from tqdm import tqdm  # noqa: PLC0415 - only the terminal reporter draws bars; this module stays stdlib-only
        fmt = "{desc}: {percentage:3.0f}%|{bar:24}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}" \
            if total else "{desc}: {elapsed}{postfix}"
        self.bar = tqdm(total=total, desc=name, file=stream, leave=False, dynamic_ncols=True, bar_format=fmt,
                        mininterval=0.2)
        self.fmt_known = total is not None
        with self._lock:
            self._live.add(self)
            if _TqdmBar._ticker is None or not _TqdmBar._ticker.is_alive():
                _TqdmBar._ticker = threading.Thread(target=_TqdmBar._tick, daemon=True, name="progress-ticker")
                _TqdmBar._ticker.start()

    @classmethod
    def _tick(cls) -> None:
        while True:
            time.sleep(0.5)
            with cls._lock:
                bars = list(cls._live)
            for b in bars:
                with contextlib.suppress(Exception):
                    b.bar.refresh()

    def update(self, k: int | None, total: int | None, detail: str | None) -> None:
        b = self.bar
        if total is not None and total != b.total:
            b.total = total
            if not self.fmt_known:
                b.bar_format = "{desc}: {percentage:3.0f}%|{bar:24}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}]" \
                               "{postfix}"
                self.fmt_known = True
        if k is not None:
            b.n = k
        if detail is not None:
            b.set_postfix_str(detail[:48], refresh=False)
        b.refresh()

    def close(self) -> None:
        with self._lock:
            self._live.discard(self)
        self.bar.close()


def terminal_reporter(stream=None) -> Callable[[str, int | None], Bar] | None:
    """tqdm bars on `stream` (default stderr) when it is a terminal; None (log only) otherwise."""
    stream = stream or sys.stderr
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return None
    return lambda name, total: _TqdmBar(name, total, stream)


def tqdm_reporter(stream) -> Callable[[str, int | None], Bar]:
    """tqdm bars on `stream` whether or not it is a terminal (tests)."""
    return lambda name, total: _TqdmBar(name, total, stream)
