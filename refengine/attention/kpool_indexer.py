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

A pool's key is computed once, when its last member arrives, and kept: the state carries every position's key /
gate rows and the pooled keys (`KPoolKeys`). A fixed-shape run (a decode step captured as a CUDA graph) pools each
new position's pool as of it into the row of that position, scores the capacity's pools and selects on the device
(`pool_keys_fixed`, `select_fixed`: the same set, tied scores included, through `ops.top_k.ggml_top_k_rows`, a
kernel on a GPU). A layer of `attention.indexer.types` 0 (shared)
runs no indexer and attends with the selection of the most recent full layer (glm5-next.cpp:956-964).
The score op is llama.cpp's fused `ggml_lightning_indexer` (or its unfused twin): float32, as `index_scores`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache import KPoolKeys
from ..errors import ConfigError
from ..ops import contiguous, layer_norm
from ..ops.arrays import as_array, row_kernel
from ..ops.softmax import softmax
from ..ops.top_k import ggml_top_k, ggml_top_k_rows
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
    """Append the new positions' key / gate rows [T, di]; pool every pool finished since the last pooled one.
    Returns every finished pool's key [P, di] (the state's, after the append)."""
    kp = kc.kpool
    all_k, all_g = state.k.append(ik), state.g.append(ig)                        # [S, di]
    a, n_done = state.pooled.n, state.n // kp
    if n_done > a:
        new = pool(all_k[a * kp:n_done * kp].reshape(n_done - a, kp, -1),
                   all_g[a * kp:n_done * kp].reshape(n_done - a, kp, -1),
                   np.asarray(w.indexer_kpool_ape, np.float32))                   # [n_done - a, di]
        rt.record("indexer_pool_k_new", il, new)
        state.pooled.append(new)
    pooled = state.pooled.view()
    return np.zeros_like(ik, shape=(0, ik.shape[1])) if pooled is None else pooled


def _pools_of(all_k, all_g, ape, pos, kp: int) -> np.ndarray:
    """Positions pos [T] (on the device in a resident run) -> the key of each one's pool pooled from the rows as they
    are [T, di] (its members past the last written row are zeros: a pool not finished yet, which no query sees;
    members past the capacity are read at its last row, for the same reason)."""
    b = as_array(pos) // kp                                                       # [T]
    cur = np.minimum(b[:, None] * kp + np.arange(kp, like=b)[None, :], all_k.shape[0] - 1)   # [T, kp]
    return pool(all_k[cur], all_g[cur], ape)                                      # [T, di]


def pool_keys_fixed(ik: np.ndarray, ig: np.ndarray, w, *, kc: KPoolConfig, state: KPoolKeys, pos) -> np.ndarray:
    """`pool_keys` with shapes that do not depend on the position (a fixed-shape run): the key / gate rows appended
    at the device's count, each new position's pool as of it (`_pools_of`: the same rows through the same ops as
    `pool`, so a finished pool's key equals the ordinary run's) appended to `state.pk`; returns pk's rows at the
    pools' last members [capacity // kp, di]: pool b's key once b is finished (the caller hides the others).
    No traces (fixed_shapes refuses one)."""
    kp = kc.kpool
    ape = np.asarray(w.indexer_kpool_ape, np.float32)
    if state.pk.n < state.k.n:               # an ordinary run before: its positions' pools, once (an eager step)
        k0, g0 = state.k.view(), state.g.view()
        state.pk.append(_pools_of(k0, g0, ape, np.arange(state.pk.n, state.k.n), kp))
    all_k, all_g = state.k.append(ik, fixed=True), state.g.append(ig, fixed=True)   # [cap, di]
    all_pk = state.pk.append(_pools_of(all_k, all_g, ape, pos, kp), fixed=True)       # [cap, di]
    return all_pk[kp - 1::kp]                                                     # [cap // kp, di]


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


