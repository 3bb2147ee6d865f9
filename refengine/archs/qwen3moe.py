"""`qwen3moe`: Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B). The llama block with three changes:

- per-head RMS norms on q and k before RoPE (`attn_q_norm`, `attn_k_norm`, weights [K]);
- NEOX RoPE (pairs (x[i], x[i + K/2])), no rope_freqs factors, no attn_output bias;
- every layer is MoE: softmax top-k routing with the top-k weights always renormalized
  (`norm_w = true` is hard-coded in the graph; `expert_weights_norm` is not read).

llama.cpp: `src/models/qwen3moe.cpp`.
"""
from __future__ import annotations

from ..config import ROPE_NEOX
from ..ops import rms_norm
from ..weights import load_tensors
from . import llama

ARCH = "qwen3moe"
ROPE_TYPE = ROPE_NEOX


def config_from_gguf(gf):
    return llama.config_from_gguf(gf, arch=ARCH, rope_type=ROPE_TYPE, moe_only=True)


def load_globals(gf, cfg):
    return llama.load_globals(gf, cfg, rope_factor_tensors=False)


def load_layer(gf, cfg, il: int):
    table = llama.attn_table(gf, il, out_bias=False, qk_norm=True) + llama.moe_table(il, gate_required=True)
    w = load_tensors(gf, table, cfg, cfg.layers[il], il)
    w.attn_output_bias = None
    return w


def block(x, w, *, cfg, il, cache, pos, rope, rt):
    """x [T, D] -> [T, D]."""
    def qk_norm(q, k):                                       # q [T, H, K], k [T, Hkv, K]
        q = rms_norm(q, w.attn_q_norm, cfg.rms_eps)
        rt.record("Qcur_normed", il, q)
        k = rms_norm(k, w.attn_k_norm, cfg.rms_eps)
        rt.record("Kcur_normed", il, k)
        return q, k
    return llama.block(x, w, cfg=cfg, il=il, cache=cache, pos=pos, rope=rope, rt=rt,
                       qk_norm=qk_norm, attn_out_name=None)


def rope_for(cfg, g, pos, n_ctx):
    return llama.rope_for(cfg, g, pos, n_ctx)
