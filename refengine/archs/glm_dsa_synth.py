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

from ..errors import ConfigError
from ..synthplan import (TensorPlan, check_mla_rope_scaling, deepseek_ffn_plans, deepseek_metadata, indexer_plans,
                         mla_plans, mla_rope_scaling_metadata, no_option)

ARCH = "glm-dsa"
GATING = {"softmax": 1, "sigmoid": 2}
GLM_5_2_TYPES = (1, 1) + (1, 0, 0, 0) * 19          # glm-dsa.cpp:5-28: 21 full of 78

_TINY = dict(n_vocab=256, n_embd=256, n_layer=3, n_head=4, n_ctx=512, eps=1e-5, rope_base=10000.0,
             n_ff=512, n_dense_lead=1,
             q_lora=128, kv_lora=128, qk_nope=64, qk_rope=32, v_head=64, mla=True,
             n_expert=8, n_expert_used=2, n_ff_exp=128, n_shared=1,
             gating="sigmoid", probs_bias=True, norm_w=True, w_scale=2.5, n_group=0, topk_group=0,
             yarn=None,
             idx_heads=16, idx_dim=64, idx_top_k=8, idx_k_std=0.0, idx_types=None)

PRESETS: dict[str, dict] = {
    "tiny": _TINY,
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


def probs_bias_std(p: dict) -> float:
    return 0.2 if p["gating"] == "sigmoid" else 0.8 / p["n_expert"]


def full_layers(p: dict) -> list[bool]:
    """Which layers run their own indexer, by the rule llama.cpp applies to this file (archs/glm_dsa.py)."""
    if p["idx_types"] is not None:
        return [bool(x) for x in p["idx_types"][:p["n_layer"]]]
    if p["n_ctx"] < 1048576:
        return [True] * p["n_layer"]
    return [il < len(GLM_5_2_TYPES) and bool(GLM_5_2_TYPES[il]) for il in range(p["n_layer"])]


def plan_tensors(p: dict, *, all_optional: bool = False, tied_output: bool = False,
                 rope_scaling: str | None = None) -> list[TensorPlan]:
    """The tensors glm-dsa.cpp:110-173 creates (the trunk); a shared layer's indexer tensors only with all_optional."""
    check_mla_rope_scaling(ARCH, rope_scaling)
    D, V = p["n_embd"], p["n_vocab"]
    t = [TensorPlan("token_embd.weight", (V, D), "embed"), TensorPlan("output_norm.weight", (D,), "norm")]
    if not tied_output:
        t.append(TensorPlan("output.weight", (V, D), "output", D))
    for il, full in enumerate(full_layers(p)):
        t += mla_plans(il, p, all_optional=all_optional)
        if full or all_optional:
            t += indexer_plans(il, p)
        t += deepseek_ffn_plans(il, p, all_optional=all_optional, probs_bias_std=probs_bias_std(p))
    return t


def metadata(p: dict, *, all_optional: bool, rope_scaling: str | None, name: str) -> list[tuple[str, object, str]]:
    """Every key glm-dsa.cpp:30-66 reads; expert_gating_func is written (converters do; absent means sigmoid)."""
    a = ARCH
    kv = deepseek_metadata(a, p, name=name, gating_id=GATING[p["gating"]])
    kv += [(f"{a}.attention.indexer.head_count", p["idx_heads"], "u32"),
           (f"{a}.attention.indexer.key_length", p["idx_dim"], "u32"),
           (f"{a}.attention.indexer.top_k", p["idx_top_k"], "u32")]
    if p["idx_types"] is not None:
        kv.append((f"{a}.attention.indexer.types", list(p["idx_types"][:p["n_layer"]]), "arr_bool"))
    kv += mla_rope_scaling_metadata(a, p, rope_scaling, all_optional=all_optional)
    if all_optional:
        kv += [(f"{a}.attention.layer_norm_epsilon", 1e-3, "f32")]
    return kv


def synth_resolve(p: dict, layers: int | None) -> dict:
    """`layers=N` keeps the first N blocks (and their indexer types), the last one MoE."""
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
