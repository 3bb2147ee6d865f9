"""Seeded synthetic GGUFs with exactly the tensor names, shapes and metadata llama.cpp expects.

    write_synth("qwen3moe", "tiny.gguf", preset="tiny", wtype="Q4_K", seed=0, all_optional=True)

- `tokenizer.ggml.model = "none"` and `{arch}.vocab_size`: llama.cpp needs no tokenizer.
- Every tensor's values come from its own generator, seeded by (seed, crc32(name)): the same file
  whatever the order or the number of layers written.
- Matrices use std 1/sqrt(fan_in) so activations stay O(1); the output matrix is 3x wider so logits
  are well spread (no near-ties at the top).
- Weights are written in `wtype` when their rows fit its block (like llama.cpp's quantizer, rows that do
  not fit fall back to Q8_0, then F16); 1-D tensors (norms, biases, scales) stay F32.
- Streamed: one tensor (for big ones, one slab of rows) in memory at a time.
"""
from __future__ import annotations

import os
from pathlib import Path
import zlib

import numpy as np
from gguf import GGUFWriter
from gguf import quants as gguf_quants
from gguf.constants import GGMLQuantizationType, GGUFValueType
from gguf.gguf_writer import WriterState
from tqdm import tqdm

from quant import GGMLType, type_info
from quant import ggml as qggml

from .archs import ARCHS
from .errors import ConfigError
from .synthplan import TensorPlan

# ---------------------------------------------------------------- per-arch plans (from the arch registry)

PRESETS: dict[str, dict[str, dict]] = {name: s.PRESETS for name, s in ARCHS.items()}


def _arch(arch: str):
    if arch not in PRESETS:
        raise ConfigError(f"no synthetic presets for arch {arch!r} (available: {', '.join(PRESETS)})")
    return ARCHS[arch]


def plan_tensors(arch: str, p: dict, *, all_optional: bool = False, fused_qkv: bool = False,
                 tied_output: bool = False, rope_scaling: str | None = None) -> list[TensorPlan]:
    """The tensor list llama.cpp's loader for `arch` creates, with optional ones when asked (the arch's `synth_plan`)."""
    return _arch(arch).synth_plan(p, all_optional=all_optional, fused_qkv=fused_qkv, tied_output=tied_output,
                                  rope_scaling=rope_scaling)


def metadata(arch: str, p: dict, *, all_optional: bool, rope_scaling: str | None,
             name: str) -> list[tuple[str, object, str]]:
    """(key, value, gguf value type) rows (the arch's `synth_metadata`)."""
    return _arch(arch).synth_metadata(p, all_optional=all_optional, rope_scaling=rope_scaling, name=name)


# ---------------------------------------------------------------- values

def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def matrix_std(tp: TensorPlan) -> float:
    """Standard deviation of a matrix's values: the plan's own `std` when it sets one, else 1/sqrt(fan_in);
    embeddings 1; output 3x and router 2x wider."""
    if tp.std > 0:
        return tp.std
    return {"embed": 1.0, "output": 3.0 / np.sqrt(tp.fan_in), "router": 2.0 / np.sqrt(tp.fan_in)}.get(
        tp.kind, 1.0 / np.sqrt(tp.fan_in))


