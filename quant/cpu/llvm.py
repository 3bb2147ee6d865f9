"""The few loads and conversions Numba cannot express in 32-bit lanes, as tiny LLVM intrinsics.

Numba types integer arithmetic on bytes as int64 and has no float16 on the CPU, which makes LLVM
unpack a nibble through 64-bit lanes (`vpmovzxbq`, `vcvtqq2ps`): half the throughput. These helpers
emit the 32-bit (or 16-bit) IR directly, so the loops that call them vectorize to `vpmovzxbd`,
`vpsrld`, `vcvtdq2ps`, `vcvtph2ps`. Each is exact (no rounding other than IEEE conversion).

    bits_f32(v, shift, mask)   float32((uint32(v) >> shift) & mask)   v: uint8 or any integer
    f16_at(row, o)             float16 stored little-endian at row[o:o+2] -> float32
    bf16_at(row, o)            bfloat16 at row[o:o+2] -> float32
    f32_at(row, o)             float32 at row[o:o+4] (unaligned)
    u16_at(row, o), u32_at(row, o)    little-endian unsigned integers (as int64)
    i8_f32(v)                  the byte v read as int8 -> float32
    f16_bits(u)                the low 16 bits of u read as a half -> float32
    ld(a, i), st(a, i, v)      a[i] and a[i] = v without the negative-index wraparound (see `ld`)
    pdep32(v, m), pext64(v, m) BMI2 bit deposit / extract (one instruction each; plain IR without BMI2)

`row` is a 1-D uint8 array (one packed row of a ggml tensor); `o` a byte offset.
"""
from __future__ import annotations

from llvmlite import binding as llb
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
HAVE_BMI2 = "+bmi2" in llb.get_host_cpu_features().flatten().split(",")   # else pdep32 / pext64 in plain IR


@intrinsic
def bits_f32(typingctx, v, shift, mask):
    """float32((uint32(v) >> shift) & mask), computed in 32-bit lanes (v: any integer; its low 32 bits)."""
    if not isinstance(v, types.Integer):
        return None
    sig = types.float32(v, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        width = signature.args[0].bitwidth
        a = args[0]
        a = builder.zext(a, I32) if width < 32 else (builder.trunc(a, I32) if width > 32 else a)
        r = builder.and_(builder.lshr(a, builder.trunc(args[1], I32)), builder.trunc(args[2], I32))
        return builder.uitofp(r, F32)
    return sig, codegen


def _byte_ptr(context, builder, aryty, ary, offset, to):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [offset]), ir.PointerType(to))


@intrinsic
def f16_at(typingctx, row, o):
    """IEEE half at byte offset o of a uint8 row -> float32 (F16C `vcvtph2ps` when vectorized)."""
    sig = types.float32(row, types.intp)

    def codegen(context, builder, signature, args):
        h = builder.load(_byte_ptr(context, builder, signature.args[0], args[0], args[1], ir.HalfType()), align=1)
        return builder.fpext(h, F32)
    return sig, codegen


@intrinsic
def bf16_at(typingctx, row, o):
    """bfloat16 at byte offset o -> float32: the 16 bits become the high half of a float32."""
    sig = types.float32(row, types.intp)

    def codegen(context, builder, signature, args):
        h = builder.load(_byte_ptr(context, builder, signature.args[0], args[0], args[1], I16), align=1)
        return builder.bitcast(builder.shl(builder.zext(h, I32), ir.Constant(I32, 16)), F32)
    return sig, codegen


@intrinsic
def f32_at(typingctx, row, o):
    """float32 at byte offset o (any alignment)."""
    sig = types.float32(row, types.intp)

    def codegen(context, builder, signature, args):
        return builder.load(_byte_ptr(context, builder, signature.args[0], args[0], args[1], F32), align=1)
    return sig, codegen


@intrinsic
def u16_at(typingctx, row, o):
    """Little-endian uint16 at byte offset o, widened to int64."""
    sig = types.int64(row, types.intp)

    def codegen(context, builder, signature, args):
        h = builder.load(_byte_ptr(context, builder, signature.args[0], args[0], args[1], I16), align=1)
        return builder.zext(h, I64)
    return sig, codegen


