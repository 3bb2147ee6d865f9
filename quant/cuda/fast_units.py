"""The unit decoders of the fast GEMV (`fast.py`): `FSpec`, the device primitives the decoders share, and the
13 types here (Q4_K, Q6_K, Q8_0, Q4_0, Q5_K, Q2_K, Q3_K, IQ4_XS, IQ4_NL, MXFP4, Q4_1, Q5_0, Q5_1) in `BASE`;
`fast_more.py` adds the others in `MORE`, `fast_specs.FSPECS` holds both (the registry the kernels read).

A type's decoder (`ld` then `dc`, below) fills, for unit c of the block at byte `base`:
    q[r, j*RL + k]   the integer weight (as an exact float) of column  col(c, j) + k,   j < NR, k < RL
    sa[r, j], sb[r, j]   the run's weight = sa * q + sb   (sb only where the type has mins: HASB)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from ..formats import GGMLType
from .device import MAGIC, MAGIC_BITS, as_f32, hf, u2f
from .decoders import b12, e8m0_half, scale_min_k4
from .vec import h2f, ld4u, prmt

SEL = 0x7650          # prmt selector: byte k of a under bytes 1..3 of b = MAGIC_BITS (add k for byte k)
LO4 = 0x0F0F0F0F


@dataclass(frozen=True)
class FSpec:
    type: GGMLType
    BS: int           # weights per block
    TS: int           # bytes per block
    UPB: int          # units (lanes) per block
    NR: int           # runs per unit
    RL: int           # weights per run (a multiple of 4)
    HASB: bool        # weight = sa*q + sb (mins), else sa*q
    ALIGN16: bool     # the decoder reads 16-byte aligned words (needs rows of a multiple of 16 bytes)
    NW: int           # raw words a unit's loads keep
    PMAX: int         # rows in flight (one-token kernel) whose raw words still fit in registers
    PGLU: int         # the same with gate and up (checked with ptxas: no local memory, no spills)
    ld: object        # loads of one unit (see below)
    dc: object        # decode of one unit from its loaded words
    col: object       # col(c, j): first column of run j of unit c, relative to the block

    @property
    def NV(self) -> int:
        return self.NR * self.RL


@cuda.jit(device=True, inline=True)
def qf(w, k, off):
    """Byte k of w as the exact float (byte - off + 2^23) - 2^23 (off folded into the subtraction)."""
    return as_f32(prmt(w, uint32(MAGIC_BITS), uint32(SEL + k))) - off


@cuda.jit(device=True, inline=True)
def _runs2(lo, hi, t, q, r, off):
    """Word t of a 16-byte chunk, as 4 values per byte lane in lo (run 0) and hi (run 1, 16 columns on)."""
    for k in range(4):
        q[r, 4 * t + k] = qf(lo, k, off)
        q[r, 16 + 4 * t + k] = qf(hi, k, off)


@cuda.jit(device=True, inline=True)
def _ld3(w32, off, raw, p, k):
    """raw[p, k:k+3] = the three aligned words holding the 8 bytes at the even byte offset `off`."""
    a = off >> uint64(2)
    raw[p, k] = w32[a]
    raw[p, k + 1] = w32[a + uint64(1)]
    raw[p, k + 2] = w32[a + uint64(2)]


@cuda.jit(device=True, inline=True)
def _j2(raw, p, k, sel):
    """The 8 bytes loaded by `_ld3` as two uint32 (sel: 0x3210 if the offset was 4-aligned, else 0x5432)."""
    return prmt(raw[p, k], raw[p, k + 1], sel), prmt(raw[p, k + 1], raw[p, k + 2], sel)


@cuda.jit(device=True, inline=True)
def shift_sel(base, s0):
    """prmt selector joining two words at a byte shift of base & 3 (s0: the selector at shift 0)."""
    return uint32(s0) + uint32(base & uint64(3)) * uint32(0x1111)


@cuda.jit(device=True, inline=True)
def ldn(w32, off, raw, p, k, n):
    """raw[p, k:k+n] = the n aligned words from the one holding byte `off` (any alignment)."""
    a = off >> uint64(2)
    raw[p, k] = w32[a]                                  # written out: a loop over the argument n keeps
    raw[p, k + 1] = w32[a + uint64(1)]                  # `raw` in local memory (not unrolled before SROA)
    if n > 2:
        raw[p, k + 2] = w32[a + uint64(2)]
    if n > 3:
        raw[p, k + 3] = w32[a + uint64(3)]
    if n > 4:
        raw[p, k + 4] = w32[a + uint64(4)]


@cuda.jit(device=True, inline=True)
def jn(raw, p, k, off, t):
    """Word t of the bytes at `off` loaded by `ldn(.., off, raw, p, k, ..)` (a funnel by off & 3 bytes)."""
    return prmt(raw[p, k + t], raw[p, k + t + 1], shift_sel(off, 0x3210))


@cuda.jit(device=True, inline=True)
def _lut4(n4, t0, t1, t2, t3):
    """Four table lookups at once: byte i of n4 (a nibble) -> byte n of the 16-byte table t0..t3."""
    y = n4 | (n4 >> uint32(4))
    sel = (y & uint32(0xFF)) | ((y >> uint32(8)) & uint32(0xFF00))     # the nibbles packed: a prmt selector
    s7 = sel & uint32(0x7777)
    m = ((n4 >> uint32(3)) & uint32(0x01010101)) * uint32(0xFF)        # 0xFF where the nibble is >= 8
    return (prmt(t0, t1, s7) & ~m) | (prmt(t2, t3, s7) & m)


@cuda.jit(device=True, inline=True)
def _spread4(x):
    """Bits 0..3 of x to bit 4 of bytes 0..3 (the fifth bit of four 4-bit weights)."""
    return ((x & uint32(15)) * uint32(0x00204081) & uint32(0x01010101)) << uint32(4)


# A type is two device functions, split so that a kernel can put the loads of several rows in flight
# before it decodes any (memory latency, not arithmetic, is what bounds a GEMV):
#   ld(w32, w16, base, c, raw, rf, p)      loads only: raw[p, :NW] (uint32 words), rf[p] (a float16 scale)
#   dc(raw, rf, p, base, c, q, sa, sb, r, tb)  decode: q[r, :NV] and sa / sb[r, :NR] from them

# ------------------------------------------------------------------ Q4_K: 144 B = d|dmin|scales[12] + qs[128]
# unit c (0..7): qs bytes 16c..16c+15 = group g = c/2, half c%2: low nibbles -> sub-block 2g, columns
# 64g + 16(c%2) + 0..15; high nibbles -> sub-block 2g+1, 32 columns further.
@cuda.jit(device=True, inline=True)
def col_q4_k(c, j):
    return 64 * (c >> 1) + 16 * (c & 1) + 32 * j


@cuda.jit(device=True, inline=True)
def ld_q4_k(w32, w16, base, c, raw, rf, p):
    i = base >> uint64(2)
    raw[p, 0], raw[p, 1], raw[p, 2], raw[p, 3] = ld4u(w32, i)
    raw[p, 4], raw[p, 5], raw[p, 6], raw[p, 7] = ld4u(w32, i + uint64(4 + 4 * c))


@cuda.jit(device=True, inline=True)
def k4_scales(raw, p, c, sa, sb, r):
    """Q4_K / Q5_K header (raw[p, 0:4] = d|dmin, scales[12]) -> the two runs' sa = d*sc, sb = -dmin*m."""
    h0 = raw[p, 0]
    d = h2f(h0)
    dmin = h2f(h0 >> uint32(16))
    g = c >> 1
    sc0, m0 = scale_min_k4(raw[p, 1], raw[p, 2], raw[p, 3], 2 * g)
    sc1, m1 = scale_min_k4(raw[p, 1], raw[p, 2], raw[p, 3], 2 * g + 1)
    sa[r, 0] = d * u2f(sc0)
    sb[r, 0] = -(dmin * u2f(m0))
    sa[r, 1] = d * u2f(sc1)
    sb[r, 1] = -(dmin * u2f(m1))


