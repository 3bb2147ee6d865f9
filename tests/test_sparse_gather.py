"""Gathered sparse attention == masked-dense attention, its oracle (issue 26).

Each sparse arch's module turns its indexer's selection into gather slots (`mha.SparseMask`; DeepSeek-V4:
`compressed_kv.gather_slots`). Here, for each, the module's own selection function runs on scores with ties and
on early queries that see fewer than k candidates; its slots must name exactly the positions its [T, S] mask keeps,
each once; and attention over the gathered keys must equal attention under the mask, float64 <= 1e-12, for a decode
(T = 1), a whole prefill from position 0 and a call in the middle of a sequence. Then the whole tiny models: the
gathered form (no trace) against the one-shot masked form (a trace that keeps `kq`), float32.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from refengine.attention import compressed_kv, csa_indexer, dsa, kpool_indexer, qsa
from refengine.attention.dsa_indexer import Selection, select_top_k
from refengine.attention.mha import SparseMask, attend, attention, attention_gathered, causal_mask

TOL = 1e-12
# (T, S): a decode, a prefill from position 0 (early queries see fewer than k keys), a call mid-sequence
CALLS = [(1, 1), (1, 37), (37, 37), (9, 40)]


def qkv(T, S, H, Hkv, K=16, V=12, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, H, K)), rng.standard_normal((S, Hkv, K)), rng.standard_normal((S, Hkv, V)))


def tied_scores(T, S, q0, seed=0):
    """[T, S] scores over 4 distinct values (many exact ties, at the k-th one too), causal -inf added."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 4, size=(T, S)).astype(np.float32)
    return s + causal_mask(q0 + np.arange(T), np.arange(S))


def check_slots(mask: np.ndarray, idx: np.ndarray, live: np.ndarray) -> None:
    """The live slots of each row are exactly the positions its mask keeps (0), each once."""
    assert idx.shape == live.shape and idx.shape[0] == mask.shape[0]
    assert set(np.unique(mask).tolist()) <= {0.0, -np.inf}
    for t in range(mask.shape[0]):
        got = idx[t][live[t]]
        assert got.size == np.unique(got).size, f"row {t}: a position gathered twice {np.sort(got)}"
        assert np.array_equal(np.sort(got), np.flatnonzero(mask[t] == 0)), t


def check_sparse_mask(sm: SparseMask, H=4, Hkv=1, seed=0) -> None:
    """Slots == mask; gathered == one-shot == blocked masked-dense, float64 (MQA as MLA, and GQA)."""
    T, S = sm.mask.shape
    check_slots(sm.mask, sm.idx, sm.live)
    q_pos = sm.q0 + np.arange(T)
    q, k, v = qkv(T, S, H, Hkv, seed=seed)
    want = attention(q, k, v, sm.mask, 0.3, dtype=np.float64)                     # [T, H, V] one shot
    dense = SparseMask(sm.mask, sm.idx, sm.live, sm.q0, gather=False)
    outs = {"gathered": attend(q, k, v, q_pos, 0.3, mask_fn=sm, dtype=np.float64),
            "blocked": attend(q, k, v, q_pos, 0.3, mask_fn=dense, dtype=np.float64),
            "gathered q_block=2": attention_gathered(q, k, v, sm.idx, sm.live, 0.3, q_block=2, dtype=np.float64)}
    seen = np.any(sm.mask == 0, axis=1)               # a row that attends nothing is NaN in every form (softmax)
    assert np.all(np.isfinite(want[seen])) and np.all(np.isnan(want[~seen]))
    for name, got in outs.items():
        assert got.shape == want.shape and np.all(np.isnan(got[~seen])), name
        assert np.max(np.abs(got[seen] - want[seen]), initial=0.0) <= TOL, (name, np.max(np.abs(got - want)))


