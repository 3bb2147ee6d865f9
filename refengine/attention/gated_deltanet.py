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
src/models/qwen3next.cpp:518-537): `expand_heads`; in qwen4exp it reads key head h % Hk (the converter reorders the
value heads to the tiled order the fused kernel broadcasts, ggml-cpu ops.cpp:11200): `tile_heads`.

Options of the layer as data (`GDNConfig`): `head_map` interleaved | tiled, `out_gate` silu (qwen3next) |
sigmoid (qwen4exp: o = rms_norm(o) * ssm_norm * sigmoid(z), src/models/qwen4exp.cpp:479-489), and `ba` fused
(one `ssm_ba` split per key-head group) | split (`ssm_beta` and `ssm_alpha`, one row per value head).

Below them, the whole qwen3next linear-attention sublayer (`gated_deltanet`: projections, conv, gates,
delta rule, gated norm, output), its tensor table `gdn_table`, its `GDNConfig` and `new_state`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache import RecurrentState
from ..errors import ConfigError, MissingTensorError
from ..ops import contiguous, rms_norm_gated, sigmoid, silu, softplus
from ..ops.arrays import fused_op
from ..ops.linear import linear, scale_bias
from ..weights import W
from . import delta_rule
from .delta_rule import l2_norm  # noqa: F401  (the norm the layers apply to q and k)
from .short_conv import causal_conv

CHUNK = 64


def decay_gates(b, a, dt_bias, A, T: int, Hv: int):
    """beta = sigmoid(b), softplus(a + dt_bias) and the log decay g = that * A (<= 0), [T, Hv] each."""
    beta = sigmoid(b.reshape(T, Hv))
    sp = softplus(a.reshape(T, Hv) + dt_bias)
    return beta, sp, sp * A


def expand_heads(x: np.ndarray, r: int) -> np.ndarray:
    """[T, Hk, K] -> [T, Hk*r, K]: value head h uses key head h // r (qwen3next's interleaved mapping)."""
    return np.repeat(x, r, axis=1)


def tile_heads(x: np.ndarray, r: int) -> np.ndarray:
    """[T, Hk, K] -> [T, Hk*r, K]: value head h uses key head h % Hk (qwen4exp's tiled mapping)."""
    return np.tile(x, (1, r, 1))


HEAD_MAPS = {"interleaved": expand_heads, "tiled": tile_heads}


def recurrent(q, k, v, g, beta, S=None):
    """q, k: [T, Hv, K], v: [T, Hv, V], g: [T, Hv] (scalar decay per head), beta: [T, Hv], S: [Hv, K, V] | None
    -> (o [T, Hv, V], S)."""
    assert g.ndim == 2, "GDN decays each head by one scalar: g is [T, H]"
    return delta_rule.recurrent(q, k, v, g, beta, S)


def chunked(q, k, v, g, beta, S=None, *, chunk=CHUNK):
    """The chunked form of `recurrent` (same arguments, same result up to float rounding)."""
    assert g.ndim == 2, "GDN decays each head by one scalar: g is [T, H]"
    return delta_rule.chunked(q, k, v, g, beta, S, chunk=chunk)


# ---------------------------------------------------------------- the qwen3next layer
#
# llama.cpp: `build_layer_attn_linear` and `build_qkvz` (src/models/qwen3next.cpp:314-563), the conv state
# and the fused delta-rule call of `llm_build_delta_net_base` (src/models/delta-net-base.cpp:449-560).
# Further letters: C conv channels (2*Hk*K + Hv*V), Kc conv kernel, r = Hv / Hk.
#
#     qkv, z  = h @ attn_qkv.T, h @ attn_gate.T       (legacy: one ssm_in, split per key-head group)
#     b, a    = h @ ssm_ba.T  split per key-head group into [r betas | r alphas]
#     beta    = sigmoid(b);   g = softplus(a + ssm_dt.bias) * ssm_a           ssm_a = -exp(A_log)
#     y       = silu(causal_conv(qkv, ssm_conv1d, tail))                      [T, C]
#     q, k, v = y split [Hk*K | Hk*K | Hv*V];  q, k = l2_norm(q), l2_norm(k);  expand_heads (h // r)
#     o, S    = recurrent(q, k, v, g, beta, S)
#     out     = (rms_norm(o) * ssm_norm * silu(z)) @ ssm_out.T                per head over V

