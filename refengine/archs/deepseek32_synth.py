"""The synthetic `deepseek32` plans (DeepSeek-V3.2): DeepSeek-V3's MLA and MoE plus the DSA lightning indexer.

    write_synth("deepseek32", "ds32.gguf", preset="tiny", wtype="Q4_K", seed=0, all_optional=True)

Names, shapes and keys are the ones llama.cpp's deepseek32 loader asks for (`src/models/deepseek32.cpp`
load_arch_hparams / load_arch_tensors, llama-cpp-python 0.3.36). Dimension letters as in deepseek2_synth, plus
Hi indexer heads, di indexer head dim, k indexer top-k.

Presets (`PRESETS[name]`):
- `tiny`          deepseek2's tiny (q-LoRA MLA, 1 dense + 2 MoE, sigmoid + exp_probs_b, shared expert) with an
                  indexer of 16 heads x 64 dims and top-k 8: a 16..64-token context drops keys. Its shared tensors
                  are seeded by name, so they equal deepseek2 tiny's: with top-k >= the context the logits equal
                  deepseek2's (dense MLA), which tests/test_dsa.py checks.
- `deepseek-v3.2` published shapes (cited beside it). Too big to write whole; use `layers=N`.

`all_optional` adds exp_probs_b where the preset has none, every `.scale` / `.input_scale` the generic pass loads
(deepseek32 applies the FFN, shared and routed expert scales and attn_output.scale), YaRN with attn_factor,
rope.dimension_sections (read, unused) and attention.layer_norm_epsilon (not read: the indexer's LayerNorm eps
is hard-coded 1e-6). `layers=N` keeps the first N blocks, the last one MoE (as deepseek2).
"""
from __future__ import annotations

from ..errors import ConfigError
from ..synthplan import (TensorPlan, check_mla_rope_scaling, deepseek_ffn_plans, deepseek_metadata, indexer_plans,
                         mla_plans, mla_rope_scaling_metadata, no_option)

ARCH = "deepseek32"
GATING = {"softmax": 1, "sigmoid": 2}

_TINY = dict(n_vocab=256, n_embd=256, n_layer=3, n_head=4, n_ctx=512, eps=1e-6, rope_base=10000.0,
             n_ff=512, n_dense_lead=1,
             q_lora=128, kv_lora=128, qk_nope=64, qk_rope=32, v_head=64, mla=True,
             n_expert=8, n_expert_used=2, n_ff_exp=128, n_shared=1,
             gating="sigmoid", probs_bias=True, norm_w=True, w_scale=2.5, n_group=0, topk_group=0,
             yarn=None,
             idx_heads=16, idx_dim=64, idx_top_k=8, idx_k_std=0.0)

PRESETS: dict[str, dict] = {
    "tiny": _TINY,
    # DeepSeek-V3.2 (685B with its MTP block; 671B main model), from its published config.json (Hugging Face
    # deepseek-ai/DeepSeek-V3.2 config.json, summarised in huggingface/transformers docs/DEEPSEEK_V32_API.md
    # "Official Model Configuration": hidden 7168, 61 layers, 128 heads, index_n_heads 64, index_head_dim 128,
    # index_topk 2048, q_lora 1536, kv_lora 512, qk_rope 64, qk_nope 128, v_head 128; DeepSeek's reference
    # inference/model.py ModelArgs has the same index_* defaults). V3.2 continues V3.1-Terminus, so the rest is
    # DeepSeek-V3's config (see deepseek2_synth "deepseek-v3"): first_k_dense_replace 3, intermediate 18432,
    # moe_intermediate 2048, 256 routed / 8 per token / 1 shared, n_group 8, topk_group 4, routed_scaling_factor
    # 2.5, norm_topk_prob, sigmoid (noaux_tc), vocab 129280, rms eps 1e-6, rope_theta 10000, max_position 163840,
    # yarn factor 40 over 4096 with mscale_all_dim 1, beta_fast 32, beta_slow 1. (The MTP block is not written.)
    "deepseek-v3.2": dict(n_vocab=129280, n_embd=7168, n_layer=61, n_head=128, n_ctx=163840, eps=1e-6,
                          rope_base=10000.0, n_ff=18432, n_dense_lead=3,
                          q_lora=1536, kv_lora=512, qk_nope=128, qk_rope=64, v_head=128, mla=True,
                          n_expert=256, n_expert_used=8, n_ff_exp=2048, n_shared=1,
                          gating="sigmoid", probs_bias=True, norm_w=True, w_scale=2.5, n_group=8, topk_group=4,
                          yarn=dict(factor=40.0, orig_ctx=4096, mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0),
                          idx_heads=64, idx_dim=128, idx_top_k=2048),
}


def probs_bias_std(p: dict) -> float:
    """exp_probs_b spread (the same rule as deepseek2: 0.2 around sigmoid probs, 0.8/E under softmax)."""
    return 0.2 if p["gating"] == "sigmoid" else 0.8 / p["n_expert"]


def plan_tensors(p: dict, *, all_optional: bool = False, tied_output: bool = False,
                 rope_scaling: str | None = None) -> list[TensorPlan]:
    """The tensors deepseek32.cpp:77-139 creates (the trunk), NumPy order, loader order."""
    check_mla_rope_scaling(ARCH, rope_scaling)
    D, V = p["n_embd"], p["n_vocab"]
    t = [TensorPlan("token_embd.weight", (V, D), "embed"), TensorPlan("output_norm.weight", (D,), "norm")]
    if not tied_output:
        t.append(TensorPlan("output.weight", (V, D), "output", D))
    for il in range(p["n_layer"]):
        t += mla_plans(il, p, all_optional=all_optional)
        t += indexer_plans(il, p)
        t += deepseek_ffn_plans(il, p, all_optional=all_optional, probs_bias_std=probs_bias_std(p))
    return t


def metadata(p: dict, *, all_optional: bool, rope_scaling: str | None, name: str) -> list[tuple[str, object, str]]:
    """Every key deepseek32.cpp:6-38 reads (spec 2.1), plus the optional ones with all_optional."""
    a = ARCH
    kv = deepseek_metadata(a, p, name=name, gating_id=GATING[p["gating"]])
    kv += [(f"{a}.attention.indexer.head_count", p["idx_heads"], "u32"),
           (f"{a}.attention.indexer.key_length", p["idx_dim"], "u32"),
           (f"{a}.attention.indexer.top_k", p["idx_top_k"], "u32")]
    kv += mla_rope_scaling_metadata(a, p, rope_scaling, all_optional=all_optional)
    if all_optional:
        kv += [(f"{a}.rope.dimension_sections", [p["qk_rope"] // 2, p["qk_rope"] // 2, 0, 0], "arr_u32"),
               (f"{a}.attention.layer_norm_epsilon", 1e-3, "f32")]
    return kv


def synth_resolve(p: dict, layers: int | None) -> dict:
    """`layers=N` keeps the first N blocks and lowers n_dense_lead so the last kept block is MoE."""
    if p["gating"] not in GATING:
        raise ConfigError(f"gating {p['gating']!r} is not one of {', '.join(GATING)}")
    if layers is not None:
        p = dict(p, n_layer=layers, n_dense_lead=min(p["n_dense_lead"], layers - 1))
    return p


def synth_plan(p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
    no_option(ARCH, fused_qkv=fused_qkv)
    return plan_tensors(p, all_optional=all_optional, tied_output=tied_output, rope_scaling=rope_scaling)


def synth_metadata(p: dict, *, all_optional=False, rope_scaling=None, name=""):
    return metadata(p, all_optional=all_optional, rope_scaling=rope_scaling, name=name)
