"""The names llama.cpp's graph gives, per arch, that a compare against it must have compared (data, one entry
per arch; `{}` = the layer index).

`rep.only_in_llamacpp` empty says refengine traces every tensor llama.cpp names; these lists say llama.cpp
still names them, so a compare cannot pass by comparing nothing. An arch without an entry (deepseek2, deepseek32,
glm-dsa) relies on `only_in_llamacpp` alone.

    expected_names(arch, kw, kinds) -> set of names
        kw: the write_synth options of the file; kinds: each block's `LayerSpec.attn` ("mha", "gdn", "kda", ...)
"""
from __future__ import annotations

GLOBAL_NAMES = ["embd", "result_norm", "result_output"]

# ---------------------------------------------------------------- llama, qwen3moe
LLAMA_NAMES = ["attn_norm-{}", "Qcur-{}", "Kcur-{}", "Vcur-{}", "kq-{}", "kq_soft_max-{}", "kqv-{}", "kqv_out-{}",
               "attn_out-{}", "ffn_inp-{}", "ffn_norm-{}", "l_out-{}"]
DENSE_NAMES = ["ffn_up-{}", "ffn_gate-{}", "ffn_swiglu-{}", "ffn_out-{}"]
MOE_NAMES = ["ffn_moe_logits-{}", "ffn_moe_probs-{}", "ffn_moe_topk-{}", "ffn_moe_weights-{}",
             "ffn_moe_weights_sum-{}", "ffn_moe_weights_norm-{}", "ffn_moe_up-{}", "ffn_moe_gate-{}",
             "ffn_moe_swiglu-{}", "ffn_moe_down-{}", "ffn_moe_weighted-{}", "ffn_moe_out-{}"]
QWEN_NAMES = ["attn_norm-{}", "Qcur_normed-{}", "Kcur_normed-{}", "Qcur-{}", "Kcur-{}", "Vcur-{}", "kq-{}",
              "kq_soft_max-{}", "kqv-{}", "kqv_out-{}",
              "ffn_inp-{}", "ffn_norm-{}", "l_out-{}"] + MOE_NAMES

# ---------------------------------------------------------------- qwen3next (gated DeltaNet + gated attention)
QWEN3NEXT_GDN = ["attn_norm", "linear_attn_qkv_mixed", "z", "linear_attn_mixed_ba", "b", "a", "a_softplus", "gate",
                 "conv_states", "conv_input", "conv_output_raw", "conv_output_silu", "q_conv", "k_conv",
                 "q_conv_predelta", "k_conv_predelta", "v_conv_predelta", "state_predelta", "attn_output",
                 "new_state", "final_output", "linear_attn_out"]
QWEN3NEXT_LEGACY = ["linear_attn_mixed_qkvz", "query_flat", "key_flat", "value_flat", "qkv_mixed"]
QWEN3NEXT_ATTN = ["attn_norm", "Qcur_full", "Qcur_normed", "Kcur_normed", "Qcur", "Kcur", "Vcur", "kq",
                  "kq_soft_max", "kqv", "attn_pregate", "gate_sigmoid", "attn_gated", "attn_output"]
QWEN3NEXT_FFN = ["attn_residual", "attn_post_norm", "ffn_moe_logits", "ffn_moe_probs", "ffn_moe_topk",
                 "ffn_moe_weights_norm", "ffn_moe_swiglu", "ffn_moe_out", "ffn_shexp", "shared_expert_gate",
                 "shared_expert_gate_sigmoid", "ffn_shexp_gated", "ffn_out", "l_out"]

# ---------------------------------------------------------------- kimi-linear (KDA + MLA without rope)
KIMI_LINEAR_KDA = ["attn_norm-{}", "g1 f_b(f_a(cur))-{}", "kda_g1-{}", "kda_beta-{}", "new_state-{}",
                   "attn_output-{}", "kda_normed-{}", "g2 g_b(g_a(cur_2d))-{}", "kda_out-{}", "ffn_inp-{}",
                   "ffn_norm-{}", "l_out-{}"]
