"""The weight multiply every projection goes through, with llama.cpp's optional per-tensor scale and bias."""
from __future__ import annotations


def linear(x, w, scale, bias, rt):
    """`build_lora_mm(w, x, w_s)` then `+ bias`: y = (x @ w.T) * scale + bias.   [T, I] -> [T, O]"""
    y = rt.matmul(x, w)
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y