@cuda.jit(device=True, inline=True)
def dc_q4_k(raw, rf, p, base, c, q, sa, sb, r, tb):
    k4_scales(raw, p, c, sa, sb, r)
    for t in range(4):
        w = raw[p, 4 + t]
        lo = w & uint32(LO4)
        hi = (w >> uint32(4)) & uint32(LO4)
        _runs2(lo, hi, t, q, r, float32(MAGIC))


# ------------------------------------------------------------------ Q6_K: 210 B = ql[128] | qh[64] | scales[16] | d
# unit c (0..7): half h = c/4, l0 = 8(c%4): ql[64h + l0 ..+8] (A lo, C hi), ql[64h + 32 + l0 ..+8] (B lo,
# D hi), qh[32h + l0 ..+8] (bits 0-1 A, 2-3 B, 4-5 C, 6-7 D); run j at column 128h + l0 + 32j,
# scale scales[8h + l0/16 + 2j]; weight = d * scale * (q - 32).
@cuda.jit(device=True, inline=True)
def col_q6_k(c, j):
    return 128 * (c >> 2) + 8 * (c & 3) + 32 * j


@cuda.jit(device=True, inline=True)
def ld_q6_k(w32, w16, base, c, raw, rf, p):
    h = c >> 2
    l0 = 8 * (c & 3)
    _ld3(w32, base + uint64(64 * h + l0), raw, p, 0)
    _ld3(w32, base + uint64(64 * h + 32 + l0), raw, p, 3)
    _ld3(w32, base + uint64(128 + 32 * h + l0), raw, p, 6)
    _ld3(w32, base + uint64(192 + 8 * h), raw, p, 9)
    rf[p] = hf(w16, base, 208)