KIMI_LINEAR_MLA = ["attn_norm-{}", "kqv_out-{}", "mla_out-{}", "ffn_inp-{}", "ffn_norm-{}", "l_out-{}"]
KIMI_LINEAR_ABSORBED = ["q_nope-{}", "q_pe-{}", "q_nope_absorbed-{}", "Qcur-{}", "Kcur-{}", "kqv_mla-{}"]
KIMI_LINEAR_LEGACY = ["mla_Q-{}", "mla_K-{}", "mla_V-{}"]

# ---------------------------------------------------------------- kimi-k3 (KDA + MLA, attention residuals, SiTU MoE)
KIMI_K3_KDA = ["attn_norm-{}", "kda_q_conv-{}", "kda_k_conv-{}", "kda_v_conv-{}", "kda_g1-{}", "kda_beta-{}",
               "kda_scan_out-{}", "kda_g2-{}", "kda_normed-{}", "prefix_sum_attn-{}", "ffn_norm-{}", "ffn_out-{}",
               "l_out-{}"]
KIMI_K3_MLA = ["attn_norm-{}", "kq_soft_max-{}", "kqv_mla-{}", "kqv_out-{}", "mla_gated-{}", "prefix_sum_attn-{}",
               "ffn_norm-{}", "l_out-{}"]
KIMI_K3_MOE = ["ffn_moe_logits-{}", "ffn_moe_topk-{}", "ffn_moe_situ-{}", "ffn_moe_out-{}", "ffn_shexp-{}"]

# ---------------------------------------------------------------- deepseek4 (mHC streams, compressed KV, hash MoE)
DS4_BLOCK = ["hc_attn_pre-{}", "attn_norm-{}", "qr-{}", "qr_norm-{}", "q_norm-{}", "q-{}", "kv_norm-{}", "kv-{}",
             "v_cont-{}", "kq-{}", "kq_soft_max-{}", "kqv-{}", "attn_derope-{}", "attn_wo_a-{}", "attn_out-{}",
             "hc_attn_post-{}", "hc_mixes-{}", "hc_pre-{}", "hc_post-{}", "hc_comb-{}", "hc_ffn_pre-{}",
             "ffn_norm-{}", "ffn_moe_logits-{}", "ffn_moe_probs-{}", "ffn_moe_topk-{}", "ffn_moe_weights_norm-{}",
             "ffn_moe_gate-{}", "ffn_moe_up-{}", "ffn_moe_swiglu_limited-{}", "ffn_moe_down-{}", "ffn_moe_out-{}",
             "ffn_gate-{}", "ffn_up-{}", "ffn_swiglu_limited-{}", "ffn_shexp-{}", "ffn_out-{}", "l_last-{}"]
DS4_KIND = {
    "swa": ["attn_raw-{}"],
    "hca": ["hca_state_kv-{}", "hca_state_score_ape-{}", "hca_state_compress-{}", "hca_raw_k-{}", "hca_comp_k-{}",
            "hca_k_all-{}", "hca_kq_mask-{}", "attn_hca-{}", "ffn_moe_probs_biased-{}"],
    "csa": ["csa_state_kv-{}", "csa_state_score_ape-{}", "csa_state_compress-{}", "lid_state_kv-{}",
            "lid_state_score_ape-{}", "lid_state_compress-{}", "lid_state_compress_rot-{}", "lid_q_rope-{}",
            "lid_q_rot-{}", "lid_k-{}", "lid_weights-{}", "lid_score_masked-{}", "lid_top_k-{}", "csa_raw_k-{}",
            "csa_comp_k-{}", "csa_k_all-{}", "csa_top_k_mask-{}", "csa_lid_kq_mask-{}", "attn_csa_lid-{}"],
}
DS4_GLOBAL = ["embd", "hc_init", "hc_head_mixes", "hc_head_pre", "hc_head", "result_norm", "result_output"]


