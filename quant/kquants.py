"""K-quant reference quantizers in NumPy, bit-exact with ggml's `quantize_row_q{2..6}_K_ref` (ggml-quants.c).

A K-quant super-block holds 256 weights in sub-blocks of 16 or 32. Each sub-block gets a scale (and for
Q2_K/Q4_K/Q5_K a min) found by a small search (`make_q*_quants`); the sub-block scales are then
themselves quantized to 4, 6 or 8 bits against one fp16 super-scale `d` (and `dmin`), and finally every
weight is re-quantized against its *quantized* sub-block scale.

    sub-blocks  search             code range   scale bits   layout (bytes)
    Q2_K  16x16 make_qkx2 (mad)    0..3         4 + 4 min    scales[16] qs[64] d dmin            = 84
    Q3_K  16x16 make_q3 (rmse)     -4..3        6 signed     hmask[32] qs[64] scales[12] d      = 110
    Q4_K   8x32 make_qkx2          0..15        6 + 6 min    d dmin scales[12] qs[128]          = 144
    Q5_K   8x32 make_qkx2          0..31        6 + 6 min    d dmin scales[12] qh[32] qs[128]   = 176
    Q6_K  16x16 make_qx (rmse 1)   -32..31      8 signed     ql[128] qh[64] scales[16] d        = 210

The searches run over all sub-blocks at once: the C loop over sub-blocks becomes the leading axis, the
loop over weights stays a loop (or a sequential `seq_sum`), so every float32 operation happens in the
same order as in C. Legend: N super-blocks, S sub-blocks per super-block, B weights per sub-block.
"""
from __future__ import annotations

import numpy as np

from .rounding import F32, fp16_bits, fp16_round, nearest_int, seq_sum, seq_sum_from_first

GROUP_MAX_EPS = F32(1e-15)


def _errstate():
    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


def _first_absmax(x: np.ndarray) -> np.ndarray:
    """The signed value of largest magnitude, first occurrence (`if (ax > amax) { amax = ax; max = x[i]; }`)."""
    i = np.argmax(np.abs(x), axis=-1)
    return np.take_along_axis(x, i[:, None], axis=-1)[:, 0]


# ---------------------------------------------------------------- sub-block searches

