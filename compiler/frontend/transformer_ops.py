"""The transformer ops of ONNX opsets 23-25 that modern PyTorch exporters (torch.onnx's dynamo
path, onnxscript) emit for scaled_dot_product_attention, RMSNorm, RoPE and SiLU: Attention,
RMSNormalization, RotaryEmbedding and Swish, lowered to graph ops every target compiles
(3-D matmuls, transposes, reshapes, slices, softmax, elementwise), so a transformer block runs
on the cpu target with no numpy step.

Semantics follow the ONNX spec and onnx's reference implementation. Attention: 3-D or 4-D
inputs, grouped-query attention (q heads sharing a kv head are one batch of a 3-D matmul, so the
kv heads are never copied), `scale` applied as sqrt(scale) to Q and to K, `softcap`, `is_causal`
with the bottom-right (past-length offset) alignment, a bool/float/integer `attn_mask` that
broadcasts and whose last axis may be short (padded with -inf), past/present key and value,
`nonpad_kv_seqlen` (opset 24), the sliding window (opset 25) and `qk_matmul_output` in all four
modes. Where the spec and the reference disagree (mode 0 with a softcap: the reference returns
the softcapped scores), the spec, its function body and onnxruntime are followed. A fully masked
query row gives zeros, not NaN: its scores are replaced by zeros before the softmax and its
probabilities by zeros after. The bias of constant masks and of the causal/window structure is
computed at import. RotaryEmbedding gathers the caches at import when position_ids are constant;
run-time position_ids use the `gather` op (a numpy step on the cpu target, which has no gather
kernel). Everything else (non-float32 tensors, half-precision softmax, RMSNormalization with
another stash_type, shapes that do not fit) is a one-line ConversionError naming the node.
"""
from __future__ import annotations

import numpy as np

from ..graph.ir import Node
from .onnx_import import _Ctx, _input_deps, converter

NEG_INF = np.float32(-np.inf)
#: softmax_precision values honoured in float32: FLOAT itself, and DOUBLE (the result is cast back
#: to float32, so a float32 softmax differs from it by float32 rounding only)
_SOFTMAX_PRECISIONS = {1: "FLOAT", 11: "DOUBLE"}


# ---- helpers ------------------------------------------------------------------------------------------
def _float32(c: _Ctx, k: int, what: str) -> Node | None:
    """Input k, which must be float32 when present (the graph IR's one float type end to end)."""
    n = c.input(k)
    if n is not None and n.dtype != "float32":
        c.fail(f"{what} (input {k}, '{c.onnx_node.input[k]}') is {n.dtype}; only float32 is supported")
    return n


def _static(n: Node | None) -> bool:
    """Whether a node's value is known at import (it depends on no graph input)."""
    return n is not None and not _input_deps(n)


def _int_attr(c: _Ctx, name: str, default: int, allowed=None) -> int:
    v = int(c.attr(name, default))
    if allowed is not None and v not in allowed:
        c.fail(f"{name}={v} is not one of {sorted(allowed)}")
    return v


def _slice(c: _Ctx, x: Node, axis: int, start: int, end: int, step: int, suffix: str) -> Node:
    return c.add("slice", [x], {"starts": [start], "ends": [end], "axes": [axis], "steps": [step]}, suffix=suffix)


# ---- Swish, RMSNormalization ---------------------------------------------------------------------------
@converter("Swish")
def _swish(c: _Ctx):
    """x * sigmoid(alpha * x): SiLU when alpha is 1, as exporters emit it from opset 24."""
    x = _float32(c, 0, "X")
    alpha = float(c.attr("alpha", 1.0))
    z = x if alpha == 1.0 else c.add("mul", [x, c.const(np.asarray(alpha, np.float32), "alpha")], suffix="scaled")
    return c.add("mul", [x, c.add("sigmoid", [z], suffix="sigmoid")])


