"""Softmax attention over a KV cache, with grouped KV heads (MHA / GQA / MQA).

Legend: T new tokens, S cached positions (including the new ones), H query heads, Hkv KV heads,
K key head dim, V value head dim.

    logits[h, t, s] = (q[t, h] . k[s, h // (H/Hkv)]) * kq_scale + mask[t, s]     mask: 0 or -inf (causal)
    out[t, h]       = softmax_s(logits[h, t]) @ v[:, h // (H/Hkv)]

llama.cpp: `build_attn_mha` without flash attention (src/llama-graph.cpp:2616-2755): `kq = mul_mat(k, q)`,
`soft_max_ext(kq, mask, kq_scale)`, `kqv = mul_mat(v, kq)`, all in f32 with an f32 KV cache.

Two forms of the same numbers, side by side:
- `attention`, one shot: the whole [H, T, S] score tensor at once, the form llama.cpp's graph traces (`kq`,
  `kq_soft_max`); the oracle of the other, and what runs when a trace keeps those tensors (`keeps_scores`).
- `attention_blocked`: query blocks against key blocks with an online softmax (the flash-attention recurrence),
  memory O(q_block x k_block x H) whatever S; key blocks the mask hides entirely are skipped (half the causal
  work). It differs from the one-shot form only in float summation order (float64: <= 1e-12).
`attend` picks one. Neither rounds anything to f16: llama.cpp's non-flash path keeps kq, the softmax and kqv in
f32 with an f32 cache, in llama.cpp mode too (that mode rounds only the inputs of weight matmuls, `Runtime`).
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


def attention_blocked(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, kq_scale: float, *,
                      mask_fn=causal_mask, q_block: int = 256, k_block: int = 512, dtype=np.float32) -> np.ndarray:
    """q: [T, H, K], k: [S, Hkv, K], v: [S, Hkv, V], q_pos [T] -> [T, H, V]: `attention` with
    mask = mask_fn(q_pos, arange(S)), computed for one [Tb, Sb] tile of the mask at a time.

    Per query block, over key blocks j, with x_j = (q . k_j) * kq_scale + mask_j   [H, Tb, Sb]:
        m'  = max(m, rowmax(x_j));   a = exp(m - m');   p = exp(x_j - m')
        l   = l * a + rowsum(p);     acc = acc * a + p @ v_j;   m = m'
    and out = acc / l: softmax(x) @ v without ever holding a row of x whole (m starts at -inf; a row that has
    seen only masked keys keeps m = -inf and contributes nothing, `m_safe`).
    """
    T, H, K = q.shape
    S, Hkv, _ = k.shape
    V = v.shape[-1]
    assert H % Hkv == 0, f"{H} query heads do not group evenly over {Hkv} KV heads"
    assert q_pos.shape == (T,) and v.shape[0] == S, (q_pos.shape, k.shape, v.shape)
    g = H // Hkv
    k_pos = np.arange(S)
    kt = k.astype(dtype, copy=False).transpose(1, 2, 0)[:, None]                 # [S, Hkv, K] -> [Hkv, 1, K, S]
    vt = v.astype(dtype, copy=False).transpose(1, 0, 2)[:, None]                 # [S, Hkv, V] -> [Hkv, 1, S, V]
    out = np.empty_like(q, shape=(Hkv, g, T, V), dtype=dtype)                   # (like q: where q lives)
    for t0 in range(0, T, q_block):
        t1 = min(t0 + q_block, T)
        qb = q[t0:t1].astype(dtype, copy=False).reshape(t1 - t0, Hkv, g, K).transpose(1, 2, 0, 3)   # [Hkv, g, Tb, K]
        m = np.full_like(q, -np.inf, shape=(Hkv, g, t1 - t0, 1), dtype=dtype)    # running row max
        l = np.zeros_like(q, shape=(Hkv, g, t1 - t0, 1), dtype=np.float64)       # running row sum (f64, as softmax)
        acc = np.zeros_like(q, shape=(Hkv, g, t1 - t0, V), dtype=dtype)          # running p @ v
        for s0 in range(0, S, k_block):
            s1 = min(s0 + k_block, S)
            mask = mask_fn(q_pos[t0:t1], k_pos[s0:s1])                           # [Tb, Sb]
            if np.all(mask == -np.inf):
                continue                                                         # a tile the mask hides
            x = (qb @ kt[..., s0:s1]) * dtype(kq_scale) + mask.astype(dtype)     # [Hkv, g, Tb, Sb]
            m_new = np.maximum(m, x.max(axis=-1, keepdims=True))                 # [Hkv, g, Tb, 1]
            m_safe = np.where(np.isfinite(m_new), m_new, dtype(0))
            a = np.exp(m - m_safe)                                               # [Hkv, g, Tb, 1]
            p = np.exp(x - m_safe)                                               # [Hkv, g, Tb, Sb], masked -> 0
            l = l * a + np.sum(p, axis=-1, keepdims=True, dtype=np.float64)
            acc = acc * a + p @ vt[:, :, s0:s1]                                  # [Hkv, g, Tb, V]
            m = m_new
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, :, t0:t1] = acc / l.astype(dtype)                             # a row with no key: NaN, as softmax
    return out.reshape(H, T, V).transpose(1, 0, 2)                               # [Hkv, g, T, V] -> [T, H, V]


def keeps_scores(rt, il: int) -> bool:
    """Whether the runtime's trace keeps layer il's [H, T, S] scores (`kq`, `kq_soft_max`): then the one-shot form
    runs (a compare or a golden of every tensor), else the blocked one."""
    return rt.keeps("kq", il) or rt.keeps("kq_soft_max", il)


def attend(q, k, v, q_pos, kq_scale: float, *, mask_fn=causal_mask, one_shot: bool = False, record=None,
           il: int = -1, dtype=np.float32) -> np.ndarray:
    """Softmax attention as the caller needs it: q [T, H, K], k [S, Hkv, K], v [S, Hkv, V], q_pos [T] -> [T, H, V].

    one_shot: `attention` over the whole mask_fn(q_pos, arange(S)) [T, S], tracing kq, kq_soft_max and kqv (pass
    `keeps_scores(rt, il)`); else `attention_blocked`, tracing kqv [H, T, V] only."""
    if one_shot:
        mask = mask_fn(q_pos, np.arange(k.shape[0]))                             # [T, S]
        return attention(q, k, v, mask, kq_scale, record, il, dtype)
    o = attention_blocked(q, k, v, q_pos, kq_scale, mask_fn=mask_fn, dtype=dtype)   # [T, H, V]
    if record is not None:
        record("kqv", il, o.transpose(1, 0, 2))                                  # [H, T, V]
    return o


def no_mask(q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    """[T], [S] -> [T, S] zeros: every key visible (non-causal attention)."""
    return np.zeros((q_pos.size, k_pos.size), dtype=np.float32)
