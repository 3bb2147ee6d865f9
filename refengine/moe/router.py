"""Expert routing: router logits -> (expert ids, expert weights) per token.

Legend: T tokens, E experts, A active experts per token, G expert groups.

`build_moe_ffn` (src/llama-graph.cpp:2007-2173), the routing half, for every gating function:

    probs     = gate(logits)                              [T, E]   ffn_moe_probs
    sel       = probs + exp_probs_b   (if present)        [T, E]   ffn_moe_probs_biased   (selection only)
    groups:     keep the experts of the n_group_used best groups of sel, others -> -inf (group_limited)
    ids       = top-A of sel, descending                  [T, A]   ffn_moe_argsort / ffn_moe_topk
    weights   = probs[ids]              (UNBIASED probs)  [T, A]   ffn_moe_weights
    softmax_weight gating only:  weights = softmax(weights)        ffn_moe_weights_softmax
    if norm_w:  weights /= max(sum(weights), 2^-14)       (clamped to the smallest normal f16)
    if scale not in (0, 1):  weights *= scale             (routed_scaling_factor)

Everything is float32, as ggml-cpu computes it; the gate functions use the same float32 formulas as
ggml-cpu's unary ops (`ggml/src/ggml-cpu/unary-ops.cpp`, `vec.h`), not the numerically nicer ones.
"""
from __future__ import annotations

import numpy as np

from ..ops.activations import sigmoid, softplus
from ..ops.softmax import softmax
from ..ops.arrays import as_array, fused_op

# `expert_gating_func` values (LLAMA_EXPERT_GATING_FUNC_TYPE_*, src/llama-hparams.h:16-22; 0 = "not set",
# which each arch's loader replaces by its own default).
GATING_SOFTMAX = 1         # probs = softmax(logits) over all E experts          (Mixtral, Qwen3-MoE, DeepSeek-V2)
GATING_SIGMOID = 2         # probs = 1 / (1 + exp(-logits)) per expert           (DeepSeek-V3, Kimi-K2, GLM-4.5)
GATING_SOFTMAX_WEIGHT = 3  # select on the raw logits; weights = softmax over the A selected logits (gpt-oss)
GATING_SQRT_SOFTPLUS = 4   # probs = sqrt(softplus(logits)), softplus(x) = x if x > 20 else log(1 + exp(x))
                           # (DeepSeek-V4; llama.cpp forces an f32 accumulator for its router matmul, a GPU concern)
GATING_NAMES = {GATING_SOFTMAX: "softmax", GATING_SIGMOID: "sigmoid",
                GATING_SOFTMAX_WEIGHT: "softmax_weight", GATING_SQRT_SOFTPLUS: "sqrt_softplus"}

# ggml_clamp(weights_sum, 6.103515625e-5, INF) before normalizing: avoids dividing by zero; the value
# is the smallest normal f16 (2^-14), whatever the activation type.
F16_MIN_NORMAL = np.float32(6.103515625e-5)


