"""`accel compile --emit DIR`: a compiled model's generated sources as files, for inspection.

Each registered target writes its own (Target.emit): the GPU targets a file per kernel
(<symbol>.cl for OpenCL C, <symbol>.ptx for PTX), the CPU target per kernel module its LLVM IR
(kernels<k>.ll) and this host's assembly of it (kernels<k>.s). Nothing here is needed to run the
model: the module file carries the same text.
"""
from __future__ import annotations

import logging
from pathlib import Path

from .errors import CompilerError
from .targets import get_target, target_names

log = logging.getLogger(__name__)


def emit_sources(mod, out_dir) -> list[Path]:
    """Write the sources of `mod` (a CompiledModule or ModuleImage) under out_dir; the paths."""
    d = Path(out_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompilerError(f"--emit {out_dir}: cannot create the folder ({e.strerror})") from None
    written: list[Path] = []
    for name in target_names():
        written += get_target(name).emit(mod, d)
    log.info("--emit %s: %d file(s)", d, len(written))
    return written
