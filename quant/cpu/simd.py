"""16-lane vectors for the fused kernels: a few LLVM vector operations exposed to Numba.

LLVM's auto-vectorizer decides on its own which loop to vectorize, whether to unroll it away, and
how to chain the accumulators; on the packed ggml layouts it often decides badly (byte gathers,
scalarized scale decoding, 64-bit lanes, table lookups as gathers). The kernels in dot.py therefore
say what they mean with these values, the way ggml's C kernels use intrinsics:

    f32x16, i32x16                      value types (an LLVM <16 x float> / <16 x i32>, kept in
                                        registers: one zmm with AVX-512, two ymm with AVX2)
    u8x16(row, o)     -> i32x16         16 bytes at row[o:], zero-extended
    i8x16f(row, o)    -> f32x16         16 bytes read as int8, converted
    f16x16(row, o), bf16x16(row, o), f32x16_at(row, o)  -> f32x16    16 halves / bfloat16 / floats at byte o
    load16(a, i)      -> f32x16         a[i:i+16] of a float32 array
    rows8(tab, g0, g1) -> f32x16        tab[8 g0 : 8 g0 + 8] ++ tab[8 g1 : 8 g1 + 8]  (grid rows)
    rows4(tab, g0, g1, g2, g3) -> f32x16
    rows8_i8(tab, g0, g1) -> f32x16     as rows8, from an int8 table
    lanes(w, stride, mask) -> i32x16    lane l = (w >> (stride * l)) & mask   (bit fields of one word)
    nib8x2(row, o)    -> i32x16         low nibbles of 8 bytes, then their high nibbles
    select_bits(w, a, b) -> f32x16      lane l = a if bit l of w else b   (Q1_0's signs)
    base3_tail(w)     -> i32x16         TQ1_0's 16 digits packed in 4 bytes
    u8x32w(row, o)    -> i32x16         32 bytes zero-extended to 16-bit words (lane l: bytes 2l, 2l + 1)
    u16x16(row, o)    -> i32x16         32 bytes as 16 words, one per lane
    ue4m3x4(row, o)   -> f32x16         NVFP4's 4 scale bytes decoded, lane l: byte l // 4
    wshl(v, s), wmul(v, c), wmulhi(v, c)   per 16-bit word: v << s, low / high 16 bits of v c (constants)
    u16_lanes(row, o, pattern) -> i32x16  lane l = the uint16 at byte o + 2 SPREAD[pattern][l]
    shr4(v, a, b, c, d) -> i32x16       lane l shifted right by (a, b, c, d)[l % 4] (`vpsrlvd`)
    shr(v, s), shl(v, s), band(v, m), imul(v, c), iadd(v, c), ior(a, b), to_f32(v)   integer lanes
    lut(tab, idx)     -> f32x16         tab[idx & 15] lane by lane, tab a f32x16 of 16 code-book values
                                        (`vpermps`: one with AVX-512, two per 8 lanes + a blend with AVX2)
    lut_affine(tab, idx, lo, mask, off), lut32_affine(lo_tab, hi_tab, idx, lo, mask, off)   the same for a
                                        book that is ((n >> lo) & mask) - off: integer lane ops without AVX-512
    nib_lut(tab, row, o, hi)  -> f32x16  tab[nibble] of the 16 bytes at row[o:] (an int8 book: `pshufb`
                                        on the bytes without AVX-512)
    u8x64             64 packed bytes, worked on before widening (one byte op = four on lanes):
      b64(row, o), b32x2(row, o)        64 bytes / 32 bytes twice;  bsh(v, s_lo, s_hi) per-half shift,
      bmask(v, m), bsub(v, c), bor(a, b)    byte and / subtract / or;  as_i32(v) -> i32x16 (a bitcast)
    i32x16_at(row, o) -> i32x16         64 bytes as 16 words, fields read in place
    byte_top(v, k)    -> i32x16         byte k of each lane moved to its top byte, the rest 0 (`vpshufb`)
    or_where(v, m, c), flip(v, m)       v | c, -v in the lanes whose bit of m is set (mask registers)
    scales_u8(w0, w1, w2, w3, d_lo, d_hi), scales_i8(...) -> f32x16     16 block scales from 16 bytes
    spread(v, first, pattern) -> f32x16  the scales of the sub-blocks held by each lane (`vpermps`)
    splat(s), splat2(a, b), zeros(), fma(a, b, c), mul(a, b), add(a, b), addc(a, s), hsum(a) -> float32

Every operation is exact IEEE float32 (fma rounds once); `hsum` adds the 16 lanes in a tree.
"""
from __future__ import annotations

from llvmlite import binding as llb
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