@cuda.jit(device=True, inline=True)
def q6_codes(qa, qb, qh):
    """Four columns of each of the unit's runs A..D as 6-bit codes, one per byte, from the ql words of A/C
    (qa) and B/D (qb) and the qh word."""
    vA = (qa & uint32(LO4)) | ((qh << uint32(4)) & uint32(0x30303030))
    vB = (qb & uint32(LO4)) | ((qh << uint32(2)) & uint32(0x30303030))
    vC = ((qa >> uint32(4)) & uint32(LO4)) | (qh & uint32(0x30303030))
    vD = ((qb >> uint32(4)) & uint32(LO4)) | ((qh >> uint32(2)) & uint32(0x30303030))
    return vA, vB, vC, vD


@cuda.jit(device=True, inline=True)
def q6_head(raw, p, base, c, sa, r, d, icvt):
    """The words loaded by `ld_q6_k` joined (ql of runs A/C, of B/D, qh: two words each) and the four runs'
    scales: sa[r, j] = d * scales[..] (the int8 scale to float by an integer convert if icvt, else by the
    exponent trick: the same value)."""
    sel = shift_sel(base, 0x3210)
    a0, a1 = _j2(raw, p, 0, sel)
    b0, b1 = _j2(raw, p, 3, sel)
    e0, e1 = _j2(raw, p, 6, sel)
    s0, s1 = _j2(raw, p, 9, sel)
    i0 = (c & 3) >> 1                                   # l0 / 16
    for j in range(4):
        sw = s0 if j < 2 else s1
        sbyte = (sw >> uint32(8 * (i0 + 2 * (j & 1)))) & uint32(255)
        if icvt:
            sa[r, j] = d * float32(int32(sbyte ^ uint32(128)) - int32(128))
        else:
            sa[r, j] = d * (u2f(sbyte ^ uint32(128)) - float32(128.0))
    return a0, a1, b0, b1, e0, e1


