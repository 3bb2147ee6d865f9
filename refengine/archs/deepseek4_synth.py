"""The synthetic `deepseek4` plans (DeepSeek-V4 / V4-Flash): mHC streams, compressed-KV attention, hash routing.

    write_synth("deepseek4", "ds4.gguf", preset="tiny", wtype="F32", seed=0)

Names, shapes and keys are the ones llama.cpp's deepseek4 loader asks for (`src/models/deepseek4.cpp`
load_arch_hparams :19-80 / load_arch_tensors :82-182, llama-cpp-python 0.3.36), in the converter's dialect
(`conversion/deepseek.py` set_gguf_parameters: swiglu clamps and compress ratios written as arrays).
Dimension letters:

    D model dim   V vocab   H heads   dh head dim (K = V)   dr rope dims (the last dr of a head)   Dq q-LoRA rank
    G output groups   Ro output LoRA rank per group   hc streams (4)   M = (2 + hc) * hc mixes
    Hi indexer heads   di indexer head dim   k indexer top-k   E experts   A active   Fe expert FFN   S shared

Presets (`PRESETS[name]`):
- `tiny`               three blocks of ratio 0 (window only), 4 (CSA + indexer) and 128 (HCA); block 0 routed by
                       token-id hash; a 16-token window, indexer top-k 8: from 36 tokens on the indexer drops
                       ratio-4 blocks, from 128 the ratio-128 block closes (tests use >= 192 tokens).
                       YaRN (factor 4 over 128) so compressed layers and ratio-0 layers rope differently.
                       SwiGLU clamps 1.0 / 1.5 / 2.0 (they bite: gate and up are O(1)).
- `deepseek-v4-flash`  published shapes (cited beside it). Too big to write whole; `layers=N` keeps the first
                       N blocks, N = 3 one of each ratio (the published schedule starts 0, 0, 4, 128: see
                       synth_resolve).

Tensor values: matrices std 1/sqrt(fan_in); the hc / output_hc `fn` matrices likewise (mixes O(1)); `base`
vectors and `attn_sinks` small (kind "bias"); `scale` vectors near 1; the compressors' `ape` [ratio, c*dh]
small (F32, like a bias: it is added to the gate scores); `ffn_gate_tid2eid` [V, A] I32, A distinct experts
per token.

`wo_a_3d` (a preset entry, `overrides={"wo_a_3d": True}`): attn_output_a written {I, Ro, G} (NumPy [G, Ro, I]), as
llama_model_saver writes it (`test-llama-archs -o`), instead of the converter's 2-D {I, Ro*G}: the same values in
the same order; llama.cpp takes either (TENSOR_ALLOW_RESHAPE, deepseek4.cpp:120-122).
"""
from __future__ import annotations

from ..errors import ConfigError
from ..synthplan import TensorPlan, no_option

ARCH = "deepseek4"
GATING_SQRT_SOFTPLUS = 4      # expert_gating_func: deepseek4's loader accepts only this (deepseek4.cpp:63-66)

TINY = dict(n_vocab=256, n_embd=64, n_layer=3, n_head=4, head_dim=128, qk_rope=32, q_lora=64,
            o_groups=2, o_lora=32, n_ctx=512, eps=1e-6, rope_base=10000.0, compress_rope_base=160000.0,
            n_swa=16, compress_ratios=[0, 4, 128], hash_layers=1,
            hc=4, hc_iters=20, hc_eps=1e-6,
            idx_heads=16, idx_dim=64, idx_top_k=8,
            n_expert=8, n_expert_used=2, n_ff_exp=32, n_shared=1, norm_w=True, w_scale=1.5,
            swiglu_clamp=[1.0, 1.5, 2.0],
            yarn=dict(factor=4.0, orig_ctx=128), wo_a_3d=False)

