"""The pieces an arch's synthetic-model plan is made of: tensor plans and metadata rows.

An arch module declares `PRESETS` and `synth_plan(p, **opts) -> list[TensorPlan]` and
`synth_metadata(p, **opts) -> [(key, value, gguf type)]` built from these helpers; `refengine.synth`
writes the file. Shapes are NumPy order (the reverse of ggml's ne).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError


@dataclass
class TensorPlan:
    name: str
    shape: tuple[int, ...]     # NumPy order
    kind: str                  # matrix | embed | output | router | norm | bias | scale | rope_freqs | probs_bias
                               # | conv (a short-conv kernel: F32, std 1/sqrt(fan_in)) | ssm_a (-exp(A_log) < 0, F32)
                               # | expert_ids (I32 rows of distinct expert ids, `std` = the expert count)
                               # | hole (F32 zeros left as a hole of a sparse file: a table too big to write)
    fan_in: int = 1
    std: float = 0.0           # probs_bias: the spread of the values (the arch's choice); a matrix: overrides
                               # 1/sqrt(fan_in) when > 0


def extras(name: str, n_out: int, *, bias: bool = True) -> list[TensorPlan]:
    """The optional `.bias` / `.scale` / `.input_scale` of a weight `name` (without `.weight`)."""
    t = [TensorPlan(f"{name}.bias", (n_out,), "bias")] if bias else []
    return t + [TensorPlan(f"{name}.scale", (1,), "scale"), TensorPlan(f"{name}.input_scale", (1,), "scale")]


def rope_factor_plans(p: dict, rope_scaling: str | None, all_optional: bool, n_rot: int) -> list[TensorPlan]:
    if rope_scaling == "longrope":
        return [TensorPlan("rope_factors_long.weight", (n_rot // 2,), "rope_freqs"),
                TensorPlan("rope_factors_short.weight", (n_rot // 2,), "rope_freqs")]
    if all_optional:
        return [TensorPlan("rope_freqs.weight", (n_rot // 2,), "rope_freqs")]
    return []


def gqa_plans(il: int, p: dict, *, all_optional: bool, fused_qkv: bool, qk_norm: bool, out_bias: bool) -> list[TensorPlan]:
    """attn_q/k/v (or fused attn_qkv), q/k norms, attn_output, with their optional extras."""
    b, D, K = f"blk.{il}.", p["n_embd"], p["head_dim"]
    dims = {"q": p["n_head"] * K, "k": p["n_head_kv"] * K, "v": p["n_head_kv"] * K}
    t = []
    if fused_qkv:
        n = sum(dims.values())
        t.append(TensorPlan(b + "attn_qkv.weight", (n, D), "matrix", D))
        t += extras(b + "attn_qkv", n) if all_optional else []
    else:
        for x, n in dims.items():
            t.append(TensorPlan(b + f"attn_{x}.weight", (n, D), "matrix", D))
            t += extras(b + f"attn_{x}", n) if all_optional else []
    if qk_norm:
        t += [TensorPlan(b + "attn_q_norm.weight", (K,), "norm"), TensorPlan(b + "attn_k_norm.weight", (K,), "norm")]
    t.append(TensorPlan(b + "attn_output.weight", (D, dims["q"]), "matrix", dims["q"]))
    t += extras(b + "attn_output", D, bias=out_bias) if all_optional else []
    return t


def dense_ffn_plans(il: int, D: int, F: int, *, all_optional: bool, suffix: str = "") -> list[TensorPlan]:
    b = f"blk.{il}."
    t = []
    for x, shape, fan in (("gate", (F, D), D), ("down", (D, F), F), ("up", (F, D), D)):
        t.append(TensorPlan(b + f"ffn_{x}{suffix}.weight", shape, "matrix", fan))
        t += extras(b + f"ffn_{x}{suffix}", shape[0]) if all_optional else []
    return t


def scaled_ffn_plans(b: str, D: int, F: int, *, all_optional: bool) -> list[TensorPlan]:
    """A dense SwiGLU FFN `{b}ffn_gate / ffn_down / ffn_up` (in that order) whose matrices may carry a per-tensor
    `.scale` / `.input_scale` (with all_optional): the DeepSeek and Kimi families' dense blocks."""
    return (weight_plans(b + "ffn_gate", (F, D), D, all_optional=all_optional, scales=1)
            + weight_plans(b + "ffn_down", (D, F), F, all_optional=all_optional, scales=1)
            + weight_plans(b + "ffn_up", (F, D), D, all_optional=all_optional, scales=1))