@dataclass(frozen=True)
class GDNConfig:
    n_k_heads: int      # ssm.group_count (Hk)
    n_v_heads: int      # ssm.time_step_rank (Hv)
    head_k_dim: int     # ssm.state_size (K; llama.cpp sizes the state V x V, so K == V)
    head_v_dim: int     # ssm.inner_size / ssm.time_step_rank (V)
    conv_kernel: int    # ssm.conv_kernel (Kc)
    head_map: str = "interleaved"   # value head h reads key head h // r ("interleaved") or h % Hk ("tiled")
    out_gate: str = "silu"          # the output gate's activation of z: silu | sigmoid
    ba: str = "fused"               # beta/alpha projections: one ssm_ba ("fused") or ssm_beta + ssm_alpha ("split")
    conv_trace: str = "build_conv_state"    # the graph function whose names the conv state is traced under:
                                            # build_conv_state (delta-net-base.cpp) | build_conv_state_at (qwen4exp)
    apply_scales: bool = False      # the projections' `.scale` (generic pass) reach build_lora_mm (qwen4exp.cpp:469,
                                    # 473, 890, 897, 986); False: loaded, never applied (qwen3next.cpp:327-556)

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


def gdn_config(r, path: str) -> GDNConfig:
    """The ssm.* keys (qwen3next.cpp:10-14, all required), checked the way the loader's shapes need them."""
    kc = int(r.get("ssm.conv_kernel", required=True))
    d_inner = int(r.get("ssm.inner_size", required=True))
    d_state = int(r.get("ssm.state_size", required=True))
    hv = int(r.get("ssm.time_step_rank", required=True))
    hk = int(r.get("ssm.group_count", required=True))
    if min(kc, d_state, hv, hk) <= 0 or hv % hk or d_inner != hv * d_state:
        raise ConfigError(f"{path}: ssm keys do not fit a gated delta net: conv_kernel {kc}, inner_size {d_inner}, "
                          f"state_size {d_state}, time_step_rank {hv}, group_count {hk} (needs time_step_rank a "
                          f"multiple of group_count and inner_size = time_step_rank * state_size)")
    return GDNConfig(n_k_heads=hk, n_v_heads=hv, head_k_dim=d_state, head_v_dim=d_state, conv_kernel=kc)


RULES = {"recurrent": recurrent, "chunked": chunked}     # state.form -> the delta rule it runs
FORMS = tuple(RULES)       # llama.cpp's fused token-by-token kernel (the default), the chunked form


GDNState = RecurrentState          # conv tail, delta-rule matrix and the form of the rule (FORMS)


def new_state(form: str = "recurrent") -> GDNState:
    """A new sequence: no conv tail, no delta-rule matrix (both start at zero, `build_rs`)."""
    if form not in FORMS:
        raise ConfigError(f"gated delta net form {form!r} is not one of {', '.join(FORMS)}")
    return GDNState(form=form)


def gdn_table(gf, il: int, gc: GDNConfig) -> list[W]:
    """The linear-attention tensors of block il (qwen3next.cpp:83-94, qwen4exp.cpp:219-232) and the generic pass's
    optional `.scale` / `.input_scale` of its projections (llama-model.cpp:1634-1773; ssm_beta / ssm_alpha's only
    with the split form: the fused ssm_ba has none). The `.scale` multiply the projection's result when
    `gc.apply_scales` (qwen4exp's build_lora_mm(w, x, w_s)), else they are loaded and ignored (qwen3next); no graph
    reads an `.input_scale`."""
    p = f"blk.{il}."
    D = lambda c, s: c.n_embd                                        # noqa: E731
    ONE = lambda c, s: (1,)                                          # noqa: E731
    qkvz = 2 * gc.key_dim + 2 * gc.value_dim
    if p + "attn_qkv.weight" not in gf and p + "ssm_in.weight" not in gf:
        raise MissingTensorError(f"{gf.path}: linear-attention block {il} needs {p}attn_qkv.weight (with "
                                 f"{p}attn_gate.weight) or the legacy {p}ssm_in.weight; the file has neither")
    t = [W("attn_qkv", p + "attn_qkv.weight", lambda c, s: (gc.conv_dim, D(c, s)), required=False),
         W("attn_gate", p + "attn_gate.weight", lambda c, s: (gc.value_dim, D(c, s)),
           required=p + "attn_qkv.weight" in gf),
         W("ssm_in", p + "ssm_in.weight", lambda c, s: (qkvz, D(c, s)), required=False),
         # ggml_ssm_conv reads the kernel as float (ggml-cpu/ops.cpp asserts nb[0] == sizeof(float))
         W("ssm_conv1d", p + "ssm_conv1d.weight", lambda c, s: (gc.conv_dim, gc.conv_kernel), dense=True,
           accepts=("F32",), refuse_others=True),
         W("ssm_dt_bias", p + "ssm_dt.bias", lambda c, s: (gc.n_v_heads,), dense=True),
         W("ssm_a", p + "ssm_a", lambda c, s: (gc.n_v_heads,), dense=True),
         *([W("ssm_ba", p + "ssm_ba.weight", lambda c, s: (2 * gc.n_v_heads, D(c, s)), small=True)]
           if gc.ba == "fused" else
           [W("ssm_beta", p + "ssm_beta.weight", lambda c, s: (gc.n_v_heads, D(c, s)), small=True),
            W("ssm_alpha", p + "ssm_alpha.weight", lambda c, s: (gc.n_v_heads, D(c, s)), small=True)]),
         W("ssm_norm", p + "ssm_norm.weight", lambda c, s: (gc.head_v_dim,), dense=True),
         W("ssm_out", p + "ssm_out.weight", lambda c, s: (D(c, s), gc.value_dim))]
    for x in ("attn_qkv", "attn_gate", "ssm_in", "ssm_out") + (() if gc.ba == "fused" else ("ssm_beta", "ssm_alpha")):
        t += [W(f"{x}_scale", p + f"{x}.scale", ONE, required=False, dense=True),
              W(f"{x}_input_scale", p + f"{x}.input_scale", ONE, required=False, dense=True)]
    return t


