"""ONNX's recurrent layers (LSTM, GRU, RNN) as unrolled graphs of dense, elementwise and slice ops.

Shapes are static, so the time loop is unrolled at import: the graph IR has no loops, and the
unrolled steps are plain dense/elementwise work every target already compiles. The input
projection of every step and direction is one dense over (T*B, input); each step then adds one
dense of H_{t-1} by R, the gate activations and the state update. Semantics follow the ONNX spec
and onnxruntime's kernels (clip bounds every gate's pre-activation, input_forget sets f = 1 - i,
activation_alpha/beta are consumed in order by the activations that take them).

Refused with a one-line ConversionError: sequences longer than MAX_UNROLLED_STEPS or unrolling
to more than MAX_UNROLLED_NODES graph nodes, weights (W, R, B, P) that are not constant,
sequence_lens that is not a constant equal to T everywhere (variable lengths), non-float32
layers, and activations without a graph-op form or whose default alpha/beta is ambiguous.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph.ir import Node
from .onnx_import import _Ctx, _input_deps, converter

#: the longest sequence a recurrent node is unrolled for
MAX_UNROLLED_STEPS = 1024
#: the most graph nodes one recurrent node may unroll to (all steps and directions)
MAX_UNROLLED_NODES = 60_000

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
#: activation (lower case) -> (default alpha, default beta); None: takes none; "given": must be
#: given (onnxruntime's default, 0, differs from the ONNX operator's or the ONNX op has none)
_ACTIVATIONS = {
    "sigmoid": (None, None), "tanh": (None, None), "relu": (None, None), "softsign": (None, None),
    "softplus": (None, None), "leakyrelu": (0.01, None), "elu": (1.0, None), "hardsigmoid": (0.2, 0.5),
    "thresholdedrelu": ("given", None), "affine": ("given", "given"), "scaledtanh": ("given", "given"),
}


@dataclass
class _Act:
    name: str           # lower case
    alpha: float | None
    beta: float | None


@dataclass
class _Layer:
    """A recurrent node's attributes and constant weights, checked."""
    kind: str
    steps: int          # T
    batch: int
    hidden: int
    dirs: list          # per direction: True forward, False reverse
    layout: int
    w: np.ndarray       # (nd, gates*H, input)
    r: np.ndarray       # (nd, gates*H, H)
    b: np.ndarray       # (nd, 2*gates*H)
    p: np.ndarray | None    # LSTM peepholes (nd, 3H), None when absent or zero
    clip: float | None
    acts: list          # per direction: list of _Act
    input_forget: bool
    linear_before_reset: bool


def _weight(c: _Ctx, k: int, what: str, shape, required=True):
    v = c.value(k, what)
    if v is None:
        if required:
            c.fail(f"{what} (input {k}) is missing")
        return None
    v = np.asarray(v)
    if tuple(v.shape) != tuple(shape):
        c.fail(f"{what} (input {k}) has shape {list(v.shape)}, expected {list(shape)}")
    return v.astype(np.float32)


