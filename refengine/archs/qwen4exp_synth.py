"""The synthetic `qwen4exp` plans (Qwen3.8-Flash-Next): gated DeltaNet + QSA attention, gated residual streams,
hashed n-gram embeddings on one layer, MoE with a gated shared expert.

    write_synth("qwen4exp", "q.gguf", preset="tiny", wtype="Q4_K")

Names, shapes and keys are the ones llama.cpp's qwen4exp loader asks for (src/models/qwen4exp.cpp
load_arch_hparams / load_arch_tensors, llama-cpp-python 0.3.36). Dimension letters as in qwen3next_synth, and
P streams (hc), Lr the stream mixer's rank, Hi / di / B / r the QSA indexer's heads, head dim, budget and block,
N / G / Kp the n-gram size, heads per order and conv kernel.

The n-gram hash constants are derived as the authors' config derives them (transformers 5.23
`Qwen4ExpTextNGramEmbedding`), so a converted file and this one hold the same kind of numbers: per head the
(k+1)-th prime after `ngram_vocab_base - 1` (k the head's global index), offsets their running sum, the table
padded to a multiple of `ngram_divisor` rows; multipliers odd, from splitmix64 of the seed, bounded so that
token * multiplier stays below 2^63 (the int64 and uint64 hashes then agree).

Presets (a preset's `ple_hole` writes the n-gram table as a hole of a sparse file: zeros that cost no disk):
- `tiny`  4 blocks: GDN, QSA, GDN + n-gram (PLE), QSA (full_attention_interval 2); r = 4, budget 8 tokens, so a
          query past 12 tokens drops blocks; EOS id 3 (in the test token lists: the hash resets inside them).
          all_optional: `attention.recurrent_layers` = GDN, QSA, GDN, GDN (and YaRN), and every optional tensor
          the loader accepts: the generic pass's `.scale` / `.input_scale` of the GDN projections (attn_qkv,
          attn_gate, ssm_beta, ssm_alpha, ssm_out), of attn_q/k/v/output, of the experts (per expert) and the
          shared experts, and attn_q/k/v.bias (create_tensor_qkv). The graph multiplies by every `.scale`
          (build_lora_mm(w, x, w_s), qwen4exp.cpp:469-986; build_moe_ffn / build_ffn :997-1022) and reads no
          `.input_scale` nor the q/k/v biases (qwen4exp.cpp:797-811).
- `qwen3.8-flash-next`  the published shapes (cited beside it), 48 blocks; `layers=N` keeps the first N (block 0
          is the n-gram layer, block 3 the first QSA one).
"""
from __future__ import annotations

import math

from .. import synthplan as sp
from ..synthplan import TensorPlan

ARCH = "qwen4exp"

_TINY = dict(n_vocab=256, n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, n_rot=16,
             rope_sections=(3, 3, 2, 0), n_ff=512, n_ctx=512, rope_base=1e7, eps=1e-6,
             n_expert=8, n_expert_used=2, n_ff_exp=128, n_ff_shexp=128,
             ssm_k_heads=2, ssm_v_heads=4, ssm_state=32, ssm_conv=4, full_attn_interval=2,
             hc=4, hc_lr=16, idx_heads=2, idx_dim=16, idx_top_k=8, compress_ratio=4,
             ple_layer=2, ngram=3, heads_per_ngram=2, ple_conv=4, ple_eos=3, ngram_vocab_base=100,
             ngram_divisor=128, ple_seed=1234, ple_hole=False)

