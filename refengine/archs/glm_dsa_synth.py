"""The synthetic `glm-dsa` plans (GLM-5 / 5.1 / 5.2): DeepSeek-V3.2's block with shared indexer layers.

    write_synth("glm-dsa", "glm.gguf", preset="tiny-shared", wtype="Q8_0")

Names, shapes and keys are the ones llama.cpp's glm-dsa loader asks for (`src/models/glm-dsa.cpp`,
llama-cpp-python 0.3.36). Preset entries as in deepseek32_synth, plus `idx_types`: None writes no
`attention.indexer.types` key (then llama.cpp's rule decides: all full below a 1M context, GLM-5.2's pattern
from it), or a tuple of 0/1 per layer written as the bool array the converter writes.

Presets:
- `tiny`          every layer runs its own indexer (GLM-5 / 5.1 style: no key, context 512).
- `tiny-shared`   GLM-5.2's layer pattern over 7 layers: full 0, 1, 2, 6; shared 3, 4, 5 (the key written).
- `tiny-default`  the same pattern from llama.cpp's default rule: no key, context_length 1048576.
- `glm-5.2`       published shapes (cited beside it). Too big to write whole; use `layers=N`.

`all_optional` adds the `.scale` / `.input_scale` tensors, exp_probs_b, YaRN (whose yarn_log_multiplier glm-dsa
does not read), attention.layer_norm_epsilon (not read: the indexer LayerNorm runs with eps 0, see
archs/glm_dsa.py), and the indexer tensors of shared layers (loaded by llama.cpp, never used).
"""
from __future__ import annotations

from functools import partial

from . import deepseek_family_synth as family
from .deepseek_family_synth import synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "glm-dsa"
GLM_5_2_TYPES = (1, 1) + (1, 0, 0, 0) * 19          # glm-dsa.cpp:5-28: 21 full of 78

_TINY = dict(family.TINY, eps=1e-5, **family.TINY_INDEXER, idx_types=None)

PRESETS: dict[str, dict] = {
    "tiny": dict(_TINY),
    "tiny-shared": dict(_TINY, n_layer=7, n_embd=128, n_ff=256, q_lora=64, kv_lora=64, qk_nope=32, qk_rope=32,
                        v_head=32, n_ff_exp=64, idx_types=GLM_5_2_TYPES[:7]),
    "tiny-default": dict(_TINY, n_layer=7, n_embd=128, n_ff=256, q_lora=64, kv_lora=64, qk_nope=32, qk_rope=32,
                         v_head=32, n_ff_exp=64, n_ctx=1048576),
    # GLM-5.2 (744B, "744B.A40B" in llama.cpp for 78 layers). Shapes from the GLM-5 technical report ("GLM-5: from
    # Vibe Coding to Agentic Engineering", architecture table: hidden 6144, 3 dense + 75 MoE layers, dense
    # intermediate 12288, MoE intermediate 2048, q_lora 2048, kv_lora 512, 64 heads, indexer 32 heads x 128,
    # 256 experts, 8 routed, 1 shared, vocab 154880; quoted at glennklockwood.com/garden/GLM-5) and zai-org/GLM-5.2
    # config.json as transcribed in public repositories (not re-read from Hugging Face here): qk_nope_head_dim
    # 192, qk_rope_head_dim 64, v_head_dim 256, rms_norm_eps 1e-5, rope_theta 8000000 (no scaling),
    # max_position_embeddings 1048576, index_topk 2048, routed_scaling_factor 2.5, norm_topk_prob true, sigmoid,
    # n_group 1, 78 indexer_types with 21 "full" = llama.cpp's GLM_5_2_DEFAULT_INDEXER_TYPES (glm-dsa.cpp:5-28,
    # which cites config.json#L26). Its MTP block is not written.
    "glm-5.2": dict(n_vocab=154880, n_embd=6144, n_layer=78, n_head=64, n_ctx=1048576, eps=1e-5,
                    rope_base=8000000.0, n_ff=12288, n_dense_lead=3,
                    q_lora=2048, kv_lora=512, qk_nope=192, qk_rope=64, v_head=256, mla=True,
                    n_expert=256, n_expert_used=8, n_ff_exp=2048, n_shared=1,
                    gating="sigmoid", probs_bias=True, norm_w=True, w_scale=2.5, n_group=1, topk_group=1,
                    yarn=None, idx_heads=32, idx_dim=128, idx_top_k=2048, idx_types=GLM_5_2_TYPES),
}


def full_layers(p: dict) -> list[bool]:
    """Which layers run their own indexer, by the rule llama.cpp applies to this file (archs/glm_dsa.py)."""
    if p["idx_types"] is not None:
        return [bool(x) for x in p["idx_types"][:p["n_layer"]]]
    if p["n_ctx"] < 1048576:
        return [True] * p["n_layer"]
    return [il < len(GLM_5_2_TYPES) and bool(GLM_5_2_TYPES[il]) for il in range(p["n_layer"])]


def optional_keys(p: dict) -> list[tuple[str, object, str]]:
    """What `all_optional` adds beyond the family's keys: attention.layer_norm_epsilon (not read: eps 0)."""
    return [("attention.layer_norm_epsilon", 1e-3, "f32")]


# The trunk glm-dsa.cpp:110-173 creates (a shared layer's indexer tensors only with all_optional); every key
# glm-dsa.cpp:30-66 reads, expert_gating_func written (converters do; absent means sigmoid).
synth_plan = partial(family.synth_plan, ARCH, full_layers=full_layers)
synth_metadata = partial(family.synth_metadata, ARCH, full_layers=full_layers, optional_keys=optional_keys)
