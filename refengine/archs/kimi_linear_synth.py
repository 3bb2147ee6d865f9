"""The synthetic `kimi-linear` plans: KDA + MLA (rope NONE) layers, DeepSeek-style MoE with shared experts.

    write_synth("kimi-linear", "kl.gguf", preset="tiny", wtype="Q4_K", seed=0, all_optional=True)

Tensor names, shapes and keys are the ones llama.cpp's kimi-linear loader asks for (`src/models/kimi-linear.cpp`
load_arch_hparams / load_arch_tensors, llama-cpp-python 0.3.36) and its converter writes
(`conversion/kimi_linear.py`). Dimension letters:

    D model dim   V vocab   H heads (KDA and MLA)   dh kda.head_dim   d_in = H*dh   Kc ssm.conv_kernel
    C kv-LoRA rank   dn qk_nope   R qk_rope (rope.dimension_count, not rotated)   dv v_head
    F dense FFN   E experts   A active   Fe expert FFN   S shared

Presets (`PRESETS[name]`):
- `tiny`          4 blocks KDA, KDA, KDA, MLA (absorbed attn_k_b / attn_v_b), block 0 dense, sigmoid + exp_probs_b.
- `tiny-legacy`   the same with key_length_mla = value_length_mla = 0: llama.cpp's legacy attn_kv_b path.
- `kimi-linear-48b`: the published shape (cited beside it). Too big to write whole: use `layers=N`
  (see `synth_resolve`: the last kept block is MLA when the cut keeps none).

Entries: `mla_layers` the 0-based MLA block indices (the others are KDA; head_count_kv is 0 there and 1 in
an MLA block, as the converter writes); `conv_4d` writes the converter's 4-D conv weights {Kc,1,d_in,1} and
ssm_a {1,H,1,1} (False: the 3-D / 2-D forms llama.cpp's second try accepts).
`all_optional` adds what the loader also accepts: q/k/v biases, the generic `.scale` / `.input_scale` of
attn_q/k/v(/qkv), attn_output, ssm_beta, the FFN and expert matrices. Of those llama.cpp's graph applies only
`attn_output.scale` of the MLA blocks (build_attn's wo_s); refengine honors exactly that.
`fused_qkv` writes one attn_qkv {D, 3 d_in} in the KDA blocks (create_tensor_qkv's first try).
"""
from __future__ import annotations

from ..errors import ConfigError
from ..synthplan import TensorPlan, mla_metadata, mla_plans, moe_metadata, rope_scaling_metadata, weight_plans
from .kimi_family_synth import head_metadata, kda_plans

ARCH = "kimi-linear"

GATING = {"softmax": 1, "sigmoid": 2}

_TINY = dict(n_vocab=256, n_embd=256, n_layer=4, n_head=4, n_ctx=512, eps=1e-5, rope_base=10000.0,
             kda_head=32, d_conv=4, mla_layers=(3,), conv_4d=True,
             kv_lora=64, qk_nope=32, qk_rope=16, v_head=32, mla=True,
             n_ff=256, n_dense_lead=1, n_expert=8, n_expert_used=2, n_ff_exp=64, n_shared=1,
             gating="sigmoid", w_scale=2.446)

