"""llama.cpp mode: round the activations of a matmul the way ggml's CPU backend does, then multiply.

ggml-cpu never multiplies a quantized weight by float32 activations. `ggml_compute_forward_mul_mat`
first converts each activation row to the weight type's partner, `type_traits_cpu[w].vec_dot_type`,
with that type's `from_float`, and the dot product runs on the converted row:

    y = matmul(x, w, mode="llamacpp")  =  round_to_partner(x) @ dequantize(w).T

    weight type                                   partner   from_float on x86 (AVX2 build)
    F32                                           F32       none
    F16                                           F16       F16C vcvtps2ph, round to nearest even
    BF16                                          BF16      GGML_FP32_TO_BF16, round to nearest even
    Q4_0 Q5_0 Q8_0 IQ4_NL MXFP4 NVFP4 Q1_0 Q2_0   Q8_0      quantize_row_q8_0 (AVX: id = 127/amax, rint)
    Q4_1 Q5_1                                     Q8_1      quantize_row_q8_1 (AVX, as Q8_0 plus s)

Q8_1 carries one more rounding into the product: `ggml_vec_dot_q4_1_q8_1` (and q5_1) computes a block as
`d_w*d_x*sum(q_w*q_x) + m_w*s_x` with `s_x = fp16(d_x*sum(q_x))` stored in the activation block, not
the exact `d_x*sum(q_x)`; `q8_1_min_term` adds that difference, `m_w*(s_x - d_x*sum(q_x))`, per block.
    Q2_K..Q6_K IQ* TQ1_0 TQ2_0                    Q8_K      quantize_row_q8_K_ref (x86 has no SIMD one)

Every other kernel path llama.cpp can take keeps that rounding: llamafile's tinyBLAS (sgemm.cpp) consumes
the same converted rows; the tiled K-quant path (tiled.cpp) calls the same `from_float`; the repacked
weights of the CPU_REPACK buffer (repack.cpp, chosen on AVX2 for Q4_0, Q4_K, IQ4_NL, MXFP4 and with
AVX-512 for Q2_K) quantize groups of 4 rows with `ggml_quantize_mat_q8_0_4x8` / `_q8_K_4x8`, whose x86
versions use the same formulas (Q8_K: the same values; when +amax and -amax both occur, the 4x8 version
picks the positive one, which flips the sign of d and of every q and leaves every product unchanged).
tests/test_llamacpp_mode.py checks each rounding against libggml-cpu byte for byte.

The x86 Q8_0 quantizer differs from the reference one (`quantize_row_q8_0_ref`: id = 1/(amax/127),
roundf) in the last bit of `id` and in how it breaks .5 ties, so both are here: `PROFILE_X86` is chosen
when libggml-cpu reports AVX, `PROFILE_REF` (what a non-SIMD build runs) otherwise.
The dot product itself is float32 arithmetic in another order than ggml's integer-block sums: that
difference is rounding noise, not a modelled step.
"""
from __future__ import annotations

import platform
from functools import lru_cache

import numpy as np

from .formats import GGMLType, TYPES, type_info
from .quantize import quantize_q8_0, quantize_q8_1, quantize_q8_k
from .rounding import F32, bf16_round, fp16_bits, fp16_round

PROFILE_X86 = "x86-avx"      # ggml-cpu built with AVX/AVX2 (quants.c in ggml-cpu/arch/x86)
PROFILE_REF = "reference"    # the generic C code (`quantize_row_q8_0_ref` etc.)
PROFILES = (PROFILE_X86, PROFILE_REF)


@lru_cache(maxsize=None)
def cpu_profile() -> str:
    """Which activation quantizers the llama.cpp in use runs: asked from libggml-cpu when it is installed
    (`ggml_cpu_has_avx`), else guessed from the machine (x86-64 builds of llama.cpp enable AVX2)."""
    from . import ggml
    if ggml.available():
        from . import ggml_cpu
        f = ggml_cpu.features()
        return PROFILE_X86 if (f.get("avx") or f.get("avx2")) else PROFILE_REF
    return PROFILE_X86 if platform.machine().lower() in ("x86_64", "amd64") else PROFILE_REF


def partner(t) -> GGMLType:
    """The activation type ggml-cpu converts x to for a weight of type t (`vec_dot_type`)."""
    info = type_info(t)
    if info.vec_dot_type is None:
        raise ValueError(f"ggml-cpu has no matmul for weights of type {info.type.name}")
    return info.vec_dot_type


# ---------------------------------------------------------------- x86 SIMD activation quantizers

