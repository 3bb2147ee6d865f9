"""Fast warp GEMV for the main types (Q4_K, Q6_K, Q8_0, Q4_0): same math and signature as `gemv.gemv_kernel`.

    y[out(j), o] = sc[e] * (x[tok(j)] . W_e[o])     over the groups of a `GroupTable` (dense = one group)

What differs from the generic kernel (`gemv.py`), all to cut instructions and loads per weight:
- A lane takes a *unit* of 32 weights (a quarter-group of a K-quant block, a whole Q8_0 / Q4_0 block):
  per-block headers (scales, mins) are decoded once per 32 weights, not per 8 or 16.
- Weight bytes and activations come in 128-bit loads (`vec.ld4u`, `vec.ld4f`) where the layout is
  16-byte aligned (Q4_K), in aligned 32-bit words joined by `prmt` where it is not (Q6_K, Q8_0, Q4_0:
  blocks of 210 / 34 / 18 bytes).
- A byte q becomes the float 2^23 + q by one `prmt` under the exponent byte 0x4B, then one subtraction
  (the type's offset folded in: 2^23 + 32 for Q6_K, 2^23 + 8 for Q4_0, 2^23 + 128 for int8): exact.
- The scale is applied once per run: a * sum(q * x) (+ b * sum(x) for the K-quant mins), the integer
  weights q multiplied as exact floats. This reorders float32 sums against the oracle
  (dequantize, then dot), within the kernels' tolerance (relative RMS <= 1e-5).
- RW rows per warp share each activation load; KS warps of a block split K; NT tokens per pass.

A type's decoder (`ld` then `dc`, below) fills, for unit c of the block at byte `base`:
    q[r, j*RL + k]   the integer weight (as an exact float) of column  col(c, j) + k,   j < NR, k < RL
    sa[r, j], sb[r, j]   the run's weight = sa * q + sb   (sb only where the type has mins: HASB)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from numba import cuda, float32, int32, uint32, uint64

from ..formats import GGMLType
from ._dev import MAGIC, MAGIC_BITS, as_f32, hf, silu, u2f, warp_sum
from .decoders import _scale_min_k4
from .vec import h2f, ld4f, ld4u, prmt

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
    ld: object        # loads of one unit (see below)
    dc: object        # decode of one unit from its loaded words
    col: object       # col(c, j): first column of run j of unit c, relative to the block

    @property
    def NV(self) -> int:
        return self.NR * self.RL


@cuda.jit(device=True, inline=True)
def _qf(w, k, off):
    """Byte k of w as the exact float (byte - off + 2^23) - 2^23 (off folded into the subtraction)."""
    return as_f32(prmt(w, uint32(MAGIC_BITS), uint32(SEL + k))) - off


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
def _sel(base, s0):
    """prmt selector joining two words at a byte shift of base & 2 (s0: the selector at shift 0)."""
    return uint32(s0) + uint32(base & uint64(2)) * uint32(0x1111)


# A type is two device functions, split so that a kernel can put the loads of several rows in flight
# before it decodes any (memory latency, not arithmetic, is what bounds a GEMV):
#   ld(w32, w16, base, c, raw, rf, p)      loads only: raw[p, :NW] (uint32 words), rf[p] (a float16 scale)
#   dc(raw, rf, p, base, c, q, sa, sb, r)  decode: q[r, :NV] and sa / sb[r, :NR] from them

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
def dc_q4_k(raw, rf, p, base, c, q, sa, sb, r):
    h0 = raw[p, 0]
    d = h2f(h0)
    dmin = h2f(h0 >> uint32(16))
    g = c >> 1
    sc0, m0 = _scale_min_k4(raw[p, 1], raw[p, 2], raw[p, 3], 2 * g)
    sc1, m1 = _scale_min_k4(raw[p, 1], raw[p, 2], raw[p, 3], 2 * g + 1)
    sa[r, 0] = d * u2f(sc0)
    sb[r, 0] = -(dmin * u2f(m0))
    sa[r, 1] = d * u2f(sc1)
    sb[r, 1] = -(dmin * u2f(m1))
    for t in range(4):
        w = raw[p, 4 + t]
        lo = w & uint32(LO4)
        hi = (w >> uint32(4)) & uint32(LO4)
        for k in range(4):
            q[r, 4 * t + k] = _qf(lo, k, float32(MAGIC))
            q[r, 16 + 4 * t + k] = _qf(hi, k, float32(MAGIC))


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
def dc_q6_k(raw, rf, p, base, c, q, sa, sb, r):
    sel = _sel(base, 0x3210)
    a0, a1 = _j2(raw, p, 0, sel)
    b0, b1 = _j2(raw, p, 3, sel)
    e0, e1 = _j2(raw, p, 6, sel)
    s0, s1 = _j2(raw, p, 9, sel)
    d = rf[p]
    i0 = (c & 3) >> 1                                   # l0 / 16
    for j in range(4):
        sw = s0 if j < 2 else s1
        sbyte = (sw >> uint32(8 * (i0 + 2 * (j & 1)))) & uint32(255)
        sa[r, j] = d * (u2f(sbyte ^ uint32(128)) - float32(128.0))
    off = float32(MAGIC + 32.0)
    for t in range(2):
        qa = a0 if t == 0 else a1
        qb = b0 if t == 0 else b1
        qh = e0 if t == 0 else e1
        vA = (qa & uint32(LO4)) | ((qh << uint32(4)) & uint32(0x30303030))
        vB = (qb & uint32(LO4)) | ((qh << uint32(2)) & uint32(0x30303030))
        vC = ((qa >> uint32(4)) & uint32(LO4)) | (qh & uint32(0x30303030))
        vD = ((qb >> uint32(4)) & uint32(LO4)) | ((qh >> uint32(2)) & uint32(0x30303030))
        for k in range(4):
            q[r, 4 * t + k] = _qf(vA, k, off)
            q[r, 8 + 4 * t + k] = _qf(vB, k, off)
            q[r, 16 + 4 * t + k] = _qf(vC, k, off)
            q[r, 24 + 4 * t + k] = _qf(vD, k, off)


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
def dc_q8_0(raw, rf, p, base, c, q, sa, sb, r):
    sel = _sel(base, 0x5432)                            # qs at base + 2: 2 or 4 bytes into the words
    sa[r, 0] = rf[p]
    off = float32(MAGIC + 128.0)
    for t in range(8):
        v = prmt(raw[p, t], raw[p, t + 1], sel) ^ uint32(0x80808080)        # int8 + 128, as unsigned bytes
        for k in range(4):
            q[r, 4 * t + k] = _qf(v, k, off)


# ------------------------------------------------------------------ Q4_0: 18 B = d | qs[16]; lo -> 0..15, hi -> 16..31
@cuda.jit(device=True, inline=True)
def ld_q4_0(w32, w16, base, c, raw, rf, p):
    a = base >> uint64(2)
    for t in range(5):
        raw[p, t] = w32[a + uint64(t)]
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def dc_q4_0(raw, rf, p, base, c, q, sa, sb, r):
    sel = _sel(base, 0x5432)
    sa[r, 0] = rf[p]
    sa[r, 1] = rf[p]
    off = float32(MAGIC + 8.0)
    for t in range(4):
        v = prmt(raw[p, t], raw[p, t + 1], sel)
        lo = v & uint32(LO4)
        hi = (v >> uint32(4)) & uint32(LO4)
        for k in range(4):
            q[r, 4 * t + k] = _qf(lo, k, off)
            q[r, 16 + 4 * t + k] = _qf(hi, k, off)


T = GGMLType
FSPECS = {
    T.Q4_K: FSpec(T.Q4_K, 256, 144, 8, 2, 16, True, True, 8, ld_q4_k, dc_q4_k, col_q4_k),
    T.Q6_K: FSpec(T.Q6_K, 256, 210, 8, 4, 8, False, False, 12, ld_q6_k, dc_q6_k, col_q6_k),
    T.Q8_0: FSpec(T.Q8_0, 32, 34, 1, 1, 32, False, False, 9, ld_q8_0, dc_q8_0, col_q8_0),
    T.Q4_0: FSpec(T.Q4_0, 32, 18, 1, 2, 16, False, False, 5, ld_q4_0, dc_q4_0, col_one),
}


def fast_supported(t: GGMLType, rowb: int, estride: int) -> bool:
    s = FSPECS.get(t)
    return s is not None and (not s.ALIGN16 or (rowb % 16 == 0 and estride % 16 == 0))


@functools.lru_cache(maxsize=None)
def fgemv_kernel(t, NT: int = 1, RW: int = 2, KS: int = 4, glu: bool = False, rwt: bool = False):
    """Grouped warp GEMV: a block of KS warps computes RW rows of one group (grid (ceil(O/RW), GMAX)),
    the warps splitting the row's units, lanes striding over them. Same arguments as `gemv.gemv_kernel`
    (the lookup table argument `tb` is unused: none of these types has one)."""
    s = FSPECS[t]
    ld, dc, col, BS, TS, UPB, NR, RL, NV, NW, HASB = s.ld, s.dc, s.col, s.BS, s.TS, s.UPB, s.NR, s.RL, s.NV, s.NW, s.HASB
    NTH = 32 * KS
    RU = RW if glu else 1
    GLU, RWT = glu, rwt

    @cuda.jit(device=True, inline=True)
    def dot_rows(q, sa, sb, xv, xs, acc, tt, NRW):
        for r in range(NRW):
            a = float32(0.0)
            for j in range(NR):
                dj = float32(0.0)
                for k in range(RL):
                    dj = cuda.fma(q[r, j * RL + k], xv[j * RL + k], dj)
                a = cuda.fma(sa[r, j], dj, a)
                if HASB:
                    a = cuda.fma(sb[r, j], xs[j], a)
            acc[r, tt] += a

    @cuda.jit
    def fgemv(w32, w16, u32, u16, tb, x, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP, E):
        red = cuda.shared.array((KS, RW, NT), float32)
        redu = cuda.shared.array((KS, RU, NT), float32)
        tid = cuda.threadIdx.x
        g = cuda.blockIdx.y
        if g >= grp[0]:
            return
        row0 = cuda.blockIdx.x * RW
        if row0 >= O:
            return
        warp = tid // 32
        lane = tid % 32
        e = grp[1 + g]
        j0 = grp[1 + GMAX + g]
        j1 = grp[2 + GMAX + g]
        ebase = uint64(e) * uint64(estride)
        nunits = (I // BS) * UPB
        q = cuda.local.array((RW, NV), float32)
        sa = cuda.local.array((RW, NR), float32)
        sb = cuda.local.array((RW, NR), float32)
        qu = cuda.local.array((RU, NV), float32)
        sau = cuda.local.array((RU, NR), float32)
        sbu = cuda.local.array((RU, NR), float32)
        raw = cuda.local.array((RW, NW), uint32)
        rf = cuda.local.array(RW, float32)
        rawu = cuda.local.array((RU, NW), uint32)
        rfu = cuda.local.array(RU, float32)
        xv = cuda.local.array(NV, float32)
        xs = cuda.local.array(NR, float32)
        acc = cuda.local.array((RW, NT), float32)
        accu = cuda.local.array((RU, NT), float32)
        xrow = cuda.local.array(NT, int32)
        for c0 in range(j0, j1, NT):
            nt = min(NT, j1 - c0)
            for tt in range(NT):
                xrow[tt] = grp[2 + 2 * GMAX + min(c0 + tt, j1 - 1)]
                for r in range(RW):
                    acc[r, tt] = float32(0.0)
                for r in range(RU):
                    accu[r, tt] = float32(0.0)
            u = warp * 32 + lane
            while u < nunits:
                b = u // UPB
                c = u - b * UPB
                rb0 = ebase + uint64(b) * uint64(TS)
                for r in range(RW):                              # every row's loads in flight, then decode
                    rb = rb0 + uint64(min(row0 + r, O - 1)) * uint64(rowb)
                    ld(w32, w16, rb, c, raw, rf, r)
                    if GLU:
                        ld(u32, u16, rb, c, rawu, rfu, r)
                for r in range(RW):
                    rb = rb0 + uint64(min(row0 + r, O - 1)) * uint64(rowb)
                    dc(raw, rf, r, rb, c, q, sa, sb, r)
                    if GLU:
                        dc(rawu, rfu, r, rb, c, qu, sau, sbu, r)
                for tt in range(NT):
                    if NT == 1 or tt < nt:
                        xo = uint64(xrow[tt]) * uint64(I) + uint64(b * BS)
                        for j in range(NR):
                            cj = uint64(col(c, j))
                            sj = float32(0.0)
                            for k4 in range(RL // 4):
                                v0, v1, v2, v3 = ld4f(x, xo + cj + uint64(4 * k4))
                                xv[j * RL + 4 * k4] = v0
                                xv[j * RL + 4 * k4 + 1] = v1
                                xv[j * RL + 4 * k4 + 2] = v2
                                xv[j * RL + 4 * k4 + 3] = v3
                                if HASB:
                                    sj += (v0 + v1) + (v2 + v3)
                            xs[j] = sj
                        dot_rows(q, sa, sb, xv, xs, acc, tt, RW)
                        if GLU:
                            dot_rows(qu, sau, sbu, xv, xs, accu, tt, RU)
                u += NTH
            for tt in range(NT):
                for r in range(RW):
                    a = warp_sum(acc[r, tt])
                    if lane == 0:
                        red[warp, r, tt] = a
                for r in range(RU):
                    if GLU:
                        a = warp_sum(accu[r, tt])
                        if lane == 0:
                            redu[warp, r, tt] = a
            cuda.syncthreads()
            for i in range(tid, RW * NT, NTH):
                r = i // NT
                tt = i - r * NT
                if tt < nt and row0 + r < O:
                    a = red[0, r, tt]
                    for w in range(1, KS):
                        a += red[w, r, tt]
                    a = a * sc[e]
                    if GLU:
                        uu = redu[0, r, tt]
                        for w in range(1, KS):
                            uu += redu[w, r, tt]
                        a = silu(a) * (uu * sc[E + e])
                    orow = grp[2 + 2 * GMAX + NP + c0 + tt]
                    if RWT:
                        a = a * rw[orow]
                    y[orow, row0 + r] = a
            cuda.syncthreads()
    return fgemv


@functools.lru_cache(maxsize=None)
def fgemv1_kernel(t, RW: int = 8, KS: int = 4, glu: bool = False, rwt: bool = False, P: int = 4, IDM: int = 0):
    """One token per group (decode, and expert dispatch at one token): each lane loads the activations of
    its unit once into registers and runs them against the same unit of RW rows, decoded one row at a
    time, so that the activation traffic is 1/RW of the weights' instead of 4 bytes per weight read.
    The lanes' partial sums live in shared memory, so the row loop need not be unrolled; the loads of P
    rows are issued before any of them is decoded (bytes in flight: what bounds a GEMV).

    IDM = 1 or 2: no group table; `grp` is the expert ids of one token (int32 [NP = A]) and block row g
    multiplies expert grp[g] into output row g, reading activation row 0 (IDM = 1: gate / up) or row g
    (IDM = 2: down, one row per slot). Grid (ceil(O/RW), A): expert dispatch of one token in one launch.
    Grid (ceil(O/RW), GMAX), block 32 * KS; same arguments as `fgemv_kernel`; groups must hold one pair."""
    s = FSPECS[t]
    ld, dc, col, BS, TS, UPB, NR, RL, NV, NW, HASB = s.ld, s.dc, s.col, s.BS, s.TS, s.UPB, s.NR, s.RL, s.NV, s.NW, s.HASB
    NTH = 32 * KS
    GLU, RWT = glu, rwt
    P = max(1, min(P, RW, 4 if glu else P))
    while RW % P:
        P -= 1
    PU = P if glu else 1

    @cuda.jit(device=True, inline=True)
    def dot1(q, sa, sb, xv, xs):
        a = float32(0.0)
        for j in range(NR):
            dj = float32(0.0)
            for k in range(RL):
                dj = cuda.fma(q[0, j * RL + k], xv[j * RL + k], dj)
            a = cuda.fma(sa[0, j], dj, a)
            if HASB:
                a = cuda.fma(sb[0, j], xs[j], a)
        return a

    @cuda.jit
    def fgemv1(w32, w16, u32, u16, tb, x, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP, E):
        red = cuda.shared.array((KS, RW), float32)
        redu = cuda.shared.array((KS, RW), float32)
        acc = cuda.shared.array((KS, RW, 32), float32)         # per-lane partial sums: the row loop
        accu = cuda.shared.array((KS, RW if GLU else 1, 32), float32)   # needs no unrolling (no local memory)
        tid = cuda.threadIdx.x
        g = cuda.blockIdx.y
        row0 = cuda.blockIdx.x * RW
        if row0 >= O:
            return
        if IDM == 0:
            if g >= grp[0]:
                return
            e = grp[1 + g]
            j0 = grp[1 + GMAX + g]
            xr = uint64(grp[2 + 2 * GMAX + j0])
            orow = grp[2 + 2 * GMAX + NP + j0]
        else:
            if g >= NP:
                return
            e = grp[g]
            xr = uint64(0) if IDM == 1 else uint64(g)
            orow = g
        warp = tid // 32
        lane = tid % 32
        ebase = uint64(e) * uint64(estride)
        nunits = (I // BS) * UPB
        q = cuda.local.array((1, NV), float32)
        sa = cuda.local.array((1, NR), float32)
        sb = cuda.local.array((1, NR), float32)
        raw = cuda.local.array((P, NW), uint32)
        rf = cuda.local.array(P, float32)
        rawu = cuda.local.array((PU, NW), uint32)
        rfu = cuda.local.array(PU, float32)
        xv = cuda.local.array(NV, float32)
        xs = cuda.local.array(NR, float32)
        for r in range(RW):
            acc[warp, r, lane] = float32(0.0)
            if GLU:
                accu[warp, r, lane] = float32(0.0)
        u = warp * 32 + lane
        while u < nunits:
            b = u // UPB
            c = u - b * UPB
            xo = xr * uint64(I) + uint64(b * BS)
            for j in range(NR):
                cj = uint64(col(c, j))
                sj = float32(0.0)
                for k4 in range(RL // 4):
                    v0, v1, v2, v3 = ld4f(x, xo + cj + uint64(4 * k4))
                    xv[j * RL + 4 * k4] = v0
                    xv[j * RL + 4 * k4 + 1] = v1
                    xv[j * RL + 4 * k4 + 2] = v2
                    xv[j * RL + 4 * k4 + 3] = v3
                    if HASB:
                        sj += (v0 + v1) + (v2 + v3)
                xs[j] = sj
            rb0 = ebase + uint64(b) * uint64(TS)
            for r0 in range(0, RW, P):
                for p in range(P):
                    rb = rb0 + uint64(min(row0 + r0 + p, O - 1)) * uint64(rowb)
                    ld(w32, w16, rb, c, raw, rf, p)
                    if GLU:
                        ld(u32, u16, rb, c, rawu, rfu, p)
                for p in range(P):
                    rb = rb0 + uint64(min(row0 + r0 + p, O - 1)) * uint64(rowb)
                    dc(raw, rf, p, rb, c, q, sa, sb, 0)
                    acc[warp, r0 + p, lane] += dot1(q, sa, sb, xv, xs)
                    if GLU:
                        dc(rawu, rfu, p, rb, c, q, sa, sb, 0)
                        accu[warp, r0 + p, lane] += dot1(q, sa, sb, xv, xs)
            u += NTH
        for r in range(RW):
            a = warp_sum(acc[warp, r, lane])
            if lane == 0:
                red[warp, r] = a
            if GLU:
                a = warp_sum(accu[warp, r, lane])
                if lane == 0:
                    redu[warp, r] = a
        cuda.syncthreads()
        for r in range(tid, RW, NTH):
            if row0 + r < O:
                a = red[0, r]
                for w in range(1, KS):
                    a += red[w, r]
                a = a * sc[e]
                if GLU:
                    uu = redu[0, r]
                    for w in range(1, KS):
                        uu += redu[w, r]
                    a = silu(a) * (uu * sc[E + e])
                if RWT:
                    a = a * rw[orow]
                y[orow, row0 + r] = a
    return fgemv1


__all__ = ["FSPECS", "fgemv_kernel", "fgemv1_kernel", "fast_supported"]
