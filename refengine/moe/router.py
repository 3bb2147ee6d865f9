"""Expert routing: router logits -> (expert ids, expert weights) per token.

Legend: T tokens, D model dim, E experts, A active experts per token.

Softmax top-k (Mixtral, Qwen3-MoE; `build_moe_ffn` with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX,
src/llama-graph.cpp:2007-2180):

    probs   = softmax(x @ W_gate_inp.T)                  [T, E]
    (groups: keep the experts of the best groups only, see group_limited)
    ids     = top-k of probs, descending                 [T, A]
    weights = probs[ids]                                 [T, A]
    if norm_w:  weights /= max(sum(weights), 2^-14)      (clamped to the smallest normal f16)
    if scale not in (0, 1):  weights *= scale
"""
from __future__ import annotations

import numpy as np

from ..ops.softmax import softmax

F16_MIN_NORMAL = np.float32(6.103515625e-5)


def topk_desc(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row, largest first, lower index first on ties.  [T, E] -> [T, A] int32"""
    order = np.argsort(-scores, axis=-1, kind="stable")
    return order[:, :k].astype(np.int32)


def group_limited(scores: np.ndarray, n_groups: int, n_used: int, record=None, il: int = -1) -> np.ndarray:
    """Keep only the experts of the best `n_used` groups (DeepSeek-V3 group routing); others -> -inf.

    scores [T, E] -> [T, E].  A group's score is the sum of its two best experts
    (`build_moe_ffn`, src/llama-graph.cpp: "select top n_group_used expert groups").
    """
    rec = record or (lambda *a: None)
    T, E = scores.shape
    g = scores.reshape(T, n_groups, E // n_groups)                         # [T, G, E/G]
    top2 = -np.sort(-g, axis=-1)[..., :2]                                  # [T, G, 2]
    group_scores = top2.sum(axis=-1, dtype=np.float32)                     # [T, G]
    groups = topk_desc(group_scores, n_used)                               # [T, n_used]
    rec("ffn_moe_group_topk", il, groups)
    masked = np.full_like(g, -np.inf)
    rows = np.arange(T)[:, None]
    masked[rows, groups] = g[rows, groups]
    masked = masked.reshape(T, E)
    rec("ffn_moe_probs_masked", il, masked)
    return masked


def softmax_topk(logits: np.ndarray, k: int, *, norm_w: bool, w_scale: float = 0.0, n_groups: int = 0,
                 n_group_used: int = 0, record=None, il: int = -1):
    """logits: [T, E] -> ids [T, A] int32, weights [T, A] float32."""
    rec = record or (lambda *a: None)
    probs = softmax(logits)                                        # [T, E]
    rec("ffn_moe_probs", il, probs)
    selection = probs
    if n_groups > 1:
        selection = group_limited(probs, n_groups, n_group_used, rec, il)
    order = np.argsort(-selection, axis=-1, kind="stable").astype(np.int32)   # [T, E], descending
    rec("ffn_moe_argsort", il, order)
    ids = order[:, :k]                                             # [T, A]
    rec("ffn_moe_topk", il, ids)
    weights = np.take_along_axis(probs, ids, axis=-1)              # [T, A]
    rec("ffn_moe_weights", il, weights)
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
    return ids, weights.astype(np.float32)
