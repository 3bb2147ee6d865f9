"""Device kernels for the parts of a block that are not weight multiplies (numba-cuda).

Legend: T tokens, D model dim, S cache length, H / Hkv query / KV heads, K head dim, R rope dims,
E experts, A active experts per token.

Each kernel is the device form of one NumPy op of `refengine.ops` / `refengine.attention` /
`refengine.moe.router`, and is tested against it (tests/test_cuda_layer.py). The position of the first
new token is read from device memory (`pos[0]`), so a captured CUDA graph replays for any position.
"""
from __future__ import annotations

import functools
import math

from numba import cuda, float32, float64, int32

from quant.cuda.device import SIM, expf, warp_argmax, warp_max, warp_sum
from quant.cuda.moe import slot_sum
from quant.cuda.vec import ld4f

MAX_S = 4096          # attention: cache positions held in shared memory per (head, token) block
MAX_E = 1024          # routing: experts per token


@cuda.jit(device=True, inline=True)
def block_sum64(v, buf):
    """Sum of v over the block (float64, blockDim.x <= 1024); `buf` is a shared float64[32]."""
    lane = cuda.threadIdx.x % 32
    wid = cuda.threadIdx.x // 32
    v = warp_sum(v)
    if lane == 0:
        buf[wid] = v
    cuda.syncthreads()
    nw = (cuda.blockDim.x + 31) // 32
    t = float64(0.0)
    for i in range(nw):
        t += buf[i]
    cuda.syncthreads()
    return t


@cuda.jit(device=True, inline=True)
def block_softmax(row, S, m, buf):
    """row[:S] <- its softmax given its maximum m, as `ops.softmax`: exp in float32, the sum in float64.
    A block of 128 threads; `buf` a shared float64[32] (for `block_sum64`)."""
    tid = cuda.threadIdx.x
    acc = float64(0.0)
    for s in range(tid, S, 128):
        e = expf(row[s] - m)
        row[s] = e
        acc += float64(e)
    tot = block_sum64(acc, buf)
    for s in range(tid, S, 128):
        row[s] = float32(row[s] / tot)


NPT = 8                    # norm kernels: elements a thread holds in registers per pass over the row
NORM_BLOCK = 32 if SIM else 512                # their block (one pass over rows of up to NPT * 512 values)


@cuda.jit(device=True, inline=True)
def _norm_row(dn, A, res, has_res, w, eps, xo, store, out):
    """Row t = blockIdx.x: v = `slot_sum` (the residual stream), xo[t] <- v when `store`, then
    out[t] = v / sqrt(mean(v^2) + eps) * w (`ops.rms_norm`: the sum in float64, in index order per thread).

    One decode step runs this on a single block, so its cost is memory latency: each thread issues
    every load of a pass (NPT elements, stride blockDim) before it stores anything, and keeps the
    values in registers for the scale pass when the row fits in one pass."""
    buf = cuda.shared.array(32, float64)
    v = cuda.local.array(NPT, float32)
    wv = cuda.local.array(NPT, float32)
    t = cuda.blockIdx.x
    D = out.shape[1]
    nth = cuda.blockDim.x
    tid = cuda.threadIdx.x
    step = NPT * nth
    s = float64(0.0)
    for c in range(0, D, step):
        for j in range(NPT):
            i = c + j * nth + tid
            if i < D:
                v[j] = slot_sum(dn, A, res, has_res, t, i)
                wv[j] = w[i]
        for j in range(NPT):
            i = c + j * nth + tid
            if i < D:
                if store:
                    xo[t, i] = v[j]
                s += float64(v[j]) * float64(v[j])
    s = block_sum64(s, buf)
    scale = float32(1.0) / math.sqrt(float32(s / D) + float32(eps))
    if D <= step:                                        # one pass: v and w still in registers
        for j in range(NPT):
            i = j * nth + tid
            if i < D:
                out[t, i] = (v[j] * scale) * wv[j]
        return
    for c in range(0, D, step):
        for j in range(NPT):
            i = c + j * nth + tid
            if i < D:
                v[j] = slot_sum(dn, A, res, has_res, t, i) if not store else xo[t, i]
                wv[j] = w[i]
        for j in range(NPT):
            i = c + j * nth + tid
            if i < D:
                out[t, i] = (v[j] * scale) * wv[j]