def _q8_x86(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The AVX body of `quantize_row_q8_0` / `_q8_1` (ggml-cpu/arch/x86/quants.c) on blocks [N, 32]:

        amax = max |x|;  d = amax / 127.f;  id = amax != 0 ? 127.f / amax : 0
        q    = saturate_int8(round_half_even(x * id))          (_mm256_round_ps, _mm256_packs_epi32/16)

    -> d float32 [N], d as fp16 bits [N], q int8 [N, 32]."""
    amax = np.max(np.abs(b), axis=-1)
    d = amax / F32(127)
    nz = amax != 0
    idv = np.where(nz, F32(127) / np.where(nz, amax, F32(1)), F32(0)).astype(F32)
    q = np.clip(np.rint(b * idv[:, None]), -128, 127).astype(np.int8)
    return d, fp16_bits(d), q


def quantize_q8_0_x86(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q8_0` of an AVX build. [N, 32] -> [N, 34] (d fp16 | qs int8[32])."""
    _, dh, q = _q8_x86(b)
    return np.concatenate([dh[:, None].view(np.uint8), q.view(np.uint8)], axis=1)


def quantize_q8_1_x86(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q8_1` of an AVX2 build: Q8_0's d and qs, s = fp16(d * sum(q)) with the float32 d.
    [N, 32] -> [N, 36] (d | s | qs)."""
    d, dh, q = _q8_x86(b)
    s = d * q.astype(np.int32).sum(axis=-1).astype(F32)
    return np.concatenate([dh[:, None].view(np.uint8), fp16_bits(s)[:, None].view(np.uint8), q.view(np.uint8)], axis=1)


ACTIVATION_QUANTIZERS = {
    PROFILE_X86: {GGMLType.Q8_0: quantize_q8_0_x86, GGMLType.Q8_1: quantize_q8_1_x86, GGMLType.Q8_K: quantize_q8_k},
    PROFILE_REF: {GGMLType.Q8_0: quantize_q8_0, GGMLType.Q8_1: quantize_q8_1, GGMLType.Q8_K: quantize_q8_k},
}


def quantize_activation(x: np.ndarray, t, profile: str | None = None) -> np.ndarray:
    """x float32 [R, n] -> packed bytes [R, row_bytes] as ggml-cpu's `from_float` of partner type t
    (Q8_0, Q8_1 or Q8_K)."""
    profile = profile or cpu_profile()
    info = type_info(t)
    fn = ACTIVATION_QUANTIZERS[profile].get(info.type)
    if fn is None:
        raise ValueError(f"{info.type.name} is not an activation type with a quantizer")
    x = np.ascontiguousarray(x, dtype=F32)
    return fn(x.reshape(-1, info.block_size)).reshape(*x.shape[:-1], info.row_bytes(x.shape[-1]))


def round_activations(x: np.ndarray, weight_type, profile: str | None = None) -> np.ndarray:
    """The float32 values ggml-cpu's dot product uses for activations x [T, I] against weights of
    `weight_type`: x itself (F32), x rounded to f16 / bf16, or the values of x's Q8_0 / Q8_1 / Q8_K blocks
    (d * q; exact in float32 for Q8_0/Q8_1, within one float32 rounding for Q8_K's float32 d)."""
    from .decode import decode
    p = partner(weight_type)
    x = np.asarray(x, dtype=F32)
    if p == GGMLType.F32:
        return x
    if p == GGMLType.F16:
        return fp16_round(x)
    if p == GGMLType.BF16:
        return bf16_round(x)
    if x.shape[-1] % TYPES[p].block_size:
        raise ValueError(f"rows of {x.shape[-1]} values do not fit {p.name} blocks")
    return decode(quantize_activation(x, p, profile), p)


def q8_1_min_term(x: np.ndarray, w_raw: np.ndarray, weight_type, profile: str | None = None) -> np.ndarray:
    """The part of a Q4_1/Q5_1 x Q8_1 product that `x' @ W.T` misses: sum over blocks b of
    m_w[o, b] * (s_x[t, b] - d_x[t, b] * sum(q_x[t, b])), s_x being the fp16 block sum ggml stores.
    x float32 [T, I], w_raw packed [O, row_bytes] (Q4_1: d m qs; Q5_1: d m qh qs) -> [T, O] float32."""
    t = type_info(weight_type)
    if t.type not in (GGMLType.Q4_1, GGMLType.Q5_1):
        raise ValueError(f"{t.type.name} has no Q8_1 min term")
    xq = quantize_activation(x, GGMLType.Q8_1, profile)                       # [T, nb*36]
    T = xq.shape[0]
    xb = xq.reshape(T, -1, 36)                                                # [T, nb, 36]
    d = xb[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)
    s = xb[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    sq = xb[..., 4:36].view(np.int8).astype(np.int64).sum(axis=-1)
    corr = s - d * sq                                                         # [T, nb]
    wb = np.ascontiguousarray(w_raw).reshape(w_raw.shape[0], -1, t.type_size)  # [O, nb, type_size]
    m = wb[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)       # [O, nb]
    return (corr @ m.T).astype(F32)
