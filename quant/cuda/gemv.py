"""Dequantize-and-multiply kernels over packed GGUF weights: naive GEMV, warp GEMV, tiled GEMM.

Legend: T tokens, I inputs (a weight row), O outputs (weight rows), E experts, G groups.

    y[out(j), o] = sc[e] * (x[tok(j)] . W_e[o])   (* rw[out(j)] when `rw` is given)

Every kernel is *grouped*: a group g is one weight matrix (expert e = gexp[g]) and the list of
(token row, output row) pairs multiplied by it. A dense matmul is one group holding every token
(`dense_groups`); a MoE layer has one group per routed expert (`quant.cuda.moe`). All groups of a
call go in one launch. The group table is one int32 array (see `GroupTable`).

Three kernels, same math, same signature:
- `naive_kernel`: one thread per (pair, output row), a plain loop over the row's blocks. Obviously
  right; the reference the fast kernels are checked against on the device.
- `gemv_kernel`: a block of KS warps per RW rows, split-K over the warps, lanes over the parts of
  a row, U parts per lane in flight, NT tokens per pass with the decoded weights kept in registers
  and reused for every token; `glu=True` decodes a second matrix (up) beside the first (gate) and
  writes silu(gate) * up. For decode and small batches.
- `gemm_kernel`: BM x BN output tiles; each K step decodes a [128, BM] weight tile into shared
  memory once and reuses it for BN tokens. For prefill.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int32, int64, uint32, uint64

from .device import silu, warp_sum
from .decoders import spec, tables


# ------------------------------------------------------------------ the group table
class GroupTable:
    """int32 array describing the groups of one launch (built on the host or by `moe.bucket_kernel`).

        [0]                         G, the number of groups
        [1 + g]                     gexp[g]   expert (matrix index) of group g,   g < GMAX
        [1 + GMAX + g]              goff[g]   first pair of group g,              g <= GMAX
        [2 + 2 GMAX + j]            tok[j]    token row of pair j,                j < NP
        [2 + 2 GMAX + NP + j]       out[j]    output row of pair j
        [2 + 2 GMAX + 2 NP]         n_tiles   BN-token tiles (for the GEMM); then per tile:
        [3 + 2 GMAX + 2 NP + 2 i]   group of tile i, and [.. + 1] its first pair
    """

    @staticmethod
    def size(gmax: int, n_pairs: int, bn: int) -> int:
        return 3 + 2 * gmax + 2 * n_pairs + 2 * (gmax + n_pairs // bn + 1)

    @staticmethod
    def build(gexp: np.ndarray, counts: np.ndarray, tok: np.ndarray, out: np.ndarray, gmax: int, bn: int) -> np.ndarray:
        """Host construction: groups in order, pairs already sorted by group."""
        n = len(tok)
        G = len(gexp)
        tab = np.zeros(GroupTable.size(gmax, n, bn), dtype=np.int32)
        tab[0] = G
        tab[1:1 + G] = gexp
        off = np.concatenate([[0], np.cumsum(counts)])
        tab[1 + gmax:1 + gmax + G + 1] = off
        tab[1 + gmax + G + 1:2 + 2 * gmax] = off[-1]
        p = 2 + 2 * gmax
        tab[p:p + n] = tok
        tab[p + n:p + 2 * n] = out
        tiles = [(g, s) for g in range(G) for s in range(int(off[g]), int(off[g + 1]), bn)]
        q = p + 2 * n
        tab[q] = len(tiles)
        if tiles:
            tab[q + 1:q + 1 + 2 * len(tiles)] = np.asarray(tiles, dtype=np.int32).reshape(-1)
        return tab


@cuda.jit(device=True, inline=True)
def tile_of(grp, GMAX, NP, ti, bn):
    """Tile ti of a group table built with bn-pair tiles: (matrix e of its group, first pair j0, end pair j1);
    e = -1 past the table's tiles (the block has nothing to do)."""
    q0 = 2 + 2 * GMAX + 2 * NP
    if ti >= grp[q0]:
        return int64(-1), int64(0), int64(0)
    g = grp[q0 + 1 + 2 * ti]
    j0 = int64(grp[q0 + 2 + 2 * ti])
    return int64(grp[1 + g]), j0, min(j0 + bn, int64(grp[2 + GMAX + g]))


