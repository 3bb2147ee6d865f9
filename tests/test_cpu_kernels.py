"""quant.cpu (Numba kernels) against the NumPy oracle (quant.ref), for every type it decodes.

- The naive block decoders (quant.cpu.dequantize) are bit-exact with quant.ref.dequantize.
- matmul: GEMV (T = 1, 2, 3: the fused kernels), batches T = 8, 20 (decode-to-scratch), and the
  dequantize + BLAS path; rows that are not a multiple of the row tile, a single row, rows whose
  32-blocks do not fill a group of 8. Relative RMS <= 1e-6 against quant.ref.matmul (float32 sums in another
  order; the kernels round each weight once, where ggml's decoder may round twice).
- Weights are random bytes with finite block scales (every bit pattern a decoder can meet), and for the
  common types also ggml-quantized Gaussian rows; non-finite scales give non-finite rows, like the oracle.
  Activations far from zero mean (all positive, mean 10) against such rows, where cancellation would
  show a kernel that folds a large per-block offset into a sum of x.
- moe_ffn equals the loop oracle refengine.moe.moe_ffn (records included), with experts that get no
  token, top-k equal to the expert count, no gate, per-expert scales, and the BLAS path for big groups.
- Whole models (every arch's tiny file) with Runtime(backend="cpu") against numpy: tests/test_backends.py.
- The BMI2 bit gathers of the i-quant kernels (pdep / pext) and their plain-IR fallback equal a Python bit loop.
"""
import zlib

import numpy as np
import pytest

from quant import GGMLType, QTensor, QuantError, cpu, ref
from quant.cpu.dequant import KINDS
from quant.formats import type_info
from numerics import assert_close

TOL = 1e-6
TYPES = [GGMLType(k) for k in KINDS]

# byte offsets of each block's scale fields: (offset, kind); everything else stays random
F16, F32S, E8M0 = "f16", "f32", "e8m0"
SCALES = {
    GGMLType.Q4_0: [(0, F16)], GGMLType.Q4_1: [(0, F16), (2, F16)], GGMLType.Q5_0: [(0, F16)],
    GGMLType.Q5_1: [(0, F16), (2, F16)], GGMLType.Q8_0: [(0, F16)], GGMLType.Q8_1: [(0, F16), (2, F16)],
    GGMLType.Q1_0: [(0, F16)], GGMLType.Q2_0: [(0, F16)], GGMLType.Q2_K: [(80, F16), (82, F16)],
    GGMLType.Q3_K: [(108, F16)], GGMLType.Q4_K: [(0, F16), (2, F16)], GGMLType.Q5_K: [(0, F16), (2, F16)],
    GGMLType.Q6_K: [(208, F16)], GGMLType.Q8_K: [(0, F32S)], GGMLType.TQ1_0: [(52, F16)],
    GGMLType.TQ2_0: [(64, F16)], GGMLType.IQ2_XXS: [(0, F16)], GGMLType.IQ2_XS: [(0, F16)],
    GGMLType.IQ2_S: [(0, F16)], GGMLType.IQ3_XXS: [(0, F16)], GGMLType.IQ3_S: [(0, F16)],
    GGMLType.IQ1_S: [(0, F16)], GGMLType.IQ4_NL: [(0, F16)], GGMLType.IQ4_XS: [(0, F16)],
    GGMLType.MXFP4: [(0, E8M0)], GGMLType.NVFP4: [],
}


