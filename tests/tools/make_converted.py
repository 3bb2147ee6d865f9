"""Regenerate tests/fixtures/converted/: tiny models converted by llama.cpp's own `convert_hf_to_gguf.py`
(issue 22, dialect 3: the converter's dialect as a test source).

    .venv/bin/python tests/tools/make_converted.py [CASE ...]     # default: every case but NOT_FIXTURES

For each case (CASES): the transformers model class the converter maps to the llama.cpp arch (its register
decorator in conversion/*.py), built from a tiny config with seeded random weights (every parameter moved off its
initial value, so unit norms and zero biases are exercised too), saved with `save_pretrained`, then converted by
the vendored converter (the oracle's own llama.cpp tree; its gguf-py on PYTHONPATH). Written per case:
`{case}.gguf` (`--outtype f32`), `{case}.q8_0.gguf` (`--outtype q8_0`) and `{case}.hf.npy` (transformers' logits
of the original model on TOKENS: the authors' code as a second check, float32 [T, V]). kimi-k3 has no
transformers model: its checkpoint is written from a synth file (build_k3).

The tokenizer: a 52-token byte-level BPE written as GPT-2's vocab.json + merges.txt (no network here). The
converter identifies a BPE tokenizer's pre-tokenizer by hashing its encoding of a fixed text against the
published models' (`get_vocab_base_pre`); no made-up tokenizer hashes to one of those, so the runner replaces
that one method by a function answering "default" (llama.cpp's default BPE pre-tokenizer). One more: the
converter imports `sentencepiece` before it looks for a tokenizer.model, and that package is not installed here;
the runner raises the FileNotFoundError the converter expects first. Nothing else of the converter is touched:
every key and tensor in the files is the converter's. It pads the token list to the model's vocab_size with
[PAD{i}] tokens, as it does for published models.

Versions the fixtures were made with: transformers 5.23.0, torch 2.13.0 (CPU), llama.cpp of llama-cpp-python
0.3.36 (vendor/llama.cpp; $LLAMA_CPP_SRC points elsewhere). Needs torch + transformers (the hf extra); about
10-20 s per case. The files are deterministic: a rerun writes the same bytes.
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
sys.path.insert(0, str(ROOT))        # this checkout's refengine (kimi-k3's checkpoint is written from its synth)
OUT = ROOT / "tests" / "fixtures" / "converted"
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP_SRC",       # tests/tools/llamacpp_src.sh unpacks it there
                                 ROOT / "build/llamacpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp"))
TOKENS = [7, 90, 13, 55, 1, 69, 44, 3, 80, 31, 8, 77, 19, 64, 95, 2, 17, 33, 5, 61, 42, 9, 88, 70]   # past 16: a KDA chunk
SEED = 0

# case -> (transformers config class, model class, config entries). Every model: vocab 96, hidden 32, 2-3
# blocks (26 for deepseek2-lite), 4 experts top-2; sized so each converted F32 file stays near 200 KB or under.
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
    # DeepSeek-V2-Lite's form at its published block count: llama.cpp reads q_lora_rank unless the model has 26 or
    # 27 blocks (deepseek2.cpp:8-13), so the 2-block "deepseek2" above is refused and this one loads. Too large
    # for a fixture (about 0.5 MB): not written by default; tests/test_converter_dialect.py builds it (exhaustive).
    "deepseek2-lite": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
                       dict(_DS, num_hidden_layers=26, first_k_dense_replace=25, num_attention_heads=2,
                            num_key_value_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                            v_head_dim=8, intermediate_size=16, topk_method="greedy", norm_topk_prob=False,
                            routed_scaling_factor=1.0)),
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
    "deepseek2-lite": {"scoring_func": "softmax", "topk_method": "greedy"},
    "deepseek2-v3": _SIGMOID, "deepseek32": _SIGMOID, "glm-dsa": _SIGMOID,
    "kimi-linear": {"moe_router_activation_func": "sigmoid", "num_shared_experts": 1, "first_k_dense_replace": 1,
                    "linear_attn_config": CASES["kimi-linear"][2]["linear_attn_config"]},
}

NOT_FIXTURES = {"deepseek2-lite"}
# f32: {arch}.gguf; q8_0: {arch}.q8_0.gguf, the converter's own quantizer (gguf-py, Python): its own choice of
# which tensors stay F32 (1-D, norms, ffn_gate_inp, conv kernels, the DSA indexer's proj), F16 where rows do not
# fit a Q8_0 block of 32
OUTTYPES = ("f32", "q8_0")
F32_ONLY = NOT_FIXTURES | {"deepseek2"}     # deepseek2 (2 blocks, no q-LoRA): refused by llama.cpp at any type


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


def convert(model_dir: Path, out: Path, args=(), outtype: str = "f32") -> None:
    """llama.cpp's convert_hf_to_gguf.py --outtype OUTTYPE on `model_dir` (its pre-tokenizer hash check answered)."""
    code = _RUN_CONVERTER.format(src=str(LLAMA_CPP), gguf=str(LLAMA_CPP / "gguf-py"))
    subprocess.run([sys.executable, "-c", code, str(model_dir), "--outtype", outtype, "--outfile", str(out), *args],
                   check=True, cwd=LLAMA_CPP)


