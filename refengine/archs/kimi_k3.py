"""`kimi-k3`: Kimi-K3 (2.8T) — KDA and MLA blocks, attention residuals across layers, latent SiTU MoE.

llama.cpp: `src/models/kimi-k3.cpp` (keys :16-51, tensors :53-167, graph :236-351, KDA :399-479,
MLA :485-563, latent MoE :570-618). kimi-linear's skeleton with five new pieces (header :6-14).
One block (Legend: T tokens, D model dim; `ps` the running residual sum, see residual/attn_res.py):

    cur = res_mix(ps, bank, attn_res_score)         softmax mix of banked checkpoints and ps   res_probs
    bank ps if il % attn_res.block_size == 0        (after this mix)
    h   = rms_norm(cur) * attn_norm                                                    attn_norm      [T, D]
    a   = kda(h)     head_count_kv[il] == 0: attention/kda.py with K3's options (separate q/k/v, full-rank
                     ssm_g output gate, 1-D ssm_a, gate g = lb * sigmoid(-ssm_a * z) when kda.gate_lower_bound)
        | mla(h)     attention/mla.py, rope NONE, optional q-LoRA, output * sigmoid(h @ attn_gate.T)  mla_out
    ps  = a if banked else ps + a                                                      prefix_sum_attn
    cur = res_mix(ps, bank, ffn_res_score)
    f   = rms_norm(cur) * ffn_norm                                                     ffn_norm
    ps  = ps + situ_ffn(f)        il < leading_dense_block_count (ffn/dense.py situ_ffn)           ffn_out
        | ps + latent_moe(f)      moe/latent.py: router on f, experts at expert_latent_length, SiTU  l_out
    head: res_mix(ps, bank, output_res_score), then output_norm and output.

With attn_res.block_size = 0 the mixes are identities and the blocks are plain pre-norm residual blocks.
The family's shared pieces are in archs/kimi_family.py; this file states K3's data and its residual stream.
State: KDA blocks a RecurrentState, MLA blocks the latent cache; the bank is per token and lives for one
forward call (`ResidualStream`), so decoding needs nothing more. Local-mode compare (`forward_local`) is
not available for this arch: a block's input is the stream plus its bank, not one [T, D] array.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..attention import mla
from ..config import COUNT0, FLOAT, POSITIVE, KeyReader, ModelConfig
from ..errors import ConfigError
from ..ffn.dense import situ_ffn
from ..globals import embed_tokens, rms_head
from ..moe.block import MoEConfig, MoETensors
from ..moe.latent import latent_moe, latent_moe_table
from ..ops import rms_norm
from ..residual import ResidualStream, res_mix
from ..weights import W, load_tensors
from . import kimi_family as fam
from .kimi_family import ATTN_FORMS, ROPE_TYPE, new_state  # noqa: F401  (the arch contract)
from .kimi_k3_synth import PRESETS, synth_metadata, synth_plan, synth_resolve  # noqa: F401  (refengine.synth)

ARCH = "kimi-k3"
LOCAL_INPUTS = False       # a block reads the bank of earlier checkpoints too: `compare --local` is refused

MATMUL_INPUTS = [
    (r"attn_norm-(\d+)", ["blk.{il}.attn_q.weight", "blk.{il}.attn_k.weight", "blk.{il}.attn_v.weight",
                          "blk.{il}.ssm_f_a.weight", "blk.{il}.ssm_beta.weight", "blk.{il}.ssm_g.weight",
                          "blk.{il}.attn_q_a.weight", "blk.{il}.attn_q.weight", "blk.{il}.attn_kv_a_mqa.weight",
                          "blk.{il}.attn_gate.weight"]),
    *fam.MLA_INPUTS,
    (r"mla_gated-(\d+)", ["blk.{il}.attn_output.weight"]),
    (r"ffn_norm-(\d+)", ["blk.{il}.ffn_up.weight", "blk.{il}.ffn_gate.weight", "blk.{il}.ffn_gate_inp.weight",
                         "blk.{il}.ffn_routed_down.weight", "blk.{il}.ffn_up_shexp.weight",
                         "blk.{il}.ffn_gate_shexp.weight"]),
    (r"ffn_moe_situ-(\d+)", ["blk.{il}.ffn_down_exps.weight"]),
    (r"result_norm", ["output.weight"]),
]

# Keys of other archs that change the math but that the kimi-k3 loader never reads.
IGNORED_MATH_KEYS = fam.IGNORED_MATH_KEYS + ("expert_group_count", "expert_group_used_count")

# The names kimi-k3.cpp:416-476 gives KDA's tensors (kda.POINTS): beta after its sigmoid, the gate per head; the
# delta rule's output and state also by build_recurrent_attn's names (delta-net-base.cpp:527-560). f_a(h) and
# the gated output are matmul inputs llama.cpp leaves unnamed: refengine names them (flip census).
KDA_NAMES = {"q_conv": "kda_q_conv", "k_conv": "kda_k_conv", "v_conv": "kda_v_conv", "f_a": "kda_f_a",
             "g": "kda_g1", "beta": "kda_beta", "scan_out": ("attn_output", "kda_scan_out"), "state": "new_state",
             "gate_heads": "kda_g2", "normed": "kda_normed", "gated": "kda_gated", "out": "kda_out"}
MOE_TENSORS = MoETensors(
    probs_bias="required",     # exp_probs_b created with flags 0 (kimi-k3.cpp:147)
    apply_scales=False)        # build_moe_ffn gets no `.scale` (kimi-k3.cpp:584-596)
# kimi-k3.cpp:82-105: attn_q/k/v required (the graph never reads attn_qkv); ssm_a exactly {H}
KDA_TENSORS = dict(fused_qkv=False, ssm_a_shape=lambda H: (H,))


@dataclass(frozen=True)
class K3Config(ModelConfig):
    res_bs: int = 0                # attn_res.block_size (required; 0: no attention residuals)
    situ_beta: float = 0.0         # activation.situ_beta (required)
    situ_linear_beta: float = 0.0  # activation.situ_linear_beta (required; <= 0 leaves the up branch uncapped)


# ---------------------------------------------------------------- config

def _mla_config(r: KeyReader, gf, common: dict, n_head: int, il: int) -> mla.MLAConfig:
    """kimi-k3.cpp:18-28, :106-137: key_length_mla / value_length_mla / kv_lora_rank required; q-LoRA when the
    block has attn_q_a_norm (rank attention.q_lora_rank); kq_scale 1/sqrt(dn + R) (:274)."""
    k_mla = int(r.get("attention.key_length_mla", required=True))
    v_mla = int(r.get("attention.value_length_mla", required=True))
    kv_lora = int(r.get("attention.kv_lora_rank", required=True))
    q_lora = int(r.get("attention.q_lora_rank", 0))
    R = common["n_rot"]
    if k_mla - R < 1 or v_mla < 1:
        raise ConfigError(f"{gf.path}: MLA head sizes key_length_mla = {k_mla}, value_length_mla = {v_mla} do not fit "
                          f"rope.dimension_count = {R}")
    has_q_lora = f"blk.{il}.attn_q_a_norm.weight" in gf
    if has_q_lora and q_lora <= 0:
        raise ConfigError(f"{gf.path}: blk.{il}.attn_q_a_norm.weight is present but {r._k('attention.q_lora_rank')} "
                          f"is {q_lora} (llama.cpp creates it with that size)")
    kq_scale = float(np.float32(1.0) / np.sqrt(np.float32(k_mla)))
    return mla.MLAConfig(n_head=n_head, q_lora_rank=q_lora if has_q_lora else 0, kv_lora_rank=kv_lora,
                         qk_nope=k_mla - R, qk_rope=R, v_head=v_mla, kq_scale=kq_scale, rope_attn_factor=1.0,
                         rms_eps=common["rms_eps"], legacy=False, rope=False)


def config_from_gguf(gf) -> K3Config:
    k = fam.read_keys(gf, ARCH)
    r = k.r
    lb = r.get("kda.gate_lower_bound", kind=FLOAT)                              # absent: -inf, softplus form
    kc = replace(k.kda, gate_lower_bound=None if lb is None or not np.isfinite(lb) else float(lb),
                 full_rank_gate=True)                                           # ssm_g (kimi-k3.cpp:463-466)
    latent = int(r.get("expert_latent_length", 0, kind=COUNT0))
    res_bs = int(r.get("attn_res.block_size", required=True, kind=COUNT0))
    beta = float(r.get("activation.situ_beta", required=True, kind=POSITIVE))  # SiTU divides by it
    lbeta = float(r.get("activation.situ_linear_beta", required=True, kind=FLOAT))
    moe = lambda il: MoEConfig(**k.moe_sizes(il), norm_w=bool(r.get("expert_weights_norm", False)),  # noqa: E731
                               w_scale=float(r.get("expert_weights_scale", 0.0)), n_shared=k.n_shared,
                               act="situ", situ_beta=beta, situ_linear_beta=lbeta,
                               n_latent=latent)
    layers = fam.layer_specs(k, kda_cfg=kc, mla_cfg=lambda il: _mla_config(r, gf, k.common, k.n_head, il),
                             moe_cfg=moe)
    ignored = r.warn_ignored(list(IGNORED_MATH_KEYS))
    return K3Config(**k.common, layers=layers, ignored_keys=ignored, res_bs=res_bs, situ_beta=beta,
                    situ_linear_beta=lbeta)


# ---------------------------------------------------------------- tensors

def load_globals(gf, cfg):
    g = fam.load_globals(gf, cfg, ARCH)
    g.output_res_score = None
    if cfg.res_bs > 0:                                                           # kimi-k3.cpp:63-65
        extra = load_tensors(gf, [W("output_res_score", "output_res_score.weight", lambda c, s: (c.n_embd,),
                                    dense=True)], cfg)
        g.output_res_score = extra.output_res_score
        g.tensor_names += extra.tensor_names
        g.tensor_rows.update(extra.tensor_rows)
    return g


def mla_table(il: int, mc: mla.MLAConfig) -> list[W]:
    """MLA's tensors as kimi-k3 loads them: attn_output.scale loaded and never applied (build_attn gets no wo_s,
    kimi-k3.cpp:534 and :549; :559 multiplies by attn_output alone), then the output gate's."""
    return mla.mla_table(il, mc, apply_output_scale=False) + mla_gate_table(il, mc)