F32 = ir.FloatType()
I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
VF = ir.VectorType(F32, 16)
VI = ir.VectorType(I32, 16)
_FEATURES = llb.get_host_cpu_features().flatten().split(",")
HAVE_AVX512 = "+avx512f" in _FEATURES
HAVE_AVX2 = "+avx2" in _FEATURES
# Flags of the float adds and multiplies below. Numba's fastmath pass only flags instructions that
# have none, so these keep it from adding `reassoc` (the drivers compile with it): LLVM then keeps
# the kernels' own order of additions, and independent accumulation chains stay independent. With
# reassoc it had folded the per-block sums into one serial FMA chain (4 cycles of latency per 16
# weights). `contract` still lets a multiply and an add fuse into an FMA.
FP_FLAGS = ("contract",)


class F32x16Type(types.Type):
    def __init__(self):
        super().__init__(name="f32x16")


class I32x16Type(types.Type):
    def __init__(self):
        super().__init__(name="i32x16")


class U8x64Type(types.Type):
    def __init__(self):
        super().__init__(name="u8x64")


f32x16 = F32x16Type()
i32x16 = I32x16Type()
u8x64 = U8x64Type()
VB = ir.VectorType(I8, 64)


@register_model(F32x16Type)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, VF)


@register_model(I32x16Type)
class _I32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, VI)


@register_model(U8x64Type)
class _U8x64Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, VB)


# ---------------------------------------------------------------- helpers (IR)

def _data(context, builder, aryty, ary):
    return context.make_array(aryty)(context, builder, ary).data


def _at(context, builder, aryty, ary, index, to):
    """Pointer of type `to` at element `index` of the array (byte offset for uint8 rows)."""
    return builder.bitcast(builder.gep(_data(context, builder, aryty, ary), [index]), ir.PointerType(to))


def _splat(builder, value, vty):
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), ir.Constant(VI, [0] * 16))


def _i32(builder, v):
    w = v.type.width
    return v if w == 32 else (builder.trunc(v, I32) if w > 32 else builder.zext(v, I32))


