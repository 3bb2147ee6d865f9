"""refengine/cuda/fused.py: the one-launch kernels of the small ops against their NumPy statements (ops/norm.py,
ops/softmax.py, ops/activations.py) and the NaN/inf flag kernel against np.isfinite.

On a GPU at real row sizes (and through the ops' own dispatch on device arrays: `Device.fused`); without one in
numba's CUDA simulator on toy sizes (conftest.py sets NUMBA_ENABLE_CUDASIM=1). Tolerance: the kernels sum in
another order than NumPy's (float64 sums where NumPy's are float64) and the simulator's / CUDA's exp may differ from
NumPy's by an ulp: relative 2e-6 per element (rms_norm, softmax), 1e-6 (the activations).
"""
import numpy as np
import pytest

cuda_mod = pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

from numba import cuda  # noqa: E402

from refengine.cuda import fused  # noqa: E402
from refengine.ops.activations import sigmoid, silu, swiglu  # noqa: E402
from refengine.ops.norm import rms_norm  # noqa: E402
from refengine.ops.softmax import softmax  # noqa: E402

pytestmark = pytest.mark.cuda

GPU = not qc.SIM and qc.available()
ROWS, D = (7, 7168) if GPU else (3, 300)          # 300: a row longer than a block, not a multiple of it


def _rand(*shape, seed=0, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _run(launch, *host, out_shapes):
    dev = [cuda.to_device(np.ascontiguousarray(h)) if h is not None else None for h in host]
    outs = [cuda.device_array(s, np.float32) for s in out_shapes]
    launch(*dev, *outs)
    cuda.synchronize()
    return [o.copy_to_host() for o in outs]


@pytest.mark.parametrize("with_w", [True, False])
def test_rms_norm_rows(with_w):
    x = _rand(ROWS, D)
    x[1] *= 1e-3                                          # rows of other scales
    w = _rand(D, seed=1) if with_w else None
    want = rms_norm(x, w, 1e-6)
    (got,) = _run(lambda xd, wd, y: fused.rms_norm_raw(xd, wd, 1e-6, y), x, w, out_shapes=[x.shape])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=0)


def test_softmax_rows():
    x = _rand(ROWS, D, scale=8.0)
    x[0, ::7] = -np.inf                                   # masked entries -> 0
    want = softmax(x)
    (got,) = _run(fused.softmax_raw, x, out_shapes=[x.shape])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)
    assert np.all(got[0, ::7] == 0)


@pytest.mark.parametrize("name", ["silu", "sigmoid"])
def test_unary(name):
    x = _rand(ROWS * D, scale=10.0)
    x[:3] = (-100.0, 100.0, 0.0)                          # exp overflow: 0 / 1 as NumPy gives
    want = {"silu": silu, "sigmoid": sigmoid}[name](x)
    (got,) = _run(getattr(fused, f"{name}_raw"), x, out_shapes=[x.shape])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)


def test_swiglu():
    g, u = _rand(ROWS * D, scale=6.0), _rand(ROWS * D, seed=1)
    (got,) = _run(fused.swiglu_raw, g, u, out_shapes=[g.shape])
    np.testing.assert_allclose(got, swiglu(g, u), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("at", [0, -1])
def test_all_finite(bad, at):
    """page[row, col] becomes False exactly when the array holds NaN/inf (first or last element); other cells stay."""
    y = _rand(ROWS * D)
    if bad is not None:
        y[at] = bad
    page = cuda.to_device(np.ones((4, 2), dtype=bool))
    fused.all_finite_raw(cuda.to_device(y), page, 2, 1)
    cuda.synchronize()
    got = page.copy_to_host()
    want = np.ones((4, 2), dtype=bool)
    want[2, 1] = bool(np.all(np.isfinite(y)))
    assert np.array_equal(got, want)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_ops_take_the_kernels_on_a_gpu(synth_model):
    """On a GPU the ops reach the kernels through `Device.fused`: a resident forward with them equals NumPy's
    (rel-RMS <= 1e-5, same argmax) and the one without them (ops as NumPy states them, on the device) to the same
    tolerance; the flags of a step are written by the flag kernel."""
    pytest.importorskip("cupy")
    from refengine.model import Model
    from refengine.runtime import Runtime
    m = Model(synth_model("qwen3next", wtype="Q8_0"))
    ids = [3, 9, 27, 81, 5]
    ref = m.forward(ids, m.new_state(), rt=Runtime())
    on = Runtime(backend="cuda")
    off = Runtime(backend="cuda")
    off.device.fused = None
    with on.device.recording() as ops_on:
        y_on = m.forward(ids, m.new_state(), rt=on)
    with off.device.recording() as ops_off:
        y_off = m.forward(ids, m.new_state(), rt=off)
    rel = lambda a, b: float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))     # noqa: E731
    for y in (y_on, y_off):
        assert rel(y, ref) <= 1e-5 and np.array_equal(np.argmax(y, -1), np.argmax(ref, -1))
    assert any(op.startswith("fused rms_norm") for op, _, _ in ops_on)
    assert len(ops_on) < len(ops_off)
