"""The gated delta rule, in two forms: token by token (what llama.cpp runs) and chunked (what the papers train).

Legend: T tokens, H heads (value heads; q and k already mapped to them), K key head dim, V value head dim,
Ch chunk length. The state S[h] is a K x V matrix: a linear map from keys to values, fitted online.

One step per token t and head h (`ggml_gated_delta_net`, ggml/src/ggml-cpu/ops.cpp:11124-11276):

    S      = diag(exp(g_t)) S              decay: g_t [H] (GDN, one scalar per head) or [H, K] (KDA, per key channel)
    delta  = beta_t (v_t - S^T k_t)        the error of the current map on (k_t, v_t), scaled by the step beta_t
    S      = S + k_t delta^T               one step of online regression (the "delta rule")
    o_t    = S^T q_t / sqrt(V)             llama.cpp scales the output by 1/sqrt(S_v)

llama.cpp keeps each head's state transposed ([V, K] row-major); here it is [H, K, V], which is the same
numbers. Its non-fused fallbacks (src/models/delta-net-base.cpp: chunks of 64 for GDN, 16 for KDA) compute
the same function; the default context runs the fused sequential kernel for prefill and decode.

The chunked form (Yang et al., "Gated Delta Networks", 2024; "Kimi Linear", 2025) groups Ch tokens. With
the cumulative log decay G_t = sum_{s<=t in chunk} g_s and the entering state S0, unrolling the step gives

    delta_t = beta_t (v_t - (e^{G_t} * k_t)^T S0 - sum_{s<t} A_ts delta_s),   A_ts = sum_i k_t,i k_s,i e^{G_t,i - G_s,i}
    o_t     = (e^{G_t} * q_t)^T S0 + sum_{s<=t} B_ts delta_s,                 B_ts = sum_i q_t,i k_s,i e^{G_t,i - G_s,i}
    S_end   = e^{G_last} * S0 + sum_s (e^{G_last - G_s} * k_s) delta_s^T

so a chunk is one unit-lower-triangular solve (I + diag(beta) A_strict) Delta = diag(beta) (V - K~ S0) and
a few matrix products. Every exponent is G_t - G_s with s <= t, never positive (g <= 0), so nothing grows.
"""
from __future__ import annotations

import numpy as np

from ..ops.arrays import copy_like, fused_op


def _decay(g: np.ndarray, H: int, K: int) -> np.ndarray:
    """g: [T, H] (per head) or [T, H, K] (per key channel) -> [T, H, K]."""
    if g.ndim == 2:
        return np.broadcast_to(g[:, :, None], (g.shape[0], H, K))
    assert g.shape[1:] == (H, K), (g.shape, H, K)
    return g


def recurrent(q, k, v, g, beta, S=None, *, scale=None):
    """Token by token. q, k: [T, H, K], v: [T, H, V], g: [T, H] or [T, H, K], beta: [T, H], S: [H, K, V] or None
    -> (o [T, H, V], S [H, K, V]). Works in the inputs' dtype (float32 as llama.cpp, float64 for checks)."""
    T, H, K = q.shape
    V = v.shape[2]
    assert k.shape == (T, H, K) and v.shape[:2] == (T, H) and beta.shape == (T, H), (q.shape, k.shape, v.shape, beta.shape)
    dt = q.dtype
    scale = dt.type(1.0 / np.sqrt(V) if scale is None else scale)
    if (kf := fused_op(q, "delta_rule")) is not None and (r := kf(q, k, v, g, beta, S, scale)) is not None:
        return r                                     # a GPU: these steps, every token, in one launch (cuda/fused.py)
    S = np.zeros_like(q, shape=(H, K, V), dtype=dt) if S is None else copy_like(S, q, dt)   # [H, K, V], a copy
    g = _decay(g, H, K)
    o = np.empty_like(q, shape=(T, H, V), dtype=dt)
    for t in range(T):
        S *= np.exp(g[t]).astype(dt)[:, :, None]                                    # [H, K, V] decayed along K
        kv = np.einsum("hk,hkv->hv", k[t], S)                                       # [H, V]  S^T k
        delta = (v[t] - kv) * beta[t][:, None]                                      # [H, V]
        S += k[t][:, :, None] * delta[:, None, :]                                   # [H, K, V]  + k delta^T
        o[t] = np.einsum("hk,hkv->hv", q[t], S) * scale                             # [H, V]
    return o, S


def chunked(q, k, v, g, beta, S=None, *, chunk=64, scale=None):
    """The same function, Ch = `chunk` tokens at a time (the last chunk may be shorter). Shapes as `recurrent`."""
    T, H, K = q.shape
    V = v.shape[2]
    dt = q.dtype
    scale = dt.type(1.0 / np.sqrt(V) if scale is None else scale)
    S = np.zeros_like(q, shape=(H, K, V), dtype=dt) if S is None else copy_like(S, q, dt)
    g = _decay(g, H, K)
    o = np.empty_like(q, shape=(T, H, V), dtype=dt)
    for t0 in range(0, T, chunk):
        sl = slice(t0, min(T, t0 + chunk))
        qc, kc, vc, bc = q[sl], k[sl], v[sl], beta[sl]                              # [Ch, H, *]
        n = qc.shape[0]
        G = np.cumsum(g[sl], axis=0, dtype=dt)                                      # [Ch, H, K] cumulative log decay
        pair = np.exp(G[:, None] - G[None, :])                                      # [Ch(t), Ch(s), H, K]; used for s <= t
        causal = np.tril(np.ones((n, n), dtype=bool))                               # [Ch, Ch] s <= t
        A = np.einsum("thi,tshi,shi->hts", kc, pair, kc)                            # [H, Ch, Ch]
        B = np.einsum("thi,tshi,shi->hts", qc, pair, kc)                            # [H, Ch, Ch]
        A = np.where(np.tril(causal, -1)[None], A, 0)                               # strictly lower
        B = np.where(causal[None], B, 0)                                            # lower, diagonal included
        eG = np.exp(G)                                                              # [Ch, H, K]
        rhs = bc.T[:, :, None] * (vc.transpose(1, 0, 2) - np.einsum("thk,hkv->htv", eG * kc, S))   # [H, Ch, V]
        M = np.eye(n, dtype=dt)[None] + bc.T[:, :, None] * A                        # [H, Ch, Ch] unit lower
        delta = np.linalg.solve(M, rhs)                                             # [H, Ch, V]
        oc = np.einsum("thk,hkv->htv", eG * qc, S) + np.einsum("hts,hsv->htv", B, delta)   # [H, Ch, V]
        o[sl] = oc.transpose(1, 0, 2) * scale
        last = np.exp(G[-1][None] - G)                                              # [Ch, H, K]  e^{G_last - G_s}
        S = eG[-1][:, :, None] * S + np.einsum("shk,hsv->hkv", last * kc, delta)   # [H, K, V]
    return o, S


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis, as llama.cpp's delta-net layers compute it:
    `rms_norm(x, eps / n) * 1/sqrt(n)` (src/models/models.h:14-18), not `ggml_l2_norm` (eps outside the sqrt)."""
    from ..ops import rms_norm
    from ..ops.arrays import fused_op
    if (k := fused_op(x, "l2_norm")) is not None and (y := k(x, eps)) is not None:
        return y                                                         # a GPU: the same, in one launch
    n = x.shape[-1]
    return rms_norm(x, None, eps / n) * x.dtype.type(1.0 / np.sqrt(n))
