"""Grouped expert dispatch: all routed experts of a layer in one launch per matrix.

Legend: T tokens, D model dim, E experts, A active experts per token, I expert hidden dim.

    pairs (t, a) sorted by expert ids[t, a]                       groups: one per routed expert
    act[t*A + a] = silu(x[t] @ gate_e.T * sg[e]) * (x[t] @ up_e.T * su[e])       one launch (GLU)
    dn[t*A + a]  = (act[t*A + a] @ down_e.T * sd[e]) * weights[t, a]            one launch
    out[t]       = dn[t*A + 0] + dn[t*A + 1] + ... (slot order, like ggml)       one launch

The intermediate `act` and `dn` stay on the device. With more than 8 tokens for some expert the
projections use the tiled GEMM (gate and up separately, then the activation). Same contract and
trace records as the loop oracle `refengine.moe.experts.moe_ffn` (llama.cpp: `build_moe_ffn`).
"""
from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, int32

from ..ref import QuantError
from .device import SIM, silu
from .gemv import GroupTable
from .ops import GEMM_SHAPE, auto_kernel, fast_ids_ok, grouped, grouped_ids, shared_split, supported
from .weights import DeviceWeight, device_weight

BN = GEMM_SHAPE["BN"]


# ------------------------------------------------------------------ groups
def groups_from_ids(ids: np.ndarray, E: int, bn: int = BN) -> tuple[np.ndarray, np.ndarray, int]:
    """Host: ids [T, A] -> (table with x row = token, table with x row = pair, max pairs of one group); tiles of bn
    pairs (the tiled kernels' BN: moe.BN for the engine's dispatch)."""
    T, A = ids.shape
    flat = ids.reshape(-1).astype(np.int64)
    order = np.argsort(flat, kind="stable")                  # pairs sorted by expert, then by (t, a)
    gexp, counts = np.unique(flat, return_counts=True)
    gmax = min(E, T * A)
    tab_x = GroupTable.build(gexp, counts, order // A, order, gmax, bn)
    tab_p = GroupTable.build(gexp, counts, order, order, gmax, bn)
    return tab_x, tab_p, int(counts.max())


SMAX_E = 1024           # experts the bucket kernel counts in shared memory (more: its global scratch)


@cuda.jit(device=True, inline=True)
def _bucket(ids, E, A, n, bn, tab_x, tab_p, cnt, fill, part):
    """The body of `bucket_kernel`; cnt / fill: int32 [E] in shared or global memory; part: int32 [3, 32]."""
    tid = cuda.threadIdx.x
    nth = cuda.blockDim.x
    gmax = min(E, n)
    q0 = 2 + 2 * gmax + 2 * n
    for e in range(tid, E, nth):
        cnt[e] = 0
    cuda.syncthreads()
    for i in range(tid, n, nth):
        cuda.atomic.add(cnt, ids[i], 1)
    cuda.syncthreads()
    # experts in 32 chunks: per chunk the pairs, groups and GEMM tiles it holds; then an exclusive scan
    ch = (E + 31) // 32
    if tid < 32:
        sp = 0
        sg = 0
        st = 0
        for e in range(tid * ch, min(E, tid * ch + ch)):
            c = cnt[e]
            sp += c
            if c > 0:
                sg += 1
                st += (c + bn - 1) // bn
        part[0, tid] = sp
        part[1, tid] = sg
        part[2, tid] = st
    cuda.syncthreads()
    if tid == 0:
        op = 0
        og = 0
        ot = 0
        for k in range(32):
            a, b, c = part[0, k], part[1, k], part[2, k]
            part[0, k] = op
            part[1, k] = og
            part[2, k] = ot
            op += a
            og += b
            ot += c
        tab_x[0] = og
        tab_x[q0] = ot
    cuda.syncthreads()
    if tid < 32:                                        # each chunk writes its groups and tiles
        off = part[0, tid]
        g = part[1, tid]
        nt = part[2, tid]
        for e in range(tid * ch, min(E, tid * ch + ch)):
            c = cnt[e]
            fill[e] = off
            if c > 0:
                tab_x[1 + g] = e
                tab_x[1 + gmax + g] = off
                for s0 in range(off, off + c, bn):
                    tab_x[q0 + 1 + 2 * nt] = g
                    tab_x[q0 + 2 + 2 * nt] = s0
                    nt += 1
                g += 1
                off += c
    cuda.syncthreads()
    G = tab_x[0]
    for k in range(G + tid, gmax + 1, nth):             # offsets past the last group: the pair count
        tab_x[1 + gmax + k] = n
    for i in range(tid, n, nth):
        pos = cuda.atomic.add(fill, ids[i], 1)
        tab_x[2 + 2 * gmax + pos] = i // A
        tab_x[2 + 2 * gmax + n + pos] = i
    cuda.syncthreads()
    size = 3 + 2 * gmax + 2 * n + 2 * (gmax + n // bn + 1)
    for i in range(tid, size, nth):
        tab_p[i] = tab_x[i]
    cuda.syncthreads()
    for i in range(tid, n, nth):
        tab_p[2 + 2 * gmax + i] = tab_x[2 + 2 * gmax + n + i]


@cuda.jit
def bucket_kernel(ids, E, A, n, bn, tab_x, tab_p, cnt, fill):
    """Device: ids [n = T*A] -> the two group tables (x row = token, x row = pair). One block.

    cnt, fill: int32 [E] global scratch, used only past SMAX_E experts (else shared memory). Groups in
    ascending expert order; within a group pairs arrive in any order (each pair's result does not depend
    on its place). Counting by atomics, then a two-level scan (32 chunks of experts). Grid 1, block 256.
    """
    scnt = cuda.shared.array(SMAX_E, int32)
    sfill = cuda.shared.array(SMAX_E, int32)
    part = cuda.shared.array((3, 32), int32)
    if E <= SMAX_E:
        _bucket(ids, E, A, n, bn, tab_x, tab_p, scnt, sfill, part)
    else:
        _bucket(ids, E, A, n, bn, tab_x, tab_p, cnt, fill, part)


# ------------------------------------------------------------------ elementwise stages
@cuda.jit
def swiglu_kernel(g, u, out, has_gate):
    """out = silu(g) * u, or silu(u) without a gate. Grid-stride over the [N, I] elements."""
    N, I = out.shape
    for i in range(cuda.grid(1), N * I, cuda.gridsize(1)):
        r = i // I
        c = i - r * I
        if has_gate:
            out[r, c] = silu(g[r, c]) * u[r, c]
        else:
            out[r, c] = silu(u[r, c])


@cuda.jit(device=True, inline=True)
def slot_sum(dn, A, res, has_res, t, d):
    """(res[t, d] +) dn[t*A, d] + dn[t*A + 1, d] + ... in slot order: one token's combined expert output."""
    s = dn[t * A, d]
    for a in range(1, A):
        s += dn[t * A + a, d]
    if has_res:
        s = res[t, d] + s
    return s


@cuda.jit
def combine_kernel(dn, A, res, has_res, out):
    """out[t, d] = `slot_sum` for every (t, d). Grid-stride over T*D."""
    T, D = out.shape
    for i in range(cuda.grid(1), T * D, cuda.gridsize(1)):
        t = i // D
        d = i - t * D
        out[t, d] = slot_sum(dn, A, res, has_res, t, d)


# threads per block of the elementwise kernels (the simulator runs one Python thread per CUDA thread)
EW = 32 if SIM else 256


def _grid(n: int, block: int = EW) -> int:
    return max(1, min(math.ceil(n / block), 4096))


# ------------------------------------------------------------------ device-level dispatch
def combine_slots(dn, A, res, out, combine, T, D, stream):
    if combine is not None:
        combine(dn, A, res, out)
    else:
        combine_kernel[_grid(T * D), EW, stream](dn, A, res if res is not None else out, res is not None, out)


def one_token_ok(up: DeviceWeight, gate: DeviceWeight | None, down: DeviceWeight, xd) -> bool:
    """True when `moe_ffn_device(..., ids=...)` can dispatch one token from its expert ids directly."""
    return (gate is not None and gate.type == up.type and fast_ids_ok(gate, xd)
            and fast_ids_ok(down, xd))


def moe_ffn_device(xd, tab_x, tab_p, gmax: int, n_pairs: int, max_per_group: int, A: int, wts, *,
                   up: DeviceWeight, gate: DeviceWeight | None, down: DeviceWeight, sc_gu, sc_d,
                   res=None, out=None, scratch=None, stream=0, kernel: str = "auto", mark=None, ids=None,
                   combine=None, summed: bool = True):
    """Device arrays in and out: xd [T, D], wts [T*A] routing weights, tables on the device.

    sc_gu: float32 [2E] (gate scales then up scales), sc_d: float32 [E]. Returns out [T, D].
    scratch: dict of reusable buffers (act [T*A, I], dn [T*A, D], and for the GEMM path g, u).
    ids: the expert ids (int32 [A]) of a single token: when the fast one-token kernel serves these
    weights, the tables are not read and each projection is one launch over the A slots (`grouped_ids`).
    combine: a callable (dn, A, res, out) that launches the combining step instead of `combine_kernel`
    (out = res + the A slots of dn per token; the engine fuses the next block's norm into it).
    summed=False: no combining step: returns dn [T*A, D], the weighted slots (a caller that sums them later).
    """
    T, D = xd.shape
    I = up.O
    s = scratch if scratch is not None else {}
    mark = mark or (lambda name: None)                    # profiling hook (stage names)

    def buf(name, shape):
        b = s.get(name)
        if b is None or b.shape != shape:
            b = s[name] = cuda.device_array(shape, dtype=np.float32, stream=stream)
        return b
    act = buf("act", (n_pairs, I))
    dn = buf("dn", (n_pairs, D))
    if out is None and summed:
        out = cuda.device_array((T, D), dtype=np.float32, stream=stream)
    if ids is not None:
        if not (T == 1 and kernel in ("auto", "fast") and one_token_ok(up, gate, down, xd)):
            raise QuantError("moe_ffn_device: expert ids given, but the one-token path does not serve "
                             f"{T} tokens / kernel {kernel!r} / these weights (see one_token_ok)")
        mark("experts_gate_up")
        grouped_ids(gate, xd, act, ids, A, sc=sc_gu, up=up, stream=stream)
        mark("experts_down")
        grouped_ids(down, act, dn, ids, A, sc=sc_d, rw=wts, slot_rows=True, stream=stream)
        if not summed:
            return dn
        mark("experts_combine")
        combine_slots(dn, A, res, out, combine, T, D, stream)
        return out
    k_gu = auto_kernel(gate or up, xd, gmax, n_pairs, max_per_group) if kernel == "auto" else kernel
    mark("experts_gate_up")
    if k_gu in ("gemv", "fast", "pairs") and gate is not None:         # gate and up in one launch
        grouped(gate, xd, act, tab_x, gmax, n_pairs, max_per_group, sc=sc_gu, up=up, stream=stream, kernel=kernel)
    else:
        E = up.E
        u = buf("u", (n_pairs, I))
        sp = shared_split(gate or up, xd, gmax, n_pairs, max_per_group, kernel, stream)   # (tcq: one split for both)
        grouped(up, xd, u, tab_x, gmax, n_pairs, max_per_group, sc=sc_gu[E:], kernel=kernel, stream=stream, split=sp)
        g = u
        if gate is not None:
            g = buf("g", (n_pairs, I))
            grouped(gate, xd, g, tab_x, gmax, n_pairs, max_per_group, sc=sc_gu, kernel=kernel, stream=stream,
                    split=sp)
        swiglu_kernel[_grid(n_pairs * I), EW, stream](g, u, act, gate is not None)
    mark("experts_down")
    grouped(down, act, dn, tab_p, gmax, n_pairs, max_per_group, sc=sc_d, rw=wts, kernel=kernel, stream=stream)
    if not summed:
        return dn
    mark("experts_combine")
    combine_slots(dn, A, res, out, combine, T, D, stream)
    return out


# ------------------------------------------------------------------ host API (the backend's moe_ffn)
def expert_scales(s, E):
    return np.ones(E, np.float32) if s is None else np.asarray(s, dtype=np.float32).reshape(E)


@functools.lru_cache(maxsize=32)
def _unit_scales(n: int):
    return cuda.to_device(np.ones(n, dtype=np.float32))          # read only by the kernels: shared safely


def device_scales(gate_scale, up_scale, down_scale, E: int):
    """(sc_gu float32 [2E]: gate scales then up scales, sc_d [E]) on the device, for `moe_ffn_device`; ones, uploaded
    once and reused, where the tensors have no `.scale` (most files): no host-to-device copy per call then."""
    if gate_scale is None and up_scale is None:
        sc_gu = _unit_scales(2 * E)
    else:
        sc_gu = cuda.to_device(np.concatenate([expert_scales(gate_scale, E), expert_scales(up_scale, E)]))
    sc_d = _unit_scales(E) if down_scale is None else cuda.to_device(expert_scales(down_scale, E))
    return sc_gu, sc_d


def moe_ffn(x: np.ndarray, ids: np.ndarray, weights: np.ndarray, *, up, gate, down, up_scale=None,
            gate_scale=None, down_scale=None, mode: str = "exact", record=None, il: int = -1,
            kernel: str = "auto", act=None, cache=None) -> np.ndarray:
    """x [T, D], ids / weights [T, A] -> [T, D]; `gate` may be None (then act = silu(up)).

    With `record` the intermediates are computed unfused and handed to it under the loop oracle's names.
    act: None (SwiGLU, fused on the device) or (fn(gate, up) -> act, trace name) for another gated activation
    (Kimi-K3's SiTU): the three projections still run as grouped dispatch kernels over the routed pairs, and
    the activation runs on the host between them with the loop oracle's own function.
    cache: a refengine.expert_cache.ExpertCache: the experts are read from its slot pool (expert_slots.py), ids
    remapped to slots, instead of uploaded into whole-tensor device copies (a traced resident run comes here).
    """
    if act is not None and gate is None:
        raise QuantError("moe_ffn: a gated activation needs the gate experts")
    if mode != "exact":
        raise QuantError(f"moe_ffn: mode {mode!r} is not implemented (available: exact)")
    for m in (up, gate, down):
        if m is not None and not supported(m):
            raise QuantError(f"moe_ffn: no CUDA decoder for {m.type.name} tensor {m.name!r}; use the numpy backend")
    x = np.ascontiguousarray(x, dtype=np.float32)
    ids = np.asarray(ids, dtype=np.int32)
    E = up.shape[0]
    if cache is None:
        used = np.unique(ids)
        dup = device_weight(up).ensure(used)
        dgate = device_weight(gate).ensure(used) if gate is not None else None
        ddown = device_weight(down).ensure(used)
        En = E
    else:                                # issue 24: the cache's slots (misses copied in), ids -> slot ids
        from .expert_slots import cached_experts
        ids, kw = cached_experts(cache, ids, dict(up=up, gate=gate, down=down, up_scale=up_scale,
                                                  gate_scale=gate_scale, down_scale=down_scale, il=il), host=False)
        dup, dgate, ddown = kw["up"], kw["gate"], kw["down"]
        up_scale, gate_scale, down_scale = kw["up_scale"], kw["gate_scale"], kw["down_scale"]
        En = cache.n_slots
    try:
        return _moe_ffn_dispatch(x, ids, weights, dup, dgate, ddown, up_scale, gate_scale, down_scale, E, En, record,
                                 il, kernel, act)
    finally:
        if cache is not None:
            cache.release()              # the batch's slots may be evicted again (copies queue after its kernels)


def _moe_ffn_dispatch(x, ids, weights, dup, dgate, ddown, up_scale, gate_scale, down_scale, E, En, record, il,
                      kernel, act):
    """moe_ffn on device weights (whole tensors, E experts, or a slot pool's views, En slots: ids are then slot
    ids; the group tables keep gmax = min(E, T*A), so the kernel choice is the resident run's)."""
    T, D = x.shape
    A = ids.shape[1]
    tab_x, tab_p, mpg = groups_from_ids(ids, E)
    gmax = min(E, T * A)
    n = T * A
    xd = cuda.to_device(x)
    tx, tp = cuda.to_device(tab_x), cuda.to_device(tab_p)
    sc_gu, sc_d = device_scales(gate_scale, up_scale, down_scale, En)
    wts = cuda.to_device(np.ascontiguousarray(weights, dtype=np.float32).reshape(-1))
    if record is None and act is None:
        idd = cuda.to_device(ids.reshape(-1)) if T == 1 and kernel in ("auto", "fast") and \
            one_token_ok(dup, dgate, ddown, xd) else None
        return moe_ffn_device(xd, tx, tp, gmax, n, mpg, A, wts, up=dup, gate=dgate, down=ddown, sc_gu=sc_gu,
                              sc_d=sc_d, kernel=kernel, ids=idd).copy_to_host()
    # traced or another activation: every intermediate of the loop oracle, computed by the same kernels, unfused
    record = record or (lambda *a: None)
    I = dup.O
    u = cuda.device_array((n, I), np.float32)
    sp = shared_split(dgate or dup, xd, gmax, n, mpg, kernel)          # (tcq: one split for gate and up)
    grouped(dup, xd, u, tx, gmax, n, mpg, sc=sc_gu[En:], kernel=kernel, split=sp)
    # llama.cpp renames a scaled expert output `*_scaled` (build_moe_ffn), as the loop oracle does
    record("ffn_moe_up" + ("_scaled" if up_scale is not None else ""), il, u.copy_to_host().reshape(T, A, I))
    g = u
    if dgate is not None:
        g = cuda.device_array((n, I), np.float32)
        grouped(dgate, xd, g, tx, gmax, n, mpg, sc=sc_gu, kernel=kernel, split=sp)
        record("ffn_moe_gate" + ("_scaled" if gate_scale is not None else ""), il, g.copy_to_host().reshape(T, A, I))
    if act is not None:                                  # pair rows follow tab_x: the same [n, I] layout as
        fn, act_name = act                               # u and g, so the host activation is elementwise
        a_host = np.ascontiguousarray(fn(g.copy_to_host(), u.copy_to_host()), dtype=np.float32)
        record(act_name, il, a_host.reshape(T, A, I))
        act_d = cuda.to_device(a_host)
    else:
        act_d = cuda.device_array((n, I), np.float32)
        swiglu_kernel[_grid(n * I), EW](g, u, act_d, dgate is not None)
        record("ffn_moe_swiglu" if dgate is not None else "ffn_moe_silu", il, act_d.copy_to_host().reshape(T, A, I))
    dn = cuda.device_array((n, D), np.float32)
    grouped(ddown, act_d, dn, tp, gmax, n, mpg, sc=sc_d, kernel=kernel)
    down_out = dn.copy_to_host().reshape(T, A, D)
    record("ffn_moe_down" + ("_scaled" if down_scale is not None else ""), il, down_out)
    weighted = down_out * np.asarray(weights, dtype=np.float32)[:, :, None]
    record("ffn_moe_weighted", il, weighted)
    out = weighted[:, 0].copy()
    for a in range(1, A):
        out += weighted[:, a]
    return out
