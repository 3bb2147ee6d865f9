"""quant/cuda/rows.py: ggml_get_rows decoded on the device from device token ids, against quant.ref.dequantize_rows,
bit for bit (the same decoders as the products), for float, legacy, k-quant and table types; in numba's CUDA
simulator on toy sizes (CI) and on a GPU when there is one."""
import numpy as np
import pytest

pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

from quant import GGMLType, dequantize_rows  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("t", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_1", "Q4_K", "Q6_K", "IQ4_NL"])
def test_rows_equal_the_reference(t):
    if not qc.available():
        pytest.skip("no GPU and no simulator")
    from numba import cuda

    from quant.cuda.rows import get_rows_device
    from quant.cuda.testdata import random_qtensor
    from quant.cuda.weights import device_weight
    rng = np.random.default_rng(5)
    t = GGMLType[t]
    w = random_qtensor(t, (7, 256), rng, "token_embd.weight")
    ids = np.array([3, 0, 6, 3], dtype=np.int64)
    out = cuda.device_array((ids.size, 256), dtype=np.float32)
    get_rows_device(device_weight(w).ensure(), cuda.to_device(ids), out)
    assert np.array_equal(out.copy_to_host(), dequantize_rows(w, ids)), t.name


@pytest.mark.parametrize("decode", ["rows", "staged"])
@pytest.mark.parametrize("t,shape,rows,grid_y", [("Q4_K", (40, 768), 16, 65535), ("Q4_K", (3, 10, 256), 12, 7),
                                                 ("Q8_0", (20, 1280), 8, 65535), ("Q6_K", (6, 512), 4, 3)])
def test_decoded_chunks_equal_the_reference(t, shape, rows, grid_y, decode, monkeypatch):
    """dequant_gemm.decoded_chunks (the prefill's cuBLAS path): a weight decoded `rows` rows at a time into one
    scratch buffer, each launch at most `grid_y` rows (the grid.y limit, made small here), == quant.ref.dequantize bit
    for bit, chunk by chunk (2-D, and 3-D seen as [E * O, I]); by either decoder (`ops.SGEMM_DECODE`: the staged one
    with a row of fewer quant blocks than a CUDA block holds, and of more)."""
    if not qc.available():
        pytest.skip("no GPU and no simulator")
    from numba import cuda

    from quant import dequantize
    from quant.cuda import dequant_gemm, ops
    from quant.cuda.testdata import random_qtensor
    from quant.cuda.weights import device_weight
    monkeypatch.setattr(dequant_gemm, "GRID_Y", grid_y)
    monkeypatch.setattr(dequant_gemm, "_SCRATCH", {})
    monkeypatch.setattr(ops, "SGEMM_DECODE", decode)
    assert decode == "rows" or dequant_gemm.staged_kernel(GGMLType[t]) is not None
    w = random_qtensor(GGMLType[t], shape, np.random.default_rng(9), "blk.0.ffn_up.weight")
    ref = dequantize(w).reshape(-1, shape[-1])
    seen = []
    for r0, r1, W in dequant_gemm.decoded_chunks(device_weight(w).ensure(), lambda n: cuda.device_array(n, np.float32),
                                                 lambda a: a, rows=rows):
        assert np.array_equal(W.copy_to_host(), ref[r0:r1]), (r0, r1)
        seen.append((r0, r1))
    assert seen[0][0] == 0 and seen[-1][1] == ref.shape[0] and all(a[1] == b[0] for a, b in zip(seen, seen[1:]))