def random_weight(t: GGMLType, O: int, I: int, rng, name="w") -> QTensor:
    """Random bytes of type t with finite, moderate block scales (the IQ1_M scale lives in 4 nibbles)."""
    if t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        wf = rng.standard_normal((O, I), dtype=np.float32)
        raw = {GGMLType.F32: wf, GGMLType.F16: wf.astype(np.float16),
               GGMLType.BF16: (wf.view(np.uint32) >> 16).astype(np.uint16)}[t]
        return QTensor.from_raw(name, t, (O, I), raw)
    info = type_info(t)
    nb = O * I // info.block_size
    blocks = rng.integers(0, 256, (nb, info.type_size), dtype=np.uint8)
    for off, kind in SCALES.get(t, []):
        if kind == F16:
            blocks[:, off:off + 2] = rng.uniform(0.01, 0.1, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
        elif kind == F32S:
            blocks[:, off:off + 4] = rng.uniform(0.001, 0.01, nb).astype(np.float32).view(np.uint8).reshape(nb, 4)
        else:
            blocks[:, off] = rng.integers(118, 124, nb)
    if t == GGMLType.IQ1_M:                                      # f16 d spread over top nibbles of 4 u16 words
        d = rng.uniform(0.01, 0.1, nb).astype(np.float16).view(np.uint16)
        sc = blocks[:, 48:56].copy().view(np.uint16)                          # [nb, 4]
        for k in range(4):
            sc[:, k] = (sc[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        blocks[:, 48:56] = sc.view(np.uint8)
    return QTensor.from_raw(name, t, (O, I), blocks.reshape(O, -1))


def ggml_weight(t: GGMLType, O: int, I: int, rng, name="w") -> QTensor:
    from quant import ggml as qg
    wf = rng.standard_normal((O, I), dtype=np.float32)
    imat = np.ones(I, np.float32) if qg.requires_imatrix(t) else None
    return QTensor.from_raw(name, t, (O, I), qg.quantize(wf, t, imatrix=imat))


def width(t: GGMLType) -> int:
    """Row width: 2 super-blocks of 256, or 9 blocks of 32 (one group of 8 and a tail of 1)."""
    bs = type_info(t).block_size
    return 288 if bs == 32 else max(512, 2 * bs)


@pytest.fixture
def rng(request):
    """Seeded per test (by its name): a test draws the same data whatever else runs."""
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_matmul_every_type(t, rng):
    O, I = 67, width(t)                                          # 67 rows: not a multiple of any tile
    w = random_weight(t, O, I, rng)
    np.testing.assert_array_equal(cpu.dequantize(w), ref.dequantize(w))
    x = rng.standard_normal((20, I), dtype=np.float32)
    for T in (1, 2, 3, 8, 20):                                   # fused GEMV per row up to 4, then scratch
        assert_close(f"{t.name} T={T}", cpu.matmul(x[:T], w), ref.matmul(x[:T], w), TOL)
    assert_close(f"{t.name} BLAS", cpu.matmul(x, w, blas_min_tokens=16), ref.matmul(x, w), TOL)   # dequantize + BLAS
    assert_close(f"{t.name} tile 7", cpu.matmul(x[:1], w, tile_rows=7), ref.matmul(x[:1], w), TOL)
    one = w.rows(3, 4)                                           # a single weight row
    assert_close(f"{t.name} one row", cpu.matmul(x[:8], one), ref.matmul(x[:8], one), TOL)
    # GEMV of one row: a single value, so it is held to the same kernel on the whole matrix, bit for bit
    np.testing.assert_array_equal(cpu.matmul(x[:1], one)[:, 0], cpu.matmul(x[:1], w)[:, 3])


def test_paired_rows_equal_single_rows(rng):
    """dot.PAIRED types read two weight rows in step for one activation row (row_dot2): each result
    must equal the same row multiplied alone (row_dot), bit for bit, for both rows of a pair, the odd
    last row of a tile, and tiles of odd length."""
    from quant.cpu.dot import PAIRED
    for t in sorted(GGMLType(k) for k in PAIRED):
        w = random_weight(t, 9, width(t), rng)
        x = rng.standard_normal((1, w.shape[1]), dtype=np.float32)
        alone = np.concatenate([cpu.matmul(x, w.rows(r, r + 1)) for r in range(9)], axis=1)
        for tile in (None, 3, 4):
            np.testing.assert_array_equal(cpu.matmul(x, w, tile_rows=tile), alone, err_msg=f"{t.name} tile {tile}")
        assert_close(f"{t.name} paired", alone, ref.matmul(x, w), TOL)


COMMON = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q2_K,
          GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ2_XXS, GGMLType.IQ4_XS,
          GGMLType.TQ2_0, GGMLType.MXFP4]


@pytest.mark.oracle
@pytest.mark.parametrize("t", COMMON, ids=lambda t: t.name)
def test_matmul_ggml_quantized(t, rng):
    """Realistic weights (ggml's own quantizer on Gaussian rows), a wide row, GEMV and a small batch."""
    w = ggml_weight(t, 40, 2048, rng)
    x = rng.standard_normal((3, 2048), dtype=np.float32)
    for T in (1, 3):
        assert_close(f"{t.name} T={T}", cpu.matmul(x[:T], w), ref.matmul(x[:T], w), TOL)


@pytest.mark.oracle
@pytest.mark.parametrize("t", COMMON + [GGMLType.TQ1_0, GGMLType.IQ2_S, GGMLType.IQ3_S, GGMLType.Q8_K,
                                      GGMLType.IQ1_S, GGMLType.IQ1_M, GGMLType.Q1_0],
                         ids=lambda t: t.name)
def test_gemv_offset_activations(t, rng):
    """Activations far from zero mean (all positive, or mean 10) against zero-mean quantized weights:
    y is much smaller than sum |w x|, so a kernel that splits w = c q + m into c (q . x) + m sum(x)
    with a large offset loses digits to cancellation. The kernels fold only the weight at the middle
    code (w = c (q - mid) + w(mid)), which keeps every term as small as the weights themselves."""
    w = ggml_weight(t, 32, 2048, rng) if t != GGMLType.Q8_K else random_weight(t, 32, 2048, rng)
    z = rng.standard_normal((2, 2048), dtype=np.float32)
    for name, x in (("positive", np.abs(z)), ("mean 10", z + np.float32(10))):
        for T in (1, 2):
            assert_close(f"{t.name} {name} T={T}", cpu.matmul(x[:T], w), ref.matmul(x[:T], w), TOL)


def test_activation_layouts():
    """x_sums and x_lanes, the per-row activation preparations of the GEMV kernels: group sums equal
    float64 sums; lane order is a permutation scaled by exact powers of two."""
    from quant.cpu.dot import LANE_TABLES, XS_GROUP, x_lanes, x_sums
    x = np.random.default_rng(3).standard_normal((3, 1024), dtype=np.float32)
    for kind, g in XS_GROUP.items():
        s = x.reshape(3, -1, g).sum(axis=-1, dtype=np.float64).astype(np.float32)
        got = x_sums(kind, x)
        if got.shape[1] != s.shape[1]:                                   # Q4_K / Q5_K: 8 zeros, then 8 sums per 256
            got = got.reshape(3, -1, 16)
            assert not got[..., :8].any()
            got = got[..., 8:].reshape(3, -1)
        np.testing.assert_array_equal(got, s)
    for kind, (perm, scale) in LANE_TABLES.items():
        n = len(perm)                                                    # 256, or one NVFP4 block (64)
        assert sorted(perm) == list(range(n))
        assert np.all(np.frexp(scale)[0] == 0.5)                         # powers of two
        xp = x_lanes(kind, x).reshape(3, -1, n)
        np.testing.assert_array_equal(xp, x.reshape(3, -1, n)[..., perm] * scale)


def test_affine_code_books():
    """Each centred code book the kernels look up through `lut_affine` is what its (lo, mask, off) says for
    every index the lookup can see (without AVX-512 the kernels compute ((n >> lo) & mask) - off instead of
    reading the book): a wrong triple would change the weights on such hosts only."""
    from quant.cpu.dot import AFFINE
    for book, (lo, mask, off) in AFFINE:
        n = np.arange(len(book))
        np.testing.assert_array_equal(book, ((n >> lo) & mask) - off)


def test_bit_deposit_extract(monkeypatch):
    """llvm.pdep32 / pext64 (the i-quant sign gathers: dot.signs4, IQ2_XS's SIGNS_XS) equal a plain
    Python bit loop, with BMI2 and in the plain-IR form used on hosts without it."""
    from numba import njit

    import quant.cpu.llvm as L
    from quant.cpu.dot import SIGNS_XS

    def pdep(v, m):
        out, k = 0, 0
        for i in range(32):
            if m >> i & 1:
                out |= (v >> k & 1) << i
                k += 1
        return out

    def pext(v, m):
        v, m, out, k = v % 2 ** 64, m % 2 ** 64, 0, 0
        for i in range(64):
            if m >> i & 1:
                out |= (v >> i & 1) << k
                k += 1
        return out - 2 ** 64 if out >= 2 ** 63 else out

    vals = [int(v) for v in np.random.default_rng(5).integers(-2 ** 63, 2 ** 63 - 1, 200, dtype=np.int64)]
    want = [(pdep(v % 2 ** 32, 0x7F7F7F7F), pext(v, SIGNS_XS)) for v in vals]
    for bmi2 in (True, False):
        monkeypatch.setattr(L, "HAVE_BMI2", bmi2)

        @njit                                                   # compiled after the patch: codegen reads it
        def both(a):
            return L.pdep32(a, 0x7F7F7F7F), L.pext64(a, SIGNS_XS)
        assert [both(v) for v in vals] == want, f"HAVE_BMI2={bmi2}"


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.IQ2_XXS, GGMLType.F16], ids=lambda t: t.name)
def test_non_finite_weights_propagate(t, rng):
    """A NaN scale (or weight) makes its row NaN in the oracle; the kernels must not hide it."""
    w = random_weight(t, 5, width(t), rng)
    raw = w.raw.copy()
    off = SCALES.get(t, [(0, F16)])[0][0]
    raw[2, off:off + 2] = np.array([np.nan], np.float16).view(np.uint8)
    bad = QTensor.from_raw("w", t, w.shape, raw)
    x = np.random.default_rng(1).standard_normal((3, w.shape[1]), dtype=np.float32)
    for T, blas in ((1, 128), (3, 128), (8, 128), (20, 16)):      # gemv, gemv, scratch, BLAS
        xt = np.resize(x, (T, w.shape[1]))
        got, want = cpu.matmul(xt, bad, blas_min_tokens=blas), ref.matmul(xt, bad)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        assert not np.isfinite(got[:, 2]).any()
        ok = np.isfinite(want)
        assert_close(f"{t.name} T={T} finite rows", got[ok], want[ok], TOL)