def _scale(w, name: str, gc: GDNConfig):
    """The `.scale` build_lora_mm multiplies `name`'s result by, if the arch applies it (None when absent)."""
    return getattr(w, f"{name}_scale", None) if gc.apply_scales else None


def qkvz_weights(w) -> list:
    """The weights `project_qkvz` multiplies h by: attn_qkv and attn_gate, or the legacy ssm_in."""
    return [w.attn_qkv, w.attn_gate] if w.attn_qkv is not None else [w.ssm_in]


def project_qkvz(h, w, gc: GDNConfig, il: int, rt, products=None):
    """h [T, D] -> qkv [T, C] (q of every key head | k | v) and z [T, Hv*V] (`build_qkvz`).
    products: h's products by `qkvz_weights(w)` when the caller made them (with its others: `rt.matmul_many`).

    Legacy `ssm_in` holds, per key head g, [q_g (K) | k_g (K) | v of heads g*r..g*r+r-1 (r*V) | z of them (r*V)]
    (the HF `in_proj_qkvz` layout); regrouped here as llama.cpp does (qwen3next.cpp:336-391)."""
    T = h.shape[0]
    products = rt.matmul_many(h, qkvz_weights(w)) if products is None else products
    if w.attn_qkv is not None:
        qkv = scale_bias(products[0], _scale(w, "attn_qkv", gc))               # [T, C]
        rt.record("linear_attn_qkv_mixed", il, qkv)
        z = scale_bias(products[1], _scale(w, "attn_gate", gc))                # [T, Hv*V]
        rt.record("z", il, z)
        return qkv, z
    Hk, K, rV = gc.n_k_heads, gc.head_k_dim, gc.value_dim // gc.n_k_heads
    mixed = products[0]                                                  # [T, 2*Hk*K + 2*Hv*V]
    rt.record("linear_attn_mixed_qkvz", il, mixed)
    grp = mixed.reshape(T, Hk, 2 * K + 2 * rV)                           # [T, Hk, 2K + 2rV]
    q, k = grp[..., :K], grp[..., K:2 * K]                               # [T, Hk, K]
    v, z = grp[..., 2 * K:2 * K + rV], grp[..., 2 * K + rV:]             # [T, Hk, rV]
    for name, x in (("q", q), ("k", k), ("v", v), ("z", z)):
        rt.record(name, il, x)
    flat = [x.reshape(T, -1) for x in (q, k, v)]
    for name, x in zip(("query_flat", "key_flat", "value_flat"), flat):
        rt.record(name, il, x)
    qkv = np.concatenate(flat, axis=1)                                   # [T, C]
    rt.record("qkv_mixed", il, qkv)
    return qkv, contiguous(z.reshape(T, -1))


