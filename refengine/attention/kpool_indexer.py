"""The k-pool DSA indexer (GLM-5.3-Flash, `glm5-next`): the lightning indexer scoring pools of keys, not keys.

Legend: T new tokens, S cached positions (including the new ones), D model dim, Dq q-LoRA rank, Hi indexer
heads, di indexer head dim, kp = attention.indexer.kpool (positions per pool), P finished pools,
k = attention.indexer.top_k (in positions: k / kp pools).

The DSA indexer of attention/dsa_indexer.py scores one key per position; this one first pools every `kp`
consecutive positions (from the sequence's first) into one key, with a softmax gate per dimension over the
pool's members and a learned positional term `ape`, then scores the pools (llama.cpp
`src/models/glm5-next.cpp:766-919`, build_kpool_select; the pool layout `src/llama-memory-hybrid-idx.cpp:787-809`,
its inputs :1086-1283):

    iq   = qr @ Wiq_b.T                                    no rope, no Hadamard       [T, Hi, di]  indexer_q
    ik   = layer_norm(h @ Wik.T) * k_norm + k_norm_b        eps: the arch's            [T, di]      indexer_k
    ig   = h @ W_gate.T                                    indexer_compressor_gate    [T, di]      indexer_gate
    pooled[p, d] = sum_j softmax_j(ig[p*kp + j, d] + ape[j, d]) * ik[p*kp + j, d]     [P, di]      indexer_pool_k
    iw   = (h @ Wproj.T) / sqrt(di * Hi)                                               [T, Hi]      indexer_weights
    score[t, p] = sum_h relu(iq[t, h] . pooled[p]) * iw[t, h]
                  + (0 if pool p ends at or before t's position else -inf)             [T, P]      indexer_score
    top[t]      = the min(P_visible, k / kp) visible pools of largest score            [T, k/kp]   indexer_top_k
    attended[t] = the members of top[t], plus (kpool_select_tail) the positions of t's own unfinished
                  pool up to t: p - j for j < (p - pos0 + 1) % kp; as an additive mask with the causal
                  one                                                                  [T, S]      indexer_sel

A query whose own pool is finished (p + 1 a multiple of kp) has no tail: it sees itself only when its pool is
among the top ones (llama.cpp's rule, measured: position 63 of a 64-token prompt, kp 4, attends 28-31, 56-59).

A pool's key is computed once, when its last member arrives, and kept: the state carries the pooled keys and
the key / gate rows of the pool being filled (`KPoolKeys`). A layer of `attention.indexer.types` 0 (shared)
runs no indexer and attends with the selection of the most recent full layer (glm5-next.cpp:956-964).
The score op is llama.cpp's fused `ggml_lightning_indexer` (or its unfused twin): float32, as `index_scores`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache import KPoolKeys
from ..errors import ConfigError
from ..ops import contiguous, layer_norm
from ..ops.softmax import softmax
from ..ops.top_k import ggml_top_k
from ..weights import W
from . import mla
from .dsa_indexer import index_scores, index_weights
from .mha import SparseMask

GATHER_MAX_UB = 16      # glm5-next.cpp:326 (build_inp_kpool): calls of up to 16 tokens may attend gathered latents


@dataclass(frozen=True)
class KPoolConfig:
    n_head: int          # attention.indexer.head_count                                          Hi
    head_dim: int        # attention.indexer.key_length                                          di
    top_k: int           # attention.indexer.top_k, in positions (k / kp pools are kept)         k
    kpool: int           # attention.indexer.kpool: positions per pool (> 1, divides top_k)      kp
    select_tail: bool    # attention.indexer.kpool_select_tail: also attend the unfinished pool's positions
    k_norm_eps: float    # the key LayerNorm's eps (glm5-next: attention.layer_norm_epsilon, 0 when absent)
    full: bool = True    # attention.indexer.types[il]: True = this layer runs its own indexer
    source: int = -1     # the layer whose selection this one uses (itself when full)

    @property
    def n_top(self) -> int:
        """Pools kept per query (at most)."""
        return self.top_k // self.kpool


# ---------------------------------------------------------------- tensors

def table(il: int, kc: KPoolConfig, *, q_lora_rank: int) -> list[W]:
    """The indexer's tensors (glm5-next.cpp:140-155): required where the layer runs its indexer, optional
    (TENSOR_NOT_REQUIRED, and never read) in a shared layer. NumPy order shapes."""
    p, req = f"blk.{il}.", kc.full
    Hi, di, kp = kc.n_head, kc.head_dim, kc.kpool
    return [W("indexer_k_norm", p + "indexer.k_norm.weight", lambda c, s: (di,), required=req, dense=True),
            W("indexer_k_norm_b", p + "indexer.k_norm.bias", lambda c, s: (di,), required=req, dense=True),
            W("indexer_proj", p + "indexer.proj.weight", lambda c, s: (Hi, c.n_embd), required=req),       # ne {D, Hi}
            W("indexer_attn_k", p + "indexer.attn_k.weight", lambda c, s: (di, c.n_embd), required=req),   # ne {D, di}
            W("indexer_attn_q_b", p + "indexer.attn_q_b.weight",
              lambda c, s: (Hi * di, q_lora_rank), required=req),                                 # ne {Dq, Hi*di}
            W("indexer_kpool_gate", p + "indexer_compressor_gate.weight",
              lambda c, s: (di, c.n_embd), required=req),                                                  # ne {D, di}
            # ne {di, kp}: added to the gate scores (ggml_add), a small table read whole: kept in float
            W("indexer_kpool_ape", p + "indexer_compressor_ape.weight", lambda c, s: (kp, di), required=req,
              dense=True)]


def new_state(kc: KPoolConfig) -> KPoolKeys | None:
    """The pooled keys and the pool being filled of a layer that runs its indexer; None for a shared layer."""
    return KPoolKeys() if kc.full else None


# ---------------------------------------------------------------- math

def pool(ik: np.ndarray, ig: np.ndarray, ape: np.ndarray) -> np.ndarray:
    """Finished pools' rows -> their keys: ik, ig [P, kp, di], ape [kp, di] -> [P, di]
    (softmax over the pool's members, per dimension; glm5-next.cpp:806-814)."""
    probs = softmax((ig + ape[None]).transpose(0, 2, 1), axis=-1)                 # [P, di, kp]
    return np.sum(probs * ik.transpose(0, 2, 1), axis=-1, dtype=np.float32)       # [P, di]


def pool_keys(ik: np.ndarray, ig: np.ndarray, w, *, kc: KPoolConfig, state: KPoolKeys, rt, il) -> np.ndarray:
    """Append the new positions' key / gate rows [T, di]; pool every pool they finish. Returns every finished
    pool's key [P, di] (the state's, after the append)."""
    kp = kc.kpool
    rows_k = ik if state.fill_k is None else np.concatenate([state.fill_k, ik])  # [m + T, di]
    rows_g = ig if state.fill_g is None else np.concatenate([state.fill_g, ig])
    n_done = rows_k.shape[0] // kp
    if n_done:
        new = pool(rows_k[:n_done * kp].reshape(n_done, kp, -1), rows_g[:n_done * kp].reshape(n_done, kp, -1),
                   np.asarray(w.indexer_kpool_ape, np.float32))                   # [n_done, di]
        rt.record("indexer_pool_k_new", il, new)
        state.pooled.append(new)
    state.fill_k, state.fill_g = rows_k[n_done * kp:], rows_g[n_done * kp:]
    state.n += ik.shape[0]
    pooled = state.pooled.view()
    return np.zeros((0, ik.shape[1]), np.float32) if pooled is None else pooled


@dataclass
class PoolSelection:
    """One indexer run: which pools, and so which positions, each new query attends."""
    top: np.ndarray      # [T, n] int   pools by descending score, the visible ones first (n = min(k/kp, P))
    mask: np.ndarray     # [T, S] float32   0 at the attended positions (causal), -inf elsewhere
    score: np.ndarray    # [T, P] float32   pool scores, -inf for pools not finished by the query
    slots: np.ndarray    # [T, n_sel] int   llama.cpp's selection slots as positions: kp per chosen pool in its
                         #                  order, then kp - 1 tail slots (dead slots: the call's first position)
    live: np.ndarray     # [T, n_sel] bool  the slots attended (visible pools, real tail positions)


def n_pool_padded(P: int) -> int:
    """The pool axis llama.cpp scores over: P + 1 rounded up to 64, at least 64 (`kpool_pad`,
    llama-memory-hybrid-idx.cpp:706-708); the padded pools score -inf."""
    return max(64, -(-(P + 1) // 64) * 64)


def select(score: np.ndarray, q_pos: np.ndarray, S: int, kc: KPoolConfig):
    """score [T, P] (masked), q_pos [T] -> (top pools [T, n], attention mask [T, S], slots [T, n_sel],
    live [T, n_sel]), n = min(k/kp, P).

    The set is llama.cpp's: `ggml_top_k` over its padded pool axis picks min(n_pool_padded, k/kp) pools, tied
    scores resolved as its CPU op does (ops/top_k.py: exact ties are common, a pool every head scores below zero
    scores 0), then `ggml_argsort` orders them by descending score (std::sort: an insertion sort, stable, for up to
    16 pools; beyond, equal scores may come in another order: the gather form's slot order only, not the set); the
    pools among them the query may see (finite score) are attended. `top` lists those first, then the other
    pools by descending score. Without a tie at the k-th score the set is the k largest whichever way it is found
    (a stable sort, faster than the heap's steps). `slots` / `live`: the cells llama.cpp's gather form reads (glm5-next.cpp:871-878,
    llama-memory-hybrid-idx.cpp:1180-1283: a padded pool and a missing tail cell read the call's first cell)."""
    score, q_pos = np.asarray(score), np.asarray(q_pos)   # a device's scores read back once: the rule runs per row
    T, P = score.shape                                    # on the host (each row's test read back a sync apiece)
    kp = kc.kpool
    n_pad = n_pool_padded(P)
    n, n_top = min(kc.n_top, P), min(kc.n_top, n_pad)
    n_tail_slots = kp - 1 if kc.select_tail else 0
    dummy = int(q_pos[0])
    row = np.full(n_pad, -np.inf, dtype=np.float32)
    top = np.zeros((T, n), dtype=np.int64)
    mask = np.full((T, S), -np.inf, dtype=np.float32)                             # [T, S]
    slots = np.full((T, n_top * kp + n_tail_slots), dummy, dtype=np.int64)      # [T, n_sel]
    live = np.zeros(slots.shape, dtype=bool)
    exact_order = T <= GATHER_MAX_UB          # the slots' order matters only where the gather form reads them
    members = np.arange(kp)                   # a pool's positions from its first
    for t in range(T):
        row[:P] = score[t]
        srt = None if exact_order else np.argsort(-row, kind="stable")
        if srt is not None and (n_top >= n_pad or not np.isfinite(row[srt[n_top - 1]])
                                or row[srt[n_top - 1]] > row[srt[n_top]]):
            order = [int(i) for i in srt[:n_top]]                                  # no tie at the k-th score: one set
        else:
            order = sorted(ggml_top_k(row, n_top), key=lambda i: -row[i])         # stable: argsort after top_k
        fin = np.isfinite(row)
        chosen = [i for i in order if i < P and fin[i]]                           # visible: first in the order
        kept = set(chosen)
        rest = [int(i) for i in np.argsort(-score[t], kind="stable") if int(i) not in kept]
        top[t] = (chosen + rest)[:n]
        o = np.asarray(order, dtype=np.int64)
        j = np.flatnonzero(o < P)                                                 # the order's real pools
        slots[t, (j[:, None] * kp + members).ravel()] = (o[j][:, None] * kp + members).ravel()
        live[t, :len(chosen) * kp] = True
        c = np.asarray(chosen, dtype=np.int64)                                    # finished pools the query keeps
        mask[t, (c[:, None] * kp + members).ravel()] = 0.0
        if kc.select_tail:
            p = int(q_pos[t])
            n_tail = (p + 1) % kp                                                 # positions from pos0 = 0
            mask[t, p - n_tail + 1:p + 1] = 0.0
            for j in range(n_tail):
                slots[t, n_top * kp + j], live[t, n_top * kp + j] = p - j, True
    return top, mask, slots, live


def kpool_indexer(h, qr, w, *, kc: KPoolConfig, state: KPoolKeys, rt, il) -> PoolSelection:
    """One layer's indexer: h [T, D] (attn_norm output), qr [T, Dq] (MLA's normed q-LoRA latent) -> the
    selection over the S = state.n + T positions. `state` is updated in place."""
    T, Hi, di = h.shape[0], kc.n_head, kc.head_dim
    q_pos = state.n + np.arange(T)                                                # [T]
    iq = rt.matmul(qr, w.indexer_attn_q_b).reshape(T, Hi, di)                     # [T, Hi*di] -> [T, Hi, di]
    rt.record("indexer_q", il, iq)
    ik = layer_norm(rt.matmul(h, w.indexer_attn_k), w.indexer_k_norm, w.indexer_k_norm_b, kc.k_norm_eps)   # [T, di]
    rt.record("indexer_k", il, ik)
    ig = rt.matmul(h, w.indexer_kpool_gate)                                       # [T, di]
    rt.record("indexer_gate", il, ig)
    pooled = pool_keys(ik, ig, w, kc=kc, state=state, rt=rt, il=il)               # [P, di]
    rt.record("indexer_pool_k", il, pooled[:, None, :])                           # [P, 1, di]
    iw = index_weights(h, w, ic=kc, rt=rt, il=il)                                 # [T, Hi]
    P = pooled.shape[0]
    ends = (np.arange(P) + 1) * kc.kpool - 1                                      # [P] each pool's last position
    visible = np.where(ends[None, :] <= q_pos[:, None], np.float32(0.0), np.float32(-np.inf))   # [T, P]
    score = index_scores(iq, pooled, iw, visible.astype(np.float32))              # [T, P]
    rt.record("indexer_score", il, score)
    S = state.n
    top, mask, slots, live = select(score, q_pos, S, kc)
    rt.record("indexer_top_k", il, lambda: top.astype(np.int32))
    causal = np.where(np.arange(S)[None, :] <= q_pos[:, None], np.float32(0.0), np.float32(-np.inf))
    mask = (mask + causal).astype(np.float32)                                     # [T, S]
    rt.record("indexer_sel", il, mask)
    return PoolSelection(top=top, mask=mask, score=score, slots=slots, live=live)


# ---------------------------------------------------------------- the layer: MLA under the pooled selection

def selection_key(il: int) -> tuple[str, int]:
    return ("kpool_selection", il)


def sparse_mask(sel: PoolSelection, q0: int, gather: bool = True) -> SparseMask:
    """The selection as MLA's mask, both forms: query row t (position q0 + t) attends its live slots (the chosen
    pools' members and its tail, each position once, all causal: `select`), which are where sel.mask is 0."""
    return SparseMask(mask=sel.mask, idx=sel.slots, live=sel.live, q0=q0, gather=gather)


def sparse_mla(h, w, *, mc, kc: KPoolConfig, il: int, state, rt, step, names=None,
               gather: bool = True) -> np.ndarray:
    """Nope-only MLA attending the positions the k-pool indexer keeps (glm5-next.cpp:923-1013, build_dsa_layer):
    h [T, D] (attn_norm output) -> attn_output's input projected [T, D]. state: a `DSAState` (the MLA cache of
    its form; `KPoolKeys` where the layer runs its indexer). step: the forward call's Step, which carries the
    selection from a full layer to the shared layers after it. names: MLA's trace names the graph changes.

    llama.cpp runs one of two forms of the same attention (glm5-next.cpp:970-1007): calls of up to 16 tokens whose
    cache is longer than the selection gather the selected latents (`gathered_mla`); others attend the whole cache
    under the selection mask (`mla.mla` with `mask_fn`). The absorbed form runs llama.cpp's choice; the naive
    form (per-head keys, no latent to gather) always the masked one. The masked one attends, unless a trace keeps
    its scores (`kq`, `kq_soft_max` [H, T, S]), each query's slots gathered (`sparse_mask`; gather=False: the
    masked-dense oracle): the same numbers, O(T x k)."""
    T = h.shape[0]
    qr = mla.project_q_a(h, w, mc=mc, rt=rt, il=il, name="q_resid")                  # [T, Dq]
    if kc.full:
        sel = step.memo(selection_key(il), lambda: kpool_indexer(h, qr, w, kc=kc, state=state.index, rt=rt, il=il))
    else:
        def missing():
            raise ConfigError(f"layer {il} shares the indexer of layer {kc.source}, which has not run in this step")
        sel = step.memo(selection_key(kc.source), missing)
    S = state.n + T
    assert sel.mask.shape == (T, S), f"layer {il}: selection mask {sel.mask.shape}, expected {(T, S)}"
    if state.kv.form == "absorbed" and gathers(T, S, sel.slots.shape[1]):
        return gathered_mla(h, qr, w, mc=mc, kc=kc, sel=sel, state=state.kv, rt=rt, il=il, names=names)
    rt.record("kq_mask_dsa", il, sel.mask)                                        # [T, S]
    return mla.mla(h, w, mc=mc, il=il, state=state.kv, cos=None, sin=None, rt=rt,
                   mask_fn=sparse_mask(sel, S - T, gather), qr=qr, names=names)


def gathers(T: int, S: int, n_sel: int) -> bool:
    """Whether llama.cpp attends through its gather form for this call: T <= 16 and its n_kv (the cache's cells,
    padded to 256: llama_kv_cache::get_n_kv, assuming a context of at least that) above the slots n_sel."""
    return T <= GATHER_MAX_UB and max(256, -(-S // 256) * 256) > n_sel


def gathered_mla(h, qr, w, *, mc, kc: KPoolConfig, sel: PoolSelection, state, rt, il, names=None) -> np.ndarray:
    """The gather form (glm5-next.cpp:971-996): per query the latents of its selection slots (`sel.slots`, dead
    slots masked), softmax over them, the heads' values and the output projection. h [T, D], qr [T, Dq] -> [T, D].
    state: the layer's LatentKV (the new latents appended)."""
    T, H = h.shape[0], mc.n_head
    q = mla.project_q(h, w, mc=mc, rt=rt, il=il, qr=qr)                          # [T, H, dn]
    c, _ = mla.project_kv_a(h, w, mc=mc, cos=None, sin=None, rt=rt, il=il)        # [T, C]
    q_abs = mla.absorb_query(q.transpose(1, 0, 2), w, mc=mc, rt=rt)              # [H, T, C]
    rt.record("q_absorbed", il, q_abs.transpose(1, 0, 2))                         # [T, H, C]
    c_all, _ = state.append(c, np.zeros_like(c, shape=(T, 0)))                      # [S, C]
    if kc.full:
        rt.record("indexer_sel_idx", il, lambda: sel.slots.astype(np.int32))             # [T, n_sel]
    kv = c_all[sel.slots]                                                         # [T, n_sel, C]
    rt.record("kv_gathered", il, kv)
    kq = np.einsum("htc,tsc->ths", q_abs, kv, dtype=np.float32)                  # [T, H, n_sel]
    dead = np.where(sel.live, np.float32(0.0), np.float32(-np.inf))[:, None, :]  # [T, 1, n_sel]
    p = softmax(kq * np.float32(mc.kq_scale) + dead, axis=-1)                    # [T, H, n_sel]
    rt.record("kq_soft_max_gathered", il, p)
    o = np.einsum("ths,tsc->htc", p, kv, dtype=np.float32)                       # [H, T, C]
    o = mla.expand_values(o, w, mc=mc, rt=rt).transpose(1, 0, 2)                  # [T, H, dv]
    rt.record("kqv_gathered", il, o)
    o = contiguous(o.reshape(T, H * mc.v_head))                        # [T, H*dv]
    rt.record("kqv_out", il, o)
    return rt.matmul(o, w.attn_output)                                            # [T, D]
