"""ImportQDQ: take a QDQ model's activation scales instead of calibrating. Each
dequantize_linear(quantize_linear(x)) pair with constant per-tensor scale is removed and x's
range recorded. Each pair keeps its exact scale (Calibration.scales: the quantizer requantizes in
fixed point where it is not a power of two); an asymmetric one (int8 with a zero point, or
uint8) also its zero point (Calibration.zero_points, in int8 terms).
Weights stored as int8 + DequantizeLinear fold to float constants first (fold_constants)."""
from __future__ import annotations

import math

import numpy as np

from ..ir import Graph, Node, rewrite
from .quantize import SHIFT_RANGE, Calibration, pow2_shift


def _qdq_range(q: Node) -> tuple[float, int, float, float, bool] | None:
    """(absmax, shift, lo, hi, symmetric) for a quantize_linear with constant per-tensor
    parameters, else None. [lo, hi] is the range the Q/DQ pair clamps to."""
    if not all(i.is_const for i in q.inputs[1:]) or q.inputs[1].type.size != 1:
        return None
    s = float(q.inputs[1].value.reshape(-1)[0])
    zp = int(q.inputs[2].value.reshape(-1)[0]) if len(q.inputs) == 3 else 0
    info = np.iinfo(q.dtype)
    lo, hi = (info.min - zp) * s, (info.max - zp) * s
    absmax = max(abs(lo), abs(hi))
    if q.dtype == "int8" and zp == 0:
        return absmax, max(SHIFT_RANGE[0], min(SHIFT_RANGE[1], math.floor(-math.log2(s)))), lo, hi, True
    return absmax, pow2_shift(absmax), lo, hi, False


def import_qdq(graph: Graph) -> Graph:
    """Strip activation Q/DQ pairs, recording their scales in graph.meta['qdq']."""
    cal = Calibration()

    def fn(n: Node, old: Node):
        if n.op != "dequantize_linear" or n.inputs[0].op != "quantize_linear":
            return None
        q = n.inputs[0]
        r = _qdq_range(q)
        same = len(n.inputs) == len(q.inputs) and all(
            a.is_const and b.is_const and np.array_equal(a.value, b.value) for a, b in zip(n.inputs[1:], q.inputs[1:]))
        if r is None or not same:
            return None
        x = q.inputs[0]
        absmax, shift, lo, hi, symmetric = r
        cal.absmax[x.name], cal.shifts[x.name], cal.source[x.name] = absmax, shift, "qdq"
        cal.scales[x.name] = float(q.inputs[1].value.reshape(-1)[0])
        if not symmetric:
            # int8 with a zero point; uint8 q is int8 q - 128 with the zero point moved alike. Saturating
            # to [-128, 127] at that zero point is the pair's clamp (a ReLU folded into it included).
            zp = int(q.inputs[2].value.reshape(-1)[0]) - (128 if q.dtype == "uint8" else 0)
            if zp:
                cal.zero_points[x.name] = zp
        return x  # clamping to the pair's range only saturates: the int8 clip does it again
    g = rewrite(graph, fn)
    g.meta["qdq"] = cal
    return g


def rename_range(graph: Graph, old: str, new: str) -> None:
    """A rewrite that gives tensor `old`'s value to a node named `new` carries its QDQ range along."""
    cal = graph.meta.get("qdq")
    if cal is not None and old in cal.shifts and new != old:
        for d in (cal.absmax, cal.shifts, cal.source, cal.scales, cal.zero_points):
            if old in d:
                d[new] = d[old]


def carry_weight_scale(graph: Graph, old: str, new: str) -> None:
    """A rewrite that transposes constant `old` (2-d) into constant `new` keeps the QDQ model's
    weight scale (graph.meta['weight_scales'], see fold_constants) with the values."""
    scales = graph.meta.get("weight_scales")
    if scales is not None and old in scales:
        scales[new] = scales[old].T
