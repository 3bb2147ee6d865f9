"""Fused GEMV row kernels: one packed weight row . one activation row, read straight from the bytes.

    dot_<type>(row, x, xs, c, m) -> float64      row: uint8 [row_bytes], x: f32 [I],
                                                 xs: f32 [I/16] sums of x over each 16 elements,
                                                 c, m: f32 [16] per-thread scratch for block scales

Every quantized format is affine per group of 16 or 32 weights: w = c * q - m, with q a small
unsigned integer (or a table value) and c, m per group. So

    sum_i w_i x_i = sum_groups  c * sum_i (q_i x_i)  -  m * sum_i x_i

and the second sum is `xs`, computed once per activation row and shared by all rows of the weight
(it carries the mins of Q4_1/Q5_1/Q2_K/Q4_K/Q5_K and the offsets -8, -16, -4, -32, -1 of
Q4_0/Q5_0/Q3_K/Q6_K/TQ2_0). What remains per weight is: unpack q, convert, multiply by c, add x q.

Loop shape, the same in every kernel (the stage comments below refer to it):
  1. per group of 256 weights, decode the block scales into scalars / the small `c`, `m` arrays;
  2. one inner loop over the 16 (or 32) lanes of a sub-block, whose body covers all 16 (or 8)
     sub-blocks of the group through a fully unrolled constant loop: LLVM vectorizes the lane
     loop into 512-bit `vpmovzxbd / vpsrld / vcvtdq2ps / vfmadd` and reduces once per 256 weights;
  3. the mins/offsets against `xs`, and a float64 running sum per row (so a 14336-long row adds
     no more rounding than a float32 BLAS).
Types without a kernel here (grids, ternary, NVFP4, Q1_0, Q2_0) go through dequantize-to-scratch.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from .dequant import (BF16, F16, F32, IQ4_NL, IQ4_XS, MXFP4, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K,
                      Q6_K, Q8_0, Q8_1, Q8_K, TQ2_0, literal_kind, q3_k_scale, scale_min_k4)
from .llvm import bits_f32, bf16_at, f16_at, f32_at, i8_f32, u16_at, u32_at
from .tables import E8M0_HALF, KV_IQ4NL, KV_MXFP4

J = dict(cache=True, inline="always")
FLOAT_CHUNK = 1024      # float rows: reduce into the float64 sum every FLOAT_CHUNK elements


# ---------------------------------------------------------------- plain floats

@njit(**J)
def dot_f32(row, x, xs, c, m):
    acc = 0.0
    for c0 in range(0, x.size, FLOAT_CHUNK):
        s = np.float32(0)
        for i in range(c0, min(x.size, c0 + FLOAT_CHUNK)):
            s += f32_at(row, 4 * i) * x[i]
        acc += s
    return acc


@njit(**J)
def dot_f16(row, x, xs, c, m):
    acc = 0.0
    for c0 in range(0, x.size, FLOAT_CHUNK):
        s = np.float32(0)
        for i in range(c0, min(x.size, c0 + FLOAT_CHUNK)):
            s += f16_at(row, 2 * i) * x[i]
        acc += s
    return acc


@njit(**J)
def dot_bf16(row, x, xs, c, m):
    acc = 0.0
    for c0 in range(0, x.size, FLOAT_CHUNK):
        s = np.float32(0)
        for i in range(c0, min(x.size, c0 + FLOAT_CHUNK)):
            s += bf16_at(row, 2 * i) * x[i]
        acc += s
    return acc


# ---------------------------------------------------------------- 32-element blocks, 8 per group
# Blocks of 32 are processed 8 at a time (256 weights, one reduction): `grp_<type>(.., g0, nk)` does
# blocks g0 .. g0+nk-1. `dot_blocks32` calls it with the constant nk = 8 (fully unrolled, vectorized
# over the lanes) and once more with the 1..7 blocks left at the end of a row.
# (`grp` is passed as a function argument: the kernels are specialized per type at compile time.)

@njit(**J)
def grp_q8_0(row, x, xs, c, m, g0, nk):
    o = 34 * g0
    for k in range(nk):                                         # 1. block scales
        c[k] = f16_at(row, o + 34 * k)
    s = np.float32(0)
    for l in range(32):                                         # 2. lane loop, blocks unrolled
        for k in range(nk):
            s += c[k] * i8_f32(row[o + 34 * k + 2 + l]) * x[32 * (g0 + k) + l]
    return s


@njit(**J)
def grp_q8_1(row, x, xs, c, m, g0, nk):
    o = 36 * g0
    for k in range(nk):
        c[k] = f16_at(row, o + 36 * k)
    s = np.float32(0)
    for l in range(32):
        for k in range(nk):
            s += c[k] * i8_f32(row[o + 36 * k + 4 + l]) * x[32 * (g0 + k) + l]
    return s


@njit(**J)
def grp_q4_0(row, x, xs, c, m, g0, nk):
    o = 18 * g0
    for k in range(nk):                                         # 1. scales
        c[k] = f16_at(row, o + 18 * k)
    s = np.float32(0)
    for l in range(16):                                         # 2. byte l: nibbles of x[l], x[l + 16]
        for k in range(nk):
            v = row[o + 18 * k + 2 + l]
            xo = 32 * (g0 + k)
            s += c[k] * (bits_f32(v, 0, 15) * x[xo + l] + bits_f32(v, 4, 15) * x[xo + 16 + l])
    off = np.float32(0)                                         # 3. q - 8: minus 8 d sum(x)
    for k in range(nk):
        off += c[k] * (xs[2 * (g0 + k)] + xs[2 * (g0 + k) + 1])
    return s - np.float32(8) * off


@njit(**J)
def grp_q4_1(row, x, xs, c, m, g0, nk):
    o = 20 * g0
    for k in range(nk):
        c[k] = f16_at(row, o + 20 * k)
        m[k] = f16_at(row, o + 20 * k + 2)
    s = np.float32(0)
    for l in range(16):
        for k in range(nk):
            v = row[o + 20 * k + 4 + l]
            xo = 32 * (g0 + k)
            s += c[k] * (bits_f32(v, 0, 15) * x[xo + l] + bits_f32(v, 4, 15) * x[xo + 16 + l])
    mins = np.float32(0)                                        # 3. + m sum(x)
    for k in range(nk):
        mins += m[k] * (xs[2 * (g0 + k)] + xs[2 * (g0 + k) + 1])
    return s + mins


@njit(**J)
def grp_q5_0(row, x, xs, c, m, g0, nk):
    o = 22 * g0
    for k in range(nk):
        c[k] = f16_at(row, o + 22 * k)
    s = np.float32(0)
    for l in range(16):
        for k in range(nk):
            b = o + 22 * k
            qh = u32_at(row, b + 2)                             # 5th bits: bit l -> x[l], bit 16+l -> x[16+l]
            v = row[b + 6 + l]
            xo = 32 * (g0 + k)
            q0 = bits_f32(v, 0, 15) + np.float32(16) * bits_f32(qh, l, 1)
            q1 = bits_f32(v, 4, 15) + np.float32(16) * bits_f32(qh, l + 16, 1)
            s += c[k] * (q0 * x[xo + l] + q1 * x[xo + 16 + l])
    off = np.float32(0)                                         # 3. q - 16
    for k in range(nk):
        off += c[k] * (xs[2 * (g0 + k)] + xs[2 * (g0 + k) + 1])
    return s - np.float32(16) * off


@njit(**J)
def grp_q5_1(row, x, xs, c, m, g0, nk):
    o = 24 * g0
    for k in range(nk):
        c[k] = f16_at(row, o + 24 * k)
        m[k] = f16_at(row, o + 24 * k + 2)
    s = np.float32(0)
    for l in range(16):
        for k in range(nk):
            b = o + 24 * k
            qh = u32_at(row, b + 4)
            v = row[b + 8 + l]
            xo = 32 * (g0 + k)
            q0 = bits_f32(v, 0, 15) + np.float32(16) * bits_f32(qh, l, 1)
            q1 = bits_f32(v, 4, 15) + np.float32(16) * bits_f32(qh, l + 16, 1)
            s += c[k] * (q0 * x[xo + l] + q1 * x[xo + 16 + l])
    mins = np.float32(0)
    for k in range(nk):
        mins += m[k] * (xs[2 * (g0 + k)] + xs[2 * (g0 + k) + 1])
    return s + mins


@njit(**J)
def grp_iq4_nl(row, x, xs, c, m, g0, nk):
    o = 18 * g0
    for k in range(nk):
        c[k] = f16_at(row, o + 18 * k)
    s = np.float32(0)
    for l in range(16):                                         # non-linear: a 16-entry table per nibble
        for k in range(nk):
            v = row[o + 18 * k + 2 + l]
            xo = 32 * (g0 + k)
            s += c[k] * (KV_IQ4NL[v & 15] * x[xo + l] + KV_IQ4NL[v >> 4] * x[xo + 16 + l])
    return s


@njit(**J)
def grp_mxfp4(row, x, xs, c, m, g0, nk):
    o = 17 * g0
    for k in range(nk):
        c[k] = E8M0_HALF[row[o + 17 * k]]
    s = np.float32(0)
    for l in range(16):
        for k in range(nk):
            v = row[o + 17 * k + 1 + l]
            xo = 32 * (g0 + k)
            s += c[k] * (KV_MXFP4[v & 15] * x[xo + l] + KV_MXFP4[v >> 4] * x[xo + 16 + l])
    return s


@njit(**J)
def dot_blocks32(grp, row, x, xs, c, m):
    """Row . x for a 32-block type whose group kernel is `grp` (passed as a function)."""
    nb = x.size // 32
    full = nb - nb % 8
    acc = 0.0
    for g0 in range(0, full, 8):
        acc += grp(row, x, xs, c, m, g0, 8)
    if full < nb:
        acc += grp(row, x, xs, c, m, full, nb - full)
    return acc


# ---------------------------------------------------------------- 256-element super-blocks

@njit(**J)
def dot_q2_k(row, x, xs, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 84 * b
        d = f16_at(row, o + 80)
        dmin = f16_at(row, o + 82)
        for i in range(16):                                     # 1. 4-bit scale and min per 16
            sc = row[o + i]
            c[i] = d * np.float32(sc & 0xF)
            m[i] = dmin * np.float32(sc >> 4)
        s = np.float32(0)
        xo = 256 * b
        for l in range(16):                                     # 2. 16 lanes x 16 groups
            for n in range(2):
                for j in range(4):
                    for h in range(2):
                        q = bits_f32(row[o + 16 + 32 * n + 16 * h + l], 2 * j, 3)
                        s += c[8 * n + 2 * j + h] * q * x[xo + 128 * n + 32 * j + 16 * h + l]
        mins = np.float32(0)                                    # 3. mins
        for i in range(16):
            mins += m[i] * xs[16 * b + i]
        acc += s - mins
    return acc


@njit(**J)
def dot_q3_k(row, x, xs, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 110 * b
        d = f16_at(row, o + 108)
        for i in range(16):                                     # 1. signed 6-bit scales
            c[i] = d * q3_k_scale(row, o, i)
        s = np.float32(0)
        xo = 256 * b
        for l in range(16):                                     # 2. q = 2 low bits + 4 * hmask bit
            for n in range(2):
                for j in range(4):
                    for h in range(2):
                        q = (bits_f32(row[o + 32 + 32 * n + 16 * h + l], 2 * j, 3)
                             + np.float32(4) * bits_f32(row[o + 16 * h + l], 4 * n + j, 1))
                        s += c[8 * n + 2 * j + h] * q * x[xo + 128 * n + 32 * j + 16 * h + l]
        off = np.float32(0)                                     # 3. q - 4
        for i in range(16):
            off += c[i] * xs[16 * b + i]
        acc += s - np.float32(4) * off
    return acc


@njit(**J)
def dot_q4_k(row, x, xs, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 144 * b
        d = f16_at(row, o)
        dmin = f16_at(row, o + 2)
        for i in range(8):                                      # 1. 6-bit scales and mins per 32
            sc, mn = scale_min_k4(row, o + 4, i)
            c[i] = d * np.float32(sc)
            m[i] = dmin * np.float32(mn)
        s = np.float32(0)
        xo = 256 * b
        for l in range(32):                                     # 2. 32 lanes x 8 groups
            for j in range(4):
                v = row[o + 16 + 32 * j + l]
                s += (c[2 * j] * bits_f32(v, 0, 15) * x[xo + 64 * j + l]
                      + c[2 * j + 1] * bits_f32(v, 4, 15) * x[xo + 64 * j + 32 + l])
        mins = np.float32(0)                                    # 3. mins
        for i in range(8):
            mins += m[i] * (xs[16 * b + 2 * i] + xs[16 * b + 2 * i + 1])
        acc += s - mins
    return acc


@njit(**J)
def dot_q5_k(row, x, xs, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 176 * b
        d = f16_at(row, o)
        dmin = f16_at(row, o + 2)
        for i in range(8):
            sc, mn = scale_min_k4(row, o + 4, i)
            c[i] = d * np.float32(sc)
            m[i] = dmin * np.float32(mn)
        s = np.float32(0)
        xo = 256 * b
        for l in range(32):                                     # 2. 4 low bits + 16 * qh bit
            h = row[o + 16 + l]
            for j in range(4):
                v = row[o + 48 + 32 * j + l]
                q0 = bits_f32(v, 0, 15) + np.float32(16) * bits_f32(h, 2 * j, 1)
                q1 = bits_f32(v, 4, 15) + np.float32(16) * bits_f32(h, 2 * j + 1, 1)
                s += c[2 * j] * q0 * x[xo + 64 * j + l] + c[2 * j + 1] * q1 * x[xo + 64 * j + 32 + l]
        mins = np.float32(0)
        for i in range(8):
            mins += m[i] * (xs[16 * b + 2 * i] + xs[16 * b + 2 * i + 1])
        acc += s - mins
    return acc


@njit(**J)
def dot_q6_k(row, x, xs, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 210 * b
        d = f16_at(row, o + 208)
        for i in range(16):                                     # 1. int8 scale per 16
            c[i] = d * i8_f32(row[o + 192 + i])
        s = np.float32(0)
        xo = 256 * b
        for l in range(16):                                     # 2. q = 4 bits of ql + 16 * 2 bits of qh
            for n in range(2):
                for qq in range(4):
                    for h in range(2):
                        lo = bits_f32(row[o + 64 * n + 32 * (qq & 1) + 16 * h + l], 4 * (qq >> 1), 15)
                        hi = bits_f32(row[o + 128 + 32 * n + 16 * h + l], 2 * qq, 3)
                        s += c[8 * n + 2 * qq + h] * (lo + np.float32(16) * hi) * x[xo + 128 * n + 32 * qq + 16 * h + l]
        off = np.float32(0)                                     # 3. q - 32
        for i in range(16):
            off += c[i] * xs[16 * b + i]
        acc += s - np.float32(32) * off
    return acc


@njit(**J)
def dot_q8_k(row, x, xs, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 292 * b
        d = f32_at(row, o)
        s = np.float32(0)
        for l in range(32):
            for j in range(8):
                s += i8_f32(row[o + 4 + 32 * j + l]) * x[256 * b + 32 * j + l]
        acc += d * s
    return acc


@njit(**J)
def dot_tq2_0(row, x, xs, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 66 * b
        d = f16_at(row, o + 64)
        s = np.float32(0)
        xo = 256 * b
        for l in range(32):                                     # 2-bit planes: q in 0..2, w = (q - 1) d
            for j in range(2):
                v = row[o + 32 * j + l]
                for p in range(4):
                    s += bits_f32(v, 2 * p, 3) * x[xo + 128 * j + 32 * p + l]
        tot = np.float32(0)
        for i in range(16):
            tot += xs[16 * b + i]
        acc += d * (s - tot)
    return acc


@njit(**J)
def dot_iq4_xs(row, x, xs, c, m):
    acc = 0.0
    for b in range(x.size // 256):
        o = 136 * b
        d = f16_at(row, o)
        sh = u16_at(row, o + 2)
        for ib in range(8):                                     # 1. 6-bit scales, minus 32
            ls = ((row[o + 4 + ib // 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4)
            c[ib] = d * np.float32(ls - 32)
        s = np.float32(0)
        xo = 256 * b
        for l in range(16):
            for ib in range(8):
                v = row[o + 8 + 16 * ib + l]
                s += c[ib] * (KV_IQ4NL[v & 15] * x[xo + 32 * ib + l] + KV_IQ4NL[v >> 4] * x[xo + 32 * ib + 16 + l])
        acc += s
    return acc


# ---------------------------------------------------------------- dispatch

DOT = {F32: dot_f32, F16: dot_f16, BF16: dot_bf16, Q2_K: dot_q2_k, Q3_K: dot_q3_k, Q4_K: dot_q4_k,
       Q5_K: dot_q5_k, Q6_K: dot_q6_k, Q8_K: dot_q8_k, TQ2_0: dot_tq2_0, IQ4_XS: dot_iq4_xs}
GRP32 = {Q8_0: grp_q8_0, Q8_1: grp_q8_1, Q4_0: grp_q4_0, Q4_1: grp_q4_1, Q5_0: grp_q5_0, Q5_1: grp_q5_1,
         IQ4_NL: grp_iq4_nl, MXFP4: grp_mxfp4}
FUSED = tuple(DOT) + tuple(GRP32)


def row_dot(kind, row, x, xs, c, m):
    """Numba only: fused row . x for ggml type `kind` (a constant in FUSED)."""
    raise NotImplementedError("row_dot is callable from Numba-compiled code only")


@overload(row_dot, inline="always", prefer_literal=True)
def _row_dot(kind, row, x, xs, c, m):
    k = literal_kind(kind)
    if k in GRP32:
        grp = GRP32[k]
        return lambda kind, row, x, xs, c, m: dot_blocks32(grp, row, x, xs, c, m)
    if k in DOT:
        fn = DOT[k]
        return lambda kind, row, x, xs, c, m: fn(row, x, xs, c, m)
    return lambda kind, row, x, xs, c, m: 0.0          # not fused: the drivers never call it