@cuda.jit(device=True, inline=True)
def dc_q6_k(raw, rf, p, base, c, q, sa, sb, r, tb):
    a0, a1, b0, b1, e0, e1 = q6_head(raw, p, base, c, sa, r, rf[p], False)
    off = float32(MAGIC + 32.0)
    for t in range(2):
        vA, vB, vC, vD = q6_codes(a0 if t == 0 else a1, b0 if t == 0 else b1, e0 if t == 0 else e1)
        for k in range(4):
            q[r, 4 * t + k] = qf(vA, k, off)
            q[r, 8 + 4 * t + k] = qf(vB, k, off)
            q[r, 16 + 4 * t + k] = qf(vC, k, off)
            q[r, 24 + 4 * t + k] = qf(vD, k, off)


# ------------------------------------------------------------------ Q8_0: 34 B = d | qs[32] int8 (one unit)
@cuda.jit(device=True, inline=True)
def col_one(c, j):
    return 16 * j


@cuda.jit(device=True, inline=True)
def col_q8_0(c, j):
    return 0


@cuda.jit(device=True, inline=True)
def ld_q8_0(w32, w16, base, c, raw, rf, p):
    a = base >> uint64(2)
    for t in range(9):
        raw[p, t] = w32[a + uint64(t)]
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def dc_q8_0(raw, rf, p, base, c, q, sa, sb, r, tb):
    sel = shift_sel(base, 0x5432)                            # qs at base + 2: 2 or 4 bytes into the words
    sa[r, 0] = rf[p]
    off = float32(MAGIC + 128.0)
    for t in range(8):
        v = prmt(raw[p, t], raw[p, t + 1], sel) ^ uint32(0x80808080)        # int8 + 128, as unsigned bytes
        for k in range(4):
            q[r, 4 * t + k] = qf(v, k, off)


# ------------------------------------------------------------------ Q4_0: 18 B = d | qs[16]; lo -> 0..15, hi -> 16..31
@cuda.jit(device=True, inline=True)
def ld_q4_0(w32, w16, base, c, raw, rf, p):
    a = base >> uint64(2)
    for t in range(5):
        raw[p, t] = w32[a + uint64(t)]
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def dc_q4_0(raw, rf, p, base, c, q, sa, sb, r, tb):
    sel = shift_sel(base, 0x5432)
    sa[r, 0] = rf[p]
    sa[r, 1] = rf[p]
    off = float32(MAGIC + 8.0)
    for t in range(4):
        v = prmt(raw[p, t], raw[p, t + 1], sel)
        lo = v & uint32(LO4)
        hi = (v >> uint32(4)) & uint32(LO4)
        _runs2(lo, hi, t, q, r, off)


# ------------------------------------------------------------------ Q5_K: 176 B = d|dmin|scales[12] | qh[32] | qs[128]
# units as Q4_K; qs chunk at 48 + 16c, qh bytes 16(c%2) ..+16 at 16 + 16(c%2): the low-nibble weight of byte l
# gets bit 2g of qh[l] as its fifth bit, the high-nibble weight bit 2g+1.
@cuda.jit(device=True, inline=True)
def ld_q5_k(w32, w16, base, c, raw, rf, p):
    i = base >> uint64(2)
    raw[p, 0], raw[p, 1], raw[p, 2], raw[p, 3] = ld4u(w32, i)
    raw[p, 4], raw[p, 5], raw[p, 6], raw[p, 7] = ld4u(w32, i + uint64(4 + 4 * (c & 1)))
    raw[p, 8], raw[p, 9], raw[p, 10], raw[p, 11] = ld4u(w32, i + uint64(12 + 4 * c))


