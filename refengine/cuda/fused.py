"""Fused kernels for the small ops of a device-resident step: one launch where the NumPy statement of the op, run
on CuPy arrays, takes five to nine (issue 23: a decode step's time on the GPU is mostly launches, not bytes).

    rms_norm(x, w, eps)      ops/norm.py `rms_norm`: [..., D] float32 rows, w [D] or None
    softmax(x)               ops/softmax.py `softmax` over the last axis, float32
    silu(x), sigmoid(x)      ops/activations.py, float32
    swiglu(gate, up)         silu(gate) * up, float32, same shape
    all_finite(y, page, row, col)   page[row, col] = False when y holds a NaN/inf (the NaN checks of a step)

The NumPy functions stay the statement of the math; each calls its kernel here when its input is a DeviceArray on
a GPU (`fused_op(x, name)`, refengine/ops/arrays.py) and the kernel takes its shape and dtype (else None is
returned and the NumPy code runs on the device as before). The kernels compute what the NumPy code computes, in
the same precision (the sums in float64 where NumPy's are), in another order of summation: equal to the NumPy op
within float rounding, not bit for bit (tests/test_fused.py: the kernels under the CUDA simulator on toy shapes;
tests/test_cuda_fused.py: on a GPU at the real shapes, and a whole forward against NumPy). Every launch goes on
CuPy's current stream (a CUDA graph capture holds it). `Device.fused = None` turns them off.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64

NT = 256                    # threads of a row's block (a power of two: the tree reductions)


@cuda.jit(fastmath=False)
def _rms_rows(x, w, has_w, eps, y):
    r = cuda.blockIdx.x
    t = cuda.threadIdx.x
    D = x.shape[1]
    sh = cuda.shared.array(NT, float64)
    acc = float64(0.0)
    for j in range(t, D, NT):
        v = float64(x[r, j])
        acc += v * v
    sh[t] = acc
    cuda.syncthreads()
    s = NT // 2
    while s > 0:
        if t < s:
            sh[t] += sh[t + s]
        cuda.syncthreads()
        s //= 2
    mean = float32(sh[0] / D)
    scale = float32(1.0) / math.sqrt(mean + eps)
    for j in range(t, D, NT):
        v = x[r, j] * scale
        if has_w:
            v = v * w[j]
        y[r, j] = v


@cuda.jit(fastmath=False)
def _softmax_rows(x, y):
    r = cuda.blockIdx.x
    t = cuda.threadIdx.x
    D = x.shape[1]
    shm = cuda.shared.array(NT, float32)
    shs = cuda.shared.array(NT, float64)
    m = float32(-math.inf)
    for j in range(t, D, NT):
        v = x[r, j]
        if v > m or v != v:
            m = v
    shm[t] = m
    cuda.syncthreads()
    s = NT // 2
    while s > 0:
        if t < s:
            a, b = shm[t], shm[t + s]
            if b > a or b != b:
                shm[t] = b
        cuda.syncthreads()
        s //= 2
    m = shm[0]
    acc = float64(0.0)
    for j in range(t, D, NT):
        acc += float64(math.exp(x[r, j] - m))
    shs[t] = acc
    cuda.syncthreads()
    s = NT // 2
    while s > 0:
        if t < s:
            shs[t] += shs[t + s]
        cuda.syncthreads()
        s //= 2
    tot = shs[0]
    for j in range(t, D, NT):
        y[r, j] = float32(float64(math.exp(x[r, j] - m)) / tot)


@cuda.jit(fastmath=False)
def _silu(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        v = x[i]
        y[i] = v / (float32(1.0) + math.exp(-v))


@cuda.jit(fastmath=False)
def _sigmoid(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = float32(1.0) / (float32(1.0) + math.exp(-x[i]))


@cuda.jit(fastmath=False)
def _swiglu(g, u, y):
    i = cuda.grid(1)
    if i < g.shape[0]:
        v = g[i]
        y[i] = v / (float32(1.0) + math.exp(-v)) * u[i]


@cuda.jit(fastmath=False)
def _all_finite(y, page, row, col):
    """page[row, col] = False when y (flat) holds a NaN or an inf; page was filled with True (a benign race: every
    writer writes False)."""
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.shape[0], stride):
        v = y[i]
        if v != v or v - v != 0:
            page[row, col] = False


# ---------------------------------------------------------------- launches on raw device arrays (numba or CuPy)
def _grid(n: int, per: int = 256) -> int:
    return max(1, (n + per - 1) // per)


def rms_norm_raw(x2, w, eps: float, y2, stream=0) -> None:
    """x2, y2 [R, D] float32 (device), w [D] float32 or None."""
    has_w = w is not None
    wv = w if has_w else x2[0, :1]
    _rms_rows[x2.shape[0], NT, stream](x2, wv, has_w, np.float32(eps), y2)


def softmax_raw(x2, y2, stream=0) -> None:
    _softmax_rows[x2.shape[0], NT, stream](x2, y2)


def silu_raw(x1, y1, stream=0) -> None:
    _silu[_grid(x1.shape[0]), 256, stream](x1, y1)


def sigmoid_raw(x1, y1, stream=0) -> None:
    _sigmoid[_grid(x1.shape[0]), 256, stream](x1, y1)


def swiglu_raw(g1, u1, y1, stream=0) -> None:
    _swiglu[_grid(g1.shape[0]), 256, stream](g1, u1, y1)


def all_finite_raw(y1, page, row: int, col: int, stream=0) -> None:
    _all_finite[min(_grid(y1.shape[0], 256 * 8), 1024), 256, stream](y1, page, row, col)


# ---------------------------------------------------------------- DeviceArray entry points (a GPU's CuPy arrays)
def _served(*a) -> bool:
    return all(v.dtype == np.float32 and v.flags.c_contiguous and v.size > 0 for v in a)


def rms_norm(x, w, eps: float):
    raw = x.raw
    if raw.ndim < 1 or not _served(raw):
        return None
    D = raw.shape[-1]
    wr = None
    if w is not None:
        wr = x.dev.unwrap(w, "rms_norm weight")
        if getattr(wr, "shape", None) != (D,) or not _served(wr):
            return None
    x2 = raw.reshape(-1, D)
    out = x.dev.xp.empty_like(x2)
    from quant.cuda.resident import current_stream, numba_view
    rms_norm_raw(numba_view(x2), None if wr is None else numba_view(wr), eps, numba_view(out),
                 stream=current_stream())
    res = x.dev.wrap(out.reshape(raw.shape))
    x.dev.note("fused rms_norm", (x, w), res)
    return res


def softmax(x):
    raw = x.raw
    if raw.ndim < 1 or not _served(raw):
        return None
    D = raw.shape[-1]
    x2 = raw.reshape(-1, D)
    out = x.dev.xp.empty_like(x2)
    from quant.cuda.resident import current_stream, numba_view
    softmax_raw(numba_view(x2), numba_view(out), stream=current_stream())
    res = x.dev.wrap(out.reshape(raw.shape))
    x.dev.note("fused softmax", (x,), res)
    return res


def _unary(x, op, fn):
    raw = x.raw
    if not _served(raw):
        return None
    out = x.dev.xp.empty_like(raw)
    from quant.cuda.resident import current_stream, numba_view
    fn(numba_view(raw.reshape(-1)), numba_view(out.reshape(-1)), stream=current_stream())
    res = x.dev.wrap(out)
    x.dev.note(f"fused {op}", (x,), res)
    return res


def silu(x):
    return _unary(x, "silu", silu_raw)


def sigmoid(x):
    return _unary(x, "sigmoid", sigmoid_raw)


def swiglu(gate, up):
    from ..devarray import DeviceArray
    if not isinstance(up, DeviceArray) or up.dev is not gate.dev:
        return None
    g, u = gate.raw, up.raw
    if g.shape != u.shape or not _served(g, u):
        return None
    out = gate.dev.xp.empty_like(g)
    from quant.cuda.resident import current_stream, numba_view
    swiglu_raw(numba_view(g.reshape(-1)), numba_view(u.reshape(-1)), numba_view(out.reshape(-1)),
               stream=current_stream())
    res = gate.dev.wrap(out)
    gate.dev.note("fused swiglu", (gate, up), res)
    return res


def all_finite(y, page, row: int, col: int) -> bool:
    """page[row, col] = False when the device array y holds NaN/inf (page: a CuPy bool array filled with True).
    False when the kernel does not take y (not float32 / contiguous): the caller checks it another way."""
    raw = y.raw
    if raw.dtype != np.float32 or not raw.flags.c_contiguous or raw.size == 0:
        return False
    from quant.cuda.resident import current_stream, numba_view
    all_finite_raw(numba_view(raw.reshape(-1)), numba_view(page), row, col, stream=current_stream())
    return True
