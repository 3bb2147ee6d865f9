"""Gated DeltaNet (GDN, Qwen3-Next): the delta rule with one scalar decay per head.

Legend: T tokens, Hk key heads, Hv value heads (Hv = r * Hk), K key head dim, V value head dim.

    g_t[h]    = softplus(a_t[h] + dt_bias[h]) * ssm_a[h]      ssm_a = -exp(A_log) < 0, so g <= 0, decay in (0, 1]
    beta_t[h] = sigmoid(b_t[h])
    S[h]      = e^{g_t[h]} S[h];  S[h] += k_t beta_t (v_t - S[h]^T k_t)^T;  o_t = S[h]^T q_t / sqrt(V)

The two forms, side by side (refengine.attention.delta_rule has the derivation):
`recurrent` is llama.cpp's fused `ggml_gated_delta_net` (its default for prefill and decode);
`chunked` is the form of the paper and of llama.cpp's non-fused fallback, with its chunk of 64
(src/models/delta-net-base.cpp:61). q and k are L2-normalized first with the rms eps inside the sqrt
(`delta_rule.l2_norm`). Value head h reads key head h // r in qwen3next (an explicit interleaved repeat,
src/models/qwen3next.cpp:518-537): `expand_heads`.
"""
from __future__ import annotations

import numpy as np

from . import delta_rule
from .delta_rule import l2_norm  # noqa: F401  (the norm the layers apply to q and k)

CHUNK = 64


def expand_heads(x: np.ndarray, r: int) -> np.ndarray:
    """[T, Hk, K] -> [T, Hk*r, K]: value head h uses key head h // r (qwen3next's interleaved mapping)."""
    return np.repeat(x, r, axis=1)


def recurrent(q, k, v, g, beta, S=None):
    """q, k: [T, Hv, K], v: [T, Hv, V], g: [T, Hv] (scalar decay per head), beta: [T, Hv], S: [Hv, K, V] | None
    -> (o [T, Hv, V], S)."""
    assert g.ndim == 2, "GDN decays each head by one scalar: g is [T, H]"
    return delta_rule.recurrent(q, k, v, g, beta, S)


def chunked(q, k, v, g, beta, S=None, *, chunk=CHUNK):
    """The chunked form of `recurrent` (same arguments, same result up to float rounding)."""
    assert g.ndim == 2, "GDN decays each head by one scalar: g is [T, H]"
    return delta_rule.chunked(q, k, v, g, beta, S, chunk=chunk)
