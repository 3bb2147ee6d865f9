"""One-token GEMV on 8-bit integer dot products (`dp4a`), for the types listed in `CW`: same signature and
grid as `fast.fgemv1_kernel`, far fewer instructions per weight.

Why: the float kernels of `fast.py` spend about three instructions per weight (a byte to a float, the
offset, the multiply-add), and at one token that issue rate, not memory, is what bounds them. Here a
lane keeps its 32 activations as three planes of signed bytes and multiplies four weights at a time:

    x ~= m / 126 * (l0 + l1 / 254 + l2 / 254^2)       per run of the unit (8..32 columns), m = max |x|

l0 = rint(x * 126 / m) in [-126, 126], l1 and l2 the next two base-254 digits of the remainder, each in
[-127, 127]. Error per activation <= m * 0.5 / (126 * 254^2) = 6.2e-8 m (m: the largest of its run),
i.e. float32 rounding's order: the dot products stay within rel-RMS ~1e-7 of the float oracle, far inside
the kernels' tolerance (1e-5). The products of weight codes and digits are summed exactly in int32
(`dp4a`), then
    sum(q * x) ~= m / (126 * 254) * (float(254 c0 + c1) + c2 / 254)     c_l = sum(q * l_l)
which cannot overflow (|254 c0 + c1| <= 255 * 32 * 127 * 127 < 2^31).

The run maximum m is floored at 1e-36 (126 / m stays finite; the absolute resolution never goes below
~6e-44); a NaN or inf activation makes its rows NaN, as the float product would. Each lane digitises its own unit's activations (about ten instructions per activation, shared by the RW
rows of the warp): no extra launch, no quantised copy of x, nothing changes for the callers.

A type's code-word decoder `cw(raw, rf, p, base, c, qw, sa, sb, r, tb)` (loads: the float kernel's `ld`)
fills qw[r, j * RL/4 + i]: the signed byte codes of columns col(c, j) + 4i .. + 3 of run j, with the run's
weight = sa[r, j] * code + sb[r, j] (codes may carry a power of two, folded into sa).
"""
from __future__ import annotations

import functools

import numpy as np
from numba import cuda, float32, int32, uint32

from ..formats import GGMLType
from .device import SIM
from .fast import fgemv1_kernel
from .fast_specs import FSPECS
from .fast_units import LO4, k4_scales, q6_codes, q6_head, shift_sel
from .vec import dp4a, prmt

if SIM:
    def f_bits(f):
        return np.uint32(np.float32(f).view(np.uint32))
else:
    from numba.cuda import libdevice

    @cuda.jit(device=True, inline=True)
    def f_bits(f):
        return uint32(libdevice.float_as_int(f))

RND = 12582912.0                  # 1.5 * 2^23: v + RND rounds v to an integer, held in the low mantissa bits
INV254 = 1.0 / 254.0


@cuda.jit(device=True, inline=True)
def digits(v):
    """v (|v| <= 126.5) -> its three base-254 digits, each the low byte (two's complement) of a float's bits."""
    t0 = v + float32(RND)
    r1 = (v - (t0 - float32(RND))) * float32(254.0)
    t1 = r1 + float32(RND)
    r2 = r1 - (t1 - float32(RND))
    t2 = cuda.fma(r2, float32(254.0), float32(RND))
    return f_bits(t0), f_bits(t1), f_bits(t2)


@cuda.jit(device=True, inline=True)
def _pack(a, b, c, d):
    """The low bytes of four words, as one word."""
    return prmt(prmt(a, b, uint32(0x40)), prmt(c, d, uint32(0x40)), uint32(0x5410))


