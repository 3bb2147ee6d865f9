"""The two parallel Numba drivers, specialized per ggml type and compiled lazily on first use.

    kernels(kind).gemv(raw, x, xs, seg, active, y, tile)  matrices with one activation row each
        (x there is dot.x_lanes(kind, x) and xs = dot.x_sums(kind, x): the row as the kernel reads it)
    kernels(kind).gemm(raw, x, seg, active, y, tile)      matrices with several
        raw: uint8 [E, O, row_bytes]   packed weights of E matrices (E = 1 for a plain matmul)
        x:   f32 [N, I]                activation rows, grouped: matrix e owns rows seg[e]:seg[e+1]
        active: int64 [A]              the matrices to compute; the others are not read
        y:   f32 [N, O]                y[n] = x[n] @ W_e.T for the e that owns row n
    kernels(kind).dequant_rows(raw, out)       raw [R, row_bytes] -> out f32 [R, I]

Thread split: the work items are (active matrix, tile of `tile` weight rows), handed out by
`prange`; each thread decodes every weight row of its tile exactly once:
  - gemv: the fused kernel of dot.py consumes the bytes directly, once per activation row
    (T = 1, decode-time MoE, and batches up to `gemv_max_rows` where decoding again beats scratch);
    with one activation row, the types in dot.PAIRED_GEMV read two weight rows in step (row_dot2);
  - gemm: CHUNK weights of the row are decoded into a per-item float32 scratch (dequant.py), then
    one vectorized dot per activation row against it (float64 running sums per row).
The two are separate kernels on purpose: in one parallel loop body LLVM compiled the fused path
a third slower. Nothing of size O x I is ever materialized.

`kind` is a closure constant: `deq_block` / `row_dot` resolve it while Numba types the kernel
(overloads with `prefer_literal`), so each type compiles only its own decoder, and `cache=True`
stores the result next to this file for the next process. Tile sizes (`tile` rows per work item,
CHUNK weights per scratch step) are arguments / module constants, not baked into the kernels.
"""
from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from functools import cache

import numpy as np
from numba import njit, prange

from ..formats import type_info
from .dequant import KINDS, deq_block
from .dot import FUSED, PAIRED_GEMV, row_dot, row_dot2
from .llvm import ld

# reassociation lets LLVM vectorize the reductions, contraction gives FMAs; no nnan/ninf:
# NaN and inf in a weight must reach the output exactly as in the NumPy oracle.
FASTMATH = {"reassoc", "contract", "nsz"}
CHUNK = 256             # weights decoded to scratch per step of the non-fused path


def _source_version() -> int:
    """crc32 of the kernel sources this file inlines. Numba's on-disk cache only watches the file of
    the cached function (this one); the kernels capture this number as a closure variable, which is
    part of the cache key, so editing dequant.py, dot.py, llvm.py, simd.py or tables.py recompiles them."""
    here = os.path.dirname(os.path.abspath(__file__))
    crc = 0
    for name in ("dequant.py", "dot.py", "llvm.py", "simd.py", "tables.py"):
        with open(os.path.join(here, name), "rb") as f:
            crc = zlib.crc32(f.read(), crc)
    return crc


SOURCE_VERSION = _source_version()


@dataclass(frozen=True)
class Kernels:
    kind: int
    gemv: object            # None for a type without a fused kernel
    gemm: object
    dequant_rows: object


@cache
def kernels(kind: int) -> Kernels:
    """The compiled drivers for ggml type id `kind` (compiled at their first call, not here)."""
    if kind not in KINDS:
        raise KeyError(kind)
    info = type_info(kind)
    bs, ts = info.block_size, info.type_size
    chunk = max(CHUNK, bs)
    paired = kind in PAIRED_GEMV                                # gemv reads weight rows two at a time
    version = SOURCE_VERSION                                    # in the cache key (see _source_version)

    @njit(cache=True, parallel=True)
    def dequant_rows(raw, out):
        if version < 0:                                         # never true; keeps `version` a closure cell
            return
        nb = out.shape[1] // bs
        for r in prange(raw.shape[0]):
            row = raw[r]
            dst = out[r]
            for b in range(nb):
                deq_block(kind, row, ts * b, dst, bs * b)

    @njit(cache=True, parallel=True, fastmath=FASTMATH)
    def gemv(raw, x, xs, seg, active, y, tile):
        """Fused decode + dot on the bytes, once per activation row of the matrix (few rows: the
        weight row is decoded again for each, but read from memory once; it stays in L1).
        x: the activation rows in the kernel's lane order, xs: their group sums (dot.x_lanes, x_sums)."""
        if version < 0:
            return
        O = raw.shape[1]
        ntiles = (O + tile - 1) // tile
        for item in prange(active.size * ntiles):
            e = active[item // ntiles]
            r0 = (item % ntiles) * tile
            r1 = min(O, r0 + tile)
            we = raw[e]
            n0, n1 = seg[e], seg[e + 1]
            r = r0
            if paired and n1 - n0 == 1:                         # one activation row: weight rows in pairs
                while r + 1 < r1:
                    y[n0, r], y[n0, r + 1] = row_dot2(kind, we[r], we[r + 1], x[n0], xs[n0])
                    r += 2
            for rr in range(r, r1):                             # the others (and an odd last row) one by one
                for n in range(n0, n1):
                    y[n, rr] = row_dot(kind, we[rr], x[n], xs[n])

    @njit(cache=True, parallel=True, fastmath=FASTMATH)
    def gemm(raw, x, seg, active, y, tile):
        """Small batches: decode CHUNK weights once into scratch, use them for all the matrix's rows."""
        if version < 0:
            return
        O = raw.shape[1]
        I = x.shape[1]
        ntiles = (O + tile - 1) // tile
        for item in prange(active.size * ntiles):
            e = active[item // ntiles]
            r0 = (item % ntiles) * tile
            n0 = seg[e]
            n = seg[e + 1] - n0
            w = np.empty(chunk, np.float32)                     # per-item scratch
            acc = np.empty(n, np.float64)
            for r in range(r0, min(O, r0 + tile)):
                row = raw[e, r]
                acc[:] = 0.0
                for c0 in range(0, I, chunk):
                    c1 = min(I, c0 + chunk)
                    for b in range(c0 // bs, c1 // bs):
                        deq_block(kind, row, ts * b, w, bs * b - c0)
                    for t in range(n):
                        xt = x[n0 + t]
                        s = np.float32(0)
                        for i in range(c1 - c0):
                            s += ld(w, i) * ld(xt, c0 + i)
                        acc[t] += s
                for t in range(n):
                    y[n0 + t, r] = acc[t]

    return Kernels(kind, gemv if kind in FUSED else None, gemm, dequant_rows)
