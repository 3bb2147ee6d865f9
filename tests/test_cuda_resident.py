"""The device-resident forward on the GPU (`Runtime(backend="cuda")`: CuPy arrays through the same module code,
products on the numba-cuda kernels) against the NumPy backend, for every registered arch's tiny preset in Q8_0:
prefill and decode steps, logits within relative RMS 1e-5 of NumPy's and the same argmax.

Needs a GPU and CuPy (skipped otherwise). Prints what each decode step still moves between host and device
(refengine.devarray's counters): the figures a device path is tuned from. The sim-device form of the check
(bit-identical, in CI) is tests/test_resident.py.
"""
import numpy as np
import pytest

pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

from numerics import rel_rms  # noqa: E402
from refengine.model import Model  # noqa: E402
from refengine.runtime import Runtime  # noqa: E402

pytestmark = pytest.mark.cuda
GPU = not qc.SIM and qc.available()
TOL = 1e-5
TOKENS = [3, 17, 101, 5, 250, 42, 7] + list(range(40, 53))


def arch_ids():
    from refengine.archs import ARCHS
    return list(ARCHS)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", arch_ids())
def test_resident_cuda_equals_numpy(synth_model, arch, capsys):
    pytest.importorskip("cupy")
    m = Model(synth_model(arch, wtype="Q8_0"))            # (gguf's own quantizer writes Q8_0: no oracle needed)
    host, gpu = Runtime(), Runtime(backend="cuda", resident=True)
    st_h, st_g = m.new_state(), m.new_state()
    steps = [TOKENS, [5], [9]]
    for i, toks in enumerate(steps):
        before = gpu.device.stats.as_dict()
        a, b = m.forward(toks, st_h, rt=host), m.forward(toks, st_g, rt=gpu)
        r = rel_rms(b, a)
        with capsys.disabled():
            print(f"\n{arch} step {i}: rel-RMS {r:.2e}; moved {gpu.device.stats.since(before)}")
        assert r <= TOL, f"{arch} step {i}: rel-RMS {r:.3e} > {TOL}"
        assert np.array_equal(np.argmax(a, -1), np.argmax(b, -1)), f"{arch} step {i}: argmax differs"
