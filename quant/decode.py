"""Dequantization of every ggml type, bit-exact with ggml's `to_float` (`dequantize_row_*`, ggml-quants.c).

    decode(raw, t)     raw: uint8 [..., row_bytes]  ->  float32 [..., cols]

Where `gguf.quants` (gguf-py 0.19) is already bit-exact it is used as is: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q2_K..Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, MXFP4,
NVFP4, BF16 (tests/test_quant_dequant.py checks each against libggml, random bytes included).
This file adds the four it lacks:

    Q1_0  (ggml id 41) gguf 0.19 has the id but raises NotImplementedError
    Q2_0  (ggml id 42) unknown to gguf 0.19
    Q8_1  (id 9)       no decoder in gguf, and gguf's size table says 40 bytes; ggml's block is 36
    Q8_K  (id 15)      no decoder in gguf (the activation type of the K-quants)

Every block starts as a row of `type_size` bytes; the diagrams give byte offsets inside one block.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from gguf import quants as gguf_quants
from gguf.constants import GGMLQuantizationType

from .formats import GGMLType, type_info

F32 = np.float32


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 at byte `at` of every block, as float32: [N, 1]."""
    return blocks[:, at:at + 2].copy().view(np.float16).astype(F32)


def decode_q1_0(blocks: np.ndarray) -> np.ndarray:
    """Q1_0: 128 weights, one sign bit each (`dequantize_row_q1_0`).

        bytes 0-1   d      fp16
        bytes 2-17  qs     128 bits; weight j is bit (j % 8) of byte j // 8

        w[j] = bit ? d : -d

    blocks: [N, 18] -> [N, 128]
    """
    d = _half(blocks, 0)                                                     # [N, 1]
    bits = np.unpackbits(blocks[:, 2:18], axis=-1, bitorder="little")        # [N, 128]
    return np.where(bits.astype(bool), d, -d).astype(F32)


def decode_q2_0(blocks: np.ndarray) -> np.ndarray:
    """Q2_0: 64 weights of 2 bits, codes {0,1,2,3} meaning {-1, 0, +1, +2} (`dequantize_row_q2_0`).

        bytes 0-1   d      fp16
        bytes 2-17  qs     weight j is bits 2*(j % 4) .. 2*(j % 4)+1 of byte j // 4

        w[j] = (q[j] - 1) * d

    blocks: [N, 18] -> [N, 64]
    """
    d = _half(blocks, 0)                                                     # [N, 1]
    qs = blocks[:, 2:18]                                                     # [N, 16]
    q = (qs[:, :, None] >> np.array([0, 2, 4, 6], dtype=np.uint8)) & 3       # [N, 16, 4]
    return (q.reshape(-1, 64).astype(np.int8) - 1).astype(F32) * d


def decode_q8_1(blocks: np.ndarray) -> np.ndarray:
    """Q8_1: Q8_0 plus the block sum, the activation partner of Q4_1/Q5_1 (`block_q8_1`, ggml-common.h).

        bytes 0-1   d      fp16
        bytes 2-3   s      fp16, = d * sum(qs) (used by the dot product, not by the value)
        bytes 4-35  qs     int8[32]

        w[j] = d * qs[j]

    ggml has no `to_float` for Q8_1; this is the value its dot products use. blocks: [N, 36] -> [N, 32]
    """
    d = _half(blocks, 0)
    return d * blocks[:, 4:36].view(np.int8).astype(F32)


def decode_q8_k(blocks: np.ndarray) -> np.ndarray:
    """Q8_K: the K-quants' activation type (`dequantize_row_q8_K`).

        bytes 0-3      d      float32
        bytes 4-259    qs     int8[256]
        bytes 260-291  bsums  int16[16], sum of each 16 qs (for the dot products)

        w[j] = d * qs[j]

    blocks: [N, 292] -> [N, 256]
    """
    d = blocks[:, 0:4].copy().view(F32)                                      # [N, 1]
    return d * blocks[:, 4:260].view(np.int8).astype(F32)


OWN: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.Q1_0: decode_q1_0,
    GGMLType.Q2_0: decode_q2_0,
    GGMLType.Q8_1: decode_q8_1,
    GGMLType.Q8_K: decode_q8_k,
}

_PLAIN = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.F64: np.float64,
          GGMLType.I8: np.int8, GGMLType.I16: np.int16, GGMLType.I32: np.int32, GGMLType.I64: np.int64}


class DecodeError(ValueError):
    """No decoder for this type (raised as quant.QuantError by callers that know the tensor name)."""


def has_decoder(t) -> bool:
    t = type_info(t).type
    if t in OWN or t in _PLAIN:
        return True
    try:
        return GGMLQuantizationType(int(t)) in gguf_quants._type_traits
    except ValueError:
        return False


def decode(raw: np.ndarray, t) -> np.ndarray:
    """Packed bytes uint8 [..., row_bytes] -> float32 [..., cols] (bit-exact with ggml's `to_float`)."""
    with np.errstate(all="ignore"):          # NaN / inf scales decode to NaN / inf, as in ggml
        return _decode(np.asarray(raw), type_info(t))


def _decode(raw: np.ndarray, info) -> np.ndarray:
    t = info.type
    if t in _PLAIN:
        out = raw.view(_PLAIN[t])
        return out if t == GGMLType.F32 else out.astype(F32)
    lead = raw.shape[:-1]
    if raw.shape[-1] % info.type_size:
        raise DecodeError(f"{t.name}: {raw.shape[-1]} bytes per row is not a multiple of the block size {info.type_size}")
    cols = raw.shape[-1] // info.type_size * info.block_size
    if t in OWN:
        blocks = np.ascontiguousarray(raw).reshape(-1, info.type_size)
        return OWN[t](blocks).reshape(*lead, cols)
    if not has_decoder(t):
        raise DecodeError(f"no NumPy decoder for ggml type {t.name}")
    out = gguf_quants.dequantize(raw, GGMLQuantizationType(int(t)))
    return out.astype(F32, copy=False)
