"""`deepseek2`: DeepSeek-V2 / V2-Lite / V3 / R1, Kimi K2 — Multi-head Latent Attention + DeepSeekMoE.

llama.cpp: `src/models/deepseek2.cpp` (keys :3-53, tensors :84-159, graph :460-707), `build_moe_ffn`
(src/llama-graph.cpp:2007-2373). One block (Legend: T tokens, D model dim):

    h = rms_norm(x) * attn_norm                           attn_norm       [T, D]
    x = x + mla(h)               (attention/mla.py: q-LoRA or plain q, latent KV, YaRN mscale)   ffn_inp
    h = rms_norm(x) * ffn_norm                            ffn_norm
    x = x + dense_ffn(h)                 for il < leading_dense_block_count       ffn_out
      | x + moe_block(h)                 routed (softmax | sigmoid | sqrt-softplus gating, exp_probs_b for
                                         selection only, expert groups, norm, routed scale) + shared experts
                                                          l_out           [T, D]

RoPE: NORM pairs on the rope part only (`rope.dimension_count` dims of q and of the shared k_pe), with
the context's YaRN parameters; the attention scale folds in DeepSeek's mscale (see attention/mla.py).
"""
from __future__ import annotations

from ..attention import mla
from ..cache import LatentKV
from ..config import ROPE_NORM, KeyReader, LayerSpec, ModelConfig, check_experts, read_common, token_rows
from ..errors import ConfigError
from ..ffn import dense_ffn_table
from ..globals import embed_tokens, load_globals as _load_globals, rms_head
from ..moe.block import ffn_sublayer, GATING, MoEConfig, moe_table
from ..ops import rms_norm
from ..ops.rope import context_rope
from ..weights import load_tensors, norm_table
from .deepseek2_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "deepseek2"
ROPE_TYPE = ROPE_NORM
ATTN_FORMS = mla.FORMS     # absorbed (llama.cpp's for MLA files) and naive: Model.new_state(attn_form)
DEVICE_PATH = False         # MLA layers: `--backend cuda` runs op by op (matmuls and expert dispatch on the GPU)

MATMUL_INPUTS = [
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q_a.weight", "blk.{il}.attn_q.weight", "blk.{il}.attn_kv_a_mqa.weight"]),
    (r"q-(\d+)", ["blk.{il}.attn_q_b.weight"], 1),     # the 2nd `q` (the normed q_a): a name llama.cpp reuses
    (r"q_nope_perm-(\d+)", ["blk.{il}.attn_k_b.weight"]),
    (r"kqv-(\d+)", ["blk.{il}.attn_v_b.weight"]),
    (r"kqv_out-(\d+)", ["blk.{il}.attn_output.weight"]),
    (r"ffn_norm-(\d+)", ["blk.{il}.ffn_up.weight", "blk.{il}.ffn_up_exps.weight", "blk.{il}.ffn_gate_inp.weight",
                         "blk.{il}.ffn_up_shexp.weight"]),
    (r"ffn_swiglu-(\d+)", ["blk.{il}.ffn_down.weight", "blk.{il}.ffn_down_shexp.weight"]),
    (r"ffn_moe_swiglu-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"result_norm", ["output.weight", "token_embd.weight"]),
]

# Keys of other archs that change the math but that the deepseek2 loader never reads.
IGNORED_MATH_KEYS = ("attention.scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
                     "attention.sliding_window", "final_logit_softcapping", "attn_logit_softcapping",
                     "swiglu_clamp_exp", "swiglu_clamp_shexp", "expert_shared_feed_forward_length")


# ---------------------------------------------------------------- config

def _default_gating(n_layer_all: int, n_vocab: int) -> str:
    """`expert_gating_func` when the key is missing (deepseek2.cpp:22-32): sigmoid for the GLM-4.7-Lite
    shape (47/48 layers, vocab 154880), softmax otherwise (DeepSeek-V2 files predate the key)."""
    return "sigmoid" if n_layer_all in (47, 48) and n_vocab == 154880 else "softmax"


def config_from_gguf(gf) -> ModelConfig:
    r = KeyReader(gf, ARCH)
    n_vocab = token_rows(gf)
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_TYPE, n_vocab=n_vocab)
    L = common["n_layer"]
    L_all = L + common["n_layer_nextn"]
    n_dense = int(r.get("leading_dense_block_count", 0))
    n_ff = r.per_layer("feed_forward_length", L_all, default=0)[:L]
    n_ff_exp = r.per_layer("expert_feed_forward_length", L_all, required=True)[:L]
    n_used = r.per_layer("expert_used_count", L_all, default=0)[:L]
    E = common["n_expert"]
    n_shared = int(r.get("expert_shared_count", required=True))
    func = r.get("expert_gating_func")
    if func is not None and int(func) not in GATING:
        raise ConfigError(f"{gf.path}: {ARCH}.expert_gating_func = {func} is not one of {sorted(GATING)}")
    gating = GATING[int(func)] if func is not None else _default_gating(L_all, n_vocab)
    w_scale = float(r.get("expert_weights_scale", 0.0))
    norm_w = bool(r.get("expert_weights_norm", False))
    mc_attn = mla.mla_config(r, **{**common, "n_layer": L_all}, n_head=n_head[0])
    check_experts(gf, ARCH, E if L > n_dense else 0, n_used[n_dense:])
    layers = []
    for il in range(L):
        dense = il < n_dense or E == 0
        moe = None if dense else MoEConfig(
            n_expert=E, n_expert_used=int(n_used[il]), n_ff_exp=int(n_ff_exp[il]), gating=gating, norm_w=norm_w,
            w_scale=w_scale, n_groups=common["n_expert_groups"], n_group_used=common["n_group_used"],
            n_shared=n_shared, n_ff_shexp=int(n_ff_exp[il]) * n_shared, probs_bias=True, fused_gate_up=True, scales=False)
        layers.append(LayerSpec(attn="mla", ffn="dense" if dense else "moe", n_head=int(n_head[il]),
                                n_head_kv=int(n_head_kv[il]), n_ff=int(n_ff[il] or 0),
                                n_ff_exp=0 if dense else int(n_ff_exp[il]),
                                n_expert_used=0 if dense else int(n_used[il]), attn_cfg=mc_attn, moe=moe))
    ignored = r.warn_ignored(list(IGNORED_MATH_KEYS))
    return ModelConfig(**common, layers=tuple(layers), ignored_keys=ignored)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg):
    return _load_globals(gf, cfg, rope_factor_tensors=False)