@cuda.jit
def rms_norm_kernel(x, w, eps, out):
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w   (`ops.rms_norm`: the sum in float64).

    x, out: [T, D]; w: [D]. Grid T, block NORM_BLOCK."""
    _norm_row(x, 1, x, False, w, eps, x, False, out)


@cuda.jit
def add_rms_norm_kernel(dn, A, res, has_res, w, eps, xo, out):
    """xo[t] = (res[t] +) dn[t*A] + ... + dn[t*A + A - 1]   (the residual stream, `quant.cuda.moe.slot_sum`),
    then out[t] = rms_norm(xo[t]) * w as `rms_norm_kernel` (same float64 sum in the same order): one
    launch for a residual add (A = 1) or an expert combine and the norm that follows it.
    Grid T, block NORM_BLOCK."""
    _norm_row(dn, A, res, has_res, w, eps, xo, True, out)


@cuda.jit
def add_kernel(a, b, out):
    """out = a + b, elementwise over [T, D]. Grid-stride."""
    T, D = out.shape
    for i in range(cuda.grid(1), T * D, cuda.gridsize(1)):
        t = i // D
        d = i - t * D
        out[t, d] = a[t, d] + b[t, d]


@cuda.jit
def qk_rope_kernel(qkv, H, Hkv, K, qn, kn, has_norm, eps, cos, sin, n_rot, neox, pos, kc, vc, vt, q):
    """Split the fused projection, optional per-head RMS norm, RoPE, and append k, v to the cache.

    qkv: [T, H*K + 2*Hkv*K] (q | k | v); qn, kn: [K] norm weights (`attn_q_norm`, `attn_k_norm`);
    cos, sin: [T, n_rot/2]; kc, vc: [S_max, Hkv, K] caches written at rows pos[0] + t; vt: [Hkv, K, S_pad]
    the value cache transposed (column pos[0] + t; the prefill attention's operand, `attn.py`);
    q: [T, H, K] out. NORM pairs (2i, 2i+1) or NEOX pairs (i, i + n_rot/2). Grid (T, H + 2 Hkv), block K.
    """
    buf = cuda.shared.array(32, float64)
    hv = cuda.shared.array(1024, float32)
    t = cuda.blockIdx.x
    h = cuda.blockIdx.y
    i = cuda.threadIdx.x
    if h < H:
        off = h * K
    else:
        off = H * K + (h - H) * K
    x = qkv[t, off + i] if i < K else float32(0.0)
    if h >= H + Hkv:                                         # v head: straight into the cache
        if i < K:
            vc[pos[0] + t, h - H - Hkv, i] = x
            vt[h - H - Hkv, i, pos[0] + t] = x
        return
    if has_norm:
        s = block_sum64(float64(x) * float64(x), buf)
        scale = float32(1.0) / math.sqrt(float32(s / K) + float32(eps))
        wv = qn[i] if h < H else kn[i]
        if i < K:
            x = (x * scale) * wv
    if i < K:
        hv[i] = x
    cuda.syncthreads()
    half = n_rot // 2
    if i < n_rot:
        if neox:
            j = i % half
            c, sn = cos[t, j], sin[t, j]
            if i < half:
                x = hv[i] * c - hv[i + half] * sn
            else:
                x = hv[i - half] * sn + hv[i] * c
        else:
            j = i // 2
            c, sn = cos[t, j], sin[t, j]
            if i % 2 == 0:
                x = hv[i] * c - hv[i + 1] * sn
            else:
                x = hv[i - 1] * sn + hv[i] * c
    if i < K:
        if h < H:
            q[t, h, i] = x
        else:
            kc[pos[0] + t, h - H, i] = x


ATT_W = 4             # attention_kernel: warps per block
ATT_K = 256           # its largest head dim (the runner's bound)
ATT_PART = ATT_W * ATT_K               # its per-warp partial outputs


@cuda.jit
def attention_kernel(q, kc, vc, pos, kq_scale, out):
    """Causal softmax attention over the cache (`attention.mha.attention` with `causal_mask`).

    q: [T, H, K]; kc, vc: [S_max, Hkv, K] (K % 4 == 0, K <= ATT_K); token t sees cache rows 0 .. pos[0] + t;
    out: [T, H*K]. Grid (H, T), block 32 * ATT_W. The decode step's attention: few keys, one block per
    head, so the cost is the latency of dependent loads. Scores one thread per key (its row in 128-bit
    loads, all issued together), softmax as `ops.softmax` (exp in float32, sum in float64), values one
    warp per key subset (keys w, w + ATT_W, ...; each lane 4 dims of a row, 128-bit loads) and the ATT_W
    partial sums added in warp order.
    """
    sc = cuda.shared.array(MAX_S, float32)
    qs = cuda.shared.array(ATT_K, float32)
    part = cuda.shared.array(ATT_PART, float32)
    buf = cuda.shared.array(32, float64)
    mx = cuda.shared.array(ATT_W, float32)
    h = cuda.blockIdx.x
    t = cuda.blockIdx.y
    T, H, K = q.shape
    Hkv = kc.shape[1]
    hk = h // (H // Hkv)
    S = pos[0] + t + 1
    tid = cuda.threadIdx.x
    nth = cuda.blockDim.x
    lane = tid % 32
    wid = tid // 32
    for i in range(tid, K, nth):
        qs[i] = q[t, h, i]
    cuda.syncthreads()
    m = float32(-3.0e38)
    for s in range(tid, S, nth):
        kb = (s * Hkv + hk) * K
        d = float32(0.0)
        for i in range(0, K, 4):
            k0, k1, k2, k3 = ld4f(kc, kb + i)
            d = cuda.fma(qs[i], k0, d)
            d = cuda.fma(qs[i + 1], k1, d)
            d = cuda.fma(qs[i + 2], k2, d)
            d = cuda.fma(qs[i + 3], k3, d)
        d = d * float32(kq_scale)
        sc[s] = d
        m = max(m, d)
    m = warp_max(m)
    if lane == 0:
        mx[wid] = m
    cuda.syncthreads()
    m = mx[0]
    for w in range(1, ATT_W):
        m = max(m, mx[w])
    block_softmax(sc, S, m, buf)
    cuda.syncthreads()
    for i0 in range(4 * lane, K, 128):
        o0 = float32(0.0)
        o1 = float32(0.0)
        o2 = float32(0.0)
        o3 = float32(0.0)
        for s in range(wid, S, ATT_W):
            p = sc[s]
            v0, v1, v2, v3 = ld4f(vc, (s * Hkv + hk) * K + i0)
            o0 = cuda.fma(p, v0, o0)
            o1 = cuda.fma(p, v1, o1)
            o2 = cuda.fma(p, v2, o2)
            o3 = cuda.fma(p, v3, o3)
        pb = wid * ATT_K + i0
        part[pb] = o0
        part[pb + 1] = o1
        part[pb + 2] = o2
        part[pb + 3] = o3
    cuda.syncthreads()
    for i in range(tid, K, nth):
        o = part[i]
        for w in range(1, ATT_W):
            o += part[w * ATT_K + i]
        out[t, h * K + i] = o


GQA_SC = 8192        # attention_gqa: scores held in shared memory per block (G heads x S keys)
GQA_Q = 2048         # attention_gqa: query values held in shared memory (G heads x K)
GQA_MIN_T = 16       # the runner takes attention_gqa from this many new tokens on (prefill)


def gqa_fits(G: int, S: int, K: int) -> bool:
    """True when `attention_gqa_kernel(G)` serves G query heads per KV head over S cache rows of K dims."""
    return G * S <= GQA_SC and G * K <= GQA_Q and K % 4 == 0 and G <= 16


@functools.lru_cache(maxsize=None)
def attention_gqa_kernel(G: int):
    """Causal softmax attention as `attention_kernel`, one block per (KV head, token) for its G query heads.

    q: [T, H, K] (H = G Hkv); kc, vc: [S_max, Hkv, K]; token t sees cache rows 0 .. pos[0] + t; out: [T, H*K].
    Grid (Hkv, T), block 256 (8 warps). Each cache row is read once for the G heads that share it (the
    per-head kernel reads it G times): scores one thread per key, its row in 128-bit loads, the G queries
    from shared memory; softmax one warp per head (exp in float32, sum in float64, `ops.softmax`);
    values one thread per (output dim, half of the heads), keys in order. Needs `gqa_fits(G, S, K)`.
    """
    GH = (G + 1) // 2

    @cuda.jit
    def attention_gqa(q, kc, vc, pos, kq_scale, out):
        sc = cuda.shared.array(GQA_SC, float32)
        qs = cuda.shared.array(GQA_Q, float32)
        hk = cuda.blockIdx.x
        t = cuda.blockIdx.y
        K = q.shape[2]
        Hkv = kc.shape[1]
        S = pos[0] + t + 1
        tid = cuda.threadIdx.x
        nth = cuda.blockDim.x
        lane = tid % 32
        wid = tid // 32
        for i in range(tid, G * K, nth):
            qs[i] = q[t, hk * G + i // K, i % K]
        cuda.syncthreads()
        acc = cuda.local.array(G, float32)
        for s in range(tid, S, nth):
            for g in range(G):
                acc[g] = float32(0.0)
            kb = (s * Hkv + hk) * K
            for i in range(0, K, 4):
                k0, k1, k2, k3 = ld4f(kc, kb + i)
                for g in range(G):
                    a = cuda.fma(qs[g * K + i], k0, acc[g])
                    a = cuda.fma(qs[g * K + i + 1], k1, a)
                    a = cuda.fma(qs[g * K + i + 2], k2, a)
                    acc[g] = cuda.fma(qs[g * K + i + 3], k3, a)
            for g in range(G):
                sc[g * S + s] = acc[g] * float32(kq_scale)
        cuda.syncthreads()
        for g in range(wid, G, nth // 32):
            m = float32(-3.0e38)
            for s in range(lane, S, 32):
                m = max(m, sc[g * S + s])
            m = warp_max(m)
            tot = float64(0.0)
            for s in range(lane, S, 32):
                e = expf(sc[g * S + s] - m)
                sc[g * S + s] = e
                tot += float64(e)
            tot = warp_sum(tot)
            for s in range(lane, S, 32):
                sc[g * S + s] = float32(sc[g * S + s] / tot)
        cuda.syncthreads()
        o = cuda.local.array(GH, float32)
        for w in range(tid, 2 * K, nth):
            i = w % K
            g0 = (w // K) * GH
            for j in range(GH):
                o[j] = float32(0.0)
            for s in range(S):
                vv = vc[s, hk, i]
                for j in range(GH):
                    if g0 + j < G:
                        o[j] = cuda.fma(sc[(g0 + j) * S + s], vv, o[j])
            for j in range(GH):
                if g0 + j < G:
                    out[t, (hk * G + g0 + j) * K + i] = o[j]
    return attention_gqa


def route_kernel(E: int):
    """The routing kernel for E experts (`_route_kernel` with the per-lane count it needs)."""
    if not 0 < E <= MAX_E:
        raise ValueError(f"route_kernel: {E} experts (1 .. {MAX_E})")
    npl = 1
    while npl * 32 < E:
        npl *= 2
    return _route_kernel(npl)


@functools.cache
def _route_kernel(npl: int):
    """Softmax top-k routing (`moe.router.softmax_topk`): logits [T, E] -> ids [T, A] int32, wts [T*A].

    Probabilities in float32 with a float64 sum; top-k by repeated arg-max (lower index first on
    ties); weights renormalized by their float64 sum clamped at 2^-14 when norm_w. Grid T, block 32:
    lane l holds experts l, l + 32, ... (E <= 32 npl) in registers.
    """
    @cuda.jit
    def route(logits, k, norm_w, ids, wts):
        p = cuda.local.array(npl, float32)
        t = cuda.blockIdx.x
        E = logits.shape[1]
        lane = cuda.threadIdx.x
        m = float32(-3.0e38)
        for j in range(npl):
            e = j * 32 + lane
            p[j] = logits[t, e] if e < E else float32(-3.0e38)
        for j in range(npl):
            m = max(m, p[j])
        m = warp_max(m)
        s = float64(0.0)
        for j in range(npl):
            if j * 32 + lane < E:
                p[j] = expf(p[j] - m)
                s += float64(p[j])
        s = warp_sum(s)
        for j in range(npl):
            p[j] = float32(p[j] / s) if j * 32 + lane < E else float32(-3.0)
        wsum = float64(0.0)
        for a in range(k):
            best = float32(-1.0)
            bi = int32(E)
            for j in range(npl):
                if p[j] > best:
                    best = p[j]
                    bi = int32(j * 32 + lane)
            best, bi = warp_argmax(best, bi)
            for j in range(npl):
                if j * 32 + lane == bi:
                    p[j] = float32(-2.0)
            if lane == 0:
                ids[t, a] = bi
                wts[t * k + a] = best
            wsum += float64(best)
        if norm_w and lane == 0:
            d = max(float32(wsum), float32(6.103515625e-5))
            for a in range(k):
                wts[t * k + a] = wts[t * k + a] / d
    return route
