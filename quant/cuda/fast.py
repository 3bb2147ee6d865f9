"""Fast warp GEMV for every type with a unit decoder: the 13 of `fast_units.py` (Q4_K, Q6_K, Q8_0, Q4_0, Q5_K,
Q2_K, Q3_K, IQ4_XS, IQ4_NL, MXFP4, Q4_1, Q5_0, Q5_1) and those of `fast_more.py` (NVFP4, F16, BF16, F32 and the
IQ grid types); same math and signature as `gemv.gemv_kernel`.

    y[out(j), o] = sc[e] * (x[tok(j)] . W_e[o])     over the groups of a `GroupTable` (dense = one group)

What differs from the generic kernel (`gemv.py`), all to cut instructions and loads per weight:
- A lane takes a *unit* of 32 weights (a quarter-group of a K-quant block, a whole Q8_0 / Q4_0 block):
  per-block headers (scales, mins) are decoded once per 32 weights, not per 8 or 16.
- Weight bytes and activations come in 128-bit loads (`vec.ld4u`, `vec.ld4f`) where the layout is
  16-byte aligned (Q4_K, Q5_K), in aligned 32-bit words joined by `prmt` where it is not (blocks of
  210, 110, 34, 22, 18 or 17 bytes).
- 16-value tables (IQ4_NL / IQ4_XS, MXFP4) are looked up four nibbles at a time by two `prmt` over the
  table held in four registers (`fast_units._lut4`): no table in memory.
- A byte q becomes the float 2^23 + q by one `prmt` under the exponent byte 0x4B, then one subtraction
  (the type's offset folded in: 2^23 + 32 for Q6_K, 2^23 + 8 for Q4_0, 2^23 + 128 for int8): exact.
- The scale is applied once per run: a * sum(q * x) (+ b * sum(x) for the K-quant mins), the integer
  weights q multiplied as exact floats. This reorders float32 sums against the oracle
  (dequantize, then dot), within the kernels' tolerance (relative RMS <= 1e-5).
- RW rows per warp share each activation load; KS warps of a block split K; NT tokens per pass.

The types' unit decoders (`ld` then `dc`) are in `fast_units.py` (the protocol in its docstring) and
`fast_more.py`; the kernels read them from the registry `fast_specs.FSPECS`.
"""
from __future__ import annotations

import functools

from numba import cuda, float32, int32, uint32, uint64

from .device import SIM, silu, warp_sum
from .fast_specs import FSPECS, fast_supported
from .gemv import write_rows
from .vec import ld4f


@functools.lru_cache(maxsize=None)
def fgemv_kernel(t, NT: int = 1, RW: int = 2, KS: int = 4, glu: bool = False, rwt: bool = False):
    """Grouped warp GEMV: a block of KS warps computes RW rows of one group (grid (ceil(O/RW), GMAX)),
    the warps splitting the row's units, lanes striding over them. Same arguments as `gemv.gemv_kernel`
    (`tb`: the type's lookup table, `decoders.tables`, for the types whose decoder needs one)."""
    s = FSPECS[t]
    ld, dc, BS, TS, UPB, NR, RL, NV, NW, HASB = s.ld, s.dc, s.BS, s.TS, s.UPB, s.NR, s.RL, s.NV, s.NW, s.HASB
    NTH = 32 * KS
    RU = RW if glu else 1
    _, load_x = _unit_helpers(t)
    GLU = glu
    write = write_rows(KS, RW, NT, glu, rwt)

    @cuda.jit(device=True, inline=True)
    def dot_rows(q, sa, sb, xv, xs, acc, tt, NRW):
        for r in range(NRW):
            a = float32(0.0)
            for j in range(NR):
                dj = float32(0.0)
                for k in range(RL):
                    dj = cuda.fma(q[r, j * RL + k], xv[0, j * RL + k], dj)
                a = cuda.fma(sa[r, j], dj, a)
                if HASB:
                    a = cuda.fma(sb[r, j], xs[0, j], a)
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
        xv = cuda.local.array((1, NV), float32)
        xs = cuda.local.array((1, NR), float32)
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
                    dc(raw, rf, r, rb, c, q, sa, sb, r, tb)
                    if GLU:
                        dc(rawu, rfu, r, rb, c, qu, sau, sbu, r, tb)
                for tt in range(NT):
                    if NT == 1 or tt < nt:
                        load_x(x, uint64(xrow[tt]) * uint64(I) + uint64(b * BS), c, xv, xs, 0)
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
            write(red, redu, y, sc, rw, grp, e, E, row0, O, c0, nt, GMAX, NP, tid)
            cuda.syncthreads()
    return fgemv


