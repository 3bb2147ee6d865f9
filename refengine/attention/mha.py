"""Softmax attention over a KV cache, with grouped KV heads (MHA / GQA / MQA).

Legend: T new tokens, S cached positions (including the new ones), H query heads, Hkv KV heads,
K key head dim, V value head dim.

    logits[h, t, s] = (q[t, h] . k[s, h // (H/Hkv)]) * kq_scale + mask[t, s]     mask: 0 or -inf (causal)
    out[t, h]       = softmax_s(logits[h, t]) @ v[:, h // (H/Hkv)]

llama.cpp: `build_attn_mha` without flash attention (src/llama-graph.cpp:2616-2755): `kq = mul_mat(k, q)`,
`soft_max_ext(kq, mask, kq_scale)`, `kqv = mul_mat(v, kq)`, all in f32 with an f32 KV cache.

Three forms of the same numbers, side by side:
- `attention`, one shot: the whole [H, T, S] score tensor at once, the form llama.cpp's graph traces (`kq`,
  `kq_soft_max`); the oracle of the others, and what runs when a trace keeps those tensors (`keeps_scores`).
- `attention_blocked`: query blocks against key blocks with an online softmax (the flash-attention recurrence),
  memory O(q_block x k_block x H) whatever S; key blocks the mask hides entirely are skipped (half the causal
  work). It differs from the one-shot form only in float summation order (float64: <= 1e-12).
- `attention_gathered`: a sparse selection's attention (DSA, CSA, QSA, k-pool) over each query's selected keys only,
  gathered: O(T x n) for n keys kept per query, whatever S. Under the mask that is 0 exactly at the selection it is
  the same numbers as the two dense forms, which stay its oracle (`SparseMask` carries both: float64 <= 1e-12).
`attend` picks one. None rounds anything to f16: llama.cpp's non-flash path keeps kq, the softmax and kqv in
f32 with an f32 cache, in llama.cpp mode too (that mode rounds only the inputs of weight matmuls, `Runtime`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ops.arrays import fused_op, known_all
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


BLOCK_ELEMS_DEVICE = 1 << 25   # attention_blocked on a device: a tile's scores at most (128 MiB in float32), so a
# prompt's queries are one block or a few (each block ~20 launches, mostly the host's time); the host keeps 256


def attention_blocked(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, kq_scale: float, *,
                      mask_fn=causal_mask, q_block: int | None = None, k_block: int = 512,
                      dtype=np.float32) -> np.ndarray:
    """q: [T, H, K], k: [S, Hkv, K], v: [S, Hkv, V], q_pos [T] -> [T, H, V]: `attention` with
    mask = mask_fn(q_pos, arange(S)), computed for one [Tb, Sb] tile of the mask at a time (q_block None: 256
    queries a block on the host, as many as BLOCK_ELEMS_DEVICE scores allow on a device).

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
    if dtype == np.float32 and mask_fn in (causal_mask, no_mask) and (kf := fused_op(q, "attention_causal")) \
            is not None and (o := kf(q, k, v, q_pos, kq_scale, mask_fn is causal_mask)) is not None:
        return o                                          # a GPU, a decode step: one launch (cuda/fused.py)
    g = H // Hkv
    if q_block is None:
        q_block = 256 if isinstance(q, np.ndarray) else max(256, BLOCK_ELEMS_DEVICE // (H * k_block))
    k_pos = np.arange(S, like=q_pos)                                             # (where q_pos lives)
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
            if known_all(mask == -np.inf):
                continue               # a tile the mask hides (on a device it is computed: exp(-inf) adds 0)
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


GATHER_ELEMS = 1 << 22      # numbers a gather holds at most (keys and values of one query block): 16 MiB in float32
# on a device: 256 MiB, a prefill's queries in a few blocks (DeepSeek-V4's 640 keys of 512: ~100 queries a block, ~13
# launches each; at GATHER_ELEMS ~6 queries, ~1100 launches a layer, the host's time, session 28)
GATHER_ELEMS_DEVICE = 1 << 26
# queries from which a selection naming as many slots as there are keys (e.g. DSA's top-k over a prompt no longer than
# it) attends masked-dense: gathering every key per query costs more than the blocked form over the same mask; a decode
# step (1 query: the fused gathered kernel on a GPU, a captured graph) keeps gathering
DENSE_FROM = 9


@dataclass(frozen=True)
class SparseMask:
    """A sparse attention's selection in both forms: the additive mask (the masked-dense oracle, read by tile as a
    `mask_fn`) and, per query, the key positions it keeps (the gathered form, `attention_gathered`).

    mask: [T, S] float32   0 where query row t attends key s (causal included), -inf elsewhere
    idx:  [T, n] int       per query its candidate key positions, each in 0 .. S - 1 (a dead slot: any of them)
    live: [T, n] bool      the slots the query attends: (t, idx[t, j]) over the live j is exactly the set where
                           mask[t] is 0, each position once (the selecting module makes it so; tests check it)
    q0:   the position of row 0 (the call's first query)
    gather: attend through idx (`attend`, when no trace keeps the scores); False: masked-dense, the oracle
    fixed: S is the cache's capacity (a fixed-shape run, `cache.Rows`): the attention reads its cache's whole buffer,
           the rows past the last position hidden by the mask (not live)
    """
    mask: np.ndarray
    idx: np.ndarray
    live: np.ndarray
    q0: int
    gather: bool = True
    fixed: bool = False

    def __call__(self, q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
        """[Tb], [Sb] -> the tile [Tb, Sb] of `mask`."""
        assert not isinstance(q_pos, np.ndarray) or (q_pos.min() >= self.q0 and k_pos.max() < self.mask.shape[1]), \
            (q_pos, k_pos, self.mask.shape)       # (checked on the host: on a device the check would read them back)
        return self.mask[np.ix_(q_pos - self.q0, k_pos)]

    def rows(self, q_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[T'] query positions -> their (idx, live) rows [T', n]; all of them for the call's T positions (no index:
        the positions may be on a device)."""
        if len(q_pos) == self.idx.shape[0]:
            return self.idx, self.live
        r = np.asarray(q_pos) - self.q0
        return self.idx[r], self.live[r]


def attention_gathered(q: np.ndarray, k: np.ndarray, v: np.ndarray, idx: np.ndarray, live: np.ndarray,
                       kq_scale: float, *, sinks: np.ndarray | None = None, q_block: int | None = None,
                       dtype=np.float32) -> np.ndarray:
    """q: [T, H, K], k: [S, Hkv, K], v: [S, Hkv, V], idx / live: [T, n] (`SparseMask`) -> [T, H, V]: each query
    attends its n gathered keys only, O(T x n) whatever S:

        x[t, h, j] = (q[t, h] . k[idx[t, j], h // g]) * kq_scale + (0 if live[t, j] else -inf)      g = H / Hkv
        out[t, h]  = softmax_j(x[t, h]) @ v[idx[t, j], h // g]

    `attention` under the mask that is 0 exactly at the live (t, idx[t, j]) (each once) up to float summation order.
    sinks [H]: learned per-head softmax sinks (DeepSeek-V4): the max runs over x and the sink, and exp(sink_h - max)
    joins the denominator only (ggml_soft_max_ext with sinks, as attention/compressed_kv.py's dense form).
    q_block: queries gathered at once (default: about GATHER_ELEMS gathered numbers, GATHER_ELEMS_DEVICE on a device;
    an argument for the tests)."""
    T, H, K = q.shape
    S, Hkv, _ = k.shape
    V, n = v.shape[-1], idx.shape[1]
    assert H % Hkv == 0, f"{H} query heads do not group evenly over {Hkv} KV heads"
    assert idx.shape == live.shape == (T, n) and v.shape[0] == S, (idx.shape, live.shape, k.shape, v.shape)
    assert not isinstance(idx, np.ndarray) or idx.size == 0 or (idx.min() >= 0 and idx.max() < S), \
        f"gather positions outside 0 .. {S - 1}"                                    # (checked on the host only)
    if dtype == np.float32 and (kf := fused_op(q, "attention_gathered")) is not None \
            and (o := kf(q, k, v, idx, live, kq_scale, sinks)) is not None:
        return o                                          # a GPU: one launch a decode step (cuda/fused.py)
    # (a GPU's eager prefill: the blocks below, each a gather and one batched product per key head)
    g = H // Hkv
    elems = GATHER_ELEMS if isinstance(q, np.ndarray) else GATHER_ELEMS_DEVICE
    qb_n = q_block or max(1, elems // max(1, n * Hkv * (K + V)))
    sink = None if sinks is None else sinks.astype(dtype, copy=False).reshape(Hkv, g, 1)    # [Hkv, g, 1]
    out = np.empty_like(q, shape=(T, Hkv, g, V), dtype=dtype)                   # (like q: where q lives)
    for t0 in range(0, T, qb_n):
        t1 = min(t0 + qb_n, T)
        ib = idx[t0:t1]                                                              # [Tb, n]
        qb = q[t0:t1].astype(dtype, copy=False).reshape(t1 - t0, Hkv, g, K)          # [Tb, Hkv, g, K]
        kg = k[ib].astype(dtype, copy=False).transpose(0, 2, 3, 1)                  # [Tb, n, Hkv, K] -> [Tb, Hkv, K, n]
        vg = v[ib].astype(dtype, copy=False).transpose(0, 2, 1, 3)                  # [Tb, n, Hkv, V] -> [Tb, Hkv, n, V]
        dead = np.where(live[t0:t1], dtype(0), dtype(-np.inf))[:, None, None, :]     # [Tb, 1, 1, n]
        x = (qb @ kg) * dtype(kq_scale) + dead                                       # [Tb, Hkv, g, n]
        if sink is None:
            p = softmax(x)                                                           # [Tb, Hkv, g, n]
        else:
            m = np.maximum(np.max(x, axis=-1, keepdims=True), sink)                  # the sink joins the max
            e = np.exp(x - m)                                                        # [Tb, Hkv, g, n]
            den = np.sum(e, axis=-1, keepdims=True, dtype=np.float64) + np.exp(sink - m)   # + exp(sink - max)
            p = (e * (1.0 / den)).astype(dtype)
        out[t0:t1] = p @ vg                                                          # [Tb, Hkv, g, V]
    return out.reshape(T, H, V)                                                      # [T, Hkv, g, V] -> [T, H, V]


def keeps_scores(rt, il: int) -> bool:
    """Whether the runtime's trace keeps layer il's [H, T, S] scores (`kq`, `kq_soft_max`): then the one-shot form
    runs (a compare or a golden of every tensor), else the blocked one."""
    return rt.keeps("kq", il) or rt.keeps("kq_soft_max", il)


def attend(q, k, v, q_pos, kq_scale: float, *, mask_fn=causal_mask, one_shot: bool = False, record=None,
           il: int = -1, dtype=np.float32) -> np.ndarray:
    """Softmax attention as the caller needs it: q [T, H, K], k [S, Hkv, K], v [S, Hkv, V], q_pos [T] -> [T, H, V].

    one_shot: `attention` over the whole mask_fn(q_pos, arange(S)) [T, S], tracing kq, kq_soft_max and kqv (pass
    `keeps_scores(rt, il)`); else, for a `SparseMask` that gathers, `attention_gathered` over its selection (unless
    it names as many slots as there are keys and the call has DENSE_FROM queries or more), and `attention_blocked`
    for any other mask_fn (the mask's own tiles), both tracing kqv [H, T, V] only."""
    if one_shot:
        mask = mask_fn(q_pos, np.arange(k.shape[0]))                             # [T, S]
        return attention(q, k, v, mask, kq_scale, record, il, dtype)
    if isinstance(mask_fn, SparseMask) and mask_fn.gather and \
            (q.shape[0] < DENSE_FROM or mask_fn.idx.shape[1] < k.shape[0]):
        o = attention_gathered(q, k, v, *mask_fn.rows(q_pos), kq_scale, dtype=dtype)   # [T, H, V]
    else:
        o = attention_blocked(q, k, v, q_pos, kq_scale, mask_fn=mask_fn, dtype=dtype)  # [T, H, V]
    if record is not None:
        record("kqv", il, o.transpose(1, 0, 2))                                  # [H, T, V]
    return o


def no_mask(q_pos: np.ndarray, k_pos: np.ndarray) -> np.ndarray:
    """[T], [S] -> [T, S] zeros: every key visible (non-causal attention)."""
    return np.zeros((q_pos.size, k_pos.size), dtype=np.float32)
