"""The DeepSeek family — `deepseek2`, `deepseek32`, `glm-dsa` — written once; each arch module passes what differs.

llama.cpp writes the three as sibling copies (`src/models/deepseek2.cpp`, `deepseek32.cpp`, and `glm-dsa.cpp`, a
line-for-line copy of deepseek32.cpp). They share one block (Legend: T tokens, D model dim):

    h = rms_norm(x) * attn_norm                                   attn_norm       [T, D]
    x = x + attention(h)        LayerSpec.attn: "mla" (attention/mla.py) | "dsa" (attention/dsa.py: MLA under
                                the lightning indexer's top-k mask)                             ffn_inp
    h = rms_norm(x) * ffn_norm                                    ffn_norm
    x = x + dense_ffn(h)        for il < leading_dense_block_count                              ffn_out
      | x + moe_block(h)        DeepSeekMoE: routed (expert_gating_func) + shared experts       l_out   [T, D]

one config reading (`read_common`, MLA's keys, the DeepSeekMoE keys), one tensor table, one state per layer,
the token embedding and the tied-or-not rms head; RoPE is NORM pairs on the rope part (llama_model_rope_type)
with the context's YaRN parameters and no rope factor tensors.

What differs is data the arch module passes (the arch files cite the lines):

                              deepseek2                 deepseek32                glm-dsa
    expert_gating_func        missing: by shape         required                  missing / 0: sigmoid
    `.scale` of FFN, experts  loaded, not applied       applied                   applied
    fused ffn_gate_up_exps    accepted                  no                        no
    mla_config switches       the defaults              no lite rule, MLA required, no temperature, no
                                                        mscale special case (glm-dsa: no yarn_log_multiplier)
    indexers                  none (attn "mla")         NEOX, eps 1e-6, all full  NORM, eps 0, its types rule
    keys warned as ignored    each arch's IGNORED_MATH_KEYS
"""
from __future__ import annotations

from ..attention import dsa, mla
from ..config import ROPE_NORM, KeyReader, LayerSpec, ModelConfig, check_experts, read_common, token_rows
from ..errors import ConfigError
from ..ffn import dense_ffn_table
from ..globals import embed_tokens, load_globals as _load_globals, rms_head
from ..moe.block import GATING, MoEConfig, MoETensors, ffn_sublayer, moe_matmul_inputs, moe_table
from ..ops.rope import context_rope
from ..residual.pending import add_norm
from ..weights import load_tensors, norm_table

ROPE_TYPE = ROPE_NORM       # llama_model_rope_type: LLAMA_ROPE_TYPE_NORM for all three


def matmul_inputs(attention_rows: list) -> list:
    """`MATMUL_INPUTS` (refengine.flips): the arch's attention-input rows, then MLA's output side and the
    DeepSeekMoE FFN's rows, which every member shares."""
    return attention_rows + [
        (r"q_nope_perm-(\d+)", ["blk.{il}.attn_k_b.weight"]),
        (r"kqv-(\d+)", ["blk.{il}.attn_v_b.weight"]),
        (r"kqv_out-(\d+)", ["blk.{il}.attn_output.weight"]),
        *moe_matmul_inputs(dense=True, shared=True),
        (r"result_norm", ["output.weight", "token_embd.weight"]),
    ]


# The DSA members' table (deepseek32, glm-dsa): attn_norm feeds the indexer too, and the normed q-LoRA latent
# `qr` (the 2nd `qr`, a name llama.cpp reuses) feeds both attn_q_b and the indexer's attn_q_b.
DSA_MATMUL_INPUTS = matmul_inputs([
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q_a.weight", "blk.{il}.attn_kv_a_mqa.weight",
                          "blk.{il}.indexer.attn_k.weight", "blk.{il}.indexer.proj.weight"]),
    (r"qr-(\d+)", ["blk.{il}.attn_q_b.weight", "blk.{il}.indexer.attn_q_b.weight"]),
])


# ---------------------------------------------------------------- config

