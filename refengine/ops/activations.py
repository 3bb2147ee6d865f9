"""Activations (ggml-cpu `ggml_vec_silu_f32`, `ggml_swiglu`)."""
from __future__ import annotations

import numpy as np


def silu(x: np.ndarray) -> np.ndarray:
    """silu(x) = x * sigmoid(x) = x / (1 + exp(-x))."""
    with np.errstate(over="ignore"):
        return (x / (np.float32(1.0) + np.exp(-x))).astype(np.float32, copy=False)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in float32 (`ggml_sigmoid`)."""
    with np.errstate(over="ignore"):
        return (np.float32(1.0) / (np.float32(1.0) + np.exp(-x))).astype(np.float32, copy=False)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), x itself above 20, in float32 (`ggml_softplus`, ggml/src/ggml-cpu/unary-ops.cpp:80-82)."""
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log(np.float32(1.0) + np.exp(x))).astype(np.float32, copy=False)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up   (`ggml_swiglu_split`)."""
    return silu(gate) * up
