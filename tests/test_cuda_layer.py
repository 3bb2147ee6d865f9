"""The model on the cuda backend against the NumPy backend (which matches llama.cpp: test_compare*), for llama and
qwen3moe in several weight types (every arch in Q8_0: test_cuda_resident.py, test_cuda_graph_step.py):

- `Runtime(backend="cuda")` (on a GPU the device-resident forward, the concept modules on CuPy arrays; in the
  simulator op by op): prefill then decode, logits within relative RMS 1e-5 of the NumPy backend's, and a prompt's
  last row alone (`last_only`); on a GPU the decode steps also from a captured CUDA graph (`GraphDecoder`).
- the traced path (`Runtime(backend="cuda", trace=...)`): every named intermediate within 1e-5 of the NumPy trace.
- a state saved mid-run and loaded into a fresh Model continues bit for bit.
- refengine.cuda's fused kernels compile for sm_90.

On a GPU: the tiny presets of llama and qwen3moe in several weight types. In the simulator: one micro model (a few
thousand weights), one layer.

Tiers (tests/tiers.py): `exhaustive` marks the PTX compile of every specialization (the default tier compiles one
per family) and, in the simulator, the state file round trip.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

from refengine import synth  # noqa: E402
from refengine.model import Model  # noqa: E402
from refengine.runtime import Runtime  # noqa: E402
from refengine.trace import Trace  # noqa: E402
from numerics import rel_rms  # noqa: E402
from tiers import exhaustive, ptx_sm90  # noqa: E402

pytestmark = pytest.mark.cuda

GPU = not qc.SIM and qc.available()
TOL = 1e-5
MICRO = dict(n_vocab=64, n_embd=32, n_layer=1, n_head=2, n_head_kv=1, head_dim=32, n_ff=32, n_ctx=64,
             rope_base=1e6, eps=1e-6)
MICRO_MOE = dict(MICRO, n_expert=4, n_expert_used=2, n_ff_exp=32)


@pytest.fixture(autouse=True)
def few_threads(monkeypatch):
    """In the simulator: 8 rows and 1 warp per block (fewer Python threads; same code path)."""
    if not GPU:
        from quant.cuda import ops
        monkeypatch.setattr(ops, "GEMV_DEFAULT", (8, 1, 1))


def _model(tmp_path_factory, arch, preset, wtype):
    if preset == "micro":
        synth.PRESETS[arch].setdefault("micro", MICRO_MOE if arch == "qwen3moe" else MICRO)
    path = tmp_path_factory.mktemp("cuda") / f"{arch}-{preset}-{wtype}.gguf"
    from quant import ggml
    if ggml.available() or wtype in ("F32", "F16", "BF16"):
        return Model(synth.write_synth(arch, path, preset=preset, wtype=wtype, progress=False))
    # no ggml quantizer here (the GPU machine): the same tensor table with random packed weights
    from refengine.cuda.randmodel import write_random_model
    return Model(write_random_model(str(path), wtype, arch=arch, preset=preset))


CASES = ([("qwen3moe", "tiny", t) for t in ("Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "F16")]
         + [("llama", "tiny", t) for t in ("Q8_0", "Q4_K", "F32")] + [("llama", "tiny-moe", "Q5_K")]) if GPU \
    else [("qwen3moe", "micro", "Q8_0"), ("llama", "micro", "Q8_0")]


@pytest.mark.parametrize("arch,preset,wtype", CASES)
def test_cuda_backend_equals_numpy(arch, preset, wtype, tmp_path_factory):
    m = _model(tmp_path_factory, arch, preset, wtype)
    prompt, steps = ([3, 17, 42, 5, 9], 4) if GPU else ([3, 17], 1)
    rt = Runtime(backend="cuda")
    st, sd = m.new_state(), m.new_state()
    want, got = [m.forward(prompt, st)], [m.forward(prompt, sd, rt=rt)]
    for _ in range(steps):
        tok = int(np.argmax(want[-1][-1]))
        want.append(m.forward([tok], st))
        got.append(m.forward([tok], sd, rt=rt))
    for i, (g, w) in enumerate(zip(got, want)):
        assert rel_rms(g, w) <= TOL, f"step {i}: relative RMS {rel_rms(g, w):.2e}"
    # a prompt whose next token is wanted (`last_only`): the last block's FFN half and the head on its last row alone
    last = m.forward(prompt, m.new_state(), rt=rt, last_only=True)
    assert last.shape == (1, m.cfg.n_vocab) and rel_rms(last, want[0][-1:]) <= TOL
    if rt.resident:                             # a GPU: the decode steps eager, captured, then replayed
        from refengine.cuda.graph_step import GraphDecoder
        fixed = Runtime(backend="cuda", fixed_shapes=True)
        sg = m.new_state()
        m.forward(prompt, sg, rt=fixed)
        dec = GraphDecoder(m, fixed, sg)
        for i, w in enumerate(want[1:]):
            g = dec.step(int(np.argmax(want[i][-1])))
            assert rel_rms(g, w[-1]) <= TOL, f"graph step {i}: relative RMS {rel_rms(g, w[-1]):.2e}"
        assert dec.replays >= steps - 2, (dec.eager, dec.captures, dec.replays, dec.failed)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an NVIDIA GPU (the same kernels run in the simulator in "
                                      "test_cuda_kernels.py)")
@pytest.mark.parametrize("arch,preset,wtype", CASES[:1] + [("llama", "tiny", "Q4_K")])
def test_traced_cuda_backend_equals_numpy(arch, preset, wtype, tmp_path_factory):
    m = _model(tmp_path_factory, arch, preset, wtype)
    prompt = [3, 17, 42] if GPU else [3, 17]
    tr_n, tr_c = Trace(), Trace()
    ln = m.forward(prompt, None, Runtime(trace=tr_n))
    lc = m.forward(prompt, None, Runtime(backend="cuda", trace=tr_c))
    assert rel_rms(lc, ln) <= TOL
    assert set(tr_c) == set(tr_n)
    for k in tr_n:
        a, b = tr_c[k], tr_n[k]
        if a.dtype.kind in "iu":
            assert np.array_equal(a, b), k
        elif np.any(b):
            assert rel_rms(a, b) <= TOL, f"{k}: {rel_rms(a, b):.2e}"


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an NVIDIA GPU")
def test_cli_run_backend_cuda(tmp_path_factory):
    m = _model(tmp_path_factory, "qwen3moe", "tiny", "Q4_K")
    out = {}
    for be in ("numpy", "cuda"):
        r = subprocess.run([sys.executable, "-m", "refengine.cli", "run", m.path, "--tokens", "1,2,3", "-n", "6",
                            "--backend", be], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        out[be] = r.stdout.split()
    assert out["cuda"] == out["numpy"]


def test_cli_says_no_gpu(tmp_path_factory):
    """Without a GPU (and without the simulator), --backend cuda fails with a clear message, exit 2."""
    if GPU:
        pytest.skip("a GPU is present")
    m = _model(tmp_path_factory, "qwen3moe", "micro", "Q8_0")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    r = subprocess.run([sys.executable, "-m", "refengine.cli", "run", m.path, "-n", "1", "--backend", "cuda"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2
    assert "needs an NVIDIA GPU" in r.stderr


def test_ptx_sm90_device_kernels_one_per_family():
    """One specialization of each fused kernel family (norms, softmax, activations, the delta rule, the short conv,
    RoPE, attention, routing, the NaN flags, top-k) compiles for sm_90."""
    ptx_sm90("refengine.cuda.ptx", ["fused_rms_norm", "fused_softmax", "fused_silu", "fused_delta_rule",
                                    "fused_causal_conv", "fused_rope", "fused_norm_rope", "fused_attention",
                                    "fused_route_softmax", "fused_all_finite", "fused_ggml_top_k_rows"])


def test_ptxas_resources():
    """`python -m refengine.cuda.ptx --resources -k NAME`: ptxas's registers a kernel (where ptxas is on PATH), read
    from its report: the softmax router a warp a row holding 16 entries a lane (`fused.RWE`) takes more registers
    than the one holding 4 (a 128-expert row's), neither spills."""
    import re
    import shutil
    if shutil.which("ptxas") is None:
        pytest.skip("no ptxas on PATH")
    out = ptx_sm90("refengine.cuda.ptx", args=["--resources", "-k", "fused_route_softmax_warps"], timeout=600)
    regs = {m.group(1): int(m.group(2))
            for m in re.finditer(r"ok\s+(fused_route_softmax_warps\S*)\s.*?(\d+) registers, spills 0/0", out)}
    assert set(regs) == {"fused_route_softmax_warps", "fused_route_softmax_warps[rwe=4]"}, out
    assert 0 < regs["fused_route_softmax_warps[rwe=4]"] < regs["fused_route_softmax_warps"]


@exhaustive
def test_ptx_sm90_device_kernels():
    ptx_sm90("refengine.cuda.ptx", timeout=600)


@(exhaustive if not GPU else (lambda f: f))                # the simulator: op by op, six forwards
def test_cuda_state_saved_and_loaded(tmp_path_factory, tmp_path):
    """A state saved mid-run on the cuda backend (on a GPU its arrays are read back from the device: refengine/
    state_file.py) and loaded into a fresh Model continues on the cuda backend as the uninterrupted run, bit for
    bit (a loaded cache moves to the device at its first append)."""
    from refengine.state_file import load_state, save_state
    m = _model(tmp_path_factory, "llama", "tiny" if GPU else "micro", "Q8_0")
    prompt, toks = ([3, 17, 42, 5, 9], [7, 11, 13, 2]) if GPU else ([3, 17], [7, 11])
    rt = Runtime(backend="cuda")
    st = m.new_state()
    want = [m.forward(prompt, st, rt=rt)] + [m.forward([t], st, rt=rt) for t in toks]
    st = m.new_state()
    m.forward(prompt, st, rt=rt)
    m.forward(toks[:1], st, rt=rt)
    save_state(tmp_path / "s.safetensors", m, st)
    m2 = Model(m.path)
    loaded = load_state(tmp_path / "s.safetensors", m2)
    assert loaded.n_past == len(prompt) + 1
    got = [m2.forward([t], loaded, rt=Runtime(backend="cuda")) for t in toks[1:]]
    for i, (w, g) in enumerate(zip(want[2:], got)):
        assert np.array_equal(w, g), f"step {i}: relative RMS {rel_rms(g, w):.2e}"
