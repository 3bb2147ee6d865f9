"""`kimi-linear`: Kimi-Linear-48B-A3B — Kimi Delta Attention (KDA) layers with MLA layers between them + MoE.

llama.cpp: `src/models/kimi-linear.cpp` (keys :4-31, tensors :34-167, graph :234-562). One block
(Legend: T tokens, D model dim):

    h = rms_norm(x) * attn_norm                                       attn_norm       [T, D]
    x = x + kda(h)        head_count_kv[il] == 0 (attention/kda.py: short convs, per-channel decay)   kda_out
      | x + mla(h)        otherwise (attention/mla.py with rope NONE: q_pe, k_pe unrotated,           mla_out
                          kq_scale 1/sqrt(dn+R); plain attn_q, q_lora_rank never read)
                                                                      ffn_inp
    h = rms_norm(x) * ffn_norm                                        ffn_norm
    x = x + dense_ffn(h)              for il < leading_dense_block_count                 ffn_out
      | x + moe_block(h)              expert_gating_func (required), exp_probs_b (selection only),
                                      weights renormalised (fixed true in the graph), expert_weights_scale,
                                      plus the shared SwiGLU experts                    l_out           [T, D]

A KDA layer carries a `RecurrentState` (conv tails of q|k|v and the [H, dh, dh] delta state); an MLA
layer the latent cache (`LatentKV`), or a per-head `KVCache` for legacy files whose MLA head sizes are
absent (key_length_mla = value_length_mla = 0: llama.cpp then multiplies by `attn_kv_b` and runs
ordinary attention, pairing K = [k_pe | k_nope] with Q = [q_nope | q_pe], kimi-linear.cpp:453-477).
"""
from __future__ import annotations

import numpy as np

from ..attention import kda, mla
from ..cache import LatentKV
from ..config import COUNT, KeyReader, LayerSpec, ModelConfig, check_experts, read_common, token_rows
from ..errors import ConfigError, MissingTensorError
from ..ffn import dense_ffn_table
from ..globals import embed_tokens, load_globals as _load_globals, rms_head
from ..moe.block import GATING, MoEConfig, ffn_sublayer, moe_table
from ..ops import rms_norm
from ..weights import load_tensors, norm_table
from .kimi_linear_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "kimi-linear"
ROPE_TYPE = -1             # LLAMA_ROPE_TYPE_NONE (llama-model.cpp:3046-3049): nothing is rotated
ATTN_FORMS = mla.FORMS + ("chunked",)   # MLA layers: absorbed / naive; KDA layers: the chunked delta rule
DEVICE_PATH = False        # `--backend cuda` runs op by op (matmuls and expert dispatch on the GPU)

MATMUL_INPUTS = [
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q.weight", "blk.{il}.attn_k.weight", "blk.{il}.attn_v.weight",
                          "blk.{il}.attn_qkv.weight", "blk.{il}.ssm_f_a.weight", "blk.{il}.ssm_beta.weight",
                          "blk.{il}.ssm_g_a.weight", "blk.{il}.attn_kv_a_mqa.weight"]),
    (r"q_nope_perm-(\d+)", ["blk.{il}.attn_k_b.weight"]),
    (r"kqv-(\d+)", ["blk.{il}.attn_v_b.weight"]),
    (r"kqv_out-(\d+)", ["blk.{il}.attn_output.weight"]),
    (r"ffn_norm-(\d+)", ["blk.{il}.ffn_up.weight", "blk.{il}.ffn_up_exps.weight", "blk.{il}.ffn_gate_inp.weight",
                         "blk.{il}.ffn_up_shexp.weight"]),
    (r"ffn_swiglu-(\d+)", ["blk.{il}.ffn_down.weight", "blk.{il}.ffn_down_shexp.weight"]),
    (r"ffn_moe_swiglu-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"result_norm", ["output.weight"]),
]

# Keys of other archs that change the math but that the kimi-linear loader never reads.
IGNORED_MATH_KEYS = ("attention.scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
                     "attention.sliding_window", "final_logit_softcapping", "attn_logit_softcapping",
                     "expert_weights_norm", "attention.q_lora_rank", "rope.scaling.yarn_log_multiplier",
                     "attention.temperature_scale", "swiglu_clamp_exp", "swiglu_clamp_shexp",
                     "expert_shared_feed_forward_length", "kda.gate_lower_bound")


# ---------------------------------------------------------------- config

def _mla_config(r: KeyReader, common: dict, n_head: int) -> mla.MLAConfig:
    """kimi-linear.cpp:6-8, :269-276: key_length_mla / value_length_mla / kv_lora_rank required; both MLA
    sizes 0 is a legacy file (head sizes from key_length / value_length, attn_kv_b)."""
    path = r.gf.path
    k_mla = int(r.get("attention.key_length_mla", required=True))
    v_mla = int(r.get("attention.value_length_mla", required=True))
    kv_lora = int(r.get("attention.kv_lora_rank", required=True))
    if (k_mla == 0) != (v_mla == 0):
        raise ConfigError(f"{path}: {r._k('attention.key_length_mla')} = {k_mla} and "
                          f"{r._k('attention.value_length_mla')} = {v_mla}: both or neither must be 0 (llama.cpp asserts)")
    legacy = k_mla == 0
    dk, dv = (common["head_dim_k"], common["head_dim_v"]) if legacy else (k_mla, v_mla)
    R = common["n_rot"]
    if dk - R < 1:
        raise ConfigError(f"{path}: MLA head size {dk} leaves no nope dims beside rope.dimension_count = {R}")
    kq_scale = float(np.float32(1.0) / np.sqrt(np.float32(dk)))                 # kimi-linear.cpp:276
    return mla.MLAConfig(n_head=n_head, q_lora_rank=0, kv_lora_rank=kv_lora, qk_nope=dk - R, qk_rope=R, v_head=dv,
                         kq_scale=kq_scale, rope_attn_factor=1.0, rms_eps=common["rms_eps"], legacy=legacy,
                         rope=False, legacy_k_rope_first=legacy)


