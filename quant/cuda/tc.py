"""Tensor-core GEMM for prefill: the tiled GEMM of `gemv.py` with its inner product on `mma.sync` (3xTF32).

    gemm_tc_kernel(t, BM, WM, WN, rwt)    same signature and group table as `gemv.gemm_kernel`

A block computes BM output rows x BN = 32 (or 64) token pairs of one group (the group table's tiles).
Each K step of 128 columns decodes the [128, BM] weight tile into shared memory with the type's part
decoder (exact float32 weights, as every other kernel), stages the activations 32 columns at a time
(already split, below), and its WM x WN warps multiply them on the tensor cores: warp (wm, wn) owns rows wm*BM/WM .. and
tokens wn*32/WN ..; MT = BM/(16 WM) x NT = 32/(8 WN) tiles of `mma.m16n8k8` (TF32 in, float32
accumulators).

Accuracy: TF32 keeps 10 mantissa bits, so each float32 operand is split into hi = tf32(v) and lo = v - hi
(`vec.tf32_split`) and a product is summed as lo_a*hi_b + hi_a*lo_b + hi_a*hi_b ("3xTF32"; lo_a*lo_b,
~2^-22 of the product, is dropped, and the tensor core reads lo to 10 bits as well). The tensor core's
float32 additions truncate: summed there over a whole row of 14336 columns the result drifted by 1e-4
(relative RMS, measured on the H200), so it sums 32 columns at a time and the lanes add those partial
sums into float32 registers (round to nearest). `tests/test_cuda_kernels.py` holds it to 1e-5 as every
kernel.

Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k8", .tf32), lane = 4 g + q:
    A (16 x 8, row-major):  a[r] = A[g + 8 (r % 2), q + 4 (r // 2)]          r < 4
    B (8 x 8, column):      b[r] = B[q + 4 r, g]                              r < 2
    C, D (16 x 8):          c[r] = C[g + 8 (r // 2), 2 q + r % 2]             r < 4
In the CUDA simulator (no tensor cores, one Python thread per lane) `warp_mma` gathers the fragments of
the warp through shared memory by these same layouts and multiplies them with NumPy.

Shared memory (static, under 48 KB): W tile [128][BM + 8] float32 (the pad of 8 makes a fragment's 32
lanes hit 32 banks) + activation slice [32][32 + 4] as TF32 hi and lo bits.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int64, uint32, uint64

from .device import SIM
from .decoders import spec
from .gemv import part_of, tile_of
from .vec import tf32_split

KT = 128          # K columns decoded per step (a part of a 256-weight block spans up to 128 columns)
BN = 32           # token pairs per tile (the group table's tile); XH = 1024 / BN activation columns are
                  # staged (and summed on the tensor cores) at a time

if SIM:
    _L = np.arange(32)
    _ROW = np.arange(16)[:, None]
    _K = np.arange(8)[None, :]
    A_LANE, A_REG = (_ROW % 8) * 4 + _K % 4, _ROW // 8 + 2 * (_K // 4)        # A[row, k] lives there
    B_LANE, B_REG = (_K.T % 4) + 4 * np.arange(8)[None, :], 4 + _K.T // 4      # B[k, col]
    C_ROW = (_L[:, None] >> 2) + 8 * (np.arange(4)[None, :] // 2)               # c[r] of each lane
    C_COL = 2 * (_L[:, None] & 3) + np.arange(4)[None, :] % 2

    @cuda.jit(device=True)
    def warp_exchange(scr, wi, lane, frag, acc, mask, product):
        """What the simulator twins of the mma intrinsics share: each lane's six fragment registers (their bits and
        `mask`) and four accumulators meet in shared memory, lane 0 adds product(f) (f: the warp's scratch [32, 14]
        float32; -> the 16 x 8 tile A @ B, float64) to the accumulators by the C layout, every lane reads its four
        results back. Block-wide barriers: all threads of the block call it equally often."""
        for j in range(6):
            scr[wi, lane, j] = np.uint32(int(frag[j]) & mask).view(np.float32)
        for j in range(4):
            scr[wi, lane, 6 + j] = acc[j]
        cuda.syncthreads()
        if lane == 0:
            f = np.asarray(scr[wi], dtype=np.float32)
            c = np.zeros((16, 8))
            c[C_ROW, C_COL] = f[:, 6:10]
            scr[wi, :, 10:14] = (c + product(f))[C_ROW, C_COL].astype(np.float32)
        cuda.syncthreads()
        return scr[wi, lane, 10], scr[wi, lane, 11], scr[wi, lane, 12], scr[wi, lane, 13]

    def _tf32_tile(f):
        f = f.astype(np.float64)
        return f[A_LANE, A_REG] @ f[B_LANE, B_REG]

    @cuda.jit(device=True)
    def warp_mma(scr, wi, lane, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """Simulator twin of `vec.mma_tf32`: `warp_exchange` with the 16 x 8 x 8 tile by the layouts above (TF32
        operands: low 13 bits dropped)."""
        return warp_exchange(scr, wi, lane, (a0, a1, a2, a3, b0, b1), (c0, c1, c2, c3), 0xFFFFE000, _tf32_tile)

else:
    from .vec import mma_tf32

    @cuda.jit(device=True, inline=True)
    def warp_mma(scr, wi, lane, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)


@functools.lru_cache(maxsize=None)
def gemm_tc_kernel(t, BM: int = 64, WM: int = 2, WN: int = 1, rwt: bool = False, carve: int = -1, BN: int = BN,
                   causal: int = 0):
    """Grouped GEMM on the tensor cores: block (row tile, token tile) computes BM x 32 outputs, 32 WM WN threads.

    Needs I % 128 == 0 (as `gemm_kernel`); BM a multiple of 16 WM, BN a multiple of 8 WN. carve: the
    shared-memory carveout in percent of the SM's L1/shared (-1: the driver's choice). BN: token pairs per
    block, the tile size of the group table it reads (32, or 64 for a dense table built so: `ops.dense`);
    the activations are staged 1024 / BN columns at a time (shared memory stays under 48 KB).

    causal (a prefill attention's two products; no caller since the llama / qwen3moe device model, whose
    tensor-core attention used them, was folded into the generic path: docs/device_path.md): pair rows are
    t * CH + h and token t sees cache rows < cpos[0] + t + 1. 1: the rows are cache rows (scores = q . k): a block
    whose rows no token of its tile sees returns at once. 2: the columns are cache rows (out = p . v): the K loop
    stops after the last 128-column tile its tokens see. Other kernels ignore cpos and CH.
    """
    XH = 1024 // BN
    s = spec(t)
    dec, P, NV, R, RL, RS, BS, TS = s.dec, s.P, s.NV, s.R, s.RL, s.RS, s.BS, s.TS
    if BM % (16 * WM) or BN % (8 * WN):
        raise ValueError(f"gemm_tc_kernel: BM={BM} with WM={WM}, WN={WN} does not tile into 16 x 8 fragments")
    MT, NT = BM // (16 * WM), BN // (8 * WN)
    NW = WM * WN
    NTH = 32 * NW
    WP, XP = BM + 8, XH + 4
    NPK = KT * P // BS                      # parts per K tile per row
    RWT = rwt
    CAUSAL = causal
    SCR = (NW, 32, 14) if SIM else (1, 1, 1)

    if NTH % BM or NTH % XH or (XH * BN) % NTH or (BM * NPK) % NTH:
        raise ValueError(f"gemm_tc_kernel: {NTH} threads do not divide the {BM}-row / {XH}-column staging")
    DPT = BM * NPK // NTH                   # parts each thread decodes per K tile
    XPT = XH * BN // NTH                    # activations each thread stages per slice
    U = uint64
    WN_, XN_ = KT * WP, BN * XP              # shared array sizes (constants for numba)
    jit = cuda.jit if SIM or carve < 0 else cuda.jit(shared_memory_carveout=carve)

    # Shared arrays are flat and indexed by unsigned 64-bit offsets: per-thread bases computed once, the
    # unrolled constant parts fold into the load/store immediates (signed indices would cost numba's
    # negative-index wraparound on every access).
    @jit
    def gemm(w32, w16, tb, x, y, sc, rw, grp, O, I, rowb, estride, GMAX, NP, E, cpos, CH):
        Ws = cuda.shared.array(WN_, float32)         # [k][row], k-major
        Xh = cuda.shared.array(XN_, uint32)          # [token][k]: TF32 hi bits
        Xl = cuda.shared.array(XN_, uint32)          # lo bits
        scr = cuda.shared.array(SCR, float32)
        tid = cuda.threadIdx.x
        e, j0, j1 = tile_of(grp, GMAX, NP, cuda.blockIdx.y, BN)
        if e < 0:
            return
        row0 = cuda.blockIdx.x * BM
        kend = I
        if CAUSAL != 0:
            send = cpos[0] + grp[2 + 2 * GMAX + j1 - 1] // CH + 1      # cache rows the tile's last token sees
            if CAUSAL == 1 and row0 >= send:
                return
            if CAUSAL == 2:
                kend = min(I, (send + KT - 1) // KT * KT)
        wi = tid // 32
        lane = tid % 32
        gq = lane >> 2
        qq = lane & 3
        m0 = (wi % WM) * (MT * 16)
        n0 = (wi // WM) * (NT * 8)
        # stage-1 work of this thread: row dr of the tile, parts dq + i * (NTH / BM)
        dr = tid % BM
        dq = tid // BM
        rbase = U(e) * U(estride) + U(min(row0 + dr, O - 1)) * U(rowb)
        # stage-2 work: column xk of the slice, tokens xn + i * (NTH / XH); their activation rows
        xk = tid % XH
        xn = tid // XH
        xrow = cuda.local.array(XPT, int64)
        for i in range(XPT):
            n = xn + i * (NTH // XH)
            xrow[i] = grp[2 + 2 * GMAX + j0 + n] if j0 + n < j1 else -1
        abase = U(qq * WP + m0 + gq)                     # A fragment: Ws[k = kw + qq (+4)][row m0 + gq (+8)]
        bbase = U((n0 + gq) * XP + qq)                   # B fragment: X[token n0 + gq][k = ks + qq (+4)]
        v = cuda.local.array((1, NV), float32)
        acc = cuda.local.array((MT, NT, 4), float32)
        tac = cuda.local.array((MT, NT, 4), float32)
        ahi = cuda.local.array((MT, 4), uint32)
        alo = cuda.local.array((MT, 4), uint32)
        bhi = cuda.local.array((NT, 2), uint32)
        blo = cuda.local.array((NT, 2), uint32)
        for i in range(MT):
            for jj in range(NT):
                for r in range(4):
                    acc[i, jj, r] = float32(0.0)
        for k0 in range(0, kend, KT):
            # stage 1: decode the [BM rows, 128 cols] weight tile (consecutive threads: consecutive rows,
            # conflict-free stores)
            for i in range(DPT):
                bb, p = part_of(k0, dq + i * (NTH // BM), BS, KT, NPK, P)
                c0 = dec(w32, w16, tb, rbase + U(bb) * U(TS), p, v, 0)
                wb = U(bb * BS + c0 - k0) * U(WP) + U(dr)
                for q in range(R):
                    for k in range(RL):
                        Ws[wb + U((q * RS + k) * WP)] = v[0, q * RL + k]
            for h in range(KT // XH):
                # stage 2: the [BN tokens, XH cols] activation slice through the pair list (zeros past the
                # group), split into TF32 hi + lo once here (every warp reads it)
                col = U(k0 + h * XH + xk)
                for i in range(XPT):
                    xv = float32(0.0)
                    if xrow[i] >= 0:
                        xv = x[U(xrow[i]), col]
                    o = U((xn + i * (NTH // XH)) * XP) + U(xk)
                    Xh[o], Xl[o] = tf32_split(xv)
                cuda.syncthreads()
                # stage 3: 8 columns per mma step, A split here (each A element is read by one warp when WN = 1);
                # the tensor core accumulates XH columns (it truncates its float32 additions: a long sum there
                # drifts, ~1e-4 over 14336 columns), then the block's float32 accumulators add them, rounded
                for i in range(MT):
                    for jj in range(NT):
                        for r in range(4):
                            tac[i, jj, r] = float32(0.0)
                for ks in range(0, XH, 8):
                    ka = abase + U((h * XH + ks) * WP)
                    kb = bbase + U(ks)
                    for i in range(MT):
                        for r in range(4):
                            ahi[i, r], alo[i, r] = tf32_split(Ws[ka + U(4 * (r // 2) * WP + 8 * (r % 2) + 16 * i)])
                    for jj in range(NT):
                        for r in range(2):
                            bhi[jj, r] = Xh[kb + U(jj * 8 * XP + 4 * r)]
                            blo[jj, r] = Xl[kb + U(jj * 8 * XP + 4 * r)]
                    for term in range(3):
                        for i in range(MT):
                            for jj in range(NT):
                                if term == 0:
                                    a0, a1, a2, a3 = alo[i, 0], alo[i, 1], alo[i, 2], alo[i, 3]
                                    b0, b1 = bhi[jj, 0], bhi[jj, 1]
                                elif term == 1:
                                    a0, a1, a2, a3 = ahi[i, 0], ahi[i, 1], ahi[i, 2], ahi[i, 3]
                                    b0, b1 = blo[jj, 0], blo[jj, 1]
                                else:
                                    a0, a1, a2, a3 = ahi[i, 0], ahi[i, 1], ahi[i, 2], ahi[i, 3]
                                    b0, b1 = bhi[jj, 0], bhi[jj, 1]
                                d0, d1, d2, d3 = warp_mma(scr, wi, lane, a0, a1, a2, a3, b0, b1,
                                                      tac[i, jj, 0], tac[i, jj, 1], tac[i, jj, 2], tac[i, jj, 3])
                                tac[i, jj, 0] = d0
                                tac[i, jj, 1] = d1
                                tac[i, jj, 2] = d2
                                tac[i, jj, 3] = d3
                for i in range(MT):
                    for jj in range(NT):
                        for r in range(4):
                            acc[i, jj, r] += tac[i, jj, r]
                cuda.syncthreads()
        # stage 4: scales and scatter to the output rows of the pairs (fragment c[r]: row g + 8 (r // 2),
        # token 2 q + r % 2 of the 16 x 8 tile)
        for i in range(MT):
            for jj in range(NT):
                for r in range(4):
                    row = row0 + m0 + i * 16 + gq + 8 * (r // 2)
                    n = n0 + jj * 8 + 2 * qq + r % 2
                    if row < O and j0 + n < j1:
                        orow = grp[2 + 2 * GMAX + NP + j0 + n]
                        val = acc[i, jj, r] * sc[e]
                        if RWT:
                            val = val * rw[orow]
                        y[orow, row] = val
    return gemm


__all__ = ["gemm_tc_kernel", "warp_mma", "KT", "BN"]
