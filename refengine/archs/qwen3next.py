"""`qwen3next`: Qwen3-Next (Qwen3-Next-80B-A3B) — Gated DeltaNet and gated full attention, high-sparsity MoE.

llama.cpp: `src/models/qwen3next.cpp` (keys :4-29, tensors :31-129, graph :138-223). One block (Legend:
T tokens, D model dim):

    h = rms_norm(x) * attn_norm                                   attn_norm        [T, D]
    a = gated_deltanet(h)     linear-attention blocks (attention/gated_deltanet.py: conv + delta rule, state)
      | gqa(h, out_gate)      full-attention blocks: attn_q gives [q | gate] per head, per-head q/k rms norms,
                              NEOX rope on the first n_rot dims, GQA, o * sigmoid(gate) (attention/gqa.py)
    x = x + a                                                     attn_residual
    h = rms_norm(x) * post_attention_norm                         attn_post_norm
    x = x + moe(h)            softmax top-k, weights renormalized (norm_w = true in the graph), no scaling
                              (expert_weights_scale is not read), plus the shared expert scaled by
                              sigmoid(h @ ffn_gate_inp_shexp)                      ffn_out, l_out

Which blocks are linear is data (`attention.recurrent_layers`, else every `full_attention_interval`-th block
is full attention). The zero-centred norms are stored as 1 + w by the converter, so they are used as is.
The `nextn_predict_layers` MTP blocks after the trunk are not loaded nor run (the main pass skips them).
"""
from __future__ import annotations

from ..attention import gated_deltanet as gdn
from ..attention import gqa
from ..config import LLAMA_IGNORED_MATH_KEYS, ROPE_NEOX, Key, KeyReader, LayerSpec, ModelConfig, check_experts, check_gqa, read_common, token_rows, qwen_moe_sizes
from ..errors import ConfigError
from ..globals import embed_tokens, load_globals as _load_globals, rms_head
from ..moe.block import MoEConfig, moe_block, moe_table
from ..ops import rms_norm
from ..ops.rope import context_rope
from ..weights import load_tensors, norm_table
from .qwen3next_synth import PRESETS, synth_metadata, synth_plan  # noqa: F401  (refengine.synth)

ARCH = "qwen3next"
ROPE_TYPE = ROPE_NEOX
ATTN_FORMS = gdn.FORMS     # the delta rule token by token (llama.cpp's fused kernel, the default) or chunked
DEVICE_PATH = False         # linear-attention layers: `--backend cuda` runs op by op (matmuls, experts on the GPU)

MATMUL_INPUTS = [
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q.weight", "blk.{il}.attn_qkv.weight", "blk.{il}.attn_gate.weight",
                          "blk.{il}.ssm_in.weight", "blk.{il}.ssm_ba.weight"]),
    (r"attn_gated-(\d+)", ["blk.{il}.attn_output.weight"]),
    (r"final_output-(\d+)", ["blk.{il}.ssm_out.weight"]),
    (r"attn_post_norm-(\d+)", ["blk.{il}.ffn_up_exps.weight", "blk.{il}.ffn_gate_up_exps.weight",
                               "blk.{il}.ffn_gate_inp.weight", "blk.{il}.ffn_up_shexp.weight",
                               "blk.{il}.ffn_gate_inp_shexp.weight"]),
    (r"ffn_swiglu-(\d+)", ["blk.{il}.ffn_down_shexp.weight"]),
    (r"ffn_moe_swiglu-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"result_norm", ["output.weight", "token_embd.weight"]),
]

# Keys of other archs that change the math but that qwen3next's loader never reads (it reads
# expert_shared_feed_forward_length; expert_weights_scale stays 0: no routed scaling).
IGNORED_MATH_KEYS = tuple(k for k in LLAMA_IGNORED_MATH_KEYS if k != "expert_shared_feed_forward_length")

RECURRENT_LAYERS = Key("number", lo=0, hi=1, per_layer=True)     # bool array (or 0/1), true = linear attention


# ---------------------------------------------------------------- config

def layer_kinds(r: KeyReader, n_layer: int, n_layer_all: int) -> list[bool]:
    """Per trunk block: True = gated DeltaNet (qwen3next.cpp:16-23): `attention.recurrent_layers`, else block
    i is full attention iff (i + 1) % full_attention_interval == 0 (default 4)."""
    arr = r.per_layer("attention.recurrent_layers", n_layer_all, kind=RECURRENT_LAYERS)
    if arr[0] is not None:
        return [bool(v) for v in arr[:n_layer]]
    k = int(r.get("full_attention_interval", 4, kind=Key("int", lo=1, hi=2**32 - 1, llama_type="UINT32")))
    return [(i + 1) % k != 0 for i in range(n_layer)]


