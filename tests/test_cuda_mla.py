"""deepseek2 (MLA) with `--backend cuda`: the NumPy blocks with every matmul and the routed experts on the GPU.

No whole-forward device path runs MLA (refengine.cuda checks layer kinds), so the cuda backend goes op by op:
the per-head attn_k_b / attn_v_b products, the q-LoRA and kv projections, the dense and shared FFNs and the
grouped expert dispatch are numba-cuda kernels; attention itself stays in NumPy. The CUDA simulator would take
many minutes on even the tiny model (every weight element emulated), so this runs on a GPU only; the same kernels
are covered in the simulator by test_cuda_kernels.py, and the real-size check is benchmarks/cuda_deepseek2.py.
"""
import numpy as np
import pytest

import quant.cuda as qc
from numerics import rel_rms
from refengine import Model, Runtime
from refengine.cuda import unsupported

GPU = not qc.SIM and qc.available()


def test_device_path_refuses_mla_by_layer_kind(synth_model):
    m = Model(synth_model("deepseek2", preset="tiny"))
    assert "architecture deepseek2" in unsupported(m) or "mla" in unsupported(m)


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
