"""The one registry of target names, for the runtime and the compiler (compiler.targets registers
into it), and how installed plug-in targets are found.

A module file records the name of the target it was built for and, for a plug-in target, its
version. Loading the file resolves that name here and nowhere else:
- a built-in target (accel, cpu, opencl, cuda): the executor runs its steps itself;
- a registered target (register_runtime_target, or compiler.targets.register_target);
- an installed plug-in: a distribution whose entry point in the group `accel_kit.targets` has the
  target's name. Its value is a module that registers the target when imported, or a function
  that registers it when called with no arguments.
Anything else is refused with one line naming the target and the ones there are. The file picks
a name among the targets the user installed or registered, never a Python module to import; a
plug-in's steps (kind 'plugin') call only kernels the plug-in registered, by name.

    register_runtime_target(RuntimeTarget("toy", "1.2.0", kernels={"relu": fn}))
    resolve_target("toy")          # RuntimeTarget, loading the installed plug-in on first use
"""
from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .errors import HostRuntimeError

log = logging.getLogger(__name__)

#: the entry point group installed target packages register in (the entry point's name is the target's)
ENTRY_POINT_GROUP = "accel_kit.targets"
#: targets whose steps the executor runs itself (kinds accel, llvm, native, numpy, gpu)
BUILTIN_TARGETS = ("accel", "cpu", "opencl", "cuda")
#: the step kinds the runtime knows; a plug-in target cannot take one of these as its name
RESERVED_NAMES = ("accel", "llvm", "native", "numpy", "gpu", "plugin")
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")

#: kernel(attrs, *inputs) -> output array; check(attrs, inputs, out) -> None or why the step is refused,
#: inputs given as a constant's array or a tensor's (shape, dtype), out as (shape, dtype)
Kernel = Callable[..., np.ndarray]
KernelCheck = Callable[..., "str | None"]


class TargetError(HostRuntimeError, LookupError):
    """A target name no one registered or installed, a plug-in that does not load or register, or
    a module built by a plug-in version the installed one does not accept."""


class UnknownTargetError(TargetError):
    """A target name that is neither built in, registered nor installed."""


@dataclass
class RuntimeTarget:
    """What the runtime knows of a target: its name, version and the kernels its 'plugin' steps call.

    kernels: kernel name -> fn(attrs, *inputs) -> array (the plug-in's own code; a module file
    names one by its name only). checks: kernel name -> check(attrs, inputs, out), run on every
    step before anything runs so that a file's attributes cannot make a kernel write past its
    output. builtin: the executor runs this target's steps itself."""
    name: str
    version: str = ""
    kernels: dict[str, Kernel] = field(default_factory=dict)
    checks: dict[str, KernelCheck] = field(default_factory=dict)
    builtin: bool = False

    def accepts(self, built_with: str) -> str | None:
        """None if a module built with plug-in version `built_with` runs on this one, else why not.
        The default: the same major version (the text before the first dot)."""
        if built_with.split(".")[0] != self.version.split(".")[0]:
            return (f"it was built with {self.name} {built_with}, the installed {self.name} is {self.version} "
                    f"(another major version); recompile the model with this one")
        return None


_REGISTRY: dict[str, RuntimeTarget] = {n: RuntimeTarget(n, builtin=True) for n in BUILTIN_TARGETS}
#: entry points already loaded (a plug-in is imported once) -> None, or the error it failed with
_LOADED: dict[str, TargetError | None] = {}


def register_runtime_target(target: RuntimeTarget, replace: bool = False) -> RuntimeTarget:
    """Make a plug-in target's name and kernels known to the runtime (compiler.targets.register_target
    calls this for every target it registers). The built-in targets cannot be replaced."""
    name = target.name
    if not isinstance(name, str) or not name.isidentifier():
        raise TargetError(f"register_runtime_target: name {name!r} is not an identifier")
    if name in BUILTIN_TARGETS or name in RESERVED_NAMES:
        raise TargetError(f"register_runtime_target: {name!r} is a built-in target or step kind "
                          f"({', '.join(sorted(set(BUILTIN_TARGETS + RESERVED_NAMES)))})")
    if not isinstance(target.version, str) or not _VERSION.fullmatch(target.version):
        raise TargetError(f"register_runtime_target: target {name!r} has version {target.version!r}; a plug-in "
                          f"declares a version such as '1.0.0' (letters, digits, . + _ -; the module records it)")
    for k, fn in target.kernels.items():
        if not isinstance(k, str) or not k or not callable(fn):
            raise TargetError(f"register_runtime_target: target {name!r} kernel {k!r} is not a named callable")
    old = _REGISTRY.get(name)
    if old is not None and old is not target and not replace:
        raise TargetError(f"register_runtime_target: target {name!r} is registered already (pass replace=True)")
    _REGISTRY[name] = target
    return target


def unregister_runtime_target(name: str) -> None:
    """Forget a plug-in target (the built-ins stay)."""
    if name not in BUILTIN_TARGETS:
        _REGISTRY.pop(name, None)


