"""`glm5-next`: GLM-5.3-Flash — KDA and nope-only MLA blocks under the k-pool indexer, in mHC streams.

llama.cpp: `src/models/glm5-next.cpp` (keys :7-59, tensors :61-187, graph :549-683, KDA :686-762, the k-pool
indexer :766-919, MLA :923-1013), its cache `src/llama-memory-hybrid-idx.cpp`. One block (Legend: T tokens,
D model dim, n = 4 residual streams):

    X                        [T, n, D]: n copies of the embedding to start           hc_init
    h, post, C = hc_pre(X, hc_attn)         (residual/hyper_connections.py)          hc_attn_pre     [T, D]
    h = rms_norm(h) * attn_norm                                                      attn_norm
    a = kda(h)         head_count_kv[il] == 0 (attention/kda.py: separate q/k/v, low-rank output gate, 1-D ssm_a,
                       the bounded decay with kda.gate_lower_bound, l2 norms at eps 1e-6)          kda_out
      | mla(h)         nope-only MLA (no rope anywhere, the cache holds the latent c only: K = V = c,
                       kq_scale = 1/sqrt(key_length_mla)) attending what the k-pool indexer keeps
                       (attention/kpool_indexer.py; a shared layer, indexer.types 0, reuses the last full
                       layer's selection)                                            attn_out
    X = hc_post(a, X, post, C)                                                       hc_attn_post    [T, n, D]
    h, post, C = hc_pre(X, hc_ffn);  h = rms_norm(h) * ffn_norm                      hc_ffn_pre, ffn_norm
    f = clamped SwiGLU FFN          il < leading_dense_block_count (clamp swiglu_clamp_shexp[il])   ffn_out
      | DeepSeek MoE (moe/hash_routing.py, no hash layers: gating by expert_gating_func, sigmoid when absent,
        exp_probs_b, clamped routed and shared experts)                                            ffn_out
    X = hc_post(f, X, post, C)                                                       l_out           [T, n, D]
    logits = output(rms_norm(mean of the n streams) * output_norm)  (residual/hc_head.py hc_mean)  hc_head

What the config reads, with llama.cpp's defaults: `attention.layer_norm_epsilon` (the indexer key LayerNorm's eps;
absent: 0, the hparams' value-initialised default), `kda.gate_lower_bound` (absent: -inf, the softplus decay),
`rope.dimension_count` (must be 0: build_dsa_layer asserts a nope-only MLA, :935), `attention.indexer.kpool`
(> 1 and dividing `attention.indexer.top_k`, asserted :45), `attention.indexer.kpool_select_tail` (absent: true),
`attention.indexer.types` (absent: every layer full), `swiglu_clamp_exp` / `_shexp` (absent: 0, no clamp; shexp
defaults to exp), `expert_gating_func` (absent or 0: sigmoid), `hyper_connection.count` (must be 4). `output.weight`
is required; the MTP blocks (`nextn_predict_layers`) are not run.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..attention import kda, kpool_indexer, mla
from ..cache import DSAState
from ..config import (BOOL, COUNT, EPS, FLOAT, ConfigWarning, Key, KeyReader, LayerSpec, ModelConfig, read_common,
                      token_rows)
from ..errors import ConfigError
from ..ffn import dense_ffn, dense_ffn_table
from ..globals import embed_tokens
from ..moe import hash_routing
from ..moe.block import GATING_IDS
from ..ops import rms_norm
from ..residual import hc_head, hyper_connections as mhc
from ..weights import load_tensors, norm_table
from . import kimi_family as fam
from .glm5_next_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "glm5-next"
ROPE_TYPE = fam.ROPE_TYPE      # LLAMA_ROPE_TYPE_NONE (llama-model.cpp:3048-3049): nothing is rotated
ATTN_FORMS = fam.ATTN_FORMS    # MLA blocks absorbed (llama.cpp's) / naive; KDA blocks the chunked delta rule
LOCAL_INPUTS = False           # a block's input is the 4 streams, not an l_out: no --local

# Keys glm5-next.cpp reads that config.KEYS does not type (llama.cpp demands these types).
KEYS = {
    "attention.layer_norm_epsilon": EPS, "kda.head_dim": COUNT, "ssm.conv_kernel": COUNT, "kda.gate_lower_bound": FLOAT,
    "attention.indexer.kpool": COUNT, "attention.indexer.kpool_select_tail": BOOL,
    "hyper_connection.count": COUNT, "hyper_connection.sinkhorn_iterations": COUNT, "hyper_connection.epsilon": EPS,
    "swiglu_clamp_exp": Key("float", lo=0, per_layer=True, llama_type="FLOAT32"),
    "swiglu_clamp_shexp": Key("float", lo=0, per_layer=True, llama_type="FLOAT32"),
}

# Keys that change the math elsewhere but that glm5-next's loader never reads.
IGNORED_MATH_KEYS = ("attention.scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
                     "final_logit_softcapping", "attn_logit_softcapping", "expert_group_count",
                     "expert_group_used_count", "rope.scaling.yarn_log_multiplier", "attention.sliding_window",
                     "expert_shared_feed_forward_length", "attention.temperature_scale", "hash_layer_count",
                     "attention.compress_ratios")

# The names glm5-next.cpp:703-761 gives KDA's tensors (kda.POINTS); the delta rule's by build_recurrent_attn's names
# (delta-net-base.cpp). f_a(h), g_a(h) and the gated output are matmul inputs llama.cpp leaves unnamed: refengine
# names them (flip census).
KDA_NAMES = {"q_conv": "kda_q_conv", "k_conv": "kda_k_conv", "v_conv": "kda_v_conv", "f_a": "kda_f_a",
             "g": "kda_g1", "beta": "kda_beta", "scan_out": ("attn_output", "kda_scan_out"), "state": "new_state",
             "g_a": "kda_g_a", "gate_heads": "kda_g2", "normed": "kda_normed", "gated": "kda_gated", "out": "kda_out"}
KDA_TENSORS = dict(fused_qkv=False,             # the graph reads attn_q/k/v (glm5-next.cpp:700-702)
                   ssm_a_shape=lambda H: (H,))  # ssm_a exactly {H} (:115)
MLA_NAMES = {"q_abs": ("q_nope_absorbed_perm", "q_absorbed")}   # glm5-next.cpp:950-953

# refengine.flips: which weights each llama.cpp-named tensor feeds (llama.cpp mode rounds it per weight type)
MATMUL_INPUTS = [
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q.weight", "blk.{il}.attn_k.weight", "blk.{il}.attn_v.weight",
                          "blk.{il}.ssm_f_a.weight", "blk.{il}.ssm_beta.weight", "blk.{il}.ssm_g_a.weight",
                          "blk.{il}.attn_q_a.weight", "blk.{il}.attn_kv_a_mqa.weight",
                          "blk.{il}.indexer.attn_k.weight", "blk.{il}.indexer_compressor_gate.weight",
                          "blk.{il}.indexer.proj.weight"]),
    (r"q_resid-(\d+)", ["blk.{il}.attn_q_b.weight", "blk.{il}.indexer.attn_q_b.weight"]),
    (r"kda_f_a-(\d+)", ["blk.{il}.ssm_f_b.weight"]),
    (r"kda_g_a-(\d+)", ["blk.{il}.ssm_g_b.weight"]),
    (r"kda_gated-(\d+)", ["blk.{il}.attn_output.weight"]),
    (r"kqv-(\d+)", ["blk.{il}.attn_v_b.weight"]),
    (r"kqv_out-(\d+)", ["blk.{il}.attn_output.weight"]),
    (r"ffn_norm-(\d+)", ["blk.{il}.ffn_up.weight", "blk.{il}.ffn_gate.weight", "blk.{il}.ffn_gate_inp.weight",
                         "blk.{il}.ffn_up_exps.weight", "blk.{il}.ffn_up_shexp.weight"]),
    (r"ffn_swiglu_limited-(\d+)", ["blk.{il}.ffn_down.weight", "blk.{il}.ffn_down_shexp.weight"]),
    (r"ffn_swiglu-(\d+)", ["blk.{il}.ffn_down.weight", "blk.{il}.ffn_down_shexp.weight"]),
    (r"ffn_moe_swiglu_limited-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"ffn_moe_swiglu-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"result_norm", ["output.weight"]),
]


@dataclass(frozen=True)
class Glm5NextConfig(ModelConfig):
    hc: mhc.HCConfig | None = None      # hyper_connection.* (and the rms eps of the mixes)
    clamp_dense: tuple = ()             # swiglu_clamp_shexp per layer: the dense blocks' FFN clamp (build_ffn reads it)


@dataclass(frozen=True)
class DSALayer:
    """An MLA block's attention config: its nope-only MLA and its k-pool indexer (full or shared)."""
    mla: mla.MLAConfig
    indexer: kpool_indexer.KPoolConfig


