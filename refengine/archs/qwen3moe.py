"""`qwen3moe`: Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B).

llama.cpp: `src/models/qwen3moe.cpp`. One block (Legend: T tokens, D model dim, K head dim):

    h = rms_norm(x) * attn_norm                           attn_norm       [T, D]
    x = x + gqa_attention(h)     per-head RMS norms on q and k before RoPE (attn_q_norm, attn_k_norm: [K]),
                                 NEOX RoPE, no rope factor tensors, no attn_output bias      ffn_inp
    h = rms_norm(x) * ffn_norm                            ffn_norm
    x = x + moe_block(h)         every layer: softmax top-k, weights always renormalized
                                 (`norm_w = true` is hard-coded in the graph; `expert_weights_norm` is
                                 not read)                                                   l_out
"""
from __future__ import annotations

from .. import synthplan as sp
from ..attention import gqa
from ..config import LLAMA_IGNORED_MATH_KEYS, ROPE_NEOX, KeyReader, LayerSpec, ModelConfig, check_experts, check_gqa, check_head_dims, read_common, token_rows, qwen_moe_sizes
from ..errors import ConfigError
from ..globals import embed_tokens, load_globals as _load_globals, rms_head
from ..moe.block import MoEConfig, moe_block, moe_table
from ..ops import rms_norm
from ..ops.rope import context_rope
from ..weights import load_tensors, norm_table

ARCH = "qwen3moe"
ROPE_TYPE = ROPE_NEOX
DEVICE_PATH = True          # refengine.cuda runs the whole forward (mha with q/k norms + moe)

MATMUL_INPUTS = [
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q.weight", "blk.{il}.attn_qkv.weight"]),
    (r"kqv_out-(\d+)", ["blk.{il}.attn_output.weight"]),
    (r"ffn_norm-(\d+)", ["blk.{il}.ffn_up_exps.weight", "blk.{il}.ffn_gate_inp.weight"]),
    (r"ffn_moe_swiglu-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"result_norm", ["output.weight", "token_embd.weight"]),
]


def config_from_gguf(gf) -> ModelConfig:
    r = KeyReader(gf, ARCH)
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_TYPE, n_vocab=token_rows(gf))
    L = common["n_layer"]
    L_all = L + common["n_layer_nextn"]
    n_ff, n_used, n_ff_exp = qwen_moe_sizes(r, L, L_all)     # expert FFN: its key, else n_ff / n_used
    E = common["n_expert"]
    check_experts(gf, ARCH, E, n_used, required=True)
    check_head_dims(gf, ARCH, common)
    layers = []
    for il in range(L):
        check_gqa(gf, il, n_head[il], n_head_kv[il])
        ff_exp = n_ff_exp[il]
        moe = MoEConfig(n_expert=E, n_expert_used=n_used[il], n_ff_exp=ff_exp,
                        n_groups=common["n_expert_groups"], n_group_used=common["n_group_used"])
        layers.append(LayerSpec(attn="mha", ffn="moe", n_head=int(n_head[il]), n_head_kv=int(n_head_kv[il]),
                                n_ff=n_ff[il], n_ff_exp=ff_exp, n_expert_used=n_used[il], moe=moe))
    ignored = r.warn_ignored(list(LLAMA_IGNORED_MATH_KEYS))
    return ModelConfig(**common, layers=tuple(layers), ignored_keys=ignored)


def load_globals(gf, cfg):
    return _load_globals(gf, cfg, rope_factor_tensors=False)


def load_layer(gf, cfg, il: int):
    spec = cfg.layers[il]
    table = norm_table(il, "attn_norm", "ffn_norm")
    table += gqa.gqa_table(gf, il, out_bias=False, qk_norm=True) + moe_table(gf, il, spec.moe)
    return load_tensors(gf, table, cfg, spec, il)


def new_state(cfg, attn_form: str | None = None) -> list:
    """One KVCache per layer (softmax attention has one form; attn_form is for archs with two)."""
    return [gqa.new_state() for _ in range(cfg.n_layer)]