PRESETS: dict[str, dict] = {
    "tiny": _TINY,
    # key_length_mla = value_length_mla = 0 -> is_mla() false: attn_kv_b and a per-head KV cache
    # (kimi-linear.cpp:124-128, :441-476); the MLA block's head_count_kv is H then (the cache holds H heads).
    "tiny-legacy": dict(_TINY, mla=False),
    # Kimi-Linear-48B-A3B-Instruct, from Hugging Face moonshotai/Kimi-Linear-48B-A3B-Instruct/config.json
    # (quoted whole in public copies, e.g. an MLX conversion's config and pinned-field test fixtures):
    # hidden_size 2304, intermediate_size 9216, num_hidden_layers 27, num_attention_heads 32, rms_norm_eps 1e-5,
    # vocab_size 163840, model_max_length 1048576, rope_theta 10000 (unused: mla_use_nope true),
    # kv_lora_rank 512, q_lora_rank null, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128,
    # linear_attn_config {head_dim 128, num_heads 32, short_conv_kernel_size 4, full_attn_layers
    # [4, 8, 12, 16, 20, 24, 27] (1-based; the other 20 are KDA)}, num_experts 256, num_experts_per_token 8,
    # num_shared_experts 1, moe_intermediate_size 1024, first_k_dense_replace 1, moe_router_activation_func
    # sigmoid, moe_renormalize true, routed_scaling_factor 2.446, num_expert_group 1, topk_group 1.
    "kimi-linear-48b": dict(n_vocab=163840, n_embd=2304, n_layer=27, n_head=32, n_ctx=1048576, eps=1e-5,
                            rope_base=10000.0, kda_head=128, d_conv=4,
                            mla_layers=tuple(i - 1 for i in (4, 8, 12, 16, 20, 24, 27)), conv_4d=True,
                            kv_lora=512, qk_nope=128, qk_rope=64, v_head=128, mla=True,
                            n_ff=9216, n_dense_lead=1, n_expert=256, n_expert_used=8, n_ff_exp=1024, n_shared=1,
                            gating="sigmoid", w_scale=2.446),
}


def synth_resolve(p: dict, layers: int | None) -> dict:
    """`layers=N` keeps the first N blocks with their KDA / MLA kinds; a cut that would keep no MLA block makes
    its last block MLA: llama.cpp 0.3.36 aborts on a kimi-linear file without one (its hybrid memory gets an
    empty attention cache: GGML_ASSERT(buffer) at ggml-backend.cpp:205, measured)."""
    if p["gating"] not in GATING:
        raise ConfigError(f"gating {p['gating']!r} is not one of {', '.join(GATING)}")
    if layers is not None:
        kept = tuple(i for i in p["mla_layers"] if i < layers) or (layers - 1,)
        p = dict(p, n_layer=layers, n_dense_lead=min(p["n_dense_lead"], layers), mla_layers=kept)
    return p


def is_mla(p: dict, il: int) -> bool:
    return il in p["mla_layers"]


# ---------------------------------------------------------------- tensors

def _kda_plans(il: int, p: dict, all_optional: bool, fused_qkv: bool) -> list[TensorPlan]:
    """kimi-linear.cpp:52-109: `conv_4d` writes the 4-D conv weights and ssm_a {1,H,1,1} (else {1,H}); the
    low-rank output gate ssm_g_a / ssm_g_b."""
    H, d_in = p["n_head"], p["n_head"] * p["kda_head"]
    return kda_plans(il, D=p["n_embd"], H=H, dh=p["kda_head"], Kc=p["d_conv"],
                     conv_shape=(1, d_in, 1, p["d_conv"]) if p["conv_4d"] else (d_in, 1, p["d_conv"]),
                     ssm_a_shape=(1, 1, H, 1) if p["conv_4d"] else (H, 1),
                     fused_qkv=fused_qkv, full_rank_gate=False, all_optional=all_optional)


def ffn_plans(il: int, p: dict, *, all_optional: bool) -> list[TensorPlan]:
    """kimi-linear.cpp:138-165: dense SwiGLU for il < n_dense_lead, else router, exp_probs_b (required),
    routed experts and the shared experts."""
    b, D = f"blk.{il}.", p["n_embd"]
    E, Fe, S, F = p["n_expert"], p["n_ff_exp"], max(p["n_shared"], 1), p["n_ff"]
    mat = lambda *a, **k: weight_plans(*a, all_optional=all_optional, **k)   # noqa: E731
    t = [TensorPlan(b + "ffn_norm.weight", (D,), "norm")]
    if il < p["n_dense_lead"]:
        for x, shape, fan in (("gate", (F, D), D), ("down", (D, F), F), ("up", (F, D), D)):
            t += mat(b + f"ffn_{x}", shape, fan, scales=1)
        return t
    t += mat(b + "ffn_gate_inp", (E, D), D, kind="router")                  # ne {D, E}
    t += mat(b + "ffn_gate_exps", (E, Fe, D), D, scales=E)                  # ne {D, Fe, E}
    t += mat(b + "ffn_down_exps", (E, D, Fe), Fe, scales=E)                 # ne {Fe, D, E}
    t += mat(b + "ffn_up_exps", (E, Fe, D), D, scales=E)
    t += mat(b + "ffn_gate_shexp", (Fe * S, D), D, scales=1)                # ne {D, Fe*S}
    t += mat(b + "ffn_down_shexp", (D, Fe * S), Fe * S, scales=1)
    t += mat(b + "ffn_up_shexp", (Fe * S, D), D, scales=1)
    t.append(TensorPlan(b + "exp_probs_b.bias", (E,), "probs_bias", std=0.2 if p["gating"] == "sigmoid" else 0.8 / E))
    return t


