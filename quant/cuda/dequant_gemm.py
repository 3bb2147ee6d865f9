"""Prefill products on cuBLAS: the packed weight decoded to float32 on the device, then cuBLAS's float32 GEMM.

    dense_sgemm(w, x, y)     y [T, O] = x [T, I] @ dequantize(w).T        (CuPy arrays, CuPy's current stream)
    heads_sgemm(w, x, y)     y [H, T, O] = x [H, T, I] @ dequantize(w)[h].T for each head (one batched GEMM a chunk)
    decoded_chunks(dw, ...)  the decoded rows, `rows` at a time, into one scratch buffer (the two above use it)

Why: at hundreds of tokens a product is bound by arithmetic, not by reading the packed weight. The tensor-core
kernel of `tc.py` decodes each weight tile once per 32 tokens and multiplies in 3xTF32 (three `mma.sync` a
product, for float32 accuracy). Decoding the whole matrix once (`rows.rows_kernel`, or `staged_kernel`: the
products' own decoders, so the float32 weights are `quant.ref.dequantize`'s bit for bit) and calling cuBLAS's SGEMM
(CuPy's matmul, CUBLAS_COMPUTE_32F: float32 FMA, no TF32 unless the user sets CUPY_TF32) is the same precision with
cuBLAS's tiling: on the H200 the dense products of a DeepSeek-V3 2-block prefill of 512 tokens took 32 ms on the
tensor cores and 17 ms this way plus 5 ms of decoding (BENCHMARKS.md, issue 23's section). The decoded rows
go through one scratch buffer of at most CHUNK_ELEMS floats (256 MB), reused product after product; a larger
matrix runs as several GEMMs over row chunks, so memory stays bounded whatever the weight.

`ops.SGEMM_MIN` (KernelPolicy.sgemm_min) is the token count from which `resident.matmul_resident` takes this path
(0: never); it serves 2-D weights and 3-D per-head weights; the expert dispatch keeps the grouped kernels (a
prefill's experts see few tokens each: decoding every expert whole would cost more than it saves).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, uint64

from . import ops
from .decoders import spec
from .rows import THREADS, rows_kernel
from .streams import numba_view
from .weights import DeviceWeight

CHUNK_ELEMS = 1 << 26          # float32 elements of decoded weight held at once (256 MB)
GRID_Y = 65535                 # a launch's grid.y limit: rows decoded per launch
STAGE_THREADS = 128            # the staged decoder's block
STAGE_FLOATS = 4096            # its shared-memory row segment (16 KB)

_SCRATCH: dict = {}


def _scratch(n: int, alloc):
    """One float32 buffer of at least n elements per allocator (grown, never shrunk)."""
    buf = _SCRATCH.get(alloc)
    if buf is None or buf.shape[0] < n:
        buf = _SCRATCH[alloc] = alloc(n)
    return buf


@functools.lru_cache(maxsize=8)
def _row_ids(n: int):
    return cuda.to_device(np.arange(n, dtype=np.int64))


def rows_per_chunk(dw: DeviceWeight, chunk_elems: int | None = None) -> int:
    return max(1, min((chunk_elems or CHUNK_ELEMS) // dw.I, dw.E * dw.O))


@functools.lru_cache(maxsize=None)
def staged_kernel(t):
    """A block decodes BPB whole quant blocks of one row into shared memory (the decoders' scattered runs), then
    writes them out as consecutive floats (coalesced): the same values as `rows.rows_kernel`, bit for bit. None
    when a block's parts do not fit STAGE_THREADS."""
    s = spec(t)
    dec, P, NV, R, RL, RS, BS, TS = s.dec, s.P, s.NV, s.R, s.RL, s.RS, s.BS, s.TS
    BPB = min(STAGE_THREADS // P, STAGE_FLOATS // BS)
    if BPB < 1:
        return None
    N = BPB * BS

    @cuda.jit
    def decode(w32, w16, tb, out, rowb, NB, r0):
        sm = cuda.shared.array(N, float32)
        tid = cuda.threadIdx.x
        row = cuda.blockIdx.y
        b0 = cuda.blockIdx.x * BPB                          # the row's first quant block of this CUDA block
        j = tid // P
        if j < BPB and b0 + j < NB:
            v = cuda.local.array((1, NV), float32)
            base = uint64(r0 + row) * uint64(rowb) + uint64(b0 + j) * uint64(TS)
            c0 = dec(w32, w16, tb, base, tid - j * P, v, 0)
            for q in range(R):
                for k in range(RL):
                    sm[j * BS + c0 + q * RS + k] = v[0, q * RL + k]
        cuda.syncthreads()
        n = min(BPB, NB - b0) * BS
        for i in range(tid, n, STAGE_THREADS):
            out[row, b0 * BS + i] = sm[i]
    return decode, BPB


def decode_rows(dw: DeviceWeight, r0: int, r1: int, out, stream=0) -> None:
    """out [r1 - r0, I] float32 (a numba device array) = rows r0..r1 of the weight seen as [E * O, I], decoded:
    by `rows.rows_kernel` (one thread per block part, each writing its runs of columns) or, with ops.SGEMM_DECODE =
    "staged" (KernelPolicy.sgemm_decode), by `staged_kernel` (the same values, written coalesced)."""
    s = spec(dw.type)
    NB = dw.I // s.BS
    staged = staged_kernel(dw.type) if ops.SGEMM_DECODE == "staged" else None
    ids = None if staged else _row_ids(dw.E * dw.O)
    for a in range(r0, r1, GRID_Y):
        b = min(r1, a + GRID_Y)
        if staged:
            k, bpb = staged
            k[(math.ceil(NB / bpb), b - a), STAGE_THREADS, stream](dw.w32, dw.w16, dw.tab, out[a - r0:b - r0],
                                                                  dw.rowb, NB, a)
        else:
            rows_kernel(dw.type)[(math.ceil(NB * s.P / THREADS), b - a), THREADS, stream](
                dw.w32, dw.w16, dw.tab, ids[a:b], out[a - r0:b - r0], dw.rowb, NB)


def decoded_chunks(dw: DeviceWeight, alloc, view, *, rows: int | None = None, stream=0):
    """Yield (r0, r1, W) with W [r1 - r0, I] the decoded rows r0..r1 of the weight as [E * O, I], in one scratch
    buffer from alloc(n) (CuPy's or numba's allocator), `view` giving numba's view of a slice of it."""
    R, I = dw.E * dw.O, dw.I
    rc = min(rows or rows_per_chunk(dw), R)
    buf = _scratch(rc * I, alloc)
    for r0 in range(0, R, rc):
        r1 = min(R, r0 + rc)
        W = buf[:(r1 - r0) * I].reshape(r1 - r0, I)
        decode_rows(dw, r0, r1, view(W), stream)
        yield r0, r1, W


def _cupy():
    import cupy
    return cupy


def _cp_alloc(n):
    return _cupy().empty(n, dtype=np.float32)


def dense_sgemm(dw: DeviceWeight, x, y, *, stream=0, rows: int | None = None) -> None:
    """y [T, O] = x [T, I] @ W.T (CuPy float32 arrays; W = dw decoded, 2-D)."""
    cp = _cupy()
    O = dw.O
    for r0, r1, W in decoded_chunks(dw, _cp_alloc, numba_view, rows=rows, stream=stream):
        if r0 == 0 and r1 == O:
            cp.matmul(x, W.T, out=y)
        else:
            y[:, r0:r1] = cp.matmul(x, W.T)


def heads_sgemm(dw: DeviceWeight, x, y, *, stream=0, rows: int | None = None) -> None:
    """y [H, T, O] = x [H, T, I] @ W[h].T per head (W = dw decoded, [H, O, I]): a batched GEMM per chunk of whole
    heads."""
    cp = _cupy()
    O, I = dw.O, dw.I
    per = max(1, (rows or rows_per_chunk(dw)) // O)
    for r0, r1, W in decoded_chunks(dw, _cp_alloc, numba_view, rows=per * O, stream=stream):
        h0, h1 = r0 // O, r1 // O
        cp.matmul(x[h0:h1], W.reshape(h1 - h0, O, I).transpose(0, 2, 1), out=y[h0:h1])
