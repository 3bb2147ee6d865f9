"""GGUF models with random packed weights, for any synth preset and weight type, without a quantizer.

`refengine.synth` quantizes float weights with ggml's quantizer (llama-cpp-python), which the GPU machine
does not have, and which takes minutes for a real-size model. This writes the same tensor table and
metadata (synth's `plan_tensors` / `metadata`) with random quant bytes instead, block scales chosen so
that every matrix has mean 0 and synth's standard deviation (1/sqrt(fan_in); embeddings 1; output
3/sqrt(fan_in); router 2/sqrt(fan_in)). Norms and other vectors are synth's own values.

    write_random_model("/tmp/m.gguf", "Q4_K", layers=2, arch="qwen3moe", preset="qwen3-30b-a3b")
"""
from __future__ import annotations

import os

import numpy as np

from quant import GGMLType, QTensor, ref, type_info
from quant.cuda.testdata import random_raw

from .. import synth

_KAPPA: dict = {}


def kappa(t: GGMLType, rng) -> float:
    """std of the decoded weights per unit of block scale, for centered random bytes of type t."""
    if t not in _KAPPA:
        q = random_raw(t, (64, 1024), rng, scale=1.0, centered=True)
        w = ref.dequantize(QTensor.from_raw("k", t, (64, 1024), q))
        _KAPPA[t] = float(np.std(w))
    return _KAPPA[t]


def parse_overrides(arch: str, preset: str, items) -> dict:
    """`KEY=VALUE` strings (a benchmark's --override) as a preset's overrides: an integer, or a comma list for an
    entry the preset holds as a tuple (full_attn=2). ValueError names the item that is not one."""
    from ..synth import PRESETS
    out = {}
    for item in items:
        k, _, v = item.partition("=")
        try:
            out[k] = (tuple(int(x) for x in v.split(",") if x)
                      if isinstance(PRESETS[arch][preset].get(k), tuple) else int(v))
        except (ValueError, KeyError):
            raise ValueError(f"--override {item!r}: want KEY=INTEGER (or KEY=I,J,... for a tuple entry) of a "
                             f"known {arch} preset") from None
    return out


def override_tag(overrides: dict) -> str:
    """A file-name tag of a preset's overrides: -full_attn2, -n_expert16 (sorted; a tuple's items joined by _)."""
    return "".join(f"-{k}{'_'.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in sorted(overrides.items()))


def cut_file(directory: str, arch: str, preset: str, layers: int | None, wtype: str, items=(), suffix: str = "") -> str:
    """A benchmark's model file, written if it is not there: `directory/ARCH-PRESET-LLAYERS-TYPE[-overrides][suffix]
    .gguf`, the tiny synthetic preset (refengine.synth) or a random-packed cut of a published one (seed 0, so the
    same bytes on every machine: what `benchmarks/check_logits.py` relies on). items: --override KEY=VALUE strings."""
    ov = parse_overrides(arch, preset, items)
    path = os.path.join(directory, f"{arch}-{preset}-L{layers}-{wtype}{override_tag(ov)}{suffix}.gguf")
    if not os.path.exists(path):
        os.makedirs(directory, exist_ok=True)
        if preset == "tiny":
            synth.write_synth(arch, path, wtype=wtype)
        else:
            write_random_model(path, wtype, layers, arch=arch, preset=preset, overrides=ov or None)
    return path


def write_random_model(path: str, wtype: str, layers: int | None = None, seed: int = 0, arch="qwen3moe",
                       preset="qwen3-30b-a3b", overrides: dict | None = None) -> str:
    p = synth.resolve_preset(arch, preset, layers=layers, overrides=overrides)
    wt = type_info(wtype).type
    plan = synth.plan_tensors(arch, p)
    kv = synth.metadata(arch, p, all_optional=False, rope_scaling=None,
                        name=f"random packed {arch} {preset} {wt.name} seed={seed}")
    w, types = synth.open_writer(path, arch, plan, kv, wt)
    rng = np.random.default_rng(seed)
    for tp in plan:
        t = types[tp.name]
        if tp.kind == "hole":                     # a table too big to write (qwen4exp's n-gram rows): a sparse hole
            synth._write_hole(w)
            continue
        if (t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32)
                or tp.kind in ("norm", "bias", "scale", "rope_freqs", "expert_ids")):     # synth's own values
            slabs = (synth.encode(x, t) for x in synth.tensor_slabs(tp, seed))
        else:
            s = synth.matrix_std(tp) / kappa(t, rng)
            per = max(1, 4096 // max(1, int(np.prod(tp.shape[1:-1], dtype=np.int64))))
            slabs = (random_raw(t, (min(per, tp.shape[0] - r), *tp.shape[1:]), rng, scale=s, centered=True)
                     for r in range(0, tp.shape[0], per))
        synth._write_streamed(w, slabs)
    w.close()
    return path
