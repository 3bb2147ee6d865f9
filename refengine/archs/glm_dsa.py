"""`glm-dsa`: GLM-5 / 5.1 / 5.2 — DeepSeek-V3.2's DSA block with shared indexer layers (GLM-5.2 "IndexShare").

llama.cpp: `src/models/glm-dsa.cpp`, a line-for-line copy of deepseek32.cpp except (diffed):
- `attention.indexer.types` (bool per layer: 1 = full, 0 = shared) decides which layers run their own indexer;
  a shared layer reuses the `top_k` of the most recent full layer (glm-dsa.cpp:243-245, :264-365) and has no
  indexer cache (llama-model.cpp:2431). Without the key: every layer full when context_length < 1048576
  (GLM-5 / 5.1), else GLM-5.2's pattern, layers 0, 1 and every 4th from 2 (glm-dsa.cpp:5-28, :59-66).
  The result is explicit per-layer data (`IndexerConfig.full` / `.source`), never a rule inside a block.
- The indexer rope is NORM (interleaved pairs), still on the first R dims (glm-dsa.cpp:272, :285).
- The indexer key LayerNorm runs with eps = 0: glm-dsa never sets `hparams.f_norm_eps` (deepseek32.cpp:9 sets
  1e-6) and llama_model value-initialises its hparams (llama-model.h:637), so `ggml_norm(x, 0.0f)`. This is
  a llama.cpp quirk reproduced here; the file's `attention.layer_norm_epsilon`, if any, is not read.
- expert_gating_func defaults to sigmoid (glm-dsa.cpp:53-57); rope.scaling.yarn_log_multiplier is not read.
- The indexer tensors are all optional to the loader (glm-dsa.cpp:144-148); a full layer needs them.

One block (Legend: T tokens, D model dim, Dq q-LoRA rank):

    h  = rms_norm(x) * attn_norm                               attn_norm       [T, D]
    qr = rms_norm(h @ Wq_a.T) * q_a_norm                       qr              [T, Dq]
    sel = lightning_indexer(h, qr)      full layer: NORM rope on the first R dims, key LayerNorm eps 0,
                                        ReLU head scores, top-k                              top_k   [T, k]
        | the selection of layer `source`   shared layer (no indexer runs, nothing traced)
    x  = x + mla(h, qr, mask = top-k + causal)      (attention/mla.py, absorbed: llama.cpp has no other path)
    h  = rms_norm(x) * ffn_norm                                ffn_norm
    x  = x + dense_ffn(h)      for il < leading_dense_block_count                            ffn_out
       | x + moe_block(h)      routed (default sigmoid gating) + shared experts              l_out   [T, D]

The config reading, tables, state and block are the DeepSeek family's (archs/deepseek_family.py); this file
states what glm-dsa makes different, as data.
"""
from __future__ import annotations

from functools import partial

from ..attention import mla
from ..attention.dsa_indexer import indexer_configs
from ..config import ROPE_NORM, KeyReader
from ..moe.block import GATING_IDS, MoETensors
from . import deepseek_family as family
from .deepseek_family import ROPE_TYPE, embed, head, load_globals, new_state  # noqa: F401
from .glm_dsa_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "glm-dsa"
INDEXER_ROPE = ROPE_NORM       # glm-dsa.cpp:272, :285 (deepseek32: NEOX)
INDEXER_K_NORM_EPS = 0.0       # QUIRK: hparams.f_norm_eps is never set for glm-dsa (see the module docstring)
# GLM-5.2's default indexer types (glm-dsa.cpp:5-28, from zai-org/GLM-5.2 config.json "indexer_types"):
# layers 0 and 1 full, then one full layer followed by three shared ones, 78 layers; beyond 78 all shared.
GLM_5_2_DEFAULT_INDEXER_TYPES = (1, 1) + (1, 0, 0, 0) * 19
GLM_5_2_MIN_CONTEXT = 1048576  # context_length below this: GLM-5 / 5.1, every layer full (glm-dsa.cpp:59-63)
ATTN_FORMS = mla.FORMS         # absorbed (llama.cpp's) and naive: Model.new_state(attn_form)
FFN_SCALES = True              # the FFN / expert / shared `.scale` tensors are applied (as deepseek32.cpp:417-449)
MOE_TENSORS = MoETensors(
    probs_bias="optional",         # exp_probs_b TENSOR_NOT_REQUIRED, gate and up separate (glm-dsa.cpp:110-173)
    apply_scales=True)             # the experts' and shared experts' `.scale` are applied (as deepseek32.cpp:417-449)
# mla_config: as deepseek32's, and rope.scaling.yarn_log_multiplier is not read either
MLA_OPTIONS = dict(lite_rule=False, require_mla=True, read_yarn_log_mul=False, mscale_is_log_mul=False,
                   temperature=False)

MATMUL_INPUTS = family.DSA_MATMUL_INPUTS

# Keys that change the math elsewhere but that glm-dsa's loader never reads.
IGNORED_MATH_KEYS = ("attention.layer_norm_epsilon", "rope.scaling.yarn_log_multiplier",
                     "attention.temperature_scale", "attention.temperature_length",
                     "attention.scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
                     "attention.sliding_window", "final_logit_softcapping", "attn_logit_softcapping",
                     "expert_shared_feed_forward_length")


# ---------------------------------------------------------------- config

def gating_id(r, n_layer_all: int, n_vocab: int) -> int:
    """`expert_gating_func`; absent or 0: sigmoid (glm-dsa.cpp:53-57)."""
    return int(r.get("expert_gating_func", 0)) or GATING_IDS["sigmoid"]


def indexer_types(r: KeyReader, n_layer: int, n_ctx_train: int) -> list[bool]:
    """Per trunk layer: True where the layer runs its own indexer (glm-dsa.cpp:59-66). The key, scalar or
    one entry per trunk layer, wins; else all full before GLM-5.2 (context_length < 1M), else GLM-5.2's."""
    v = r.per_layer("attention.indexer.types", n_layer)
    if v[0] is not None:
        return [bool(x) for x in v]
    if n_ctx_train < GLM_5_2_MIN_CONTEXT:
        return [True] * n_layer
    return [il < len(GLM_5_2_DEFAULT_INDEXER_TYPES) and bool(GLM_5_2_DEFAULT_INDEXER_TYPES[il]) for il in range(n_layer)]


def indexers(r, common: dict) -> list:
    """Full layers by `indexer_types`; a shared layer reuses the selection of the most recent full one."""
    return indexer_configs(r, n_rot=common["n_rot"], rope_mode=INDEXER_ROPE, k_norm_eps=INDEXER_K_NORM_EPS,
                           full=indexer_types(r, common["n_layer"], common["n_ctx_train"]))


config_from_gguf = partial(family.config_from_gguf, ARCH, gating_id=gating_id, mla_options=MLA_OPTIONS,
                           indexers=indexers, ignored_keys=IGNORED_MATH_KEYS)
load_layer = partial(family.load_layer, moe_tensors=MOE_TENSORS)
block = partial(family.block, ffn_scales=FFN_SCALES, moe_tensors=MOE_TENSORS)
