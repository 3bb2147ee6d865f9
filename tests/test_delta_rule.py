"""The delta rule's two forms against each other (float64), and the short conv's carried tail.

Oracle against oracle: `recurrent` is llama.cpp's fused op step by step; `chunked` is the paper's form.
Lengths that are and are not multiples of the chunk, one token, a carried entering state; GDN (scalar
decay per head) and KDA (decay per key channel).
"""
import numpy as np
import pytest

from refengine.attention import delta_rule, gated_deltanet, kda
from refengine.attention.short_conv import causal_conv
from numerics import rel_rms

H, K, V = 3, 8, 8


def _inputs(T, per_channel, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = delta_rule.l2_norm(rng.standard_normal((T, H, K)).astype(dtype), 1e-6)
    k = delta_rule.l2_norm(rng.standard_normal((T, H, K)).astype(dtype), 1e-6)
    v = rng.standard_normal((T, H, V)).astype(dtype)
    shape = (T, H, K) if per_channel else (T, H)
    g = -np.log1p(np.exp(rng.standard_normal(shape))).astype(dtype) * 0.5        # g <= 0
    beta = 1 / (1 + np.exp(-rng.standard_normal((T, H)).astype(dtype)))
    S0 = rng.standard_normal((H, K, V)).astype(dtype) * 0.3
    return q, k, v, g, beta, S0


@pytest.mark.parametrize("mod", [gated_deltanet, kda], ids=["gdn", "kda"])
@pytest.mark.parametrize("T", [1, 15, 16, 17, 64, 100, 128])
@pytest.mark.parametrize("with_state", [False, True])
def test_recurrent_equals_chunked(mod, T, with_state):
    q, k, v, g, beta, S0 = _inputs(T, mod is kda, seed=T)
    S_in = S0 if with_state else None
    o_r, S_r = mod.recurrent(q, k, v, g, beta, S_in)
    o_c, S_c = mod.chunked(q, k, v, g, beta, S_in)
    assert rel_rms(o_r, o_c) <= 1e-6 and rel_rms(S_r, S_c) <= 1e-6, (rel_rms(o_r, o_c), rel_rms(S_r, S_c))
    assert rel_rms(o_r, o_c) <= 1e-12     # float64: the two forms are the same function


@pytest.mark.parametrize("mod", [gated_deltanet, kda], ids=["gdn", "kda"])
def test_state_carried_between_calls(mod):
    """Prefill 37 then decode one at a time equals one call over all 45 tokens."""
    q, k, v, g, beta, _ = _inputs(45, mod is kda, seed=3)
    o_all, S_all = mod.recurrent(q, k, v, g, beta)
    o_1, S = mod.chunked(q[:37], k[:37], v[:37], g[:37], beta[:37])
    outs = [o_1]
    for t in range(37, 45):
        o_t, S = mod.recurrent(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], S)
        outs.append(o_t)
    assert rel_rms(o_all, np.concatenate(outs)) <= 1e-12 and rel_rms(S_all, S) <= 1e-12


def test_decay_per_channel_reduces_to_scalar():
    """KDA with the same decay on every key channel is GDN."""
    q, k, v, g, beta, S0 = _inputs(20, False, seed=9)
    o_g, S_g = gated_deltanet.recurrent(q, k, v, g, beta, S0)
    o_k, S_k = kda.recurrent(q, k, v, np.repeat(g[:, :, None], K, axis=2), beta, S0)
    assert rel_rms(o_g, o_k) <= 1e-14 and rel_rms(S_g, S_k) <= 1e-14


def test_delta_rule_fits_a_linear_map():
    """No decay, beta = 1, orthonormal keys: after one pass the state maps each key to its value exactly."""
    rng = np.random.default_rng(1)
    keys = np.linalg.qr(rng.standard_normal((K, K)))[0]              # [K, K] orthonormal rows
    k = keys[:, None, :]                                              # [T=K, 1, K]
    v = rng.standard_normal((K, 1, V))
    _, S = delta_rule.recurrent(k.copy(), k, v, np.zeros((K, 1)), np.ones((K, 1)))
    assert np.allclose(keys @ S[0], v[:, 0], atol=1e-12)


def test_l2_norm_convention():
    x = np.random.default_rng(2).standard_normal((5, 16)).astype(np.float32)
    eps = 1e-3
    want = x / np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps)
    assert rel_rms(want, delta_rule.l2_norm(x, eps)) <= 1e-6


def test_causal_conv_tail():
    """Conv over 10 tokens equals conv over 6 then 4 with the tail carried; the tail is the last Kc-1 inputs."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((10, 6)).astype(np.float32)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    y, tail = causal_conv(x, w, None)
    y1, t1 = causal_conv(x[:6], w, None)
    y2, t2 = causal_conv(x[6:], w, t1)
    assert np.array_equal(y, np.concatenate([y1, y2])) and np.array_equal(tail, t2)
    assert np.array_equal(tail, x[-3:])
    # direct definition: y[t, c] = sum_j x[t - j, c] w[c, Kc-1-j] with zeros before the start
    xp = np.concatenate([np.zeros((3, 6), np.float32), x])
    want = sum(xp[j:j + 10] * w[:, j] for j in range(4))
    assert np.allclose(y, want, rtol=1e-6)