def _fn(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


V8F, V8I = ir.VectorType(F32, 8), ir.VectorType(I32, 8)


def _permute(builder, tab, idx):
    """out[l] = tab[idx[l] & 15] for a 16-float code book tab (one f32x16).

    AVX-512: one `vpermps`. AVX2 (8-entry `vpermps` on ymm halves): per 8 lanes, one `vpermps` per half of the
    book, then a blend on index bit 3. Elsewhere: lane by lane.
    """
    if HAVE_AVX512:
        return builder.call(_fn(builder, "llvm.x86.avx512.permvar.sf.512", VF, [VF, VI]), [tab, idx])
    if not HAVE_AVX2:
        out = ir.Constant(VF, ir.Undefined)
        for lane in range(16):
            k = builder.and_(builder.extract_element(idx, ir.Constant(I32, lane)), ir.Constant(I32, 15))
            out = builder.insert_element(out, builder.extract_element(tab, k), ir.Constant(I32, lane))
        return out
    undef_f, undef_i = ir.Constant(VF, ir.Undefined), ir.Constant(VI, ir.Undefined)
    lo, hi = (builder.shuffle_vector(tab, undef_f, ir.Constant(V8I, list(range(8 * h, 8 * h + 8))))
              for h in range(2))                                              # the book, 8 entries each
    perm = _fn(builder, "llvm.x86.avx2.permps", V8F, [V8F, V8I])
    halves = []
    for h in range(2):
        ih = builder.shuffle_vector(idx, undef_i, ir.Constant(V8I, list(range(8 * h, 8 * h + 8))))
        b3 = builder.icmp_unsigned("!=", builder.and_(ih, ir.Constant(V8I, [8] * 8)), ir.Constant(V8I, [0] * 8))
        halves.append(builder.select(b3, builder.call(perm, [hi, ih]), builder.call(perm, [lo, ih])))  # bits 0-2
    return builder.shuffle_vector(halves[0], halves[1], ir.Constant(VI, list(range(16))))


# ---------------------------------------------------------------- loads

@intrinsic
def u8x16(typingctx, row, o):
    sig = i32x16(row, types.intp)

    def codegen(context, builder, signature, args):
        b = builder.load(_at(context, builder, signature.args[0], args[0], args[1], ir.VectorType(I8, 16)), align=1)
        return builder.zext(b, VI)
    return sig, codegen


@intrinsic
def i8x16f(typingctx, row, o):
    sig = f32x16(row, types.intp)

    def codegen(context, builder, signature, args):
        b = builder.load(_at(context, builder, signature.args[0], args[0], args[1], ir.VectorType(I8, 16)), align=1)
        return builder.sitofp(b, VF)
    return sig, codegen


@intrinsic
def f16x16(typingctx, row, o):
    sig = f32x16(row, types.intp)

    def codegen(context, builder, signature, args):
        h = builder.load(_at(context, builder, signature.args[0], args[0], args[1],
                             ir.VectorType(ir.HalfType(), 16)), align=1)
        return builder.fpext(h, VF)
    return sig, codegen


@intrinsic
def bf16x16(typingctx, row, o):
    sig = f32x16(row, types.intp)

    def codegen(context, builder, signature, args):
        h = builder.load(_at(context, builder, signature.args[0], args[0], args[1], ir.VectorType(I16, 16)), align=1)
        w = builder.shl(builder.zext(h, VI), ir.Constant(VI, [16] * 16))
        return builder.bitcast(w, VF)
    return sig, codegen


@intrinsic
def f32x16_at(typingctx, row, o):
    sig = f32x16(row, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load(_at(context, builder, signature.args[0], args[0], args[1], VF), align=1)
    return sig, codegen


@intrinsic
def load16(typingctx, a, i):
    if not (isinstance(a, types.Array) and a.dtype == types.float32):
        return None
    sig = f32x16(a, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load(_at(context, builder, signature.args[0], args[0], args[1], VF), align=4)
    return sig, codegen


def _rows(n):
    def impl(typingctx, tab, *gs):
        sig = f32x16(tab, *([types.intp] * n))

        def codegen(context, builder, signature, args):
            width = 16 // n
            parts = [builder.load(_at(context, builder, signature.args[0], args[0],
                                      builder.mul(g, ir.Constant(g.type, width)), ir.VectorType(F32, width)), align=4)
                     for g in args[1:]]
            while len(parts) > 1:                               # concatenate neighbours, level by level
                w = parts[0].type.count
                mask = ir.Constant(ir.VectorType(I32, 2 * w), list(range(2 * w)))
                parts = [builder.shuffle_vector(parts[k], parts[k + 1], mask) for k in range(0, len(parts), 2)]
            return parts[0]
        return sig, codegen
    return impl


@intrinsic
def rows8(typingctx, tab, g0, g1):
    """tab[8 g0 : 8 g0 + 8] ++ tab[8 g1 : 8 g1 + 8] of a flat float32 table of 8-value rows."""
    return _rows(2)(typingctx, tab, g0, g1)


@intrinsic
def rows4(typingctx, tab, g0, g1, g2, g3):
    """Four 4-value rows of a flat float32 table, concatenated."""
    return _rows(4)(typingctx, tab, g0, g1, g2, g3)


@intrinsic
def rows8_i8(typingctx, tab, g0, g1):
    """tab[8 g0 : 8 g0 + 8] ++ tab[8 g1 : 8 g1 + 8] of a flat int8 table of 8-value rows, as float32
    (two 8-byte loads, `vpmovsxbd`, `vcvtdq2ps`): a grid a quarter the size of its float32 copy."""
    sig = f32x16(tab, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        B8 = ir.VectorType(I8, 8)
        parts = [builder.load(_at(context, builder, signature.args[0], args[0],
                                  builder.mul(g, ir.Constant(g.type, 8)), B8), align=1) for g in args[1:]]
        b16 = builder.shuffle_vector(parts[0], parts[1], ir.Constant(VI, list(range(16))))
        return builder.sitofp(b16, VF)
    return sig, codegen


@intrinsic
def prefetch(typingctx, row, o):
    """Hint the cache line at byte o of row into L1 (`prefetcht0`); no effect on results."""
    sig = types.void(row, types.intp)

    def codegen(context, builder, signature, args):
        p = _at(context, builder, signature.args[0], args[0], args[1], I8)
        fn = _fn(builder, "llvm.prefetch.p0", ir.VoidType(), [ir.PointerType(I8), I32, I32, I32])
        builder.call(fn, [p, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
        return context.get_dummy_value()
    return sig, codegen


# ---------------------------------------------------------------- integer lanes

@intrinsic
def lanes(typingctx, w, stride, mask):
    """Lane l = (w >> (stride * l)) & mask, for a scalar integer word w (its low 32 bits)."""
    if not (isinstance(w, types.Integer) and isinstance(stride, types.IntegerLiteral)):
        return None
    s = stride.literal_value
    sig = i32x16(w, stride, types.intp)

    def codegen(context, builder, signature, args):
        v = _splat(builder, _i32(builder, args[0]), VI)
        v = builder.lshr(v, ir.Constant(VI, [s * l for l in range(16)]))
        return builder.and_(v, _splat(builder, _i32(builder, args[2]), VI))
    return sig, codegen


def _int_op(op):
    def impl(typingctx, v, c):
        sig = i32x16(i32x16, types.intp)

        def codegen(context, builder, signature, args):
            return getattr(builder, op)(args[0], _splat(builder, _i32(builder, args[1]), VI))
        return sig, codegen
    return impl


shr = intrinsic(_int_op("lshr"))
shl = intrinsic(_int_op("shl"))
band = intrinsic(_int_op("and_"))
imul = intrinsic(_int_op("mul"))
iadd = intrinsic(_int_op("add"))


@intrinsic
def ior(typingctx, a, b):
    """a | b lane by lane (two integer vectors)."""
    sig = i32x16(i32x16, i32x16)

    def codegen(context, builder, signature, args):
        return builder.or_(args[0], args[1])
    return sig, codegen


@intrinsic
def nib8x2(typingctx, row, o):
    """The 8 bytes at row[o:]: lanes 0..7 their low nibbles, lanes 8..15 their high nibbles."""
    sig = i32x16(row, types.intp)

    def codegen(context, builder, signature, args):
        b = builder.load(_at(context, builder, signature.args[0], args[0], args[1], ir.VectorType(I8, 8)), align=1)
        w = builder.shuffle_vector(b, b, ir.Constant(ir.VectorType(I32, 16), list(range(8)) * 2))
        w = builder.zext(w, VI)
        w = builder.lshr(w, ir.Constant(VI, [0] * 8 + [4] * 8))
        return builder.and_(w, ir.Constant(VI, [15] * 16))
    return sig, codegen


@intrinsic
def select_bits(typingctx, w, a, b):
    """Lane l = a where bit l of the 16-bit word w is set, else b (a mask-register blend)."""
    sig = f32x16(types.int64, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        mask = builder.bitcast(builder.trunc(args[0], I16), ir.VectorType(ir.IntType(1), 16))
        return builder.select(mask, _splat(builder, args[1], VF), _splat(builder, args[2], VF))
    return sig, codegen


@intrinsic
def base3_tail(typingctx, w):
    """TQ1_0's last 16 weights from its 4 qh bytes (w, little-endian): lane l = base-3 digit (l >> 2)
    of byte (l & 3), computed as ggml does: ((byte * 3^n) mod 256) * 3 >> 8."""
    sig = i32x16(types.int64)

    def codegen(context, builder, signature, args):
        v = _splat(builder, _i32(builder, args[0]), VI)
        v = builder.and_(builder.lshr(v, ir.Constant(VI, [8 * (l & 3) for l in range(16)])), ir.Constant(VI, [255] * 16))
        v = builder.and_(builder.mul(v, ir.Constant(VI, [3 ** (l >> 2) for l in range(16)])), ir.Constant(VI, [255] * 16))
        return builder.lshr(builder.mul(v, ir.Constant(VI, [3] * 16)), ir.Constant(VI, [8] * 16))
    return sig, codegen


W16 = ir.VectorType(I16, 32)


@intrinsic
def u8x32w(typingctx, row, o):
    """The 32 bytes at row[o:] zero-extended to 32 16-bit words (`vpmovzxbw`): lane l holds bytes 2l
    (low word) and 2l + 1 (high word)."""
    sig = i32x16(row, types.intp)

    def codegen(context, builder, signature, args):
        b = builder.load(_at(context, builder, signature.args[0], args[0], args[1], ir.VectorType(I8, 32)), align=1)
        return builder.bitcast(builder.zext(b, W16), VI)
    return sig, codegen


@intrinsic
def u16x16(typingctx, row, o):
    """The 32 bytes at row[o:] as 16 little-endian words zero-extended to the 32-bit lanes (`vpmovzxwd`):
    lane l holds bytes 2l and 2l + 1, four nibbles."""
    sig = i32x16(row, types.intp)

    def codegen(context, builder, signature, args):
        w = builder.load(_at(context, builder, signature.args[0], args[0], args[1], ir.VectorType(I16, 16)), align=1)
        return builder.zext(w, VI)
    return sig, codegen


@intrinsic
def ue4m3x4(typingctx, row, o):
    """Lane l = ggml_ue4m3_to_fp32(row[o + l // 4]) / 2 (NVFP4's four sub-block scales, 4 lanes each).
    E4M3 (bias 7) shifted into a half's exponent and mantissa (bias 15) is the value / 2^8, subnormals
    included: half((b & 0x7F) << 7) * 2^7; the byte 0x7F is 0 (ggml's NaN code)."""
    sig = f32x16(row, types.intp)

    def codegen(context, builder, signature, args):
        b = builder.load(_at(context, builder, signature.args[0], args[0], args[1], ir.VectorType(I8, 4)), align=1)
        b = builder.shuffle_vector(b, b, ir.Constant(VI, [l // 4 for l in range(16)]))
        H16 = ir.VectorType(I16, 16)
        h = builder.shl(builder.and_(builder.zext(b, H16), ir.Constant(H16, [0x7F] * 16)), ir.Constant(H16, [7] * 16))
        f = builder.fmul(builder.fpext(builder.bitcast(h, ir.VectorType(ir.HalfType(), 16)), VF),
                         ir.Constant(VF, [128.0] * 16), flags=FP_FLAGS)
        nan = builder.icmp_unsigned("==", b, ir.Constant(ir.VectorType(I8, 16), [0x7F] * 16))
        return builder.select(nan, ir.Constant(VF, [0.0] * 16), f)
    return sig, codegen


def _word_op(op):
    def impl(typingctx, v, c):
        if not isinstance(c, types.IntegerLiteral):
            return None
        k = c.literal_value
        sig = i32x16(i32x16, c)

        def codegen(context, builder, signature, args):
            w = builder.bitcast(args[0], W16)
            if op == "mulhi":                               # high half of the 32-bit product (`vpmulhuw`)
                W32 = ir.VectorType(I32, 32)
                p = builder.mul(builder.zext(w, W32), ir.Constant(W32, [k] * 32))
                r = builder.trunc(builder.lshr(p, ir.Constant(W32, [16] * 32)), W16)
            else:
                r = getattr(builder, op)(w, ir.Constant(W16, [k] * 32))
            return builder.bitcast(r, VI)
        return sig, codegen
    return impl


wshl = intrinsic(_word_op("shl"))
wshl.__doc__ = "Each 16-bit word shifted left by the constant s (`vpsllw`)."
wmul = intrinsic(_word_op("mul"))
wmul.__doc__ = "Each 16-bit word times the constant c, low 16 bits of the product (`vpmullw`)."
wmulhi = intrinsic(_word_op("mulhi"))
wmulhi.__doc__ = "Each 16-bit word times the constant c, high 16 bits of the 32-bit product (`vpmulhuw`)."


@intrinsic
def to_f32(typingctx, v):
    sig = f32x16(i32x16)

    def codegen(context, builder, signature, args):
        return builder.sitofp(args[0], VF)
    return sig, codegen


@intrinsic
def lut(typingctx, tab, idx):
    """tab[idx[l]] for each lane (idx in 0..15)."""
    sig = f32x16(f32x16, i32x16)

    def codegen(context, builder, signature, args):
        return _permute(builder, args[0], args[1])
    return sig, codegen


def _affine(builder, idx, lo, mask, off):
    """sitofp(((idx >> lo) & mask) - off) lane by lane (lo, mask, off: i64 scalars, splatted)."""
    sp = [_splat(builder, _i32(builder, a), VI) for a in (lo, mask, off)]
    return builder.sitofp(builder.sub(builder.and_(builder.lshr(idx, sp[0]), sp[1]), sp[2]), VF)


@intrinsic
def lut_affine(typingctx, tab, idx, lo, mask, off):
    """lut(tab, idx) for a code book the caller states to be tab[n] = ((n >> lo) & mask) - off for every
    n in 0..15 (the centred integer codes): the same values. AVX-512: the one `vpermps` of lut; elsewhere
    shift, and, subtract and convert, cheaper than two `vpermps` per 8 lanes and a blend."""
    sig = f32x16(f32x16, i32x16, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        if HAVE_AVX512:
            return _permute(builder, args[0], args[1])
        return _affine(builder, args[1], args[2], args[3], args[4])
    return sig, codegen


@intrinsic
def lut32_affine(typingctx, lo_tab, hi_tab, idx, lo, mask, off):
    """lo_tab ++ hi_tab [idx & 31] for a 32-entry code book stated to be ((n >> lo) & mask) - off (as
    lut_affine: `vpermt2ps` with AVX-512, integer lane operations elsewhere)."""
    sig = f32x16(f32x16, f32x16, i32x16, types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        if HAVE_AVX512:                                 # the 32-entry book in two registers (`vpermt2ps`)
            return builder.call(_fn(builder, "llvm.x86.avx512.vpermi2var.ps.512", VF, [VF, VI, VF]),
                                [args[0], args[2], args[1]])
        return _affine(builder, args[2], args[3], args[4], args[5])
    return sig, codegen


@intrinsic
def nib_lut(typingctx, tab, row, o, hi):
    """lut(tab, q & 15) (hi = 0) or lut(tab, q >> 4) (hi = 1) of the 16 bytes q at row[o:], for a book of
    integers in -128..127 (IQ4_NL's, MXFP4's doubled values): with AVX-512 the zero-extend and one `vpermps`
    (as lut); otherwise the 16 nibbles are looked up while still bytes, in the book as int8 (one `pshufb`),
    then widened and converted: the same values."""
    if not isinstance(hi, types.IntegerLiteral):
        return None
    high = hi.literal_value
    sig = f32x16(f32x16, row, types.intp, hi)

    def codegen(context, builder, signature, args):
        tab, aryty = args[0], signature.args[1]
        V16B = ir.VectorType(I8, 16)
        b = builder.load(_at(context, builder, aryty, args[1], args[2], V16B), align=1)
        if high:
            b = builder.lshr(b, ir.Constant(V16B, [4] * 16))
        else:
            b = builder.and_(b, ir.Constant(V16B, [15] * 16))
        if HAVE_AVX512 or not HAVE_AVX2:
            return _permute(builder, tab, builder.zext(b, VI))
        book = builder.trunc(builder.fptosi(tab, VI), V16B)                    # loop-invariant: hoisted
        pshufb = _fn(builder, "llvm.x86.ssse3.pshuf.b.128", V16B, [V16B, V16B])
        return builder.sitofp(builder.sext(builder.call(pshufb, [book, b]), VI), VF)
    return sig, codegen


# ---------------------------------------------------------------- 64 bytes at a time
# Bit fields are cheapest to move while still packed: one byte operation on 64 bytes does the work
# of four on 16 widened lanes. `widen` then takes 16 of the bytes to 32-bit lanes.

@intrinsic
def b64(typingctx, row, o):
    """The 64 bytes at row[o:]."""
    sig = u8x64(row, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load(_at(context, builder, signature.args[0], args[0], args[1], VB), align=1)
    return sig, codegen


@intrinsic
def b32x2(typingctx, row, o):
    """The 32 bytes at row[o:], twice (bytes 0..31 and 32..63)."""
    sig = u8x64(row, types.intp)

    def codegen(context, builder, signature, args):
        h = builder.load(_at(context, builder, signature.args[0], args[0], args[1], ir.VectorType(I8, 32)), align=1)
        return builder.shuffle_vector(h, h, ir.Constant(ir.VectorType(I32, 64), list(range(32)) * 2))
    return sig, codegen


@intrinsic
def bsh(typingctx, v, s_lo, s_hi):
    """Bytes 0..31 shifted right by s_lo bits, bytes 32..63 by s_hi (a negative count shifts left),
    as 64-bit lanes (`vpsrlvq` / `vpsllvq`): bits of the neighbouring byte move in, so a `bmask`
    must follow. Counts in -7..7, of one sign, constants once the kernel's loops are unrolled."""
    sig = u8x64(u8x64, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        Q = ir.VectorType(ir.IntType(64), 8)
        q = builder.bitcast(args[0], Q)
        c = builder.shuffle_vector(_splat(builder, args[1], ir.VectorType(ir.IntType(64), 16)),
                                   _splat(builder, args[2], ir.VectorType(ir.IntType(64), 16)),
                                   ir.Constant(ir.VectorType(I32, 8), [0] * 4 + [16] * 4))
        left = builder.icmp_signed("<", builder.add(args[1], args[2]), ir.Constant(args[1].type, 0))
        r = builder.select(left, builder.shl(q, builder.neg(c)), builder.lshr(q, c))
        return builder.bitcast(r, VB)
    return sig, codegen


@intrinsic
def bmask(typingctx, v, m):
    """v & m in every byte (m a constant)."""
    if not isinstance(m, types.IntegerLiteral):
        return None
    c = m.literal_value
    sig = u8x64(u8x64, m)

    def codegen(context, builder, signature, args):
        return builder.and_(args[0], ir.Constant(VB, [c] * 64))
    return sig, codegen


@intrinsic
def bsub(typingctx, v, c):
    """v - c in every byte, wrapping (`vpsubb`): an offset-binary field becomes a signed byte."""
    if not isinstance(c, types.IntegerLiteral):
        return None
    k = c.literal_value
    sig = u8x64(u8x64, c)

    def codegen(context, builder, signature, args):
        return builder.sub(args[0], ir.Constant(VB, [k] * 64))
    return sig, codegen


@intrinsic
def bor(typingctx, a, b):
    """a | b byte by byte."""
    sig = u8x64(u8x64, u8x64)

    def codegen(context, builder, signature, args):
        return builder.or_(args[0], args[1])
    return sig, codegen


@intrinsic
def byte_top(typingctx, v, k):
    """Lane l = byte k of lane l moved to the top byte, the three bytes below it 0 (one `vpshufb`
    with zeroing; k a constant)."""
    if not isinstance(k, types.IntegerLiteral):
        return None
    kk = k.literal_value
    sig = i32x16(i32x16, k)

    def codegen(context, builder, signature, args):
        idx = [i for lane in range(16) for i in (64, 64, 64, 4 * lane + kk)]    # 64: a byte of the zero vector
        r = builder.shuffle_vector(builder.bitcast(args[0], VB), ir.Constant(VB, [0] * 64),
                                   ir.Constant(ir.VectorType(I32, 64), idx))
        return builder.bitcast(r, VI)
    return sig, codegen


@intrinsic
def as_i32(typingctx, v):
    """The 64 bytes as 16 little-endian 32-bit lanes (lane l = bytes 4l .. 4l + 3; no instruction)."""
    sig = i32x16(u8x64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], VI)
    return sig, codegen


SPREAD = {0: [0] * 16, 4: [l // 4 for l in range(16)], 8: [l // 8 for l in range(16)],
          82: [2 * (l // 8) for l in range(16)], 42: [(l // 4) % 2 + 8 * (l // 8) for l in range(16)],
          88: [l % 8 for l in range(16)], 2: [l // 2 for l in range(16)], 14: [(l // 4) % 2 for l in range(16)]}


@intrinsic
def spread(typingctx, v, first, pattern):
    """Lane l = v[first + SPREAD[pattern][l]] (one `vpermps`): the scales of the sub-blocks whose
    weights the 16 lanes hold. pattern 0: lane `first` everywhere; 4 / 8: l // 4, l // 8 (4 or 2
    consecutive sub-blocks);
    82: 2 (l // 8); 42: (l // 4) % 2 + 8 (l // 8) (the lane orders of dot.py's lut4); 88: l % 8;
    2: l // 2; 14: (l // 4) % 2 (also the word patterns of u16_lanes)."""
    if not isinstance(pattern, types.IntegerLiteral):
        return None
    offs = SPREAD[pattern.literal_value]
    sig = f32x16(f32x16, types.intp, pattern)

    def codegen(context, builder, signature, args):
        idx = builder.add(_splat(builder, builder.trunc(args[1], I32), VI), ir.Constant(VI, offs))
        return _permute(builder, args[0], idx)
    return sig, codegen


@intrinsic
def u16_lanes(typingctx, row, o, pattern):
    """Lane l = the little-endian uint16 at byte o + 2 SPREAD[pattern][l] (one load, one word shuffle):
    a few packed scale / sign words spread over the lanes that use them."""
    if not isinstance(pattern, types.IntegerLiteral):
        return None
    offs = SPREAD[pattern.literal_value]
    n = max(offs) + 1
    sig = i32x16(row, types.intp, pattern)

    def codegen(context, builder, signature, args):
        w = builder.load(_at(context, builder, signature.args[0], args[0], args[1], ir.VectorType(I16, n)), align=1)
        return builder.zext(builder.shuffle_vector(w, w, ir.Constant(VI, offs)), VI)
    return sig, codegen


@intrinsic
def shr4(typingctx, v, a, b, c, d):
    """Lane l shifted right by (a, b, c, d)[l % 4] (constants; `vpsrlvd`)."""
    if not all(isinstance(k, types.IntegerLiteral) for k in (a, b, c, d)):
        return None
    s = [k.literal_value for k in (a, b, c, d)] * 4
    sig = i32x16(i32x16, a, b, c, d)

    def codegen(context, builder, signature, args):
        return builder.lshr(args[0], ir.Constant(VI, s))
    return sig, codegen


@intrinsic
def i32x16_at(typingctx, row, o):
    """The 64 bytes at row[o:] as 16 little-endian 32-bit lanes."""
    sig = i32x16(row, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load(_at(context, builder, signature.args[0], args[0], args[1], VI), align=1)
    return sig, codegen


@intrinsic
def rotl(typingctx, v, r_lo, r_hi):
    """Lanes 0..7 rotated left by r_lo bits, lanes 8..15 by r_hi (`vprolvd`; constants once unrolled)."""
    sig = i32x16(i32x16, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        H = ir.VectorType(I32, 16)
        lo, hi = _splat(builder, _i32(builder, args[1]), H), _splat(builder, _i32(builder, args[2]), H)
        c = builder.shuffle_vector(lo, hi, ir.Constant(VI, [0] * 8 + [16] * 8))
        c = builder.and_(c, ir.Constant(VI, [31] * 16))
        return builder.call(_fn(builder, "llvm.fshl.v16i32", VI, [VI, VI, VI]), [args[0], args[0], c])
    return sig, codegen


@intrinsic
def bitsel(typingctx, m, a, b):
    """The bits of a where the constant m has ones, of b elsewhere (one `vpternlogd`)."""
    if not isinstance(m, types.IntegerLiteral):
        return None
    k = m.literal_value & 0xFFFFFFFF
    sig = i32x16(m, i32x16, i32x16)

    def codegen(context, builder, signature, args):
        mk = ir.Constant(VI, [k if k < 2 ** 31 else k - 2 ** 32] * 16)
        return builder.or_(builder.and_(args[1], mk), builder.and_(args[2], builder.not_(mk)))
    return sig, codegen


@intrinsic
def flip(typingctx, v, m):
    """v with the sign of lane l flipped where bit l of the integer m is set (a masked `vpxord` of
    the sign bit: the i-quants' sign bytes used as they are, no +-1 table or multiply)."""
    sig = f32x16(f32x16, types.int64)

    def codegen(context, builder, signature, args):
        mask = builder.bitcast(builder.trunc(args[1], I16), ir.VectorType(ir.IntType(1), 16))
        bits = builder.select(mask, ir.Constant(VI, [-(1 << 31)] * 16), ir.Constant(VI, [0] * 16))
        return builder.bitcast(builder.xor(builder.bitcast(args[0], VI), bits), VF)
    return sig, codegen


@intrinsic
def or_where(typingctx, v, m, c):
    """v | c in the lanes l where bit l of the integer m is set, v elsewhere (a masked `vpord`:
    Q5_0/Q5_1's fifth bits used as a lane mask as they are stored)."""
    sig = i32x16(i32x16, types.int64, types.intp)

    def codegen(context, builder, signature, args):
        mask = builder.bitcast(builder.trunc(args[1], I16), ir.VectorType(ir.IntType(1), 16))
        return builder.select(mask, builder.or_(args[0], _splat(builder, _i32(builder, args[2]), VI)), args[0])
    return sig, codegen


# ---------------------------------------------------------------- float lanes

@intrinsic
def splat(typingctx, s):
    sig = f32x16(types.float32)

    def codegen(context, builder, signature, args):
        return _splat(builder, args[0], VF)
    return sig, codegen


def _scales(signed):
    def impl(typingctx, w0, w1, w2, w3, d_lo, d_hi):
        sig = f32x16(types.int64, types.int64, types.int64, types.int64, types.float32, types.float32)

        def codegen(context, builder, signature, args):
            v4 = ir.Constant(ir.VectorType(I32, 4), ir.Undefined)
            for k in range(4):
                v4 = builder.insert_element(v4, builder.trunc(args[k], I32), ir.Constant(I32, k))
            b16 = builder.bitcast(v4, ir.VectorType(I8, 16))
            i16 = builder.sext(b16, VI) if signed else builder.zext(b16, VI)
            d = ir.Constant(VF, ir.Undefined)
            for lane in range(16):
                d = builder.insert_element(d, args[4] if lane < 8 else args[5], ir.Constant(I32, lane))
            return builder.fmul(builder.sitofp(i16, VF), d, flags=FP_FLAGS)
        return sig, codegen
    return impl


scales_u8 = intrinsic(_scales(False))
scales_u8.__doc__ = """(d_lo if l < 8 else d_hi) * float32(byte l of the little-endian words w0..w3), l < 16: the 12-16
scale bytes of a K-quant block, rearranged with 32-bit masks as ggml does, widened in one go."""
scales_i8 = intrinsic(_scales(True))
scales_i8.__doc__ = "As scales_u8, with the bytes read as int8."


@intrinsic
def splat2(typingctx, a, b):
    """Lanes 0..7 = a, lanes 8..15 = b."""
    sig = f32x16(types.float32, types.float32)

    def codegen(context, builder, signature, args):
        a, b = _splat(builder, args[0], VF), _splat(builder, args[1], VF)
        return builder.shuffle_vector(a, b, ir.Constant(VI, list(range(8)) + list(range(24, 32))))
    return sig, codegen


@intrinsic
def zeros(typingctx):
    sig = f32x16()

    def codegen(context, builder, signature, args):
        return ir.Constant(VF, [0.0] * 16)
    return sig, codegen


@intrinsic
def fma(typingctx, a, b, c):
    sig = f32x16(f32x16, f32x16, f32x16)

    def codegen(context, builder, signature, args):
        return builder.call(_fn(builder, "llvm.fma.v16f32", VF, [VF, VF, VF]), args)
    return sig, codegen


@intrinsic
def mul(typingctx, a, b):
    sig = f32x16(f32x16, f32x16)

    def codegen(context, builder, signature, args):
        return builder.fmul(args[0], args[1], flags=FP_FLAGS)
    return sig, codegen


@intrinsic
def add(typingctx, a, b):
    sig = f32x16(f32x16, f32x16)

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1], flags=FP_FLAGS)
    return sig, codegen


@intrinsic
def addc(typingctx, a, s):
    """a + s in every lane (s a float32 scalar)."""
    sig = f32x16(f32x16, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], _splat(builder, args[1], VF), flags=FP_FLAGS)
    return sig, codegen


@intrinsic
def hsum(typingctx, a):
    """The 16 lanes added as a tree: ((l0 + l8) + (l4 + l12)) + ...  -> float32."""
    sig = types.float32(f32x16)

    def codegen(context, builder, signature, args):
        v = args[0]
        n = 16
        while n > 1:
            n //= 2
            lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
            hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
            v = builder.fadd(lo, hi, flags=FP_FLAGS)
        return builder.extract_element(v, ir.Constant(I32, 0))
    return sig, codegen
