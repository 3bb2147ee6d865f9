"""`qwen4exp`: Qwen3.8-Flash-Next — gated DeltaNet and QSA attention over gated residual streams, hashed n-gram
embeddings on one layer, high-sparsity MoE.

llama.cpp: `src/models/qwen4exp.cpp` (keys :29-151, tensors :153-262, graph :356-461; its header says the graph
awaits a reimplementation: the authors' code, transformers 5.23 `qwen4_exp`, is the second reference, and where
the two differ, in QSA's selection, both are here: `Runtime.qsa_rule`). Legend: T tokens, D model dim, P streams.

    R = P copies of token_embd[tokens]                                hc_init          [T, P, D]
    per block il:
      R = R + ple(R, ngram_embd(tokens))   on the PLE layer only      (embed/ngram.py)  ple_conv_out
      h, inj = mix(R, hc_attn_*)                                      (residual/gated_streams.py)  hc_mixed
      a = gated_deltanet(h)   linear blocks: conv, delta rule, value head h reads key head h % Hk, separate
                              ssm_beta / ssm_alpha, sigmoid output gate (attention/gated_deltanet.py)
        | qsa_attention(h)    full blocks: gated attention (attn_q = [q | gate] per head, q/k norms, IMROPE)
                              under the QSA indexer's selection (attention/qsa.py, `compress_ratios[il] > 0`)
      R = R + 2 sigmoid(inj / P) * a per stream                       hc_combine
      h, inj = mix(R, hc_ffn_*);  R = R + ... * moe(h)                softmax top-k, renormalized, gated shared expert
                                                                      ffn_out, l_last
    logits = mix(R, output_hc_*) @ output.T     the final mixer is the output norm   result_norm, result_output

Layer kinds as data: `attention.recurrent_layers`, else every `full_attention_interval`-th block is full
attention; `ple.layers` names the n-gram layer (one, a linear block). IMROPE with text positions is NEOX on the
n_rot dims, except pairs whose section is the 4th, which sit at position 0 (ops/rope.py `mrope_text_pairs`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..attention import gated_deltanet as gdn
from ..attention import gqa, qsa
from ..config import (COUNT, COUNT0, LLAMA_IGNORED_MATH_KEYS, ROPE_NEOX, Key, KeyReader, LayerSpec, ModelConfig,
                      check_experts, check_gqa, read_common, token_rows)
from ..embed import ngram
from ..errors import ConfigError, ShapeError
from ..globals import embed_tokens
from ..moe.block import MoEConfig, MoETensors, moe_block, moe_table
from ..ops import apply_rope
from ..ops.rope import context_rope, mrope_text, mrope_text_pairs
from ..residual import gated_streams as gs
from ..weights import W, load_tensors
from .llama_family import check_kv_dims, qwen_moe_sizes
from .qwen4exp_synth import PRESETS, synth_metadata, synth_plan  # noqa: F401  (refengine.synth)

ARCH = "qwen4exp"
ATTN_FORMS = gdn.FORMS      # the delta rule token by token (llama.cpp's fused kernel, the default) or chunked
LOCAL_INPUTS = False        # llama.cpp names the block output l_last (no l_out) and the n-gram layer reads its state

# llama.cpp names both mixers of a block hc_norm-IL / hc_mixed-IL: the attention side's is the earlier recording
# (`#0`), the FFN side's the last; the mixers' low-rank silu (hc_*_up's input) is unnamed
MATMUL_INPUTS = [
    (r"hc_norm-(\d+)", ["blk.{il}.hc_attn_down.weight", "blk.{il}.hc_attn_inject.weight"], 0),
    (r"hc_norm-(\d+)", ["blk.{il}.hc_ffn_down.weight", "blk.{il}.hc_ffn_inject.weight"]),
    (r"hc_mixed-(\d+)", ["blk.{il}.attn_q.weight", "blk.{il}.attn_k.weight", "blk.{il}.attn_v.weight",
                         "blk.{il}.indexer.q_proj.weight", "blk.{il}.indexer.k_proj.weight",
                         "blk.{il}.attn_qkv.weight", "blk.{il}.attn_gate.weight", "blk.{il}.ssm_beta.weight",
                         "blk.{il}.ssm_alpha.weight"], 0),
    (r"hc_mixed-(\d+)", ["blk.{il}.ffn_up_exps.weight", "blk.{il}.ffn_gate_up_exps.weight",
                         "blk.{il}.ffn_gate_inp.weight", "blk.{il}.ffn_up_shexp.weight",
                         "blk.{il}.ffn_gate_inp_shexp.weight"]),
    (r"attn_gated-(\d+)", ["blk.{il}.attn_output.weight"]),
    (r"final_output-(\d+)", ["blk.{il}.ssm_out.weight"]),
    (r"ffn_swiglu-(\d+)", ["blk.{il}.ffn_down_shexp.weight"]),
    (r"ffn_moe_swiglu-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"hc_norm", ["output_hc_down.weight"]),
    (r"result_norm", ["output.weight", "token_embd.weight"]),
]

IGNORED_MATH_KEYS = tuple(k for k in LLAMA_IGNORED_MATH_KEYS if k != "expert_shared_feed_forward_length")
MOE_TENSORS = MoETensors(fused_gate_up=True)         # create_tensor_gate_up_exps (qwen4exp.cpp:254)
RECURRENT_LAYERS = Key("number", lo=0, hi=1, per_layer=True)
ARRAY = Key("number", per_layer=True)                # an array read whole (its length checked here)


@dataclass(frozen=True)
class Q4Config(ModelConfig):
    hc: int = 2                          # hyper_connection.count (P > 1)
    hc_lr: int = 1                       # hyper_connection.low_rank (Lr)
    rope_sections: tuple = (0, 0, 0, 0)  # rope.dimension_sections (IMROPE)
    ngram: ngram.NGramConfig | None = None   # the ple.* keys (None: no n-gram layer)


# ---------------------------------------------------------------- config

def _array(r: KeyReader, key: str, n_min: int, *, required: bool = True) -> list[int]:
    """An integer array key of at least n_min entries (`get_arr`; qwen4exp_require_arr_len, qwen4exp.cpp:20-27)."""
    v = r.get(key, None, required, kind=ARRAY)
    if v is None:
        return []
    vals = [int(x) for x in (v if hasattr(v, "__len__") and not isinstance(v, str) else [v])]
    if len(vals) < n_min:
        raise ConfigError(f"{r.gf.path}: {r._k(key)} has {len(vals)} entries, but at least {n_min} are required")
    return vals


def layer_kinds(r: KeyReader, n_layer: int, n_layer_all: int) -> list[bool]:
    """True = gated DeltaNet (qwen4exp.cpp:128-136): `attention.recurrent_layers`, else block i is full attention
    iff (i + 1) % full_attention_interval == 0 (default 4, must be > 0)."""
    arr = r.per_layer("attention.recurrent_layers", n_layer_all, kind=RECURRENT_LAYERS)
    if arr[0] is not None:
        return [bool(v) for v in arr[:n_layer]]
    k = int(r.get("full_attention_interval", 4, kind=COUNT))
    return [(i + 1) % k != 0 for i in range(n_layer)]


def ngram_config(r: KeyReader, n_layer_all: int, linear: list[bool]) -> ngram.NGramConfig | None:
    """The ple.* keys (qwen4exp.cpp:70-126): absent `ple.layers` = no n-gram layer."""
    path = r.gf.path
    layers = _array(r, "ple.layers", 0, required=False)
    if not layers:
        return None
    if len(layers) != 1:
        raise ConfigError(f"{path}: {r._k('ple.layers')} lists {len(layers)} layers, but only one PLE layer is "
                          f"supported (llama.cpp holds one set of hash constants)")
    il = layers[0]
    if not 0 <= il < n_layer_all or not (il < len(linear) and linear[il]):
        raise ConfigError(f"{path}: PLE layer {il} is out of range or not a linear attention layer")
    n = int(r.get("ple.ngram_size", required=True, kind=COUNT))
    g = int(r.get("ple.heads_per_ngram", required=True, kind=COUNT))
    if not 2 <= n <= 8 or not 0 < (n - 1) * g <= 64:
        raise ConfigError(f"{path}: PLE n-gram size {n} (2..8) or head count {(n - 1) * g} (1..64) is out of range")
    kc = int(r.get("ple.conv_kernel", required=True, kind=COUNT))
    eos = int(r.get("ple.eos_token_id", required=True, kind=COUNT0))
    hd = int(r.get("embedding_length_per_layer_input", required=True, kind=COUNT))
    mult = _array(r, "ple.layer_multipliers", n)
    offs = _array(r, "ple.head_offsets", (n - 1) * g)[:(n - 1) * g]
    sizes = _array(r, "ple.head_vocab_sizes", (n - 1) * g)[:(n - 1) * g]
    for h, (o, v) in enumerate(zip(offs, sizes)):
        if v == 0 or o + v > 2**31 - 1:
            raise ConfigError(f"{path}: PLE head {h} range does not fit the int32 row index")
    return ngram.NGramConfig(layer=il, n=n, heads_per_ngram=g, conv_kernel=kc, eos=eos, head_dim=hd,
                             multipliers=tuple(mult[:n]), offsets=tuple(offs), vocab_sizes=tuple(sizes))


def config_from_gguf(gf) -> Q4Config:
    r = KeyReader(gf, ARCH)
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_NEOX, n_vocab=token_rows(gf))
    L = common["n_layer"]
    L_all = L + common["n_layer_nextn"]
    check_kv_dims(gf, ARCH, common)
    sections = _array(r, "rope.dimension_sections", 4)[:4]
    _, n_used, n_ff_exp = qwen_moe_sizes(r, L, L_all)
    E = common["n_expert"]
    check_experts(gf, ARCH, E, n_used, required=True)
    used = r.expert_used(n_used, range(L))
    n_ff = int(r.layer0("feed_forward_length", r.per_layer("feed_forward_length", L_all, default=0)[:L])[0] or 0)
    n_ff_shexp = int(r.get("expert_shared_feed_forward_length", 0)) or n_ff
    gc = replace(gdn.gdn_config(r, gf.path), head_map="tiled", out_gate="sigmoid", ba="split",
                 conv_trace="build_conv_state_at", apply_scales=True)
    P = int(r.get("hyper_connection.count", required=True, kind=COUNT))
    if P <= 1:
        raise ConfigError(f"{gf.path}: {r._k('hyper_connection.count')} must be greater than one, got {P}")
    lr = int(r.get("hyper_connection.low_rank", required=True, kind=COUNT))
    n_idx = int(r.get("attention.indexer.head_count", required=True))
    d_idx = int(r.get("attention.indexer.key_length", required=True))
    top_k = int(r.get("attention.indexer.top_k", required=True))
    ratios = [int(v or 0) for v in r.per_layer("attention.compress_ratios", L_all, default=0)]
    linear = layer_kinds(r, L, L_all)
    nc = ngram_config(r, L_all, linear)
    if nc is not None and nc.n_heads * nc.head_dim != common["n_embd"]:
        raise ConfigError(f"{gf.path}: the n-gram embedding is {nc.n_heads} heads x {nc.head_dim}, not "
                          f"embedding_length = {common['n_embd']} (ple_key / ple_value read D columns)")
    layers = []
    for il in range(L):
        moe = MoEConfig(n_expert=E, n_expert_used=used, n_ff_exp=n_ff_exp[il], n_groups=common["n_expert_groups"],
                        n_group_used=common["n_group_used"], n_shared=1, n_ff_shexp=n_ff_shexp, shexp_gate=True)
        if linear[il]:
            kind, acfg = "gdn", gc
        else:
            check_gqa(gf, il, n_head[0], n_head_kv[0])
            if ratios[il] > 64:
                raise ConfigError(f"{gf.path}: compress ratio {ratios[il]} of layer {il} is over 64 (llama.cpp "
                                  f"asserts r <= 64)")
            kind = "qsa" if ratios[il] > 0 else "mha"
            acfg = qsa.QSAConfig(n_head=n_idx, head_dim=d_idx, top_k=top_k, ratio=ratios[il])
        layers.append(LayerSpec(attn=kind, ffn="moe", n_head=int(n_head[0]), n_head_kv=int(n_head_kv[0]), n_ff=n_ff,
                                n_ff_exp=n_ff_exp[il], n_expert_used=used, attn_cfg=acfg, moe=moe))
    ignored = r.warn_ignored(list(IGNORED_MATH_KEYS))
    return Q4Config(**common, layers=tuple(layers), ignored_keys=ignored, hc=P, hc_lr=lr,
                    rope_sections=tuple(sections), ngram=nc)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg: Q4Config):
    """token_embd, the output mixer (no output_norm: qwen4exp.cpp:165-170), output (tied fallback) and the n-gram
    table, which stays an mmapped view (TENSOR_READ_LAZY)."""
    t = [W("token_embd", "token_embd.weight", lambda c, s: (c.n_vocab, c.n_embd)),
         W("output", "output.weight", lambda c, s: (c.n_vocab, c.n_embd), required=False)]
    t += gs.streams_table("output_hc", cfg.hc, cfg.hc_lr, inject=False)
    if cfg.ngram is not None:
        t += ngram.global_table(cfg.ngram)
    g = load_tensors(gf, t, cfg)
    if g.output is None:
        g.output = g.token_embd
    nc = cfg.ngram
    if nc is not None:
        tab = g.per_layer_token_embd
        if hasattr(gf, "advise_random"):
            gf.advise_random("per_layer_token_embd.weight")      # rows read a few at a time, scattered
        if len(tab.shape) != 2 or tab.shape[1] != nc.head_dim or tab.shape[0] < nc.rows:
            raise ShapeError(f"{gf.path}: per_layer_token_embd.weight has shape {list(tab.shape)}; the PLE head "
                             f"ranges need at least [{nc.rows}, {nc.head_dim}] (qwen4exp.cpp:174-193)")
    return g


def load_layer(gf, cfg: Q4Config, il: int):
    spec = cfg.layers[il]
    t = gs.streams_table(f"blk.{il}.hc_attn", cfg.hc, cfg.hc_lr) + gs.streams_table(f"blk.{il}.hc_ffn", cfg.hc,
                                                                                        cfg.hc_lr)
    if spec.attn == "gdn":
        t += gdn.gdn_table(gf, il, spec.attn_cfg)
    else:
        t += gqa.gqa_table(gf, il, out_bias=False, qk_norm=True, q_gate=True) + qsa.qsa_table(il, spec.attn_cfg)
    if cfg.ngram is not None and il == cfg.ngram.layer:
        t += ngram.ple_table(il, cfg.hc, cfg.ngram)
    t += moe_table(gf, il, spec.moe, MOE_TENSORS)
    return load_tensors(gf, t, cfg, spec, il)


def new_state(cfg: Q4Config, attn_form: str | None = None) -> list:
    """Per block: a GDNState (its delta-rule form), a QSAState (KV cache + raw indexer keys) or a KVCache; the
    n-gram layer's wrapped with its NGramState."""
    out = []
    for il, spec in enumerate(cfg.layers):
        st = (gdn.new_state(attn_form or "recurrent") if spec.attn == "gdn" else
              qsa.new_state() if spec.attn == "qsa" else gqa.new_state())
        out.append(ngram.new_state(st) if cfg.ngram is not None and il == cfg.ngram.layer else st)
    return out


