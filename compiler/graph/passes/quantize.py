"""Quantize: float graph -> int8 with power-of-two scales (value = q * 2^-shift), as the
accelerator requantizes with an arithmetic shift: int32 accumulation, bias added in int32 (with the
rounding half folded in), SHR by in_shift + w_shift - out_shift, CLIP to [-127, 127].

Activation shifts come from calibration on sample inputs (`calibrate`) or from a QDQ model's own
scales (`import_qdq`); weight shifts from the weights. conv2d/dense with constant weights become
qconv2d/qdense; add of activations becomes qadd; ops exact on int8 with an unchanged scale (relu,
clip, max pooling, reshape, transpose, slice, pad by zero, concat) stay int8; everything else runs
in float between dequantize/quantize nodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..interpret import run
from ..errors import QuantizeError
from ..ir import Graph, Node
from ..ops import INT8_MAX

SHIFT_RANGE = (-8, 24)  # activation/weight shifts outside this are clamped (and reported)
SHR_RANGE = (-32, 31)  # what one SHR of a 32-bit accumulator can do (AluOp.SHR, acc_width 32)

#: ops whose int8 result is exact at the input's scale (attrs adjusted by _int8_attrs).
SCALE_PRESERVING = ("relu", "clip", "max_pool2d", "reshape", "transpose", "slice", "take", "pad")
#: ops whose output values are a subset of their input's (a missing range is the input's).
RANGE_PRESERVING = ("reshape", "transpose", "slice", "take", "max_pool2d")
#: consumers whose range, not the producer's, sets a conv/dense/add output shift (saturating
#: before them is harmless: they clamp anyway).
CLAMPING = ("relu", "clip")


def pow2_shift(absmax: float) -> int:
    """The largest k with absmax * 2^k <= 127 (so absmax is representable), clamped to SHIFT_RANGE."""
    if not absmax > 0 or not math.isfinite(absmax):
        return 0
    k = math.floor(math.log2(INT8_MAX / absmax))
    return max(SHIFT_RANGE[0], min(SHIFT_RANGE[1], k))


@dataclass
class Calibration:
    """Per-tensor ranges and shifts, from sample inputs or a QDQ model's scales."""
    absmax: dict[str, float] = field(default_factory=dict)
    shifts: dict[str, int] = field(default_factory=dict)
    source: dict[str, str] = field(default_factory=dict)
    samples: int = 0

    def table(self) -> str:
        rows = [f"{'tensor':32} {'source':11} {'absmax':>10} {'shift':>5} {'step':>10} {'max':>10} {'use':>5}"]
        for name, k in self.shifts.items():
            a = self.absmax.get(name, float("nan"))
            top = INT8_MAX * 2.0 ** -k
            rows.append(f"{name[:32]:32} {self.source.get(name, ''):11} {a:10.4g} {k:5d} {2.0 ** -k:10.4g} "
                        f"{top:10.4g} {a / top:5.0%}")
        return "\n".join(rows)

    def merged(self, other: "Calibration") -> "Calibration":
        """self's entries, with other's filling the gaps."""
        c = Calibration(dict(other.absmax), dict(other.shifts), dict(other.source), max(self.samples, other.samples))
        c.absmax.update(self.absmax)
        c.shifts.update(self.shifts)
        c.source.update(self.source)
        return c


def calibrate(graph: Graph, samples) -> Calibration:
    """Run the float graph on sample feeds; record every float tensor's max |value| and its shift."""
    samples = list(samples)
    if not samples:
        raise QuantizeError("calibrate: no sample inputs given")
    cal = Calibration(samples=len(samples))
    for feed in samples:
        _, env = run(graph, feed, keep=True)
        for n in graph.nodes:
            if n.op == "const" or not n.dtype.startswith("float"):
                continue
            a = float(np.max(np.abs(env[id(n)]))) if n.type.size else 0.0
            cal.absmax[n.name] = max(cal.absmax.get(n.name, 0.0), a)
    for name, a in cal.absmax.items():
        cal.shifts[name] = pow2_shift(a)
        cal.source[name] = "calibration"
    return cal