# ---------------------------------------------------------------- kimi-k3: no transformers model
# The converter reads KimiK3ForConditionalGeneration checkpoints (conversion/kimi_k3.py): KimiLinearForCausalLM
# tensors under `language_model.`, plus K3's own (full-rank KDA gate and MLA output gate, both `g_proj`; latent
# MoE `routed_expert_*`; attention residuals as `<x>_res_norm` * `<x>_res_proj`). transformers has no such model,
# so the checkpoint is written from a small `refengine synth` kimi-k3 file by undoing each conversion step the
# converter applies (the names through gguf-py's own TensorNameMap for KIMI_K3, which the converter uses); the
# converter then writes the GGUF. There are no transformers logits for it.
K3_SYNTH = dict(n_vocab=96, n_embd=32, n_layer=3, full_attn=(2,), dh=8, q_lora=16, kv_lora=32, qk_nope=16,
                qk_rope=8, v_head=16, n_ff=32, n_expert=4, n_ff_exp=16, latent=16)
_K3_NAMES = {   # GGUF name (after blk.{i}.) -> checkpoint name (after model.layers.{i}.)
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ssm_conv1d_q.weight": "self_attn.q_conv1d.weight", "ssm_conv1d_k.weight": "self_attn.k_conv1d.weight",
    "ssm_conv1d_v.weight": "self_attn.v_conv1d.weight", "ssm_f_a.weight": "self_attn.f_a_proj.weight",
    "ssm_f_b.weight": "self_attn.f_b_proj.weight", "ssm_beta.weight": "self_attn.b_proj.weight",
    "ssm_dt.bias": "self_attn.dt_bias", "ssm_g.weight": "self_attn.g_proj.weight",
    "ssm_norm.weight": "self_attn.o_norm.weight", "attn_gate.weight": "self_attn.g_proj.weight",
    "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight", "attn_q_a.weight": "self_attn.q_a_proj.weight",
    "attn_q_b.weight": "self_attn.q_b_proj.weight", "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
    "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_gate_inp.weight": "block_sparse_moe.gate.weight",
    "exp_probs_b.bias": "block_sparse_moe.gate.e_score_correction_bias",
    "ffn_routed_down.weight": "block_sparse_moe.routed_expert_down_proj.weight",
    "ffn_routed_up.weight": "block_sparse_moe.routed_expert_up_proj.weight",
    "ffn_routed_norm.weight": "block_sparse_moe.routed_expert_norm.weight",
    "ffn_gate_shexp.weight": "block_sparse_moe.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "block_sparse_moe.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "block_sparse_moe.shared_experts.down_proj.weight",
}


