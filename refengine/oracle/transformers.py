"""The second oracle: the model authors' PyTorch code in transformers, run on the weights of a GGUF file.

    res = hf_forward("model.gguf", tokens)              # deepseek4 -> deepseek_v4, qwen4exp -> qwen4_exp
    res.logits                                          # [T, V] float64 (the model run in float64)
    res.hidden                                          # n_layer + 1 arrays, as transformers reports them
    res.config                                          # the transformers config built from the file's metadata
    res = hf_forward("model.gguf", tokens, mode="llamacpp")   # experts' inputs rounded as llama.cpp rounds them

    model_type, cfg, state = hf_checkpoint("model.gguf")   # no torch: config kwargs + state dict (NumPy)
    model, config = hf_model("model.gguf")              # the torch model (for hooks)

`res.hidden` (`output_hidden_states=True`): [0] the streams as initialised, [i + 1] layer i's output streams,
except that the last entry is the head's output (deepseek4: hc head + output norm, qwen4exp: the final mixer,
glm5-next: mean head + norm), [T, D]; the streams are [T, hc, D] (qwen4exp: [T, hc * D]). `res.names` gives
llama.cpp's trace name of each (`hc_init`, `l_last-i` / `l_out-i`, `result_norm`): the same values, in its order.

This is the inverse of llama.cpp's converter (`convert_hf_to_gguf.py`, `conversion/deepseek.py:527-927`,
`conversion/qwen4exp.py`, `conversion/qwen.py:372-633`): every GGUF tensor is dequantized with gguf-py
(`gguf.quants.dequantize`, so MXFP4 experts are multiplied in float, as the authors' code does), renamed to
the transformers module path, and un-transformed where the converter transformed it (qwen4exp: `+1` on
zero-centred gammas, `-exp(A_log)`, V heads tiled instead of grouped, `index_qk_proj` split in two).
The metadata keys become the transformers config. What the file does not record (a seed, a padding divisor) is
chosen so the authors' module is built with the shapes the file has, and the file's own values are loaded.

torch and transformers are imported inside the functions: refengine imports without them (the `hf` extra).
A file of another arch, or one without a tensor or key the mapping needs, is refused with a
`refengine.errors` error naming the file and what is missing.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import MissingKeyError, MissingTensorError, OracleError, UnsupportedArchError


@dataclass
class HFResult:
    logits: np.ndarray                                   # [T, V]
    hidden: list = field(default_factory=list)           # n_layer + 1 arrays (module docstring)
    config: object = None                                # the transformers config
    names: list = field(default_factory=list)            # llama.cpp's trace name of each `hidden` entry


# llama.cpp's graph name of a layer's output streams, per arch (the `cb(cur, NAME, il)` of its last op)
LAYER_OUT_NAME = {"deepseek4": "l_last", "qwen4exp": "l_last", "glm5-next": "l_out"}


def hidden_names(arch: str, n_layer: int) -> list[str]:
    """llama.cpp's names for transformers' hidden states of `arch`: the streams as initialised (`hc_init`), each
    layer's output but the last, and the head's output in place of the last layer's (`result_norm`)."""
    out = LAYER_OUT_NAME[arch]
    return ["hc_init"] + [f"{out}-{il}" for il in range(n_layer - 1)] + ["result_norm"]


# --------------------------------------------------------------------------------------------- reading the file

class _File:
    """A GGUF opened for the mapping: metadata with the arch prefix, tensors dequantized to float32 (gguf-py)."""

    def __init__(self, path):
        from ..gguf import open_gguf
        self.path = os.fspath(path)
        self.g = open_gguf(self.path)
        self.arch = self.g.arch
        self.used: set[str] = set()

    def key(self, name: str, default=...):
        """`{arch}.name` (or a general key, given whole)."""
        full = name if name.startswith(("general.", "tokenizer.")) else f"{self.arch}.{name}"
        if full not in self.g.kv:
            if default is ...:
                raise MissingKeyError(f"{self.path}: key {full!r} is missing; the transformers config needs it")
            return default
        v = self.g.get(full)
        return v.tolist() if isinstance(v, np.ndarray) else v

    def has(self, name: str) -> bool:
        return name in self.g.tensors

    def tensor(self, name: str) -> np.ndarray:
        """The tensor in NumPy order (reversed ggml ne), float32 for every float or quantized type, int for I32."""
        import gguf.quants
        if name not in self.g.tensors:
            raise MissingTensorError(f"{self.path}: tensor {name!r} is missing; transformers' model needs it")
        self.used.add(name)
        qt = self.g.tensor(name)
        shape = tuple(qt.shape)
        tname = qt.type.name
        if tname in ("I8", "I16", "I32", "I64"):
            return qt.raw.reshape(-1).view(np.dtype(tname.lower().replace("i", "int"))).reshape(shape).copy()
        if tname == "F32":
            return qt.raw.reshape(-1).view(np.float32).reshape(shape).copy()
        out = gguf.quants.dequantize(qt.raw, gguf.GGMLQuantizationType(int(qt.type)))
        return np.asarray(out, dtype=np.float32).reshape(shape)


def _f32(v) -> float:
    """A float key as the config had it: GGUF stores float32, so 1e-6 comes back as 9.99999997e-07; the shortest
    decimal that rounds to the same float32 is the config's value (what the converter was given)."""
    return float(str(np.float32(v)))