@cuda.jit(device=True, inline=True)
def dc_q5_k(raw, rf, p, base, c, q, sa, sb, r, tb):
    k4_scales(raw, p, c, sa, sb, r)
    s0 = uint32(2 * (c >> 1))
    for t in range(4):
        w = raw[p, 8 + t]
        qh = raw[p, 4 + t]
        lo = (w & uint32(LO4)) | (((qh >> s0) & uint32(0x01010101)) << uint32(4))
        hi = ((w >> uint32(4)) & uint32(LO4)) | (((qh >> (s0 + uint32(1))) & uint32(0x01010101)) << uint32(4))
        _runs2(lo, hi, t, q, r, float32(MAGIC))


# ------------------------------------------------------------------ Q2_K: 84 B = scales[16] | qs[64] | d | dmin
# unit c: h = c/4, l0 = 8(c%4): qs[32h + l0 ..+8], bits 2j -> column 128h + 32j + l0 + i (run j, as Q6_K);
# run j's sub-block 8h + 2j + l0/16: scale byte = (sc & 15) | (min << 4); w = d sc q - dmin min.
@cuda.jit(device=True, inline=True)
def ld_q2_k(w32, w16, base, c, raw, rf, p):
    h = c >> 2
    a = base >> uint64(2)
    o = uint64((16 + 32 * h + 8 * (c & 3)) >> 2)
    raw[p, 0] = w32[a + o]
    raw[p, 1] = w32[a + o + uint64(1)]
    raw[p, 2] = w32[a + uint64(2 * h)]
    raw[p, 3] = w32[a + uint64(2 * h + 1)]
    raw[p, 4] = w32[a + uint64(20)]


@cuda.jit(device=True, inline=True)
def dc_q2_k(raw, rf, p, base, c, q, sa, sb, r, tb):
    dd = raw[p, 4]
    d = h2f(dd)
    dmin = h2f(dd >> uint32(16))
    i0 = (c & 3) >> 1
    for j in range(4):
        sw = raw[p, 2] if j < 2 else raw[p, 3]
        scb = (sw >> uint32(8 * (i0 + 2 * (j & 1)))) & uint32(255)
        sa[r, j] = d * u2f(scb & uint32(15))
        sb[r, j] = -(dmin * u2f(scb >> uint32(4)))
        for t in range(2):
            v = (raw[p, t] >> uint32(2 * j)) & uint32(0x03030303)
            for k in range(4):
                q[r, 8 * j + 4 * t + k] = qf(v, k, float32(MAGIC))


# ------------------------------------------------------------------ Q3_K: 110 B = hmask[32] | qs[64] | scales[12] | d
# unit and runs as Q2_K; the third bit of weight (h, j, l) is bit 4h + j of hmask[l]; q = 2 bits | bit << 2,
# w = d * (scale - 32) * (q - 4); scale i = 8h + 2j + l0/16: low 4 bits from byte i % 8 (its high nibble
# when i >= 8), high 2 bits from byte 8 + i % 4 at bit 2 (i / 4).
@cuda.jit(device=True, inline=True)
def ld_q3_k(w32, w16, base, c, raw, rf, p):
    h = c >> 2
    l0 = 8 * (c & 3)
    ldn(w32, base + uint64(32 + 32 * h + l0), raw, p, 0, 3)
    ldn(w32, base + uint64(l0), raw, p, 3, 3)
    ldn(w32, base + uint64(96), raw, p, 6, 4)
    rf[p] = hf(w16, base, 108)