@functools.lru_cache(maxsize=None)
def x_helpers(t):
    """digitise(xv, xl, xk): a unit's float activations -> digit planes; idot(qw, sa, sb, xl, xk, xs): one
    decoded unit's code words against them (the 8-bit halves of `fast.fgemv1_kernel`, its x8)."""
    s = FSPECS[t]
    NR, RL, HASB = s.NR, s.RL, s.HASB
    NQ = RL // 4

    @cuda.jit(device=True, inline=True)
    def digitise(xv, xl, xk):
        """xv[0, :NV] (floats of one unit) -> xl[l, j*NQ + i] (digit planes, 4 per word), xk[j] (run scale)."""
        for j in range(NR):
            m = float32(1e-36)                          # floor: 126 / m stays finite (runs below it read as 0)
            z = float32(0.0)                            # NaN if the run holds a NaN or an inf (max drops NaN)
            for k in range(RL):
                m = max(m, abs(xv[0, j * RL + k]))
                z = cuda.fma(xv[0, j * RL + k], float32(0.0), z)
            inv = float32(126.0) / m
            xk[j] = cuda.fma(m, float32(1.0 / (126.0 * 254.0)), z)
            for i in range(NQ):
                a0, a1, a2 = digits(xv[0, j * RL + 4 * i] * inv)
                b0, b1, b2 = digits(xv[0, j * RL + 4 * i + 1] * inv)
                c0, c1, c2 = digits(xv[0, j * RL + 4 * i + 2] * inv)
                d0, d1, d2 = digits(xv[0, j * RL + 4 * i + 3] * inv)
                xl[0, j * NQ + i] = _pack(a0, b0, c0, d0)
                xl[1, j * NQ + i] = _pack(a1, b1, c1, d1)
                xl[2, j * NQ + i] = _pack(a2, b2, c2, d2)

    @cuda.jit(device=True, inline=True)
    def idot(qw, sa, sb, xl, xk, xs):
        """One decoded unit (qw, sa, sb row 0) against the digitised activations."""
        a = float32(0.0)
        for j in range(NR):
            c0 = int32(0)
            c1 = int32(0)
            c2 = int32(0)
            for i in range(NQ):
                w = qw[0, j * NQ + i]
                c0 = dp4a(w, xl[0, j * NQ + i], c0)
                c1 = dp4a(w, xl[1, j * NQ + i], c1)
                c2 = dp4a(w, xl[2, j * NQ + i], c2)
            f = cuda.fma(float32(c2), float32(INV254), float32(c0 * int32(254) + c1))
            a = cuda.fma(sa[0, j] * f, xk[j], a)
            if HASB:
                a = cuda.fma(sb[0, j], xs[0, j], a)
        return a
    return digitise, idot


# ------------------------------------------------------------------ code-word decoders (loads: fast_units.ld_*)
@cuda.jit(device=True, inline=True)
def cw_q4_k(raw, rf, p, base, c, qw, sa, sb, r, tb):
    k4_scales(raw, p, c, sa, sb, r)
    for t in range(4):
        w = raw[p, 4 + t]
        qw[r, t] = w & uint32(LO4)
        qw[r, 4 + t] = (w >> uint32(4)) & uint32(LO4)


@cuda.jit(device=True, inline=True)
def cw_q6_k(raw, rf, p, base, c, qw, sa, sb, r, tb):
    a0, a1, b0, b1, e0, e1 = q6_head(raw, p, base, c, sa, r, rf[p] * float32(0.25), True)  # codes: 4 (q - 32)
    for t in range(2):
        vA, vB, vC, vD = q6_codes(a0 if t == 0 else a1, b0 if t == 0 else b1, e0 if t == 0 else e1)
        qw[r, t] = (vA ^ uint32(0x20202020)) << uint32(2)
        qw[r, 2 + t] = (vB ^ uint32(0x20202020)) << uint32(2)
        qw[r, 4 + t] = (vC ^ uint32(0x20202020)) << uint32(2)
        qw[r, 6 + t] = (vD ^ uint32(0x20202020)) << uint32(2)


@cuda.jit(device=True, inline=True)
def cw_q8_0(raw, rf, p, base, c, qw, sa, sb, r, tb):
    sel = shift_sel(base, 0x5432)
    sa[r, 0] = rf[p]
    for t in range(8):
        qw[r, t] = prmt(raw[p, t], raw[p, t + 1], sel)


@cuda.jit(device=True, inline=True)
def cw_q4_0(raw, rf, p, base, c, qw, sa, sb, r, tb):
    sel = shift_sel(base, 0x5432)
    d = rf[p] * float32(0.0625)                          # codes are 16 (q - 8)
    sa[r, 0] = d
    sa[r, 1] = d
    for t in range(4):
        v = prmt(raw[p, t], raw[p, t + 1], sel)
        qw[r, t] = ((v & uint32(LO4)) ^ uint32(0x08080808)) << uint32(4)
        qw[r, 4 + t] = (v & uint32(0xF0F0F0F0)) ^ uint32(0x80808080)


T = GGMLType
CW = {T.Q4_K: cw_q4_k, T.Q6_K: cw_q6_k, T.Q8_0: cw_q8_0, T.Q4_0: cw_q4_0}


def igemv1_kernel(t, RW: int = 8, KS: int = 4, glu: bool = False, rwt: bool = False, P: int = 4, IDM: int = 0,
                  MR: int = 0, DB: bool = False):
    """`fast.fgemv1_kernel` (same arguments, grid and block) with 8-bit digit planes and dp4a products; a
    group of several pairs (IDM = 0) takes one pass per pair. MR: a register cap per thread (0: none);
    DB: pipelined loads (see `fast.fgemv1_kernel`)."""
    if t not in CW:
        raise KeyError(f"no 8-bit code-word decoder for {t.name}")
    digitise, idot = x_helpers(t)
    return fgemv1_kernel(t, RW, KS, glu, rwt, P, IDM, MR, (CW[t], digitise, idot), DB)


__all__ = ["CW", "igemv1_kernel"]
