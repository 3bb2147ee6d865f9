"""deepseek2 (MLA) with `--backend cuda`: the NumPy blocks with every matmul and the routed experts on the GPU.

The per-head attn_k_b / attn_v_b products, the q-LoRA and kv projections, the dense and shared FFNs and the
grouped expert dispatch are numba-cuda kernels; the rest is the blocks' NumPy code, on device arrays (resident,
with CuPy) or on the host. The CUDA simulator would take many minutes on even the tiny model (every weight element
emulated), so this runs on a GPU only; the same kernels are covered in the simulator by test_cuda_kernels.py, and
the real-size check is benchmarks/cuda_deepseek2.py.
"""
import numpy as np
import pytest

import quant.cuda as qc
from numerics import rel_rms
from refengine import Model, Runtime

GPU = not qc.SIM and qc.available()


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an NVIDIA GPU (the simulator takes minutes on the tiny model)")
@pytest.mark.parametrize("preset,wtype", [("tiny", "Q4_K"), ("tiny-groups", "Q8_0"), ("tiny-legacy", "Q4_K")])
def test_deepseek2_cuda_backend_equals_numpy(synth_model, preset, wtype, tmp_path):
    from quant import ggml
    if ggml.available():
        m = Model(synth_model("deepseek2", preset=preset, wtype=wtype))
    else:       # the GPU machine has no libggml to quantize with: random packed weights at the preset's table
        from refengine.cuda.randmodel import write_random_model
        m = Model(write_random_model(str(tmp_path / "m.gguf"), wtype, arch="deepseek2", preset=preset))
    tokens = [3, 17, 101, 5, 250, 42, 7, 9]
    for form in ("absorbed", "naive"):
        sc, sn = m.new_state(form), m.new_state(form)
        got = [m.forward(tokens, sc, Runtime(backend="cuda"))] + [m.forward([t], sc, Runtime(backend="cuda")) for t in (1, 2)]
        want = [m.forward(tokens, sn, Runtime())] + [m.forward([t], sn, Runtime()) for t in (1, 2)]
        for g, w in zip(got, want):
            rel = rel_rms(g, w)
            assert rel <= 1e-5, (preset, wtype, form, rel)
            assert np.array_equal(g.argmax(-1), w.argmax(-1))