@cuda.jit(device=True, inline=True)
def dc_q3_k(raw, rf, p, base, c, q, sa, sb, r, tb):
    h = c >> 2
    i0 = (c & 3) >> 1
    b96 = base + uint64(96)
    s0 = jn(raw, p, 6, b96, 0)
    s1 = jn(raw, p, 6, b96, 1)
    s2 = jn(raw, p, 6, b96, 2)
    d = rf[p]
    ob = base + uint64(32 + 8 * (c & 3))
    oh = base + uint64(8 * (c & 3))
    for j in range(4):
        i = 2 * j + i0                                  # scale index within this half's 8
        lo = (b12(s0, s1, s2, i) >> uint32(4 * h)) & uint32(15)
        hi = (b12(s0, s1, s2, 8 + (i & 3)) >> uint32(2 * (2 * h + (i >> 2)))) & uint32(3)
        sa[r, j] = d * (u2f(lo | (hi << uint32(4))) - float32(32.0))
        for t in range(2):
            qs = jn(raw, p, 0, ob, t)
            hm = jn(raw, p, 3, oh, t)
            v = ((qs >> uint32(2 * j)) & uint32(0x03030303)) | (((hm >> uint32(4 * h + j)) & uint32(0x01010101)) << uint32(2))
            for k in range(4):
                q[r, 8 * j + 4 * t + k] = qf(v, k, float32(MAGIC + 4.0))


@cuda.jit(device=True, inline=True)
def col_iq4_xs(c, j):
    return 32 * c + 16 * j


# ------------------------------------------------------------------ 16-value tables (IQ4_NL / IQ4_XS, MXFP4) as int8 bytes
def _table_words(vals) -> tuple[int, int, int, int]:
    b = np.asarray(vals, dtype=np.int64).astype(np.int8).view(np.uint8)
    w = b.view(np.uint32)
    return int(w[0]), int(w[1]), int(w[2]), int(w[3])


def _kvalues():
    from gguf import quants as gq
    return _table_words(gq.IQ4_NL.kvalues), _table_words(gq.MXFP4.kvalues)


(_N0, _N1, _N2, _N3), (_M0, _M1, _M2, _M3) = _kvalues()


@cuda.jit(device=True, inline=True)
def _nl(v):
    """Four IQ4_NL nibbles (one per byte) -> their int8 values + 128, as unsigned bytes."""
    return _lut4(v, uint32(_N0), uint32(_N1), uint32(_N2), uint32(_N3)) ^ uint32(0x80808080)


@cuda.jit(device=True, inline=True)
def _fp4(v):
    """Four MXFP4 nibbles -> their (doubled) values + 128, as unsigned bytes."""
    return _lut4(v, uint32(_M0), uint32(_M1), uint32(_M2), uint32(_M3)) ^ uint32(0x80808080)


# ------------------------------------------------------------------ IQ4_XS: 136 B = d | scales_h u16 | scales_l[4] | qs[128]
# unit c = sub-block ib (32 weights): qs[16c ..+16] at 8 + 16c, low nibbles -> columns 32c + 0..15, high -> +16;
# w = d * (ls - 32) * kvalues[nibble], ls = 4 bits of scales_l[c/2] | 2 bits of scales_h << 4.
@cuda.jit(device=True, inline=True)
def ld_iq4_xs(w32, w16, base, c, raw, rf, p):
    a = base >> uint64(2)
    raw[p, 0] = w32[a]
    raw[p, 1] = w32[a + uint64(1)]
    for t in range(4):
        raw[p, 2 + t] = w32[a + uint64(2 + 4 * c + t)]


@cuda.jit(device=True, inline=True)
def dc_iq4_xs(raw, rf, p, base, c, q, sa, sb, r, tb):
    h0 = raw[p, 0]
    d = h2f(h0)
    ls = ((raw[p, 1] >> uint32(8 * (c >> 1) + 4 * (c & 1))) & uint32(15)) | \
        (((h0 >> uint32(16 + 2 * c)) & uint32(3)) << uint32(4))
    dl = d * (u2f(ls) - float32(32.0))
    sa[r, 0] = dl
    sa[r, 1] = dl
    off = float32(MAGIC + 128.0)
    for t in range(4):
        w = raw[p, 2 + t]
        lo = _nl(w & uint32(LO4))
        hi = _nl((w >> uint32(4)) & uint32(LO4))
        _runs2(lo, hi, t, q, r, off)