def _check_rope_scaling(rope_scaling) -> None:
    if rope_scaling not in (None, "none", "linear", "yarn"):
        raise ConfigError(f"synth {ARCH}: rope scaling {rope_scaling!r} is not one of none, linear, yarn "
                          f"(no rope factor tensors)")


def synth_plan(p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
    if tied_output:
        raise ConfigError(f"synth {ARCH}: output.weight is required by llama.cpp's loader (no tied output)")
    _check_rope_scaling(rope_scaling)
    D, V = p["n_embd"], p["n_vocab"]
    t = [TensorPlan("token_embd.weight", (V, D), "embed"),
         TensorPlan("output_norm.weight", (D,), "norm"),
         TensorPlan("output.weight", (V, D), "output", D)]
    for il in range(p["n_layer"]):
        if is_mla(p, il):       # kimi-linear.cpp:111-136: plain attn_q (no q-LoRA), attn_k_b / attn_v_b or attn_kv_b
            t += mla_plans(il, dict(p, q_lora=0), all_optional=all_optional)       # attn_norm first
        else:
            t += [TensorPlan(f"blk.{il}.attn_norm.weight", (D,), "norm")] + _kda_plans(il, p, all_optional, fused_qkv)
        t += ffn_plans(il, p, all_optional=all_optional)
    return t


# ---------------------------------------------------------------- metadata

def synth_metadata(p: dict, *, all_optional=False, rope_scaling=None, name=""):
    """The keys kimi-linear.cpp:4-31 and the generic loader read, as conversion/kimi_linear.py writes them:
    head_count_kv per block (0 = KDA), key_length = C + R (the latent cache row), the MLA head sizes."""
    a, H, C, R = ARCH, p["n_head"], p["kv_lora"], p["qk_rope"]
    dn, dv = p["qk_nope"], p["v_head"]
    mla_kv = 1 if p["mla"] else H
    kv = head_metadata(a, p, name=name, head_count_kv=[mla_kv if is_mla(p, il) else 0 for il in range(p["n_layer"])])
    kv += [
        (f"{a}.attention.kv_lora_rank", C, "u32"),
        (f"{a}.rope.freq_base", p["rope_base"], "f32"),
        (f"{a}.rope.dimension_count", R, "u32"),
        (f"{a}.ssm.conv_kernel", p["d_conv"], "u32"),
        (f"{a}.kda.head_dim", p["kda_head"], "u32"),
        (f"{a}.vocab_size", p["n_vocab"], "u32"),
        (f"{a}.expert_gating_func", GATING[p["gating"]], "u32"),
        ("tokenizer.ggml.model", "none", "str"),
    ] + moe_metadata(a, p)
    # rope type NONE: the generic loader reads rope.scaling.* (llama-model.cpp:1408-1436) but nothing is rotated
    # and the MLA scale is 1/sqrt(dn+R) whatever they say (kimi-linear.cpp:276), so they change nothing
    _check_rope_scaling(rope_scaling)
    kv += rope_scaling_metadata(a, p, None if rope_scaling == "none" else rope_scaling)
    if p["mla"]:
        kv += mla_metadata(a, p)
    else:
        kv += [(f"{a}.attention.key_length", dn + R, "u32"),
               (f"{a}.attention.value_length", dv, "u32"),
               (f"{a}.attention.key_length_mla", 0, "u32"),
               (f"{a}.attention.value_length_mla", 0, "u32")]
    return kv