def _tiled_to_grouped(a: np.ndarray, axis: int, n_k: int, per_k: int, dim: int) -> np.ndarray:
    """Undo the converter's `_reorder_v_heads` (qwen.py:466-491): V heads in tiled order [per_k, n_k, dim] back
    to grouped by K head [n_k, per_k, dim], along `axis`."""
    a = np.moveaxis(a, axis, 0)
    rest = a.shape[1:]
    a = a.reshape(per_k, n_k, dim, *rest).swapaxes(0, 1).reshape(n_k * per_k * dim, *rest)
    return np.ascontiguousarray(np.moveaxis(a, 0, axis))


# ------------------------------------------------------------------------------------------------ deepseek4

# GGUF name (after `blk.{i}.`) -> transformers name (after `model.layers.{i}.`), as conversion/deepseek.py:811-870
# and transformers' conversion_mapping.py ("deepseek_v4") name them.
DS4_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn.weight": "attn_hc.fn", "hc_attn_base.weight": "attn_hc.base", "hc_attn_scale.weight": "attn_hc.scale",
    "hc_ffn_fn.weight": "ffn_hc.fn", "hc_ffn_base.weight": "ffn_hc.base", "hc_ffn_scale.weight": "ffn_hc.scale",
    "attn_sinks.weight": "self_attn.sinks",
    "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_norm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight",
    "attn_kv.weight": "self_attn.kv_proj.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_norm.weight",
    "attn_output_a.weight": "self_attn.o_a_proj.weight",
    "attn_output_b.weight": "self_attn.o_b_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
DS4_COMPRESSOR = {                                       # ratio != 0
    "attn_compressor_ape.weight": "self_attn.compressor.position_bias",
    "attn_compressor_kv.weight": "self_attn.compressor.kv_proj.weight",
    "attn_compressor_gate.weight": "self_attn.compressor.gate_proj.weight",
    "attn_compressor_norm.weight": "self_attn.compressor.kv_norm.weight",
}
DS4_INDEXER = {                                          # ratio 4 (CSA)
    "indexer.proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "indexer.attn_q_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "indexer_compressor_ape.weight": "self_attn.compressor.indexer.position_bias",
    "indexer_compressor_kv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "indexer_compressor_gate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "indexer_compressor_norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
}
DS4_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "output_hc_fn.weight": "model.hc_head.hc_fn",
    "output_hc_base.weight": "model.hc_head.hc_base",
    "output_hc_scale.weight": "model.hc_head.hc_scale",
}
DS4_LAYER_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def _one_limit(f: _File, n_layer: int) -> float:
    """The SwiGLU clamp: the file's per-layer `swiglu_clamp_exp` (and `swiglu_clamp_shexp`, llama.cpp's separate
    clamp of the shared expert) as the one `swiglu_limit` the authors' config has for every layer and both kinds
    of expert. A file whose clamps differ has no transformers equivalent: refused, not mapped to layer 0's."""
    vals = []
    for key in ("swiglu_clamp_exp", "swiglu_clamp_shexp"):
        v = f.key(key, None)
        if v is not None:
            vals += [float(x) for x in (v[:n_layer] if isinstance(v, list) else [v])]
    if not vals:
        raise MissingKeyError(f"{f.path}: swiglu_clamp_exp is missing (the authors' swiglu_limit)")
    if any(x != vals[0] for x in vals):
        raise OracleError(f"{f.path}: the SwiGLU clamps differ between layers or between routed and shared experts "
                          f"(swiglu_clamp_exp / swiglu_clamp_shexp: {sorted(set(vals))}); the authors' config has "
                          f"one swiglu_limit, so this file has no transformers equivalent")
    return vals[0]


