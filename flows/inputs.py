"""What a user hands the flows and the CLI on the command line: array files (.npy/.npz, read
without pickle and bounded before anything is allocated), model inputs by name or position,
calibration samples, --shape and --force specs, and the output-path checks that keep a command
from overwriting its own inputs. Shared by accel.cli and the flows; numpy and accel.isa only, so
every subcommand may import it without cost.
"""
from __future__ import annotations

import os
import stat
import zipfile
import zlib

import numpy as np
from numpy.lib import format as npf

from .errors import InputError

#: the most bytes of array data one --input/--calibration file may hold once inflated (an .npz's
#: members are compressed: their declared sizes are checked before anything is read)
MAX_ARRAY_FILE_BYTES = 4 << 30


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def npy_header(f, label: str) -> int:
    """Read an .npy header at f's position; the bytes of data it promises. InputError (naming label)
    for a malformed header, object arrays (they need pickle, never loaded) and non-numeric dtypes."""
    try:
        version = npf.read_magic(f)
        read = {(1, 0): npf.read_array_header_1_0, (2, 0): npf.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
        shape, _, dtype = read(f)
    except (ValueError, EOFError, SyntaxError, TypeError, OverflowError) as e:
        raise InputError(f"{label}: not a valid .npy array (bad header: {one_line(e)})") from None
    if dtype.hasobject:
        raise InputError(f"{label}: holds Python objects (dtype {dtype}); object arrays need pickle, which the kit "
                       f"never loads")
    if dtype.kind not in "biuf" or dtype.fields is not None:
        raise InputError(f"{label}: dtype {dtype} is not numeric (bool, int, uint or float arrays only)")
    n = 1
    for d in shape:
        n *= d
    return n * dtype.itemsize


def load_array_file(path: str, what: str = "--input"):
    """An .npy file -> its array; an .npz -> {name: array}. Pickles and object arrays are refused
    (allow_pickle=False); a truncated, corrupt or non-numeric file -> one InputError naming it."""
    label = f"{what} {path}"
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"{label}: not a regular file")
            head = f.read(6)
            f.seek(0)
            if head == b"\x93NUMPY":
                need = npy_header(f, label)
                have = st.st_size - f.tell()
                if need > have:
                    raise InputError(f"{label}: truncated .npy file: its header promises {need} bytes of data, "
                                   f"the file holds {have}")
                f.seek(0)
                try:
                    return np.lib.format.read_array(f, allow_pickle=False)
                except (ValueError, EOFError, OSError, MemoryError) as e:
                    raise InputError(f"{label}: corrupt .npy file ({one_line(e)})") from None
            if not head.startswith(b"PK"):
                raise InputError(f"{label}: not an .npy or .npz file (pickled or unknown data; the kit loads no "
                               f"pickles)")
            try:
                with zipfile.ZipFile(f) as z:
                    infos = z.infolist()
                    total = sum(i.file_size for i in infos)
                    if total > MAX_ARRAY_FILE_BYTES:
                        raise InputError(f"{label}: its arrays would take {total} bytes, more than the "
                                       f"{MAX_ARRAY_FILE_BYTES} bytes an array file may hold")
                    out = {}
                    for i in infos:
                        if not i.filename.endswith(".npy"):
                            raise InputError(f"{label}: member {i.filename!r} is not an .npy array")
                        key = i.filename[:-4]
                        with z.open(i) as m:
                            need = npy_header(m, f"{label}: array {key!r}")
                        if need > i.file_size:
                            raise InputError(f"{label}: array {key!r} is truncated: its header promises {need} "
                                           f"bytes of data, the member holds {i.file_size}")
                        with z.open(i) as m:
                            out[key] = np.lib.format.read_array(m, allow_pickle=False)
                    return out
            except (zipfile.BadZipFile, zlib.error, ValueError, EOFError, NotImplementedError, RuntimeError,
                    MemoryError, KeyError) as e:
                raise InputError(f"{label}: corrupt .npz file ({one_line(e)})") from None
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or one_line(e)}") from None