def registered_targets() -> tuple[str, ...]:
    """Names of the registered targets, built-ins first (installed plug-ins not loaded yet are not here)."""
    return tuple(_REGISTRY)


_EP_CACHE: list = [None, ()]   # [key, entry points]: the scan costs tens of ms, a refused file must not


def _entry_points() -> tuple:
    """The installed entry points of the group, rescanned when sys.path or a folder on it changes."""
    key = []
    for p in sys.path:
        try:
            key.append((p, os.stat(p or ".").st_mtime_ns))
        except OSError:
            key.append((p, None))
    key = tuple(key)
    if _EP_CACHE[0] != key:
        try:
            eps = tuple(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
        except Exception as e:  # noqa: BLE001 - a broken distribution's metadata must not stop the kit
            log.warning("cannot read the installed %s entry points: %s", ENTRY_POINT_GROUP, e)
            eps = ()
        _EP_CACHE[:] = [key, eps]
    return _EP_CACHE[1]


def installed_targets() -> dict[str, str]:
    """Plug-in targets installed as entry points (group accel_kit.targets): name -> entry point value."""
    out: dict[str, str] = {}
    for ep in _entry_points():
        out.setdefault(ep.name, ep.value)
    return out


def target_names() -> tuple[str, ...]:
    """Every target a name can resolve to: the registered ones, then installed plug-ins not loaded yet."""
    names = list(_REGISTRY)
    names += [n for n in installed_targets() if n not in _REGISTRY]
    return tuple(names)


def _load_installed(name: str) -> None:
    """Import the installed plug-in whose entry point is named `name` (once); it registers itself."""
    if name in _LOADED:
        if _LOADED[name] is not None:
            raise _LOADED[name]
        return
    eps = [ep for ep in _entry_points() if ep.name == name]
    if not eps:
        return
    values = sorted({ep.value for ep in eps})
    if len(values) > 1:
        raise TargetError(f"target {name!r} is installed twice ({', '.join(values)}); uninstall one of them")
    ep = eps[0]
    _LOADED[name] = None
    err = None
    try:
        obj = ep.load()
        if name not in _REGISTRY and callable(obj):
            obj()
    except Exception as e:  # noqa: BLE001 - any failure inside the plug-in's own code
        err = TargetError(f"installed target {name!r} ({ENTRY_POINT_GROUP} entry point {ep.value}) failed to "
                          f"load: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
    if err is None and name not in _REGISTRY:
        err = TargetError(f"installed target {name!r} ({ENTRY_POINT_GROUP} entry point {ep.value}) loaded but "
                          f"registered no target of that name")
    if err is not None:
        _LOADED[name] = err
        raise err
    log.info("loaded target %r from %s", name, ep.value)


def resolve_target(name) -> RuntimeTarget:
    """The registered target `name`, loading an installed plug-in of that name first if need be.
    TargetError names the target and lists the ones there are."""
    if not isinstance(name, str) or not name.isidentifier():
        raise UnknownTargetError(f"{_short(name)} is not a target name; targets are {', '.join(target_names())}")
    if name not in _REGISTRY:
        _load_installed(name)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownTargetError(f"target {name!r} is not registered or installed here; targets are "
                          f"{', '.join(target_names())}") from None


def check_versions(target: str, versions: dict[str, str], kernel_targets: set[str]) -> str | None:
    """None if a module of build target `target`, recording `versions` (plug-in name -> version it
    was built with) and holding 'plugin' steps of `kernel_targets`, can run here; else why not.
    Resolves (and so loads) every plug-in it names."""
    for name in [target, *sorted(kernel_targets - {target}), *sorted(set(versions) - kernel_targets - {target})]:
        rt = resolve_target(name)
        if rt.builtin:
            if name in versions:
                return f"records a version for the built-in target {name!r}"
            continue
        if name not in versions:
            return f"records no version of target {name!r}"
        why = rt.accepts(versions[name])
        if why:
            return f"target {name!r}: {why}"
    return None


def current_versions(names) -> dict[str, str]:
    """name -> version of each registered plug-in target among `names` (what a module being built records)."""
    return {n: _REGISTRY[n].version for n in sorted(set(names)) if n in _REGISTRY and not _REGISTRY[n].builtin}


def plugin_kernel(symbol) -> tuple[str, str]:
    """(target, kernel) of a 'plugin' step's symbol "target:kernel"."""
    t, sep, k = symbol.partition(":") if isinstance(symbol, str) else ("", "", "")
    if not sep or not t.isidentifier() or not k:
        raise TargetError(f"plugin step symbol {_short(symbol)} is not 'target:kernel'")
    return t, k


def _short(v, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[:n - 3] + "..."


__all__ = ["BUILTIN_TARGETS", "ENTRY_POINT_GROUP", "RuntimeTarget", "TargetError", "UnknownTargetError", "check_versions",
           "current_versions", "installed_targets", "plugin_kernel", "register_runtime_target", "registered_targets", "resolve_target", "target_names",
           "unregister_runtime_target"]
