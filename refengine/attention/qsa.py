"""QSA (Qwen3.8-Flash-Next's sparse attention): a block indexer picks which cached tokens a query attends to.

Legend: T new tokens, S cached positions (the new ones included), r the block size (`attention.compress_ratios`
of the layer), nb blocks, Hi indexer heads (`attention.indexer.head_count`), di indexer head dim
(`attention.indexer.key_length`), B the token budget (`attention.indexer.top_k`), D model dim.

    kraw[s]  = h_s @ indexer.k_proj.T                         raw key per token, cached    indexer_k_raw  [T, 1, di]
    pk[b]    = rope(rms_norm(mean(kraw[b*r:(b+1)*r])) * indexer.k_norm, at b*r)          indexer_k      [nb, di]
    qi[t]    = rope(rms_norm(h_t @ indexer.q_proj.T per head) * indexer.q_norm, at p_t)  indexer_q      [T, Hi, di]
    score    = sum_h relu(qi[t, h] . pk[b])                   no scale, no head weights    indexer_score  [T, nb]

A block is complete for query t when all its r positions are <= p_t; the query's unfinished block (the tail,
positions >= (p_t+1)//r*r) is always visible. Then the two selection rules (`RULES`):

- `authors` (transformers 5.23 `Qwen4ExpTextQSAIndexer`, the default): the top B/r complete blocks by score,
  whole, plus the tail. (The authors divide the score by sqrt(di): the ranking is the same.)
- `llamacpp` (src/models/qwen4exp.cpp:548-697, host inputs src/llama-memory-hybrid-idx.cpp:334-650): every
  cell gets its block's score, +1e9 on the tail, -inf where masked, and `ggml_top_k` keeps the top
  B + r - 1 *cells*. The tail takes its (at most r-1) slots first; the rest go by block score, so a query whose
  tail is shorter than r-1 spills the spare slots into the next block, of which it then sees only some tokens.
  Which ones is decided by `std::partial_sort` among equal scores: `ggml_top_k` below replays libstdc++'s
  heap-select exactly, so the same cells are kept.

The selection is the mask of the layer's gated attention (attention/gqa.py) in both forms: per query its selected
positions, gathered (O(T x B)), or as a 0 / -inf mask [T, S] with the causal one added (the masked-dense oracle,
and the form that runs when a trace keeps the scores `kq`, `kq_soft_max`). Every run selects in array form, its
shapes not the data's (`select_authors_fixed`, `select_llamacpp_rows`: a device selects where its scores are, and a
fixed-shape run over the capacity); the per-query lists (`select_authors`, `select_llamacpp`, `sparse_mask`) are
the rules as first written, which the tests hold the array forms to. The layer's
state is a `QSAState`: its KV cache and the raw indexer keys (blocks are pooled again at each call, as llama.cpp
pools its "idx" cache).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache import IndexerKeys, KVCache, QSAState
from ..errors import ConfigError
from ..ops import rms_norm
from ..ops.arrays import row_kernel
from ..ops.top_k import ggml_top_k_rows, heap_select
from ..weights import W
from .mha import SparseMask, causal_mask

RULES = ("authors", "llamacpp")      # the default first
TAIL_BIAS = np.float32(1e9)          # llama.cpp's bias that keeps the tail (finite: it never meets -inf as a nan)


@dataclass(frozen=True)
class QSAConfig:
    n_head: int         # attention.indexer.head_count (Hi)
    head_dim: int       # attention.indexer.key_length (di)
    top_k: int          # attention.indexer.top_k: the budget B in tokens
    ratio: int          # attention.compress_ratios[il]: the block size r (0: dense attention, no indexer)


def new_state() -> QSAState:
    return QSAState(kv=KVCache(), index=IndexerKeys())


def qsa_table(il: int, qc: QSAConfig) -> list[W]:
    """The indexer's tensors (qwen4exp.cpp:212-216): q_proj ne {D, Hi*di}, k_proj ne {D, di}, two [di] norms."""
    p = f"blk.{il}.indexer."
    di = qc.head_dim
    return [W("indexer_q_proj", p + "q_proj.weight", lambda c, s: (qc.n_head * di, c.n_embd)),
            W("indexer_k_proj", p + "k_proj.weight", lambda c, s: (di, c.n_embd)),
            W("indexer_q_norm", p + "q_norm.weight", lambda c, s: (di,), dense=True),
            W("indexer_k_norm", p + "k_norm.weight", lambda c, s: (di,), dense=True)]