class _Quantizer:
    def __init__(self, graph: Graph, cal: Calibration):
        self.graph, self.cal = graph, cal
        self.users = graph.users()
        self.shift: dict[int, int] = {}  # id(new int8 node) -> its shift
        self.deq: dict[int, Node] = {}
        self.q: dict[int, Node] = {}
        self.layers: list[dict] = []

    def shift_for(self, old: Node, why: str) -> int:
        src = old
        while src.name not in self.cal.shifts and src.op in RANGE_PRESERVING:
            src = src.inputs[0]  # values are a subset of the input's: its scale fits
        if src.name in self.cal.shifts:
            return self.cal.shifts[src.name]
        if old.name not in self.cal.shifts:
            raise QuantizeError(f"quantize: no scale for tensor '{old.name}' ({old.op}), needed {why}; "
                                f"calibrate with sample inputs or give a QDQ model")
        return self.cal.shifts[old.name]

    def out_shift(self, old: Node) -> int:
        """Shift of a conv/dense/add result: the range of a clamping sole consumer (reached
        through reshapes/transposes) if there is one, else its own, else that of the reshape
        holding its value (a QDQ model names the tensor after the reshape)."""
        chain, cur = [], old
        while len(self.users[id(cur)]) == 1 and not any(cur is o for o in self.graph.outputs):
            u = self.users[id(cur)][0]
            if u.op not in CLAMPING + ("reshape", "transpose"):
                break
            chain.append(u)
            if u.op in CLAMPING:
                break
            cur = u
        shifts = self.cal.shifts
        if chain and chain[-1].op in CLAMPING and chain[-1].name in shifts:
            return shifts[chain[-1].name]
        if old.name in shifts:
            return shifts[old.name]
        for c in chain:
            if c.name in shifts:
                return shifts[c.name]
        return self.shift_for(old, "for its output")

    def as_float(self, n: Node) -> Node:
        if id(n) not in self.shift:
            return n
        if id(n) not in self.deq:
            self.deq[id(n)] = Node("dequantize", [n], {"shift": self.shift[id(n)]}, name=f"{n.name}/dequantize")
        return self.deq[id(n)]

    def as_int8(self, n: Node, old: Node, consumer: Node) -> tuple[Node, int]:
        if id(n) in self.shift:
            return n, self.shift[id(n)]
        if n.is_const:
            k = pow2_shift(float(np.max(np.abs(n.value))) if n.value.size else 0.0)
            return Node.const(np.clip(np.rint(n.value * 2.0 ** k), -INT8_MAX, INT8_MAX).astype(np.int8),
                              name=f"{n.name}/q"), k
        if id(n) not in self.q:
            k = self.shift_for(old, f"as input of {consumer.op} '{consumer.name}'")
            self.q[id(n)] = Node("quantize", [n], {"shift": k}, name=f"{n.name}/quantize")
            self.shift[id(self.q[id(n)])] = k
        return self.q[id(n)], self.shift[id(self.q[id(n)])]

    def mark(self, n: Node, k: int) -> Node:
        self.shift[id(n)] = k
        return n

    # ---- per-op rules ------------------------------------------------------------------------
    def gemm(self, ins: list[Node], old: Node) -> Node:
        n = old
        x, kx = self.as_int8(ins[0], old.inputs[0], n)
        w = n.inputs[1].value.astype(np.float64)
        kw = pow2_shift(float(np.max(np.abs(w))))
        ko = self.out_shift(old)
        s = kx + kw - ko
        if not SHR_RANGE[0] <= s <= SHR_RANGE[1]:
            raise QuantizeError(f"quantize: {n.op} '{n.name}': requantize shift {s} = in {kx} + weight {kw} - out {ko} "
                                f"is outside the ALU's SHR range {list(SHR_RANGE)}")
        wq = np.clip(np.rint(w * 2.0 ** kw), -INT8_MAX, INT8_MAX).astype(np.int8)
        b = n.inputs[2].value.astype(np.float64) if len(n.inputs) == 3 else np.zeros(w.shape[0])
        bq = np.rint(b * 2.0 ** (kx + kw)) + (1 << (s - 1) if s > 0 else 0)  # rounding half rides on the bias
        if np.abs(bq).max(initial=0) >= 2 ** 31:
            raise QuantizeError(f"quantize: {n.op} '{n.name}': bias does not fit int32 at scale 2^-{kx + kw}")
        attrs = {k: v for k, v in n.attrs.items()}
        attrs.update(in_shift=kx, w_shift=kw, out_shift=ko)
        q = Node("q" + n.op, [x, Node.const(wq, name=f"{n.name}/wq"), Node.const(bq.astype(np.int32), name=f"{n.name}/bq")],
                 attrs, name=n.name, origin=n.origin)
        self.layers.append({"name": n.name, "op": q.op, "in_shift": kx, "w_shift": kw, "out_shift": ko, "shr": s,
                            "w_absmax": float(np.max(np.abs(w))), "w_use": float(np.max(np.abs(wq))) / INT8_MAX})
        return self.mark(q, ko)

    def add(self, ins: list[Node], old: Node) -> Node:
        n = old
        (a, ka), (b, kb) = (self.as_int8(i, o, n) for i, o in zip(ins, old.inputs))
        ko = self.out_shift(old)
        q = Node("qadd", [a, b], {"a_shift": ka, "b_shift": kb, "out_shift": ko}, name=n.name, origin=n.origin)
        self.layers.append({"name": n.name, "op": "qadd", "in_shift": min(ka, kb), "w_shift": 0, "out_shift": ko,
                            "shr": max(ka, kb) - ko})
        return self.mark(q, ko)

    def preserving(self, ins: list[Node], n: Node) -> Node:
        k = self.shift[id(ins[0])]
        attrs = dict(n.attrs)
        if n.op == "clip":
            attrs["min"] = None if attrs["min"] is None else float(max(-INT8_MAX, min(INT8_MAX, round(attrs["min"] * 2.0 ** k))))
            attrs["max"] = None if attrs["max"] is None else float(max(-INT8_MAX, min(INT8_MAX, round(attrs["max"] * 2.0 ** k))))
        if n.op == "pad":
            attrs["value"] = float(np.clip(np.rint(attrs["value"] * 2.0 ** k), -INT8_MAX, INT8_MAX))
        return self.mark(n.with_inputs(ins, attrs=attrs), k)

    def concat(self, ins: list[Node], n: Node) -> Node:
        k = min(self.shift[id(i)] for i in ins)  # the coarsest scale holds every input's range
        ins = [i if self.shift[id(i)] == k else
               Node("requantize", [i], {"in_shift": self.shift[id(i)], "out_shift": k}, name=f"{i.name}/requantize")
               for i in ins]
        return self.mark(n.with_inputs(ins), k)

    def node(self, old: Node, ins: list[Node]) -> Node:
        """The replacement of `old` given its inputs' replacements."""
        n = old
        if n.op in ("input", "const"):
            return n
        if n.op in ("conv2d", "dense") and n.inputs[1].is_const and all(i.is_const for i in n.inputs[2:]) \
                and n.dtype == "float32":
            return self.gemm(ins, old)
        if n.op == "add" and not any(i.is_const for i in ins) and any(id(i) in self.shift for i in ins):
            return self.add(ins, old)
        if n.op in SCALE_PRESERVING and id(ins[0]) in self.shift and (n.op != "pad" or n.attrs["mode"] == "constant"):
            return self.preserving(ins, n)
        if n.op == "concat" and all(id(i) in self.shift for i in ins):
            return self.concat(ins, n)
        new_ins = [self.as_float(i) for i in ins]
        return n if all(a is b for a, b in zip(new_ins, n.inputs)) else n.with_inputs(new_ins)


def quantize(graph: Graph, calibration: Calibration) -> Graph:
    """Rewrite the float graph into shift-quantized int8 ops (see module doc)."""
    qz = _Quantizer(graph, calibration)
    mapping: dict[int, Node] = {}
    nodes: list[Node] = []
    placed: set[int] = set()

    def place(n: Node):
        for i in n.inputs:
            if id(i) not in placed:
                place(i)
        if id(n) not in placed:
            placed.add(id(n))
            nodes.append(n)

    for old in graph.nodes:
        new = qz.node(old, [mapping[id(i)] for i in old.inputs])
        mapping[id(old)] = new
        place(new)
    outputs = []
    for o in graph.outputs:
        f = qz.as_float(mapping[id(o)])
        place(f)
        outputs.append(f)
    meta = {**graph.meta, "quantize": {"layers": qz.layers, "calibration": calibration}}
    return Graph(nodes, graph.inputs, outputs, graph.output_names, graph.name, meta)
