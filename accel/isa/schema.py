"""Validation shared by every file the kit reads: JSON text -> Python values with bounded size and
nesting, then typed, ranged fields whose errors name the field, the value and the allowed range.

A file is untrusted input: whatever its bytes, these helpers return checked values or raise the
caller's own AccelError subclass with one line (never UnicodeDecodeError, RecursionError, a
KeyError or a TypeError from deep inside). Config JSON, .accp headers and .accm headers use them.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import AccelError

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays/objects a file may hold (the kit's own files need 4)."""

MAX_JSON_BYTES = 64 << 20
"""Largest JSON text parsed (a .accm header listing thousands of steps is a few MiB)."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def describe(value: Any, limit: int = 60) -> str:
    """repr() of a value cut to `limit` characters: a crafted file must not make a huge message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"<{'negative ' if value < 0 else ''}integer of {value.bit_length()} bits>"
    r = repr(value)
    return r if len(r) <= limit else r[:limit - 3] + "..."


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def decode_text(data: bytes, what: str, error: type[AccelError]) -> str:
    """UTF-8 bytes -> str; invalid bytes raise `error` naming the file and the byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})") from None


def read_bounded(path, limit: int, what: str, error: type[AccelError]) -> bytes:
    """A file's bytes, at most `limit` of them: a device or FIFO named as input (/dev/zero) must
    not make the kit read forever, nor a huge file fill memory."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"cannot read {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{what}: more than {limit} bytes, the most this kind of file may hold")
    return data


def json_depth(data: bytes) -> int:
    """Deepest array/object nesting of JSON text (brackets inside strings do not count)."""
    depth = deepest = 0
    for m in _BRACKETS.finditer(_STRING.sub(b'""', data)):
        if m.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(data: bytes | str, what: str, error: type[AccelError], max_depth: int = MAX_JSON_DEPTH,
               max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Strict JSON (no NaN/Infinity, UTF-8, at most max_depth levels, max_bytes long) -> value.

    The depth is checked before parsing: the json module recurses per level, so a deep file would
    end in RecursionError (or worse, recursion in the code that walks the result)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > max_bytes:
        raise error(f"{what}: {len(raw)} bytes of JSON, more than the {max_bytes} allowed")
    text = decode_text(raw, what, error).removeprefix("\ufeff")   # a BOM some editors write
    depth = json_depth(raw)
    if depth > max_depth:
        raise error(f"{what}: JSON nested {depth} levels deep, more than the {max_depth} allowed")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:   # JSONDecodeError, too many digits, NaN
        raise error(f"{what}: invalid JSON ({e})") from None


class Fields:
    """Typed access to one JSON object; every error names `where`.`key`, the value and the rule.

        h = Fields(header, "prog.accp: header", ProgramFormatError)
        n = h.int("insn_count", 0, MAX_INSNS)
    """

    def __init__(self, obj: Any, where: str, error: type[AccelError]):
        if not isinstance(obj, dict):
            raise error(f"{where}: expected a JSON object, got {json_type(obj)}")
        self.obj, self.where, self.error = obj, where, error

    def fail(self, key: str, value: Any, why: str):
        raise self.error(f"{self.where}.{key}={describe(value)}: {why}")

    def require_keys(self, required: set[str] | frozenset[str], optional: set[str] | frozenset[str] = frozenset()):
        """Every required key present, no key outside required | optional."""
        missing = sorted(required - set(self.obj))
        if missing:
            raise self.error(f"{self.where}: missing key(s) {', '.join(map(repr, missing))}")
        allowed = set(required) | set(optional)
        unknown = sorted(map(describe, set(self.obj) - allowed))
        if unknown:
            raise self.error(f"{self.where}: unknown key(s) {', '.join(unknown)}; allowed keys are "
                             f"{', '.join(sorted(allowed))}")

    def get(self, key: str, default: Any = ...) -> Any:
        if key not in self.obj:
            if default is ...:
                raise self.error(f"{self.where}: missing key {key!r}")
            return default
        return self.obj[key]

    def int(self, key: str, lo: int, hi: int, default: Any = ...) -> int:
        return check_int(self.get(key, default), f"{self.where}.{key}", lo, hi, self.error)

    def number(self, key: str, lo: float, hi: float, default: Any = ...) -> float:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
            self.fail(key, v, f"must be a number in [{lo:g}, {hi:g}]")
        return v

    def bool(self, key: str, default: Any = ...) -> bool:
        v = self.get(key, default)
        if not isinstance(v, bool):
            self.fail(key, v, "must be true or false")
        return v

    def str(self, key: str, max_len: int = 4096, default: Any = ..., choices=None) -> str:
        v = self.get(key, default)
        if not isinstance(v, str) or len(v) > max_len:
            self.fail(key, v, f"must be a string of at most {max_len} characters")
        if choices is not None and v not in choices:
            self.fail(key, v, f"allowed values are {', '.join(map(str, choices))}")
        return v

    def list(self, key: str, max_len: int, default: Any = ...) -> list:
        v = self.get(key, default)
        if not isinstance(v, list) or len(v) > max_len:
            self.fail(key, v if not isinstance(v, list) else f"<{len(v)} items>",
                      f"must be an array of at most {max_len} items")
        return v

    def obj(self, key: str, default: Any = ...) -> "Fields":
        v = self.get(key, default)
        return Fields(v, f"{self.where}.{key}", self.error)

    def dict(self, key: str, max_len: int, default: Any = ...) -> dict:
        v = self.get(key, default)
        if not isinstance(v, dict) or len(v) > max_len:
            self.fail(key, v if not isinstance(v, dict) else f"<{len(v)} keys>",
                      f"must be an object of at most {max_len} keys")
        return v


def check_int(value: Any, where: str, lo: int, hi: int, error: type[AccelError]) -> int:
    """An integer (not a bool, not a float) in [lo, hi], or `error` naming `where`, value and range."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise error(f"{where}={describe(value)}: must be an integer in [{lo}, {hi}]")
    return value


__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "Fields", "check_int", "decode_text", "describe", "json_depth",
           "json_type", "parse_json", "read_bounded"]
