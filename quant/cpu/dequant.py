"""Naive Numba block decoders: one ggml block of packed bytes -> float32, the same arithmetic as ggml.

Each `deq_<type>(row, o, out, p)` decodes the block that starts at byte `o` of the packed row `row`
(uint8 [row_bytes]) into `out[p : p + block_size]`, mirroring `dequantize_row_<type>` in
ggml/src/ggml-quants.c operation by operation in float32 (so the values equal the NumPy oracle's):
these are the readable reference kernels. The fused kernels in `dot.py` are checked against them
through the tests. `deq_block(kind, ...)` selects one by ggml type id while Numba types the caller
(`kind` is a compile-time constant there), so a kernel compiles one type's decoder only.

Block layouts (bytes, little-endian; d, m: f16 unless noted):

    Q4_0   d | qs[16]                   x[j] = (lo(qs[j]) - 8) d,  x[j+16] = (hi(qs[j]) - 8) d
    Q4_1   d m | qs[16]                 x = q d + m
    Q5_0   d | qh u32 | qs[16]          5th bit of x[j] is bit j of qh
    Q5_1   d m | qh u32 | qs[16]
    Q8_0   d | qs int8[32]              Q8_1: d s | qs int8[32] (s unused)
    Q1_0   d | qs[16]       (128)       x[j] = bit j ? d : -d
    Q2_0   d | qs[16]       (64)        x[j] = (2-bit field j - 1) d
    Q2_K   scales[16] qs[64] d dmin     16 groups of 16, 4-bit scale and min each
    Q3_K   hmask[32] qs[64] scales[12] d      6-bit signed scales, 3rd bit in hmask
    Q4_K   d dmin scales[12] qs[128]    8 groups of 32, 6-bit scale/min (get_scale_min_k4)
    Q5_K   d dmin scales[12] qh[32] qs[128]
    Q6_K   ql[128] qh[64] scales int8[16] d
    Q8_K   d f32 | qs int8[256] | bsums int16[16]
    TQ1_0  qs[48] qh[4] d               base-3 digits, 5 per byte (4 in qh)
    TQ2_0  qs[64] d                     2-bit fields, x = (q - 1) d
    IQ2_XXS d | 8 x (4 grid bytes, u32: 4 x 7 sign bits + 4-bit scale)
    IQ2_XS  d | qs u16[32] (9-bit grid, 7-bit sign) | scales[8]
    IQ2_S   d | qs[32] signs[32] | qh[8] | scales[8]
    IQ3_XXS d | qs[64] (grid of 4) | 8 x u32 (signs + scale)
    IQ3_S   d | qs[64] qh[8] signs[32] scales[4]
    IQ1_S   d | qs[32] | qh u16[8]      grid of 8 values in {-1, 0, 1} + delta
    IQ1_M   qs[32] qh[16] scales[8]     (the f16 d is spread over the scales' top nibbles)
    IQ4_NL  d | qs[16]                  x = d kvalues_iq4nl[nibble]
    IQ4_XS  d | scales_h u16 | scales_l[4] | qs[128]
    MXFP4   e (E8M0) | qs[16]           x = kvalues_mxfp4[nibble] 2^(e-128)
    NVFP4   s[4] (UE4M3) | qs[32]  (64) four sub-blocks of 16
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from ..formats import GGMLType as T
from .llvm import (
    bf16_at,
    bits_f32,
    f16_at,
    f16_bits,
    f32_at,
    i8_f32,
    ld,
    st,
    u16_at,
    u32_at,
)
from .tables import (
    E8M0_HALF,
    GRID_IQ1S,
    GRID_IQ2S,
    GRID_IQ2XS,
    GRID_IQ2XXS,
    GRID_IQ3S,
    GRID_IQ3XXS,
    IQ1S_DELTA,
    KV_IQ4NL,
    KV_MXFP4,
    SIGNS7,
    SIGNS8,
    UE4M3_HALF,
)

F32, F16, BF16 = int(T.F32), int(T.F16), int(T.BF16)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1), int(T.Q8_0), int(T.Q8_1)
Q1_0, Q2_0 = int(T.Q1_0), int(T.Q2_0)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = int(T.Q2_K), int(T.Q3_K), int(T.Q4_K), int(T.Q5_K), int(T.Q6_K), int(T.Q8_K)
TQ1_0, TQ2_0 = int(T.TQ1_0), int(T.TQ2_0)
IQ2_XXS, IQ2_XS, IQ2_S = int(T.IQ2_XXS), int(T.IQ2_XS), int(T.IQ2_S)
IQ3_XXS, IQ3_S, IQ1_S, IQ1_M = int(T.IQ3_XXS), int(T.IQ3_S), int(T.IQ1_S), int(T.IQ1_M)
IQ4_NL, IQ4_XS, MXFP4, NVFP4 = int(T.IQ4_NL), int(T.IQ4_XS), int(T.MXFP4), int(T.NVFP4)

# every type these kernels decode (the integer and f64 types are not matmul weights: the host falls back)
KINDS = (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q1_0, Q2_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
         TQ1_0, TQ2_0, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_NL, IQ4_XS, MXFP4, NVFP4)

J = {"cache": True, "inline": "always"}


# ---------------------------------------------------------------- floats

@njit(**J)
def deq_f32(row, o, out, p):
    st(out, p, f32_at(row, o))


@njit(**J)
def deq_f16(row, o, out, p):
    st(out, p, f16_at(row, o))


@njit(**J)
def deq_bf16(row, o, out, p):
    st(out, p, bf16_at(row, o))


# ---------------------------------------------------------------- 32-element blocks

@njit(**J)
def deq_q4_0(row, o, out, p):
    d = f16_at(row, o)
    for j in range(16):
        v = ld(row, o + 2 + j)
        st(out, p + j, (bits_f32(v, 0, 15) - np.float32(8)) * d)
        st(out, p + j + 16, (bits_f32(v, 4, 15) - np.float32(8)) * d)


@njit(**J)
def deq_q4_1(row, o, out, p):
    d = f16_at(row, o)
    m = f16_at(row, o + 2)
    for j in range(16):
        v = ld(row, o + 4 + j)
        st(out, p + j, bits_f32(v, 0, 15) * d + m)
        st(out, p + j + 16, bits_f32(v, 4, 15) * d + m)


@njit(**J)
def deq_q5_0(row, o, out, p):
    d = f16_at(row, o)
    qh = u32_at(row, o + 2)
    for j in range(16):
        v = ld(row, o + 6 + j)
        h0 = np.float32(((qh >> j) & 1) << 4)                   # 5th bit of x[j]
        h1 = np.float32(((qh >> (j + 16)) & 1) << 4)            # 5th bit of x[j + 16]
        st(out, p + j, (bits_f32(v, 0, 15) + h0 - np.float32(16)) * d)
        st(out, p + j + 16, (bits_f32(v, 4, 15) + h1 - np.float32(16)) * d)


@njit(**J)
def deq_q5_1(row, o, out, p):
    d = f16_at(row, o)
    m = f16_at(row, o + 2)
    qh = u32_at(row, o + 4)
    for j in range(16):
        v = ld(row, o + 8 + j)
        h0 = np.float32(((qh >> j) & 1) << 4)
        h1 = np.float32(((qh >> (j + 16)) & 1) << 4)
        st(out, p + j, (bits_f32(v, 0, 15) + h0) * d + m)
        st(out, p + j + 16, (bits_f32(v, 4, 15) + h1) * d + m)


@njit(**J)
def deq_q8_0(row, o, out, p):
    d = f16_at(row, o)
    for j in range(32):
        st(out, p + j, i8_f32(ld(row, o + 2 + j)) * d)


@njit(**J)
def deq_q8_1(row, o, out, p):
    d = f16_at(row, o)                                          # (the second f16, d * sum(qs), is unused)
    for j in range(32):
        st(out, p + j, i8_f32(ld(row, o + 4 + j)) * d)


@njit(**J)
def deq_iq4_nl(row, o, out, p):
    d = f16_at(row, o)
    for j in range(16):
        v = ld(row, o + 2 + j)
        st(out, p + j, d * ld(KV_IQ4NL, v & 15))
        st(out, p + j + 16, d * ld(KV_IQ4NL, v >> 4))


@njit(**J)
def deq_mxfp4(row, o, out, p):
    d = ld(E8M0_HALF, ld(row, o))
    for j in range(16):
        v = ld(row, o + 1 + j)
        st(out, p + j, ld(KV_MXFP4, v & 15) * d)
        st(out, p + j + 16, ld(KV_MXFP4, v >> 4) * d)


# ---------------------------------------------------------------- 1- and 2-bit scalar blocks

@njit(**J)
def deq_q1_0(row, o, out, p):
    d = f16_at(row, o)
    for j in range(128):
        st(out, p + j, d if (ld(row, o + 2 + (j >> 3)) >> (j & 7)) & 1 else -d)


@njit(**J)
def deq_q2_0(row, o, out, p):
    d = f16_at(row, o)
    for j in range(64):
        st(out, p + j, (bits_f32(ld(row, o + 2 + (j >> 2)), 2 * (j & 3), 3) - np.float32(1)) * d)


@njit(**J)
def deq_nvfp4(row, o, out, p):
    for s in range(4):
        d = ld(UE4M3_HALF, ld(row, o + s))
        for j in range(8):
            v = ld(row, o + 4 + 8 * s + j)
            st(out, p + 16 * s + j, ld(KV_MXFP4, v & 15) * d)
            st(out, p + 16 * s + 8 + j, ld(KV_MXFP4, v >> 4) * d)


# ---------------------------------------------------------------- K-quants (256-element super-blocks)

@njit(**J)
def scale_min_k4(row, sc, j):
    """get_scale_min_k4: the 6-bit scale and min of group j (0..7) from the 12 bytes at sc."""
    if j < 4:
        return ld(row, sc + j) & 63, ld(row, sc + j + 4) & 63
    return ((ld(row, sc + j + 4) & 0xF) | ((ld(row, sc + j - 4) >> 6) << 4),
            (ld(row, sc + j + 4) >> 4) | ((ld(row, sc + j) >> 6) << 4))


@njit(**J)
def deq_q2_k(row, o, out, p):
    d = f16_at(row, o + 80)
    dmin = f16_at(row, o + 82)
    for n in range(2):                                          # two halves of 128
        for j in range(4):                                      # 2-bit plane j of the 32 bytes
            for h in range(2):                                  # bytes 0..15, 16..31: one scale each
                sc = ld(row, o + 8 * n + 2 * j + h)
                dl = d * np.float32(sc & 0xF)
                ml = dmin * np.float32(sc >> 4)
                for l in range(16):
                    q = bits_f32(ld(row, o + 16 + 32 * n + 16 * h + l), 2 * j, 3)
                    st(out, p + 128 * n + 32 * j + 16 * h + l, dl * q - ml)


@njit(**J)
def q3_k_scale(row, o, i):
    """The i-th (0..15) 6-bit scale of a Q3_K block, minus 32: low 4 bits from bytes 0..7, high 2 from 8..11."""
    lo = (ld(row, o + 96 + (i & 7)) >> (4 * (i >> 3))) & 0xF
    hi = (ld(row, o + 104 + (i & 3)) >> (2 * (i >> 2))) & 3
    return np.float32((lo | (hi << 4)) - 32)


@njit(**J)
def deq_q3_k(row, o, out, p):
    d = f16_at(row, o + 108)
    for n in range(2):
        for j in range(4):
            m = 4 * n + j                                       # hmask bit of this plane
            for h in range(2):
                dl = d * q3_k_scale(row, o, 8 * n + 2 * j + h)
                for l in range(16):
                    b = 16 * h + l
                    q = bits_f32(ld(row, o + 32 + 32 * n + b), 2 * j, 3) - np.float32(4) + np.float32(4) * bits_f32(ld(row, o + b), m, 1)
                    st(out, p + 128 * n + 32 * j + b, dl * q)


@njit(**J)
def deq_q4_k(row, o, out, p):
    d = f16_at(row, o)
    dmin = f16_at(row, o + 2)
    for j in range(4):                                          # 64 elements: 32 low nibbles, 32 high
        s0, m0 = scale_min_k4(row, o + 4, 2 * j)
        s1, m1 = scale_min_k4(row, o + 4, 2 * j + 1)
        d1 = d * np.float32(s0)
        m1f = dmin * np.float32(m0)
        d2 = d * np.float32(s1)
        m2f = dmin * np.float32(m1)
        for l in range(32):
            v = ld(row, o + 16 + 32 * j + l)
            st(out, p + 64 * j + l, d1 * bits_f32(v, 0, 15) - m1f)
            st(out, p + 64 * j + 32 + l, d2 * bits_f32(v, 4, 15) - m2f)


@njit(**J)
def deq_q5_k(row, o, out, p):
    d = f16_at(row, o)
    dmin = f16_at(row, o + 2)
    for j in range(4):
        s0, m0 = scale_min_k4(row, o + 4, 2 * j)
        s1, m1 = scale_min_k4(row, o + 4, 2 * j + 1)
        d1 = d * np.float32(s0)
        m1f = dmin * np.float32(m0)
        d2 = d * np.float32(s1)
        m2f = dmin * np.float32(m1)
        for l in range(32):
            v = ld(row, o + 48 + 32 * j + l)
            h = ld(row, o + 16 + l)
            st(out, p + 64 * j + l, d1 * (bits_f32(v, 0, 15) + np.float32(16) * bits_f32(h, 2 * j, 1)) - m1f)
            st(out, p + 64 * j + 32 + l, d2 * (bits_f32(v, 4, 15) + np.float32(16) * bits_f32(h, 2 * j + 1, 1)) - m2f)


@njit(**J)
def deq_q6_k(row, o, out, p):
    d = f16_at(row, o + 208)
    for n in range(2):
        ql = o + 64 * n
        qh = o + 128 + 32 * n
        sc = o + 192 + 8 * n
        for l in range(32):
            h = ld(row, qh + l)
            q1 = bits_f32(ld(row, ql + l), 0, 15) + np.float32(16) * bits_f32(h, 0, 3) - np.float32(32)
            q2 = bits_f32(ld(row, ql + 32 + l), 0, 15) + np.float32(16) * bits_f32(h, 2, 3) - np.float32(32)
            q3 = bits_f32(ld(row, ql + l), 4, 15) + np.float32(16) * bits_f32(h, 4, 3) - np.float32(32)
            q4 = bits_f32(ld(row, ql + 32 + l), 4, 15) + np.float32(16) * bits_f32(h, 6, 3) - np.float32(32)
            i = l // 16
            st(out, p + 128 * n + l, d * i8_f32(ld(row, sc + i)) * q1)
            st(out, p + 128 * n + 32 + l, d * i8_f32(ld(row, sc + i + 2)) * q2)
            st(out, p + 128 * n + 64 + l, d * i8_f32(ld(row, sc + i + 4)) * q3)
            st(out, p + 128 * n + 96 + l, d * i8_f32(ld(row, sc + i + 6)) * q4)


@njit(**J)
def deq_q8_k(row, o, out, p):
    d = f32_at(row, o)
    for j in range(256):
        st(out, p + j, d * i8_f32(ld(row, o + 4 + j)))


# ---------------------------------------------------------------- ternary

@njit(**J)
def tq1_digit(byte, n):
    """n-th base-3 digit (0..2) of a TQ1_0 byte: ((uint8)(byte * 3^n) * 3) >> 8."""
    q = (byte * (3 ** n)) & 0xFF
    return np.float32((q * 3) >> 8)


@njit(**J)
def deq_tq1_0(row, o, out, p):
    d = f16_at(row, o + 52)
    k = 0
    for n in range(5):                                          # qs[0:32]: 5 digits per byte
        for m in range(32):
            st(out, p + k, (tq1_digit(np.int64(ld(row, o + m)), n) - np.float32(1)) * d)
            k += 1
    for n in range(5):                                          # qs[32:48]
        for m in range(16):
            st(out, p + k, (tq1_digit(np.int64(ld(row, o + 32 + m)), n) - np.float32(1)) * d)
            k += 1
    for n in range(4):                                          # qh[4]: 4 digits per byte
        for m in range(4):
            st(out, p + k, (tq1_digit(np.int64(ld(row, o + 48 + m)), n) - np.float32(1)) * d)
            k += 1


@njit(**J)
def deq_tq2_0(row, o, out, p):
    d = f16_at(row, o + 64)
    for j in range(2):
        for l in range(4):
            for m in range(32):
                st(out, p + 128 * j + 32 * l + m, (bits_f32(ld(row, o + 32 * j + m), 2 * l, 3) - np.float32(1)) * d)


# ---------------------------------------------------------------- i-quants (grids of 8 or 4 values)

@njit(**J)
def deq_iq2_xxs(row, o, out, p):
    d = f16_at(row, o)
    for ib in range(8):
        q = o + 2 + 8 * ib
        aux = u32_at(row, q + 4)                                # 4 x 7 sign bits, 4-bit scale on top
        db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.25)
        for l in range(4):
            g = ld(row, q + l)
            s = (aux >> (7 * l)) & 127
            for j in range(8):
                st(out, p + 32 * ib + 8 * l + j, db * ld(GRID_IQ2XXS, 8 * g + j) * ld(SIGNS7, 8 * s + j))


@njit(**J)
def deq_iq2_xs(row, o, out, p):
    d = f16_at(row, o)
    for ib in range(8):
        sc = ld(row, o + 66 + ib)
        db0 = d * (np.float32(0.5) + np.float32(sc & 0xF)) * np.float32(0.25)
        db1 = d * (np.float32(0.5) + np.float32(sc >> 4)) * np.float32(0.25)
        for l in range(4):
            q = u16_at(row, o + 2 + 8 * ib + 2 * l)
            db = db0 if l < 2 else db1
            for j in range(8):
                st(out, p + 32 * ib + 8 * l + j, db * ld(GRID_IQ2XS, 8 * (q & 511) + j) * ld(SIGNS7, 8 * (q >> 9) + j))


@njit(**J)
def deq_iq2_s(row, o, out, p):
    d = f16_at(row, o)
    for ib in range(8):
        sc = ld(row, o + 74 + ib)
        qh = np.int64(ld(row, o + 66 + ib))
        db0 = d * (np.float32(0.5) + np.float32(sc & 0xF)) * np.float32(0.25)
        db1 = d * (np.float32(0.5) + np.float32(sc >> 4)) * np.float32(0.25)
        for l in range(4):
            g = np.int64(ld(row, o + 2 + 4 * ib + l)) | ((qh << (8 - 2 * l)) & 0x300)
            s = ld(row, o + 34 + 4 * ib + l)
            db = db0 if l < 2 else db1
            for j in range(8):
                st(out, p + 32 * ib + 8 * l + j, db * ld(GRID_IQ2S, 8 * g + j) * ld(SIGNS8, 8 * s + j))


@njit(**J)
def deq_iq3_xxs(row, o, out, p):
    d = f16_at(row, o)
    for ib in range(8):
        aux = u32_at(row, o + 66 + 4 * ib)
        db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.5)
        for l in range(4):
            s = (aux >> (7 * l)) & 127
            g1 = ld(row, o + 2 + 8 * ib + 2 * l)
            g2 = ld(row, o + 2 + 8 * ib + 2 * l + 1)
            for j in range(4):
                st(out, p + 32 * ib + 8 * l + j, db * ld(GRID_IQ3XXS, 4 * g1 + j) * ld(SIGNS7, 8 * s + j))
                st(out, p + 32 * ib + 8 * l + 4 + j, db * ld(GRID_IQ3XXS, 4 * g2 + j) * ld(SIGNS7, 8 * s + 4 + j))


@njit(**J)
def deq_iq3_s(row, o, out, p):
    d = f16_at(row, o)
    for ib in range(8):                                         # 32 elements each; a scale nibble per 32
        sc = ld(row, o + 106 + ib // 2)
        db = d * np.float32(1 + 2 * ((sc >> (4 * (ib & 1))) & 0xF))
        qh = np.int64(ld(row, o + 66 + ib))
        for l in range(4):
            g1 = np.int64(ld(row, o + 2 + 8 * ib + 2 * l)) | ((qh << (8 - 2 * l)) & 256)
            g2 = np.int64(ld(row, o + 2 + 8 * ib + 2 * l + 1)) | ((qh << (7 - 2 * l)) & 256)
            s = ld(row, o + 74 + 4 * ib + l)
            for j in range(4):
                st(out, p + 32 * ib + 8 * l + j, db * ld(GRID_IQ3S, 4 * g1 + j) * ld(SIGNS8, 8 * s + j))
                st(out, p + 32 * ib + 8 * l + 4 + j, db * ld(GRID_IQ3S, 4 * g2 + j) * ld(SIGNS8, 8 * s + 4 + j))


@njit(**J)
def deq_iq1_s(row, o, out, p):
    d = f16_at(row, o)
    for ib in range(8):
        qh = u16_at(row, o + 34 + 2 * ib)
        dl = d * np.float32(2 * ((qh >> 12) & 7) + 1)
        delta = -IQ1S_DELTA if qh & 0x8000 else IQ1S_DELTA
        for l in range(4):
            g = np.int64(ld(row, o + 2 + 4 * ib + l)) | (((qh >> (3 * l)) & 7) << 8)
            for j in range(8):
                st(out, p + 32 * ib + 8 * l + j, dl * (ld(GRID_IQ1S, 8 * g + j) + delta))


@njit(**J)
def iq1_m_scale(row, o):
    """IQ1_M's f16 super-scale, spread over the top nibbles of its four u16 scale words -> float32."""
    s0 = u16_at(row, o + 48)
    s1 = u16_at(row, o + 50)
    s2 = u16_at(row, o + 52)
    s3 = u16_at(row, o + 54)
    return f16_bits((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000))


