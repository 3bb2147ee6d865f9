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