# ---------------------------------------------------------------- config

def _key(r: KeyReader, key: str, default=None, required: bool = False):
    return r.get(key, default, required, kind=KEYS.get(key))


def config_from_gguf(gf) -> Glm5NextConfig:
    r = KeyReader(gf, ARCH)
    path = gf.path
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_TYPE, n_vocab=token_rows(gf))
    L, L_all = common["n_layer"], common["n_layer"] + common["n_layer_nextn"]
    if not r.has("rope.dimension_count") or common["n_rot"] != 0:     # GGML_ASSERT(n_rot() == 0), :935
        got = common["n_rot"] if r.has("rope.dimension_count") else "absent"
        raise ConfigError(f"{path}: {r._k('rope.dimension_count')} must be 0 (glm5-next's MLA is nope-only; llama.cpp "
                          f"asserts \"GLM5-Next MLA is nope-only\"), is {got}")
    kda_blocks = [il for il in range(L) if int(n_head_kv[il]) == 0]
    wide = [il for il in range(L) if il not in kda_blocks and int(n_head_kv[il]) != 1]
    if wide:        # the MLA cache holds head_count_kv[il] latent rows per token
        raise ConfigError(f"{path}: {r._k('attention.head_count_kv')} = {list(n_head_kv)}: MLA block {wide[0]} has "
                          f"{n_head_kv[wide[0]]} KV heads, not the one latent row llama.cpp's MLA cache holds")
    H = int(n_head[0])                    # n_head(): KDA and MLA blocks alike (:567, LLAMA_LOAD_LOCALS)
    eps = common["rms_eps"]

    # KDA (:15-16)
    lb = _key(r, "kda.gate_lower_bound")                                    # absent: -inf, the softplus decay
    kc = kda.KDAConfig(n_head=H, head_dim=int(_key(r, "kda.head_dim", required=True)),
                       d_conv=int(_key(r, "ssm.conv_kernel", required=True)), rms_eps=eps,
                       gate_lower_bound=None if lb is None or not np.isfinite(lb) else float(lb),
                       full_rank_gate=False, l2_eps=1e-6)

    # nope-only MLA (:10-13, :923-940)
    k_mla = int(r.get("attention.key_length_mla", required=True))
    v_mla = int(r.get("attention.value_length_mla", required=True))
    q_lora = int(r.get("attention.q_lora_rank", required=True))
    kv_lora = int(r.get("attention.kv_lora_rank", required=True))
    if k_mla < 1 or v_mla < 1 or q_lora < 1:
        raise ConfigError(f"{path}: key_length_mla = {k_mla}, value_length_mla = {v_mla}, q_lora_rank = {q_lora} "
                          f"must be positive")
    if L > len(kda_blocks) and common["head_dim_k"] != kv_lora:
        raise ConfigError(f"{path}: {r._k('attention.key_length')} = {common['head_dim_k']} must be kv_lora_rank = "
                          f"{kv_lora}: the MLA cache row is the latent alone (no rope part)")
    mc = mla.MLAConfig(n_head=H, q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_nope=k_mla, qk_rope=0, v_head=v_mla,
                       kq_scale=float(np.float32(1.0) / np.sqrt(np.float32(k_mla))), rope_attn_factor=1.0,
                       rms_eps=eps, legacy=False, rope=False)

    # the k-pool indexer (:38-47)
    Hi = int(r.get("attention.indexer.head_count", required=True))
    di = int(r.get("attention.indexer.key_length", required=True))
    top_k = int(r.get("attention.indexer.top_k", required=True))
    kp = int(_key(r, "attention.indexer.kpool", required=True))
    if kp <= 1 or top_k % kp:
        raise ConfigError(f"{path}: {r._k('attention.indexer.kpool')} = {kp} must be > 1 and divide "
                          f"attention.indexer.top_k = {top_k} (llama.cpp asserts indexer_kpool > 1 && "
                          f"indexer_top_k % indexer_kpool == 0)")
    tail = bool(_key(r, "attention.indexer.kpool_select_tail", True))
    if not tail:        # positions 0 .. kpool-2 finish no pool and see no tail: their softmax is over -inf only
        warnings.warn(f"{path}: {r._k('attention.indexer.kpool_select_tail')} = false: the first {kp - 1} positions "
                      f"attend no key, and llama.cpp's softmax over -inf alone gives NaN, which every later position "
                      f"then reads (measured: every logit NaN; refengine computes the same)", ConfigWarning,
                      stacklevel=2)
    k_eps = float(_key(r, "attention.layer_norm_epsilon", 0.0))           # absent: hparams' 0
    types = r.per_layer("attention.indexer.types", L)
    full = [True] * L if types[0] is None else [bool(x) for x in types]
    indexers, last = {}, -1
    for il in range(L):
        if il in kda_blocks:
            continue
        if full[il]:
            last = il
        elif last < 0:     # GGML_ASSERT(prev_sel != nullptr), :962
            raise ConfigError(f"{path}: {r._k('attention.indexer.types')}: MLA block {il} shares the indexer but no "
                              f"earlier MLA block runs one (llama.cpp asserts \"shared indexer layer must follow a "
                              f"full indexer layer\")")
        indexers[il] = kpool_indexer.KPoolConfig(n_head=Hi, head_dim=di, top_k=top_k, kpool=kp, select_tail=tail,
                                                 k_norm_eps=k_eps, full=full[il], source=last)

    # mHC (:50-53)
    n_hc = int(_key(r, "hyper_connection.count", required=True))
    if n_hc != 4:
        raise ConfigError(f"{path}: {r._k('hyper_connection.count')} = {n_hc}: llama.cpp's graph needs 4 streams "
                          f"(\"mHC with hc_mult != 4 is not supported\")")
    hc = mhc.HCConfig(n=n_hc, iters=int(_key(r, "hyper_connection.sinkhorn_iterations", required=True)),
                      eps=float(_key(r, "hyper_connection.epsilon", required=True)), norm_eps=eps)

    # FFN / MoE (:25-36)
    E = common["n_expert"]
    n_dense = int(r.get("leading_dense_block_count", 0))
    n_ff = r.layer0("feed_forward_length", r.per_layer("feed_forward_length", L_all, default=0)[:L])
    n_ff_exp = r.per_layer("expert_feed_forward_length", L_all, required=True)[:L]          # n_ff_exp(i), per layer
    n_used = r.per_layer("expert_used_count", L_all, default=0)[:L]
    n_used = int(r.expert_used(n_used, range(n_dense, L) if E else ())) if L > n_dense else 0
    n_shared = int(r.get("expert_shared_count", required=True))
    gating = int(r.get("expert_gating_func", 0)) or GATING_IDS["sigmoid"]
    if L > n_dense and E == 0:
        raise ConfigError(f"{path}: {r._k('expert_count')} must be > 0: blocks {n_dense}..{L - 1} are MoE")
    clamp = r.per_layer("swiglu_clamp_exp", L_all, default=0.0, kind=KEYS["swiglu_clamp_exp"])
    clamp_s = (r.per_layer("swiglu_clamp_shexp", L_all, kind=KEYS["swiglu_clamp_shexp"])
               if r.has("swiglu_clamp_shexp") else clamp)
    norm_w = bool(r.get("expert_weights_norm", False))
    w_scale = float(r.get("expert_weights_scale", 0.0))

    layers = []
    for il in range(L):
        dense = il < n_dense
        moe = None if dense else hash_routing.HashMoEConfig(
            n_expert=E, n_expert_used=n_used, n_ff_exp=int(n_ff_exp[il]), n_ff_shexp=int(n_ff_exp[il]) * n_shared,
            norm_w=norm_w, w_scale=w_scale, hash_ids=False, clamp_exp=float(clamp[il]),
            clamp_shexp=float(clamp_s[il]), gating=gating)
        recurrent = il in kda_blocks
        layers.append(LayerSpec(attn="kda" if recurrent else "dsa", ffn="dense" if dense else "moe", n_head=H,
                                n_head_kv=int(n_head_kv[il]), n_ff=int(n_ff[il] or 0),
                                n_ff_exp=0 if dense else int(n_ff_exp[il]), n_expert_used=0 if dense else n_used,
                                attn_cfg=kc if recurrent else DSALayer(mla=mc, indexer=indexers[il]), moe=moe))
    ignored = r.warn_ignored(list(IGNORED_MATH_KEYS))
    return Glm5NextConfig(**common, layers=tuple(layers), ignored_keys=ignored, hc=hc,
                          clamp_dense=tuple(float(c) for c in clamp_s[:L]))


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg):
    """token_embd, output_norm, output (required: glm5-next.cpp:74-77)."""
    return fam.load_globals(gf, cfg, ARCH)