@njit(**J)
def deq_iq1_m(row, o, out, p):
    d = iq1_m_scale(row, o)
    for ib in range(8):
        sc = u16_at(row, o + 48 + 2 * (ib // 2))
        dl1 = d * np.float32(2 * ((sc >> (6 * (ib % 2))) & 7) + 1)
        dl2 = d * np.float32(2 * ((sc >> (6 * (ib % 2) + 3)) & 7) + 1)
        for l in range(4):
            qh = np.int64(ld(row, o + 32 + 2 * ib + l // 2))
            g = np.int64(ld(row, o + 4 * ib + l)) | ((qh << (8 - 4 * (l % 2))) & 0x700)
            delta = -IQ1S_DELTA if qh & (0x08 << (4 * (l % 2))) else IQ1S_DELTA
            dl = dl1 if l < 2 else dl2
            for j in range(8):
                st(out, p + 32 * ib + 8 * l + j, dl * (ld(GRID_IQ1S, 8 * g + j) + delta))


@njit(**J)
def deq_iq4_xs(row, o, out, p):
    d = f16_at(row, o)
    sh = u16_at(row, o + 2)
    for ib in range(8):
        ls = ((ld(row, o + 4 + ib // 2) >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)
        dl = d * np.float32(ls - 32)
        for j in range(16):
            v = ld(row, o + 8 + 16 * ib + j)
            st(out, p + 32 * ib + j, dl * ld(KV_IQ4NL, v & 15))
            st(out, p + 32 * ib + 16 + j, dl * ld(KV_IQ4NL, v >> 4))


# ---------------------------------------------------------------- dispatch

DEQ = {F32: deq_f32, F16: deq_f16, BF16: deq_bf16, Q4_0: deq_q4_0, Q4_1: deq_q4_1, Q5_0: deq_q5_0,
       Q5_1: deq_q5_1, Q8_0: deq_q8_0, Q8_1: deq_q8_1, Q1_0: deq_q1_0, Q2_0: deq_q2_0, Q2_K: deq_q2_k,
       Q3_K: deq_q3_k, Q4_K: deq_q4_k, Q5_K: deq_q5_k, Q6_K: deq_q6_k, Q8_K: deq_q8_k, TQ1_0: deq_tq1_0,
       TQ2_0: deq_tq2_0, IQ2_XXS: deq_iq2_xxs, IQ2_XS: deq_iq2_xs, IQ2_S: deq_iq2_s, IQ3_XXS: deq_iq3_xxs,
       IQ3_S: deq_iq3_s, IQ1_S: deq_iq1_s, IQ1_M: deq_iq1_m, IQ4_NL: deq_iq4_nl, IQ4_XS: deq_iq4_xs,
       MXFP4: deq_mxfp4, NVFP4: deq_nvfp4}
assert set(DEQ) == set(KINDS)


def literal_kind(kind) -> int:
    """The ggml type id carried by a Numba IntegerLiteral type (kernels pass `kind` as a constant)."""
    if not isinstance(kind, types.IntegerLiteral):
        raise TypeError(f"quant.cpu: the ggml type must be a compile-time constant, got {kind}")
    return kind.literal_value


def deq_block(kind, row, o, out, p):
    """Numba only: decode the block of ggml type `kind` (a constant) at byte o of row into out[p:]."""
    raise NotImplementedError("deq_block is callable from Numba-compiled code only")


@overload(deq_block, inline="always", prefer_literal=True)
def _deq_block(kind, row, o, out, p):
    # resolved while typing: only the decoder of this one type is compiled into the caller
    fn = DEQ[literal_kind(kind)]
    return lambda kind, row, o, out, p: fn(row, o, out, p)
