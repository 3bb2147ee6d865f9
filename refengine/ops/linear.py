"""The weight multiply every projection goes through, with llama.cpp's optional per-tensor scale and bias."""
from __future__ import annotations


def scale_bias(y, scale, bias=None):
    """`linear`'s steps after the product: y * scale (a `.scale` tensor, or None) + bias (or None)."""
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias
    return y


def linear(x, w, scale, bias, rt):
    """`build_lora_mm(w, x, w_s)` then `+ bias`: y = (x @ w.T) * scale + bias.   [T, I] -> [T, O]"""
    return scale_bias(rt.matmul(x, w), scale, bias)


def linear_many(x, specs, rt):
    """[linear(x, w, scale, bias, rt) for (w, scale, bias) in specs]: one input's projections, multiplied by
    `rt.matmul_many` (one product on a device whose kernels take the weights together; else one by one)."""
    ys = rt.matmul_many(x, [w for w, _, _ in specs])
    return [scale_bias(y, scale, bias) for y, (_, scale, bias) in zip(ys, specs)]
