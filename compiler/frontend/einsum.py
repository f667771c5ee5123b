"""ONNX Einsum lowered to ops every target compiles: transposes, reshapes, diagonals (strided
slices), sums (reduce_sum), and per pair of operands one 2-D or 3-D matmul, or a broadcasting mul
where the pair sums nothing (an outer or elementwise product). Attention ("bhid,bhjd->bhij"), bilinear and
projection layers export as Einsum; lowering it here keeps them off the numpy fallback.

Semantics are numpy's: '->' optional (the implicit output is the '...' dimensions, then the
letters appearing once, in ASCII order), '...' broadcasts right-aligned, a dimension of size 1
broadcasts against any size of its index, repeated indices in one operand take the diagonal, and
indices in no output are summed. More than two operands contract pairwise, the pair with the
smallest result first. Malformed equations and operands that do not fit them are one-line
ConversionErrors naming the node.
"""
from __future__ import annotations

import math
import string
from collections import Counter

from ..graph.ir import Node
from .onnx_import import _Ctx, converter

LETTERS = frozenset(string.ascii_letters)
ELLIPSIS = "..."
FLOAT_DTYPES = ("float32", "float64")


class EinsumError(ValueError):
    """An equation that is malformed or does not fit its operands' ranks."""


# ---- the equation ----------------------------------------------------------------------------------
def _tokens(text: str, what: str) -> list[str]:
    """One term -> its letters, with '...' as one token (at most once)."""
    out, k = [], 0
    while k < len(text):
        if text[k] in LETTERS:
            out.append(text[k])
            k += 1
        elif text.startswith(ELLIPSIS, k):
            if ELLIPSIS in out:
                raise EinsumError(f"{what} '{text}' has '...' twice")
            out.append(ELLIPSIS)
            k += 3
        elif text[k] == ".":
            raise EinsumError(f"{what} '{text}' has a '.' that is not part of '...'")
        else:
            raise EinsumError(f"{what} '{text}' has the character {text[k]!r}; indices are letters a-z, A-Z "
                              f"(and one '...')")
    return out


def _ellipsis_labels(first: int, n: int) -> list[str]:
    return [f"{ELLIPSIS}{first + j}" for j in range(n)]


