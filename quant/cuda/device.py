"""Device helpers shared by every kernel: bit casts, unaligned 32-bit reads, float16 scales, warp sums.

Every helper has a plain-Python twin for the CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`), where device
functions run as Python and `libdevice` is not available; on the GPU the twin is never compiled.

Weights live on the device as one flat uint32 array per tensor (`w32`), the GGUF bytes unchanged and
padded by 16 bytes, so a 4-byte read at any byte offset is two aligned word loads and a funnel shift.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

SIM = bool(cuda.simulator_enabled) if hasattr(cuda, "simulator_enabled") else False
try:
    from numba.cuda import config as _cfg
    SIM = SIM or bool(getattr(_cfg, "ENABLE_CUDASIM", False))
except ImportError:                                        # pragma: no cover
    pass

MAGIC = 8388608.0            # 2^23: as_f32(0x4B000000 | q) == 2^23 + q exactly for 0 <= q < 2^23
MAGIC_BITS = 0x4B000000

if SIM:
    def as_f32(u):
        """uint32 bit pattern -> float32 (reinterpret, no conversion)."""
        return np.uint32(u).view(np.float32)

    def f16_to_f32(h):
        """IEEE half bit pattern (low 16 bits of h) -> float32."""
        return np.float32(np.uint16(int(h) & 0xFFFF).view(np.float16))

    def expf(x):
        return np.float32(math.exp(float(x))) if x > -88.0 else np.float32(0.0)
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True, inline=True)
    def as_f32(u):
        return libdevice.int_as_float(int32(u))


    @cuda.jit(device=True, inline=True)
    def expf(x):
        return libdevice.expf(x)


@cuda.jit(device=True, inline=True)
def _h2f(h):
    """IEEE half -> float32 by bit manipulation (normals, subnormals, zero, inf, NaN)."""
    h = uint32(h) & uint32(0xFFFF)
    sign = (h & uint32(0x8000)) << uint32(16)
    ex = (h >> uint32(10)) & uint32(0x1F)
    man = h & uint32(0x3FF)
    if ex == uint32(0x1F):                                   # inf / NaN
        return as_f32(sign | uint32(0x7F800000) | (man << uint32(13)))
    if ex == uint32(0):                                      # zero / subnormal: man * 2^-24
        v = float32(man) * float32(5.9604644775390625e-08)
        return -v if sign else v
    return as_f32(sign | ((ex + uint32(112)) << uint32(23)) | (man << uint32(13)))


if not SIM:
    f16_to_f32 = _h2f


@cuda.jit(device=True, inline=True)
def ld32(w32, base, o):
    """The 4 bytes at byte offset base + o (any alignment) as a little-endian uint32.

    Two aligned word loads and a funnel shift, without a branch (lanes of a warp differ in alignment).
    base: uint64; o: a small non-negative int. Unsigned offsets spare numba's negative-index fix-up."""
    off = base + uint64(o)
    i = off >> uint64(2)
    v = (uint64(w32[i + uint64(1)]) << uint64(32)) | uint64(w32[i])
    return uint32((v >> ((off & uint64(3)) << uint64(3))) & uint64(0xFFFFFFFF))


@cuda.jit(device=True, inline=True)
def ld32a(w32, base, o):
    """The 4 bytes at a byte offset known to be a multiple of 4."""
    return uint32(w32[(base + uint64(o)) >> uint64(2)])


@cuda.jit(device=True, inline=True)
def ld16(w32, base, o):
    """The 2 bytes at an even byte offset base + o, as uint32."""
    off = base + uint64(o)
    return (uint32(w32[off >> uint64(2)]) >> uint32((off & uint64(2)) << uint64(3))) & uint32(0xFFFF)


@cuda.jit(device=True, inline=True)
def ld8(w32, base, o):
    """The byte at base + o, as uint32."""
    off = base + uint64(o)
    return (uint32(w32[off >> uint64(2)]) >> uint32((off & uint64(3)) << uint64(3))) & uint32(0xFF)


@cuda.jit(device=True, inline=True)
def hf(w16, base, o):
    """The float16 at the even byte offset base + o, as float32 (hardware conversion)."""
    return float32(w16[(base + uint64(o)) >> uint64(1)])


@cuda.jit(device=True, inline=True)
def byte(u, k):
    """Byte k (0..3) of a uint32."""
    return (uint32(u) >> uint32(8 * k)) & uint32(0xFF)


