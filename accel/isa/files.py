"""Files the kit writes are whole or absent: data goes to a temporary file beside the target
(unique per process, so parallel writers never share one) that is renamed into place. Caches
shared by parallel processes (Verilog, Verilator builds) are guarded by an advisory file lock."""
from __future__ import annotations

import fcntl
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status);
    elsewhere set to 0o077 for an instant (a file another thread makes then is only stricter)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o077)
    os.umask(old)
    return old


def write_atomic(path: str | Path, data: bytes | str, mode: int | None = None) -> None:
    """Write `data` to `path` in full or not at all; OSError (after cleaning up) if it cannot.

    The file gets `mode`, or else the mode of the file it replaces, or else 0o666 less the umask,
    as open() would give it (mkstemp's temporary file is 0o600 whatever the umask)."""
    path = Path(path)
    if mode is None:
        try:
            st = os.stat(path)
            mode = stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None
        except OSError:
            pass
    if mode is None:
        mode = 0o666 & ~current_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            os.fchmod(f.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def file_lock(path: str | Path):
    """Hold an exclusive advisory lock on `path` (created if missing) for the with-block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