def rope_for(cfg, g, pos, n_ctx):
    """cos, sin [T, n_rot/2]: NEOX pairs, YaRN from the context parameters, no factor tensors."""
    return context_rope(cfg, pos, freq_factors=None)


def embed(g, cfg, step, rt):
    return embed_tokens(g, step.tokens, rt)                              # [T, D]


def block(x, w, *, cfg, il, state, step, rt):
    """x [T, D] -> [T, D]."""
    spec = cfg.layers[il]
    cos, sin = step.memo("rope", lambda: rope_for(cfg, step.g, step.pos, step.n_ctx))    # [T, R/2]
    h = rms_norm(x, w.attn_norm, cfg.rms_eps)
    rt.record("attn_norm", il, h)
    a = gqa.self_attention(h, w, cfg=cfg, spec=spec, il=il, state=state, step=step, cos=cos, sin=sin, rt=rt)
    x = x + a
    rt.record("ffn_inp", il, x)
    h = rms_norm(x, w.ffn_norm, cfg.rms_eps)
    rt.record("ffn_norm", il, h)
    x = x + moe_block(h, w, mc=spec.moe, spec=spec, il=il, rt=rt)
    rt.record("l_out", il, x)
    return x


def head(x, g, cfg, rt):
    return rms_head(x, g, cfg, rt, where=cfg.name or ARCH)


# ---------------------------------------------------------------- synthetic models (refengine.synth)

PRESETS = {
    "tiny": dict(n_vocab=256, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=128, n_ff=768,
                 n_expert=8, n_expert_used=2, n_ff_exp=256, n_ctx=512, rope_base=1e6, eps=1e-6),
    # Qwen3-30B-A3B as published (config.json of Qwen/Qwen3-30B-A3B)
    "qwen3-30b-a3b": dict(n_vocab=151936, n_embd=2048, n_layer=48, n_head=32, n_head_kv=4, head_dim=128,
                          n_ff=6144, n_expert=128, n_expert_used=8, n_ff_exp=768, n_ctx=40960,
                          rope_base=1e6, eps=1e-6),
}


def synth_plan(p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
    if rope_scaling == "longrope":
        raise ConfigError("qwen3moe has no long/short rope factor tensors; longrope is a llama option")
    D = p["n_embd"]
    t = [sp.TensorPlan("token_embd.weight", (p["n_vocab"], D), "embed")]
    for il in range(p["n_layer"]):
        t.append(sp.TensorPlan(f"blk.{il}.attn_norm.weight", (D,), "norm"))
        t += sp.gqa_plans(il, p, all_optional=all_optional, fused_qkv=fused_qkv, qk_norm=True, out_bias=False)
        t.append(sp.TensorPlan(f"blk.{il}.ffn_norm.weight", (D,), "norm"))
        t += sp.moe_plans(il, D, p["n_expert"], p["n_ff_exp"], all_optional=all_optional)
    return t + sp.output_plans(p, tied_output=tied_output)


def synth_metadata(p: dict, *, all_optional=False, rope_scaling=None, name=""):
    a = ARCH
    kv = sp.common_metadata(a, p, name=name)
    if p["head_dim"] != p["n_embd"] // p["n_head"]:
        kv += [(f"{a}.attention.key_length", p["head_dim"], "u32"), (f"{a}.attention.value_length", p["head_dim"], "u32")]
    kv += [(f"{a}.expert_count", p["n_expert"], "u32"), (f"{a}.expert_used_count", p["n_expert_used"], "u32"),
           (f"{a}.expert_feed_forward_length", p["n_ff_exp"], "u32")]
    if all_optional and p["n_expert"] >= 4:
        kv += [(f"{a}.expert_group_count", p["n_expert"] // 2, "u32"),
               (f"{a}.expert_group_used_count", p["n_expert"] // 4, "u32")]
    return kv + sp.rope_scaling_metadata(a, p, rope_scaling)