@cuda.jit(device=True, inline=True)
def u2f(q):
    """Small unsigned int (< 2^23) -> float32 exactly, without the slow int->float conversion."""
    return as_f32(uint32(q) | uint32(MAGIC_BITS)) - float32(MAGIC)


@cuda.jit(device=True, inline=True)
def silu(x):
    """x / (1 + exp(-x)), as ggml's `ggml_silu_f32`."""
    return x / (float32(1.0) + expf(-x))


@cuda.jit(device=True, inline=True)
def warp_sum(v):
    """Sum of v over the 32 lanes of a warp (every lane gets the total). All 32 lanes must call it."""
    v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 16)
    v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 8)
    v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 4)
    v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 2)
    v += cuda.shfl_xor_sync(0xFFFFFFFF, v, 1)
    return v


@cuda.jit(device=True, inline=True)
def warp_max(v):
    """Maximum of v over the 32 lanes of a warp (every lane gets it)."""
    v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 16))
    v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 8))
    v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 4))
    v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 2))
    v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, 1))
    return v


def _max_nan(a, b):
    """The larger of a and b, NaN winning (np.max's order): `_block_max`'s step."""
    return b if b > a or b != b else a


max_nan = cuda.jit(device=True, inline=True)(_max_nan)


@cuda.jit(device=True, inline=True)
def warp_max_nan(v):
    """Maximum of v over the 32 lanes of a warp, NaN winning (every lane gets it)."""
    for o in (16, 8, 4, 2, 1):
        v = max_nan(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, o))
    return v


@cuda.jit(device=True, inline=True)
def warp_argmax(v, i):
    """(max of v, its index) over the warp; the lower index wins a tie."""
    for o in (16, 8, 4, 2, 1):
        ov = cuda.shfl_xor_sync(0xFFFFFFFF, v, o)
        oi = cuda.shfl_xor_sync(0xFFFFFFFF, i, o)
        if ov > v or (ov == v and oi < i):
            v = ov
            i = oi
    return v, i


def _before_desc(v, j, bv, bj, E):
    """Whether entry (v, j) comes before (bv, bj) in the stable descending order (NaN after every number, ties and
    NaNs in index order; np.argsort(-x, kind="stable")); j == E: no entry."""
    if j == E:
        return False
    if bj == E:
        return True
    vn = v != v
    bn = bv != bv
    if vn != bn:
        return bn
    if vn or v == bv:
        return j < bj
    return v > bv


before_desc = cuda.jit(device=True, inline=True)(_before_desc)


@cuda.jit(device=True, inline=True)
def warp_first_desc(v, j, E):
    """The warp's first entry (v, j) in `before_desc`'s order, every lane getting it (a strict order: every lane's
    butterfly ends on the same entry; entries of index E, none, come last)."""
    for o in (16, 8, 4, 2, 1):
        ov = cuda.shfl_xor_sync(0xFFFFFFFF, v, o)
        oj = cuda.shfl_xor_sync(0xFFFFFFFF, j, o)
        if before_desc(ov, oj, v, j, E):
            v = ov
            j = oj
    return v, j


@cuda.jit(device=True, inline=True)
def warp_first_desc_with(v, j, u, E):
    """`warp_first_desc` carrying a value u of each entry along: the warp's first (v, j) and that entry's u."""
    for o in (16, 8, 4, 2, 1):
        ov = cuda.shfl_xor_sync(0xFFFFFFFF, v, o)
        oj = cuda.shfl_xor_sync(0xFFFFFFFF, j, o)
        ou = cuda.shfl_xor_sync(0xFFFFFFFF, u, o)
        if before_desc(ov, oj, v, j, E):
            v = ov
            j = oj
            u = ou
    return v, j, u


def _top2_merge(a1, a2, b1, b2):
    """The two largest of {a1, a2, b1, b2}, given a1 >= a2 and b1 >= b2 (numbers: no NaN)."""
    if b1 > a1:
        return b1, max(a1, b2)
    return a1, max(a2, b1)


top2_merge = cuda.jit(device=True, inline=True)(_top2_merge)


