"""NumPy quantizers, bit-exact with ggml's reference quantizers (`quantize_row_*_ref`, no importance matrix).

    quantize(x, t)      x: float32 [..., n]  ->  uint8 [..., row_bytes]      (`ggml_quantize_chunk(t, x, ...)`)

Written here: F32, F16, BF16, the 32-blocks Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the activation types Q8_1 and
Q8_K, the ternary-ish Q1_0 / Q2_0, and (in `quant.kquants`) Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Every other type
(IQ*, TQ*, MXFP4, NVFP4) goes through ggml's own quantizer (`quant.ggml.quantize`), which needs
llama-cpp-python; IQ2_XXS, IQ2_XS, IQ1_S and IQ1_M additionally need an importance matrix there.

Each function takes blocks `[N, block]` of float32 and returns packed blocks `[N, type_size]`; the loops
of the C code become NumPy operations over all blocks at once, in the same float32 operation order
(see `quant.rounding`). Non-finite input is refused: ggml's result for it is not meaningful.
"""
from __future__ import annotations

import numpy as np

from .formats import GGMLType, type_info
from .errors import QuantError
from .rounding import F32, bf16_bits, fp16_bits, nearest_int, roundf, seq_sum


class QuantizeError(QuantError):
    """Input a quantizer cannot take (non-finite values, a row that does not fit the block)."""


