"""ctypes access to the ggml libraries bundled with llama-cpp-python (optional: only tests, the oracle,
and quantizing to types NumPy cannot produce need it).

    lib()                          -> the loaded libggml-base (raises GGMLUnavailable if not installed)
    quantize(x, type)              -> packed bytes, by ggml's own reference quantizer (`ggml_quantize_chunk`)
    to_float(raw, type, n)         -> float32, by ggml's own decoder (`type_traits.to_float`)
    tensor_view(ptr)               -> (name, type, ne, nb) of a `struct ggml_tensor *`
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
from functools import lru_cache

import numpy as np

from .formats import GGMLType, type_info

GGML_MAX_DIMS = 4
GGML_MAX_OP_PARAMS = 64
GGML_MAX_SRC = 10
GGML_MAX_NAME = 64


class GGMLUnavailable(RuntimeError):
    """llama-cpp-python (which bundles libggml) is not installed."""


class GGMLTensor(ctypes.Structure):
    """`struct ggml_tensor` (ggml/include/ggml.h of llama.cpp vendored in llama-cpp-python 0.3.36)."""
    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


class TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)


def lib_dir() -> str:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise GGMLUnavailable("llama-cpp-python is not installed (pip install 'llama-cpp-python==0.3.36')")
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


@lru_cache(maxsize=None)
def lib(name: str = "ggml-base") -> ctypes.CDLL:
    path = os.path.join(lib_dir(), f"lib{name}.so")
    if not os.path.exists(path):
        raise GGMLUnavailable(f"{path} not found; reinstall llama-cpp-python==0.3.36")
    L = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    if name == "ggml-base":
        L.ggml_quantize_chunk.restype = ctypes.c_size_t
        L.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p,
                                          ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_float)]
        L.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
        L.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
        L.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
        L.ggml_get_type_traits.argtypes = [ctypes.c_int]
        L.ggml_backend_tensor_get.restype = None
        L.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        L.ggml_nbytes.restype = ctypes.c_size_t
        L.ggml_nbytes.argtypes = [ctypes.c_void_p]
        L.ggml_get_name.restype = ctypes.c_char_p
        L.ggml_get_name.argtypes = [ctypes.c_void_p]
    return L


def available() -> bool:
    try:
        lib()
        return True
    except (GGMLUnavailable, OSError):
        return False


def requires_imatrix(t) -> bool:
    return bool(lib().ggml_quantize_requires_imatrix(int(type_info(t).type)))


def quantize(x: np.ndarray, t, imatrix: np.ndarray | None = None) -> np.ndarray:
    """x: float32 [..., n] -> packed uint8 [..., row_bytes] by ggml's reference quantizer."""
    info = type_info(t)
    x = np.ascontiguousarray(x, dtype=np.float32)
    n = x.shape[-1]
    rows = int(np.prod(x.shape[:-1], dtype=np.int64)) if x.ndim > 1 else 1
    out = np.empty((rows, info.row_bytes(n)), dtype=np.uint8)
    imp = None
    if imatrix is not None:
        imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
        imp = imatrix.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    elif requires_imatrix(info.type):
        raise ValueError(f"ggml's {info.type.name} quantizer needs an importance matrix")
    size = lib().ggml_quantize_chunk(int(info.type), x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                     out.ctypes.data, 0, rows, n, imp)
    assert size == out.nbytes, (size, out.nbytes)
    return out.reshape(*x.shape[:-1], -1)


def to_float(raw: np.ndarray, t, n: int) -> np.ndarray:
    """Decode `n` elements of packed bytes with ggml's own `to_float` for type t."""
    info = type_info(t)
    tr = lib().ggml_get_type_traits(int(info.type)).contents
    if not tr.to_float:
        raise ValueError(f"ggml has no to_float for {info.type.name}")
    raw = np.ascontiguousarray(raw).view(np.uint8)
    out = np.empty(n, dtype=np.float32)
    TO_FLOAT(tr.to_float)(raw.ctypes.data, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n)
    return out


def tensor_view(ptr) -> GGMLTensor:
    return ctypes.cast(ptr, ctypes.POINTER(GGMLTensor)).contents


def read_tensor(ptr) -> tuple[str, np.ndarray] | None:
    """Copy a computed graph tensor (F32 / I32 / F16, contiguous or strided) into NumPy order [ne3, ne2, ne1, ne0]."""
    t = tensor_view(ptr)
    name = t.name.decode("utf-8", errors="replace")
    dt = {int(GGMLType.F32): np.float32, int(GGMLType.I32): np.int32, int(GGMLType.F16): np.float16}.get(t.type)
    if dt is None:
        return None
    ne = [int(t.ne[i]) for i in range(GGML_MAX_DIMS)]
    nb = [int(t.nb[i]) for i in range(GGML_MAX_DIMS)]
    if min(ne) <= 0:
        return name, np.zeros([0], dtype=dt)
    item = np.dtype(dt).itemsize
    span = sum((ne[i] - 1) * nb[i] for i in range(GGML_MAX_DIMS)) + item     # bytes from first to last element
    buf = np.empty(-(-span // item), dtype=dt)
    lib().ggml_backend_tensor_get(ptr, buf.ctypes.data, 0, span)
    arr = np.lib.stride_tricks.as_strided(buf, shape=tuple(reversed(ne)), strides=tuple(reversed(nb)))
    return name, np.array(arr, dtype=np.float32 if dt == np.float16 else dt)
