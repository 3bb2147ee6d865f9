"""The DSA lightning indexer (DeepSeek-V3.2, GLM-5): which earlier keys each query may attend to.

Legend: T new tokens, S cached positions (including the new ones), D model dim, Dq q-LoRA rank,
Hi indexer heads, di indexer head dim, R rope dims, k = attention.indexer.top_k.

A small multi-head scorer in front of MLA (DeepSeek-V3.2-Exp report, "lightning indexer"). Every head of
a query scores one shared key per position with a ReLU dot product; a per-token, per-head weight mixes
the heads; each query keeps its k best keys (llama.cpp `src/models/deepseek32.cpp:226-323`):

    iq   = qr @ Wiq_b.T                       qr: MLA's normed q-LoRA latent    [T, Hi*di] -> [T, Hi, di]
    iq   = rope(iq[..., :R])                  the FIRST R dims ("[rope | nope]"), NEOX (deepseek32) or NORM
                                              (glm-dsa), the context's YaRN parameters          :231-236
    ik   = layer_norm(h @ Wik.T) * k_norm + k_norm_b                             [T, di]      :238-242
    ik   = rope(ik[..., :R])                                                     [T, di]      :244-248
    iq, ik = iq @ Hd, ik @ Hd                 Walsh-Hadamard, orthonormal and symmetric        :251-255
    iw   = (h @ Wproj.T) / sqrt(di * Hi)                                         [T, Hi]      :263-276
    score[t, s] = sum_h relu(iq[t, h] . ik[s]) * iw[t, h] + causal[t, s]        [T, S]       :278-282
    sel[t]      = the min(k, n_kv) positions with the largest score[t]           [T, k]       :319-321
    mask[t, s]  = (0 if s in sel[t] else -inf) + causal[t, s]                    [T, S]
                  (build_attn for DSA, src/llama-graph.cpp:3067-3094: fill -inf, set_rows 0 at sel, add the causal mask)

The Hadamard product changes nothing the indexer computes: (iq Hd) . (ik Hd) = iq . ik because Hd Hd^T = I.
llama.cpp applies it to every DSA indexer cache (src/llama-kv-cache.cpp:326-331, so that a quantized cache
rounds rotated values); it is done here too so that `indexer_q` / `indexer_k` and the cache hold llama.cpp's
numbers (`rotate=False` skips it; the scores are the same up to float rounding).
When S <= k every visible key is kept and DSA is exactly dense causal MLA: `top_k` may then name masked
positions too (llama.cpp picks among -inf scores arbitrarily), which the causal mask re-masks.

Only the indexer keys are cached (`refengine.cache.IndexerKeys`, llama.cpp's "lid" cache): queries and
weights belong to the new tokens. The exact reference runs the whole op in float32 as llama.cpp's CPU
`ggml_lightning_indexer` (ops.cpp:12355-12438, fused by default: `cparams.fused_lid`, llama-context.cpp:237).
"""
from __future__ import annotations

import functools

from dataclasses import dataclass

import numpy as np

from ..cache import IndexerKeys
from ..config import ROPE_NEOX, ROPE_NORM
from ..errors import ConfigError
from ..ops import apply_rope, layer_norm
from ..weights import W
from .mha import causal_mask


@dataclass(frozen=True)
class IndexerConfig:
    n_head: int          # attention.indexer.head_count                                     Hi
    head_dim: int        # attention.indexer.key_length                                     di
    top_k: int           # attention.indexer.top_k                                          k
    n_rot: int           # rope.dimension_count: the first R dims of each head are rotated  R
    rope_mode: int       # fixed by the arch's graph: ROPE_NEOX (deepseek32) or ROPE_NORM (glm-dsa)
    k_norm_eps: float    # the key LayerNorm's eps: fixed by the arch (deepseek32 1e-6; glm-dsa 0, see its config)
    full: bool = True    # attention.indexer.types[il]: True = this layer runs its own indexer; False = it
                         # reuses the selection of layer `source` (glm-dsa's shared layers, no indexer cache)
    source: int = -1     # the layer whose selection this one uses (itself when full)


