"""DeepSeek-V4's lightning indexer (CSA layers): which pooled blocks each query attends to.

Legend: T tokens, Dq q-LoRA rank, Hi indexer heads, di indexer head dim, R rope dims, N pooled blocks so far.

    iq      = rope((qr @ W_iq_b.T).reshape(T, Hi, di), pos)   (last R dims, compressed-layer rope)   lid_q_rope
    iw      = (h @ W_proj.T) / sqrt(di * Hi)                                                  lid_weights [T, Hi]
    ik_b    = the b-th pooled key of the indexer's own compressor (attention/kv_compressor.py, width di)   [N, di]
    score   = sum_h relu(iq[t, h] . ik_b) * iw[t, h]  +  (0 if b < (p_t + 1) // 4 else -inf)   lid_score_masked [T, N]
    keep    = the top_k blocks of score (fewer when fewer are visible)                          lid_top_k   [T, k]

llama.cpp: `build_lid_top_k` (src/models/deepseek4.cpp:590-676; the fused `ggml_lightning_indexer`, f32,
ggml-cpu ops.cpp:12355). It multiplies iq and the pooled keys by an orthonormal Walsh-Hadamard matrix first (the
indexer cache is always "rotated", src/llama-kv-cache.cpp:321-331): q.k is unchanged, only rounding moves; this
module does the same so the traced `lid_q_rot` / `lid_k` are llama.cpp's values. Its top-k takes
min(n_lid, top_k) cells of a padded row (n_lid >= 256): where fewer than top_k blocks are visible, the rest of
its picks are masked cells, which the attention mask then drops (`build_top_k_mask`, :678-705).
"""
from __future__ import annotations

import functools

import numpy as np

from ..ops.arrays import as_array


@functools.lru_cache(maxsize=8)
def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix of size n (a power of 2), Sylvester's order (`ggml_gen_hadamard`,
    src/llama-kv-cache.cpp:23-57). [n, n], symmetric, H @ H = I. Made once per n and read-only (a constant: a
    device keeps one copy of it)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard rotation: {n} is not a power of 2")
    h = np.array([[1.0]], dtype=np.float32) / np.float32(np.sqrt(n))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    h = h.astype(np.float32)
    h.flags.writeable = False
    return h


def rotate(x: np.ndarray) -> np.ndarray:
    """x [..., n] @ H (`llama_mul_mat_hadamard`: mul_mat(rot, x) per row; H is symmetric)."""
    return (x.reshape(-1, x.shape[-1]) @ hadamard(x.shape[-1])).reshape(x.shape).astype(np.float32)


def visible_blocks(pos: np.ndarray, n_blocks: int, ratio: int) -> np.ndarray:
    """[T, N] bool: block b is visible to the query at position p iff b < (p + 1) // ratio (the block has
    finished by p; llama-kv-cache-dsv4.cpp:499)."""
    pos = as_array(pos)
    return np.arange(n_blocks, like=pos)[None, :] < ((pos + 1) // ratio)[:, None]


def select_blocks(qr, h, w, keys: np.ndarray, *, pos, n_head: int, head_dim: int, top_k: int, rope, rt, il: int):
    """qr [T, Dq] (the normed q-LoRA latent), h [T, D], keys [N, di] (rotated pooled keys), pos [T]
    -> (selected [T, N] bool, the top-k ids [T, k] int32 with -1 for a slot no visible block fills)."""
    T = qr.shape[0]
    iq = rt.matmul(qr, w.indexer_attn_q_b).reshape(T, n_head, head_dim)        # [T, Dq] -> [T, Hi, di]
    rt.record("lid_q", il, iq)
    iq = rope(iq, pos)
    rt.record("lid_q_rope", il, iq)
    iq = rotate(iq)
    rt.record("lid_q_rot", il, iq)
    iw = rt.matmul(h, w.indexer_proj) * np.float32(1.0 / np.sqrt(np.float32(head_dim * n_head)))   # [T, Hi]
    rt.record("lid_weights", il, iw)
    rt.record("lid_k", il, keys[:, None, :])                                    # [N, 1, di]
    vis = visible_blocks(pos, keys.shape[0], 4)                                  # [T, N]
    qk = np.einsum("thd,nd->thn", iq, keys, dtype=np.float32)                    # [T, Hi, N]
    score = np.sum(np.maximum(qk, 0) * iw[:, :, None], axis=1, dtype=np.float32)   # [T, N], heads summed in order
    score = np.where(vis, score, np.float32(-np.inf)).astype(np.float32)
    rt.record("lid_score_masked", il, score)
    k = min(top_k, keys.shape[0])
    order = np.argsort(-score, axis=-1, kind="stable")[:, :k]                   # [T, k]
    ids = np.where(np.take_along_axis(vis, order, axis=-1), order, -1).astype(np.int32)
    if k < top_k:
        ids = np.concatenate([ids, np.full_like(ids, -1, shape=(T, top_k - k))], axis=1)
    rt.record("lid_top_k", il, ids)
    sel = np.zeros_like(vis)
    np.put_along_axis(sel, order, True, axis=-1)
    return sel & vis, ids
