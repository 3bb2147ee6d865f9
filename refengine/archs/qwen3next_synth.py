"""The synthetic `qwen3next` plans (Qwen3-Next): Gated DeltaNet + gated full attention, MoE with a gated shared expert.

    write_synth("qwen3next", "q.gguf", preset="tiny", wtype="Q4_K", seed=0, all_optional=True)
    write_synth("qwen3next", "q.gguf", overrides={"legacy_ssm_in": True, "fused_gate_up": True})

The tensor names, shapes and keys are the ones llama.cpp's qwen3next loader asks for (`src/models/qwen3next.cpp`
load_arch_hparams / load_arch_tensors, llama-cpp-python 0.3.36), written with `refengine.synth`'s writer.
Dimension letters:

    D model dim   V vocab   H / Hkv attention heads   hd attention head dim   R rope dims (partial)
    Hk / Hv linear key / value heads   dk = dv linear head dim (ssm.state_size)   Kc conv kernel
    E experts   A active   Fe expert FFN   Fs shared-expert FFN

Values as a converted file holds them (conversion/qwen.py): the zero-centred norms already hold 1 + w (the
writer's "norm" values near 1), `ssm_a` holds -exp(A_log) < 0, `ssm_conv1d` is F32 [C, Kc].

Presets:
- `tiny`            4 blocks, 3 GDN + 1 full attention (interval 4), Hk 2 / Hv 4 (r = 2), 8 experts top-2, shared expert.
- `qwen3-next-80b`  the published shape (cited beside it). Too big to write whole: use `layers=N`.

Preset switches (also as `overrides`): `legacy_ssm_in` writes the pre-split `ssm_in` (HF in_proj_qkvz layout)
instead of attn_qkv + attn_gate; `fused_gate_up` writes `ffn_gate_up_exps`; `n_mtp` appends that many MTP
blocks (`nextn_predict_layers`: a full-attention block plus nextn.eh_proj / enorm / hnorm, with all_optional
also nextn.embed_tokens / shared_head_head / shared_head_norm), which llama.cpp's main pass skips. `fused_qkv=True` fuses the full
attention's q (with its gate), k, v into one `attn_qkv`.

`all_optional` writes every optional key and tensor the loader accepts: `attention.recurrent_layers` (a
pattern other than the interval's, so the array is seen to win), expert groups, the q/k/v biases, the
generic `.scale` / `.input_scale` of every projection (the GDN projections' are loaded but never applied by
llama.cpp's graph, qwen3next.cpp:324-333, :414, :556), per-expert scales and YaRN (implied by write_synth).
"""
from __future__ import annotations

from .. import synthplan as sp
from ..errors import ConfigError
from ..synthplan import TensorPlan, extras

ARCH = "qwen3next"

_TINY = dict(n_vocab=256, n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, n_rot=16, n_ff=512,
             n_ctx=512, rope_base=1e7, eps=1e-6,
             n_expert=8, n_expert_used=2, n_ff_exp=256, n_ff_shexp=256,
             ssm_k_heads=2, ssm_v_heads=4, ssm_state=64, ssm_conv=4, full_attn_interval=4,
             legacy_ssm_in=False, fused_gate_up=False, n_mtp=0)

PRESETS: dict[str, dict] = {
    "tiny": _TINY,
    # Qwen3-Next-80B-A3B (Instruct / Thinking share it), from its published config.json (Hugging Face
    # Qwen/Qwen3-Next-80B-A3B-Instruct; its model card lists the same: 48 layers, hidden 2048, gated attention
    # 16 q / 2 kv heads of 256 with rotary dim 64, gated DeltaNet 32 v / 16 qk heads of 128, 512 experts,
    # 10 routed + 1 shared, expert intermediate 512; vLLM's Qwen3NextConfig defaults are the same shape):
    # hidden_size 2048, num_hidden_layers 48, num_attention_heads 16, num_key_value_heads 2, head_dim 256,
    # partial_rotary_factor 0.25, linear_num_key_heads 16, linear_num_value_heads 32, linear_key_head_dim 128,
    # linear_value_head_dim 128, linear_conv_kernel_dim 4, num_experts 512, num_experts_per_tok 10,
    # moe_intermediate_size 512, shared_expert_intermediate_size 512, intermediate_size 5120,
    # vocab_size 151936, full_attention_interval 4, rope_theta 10000000, rms_norm_eps 1e-6,
    # max_position_embeddings 262144, norm_topk_prob true. Its one MTP block (mtp_num_hidden_layers 1) is not
    # written by default: overrides={"n_mtp": 1} writes it.
    "qwen3-next-80b": dict(n_vocab=151936, n_embd=2048, n_layer=48, n_head=16, n_head_kv=2, head_dim=256, n_rot=64,
                           n_ff=5120, n_ctx=262144, rope_base=1e7, eps=1e-6,
                           n_expert=512, n_expert_used=10, n_ff_exp=512, n_ff_shexp=512,
                           ssm_k_heads=16, ssm_v_heads=32, ssm_state=128, ssm_conv=4, full_attn_interval=4,
                           legacy_ssm_in=False, fused_gate_up=False, n_mtp=0),
}


