"""The synthetic `kimi-k3` plans (Kimi-K3): KDA + MLA hybrid, attention residuals, latent SiTU MoE.

    write_synth("kimi-k3", "k3.gguf", preset="tiny", wtype="Q8_0", tensor_types={"ssm_f_b.weight": "Q8_0"})

Tensor names, shapes and keys are those llama.cpp's kimi-k3 loader asks for (src/models/kimi-k3.cpp:16-167,
llama-cpp-python 0.3.36), and the keys conversion/kimi_k3.py writes. Dimension letters:

    D model dim   V vocab   H heads (KDA and MLA)   dh KDA head dim (d_in = H*dh)   Kc conv kernel
    Dq q-LoRA rank (0: plain attn_q)   C kv-LoRA rank   dn qk_nope   R qk_rope   dv v_head
    F dense FFN   E experts   A active   Fe expert FFN   S shared   Dl expert latent width (0: D)

Presets (`PRESETS[name]`):
- `tiny`      5 blocks KDA, KDA, MLA, KDA, MLA (full_attn = [2, 4]); attn_res block_size 2; block 0 dense SiTU,
              blocks 1-4 latent MoE (Dl = D/2, routed norm, shared expert); q-LoRA and attn_gate on MLA;
              gate lower bound -5. Contexts of 16-100 tokens.
- `kimi-k3`   the published shape (see the comment beside it); use `layers=N` (N >= 4 keeps a KDA block,
              the first MLA block and latent-MoE blocks at K3's sizes).

`layers=N` keeps the first N blocks; leading dense blocks are cut to N-1 so the last block is MoE.
`all_optional=True` writes every optional tensor the loader creates: the converter's 4-D conv layout
{Kc,1,d_in,1} (3-D otherwise, the form quantized files have), attn_gate / ffn_routed_norm / shared experts
even where an override turned them off, the q/k/v biases of create_tensor_qkv, and the generic pass's
`.scale` / `.input_scale` of every matrix that has them (llama-model.cpp:1634-1773). kimi-k3's graph applies
none of the biases and scales (plain ggml_mul_mat everywhere, build_moe_ffn given no scales), and neither
does refengine. (The q-LoRA tensors and attn_gate are in both presets already.)
"""
from __future__ import annotations

from ..synthplan import TensorPlan, mla_metadata, moe_metadata, no_option, scaled_ffn_plans, weight_plans
from .kimi_family_synth import head_metadata, kda_plans

ARCH = "kimi-k3"
GATING_SIGMOID = 2          # expert_gating_func (the converter asserts sigmoid, conversion/kimi_k3.py:206-207)

# Keys: n_vocab n_embd n_layer n_head n_ctx eps | full_attn (0-based MLA blocks) | dh d_conv gate_lb |
# q_lora kv_lora qk_nope qk_rope v_head attn_gate | n_ff n_dense_lead | n_expert n_expert_used n_ff_exp n_shared
# latent routed_norm norm_w w_scale | situ_beta situ_linear_beta | res_bs.
_TINY = dict(n_vocab=256, n_embd=256, n_layer=5, n_head=4, n_ctx=512, eps=1e-5,
             full_attn=(2, 4), dh=32, d_conv=4, gate_lb=-5.0,
             q_lora=64, kv_lora=64, qk_nope=32, qk_rope=16, v_head=32, attn_gate=True,
             n_ff=384, n_dense_lead=1,
             n_expert=8, n_expert_used=2, n_ff_exp=64, n_shared=1, latent=128, routed_norm=True,
             norm_w=True, w_scale=2.5,
             situ_beta=1.5, situ_linear_beta=3.0, res_bs=2)