def load_layer(gf, cfg, il: int):
    spec = cfg.layers[il]
    n = cfg.hc.n
    table = (norm_table(il, "attn_norm", "ffn_norm")
             + mhc.hc_table(f"blk.{il}.hc_attn", "hc_attn", n) + mhc.hc_table(f"blk.{il}.hc_ffn", "hc_ffn", n))
    if spec.attn == "kda":
        table += kda.kda_table(gf, il, spec.attn_cfg, **KDA_TENSORS)
    else:
        dc = spec.attn_cfg
        # attn_output.scale: loaded by the generic pass, never applied (glm5-next.cpp:1009 multiplies by wo alone)
        table += (mla.mla_table(il, dc.mla, apply_output_scale=False)
                  + kpool_indexer.table(il, dc.indexer, q_lora_rank=dc.mla.q_lora_rank))
    if spec.ffn == "dense":
        table += dense_ffn_table(il, lambda c, s: s.n_ff)        # .scale loaded, not applied (build_ffn gets NULL)
    else:
        table += hash_routing.table(il, spec.moe)
    return load_tensors(gf, table, cfg, spec, il)


def new_state(cfg, attn_form: str | None = None) -> list:
    """Per layer: KDA's RecurrentState, or the MLA cache of the form asked (llama.cpp's by default) with, where the
    layer runs its indexer, the k-pool indexer's `KPoolKeys`. attn_form (ATTN_FORMS): an MLA form for the MLA
    blocks, or "chunked" for the KDA blocks' delta rule."""
    kda_form = "chunked" if attn_form == "chunked" else "recurrent"
    mla_form = attn_form if attn_form in mla.FORMS else None
    return [kda.new_state(s.attn_cfg, kda_form) if s.attn == "kda"
            else DSAState(kv=mla.new_state(s.attn_cfg.mla, mla_form), index=kpool_indexer.new_state(s.attn_cfg.indexer))
            for s in cfg.layers]


