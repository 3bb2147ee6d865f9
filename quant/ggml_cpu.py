"""ctypes access to what ggml's CPU backend does, for tests and for llama.cpp mode's platform check.

    features()                    -> {"avx": True, "avx2": ..., "avx512": ..., "llamafile": ...} of libggml-cpu
    vec_dot_type(t)               -> the activation type ggml-cpu pairs weight type t with (type_traits_cpu)
    from_float(x, t)              -> x [R, n] quantized by ggml-cpu's own `from_float` of type t
                                     (quantize_row_q8_0 / _q8_1 / _q8_K, fp32->fp16, fp32->bf16)
    quantize_mat(x, t, inter)     -> 4 rows quantized by the repack path's `ggml_quantize_mat_t<inter, t>`
                                     (block_q8_0x4 / block_q8_Kx4 layout)
    quantize_row_ref(x, t)        -> libggml-base's `quantize_row_<t>_ref` (Q8_1 and Q8_K, which
                                     `ggml_quantize_chunk` does not offer)
    dequantize_row(raw, t, n)     -> libggml-base's `dequantize_row_<t>` (Q8_K has no to_float trait)
    mul_mat(w, x, n_threads)      -> ggml_mul_mat(w, x) computed by ggml-cpu (no repacking: context memory)

All of it needs llama-cpp-python's bundled libraries (`quant.ggml.lib_dir()`).
"""
from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

from . import ggml as _g
from .formats import GGMLType, type_info

FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
FEATURES = ("sse3", "ssse3", "avx", "avx2", "avx_vnni", "f16c", "fma", "avx512", "avx512_vbmi",
            "avx512_vnni", "avx512_bf16", "amx_int8", "neon", "dotprod", "matmul_int8", "sve", "llamafile")


class TypeTraitsCPU(ctypes.Structure):
    """`struct ggml_type_traits_cpu` (ggml/include/ggml-cpu.h)."""
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


class InitParams(ctypes.Structure):
    """`struct ggml_init_params` (ggml/include/ggml.h)."""
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@lru_cache(maxsize=None)
def cpu() -> ctypes.CDLL:
    """libggml-cpu, initialized (`ggml_cpu_init`)."""
    base = _g.lib()
    L = _g.lib("ggml-cpu")
    L.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCPU)
    L.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    L.ggml_cpu_init.restype = None
    L.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    L.ggml_graph_compute_with_ctx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    base.ggml_init.restype = ctypes.c_void_p
    base.ggml_init.argtypes = [InitParams]
    base.ggml_free.argtypes = [ctypes.c_void_p]
    base.ggml_new_tensor_2d.restype = ctypes.c_void_p
    base.ggml_new_tensor_2d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_mul_mat.restype = ctypes.c_void_p
    base.ggml_mul_mat.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    base.ggml_new_graph.restype = ctypes.c_void_p
    base.ggml_new_graph.argtypes = [ctypes.c_void_p]
    base.ggml_build_forward_expand.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    base.ggml_graph_overhead.restype = ctypes.c_size_t
    base.ggml_tensor_overhead.restype = ctypes.c_size_t
    L.ggml_cpu_init()
    return L


@lru_cache(maxsize=None)
def features() -> dict[str, bool]:
    """The SIMD features libggml-cpu was built with and runs on (`ggml_cpu_has_*`)."""
    L = cpu()
    out = {}
    for f in FEATURES:
        fn = getattr(L, f"ggml_cpu_has_{f}", None)
        if fn is not None:
            fn.restype = ctypes.c_int
            out[f] = bool(fn())
    return out


def _traits(t) -> TypeTraitsCPU:
    return cpu().ggml_get_type_traits_cpu(int(type_info(t).type)).contents


def vec_dot_type(t) -> GGMLType:
    """`type_traits_cpu[t].vec_dot_type` as compiled into libggml-cpu."""
    return GGMLType(_traits(t).vec_dot_type)


def _packed(x: np.ndarray, t) -> tuple[np.ndarray, np.ndarray]:
    info = type_info(t)
    x = np.ascontiguousarray(x, dtype=np.float32)
    x2 = x.reshape(-1, x.shape[-1])
    return x2, np.zeros((x2.shape[0], info.row_bytes(x2.shape[1])), dtype=np.uint8)