# ---------------------------------------------------------------- scores

def pool(kraw: np.ndarray, r: int) -> np.ndarray:
    """kraw [S, di] -> the complete blocks' mean keys [S//r, di] and, last, the "dead" block llama.cpp pools for
    the cells of no complete block (r copies of cell 0's key, at position 0): [S//r + 1, di].
    The mean as ggml: the r slices summed in order, then times 1/r (float32)."""
    S, di = kraw.shape
    nf = S // r
    members = np.concatenate([kraw[:nf * r].reshape(nf, r, di),
                              np.repeat(kraw[:1][None], r, axis=1)])           # [nf+1, r, di]
    acc = members[:, 0]
    for i in range(1, r):
        acc = acc + members[:, i]
    return acc * np.float32(1.0 / r)                                             # [nf+1, di]


def block_scores(qi: np.ndarray, pk: np.ndarray) -> np.ndarray:
    """qi [T, Hi, di], pk [nb, di] -> [T, nb] = sum_h relu(qi[:, h] . pk) (heads added in order, float32)."""
    dots = np.maximum(np.einsum("thd,bd->thb", qi, pk, dtype=np.float32), np.float32(0))    # [T, Hi, nb]
    acc = dots[:, 0]
    for h in range(1, dots.shape[1]):
        acc = acc + dots[:, h]
    return acc


# ---------------------------------------------------------------- selection

def select_authors(scores: np.ndarray, pos: np.ndarray, S: int, qc: QSAConfig) -> list[np.ndarray]:
    """Per query: the positions of its top B/r complete blocks (whole; ties to the earlier block) and its tail.
    scores [T, nb] (complete blocks first); pos [T] -> T arrays of selected positions."""
    r, nblk = qc.ratio, qc.top_k // qc.ratio
    out = []
    for t, p in enumerate(pos):
        nc = (int(p) + 1) // r                                            # complete blocks seen by this query
        top = np.argsort(-scores[t, :nc], kind="stable")[:min(nblk, nc)]
        blocks = (np.sort(top)[:, None] * r + np.arange(r)[None, :]).reshape(-1)
        out.append(np.concatenate([blocks, np.arange(nc * r, int(p) + 1)]))
    return out