def recurrent_layers(p: dict, *, all_optional: bool) -> list[bool]:
    """Per block: True = gated DeltaNet. By the interval (qwen3next.cpp:18-22), or with all_optional the
    written `attention.recurrent_layers` array: the interval's pattern shifted by one, so block 0 is the
    full-attention one (the loader must follow the array, not the interval)."""
    n, k = p["n_layer"], p["full_attn_interval"]
    if all_optional and n > 1:
        return [i % k != 0 for i in range(n)] + [False] * p["n_mtp"]
    return [(i + 1) % k != 0 for i in range(n)] + [False] * p["n_mtp"]      # MTP blocks: never recurrent (:21)


def _gdn_plans(il: int, p: dict, *, all_optional: bool) -> list[TensorPlan]:
    b, D = f"blk.{il}.", p["n_embd"]
    dk, hk, hv, kc = p["ssm_state"], p["ssm_k_heads"], p["ssm_v_heads"], p["ssm_conv"]
    key_dim, value_dim = hk * dk, hv * dk
    conv_dim = 2 * key_dim + value_dim
    t = []
    if p["legacy_ssm_in"]:
        projs = [("ssm_in", 2 * key_dim + 2 * value_dim)]
    else:
        projs = [("attn_qkv", conv_dim), ("attn_gate", value_dim)]
    for name, n in projs:
        t.append(TensorPlan(b + name + ".weight", (n, D), "matrix", D))
        t += extras(b + name, n, bias=False) if all_optional else []
    t += [TensorPlan(b + "ssm_conv1d.weight", (conv_dim, kc), "conv", kc),
          TensorPlan(b + "ssm_dt.bias", (hv,), "bias"),
          TensorPlan(b + "ssm_a", (hv,), "ssm_a"),
          TensorPlan(b + "ssm_ba.weight", (2 * hv, D), "matrix", D),
          TensorPlan(b + "ssm_norm.weight", (dk,), "norm"),
          TensorPlan(b + "ssm_out.weight", (D, value_dim), "matrix", value_dim)]
    t += extras(b + "ssm_out", D, bias=False) if all_optional else []
    return t


def _attn_plans(il: int, p: dict, *, all_optional: bool, fused_qkv: bool) -> list[TensorPlan]:
    """gqa_plans with attn_q twice as wide (q and its output gate per head); no attn_output.bias."""
    t = sp.gqa_plans(il, dict(p, n_head=2 * p["n_head"]), all_optional=all_optional, fused_qkv=fused_qkv,
                     qk_norm=True, out_bias=False)
    b, D, hd = f"blk.{il}.", p["n_embd"], p["head_dim"]
    q_dim = p["n_head"] * hd                            # attn_output reads H*hd, not the doubled q
    return [TensorPlan(tp.name, (D, q_dim), "matrix", q_dim) if tp.name == b + "attn_output.weight" else tp
            for tp in t]


def _moe_plans(il: int, p: dict, *, all_optional: bool) -> list[TensorPlan]:
    b, D, Fs = f"blk.{il}.", p["n_embd"], p["n_ff_shexp"]
    t = sp.moe_plans(il, D, p["n_expert"], p["n_ff_exp"], all_optional=all_optional,
                     fused_gate_up=p["fused_gate_up"])
    t.append(TensorPlan(b + "ffn_gate_inp_shexp.weight", (D,), "matrix", D))        # ne {D}: one gate logit
    for x, shape, fan in (("gate", (Fs, D), D), ("up", (Fs, D), D), ("down", (D, Fs), Fs)):
        t.append(TensorPlan(b + f"ffn_{x}_shexp.weight", shape, "matrix", fan))
        t += extras(b + f"ffn_{x}_shexp", shape[0], bias=False) if all_optional else []
    return t