# ---------------------------------------------------------------- forward

def rope_for(cfg: Q4Config, g, pos, n_ctx):
    """cos, sin [T, n_rot/2] of text positions under IMROPE: NEOX, the 4th section's pairs at position 0."""
    cos, sin = context_rope(cfg, pos)
    c0, s0 = context_rope(cfg, np.zeros_like(pos, shape=(1,)))           # the e pairs: position 0 (where pos lives)
    return mrope_text(cos, sin, mrope_text_pairs(cfg.rope_sections, cfg.n_rot), c0[0], s0[0])


def embed(g, cfg: Q4Config, step, rt):
    x = embed_tokens(g, step.tokens, rt)                                 # [T, D]
    rt.record("model.input_embed", -1, x)
    R = gs.init_streams(x, cfg.hc)                                       # [T, P, D]
    rt.record("hc_init", -1, R)
    return R


def _attention(h, w, *, cfg, spec, il, state, step, rt):
    """The full-attention sublayer: gated attention, under the QSA selection when the layer has a block size."""
    cos, sin = step.memo("rope", lambda: rope_for(cfg, step.g, step.pos, step.n_ctx))       # [T, R/2]
    sel, kv = None, state
    if spec.attn == "qsa":
        def rope_blocks(x, bpos):                 # a block key at its start for all four sections (qwen4exp.cpp:595)
            c, s = context_rope(cfg, bpos)
            return apply_rope(x, c, s, cfg.n_rot, ROPE_NEOX)
        sel = qsa.indexer(h, w, spec.attn_cfg, state=state, pos=step.pos,
                          rope_q=lambda x: apply_rope(x, cos, sin, cfg.n_rot, ROPE_NEOX), rope_blocks=rope_blocks,
                          eps=cfg.rms_eps, rule=rt.qsa_rule, rt=rt, il=il)
        kv = state.kv
    a = gqa.self_attention(h, w, cfg=cfg, spec=spec, il=il, state=kv, step=step, cos=cos, sin=sin, rt=rt,
                           out_gate=True, sparse=sel, view_names=("Qcur_reshaped", "gate_reshaped"),
                           qkv_bias=False)   # create_tensor_qkv loads attn_q/k/v.bias; the graph never adds them
    rt.record("attn_output", il, a)
    return a