def select_authors_fixed(scores: np.ndarray, pos: np.ndarray, S: int, qc: QSAConfig):
    """`select_authors` with shapes that do not depend on the data (a fixed-shape run: S a cache's capacity,
    `cache.Rows`; scores [T, nb]) -> (idx [T, n], live [T, n], mask [T, S]) as `sparse_mask` gives them: per query
    nblk = B/r block slots and r - 1 tail slots, those of blocks not complete and of tail positions not reached
    dead (position 0, not live).

    The blocks: one stable sort of the row with the incomplete blocks at +inf, so the complete ones come first in
    `select_authors`' order (ties to the earlier block), the first nblk kept, the kept ones in ascending order; the
    attended positions are the same, each once, and in the same order (dead slots between them weigh exactly 0; the
    softmax's sums over more slots may associate otherwise: summation order)."""
    r = qc.ratio
    T, nb = scores.shape
    nblk = min(qc.top_k // r, nb)
    b = np.arange(nb, like=scores)                                                # [nb]
    nc = (pos + 1) // r                                                           # [T] complete blocks seen
    seen = b[None, :] < nc[:, None]                                               # [T, nb]
    order = np.argsort(np.where(seen, -scores, np.float32(np.inf)), axis=-1, kind="stable")[:, :nblk]  # [T, nblk]
    kept = np.take_along_axis(seen, order, axis=-1)                               # [T, nblk]
    blocks = np.sort(np.where(kept, order, nb), axis=-1)                          # [T, nblk] kept first, ascending
    cells = blocks[:, :, None] * r + np.arange(r, like=scores)[None, None, :]      # [T, nblk, r]
    live_b = np.broadcast_to((blocks < nb)[:, :, None], cells.shape)               # [T, nblk, r]
    tail = nc[:, None] * r + np.arange(r - 1, like=scores)[None, :]              # [T, r-1]
    live_t = tail <= pos[:, None]                                                 # [T, r-1]
    live = np.concatenate([live_b.reshape(T, nblk * r), live_t], axis=-1)         # [T, n]
    idx = np.where(live, np.concatenate([cells.reshape(T, nblk * r), tail], axis=-1), 0)   # [T, n]
    chosen = np.zeros_like(seen)                                                  # [T, nb]
    np.put_along_axis(chosen, order, kept, axis=-1)
    j = np.arange(S, like=scores)                                                 # [S]
    sel = chosen[:, j // r] | ((j[None, :] >= (nc * r)[:, None]) & (j[None, :] <= pos[:, None]))   # [T, S]
    mask = np.where(sel, np.float32(0), np.float32(-np.inf)) + causal_mask(pos, j)   # [T, S]
    return idx, live, mask


def cell_values(scores: np.ndarray, pos: np.ndarray, S: int, r: int) -> np.ndarray:
    """llama.cpp's `indexer_score_tokens` [T, S]: cell j gets its block's score (complete blocks: j // r; cells of
    no complete block: the dead block, index S // r) + 1e9 on the query's tail, + the causal mask (0 / -inf)."""
    nf = S // r
    j = np.arange(S, like=pos)
    blk = np.where(j // r < nf, j // r, nf)                               # [S]
    tail_start = (pos + 1) // r * r                                       # [T]
    bias = np.where(((blk * r)[None, :] >= tail_start[:, None]) | (blk == nf)[None, :], TAIL_BIAS,
                    np.float32(0))                                        # [T, S]
    v = (scores[:, blk] + bias).astype(np.float32)
    return (v + np.where(j[None, :] <= pos[:, None], np.float32(0), np.float32(-np.inf))).astype(np.float32)


def ggml_top_k(values: np.ndarray, k: int) -> np.ndarray:
    """The k indices `ggml_top_k` returns for one row, as a set in ascending order: libstdc++'s partial_sort heap
    select replayed step by step (`ops.top_k.heap_select`), so ties between equal values (the cells of one block)
    resolve as in llama.cpp."""
    return np.sort(np.asarray(heap_select(values, k), np.int64))


def select_llamacpp(cells: np.ndarray, qc: QSAConfig) -> list[np.ndarray]:
    """Per query: the cells `ggml_top_k` keeps of `cells` [T, S] (width min(S, B + r - 1)), the masked ones
    dropped (their -inf stays in the mask either way)."""
    T, S = cells.shape
    width = min(S, qc.top_k + qc.ratio - 1)
    return [np.array([j for j in ggml_top_k(cells[t], width) if np.isfinite(cells[t, j])], np.int64)
            for t in range(T)]


def select_llamacpp_rows(cells: np.ndarray, pos: np.ndarray, qc: QSAConfig):
    """`select_llamacpp` as arrays, its shapes not the data's: cells [T, S] (`cell_values`), pos [T] -> (idx [T, n],
    live [T, n], mask [T, S]) with n = min(S, B + r - 1): per query the cells `ggml_top_k` keeps in ascending
    order, the masked (-inf) ones and the rest dead (position 0), the mask 0 at the kept ones plus the causal one.
    The heap runs per row in `ggml_top_k_rows` (reached through `row_kernel`: a GPU kernel for device arrays), so a
    device selects where its scores are. Over a fixed-shape run's capacity (S the capacity, the cells past the
    positions -inf) the kept cells are the same: a -inf cell never enters the heap, a budget over the positions keeps
    every visible cell either way, and the tail's cells (its own block's score + 1e9 here, the dead block's there)
    are all kept, above every other cell, in both."""
    T, S = cells.shape
    n = min(S, qc.top_k + qc.ratio - 1)
    order = row_kernel("ggml_top_k_rows", ggml_top_k_rows, cells,
                       np.full_like(cells, S, shape=(1,), dtype=np.int64), n)            # [T, n] the set
    cells1 = np.concatenate([cells, np.full_like(cells, -np.inf, shape=(T, 1))], axis=-1)   # [T, S + 1]
    kept = np.isfinite(np.take_along_axis(cells1, np.where(order >= 0, order, S), axis=-1))  # [T, n]
    at = np.sort(np.where(kept, order, S), axis=-1)                                # [T, n] kept first, ascending
    live = at < S
    idx = np.where(live, at, 0)
    seen = np.zeros_like(live, shape=(T, S + 1))
    np.put_along_axis(seen, at, live, axis=-1)                                    # (column S: the dead ones)
    mask = np.where(seen[:, :S], np.float32(0), np.float32(-np.inf)) + causal_mask(pos, np.arange(S, like=pos))
    return idx, live, mask


def selection_mask(sel: list[np.ndarray], S: int) -> np.ndarray:
    """T arrays of positions -> [T, S] 0 where selected, -inf elsewhere."""
    m = np.full((len(sel), S), -np.inf, np.float32)
    for t, s in enumerate(sel):
        m[t, s] = 0.0
    return m


def sparse_mask(sel: list[np.ndarray], pos: np.ndarray, S: int, gather: bool = True) -> SparseMask:
    """T arrays of selected positions (each position once, all causal: both rules) -> the attention's mask, both
    forms: idx [T, n] (n the longest selection; short rows padded with dead slots at position 0) and the [T, S]
    selection mask with the causal one added."""
    T, n = len(sel), max([1] + [len(s) for s in sel])
    idx = np.zeros((T, n), np.int64)
    live = np.zeros((T, n), bool)
    for t, s in enumerate(sel):
        idx[t, :len(s)], live[t, :len(s)] = s, True
    mask = selection_mask(sel, S) + causal_mask(pos, np.arange(S))                # [T, S]
    return SparseMask(mask=mask, idx=idx, live=live, q0=int(pos[0]), gather=gather)


# ---------------------------------------------------------------- the indexer of one layer

def indexer(h: np.ndarray, w, qc: QSAConfig, *, state: QSAState, pos: np.ndarray, rope_q, rope_blocks,
            eps: float, rule: str, rt, il: int, gather: bool = True) -> SparseMask:
    """h [T, D] -> the layer attention's mask, causal and selection (`sparse_mask`; gather False: attended
    masked-dense, the oracle).

    rope_q(x [T, Hi, di]) and rope_blocks(x [nb, 1, di], positions [nb]) rotate like the layer's attention
    (IMROPE on its n_rot dims). rule: one of RULES. The raw keys of this call are appended to `state.index`."""
    if rule not in RULES:
        raise ConfigError(f"QSA selection rule {rule!r} is not one of {', '.join(RULES)}")
    T = h.shape[0]
    r, di = qc.ratio, qc.head_dim
    kraw, q = rt.matmul_many(h, [w.indexer_k_proj, w.indexer_q_proj])   # [T, di], [T, Hi*di]
    rt.record("indexer_k_raw", il, kraw[:, None, :])
    fixed = rt.fixed_shapes
    k_all = state.index.append(kraw, fixed)                              # [S, di] (fixed: S = the capacity)
    S = k_all.shape[0]
    pooled = pool(k_all, r)                                              # [nb, di]  complete blocks + dead
    rt.record("indexer_k_pooled", il, pooled)
    nf = S // r
    b = np.arange(nf + 1, like=pos)
    bpos = np.where(b < nf, b * r, 0)                                    # [nb] block start; the dead block at 0
    pk = rope_blocks(rms_norm(pooled, w.indexer_k_norm, eps)[:, None, :], bpos)[:, 0]   # [nb, di]
    rt.record("indexer_k", il, pk)
    q = q.reshape(T, qc.n_head, di)                                      # [T, Hi, di]
    qi = rope_q(rms_norm(q, w.indexer_q_norm, eps))                      # [T, Hi, di]
    rt.record("indexer_q", il, qi)
    scores = block_scores(qi, pk)                                        # [T, nb]
    rt.record("indexer_score", il, scores)
    cells = cell_values(scores, pos, S, r)                               # [T, S]
    rt.record("indexer_score_tokens", il, cells)
    # either rule in one form for every run, its shapes not the data's: a device selects there (no read-back), a
    # fixed-shape run over the capacity; llama.cpp's walks ggml_top_k's heap per query (`ops.top_k.ggml_top_k_rows`:
    # a kernel on a GPU)
    idx, live, mask = select_authors_fixed(scores, pos, S, qc) if rule == "authors" else \
        select_llamacpp_rows(cells, pos, qc)
    rt.record("indexer_top_k", il, lambda: picked_positions(
        [i[v] for i, v in zip(np.asarray(idx), np.asarray(live))], qc))
    return SparseMask(mask=mask, idx=idx, live=live, q0=state.index.n - T, gather=gather, fixed=fixed)


def picked_positions(sel: list[np.ndarray], qc: QSAConfig) -> np.ndarray:
    """T arrays of selected positions -> `indexer_top_k` [T, width]: each row's positions, then -1 (width: the
    budget's B + r - 1 slots, or the longest row)."""
    width = max([qc.top_k + qc.ratio - 1] + [len(s) for s in sel])
    picked = np.full((len(sel), width), -1, np.int64)
    for t, s in enumerate(sel):
        picked[t, :len(s)] = s
    return picked