@cuda.jit(device=True, inline=True)
def part_of(k0, qk, BS, KT, NPK, P):
    """The GEMMs' K tiles of KT columns: (block bb, part p) of the qk-th of the NPK parts a row has in the tile
    starting at column k0 (parts of a 256-weight block are numbered so that each KT-column half is a run)."""
    if BS >= KT:
        return k0 // BS, ((k0 % BS) // KT) * NPK + qk
    return k0 // BS + qk // P, qk % P


def dense_groups(T: int, bn: int) -> np.ndarray:
    """One group (matrix 0) with tokens 0..T-1 written to output rows 0..T-1."""
    ar = np.arange(T, dtype=np.int32)
    return GroupTable.build(np.zeros(1, np.int32), np.array([T]), ar, ar, 1, bn)


# ------------------------------------------------------------------ naive kernel
@functools.lru_cache(maxsize=None)
def naive_kernel(t):
    """One thread per (pair j, output row o): y[out(j), o] = sc[e] * sum over the row of w * x[tok(j)]."""
    s = spec(t)
    dec, P, NV, R, RL, RS, BS, TS = s.dec, s.P, s.NV, s.R, s.RL, s.RS, s.BS, s.TS

    @cuda.jit
    def naive(w32, w16, tb, x, y, sc, grp, O, I, rowb, estride, GMAX, NP):
        o = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        j = cuda.blockIdx.y                                    # pair index
        if o >= O or j >= NP:
            return
        G = grp[0]
        g = 0
        while g + 1 < G and grp[2 + GMAX + g] <= j:            # the group holding pair j
            g += 1
        if j >= grp[1 + GMAX + G]:
            return
        e = grp[1 + g]
        xr = grp[2 + 2 * GMAX + j]
        v = cuda.local.array((1, NV), float32)
        acc = float32(0.0)
        for b in range(I // BS):
            base = uint64(e) * uint64(estride) + uint64(o) * uint64(rowb) + uint64(b) * uint64(TS)
            for p in range(P):
                c0 = dec(w32, w16, tb, base, p, v, 0)
                for q in range(R):
                    for k in range(RL):
                        acc += v[0, q * RL + k] * x[xr, b * BS + c0 + q * RS + k]
        y[grp[2 + 2 * GMAX + NP + j], o] = acc * sc[e]
    return naive


# ------------------------------------------------------------------ warp GEMV
@functools.lru_cache(maxsize=None)
def write_rows(KS: int, RW: int, NT: int, glu: bool, rwt: bool):
    """The last stage of the warp GEMVs: red[w, r, tt] (warp w's sum for row row0 + r, token tt of the pass
    starting at pair c0) summed over the KS warps in a fixed order, scaled, gated (glu: silu(gate) * up from
    redu), weighted (rwt) and written to y[out(pair)]. Threads of the block share the RW * NT outputs."""
    NTH = 32 * KS
    GLU, RWT = glu, rwt

    @cuda.jit(device=True, inline=True)
    def write(red, redu, y, sc, rw, grp, e, E, row0, O, c0, nt, GMAX, NP, tid):
        for i in range(tid, RW * NT, NTH):                # RW * NT may exceed the block
            r = i // NT
            tt = i - r * NT
            if tt < nt and row0 + r < O:
                a = red[0, r, tt]
                for w in range(1, KS):
                    a += red[w, r, tt]
                a = a * sc[e]
                if GLU:
                    u = redu[0, r, tt]
                    for w in range(1, KS):
                        u += redu[w, r, tt]
                    a = silu(a) * (u * sc[E + e])
                orow = grp[2 + 2 * GMAX + NP + c0 + tt]
                if RWT:
                    a = a * rw[orow]
                y[orow, row0 + r] = a
    return write


@functools.lru_cache(maxsize=None)
def gemv_kernel(t, NT: int = 1, RW: int = 1, KS: int = 4, glu: bool = False, rwt: bool = False, U: int = 2):
    """Split-K warp GEMV over groups: a block of KS warps computes RW rows of one group, warp w taking the
    w-th K slice of the row, lanes striding over its parts, U parts per lane in flight; NT tokens per pass.

    glu: W is gate and U is up; writes silu(sc[e] gate) * (sc[E + e] up).
    rwt: multiply each output row by rw[out(j)] (the routing weight of that token and slot).
    """
    s = spec(t)
    dec, P, NV, R, RL, RS, BS, TS = s.dec, s.P, s.NV, s.R, s.RL, s.RS, s.BS, s.TS
    TABW = len(tables()[s.table])
    NTH = 32 * KS
    RU = RW if glu else 1                      # rows of the second matrix (1 = unused)
    GLU = glu
    write = write_rows(KS, RW, NT, glu, rwt)

    @cuda.jit(device=True, inline=True)
    def part(w32, w16, u32, u16, stab, x, xrow, it, ebase, row0, O, rowb, v, vu, acc, accu, nt):
        """Decode part `it` of the RW rows (and of up) and accumulate its dot with nt tokens."""
        b = it // P
        p = it - b * P
        c0 = 0
        for r in range(RW):
            rb = ebase + uint64(min(row0 + r, O - 1)) * uint64(rowb) + uint64(b) * uint64(TS)
            c0 = dec(w32, w16, stab, rb, p, v, r)
            if GLU:
                dec(u32, u16, stab, rb, p, vu, r)
        col = uint64(b * BS + c0)
        for tt in range(NT):
            if NT == 1 or tt < nt:
                xr = uint64(xrow[tt])
                for q in range(R):
                    for k in range(RL):
                        xv = x[xr, col + uint64(q * RS + k)]
                        for r in range(RW):
                            acc[r, tt] = cuda.fma(v[r, q * RL + k], xv, acc[r, tt])
                        for r in range(RU):
                            if GLU:
                                accu[r, tt] = cuda.fma(vu[r, q * RL + k], xv, accu[r, tt])

    @cuda.jit
    def gemv(w32, w16, u32, u16, tb, x, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP, E):
        # stage 0: the type's lookup table (grid / fp4 values) into shared memory
        stab = cuda.shared.array(TABW, uint32)
        red = cuda.shared.array((KS, RW, NT), float32)
        redu = cuda.shared.array((KS, RU, NT), float32)
        tid = cuda.threadIdx.x
        for i in range(tid, TABW, NTH):
            stab[i] = tb[i]
        cuda.syncthreads()
        # stage 1: which group, which rows, which K slice (block-uniform exits only: barriers follow)
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
        nparts = (I // BS) * P
        per = ((nparts + KS - 1) // KS + 31) // 32 * 32
        pw0 = warp * per
        pw1 = min(nparts, pw0 + per)
        v = cuda.local.array((RW, NV), float32)
        vu = cuda.local.array((RU, NV), float32)
        acc = cuda.local.array((RW, NT), float32)
        accu = cuda.local.array((RU, NT), float32)
        xrow = cuda.local.array(NT, int32)
        for c in range(j0, j1, NT):
            nt = min(NT, j1 - c)
            for tt in range(NT):
                xrow[tt] = grp[2 + 2 * GMAX + min(c + tt, j1 - 1)]               # token rows of this pass
                for r in range(RW):
                    acc[r, tt] = float32(0.0)
                for r in range(RU):
                    accu[r, tt] = float32(0.0)
            # stage 2: U parts per lane per step (their loads in flight together), then the tail
            it = pw0 + lane
            while it + 32 * (U - 1) < pw1:
                for u in range(U):
                    part(w32, w16, u32, u16, stab, x, xrow, it + 32 * u, ebase, row0, O, rowb, v, vu, acc, accu, nt)
                it += 32 * U
            while it < pw1:
                part(w32, w16, u32, u16, stab, x, xrow, it, ebase, row0, O, rowb, v, vu, acc, accu, nt)
                it += 32
            # stage 3: warp sums into shared memory, then the KS slices in a fixed order
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
            write(red, redu, y, sc, rw, grp, e, E, row0, O, c, nt, GMAX, NP, tid)
            cuda.syncthreads()
    return gemv


# ------------------------------------------------------------------ tiled GEMM
KT = 128          # K columns per shared-memory weight tile


@functools.lru_cache(maxsize=None)
def gemm_kernel(t, BM: int = 64, BN: int = 32, TM: int = 4, TN: int = 2, rwt: bool = False):
    """Grouped GEMM: block (row tile, token tile) computes BM x BN outputs; NTH = (BM/TM)(BN/TN) threads.

    Tiles come from the group table (tile i = BN consecutive pairs of one group). Needs I % 128 == 0.
    Shared memory: W tile [128, BM] + X tile [128, BN] float32 (48 KB at 64 x 32).
    """
    s = spec(t)
    dec, P, NV, R, RL, RS, BS, TS = s.dec, s.P, s.NV, s.R, s.RL, s.RS, s.BS, s.TS
    TY, TX = BM // TM, BN // TN
    NTH = TY * TX
    NPK = KT * P // BS                      # parts per K tile per row
    RWT = rwt

    @cuda.jit
    def gemm(w32, w16, tb, x, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP, E):
        Ws = cuda.shared.array((KT, BM), float32)
        Xs = cuda.shared.array((KT, BN), float32)
        tid = cuda.threadIdx.x
        e, j0, j1 = tile_of(grp, GMAX, NP, cuda.blockIdx.y, BN)
        if e < 0:
            return
        row0 = cuda.blockIdx.x * BM
        ebase = uint64(e) * uint64(estride)
        ty = tid // TX
        tx = tid % TX
        v = cuda.local.array((1, NV), float32)
        acc = cuda.local.array((TM, TN), float32)
        a = cuda.local.array(TM, float32)
        bx = cuda.local.array(TN, float32)
        for i in range(TM):
            for jj in range(TN):
                acc[i, jj] = float32(0.0)
        for k0 in range(0, I, KT):
            # stage 1: decode the [BM rows, 128 cols] weight tile, thread w -> row w % BM (conflict-free stores)
            for w in range(tid, BM * NPK, NTH):
                r = w % BM
                bb, p = part_of(k0, w // BM, BS, KT, NPK, P)
                rb = ebase + uint64(min(row0 + r, O - 1)) * uint64(rowb) + uint64(bb) * uint64(TS)
                c0 = dec(w32, w16, tb, rb, p, v, 0)
                cb = bb * BS + c0 - k0
                for q in range(R):
                    for k in range(RL):
                        Ws[cb + q * RS + k, r] = v[0, q * RL + k]
            # stage 2: the [128, BN] token tile, gathered through the pair list (zeros past the group)
            for w in range(tid, KT * BN, NTH):
                n = w // KT
                kk = w % KT
                if j0 + n < j1:
                    Xs[kk, n] = x[grp[2 + 2 * GMAX + j0 + n], k0 + kk]
                else:
                    Xs[kk, n] = float32(0.0)
            cuda.syncthreads()
            # stage 3: TM x TN outer products per k, rows ty + i*TY, tokens tx + j*TX
            for kk in range(KT):
                for i in range(TM):
                    a[i] = Ws[kk, ty + i * TY]
                for jj in range(TN):
                    bx[jj] = Xs[kk, tx + jj * TX]
                for i in range(TM):
                    for jj in range(TN):
                        acc[i, jj] = cuda.fma(a[i], bx[jj], acc[i, jj])
            cuda.syncthreads()
        # stage 4: scales and scatter to the output rows of the pairs
        for i in range(TM):
            row = row0 + ty + i * TY
            for jj in range(TN):
                n = tx + jj * TX
                if row < O and j0 + n < j1:
                    orow = grp[2 + 2 * GMAX + NP + j0 + n]
                    val = acc[i, jj] * sc[e]
                    if RWT:
                        val = val * rw[orow]
                    y[orow, row] = val
    return gemm