PRESETS: dict[str, dict] = {
    "tiny": _TINY,
    # Qwen3.8-Flash-Next (Qwen/Qwen3.8-Flash-Next): the qwen4exp keys of a converted GGUF's metadata as listed on
    # ollama.com (aiconjured/qwen3.8-flash-next-gsq-rco-gguf-mtp, blob 8087dbb39fc7): block_count 49 with
    # nextn_predict_layers 1 (48 trunk blocks, the MTP block not written here), embedding_length 2560,
    # attention.head_count 24 / head_count_kv 2, key_length = value_length 256, rope.dimension_count 64,
    # rope.dimension_sections [11, 11, 10, 0], rope.freq_base 1e7, context_length 262144, rms eps 1e-6,
    # expert_count 512, expert_used_count 10, expert_feed_forward_length 640, expert_shared_feed_forward_length
    # 640, full_attention_interval 4, hyper_connection.count 4, low_rank 320, attention.indexer.head_count 4,
    # key_length 128, top_k 2048, compress_ratios [0, 0, 0, 4, ...], ssm.conv_kernel 4, ssm.group_count 16,
    # ssm.inner_size 6144. Public descriptions agree (ms-swift's best-practice page: 3 GDN of every 4 layers,
    # QSA budget 2048 tokens, 4 residual branches, a 51B n-gram table). Not in that excerpt, taken from
    # transformers 5.23's Qwen4ExpTextConfig defaults: vocab_size 248320, ngram_size 3, heads_per_ngram 8,
    # ngram_vocab_size_base 20_000_000, make_ngram_vocab_size_divisible_by 128, ple_conv_kernel_size 4, seed
    # 1234, ple_embed_dim = hidden_size (so 16 heads of 160); ssm.state_size 128 (Qwen3-Next's linear head
    # dim: 6144 / 128 = 48 value heads); the PLE layer (one; which one is not in the excerpt): block 0 here;
    # ple.eos_token_id 248046 (assumed: <|im_end|>, ten below image_token_id 248056 as in the Qwen3-VL vocabulary;
    # NVIDIA NeMo AutoModel's Qwen3_8_FlashNextConfig lists image_token_id 248056).
    # The 16 hash heads' primes after 2e7 sum to 320M rows x 160 = 51.2B parameters (the published 51B): the
    # table is written as a hole of a sparse file (zeros, no disk blocks). Too big to write whole: use layers=N.
    "qwen3.8-flash-next": dict(
        n_vocab=248320, n_embd=2560, n_layer=48, n_head=24, n_head_kv=2, head_dim=256, n_rot=64,
        rope_sections=(11, 11, 10, 0), n_ff=640, n_ctx=262144, rope_base=1e7, eps=1e-6,
        n_expert=512, n_expert_used=10, n_ff_exp=640, n_ff_shexp=640,
        ssm_k_heads=16, ssm_v_heads=48, ssm_state=128, ssm_conv=4, full_attn_interval=4,
        hc=4, hc_lr=320, idx_heads=4, idx_dim=128, idx_top_k=2048, compress_ratio=4,
        ple_layer=0, ngram=3, heads_per_ngram=8, ple_conv=4, ple_eos=248046, ngram_vocab_base=20_000_000,
        ngram_divisor=128, ple_seed=1234, ple_hole=True),
}


# ---------------------------------------------------------------- the n-gram hash constants