def moe_plans(il: int, D: int, E: int, F: int, *, all_optional: bool, fused_gate_up: bool = False,
              probs_bias: bool = False) -> list[TensorPlan]:
    """Router, optional exp_probs_b, routed experts (gate/up/down or fused gate_up), per-expert scales."""
    b = f"blk.{il}."
    t = [TensorPlan(b + "ffn_gate_inp.weight", (E, D), "router", D)]
    if probs_bias:
        t.append(TensorPlan(b + "exp_probs_b.bias", (E,), "probs_bias"))
    parts = [("gate_up", (E, 2 * F, D), D), ("down", (E, D, F), F)] if fused_gate_up else \
        [("gate", (E, F, D), D), ("down", (E, D, F), F), ("up", (E, F, D), D)]
    for x, shape, fan in parts:
        t.append(TensorPlan(b + f"ffn_{x}_exps.weight", shape, "matrix", fan))
        if all_optional and x != "gate_up":
            t += [TensorPlan(b + f"ffn_{x}_exps.scale", (E,), "scale"),
                  TensorPlan(b + f"ffn_{x}_exps.input_scale", (E,), "scale")]
    return t


def output_plans(p: dict, *, tied_output: bool) -> list[TensorPlan]:
    t = [TensorPlan("output_norm.weight", (p["n_embd"],), "norm")]
    if not tied_output:
        t.append(TensorPlan("output.weight", (p["n_vocab"], p["n_embd"]), "output", p["n_embd"]))
    return t


def common_metadata(arch: str, p: dict, *, name: str, n_head_kv=None) -> list[tuple[str, object, str]]:
    """Keys every arch reads (`load_hparams`): sizes, heads, norm eps, rope base, vocabulary."""
    a = arch
    return [
        ("general.name", name, "str"),
        (f"{a}.context_length", p["n_ctx"], "u32"),
        (f"{a}.embedding_length", p["n_embd"], "u32"),
        (f"{a}.block_count", p["n_layer"], "u32"),
        (f"{a}.feed_forward_length", p["n_ff"], "u32"),
        (f"{a}.attention.head_count", p["n_head"], "u32"),
        (f"{a}.attention.head_count_kv", p["n_head_kv"] if n_head_kv is None else n_head_kv, "u32"),
        (f"{a}.attention.layer_norm_rms_epsilon", p["eps"], "f32"),
        (f"{a}.rope.freq_base", p["rope_base"], "f32"),
        (f"{a}.vocab_size", p["n_vocab"], "u32"),
        ("tokenizer.ggml.model", "none", "str"),
    ]