def select_fixed(score: np.ndarray, q_pos: np.ndarray, S: int, kc: KPoolConfig):
    """`select` with shapes that do not depend on the data (a fixed-shape run: score [T, Pc] over the capacity's
    pools, S the capacity, q_pos [T] on the device in a resident run) -> (order [T, k/kp], mask [T, S], slots [T,
    n_sel], live [T, n_sel]) with k/kp = kc.n_top.

    llama.cpp's pool count P (the pools finished by the call's last position) and its padded axis (`n_pool_padded`)
    are made from q_pos; `ggml_top_k_rows` (a kernel on a GPU: the heap's steps per row, `ops.top_k`) takes the
    row's top min(k/kp, padded) pools as `select` does, tied scores included, in the same order; -1 past them. The
    padded axis is longer here (the capacity's pools, all -inf past P): the heap never takes one of those (only a
    strictly larger score enters it), so the set and its order are `select`'s (a call of more than 16 tokens:
    ties by index where the k-th score is not tied, as `select` orders there). Then per pool of the order: its kp
    slots (a pool past P: the call's first position, dead), live where the query sees the pool (finite score; they
    come first, as `select`'s); the tail's kp - 1 slots; the mask 0 at the live slots. `order` stands for
    `select`'s `top` (the visible pools first; here without the other pools after them: a trace, which would
    show it, refuses fixed shapes)."""
    T, Pc = score.shape
    kp = kc.kpool
    P = (q_pos[-1:] + 1) // kp                                                    # [1]
    n_pad = np.maximum(64, -(-(P + 1) // 64) * 64)                                # [1] n_pool_padded(P)
    order = row_kernel("ggml_top_k_rows", ggml_top_k_rows, score, n_pad, kc.n_top,
                       clean_stable=T > GATHER_MAX_UB)                            # [T, n] int32 (select's order)
    score1 = np.concatenate([score, np.full_like(score, -np.inf, shape=(T, 1))], axis=-1)   # [T, Pc + 1]
    real = (order >= 0) & (order < P)                                             # [T, n]
    at = np.where(real, order, Pc)                                                # [T, n] (Pc: a -inf column)
    chosen = np.isfinite(np.take_along_axis(score1, at, axis=-1))                 # [T, n] a prefix of each row
    members = np.arange(kp, like=q_pos)                                           # [kp]
    dummy = q_pos[:1]                                                             # [1]
    slots = np.where(real[:, :, None], at[:, :, None] * kp + members, dummy).reshape(T, -1)   # [T, n * kp]
    live = np.broadcast_to(chosen[:, :, None], (*chosen.shape, kp)).reshape(T, -1)
    seen = np.zeros_like(chosen, shape=(T, Pc + 1))                               # [T, Pc + 1] pools attended
    np.put_along_axis(seen, np.where(chosen, at, Pc), chosen, axis=-1)            # (column Pc: the rest)
    j = np.arange(S, like=q_pos)                                                  # [S]
    sel = seen[:, np.minimum(j // kp, Pc)]                                        # [T, S]
    if kc.select_tail:
        jt = np.arange(kp - 1, like=q_pos)                                        # [kp - 1]
        tail = (jt[None, :] < ((q_pos + 1) % kp)[:, None])                        # [T, kp - 1]
        slots = np.concatenate([slots, np.where(tail, q_pos[:, None] - jt[None, :], dummy)], axis=-1)
        live = np.concatenate([live, tail], axis=-1)
        sel = sel | ((j[None, :] >= ((q_pos + 1) // kp * kp)[:, None]) & (j[None, :] <= q_pos[:, None]))
    mask = np.where(sel, np.float32(0.0), np.float32(-np.inf))                    # [T, S]
    return order, mask, slots, live


def kpool_indexer(h, qr, w, *, kc: KPoolConfig, state: KPoolKeys, rt, il, pos=None) -> PoolSelection:
    """One layer's indexer: h [T, D] (attn_norm output), qr [T, Dq] (MLA's normed q-LoRA latent) -> the
    selection over the S = state.n + T positions. `state` is updated in place. pos: the T positions (`step.pos`,
    on the device in a resident run), read by a fixed-shape run (`rt.fixed_shapes`: S the capacity) and an untraced
    resident one, which select on the device (`select_fixed`); a host run selects from state.n (`select`)."""
    T, Hi, di = h.shape[0], kc.n_head, kc.head_dim
    fixed = rt.fixed_shapes
    # on a device the selection runs there (`select_fixed` over the pools so far: no scores read back) unless a
    # trace keeps `indexer_top_k` (select's whole order of the pools)
    on_device = fixed or (not isinstance(h, np.ndarray) and pos is not None and rt.trace is None)
    q_pos = pos if on_device and pos is not None else state.n + np.arange(T)      # [T]
    iq = rt.matmul(qr, w.indexer_attn_q_b).reshape(T, Hi, di)                     # [T, Hi*di] -> [T, Hi, di]
    rt.record("indexer_q", il, iq)
    ik = layer_norm(rt.matmul(h, w.indexer_attn_k), w.indexer_k_norm, w.indexer_k_norm_b, kc.k_norm_eps)   # [T, di]
    rt.record("indexer_k", il, ik)
    ig = rt.matmul(h, w.indexer_kpool_gate)                                       # [T, di]
    rt.record("indexer_gate", il, ig)
    if fixed:
        pooled = pool_keys_fixed(ik, ig, w, kc=kc, state=state, pos=q_pos)        # [Pc, di] the capacity's
    else:
        pooled = pool_keys(ik, ig, w, kc=kc, state=state, rt=rt, il=il)           # [P, di]
    rt.record("indexer_pool_k", il, pooled[:, None, :])                           # [P, 1, di]
    iw = index_weights(h, w, ic=kc, rt=rt, il=il)                                 # [T, Hi]
    P = pooled.shape[0]
    ends = (np.arange(P, like=q_pos) + 1) * kc.kpool - 1                          # [P] each pool's last position
    visible = np.where(ends[None, :] <= q_pos[:, None], np.float32(0.0), np.float32(-np.inf))   # [T, P]
    score = index_scores(iq, pooled, iw, visible.astype(np.float32))              # [T, P]
    rt.record("indexer_score", il, score)
    S = state.k.capacity if fixed else state.n                                     # fixed: the capacity
    top, mask, slots, live = (select_fixed if on_device else select)(score, q_pos, S, kc)
    rt.record("indexer_top_k", il, lambda: top.astype(np.int32))
    causal = np.where(np.arange(S, like=q_pos)[None, :] <= q_pos[:, None], np.float32(0.0), np.float32(-np.inf))
    mask = (mask + causal).astype(np.float32)                                     # [T, S]
    rt.record("indexer_sel", il, mask)
    return PoolSelection(top=top, mask=mask, score=score, slots=slots, live=live)


# ---------------------------------------------------------------- the layer: MLA under the pooled selection

def selection_key(il: int) -> tuple[str, int]:
    return ("kpool_selection", il)


def sparse_mask(sel: PoolSelection, q0: int, gather: bool = True, fixed: bool = False) -> SparseMask:
    """The selection as MLA's mask, both forms: query row t (position q0 + t) attends its live slots (the chosen
    pools' members and its tail, each position once, all causal: `select`), which are where sel.mask is 0.
    fixed: the mask spans the cache's capacity (`SparseMask.fixed`, `select_fixed`)."""
    return SparseMask(mask=sel.mask, idx=sel.slots, live=sel.live, q0=q0, gather=gather, fixed=fixed)


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
    rt.prefetch(h, [w.attn_q_a, w.attn_kv_a_mqa] + ([w.indexer_attn_k, w.indexer_kpool_gate] if kc.full else []))
    qr = mla.project_q_a(h, w, mc=mc, rt=rt, il=il, name="q_resid")                  # [T, Dq]
    if kc.full:
        sel = step.memo(selection_key(il), lambda: kpool_indexer(h, qr, w, kc=kc, state=state.index, rt=rt, il=il,
                                                                 pos=step.pos))
    else:
        def missing():
            raise ConfigError(f"layer {il} shares the indexer of layer {kc.source}, which has not run in this step")
        sel = step.memo(selection_key(kc.source), missing)
    fixed = rt.fixed_shapes
    S = state.n + T
    assert sel.mask.shape[0] == T and (fixed or sel.mask.shape[1] == S), \
        f"layer {il}: selection mask {sel.mask.shape}, expected {(T, S)}"         # fixed shapes: S = the capacity
    if state.kv.form == "absorbed" and gathers(T, sel.mask.shape[1], sel.slots.shape[1]):
        return gathered_mla(h, qr, w, mc=mc, kc=kc, sel=sel, state=state.kv, rt=rt, il=il, names=names)
    rt.record("kq_mask_dsa", il, sel.mask)                                        # [T, S]
    return mla.mla(h, w, mc=mc, il=il, state=state.kv, cos=None, sin=None, rt=rt,
                   mask_fn=sparse_mask(sel, S - T, gather, fixed), qr=qr, names=names, pos=step.pos)


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
    c, _ = mla.project_kv_a(h, w, mc=mc, rt=rt, il=il)                            # [T, C]
    q_abs = mla.absorb_query(q.transpose(1, 0, 2), w, mc=mc, rt=rt)              # [H, T, C]
    rt.record("q_absorbed", il, q_abs.transpose(1, 0, 2))                         # [T, H, C]
    c_all, _, _ = state.append(c, np.zeros_like(c, shape=(T, 0)), rt.fixed_shapes)   # [S, C] (fixed: the capacity)
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