def check_head_dim(path: str, ic: IndexerConfig) -> None:
    """What llama.cpp's graph needs of the indexer shapes (a clear error instead of a ggml abort)."""
    di = ic.head_dim
    if ic.n_rot > di:      # deepseek32.cpp:180 GGML_ASSERT(n_rot <= n_embd_indexer_head)
        raise ConfigError(f"{path}: rope.dimension_count = {ic.n_rot} exceeds attention.indexer.key_length = {di}")
    # The Hadamard matrix is the largest power of two >= 64 that divides di (llama_kv_cache::build_input_k_rot,
    # llama-kv-cache.cpp:1447-1465); ggml_mul_mat by it needs exactly di columns.
    if di < 64 or di & (di - 1):
        raise ConfigError(f"{path}: attention.indexer.key_length = {di}: llama.cpp's indexer Hadamard rotation "
                          f"needs a power of two >= 64")


def indexer_configs(r, *, n_rot: int, rope_mode: int, k_norm_eps: float, full: list[bool]) -> list[IndexerConfig]:
    """One IndexerConfig per trunk layer from attention.indexer.head_count / key_length / top_k (all required,
    deepseek32.cpp:27-29) and the arch's per-layer `full` list (deepseek32: all True; glm-dsa: its types rule).
    A shared layer's `source` is the most recent full layer before it (glm-dsa.cpp:243-245, :361-365)."""
    path = r.gf.path
    Hi = int(r.get("attention.indexer.head_count", required=True))
    di = int(r.get("attention.indexer.key_length", required=True))
    k = int(r.get("attention.indexer.top_k", required=True))
    if Hi <= 0 or k <= 0:
        raise ConfigError(f"{path}: attention.indexer.head_count = {Hi}, top_k = {k} must be positive")
    if full and not full[0]:
        raise ConfigError(f"{path}: {r._k('attention.indexer.types')}: layer 0 is shared but no earlier layer "
                          f"runs an indexer (llama.cpp asserts the same)")
    out, last = [], -1
    for il, f in enumerate(full):
        last = il if f else last
        out.append(IndexerConfig(n_head=Hi, head_dim=di, top_k=k, n_rot=n_rot, rope_mode=rope_mode,
                                 k_norm_eps=float(k_norm_eps), full=bool(f), source=last))
    check_head_dim(path, out[0])
    return out


# ---------------------------------------------------------------- tensors

def indexer_table(il: int, ic: IndexerConfig, *, q_lora_rank: int) -> list[W]:
    """The indexer tensors (deepseek32.cpp:109-114; glm-dsa.cpp:143-148 makes all five optional, and a shared
    layer never reads them: required here only where the layer runs its indexer). NumPy order shapes.
    q_lora_rank: the MLA query's latent width Dq (the indexer's query reads that latent)."""
    p, req = f"blk.{il}.indexer.", ic.full
    Hi, di = ic.n_head, ic.head_dim
    return [W("indexer_k_norm", p + "k_norm.weight", lambda c, s: (di,), required=req, dense=True),
            W("indexer_k_norm_b", p + "k_norm.bias", lambda c, s: (di,), required=req, dense=True),
            W("indexer_proj", p + "proj.weight", lambda c, s: (Hi, c.n_embd), required=req),          # ne {D, Hi}
            W("indexer_attn_k", p + "attn_k.weight", lambda c, s: (di, c.n_embd), required=req),      # ne {D, di}
            W("indexer_attn_q_b", p + "attn_q_b.weight",
              lambda c, s: (Hi * di, q_lora_rank), required=req)]                                     # ne {Dq, Hi*di}


def new_state(ic: IndexerConfig, dtype=np.float32) -> IndexerKeys | None:
    """The indexer key cache of a layer that runs its own indexer; None for a shared layer (llama-model.cpp:2431)."""
    return IndexerKeys(dtype) if ic.full else None


# ---------------------------------------------------------------- math

