"""Fused GEMV row kernels: one packed weight row . one activation row, read straight from the bytes.

    dot_<type>(row, x) -> float64      row: uint8 [row_bytes], x: f32 [I]
    row_dot(kind, row, x', xs)         the dispatch; x' = x_lanes(kind, x), xs = x_sums(kind, x),
                                       both prepared once per activation row by the host
    row_dot2(kind, r0, r1, x', xs)     two rows in step (types in PAIRED), each bit-equal to row_dot

Written with the 16-lane vectors of simd.py (one AVX-512 register), one ggml block at a time, in
the order of the block's bytes. Every quantized format is affine per sub-block of 16 or 32 weights,
w = c q + m, with q a small integer or a code-book value; per 16 weights a kernel

  1. unpacks 16 q from the bytes. The K-quants and TQ2_0 work on 64 bytes at once: fields are
     combined while still packed (byte ops), then read in place from the 32-bit lanes -- `lut4`
     looks a 2/4-bit field up in the low bits of each lane (`vpermps`; Q2_K and TQ2_0 take two
     2-bit fields from one shifted nibble with two code books), `lanes4` moves byte k of each lane
     to its top (`vpshufb`) and converts (2^24 q, exact) -- with no widening shuffle. Lane l then holds
     weight 4 l + k (or the type's own order), so x is read in that order: x' = x_lanes(x), a
     permutation scaled by powers of two (exact), made once per activation row.
     The others: shift, mask, `to_f32` or `lut` (Q4_0's q - 8, IQ4_NL's and MXFP4's code books);
     TQ1_0's base-3 digits on 16-bit words, 32 per instruction (`vpmullw`, `vpmulhuw`, as ggml's
     ((q 3^n mod 256) 3) >> 8); the i-quants load grid rows from float tables (IQ1_S: int8, to stay
     in L1) and flip signs with mask registers (the 7-bit sign fields completed with their parity
     bit four at a time in a scalar word: `signs4`, pdep).
  2. multiplies by x with the codes centred: c (q - mid) . x, where mid is the block's own offset
     (Q3_K's 4, Q6_K's 32, Q5_0's 16, TQ2_0's 1) or the middle code (Q2_K 2, Q4_K 8, Q5_K 16), whose
     weight w(mid) = c mid + m then multiplies the group's sum of x (xs = x_sums(x), one FMA per
     block); IQ1_S/IQ1_M's +-1/8 deltas (as small as the grid values) multiply xs the same way.
     Only the middle code is folded: folding m itself makes c (q . x) and m sum(x) both much
     larger than y when x is far from zero mean, and float32 loses the difference. Q4_1/Q5_1 form
     w = fma(d, q, m) per weight (one rounding; ggml's decoder rounds d*q and the sum separately).
  3. accumulates into a vector; the 16 lanes are added to a float64 sum once per 256-1024
     weights, so a 14336-long row adds no more rounding than a float32 BLAS. The additions keep
     the order written here (simd.FP_FLAGS: no reassociation), so independent chains stay
     independent.
The scales of a K-quant block are decoded 16 at a time into one register (simd.scales_*) from the
12-16 scale bytes rearranged with 32-bit masks (ggml's layout tricks), then `spread` over the lanes
that hold each sub-block (the i-quants' scales likewise, from `u16_lanes`). Each kernel also
prefetches 2 KB ahead of the block it decodes (`ahead`). With one activation row, the types in
PAIRED read two weight rows in step (row_dot2): the memory-bound ones because two streams keep more
cache misses in flight, Q1_0, Q4_K and TQ2_0 because each 16 values of x' loaded (64 bytes, from L2
for a long row) then serve both rows (`lut4x2`).
The readable per-element decoders are in dequant.py; every kernel here is tested against the NumPy
oracle.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from .dequant import (
    BF16,
    F16,
    F32,
    IQ1_M,
    IQ1_S,
    IQ2_S,
    IQ2_XS,
    IQ2_XXS,
    IQ3_S,
    IQ3_XXS,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
    NVFP4,
    Q1_0,
    Q2_0,
    Q2_K,
    Q3_K,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    Q8_1,
    Q8_K,
    TQ1_0,
    TQ2_0,
    iq1_m_scale,
    literal_kind,
)
from .llvm import bf16_at, f16_at, f32_at, ld, pdep32, pext64, u16_at, u32_at
from .simd import (
    HAVE_AVX512,
    add,
    addc,
    as_i32,
    b32x2,
    b64,
    band,
    base3_tail,
    bf16x16,
    bitsel,
    bmask,
    bor,
    bsh,
    bsub,
    byte_top,
    f16x16,
    f32x16_at,
    flip,
    fma,
    hsum,
    i8x16f,
    i32x16_at,
    iadd,
    ior,
    lanes,
    load16,
    lut,
    lut32_affine,
    lut_affine,
    mul,
    nib8x2,
    nib_lut,
    or_where,
    prefetch,
    rotl,
    rows4,
    rows8,
    rows8_i8,
    scales_i8,
    scales_u8,
    select_bits,
    shl,
    shr,
    shr4,
    splat,
    spread,
    to_f32,
    u8x16,
    u8x32w,
    u16_lanes,
    u16x16,
    ue4m3x4,
    wmul,
    wmulhi,
    wshl,
    zeros,
)
from .tables import (
    E8M0_HALF,
    GRID_IQ1S,
    GRID_IQ1S_I8,
    GRID_IQ2S,
    GRID_IQ2XS,
    GRID_IQ2XXS,
    GRID_IQ3S,
    GRID_IQ3XXS,
    IQ1S_DELTA,
    KV_IQ4NL,
    KV_MXFP4,
)

J = {"cache": True, "inline": "always"}
LO4, LO6, HI2, SIGN8 = 0x0F0F0F0F, 0x3F3F3F3F, 0x03030303, 0x80808080     # per-byte masks of a 32-bit word
TOP8 = 0xFF000000                                           # the top byte of a 32-bit lane
SIGNS_XS = 0xFE00FE00FE00FE00 - (1 << 64)                   # IQ2_XS: the 7 sign bits of each of 4 words (int64)
FLOAT_CHUNK = 1024                                          # float rows: flush to float64 every 1024
PREFETCH = 2048          # bytes ahead of the block being decoded that the kernels ask the cache for

# 16-entry code books for `lut` (index = the 4-bit code). The centred integer ones are affine in the index
# bits, book[n] = ((n >> lo) & mask) - off, stated beside each as (lo, mask, off) for `lut_affine` (AFFINE:
# the pairs, checked by the tests)
Q4_OFFSET = (np.arange(16) - 8).astype(np.float32)                      # Q4_0: q - 8
Q4_OFFSET_A = (0, 15, 8)
TERNARY = np.array([-1, 0, 1, 2] * 4, dtype=np.float32)                # 2-bit codes (low 2 of 4 bits): q - 1
TERNARY_A = (0, 3, 1)
TERNARY_HI = np.repeat(np.array([-1, 0, 1, 2], dtype=np.float32), 4)   # 2-bit codes (high 2 of 4 bits): q - 1
TERNARY_HI_A = (2, 3, 1)
Q2_CENTRED = np.array([-2, -1, 0, 1] * 4, dtype=np.float32)            # q - 2
Q2_CENTRED_A = (0, 3, 2)
Q2_CENTRED_HI = np.repeat(np.array([-2, -1, 0, 1], dtype=np.float32), 4)  # q - 2, high 2 of 4 bits
Q2_CENTRED_HI_A = (2, 3, 2)
Q5_CODES = (np.arange(32) - 16).astype(np.float32)                      # 5-bit codes: q - 16
Q5_CODES_A = (0, 31, 16)
Q3_CODES = np.array([-4, -3, -2, -1, 0, 1, 2, 3] * 2, dtype=np.float32)   # 3-bit codes (low 3 of 4 bits): q - 4
Q3_CODES_A = (0, 7, 4)
AFFINE = [(Q4_OFFSET, Q4_OFFSET_A), (TERNARY, TERNARY_A), (TERNARY_HI, TERNARY_HI_A), (Q2_CENTRED, Q2_CENTRED_A),
          (Q2_CENTRED_HI, Q2_CENTRED_HI_A), (Q5_CODES, Q5_CODES_A), (Q3_CODES, Q3_CODES_A)]
KV_IQ4 = KV_IQ4NL.astype(np.float32)
KV_FP4 = KV_MXFP4.astype(np.float32)
IOTA = np.arange(16, dtype=np.float32)                                 # q itself


@njit(**J)
def ahead(row, o, n):
    """Prefetch the n bytes PREFETCH ahead of byte o: the hardware prefetcher alone left the
    DRAM-bound rows ~40% slower than rows already in cache."""
    for k in range(0, n, 64):
        prefetch(row, o + PREFETCH + k)


# ---------------------------------------------------------------- plain floats

@njit(**J)
def dot_f32(row, x):
    n16 = x.size - x.size % 16
    acc = 0.0
    for c0 in range(0, n16, FLOAT_CHUNK):
        v = zeros()
        for i in range(c0, min(n16, c0 + FLOAT_CHUNK), 16):
            prefetch(row, 4 * i + PREFETCH)
            v = fma(f32x16_at(row, 4 * i), load16(x, i), v)
        acc += hsum(v)
    for i in range(n16, x.size):
        acc += f32_at(row, 4 * i) * ld(x, i)
    return acc


@njit(**J)
def dot_f16(row, x):
    n16 = x.size - x.size % 16
    acc = 0.0
    for c0 in range(0, n16, FLOAT_CHUNK):
        v = zeros()
        for i in range(c0, min(n16, c0 + FLOAT_CHUNK), 16):
            prefetch(row, 2 * i + PREFETCH)
            v = fma(f16x16(row, 2 * i), load16(x, i), v)        # vcvtph2ps
        acc += hsum(v)
    for i in range(n16, x.size):
        acc += f16_at(row, 2 * i) * ld(x, i)
    return acc


@njit(**J)
def dot_bf16(row, x):
    n16 = x.size - x.size % 16
    acc = 0.0
    for c0 in range(0, n16, FLOAT_CHUNK):
        v = zeros()
        for i in range(c0, min(n16, c0 + FLOAT_CHUNK), 16):
            prefetch(row, 2 * i + PREFETCH)
            v = fma(bf16x16(row, 2 * i), load16(x, i), v)       # bf16 bits << 16
        acc += hsum(v)
    for i in range(n16, x.size):
        acc += bf16_at(row, 2 * i) * ld(x, i)
    return acc


@njit(**J)
def dot2_float(load, one, es, r0, r1, x):
    """dot_f32 / dot_f16 / dot_bf16 on two weight rows in step: `load` reads 16 weights at a byte
    offset, `one` a single weight, es bytes each. Two DRAM streams at once keep more cache-line
    misses in flight (one row at a time left a core's share of the bandwidth unused)."""
    n16 = x.size - x.size % 16
    a0 = 0.0
    a1 = 0.0
    for c0 in range(0, n16, FLOAT_CHUNK):
        v = zeros()
        u = zeros()
        for i in range(c0, min(n16, c0 + FLOAT_CHUNK), 16):
            prefetch(r0, es * i + PREFETCH)
            prefetch(r1, es * i + PREFETCH)
            xi = load16(x, i)
            v = fma(load(r0, es * i), xi, v)
            u = fma(load(r1, es * i), xi, u)
        a0 += hsum(v)
        a1 += hsum(u)
    for i in range(n16, x.size):
        a0 += one(r0, es * i) * ld(x, i)
        a1 += one(r1, es * i) * ld(x, i)
    return a0, a1


# ---------------------------------------------------------------- 32-element blocks
# `blk_<type>(row, o, x, xo, tab, v)` adds the block's 32 products to the 16 lanes v (as d (q . x)
# where the block is d q); `dot_blocks32` walks the blocks, flushing v into the float64 sum every 8.

@njit(**J)
def blk_q8_0(row, o, x, xo, tab, v):
    t = fma(i8x16f(row, o + 18), load16(x, xo + 16), mul(i8x16f(row, o + 2), load16(x, xo)))
    return fma(splat(f16_at(row, o)), t, v)


@njit(**J)
def blk_q8_1(row, o, x, xo, tab, v):
    t = fma(i8x16f(row, o + 20), load16(x, xo + 16), mul(i8x16f(row, o + 4), load16(x, xo)))
    return fma(splat(f16_at(row, o)), t, v)


@njit(**J)
def blk_q4_0(row, o, x, xo, tab, v):
    q = u8x16(row, o + 2)                                       # byte j: nibbles of x[j], x[j + 16]
    lo, m, off = Q4_OFFSET_A                                    # tab = Q4_OFFSET (BLOCKS32)
    t = fma(lut_affine(tab, shr(q, 4), lo, m, off), load16(x, xo + 16),
            mul(lut_affine(tab, q, lo, m, off), load16(x, xo)))
    return fma(splat(f16_at(row, o)), t, v)                     # d ((q - 8) . x)


@njit(**J)
def blk_q4_1(row, o, x, xo, tab, v):
    d = splat(f16_at(row, o))
    mn = splat(f16_at(row, o + 2))
    q = u8x16(row, o + 4)
    v = fma(fma(d, to_f32(band(q, 15)), mn), load16(x, xo), v)                  # w = d q + m
    return fma(fma(d, to_f32(shr(q, 4)), mn), load16(x, xo + 16), v)


@njit(**J)
def blk_q5_0(row, o, x, xo, tab, v):
    qh = u32_at(row, o + 2)                                     # 5th bits: bit j -> x[j], as a lane mask
    q = u8x16(row, o + 6)
    q0 = to_f32(iadd(or_where(band(q, 15), qh, 16), -16))       # q - 16
    q1 = to_f32(iadd(or_where(shr(q, 4), qh >> 16, 16), -16))
    return fma(splat(f16_at(row, o)), fma(q1, load16(x, xo + 16), mul(q0, load16(x, xo))), v)


@njit(**J)
def blk_q5_1(row, o, x, xo, tab, v):
    d = splat(f16_at(row, o))
    mn = splat(f16_at(row, o + 2))
    qh = u32_at(row, o + 4)
    q = u8x16(row, o + 8)
    v = fma(fma(d, to_f32(or_where(band(q, 15), qh, 16)), mn), load16(x, xo), v)
    return fma(fma(d, to_f32(or_where(shr(q, 4), qh >> 16, 16)), mn), load16(x, xo + 16), v)


@njit(**J)
def blk_iq4_nl(row, o, x, xo, tab, v):
    t = fma(nib_lut(tab, row, o + 2, 1), load16(x, xo + 16), mul(nib_lut(tab, row, o + 2, 0), load16(x, xo)))
    return fma(splat(f16_at(row, o)), t, v)


@njit(**J)
def blk_mxfp4(row, o, x, xo, tab, v):
    t = fma(nib_lut(tab, row, o + 1, 1), load16(x, xo + 16), mul(nib_lut(tab, row, o + 1, 0), load16(x, xo)))
    return fma(splat(ld(E8M0_HALF, ld(row, o))), t, v)


@njit(**J)
def dot_blocks32(blk, ts, tab, row, x):
    """Row . x for a 32-block type with block function `blk` and `ts` bytes per block."""
    T = load16(tab, 0)                                          # the code book, once per row
    nb = x.size // 32
    acc = 0.0
    for g0 in range(0, nb, 8):
        ahead(row, ts * g0, 8 * ts)
        v = zeros()
        for b in range(g0, min(nb, g0 + 8)):
            v = blk(row, ts * b, x, 32 * b, T, v)
        acc += hsum(v)
    return acc


@njit(**J)
def dot2_blocks32(blk, ts, tab, r0, r1, x):
    """dot_blocks32 on two weight rows in step (per row the same operations, so the same bits)."""
    T = load16(tab, 0)
    nb = x.size // 32
    a0 = 0.0
    a1 = 0.0
    for g0 in range(0, nb, 8):
        ahead(r0, ts * g0, 8 * ts)
        ahead(r1, ts * g0, 8 * ts)
        v = zeros()
        u = zeros()
        for b in range(g0, min(nb, g0 + 8)):
            v = blk(r0, ts * b, x, 32 * b, T, v)
            u = blk(r1, ts * b, x, 32 * b, T, u)
        a0 += hsum(v)
        a1 += hsum(u)
    return a0, a1


# ---------------------------------------------------------------- 64- and 128-element blocks

@njit(**J)
def dot_q1_0(row, x):
    one = np.float32(1)
    nb = x.size // 128
    acc = 0.0
    for g0 in range(0, nb, 8):
        v = zeros()
        for b in range(g0, min(nb, g0 + 8)):                   # 128 sign bits: w = +-d
            o = 18 * b
            ahead(row, o, 18)
            xo = 128 * b                                        # +-1 per bit (a mask-register blend), two
            t0 = mul(select_bits(u16_at(row, o + 2), one, -one), load16(x, xo))     # chains, then d once
            t1 = mul(select_bits(u16_at(row, o + 4), one, -one), load16(x, xo + 16))
            for k in range(2, 8, 2):
                t0 = fma(select_bits(u16_at(row, o + 2 + 2 * k), one, -one), load16(x, xo + 16 * k), t0)
                t1 = fma(select_bits(u16_at(row, o + 4 + 2 * k), one, -one), load16(x, xo + 16 * k + 16), t1)
            v = fma(splat(f16_at(row, o)), add(t0, t1), v)
        acc += hsum(v)
    return acc


@njit(**J)
def dot2_q1_0(r0, r1, x):
    """dot_q1_0 on two rows, each 16 x loaded once for both (per row the same operations)."""
    one = np.float32(1)
    nb = x.size // 128
    a0 = 0.0
    a1 = 0.0
    for g0 in range(0, nb, 8):
        v = zeros()
        u = zeros()
        for b in range(g0, min(nb, g0 + 8)):
            o = 18 * b
            ahead(r0, o, 18)
            ahead(r1, o, 18)
            xo = 128 * b
            xk = load16(x, xo)
            t0 = mul(select_bits(u16_at(r0, o + 2), one, -one), xk)
            s0 = mul(select_bits(u16_at(r1, o + 2), one, -one), xk)
            xk = load16(x, xo + 16)
            t1 = mul(select_bits(u16_at(r0, o + 4), one, -one), xk)
            s1 = mul(select_bits(u16_at(r1, o + 4), one, -one), xk)
            for k in range(2, 8, 2):
                xk = load16(x, xo + 16 * k)
                t0 = fma(select_bits(u16_at(r0, o + 2 + 2 * k), one, -one), xk, t0)
                s0 = fma(select_bits(u16_at(r1, o + 2 + 2 * k), one, -one), xk, s0)
                xk = load16(x, xo + 16 * k + 16)
                t1 = fma(select_bits(u16_at(r0, o + 4 + 2 * k), one, -one), xk, t1)
                s1 = fma(select_bits(u16_at(r1, o + 4 + 2 * k), one, -one), xk, s1)
            v = fma(splat(f16_at(r0, o)), add(t0, t1), v)
            u = fma(splat(f16_at(r1, o)), add(s0, s1), u)
        a0 += hsum(v)
        a1 += hsum(u)
    return a0, a1


@njit(**J)
def dot_q2_0(row, x):
    T = load16(TERNARY, 0)
    lo, m, off = TERNARY_A
    acc = 0.0
    for g0 in range(0, x.size // 64, 4):
        v = zeros()
        for b in range(g0, min(x.size // 64, g0 + 4)):          # 2-bit codes: w = d (q - 1)
            o = 18 * b
            ahead(row, o, 18)
            t = zeros()
            for k in range(4):
                q = lanes(u32_at(row, o + 2 + 4 * k), 2, 3)
                t = fma(lut_affine(T, q, lo, m, off), load16(x, 64 * b + 16 * k), t)
            v = fma(splat(f16_at(row, o)), t, v)
        acc += hsum(v)
    return acc


@njit(**J)
def dot_nvfp4(row, x):
    T = load16(KV_FP4, 0)
    nb = x.size // 64
    acc = 0.0
    for g0 in range(0, nb, 4):
        v = zeros()
        for b in range(g0, min(nb, g0 + 4)):          # 4 sub-blocks of 16, UE4M3 scale each
            o = 36 * b
            ahead(row, o, 36)
            q = u16x16(row, o + 4)                      # lane l: qs[2l], qs[2l + 1]: nibble k -> x'[16 k + l]
            xo = 64 * b                                 # (x_lanes), all in sub-block l // 4
            t0 = mul(lut(T, q), load16(x, xo))
            t1 = mul(lut(T, shr(q, 4)), load16(x, xo + 16))
            t0 = fma(lut(T, shr(q, 8)), load16(x, xo + 32), t0)
            t1 = fma(lut(T, shr(q, 12)), load16(x, xo + 48), t1)
            v = fma(ue4m3x4(row, o), add(t0, t1), v)    # the 4 scales, lane l: scale l // 4
        acc += hsum(v)
    return acc


@njit(**J)
def lanes4(q, x, xo):
    """Lane l of sum_k q_k x'[xo + 16 k + l], q_k = byte k of lane l of q read as int8 and moved to
    the top of the lane (2^24 q_k, exact in float32; `byte_top`, one vpshufb): 64 weights with no
    widening shuffle. x' = x_lanes(x): x'[xo + 16 k + l] = x[xo + 4 l + k] / 2^24."""
    t = mul(to_f32(byte_top(q, 0)), load16(x, xo))
    t = fma(to_f32(byte_top(q, 1)), load16(x, xo + 16), t)
    t = fma(to_f32(byte_top(q, 2)), load16(x, xo + 32), t)
    return fma(to_f32(band(q, TOP8)), load16(x, xo + 48), t)


@njit(**J)
def lut4(q, first, tab, a, x, xo):
    """Lane l of sum_k tab[(q >> (8 k + first)) & 15] x'[xo + 16 k + l]: a 2- or 4-bit field of each byte
    looked up in place (`vpermps` reads the low 4 bits of the index), already offset by the code
    book (q - 2, q - 8, ...), which is affine as a = (lo, mask, off) says (`lut_affine`: integer lane
    operations without AVX-512). x' = x_lanes(x), the lane order of the type's fields (LANE_TABLES)."""
    lo, m, off = a
    t = mul(lut_affine(tab, shr(q, first), lo, m, off), load16(x, xo))
    t = fma(lut_affine(tab, shr(q, 8 + first), lo, m, off), load16(x, xo + 16), t)
    t = fma(lut_affine(tab, shr(q, 16 + first), lo, m, off), load16(x, xo + 32), t)
    return fma(lut_affine(tab, shr(q, 24 + first), lo, m, off), load16(x, xo + 48), t)


@njit(**J)
def lut4x2(q, p, first, tab, a, x, xo):
    """lut4 on two weight rows' words q and p against the same x': each 16 x' loaded once for both
    (half the activation reads: one pass over x, which streams from L2, serves two rows). Per row the
    same operations in the same order as lut4, so the same bits."""
    lo, m, off = a
    xk = load16(x, xo)
    t = mul(lut_affine(tab, shr(q, first), lo, m, off), xk)
    u = mul(lut_affine(tab, shr(p, first), lo, m, off), xk)
    xk = load16(x, xo + 16)
    t = fma(lut_affine(tab, shr(q, 8 + first), lo, m, off), xk, t)
    u = fma(lut_affine(tab, shr(p, 8 + first), lo, m, off), xk, u)
    xk = load16(x, xo + 32)
    t = fma(lut_affine(tab, shr(q, 16 + first), lo, m, off), xk, t)
    u = fma(lut_affine(tab, shr(p, 16 + first), lo, m, off), xk, u)
    xk = load16(x, xo + 48)
    t = fma(lut_affine(tab, shr(q, 24 + first), lo, m, off), xk, t)
    u = fma(lut_affine(tab, shr(p, 24 + first), lo, m, off), xk, u)
    return t, u


# ---------------------------------------------------------------- K-quants (256-element blocks)
# Scales: the 12-16 scale bytes, rearranged with 32-bit masks, are widened to 16 float32 scales by
# one vector operation (scales_*) kept in a register (mins with the minus sign folded in); `lane`
# broadcasts the one a sub-block needs.

@njit(**J)
def dot_blocks256(blk, row, x, xs):
    """Row . x for a 256-block type: `blk(row, b, x, xs, v)` adds block b to the 16 lanes v, which
    are flushed into the float64 sum every 4 blocks."""
    nb = x.size // 256
    acc = 0.0
    for g0 in range(0, nb, 4):
        v = zeros()
        for b in range(g0, min(nb, g0 + 4)):
            v = blk(row, b, x, xs, v)
        acc += hsum(v)
    return acc


@njit(**J)
def dot2_blocks256(blk, r0, r1, x, xs):
    """Two weight rows against one x, block by block in step (dot_blocks256 on each: the same
    operations per row, so the same bits): two independent streams of loads and of FMA chains."""
    nb = x.size // 256
    a0 = 0.0
    a1 = 0.0
    for g0 in range(0, nb, 4):
        v = zeros()
        u = zeros()
        for b in range(g0, min(nb, g0 + 4)):
            v = blk(r0, b, x, xs, v)
            u = blk(r1, b, x, xs, u)
        a0 += hsum(v)
        a1 += hsum(u)
    return a0, a1


@njit(**J)
def dot2_pairs256(blk2, r0, r1, x, xs):
    """dot2_blocks256 for a type with a two-row block function `blk2(r0, r1, b, x, xs, v, u)`, which
    interleaves the two rows' operations and loads each x' once for both (lut4x2)."""
    nb = x.size // 256
    a0 = 0.0
    a1 = 0.0
    for g0 in range(0, nb, 4):
        v = zeros()
        u = zeros()
        for b in range(g0, min(nb, g0 + 4)):
            v, u = blk2(r0, r1, b, x, xs, v, u)
        a0 += hsum(v)
        a1 += hsum(u)
    return a0, a1


@njit(**J)
def q2k_head(row, o, xs, b, v):
    """Q2_K's 16 scales and mins (16 bytes: scale in the low 4 bits, min in the high 4): returns the
    scales c_i = d sc_i as lanes, and v plus the weight at q = 2 times each group's sum of x."""
    w0 = u32_at(row, o)
    w1 = u32_at(row, o + 4)
    w2 = u32_at(row, o + 8)
    w3 = u32_at(row, o + 12)
    d = f16_at(row, o + 80)
    dmin = f16_at(row, o + 82)
    sc = scales_u8(w0 & LO4, w1 & LO4, w2 & LO4, w3 & LO4, d, d)
    mn = scales_u8((w0 >> 4) & LO4, (w1 >> 4) & LO4, (w2 >> 4) & LO4, (w3 >> 4) & LO4, -dmin, -dmin)
    return sc, fma(fma(sc, splat(np.float32(2)), mn), load16(xs, 16 * b), v)   # w = c (q - 2) + (2 c - dmin m)


@njit(**J)
def blk_q2_k(row, b, x, xs, v):
    o = 84 * b
    ahead(row, o, 84)
    sc, v = q2k_head(row, o, xs, b, v)                      # 1. scales; the weight at q = 2 times sum(x of group i)
    lo, hi = load16(Q2_CENTRED, 0), load16(Q2_CENTRED_HI, 0)
    qs = i32x16_at(row, o + 16)                             # 2. field j of qs[p] -> x[128 (p // 32) + 32 j + p % 32]
    for j in range(4):                                      #    fields j of the 64 bytes: 64 weights (lut4), fields
        tab = lo if j % 2 == 0 else hi                      #    2h, 2h + 1 from nibble h (one shift for two fields)
        a = Q2_CENTRED_A if j % 2 == 0 else Q2_CENTRED_HI_A
        v = fma(spread(sc, 2 * j, 42), lut4(qs, 4 * (j // 2), tab, a, x, 256 * b + 64 * j), v)
    return v


@njit(**J)
def blk_q3_k(row, b, x, xs, v):
    o = 110 * b
    ahead(row, o, 110)
    a0 = u32_at(row, o + 96)                                # 1. 16 6-bit scales: low 4 bits in bytes 0..7,
    a1 = u32_at(row, o + 100)                               #    high 2 bits in bytes 8..11 (ggml's aux[])
    t = u32_at(row, o + 104)
    s0 = (a0 & LO4) | ((t & HI2) << 4)
    s1 = (a1 & LO4) | (((t >> 2) & HI2) << 4)
    s2 = ((a0 >> 4) & LO4) | (((t >> 4) & HI2) << 4)
    s3 = ((a1 >> 4) & LO4) | (((t >> 6) & HI2) << 4)
    s0, s1, s2, s3 = ((s0 + 0x60606060) ^ SIGN8, (s1 + 0x60606060) ^ SIGN8,   # bytes - 32 as int8
                      (s2 + 0x60606060) ^ SIGN8, (s3 + 0x60606060) ^ SIGN8)
    sc = scales_i8(s0, s1, s2, s3, f16_at(row, o + 108), f16_at(row, o + 108))    # c = d sc
    hm = as_i32(b32x2(row, o))                              # 2. bit 4n + j of hmask[l] -> x[128 n + 32 j + l]; lane l
    qs = i32x16_at(row, o + 32)                             #    of the 64 qs bytes: byte k is qs[4 l + k], n = l // 8
    T = load16(Q3_CODES, 0)                                 #    q = low 2 bits + 4 hmask bit: looked up as q - 4
    for j in range(4):                                      #    field j of each byte, hmask bit moved next to it
        q = bitsel(0x04040404, rotl(hm, 2 - j, 30 - j), shr(qs, 2 * j))
        v = fma(spread(sc, 2 * j, 42), lut4(q, 0, T, Q3_CODES_A, x, 256 * b + 64 * j), v)     # c (q - 4) . x
    return v


@njit(**J)
def k4_scales(row, o):
    """get_scale_min_k4 for the 8 sub-blocks of the Q4_K/Q5_K block at o: lanes i < 8: d sc_i,
    lanes 8 + i: -dmin mn_i."""
    w0 = u32_at(row, o + 4)
    w1 = u32_at(row, o + 8)
    w2 = u32_at(row, o + 12)
    return scales_u8(w0 & LO6, (w2 & LO4) | ((w0 >> 2) & (HI2 << 4)),
                     w1 & LO6, ((w2 >> 4) & LO4) | ((w1 >> 2) & (HI2 << 4)), f16_at(row, o), -f16_at(row, o + 2))


@njit(**J)
def blk_q4_k(row, b, x, xs, v):
    o = 144 * b
    ahead(row, o, 144)
    sc = k4_scales(row, o)                                  # 1. 6-bit scales and mins per 32
    v = fma(fma(spread(sc, 0, 88), splat(np.float32(8)), sc), load16(xs, 16 * b), v)   # w = c (q - 8) + (8 c
    T = load16(Q4_OFFSET, 0)                                #    - dmin m): the weight at q = 8 times sum(x)
    for c in range(2):                                      # 2. qs[p] low nibble -> x[64 (p // 32) + p % 32], high
        qs = i32x16_at(row, o + 16 + 64 * c)                #    -> 32 further; nibble h of the 64 bytes: 64 weights
        for h in range(2):
            v = fma(spread(sc, 4 * c + h, 82), lut4(qs, 4 * h, T, Q4_OFFSET_A, x, 256 * b + 128 * c + 64 * h), v)
    return v


@njit(**J)
def blk2_q4_k(r0, r1, b, x, xs, v, u):
    """blk_q4_k on two rows, x' loaded once for both (lut4x2)."""
    o = 144 * b
    ahead(r0, o, 144)
    ahead(r1, o, 144)
    sc = k4_scales(r0, o)
    sd = k4_scales(r1, o)
    xsb = load16(xs, 16 * b)
    v = fma(fma(spread(sc, 0, 88), splat(np.float32(8)), sc), xsb, v)
    u = fma(fma(spread(sd, 0, 88), splat(np.float32(8)), sd), xsb, u)
    T = load16(Q4_OFFSET, 0)
    for c in range(2):
        q = i32x16_at(r0, o + 16 + 64 * c)
        p = i32x16_at(r1, o + 16 + 64 * c)
        for h in range(2):
            t, w = lut4x2(q, p, 4 * h, T, Q4_OFFSET_A, x, 256 * b + 128 * c + 64 * h)
            v = fma(spread(sc, 4 * c + h, 82), t, v)
            u = fma(spread(sd, 4 * c + h, 82), w, u)
    return v, u


@njit(**J)
def blk_q5_k(row, b, x, xs, v):
    o = 176 * b
    ahead(row, o, 176)
    sc = k4_scales(row, o)                                  # 1. 6-bit scales and mins per 32
    v = fma(fma(spread(sc, 0, 88), splat(np.float32(16)), sc), load16(xs, 16 * b), v)  # w = c (q - 16) + (16 c
    qh = as_i32(b32x2(row, o + 16))                         #    - dmin m); 5th bit of x[64 j + 32 h + i]: bit 2j + h
    T0, T1 = load16(Q5_CODES, 0), load16(Q5_CODES, 16)      #    of qh[i]; looked up as q - 16
    lo, m, off = Q5_CODES_A
    for c in range(2):                                      # 2. as Q4_K: nibble h of the 64 bytes qs[64 c:], 64 weights
        qs = i32x16_at(row, o + 48 + 64 * c)                #    (lut4's order), the qh bit rotated next to each nibble
        for h in range(2):
            q = bitsel(0x10101010, rotl(qh, 4 - 4 * c - h, 2 - 4 * c - h), shr(qs, 4 * h))
            t = mul(lut32_affine(T0, T1, q, lo, m, off), load16(x, 256 * b + 128 * c + 64 * h))
            t = fma(lut32_affine(T0, T1, shr(q, 8), lo, m, off), load16(x, 256 * b + 128 * c + 64 * h + 16), t)
            t = fma(lut32_affine(T0, T1, shr(q, 16), lo, m, off), load16(x, 256 * b + 128 * c + 64 * h + 32), t)
            t = fma(lut32_affine(T0, T1, shr(q, 24), lo, m, off), load16(x, 256 * b + 128 * c + 64 * h + 48), t)
            v = fma(spread(sc, 4 * c + h, 82), t, v)
    return v


@njit(**J)
def q6k_scales(row, o):
    """Q6_K's 16 int8 scales times d, as lanes."""
    d = f16_at(row, o + 208)
    return scales_i8(u32_at(row, o + 192), u32_at(row, o + 196), u32_at(row, o + 200), u32_at(row, o + 204), d, d)


@njit(**J)
def q6k_codes(row, o, n):
    """The 128 codes q - 32 of half n of the Q6_K block at o, as int8 bytes in two vectors (built on
    the packed bytes: ql[l] low nibble -> x[l], ql[l + 32] -> x[l + 32], high nibbles -> x[l + 64],
    x[l + 96]; qh[l] bits 2k, 2k + 1 -> 16, 32 of the k-th of those)."""
    ql = b64(row, o + 64 * n)
    qh = b32x2(row, o + 128 + 32 * n)
    q0 = as_i32(bsub(bor(bmask(ql, 15), bmask(bsh(qh, -4, -2), 48)), 32))
    q1 = as_i32(bsub(bor(bmask(bsh(ql, 4, 4), 15), bmask(bsh(qh, 0, 2), 48)), 32))
    return q0, q1


@njit(**J)
def blk_q6_k(row, b, x, xs, v):
    o = 210 * b
    ahead(row, o, 210)
    sc = q6k_scales(row, o)                                 # 1. int8 scales: c = d sc
    v0, v1 = zeros(), zeros()
    for n in range(2):                                      # 2. per 128 weights, on the packed bytes
        q0, q1 = q6k_codes(row, o, n)
        xo = 256 * b + 128 * n                              # 3. byte k of each lane in place (x_lanes)
        v0 = fma(spread(sc, 8 * n, 4), lanes4(q0, x, xo), v0)            # c ((q - 32) . x)
        v1 = fma(spread(sc, 8 * n + 4, 4), lanes4(q1, x, xo + 64), v1)
    return add(v, add(v0, v1))


@njit(**J)
def dot_q8_k(row, x):
    acc = 0.0
    for b in range(x.size // 256):
        o = 292 * b
        ahead(row, o, 292)
        v = zeros()
        for k in range(16):
            v = fma(i8x16f(row, o + 4 + 16 * k), load16(x, 256 * b + 16 * k), v)
        acc += f32_at(row, o) * hsum(v)
    return acc


@njit(**J)
def blk_tq2_0(row, b, x, xs, v):
    o = 66 * b
    ahead(row, o, 66)
    lo, hi = load16(TERNARY, 0), load16(TERNARY_HI, 0)      # field j of qs[p] -> x[128 (p // 32) + 32 j + p % 32]
    qs = i32x16_at(row, o)                                  # looked up as q - 1: w = d (q - 1); fields 2h, 2h + 1
    t = add(add(lut4(qs, 0, lo, TERNARY_A, x, 256 * b), lut4(qs, 0, hi, TERNARY_HI_A, x, 256 * b + 64)),  # from
            add(lut4(qs, 4, lo, TERNARY_A, x, 256 * b + 128),                                        # nibble h
                lut4(qs, 4, hi, TERNARY_HI_A, x, 256 * b + 192)))
    return fma(splat(f16_at(row, o + 64)), t, v)


@njit(**J)
def blk2_tq2_0(r0, r1, b, x, xs, v, u):
    """blk_tq2_0 on two rows, x' loaded once for both (lut4x2)."""
    o = 66 * b
    ahead(r0, o, 66)
    ahead(r1, o, 66)
    lo, hi = load16(TERNARY, 0), load16(TERNARY_HI, 0)
    q = i32x16_at(r0, o)
    p = i32x16_at(r1, o)
    t0, w0 = lut4x2(q, p, 0, lo, TERNARY_A, x, 256 * b)
    t1, w1 = lut4x2(q, p, 0, hi, TERNARY_HI_A, x, 256 * b + 64)
    t2, w2 = lut4x2(q, p, 4, lo, TERNARY_A, x, 256 * b + 128)
    t3, w3 = lut4x2(q, p, 4, hi, TERNARY_HI_A, x, 256 * b + 192)
    v = fma(splat(f16_at(r0, o + 64)), add(add(t0, t1), add(t2, t3)), v)
    u = fma(splat(f16_at(r1, o + 64)), add(add(w0, w1), add(w2, w3)), u)
    return v, u


@njit(**J)
def ternary(T, d):
    """TERNARY[d & 15] (T = load16(TERNARY, 0)): the digit d - 1 (`lut_affine`)."""
    return lut_affine(T, d, TERNARY_A[0], TERNARY_A[1], TERNARY_A[2])


@njit(**J)
def blk_tq1_0(row, b, x, xs, v):
    o = 54 * b
    ahead(row, o, 54)
    T = load16(TERNARY, 0)                                  # digits looked up as q - 1: w = d (q - 1)
    xo = 256 * b
    q = wshl(u8x32w(row, o), 8)                             # qs[0:32] as words qs[m] << 8 (lane l: m = 2l, 2l + 1)
    p = wshl(u8x16(row, o + 32), 8)                         # qs[32:48], one per lane (high word 0)
    # digit n of a byte: ((byte 3^n mod 256) 3) >> 8 = high word of ((byte << 8) 3^n mod 2^16) 3, as ggml
    # digit n of qs[m] -> x[32 n + m] (x' lanes: even m, then odd m); of qs[32 + m] -> x[160 + 16 n + m]
    d, e = wmulhi(q, 3), wmulhi(p, 3)
    t0 = fma(ternary(T, shr(d, 16)), load16(x, xo + 16), mul(ternary(T, d), load16(x, xo)))
    t1 = mul(ternary(T, e), load16(x, xo + 160))
    d, e = wmulhi(wmul(q, 3), 3), wmulhi(wmul(p, 3), 3)
    t0 = fma(ternary(T, d), load16(x, xo + 32), t0)
    t1 = fma(ternary(T, shr(d, 16)), load16(x, xo + 48), t1)
    t0 = fma(ternary(T, e), load16(x, xo + 176), t0)
    d, e = wmulhi(wmul(q, 9), 3), wmulhi(wmul(p, 9), 3)
    t1 = fma(ternary(T, d), load16(x, xo + 64), t1)
    t0 = fma(ternary(T, shr(d, 16)), load16(x, xo + 80), t0)
    t1 = fma(ternary(T, e), load16(x, xo + 192), t1)
    d, e = wmulhi(wmul(q, 27), 3), wmulhi(wmul(p, 27), 3)
    t0 = fma(ternary(T, d), load16(x, xo + 96), t0)
    t1 = fma(ternary(T, shr(d, 16)), load16(x, xo + 112), t1)
    t0 = fma(ternary(T, e), load16(x, xo + 208), t0)
    d, e = wmulhi(wmul(q, 81), 3), wmulhi(wmul(p, 81), 3)
    t1 = fma(ternary(T, d), load16(x, xo + 128), t1)
    t0 = fma(ternary(T, shr(d, 16)), load16(x, xo + 144), t0)
    t1 = fma(ternary(T, e), load16(x, xo + 224), t1)
    t0 = fma(ternary(T, base3_tail(u32_at(row, o + 48))), load16(x, xo + 240), t0)   # qh[4]: 4 digits per byte
    return fma(splat(f16_at(row, o + 52)), add(t0, t1), v)


@njit(**J)
def blk_iq4_xs(row, b, x, xs, v):
    T = load16(KV_IQ4, 0)
    o = 136 * b
    ahead(row, o, 136)
    ls = ior(lanes(u32_at(row, o + 4), 4, 15), shl(lanes(u16_at(row, o + 2), 2, 3), 4))   # lane ib < 8: 6-bit
    dl = mul(to_f32(iadd(ls, -32)), splat(f16_at(row, o)))     # scale of sub-block ib (4 low bits, 2 high): d (ls - 32)
    for ib in range(8):
        qo = o + 8 + 16 * ib
        xo = 256 * b + 32 * ib
        t = fma(nib_lut(T, row, qo, 1), load16(x, xo + 16), mul(nib_lut(T, row, qo, 0), load16(x, xo)))
        v = fma(spread(dl, ib, 0), t, v)
    return v


# ---------------------------------------------------------------- i-quants: grids of 8 (or 4) values
# Per sub-block of 32: four grid rows (a byte or 9-10 bits each) are loaded as two 16-lane vectors
# (rows8: two rows of the flat float tables), their signs flipped by mask registers (flip): IQ2_S and
# IQ3_S store 8 sign bits per row; IQ2_XXS, IQ2_XS, IQ3_XXS store 7, the 8th being even parity
# (ggml's ksigns_iq2xs), rebuilt four at a time in a scalar word (signs4); scaled per 16 or 32.

@njit(**J)
def signs4(aux):
    """ksigns_iq2xs of the four 7-bit fields in bits 0..27 of aux: byte k = field k, with bit 7 set
    when field k has an odd number of ones (pdep moves the fields to bytes; a byte-wise xor fold
    leaves each byte's parity in its bit 0)."""
    s = pdep32(aux, 0x7F7F7F7F)
    p = s ^ (s >> 4)
    p = p ^ (p >> 2)
    p = p ^ (p >> 1)
    return s | ((p & 0x01010101) << 7)


@njit(**J)
def blk_iq2_xxs(row, b, x, xs, v):
    o = 66 * b
    ahead(row, o, 66)                                       # sub-block ib: 4 grid bytes, then a word aux of
    sc = mul(addc(to_f32(shr(i32x16_at(row, o + 2), 28)), np.float32(0.5)),    # 4 x 7 sign bits, 4-bit scale
             splat(f16_at(row, o) * np.float32(0.25)))      # on top: d (0.5 + s) / 4 in lane 2 ib + 1, all 8 at once
    for ib in range(8):
        q = o + 2 + 8 * ib
        sg = signs4(u32_at(row, q + 4))
        g01 = flip(rows8(GRID_IQ2XXS, ld(row, q), ld(row, q + 1)), sg)
        g23 = flip(rows8(GRID_IQ2XXS, ld(row, q + 2), ld(row, q + 3)), sg >> 16)
        xo = 256 * b + 32 * ib
        v = fma(spread(sc, 2 * ib + 1, 0), fma(g23, load16(x, xo + 16), mul(g01, load16(x, xo))), v)
    return v


@njit(**J)
def blk_iq2_xs(row, b, x, xs, v):
    o = 74 * b
    ahead(row, o, 74)
    sc = mul(addc(to_f32(nib8x2(row, o + 66)), np.float32(0.5)), splat(f16_at(row, o) * np.float32(0.25)))
    for ib in range(8):                                     # scales d (0.5 + nibble) / 4: lanes ib, 8 + ib
        lo = u32_at(row, o + 2 + 8 * ib)                    # 4 words: 9-bit grid index, 7 sign bits on top
        hi = u32_at(row, o + 6 + 8 * ib)
        sg = signs4(pext64(lo | (hi << 32), SIGNS_XS))
        g01 = flip(rows8(GRID_IQ2XS, lo & 511, (lo >> 16) & 511), sg)
        g23 = flip(rows8(GRID_IQ2XS, hi & 511, (hi >> 16) & 511), sg >> 16)
        xo = 256 * b + 32 * ib
        v = fma(spread(sc, ib, 0), mul(g01, load16(x, xo)), v)
        v = fma(spread(sc, 8 + ib, 0), mul(g23, load16(x, xo + 16)), v)
    return v


@njit(**J)
def blk_iq2_s(row, b, x, xs, v):
    o = 82 * b
    ahead(row, o, 82)
    sc = mul(addc(to_f32(nib8x2(row, o + 74)), np.float32(0.5)), splat(f16_at(row, o) * np.float32(0.25)))
    for ib in range(8):                                     # scales d (0.5 + nibble) / 4: lanes ib, 8 + ib
        qh = np.int64(ld(row, o + 66 + ib))
        q = o + 2 + 4 * ib
        s = o + 34 + 4 * ib
        g01 = flip(rows8(GRID_IQ2S, ld(row, q) | ((qh << 8) & 0x300), ld(row, q + 1) | ((qh << 6) & 0x300)),
                   u16_at(row, s))
        g23 = flip(rows8(GRID_IQ2S, ld(row, q + 2) | ((qh << 4) & 0x300), ld(row, q + 3) | ((qh << 2) & 0x300)),
                   u16_at(row, s + 2))
        xo = 256 * b + 32 * ib
        v = fma(spread(sc, ib, 0), mul(g01, load16(x, xo)), v)
        v = fma(spread(sc, 8 + ib, 0), mul(g23, load16(x, xo + 16)), v)
    return v


@njit(**J)
def blk_iq3_xxs(row, b, x, xs, v):
    o = 98 * b
    ahead(row, o, 98)
    d = f16_at(row, o)
    for ib in range(8):
        aux = u32_at(row, o + 66 + 4 * ib)
        db = d * (np.float32(0.5) + np.float32(aux >> 28)) * np.float32(0.5)
        q = o + 2 + 8 * ib
        sg = signs4(aux)
        g0 = flip(rows4(GRID_IQ3XXS, ld(row, q), ld(row, q + 1), ld(row, q + 2), ld(row, q + 3)), sg)
        g1 = flip(rows4(GRID_IQ3XXS, ld(row, q + 4), ld(row, q + 5), ld(row, q + 6), ld(row, q + 7)), sg >> 16)
        xo = 256 * b + 32 * ib
        v = fma(splat(db), fma(g1, load16(x, xo + 16), mul(g0, load16(x, xo))), v)
    return v


@njit(**J)
def blk_iq3_s(row, b, x, xs, v):
    o = 110 * b
    ahead(row, o, 110)
    sc = band(shr4(u16_lanes(row, o + 106, 14), 0, 4, 8, 12), 15)    # lane ib < 8: nibble ib of scales[4]
    dl = mul(to_f32(iadd(shl(sc, 1), 1)), splat(f16_at(row, o)))    # d (1 + 2 nibble), all 8 at once
    for ib in range(8):
        qh = np.int64(ld(row, o + 66 + ib))
        q = o + 2 + 8 * ib
        s = o + 74 + 4 * ib
        g0 = flip(rows4(GRID_IQ3S, ld(row, q) | ((qh << 8) & 256), ld(row, q + 1) | ((qh << 7) & 256),
                       ld(row, q + 2) | ((qh << 6) & 256), ld(row, q + 3) | ((qh << 5) & 256)),
                 u16_at(row, s))
        g1 = flip(rows4(GRID_IQ3S, ld(row, q + 4) | ((qh << 4) & 256), ld(row, q + 5) | ((qh << 3) & 256),
                       ld(row, q + 6) | ((qh << 2) & 256), ld(row, q + 7) | ((qh << 1) & 256)),
                 u16_at(row, s + 2))
        xo = 256 * b + 32 * ib
        v = fma(spread(dl, ib, 0), fma(g1, load16(x, xo + 16), mul(g0, load16(x, xo))), v)
    return v


@njit(**J)
def blk_iq1_s(row, b, x, xs, v):
    o = 50 * b
    ahead(row, o, 50)
    qh = u16_lanes(row, o + 34, 88)                         # 1. lane l: qh[l % 8] (sub-block l % 8)
    dl = mul(to_f32(iadd(shl(band(shr(qh, 12), 7), 1), 1)), splat(f16_at(row, o)))      # d (2 s + 1)
    delta = fma(to_f32(shr(qh, 15)), splat(np.float32(-0.25)), splat(IQ1S_DELTA))     # +-1/8 (bit 15)
    v = fma(mul(dl, delta), load16(xs, 16 * b), v)          #    w = dl (grid + delta): dl delta sum(x of 32),
    for ib in range(8):                                     #    all 8 at once (xs: 8 zeros, then 8 sums)
        h = u16_at(row, o + 34 + 2 * ib)                    # 2. dl (grid . x), grid rows of 8 from 11 bits
        q = o + 2 + 4 * ib                                  #    (int8 rows: 16 KB of table, in L1)
        g01 = rows8_i8(GRID_IQ1S_I8, ld(row, q) | ((h << 8) & 0x700), ld(row, q + 1) | ((h << 5) & 0x700))
        g23 = rows8_i8(GRID_IQ1S_I8, ld(row, q + 2) | ((h << 2) & 0x700), ld(row, q + 3) | ((h >> 1) & 0x700))
        xo = 256 * b + 32 * ib
        v = fma(spread(dl, 8 + ib, 0), fma(g23, load16(x, xo + 16), mul(g01, load16(x, xo))), v)
    return v


@njit(**J)
def blk_iq1_m(row, b, x, xs, v):
    o = 56 * b
    ahead(row, o, 56)
    d = iq1_m_scale(row, o)                                 # 1. 16 scales, one per 16 weights u: 3 bits at
    sc = u16_lanes(row, o + 48, 4)                          #    3 (u % 4) of scale word u // 4: d (2 s + 1)
    dl = mul(to_f32(iadd(shl(band(shr4(sc, 0, 3, 6, 9), 7), 1), 1)), splat(d))
    h0 = band(shr4(u16_lanes(row, o + 32, 4), 3, 7, 11, 15), 1)     # delta of group g of 8: bit 3 + 4 (g % 2)
    h1 = band(shr4(u16_lanes(row, o + 40, 4), 3, 7, 11, 15), 1)     # of qh[g // 2]: +-1/8
    m, c = splat(np.float32(-0.25)), splat(IQ1S_DELTA)
    v = fma(spread(dl, 0, 2), mul(fma(to_f32(h0), m, c), load16(xs, 32 * b)), v)        # dl delta sum(x of 8)
    v = fma(spread(dl, 8, 2), mul(fma(to_f32(h1), m, c), load16(xs, 32 * b + 16)), v)   # for the 32 groups
    for ib in range(8):                                     # 2. dl (grid . x), grid rows of 8 from 11 bits
        q = o + 4 * ib
        h = u16_at(row, o + 32 + 2 * ib)
        g01 = rows8(GRID_IQ1S, ld(row, q) | ((h << 8) & 0x700), ld(row, q + 1) | ((h << 4) & 0x700))
        g23 = rows8(GRID_IQ1S, ld(row, q + 2) | (h & 0x700), ld(row, q + 3) | ((h >> 4) & 0x700))
        xo = 256 * b + 32 * ib
        v = fma(spread(dl, 2 * ib, 0), mul(g01, load16(x, xo)), v)
        v = fma(spread(dl, 2 * ib + 1, 0), mul(g23, load16(x, xo + 16)), v)
    return v


# ---------------------------------------------------------------- dispatch

DOT = {F32: dot_f32, F16: dot_f16, BF16: dot_bf16, Q1_0: dot_q1_0, Q2_0: dot_q2_0, NVFP4: dot_nvfp4,
       Q8_K: dot_q8_k}
# 32-element blocks: (block function, bytes per block, code book for `lut`)
BLOCKS32 = {Q8_0: (blk_q8_0, 34, Q4_OFFSET), Q8_1: (blk_q8_1, 36, Q4_OFFSET), Q4_0: (blk_q4_0, 18, Q4_OFFSET),
            Q4_1: (blk_q4_1, 20, Q4_OFFSET), Q5_0: (blk_q5_0, 22, Q4_OFFSET), Q5_1: (blk_q5_1, 24, Q4_OFFSET),
            IQ4_NL: (blk_iq4_nl, 18, KV_IQ4), MXFP4: (blk_mxfp4, 17, KV_FP4)}
# kernels that take the activation group sums (x_sums): group size
# 256-element blocks: `blk(row, b, x, xs, v)` (dot_blocks256)
BLOCKS256 = {Q2_K: blk_q2_k, Q3_K: blk_q3_k, Q4_K: blk_q4_k, Q5_K: blk_q5_k, Q6_K: blk_q6_k, TQ2_0: blk_tq2_0,
             TQ1_0: blk_tq1_0, IQ4_XS: blk_iq4_xs, IQ2_XXS: blk_iq2_xxs, IQ2_XS: blk_iq2_xs, IQ2_S: blk_iq2_s,
             IQ3_XXS: blk_iq3_xxs, IQ3_S: blk_iq3_s, IQ1_S: blk_iq1_s, IQ1_M: blk_iq1_m}
DOT_XS = {}
XS_GROUP = {Q2_K: 16, Q4_K: 32, Q5_K: 32, IQ1_S: 32, IQ1_M: 8}
FUSED = tuple(DOT) + tuple(DOT_XS) + tuple(BLOCKS32) + tuple(BLOCKS256)


def row_dot(kind, row, x, xs):
    """Numba only: fused row . x for ggml type `kind` (a compile-time constant in FUSED); xs = x_sums(kind, x)
    for that row."""
    raise NotImplementedError("row_dot is callable from Numba-compiled code only")


@overload(row_dot, inline="always", prefer_literal=True)
def _row_dot(kind, row, x, xs):
    # resolved while typing: only this type's kernel is compiled into the caller
    k = literal_kind(kind)
    if k in BLOCKS32:
        blk, ts, tab = BLOCKS32[k]
        return lambda kind, row, x, xs: dot_blocks32(blk, ts, tab, row, x)
    if k in BLOCKS256:
        blk256 = BLOCKS256[k]
        return lambda kind, row, x, xs: dot_blocks256(blk256, row, x, xs)
    fn = DOT_XS.get(k)
    if fn is not None:
        return lambda kind, row, x, xs: fn(row, x, xs)
    fn = DOT.get(k)
    if fn is None:
        return lambda kind, row, x, xs: 0.0       # not fused: the drivers never call it
    return lambda kind, row, x, xs: fn(row, x)


# Types whose GEMV reads weight rows in pairs (row_dot2): the memory-bound ones, where two streams
# measured 1.3x (F32, F16, BF16) to 2x (Q8_0) faster on one core; the others lost 5-25% to register
# pressure (1 thread, 4096 x 14336, min of 9 alternating rounds) when run as two whole blocks in step.
# Q1_0, Q4_K, TQ2_0 have two-row kernels instead (DOT2, BLOCKS256_2): their fast kernels were bound
# by the activation row streaming from L2 (64 bytes of x per 16 weights; a 14336-long row is 57 KB),
# so one x' load serving both rows is worth more than the extra registers. Written the same way, Q2_K,
# Q3_K, Q5_K, Q6_K, TQ1_0 won 2-12% on one core with the rows in cache but not on the whole matrix
# with the machine shared (0.91-1.02x), so they read one row at a time.
FLOATS2 = {F32: (f32x16_at, f32_at, 4), F16: (f16x16, f16_at, 2), BF16: (bf16x16, bf16_at, 2)}
BLOCKS256_2 = {Q4_K: blk2_q4_k, TQ2_0: blk2_tq2_0}
DOT2 = {Q1_0: dot2_q1_0}                # the same for a type with its own whole-row kernel
PAIRED = frozenset(FLOATS2) | {Q8_0} | frozenset(BLOCKS256_2) | frozenset(DOT2)
# the types whose GEMV takes row_dot2 on this host. Without AVX-512 a 16-lane vector is two ymm registers of 16,
# and the two-row K-quant kernels spill: on an AVX2 host (AMD EPYC, 2 cores) Q4_K's kernel made 641 stack accesses
# and 4096 x 14336 took 5.9-7.3 ms paired against 4.1-4.2 ms one row at a time, TQ2_0 4.2 against 3.4 ms; there Q8_0
# and Q1_0 stay paired (4.0 against 5.5 ms, 3.3 against 4.3 ms) and the floats measured level
PAIRED_GEMV = PAIRED if HAVE_AVX512 else PAIRED - frozenset(BLOCKS256_2)


def row_dot2(kind, r0, r1, x, xs):
    """Numba only: (r0 . x, r1 . x) for a type in PAIRED, each bit for bit equal to row_dot."""
    raise NotImplementedError("row_dot2 is callable from Numba-compiled code only")


@overload(row_dot2, inline="always", prefer_literal=True)
def _row_dot2(kind, r0, r1, x, xs):
    k = literal_kind(kind)
    if k in FLOATS2:
        load, one, es = FLOATS2[k]
        return lambda kind, r0, r1, x, xs: dot2_float(load, one, es, r0, r1, x)
    if k in BLOCKS32:
        blk, ts, tab = BLOCKS32[k]
        return lambda kind, r0, r1, x, xs: dot2_blocks32(blk, ts, tab, r0, r1, x)
    if k in DOT2:
        fn2 = DOT2[k]
        return lambda kind, r0, r1, x, xs: fn2(r0, r1, x)
    if k in BLOCKS256_2:
        blk2 = BLOCKS256_2[k]
        return lambda kind, r0, r1, x, xs: dot2_pairs256(blk2, r0, r1, x, xs)
    if k in BLOCKS256:
        blk256 = BLOCKS256[k]
        return lambda kind, r0, r1, x, xs: dot2_blocks256(blk256, r0, r1, x, xs)
    return lambda kind, r0, r1, x, xs: (0.0, 0.0)    # not paired: the drivers never call it


def x_sums(kind: int, x: np.ndarray) -> np.ndarray:
    """Per-group sums of the activation rows, for the kernels that fold a block's offset term (mins,
    Q5_0's -16, Q3_K's -4, Q6_K's -32, TQ2_0's -1, ...) into one multiply per group:  x [N, I] -> f32 [N, L].

    L = I / g for the group size g = XS_GROUP[kind] (the sum of each g consecutive x), except
    Q4_K, Q5_K, IQ1_S: L = I / 16, per 256: 8 zeros then the sums of its 8 groups of 32 (the lanes of
    the mins in k4_scales, of the sub-block deltas in blk_iq1_s). Sums in float64, rounded once.
    Types without an offset term: L = 0.
    """
    N, I = x.shape
    g = XS_GROUP.get(kind)
    if g is None:
        return np.zeros((N, 0), np.float32)
    pad = kind in (Q4_K, Q5_K, IQ1_S)
    out = np.empty((N, I // 16 if pad else I // g), np.float32)
    _group_sums(x, g, pad, out)
    return out


@njit(cache=True)
def _group_sums(x, g, pad, out):
    for n in range(x.shape[0]):
        for c in range(x.shape[1] // g):
            s = 0.0
            for i in range(g * c, g * c + g):
                s += x[n, i]
            if pad:                                         # per 256: 8 zeros, then the 8 sums of 32
                out[n, 16 * (c // 8) + c % 8] = 0
                out[n, 16 * (c // 8) + 8 + c % 8] = s
            else:
                out[n, c] = s


# kernels that read x in lane order: x' = x_lanes(kind, x), per 256: x'[i] = x[perm[i]] * scale[i]
def _lanes4_table():
    """lanes4: per 64, x'[16 k + l] = x[4 l + k] / 2^24."""
    i = np.arange(256)
    c, k, l = i // 64, (i % 64) // 16, i % 16
    return 64 * c + 4 * l + k, np.full(256, 2.0 ** -24, np.float32)


def _lut4_table(width):
    """lut4 on 64 bytes q[p] holding fields f = 0 .. 8 / width - 1 at bit width f of each byte:
    vector 4 f + k (x'[64 f + 16 k + l]) is field f of byte k of lane l, p = 4 l + k.
    2 bits (Q2_K, TQ2_0): field f of q[p] is x[128 (p // 32) + 32 f + p % 32];
    4 bits (Q4_K, two 64-byte halves c): nibble f of q[64 c + p] is x[64 (2 c + p // 32) + 32 f + p % 32]."""
    i = np.arange(256)
    if width == 2:
        f, k, l = i // 64, (i % 64) // 16, i % 16
        p = 4 * l + k
        src = 128 * (p // 32) + 32 * f + p % 32
    else:
        c, f, k, l = i // 128, (i % 128) // 64, (i % 64) // 16, i % 16
        p = 4 * l + k
        src = 64 * (2 * c + p // 32) + 32 * f + p % 32
    return src, np.ones(256, np.float32)


def _even_odd_table():
    """TQ1_0: per 32 (qs[0:32], digits 0..4), x'[32 n + l] = x[32 n + 2 l], x'[32 n + 16 + l] = x[32 n + 2 l + 1]
    (the even and odd words of u8x32w); x[160:256] as it is."""
    src = np.arange(256)
    i = np.arange(160)
    src[:160] = 32 * (i // 32) + 2 * (i % 16) + (i % 32) // 16
    return src, np.ones(256, np.float32)


def _nvfp4_table():
    """NVFP4, per 64 (one block): x'[16 k + l] = the weight of nibble k of lane l of u16x16 (byte
    p = 2 l + k // 2 of qs, nibble k % 2): x[16 (p // 8) + p % 8 + 8 (k % 2)]."""
    i = np.arange(64)
    k, l = i // 16, i % 16
    p = 2 * l + k // 2
    return 16 * (p // 8) + p % 8 + 8 * (k % 2), np.ones(64, np.float32)


LANE_TABLES = {NVFP4: _nvfp4_table(), TQ1_0: _even_odd_table(), Q3_K: _lut4_table(2), Q5_K: _lut4_table(4),
               Q6_K: _lanes4_table(), Q2_K: _lut4_table(2), TQ2_0: _lut4_table(2), Q4_K: _lut4_table(4)}


def x_lanes(kind: int, x: np.ndarray) -> np.ndarray:
    """x as the kernels of LANE_TABLES read it: per 256 (NVFP4: per 64), x'[i] = x[perm[i]] * scale[i]
    (scale a power of two: exact).  x [N, I] -> [N, I]; other types: x itself."""
    tab = LANE_TABLES.get(kind)
    if tab is None:
        return x
    out = np.empty_like(x)
    _lane_order(x, tab[0], tab[1], out)
    return out


@njit(cache=True)
def _lane_order(x, perm, scale, out):
    for n in range(x.shape[0]):
        for c in range(0, x.shape[1], perm.size):
            for i in range(perm.size):
                out[n, c + i] = x[n, c + perm[i]] * scale[i]
