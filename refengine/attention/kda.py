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

Below them, `kda_layer`: the whole KDA sub-block of kimi-linear (projections, short convs with their carried
tails, gates, the recurrence, the gated output norm), with `KDAConfig` switches for kimi-k3's variants.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


from ..cache import RecurrentState
from ..errors import ConfigError
from ..ops import rms_norm
from ..ops.activations import sigmoid, silu, softplus
from ..weights import W
from . import delta_rule
from .delta_rule import l2_norm  # noqa: F401  (the norm the layers apply to q and k)
from .short_conv import causal_conv

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


# ---------------------------------------------------------------- the KDA layer (kimi-linear; kimi-k3 options)
#
# llama.cpp: src/models/kimi-linear.cpp:175-232 (causal_conv1d) and :288-384 (the KDA branch); kimi-k3's
# variant src/models/kimi-k3.cpp:399-479. Legend: T tokens, D model dim, H heads, dh head dim, d_in = H*dh,
# Kc conv kernel (`ssm.conv_kernel`).
#
#     q, k, v = h @ attn_q.T, h @ attn_k.T, h @ attn_v.T        (or h @ attn_qkv.T split in thirds)  [T, d_in]
#     q, k, v = silu(short_conv(., ssm_conv1d_{q,k,v}))          one conv tail per stream, q|k|v in one state
#     z       = (h @ ssm_f_a.T) @ ssm_f_b.T + ssm_dt.bias        [T, d_in] -> [T, H, dh]
#     g       = softplus(z) * ssm_a[h]                           (kimi-linear; ssm_a = -exp(A_log))
#             | lb * sigmoid(-ssm_a[h] * z)                      (kimi-k3 with kda.gate_lower_bound lb)
#     beta    = sigmoid(h @ ssm_beta.T)                          [T, H]
#     o, S    = recurrent(l2(q), l2(k), v, g, beta, S)           [T, H, dh]
#     gate    = (h @ ssm_g_a.T) @ ssm_g_b.T | h @ ssm_g.T        (low rank: kimi-linear; full rank: kimi-k3)
#     y       = (rms_norm(o) * ssm_norm * sigmoid(gate)).reshape(T, d_in) @ attn_output.T

STREAMS = ("q", "k", "v")


@dataclass(frozen=True)
class KDAConfig:
    n_head: int                          # attention.head_count                                        H
    head_dim: int                        # kda.head_dim (key = value head dim)                          dh
    d_conv: int                          # ssm.conv_kernel                                              Kc
    rms_eps: float                       # attention.layer_norm_rms_epsilon (l2 norms and output norm)
    gate_lower_bound: float | None = None    # kimi-k3 kda.gate_lower_bound: g = lb * sigmoid(-ssm_a * z)
    full_rank_gate: bool = False         # kimi-k3: output gate `ssm_g` {D, d_in} instead of ssm_g_a / ssm_g_b
    separate_qkv: bool = False           # kimi-k3: attn_q/k/v required (its graph never reads attn_qkv)
    ssm_a_1d: bool = False               # kimi-k3: ssm_a is exactly {H}; kimi-linear: {1, H, 1, 1} or {1, H}
    beta_traced_after_sigmoid: bool = False  # kimi-k3 names `kda_beta` after the sigmoid, kimi-linear before

    @property
    def d_in(self) -> int:
        return self.n_head * self.head_dim