def _deepseek4(arch, kw, kinds):
    """Every block's names and its ratio's (the tiny preset: block 0 hash-routed, so no probs_biased there)."""
    return set(DS4_GLOBAL) | {n.format(il) for il, kind in enumerate(kinds) for n in DS4_BLOCK + DS4_KIND[kind]}

# ---------------------------------------------------------------- glm5-next (KDA + nope MLA under the k-pool indexer)
G5_BLOCK = ["hc_attn_pre-{}", "attn_norm-{}", "hc_attn_post-{}", "hc_mixes-{}", "hc_pre-{}", "hc_post-{}",
            "hc_comb-{}", "hc_ffn_pre-{}", "ffn_norm-{}", "ffn_gate-{}", "ffn_up-{}", "ffn_out-{}", "l_out-{}"]
G5_KDA = ["kda_q_conv-{}", "kda_k_conv-{}", "kda_v_conv-{}", "kda_g1-{}", "kda_beta-{}", "new_state-{}",
          "attn_output-{}", "kda_scan_out-{}", "kda_normed-{}", "kda_g2-{}", "kda_out-{}"]
G5_MLA = ["q_resid-{}", "q_absorbed-{}", "kv_cmpr-{}", "v_cont-{}", "kq-{}", "kq_mask_dsa-{}", "kq_soft_max-{}",
          "kqv-{}", "kqv_mla-{}", "kqv_out-{}", "attn_out-{}"]
G5_INDEXER = ["indexer_q-{}", "indexer_k-{}", "indexer_gate-{}", "indexer_pool_k_new-{}", "indexer_pool_k-{}",
              "indexer_weights-{}", "indexer_score-{}", "indexer_top_k-{}", "indexer_sel-{}"]
G5_MOE = ["ffn_moe_logits-{}", "ffn_moe_probs-{}", "ffn_moe_probs_biased-{}", "ffn_moe_topk-{}",
          "ffn_moe_weights_norm-{}", "ffn_moe_gate-{}", "ffn_moe_up-{}", "ffn_moe_down-{}", "ffn_moe_out-{}",
          "ffn_shexp-{}"]
G5_GLOBAL = ["inp_embd", "hc_init", "hc_head", "result_norm", "result_output"]


def _glm5_next(arch, kw, kinds):
    """The tiny preset's blocks: KDA or MLA (with its indexer's names where it runs one), dense block 0, clamped
    SwiGLU where the block's clamp is > 0 (`_limited` names)."""
    from refengine.archs.glm5_next_synth import TINY
    names = set(G5_GLOBAL)
    for il, kind in enumerate(kinds):
        clamp = TINY["swiglu_clamp"][il] > 0
        own = G5_BLOCK + (G5_KDA if kind == "kda" else G5_MLA + (G5_INDEXER if TINY["idx_types"][il] else []))
        own += [f"ffn_swiglu{'_limited' if clamp else ''}-{{}}"]
        if il >= TINY["n_dense_lead"]:
            own += G5_MOE + [f"ffn_moe_swiglu{'_limited' if clamp else ''}-{{}}"]
        names |= {n.format(il) for n in own}
    return names


# ---------------------------------------------------------------- qwen4exp (GDN + QSA over gated streams, n-gram layer)
QWEN4EXP_GLOBAL = ["model.input_embed", "ple_embd", "hc_init", "hc_norm", "hc_gate", "result_norm", "result_output"]
QWEN4EXP_GDN = ["conv_state_at", "linear_attn_qkv_mixed", "z", "alpha", "a_softplus", "gate", "beta", "beta_sigmoid",
                "state_predelta", "conv_output_raw", "conv_output_silu", "q_conv", "k_conv", "q_conv_predelta",
                "k_conv_predelta", "v_conv_predelta", "attn_output", "new_state", "final_output", "linear_attn_out"]
QWEN4EXP_QSA = ["indexer_k_raw", "indexer_k_pooled", "indexer_k", "indexer_q", "indexer_score", "indexer_score_tokens",
                "indexer_top_k", "Qcur_full", "Qcur_reshaped", "gate_reshaped", "Qcur_normed", "Kcur_normed", "Qcur",
                "Kcur", "Vcur", "kq", "kq_soft_max", "kqv", "attn_pregate", "gate_sigmoid", "attn_gated",
                "attn_output"]