def test_bad_input_names_the_tensor(rng):
    w = random_weight(GGMLType.Q4_K, 4, 256, rng, name="blk.0.ffn_up.weight")
    with pytest.raises(QuantError, match="blk.0.ffn_up.weight"):
        cpu.matmul(np.zeros((1, 128), np.float32), w)
    with pytest.raises(QuantError, match="blk.0.ffn_up.weight"):
        cpu.matmul(np.zeros((1, 256), np.float32), w, mode="fast")
    with pytest.raises(QuantError, match="blk.0.ffn_up.weight"):
        cpu.grouped_matmul(np.zeros((2, 256), np.float32), w, np.array([0, 2]))


def test_llamacpp_mode_matches_oracle(rng):
    """mode="llamacpp" rounds activations exactly as quant.ref does (Q8_0, Q8_1 + min term, Q8_K, f16)."""
    for t in (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K, GGMLType.F16):
        w = random_weight(t, 33, 512, rng)
        x = rng.standard_normal((3, 512), dtype=np.float32)
        for T in (1, 3):
            assert_close(f"{t.name} T={T}", cpu.matmul(x[:T], w, mode="llamacpp"), ref.matmul(x[:T], w, mode="llamacpp"), TOL)


# ---------------------------------------------------------------- experts

def _experts(t, E, D, I, rng, prefix):
    up = random_weight(t, E * I, D, rng)
    gate = random_weight(t, E * I, D, rng)
    down = random_weight(t, E * D, I, rng)

    def mk(w, name, shape):
        return QTensor.from_raw(name, t, shape, w.raw.reshape(*shape[:-1], -1))
    return (mk(up, prefix + "ffn_up_exps.weight", (E, I, D)), mk(gate, prefix + "ffn_gate_exps.weight", (E, I, D)),
            mk(down, prefix + "ffn_down_exps.weight", (E, D, I)))


