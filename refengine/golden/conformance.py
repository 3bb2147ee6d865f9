"""`refengine conformance`: a self-contained kit for another engine's CI.

For every registered arch (or the ones asked for) and every weight type, a tiny synthetic GGUF (the
arch's `tiny` preset, seed 0, `refengine.synth`) and its golden directory (`make_golden`, exact mode, a
fixed token list), plus `kit.json` (the index) and a README saying how to check an engine against it.
An arch added to the registry is in the kit with no edit here.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
from tqdm import tqdm

from ..archs import ARCHS
from ..errors import ConfigError
from .write import make_golden

TYPES = ("F32", "Q8_0", "Q4_K", "IQ4_XS")
N_TOKENS = 12

README = """# refengine conformance kit

Tiny synthetic models for every architecture refengine implements, in {types}, each with golden
per-layer outputs and logits from refengine (the readable NumPy reference, checked tensor by tensor
against llama.cpp). Written by `refengine conformance` {version}; {n} models, {mib:.1f} MiB.

    ARCH-PRESET-TYPE/model.gguf               the model (`tokenizer.ggml.model = "none"`: feed token ids)
    ARCH-PRESET-TYPE/golden/manifest.json     tokens, model sha256, versions, per-tensor shape and tolerance
    ARCH-PRESET-TYPE/golden/tensors.safetensors   every intermediate under llama.cpp's graph names + `logits`
    ARCH-PRESET-TYPE/golden/results.gguf      llama.cpp `llama-results` file (logits + tokens)
    ARCH-PRESET-TYPE/golden/logits.kld        llama.cpp `llama-perplexity --kl-divergence-base` file
    ARCH-PRESET-TYPE/golden-llamacpp/         quantized types only: the same in llama.cpp mode (below)
    kit.json                                  the index: arch, preset, type, files, sizes, sha256

## Checking an engine

1. Load `model.gguf`, run one prefill of `manifest.json`'s `tokens` (positions 0..T-1, fresh cache).
2. Save what you have under llama.cpp's names in a safetensors file (any subset; NumPy order, i.e. ggml's
   `ne` reversed, so `Qcur-0` with ne = {{K, H, T}} is `[T, H, K]`; only the element count and the flat
   order must agree): at least `logits` `[T, V]`, ideally `l_out-N` per layer, or everything your
   eval callback sees (`attn_norm-0`, `Qcur-0`, `kqv_out-0`, `ffn_moe_topk-0`, `ffn_out-0`, ...).
3. `refengine check ARCH-PRESET-TYPE/golden your_dump.safetensors` (exit 0 match, 1 divergence, 2 bad
   input; `--json` for CI). It prints NMSE, max-abs and cosine per tensor and the *first* tensor over
   tolerance; expert ids are compared as sets, ties at the top-k boundary reported, not failed.
   From transformers: save `hidden_states.N` and `logits` and add `--from transformers`.

Without refengine: read `tensors.safetensors` with any safetensors reader and compute
NMSE = sum((yours - golden)^2) / sum(golden^2) per tensor against `tolerance` in the manifest's
`tensor_table` (F32 weights 1e-8: only the order of float sums may differ; quantized weights 1e-2,
since an engine may round activations to Q8_0/Q8_K before a quantized matmul as llama.cpp does).

Quantized models have two goldens. `golden/` is exact mode: f32 arithmetic on the dequantized weights,
held to NMSE 1e-2 (an engine that rounds activations differs from it by 1e-5..1e-2, and a MoE router
may pick a different expert at a near-tie). `golden-llamacpp/` rounds every matmul's activations to the
weight's partner type (Q8_0, Q8_1, Q8_K) exactly as ggml-cpu does, and is held to 1e-7: an engine that
reproduces ggml-cpu's arithmetic should match it to float noise, except where a value sits within float
noise of a rounding boundary (a "rounding flip", see refengine's docs/quant.md).

With llama.cpp's own tools (CPU build, f32 KV cache, flash attention off):

    llama-perplexity -m model.gguf --kl-divergence-base golden/logits.kld --kl-divergence \\
        -c T -b T -ctk f32 -ctv f32 -fa off          # KL divergence of llama.cpp's logits from the golden

(`llama-results --check` tokenizes a text prompt, so it needs a model with a vocabulary; see the
refengine README for running it on a real model.)
"""


def tiny_preset(arch: str) -> str:
    presets = ARCHS[arch].PRESETS
    if "tiny" in presets:
        return "tiny"
    tiny = [p for p in presets if p.startswith("tiny")]
    if not tiny:
        raise ConfigError(f"conformance: arch {arch!r} has no tiny preset")
    return tiny[0]


def write_conformance(out_dir, *, archs=None, types=None, progress: bool = False, seed: int = 0) -> dict:
    from .. import __version__
    from ..synth import write_synth
    from .write import sha256_file
    t0 = time.perf_counter()
    archs = list(archs or ARCHS)
    unknown = [a for a in archs if a not in ARCHS]
    if unknown:
        raise ConfigError(f"conformance: unknown arch(s) {unknown}; registered: {', '.join(ARCHS)}")
    types = list(types or TYPES)
    os.makedirs(out_dir, exist_ok=True)
    jobs = [(a, tiny_preset(a), t) for a in archs for t in types]
    kit = {"archs": archs, "types": types, "models": []}
    for arch, preset, wtype in tqdm(jobs, desc="conformance", unit="model", disable=not progress):
        name = f"{arch}-{preset}-{wtype}"
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        mpath = write_synth(arch, os.path.join(d, "model.gguf"), preset=preset, wtype=wtype, seed=seed)
        from ..model import Model
        model = Model(mpath)
        tokens = np.random.default_rng([seed, 7]).integers(0, model.cfg.n_vocab, size=N_TOKENS)
        m = make_golden(mpath, tokens, os.path.join(d, "golden"), model=model, path_model="model.gguf")
        if wtype != "F32":                  # what an engine that rounds activations as ggml-cpu does should match
            make_golden(mpath, tokens, os.path.join(d, "golden-llamacpp"), model=model, mode="llamacpp",
                        path_model="model.gguf")
        size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
        kit["models"].append({"dir": name, "arch": arch, "preset": preset, "type": wtype,
                              "model_sha256": sha256_file([mpath]), "tokens": m["tokens"],
                              "tolerance": m["tolerance"]["nmse"], "tensors": len(m["order"]), "bytes": size})
    kit["bytes"] = sum(m["bytes"] for m in kit["models"])
    kit["seconds"] = round(time.perf_counter() - t0, 2)
    kit["refengine"] = __version__
    with open(os.path.join(out_dir, "kit.json"), "w") as f:
        json.dump(kit, f, indent=1)
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(README.format(types=", ".join(types), version=__version__, n=len(kit["models"]),
                              mib=kit["bytes"] / 2**20))
    return kit