@intrinsic
def u32_at(typingctx, row, o):
    """Little-endian uint32 at byte offset o, widened to int64."""
    sig = types.int64(row, types.intp)

    def codegen(context, builder, signature, args):
        h = builder.load(_byte_ptr(context, builder, signature.args[0], args[0], args[1], I32), align=1)
        return builder.zext(h, I64)
    return sig, codegen


@intrinsic
def i8_f32(typingctx, v):
    """The byte v read as int8, converted to float32 (`vpmovsxbd` + `vcvtdq2ps` when vectorized)."""
    sig = types.float32(types.uint8)

    def codegen(context, builder, signature, args):
        return builder.sitofp(args[0], F32)
    return sig, codegen


@intrinsic
def f16_bits(typingctx, u):
    """The low 16 bits of an integer read as an IEEE half -> float32."""
    sig = types.float32(types.int64)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(builder.trunc(args[0], I16), ir.HalfType()), F32)
    return sig, codegen


@intrinsic
def ld(typingctx, a, i):
    """a[i] for a 1-D contiguous array and a non-negative index, without Numba's negative-index
    wraparound. That `i < 0 ? i + n : i` select, when LLVM cannot prove it away, turns the contiguous
    loads of a lane loop into byte-by-byte gathers (`vpinsrb`); the kernels index through `ld`."""
    if not (isinstance(a, types.Array) and a.ndim == 1):
        return None
    sig = a.dtype(a, types.intp)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.load(builder.gep(data, [args[1]]))
    return sig, codegen


@intrinsic
def st(typingctx, a, i, v):
    """a[i] = v for a 1-D contiguous array and a non-negative index, without the wraparound select
    (see `ld`)."""
    if not (isinstance(a, types.Array) and a.ndim == 1):
        return None
    sig = types.void(a, types.intp, a.dtype)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        builder.store(args[2], builder.gep(data, [args[1]]))
        return context.get_dummy_value()
    return sig, codegen


def _pdep_generic(builder, v, m, width):
    """pdep without BMI2: bit i of m set -> the next low bit of v goes to bit i. With a constant m
    (as at every call site) LLVM folds the unrolled selects into a few shifts and masks."""
    ty = ir.IntType(width)
    one, res, k = ir.Constant(ty, 1), ir.Constant(ty, 0), ir.Constant(ty, 0)
    for i in range(width):
        b = builder.and_(builder.lshr(m, ir.Constant(ty, i)), one)
        take = builder.shl(builder.and_(builder.lshr(v, k), one), ir.Constant(ty, i))
        res = builder.or_(res, builder.and_(take, builder.neg(b)))
        k = builder.add(k, b)
    return res


def _pext_generic(builder, v, m, width):
    """pext without BMI2: the bits of v at the set bits of m, packed into the low bits (folds as above)."""
    ty = ir.IntType(width)
    one, res, k = ir.Constant(ty, 1), ir.Constant(ty, 0), ir.Constant(ty, 0)
    for i in range(width):
        b = builder.and_(builder.lshr(m, ir.Constant(ty, i)), one)
        bit = builder.and_(builder.and_(builder.lshr(v, ir.Constant(ty, i)), one), b)
        res = builder.or_(res, builder.shl(bit, k))
        k = builder.add(k, b)
    return res


@intrinsic
def pdep32(typingctx, v, m):
    """BMI2 `pdep` on the low 32 bits: the low bits of v deposited, in order, at the set bits of m."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        a, b = builder.trunc(args[0], I32), builder.trunc(args[1], I32)
        if HAVE_BMI2:
            fn = builder.module.declare_intrinsic("llvm.x86.bmi.pdep.32", fnty=ir.FunctionType(I32, [I32, I32]))
            return builder.zext(builder.call(fn, [a, b]), I64)
        return builder.zext(_pdep_generic(builder, a, b, 32), I64)
    return sig, codegen


@intrinsic
def pext64(typingctx, v, m):
    """BMI2 `pext`: the bits of v at the set bits of m, packed into the low bits."""
    sig = types.int64(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        if HAVE_BMI2:
            fn = builder.module.declare_intrinsic("llvm.x86.bmi.pext.64", fnty=ir.FunctionType(I64, [I64, I64]))
            return builder.call(fn, [args[0], args[1]])
        return _pext_generic(builder, args[0], args[1], 64)
    return sig, codegen
