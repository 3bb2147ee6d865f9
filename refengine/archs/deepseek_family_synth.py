"""The DeepSeek family's synthetic plans (deepseek2, deepseek32, glm-dsa): written once, each arch's synth module
passing what differs.

Names, shapes and keys are the ones llama.cpp's deepseek2 / deepseek32 / glm-dsa loaders ask for
(`src/models/<arch>.cpp` load_arch_hparams / load_arch_tensors, llama-cpp-python 0.3.36). Dimension letters:

    D model dim   V vocab   H heads   Dq q-LoRA rank (0: plain attn_q)   C kv-LoRA rank (latent)
    dn qk_nope    R qk_rope (n_rot)   dv v_head   F dense FFN   E experts   A active   Fe expert FFN   S shared
    Hi indexer heads   di indexer head dim   k indexer top-k

Preset entries: n_vocab n_embd n_layer n_head n_ctx eps rope_base | n_ff n_dense_lead | q_lora kv_lora qk_nope
qk_rope v_head mla | n_expert n_expert_used n_ff_exp n_shared gating probs_bias norm_w w_scale n_group topk_group |
yarn: None or dict(factor, orig_ctx, mscale_all_dim[, beta_fast, beta_slow]) | (DSA) idx_heads idx_dim idx_top_k
[idx_k_std] [idx_types].

What an arch passes: `full_layers(p)` (per layer, True where the layer runs its own indexer; None: no indexer,
deepseek2) and `optional_keys(p)` (the keys `all_optional` adds beyond the family's, without the `{arch}.`
prefix). `layers=N` keeps the first N blocks, the last one MoE (`synth_resolve`).
"""
from __future__ import annotations

from ..errors import ConfigError
from ..synthplan import TensorPlan, mla_metadata, mla_plans, moe_metadata, no_option, scaled_ffn_plans, weight_plans

GATING = {"softmax": 1, "sigmoid": 2}     # expert_gating_func values (llama-hparams.h LLAMA_EXPERT_GATING_FUNC_TYPE_*)

# deepseek2's `tiny`, the base of every member's: q-LoRA MLA, 1 dense + 2 MoE blocks, sigmoid + exp_probs_b,
# norm, scale 2.5 (V3 shape, small).
TINY = dict(n_vocab=256, n_embd=256, n_layer=3, n_head=4, n_ctx=512, eps=1e-6, rope_base=10000.0,
            n_ff=512, n_dense_lead=1,
            q_lora=128, kv_lora=128, qk_nope=64, qk_rope=32, v_head=64, mla=True,
            n_expert=8, n_expert_used=2, n_ff_exp=128, n_shared=1,
            gating="sigmoid", probs_bias=True, norm_w=True, w_scale=2.5, n_group=0, topk_group=0,
            yarn=None)

# The DSA members' tiny indexer: 16 heads x 64 dims, top-k 8 (a 16..64-token context drops keys).
TINY_INDEXER = dict(idx_heads=16, idx_dim=64, idx_top_k=8, idx_k_std=0.0)

# DeepSeek-V3 (671B), from its published config.json (Hugging Face deepseek-ai/DeepSeek-V3/config.json;
# the same numbers in GitHub deepseek-ai/DeepSeek-V3 inference/configs/config_671B.json, e.g. the copy in
# Bobchenyx/DeepSeek-V3-tflsxyy): hidden 7168, 61 layers, first_k_dense_replace 3, 128 heads,
# q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64, v_head 128, intermediate 18432, moe_intermediate 2048,
# 256 routed / 8 per token / 1 shared, n_group 8, topk_group 4, routed_scaling_factor 2.5, norm_topk_prob
# true, scoring sigmoid (noaux_tc -> e_score_correction_bias = exp_probs_b), vocab 129280, rms eps 1e-6,
# rope_theta 10000, max_position 163840, rope_scaling yarn factor 40, original_max_position 4096,
# mscale 1.0, mscale_all_dim 1.0, beta_fast 32, beta_slow 1. (Its 1 MTP block is not written.)
DEEPSEEK_V3 = dict(n_vocab=129280, n_embd=7168, n_layer=61, n_head=128, n_ctx=163840, eps=1e-6,
                   rope_base=10000.0, n_ff=18432, n_dense_lead=3,
                   q_lora=1536, kv_lora=512, qk_nope=128, qk_rope=64, v_head=128, mla=True,
                   n_expert=256, n_expert_used=8, n_ff_exp=2048, n_shared=1,
                   gating="sigmoid", probs_bias=True, norm_w=True, w_scale=2.5, n_group=8, topk_group=4,
                   yarn=dict(factor=40.0, orig_ctx=4096, mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0))


