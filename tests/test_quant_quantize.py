"""NumPy quantizers bit-exact with ggml's reference quantizers (`ggml_quantize_chunk` without importance
matrix; `quantize_row_q8_1_ref` / `quantize_row_q8_K_ref` for the two activation types it does not offer).

Inputs are chosen to reach every branch of the C code: Gaussian, heavy-tailed, all positive (the min
clamp of the K-quants), mostly zeros, tiny (near GROUP_MAX_EPS), small integers (exact rounding ties),
constant rows and all-zero rows. On failure: the first differing block with both byte strings.
"""
import numpy as np
import pytest

from quant import GGMLType, TYPES
from quant import ggml as qggml
from quant.quantize import NUMPY_QUANTIZERS, QuantizeError, quantize

pytestmark = pytest.mark.oracle

KINDS = ["normal", "heavy", "positive", "sparse", "tiny", "integers", "constant", "zeros", "ties"]


def inputs(kind: str, rows: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal((rows, n)).astype(np.float32)
    if kind == "heavy":
        return rng.standard_t(2, (rows, n)).astype(np.float32)
    if kind == "positive":
        return (np.abs(rng.standard_normal((rows, n))) + 0.5).astype(np.float32)
    if kind == "sparse":
        x = rng.standard_normal((rows, n)).astype(np.float32)
        x[rng.random((rows, n)) < 0.8] = 0
        return x
    if kind == "tiny":
        return (rng.standard_normal((rows, n)) * 1e-12).astype(np.float32)
    if kind == "integers":
        return rng.integers(-8, 9, (rows, n)).astype(np.float32)
    if kind == "constant":
        return np.repeat(rng.standard_normal((rows, 1)), n, axis=1).astype(np.float32)
    if kind == "zeros":
        return np.zeros((rows, n), dtype=np.float32)
    if kind == "ties":      # halves of a power of two: x * 127 / max lands on .5 often
        return (rng.integers(-254, 255, (rows, n)) / 4).astype(np.float32)
    raise ValueError(kind)


def ggml_reference(x: np.ndarray, t: GGMLType) -> np.ndarray:
    if t in (GGMLType.Q8_1, GGMLType.Q8_K):
        from quant import ggml_cpu
        return ggml_cpu.quantize_row_ref(x, t)
    return qggml.quantize(x, t)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("t", list(NUMPY_QUANTIZERS), ids=lambda t: t.name)
def test_bit_exact(t, kind):
    info = TYPES[t]
    n = 2 * max(256, info.block_size)
    x = inputs(kind, 24, n, seed=int(t) * 31 + KINDS.index(kind))
    ref = ggml_reference(x, t).reshape(-1, info.type_size)
    got = quantize(x, t).reshape(-1, info.type_size)
    bad = np.flatnonzero((ref != got).any(axis=1))
    if bad.size:
        b = int(bad[0])
        xb = x.reshape(-1, info.block_size)[b]
        pytest.fail(f"{t.name} on {kind} input: {bad.size} of {ref.shape[0]} blocks differ; first block {b}\n"
                    f"ggml: {ref[b].tobytes().hex()}\nours: {got[b].tobytes().hex()}\ninput: {xb.tolist()}")


@pytest.mark.parametrize("t", [GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_float_types(t):
    x = inputs("heavy", 16, 512, seed=3) * np.float32(1e4)
    x[0, :4] = [65504.0, 65520.0, 1e-8, -3e-6]           # fp16 overflow / subnormal edges
    assert np.array_equal(quantize(x, t), qggml.quantize(x, t).reshape(16, -1))


def test_refuses_nonfinite_and_bad_rows():
    x = np.ones((2, 256), dtype=np.float32)
    x[1, 7] = np.nan
    with pytest.raises(QuantizeError, match="blk.0.attn_q.weight.*NaN"):
        quantize(x, GGMLType.Q4_K, name="blk.0.attn_q.weight")
    with pytest.raises(QuantizeError, match="do not fit Q4_K blocks of 256"):
        quantize(np.ones((2, 96), dtype=np.float32), GGMLType.Q4_K)


def test_iq_types_go_through_ggml():
    x = inputs("normal", 4, 256, seed=5)
    with pytest.raises(QuantizeError, match="importance matrix"):
        quantize(x, GGMLType.IQ2_XXS)
    ones = np.ones(256, dtype=np.float32)
    assert np.array_equal(quantize(x, GGMLType.IQ2_XXS, imatrix=ones), qggml.quantize(x, GGMLType.IQ2_XXS, ones))
    assert np.array_equal(quantize(x, GGMLType.IQ4_XS), qggml.quantize(x, GGMLType.IQ4_XS))