# ------------------------------------------------------------------ 32-weight blocks with nibbles: lo -> 0..15, hi -> 16..31
#   IQ4_NL (18 B): d | qs[16]             w = d * kvalues[n]
#   MXFP4  (17 B): e8m0 | qs[16]          w = 2^(e-128) * kvalues_mxfp4[n]   (kvalues doubled, e8m0_half)
#   Q4_1   (20 B): d | m | qs[16]         w = d q + m
#   Q5_0   (22 B): d | qh u32 | qs[16]    q = n | (bit j of qh) << 4 (j = column), w = d (q - 16)
#   Q5_1   (24 B): d | m | qh | qs[16]    w = d q + m
@cuda.jit(device=True, inline=True)
def ld_iq4_nl(w32, w16, base, c, raw, rf, p):
    ldn(w32, base + uint64(2), raw, p, 0, 5)
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def _nibble_runs(raw, p, k0, off, q, r, lut, qoff):
    """The 16 qs bytes at `off` (loaded at raw[p, k0:]): low nibbles -> q[r, 0:16], high -> q[r, 16:32]."""
    for t in range(4):
        w = jn(raw, p, k0, off, t)
        lo = w & uint32(LO4)
        hi = (w >> uint32(4)) & uint32(LO4)
        if lut == 1:
            lo = _nl(lo)
            hi = _nl(hi)
        elif lut == 2:
            lo = _fp4(lo)
            hi = _fp4(hi)
        _runs2(lo, hi, t, q, r, qoff)


@cuda.jit(device=True, inline=True)
def dc_iq4_nl(raw, rf, p, base, c, q, sa, sb, r, tb):
    sa[r, 0] = rf[p]
    sa[r, 1] = rf[p]
    _nibble_runs(raw, p, 0, base + uint64(2), q, r, 1, float32(MAGIC + 128.0))


@cuda.jit(device=True, inline=True)
def ld_mxfp4(w32, w16, base, c, raw, rf, p):
    ldn(w32, base + uint64(1), raw, p, 0, 5)
    raw[p, 5] = w32[base >> uint64(2)]


@cuda.jit(device=True, inline=True)
def dc_mxfp4(raw, rf, p, base, c, q, sa, sb, r, tb):
    e = (raw[p, 5] >> uint32(8 * (base & uint64(3)))) & uint32(255)
    dh = e8m0_half(e)
    sa[r, 0] = dh
    sa[r, 1] = dh
    _nibble_runs(raw, p, 0, base + uint64(1), q, r, 2, float32(MAGIC + 128.0))


@cuda.jit(device=True, inline=True)
def ld_q4_1(w32, w16, base, c, raw, rf, p):
    a = base >> uint64(2)
    for t in range(5):
        raw[p, t] = w32[a + uint64(t)]


@cuda.jit(device=True, inline=True)
def _dm(raw, p, k, sa, sb, r):
    """d | m halves of word raw[p, k] -> sa = d, sb = m for both runs."""
    dm = raw[p, k]
    d = h2f(dm)
    m = h2f(dm >> uint32(16))
    sa[r, 0] = d
    sa[r, 1] = d
    sb[r, 0] = m
    sb[r, 1] = m


@cuda.jit(device=True, inline=True)
def dc_q4_1(raw, rf, p, base, c, q, sa, sb, r, tb):
    _dm(raw, p, 0, sa, sb, r)
    for t in range(4):
        w = raw[p, 1 + t]
        lo = w & uint32(LO4)
        hi = (w >> uint32(4)) & uint32(LO4)
        _runs2(lo, hi, t, q, r, float32(MAGIC))


@cuda.jit(device=True, inline=True)
def _q5_runs(w, qh, t, q, r, qoff):
    """qs word t with its fifth bits from qh (bit 4t + k for the low nibbles, 16 + 4t + k for the high)."""
    lo = (w & uint32(LO4)) | _spread4(qh >> uint32(4 * t))
    hi = ((w >> uint32(4)) & uint32(LO4)) | _spread4(qh >> uint32(16 + 4 * t))
    _runs2(lo, hi, t, q, r, qoff)