def every_layer(p: dict) -> list[bool]:
    """`full_layers` of an arch whose every layer runs its own indexer (deepseek32)."""
    return [True] * p["n_layer"]


# ---------------------------------------------------------------- tensors


def indexer_plans(il: int, p: dict) -> list[TensorPlan]:
    """The DSA lightning indexer's tensors (deepseek32.cpp:109-114). The key norm weight is written near 1 and
    its bias small, like any norm / bias; the rest are matrices. p["idx_k_std"] (optional) sets attn_k's spread:
    a tiny one makes the key LayerNorm's eps visible (tests of glm-dsa's eps-0 quirk)."""
    b, D = f"blk.{il}.indexer.", p["n_embd"]
    Hi, di, Dq = p["idx_heads"], p["idx_dim"], p["q_lora"]
    return [TensorPlan(b + "k_norm.weight", (di,), "norm"),
            TensorPlan(b + "k_norm.bias", (di,), "bias"),
            TensorPlan(b + "proj.weight", (Hi, D), "matrix", D),                 # ne {D, Hi}
            TensorPlan(b + "attn_k.weight", (di, D), "matrix", D, std=p.get("idx_k_std", 0.0)),   # ne {D, di}
            TensorPlan(b + "attn_q_b.weight", (Hi * di, Dq), "matrix", Dq)]      # ne {Dq, Hi*di}


def ffn_plans(il: int, p: dict, *, all_optional: bool, probs_bias_std: float) -> list[TensorPlan]:
    """ffn_norm, then a dense SwiGLU FFN (il < n_dense_lead) or router, optional exp_probs_b, routed experts
    (gate/down/up) and shared experts (deepseek2.cpp:124-158, deepseek32.cpp:107-139)."""
    b, D = f"blk.{il}.", p["n_embd"]
    E, Fe, S, F = p["n_expert"], p["n_ff_exp"], p["n_shared"], p["n_ff"]
    mat = lambda *a, **k: weight_plans(*a, all_optional=all_optional, **k)   # noqa: E731
    t = [TensorPlan(b + "ffn_norm.weight", (D,), "norm")]
    if il < p["n_dense_lead"]:
        return t + scaled_ffn_plans(b, D, F, all_optional=all_optional)
    t += mat(b + "ffn_gate_inp", (E, D), D, kind="router")               # ne {D, E}
    if p["probs_bias"] or all_optional:
        t.append(TensorPlan(b + "exp_probs_b.bias", (E,), "probs_bias", std=probs_bias_std))
    t += mat(b + "ffn_down_exps", (E, D, Fe), Fe, scales=E)               # ne {Fe, D, E}
    t += mat(b + "ffn_gate_exps", (E, Fe, D), D, scales=E)                # ne {D, Fe, E}
    t += mat(b + "ffn_up_exps", (E, Fe, D), D, scales=E)
    t += mat(b + "ffn_gate_shexp", (Fe * S, D), D, scales=1)              # ne {D, Fe*S}
    t += mat(b + "ffn_down_shexp", (D, Fe * S), Fe * S, scales=1)
    t += mat(b + "ffn_up_shexp", (Fe * S, D), D, scales=1)
    return t



def probs_bias_std(p: dict) -> float:
    """exp_probs_b spread: 0.2 around sigmoid probs (spread about 0.1-0.9 with the router's 2/sqrt(D) std) moves
    several experts across the top-k boundary; under softmax (probs ~1/E) it is scaled to 0.2/E*4."""
    return 0.2 if p["gating"] == "sigmoid" else 0.8 / p["n_expert"]


