"""ggml's scalar rounding primitives, in float32 NumPy, bit for bit.

Every quantizer in ggml is built from a handful of scalar operations whose exact rounding matters
when the goal is to produce the same bytes. They live here once:

    nearest_int(x)    int(x) rounded half to even by the magic-number trick   (`nearest_int`, ggml-quants.c)
    roundf(x)         C `roundf`: half away from zero                          (Q4_0/Q8_0 reference quantizers)
    fp16_bits(x)      float32 -> IEEE half bits, round to nearest even        (`GGML_FP32_TO_FP16`)
    fp16_round(x)     float32 -> the float32 value of that half               (`GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(x))`)
    bf16_bits(x)      float32 -> bfloat16 bits, round to nearest even          (`GGML_FP32_TO_BF16`)
    seq_sum(a)        `s = 0; for i: s += a[i]` in float32, left to right      (every reduction loop in ggml-quants.c)

libggml-base is compiled for the baseline x86-64 ISA (SSE2, no FMA: `objdump -d libggml-base.so` shows no
`vfmadd`), so its C float expressions are plain IEEE float32 operations in source order, which these
NumPy float32 operations reproduce exactly.
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
_MAGIC = F32(12582912.0)       # 1.5 * 2**23: adding it leaves the rounded integer in the low mantissa bits


def nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's `nearest_int`: `val = x + 12582912.f; return (bits(val) & 0x7fffff) - 0x400000`.

    Round half to even for |x| < 2**22 (the float32 add rounds); outside that range it returns the same
    garbage ggml does, which keeps NaN / huge inputs bit-compatible too.
    """
    v = (np.asarray(x, dtype=F32) + _MAGIC).view(np.int32)
    return (v & np.int32(0x007FFFFF)) - np.int32(0x00400000)


def roundf(x: np.ndarray) -> np.ndarray:
    """C `roundf` on float32: nearest integer, halfway cases away from zero (as float32).

    `x - trunc(x)` is exact in float32, so the half test is exact (unlike `trunc(x + 0.5)`).
    """
    x = np.asarray(x, dtype=F32)
    t = np.trunc(x)
    frac = np.abs(x - t)
    return np.where(frac >= F32(0.5), t + np.sign(x), t).astype(F32)


def fp16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 half bits as `ggml_compute_fp32_to_fp16`: round to nearest even, overflow to inf,
    subnormal halves kept, NaN -> 0x7E00 with the input's sign."""
    x = np.asarray(x, dtype=F32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        sign = (x.view(np.uint32) >> 16).astype(np.uint16) & np.uint16(0x8000)
        h = np.where(nan, sign | np.uint16(0x7E00), h)
    return h


def fp16_round(x: np.ndarray) -> np.ndarray:
    """The float32 value ggml reads back after storing `x` as a half."""
    return fp16_bits(x).view(np.float16).astype(F32)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> uint16 bfloat16 bits as `ggml_compute_fp32_to_bf16`:
    `(u + 0x7fff + ((u >> 16) & 1)) >> 16`, NaN -> `(u >> 16) | 64` (quiet)."""
    u = np.asarray(x, dtype=F32).view(np.uint32)
    rne = ((u.astype(np.uint64) + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), rne)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """The float32 value of `x` stored as bfloat16."""
    return (bf16_bits(x).astype(np.uint32) << 16).view(F32)


def seq_sum(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """`float s = 0; for (i...) s += a[i];` along `axis`, in float32, strictly left to right.

    One vector add per position along `axis` (over all the other axes at once); unlike `np.sum`, which
    adds pairwise, this keeps C's order. Starting from `0` turns an all-negative-zero sum into +0, as C does.
    """
    a = np.moveaxis(np.asarray(a, dtype=F32), axis, 0)
    s = np.zeros(a.shape[1:], dtype=F32)
    for row in a:
        s += row
    return s


def seq_sum_from_first(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """`float s = a[0]; for (i = 1...) s += a[i];` (no leading `0 +`)."""
    a = np.moveaxis(np.asarray(a, dtype=F32), axis, 0)
    s = a[0].copy()
    for row in a[1:]:
        s += row
    return s
