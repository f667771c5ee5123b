"""Data types of the loop IR and tensor expressions, as strings: "float32", vectors "float32x8".

Scalars: bool, int8/16/32/64, uint8, float16/32/64. A vector type only arises inside the
compiler (vectorize lowering); users write scalar dtypes. `promote` is the one rule for mixing.
"""
from __future__ import annotations

from ..errors import DTypeError

#: dtype -> (kind, bits); kind is "int" (signed), "uint", "float" or "bool".
SCALARS: dict[str, tuple[str, int]] = {
    "bool": ("bool", 1),
    "int8": ("int", 8),
    "int16": ("int", 16),
    "int32": ("int", 32),
    "int64": ("int", 64),
    "uint8": ("uint", 8),
    "float16": ("float", 16),
    "float32": ("float", 32),
    "float64": ("float", 64),
}

#: dtype of loop variables and index arithmetic.
INDEX = "int32"


def split_lanes(dtype: str) -> tuple[str, int]:
    """'float32x8' -> ('float32', 8); 'int8' -> ('int8', 1). Raises DTypeError if unknown."""
    if not isinstance(dtype, str):
        raise DTypeError(f"dtype must be a string such as 'float32', got {dtype!r}")
    base, lanes = dtype, 1
    if "x" in dtype:
        base, _, n = dtype.rpartition("x")
        if not n.isdigit() or int(n) < 1:
            raise DTypeError(f"unknown dtype {dtype!r}")
        lanes = int(n)
    if base not in SCALARS:
        raise DTypeError(f"unknown dtype {dtype!r}; supported: {', '.join(SCALARS)}")
    return base, lanes


def check(dtype: str) -> str:
    """Return dtype if it is a known scalar or vector dtype, else raise DTypeError."""
    split_lanes(dtype)
    return dtype


def element(dtype: str) -> str:
    return split_lanes(dtype)[0]


def lanes(dtype: str) -> int:
    return split_lanes(dtype)[1]


def with_lanes(dtype: str, n: int) -> str:
    base = element(dtype)
    return base if n == 1 else f"{base}x{n}"


def kind(dtype: str) -> str:
    return SCALARS[element(dtype)][0]


def bits(dtype: str) -> int:
    return SCALARS[element(dtype)][1]


def is_float(dtype: str) -> bool:
    return kind(dtype) == "float"


def is_int(dtype: str) -> bool:
    """Signed or unsigned integer (not bool)."""
    return kind(dtype) in ("int", "uint")


def is_signed(dtype: str) -> bool:
    return kind(dtype) == "int"


def is_bool(dtype: str) -> bool:
    return kind(dtype) == "bool"


def promote(a: str, b: str, what: str = "binary operation") -> str:
    """Result dtype of mixing two scalar dtypes (lanes must agree).

    Same dtype -> itself; float with anything non-float -> the float; two floats or two
    integers of the same signedness -> the wider; int with uint -> the signed type wide
    enough for both (int8 + uint8 -> int16). bool mixes only with bool.
    """
    if a == b:
        return a
    (ea, la), (eb, lb) = split_lanes(a), split_lanes(b)
    if la != lb:
        raise DTypeError(f"{what}: lanes differ ({a} vs {b})")
    ka, kb = SCALARS[ea][0], SCALARS[eb][0]
    if "bool" in (ka, kb):
        raise DTypeError(f"{what}: cannot mix {a} and {b}; cast the bool explicitly")
    if ka == "float" or kb == "float":
        if ka == kb:
            res = ea if SCALARS[ea][1] >= SCALARS[eb][1] else eb
        else:
            res = ea if ka == "float" else eb
    elif ka == kb:
        res = ea if SCALARS[ea][1] >= SCALARS[eb][1] else eb
    else:
        need = max(SCALARS[ea][1] if ka == "int" else 2 * SCALARS[ea][1],
                   SCALARS[eb][1] if kb == "int" else 2 * SCALARS[eb][1])
        res = f"int{min(max(need, 8), 64)}"
    return with_lanes(res, la)


def min_value(dtype: str):
    """Smallest value (identity of max-reduction): -inf for floats."""
    k, nb = SCALARS[element(dtype)]
    if k == "float":
        return float("-inf")
    if k == "int":
        return -(1 << (nb - 1))
    return 0


def max_value(dtype: str):
    """Largest value (identity of min-reduction): +inf for floats."""
    k, nb = SCALARS[element(dtype)]
    if k == "float":
        return float("inf")
    if k == "int":
        return (1 << (nb - 1)) - 1
    if k == "bool":
        return 1
    return (1 << nb) - 1


def to_numpy(dtype: str) -> str:
    """Name of the numpy dtype of a scalar dtype."""
    return element(dtype)
