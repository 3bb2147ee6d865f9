"""PTX instructions numba-cuda does not emit by itself, as tiny intrinsics (with simulator twins).

    a, b, c, d = ld4u(w32, i)      w32[i : i + 4] in one 128-bit load (ld.global.nc.v4.u32); i % 4 == 0
    a, b, c, d = ld4f(x, i)        the float32 elements i .. i + 3 of x (any shape, flat index), one load
    r = prmt(a, b, sel)            byte permute: byte k of r = byte (sel >> 4k) & 7 of the 8 bytes b:a
    f = h2f(u)                     the low 16 bits of u as an IEEE half -> float32 (cvt.f32.f16)
    c = dp4a(a, b, c)              c + the dot product of the four signed bytes of a and of b (dp4a.s32.s32)
    hi, lo = tf32_split(v)         hi = v rounded to TF32 (cvt.rna.tf32.f32), lo = v - hi, both as bits
    u = f32_bits(v)                the bits of a float32 as uint32 (mov.b32: no instruction once compiled)
    cp_async16(dst, i, src, j)     dst[i : i + 4] = src[j : j + 4] (uint32; dst in shared, src in global memory), as
                                   one asynchronous 16-byte copy (cp.async.cg); both 16-byte aligned
    cp_async_commit()              closes the group of copies issued since the last commit (cp.async.commit_group)
    cp_async_wait1(), _wait0()     waits until at most 1 / 0 groups are pending (cp.async.wait_group); a barrier
                                   after it makes the copies visible to the other threads
    d0..d3 = mma_tf32(a0..a3, b0, b1, c0..c3)
                                   one warp-wide mma.sync.m16n8k8 (TF32 fragments, float32 accumulators);
                                   no simulator twin (a warp collective: `tc.py` emulates it there)
    d0..d3 = mma_f16(a0..a3, b0, b1, c0..c3)
                                   one warp-wide mma.sync.m16n8k16 (f16x2 fragments, float32 accumulators); no
                                   simulator twin (`tcq.py` emulates it there)
    r = hsub2(a, b)                the two halves of a minus those of b, each an IEEE half (sub.rn.f16x2)

Why: numba indexes one element per load, so a lane reading 16 contiguous bytes issues 4 loads (and a
float32 activation run of 4 issues 4), which is what capped the first kernels; and a byte turned into a
float costs a shift, a mask and an or in numba, one `prmt` here (see `fast_units.qf`: the byte lands under the
exponent 0x4B, 2^23 + byte, and one subtraction gives the exact float).

The vector loads go through the read-only (non-coherent) path: only for data no kernel writes while
it runs (weights, activations of an earlier launch). Alignment is the caller's promise: device arrays
start 256-byte aligned and `i` must be a multiple of 4 elements.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, uint32

from .device import SIM

if SIM:
    def ld4u(a, i):
        f = a.reshape(-1)
        i = int(i)
        assert i % 4 == 0, "ld4u: unaligned index"
        return f[i], f[i + 1], f[i + 2], f[i + 3]

    def ld4f(a, i):
        f = a.reshape(-1)
        i = int(i)
        assert i % 4 == 0, "ld4f: unaligned index"
        return f[i], f[i + 1], f[i + 2], f[i + 3]

    def prmt(a, b, sel):
        v = (int(b) << 32) | int(a)
        sel = int(sel)
        r = 0
        for k in range(4):
            r |= ((v >> (8 * ((sel >> (4 * k)) & 7))) & 0xFF) << (8 * k)
        return np.uint32(r)

    def h2f(u):
        return np.float32(np.uint16(int(u) & 0xFFFF).view(np.float16))

    def dp4a(a, b, c):
        va = np.array([int(a) & 0xFFFFFFFF], np.uint32).view(np.int8).astype(np.int64)
        vb = np.array([int(b) & 0xFFFFFFFF], np.uint32).view(np.int8).astype(np.int64)
        return np.int32(int(c) + int((va * vb).sum()))

    def f32_bits(v):
        return np.float32(v).view(np.uint32)

    def cp_async16(dst, i, src, j):
        i, j = int(i), int(j)
        assert i % 4 == 0 and j % 4 == 0, "cp_async16: unaligned index"
        for k in range(4):
            dst[i + k] = src[j + k]

    def cp_async_commit():
        pass

    def cp_async_wait1():
        pass

    def cp_async_wait0():
        pass

    def hsub2(a, b):
        ha = np.array([int(a) & 0xFFFFFFFF], np.uint32).view(np.float16)
        hb = np.array([int(b) & 0xFFFFFFFF], np.uint32).view(np.float16)
        return np.uint32((ha - hb).view(np.uint32)[0])

    def tf32_split(v):
        b = int(np.float32(v).view(np.uint32))
        hi = (b + 0x1000) & 0xFFFFE000 if (b & 0x7F800000) != 0x7F800000 else b   # ties away from zero
        lo = np.float32(np.float32(v) - np.uint32(hi).view(np.float32))
        return np.uint32(hi), lo.view(np.uint32)

else:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    _I16, _I32, _I64, _F32 = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()

    def elem_addr(context, builder, aryty, ary, idx):
        data = context.make_array(aryty)(context, builder, ary).data
        return builder.ptrtoint(builder.gep(data, [idx]), _I64)

    def _idx64(builder, idx, signed):
        """An integer index widened to 64 bits (sign- or zero-extended as its type says)."""
        if idx.type.width < 64:
            return builder.sext(idx, _I64) if signed else builder.zext(idx, _I64)
        return idx

    def _ld4(elem, suffix, cons):
        asm_ty = ir.LiteralStructType([elem] * 4)
        text = ("{ .reg .u64 g; cvta.to.global.u64 g, $4; "
                f"ld.global.nc.v4.{suffix} {{$0, $1, $2, $3}}, [g]; }}")
        fnty = ir.FunctionType(asm_ty, [_I64])
        return ir.InlineAsm(fnty, text, f"={cons},={cons},={cons},={cons},l", side_effect=False)

    def _make_ld4(nbtype, elem, suffix, cons):
        @intrinsic
        def ld4(typingctx, a, i):
            if not isinstance(a, types.Array) or a.dtype != nbtype or not isinstance(i, types.Integer):
                return None
            sig = types.UniTuple(nbtype, 4)(a, i)

            def codegen(context, builder, signature, args):
                idx = _idx64(builder, args[1], signature.args[1].signed)
                res = builder.call(_ld4(elem, suffix, cons), [elem_addr(context, builder, signature.args[0], args[0], idx)])
                vals = [builder.extract_value(res, k) for k in range(4)]
                return context.make_tuple(builder, signature.return_type, vals)
            return sig, codegen
        return ld4

    ld4u = _make_ld4(types.uint32, _I32, "u32", "r")
    ld4f = _make_ld4(types.float32, _F32, "f32", "f")

    @intrinsic
    def _prmt(typingctx, a, b, sel):
        sig = types.uint32(types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(_I32, [_I32, _I32, _I32])
            asm = ir.InlineAsm(fnty, "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", side_effect=False)
            return builder.call(asm, list(args))
        return sig, codegen

    @cuda.jit(device=True, inline=True)
    def prmt(a, b, sel):
        return _prmt(uint32(a), uint32(b), uint32(sel))

    @intrinsic
    def _h2f(typingctx, u):
        sig = types.float32(types.uint32)

        def codegen(context, builder, signature, args):
            h = builder.trunc(args[0], _I16)
            asm = ir.InlineAsm(ir.FunctionType(_F32, [_I16]), "cvt.f32.f16 $0, $1;", "=f,h", side_effect=False)
            return builder.call(asm, [h])
        return sig, codegen

    @cuda.jit(device=True, inline=True)
    def h2f(u):
        return _h2f(uint32(u))

    @intrinsic
    def _dp4a(typingctx, a, b, c):
        sig = types.int32(types.uint32, types.uint32, types.int32)

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(_I32, [_I32, _I32, _I32])
            asm = ir.InlineAsm(fnty, "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", side_effect=False)
            return builder.call(asm, list(args))
        return sig, codegen

    @cuda.jit(device=True, inline=True)
    def dp4a(a, b, c):
        return _dp4a(uint32(a), uint32(b), int32(c))


    @intrinsic
    def _tf32_split(typingctx, v):
        sig = types.UniTuple(types.uint32, 2)(types.float32)

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.LiteralStructType([_I32, _I32]), [_F32])
            text = ("{ .reg .b32 h; .reg .f32 hf, lf; cvt.rna.tf32.f32 h, $2; mov.b32 hf, h; "
                    "sub.rn.f32 lf, $2, hf; mov.b32 $0, h; mov.b32 $1, lf; }")
            res = builder.call(ir.InlineAsm(fnty, text, "=r,=r,f", side_effect=False), [args[0]])
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(res, k) for k in range(2)])
        return sig, codegen

    @cuda.jit(device=True, inline=True)
    def tf32_split(v):
        return _tf32_split(float32(v))

    @intrinsic
    def _f32_bits(typingctx, v):
        sig = types.uint32(types.float32)

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], _I32)
        return sig, codegen

    @cuda.jit(device=True, inline=True)
    def f32_bits(v):
        return _f32_bits(float32(v))

    @intrinsic
    def cp_async16(typingctx, dst, i, src, j):
        if not all(isinstance(a, types.Array) and a.dtype == types.uint32 for a in (dst, src)):
            return None
        sig = types.void(dst, i, src, j)

        def codegen(context, builder, signature, args):
            sa = signature.args
            d = elem_addr(context, builder, sa[0], args[0], _idx64(builder, args[1], sa[1].signed))
            g = elem_addr(context, builder, sa[2], args[2], _idx64(builder, args[3], sa[3].signed))
            text = ("{ .reg .u64 s, g; .reg .u32 s32; cvta.to.shared.u64 s, $0; cvt.u32.u64 s32, s; "
                    "cvta.to.global.u64 g, $1; cp.async.cg.shared.global [s32], [g], 16; }")
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_I64, _I64]), text, "l,l,~{memory}", side_effect=True)
            builder.call(asm, [d, g])
            return context.get_dummy_value()
        return sig, codegen

    def _asm_void(text):
        @intrinsic
        def f(typingctx):
            def codegen(context, builder, signature, args):
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()
            return types.void(), codegen
        return f

    cp_async_commit = _asm_void("cp.async.commit_group;")
    cp_async_wait1 = _asm_void("cp.async.wait_group 1;")
    cp_async_wait0 = _asm_void("cp.async.wait_group 0;")

    def _mma_intrinsic(shape_types: str):
        """A warp-wide mma.sync.aligned.<shape_types> with four 32-bit A and two B registers, float32 C and D."""
        text = (f"mma.sync.aligned.{shape_types} "
                "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")

        @intrinsic
        def f(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            sig = types.UniTuple(types.float32, 4)(*([types.uint32] * 6 + [types.float32] * 4))

            def codegen(context, builder, signature, args):
                fnty = ir.FunctionType(ir.LiteralStructType([_F32] * 4), [_I32] * 6 + [_F32] * 4)
                asm = ir.InlineAsm(fnty, text, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", side_effect=False)
                res = builder.call(asm, list(args))
                return context.make_tuple(builder, signature.return_type,
                                          [builder.extract_value(res, k) for k in range(4)])
            return sig, codegen
        return f

    _mma_tf32 = _mma_intrinsic("m16n8k8.row.col.f32.tf32.tf32.f32")
    _mma_f16 = _mma_intrinsic("m16n8k16.row.col.f32.f16.f16.f32")

    @cuda.jit(device=True, inline=True)
    def mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return _mma_tf32(uint32(a0), uint32(a1), uint32(a2), uint32(a3), uint32(b0), uint32(b1),
                         float32(c0), float32(c1), float32(c2), float32(c3))

    @cuda.jit(device=True, inline=True)
    def mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        return _mma_f16(uint32(a0), uint32(a1), uint32(a2), uint32(a3), uint32(b0), uint32(b1),
                        float32(c0), float32(c1), float32(c2), float32(c3))

    @intrinsic
    def _hsub2(typingctx, a, b):
        sig = types.uint32(types.uint32, types.uint32)

        def codegen(context, builder, signature, args):
            asm = ir.InlineAsm(ir.FunctionType(_I32, [_I32, _I32]), "sub.rn.f16x2 $0, $1, $2;", "=r,r,r",
                               side_effect=False)
            return builder.call(asm, list(args))
        return sig, codegen

    @cuda.jit(device=True, inline=True)
    def hsub2(a, b):
        return _hsub2(uint32(a), uint32(b))


__all__ = ["ld4u", "ld4f", "prmt", "h2f", "dp4a", "tf32_split", "f32_bits", "mma_tf32", "mma_f16", "hsub2",
           "cp_async16", "cp_async_commit", "cp_async_wait1", "cp_async_wait0"]