def block(R, w, *, cfg: Q4Config, il, state, step, rt):
    """R [T, P, D] -> [T, P, D]; state: this layer's container (WithNGram on the n-gram layer)."""
    spec, eps = cfg.layers[il], cfg.rms_eps
    nc = cfg.ngram
    if nc is not None and il == nc.layer:
        emb = ngram.embed(step.tokens, state.ngram, step.g.per_layer_token_embd, nc, rt)   # [T, D]
        R = ngram.ple_block(R, emb, w, nc, state.ngram, eps=eps, rt=rt, il=il)
        state = state.attn
    h, inj = gs.mix(R, w.hc_attn_norm, w.hc_attn_down, w.hc_attn_up, w.hc_attn_inject, eps=eps, rt=rt, il=il)
    if spec.attn == "gdn":
        a = gdn.gated_deltanet(h, w, gc=spec.attn_cfg, eps=eps, il=il, state=state, rt=rt)
    else:
        a = _attention(h, w, cfg=cfg, spec=spec, il=il, state=state, step=step, rt=rt)
    R = gs.combine(R, a, inj)
    rt.record("hc_combine", il, R)
    R = step.out_rows(il, cfg.n_layer, R)                                # the output rows (llama.cpp inp_out_ids)
    h, inj = gs.mix(R, w.hc_ffn_norm, w.hc_ffn_down, w.hc_ffn_up, w.hc_ffn_inject, eps=eps, rt=rt, il=il)
    f = moe_block(h, w, mc=spec.moe, tensors=MOE_TENSORS, spec=spec, il=il, rt=rt)
    rt.record("ffn_out", il, f)
    R = gs.combine(R, f, inj)
    rt.record("l_last", il, R)                   # llama.cpp: hc_combine renamed l_last (the first keeps hc_combine)
    return R


def head(R, g, cfg: Q4Config, rt):
    """The output mixer (the final norm) and the output matrix: R [T, P, D] -> logits [T, V]."""
    x, _ = gs.mix(R, g.output_hc_norm, g.output_hc_down, g.output_hc_up, None, eps=cfg.rms_eps, rt=rt, il=-1)
    rt.record("result_norm", -1, x)
    logits = rt.matmul(x, g.output)                                      # [T, V]
    rt.record("result_output", -1, logits)
    return logits
