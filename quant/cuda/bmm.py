"""A batched product of float activations on the device, without cuBLAS: c[b] = a[b] @ b[b].

    bmm_device(a, b, c)      numba device arrays a [B, M, K], b [B, K, N], c [B, M, N] (one dtype), on a stream
    bmm(a, b)                CuPy arrays in, a CuPy array out, launched on CuPy's current stream
    bmm_parts(a, b)          the same for any batch count and rows (launches in parts where the grid is too small)

CuPy refuses to call cuBLAS while a stream is being captured into a CUDA graph, so a captured decode step
(refengine/cuda/graph_step.py) multiplies its activations (attention scores and values, the delta rule's state) here:
refengine/ops/products.py writes NumPy's matmul and einsum as this one product. One thread per output element, the
threads of a block along N (consecutive columns: the reads of b coalesce, a's row is shared), the sum over K in the
inputs' dtype in order k = 0, 1, ... (float summation order differs from cuBLAS's; NumPy's tests bound it). Sized
for a decode step's products (a few rows per batch); a prefill's large ones keep the library's product.

Products of float32 with at least TILED_MIN_M rows and TILED_MIN_N columns a batch (a fixed-shape ubatch's attention:
512 queries, the cache's capacity) take `_tiled_kernel`: a 64 x 64 output tile a block of 256 threads, each thread
4 x 4 outputs, the inputs staged 16 k-columns at a time through shared memory. Each output is still one thread's sum
in order k = 0, 1, ... with the same multiply-adds as `_bmm_kernel`: the two give the same bits (tests/test_products.py
compares them bit for bit). Decode steps (a token's rows: fewer than TILED_MIN_M) keep the one-thread kernel.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

THREADS = 128
MAX_GRID_YZ = 65535


@cuda.jit
def _bmm_kernel(a, b, c, zero):
    n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    m = cuda.blockIdx.y
    z = cuda.blockIdx.z
    if n < c.shape[2]:
        acc = zero
        for k in range(a.shape[2]):
            acc += a[z, m, k] * b[z, k, n]
        c[z, m, n] = acc


TB, TK = 64, 16                 # the tiled kernel's output tile (TB x TB) and k-columns staged at once
TBP = TB + 1                    # its shared rows, padded (a's tile is stored k-major: no bank conflicts)
TILED_MIN_M = 256               # float32 products of at least these rows and columns take it (a decode step's rows:
TILED_MIN_N = 64                # heads x 1 token, at most 128 on the registered archs, stay on `_bmm_kernel`)


@cuda.jit
def _tiled_kernel(a, b, c):
    """c[z] = a[z] @ b[z], float32: block (column tile, row tile, batch) of 16 x 16 threads, thread (tx, ty) the
    outputs rows ty + 16 i, columns tx + 16 j (i, j < 4); each output summed in order over k as `_bmm_kernel`."""
    As = cuda.shared.array((TK, TBP), float32)             # [k][row]
    Bs = cuda.shared.array((TK, TBP), float32)             # [k][col]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tid = ty * 16 + tx
    z = cuda.blockIdx.z
    m0 = cuda.blockIdx.y * TB
    n0 = cuda.blockIdx.x * TB
    M, K, N = a.shape[1], a.shape[2], b.shape[2]
    acc = cuda.local.array((4, 4), float32)
    for i in range(4):
        for j in range(4):
            acc[i, j] = float32(0.0)
    for k0 in range(0, K, TK):
        for r in range(4):                                  # 1024 elements of each tile, 4 a thread
            e = tid + 256 * r
            ra, ka = e // TK, e % TK                        # a: consecutive threads along k (a's rows are k-major)
            kb, cb = e // TB, e % TB                        # b: consecutive threads along n (coalesced)
            As[ka, ra] = a[z, m0 + ra, k0 + ka] if m0 + ra < M and k0 + ka < K else float32(0.0)
            Bs[kb, cb] = b[z, k0 + kb, n0 + cb] if k0 + kb < K and n0 + cb < N else float32(0.0)
        cuda.syncthreads()
        for kk in range(min(TK, K - k0)):                   # (no padded k: each sum has exactly K terms, in order)
            for i in range(4):
                av = As[kk, ty + 16 * i]
                for j in range(4):
                    acc[i, j] += av * Bs[kk, tx + 16 * j]
        cuda.syncthreads()
    for i in range(4):
        for j in range(4):
            m = m0 + ty + 16 * i
            n = n0 + tx + 16 * j
            if m < M and n < N:
                c[z, m, n] = acc[i, j]


def tiled(M: int, N: int, dtype) -> bool:
    """Whether `bmm_device` takes the tiled kernel for a product of M rows x N columns a batch."""
    return np.dtype(dtype) == np.float32 and M >= TILED_MIN_M and N >= TILED_MIN_N


MAX_ROWS = 1024          # a decode step's products have few rows per batch (MLA's scores: heads x 1 token)


def fits(B: int, M: int) -> bool:
    """This kernel takes the product: B batches of at most MAX_ROWS rows (a decode step's shapes; the grid's y and z
    are at most 65535). A prefill's larger products keep the library's (they are never captured)."""
    return 0 < B <= MAX_GRID_YZ and 0 < M <= MAX_ROWS


def bmm_device(a, b, c, stream=0, kernel: str = "auto") -> None:
    """c = a @ b per batch on the device. kernel: "auto" (the tiled kernel where `tiled` says so), "tiled" (float32
    only), "thread" (one thread an output)."""
    B, M, K = a.shape
    N = b.shape[2]
    if b.shape[:2] != (B, K) or c.shape != (B, M, N):
        raise ValueError(f"bmm: shapes {a.shape} @ {b.shape} -> {c.shape}")
    if N == 0 or M == 0 or B == 0:
        return
    if not (0 < B <= MAX_GRID_YZ and 0 < M <= MAX_GRID_YZ):
        raise ValueError(f"bmm: {B} batches of {M} rows do not fit one launch grid")
    if kernel not in ("auto", "tiled", "thread"):
        raise ValueError(f"bmm: kernel {kernel!r} (auto, tiled, thread)")
    if kernel == "tiled" and c.dtype != np.float32:
        raise ValueError(f"bmm: the tiled kernel is float32 only, got {c.dtype}")
    if kernel == "tiled" or (kernel == "auto" and tiled(M, N, c.dtype)):
        _tiled_kernel[(math.ceil(N / TB), math.ceil(M / TB), B), (16, 16), stream](a, b, c)
        return
    _bmm_kernel[(math.ceil(N / THREADS), M, B), THREADS, stream](a, b, c, c.dtype.type(0))


def bmm_parts(a, b):
    """`bmm` for any B and M (`fits` keeps the kernel to a decode step's shapes): one launch when the grid holds B
    and M, else parts of at most MAX_GRID_YZ batches and rows, each its own launch into the one result. For a
    captured prefill's large products of activations, which cuBLAS takes outside a capture; each output element is
    still one thread's sum over K in order."""
    B, M = a.shape[0], a.shape[1]
    if B <= MAX_GRID_YZ and M <= MAX_GRID_YZ:
        return bmm(a, b)
    import cupy as cp
    c = cp.empty((B, M, b.shape[2]), dtype=np.result_type(a.dtype, b.dtype))
    for z in range(0, B, MAX_GRID_YZ):
        for m in range(0, M, MAX_GRID_YZ):
            c[z:z + MAX_GRID_YZ, m:m + MAX_GRID_YZ] = bmm(a[z:z + MAX_GRID_YZ, m:m + MAX_GRID_YZ],
                                                          b[z:z + MAX_GRID_YZ])
    return c


def bmm(a, b):
    """CuPy a [B, M, K] @ b [B, K, N] -> [B, M, N] on CuPy's current stream (a, b C-contiguous, one dtype)."""
    import cupy as cp

    from .streams import current_stream, numba_view
    dt = np.result_type(a.dtype, b.dtype)
    a = cp.ascontiguousarray(a, dtype=dt)
    b = cp.ascontiguousarray(b, dtype=dt)
    c = cp.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=dt)
    if c.size:
        if a.shape[2] == 0:
            c.fill(0)
        else:
            bmm_device(numba_view(a), numba_view(b), numba_view(c), current_stream())
    return c
