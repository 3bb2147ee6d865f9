"""Kimi Delta Attention (KDA, Kimi Linear / Kimi K3): the delta rule with a decay per key channel.

Legend: T tokens, H heads (KDA has as many key as value heads), K = V = head dim (`kda.head_dim`).

    g_t[h, i] = ssm_a[h] * softplus(f_t[h, i] + dt_bias[h, i])           kimi-linear (and K3 without a lower bound)
              = lb * sigmoid(-ssm_a[h] * (f_t[h, i] + dt_bias[h, i]))    K3 with `kda.gate_lower_bound` lb (< 0)
    S[h]      = diag(e^{g_t[h, :]}) S[h];  S[h] += k_t beta_t (v_t - S[h]^T k_t)^T;  o_t = S[h]^T q_t / sqrt(V)

GDN's scalar forget gate becomes a diagonal one: each key channel i of the state forgets at its own rate,
so the map from keys to values keeps some key directions longer than others.

The two forms, side by side (refengine.attention.delta_rule has the derivation): `recurrent` is llama.cpp's
fused `ggml_gated_delta_net` with a [K]-wide gate (ggml/src/ggml-cpu/ops.cpp:11231-11241, decay along the
key axis); `chunked` is the paper's form with llama.cpp's KDA chunk of 16 (src/models/delta-net-base.cpp:61).
llama.cpp's non-fused single-token path decays the value axis instead (delta-net-base.cpp:335-340); the
default context never takes it, and it is not reproduced here.
"""
from __future__ import annotations

from . import delta_rule
from .delta_rule import l2_norm  # noqa: F401  (the norm the layers apply to q and k)

CHUNK = 16


def recurrent(q, k, v, g, beta, S=None):
    """q, k: [T, H, K], v: [T, H, V], g: [T, H, K] (decay per key channel), beta: [T, H], S: [H, K, V] | None
    -> (o [T, H, V], S)."""
    assert g.ndim == 3, "KDA decays each key channel: g is [T, H, K]"
    return delta_rule.recurrent(q, k, v, g, beta, S)


def chunked(q, k, v, g, beta, S=None, *, chunk=CHUNK):
    """The chunked form of `recurrent` (same arguments, same result up to float rounding)."""
    assert g.ndim == 3, "KDA decays each key channel: g is [T, H, K]"
    return delta_rule.chunked(q, k, v, g, beta, S, chunk=chunk)
