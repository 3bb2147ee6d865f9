"""Lookup tables of the non-linear ggml formats, as float32 arrays Numba freezes into the kernels.

The grid bytes themselves are ggml's (`ggml-common.h`: iq2xxs_grid, iq2xs_grid, iq2s_grid,
iq3xxs_grid, iq3s_grid, iq1s_grid, ksigns_iq2xs, kvalues_iq4nl, kvalues_mxfp4), read here from the
copies `gguf.quants` ships, then widened once to float32 rows so a kernel loads 8 (or 4) ready
values per grid index instead of unpacking bytes. Stored flat (row g of GRID [N, 8] is
GRID[8 g : 8 g + 8]) so the kernels index them with `ld`, one address computation per value:

    GRID_IQ2XXS [256, 8]   GRID_IQ2XS [512, 8]   GRID_IQ2S [1024, 8]     values 8, 25, 43
    GRID_IQ3XXS [256, 4]   GRID_IQ3S  [512, 4]                           values 4..62 / 1..15
    GRID_IQ1S   [2048, 8]                                                values -1, 0, 1
    GRID_IQ1S_I8 [2048, 8] the same as int8: 16 KB instead of 64 KB, so it stays in L1 (IQ1_S GEMV)
    SIGNS7      [128, 8]   +-1 per bit of ksigns_iq2xs[i] (7 stored sign bits + even-parity bit)
    SIGNS8      [256, 8]   +-1 per bit of a plain sign byte (dequant.py's IQ2_S, IQ3_S)
    KV_IQ4NL    [16]       kvalues_iq4nl;  KV_MXFP4 [16]: E2M1 values doubled (kvalues_mxfp4)
    E8M0_HALF   [256]      ggml_e8m0_to_fp32_half(e) = 2^(e-128)          (MXFP4 block scale)
    UE4M3_HALF  [256]      ggml_ue4m3_to_fp32(s): unsigned E4M3 scale * 0.5 (NVFP4)
"""
from __future__ import annotations

import math

import numpy as np
from gguf import quants as gq


def _grid(cls, rows: int, cols: int) -> np.ndarray:
    cls.init_grid()
    return np.ascontiguousarray(cls.grid.reshape(rows * cols), dtype=np.float32)


def _sign_rows(sign_bytes: np.ndarray) -> np.ndarray:
    """bytes [N] -> float32 [N, 8]: -1 where bit j of the byte is set, else +1."""
    bits = (sign_bytes[:, None] >> np.arange(8, dtype=np.uint8)[None, :]) & 1
    return np.where(bits == 1, np.float32(-1), np.float32(1)).astype(np.float32).reshape(-1)


def _ue4m3_half(x: int) -> float:
    if x in (0, 0x7F):
        return 0.0
    e, m = (x >> 3) & 0xF, x & 7
    raw = math.ldexp(float(m), -9) if e == 0 else math.ldexp(1.0 + m / 8.0, e - 7)
    return raw * 0.5


def _e8m0_half(x: int) -> np.float32:
    bits = (0x00200000 << x) if x < 2 else ((x - 1) << 23)
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


GRID_IQ2XXS = _grid(gq.IQ2_XXS, 256, 8)
GRID_IQ2XS = _grid(gq.IQ2_XS, 512, 8)
GRID_IQ2S = _grid(gq.IQ2_S, 1024, 8)
GRID_IQ3XXS = _grid(gq.IQ3_XXS, 256, 4)
GRID_IQ3S = _grid(gq.IQ3_S, 512, 4)
GRID_IQ1S = _grid(gq.IQ1_S, 2048, 8)
GRID_IQ1S_I8 = GRID_IQ1S.astype(np.int8)
SIGNS7 = _sign_rows(np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8))
SIGNS8 = _sign_rows(np.arange(256, dtype=np.uint8))
KV_IQ4NL = np.array(gq.IQ4_NL.kvalues, dtype=np.float32)
KV_MXFP4 = np.array(gq.MXFP4.kvalues, dtype=np.float32)
E8M0_HALF = np.array([_e8m0_half(i) for i in range(256)], dtype=np.float32)
UE4M3_HALF = np.array([_ue4m3_half(i) for i in range(256)], dtype=np.float32)
IQ1S_DELTA = np.float32(0.125)
