"""`accel compile --emit DIR`: a compiled model's generated sources as files, for inspection.

Per GPU step its kernel (<symbol>.cl for OpenCL C, <symbol>.ptx for PTX); per CPU kernel module
its LLVM IR (kernels<k>.ll) and this host's assembly of it (kernels<k>.s). Nothing here is
needed to run the model: the module file carries the same text.
"""
from __future__ import annotations

import logging
from pathlib import Path

from .errors import CompilerError

log = logging.getLogger(__name__)


def emit_sources(mod, out_dir) -> list[Path]:
    """Write the sources of `mod` (a CompiledModule or ModuleImage) under out_dir; the paths."""
    d = Path(out_dir)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompilerError(f"--emit {out_dir}: cannot create the folder ({e.strerror})") from None
    written: list[Path] = []

    def write(name: str, text: str) -> None:
        p = d / name
        try:
            p.write_text(text)
        except OSError as e:
            raise CompilerError(f"--emit {out_dir}: cannot write {name} ({e.strerror})") from None
        written.append(p)
    seen = set()
    for s in mod.steps:
        if s.kind != "gpu" or s.symbol in seen:
            continue
        seen.add(s.symbol)
        ext = ".cl" if s.attrs.get("lang") == "opencl" else ".ptx"
        write(f"{s.symbol}{ext}", s.attrs["source"])
    for k, ks in enumerate(mod.kernels):
        write(f"kernels{k}.ll", ks.ir)
        try:
            write(f"kernels{k}.s", _host_asm(ks.ir))
        except RuntimeError as e:   # the IR is the module's; assembly is a convenience
            log.warning("kernels%d.s not written: %s", k, e)
    return written


def _host_asm(ir_text: str) -> str:
    import llvmlite.binding as llvm
    from .build import parse_target
    tm = parse_target("llvm").target_machine()
    m = llvm.parse_assembly(ir_text)
    return tm.emit_assembly(m)