def _deepseek4(f: _File) -> tuple[str, dict, dict]:
    n_layer = int(f.key("block_count"))
    ratios = [int(r) for r in f.key("attention.compress_ratios")][:n_layer]
    bad = [r for r in ratios if r not in DS4_LAYER_TYPE]
    if bad:
        raise OracleError(f"{f.path}: compress ratio {bad[0]} has no deepseek_v4 layer type (0, 4 or 128)")
    if int(f.key("expert_gating_func", 4)) != 4:
        raise OracleError(f"{f.path}: deepseek_v4 routes with sqrt-softplus (expert_gating_func 4) only")
    n_hash = int(f.key("hash_layer_count", 0))
    head_dim = int(f.key("attention.key_length"))
    rope_dim = int(f.key("rope.dimension_count"))
    clamp = _one_limit(f, n_layer)
    V = int(f.key("vocab_size", 0)) or f.g.tensors["token_embd.weight"].ne[1]
    compress_rope = {"rope_type": "default"}
    if f.key("rope.scaling.type", "none") == "yarn":
        compress_rope = {"rope_type": "yarn", "factor": _f32(f.key("rope.scaling.factor")),
                         "original_max_position_embeddings": int(f.key("rope.scaling.original_context_length")),
                         "beta_fast": _f32(f.key("rope.scaling.yarn_beta_fast", 32.0)),
                         "beta_slow": _f32(f.key("rope.scaling.yarn_beta_slow", 1.0)),
                         "attention_factor": 1.0}
    cfg = dict(
        vocab_size=V,
        hidden_size=int(f.key("embedding_length")),
        moe_intermediate_size=int(f.key("expert_feed_forward_length")),
        num_hidden_layers=n_layer,
        num_attention_heads=int(f.key("attention.head_count")),
        num_key_value_heads=int(f.key("attention.head_count_kv", 1)),
        head_dim=head_dim,
        q_lora_rank=int(f.key("attention.q_lora_rank")),
        num_experts_per_tok=int(f.key("expert_used_count")),
        n_routed_experts=int(f.key("expert_count")),
        n_shared_experts=int(f.key("expert_shared_count")),
        norm_topk_prob=bool(f.key("expert_weights_norm")),
        routed_scaling_factor=_f32(f.key("expert_weights_scale")),
        rope_theta=_f32(f.key("rope.freq_base")),
        compress_rope_theta=_f32(f.key("attention.compress_rope_freq_base")),
        partial_rotary_factor=rope_dim / head_dim,
        layer_types=[DS4_LAYER_TYPE[r] for r in ratios],
        mlp_layer_types=["hash_moe" if i < n_hash else "moe" for i in range(n_layer)],
        hc_mult=int(f.key("hyper_connection.count")),
        hc_sinkhorn_iters=int(f.key("hyper_connection.sinkhorn_iterations")),
        hc_eps=_f32(f.key("hyper_connection.epsilon")),
        swiglu_limit=float(clamp),
        sliding_window=int(f.key("attention.sliding_window")),
        o_groups=int(f.key("attention.output_group_count")),
        o_lora_rank=int(f.key("attention.output_lora_rank")),
        index_n_heads=int(f.key("attention.indexer.head_count")),
        index_head_dim=int(f.key("attention.indexer.key_length")),
        index_topk=int(f.key("attention.indexer.top_k")),
        rms_norm_eps=_f32(f.key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(f.key("context_length")),
        num_nextn_predict_layers=0,
        tie_word_embeddings=False,
    )
    cfg["rope_parameters"] = {
        "main": {"rope_type": "default", "rope_theta": cfg["rope_theta"], "partial_rotary_factor": rope_dim / head_dim},
        "compress": {**compress_rope, "rope_theta": cfg["compress_rope_theta"],
                     "partial_rotary_factor": rope_dim / head_dim},
    }
    sd = {hf: f.tensor(g) for g, hf in DS4_GLOBAL.items()}
    for i in range(n_layer):
        table = dict(DS4_LAYER)
        if ratios[i]:
            table.update(DS4_COMPRESSOR)
        if ratios[i] == 4:
            table.update(DS4_INDEXER)
        for g, hf in table.items():
            sd[f"model.layers.{i}.{hf}"] = f.tensor(f"blk.{i}.{g}")
        if i < n_hash:
            sd[f"model.layers.{i}.mlp.gate.tid2eid"] = f.tensor(f"blk.{i}.ffn_gate_tid2eid.weight").astype(np.int64)
        else:
            sd[f"model.layers.{i}.mlp.gate.e_score_correction_bias"] = f.tensor(f"blk.{i}.exp_probs_b.bias")
        gate, up = f.tensor(f"blk.{i}.ffn_gate_exps.weight"), f.tensor(f"blk.{i}.ffn_up_exps.weight")  # [E, I, D]
        sd[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)          # [E, 2I, D]
        sd[f"model.layers.{i}.mlp.experts.down_proj"] = f.tensor(f"blk.{i}.ffn_down_exps.weight")      # [E, D, I]
    return "deepseek_v4", cfg, sd


# ------------------------------------------------------------------------------------------------- qwen4exp

QW4_LAYER = {                        # GGUF (after blk.{i}.) -> transformers (after model.layers.{i}.), "+1" gammas
    "hc_attn_norm.weight": ("attn_hyper_connection.hc_norm.weight", True),
    "hc_attn_down.weight": ("attn_hyper_connection.input_mix_weight_down.weight", False),
    "hc_attn_up.weight": ("attn_hyper_connection.input_mix_weight_up.weight", False),
    "hc_attn_inject.weight": ("attn_hyper_connection.block_inject_weight.weight", False),
    "hc_ffn_norm.weight": ("mlp_hyper_connection.hc_norm.weight", True),
    "hc_ffn_down.weight": ("mlp_hyper_connection.input_mix_weight_down.weight", False),
    "hc_ffn_up.weight": ("mlp_hyper_connection.input_mix_weight_up.weight", False),
    "hc_ffn_inject.weight": ("mlp_hyper_connection.block_inject_weight.weight", False),
    "ffn_gate_inp.weight": ("mlp.gate.weight", False),
    "ffn_gate_shexp.weight": ("mlp.shared_expert.gate_proj.weight", False),
    "ffn_up_shexp.weight": ("mlp.shared_expert.up_proj.weight", False),
    "ffn_down_shexp.weight": ("mlp.shared_expert.down_proj.weight", False),
    "ffn_gate_inp_shexp.weight": ("mlp.shared_expert_gate.weight", False),
}
QW4_ATTN = {
    "attn_q.weight": ("self_attn.q_proj.weight", False),
    "attn_k.weight": ("self_attn.k_proj.weight", False),
    "attn_v.weight": ("self_attn.v_proj.weight", False),
    "attn_output.weight": ("self_attn.o_proj.weight", False),
    "attn_q_norm.weight": ("self_attn.q_norm.weight", True),
    "attn_k_norm.weight": ("self_attn.k_norm.weight", True),
    "indexer.q_norm.weight": ("self_attn.indexer.q_layernorm.weight", True),
    "indexer.k_norm.weight": ("self_attn.indexer.k_layernorm.weight", True),
}
QW4_PLE = {
    "ple_key.weight": ("ple.key_proj.weight", False),
    "ple_value.weight": ("ple.value_proj.weight", False),
    "ple_norm_key.weight": ("ple.norm_key.weight", True),
    "ple_norm_query.weight": ("ple.norm_query.weight", True),
    "ple_norm_conv.weight": ("ple.norm_conv.weight", True),
}
QW4_GLOBAL = {
    "token_embd.weight": ("model.embed_tokens.weight", False),
    "output_hc_norm.weight": ("model.hyper_connection_mixer.hc_norm.weight", True),
    "output_hc_down.weight": ("model.hyper_connection_mixer.input_mix_weight_down.weight", False),
    "output_hc_up.weight": ("model.hyper_connection_mixer.input_mix_weight_up.weight", False),
}


def _minus_one(a: np.ndarray) -> np.ndarray:
    """Undo the converter's `data_torch + 1` on a zero-centred gamma (qwen.py:396, qwen4exp.py:133-136)."""
    return (a.astype(np.float32) - np.float32(1)).astype(np.float32)


# The tensors llama.cpp reads by element count, not by the file's shape (qwen4exp.cpp:164, 210, 214, 247-249:
# `{ n_embd, hc }, TENSOR_ALLOW_RESHAPE`; :256 `ffn_gate_inp_shexp` `{ n_embd }`, a trailing 1 allowed): the
# converter writes the per-stream gammas flat [hc * D] and the shared-expert gate [1, D], a file may equally hold
# [hc, D] and [D] (synth's tiny preset does), and llama.cpp runs both the same. -> (shape transformers' module has).
QW4_READ_AS = {
    "hc_attn_norm.weight": lambda hc, D: (hc * D,), "hc_ffn_norm.weight": lambda hc, D: (hc * D,),
    "output_hc_norm.weight": lambda hc, D: (hc * D,), "ple_norm_key.weight": lambda hc, D: (hc * D,),
    "ple_norm_query.weight": lambda hc, D: (hc * D,), "ple_norm_conv.weight": lambda hc, D: (hc * D,),
    "ffn_gate_inp_shexp.weight": lambda hc, D: (1, D),
}


def _qw4_tensor(f: _File, name: str, hc: int, D: int) -> np.ndarray:
    """A qwen4exp tensor in the shape the authors' module holds: the QW4_READ_AS ones reshaped as llama.cpp
    reshapes them (same element order); any element count other than the one llama.cpp reads is refused."""
    a = f.tensor(name)
    short = name.split(".", 2)[-1] if name.startswith("blk.") else name
    if short not in QW4_READ_AS:
        return a
    want = QW4_READ_AS[short](hc, D)
    if a.size != int(np.prod(want)):
        raise OracleError(f"{f.path}: {name} has shape {list(a.shape)} ({a.size} values); llama.cpp and "
                          f"transformers read {int(np.prod(want))} ({list(want)})")
    return a.reshape(want)


def _qwen4exp(f: _File) -> tuple[str, dict, dict]:
    n_layer = int(f.key("block_count"))
    D = int(f.key("embedding_length"))
    hc = int(f.key("hyper_connection.count"))
    head_dim = int(f.key("attention.key_length"))
    recurrent = f.key("attention.recurrent_layers", None)
    if recurrent is None:                              # llama.cpp's default (qwen4exp.cpp:128-136): every k-th full
        k = int(f.key("full_attention_interval", 4))
        recurrent = [(i + 1) % k != 0 for i in range(n_layer)]
    recurrent = [bool(x) for x in recurrent][:n_layer]
    ratios = [int(r) for r in f.key("attention.compress_ratios", [0] * n_layer)][:n_layer]
    attn_ratios = {r for r, rec in zip(ratios, recurrent) if not rec}
    if len(attn_ratios) != 1 or 0 in attn_ratios:
        raise OracleError(f"{f.path}: qwen4_exp needs one QSA compress ratio > 0 on every attention layer, "
                          f"the file has {sorted(attn_ratios)} (qwen4exp.attention.compress_ratios)")
    n_k, n_v = int(f.key("ssm.group_count")), int(f.key("ssm.time_step_rank"))
    dk, dv = int(f.key("ssm.state_size")), int(f.key("ssm.inner_size")) // n_v
    per_k = n_v // n_k
    sections = [int(s) for s in f.key("rope.dimension_sections")][:3]
    V = int(f.key("vocab_size", 0)) or f.g.tensors["token_embd.weight"].ne[1]
    cfg = dict(
        vocab_size=V, hidden_size=D, num_hidden_layers=n_layer,
        num_attention_heads=int(f.key("attention.head_count")),
        num_key_value_heads=int(f.key("attention.head_count_kv")),
        head_dim=head_dim,
        rms_norm_eps=_f32(f.key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(f.key("context_length")),
        rope_parameters={"rope_type": "default", "rope_theta": _f32(f.key("rope.freq_base")),
                         "partial_rotary_factor": int(f.key("rope.dimension_count")) / head_dim,
                         "mrope_section": sections, "mrope_interleaved": True},
        linear_conv_kernel_dim=int(f.key("ssm.conv_kernel")),
        linear_key_head_dim=dk, linear_value_head_dim=dv, linear_num_key_heads=n_k, linear_num_value_heads=n_v,
        moe_intermediate_size=int(f.key("expert_feed_forward_length")),
        shared_expert_intermediate_size=int(f.key("expert_shared_feed_forward_length")),
        num_experts=int(f.key("expert_count")), num_experts_per_tok=int(f.key("expert_used_count")),
        layer_types=["linear_attention" if r else "indexed_attention" for r in recurrent],
        hc_count=hc, hc_lowrank=int(f.key("hyper_connection.low_rank")),
        indexer_n_heads=int(f.key("attention.indexer.head_count")), indexer_kv_heads=1,
        indexer_head_dim=int(f.key("attention.indexer.key_length")),
        indexer_budget=int(f.key("attention.indexer.top_k")), indexer_compress_ratio=attn_ratios.pop(),
        output_gate_type="sigmoid",                  # qwen4exp.cpp L479-489: o = rmsnorm(o) * w * sigmoid(z)
        hidden_act="silu", norm_topk_prob=True, tie_word_embeddings=False,
    )
    sd = {hf: (_minus_one(_qw4_tensor(f, g, hc, D)) if one else _qw4_tensor(f, g, hc, D))
          for g, (hf, one) in QW4_GLOBAL.items()}
    sd["lm_head.weight"] = f.tensor("output.weight" if f.has("output.weight") else "token_embd.weight")

    ple_layers = [int(x) for x in f.key("ple.layers", [])]
    if ple_layers:
        N, hpn = int(f.key("ple.ngram_size")), int(f.key("ple.heads_per_ngram"))
        vocab = [int(x) for x in f.key("ple.head_vocab_sizes")]
        table = f.tensor("per_layer_token_embd.weight")                     # [rows, ple_head_dim]
        cfg.update(ple_layer_ids=[i + 1 for i in ple_layers], ngram_size=N, heads_per_ngram=hpn,
                   ple_embed_dim=(N - 1) * hpn * table.shape[1], ple_conv_kernel_size=int(f.key("ple.conv_kernel")),
                   eos_token_id=int(f.key("ple.eos_token_id")),
                   # not in the file: chosen so the module builds the file's table (the first head's size is the
                   # first prime >= the base; padding to the file's row count); the file's values are loaded
                   ngram_vocab_size_base=vocab[0], make_ngram_vocab_size_divisible_by=table.shape[0],
                   split_ngram_parts=1)
    for i in range(n_layer):
        pre = f"model.layers.{i}."
        table = dict(QW4_LAYER)
        if not recurrent[i]:
            table.update(QW4_ATTN)
        if i in ple_layers:
            table.update(QW4_PLE)
        for g, (hf, one) in table.items():
            a = _qw4_tensor(f, f"blk.{i}.{g}", hc, D)
            sd[pre + hf] = _minus_one(a) if one else a
        gate, up = f.tensor(f"blk.{i}.ffn_gate_exps.weight"), f.tensor(f"blk.{i}.ffn_up_exps.weight")  # [E, I, D]
        sd[pre + "mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)                        # [E, 2I, D]
        sd[pre + "mlp.experts.down_proj"] = f.tensor(f"blk.{i}.ffn_down_exps.weight")                    # [E, D, I]
        if not recurrent[i]:
            q, k = f.tensor(f"blk.{i}.indexer.q_proj.weight"), f.tensor(f"blk.{i}.indexer.k_proj.weight")
            sd[pre + "self_attn.indexer.index_qk_proj.weight"] = np.concatenate([q, k], axis=0)
        else:
            la = pre + "linear_attn."
            qkv = f.tensor(f"blk.{i}.attn_qkv.weight")                       # [2*n_k*dk + n_v*dv, D]
            qk = 2 * n_k * dk
            sd[la + "in_proj_qkv.weight"] = np.concatenate([qkv[:qk], _tiled_to_grouped(qkv[qk:], 0, n_k, per_k, dv)])
            sd[la + "in_proj_z.weight"] = _tiled_to_grouped(f.tensor(f"blk.{i}.attn_gate.weight"), 0, n_k, per_k, dv)
            sd[la + "in_proj_a.weight"] = _tiled_to_grouped(f.tensor(f"blk.{i}.ssm_alpha.weight"), 0, n_k, per_k, 1)
            sd[la + "in_proj_b.weight"] = _tiled_to_grouped(f.tensor(f"blk.{i}.ssm_beta.weight"), 0, n_k, per_k, 1)
            sd[la + "dt_bias"] = _tiled_to_grouped(f.tensor(f"blk.{i}.ssm_dt.bias"), 0, n_k, per_k, 1)
            a = _tiled_to_grouped(f.tensor(f"blk.{i}.ssm_a"), 0, n_k, per_k, 1)   # A = -exp(A_log)
            sd[la + "A_log"] = np.log(-a.astype(np.float64)).astype(np.float32)
            conv = f.tensor(f"blk.{i}.ssm_conv1d.weight")                    # [C, K]
            conv = np.concatenate([conv[:qk], _tiled_to_grouped(conv[qk:], 0, n_k, per_k, dv)])
            sd[la + "conv1d.weight"] = conv[:, None, :]                      # [C, 1, K]
            sd[la + "norm.weight"] = f.tensor(f"blk.{i}.ssm_norm.weight")
            sd[la + "out_proj.weight"] = _tiled_to_grouped(f.tensor(f"blk.{i}.ssm_out.weight"), 1, n_k, per_k, dv)
        if i in ple_layers:
            pe = pre + "ple."
            sd[pe + "conv1d.weight"] = f.tensor(f"blk.{i}.ple_conv1d.weight")[:, None, :]   # [C, K] -> [C, 1, K]
            sd[pe + "ple_embedding.ngram_embedding.weight"] = f.tensor("per_layer_token_embd.weight")
            for key, hf in (("ple.layer_multipliers", "layer_multipliers"), ("ple.head_offsets", "ngram_heads_offsets"),
                            ("ple.head_vocab_sizes", "ngram_heads_vocab_sizes")):
                u64 = np.array([int(x) for x in f.key(key)], dtype=np.uint64)      # GGUF u64 -> the model's int64
                sd[pe + "ple_embedding." + hf] = u64.astype(np.int64)
    return "qwen4_exp_text", cfg, sd


# ------------------------------------------------------------------------------------------------ glm5-next

GLM5N_LAYER = {                      # GGUF (after blk.{i}.) -> transformers (after model.language_model.layers.{i}.)
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn.weight": "attn_hc.fn", "hc_attn_base.weight": "attn_hc.base", "hc_attn_scale.weight": "attn_hc.scale",
    "hc_ffn_fn.weight": "ffn_hc.fn", "hc_ffn_base.weight": "ffn_hc.base", "hc_ffn_scale.weight": "ffn_hc.scale",
}
GLM5N_KDA = {
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ssm_beta.weight": "self_attn.b_proj.weight", "ssm_dt.bias": "self_attn.forget_gate.dt_bias",
    "ssm_f_a.weight": "self_attn.forget_gate.f_a_proj.weight",
    "ssm_f_b.weight": "self_attn.forget_gate.f_b_proj.weight",
    "ssm_g_a.weight": "self_attn.g_a_proj.weight", "ssm_g_b.weight": "self_attn.g_b_proj.weight",
    "ssm_norm.weight": "self_attn.o_norm.weight",
}
GLM5N_MLA = {
    "attn_q_a.weight": "self_attn.q_a_proj.weight", "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight", "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight", "attn_output.weight": "self_attn.o_proj.weight",
}
GLM5N_INDEXER = {                    # "full" indexer layers only ("shared" ones reuse the previous full layer's)
    "indexer_compressor_ape.weight": "self_attn.indexer.index_kpool_compress_ape",
    "indexer_compressor_gate.weight": "self_attn.indexer.index_kpool_compress_gate",
    "indexer.k_norm.weight": "self_attn.indexer.k_norm.weight", "indexer.k_norm.bias": "self_attn.indexer.k_norm.bias",
    "indexer.proj.weight": "self_attn.indexer.weights_proj.weight",
    "indexer.attn_k.weight": "self_attn.indexer.wk.weight",
    "indexer.attn_q_b.weight": "self_attn.indexer.wq_b.weight",
}
GLM5N_DENSE = {"ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
               "ffn_down.weight": "mlp.down_proj.weight"}
GLM5N_MOE = {
    "ffn_gate_inp.weight": "mlp.gate.weight", "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
}
# the vision tower the text model is built with (its weights are not in a text GGUF and are not used on text)
GLM5N_VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, projection_intermediate_size=32)


def _glm5_next(f: _File) -> tuple[str, dict, dict]:
    """`conversion/glm.py:407-600` inverted: KDA layers (head_count_kv 0) and nope-MLA layers under the k-pool DSA
    indexer, mHC streams, dense then MoE FFNs."""
    n_layer = int(f.key("block_count"))
    kv_heads = f.key("attention.head_count_kv")
    linear = [int(h) == 0 for h in (kv_heads if isinstance(kv_heads, list) else [kv_heads] * n_layer)][:n_layer]
    full = [bool(x) for x in f.key("attention.indexer.types", [True] * n_layer)][:n_layer]
    for i in range(n_layer):            # the authors pass a selection to the next layer only (modeling_glm5_next.py:
        if not linear[i] and not full[i] and (i == 0 or linear[i - 1] or not full[i - 1]):   # next_skip_topk)
            raise OracleError(f"{f.path}: MLA block {i} shares the indexer of an earlier block that is not the block "
                              f"right before it; llama.cpp shares across KDA blocks, the authors' glm5_next only from "
                              f"the previous block (attention.indexer.types): no transformers equivalent")
    H = int(f.key("attention.head_count"))
    if int(f.key("rope.dimension_count", 0)) != 0:
        raise OracleError(f"{f.path}: glm5_next's MLA is nope-only (rope.dimension_count 0)")
    nope, vdim = int(f.key("attention.key_length_mla")), int(f.key("attention.value_length_mla"))
    n_dense = int(f.key("leading_dense_block_count"))
    clamp = f.key("swiglu_clamp_exp", None)
    clamp = clamp[0] if isinstance(clamp, list) else clamp
    V = int(f.key("vocab_size", 0)) or f.g.tensors["token_embd.weight"].ne[1]
    text = dict(
        vocab_size=V, hidden_size=int(f.key("embedding_length")), intermediate_size=int(f.key("feed_forward_length")),
        moe_intermediate_size=int(f.key("expert_feed_forward_length")), num_hidden_layers=n_layer,
        num_attention_heads=H, num_key_value_heads=H, n_shared_experts=int(f.key("expert_shared_count")),
        n_routed_experts=int(f.key("expert_count")), num_experts_per_tok=int(f.key("expert_used_count")),
        n_group=int(f.key("expert_group_count", 1)), topk_group=int(f.key("expert_group_used_count", 1)),
        routed_scaling_factor=_f32(f.key("expert_weights_scale")), norm_topk_prob=bool(f.key("expert_weights_norm")),
        kv_lora_rank=int(f.key("attention.kv_lora_rank")), q_lora_rank=int(f.key("attention.q_lora_rank")),
        qk_rope_head_dim=0, qk_nope_head_dim=nope, v_head_dim=vdim,
        rms_norm_eps=_f32(f.key("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(f.key("context_length")),
        index_topk=int(f.key("attention.indexer.top_k")), index_head_dim=int(f.key("attention.indexer.key_length")),
        index_n_heads=int(f.key("attention.indexer.head_count")), index_kpool=int(f.key("attention.indexer.kpool")),
        index_kpool_always_select_tail=bool(f.key("attention.indexer.kpool_select_tail", True)),
        layer_types=["linear_attention" if lin else "indexed_attention" for lin in linear],
        indexer_types=["full" if x else "shared" for x in full],
        mlp_layer_types=["dense" if i < n_dense else "sparse" for i in range(n_layer)],
        linear_head_dim=int(f.key("kda.head_dim")), linear_num_heads=H,
        linear_conv_kernel_dim=int(f.key("ssm.conv_kernel")),
        linear_lower_bound=_f32(f.key("kda.gate_lower_bound")) if f"{f.arch}.kda.gate_lower_bound" in f.g.kv else None,
        hc_mult=int(f.key("hyper_connection.count")), hc_eps=_f32(f.key("hyper_connection.epsilon")),
        hc_sinkhorn_iters=int(f.key("hyper_connection.sinkhorn_iterations")),
        pad_token_id=None, tie_word_embeddings=False,
    )
    if clamp is not None:
        text["swiglu_limit"] = _f32(clamp)
    cfg = dict(text_config=text, vision_config=dict(GLM5N_VISION, out_hidden_size=text["hidden_size"]),
               tie_word_embeddings=False)
    root = "model.language_model."
    sd = {root + "embed_tokens.weight": f.tensor("token_embd.weight"),
          root + "norm.weight": f.tensor("output_norm.weight"), "lm_head.weight": f.tensor("output.weight")}
    for i in range(n_layer):
        pre = f"{root}layers.{i}."
        table = dict(GLM5N_LAYER)
        table.update(GLM5N_KDA if linear[i] else GLM5N_MLA)
        if not linear[i] and full[i]:
            table.update(GLM5N_INDEXER)
        table.update(GLM5N_DENSE if i < n_dense else GLM5N_MOE)
        for g, hf in table.items():
            sd[pre + hf] = f.tensor(f"blk.{i}.{g}")
        if i >= n_dense:
            gate, up = f.tensor(f"blk.{i}.ffn_gate_exps.weight"), f.tensor(f"blk.{i}.ffn_up_exps.weight")  # [E, I, D]
            sd[pre + "mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)                  # [E, 2I, D]
            sd[pre + "mlp.experts.down_proj"] = f.tensor(f"blk.{i}.ffn_down_exps.weight")              # [E, D, I]
        if linear[i]:
            a = f.tensor(f"blk.{i}.ssm_a").reshape(-1)                              # A = -exp(A_log)  [H]
            sd[pre + "self_attn.forget_gate.A_log"] = np.log(-a.astype(np.float64)).astype(np.float32)
            # [1, C, 1, K] each as the converter writes them, [C, K] / [C, 1, K] from other writers: llama.cpp reads
            # any of them as [C, K] (one kernel row per channel)
            convs = [f.tensor(f"blk.{i}.ssm_conv1d_{x}.weight") for x in "qkv"]
            sd[pre + "self_attn.conv1d.weight"] = np.concatenate([c.reshape(-1, 1, c.shape[-1]) for c in convs])
        else:
            k_b = f.tensor(f"blk.{i}.attn_k_b.weight")                              # [H, C, nope] (converter: k_b^T)
            v_b = f.tensor(f"blk.{i}.attn_v_b.weight")                              # [H, v, C]
            kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)             # [H, nope + v, C]
            sd[pre + "self_attn.kv_b_proj.weight"] = kv_b.reshape(H * (nope + vdim), -1)
    return "glm5_next", cfg, sd


MAPPERS = {"deepseek4": _deepseek4, "qwen4exp": _qwen4exp, "glm5-next": _glm5_next}


def hf_checkpoint(path: str | os.PathLike) -> tuple[str, dict, dict]:
    """-> (transformers model_type, config kwargs, state dict {transformers name: NumPy array}) for a GGUF file:
    the inverse of llama.cpp's converter, without torch. Every tensor of the file must be used."""
    f = _File(path)
    if f.arch not in MAPPERS:
        raise UnsupportedArchError(f"{f.path}: no transformers mapping for arch {f.arch!r} "
                                   f"(mapped: {', '.join(sorted(MAPPERS))})")
    model_type, cfg, sd = MAPPERS[f.arch](f)
    unused = sorted(set(f.g.tensors) - f.used)
    if unused:
        raise OracleError(f"{f.path}: tensors the transformers mapping does not place: {unused[:6]}")
    return model_type, cfg, sd


def build_config(model_type: str, cfg: dict):
    """-> (transformers config, model class) for `hf_checkpoint`'s model type and config kwargs; eager attention and
    the eager loop over experts (what runs in float64 on CPU)."""
    import transformers
    if model_type == "deepseek_v4":
        config = transformers.DeepseekV4Config(**cfg)
        cls = transformers.DeepseekV4ForCausalLM
    elif model_type == "glm5_next":
        from transformers.models.glm5_next import configuration_glm5_next, modeling_glm5_next
        config = configuration_glm5_next.Glm5NextConfig(**cfg)
        config.text_config._attn_implementation = "eager"
        config.text_config._experts_implementation = "eager"
        cls = modeling_glm5_next.Glm5NextForConditionalGeneration
    elif model_type == "qwen4_exp_text":
        from transformers.models.qwen4_exp import configuration_qwen4_exp, modeling_qwen4_exp
        config = configuration_qwen4_exp.Qwen4ExpTextConfig(**cfg)
        cls = modeling_qwen4_exp.Qwen4ExpForCausalLM
    else:                                                               # pragma: no cover (MAPPERS names these)
        raise UnsupportedArchError(model_type)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"            # the loop over experts (grouped_mm has no float64)
    return config, cls


UNUSED_ON_TEXT = ("model.visual.",)      # a vision tower the text GGUF has no weights for (glm5_next), not run on text


def _torch():
    """torch, with transformers importable; an OracleError naming the extra when either is missing."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        raise OracleError(f"the transformers oracle needs torch and transformers ({e}): "
                          f"pip install -e '.[hf]'") from None
    return torch


def hf_model(path: str | os.PathLike, *, dtype: str = "float64"):
    """The authors' model (transformers, CPU torch) holding a GGUF file's weights, in eval mode."""
    torch = _torch()
    model_type, cfg, sd = hf_checkpoint(path)
    config, cls = build_config(model_type, cfg)
    torch.manual_seed(0)
    model = cls(config)                   # built at the config's shapes, then every tensor replaced by the file's
    want = {k: v for k, v in model.state_dict().items() if not k.startswith(UNUSED_ON_TEXT)}
    missing = sorted(set(want) - set(sd))
    if missing:
        raise OracleError(f"{os.fspath(path)}: transformers' {cls.__name__} needs {missing[:6]}, "
                          f"not mapped from the file")
    extra = sorted(set(sd) - set(want))
    if extra:
        raise OracleError(f"{os.fspath(path)}: mapped tensors {extra[:6]} are not in transformers' {cls.__name__}")
    tdtype = getattr(torch, dtype)
    with torch.no_grad():
        for name, a in sd.items():
            t = torch.from_numpy(np.ascontiguousarray(a))
            t = t.to(tdtype) if t.dtype.is_floating_point else t
            _assign(model, name, t)
    model = model.to(tdtype) if tdtype != torch.float32 else model
    return model.eval(), config


def _assign(model, name: str, t) -> None:
    """Put `t` at `name`, replacing the parameter or buffer (its shape may differ from the config's guess)."""
    import torch
    mod_name, _, leaf = name.rpartition(".")
    mod = model.get_submodule(mod_name)
    if leaf in mod._parameters:
        mod._parameters[leaf] = torch.nn.Parameter(t, requires_grad=False)
    elif leaf in mod._buffers:
        mod._buffers[leaf] = t
    else:                                                              # pragma: no cover
        raise OracleError(f"transformers module {mod_name!r} has no parameter or buffer {leaf!r}")


def decoder_layers(model):
    """The decoder layers of a mapped model (glm5_next keeps them under its language model)."""
    inner = model.model
    return getattr(inner, "language_model", inner).layers


MODES = ("exact", "llamacpp")
QUANTIZED_FREE = ("F32", "F16", "BF16", "I8", "I16", "I32", "I64", "F64")


def round_like_llamacpp(model, path: str | os.PathLike) -> list[str]:
    """Make the routed experts of `model` see their inputs as llama.cpp's CPU backend does: rounded to the
    weight's partner type (`quant.llamacpp.round_activations`; MXFP4 -> Q8_0 blocks of 32) before the gate/up
    product and before the down product, as `ggml_mul_mat` with a quantized weight computes.
    Returns the GGUF tensors whose products are rounded. The authors' code multiplies in float; this is the
    one step it lacks to reproduce llama.cpp (measured: docs/oracles.md). Quantized weights outside the routed
    experts are refused (not emulated here)."""
    torch = _torch()
    from quant.formats import GGMLType
    from quant.llamacpp import round_activations
    from ..gguf import open_gguf
    g = open_gguf(path)
    rounded, other = [], []
    for name, ti in g.tensors.items():
        if ti.type.name in QUANTIZED_FREE:
            continue
        (rounded if name.endswith(("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"))
         else other).append(name)
    if other:
        raise OracleError(f"{g.path}: llama.cpp's rounding is emulated for the routed experts only; "
                          f"quantized {other[:4]} are not")

    def rounder(gtype):
        def rnd(t):
            y = round_activations(t.detach().to(torch.float32).numpy(), gtype)
            return torch.from_numpy(np.asarray(y, dtype=np.float32)).to(t.dtype)
        return rnd

    for il, layer in enumerate(decoder_layers(model)):
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        up, down = f"blk.{il}.ffn_up_exps.weight", f"blk.{il}.ffn_down_exps.weight"
        if experts is None or up not in rounded:
            continue
        if not hasattr(experts, "_apply_gate"):
            raise OracleError(f"{g.path}: {type(experts).__name__} has no `_apply_gate` to round the down input at")
        r_in, r_mid = rounder(GGMLType(int(g.tensors[up].type))), rounder(GGMLType(int(g.tensors[down].type)))
        experts.register_forward_pre_hook(lambda m, args, r=r_in: (r(args[0]),) + tuple(args[1:]))
        experts._apply_gate = (lambda f, r: (lambda gate_up: r(f(gate_up))))(experts._apply_gate, r_mid)
    return rounded


def hf_forward(path: str | os.PathLike, tokens, *, n_ctx: int | None = None, dtype: str = "float64",
               mode: str = "exact") -> HFResult:
    """Run the authors' code on `tokens` (one sequence, one prefill, no cache) with the file's weights.
    `n_ctx`: refuse a longer token list (as the llama.cpp oracle's context would). `dtype`: the torch dtype the
    model runs in (float64 by default: the oracle's own rounding out of the way; float32 as llama.cpp runs).
    `mode`: "exact" (the authors' code as published: quantized experts multiplied in float) or "llamacpp"
    (their inputs rounded as llama.cpp's CPU backend rounds them, `round_like_llamacpp`)."""
    torch = _torch()
    if mode not in MODES:
        raise OracleError(f"hf_forward: mode {mode!r} is not one of {MODES}")
    tokens = [int(t) for t in tokens]
    if n_ctx is not None and len(tokens) > n_ctx:
        raise OracleError(f"{len(tokens)} tokens do not fit n_ctx = {n_ctx}")
    model, config = hf_model(path, dtype=dtype)
    vocab = config.get_text_config().vocab_size
    bad = [t for t in tokens if not 0 <= t < vocab]
    if bad:
        raise OracleError(f"{os.fspath(path)}: token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
    if mode == "llamacpp":
        round_like_llamacpp(model, path)
    ids = torch.tensor([tokens], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False, output_hidden_states=True)
    hidden = [h[0].to(torch.float64).numpy() for h in (out.hidden_states or ())]
    names = hidden_names(_File(path).arch, config.get_text_config().num_hidden_layers)
    return HFResult(logits=out.logits[0].to(torch.float64).numpy(), hidden=hidden, config=config, names=names)