def _split(equation: str):
    """(each input term's text, its tokens; whether there is '->'; the output's text, its tokens)."""
    eq = "".join(str(equation).split())
    if eq.count("->") > 1:
        raise EinsumError(f"equation '{equation}' has more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    texts = lhs.split(",")
    terms = [_tokens(t, f"input {k}'s term") for k, t in enumerate(texts)]
    return texts, terms, bool(arrow), rhs, _tokens(rhs, "the output")


def check_syntax(equation: str) -> None:
    """Raise EinsumError if the equation is malformed, ranks aside. (onnx 1.23's Einsum shape
    inference never returns on some malformed equations, 'i..j->ij' or 'i$j->ij': a loader can ask
    this before onnx's checker.)"""
    _split(equation)


def parse_equation(equation: str, ranks) -> tuple[list[list[str]], list[str]]:
    """(the labels of each operand, the output's labels) for operands of these ranks. Letters are
    their own labels; '...' expands to labels '...0', '...1', ... right-aligned across operands
    (numpy broadcasting). Raises EinsumError naming what is wrong."""
    texts, terms, arrow, rhs, out_tokens = _split(equation)
    if len(terms) != len(ranks):
        raise EinsumError(f"equation '{equation}' has {len(terms)} operand(s) but the node has {len(ranks)} input(s)")
    widths = []
    for k, (t, text, r) in enumerate(zip(terms, texts, ranks)):
        n = sum(1 for x in t if x != ELLIPSIS)
        if ELLIPSIS in t:
            if r < n:
                raise EinsumError(f"input {k} has rank {r}, less than the {n} indices of its term '{text}'")
            widths.append(r - n)
        else:
            if r != n:
                raise EinsumError(f"input {k} has rank {r} but its term '{text}' names {n} indices")
            widths.append(0)
    e = max(widths, default=0)
    expanded = []
    for t, w in zip(terms, widths):
        labels = []
        for x in t:
            labels.extend(_ellipsis_labels(e - w, w) if x == ELLIPSIS else [x])
        expanded.append(labels)
    if not arrow:
        counts = Counter(x for t in expanded for x in t if x in LETTERS)
        return expanded, _ellipsis_labels(0, e) + sorted(x for x, n in counts.items() if n == 1)
    seen = {x for t in expanded for x in t}
    for x, n in Counter(out_tokens).items():
        if n > 1 and x != ELLIPSIS:
            raise EinsumError(f"output index '{x}' appears {n} times in '{rhs}'")
        if x != ELLIPSIS and x not in seen:
            raise EinsumError(f"output index '{x}' appears in no input")
    if ELLIPSIS not in out_tokens and e > 0:
        raise EinsumError(f"the inputs' '...' covers {e} dimension(s) but the output '{rhs}' has no '...'")
    out = []
    for x in out_tokens:
        out.extend(_ellipsis_labels(0, e) if x == ELLIPSIS else [x])
    return expanded, out


def _label_sizes(c: _Ctx, terms, xs) -> dict[str, int]:
    """Each label's size: equal across operands, or 1 (broadcast); within one operand a repeated
    index has one size."""
    first: dict[str, tuple[int, int]] = {}   # label -> (a size other than 1, the input that has it)
    for k, (t, x) in enumerate(zip(terms, xs)):
        own: dict[str, int] = {}
        for lab, d in zip(t, x.shape):
            if lab in own and own[lab] != d:
                c.fail(f"index '{lab}' repeats in input {k} ('{c.onnx_node.input[k]}') with sizes {own[lab]} and {d}")
            own[lab] = d
            if d == 1:
                continue
            if lab not in first:
                first[lab] = (d, k)
            elif first[lab][0] != d:
                j = first[lab][1]
                name_j, name_k = c.onnx_node.input[j], c.onnx_node.input[k]
                if lab.startswith(ELLIPSIS):
                    c.fail(f"the '...' dimensions of input {j} ('{name_j}') {_ell_shape(terms[j], xs[j])} and "
                           f"input {k} ('{name_k}') {_ell_shape(t, x)} do not broadcast")
                c.fail(f"index '{lab}' has size {first[lab][0]} in input {j} ('{name_j}') and {d} in input {k} "
                       f"('{name_k}')")
    return {lab: first[lab][0] if lab in first else 1 for t in terms for lab in t}


def _ell_shape(t, x) -> list[int]:
    return [d for lab, d in zip(t, x.shape) if lab.startswith(ELLIPSIS)]


# ---- lowering --------------------------------------------------------------------------------------
class _T:
    """An operand on its way: `node` holds the elements of `labels` in C order (its own shape may
    still differ: a reshape not emitted until an op needs it)."""
    __slots__ = ("node", "labels")

    def __init__(self, node: Node, labels):
        self.node, self.labels = node, list(labels)


class _Lower:
    """Emits the nodes of one Einsum, each with a unique suffix."""

    def __init__(self, c: _Ctx, size: dict[str, int], out: list[str]):
        self.c, self.size, self.out, self.k = c, size, out, 0

    def add(self, op: str, inputs, attrs) -> Node:
        self.k += 1
        return self.c.add(op, inputs, attrs, suffix=f"{op}{self.k}")

    def shape(self, labels) -> tuple[int, ...]:
        return tuple(self.size[x] for x in labels)

    def reshape(self, node: Node, shape) -> Node:
        shape = tuple(int(d) for d in shape)
        return node if node.shape == shape else self.add("reshape", [node], {"shape": shape})

    def materialize(self, t: _T) -> Node:
        return self.reshape(t.node, self.shape(t.labels))

    def permute(self, t: _T, order) -> _T:
        """t with its labels in `order`: one transpose of the runs of labels that stay together."""
        order = list(order)
        if order == t.labels:
            return t
        pos = {x: i for i, x in enumerate(order)}
        runs = [[t.labels[0]]]
        for x in t.labels[1:]:
            if pos[x] == pos[runs[-1][-1]] + 1:
                runs[-1].append(x)
            else:
                runs.append([x])
        node = self.reshape(t.node, [math.prod(self.shape(r)) for r in runs])
        perm = sorted(range(len(runs)), key=lambda i: pos[runs[i][0]])
        return _T(self.add("transpose", [node], {"perm": tuple(perm)}), order)

    def diagonals(self, t: _T) -> _T:
        """Repeated labels -> their diagonal: the occurrences made adjacent and merged into one
        axis of n**m, then one strided slice, step 1 + n + ... + n**(m-1), over all such axes (a
        take's index map would be refused by the CPU kernel past slope 16)."""
        counts = Counter(t.labels)
        if all(n == 1 for n in counts.values()):
            return t
        firsts = list(counts)   # first-occurrence order
        perm = [p for x in firsts for p, y in enumerate(t.labels) if y == x]
        node = self.materialize(t)
        if perm != sorted(perm):
            node = self.add("transpose", [node], {"perm": tuple(perm)})
        node = self.reshape(node, [self.size[x] ** counts[x] for x in firsts])
        axes = [ax for ax, x in enumerate(firsts) if counts[x] > 1]
        steps = [sum(self.size[firsts[ax]] ** j for j in range(counts[firsts[ax]])) for ax in axes]
        node = self.add("slice", [node], {"starts": (0,) * len(axes), "ends": tuple(node.shape[ax] for ax in axes),
                                          "axes": tuple(axes), "steps": tuple(steps)})
        return _T(node, firsts)

    def sum_out(self, t: _T, drop) -> _T:
        axes = tuple(i for i, x in enumerate(t.labels) if x in drop)
        if not axes:
            return t
        node = self.add("reduce_sum", [self.materialize(t)], {"axes": axes, "keepdims": 0})
        return _T(node, [x for x in t.labels if x not in drop])

    def _cost(self, moves, result, last: bool) -> tuple[int, int]:
        """(transposes, elements transposed) of bringing each (labels, order) of `moves` into its
        order, and, for the last contraction, the result into the output's order."""
        if last:
            moves = [*moves, (result, [i for i in self.out if i in result])]
        moved = [math.prod(self.shape(labels)) for labels, order in moves if list(order) != list(labels)]
        return len(moved), sum(moved)

    def contract(self, x: _T, y: _T, keep: set, last: bool) -> _T:
        """The product of two operands, summed over the labels they share that `keep` lacks."""
        x = self.sum_out(x, {i for i in x.labels if i not in keep and i not in y.labels})
        y = self.sum_out(y, {i for i in y.labels if i not in keep and i not in x.labels})
        shared = [i for i in x.labels if i in y.labels]
        if all(i in keep for i in shared):
            return self._product(x, y, last)
        best = None
        for a, b in ((x, y), (y, x)):
            batch = [i for i in a.labels if i in b.labels and i in keep]
            summed = [i for i in a.labels if i in b.labels and i not in keep]
            afree = [i for i in a.labels if i not in b.labels]
            bfree = [i for i in b.labels if i not in a.labels]
            batch_orders = [batch, [i for i in b.labels if i in batch]]
            if last:
                batch_orders.append([i for i in self.out if i in batch])
            for bo in batch_orders:
                for so in (summed, [i for i in b.labels if i in summed]):
                    # bcast: b's leading free labels as matmul batch dims, a broadcast over them
                    # (N C H W x K C -> N K HW with no transpose); only without real batch labels
                    for nb in range(len(bfree) + 1 if not batch else 1):
                        bb, brest = bfree[:nb], bfree[nb:]
                        a_order, b_order = bo + afree + so, bb + bo + so + brest
                        result = bb + bo + afree + brest
                        cost = self._cost([(a.labels, a_order), (b.labels, b_order)], result, last)
                        if best is None or cost < best[0]:
                            best = (cost, a, b, bo, so, afree, bb, brest, a_order, b_order, result)
        _, a, b, bo, so, afree, bb, brest, a_order, b_order, result = best
        a, b = self.permute(a, a_order), self.permute(b, b_order)
        nbatch, m = math.prod(self.shape(bo)), math.prod(self.shape(afree))
        k, n = math.prod(self.shape(so)), math.prod(self.shape(brest))
        if bb:
            lhs = self.reshape(a.node, (1, m, k))
            rhs = self.reshape(b.node, (math.prod(self.shape(bb)), k, n))
        elif bo:
            lhs, rhs = self.reshape(a.node, (nbatch, m, k)), self.reshape(b.node, (nbatch, k, n))
        else:
            lhs, rhs = self.reshape(a.node, (m, k)), self.reshape(b.node, (k, n))
        return _T(self.add("matmul", [lhs, rhs], None), result)

    def _product(self, x: _T, y: _T, last: bool) -> _T:
        """x * y summing nothing: a broadcasting mul, each side's labels in one shared order (size
        1 where a side lacks one)."""
        orders = [x.labels + [i for i in y.labels if i not in x.labels],
                  y.labels + [i for i in x.labels if i not in y.labels]]
        if last:
            orders.append(list(self.out))
        best = None
        for order in orders:
            order = [i for i in order if i in x.labels or i in y.labels]
            xo, yo = [i for i in order if i in x.labels], [i for i in order if i in y.labels]
            cost = self._cost([(x.labels, xo), (y.labels, yo)], order, last)
            if best is None or cost < best[0]:
                best = (cost, order, xo, yo)
        _, order, xo, yo = best
        x, y = self.permute(x, xo), self.permute(y, yo)
        xs = [self.size[i] if i in x.labels else 1 for i in order]
        ys = [self.size[i] if i in y.labels else 1 for i in order]
        return _T(self.add("mul", [self.reshape(x.node, xs), self.reshape(y.node, ys)], None), order)


@converter("Einsum")
def _einsum(c: _Ctx):
    """Parse, check sizes, then per operand: size-1 dims dropped (broadcast), diagonals, indices
    no one else needs summed; contract pairwise; transpose and reshape to the output."""
    xs = [c.input(k) for k in range(len(c.onnx_node.input))]
    if any(x is None for x in xs):
        c.fail("an input is missing (empty name)")
    for k, x in enumerate(xs):
        if x.dtype not in FLOAT_DTYPES:
            c.fail(f"input {k} ('{c.onnx_node.input[k]}') is {x.dtype}; only float inputs are supported")
    equation = c.attr("equation")
    if equation is None:
        c.fail("the 'equation' attribute is missing")
    try:
        terms, out = parse_equation(equation, [x.type.rank for x in xs])
    except EinsumError as e:
        c.fail(str(e))
    size = _label_sizes(c, terms, xs)
    low, first_new = _Lower(c, size, out), len(c.nodes)
    ops = []
    for t, x in zip(terms, xs):
        own = [i for i, d in zip(t, x.shape) if d != 1]   # size 1: constant along it (broadcast)
        ops.append(low.diagonals(_T(x, own)))
    for k, t in enumerate(ops):
        others = {i for j, o in enumerate(ops) if j != k for i in o.labels}
        ops[k] = low.sum_out(t, {i for i in t.labels if i not in out and i not in others})
    while len(ops) > 1:
        best = None
        for i in range(len(ops)):
            for j in range(i + 1, len(ops)):
                keep = set(out).union(*(o.labels for k, o in enumerate(ops) if k not in (i, j)))
                labels = (set(ops[i].labels) | set(ops[j].labels)) & keep
                cost = math.prod(size[x] for x in labels)
                if best is None or cost < best[0]:
                    best = (cost, i, j, keep)
        _, i, j, keep = best
        r = low.contract(ops[i], ops[j], keep, last=len(ops) == 2)
        ops = [r if k == i else o for k, o in enumerate(ops) if k != j]
    t = low.permute(ops[0], [i for i in out if i in ops[0].labels])
    y = low.reshape(t.node, low.shape(out))
    if len(c.nodes) > first_new and y is c.nodes[-1] and y.name != c.node_name:   # the last node keeps the ONNX node's name
        y = c.nodes[-1] = y.with_inputs(y.inputs, name=c.node_name)
    return y
