"""Fused kernels for the small ops of a device-resident step: one launch where the NumPy statement of the op, run
on CuPy arrays, takes five to nine (issue 23: a decode step's time on the GPU is mostly launches, not bytes).

    rms_norm(x, w, eps)      ops/norm.py `rms_norm`: [..., D] float32 rows, w [D] or None
    add_rms_norm(x, a, w, eps)   ops/norm.py `add_rms_norm`: (x + a, its rms_norm), one launch
    add_slots_rms_norm(x, slots, extra, w, eps)   ops/norm.py: a MoE layer's slots summed (+ its shared experts), the
                             residual add and the next norm, one launch
    l2_norm(x, eps)          attention/delta_rule.py `l2_norm` (the norm and its 1 / sqrt(D)), one launch
    gdn_gates(b, a, r, bias, A)   attention/gated_deltanet.py's beta, softplus(a + bias) and its product with A
    layer_norm(x, w, b, eps) ops/norm.py `layer_norm`, w and b [D] or None
    softmax(x)               ops/softmax.py `softmax` over the last axis, float32
    silu(x), sigmoid(x)      ops/activations.py, float32
    swiglu(gate, up)         silu(gate) * up, float32, same shape
    softplus(x)              ops/activations.py, float32
    situ(gate, up, beta, lb), swiglu_clamp(gate, up, limit)   ops/activations.py (Kimi-K3, DeepSeek-V4), float32
    delta_rule(q, k, v, g, beta, S, scale)   attention/delta_rule.py `recurrent`: every token of a call, one launch
    kda_gates(z, b, bias, A, dh, lb)   attention/kda.py `gates`: the log decay and beta, one launch
    rms_norm_gated(x, w, eps, gate, act)   ops/norm.py: the norm times silu / sigmoid of a gate (short rows)
    causal_conv(x, w, tail, then_silu)  attention/short_conv.py: the output (its silu) and the new tail, one launch
    apply_rope(x, cos, sin, n_rot, mode)    ops/rope.py `apply_rope`, NORM and NEOX
    rope_tail(x, cos, sin, n_rot, inverse)  attention/rope_tail.py (DeepSeek-V4): the last n_rot dims, +-theta
    rope_cos_sin(positions, ...)   ops/rope.py `rope_cos_sin` at positions other than the step's own (tables)
    attention_causal(q, k, v, q_pos, kq_scale, causal)   attention/mha.py `attention_blocked` under the causal mask
                             (or none): a few queries (a decode step) one block per (query, head); a prefill a
                             warp per (query, head), online softmax (PREFILL_ATTENTION, ROWS_MAX_K)
    attention_gathered(q, k, v, idx, live, kq_scale, sinks)   attention/mha.py `attention_gathered` (sparse
                             attention's selected keys, DeepSeek-V4's sinks), the same kernel, any number of queries
    hc_gates(m, scale, base, n, iters, eps), collapse(X, pre), hc_post(y, X, post, comb)
                             residual/hyper_connections.py (DeepSeek-V4): a sub-layer's pre, post and Sinkhorn comb
                             from its mixes (one launch; the NumPy statement: eleven and the iterations'), the
                             streams read and written back
    gated_mean(xn, g), streams_combine(R, out, inj)   residual/gated_streams.py (Qwen3.8-Flash-Next): the mixer's
                             gated mean over the streams and the combiner, one launch each
    top_k(x, k)              moe/router.py `topk_desc`: the k largest of each row (k <= TOPK_MAX, rows <= TOPK_E)
    route_softmax(x, k, norm_w, scale)   moe/router.py `route`, softmax gating without bias or groups, and
    route_sigmoid(x, k, bias, norm_w, scale, G, n)   sigmoid gating (a bias, groups or not): the gate, its selection,
                             the groups kept, the top k and their weights in one launch
    ggml_top_k_rows(x, n, k) ops/top_k.py `ggml_top_k_rows` (libstdc++'s heap select replayed, a thread a row: the
                             k-pool indexer's fixed-shape selection; reached through `ops.arrays.row_kernel`)
    group_limited(s, G, n)   moe/router.py `group_limited`: the experts of the n best of G groups kept, the rest -inf
    pool_at(kv, score, b, r, c, K)   attention/kv_compressor.py `pool_blocks_at`: DeepSeek-V4's compressed blocks pooled
                             from a fixed-shape run's rows (a thread a block and dim)
    all_finite_many(ys, page, cells)   page.flat[cell] = False for each y holding a NaN/inf: up to FLAG_BATCH
                             flags (the NaN checks of a step's products) in one launch

The NumPy functions stay the statement of the math; each calls its kernel here when its input is a DeviceArray on
a GPU (`fused_op(x, name)`, refengine/ops/arrays.py) and the kernel takes its shape and dtype (else None is
returned and the NumPy code runs on the device as before). The kernels compute what the NumPy code computes, in
the same precision (the sums in float64 where NumPy's are; every float32 rounding of NumPy's written out, which the
CUDA simulator's float64 Python math needs), in another order of summation: equal to the NumPy op
within float rounding, not bit for bit (tests/test_fused.py: the kernels under the CUDA simulator on toy shapes, on
a GPU at real shapes and a whole forward against NumPy; every call site's arguments checked against the entry points
on the sim device). Every launch goes on CuPy's current stream (a CUDA graph capture holds it). `Device.fused = None`
turns them off (a runtime: KernelPolicy(fused_ops=False)). Block reductions are written here (`_block_sum64`,
`_block_max`) over `quant.cuda.device.warp_sum`.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import boolean, cuda, float32, float64, int32

from quant.cuda.device import (SIM, before_desc, max_nan, top2_merge, warp_first_desc, warp_first_desc_with,
                              warp_max_nan, warp_sum, warp_top2)

from ..moe.router import F16_MIN_NORMAL as F16_MIN

DR_K = 256                  # the delta rule's largest K (its shared arrays' width: a literal, numba-cuda refuses an
DR_ROWS = DR_K // 32        # expression as a shape), held DR_ROWS state rows per lane
DR_WARPS = 8                # its value columns per block (a warp each)
DR_TC = 8                   # its tokens staged in shared memory at a time (3 x 8 x 256 floats: 24 KB)
NT = 256                    # threads of a row's block (a power of two: the tree reductions)
NTW = 8                     # its warps (NT // 32, a literal: a shared array's shape)
assert NTW * 32 == NT
RPT = 8                     # _rms_rows: elements a thread holds in registers a pass over its row
SLOT_GROUP = 4              # _rms_rows_slots: a MoE layer's expert slots loaded together (g0..g3: 4 x RPT registers)
assert SLOT_GROUP == 4      # (the kernel holds the group in four named arrays)
RPW = 8                     # _rms_warps: elements a lane holds; rows of at most 32 * RPW take a warp each
WARP_ROW_MAX_D = 32 * RPW
# rms_norm's rows take NT threads whatever their length: RPT elements a thread a pass keep a long row's passes few.
# (Sessions 28-31 gave a few long rows 1024 threads, then 512: with RPT values and weights in registers the GPU
# refused both launches, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, session 32 on an H100; NT's 256 ran.)


@cuda.jit(device=True, inline=True)
def _block_sum64(v, buf):
    """Sum of v over the block (float64, blockDim.x <= 1024), every thread calling; buf: a shared float64[32]."""
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
def _block_max(v, sh):
    """The maximum of v over the block (NaN wins, as np.max), every thread calling; sh: a shared float32 array of at
    least the block's warps (a multiple of 32 threads). Each warp's by shuffles, then the warps' maxima: two
    barriers (a tree over shared memory took log2(threads) + 2; session 37: a decode step's attention and router
    are such chains of barriers and round trips)."""
    t = cuda.threadIdx.x
    v = warp_max_nan(v)
    if t % 32 == 0:
        sh[t // 32] = v
    cuda.syncthreads()
    m = sh[0]
    for i in range(1, cuda.blockDim.x // 32):
        m = max_nan(m, sh[i])
    cuda.syncthreads()
    return m


@cuda.jit(device=True, inline=True)
def _inv_rms(acc, buf, D, eps):
    """1 / sqrt(mean + eps) in `ops.rms_norm`'s float32 steps, the mean from every thread's float64 sum of squares
    acc over the block (buf: 32 float64 shared)."""
    mean = float32(_block_sum64(acc, buf) / D)
    return float32(1.0) / float32(math.sqrt(float32(mean + eps)))


@cuda.jit(device=True, inline=True)
def _addend(a, A, e, has_e, r, j):
    """What a norm's row r adds to x at j: a[r, j] (A = 1), or a's rows r*A .. r*A + A - 1 summed in that order (a
    MoE layer's weighted expert slots, as ggml adds them); then + e[r, j] (has_e: the shared experts' output)."""
    v = a[r * A, j]
    for k in range(1, A):
        v += a[r * A + k, j]
    if has_e:
        v = v + e[r, j]
    return v


def _named_kernel(fn, name: str):
    """cuda.jit(fastmath=False) of a factory's function under a name of its own: a factory's kernels would otherwise
    share one, and a profile (torch.profiler's names, less their per-process abi tags) would add them together."""
    fn.__name__ = fn.__qualname__ = name
    return cuda.jit(fastmath=False)(fn)


@functools.cache
def rms_rows_kernel(slots: bool):
    """`_rms_rows` (slots False: a norm, or a residual add (A = 1) and the norm) and `_rms_rows_slots` (a MoE layer's
    A > 1 expert slots summed into the add: has_a True): one body, two kernels, so a plain norm carries none of the
    slot groups' code (its cubin no larger than before them: session 38 saw a decode step's small kernels cost more
    with their code than with their loads). `python -m refengine.cuda.ptx --resources -k fused_rms` gives both
    kernels' registers."""

    def rms_rows(x, a, A, e, has_e, has_a, w, has_w, eps, post, s, y):
        """Row r = blockIdx.x: v = x (has_a: v = x + `_addend` in float32, written to s), the mean of v^2 summed in
        float64, y = v * (1 / sqrt(mean + eps)) (* w) * post, each product rounded to float32 as `ops.rms_norm` rounds
        it (`ops.add_rms_norm`; post: `delta_rule.l2_norm`'s 1 / sqrt(D), 1 for the others: exact).

        A thread takes a row's elements t, t + nt, ... (the float64 sum in that order), RPT at a time: it issues the
        RPT loads before it stores anything, and a row that fits one pass keeps them in registers for the scale pass.
        A store through one array keeps the compiler from moving the next load through another above it (they might
        alias), so a load-compute-store loop waits a memory round trip an element: a decode step's norm (one block a
        row) costs its chain of round trips, not its bytes (docs/quant.md)."""
        r = cuda.blockIdx.x
        t = cuda.threadIdx.x
        nt = cuda.blockDim.x                             # NT
        D = x.shape[1]
        buf = cuda.shared.array(32, float64)
        v = cuda.local.array(RPT, float32)
        wv = cuda.local.array(RPT, float32)
        xv = cuda.local.array(RPT, float32)
        ev = cuda.local.array(RPT, float32)
        g0 = cuda.local.array(RPT, float32)              # SLOT_GROUP (4) slots' values of the pass, loaded together
        g1 = cuda.local.array(RPT, float32)
        g2 = cuda.local.array(RPT, float32)
        g3 = cuda.local.array(RPT, float32)
        step = RPT * nt
        acc = float64(0.0)
        for c in range(0, D, step):
            if not slots:                                # x + a (+ e): no slot loop between them, a pass's loads in
                #                                          flight together (163 registers, 121 with the loop)
                if has_a:
                    for k in range(RPT):
                        j = c + k * nt + t
                        if j < D:
                            v[k] = a[r, j]
                    if has_e:
                        for k in range(RPT):
                            j = c + k * nt + t
                            if j < D:
                                v[k] = v[k] + e[r, j]
                for k in range(RPT):
                    j = c + k * nt + t
                    if j < D:
                        v[k] = x[r, j] + v[k] if has_a else x[r, j]
                        if has_w and D <= step:          # (a longer row loads w with its scale pass)
                            wv[k] = w[j]
            else:
                for k in range(RPT):                     # x (w, e) first: used after the slots, their loads in flight
                    j = c + k * nt + t                   # with the first group's
                    if j < D:
                        xv[k] = x[r, j]
                        if has_w and D <= step:
                            wv[k] = w[j]
                        if has_e:
                            ev[k] = e[r, j]
                for q0 in range(0, A, SLOT_GROUP):       # `_addend`'s sum, SLOT_GROUP slots' loads issued together,
                    for k in range(RPT):                 # then added in slot order (float32, the same adds): A / 4
                        j = c + k * nt + t               # round trips, not A (session 38: a MoE layer's combine +
                        if j < D:                        # norm of one token, a slot at a time, took 9 us on an H100)
                            b = r * A + q0
                            g0[k] = a[b, j]
                            if q0 + 1 < A:
                                g1[k] = a[b + 1, j]
                            if q0 + 2 < A:
                                g2[k] = a[b + 2, j]
                            if q0 + 3 < A:
                                g3[k] = a[b + 3, j]
                    for k in range(RPT):
                        if c + k * nt + t < D:
                            u = g0[k] if q0 == 0 else v[k] + g0[k]
                            if q0 + 1 < A:
                                u = u + g1[k]
                            if q0 + 2 < A:
                                u = u + g2[k]
                            if q0 + 3 < A:
                                u = u + g3[k]
                            v[k] = u
                for k in range(RPT):
                    if c + k * nt + t < D:
                        u = v[k] + ev[k] if has_e else v[k]
                        v[k] = xv[k] + u
            for k in range(RPT):
                j = c + k * nt + t
                if j < D:
                    if has_a:
                        s[r, j] = v[k]
                    acc += float64(v[k]) * float64(v[k])
        scale = _inv_rms(acc, buf, D, eps)
        for c in range(0, D, step):
            if D > step:                                 # more than one pass: the pass's values loaded again
                for k in range(RPT):
                    j = c + k * nt + t
                    if j < D:
                        v[k] = s[r, j] if has_a else x[r, j]
                        if has_w:
                            wv[k] = w[j]
            for k in range(RPT):
                j = c + k * nt + t
                if j < D:
                    u = v[k] * scale
                    if has_w:
                        u = u * wv[k]
                    y[r, j] = u * post

    return _named_kernel(rms_rows, "rms_rows_slots" if slots else "rms_rows")


_rms_rows = rms_rows_kernel(False)
_rms_rows_slots = rms_rows_kernel(True)


@cuda.jit(device=True, inline=True)
def _warp_row():
    """(row, lane) of a kernel that takes a row a warp, NTW rows a block (`_rms_warps`, the warp routers): row
    blockIdx.x * NTW + the thread's warp. The caller returns when the row is past its array's (the whole warp)."""
    return cuda.blockIdx.x * NTW + cuda.threadIdx.x // 32, cuda.threadIdx.x % 32


@cuda.jit(fastmath=False)
def _rms_warps(x, a, A, e, has_e, has_a, w, has_w, eps, post, gate, act, s, y):
    """`_rms_rows` for rows of at most WARP_ROW_MAX_D: row r = blockIdx.x * NTW + the thread's warp, lane l taking
    elements l, l + 32, ... (RPW of them, in registers), the float64 sum over the warp by shuffles, no block barrier.
    A head's norm (the delta rule's l2 norms of q and k, a per-head rms_norm: T x H rows of 128) is many short rows:
    a block a row left 128 of its 256 threads idle and waited on two barriers for every 128 numbers.
    act 1 / 2: the result times silu / sigmoid of gate[r, j] (`norm.rms_norm_gated`), 0: no gate (post instead)."""
    r, lane = _warp_row()
    if r >= x.shape[0]:                              # (the whole warp: r is the warp's)
        return
    D = x.shape[1]
    v = cuda.local.array(RPW, float32)
    for k in range(RPW):
        j = k * 32 + lane
        if j < D:
            v[k] = x[r, j] + _addend(a, A, e, has_e, r, j) if has_a else x[r, j]
    acc = float64(0.0)
    for k in range(RPW):
        j = k * 32 + lane
        if j < D:
            if has_a:
                s[r, j] = v[k]
            acc += float64(v[k]) * float64(v[k])
    mean = float32(warp_sum(acc) / D)
    scale = float32(1.0) / float32(math.sqrt(float32(mean + eps)))
    for k in range(RPW):
        j = k * 32 + lane
        if j < D:
            u = v[k] * scale
            if has_w:
                u = u * w[j]
            if act == 0:
                y[r, j] = u * post
            elif act == 1:
                y[r, j] = u * _silu1(gate[r, j])
            else:
                y[r, j] = u * _sigmoid1(gate[r, j])


@cuda.jit(fastmath=False)
def _layer_rows(x, w, has_w, b, has_b, eps, y):
    """Row r = blockIdx.x: the mean (float64 sum), d = x - mean in float32, the variance of d (float64 squares and
    sum), y = d / sqrt(var + eps) (* w) (+ b), as `ops.layer_norm`."""
    r = cuda.blockIdx.x
    t = cuda.threadIdx.x
    D = x.shape[1]
    buf = cuda.shared.array(32, float64)
    acc = float64(0.0)
    for j in range(t, D, NT):
        acc += float64(x[r, j])
    mean = float32(_block_sum64(acc, buf) / D)
    acc = float64(0.0)
    for j in range(t, D, NT):
        d = float64(float32(x[r, j] - mean))
        acc += d * d
    var = float32(_block_sum64(acc, buf) / D)
    scale = float32(1.0) / float32(math.sqrt(float32(var + eps)))
    for j in range(t, D, NT):
        v = float32(x[r, j] - mean) * scale
        if has_w:
            v = v * w[j]
        if has_b:
            v = v + b[j]
        y[r, j] = v


@cuda.jit(fastmath=False)
def _softmax_rows(x, y):
    shm = cuda.shared.array(NT, float32)
    buf = cuda.shared.array(32, float64)
    _softmax_row(x, cuda.blockIdx.x, y, shm, buf)


@cuda.jit(device=True, inline=True)
def _softmax_row(x, r, y, shm, buf):
    """Row r of y = `ops.softmax` of row r of x (max, exp, float64 sum, divide), the block's NT threads (shm: NT
    float32, buf: 32 float64 shared)."""
    t = cuda.threadIdx.x
    D = x.shape[1]
    m = float32(-math.inf)
    for j in range(t, D, NT):
        v = x[r, j]
        if v > m or v != v:
            m = v
    m = _block_max(m, shm)
    acc = float64(0.0)
    for j in range(t, D, NT):
        acc += float64(float32(math.exp(x[r, j] - m)))
    tot = _block_sum64(acc, buf)
    for j in range(t, D, NT):
        y[r, j] = float32(float64(float32(math.exp(x[r, j] - m))) / tot)


@cuda.jit(device=True, inline=True)
def _silu1(v):
    """`activations.silu` of one float32 value, in its float32 steps."""
    return v / float32(float32(1.0) + float32(math.exp(-v)))


@cuda.jit(fastmath=False)
def _silu(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = _silu1(x[i])


@cuda.jit(device=True, inline=True)
def _sigmoid1(v):
    """`activations.sigmoid` of one float32 value, in its float32 steps."""
    return float32(1.0) / float32(float32(1.0) + float32(math.exp(-v)))


@cuda.jit(device=True, inline=True)
def _softplus1(v):
    """`activations.softplus` of one float32 value (v itself above 20), in its float32 steps."""
    return v if v > float32(20.0) else float32(math.log(float32(float32(1.0) + float32(math.exp(v)))))


@cuda.jit(fastmath=False)
def _sigmoid(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = _sigmoid1(x[i])


@cuda.jit(fastmath=False)
def _swiglu(g, u, y):
    i = cuda.grid(1)
    if i < g.shape[0]:
        y[i] = _silu1(g[i]) * u[i]


@cuda.jit(fastmath=False)
def _softplus(x, y):
    i = cuda.grid(1)
    if i < x.shape[0]:
        y[i] = _softplus1(x[i])


@cuda.jit(fastmath=False)
def _gdn_gates(bsrc, asrc, r, bias, A, beta, sp, g):
    """A gated-delta-net layer's gates, element (t, h) of [T, Hv] a thread: beta = sigmoid(b), sp = softplus(a +
    bias), g = sp * A, each step rounded to float32 as `activations.sigmoid` / `softplus` and the NumPy products
    round them. r > 0: b and a read from the fused projection bsrc [T, Hk * 2r] (group hk: r betas, then r alphas);
    r == 0: from bsrc and asrc [T, Hv]."""
    Hv = beta.shape[1]
    i = cuda.grid(1)
    if i < beta.shape[0] * Hv:
        t = i // Hv
        h = i - t * Hv
        if r > 0:
            hk = h // r
            j = h - hk * r
            bv = bsrc[t, hk * 2 * r + j]
            av = bsrc[t, hk * 2 * r + r + j]
        else:
            bv = bsrc[t, h]
            av = asrc[t, h]
        beta[t, h] = _sigmoid1(bv)
        v = _softplus1(float32(av + bias[h]))
        sp[t, h] = v
        g[t, h] = v * A[h]


@cuda.jit(fastmath=False)
def _kda_gates(z, b, bias, A, dh, bounded, lb, g, beta):
    """A KDA layer's gates (`kda.gates`), element (t, c) of z [T, H * dh] a thread: v = z + bias, the log decay g[t, h,
    c - h * dh] = softplus(v) * A[h], or with `bounded` lb * sigmoid(-(A[h] * v)) (Kimi-K3); threads i < T * H also
    beta = sigmoid(b) [T, H]. Each step rounded to float32 as the NumPy statement rounds it."""
    i = cuda.grid(1)
    T, C = z.shape
    H = beta.shape[1]
    if i < T * C:
        t = i // C
        c = i - t * C
        h = c // dh
        v = float32(z[t, c] + bias[c])
        if bounded:
            g[t, h, c - h * dh] = lb * _sigmoid1(-(A[h] * v))
        else:
            g[t, h, c - h * dh] = _softplus1(v) * A[h]
    if i < T * H:
        t = i // H
        h = i - t * H
        beta[t, h] = _sigmoid1(b[t, h])


@cuda.jit(fastmath=False)
def _situ(g, u, beta, lb, y):
    """`activations.situ` in its float32 steps: tanh(g / beta) * beta * sigmoid(g) * (tanh(u / lb) * lb or u)."""
    i = cuda.grid(1)
    if i < g.shape[0]:
        gv = g[i]
        a = float32(math.tanh(float32(gv * float32(float32(1.0) / beta)))) * beta
        a = a * _sigmoid1(gv)
        uv = u[i]
        if lb > float32(0.0):
            uv = float32(math.tanh(float32(uv * float32(float32(1.0) / lb)))) * lb
        y[i] = a * uv


@cuda.jit(fastmath=False)
def _swiglu_clamp(g, u, limit, y):
    """`activations.swiglu_clamp`: silu(min(g, L)) * clip(u, -L, L)."""
    i = cuda.grid(1)
    if i < g.shape[0]:
        gv = min(g[i], limit)
        uv = max(min(u[i], limit), -limit)
        y[i] = _silu1(gv) * uv


def _delta_rule_kernel(rows: int, cols: int):
    """The delta rule's kernel for keys of at most 32 * rows (rows of a state column a lane holds) and `cols` value
    columns a warp (compile-time constants: the local arrays' shapes, the unrolled loops).

    A block of DR_WARPS warps per (head h, DR_WARPS * cols value columns); warp w takes columns c0 + w * cols + j,
    j < cols: column c of head h's state only meets column c of the values, so the T tokens run in order inside the
    warp, its 32 lanes holding rows lane, lane + 32, ... of each of its columns in registers and summing over K with
    `warp_sum` (the order: each lane's rows ascending, then the butterfly; the same sums whatever rows and cols).
    The block stages DR_TC tokens' k, q (and per-key g) of head h in shared memory at a time, read once for all its
    warps, and a warp reads each staged k, q, g once for all its columns. q, k [T, H, K], v [T, H, V], g [T, H, K]
    (g_per_key) or [T, H, 1], beta [T, H], S [H, K, V]; the steps of `delta_rule.recurrent`: decay, k.S, delta,
    the rank-one update, q.S.

    Registers, not arithmetic, set how many warps run at once: with rows = 8 and one column a warp (92 registers for
    sm_90) two blocks fit an SM, and a 32-head layer's 512 blocks took two waves of 132 SMs for every token. rows = 4
    (K <= 128, every published model) drops the dead rows; more columns a warp fewer warps (`DR_COLS`: 4 since
    session 36, H100, a 32-head layer of K = V = 128 at T = 512: 702 us against 739 with 2, 1357 with rows = 8 and
    one column; T = 1: 20.9 / 22.5 / 21.5 us)."""
    VC = DR_WARPS * cols                                 # value columns of a block

    @cuda.jit(fastmath=False)
    def _delta_rule(q, k, v, g, g_per_key, beta, S_in, has_S, scale, o, S_out):    # (the profiles' name)
        T, H, K = q.shape
        V = v.shape[2]
        nb = (V + VC - 1) // VC
        h = cuda.blockIdx.x // nb
        tid = cuda.threadIdx.x
        wi = tid // 32
        lane = tid - wi * 32
        c0 = (cuda.blockIdx.x - h * nb) * VC
        cw = c0 + wi * cols                              # the warp's first column
        live = cw < V                                    # (a dead warp still stages and syncs with the block)
        ks = cuda.shared.array((DR_TC, DR_K), float32)
        qs = cuda.shared.array((DR_TC, DR_K), float32)
        gs = cuda.shared.array((DR_TC, DR_K), float32)
        vs = cuda.shared.array((DR_TC, VC), float32)
        bs = cuda.shared.array(DR_TC, float32)
        s = cuda.local.array((rows, cols), float32)
        part = cuda.local.array(cols, float32)
        delta = cuda.local.array(cols, float32)
        for r in range(rows):
            kk = lane + 32 * r
            for j in range(cols):
                s[r, j] = S_in[h, kk, cw + j] if has_S and kk < K and cw + j < V else float32(0.0)
        for t0 in range(0, T, DR_TC):
            n = min(DR_TC, T - t0)
            cuda.syncthreads()
            for i in range(tid, n * K, 32 * DR_WARPS):
                tt = i // K
                kk = i - tt * K
                ks[tt, kk] = k[t0 + tt, h, kk]
                qs[tt, kk] = q[t0 + tt, h, kk]
                gs[tt, kk] = float32(math.exp(g[t0 + tt, h, kk] if g_per_key else g[t0 + tt, h, 0]))
            for i in range(tid, n * VC, 32 * DR_WARPS):  # the tokens' values of the block's columns and their betas:
                tt = i // VC                             # the token loop below reads no global memory
                cc = i - tt * VC
                vs[tt, cc] = v[t0 + tt, h, c0 + cc] if c0 + cc < V else float32(0.0)
            if tid < n:
                bs[tid] = beta[t0 + tid, h]
            cuda.syncthreads()
            if live:
                for tt in range(n):
                    t = t0 + tt
                    for j in range(cols):
                        part[j] = float32(0.0)
                    for r in range(rows):
                        kk = lane + 32 * r
                        if kk < K:
                            gk, kv = gs[tt, kk], ks[tt, kk]
                            for j in range(cols):
                                sv = s[r, j] * gk
                                s[r, j] = sv
                                part[j] += kv * sv
                    for j in range(cols):
                        delta[j] = (vs[tt, wi * cols + j] - warp_sum(part[j])) * bs[tt]
                        part[j] = float32(0.0)
                    for r in range(rows):
                        kk = lane + 32 * r
                        if kk < K:
                            kv, qv = ks[tt, kk], qs[tt, kk]
                            for j in range(cols):
                                sv = s[r, j] + kv * delta[j]
                                s[r, j] = sv
                                part[j] += qv * sv
                    for j in range(cols):
                        acc = warp_sum(part[j])
                        if lane == j and cw + j < V:
                            o[t, h, cw + j] = acc * scale
        if live:
            for r in range(rows):
                kk = lane + 32 * r
                if kk < K:
                    for j in range(cols):
                        if cw + j < V:
                            S_out[h, kk, cw + j] = s[r, j]
    return _delta_rule


DR_COLS = 4                 # the delta rule's value columns a warp (`_delta_rule_kernel`; benchmarks/fused_kernels.py)
_DELTA_RULES: dict = {}


def delta_rule_kernel(K: int, cols: int | None = None):
    """The delta rule's kernel for keys of K (<= DR_K) and `cols` columns a warp (None: DR_COLS), made once."""
    rows = 4 if K <= 128 else DR_ROWS
    key = (rows, DR_COLS if cols is None else cols)
    if key not in _DELTA_RULES:
        _DELTA_RULES[key] = _delta_rule_kernel(*key)
    return _DELTA_RULES[key]


@cuda.jit(fastmath=False)
def _causal_conv(x, w, tail, has_tail, then_silu, y, new_tail):
    """One thread per (row t, channel c) of max(T, Kc-1) x C: y[t, c] = sum_k xin[t + k, c] w[c, k] (k ascending),
    xin = concat(tail, x), then_silu: its silu (`_silu1`); row t < Kc-1 also writes the new tail's row
    t (row T + t of xin)."""
    i = cuda.grid(1)
    T, C = x.shape
    Kc = w.shape[1]
    t = i // C
    c = i - t * C
    if t < T:
        acc = float32(0.0)
        for kk in range(Kc):
            j = t + kk
            if j < Kc - 1:
                xv = tail[j, c] if has_tail else float32(0.0)
            else:
                xv = x[j - (Kc - 1), c]
            acc += xv * w[c, kk]
        if then_silu:
            acc = _silu1(acc)
        y[t, c] = acc
    if t < Kc - 1:
        jj = T + t
        if jj < Kc - 1:
            new_tail[t, c] = tail[jj, c] if has_tail else float32(0.0)
        else:
            new_tail[t, c] = x[jj - (Kc - 1), c]


@cuda.jit(device=True, inline=True)
def _pool_row(kv, score, bi, j, ratio, c, K, k, S):
    """Row j of block bi's pooling window at dim k: (value, score). The overlapping compressor (c = 2) reads the
    block before's first halves at j < ratio (block 0: weight 0, value 0), then the block's own second halves; a
    row past the buffer is its last row (`kv_compressor.pool_blocks_at`)."""
    if c == 2 and j < ratio:
        cur = min(bi * ratio + j, S - 1)
        if bi == 0:
            return float32(0.0), float32(-math.inf)
        prev = max(cur - ratio, 0)
        return kv[prev, k], score[prev, k]
    jj = j - ratio if c == 2 else j
    cur = min(bi * ratio + jj, S - 1)
    return kv[cur, (c - 1) * K + k], score[cur, (c - 1) * K + k]


@cuda.jit(fastmath=False)
def _pool_at(kv, score, b, ratio, c, K, out):
    """Thread (i, k): block b[i]'s pooled key at dim k, `kv_compressor.pool_blocks_at`: the softmax of the window's
    scores (max, exp in float32, float64 sum, divide) weighting its values, the products summed in float32 in
    the rows' order."""
    e = cuda.grid(1)
    n = b.shape[0]
    if e >= n * K:
        return
    i = e // K
    k = e - i * K
    S = kv.shape[0]
    bi = b[i]
    rows = c * ratio
    m = float32(-math.inf)
    for j in range(rows):
        _, sv = _pool_row(kv, score, bi, j, ratio, c, K, k, S)
        if sv > m or sv != sv:
            m = sv
    tot = float64(0.0)
    for j in range(rows):
        _, sv = _pool_row(kv, score, bi, j, ratio, c, K, k, S)
        tot += float64(float32(math.exp(sv - m)))
    acc = float32(0.0)
    for j in range(rows):
        v, sv = _pool_row(kv, score, bi, j, ratio, c, K, k, S)
        p = float32(float64(float32(math.exp(sv - m))) / tot)
        acc = float32(acc + float32(v * p))
    out[i, k] = acc


@cuda.jit(device=True, inline=True)
def _rope_at(x, cos, sin, n_rot, neox, off, sgn, y, i):
    """Element i of y [T, H, K] (`_rope`)."""
    T, H, K = x.shape
    t = i // (H * K)
    r = i - t * H * K
    h = r // K
    j = r - h * K - off
    if j < 0 or j >= n_rot:
        y[t, h, j + off] = x[t, h, j + off]
        return
    ia, ib, pr, first = _rope_pair(j, n_rot // 2, neox)
    y[t, h, j + off] = _rotated(x[t, h, off + ia], x[t, h, off + ib], cos[t, pr], sin[t, pr] * sgn, first)


@cuda.jit(fastmath=False)
def _rope(x, cos, sin, n_rot, neox, off, sgn, y, x2, y2, two):
    """One thread per element of y [T, H, K]: the n_rot dims from `off` rotated in pairs ((j, j + n_rot/2) NEOX,
    (2i, 2i + 1) NORM) by the row's cos / sin * sgn [T, n_rot/2] (sgn -1: by -theta, exactly -sin), the rest copied;
    then, when `two`, the same of x2 [T, H2, K] into y2 (a layer's q and k: one launch where they took two)."""
    i = cuda.grid(1)
    n1 = x.shape[0] * x.shape[1] * x.shape[2]
    if i < n1:
        _rope_at(x, cos, sin, n_rot, neox, off, sgn, y, i)
    elif two and i - n1 < x2.shape[0] * x2.shape[1] * x2.shape[2]:
        _rope_at(x2, cos, sin, n_rot, neox, off, sgn, y2, i - n1)


@cuda.jit(device=True, inline=True)
def _rope_pair(j, half, neox):
    """Dim j's pair among the rotated ones: (its two dims, the pair's index, whether j is the pair's first):
    NEOX (i, i + half), NORM (2i, 2i + 1)."""
    if neox:
        pr = j if j < half else j - half
        return pr, pr + half, pr, j < half
    pr = j // 2
    return 2 * pr, 2 * pr + 1, pr, j % 2 == 0


@cuda.jit(device=True, inline=True)
def _rotated(a, b, c, s, first):
    """The rotated value of a pair (a, b) by (cos c, sin s): its first dim's or its second's, float32 products."""
    if first:
        return float32(a * c) - float32(b * s)
    return float32(a * s) + float32(b * c)


NR_K = 512                  # norm + rope: the largest head dim (its shared row's size, a literal)


@cuda.jit(device=True, inline=True)
def _norm_rope_row(x, w, has_w, eps, cos, sin, n_rot, neox, y, t, yt, h, buf, v, norm):
    """Row (t, h) of x [T, H, K] (strided) by the block: its rms_norm as `_rms_rows` computes it (float64 sum of
    squares, v = x * (1 / sqrt(mean + eps)) (* w), each product rounded to float32) into shared memory v, then its
    first n_rot dims rotated in pairs as `_rope` rotates them (NEOX (j, j + n_rot/2), NORM (2i, 2i + 1)) by the row's
    cos / sin [T, n_rot/2], the rest copied, into row (yt, h) of y (yt = t, or a cache's row). norm False: no norm
    (v = x, times 1: exact), the rotation alone, as `_rope`'s."""
    K = x.shape[2]
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    scale = float32(1.0)
    if norm:                                         # (a kernel argument: every thread of the block takes it alike)
        acc = float64(0.0)
        for j in range(tid, K, nt):
            xv = x[t, h, j]
            acc += float64(xv) * float64(xv)
        scale = _inv_rms(acc, buf, K, eps)
    for j in range(tid, K, nt):
        u = x[t, h, j] * scale
        if has_w:
            u = u * w[j]
        v[j] = u
    cuda.syncthreads()
    for j in range(tid, K, nt):
        if j >= n_rot:
            y[yt, h, j] = v[j]
        else:
            ia, ib, pr, first = _rope_pair(j, n_rot // 2, neox)
            y[yt, h, j] = _rotated(v[ia], v[ib], cos[t, pr], sin[t, pr], first)


@cuda.jit(fastmath=False)
def _norm_rope(x, w, has_w, x2, w2, has_w2, two, eps, cos, sin, n_rot, neox, y, y2):
    """One block per (t, h) of x [T, H, K] (`_norm_rope_row`), then, when `two`, per (t, h) of x2 [T, H2, K] into
    y2 (a layer's q and k, each by its own norm weight: one launch where the four take four):
    `rope.rms_norm_rope`."""
    b = cuda.blockIdx.x
    T, H, K = x.shape
    buf = cuda.shared.array(32, float64)
    v = cuda.shared.array(NR_K, float32)
    if b < T * H:
        t = b // H
        _norm_rope_row(x, w, has_w, eps, cos, sin, n_rot, neox, y, t, t, b - t * H, buf, v, True)
    elif two:
        b -= T * H
        H2 = x2.shape[1]
        t = b // H2
        _norm_rope_row(x2, w2, has_w2, eps, cos, sin, n_rot, neox, y2, t, t, b - t * H2, buf, v, True)


@cuda.jit(fastmath=False)
def _norm_rope_append(x, w, has_w, x2, w2, has_w2, v2, eps, cos, sin, n_rot, neox, y, kbuf, kcount, vbuf, vcount,
                      done, norm):
    """`_norm_rope` of q (x [T, H, K] into y) and of k (x2 [T, H2, K]) into the key cache's rows from its count
    (kbuf [capacity, H2, K] at kcount[0] + t), and k's values v2 [T, H2, V] copied into the value cache's (vbuf at
    vcount[0] + t): a layer's q / k norms, their rotation and its cache append in one launch (`gqa.rope_append`;
    norm False: the rotation alone).
    Blocks: T * H for q, T * H2 for k, T * H2 for v. Every block reads both counts first; the last block to finish
    (a ticket taken from done[0] after each block's writes) advances them by T and sets done[0] back to 0."""
    b = cuda.blockIdx.x
    T, H, K = x.shape
    H2 = x2.shape[1]
    buf = cuda.shared.array(32, float64)
    v = cuda.shared.array(NR_K, float32)
    kc = kcount[0]
    vc = vcount[0]
    if b < T * H:
        t = b // H
        _norm_rope_row(x, w, has_w, eps, cos, sin, n_rot, neox, y, t, t, b - t * H, buf, v, norm)
    elif b < T * (H + H2):
        b -= T * H
        t = b // H2
        _norm_rope_row(x2, w2, has_w2, eps, cos, sin, n_rot, neox, kbuf, t, kc + t, b - t * H2, buf, v, norm)
    else:
        b -= T * (H + H2)
        t = b // H2
        h = b - t * H2
        for j in range(cuda.threadIdx.x, v2.shape[2], cuda.blockDim.x):
            vbuf[vc + t, h, j] = v2[t, h, j]
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        cuda.threadfence()
        if cuda.atomic.add(done, 0, 1) == cuda.gridDim.x - 1:         # the last block: every block has read the counts
            kcount[0] = kc + T
            vcount[0] = vc + T
            done[0] = 0


@cuda.jit(fastmath=False)
def _rope_cos_sin(pos, theta_scale, ff, has_ff, freq_scale, keep, mix, has_yarn, mscale, cos, sin):
    """One thread per (t, i) of cos/sin [T, n_rot/2]: theta_i = p * theta_scale^i by i float32 multiplications in
    order (ggml's), / freq_factors, * freq_scale, YaRN's keep/mix, then cos/sin in float64 * mscale, as
    `rope.rope_cos_sin`."""
    i = cuda.grid(1)
    T, half = cos.shape
    if i >= T * half:
        return
    t = i // half
    j = i - t * half
    acc = float32(pos[t])
    for _ in range(j):
        acc = float32(acc * theta_scale)
    ext = acc
    if has_ff:
        ext = float32(ext / ff[j])
    theta = float32(freq_scale * ext)
    if has_yarn:
        theta = float32(float32(theta * keep[j]) + float32(ext * mix[j]))
    th = float64(theta)
    cos[t, j] = float32(math.cos(th) * float64(mscale))
    sin[t, j] = float32(math.sin(th) * float64(mscale))


ANT = 512                   # threads of an attention block (16 warps: a decode step has only T x H blocks)
ANT_SIM = 64                # in the CUDA simulator (a Python thread each)
AVC = 128                   # attention: the value columns of one pass (4 a lane)
APART = AVC * (ANT // 32)   # its partial sums, a row of AVC a warp


@cuda.jit(device=True, inline=True)
def _dot4(acc, x0, y0, x1, y1, x2, y2, x3, y3):
    """acc + x0 y0 + x1 y1 + x2 y2 + x3 y3, added one product at a time in that order (as a loop over the four)."""
    acc += x0 * y0
    acc += x1 * y1
    acc += x2 * y2
    acc += x3 * y3
    return acc


@cuda.jit(device=True, inline=True)
def _scores4(q, k, t, h, n, ra, rb, rc, rd, lane):
    """q[t, h] . k[r, n] for the four key rows ra .. rd, lanes along K (`warp_sum`: every lane gets the four): each
    lane's columns lane, lane + 32, ... added in order, their loads four columns at a time, the four keys' together.
    All 32 lanes call it."""
    K = q.shape[2]
    aa = float32(0.0)
    ab = float32(0.0)
    ac = float32(0.0)
    ad = float32(0.0)
    kk = lane                                        # a key's four columns added in the order of one at a time
    while kk + 96 < K:
        q0, q1, q2, q3 = q[t, h, kk], q[t, h, kk + 32], q[t, h, kk + 64], q[t, h, kk + 96]
        a0, a1, a2, a3 = k[ra, n, kk], k[ra, n, kk + 32], k[ra, n, kk + 64], k[ra, n, kk + 96]
        b0, b1, b2, b3 = k[rb, n, kk], k[rb, n, kk + 32], k[rb, n, kk + 64], k[rb, n, kk + 96]
        c0, c1, c2, c3 = k[rc, n, kk], k[rc, n, kk + 32], k[rc, n, kk + 64], k[rc, n, kk + 96]
        d0, d1, d2, d3 = k[rd, n, kk], k[rd, n, kk + 32], k[rd, n, kk + 64], k[rd, n, kk + 96]
        aa = _dot4(aa, q0, a0, q1, a1, q2, a2, q3, a3)
        ab = _dot4(ab, q0, b0, q1, b1, q2, b2, q3, b3)
        ac = _dot4(ac, q0, c0, q1, c1, q2, c2, q3, c3)
        ad = _dot4(ad, q0, d0, q1, d1, q2, d2, q3, d3)
        kk += 128
    while kk < K:
        qk = q[t, h, kk]
        aa += qk * k[ra, n, kk]
        ab += qk * k[rb, n, kk]
        ac += qk * k[rc, n, kk]
        ad += qk * k[rd, n, kk]
        kk += 32
    return warp_sum(aa), warp_sum(ab), warp_sum(ac), warp_sum(ad)


@cuda.jit(device=True, inline=True)
def _key_row(idx, live, gathered, t, s, S_on):
    """(row, taken): key s's row in k / v (gathered: idx[t, s]) and whether it takes part (s < S_on; gathered: live).
    A key not taken reads row 0, which exists: its loads are issued with the others, its sums never stored."""
    if s >= S_on:
        return 0, False
    if gathered:
        if live[t, s]:
            return idx[t, s], True
        return 0, False
    return s, True


@cuda.jit(fastmath=False)
def _attention(q, k, v, qpos, scale, causal, idx, live, gathered, sinks, has_sink, p, out):
    """One block per (query t, head h), kv head h // (H / Hkv): the scores x_s = (q . k_s) * scale (-inf past the
    query's position when causal; gathered: key s is row idx[t, s], -inf where not live[t, s]) into p's row, a warp
    per key and four keys a warp at a time (their loads issued together), lanes along K (`warp_sum`); then softmax's
    max, exp and float64 sum (as ops/softmax.py); then out = (sum_s p_s v_s) / sum: a warp per key (keys w, w + W,
    ... of W warps, two at a time), lanes along AVC columns of V a pass, the W partial sums added in warp order. A
    decode step's attention is the latency of these loops' loads: S / (4 W) and S / W rounds, not S / 4 as with a
    thread a column over every key. A dead slot (gathered, not live) reads neither its key nor its value: its p is
    exactly 0 (a finite value row would add exactly 0; a non-finite one is ignored, as its key is)."""
    b = cuda.blockIdx.x
    T, H, K = q.shape
    S = idx.shape[1] if gathered else k.shape[0]
    Hkv = k.shape[1]
    V = v.shape[2]
    t = b // H
    h = b - t * H
    n = h // (H // Hkv)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x                             # ANT (the simulator: ANT_SIM, the same steps)
    lane = tid % 32
    warp = tid // 32
    W = nt // 32
    qp = qpos[t]
    S_on = S                                         # keys that can take part: causal, not gathered, key s is
    if causal and not gathered and qp + 1 < S:       # position s: none past the query's (a fixed-shape cache's
        S_on = qp + 1                                # capacity beyond its rows: no product, p 0, as before)
    for s0 in range(0, S_on, 4 * W):                 # (every lane runs every round: warp_sum needs all 32)
        sa = s0 + warp
        ra, ta = _key_row(idx, live, gathered, t, sa, S_on)
        rb, tb = _key_row(idx, live, gathered, t, sa + W, S_on)
        rc, tc = _key_row(idx, live, gathered, t, sa + 2 * W, S_on)
        rd, td = _key_row(idx, live, gathered, t, sa + 3 * W, S_on)
        aa, ab, ac, ad = _scores4(q, k, t, h, n, ra, rb, rc, rd, lane)
        if lane < 4:                                 # lane j stores key sa + j W (its score, or -inf: masked)
            s = sa + lane * W
            acc = aa if lane == 0 else ab if lane == 1 else ac if lane == 2 else ad
            took = ta if lane == 0 else tb if lane == 1 else tc if lane == 2 else td
            if s < S_on:
                x = float32(acc * scale)
                if not took or (causal and s > qp):
                    x = float32(-math.inf)
                p[b, s] = x
    cuda.syncthreads()                               # every score written before any thread reads the row
    shm = cuda.shared.array(ANT, float32)            # (keys from S_on on are not written nor read: their p would
    buf = cuda.shared.array(32, float64)             # be exp(-inf) = 0, adding nothing to the max, the sum or out;
    m = float32(-math.inf)                           # a fixed-shape cache's capacity is not scanned)
    for s in range(tid, S_on, nt):
        if p[b, s] > m:
            m = p[b, s]
    m = _block_max(m, shm)
    if has_sink and sinks[h] > m:                  # the sink joins the max (and the sum, below)
        m = sinks[h]
    if m == float32(-math.inf):
        m = float32(0.0)                           # a row with no key: every p 0, the sum 0, the output NaN
    acc64 = float64(0.0)
    for s in range(tid, S_on, nt):
        e = float32(math.exp(p[b, s] - m))
        p[b, s] = e
        acc64 += float64(e)
    tot = _block_sum64(acc64, buf)                 # (its barriers: every p written before the values read it)
    if has_sink:
        tot += float64(float32(math.exp(sinks[h] - m)))
    den = float32(tot)
    part = cuda.shared.array(APART, float32)         # warp w's partial sums of a pass's AVC columns
    for c0 in range(0, V, AVC):
        o0 = float32(0.0)
        o1 = float32(0.0)
        o2 = float32(0.0)
        o3 = float32(0.0)
        c = c0 + lane
        j0, j1, j2, j3 = min(c, V - 1), min(c + 32, V - 1), min(c + 64, V - 1), min(c + 96, V - 1)
        for s in range(warp, S_on, 2 * W):           # keys warp, warp + W, ...: two at a time, loads together
            ra, ta = _key_row(idx, live, gathered, t, s, S_on)
            rb, tb = _key_row(idx, live, gathered, t, s + W, S_on)
            pa = p[b, s]
            pb = p[b, s + W] if tb else float32(0.0)
            va0, va1, va2, va3 = v[ra, n, j0], v[ra, n, j1], v[ra, n, j2], v[ra, n, j3]
            vb0, vb1, vb2, vb3 = v[rb, n, j0], v[rb, n, j1], v[rb, n, j2], v[rb, n, j3]
            if ta:                                   # (a dead slot's p is 0: not added)
                o0 += pa * va0
                o1 += pa * va1
                o2 += pa * va2
                o3 += pa * va3
            if tb:
                o0 += pb * vb0
                o1 += pb * vb1
                o2 += pb * vb2
                o3 += pb * vb3
        base = warp * AVC + lane
        part[base] = o0
        part[base + 32] = o1
        part[base + 64] = o2
        part[base + 96] = o3
        cuda.syncthreads()
        for j in range(tid, min(AVC, V - c0), nt):  # (the simulator's block is narrower than a pass)
            a = float32(0.0)
            for w in range(W):
                a += part[w * AVC + j]
            out[t, h, c0 + j] = a / den
        cuda.syncthreads()                           # the pass's sums read before the next pass writes them


ARW = 2 if SIM else 8       # prefill attention (_attention_rows): warps of a block at most, a query head each
ARC = 256                   # its value columns a pass (8 a lane)


@cuda.jit(device=True, inline=True)
def _dot1x4(o0, o1, o2, o3, p, v, r, n, j0, j1, j2, j3):
    """(o0 + p v[r, n, j0], ..., o3 + p v[r, n, j3]): one key's weight times four of its value columns."""
    return o0 + p * v[r, n, j0], o1 + p * v[r, n, j1], o2 + p * v[r, n, j2], o3 + p * v[r, n, j3]


@cuda.jit(device=True, inline=True)
def _keys4(o0, o1, o2, o3, a, pa, pb, pc, pd, tb, tc, td, v, ra, rb, rc, rd, n, j0, j1, j2, j3):
    """Four value columns' sums rescaled by a, then four keys' weights times their columns added in key order (keys
    b, c, d only where taken: tb, tc, td; a key past the row's last reads nothing)."""
    o0, o1, o2, o3 = _dot1x4(o0 * a, o1 * a, o2 * a, o3 * a, pa, v, ra, n, j0, j1, j2, j3)
    if tb:
        o0, o1, o2, o3 = _dot1x4(o0, o1, o2, o3, pb, v, rb, n, j0, j1, j2, j3)
    if tc:
        o0, o1, o2, o3 = _dot1x4(o0, o1, o2, o3, pc, v, rc, n, j0, j1, j2, j3)
    if td:
        o0, o1, o2, o3 = _dot1x4(o0, o1, o2, o3, pd, v, rd, n, j0, j1, j2, j3)
    return o0, o1, o2, o3


@cuda.jit(device=True, inline=True)
def _store4(out, t, h, c, V, y0, y1, y2, y3):
    """out[t, h, c + 32 i] = y_i for the columns below V."""
    if c < V:
        out[t, h, c] = y0
    if c + 32 < V:
        out[t, h, c + 32] = y1
    if c + 64 < V:
        out[t, h, c + 64] = y2
    if c + 96 < V:
        out[t, h, c + 96] = y3


ROWS_REGISTERS = 64         # _attention_rows' register cap (124 uncapped for sm_90): session 36, H100, a prefill-512
#                            layer 869 -> 829 us (llama-3-8b), 4823 -> 4370 (kimi-linear's MLA), 17559 -> 15406
#                            (DeepSeek-V3's MLA), the same outputs (benchmarks/fused_kernels.py --max-registers 64)


@cuda.jit(fastmath=False, **({} if SIM else {"max_registers": ROWS_REGISTERS}))
def _attention_rows(q, k, v, qpos, scale, causal, out):
    """A prefill's attention, `mha.attention_blocked` (the causal mask, or none) for any number of queries: a warp
    per (query t, head h), the block's warps query heads of one key head n = h // (H / Hkv) at the same t (they read
    the same key and value rows together: one load from memory, the others from the cache). No scores held: the
    warp walks keys 0 .. S_on - 1 (causal: to the query's position) four at a time, lanes along K for the four dot
    products (`warp_sum`), then the online softmax of attention_blocked's key blocks, here a block of four keys:
        m' = max(m, x);  a = exp(m - m');  p = exp(x - m');  l = l a + sum p (float64);  o = o a + p v;  m = m'
    (m' not finite: taken as 0, `m_safe`), lanes along ARC value columns of V a pass (V > ARC: another pass, the
    scores again), and out = o / l. Grid T x Hkv x chunks of the G = H / Hkv heads, block 32 x min(ARW, G)."""
    T, H = q.shape[0], q.shape[1]
    S = k.shape[0]
    Hkv = k.shape[1]
    V = v.shape[2]
    G = H // Hkv
    nw = cuda.blockDim.x // 32
    chunks = (G + nw - 1) // nw
    b = cuda.blockIdx.x
    t = b // (Hkv * chunks)
    r = b - t * (Hkv * chunks)
    n = r // chunks
    gi = (r - n * chunks) * nw + cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    if t >= T or gi >= G:                            # (a whole warp: its shuffles are among its own lanes)
        return
    h = n * G + gi
    qp = qpos[t]
    S_on = S
    if causal and qp + 1 < S:                        # keys past the query's position: masked, not read
        S_on = qp + 1
    ninf = float32(-math.inf)
    for c0 in range(0, V, ARC):
        wide = V - c0 > 128                          # (the upper four columns a lane: a pass of more than 128)
        j0, j1, j2, j3 = min(c0 + lane, V - 1), min(c0 + lane + 32, V - 1), min(c0 + lane + 64, V - 1), \
            min(c0 + lane + 96, V - 1)
        j4, j5, j6, j7 = min(c0 + lane + 128, V - 1), min(c0 + lane + 160, V - 1), min(c0 + lane + 192, V - 1), \
            min(c0 + lane + 224, V - 1)
        o0 = o1 = o2 = o3 = o4 = o5 = o6 = o7 = float32(0.0)
        m = ninf
        den = float64(0.0)
        for s0 in range(0, S_on, 4):
            ra = s0
            rb, rc, rd = min(s0 + 1, S_on - 1), min(s0 + 2, S_on - 1), min(s0 + 3, S_on - 1)
            aa, ab, ac, ad = _scores4(q, k, t, h, n, ra, rb, rc, rd, lane)
            xa, xb, xc, xd = float32(aa * scale), float32(ab * scale), float32(ac * scale), float32(ad * scale)
            tb, tc, td = s0 + 1 < S_on, s0 + 2 < S_on, s0 + 3 < S_on
            if not tb:
                xb = ninf
            if not tc:
                xc = ninf
            if not td:
                xd = ninf
            mn = max(max(m, xa), max(xb, max(xc, xd)))
            ms = mn if math.isfinite(mn) else float32(0.0)
            a = float32(math.exp(m - ms))
            pa, pb = float32(math.exp(xa - ms)), float32(math.exp(xb - ms))
            pc, pd = float32(math.exp(xc - ms)), float32(math.exp(xd - ms))
            den = den * float64(a) + (((float64(pa) + float64(pb)) + float64(pc)) + float64(pd))
            m = mn
            o0, o1, o2, o3 = _keys4(o0, o1, o2, o3, a, pa, pb, pc, pd, tb, tc, td, v, ra, rb, rc, rd, n, j0, j1, j2, j3)
            if wide:
                o4, o5, o6, o7 = _keys4(o4, o5, o6, o7, a, pa, pb, pc, pd, tb, tc, td, v, ra, rb, rc, rd, n, j4, j5, j6,
                                        j7)
        dn = float32(den)                            # (a row with no key: 0, the output NaN, as softmax)
        _store4(out, t, h, c0 + lane, V, o0 / dn, o1 / dn, o2 / dn, o3 / dn)
        _store4(out, t, h, c0 + lane + 128, V, o4 / dn, o5 / dn, o6 / dn, o7 / dn)


HC_MAX = 8                 # hyper-connections: streams (the gates: an n x n matrix a block, a cell a thread)
HC_CELLS = 64              # HC_MAX ** 2 (a shared array's size must be a literal constant)


@cuda.jit(device=True, inline=True)
def _normalise_lines(a, red, n, i, stride, step, line, live, eps):
    """The n x n matrix a (shared, a cell a thread) divided by its lines' sums + eps: thread i < n sums line i
    (cells i * stride + j * step, j = 0 .. n-1, in order, float32), then each cell divides by its own line's (`line`):
    rows: stride n, step 1; columns: stride 1, step n. Block-wide barriers."""
    if i < n:
        r = float32(0.0)
        for j in range(n):
            r = float32(r + a[i * stride + j * step])
        red[i] = float32(r + eps)
    cuda.syncthreads()
    if live:
        a[i] = float32(a[i] / red[line])
    cuda.syncthreads()


@cuda.jit(fastmath=False)
def _hc_gates(m, scale, base, iters, eps, pre, post, comb):
    """One block per token t (HC_CELLS threads, thread i the cell (i // n, i % n) of its n x n matrix), from its
    mixes m[t] [(2 + n) * n] (`hyper_connections.gates`): pre = sigmoid(m[:n] scale[0] + base[:n]) + eps,
    post = 2 sigmoid(m[n:2n] scale[1] + base[n:2n]) (threads i < n), and comb = Sinkhorn of m[2n:] scale[2] +
    base[2n:] as [n, n]: softmax over dst (float64 sum) + eps, then column and row normalisations in float32, as
    `hyper_connections.sinkhorn`. Each row's or column's sum is one thread's, in index order (thread i < n: row i,
    column i); the cells divide in parallel. Every product and sum rounded to float32 as NumPy's."""
    t = cuda.blockIdx.x
    i = cuda.threadIdx.x
    n = pre.shape[1]
    a = cuda.shared.array(HC_CELLS, float32)
    red = cuda.shared.array(HC_MAX, float32)
    red64 = cuda.shared.array(HC_MAX, float64)
    s = i // n
    d = i - s * n
    live = i < n * n
    if i < n:
        pre[t, i] = float32(_sigmoid1(float32(float32(m[t, i] * scale[0]) + base[i])) + eps)
        v = float32(float32(m[t, n + i] * scale[1]) + base[n + i])
        post[t, i] = float32(_sigmoid1(v) * float32(2.0))
    if live:
        a[i] = float32(float32(m[t, 2 * n + i] * scale[2]) + base[2 * n + i])
    cuda.syncthreads()
    if i < n:                                        # row i's max
        mx = a[i * n]
        for dd in range(1, n):
            if a[i * n + dd] > mx:
                mx = a[i * n + dd]
        red[i] = mx
    cuda.syncthreads()
    if live:
        a[i] = float32(math.exp(a[i] - red[s]))
    cuda.syncthreads()
    if i < n:                                        # row i's float64 sum
        tot = float64(0.0)
        for dd in range(n):
            tot += float64(a[i * n + dd])
        red64[i] = tot
    cuda.syncthreads()
    if live:
        a[i] = float32(float32(float64(a[i]) / red64[s]) + eps)
    cuda.syncthreads()
    for it in range(iters):
        if it > 0:                                   # rows (over dst), then columns
            _normalise_lines(a, red, n, i, n, 1, s, live, eps)
        _normalise_lines(a, red, n, i, 1, n, d, live, eps)
    if live:
        comb[t, s, d] = a[i]


@cuda.jit(fastmath=False)
def _collapse(X, pre, out):
    """out[t, d] = sum_s pre[t, s] X[t, s, d], streams added in order (`hyper_connections.collapse`)."""
    i = cuda.grid(1)
    T, n, D = X.shape
    if i >= T * D:
        return
    t = i // D
    d = i - t * D
    acc = float32(X[t, 0, d] * pre[t, 0])
    for s in range(1, n):
        acc = acc + float32(X[t, s, d] * pre[t, s])
    out[t, d] = acc


@cuda.jit(device=True, inline=True)
def _split3(i, n, D):
    """Flat index i of a C-ordered [T, n, D] array -> (t, j, d)."""
    t = i // (n * D)
    r = i - t * n * D
    j = r // D
    return t, j, r - j * D


@cuda.jit(fastmath=False)
def _hc_post(y, X, post, comb, out):
    """out[t, dst, d] = y[t, d] post[t, dst] + sum_src comb[t, src, dst] X[t, src, d], sources in order."""
    i = cuda.grid(1)
    T, n, D = X.shape
    if i >= T * n * D:
        return
    t, dst, d = _split3(i, n, D)
    acc = float32(y[t, d] * post[t, dst])
    for src in range(n):
        acc = acc + float32(X[t, src, d] * comb[t, src, dst])
    out[t, dst, d] = acc


@cuda.jit(fastmath=False)
def _gated_mean(xn, g, inv_p, y):
    """y[t, d] = (xn[t, 0, d] sigmoid(g[t, 0, d]) + ... + xn[t, P-1, d] sigmoid(g[t, P-1, d])) * inv_p, the
    products and the sum in float32, streams in order (`gated_streams.mix`'s gated mean). A thread a (t, d)."""
    i = cuda.grid(1)
    T, P, D = xn.shape
    if i >= T * D:
        return
    t = i // D
    d = i - t * D
    acc = float32(xn[t, 0, d] * _sigmoid1(g[t, 0, d]))
    for p in range(1, P):
        acc = acc + float32(xn[t, p, d] * _sigmoid1(g[t, p, d]))
    y[t, d] = acc * inv_p


@cuda.jit(fastmath=False)
def _streams_combine(R, out, inj, inv_p, Rn):
    """Rn[t, p, d] = R[t, p, d] + (sigmoid(inj[t, p] * inv_p) * 2) * out[t, d] (`gated_streams.combine`), each step
    rounded to float32 as NumPy rounds it. A thread a (t, p, d)."""
    i = cuda.grid(1)
    T, P, D = R.shape
    if i >= T * P * D:
        return
    t, p, d = _split3(i, P, D)
    w = float32(_sigmoid1(float32(inj[t, p] * inv_p)) * float32(2.0))
    Rn[t, p, d] = R[t, p, d] + float32(w * out[t, d])


TOPK_E = 2048              # top_k: entries of a row (a shared flag each)
TOPK_MAX = 64              # top_k: k (one block-wide argmax a pick)


@cuda.jit(device=True, inline=True)
def _own_first(x, r, t, E, taken):
    """Thread t's first entry of row r in the stable descending order among its own (j = t, t + NT, ..) not taken:
    (value, index), index E when none is left."""
    bv = float32(0.0)
    bj = E
    for j in range(t, E, NT):
        if not taken[j] and before_desc(x[r, j], j, bv, bj, E):
            bv = x[r, j]
            bj = j
    return bv, bj


@cuda.jit(fastmath=False)
def _top_k(x, k, ids):
    """Row r = blockIdx.x: `_top_k_row`."""
    taken = cuda.shared.array(TOPK_E, boolean)
    wv = cuda.shared.array(NTW, float32)
    wj = cuda.shared.array(NTW, int32)
    pick = cuda.shared.array(1, int32)
    _top_k_row(x, cuda.blockIdx.x, k, ids, taken, wv, wj, pick)


@cuda.jit(device=True, inline=True)
def _top_k_row(x, r, k, ids, taken, wv, wj, pick):
    """Row r of ids: k picks, each the block's first entry in the stable descending order among those not picked
    yet (np.argsort(-x, kind="stable")[:k]). Each thread keeps the first of its own entries (a scan of E / NT of
    them) and rescans only when the pick was that entry; a pick is the first of the threads' entries, by warp
    shuffles and then across the warps (two barriers a pick; a tree over shared memory took nine). Shared: taken
    [TOPK_E] bool, wv / wj [NTW], pick [1]."""
    t = cuda.threadIdx.x
    lane = t % 32
    w = t // 32
    E = x.shape[1]
    for j in range(t, E, NT):
        taken[j] = False
    cuda.syncthreads()
    bv, bj = _own_first(x, r, t, E, taken)
    for a in range(k):
        v, j = warp_first_desc(bv, bj, E)
        if lane == 0:
            wv[w] = v
            wj[w] = j
        cuda.syncthreads()
        if w == 0:
            v = wv[lane] if lane < NTW else float32(0.0)
            j = wj[lane] if lane < NTW else E
            v, j = warp_first_desc(v, j, E)
            if lane == 0:
                ids[r, a] = j
                taken[j] = True
                pick[0] = j
        cuda.syncthreads()
        if pick[0] == bj:
            bv, bj = _own_first(x, r, t, E, taken)


@cuda.jit(device=True, inline=True)
def _hv(x, t, N, j):
    """Row t's score at j of a padded axis: -inf past the row's N entries."""
    return x[t, j] if j < N else float32(-math.inf)


@cuda.jit(device=True, inline=True)
def _push_heap(x, t, N, o, hole, top, value):
    parent = (hole - 1) // 2
    while hole > top and _hv(x, t, N, o[parent]) > _hv(x, t, N, value):
        o[hole] = o[parent]
        hole = parent
        parent = (hole - 1) // 2
    o[hole] = value


@cuda.jit(device=True, inline=True)
def _adjust_heap(x, t, N, o, hole, length, value):
    top = hole
    second = hole
    while second < (length - 1) // 2:
        second = 2 * (second + 1)
        if _hv(x, t, N, o[second]) > _hv(x, t, N, o[second - 1]):
            second -= 1
        o[hole] = o[second]
        hole = second
    if length % 2 == 0 and second == (length - 2) // 2:
        second = 2 * (second + 1)
        o[hole] = o[second - 1]
        hole = second - 1
    _push_heap(x, t, N, o, hole, top, value)


@cuda.jit(fastmath=False)
def _ggml_top_k_rows(x, n_arr, k, clean_stable, out):
    """Row t = one thread: ops/top_k.py `ggml_top_k_rows`, step for step: the heap select of libstdc++'s
    partial_sort (the heap in out[t, :kk]; an index past it is still itself when read, as there), sort_heap, the
    swap of entries 0 and 1, a stable insertion sort by descending score (Python's sorted on the same keys), with
    clean_stable and no tie at the k-th score (a count of the row's scores at or above it) ties by index, -1 past
    kk."""
    t = cuda.grid(1)
    if t >= x.shape[0]:
        return
    N = x.shape[1]
    L = n_arr[0]
    kk = min(k, L)
    o = out[t]
    for i in range(kk):
        o[i] = i
    if kk >= 2:                                  # make_heap
        parent = (kk - 2) // 2
        while True:
            _adjust_heap(x, t, N, o, parent, kk, o[parent])
            if parent == 0:
                break
            parent -= 1
    for i in range(kk, L):                       # select: a strictly larger score replaces the top
        if _hv(x, t, N, i) > _hv(x, t, N, o[0]):
            _adjust_heap(x, t, N, o, 0, kk, i)
    last = kk - 1
    while last > 0:                              # sort_heap
        value = o[last]
        o[last] = o[0]
        _adjust_heap(x, t, N, o, 0, last, value)
        last -= 1
    if kk > 1:
        a = o[0]
        o[0] = o[1]
        o[1] = a
    for i in range(1, kk):                       # stable, descending
        key = o[i]
        vk = _hv(x, t, N, key)
        j = i - 1
        while j >= 0 and _hv(x, t, N, o[j]) < vk:
            o[j + 1] = o[j]
            j -= 1
        o[j + 1] = key
    if clean_stable and kk > 0:
        m = _hv(x, t, N, o[kk - 1])
        clean = kk >= L or m == float32(-math.inf)
        if not clean:
            c = 0
            for i in range(L):
                if _hv(x, t, N, i) >= m:
                    c += 1
            clean = c == kk
        if clean:                                # ties by index: the heap's order among them undone
            for i in range(1, kk):
                key = o[i]
                vk = _hv(x, t, N, key)
                j = i - 1
                while j >= 0 and _hv(x, t, N, o[j]) == vk and o[j] > key:
                    o[j + 1] = o[j]
                    j -= 1
                o[j + 1] = key
    for i in range(kk, k):
        o[i] = -1


GL_G = 64                   # group_limited: groups of a row at most (a shared score and flag each; two a lane)


@cuda.jit(device=True, inline=True)
def _group_row(s, r, G, n_used, out, groups, gsc, sel):
    """Row r of s [R, E]: the score of each of the G groups of E / G experts is the float32 sum of its two largest
    (as -np.sort(-g)[..., :2] orders them: NaN last, so a group with fewer than two numbers scores NaN); the n_used
    best groups in the stable descending order (router.topk_desc) into groups [R, n_used]; out [R, E] = s where the
    expert's group is one of them, else -inf (router.group_limited). A warp a group, lanes striding over it, the top
    two merged by shuffles (warp_top2); warp 0 picks the groups, a lane holding two. gsc, sel: shared [GL_G] float32
    and boolean; every thread of the block calls it."""
    t = cuda.threadIdx.x
    lane = t % 32
    w = t // 32
    E = s.shape[1]
    GS = E // G
    ninf = float32(-math.inf)
    for g in range(w, G, NTW):
        a1 = ninf
        a2 = ninf
        nn = 0
        for j in range(g * GS + lane, (g + 1) * GS, 32):
            v = s[r, j]
            if v == v:
                nn += 1
                a1, a2 = top2_merge(a1, a2, v, ninf)
        a1, a2, nn = warp_top2(a1, a2, nn)
        if lane == 0:
            gsc[g] = float32(a1 + a2) if nn >= 2 else float32(math.nan)
    cuda.syncthreads()
    if w == 0:                                            # lane l holds groups l and l + 32 (G <= GL_G = 64)
        tk0 = False
        tk1 = False
        for a in range(n_used):
            bv = float32(0.0)
            bj = G
            if lane < G and not tk0:
                bv = gsc[lane]
                bj = lane
            g = lane + 32
            if g < G and not tk1 and before_desc(gsc[g], g, bv, bj, G):
                bv = gsc[g]
                bj = g
            v, j = warp_first_desc(bv, bj, G)
            if j == lane:
                tk0 = True
            if j == lane + 32:
                tk1 = True
            if lane == 0:
                groups[r, a] = j
        if lane < G:
            sel[lane] = tk0
        if lane + 32 < G:
            sel[lane + 32] = tk1
    cuda.syncthreads()
    for j in range(t, E, NT):
        out[r, j] = s[r, j] if sel[j // GS] else ninf


@cuda.jit(fastmath=False)
def _group_limited(s, G, n_used, out, groups):
    """Row r = blockIdx.x of s [R, E]: `_group_row` (router.group_limited)."""
    gsc = cuda.shared.array(GL_G, float32)
    sel = cuda.shared.array(GL_G, boolean)
    _group_row(s, cuda.blockIdx.x, G, n_used, out, groups, gsc, sel)


FLAG_BATCH = 16             # all_finite_many: arrays checked by one launch (its kernel's array arguments; session 38: a
                            # launch took ~4.9 us of a decode step on an H100 whatever its arrays, 8 a launch made it
                            # 0.6 launches a qwen3moe layer, 16 make it 0.3)


@cuda.jit(device=True, inline=True)
def _scan_finite(y, page, cell):
    """page[cell] = False when y (flat) holds a NaN or an inf, the blocks of one grid row striding over y; page was
    filled with True (a benign race: every writer writes False)."""
    stride = cuda.gridDim.x * cuda.blockDim.x
    for i in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, y.shape[0], stride):
        v = y[i]
        if v != v or v - v != 0:
            page[cell] = False


@cuda.jit(fastmath=False)
def _all_finite_many(y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15, page,
                     c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15):
    """Grid row j (blockIdx.y) checks y_j into page[c_j] (page: the flag page flat); as many grid rows as arrays
    (FLAG_BATCH at most: the slots past them repeat y0 and are never read)."""
    j = cuda.blockIdx.y
    if j < 8:
        y = y0 if j == 0 else y1 if j == 1 else y2 if j == 2 else y3 if j == 3 else \
            y4 if j == 4 else y5 if j == 5 else y6 if j == 6 else y7
        c = c0 if j == 0 else c1 if j == 1 else c2 if j == 2 else c3 if j == 3 else \
            c4 if j == 4 else c5 if j == 5 else c6 if j == 6 else c7
    else:
        y = y8 if j == 8 else y9 if j == 9 else y10 if j == 10 else y11 if j == 11 else \
            y12 if j == 12 else y13 if j == 13 else y14 if j == 14 else y15
        c = c8 if j == 8 else c9 if j == 9 else c10 if j == 10 else c11 if j == 11 else \
            c12 if j == 12 else c13 if j == 13 else c14 if j == 14 else c15
    _scan_finite(y, page, c)


@cuda.jit(fastmath=False)
def _append_rows(buf, x, count, buf2, x2, count2, two, advance):
    """buf[count[0] + i, :] = x[i, :] for every row i of x ([T, W] float32 into [capacity, W]), and when `two` the
    same of x2 into buf2 at count2 (two caches' rows, k and v, in one launch); then, when `advance` (a launch of
    one block), count[0] += T (and count2[0] += T2): every thread read the old counts before the barrier."""
    T = x.shape[0]
    W = x.shape[1]
    n1 = T * W
    T2 = x2.shape[0] if two else 0
    W2 = x2.shape[1]
    c = count[0]
    c2 = count2[0]
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for e in range(start, n1 + T2 * W2, stride):
        if e < n1:
            i = e // W
            buf[c + i, e - i * W] = x[i, e - i * W]
        else:
            f = e - n1
            i = f // W2
            buf2[c2 + i, f - i * W2] = x2[i, f - i * W2]
    if advance:
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            count[0] = c + T
            if two:
                count2[0] = c2 + T2


@cuda.jit(fastmath=False)
def _expert_weights(probs, ids, norm_w, scale, has_scale, out):
    """Row t per thread: `_weights_row`."""
    t = cuda.grid(1)
    if t < ids.shape[0]:
        _weights_row(probs, ids, t, norm_w, scale, has_scale, out)


@cuda.jit(fastmath=False)
def _route_softmax(x, k, norm_w, scale, has_scale, probs, ids, out):
    """Row r = blockIdx.x of a softmax router (`moe.router.route`, gating softmax, no bias, no groups): probs =
    softmax of the logits' row (`_softmax_row`), ids its k largest (`_top_k_row`), out their weights
    (`_weights_row`, thread 0): one launch where the three take three."""
    r = cuda.blockIdx.x
    shm = cuda.shared.array(NT, float32)
    buf = cuda.shared.array(32, float64)
    taken = cuda.shared.array(TOPK_E, boolean)
    wv = cuda.shared.array(NTW, float32)
    wj = cuda.shared.array(NTW, int32)
    pick = cuda.shared.array(1, int32)
    _softmax_row(x, r, probs, shm, buf)
    cuda.syncthreads()                               # the row's probs written before any thread reads them
    _top_k_row(probs, r, k, ids, taken, wv, wj, pick)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        _weights_row(probs, ids, r, norm_w, scale, has_scale, out)


RWE = 16                    # the warp routers: a row's entries a lane holds at most (rows of at most 32 * RWE)
ROUTE_WARP_E = 32 * RWE
ROUTE_WARP_K = 32           # their k (lane a keeps pick a)


def route_rwe(E: int) -> int:
    """The entries a lane holds for a row of E (<= ROUTE_WARP_E): the least power of two covering E / 32. A kernel
    is made for each (`route_warp_kernels`): a 128-expert router's lanes hold 4, not RWE, so its loops and its
    picks' rescans are a quarter of the unrolled code (session 38: `_route_softmax_warps` with every loop RWE long
    took 11.8 us of a decode layer on an H100, its PTX 4x DeviceModel's router's for E = 128)."""
    r = 1
    while 32 * r < E:
        r *= 2
    return r


@functools.cache
def route_warp_kernels(rwe: int):
    """(softmax router, sigmoid router), a warp a row, for rows of at most 32 * rwe entries (rwe a power of two
    <= RWE): `_route_softmax` and `_route_sigmoid` without groups, their loops rwe long."""

    @cuda.jit(device=True, inline=True)
    def warp_top_k(sel, val, E, k, lane, ids, out, r, norm_w, scale, has_scale):
        """A warp's row r held in registers (lane l: entries l, l + 32, ..., rwe of them, sel / val [rwe] local):
        ids[r] = the k picks of the stable descending order of sel (np.argsort(-sel, kind="stable")[:k]), each the
        warp's first untaken entry (`warp_first_desc_with`; the lane that held it takes its next), lane a keeping
        pick a; out[r] = val at the picks with `_weights_row`'s float32 steps (the float64 sum in pick order),
        written by lanes 0..k-1."""
        taken = int32(0)                             # bit i: entry i * 32 + lane picked
        bv = float32(0.0)
        bu = float32(0.0)
        bj = E
        for i in range(rwe):                         # the lane's first untaken entry (index order within the lane)
            j = i * 32 + lane
            if j < E and before_desc(sel[i], j, bv, bj, E):
                bv = sel[i]
                bu = val[i]
                bj = j
        s = float64(0.0)
        mv = float32(0.0)
        mj = int32(0)
        for a in range(k):
            v, j, u = warp_first_desc_with(bv, bj, bu, E)
            s += float64(u)
            if lane == a:
                mv = u
                mj = j
            if j == bj:                              # this lane's entry was picked: its next
                taken |= int32(1) << (j // 32)
                bv = float32(0.0)
                bj = E
                for i in range(rwe):
                    jj = i * 32 + lane
                    if jj < E and not (taken >> i) & 1 and before_desc(sel[i], jj, bv, bj, E):
                        bv = sel[i]
                        bu = val[i]
                        bj = jj
        if lane < k:
            ids[r, lane] = mj
            w = mv
            if norm_w:
                d = float32(s)
                if d < F16_MIN:                      # (np.maximum: a NaN sum stays NaN)
                    d = F16_MIN
                w = w / d
            if has_scale:
                w = w * scale
            out[r, lane] = w

    def route_softmax_warps(x, k, norm_w, scale, has_scale, probs, ids, out):
        """`_route_softmax` for rows of at most 32 * rwe entries and k <= 32, a warp a row (row r = blockIdx.x *
        NTW + the thread's warp, as `_rms_warps`): lane l holds entries l, l + 32, ... in registers (rwe of them);
        the max (NaN winning) and the float64 sum by shuffles, then `warp_top_k`. A decode step's router is one
        row: a block's barriers and thread 0's reads of the picks back from memory were its time (session 37: 12 us
        a launch on an H100, a layer's second-largest small kernel)."""
        r, lane = _warp_row()
        if r >= x.shape[0]:                          # (the whole warp: r is the warp's)
            return
        E = x.shape[1]
        p = cuda.local.array(rwe, float32)
        m = float32(-math.inf)
        for i in range(rwe):
            j = i * 32 + lane
            if j < E:
                p[i] = x[r, j]
                m = max_nan(m, p[i])
        m = warp_max_nan(m)
        acc = float64(0.0)
        for i in range(rwe):
            if i * 32 + lane < E:
                e = float32(math.exp(p[i] - m))
                p[i] = e
                acc += float64(e)
        tot = warp_sum(acc)
        for i in range(rwe):
            j = i * 32 + lane
            if j < E:
                q = float32(float64(p[i]) / tot)
                p[i] = q
                probs[r, j] = q
        warp_top_k(p, p, E, k, lane, ids, out, r, norm_w, scale, has_scale)

    def route_sigmoid_warps(x, k, bias, has_bias, norm_w, scale, has_scale, probs, sel, ids, out):
        """`_route_sigmoid` without groups for rows of at most 32 * rwe entries and k <= 32, a warp a row: probs
        and the selection (probs + bias) in registers, written out, then `warp_top_k` over the selection with
        probs' weights."""
        r, lane = _warp_row()
        if r >= x.shape[0]:
            return
        E = x.shape[1]
        p = cuda.local.array(rwe, float32)
        q = cuda.local.array(rwe, float32)
        for i in range(rwe):
            j = i * 32 + lane
            if j < E:
                v = _sigmoid1(x[r, j])
                p[i] = v
                q[i] = v + bias[j] if has_bias else v
                probs[r, j] = v
                sel[r, j] = q[i]
        warp_top_k(q, p, E, k, lane, ids, out, r, norm_w, scale, has_scale)

    return (_named_kernel(route_softmax_warps, f"route_softmax_warps_rwe{rwe}"),
            _named_kernel(route_sigmoid_warps, f"route_sigmoid_warps_rwe{rwe}"))


_route_softmax_warps, _route_sigmoid_warps = route_warp_kernels(RWE)    # (the widest: ptx.py compiles it)


@cuda.jit(fastmath=False)
def _route_sigmoid(x, k, bias, has_bias, G, n_used, norm_w, scale, has_scale, probs, sel, masked, groups, ids, out):
    """Row r = blockIdx.x of a sigmoid router (`moe.router.route`, gating sigmoid, a selection bias or none):
    probs = sigmoid of the logits' row (`_sigmoid1`), sel = probs + bias (the selection; probs without a bias);
    with G > 1 groups the n_used best kept (`_group_row`: masked, groups); ids the k largest of the selection
    (masked with groups; `_top_k_row`), out probs' weights at them (`_weights_row`, thread 0): one launch where
    the steps take four (six with groups)."""
    r = cuda.blockIdx.x
    taken = cuda.shared.array(TOPK_E, boolean)
    wv = cuda.shared.array(NTW, float32)
    wj = cuda.shared.array(NTW, int32)
    pick = cuda.shared.array(1, int32)
    gsc = cuda.shared.array(GL_G, float32)
    gsel = cuda.shared.array(GL_G, boolean)
    for e in range(cuda.threadIdx.x, x.shape[1], cuda.blockDim.x):
        p = _sigmoid1(x[r, e])
        probs[r, e] = p
        sel[r, e] = p + bias[e] if has_bias else p
    cuda.syncthreads()                               # the row's selection written before any thread reads it
    if G > 1:
        _group_row(sel, r, G, n_used, masked, groups, gsc, gsel)
        cuda.syncthreads()
        _top_k_row(masked, r, k, ids, taken, wv, wj, pick)
    else:
        _top_k_row(sel, r, k, ids, taken, wv, wj, pick)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        _weights_row(probs, ids, r, norm_w, scale, has_scale, out)


@cuda.jit(device=True, inline=True)
def _weights_row(probs, ids, t, norm_w, scale, has_scale, out):
    """Row t: out[t, a] = probs[t, ids[t, a]]; when norm_w divided by max(float32(their float64 sum), 2^-14); when
    has_scale times scale (`moe.router.expert_weights` for the gates that pick from probs)."""
    A = ids.shape[1]
    s = float64(0.0)
    for a in range(A):
        w = probs[t, ids[t, a]]
        out[t, a] = w
        s += float64(w)
    if norm_w:
        d = float32(s)
        if d < F16_MIN:                                  # (np.maximum: a NaN sum stays NaN)
            d = F16_MIN
        for a in range(A):
            out[t, a] = out[t, a] / d
    if has_scale:
        for a in range(A):
            out[t, a] = out[t, a] * scale


# ---------------------------------------------------------------- launches on raw device arrays (numba or CuPy)
def _grid(n: int, per: int = 256) -> int:
    return max(1, (n + per - 1) // per)


GATE_ACTS = {"silu": 1, "sigmoid": 2}     # _rms_warps' act


def rms_norm_raw(x2, w, eps: float, y2, stream=0, *, a2=None, s2=None, post: float = 1.0, gate2=None,
                 act: str | None = None, A: int = 1, e2=None) -> None:
    """x2, y2 [R, D] float32 (device), w [D] float32 or None; a2 [R * A, D], s2 [R, D]: x2 + a2 is normed (and
    written to s2), a2's rows r*A .. r*A + A - 1 summed in order first where A > 1 (a MoE layer's slots), e2 [R, D]
    added to that sum (`fused._addend`); post: a factor after the norm (rounded after it); gate2 [R, D] and act
    (GATE_ACTS, rows of at most WARP_ROW_MAX_D): the norm times act(gate2) instead."""
    has_w, has_a, has_e = w is not None, a2 is not None, e2 is not None
    R, D = x2.shape
    a_, e_, w_ = a2 if has_a else x2, e2 if has_e else x2, w if has_w else x2[0, :1]
    if D <= WARP_ROW_MAX_D:
        _rms_warps[_grid(R, NTW), NT, stream](x2, a_, A, e_, has_e, has_a, w_, has_w, np.float32(eps),
                                              np.float32(post), x2 if gate2 is None else gate2,
                                              0 if gate2 is None else GATE_ACTS[act], s2 if has_a else y2, y2)
    else:
        assert gate2 is None, "a gated norm's rows take a warp each (at most WARP_ROW_MAX_D)"
        k = _rms_rows_slots if has_a and A > 1 else _rms_rows
        k[R, NT, stream](x2, a_, A, e_, has_e, has_a, w_, has_w, np.float32(eps), np.float32(post), s2 if has_a else y2,
                         y2)


def layer_norm_raw(x2, w, b, eps: float, y2, stream=0) -> None:
    """x2, y2 [R, D] float32 (device), w, b [D] float32 or None."""
    dummy = x2[0, :1]
    _layer_rows[x2.shape[0], NT, stream](x2, dummy if w is None else w, w is not None, dummy if b is None else b,
                                         b is not None, np.float32(eps), y2)


def softmax_raw(x2, y2, stream=0) -> None:
    _softmax_rows[x2.shape[0], NT, stream](x2, y2)


def silu_raw(x1, y1, stream=0) -> None:
    _silu[_grid(x1.shape[0]), 256, stream](x1, y1)


def sigmoid_raw(x1, y1, stream=0) -> None:
    _sigmoid[_grid(x1.shape[0]), 256, stream](x1, y1)


def swiglu_raw(g1, u1, y1, stream=0) -> None:
    _swiglu[_grid(g1.shape[0]), 256, stream](g1, u1, y1)


def situ_raw(g1, u1, beta: float, lb: float, y1, stream=0) -> None:
    _situ[_grid(g1.shape[0]), 256, stream](g1, u1, np.float32(beta), np.float32(lb), y1)


def swiglu_clamp_raw(g1, u1, limit: float, y1, stream=0) -> None:
    _swiglu_clamp[_grid(g1.shape[0]), 256, stream](g1, u1, np.float32(limit), y1)


def softplus_raw(x1, y1, stream=0) -> None:
    _softplus[_grid(x1.shape[0]), 256, stream](x1, y1)


def delta_rule_raw(q, k, v, g, g_per_key: bool, beta, S_in, scale: float, o, S_out, stream=0,
                   cols: int | None = None) -> None:
    """q, k [T, H, K], v [T, H, V], g [T, H, K] (g_per_key) or [T, H, 1], beta [T, H], S_in [H, K, V] or None;
    o [T, H, V] and S_out [H, K, V] written. cols: value columns a warp (None: DR_COLS)."""
    H, V = v.shape[1], v.shape[2]
    has_S = S_in is not None
    cols = DR_COLS if cols is None else cols
    blocks = H * ((V + DR_WARPS * cols - 1) // (DR_WARPS * cols))
    delta_rule_kernel(q.shape[2], cols)[blocks, 32 * DR_WARPS, stream](q, k, v, g, g_per_key, beta,
                                                                       S_in if has_S else S_out, has_S,
                                                                       np.float32(scale), o, S_out)


def gdn_gates_raw(bsrc, asrc, r: int, bias, A, beta, sp, g, stream=0) -> None:
    """bsrc [T, Hk * 2r] (r > 0) or bsrc, asrc [T, Hv] (r == 0); bias, A [Hv]; beta, sp, g [T, Hv] written."""
    _gdn_gates[_grid(beta.shape[0] * beta.shape[1]), 256, stream](bsrc, bsrc if asrc is None else asrc, r, bias, A,
                                                                  beta, sp, g)


def kda_gates_raw(z, b, bias, A, dh: int, lb, g, beta, stream=0) -> None:
    """z [T, H * dh], b [T, H], bias [H * dh], A [H]; lb None (softplus) or the bound; g [T, H, dh], beta [T, H]
    written."""
    n = max(z.shape[0] * z.shape[1], b.shape[0] * b.shape[1])
    _kda_gates[_grid(n), 256, stream](z, b, bias, A, int(dh), lb is not None, np.float32(0.0 if lb is None else lb),
                                      g, beta)


def causal_conv_raw(x, w, tail, y, new_tail, stream=0, then_silu: bool = False) -> None:
    """x [T, C], w [C, Kc], tail [Kc-1, C] or None; y [T, C] (then_silu: its silu) and new_tail [Kc-1, C] written."""
    has_tail = tail is not None
    n = max(x.shape[0], w.shape[1] - 1) * x.shape[1]
    _causal_conv[_grid(n, 128), 128, stream](x, w, tail if has_tail else new_tail, has_tail, bool(then_silu), y,
                                             new_tail)


def pool_at_raw(kv, score, b, ratio: int, c: int, K: int, out, stream=0) -> None:
    """kv, score [S, c*K] float32, b [n] int64; out [n, K] written."""
    _pool_at[_grid(out.shape[0] * K), 256, stream](kv, score, b, int(ratio), int(c), int(K), out)


def rope_raw(x, cos, sin, n_rot: int, neox: bool, y, stream=0, off: int = 0, inverse: bool = False, x2=None,
             y2=None) -> None:
    """x [T, H, K] (strided) rotated into y; x2 [T, H2, K] into y2 by the same launch."""
    two = x2 is not None
    n = y.shape[0] * y.shape[1] * y.shape[2] + (y2.shape[0] * y2.shape[1] * y2.shape[2] if two else 0)
    _rope[_grid(n), 256, stream](x, cos, sin, n_rot, neox, off, np.float32(-1.0 if inverse else 1.0), y,
                                 x2 if two else x, y2 if two else y, two)


def norm_rope_raw(x, w, eps: float, cos, sin, n_rot: int, neox: bool, y, stream=0, x2=None, w2=None,
                  y2=None) -> None:
    """x [T, H, K] float32 (strided), w [K] float32 or None, cos / sin [T, n_rot/2]; y [T, H, K] written; x2 [T, H2,
    K] (with its w2 [K] or None) into y2 by the same launch."""
    has_w, has_w2, two = w is not None, w2 is not None, x2 is not None
    blocks = x.shape[0] * (x.shape[1] + (x2.shape[1] if two else 0))
    _norm_rope[blocks, NT, stream](x, w if has_w else cos[0], has_w, x2 if two else x, w2 if has_w2 else cos[0],
                                   has_w2, two, np.float32(eps), cos, sin, int(n_rot), bool(neox), y,
                                   y2 if two else y)


def norm_rope_append_raw(x, w, eps: float, cos, sin, n_rot: int, neox: bool, y, x2, w2, v2, kbuf, kcount, vbuf,
                         vcount, done, stream=0, norm: bool = True) -> None:
    """x [T, H, K] (q) into y; x2 [T, H2, K] (k) normed and rotated into kbuf [capacity, H2, K] from kcount[0]; v2
    [T, H2, V] into vbuf [capacity, H2, V] from vcount[0]; both counts (int64 [1]) advanced by T; w, w2 [K] float32
    or None; done: int32 [1], 0 before and after (the launch's ticket). norm False: rotated only (w, w2 unread)."""
    has_w, has_w2 = norm and w is not None, norm and w2 is not None
    T = x.shape[0]
    blocks = T * (x.shape[1] + 2 * x2.shape[1])
    _norm_rope_append[blocks, NT, stream](x, w if has_w else cos[0], has_w, x2, w2 if has_w2 else cos[0], has_w2, v2,
                                          np.float32(eps), cos, sin, int(n_rot), bool(neox), y, kbuf, kcount, vbuf,
                                          vcount, done, bool(norm))


def rope_cos_sin_raw(pos, theta_scale, ff, freq_scale, keep, mix, mscale, cos, sin, stream=0) -> None:
    """pos [T] (device ints or floats); ff, keep, mix [n_rot/2] float32 or None; cos, sin [T, n_rot/2] written."""
    dummy = cos[0]
    _rope_cos_sin[_grid(cos.shape[0] * cos.shape[1]), 256, stream](
        pos, np.float32(theta_scale), dummy if ff is None else ff, ff is not None, np.float32(freq_scale),
        dummy if keep is None else keep, dummy if mix is None else mix, keep is not None, np.float32(mscale), cos, sin)


def attention_raw(q, k, v, qpos, scale: float, causal: bool, p, out, idx=None, live=None, sinks=None,
                  stream=0) -> None:
    """q [T, H, K], k [S, Hkv, K], v [S, Hkv, V], qpos [T] int; p [T*H, S or n] float32 scratch; out [T, H, V].
    idx / live [T, n] (int, bool): the gathered form (each query's n keys; causal then False); sinks [H] float32."""
    gathered = idx is not None
    dummy = None if gathered else qpos.reshape(1, qpos.shape[0])   # (not read: the dense form's idx / live)
    _attention[q.shape[0] * q.shape[1], ANT_SIM if SIM else ANT, stream](
        q, k, v, qpos, np.float32(scale), causal, idx if gathered else dummy, live if gathered else dummy, gathered,
        sinks if sinks is not None else out[0, :, 0], sinks is not None, p, out)


def attention_rows_raw(q, k, v, qpos, scale: float, causal: bool, out, stream=0) -> None:
    """q [T, H, K], k [S, Hkv, K], v [S, Hkv, V], qpos [T] int; out [T, H, V] (`_attention_rows`)."""
    T, H = q.shape[0], q.shape[1]
    G = H // k.shape[1]
    nw = min(ARW, G)
    _attention_rows[T * k.shape[1] * ((G + nw - 1) // nw), 32 * nw, stream](q, k, v, qpos, np.float32(scale),
                                                                           causal, out)


def hc_gates_raw(m, scale, base, iters: int, eps: float, pre, post, comb, stream=0) -> None:
    _hc_gates[m.shape[0], HC_CELLS, stream](m, scale, base, iters, np.float32(eps), pre, post, comb)


def collapse_raw(X, pre, out, stream=0) -> None:
    _collapse[_grid(X.shape[0] * X.shape[2]), 256, stream](X, pre, out)


def hc_post_raw(y, X, post, comb, out, stream=0) -> None:
    _hc_post[_grid(X.shape[0] * X.shape[1] * X.shape[2]), 256, stream](y, X, post, comb, out)


def gated_mean_raw(xn, g, inv_p: float, y, stream=0) -> None:
    _gated_mean[_grid(y.shape[0] * y.shape[1]), 256, stream](xn, g, np.float32(inv_p), y)


def streams_combine_raw(R, out, inj, inv_p: float, Rn, stream=0) -> None:
    _streams_combine[_grid(R.shape[0] * R.shape[1] * R.shape[2]), 256, stream](R, out, inj, np.float32(inv_p), Rn)


def top_k_raw(x2, k: int, ids, stream=0) -> None:
    """x2 [R, E] float32 (E <= TOPK_E), ids [R, k] int32 (k <= min(E, TOPK_MAX))."""
    _top_k[x2.shape[0], NT, stream](x2, k, ids)


def ggml_top_k_rows_raw(x2, n, k: int, out, stream=0, clean_stable: bool = False) -> None:
    """x2 [T, N] float32, n [1] int64 (device), out [T, k] int32."""
    _ggml_top_k_rows[_grid(x2.shape[0], 64), 64, stream](x2, n, k, bool(clean_stable), out)


def group_limited_raw(s2, G: int, n_used: int, out, groups, stream=0) -> None:
    """s2, out [R, E] float32 (E % G == 0, G <= GL_G), groups [R, n_used] int32 (n_used <= G)."""
    _group_limited[s2.shape[0], NT, stream](s2, G, n_used, out, groups)


def all_finite_many_raw(ys, page1, cells, stream=0) -> None:
    """ys: 1 .. FLAG_BATCH float32 [n] device arrays, page1 the flag page flat (bool), cells their flat indices."""
    n = len(ys)
    if not 0 < n <= FLAG_BATCH or len(cells) != n:
        raise ValueError(f"all_finite_many: {n} arrays, {len(cells)} cells (1 .. {FLAG_BATCH} of each, as many)")
    gx = min(max(_grid(y.shape[0], 256 * 8) for y in ys), 1024)
    ys = list(ys) + [ys[0]] * (FLAG_BATCH - n)
    cells = [int(c) for c in cells] + [0] * (FLAG_BATCH - n)
    _all_finite_many[(gx, n), 256, stream](*ys, page1, *cells)


APPEND_ONE_BLOCK = 1 << 16  # append_rows: values written by one block, which also advances the count (else 2 launches)


def append_rows_raw(buf2, x2, count, stream=0, second=None) -> bool:
    """buf2 [capacity, W], x2 [T, W] float32, count [1] int64 (device): the rows written at the count; second: a
    second (buf, x, count) written by the same launch. True when the counts were advanced too (one block); False:
    the caller advances them."""
    two = second is not None
    b2, y2, c2 = second if two else (buf2, x2, count)
    n = x2.shape[0] * x2.shape[1] + (y2.shape[0] * y2.shape[1] if two else 0)
    one = n <= APPEND_ONE_BLOCK
    _append_rows[1 if one else min(_grid(n), 1024), 256, stream](buf2, x2, count, b2, y2, c2, two, one)
    return one


def route_softmax_raw(x2, k: int, norm_w: bool, scale, probs, ids, out, stream=0) -> None:
    """x2, probs [T, E] float32 (E <= TOPK_E), ids [T, k] int32 (k <= TOPK_MAX), out [T, k] float32; scale None or
    a float."""
    T, E = x2.shape
    if E <= ROUTE_WARP_E and k <= ROUTE_WARP_K:       # a warp a row, NTW rows a block
        route_warp_kernels(route_rwe(E))[0][_grid(T, NTW), NT, stream](x2, int(k), bool(norm_w),
                                                                       np.float32(scale or 0.0), scale is not None,
                                                                       probs, ids, out)
        return
    _route_softmax[T, NT, stream](x2, int(k), bool(norm_w), np.float32(scale or 0.0), scale is not None,
                                  probs, ids, out)


def route_sigmoid_raw(x2, k: int, bias, norm_w: bool, scale, probs, sel, ids, out, stream=0, *, G: int = 0,
                      n_used: int = 0, masked=None, groups=None) -> None:
    """x2, probs, sel [T, E] float32 (E <= TOPK_E), bias [E] float32 or None, ids [T, k] int32 (k <= TOPK_MAX), out
    [T, k] float32; scale None or a float; G > 1 groups (E % G == 0, G <= GL_G): the n_used best kept, masked [T, E]
    and groups [T, n_used] int32 written."""
    grouped = G > 1
    T, E = x2.shape
    if not grouped and E <= ROUTE_WARP_E and k <= ROUTE_WARP_K:      # a warp a row, as route_softmax_raw
        route_warp_kernels(route_rwe(E))[1][_grid(T, NTW), NT, stream](
            x2, int(k), x2[0] if bias is None else bias, bias is not None, bool(norm_w), np.float32(scale or 0.0),
            scale is not None, probs, sel, ids, out)
        return
    _route_sigmoid[x2.shape[0], NT, stream](x2, int(k), x2[0] if bias is None else bias, bias is not None,
                                            int(G) if grouped else 0, int(n_used), bool(norm_w),
                                            np.float32(scale or 0.0), scale is not None, probs, sel,
                                            masked if grouped else sel, groups if grouped else ids, ids, out)


def expert_weights_raw(probs, ids, norm_w: bool, scale, out, stream=0) -> None:
    """probs [T, E] float32, ids [T, A] int32, out [T, A] float32; scale None or a float."""
    _expert_weights[_grid(ids.shape[0], 64), 64, stream](probs, ids, bool(norm_w), np.float32(scale or 0.0),
                                                         scale is not None, out)


# ---------------------------------------------------------------- DeviceArray entry points (a GPU's CuPy arrays)
def _served(*a) -> bool:
    return all(v.dtype == np.float32 and v.flags.c_contiguous and v.size > 0 for v in a)


def _nv(a):
    """numba's view of a CuPy array, no copy, no synchronisation (None stays None)."""
    from quant.cuda.streams import numba_view
    return None if a is None else numba_view(a)


def _stream():
    """CuPy's current stream, as numba launches on it (a capture's)."""
    from quant.cuda.streams import current_stream
    return current_stream()


def _done(dev, op: str, args, *outs):
    """The kernel's outputs (CuPy arrays) as DeviceArrays, the op noted on the device (recordings, strict): one
    array, or a tuple of them."""
    res = tuple(dev.wrap(o) for o in outs)
    res = res[0] if len(res) == 1 else res
    dev.note(f"fused {op}", args, res)
    return res


def _vectors(dev, op: str, params, n: int):
    """params (host or device arrays of n numbers, or None) as the device's float32 buffers [n] (None stays None;
    a weight the file shapes [n, 1] taken as its n numbers), or None when one is not n float32 numbers."""
    bufs = [None if a is None else dev.unwrap(a, f"{op} weight") for a in params]
    if any(b is not None and (getattr(b, "size", None) != n or not _served(b)) for b in bufs):
        return None
    return [None if b is None else b.reshape(n) for b in bufs]


def _rows(x, op: str, params, launch):
    """A row op over the last axis of x ([..., D] float32): params (host or device arrays [D], or None) as the
    device's float32 buffers, launch(x2 [R, D], *params, out [R, D], stream) -> [..., D], or None. x's rows may lie
    apart (a latent's columns of a wider row, `ckv[:, :C]`): the kernels read x2[r, j]."""
    raw = x.raw
    if raw.ndim < 1 or raw.dtype != np.float32 or raw.size == 0 or raw.strides[-1] != raw.itemsize:
        return None
    D = raw.shape[-1]
    bufs = _vectors(x.dev, op, params, D)
    if bufs is None:
        return None
    x2 = raw.reshape(-1, D)                               # (a view where the axes allow it, else CuPy's copy)
    out = x.dev.xp.empty(x2.shape, dtype=np.float32)
    launch(_nv(x2), *[_nv(a) for a in bufs], _nv(out), _stream())
    return _done(x.dev, op, (x, *params), out.reshape(raw.shape))


def rms_norm(x, w, eps: float):
    return _rows(x, "rms_norm", (w,), lambda x2, wv, y, st: rms_norm_raw(x2, wv, eps, y, stream=st))


def gdn_gates(b, a, r: int, bias, A):
    """A gated-delta-net layer's (beta, softplus(a + bias), its product with A) [T, Hv] each, one launch; b the
    fused projection [T, Hk, 2r] when r > 0 (a None), else b and a [T, Hv]; or None for what it does not take."""
    dev = b.dev
    br = b.raw
    if r > 0:
        if a is not None or br.ndim != 3 or br.shape[2] != 2 * r or not _served(br):
            return None
        T, Hv = br.shape[0], br.shape[1] * r
        src_b, src_a = br.reshape(T, -1), None
    else:
        if not _on(a, dev) or br.ndim != 2 or a.shape != br.shape or not _served(br, a.raw):
            return None
        T, Hv = br.shape
        src_b, src_a = br, a.raw
    params = _vectors(dev, "gdn_gates", (bias, A), Hv)
    if params is None or any(p is None for p in params):
        return None
    xp = dev.xp
    beta, sp, g = (xp.empty((T, Hv), dtype=np.float32) for _ in range(3))
    gdn_gates_raw(_nv(src_b), _nv(src_a), r, _nv(params[0]), _nv(params[1]), _nv(beta), _nv(sp), _nv(g),
                  stream=_stream())
    return _done(dev, "gdn_gates", (b, a, bias, A), beta, sp, g)


def kda_gates(z, b, bias, A, dh: int, lb):
    """`kda.gates`: (g [T, H, dh], beta [T, H]) of z [T, H * dh] and b [T, H] in one launch, or None."""
    dev = z.dev
    zr = z.raw
    if not _on(b, dev) or zr.ndim != 2 or b.raw.ndim != 2 or not _served(zr, b.raw):
        return None
    T, C = zr.shape
    H = b.shape[1]
    if b.shape[0] != T or H * dh != C:
        return None
    params = _vectors(dev, "kda_gates", (bias,), C), _vectors(dev, "kda_gates", (A,), H)   # (ssm_a: [H] or [H, 1])
    if any(p is None or p[0] is None for p in params):
        return None
    params = [p[0] for p in params]
    xp = dev.xp
    g, beta = xp.empty((T, H, dh), dtype=np.float32), xp.empty((T, H), dtype=np.float32)
    kda_gates_raw(_nv(zr), _nv(b.raw), _nv(params[0]), _nv(params[1]), dh, lb, _nv(g), _nv(beta), stream=_stream())
    return _done(dev, "kda_gates", (z, b, bias, A), g, beta)


def rms_norm_gated(x, w, eps: float, gate, act: str):
    """`norm.rms_norm_gated`: rms_norm(x, w, eps) * act(gate) in one launch for rows of at most WARP_ROW_MAX_D, or
    None."""
    if not _on(gate, x.dev) or gate.shape != x.shape or act not in GATE_ACTS or x.raw.ndim < 1 \
            or x.shape[-1] > WARP_ROW_MAX_D or gate.raw.dtype != np.float32:
        return None
    g2 = gate.raw.reshape(-1, x.shape[-1])                # (a view where the axes allow it, else CuPy's copy)
    return _rows(x, "rms_norm_gated", (w,), lambda x2, wv, y, st: rms_norm_raw(x2, wv, eps, y, stream=st,
                                                                             gate2=_nv(g2), act=act))


def l2_norm(x, eps: float):
    """`delta_rule.l2_norm`: rms_norm(x, None, eps / D) * (1 / sqrt(D)) in one launch, or None."""
    D = x.shape[-1] if x.raw.ndim else 0
    post = np.float32(1.0 / np.sqrt(D)) if D else 1.0
    return _rows(x, "l2_norm", (), lambda x2, y, st: rms_norm_raw(x2, None, eps / D, y, stream=st, post=post))


def add_rms_norm(x, a, w, eps: float):
    """`ops.add_rms_norm`: (x + a, rms_norm(x + a, w, eps)) in one launch, or None (shapes differ, not float32)."""
    if not _on(a, x.dev) or a.shape != x.shape or x.raw.ndim < 1 or not _served(x.raw, a.raw):
        return None
    return _add_norm(x, a.raw.reshape(-1, x.shape[-1]), 1, None, w, eps, "add_rms_norm", (x, a, w))


def add_slots_rms_norm(x, slots, extra, w, eps: float):
    """`ops.add_slots_rms_norm`: (x + f, rms_norm(x + f, w, eps)), f = slots [T, A, D] summed over A in order (+
    extra [T, D]), in one launch (`_addend`), or None (shapes differ, not float32 and contiguous)."""
    if not _on(slots, x.dev) or (extra is not None and not _on(extra, x.dev)) or x.raw.ndim != 2 \
            or slots.raw.ndim != 3:
        return None
    T, D = x.shape
    A = slots.shape[1]
    if slots.shape != (T, A, D) or (extra is not None and extra.shape != (T, D)) \
            or not _served(x.raw, slots.raw, *(() if extra is None else (extra.raw,))):
        return None
    return _add_norm(x, slots.raw.reshape(T * A, D), A, None if extra is None else extra.raw, w, eps,
                     "add_slots_rms_norm", (x, slots, extra, w))


def _add_norm(x, a2, A: int, e2, w, eps: float, op: str, args):
    """(s, rms_norm(s, w, eps)) with s = x + the addend (`_addend`: a2 [R * A, D]'s rows summed A at a time, then +
    e2 [R, D] or None), x [..., D] of R rows, in one launch; None when w is not D float32 numbers."""
    D = x.shape[-1]
    wv = _vectors(x.dev, op, (w,), D)
    if wv is None:
        return None
    xp = x.dev.xp
    s_, y = xp.empty_like(x.raw), xp.empty_like(x.raw)
    rms_norm_raw(_nv(x.raw.reshape(-1, D)), _nv(wv[0]), eps, _nv(y.reshape(-1, D)), stream=_stream(), a2=_nv(a2),
                 s2=_nv(s_.reshape(-1, D)), A=A, e2=_nv(e2))
    return _done(x.dev, op, args, s_, y)


def layer_norm(x, w, b, eps: float):
    return _rows(x, "layer_norm", (w, b), lambda x2, wv, bv, y, st: layer_norm_raw(x2, wv, bv, eps, y, stream=st))


def softmax(x):
    return _rows(x, "softmax", (), lambda x2, y, st: softmax_raw(x2, y, stream=st))


def _unary(x, op, fn):
    raw = x.raw
    if not _served(raw):
        return None
    out = x.dev.xp.empty_like(raw)
    fn(_nv(raw.reshape(-1)), _nv(out.reshape(-1)), stream=_stream())
    return _done(x.dev, op, (x,), out)


def silu(x):
    return _unary(x, "silu", silu_raw)


def sigmoid(x):
    return _unary(x, "sigmoid", sigmoid_raw)


def softplus(x):
    return _unary(x, "softplus", softplus_raw)


def _on(v, dev) -> bool:
    """v is a DeviceArray of dev (its `dev` and `raw`: refengine.devarray imports this module, not the reverse)."""
    return getattr(v, "dev", None) is dev and hasattr(v, "raw")


def _same_dev(dev, *a) -> bool:
    """Every array a DeviceArray of dev in float32 (None allowed: an absent state)."""
    return all(v is None or (_on(v, dev) and v.raw.dtype == np.float32
                             and v.raw.size > 0) for v in a)


def delta_rule(q, k, v, g, beta, S, scale):
    """(o [T, H, V], S [H, K, V]) as `delta_rule.recurrent`, or None (another dtype, an input off the device)."""
    dev = q.dev
    if not _same_dev(dev, q, k, v, g, beta, S) or q.raw.ndim != 3 or g.raw.ndim not in (2, 3):
        return None
    T, H, K = q.shape
    V = v.shape[2]
    if k.shape != (T, H, K) or v.shape[:2] != (T, H) or beta.shape != (T, H) or g.shape[:2] != (T, H) \
            or (g.raw.ndim == 3 and g.shape[2] != K) or (S is not None and S.shape != (H, K, V)) \
            or K > 32 * DR_ROWS:
        return None
    xp = dev.xp
    per_key = g.raw.ndim == 3
    g3 = g.raw if per_key else g.raw.reshape(T, H, 1)
    o, S_out = xp.empty((T, H, V), dtype=np.float32), xp.empty((H, K, V), dtype=np.float32)
    delta_rule_raw(_nv(q.raw), _nv(k.raw), _nv(v.raw), _nv(g3), per_key, _nv(beta.raw),
                   None if S is None else _nv(S.raw), float(scale), _nv(o), _nv(S_out), stream=_stream())
    return _done(dev, "delta_rule", (q, k, v, g, beta, S), o, S_out)


def pool_at(all_kv, all_score, b, ratio: int, c: int, K: int):
    """`kv_compressor.pool_blocks_at`: blocks b [n] (device ints) pooled from a fixed-shape run's rows [S, c*K] ->
    [n, K] float32, one launch where the NumPy statement takes ~12; or None."""
    dev = all_kv.dev
    if not _same_dev(dev, all_kv, all_score) or not _on(b, dev) or b.raw.dtype != np.int64 or b.raw.ndim != 1 \
            or all_kv.raw.ndim != 2 or all_kv.shape != all_score.shape or all_kv.shape[1] != c * K \
            or c not in (1, 2) or not _served(all_kv.raw, all_score.raw):
        return None
    out = dev.xp.empty((b.shape[0], K), dtype=np.float32)
    pool_at_raw(_nv(all_kv.raw), _nv(all_score.raw), _nv(b.raw), ratio, c, K, _nv(out), stream=_stream())
    return _done(dev, "pool_at", (all_kv, all_score, b), out)


def causal_conv(x, w, tail, then_silu=False):
    """(y [T, C], new tail [Kc-1, C]) as `short_conv.causal_conv` (then_silu: y's silu in the same launch), or
    None."""
    dev = x.dev
    if not _same_dev(dev, x, tail) or x.raw.ndim != 2:
        return None
    wr = dev.unwrap(w, "causal_conv weight")
    T, C = x.shape
    if getattr(wr, "ndim", 0) != 2 or wr.shape[0] != C or wr.dtype != np.float32 or wr.shape[1] < 1 or \
            (tail is not None and tail.shape != (wr.shape[1] - 1, C)):
        return None
    xp = dev.xp
    y, new_tail = xp.empty((T, C), dtype=np.float32), xp.empty((wr.shape[1] - 1, C), dtype=np.float32)
    causal_conv_raw(_nv(x.raw), _nv(wr), None if tail is None else _nv(tail.raw), _nv(y), _nv(new_tail),
                    stream=_stream(), then_silu=then_silu)
    return _done(dev, "causal_conv", (x, w, tail), y, new_tail)


def _second_ok(x2, T: int, K: int) -> bool:
    """A pair entry's second array (k beside q): absent, or [T, H2, K] like the first's rows."""
    return x2 is None or (x2.raw.ndim == 3 and x2.shape[0] == T and x2.shape[2] == K)


def _rope_entry(x, cos, sin, n_rot: int, neox: bool, tail: bool, inverse: bool, op: str, x2=None):
    """x [T, H, K] with n_rot dims rotated by cos / sin [T, n_rot/2] (the first ones; tail: the last ones; inverse:
    by -theta), the rest copied -> [T, H, K] float32; with x2 [T, H2, K] the pair (one launch); or None."""
    dev = x.dev
    if not _same_dev(dev, x, cos, sin, x2) or x.raw.ndim != 3 or cos.raw.ndim != 2:
        return None
    T, H, K = x.shape
    if cos.shape != (T, n_rot // 2) or sin.shape != cos.shape or n_rot > K or n_rot % 2:
        return None
    if not _second_ok(x2, T, K):
        return None
    y = dev.xp.empty((T, H, K), dtype=np.float32)
    y2 = None if x2 is None else dev.xp.empty(x2.shape, dtype=np.float32)
    rope_raw(_nv(x.raw), _nv(cos.raw), _nv(sin.raw), int(n_rot), neox, _nv(y), stream=_stream(),
             off=K - n_rot if tail else 0, inverse=inverse, x2=_nv(None if x2 is None else x2.raw), y2=_nv(y2))
    if x2 is None:
        return _done(dev, op, (x, cos, sin), y)
    return _done(dev, op, (x, cos, sin, x2), y, y2)


def apply_rope(x, cos, sin, n_rot: int, mode: int, x2=None):
    """`rope.apply_rope` (mode 0 NORM, 2 NEOX) -> [T, H, K] float32; with x2 the pair (`rope.apply_rope_qk`) ->
    ([T, H, K], [T, H2, K]); or None."""
    return None if mode not in (0, 2) else _rope_entry(x, cos, sin, n_rot, mode == 2, False, False, "rope", x2)


def norm_rope(x, w, eps: float, cos, sin, n_rot: int, mode: int, x2=None, w2=None):
    """`rope.rms_norm_rope`: x [T, H, K] (a strided view too) normed over K (by w [K] or None) and its first n_rot
    dims rotated (mode 0 NORM, 2 NEOX) -> [T, H, K] float32; with x2 [T, H2, K] (by w2) the same in that launch
    (`rope.rms_norm_rope_qk`) -> ([T, H, K], [T, H2, K]); or None."""
    dev = x.dev
    if mode not in (0, 2) or not _same_dev(dev, x, cos, sin, x2) or x.raw.ndim != 3 or cos.raw.ndim != 2:
        return None
    T, H, K = x.shape
    if K > NR_K or cos.shape != (T, n_rot // 2) or sin.shape != cos.shape or n_rot > K or n_rot % 2 \
            or not (cos.raw.flags.c_contiguous and sin.raw.flags.c_contiguous):
        return None
    if not _second_ok(x2, T, K):
        return None
    wv = _vectors(dev, "norm_rope", (w, w2), K)
    if wv is None:
        return None
    y = dev.xp.empty((T, H, K), dtype=np.float32)
    y2 = None if x2 is None else dev.xp.empty(x2.shape, dtype=np.float32)
    norm_rope_raw(_nv(x.raw), _nv(wv[0]), eps, _nv(cos.raw), _nv(sin.raw), n_rot, mode == 2, _nv(y),
                  stream=_stream(), x2=None if x2 is None else _nv(x2.raw), w2=_nv(wv[1]), y2=_nv(y2))
    if x2 is None:
        return _done(dev, "norm_rope", (x, w, cos, sin), y)
    return _done(dev, "norm_rope", (x, w, cos, sin, x2, w2), y, y2)


def _ticket(dev):
    """The device's int32 [1] zero that a launch's last block takes its turn from (`_norm_rope_append`): made once,
    kept on the device (an eager step makes it before a capture; every launch leaves it 0)."""
    if dev.ticket is None:
        dev.ticket = dev.xp.zeros(1, dtype=np.int32)
    return dev.ticket


def rope_append(q, k, v, cos, sin, n_rot: int, mode: int, kbuf, kcount, vbuf, vcount, norms=None, eps: float = 0.0):
    """`gqa.rope_append`'s one launch: q [T, H, K] rotated -> [T, H, K] (first normed by wq where norms = (wq, wk),
    each [K] or None); k [T, H2, K] the same (by wk) into kbuf [capacity, H2, K] at the device count kcount [1]
    int64, v [T, H2, V] into vbuf at vcount, both counts advanced by T; or None (nothing written) for what it does
    not take."""
    norm = norms is not None
    wq, wk = norms if norm else (None, None)
    dev = q.dev
    if mode not in (0, 2) or not _same_dev(dev, q, k, v, cos, sin, kbuf, vbuf) or q.raw.ndim != 3 \
            or cos.raw.ndim != 2 or not (_on(kcount, dev) and _on(vcount, dev)):
        return None
    T, H, K = q.shape
    if K > NR_K or cos.shape != (T, n_rot // 2) or sin.shape != cos.shape or n_rot > K or n_rot % 2 \
            or not (cos.raw.flags.c_contiguous and sin.raw.flags.c_contiguous) or not _second_ok(k, T, K) \
            or v.raw.ndim != 3 or v.shape[:2] != k.shape[:2]:
        return None
    kb, vb, kc, vc = kbuf.raw, vbuf.raw, kcount.raw, vcount.raw
    if kb.shape[1:] != k.shape[1:] or vb.shape[1:] != v.shape[1:] or not (kb.flags.c_contiguous and
                                                                           vb.flags.c_contiguous) \
            or any(c.dtype != np.int64 or c.shape != (1,) for c in (kc, vc)):
        return None
    wv = _vectors(dev, "rope_append", (wq, wk), K)
    if wv is None:
        return None
    y = dev.xp.empty((T, H, K), dtype=np.float32)
    norm_rope_append_raw(_nv(q.raw), _nv(wv[0]), eps, _nv(cos.raw), _nv(sin.raw), n_rot, mode == 2, _nv(y),
                         _nv(k.raw), _nv(wv[1]), _nv(v.raw), _nv(kb), _nv(kc), _nv(vb), _nv(vc), _nv(_ticket(dev)),
                         stream=_stream(), norm=norm)
    res = dev.wrap(y)
    dev.note("fused rope_append", (q, k, v, cos, sin, kbuf, kcount, vbuf, vcount, wq, wk), (res, kbuf, kcount, vbuf,
                                                                                         vcount))
    return res


def rope_tail(x, cos, sin, n_rot: int, inverse: bool, x2=None):
    """`rope_tail.rotate_tail`: the last n_rot dims of x [T, H, K] rotated in NORM pairs (by -theta: inverse), the
    rest copied -> [T, H, K] float32; with x2 [T, H2, K] the pair in one launch; or None."""
    return _rope_entry(x, cos, sin, n_rot, False, True, bool(inverse), "rope_tail", x2)


ATTN_MAX_T = 8                      # queries: more (a prefill) take PREFILL_ATTENTION's form
ATTN_MAX_SCRATCH = 1 << 26          # scores held at once (T * H * S float32)
# A prefill's gathered attention (more than ATTN_MAX_T queries) where the device multiplies activations in the
# library (an eager run): "batched" leaves it to `mha.attention_gathered`'s NumPy form, each block of queries' keys
# gathered once and multiplied by all the query heads of a key head in one batched product (cuBLAS), in blocks of
# mha.GATHER_ELEMS_DEVICE numbers (a few launches a layer); "fused" takes `_attention`, a block per (query, head),
# which reads the query's gathered keys and values once per head: DeepSeek-V4 (64 heads over one key head of 512,
# 640 keys a query at ratio 4) 64 times the bytes. A device's own choice (Device.gathered_prefill, from
# KernelPolicy.gathered_prefill) comes first. A capture's products (Device.products "kernel") keep the fused form.
GATHERED_PREFILL = "batched"


# A prefill's dense attention (causal or no mask, more than ATTN_MAX_T queries) on a resident GPU run: "rows" takes
# `_attention_rows` (a warp per query and head, online softmax, one launch); "batched" leaves it to
# `mha.attention_blocked`'s NumPy form on CuPy (query blocks, batched products: ~15 launches and host work a block);
# "auto" takes "rows" for heads of at most ROWS_MAX_K dims and "batched" for wider ones. Measured (session 34, H100,
# prefill-512): rows 22.8 / 20.5 ms against batched 26.7 / 36.1 for llama-3-8b / qwen3-30b-a3b (K = 128). Not
# measured for MLA's absorbed heads (K = 576, V = 512: two value passes, each computing the scores; DeepSeek-V3's 128
# heads ~150 warp instructions a (query, key) pair, where cuBLAS's batched products are ~1.5 ms a layer), so they
# keep the batched form until a lease times them. A device's own choice (Device.prefill_attention, from
# KernelPolicy.prefill_attention) comes first.
PREFILL_ATTENTION = "auto"
ROWS_MAX_K = 256


def takes_causal(T: int, dev, K: int) -> bool:
    """Whether `attention_causal` (a fused kernel) takes T queries of K dims on the device dev (its
    `prefill_attention`)."""
    choice = getattr(dev, "prefill_attention", None) or PREFILL_ATTENTION
    return T <= ATTN_MAX_T or choice == "rows" or (choice == "auto" and K <= ROWS_MAX_K)


def takes_gathered(T: int, dev) -> bool:
    """Whether `attention_gathered` (the fused kernel) takes T queries on the device dev (its `products`:
    "library" / "kernel", its `gathered_prefill`)."""
    choice = getattr(dev, "gathered_prefill", None) or GATHERED_PREFILL
    return T <= ATTN_MAX_T or dev.products == "kernel" or choice == "fused"


def attention_causal(q, k, v, q_pos, kq_scale: float, causal: bool):
    """`mha.attention_blocked` under `causal_mask` (causal) or `no_mask` -> [T, H, V] float32, or None: at most
    ATTN_MAX_T queries (a decode step) `_attention`, a block per (query, head); more (a prefill) `_attention_rows`
    where `takes_causal` says so."""
    dev = q.dev
    if not _same_dev(dev, q, k, v) or not _on(q_pos, dev) \
            or q_pos.raw.dtype.kind not in "iu" or q.raw.ndim != 3 or k.raw.ndim != 3 or v.raw.ndim != 3:
        return None
    T, H, K = q.shape
    S, Hkv = k.shape[0], k.shape[1]
    if not takes_causal(T, dev, K) or S == 0 or k.shape[2] != K or v.shape[:2] != (S, Hkv) or H % Hkv \
            or q_pos.shape != (T,):
        return None
    xp = dev.xp
    if T > ATTN_MAX_T:
        out = xp.empty((T, H, v.shape[2]), dtype=np.float32)
        attention_rows_raw(_nv(q.raw), _nv(k.raw), _nv(v.raw), _nv(xp.ascontiguousarray(q_pos.raw)),
                           float(kq_scale), bool(causal), _nv(out), stream=_stream())
        return _done(dev, "attention (rows)", (q, k, v, q_pos), out)
    if T * H * S > ATTN_MAX_SCRATCH:
        return None
    p, out = xp.empty((T * H, S), dtype=np.float32), xp.empty((T, H, v.shape[2]), dtype=np.float32)
    attention_raw(_nv(q.raw), _nv(k.raw), _nv(v.raw), _nv(xp.ascontiguousarray(q_pos.raw)), float(kq_scale),
                  bool(causal), _nv(p), _nv(out), stream=_stream())
    return _done(dev, "attention", (q, k, v, q_pos), out)


def hc_gates(m, scale, base, n: int, iters: int, eps: float):
    """`hyper_connections.gates`: m [T, (2 + n) * n] -> (pre [T, n], post [T, n], comb [T, n, n]) float32, or
    None."""
    dev = m.dev
    if not _same_dev(dev, m) or m.raw.ndim != 2 or not 0 < n <= HC_MAX or m.shape[1] != (2 + n) * n \
            or not m.raw.flags.c_contiguous or iters < 1:
        return None
    sv, bv = _vectors(dev, "hc_gates", (scale,), 3), _vectors(dev, "hc_gates", (base,), m.shape[1])
    if sv is None or bv is None or sv[0] is None or bv[0] is None:
        return None
    T, xp = m.shape[0], dev.xp
    pre, post, comb = xp.empty((T, n), np.float32), xp.empty((T, n), np.float32), xp.empty((T, n, n), np.float32)
    hc_gates_raw(_nv(m.raw), _nv(sv[0]), _nv(bv[0]), int(iters), eps, _nv(pre), _nv(post), _nv(comb),
                 stream=_stream())
    return _done(dev, "hc_gates", (m, scale, base), pre, post, comb)


def collapse(X, pre):
    """`hyper_connections.collapse`: X [T, n, D], pre [T, n] -> [T, D], or None."""
    dev = X.dev
    if not _same_dev(dev, X, pre) or X.raw.ndim != 3 or pre.shape != X.shape[:2]:
        return None
    out = dev.xp.empty((X.shape[0], X.shape[2]), dtype=np.float32)
    collapse_raw(_nv(X.raw), _nv(pre.raw), _nv(out), stream=_stream())
    return _done(dev, "collapse", (X, pre), out)


def hc_post(y, X, post, comb):
    """`hyper_connections.hc_post`: y [T, D], X [T, n, D], post [T, n], comb [T, n, n] -> [T, n, D], or None."""
    dev = X.dev
    if not _same_dev(dev, y, X, post, comb) or X.raw.ndim != 3:
        return None
    T, n, D = X.shape
    if y.shape != (T, D) or post.shape != (T, n) or comb.shape != (T, n, n):
        return None
    out = dev.xp.empty((T, n, D), dtype=np.float32)
    hc_post_raw(_nv(y.raw), _nv(X.raw), _nv(post.raw), _nv(comb.raw), _nv(out), stream=_stream())
    return _done(dev, "hc_post", (y, X, post, comb), out)


def gated_mean(xn, g):
    """`gated_streams.gated_mean`: xn, g [T, P, D] -> [T, D] in one launch, or None."""
    dev = xn.dev
    if not _same_dev(dev, xn, g) or xn.raw.ndim != 3 or g.shape != xn.shape:
        return None
    T, P, D = xn.shape
    y = dev.xp.empty((T, D), dtype=np.float32)
    gated_mean_raw(_nv(xn.raw), _nv(g.raw), np.float32(1.0 / P), _nv(y), stream=_stream())
    return _done(dev, "gated_mean", (xn, g), y)


def streams_combine(R, out, inj):
    """`gated_streams.combine`: R [T, P, D], out [T, D], inj [T, P] -> [T, P, D] in one launch, or None."""
    dev = R.dev
    if not _same_dev(dev, R, out, inj) or R.raw.ndim != 3:
        return None
    T, P, D = R.shape
    if out.shape != (T, D) or inj.shape != (T, P):
        return None
    Rn = dev.xp.empty((T, P, D), dtype=np.float32)
    streams_combine_raw(_nv(R.raw), _nv(out.raw), _nv(inj.raw), np.float32(1.0 / P), _nv(Rn), stream=_stream())
    return _done(dev, "streams_combine", (R, out, inj), Rn)


def top_k(x, k: int):
    """`router.topk_desc`: ids [T, min(k, E)] int32 of the k largest per row, or None."""
    raw = x.raw
    if raw.ndim != 2 or raw.dtype != np.float32 or not 0 < raw.shape[1] <= TOPK_E or not 0 < k <= TOPK_MAX \
            or raw.shape[0] == 0:
        return None
    k = min(k, raw.shape[1])
    ids = x.dev.xp.empty((raw.shape[0], k), dtype=np.int32)
    top_k_raw(_nv(raw), k, _nv(ids), stream=_stream())
    return _done(x.dev, "top_k", (x,), ids)


def route_softmax(logits, k: int, norm_w: bool, scale):
    """`router.route` with softmax gating, no selection bias, no groups: (probs [T, E], ids [T, k] int32, weights
    [T, k]) in one launch, or None."""
    raw = logits.raw
    if raw.ndim != 2 or not _served(raw) or not 0 < raw.shape[1] <= TOPK_E or not 0 < k <= min(TOPK_MAX, raw.shape[1]):
        return None
    xp = logits.dev.xp
    T = raw.shape[0]
    probs, ids, out = xp.empty_like(raw), xp.empty((T, k), np.int32), xp.empty((T, k), np.float32)
    route_softmax_raw(_nv(raw), k, norm_w, scale, _nv(probs), _nv(ids), _nv(out), stream=_stream())
    return _done(logits.dev, "route_softmax", (logits,), probs, ids, out)


def route_sigmoid(logits, k: int, bias, norm_w: bool, scale, n_groups: int = 0, n_used: int = 0):
    """`router.route` with sigmoid gating, a selection bias [E] or None: (probs [T, E], the selection [T, E] (probs +
    bias; probs itself without one), ids [T, k] int32, weights [T, k]) in one launch, or None; with n_groups > 1
    (group routing) also (masked [T, E], the chosen groups [T, n_used] int32) after them."""
    raw = logits.raw
    if raw.ndim != 2 or not _served(raw) or not 0 < raw.shape[1] <= TOPK_E or not 0 < k <= min(TOPK_MAX, raw.shape[1]):
        return None
    E = raw.shape[1]
    grouped = n_groups > 1
    if grouped and (n_groups > GL_G or E % n_groups or E // n_groups < 2 or not 0 < n_used <= n_groups):
        return None
    dev = logits.dev
    bufs = _vectors(dev, "route_sigmoid", (bias,), raw.shape[1])
    if bufs is None:
        return None
    b = bufs[0]
    xp = dev.xp
    T = raw.shape[0]
    probs, ids, out = xp.empty_like(raw), xp.empty((T, k), np.int32), xp.empty((T, k), np.float32)
    sel = probs if b is None else xp.empty_like(raw)
    masked = xp.empty_like(raw) if grouped else None
    groups = xp.empty((T, n_used), np.int32) if grouped else None
    route_sigmoid_raw(_nv(raw), k, _nv(b), norm_w, scale, _nv(probs), _nv(sel), _nv(ids), _nv(out), stream=_stream(),
                      G=n_groups, n_used=n_used, masked=_nv(masked), groups=_nv(groups))
    return _done(dev, "route_sigmoid", (logits, bias), probs, sel, ids, out, *((masked, groups) if grouped else ()))


def ggml_top_k_rows(score, n, k: int, clean_stable: bool = False):
    """ops/top_k.py `ggml_top_k_rows` (the k-pool indexer's selection) in one launch, a thread a row: [T, k] int32,
    or None (n not a device int64 [1], k < 1)."""
    raw, nr = score.raw, getattr(n, "raw", None)
    if raw.ndim != 2 or raw.dtype != np.float32 or raw.shape[0] == 0 or k < 1 or nr is None \
            or nr.dtype != np.int64 or nr.shape != (1,):
        return None
    xp = score.dev.xp
    raw = xp.ascontiguousarray(raw)
    out = xp.empty((raw.shape[0], k), dtype=np.int32)
    ggml_top_k_rows_raw(_nv(raw), _nv(nr), int(k), _nv(out), stream=_stream(), clean_stable=clean_stable)
    return _done(score.dev, "ggml_top_k_rows", (score, n), out)


def group_limited(scores, n_groups: int, n_used: int):
    """`router.group_limited` in one launch: (masked [T, E] float32, the chosen groups [T, n_used] int32), or None
    for what it does not take (the caller's NumPy runs)."""
    raw = scores.raw
    if raw.ndim != 2 or not _served(raw) or not 0 < n_groups <= GL_G or raw.shape[1] % n_groups \
            or raw.shape[1] // n_groups < 2 or not 0 < n_used <= n_groups:
        return None
    xp = scores.dev.xp
    out = xp.empty_like(raw)
    groups = xp.empty((raw.shape[0], n_used), dtype=np.int32)
    group_limited_raw(_nv(raw), n_groups, n_used, _nv(out), _nv(groups), stream=_stream())
    return _done(scores.dev, "group_limited", (scores,), out, groups)


def _binary(gate, up, op, launch):
    """A gated activation of two same-shaped float32 device arrays, one launch (launch(g, u, y, stream))."""
    if not _on(up, gate.dev):
        return None
    g, u = gate.raw, up.raw
    if g.shape != u.shape or not _served(g, u):
        return None
    out = gate.dev.xp.empty_like(g)
    launch(_nv(g.reshape(-1)), _nv(u.reshape(-1)), _nv(out.reshape(-1)), _stream())
    return _done(gate.dev, op, (gate, up), out)


def attention_gathered(q, k, v, idx, live, kq_scale: float, sinks):
    """`mha.attention_gathered` (each query's n keys through idx / live; sinks [H] or None) -> [T, H, V] float32, or
    None. A decode step, a small ubatch, or a prefill where `takes_gathered` says so (GATHERED_PREFILL), in launches
    of at most ATTN_MAX_SCRATCH scores."""
    dev = q.dev
    if not _same_dev(dev, q, k, v) or not (_on(idx, dev) and _on(live, dev)) \
            or idx.raw.dtype.kind not in "iu" or live.raw.dtype != np.bool_ or q.raw.ndim != 3 \
            or not takes_gathered(q.shape[0], dev):
        return None
    T, H, K = q.shape
    S, Hkv = k.shape[0], k.shape[1]
    n = idx.shape[1] if idx.raw.ndim == 2 else -1
    if n <= 0 or H * n > ATTN_MAX_SCRATCH or idx.shape != (T, n) or live.shape != (T, n) \
            or k.shape[2] != K or v.shape[:2] != (S, Hkv) or H % Hkv:
        return None
    sr = None
    if sinks is not None:
        sr = dev.unwrap(sinks, "attention sinks")
        if getattr(sr, "shape", None) != (H,) or sr.dtype != np.float32:
            return None
    xp = dev.xp
    tb = min(T, ATTN_MAX_SCRATCH // (H * n))             # queries a launch
    p, out = xp.empty((tb * H, n), dtype=np.float32), xp.empty((T, H, v.shape[2]), dtype=np.float32)
    qr, ir, lr = q.raw, idx.raw, live.raw
    for t0 in range(0, T, tb):
        t1 = min(T, t0 + tb)
        attention_raw(_nv(qr[t0:t1]), _nv(k.raw), _nv(v.raw), _nv(ir[t0:t1, 0]), float(kq_scale), False,
                      _nv(p[:(t1 - t0) * H]), _nv(out[t0:t1]), idx=_nv(ir[t0:t1]), live=_nv(lr[t0:t1]),
                      sinks=_nv(sr), stream=_stream())    # (qpos idx[:, 0]: not read, the gathered form has no
    return _done(dev, "attention (gathered)", (q, k, v, idx, live), out)     # causal test)


def rope_cos_sin(positions, half: int, theta_scale, freq_factors, freq_scale, yarn, mscale):
    """`rope.rope_cos_sin`'s tables [T, half] for device positions (its host-side constants given: theta_scale,
    yarn = (keep, mix) or None, mscale), or None."""
    dev = positions.dev
    raw = positions.raw
    if raw.ndim != 1 or raw.dtype.kind not in "iuf" or raw.size == 0:
        return None
    consts = []
    for a in (freq_factors, *(yarn or (None, None))):
        ar = None
        if a is not None:
            ar = dev.unwrap(a, "rope constants")
            if getattr(ar, "shape", None) != (half,) or ar.dtype != np.float32:
                return None
        consts.append(ar)
    xp = dev.xp
    cos, sin = xp.empty((raw.shape[0], half), dtype=np.float32), xp.empty((raw.shape[0], half), dtype=np.float32)
    ff, keep, mix = consts
    rope_cos_sin_raw(_nv(raw), theta_scale, _nv(ff), freq_scale, _nv(keep), _nv(mix), mscale, _nv(cos), _nv(sin),
                     stream=_stream())
    return _done(dev, "rope_cos_sin", (positions,), cos, sin)


def swiglu(gate, up):
    return _binary(gate, up, "swiglu", lambda g, u, y, st: swiglu_raw(g, u, y, stream=st))


def situ(gate, up, beta: float, linear_beta: float):
    return _binary(gate, up, "situ", lambda g, u, y, st: situ_raw(g, u, beta, linear_beta, y, stream=st))


def swiglu_clamp(gate, up, limit: float):
    return _binary(gate, up, "swiglu_clamp", lambda g, u, y, st: swiglu_clamp_raw(g, u, limit, y, stream=st))


def all_finite_many(ys, page, cells) -> list:
    """page.flat[cell] = False for each device array y of ys (FLAG_BATCH at most) holding a NaN/inf, in one launch
    (page: a CuPy bool array filled with True, C-contiguous). Returns which arrays it took: one not float32 /
    contiguous, or empty, is not (the caller checks it another way)."""
    taken = [y.raw.dtype == np.float32 and y.raw.flags.c_contiguous and y.raw.size > 0 for y in ys]
    raws = [y.raw.reshape(-1) for y, t in zip(ys, taken) if t]
    if raws:
        all_finite_many_raw([_nv(r) for r in raws], _nv(page.reshape(-1)), [c for c, t in zip(cells, taken) if t],
                            stream=_stream())
    return taken


def _append_args(buf, x, count):
    """(buf [capacity, W], x [T, W], count) as the kernel takes them, or None. x may be a strided view (a column
    block of a stacked product: its rows' values contiguous or not, read by index)."""
    b, xr, c = buf.raw, x.raw, count.raw
    if b.dtype != np.float32 or xr.dtype != np.float32 or c.dtype != np.int64 or c.shape != (1,) \
            or not b.flags.c_contiguous or xr.ndim < 1 or xr.shape[1:] != b.shape[1:] or xr.size == 0:
        return None
    T = xr.shape[0]
    W = xr.size // T
    return b.reshape(b.shape[0], W), xr.reshape(T, W), c


def append_rows(buf, x, count, buf2=None, x2=None, count2=None) -> bool:
    """`cache.Rows.append`'s fixed-shape write on a GPU: x [T, ...] into buf [capacity, ...] at the device count
    count [1] int64, the count advanced by T; one launch (two above APPEND_ONE_BLOCK values) for the five of
    `buf[count + arange(T)] = x; count += T`; with buf2, x2, count2 a second cache's the same launch (`cache.
    append_rows`: k and v). False (nothing done) for what it does not take: the caller's NumPy."""
    one = _append_args(buf, x, count)
    two = None if buf2 is None else _append_args(buf2, x2, count2)
    if one is None or (buf2 is not None and two is None):
        return False
    b, xr, c = one
    if not append_rows_raw(_nv(b), _nv(xr), _nv(c), stream=_stream(),
                           second=None if two is None else tuple(_nv(a) for a in two)):
        for _, rows, cnt in (one,) if two is None else (one, two):     # (more than one block: the counts here)
            cnt += rows.shape[0]
    args, outs = (buf, x, count), (buf, count)
    if buf2 is not None:
        args, outs = args + (buf2, x2, count2), outs + (buf2, count2)
    buf.dev.note("fused append_rows", args, outs)
    return True


def expert_weights(probs, ids, norm_w: bool, scale):
    """`moe.router.expert_weights` (the gates whose weights are the selected probs) in one launch: weights [T, A]
    float32, or None for what it does not take."""
    p, i = probs.raw, ids.raw
    if p.ndim != 2 or i.ndim != 2 or p.shape[0] != i.shape[0] or not _served(p) or i.dtype != np.int32 \
            or not i.flags.c_contiguous or i.size == 0:
        return None
    out = probs.dev.xp.empty(i.shape, dtype=np.float32)
    expert_weights_raw(_nv(p), _nv(i), norm_w, scale, _nv(out), stream=_stream())
    return _done(probs.dev, "expert_weights", (probs, ids), out)