def load_layer(gf, cfg, il: int):
    spec = cfg.layers[il]
    table = norm_table(il, "attn_norm", "ffn_norm")
    table += mla.mla_table(il, spec.attn_cfg)
    if spec.ffn == "dense":
        table += dense_ffn_table(il, lambda c, s: s.n_ff)           # .scale loaded, not applied (deepseek2.cpp:647-651)
    else:
        table += moe_table(gf, il, spec.moe)
    return load_tensors(gf, table, cfg, spec, il)


def new_state(cfg, attn_form: str | None = None) -> list:
    """One MLA cache per layer: LatentKV (absorbed, llama.cpp's, the default) or per-head KVCache (naive)."""
    return [mla.new_state(spec.attn_cfg, attn_form or mla.llama_form(spec.attn_cfg)) for spec in cfg.layers]


# ---------------------------------------------------------------- forward

def rope_for(cfg, g, pos, n_ctx):
    """cos, sin [T, n_rot/2] of the rope part, with the context's YaRN parameters (no factor tensors)."""
    return context_rope(cfg, pos, attn_factor=cfg.layers[0].attn_cfg.rope_attn_factor)


def embed(g, cfg, step, rt):
    return embed_tokens(g, step.tokens, rt)                              # [T, D]


def block(x, w, *, cfg, il, state, step, rt):
    """x [T, D] -> [T, D]."""
    spec = cfg.layers[il]
    cos, sin = step.memo("rope", lambda: rope_for(cfg, step.g, step.pos, step.n_ctx))    # [T, R/2]
    h = rms_norm(x, w.attn_norm, cfg.rms_eps)
    rt.record("attn_norm", il, h)
    form = "absorbed" if isinstance(state, LatentKV) else "naive"        # the form the state was made for
    a = mla.mla(h, w, mc=spec.attn_cfg, il=il, state=state, cos=cos, sin=sin, rt=rt, form=form)
    x = x + a
    rt.record("ffn_inp", il, x)
    return ffn_sublayer(x, w, cfg=cfg, spec=spec, il=il, rt=rt, dense_scales=False)


def head(x, g, cfg, rt):
    return rms_head(x, g, cfg, rt, where=cfg.name or ARCH)