def _activations(c: _Ctx, kind: str, nd: int) -> list:
    """Per direction, the activation functions with their alpha/beta (onnxruntime's reading:
    alphas and betas are consumed in order by the activations that take one)."""
    per = len(_DEFAULT_ACTIVATIONS[kind])
    names = c.attr("activations")
    names = list(_DEFAULT_ACTIVATIONS[kind]) * nd if names is None else \
        [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    if len(names) != per * nd:
        c.fail(f"activations lists {len(names)} functions; {kind} with {nd} direction(s) takes {per * nd}")
    alphas = [float(a) for a in (c.attr("activation_alpha") or [])]
    betas = [float(b) for b in (c.attr("activation_beta") or [])]
    acts = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            c.fail(f"activation {name!r} is not supported (supported: Sigmoid, Tanh, Relu, LeakyRelu, "
                   f"ThresholdedRelu, HardSigmoid, Affine, ScaledTanh, Elu, Softsign, Softplus)")
        vals = []
        for default, given, what in zip(_ACTIVATIONS[key], (alphas, betas), ("alpha", "beta")):
            if default is None:
                vals.append(None)
            elif given:
                vals.append(given.pop(0))
            elif default == "given":
                c.fail(f"activation {name!r} needs its {what} in activation_{what}: its default is not the same "
                       f"in the ONNX spec and onnxruntime")
            else:
                vals.append(default)
        acts.append(_Act(key, *vals))
    return [acts[d * per:(d + 1) * per] for d in range(nd)]


def _read(c: _Ctx) -> _Layer:
    kind = c.onnx_node.op_type
    x = c.input(0)
    if x.dtype != "float32":
        c.fail(f"X is {x.dtype}; only float32 recurrent layers are supported")
    if x.type.rank != 3:
        c.fail(f"X must have rank 3, got {x.type}")
    layout = int(c.attr("layout", 0))
    if layout not in (0, 1):
        c.fail(f"layout must be 0 or 1, got {layout}")
    steps, batch, n_in = (x.shape if layout == 0 else (x.shape[1], x.shape[0], x.shape[2]))
    if steps > MAX_UNROLLED_STEPS:
        c.fail(f"sequence length {steps} is above the limit of {MAX_UNROLLED_STEPS} steps "
               f"(recurrent layers are unrolled at import; MAX_UNROLLED_STEPS)")
    direction = c.attr("direction", "forward")
    dirs = {"forward": [True], "reverse": [False], "bidirectional": [True, False]}.get(direction)
    if dirs is None:
        c.fail(f"direction {direction!r} is not forward, reverse or bidirectional")
    nd, g = len(dirs), _GATES[kind]
    r_in = c.input(2)
    hidden = int(c.attr("hidden_size", r_in.shape[-1] if r_in is not None and r_in.type.rank == 3 else 0))
    if hidden < 1:
        c.fail(f"hidden_size must be positive, got {hidden}")
    w = _weight(c, 1, "W", (nd, g * hidden, n_in))
    r = _weight(c, 2, "R", (nd, g * hidden, hidden))
    b = _weight(c, 3, "B", (nd, 2 * g * hidden), required=False)
    b = np.zeros((nd, 2 * g * hidden), np.float32) if b is None else b
    seq = c.input(4)
    if seq is not None:
        if _input_deps(seq):
            c.fail(f"sequence_lens (input 4, '{c.onnx_node.input[4]}') is computed at run time: variable "
                   f"sequence lengths are not supported (only a constant sequence_lens of {steps} everywhere)")
        lens = np.ravel(c.value(4, "sequence_lens"))
        if lens.size != batch or np.any(lens != steps):
            c.fail(f"sequence_lens {lens.tolist()[:8]} is not the sequence length {steps} for each of the {batch} "
                   f"batch entries: variable sequence lengths are not supported")
    p = None
    if kind == "LSTM":
        p = _weight(c, 7, "P", (nd, 3 * hidden), required=False)
        p = None if p is None or not p.any() else p
    clip = c.attr("clip")
    if clip is not None and not float(clip) > 0:
        c.fail(f"clip must be positive, got {clip}")
    return _Layer(kind, steps, batch, hidden, dirs, layout, w, r, b, p, None if clip is None else float(clip),
                  _activations(c, kind, nd), bool(c.attr("input_forget", 0)) and kind == "LSTM",
                  bool(c.attr("linear_before_reset", 0)) and kind == "GRU")


@dataclass
class _DirWeights:
    """One direction's recurrent weights as graph constants."""
    rec: Node | None = None         # R (LSTM, RNN)
    rec_gates: tuple = ()           # GRU: R_z, R_r, R_h, each its own dense so each fuses with its gate
    rbh: Node | None = None         # GRU linear_before_reset: Rbh, the bias of H_{t-1} R_h^T
    peep: dict | None = None        # LSTM peepholes: {"i", "o", "f"} -> (H,)


class _Unroll:
    """Builds one recurrent node's graph: unique node names, shared scalar constants, the budget."""

    def __init__(self, c: _Ctx, layer: _Layer):
        self.c, self.layer = c, layer
        self.scalars: dict[float, Node] = {}
        self.start = len(c.nodes)
        self.prefix = ""
        self.dirs: list[_DirWeights] = []

    def op(self, op: str, inputs, attrs=None, what: str = "") -> Node:
        return self.c.add(op, inputs, attrs, suffix=f"{self.prefix}{what}")

    def const(self, value, what: str) -> Node:
        return self.c.const(np.ascontiguousarray(value, np.float32), f"{self.prefix}{what}")

    def scalar(self, v: float) -> Node:
        if v not in self.scalars:
            self.scalars[v] = self.c.const(np.asarray(v, np.float32), f"scalar{len(self.scalars)}")
        return self.scalars[v]

    def cols(self, x: Node, lo: int, hi: int, what: str) -> Node:
        if lo == 0 and hi == x.shape[1]:
            return x
        return self.op("slice", [x], {"starts": (lo,), "ends": (hi,), "axes": (1,), "steps": (1,)}, what)

    def clip(self, x: Node, what: str) -> Node:
        lim = self.layer.clip
        return x if lim is None else self.op("clip", [x], {"min": -lim, "max": lim}, f"{what}_clip")

    def act(self, x: Node, a: _Act, what: str, clip: bool = True) -> Node:
        """a(x) from graph ops, x clipped first (a gate's pre-activation) unless clip is false."""
        x = self.clip(x, what) if clip else x
        if a.name in ("sigmoid", "tanh", "relu"):
            return self.op(a.name, [x], what=what)
        if a.name == "leakyrelu":
            return self.op("leaky_relu", [x], {"alpha": a.alpha}, what)
        if a.name == "affine":
            return self.op("add", [self.op("mul", [x, self.scalar(a.alpha)], what=f"{what}_a"),
                                   self.scalar(a.beta)], what=what)
        if a.name == "scaledtanh":
            t = self.op("tanh", [self.op("mul", [x, self.scalar(a.beta)], what=f"{what}_b")], what=f"{what}_t")
            return self.op("mul", [t, self.scalar(a.alpha)], what=what)
        if a.name == "hardsigmoid":
            y = self.op("add", [self.op("mul", [x, self.scalar(a.alpha)], what=f"{what}_a"), self.scalar(a.beta)],
                        what=f"{what}_b")
            return self.op("clip", [y], {"min": 0.0, "max": 1.0}, what)
        if a.name == "thresholdedrelu":
            above = self.op("greater", [x, self.scalar(a.alpha)], what=f"{what}_gt")
            return self.op("where", [above, x, self.scalar(0.0)], what=what)
        if a.name == "softsign":
            d = self.op("add", [self.op("abs", [x], what=f"{what}_abs"), self.scalar(1.0)], what=f"{what}_d")
            return self.op("div", [x, d], what=what)
        pos = self.op("relu", [x], what=f"{what}_pos")
        if a.name == "elu":     # relu(x) + alpha (exp(min(x, 0)) - 1)
            e = self.op("exp", [self.op("minimum", [x, self.scalar(0.0)], what=f"{what}_neg")], what=f"{what}_exp")
            e = self.op("sub", [e, self.scalar(1.0)], what=f"{what}_em1")
            return self.op("add", [pos, self.op("mul", [e, self.scalar(a.alpha)], what=f"{what}_a")], what=what)
        # softplus as relu(x) + log(1 + exp(-|x|)), which does not overflow
        e = self.op("exp", [self.op("neg", [self.op("abs", [x], what=f"{what}_abs")], what=f"{what}_nabs")],
                    what=f"{what}_exp")
        lg = self.op("log", [self.op("add", [e, self.scalar(1.0)], what=f"{what}_1p")], what=f"{what}_log")
        return self.op("add", [pos, lg], what=what)


def _initial(u: _Unroll, k: int, what: str) -> list:
    """Per direction, initial_h (k 5) or initial_c (k 6) as a (B, H) node, or None for zeros."""
    c, ly = u.c, u.layer
    nd = len(ly.dirs)
    n = c.input(k)
    if n is None:
        return [None] * nd
    want = (nd, ly.batch, ly.hidden) if ly.layout == 0 else (ly.batch, nd, ly.hidden)
    if n.shape != want:
        c.fail(f"{what} (input {k}) has shape {list(n.shape)}, expected {list(want)}")
    if n.is_const:
        v = np.asarray(n.value, np.float32)
        per = [v[d] if ly.layout == 0 else v[:, d] for d in range(nd)]
        return [u.const(s, f"{what}{d}") if s.any() else None for d, s in enumerate(per)]
    if n.dtype != "float32":
        c.fail(f"{what} is {n.dtype}; only float32 recurrent layers are supported")
    out = []
    for d in range(nd):
        s = n if nd == 1 else u.op("slice", [n], {"starts": (d,), "ends": (d + 1,), "axes": (ly.layout,),
                                                   "steps": (1,)}, f"{what}{d}_slice")
        out.append(u.op("reshape", [s], {"shape": (ly.batch, ly.hidden)}, f"{what}{d}"))
    return out


def _lstm_step(u: _Unroll, d: int, x: Node, h, cst):
    """One LSTM step (gates i, o, f, c): (H_t, C_t). x, the step's rows of the projection, and the
    recurrent dense are each read by every gate: each its own kernel, so the gate kernels hold no
    step offset and one compiled kernel serves every step (one per step took 13 s to build at
    128 steps)."""
    ly, hs, w = u.layer, u.layer.hidden, u.dirs[d]
    f_act, g_act, h_act = ly.acts[d]
    rec = None if h is None else u.op("dense", [h, w.rec], what="rec")

    def cols(k, name):
        pre = u.cols(x, k * hs, (k + 1) * hs, f"x_{name}")
        if rec is None:
            return pre
        return u.op("add", [u.cols(rec, k * hs, (k + 1) * hs, f"rec_{name}"), pre], what=f"{name}_pre")

    def gate(k, name, state):
        pre = cols(k, name)
        if state is not None:   # the peephole term
            pre = u.op("add", [pre, u.op("mul", [state, w.peep[name]], what=f"{name}_peep")], what=f"{name}_sum")
        return u.act(pre, f_act, name)

    keep_f = cst is not None and not ly.input_forget     # f is unused when C_{t-1} is 0
    # each gate its own slice and activation, each read once: fuse_ops makes C_t one kernel and
    # H_t another (a shared activation over i, o, f was a third kernel that both read)
    i = gate(0, "i", cst if w.peep is not None else None)
    f = gate(2, "f", cst if w.peep is not None else None) if keep_f else None
    o = gate(1, "o", None) if w.peep is None else None
    if ly.input_forget and cst is not None:
        f = u.op("sub", [u.scalar(1.0), i], what="f")
    cc = u.act(cols(3, "c"), g_act, "c")
    new_c = u.op("mul", [i, cc], what="ic" if cst is not None else "C")
    if cst is not None:
        new_c = u.op("add", [u.op("mul", [f, cst], what="fc"), new_c], what="C")
    if o is None:
        o = gate(1, "o", new_c)
    return u.op("mul", [o, u.act(new_c, h_act, "hC", clip=False)], what="H"), new_c


def _gru_step(u: _Unroll, d: int, xs, h):
    """One GRU step (gates z, r, h): H_t. xs(lo, hi, what) slices the step's projection columns,
    one slice per use; with one dense per gate each gate is one kernel and H_t joins z's."""
    ly, hs, w = u.layer, u.layer.hidden, u.dirs[d]
    f_act, g_act = ly.acts[d]
    rz, rr, rh = w.rec_gates

    def gate(k, name, rec):
        pre = xs(k * hs, (k + 1) * hs, f"x_{name}")
        if h is not None:
            pre = u.op("add", [u.op("dense", [h, rec], what=f"rec_{name}"), pre], what=f"{name}_pre")
        return u.act(pre, f_act, name)
    z = gate(0, "z", rz)
    if ly.linear_before_reset:     # h = g(x_h + r (H_{t-1} R_h^T + Rbh))
        rec_h = w.rbh if h is None else u.op("dense", [h, rh] + ([w.rbh] if w.rbh is not None else []), what="rec_h")
        pre = xs(2 * hs, 3 * hs, "x_h")
        if rec_h is not None:
            pre = u.op("add", [u.op("mul", [rec_h, gate(1, "r", rr)], what="r_rec"), pre], what="h_pre")
    elif h is None:                # h = g(x_h + (r H_{t-1}) R_h^T), Rbh in the projection
        pre = xs(2 * hs, 3 * hs, "x_h")
    else:
        r_h = u.op("mul", [gate(1, "r", rr), h], what="rH")
        pre = u.op("add", [u.op("dense", [r_h, rh], what="rec_h"), xs(2 * hs, 3 * hs, "x_h")], what="h_pre")
    hh = u.act(pre, g_act, "h")
    if h is None:   # (1 - z) h
        return u.op("sub", [hh, u.op("mul", [z, hh], what="zh")], what="H")
    # (1 - z) h + z H_{t-1} = h + z (H_{t-1} - h)
    return u.op("add", [hh, u.op("mul", [z, u.op("sub", [h, hh], what="dh")], what="zdh")], what="H")


def _rnn_step(u: _Unroll, d: int, x: Node, h):
    pre = x if h is None else u.op("add", [x, u.op("dense", [h, u.dirs[d].rec], what="rec")], what="pre")
    return u.act(pre, u.layer.acts[d][0], "H")


def _weights(u: _Unroll):
    """The projection of X for every step and direction (one dense, biases folded in) and each
    direction's recurrent weights as constants."""
    ly, hs, g = u.layer, u.layer.hidden, _GATES[u.layer.kind]
    nd = len(ly.dirs)
    wb, rb = ly.b[:, :g * hs], ly.b[:, g * hs:]
    fold = wb + rb
    if ly.linear_before_reset:      # Rbh is added after the reset gate: it stays out of the projection
        fold[:, 2 * hs:] = wb[:, 2 * hs:]
    for d in range(nd):
        u.prefix = f"d{d}/"
        r = ly.r[d]
        if ly.kind == "GRU":
            w = _DirWeights(rec_gates=tuple(u.const(r[k * hs:(k + 1) * hs], f"R_{g}") for k, g in enumerate("zrh")))
        else:
            w = _DirWeights(u.const(r, "R"))
        rbh = rb[d, 2 * hs:] if ly.linear_before_reset else np.zeros(0)
        if rbh.any():
            w.rbh = u.const(rbh, "Rbh")
        if ly.p is not None:
            pi, po, pf = np.split(ly.p[d], 3)
            w.peep = {"i": u.const(pi, "P_i"), "o": u.const(po, "P_o"), "f": u.const(pf, "P_f")}
        u.dirs.append(w)
    u.prefix = ""
    x = u.c.input(0)
    flat = u.op("reshape", [x], {"shape": (ly.steps * ly.batch, x.shape[2])}, "X_rows")
    w = u.const(ly.w.reshape(nd * g * hs, -1), "W")
    return u.op("dense", [flat, w, u.const(fold.reshape(-1), "W_bias")], what="X_proj")


def _step_input(u: _Unroll, proj: Node, d: int, t: int, lo: int, hi: int, what: str = "x") -> Node:
    """Rows of step t, columns lo..hi of direction d, of the projection: (B, hi - lo)."""
    ly = u.layer
    gh = _GATES[ly.kind] * ly.hidden
    if ly.layout == 0:      # rows t*B + b
        rows = (t * ly.batch, (t + 1) * ly.batch, 1)
    else:                   # rows b*T + t
        rows = (t, t + (ly.batch - 1) * ly.steps + 1, ly.steps)
    return u.op("slice", [proj], {"starts": (rows[0], d * gh + lo), "ends": (rows[1], d * gh + hi), "axes": (0, 1),
                                  "steps": (rows[2], 1)}, what)


def _stack(u: _Unroll, parts: list, shape, what: str) -> Node:
    """Concatenate (B, H) nodes (time-major, direction-minor) into ONNX's layout."""
    if len(parts) > 1:
        parts = [u.op("concat", parts, {"axis": 0 if u.layer.layout == 0 else 1}, f"{what}_concat")]
    return u.op("reshape", parts, {"shape": shape}, what)


@converter("LSTM", "GRU", "RNN")
def _recurrent(c: _Ctx):
    """ONNX LSTM / GRU / RNN, unrolled over the (static) sequence."""
    ly = _read(c)
    u = _Unroll(c, ly)
    nd, steps, bsz, hs = len(ly.dirs), ly.steps, ly.batch, ly.hidden
    proj = _weights(u)
    h0 = _initial(u, 5, "initial_h")
    c0 = _initial(u, 6, "initial_c") if ly.kind == "LSTM" else [None] * nd
    ys = [[None] * nd for _ in range(steps)]
    last_h, last_c = [], []
    done, before = 0, len(c.nodes)
    for d, forward in enumerate(ly.dirs):
        h, cst = h0[d], c0[d]
        for t in (range(steps) if forward else range(steps - 1, -1, -1)):
            u.prefix = f"d{d}/t{t}/"
            if ly.kind == "GRU":
                # the step's rows are one slice read by all three gates: its own small kernel, so
                # the gate kernels hold no step offset and one compiled kernel serves every step
                x = _step_input(u, proj, d, t, 0, 3 * hs)
                h = _gru_step(u, d, lambda lo, hi, what: u.cols(x, lo, hi, what), h)
            else:
                x = _step_input(u, proj, d, t, 0, _GATES[ly.kind] * hs)
                if ly.kind == "LSTM":
                    h, cst = _lstm_step(u, d, x, h, cst)
                else:
                    h = _rnn_step(u, d, x, h)
            ys[t][d] = h
            done += 1
            used = len(c.nodes) - u.start
            projected = used + (len(c.nodes) - before) * (steps * nd - done)
            before = len(c.nodes)
            if projected > MAX_UNROLLED_NODES:
                c.fail(f"unrolling {steps} steps x {nd} direction(s) takes about {projected} graph nodes, above the "
                       f"limit of {MAX_UNROLLED_NODES} (MAX_UNROLLED_NODES)")
        last_h.append(h)
        last_c.append(cst)
    u.prefix = ""
    outs = list(c.onnx_node.output)
    result = []
    if outs and outs[0]:
        shape = (steps, nd, bsz, hs) if ly.layout == 0 else (bsz, steps, nd, hs)
        result.append(_stack(u, [y for row in ys for y in row], shape, "Y"))
    state_shape = (nd, bsz, hs) if ly.layout == 0 else (bsz, nd, hs)
    if len(outs) > 1 and outs[1]:
        result.append(_stack(u, last_h, state_shape, "Y_h"))
    if len(outs) > 2 and outs[2]:
        result.append(_stack(u, last_c, state_shape, "Y_c"))
    return result
