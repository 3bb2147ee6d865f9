"""`qwen3next`: Qwen3-Next (Qwen3-Next-80B-A3B) — Gated DeltaNet and gated full attention, high-sparsity MoE.

llama.cpp: `src/models/qwen3next.cpp` (keys :4-29, tensors :31-129, graph :138-223). One block, the family's
(archs/llama_family.py) (Legend: T tokens, D model dim):

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
from ..config import LLAMA_IGNORED_MATH_KEYS, ROPE_NEOX, Key, KeyReader
from ..moe.block import MoETensors
from .llama_family import Variant, check_kv_dims
from .qwen3next_synth import PRESETS, synth_metadata, synth_plan  # noqa: F401  (refengine.synth)

ARCH = "qwen3next"
ROPE_TYPE = ROPE_NEOX
ATTN_FORMS = gdn.FORMS     # the delta rule token by token (llama.cpp's fused kernel, the default) or chunked

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


def layer_kinds(r: KeyReader, n_layer: int, n_layer_all: int) -> list[bool]:
    """Per trunk block: True = gated DeltaNet (qwen3next.cpp:16-23): `attention.recurrent_layers`, else block
    i is full attention iff (i + 1) % full_attention_interval == 0 (default 4)."""
    arr = r.per_layer("attention.recurrent_layers", n_layer_all, kind=RECURRENT_LAYERS)
    if arr[0] is not None:
        return [bool(v) for v in arr[:n_layer]]
    k = int(r.get("full_attention_interval", 4, kind=Key("int", lo=1, hi=2**32 - 1, llama_type="UINT32")))
    return [(i + 1) % k != 0 for i in range(n_layer)]


QWEN3NEXT = Variant(
    arch=ARCH, rope_type=ROPE_TYPE, ignored_keys=IGNORED_MATH_KEYS,
    expert_ff_length=True, experts_required=True,                        # "cannot have zero experts" (:34-36)
    check_dims=check_kv_dims,                                            # rope on the first n_rot dims only
    linear_layers=layer_kinds, shared_expert=True,
    moe_tensors=MoETensors(fused_gate_up=True),    # a fused ffn_gate_up_exps is accepted (qwen3next.cpp:31-129)
    rope_factor_tensors=False, qk_norm=True, out_bias=False, q_gate=True,
    ffn_norm="post_attention_norm", mtp_skipped=True,
    trace_embd="model.embed_tokens", trace_attn_out="attn_output", trace_ffn_inp="attn_residual",
    trace_ffn_norm="attn_post_norm", trace_l_out=("post_moe", "l_out"),
    trace_head_nextn="h_nextn")                # the MTP head's input, traced before result_norm (:204-213)

# the arch contract (refengine.archs): the family's functions on qwen3next's data (synth: qwen3next_synth)
config_from_gguf, load_globals, load_layer = QWEN3NEXT.config_from_gguf, QWEN3NEXT.load_globals, QWEN3NEXT.load_layer
new_state, embed, block, head = QWEN3NEXT.new_state, QWEN3NEXT.embed, QWEN3NEXT.block, QWEN3NEXT.head