def make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int,
                     use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`make_qkx2_quants`: codes L in 0..nmax with x ~ scale * L - the_min, minimizing sum w*|err| (use_mad)
    or sum w*err^2, trying nstep+1 candidate scales. x, w: [M, B] -> scale [M], the_min [M], L [M, B] uint8."""
    with _errstate():
        mn = np.minimum(x.min(axis=-1), F32(0))                              # if (min > 0) min = 0
        mx = x.max(axis=-1)
        sum_w = seq_sum_from_first(w)
        sum_x = seq_sum_from_first(w * x)
        flat = mx == mn
        rng = np.where(flat, F32(1), mx - mn)
        iscale = F32(nmax) / rng
        scale = F32(1) / iscale
        xm = x - mn[:, None]                                                 # [M, B]
        L = np.clip(nearest_int(iscale[:, None] * xm), 0, nmax)
        diff = scale[:, None] * L.astype(F32) + mn[:, None] - x
        best = seq_sum(w * (np.abs(diff) if use_mad else diff * diff))
        for step in range(nstep + 1 if nstep >= 1 else 0):
            # C keeps using `min` after a better trial replaced it: the next trials start from the new min
            rng = np.where(flat, F32(1), mx - mn)
            isc = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / rng
            La = np.clip(nearest_int(isc[:, None] * (x - mn[:, None])), 0, nmax).astype(F32)
            sum_l = seq_sum(w * La)
            sum_l2 = seq_sum(w * La * La)
            sum_xl = seq_sum(w * La * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, F32(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            d = this_scale[:, None] * La + this_min[:, None] - x
            cur = seq_sum(w * (np.abs(d) if use_mad else d * d))
            take = (D > 0) & (cur < best) & ~flat
            L = np.where(take[:, None], La.astype(L.dtype), L)
            best = np.where(take, cur, best)
            scale = np.where(take, this_scale, scale)
            mn = np.where(take, this_min, mn)
    L = np.where(flat[:, None], 0, L)
    scale = np.where(flat, F32(0), scale)
    return scale.astype(F32), (-mn).astype(F32), L.astype(np.uint8)


def make_qx_quants_rmse1(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """`make_qx_quants(n, nmax, x, L, rmse_type=1, NULL)`: symmetric codes L in 0..2*nmax-1 (offset nmax),
    weights x^2, 18 extra trial scales -(nmax + 0.1*is)/max. x: [M, B] -> scale [M], L [M, B] int32."""
    with _errstate():
        mx = _first_absmax(x)
        tiny = np.abs(mx) < GROUP_MAX_EPS
        mxs = np.where(tiny, F32(1), mx)
        w = x * x

        def trial(iscale):
            l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
            lf = l.astype(F32)
            return l, seq_sum(w * x * lf), seq_sum(w * lf * lf)

        l, sumlx, suml2 = trial(F32(-nmax) / mxs)
        L = l + nmax
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0)).astype(F32)
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            isc = -(F32(nmax) + F32(0.1) * F32(step)) / mxs
            l, sumlx, suml2 = trial(isc)
            take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            L = np.where(take[:, None], l + nmax, L)
            scale = np.where(take, sumlx / suml2, scale)
            best = np.where(take, scale * sumlx, best)
    return np.where(tiny, F32(0), scale).astype(F32), np.where(tiny[:, None], 0, L)


def make_q3_quants_rmse(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """`make_q3_quants(n, nmax, x, L, do_rmse=true)`: start from round(-nmax/max * x), then up to 5 sweeps
    of coordinate descent on sum x^2 (x - s*l)^2, one weight at a time in order.
    x: [M, B] -> scale [M], L [M, B] int32 in 0..2*nmax-1 (all zero for an all-zero sub-block)."""
    M, B = x.shape
    with _errstate():
        mx = _first_absmax(x)
        tiny = np.abs(mx) < GROUP_MAX_EPS
        iscale = F32(-nmax) / np.where(tiny, F32(1), mx)
        L = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)       # [M, B]
        w = x * x
        wx = w * x
        sumlx = seq_sum(wx * L.astype(F32))
        suml2 = seq_sum(w * L.astype(F32) * L.astype(F32))
        active = ~tiny
        for _ in range(5):
            changed = np.zeros(M, dtype=bool)
            for i in range(B):
                li = L[:, i].astype(F32)
                slx = sumlx - wx[:, i] * li
                sl2 = suml2 - w[:, i] * li * li
                new = np.clip(nearest_int(x[:, i] * sl2 / slx), -nmax, nmax - 1)
                nf = new.astype(F32)
                slx2 = slx + wx[:, i] * nf
                sl22 = sl2 + w[:, i] * nf * nf
                take = (active & (slx > 0) & (new != L[:, i]) & (sl22 > 0)
                        & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22))
                L[:, i] = np.where(take, new, L[:, i])
                sumlx = np.where(take, slx2, sumlx)
                suml2 = np.where(take, sl22, suml2)
                changed |= take
            active &= changed
            if not active.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    return np.where(tiny, F32(0), scale).astype(F32), np.where(tiny[:, None], 0, L + nmax)


# ---------------------------------------------------------------- packing helpers

def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """qs[j/4 + l] = L[j+l] | L[j+l+32] << 2 | L[j+l+64] << 4 | L[j+l+96] << 6 for j in (0, 128).
    L: [N, 256] codes 0..3 -> [N, 64]."""
    g = L.astype(np.uint8).reshape(-1, 2, 4, 32)                             # [N, half, shift, l]
    q = g << np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    return np.bitwise_or.reduce(q, axis=2).reshape(-1, 64)


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """The 12-byte 6-bit scale/min packing of Q4_K/Q5_K (inverse of `get_scale_min_k4`). ls, lm: [N, 8] -> [N, 12]."""
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    s = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    s[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    s[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (ls[:, 4:8] & 0xF) | ((lm[:, 4:8] & 0xF) << 4)
    return s


def _scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`get_scale_min_k4` for j = 0..7: s [N, 12] -> sc [N, 8], m [N, 8] (6-bit values)."""
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def _requant_with_min(x, d, dmin, sc, m, nmax, L):
    """Re-quantize against the stored scales: l = clamp(nearest_int((x + dmin*m)/(d*sc)), 0, nmax) where
    d*sc != 0, else keep the search's codes. x: [N, S, B], d/dmin: [N], sc/m: [N, S], L: [N, S, B]."""
    with _errstate():
        ds = fp16_round(d)[:, None] * sc.astype(F32)                         # [N, S]
        dm = fp16_round(dmin)[:, None] * m.astype(F32)
        l = np.clip(nearest_int((x + dm[..., None]) / ds[..., None]), 0, nmax)
    return np.where((ds != 0)[..., None], l, L)