@converter("RMSNormalization")
def _rms_normalization(c: _Ctx):
    """X / sqrt(mean(X^2 over [axis, rank)) + epsilon) * scale, in the reference's order
    (X times the reciprocal, then the scale)."""
    x, s = _float32(c, 0, "X"), _float32(c, 1, "scale")
    r = x.type.rank
    axis = c.axis(c.attr("axis", -1), r)
    if int(c.attr("stash_type", 1)) != 1:
        c.fail(f"stash_type={c.attr('stash_type')} is not supported (only 1: float32, as in onnx's reference)")
    try:
        ok = np.broadcast_shapes(x.shape, s.shape) == tuple(x.shape)
    except ValueError:
        ok = False
    if not ok:
        c.fail(f"scale {list(s.shape)} does not broadcast to X {list(x.shape)}")
    eps = c.const(np.asarray(float(c.attr("epsilon", 1e-5)), np.float32), "epsilon")
    mean_sq = c.add("reduce_mean", [c.add("mul", [x, x], suffix="square")],
                    {"axes": list(range(axis, r)), "keepdims": 1}, suffix="mean_square")
    rms = c.add("sqrt", [c.add("add", [mean_sq, eps], suffix="plus_epsilon")], suffix="rms")
    normalized = c.add("mul", [x, c.add("reciprocal", [rms], suffix="inverse_rms")], suffix="normalized")
    return c.add("mul", [normalized, s])


# ---- RotaryEmbedding ----------------------------------------------------------------------------------
def _rotary_cache(c: _Ctx, k: int, what: str, pos: Node | None, b: int, s: int, half: int,
                  four_d: bool) -> Node:
    """cos or sin per token, (B, S, R/2) (gathered at position_ids when given), reshaped with a 1
    on the heads axis so it broadcasts against the rotated features. Folded at import where the
    cache and the positions are constant; constant positions equal in every batch are gathered
    once, as a 1-D take (which the cpu target compiles where they are consecutive)."""
    cache = _float32(c, k, what)
    if pos is None:
        lead = tuple(cache.shape[:-1])
        if cache.type.rank != 3 or any(g not in (1, w) for g, w in zip(lead, (b, s))) or cache.shape[-1] != half:
            c.fail(f"{what} has shape {list(cache.shape)}; without position_ids it must be "
                   f"(batch, sequence, rotary_embedding_dim/2) = {[b, s, half]}")
    else:
        lead = (b, s)
        if cache.type.rank != 2 or cache.shape[-1] != half:
            c.fail(f"{what} has shape {list(cache.shape)}; with position_ids it must be "
                   f"(max position + 1, rotary_embedding_dim/2 = {half})")
    ids = None
    if pos is not None and _static(pos):
        ids = np.asarray(c.value(3, "position_ids"))
        if ids.size and (ids.min() < 0 or ids.max() >= cache.shape[0]):
            c.fail(f"position_ids span [{ids.min()}, {ids.max()}] but {what} has {cache.shape[0]} rows")
        if (ids == ids[:1]).all():   # the same positions in every batch: one row of them, broadcast
            ids, lead = ids[0], (1, s)
    layout = (lead[0], 1, lead[1], half) if four_d else (lead[0], lead[1], 1, half)
    if _static(cache) and (pos is None or ids is not None):
        value = np.asarray(c.value(k, what), np.float32)
        return c.const((value if ids is None else value[ids]).reshape(layout), f"{what}_per_token")
    if ids is not None:
        cache = c.add("take", [cache], {"indices": ids, "axis": 0}, suffix=f"{what}_at_positions")
    elif pos is not None:
        cache = c.add("gather", [cache, pos], {"axis": 0}, suffix=f"{what}_at_positions")
    return c.add("reshape", [cache], {"shape": layout}, suffix=f"{what}_per_token")


