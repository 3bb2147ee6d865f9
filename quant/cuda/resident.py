"""Device arrays in, device arrays out: the cuda backend's entry points for a device-resident forward
(refengine.devarray, `Runtime(resident=True)`), on the same kernels as the host API.

    matmul_resident(x, w)              x [T, I] (a CuPy array) -> CuPy [T, O]
    matmul_heads_resident(x, w)        x [H, T, I], w [H, O, I] -> [H, T, O]: one grouped launch, heads as experts
    moe_ffn_resident(x, ids, weights, *, up, gate, down, ...)   x [T, D] CuPy, ids [T, A] -> CuPy [T, D]

Each returns None when its kernels do not serve the weight (a type without a decoder, another mode): the runtime
then runs the host API on the array read back, and counts the fallback. CuPy's arrays are handed to the kernels
through `__cuda_array_interface__` without a synchronisation (`sync=False`); every numba launch and copy goes on
CuPy's current stream (`_stream()`: the legacy default stream, CuPy's null stream, unless a caller made another one
current, e.g. refengine/cuda/graph_step.py capturing a decode step), so order is kept.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from ..ref import QTensor
from .gemv import GroupTable
from .moe import BN, EW, bucket_kernel, combine_slots, device_scales, groups_from_ids, moe_ffn_device, one_token_ok
from . import ops
from .dequant_gemm import dense_sgemm, heads_sgemm
from .hgemm import dense_h3, heads_h3
from .timing import graph_like
from .device import SIM
from .ops import aligned16, dense, fast_ids_ok, grouped, grouped_ids, supported
from .streams import current_stream, numba_view, upload
from .tcq import supported as tcq_supported
from .weights import device_weight


def _cp():
    import cupy
    return cupy


_stream = current_stream            # numba's handle on CuPy's current stream
_nb = numba_view                    # a numba view of a CuPy array (no copy, no stream synchronisation)


def _input(x):
    """x as a C-contiguous float32 CuPy array starting 16-byte aligned (the fast kernels' vector loads)."""
    cp = _cp()
    x = cp.ascontiguousarray(x, dtype=cp.float32)
    return x if aligned16(x) else x.copy()


def serves_matmul(w: QTensor, mode: str = "exact") -> bool:
    """Whether `matmul_resident` multiplies by w on the device (else it returns None: a host fallback)."""
    return mode == "exact" and w.ndim == 2 and supported(w)


def matmul_resident(x, w: QTensor, *, mode: str = "exact", kernel: str = "auto"):
    """y = x @ dequantize(w).T on the device; None when the kernels do not serve w (or the mode)."""
    if not serves_matmul(w, mode):
        return None
    cp = _cp()
    x = _input(x)
    y = cp.empty((x.shape[0], w.shape[0]), dtype=cp.float32)
    if _tcq16(kernel, w, x.shape[0]):
        dense(device_weight(w).ensure(), _nb(x), _nb(y), kernel="tcq", shape=ops.TCQ_DENSE_SHAPE, stream=_stream())
        return y
    if _sgemm(kernel, x.shape[0]):
        (dense_h3 if ops.PREFILL_GEMM == "h3" else dense_sgemm)(device_weight(w).ensure(), x, y, stream=_stream())
        return y
    dense(device_weight(w).ensure(), _nb(x), _nb(y), kernel=kernel, stream=_stream())
    return y


def _sgemm(kernel: str, T: int) -> bool:
    """A product of T tokens on cuBLAS after decoding the weight (`dequant_gemm`): kernel "sgemm", or "auto" from
    ops.SGEMM_MIN tokens (KernelPolicy.sgemm_min; 0: never) on a GPU, outside a graph capture and the eager step
    before one (`timing.graph_like`: CuPy refuses cuBLAS while a stream is captured, so a captured ubatch
    multiplies on the project's kernels, and so does the eager step of its token count)."""
    return kernel == "sgemm" or (kernel == "auto" and not SIM and 0 < ops.SGEMM_MIN <= T and not graph_like())


def _tcq16(kernel: str, w: QTensor, T: int) -> bool:
    """A product of T tokens on tcq's f16 kernel (`KernelPolicy.prefill_gemm = "tcq16"`): kernel "auto", T from
    ops.SGEMM_MIN, a weight it reads (Q4_K, I % 256 == 0); no cuBLAS, so in a graph capture as well."""
    return kernel == "auto" and ops.PREFILL_GEMM == "tcq16" and 0 < ops.SGEMM_MIN <= T and \
        tcq_supported(w.type, w.shape[-1])


@functools.lru_cache(maxsize=64)
def _head_groups(H: int, T: int):
    """Row h*T + t goes to "expert" h (the head): the grouped dispatch tables of a per-head product."""
    ids = np.repeat(np.arange(H, dtype=np.int32), T)[:, None]                 # [H*T, 1]
    tab_x, _, mpg = groups_from_ids(ids, H)
    return upload(tab_x), mpg


def serves_heads(w: QTensor, mode: str = "exact") -> bool:
    """Whether `matmul_heads_resident` takes w (a 3-D weight, its heads as one grouped launch)."""
    return mode == "exact" and w.ndim == 3 and supported(w)


def matmul_heads_resident(x, w: QTensor, *, mode: str = "exact", kernel: str = "auto"):
    """Per-head products in one launch: x [H, T, I], w [H, O, I] -> [H, T, O]; None as matmul_resident."""
    if not serves_heads(w, mode) or x.shape[0] != w.shape[0]:
        return None
    cp = _cp()
    H, T, I = x.shape
    O = w.shape[1]
    if _sgemm(kernel, T):
        y = cp.empty((H, T, O), dtype=cp.float32)
        (heads_h3 if ops.PREFILL_GEMM == "h3" else heads_sgemm)(device_weight(w).ensure(), _input(x), y,
                                                                 stream=_stream())
        return y
    xs = _input(x.reshape(H * T, I))
    y = cp.empty((H * T, O), dtype=cp.float32)
    tab, mpg = _head_groups(H, T)
    grouped(device_weight(w).ensure(), _nb(xs), _nb(y), tab, H, H * T, mpg, kernel=kernel, stream=_stream())
    return y.reshape(H, T, O)


def moe_ffn_resident(x, ids, weights, *, up, gate, down, up_scale=None, gate_scale=None,
                     down_scale=None, mode: str = "exact", kernel: str = "auto", act=None, act_device=None,
                     il: int = -1, cache=None, read_ids=None, slots: bool = False, **_):
    """Routed experts on device arrays: x [T, D], weights [T, A] (CuPy), ids [T, A] -> CuPy [T, D]. ids on the host
    (the grouping tables are built there), or a CuPy array: one token's, which the one-token kernels read on the
    device (no table, no synchronisation: a decode step that can be captured); several tokens' (a fixed-shape
    run's), grouped by a kernel on the device (`_ids_on_device`); with a cache read back by read_ids(ids)
    (the runtime's counted read; None: ids.get()). Without a cache every expert is resident (uploaded on first use);
    with `cache` (refengine.expert_cache.ExpertCache, issue 24) the experts live in its slot pool (expert_slots.py): ids
    remapped to slot ids, the same kernels on the same bytes. slots: the weighted slots [T, A, D] returned unsummed
    (their sum in slot order is the output: the caller's next norm makes it, `ops.add_slots_rms_norm`).

    act / act_device: another gated activation than SwiGLU (Kimi-K3's SiTU, DeepSeek-V4's clamped SwiGLU): the
    gate and up projections run as grouped launches over the routed pairs, act_device(g, u) computes the activation
    on the device (the caller's readable function on device arrays), then the down projection. None (the return):
    exact mode only, types with a decoder only, a gated activation without act_device."""
    if mode != "exact" or any(m is not None and not supported(m) for m in (up, gate, down)) or \
            (act is not None and (act_device is None or gate is None)):
        return None
    T, A = ids.shape
    E = up.shape[0]                  # the model's experts: gmax = min(E, T*A) below, with or without the cache
    if not isinstance(ids, np.ndarray):
        y = None if cache is not None else _ids_on_device(x, ids, weights, up, gate, down, up_scale, gate_scale,
                                                          down_scale, kernel, act_device if act is not None else None,
                                                          slots)
        if y is not None:
            return y
        ids = read_ids(ids) if read_ids is not None else ids.get()
    ids = np.asarray(ids, dtype=np.int32)
    if cache is None:
        dup = device_weight(up).ensure()
        dgate = device_weight(gate).ensure() if gate is not None else None
        ddown = device_weight(down).ensure()
        En = E
    else:                            # issue 24: ids -> slot ids, the tensors -> the slot pool's (misses copied in)
        from .expert_slots import cached_experts
        ids, kw = cached_experts(cache, ids, dict(up=up, gate=gate, down=down, up_scale=up_scale,
                                                  gate_scale=gate_scale, down_scale=down_scale, il=il), host=False)
        dup, dgate, ddown = kw["up"], kw["gate"], kw["down"]
        up_scale, gate_scale, down_scale = kw["up_scale"], kw["gate_scale"], kw["down_scale"]
        En = cache.n_slots
    tab_x, tab_p, mpg = groups_from_ids(ids, E)
    xs = _input(x)
    xd = _nb(xs)
    st = _stream()
    sc_gu, sc_d = device_scales(gate_scale, up_scale, down_scale, En)
    idd = cuda.to_device(ids.reshape(-1), stream=st) if act is None and T == 1 and kernel in ("auto", "fast") and \
        one_token_ok(dup, dgate, ddown, xd) else None
    out = _grouped_experts(xd, cuda.to_device(tab_x, stream=st), cuda.to_device(tab_p, stream=st), mpg, T, A, E,
                           weights, dup, dgate, ddown, sc_gu, sc_d, En, kernel, act_device if act is not None else None,
                           idd, slots)
    if cache is not None:
        cache.release()              # queued: a later copy into these slots runs after the kernels (same stream)
    return out


def _grouped_experts(xd, tx, tp, mpg: int, T: int, A: int, E: int, weights, dup, dgate, ddown, sc_gu, sc_d, En: int,
                     kernel, act_device=None, idd=None, slots: bool = False):
    """The routed experts over group tables on the device (tx: x row = token, tp: x row = pair; at most mpg pairs a
    group) -> out [T, D]: SwiGLU through `moe_ffn_device` (idd: one token's ids, when the one-token kernels serve
    them, instead of the tables); a gated activation of the arch's own (act_device) as grouped gate and up launches
    (pair rows in tx order), act_device(g, u) on the device, then the grouped down projection. E: the model's
    experts (the tables' group bound min(E, T*A)); En: the matrices (E, or an expert cache's slots: sc_gu holds gate
    then up scales, En each). slots: the weighted slots [T, A, D] instead, not combined."""
    cp = _cp()
    st = _stream()
    n, I, D = T * A, dup.O, xd.shape[1]
    gmax = min(E, n)
    wts = cp.ascontiguousarray(weights, dtype=cp.float32).reshape(-1)
    out = None if slots else cp.empty((T, D), dtype=cp.float32)
    if act_device is not None:
        u, g = cp.empty((n, I), dtype=cp.float32), cp.empty((n, I), dtype=cp.float32)
        sp = ops.shared_split(dgate, xd, gmax, n, mpg, kernel, st)               # (tcq: one split for gate and up)
        grouped(dup, xd, _nb(u), tx, gmax, n, mpg, sc=sc_gu[En:], kernel=kernel, stream=st, split=sp)
        grouped(dgate, xd, _nb(g), tx, gmax, n, mpg, sc=sc_gu, kernel=kernel, stream=st, split=sp)
        a = _input(act_device(g, u))                                                        # [n, I], elementwise
        dn = cp.empty((n, D), dtype=cp.float32)
        grouped(ddown, _nb(a), _nb(dn), tp, gmax, n, mpg, sc=sc_d, rw=_nb(wts), kernel=kernel, stream=st)
        if slots:
            return dn.reshape(T, A, D)
        combine_slots(_nb(dn), A, None, _nb(out), None, T, D, st)
        return out
    dn = cp.empty((n, D), dtype=cp.float32)
    moe_ffn_device(xd, tx, tp, gmax, n, mpg, A, _nb(wts), up=dup, gate=dgate, down=ddown, sc_gu=sc_gu, sc_d=sc_d,
                   kernel=kernel, ids=idd, out=None if slots else _nb(out), stream=st, scratch=_scratch(n, I, dn),
                   summed=not slots)
    return dn.reshape(T, A, D) if slots else out


def _scratch(n: int, I: int, dn) -> dict:
    """moe_ffn_device's work buffers act [n, I] and dn [n, D] (given) from CuPy's allocator, not numba's: the memory a
    captured step's launches use then stays in the capturing pool (refengine/cuda/graph_step.py) instead of being
    freed by numba behind the graph's back (the GEMM path's g, u: many tokens, never captured, numba's)."""
    cp = _cp()
    return {"act": _nb(cp.empty((n, I), dtype=cp.float32)), "dn": _nb(dn)}


def _ids_on_device(x, ids, weights, up, gate, down, up_scale, gate_scale, down_scale, kernel, act_device=None,
                   slots: bool = False):
    """Routed experts with their ids [T, A] read on the device, nothing read back. One token: the one-token kernels
    take its A ids (`moe_ffn_device(ids=...)`, or with act_device gate and up as one launch each over the A ids
    (`grouped_ids`), act_device(g, u) [A, I], the down projection over the A slots). Otherwise (several tokens, a
    fixed-shape run's ubatch; one token whose weights the one-token kernels do not serve) the group tables are built
    there (`bucket_kernel`): a token's A experts are distinct, so a group holds
    at most T pairs (the kernels' bound), and the pairs' order within a group (the kernel's atomics) changes no
    pair's result. None (the caller reads the ids back): one token, a gated activation of its own, weights the fast
    kernels do not serve."""
    cp = _cp()
    T, A = ids.shape
    E = up.shape[0]
    dup = device_weight(up).ensure()
    dgate = device_weight(gate).ensure() if gate is not None else None
    ddown = device_weight(down).ensure()
    xs = _input(x)
    xd = _nb(xs)
    idd = _nb(cp.ascontiguousarray(ids.reshape(-1), dtype=cp.int32))
    sc_gu, sc_d = device_scales(gate_scale, up_scale, down_scale, E)
    one = T == 1 and kernel in ("auto", "fast") and one_token_ok(dup, dgate, ddown, xd) and \
        (act_device is None or fast_ids_ok(dup, xd))
    if not one:
        if T == 1 and act_device is not None:
            return None
        n, gmax = T * A, min(E, T * A)
        size = GroupTable.size(gmax, n, BN)
        tab_x, tab_p = cp.zeros(size, dtype=cp.int32), cp.zeros(size, dtype=cp.int32)
        cnt, fill = cp.zeros(E, dtype=cp.int32), cp.zeros(E, dtype=cp.int32)
        bucket_kernel[1, EW, _stream()](idd, E, A, n, BN, _nb(tab_x), _nb(tab_p), _nb(cnt), _nb(fill))
        return _grouped_experts(xd, _nb(tab_x), _nb(tab_p), T, T, A, E, weights, dup, dgate, ddown, sc_gu, sc_d, E,
                                kernel, act_device, slots=slots)
    if act_device is None:
        return _grouped_experts(xd, None, None, 1, 1, A, E, weights, dup, dgate, ddown, sc_gu, sc_d, E, kernel,
                                idd=idd, slots=slots)
    wts = cp.ascontiguousarray(weights, dtype=cp.float32).reshape(-1)
    I, D = up.shape[1], xs.shape[1]
    st = _stream()
    u, g = cp.empty((A, I), dtype=cp.float32), cp.empty((A, I), dtype=cp.float32)
    grouped_ids(dup, xd, _nb(u), idd, A, sc=sc_gu[E:], stream=st)                      # [A, I], slot a: expert ids[a]
    grouped_ids(dgate, xd, _nb(g), idd, A, sc=sc_gu, stream=st)
    a = _input(act_device(g, u))                                                        # [A, I], elementwise
    dn = cp.empty((A, D), dtype=cp.float32)
    grouped_ids(ddown, _nb(a), _nb(dn), idd, A, sc=sc_d, rw=_nb(wts), slot_rows=True, stream=st)
    if slots:
        return dn.reshape(1, A, D)
    out = cp.empty((1, D), dtype=cp.float32)
    combine_slots(_nb(dn), A, None, _nb(out), None, 1, D, st)
    return out