def deepseek_moe_layers(r: KeyReader, common: dict, gating: str) -> list:
    """Per trunk layer: None (dense FFN) or the MoEConfig of DeepSeek's MoE FFN (routed + shared experts), from
    leading_dense_block_count, expert_feed_forward_length (required), expert_used_count, expert_shared_count
    (required), expert_weights_scale, expert_weights_norm, the group keys; `gating` already resolved by the arch.
    (deepseek2.cpp:3-20, deepseek32.cpp:7-16, glm-dsa.cpp the same lines.)"""
    L = common["n_layer"]
    L_all = L + common["n_layer_nextn"]
    n_dense = int(r.get("leading_dense_block_count", 0))
    # a scalar or one per layer; the tensors and the graph take n_ff_exp() and n_expert_used(), layer 0's
    # entries (deepseek2.cpp:82, :137, LLAMA_LOAD_LOCALS; deepseek32.cpp:74, glm-dsa.cpp:107)
    n_ff_exp = r.layer0("expert_feed_forward_length",
                        r.per_layer("expert_feed_forward_length", L_all, required=True)[:L])
    n_used = r.per_layer("expert_used_count", L_all, default=0)[:L]
    n_shared = int(r.get("expert_shared_count", required=True))
    E = common["n_expert"]
    check_experts(r.gf, r.arch, E if L > n_dense else 0, n_used[n_dense:])
    n_used = (r.expert_used(n_used, range(n_dense, L) if E else ()),) * L
    out = []
    for il in range(L):
        if il < n_dense or E == 0:
            out.append(None)
            continue
        out.append(MoEConfig(
            n_expert=E, n_expert_used=int(n_used[il]), n_ff_exp=int(n_ff_exp[il]), gating=gating,
            norm_w=bool(r.get("expert_weights_norm", False)), w_scale=float(r.get("expert_weights_scale", 0.0)),
            n_groups=common["n_expert_groups"], n_group_used=common["n_group_used"], n_shared=n_shared,
            n_ff_shexp=int(n_ff_exp[il]) * n_shared))
    return out


def config_from_gguf(arch: str, gf, *, gating_id, mla_options: dict, ignored_keys: tuple,
                     indexers=None) -> ModelConfig:
    """The member's ModelConfig: one LayerSpec per trunk layer (the `nextn_predict_layers` MTP blocks after it
    are counted in per-layer keys, not run).

    gating_id(r, n_layer_all, n_vocab) -> the expert_gating_func value (the arch's rule for a missing key);
    mla_options: `mla.mla_config`'s switches; ignored_keys: math keys of other archs, warned about;
    indexers(r, common) -> one IndexerConfig per trunk layer (the DSA members; None: plain MLA layers).
    """
    r = KeyReader(gf, arch)
    n_vocab = token_rows(gf)
    common, n_head, n_head_kv = read_common(r, rope_type=ROPE_TYPE, n_vocab=n_vocab)
    L = common["n_layer"]
    L_all = L + common["n_layer_nextn"]
    func = gating_id(r, L_all, n_vocab)
    if func not in GATING:
        raise ConfigError(f"{gf.path}: {arch}.expert_gating_func = {func} is not one of {sorted(GATING)}")
    moes = deepseek_moe_layers(r, common, GATING[func])
    n_ff = r.layer0("feed_forward_length", r.per_layer("feed_forward_length", L_all, default=0)[:L])   # n_ff()
    n_head = r.layer0("attention.head_count", n_head)          # the graph's n_head (llama-graph.cpp:1470)
    mc = mla.mla_config(r, **{**common, "n_layer": L_all}, n_head=n_head[0], **mla_options)
    ics = [None] * L if indexers is None else indexers(r, common)
    layers = tuple(
        LayerSpec(attn="mla" if ic is None else "dsa", ffn="dense" if moe is None else "moe", n_head=int(n_head[il]),
                  n_head_kv=int(n_head_kv[il]), n_ff=int(n_ff[il] or 0),
                  n_ff_exp=0 if moe is None else moe.n_ff_exp, n_expert_used=0 if moe is None else moe.n_expert_used,
                  attn_cfg=mc if ic is None else dsa.DSAConfig(mla=mc, indexer=ic), moe=moe)
        for il, (moe, ic) in enumerate(zip(moes, ics)))
    ignored = r.warn_ignored(list(ignored_keys))
    return ModelConfig(**common, layers=layers, ignored_keys=ignored)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg):
    return _load_globals(gf, cfg, rope_factor_tensors=False)


