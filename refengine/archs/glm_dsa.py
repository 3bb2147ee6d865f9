"""`glm-dsa`: GLM-5 / 5.1 / 5.2 — DeepSeek-V3.2's DSA block with shared indexer layers (GLM-5.2 "IndexShare").

llama.cpp: `src/models/glm-dsa.cpp`, a line-for-line copy of deepseek32.cpp except (diffed):
- `attention.indexer.types` (bool per layer: 1 = full, 0 = shared) decides which layers run their own indexer;
  a shared layer reuses the `top_k` of the most recent full layer (glm-dsa.cpp:243-245, :264-365) and has no
  indexer cache (llama-model.cpp:2431). Without the key: every layer full when context_length < 1048576
  (GLM-5 / 5.1), else GLM-5.2's pattern, layers 0, 1 and every 4th from 2 (glm-dsa.cpp:5-28, :59-66).
  The result is explicit per-layer data (`IndexerConfig.full` / `.source`), never a rule inside a block.
- The indexer rope is NORM (interleaved pairs), still on the first R dims (glm-dsa.cpp:272, :285).
- The indexer key LayerNorm runs with eps = 0: glm-dsa never sets `hparams.f_norm_eps` (deepseek32.cpp:9 sets
  1e-6) and llama_model value-initialises its hparams (llama-model.h:637), so `ggml_norm(x, 0.0f)`. This is
  a llama.cpp quirk reproduced here; the file's `attention.layer_norm_epsilon`, if any, is not read.
- expert_gating_func defaults to sigmoid (glm-dsa.cpp:53-57); rope.scaling.yarn_log_multiplier is not read.
- The indexer tensors are all optional to the loader (glm-dsa.cpp:144-148); a full layer needs them.

One block (Legend: T tokens, D model dim, Dq q-LoRA rank):

    h  = rms_norm(x) * attn_norm                               attn_norm       [T, D]
    qr = rms_norm(h @ Wq_a.T) * q_a_norm                       qr              [T, Dq]
    sel = lightning_indexer(h, qr)      full layer: NORM rope on the first R dims, key LayerNorm eps 0,
                                        ReLU head scores, top-k                              top_k   [T, k]
        | the selection of layer `source`   shared layer (no indexer runs, nothing traced)
    x  = x + mla(h, qr, mask = top-k + causal)      (attention/mla.py, absorbed: llama.cpp has no other path)
    h  = rms_norm(x) * ffn_norm                                ffn_norm
    x  = x + dense_ffn(h)      for il < leading_dense_block_count                            ffn_out
       | x + moe_block(h)      routed (default sigmoid gating) + shared experts              l_out   [T, D]
"""
from __future__ import annotations

from ..attention import dsa, mla
from ..attention.dsa_indexer import indexer_configs, indexer_table
from ..cache import DSAState
from ..config import ROPE_NORM, KeyReader, LayerSpec, ModelConfig, read_common, token_rows
from ..errors import ConfigError
from ..ffn import dense_ffn_table
from ..globals import embed_tokens, load_globals as _load_globals, rms_head
from ..moe.block import ffn_sublayer, GATING, GATING_IDS, deepseek_moe_layers, moe_table
from ..ops import rms_norm
from ..ops.rope import context_rope
from ..weights import load_tensors, norm_table
from .glm_dsa_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "glm-dsa"
ROPE_TYPE = ROPE_NORM
INDEXER_ROPE = ROPE_NORM       # glm-dsa.cpp:272, :285 (deepseek32: NEOX)
INDEXER_K_NORM_EPS = 0.0       # QUIRK: hparams.f_norm_eps is never set for glm-dsa (see the module docstring)
# GLM-5.2's default indexer types (glm-dsa.cpp:5-28, from zai-org/GLM-5.2 config.json "indexer_types"):
# layers 0 and 1 full, then one full layer followed by three shared ones, 78 layers; beyond 78 all shared.
GLM_5_2_DEFAULT_INDEXER_TYPES = (1, 1) + (1, 0, 0, 0) * 19
GLM_5_2_MIN_CONTEXT = 1048576  # context_length below this: GLM-5 / 5.1, every layer full (glm-dsa.cpp:59-63)
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

# Keys that change the math elsewhere but that glm-dsa's loader never reads.
IGNORED_MATH_KEYS = ("attention.layer_norm_epsilon", "rope.scaling.yarn_log_multiplier",
                     "attention.temperature_scale", "attention.temperature_length",
                     "attention.scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
                     "attention.sliding_window", "final_logit_softcapping", "attn_logit_softcapping",
                     "expert_shared_feed_forward_length")


# ---------------------------------------------------------------- config

def indexer_types(r: KeyReader, n_layer: int, n_ctx_train: int) -> list[bool]:
    """Per trunk layer: True where the layer runs its own indexer (glm-dsa.cpp:59-66). The key, scalar or
    one entry per trunk layer, wins; else all full before GLM-5.2 (context_length < 1M), else GLM-5.2's."""
    v = r.per_layer("attention.indexer.types", n_layer)
    if v[0] is not None:
        return [bool(x) for x in v]
    if n_ctx_train < GLM_5_2_MIN_CONTEXT:
        return [True] * n_layer
    return [il < len(GLM_5_2_DEFAULT_INDEXER_TYPES) and bool(GLM_5_2_DEFAULT_INDEXER_TYPES[il]) for il in range(n_layer)]


def config_from_gguf(gf) -> ModelConfig:
    r = KeyReader(gf, ARCH)
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_TYPE, n_vocab=token_rows(gf))
    L = common["n_layer"]
    func = int(r.get("expert_gating_func", 0)) or GATING_IDS["sigmoid"]     # 0 / absent: sigmoid
    if int(func) not in GATING:
        raise ConfigError(f"{gf.path}: {ARCH}.expert_gating_func = {func} is not one of {sorted(GATING)}")
    moes = deepseek_moe_layers(r, common, GATING[int(func)], scales=True, fused_gate_up=False)
    n_ff = r.per_layer("feed_forward_length", L + common["n_layer_nextn"], default=0)[:L]
    mc = mla.mla_config(r, **{**common, "n_layer": L + common["n_layer_nextn"]}, n_head=n_head[0],
                        lite_rule=False, require_mla=True, read_yarn_log_mul=False, mscale_is_log_mul=False,
                        temperature=False)
    ics = indexer_configs(r, n_rot=common["n_rot"], rope_mode=INDEXER_ROPE, k_norm_eps=INDEXER_K_NORM_EPS,
                          full=indexer_types(r, L, common["n_ctx_train"]))
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
    """Per layer a DSAState: the MLA cache of the form (absorbed by default) and, in a full layer, the indexer
    key cache (a shared layer has none)."""
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
