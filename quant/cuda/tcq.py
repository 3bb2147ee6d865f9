"""Tensor-core GEMM on the quants themselves: the weights never decoded to float32, two `mma.sync` a fragment.

    split_rows(xd, stream)                       -> (xh, xl, sx): the activations split once per launch
    gemm_tcq_kernel(t, MT, WM, BN, rwt)          same group table and outputs as `tc.gemm_tc_kernel`
    gemm_tcq_staged_kernel(t, MT, WM, BN, rwt)   the same with the weights staged through shared memory
    split16_rows(xd, stream)                     -> (xh, xl, sx, rs): f16 halves of row-scaled activations
    gemm_tcq16_kernel(t, MT, WM, BN, rwt)        the same sums on mma.m16n8k16 (tcq_shape H=1; notes below)
    TYPES                                        the types it reads (Q4_K)

A Q4_K weight is w = a * q - b with q a 4-bit integer and (a, b) = (d * sc, dmin * m) per 32-column sub-block. So a
row's product with x over one sub-block is

    sum_c w_c x_c = a * sum_c q_c x_c  -  b * sum_c x_c

q is exact in TF32 (10 mantissa bits), so the tensor core multiplies it unsplit: only the activations are split
into x = hi + lo (TF32 each; `split_rows`, once per launch, with sx = each row's sum of x per sub-block), and a
fragment takes two `mma.sync.m16n8k8` (q . hi + q . lo) where `tc.py`'s 3xTF32 takes three on a decoded and split
float32 weight. The tensor core sums one sub-block (32 columns, 4 steps) into fresh accumulators (its float32
additions truncate: `tc.py`), then the lanes add a * that - b * sx into float32 registers, rounded.

No shared memory and no barrier on the GPU: lane 4g + q of a warp loads its A fragments from the packed bytes
itself (rows g and g + 8 of each of its MT 16-row tiles) and its B fragments from hi / lo (tokens g of each 8-token
column tile, through L1). The k order inside a sub-block is permuted so that both are contiguous: mma step s (0..3),
k-slot kk (0..7) takes column 8 (kk % 4) + 2 s + kk // 4, so over the four steps lane q holds columns 8q .. 8q + 7:
8 bytes of the sub-block pair's qs (low nibbles: sub-block 2j, high: 2j + 1) and two 16-byte loads of hi and of lo.
A block is WM warps of MT x 16 rows each (BM = 16 MT WM) and one BN-pair tile of the group table; 8-token column
tiles past the tile's pairs are skipped (the count is the block's: uniform).

Fragment layouts as in `tc.py` (PTX ISA, mma.m16n8k8 .tf32). In the CUDA simulator `tc.warp_mma` multiplies the
fragments through shared memory (block-wide barriers: every warp runs every step).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32, int64, uint32, uint64
from numba.core.types import float16

from ..formats import GGMLType
from .decoders import SPECS, scale_min_k4
from .device import SIM, hf, ld32a, row_scale_exp, u2f, warp_sum
from .gemv import tile_of
from .tc import warp_mma
if SIM:
    from .tc import warp_exchange
from .vec import cp_async16, cp_async_commit, cp_async_wait1, f32_bits, h2f, hsub2, ld4u, prmt, tf32_split

TYPES = (GGMLType.Q4_K,)
SUB = 32                     # columns of a sub-block: one (a, b) pair, one tensor-core sum
TS = SPECS[GGMLType.Q4_K].TS  # bytes of a 256-column super-block (144)


@cuda.jit
def split_kernel(x, xh, xl, sx, R, K):
    """x [R, K] float32 -> xh, xl (uint32 [R * K]: TF32 hi and lo bits), sx (float32 [R * K / 32]: each 32-column
    sub-block's sum of x). A thread an element, a warp a sub-block (K % 32 == 0)."""
    i = cuda.grid(1)
    n = R * K
    v = float32(0.0)
    if i < n:
        v = x[i // K, i % K]
    hi, lo = tf32_split(v)
    if i < n:
        xh[i] = hi
        xl[i] = lo
    s = warp_sum(v)
    if i < n and i % SUB == 0:
        sx[i // SUB] = s


def split_rows(xd, stream=0, alloc=None):
    """(xh, xl, sx) of xd [R, K] (a device array, K % 32 == 0): one launch. alloc(n, dtype): the scratch allocator
    (default numba's device_array)."""
    R, K = xd.shape
    alloc = alloc or (lambda n, dt: cuda.device_array(n, dtype=dt, stream=stream))
    xh, xl, sx = alloc(R * K, np.uint32), alloc(R * K, np.uint32), alloc(R * K // SUB, np.float32)
    n = R * K
    if n:
        split_kernel[math.ceil(n / 256), 256, stream](xd, xh, xl, sx, R, K)
    return xh, xl, sx


@cuda.jit(device=True, inline=True)
def _load_b(xh, xl, xr, I, col, bh, bl, k):
    """B fragments of one 8-token tile into buffer k: hi and lo bits of x row xr, columns col .. col + 7 (zeros for
    no row: xr < 0)."""
    if xr >= 0:
        o = uint64(xr) * uint64(I) + uint64(col)
        bh[k, 0], bh[k, 1], bh[k, 2], bh[k, 3] = ld4u(xh, o)
        bh[k, 4], bh[k, 5], bh[k, 6], bh[k, 7] = ld4u(xh, o + uint64(4))
        bl[k, 0], bl[k, 1], bl[k, 2], bl[k, 3] = ld4u(xl, o)
        bl[k, 4], bl[k, 5], bl[k, 6], bl[k, 7] = ld4u(xl, o + uint64(4))
    else:
        for c in range(8):
            bh[k, c] = uint32(0)
            bl[k, c] = uint32(0)


@cuda.jit(device=True, inline=True)
def _token_rows(grp, GMAX, j0, cnt, g, q, xb, xc, NT):
    """x rows of the tile's tokens a lane needs: xb[jj] of token 8 jj + g (B fragments), xc[jj, t] of tokens
    8 jj + 2 q + t (C fragments); -1 past the tile's pairs."""
    for jj in range(NT):
        n = 8 * jj + g
        xb[jj] = grp[2 + 2 * GMAX + j0 + n] if n < cnt else -1
        for tt in range(2):
            n = 8 * jj + 2 * q + tt
            xc[jj, tt] = grp[2 + 2 * GMAX + j0 + n] if n < cnt else -1


@cuda.jit(device=True, inline=True)
def _a_frags(qa, qb, half, af, MT):
    """A fragments of one sub-block (low nibbles: half 0, high: 1) for the 4 mma steps: column 8q + 2s + tt is byte
    2 (s % 2) + tt of qa (s < 2) or qb; registers a0..a3 = rows g / g + 8 x columns tt = 0 / 1; q as TF32 bits."""
    for i in range(MT):
        for s in range(4):
            for tt in range(2):
                sh = uint32(8 * (2 * (s % 2) + tt) + 4 * half)
                for h in range(2):
                    wd = qa[i, h] if s < 2 else qb[i, h]
                    af[i, 4 * s + 2 * tt + h] = f32_bits(u2f((wd >> sh) & uint32(15)))


@cuda.jit(device=True, inline=True)
def _tile(scr, wi, lane, af, bh, bl, bu, tac, MT):
    """tac[i] = one sub-block's q . (hi + lo) for the 8-token tile in B buffer bu: 4 steps of two mma, summed on the
    tensor cores from zero."""
    for i in range(MT):
        for r in range(4):
            tac[i, r] = float32(0.0)
    for s in range(4):
        for i in range(MT):
            d0, d1, d2, d3 = warp_mma(scr, wi, lane, af[i, 4 * s], af[i, 4 * s + 1], af[i, 4 * s + 2],
                                      af[i, 4 * s + 3], bh[bu, 2 * s], bh[bu, 2 * s + 1],
                                      tac[i, 0], tac[i, 1], tac[i, 2], tac[i, 3])
            d0, d1, d2, d3 = warp_mma(scr, wi, lane, af[i, 4 * s], af[i, 4 * s + 1], af[i, 4 * s + 2],
                                      af[i, 4 * s + 3], bl[bu, 2 * s], bl[bu, 2 * s + 1], d0, d1, d2, d3)
            tac[i, 0] = d0
            tac[i, 1] = d1
            tac[i, 2] = d2
            tac[i, 3] = d3


@cuda.jit(device=True, inline=True)
def _accumulate(acc, jj, tac, sa, sm, sx, xc, nsb, sxi, MT):
    """acc[:, jj] += a * tac - b * (the tokens' sums of x over sub-block sxi), rounded in float32."""
    x0 = sx[uint64(xc[jj, 0]) * uint64(nsb) + uint64(sxi)] if xc[jj, 0] >= 0 else float32(0.0)
    x1 = sx[uint64(xc[jj, 1]) * uint64(nsb) + uint64(sxi)] if xc[jj, 1] >= 0 else float32(0.0)
    for i in range(MT):
        for r in range(4):
            xs = x0 if r % 2 == 0 else x1
            acc[i, jj, r] += sa[i, r // 2] * tac[i, r] - sm[i, r // 2] * xs


@cuda.jit(device=True, inline=True)
def _store(y, grp, GMAX, NP, j0, cnt, O, row0, g, q, acc, sc, e, rw, RWT, MT, NT):
    """The C fragments to the pairs' output rows: c[r] is row g + 8 (r // 2), token 2 q + r % 2 of each 16 x 8 tile;
    times the matrix's scale (and the pair's row weight: RWT)."""
    for i in range(MT):
        for jj in range(NT):
            for r in range(4):
                row = row0 + 16 * i + g + 8 * (r // 2)
                n = 8 * jj + 2 * q + r % 2
                if row < O and n < cnt:
                    orow = grp[2 + 2 * GMAX + NP + j0 + n]
                    val = acc[i, jj, r] * sc[e]
                    if RWT:
                        val = val * rw[orow]
                    y[orow, row] = val


@cuda.jit(device=True, inline=True)
def _row_bytes(rb, e, estride, row0, g, O, rowb, MT):
    """rb[i, h]: the byte offset of the lane's row g + 8 h of its 16-row tile i (rows past O: row O - 1)."""
    for i in range(MT):
        for h in range(2):
            rb[i, h] = uint64(e) * uint64(estride) + uint64(min(row0 + 16 * i + g + 8 * h, O - 1)) * uint64(rowb)


@cuda.jit(device=True, inline=True)
def _super_scales(w32, w16, rb, kb, dd, dm, s0, s1, s2, MT):
    """Super-block kb's d, dmin and the three words of packed 6-bit scales of each of the lane's rows."""
    for i in range(MT):
        for h in range(2):
            base = rb[i, h] + uint64(kb * TS)
            dd[i, h] = hf(w16, base, 0)
            dm[i, h] = hf(w16, base, 2)
            s0[i, h] = ld32a(w32, base, 4)
            s1[i, h] = ld32a(w32, base, 8)
            s2[i, h] = ld32a(w32, base, 12)


@cuda.jit(device=True, inline=True)
def _qs_words(w32, rb, kb, j, q, qa, qb, MT):
    """The lane's 8 bytes (2 words) of sub-block pair j's qs in super-block kb, each of its rows."""
    for i in range(MT):
        for h in range(2):
            base = rb[i, h] + uint64(kb * TS)
            qa[i, h] = ld32a(w32, base, 16 + 32 * j + 8 * q)
            qb[i, h] = ld32a(w32, base, 20 + 32 * j + 8 * q)


@cuda.jit(device=True, inline=True)
def _sub_scales(s0, s1, s2, dd, dm, sbk, sa, sm, MT):
    """(a, b) = (d * sc, dmin * m) of sub-block sbk, each of the lane's rows."""
    for i in range(MT):
        for h in range(2):
            c, m = scale_min_k4(s0[i, h], s1[i, h], s2[i, h], sbk)
            sa[i, h] = dd[i, h] * u2f(c)
            sm[i, h] = dm[i, h] * u2f(m)


def _check(name: str, t, MT: int, WM: int, BN: int) -> None:
    """A kernel factory's arguments: a type the kernels read, BN a multiple of 8, MT and WM positive."""
    if t not in TYPES:
        raise ValueError(f"{name}: no quant-domain kernel for {GGMLType(t).name} (has: "
                         f"{', '.join(x.name for x in TYPES)})")
    if BN % 8 or MT < 1 or WM < 1:
        raise ValueError(f"{name}: BN={BN} must be a multiple of 8, MT={MT} and WM={WM} positive")


@cuda.jit(device=True, inline=True)
def _zero(acc, MT, NT):
    for i in range(MT):
        for jj in range(NT):
            for r in range(4):
                acc[i, jj, r] = float32(0.0)


@functools.lru_cache(maxsize=None)
def gemm_tcq_kernel(t, MT: int = 2, WM: int = 4, BN: int = 32, rwt: bool = False, MR: int = 0, PW: bool = False,
                    PF: bool = False):
    """Grouped GEMM on the quants (see the module docstring): block (row tile of 16 MT WM rows, BN-pair tile).

    Arguments (w32, w16, xh, xl, sx, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP): the weight's bytes as uint32 /
    float16, the split activations of `split_rows` (rows of I columns), y [*, O], per-matrix scales sc, row
    weights rw (rwt), the group table of BN-pair tiles. I % 256 == 0.

    Latency (a warp waits on its own loads: few warps fit beside ~240 registers): MR caps the registers a thread (0:
    the compiler's choice); PW loads a super-block's words for all four sub-block pairs at once (one wait a
    super-block, not four); PF loads the next 8-token tile's activations while the tensor cores work on this one."""
    _check("gemm_tcq_kernel", t, MT, WM, BN)
    NT = BN // 8
    BM = 16 * MT * WM
    RWT = rwt
    SCR = (WM, 32, 14) if SIM else (1, 1, 1)
    U = uint64

    @cuda.jit(**({"max_registers": MR} if MR and not SIM else {}))
    def gemm(w32, w16, xh, xl, sx, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP):
        scr = cuda.shared.array(SCR, float32)
        e, j0, j1 = tile_of(grp, GMAX, NP, cuda.blockIdx.y, BN)
        if e < 0:
            return
        tid = cuda.threadIdx.x
        wi = tid // 32
        lane = tid % 32
        g = lane >> 2
        q = lane & 3
        row0 = cuda.blockIdx.x * BM + wi * (16 * MT)
        if not SIM and row0 >= O:
            return
        cnt = j1 - j0
        njt = (cnt + 7) // 8                                 # 8-token column tiles holding pairs (block-uniform)
        rb = cuda.local.array((MT, 2), uint64)               # byte offset of each of the lane's rows
        _row_bytes(rb, e, estride, row0, g, O, rowb, MT)
        xb = cuda.local.array(NT, int64)
        xc = cuda.local.array((NT, 2), int64)
        _token_rows(grp, GMAX, j0, cnt, g, q, xb, xc, NT)
        acc = cuda.local.array((MT, NT, 4), float32)
        _zero(acc, MT, NT)
        dd = cuda.local.array((MT, 2), float32)
        dm = cuda.local.array((MT, 2), float32)
        s0 = cuda.local.array((MT, 2), uint32)
        s1 = cuda.local.array((MT, 2), uint32)
        s2 = cuda.local.array((MT, 2), uint32)
        qa = cuda.local.array((MT, 2), uint32)
        qb = cuda.local.array((MT, 2), uint32)
        sa = cuda.local.array((MT, 2), float32)
        sm = cuda.local.array((MT, 2), float32)
        af = cuda.local.array((MT, 16), uint32)              # A fragments of the 4 steps, 4 registers each
        wq = cuda.local.array((MT, 2, 8 if PW else 1), uint32)
        bh = cuda.local.array((2, 8), uint32)                # B fragments: hi / lo bits of the tile (PF: two tiles)
        bl = cuda.local.array((2, 8), uint32)
        tac = cuda.local.array((MT, 4), float32)
        nsb = I // SUB
        for kb in range(I // 256):
            _super_scales(w32, w16, rb, kb, dd, dm, s0, s1, s2, MT)
            if PW:
                for i in range(MT):
                    for h in range(2):
                        base = rb[i, h] + U(kb * TS)
                        for j in range(4):
                            wq[i, h, 2 * j] = ld32a(w32, base, 16 + 32 * j + 8 * q)
                            wq[i, h, 2 * j + 1] = ld32a(w32, base, 20 + 32 * j + 8 * q)
            for j in range(4):
                if PW:
                    for i in range(MT):
                        for h in range(2):
                            qa[i, h] = wq[i, h, 2 * j]
                            qb[i, h] = wq[i, h, 2 * j + 1]
                else:
                    _qs_words(w32, rb, kb, j, q, qa, qb, MT)
                for half in range(2):
                    sbk = 2 * j + half                      # sub-block of the super-block
                    _sub_scales(s0, s1, s2, dd, dm, sbk, sa, sm, MT)
                    _a_frags(qa, qb, half, af, MT)
                    col = kb * 256 + SUB * sbk + 8 * q
                    if PF:
                        _load_b(xh, xl, xb[0], I, col, bh, bl, 0)
                    for jj in range(NT):
                        if jj < njt:
                            if not PF:
                                _load_b(xh, xl, xb[jj], I, col, bh, bl, 0)
                            elif jj + 1 < NT:
                                if jj + 1 < njt:
                                    _load_b(xh, xl, xb[jj + 1], I, col, bh, bl, (jj + 1) % 2)
                            _tile(scr, wi, lane, af, bh, bl, jj % 2 if PF else 0, tac, MT)
                            _accumulate(acc, jj, tac, sa, sm, sx, xc, nsb, kb * 8 + sbk, MT)
        _store(y, grp, GMAX, NP, j0, cnt, O, row0, g, q, acc, sc, e, rw, RWT, MT, NT)
    return gemm


RW = TS // 4                 # words of one row's super-block in the staged kernel's shared memory
CH = TS // 16                # its 16-byte chunks (cp.async's unit)


@cuda.jit(device=True, inline=True)
def _stage(w32, Ws, wb, eb, blk0, O, rowb, kb, tid, BM, NTH):
    """Queue the asynchronous copy of super-block kb of the block's BM rows (rows past O: row O - 1) into Ws[wb:]."""
    for c in range(tid, BM * CH, NTH):
        r = c // CH
        k = c - CH * r
        src = (eb + uint64(min(blk0 + r, O - 1)) * uint64(rowb) + uint64(kb * TS)) >> uint64(2)
        cp_async16(Ws, wb + r * RW + 4 * k, w32, src + uint64(4 * k))


@functools.lru_cache(maxsize=None)
def gemm_tcq_staged_kernel(t, MT: int = 2, WM: int = 4, BN: int = 32, rwt: bool = False):
    """`gemm_tcq_kernel` with the block's weights staged through shared memory a super-block ahead (`cp.async`, two
    buffers of BM x 144 bytes): the warps read their A fragments and scales from shared memory while the next
    super-block's bytes are in flight, instead of each lane waiting on its own loads from L2 (measured: 48% of the
    cycles between issues, session 25). Same arguments, outputs and numbers (the same sums in the same order)."""
    _check("gemm_tcq_staged_kernel", t, MT, WM, BN)
    NT = BN // 8
    BM = 16 * MT * WM
    NTH = 32 * WM
    SW = BM * RW
    if 2 * SW * 4 > 48 * 1024:
        raise ValueError(f"gemm_tcq_staged_kernel: {BM} rows a block need {2 * SW * 4} bytes of static shared memory "
                         "(at most 48 KB: 16 MT WM <= 128)")
    RWT = rwt
    SCR = (WM, 32, 14) if SIM else (1, 1, 1)
    U = uint64
    WS_ = 2 * SW                                              # (a constant for numba)

    @cuda.jit
    def gemm(w32, w16, xh, xl, sx, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP):
        Ws = cuda.shared.array(WS_, uint32)
        scr = cuda.shared.array(SCR, float32)
        e, j0, j1 = tile_of(grp, GMAX, NP, cuda.blockIdx.y, BN)
        if e < 0:
            return
        tid = cuda.threadIdx.x
        wi = tid // 32
        lane = tid % 32
        g = lane >> 2
        q = lane & 3
        blk0 = cuda.blockIdx.x * BM
        lr0 = wi * (16 * MT)                                  # the warp's first row in the block
        cnt = j1 - j0
        njt = (cnt + 7) // 8
        xb = cuda.local.array(NT, int64)
        xc = cuda.local.array((NT, 2), int64)
        _token_rows(grp, GMAX, j0, cnt, g, q, xb, xc, NT)
        acc = cuda.local.array((MT, NT, 4), float32)
        _zero(acc, MT, NT)
        qa = cuda.local.array((MT, 2), uint32)
        qb = cuda.local.array((MT, 2), uint32)
        sa = cuda.local.array((MT, 2), float32)
        sm = cuda.local.array((MT, 2), float32)
        af = cuda.local.array((MT, 16), uint32)
        bh = cuda.local.array((2, 8), uint32)
        bl = cuda.local.array((2, 8), uint32)
        tac = cuda.local.array((MT, 4), float32)
        nsb = I // SUB
        KB = I // 256
        eb = U(e) * U(estride)
        _stage(w32, Ws, 0, eb, blk0, O, rowb, 0, tid, BM, NTH)
        cp_async_commit()
        for kb in range(KB):
            if kb + 1 < KB:
                _stage(w32, Ws, ((kb + 1) % 2) * SW, eb, blk0, O, rowb, kb + 1, tid, BM, NTH)
            cp_async_commit()                                 # (empty at the last: "1 pending" still means kb is in)
            cp_async_wait1()
            cuda.syncthreads()
            wb = (kb % 2) * SW
            for j in range(4):
                for i in range(MT):
                    for h in range(2):
                        o = wb + (lr0 + 16 * i + g + 8 * h) * RW + 4 + 8 * j + 2 * q
                        qa[i, h] = Ws[o]
                        qb[i, h] = Ws[o + 1]
                for half in range(2):
                    sbk = 2 * j + half
                    for i in range(MT):
                        for h in range(2):
                            o = wb + (lr0 + 16 * i + g + 8 * h) * RW
                            dw = Ws[o]
                            c, m = scale_min_k4(Ws[o + 1], Ws[o + 2], Ws[o + 3], sbk)
                            sa[i, h] = h2f(dw) * u2f(c)
                            sm[i, h] = h2f(dw >> uint32(16)) * u2f(m)
                    _a_frags(qa, qb, half, af, MT)
                    col = kb * 256 + SUB * sbk + 8 * q
                    for jj in range(NT):
                        if jj < njt:
                            _load_b(xh, xl, xb[jj], I, col, bh, bl, 0)
                            _tile(scr, wi, lane, af, bh, bl, 0, tac, MT)
                            _accumulate(acc, jj, tac, sa, sm, sx, xc, nsb, kb * 8 + sbk, MT)
            cuda.syncthreads()                                # buffer kb % 2 is refilled at kb + 2
        _store(y, grp, GMAX, NP, j0, cnt, O, blk0 + lr0, g, q, acc, sc, e, rw, RWT, MT, NT)
    return gemm


# ---------------------------------------------------------------- the half-precision variant (tcq_shape H=1)
#
# The same quant-domain sum on mma.m16n8k16 (f16 operands, float32 accumulators): q (0..15) is exact in f16 too and
# a k16 step holds twice a TF32 step's columns, so a 32-column sub-block takes 2 steps of two mma (q . hi, q . lo)
# where the TF32 kernel takes 4 of two. The activations are split into f16 halves after a power-of-two scale per
# row (`split16_rows`: the row's largest |x| brought into [2^14, 2^15), so neither half overflows and the small
# elements keep ~2^-24 of the row's largest in absolute terms, `hgemm.py`'s split); the row's sums of x per
# sub-block are scaled alike, and the outputs are scaled back (exactly: a power of two) before the store.
# A fragment: lane 4g + q's k slots (2q, 2q + 1, 2q + 8, 2q + 9) of step s take columns 8q + 4s + (0, 1, 2, 3) of
# the sub-block, so a lane again holds its own 8 contiguous columns: 4 bytes of qs a step, and its B fragments
# are one 16-byte load of hi and one of lo (8 halves: steps 0 and 1). A byte pair's nibbles become two f16
# integers without a conversion: prmt moves the bytes to the halves' low bytes, an and / or makes 1024 + n
# (0x6400 | n), one sub.f16x2 of 1024 leaves n exactly.
SPLIT16 = 32 if SIM else 256   # threads of a split block (a row)
TOP = 15                       # a row's largest |x| scaled into [2^(TOP-1), 2^TOP) (as hgemm.py)

if SIM:
    _R16 = np.arange(16)[:, None]
    _K16 = np.arange(16)[None, :]
    # A[row, k] of mma.m16n8k16: lane 4 (row % 8) + (k % 8) // 2, register row // 8 + 2 (k // 8), half k % 2
    A16_LANE, A16_REG, A16_HALF = (_R16 % 8) * 4 + (_K16 % 8) // 2, _R16 // 8 + 2 * (_K16 // 8), _K16 % 2
    # B[k, col]: lane 4 col + (k % 8) // 2, register 4 + k // 8, half k % 2
    _KK, _CC = np.arange(16)[:, None], np.arange(8)[None, :]
    B16_LANE, B16_REG, B16_HALF = 4 * _CC + (_KK % 8) // 2, 4 + _KK // 8 + 0 * _CC, _KK % 2 + 0 * _CC
    # C: the f32 accumulators of m16n8k16 lie as m16n8k8's (tc.C_ROW, tc.C_COL)

    def _halves(words):
        """uint32 words [..] -> their two IEEE halves [.., 2] as float64 (low half first)."""
        return np.asarray(words, np.uint32)[..., None].view(np.float16).astype(np.float64)

    def _f16_tile(f):
        h = _halves(f[:, :6].view(np.uint32))                       # [32 lanes, 6 registers, 2 halves]
        return h[A16_LANE, A16_REG, A16_HALF] @ h[B16_LANE, B16_REG, B16_HALF]     # [16, 16] @ [16, 8]

    @cuda.jit(device=True)
    def warp_mma16(scr, wi, lane, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """Simulator twin of `vec.mma_f16`: `tc.warp_exchange` with the 16 x 8 x 16 tile by the layouts above (the
        registers' bits as they are, two f16 halves each)."""
        return warp_exchange(scr, wi, lane, (a0, a1, a2, a3, b0, b1), (c0, c1, c2, c3), 0xFFFFFFFF, _f16_tile)

else:
    from .vec import mma_f16

    @cuda.jit(device=True, inline=True)
    def warp_mma16(scr, wi, lane, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)


@cuda.jit
def split16_kernel(x, xh, xl, sx, rs, K):
    """Row r of x [R, K] (a block) -> xh, xl [R * K] (f16 halves of x * 2^s), sx [R * K / 32] (each sub-block's sum
    of x * 2^s), rs[r] = 2^-s; s from the row's largest |x| (0 for a row of zeros; NaN / inf carry through)."""
    sm = cuda.shared.array(SPLIT16, float32)
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    s = row_scale_exp(x, r, K, sm, tid, SPLIT16, TOP)
    base = r * K
    for i0 in range(0, K, SPLIT16):                        # K % 32 == 0: every warp sums whole sub-blocks
        i = i0 + tid
        v = float32(0.0)
        if i < K:
            v = float32(math.ldexp(x[r, i], s))
            h = float16(v)
            xh[base + i] = h
            xl[base + i] = float16(v - float32(h))
        t = warp_sum(v)
        if i < K and i % SUB == 0:
            sx[(base + i) // SUB] = t
    if tid == 0:
        rs[r] = float32(math.ldexp(float32(1.0), -s))


def split16_rows(xd, stream=0, alloc=None):
    """(xh, xl, sx, rs) of xd [R, K] (a device array, K % 32 == 0) for the half-precision kernel: xh / xl as uint32
    words (two halves each), one launch. alloc(n, dtype): the scratch allocator (default numba's device_array)."""
    R, K = xd.shape
    alloc = alloc or (lambda n, dt: cuda.device_array(n, dtype=dt, stream=stream))
    xh, xl = alloc(R * K // 2, np.uint32), alloc(R * K // 2, np.uint32)
    sx, rs = alloc(R * K // SUB, np.float32), alloc(max(R, 1), np.float32)
    if R:
        split16_kernel[R, SPLIT16, stream](xd, xh.view(np.float16), xl.view(np.float16), sx, rs, K)
    return xh, xl, sx, rs


@cuda.jit(device=True, inline=True)
def _a_frags16(qa, qb, half, af, MT):
    """A fragments of one sub-block (nibble half `half` of the pair's bytes) for the 2 mma steps: step s register
    h + 2p (row g + 8 h, k slots 2q + 8p + {0, 1}) = columns 8q + 4s + 2p + {0, 1}: bytes 2p, 2p + 1 of qa (s = 0) or
    qb, as two f16 integers."""
    for i in range(MT):
        for h in range(2):
            for s in range(2):
                w = (qa[i, h] if s == 0 else qb[i, h]) >> uint32(4 * half)
                for p in range(2):
                    t = prmt(w, uint32(0), uint32(0x4140 if p == 0 else 0x4342))
                    t = (t & uint32(0x000F000F)) | uint32(0x64006400)
                    af[i, 4 * s + h + 2 * p] = hsub2(t, uint32(0x64006400))


@functools.lru_cache(maxsize=None)
def gemm_tcq16_kernel(t, MT: int = 4, WM: int = 2, BN: int = 32, rwt: bool = False):
    """`gemm_tcq_kernel` on mma.m16n8k16 (see the notes above): the activations from `split16_rows`.

    Arguments (w32, w16, xh, xl, sx, rs, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP): as `gemm_tcq_kernel` with
    xh / xl the f16 halves as uint32 words and rs each activation row's 2^-s."""
    _check("gemm_tcq16_kernel", t, MT, WM, BN)
    NT = BN // 8
    BM = 16 * MT * WM
    RWT = rwt
    SCR = (WM, 32, 14) if SIM else (1, 1, 1)
    U = uint64

    @cuda.jit
    def gemm(w32, w16, xh, xl, sx, rs, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP):
        scr = cuda.shared.array(SCR, float32)
        e, j0, j1 = tile_of(grp, GMAX, NP, cuda.blockIdx.y, BN)
        if e < 0:
            return
        tid = cuda.threadIdx.x
        wi = tid // 32
        lane = tid % 32
        g = lane >> 2
        q = lane & 3
        row0 = cuda.blockIdx.x * BM + wi * (16 * MT)
        if not SIM and row0 >= O:
            return
        cnt = j1 - j0
        njt = (cnt + 7) // 8
        rb = cuda.local.array((MT, 2), uint64)
        _row_bytes(rb, e, estride, row0, g, O, rowb, MT)
        xb = cuda.local.array(NT, int32)
        xc = cuda.local.array((NT, 2), int32)
        _token_rows(grp, GMAX, j0, cnt, g, q, xb, xc, NT)
        acc = cuda.local.array((MT, NT, 4), float32)
        _zero(acc, MT, NT)
        dd = cuda.local.array((MT, 2), float32)
        dm = cuda.local.array((MT, 2), float32)
        s0 = cuda.local.array((MT, 2), uint32)
        s1 = cuda.local.array((MT, 2), uint32)
        s2 = cuda.local.array((MT, 2), uint32)
        qa = cuda.local.array((MT, 2), uint32)
        qb = cuda.local.array((MT, 2), uint32)
        sa = cuda.local.array((MT, 2), float32)
        sm = cuda.local.array((MT, 2), float32)
        af = cuda.local.array((MT, 8), uint32)               # A fragments of the 2 steps, 4 registers each
        bh = cuda.local.array(4, uint32)                     # B fragments: 8 halves of hi, of lo
        bl = cuda.local.array(4, uint32)
        tac = cuda.local.array((MT, 4), float32)
        nsb = I // SUB
        for kb in range(I // 256):
            _super_scales(w32, w16, rb, kb, dd, dm, s0, s1, s2, MT)
            for j in range(4):
                _qs_words(w32, rb, kb, j, q, qa, qb, MT)
                for half in range(2):
                    sbk = 2 * j + half
                    _sub_scales(s0, s1, s2, dd, dm, sbk, sa, sm, MT)
                    _a_frags16(qa, qb, half, af, MT)
                    col = kb * 256 + SUB * sbk + 8 * q
                    for jj in range(NT):
                        if jj < njt:
                            xr = xb[jj]
                            if xr >= 0:
                                o = (U(xr) * U(I) + U(col)) >> U(1)
                                bh[0], bh[1], bh[2], bh[3] = ld4u(xh, o)
                                bl[0], bl[1], bl[2], bl[3] = ld4u(xl, o)
                            else:
                                for k in range(4):
                                    bh[k] = uint32(0)
                                    bl[k] = uint32(0)
                            for i in range(MT):
                                d0 = d1 = d2 = d3 = float32(0.0)
                                for st in range(2):
                                    d0, d1, d2, d3 = warp_mma16(scr, wi, lane, af[i, 4 * st], af[i, 4 * st + 1],
                                                                af[i, 4 * st + 2], af[i, 4 * st + 3], bh[2 * st],
                                                                bh[2 * st + 1], d0, d1, d2, d3)
                                    d0, d1, d2, d3 = warp_mma16(scr, wi, lane, af[i, 4 * st], af[i, 4 * st + 1],
                                                                af[i, 4 * st + 2], af[i, 4 * st + 3], bl[2 * st],
                                                                bl[2 * st + 1], d0, d1, d2, d3)
                                tac[i, 0] = d0
                                tac[i, 1] = d1
                                tac[i, 2] = d2
                                tac[i, 3] = d3
                            _accumulate(acc, jj, tac, sa, sm, sx, xc, nsb, kb * 8 + sbk, MT)
        for jj in range(NT):                                  # the rows' scale back (a power of two: exact)
            for tt in range(2):
                if xc[jj, tt] >= 0:
                    f = rs[xc[jj, tt]]
                    for i in range(MT):
                        for h in range(2):
                            acc[i, jj, 2 * h + tt] *= f
        _store(y, grp, GMAX, NP, j0, cnt, O, row0, g, q, acc, sc, e, rw, RWT, MT, NT)
    return gemm


def supported(t, I: int) -> bool:
    """Whether `gemm_tcq_kernel` reads a weight of type t with rows of I columns."""
    return t in TYPES and I % 256 == 0


__all__ = ["gemm_tcq_kernel", "gemm_tcq_staged_kernel", "gemm_tcq16_kernel", "split_rows", "split_kernel",
           "split16_rows", "split16_kernel", "supported", "TYPES"]
