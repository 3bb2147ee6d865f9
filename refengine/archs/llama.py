"""`llama`: the dense baseline transformer (Llama 2/3, SmolLM2, Mixtral-style MoE when expert_count > 0).

llama.cpp: `src/models/llama.cpp` (graph and tensor table), generic optional tensors in
`src/llama-model.cpp:1620-1790` (`.scale` / `.input_scale` pass), `build_qkv`, `build_attn`,
`build_ffn`, `build_moe_ffn` in `src/llama-graph.cpp`.

One block (Legend: T tokens, D model dim), the family's (archs/llama_family.py) with llama's defaults:

    h = rms_norm(x) * attn_norm                           attn_norm       [T, D]
    x = x + gqa_attention(h)     (attention/gqa.py)       attn_out, ffn_inp
    h = rms_norm(x) * ffn_norm                            ffn_norm
    x = x + dense_ffn(h)         (ffn/dense.py)           ffn_out         (dense)
      | x + moe_block(h)         (moe/block.py: softmax top-k, weights renormalized)   ffn_moe_out
                                                          l_out           [T, D]
RoPE: NORM pairs, optional `rope_freqs` / LongRoPE factors; the residual is one [T, D] stream.
Experts (Mixtral files) are sized by feed_forward_length and may omit ffn_gate_exps (then act = silu(up)).
"""
from __future__ import annotations

from ..config import LLAMA_IGNORED_MATH_KEYS, ROPE_NORM
from ..moe.block import MoETensors
from .llama_family import Variant, gqa_matmul_inputs

ARCH = "llama"
ROPE_TYPE = ROPE_NORM

LLAMA = Variant(arch=ARCH, rope_type=ROPE_TYPE, ignored_keys=LLAMA_IGNORED_MATH_KEYS,
                moe_tensors=MoETensors(optional_gate=True))   # ffn_gate_exps TENSOR_NOT_REQUIRED (models/llama.cpp)

# llama.cpp graph tensor that is the input of a quantized matmul -> the GGUF weights it multiplies (refengine.flips)
MATMUL_INPUTS = gqa_matmul_inputs(dense=True)

PRESETS = {
    "tiny": dict(n_vocab=256, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                 n_ctx=512, rope_base=10000.0, eps=1e-5),
    "tiny-moe": dict(n_vocab=256, n_embd=256, n_layer=2, n_head=4, n_head_kv=2, head_dim=64, n_ff=256,
                     n_expert=4, n_expert_used=2, n_ctx=512, rope_base=10000.0, eps=1e-5),
    # Meta-Llama-3-8B as published (config.json of meta-llama/Meta-Llama-3-8B: hidden_size 4096, intermediate_size
    # 14336, 32 heads, 8 kv heads, 32 layers, vocab 128256, rope_theta 500000, rms_norm_eps 1e-5, 8192 positions)
    "llama-3-8b": dict(n_vocab=128256, n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336,
                       n_ctx=8192, rope_base=500000.0, eps=1e-5),
}

# the arch contract (refengine.archs): the family's functions on llama's data
config_from_gguf, load_globals, load_layer = LLAMA.config_from_gguf, LLAMA.load_globals, LLAMA.load_layer
new_state, embed, block, head = LLAMA.new_state, LLAMA.embed, LLAMA.block, LLAMA.head
synth_plan, synth_metadata = LLAMA.synth_plan, LLAMA.synth_metadata