@converter("RotaryEmbedding")
def _rotary_embedding(c: _Ctx):
    """RoPE on the first rotary_embedding_dim features of each head: halves (x[:R/2], x[R/2:]) or
    interleaved pairs (x[0::2], x[1::2]) rotated by (cos, sin) of the token's position; 4-D input is
    (B, heads, S, D), 3-D input (B, S, heads*D) is viewed as (B, S, heads, D), never transposed."""
    x = _float32(c, 0, "X")
    pos = c.input(3)
    if pos is not None and (pos.dtype != "int64" or pos.type.rank != 2):
        c.fail(f"position_ids must be int64 (batch, sequence), got {pos.dtype}{list(pos.shape)}")
    if x.type.rank == 4:
        b, h, s, d = x.shape
        xh = x
    elif x.type.rank == 3:
        b, s, hidden = x.shape
        h = int(c.attr("num_heads", 0))
        if h <= 0 or hidden % h:
            c.fail(f"a 3-D input (hidden size {hidden}) needs num_heads dividing it, got num_heads={h}")
        d = hidden // h
        xh = c.add("reshape", [x], {"shape": (b, s, h, d)}, suffix="heads")
    else:
        c.fail(f"X must be 3-D or 4-D, got shape {list(x.shape)}")
    rot = int(c.attr("rotary_embedding_dim", 0)) or d
    if rot % 2 or not 0 < rot <= d:
        c.fail(f"rotary_embedding_dim {rot} must be even and at most the head size {d}")
    half = rot // 2
    interleaved = _int_attr(c, "interleaved", 0, (0, 1))
    if pos is not None and tuple(pos.shape) != (b, s):
        c.fail(f"position_ids has shape {list(pos.shape)}, expected {[b, s]}")
    cos, sin = (_rotary_cache(c, k, what, pos, b, s, half, x.type.rank == 4)
                for k, what in ((1, "cos_cache"), (2, "sin_cache")))
    ax = 3
    if interleaved:
        x1 = _slice(c, xh, ax, 0, rot, 2, "x_even")
        x2 = _slice(c, xh, ax, 1, rot, 2, "x_odd")
    else:
        x1 = _slice(c, xh, ax, 0, half, 1, "x_first_half")
        x2 = _slice(c, xh, ax, half, rot, 1, "x_second_half")
    real = c.add("sub", [c.add("mul", [cos, x1], suffix="cos_x1"), c.add("mul", [sin, x2], suffix="sin_x2")],
                 suffix="real")
    imag = c.add("add", [c.add("mul", [sin, x1], suffix="sin_x1"), c.add("mul", [cos, x2], suffix="cos_x2")],
                 suffix="imag")
    if interleaved:   # (.., R/2) and (.., R/2) -> pairs (.., R/2, 2) -> (.., R)
        lead = tuple(real.shape[:-1])
        pairs = c.add("concat", [c.add("reshape", [real], {"shape": (*lead, half, 1)}, suffix="real_pairs"),
                                 c.add("reshape", [imag], {"shape": (*lead, half, 1)}, suffix="imag_pairs")],
                      {"axis": 4}, suffix="pairs")
        parts = [c.add("reshape", [pairs], {"shape": (*lead, rot)}, suffix="rotated")]
    else:
        parts = [real, imag]
    if rot < d:
        parts.append(_slice(c, xh, ax, rot, d, 1, "x_pass"))
    if x.type.rank == 4:
        return c.add("concat", parts, {"axis": ax})
    return c.add("reshape", [c.add("concat", parts, {"axis": ax}, suffix="rotated_heads")], {"shape": tuple(x.shape)})


# ---- Attention ----------------------------------------------------------------------------------------
def _allowed(q_len: int, kv_len: int, offset, causal: bool, left: int, right: int, nonpad) -> np.ndarray | None:
    """Which keys each query may attend by the structure alone (causal frontier, sliding window,
    the padding of an external cache), as the reference derives it: (Sq, T), or (B, 1, Sq, T)
    where the offset is per batch; None when nothing is excluded. Query i sits at absolute
    position i + offset; key j is allowed iff j <= i + offset (causal), i + offset - j <= left and
    j - i - offset <= right (window; -1 unbounded), and j < nonpad[b]."""
    if not causal and left < 0 and right < 0 and nonpad is None:
        return None
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(kv_len).reshape(1, kv_len)
    per_batch = np.ndim(offset) > 0
    off = np.asarray(offset, np.int64).reshape(-1, 1, 1) if per_batch else int(offset)
    diff = i + off - j
    allowed = np.ones(np.shape(diff), bool)
    if causal:
        allowed &= diff >= 0
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    if nonpad is not None:
        allowed = allowed & (j < np.asarray(nonpad).reshape(-1, 1, 1))
    if allowed.ndim == 3:
        allowed = allowed.reshape(allowed.shape[0], 1, q_len, kv_len)
    return allowed


