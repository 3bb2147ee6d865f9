"""`deepseek32`: DeepSeek-V3.2 (-Exp) — DeepSeek-V3 with DeepSeek Sparse Attention (DSA).

llama.cpp: `src/models/deepseek32.cpp` (keys :6-44, tensors :46-153, graph :162-486). One block
(Legend: T tokens, D model dim, Dq q-LoRA rank):

    h  = rms_norm(x) * attn_norm                               attn_norm       [T, D]
    qr = rms_norm(h @ Wq_a.T) * q_a_norm                       qr              [T, Dq]
    sel = lightning_indexer(h, qr)      (attention/dsa_indexer.py: NEOX rope on the first R dims, key LayerNorm
                                         eps 1e-6, ReLU head scores, top-k)                  top_k   [T, k]
    x  = x + mla(h, qr, mask = top-k + causal)      (attention/mla.py, absorbed: llama.cpp has no other path)
    h  = rms_norm(x) * ffn_norm                                ffn_norm
    x  = x + dense_ffn(h)      for il < leading_dense_block_count                            ffn_out
       | x + moe_block(h)      routed (expert_gating_func, required) + shared experts        l_out   [T, D]

Differences from deepseek2 that llama.cpp makes: q_lora_rank and key/value_length_mla are required (no lite,
no legacy attn_kv_b), expert_gating_func has no default, attention.temperature_* are not read, and the
optional `.scale` tensors of the FFNs and experts ARE applied (deepseek32.cpp:417-449); YaRN's
yarn_log_multiplier is read as in deepseek2 but llama_context's mscale special case is deepseek2's only.
RoPE: NORM pairs for MLA's rope part, NEOX for the indexer, both with the context's YaRN parameters.

The config reading, tables, state and block are the DeepSeek family's (archs/deepseek_family.py); this file
states what deepseek32 makes different, as data.
"""
from __future__ import annotations

from functools import partial

from ..attention import mla
from ..attention.dsa_indexer import indexer_configs
from ..config import ROPE_NEOX
from ..moe.block import MoETensors
from . import deepseek_family as family
from .deepseek_family import ROPE_TYPE, embed, head, load_globals, new_state  # noqa: F401
from .deepseek32_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "deepseek32"
INDEXER_ROPE = ROPE_NEOX       # deepseek32.cpp:234, :247
INDEXER_K_NORM_EPS = 1e-6      # hparams.f_norm_eps, hard-coded (deepseek32.cpp:9): the file's key is not read
ATTN_FORMS = mla.FORMS         # absorbed (llama.cpp's) and naive: Model.new_state(attn_form)
FFN_SCALES = True              # the FFN / expert / shared `.scale` tensors are applied (deepseek32.cpp:417-449)
MOE_TENSORS = MoETensors(
    probs_bias="optional",         # exp_probs_b TENSOR_NOT_REQUIRED, gate and up separate (deepseek32.cpp:107-139)
    apply_scales=True)             # the experts' and shared experts' `.scale` are applied (deepseek32.cpp:417-449)
# mla_config: q_lora_rank and key/value_length_mla required, no attention.temperature_*, no mscale special case
MLA_OPTIONS = dict(lite_rule=False, require_mla=True, mscale_is_log_mul=False, temperature=False)

MATMUL_INPUTS = family.DSA_MATMUL_INPUTS

# Keys that change the math elsewhere but that deepseek32's loader never reads.
IGNORED_MATH_KEYS = ("attention.layer_norm_epsilon", "attention.temperature_scale", "attention.temperature_length",
                     "attention.scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
                     "attention.sliding_window", "final_logit_softcapping", "attn_logit_softcapping",
                     "attention.indexer.types", "expert_shared_feed_forward_length")


def gating_id(r, n_layer_all: int, n_vocab: int) -> int:
    """`expert_gating_func` is required: no default (deepseek32.cpp:6-44)."""
    return int(r.get("expert_gating_func", required=True))


def indexers(r, common: dict) -> list:
    """Every trunk layer runs its own indexer (no attention.indexer.types)."""
    return indexer_configs(r, n_rot=common["n_rot"], rope_mode=INDEXER_ROPE, k_norm_eps=INDEXER_K_NORM_EPS,
                           full=[True] * common["n_layer"])


config_from_gguf = partial(family.config_from_gguf, ARCH, gating_id=gating_id, mla_options=MLA_OPTIONS,
                           indexers=indexers, ignored_keys=IGNORED_MATH_KEYS)
load_layer = partial(family.load_layer, moe_tensors=MOE_TENSORS)
block = partial(family.block, ffn_scales=FFN_SCALES, moe_tensors=MOE_TENSORS)