@cuda.jit(device=True, inline=True)
def warp_top2(a1, a2, n):
    """Each lane's two largest (a1 >= a2) and count n merged over the warp: every lane gets the warp's two largest
    and the sum of the counts."""
    for o in (16, 8, 4, 2, 1):
        b1 = cuda.shfl_xor_sync(0xFFFFFFFF, a1, o)
        b2 = cuda.shfl_xor_sync(0xFFFFFFFF, a2, o)
        n += cuda.shfl_xor_sync(0xFFFFFFFF, n, o)
        a1, a2 = top2_merge(a1, a2, b1, b2)
    return a1, a2, n


if SIM:
    # The simulator has no warp shuffles: the 32 lanes (Python threads) meet at a barrier instead.
    import threading

    _warps: dict = {}
    _warps_lock = threading.Lock()

    class _Warp:
        def __init__(self):
            self.vals = [None] * 32
            self.out = None
            self.op = None
            self.meet = threading.Barrier(32, action=self._reduce)
            self.done = threading.Barrier(32)

        def _reduce(self):
            self.out = self.op(self.vals)

    def _warp_reduce(v, op):
        key = (cuda.blockIdx.x, cuda.blockIdx.y, cuda.blockIdx.z, cuda.threadIdx.y, cuda.threadIdx.z,
               cuda.threadIdx.x // 32)
        with _warps_lock:
            w = _warps.get(key)
            if w is None:
                w = _warps[key] = _Warp()
        w.op = op
        w.vals[cuda.threadIdx.x % 32] = v
        w.meet.wait()
        out = w.out
        w.done.wait()
        return out

    def _sum(vals):
        t = type(vals[0])(0)
        for x in vals:
            t = t + x
        return t

    def _argmax(vals):
        best = vals[0]
        for x in vals[1:]:
            if x[0] > best[0] or (x[0] == best[0] and x[1] < best[1]):
                best = x
        return best

    @cuda.jit(device=True)
    def warp_sum(v):  # noqa: F811
        return _warp_reduce(v, _sum)

    @cuda.jit(device=True)
    def warp_max(v):  # noqa: F811
        return _warp_reduce(v, max)

    @cuda.jit(device=True)
    def warp_argmax(v, i):  # noqa: F811
        return _warp_reduce((v, i), _argmax)

    def _max_nan_all(vals):
        m = vals[0]
        for x in vals[1:]:
            m = _max_nan(m, x)
        return m

    @cuda.jit(device=True)
    def warp_max_nan(v):  # noqa: F811
        return _warp_reduce(v, _max_nan_all)

    def _first_desc(vals):
        best = vals[0]
        for x in vals[1:]:
            if _before_desc(x[0], x[1], best[0], best[1], x[2]):
                best = x
        return best[0], best[1]

    @cuda.jit(device=True)
    def warp_first_desc(v, j, E):  # noqa: F811
        return _warp_reduce((v, j, E), _first_desc)

    def _first_desc_with(vals):
        best = vals[0]
        for x in vals[1:]:
            if _before_desc(x[0], x[1], best[0], best[1], x[3]):
                best = x
        return best[0], best[1], best[2]

    @cuda.jit(device=True)
    def warp_first_desc_with(v, j, u, E):  # noqa: F811
        return _warp_reduce((v, j, u, E), _first_desc_with)

    def _top2_all(vals):
        a1, a2, n = vals[0]
        for b1, b2, m in vals[1:]:
            a1, a2 = _top2_merge(a1, a2, b1, b2)
            n = n + m
        return a1, a2, n

    @cuda.jit(device=True)
    def warp_top2(a1, a2, n):  # noqa: F811
        return _warp_reduce((a1, a2, n), _top2_all)


@cuda.jit(device=True, inline=True)
def row_scale_exp(src, r, K, sm, tid, nth, top):
    """s such that row r of src [R, K] times 2^s has its largest |v| in [2^(top-1), 2^top) (0 for a row of zeros or
    one with NaN / inf): the block's nth threads reduce through sm [nth] (all of them must call it)."""
    m = float32(0.0)
    for i in range(tid, K, nth):
        m = max(m, abs(src[r, i]))
    sm[tid] = m
    cuda.syncthreads()
    step = nth // 2
    while step > 0:
        if tid < step:
            sm[tid] = max(sm[tid], sm[tid + step])
        cuda.syncthreads()
        step //= 2
    mx = sm[0]
    s = 0
    if mx > float32(0.0) and mx < float32(math.inf):
        _, ex = math.frexp(mx)
        s = top - int(ex)
    return s