PRESETS: dict[str, dict] = {
    "tiny": _TINY,
    # Kimi-K3 (2.8T total, 104B active; llama.cpp: 93 blocks = LLM_TYPE_2_8T_A50B, kimi-k3.cpp:47-50).
    # Published shapes, from public descriptions of the released moonshotai/Kimi-K3 config.json (its file was not
    # retrievable here): NVIDIA NeMo AutoModel's Kimi K3 page (docs.nvidia.com/nemo/automodel, model-coverage
    # kimi-k3: 93 layers = 69 KDA + 24 gated MLA, 2.8T / 104B active, 1,048,576 context); NeMo Megatron-Bridge
    # KimiK3ModelProvider (kimi_linear_num_heads 96, kimi_linear_head_dim 128, conv kernel 4,
    # kimi_attn_res_block_size 12); FlashInfer's Kimi K3 MegaMoE page (896 experts, routed_expert_hidden_size
    # 3584, moe_intermediate_size 3072, top-16, SiTU); colibri docs/kimi_k3.md (MLA every 4th layer plus the
    # final one, NoPE, q_lora 1536, kv_lora 512, qk_nope 128 + 64 extra dims, v 128, 96 heads; KDA gate
    # -5 * sigmoid(...)); sqliteai/waste docs/K3.md (hidden 7168, latent MoE 7168 -> 3584).
    # Not found in those sources, so kept from Kimi-K2 / Kimi-Linear: vocab 163840, dense FFN 18432 with 1
    # leading dense block, 1 shared expert, rms eps 1e-5, routed scale 2.827, renormalize true; the SiTU
    # betas (2.0 / 8.0) are placeholders (they change values, not shapes).
    "kimi-k3": dict(n_vocab=163840, n_embd=7168, n_layer=93, n_head=96, n_ctx=1048576, eps=1e-5,
                    full_attn=tuple(range(3, 92, 4)) + (92,), dh=128, d_conv=4, gate_lb=-5.0,
                    q_lora=1536, kv_lora=512, qk_nope=128, qk_rope=64, v_head=128, attn_gate=True,
                    n_ff=18432, n_dense_lead=1,
                    n_expert=896, n_expert_used=16, n_ff_exp=3072, n_shared=1, latent=3584, routed_norm=True,
                    norm_w=True, w_scale=2.827,
                    situ_beta=2.0, situ_linear_beta=8.0, res_bs=12),
}


def synth_resolve(p: dict, layers: int | None) -> dict:
    """`layers=N` keeps the first N blocks; n_dense_lead <= N-1 so the last kept block is MoE."""
    if layers is not None:
        p = dict(p, n_layer=layers, n_dense_lead=min(p["n_dense_lead"], layers - 1))
    p["full_attn"] = tuple(i for i in p["full_attn"] if i < p["n_layer"])
    return p


def is_kda(p: dict, il: int) -> bool:
    return il not in p["full_attn"]


# ---------------------------------------------------------------- tensors

def _kda_plans(il: int, p: dict, *, all_optional: bool) -> list[TensorPlan]:
    """KDA block il (kimi-k3.cpp:82-105): conv q/k/v 3-D {Kc,1,d_in} (4-D with all_optional), separate
    attn_q/k/v, 1-D ssm_a, full-rank ssm_g."""
    H, dh, Kc = p["n_head"], p["dh"], p["d_conv"]
    return kda_plans(il, D=p["n_embd"], H=H, dh=dh, Kc=Kc,
                     conv_shape=(1, H * dh, 1, Kc) if all_optional else (H * dh, 1, Kc), ssm_a_shape=(H,),
                     fused_qkv=False, full_rank_gate=True, all_optional=all_optional)


def mla_plans(il: int, p: dict, *, all_optional: bool) -> list[TensorPlan]:
    """MLA block il (kimi-k3.cpp:106-137): q-LoRA (or attn_q), latent, split attn_k_b / attn_v_b, attn_gate."""
    b, D, H = f"blk.{il}.", p["n_embd"], p["n_head"]
    Dq, C, dn, R, dv = p["q_lora"], p["kv_lora"], p["qk_nope"], p["qk_rope"], p["v_head"]
    mat = lambda *a, **k: weight_plans(*a, all_optional=all_optional, **k)   # noqa: E731
    t = []
    if Dq > 0:
        t += [TensorPlan(b + "attn_q_a_norm.weight", (Dq,), "norm"),
              TensorPlan(b + "attn_q_a.weight", (Dq, D), "matrix", D),
              TensorPlan(b + "attn_q_b.weight", (H * (dn + R), Dq), "matrix", Dq)]
    else:
        t += mat(b + "attn_q", (H * (dn + R), D), D, scales=1)
    t += [TensorPlan(b + "attn_kv_a_norm.weight", (C,), "norm"),
          TensorPlan(b + "attn_kv_a_mqa.weight", (C + R, D), "matrix", D),
          TensorPlan(b + "attn_k_b.weight", (H, C, dn), "matrix", dn),
          TensorPlan(b + "attn_v_b.weight", (H, dv, C), "matrix", C)]
    if p["attn_gate"] or all_optional:
        t += mat(b + "attn_gate", (H * dv, D), D, scales=1)
    t += mat(b + "attn_output", (D, H * dv), H * dv, scales=1)
    return t


