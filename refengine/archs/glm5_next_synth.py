"""The synthetic `glm5-next` plans (GLM-5.3-Flash): KDA + nope MLA under the k-pool indexer, mHC streams, MoE.

    write_synth("glm5-next", "g.gguf", preset="tiny", wtype="F32", seed=0)

Names, shapes and keys are the ones llama.cpp's glm5-next loader asks for (`src/models/glm5-next.cpp`
load_arch_hparams :7-59 / load_arch_tensors :61-187, llama-cpp-python 0.3.36). Dimension letters:

    D model dim   V vocab   H heads (KDA and MLA)   dh KDA head dim (d_in = H*dh)   Kc conv kernel
    Dq q-LoRA rank   C kv-LoRA rank (the cached latent; key_length = value_length = C)   dn key_length_mla
    dv value_length_mla   Hi indexer heads   di indexer head dim   kp kpool   k indexer top-k (positions)
    hc streams (4)   M = (2 + hc) * hc mixes   F dense FFN   E experts   A active   Fe expert FFN   S shared

Presets (`PRESETS[name]`):
- `tiny`     5 blocks KDA, MLA (own indexer), KDA, MLA (shares block 1's selection), MLA (own indexer); block 0
             dense, the rest MoE; kpool 4, top-k 8 (2 pools): from position 11 on a query drops pools (tests run
             64 tokens). SwiGLU clamps 1.0 / 1.5 / 2.0 / 0 (none) / 1.0 (the dense block's clamp is the shexp key's).
             No kda.gate_lower_bound (the softplus decay), no attention.layer_norm_epsilon (indexer LayerNorm eps 0)
             and no expert_gating_func (sigmoid): llama.cpp's defaults. `all_optional` writes all three
             (lower bound -5, eps 1e-6, sigmoid), kpool_select_tail, swiglu_clamp_shexp (other values than the
             experts'), the 4-D conv layout, the shared layer's indexer tensors (unused) and the generic pass's
             .scale / .input_scale where the loader creates them (none applied).
- `glm-5.3-flash`  published shapes (cited beside it). Too big to write whole; `layers=N` keeps N blocks, N = 3 one
             of each kind: KDA dense, MLA MoE, KDA MoE (see synth_resolve).
"""
from __future__ import annotations

from ..synthplan import TensorPlan, no_option, scaled_ffn_plans, weight_plans
from .kimi_family_synth import kda_plans

ARCH = "glm5-next"
GATING_SIGMOID = 2

TINY = dict(n_vocab=256, n_embd=64, n_layer=5, n_head=4, n_ctx=512, eps=1e-6,
            mla_layers=(1, 3, 4), idx_types=(1, 1, 1, 0, 1), dh=16, d_conv=4,
            q_lora=32, kv_lora=32, k_mla=24, v_mla=16,
            idx_heads=4, idx_dim=16, idx_top_k=8, kpool=4,
            hc=4, hc_iters=20, hc_eps=1e-6,
            n_ff=96, n_dense_lead=1, n_expert=8, n_expert_used=2, n_ff_exp=32, n_shared=1, norm_w=True, w_scale=2.5,
            swiglu_clamp=(1.0, 1.5, 2.0, 0.0, 1.0), swiglu_clamp_shexp=None, gate_lb=None, ln_eps=None)

_FLASH_LAYERS = 45

