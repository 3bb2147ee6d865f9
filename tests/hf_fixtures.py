"""Tiny random transformers models (the authors' code), saved as their published checkpoints are laid out, and
converted to GGUF with llama.cpp's own convert_hf_to_gguf.py: the fixtures of tests/test_transformers_oracle.py.

    model, gguf_path = make_gguf("deepseek4", tmp_path)     # model: the torch model the file was made from

Each builder states its shapes once; weights are seeded. Where the converter applies a transform that is not
exact in float32 (qwen4exp: `+1` on zero-centred gammas, `-exp(A_log)`), the random values are drawn on a grid
where the transform and its inverse are exact, so the round trip can be checked bit for bit.
DeepSeek V4's routed experts are MXFP4 in the published checkpoint (E2M1 codes, one E8M0 scale per 32
values, `layers.L.ffn.experts.E.w1.weight` + `.scale`); the converter accepts only that, so the model's expert
weights are drawn as MXFP4 values and written packed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from second_oracle import import_transformers

HERE = os.path.dirname(os.path.abspath(__file__))
# E2M1 values of the 16 codes; code 8 is -0 in the OCP format, +0 in ggml's kvalues_mxfp4 (an int8 table), so
# the model holds +0 there: numerically the same, and the round trip stays bit for bit
E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6], np.float32)

# ---- deepseek4: every ratio (0, 4, 128), hash routing on layer 0, top-k 4 of the ratio-4 blocks, YaRN ----
DS4 = dict(vocab_size=96, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
           head_dim=64, q_lora_rank=32, num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1,
           compress_ratios=[0, 4, 128], num_hash_layers=1, qk_rope_head_dim=16, o_groups=2, o_lora_rank=16,
           index_n_heads=32, index_head_dim=64, index_topk=4, sliding_window=16, hc_sinkhorn_iters=5,
           routed_scaling_factor=1.5, swiglu_limit=10.0, compress_rope_theta=160000.0, rope_theta=10000.0,
           rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32, "beta_slow": 1},
           max_position_embeddings=256, bos_token_id=0, eos_token_id=1, num_nextn_predict_layers=0)

# ---- qwen4exp: GDN x3 + one QSA layer (ratio 8, budget 16: drops blocks past 24 tokens), n-gram on layer 1 ----
QW4 = dict(vocab_size=96, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
           head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
           linear_num_value_heads=4, linear_conv_kernel_dim=4, moe_intermediate_size=32,
           shared_expert_intermediate_size=32, num_experts_per_tok=2, num_experts=4, hc_count=4, hc_lowrank=8,
           ple_layer_ids=[2], ple_embed_dim=64, ple_conv_kernel_size=4, ngram_size=3, heads_per_ngram=2,
           ngram_vocab_size_base=50, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=2,
           indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=32, indexer_budget=16, indexer_compress_ratio=8,
           eos_token_id=3, output_gate_type="sigmoid",
           layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
           rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                            "mrope_section": [3, 3, 2], "mrope_interleaved": True})


LLAMACPP_SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "build", "llamacpp-src", "llama_cpp_python-0.3.36", "vendor", "llama.cpp")   # tests/tools/llamacpp_src.sh


def llamacpp_tree() -> str:
    """The llama.cpp source the oracle was built from (convert_hf_to_gguf.py, conversion/, gguf-py/):
    $REFENGINE_LLAMACPP_SRC, else the unpacked sdist of llama-cpp-python 0.3.36 under build/llamacpp-src
    (tests/tools/llamacpp_src.sh fetches it; ./dev.sh test runs it)."""
    import pytest
    from second_oracle import in_ci
    tree = os.environ.get("REFENGINE_LLAMACPP_SRC", LLAMACPP_SRC)
    if not os.path.exists(os.path.join(tree, "convert_hf_to_gguf.py")):
        why = (f"llama.cpp's converter is not under {tree}: set REFENGINE_LLAMACPP_SRC to the llama.cpp tree of "
               f"llama-cpp-python 0.3.36's sdist (vendor/llama.cpp), or run tests/tools/llamacpp_src.sh")
        if in_ci():                                     # as second_oracle: CI cannot go green without these tests
            pytest.fail(f"CI=true: {why}", pytrace=False)
        pytest.skip(why)
    return tree


def convert(*pairs: tuple[str, str], outtype: str = "f32") -> None:
    """Run llama.cpp's converter (through tests/tools/hf_to_gguf.py) on checkpoint directories, (dir, out.gguf)
    each: one process per model (converting a second model in the same process fails: the converter keeps state
    between models), all started at once."""
    tree = llamacpp_tree()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(tree, "gguf-py"), tree]))
    procs = [(p, subprocess.Popen([sys.executable, os.path.join(HERE, "tools", "hf_to_gguf.py"), p[0],
                                   "--outfile", p[1], "--outtype", outtype], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True)) for p in pairs]
    for p, proc in procs:
        _, err = proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"convert_hf_to_gguf.py failed on {p[0]}:\n{err[-3000:]}")


def _randomize(torch, model, scale: float, gen) -> None:
    """Seeded weights, spread enough that logits are not flat: normal * scale, gammas near 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dtype.is_floating_point:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * scale)


