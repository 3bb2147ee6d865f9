"""`qwen3moe`: Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B).

llama.cpp: `src/models/qwen3moe.cpp`. One block, the family's (archs/llama_family.py) (Legend: T tokens,
D model dim, K head dim):

    h = rms_norm(x) * attn_norm                           attn_norm       [T, D]
    x = x + gqa_attention(h)     per-head RMS norms on q and k before RoPE (attn_q_norm, attn_k_norm: [K]),
                                 NEOX RoPE, no rope factor tensors, no attn_output bias      ffn_inp
    h = rms_norm(x) * ffn_norm                            ffn_norm
    x = x + moe_block(h)         every layer: softmax top-k, weights always renormalized
                                 (`norm_w = true` is hard-coded in the graph; `expert_weights_norm` is
                                 not read)                                                   l_out
Experts are sized by expert_feed_forward_length, else feed_forward_length / expert_used_count.
"""
from __future__ import annotations

from ..config import LLAMA_IGNORED_MATH_KEYS, ROPE_NEOX
from .llama_family import Variant, gqa_matmul_inputs

ARCH = "qwen3moe"
ROPE_TYPE = ROPE_NEOX

QWEN3MOE = Variant(arch=ARCH, rope_type=ROPE_TYPE, ignored_keys=LLAMA_IGNORED_MATH_KEYS,
                   expert_ff_length=True, experts_required=True,
                   rope_factor_tensors=False, qk_norm=True, out_bias=False,
                   trace_attn_out=None,             # the graph names no attention output before ffn_inp
                   synth_rope_dims=False)

# llama.cpp graph tensor that is the input of a quantized matmul -> the GGUF weights it multiplies (refengine.flips)
MATMUL_INPUTS = gqa_matmul_inputs(dense=False)

PRESETS = {
    "tiny": dict(n_vocab=256, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=128, n_ff=768,
                 n_expert=8, n_expert_used=2, n_ff_exp=256, n_ctx=512, rope_base=1e6, eps=1e-6),
    # Qwen3-30B-A3B as published (config.json of Qwen/Qwen3-30B-A3B)
    "qwen3-30b-a3b": dict(n_vocab=151936, n_embd=2048, n_layer=48, n_head=32, n_head_kv=4, head_dim=128,
                          n_ff=6144, n_expert=128, n_expert_used=8, n_ff_exp=768, n_ctx=40960,
                          rope_base=1e6, eps=1e-6),
}

# the arch contract (refengine.archs): the family's functions on qwen3moe's data
config_from_gguf, load_globals, load_layer = QWEN3MOE.config_from_gguf, QWEN3MOE.load_globals, QWEN3MOE.load_layer
new_state, embed, block, head = QWEN3MOE.new_state, QWEN3MOE.embed, QWEN3MOE.block, QWEN3MOE.head
synth_plan, synth_metadata = QWEN3MOE.synth_plan, QWEN3MOE.synth_metadata
