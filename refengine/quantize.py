"""Rewrite a GGUF with a per-tensor type recipe (`refengine quantize IN.gguf OUT.gguf --recipe NAME|FILE`).

    summary = quantize_gguf("model-f16.gguf", "model-moe-q2k.gguf", load_recipe("moe-q2k"))

- Input: one file or any shard of a split set (read as one model); output: one file.
- Metadata is copied byte for byte, except `split.*` (the output is not split), `general.file_type`
  (set to 1024, LLAMA_FTYPE_GUESSED: llama.cpp then infers it from the tensors) and
  `general.quantization_version` (set to 2, GGML_QNT_VERSION, when any tensor is quantized).
- Every tensor gets the type `quant.recipes.choose_type` picks (llama.cpp's keep list and shape fallbacks).
  A tensor already in its target type is copied as is; any other is decoded (`quant.dequantize`) and
  re-quantized (`quant.quantize`: NumPy, bit-exact with ggml, for the Q*/K types; ggml's own quantizer
  for IQ*/TQ*/MXFP4/NVFP4, with an importance matrix of ones where ggml demands one).
- `engine`: "numpy" (the reference quantizers), "ggml" (ggml's quantizer: the same bytes, ~100x faster
  for K-quants), or "auto" (ggml when llama-cpp-python is installed).
- Streaming: one slab of at most SLAB_ELEMENTS values of one tensor is in memory at a time; a tqdm
  bar counts the input bytes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
from gguf.constants import GGUFValueType
from tqdm import tqdm

from quant import GGMLType, QTensor, dequantize, type_info
from quant.quantize import quantize
from quant.recipes import Recipe, choose_type

from .errors import GGUFError
from .gguf import open_gguf
from .gguf.writer import GGUFWriter, PlannedTensor

SLAB_ELEMENTS = 1 << 20          # float32 values decoded at once (4 MiB), whatever the tensor size
LLAMA_FTYPE_GUESSED = 1024
GGML_QNT_VERSION = 2
FLOATS = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)


@dataclass
class Summary:
    path: str
    recipe: str
    engine: str
    tensors: list[tuple[str, str, str, str]] = field(default_factory=list)   # name, from, to, note
    bytes_in: int = 0
    bytes_out: int = 0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, _, to, _ in self.tensors:
            out[to] = out.get(to, 0) + 1
        return out


def _metadata(gf, any_quantized: bool) -> list:
    kv = []
    for key, value in gf.kv.items():
        if key.startswith("split."):
            continue
        vtype = gf.kv_types[key]
        if key == "general.file_type":
            value = LLAMA_FTYPE_GUESSED
        if key == "general.quantization_version":
            continue
        kv.append((key, vtype, value))
    if any_quantized:
        kv.append(("general.quantization_version", GGUFValueType.UINT32, GGML_QNT_VERSION))
    return kv


def _slabs(w, target: GGMLType, name: str, engine: str):
    """The target-type bytes of QTensor w, produced SLAB_ELEMENTS values at a time."""
    cols = w.shape[-1]
    raw = w.raw.reshape(-1, w.raw.shape[-1])                                  # [rows, row_bytes]
    step = max(1, SLAB_ELEMENTS // cols)
    imatrix = None
    for r0 in range(0, raw.shape[0], step):
        slab = raw[r0:r0 + step]
        x = dequantize(QTensor(name, w.type, (slab.shape[0], cols), slab))    # [r, cols] float32
        if imatrix is None and _needs_imatrix(target):
            imatrix = np.ones(cols, dtype=np.float32)
        yield quantize(x, target, imatrix=imatrix, name=name, engine=engine)


def _needs_imatrix(t: GGMLType) -> bool:
    from quant import ggml
    return ggml.available() and ggml.requires_imatrix(t)


def quantize_gguf(src: str | os.PathLike, dst: str | os.PathLike, recipe: Recipe, *,
                  progress: bool = True, engine: str = "auto") -> Summary:
    """Write `dst` from `src` with the recipe's types; returns what was done per tensor."""
    from quant import ggml
    if engine == "auto":
        engine = "ggml" if ggml.available() else "numpy"
    if engine not in ("numpy", "ggml"):
        raise GGUFError(f"unknown quantizer engine {engine!r} (auto, numpy, ggml)")
    if engine == "ggml" and not ggml.available():
        raise GGUFError("engine 'ggml' needs llama-cpp-python==0.3.36 (ggml's libraries)")
    gf = open_gguf(src)
    dst = os.fspath(dst)
    if os.path.abspath(dst) in {os.path.abspath(sh.path) for sh in gf.shards}:
        raise GGUFError(f"{dst}: the output would overwrite the input")
    summary = Summary(dst, recipe.name, engine)
    plan = []
    for name, ti in gf.tensors.items():
        target, note = choose_type(recipe, name, ti.shape, ti.type)
        info = type_info(target)
        nbytes = info.row_bytes(ti.ne[0]) * int(np.prod(ti.ne[1:], dtype=np.int64))
        plan.append((ti, target, PlannedTensor(name, int(target), tuple(ti.ne), nbytes)))
        summary.tensors.append((name, ti.type.name, target.name, note))
    any_q = any(t not in FLOATS and t not in (GGMLType.I8, GGMLType.I16, GGMLType.I32, GGMLType.I64)
                for _, t, _ in plan)
    writer = GGUFWriter(dst, _metadata(gf, any_q), [p for _, _, p in plan], gf.shards[0].alignment)
    total = sum(ti.nbytes for ti, _, _ in plan)
    bar = tqdm(total=total, unit="B", unit_scale=True, disable=not progress, desc=f"quantize {os.path.basename(dst)}")
    try:
        writer.write_header()
        for ti, target, pt in plan:
            bar.set_postfix_str(f"{ti.name} {ti.type.name}->{target.name}", refresh=False)
            w = gf.tensor(ti.name)
            if target == ti.type:
                chunks = (w.raw.reshape(-1)[i:i + (64 << 20)] for i in range(0, w.nbytes, 64 << 20))
            else:
                chunks = _slabs(w, target, ti.name, engine)
            writer.write_tensor(ti.name, chunks)
            bar.update(ti.nbytes)
            summary.bytes_in += ti.nbytes
            summary.bytes_out += pt.nbytes
        writer.close()
    except BaseException:
        bar.close()
        if writer._f is not None:
            writer._f.close()
        if os.path.exists(dst):
            os.remove(dst)
        raise
    bar.close()
    return summary
