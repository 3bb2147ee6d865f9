"""Fused GEMV row kernels: one packed weight row . one activation row, read straight from the bytes.

    dot_<type>(row, x, c, m) -> float64      row: uint8 [row_bytes], x: f32 [I],
                                             c, m: f32 [16] per-thread scratch for block scales

Every quantized format here is affine per sub-block of 16 or 32 weights: w = c q - m, with q a small
unsigned integer (or a code-book value) and c, m per sub-block (Q4_K: c = d sc, m = dmin mn; Q6_K:
c = d sc, m = 32 c; ...). A kernel computes, per weight,

    w = fma(c, q, -m)          (one rounding, where ggml's dequantize rounds twice)
    s = fma(w, x, s)

or, where the offset is an integer and one scale covers two lanes (Q4_0: w = d (q - 8)),
s += d ((q0 - 8) x0 + (q1 - 8) x1), which is as exact (q - 8 is an exact float) and one op cheaper.
Either way it costs about a float32 dot product plus the unpacking of q, and the dequantized row
is never written anywhere.

Loop shape, the same in every kernel (the stage comments refer to it):
  1. per group of 256 weights, decode the sub-block scales into `c`, `m` (or scalars);
  2. one inner loop over the 16 (or 32) lanes of a sub-block whose body covers every sub-block of
     the group (a constant loop that LLVM unrolls): LLVM vectorizes the lane loop into 512-bit
     `vpmovzxbd / vpsrld / vcvtdq2ps / vfmadd` and reduces to a scalar once per 256 weights;
  3. a float64 running sum per row, so a 14336-long row adds no more rounding than float32 BLAS.
Types without a kernel here (grids, ternary TQ1_0, NVFP4, Q1_0, Q2_0) go through decode-to-scratch
(kernels.py), and every kernel is tested against the NumPy oracle.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from .dequant import (BF16, F16, F32, IQ4_NL, IQ4_XS, MXFP4, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K,
                      Q6_K, Q8_0, Q8_1, Q8_K, TQ2_0, literal_kind)
from .llvm import bits_f32, bf16_at, f16_at, f32_at, i8_f32, ld, scales16_i8, scales16_u8, u16_at, u32_at
from .tables import E8M0_HALF, KV_IQ4NL, KV_MXFP4

J = dict(cache=True, inline="always")
LO4, LO6, HI2, SIGN8 = 0x0F0F0F0F, 0x3F3F3F3F, 0x03030303, 0x80808080     # per-byte masks of a 32-bit word
FLOAT_CHUNK = 1024      # float rows: reduce into the float64 sum every FLOAT_CHUNK elements


# ---------------------------------------------------------------- plain floats

@njit(**J)
def dot_f32(row, x, c, m):
    acc = 0.0
    for c0 in range(0, x.size, FLOAT_CHUNK):
        s = np.float32(0)
        for i in range(c0, min(x.size, c0 + FLOAT_CHUNK)):
            s += f32_at(row, 4 * i) * ld(x, i)
        acc += s
    return acc


@njit(**J)
def dot_f16(row, x, c, m):
    acc = 0.0
    for c0 in range(0, x.size, FLOAT_CHUNK):
        s = np.float32(0)
        for i in range(c0, min(x.size, c0 + FLOAT_CHUNK)):
            s += f16_at(row, 2 * i) * ld(x, i)
        acc += s
    return acc


@njit(**J)
def dot_bf16(row, x, c, m):
    acc = 0.0
    for c0 in range(0, x.size, FLOAT_CHUNK):
        s = np.float32(0)
        for i in range(c0, min(x.size, c0 + FLOAT_CHUNK)):
            s += bf16_at(row, 2 * i) * ld(x, i)
        acc += s
    return acc


# ---------------------------------------------------------------- 32-element blocks, 8 per group
# `grp_<type>(row, x, c, m, g0, nk)` does blocks g0 .. g0+nk-1 of a row: `dot_<type>` calls it with
# the constant nk = 8 (unrolled, 256 weights per reduction) and once more for the 1..7 blocks left.

@njit(**J)
def grp_q8_0(row, x, c, m, g0, nk):
    o = 34 * g0
    for k in range(nk):                                         # 1. block scales
        c[k] = f16_at(row, o + 34 * k)
    s = np.float32(0)
    for l in range(32):                                         # 2. lane loop, blocks unrolled
        for k in range(nk):
            s += c[k] * i8_f32(ld(row, o + 34 * k + 2 + l)) * ld(x, 32 * (g0 + k) + l)
    return s


@njit(**J)
def grp_q8_1(row, x, c, m, g0, nk):
    o = 36 * g0
    for k in range(nk):
        c[k] = f16_at(row, o + 36 * k)
    s = np.float32(0)
    for l in range(32):
        for k in range(nk):
            s += c[k] * i8_f32(ld(row, o + 36 * k + 4 + l)) * ld(x, 32 * (g0 + k) + l)
    return s


@njit(**J)
def grp_q4_0(row, x, c, m, g0, nk):
    o = 18 * g0
    for k in range(nk):                                         # 1. block scales
        c[k] = f16_at(row, o + 18 * k)
    s = np.float32(0)
    for l in range(16):                                         # 2. byte l: nibbles of x[l], x[l + 16]
        for k in range(nk):                                     #    w = d (q - 8); q - 8 is exact
            v = ld(row, o + 18 * k + 2 + l)
            xo = 32 * (g0 + k)
            s += c[k] * ((bits_f32(v, 0, 15) - np.float32(8)) * ld(x, xo + l)
                         + (bits_f32(v, 4, 15) - np.float32(8)) * ld(x, xo + 16 + l))
    return s


@njit(**J)
def grp_q4_1(row, x, c, m, g0, nk):
    o = 20 * g0
    for k in range(nk):                                         # 1. w = d q + min
        c[k] = f16_at(row, o + 20 * k)
        m[k] = -f16_at(row, o + 20 * k + 2)
    s = np.float32(0)
    for l in range(16):
        for k in range(nk):
            v = ld(row, o + 20 * k + 4 + l)
            xo = 32 * (g0 + k)
            s += ((c[k] * bits_f32(v, 0, 15) - m[k]) * ld(x, xo + l)
                  + (c[k] * bits_f32(v, 4, 15) - m[k]) * ld(x, xo + 16 + l))
    return s


@njit(**J)
def grp_q5_0(row, x, c, m, g0, nk):
    o = 22 * g0
    for k in range(nk):
        c[k] = f16_at(row, o + 22 * k)
    s = np.float32(0)
    for l in range(16):
        for k in range(nk):                                     # w = d (q - 16)
            b = o + 22 * k
            qh = u32_at(row, b + 2)                             # 5th bits: bit l -> x[l], bit 16+l -> x[16+l]
            v = ld(row, b + 6 + l)
            xo = 32 * (g0 + k)
            q0 = bits_f32(v, 0, 15) + np.float32(16) * bits_f32(qh, l, 1) - np.float32(16)
            q1 = bits_f32(v, 4, 15) + np.float32(16) * bits_f32(qh, l + 16, 1) - np.float32(16)
            s += c[k] * (q0 * ld(x, xo + l) + q1 * ld(x, xo + 16 + l))
    return s


@njit(**J)
def grp_q5_1(row, x, c, m, g0, nk):
    o = 24 * g0
    for k in range(nk):
        c[k] = f16_at(row, o + 24 * k)
        m[k] = -f16_at(row, o + 24 * k + 2)
    s = np.float32(0)
    for l in range(16):
        for k in range(nk):
            b = o + 24 * k
            qh = u32_at(row, b + 4)
            v = ld(row, b + 8 + l)
            xo = 32 * (g0 + k)
            q0 = bits_f32(v, 0, 15) + np.float32(16) * bits_f32(qh, l, 1)
            q1 = bits_f32(v, 4, 15) + np.float32(16) * bits_f32(qh, l + 16, 1)
            s += (c[k] * q0 - m[k]) * ld(x, xo + l) + (c[k] * q1 - m[k]) * ld(x, xo + 16 + l)
    return s


@njit(**J)
def grp_iq4_nl(row, x, c, m, g0, nk):
    o = 18 * g0
    for k in range(nk):
        c[k] = f16_at(row, o + 18 * k)
    s = np.float32(0)
    for l in range(16):                                         # non-linear: a 16-entry code book
        for k in range(nk):
            v = ld(row, o + 18 * k + 2 + l)
            xo = 32 * (g0 + k)
            s += c[k] * (ld(KV_IQ4NL, v & 15) * ld(x, xo + l) + ld(KV_IQ4NL, v >> 4) * ld(x, xo + 16 + l))
    return s


@njit(**J)
def grp_mxfp4(row, x, c, m, g0, nk):
    o = 17 * g0
    for k in range(nk):
        c[k] = ld(E8M0_HALF, row[o + 17 * k])
    s = np.float32(0)
    for l in range(16):
        for k in range(nk):
            v = ld(row, o + 17 * k + 1 + l)
            xo = 32 * (g0 + k)
            s += c[k] * (ld(KV_MXFP4, v & 15) * ld(x, xo + l) + ld(KV_MXFP4, v >> 4) * ld(x, xo + 16 + l))
    return s


@njit(**J)
def dot_q8_0(row, x, c, m):
    nb = x.size // 32
    full = nb - nb % 8
    acc = 0.0
    for g0 in range(0, full, 8):
        acc += grp_q8_0(row, x, c, m, g0, 8)
    if full < nb:
        acc += grp_q8_0(row, x, c, m, full, nb - full)
    return acc


@njit(**J)
def dot_q8_1(row, x, c, m):
    nb = x.size // 32
    full = nb - nb % 8
    acc = 0.0
    for g0 in range(0, full, 8):
        acc += grp_q8_1(row, x, c, m, g0, 8)
    if full < nb:
        acc += grp_q8_1(row, x, c, m, full, nb - full)
    return acc


@njit(**J)
def dot_q4_0(row, x, c, m):
    nb = x.size // 32
    full = nb - nb % 8
    acc = 0.0
    for g0 in range(0, full, 8):
        acc += grp_q4_0(row, x, c, m, g0, 8)
    if full < nb:
        acc += grp_q4_0(row, x, c, m, full, nb - full)
    return acc


@njit(**J)
def dot_q4_1(row, x, c, m):
    nb = x.size // 32
    full = nb - nb % 8
    acc = 0.0
    for g0 in range(0, full, 8):
        acc += grp_q4_1(row, x, c, m, g0, 8)
    if full < nb:
        acc += grp_q4_1(row, x, c, m, full, nb - full)
    return acc


@njit(**J)
def dot_q5_0(row, x, c, m):
    nb = x.size // 32
    full = nb - nb % 8
    acc = 0.0
    for g0 in range(0, full, 8):
        acc += grp_q5_0(row, x, c, m, g0, 8)
    if full < nb:
        acc += grp_q5_0(row, x, c, m, full, nb - full)
    return acc


@njit(**J)
def dot_q5_1(row, x, c, m):
    nb = x.size // 32
    full = nb - nb % 8
    acc = 0.0
    for g0 in range(0, full, 8):
        acc += grp_q5_1(row, x, c, m, g0, 8)
    if full < nb:
        acc += grp_q5_1(row, x, c, m, full, nb - full)
    return acc


@njit(**J)
def dot_iq4_nl(row, x, c, m):
    nb = x.size // 32
    full = nb - nb % 8
    acc = 0.0
    for g0 in range(0, full, 8):
        acc += grp_iq4_nl(row, x, c, m, g0, 8)
    if full < nb:
        acc += grp_iq4_nl(row, x, c, m, full, nb - full)
    return acc


@njit(**J)
def dot_mxfp4(row, x, c, m):
    nb = x.size // 32
    full = nb - nb % 8
    acc = 0.0
    for g0 in range(0, full, 8):
        acc += grp_mxfp4(row, x, c, m, g0, 8)
    if full < nb:
        acc += grp_mxfp4(row, x, c, m, full, nb - full)
    return acc


# ---------------------------------------------------------------- 256-element super-blocks

# Scales: the 12 or 16 scale bytes are rearranged with 32-bit masks into 16 bytes (ggml's trick) and
# widened to 16 float32 scales in one go (`scales16_*`); scalar code spends ~100 instructions there.

@njit(**J)
def dot_q2_k(row, x, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 84 * b
        d = f16_at(row, o + 80)
        dmin = f16_at(row, o + 82)
        w0 = u32_at(row, o)                                     # 1. 16 bytes: scale (low 4 bits), min (high 4)
        w1 = u32_at(row, o + 4)
        w2 = u32_at(row, o + 8)
        w3 = u32_at(row, o + 12)
        scales16_u8(c, 0, w0 & LO4, w1 & LO4, w2 & LO4, w3 & LO4, d, d)
        scales16_u8(m, 0, (w0 >> 4) & LO4, (w1 >> 4) & LO4, (w2 >> 4) & LO4, (w3 >> 4) & LO4, dmin, dmin)
        s = np.float32(0)
        xo = 256 * b
        for l in range(16):                                     # 2. 16 lanes x 16 sub-blocks, w = c q - m
            for n in range(2):
                for j in range(4):
                    for h in range(2):
                        i = 8 * n + 2 * j + h
                        q = bits_f32(ld(row, o + 16 + 32 * n + 16 * h + l), 2 * j, 3)
                        s += (ld(c, i) * q - ld(m, i)) * ld(x, xo + 128 * n + 32 * j + 16 * h + l)
        acc += s
    return acc


@njit(**J)
def dot_q3_k(row, x, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 110 * b
        a0 = u32_at(row, o + 96)                                # 1. 16 6-bit scales: low 4 bits in bytes 0..7,
        a1 = u32_at(row, o + 100)                               #    high 2 bits in bytes 8..11 (ggml's aux[])
        t = u32_at(row, o + 104)
        s0 = (a0 & LO4) | ((t & HI2) << 4)
        s1 = (a1 & LO4) | (((t >> 2) & HI2) << 4)
        s2 = ((a0 >> 4) & LO4) | (((t >> 4) & HI2) << 4)
        s3 = ((a1 >> 4) & LO4) | (((t >> 6) & HI2) << 4)
        d = f16_at(row, o + 108)                                #    bytes - 32 as int8: (b + 0x60) ^ 0x80
        scales16_i8(c, 0, (s0 + 0x60606060) ^ SIGN8, (s1 + 0x60606060) ^ SIGN8, (s2 + 0x60606060) ^ SIGN8,
                    (s3 + 0x60606060) ^ SIGN8, d, d)
        s = np.float32(0)
        xo = 256 * b
        for l in range(16):                                     # 2. q = 2 low bits + 4 * hmask bit - 4
            for n in range(2):
                for j in range(4):
                    for h in range(2):
                        q = (bits_f32(ld(row, o + 32 + 32 * n + 16 * h + l), 2 * j, 3)
                             + np.float32(4) * bits_f32(ld(row, o + 16 * h + l), 4 * n + j, 1) - np.float32(4))
                        s += ld(c, 8 * n + 2 * j + h) * q * ld(x, xo + 128 * n + 32 * j + 16 * h + l)
        acc += s
    return acc


@njit(**J)
def k4_scales(row, o, c):
    """get_scale_min_k4 for the 8 sub-blocks of the Q4_K/Q5_K block at o: c[i] = d sc_i, c[8 + i] = dmin mn_i."""
    w0 = u32_at(row, o + 4)
    w1 = u32_at(row, o + 8)
    w2 = u32_at(row, o + 12)
    scales16_u8(c, 0, w0 & LO6, (w2 & LO4) | ((w0 >> 2) & (HI2 << 4)),
                w1 & LO6, ((w2 >> 4) & LO4) | ((w1 >> 2) & (HI2 << 4)), f16_at(row, o), f16_at(row, o + 2))


@njit(**J)
def dot_q4_k(row, x, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 144 * b
        k4_scales(row, o, c)                                    # 1. 6-bit scales and mins per 32
        s = np.float32(0)
        xo = 256 * b
        for l in range(32):                                     # 2. 32 lanes x 8 sub-blocks
            for j in range(4):
                v = ld(row, o + 16 + 32 * j + l)
                s += ((ld(c, 2 * j) * bits_f32(v, 0, 15) - ld(c, 8 + 2 * j)) * ld(x, xo + 64 * j + l)
                      + (ld(c, 2 * j + 1) * bits_f32(v, 4, 15) - ld(c, 9 + 2 * j)) * ld(x, xo + 64 * j + 32 + l))
        acc += s
    return acc


@njit(**J)
def dot_q5_k(row, x, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 176 * b
        k4_scales(row, o, c)
        s = np.float32(0)
        xo = 256 * b
        for l in range(32):                                     # 2. 4 low bits + 16 * qh bit
            h = ld(row, o + 16 + l)
            for j in range(4):
                v = ld(row, o + 48 + 32 * j + l)
                q0 = bits_f32(v, 0, 15) + np.float32(16) * bits_f32(h, 2 * j, 1)
                q1 = bits_f32(v, 4, 15) + np.float32(16) * bits_f32(h, 2 * j + 1, 1)
                s += ((ld(c, 2 * j) * q0 - ld(c, 8 + 2 * j)) * ld(x, xo + 64 * j + l)
                      + (ld(c, 2 * j + 1) * q1 - ld(c, 9 + 2 * j)) * ld(x, xo + 64 * j + 32 + l))
        acc += s
    return acc


@njit(**J)
def dot_q6_k(row, x, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 210 * b
        d = f16_at(row, o + 208)
        scales16_i8(c, 0, u32_at(row, o + 192), u32_at(row, o + 196), u32_at(row, o + 200),   # 1. int8 scales
                    u32_at(row, o + 204), d, d)
        s = np.float32(0)
        xo = 256 * b
        for l in range(16):                                     # 2. q = 4 bits of ql + 16 * 2 bits of qh - 32
            for n in range(2):
                for qq in range(4):
                    for h in range(2):
                        lo = bits_f32(ld(row, o + 64 * n + 32 * (qq & 1) + 16 * h + l), 4 * (qq >> 1), 15)
                        hi = bits_f32(ld(row, o + 128 + 32 * n + 16 * h + l), 2 * qq, 3)
                        s += (ld(c, 8 * n + 2 * qq + h) * (lo + np.float32(16) * hi - np.float32(32))
                              * ld(x, xo + 128 * n + 32 * qq + 16 * h + l))
        acc += s
    return acc


@njit(**J)
def dot_q8_k(row, x, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 292 * b
        d = f32_at(row, o)
        s = np.float32(0)
        for l in range(32):
            for j in range(8):
                s += d * i8_f32(ld(row, o + 4 + 32 * j + l)) * ld(x, 256 * b + 32 * j + l)
        acc += s
    return acc


@njit(**J)
def dot_tq2_0(row, x, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 66 * b
        s = np.float32(0)
        xo = 256 * b
        for l in range(32):                                     # 2-bit planes: w = d (q - 1)
            for j in range(2):
                v = ld(row, o + 32 * j + l)
                for p in range(4):
                    s += (bits_f32(v, 2 * p, 3) - np.float32(1)) * ld(x, xo + 128 * j + 32 * p + l)
        acc += f16_at(row, o + 64) * s
    return acc


@njit(**J)
def dot_iq4_xs(row, x, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 136 * b
        d = f16_at(row, o)
        sh = u16_at(row, o + 2)
        for ib in range(8):                                     # 1. 6-bit scales, minus 32
            ls = ((ld(row, o + 4 + ib // 2) >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)
            c[ib] = d * np.float32(ls - 32)
        s = np.float32(0)
        xo = 256 * b
        for l in range(16):
            for ib in range(8):
                v = ld(row, o + 8 + 16 * ib + l)
                s += c[ib] * (ld(KV_IQ4NL, v & 15) * ld(x, xo + 32 * ib + l) + ld(KV_IQ4NL, v >> 4) * ld(x, xo + 32 * ib + 16 + l))
        acc += s
    return acc


# ---------------------------------------------------------------- dispatch

DOT = {F32: dot_f32, F16: dot_f16, BF16: dot_bf16, Q8_0: dot_q8_0, Q8_1: dot_q8_1, Q4_0: dot_q4_0,
       Q4_1: dot_q4_1, Q5_0: dot_q5_0, Q5_1: dot_q5_1, IQ4_NL: dot_iq4_nl, MXFP4: dot_mxfp4, Q2_K: dot_q2_k,
       Q3_K: dot_q3_k, Q4_K: dot_q4_k, Q5_K: dot_q5_k, Q6_K: dot_q6_k, Q8_K: dot_q8_k, TQ2_0: dot_tq2_0,
       IQ4_XS: dot_iq4_xs}
FUSED = tuple(DOT)


def row_dot(kind, row, x, c, m):
    """Numba only: fused row . x for ggml type `kind` (a compile-time constant in FUSED)."""
    raise NotImplementedError("row_dot is callable from Numba-compiled code only")


@overload(row_dot, inline="always", prefer_literal=True)
def _row_dot(kind, row, x, c, m):
    # resolved while typing: only this type's kernel is compiled into the caller
    fn = DOT.get(literal_kind(kind))
    if fn is None:
        return lambda kind, row, x, c, m: 0.0           # not fused: the drivers never call it
    return lambda kind, row, x, c, m: fn(row, x, c, m)
