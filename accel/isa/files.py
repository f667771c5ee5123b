"""Files the kit writes are whole or absent: data goes to a temporary file beside the target
(unique per process, so parallel writers never share one) that is renamed into place. Caches
shared by parallel processes (Verilog, Verilator builds) are guarded by an advisory file lock."""
from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


def write_atomic(path: str | Path, data: bytes | str) -> None:
    """Write `data` to `path` in full or not at all; OSError (after cleaning up) if it cannot."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
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