def _allowed_at_run_time(c: _Ctx, nonpad: Node, q_len: int, kv_len: int, causal: bool, left: int,
                         right: int) -> Node:
    """_allowed for a nonpad_kv_seqlen fed at run time (offset[b] = nonpad[b] - Sq): each bound is
    nonpad compared with a constant (Sq, T) table, so the graph holds no index arithmetic."""
    b = nonpad.shape[0]
    n = c.add("reshape", [nonpad], {"shape": (b, 1, 1)}, suffix="nonpad_b11")
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(kv_len).reshape(1, kv_len)
    base = (q_len + j - i).astype(np.int64)   # i + offset - j >= 0  <=>  nonpad >= Sq + j - i
    conds = [c.add("greater", [n, c.const(j.astype(np.int64), "key_index")], suffix="not_padding")]
    if causal:
        conds.append(c.add("greater_equal", [n, c.const(base, "causal_frontier")], suffix="causal"))
    if left >= 0:
        conds.append(c.add("less_equal", [n, c.const(base + left, "left_window")], suffix="left_window_ok"))
    if right >= 0:
        conds.append(c.add("greater_equal", [n, c.const(base - right, "right_window")], suffix="right_window_ok"))
    allowed = conds[0]
    for k, cond in enumerate(conds[1:]):
        allowed = c.add("logical_and", [allowed, cond], suffix=f"allowed_{k}")
    rows = allowed.shape[1]
    return c.add("reshape", [allowed], {"shape": (b, 1, rows, kv_len)}, suffix="allowed")


def _mask_bias(c: _Ctx, mask: Node, kv_len: int):
    """attn_mask as an additive float32 bias whose last axis is T: True -> 0, False -> -inf for a
    bool mask, a float or integer mask as its values; a short last axis padded with -inf (the
    reference's padding, opset 24's rule). A numpy array where the mask is constant, else a node."""
    if mask.type.rank == 0 or mask.shape[-1] > kv_len:
        c.fail(f"attn_mask has shape {list(mask.shape)}; its last axis must be at most the total sequence "
               f"length {kv_len}")
    pad = kv_len - mask.shape[-1]
    if _static(mask):
        m = np.asarray(c.value(3, "attn_mask"))
        bias = np.where(m, np.float32(0), NEG_INF) if m.dtype == np.bool_ else m.astype(np.float32)
        if pad:
            bias = np.concatenate([bias, np.full((*bias.shape[:-1], pad), NEG_INF, np.float32)], axis=-1)
        return bias
    if mask.dtype == "bool":
        bias = c.add("where", [mask, c.const(np.float32(0), "zero"), c.const(NEG_INF, "minus_inf")],
                     suffix="mask_bias")
    elif mask.dtype != "float32":
        bias = c.add("cast", [mask], {"to": "float32"}, suffix="mask_bias")
    else:
        bias = mask
    if pad:
        fill = c.const(np.full((*mask.shape[:-1], pad), NEG_INF, np.float32), "mask_padding")
        bias = c.add("concat", [bias, fill], {"axis": mask.type.rank - 1}, suffix="mask_padded")
    return bias