# ---------------------------------------------------------------- forward

def embed(g, cfg, step, rt):
    """The n residual streams, each the token embedding: [T, n, D]."""
    x = embed_tokens(g, step.tokens, rt)                                  # [T, D]
    rt.record("inp_embd", -1, x)                                          # glm5-next.cpp:555
    X = mhc.expand(x, cfg.hc.n)
    rt.record("hc_init", -1, X)
    return X


def block(X, w, *, cfg, il, state, step, rt):
    """X [T, n, D] -> [T, n, D]."""
    spec = cfg.layers[il]

    def attention(h):
        if spec.attn == "kda":
            return kda.kda_layer(h, w, kc=spec.attn_cfg, il=il, state=state, rt=rt, names=KDA_NAMES)
        a = kpool_indexer.sparse_mla(h, w, mc=spec.attn_cfg.mla, kc=spec.attn_cfg.indexer, il=il, state=state,
                                     rt=rt, step=step, names=MLA_NAMES)
        rt.record("attn_out", il, a)
        return a

    def ffn(h):
        if spec.ffn == "dense":
            f = dense_ffn(h, w, il=il, rt=rt, scales=False, glu=hash_routing.clamped_act(cfg.clamp_dense[il],
                                                                                        "ffn_swiglu"))
            rt.record("ffn_out", il, f)
            return f
        return hash_routing.hash_moe(h, w, mc=spec.moe, tokens=tokens, il=il, rt=rt)

    sub = dict(hc=cfg.hc, eps=cfg.rms_eps, rt=rt, il=il)
    X = mhc.sublayer(X, w, "attn", attention, out_name="hc_attn_post", **sub)
    X, tokens = step.out_rows(il, cfg.n_layer, (X, step.tokens))         # the output rows (llama.cpp inp_out_ids)
    return mhc.sublayer(X, w, "ffn", ffn, out_name="l_out", **sub)


def head(X, g, cfg, rt):
    h = hc_head.hc_mean(X, rt)                                               # [T, D]
    h = rms_norm(h, g.output_norm, cfg.rms_eps)
    rt.record("result_norm", -1, h)
    logits = rt.matmul(h, g.output)                                         # [T, V]
    rt.record("result_output", -1, logits)
    rt.warn_nonfinite(logits, f"{cfg.name or ARCH}: logits contain NaN/inf")    # (a device's: read after the step)
    return logits
