"""quant.cuda.fast8: the one-token GEMV on 8-bit digit planes of the activations (dp4a), against the NumPy
oracle. Runs on the GPU when there is one, else in the CUDA simulator on toy sizes.

The digit planes approximate each activation within 6.2e-8 of its run's largest magnitude, so the products
stay within rel-RMS 1e-6 of the float oracle even for activations far from zero mean or heavy-tailed
(the kernels' general tolerance is 1e-5; this file pins the tighter figure the module claims).

Tiers (tests/tiers.py): in the simulator the default tier runs Q4_K for every kind of activation and the other
code-word types on Gaussian activations, and expert dispatch for the 32-block types (Q8_0, Q4_0: 64-weight rows in
the simulator); the rest of the matrix, and expert dispatch for the K-quants (256-weight rows: half a minute each in
the simulator), are `exhaustive`.
"""
import numpy as np
import pytest

cuda_mod = pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

from numba import cuda  # noqa: E402
from quant import GGMLType, ref  # noqa: E402
from quant.cuda import moe as cmoe  # noqa: E402
from quant.cuda import ops  # noqa: E402
from quant.cuda.fast8 import CW, INV254, digits  # noqa: E402
from quant.cuda.testdata import random_qtensor  # noqa: E402
from quant.formats import type_info  # noqa: E402
from numerics import rel_rms  # noqa: E402
from tiers import exhaustive, tiered  # noqa: E402

pytestmark = pytest.mark.cuda

GPU = not qc.SIM and qc.available()
O, I = (256, 2048) if GPU else (5, 512)
TOL8 = 1e-6
# (rows per warp, warps, rows in flight, register cap, 1 = the 8-bit kernel); simulator: fewer threads
SHAPE = (8, 4, 8, 128, 1) if GPU else (2, 1, 2, 0, 1)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(88)


def _acts(kind, T, rng):
    x = rng.standard_normal((T, I))
    if kind == "offset":
        x = x + 3.0
    elif kind == "heavy":                          # log-normal magnitudes: a few activations ~100x the rest
        x = x * np.exp(2.0 * rng.standard_normal((T, I)))
    elif kind == "sparse":                         # whole zero runs (the run-maximum floor) and a tiny run
        x[:, : I // 2] = 0.0
        x[:, I // 2: I // 2 + 32] *= 1e-30
    return x.astype(np.float32)


@cuda.jit
def digits_kernel(v, out):
    i = cuda.grid(1)
    if i < v.size:
        a, b, c = digits(v[i])
        out[i, 0] = a
        out[i, 1] = b
        out[i, 2] = c


def test_digits_reconstruct():
    """Three base-254 digits of v in [-126, 126] rebuild it within 0.5 / 254^2 (plus float32 rounding)."""
    rng = np.random.default_rng(0)
    vs = np.concatenate([rng.uniform(-126, 126, 250), [0.0, 126.0, -126.0, 0.5, -0.5, 1e-9]]).astype(np.float32)
    out = np.zeros((vs.size, 3), np.uint32)
    digits_kernel[(vs.size + 63) // 64, 64](vs, out)
    d = (out & 0xFF).astype(np.int64)
    d = np.where(d > 127, d - 256, d)
    assert np.all(np.abs(d[:, 0]) <= 126) and np.all(np.abs(d[:, 1:]) <= 127)
    rebuilt = d[:, 0] + d[:, 1] * INV254 + d[:, 2] * INV254 * INV254
    err = np.abs(rebuilt - vs.astype(np.float64))
    assert np.all(err <= 0.5 / 254 ** 2 + 2e-8 * np.abs(vs)), float(err.max())


KEEP = {GGMLType.Q4_K}
MATRIX = [pytest.param(t, kind, id=f"{kind}-{t.name}",
                       marks=() if t in KEEP or kind == "gauss" else exhaustive)
          for kind in ("gauss", "offset", "heavy", "sparse") for t in CW]


@pytest.mark.parametrize("t, kind", MATRIX)
def test_igemv1_matches_oracle(t, kind, rng, monkeypatch):
    """1 token, and 3 tokens in one group (one pass per token), for every type with a code-word decoder."""
    w = random_qtensor(t, (O, I), rng)
    for T in (1, 3):
        x = _acts(kind, T, rng)
        got = ops.matmul(x, w, kernel="fast", shape=SHAPE)
        r = rel_rms(got, ref.matmul(x, w))
        assert r <= TOL8, f"{t.name} {kind} T={T}: relative RMS {r:.2e}"


@pytest.mark.parametrize("t", tiered(list(CW), KEEP), ids=lambda t: t.name)
def test_igemv1_nan_propagates(t, rng, monkeypatch):
    """A NaN activation makes the products NaN, as the float oracle's would (not a silent finite value)."""
    w = random_qtensor(t, (O, I), rng)
    x = _acts("gauss", 1, rng)
    x[0, 7] = np.nan
    got = ops.matmul(x, w, kernel="fast", shape=SHAPE)
    assert np.all(np.isnan(got))


def test_float_one_token_kernel_still_matches(rng):
    """With the 8-bit path off (X = 0 in the shape), the float one-token kernel (also one pass per pair) serves
    the same types."""
    for t in CW:
        w = random_qtensor(t, (O, I), rng)
        x = _acts("gauss", 2, rng)
        got = ops.matmul(x, w, kernel="fast", shape=SHAPE[:4] + (0,))
        assert rel_rms(got, ref.matmul(x, w)) <= 1e-5


# the dispatch kernel's decoders are the ones test_igemv1_matches_oracle checks for every type: the default tier
# dispatches the 32-block types (64-weight rows in the simulator, seconds); the K-quants need 256-weight rows
@pytest.mark.parametrize("t", tiered(list(CW), {GGMLType.Q8_0, GGMLType.Q4_0}), ids=lambda t: t.name)
def test_igemv1_expert_dispatch(t, rng, monkeypatch):
    """One token's experts from the router ids: gate+up fused (silu), then down with the routing weights."""
    from refengine.moe.experts import moe_ffn as loop_moe
    monkeypatch.setattr(ops, "FAST1_IDS_SHAPE", {k: (8, 4, 8, 128, 1) for k in CW})
    E, A = (4, 2) if not GPU else (16, 4)
    D = F = 256 if GPU or type_info(t).block_size > 32 else 64    # simulator: rows of two blocks where they are 32
    up, gate = random_qtensor(t, (E, F, D), rng, "up"), random_qtensor(t, (E, F, D), rng, "gate")
    down = random_qtensor(t, (E, D, F), rng, "down")
    x = _acts("gauss", 1, rng)[:, :D]
    ids = rng.permutation(E)[:A].reshape(1, A).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, (1, A)).astype(np.float32)
    sc = dict(up_scale=rng.uniform(0.5, 2, E).astype(np.float32), down_scale=rng.uniform(0.5, 2, E).astype(np.float32))
    want = loop_moe(x, ids, wts, up=up, gate=gate, down=down, matmul=ref.matmul, **sc)
    got = cmoe.moe_ffn(x, ids, wts, up=up, gate=gate, down=down, **sc)
    assert rel_rms(got, want) <= TOL8
