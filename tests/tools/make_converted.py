"""Regenerate tests/fixtures/converted/: tiny random transformers models converted by llama.cpp's own
`convert_hf_to_gguf.py` (issue 22, dialect 3: the converter's dialect as a test source).

    .venv/bin/python tests/tools/make_converted.py [ARCH ...]     # default: every arch in CASES

For each llama.cpp arch (CASES): the transformers model class the converter maps to it (its register decorator
in conversion/*.py), built from a tiny config with seeded random weights (every parameter moved off its
initial value, so unit norms and zero biases are exercised too), saved with `save_pretrained`, then converted
with `--outtype f32` by the vendored converter (the oracle's own llama.cpp tree; its gguf-py on PYTHONPATH).
Written per arch: `{arch}.gguf` (what the converter wrote) and `{arch}.hf.npy` (transformers' logits of the
original model on TOKENS: the authors' code as a second check, float32 [T, V]).

The tokenizer: a 52-token byte-level BPE written as GPT-2's vocab.json + merges.txt (no network here). The converter identifies
a BPE tokenizer's pre-tokenizer by hashing its encoding of a fixed text against the published models'
(`get_vocab_base_pre`); no made-up tokenizer hashes to one of those, so this script replaces that one method
by a function answering "default" (llama.cpp's default BPE pre-tokenizer). Nothing else of the converter is
touched (but for one more: the converter imports `sentencepiece` before it looks for a tokenizer.model, and that
package is not installed here; the runner raises the FileNotFoundError the converter expects first): every key and tensor in the files is the converter's. The converter pads the token list to the
model's vocab_size with [PAD{i}] tokens, as it does for published models.

Versions the fixtures were made with: transformers 5.23.0, torch 2.13.0 (CPU), llama.cpp of llama-cpp-python
0.3.36 (vendor/llama.cpp). Needs torch + transformers (the hf extra); takes about 10 s per arch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "converted"
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP_SRC", "/work/src/llama_cpp_python-0.3.36/vendor/llama.cpp"))
TOKENS = [7, 90, 13, 55, 1, 69, 44, 3, 80, 31, 8, 77, 19, 64, 95, 2, 17, 33, 5, 61, 42, 9, 88, 70]   # past a 16-token chunk
SEED = 0

# llama.cpp arch -> (transformers config class, model class, config entries). Every model: vocab 96,
# hidden 32, 2-4 layers, a few experts; sized so each converted F32 file stays under ~200 KB.
_COMMON = dict(vocab_size=96, hidden_size=32, rms_norm_eps=1e-6, max_position_embeddings=256,
               tie_word_embeddings=False)
_MLA = dict(kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
_MOE = dict(num_experts_per_tok=2, moe_intermediate_size=16)
_DS = dict(_COMMON, **_MLA, **_MOE, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
           intermediate_size=32, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1)
_DSA = dict(index_n_heads=8, index_head_dim=64, index_topk=8)   # llama.cpp's indexer rotation: a power of 2 >= 64
CASES: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(_COMMON, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "qwen3moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                 dict(_COMMON, **_MOE, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      num_experts=4, norm_topk_prob=True, intermediate_size=32)),
    # DeepSeek-V2(-Lite): no q-LoRA, softmax gate, greedy top-k
    "deepseek2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                  dict(_DS, topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0)),
    # DeepSeek-V3: q-LoRA, sigmoid gate with e_score_correction_bias, expert groups (the converter maps it to deepseek2)
    "deepseek2-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                     dict(_DS, q_lora_rank=24, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                          num_mtp_layers=0)),
    "deepseek32": ("DeepseekV32Config", "DeepseekV32ForCausalLM",
                   dict(_DS, **_DSA, q_lora_rank=16, n_group=1, topk_group=1, head_dim=8)),
    "glm-dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
                dict(_DS, **_DSA, q_lora_rank=16, n_group=1, topk_group=1, head_dim=8)),
    "qwen3next": ("Qwen3NextConfig", "Qwen3NextForCausalLM",
                  dict(_COMMON, **_MOE, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                       linear_num_value_heads=4, num_experts=4, shared_expert_intermediate_size=16,
                       intermediate_size=32,
                       # not the interval's pattern: the converter writes the recurrent-layer array from it
                       layer_types=["linear_attention", "full_attention", "linear_attention"])),
    "kimi-linear": ("KimiLinearConfig", "KimiLinearForCausalLM",
                    dict(_COMMON, **_MLA, **_MOE, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                         intermediate_size=32,
                         num_local_experts=4, n_shared_experts=1, first_k_dense_replace=1, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0,
                         linear_attn_config={"head_dim": 8, "num_heads": 4, "short_conv_kernel_size": 4,
                                             "full_attn_layers": [3], "kda_layers": [1, 2]})),
}

# Qwen3-Next's converter expects the published checkpoint's MTP block (qwen.py _QwenMtpMixin asserts it finds
# one); transformers' model has none, so it runs with --no-mtp (the converter's own switch for a file without it).
CONVERTER_ARGS = {"qwen3next": ("--no-mtp",)}


_SPECIAL = ("<|endoftext|>", "[gMASK]", "<|user|>", "<|observation|>")   # the GLM vocab reader asks for these

# config.json entries of the published checkpoints that transformers' configs do not keep (their modelling code
# hard-codes them) and the converter reads: the router's scoring function (conversion/base.py, `scoring_func` /
# `moe_router_activation_func` -> expert_gating_func; without it llama.cpp's deepseek2 loader defaults to softmax,
# deepseek32 and kimi-linear refuse the file), and Kimi-Linear's `linear_attn_config`, num_shared_experts,
# first_k_dense_replace (transformers consumes them into its own fields). Values as in the published configs
# (deepseek-ai/DeepSeek-V2-Lite: softmax greedy; DeepSeek-V3 / V3.2-Exp, zai-org GLM-5: sigmoid noaux_tc;
# moonshotai/Kimi-Linear-48B-A3B: sigmoid), dimensions as in CASES.
_SIGMOID = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}
PUBLISHED_CONFIG = {
    "deepseek2": {"scoring_func": "softmax", "topk_method": "greedy"},
    "deepseek2-v3": _SIGMOID, "deepseek32": _SIGMOID, "glm-dsa": _SIGMOID,
    "kimi-linear": {"moe_router_activation_func": "sigmoid", "num_shared_experts": 1, "first_k_dense_replace": 1,
                    "linear_attn_config": {"head_dim": 8, "num_heads": 4, "short_conv_kernel_size": 4,
                                           "full_attn_layers": [3], "kda_layers": [1, 2]}},
}


def tokenizer_files(model_dir: Path, serialized: bool = False) -> None:
    """A 52-token byte-level BPE (16 letters, 32 merges, 4 special tokens) as GPT-2's vocab.json + merges.txt.

    Not a tokenizer.json: from one, transformers 5 drops tokenizer_config's add_bos_token (tokenization_utils_base,
    from_pretrained), which the DeepSeek-V3.2 converter asserts is true; from vocab.json + merges.txt it keeps it.
    `serialized` adds the same tokenizer as tokenizer.json, for the model types whose tokenizer transformers builds
    from nothing else (kimi_linear: TokenizersBackend whatever tokenizer_class says)."""
    letters = [chr(ord("a") + i) for i in range(16)]
    vocab = {c: i for i, c in enumerate(letters)}
    merges = []
    for x in letters[:4]:
        for y in letters[:8]:
            vocab[x + y] = len(vocab)
            merges.append(f"{x} {y}")
    for sp in _SPECIAL:
        vocab[sp] = len(vocab)
    (model_dir / "vocab.json").write_text(json.dumps(vocab))
    (model_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    added = {str(vocab[sp]): dict(content=sp, special=True, normalized=False, lstrip=False, rstrip=False,
                                  single_word=False) for sp in _SPECIAL}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(dict(
        tokenizer_class="GPT2Tokenizer", add_bos_token=True, bos_token=_SPECIAL[0], eos_token=_SPECIAL[0],
        added_tokens_decoder=added)))
    if serialized:
        from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
        tok = Tokenizer(models.BPE.from_file(str(model_dir / "vocab.json"), str(model_dir / "merges.txt")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.add_special_tokens([AddedToken(sp, special=True, normalized=False) for sp in _SPECIAL])
        tok.save(str(model_dir / "tokenizer.json"))


def build_hf(arch: str, model_dir: Path) -> np.ndarray:
    """Write the tiny transformers model of `arch` to `model_dir`; -> its logits on TOKENS [T, V] float32."""
    import torch
    import transformers
    cfg_name, model_name, entries = CASES[arch]
    torch.manual_seed(SEED)
    cfg = getattr(transformers, cfg_name)(**entries)
    model = getattr(transformers, model_name)(cfg).eval().float()
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(hash_name(name))))
    model.save_pretrained(model_dir, safe_serialization=True)
    published_form(arch, model_dir)
    tokenizer_files(model_dir, serialized=arch == "kimi-linear")
    with torch.no_grad():
        logits = model(torch.tensor([TOKENS])).logits[0]
    return logits.float().numpy()


def published_form(arch: str, model_dir: Path) -> None:
    """Where transformers' save_pretrained writes a checkpoint in another form than the published one the
    converter reads, put it in the published form (PUBLISHED_CONFIG; the tensors: below).

    kimi-linear: transformers loads the published `block_sparse_moe.` (MoE blocks) as `mlp.`, and its save
    reverses that rename on every block, the dense ones too; the published dense block 0 is `mlp.{gate,up,down}_proj`
    (the converter has no name for `block_sparse_moe.down_proj`)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg.update(PUBLISHED_CONFIG.get(arch, {}))
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    if arch == "kimi-linear":
        import re
        from safetensors.torch import load_file, save_file
        f = model_dir / "model.safetensors"
        sd = load_file(f)
        sd = {re.sub(r"\.block_sparse_moe\.(gate|up|down)_proj\.", r".mlp.\1_proj.", k): v for k, v in sd.items()}
        save_file(sd, f, metadata={"format": "pt"})


