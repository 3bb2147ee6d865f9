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


def linear_many(x, specs, rt):
    """[linear(x, w, scale, bias, rt) for (w, scale, bias) in specs]: one input's projections, multiplied by
    `rt.matmul_many` (one product on a device whose kernels take the weights together; else one by one)."""
    ys = rt.matmul_many(x, [w for w, _, _ in specs])
    out = []
    for y, (_, scale, bias) in zip(ys, specs):
        if scale is not None:
            y = y * scale
        if bias is not None:
            y = y + bias
        out.append(y)
    return out
