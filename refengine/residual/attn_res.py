"""Attention residuals (Kimi-K3, "AttnRes"): each sub-layer reads a softmax mix of banked earlier streams.

Legend: T tokens, D model dim, N banked checkpoints, bs = `attn_res.block_size`.

A plain pre-norm block reads the running sum x of everything before it. K3 keeps a bank of checkpoints
(the raw block input of every bs-th layer) and lets each sub-layer choose, per token, how much of each
checkpoint and of the current running sum it reads (src/models/kimi-k3.cpp:190-234 `res_push`/`res_mix`):

    score_i = sum_d rms_norm(c_i)[d] * w[d]        for every banked checkpoint c_i [T, D] and for cur
    p       = softmax([score_1 .. score_N, score_cur])                  res_probs    [T, N+1]
    mix     = sum_i p_i * c_i + p_cur * cur                             (RAW values, not the normed ones)

w is `blk.N.attn_res_score` (before attention), `blk.N.ffn_res_score` (before the FFN) or
`output_res_score` (before output_norm); the converter folds the HF `*_res_norm.weight * *_res_proj.weight`
product into that one [D] vector. The layer loop (kimi-k3.cpp:277-330):

    ps  = x                                            (the running sum: block input)
    cur = res_mix(ps, attn_res_score)                  (nothing banked yet at layer 0: cur = ps)
    if il % bs == 0: bank ps                           (banked AFTER this layer's attention-side mix)
    a   = attention(rms_norm(cur) * attn_norm)
    ps  = a if banked else ps + a                      (the running sum restarts on bank layers)   prefix_sum_attn
    cur = res_mix(ps, ffn_res_score)
    ps  = ps + ffn(rms_norm(cur) * ffn_norm)                                                       l_out

Everything is per token, so a decode step needs no state from earlier calls: the bank lives for one
forward pass (`ResidualStream`). Arithmetic as ggml-cpu: rms_norm and sum_rows accumulate in double,
softmax as ggml_soft_max, the stack sum `ggml_dsv4_hc_pre` adds the checkpoints in bank order in float32
(ggml/src/ggml-cpu/ops.cpp:11517-11535), then `+ cur * p_cur`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ops import rms_norm, softmax


@dataclass
class ResidualStream:
    """What K3's blocks pass each other: the running sum `x` [T, D] and the banked checkpoints, each [T, D]."""
    x: np.ndarray
    bank: list = field(default_factory=list)

    @property
    def shape(self):
        return self.x.shape


def _score(c: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """sum_d rms_norm(c)[d] * w[d]: c [T, D], w [D] -> [T] (ggml_sum_rows accumulates in double)."""
    return np.sum(rms_norm(c, None, eps) * w, axis=-1, dtype=np.float64).astype(np.float32)


def res_mix(cur: np.ndarray, bank: list, w: np.ndarray, eps: float, *, rt=None, il: int = -1) -> np.ndarray:
    """The softmax mix of the banked checkpoints and `cur`: cur [T, D], bank N x [T, D], w [D] -> [T, D].
    An empty bank returns cur unchanged (llama.cpp's layer 0). Traces `res_probs` [T, N+1]."""
    if not bank:
        return cur
    T, D = cur.shape
    assert w.shape == (D,) and all(c.shape == (T, D) for c in bank), (cur.shape, w.shape, [c.shape for c in bank])
    scores = np.stack([_score(c, w, eps) for c in bank] + [_score(cur, w, eps)], axis=-1)     # [T, N+1]
    p = softmax(scores)                                                                        # [T, N+1]
    if rt is not None:
        rt.record("res_probs", il, p)
    out = np.zeros_like(cur, shape=(T, D), dtype=np.float32)
    for i, c in enumerate(bank):                                   # ggml_dsv4_hc_pre: float32, bank order
        out += c * p[:, i:i + 1]
    return out + cur * p[:, -1:]                                   # [T, D]
