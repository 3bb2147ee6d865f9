"""Prefill attention on the tensor cores: two grouped GEMMs of `quant.cuda.tc` around a causal softmax.

    attention_tc(q, kc, vt, pos, pos_host, kq_scale, scores, att, grp, stream)

The KV cache is already a float32 matrix per KV head, so the tensor-core GEMM reads it as F32 "weights"
(`CacheMat`: no copy):
    scores[t H + h, s] = q[t, h] . kc[s, h // G]          rows s < pos + T of K-head h // G (one group per head)
    p = softmax_causal(scores * kq_scale)                 exp in float32, sum in float64 (`ops.softmax`)
    att[t, h] = sum_s p[t H + h, s] vt[h // G, :, s]      vt: the value cache transposed, [Hkv, Kv, S_pad]
`vt` is written beside `vc` by `qk_rope_kernel`, zero past the written rows (p is zero there too). Both GEMMs
skip what no token of a 32-token tile sees (`gemm_tc_kernel(causal=1 / 2)`): score rows past its last token's
position (softmax never reads them), value columns past the 128-column tile holding it.
Needs the head dims to be multiples of 128 (the GEMM's K tile) and a score buffer of T H x ceil(S/128) 128
floats; the runner falls back to `attention_gqa_kernel` / `attention_kernel` otherwise.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, float64

from quant.cuda import ops
from quant.cuda.device import warp_max
from quant.cuda.decoders import spec
from quant.cuda.gemv import GroupTable
from quant.cuda.moe import BN
from quant.cuda.weights import device_table
from quant.formats import GGMLType

from .kernels import block_softmax

SCORES_MAX_BYTES = 1 << 30       # the score buffer's limit (bigger prefills use attention_gqa_kernel)


class CacheMat:
    """A float32 device array seen by `ops.grouped` as an F32 weight of E matrices of O rows x I columns."""

    def __init__(self, a, O: int, I: int, E: int, rowb: int, estride: int):
        flat = a.reshape(-1)
        self.type = GGMLType.F32
        self.spec = spec(GGMLType.F32)
        self.tab = device_table(self.spec.table)
        self.w32 = flat.view(np.uint32)
        self.w16 = flat.view(np.float16)
        self.O, self.I, self.E, self.rowb, self.estride = O, I, E, rowb, estride


def head_groups(T: int, H: int, G: int) -> np.ndarray:
    """Group table: group h = query head h on KV head h // G, its pairs the rows t H + h of q (and of the out)."""
    rows = (np.arange(T)[None, :] * H + np.arange(H)[:, None]).astype(np.int32).reshape(-1)
    return GroupTable.build((np.arange(H) // G).astype(np.int32), np.full(H, T), rows, rows, H, BN)


def fits(T: int, H: int, K: int, Kv: int, s_end: int) -> bool:
    return K % 128 == 0 and Kv % 128 == 0 and T * H * cols(s_end) * 4 <= SCORES_MAX_BYTES


def cols(s_end: int) -> int:
    """Score columns the GEMMs run over: the cache rows seen, rounded up to the GEMM's 128-column tile."""
    return -(-s_end // 128) * 128


@cuda.jit
def softmax_causal_kernel(sc, H, pos, kq_scale, ncol):
    """Row r = t H + h of sc: p = softmax(sc[r, :S] * kq_scale) over S = pos[0] + t + 1, zeros to ncol.
    Grid T H, block 128."""
    buf = cuda.shared.array(32, float64)
    mx = cuda.shared.array(4, float32)
    r = cuda.blockIdx.x
    S = pos[0] + r // H + 1
    tid = cuda.threadIdx.x
    m = float32(-3.0e38)
    for s in range(tid, S, 128):
        v = sc[r, s] * float32(kq_scale)
        sc[r, s] = v
        m = max(m, v)
    m = warp_max(m)
    if tid % 32 == 0:
        mx[tid // 32] = m
    cuda.syncthreads()
    m = max(max(mx[0], mx[1]), max(mx[2], mx[3]))
    block_softmax(sc[r], S, m, buf)
    for s in range(S + tid, ncol, 128):
        sc[r, s] = float32(0.0)


def attention_tc(q, kc, vt, pos, pos_host: int, kq_scale: float, scores, att, grp, stream=0) -> None:
    """att [T, H Kv] = causal attention of q [T, H, K] over the cache rows 0 .. pos_host + T - 1 (see the module doc).

    kc [S_max, Hkv, K], vt [Hkv, Kv, S_pad]; pos: the device copy of pos_host; scores: float32 [>= T H,
    >= cols(pos_host + T)]; grp: `head_groups(T, H, G)` on the device. All arrays C-contiguous.
    """
    T, H, K = q.shape
    Hkv, Kv, S_pad = vt.shape
    n = cols(pos_host + T)
    ops.grouped(CacheMat(kc, pos_host + T, K, Hkv, Hkv * K * 4, K * 4), q.reshape(T * H, K), scores, grp, H, T * H, T,
                kernel="tc", stream=stream, causal=1, cpos=pos, ch=H)
    softmax_causal_kernel[T * H, 128, stream](scores, H, pos, kq_scale, n)
    ops.grouped(CacheMat(vt, Kv, n, Hkv, S_pad * 4, Kv * S_pad * 4), scores, att.reshape(T * H, Kv), grp, H, T * H, T,
                kernel="tc", stream=stream, causal=2, cpos=pos, ch=H)


__all__ = ["attention_tc", "head_groups", "fits", "cols", "CacheMat", "softmax_causal_kernel"]
