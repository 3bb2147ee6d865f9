"""The synthetic `deepseek2` plans (DeepSeek-V2/V3, Kimi-K2): MLA, q-LoRA, grouped sigmoid routing.

    write_synth("deepseek2", "ds.gguf", preset="tiny", wtype="Q4_K", seed=0, all_optional=True)

The tensor names, shapes and keys are the ones llama.cpp's deepseek2 loader asks for
(`src/models/deepseek2.cpp` load_arch_hparams / load_arch_tensors, llama-cpp-python 0.3.36), written with
`refengine.synth`'s writer, value generators and encoder. Dimension letters:

    D model dim   V vocab   H heads   Dq q-LoRA rank (0: plain attn_q)   C kv-LoRA rank (latent)
    dn qk_nope    R qk_rope (n_rot)   dv v_head   F dense FFN   E experts   A active   Fe expert FFN   S shared

Presets (parameter names below; `PRESETS[name]`):
- `tiny`         q-LoRA MLA, 1 dense + 2 MoE blocks, sigmoid + exp_probs_b, norm, scale 2.5 (V3 shape, small).
- `tiny-lite`    plain attn_q (`attention.q_lora_rank = 0`), softmax, no bias, no norm (V2-Lite style).
- `tiny-groups`  16 experts in 4 groups, 2 groups used, sigmoid + bias (V3 routing), first block MoE.
- `tiny-legacy`  no key_length_mla/value_length_mla: llama.cpp takes the non-absorbed path with `attn_kv_b`.
- `deepseek-v3`, `kimi-k2`: published shapes (cited beside each), YaRN as published. Too big to write whole;
  use `layers=N`, or `plan_tensors` for arithmetic.

`layers=N` keeps the first N blocks. A preset whose leading dense blocks would cover all N has its
`n_dense_lead` lowered to N-1, so the last kept block is always MoE (layers=1 gives one MoE block).

`rope_scaling`: None keeps the preset's (YaRN for the real presets, none for the tiny ones); "none" turns it
off; "yarn" uses the preset's YaRN, or factor 4 over n_ctx/4 with mscale_all_dim 1 for presets without one;
"linear" factor 4 (deepseek2 still multiplies kq_scale by (1 + 0.1 ln 4)^2 then, deepseek2.cpp:433-443).
deepseek2 has no rope-factor tensors, so "longrope" is refused.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..synthplan import TensorPlan, deepseek_ffn_plans, deepseek_metadata, mla_plans, no_option

ARCH = "deepseek2"

# expert_gating_func values (llama-hparams.h LLAMA_EXPERT_GATING_FUNC_TYPE_*)
GATING = {"softmax": 1, "sigmoid": 2}

# ---------------------------------------------------------------- presets
#
# Keys: n_vocab n_embd n_layer n_head n_ctx eps rope_base | n_ff n_dense_lead | q_lora kv_lora qk_nope qk_rope
# v_head mla | n_expert n_expert_used n_ff_exp n_shared gating probs_bias norm_w w_scale n_group topk_group |
# yarn: None or dict(factor, orig_ctx, mscale_all_dim[, beta_fast, beta_slow]).

_TINY = dict(n_vocab=256, n_embd=256, n_layer=3, n_head=4, n_ctx=512, eps=1e-6, rope_base=10000.0,
             n_ff=512, n_dense_lead=1,
             q_lora=128, kv_lora=128, qk_nope=64, qk_rope=32, v_head=64, mla=True,
             n_expert=8, n_expert_used=2, n_ff_exp=128, n_shared=1,
             gating="sigmoid", probs_bias=True, norm_w=True, w_scale=2.5, n_group=0, topk_group=0,
             yarn=None)

PRESETS: dict[str, dict] = {
    "tiny": _TINY,
    # V2-Lite style: no q-LoRA, softmax over all experts, no bias, weights not renormalised, 2 shared experts.
    # q_lora = 0 is *written* (attention.q_lora_rank = 0): deepseek2.cpp:12-14 requires the key unless
    # n_layer is 26/27 (or 48 with vocab 128256), accepts 0, and :105-110 then creates attn_q instead of q_a/q_b.
    "tiny-lite": dict(_TINY, q_lora=0, kv_lora=64, qk_nope=32, qk_rope=32, v_head=32, n_expert_used=3,
                      n_shared=2, gating="softmax", probs_bias=False, norm_w=False, w_scale=1.0),
    # V3 routing: sigmoid + bias, 4 groups of 4, best 2 groups by top-2 sum; the first block is already MoE.
    "tiny-groups": dict(_TINY, n_layer=2, n_dense_lead=0, n_expert=16, n_expert_used=4, n_ff_exp=64,
                        n_group=4, topk_group=2),
    # Files converted before attn_k_b/attn_v_b existed: no key_length_mla -> is_mla() false
    # (llama-hparams.cpp:298-303) -> attn_kv_b {C, H*(dn+dv)} and the MHA path (deepseek2.cpp:593-634).
    "tiny-legacy": dict(_TINY, mla=False, gating="softmax", probs_bias=False, norm_w=False, w_scale=1.0),

    # DeepSeek-V3 (671B), from its published config.json (Hugging Face deepseek-ai/DeepSeek-V3/config.json;
    # the same numbers in GitHub deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json, e.g. the copy in
    # Bobchenyx/DeepSeek-V3-tflsxyy): hidden 7168, 61 layers, first_k_dense_replace 3, 128 heads,
    # q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64, v_head 128, intermediate 18432, moe_intermediate 2048,
    # 256 routed / 8 per token / 1 shared, n_group 8, topk_group 4, routed_scaling_factor 2.5, norm_topk_prob
    # true, scoring sigmoid (noaux_tc -> e_score_correction_bias = exp_probs_b), vocab 129280, rms eps 1e-6,
    # rope_theta 10000, max_position 163840, rope_scaling yarn factor 40, original_max_position 4096,
    # mscale 1.0, mscale_all_dim 1.0, beta_fast 32, beta_slow 1. (Its 1 MTP block is not written.)
    "deepseek-v3": dict(n_vocab=129280, n_embd=7168, n_layer=61, n_head=128, n_ctx=163840, eps=1e-6,
                        rope_base=10000.0, n_ff=18432, n_dense_lead=3,
                        q_lora=1536, kv_lora=512, qk_nope=128, qk_rope=64, v_head=128, mla=True,
                        n_expert=256, n_expert_used=8, n_ff_exp=2048, n_shared=1,
                        gating="sigmoid", probs_bias=True, norm_w=True, w_scale=2.5, n_group=8, topk_group=4,
                        yarn=dict(factor=40.0, orig_ctx=4096, mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0)),
    # Kimi-K2-Instruct (1T), from Hugging Face moonshotai/Kimi-K2-Instruct/config.json (model summary also in
    # GitHub MoonshotAI/Kimi-K2 README.md "2. Model Summary": 61 layers incl. 1 dense, 64 heads, 384 experts,
    # 8 selected, 1 shared, expert hidden 2048, hidden 7168, vocab 160K): first_k_dense_replace 1, q_lora 1536,
    # kv_lora 512, qk_nope 128, qk_rope 64, v_head 128, intermediate 18432, n_group 1, topk_group 1,
    # routed_scaling_factor 2.827, norm_topk_prob true, scoring sigmoid, vocab 163840, rms eps 1e-6,
    # rope_theta 50000, max_position 131072, rope_scaling yarn factor 32, original_max_position 4096,
    # mscale 1.0, mscale_all_dim 1.0, beta_fast 1.0, beta_slow 1.0 (llama.cpp does not read the betas for
    # deepseek2 and runs its defaults 32 / 1: llama-hparams.h:161-162).
    "kimi-k2": dict(n_vocab=163840, n_embd=7168, n_layer=61, n_head=64, n_ctx=131072, eps=1e-6,
                    rope_base=50000.0, n_ff=18432, n_dense_lead=1,
                    q_lora=1536, kv_lora=512, qk_nope=128, qk_rope=64, v_head=128, mla=True,
                    n_expert=384, n_expert_used=8, n_ff_exp=2048, n_shared=1,
                    gating="sigmoid", probs_bias=True, norm_w=True, w_scale=2.827, n_group=1, topk_group=1,
                    yarn=dict(factor=32.0, orig_ctx=4096, mscale_all_dim=1.0, beta_fast=1.0, beta_slow=1.0)),
}

# Optional tensors llama.cpp's loader accepts for deepseek2 (the generic `.scale` / `.input_scale` pass,
# llama-model.cpp:1634-1773) but that its deepseek2 graph never applies: it multiplies attn_q, dense FFN,
# shared and routed experts without their scales (deepseek2.cpp:510, :647-651, :655-668, :673-678) and no
# graph uses an `.input_scale`. Only `attn_output.scale` is applied (build_attn -> build_lora_mm(wo, wo_s)).
IGNORED_BY_LLAMACPP = (".input_scale", "attn_q.scale", "ffn_gate.scale", "ffn_up.scale", "ffn_down.scale",
                       "_exps.scale", "_shexp.scale")


def ignored_by_llamacpp(name: str) -> bool:
    """True for an optional tensor llama.cpp loads for deepseek2 but does not use (IGNORED_BY_LLAMACPP)."""
    return name.endswith(IGNORED_BY_LLAMACPP)


def resolve(preset: str = "tiny", *, layers: int | None = None, overrides: dict | None = None) -> dict:
    """The preset's parameters with `overrides` applied and cut to `layers` blocks (see module docstring)."""
    if preset not in PRESETS:
        raise ConfigError(f"{ARCH} has no preset {preset!r} (available: {', '.join(PRESETS)})")
    p = dict(PRESETS[preset])
    unknown = set(overrides or {}) - set(p)
    if unknown:
        raise ConfigError(f"unknown {ARCH} preset entries {sorted(unknown)}; known: {sorted(p)}")
    p.update(overrides or {})
    if layers is not None:
        if not 1 <= layers <= p["n_layer"]:
            raise ConfigError(f"--layers must be in 1..{p['n_layer']} for preset {preset!r}")
        p["n_layer"] = layers
        p["n_dense_lead"] = min(p["n_dense_lead"], layers - 1)    # keep the last block MoE
    if p["gating"] not in GATING:
        raise ConfigError(f"gating {p['gating']!r} is not one of {', '.join(GATING)}")
    return p