def build_k3(model_dir: Path) -> None:
    """A KimiK3ForConditionalGeneration checkpoint (model.safetensors, config.json) from a synth kimi-k3 file."""
    import torch
    import quant
    from safetensors.torch import save_file
    from refengine.archs.kimi_k3_synth import PRESETS
    from refengine.gguf import open_gguf
    from refengine.synth import write_synth
    src = write_synth("kimi-k3", model_dir / "synth.gguf", overrides=K3_SYNTH)
    g = open_gguf(src)
    W = lambda n: torch.from_numpy(np.ascontiguousarray(quant.dequantize(g.tensor(n)), dtype=np.float32))
    p = dict(PRESETS["tiny"], **K3_SYNTH)
    L, H = p["n_layer"], p["n_head"]
    sd = {"model.embed_tokens.weight": W("token_embd.weight"), "model.norm.weight": W("output_norm.weight"),
          "lm_head.weight": W("output.weight"),
          # the converter writes norm * proj: the score as the norm, a unit projection
          "model.output_attn_res_norm.weight": W("output_res_score.weight"),
          "model.output_attn_res_proj.weight": torch.ones(p["n_embd"])}
    for i in range(L):
        pre, blk = f"model.layers.{i}.", f"blk.{i}."
        have = {n[len(blk):] for n in g.tensors if n.startswith(blk)}
        for gname in have & set(_K3_NAMES):
            sd[pre + _K3_NAMES[gname]] = W(blk + gname)
        for kind, hf in (("attn", "self_attention_res"), ("ffn", "mlp_res")):
            sd[pre + f"{hf}_norm.weight"] = W(blk + f"{kind}_res_score.weight")
            sd[pre + f"{hf}_proj.weight"] = torch.ones(p["n_embd"])
        if "ssm_a" in have:   # the converter writes -exp(A_log[:n_head]): 1-D (Kimi-Linear's [1, 1, H, 1] would
            sd[pre + "self_attn.A_log"] = torch.log(-W(blk + "ssm_a"))     # stay 4-D, which llama.cpp's K3 refuses)
        if "attn_k_b.weight" in have:                         # the converter splits kv_b and transposes k_b
            k_b, v_b = W(blk + "attn_k_b.weight"), W(blk + "attn_v_b.weight")   # [H, C, dn], [H, dv, C]
            sd[pre + "self_attn.kv_b_proj.weight"] = torch.cat([k_b.transpose(1, 2), v_b], 1).reshape(-1, p["kv_lora"])
        if "ffn_gate_exps.weight" in have:                    # the converter stacks the per-expert matrices
            for wid, gname in (("w1", "ffn_gate_exps"), ("w2", "ffn_down_exps"), ("w3", "ffn_up_exps")):
                for e, m in enumerate(W(blk + gname + ".weight")):
                    sd[pre + f"block_sparse_moe.experts.{e}.{wid}.weight"] = m.contiguous()
    save_file({"language_model." + k: v.contiguous() for k, v in sd.items()}, model_dir / "model.safetensors",
              metadata={"format": "pt"})
    full = [i + 1 for i in p["full_attn"]]
    cfg = dict(architectures=["KimiK3ForConditionalGeneration"], vocab_size=p["n_vocab"], hidden_size=p["n_embd"],
               intermediate_size=p["n_ff"], num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=H,
               rms_norm_eps=p["eps"], max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=False,
               q_lora_rank=p["q_lora"], kv_lora_rank=p["kv_lora"], qk_nope_head_dim=p["qk_nope"],
               qk_rope_head_dim=p["qk_rope"], v_head_dim=p["v_head"], mla_use_nope=True,
               num_experts=p["n_expert"], num_experts_per_token=p["n_expert_used"],
               moe_intermediate_size=p["n_ff_exp"], num_shared_experts=p["n_shared"],
               first_k_dense_replace=p["n_dense_lead"], routed_scaling_factor=p["w_scale"],
               moe_renormalize=p["norm_w"], moe_router_activation_func="sigmoid",
               routed_expert_hidden_size=p["latent"], hidden_act="situ", activation_situ_beta=p["situ_beta"],
               activation_situ_linear_beta=p["situ_linear_beta"], attn_res_block_size=p["res_bs"],
               bos_token_id=48, eos_token_id=48,
               linear_attn_config=dict(head_dim=p["dh"], num_heads=H, short_conv_kernel_size=p["d_conv"],
                                       gate_lower_bound=p["gate_lb"], full_attn_layers=full,
                                       kda_layers=[i + 1 for i in range(L) if i + 1 not in full]))
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    (model_dir / "synth.gguf").unlink()
    tokenizer_files(model_dir, serialized=True)


def main(argv: list[str]) -> int:
    archs = argv or [a for a in CASES if a not in NOT_FIXTURES] + ["kimi-k3"]
    OUT.mkdir(parents=True, exist_ok=True)
    for arch in archs:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(tmp) / arch
            model_dir.mkdir()
            if arch == "kimi-k3":
                build_k3(model_dir)
                logits = None
            else:
                logits = build_hf(arch, model_dir)
            for outtype in OUTTYPES:
                if arch in F32_ONLY and outtype != "f32":
                    continue
                name = f"{arch}.gguf" if outtype == "f32" else f"{arch}.{outtype}.gguf"
                convert(model_dir, OUT / name, CONVERTER_ARGS.get(arch, ()), outtype)
        if logits is not None:
            np.save(OUT / f"{arch}.hf.npy", logits)
        print(f"{arch}: {(OUT / f'{arch}.gguf').stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