PRESETS: dict[str, dict] = {
    "tiny": TINY,
    # GLM-5.3-Flash (320B total, ~18B active; llama.cpp: 45 blocks = LLM_TYPE_320B_A18B, glm5-next.cpp:55-58). The
    # shapes are the defaults of transformers 5.23's Glm5NextTextConfig (transformers/models/glm5_next/
    # configuration_glm5_next.py, checkpoint zai-org/GLM-5.3-Flash): vocab 154880, hidden 4096, 45 layers, 64 heads
    # (KDA and MLA alike: linear_num_heads == num_attention_heads, asserted by conversion/glm.py:463), KDA head_dim
    # 128, conv kernel 4, gate lower bound -5; MLA q_lora 1536, kv_lora 512, qk_nope 256, qk_rope 0, v 256; layer
    # types KDA except every 4th (layers 3, 7, ..., 43 MLA); dense FFN 12288 in the first 3 layers, then 288
    # routed experts of 2048, 8 per token, 1 shared, routed scale 2.5, norm_topk_prob; indexer 32 heads x 128,
    # top-k 2048, kpool 16, the tail selected; indexer types: every layer full (index_topk_freq 1); hc 4 streams,
    # 20 Sinkhorn iterations, eps 1e-6; swiglu_limit 10; rms eps 1e-5; max positions 1048576. The converter
    # (conversion/glm.py:453-504) writes layer_norm_epsilon 1e-6, the clamps for experts and shared experts alike,
    # and no expert_gating_func (sigmoid).
    "glm-5.3-flash": dict(
        n_vocab=154880, n_embd=4096, n_layer=_FLASH_LAYERS, n_head=64, n_ctx=1048576, eps=1e-5,
        mla_layers=tuple(range(3, _FLASH_LAYERS, 4)), idx_types=(1,) * _FLASH_LAYERS, dh=128, d_conv=4,
        q_lora=1536, kv_lora=512, k_mla=256, v_mla=256,
        idx_heads=32, idx_dim=128, idx_top_k=2048, kpool=16,
        hc=4, hc_iters=20, hc_eps=1e-6,
        n_ff=12288, n_dense_lead=3, n_expert=288, n_expert_used=8, n_ff_exp=2048, n_shared=1, norm_w=True,
        w_scale=2.5, swiglu_clamp=(10.0,) * _FLASH_LAYERS, swiglu_clamp_shexp=(10.0,) * _FLASH_LAYERS,
        gate_lb=-5.0, ln_eps=1e-6),
}


def _kind(p: dict, il: int) -> tuple[bool, bool]:
    return (il in p["mla_layers"], il < p["n_dense_lead"])


def synth_resolve(p: dict, layers: int | None) -> dict:
    """`layers=N` keeps N blocks: the first N, except that where those lack a kind of block the preset has (KDA or
    MLA, dense or MoE) and N leaves room, the first block of each kind is kept instead of later ones (GLM-5.3-Flash
    starts KDA dense x 3, MLA MoE, KDA MoE: `layers=3` keeps blocks 0, 3, 4, one of each kind). The kept blocks keep
    their kinds, indexer types and clamps; the dense ones stay leading."""
    if layers is None:
        return p
    L = p["n_layer"]
    keep = list(range(layers))
    first = sorted({min(i for i in range(L) if _kind(p, i) == k) for k in {_kind(p, i) for i in range(L)}})
    if len(first) <= layers and not set(first) <= set(keep):
        others = [i for i in range(L) if i not in first][:layers - len(first)]
        keep = sorted(first + others)
    pick = lambda v: None if v is None else tuple(v[i] for i in keep)       # noqa: E731
    return dict(p, n_layer=layers, n_dense_lead=sum(1 for i in keep if i < p["n_dense_lead"]),
                mla_layers=tuple(j for j, i in enumerate(keep) if i in p["mla_layers"]),
                idx_types=pick(p["idx_types"]), swiglu_clamp=pick(p["swiglu_clamp"]),
                swiglu_clamp_shexp=pick(p["swiglu_clamp_shexp"]))


def is_kda(p: dict, il: int) -> bool:
    return il not in p["mla_layers"]


# ---------------------------------------------------------------- tensors

def hc_plans(prefix: str, p: dict) -> list[TensorPlan]:
    """One sub-layer's hyper-connection: fn [M, hc*D], base [M], scale [3] (glm5-next.cpp:87-94)."""
    hcD, M = p["hc"] * p["n_embd"], (2 + p["hc"]) * p["hc"]
    return [TensorPlan(prefix + "_fn.weight", (M, hcD), "matrix", hcD),
            TensorPlan(prefix + "_base.weight", (M,), "bias"),
            TensorPlan(prefix + "_scale.weight", (3,), "scale")]


