"""Prefill products on cuBLAS's half-precision tensor cores at float32 accuracy: each operand split in two halves.

    dense_h3(dw, x, y)       y [T, O] = x [T, I] @ dequantize(w).T        (CuPy arrays, CuPy's current stream)
    heads_h3(dw, x, y)       y [H, T, O] = x [H, T, I] @ dequantize(w)[h].T per head
    split_rows(src, hl, e, hi_at)      the split of float32 rows (a kernel; below)
    combine(c1, c2, ex, ew, y)         the result from the partial products (a kernel; below)

Why: cuBLAS's float32 GEMM (`dequant_gemm.py`) runs on the CUDA cores, ~50 TFLOP/s on the H200; its float16
GEMM with float32 accumulation runs on the tensor cores at several times that. A float16 operand carries 11
significant bits, so each float32 operand v is split into two: hi = f16(v * 2^s), lo = f16(v * 2^s - hi), with s
a power of two per row that brings the row's largest |v| into [2^14, 2^15) (float16's range: no overflow, and
the small elements keep ~2^-24 absolute precision). Then

    x . w = 2^-(s_x + s_w) (xh . wh + xh . wl + xl . wh)         (xl . wl, ~2^-22 of the product, dropped)

each product of two float16 values exact in float32. Three products instead of one: "3xFP16", as `tc.py`'s
3xTF32. The tensor core's float32 sums truncate rather than round (`tc.py`: summed over 14336 columns the result
drifted by 1e-4, relative RMS), so the large product xh . wh runs as a batched GEMM over K chunks of `kc` columns
(ops.H3_KC, KernelPolicy.h3_kc; one partial result each) and `combine` adds the partials and the two small
products (whose truncation is ~2^-11 of theirs) in float32 registers, round to nearest, then scales by
2^-(s_x + s_w) (exact).

Memory: the weight is decoded (`dequant_gemm.decoded_chunks`: float32, a chunk of rows at a time), split into one
float16 buffer [2, rows, K] (lo, hi), and the partials [K / kc, T, rows] are bounded by PARTIAL_ELEMS (the row
chunk shrinks when T is large): all scratch reused product after product.

On the simulator (no cuBLAS) `gemm16` multiplies with NumPy in float32 (each fp16 product exact; the sums
rounded): the orchestration, the split and the combine are what CI checks there.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from . import ops
from .dequant_gemm import GRID_Y, decoded_chunks, rows_per_chunk
from .device import SIM, row_scale_exp
from .streams import numba_view
from .weights import DeviceWeight

from numba.core.types import float16

PARTIAL_ELEMS = 1 << 26         # float32 elements of partial results held at once (256 MB)
SPLIT_THREADS = 32 if SIM else 256       # (the simulator runs a Python thread per CUDA thread)
TOP = 15                        # a row's largest |v| scaled into [2^(TOP-1), 2^TOP)

# cuBLAS / CUDA enum values (cublas_api.h, library_types.h)
_OP_N, _OP_T = 0, 1
_R_16F, _R_32F = 2, 0
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1
_POINTER_MODE_HOST = 0


@cuda.jit
def split_kernel(src, hl, e, hi_at):
    """Row r of src [R, K] (float32) -> hl[hi_at, r] = hi, hl[1 - hi_at, r] = lo (float16), e[r] = s: the row
    scaled by 2^s, s from its largest |v| (0 for a row of zeros; NaN and inf carry through to hi)."""
    sm = cuda.shared.array(SPLIT_THREADS, float32)
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    K = src.shape[1]
    s = row_scale_exp(src, r, K, sm, tid, SPLIT_THREADS, TOP)
    lo_at = 1 - hi_at
    for i in range(tid, K, SPLIT_THREADS):
        v = float32(math.ldexp(src[r, i], s))
        h = float16(v)
        hl[hi_at, r, i] = h
        hl[lo_at, r, i] = float16(v - float32(h))
    if tid == 0:
        e[r] = s


@cuda.jit
def combine_kernel(c1, c2, ex, ew, y, r0):
    """y[g, t, r0 + r] = 2^-(ex[g, t] + ew[g, r]) (sum_b c1[b, g, t, r] + c2[0, g, t, r] + c2[1, g, t, r])."""
    r = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    g = cuda.blockIdx.z
    B, _, T, R = c1.shape
    if r >= R:
        return
    for t in range(cuda.blockIdx.y, T, cuda.gridDim.y):
        acc = c1[0, g, t, r]
        for b in range(1, B):
            acc += c1[b, g, t, r]
        acc += c2[0, g, t, r]
        acc += c2[1, g, t, r]
        y[g, t, r0 + r] = float32(math.ldexp(acc, -(int(ex[g, t]) + int(ew[g, r]))))


def _xp():
    if SIM:
        return np
    import cupy
    return cupy


def _view(a):
    return a if SIM else numba_view(a)


def split_rows(src, hl, e, hi_at: int, stream=0) -> None:
    """src [R, K] float32 -> hl [2, R, K] float16 (hi at hl[hi_at]), e [R] int32 (device arrays, CuPy or NumPy)."""
    R = src.shape[0]
    if R:
        split_kernel[R, SPLIT_THREADS, stream](_view(src), _view(hl), _view(e), hi_at)


def combine(c1, c2, ex, ew, y, r0: int = 0, stream=0) -> None:
    """c1 [B, G, T, R], c2 [2, G, T, R], ex [G, T], ew [G, R] -> y[:, :, r0:r0 + R] (y [G, T, >= r0 + R])."""
    _, G, T, R = c1.shape
    if T and R:
        combine_kernel[(math.ceil(R / 128), min(T, GRID_Y), G), 128, stream](
            _view(c1), _view(c2), _view(ex), _view(ew), _view(y), r0)


def _cublas():
    try:
        from cupy_backends.cuda.libs import cublas
    except ImportError:                                       # pragma: no cover
        from cupy.cuda import cublas
    return cublas


_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)


def gemm16(a, b, c) -> None:
    """c[n] = b[n] @ a[n].T for each n: a [N, R, k], b [N, T, k] float16 (last axis contiguous, rows and batch
    strided), c [N, T, R] float32 contiguous. One cuBLAS strided-batched GEMM (tensor cores, float32 sums)."""
    N, R, k = a.shape
    T = b.shape[1]
    if SIM:
        c[...] = np.matmul(b.astype(np.float32), a.astype(np.float32).transpose(0, 2, 1))
        return
    import cupy
    assert a.strides[2] == 2 and b.strides[2] == 2 and c.flags.c_contiguous, "gemm16: layout"
    cb = _cublas()
    h = cupy.cuda.device.get_cublas_handle()
    cb.setPointerMode(h, _POINTER_MODE_HOST)
    cb.gemmStridedBatchedEx(
        h, _OP_T, _OP_N, R, T, k, _ONE.ctypes.data,
        a.data.ptr, _R_16F, a.strides[1] // 2, a.strides[0] // 2 if N > 1 else 0,
        b.data.ptr, _R_16F, b.strides[1] // 2, b.strides[0] // 2 if N > 1 else 0,
        _ZERO.ctypes.data, c.data.ptr, _R_32F, R, T * R, N, _COMPUTE_32F, _GEMM_DEFAULT)


_SCRATCH: dict = {}


def _buf(name: str, shape, dtype):
    """A scratch array of this shape (grown, never shrunk; one per name)."""
    xp = _xp()
    n = int(np.prod(shape))
    buf = _SCRATCH.get(name)
    if buf is None or buf.size < n or buf.dtype != dtype:
        buf = _SCRATCH[name] = xp.empty(n, dtype=dtype)
    return buf[:n].reshape(shape)


def _alloc(n):
    return _xp().empty(n, dtype=np.float32)


def _chunked(m, nb: int, kc: int):
    """m [rows, K] (rows contiguous) seen as [nb, rows, kc]: its first nb chunks of kc columns (a view)."""
    xp = _xp()
    st = m.strides
    return xp.lib.stride_tricks.as_strided(m, shape=(nb, m.shape[0], kc), strides=(kc * st[1], st[0], st[1]))


def _products(xhl, ex, whl, ew, y, r0: int, kc: int, stream) -> None:
    """y[:, :, r0:r0 + R] from the split operands: xhl [2, G, T, K] (hi, lo), ex [G, T]; whl [2, G, R, K] (lo, hi),
    ew [G, R].
    One group (a 2-D weight): the K chunks as one batched GEMM; G groups (heads): a batched GEMM over the groups
    per chunk. Then the two small products, batched, and `combine`."""
    _, G, T, K = xhl.shape
    R = whl.shape[2]
    nb = K // kc
    B = nb + (1 if K % kc else 0)
    c1 = _buf("c1", (B, G, T, R), np.float32)
    c2 = _buf("c2", (2, G, T, R), np.float32)
    if G == 1 and nb:                   # xh . wh over the K chunks: one partial each
        gemm16(_chunked(whl[1, 0], nb, kc), _chunked(xhl[0, 0], nb, kc), c1[:nb, 0])
    elif nb:
        for j in range(nb):
            gemm16(whl[1, :, :, j * kc:(j + 1) * kc], xhl[0, :, :, j * kc:(j + 1) * kc], c1[j])
    if K % kc:
        gemm16(whl[1, :, :, nb * kc:], xhl[0, :, :, nb * kc:], c1[nb])
    if G == 1:                          # wl . xh and wh . xl
        gemm16(whl[:, 0], xhl[:, 0], c2[:, 0])
    else:
        gemm16(whl[0], xhl[0], c2[0])
        gemm16(whl[1], xhl[1], c2[1])
    combine(c1, c2, ex, ew, y, r0, stream)


def _rows_for(dw: DeviceWeight, T: int, kc: int, per: int = 1) -> int:
    """Rows of weight per chunk: the decode's bound, and the partials' (B x T x rows <= PARTIAL_ELEMS)."""
    B = math.ceil(dw.I / kc) + 2
    r = min(rows_per_chunk(dw), max(1, PARTIAL_ELEMS // max(1, B * T)))
    return max(per, r // per * per)


def dense_h3(dw: DeviceWeight, x, y, *, stream=0, rows: int | None = None, kc: int | None = None) -> None:
    """y [T, O] = x [T, I] @ W.T (float32 device arrays; W = dw decoded, 2-D)."""
    T, K = x.shape
    kc = min(K, kc or ops.H3_KC)
    xhl = _buf("xhl", (2, 1, T, K), np.float16)
    ex = _buf("ex", (1, T), np.int32)
    split_rows(x, xhl.reshape(2, T, K), ex.reshape(T), 0, stream)
    for r0, r1, W in decoded_chunks(dw, _alloc, _view, rows=rows or _rows_for(dw, T, kc), stream=stream):
        n = r1 - r0
        whl = _buf("whl", (2, 1, n, K), np.float16)
        ew = _buf("ew", (1, n), np.int32)
        split_rows(W, whl.reshape(2, n, K), ew.reshape(n), 1, stream)
        _products(xhl, ex, whl, ew, y[None], r0, kc, stream)


def heads_h3(dw: DeviceWeight, x, y, *, stream=0, rows: int | None = None, kc: int | None = None) -> None:
    """y [H, T, O] = x [H, T, I] @ W[h].T per head (W = dw decoded, [H, O, I]), whole heads a chunk."""
    H, T, K = x.shape
    kc = min(K, kc or ops.H3_KC)
    O = dw.O
    xhl = _buf("xhl", (2, H, T, K), np.float16)
    ex = _buf("ex", (H, T), np.int32)
    split_rows(x.reshape(H * T, K), xhl.reshape(2, H * T, K), ex.reshape(H * T), 0, stream)
    for r0, r1, W in decoded_chunks(dw, _alloc, _view, rows=rows or _rows_for(dw, T, kc, O), stream=stream):
        h0, h1 = r0 // O, r1 // O
        n = r1 - r0
        whl = _buf("whl", (2, h1 - h0, O, K), np.float16)
        ew = _buf("ew", (h1 - h0, O), np.int32)
        split_rows(W, whl.reshape(2, n, K), ew.reshape(n), 1, stream)
        _products(xhl[:, h0:h1], ex[h0:h1], whl, ew, y[h0:h1], 0, kc, stream)