def _yarn(p: dict, rope_scaling: str | None) -> dict | None:
    """The YaRN parameters in effect (None: no scaling or linear)."""
    if rope_scaling is None:
        return p["yarn"]
    if rope_scaling == "yarn":
        return p["yarn"] or dict(factor=4.0, orig_ctx=p["n_ctx"] // 4, mscale_all_dim=1.0)
    return None


def _check_rope_scaling(rope_scaling: str | None) -> None:
    if rope_scaling == "longrope":
        raise ConfigError(f"{ARCH} has no rope factor tensors: longrope is not an option (use none, linear or yarn)")
    if rope_scaling not in (None, "none", "linear", "yarn"):
        raise ConfigError(f"rope scaling {rope_scaling!r} is not one of none, linear, yarn")


# ---------------------------------------------------------------- tensors

def plan_tensors(p: dict, *, all_optional: bool = False, tied_output: bool = False,
                 rope_scaling: str | None = None) -> list[TensorPlan]:
    """The tensors llama.cpp's deepseek2 loader creates (deepseek2.cpp:84-159), NumPy order, loader order.

    `all_optional` adds exp_probs_b where the preset has none and every `.scale` / `.input_scale` the generic
    pass would load (see IGNORED_BY_LLAMACPP for the ones the graph then ignores); `tied_output` drops
    output.weight (llama.cpp then uses token_embd).
    """
    _check_rope_scaling(rope_scaling)
    D, V = p["n_embd"], p["n_vocab"]
    t = [TensorPlan("token_embd.weight", (V, D), "embed"),
         TensorPlan("output_norm.weight", (D,), "norm")]
    if not tied_output:
        t.append(TensorPlan("output.weight", (V, D), "output", D))
    for il in range(p["n_layer"]):
        t += mla_plans(il, p, all_optional=all_optional)
        t += deepseek_ffn_plans(il, p, all_optional=all_optional, probs_bias_std=probs_bias_std(p))
    return t


def n_params(plan: list[TensorPlan]) -> int:
    """Number of stored values in a plan."""
    return sum(int(np.prod(tp.shape, dtype=np.int64)) for tp in plan)


# ---------------------------------------------------------------- metadata

def metadata(p: dict, *, all_optional: bool, rope_scaling: str | None,
             name: str) -> list[tuple[str, object, str]]:
    """(key, value, gguf value type) rows: every key llama.cpp reads for deepseek2 (spec 1.1).

    MLA files carry key_length = C+R / value_length = C (the cache row sizes) and key_length_mla = dn+R /
    value_length_mla = dv, head_count_kv = 1 (as convert_hf_to_gguf writes them); legacy files carry the real
    head sizes and head_count_kv = H. `all_optional` adds rope.scaling.attn_factor (with any scaling) and the
    query temperature keys (attention.temperature_scale / temperature_length, deepseek2.cpp:41-42).
    """
    _check_rope_scaling(rope_scaling)
    a = ARCH
    kv = deepseek_metadata(a, p, name=name, gating_id=GATING[p["gating"]])
    yarn = _yarn(p, rope_scaling)
    if yarn is not None:
        kv += [(f"{a}.rope.scaling.type", "yarn", "str"),
               (f"{a}.rope.scaling.factor", yarn["factor"], "f32"),
               (f"{a}.rope.scaling.original_context_length", yarn["orig_ctx"], "u32"),
               # the converter stores 0.1 * mscale_all_dim; llama.cpp divides by 0.1 again (deepseek2.cpp:34-38)
               (f"{a}.rope.scaling.yarn_log_multiplier", 0.1 * yarn["mscale_all_dim"], "f32")]
        # written by the converter when config.json has them; deepseek2 does not read them
        kv += [(f"{a}.rope.scaling.yarn_{k}", yarn[k], "f32") for k in ("beta_fast", "beta_slow") if k in yarn]
    elif rope_scaling == "linear":
        kv += [(f"{a}.rope.scaling.type", "linear", "str"), (f"{a}.rope.scaling.factor", 4.0, "f32")]
    if all_optional:
        if yarn is not None or rope_scaling == "linear":
            kv.append((f"{a}.rope.scaling.attn_factor", 1.25, "f32"))
        kv += [(f"{a}.attention.temperature_scale", 0.1, "f32"),
               (f"{a}.attention.temperature_length", 4, "u32")]
    return kv


# ---------------------------------------------------------------- values

def probs_bias_std(p: dict) -> float:
    """exp_probs_b spread: 0.2 around sigmoid probs (spread about 0.1-0.9 with the router's 2/sqrt(D) std) moves
    several experts across the top-k boundary; under softmax (probs ~1/E) it is scaled to 0.2/E*4."""
    return 0.2 if p["gating"] == "sigmoid" else 0.8 / p["n_expert"]


# ---------------------------------------------------------------- the arch's synth entry points (refengine.synth)

def synth_resolve(p: dict, layers: int | None) -> dict:
    """`layers=N` keeps the first N blocks and lowers n_dense_lead so the last kept block is MoE."""
    if layers is not None:
        p = dict(p, n_layer=layers, n_dense_lead=min(p["n_dense_lead"], layers - 1))
    return p


def synth_plan(p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
    no_option(ARCH, fused_qkv=fused_qkv)
    return plan_tensors(p, all_optional=all_optional, tied_output=tied_output, rope_scaling=rope_scaling)


def synth_metadata(p: dict, *, all_optional=False, rope_scaling=None, name=""):
    return metadata(p, all_optional=all_optional, rope_scaling=rope_scaling, name=name)
