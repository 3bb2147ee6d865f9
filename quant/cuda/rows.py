"""ggml_get_rows on the device: rows of a packed 2-D weight (the token embedding, n-gram tables) decoded to float32 for
token ids that are on the device, so an embedding needs no read-back of the ids (a decode step captured as a CUDA
graph takes the embedding in too).

    get_rows_device(dw, ids, out)   dw: DeviceWeight [V, D] (weights.device_weight), ids: int [T] on the device,
                                    out: float32 [T, D] on the device
    get_rows(w, ids)                QTensor [V, D], CuPy ids [T] -> CuPy [T, D] on CuPy's current stream; None when
                                    the type has no decoder

One thread per block part of a row (grid: parts across x, tokens across y): the same decoders as the products
(decoders.py), so a row is `quant.ref.dequantize`'s, bit for bit (tests/test_cuda_rows.py, in the simulator).
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32, uint64

from ..ref import QTensor
from .decoders import spec
from .ops import supported
from .weights import device_weight

THREADS = 128


@functools.lru_cache(maxsize=None)
def rows_kernel(t):
    s = spec(t)
    dec, P, NV, R, RL, RS, BS, TS = s.dec, s.P, s.NV, s.R, s.RL, s.RS, s.BS, s.TS

    @cuda.jit
    def rows(w32, w16, tb, ids, out, rowb, NB):
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x         # part i % P of block i // P of the row
        t = cuda.blockIdx.y
        if i >= NB * P:
            return
        b = i // P
        p = i - b * P
        v = cuda.local.array((1, NV), float32)
        base = uint64(ids[t]) * uint64(rowb) + uint64(b) * uint64(TS)
        c0 = dec(w32, w16, tb, base, p, v, 0)
        for q in range(R):
            for k in range(RL):
                out[t, b * BS + c0 + q * RS + k] = v[0, q * RL + k]
    return rows


def get_rows_device(dw, ids, out, stream=0) -> None:
    T, D = out.shape
    if D != dw.I:
        raise ValueError(f"get_rows: out has {D} columns, the weight {dw.I}")
    s = spec(dw.type)
    NB = D // s.BS
    if T == 0 or NB == 0:
        return
    rows_kernel(dw.type)[(math.ceil(NB * s.P / THREADS), T), THREADS, stream](
        dw.w32, dw.w16, dw.tab, ids, out, dw.rowb, NB)


def get_rows(w: QTensor, ids):
    """CuPy ids [T] -> CuPy float32 [T, D] (rows of w decoded on the device); None when no decoder serves w's type
    or w is not a matrix whose rows are whole blocks."""
    if w.ndim != 2 or not supported(w) or w.shape[1] % spec(w.type).BS:
        return None
    import cupy as cp

    from .streams import current_stream, numba_view
    ids = cp.ascontiguousarray(ids.reshape(-1), dtype=cp.int64)
    out = cp.empty((ids.shape[0], w.shape[1]), dtype=cp.float32)
    get_rows_device(device_weight(w).ensure(), numba_view(ids), numba_view(out), current_stream())
    return out

