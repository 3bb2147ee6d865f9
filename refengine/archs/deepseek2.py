"""`deepseek2`: DeepSeek-V2 / V2-Lite / V3 / R1, Kimi K2 — Multi-head Latent Attention + DeepSeekMoE.

llama.cpp: `src/models/deepseek2.cpp` (keys :3-53, tensors :84-159, graph :460-707), `build_moe_ffn`
(src/llama-graph.cpp:2007-2373). One block (Legend: T tokens, D model dim):

    h = rms_norm(x) * attn_norm                           attn_norm       [T, D]
    x = x + mla(h)               (attention/mla.py: q-LoRA or plain q, latent KV, YaRN mscale)   ffn_inp
    h = rms_norm(x) * ffn_norm                            ffn_norm
    x = x + dense_ffn(h)                 for il < leading_dense_block_count       ffn_out
      | x + moe_block(h)                 routed (softmax | sigmoid | sqrt-softplus gating, exp_probs_b for
                                         selection only, expert groups, norm, routed scale) + shared experts
                                                          l_out           [T, D]

RoPE: NORM pairs on the rope part only (`rope.dimension_count` dims of q and of the shared k_pe), with
the context's YaRN parameters; the attention scale folds in DeepSeek's mscale (see attention/mla.py).

The config reading, tables, state and block are the DeepSeek family's (archs/deepseek_family.py); this file
states what deepseek2 makes different, as data.
"""
from __future__ import annotations

from functools import partial

from ..attention import mla
from ..moe.block import GATING_IDS, MoETensors
from . import deepseek_family as family
from .deepseek_family import ROPE_TYPE, embed, head, load_globals, new_state, rope_for  # noqa: F401
from .deepseek2_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "deepseek2"
ATTN_FORMS = mla.FORMS     # absorbed (llama.cpp's for MLA files) and naive: Model.new_state(attn_form)
FFN_SCALES = False          # FFN / expert / shared `.scale`: loaded, not applied (deepseek2.cpp:647-651, :655-678)
MOE_TENSORS = MoETensors(
    probs_bias="optional",      # exp_probs_b created TENSOR_NOT_REQUIRED (deepseek2.cpp:124-158)
    fused_gate_up=True,         # a fused ffn_gate_up_exps is created when the file has one (deepseek2.cpp:124-158)
    apply_scales=False)         # build_moe_ffn / the shared build_ffn get no `.scale` (deepseek2.cpp:655-678)

MATMUL_INPUTS = family.matmul_inputs([
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q_a.weight", "blk.{il}.attn_q.weight", "blk.{il}.attn_kv_a_mqa.weight"]),
    (r"q-(\d+)", ["blk.{il}.attn_q_b.weight"], 1),     # the 2nd `q` (the normed q_a): a name llama.cpp reuses
])

# Keys of other archs that change the math but that the deepseek2 loader never reads.
IGNORED_MATH_KEYS = ("attention.scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
                     "attention.sliding_window", "final_logit_softcapping", "attn_logit_softcapping",
                     "swiglu_clamp_exp", "swiglu_clamp_shexp", "expert_shared_feed_forward_length")


def gating_id(r, n_layer_all: int, n_vocab: int) -> int:
    """`expert_gating_func`; when the key is missing (deepseek2.cpp:22-32): sigmoid for the GLM-4.7-Lite shape
    (47/48 layers, vocab 154880), softmax otherwise (DeepSeek-V2 files predate the key)."""
    func = r.get("expert_gating_func")
    if func is not None:
        return int(func)
    return GATING_IDS["sigmoid" if n_layer_all in (47, 48) and n_vocab == 154880 else "softmax"]


# mla_config's defaults are deepseek2's (the lite rule, legacy attn_kv_b files, temperature, mscale special case).
config_from_gguf = partial(family.config_from_gguf, ARCH, gating_id=gating_id, mla_options={},
                           ignored_keys=IGNORED_MATH_KEYS)
load_layer = partial(family.load_layer, moe_tensors=MOE_TENSORS)
block = partial(family.block, ffn_scales=FFN_SCALES, moe_tensors=MOE_TENSORS)