def mla_plans(il: int, p: dict, *, all_optional: bool) -> list[TensorPlan]:
    """The nope MLA block's tensors (glm5-next.cpp:122-155): norms, q-LoRA, the latent, k_b / v_b, output; the
    k-pool indexer's where the layer runs it (all of them with all_optional)."""
    b, D, H = f"blk.{il}.", p["n_embd"], p["n_head"]
    Dq, C, dn, dv = p["q_lora"], p["kv_lora"], p["k_mla"], p["v_mla"]
    mat = lambda *a, **k: weight_plans(*a, all_optional=all_optional, **k)   # noqa: E731
    t = [TensorPlan(b + "attn_q_a_norm.weight", (Dq,), "norm"),
         TensorPlan(b + "attn_kv_a_norm.weight", (C,), "norm"),
         TensorPlan(b + "attn_q_a.weight", (Dq, D), "matrix", D),              # ne {D, Dq}
         TensorPlan(b + "attn_q_b.weight", (H * dn, Dq), "matrix", Dq),        # ne {Dq, H*dn}
         TensorPlan(b + "attn_kv_a_mqa.weight", (C, D), "matrix", D),          # ne {D, C}: no rope part
         TensorPlan(b + "attn_k_b.weight", (H, C, dn), "matrix", dn),          # ne {dn, C, H}
         TensorPlan(b + "attn_v_b.weight", (H, dv, C), "matrix", C)]           # ne {C, dv, H}
    t += mat(b + "attn_output", (D, H * dv), H * dv, scales=1)                 # ne {H*dv, D}
    if p["idx_types"][il] or all_optional:
        Hi, di, kp = p["idx_heads"], p["idx_dim"], p["kpool"]
        t += [TensorPlan(b + "indexer.k_norm.weight", (di,), "norm"),
              TensorPlan(b + "indexer.k_norm.bias", (di,), "bias"),
              TensorPlan(b + "indexer.proj.weight", (Hi, D), "matrix", D),      # ne {D, Hi}
              TensorPlan(b + "indexer.attn_k.weight", (di, D), "matrix", D),    # ne {D, di}
              TensorPlan(b + "indexer.attn_q_b.weight", (Hi * di, Dq), "matrix", Dq),
              TensorPlan(b + "indexer_compressor_gate.weight", (di, D), "matrix", D),
              TensorPlan(b + "indexer_compressor_ape.weight", (kp, di), "bias")]   # ne {di, kp}
    return t


def ffn_plans(il: int, p: dict, *, all_optional: bool) -> list[TensorPlan]:
    """Dense SwiGLU (il < n_dense_lead) or router, exp_probs_b, routed and shared experts (glm5-next.cpp:158-178)."""
    b, D = f"blk.{il}.", p["n_embd"]
    if il < p["n_dense_lead"]:
        return scaled_ffn_plans(b, D, p["n_ff"], all_optional=all_optional)
    E, Fe, S = p["n_expert"], p["n_ff_exp"], p["n_shared"]
    return ([TensorPlan(b + "ffn_gate_inp.weight", (E, D), "router", D),
             TensorPlan(b + "exp_probs_b.bias", (E,), "probs_bias", std=0.2),
             TensorPlan(b + "ffn_gate_exps.weight", (E, Fe, D), "matrix", D),   # ne {D, Fe, E}
             TensorPlan(b + "ffn_down_exps.weight", (E, D, Fe), "matrix", Fe),
             TensorPlan(b + "ffn_up_exps.weight", (E, Fe, D), "matrix", D),
             TensorPlan(b + "ffn_gate_shexp.weight", (Fe * S, D), "matrix", D),
             TensorPlan(b + "ffn_down_shexp.weight", (D, Fe * S), "matrix", Fe * S),
             TensorPlan(b + "ffn_up_shexp.weight", (Fe * S, D), "matrix", D)])


