"""Blocked attention (online softmax over key blocks) == the one-shot form, its oracle: float64 <= 1e-12."""
from __future__ import annotations

import numpy as np
import pytest
from numerics import assert_close

from refengine.attention.mha import attend, attention, attention_blocked, causal_mask, no_mask


def qkv(T, S, H, Hkv, K=16, V=12, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T, H, K)), rng.standard_normal((S, Hkv, K)), rng.standard_normal((S, Hkv, V)))


def selection_mask_fn(T, S, k, seed=0):
    """A DSA-like mask: per query k random visible keys (the newest always), causal; tiles sliced from it."""
    rng = np.random.default_rng(seed)
    q_pos = np.arange(S - T, S)
    full = np.full((T, S), -np.inf, np.float32)
    for t, p in enumerate(q_pos):
        full[t, rng.choice(p + 1, size=min(k, p + 1), replace=False)] = 0.0
        full[t, p] = 0.0
    return lambda qp, kp: full[np.ix_(qp - (S - T), kp)]


# (T, S, H, Hkv, q_block, k_block): blocks that do not divide T or S, blocks larger than both, one token, MQA
SHAPES = [(37, 37, 8, 2, 5, 7), (37, 90, 8, 2, 16, 32), (1, 90, 4, 4, 256, 512), (60, 60, 6, 1, 256, 512),
          (33, 100, 4, 1, 1, 1)]


@pytest.mark.parametrize("mask", ["causal", "none", "selection"])
@pytest.mark.parametrize("T,S,H,Hkv,qb,kb", SHAPES)
def test_blocked_equals_one_shot_float64(T, S, H, Hkv, qb, kb, mask):
    q, k, v = qkv(T, S, H, Hkv)
    q_pos = np.arange(S - T, S)
    fn = {"causal": causal_mask, "none": no_mask, "selection": selection_mask_fn(T, S, k=5)}[mask]
    want = attention(q, k, v, fn(q_pos, np.arange(S)), 0.3, dtype=np.float64)                 # [T, H, V]
    got = attention_blocked(q, k, v, q_pos, 0.3, mask_fn=fn, q_block=qb, k_block=kb, dtype=np.float64)
    assert got.dtype == np.float64 and got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-12, np.max(np.abs(got - want))


def test_blocked_float32_and_large_logits():
    """float32 (llama.cpp's arithmetic): the forms differ by summation order only; logits far from 0 (the running
    max rescales, nothing overflows)."""
    q, k, v = qkv(50, 120, 4, 2)
    q_pos = np.arange(70, 120)
    args = (q.astype(np.float32) * 30, k.astype(np.float32), v.astype(np.float32))
    want = attention(*args, causal_mask(q_pos, np.arange(120)), 0.25)
    got = attention_blocked(*args, q_pos, 0.25, q_block=8, k_block=16)
    assert got.dtype == np.float32 and np.all(np.isfinite(got))
    assert_close("blocked vs one-shot (float32)", got, want, 1e-6)


def test_blocked_on_a_device_takes_bigger_query_blocks(monkeypatch):
    """On a device (the sim device's arrays) a prompt's queries are one block (BLOCK_ELEMS_DEVICE scores), on the
    host 256 a block: the same rows as the one-shot form (float32) either way, and the device's block count follows
    the budget."""
    from refengine.attention import mha
    from refengine.devarray import Device
    T, S = 300, 320
    q, k, v = (a.astype(np.float32) for a in qkv(T, S, 4, 2))
    q_pos = np.arange(S - T, S)
    want = attention(q, k, v, causal_mask(q_pos, np.arange(S)), 0.25)
    dev = Device("sim")
    tiles = []
    real_mask = causal_mask
    monkeypatch.setattr(mha, "causal_mask", lambda qp, kp: tiles.append(len(qp)) or real_mask(qp, kp))
    got = attention_blocked(*map(dev.wrap, (q, k, v, q_pos)), 0.25, mask_fn=mha.causal_mask)
    assert tiles == [T]                                            # one query block
    assert_close("device blocks vs one-shot (float32)", np.asarray(dev.unwrap(got, "out")), want, 1e-6)
    tiles.clear()
    host = attention_blocked(q, k, v, q_pos, 0.25, mask_fn=mha.causal_mask)
    assert tiles == [256, T - 256]
    assert_close("host blocks vs one-shot (float32)", host, want, 1e-6)
    monkeypatch.setattr(mha, "BLOCK_ELEMS_DEVICE", 4 * 512 * 100)                  # 100 queries' scores: 256 a block
    tiles.clear()
    attention_blocked(*map(dev.wrap, (q, k, v, q_pos)), 0.25, mask_fn=mha.causal_mask)
    assert tiles == [256, T - 256]


def test_attend_records_like_the_one_shot():
    """attend: one shot traces kq, kq_soft_max and kqv; blocked traces kqv only, the same [H, T, V]."""
    q, k, v = qkv(9, 20, 4, 2)
    q_pos = np.arange(11, 20)
    recs = ({}, {})
    outs = [attend(q, k, v, q_pos, 0.5, one_shot=one, record=lambda n, il, a, r=r: r.__setitem__(n, a), il=0,
                   dtype=np.float64) for one, r in zip((True, False), recs)]
    assert set(recs[0]) == {"kq", "kq_soft_max", "kqv"} and set(recs[1]) == {"kqv"}
    assert recs[0]["kq"].shape == (4, 9, 20) and recs[1]["kqv"].shape == (4, 9, 12)
    assert np.max(np.abs(outs[0] - outs[1])) <= 1e-12
    assert np.max(np.abs(recs[0]["kqv"] - recs[1]["kqv"])) <= 1e-12