def hash_name(name: str) -> int:
    """A seed per parameter name, stable across runs (Python's hash() is salted)."""
    return SEED * 1_000_003 + sum((i + 1) * ord(c) for i, c in enumerate(name))


_RUN_CONVERTER = r"""
import sys
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[1:]
sys.path[:0] = [{src!r}, {gguf!r}]
import conversion.base as base
_sentencepiece = base.TextModel._create_vocab_sentencepiece
def _no_tokenizer_model(self):      # what it raises with sentencepiece installed and no tokenizer.model
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return _sentencepiece(self)
base.TextModel._create_vocab_sentencepiece = _no_tokenizer_model
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"   # see make_converted.py's docstring
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def convert(model_dir: Path, out: Path, args=()) -> None:
    """llama.cpp's convert_hf_to_gguf.py --outtype f32 on `model_dir` (its pre-tokenizer hash check answered)."""
    code = _RUN_CONVERTER.format(src=str(LLAMA_CPP), gguf=str(LLAMA_CPP / "gguf-py"))
    subprocess.run([sys.executable, "-c", code, str(model_dir), "--outtype", "f32", "--outfile", str(out), *args],
                   check=True, cwd=LLAMA_CPP)


def main(argv: list[str]) -> int:
    archs = argv or list(CASES)
    OUT.mkdir(parents=True, exist_ok=True)
    for arch in archs:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(tmp) / arch
            model_dir.mkdir()
            logits = build_hf(arch, model_dir)
            convert(model_dir, OUT / f"{arch}.gguf", CONVERTER_ARGS.get(arch, ()))
        np.save(OUT / f"{arch}.hf.npy", logits)
        print(f"{arch}: {(OUT / f'{arch}.gguf').stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
