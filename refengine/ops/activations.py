"""Activations (ggml-cpu `ggml_vec_silu_f32`, `ggml_swiglu`)."""
from __future__ import annotations

import numpy as np

from .arrays import fused_op


def silu(x: np.ndarray) -> np.ndarray:
    """silu(x) = x * sigmoid(x) = x / (1 + exp(-x))."""
    if (k := fused_op(x, "silu")) is not None and (y := k(x)) is not None:
        return y                                           # a GPU: the same, in one launch (refengine/cuda/fused.py)
    with np.errstate(over="ignore"):
        return (x / (np.float32(1.0) + np.exp(-x))).astype(np.float32, copy=False)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in float32 (`ggml_sigmoid`)."""
    if (k := fused_op(x, "sigmoid")) is not None and (y := k(x)) is not None:
        return y
    with np.errstate(over="ignore"):
        return (np.float32(1.0) / (np.float32(1.0) + np.exp(-x))).astype(np.float32, copy=False)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), x itself above 20, in float32 (`ggml_softplus`, ggml/src/ggml-cpu/unary-ops.cpp:80-82)."""
    if (k := fused_op(x, "softplus")) is not None and (y := k(x)) is not None:
        return y
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log(np.float32(1.0) + np.exp(x))).astype(np.float32, copy=False)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up   (`ggml_swiglu_split`)."""
    if (k := fused_op(gate, "swiglu")) is not None and (y := k(gate, up)) is not None:
        return y
    return silu(gate) * up


def situ(gate: np.ndarray, up: np.ndarray, beta: float, linear_beta: float) -> np.ndarray:
    """SiTU (Kimi-K3): beta*tanh(gate/beta)*sigmoid(gate) * (lb*tanh(up/lb) if lb > 0 else up), lb = linear_beta.

    A SiLU-like gate whose magnitude is capped at beta (tanh saturates), times an up branch capped at lb.
    Keys `activation.situ_beta` / `activation.situ_linear_beta`. llama.cpp builds it from float32 unary ops
    in this order (src/models/kimi-k3.cpp:173-184 `kimi_k3_situ`, the same in build_moe_ffn's LLM_FFN_SITU,
    src/llama-graph.cpp:2266-2280): scale by 1/beta, tanh, scale by beta, times sigmoid(gate), times up.
    gate, up: [..., F] float32 -> [..., F]."""
    if (k := fused_op(gate, "situ")) is not None and (y := k(gate, up, beta, linear_beta)) is not None:
        return y
    f32 = np.float32
    with np.errstate(over="ignore"):
        a = np.tanh(gate * f32(f32(1.0) / f32(beta))) * f32(beta)                   # ggml_scale(tanh(scale(g)))
        a = a * (f32(1.0) / (f32(1.0) + np.exp(-gate)))                              # * ggml_sigmoid(g)
    if linear_beta > 0.0:
        up = np.tanh(up * f32(f32(1.0) / f32(linear_beta))) * f32(linear_beta)
    return (a * up).astype(np.float32, copy=False)


def swiglu_clamp(gate: np.ndarray, up: np.ndarray, limit: float) -> np.ndarray:
    """silu(min(gate, L)) * clip(up, -L, L), L = limit (`ggml_swiglu_clamp`, ggml-cpu ops.cpp:3571-3628: the gate is
    clamped BEFORE the silu, unlike the clamp-after-silu of the other archs' limited SwiGLU). float32."""
    if (k := fused_op(gate, "swiglu_clamp")) is not None and (y := k(gate, up, limit)) is not None:
        return y
    L = np.float32(limit)
    g = np.minimum(gate, L)
    u = np.clip(up, -L, L)
    with np.errstate(over="ignore"):
        return (g / (np.float32(1.0) + np.exp(-g)) * u).astype(np.float32, copy=False)
