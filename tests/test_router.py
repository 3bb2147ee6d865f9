"""Expert routing (refengine.moe.router.route) against a plain per-token reference written from
`build_moe_ffn`'s description: every gating function, selection bias, group routing, norm + scale."""
from __future__ import annotations

import math

import numpy as np
import pytest
from numerics import assert_close

from refengine.moe.router import (GATING_SIGMOID, GATING_SOFTMAX, GATING_SOFTMAX_WEIGHT, GATING_SQRT_SOFTPLUS,
                                  gate_probs, route, softmax_topk)
from refengine.trace import Trace

GATINGS = [GATING_SOFTMAX, GATING_SIGMOID, GATING_SOFTMAX_WEIGHT, GATING_SQRT_SOFTPLUS]


def gate_one(x: list[float], gating: int) -> list[float]:
    if gating == GATING_SOFTMAX:
        m = max(x)
        e = [math.exp(v - m) for v in x]
        return [v / sum(e) for v in e]
    if gating == GATING_SIGMOID:
        return [1 / (1 + math.exp(-v)) for v in x]
    if gating == GATING_SQRT_SOFTPLUS:
        return [math.sqrt(v if v > 20 else math.log(1 + math.exp(v))) for v in x]
    return list(x)                                                    # softmax_weight: probs = logits