def config_from_gguf(gf) -> ModelConfig:
    r = KeyReader(gf, ARCH)
    n_vocab = token_rows(gf)
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_TYPE, n_vocab=n_vocab)
    L = common["n_layer"]
    L_all = L + common["n_layer_nextn"]
    H = int(n_head[0])
    if any(int(h) != H for h in n_head):
        raise ConfigError(f"{gf.path}: {ARCH} needs one attention.head_count for every layer (its graph reads n_head())")
    kc = kda.KDAConfig(n_head=H, head_dim=int(r.get("kda.head_dim", required=True, kind=COUNT)),
                       d_conv=int(r.get("ssm.conv_kernel", required=True, kind=COUNT)), rms_eps=common["rms_eps"])
    mc = _mla_config(r, common, H)
    n_ff_exp = r.per_layer("expert_feed_forward_length", L_all, required=True)[:L]
    n_shared = int(r.get("expert_shared_count", required=True))
    n_dense = int(r.get("leading_dense_block_count", 0))
    w_scale = float(r.get("expert_weights_scale", 0.0))
    func = int(r.get("expert_gating_func", required=True))
    if func not in GATING:
        raise ConfigError(f"{gf.path}: {ARCH}.expert_gating_func = {func} is not one of {sorted(GATING)}")
    n_used = r.per_layer("expert_used_count", L_all, default=0)[:L]
    n_ff = r.per_layer("feed_forward_length", L_all, default=0)[:L]
    E = common["n_expert"]
    check_experts(gf, ARCH, E if L > n_dense else 0, n_used[n_dense:])
    layers = []
    for il in range(L):
        dense = il < n_dense
        moe = None if dense else MoEConfig(
            n_expert=E, n_expert_used=int(n_used[il]), n_ff_exp=int(n_ff_exp[il]), gating=GATING[func], norm_w=True,
            w_scale=w_scale, n_groups=common["n_expert_groups"], n_group_used=common["n_group_used"],
            # the shared experts are created with n_ff_exp * max(n_shared, 1) and always added (kimi-linear.cpp:146-152)
            n_shared=max(n_shared, 1), n_ff_shexp=int(n_ff_exp[il]) * max(n_shared, 1), probs_bias=True,
            fused_gate_up=False, scales=False)
        recurrent = int(n_head_kv[il]) == 0                                     # kimi-linear.cpp:17-19
        layers.append(LayerSpec(attn="kda" if recurrent else "mla", ffn="dense" if dense else "moe", n_head=H,
                                n_head_kv=int(n_head_kv[il]), n_ff=int(n_ff[il] or 0),
                                n_ff_exp=0 if dense else int(n_ff_exp[il]),
                                n_expert_used=0 if dense else int(n_used[il]),
                                attn_cfg=kc if recurrent else mc, moe=moe))
    ignored = r.warn_ignored(list(IGNORED_MATH_KEYS))
    return ModelConfig(**common, layers=tuple(layers), ignored_keys=ignored)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg):
    if "output.weight" not in gf:                                                # kimi-linear.cpp:41 (required)
        raise MissingTensorError(f"{gf.path}: required tensor 'output.weight' is missing ({ARCH} has no tied output)")
    return _load_globals(gf, cfg, rope_factor_tensors=False)


def load_layer(gf, cfg, il: int):
    spec = cfg.layers[il]
    table = norm_table(il, "attn_norm", "ffn_norm")
    if spec.attn == "kda":
        table += kda.kda_table(gf, il, spec.attn_cfg)
    else:
        table += mla.mla_table(il, spec.attn_cfg)                  # plain attn_q (q_lora_rank 0)
    if spec.ffn == "dense":
        table += dense_ffn_table(il, lambda c, s: s.n_ff)          # .scale loaded, not applied (build_ffn gets NULL)
    else:
        table += moe_table(gf, il, spec.moe)
    return load_tensors(gf, table, cfg, spec, il)


new_state = kda.hybrid_new_state     # KDA RecurrentState or MLA cache per layer; attn_form: ATTN_FORMS


# ---------------------------------------------------------------- forward

def embed(g, cfg, step, rt):
    x = embed_tokens(g, step.tokens, rt)                                 # [T, D]
    rt.record("model.embed_tokens", -1, x)                               # kimi-linear.cpp:240
    return x


def block(x, w, *, cfg, il, state, step, rt):
    """x [T, D] -> [T, D]."""
    spec = cfg.layers[il]
    h = rms_norm(x, w.attn_norm, cfg.rms_eps)
    rt.record("attn_norm", il, h)
    if spec.attn == "kda":
        a = kda.kda_layer(h, w, kc=spec.attn_cfg, il=il, state=state, rt=rt)
    else:
        form = "absorbed" if isinstance(state, LatentKV) else "naive"    # the form the state was made for
        a = mla.mla(h, w, mc=spec.attn_cfg, il=il, state=state, cos=None, sin=None, rt=rt, form=form)
        rt.record("mla_out", il, a)
    x = x + a
    rt.record("ffn_inp", il, x)
    return ffn_sublayer(x, w, cfg=cfg, spec=spec, il=il, rt=rt, dense_scales=False)


def head(x, g, cfg, rt):
    return rms_head(x, g, cfg, rt, where=cfg.name or ARCH)