def _both(x, ids, weights, blas_min_tokens=16, **kw):
    from refengine.moe import moe_ffn as loop_oracle
    r_ref, r_cpu = {}, {}
    want = loop_oracle(x, ids, weights, matmul=ref.matmul, record=lambda n, il, v: r_ref.__setitem__(n, v), **kw)
    got = cpu.moe_ffn(x, ids, weights, record=lambda n, il, v: r_cpu.__setitem__(n, v),
                      blas_min_tokens=blas_min_tokens, **kw)
    assert sorted(r_ref) == sorted(r_cpu)
    for name, want_v in r_ref.items():
        assert r_cpu[name].shape == want_v.shape, name
        assert_close(name, r_cpu[name], want_v, TOL)
    assert_close("moe out", got, want, TOL)


@pytest.mark.parametrize("t", [GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.IQ2_XXS], ids=lambda t: t.name)
def test_moe_ffn_matches_loop_oracle(t, rng):
    E, D, I, T = 6, 256, 512, 5
    up, gate, down = _experts(t, E, D, I, rng, "blk.1.")
    x = rng.standard_normal((T, D), dtype=np.float32)
    ids = np.array([[0, 2], [2, 0], [5, 0], [2, 5], [0, 2]], dtype=np.int32)   # experts 1, 3, 4: no token
    weights = rng.random((T, 2), dtype=np.float32)
    scales = {"up_scale": rng.uniform(0.5, 2, E).astype(np.float32), "gate_scale": None,
              "down_scale": rng.uniform(0.5, 2, E).astype(np.float32)}
    _both(x, ids, weights, up=up, gate=gate, down=down, il=1, **scales)
    _both(x[:1], ids[:1], weights[:1], up=up, gate=gate, down=down, il=1)                # one token (decode)
    _both(x, ids, weights, up=up, gate=None, down=down, il=1)                            # no gate: silu(up)


def test_moe_ffn_topk_equals_expert_count_and_blas_path(rng):
    E, D, I, T = 4, 256, 256, 9
    up, gate, down = _experts(GGMLType.Q4_K, E, D, I, rng, "blk.0.")
    x = rng.standard_normal((T, D), dtype=np.float32)
    ids = np.stack([rng.permutation(E) for _ in range(T)]).astype(np.int32)            # A = E: every expert
    weights = rng.random((T, E), dtype=np.float32)
    _both(x, ids, weights, up=up, gate=gate, down=down)
    _both(x, ids, weights, blas_min_tokens=4, up=up, gate=gate, down=down)              # dequantize + BLAS
    with pytest.raises(QuantError, match="blk.0.ffn_up_exps.weight"):
        cpu.moe_ffn(x, ids + 1, weights, up=up, gate=gate, down=down)