def reference(logits, k, *, gating, bias=None, norm_w=False, w_scale=0.0, n_groups=0, n_group_used=0):
    """One token at a time, in Python floats."""
    T, E = logits.shape
    ids, weights = np.zeros((T, k), np.int64), np.zeros((T, k))
    for t in range(T):
        p = gate_one([float(v) for v in logits[t]], gating)
        sel = [p[e] + (float(bias[e]) if bias is not None else 0.0) for e in range(E)]
        if n_groups > 1:
            n = E // n_groups
            score = [sum(sorted(sel[g * n:(g + 1) * n], reverse=True)[:2]) for g in range(n_groups)]
            keep = sorted(range(n_groups), key=lambda g: -score[g])[:n_group_used]
            sel = [sel[e] if e // n in keep else -math.inf for e in range(E)]
        top = sorted(range(E), key=lambda e: -sel[e])[:k]
        w = [p[e] for e in top]
        if gating == GATING_SOFTMAX_WEIGHT:
            w = gate_one(w, GATING_SOFTMAX)
        if norm_w:
            s = max(sum(w), 6.103515625e-5)
            w = [v / s for v in w]
        if w_scale not in (0.0, 1.0):
            w = [v * w_scale for v in w]
        ids[t], weights[t] = top, w
    return ids, weights


def logits_for(T=9, E=16, seed=0, scale=2.0):
    return (np.random.default_rng(seed).standard_normal((T, E)) * scale).astype(np.float32)


@pytest.mark.parametrize("gating", GATINGS)
@pytest.mark.parametrize("opts", [dict(), dict(norm_w=True), dict(norm_w=True, w_scale=2.5),
                                  dict(bias=True, norm_w=True, w_scale=2.5),
                                  dict(bias=True, n_groups=4, n_group_used=2, norm_w=True, w_scale=2.5)])
def test_route_matches_reference(gating, opts):
    lg = logits_for()
    opts = dict(opts)
    if opts.pop("bias", False):
        opts["bias"] = (np.random.default_rng(9).standard_normal(16) * 0.5).astype(np.float32)
    ids, w = route(lg, 4, gating=gating, **opts)
    rids, rw = reference(lg, 4, gating=gating, **opts)
    np.testing.assert_array_equal(ids, rids)
    assert ids.dtype == np.int32 and w.dtype == np.float32
    assert_close(f"gating {gating} {opts}", w, rw, 1e-6)


def test_bias_selects_but_does_not_weight():
    """A large bias on expert 0 forces it into every token's set; its weight stays its unbiased prob."""
    lg = logits_for(T=5, E=8, seed=1)
    bias = np.zeros(8, np.float32)
    bias[0] = 100.0
    tr = Trace()
    ids, w = route(lg, 2, gating=GATING_SIGMOID, bias=bias, record=tr, il=3)
    assert (ids[:, 0] == 0).all()
    probs = 1 / (1 + np.exp(-lg.astype(np.float64)))
    assert_close("weights = unbiased probs", w, np.take_along_axis(probs, ids, 1), 1e-6)
    assert_close("ffn_moe_probs_biased", tr["ffn_moe_probs_biased-3"], probs + bias, 1e-6)
    assert_close("ffn_moe_probs", tr["ffn_moe_probs-3"], probs, 1e-6)


def test_groups_use_biased_scores():
    """Group choice follows probs + bias: a bias that lifts group 3 makes it win although its probs are lowest."""
    G = 4                                                   # 8 experts in 4 groups
    lg = np.tile(np.array([3, 2.9, 2, 1.9, 1, 0.9, -1, -1.1], np.float32), (2, 1))
    bias = np.array([0, 0, 0, 0, 0, 0, 5, 5], np.float32)
    tr = Trace()
    ids, _ = route(lg, 2, gating=GATING_SIGMOID, bias=bias, n_groups=G, n_group_used=1, record=tr, il=0)
    assert set(ids[0].tolist()) == {6, 7}
    assert (tr["ffn_moe_group_topk-0"][:, 0] == 3).all()
    assert np.isneginf(tr["ffn_moe_probs_masked-0"][:, :6]).all()


@pytest.mark.parametrize("gating", GATINGS)
def test_topk_equal_to_expert_count(gating):
    lg = logits_for(T=4, E=6, seed=2)
    ids, w = route(lg, 6, gating=gating, norm_w=True)
    rids, rw = reference(lg, 6, gating=gating, norm_w=True)
    np.testing.assert_array_equal(ids, rids)
    assert_close("k = E", w, rw, 1e-6)
    if gating != GATING_SOFTMAX_WEIGHT:
        assert_close("k = E, normalized weights sum to 1", w.sum(1), np.ones(4), 1e-6)


def test_norm_clamp_and_trace_names():
    """A sum below 2^-14 is clamped before dividing; llama.cpp's names for every step are recorded."""
    lg = np.full((2, 4), -30.0, np.float32)                    # sigmoid ~ 1e-13: sum far below the clamp
    tr = Trace()
    _, w = route(lg, 2, gating=GATING_SIGMOID, norm_w=True, w_scale=2.0, record=tr, il=1)
    p = 1 / (1 + math.exp(30.0))
    assert_close("clamped", w, np.full((2, 2), 2 * p / 6.103515625e-5), 1e-6)
    assert {"ffn_moe_probs-1", "ffn_moe_argsort-1", "ffn_moe_topk-1", "ffn_moe_weights-1", "ffn_moe_weights_sum-1",
            "ffn_moe_weights_sum_clamped-1", "ffn_moe_weights_norm-1", "ffn_moe_weights_scaled-1"} <= set(tr)
    assert tr["ffn_moe_argsort-1"].shape == (2, 4) and tr["ffn_moe_topk-1"].shape == (2, 2)


def test_sqrt_softplus_float32_formula():
    """ggml's op_softplus: x above 20 passes through; log(1 + exp(x)) in float32 underflows to 0 below ~-17."""
    x = np.array([[25.0, 20.5, 0.0, -5.0, -20.0]], np.float32)
    p = gate_probs(x, GATING_SQRT_SOFTPLUS)
    assert p[0, 0] == np.float32(5.0) and p[0, 1] == np.sqrt(np.float32(20.5))
    assert p[0, 4] == 0.0                                       # log1p would give ~4.5e-5 here
    assert_close("softplus mid", p[0, 2:4], np.sqrt(np.log1p(np.exp([0.0, -5.0]))), 1e-6)


def test_softmax_topk_is_route_softmax():
    lg = logits_for(seed=4)
    for kw in (dict(norm_w=False), dict(norm_w=True, w_scale=2.5), dict(norm_w=True, n_groups=4, n_group_used=3)):
        a = softmax_topk(lg, 3, **kw)
        b = route(lg, 3, gating=GATING_SOFTMAX, **kw)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