def test_attend_picks_the_form():
    """A gathering SparseMask is gathered (only kqv traced); the one-shot form (a trace keeping kq) reads its mask."""
    T, S = 6, 20
    sel = select_top_k(tied_scores(T, S, S - T), 5)
    sm = SparseMask(sel[1] + causal_mask(np.arange(S - T, S), np.arange(S)), sel[0],
                    sel[0] <= np.arange(S - T, S)[:, None], S - T)
    q, k, v = qkv(T, S, 4, 2)
    recs = ({}, {})
    outs = [attend(q, k, v, np.arange(S - T, S), 0.5, mask_fn=sm, one_shot=one, il=0, dtype=np.float64,
                   record=lambda n, il, a, r=r: r.__setitem__(n, a)) for one, r in zip((True, False), recs)]
    assert set(recs[0]) == {"kq", "kq_soft_max", "kqv"} and set(recs[1]) == {"kqv"}
    assert np.max(np.abs(outs[0] - outs[1])) <= TOL and np.max(np.abs(recs[0]["kqv"] - recs[1]["kqv"])) <= TOL


# ---------------------------------------------------------------- DSA (deepseek32, glm-dsa)

@pytest.mark.parametrize("k", [1, 8, 64])                  # 64 > S: top_k names masked positions, DSA == dense MLA
@pytest.mark.parametrize("T,S", CALLS)
def test_dsa_gathered_equals_masked(T, S, k):
    q0 = S - T
    score = tied_scores(T, S, q0, seed=k)
    top_k, sel_mask = select_top_k(score, k)                                       # the indexer's selection
    sel = Selection(top_k=top_k, mask=(sel_mask + causal_mask(q0 + np.arange(T), np.arange(S))).astype(np.float32),
                    score=score)
    for Hkv in (1, 2):
        check_sparse_mask(dsa.sparse_mask(sel, q0), Hkv=Hkv, seed=S + Hkv)


# ---------------------------------------------------------------- k-pool (glm5-next)

@pytest.mark.parametrize("select_tail", [True, False])
@pytest.mark.parametrize("T,S", CALLS + [(40, 40)])       # T > 16: the masked path llama.cpp runs for long calls
def test_kpool_gathered_equals_masked(T, S, select_tail):
    kc = kpool_indexer.KPoolConfig(n_head=2, head_dim=16, top_k=8, kpool=4, select_tail=select_tail, k_norm_eps=0.0)
    q_pos = S - T + np.arange(T)
    P = S // kc.kpool
    ends = (np.arange(P) + 1) * kc.kpool - 1
    rng = np.random.default_rng(T)
    score = rng.integers(0, 3, size=(T, P)).astype(np.float32)                     # ties between pools
    score = np.where(ends[None, :] <= q_pos[:, None], score, np.float32(-np.inf))
    top, mask, slots, live = kpool_indexer.select(score, q_pos, S, kc)
    mask = (mask + causal_mask(q_pos, np.arange(S))).astype(np.float32)           # as kpool_indexer adds it
    sel = kpool_indexer.PoolSelection(top=top, mask=mask, score=score, slots=slots, live=live)
    check_sparse_mask(kpool_indexer.sparse_mask(sel, S - T), H=4, Hkv=1)


# ---------------------------------------------------------------- QSA (qwen4exp)

@pytest.mark.parametrize("rule", qsa.RULES)
@pytest.mark.parametrize("T,S", CALLS + [(40, 40)])
def test_qsa_gathered_equals_masked(T, S, rule):
    qc = qsa.QSAConfig(n_head=2, head_dim=16, top_k=8, ratio=4)
    pos = S - T + np.arange(T)
    nb = S // qc.ratio + 1                                                         # complete blocks + the dead one
    scores = np.random.default_rng(S).integers(0, 3, size=(T, nb)).astype(np.float32)   # tied blocks
    if rule == "authors":
        sel = qsa.select_authors(scores, pos, S, qc)
    else:
        sel = qsa.select_llamacpp(qsa.cell_values(scores, pos, S, qc.ratio), qc)
    for Hkv in (1, 2):
        check_sparse_mask(qsa.sparse_mask(sel, pos, S), H=4, Hkv=Hkv, seed=Hkv)


# ---------------------------------------------------------------- DeepSeek-V4 (window + CSA / HCA blocks, sinks)

