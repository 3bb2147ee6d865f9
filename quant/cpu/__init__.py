"""Numba CPU backend: fused dequantize + matmul kernels that read the packed GGUF bytes directly.

Same signatures as the NumPy oracle (`quant.ref`), so `refengine` switches to it with
`Runtime(backend="cpu")` / `--backend cpu`:

    matmul(x, w, *, mode="exact")      x [T, I] float32, w QTensor [O, I] (any ggml type) -> [T, O]
                                       (mode "llamacpp": x rounded to the weight's partner type first)
    moe_ffn(x, ids, weights, *, up, gate, down, ...)   routed experts, grouped by expert
    grouped_matmul(x, w, seg)          w [E, O, I]; rows seg[e]:seg[e+1] of x use matrix e
    dequantize(w)                      whole tensor -> float32 (the naive block decoders)

Files, in reading order: `llvm.py` (byte loads and 32-bit unpacking as LLVM intrinsics),
`tables.py` (grids and code books), `dequant.py` (naive per-block decoders, the readable
reference), `simd.py` (16-lane vector values and operations), `dot.py` (fused GEMV row kernels
written with them), `kernels.py` (the parallel drivers and their thread split), `matmul.py` (host
wrappers: GEMV / small batch / dequantize + BLAS), `moe.py` (expert dispatch).

Nothing is compiled at import: each type's kernels compile on first use and are cached on disk.
"""
from .matmul import BLAS_MIN_TOKENS, dequantize, grouped_matmul, matmul
from .moe import moe_ffn

__all__ = ["BLAS_MIN_TOKENS", "dequantize", "grouped_matmul", "matmul", "moe_ffn"]