def tensor_slabs(tp: TensorPlan, seed: int, slab_rows: int = 4096):
    """Yield float32 slabs of the tensor along its first axis (the whole tensor for small ones)."""
    rng = _rng(seed, tp.name)
    if tp.kind == "norm":
        yield (1.0 + 0.1 * rng.standard_normal(tp.shape)).astype(np.float32)
    elif tp.kind == "bias":
        yield (0.1 * rng.standard_normal(tp.shape)).astype(np.float32)
    elif tp.kind == "scale":
        yield (1.0 + 0.2 * rng.standard_normal(tp.shape)).astype(np.float32)
    elif tp.kind == "probs_bias":                 # a selection bias (exp_probs_b): zero-mean, the plan's spread
        yield (tp.std * rng.standard_normal(tp.shape)).astype(np.float32)
    elif tp.kind == "rope_freqs":
        yield (1.0 + 3.0 * rng.random(tp.shape)).astype(np.float32)
    elif tp.kind == "ssm_a":                      # -exp(A_log) as converters store it: decay rates in [0.05, 1]
        yield (-np.exp(rng.uniform(np.log(0.05), 0.0, tp.shape))).astype(np.float32)
    elif tp.kind == "res_score":                  # an attention-residual score vector: scores of O(1)
        yield (rng.standard_normal(tp.shape) / np.sqrt(tp.shape[-1])).astype(np.float32)
    elif tp.kind == "expert_ids":                 # a token -> expert ids table [V, A] (I32): A distinct ids per
        n_e = int(tp.std)                         # row out of tp.std experts (DeepSeek-V4's ffn_gate_tid2eid)
        yield np.stack([rng.permutation(n_e)[:tp.shape[-1]] for _ in range(tp.shape[0])]).astype(np.int32)
    else:
        std = matrix_std(tp)
        n0 = tp.shape[0]
        per = max(1, slab_rows // max(1, int(np.prod(tp.shape[1:-1], dtype=np.int64))))
        for r in range(0, n0, per):
            rows = min(per, n0 - r)
            yield (std * rng.standard_normal((rows, *tp.shape[1:]), dtype=np.float32)).astype(np.float32)


def forced_type(tp: TensorPlan, tensor_types: dict | None) -> GGMLType | None:
    """`tensor_types[suffix]` for a tensor whose name ends with that suffix (a test's choice, written whatever
    choose_type would say), else None."""
    for suffix, t in (tensor_types or {}).items():
        if tp.name.endswith(suffix):
            return type_info(t).type
    return None


def choose_type(tp: TensorPlan, wtype: GGMLType) -> GGMLType:
    """The stored type: 1-D tensors, ssm_a, attention-residual scores and short-conv weights (`ggml_ssm_conv`
    reads F32) F32; matrices wtype, else Q8_0 / F16 when their rows do not fit its block."""
    if tp.kind == "expert_ids":
        return GGMLType.I32
    if len(tp.shape) == 1 or tp.kind in ("norm", "bias", "scale", "rope_freqs", "conv", "ssm_a", "res_score", "hole"):
        return GGMLType.F32
    n = tp.shape[-1]
    for t in (wtype, GGMLType.Q8_0, GGMLType.F16):
        if n % type_info(t).block_size == 0:
            return t
    return GGMLType.F32


def encode(x: np.ndarray, t: GGMLType) -> np.ndarray:
    """float32 [..., n] -> stored array (float32, float16 or packed uint8); int32 for I32 (written as is)."""
    if t == GGMLType.I32:
        return x.astype(np.int32)
    if t == GGMLType.F32:
        return x.astype(np.float32)
    if t == GGMLType.F16:
        return x.astype(np.float16)
    if qggml.available():
        # IQ2_XXS, IQ2_XS, IQ1_S, IQ1_M: ggml's quantizer needs an importance matrix; an imatrix of ones
        # (every column equally important) keeps the file deterministic
        imatrix = np.ones(x.shape[-1], dtype=np.float32) if qggml.requires_imatrix(t) else None
        return qggml.quantize(x.reshape(-1, x.shape[-1]), t, imatrix).reshape(*x.shape[:-1], -1)
    try:
        return gguf_quants.quantize(x, GGMLQuantizationType(int(t)))
    except (NotImplementedError, ValueError, gguf_quants.QuantError):
        raise ConfigError(f"writing {t.name} needs ggml's quantizer: pip install 'llama-cpp-python==0.3.36'") from None


# ---------------------------------------------------------------- writer

def resolve_preset(arch: str, preset: str, *, layers: int | None = None, overrides: dict | None = None) -> dict:
    """The preset's entries with `overrides` applied and cut to `layers` blocks (by the arch's own
    `synth_resolve` rule where it has one, e.g. deepseek2 keeps its last block MoE)."""
    _arch(arch)
    if preset not in PRESETS[arch]:
        raise ConfigError(f"arch {arch!r} has no preset {preset!r} (available: {', '.join(PRESETS[arch])})")
    p = dict(PRESETS[arch][preset])
    unknown = set(overrides or {}) - set(p) - {"n_expert", "n_expert_used", "n_ff_exp"}
    if unknown:
        raise ConfigError(f"unknown preset entries {sorted(unknown)}; known: {sorted(p)}")
    p.update(overrides or {})
    if layers is not None and not 1 <= layers <= p["n_layer"]:
        raise ConfigError(f"--layers must be in 1..{p['n_layer']} for preset {preset!r}")
    return ARCHS[arch].synth_resolve(p, layers)


def write_synth(arch: str, path: str | os.PathLike, *, preset: str = "tiny", wtype: str = "F32", seed: int = 0,
                all_optional: bool = False, fused_qkv: bool = False, tied_output: bool = False,
                layers: int | None = None, shards: int = 1, progress: bool = False,
                overrides: dict | None = None, rope_scaling: str | None = None,
                tensor_types: dict | None = None) -> str:
    """Write a synthetic model; returns the path of the (first) file. `layers` keeps only the first N blocks;
    `overrides` replaces preset entries (e.g. {"n_expert_used": 8} for top-k equal to the expert count);
    `rope_scaling` is none | linear | yarn | longrope (factor 4); `all_optional` implies yarn unless given;
    `tensor_types` {name suffix: ggml type name} stores the matching tensors in that type (e.g.
    {"ssm_f_b.weight": "Q8_0"}), whatever `wtype` and the F32 rule for small tensors say."""
    p = resolve_preset(arch, preset, layers=layers, overrides=overrides)
    wt = type_info(wtype).type
    if rope_scaling is None and all_optional:
        rope_scaling = "yarn"
    if rope_scaling not in (None, "none", "linear", "yarn", "longrope"):
        raise ConfigError(f"rope scaling {rope_scaling!r} is not one of none, linear, yarn, longrope")
    plan = plan_tensors(arch, p, all_optional=all_optional, fused_qkv=fused_qkv, tied_output=tied_output,
                        rope_scaling=rope_scaling)
    path = os.fspath(path)
    label = f"synthetic {arch} {preset} {wt.name} seed={seed}" + (" all-optional" if all_optional else "")
    w, types = open_writer(path, arch, plan, metadata(arch, p, all_optional=all_optional, rope_scaling=rope_scaling,
                                                       name=label), wt, shards=shards,
                          tensor_types=tensor_types)
    bar = tqdm(plan, desc=f"writing {os.path.basename(path)}", unit="tensor", disable=not progress)
    for tp in bar:
        if tp.kind == "hole":                     # a table too big to write: zeros, as a hole in a sparse file
            _write_hole(w)
        else:
            _write_streamed(w, (encode(x, types[tp.name]) for x in tensor_slabs(tp, seed)))
    w.close()
    return str(w.format_shard_names(Path(path))[0]) if shards > 1 else path


def open_writer(path: str, arch: str, plan: list[TensorPlan], kv_rows, wt: GGMLType, *, shards: int = 1,
                tensor_types: dict | None = None):
    """A GGUFWriter with metadata and the tensor table written, ready for `_write_streamed` in plan order.
    Returns (writer, {tensor name: stored type})."""
    per_shard = -(-len(plan) // shards) if shards > 1 else 0
    w = GGUFWriter(path, arch, split_max_tensors=per_shard)
    for key, val, vt in kv_rows:
        if vt == "arr_u64":                       # exact 64-bit integers (qwen4exp's n-gram hash constants)
            w.add_key_value(key, [int(v) for v in val], GGUFValueType.ARRAY, GGUFValueType.UINT64)
            continue
        {"str": w.add_string, "u32": w.add_uint32, "f32": w.add_float32, "bool": w.add_bool,
         "arr_u32": w.add_array, "arr_f32": w.add_array, "arr_bool": w.add_array}[vt](key, [bool(v) for v in val] if vt == "arr_bool" else val)
    forced = {tp.name: forced_type(tp, tensor_types) for tp in plan}
    types = {tp.name: choose_type(tp, wt) if forced[tp.name] is None else forced[tp.name] for tp in plan}
    for tp in plan:
        t = types[tp.name]
        nbytes = type_info(t).row_bytes(tp.shape[-1]) * int(np.prod(tp.shape[:-1], dtype=np.int64))
        # with raw_dtype given and a non-uint8 dtype, GGUFWriter takes the shape as the element shape
        w.add_tensor_info(tp.name, tp.shape, np.dtype(np.float32), nbytes, raw_dtype=GGMLQuantizationType(int(t)))
    w.write_header_to_file(Path(path))
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    return w, types


def _write_hole(w: GGUFWriter) -> None:
    """The next tensor's bytes left unwritten: the file position moves past them, so the filesystem stores a hole
    (reads give zeros, no disk blocks). A 51B-parameter n-gram table costs nothing to write or to keep."""
    file_id = next(i for i, ts in enumerate(w.tensors) if len(ts) > 0)
    fout = w.fout[file_id]
    ti = w.tensors[file_id].pop(next(iter(w.tensors[file_id])))
    w.write_padding(fout, fout.tell())
    fout.seek(ti.nbytes, os.SEEK_CUR)
    fout.truncate()                               # the file reaches past the hole even if nothing follows it
    w.write_padding(fout, ti.nbytes)
    w.state = WriterState.WEIGHTS


def _write_streamed(w: GGUFWriter, slabs) -> None:
    """`GGUFWriter.write_tensor_data` for a tensor delivered in slabs (bounded memory)."""
    file_id = next(i for i, ts in enumerate(w.tensors) if len(ts) > 0)
    fout = w.fout[file_id]
    name = next(iter(w.tensors[file_id]))
    ti = w.tensors[file_id].pop(name)
    w.write_padding(fout, fout.tell())
    n = 0
    for s in slabs:
        s = np.ascontiguousarray(s)
        s.tofile(fout)
        n += s.nbytes
    if n != ti.nbytes:
        raise RuntimeError(f"synth: tensor {name!r} wrote {n} bytes, planned {ti.nbytes}")
    w.write_padding(fout, n)
    w.state = WriterState.WEIGHTS
