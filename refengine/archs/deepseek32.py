"""`deepseek32`: DeepSeek-V3.2 (-Exp) — DeepSeek-V3 with DeepSeek Sparse Attention (DSA).

llama.cpp: `src/models/deepseek32.cpp` (keys :6-44, tensors :46-153, graph :162-486). One block
(Legend: T tokens, D model dim, Dq q-LoRA rank):

    h  = rms_norm(x) * attn_norm                               attn_norm       [T, D]
    qr = rms_norm(h @ Wq_a.T) * q_a_norm                       qr              [T, Dq]
    sel = lightning_indexer(h, qr)      (attention/dsa_indexer.py: NEOX rope on the first R dims, key LayerNorm
                                         eps 1e-6, ReLU head scores, top-k)                  top_k   [T, k]
    x  = x + mla(h, qr, mask = top-k + causal)      (attention/mla.py, absorbed: llama.cpp has no other path)
    h  = rms_norm(x) * ffn_norm                                ffn_norm
    x  = x + dense_ffn(h)      for il < leading_dense_block_count                            ffn_out
       | x + moe_block(h)      routed (expert_gating_func, required) + shared experts        l_out   [T, D]

Differences from deepseek2 that llama.cpp makes: q_lora_rank and key/value_length_mla are required (no lite,
no legacy attn_kv_b), expert_gating_func has no default, attention.temperature_* are not read, and the
optional `.scale` tensors of the FFNs and experts ARE applied (deepseek32.cpp:417-449); YaRN's
yarn_log_multiplier is read as in deepseek2 but llama_context's mscale special case is deepseek2's only.
RoPE: NORM pairs for MLA's rope part, NEOX for the indexer, both with the context's YaRN parameters.
"""
from __future__ import annotations

from ..attention import dsa, mla
from ..attention.dsa_indexer import indexer_configs, indexer_table
from ..cache import DSAState
from ..config import ROPE_NEOX, ROPE_NORM, KeyReader, LayerSpec, ModelConfig, read_common, token_rows
from ..errors import ConfigError
from ..ffn import dense_ffn_table
from ..globals import embed_tokens, load_globals as _load_globals, rms_head
from ..moe.block import ffn_sublayer, GATING, deepseek_moe_layers, moe_table
from ..ops import rms_norm
from ..ops.rope import context_rope
from ..weights import load_tensors, norm_table
from .deepseek32_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "deepseek32"
ROPE_TYPE = ROPE_NORM
INDEXER_ROPE = ROPE_NEOX       # deepseek32.cpp:234, :247
INDEXER_K_NORM_EPS = 1e-6      # hparams.f_norm_eps, hard-coded (deepseek32.cpp:9): the file's key is not read
ATTN_FORMS = mla.FORMS         # absorbed (llama.cpp's) and naive: Model.new_state(attn_form)
DEVICE_PATH = False            # MLA layers: `--backend cuda` runs op by op

MATMUL_INPUTS = [
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q_a.weight", "blk.{il}.attn_kv_a_mqa.weight",
                          "blk.{il}.indexer.attn_k.weight", "blk.{il}.indexer.proj.weight"]),
    (r"qr-(\d+)", ["blk.{il}.attn_q_b.weight", "blk.{il}.indexer.attn_q_b.weight"]),   # the 2nd (normed) `qr`
    (r"q_nope_perm-(\d+)", ["blk.{il}.attn_k_b.weight"]),
    (r"kqv-(\d+)", ["blk.{il}.attn_v_b.weight"]),
    (r"kqv_out-(\d+)", ["blk.{il}.attn_output.weight"]),
    (r"ffn_norm-(\d+)", ["blk.{il}.ffn_up.weight", "blk.{il}.ffn_up_exps.weight", "blk.{il}.ffn_gate_inp.weight",
                         "blk.{il}.ffn_up_shexp.weight"]),
    (r"ffn_swiglu-(\d+)", ["blk.{il}.ffn_down.weight", "blk.{il}.ffn_down_shexp.weight"]),
    (r"ffn_moe_swiglu-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"result_norm", ["output.weight", "token_embd.weight"]),
]