def synth_plan(p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
    """The tensors llama.cpp's qwen3next loader creates (qwen3next.cpp:42-105), in its order."""
    if rope_scaling == "longrope":
        raise ConfigError("qwen3next has no long/short rope factor tensors; longrope is a llama option")
    D = p["n_embd"]
    t = [TensorPlan("token_embd.weight", (p["n_vocab"], D), "embed")]
    for il, recr in enumerate(recurrent_layers(p, all_optional=all_optional)):
        t += [TensorPlan(f"blk.{il}.attn_norm.weight", (D,), "norm"),
              TensorPlan(f"blk.{il}.post_attention_norm.weight", (D,), "norm")]
        t += _gdn_plans(il, p, all_optional=all_optional) if recr else \
            _attn_plans(il, p, all_optional=all_optional and il < p["n_layer"], fused_qkv=fused_qkv)
        t += _moe_plans(il, p, all_optional=all_optional and il < p["n_layer"])
        if il >= p["n_layer"]:
            t += _mtp_plans(il, p, all_optional=all_optional)
    return t + sp.output_plans(p, tied_output=tied_output)


def _mtp_plans(il: int, p: dict, *, all_optional: bool) -> list[TensorPlan]:
    """The NextN tensors of an MTP block (qwen3next.cpp:115-120); llama.cpp skips the whole block unless asked
    to load MTP, and then creates none of the generic `.scale`s for it (so none are written here)."""
    b, D, V = f"blk.{il}.nextn.", p["n_embd"], p["n_vocab"]
    t = [TensorPlan(b + "eh_proj.weight", (D, 2 * D), "matrix", 2 * D),
         TensorPlan(b + "enorm.weight", (D,), "norm"), TensorPlan(b + "hnorm.weight", (D,), "norm")]
    if all_optional:
        t += [TensorPlan(b + "embed_tokens.weight", (V, D), "embed"),
              TensorPlan(b + "shared_head_head.weight", (V, D), "output", D),
              TensorPlan(b + "shared_head_norm.weight", (D,), "norm")]
    return t


def synth_metadata(p: dict, *, all_optional=False, rope_scaling=None, name=""):
    """Every key qwen3next reads (spec 1.1), as convert_hf_to_gguf writes them."""
    a = ARCH
    n_all = p["n_layer"] + p["n_mtp"]
    kv = [(k, n_all, t) if k == f"{a}.block_count" else (k, v, t) for k, v, t in sp.common_metadata(a, p, name=name)]
    if p["n_mtp"]:
        kv.append((f"{a}.nextn_predict_layers", p["n_mtp"], "u32"))
    kv += [(f"{a}.attention.key_length", p["head_dim"], "u32"), (f"{a}.attention.value_length", p["head_dim"], "u32"),
           (f"{a}.rope.dimension_count", p["n_rot"], "u32"),
           (f"{a}.expert_count", p["n_expert"], "u32"), (f"{a}.expert_used_count", p["n_expert_used"], "u32"),
           (f"{a}.expert_feed_forward_length", p["n_ff_exp"], "u32"),
           (f"{a}.expert_shared_feed_forward_length", p["n_ff_shexp"], "u32"),
           (f"{a}.ssm.conv_kernel", p["ssm_conv"], "u32"),
           (f"{a}.ssm.state_size", p["ssm_state"], "u32"),
           (f"{a}.ssm.group_count", p["ssm_k_heads"], "u32"),
           (f"{a}.ssm.time_step_rank", p["ssm_v_heads"], "u32"),
           (f"{a}.ssm.inner_size", p["ssm_v_heads"] * p["ssm_state"], "u32"),
           (f"{a}.full_attention_interval", p["full_attn_interval"], "u32")]
    if all_optional:
        kv.append((f"{a}.attention.recurrent_layers", recurrent_layers(p, all_optional=True), "arr_bool"))
        if p["n_expert"] >= 4:
            kv += [(f"{a}.expert_group_count", p["n_expert"] // 2, "u32"),
                   (f"{a}.expert_group_used_count", p["n_expert"] // 4, "u32")]
    return kv + sp.rope_scaling_metadata(a, p, rope_scaling)