def from_float(x: np.ndarray, t) -> np.ndarray:
    """x float32 [R, n] -> [R, row_bytes] packed by ggml-cpu's `type_traits_cpu[t].from_float`, one call per row
    (as `ggml_compute_forward_mul_mat` does on one thread)."""
    fn = _traits(t).from_float
    if not fn:
        raise ValueError(f"ggml-cpu has no from_float for {type_info(t).type.name}")
    f = FROM_FLOAT(fn)
    x2, out = _packed(x, t)
    for r in range(x2.shape[0]):
        f(x2[r].ctypes.data, out[r].ctypes.data, x2.shape[1])
    return out


def quantize_mat(x: np.ndarray, t, interleave: int) -> np.ndarray:
    """x float32 [4, n] -> bytes of `ggml_quantize_mat_t<interleave, t>` (repack.cpp): 4 rows interleaved
    into block_q8_0x4 (t = Q8_0) or block_q8_Kx4 (t = Q8_K)."""
    t = type_info(t).type
    sym = f"_Z19ggml_quantize_mat_tILl{interleave}EL9ggml_type{int(t)}EEvPKfPvll"
    fn = getattr(cpu(), sym, None)
    if fn is None:
        raise ValueError(f"libggml-cpu does not export ggml_quantize_mat_t<{interleave}, {t.name}>")
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    x = np.ascontiguousarray(x, dtype=np.float32)
    assert x.ndim == 2 and x.shape[0] == 4, x.shape
    out = np.zeros(4 * type_info(t).row_bytes(x.shape[1]), dtype=np.uint8)
    fn(x.ctypes.data, out.ctypes.data, 4, x.shape[1])
    return out


def quantize_row_ref(x: np.ndarray, t) -> np.ndarray:
    """x float32 [R, n] -> packed bytes by libggml-base's `quantize_row_<t>_ref`."""
    name = type_info(t).type.name.lower().replace("_k", "_K")
    fn = getattr(_g.lib(), f"quantize_row_{name}_ref")
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x2, out = _packed(x, t)
    fn(x2.ctypes.data, out.ctypes.data, x2.size)
    return out


def dequantize_row(raw: np.ndarray, t, n: int) -> np.ndarray:
    """`dequantize_row_<t>(raw, y, n)` of libggml-base -> float32 [n]."""
    name = type_info(t).type.name.lower().replace("_k", "_K")
    fn = getattr(_g.lib(), f"dequantize_row_{name}")
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    raw = np.ascontiguousarray(raw).view(np.uint8)
    out = np.empty(n, dtype=np.float32)
    fn(raw.ctypes.data, out.ctypes.data, n)
    return out


def mul_mat(w_raw: np.ndarray, wtype, shape: tuple[int, int], x: np.ndarray, n_threads: int = 1) -> np.ndarray:
    """ggml-cpu's `ggml_mul_mat(w, x)`: w packed [O, row_bytes] of type wtype with logical shape (O, I),
    x float32 [T, I] -> [T, O]. Tensors live in a plain ggml context, so no repacked layout is used."""
    L, base = cpu(), _g.lib()
    info = type_info(wtype)
    O, I = shape
    x = np.ascontiguousarray(x, dtype=np.float32)
    T = x.shape[0]
    w_raw = np.ascontiguousarray(w_raw).view(np.uint8)
    assert w_raw.size == O * info.row_bytes(I), (w_raw.size, O, I)
    mem = (w_raw.nbytes + 6 * x.nbytes + 4 * T * O + base.ggml_graph_overhead()
           + 8 * base.ggml_tensor_overhead() + (16 << 20))
    ctx = base.ggml_init(InitParams(mem, None, False))
    if not ctx:
        raise MemoryError("ggml_init failed")
    try:
        a = base.ggml_new_tensor_2d(ctx, int(info.type), I, O)
        b = base.ggml_new_tensor_2d(ctx, int(GGMLType.F32), I, T)
        c = base.ggml_mul_mat(ctx, a, b)
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, c)
        ctypes.memmove(_g.tensor_view(a).data, w_raw.ctypes.data, w_raw.nbytes)
        ctypes.memmove(_g.tensor_view(b).data, x.ctypes.data, x.nbytes)
        rc = L.ggml_graph_compute_with_ctx(ctx, gf, n_threads)
        if rc != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx returned {rc}")
        y = np.empty((T, O), dtype=np.float32)
        ctypes.memmove(y.ctypes.data, _g.tensor_view(c).data, y.nbytes)
        return y
    finally:
        base.ggml_free(ctx)