# Keys that change the math elsewhere but that deepseek32's loader never reads.
IGNORED_MATH_KEYS = ("attention.layer_norm_epsilon", "attention.temperature_scale", "attention.temperature_length",
                     "attention.scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
                     "attention.sliding_window", "final_logit_softcapping", "attn_logit_softcapping",
                     "attention.indexer.types", "expert_shared_feed_forward_length")


# ---------------------------------------------------------------- config

def config_from_gguf(gf) -> ModelConfig:
    r = KeyReader(gf, ARCH)
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_TYPE, n_vocab=token_rows(gf))
    L = common["n_layer"]
    func = r.get("expert_gating_func", required=True)
    if int(func) not in GATING:
        raise ConfigError(f"{gf.path}: {ARCH}.expert_gating_func = {func} is not one of {sorted(GATING)}")
    moes = deepseek_moe_layers(r, common, GATING[int(func)], scales=True, fused_gate_up=False)
    n_ff = r.per_layer("feed_forward_length", L + common["n_layer_nextn"], default=0)[:L]
    mc = mla.mla_config(r, **{**common, "n_layer": L + common["n_layer_nextn"]}, n_head=n_head[0],
                        lite_rule=False, require_mla=True, mscale_is_log_mul=False, temperature=False)
    ics = indexer_configs(r, n_rot=common["n_rot"], rope_mode=INDEXER_ROPE, k_norm_eps=INDEXER_K_NORM_EPS,
                          full=[True] * L)
    layers = tuple(
        LayerSpec(attn="dsa", ffn="dense" if moe is None else "moe", n_head=int(n_head[il]),
                  n_head_kv=int(n_head_kv[il]), n_ff=int(n_ff[il] or 0),
                  n_ff_exp=0 if moe is None else moe.n_ff_exp, n_expert_used=0 if moe is None else moe.n_expert_used,
                  attn_cfg=mc, moe=moe, indexer=ics[il])
        for il, moe in enumerate(moes))
    ignored = r.warn_ignored(list(IGNORED_MATH_KEYS))
    return ModelConfig(**common, layers=layers, ignored_keys=ignored)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg):
    return _load_globals(gf, cfg, rope_factor_tensors=False)


def load_layer(gf, cfg, il: int):
    spec = cfg.layers[il]
    table = norm_table(il, "attn_norm", "ffn_norm") + mla.mla_table(il, spec.attn_cfg)
    table += indexer_table(il, spec.indexer)
    if spec.ffn == "dense":
        table += dense_ffn_table(il, lambda c, s: s.n_ff)
    else:
        table += moe_table(gf, il, spec.moe)
    return load_tensors(gf, table, cfg, spec, il)


def new_state(cfg, attn_form: str | None = None) -> list:
    """Per layer a DSAState: the MLA cache of the form (absorbed by default) and the indexer key cache."""
    return [dsa.new_state(s.attn_cfg, s.indexer, attn_form or mla.llama_form(s.attn_cfg)) for s in cfg.layers]


# ---------------------------------------------------------------- forward

def embed(g, cfg, step, rt):
    return embed_tokens(g, step.tokens, rt)                              # [T, D]


def block(x, w, *, cfg, il, state: DSAState, step, rt):
    """x [T, D] -> [T, D]."""
    spec = cfg.layers[il]
    cos, sin = step.memo("rope", lambda: context_rope(cfg, step.pos, attn_factor=spec.attn_cfg.rope_attn_factor))
    h = rms_norm(x, w.attn_norm, cfg.rms_eps)
    rt.record("attn_norm", il, h)
    form = "absorbed" if isinstance(state.kv, mla.LatentKV) else "naive"
    a = dsa.sparse_mla(h, w, mc=spec.attn_cfg, ic=spec.indexer, il=il, state=state, cos=cos, sin=sin, rt=rt,
                       step=step, form=form)
    x = x + a
    rt.record("ffn_inp", il, x)
    return ffn_sublayer(x, w, cfg=cfg, spec=spec, il=il, rt=rt, dense_scales=True)


def head(x, g, cfg, rt):
    return rms_head(x, g, cfg, rt, where=cfg.name or ARCH)
