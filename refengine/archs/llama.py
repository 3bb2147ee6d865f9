"""`llama`: the dense baseline transformer (Llama 2/3, SmolLM2, Mixtral-style MoE when expert_count > 0).

llama.cpp: `src/models/llama.cpp` (graph and tensor table), generic optional tensors in
`src/llama-model.cpp:1620-1790` (`.scale` / `.input_scale` pass), `build_qkv`, `build_attn`,
`build_ffn`, `build_moe_ffn` in `src/llama-graph.cpp`.

One block (Legend: T tokens, D model dim):

    h = rms_norm(x) * attn_norm                           attn_norm       [T, D]
    x = x + gqa_attention(h)     (attention/gqa.py)       attn_out, ffn_inp
    h = rms_norm(x) * ffn_norm                            ffn_norm
    x = x + dense_ffn(h)         (ffn/dense.py)           ffn_out         (dense)
      | x + moe_block(h)         (moe/block.py: softmax top-k, weights renormalized)   ffn_moe_out
                                                          l_out           [T, D]
RoPE: NORM pairs, optional `rope_freqs` / LongRoPE factors; the residual is one [T, D] stream.
"""
from __future__ import annotations

from .. import synthplan as sp
from ..attention import gqa
from ..config import LLAMA_IGNORED_MATH_KEYS, ROPE_NORM, KeyReader, LayerSpec, ModelConfig, check_experts, check_gqa, check_head_dims, read_common, token_rows
from ..ffn import dense_ffn, dense_ffn_table
from ..globals import embed_tokens, load_globals as _load_globals, rms_head, rope_factors
from ..moe.block import MoEConfig, moe_block, moe_table
from ..ops import rms_norm
from ..ops.rope import context_rope
from ..weights import load_tensors, norm_table

ARCH = "llama"
ROPE_TYPE = ROPE_NORM
DEVICE_PATH = True          # refengine.cuda runs the whole forward of this arch's layer kinds (mha + dense/moe)

# llama.cpp graph tensor that is the input of a quantized matmul -> the GGUF weights it multiplies (refengine.flips)
MATMUL_INPUTS = [
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q.weight", "blk.{il}.attn_qkv.weight"]),
    (r"kqv_out-(\d+)", ["blk.{il}.attn_output.weight"]),
    (r"ffn_norm-(\d+)", ["blk.{il}.ffn_up.weight", "blk.{il}.ffn_up_exps.weight", "blk.{il}.ffn_gate_inp.weight"]),
    (r"ffn_swiglu-(\d+)", ["blk.{il}.ffn_down.weight"]),
    (r"ffn_moe_swiglu-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"result_norm", ["output.weight", "token_embd.weight"]),
]


# ---------------------------------------------------------------- config

def config_from_gguf(gf) -> ModelConfig:
    r = KeyReader(gf, ARCH)
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_TYPE, n_vocab=token_rows(gf))
    L = common["n_layer"]
    L_all = L + common["n_layer_nextn"]
    n_ff = r.per_layer("feed_forward_length", L_all, default=0)[:L]
    n_used = r.per_layer("expert_used_count", L_all, default=0)[:L]
    E = common["n_expert"]
    check_experts(gf, ARCH, E, n_used)
    check_head_dims(gf, ARCH, common)
    layers = []
    for il in range(L):
        check_gqa(gf, il, n_head[il], n_head_kv[il])
        moe = None
        if E > 0:     # Mixtral: experts sized by feed_forward_length, softmax top-k, weights renormalized
            moe = MoEConfig(n_expert=E, n_expert_used=int(n_used[il]), n_ff_exp=int(n_ff[il] or 0),
                            n_groups=common["n_expert_groups"], n_group_used=common["n_group_used"],
                            gate_exps_required=False)
        layers.append(LayerSpec(attn="mha", ffn="moe" if E > 0 else "dense", n_head=int(n_head[il]),
                                n_head_kv=int(n_head_kv[il]), n_ff=int(n_ff[il] or 0),
                                n_ff_exp=int(n_ff[il] or 0) if E > 0 else 0, n_expert_used=int(n_used[il] or 0),
                                moe=moe))
    ignored = r.warn_ignored(list(LLAMA_IGNORED_MATH_KEYS))
    return ModelConfig(**common, layers=tuple(layers), ignored_keys=ignored)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg):
    return _load_globals(gf, cfg)