# Per attention kind ("mla" | "dsa"): its module's tensor table, state and sub-block.
ATTENTION = {"mla": (mla.mla_table, mla.new_state), "dsa": (dsa.dsa_table, dsa.new_state)}


def load_layer(gf, cfg, il: int, *, moe_tensors: MoETensors):
    """Norms, MLA's tensors and (a "dsa" layer) the indexer's, then the dense FFN or the MoE block's (which the
    member's loader accepts or requires: moe_tensors)."""
    spec = cfg.layers[il]
    table = norm_table(il, "attn_norm", "ffn_norm") + ATTENTION[spec.attn][0](il, spec.attn_cfg)
    if spec.ffn == "dense":
        table += dense_ffn_table(il, lambda c, s: s.n_ff)   # .scale applied or not: the arch's ffn_scales
    else:
        table += moe_table(gf, il, spec.moe, moe_tensors)
    return load_tensors(gf, table, cfg, spec, il)


def new_state(cfg, attn_form: str | None = None) -> list:
    """Per layer the MLA cache of the form (it carries it): LatentKV (absorbed, llama.cpp's for MLA files, the
    default) or per-head KVCache (naive); a "dsa" layer's DSAState holds it with, where the layer runs its own
    indexer, the indexer key cache (a shared layer has none)."""
    return [ATTENTION[s.attn][1](s.attn_cfg, attn_form) for s in cfg.layers]


# ---------------------------------------------------------------- forward

def rope_for(cfg, g, pos, n_ctx):
    """cos, sin [T, n_rot/2] of the rope part, with the context's YaRN parameters (no factor tensors)."""
    spec = cfg.layers[0]
    mc = spec.attn_cfg.mla if spec.attn == "dsa" else spec.attn_cfg                # every layer's MLAConfig is one
    return context_rope(cfg, pos, attn_factor=mc.rope_attn_factor)


def embed(g, cfg, step, rt):
    return embed_tokens(g, step.tokens, rt)                              # [T, D]


def block(x, w, *, cfg, il, state, step, rt, ffn_scales: bool, moe_tensors: MoETensors):
    """x [T, D] -> [T, D]. ffn_scales: the dense FFN applies its `.scale` tensors; moe_tensors: the member's
    MoETensors (an MoE layer's `.scale` tensors apply by its apply_scales)."""
    spec = cfg.layers[il]
    cos, sin = step.memo("rope", lambda: rope_for(cfg, step.g, step.pos, step.n_ctx))    # [T, R/2]
    x, h = add_norm(x, w.attn_norm, cfg.rms_eps)      # (the previous block's output added first: PendingAdd)
    rt.record("attn_norm", il, h)
    if spec.attn == "dsa":                                               # the state's form decides MLA's
        a = dsa.sparse_mla(h, w, dc=spec.attn_cfg, il=il, state=state, cos=cos, sin=sin, rt=rt, step=step)
    else:
        a = mla.mla(h, w, mc=spec.attn_cfg, il=il, state=state, cos=cos, sin=sin, rt=rt, pos=step.pos)
    x, a = step.out_rows(il, cfg.n_layer, (x, a))                        # the output rows (llama.cpp inp_out_ids)
    return ffn_sublayer(x, w, cfg=cfg, spec=spec, il=il, rt=rt, moe_tensors=moe_tensors, dense_scales=ffn_scales,
                        a=a)                                             # x + a (ffn_inp), then the FFN half


def head(x, g, cfg, rt):
    return rms_head(x, g, cfg, rt, where=cfg.name or cfg.arch)