PRESETS: dict[str, dict] = {
    "tiny": TINY,
    # DeepSeek-V4-Flash (284B total, 13B active): the published config.json of deepseek-ai/DeepSeek-V4-Flash(-Base),
    # as mirrored in alibaba/rtp-llm's DeepSeek-V4 model tests (FLASH_BASE_CONFIG) and equal to the defaults of
    # transformers 5.23's DeepseekV4Config (transformers/models/deepseek_v4/configuration_deepseek_v4.py, checkpoint
    # deepseek-ai/DeepSeek-V4-Flash-Base); vllm-project/vllm-ascend's deepseek_v4 config test has the same rope_scaling:
    # vocab 129280, hidden 4096, 43 layers, 64 heads, 1 KV head, head_dim 512, qk_rope_head_dim 64
    # (partial_rotary_factor 64/512), q_lora_rank 1024, o_groups 8, o_lora_rank 1024, moe_intermediate 2048,
    # 256 routed / 6 per token / 1 shared, sqrtsoftplus, norm_topk_prob, routed_scaling_factor 1.5,
    # max_position 1048576, rope_theta 10000, compress_rope_theta 160000, hc_mult 4, hc_sinkhorn_iters 20,
    # hc_eps 1e-6, 3 hash layers, swiglu_limit 10, sliding_window 128, index_n_heads 64, index_head_dim 128,
    # index_topk 512, rms eps 1e-6; rope scaling YaRN factor 16 over 65536 (the published config.json's
    # rope_scaling). The compress_ratios schedule: layers 0-1 window only, then 4 and 128 alternating
    # (the published config.json's compress_ratios, whose last entry (0) is the MTP block, not written).
    "deepseek-v4-flash": dict(
        n_vocab=129280, n_embd=4096, n_layer=43, n_head=64, head_dim=512, qk_rope=64, q_lora=1024,
        o_groups=8, o_lora=1024, n_ctx=1048576, eps=1e-6, rope_base=10000.0, compress_rope_base=160000.0,
        n_swa=128, compress_ratios=[0, 0] + [4 if i % 2 == 0 else 128 for i in range(41)], hash_layers=3,
        hc=4, hc_iters=20, hc_eps=1e-6,
        idx_heads=64, idx_dim=128, idx_top_k=512,
        n_expert=256, n_expert_used=6, n_ff_exp=2048, n_shared=1, norm_w=True, w_scale=1.5,
        swiglu_clamp=[10.0] * 43,
        yarn=dict(factor=16.0, orig_ctx=65536), wo_a_3d=False),
}


def synth_resolve(p: dict, layers: int | None) -> dict:
    """`layers=N` keeps N blocks: the first N, except that where those lack a ratio the preset has and N leaves room,
    the first block of each ratio is kept instead of later ones (the published schedule starts 0, 0, 4, 128:
    `layers=3` keeps blocks 0, 2, 3, one of each ratio). The hash-routed blocks stay those that were hash-routed
    (`layers=3` of V4-Flash: blocks 0 and 2 of the cut, ratios 0 and 4; the ratio-128 one is top-k routed)."""
    if layers is None:
        return p
    ratios = list(p["compress_ratios"])
    keep = list(range(layers))
    first = sorted({ratios.index(r) for r in set(ratios)})                    # each ratio's first block
    if len(first) <= layers and not set(first) <= set(keep):
        others = [i for i in range(len(ratios)) if i not in first][:layers - len(first)]
        keep = sorted(first + others)
    return dict(p, n_layer=layers, compress_ratios=[ratios[i] for i in keep],
                swiglu_clamp=[p["swiglu_clamp"][i] for i in keep],
                hash_layers=sum(1 for i in keep if i < p["hash_layers"]))


# ---------------------------------------------------------------- tensors