def load_layer(gf, cfg, il: int):
    spec = cfg.layers[il]
    table = norm_table(il, "attn_norm", "ffn_norm")
    table += gqa.gqa_table(gf, il)
    table += dense_ffn_table(il, lambda c, s: s.n_ff) if spec.ffn == "dense" else moe_table(gf, il, spec.moe)
    return load_tensors(gf, table, cfg, spec, il)


def new_state(cfg, attn_form: str | None = None) -> list:
    """One KVCache per layer (softmax attention has one form; attn_form is for archs with two)."""
    return [gqa.new_state() for _ in range(cfg.n_layer)]


# ---------------------------------------------------------------- forward

def rope_for(cfg, g, pos, n_ctx):
    """cos, sin [T, n_rot/2] for positions pos [T] with llama.cpp's context-level rope parameters."""
    return context_rope(cfg, pos, freq_factors=rope_factors(g, cfg, n_ctx))


def embed(g, cfg, step, rt):
    return embed_tokens(g, step.tokens, rt)                              # [T, D]


def block(x, w, *, cfg, il, state, step, rt):
    """One transformer block: x [T, D] -> [T, D]."""
    spec = cfg.layers[il]
    cos, sin = step.memo("rope", lambda: rope_for(cfg, step.g, step.pos, step.n_ctx))    # [T, R/2]
    h = rms_norm(x, w.attn_norm, cfg.rms_eps)
    rt.record("attn_norm", il, h)
    a = gqa.self_attention(h, w, cfg=cfg, spec=spec, il=il, state=state, step=step, cos=cos, sin=sin, rt=rt)
    rt.record("attn_out", il, a)
    x = x + a
    rt.record("ffn_inp", il, x)
    h = rms_norm(x, w.ffn_norm, cfg.rms_eps)
    rt.record("ffn_norm", il, h)
    if spec.ffn == "dense":
        f = dense_ffn(h, w, il=il, rt=rt)
        rt.record("ffn_out", il, f)       # llama.cpp then renames the residual sum to l_out
    else:
        f = moe_block(h, w, mc=spec.moe, spec=spec, il=il, rt=rt)
    x = x + f
    rt.record("l_out", il, x)
    return x


def head(x, g, cfg, rt):
    return rms_head(x, g, cfg, rt, where=cfg.name or ARCH)


# ---------------------------------------------------------------- synthetic models (refengine.synth)

PRESETS = {
    "tiny": dict(n_vocab=256, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                 n_ctx=512, rope_base=10000.0, eps=1e-5),
    "tiny-moe": dict(n_vocab=256, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ff=256,
                     n_expert=4, n_expert_used=2, n_ctx=512, rope_base=10000.0, eps=1e-5),
}


def synth_plan(p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
    D, E = p["n_embd"], p.get("n_expert", 0)
    t = [sp.TensorPlan("token_embd.weight", (p["n_vocab"], D), "embed")]
    t += sp.rope_factor_plans(p, rope_scaling, all_optional, p["head_dim"])
    for il in range(p["n_layer"]):
        t.append(sp.TensorPlan(f"blk.{il}.attn_norm.weight", (D,), "norm"))
        t += sp.gqa_plans(il, p, all_optional=all_optional, fused_qkv=fused_qkv, qk_norm=False, out_bias=True)
        t.append(sp.TensorPlan(f"blk.{il}.ffn_norm.weight", (D,), "norm"))
        if E:
            t += sp.moe_plans(il, D, E, p["n_ff"], all_optional=all_optional)
        else:
            t += sp.dense_ffn_plans(il, D, p["n_ff"], all_optional=all_optional)
    return t + sp.output_plans(p, tied_output=tied_output)


def synth_metadata(p: dict, *, all_optional=False, rope_scaling=None, name=""):
    a = ARCH
    kv = sp.common_metadata(a, p, name=name) + [(f"{a}.rope.dimension_count", p["head_dim"], "u32")]
    if p["head_dim"] != p["n_embd"] // p["n_head"]:
        kv += [(f"{a}.attention.key_length", p["head_dim"], "u32"), (f"{a}.attention.value_length", p["head_dim"], "u32")]
    if p.get("n_expert"):
        kv += [(f"{a}.expert_count", p["n_expert"], "u32"), (f"{a}.expert_used_count", p["n_expert_used"], "u32")]
        if all_optional and p["n_expert"] >= 4:
            # group-limited routing, read by llama.cpp for every MoE arch (hparams.n_expert_groups)
            kv += [(f"{a}.expert_group_count", p["n_expert"] // 2, "u32"),
                   (f"{a}.expert_group_used_count", p["n_expert"] // 4, "u32")]
    return kv + sp.rope_scaling_metadata(a, p, rope_scaling)
