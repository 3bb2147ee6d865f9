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
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda

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


MAX_ROWS = 1024          # a decode step's products have few rows per batch (MLA's scores: heads x 1 token)


def fits(B: int, M: int) -> bool:
    """This kernel takes the product: B batches of at most MAX_ROWS rows (a decode step's shapes; the grid's y and z
    are at most 65535). A prefill's larger products keep the library's (they are never captured)."""
    return 0 < B <= MAX_GRID_YZ and 0 < M <= MAX_ROWS


def bmm_device(a, b, c, stream=0) -> None:
    B, M, K = a.shape
    N = b.shape[2]
    if b.shape[:2] != (B, K) or c.shape != (B, M, N):
        raise ValueError(f"bmm: shapes {a.shape} @ {b.shape} -> {c.shape}")
    if N == 0 or M == 0 or B == 0:
        return
    if not (0 < B <= MAX_GRID_YZ and 0 < M <= MAX_GRID_YZ):
        raise ValueError(f"bmm: {B} batches of {M} rows do not fit one launch grid")
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