def topk_desc(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row, largest first, lower index first on ties.  [T, E] -> [T, A] int32

    (ggml_argsort is std::sort, not stable: llama.cpp may order exact ties either way.)
    """
    if (f := fused_op(scores, "top_k")) is not None and (ids := f(scores, k)) is not None:
        return ids                                                           # a GPU: one launch (cuda/fused.py)
    order = np.argsort(-scores, axis=-1, kind="stable")
    return order[:, :k].astype(np.int32)


def gate_probs(logits: np.ndarray, gating: int) -> np.ndarray:
    """The gate function of `build_moe_ffn` (llama-graph.cpp:2052-2072), float32.   [T, E] -> [T, E]"""
    x = as_array(logits, np.float32)
    if gating == GATING_SOFTMAX:
        return softmax(x)                                                    # ggml_soft_max
    if gating == GATING_SIGMOID:
        return sigmoid(x)                                                    # ggml_vec_sigmoid_f32 (a GPU: one launch)
    if gating == GATING_SOFTMAX_WEIGHT:
        return x                                                             # probs = logits
    if gating == GATING_SQRT_SOFTPLUS:
        # op_softplus: log(1 + exp(x)) in float32, x itself above 20 (not log1p: 1 + exp(x) rounds to 1 below ~-17)
        return np.sqrt(softplus(x)).astype(np.float32, copy=False)           # ggml_sqrt
    raise ValueError(f"expert gating function {gating!r} is not one of "
                     + ", ".join(f"{k} ({v})" for k, v in GATING_NAMES.items()))


def group_limited(scores: np.ndarray, n_groups: int, n_used: int, record=None, il: int = -1) -> np.ndarray:
    """Keep only the experts of the best `n_used` groups (DeepSeek-V3 group routing); others -> -inf.

    scores [T, E] -> [T, E]: the *selection* scores (biased when there is an exp_probs_b). A group's
    score is the sum of its two best experts, whatever the group size (llama-graph.cpp:2097-2117).
    """
    rec = record or (lambda *a: None)
    T, E = scores.shape
    if E % n_groups or E // n_groups < 2:
        raise ValueError(f"group routing needs E % G == 0 and at least 2 experts per group: E = {E}, G = {n_groups}")
    if (f := fused_op(scores, "group_limited")) is not None \
            and (res := f(scores, n_groups, n_used)) is not None:            # a GPU: one launch (cuda/fused.py)
        masked, groups = res
        rec("ffn_moe_group_topk", il, groups)
        rec("ffn_moe_probs_masked", il, masked)
        return masked
    g = scores.reshape(T, n_groups, E // n_groups)                         # [T, G, E/G]
    top2 = -np.sort(-g, axis=-1)[..., :2]                                  # [T, G, 2]
    group_scores = top2.sum(axis=-1, dtype=np.float32)                     # [T, G]
    groups = topk_desc(group_scores, n_used)                               # [T, n_used]
    rec("ffn_moe_group_topk", il, groups)
    masked = np.full_like(g, -np.inf)
    rows = np.arange(T, like=g)[:, None]                                   # (made where g lives)
    masked[rows, groups] = g[rows, groups]
    masked = masked.reshape(T, E)
    rec("ffn_moe_probs_masked", il, masked)
    return masked


def route(logits: np.ndarray, k: int, *, gating: int = GATING_SOFTMAX, bias: np.ndarray | None = None,
          norm_w: bool = False, w_scale: float = 0.0, n_groups: int = 0, n_group_used: int = 0,
          record=None, il: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """logits [T, E] (ffn_moe_logits), bias [E] (exp_probs_b) -> ids [T, A] int32, weights [T, A] float32.

    The routing steps of `build_moe_ffn` (llama-graph.cpp:2050-2166), in its order and under its names.
    """
    rec = record or (lambda *a: None)
    T, E = logits.shape
    if not 0 < k <= E:
        raise ValueError(f"routing: {k} active experts out of {E}")
    # a GPU: (probs, selection, ids, weights[, masked, groups]) of a softmax router without bias or groups, or of a
    # sigmoid router, in one launch
    fused = None
    scale = None if w_scale in (0.0, 1.0) else float(w_scale)
    grouped = n_groups > 1 and T > 0
    if gating == GATING_SOFTMAX and bias is None and not grouped \
            and (f := fused_op(logits, "route_softmax")) is not None and (r := f(logits, k, norm_w, scale)) is not None:
        fused = (r[0], r[0], r[1], r[2])
    elif gating == GATING_SIGMOID and (f := fused_op(logits, "route_sigmoid")) is not None:
        fused = f(logits, k, bias, norm_w, scale, n_groups if grouped else 0, n_group_used if grouped else 0)
    probs = gate_probs(logits, gating) if fused is None else fused[0]     # [T, E]
    rec("ffn_moe_probs", il, probs)
    selection = probs
    if bias is not None:
        selection = probs + np.asarray(bias, dtype=np.float32)[None, :] if fused is None else fused[1]   # [T, E],
        rec("ffn_moe_probs_biased", il, selection)                                                     # selection only
    if grouped and fused is not None:
        rec("ffn_moe_group_topk", il, fused[5])
        rec("ffn_moe_probs_masked", il, fused[4])
        selection = fused[4]
    elif grouped:
        selection = group_limited(selection, n_groups, n_group_used, rec, il)
    rec("ffn_moe_argsort", il,                                             # [T, E], descending: made when read
        lambda: np.argsort(-selection, axis=-1, kind="stable").astype(np.int32))
    ids = topk_desc(selection, k) if fused is None else fused[2]           # [T, A], its first A
    rec("ffn_moe_topk", il, ids)
    if fused is not None:
        _record_weight_steps(probs, ids, gating, norm_w, w_scale, rec, il)
        return ids, fused[3]
    return ids, expert_weights(probs, ids, gating=gating, norm_w=norm_w, w_scale=w_scale, record=rec, il=il)


def expert_weights(probs: np.ndarray, ids: np.ndarray, *, gating: int, norm_w: bool, w_scale: float,
                   record=None, il: int = -1) -> np.ndarray:
    """The selected experts' weights: probs [T, E] (unbiased), ids [T, A] -> [T, A] float32 (the tail of
    `build_moe_ffn`'s routing, whichever way the ids were chosen)."""
    rec = record or (lambda *a: None)
    scale = None if w_scale in (0.0, 1.0) else float(w_scale)
    if gating != GATING_SOFTMAX_WEIGHT and (f := fused_op(probs, "expert_weights")) is not None \
            and (weights := f(probs, ids, norm_w, scale)) is not None:       # a GPU: one launch (cuda/fused.py)
        _record_weight_steps(probs, ids, gating, norm_w, w_scale, rec, il)
        return weights
    return _weight_steps(probs, ids, gating, norm_w, w_scale, rec, il)


def _record_weight_steps(probs, ids, gating: int, norm_w: bool, w_scale: float, rec, il: int) -> None:
    """The steps of `_weight_steps` recorded lazily (a fused kernel made the weights): run once, only for a record
    that keeps one of them."""
    steps: dict = {}

    def step(name):
        if not steps:
            _weight_steps(probs, ids, gating, norm_w, w_scale, lambda n, _il, v: steps.__setitem__(n, v), il)
        return steps[name]
    for name in ("ffn_moe_weights",) + (("ffn_moe_weights_sum", "ffn_moe_weights_sum_clamped",
                                          "ffn_moe_weights_norm") if norm_w else ()) \
            + (("ffn_moe_weights_scaled",) if w_scale not in (0.0, 1.0) else ()):
        rec(name, il, lambda n=name: step(n))


def _weight_steps(probs, ids, gating: int, norm_w: bool, w_scale: float, rec, il: int) -> np.ndarray:
    """`expert_weights` step by step, each step's tensor recorded under llama.cpp's name."""
    weights = np.take_along_axis(probs, ids, axis=-1)                      # [T, A], unbiased
    rec("ffn_moe_weights", il, weights)
    if gating == GATING_SOFTMAX_WEIGHT:
        weights = softmax(weights)                                         # [T, A]
        rec("ffn_moe_weights_softmax", il, weights)
    if norm_w:
        wsum = np.sum(weights, axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)  # [T, 1]
        rec("ffn_moe_weights_sum", il, wsum)
        wsum = np.maximum(wsum, F16_MIN_NORMAL)
        rec("ffn_moe_weights_sum_clamped", il, wsum)
        weights = weights / wsum
        rec("ffn_moe_weights_norm", il, weights)
    if w_scale not in (0.0, 1.0):
        weights = weights * np.float32(w_scale)
        rec("ffn_moe_weights_scaled", il, weights)
    return weights.astype(np.float32)


def softmax_topk(logits: np.ndarray, k: int, *, norm_w: bool, w_scale: float = 0.0, n_groups: int = 0,
                 n_group_used: int = 0, record=None, il: int = -1):
    """Softmax top-k routing (no selection bias): `route(..., gating=GATING_SOFTMAX)`.
    logits: [T, E] -> ids [T, A] int32, weights [T, A] float32."""
    return route(logits, k, gating=GATING_SOFTMAX, norm_w=norm_w, w_scale=w_scale, n_groups=n_groups,
                 n_group_used=n_group_used, record=record, il=il)