def _u8(v: np.ndarray) -> np.ndarray:
    """C's `uint8_t u = int_value` (keep the low byte)."""
    return (v & 0xFF).astype(np.uint8)


# ---------------------------------------------------------------- the five formats

def _qkx_scales(x, nmax, rmin, rdelta, nstep, use_mad, weights):
    """Search every sub-block, then the super-block maxima (`if (scale > max_scale) max_scale = scale`)."""
    N, S, B = x.shape
    xs, ws = x.reshape(N * S, B), weights.reshape(N * S, B)
    scales, mins, L = make_qkx2_quants(xs, ws, nmax, rmin, rdelta, nstep, use_mad)
    scales, mins, L = scales.reshape(N, S), mins.reshape(N, S), L.reshape(N, S, B)
    return scales, mins, L, np.maximum(scales.max(axis=1), F32(0)), np.maximum(mins.max(axis=1), F32(0))


def quantize_q2_k(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q2_K_ref`. b: [N, 256] -> [N, 84]."""
    x = b.reshape(-1, 16, 16)
    scales, mins, L, max_scale, max_min = _qkx_scales(x, 3, -0.5, 0.1, 15, True, np.abs(x))
    with _errstate():
        ls = np.where(max_scale[:, None] > 0, nearest_int((F32(15) / max_scale)[:, None] * scales), 0)
        lm = np.where(max_min[:, None] > 0, nearest_int((F32(15) / max_min)[:, None] * mins), 0)
    sb = _u8(ls) | _u8(lm << 4)                                              # [N, 16]
    d = np.where(max_scale > 0, max_scale / F32(15), F32(0)).astype(F32)
    dmin = np.where(max_min > 0, max_min / F32(15), F32(0)).astype(F32)
    L = _requant_with_min(x, d, dmin, sb & 0xF, sb >> 4, 3, L)
    return np.concatenate([sb, _pack_2bit(L.reshape(-1, 256)),
                           fp16_bits(d)[:, None].view(np.uint8), fp16_bits(dmin)[:, None].view(np.uint8)], axis=1)


def quantize_q3_k(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q3_K_ref`. b: [N, 256] -> [N, 110]."""
    N = b.shape[0]
    x = b.reshape(N, 16, 16)
    scales, L = make_q3_quants_rmse(x.reshape(N * 16, 16), 4)
    scales, L = scales.reshape(N, 16), L.reshape(N, 16, 16)
    max_scale = _first_absmax(scales)
    nz = max_scale != 0
    with _errstate():
        iscale = F32(-32) / np.where(nz, max_scale, F32(1))
        l = nearest_int(iscale[:, None] * scales)
    l = ((l + 128) & 0xFF) - 128                                             # (int8_t)
    l = np.clip(l, -32, 31) + 32                                             # 6-bit codes 0..63, [N, 16]
    l = np.where(nz[:, None], l, 0)
    sc = np.zeros((N, 12), dtype=np.uint8)
    sc[:, 0:8] = (l[:, 0:8] & 0xF) | ((l[:, 8:16] & 0xF) << 4)
    hi = (l >> 4).reshape(N, 4, 4)                                           # [N, j // 4, j % 4]
    sc[:, 8:12] = np.bitwise_or.reduce(hi << (2 * np.arange(4))[None, :, None], axis=1)
    d = np.where(nz, F32(1) / iscale, F32(0)).astype(F32)
    s = (l - 32).astype(F32)                                                 # the stored signed scales
    with _errstate():
        ds = fp16_round(d)[:, None] * s                                      # [N, 16]
        lq = np.clip(nearest_int(x / ds[..., None]), -4, 3) + 4
    L = np.where((ds != 0)[..., None], lq, L).reshape(N, 256)
    high = L > 3
    hmask = np.bitwise_or.reduce(high.reshape(N, 8, 32).astype(np.uint8) << np.arange(8, dtype=np.uint8)[None, :, None],
                                 axis=1)                                     # bit j // 32 of byte j % 32
    L = np.where(high, L - 4, L)
    return np.concatenate([hmask, _pack_2bit(L), sc, fp16_bits(d)[:, None].view(np.uint8)], axis=1)


def _q45_k(b: np.ndarray, nmax: int, rmin: float, nstep: int):
    """Shared part of Q4_K and Q5_K: 8 sub-blocks of 32, weights av_x + |x|, 6-bit scales and mins."""
    N = b.shape[0]
    x = b.reshape(N, 8, 32)
    av_x = np.sqrt(seq_sum(x * x) / F32(32))                                 # [N, 8]
    weights = av_x[..., None] + np.abs(x)
    scales, mins, L, max_scale, max_min = _qkx_scales(x, nmax, rmin, 0.1, nstep, False, weights)
    with _errstate():
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    ls = np.minimum(63, _u8(nearest_int(inv_scale[:, None] * scales)))
    lm = np.minimum(63, _u8(nearest_int(inv_min[:, None] * mins)))
    d, dmin = max_scale / F32(63), max_min / F32(63)
    s12 = _pack_scale_min_k4(ls, lm)
    sc, m = _scale_min_k4(s12)
    L = _requant_with_min(x, d, dmin, sc, m, nmax, L).reshape(N, 256)
    head = np.concatenate([fp16_bits(d)[:, None].view(np.uint8), fp16_bits(dmin)[:, None].view(np.uint8), s12], axis=1)
    return head, L


def quantize_q4_k(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q4_K_ref`: make_qkx2_quants(32, 15, ..., -1, 0.1, 20). b: [N, 256] -> [N, 144]."""
    head, L = _q45_k(b, 15, -1.0, 20)
    g = L.astype(np.uint8).reshape(-1, 4, 2, 32)                             # q[l] = L[j+l] | L[j+l+32] << 4
    return np.concatenate([head, (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(-1, 128)], axis=1)


def quantize_q5_k(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q5_K_ref`: make_qkx2_quants(32, 31, ..., -0.5, 0.1, 15). b: [N, 256] -> [N, 176]."""
    head, L = _q45_k(b, 31, -0.5, 15)
    g = L.astype(np.uint8).reshape(-1, 4, 2, 32)                             # [N, chunk of 64, half, j]
    ql = ((g[:, :, 0] & 0xF) | ((g[:, :, 1] & 0xF) << 4)).reshape(-1, 128)
    hb = (g >> 4).reshape(-1, 8, 32)                                         # high bit of L[n + j], order (chunk, half)
    qh = np.bitwise_or.reduce(hb << np.arange(8, dtype=np.uint8)[None, :, None], axis=1)
    return np.concatenate([head, qh, ql], axis=1)


def quantize_q6_k(b: np.ndarray) -> np.ndarray:
    """`quantize_row_q6_K_ref`: make_qx_quants(16, 32, rmse 1), 8-bit signed scales. b: [N, 256] -> [N, 210]."""
    N = b.shape[0]
    x = b.reshape(N, 16, 16)
    scales, L = make_qx_quants_rmse1(x.reshape(N * 16, 16), 32)
    scales, L = scales.reshape(N, 16), L.reshape(N, 16, 16)
    max_scale = _first_absmax(scales)
    zero = np.abs(max_scale) < GROUP_MAX_EPS
    with _errstate():
        iscale = F32(-128) / np.where(zero, F32(1), max_scale)
        sc = np.minimum(127, nearest_int(iscale[:, None] * scales))
    sc = (((sc + 128) & 0xFF) - 128).astype(np.int8)                         # int8 scales
    d = (F32(1) / iscale).astype(F32)
    with _errstate():
        ds = fp16_round(d)[:, None] * sc.astype(F32)
        lq = np.clip(nearest_int(x / ds[..., None]), -32, 31) + 32
    L = np.where((ds != 0)[..., None], lq, L).astype(np.uint8).reshape(N, 2, 4, 32)   # [N, half, quarter, l]
    ql = np.concatenate([(L[:, :, 0] & 0xF) | ((L[:, :, 2] & 0xF) << 4),
                         (L[:, :, 1] & 0xF) | ((L[:, :, 3] & 0xF) << 4)], axis=2).reshape(N, 128)
    qh = np.bitwise_or.reduce((L >> 4) << (2 * np.arange(4, dtype=np.uint8))[None, None, :, None], axis=2).reshape(N, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), fp16_bits(d)[:, None].view(np.uint8)], axis=1)
    out[zero] = 0
    return out
