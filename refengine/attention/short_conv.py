"""The short causal depthwise convolution of linear-attention layers, with its carried tail.

Legend: T new tokens, C channels, Kc kernel width (`ssm.conv_kernel`, 4 in every published model).

    xin       = concat(tail, x)                     tail: the last Kc-1 inputs of earlier calls (zeros at start)
    y[t, c]   = sum_k xin[t + k, c] * w[c, k]       w[:, Kc-1] multiplies the current token
    new tail  = xin[-(Kc-1):]

llama.cpp: `ggml_ssm_conv` (ggml/src/ggml-cpu/ops.cpp:9932-9985, the sum over k in float32, k ascending),
its input built by concatenating the cached conv state (src/models/delta-net-base.cpp:449-496). The GGUF
weight is ne [Kc, C] (NumPy [C, Kc]) and must be F32: the CPU op reads it as float (ops.cpp asserts
`nb[0] == sizeof(float)`), and the loaders here refuse another type with the tensor's name. The SiLU that follows
(both layer kinds apply it) is `then_silu`: on a GPU the same launch applies it.
"""
from __future__ import annotations

import numpy as np

from ..ops.activations import silu
from ..ops.arrays import as_array, fused_op


def causal_conv(x: np.ndarray, w: np.ndarray, tail: np.ndarray | None,
                then_silu: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """x: [T, C], w: [C, Kc], tail: [Kc-1, C] or None (a new sequence) -> (y [T, C], new tail [Kc-1, C]);
    then_silu: y is silu(the sum) (`ops.silu`)."""
    T, C = x.shape
    assert w.ndim == 2 and w.shape[0] == C, (x.shape, w.shape)
    Kc = w.shape[1]
    if (kf := fused_op(x, "causal_conv")) is not None and (r := kf(x, w, tail, then_silu)) is not None:
        return r                             # a GPU: the sum (its silu), the new tail in one launch (cuda/fused.py)
    if tail is None:
        tail = np.zeros_like(x, shape=(Kc - 1, C))
    assert tail.shape == (Kc - 1, C), (tail.shape, Kc, C)
    xin = np.concatenate([tail.astype(x.dtype), x], axis=0)           # [Kc-1+T, C]
    y = np.zeros_like(x, shape=(T, C))                                 # (like x: where x lives)
    for k in range(Kc):                                                # llama.cpp's order of the sum
        y += xin[k:k + T] * as_array(w[:, k], x.dtype)                 # [T, C] (the weight's own column)
    return silu(y) if then_silu else y, xin[xin.shape[0] - (Kc - 1):].copy()