def _first_absmax(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(amax, max) per block as `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`: the first element of
    largest magnitude, with its sign. b: [N, B] -> [N], [N]."""
    i = np.argmax(np.abs(b), axis=-1)                              # first occurrence, like the strict <
    mx = np.take_along_axis(b, i[:, None], axis=-1)[:, 0]
    return np.abs(mx), mx


def _inv(d: np.ndarray) -> np.ndarray:
    """`d ? 1.0f/d : 0.0f`."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, F32(1.0) / np.where(d != 0, d, F32(1.0)), F32(0.0)).astype(F32)


def _pack_nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """qs[j] = lo[j] | hi[j] << 4 (the 32-block layout: element j and j + 16 share byte j)."""
    return (lo.astype(np.uint8) & 0x0F) | ((hi.astype(np.uint8) & 0x0F) << 4)


def _as_bytes(*fields: np.ndarray) -> np.ndarray:
    """Concatenate per-block fields (each [N, k] of any dtype) into packed bytes [N, sum(bytes)]."""
    n = fields[0].shape[0]
    return np.concatenate([np.ascontiguousarray(f).reshape(n, -1).view(np.uint8) for f in fields], axis=1)


def quantize_q8_0(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q8_0_ref`: d = amax/127, q = roundf(x * (1/d)).  [N, 32] -> [N, 34] (d fp16 | qs int8[32])."""
    amax = np.max(np.abs(b), axis=-1)
    d = amax / F32(127)
    q = roundf(b * _inv(d)[:, None]).astype(np.int8)
    return _as_bytes(fp16_bits(d)[:, None], q)


def quantize_q8_1(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q8_1_ref`: Q8_0's d and qs, plus s = fp16(sum(qs) * d).  [N, 32] -> [N, 36] (d | s | qs)."""
    amax = np.max(np.abs(b), axis=-1)
    d = amax / F32(127)
    q = roundf(b * _inv(d)[:, None]).astype(np.int8)
    s = q.astype(np.int32).sum(axis=-1).astype(F32) * d
    return _as_bytes(fp16_bits(d)[:, None], fp16_bits(s)[:, None], q)


def quantize_q8_k(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q8_K_ref`: iscale = -127/max (max = the signed value of largest magnitude),
    q = min(127, nearest_int(iscale * x)), d = 1/iscale, bsums = sums of 16 q.
    [N, 256] -> [N, 292] (d float32 | qs int8[256] | bsums int16[16]); an all-zero block is all zeros."""
    amax, mx = _first_absmax(b)
    zero = amax == 0
    with np.errstate(divide="ignore"):
        iscale = (F32(-127.0) / np.where(zero, F32(1.0), mx)).astype(F32)
    q = np.minimum(127, nearest_int(b * iscale[:, None])).astype(np.int8)
    q[zero] = 0
    bsums = q.reshape(-1, 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16)
    d = np.where(zero, F32(0.0), F32(1.0) / iscale).astype(F32)
    return _as_bytes(d[:, None], q, bsums)


def quantize_q4_0(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q4_0_ref`: d = max/-8, q = min(15, (int8)(x/d + 8.5)).  [N, 32] -> [N, 18] (d | qs[16])."""
    _, mx = _first_absmax(b)
    d = mx / F32(-8)
    q = np.minimum(15, np.trunc(b * _inv(d)[:, None] + F32(8.5)).astype(np.int32))
    return _as_bytes(fp16_bits(d)[:, None], _pack_nibbles(q[:, :16], q[:, 16:]))


def quantize_q4_1(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q4_1_ref`: d = (max-min)/15, m = min, q = min(15, (int8)((x-min)/d + 0.5)).
    [N, 32] -> [N, 20] (d | m | qs[16])."""
    mn, mx = b.min(axis=-1), b.max(axis=-1)
    d = (mx - mn) / F32(15)
    q = np.minimum(15, np.trunc((b - mn[:, None]) * _inv(d)[:, None] + F32(0.5)).astype(np.int32))
    return _as_bytes(fp16_bits(d)[:, None], fp16_bits(mn)[:, None], _pack_nibbles(q[:, :16], q[:, 16:]))


def _qh_bits(q: np.ndarray) -> np.ndarray:
    """The 5th bit of the 32 codes as a little-endian uint32 (`qh |= (q[j] >> 4 & 1) << j`). [N, 32] -> [N, 4]."""
    return np.packbits((q >> 4) & 1, axis=-1, bitorder="little")


def quantize_q5_0(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q5_0_ref`: d = max/-16, q = min(31, (int8)(x/d + 16.5)).  [N, 32] -> [N, 22] (d | qh | qs)."""
    _, mx = _first_absmax(b)
    d = mx / F32(-16)
    q = np.minimum(31, np.trunc(b * _inv(d)[:, None] + F32(16.5)).astype(np.int32)).astype(np.uint8)
    return _as_bytes(fp16_bits(d)[:, None], _qh_bits(q), _pack_nibbles(q[:, :16], q[:, 16:]))


def quantize_q5_1(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q5_1_ref`: d = (max-min)/31, q = (uint8)((x-min)/d + 0.5).  [N, 32] -> [N, 24] (d | m | qh | qs)."""
    mn, mx = b.min(axis=-1), b.max(axis=-1)
    d = (mx - mn) / F32(31)
    q = np.trunc((b - mn[:, None]) * _inv(d)[:, None] + F32(0.5)).astype(np.int32).astype(np.uint8)
    return _as_bytes(fp16_bits(d)[:, None], fp16_bits(mn)[:, None], _qh_bits(q), _pack_nibbles(q[:, :16], q[:, 16:]))


def quantize_q1_0(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q1_0_ref`: d = sum|x| / 128 (summed in order), bit j = x[j] >= 0.  [N, 128] -> [N, 18]."""
    d = seq_sum(np.abs(b)) / F32(128)
    bits = np.packbits(b >= 0, axis=-1, bitorder="little")
    return _as_bytes(fp16_bits(d)[:, None], bits)


def quantize_q2_0(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q2_0_ref`: d = amax, q = clamp((int)roundf(x/d) + 1, 0, 3).  [N, 64] -> [N, 18]."""
    d = np.max(np.abs(b), axis=-1)
    inv = np.where(d > 0, F32(1.0) / np.where(d > 0, d, F32(1.0)), F32(0.0)).astype(F32)
    q = np.clip(roundf(b * inv[:, None]).astype(np.int32) + 1, 0, 3).astype(np.uint8)   # [N, 64]
    q4 = q.reshape(-1, 16, 4) << np.array([0, 2, 4, 6], dtype=np.uint8)
    return _as_bytes(fp16_bits(d)[:, None], np.bitwise_or.reduce(q4, axis=-1))


def _kquant(name):
    def run(b):
        from . import kquants
        return getattr(kquants, name)(b)
    return run


NUMPY_QUANTIZERS = {
    GGMLType.Q8_0: quantize_q8_0, GGMLType.Q8_1: quantize_q8_1, GGMLType.Q8_K: quantize_q8_k,
    GGMLType.Q4_0: quantize_q4_0, GGMLType.Q4_1: quantize_q4_1, GGMLType.Q5_0: quantize_q5_0,
    GGMLType.Q5_1: quantize_q5_1, GGMLType.Q1_0: quantize_q1_0, GGMLType.Q2_0: quantize_q2_0,
    GGMLType.Q2_K: _kquant("quantize_q2_k"), GGMLType.Q3_K: _kquant("quantize_q3_k"),
    GGMLType.Q4_K: _kquant("quantize_q4_k"), GGMLType.Q5_K: _kquant("quantize_q5_k"),
    GGMLType.Q6_K: _kquant("quantize_q6_k"),
}


def quantize(x: np.ndarray, t, *, imatrix: np.ndarray | None = None, name: str = "tensor",
             engine: str = "numpy") -> np.ndarray:
    """x float32 [..., n] -> packed bytes [..., row_bytes] of type t, as `ggml_quantize_chunk` (no imatrix).

    engine "numpy": NumPy for the types in `NUMPY_QUANTIZERS` (and F32/F16/BF16), ggml's own quantizer for
    the rest, with `imatrix` ([n] importance per column) passed through where the type needs one.
    engine "ggml": ggml's quantizer for every type it offers (the same bytes, tests/test_quant_quantize.py;
    about 100x faster for the K-quants).
    """
    if engine not in ("numpy", "ggml"):
        raise QuantizeError(f"{name}: unknown quantizer engine {engine!r} (numpy, ggml)")
    info = type_info(t)
    t = info.type
    x = np.asarray(x, dtype=F32)
    n = x.shape[-1]
    if n % info.block_size:
        raise QuantizeError(f"{name}: rows of {n} values do not fit {t.name} blocks of {info.block_size}")
    if not np.all(np.isfinite(x)):
        raise QuantizeError(f"{name}: holds NaN or inf; refusing to quantize it to {t.name}")
    lead = x.shape[:-1]
    if t == GGMLType.F32:
        return np.ascontiguousarray(x).view(np.uint8).reshape(*lead, -1)
    if t == GGMLType.F16:
        return fp16_bits(x).view(np.uint8).reshape(*lead, -1)
    if t == GGMLType.BF16:
        return bf16_bits(x).view(np.uint8).reshape(*lead, -1)
    fn = NUMPY_QUANTIZERS.get(t) if imatrix is None else None
    if engine == "ggml" and t not in (GGMLType.Q8_1, GGMLType.Q8_K):
        fn = None
    if fn is not None:
        blocks = np.ascontiguousarray(x).reshape(-1, info.block_size)
        return fn(blocks).reshape(*lead, info.row_bytes(n))
    from . import ggml
    if not ggml.available():
        raise QuantizeError(f"{name}: quantizing to {t.name} needs ggml's quantizer: pip install 'llama-cpp-python==0.3.36'")
    if imatrix is None and ggml.requires_imatrix(t):
        raise QuantizeError(f"{name}: ggml's {t.name} quantizer needs an importance matrix (pass imatrix=)")
    return ggml.quantize(x.reshape(-1, n), t, imatrix).reshape(*lead, info.row_bytes(n))