def mla_gate_table(il: int, mc: mla.MLAConfig) -> list[W]:
    """K3's optional MLA output gate attn_gate {D, H*dv} (kimi-k3.cpp:133-134) and the generic pass's
    .scale / .input_scale of it (loaded, not applied: kimi-k3.cpp:554 multiplies by attn_gate alone)."""
    p, ONE = f"blk.{il}.", (lambda c, s: (1,))
    return [W("attn_gate", p + "attn_gate.weight", lambda c, s: (mc.n_head * mc.v_head, c.n_embd), required=False),
            W("attn_gate_scale", p + "attn_gate.scale", ONE, required=False, dense=True),
            W("attn_gate_input_scale", p + "attn_gate.input_scale", ONE, required=False, dense=True)]


def load_layer(gf, cfg, il: int):
    res = ("attn_res_score", "ffn_res_score") if cfg.res_bs > 0 else ()         # kimi-k3.cpp:73-76
    return fam.load_layer(gf, cfg, il, norms=("attn_norm", "ffn_norm") + res, kda_tensors=KDA_TENSORS,
                          mla_table=mla_table,
                          moe_table=latent_moe_table, moe_tensors=MOE_TENSORS)


# ---------------------------------------------------------------- forward

def embed(g, cfg, step, rt):
    x = embed_tokens(g, step.tokens, rt)                                 # [T, D]
    rt.record("inp_embd", -1, x)                                         # kimi-k3.cpp:243
    return ResidualStream(x)