def _heads_first(c: _Ctx, x: Node, heads: int, what: str) -> Node:
    """A 3-D (B, S, heads*D) input as (B, heads, S, D)."""
    b, s, hidden = x.shape
    if hidden % heads:
        c.fail(f"{what}'s hidden size {hidden} is not a multiple of its {heads} heads")
    x = c.add("reshape", [x], {"shape": (b, s, heads, hidden // heads)}, suffix=f"{what}_split")
    return c.add("transpose", [x], {"perm": (0, 2, 1, 3)}, suffix=f"{what}_heads")


@converter("Attention")
def _attention(c: _Ctx):
    """softmax(softcap(Q K^T * scale) + bias) V per head, as 3-D matmuls over (batch x kv heads)."""
    q, k, v = _float32(c, 0, "Q"), _float32(c, 1, "K"), _float32(c, 2, "V")
    mask = c.input(3)
    past_k, past_v = _float32(c, 4, "past_key"), _float32(c, 5, "past_value")
    nonpad = c.input(6)
    outs = list(c.onnx_node.output) + [""] * (4 - len(c.onnx_node.output))
    q_heads_attr, kv_heads_attr = c.attr("q_num_heads"), c.attr("kv_num_heads")
    causal = bool(_int_attr(c, "is_causal", 0, (0, 1)))
    mode = _int_attr(c, "qk_matmul_output_mode", 0, (0, 1, 2, 3))
    softcap = float(c.attr("softcap", 0.0))
    left, right = int(c.attr("left_window_size", -1)), int(c.attr("right_window_size", -1))
    if left < -1 or right < -1:
        c.fail(f"left_window_size {left} and right_window_size {right} must be -1 or nonnegative")
    precision = c.attr("softmax_precision")
    if precision is not None and int(precision) not in _SOFTMAX_PRECISIONS:
        c.fail(f"softmax_precision={precision} is not supported (the softmax runs in float32; "
               f"accepted: {', '.join(f'{p} ({n})' for p, n in _SOFTMAX_PRECISIONS.items())})")
    if (past_k is None) != (past_v is None):
        c.fail("past_key and past_value must be given together")
    if nonpad is not None:
        if past_k is not None:
            c.fail("nonpad_kv_seqlen cannot be combined with past_key/past_value")
        if nonpad.dtype != "int64" or nonpad.type.rank != 1:
            c.fail(f"nonpad_kv_seqlen must be int64 (batch,), got {nonpad.dtype}{list(nonpad.shape)}")

    # ---- Q, K, V as (B, heads, S, D)
    ranks = {q.type.rank, k.type.rank, v.type.rank}
    if ranks == {3}:
        if q_heads_attr is None or kv_heads_attr is None or int(q_heads_attr) <= 0 or int(kv_heads_attr) <= 0:
            c.fail("3-D Q, K, V need q_num_heads and kv_num_heads")
        q4 = _heads_first(c, q, int(q_heads_attr), "Q")
        k4 = _heads_first(c, k, int(kv_heads_attr), "K")
        v4 = _heads_first(c, v, int(kv_heads_attr), "V")
    elif ranks == {4}:
        if c.opset >= 25 and (q_heads_attr is not None or kv_heads_attr is not None):
            c.fail("q_num_heads and kv_num_heads must not be given for 4-D inputs")
        for name, val, n in (("q_num_heads", q_heads_attr, q), ("kv_num_heads", kv_heads_attr, k)):
            if val is not None and int(val) != n.shape[1]:
                c.fail(f"{name}={val} disagrees with the {n.shape[1]} heads of the 4-D input")
        q4, k4, v4 = q, k, v
    else:
        c.fail(f"Q, K, V must all be 3-D or all 4-D, got shapes {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    b, hq, sq, d = q4.shape
    _, hkv, skv, _ = k4.shape
    dv = v4.shape[3]
    if k4.shape[0] != b or v4.shape[0] != b or k4.shape[3] != d or v4.shape[1:3] != (hkv, skv):
        c.fail(f"Q {list(q4.shape)}, K {list(k4.shape)}, V {list(v4.shape)} (as batch, heads, sequence, head size) "
               f"do not fit: batch, K's head size and K/V heads and lengths must agree")
    if hq % hkv:
        c.fail(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    reps = hq // hkv

    # ---- the kv cache
    past_len = 0
    if past_k is not None:
        past_len = past_k.shape[2] if past_k.type.rank == 4 else -1
        if (past_k.type.rank != 4 or tuple(past_k.shape) != (b, hkv, past_len, d)
                or tuple(past_v.shape) != (b, hkv, past_len, dv)):
            c.fail(f"past_key {list(past_k.shape)} / past_value {list(past_v.shape)} must be "
                   f"(batch, kv heads, past length, head size) = {[b, hkv, 'P', d]} / {[b, hkv, 'P', dv]}")
        k4 = c.add("concat", [past_k, k4], {"axis": 2}, suffix="present_key")
        v4 = c.add("concat", [past_v, v4], {"axis": 2}, suffix="present_value")
    t = past_len + skv

    # ---- the additive bias: the mask, then the structure (causal, window, padding)
    const_bias, node_biases = None, []
    if mask is not None:
        mb = _mask_bias(c, mask, t)
        if isinstance(mb, np.ndarray):
            const_bias = mb
        else:
            node_biases.append(mb)
    if nonpad is None or _static(nonpad):
        lens = None if nonpad is None else np.asarray(c.value(6, "nonpad_kv_seqlen"), np.int64)
        offset = past_len if lens is None else lens - sq
        allowed = _allowed(sq, t, offset, causal, left, right, lens)
        if allowed is not None:
            structure = np.where(allowed, np.float32(0), NEG_INF)
            const_bias = structure if const_bias is None else const_bias + structure
    else:
        allowed = _allowed_at_run_time(c, nonpad, sq, t, causal, left, right)
        node_biases.append(c.add("where", [allowed, c.const(np.float32(0), "zero_b"),
                                           c.const(NEG_INF, "minus_inf_b")], suffix="structure_bias"))
    full = (b, hq, sq, t)
    for bias in ([const_bias] if const_bias is not None else []) + node_biases:
        shape = tuple(bias.shape)
        try:
            fits = len(shape) <= 4 and np.broadcast_shapes(shape, full) == full
        except ValueError:
            fits = False
        if not fits:
            c.fail(f"attn_mask (as a bias {list(shape)}) does not broadcast to (batch, q heads, q length, "
                   f"total length) = {list(full)}")

    # ---- scores: (Q * sqrt(scale)) (K * sqrt(scale))^T, one 3-D matmul per (batch, kv head)
    scale = c.attr("scale")
    scale = 1 / np.sqrt(d) if scale is None else float(scale)
    if scale < 0:
        c.fail(f"scale {scale} is negative (it is applied as sqrt(scale) to Q and K)")
    root = c.const(np.float32(np.sqrt(scale)), "sqrt_scale")
    qs = c.add("mul", [q4, root], suffix="q_scaled")
    ks = c.add("mul", [k4, root], suffix="k_scaled")
    q3 = c.add("reshape", [qs], {"shape": (b * hkv, reps * sq, d)}, suffix="q_groups")
    k3 = c.add("transpose", [c.add("reshape", [ks], {"shape": (b * hkv, t, d)}, suffix="k_rows")],
               {"perm": (0, 2, 1)}, suffix="k_transposed")
    scores = c.add("reshape", [c.add("matmul", [q3, k3], suffix="scores_groups")], {"shape": full}, suffix="scores")
    qk_out = scores
    if softcap > 0:
        cap = c.const(np.float32(softcap), "softcap_value")
        scores = c.add("mul", [c.add("tanh", [c.add("div", [scores, cap], suffix="softcap_scaled")],
                                     suffix="softcap_tanh"), cap], suffix="softcapped")
    if mode == 1:
        qk_out = scores
    if const_bias is not None:
        scores = c.add("add", [scores, c.const(const_bias.astype(np.float32), "bias")], suffix="biased")
    for k_, nb in enumerate(node_biases):
        scores = c.add("add", [scores, nb], suffix=f"biased_{k_}")
    if mode == 2:
        qk_out = scores

    # ---- softmax, with fully masked rows (every key's bias -inf) zero instead of NaN
    dead = None
    if node_biases:
        total = node_biases[0]
        for k_, nb in enumerate(node_biases[1:]):
            total = c.add("add", [total, nb], suffix=f"bias_sum_{k_}")
        if const_bias is not None:
            total = c.add("add", [total, c.const(const_bias.astype(np.float32), "bias_for_rows")], suffix="bias_total")
        row_max = c.add("reduce_max", [total], {"axes": [total.type.rank - 1], "keepdims": 1}, suffix="bias_row_max")
        dead = c.add("equal", [row_max, c.const(NEG_INF, "minus_inf_rows")], suffix="row_fully_masked")
    elif const_bias is not None and np.isneginf(const_bias.max(axis=-1, keepdims=True)).any():
        dead = c.const(np.isneginf(const_bias.max(axis=-1, keepdims=True)), "row_fully_masked")
    zero = c.const(np.float32(0), "zero_rows") if dead is not None else None
    if dead is not None:
        scores = c.add("where", [dead, zero, scores], suffix="scores_finite")
    probs = c.add("softmax", [scores], {"axis": 3}, suffix="probs")
    if dead is not None:
        probs = c.add("where", [dead, zero, probs], suffix="probs_guarded")
    if mode == 3:
        qk_out = probs

    # ---- context: probs V, back to the input layout
    p3 = c.add("reshape", [probs], {"shape": (b * hkv, reps * sq, t)}, suffix="probs_groups")
    v3 = c.add("reshape", [v4], {"shape": (b * hkv, t, dv)}, suffix="v_rows")
    ctx = c.add("matmul", [p3, v3], suffix="context_groups")
    if q.type.rank == 4:
        y = c.add("reshape", [ctx], {"shape": (b, hq, sq, dv)})
    else:
        ctx = c.add("reshape", [ctx], {"shape": (b, hq, sq, dv)}, suffix="context")
        ctx = c.add("transpose", [ctx], {"perm": (0, 2, 1, 3)}, suffix="context_tokens")
        y = c.add("reshape", [ctx], {"shape": (b, sq, hq * dv)})
    results = [y, k4, v4, qk_out]
    return [n for n, name in zip(results, outs) if name]

