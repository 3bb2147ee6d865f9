"""Fast-GEMV decoders for more types (see `fast_units.py` for the unit / ld / dc protocol). Each type here is
an `FSpec` in `MORE`, which the registry `fast_specs.FSPECS` joins to `fast_units.BASE`; the kernels, host
dispatch, PTX check and tests pick it up from there.

    NVFP4           the doubled e2m1 values (as MXFP4) times 2^-15, made float16 by bit moves (no table), times
                    2^15 / 2 the UE4M3 sub-block scale
    F16, BF16       the exact float value of each weight in q, sa = 1
    F32             the same (16-weight units: a 32-weight unit would keep 32 words per row in flight)
    IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S   +-grid bytes (from `tb`) times the sub-block scale
    IQ1_S, IQ1_M    8 (grid + delta), an odd integer, times dl / 8

Units are 32 weights (a block, or a sub-block of the 64- and 256-weight types), except F32. Rows in flight
(PMAX, PGLU) are the most that keep every fast kernel free of local memory and spills (ptxas, sm_90), at
<= 128 registers for the one-token kernel: where eight rows' decodes make the row loop too long for LLVM to
unroll, the working arrays go to local memory, so PMAX = 4 even where the raw words would fit eight.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint32, uint64

from ..formats import GGMLType
from .device import MAGIC, SIM, as_f32, hf, u2f
from .decoders import ksigns
from .fast_units import FSpec, col_iq4_xs, col_one, jn, ldn, qf
from .vec import h2f, ld4u, prmt

# Two intrinsics beside those of `vec.py` (with simulator twins):
#   a, b = ld2u(tb, i)   tb[i], tb[i + 1] in one 64-bit load (ld.global.nc.v2.u32, the table is read-only; i even):
#                        an 8-byte grid entry in one request (a warp's grid gathers touch many cache lines)
#   f = b2f(u)           the low 16 bits of u as a bfloat16 -> float32 (cvt.f32.bf16): as `vec.h2f` for F16,
#                        where shifts made LLVM unroll the one-token GLU kernel's row loop (212 registers)
if SIM:
    def ld2u(a, i):
        f = a.reshape(-1)
        i = int(i)
        assert i % 2 == 0, "ld2u: unaligned index"
        return f[i], f[i + 1]

    def b2f(u):
        return np.uint32((int(u) & 0xFFFF) << 16).view(np.float32)
else:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    from .vec import elem_addr

    def _idx64(builder, signature, idx):
        i64 = ir.IntType(64)
        if idx.type.width < 64:
            idx = builder.sext(idx, i64) if signature.args[1].signed else builder.zext(idx, i64)
        return idx

    @intrinsic
    def ld2u(typingctx, a, i):
        if not isinstance(a, types.Array) or a.dtype != types.uint32 or not isinstance(i, types.Integer):
            return None
        sig = types.UniTuple(types.uint32, 2)(a, i)

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            text = "{ .reg .u64 g; cvta.to.global.u64 g, $2; ld.global.nc.v2.u32 {$0, $1}, [g]; }"
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32, i32]), [ir.IntType(64)]), text,
                               "=r,=r,l", side_effect=False)
            addr = elem_addr(context, builder, signature.args[0], args[0], _idx64(builder, signature, args[1]))
            res = builder.call(asm, [addr])
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(res, k) for k in range(2)])
        return sig, codegen

    @intrinsic
    def _b2f(typingctx, u):
        sig = types.float32(types.uint32)

        def codegen(context, builder, signature, args):
            h = builder.trunc(args[0], ir.IntType(16))
            asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [ir.IntType(16)]), "cvt.f32.bf16 $0, $1;", "=f,h",
                               side_effect=False)
            return builder.call(asm, [h])
        return sig, codegen

    @cuda.jit(device=True, inline=True)
    def b2f(u):
        return _b2f(uint32(u))


# ------------------------------------------------------------------ NVFP4: 36 B = d[4] UE4M3 | qs[32]   (64 weights)
# unit c (0..1) = sub-blocks 2c, 2c+1 = qs[16c ..+16] at 4 + 16c (4-byte aligned: 36-byte blocks, rows of
# whole blocks); sub-block s: low nibbles of qs[8s ..+8] -> columns 16s + 0..7, high -> 16s + 8..15.
# Run j = sub-block 2c + j (16 columns), w = ue4m3(d[2c + j]) / 2 * kvalues_mxfp4_doubled[nibble].
@cuda.jit(device=True, inline=True)
def col_nvfp4(c, j):
    return 32 * c + 16 * j


@cuda.jit(device=True, inline=True)
def ld_nvfp4(w32, w16, base, c, raw, rf, p):
    a = base >> uint64(2)
    o = a + uint64(1 + 4 * c)
    raw[p, 0] = w32[o]
    raw[p, 1] = w32[o + uint64(1)]
    raw[p, 2] = w32[o + uint64(2)]
    raw[p, 3] = w32[o + uint64(3)]
    raw[p, 4] = w32[a]


@cuda.jit(device=True, inline=True)
def ue4m3_half(x):
    """`ggml_ue4m3_to_fp32(x) / 2` without branches: E4M3 (bias 7) placed at float32 bits 20..26 is the
    same number times 2^-120, subnormals included; times 2^119. 0x7F (NaN in E4M3) reads as 0."""
    v = as_f32((x & uint32(0x7F)) << uint32(20)) * float32(2.0 ** 119)
    return float32(0.0) if x == uint32(0x7F) else v


@cuda.jit(device=True, inline=True)
def _e2m1_f16(b):
    """Four E2M1 nibbles s|e|e|m at bits 1..4 of each byte -> the high bytes of float16 numbers equal to their
    doubled values (kvalues_mxfp4) times 2^-15: e|e|m is already in place under the float16 exponent bias 15
    (e = 0: a subnormal, m 2^-15), the sign moves from bit 4 to bit 7 (adding 7 * 0x10 = 0x70; no carries)."""
    return b + (b & uint32(0x10101010)) * uint32(7)


@cuda.jit(device=True, inline=True)
def _f16x4(v, q, r, o):
    """q[r, o:o+4] = the float16 numbers whose high bytes are the bytes of v (low bytes zero), exactly."""
    a = prmt(v, uint32(0), uint32(0x1404))               # bytes 0, 1 under two zero bytes
    b = prmt(v, uint32(0), uint32(0x3424))               # bytes 2, 3
    q[r, o] = h2f(a)
    q[r, o + 1] = h2f(a >> uint32(16))
    q[r, o + 2] = h2f(b)
    q[r, o + 3] = h2f(b >> uint32(16))


@cuda.jit(device=True, inline=True)
def dc_nvfp4(raw, rf, p, base, c, q, sa, sb, r, tb):
    sw = raw[p, 4] >> uint32(16 * c)                     # the two scale bytes of this unit
    sa[r, 0] = ue4m3_half(sw & uint32(0xFF)) * float32(32768.0)            # q holds the values times 2^-15
    sa[r, 1] = ue4m3_half((sw >> uint32(8)) & uint32(0xFF)) * float32(32768.0)
    for j in range(2):
        for t in range(2):                               # word t of sub-block j: bytes 4t..4t+3
            w = raw[p, 2 * j + t]
            _f16x4(_e2m1_f16((w << uint32(1)) & uint32(0x1E1E1E1E)), q, r, 16 * j + 4 * t)        # low nibbles
            _f16x4(_e2m1_f16((w >> uint32(3)) & uint32(0x1E1E1E1E)), q, r, 16 * j + 8 + 4 * t)    # high


# ------------------------------------------------------------------ F16 / BF16: 32-weight pseudo-blocks of 64 B
# unit = block: 16 words in four 128-bit loads (rows of 2I bytes, I % 32 == 0: always 16-byte aligned);
# q = the weights themselves (exact), two runs of 16 with sa = 1.
@cuda.jit(device=True, inline=True)
def ld_f16(w32, w16, base, c, raw, rf, p):
    i = base >> uint64(2)
    for t in range(4):
        raw[p, 4 * t], raw[p, 4 * t + 1], raw[p, 4 * t + 2], raw[p, 4 * t + 3] = ld4u(w32, i + uint64(4 * t))


def _dc_half(cvt):
    """The decoder of a 16-bit float type: q = the 32 weights converted exactly by cvt (low 16 bits of a word)."""
    @cuda.jit(device=True, inline=True)
    def dc(raw, rf, p, base, c, q, sa, sb, r, tb):
        sa[r, 0] = float32(1.0)
        sa[r, 1] = float32(1.0)
        for t in range(16):
            w = raw[p, t]
            q[r, 2 * t] = cvt(w)
            q[r, 2 * t + 1] = cvt(w >> uint32(16))
    return dc


dc_f16 = _dc_half(h2f)
dc_bf16 = _dc_half(b2f)


# ------------------------------------------------------------------ F32: 32-weight pseudo-blocks of 128 B
# unit c (0..1) = columns 16c ..+16 = words 16c ..+16 of the block (four 128-bit loads); q = the weights.
@cuda.jit(device=True, inline=True)
def col_f32(c, j):
    return 16 * c


@cuda.jit(device=True, inline=True)
def ld_f32(w32, w16, base, c, raw, rf, p):
    i = (base >> uint64(2)) + uint64(16 * c)
    for t in range(4):
        raw[p, 4 * t], raw[p, 4 * t + 1], raw[p, 4 * t + 2], raw[p, 4 * t + 3] = ld4u(w32, i + uint64(4 * t))


@cuda.jit(device=True, inline=True)
def dc_f32(raw, rf, p, base, c, q, sa, sb, r, tb):
    sa[r, 0] = float32(1.0)
    for t in range(16):
        q[r, t] = as_f32(raw[p, t])


# ------------------------------------------------------------------ i-quant grids (256-weight blocks)
# unit c = sub-block c (32 weights, columns 32c + 16j + 0..15 for run j); a group l (8 weights, columns
# 8l ..+8 of the unit) is one grid entry of 8 bytes (two of 4 for IQ3) with 8 sign bits. A grid byte g
# with its sign becomes the byte 128 +- g (`_signed4`: four bytes at a time, by a per-byte mask), then the
# exact float by `qf`: no branch per weight. The grid words come from `tb` (global memory, read through the
# cache), the table the generic decoders read (`decoders.tables`); a unit issues all its grid loads first.
QOFF = MAGIC + 128.0


@cuda.jit(device=True, inline=True)
def _signed4(g, s):
    """Four grid bytes g (each < 128) with sign bits s (bit k set: byte k negative) -> bytes 128 +- g:
    g ^ 0x80 = 128 + g, g ^ 0x7F = 127 - g (then + 1), no carry between bytes."""
    t = ((s & uint32(15)) * uint32(0x00204081)) & uint32(0x01010101)        # bit k of s -> bit 0 of byte k
    return ((g ^ (t * uint32(0xFF))) ^ uint32(0x80808080)) + t


@cuda.jit(device=True, inline=True)
def _group8(q, r, l, g0, g1, s):
    """q[r, 8l .. 8l+8) = the 8 grid bytes g0 | g1 with sign bits s (bit k: weight k), as exact floats."""
    s = uint32(s)                                        # (`ksigns` gives 64 bits: keep the shifts 32-bit)
    v0 = _signed4(g0, s)
    v1 = _signed4(g1, s >> uint32(4))
    off = float32(QOFF)
    for k in range(4):
        q[r, 8 * l + k] = qf(v0, k, off)
        q[r, 8 * l + 4 + k] = qf(v1, k, off)


@cuda.jit(device=True, inline=True)
def _grid2(tb, gi):
    """Entry gi of a grid of 8 bytes per entry, as two words (one 64-bit load)."""
    return ld2u(tb, gi << uint32(1))


@cuda.jit(device=True, inline=True)
def _grid8x4(tb, i0, i1, i2, i3):
    """The four 8-byte grid entries of a unit, as eight words: all loads issued before any is used (ptxas
    keeps the source order: a load next to its use would wait out its latency once per group)."""
    a0, a1 = _grid2(tb, i0)
    b0, b1 = _grid2(tb, i1)
    c0, c1 = _grid2(tb, i2)
    d0, d1 = _grid2(tb, i3)
    return a0, a1, b0, b1, c0, c1, d0, d1


@cuda.jit(device=True, inline=True)
def _groups8(q, r, g, s0, s1, s2, s3):
    """The unit's four groups from `_grid8x4`'s words g and their sign bytes."""
    _group8(q, r, 0, g[0], g[1], s0)
    _group8(q, r, 1, g[2], g[3], s1)
    _group8(q, r, 2, g[4], g[5], s2)
    _group8(q, r, 3, g[6], g[7], s3)


@cuda.jit(device=True, inline=True)
def _wbyte(raw, p, k, off):
    """The byte at `off` of the aligned word raw[p, k] that holds it."""
    return (raw[p, k] >> uint32(8 * (off & uint64(3)))) & uint32(255)


@cuda.jit(device=True, inline=True)
def _ld1(w32, off, raw, p, k):
    """raw[p, k] = the aligned word holding byte `off`."""
    raw[p, k] = w32[off >> uint64(2)]


# IQ3_XXS (98 B): d | qs[64] (8 indices of 4-byte grid entries per sub-block) at 2 + 8c | u32 at 66 + 4c:
# 4 x 7 sign bits (`ksigns`) and a 4-bit scale at the top; w = d (0.5 + scale) / 2 * (+-grid byte).
@cuda.jit(device=True, inline=True)
def ld_iq3_xxs(w32, w16, base, c, raw, rf, p):
    ldn(w32, base + uint64(2 + 8 * c), raw, p, 0, 3)
    ldn(w32, base + uint64(66 + 4 * c), raw, p, 3, 2)
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def dc_iq3_xxs(raw, rf, p, base, c, q, sa, sb, r, tb):
    oq = base + uint64(2 + 8 * c)
    ga = jn(raw, p, 0, oq, 0)
    gb = jn(raw, p, 0, oq, 1)
    aux = jn(raw, p, 3, base + uint64(66 + 4 * c), 0)
    db = rf[p] * (float32(0.5) + u2f(aux >> uint32(28))) * float32(0.5)
    sa[r, 0] = db
    sa[r, 1] = db
    m = uint32(255)
    g = (uint32(tb[ga & m]), uint32(tb[(ga >> uint32(8)) & m]), uint32(tb[(ga >> uint32(16)) & m]),
         uint32(tb[ga >> uint32(24)]), uint32(tb[gb & m]), uint32(tb[(gb >> uint32(8)) & m]),
         uint32(tb[(gb >> uint32(16)) & m]), uint32(tb[gb >> uint32(24)]))
    _groups8(q, r, g, ksigns(aux), ksigns(aux >> uint32(7)), ksigns(aux >> uint32(14)), ksigns(aux >> uint32(21)))


# IQ2_XXS (66 B): d | per sub-block 8 bytes at 2 + 8c: 4 grid indices (8-byte entries), then a u32 of
# 4 x 7 sign bits and a 4-bit scale at the top; w = d (0.5 + scale) / 4 * (+-grid byte).
@cuda.jit(device=True, inline=True)
def ld_iq2_xxs(w32, w16, base, c, raw, rf, p):
    ldn(w32, base + uint64(2 + 8 * c), raw, p, 0, 3)
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def dc_iq2_xxs(raw, rf, p, base, c, q, sa, sb, r, tb):
    oq = base + uint64(2 + 8 * c)
    aux0 = jn(raw, p, 0, oq, 0)
    aux1 = jn(raw, p, 0, oq, 1)
    db = rf[p] * (float32(0.5) + u2f(aux1 >> uint32(28))) * float32(0.25)
    sa[r, 0] = db
    sa[r, 1] = db
    m = uint32(255)
    g = _grid8x4(tb, aux0 & m, (aux0 >> uint32(8)) & m, (aux0 >> uint32(16)) & m, aux0 >> uint32(24))
    _groups8(q, r, g, ksigns(aux1), ksigns(aux1 >> uint32(7)), ksigns(aux1 >> uint32(14)), ksigns(aux1 >> uint32(21)))


# IQ2_XS (74 B): d | qs u16[32] (9-bit index | 7 sign bits << 9), 4 per sub-block at 2 + 8c | scales[8] at
# 66: sub-block c's byte, low nibble for groups 0-1 (run 0), high for 2-3 (run 1); w = d (0.5 + s) / 4 * (+-g).
@cuda.jit(device=True, inline=True)
def ld_iq2_xs(w32, w16, base, c, raw, rf, p):
    ldn(w32, base + uint64(2 + 8 * c), raw, p, 0, 3)
    _ld1(w32, base + uint64(66 + c), raw, p, 3)
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def _iq2_scales(d, sc, sa, r):
    """Two 4-bit scales (low nibble: run 0, high: run 1) -> sa = d (0.5 + s) / 4."""
    sa[r, 0] = d * (float32(0.5) + u2f(sc & uint32(15))) * float32(0.25)
    sa[r, 1] = d * (float32(0.5) + u2f(sc >> uint32(4))) * float32(0.25)


@cuda.jit(device=True, inline=True)
def dc_iq2_xs(raw, rf, p, base, c, q, sa, sb, r, tb):
    oq = base + uint64(2 + 8 * c)
    _iq2_scales(rf[p], _wbyte(raw, p, 3, base + uint64(66 + c)), sa, r)
    w0 = jn(raw, p, 0, oq, 0)                           # u16 l = index | signs << 9
    w1 = jn(raw, p, 0, oq, 1)
    m = uint32(511)
    g = _grid8x4(tb, w0 & m, (w0 >> uint32(16)) & m, w1 & m, (w1 >> uint32(16)) & m)
    _groups8(q, r, g, ksigns(w0 >> uint32(9)), ksigns(w0 >> uint32(25)), ksigns(w1 >> uint32(9)),
             ksigns(w1 >> uint32(25)))


# IQ2_S (82 B): d | qs[32] index low bytes at 2 + 4c | signs[32] at 34 + 4c (8 bits per group) | qh[8] at 66
# (2 high index bits per group) | scales[8] at 74 (as IQ2_XS).
@cuda.jit(device=True, inline=True)
def ld_iq2_s(w32, w16, base, c, raw, rf, p):
    ldn(w32, base + uint64(2 + 4 * c), raw, p, 0, 2)
    ldn(w32, base + uint64(34 + 4 * c), raw, p, 2, 2)
    _ld1(w32, base + uint64(66 + c), raw, p, 4)
    _ld1(w32, base + uint64(74 + c), raw, p, 5)
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def dc_iq2_s(raw, rf, p, base, c, q, sa, sb, r, tb):
    _iq2_scales(rf[p], _wbyte(raw, p, 5, base + uint64(74 + c)), sa, r)
    qs = jn(raw, p, 0, base + uint64(2 + 4 * c), 0)
    sg = jn(raw, p, 2, base + uint64(34 + 4 * c), 0)
    qh = _wbyte(raw, p, 4, base + uint64(66 + c))
    m, mh = uint32(255), uint32(0x300)
    g = _grid8x4(tb, (qs & m) | ((qh << uint32(8)) & mh), ((qs >> uint32(8)) & m) | ((qh << uint32(6)) & mh),
                 ((qs >> uint32(16)) & m) | ((qh << uint32(4)) & mh), (qs >> uint32(24)) | ((qh << uint32(2)) & mh))
    _groups8(q, r, g, sg, sg >> uint32(8), sg >> uint32(16), sg >> uint32(24))


# IQ3_S (110 B): d | qs[64] index low bytes at 2 + 8c | qh[8] at 66 (9th index bit, one per 4-byte entry) |
# signs[32] at 74 + 4c | scales[4] at 106 (nibble c % 2 of byte c / 2); w = d (1 + 2 scale) * (+-grid byte).
@cuda.jit(device=True, inline=True)
def ld_iq3_s(w32, w16, base, c, raw, rf, p):
    ldn(w32, base + uint64(2 + 8 * c), raw, p, 0, 3)
    ldn(w32, base + uint64(74 + 4 * c), raw, p, 3, 2)
    _ld1(w32, base + uint64(66 + c), raw, p, 5)
    _ld1(w32, base + uint64(106 + (c >> 1)), raw, p, 6)
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def dc_iq3_s(raw, rf, p, base, c, q, sa, sb, r, tb):
    oq = base + uint64(2 + 8 * c)
    sc = (_wbyte(raw, p, 6, base + uint64(106 + (c >> 1))) >> uint32(4 * (c & 1))) & uint32(15)
    db = rf[p] * (float32(1.0) + float32(2.0) * u2f(sc))
    sa[r, 0] = db
    sa[r, 1] = db
    sg = jn(raw, p, 3, base + uint64(74 + 4 * c), 0)
    qh = _wbyte(raw, p, 5, base + uint64(66 + c))
    ga = jn(raw, p, 0, oq, 0)                           # index low bytes 0..3, then 4..7
    gb = jn(raw, p, 0, oq, 1)
    m, h = uint32(255), uint32(256)                      # entry e gets bit e of qh as its 9th bit
    g = (uint32(tb[(ga & m) | ((qh << uint32(8)) & h)]), uint32(tb[((ga >> uint32(8)) & m) | ((qh << uint32(7)) & h)]),
         uint32(tb[((ga >> uint32(16)) & m) | ((qh << uint32(6)) & h)]), uint32(tb[(ga >> uint32(24)) | ((qh << uint32(5)) & h)]),
         uint32(tb[(gb & m) | ((qh << uint32(4)) & h)]), uint32(tb[((gb >> uint32(8)) & m) | ((qh << uint32(3)) & h)]),
         uint32(tb[((gb >> uint32(16)) & m) | ((qh << uint32(2)) & h)]), uint32(tb[(gb >> uint32(24)) | ((qh << uint32(1)) & h)]))
    _groups8(q, r, g, sg, sg >> uint32(8), sg >> uint32(16), sg >> uint32(24))


# IQ1_S / IQ1_M: w = dl * (grid + delta), grid in {-1, 0, 1} (the table holds grid + 1 = t), delta = +-1/8:
# as an integer times dl / 8: 8 t - 8 +- 1, i.e. the byte 8 t under the exponent minus 7 or 9 (`qf`).
@cuda.jit(device=True, inline=True)
def _group1(q, r, l, g0, g1, neg):
    """q[r, 8l .. 8l+8) = 8 (grid + delta) for the grid entry g0 | g1 (delta < 0 where neg)."""
    off = float32(MAGIC + 9.0) if neg else float32(MAGIC + 7.0)
    a = g0 << uint32(3)                                  # t <= 2: 8 t stays within its byte
    b = g1 << uint32(3)
    for k in range(4):
        q[r, 8 * l + k] = qf(a, k, off)
        q[r, 8 * l + 4 + k] = qf(b, k, off)


# IQ1_S (50 B): d | qs[32] index low bytes at 2 + 4c | qh u16[8] at 34 + 2c: 3 high index bits per group,
# a 3-bit scale at bit 12, the delta sign at bit 15; dl = d (2 scale + 1).
@cuda.jit(device=True, inline=True)
def ld_iq1_s(w32, w16, base, c, raw, rf, p):
    ldn(w32, base + uint64(2 + 4 * c), raw, p, 0, 2)
    _ld1(w32, base + uint64(34 + 2 * c), raw, p, 2)
    rf[p] = hf(w16, base, 0)


@cuda.jit(device=True, inline=True)
def dc_iq1_s(raw, rf, p, base, c, q, sa, sb, r, tb):
    qs = jn(raw, p, 0, base + uint64(2 + 4 * c), 0)
    qh = (raw[p, 2] >> uint32(8 * ((base + uint64(34 + 2 * c)) & uint64(3)))) & uint32(0xFFFF)
    dl = rf[p] * (float32(2.0) * u2f((qh >> uint32(12)) & uint32(7)) + float32(1.0)) * float32(0.125)
    sa[r, 0] = dl
    sa[r, 1] = dl
    neg = (qh & uint32(0x8000)) != uint32(0)
    m, mh = uint32(255), uint32(0x700)                    # 3 high index bits of group l at bit 3l of qh
    g = _grid8x4(tb, (qs & m) | ((qh << uint32(8)) & mh), ((qs >> uint32(8)) & m) | ((qh << uint32(5)) & mh),
                 ((qs >> uint32(16)) & m) | ((qh << uint32(2)) & mh), (qs >> uint32(24)) | ((qh >> uint32(1)) & mh))
    _group1(q, r, 0, g[0], g[1], neg)
    _group1(q, r, 1, g[2], g[3], neg)
    _group1(q, r, 2, g[4], g[5], neg)
    _group1(q, r, 3, g[6], g[7], neg)


# IQ1_M (56 B, so blocks stay 4-byte aligned): qs[32] at 4c | qh[16] at 32 + 2c (per group a nibble: 3 high
# index bits, the delta sign at bit 3) | scales u16[4] at 48: 3-bit scales, sub-block c's two (run 0: groups
# 0-1, run 1: 2-3) at bit 6 (c % 2) of u16 c / 2; the block's f16 scale is the top nibbles of the four u16.
@cuda.jit(device=True, inline=True)
def ld_iq1_m(w32, w16, base, c, raw, rf, p):
    a = base >> uint64(2)
    raw[p, 0] = w32[a + uint64(c)]
    raw[p, 1] = w32[a + uint64(8 + (c >> 1))]
    raw[p, 2] = w32[a + uint64(12)]
    raw[p, 3] = w32[a + uint64(13)]


@cuda.jit(device=True, inline=True)
def dc_iq1_m(raw, rf, p, base, c, q, sa, sb, r, tb):
    sc0 = raw[p, 2]
    sc1 = raw[p, 3]
    bits = ((sc0 >> uint32(12)) & uint32(0xF)) | ((sc0 >> uint32(24)) & uint32(0xF0)) \
        | ((sc1 >> uint32(4)) & uint32(0xF00)) | ((sc1 >> uint32(16)) & uint32(0xF000))
    d = h2f(bits) * float32(0.125)
    scw = (sc0 if c < 4 else sc1) >> uint32(16 * ((c >> 1) & 1) + 6 * (c & 1))
    sa[r, 0] = d * (float32(2.0) * u2f(scw & uint32(7)) + float32(1.0))
    sa[r, 1] = d * (float32(2.0) * u2f((scw >> uint32(3)) & uint32(7)) + float32(1.0))
    qs = raw[p, 0]
    qh = raw[p, 1] >> uint32(16 * (c & 1))
    m, mh = uint32(255), uint32(0x700)                    # group l's nibble at bit 4l of qh: 3 index bits, sign
    g = _grid8x4(tb, (qs & m) | ((qh << uint32(8)) & mh), ((qs >> uint32(8)) & m) | ((qh << uint32(4)) & mh),
                 ((qs >> uint32(16)) & m) | (qh & mh), (qs >> uint32(24)) | ((qh >> uint32(4)) & mh))
    _group1(q, r, 0, g[0], g[1], (qh & uint32(0x8)) != uint32(0))
    _group1(q, r, 1, g[2], g[3], (qh & uint32(0x80)) != uint32(0))
    _group1(q, r, 2, g[4], g[5], (qh & uint32(0x800)) != uint32(0))
    _group1(q, r, 3, g[6], g[7], (qh & uint32(0x8000)) != uint32(0))


T = GGMLType
MORE: dict = {
    #                  type     BS  TS UPB NR  RL  HASB   ALIGN16 NW PMAX PGLU
    T.NVFP4: FSpec(T.NVFP4, 64, 36, 2, 2, 16, False, False, 5, 8, 4, ld_nvfp4, dc_nvfp4, col_nvfp4),
    T.F16: FSpec(T.F16, 32, 64, 1, 2, 16, False, True, 16, 4, 2, ld_f16, dc_f16, col_one),
    T.BF16: FSpec(T.BF16, 32, 64, 1, 2, 16, False, True, 16, 4, 2, ld_f16, dc_bf16, col_one),
    T.F32: FSpec(T.F32, 32, 128, 2, 1, 16, False, True, 16, 4, 2, ld_f32, dc_f32, col_f32),
    T.IQ3_XXS: FSpec(T.IQ3_XXS, 256, 98, 8, 2, 16, False, False, 5, 4, 2, ld_iq3_xxs, dc_iq3_xxs, col_iq4_xs),
    T.IQ2_XXS: FSpec(T.IQ2_XXS, 256, 66, 8, 2, 16, False, False, 3, 8, 4, ld_iq2_xxs, dc_iq2_xxs, col_iq4_xs),
    T.IQ2_XS: FSpec(T.IQ2_XS, 256, 74, 8, 2, 16, False, False, 4, 4, 2, ld_iq2_xs, dc_iq2_xs, col_iq4_xs),
    T.IQ2_S: FSpec(T.IQ2_S, 256, 82, 8, 2, 16, False, False, 6, 4, 2, ld_iq2_s, dc_iq2_s, col_iq4_xs),
    T.IQ3_S: FSpec(T.IQ3_S, 256, 110, 8, 2, 16, False, False, 7, 4, 2, ld_iq3_s, dc_iq3_s, col_iq4_xs),
    T.IQ1_S: FSpec(T.IQ1_S, 256, 50, 8, 2, 16, False, False, 3, 4, 4, ld_iq1_s, dc_iq1_s, col_iq4_xs),
    T.IQ1_M: FSpec(T.IQ1_M, 256, 56, 8, 2, 16, False, False, 4, 8, 4, ld_iq1_m, dc_iq1_m, col_iq4_xs),
}