def attention_plans(il: int, p: dict, ratio: int) -> list[TensorPlan]:
    """The attention's tensors (deepseek4.cpp:104-148): sinks, q-LoRA, the single K = V head, the grouped
    low-rank output, and with ratio != 0 the compressor (c = 2 overlapping halves at ratio 4), with ratio 4
    the lightning indexer and its own compressor."""
    b, D, H, dh = f"blk.{il}.", p["n_embd"], p["n_head"], p["head_dim"]
    Dq, G, Ro = p["q_lora"], p["o_groups"], p["o_lora"]
    t = [TensorPlan(b + "attn_norm.weight", (D,), "norm"),
         TensorPlan(b + "attn_sinks.weight", (H,), "bias"),
         TensorPlan(b + "attn_q_a.weight", (Dq, D), "matrix", D),                   # ne {D, Dq}
         TensorPlan(b + "attn_q_a_norm.weight", (Dq,), "norm"),
         TensorPlan(b + "attn_q_b.weight", (H * dh, Dq), "matrix", Dq),             # ne {Dq, H*dh}
         TensorPlan(b + "attn_kv.weight", (dh, D), "matrix", D),                    # ne {D, dh}
         TensorPlan(b + "attn_kv_a_norm.weight", (dh,), "norm"),
         # stored 2-D, ne {H*dh/G, Ro*G} (or 3-D {H*dh/G, Ro, G}: wo_a_3d); the loader views it as {H*dh/G, Ro, G}
         # (TENSOR_ALLOW_RESHAPE)
         TensorPlan(b + "attn_output_a.weight", (G, Ro, H * dh // G) if p.get("wo_a_3d") else (G * Ro, H * dh // G),
                    "matrix", H * dh // G),
         TensorPlan(b + "attn_output_b.weight", (D, G * Ro), "matrix", G * Ro)]     # ne {G*Ro, D}
    if ratio:
        c = 2 if ratio == 4 else 1
        t += [TensorPlan(b + "attn_compressor_kv.weight", (c * dh, D), "matrix", D),
              TensorPlan(b + "attn_compressor_gate.weight", (c * dh, D), "matrix", D),
              TensorPlan(b + "attn_compressor_ape.weight", (ratio, c * dh), "bias"),   # ne {c*dh, ratio}
              TensorPlan(b + "attn_compressor_norm.weight", (dh,), "norm")]
    if ratio == 4:
        Hi, di = p["idx_heads"], p["idx_dim"]
        t += [TensorPlan(b + "indexer.proj.weight", (Hi, D), "matrix", D),           # ne {D, Hi}
              TensorPlan(b + "indexer.attn_q_b.weight", (Hi * di, Dq), "matrix", Dq),
              TensorPlan(b + "indexer_compressor_kv.weight", (2 * di, D), "matrix", D),
              TensorPlan(b + "indexer_compressor_gate.weight", (2 * di, D), "matrix", D),
              TensorPlan(b + "indexer_compressor_ape.weight", (4, 2 * di), "bias"),
              TensorPlan(b + "indexer_compressor_norm.weight", (di,), "norm")]
    return t


def hc_plans(prefix: str, p: dict, n_mix: int) -> list[TensorPlan]:
    """One hyper-connection's fn [n_mix, hc*D], base [n_mix], scale [3] (the head's: [hc], [hc], [1])."""
    hcD = p["hc"] * p["n_embd"]
    n_scale = 3 if n_mix != p["hc"] else 1
    return [TensorPlan(prefix + "_fn.weight", (n_mix, hcD), "matrix", hcD),
            TensorPlan(prefix + "_base.weight", (n_mix,), "bias"),
            TensorPlan(prefix + "_scale.weight", (n_scale,), "scale")]


def ffn_plans(il: int, p: dict) -> list[TensorPlan]:
    """ffn_norm, router, tid2eid (hash layers) or exp_probs_b, routed and shared experts (deepseek4.cpp:150-172)."""
    b, D, V = f"blk.{il}.", p["n_embd"], p["n_vocab"]
    E, A, Fe, S = p["n_expert"], p["n_expert_used"], p["n_ff_exp"], p["n_shared"]
    t = [TensorPlan(b + "ffn_gate_inp.weight", (E, D), "router", D)]
    if il < p["hash_layers"]:
        t.append(TensorPlan(b + "ffn_gate_tid2eid.weight", (V, A), "expert_ids", std=E))   # ne {A, V}, I32
    else:
        t.append(TensorPlan(b + "exp_probs_b.bias", (E,), "probs_bias", std=0.1))
    t += [TensorPlan(b + "ffn_norm.weight", (D,), "norm"),
          TensorPlan(b + "ffn_gate_exps.weight", (E, Fe, D), "matrix", D),              # ne {D, Fe, E}
          TensorPlan(b + "ffn_down_exps.weight", (E, D, Fe), "matrix", Fe),
          TensorPlan(b + "ffn_up_exps.weight", (E, Fe, D), "matrix", D),
          TensorPlan(b + "ffn_gate_shexp.weight", (Fe * S, D), "matrix", D),
          TensorPlan(b + "ffn_down_shexp.weight", (D, Fe * S), "matrix", Fe * S),
          TensorPlan(b + "ffn_up_shexp.weight", (Fe * S, D), "matrix", D)]
    return t


def synth_plan(p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
    """The tensors deepseek4.cpp:82-182 creates, in its order (MTP blocks not written; output required)."""
    no_option(ARCH, fused_qkv=fused_qkv, tied_output=tied_output)
    if rope_scaling not in (None, "none", "yarn"):
        raise ConfigError(f"{ARCH}: rope scaling {rope_scaling!r}: the compressed layers take YaRN or none")
    D, V, hc = p["n_embd"], p["n_vocab"], p["hc"]
    t = [TensorPlan("token_embd.weight", (V, D), "embed"),
         TensorPlan("output_norm.weight", (D,), "norm"),
         TensorPlan("output.weight", (V, D), "output", D)]
    t += hc_plans("output_hc", p, hc)
    M = (2 + hc) * hc
    for il in range(p["n_layer"]):
        t += attention_plans(il, p, p["compress_ratios"][il])
        t += hc_plans(f"blk.{il}.hc_attn", p, M) + hc_plans(f"blk.{il}.hc_ffn", p, M)
        t += ffn_plans(il, p)
    return t


# ---------------------------------------------------------------- metadata


def synth_metadata(p: dict, *, all_optional=False, rope_scaling=None, name=""):
    """Every key deepseek4.cpp:19-80 reads (and the general ones llama_model_base reads), as the converter
    writes them; `all_optional` adds swiglu_clamp_shexp (equal to the experts' clamps, as the converter writes)
    and embedding_length_out (written by the converter, not read)."""
    a, L = ARCH, p["n_layer"]
    kv = [("general.name", name, "str"),
          (f"{a}.context_length", p["n_ctx"], "u32"),
          (f"{a}.embedding_length", p["n_embd"], "u32"),
          (f"{a}.block_count", L, "u32"),
          (f"{a}.attention.head_count", p["n_head"], "u32"),
          (f"{a}.attention.head_count_kv", 1, "u32"),
          (f"{a}.attention.key_length", p["head_dim"], "u32"),
          (f"{a}.attention.value_length", p["head_dim"], "u32"),
          (f"{a}.attention.layer_norm_rms_epsilon", p["eps"], "f32"),
          (f"{a}.attention.q_lora_rank", p["q_lora"], "u32"),
          (f"{a}.attention.sliding_window", p["n_swa"], "u32"),
          (f"{a}.attention.output_group_count", p["o_groups"], "u32"),
          (f"{a}.attention.output_lora_rank", p["o_lora"], "u32"),
          (f"{a}.attention.compress_rope_freq_base", p["compress_rope_base"], "f32"),
          (f"{a}.attention.compress_ratios", [int(r) for r in p["compress_ratios"][:L]], "arr_u32"),
          (f"{a}.attention.indexer.head_count", p["idx_heads"], "u32"),
          (f"{a}.attention.indexer.key_length", p["idx_dim"], "u32"),
          (f"{a}.attention.indexer.top_k", p["idx_top_k"], "u32"),
          (f"{a}.rope.dimension_count", p["qk_rope"], "u32"),
          (f"{a}.rope.freq_base", p["rope_base"], "f32"),
          (f"{a}.vocab_size", p["n_vocab"], "u32"),
          (f"{a}.expert_count", p["n_expert"], "u32"),
          (f"{a}.expert_used_count", p["n_expert_used"], "u32"),
          (f"{a}.expert_feed_forward_length", p["n_ff_exp"], "u32"),
          (f"{a}.expert_shared_count", p["n_shared"], "u32"),
          (f"{a}.expert_weights_scale", p["w_scale"], "f32"),
          (f"{a}.expert_weights_norm", bool(p["norm_w"]), "bool"),
          (f"{a}.expert_gating_func", GATING_SQRT_SOFTPLUS, "u32"),
          (f"{a}.swiglu_clamp_exp", [float(c) for c in p["swiglu_clamp"][:L]], "arr_f32"),
          (f"{a}.hyper_connection.count", p["hc"], "u32"),
          (f"{a}.hyper_connection.sinkhorn_iterations", p["hc_iters"], "u32"),
          (f"{a}.hyper_connection.epsilon", p["hc_eps"], "f32"),
          (f"{a}.hash_layer_count", p["hash_layers"], "u32"),
          ("tokenizer.ggml.model", "none", "str")]
    yarn = p["yarn"] if rope_scaling in (None, "yarn") else None
    if yarn is not None:
        kv += [(f"{a}.rope.scaling.type", "yarn", "str"),
               (f"{a}.rope.scaling.factor", yarn["factor"], "f32"),
               (f"{a}.rope.scaling.original_context_length", yarn["orig_ctx"], "u32")]
    if all_optional:
        kv += [(f"{a}.swiglu_clamp_shexp", [float(c) for c in p["swiglu_clamp"][:L]], "arr_f32"),
               (f"{a}.embedding_length_out", p["hc"] * p["n_embd"], "u32")]
    return kv