def kda_table(gf, il: int, kc: KDAConfig) -> list[W]:
    """The KDA layer's tensors (kimi-linear.cpp:52-109). Shapes NumPy order; `same_ne` accepts the 4-D and 3-D
    conv weights ({Kc,1,d_in,1} / {Kc,1,d_in}) and ssm_a {1,H,1,1} / {1,H}, as llama.cpp's two tries do.

    Optional tensors the loader accepts but the KDA graph never applies (plain ggml_mul_mat, kimi-linear.cpp:
    300-379): attn_q/k/v(/qkv) .bias, and the generic pass's .scale / .input_scale of attn_q/k/v/qkv,
    attn_output and ssm_beta (llama-model.cpp:1634-1727). They are loaded (shape-checked) and ignored."""
    p = f"blk.{il}."
    H, dh, d_in, Kc = kc.n_head, kc.head_dim, kc.d_in, kc.d_conv
    D = lambda c, s: c.n_embd                                                     # noqa: E731
    ONE = lambda c, s: (1,)                                                       # noqa: E731
    t = [W(f"ssm_conv1d_{x}", p + f"ssm_conv1d_{x}.weight", lambda c, s: (d_in, 1, Kc), dense=True,
           accepts=("F32",), refuse_others=True)     # ggml_ssm_conv reads float (ggml-cpu ops.cpp asserts nb[0])
         for x in STREAMS]
    fused = not kc.separate_qkv and p + "attn_qkv.weight" in gf
    names = ["attn_qkv"] if fused else [f"attn_{x}" for x in STREAMS]
    if fused:
        t += [W("attn_qkv", p + "attn_qkv.weight", lambda c, s: (3 * d_in, D(c, s))),
              W("attn_qkv_bias", p + "attn_qkv.bias", lambda c, s: (3 * d_in,), required=False, dense=True)]
    else:
        t += [W(f"attn_{x}", p + f"attn_{x}.weight", lambda c, s: (d_in, D(c, s))) for x in STREAMS]
    # biases of q/k/v: create_tensor_qkv loads them (without a fused bias) whichever projection form is used
    t += [W(f"attn_{x}_bias", p + f"attn_{x}.bias", lambda c, s: (d_in,), required=False, dense=True)
          for x in STREAMS]
    # the low-rank projections follow the file type (conversion/kimi_linear.py): any matmul type, not "small"
    t += [W("ssm_f_a", p + "ssm_f_a.weight", lambda c, s: (dh, D(c, s))),
          W("ssm_f_b", p + "ssm_f_b.weight", lambda c, s: (d_in, dh)),
          W("ssm_beta", p + "ssm_beta.weight", lambda c, s: (H, D(c, s))),
          W("ssm_a", p + "ssm_a", (lambda c, s: (H,)) if kc.ssm_a_1d else (lambda c, s: (H, 1)), dense=True),
          W("ssm_dt_b", p + "ssm_dt.bias", lambda c, s: (d_in,), dense=True)]
    if kc.full_rank_gate:
        t.append(W("ssm_g", p + "ssm_g.weight", lambda c, s: (d_in, D(c, s))))
    else:
        t += [W("ssm_g_a", p + "ssm_g_a.weight", lambda c, s: (dh, D(c, s))),
              W("ssm_g_b", p + "ssm_g_b.weight", lambda c, s: (d_in, dh))]
    t += [W("ssm_norm", p + "ssm_norm.weight", lambda c, s: (dh,), dense=True),
          W("attn_output", p + "attn_output.weight", lambda c, s: (D(c, s), d_in))]
    for n in names + ["attn_output", "ssm_beta"]:                                 # generic pass, unused by KDA
        t += [W(f"{n}_scale", p + f"{n}.scale", ONE, required=False, dense=True),
              W(f"{n}_input_scale", p + f"{n}.input_scale", ONE, required=False, dense=True)]
    return t


FORMS = ("recurrent", "chunked")      # llama.cpp's fused token-by-token kernel (the default), the chunked form


def new_state(kc: KDAConfig, form: str = "recurrent") -> RecurrentState:
    """Zero conv tails and delta state (a new sequence); filled by the first `kda_layer` call. `form`: the
    delta rule's form this sequence runs (FORMS)."""
    if form not in FORMS:
        raise ConfigError(f"KDA delta-rule form {form!r} is not one of {', '.join(FORMS)}")
    return RecurrentState(form=form)


def hybrid_new_state(cfg, attn_form: str | None = None) -> list:
    """The state of a KDA + MLA hybrid (kimi-linear, kimi-k3), per layer: KDA's RecurrentState, or the MLA cache
    of the form asked (llama.cpp's by default). attn_form: an MLA form (absorbed / naive) for the MLA layers,
    or "chunked" for the KDA layers' delta rule."""
    from . import mla
    kda_form = "chunked" if attn_form == "chunked" else "recurrent"
    mla_form = attn_form if attn_form in mla.FORMS else None
    return [new_state(s.attn_cfg, kda_form) if s.attn == "kda" else
            mla.new_state(s.attn_cfg, mla_form or mla.llama_form(s.attn_cfg)) for s in cfg.layers]


def gate_decay(z, ssm_a, kc: KDAConfig):
    """z [T, H, dh] (f_b(f_a(h)) + dt_bias), ssm_a [H] (= -exp(A_log)) -> log decay g [T, H, dh] (<= 0)."""
    a = ssm_a.reshape(1, kc.n_head, 1).astype(np.float32)
    if kc.gate_lower_bound is None:
        return softplus(z) * a                                                   # kimi-linear.cpp:314-324
    return np.float32(kc.gate_lower_bound) * sigmoid(-a * z)                      # kimi-k3.cpp:420-439


