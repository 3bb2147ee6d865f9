"""Random packed tensors for tests and benchmarks, made without libggml (it is not on the GPU machine).

Random bytes exercise every bit pattern a decoder can meet; only the float16 / e8m0 block scales are
overwritten with finite, moderate values (random bytes there would give inf and NaN).
"""
from __future__ import annotations

import numpy as np

from ..formats import GGMLType, type_info
from ..ref import QTensor

# byte offsets of the float16 scales inside one block
F16_SCALES = {
    GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,), GGMLType.Q5_1: (0, 2),
    GGMLType.Q8_0: (0,), GGMLType.IQ4_NL: (0,), GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,),
    GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,), GGMLType.IQ2_XXS: (0,),
    GGMLType.IQ2_XS: (0,), GGMLType.IQ2_S: (0,), GGMLType.IQ3_XXS: (0,), GGMLType.IQ3_S: (0,),
    GGMLType.IQ1_S: (0,), GGMLType.IQ4_XS: (0,),
}


# (offset of the min / dmin, its value over d) that makes the mean weight zero: w = d*q*s - dmin*m
CENTER = {GGMLType.Q4_1: (2, -7.5), GGMLType.Q5_1: (2, -15.5), GGMLType.Q2_K: (82, 1.5),
          GGMLType.Q4_K: (2, 7.5), GGMLType.Q5_K: (2, 15.5)}


def random_raw(t, shape, rng: np.random.Generator, scale: float = 2.0 ** -7, centered: bool = False) -> np.ndarray:
    """Packed bytes [*shape[:-1], row_bytes] of type t with random quants and finite scales.

    centered: set the min of the min-types so that the expected weight is zero (model-like weights)."""
    info = type_info(t)
    t = info.type
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape))
    if t == GGMLType.F32:
        return rng.standard_normal(n).astype(np.float32).view(np.uint8).reshape(*shape[:-1], -1)
    if t == GGMLType.F16:
        return rng.standard_normal(n).astype(np.float16).view(np.uint8).reshape(*shape[:-1], -1)
    if t == GGMLType.BF16:
        bits = (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return bits.view(np.uint8).reshape(*shape[:-1], -1)
    nb = n // info.block_size
    blocks = rng.integers(0, 256, size=(nb, info.type_size), dtype=np.uint8)
    d = (scale * rng.uniform(0.5, 1.5, size=nb)).astype(np.float16).view(np.uint8).reshape(nb, 2)
    for off in F16_SCALES.get(t, ()):
        blocks[:, off:off + 2] = d
    if centered and t in CENTER:
        off, ratio = CENTER[t]
        blocks[:, off:off + 2] = (d.view(np.float16).astype(np.float32) * ratio).astype(np.float16).view(np.uint8)
    if t == GGMLType.MXFP4:
        blocks[:, 0] = rng.integers(118, 124, size=nb)              # 2^(e-128): 2^-10 .. 2^-5
    elif t == GGMLType.NVFP4:
        blocks[:, 0:4] = rng.integers(0x08, 0x28, size=(nb, 4))      # UE4M3 scales 2^-7 .. 2^-4
    elif t == GGMLType.IQ1_M:
        h = d.view(np.uint16).reshape(nb)                            # f16 spread over 4 top nibbles
        sc = blocks[:, 48:56].copy().view(np.uint16)                 # [nb, 4]
        for i in range(4):
            sc[:, i] = (sc[:, i] & 0x0FFF) | (((h >> (4 * i)) & 0xF) << 12)
        blocks[:, 48:56] = sc.view(np.uint8)
    return blocks.reshape(*shape[:-1], -1)


def random_qtensor(t, shape, rng: np.random.Generator, name: str = "w", scale: float = 2.0 ** -7,
                   centered: bool = False) -> QTensor:
    return QTensor.from_raw(name, t, shape, random_raw(t, shape, rng, scale, centered))
