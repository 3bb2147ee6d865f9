"""Softmax over the last axis in float32 with a float64 sum, as `ggml_compute_forward_soft_max_f32`
(float64 inputs give float64 output: the precision switch of the equivalence tests)."""
from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - m)                                  # -inf entries -> 0
    s = np.sum(e, axis=axis, keepdims=True, dtype=np.float64)
    return (e / s).astype(np.float64 if e.dtype == np.float64 else np.float32)