def plan_tensors(arch: str, p: dict, *, full_layers, all_optional: bool = False, tied_output: bool = False,
                 rope_scaling: str | None = None) -> list[TensorPlan]:
    """The tensors the member's loader creates (deepseek2.cpp:84-159, deepseek32.cpp:77-139, glm-dsa.cpp:110-173),
    NumPy order, loader order: the globals, then per layer MLA, the indexer, the FFN.

    `full_layers` None: no indexer; else a layer's indexer tensors are written where it runs its indexer, and
    with all_optional in a shared layer too (glm-dsa's loader accepts them there, and never uses them).
    `all_optional` adds exp_probs_b where the preset has none and every `.scale` / `.input_scale` the generic
    pass would load; `tied_output` drops output.weight (llama.cpp then uses token_embd).
    """
    check_rope_scaling(arch, rope_scaling)
    D, V = p["n_embd"], p["n_vocab"]
    t = [TensorPlan("token_embd.weight", (V, D), "embed"), TensorPlan("output_norm.weight", (D,), "norm")]
    if not tied_output:
        t.append(TensorPlan("output.weight", (V, D), "output", D))
    indexed = [False] * p["n_layer"] if full_layers is None else [f or all_optional for f in full_layers(p)]
    for il in range(p["n_layer"]):
        t += mla_plans(il, p, all_optional=all_optional)
        if indexed[il]:
            t += indexer_plans(il, p)
        t += ffn_plans(il, p, all_optional=all_optional, probs_bias_std=probs_bias_std(p))
    return t


# ---------------------------------------------------------------- metadata


def base_metadata(a: str, p: dict, *, name: str, gating_id: int | None) -> list[tuple[str, object, str]]:
    """The keys the DeepSeek-family loaders read (deepseek2.cpp:3-53, deepseek32.cpp:6-38): sizes, MLA ranks and
    head sizes (key_length = C+R / value_length = C, the latent cache rows, as the converter writes them),
    the MoE keys; `gating_id` None leaves expert_gating_func out."""
    C, R, dn, dv, H = p["kv_lora"], p["qk_rope"], p["qk_nope"], p["v_head"], p["n_head"]
    kv = [
        ("general.name", name, "str"),
        (f"{a}.context_length", p["n_ctx"], "u32"),
        (f"{a}.embedding_length", p["n_embd"], "u32"),
        (f"{a}.block_count", p["n_layer"], "u32"),
        (f"{a}.feed_forward_length", p["n_ff"], "u32"),
        (f"{a}.attention.head_count", H, "u32"),
        (f"{a}.attention.layer_norm_rms_epsilon", p["eps"], "f32"),
        (f"{a}.attention.q_lora_rank", p["q_lora"], "u32"),
        (f"{a}.attention.kv_lora_rank", C, "u32"),
        (f"{a}.rope.freq_base", p["rope_base"], "f32"),
        (f"{a}.rope.dimension_count", R, "u32"),
        (f"{a}.vocab_size", p["n_vocab"], "u32"),
        (f"{a}.expert_weights_norm", bool(p["norm_w"]), "bool"),
        ("tokenizer.ggml.model", "none", "str"),
    ] + moe_metadata(a, p)
    if gating_id is not None:
        kv.append((f"{a}.expert_gating_func", gating_id, "u32"))
    if p.get("mla", True):
        kv += [(f"{a}.attention.head_count_kv", 1, "u32")] + mla_metadata(a, p)
    else:
        kv += [(f"{a}.attention.head_count_kv", H, "u32"),
               (f"{a}.attention.key_length", dn + R, "u32"),
               (f"{a}.attention.value_length", dv, "u32")]
    if p["n_group"]:
        kv += [(f"{a}.expert_group_count", p["n_group"], "u32"),
               (f"{a}.expert_group_used_count", p["topk_group"], "u32")]
    return kv