@functools.lru_cache(maxsize=None)
def _unit_helpers(t):
    """dot1(q, sa, sb, xv, xs, tt): one decoded unit (q, sa, sb row 0) against token tt's activations;
    load_x(x, xo, c, xv, xs, tt): token tt's activations of unit c (flat offset xo of its block) into
    xv[tt], with the sum of each run in xs[tt] (for the mins)."""
    s = FSPECS[t]
    col, NR, RL, HASB = s.col, s.NR, s.RL, s.HASB

    @cuda.jit(device=True, inline=True)
    def dot1(q, sa, sb, xv, xs, tt):
        a = float32(0.0)
        for j in range(NR):
            dj = float32(0.0)
            for k in range(RL):
                dj = cuda.fma(q[0, j * RL + k], xv[tt, j * RL + k], dj)
            a = cuda.fma(sa[0, j], dj, a)
            if HASB:
                a = cuda.fma(sb[0, j], xs[tt, j], a)
        return a

    @cuda.jit(device=True, inline=True)
    def load_x(x, xo, c, xv, xs, tt):
        for j in range(NR):
            cj = uint64(col(c, j))
            sj = float32(0.0)
            for k4 in range(RL // 4):
                v0, v1, v2, v3 = ld4f(x, xo + cj + uint64(4 * k4))
                xv[tt, j * RL + 4 * k4] = v0
                xv[tt, j * RL + 4 * k4 + 1] = v1
                xv[tt, j * RL + 4 * k4 + 2] = v2
                xv[tt, j * RL + 4 * k4 + 3] = v3
                if HASB:
                    sj += (v0 + v1) + (v2 + v3)
            xs[tt, j] = sj
    return dot1, load_x


@cuda.jit(device=True, inline=True)
def pair_group(grp, GMAX, j):
    """The group of pair j in a group table (`gemv.GroupTable`): the last g < G with goff[g] <= j (binary search
    over the G + 1 group offsets; every thread of a block takes the same path)."""
    lo = 0
    hi = grp[0] - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if grp[1 + GMAX + mid] <= j:
            lo = mid
        else:
            hi = mid - 1
    return lo


@functools.lru_cache(maxsize=None)
def fgemv1_kernel(t, RW: int = 8, KS: int = 4, glu: bool = False, rwt: bool = False, P: int = 4, IDM: int = 0,
                  MR: int = 0, x8: tuple | None = None, DB: bool = False):
    """One token per group (decode, and expert dispatch at one token): each lane loads the activations of
    its unit once into registers and runs them against the same unit of RW rows, decoded one row at a
    time, so that the activation traffic is 1/RW of the weights' instead of 4 bytes per weight read.
    The lanes' partial sums live in shared memory, so the row loop need not be unrolled; the loads of P
    rows are issued before any of them is decoded (bytes in flight: what bounds a GEMV).

    MR: a register cap per thread (0: the compiler's choice).
    x8: the 8-bit halves (cw, digitise, idot) of `fast8` (`fast8.igemv1_kernel` passes them; types in
    `fast8.CW`): the activations as 8-bit digit planes and dp4a products, the first P rows' loads then
    issued before the activations'. None: the float kernel.
    DB: software-pipelined loads. A lane's work is a sequence of chunks (P rows of one unit); two register
    buffers alternate, and the loads of chunk k + 1 are issued before chunk k is decoded, so a warp always
    has P rows' bytes in flight while it computes, instead of waiting for every load after each decode.
    IDM = 1 or 2: no group table; `grp` is the expert ids of one token (int32 [NP = A]) and block row g
    multiplies expert grp[g] into output row g, reading activation row 0 (IDM = 1: gate / up) or row g
    (IDM = 2: down, one row per slot). Grid (ceil(O/RW), A): expert dispatch of one token in one launch.
    IDM = 3: one block per pair of a group table (`pair_group` finds its group): grid (NP, ceil(O/RW)),
    the pair index fastest, so the blocks of the pairs that share a matrix read the same rows at the same
    time (one DRAM read, the rest from L2) and a large group runs in parallel, not pass after pass.
    Grid (ceil(O/RW), GMAX), block 32 * KS; same arguments as `fgemv_kernel`; a group of several pairs
    takes one pass per pair (its rows come from L2 after the first)."""
    s = FSPECS[t]
    ld, dc, BS, TS, UPB, NR, NV, NW = s.ld, s.dc, s.BS, s.TS, s.UPB, s.NR, s.NV, s.NW
    NQ = NV // 4
    NTH = 32 * KS
    X8 = x8 is not None
    GLU, RWT, WF = glu, rwt, X8
    P = max(1, min(P, RW, (s.PGLU if glu else s.PMAX) // (2 if DB else 1)))     # DB: two buffers of P rows
    while RW % P:
        P -= 1
    PU = P if glu else 1
    dot1, load_x = _unit_helpers(t)
    if X8:
        cw, digitise, idot = x8

        @cuda.jit(device=True, inline=True)
        def prep(x, xo, c, xv, xs, xl, xk):
            load_x(x, xo, c, xv, xs, 0)
            digitise(xv, xl, xk)

        @cuda.jit(device=True, inline=True)
        def rowdot(raw, rf, p, rb, c, q, qw, sa, sb, xv, xs, xl, xk, tb):
            cw(raw, rf, p, rb, c, qw, sa, sb, 0, tb)
            return idot(qw, sa, sb, xl, xk, xs)
    else:
        @cuda.jit(device=True, inline=True)
        def prep(x, xo, c, xv, xs, xl, xk):
            load_x(x, xo, c, xv, xs, 0)

        @cuda.jit(device=True, inline=True)
        def rowdot(raw, rf, p, rb, c, q, qw, sa, sb, xv, xs, xl, xk, tb):
            dc(raw, rf, p, rb, c, q, sa, sb, 0, tb)
            return dot1(q, sa, sb, xv, xs, 0)

    NRC = RW // P                                        # chunks (P rows each) per unit (DB)

    @cuda.jit(device=True, inline=True)
    def chunk_at(ebase, u0, k):
        """Chunk k of the lane whose first unit is u0: its block b, unit c in the block, the block's byte
        offset in row 0, and its first row r0."""
        it = k // NRC
        u = u0 + it * NTH
        b = u // UPB
        return b, u - b * UPB, ebase + uint64(b) * uint64(TS), (k - it * NRC) * P

    @cuda.jit(device=True, inline=True)
    def ld_chunk(w32, w16, u32, u16, ebase, u0, k, row0, O, rowb, raw, rf, rawu, rfu):
        """Issue the loads of chunk k (no decode): P rows of one unit into raw / rawu."""
        _, c, rb0, r0 = chunk_at(ebase, u0, k)
        for p in range(P):
            rb = rb0 + uint64(min(row0 + r0 + p, O - 1)) * uint64(rowb)
            ld(w32, w16, rb, c, raw, rf, p)
            if GLU:
                ld(u32, u16, rb, c, rawu, rfu, p)

    @cuda.jit(device=True, inline=True)
    def run_chunk(x, xr, ebase, u0, k, row0, O, I, rowb, raw, rf, rawu, rfu, q, qw, sa, sb, xv, xs, xl, xk, tb,
                  acc, accu, warp, lane):
        """Decode and multiply chunk k from its loaded words (the unit's activations first, at its first chunk)."""
        b, c, rb0, r0 = chunk_at(ebase, u0, k)
        if r0 == 0:
            prep(x, xr * uint64(I) + uint64(b * BS), c, xv, xs, xl, xk)
        for p in range(P):
            rb = rb0 + uint64(min(row0 + r0 + p, O - 1)) * uint64(rowb)
            acc[warp, r0 + p, lane] += rowdot(raw, rf, p, rb, c, q, qw, sa, sb, xv, xs, xl, xk, tb)
            if GLU:
                accu[warp, r0 + p, lane] += rowdot(rawu, rfu, p, rb, c, q, qw, sa, sb, xv, xs, xl, xk, tb)

    @cuda.jit(**({"max_registers": MR} if MR and not SIM else {}))
    def fgemv1(w32, w16, u32, u16, tb, x, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP, E):
        red = cuda.shared.array((KS, RW), float32)
        redu = cuda.shared.array((KS, RW), float32)
        acc = cuda.shared.array((KS, RW, 32), float32)         # per-lane partial sums: the row loop
        accu = cuda.shared.array((KS, RW if GLU else 1, 32), float32)   # needs no unrolling (no local memory)
        tid = cuda.threadIdx.x
        if IDM == 3:                                     # the pair index fastest (see the docstring)
            g = cuda.blockIdx.x
            row0 = cuda.blockIdx.y * RW
        else:
            g = cuda.blockIdx.y
            row0 = cuda.blockIdx.x * RW
        if row0 >= O:
            return
        if IDM == 0:
            if g >= grp[0]:
                return
            e = grp[1 + g]
            j0 = grp[1 + GMAX + g]
            j1 = grp[2 + GMAX + g]
        elif IDM == 3:
            if g >= NP:
                return
            e = grp[1 + pair_group(grp, GMAX, g)]
            j0 = g
            j1 = g + 1
        else:
            if g >= NP:
                return
            e = grp[g]
            j0 = 0
            j1 = 1
        warp = tid // 32
        lane = tid % 32
        ebase = uint64(e) * uint64(estride)
        nunits = (I // BS) * UPB
        q = cuda.local.array((1, NV), float32)
        qw = cuda.local.array((1, NQ), uint32)
        sa = cuda.local.array((1, NR), float32)
        sb = cuda.local.array((1, NR), float32)
        raw = cuda.local.array((P, NW), uint32)
        rf = cuda.local.array(P, float32)
        rawu = cuda.local.array((PU, NW), uint32)
        rfu = cuda.local.array(PU, float32)
        raw2 = cuda.local.array((P if DB else 1, NW), uint32)          # DB: the second buffer
        rf2 = cuda.local.array(P if DB else 1, float32)
        rawu2 = cuda.local.array((PU if DB else 1, NW), uint32)
        rfu2 = cuda.local.array(PU if DB else 1, float32)
        xv = cuda.local.array((1, NV), float32)
        xs = cuda.local.array((1, NR), float32)
        xl = cuda.local.array((3, NQ), uint32)
        xk = cuda.local.array(NR, float32)
        for jp in range(j0, j1):                         # a group of several pairs: one pass each
            if IDM == 0 or IDM == 3:                     # (the rows come from L2 after the first)
                xr = uint64(grp[2 + 2 * GMAX + jp])
                orow = grp[2 + 2 * GMAX + NP + jp]
            else:
                xr = uint64(0) if IDM == 1 else uint64(g)
                orow = g
            for r in range(RW):
                acc[warp, r, lane] = float32(0.0)
                if GLU:
                    accu[warp, r, lane] = float32(0.0)
            u = warp * 32 + lane
            if DB:                                       # chunk k: unit u + (k // NRC) * NTH, rows (k % NRC) * P ..
                nch = ((nunits - u + NTH - 1) // NTH) * NRC if u < nunits else 0
                if nch > 0:
                    ld_chunk(w32, w16, u32, u16, ebase, u, 0, row0, O, rowb, raw, rf, rawu, rfu)
                k = 0
                while k < nch:                           # buffer 1 holds chunk k, buffer 2 gets chunk k + 1
                    if k + 1 < nch:
                        ld_chunk(w32, w16, u32, u16, ebase, u, k + 1, row0, O, rowb, raw2, rf2, rawu2, rfu2)
                    run_chunk(x, xr, ebase, u, k, row0, O, I, rowb, raw, rf, rawu, rfu, q, qw, sa, sb, xv, xs, xl,
                              xk, tb, acc, accu, warp, lane)
                    if k + 2 < nch:
                        ld_chunk(w32, w16, u32, u16, ebase, u, k + 2, row0, O, rowb, raw, rf, rawu, rfu)
                    if k + 1 < nch:
                        run_chunk(x, xr, ebase, u, k + 1, row0, O, I, rowb, raw2, rf2, rawu2, rfu2, q, qw, sa, sb,
                                  xv, xs, xl, xk, tb, acc, accu, warp, lane)
                    k += 2
                u = nunits
            while u < nunits:
                b = u // UPB
                c = u - b * UPB
                rb0 = ebase + uint64(b) * uint64(TS)
                if WF:                                   # the first rows' loads before the activations'
                    for p in range(P):
                        rb = rb0 + uint64(min(row0 + p, O - 1)) * uint64(rowb)
                        ld(w32, w16, rb, c, raw, rf, p)
                        if GLU:
                            ld(u32, u16, rb, c, rawu, rfu, p)
                prep(x, xr * uint64(I) + uint64(b * BS), c, xv, xs, xl, xk)
                for r0 in range(0, RW, P):
                    if not WF or r0 > 0:
                        for p in range(P):
                            rb = rb0 + uint64(min(row0 + r0 + p, O - 1)) * uint64(rowb)
                            ld(w32, w16, rb, c, raw, rf, p)
                            if GLU:
                                ld(u32, u16, rb, c, rawu, rfu, p)
                    for p in range(P):
                        rb = rb0 + uint64(min(row0 + r0 + p, O - 1)) * uint64(rowb)
                        acc[warp, r0 + p, lane] += rowdot(raw, rf, p, rb, c, q, qw, sa, sb, xv, xs, xl, xk, tb)
                        if GLU:
                            accu[warp, r0 + p, lane] += rowdot(rawu, rfu, p, rb, c, q, qw, sa, sb, xv, xs, xl, xk,
                                                               tb)
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
            cuda.syncthreads()
    return fgemv1


__all__ = ["FSPECS", "fgemv_kernel", "fgemv1_kernel", "fast_supported"]