def _grid(torch, t, step: float = 2.0 ** -12):
    """Values on a grid where x + 1 - 1 == x in float32 (|x| < 1, multiples of 2^-12)."""
    return (torch.clamp(t, -0.9, 0.9) / step).round() * step


# ------------------------------------------------------------------------------------------------ deepseek4

def _mxfp4(rng, rows: int, cols: int):
    """Random MXFP4 weights: (float values [rows, cols], packed uint8 [rows, cols/2], scale uint8 [rows, cols/32])."""
    codes = rng.integers(0, 16, size=(rows, cols), dtype=np.uint8)
    exps = rng.integers(127 - 4, 127 - 1, size=(rows, cols // 32), dtype=np.uint8)
    vals = E2M1[codes] * np.repeat(np.exp2(exps.astype(np.float32) - 127), 32, axis=1)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)               # element 2i low nibble, 2i+1 high
    return vals.astype(np.float32), packed, exps


ROOT_NAMES = {"embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
              "hc_head.hc_fn": "hc_head_fn", "hc_head.hc_base": "hc_head_base", "hc_head.hc_scale": "hc_head_scale"}


def make_deepseek4(out_dir: str, seed: int = 0, **over):
    """-> (torch model, checkpoint dir): DeepseekV4ForCausalLM at DS4 (with `over`), written as DeepSeek's own
    checkpoint."""
    torch, tf = import_transformers()
    from safetensors.torch import save_file
    hp = {**DS4, **over}
    cfg = tf.DeepseekV4Config(**{k: v for k, v in hp.items() if k != "rope_scaling"},
                              rope_parameters={"rope_type": "yarn", **{k: v for k, v in hp["rope_scaling"].items()
                                                                      if k != "type"}})
    torch.manual_seed(seed)
    model = tf.DeepseekV4ForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    _randomize(torch, model, 0.08, gen)
    rng = np.random.default_rng(seed)
    sd = model.state_dict()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            if name.endswith("attn_hc.scale") or name.endswith("ffn_hc.scale") or name.endswith("hc_head.hc_scale"):
                p.copy_(0.5 + 0.1 * torch.randn(p.shape, generator=gen))
        E, I, D = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
        for il in range(cfg.num_hidden_layers):
            mlp = model.model.layers[il].mlp
            if hasattr(mlp.gate, "tid2eid"):
                V, K = mlp.gate.tid2eid.shape
                mlp.gate.tid2eid.copy_(torch.from_numpy(np.stack([rng.permutation(E)[:K] for _ in range(V)])))
    # the published layout: DeepSeek's names (transformers writes them back on save), MXFP4 experts, no "model."
    model.save_pretrained(out_dir)
    from safetensors.torch import load_file
    files = [f for f in os.listdir(out_dir) if f.endswith(".safetensors")]
    raw = {}
    for f in files:
        raw.update(load_file(os.path.join(out_dir, f)))
        os.remove(os.path.join(out_dir, f))
    for f in os.listdir(out_dir):
        if f.endswith(".index.json"):
            os.remove(os.path.join(out_dir, f))
    ckpt = {}
    for k, v in raw.items():
        k = k.removeprefix("model.")
        k = ROOT_NAMES.get(k, k)              # transformers' anchored renames miss the "model." prefix on save
        k = k.replace(".attn.norm.", ".attn.kv_norm.")   # and its `.norm.` <-> `.kv_norm.` reversed too widely
        if ".ffn.experts." in k:
            continue
        ckpt[k] = v.contiguous()
    for il in range(cfg.num_hidden_layers):
        gate_up = torch.empty(E, 2 * I, D)
        down = torch.empty(E, D, I)
        for e in range(E):
            for w, rows, cols in (("w1", I, D), ("w3", I, D), ("w2", D, I)):
                vals, packed, exps = _mxfp4(rng, rows, cols)
                ckpt[f"layers.{il}.ffn.experts.{e}.{w}.weight"] = torch.from_numpy(packed)
                ckpt[f"layers.{il}.ffn.experts.{e}.{w}.scale"] = torch.from_numpy(exps)
                if w == "w1":
                    gate_up[e, :I] = torch.from_numpy(vals)
                elif w == "w3":
                    gate_up[e, I:] = torch.from_numpy(vals)
                else:
                    down[e] = torch.from_numpy(vals)
        experts = model.model.layers[il].mlp.experts
        with torch.no_grad():
            experts.gate_up_proj.copy_(gate_up)
            experts.down_proj.copy_(down)
    save_file(ckpt, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json")) as f:
        conf = json.load(f)
    conf.update({k: hp[k] for k in ("compress_ratios", "num_hash_layers", "qk_rope_head_dim", "rope_scaling")})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)
    del sd
    return model, out_dir


# ------------------------------------------------------------------------------------------------- qwen4exp

def make_qwen4exp(out_dir: str, seed: int = 0, **over):
    """-> (torch model, checkpoint dir): Qwen4ExpForCausalLM at QW4, saved by transformers (the PLE hash
    constants added, as the published checkpoint has them; layer types named as it names them)."""
    torch, tf = import_transformers()
    from transformers.models.qwen4_exp import modeling_qwen4_exp as M
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
    hp = {**QW4, **over}
    cfg = Qwen4ExpTextConfig(**hp)
    torch.manual_seed(seed)
    model = M.Qwen4ExpForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    _randomize(torch, model, 0.08, gen)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(_exact_alog(torch, torch.rand(p.shape, generator=gen) * 2 - 1.5))
            elif name.endswith(("norm.weight", "norm_key.weight", "norm_query.weight", "norm_conv.weight",
                                "layernorm.weight")) and not name.endswith("linear_attn.norm.weight"):
                p.copy_(_grid(torch, 0.1 * torch.randn(p.shape, generator=gen)))
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("ngram_embedding.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    model.save_pretrained(out_dir)
    from safetensors.torch import load_file, save_file
    path = os.path.join(out_dir, "model.safetensors")
    sd = load_file(path)
    for k, v in model.state_dict().items():
        if k.endswith(("layer_multipliers", "ngram_heads_offsets", "ngram_heads_vocab_sizes")):
            sd[k] = v.contiguous()
    save_file(sd, path, metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json")) as f:
        conf = json.load(f)
    conf["layer_types"] = hp["layer_types"]            # the published config says full_attention
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)
    return model, out_dir


def _exact_alog(torch, t):
    """A_log values whose round trip A = -exp(A_log) (converter, float32) -> log(-A) (float64, rounded) is exact."""
    out = t.clone()
    flat = out.view(-1)
    for i in range(flat.numel()):
        x = flat[i].item()
        for _ in range(1000):
            xf = np.float32(x)
            a = (-torch.exp(torch.tensor(xf))).item()
            if np.float32(np.log(-np.float64(np.float32(a)))) == xf:
                break
            x = float(np.nextafter(xf, np.float32(1)))
        flat[i] = float(xf)
    return out


# ---- glm5-next: KDA x2 then nope-MLA x2 (indexer full, then shared), k-pool 4, top-k 8, dense layer 0 ----
GLM5N = dict(vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4,
             num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=0, v_head_dim=16,
             qk_nope_head_dim=16, index_topk=8, index_head_dim=64, index_n_heads=16, index_kpool=4,
             linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4, linear_lower_bound=-5.0,
             layer_types=["linear_attention", "linear_attention", "full_attention", "full_attention"],
             indexer_types=["full", "full", "full", "shared"], mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
             hc_sinkhorn_iters=5, pad_token_id=None, routed_scaling_factor=2.5)
GLM5N_VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64,
                    projection_intermediate_size=32)


def make_glm5_next(out_dir: str, seed: int = 0, **over):
    """-> (torch model, checkpoint dir): Glm5NextForConditionalGeneration at GLM5N (a one-block vision tower),
    saved by transformers, with the published config's own keys the converter reads (`linear_attn_config`,
    `mla_use_nope`, `first_k_dense_replace`, `mhc`)."""
    torch, tf = import_transformers()
    from transformers.models.glm5_next import configuration_glm5_next as C, modeling_glm5_next as M
    hp = {**GLM5N, **over}
    cfg = C.Glm5NextConfig(text_config=hp, vision_config=GLM5N_VISION)
    torch.manual_seed(seed)
    model = M.Glm5NextForConditionalGeneration(cfg).eval()
    gen = torch.Generator().manual_seed(seed)
    _randomize(torch, model, 0.08, gen)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(_exact_alog(torch, torch.rand(p.shape, generator=gen) * 2 - 1.5))
            elif name.endswith(("norm.weight", "layernorm.weight")):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("hc.scale"):
                p.copy_(0.5 + 0.1 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "config.json")) as f:
        conf = json.load(f)
    conf["text_config"].update(
        linear_attn_config={"num_heads": hp["linear_num_heads"], "head_dim": hp["linear_head_dim"],
                            "short_conv_kernel_size": hp["linear_conv_kernel_dim"],
                            "gate_lower_bound": hp["linear_lower_bound"]},
        mla_use_nope=True, first_k_dense_replace=hp["mlp_layer_types"].count("dense"), mhc=True,
        layer_types=hp["layer_types"])
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(conf, f, indent=1)
    return model, out_dir


BUILDERS = {"deepseek4": make_deepseek4, "qwen4exp": make_qwen4exp, "glm5-next": make_glm5_next}


def make_ggufs(archs, tmp_dir, seed: int = 0, outtype: str = "f32", **over) -> dict:
    """-> {arch: (torch model, GGUF path)}: a tiny model of each arch (its preset, with `over`), converted by
    llama.cpp's converter."""
    llamacpp_tree()                                     # skip (fail under CI) before building anything
    out, pairs = {}, []
    for arch in archs:
        model_dir = os.path.join(os.fspath(tmp_dir), f"{arch}-hf")
        model, _ = BUILDERS[arch](model_dir, seed, **over)
        out[arch] = (model, os.path.join(os.fspath(tmp_dir), f"{arch}.gguf"))
        pairs.append((model_dir, out[arch][1]))
    convert(*pairs, outtype=outtype)
    return out


def make_gguf(arch: str, tmp_dir, seed: int = 0, outtype: str = "f32", **over):
    """-> (torch model, GGUF path): one arch, as make_ggufs."""
    return make_ggufs([arch], tmp_dir, seed, outtype, **over)[arch]
