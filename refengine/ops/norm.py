"""Normalizations, as ggml-cpu computes them (sums in double, scale in float: ops.cpp `ggml_compute_forward_rms_norm_f32`)."""
from __future__ import annotations

import numpy as np

from .activations import sigmoid, silu
from .arrays import as_array, fused_op


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """y = x / sqrt(mean(x^2) + eps) * w   over the last axis.   x: [..., D], w: [D] -> [..., D]

    llama.cpp: `build_norm(..., LLM_NORM_RMS)` = `ggml_rms_norm` then `ggml_mul` by the weight.
    float32 (float64 inputs stay float64: the precision switch of the equivalence tests).
    """
    if (k := fused_op(x, "rms_norm")) is not None and (y := k(x, w, eps)) is not None:
        return y                                                         # a GPU: the same, in one launch
    x = as_array(x)
    x = as_array(x, np.float64 if x.dtype == np.float64 else np.float32)
    mean = (np.sum(np.square(x), axis=-1, keepdims=True, dtype=np.float64) / x.shape[-1]).astype(x.dtype)  # [..., 1]
    scale = x.dtype.type(1.0) / np.sqrt(mean + x.dtype.type(eps))
    y = x * scale
    return y if w is None else y * w


def add_rms_norm(x: np.ndarray, a: np.ndarray, w: np.ndarray | None, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """A pre-norm block's residual add and the next norm: s = x + a, then rms_norm(s, w, eps) -> (s, the norm).
    x, a: [..., D] of one shape. (On a GPU one launch where the two take two.)"""
    if (k := fused_op(x, "add_rms_norm")) is not None and (res := k(x, a, w, eps)) is not None:
        return res
    s = x + a
    return s, rms_norm(s, w, eps)


def add_slots_rms_norm(x: np.ndarray, slots: np.ndarray, extra: np.ndarray | None, w: np.ndarray | None,
                       eps: float) -> tuple[np.ndarray, np.ndarray]:
    """`add_rms_norm(x, f, w, eps)` with f = slots[:, 0] + slots[:, 1] + ... (+ extra): slots [T, A, D] summed over
    A in order (a MoE layer's weighted expert outputs, as ggml adds them), extra [T, D] or None (its shared
    experts' output). (On a GPU one launch: the slots' sum, the adds and the norm; the sum is not written.)"""
    if (k := fused_op(x, "add_slots_rms_norm")) is not None and (res := k(x, slots, extra, w, eps)) is not None:
        return res
    return add_rms_norm(x, slot_sum(slots, extra), w, eps)


def slot_sum(slots: np.ndarray, extra: np.ndarray | None = None) -> np.ndarray:
    """slots [T, A, D] -> slots[:, 0] + ... + slots[:, A - 1] (+ extra [T, D]), added in that order (float32)."""
    f = slots[:, 0]
    for a in range(1, slots.shape[1]):
        f = f + slots[:, a]
    return f if extra is None else f + extra


GATES = ("silu", "sigmoid")           # rms_norm_gated's activations of the gate


def rms_norm_gated(x: np.ndarray, w: np.ndarray | None, eps: float, gate: np.ndarray, act: str) -> np.ndarray:
    """rms_norm(x, w, eps) * act(gate), act one of GATES (`activations.silu` / `sigmoid`): a linear-attention
    layer's output norm, gated (llama.cpp's build_norm_gated: qwen3next's silu(z), Kimi's sigmoid(gate)). x, gate
    [..., D] of one shape. (On a GPU one launch where the three take three.)"""
    if act not in GATES:
        raise ValueError(f"rms_norm_gated: act {act!r} is not one of {', '.join(GATES)}")
    if (k := fused_op(x, "rms_norm_gated")) is not None and (y := k(x, w, eps, gate, act)) is not None:
        return y
    return rms_norm(x, w, eps) * (silu if act == "silu" else sigmoid)(gate)


def layer_norm(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float) -> np.ndarray:
    """y = (x - mean(x)) / sqrt(var(x) + eps) * w + b   over the last axis.   x: [..., D], w, b: [D] -> [..., D]

    llama.cpp: `build_norm(..., LLM_NORM)` = `ggml_norm(x, hparams.f_norm_eps)` then `ggml_mul` / `ggml_add`
    (ops.cpp `ggml_compute_forward_norm_f32`: mean, then the mean of squared deviations). eps = 0 is allowed
    (ggml asserts eps >= 0); a constant row then divides by zero, as in ggml.
    """
    if (k := fused_op(x, "layer_norm")) is not None and (y := k(x, w, b, eps)) is not None:
        return y                                                         # a GPU: the same, in one launch
    x = as_array(x)
    x = as_array(x, np.float64 if x.dtype == np.float64 else np.float32)
    mean = np.mean(x, axis=-1, keepdims=True, dtype=np.float64)                                   # [..., 1]
    d = x - mean.astype(x.dtype)                                                                  # [..., D]
    var = np.mean(np.square(d, dtype=np.float64), axis=-1, keepdims=True).astype(x.dtype)        # [..., 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        y = d * (x.dtype.type(1.0) / np.sqrt(var + x.dtype.type(eps)))
    if w is not None:
        y = y * w
    return y if b is None else y + b
