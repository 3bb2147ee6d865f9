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

from functools import partial

import numpy as np

from ..errors import ConfigError
from ..synthplan import TensorPlan
from . import deepseek_family_synth as family
from .deepseek_family_synth import GATING, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "deepseek2"

# ---------------------------------------------------------------- presets
#
# Keys: deepseek_family_synth's (no indexer).

PRESETS: dict[str, dict] = {
    "tiny": dict(family.TINY),
    # V2-Lite style: no q-LoRA, softmax over all experts, no bias, weights not renormalised, 2 shared experts.
    # q_lora = 0 is *written* (attention.q_lora_rank = 0): deepseek2.cpp:12-14 requires the key unless
    # n_layer is 26/27 (or 48 with vocab 128256), accepts 0, and :105-110 then creates attn_q instead of q_a/q_b.
    "tiny-lite": dict(family.TINY, q_lora=0, kv_lora=64, qk_nope=32, qk_rope=32, v_head=32, n_expert_used=3,
                      n_shared=2, gating="softmax", probs_bias=False, norm_w=False, w_scale=1.0),
    # V3 routing: sigmoid + bias, 4 groups of 4, best 2 groups by top-2 sum; the first block is already MoE.
    "tiny-groups": dict(family.TINY, n_layer=2, n_dense_lead=0, n_expert=16, n_expert_used=4, n_ff_exp=64,
                        n_group=4, topk_group=2),
    # Files converted before attn_k_b/attn_v_b existed: no key_length_mla -> is_mla() false
    # (llama-hparams.cpp:298-303) -> attn_kv_b {C, H*(dn+dv)} and the MHA path (deepseek2.cpp:593-634).
    "tiny-legacy": dict(family.TINY, mla=False, gating="softmax", probs_bias=False, norm_w=False, w_scale=1.0),

    "deepseek-v3": dict(family.DEEPSEEK_V3),    # published shapes, cited in deepseek_family_synth
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
    if layers is not None and not 1 <= layers <= p["n_layer"]:
        raise ConfigError(f"--layers must be in 1..{p['n_layer']} for preset {preset!r}")
    return synth_resolve(p, layers)


def n_params(plan: list[TensorPlan]) -> int:
    """Number of stored values in a plan."""
    return sum(int(np.prod(tp.shape, dtype=np.int64)) for tp in plan)


def optional_keys(p: dict) -> list[tuple[str, object, str]]:
    """What `all_optional` adds beyond the family's keys: the query temperature (deepseek2.cpp:41-42)."""
    return [("attention.temperature_scale", 0.1, "f32"), ("attention.temperature_length", 4, "u32")]


# The tensors llama.cpp's deepseek2 loader creates (deepseek2.cpp:84-159), NumPy order, loader order; with
# all_optional every `.scale` / `.input_scale` the generic pass would load (see IGNORED_BY_LLAMACPP for the ones the
# graph then ignores). The keys: every key llama.cpp reads for deepseek2 (spec 1.1). MLA files carry key_length =
# C+R / value_length = C (the cache row sizes) and key_length_mla = dn+R / value_length_mla = dv, head_count_kv = 1
# (as convert_hf_to_gguf writes them); legacy files carry the real head sizes and head_count_kv = H.
plan_tensors = partial(family.plan_tensors, ARCH, full_layers=None)
metadata = partial(family.metadata, ARCH, full_layers=None, optional_keys=optional_keys)
synth_plan = partial(family.synth_plan, ARCH, full_layers=None)
synth_metadata = partial(family.synth_metadata, ARCH, full_layers=None, optional_keys=optional_keys)
