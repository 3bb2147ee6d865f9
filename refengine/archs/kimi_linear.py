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

The family's shared pieces are in archs/kimi_family.py; this file states kimi-linear's data. A KDA layer
carries a `RecurrentState` (conv tails of q|k|v and the [H, dh, dh] delta state); an MLA
layer the latent cache (`LatentKV`), or a per-head `KVCache` for legacy files whose MLA head sizes are
absent (key_length_mla = value_length_mla = 0: llama.cpp then multiplies by `attn_kv_b` and runs
ordinary attention, pairing K = [k_pe | k_nope] with Q = [q_nope | q_pe], kimi-linear.cpp:453-477).
"""
from __future__ import annotations

import numpy as np

from ..attention import mla
from ..config import KeyReader, ModelConfig
from ..errors import ConfigError
from ..globals import embed_tokens, rms_head
from ..moe.block import MoEConfig, MoETensors, ffn_sublayer, moe_matmul_inputs, moe_table
from ..residual.pending import add_norm
from . import kimi_family as fam
from .kimi_family import ATTN_FORMS, ROPE_TYPE, new_state  # noqa: F401  (the arch contract)
from .kimi_linear_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "kimi-linear"

MATMUL_INPUTS = [
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q.weight", "blk.{il}.attn_k.weight", "blk.{il}.attn_v.weight",
                          "blk.{il}.attn_qkv.weight", "blk.{il}.ssm_f_a.weight", "blk.{il}.ssm_beta.weight",
                          "blk.{il}.ssm_g_a.weight", "blk.{il}.attn_kv_a_mqa.weight"]),
    *fam.MLA_INPUTS,
    (r"kqv_out-(\d+)", ["blk.{il}.attn_output.weight"]),
    *moe_matmul_inputs(dense=True, shared=True),
    (r"result_norm", ["output.weight"]),
]

# Keys of other archs that change the math but that the kimi-linear loader never reads.
IGNORED_MATH_KEYS = fam.IGNORED_MATH_KEYS + ("expert_weights_norm", "attention.q_lora_rank", "kda.gate_lower_bound")

# The names kimi-linear.cpp:316-384 gives KDA's tensors (kda.POINTS). f_a(h), g_a(h) and the gated output are
# matmul inputs llama.cpp leaves unnamed: refengine names them, for the llamacpp-mode flip census.
KDA_NAMES = {"f_a": "kda_f_a", "f_b": "g1 f_b(f_a(cur))", "g": "kda_g1", "beta_logits": "kda_beta",
             "scan_out": "attn_output", "state": "new_state", "g_a": "kda_g_a", "gate": "g2 g_b(g_a(cur_2d))",
             "normed": "kda_normed", "gated": "kda_gated", "out": "kda_out"}
# llama.cpp's path for legacy attn_kv_b files (kimi-linear.cpp:453-477), as `mla.mla` options: the per-head key is
# built K = [k_pe | k_nope] (:477) against Q = [q_nope | q_pe], and Q, V, K are also named mla_Q, mla_V, mla_K.
LEGACY_MLA_GRAPH = dict(k_parts=("rope", "nope"), names={"Q": ("Qcur", "mla_Q"), "K": ("Kcur", "mla_K"),
                                                         "V": ("Vcur_view", "Vcur_cont", "mla_V")})
MOE_TENSORS = MoETensors(
    probs_bias="required",     # exp_probs_b created with flags 0 (kimi-linear.cpp:164)
    apply_scales=False)        # build_moe_ffn and the shared build_ffn get no `.scale` (kimi-linear.cpp:512-532)
# kimi-linear.cpp:52-109: one attn_qkv or attn_q/k/v (create_tensor_qkv's two tries); ssm_a {1, H} (or {1,H,1,1})
KDA_TENSORS = dict(fused_qkv=True, ssm_a_shape=lambda H: (H, 1))


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
                         rope=False)


def config_from_gguf(gf) -> ModelConfig:
    k = fam.read_keys(gf, ARCH)
    mc = _mla_config(k.r, k.common, k.n_head)
    w_scale = float(k.r.get("expert_weights_scale", 0.0))
    # the shared experts are always added (kimi-linear.cpp:146-152); weights renormalised (fixed true in the graph)
    moe = lambda il: MoEConfig(**k.moe_sizes(il), norm_w=True, w_scale=w_scale,            # noqa: E731
                               n_groups=k.common["n_expert_groups"], n_group_used=k.common["n_group_used"],
                               n_shared=max(k.n_shared, 1))
    layers = fam.layer_specs(k, kda_cfg=k.kda, mla_cfg=lambda il: mc, moe_cfg=moe)
    ignored = k.r.warn_ignored(list(IGNORED_MATH_KEYS))
    return ModelConfig(**k.common, layers=layers, ignored_keys=ignored)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg):
    return fam.load_globals(gf, cfg, ARCH)


def load_layer(gf, cfg, il: int):
    # MLA: plain attn_q (q_lora_rank 0); MoE: moe.block's table (exp_probs_b, the shared experts)
    return fam.load_layer(gf, cfg, il, norms=("attn_norm", "ffn_norm"), kda_tensors=KDA_TENSORS,
                          mla_table=mla.mla_table, moe_table=moe_table, moe_tensors=MOE_TENSORS)


# ---------------------------------------------------------------- forward

def embed(g, cfg, step, rt):
    x = embed_tokens(g, step.tokens, rt)                                 # [T, D]
    rt.record("model.embed_tokens", -1, x)                               # kimi-linear.cpp:240
    return x


def block(x, w, *, cfg, il, state, step, rt):
    """x [T, D] -> [T, D]."""
    spec = cfg.layers[il]
    legacy = spec.attn == "mla" and spec.attn_cfg.legacy
    x, h = add_norm(x, w.attn_norm, cfg.rms_eps)          # (the previous block's output added first: PendingAdd)
    a = fam.attention(x, w, spec=spec, il=il, state=state, rt=rt, eps=cfg.rms_eps, kda_names=KDA_NAMES,
                      mla_graph=LEGACY_MLA_GRAPH if legacy else None, pos=step.pos, h=h)
    x, a = step.out_rows(il, cfg.n_layer, (x, a))                        # the output rows (llama.cpp inp_out_ids)
    return ffn_sublayer(x, w, cfg=cfg, spec=spec, il=il, rt=rt, moe_tensors=MOE_TENSORS, dense_scales=False,
                        a=a)                                             # x + a (ffn_inp), then the FFN half


def head(x, g, cfg, rt):
    return rms_head(x, g, cfg, rt, where=cfg.name or ARCH)
