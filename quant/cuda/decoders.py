"""Device decoders: one packed block part -> float32 weights, for every ggml type the kernels read.

Every kernel (naive GEMV, warp GEMV, tiled GEMM, grouped expert GEMV/GEMM) walks a weight row as
blocks (`BS` weights in `TS` bytes, the GGUF layout unchanged) split into `P` parts of `NV` weights.
One decoder call turns one part into `NV` floats:

    c0 = dec(w32, w16, tb, base, p, v, r)
        w32 / w16 : the tensor's bytes seen as uint32 / float16 (same device memory)
        tb        : the type's lookup table (IQ grids, fp4 values) as uint32, in shared or global memory
        base      : byte offset of the block; p: part index in [0, P)
        v[r, :NV] : out, float32; v[r, j*RL + k] is the weight of column  c0 + j*RS + k
                    (R runs of RL = NV/R consecutive columns, RS apart, c0 relative to the block)

Parts are numbered so that parts [h*P/2, (h+1)*P/2) of a 256-weight block cover columns
[128h, 128h + 128): the GEMM stages K tiles of 128 columns.

The arithmetic is float32 on dequantized values, as `quant.ref.dequantize` then a float32 product:
small integers become floats through the exponent trick of `device.u2f` (exact, and faster than an
int->float conversion). Layouts: `ggml/src/ggml-common.h` (block structs) and `dequantize_row_*` in
`ggml/src/ggml-quants.c` of the llama.cpp vendored in llama-cpp-python 0.3.36.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, uint32

from ..formats import GGMLType
from .device import MAGIC, MAGIC_BITS, as_f32, byte, f16_to_f32, hf, ld16, ld32, ld32a, ld8, u2f


@dataclass(frozen=True)
class Spec:
    """How the kernels walk one ggml type."""
    type: GGMLType
    BS: int            # weights per block (32 for the float types: a pseudo-block)
    TS: int            # bytes per block
    P: int             # parts per block
    NV: int            # weights per part
    R: int             # runs per part
    RS: int            # column distance between runs
    dec: object        # the device decoder
    table: str = ""    # name of the lookup table in `tables()`, "" for none

    @property
    def RL(self) -> int:
        return self.NV // self.R


_f = u2f          # a small unsigned integer -> float32, exactly


# ------------------------------------------------------------------ float types (pseudo-blocks of 32)
#   F32  : 32 x f32   = 128 bytes, part p = words 8p..8p+7
#   F16  : 32 x f16   =  64 bytes, part p = halves 8p..8p+7
#   BF16 : 32 x bf16  =  64 bytes, part p = halves 8p..8p+7 (bf16 = the top 16 bits of an f32)

@cuda.jit(device=True, inline=True)
def dec_f32(w32, w16, tb, base, p, v, r):
    for k in range(8):
        v[r, k] = as_f32(ld32a(w32, base, 32 * p + 4 * k))
    return 8 * p


@cuda.jit(device=True, inline=True)
def dec_f16(w32, w16, tb, base, p, v, r):
    for k in range(8):
        v[r, k] = hf(w16, base, 16 * p + 2 * k)
    return 8 * p


@cuda.jit(device=True, inline=True)
def dec_bf16(w32, w16, tb, base, p, v, r):
    for k in range(4):
        u = ld32a(w32, base, 16 * p + 4 * k)
        v[r, 2 * k] = as_f32(u << uint32(16))
        v[r, 2 * k + 1] = as_f32(u & uint32(0xFFFF0000))
    return 8 * p


# ------------------------------------------------------------------ 32-weight blocks
#   Q4_0   (18 B): d f16 | qs[16]            w[j] = d*(lo(qs[j]) - 8), w[j+16] = d*(hi(qs[j]) - 8)
#   Q4_1   (20 B): d f16 | m f16 | qs[16]    w = d*q + m
#   Q5_0   (22 B): d | qh u32 | qs[16]       q = nibble | bit j (or j+16) of qh << 4; w = d*(q - 16)
#   Q5_1   (24 B): d | m | qh u32 | qs[16]   w = d*q + m
#   Q8_0   (34 B): d | qs[32] int8           w = d*q
#   IQ4_NL (18 B): d | qs[16]                w = d*kvalues_iq4nl[nibble]
#   MXFP4  (17 B): e8m0 | qs[16]             w = 2^(e-128) * kvalues_mxfp4[nibble]
# A part is 4 qs bytes: runs at columns 4p (low nibbles) and 16 + 4p (high nibbles).

@cuda.jit(device=True, inline=True)
def _nibbles(v, r, q, a_lo, b_lo):
    """v[r, 0:4] = a*lo(q bytes) + b, v[r, 4:8] = a*hi(q bytes) + b."""
    for k in range(4):
        v[r, k] = cuda.fma(a_lo, _f((q >> uint32(8 * k)) & uint32(15)), b_lo)
        v[r, 4 + k] = cuda.fma(a_lo, _f((q >> uint32(8 * k + 4)) & uint32(15)), b_lo)


@cuda.jit(device=True, inline=True)
def dec_q4_0(w32, w16, tb, base, p, v, r):
    d = hf(w16, base, 0)
    q = ld32(w32, base, 2 + 4 * p)
    m = d * float32(-8.0)                                   # exact: d*(q - 8) == fma(d, q, -8d)
    for k in range(4):
        v[r, k] = cuda.fma(d, _f((q >> uint32(8 * k)) & uint32(15)), m)
        v[r, 4 + k] = cuda.fma(d, _f((q >> uint32(8 * k + 4)) & uint32(15)), m)
    return 4 * p


@cuda.jit(device=True, inline=True)
def dec_q4_1(w32, w16, tb, base, p, v, r):
    d = hf(w16, base, 0)
    m = hf(w16, base, 2)
    q = ld32a(w32, base, 4 + 4 * p)
    _nibbles(v, r, q, d, m)
    return 4 * p


@cuda.jit(device=True, inline=True)
def dec_q5_0(w32, w16, tb, base, p, v, r):
    d = hf(w16, base, 0)
    qh = ld32(w32, base, 2)
    q = ld32(w32, base, 6 + 4 * p)
    m16 = d * float32(-16.0)
    for k in range(4):
        j = 4 * p + k
        lo = ((q >> uint32(8 * k)) & uint32(15)) | (((qh >> uint32(j)) & uint32(1)) << uint32(4))
        hi = ((q >> uint32(8 * k + 4)) & uint32(15)) | (((qh >> uint32(j + 16)) & uint32(1)) << uint32(4))
        v[r, k] = cuda.fma(d, _f(lo), m16)
        v[r, 4 + k] = cuda.fma(d, _f(hi), m16)
    return 4 * p


@cuda.jit(device=True, inline=True)
def dec_q5_1(w32, w16, tb, base, p, v, r):
    d = hf(w16, base, 0)
    m = hf(w16, base, 2)
    qh = ld32a(w32, base, 4)
    q = ld32a(w32, base, 8 + 4 * p)
    for k in range(4):
        j = 4 * p + k
        lo = ((q >> uint32(8 * k)) & uint32(15)) | (((qh >> uint32(j)) & uint32(1)) << uint32(4))
        hi = ((q >> uint32(8 * k + 4)) & uint32(15)) | (((qh >> uint32(j + 16)) & uint32(1)) << uint32(4))
        v[r, k] = cuda.fma(d, _f(lo), m)
        v[r, 4 + k] = cuda.fma(d, _f(hi), m)
    return 4 * p


@cuda.jit(device=True, inline=True)
def dec_q8_0(w32, w16, tb, base, p, v, r):
    d = hf(w16, base, 0)
    q0 = ld32(w32, base, 2 + 8 * p)
    q1 = ld32(w32, base, 6 + 8 * p)
    for k in range(4):
        # int8 -> float: (q ^ 0x80) = q + 128 in 0..255, then the exponent trick
        v[r, k] = d * (as_f32(((q0 >> uint32(8 * k)) & uint32(255) ^ uint32(128)) | uint32(MAGIC_BITS))
                       - float32(MAGIC + 128.0))
        v[r, 4 + k] = d * (as_f32(((q1 >> uint32(8 * k)) & uint32(255) ^ uint32(128)) | uint32(MAGIC_BITS))
                           - float32(MAGIC + 128.0))
    return 8 * p


@cuda.jit(device=True, inline=True)
def dec_iq4_nl(w32, w16, tb, base, p, v, r):
    d = hf(w16, base, 0)
    q = ld32(w32, base, 2 + 4 * p)
    for k in range(4):
        v[r, k] = d * as_f32(tb[(q >> uint32(8 * k)) & uint32(15)])
        v[r, 4 + k] = d * as_f32(tb[(q >> uint32(8 * k + 4)) & uint32(15)])
    return 4 * p


@cuda.jit(device=True, inline=True)
def e8m0_half(e):
    """`ggml_e8m0_to_fp32_half`: 2^(e - 128) as float32 (denormal for e < 2)."""
    if e < uint32(2):
        return as_f32(uint32(0x00200000) << e)
    return as_f32((e - uint32(1)) << uint32(23))


@cuda.jit(device=True, inline=True)
def dec_mxfp4(w32, w16, tb, base, p, v, r):
    d = e8m0_half(ld8(w32, base, 0))
    q = ld32(w32, base, 1 + 4 * p)
    for k in range(4):
        v[r, k] = as_f32(tb[(q >> uint32(8 * k)) & uint32(15)]) * d
        v[r, 4 + k] = as_f32(tb[(q >> uint32(8 * k + 4)) & uint32(15)]) * d
    return 4 * p


# ------------------------------------------------------------------ NVFP4 (64-weight blocks)
#   NVFP4 (36 B): d[4] UE4M3 | qs[32]; sub-block s (16 weights) uses d[s] and qs[8s .. 8s+8):
#   w[16s + j] = ue4m3(d[s]) * kv[lo(qs[8s+j])], w[16s + 8 + j] = ... kv[hi(...)]
#   part p: s = p/2, 4 qs bytes; runs at 16s + 4(p%2) and 16s + 8 + 4(p%2).

@cuda.jit(device=True, inline=True)
def ue4m3_half(x):
    """`ggml_ue4m3_to_fp32`: unsigned E4M3 (bias 7) times 0.5; 0 and 0x7F read as 0."""
    x = x & uint32(0xFF)
    if x == uint32(0) or x == uint32(0x7F):
        return float32(0.0)
    ex = (x >> uint32(3)) & uint32(15)
    man = x & uint32(7)
    if ex == uint32(0):
        return _f(man) * float32(0.0009765625)              # man * 2^-9 * 0.5
    return as_f32(((ex + uint32(119)) << uint32(23)) | (man << uint32(20)))   # (1 + man/8) 2^(ex-7) / 2


@cuda.jit(device=True, inline=True)
def dec_nvfp4(w32, w16, tb, base, p, v, r):
    s = p >> 1
    d = ue4m3_half(ld8(w32, base, s))
    q = ld32a(w32, base, 4 + 4 * p)
    for k in range(4):
        v[r, k] = as_f32(tb[(q >> uint32(8 * k)) & uint32(15)]) * d
        v[r, 4 + k] = as_f32(tb[(q >> uint32(8 * k + 4)) & uint32(15)]) * d
    return 16 * s + 4 * (p & 1)


# ------------------------------------------------------------------ K-quants (256-weight blocks)

@cuda.jit(device=True, inline=True)
def b12(s0, s1, s2, k):
    """Byte k (0..11) of the 12 bytes s0|s1|s2."""
    w = s0
    if k >= 8:
        w = s2
    elif k >= 4:
        w = s1
    return (w >> uint32(8 * (k & 3))) & uint32(255)


@cuda.jit(device=True, inline=True)
def scale_min_k4(s0, s1, s2, j):
    """`get_scale_min_k4`: the 6-bit scale and min of sub-block j (0..7) of Q4_K / Q5_K."""
    if j < 4:
        sc = b12(s0, s1, s2, j) & uint32(63)
        m = b12(s0, s1, s2, j + 4) & uint32(63)
    else:
        sc = (b12(s0, s1, s2, j + 4) & uint32(15)) | ((b12(s0, s1, s2, j - 4) >> uint32(6)) << uint32(4))
        m = (b12(s0, s1, s2, j + 4) >> uint32(4)) | ((b12(s0, s1, s2, j) >> uint32(6)) << uint32(4))
    return sc, m


#   Q4_K (144 B): d f16 | dmin f16 | scales[12] (6-bit scale+min x 8) | qs[128]
#   group g (64 weights) = qs[32g .. 32g+32): low nibbles -> sub-block 2g, high -> 2g+1
#   w = d*sc*q - dmin*m.  part p: g = p/4, 8 qs bytes at 32g + 8(p%4); runs at 64g + 8(p%4) and +32.
@cuda.jit(device=True, inline=True)
def dec_q4_k(w32, w16, tb, base, p, v, r):
    g = p >> 2
    d = hf(w16, base, 0)
    dmin = hf(w16, base, 2)
    s0 = ld32a(w32, base, 4)
    s1 = ld32a(w32, base, 8)
    s2 = ld32a(w32, base, 12)
    sc0, m0 = scale_min_k4(s0, s1, s2, 2 * g)
    sc1, m1 = scale_min_k4(s0, s1, s2, 2 * g + 1)
    a0 = d * _f(sc0)
    b0 = dmin * _f(m0)
    a1 = d * _f(sc1)
    b1 = dmin * _f(m1)
    qa = ld32a(w32, base, 16 + 32 * g + 8 * (p & 3))
    qb = ld32a(w32, base, 20 + 32 * g + 8 * (p & 3))
    for k in range(4):
        v[r, k] = cuda.fma(a0, _f((qa >> uint32(8 * k)) & uint32(15)), -b0)
        v[r, 4 + k] = cuda.fma(a0, _f((qb >> uint32(8 * k)) & uint32(15)), -b0)
        v[r, 8 + k] = cuda.fma(a1, _f((qa >> uint32(8 * k + 4)) & uint32(15)), -b1)
        v[r, 12 + k] = cuda.fma(a1, _f((qb >> uint32(8 * k + 4)) & uint32(15)), -b1)
    return 64 * g + 8 * (p & 3)


#   Q5_K (176 B): d | dmin | scales[12] | qh[32] | qs[128]; like Q4_K plus a fifth bit:
#   weight 64g + l gets bit 2g of qh[l], weight 64g + 32 + l bit 2g+1.
@cuda.jit(device=True, inline=True)
def dec_q5_k(w32, w16, tb, base, p, v, r):
    g = p >> 2
    d = hf(w16, base, 0)
    dmin = hf(w16, base, 2)
    s0 = ld32a(w32, base, 4)
    s1 = ld32a(w32, base, 8)
    s2 = ld32a(w32, base, 12)
    sc0, m0 = scale_min_k4(s0, s1, s2, 2 * g)
    sc1, m1 = scale_min_k4(s0, s1, s2, 2 * g + 1)
    a0 = d * _f(sc0)
    b0 = dmin * _f(m0)
    a1 = d * _f(sc1)
    b1 = dmin * _f(m1)
    l0 = 8 * (p & 3)
    qa = ld32a(w32, base, 48 + 32 * g + l0)
    qb = ld32a(w32, base, 52 + 32 * g + l0)
    ha = ld32a(w32, base, 16 + l0)
    hb = ld32a(w32, base, 20 + l0)
    sl = uint32(2 * g)
    for k in range(4):
        sh = uint32(8 * k)
        v[r, k] = cuda.fma(a0, _f(((qa >> sh) & uint32(15)) | (((ha >> (sh + sl)) & uint32(1)) << uint32(4))), -b0)
        v[r, 4 + k] = cuda.fma(a0, _f(((qb >> sh) & uint32(15)) | (((hb >> (sh + sl)) & uint32(1)) << uint32(4))), -b0)
        v[r, 8 + k] = cuda.fma(a1, _f(((qa >> (sh + uint32(4))) & uint32(15))
                                      | (((ha >> (sh + sl + uint32(1))) & uint32(1)) << uint32(4))), -b1)
        v[r, 12 + k] = cuda.fma(a1, _f(((qb >> (sh + uint32(4))) & uint32(15))
                                       | (((hb >> (sh + sl + uint32(1))) & uint32(1)) << uint32(4))), -b1)
    return 64 * g + l0


#   Q6_K (210 B): ql[128] | qh[64] | scales[16] int8 | d f16
#   half h (128 weights): ql[64h + l] lo/hi and ql[64h + 32 + l] lo/hi with 2 bits each of qh[32h + l]
#   give weights 128h + l (+0, +64) and (+32, +96); sub-block of 16 -> scales[(col)/16]; w = d*sc*(q - 32)
#   part p: h = p/8, l0 = 4(p%8); runs at 128h + l0 + 32j, j = 0..3.
@cuda.jit(device=True, inline=True)
def dec_q6_k(w32, w16, tb, base, p, v, r):
    h = p >> 3
    l0 = 4 * (p & 7)
    d = hf(w16, base, 208)
    qa = ld32(w32, base, 64 * h + l0)               # ql, runs 0 (lo) and 2 (hi)
    qb = ld32(w32, base, 64 * h + 32 + l0)          # ql, runs 1 (lo) and 3 (hi)
    qh = ld32(w32, base, 128 + 32 * h + l0)
    sa = ld32(w32, base, 192 + 8 * h)               # scales of this half, bytes 0..3
    sb = ld32(w32, base, 196 + 8 * h)               # bytes 4..7
    si = uint32(8 * (l0 >> 4))                       # +1 scale for l >= 16
    for j in range(4):
        sw = sa if j < 2 else sb
        scb = (sw >> (uint32(16 * (j & 1)) + si)) & uint32(255)
        a = d * (_f(scb ^ uint32(128)) - float32(128.0))          # int8 scale
        m = a * float32(-32.0)                                     # exact: a*(q - 32) == fma(a, q, -32a)
        qw = qa if (j & 1) == 0 else qb
        nsh = uint32(4 * (j >> 1))
        for k in range(4):
            lo = (qw >> (uint32(8 * k) + nsh)) & uint32(15)
            hi = (qh >> uint32(8 * k + 2 * j)) & uint32(3)
            v[r, 4 * j + k] = cuda.fma(a, _f(lo | (hi << uint32(4))), m)
    return 128 * h + l0


#   Q2_K (84 B): scales[16] (4-bit scale | 4-bit min << 4) | qs[64] | d f16 | dmin f16
#   half h: byte qs[32h + l] holds weights 128h + 32j + l at bits 2j; sub-block (col)/16.
#   w = d*(sc & 15)*q - dmin*(sc >> 4).  part p: h = p/8, l0 = 4(p%8); runs at 128h + l0 + 32j.
@cuda.jit(device=True, inline=True)
def dec_q2_k(w32, w16, tb, base, p, v, r):
    h = p >> 3
    l0 = 4 * (p & 7)
    d = hf(w16, base, 80)
    dmin = hf(w16, base, 82)
    q = ld32a(w32, base, 16 + 32 * h + l0)
    sa = ld32a(w32, base, 8 * h)
    sb = ld32a(w32, base, 8 * h + 4)
    si = uint32(8 * (l0 >> 4))
    for j in range(4):
        sw = sa if j < 2 else sb
        sc = (sw >> (uint32(16 * (j & 1)) + si)) & uint32(255)
        a = d * _f(sc & uint32(15))
        b = dmin * _f(sc >> uint32(4))
        for k in range(4):
            v[r, 4 * j + k] = cuda.fma(a, _f((q >> uint32(8 * k + 2 * j)) & uint32(3)), -b)
    return 128 * h + l0


#   Q3_K (110 B): hmask[32] | qs[64] | scales[12] (16 x 6-bit, offset 32) | d f16
#   weight 128h + 32j + l: 2 bits of qs[32h + l] at 2j, minus 4 unless bit 4h + j of hmask[l] is set.
#   scale i: low 4 bits from byte i (i < 8) or the high nibble of byte i - 8; high 2 bits from
#   byte 8 + i%4 at bit 2(i/4).  w = d*(scale - 32)*q.  parts as Q2_K.
@cuda.jit(device=True, inline=True)
def dec_q3_k(w32, w16, tb, base, p, v, r):
    h = p >> 3
    l0 = 4 * (p & 7)
    d = hf(w16, base, 108)
    q = ld32(w32, base, 32 + 32 * h + l0)
    hm = ld32(w32, base, l0)
    s0 = ld32(w32, base, 96)
    s1 = ld32(w32, base, 100)
    s2 = ld32(w32, base, 104)
    for j in range(4):
        i = 8 * h + 2 * j + (l0 >> 4)
        if i < 8:
            lo = b12(s0, s1, s2, i) & uint32(15)
        else:
            lo = b12(s0, s1, s2, i - 8) >> uint32(4)
        hi = (b12(s0, s1, s2, 8 + (i & 3)) >> uint32(2 * (i >> 2))) & uint32(3)
        a = d * (_f(lo | (hi << uint32(4))) - float32(32.0))
        hb = uint32(4 * h + j)
        for k in range(4):
            q2 = (q >> uint32(8 * k + 2 * j)) & uint32(3)
            sub = float32(0.0) if (hm >> (uint32(8 * k) + hb)) & uint32(1) else float32(4.0)
            v[r, 4 * j + k] = a * (_f(q2) - sub)
    return 128 * h + l0


# ------------------------------------------------------------------ i-quants (256-weight blocks)
# Each part is two groups of 8 consecutive weights of one 32-weight sub-block ib = p/2: columns
# 16p .. 16p+15 (one run). Grids are tables of 8 (or 4) byte values per index; signs come as 7 bits
# whose 8th bit makes the parity even (`ksigns_iq2xs`).

@cuda.jit(device=True, inline=True)
def ksigns(s7):
    """`ksigns_iq2xs[s7]`: 7 sign bits plus an 8th that makes the count of set bits even."""
    s7 = uint32(s7) & uint32(127)
    return s7 | ((uint32(cuda.popc(s7)) & uint32(1)) << uint32(7))


@cuda.jit(device=True, inline=True)
def _grid8(v, r, o, tb, gi, signs, db):
    """v[r, o:o+8] = db * grid8[gi] with signs (bit j set -> negative)."""
    g0 = uint32(tb[gi << uint32(1)])
    g1 = uint32(tb[(gi << uint32(1)) | uint32(1)])
    for j in range(4):
        a = db * _f((g0 >> uint32(8 * j)) & uint32(255))
        b = db * _f((g1 >> uint32(8 * j)) & uint32(255))
        v[r, o + j] = -a if (signs >> uint32(j)) & uint32(1) else a
        v[r, o + 4 + j] = -b if (signs >> uint32(j + 4)) & uint32(1) else b


#   IQ2_XXS (66 B): d f16 | qs u16[32]; sub-block ib = 8 bytes: 4 grid indices, then a u32 with
#   4 x 7 sign bits and a 4-bit scale at the top: db = d*(0.5 + scale)*0.25.
@cuda.jit(device=True, inline=True)
def dec_iq2_xxs(w32, w16, tb, base, p, v, r):
    ib = p >> 1
    d = hf(w16, base, 0)
    aux0 = ld32(w32, base, 2 + 8 * ib)
    aux1 = ld32(w32, base, 6 + 8 * ib)
    db = d * (float32(0.5) + _f(aux1 >> uint32(28))) * float32(0.25)
    for li in range(2):
        l = 2 * (p & 1) + li
        _grid8(v, r, 8 * li, tb, byte(aux0, l), ksigns(aux1 >> uint32(7 * l)), db)
    return 16 * p


#   IQ2_XS (74 B): d | qs u16[32] (9-bit grid index | 7 sign bits << 9) | scales[8] (two 4-bit)
@cuda.jit(device=True, inline=True)
def dec_iq2_xs(w32, w16, tb, base, p, v, r):
    ib = p >> 1
    d = hf(w16, base, 0)
    sc = (ld8(w32, base, 66 + ib) >> uint32(4 * (p & 1))) & uint32(15)
    db = d * (float32(0.5) + _f(sc)) * float32(0.25)
    for li in range(2):
        q = ld16(w32, base, 2 + 2 * (4 * ib + 2 * (p & 1) + li))
        _grid8(v, r, 8 * li, tb, q & uint32(511), ksigns(q >> uint32(9)), db)
    return 16 * p


#   IQ2_S (82 B): d | qs[32] grid low bytes | signs[32] | qh[8] (2 high index bits per group) | scales[8]
@cuda.jit(device=True, inline=True)
def dec_iq2_s(w32, w16, tb, base, p, v, r):
    ib = p >> 1
    d = hf(w16, base, 0)
    sc = (ld8(w32, base, 74 + ib) >> uint32(4 * (p & 1))) & uint32(15)
    db = d * (float32(0.5) + _f(sc)) * float32(0.25)
    qh = ld8(w32, base, 66 + ib)
    for li in range(2):
        l = 2 * (p & 1) + li
        gi = ld8(w32, base, 2 + 4 * ib + l) | ((qh << uint32(8 - 2 * l)) & uint32(0x300))
        _grid8(v, r, 8 * li, tb, gi, ld8(w32, base, 34 + 4 * ib + l), db)
    return 16 * p


#   IQ3_XXS (98 B): d | qs[64] (8 grid indices of 4 values per sub-block) | u32[8] (4 x 7 sign bits,
#   4-bit scale at the top): db = d*(0.5 + scale)*0.5
@cuda.jit(device=True, inline=True)
def dec_iq3_xxs(w32, w16, tb, base, p, v, r):
    ib = p >> 1
    d = hf(w16, base, 0)
    aux = ld32(w32, base, 66 + 4 * ib)
    db = d * (float32(0.5) + _f(aux >> uint32(28))) * float32(0.5)
    for li in range(2):
        l = 2 * (p & 1) + li
        signs = ksigns(aux >> uint32(7 * l))
        g = ld16(w32, base, 2 + 8 * ib + 2 * l)       # two grid indices
        g0 = uint32(tb[g & uint32(255)])
        g1 = uint32(tb[g >> uint32(8)])
        for j in range(4):
            a = db * _f((g0 >> uint32(8 * j)) & uint32(255))
            b = db * _f((g1 >> uint32(8 * j)) & uint32(255))
            v[r, 8 * li + j] = -a if (signs >> uint32(j)) & uint32(1) else a
            v[r, 8 * li + 4 + j] = -b if (signs >> uint32(j + 4)) & uint32(1) else b
    return 16 * p


#   IQ3_S (110 B): d | qs[64] (grid low bytes) | qh[8] (9th index bit) | signs[32] | scales[4] (4-bit)
#   db = d*(1 + 2*scale)
@cuda.jit(device=True, inline=True)
def dec_iq3_s(w32, w16, tb, base, p, v, r):
    ib = p >> 1
    d = hf(w16, base, 0)
    sc = (ld8(w32, base, 106 + (ib >> 1)) >> uint32(4 * (ib & 1))) & uint32(15)
    db = d * (float32(1.0) + float32(2.0) * _f(sc))
    qh = ld8(w32, base, 66 + ib)
    for li in range(2):
        l = 2 * (p & 1) + li
        signs = ld8(w32, base, 74 + 4 * ib + l)
        g = ld16(w32, base, 2 + 8 * ib + 2 * l)
        i0 = (g & uint32(255)) | ((qh << uint32(8 - 2 * l)) & uint32(256))
        i1 = (g >> uint32(8)) | ((qh << uint32(7 - 2 * l)) & uint32(256))
        g0 = uint32(tb[i0])
        g1 = uint32(tb[i1])
        for j in range(4):
            a = db * _f((g0 >> uint32(8 * j)) & uint32(255))
            b = db * _f((g1 >> uint32(8 * j)) & uint32(255))
            v[r, 8 * li + j] = -a if (signs >> uint32(j)) & uint32(1) else a
            v[r, 8 * li + 4 + j] = -b if (signs >> uint32(j + 4)) & uint32(1) else b
    return 16 * p


@cuda.jit(device=True, inline=True)
def _grid1(v, r, o, tb, gi, dl, delta):
    """v[r, o:o+8] = dl * (iq1s_grid[gi] + delta); the table holds grid value + 1 (0, 1, 2) per byte."""
    g0 = uint32(tb[gi << uint32(1)])
    g1 = uint32(tb[(gi << uint32(1)) | uint32(1)])
    for j in range(4):
        v[r, o + j] = dl * (_f((g0 >> uint32(8 * j)) & uint32(255)) - float32(1.0) + delta)
        v[r, o + 4 + j] = dl * (_f((g1 >> uint32(8 * j)) & uint32(255)) - float32(1.0) + delta)


#   IQ1_S (50 B): d | qs[32] (grid low bytes) | qh u16[8]: 3 high index bits per group, a 3-bit scale
#   at bit 12 and the delta sign at bit 15.  w = d*(2*scale + 1)*(grid + delta), delta = +-1/8
@cuda.jit(device=True, inline=True)
def dec_iq1_s(w32, w16, tb, base, p, v, r):
    ib = p >> 1
    d = hf(w16, base, 0)
    qh = ld16(w32, base, 34 + 2 * ib)
    dl = d * (float32(2.0) * _f((qh >> uint32(12)) & uint32(7)) + float32(1.0))
    delta = float32(-0.125) if qh & uint32(0x8000) else float32(0.125)
    for li in range(2):
        l = 2 * (p & 1) + li
        gi = ld8(w32, base, 2 + 4 * ib + l) | (((qh >> uint32(3 * l)) & uint32(7)) << uint32(8))
        _grid1(v, r, 8 * li, tb, gi, dl, delta)
    return 16 * p


#   IQ1_M (56 B): qs[32] | qh[16] (per group: 3 high index bits and a delta-sign bit) | scales u16[4]
#   (3-bit group scales; the block's f16 scale is the top nibbles of the four u16)
@cuda.jit(device=True, inline=True)
def dec_iq1_m(w32, w16, tb, base, p, v, r):
    ib = p >> 1
    hl = p & 1
    sc0 = ld32a(w32, base, 48)
    sc1 = ld32a(w32, base, 52)
    bits = ((sc0 >> uint32(12)) & uint32(0xF)) | ((sc0 >> uint32(24)) & uint32(0xF0)) \
        | ((sc1 >> uint32(4)) & uint32(0xF00)) | ((sc1 >> uint32(16)) & uint32(0xF000))
    d = f16_to_f32(bits)
    scw = ld16(w32, base, 48 + 2 * (ib >> 1))
    s3 = (scw >> uint32(6 * (ib & 1) + 3 * hl)) & uint32(7)
    dl = d * (float32(2.0) * _f(s3) + float32(1.0))
    qh = ld8(w32, base, 32 + 2 * ib + hl)
    for li in range(2):
        l = 2 * hl + li
        sh = uint32(8 - 4 * li)
        gi = ld8(w32, base, 4 * ib + l) | ((qh << sh) & uint32(0x700))
        delta = float32(-0.125) if qh & uint32(0x08 << (4 * li)) else float32(0.125)
        _grid1(v, r, 8 * li, tb, gi, dl, delta)
    return 16 * p


#   IQ4_XS (136 B): d | scales_h u16 | scales_l[4] | qs[128]; sub-block ib: 6-bit scale
#   (low 4 from scales_l, high 2 from scales_h), w = d*(ls - 32)*kvalues_iq4nl[nibble];
#   qs[16ib + j]: low -> 32ib + j, high -> 32ib + 16 + j.  part p: 8 bytes, runs 32ib + 8(p%2), +16.
@cuda.jit(device=True, inline=True)
def dec_iq4_xs(w32, w16, tb, base, p, v, r):
    ib = p >> 1
    d = hf(w16, base, 0)
    sh = ld16(w32, base, 2)
    sl = ld8(w32, base, 4 + (ib >> 1))
    ls = ((sl >> uint32(4 * (ib & 1))) & uint32(15)) | (((sh >> uint32(2 * ib)) & uint32(3)) << uint32(4))
    dl = d * (_f(ls) - float32(32.0))
    qa = ld32a(w32, base, 8 + 16 * ib + 8 * (p & 1))
    qb = ld32a(w32, base, 12 + 16 * ib + 8 * (p & 1))
    for k in range(4):
        v[r, k] = dl * as_f32(tb[(qa >> uint32(8 * k)) & uint32(15)])
        v[r, 4 + k] = dl * as_f32(tb[(qb >> uint32(8 * k)) & uint32(15)])
        v[r, 8 + k] = dl * as_f32(tb[(qa >> uint32(8 * k + 4)) & uint32(15)])
        v[r, 12 + k] = dl * as_f32(tb[(qb >> uint32(8 * k + 4)) & uint32(15)])
    return 32 * ib + 8 * (p & 1)


T = GGMLType
SPECS: dict[GGMLType, Spec] = {s.type: s for s in [
    #     type       BS   TS   P  NV  R  RS  decoder
    Spec(T.F32,      32, 128,  4,  8, 1,  0, dec_f32),
    Spec(T.F16,      32,  64,  4,  8, 1,  0, dec_f16),
    Spec(T.BF16,     32,  64,  4,  8, 1,  0, dec_bf16),
    Spec(T.Q4_0,     32,  18,  4,  8, 2, 16, dec_q4_0),
    Spec(T.Q4_1,     32,  20,  4,  8, 2, 16, dec_q4_1),
    Spec(T.Q5_0,     32,  22,  4,  8, 2, 16, dec_q5_0),
    Spec(T.Q5_1,     32,  24,  4,  8, 2, 16, dec_q5_1),
    Spec(T.Q8_0,     32,  34,  4,  8, 1,  0, dec_q8_0),
    Spec(T.IQ4_NL,   32,  18,  4,  8, 2, 16, dec_iq4_nl, "iq4nl"),
    Spec(T.MXFP4,    32,  17,  4,  8, 2, 16, dec_mxfp4, "fp4"),
    Spec(T.NVFP4,    64,  36,  8,  8, 2,  8, dec_nvfp4, "fp4"),
    Spec(T.Q2_K,    256,  84, 16, 16, 4, 32, dec_q2_k),
    Spec(T.Q3_K,    256, 110, 16, 16, 4, 32, dec_q3_k),
    Spec(T.Q4_K,    256, 144, 16, 16, 2, 32, dec_q4_k),
    Spec(T.Q5_K,    256, 176, 16, 16, 2, 32, dec_q5_k),
    Spec(T.Q6_K,    256, 210, 16, 16, 4, 32, dec_q6_k),
    Spec(T.IQ2_XXS, 256,  66, 16, 16, 1,  0, dec_iq2_xxs, "iq2xxs"),
    Spec(T.IQ2_XS,  256,  74, 16, 16, 1,  0, dec_iq2_xs, "iq2xs"),
    Spec(T.IQ2_S,   256,  82, 16, 16, 1,  0, dec_iq2_s, "iq2s"),
    Spec(T.IQ3_XXS, 256,  98, 16, 16, 1,  0, dec_iq3_xxs, "iq3xxs"),
    Spec(T.IQ3_S,   256, 110, 16, 16, 1,  0, dec_iq3_s, "iq3s"),
    Spec(T.IQ1_S,   256,  50, 16, 16, 1,  0, dec_iq1_s, "iq1s"),
    Spec(T.IQ1_M,   256,  56, 16, 16, 1,  0, dec_iq1_m, "iq1s"),
    Spec(T.IQ4_XS,  256, 136, 16, 16, 2, 16, dec_iq4_xs, "iq4nl"),
]}


def spec(t) -> Spec:
    t = GGMLType(int(t))
    if t not in SPECS:
        raise KeyError(f"no CUDA decoder for ggml type {t.name}; have {', '.join(s.name for s in SPECS)}")
    return SPECS[t]


_TABLES: dict[str, np.ndarray] = {}


def tables() -> dict[str, np.ndarray]:
    """Lookup tables as uint32 arrays: fp4 / iq4nl values as float32 bits, grids packed 4 bytes a word.

    Values come from gguf-py's tables (`gguf.quants`), the same ones the NumPy oracle decodes with."""
    if _TABLES:
        return _TABLES
    from gguf import quants as gq

    def grid(cls, offset=0):
        cls.init_grid()
        g = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)     # [N, 8] or [N, 4]
        return np.ascontiguousarray((g + offset).astype(np.uint8)).view(np.uint32).reshape(-1)
    _TABLES.update({
        "": np.zeros(1, dtype=np.uint32),
        "fp4": np.asarray(gq.MXFP4.kvalues, dtype=np.float32).view(np.uint32),
        "iq4nl": np.asarray(gq.IQ4_NL.kvalues, dtype=np.float32).view(np.uint32),
        "iq2xxs": grid(gq.IQ2_XXS),
        "iq2xs": grid(gq.IQ2_XS),
        "iq2s": grid(gq.IQ2_S),
        "iq3xxs": grid(gq.IQ3_XXS),
        "iq3s": grid(gq.IQ3_S),
        "iq1s": grid(gq.IQ1_S, offset=1),
    })
    return _TABLES