@cuda.jit(device=True, inline=True)
def ld_q5_0(w32, w16, base, c, raw, rf, p):
    ldn(w32, base + uint64(2), raw, p, 0, 2)
    ldn(w32, base + uint64(6), raw, p, 2, 5)
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def dc_q5_0(raw, rf, p, base, c, q, sa, sb, r, tb):
    sa[r, 0] = rf[p]
    sa[r, 1] = rf[p]
    qh = jn(raw, p, 0, base + uint64(2), 0)
    for t in range(4):
        _q5_runs(jn(raw, p, 2, base + uint64(6), t), qh, t, q, r, float32(MAGIC + 16.0))


@cuda.jit(device=True, inline=True)
def ld_q5_1(w32, w16, base, c, raw, rf, p):
    a = base >> uint64(2)
    for t in range(6):
        raw[p, t] = w32[a + uint64(t)]


@cuda.jit(device=True, inline=True)
def dc_q5_1(raw, rf, p, base, c, q, sa, sb, r, tb):
    _dm(raw, p, 0, sa, sb, r)
    for t in range(4):
        _q5_runs(raw[p, 2 + t], raw[p, 1], t, q, r, float32(MAGIC))


T = GGMLType
BASE = {
    T.Q4_K: FSpec(T.Q4_K, 256, 144, 8, 2, 16, True, True, 8, 8, 4, ld_q4_k, dc_q4_k, col_q4_k),
    T.Q6_K: FSpec(T.Q6_K, 256, 210, 8, 4, 8, False, False, 12, 8, 4, ld_q6_k, dc_q6_k, col_q6_k),
    T.Q8_0: FSpec(T.Q8_0, 32, 34, 1, 1, 32, False, False, 9, 8, 4, ld_q8_0, dc_q8_0, col_q8_0),
    T.Q4_0: FSpec(T.Q4_0, 32, 18, 1, 2, 16, False, False, 5, 8, 4, ld_q4_0, dc_q4_0, col_one),
    T.Q5_K: FSpec(T.Q5_K, 256, 176, 8, 2, 16, True, True, 12, 4, 2, ld_q5_k, dc_q5_k, col_q4_k),
    T.Q2_K: FSpec(T.Q2_K, 256, 84, 8, 4, 8, True, False, 5, 8, 4, ld_q2_k, dc_q2_k, col_q6_k),
    T.Q3_K: FSpec(T.Q3_K, 256, 110, 8, 4, 8, False, False, 10, 4, 2, ld_q3_k, dc_q3_k, col_q6_k),
    T.IQ4_XS: FSpec(T.IQ4_XS, 256, 136, 8, 2, 16, False, False, 6, 4, 2, ld_iq4_xs, dc_iq4_xs, col_iq4_xs),
    T.IQ4_NL: FSpec(T.IQ4_NL, 32, 18, 1, 2, 16, False, False, 6, 4, 2, ld_iq4_nl, dc_iq4_nl, col_one),
    T.MXFP4: FSpec(T.MXFP4, 32, 17, 1, 2, 16, False, False, 6, 4, 2, ld_mxfp4, dc_mxfp4, col_one),
    T.Q4_1: FSpec(T.Q4_1, 32, 20, 1, 2, 16, True, False, 5, 8, 4, ld_q4_1, dc_q4_1, col_one),
    T.Q5_0: FSpec(T.Q5_0, 32, 22, 1, 2, 16, False, False, 7, 4, 4, ld_q5_0, dc_q5_0, col_one),
    T.Q5_1: FSpec(T.Q5_1, 32, 24, 1, 2, 16, True, False, 6, 8, 4, ld_q5_1, dc_q5_1, col_one),
}