@functools.lru_cache(maxsize=8)
def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix [n, n] (Sylvester order, entries +-1/sqrt(n); symmetric, Hd @ Hd = I),
    built like llama.cpp's `ggml_gen_hadamard` (llama-kv-cache.cpp:21-57). Made once per n and read-only (a
    constant: a device keeps one copy of it)."""
    assert n >= 1 and n & (n - 1) == 0, f"Hadamard size {n} is not a power of two"
    h = np.full((1, 1), np.float32(1.0) / np.sqrt(np.float32(n)), dtype=np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    h.flags.writeable = False
    return h


@dataclass
class Selection:
    """One indexer run: what each new query may attend to."""
    top_k: np.ndarray    # [T, min(k, S)] int  positions of the largest scores (masked ones last)  `top_k`
    mask: np.ndarray     # [T, S] float32      0 where selected and causal, -inf elsewhere (MLA's mask)
    score: np.ndarray    # [T, S] float32      indexer scores with the causal mask added            `indexer_score`


def index_queries(qr, w, *, ic: IndexerConfig, cos, sin, rt, il, rotate=True) -> np.ndarray:
    """qr [T, Dq] (MLA's normed q-LoRA latent) -> iq [T, Hi, di], roped (first R dims) and rotated."""
    T = qr.shape[0]
    iq = rt.matmul(qr, w.indexer_attn_q_b)                                         # [T, Hi*di]
    rt.record("indexer_q", il, iq)
    iq = iq.reshape(T, ic.n_head, ic.head_dim)                                     # [T, Hi*di] -> [T, Hi, di]
    iq = apply_rope(iq, cos, sin, ic.n_rot, ic.rope_mode)                          # [T, Hi, di]
    rt.record("indexer_q", il, iq)
    if rotate:
        iq = iq @ hadamard(ic.head_dim)                                            # [T, Hi, di]
        rt.record("indexer_q", il, iq)
    return iq


def index_keys(h, w, *, ic: IndexerConfig, cos, sin, rt, il, rotate=True) -> np.ndarray:
    """h [T, D] (attn_norm output) -> ik [T, di]: projected, LayerNormed, roped (first R dims), rotated."""
    ik = rt.matmul(h, w.indexer_attn_k)                                            # [T, di]
    rt.record("indexer_k", il, ik)
    ik = layer_norm(ik, w.indexer_k_norm, w.indexer_k_norm_b, ic.k_norm_eps)       # [T, di]
    rt.record("indexer_k", il, ik)
    ik = apply_rope(ik[:, None, :], cos, sin, ic.n_rot, ic.rope_mode)              # [T, 1, di]
    rt.record("indexer_k", il, ik)
    if rotate:
        ik = ik @ hadamard(ic.head_dim)                                            # [T, 1, di]
        rt.record("indexer_k", il, ik)
    return ik[:, 0, :]


def index_weights(h, w, *, ic: IndexerConfig, rt, il) -> np.ndarray:
    """h [T, D] -> iw [T, Hi]: the per-token head weights, pre-scaled by 1/sqrt(di * Hi) (deepseek32.cpp:274-276)."""
    iw = rt.matmul(h, w.indexer_proj)                                              # [T, Hi]
    rt.record("indexer_weights", il, iw)
    iw = iw * (np.float32(1.0) / np.sqrt(np.float32(ic.head_dim * ic.n_head)))
    rt.record("indexer_weights", il, iw)
    return iw


def index_scores(iq, ik, iw, mask, k_block: int = 2048) -> np.ndarray:
    """iq [T, Hi, di], ik [S, di], iw [T, Hi], mask [T, S] -> score [T, S] = sum_h relu(iq.ik) * iw + mask.

    Computed k_block keys at a time, so the per-head products [T, Hi, k_block] stay bounded whatever S."""
    T, Hi, di = iq.shape
    S = ik.shape[0]
    assert ik.shape[1] == di and iw.shape == (T, Hi) and mask.shape == (T, S), (iq.shape, ik.shape, iw.shape)
    score = np.empty_like(iq, shape=(T, S), dtype=np.float32)
    q2 = iq.reshape(T * Hi, di)                                                    # [T, Hi, di] -> [T*Hi, di]
    for s0 in range(0, S, k_block):
        s1 = min(s0 + k_block, S)
        qk = (q2 @ ik[s0:s1].T).reshape(T, Hi, s1 - s0)                            # [T, Hi, Sb]
        score[:, s0:s1] = np.einsum("ths,th->ts", np.maximum(qk, np.float32(0.0)), iw, dtype=np.float32)   # [T, Sb]
    return score + mask


def top_k_positions(score: np.ndarray, n: int) -> np.ndarray:
    """score [T, S] -> [T, n]: np.argsort(-score, kind="stable")[:, :n] (the n largest, ties: earlier position
    first), without sorting whole rows: a row's candidates are the scores >= its n-th largest (np.partition);
    where that is exactly n of them (no tie at the boundary, some finite) only those n are sorted, other rows
    (ties at the boundary, fewer than n finite scores) take the full stable sort. A device array's rows are
    sorted whole: the candidates' count per row would be read back to size the arrays."""
    T, S = score.shape
    if n >= S:
        return np.argsort(-score, axis=-1, kind="stable")                            # [T, S]
    if not isinstance(score, np.ndarray):      # on a device: whole rows sorted (the same order), no count read back
        return np.argsort(-score, axis=-1, kind="stable")[:, :n]                     # [T, n]
    thr = np.partition(score, S - n, axis=-1)[:, S - n:S - n + 1]                    # [T, 1] the n-th largest
    cand = score >= thr                                                              # [T, S]
    exact = (cand.sum(axis=-1) == n) & np.isfinite(thr[:, 0])                        # [T]
    order = np.empty((T, n), dtype=np.int64)
    rows = np.flatnonzero(exact)
    pos = np.nonzero(cand[rows])[1].reshape(rows.size, n)                           # [r, n] ascending positions
    sub = np.argsort(-np.take_along_axis(score[rows], pos, axis=-1), axis=-1, kind="stable")   # [r, n]
    order[rows] = np.take_along_axis(pos, sub, axis=-1)
    rest = np.flatnonzero(~exact)
    order[rest] = np.argsort(-score[rest], axis=-1, kind="stable")[:, :n]
    return order


def select_top_k(score: np.ndarray, k: int, fixed: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """score [T, S] (masked) -> (top_k [T, n] int, mask [T, S]) with n = min(k, S).

    top_k: per query the positions of the n largest scores (ties: the earlier position first; -inf last).
    mask: 0 at the selected positions, -inf elsewhere; the caller adds the causal mask back.
    fixed: S is a cache's capacity (a fixed-shape run, `cache.Rows`): every row is sorted whole (np.argsort, stable:
    the order `top_k_positions` gives, without its shapes that depend on the data). The rows past the last position
    score -inf (the causal mask) and sort last: they are picked only where fewer than k positions are visible, and
    the causal mask hides them again (as the masked positions llama.cpp may pick there).
    """
    T, S = score.shape
    n = min(k, S)
    order = np.argsort(-score, axis=-1, kind="stable")[:, :n] if fixed else top_k_positions(score, n)   # [T, n]
    mask = np.full_like(score, -np.inf, dtype=np.float32)                           # [T, S] (where score lives)
    np.put_along_axis(mask, order, np.float32(0.0), axis=-1)
    return order, mask


def lightning_indexer(h, qr, w, *, ic: IndexerConfig, state: IndexerKeys, cos, sin, rt, il,
                      rotate: bool = True, pos=None) -> Selection:
    """One layer's indexer: h [T, D] (attn_norm output), qr [T, Dq] -> Selection over the S cached positions.

    state: this layer's IndexerKeys; its length before the call is the first new position.
    cos, sin: [T, R/2], the same rope parameters as MLA's rope part.
    pos: the T positions (`step.pos`, on the device in a resident run); None: state.n + 0..T-1.
    A run with fixed shapes (`rt.fixed_shapes`) scores the key cache's capacity (S = the capacity, the rows past the
    last position zeros under the causal mask) and selects with `select_top_k(fixed=True)`.
    """
    T = h.shape[0]
    assert qr.shape[0] == T and cos.shape == (T, ic.n_rot // 2), (qr.shape, cos.shape)
    q_pos = state.n + np.arange(T) if pos is None else pos                         # [T]
    iq = index_queries(qr, w, ic=ic, cos=cos, sin=sin, rt=rt, il=il, rotate=rotate)    # [T, Hi, di]
    ik = index_keys(h, w, ic=ic, cos=cos, sin=sin, rt=rt, il=il, rotate=rotate)        # [T, di]
    ik_all = state.append(ik, rt.fixed_shapes)                                     # [S, di]
    iw = index_weights(h, w, ic=ic, rt=rt, il=il)                                  # [T, Hi]
    causal = causal_mask(q_pos, np.arange(ik_all.shape[0], like=q_pos))           # [T, S]
    score = index_scores(iq, ik_all, iw, causal)                                   # [T, S]
    rt.record("indexer_score", il, score)
    top_k, sel_mask = select_top_k(score, ic.top_k, rt.fixed_shapes)               # [T, n], [T, S]
    rt.record("top_k", il, lambda: top_k.astype(np.int32))
    return Selection(top_k=top_k, mask=(sel_mask + causal).astype(np.float32), score=score)


ROPE_MODES = {ROPE_NEOX: "NEOX", ROPE_NORM: "NORM"}
