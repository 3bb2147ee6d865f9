"""Softmax over the last axis in float32 with a float64 sum, as `ggml_compute_forward_soft_max_f32`
(float64 inputs give float64 output: the precision switch of the equivalence tests)."""
from __future__ import annotations

import numpy as np

from .arrays import fused_op


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    if axis in (-1, getattr(x, "ndim", 0) - 1) and (k := fused_op(x, "softmax")) is not None and (y := k(x)) is not None:
        return y                                           # a GPU: the same, in one launch
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)                                  # -inf entries -> 0
    s = np.sum(e, axis=axis, keepdims=True, dtype=np.float64)
    return (e / s).astype(np.float64 if e.dtype == np.float64 else np.float32)
