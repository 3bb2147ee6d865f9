"""`llama`: the dense baseline transformer (Llama 2/3, SmolLM2, Mixtral-style MoE when expert_count > 0).

llama.cpp: `src/models/llama.cpp` (graph and tensor table), generic optional tensors in
`src/llama-model.cpp:1620-1790` (`.scale` / `.input_scale` pass), `build_qkv`, `build_attn`,
`build_ffn`, `build_moe_ffn` in `src/llama-graph.cpp`.

One block (Legend: T tokens, D model dim, H/Hkv heads, K head dim, F ffn dim):

    h        = rms_norm(x) * attn_norm                                   attn_norm      [T, D]
    q, k, v  = h @ Wq.T (*s_q) + b_q, ...   (or one fused attn_qkv)      Qcur/Kcur/Vcur [T, H, K]
    q, k     = rope(q), rope(k)          (NORM pairs, optional rope_freqs factors)
    o        = attention(q, cache_k, cache_v) (causal, 1/sqrt(K))        kqv_out        [T, H*K]
    a        = o @ Wo.T (*s_o) + b_o                                     attn_out       [T, D]
    x        = x + a                                                     ffn_inp
    h        = rms_norm(x) * ffn_norm                                    ffn_norm
    dense:  f = (silu((h@Wg.T + b_g)*s_g) * ((h@Wu.T + b_u)*s_u)) @ Wd.T + b_d) * s_d      ffn_out
    moe:    f = build_moe_ffn(h) with softmax top-k and norm_w = true             ffn_moe_out
    x        = x + f                                                     l_out
"""
from __future__ import annotations

import numpy as np

from ..attention import attention, causal_mask
from ..config import ROPE_NORM, KeyReader, LayerSpec, ModelConfig, read_common
from ..errors import ConfigError
from ..moe import softmax_topk
from ..ops import apply_rope, rms_norm, rope_cos_sin, swiglu
from ..weights import W, load_tensors

ARCH = "llama"
ROPE_TYPE = ROPE_NORM

# Keys that change the math of other archs but that llama.cpp's llama/qwen3moe loaders never read.
IGNORED_MATH_KEYS = [
    "attention.scale", "attention.clamp_kqv", "expert_weights_scale", "expert_weights_norm",
    "expert_gating_func", "expert_shared_count", "expert_shared_feed_forward_length",
    "leading_dense_block_count", "logit_scale", "embedding_scale", "residual_scale",
    "attention.sliding_window", "rope.scaling.yarn_log_multiplier", "final_logit_softcapping",
    "attn_logit_softcapping", "swiglu_clamp_exp", "swiglu_clamp_shexp",
]


# ---------------------------------------------------------------- config

def token_rows(gf) -> int:
    if "token_embd.weight" not in gf:
        from ..errors import MissingTensorError
        raise MissingTensorError(f"{gf.path}: required tensor 'token_embd.weight' is missing")
    return gf.tensors["token_embd.weight"].shape[0]


