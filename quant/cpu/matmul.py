"""Host side of the Numba CPU backend: the oracle's `matmul` signature, and the grouped form MoE uses.

    matmul(x, w, mode="exact")      x: f32 [T, I], w: QTensor [O, I] of any ggml type  ->  [T, O]
    grouped_matmul(x, w, seg)       w: QTensor [E, O, I]; rows seg[e]:seg[e+1] of x use W_e  ->  [N, O]
    dequantize(w)                   QTensor [..., I] -> f32, by the naive kernels of dequant.py

mode "exact" multiplies x itself; "llamacpp" first rounds x to the weight's partner type exactly as
the NumPy oracle does (quant.llamacpp), then runs the same kernels.

Which path (T = activation rows of one matrix):
  T <= GEMV_MAX_ROWS    `kernels.gemv`: the fused kernel once per row (the row stays in L1), on the
                        rows as the kernel reads them (dot.x_lanes: lane order; dot.x_sums: group sums);
  T < blas_min_tokens   `kernels.gemm`: decode CHUNK weights to scratch once, dot every row;
                        either way the weight bytes are read from memory once per call.
  T >= blas_min_tokens  dequantize `CHUNK_ELEMENTS` of weight rows at a time (parallel Numba), then
                        float32 BLAS on them, like the NumPy oracle but with a fast decoder.
Types without a Numba decoder (F64 and the integer types, which are never matmul weights) use the
NumPy oracle itself.
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads, set_parallel_chunksize

from .. import ref
from ..formats import GGMLType
from ..ref import QTensor, QuantError
from .dequant import KINDS
from .dot import x_lanes, x_sums
from .kernels import kernels

# measured on the project machine (Q4_K / IQ2_XXS, 4096 x 14336): re-running the fused GEMV per row
# beats decode-to-scratch up to ~4 rows; dequantizing the whole matrix for BLAS only pays from ~128
# rows (it writes and reads 4 bytes per weight where the kernels read the packed bytes once)
GEMV_MAX_ROWS = 4               # activation rows per matrix up to which the fused GEMV kernel is used
BLAS_MIN_TOKENS = 128           # activation rows from which dequantize + BLAS is used
CHUNK_ELEMENTS = 8 << 20        # weights dequantized per BLAS step (32 MB of float32 scratch)


def _readonly(a: np.ndarray) -> np.ndarray:
    """A read-only C-contiguous view: mmapped weights and test arrays then share one compiled kernel."""
    a = np.ascontiguousarray(a)
    v = a.view()
    v.flags.writeable = False
    return v


def _check_x(x: np.ndarray, w: QTensor) -> np.ndarray:
    x = np.asarray(x)
    I = w.shape[-1]
    if x.ndim != 2 or x.shape[1] != I:
        raise QuantError(f"matmul: input {list(x.shape)} does not match weight {w.name!r} "
                         f"{list(w.shape)} (need [T, {I}])")
    return np.ascontiguousarray(x, dtype=np.float32)


def _activations(x: np.ndarray, w: QTensor, mode: str) -> np.ndarray:
    """The activation values the kernels multiply: x itself ("exact"), or x rounded to the weight's
    partner type as ggml-cpu does ("llamacpp", `quant.llamacpp.round_activations`)."""
    if mode == "exact":
        return x
    if mode != "llamacpp":
        raise QuantError(f"matmul: weight {w.name!r}: mode {mode!r} is not implemented "
                         f"(available: {', '.join(ref.MODES)})")
    from ..llamacpp import round_activations
    try:
        return np.ascontiguousarray(round_activations(x, w.type), dtype=np.float32)
    except ValueError as e:
        raise QuantError(f"matmul: weight {w.name!r}: {e}") from None


def _min_term(x: np.ndarray, raw: np.ndarray, w: QTensor, mode: str, y: np.ndarray) -> None:
    """llama.cpp mode, Q4_1/Q5_1 weights: add the Q8_1 block-sum term ggml-cpu uses (quant.llamacpp)."""
    if mode == "llamacpp" and w.type in (GGMLType.Q4_1, GGMLType.Q5_1) and x.shape[0]:
        from ..llamacpp import q8_1_min_term
        y += q8_1_min_term(x, raw, w.type)


def default_tile(O: int, items: int = 1) -> int:
    """Weight rows per work item: about 32 items per thread (handed out dynamically), 4 to 64 rows."""
    per = -(-O * items // (32 * get_num_threads()))
    return int(max(min(4, O), min(64, -(-per // items))))


def matmul(x: np.ndarray, w: QTensor, *, mode: str = "exact", tile_rows: int | None = None,
           blas_min_tokens: int = BLAS_MIN_TOKENS) -> np.ndarray:
    """y = x @ dequantize(w).T in float32.   x: [T, I], w: [O, I]  ->  [T, O]   (`ggml_mul_mat(w, x)`)

    mode "exact" multiplies x itself; "llamacpp" first rounds x to the weight's partner type, as the
    NumPy oracle does (`quant.ref.matmul`).
    """
    if w.ndim != 2:
        raise QuantError(f"matmul: weight {w.name!r} must be 2-D, got shape {list(w.shape)}")
    x_in = _check_x(x, w)
    kind = int(w.type)
    if kind not in KINDS:
        return ref.matmul(x_in, w, mode=mode)
    x = _activations(x_in, w, mode)
    T, O = x.shape[0], w.shape[0]
    y = np.empty((T, O), dtype=np.float32)
    if T == 0 or O == 0:
        return y
    raw = _readonly(w.raw)                                                  # [O, row_bytes]
    if T >= blas_min_tokens:
        _blas(x, raw, kind, y)
    else:
        _launch(kind, raw[None], x, np.array([0, T], dtype=np.int64), np.zeros(1, dtype=np.int64), y, tile_rows)
    _min_term(x_in, raw, w, mode, y)
    return y


def _launch(kind: int, raw: np.ndarray, x: np.ndarray, seg: np.ndarray, active: np.ndarray, y: np.ndarray,
            tile_rows: int | None, gemv_max_rows: int = GEMV_MAX_ROWS) -> None:
    """Matrices `active` of raw [E, O, row_bytes] with at most `gemv_max_rows` activation rows go to the
    fused GEMV kernel (when the type has one), the others to the decode-to-scratch GEMM kernel."""
    k = kernels(kind)
    counts = seg[active + 1] - seg[active]
    few = counts <= gemv_max_rows
    one = active[few] if k.gemv is not None else active[:0]
    many = active[~few] if k.gemv is not None else active
    O = raw.shape[1]
    # dynamic scheduling, one work item at a time: on a shared machine a thread that is not running
    # leaves its items to the others instead of holding up the whole parallel region
    old = set_parallel_chunksize(1)
    try:
        if one.size:
            k.gemv(raw, x_lanes(kind, x), x_sums(kind, x), seg, one, y, tile_rows or default_tile(O, one.size))
        if many.size:
            k.gemm(raw, x, seg, many, y, tile_rows or default_tile(O, many.size))
    finally:
        set_parallel_chunksize(old)


def _blas(x: np.ndarray, raw: np.ndarray, kind: int, y: np.ndarray) -> None:
    """Large T: decode a block of weight rows (Numba, parallel), multiply it with BLAS; repeat."""
    I = x.shape[1]
    O = raw.shape[0]
    step = max(1, CHUNK_ELEMENTS // max(I, 1))
    wd = np.empty((min(step, O), I), dtype=np.float32)
    deq = kernels(kind).dequant_rows
    for r0 in range(0, O, step):
        r1 = min(O, r0 + step)
        deq(raw[r0:r1], wd[: r1 - r0])                                       # [r, I]
        np.matmul(x, wd[: r1 - r0].T, out=y[:, r0:r1])


def grouped_matmul(x: np.ndarray, w: QTensor, seg: np.ndarray, *, mode: str = "exact",
                   tile_rows: int | None = None, blas_min_tokens: int = BLAS_MIN_TOKENS) -> np.ndarray:
    """Many matrices at once: w [E, O, I]; rows seg[e]:seg[e+1] of x [N, I] are multiplied by W_e.

    Only matrices that own rows are read. Matrices with at least `blas_min_tokens` rows go through
    dequantize + BLAS one by one; all the others share one parallel kernel launch.  ->  [N, O]
    """
    if w.ndim != 3:
        raise QuantError(f"grouped_matmul: weight {w.name!r} must be 3-D [E, O, I], got {list(w.shape)}")
    x_in = _check_x(x, w)
    E, O = w.shape[0], w.shape[1]
    seg = np.asarray(seg, dtype=np.int64)
    if seg.shape != (E + 1,) or seg[0] != 0 or seg[-1] != x.shape[0] or np.any(np.diff(seg) < 0):
        raise QuantError(f"grouped_matmul: seg must be {E + 1} non-decreasing offsets from 0 to {x.shape[0]} "
                         f"for weight {w.name!r}")
    counts = np.diff(seg)
    if not w.raw.flags.c_contiguous:              # a view with experts apart (a fused gate_up's half): the experts
        used = np.nonzero(counts)[0]              # this call uses, gathered (the rest of the tensor is not read)
        sub = QTensor(w.name, w.type, (used.size, *w.shape[1:]), np.ascontiguousarray(w.raw[used]))
        return grouped_matmul(x, sub, np.concatenate([[0], np.cumsum(counts[used])]), mode=mode,
                              tile_rows=tile_rows, blas_min_tokens=blas_min_tokens)
    y = np.empty((x.shape[0], O), dtype=np.float32)
    kind = int(w.type)
    if kind not in KINDS:
        for e in np.nonzero(counts)[0]:
            y[seg[e]:seg[e + 1]] = ref.matmul(x_in[seg[e]:seg[e + 1]], w[int(e)], mode=mode)
        return y
    x = _activations(x_in, w, mode)
    raw = _readonly(w.raw)                                                  # [E, O, row_bytes]
    big = np.nonzero(counts >= blas_min_tokens)[0]
    for e in big:
        _blas(x[seg[e]:seg[e + 1]], raw[e], kind, y[seg[e]:seg[e + 1]])
    active = np.nonzero((counts > 0) & (counts < blas_min_tokens))[0].astype(np.int64)
    if active.size:
        _launch(kind, raw, x, seg, active, y, tile_rows)
    for e in np.nonzero(counts)[0]:
        _min_term(x_in[seg[e]:seg[e + 1]], raw[e], w, mode, y[seg[e]:seg[e + 1]])
    return y


def dequantize(w: QTensor) -> np.ndarray:
    """Decode a whole tensor to float32 of shape `w.shape` with the Numba block decoders."""
    kind = int(w.type)
    if kind not in KINDS:
        return ref.dequantize(w)
    raw = _readonly(w.raw).reshape(-1, w.raw.shape[-1])
    out = np.empty((raw.shape[0], w.shape[-1]), dtype=np.float32)
    if out.size:
        kernels(kind).dequant_rows(raw, out)
    return out.reshape(w.shape)
