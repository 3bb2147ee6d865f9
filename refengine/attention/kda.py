"""Kimi Delta Attention (KDA, Kimi Linear / Kimi K3): the delta rule with a decay per key channel.

Legend: T tokens, H heads (KDA has as many key as value heads), K = V = head dim (`kda.head_dim`).

    g_t[h, i] = ssm_a[h] * softplus(f_t[h, i] + dt_bias[h, i])           the softplus decay
              = lb * sigmoid(-ssm_a[h] * (f_t[h, i] + dt_bias[h, i]))    bounded by `kda.gate_lower_bound` lb (< 0)
    S[h]      = diag(e^{g_t[h, :]}) S[h];  S[h] += k_t beta_t (v_t - S[h]^T k_t)^T;  o_t = S[h]^T q_t / sqrt(V)

GDN's scalar forget gate becomes a diagonal one: each key channel i of the state forgets at its own rate,
so the map from keys to values keeps some key directions longer than others.

The two forms, side by side (refengine.attention.delta_rule has the derivation): `recurrent` is llama.cpp's
fused `ggml_gated_delta_net` with a [K]-wide gate (ggml/src/ggml-cpu/ops.cpp:11231-11241, decay along the
key axis); `chunked` is the paper's form with llama.cpp's KDA chunk of 16 (src/models/delta-net-base.cpp:61).
llama.cpp's non-fused single-token path decays the value axis instead (delta-net-base.cpp:335-340); the
default context never takes it, and it is not reproduced here.

Below them, `kda_layer`: the whole KDA sub-block (projections, short convs with their carried tails, gates,
the recurrence, the gated output norm). `KDAConfig` holds the math, with its two alternatives (the bounded
sigmoid decay, a full-rank output gate); what differs between archs but is not math is the arch's data: the
names its llama.cpp graph gives the traced tensors (`kda_layer(names=...)`, see `POINTS`) and how its loader
lays out the tensors (`kda_table(fused_qkv=..., ssm_a_shape=...)`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from ..cache import RecurrentState
from ..errors import ConfigError
from ..ops import as_array, contiguous, rms_norm, rms_norm_gated
from ..ops.arrays import fused_op
from ..ops.activations import sigmoid, softplus
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


# ---------------------------------------------------------------- the KDA layer
#
# llama.cpp: src/models/kimi-linear.cpp:175-232 (causal_conv1d) and :288-384 (the KDA branch); the bounded
# decay and the full-rank output gate: src/models/kimi-k3.cpp:399-479. Legend: T tokens, D model dim, H heads,
# dh head dim, d_in = H*dh, Kc conv kernel (`ssm.conv_kernel`).
#
#     q, k, v = h @ attn_q.T, h @ attn_k.T, h @ attn_v.T        (or h @ attn_qkv.T split in thirds)  [T, d_in]
#     q, k, v = silu(short_conv(., ssm_conv1d_{q,k,v}))          one conv tail per stream, q|k|v in one state
#     z       = (h @ ssm_f_a.T) @ ssm_f_b.T + ssm_dt.bias        [T, d_in] -> [T, H, dh]
#     g       = softplus(z) * ssm_a[h]                           (ssm_a = -exp(A_log))
#             | lb * sigmoid(-ssm_a[h] * z)                      (gate_lower_bound lb)
#     beta    = sigmoid(h @ ssm_beta.T)                          [T, H]
#     o, S    = recurrent(l2(q), l2(k), v, g, beta, S)           [T, H, dh]   (l2 eps: l2_eps, or rms_eps)
#     gate    = (h @ ssm_g_a.T) @ ssm_g_b.T | h @ ssm_g.T        (low rank | full_rank_gate)
#     y       = (rms_norm(o) * ssm_norm * sigmoid(gate)).reshape(T, d_in) @ attn_output.T

STREAMS = ("q", "k", "v")


@dataclass(frozen=True)
class KDAConfig:
    n_head: int                          # attention.head_count                                        H
    head_dim: int                        # kda.head_dim (key = value head dim)                          dh
    d_conv: int                          # ssm.conv_kernel                                              Kc
    rms_eps: float                       # attention.layer_norm_rms_epsilon (l2 norms and output norm)
    gate_lower_bound: float | None = None    # kda.gate_lower_bound lb: g = lb * sigmoid(-ssm_a * z) (None: softplus)
    full_rank_gate: bool = False         # output gate h @ ssm_g.T {D, d_in} instead of (h @ ssm_g_a.T) @ ssm_g_b.T
    l2_eps: float | None = None          # eps of q's and k's l2 norms: None = rms_eps (kimi-linear, kimi-k3); glm5-next
                                         # fixes it at 1e-6 (glm5-next.cpp:737-740)

    @property
    def d_in(self) -> int:
        return self.n_head * self.head_dim


def kda_table(gf, il: int, kc: KDAConfig, *, fused_qkv: bool = True,
              ssm_a_shape: Callable[[int], tuple[int, ...]] = lambda H: (H, 1)) -> list[W]:
    """The KDA layer's tensors (kimi-linear.cpp:52-109). Shapes NumPy order; `same_ne` accepts the 4-D and 3-D
    conv weights ({Kc,1,d_in,1} / {Kc,1,d_in}) and ssm_a {1,H,1,1} / {1,H}, as llama.cpp's two tries do.

    The arch's loader layout: `fused_qkv` whether one attn_qkv {D, 3 d_in} stands in for attn_q/k/v when the file
    has it (create_tensor_qkv's first try; False: the graph reads attn_q/k/v only, and they are required);
    `ssm_a_shape(H)` the NumPy shape ssm_a must have.

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
    fused = fused_qkv and p + "attn_qkv.weight" in gf
    names = ["attn_qkv"] if fused else [f"attn_{x}" for x in STREAMS]
    if fused:
        t += [W("attn_qkv", p + "attn_qkv.weight", lambda c, s: (3 * d_in, D(c, s))),
              W("attn_qkv_bias", p + "attn_qkv.bias", lambda c, s: (3 * d_in,), required=False, dense=True)]
    else:
        t += [W(f"attn_{x}", p + f"attn_{x}.weight", lambda c, s: (d_in, D(c, s))) for x in STREAMS]
    # biases of q/k/v: create_tensor_qkv loads them (without a fused bias) whichever projection form is used
    t += [W(f"attn_{x}_bias", p + f"attn_{x}.bias", lambda c, s: (d_in,), required=False, dense=True)
          for x in STREAMS]
    # the gate's low-rank pair and the beta projection (qwen3next's ssm_ba counterpart) are small matrices: llama.cpp
    # multiplies them in any type (llama-quantize writes them Q8_0 at MOSTLY_Q8_0), lint flags a quantized one
    t += [W("ssm_f_a", p + "ssm_f_a.weight", lambda c, s: (dh, D(c, s)), small=True),
          W("ssm_f_b", p + "ssm_f_b.weight", lambda c, s: (d_in, dh), small=True),
          W("ssm_beta", p + "ssm_beta.weight", lambda c, s: (H, D(c, s)), small=True),
          W("ssm_a", p + "ssm_a", lambda c, s: ssm_a_shape(H), dense=True),
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


def gate_decay(z, ssm_a, kc: KDAConfig):
    """z [T, H, dh] (f_b(f_a(h)) + dt_bias), ssm_a [H] (= -exp(A_log)) -> log decay g [T, H, dh] (<= 0)."""
    return decay(z, ssm_a, kc.n_head, kc.gate_lower_bound)


def decay(z, ssm_a, H: int, lb: float | None):
    """`gate_decay` of H heads under the lower bound lb (None: softplus)."""
    a = as_array(ssm_a.reshape(1, H, 1), np.float32)                             # [1, H, 1] (the weight)
    if lb is None:
        return softplus(z) * a                                                   # kimi-linear.cpp:314-324
    return np.float32(lb) * sigmoid(-(a * z))                                    # kimi-k3.cpp:420-439


def gates(z, b, bias, A, dh: int, lb):
    """A KDA layer's gates: z [T, H * dh] (f_b(f_a(h))), b [T, H] (the beta logits), bias [H * dh] (ssm_dt_b),
    A [H] (ssm_a), lb the gate's lower bound or None -> (g [T, H, dh] = `gate_decay(z + bias)`, beta = sigmoid(b)
    [T, H]). A GPU: one launch (cuda/fused.py `kda_gates`)."""
    if (k := fused_op(z, "kda_gates")) is not None and (r := k(z, b, bias, A, dh, lb)) is not None:
        return r
    T, H = b.shape
    return decay((z + bias).reshape(T, H, dh), A, H, lb), sigmoid(b)


# The points `kda_layer` can trace, by concept; an arch passes `names` {point: the name, or the names, its llama.cpp
# graph gives that tensor} and only the points it names are recorded (graphs name different points: one the beta
# logits, another beta after the sigmoid). Without `names` every point is recorded under its own name.
POINTS = (
    "q_conv", "k_conv", "v_conv",    # [T, H, dh]   silu(short_conv(.)) of each stream
    "f_a",                           # [T, dh]      h @ ssm_f_a.T
    "f_b",                           # [T, d_in]    f_a @ ssm_f_b.T
    "g",                             # [T, H, dh]   the log decay
    "beta_logits", "beta",           # [T, H]       h @ ssm_beta.T, then its sigmoid
    "scan_out",                      # [T, H, dh]   the delta rule's output o
    "state",                         # [H, dh, dh]  the new state, S^T per head (ggml's layout)
    "g_a",                           # [T, dh]      h @ ssm_g_a.T (low-rank output gate only)
    "gate", "gate_heads",            # [T, d_in]    the output gate before its sigmoid; the same as [T, H, dh]
    "normed",                        # [T, H, dh]   rms_norm(o) * ssm_norm
    "gated",                         # [T, d_in]    normed * sigmoid(gate)
    "out",                           # [T, D]       gated @ attn_output.T
)


def kda_layer(h, w, *, kc: KDAConfig, il: int, state: RecurrentState, rt,
              names: Mapping[str, str | tuple[str, ...]] | None = None) -> np.ndarray:
    """One KDA sub-block: h [T, D] (attn_norm output) -> [T, D] (before the residual add). `state` is updated
    in place: conv [Kc-1, 3*d_in] (q|k|v tails), ssm [H, dh, dh] (key x value per head). `names`: the trace
    names of the POINTS the arch records."""
    def named(point):
        got = point if names is None else names.get(point, ())
        return (got,) if isinstance(got, str) else got

    def record(point, x):
        for name in named(point):
            rt.record(name, il, x)

    def reads(point):                         # whether the trace or teacher forcing reads the point's tensor
        return any(rt.reads(n, il) for n in named(point))

    T, H, dh, d_in = h.shape[0], kc.n_head, kc.head_dim, kc.d_in
    fused_qkv = getattr(w, "attn_qkv", None) is not None
    gw = [w.ssm_g] if kc.full_rank_gate else [w.ssm_g_a]
    ws = ([w.attn_qkv] if fused_qkv else [getattr(w, f"attn_{x}") for x in STREAMS]) + [w.ssm_f_a, w.ssm_beta] + gw
    # h's products, one launch a type where a device takes them; q, k, v may stay column views of it (the conv reads
    # strided rows), the others made C-contiguous (a copy where they are views)
    *proj, fa, b, g_in = rt.matmul_many(h, ws, strided=True)
    fa, b, g_in = contiguous(fa), contiguous(b), contiguous(g_in)
    if fused_qkv:                                                                 # [T, 3*d_in]
        proj = [proj[0][:, i * d_in:(i + 1) * d_in] for i in range(3)]
    tails = [None] * 3 if state.conv is None else np.split(state.conv, 3, axis=1)  # 3 x [Kc-1, d_in]
    outs, new_tails = [], []
    convs = (getattr(w, f"ssm_conv1d_{x}").reshape(d_in, kc.d_conv) for x in STREAMS)   # [d_in, Kc] each
    for name, x, wc, tail in zip(STREAMS, proj, convs, tails):
        y, nt = causal_conv(x, wc, tail, then_silu=True)                          # [T, d_in], [Kc-1, d_in]
        outs.append(y.reshape(T, H, dh))                                          # [T, d_in] -> [T, H, dh]
        record(f"{name}_conv", outs[-1])
        new_tails.append(nt)
    state.conv = np.concatenate(new_tails, axis=1)                                # [Kc-1, 3*d_in]
    q, k, v = outs                                                                # [T, H, dh] each

    record("f_a", fa)                                                             # [T, dh]
    z = rt.matmul(fa, w.ssm_f_b)                                                  # [T, d_in]
    record("f_b", z)
    g, beta = gates(z, b, w.ssm_dt_b, w.ssm_a, dh, kc.gate_lower_bound)          # [T, H, dh], [T, H]
    record("g", g)
    record("beta_logits", b)                                                      # [T, H]
    record("beta", beta)

    l2_eps = kc.rms_eps if kc.l2_eps is None else kc.l2_eps
    q, k = l2_norm(q, l2_eps), l2_norm(k, l2_eps)
    rule = chunked if state.form == "chunked" else recurrent                      # the state's form
    o, S = rule(q, k, v, g, beta, state.ssm)                                      # [T, H, dh], [H, dh, dh]
    state.ssm = S
    record("scan_out", o)
    record("state", S.transpose(0, 2, 1))                                         # ggml keeps S^T per head

    if kc.full_rank_gate:
        gate = g_in                                                               # [T, d_in]
    else:
        record("g_a", g_in)                                                       # [T, dh]
        gate = rt.matmul(g_in, w.ssm_g_b)                                         # [T, d_in]
    record("gate", gate)
    record("gate_heads", gate.reshape(T, H, dh))
    gate = gate.reshape(T, H, dh)
    if reads("normed"):                                                           # the norm kept apart
        o = rms_norm(o, w.ssm_norm, kc.rms_eps)                                   # [T, H, dh] per head
        record("normed", o)
        o = o * sigmoid(gate)
    else:                                                                         # (a GPU: one launch)
        o = rms_norm_gated(o, w.ssm_norm, kc.rms_eps, gate, "sigmoid")            # [T, H, dh]
    o = o.reshape(T, d_in)                                                        # [T, d_in]
    record("gated", o)
    y = rt.matmul(contiguous(o), w.attn_output)                         # [T, D]
    record("out", y)
    return y