def kda_layer(h, w, *, kc: KDAConfig, il: int, state: RecurrentState, rt) -> np.ndarray:
    """One KDA sub-block: h [T, D] (attn_norm output) -> [T, D] (before the residual add). `state` is updated
    in place: conv [Kc-1, 3*d_in] (q|k|v tails), ssm [H, dh, dh] (key x value per head)."""
    T, H, dh, d_in = h.shape[0], kc.n_head, kc.head_dim, kc.d_in
    if getattr(w, "attn_qkv", None) is not None:
        qkv = rt.matmul(h, w.attn_qkv)                                            # [T, 3*d_in]
        proj = [np.ascontiguousarray(qkv[:, i * d_in:(i + 1) * d_in]) for i in range(3)]
    else:
        proj = [rt.matmul(h, getattr(w, f"attn_{x}")) for x in STREAMS]           # 3 x [T, d_in]
    tails = [None] * 3 if state.conv is None else np.split(state.conv, 3, axis=1)  # 3 x [Kc-1, d_in]
    outs, new_tails = [], []
    for name, x, wc, tail in zip(STREAMS, proj, (getattr(w, f"ssm_conv1d_{x}").reshape(d_in, kc.d_conv) for x in STREAMS), tails):
        y, nt = causal_conv(x, wc, tail)                                          # [T, d_in], [Kc-1, d_in]
        outs.append(silu(y).reshape(T, H, dh))                                    # [T, d_in] -> [T, H, dh]
        rt.record(f"kda_{name}_conv", il, outs[-1])                               # kimi-k3's names
        new_tails.append(nt)
    state.conv = np.concatenate(new_tails, axis=1)                                # [Kc-1, 3*d_in]
    q, k, v = outs                                                                # [T, H, dh] each

    fa = rt.matmul(h, w.ssm_f_a)                                                  # [T, dh]
    rt.record("kda_f_a", il, fa)              # untraced in llama.cpp: the llamacpp-mode flip census reads it
    z = rt.matmul(fa, w.ssm_f_b)                                                  # [T, d_in]
    rt.record("g1 f_b(f_a(cur))", il, z)
    g = gate_decay((z + w.ssm_dt_b).reshape(T, H, dh), w.ssm_a, kc)               # [T, H, dh]
    rt.record("kda_g1", il, g)
    b = rt.matmul(h, w.ssm_beta)                                                  # [T, H]
    beta = sigmoid(b)
    rt.record("kda_beta", il, beta if kc.beta_traced_after_sigmoid else b)

    q, k = l2_norm(q, kc.rms_eps), l2_norm(k, kc.rms_eps)
    rule = chunked if state.form == "chunked" else recurrent                      # the state's form
    o, S = rule(q, k, v, g, beta, state.ssm)                                      # [T, H, dh], [H, dh, dh]
    state.ssm = S
    rt.record("attn_output", il, o)
    rt.record("kda_scan_out", il, o)                                              # kimi-k3's name
    rt.record("new_state", il, S.transpose(0, 2, 1))                              # ggml keeps S^T per head

    if kc.full_rank_gate:
        gate = rt.matmul(h, w.ssm_g)                                              # [T, d_in]
    else:
        ga = rt.matmul(h, w.ssm_g_a)                                              # [T, dh]
        rt.record("kda_g_a", il, ga)          # untraced in llama.cpp (as kda_f_a)
        gate = rt.matmul(ga, w.ssm_g_b)                                           # [T, d_in]
        rt.record("g2 g_b(g_a(cur_2d))", il, gate)
    rt.record("kda_g2", il, gate.reshape(T, H, dh))                               # kimi-k3's name
    o = rms_norm(o, w.ssm_norm, kc.rms_eps)                                       # [T, H, dh] per head
    rt.record("kda_normed", il, o)
    o = (o * sigmoid(gate.reshape(T, H, dh))).reshape(T, d_in)                   # [T, d_in]
    rt.record("kda_gated", il, o)             # untraced in llama.cpp (as kda_f_a)
    y = rt.matmul(np.ascontiguousarray(o), w.attn_output)                         # [T, D]
    rt.record("kda_out", il, y)
    return y