def gated_deltanet(h, w, *, gc: GDNConfig, eps: float, il: int, state: RecurrentState, rt):
    """One qwen3next linear-attention sublayer. h [T, D] -> [T, D]; `state` (conv tail, S) updated in place.
    The delta rule runs in the state's form (`GDNState.form`: recurrent, llama.cpp's; or chunked)."""
    T = h.shape[0]
    Hk, Hv, K, V = gc.n_k_heads, gc.n_v_heads, gc.head_k_dim, gc.head_v_dim
    r, C, Kc = Hv // Hk, gc.conv_dim, gc.conv_kernel
    wq = qkvz_weights(w)
    wg = [w.ssm_ba] if gc.ba == "fused" else [w.ssm_beta, w.ssm_alpha]
    products = rt.matmul_many(h, wq + wg)                                # h's products (one launch a type on a GPU)
    qkv, z = project_qkvz(h, w, gc, il, rt, products[:len(wq)])          # [T, C], [T, Hv*V]

    if gc.ba == "fused":
        ba = products[-1]                                                # [T, 2*Hv]
        rt.record("linear_attn_mixed_ba", il, ba)
        ba = ba.reshape(T, Hk, 2 * r)                                    # [T, Hk, 2r]: r betas, r alphas per group
        b, a = ba[..., :r], ba[..., r:]                                  # [T, Hk, r]
        rt.record("b", il, b)
        rt.record("a", il, a)
        src = (ba, None, r)
    else:
        b = scale_bias(products[-2], _scale(w, "ssm_beta", gc))              # [T, Hv]
        rt.record("beta", il, b)
        a = scale_bias(products[-1], _scale(w, "ssm_alpha", gc))             # [T, Hv]
        src = (b, a, 0)
    if (k := fused_op(b, "gdn_gates")) is None or (gates := k(*src, w.ssm_dt_bias, w.ssm_a)) is None:
        gates = decay_gates(b, a, w.ssm_dt_bias, w.ssm_a, T, Hv)        # (a GPU: one launch, cuda/fused.py)
    beta, sp, g = gates                                                  # [T, Hv] each
    if gc.ba != "fused":
        rt.record("beta_sigmoid", il, beta)
        rt.record("alpha", il, a)
    rt.record("a_softplus", il, sp)
    rt.record("gate", il, g)

    tail = state.conv if state.conv is not None else np.zeros_like(g, shape=(Kc - 1, C), dtype=np.float32)  # [Kc-1, C]
    S0 = state.ssm if state.ssm is not None else np.zeros_like(g, shape=(Hv, K, V), dtype=np.float32)       # [Hv, K, V]
    if gc.conv_trace == "build_conv_state":
        rt.record("conv_states", il, lambda: tail.T.reshape(1, -1))      # llama.cpp's row: channel-major
        rt.record("conv_states_reshaped", il, tail.T[None])              # [1, C, Kc-1]
        rt.record("qkv_mixed_transposed", il, qkv.T[None])               # [1, C, T]
    else:                                                                # qwen4exp's build_conv_state_at
        rt.record("conv_state_at", il, tail.T[None])                     # [1, C, Kc-1]
    rt.record("state_predelta", il, S0.transpose(0, 2, 1)[None])         # [1, Hv, V, K]: S^T per head
    raw_read = rt.reads("conv_output_raw", il)                           # the sum before its silu, apart
    y, new_tail = causal_conv(qkv, w.ssm_conv1d, tail, then_silu=not raw_read)   # [T, C], [Kc-1, C]
    if gc.conv_trace == "build_conv_state":
        rt.record("conv_input", il, lambda: np.concatenate([tail, qkv]).T[None])   # [1, C, Kc-1+T]
        rt.record("conv_state_last", il, new_tail.T[None])
        # the cache row the new tail is copied into, as llama.cpp's callback reads it: before the copy (the old tail)
        rt.record("conv_state_update", il, lambda: tail.T.reshape(1, -1))
    if raw_read:
        rt.record("conv_output_raw", il, y)
        y = silu(y)
    rt.record("conv_output_silu", il, y)

    q = y[:, :Hk * K].reshape(T, Hk, K)                                  # [T, Hk, K]
    k = y[:, Hk * K:2 * Hk * K].reshape(T, Hk, K)                        # [T, Hk, K]
    v = y[:, 2 * Hk * K:].reshape(T, Hv, V)                              # [T, Hv, V]
    rt.record("q_conv", il, q)
    rt.record("k_conv", il, k)
    q, k = l2_norm(q, eps), l2_norm(k, eps)                              # [T, Hk, K]
    if gc.head_map == "tiled":                                           # the fused kernel broadcasts h % Hk
        rt.record("q_conv_predelta", il, q)
        rt.record("k_conv_predelta", il, k)
    q = HEAD_MAPS[gc.head_map](q, r)                                     # [T, Hv, K]
    k = HEAD_MAPS[gc.head_map](k, r)                                     # [T, Hv, K]
    if gc.head_map != "tiled":
        rt.record("q_conv_predelta", il, q)
        rt.record("k_conv_predelta", il, k)
    rt.record("v_conv_predelta", il, v)
    o, S = RULES[state.form](q, k, v, g, beta, S0)                       # the sequence's form of the rule                                    # [T, Hv, V], [Hv, K, V]
    rt.record("attn_output", il, o)
    rt.record("new_state", il, S.transpose(0, 2, 1)[None])
    state.conv, state.ssm = new_tail, S

    o = rms_norm_gated(o, w.ssm_norm, eps, z.reshape(T, Hv, V), gc.out_gate)   # [T, Hv, V]  build_norm_gated
    o = o.reshape(T, Hv * V)
    rt.record("final_output", il, o)
    out = linear(o, w.ssm_out, _scale(w, "ssm_out", gc), None, rt)       # [T, D]
    rt.record("linear_attn_out", il, out)
    return out