def synth_plan(p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
    """Every tensor glm5-next.cpp:61-187 creates for the trunk, in its order (output untied and required; rope type
    NONE, so no rope scaling applies)."""
    no_option(ARCH, fused_qkv=fused_qkv, tied_output=tied_output)
    D, V, H, dh, Kc = p["n_embd"], p["n_vocab"], p["n_head"], p["dh"], p["d_conv"]
    t = [TensorPlan("token_embd.weight", (V, D), "embed"),
         TensorPlan("output_norm.weight", (D,), "norm"),
         TensorPlan("output.weight", (V, D), "output", D)]
    for il in range(p["n_layer"]):
        b = f"blk.{il}."
        t += [TensorPlan(b + "attn_norm.weight", (D,), "norm"), TensorPlan(b + "ffn_norm.weight", (D,), "norm")]
        t += hc_plans(b + "hc_attn", p) + hc_plans(b + "hc_ffn", p)
        if is_kda(p, il):
            t += kda_plans(il, D=D, H=H, dh=dh, Kc=Kc,
                           conv_shape=(1, H * dh, 1, Kc) if all_optional else (H * dh, 1, Kc), ssm_a_shape=(H,),
                           fused_qkv=False, full_rank_gate=False, all_optional=all_optional)
        else:
            t += mla_plans(il, p, all_optional=all_optional)
        t += ffn_plans(il, p, all_optional=all_optional)
    return t


# ---------------------------------------------------------------- metadata

def synth_metadata(p: dict, *, all_optional=False, rope_scaling=None, name=""):
    """Every key glm5-next.cpp:7-59 reads (and the general ones llama_model_base reads): head_count one value (the
    KDA and MLA blocks share n_head()), head_count_kv per block (0 marks KDA, 1 an MLA block's latent row)."""
    a, L = ARCH, p["n_layer"]
    C = p["kv_lora"]
    kv = [("general.name", name, "str"),
          (f"{a}.context_length", p["n_ctx"], "u32"),
          (f"{a}.embedding_length", p["n_embd"], "u32"),
          (f"{a}.block_count", L, "u32"),
          (f"{a}.feed_forward_length", p["n_ff"], "u32"),
          (f"{a}.attention.head_count", p["n_head"], "u32"),
          (f"{a}.attention.head_count_kv", [0 if is_kda(p, il) else 1 for il in range(L)], "arr_u32"),
          (f"{a}.attention.layer_norm_rms_epsilon", p["eps"], "f32"),
          (f"{a}.attention.key_length", C, "u32"),
          (f"{a}.attention.value_length", C, "u32"),
          (f"{a}.attention.key_length_mla", p["k_mla"], "u32"),
          (f"{a}.attention.value_length_mla", p["v_mla"], "u32"),
          (f"{a}.attention.q_lora_rank", p["q_lora"], "u32"),
          (f"{a}.attention.kv_lora_rank", C, "u32"),
          (f"{a}.rope.dimension_count", 0, "u32"),
          (f"{a}.ssm.conv_kernel", p["d_conv"], "u32"),
          (f"{a}.kda.head_dim", p["dh"], "u32"),
          (f"{a}.vocab_size", p["n_vocab"], "u32"),
          (f"{a}.expert_count", p["n_expert"], "u32"),
          (f"{a}.expert_used_count", p["n_expert_used"], "u32"),
          (f"{a}.expert_feed_forward_length", p["n_ff_exp"], "u32"),
          (f"{a}.expert_shared_count", p["n_shared"], "u32"),
          (f"{a}.leading_dense_block_count", p["n_dense_lead"], "u32"),
          (f"{a}.expert_weights_scale", p["w_scale"], "f32"),
          (f"{a}.expert_weights_norm", bool(p["norm_w"]), "bool"),
          (f"{a}.swiglu_clamp_exp", [float(c) for c in p["swiglu_clamp"][:L]], "arr_f32"),
          (f"{a}.attention.indexer.head_count", p["idx_heads"], "u32"),
          (f"{a}.attention.indexer.key_length", p["idx_dim"], "u32"),
          (f"{a}.attention.indexer.top_k", p["idx_top_k"], "u32"),
          (f"{a}.attention.indexer.kpool", p["kpool"], "u32"),
          (f"{a}.attention.indexer.types", [bool(x) for x in p["idx_types"][:L]], "arr_bool"),
          (f"{a}.hyper_connection.count", p["hc"], "u32"),
          (f"{a}.hyper_connection.sinkhorn_iterations", p["hc_iters"], "u32"),
          (f"{a}.hyper_connection.epsilon", p["hc_eps"], "f32"),
          ("tokenizer.ggml.model", "none", "str")]
    lb, ln_eps, shexp = p["gate_lb"], p["ln_eps"], p["swiglu_clamp_shexp"]
    if all_optional:
        lb = -5.0 if lb is None else lb
        ln_eps = 1e-6 if ln_eps is None else ln_eps
        shexp = [float(c) * 0.75 for c in p["swiglu_clamp"]] if shexp is None else shexp
        kv += [(f"{a}.expert_gating_func", GATING_SIGMOID, "u32"),
               (f"{a}.attention.indexer.kpool_select_tail", True, "bool")]
    if lb is not None:
        kv.append((f"{a}.kda.gate_lower_bound", lb, "f32"))
    if ln_eps is not None:
        kv.append((f"{a}.attention.layer_norm_epsilon", ln_eps, "f32"))
    if shexp is not None:
        kv.append((f"{a}.swiglu_clamp_shexp", [float(c) for c in shexp[:L]], "arr_f32"))
    return kv