def ffn_plans(il: int, p: dict, *, all_optional: bool) -> list[TensorPlan]:
    """Dense SiTU FFN (il < n_dense_lead) or latent MoE (kimi-k3.cpp:139-165)."""
    b, D = f"blk.{il}.", p["n_embd"]
    mat = lambda *a, **k: weight_plans(*a, all_optional=all_optional, **k)   # noqa: E731
    if il < p["n_dense_lead"]:
        return scaled_ffn_plans(b, D, p["n_ff"], all_optional=all_optional)
    E, Fe, S, Dl = p["n_expert"], p["n_ff_exp"], p["n_shared"], p["latent"]
    W = Dl if Dl > 0 else D
    t = [TensorPlan(b + "ffn_gate_inp.weight", (E, D), "router", D),
         TensorPlan(b + "exp_probs_b.bias", (E,), "probs_bias", std=0.2)]
    t += mat(b + "ffn_gate_exps", (E, Fe, W), W, scales=E)
    t += mat(b + "ffn_down_exps", (E, W, Fe), Fe, scales=E)
    t += mat(b + "ffn_up_exps", (E, Fe, W), W, scales=E)
    if Dl > 0:
        t += [TensorPlan(b + "ffn_routed_down.weight", (Dl, D), "matrix", D),
              TensorPlan(b + "ffn_routed_up.weight", (D, Dl), "matrix", Dl)]
        if p["routed_norm"] or all_optional:
            t.append(TensorPlan(b + "ffn_routed_norm.weight", (Dl,), "norm"))
    if S > 0 or all_optional:
        Fs = Fe * max(S, 1)
        t += (mat(b + "ffn_gate_shexp", (Fs, D), D, scales=1) + mat(b + "ffn_down_shexp", (D, Fs), Fs, scales=1)
              + mat(b + "ffn_up_shexp", (Fs, D), D, scales=1))
    return t


def plan_tensors(p: dict, *, all_optional: bool = False) -> list[TensorPlan]:
    """Every tensor llama.cpp's kimi-k3 loader creates, in its order (output untied and required)."""
    D, V = p["n_embd"], p["n_vocab"]
    t = [TensorPlan("token_embd.weight", (V, D), "embed"),
         TensorPlan("output_norm.weight", (D,), "norm"),
         TensorPlan("output.weight", (V, D), "output", D)]
    if p["res_bs"] > 0:
        t.append(TensorPlan("output_res_score.weight", (D,), "res_score"))
    for il in range(p["n_layer"]):
        b = f"blk.{il}."
        t += [TensorPlan(b + "attn_norm.weight", (D,), "norm"), TensorPlan(b + "ffn_norm.weight", (D,), "norm")]
        if p["res_bs"] > 0:
            t += [TensorPlan(b + "attn_res_score.weight", (D,), "res_score"),
                  TensorPlan(b + "ffn_res_score.weight", (D,), "res_score")]
        attn = _kda_plans if is_kda(p, il) else mla_plans
        t += attn(il, p, all_optional=all_optional)
        t += ffn_plans(il, p, all_optional=all_optional)
    return t


# ---------------------------------------------------------------- metadata

def metadata(p: dict, *, name: str) -> list[tuple[str, object, str]]:
    """The keys conversion/kimi_k3.py writes and kimi-k3.cpp:16-51 reads. head_count_kv is per layer:
    1 on MLA blocks (MLA served as MQA), 0 on KDA blocks (llama.cpp's mark of a recurrent layer)."""
    a = ARCH
    C, R = p["kv_lora"], p["qk_rope"]
    kv = head_metadata(a, p, name=name, head_count_kv=[0 if is_kda(p, il) else 1 for il in range(p["n_layer"])])
    kv += [
        (f"{a}.vocab_size", p["n_vocab"], "u32"),
        (f"{a}.ssm.conv_kernel", p["d_conv"], "u32"),
        (f"{a}.kda.head_dim", p["dh"], "u32"),
        (f"{a}.attention.kv_lora_rank", C, "u32"),
        (f"{a}.rope.dimension_count", R, "u32"),
        (f"{a}.expert_weights_norm", bool(p["norm_w"]), "bool"),
        (f"{a}.expert_gating_func", GATING_SIGMOID, "u32"),
        (f"{a}.activation.situ_beta", p["situ_beta"], "f32"),
        (f"{a}.activation.situ_linear_beta", p["situ_linear_beta"], "f32"),
        (f"{a}.attn_res.block_size", p["res_bs"], "u32"),
        ("tokenizer.ggml.model", "none", "str"),
    ] + mla_metadata(a, p) + moe_metadata(a, p)
    if p["q_lora"] > 0:
        kv.append((f"{a}.attention.q_lora_rank", p["q_lora"], "u32"))
    if p["gate_lb"] is not None:
        kv.append((f"{a}.kda.gate_lower_bound", p["gate_lb"], "f32"))
    if p["latent"] > 0:
        kv.append((f"{a}.expert_latent_length", p["latent"], "u32"))
    return kv


# ---------------------------------------------------------------- the arch's synth entry points (refengine.synth)

def synth_plan(p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
    no_option(ARCH, fused_qkv=fused_qkv, tied_output=tied_output)    # K3 requires separate q/k/v and output
    # rope_scaling: K3's rope type is NONE (no rotation anywhere), so no scaling key is written
    return plan_tensors(p, all_optional=all_optional)


def synth_metadata(p: dict, *, all_optional=False, rope_scaling=None, name=""):
    return metadata(p, name=name)
