"""The synthetic plans' pieces both Kimi archs share (`kimi-linear`, `kimi-k3`): the KDA block's tensors and the
leading metadata rows. Each arch's synth module passes its sizes and its loader's layout as arguments.

Dimension letters: D model dim   H heads   dh KDA head dim   d_in = H*dh   Kc conv kernel.
"""
from __future__ import annotations

from ..synthplan import TensorPlan, weight_plans


def kda_plans(il: int, *, D: int, H: int, dh: int, Kc: int, conv_shape: tuple[int, ...], ssm_a_shape: tuple[int, ...],
              fused_qkv: bool, full_rank_gate: bool, all_optional: bool) -> list[TensorPlan]:
    """KDA block il (kimi-linear.cpp:52-109, kimi-k3.cpp:82-105), in the loaders' order: the q/k/v convs (F32,
    `conv_shape` the converter's 4-D {Kc,1,d_in,1} or the 3-D {Kc,1,d_in}), attn_qkv or attn_q/k/v, ssm_f_a /
    ssm_f_b, ssm_beta, ssm_a (`ssm_a_shape`), ssm_dt.bias, the output gate (ssm_g_a / ssm_g_b, or ssm_g when
    `full_rank_gate`), ssm_norm, attn_output. all_optional adds the q/k/v(/qkv) biases of create_tensor_qkv and
    the generic pass's .scale / .input_scale of attn_q/k/v(/qkv), ssm_beta, attn_output (llama-model.cpp:1634-1727)."""
    b, d_in = f"blk.{il}.", H * dh
    mat = lambda *a, **k: weight_plans(*a, all_optional=all_optional, **k)   # noqa: E731
    t = [TensorPlan(b + f"ssm_conv1d_{x}.weight", conv_shape, "conv", Kc) for x in "qkv"]
    for x, n in ((("qkv", 3 * d_in),) if fused_qkv else (("q", d_in), ("k", d_in), ("v", d_in))):
        t += mat(b + f"attn_{x}", (n, D), D, scales=1)                      # ne {D, n}
        if all_optional:
            t.append(TensorPlan(b + f"attn_{x}.bias", (n,), "bias"))
    t += mat(b + "ssm_f_a", (dh, D), D)                                     # ne {D, dh}
    t += mat(b + "ssm_f_b", (d_in, dh), dh)                                 # ne {dh, d_in}
    t += mat(b + "ssm_beta", (H, D), D, scales=1)                           # ne {D, H}
    t += [TensorPlan(b + "ssm_a", ssm_a_shape, "ssm_a"), TensorPlan(b + "ssm_dt.bias", (d_in,), "bias")]
    if full_rank_gate:
        t += mat(b + "ssm_g", (d_in, D), D)                                 # ne {D, d_in}
    else:
        t += mat(b + "ssm_g_a", (dh, D), D) + mat(b + "ssm_g_b", (d_in, dh), dh)
    t.append(TensorPlan(b + "ssm_norm.weight", (dh,), "norm"))
    t += mat(b + "attn_output", (D, d_in), d_in, scales=1)                  # ne {d_in, D}
    return t


# The size keys both converters write first, in their order: (key, preset entry).
SIZE_KEYS = (("context_length", "n_ctx"), ("embedding_length", "n_embd"), ("block_count", "n_layer"),
             ("feed_forward_length", "n_ff"), ("attention.head_count", "n_head"))


def head_metadata(a: str, p: dict, *, name: str, head_count_kv: list[int]) -> list[tuple[str, object, str]]:
    """The first keys both converters write: the name, sizes and heads, head_count_kv per block (0 marks a KDA
    block), the norm eps."""
    return ([("general.name", name, "str")] + [(f"{a}.{key}", p[k], "u32") for key, k in SIZE_KEYS]
            + [(f"{a}.attention.head_count_kv", head_count_kv, "arr_u32"),
               (f"{a}.attention.layer_norm_rms_epsilon", p["eps"], "f32")])
