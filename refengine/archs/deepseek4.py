"""`deepseek4`: DeepSeek-V4 / V4-Flash — hyper-connection streams, compressed-KV attention, hash-routed MoE.

llama.cpp: `src/models/deepseek4.cpp` (keys :19-80, tensors :82-182, graph :1222-1360), its cache
`src/llama-kv-cache-dsv4.cpp`. One block (Legend: T tokens, D model dim, n = 4 residual streams):

    X                        [T, n, D]: n copies of the embedding to start          hc_init
    h, post, C = hc_pre(X, hc_attn)         (residual/hyper_connections.py)         hc_attn_pre     [T, D]
    X = hc_post(attention(rms_norm(h) * attn_norm), X, post, C)                     hc_attn_post    [T, n, D]
        attention by the layer's compression ratio (attention/compressed_kv.py): 0 the raw window only,
        4 the window + the blocks the lightning indexer keeps (CSA), 128 the window + every pooled block (HCA)
    h, post, C = hc_pre(X, hc_ffn)                                                  hc_ffn_pre
    X = hc_post(moe(rms_norm(h) * ffn_norm), X, post, C)   (moe/hash_routing.py)    l_last          [T, n, D]
    logits = output(rms_norm(hc_head(X)) * output_norm)    (residual/hc_head.py)    hc_head, result_output

The rope of a layer is its ratio's (attention/rope_tail.py): compressed layers YaRN with
`attention.compress_rope_freq_base`, ratio-0 layers plain `rope.freq_base`. Every layer is a MoE layer; the first
`hash_layer_count` route by token id. What the config reads, where llama.cpp's loader differs from the DeepSeek
family's (archs/deepseek_family.py: this arch shares its MoE key reading and RoPE type, NORM):
`expert_weights_scale`, `expert_weights_norm`, `swiglu_clamp_exp` and `expert_gating_func` (= 4, sqrt-softplus)
are required, no leading dense blocks, `output.weight` required (never tied), the MTP blocks
(`nextn_predict_layers`) are not run.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..attention import compressed_kv as ckv
from ..attention.rope_tail import layer_rope
from ..config import COUNT, COUNT0, EPS, POSITIVE, Key, KeyReader, LayerSpec, ModelConfig, read_common, token_rows
from ..errors import ConfigError
from ..globals import embed_tokens
from ..moe import hash_routing
from ..moe.router import GATING_SQRT_SOFTPLUS
from ..ops import rms_norm
from ..residual import hc_head, hyper_connections as mhc
from ..weights import W, load_tensors, norm_table
from .deepseek_family import ROPE_TYPE
from .deepseek4_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "deepseek4"
LOCAL_INPUTS = False           # a block's input is the 4 streams (llama.cpp's l_last), not an l_out: no --local

# Keys deepseek4.cpp reads that no other arch of this engine reads (typed here; llama.cpp demands these types).
KEYS = {
    "attention.sliding_window": COUNT, "attention.output_group_count": COUNT, "attention.output_lora_rank": COUNT,
    "attention.compress_rope_freq_base": POSITIVE, "hyper_connection.count": COUNT,
    "hyper_connection.sinkhorn_iterations": COUNT, "hyper_connection.epsilon": EPS, "hash_layer_count": COUNT0,
    "swiglu_clamp_exp": Key("float", lo=0, per_layer=True, llama_type="FLOAT32"),
    "swiglu_clamp_shexp": Key("float", lo=0, per_layer=True, llama_type="FLOAT32"),
    "attention.compress_ratios": Key("int", lo=0, per_layer=True, llama_type="UINT32"),
}

# Keys that change the math elsewhere but that deepseek4's loader never reads.
IGNORED_MATH_KEYS = ("attention.scale", "attention.clamp_kqv", "logit_scale", "embedding_scale", "residual_scale",
                     "final_logit_softcapping", "attn_logit_softcapping", "leading_dense_block_count",
                     "expert_group_count", "expert_group_used_count", "attention.kv_lora_rank",
                     "attention.indexer.types", "expert_shared_feed_forward_length", "rope.scaling.yarn_log_multiplier")

# refengine.flips: which weights each llama.cpp-named tensor feeds (llama.cpp mode rounds it per weight type)
MATMUL_INPUTS = [
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q_a.weight", "blk.{il}.attn_kv.weight", "blk.{il}.attn_compressor_kv.weight",
                          "blk.{il}.attn_compressor_gate.weight", "blk.{il}.indexer_compressor_kv.weight",
                          "blk.{il}.indexer_compressor_gate.weight", "blk.{il}.indexer.proj.weight"]),
    (r"qr_norm-(\d+)", ["blk.{il}.attn_q_b.weight", "blk.{il}.indexer.attn_q_b.weight"]),
    (r"attn_derope-(\d+)", ["blk.{il}.attn_output_a.weight"]),
    (r"attn_wo_a-(\d+)", ["blk.{il}.attn_output_b.weight"]),
    (r"ffn_norm-(\d+)", ["blk.{il}.ffn_up_exps.weight", "blk.{il}.ffn_gate_inp.weight",
                         "blk.{il}.ffn_up_shexp.weight"]),
    (r"ffn_swiglu_limited-(\d+)", ["blk.{il}.ffn_down_shexp.weight"]),
    (r"ffn_moe_swiglu_limited-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"result_norm", ["output.weight"]),
]


@dataclass(frozen=True)
class DSV4Config(ModelConfig):
    hc: mhc.HCConfig | None = None      # hyper_connection.* (and the rms eps of the mixes)


# ---------------------------------------------------------------- config

def _key(r: KeyReader, key: str, default=None, required: bool = False):
    return r.get(key, default, required, kind=KEYS.get(key))


def config_from_gguf(gf) -> DSV4Config:
    r = KeyReader(gf, ARCH)
    n_vocab = token_rows(gf)
    common, n_head, _ = read_common(r, rope_type=ROPE_TYPE, n_vocab=n_vocab)
    L, L_all = common["n_layer"], common["n_layer"] + common["n_layer_nextn"]
    path = gf.path

    func = int(r.get("expert_gating_func", required=True))
    if func != GATING_SQRT_SOFTPLUS:       # deepseek4.cpp:63-66 throws
        raise ConfigError(f"{path}: {r._k('expert_gating_func')} = {func}: llama.cpp's deepseek4 loader expects "
                          f"sqrtsoftplus MoE scoring ({GATING_SQRT_SOFTPLUS})")
    n_hc = int(_key(r, "hyper_connection.count", required=True))
    if n_hc != 4:                          # build_hc_pre asserts hc == 4 (deepseek4.cpp:349)
        raise ConfigError(f"{path}: {r._k('hyper_connection.count')} = {n_hc}: llama.cpp's graph needs 4 streams")
    hc = mhc.HCConfig(n=n_hc, iters=int(_key(r, "hyper_connection.sinkhorn_iterations", required=True)),
                      eps=float(_key(r, "hyper_connection.epsilon", required=True)), norm_eps=common["rms_eps"])

    ratios = _key(r, "attention.compress_ratios", required=True)
    if not hasattr(ratios, "__len__") or len(ratios) < L_all:
        raise ConfigError(f"{path}: {r._k('attention.compress_ratios')} must have an entry per block (>= {L_all}); "
                          f"llama.cpp: \"DeepSeek-V4 compress_ratios is shorter than block_count\"")
    ratios = [int(x) for x in list(ratios)[:L]]
    bad = [x for x in ratios if x not in ckv.RATIOS]
    if bad:
        raise ConfigError(f"{path}: {r._k('attention.compress_ratios')} has {bad[0]}; llama.cpp: \"DeepSeek-V4 loader "
                          f"only supports compression ratios 0, 4, and 128\"")
    head_dim = common["head_dim_k"]
    if common["head_dim_v"] != head_dim or not 0 < common["n_rot"] <= head_dim:
        raise ConfigError(f"{path}: deepseek4 needs key_length == value_length >= rope.dimension_count, got "
                          f"{head_dim}, {common['head_dim_v']}, {common['n_rot']}")
    H = int(r.layer0("attention.head_count", n_head)[0])
    G = int(_key(r, "attention.output_group_count", required=True))
    if H % G:
        raise ConfigError(f"{path}: {H} heads do not split into {G} output groups (llama.cpp asserts n_head % G == 0)")
    cbase = float(_key(r, "attention.compress_rope_freq_base", required=True))
    idx = dict(idx_heads=int(r.get("attention.indexer.head_count", required=True)),
               idx_dim=int(r.get("attention.indexer.key_length", required=True)),
               idx_top_k=int(r.get("attention.indexer.top_k", required=True)))
    di = idx["idx_dim"]
    if 4 in ratios and (di & (di - 1) or di < 64 or di < common["n_rot"]):
        raise ConfigError(f"{path}: attention.indexer.key_length = {idx['idx_dim']}: llama.cpp's indexer cache rotates "
                          f"by a Hadamard matrix, which it builds for powers of 2 >= 64 only")
    attn = dict(n_head=H, head_dim=head_dim, q_lora=int(r.get("attention.q_lora_rank", required=True)),
                n_swa=int(_key(r, "attention.sliding_window", required=True)), o_groups=G,
                o_lora=int(_key(r, "attention.output_lora_rank", required=True)), eps=common["rms_eps"], **idx)
    ropes = {0: None, 4: cbase, 128: cbase}
    cfg0 = ModelConfig(**common)                                   # the context's rope parameters

    n_ff_exp = r.layer0("expert_feed_forward_length",
                        r.per_layer("expert_feed_forward_length", L_all, required=True)[:L])
    E = common["n_expert"]
    n_used = int(r.expert_used(r.per_layer("expert_used_count", L_all, default=0)[:L], range(L)))
    n_shared = int(r.get("expert_shared_count", required=True))
    clamp = r.per_layer("swiglu_clamp_exp", L_all, required=True, kind=KEYS["swiglu_clamp_exp"])
    clamp_s = (r.per_layer("swiglu_clamp_shexp", L_all, kind=KEYS["swiglu_clamp_shexp"])
               if r.has("swiglu_clamp_shexp") else clamp)
    n_hash = int(_key(r, "hash_layer_count", required=True))
    norm_w = bool(r.get("expert_weights_norm", required=True))
    w_scale = float(r.get("expert_weights_scale", required=True))
    if E == 0:
        raise ConfigError(f"{path}: deepseek4 needs {r._k('expert_count')} > 0 (every block is MoE)")
    layers = []
    for il in range(L):
        ac = ckv.CompressedKVConfig(ratio=ratios[il], rope=layer_rope(cfg0, ropes[ratios[il]]), **attn)
        mc = hash_routing.HashMoEConfig(n_expert=E, n_expert_used=n_used, n_ff_exp=int(n_ff_exp[il]),
                                        n_ff_shexp=int(n_ff_exp[il]) * n_shared, norm_w=norm_w, w_scale=w_scale,
                                        hash_ids=il < n_hash, clamp_exp=float(clamp[il]),
                                        clamp_shexp=float(clamp_s[il]))
        layers.append(LayerSpec(attn=ckv.KIND[ratios[il]], ffn="moe", n_head=H, n_head_kv=1, n_ff=0,
                                n_ff_exp=mc.n_ff_exp, n_expert_used=n_used, attn_cfg=ac, moe=mc))
    ignored = r.warn_ignored(list(IGNORED_MATH_KEYS))
    return DSV4Config(**common, layers=tuple(layers), ignored_keys=ignored, hc=hc)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg):
    """token_embd, output_norm, output (required), output_hc_* (the streams' head)."""
    table = [W("token_embd", "token_embd.weight", lambda c, s: (c.n_vocab, c.n_embd)),
             W("output_norm", "output_norm.weight", lambda c, s: (c.n_embd,), dense=True),
             W("output", "output.weight", lambda c, s: (c.n_vocab, c.n_embd))]
    return load_tensors(gf, table + hc_head.head_table(cfg.hc.n), cfg)


def load_layer(gf, cfg, il: int):
    spec = cfg.layers[il]
    n = cfg.hc.n
    table = (norm_table(il, "attn_norm", "ffn_norm") + ckv.table(il, spec.attn_cfg)
             + mhc.hc_table(f"blk.{il}.hc_attn", "hc_attn", n) + mhc.hc_table(f"blk.{il}.hc_ffn", "hc_ffn", n)
             + hash_routing.table(il, spec.moe))
    return load_tensors(gf, table, cfg, spec, il)


def new_state(cfg, attn_form: str | None = None) -> list:
    """Per layer its CompressedKV (the window; pooled blocks, the block being filled, the indexer's by ratio)."""
    return [ckv.new_state(s.attn_cfg) for s in cfg.layers]


# ---------------------------------------------------------------- forward

def embed(g, cfg, step, rt):
    """The n residual streams, each the token embedding: [T, n, D]."""
    X = mhc.expand(embed_tokens(g, step.tokens, rt), cfg.hc.n)
    rt.record("hc_init", -1, X)
    return X


def block(X, w, *, cfg, il, state, step, rt):
    """X [T, n, D] -> [T, n, D]."""
    spec = cfg.layers[il]
    sub = dict(hc=cfg.hc, eps=cfg.rms_eps, rt=rt, il=il)
    X = mhc.sublayer(X, w, "attn", lambda h: ckv.compressed_kv_attention(h, w, ac=spec.attn_cfg, il=il, state=state,
                                                                         pos=step.pos, rt=rt),
                     out_name="hc_attn_post", **sub)
    X, tokens = step.out_rows(il, cfg.n_layer, (X, step.tokens))         # the output rows (llama.cpp inp_out_ids)
    return mhc.sublayer(X, w, "ffn", lambda h: hash_routing.hash_moe(h, w, mc=spec.moe, tokens=tokens, il=il, rt=rt),
                        out_name="l_last", **sub)


def head(X, g, cfg, rt):
    h = hc_head.hc_head(X, g, cfg.hc, rt)                                    # [T, D]
    h = rms_norm(h, g.output_norm, cfg.rms_eps)
    rt.record("result_norm", -1, h)
    logits = rt.matmul(h, g.output)                                         # [T, V]
    rt.record("result_output", -1, logits)
    return logits