QWEN4EXP_BLOCK = ["hc_norm", "hc_gate", "hc_mixed", "hc_inject", "hc_combine", "ffn_moe_logits", "ffn_moe_probs",
                  "ffn_moe_topk", "ffn_moe_weights_norm", "ffn_moe_swiglu", "ffn_moe_out", "ffn_shexp",
                  "shared_expert_gate", "shared_expert_gate_sigmoid", "ffn_shexp_gated", "ffn_out", "l_last"]
QWEN4EXP_PLE = ["ple_gate", "ple_gated_value", "ple_conv_out"]


def _qwen4exp(arch, kw, kinds, ple_layer=2):
    want = set(QWEN4EXP_GLOBAL)
    for il, kind in enumerate(kinds):
        names = QWEN4EXP_BLOCK + (QWEN4EXP_GDN if kind == "gdn" else QWEN4EXP_QSA)
        want |= {f"{n}-{il}" for n in names + (QWEN4EXP_PLE if il == ple_layer else [])}
    return want


def _llama(arch, kw, kinds):
    moe = arch == "qwen3moe" or kw.get("preset") == "tiny-moe"
    per = QWEN_NAMES if arch == "qwen3moe" else LLAMA_NAMES + (MOE_NAMES if moe else DENSE_NAMES)
    if kw.get("all_optional"):   # llama.cpp names a scaled expert output ffn_moe_up_scaled etc.; group routing
        per = [n.replace("_up-", "_up_scaled-").replace("_gate-", "_gate_scaled-").replace("_down-", "_down_scaled-")
               if n.startswith("ffn_moe_") else n for n in per]
        if moe:
            per = per + ["ffn_moe_group_topk-{}", "ffn_moe_probs_masked-{}"]
    return set(GLOBAL_NAMES) | {n.format(il) for il in range(len(kinds)) for n in per}


def _qwen3next(arch, kw, kinds):
    legacy = kw.get("overrides", {}).get("legacy_ssm_in", False)
    want = {"result_norm", "result_output"}
    for il, kind in enumerate(kinds):
        if kind == "gdn":
            names = QWEN3NEXT_GDN + (QWEN3NEXT_LEGACY if legacy else [])
            if legacy:
                names = [n for n in names if n != "linear_attn_qkv_mixed"]
        else:
            names = QWEN3NEXT_ATTN
        want |= {f"{n}-{il}" for n in names + QWEN3NEXT_FFN}
    return want


def _kimi_linear(arch, kw, kinds):
    mla = KIMI_LINEAR_MLA + (KIMI_LINEAR_LEGACY if kw.get("preset") == "tiny-legacy" else KIMI_LINEAR_ABSORBED)
    return {n.format(il) for il, kind in enumerate(kinds) for n in (KIMI_LINEAR_KDA if kind == "kda" else mla)}


def _kimi_k3(arch, kw, kinds):
    """The tiny preset: block 0 dense, blocks 1.. latent MoE; attention residuals on."""
    want = {n.format(il) for il, kind in enumerate(kinds) for n in (KIMI_K3_KDA if kind == "kda" else KIMI_K3_MLA)}
    return want | {n.format(il) for il in range(1, len(kinds)) for n in KIMI_K3_MOE} | {"res_probs", "res_probs-0",
                                                                                         "inp_embd"}


EXPECTED = {"llama": _llama, "qwen3moe": _llama, "qwen3next": _qwen3next, "kimi-linear": _kimi_linear,
            "kimi-k3": _kimi_k3, "deepseek4": _deepseek4, "qwen4exp": _qwen4exp, "glm5-next": _glm5_next}


def expected_names(arch: str, kw: dict, kinds: list[str]) -> set[str]:
    fn = EXPECTED.get(arch)
    return fn(arch, kw, kinds) if fn else set()
