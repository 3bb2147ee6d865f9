"""quant/cuda/hgemm.py: the prefill's 3xFP16 products (each float32 operand split into two float16 halves, three
tensor-core products, float32 sums) against float64 products of quant.ref's weights. In numba's CUDA simulator on
toy sizes (CI: NumPy stands in for cuBLAS, so the split, the chunking and the combine are what is checked), and on
a GPU with cuBLAS when there is one (there the tensor core's own sums are in the result)."""
import numpy as np
import pytest

pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

from numerics import rel_rms  # noqa: E402
from quant import GGMLType, ref  # noqa: E402

pytestmark = pytest.mark.cuda
GPU = not qc.SIM and qc.available()


def _xp():
    if GPU:
        return pytest.importorskip("cupy")
    return np


def _dev(a):
    xp = _xp()
    return xp.asarray(a)


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def test_split_rows_reconstructs_each_row():
    """hi + lo == v * 2^s to float16's two halves (|error| <= 2^-22 of the row's largest |v| scaled, i.e. <= 2^-7
    absolute, plus float16's subnormal spacing); s puts the row's largest |v| in [2^14, 2^15); a row of zeros gets
    s = 0; NaN and inf reach hi."""
    if not qc.available():
        pytest.skip("no GPU and no simulator")
    from quant.cuda.hgemm import split_rows
    rng = np.random.default_rng(1)
    src = rng.standard_normal((6, 96)).astype(np.float32)
    src[1] *= 1e-6                                    # small rows scaled up, large ones down
    src[2] *= 3e4
    src[3] = 0.0
    src[4, 7] = np.nan
    src[5, 3] = np.inf
    hl = _dev(np.zeros((2, 6, 96), np.float16))
    e = _dev(np.zeros(6, np.int32))
    split_rows(_dev(src), hl, e, 1)
    hl, e = _host(hl).astype(np.float64), _host(e)
    lo, hi = hl[0], hl[1]
    for r in (0, 1, 2):
        v = np.ldexp(src[r].astype(np.float64), int(e[r]))
        assert 2.0 ** 14 <= np.max(np.abs(v)) < 2.0 ** 15, (r, e[r])
        assert np.max(np.abs(hi[r] + lo[r] - v)) <= 2.0 ** 15 * 2.0 ** -22 + 2.0 ** -25, r
        assert np.max(np.abs(hi[r] - v)) > 0.0        # lo carries the bits hi lacks
    assert e[3] == 0 and not np.any(hi[3]) and not np.any(lo[3])
    assert np.isnan(hi[4, 7]) and np.isinf(hi[5, 3])


@pytest.mark.parametrize("K,kc,rows", [(256, 64, 16), (256, 256, 40), (512, 192, 16)])
def test_dense_h3_equals_the_reference(K, kc, rows):
    """y = x @ W.T on the 3xFP16 path, whole and in row chunks, K in chunks of kc (one with a tail): within relative
    RMS 1e-6 of the float64 product (float32 summation and the dropped lo . lo term only)."""
    if not qc.available():
        pytest.skip("no GPU and no simulator")
    from quant.cuda.hgemm import dense_h3
    from quant.cuda.testdata import random_qtensor
    from quant.cuda.weights import device_weight
    rng = np.random.default_rng(K + kc)
    w = random_qtensor(GGMLType.Q4_K, (40, K), rng, "blk.0.ffn_up.weight")
    x = (rng.standard_normal((9, K)) * 30).astype(np.float32)
    y = _dev(np.full((9, 40), np.nan, np.float32))
    dense_h3(device_weight(w).ensure(), _dev(x), y, kc=kc, rows=rows)
    want = x.astype(np.float64) @ ref.dequantize(w).astype(np.float64).T
    assert rel_rms(_host(y), want) <= 1e-6


def test_heads_h3_equals_the_reference():
    """Per-head products [H, T, O] on the 3xFP16 path, two heads a chunk, K in two chunks."""
    if not qc.available():
        pytest.skip("no GPU and no simulator")
    from quant.cuda.hgemm import heads_h3
    from quant.cuda.testdata import random_qtensor
    from quant.cuda.weights import device_weight
    rng = np.random.default_rng(7)
    wh = random_qtensor(GGMLType.Q4_K, (4, 16, 256), rng, "blk.0.attn_k_b.weight")
    xh = rng.standard_normal((4, 9, 256)).astype(np.float32)
    yh = _dev(np.full((4, 9, 16), np.nan, np.float32))
    heads_h3(device_weight(wh).ensure(), _dev(xh), yh, kc=128, rows=2 * 16)
    want = np.einsum("hti,hoi->hto", xh.astype(np.float64), ref.dequantize(wh).astype(np.float64))
    assert rel_rms(_host(yh), want) <= 1e-6


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (cuBLAS's tensor cores)")
@pytest.mark.parametrize("kc", [256, 512])
def test_h3_long_rows_on_the_tensor_cores(kc):
    """At a real row length (K = 14336: DeepSeek-V3's expert width x7, Llama's FFN) the tensor core's truncating
    sums are what the K chunks bound: relative RMS <= 2e-6 of the float64 product at each chunk size (the figure
    printed: KernelPolicy.h3_kc is chosen from it)."""
    cp = pytest.importorskip("cupy")
    from quant.cuda.hgemm import dense_h3
    from quant.cuda.testdata import random_qtensor
    from quant.cuda.weights import device_weight
    rng = np.random.default_rng(11)
    w = random_qtensor(GGMLType.Q4_K, (256, 14336), rng, "blk.0.ffn_down.weight")
    x = rng.standard_normal((160, 14336)).astype(np.float32)
    y = cp.empty((160, 256), np.float32)
    dense_h3(device_weight(w).ensure(), cp.asarray(x), y, kc=kc)
    err = rel_rms(y.get(), x.astype(np.float64) @ ref.dequantize(w).astype(np.float64).T)
    assert err <= 2e-6, (kc, err)
