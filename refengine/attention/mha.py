"""Softmax attention over a KV cache, with grouped KV heads (MHA / GQA / MQA).

Legend: T new tokens, S cached positions (including the new ones), H query heads, Hkv KV heads,
K key head dim, V value head dim.

    logits[h, t, s] = (q[t, h] . k[s, h // (H/Hkv)]) * kq_scale + mask[t, s]     mask: 0 or -inf (causal)
    out[t, h]       = softmax_s(logits[h, t]) @ v[:, h // (H/Hkv)]

llama.cpp: `build_attn_mha` without flash attention (src/llama-graph.cpp:2616-2755): `kq = mul_mat(k, q)`,
`soft_max_ext(kq, mask, kq_scale)`, `kqv = mul_mat(v, kq)`, all in f32 with an f32 KV cache.
"""
from __future__ import annotations

import numpy as np

from ..ops.softmax import softmax


def causal_mask(q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    """[T], [S] -> [T, S] with 0 where k_pos <= q_pos, -inf elsewhere."""
    return np.where(k_pos[None, :] <= q_pos[:, None], np.float32(0.0), np.float32(-np.inf)).astype(np.float32)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, kq_scale: float,
              record=None, il: int = -1, dtype=np.float32) -> np.ndarray:
    """q: [T, H, K], k: [S, Hkv, K], v: [S, Hkv, V], mask: [T, S] -> [T, H, V].

    `dtype`: float32 as llama.cpp (f32 KV cache); float64 for the equivalence tests (MLA naive vs absorbed).

    Traces llama.cpp's `kq` (unscaled, unmasked logits), `kq_soft_max` and `kqv`, each [H, T, *].
    """
    T, H, K = q.shape
    S, Hkv, _ = k.shape
    V = v.shape[-1]
    assert H % Hkv == 0, f"{H} query heads do not group evenly over {Hkv} KV heads"
    g = H // Hkv
    qg = q.reshape(T, Hkv, g, K)                                          # [T, Hkv, g, K]
    logits = np.einsum("tngk,snk->ngts", qg, k, dtype=dtype)              # [Hkv, g, T, S]
    probs = softmax(logits * dtype(kq_scale) + mask)                      # [Hkv, g, T, S]
    out = np.einsum("ngts,snv->ngtv", probs, v, dtype=dtype)              # [Hkv, g, T, V]
    if record is not None:
        record("kq", il, logits.reshape(H, T, S))
        record("kq_soft_max", il, probs.reshape(H, T, S))
        record("kqv", il, out.reshape(H, T, V))
    return out.reshape(H, T, V).transpose(1, 0, 2)                        # [T, H, V]