def rope_scaling_metadata(arch: str, p: dict, rope_scaling: str | None) -> list[tuple[str, object, str]]:
    """Context extension (factor 4), honored by llama.cpp for every arch through llama_context's cparams."""
    if rope_scaling is None:
        return []
    a = arch
    return [(f"{a}.rope.scaling.type", rope_scaling, "str"), (f"{a}.rope.scaling.factor", 4.0, "f32"),
            (f"{a}.rope.scaling.original_context_length", p["n_ctx"] // 4, "u32"),
            (f"{a}.rope.scaling.attn_factor", 1.25, "f32")]


def no_option(arch: str, **opts) -> None:
    """Refuse a synth option the arch does not have, naming it."""
    for k, v in opts.items():
        if v:
            raise ConfigError(f"synth {arch}: option {k} is not available for this arch")


# ---------------------------------------------------------------- MLA and DeepSeek-style MoE (DeepSeek family, kimi-*)
#
# Preset entries these read: q_lora kv_lora qk_nope qk_rope v_head | n_expert n_expert_used n_ff_exp n_shared
# n_dense_lead w_scale. The DeepSeek family's own plans are in archs/deepseek_family_synth.py.

def weight_plans(name: str, shape, fan: int, *, all_optional: bool, kind: str = "matrix",
                 scales: int | None = None) -> list[TensorPlan]:
    """A matrix `name.weight` and, with all_optional, its per-tensor (scales=1) or per-expert (scales=E)
    `.scale` / `.input_scale` (the generic pass of llama-model.cpp:1634-1773)."""
    out = [TensorPlan(name + ".weight", tuple(shape), kind, fan)]
    if all_optional and scales is not None:
        out += [TensorPlan(name + ".scale", (scales,), "scale"), TensorPlan(name + ".input_scale", (scales,), "scale")]
    return out


def mla_plans(il: int, p: dict, *, all_optional: bool) -> list[TensorPlan]:
    """MLA's tensors (deepseek2.cpp:98-122, deepseek32.cpp:92-105): norms, q-LoRA (or plain attn_q), the latent
    projection, attn_k_b / attn_v_b (or a legacy attn_kv_b when p["mla"] is false), attn_output."""
    b, D, H = f"blk.{il}.", p["n_embd"], p["n_head"]
    Dq, C, dn, R, dv = p["q_lora"], p["kv_lora"], p["qk_nope"], p["qk_rope"], p["v_head"]
    dk = dn + R
    mat = lambda *a, **k: weight_plans(*a, all_optional=all_optional, **k)   # noqa: E731
    t = [TensorPlan(b + "attn_norm.weight", (D,), "norm")]
    if Dq > 0:
        t.append(TensorPlan(b + "attn_q_a_norm.weight", (Dq,), "norm"))
    t.append(TensorPlan(b + "attn_kv_a_norm.weight", (C,), "norm"))
    if Dq > 0:
        t += mat(b + "attn_q_a", (Dq, D), D)                              # ne {D, Dq}
        t += mat(b + "attn_q_b", (H * dk, Dq), Dq)                        # ne {Dq, H*dk}
    else:
        t += mat(b + "attn_q", (H * dk, D), D, scales=1)                  # ne {D, H*dk}
    t += mat(b + "attn_kv_a_mqa", (C + R, D), D)                          # ne {D, C+R}: latent, then rope
    if p.get("mla", True):
        t += mat(b + "attn_k_b", (H, C, dn), dn)                          # ne {dn, C, H}
        t += mat(b + "attn_v_b", (H, dv, C), C)                           # ne {C, dv, H}
    else:
        t += mat(b + "attn_kv_b", (H * (dn + dv), C), C)                  # ne {C, H*(dn+dv)}
    t += mat(b + "attn_output", (D, H * dv), H * dv, scales=1)            # ne {H*dv, D}
    return t


def mla_metadata(a: str, p: dict) -> list[tuple[str, object, str]]:
    """MLA's head keys as converters write them: key_length = C+R / value_length = C (the latent cache row) and
    the per-head sizes key_length_mla = dn+R / value_length_mla = dv (deepseek2, deepseek32, glm-dsa, kimi-*)."""
    C, R, dn, dv = p["kv_lora"], p["qk_rope"], p["qk_nope"], p["v_head"]
    return [(f"{a}.attention.key_length", C + R, "u32"),
            (f"{a}.attention.value_length", C, "u32"),
            (f"{a}.attention.key_length_mla", dn + R, "u32"),
            (f"{a}.attention.value_length_mla", dv, "u32")]


def moe_metadata(a: str, p: dict) -> list[tuple[str, object, str]]:
    """The DeepSeek-style MoE keys: experts, used, expert FFN, shared experts, leading dense blocks, routed scale."""
    return [(f"{a}.expert_count", p["n_expert"], "u32"),
            (f"{a}.expert_used_count", p["n_expert_used"], "u32"),
            (f"{a}.expert_feed_forward_length", p["n_ff_exp"], "u32"),
            (f"{a}.expert_shared_count", p["n_shared"], "u32"),
            (f"{a}.leading_dense_block_count", p["n_dense_lead"], "u32"),
            (f"{a}.expert_weights_scale", p["w_scale"], "f32")]