def config_from_gguf(gf, *, arch: str = ARCH, rope_type: int = ROPE_TYPE, moe_only: bool = False,
                     ignored=IGNORED_MATH_KEYS) -> ModelConfig:
    r = KeyReader(gf, arch)
    common, n_head, n_head_kv = read_common(r, rope_type=rope_type, n_vocab=token_rows(gf))
    L = common["n_layer"]
    L_all = L + common["n_layer_nextn"]
    n_ff = r.per_layer("feed_forward_length", L_all, default=0)[:L]
    # llama sizes its experts by feed_forward_length; qwen3moe reads expert_feed_forward_length and
    # falls back to feed_forward_length / expert_used_count (src/models/qwen3moe.cpp:51)
    n_ff_exp = r.per_layer("expert_feed_forward_length", L_all, default=0)[:L] if moe_only else n_ff
    n_used = r.per_layer("expert_used_count", L_all, default=0)[:L]
    n_expert = common["n_expert"]
    if n_expert > 0 and max(n_used) == 0:
        raise ConfigError(f"{gf.path}: {arch}.expert_count = {n_expert} but {arch}.expert_used_count is missing or 0")
    if max(n_used) > n_expert:
        raise ConfigError(f"{gf.path}: {arch}.expert_used_count = {max(n_used)} exceeds expert_count = {n_expert}")
    if moe_only and n_expert == 0:
        raise ConfigError(f"{gf.path}: {arch} needs {arch}.expert_count > 0")
    if common["head_dim_k"] != common["head_dim_v"] or common["head_dim_k"] != common["n_rot"]:
        raise ConfigError(
            f"{gf.path}: {arch} needs key_length == value_length == rope.dimension_count, got "
            f"{common['head_dim_k']}, {common['head_dim_v']}, {common['n_rot']}")
    layers = []
    for il in range(L):
        if n_head_kv[il] <= 0 or n_head[il] % n_head_kv[il]:
            raise ConfigError(f"{gf.path}: layer {il}: {n_head[il]} heads do not group over {n_head_kv[il]} KV heads")
        ff_exp = n_ff_exp[il] or (n_ff[il] // n_used[il] if n_used[il] else 0)
        layers.append(LayerSpec(attn="mha", ffn="moe" if n_expert > 0 else "dense",
                                n_head=int(n_head[il]), n_head_kv=int(n_head_kv[il]), n_ff=int(n_ff[il] or 0),
                                n_ff_exp=int(ff_exp or 0), n_expert_used=int(n_used[il] or 0)))
    ignored_found = r.warn_ignored(ignored)
    return ModelConfig(**common, layers=tuple(layers), ignored_keys=ignored_found)


# ---------------------------------------------------------------- tensors

def _vec(n):
    return lambda cfg, s: (n(cfg, s),)


D = lambda cfg, s: cfg.n_embd                                        # noqa: E731
QD = lambda cfg, s: s.n_head * cfg.head_dim_k                        # noqa: E731
KD = lambda cfg, s: s.n_head_kv * cfg.head_dim_k                     # noqa: E731
VD = lambda cfg, s: s.n_head_kv * cfg.head_dim_v                     # noqa: E731
ONE = lambda cfg, s: (1,)                                            # noqa: E731
PER_EXPERT = lambda cfg, s: (cfg.n_expert,)                          # noqa: E731


def global_table(cfg, *, rope_factor_tensors: bool = True) -> list[W]:
    half = lambda c, s: (c.n_rot // 2,)                              # noqa: E731
    t = [
        W("token_embd", "token_embd.weight", lambda c, s: (c.n_vocab, c.n_embd)),
        W("output_norm", "output_norm.weight", _vec(D), dense=True),
        W("output", "output.weight", lambda c, s: (c.n_vocab, c.n_embd), required=False),
    ]
    if not rope_factor_tensors:
        return t
    if cfg.rope_scaling_type != "longrope":
        t.append(W("rope_freqs", "rope_freqs.weight", half, required=False, dense=True))
    else:
        t += [W("rope_long", "rope_factors_long.weight", half, required=False, dense=True),
              W("rope_short", "rope_factors_short.weight", half, required=False, dense=True)]
    return t


def attn_table(gf, il: int, *, out_bias: bool = True, qk_norm: bool = False) -> list[W]:
    """`create_tensor_qkv` (src/llama-model.cpp:3396) plus the generic `.scale` / `.input_scale` pass."""
    p = f"blk.{il}."
    t = [W("attn_norm", p + "attn_norm.weight", _vec(D), dense=True)]
    if qk_norm:
        K = lambda c, s: (c.head_dim_k,)                             # noqa: E731
        t += [W("attn_q_norm", p + "attn_q_norm.weight", K, dense=True),
              W("attn_k_norm", p + "attn_k_norm.weight", K, dense=True)]
    if p + "attn_qkv.weight" in gf:
        QKV = lambda c, s: QD(c, s) + KD(c, s) + VD(c, s)           # noqa: E731
        t += [W("attn_qkv", p + "attn_qkv.weight", lambda c, s: (QKV(c, s), c.n_embd)),
              W("attn_qkv_bias", p + "attn_qkv.bias", _vec(QKV), required=False, dense=True),
              W("attn_qkv_scale", p + "attn_qkv.scale", ONE, required=False, dense=True),
              W("attn_qkv_input_scale", p + "attn_qkv.input_scale", ONE, required=False, dense=True)]
        if p + "attn_qkv.bias" not in gf:
            t += [W(f"attn_{x}_bias", p + f"attn_{x}.bias", _vec(n), required=False, dense=True)
                  for x, n in (("q", QD), ("k", KD), ("v", VD))]
    else:
        for x, n in (("q", QD), ("k", KD), ("v", VD)):
            t += [W(f"attn_{x}", p + f"attn_{x}.weight", lambda c, s, n=n: (n(c, s), c.n_embd)),
                  W(f"attn_{x}_bias", p + f"attn_{x}.bias", _vec(n), required=False, dense=True),
                  W(f"attn_{x}_scale", p + f"attn_{x}.scale", ONE, required=False, dense=True),
                  W(f"attn_{x}_input_scale", p + f"attn_{x}.input_scale", ONE, required=False, dense=True)]
    t += [W("attn_output", p + "attn_output.weight", lambda c, s: (c.n_embd, QD(c, s))),
          W("attn_output_scale", p + "attn_output.scale", ONE, required=False, dense=True),
          W("attn_output_input_scale", p + "attn_output.input_scale", ONE, required=False, dense=True),
          W("ffn_norm", p + "ffn_norm.weight", _vec(D), dense=True)]
    if out_bias:
        t.append(W("attn_output_bias", p + "attn_output.bias", _vec(D), required=False, dense=True))
    return t


def dense_ffn_table(il: int) -> list[W]:
    p = f"blk.{il}."
    F = lambda c, s: s.n_ff                                          # noqa: E731
    t = [W("ffn_gate", p + "ffn_gate.weight", lambda c, s: (s.n_ff, c.n_embd)),
         W("ffn_down", p + "ffn_down.weight", lambda c, s: (c.n_embd, s.n_ff)),
         W("ffn_up", p + "ffn_up.weight", lambda c, s: (s.n_ff, c.n_embd)),
         W("ffn_gate_bias", p + "ffn_gate.bias", _vec(F), required=False, dense=True),
         W("ffn_down_bias", p + "ffn_down.bias", _vec(D), required=False, dense=True),
         W("ffn_up_bias", p + "ffn_up.bias", _vec(F), required=False, dense=True)]
    for x in ("gate", "down", "up"):
        t += [W(f"ffn_{x}_scale", p + f"ffn_{x}.scale", ONE, required=False, dense=True),
              W(f"ffn_{x}_input_scale", p + f"ffn_{x}.input_scale", ONE, required=False, dense=True)]
    return t


def moe_table(il: int, *, gate_required: bool) -> list[W]:
    p = f"blk.{il}."
    t = [W("ffn_gate_inp", p + "ffn_gate_inp.weight", lambda c, s: (c.n_expert, c.n_embd)),
         W("ffn_gate_exps", p + "ffn_gate_exps.weight", lambda c, s: (c.n_expert, s.n_ff_exp, c.n_embd),
           required=gate_required),
         W("ffn_down_exps", p + "ffn_down_exps.weight", lambda c, s: (c.n_expert, c.n_embd, s.n_ff_exp)),
         W("ffn_up_exps", p + "ffn_up_exps.weight", lambda c, s: (c.n_expert, s.n_ff_exp, c.n_embd))]
    for x in ("gate", "down", "up"):
        t += [W(f"ffn_{x}_exps_scale", p + f"ffn_{x}_exps.scale", PER_EXPERT, required=False, dense=True),
              W(f"ffn_{x}_exps_input_scale", p + f"ffn_{x}_exps.input_scale", PER_EXPERT, required=False, dense=True)]
    return t


def load_globals(gf, cfg, *, rope_factor_tensors: bool = True):
    g = load_tensors(gf, global_table(cfg, rope_factor_tensors=rope_factor_tensors), cfg)
    for f in ("rope_freqs", "rope_long", "rope_short"):
        setattr(g, f, getattr(g, f, None))
    if g.output is None:                      # tied embeddings (TENSOR_DUPLICATED)
        g.output = g.token_embd
    # output.scale / output.input_scale exist only for an NVFP4 output (src/llama-model.cpp:1775-1785)
    g.output_scale = None
    if g.output.type.name == "NVFP4":
        extra = load_tensors(gf, [W("output_scale", "output.scale", ONE, required=False, dense=True),
                                  W("output_input_scale", "output.input_scale", ONE, required=False, dense=True)], cfg)
        g.output_scale = extra.output_scale
        g.tensor_names += extra.tensor_names
    return g


def load_layer(gf, cfg, il: int):
    spec = cfg.layers[il]
    table = attn_table(gf, il)
    table += dense_ffn_table(il) if spec.ffn == "dense" else moe_table(il, gate_required=False)
    return load_tensors(gf, table, cfg, spec, il)


def rope_factors(g, cfg, n_ctx: int):
    """`llama_model::get_rope_factors`: rope_freqs, else long/short factors chosen by the context size."""
    if g.rope_freqs is not None:
        return g.rope_freqs
    if cfg.rope_scaling_type == "longrope":
        return g.rope_long if n_ctx > cfg.n_ctx_orig_yarn else g.rope_short
    return None


# ---------------------------------------------------------------- block

def linear(x, w, scale, bias, rt):
    """`build_lora_mm(w, x, w_s)` then `+ bias`: y = (x @ w.T) * scale + bias.   [T, I] -> [T, O]"""
    y = rt.matmul(x, w)
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y


def project_qkv(h, w, cfg, spec, rt, il):
    """`build_qkv`: h [T, D] -> q [T, H, K], k [T, Hkv, K], v [T, Hkv, V]."""
    T = h.shape[0]
    H, Hkv, K, V = spec.n_head, spec.n_head_kv, cfg.head_dim_k, cfg.head_dim_v
    if getattr(w, "attn_qkv", None) is not None:
        bias = w.attn_qkv_bias
        if bias is None and getattr(w, "attn_q_bias", None) is not None \
                and w.attn_k_bias is not None and w.attn_v_bias is not None:
            bias = np.concatenate([w.attn_q_bias, w.attn_k_bias, w.attn_v_bias])
        qkv = linear(h, w.attn_qkv, w.attn_qkv_scale, None, rt)          # [T, H*K + Hkv*K + Hkv*V]
        rt.record("wqkv", il, qkv)
        if bias is not None:
            qkv = qkv + bias
            rt.record("wqkv_b", il, qkv)
        q = qkv[:, :H * K]
        k = qkv[:, H * K:H * K + Hkv * K]
        v = qkv[:, H * K + Hkv * K:]
    else:
        q = linear(h, w.attn_q, w.attn_q_scale, w.attn_q_bias, rt)       # [T, H*K]
        k = linear(h, w.attn_k, w.attn_k_scale, w.attn_k_bias, rt)       # [T, Hkv*K]
        v = linear(h, w.attn_v, w.attn_v_scale, w.attn_v_bias, rt)       # [T, Hkv*V]
    return q.reshape(T, H, K), k.reshape(T, Hkv, K), v.reshape(T, Hkv, V)


def self_attention(h, w, *, cfg, spec, il, cache, pos, rope, rt, qk_norm=None):
    """Attention sub-block: h [T, D] -> [T, D]. `qk_norm(q, k) -> (q, k)` runs before RoPE (Qwen3)."""
    T = h.shape[0]
    q, k, v = project_qkv(h, w, cfg, spec, rt, il)
    if qk_norm is not None:
        q, k = qk_norm(q, k)
    q = apply_rope(q, *rope, cfg.n_rot, cfg.rope_type)                   # [T, H, K]
    k = apply_rope(k, *rope, cfg.n_rot, cfg.rope_type)                   # [T, Hkv, K]
    rt.record("Qcur", il, q)
    rt.record("Kcur", il, k)
    rt.record("Vcur", il, v)
    k_all, v_all = cache.layers[il].append(k, v)                                # [S, Hkv, K], [S, Hkv, V]
    S = k_all.shape[0]
    mask = causal_mask(pos, np.arange(S)) if cfg.causal_attn else np.zeros((T, S), np.float32)   # [T, S]
    o = attention(q, k_all, v_all, mask, 1.0 / np.sqrt(cfg.head_dim_k), rt.record, il)  # [T, H, V]
    o = o.reshape(T, -1)                                                 # [T, H*V]
    rt.record("kqv_out", il, o)
    return linear(o, w.attn_output, w.attn_output_scale, w.attn_output_bias, rt)


def dense_ffn(h, w, *, il, rt):
    """`build_ffn(..., LLM_FFN_SILU, LLM_FFN_PAR)`: bias before scale here, unlike build_qkv. [T, D] -> [T, D]"""
    def proj(x, m, b, s, name):
        y = rt.matmul(x, m)
        rt.record(name, il, y)
        if b is not None:
            y = y + b
            rt.record(name + "_b", il, y)
        if s is not None:
            y = y * s
            rt.record(name + "_s", il, y)
        return y
    up = proj(h, w.ffn_up, w.ffn_up_bias, w.ffn_up_scale, "ffn_up")      # [T, F]
    gate = proj(h, w.ffn_gate, w.ffn_gate_bias, w.ffn_gate_scale, "ffn_gate")
    act = swiglu(gate, up)                                               # [T, F]
    rt.record("ffn_swiglu", il, act)
    return proj(act, w.ffn_down, w.ffn_down_bias, w.ffn_down_scale, "ffn_down")


def moe_block(h, w, *, cfg, spec, il, rt, norm_w=True, w_scale=0.0):
    """`build_moe_ffn` with softmax gating.   h [T, D] -> [T, D]"""
    logits = rt.matmul(h, w.ffn_gate_inp)                                # [T, E]
    rt.record("ffn_moe_logits", il, logits)
    ids, weights = softmax_topk(logits, spec.n_expert_used, norm_w=norm_w, w_scale=w_scale,
                                n_groups=cfg.n_expert_groups, n_group_used=cfg.n_group_used,
                                record=rt.record, il=il)                 # [T, A], [T, A]
    return rt.moe_ffn(h, ids, weights, up=w.ffn_up_exps, gate=w.ffn_gate_exps, down=w.ffn_down_exps,
                      up_scale=w.ffn_up_exps_scale, gate_scale=w.ffn_gate_exps_scale,
                      down_scale=w.ffn_down_exps_scale, il=il)


def block(x, w, *, cfg, il, cache, pos, rope, rt, qk_norm=None, attn_out_name="attn_out"):
    """One transformer block: x [T, D] -> [T, D]."""
    spec = cfg.layers[il]
    h = rms_norm(x, w.attn_norm, cfg.rms_eps)
    rt.record("attn_norm", il, h)
    a = self_attention(h, w, cfg=cfg, spec=spec, il=il, cache=cache, pos=pos, rope=rope, rt=rt, qk_norm=qk_norm)
    if attn_out_name:
        rt.record(attn_out_name, il, a)
    x = x + a
    rt.record("ffn_inp", il, x)
    h = rms_norm(x, w.ffn_norm, cfg.rms_eps)
    rt.record("ffn_norm", il, h)
    if spec.ffn == "dense":
        f = dense_ffn(h, w, il=il, rt=rt)
        rt.record("ffn_out", il, f)       # llama.cpp then renames the residual sum to l_out
    else:
        f = moe_block(h, w, cfg=cfg, spec=spec, il=il, rt=rt)
        rt.record("ffn_moe_out", il, f)
    x = x + f
    rt.record("l_out", il, x)
    return x


def rope_for(cfg, g, pos, n_ctx):
    """cos, sin [T, n_rot/2] for positions pos [T] with llama.cpp's context-level rope parameters."""
    return rope_cos_sin(pos, n_rot=cfg.n_rot, base=cfg.rope_freq_base, freq_scale=cfg.rope_freq_scale,
                        ext_factor=cfg.yarn_ext_factor, attn_factor=cfg.yarn_attn_factor,
                        n_ctx_orig=cfg.n_ctx_orig_yarn, beta_fast=cfg.yarn_beta_fast,
                        beta_slow=cfg.yarn_beta_slow, freq_factors=rope_factors(g, cfg, n_ctx))
