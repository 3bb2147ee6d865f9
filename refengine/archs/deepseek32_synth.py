"""The synthetic `deepseek32` plans (DeepSeek-V3.2): DeepSeek-V3's MLA and MoE plus the DSA lightning indexer.

    write_synth("deepseek32", "ds32.gguf", preset="tiny", wtype="Q4_K", seed=0, all_optional=True)

Names, shapes and keys are the ones llama.cpp's deepseek32 loader asks for (`src/models/deepseek32.cpp`
load_arch_hparams / load_arch_tensors, llama-cpp-python 0.3.36). Dimension letters as in deepseek2_synth, plus
Hi indexer heads, di indexer head dim, k indexer top-k.

Presets (`PRESETS[name]`):
- `tiny`          deepseek2's tiny (q-LoRA MLA, 1 dense + 2 MoE, sigmoid + exp_probs_b, shared expert) with an
                  indexer of 16 heads x 64 dims and top-k 8: a 16..64-token context drops keys. Its shared tensors
                  are seeded by name, so they equal deepseek2 tiny's: with top-k >= the context the logits equal
                  deepseek2's (dense MLA), which tests/test_dsa.py checks. (Both are deepseek_family_synth.TINY.)
- `deepseek-v3.2` published shapes (cited beside it). Too big to write whole; use `layers=N`.

`all_optional` adds exp_probs_b where the preset has none, every `.scale` / `.input_scale` the generic pass loads
(deepseek32 applies the FFN, shared and routed expert scales and attn_output.scale), YaRN with attn_factor,
rope.dimension_sections (read, unused) and attention.layer_norm_epsilon (not read: the indexer's LayerNorm eps
is hard-coded 1e-6). `layers=N` keeps the first N blocks, the last one MoE (as deepseek2).
"""
from __future__ import annotations

from functools import partial

from . import deepseek_family_synth as family
from .deepseek_family_synth import synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "deepseek32"

PRESETS: dict[str, dict] = {
    "tiny": dict(family.TINY, **family.TINY_INDEXER),
    # DeepSeek-V3.2 (685B with its MTP block; 671B main model), from its published config.json (Hugging Face
    # deepseek-ai/DeepSeek-V3.2 config.json, summarised in huggingface/transformers docs/DEEPSEEK_V32_API.md
    # "Official Model Configuration": hidden 7168, 61 layers, 128 heads, index_n_heads 64, index_head_dim 128,
    # index_topk 2048, q_lora 1536, kv_lora 512, qk_rope 64, qk_nope 128, v_head 128; DeepSeek's reference
    # inference/model.py ModelArgs has the same index_* defaults). V3.2 continues V3.1-Terminus, so the rest is
    # DeepSeek-V3's config (deepseek_family_synth.DEEPSEEK_V3, cited there): first_k_dense_replace 3, intermediate
    # 18432, moe_intermediate 2048, 256 routed / 8 per token / 1 shared, n_group 8, topk_group 4,
    # routed_scaling_factor 2.5, norm_topk_prob, sigmoid (noaux_tc), vocab 129280, rms eps 1e-6, rope_theta 10000,
    # max_position 163840, yarn factor 40 over 4096 with mscale_all_dim 1, beta_fast 32, beta_slow 1. (The MTP
    # block is not written.)
    "deepseek-v3.2": dict(family.DEEPSEEK_V3, idx_heads=64, idx_dim=128, idx_top_k=2048),
}


def optional_keys(p: dict) -> list[tuple[str, object, str]]:
    """What `all_optional` adds beyond the family's keys: rope.dimension_sections (read, unused) and
    attention.layer_norm_epsilon (not read: the indexer's LayerNorm eps is hard-coded 1e-6)."""
    return [("rope.dimension_sections", [p["qk_rope"] // 2, p["qk_rope"] // 2, 0, 0], "arr_u32"),
            ("attention.layer_norm_epsilon", 1e-3, "f32")]


# The trunk deepseek32.cpp:77-139 creates, every layer with its indexer; every key deepseek32.cpp:6-38 reads.
synth_plan = partial(family.synth_plan, ARCH, full_layers=family.every_layer)
synth_metadata = partial(family.synth_metadata, ARCH, full_layers=family.every_layer, optional_keys=optional_keys)
