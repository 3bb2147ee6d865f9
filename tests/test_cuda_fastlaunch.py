"""quant/cuda/fastlaunch.py: numba-cuda launches through the short path give what numba's own path gives (a strided
array's by the kernel numba compiled for any layout), and whatever the short path does not serve (a host array)
still goes through numba. Needs a GPU."""
import numpy as np
import pytest

pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

pytestmark = pytest.mark.cuda
GPU = not qc.SIM and qc.available()


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_short_path_equals_numba():
    cp = pytest.importorskip("cupy")
    from numba import cuda

    from quant.cuda import fastlaunch
    from quant.cuda.streams import current_stream, numba_view

    @cuda.jit
    def axpy(x, y, out, a, n):
        i = cuda.grid(1)
        if i < n:
            out[i] = a * x[i] + y[i]

    @cuda.jit
    def rowsum(m, out, scale):
        r = cuda.grid(1)
        if r < m.shape[0]:
            s = 0.0
            for j in range(m.shape[1]):
                s += m[r, j]
            out[r] = s * scale
    assert fastlaunch.install()
    rng = np.random.default_rng(0)
    st = current_stream()
    for n in (100, 1000, 37):                  # the first launch compiles (numba's path), the others are short
        x, y = (cp.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(2))
        out = cp.zeros(n, np.float32)
        before = dict(fastlaunch.stats)
        axpy[(n + 63) // 64, 64, st](x, numba_view(y), out, np.float32(2.5), n)
        cp.testing.assert_allclose(out, 2.5 * x + y, rtol=1e-6, atol=1e-6)   # (the kernel's fma)
        if n != 100:
            assert fastlaunch.stats["short"] == before["short"] + 1
    m = cp.asarray(rng.standard_normal((8, 12)).astype(np.float32))
    # C-contiguous, strided (numba compiles layout "A"), C again, strided and Fortran order (both now short, by the
    # "A" kernel), a row of a wider matrix (a size-1 dimension: the C kernel, short)
    for k, a in enumerate((m, m[:, ::2], m.T.copy(), m[:, 3:9], m.T, m[2:3, 1:7])):
        out = cp.zeros(a.shape[0], np.float32)
        before = dict(fastlaunch.stats)
        rowsum[1, 32, st](a, out, 0.5)
        cp.testing.assert_allclose(out, 0.5 * a.sum(1), rtol=1e-5)
        if k >= 2:
            assert fastlaunch.stats["short"] == before["short"] + 1, k
    v = numba_view(cp.ones(64, np.float32))                   # a view of a temporary keeps its memory
    w = cp.zeros(64, np.float32)
    axpy[1, 64, st](v, w, w, np.float32(1.0), 64)
    cp.testing.assert_array_equal(w, cp.ones(64, np.float32))
    for scale in (0.5, np.float32(0.5), np.float64(0.25), 0.25):   # a Python float and NumPy scalars: three signatures
        out = cp.zeros(8, np.float32)
        rowsum[1, 32, st](m, out, scale)
        cp.testing.assert_allclose(out, float(scale) * m.sum(1), rtol=1e-5)
    host = np.zeros(8, np.float32)                            # a host array: numba copies it in and back
    rowsum[1, 32, st](m, host, 1.0)
    np.testing.assert_allclose(host, m.sum(1).get(), rtol=1e-5)