_M64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def ngram_multipliers(n_vocab: int, n: int, ple_index: int, seed: int) -> list[int]:
    """N odd multipliers below (2^63-1) / n_vocab, seeded by seed + 10007 * ple_index."""
    half = max(1, ((2**63 - 1) // max(n_vocab, 1)) // 2)
    base = seed + 10007 * ple_index
    return [2 * (_splitmix64((base + 0x9E3779B97F4A7C15 * (i + 1)) & _M64) % half) + 1 for i in range(n)]


def _is_prime(v: int) -> bool:
    if v < 2 or v % 2 == 0:
        return v == 2
    return all(v % d for d in range(3, math.isqrt(v) + 1, 2))


def ngram_heads(p: dict) -> tuple[list[int], list[int], int]:
    """(vocab sizes, offsets, padded rows) of the (N-1)*G hash heads of the one PLE layer."""
    sizes, prime = [], p["ngram_vocab_base"] - 1
    for _ in range((p["ngram"] - 1) * p["heads_per_ngram"]):
        prime += 1
        while not _is_prime(prime):
            prime += 1
        sizes.append(prime)
    offsets = [sum(sizes[:h]) for h in range(len(sizes))]
    rows = -(-sum(sizes) // p["ngram_divisor"]) * p["ngram_divisor"]
    return sizes, offsets, rows


# ---------------------------------------------------------------- the plan

def is_recurrent(p: dict, *, all_optional: bool = False) -> list[bool]:
    """True = gated DeltaNet: every full_attn_interval-th block is full attention; with all_optional the
    written `attention.recurrent_layers` array, the last block made linear (the loader must follow the array)."""
    k = p["full_attn_interval"]
    kinds = [(i + 1) % k != 0 for i in range(p["n_layer"])]
    if all_optional and p["n_layer"] > 2:
        kinds[-1] = True
    return kinds


def compress_ratios(p: dict, *, all_optional: bool = False) -> list[int]:
    return [0 if recr else p["compress_ratio"] for recr in is_recurrent(p, all_optional=all_optional)]


def _streams(prefix: str, p: dict, inject: bool = True) -> list[TensorPlan]:
    D, P, Lr = p["n_embd"], p["hc"], p["hc_lr"]
    t = [TensorPlan(f"{prefix}_norm.weight", (P, D), "norm"),
         TensorPlan(f"{prefix}_down.weight", (Lr, P * D), "matrix", P * D),
         TensorPlan(f"{prefix}_up.weight", (P * D, Lr), "matrix", Lr)]
    if inject:
        t.append(TensorPlan(f"{prefix}_inject.weight", (P, P * D), "matrix", P * D))
    return t


def _gdn(il: int, p: dict, all_optional: bool = False) -> list[TensorPlan]:
    b, D = f"blk.{il}.", p["n_embd"]
    dk, hk, hv, kc = p["ssm_state"], p["ssm_k_heads"], p["ssm_v_heads"], p["ssm_conv"]
    conv = 2 * hk * dk + hv * dk
    t = _gdn_weights(b, D, dk, hv, kc, conv)
    if all_optional:
        for x in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out"):
            t += sp.extras(b + x, 0, bias=False)
    return t


def _gdn_weights(b: str, D: int, dk: int, hv: int, kc: int, conv: int) -> list[TensorPlan]:
    return [TensorPlan(b + "attn_qkv.weight", (conv, D), "matrix", D),
            TensorPlan(b + "attn_gate.weight", (hv * dk, D), "matrix", D),
            TensorPlan(b + "ssm_conv1d.weight", (conv, kc), "conv", kc),
            TensorPlan(b + "ssm_dt.bias", (hv,), "bias"),
            TensorPlan(b + "ssm_a", (hv,), "ssm_a"),
            TensorPlan(b + "ssm_beta.weight", (hv, D), "matrix", D),
            TensorPlan(b + "ssm_alpha.weight", (hv, D), "matrix", D),
            TensorPlan(b + "ssm_norm.weight", (dk,), "norm"),
            TensorPlan(b + "ssm_out.weight", (D, hv * dk), "matrix", hv * dk)]


def _attn(il: int, p: dict, all_optional: bool = False) -> list[TensorPlan]:
    b, D, K, H, Hkv = f"blk.{il}.", p["n_embd"], p["head_dim"], p["n_head"], p["n_head_kv"]
    t = _attn_weights(b, p, D, K, H, Hkv)
    if all_optional:
        for x, n in (("q", 2 * H * K), ("k", Hkv * K), ("v", Hkv * K)):
            t += sp.extras(b + f"attn_{x}", n)
        t += sp.extras(b + "attn_output", D, bias=False)
    return t


def _attn_weights(b: str, p: dict, D: int, K: int, H: int, Hkv: int) -> list[TensorPlan]:
    di, Hi = p["idx_dim"], p["idx_heads"]
    return [TensorPlan(b + "attn_q.weight", (2 * H * K, D), "matrix", D),
            TensorPlan(b + "attn_k.weight", (Hkv * K, D), "matrix", D),
            TensorPlan(b + "attn_v.weight", (Hkv * K, D), "matrix", D),
            TensorPlan(b + "attn_output.weight", (D, H * K), "matrix", H * K),
            TensorPlan(b + "attn_q_norm.weight", (K,), "norm"),
            TensorPlan(b + "attn_k_norm.weight", (K,), "norm"),
            TensorPlan(b + "indexer.q_proj.weight", (Hi * di, D), "matrix", D),
            TensorPlan(b + "indexer.k_proj.weight", (di, D), "matrix", D),
            TensorPlan(b + "indexer.q_norm.weight", (di,), "norm"),
            TensorPlan(b + "indexer.k_norm.weight", (di,), "norm")]


def _ple(il: int, p: dict) -> list[TensorPlan]:
    b, D, P = f"blk.{il}.", p["n_embd"], p["hc"]
    return [TensorPlan(b + "ple_key.weight", (P * D, D), "matrix", D),
            TensorPlan(b + "ple_value.weight", (D, D), "matrix", D),
            TensorPlan(b + "ple_norm_key.weight", (P, D), "norm"),
            TensorPlan(b + "ple_norm_query.weight", (P, D), "norm"),
            TensorPlan(b + "ple_norm_conv.weight", (P, D), "norm"),
            TensorPlan(b + "ple_conv1d.weight", (P * D, p["ple_conv"]), "conv", p["ple_conv"])]


def _moe(il: int, p: dict, all_optional: bool = False) -> list[TensorPlan]:
    b, D, Fs = f"blk.{il}.", p["n_embd"], p["n_ff_shexp"]
    t = sp.moe_plans(il, D, p["n_expert"], p["n_ff_exp"], all_optional=all_optional)
    t.append(TensorPlan(b + "ffn_gate_inp_shexp.weight", (D,), "matrix", D))
    for x, shape, fan in (("gate", (Fs, D), D), ("up", (Fs, D), D), ("down", (D, Fs), Fs)):
        t.append(TensorPlan(b + f"ffn_{x}_shexp.weight", shape, "matrix", fan))
        t += sp.extras(b + f"ffn_{x}_shexp", 0, bias=False) if all_optional else []
    return t


def ple_head_dim(p: dict) -> int:
    return p["n_embd"] // ((p["ngram"] - 1) * p["heads_per_ngram"])


def synth_plan(p: dict, *, all_optional=False, fused_qkv=False, tied_output=False, rope_scaling=None):
    """The tensors llama.cpp's qwen4exp loader creates (qwen4exp.cpp:153-262), in its order."""
    sp.no_option(ARCH, fused_qkv=fused_qkv, longrope=rope_scaling == "longrope")
    D, V = p["n_embd"], p["n_vocab"]
    t = [TensorPlan("token_embd.weight", (V, D), "embed")] + _streams("output_hc", p, inject=False)
    if not tied_output:
        t.append(TensorPlan("output.weight", (V, D), "output", D))
    if p["ple_layer"] >= 0:
        t.append(TensorPlan("per_layer_token_embd.weight", (ngram_heads(p)[2], ple_head_dim(p)),
                            "hole" if p["ple_hole"] else "embed"))
    for il, recr in enumerate(is_recurrent(p, all_optional=all_optional)):
        t += _streams(f"blk.{il}.hc_attn", p) + _streams(f"blk.{il}.hc_ffn", p)
        t += _gdn(il, p, all_optional) if recr else _attn(il, p, all_optional)
        if il == p["ple_layer"]:
            t += _ple(il, p)
        t += _moe(il, p, all_optional)
    return t


def synth_metadata(p: dict, *, all_optional=False, rope_scaling=None, name=""):
    """Every key qwen4exp reads (spec 4.1), as the converter writes them; all_optional adds the
    `attention.recurrent_layers` array (and write_synth YaRN, honored by ggml_rope_multi)."""
    a = ARCH
    kv = sp.common_metadata(a, p, name=name)
    kv += [(f"{a}.attention.key_length", p["head_dim"], "u32"), (f"{a}.attention.value_length", p["head_dim"], "u32"),
           (f"{a}.rope.dimension_count", p["n_rot"], "u32"),
           (f"{a}.rope.dimension_sections", list(p["rope_sections"]), "arr_u32"),
           (f"{a}.expert_count", p["n_expert"], "u32"), (f"{a}.expert_used_count", p["n_expert_used"], "u32"),
           (f"{a}.expert_feed_forward_length", p["n_ff_exp"], "u32"),
           (f"{a}.expert_shared_feed_forward_length", p["n_ff_shexp"], "u32"),
           (f"{a}.ssm.conv_kernel", p["ssm_conv"], "u32"), (f"{a}.ssm.state_size", p["ssm_state"], "u32"),
           (f"{a}.ssm.group_count", p["ssm_k_heads"], "u32"), (f"{a}.ssm.time_step_rank", p["ssm_v_heads"], "u32"),
           (f"{a}.ssm.inner_size", p["ssm_v_heads"] * p["ssm_state"], "u32"),
           (f"{a}.full_attention_interval", p["full_attn_interval"], "u32"),
           (f"{a}.hyper_connection.count", p["hc"], "u32"), (f"{a}.hyper_connection.low_rank", p["hc_lr"], "u32"),
           (f"{a}.attention.indexer.head_count", p["idx_heads"], "u32"),
           (f"{a}.attention.indexer.key_length", p["idx_dim"], "u32"),
           (f"{a}.attention.indexer.top_k", p["idx_top_k"], "u32"),
           (f"{a}.attention.compress_ratios", compress_ratios(p, all_optional=all_optional), "arr_u32")]
    if all_optional:
        kv.append((f"{a}.attention.recurrent_layers", is_recurrent(p, all_optional=True), "arr_bool"))
    if p["ple_layer"] >= 0:
        sizes, offsets, _ = ngram_heads(p)
        kv += [(f"{a}.ple.layers", [p["ple_layer"]], "arr_u32"), (f"{a}.ple.ngram_size", p["ngram"], "u32"),
               (f"{a}.ple.heads_per_ngram", p["heads_per_ngram"], "u32"),
               (f"{a}.ple.conv_kernel", p["ple_conv"], "u32"), (f"{a}.ple.eos_token_id", p["ple_eos"], "u32"),
               (f"{a}.embedding_length_per_layer_input", ple_head_dim(p), "u32"),
               (f"{a}.ple.layer_multipliers", ngram_multipliers(p["n_vocab"], p["ngram"], 0, p["ple_seed"]),
                "arr_u64"),
               (f"{a}.ple.head_offsets", offsets, "arr_u64"), (f"{a}.ple.head_vocab_sizes", sizes, "arr_u64")]
    return kv + sp.rope_scaling_metadata(a, p, rope_scaling)
