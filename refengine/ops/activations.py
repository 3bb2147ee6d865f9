"""Activations (ggml-cpu `ggml_vec_silu_f32`, `ggml_swiglu`)."""
from __future__ import annotations

import numpy as np


def silu(x: np.ndarray) -> np.ndarray:
    """silu(x) = x * sigmoid(x) = x / (1 + exp(-x))."""
    with np.errstate(over="ignore"):
        return (x / (np.float32(1.0) + np.exp(-x))).astype(np.float32, copy=False)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up   (`ggml_swiglu_split`)."""
    return silu(gate) * up
