"""llama.cpp's own CPU matmul, driven through ctypes on the libggml that llama-cpp-python bundles.

    GGMLMulMat(raw, type, O, I, T, n_threads)   builds  y = ggml_mul_mat(W, X)  once:
        W: ggml tensor ne = {I, O} of `type` holding the packed bytes `raw` ([O, row_bytes])
        X: f32 ne = {I, T};  y: f32 ne = {O, T}
    .run(x) -> y [T, O]       one `ggml_graph_compute_with_ctx` (ggml quantizes x to the weight's
                              vec_dot_type inside, exactly as in llama.cpp inference)

With share=True the weight tensor reads `raw` in place (its `data` pointer set to the NumPy buffer),
so a comparison with another engine reads the very same pages (same TLB and huge-page luck).

This is the plain ggml-cpu path (`ggml_compute_forward_mul_mat`), the one `test-backend-ops -b CPU`
measures; no repacked (CPU_REPACK) buffers.
"""
from __future__ import annotations

import ctypes

import numpy as np

from quant import ggml as qggml
from quant.formats import type_info


class InitParams(ctypes.Structure):
    """`struct ggml_init_params` (ggml/include/ggml.h)."""
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _libs():
    base = qggml.lib("ggml-base")
    cpu = qggml.lib("ggml-cpu")
    vp = ctypes.c_void_p
    base.ggml_init.restype = vp
    base.ggml_init.argtypes = [InitParams]
    base.ggml_free.argtypes = [vp]
    base.ggml_new_tensor_2d.restype = vp
    base.ggml_new_tensor_2d.argtypes = [vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_mul_mat.restype = vp
    base.ggml_mul_mat.argtypes = [vp, vp, vp]
    base.ggml_new_graph.restype = vp
    base.ggml_new_graph.argtypes = [vp]
    base.ggml_build_forward_expand.argtypes = [vp, vp]
    base.ggml_set_no_alloc.argtypes = [vp, ctypes.c_bool]
    base.ggml_tensor_overhead.restype = ctypes.c_size_t
    base.ggml_graph_overhead.restype = ctypes.c_size_t
    cpu.ggml_cpu_init.argtypes = []
    cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]
    cpu.ggml_cpu_init()
    return base, cpu


class GGMLMulMat:
    def __init__(self, raw: np.ndarray, ggml_type, O: int, I: int, T: int = 1, n_threads: int = 2,
                 share: bool = False):
        self.base, self.cpu = _libs()
        info = type_info(ggml_type)
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        assert raw.size == O * info.row_bytes(I), (raw.size, O, I)
        self.O, self.I, self.T, self.n_threads = O, I, T, n_threads
        # weights (unless shared) + activations + result + the work buffer (activations quantized)
        mem = (0 if share else raw.size) + 4 * I * T * 3 + 4 * O * T + 8 * self.base.ggml_tensor_overhead() \
            + self.base.ggml_graph_overhead() + (64 << 20)
        self.ctx = self.base.ggml_init(InitParams(mem, None, False))
        if not self.ctx:
            raise MemoryError(f"ggml_init({mem} bytes) failed")
        if share:                                   # a data-less weight tensor pointing at `raw`
            self.base.ggml_set_no_alloc(self.ctx, True)
            self.w = self.base.ggml_new_tensor_2d(self.ctx, int(info.type), I, O)
            self.base.ggml_set_no_alloc(self.ctx, False)
            qggml.tensor_view(self.w).data = raw.ctypes.data
            self._raw = raw                         # keep the buffer alive
        else:
            self.w = self.base.ggml_new_tensor_2d(self.ctx, int(info.type), I, O)
        self.x = self.base.ggml_new_tensor_2d(self.ctx, 0, I, T)                 # GGML_TYPE_F32
        self.y = self.base.ggml_mul_mat(self.ctx, self.w, self.x)
        self.gf = self.base.ggml_new_graph(self.ctx)
        self.base.ggml_build_forward_expand(self.gf, self.y)
        if not share:
            ctypes.memmove(qggml.tensor_view(self.w).data, raw.ctypes.data, raw.size)
        self._xp = qggml.tensor_view(self.x).data
        self._yp = qggml.tensor_view(self.y).data

    def run(self, x: np.ndarray) -> np.ndarray:
        """x: [T, I] float32 -> [T, O] float32."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        assert x.shape == (self.T, self.I), x.shape
        ctypes.memmove(self._xp, x.ctypes.data, x.nbytes)
        st = self.cpu.ggml_graph_compute_with_ctx(self.ctx, self.gf, self.n_threads)
        if st != 0:
            raise RuntimeError(f"ggml_graph_compute_with_ctx returned status {st}")
        y = np.empty((self.T, self.O), dtype=np.float32)
        ctypes.memmove(y.ctypes.data, self._yp, y.nbytes)
        return y

    def close(self):
        if self.ctx:
            self.base.ggml_free(self.ctx)
            self.ctx = None

    def __del__(self):
        self.close()