def config_from_gguf(gf) -> ModelConfig:
    r = KeyReader(gf, ARCH)
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_TYPE, n_vocab=token_rows(gf))
    L = common["n_layer"]
    L_all = L + common["n_layer_nextn"]
    n_ff, n_used, n_ff_exp = qwen_moe_sizes(r, L, L_all)     # expert FFN: its key, else n_ff / n_used
    n_ff_shexp = int(r.get("expert_shared_feed_forward_length", 0))
    E = common["n_expert"]
    check_experts(gf, ARCH, E, n_used, required=True)                    # "cannot have zero experts" (:34-36)
    if common["head_dim_k"] != common["head_dim_v"]:
        raise ConfigError(f"{gf.path}: {ARCH} needs attention.key_length == attention.value_length "
                          f"(qwen3next.cpp:242), got {common['head_dim_k']} and {common['head_dim_v']}")
    gc = gdn.gdn_config(r, gf.path)
    recr = layer_kinds(r, L, L_all)
    layers = []
    for il in range(L):
        if not recr[il]:
            check_gqa(gf, il, n_head[il], n_head_kv[il])
        ff_exp = n_ff_exp[il]
        moe = MoEConfig(n_expert=E, n_expert_used=n_used[il], n_ff_exp=ff_exp,
                        n_groups=common["n_expert_groups"], n_group_used=common["n_group_used"],
                        n_shared=1, n_ff_shexp=n_ff_shexp or n_ff[il], fused_gate_up=True,
                        shexp_gate=True)
        layers.append(LayerSpec(attn="gdn" if recr[il] else "mha", ffn="moe", n_head=int(n_head[il]),
                                n_head_kv=int(n_head_kv[il]), n_ff=n_ff[il], n_ff_exp=ff_exp,
                                n_expert_used=n_used[il], attn_cfg=gc if recr[il] else None, moe=moe))
    ignored = r.warn_ignored(list(IGNORED_MATH_KEYS))
    return ModelConfig(**common, layers=tuple(layers), ignored_keys=ignored)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg):
    g = _load_globals(gf, cfg, rope_factor_tensors=False)
    g.tensor_names = list(g.tensor_names) + mtp_tensor_names(gf, cfg)
    return g


def mtp_tensor_names(gf, cfg) -> list[str]:
    """The MTP blocks' tensors (blk.N.* for N >= n_layer). llama.cpp creates them with TENSOR_SKIP unless asked
    to load MTP (qwen3next.cpp:38-40, :108-128): they count as the file's and are never read. Here the same:
    named as consumed (refengine lint), not loaded."""
    def block(name):
        parts = name.split(".")
        return int(parts[1]) if parts[0] == "blk" and len(parts) > 2 and parts[1].isdigit() else -1
    return [n for n in gf.tensors if cfg.n_layer <= block(n) < cfg.n_layer + cfg.n_layer_nextn]


def load_layer(gf, cfg, il: int):
    spec = cfg.layers[il]
    table = norm_table(il, "attn_norm", "post_attention_norm")
    if spec.attn == "gdn":
        table += gdn.gdn_table(gf, il, spec.attn_cfg)
    else:
        table += gqa.gqa_table(gf, il, out_bias=False, qk_norm=True, q_gate=True)
    table += moe_table(gf, il, spec.moe)
    return load_tensors(gf, table, cfg, spec, il)


def new_state(cfg, attn_form: str | None = None) -> list:
    """Per block: a GDNState (conv tail, delta-rule matrix; attn_form: its delta-rule form, ATTN_FORMS) or a
    KVCache (full attention)."""
    return [gdn.new_state(attn_form or "recurrent") if spec.attn == "gdn" else gqa.new_state() for spec in cfg.layers]


# ---------------------------------------------------------------- forward

def rope_for(cfg, g, pos, n_ctx):
    """cos, sin [T, n_rot/2]: NEOX pairs on the first n_rot dims, YaRN from the context parameters."""
    return context_rope(cfg, pos, freq_factors=None)


def embed(g, cfg, step, rt):
    x = embed_tokens(g, step.tokens, rt)                                 # [T, D]
    rt.record("model.embed_tokens", -1, x)
    return x


def block(x, w, *, cfg, il, state, step, rt):
    """x [T, D] -> [T, D]."""
    spec = cfg.layers[il]
    h = rms_norm(x, w.attn_norm, cfg.rms_eps)
    rt.record("attn_norm", il, h)
    if spec.attn == "gdn":
        a = gdn.gated_deltanet(h, w, gc=spec.attn_cfg, eps=cfg.rms_eps, il=il, state=state, rt=rt)
    else:
        cos, sin = step.memo("rope", lambda: rope_for(cfg, step.g, step.pos, step.n_ctx))   # [T, R/2]
        a = gqa.self_attention(h, w, cfg=cfg, spec=spec, il=il, state=state, step=step, cos=cos, sin=sin, rt=rt,
                               out_gate=True)
        rt.record("attn_output", il, a)
    x = x + a
    rt.record("attn_residual", il, x)
    h = rms_norm(x, w.post_attention_norm, cfg.rms_eps)
    rt.record("attn_post_norm", il, h)
    x = x + moe_block(h, w, mc=spec.moe, spec=spec, il=il, rt=rt)      # records ffn_out
    rt.record("post_moe", il, x)
    rt.record("l_out", il, x)
    return x


def head(x, g, cfg, rt):
    # the normed state is also the MTP head's input: traced as h_nextn before result_norm (qwen3next.cpp:204-213)
    rt.record("h_nextn", -1, rms_norm(x, g.output_norm, cfg.rms_eps))
    return rms_head(x, g, cfg, rt, where=cfg.name or ARCH)