def yarn_params(p: dict, rope_scaling: str | None) -> dict | None:
    """The YaRN parameters a DeepSeek-family synth file carries (None: no scaling or linear): the preset's
    own, or with rope_scaling="yarn" and none in the preset factor 4 over n_ctx/4 with mscale_all_dim 1."""
    if rope_scaling is None:
        return p["yarn"]
    if rope_scaling == "yarn":
        return p["yarn"] or dict(factor=4.0, orig_ctx=p["n_ctx"] // 4, mscale_all_dim=1.0)
    return None


def check_rope_scaling(arch: str, rope_scaling: str | None) -> None:
    if rope_scaling == "longrope":
        raise ConfigError(f"{arch} has no rope factor tensors: longrope is not an option (use none, linear or yarn)")
    if rope_scaling not in (None, "none", "linear", "yarn"):
        raise ConfigError(f"rope scaling {rope_scaling!r} is not one of none, linear, yarn")


def rope_scaling_metadata(a: str, p: dict, rope_scaling: str | None, *, all_optional: bool) -> list:
    """rope.scaling.* rows as the converter writes them for MLA models: YaRN with yarn_log_multiplier
    = 0.1 * mscale_all_dim (llama.cpp divides by 0.1 again where it reads it), the betas when known, or linear
    factor 4; all_optional adds rope.scaling.attn_factor (with any scaling)."""
    check_rope_scaling(a, rope_scaling)
    kv = []
    yarn = yarn_params(p, rope_scaling)
    if yarn is not None:
        kv += [(f"{a}.rope.scaling.type", "yarn", "str"),
               (f"{a}.rope.scaling.factor", yarn["factor"], "f32"),
               (f"{a}.rope.scaling.original_context_length", yarn["orig_ctx"], "u32"),
               (f"{a}.rope.scaling.yarn_log_multiplier", 0.1 * yarn["mscale_all_dim"], "f32")]
        kv += [(f"{a}.rope.scaling.yarn_{k}", yarn[k], "f32") for k in ("beta_fast", "beta_slow") if k in yarn]
    elif rope_scaling == "linear":
        kv += [(f"{a}.rope.scaling.type", "linear", "str"), (f"{a}.rope.scaling.factor", 4.0, "f32")]
    if all_optional and (yarn is not None or rope_scaling == "linear"):
        kv.append((f"{a}.rope.scaling.attn_factor", 1.25, "f32"))
    return kv


def metadata(arch: str, p: dict, *, full_layers, optional_keys, all_optional: bool, rope_scaling: str | None,
             name: str) -> list[tuple[str, object, str]]:
    """(key, value, gguf value type) rows: the family's keys (`base_metadata`, expert_gating_func written), the
    indexer's when the arch has one (attention.indexer.types where the preset gives `idx_types`: None leaves
    llama.cpp's rule to decide), the rope scaling rows, then with all_optional the arch's `optional_keys(p)`."""
    a = arch
    kv = base_metadata(a, p, name=name, gating_id=GATING[p["gating"]])
    if full_layers is not None:
        kv += [(f"{a}.attention.indexer.head_count", p["idx_heads"], "u32"),
               (f"{a}.attention.indexer.key_length", p["idx_dim"], "u32"),
               (f"{a}.attention.indexer.top_k", p["idx_top_k"], "u32")]
        if p.get("idx_types") is not None:
            kv.append((f"{a}.attention.indexer.types", list(p["idx_types"][:p["n_layer"]]), "arr_bool"))
    kv += rope_scaling_metadata(a, p, rope_scaling, all_optional=all_optional)
    if all_optional:
        kv += [(f"{a}.{k}", v, t) for k, v, t in optional_keys(p)]
    return kv


# ---------------------------------------------------------------- the synth entry points (refengine.synth)


def synth_resolve(p: dict, layers: int | None) -> dict:
    """`layers=N` keeps the first N blocks (and their indexer types) and lowers n_dense_lead so the last kept
    block is MoE (layers=1 gives one MoE block)."""
    if p["gating"] not in GATING:
        raise ConfigError(f"gating {p['gating']!r} is not one of {', '.join(GATING)}")
    if layers is not None:
        p = dict(p, n_layer=layers, n_dense_lead=min(p["n_dense_lead"], layers - 1))
    return p


def synth_plan(arch: str, p: dict, *, full_layers, all_optional=False, fused_qkv=False, tied_output=False,
               rope_scaling=None) -> list[TensorPlan]:
    no_option(arch, fused_qkv=fused_qkv)
    return plan_tensors(arch, p, full_layers=full_layers, all_optional=all_optional, tied_output=tied_output,
                        rope_scaling=rope_scaling)


def synth_metadata(arch: str, p: dict, *, full_layers, optional_keys, all_optional=False, rope_scaling=None,
                   name="") -> list[tuple[str, object, str]]:
    return metadata(arch, p, full_layers=full_layers, optional_keys=optional_keys, all_optional=all_optional,
                    rope_scaling=rope_scaling, name=name)