def read_inputs(mod, specs: list[str]) -> dict:
    names = mod.input_names
    if not specs:
        shapes = ", ".join(f"{n}: {mod.input_spec(n).dtype}{list(mod.input_spec(n).shape)}" for n in names)
        raise InputError(f"give the model's inputs with --input ({shapes}), or --input random")
    feeds, positional = {}, []
    for spec in specs:
        if spec == "random":
            rng = np.random.default_rng(0)
            for n in names:
                t = mod.input_spec(n)
                feeds.setdefault(n, rng.standard_normal(t.shape).astype(t.dtype))
            continue
        name, sep, file = spec.partition("=")
        if not sep:
            name, file = None, spec
        if name is not None and name not in names:
            raise InputError(f"--input {spec!r}: the model has no input {name!r}; inputs are {', '.join(names)}")
        data = load_array_file(file)
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(names))
            if unknown:
                raise InputError(f"--input {file}: arrays {', '.join(unknown)} are not inputs of the model "
                               f"(inputs are {', '.join(names)})")
            feeds.update(data)
        elif name is not None:
            feeds[name] = data
        else:
            positional.append((file, data))
    rest = [n for n in names if n not in feeds]
    if len(positional) > len(rest):
        raise InputError(f"{len(positional)} unnamed --input file(s) for {len(rest)} remaining input(s) "
                       f"({', '.join(rest) or 'none'})")
    for n, (_, data) in zip(rest, positional):
        feeds[n] = data
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InputError(f"no --input for {', '.join(missing)}")
    for n in names:
        t = mod.input_spec(n)
        if tuple(np.shape(feeds[n])) != tuple(t.shape):
            raise InputError(f"input {n!r}: expected shape {list(t.shape)}, got {list(np.shape(feeds[n]))}")
    return feeds


def shape_specs(specs) -> dict[str, list[int]]:
    """--shape NAME=DxDx.. options -> {input name: dims}."""
    shapes = {}
    for spec in specs:
        name, sep, dims = spec.partition("=")
        try:
            shapes[name] = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise InputError(f"--shape {spec!r}: expected NAME=DxDx.., e.g. x=1x3x224x224") from None
        if not sep or not name:
            raise InputError(f"--shape {spec!r}: expected NAME=DxDx..")
    return shapes


def force_specs(specs) -> dict[str, str]:
    """--force OP=TARGET options -> {ONNX op type: target}; the build checks TARGET is registered."""
    force = {}
    for spec in specs:
        op, sep, tgt = spec.partition("=")
        if not sep or not op or not tgt:
            raise InputError(f"--force {spec!r}: expected OP=TARGET, e.g. Conv=cpu")
        force[op] = tgt
    return force


def calibration(path: str | None, graph_inputs: list, shapes: dict | None = None) -> list[dict] | None:
    """--calibration FILE -> a list of feeds; each input's array must be (S, *input shape)."""
    if path is None:
        return None
    names = [getattr(i, "name", i) for i in graph_inputs]
    shapes = dict(shapes or {})
    for i in graph_inputs:
        if hasattr(i, "shape"):
            shapes.setdefault(i.name, tuple(i.shape))
    data = load_array_file(path, "--calibration")
    if not isinstance(data, dict):
        if len(names) != 1:
            raise InputError(f"--calibration {path}: a .npy serves one-input models; this one takes "
                           f"{', '.join(names)} (use an .npz with one array per input name)")
        data = {names[0]: data}
    missing = [n for n in names if n not in data]
    if missing:
        raise InputError(f"--calibration {path}: no samples for input(s) {', '.join(missing)} (arrays in the file: "
                       f"{', '.join(data) or 'none'})")
    for n in names:
        want = shapes.get(n)
        got = tuple(np.shape(data[n]))
        if want is not None and all(isinstance(d, int) for d in want) and (len(got) != len(want) + 1
                                                                           or got[1:] != tuple(want)):
            raise InputError(f"--calibration {path}: input {n!r} must have shape (S, {', '.join(map(str, want))}) "
                           f"(S samples of shape {list(want)}), got {list(got)}")
    counts = {len(data[n]) for n in names}
    if len(counts) != 1:
        raise InputError(f"--calibration {path}: inputs have different sample counts {sorted(counts)}")
    return [{n: data[n][k] for n in names} for k in range(counts.pop())]


def spec_file(spec: str) -> str:
    """The file of a NAME=FILE or ADDR=FILE spec (the spec itself when it is a file)."""
    name, sep, file = spec.partition("=")
    return file if sep and not os.path.exists(spec) else spec


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:   # one does not exist (yet): compare where they would be
        return os.path.realpath(a) == os.path.realpath(b)