def csa_selection(T, q0, N, top_k, seed=0):
    """csa_indexer.select_blocks on random weights whose pooled keys repeat (tied scores): (chosen [T, N], ids)."""
    rng = np.random.default_rng(seed)
    Hi, di, Dq, D = 2, 8, 6, 5
    keys = rng.standard_normal((max(N, 1), di)).astype(np.float32)[np.arange(N) % 3]    # [N, di] 3 distinct keys
    w = SimpleNamespace(indexer_attn_q_b=rng.standard_normal((Hi * di, Dq)).astype(np.float32),
                        indexer_proj=rng.standard_normal((Hi, D)).astype(np.float32))
    rt = SimpleNamespace(matmul=lambda x, m: x @ m.T, record=lambda *a: None)
    qr, h = rng.standard_normal((T, Dq)).astype(np.float32), rng.standard_normal((T, D)).astype(np.float32)
    return csa_indexer.select_blocks(qr, h, w, keys, pos=q0 + np.arange(T), n_head=Hi, head_dim=di, top_k=top_k,
                                     rope=lambda x, p: x, rt=rt, il=0)


@pytest.mark.parametrize("ratio", [0, 4, 128])
@pytest.mark.parametrize("T,q0", [(1, 0), (1, 36), (37, 0), (9, 31), (20, 300)])
def test_compressed_kv_gathered_equals_masked(T, q0, ratio):
    """The window (n_swa 8) and the blocks a query sees: gathered with sinks == `attention_with_sinks` (dense)."""
    n_swa, H, K = 8, 4, 16
    pos = q0 + np.arange(T)
    kpos = np.arange(max(0, q0 - (n_swa - 1)), q0 + T)                             # the window after extend
    visible = compressed_kv.window_mask(pos, kpos, n_swa)                         # [T, S]
    block_ids, n_blocks = None, 0
    if ratio:
        n_blocks = (q0 + T) // ratio
        chosen = csa_indexer.visible_blocks(pos, n_blocks, ratio)                  # [T, N]
        block_ids = np.where(chosen, np.arange(n_blocks)[None, :], -1)
        if ratio == 4:
            chosen, block_ids = csa_selection(T, q0, n_blocks, top_k=3, seed=T)
        visible = np.concatenate([visible, chosen], axis=1)                        # [T, S + N]
    idx, live = compressed_kv.gather_slots(pos, kpos, n_swa, block_ids)
    check_slots(np.where(visible, 0.0, -np.inf), idx, live)
    rng = np.random.default_rng(q0)
    q = rng.standard_normal((T, H, K))
    keys = rng.standard_normal((kpos.size + n_blocks, K))                          # [S + N, K], K = V
    sinks = rng.standard_normal(H)
    want = compressed_kv.attention_with_sinks(q, keys, visible, 0.25, sinks, lambda *a: None, 0, dtype=np.float64)
    got = attention_gathered(q, keys[:, None], keys[:, None], idx, live, 0.25, sinks=sinks, dtype=np.float64)
    assert np.max(np.abs(got - want)) <= TOL, np.max(np.abs(got - want))


# ---------------------------------------------------------------- the whole tiny models, float32

SPARSE = ["deepseek32", "glm-dsa", "deepseek4", "qwen4exp", "glm5-next"]


@pytest.mark.parametrize("arch", SPARSE)
def test_model_gathered_equals_one_shot_masked(synth_model, arch):
    """60 tokens (top-k 8: selection live): no trace (every sparse layer gathered) == a trace keeping every layer's
    `kq` (the one-shot masked form llama.cpp's graph computes): float32 summation order only."""
    from refengine import Model
    from refengine.compare import metrics
    from refengine.runtime import Runtime
    from refengine.trace import Trace
    m = Model(synth_model(arch))
    tokens = np.random.default_rng(7).integers(0, 256, size=60).tolist()
    keep = Trace({f"kq-{il}" for il in range(m.cfg.n_layer)})
    dense = m.forward(tokens, m.new_state(), Runtime(trace=keep))
    assert any(n.startswith("kq-") for n in keep), "no layer ran the one-shot form"
    gathered = m.forward(tokens, m.new_state())
    assert metrics(dense, gathered)[0] <= 1e-10
