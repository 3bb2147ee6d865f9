"""The linear-attention archs (qwen3next, kimi-linear, kimi-k3) with `--backend cuda` against the NumPy backend.

Every projection and the grouped expert dispatch (SwiGLU fused; Kimi-K3's SiTU with its activation the module's
function) are numba-cuda kernels; the short convs, the delta rule and attention are the blocks' NumPy code, on
device arrays (resident, with CuPy) or on the host. The simulator would take many minutes on the tiny
models, so this runs on a GPU only (the kernels are covered in the simulator by test_cuda_kernels.py); the
real-size check is `benchmarks/cuda_deepseek2.py --arch kimi-k3 --preset kimi-k3`.
"""
import numpy as np
import pytest

import quant.cuda as qc
from numerics import rel_rms
from refengine import Model, Runtime

GPU = not qc.SIM and qc.available()


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an NVIDIA GPU (the simulator takes minutes on the tiny models)")
@pytest.mark.parametrize("arch", ["qwen3next", "kimi-linear", "kimi-k3"])
@pytest.mark.parametrize("wtype", ["Q4_K", "Q8_0"])
def test_linear_attention_cuda_backend_equals_numpy(synth_model, arch, wtype, tmp_path):
    """Prefill 8 tokens then decode 2, on both backends with their own state: rel-RMS <= 1e-5, same argmax."""
    from quant import ggml
    if ggml.available():
        m = Model(synth_model(arch, wtype=wtype))
    else:       # the GPU machine has no libggml to quantize with: random packed weights at the preset's table
        from refengine.cuda.randmodel import write_random_model
        m = Model(write_random_model(str(tmp_path / "m.gguf"), wtype, arch=arch, preset="tiny"))
    tokens = [3, 17, 101, 5, 250, 42, 7, 9]
    sc, sn = m.new_state(), m.new_state()
    got = [m.forward(tokens, sc, Runtime(backend="cuda"))] + [m.forward([t], sc, Runtime(backend="cuda")) for t in (1, 2)]
    want = [m.forward(tokens, sn, Runtime())] + [m.forward([t], sn, Runtime()) for t in (1, 2)]
    for g, w in zip(got, want):
        rel = rel_rms(g, w)
        assert rel <= 1e-5, (arch, wtype, rel)
        assert np.array_equal(g.argmax(-1), w.argmax(-1))