def block(x: ResidualStream, w, *, cfg, il, state, step, rt) -> ResidualStream:
    """The stream (running sum [T, D] and bank) -> the stream after block il."""
    if not isinstance(x, ResidualStream):
        raise ConfigError(f"{ARCH}: a block reads the running sum and the banked checkpoints of earlier blocks "
                          f"(attention residuals), not one [T, D] array: local-mode compare is not available")
    spec, eps, bs = cfg.layers[il], cfg.rms_eps, cfg.res_bs
    ps = x.x
    cur = res_mix(ps, x.bank, w.attn_res_score, eps, rt=rt, il=il) if bs else ps
    banked = bool(bs) and il % bs == 0
    bank = x.bank + [ps] if banked else x.bank                           # banks the raw block input
    a = fam.attention(cur, w, spec=spec, il=il, state=state, rt=rt, eps=eps, kda_names=KDA_NAMES,
                      mla_out_gate=True, pos=step.pos)                   # [T, D]
    ps = a if banked else ps + a                                         # the sum restarts on bank layers
    rt.record("prefix_sum_attn", il, ps)
    ps, bank = step.out_rows(il, cfg.n_layer, (ps, bank))                # the output rows (llama.cpp inp_out_ids)
    cur = res_mix(ps, bank, w.ffn_res_score, eps, rt=rt, il=il) if bs else ps
    f = rms_norm(cur, w.ffn_norm, eps)
    rt.record("ffn_norm", il, f)
    if spec.ffn == "dense":
        y = situ_ffn(f, w, beta=cfg.situ_beta, linear_beta=cfg.situ_linear_beta, rt=rt)
    else:
        y = latent_moe(f, w, mc=spec.moe, tensors=MOE_TENSORS, spec=spec, eps=eps, il=il, rt=rt)
    rt.record("ffn_out", il, y)
    ps = ps + y
    rt.record("l_out", il, ps)
    return ResidualStream(ps, bank)


def head(x: ResidualStream, g, cfg, rt):
    cur = res_mix(x.x, x.bank, g.output_res_score, cfg.rms_eps, rt=rt, il=-1) if cfg.res_bs else x.x
    return rms_head(cur, g, cfg, rt, where=cfg.name or ARCH)
