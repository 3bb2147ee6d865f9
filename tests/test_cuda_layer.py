"""The model on the cuda backend against the NumPy backend (which matches llama.cpp: test_compare*).

- `DeviceModel` (whole forward on the GPU, the fast path of `Runtime(backend="cuda")`): prefill then
  decode, logits within relative RMS 1e-5 of the NumPy backend's.
- the traced path (`Runtime(backend="cuda", trace=...)`: NumPy block code, cuda matmul / moe_ffn):
  every named intermediate within 1e-5 of the NumPy trace.
- the device kernels for norms / RoPE / attention / routing compile for sm_90.

On a GPU: the tiny presets of llama and qwen3moe in several weight types. In the simulator: one
micro model (a few thousand weights), one layer.

Tiers (tests/tiers.py): `exhaustive` marks the device model's prefill on the tensor-core attention in the
simulator (minutes: its value product has 128-row tiles; `test_tc_causal_skips` checks the causal GEMM modes it
uses in the default tier) and the PTX compile of every specialization (the default tier compiles one per family).
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
def test_device_model_equals_numpy(arch, preset, wtype, tmp_path_factory):
    from refengine.cuda import DeviceModel, unsupported
    m = _model(tmp_path_factory, arch, preset, wtype)
    assert unsupported(m) is None
    prompt, steps = ([3, 17, 42, 5, 9], 4) if GPU else ([3, 17], 1)
    want, got = [], []
    st = m.new_state()
    want.append(m.forward(prompt, st))
    dm = DeviceModel(m)
    sd = m.new_state()
    got.append(dm.forward(prompt, sd))
    for i in range(steps):                      # decode: eager, then a captured graph, then replays
        tok = int(np.argmax(want[-1][-1]))
        want.append(m.forward([tok], st))
        got.append(dm.forward([tok], sd))
    for i, (g, w) in enumerate(zip(got, want)):
        assert rel_rms(g, w) <= TOL, f"step {i}: relative RMS {rel_rms(g, w):.2e}"
    if GPU:
        assert dm.n_replays >= steps - 2
    # a prompt whose next token is wanted (`last_only`): the head on its last row alone, that row read back
    last = dm.forward(prompt, m.new_state(), last_only=True)
    assert last.shape == (1, m.cfg.n_vocab) and rel_rms(last, want[0][-1:]) <= TOL
    # the runtime takes the device path when asked (device_model=True) and no trace is recorded; by default the
    # concept modules
    assert Runtime(backend="cuda", device_model=True).device_forward(m) is not None
    assert Runtime(backend="cuda").device_forward(m) is None
    via = m.forward(prompt, m.new_state(), rt=Runtime(backend="cuda", device_model=True), last_only=True)
    assert via.shape == (1, m.cfg.n_vocab) and rel_rms(via, want[0][-1:]) <= TOL


def _attention_np(q, kc, vc, pos, scale):
    """Causal attention as `refengine.attention` computes it: float32 scores, exp in float32, sum in float64."""
    T, H, K = q.shape
    G = H // kc.shape[1]
    out = np.zeros((T, H * K), np.float32)
    for t in range(T):
        S = pos + t + 1
        for h in range(H):
            sc = (kc[:S, h // G] @ q[t, h]).astype(np.float32) * np.float32(scale)
            e = np.exp(sc - sc.max()).astype(np.float32)
            p = (e / e.astype(np.float64).sum()).astype(np.float32)
            out[t, h * K:(h + 1) * K] = p @ vc[:S, h // G]
    return out


@pytest.mark.parametrize("G", [1, 3, 8])
def test_attention_gqa_kernel(G):
    """The prefill attention kernel (one block per KV head and token, G query heads) against NumPy."""
    from numba import cuda

    from refengine.cuda.kernels import attention_gqa_kernel, gqa_fits
    rng = np.random.default_rng(G)
    Hkv, K, pos, T = (2, 128, 37, 20) if GPU else (2, 8, 3, 2)
    H = G * Hkv
    S = pos + T
    assert gqa_fits(G, S, K)
    q = rng.standard_normal((T, H, K)).astype(np.float32)
    kc = rng.standard_normal((S + 5, Hkv, K)).astype(np.float32)
    vc = rng.standard_normal((S + 5, Hkv, K)).astype(np.float32)
    out = cuda.to_device(np.zeros((T, H * K), np.float32))
    scale = 1.0 / np.sqrt(K)
    attention_gqa_kernel(G)[(Hkv, T), 256 if GPU else 64](cuda.to_device(q), cuda.to_device(kc), cuda.to_device(vc),
                                                         cuda.to_device(np.array([pos], np.int32)), scale, out)
    got = out.copy_to_host()
    assert rel_rms(got, _attention_np(q, kc, vc, pos, scale)) <= 1e-6


@pytest.mark.parametrize("G,T,pos", [(1, 1, 0), (8, 1, 19), (3, 2, 200), (4, 1, 1000)])
def test_attention_kernel(G, T, pos):
    """The decode attention kernel (one block per query head and token) against NumPy: a key a thread,
    values a warp per key subset, from a single key (pos 0) to more keys than threads."""
    from numba import cuda

    from refengine.cuda.kernels import ATT_W, attention_kernel
    rng = np.random.default_rng(G * 100 + pos)
    Hkv, K = (2, 128) if GPU else (2, 8)
    if not GPU:
        pos = min(pos, 40)
    H = G * Hkv
    S = pos + T
    q = rng.standard_normal((T, H, K)).astype(np.float32)
    kc = rng.standard_normal((S + 5, Hkv, K)).astype(np.float32)
    vc = rng.standard_normal((S + 5, Hkv, K)).astype(np.float32)
    out = cuda.to_device(np.full((T, H * K), np.nan, np.float32))
    scale = 1.0 / np.sqrt(K)
    attention_kernel[(H, T), 32 * ATT_W](cuda.to_device(q), cuda.to_device(kc), cuda.to_device(vc),
                                         cuda.to_device(np.array([pos], np.int32)), scale, out)
    assert rel_rms(out.copy_to_host(), _attention_np(q, kc, vc, pos, scale)) <= 1e-6


@pytest.mark.parametrize("A,D", [(1, 2048), (8, 2048), (1, 9000), (3, 70)])
def test_add_rms_norm_kernel(A, D):
    """The residual add / expert combine + RMS norm kernel, and the plain norm, against `ops.rms_norm`; D = 9000
    takes two passes per row on a GPU block (values re-read), D = 70 leaves threads idle."""
    from numba import cuda

    from refengine.cuda.kernels import NORM_BLOCK, add_rms_norm_kernel, rms_norm_kernel
    from refengine.ops.norm import rms_norm
    if not GPU:
        D = min(D, 300)                        # > NPT * 32: two passes in the simulator too
    rng = np.random.default_rng(A * D)
    T, eps = 3, 1e-6
    dn = rng.standard_normal((T * A, D)).astype(np.float32)
    res = rng.standard_normal((T, D)).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    xo = cuda.to_device(np.full((T, D), np.nan, np.float32))
    out = cuda.to_device(np.full((T, D), np.nan, np.float32))
    add_rms_norm_kernel[T, NORM_BLOCK](cuda.to_device(dn), A, cuda.to_device(res), True, cuda.to_device(w), eps, xo, out)
    want_x = dn[0::A]
    for a in range(1, A):                                # slot order, then the residual, as moe.slot_sum
        want_x = want_x + dn[a::A]
    want_x = res + want_x
    assert np.array_equal(xo.copy_to_host(), want_x)
    assert rel_rms(out.copy_to_host(), rms_norm(want_x, w, eps)) <= 1e-6
    out2 = cuda.to_device(np.full((T, D), np.nan, np.float32))
    rms_norm_kernel[T, NORM_BLOCK](cuda.to_device(res), cuda.to_device(w), eps, out2)
    assert rel_rms(out2.copy_to_host(), rms_norm(res, w, eps)) <= 1e-6


@pytest.mark.parametrize("E,k", [(128, 8), (60, 4), (256, 8), (1024, 2)])
def test_route_kernel(E, k):
    """Softmax top-k routing against `moe.router.softmax_topk` (ids equal, weights within 1e-6), with tied
    logits in the rows so the lower index must win."""
    from numba import cuda

    from refengine.cuda.kernels import route_kernel
    from refengine.moe.router import softmax_topk
    rng = np.random.default_rng(E)
    T = 4
    lg = rng.standard_normal((T, E)).astype(np.float32)
    lg[1, E // 2] = lg[1, 3] = lg[1].max() + 1                    # a tie at the top
    lg[2, :] = 0.5                                               # all tied
    ids = cuda.to_device(np.full((T, k), -1, np.int32))
    wts = cuda.to_device(np.zeros(T * k, np.float32))
    route_kernel(E)[T, 32](cuda.to_device(lg), k, True, ids, wts)
    want_ids, want_w = softmax_topk(lg, k, norm_w=True)
    assert np.array_equal(ids.copy_to_host(), want_ids)
    assert rel_rms(wts.copy_to_host().reshape(T, k), want_w) <= 1e-6


@pytest.mark.parametrize("causal", [1, 2])
def test_tc_causal_skips(causal):
    """The tensor-core GEMM's causal modes on a small F32 matrix: 1 skips row tiles past what a token tile sees
    (those outputs stay unwritten: NaN here), 2 stops the K loop after the tile holding the last visible column
    (the activations are zero past it, as the softmax leaves them). Pair rows t, token t sees rows < pos + t + 1."""
    from numba import cuda

    from quant.cuda import ops
    from refengine.cuda import attn
    rng = np.random.default_rng(causal)
    T, pos = 34, (0 if causal == 1 else 96)
    O, I = (48, 128) if causal == 1 else (16, 256)
    w = rng.standard_normal((O, I)).astype(np.float32)
    x = rng.standard_normal((T, I)).astype(np.float32)
    vis = np.arange(I if causal == 2 else O)[None, :] < (pos + np.arange(T) + 1)[:, None]     # [T, cols or rows]
    if causal == 2:
        x = np.where(vis, x, 0).astype(np.float32)
    grp = cuda.to_device(attn.head_groups(T, 1, 1))
    y = cuda.to_device(np.full((T, O), np.nan, np.float32))
    ops.grouped(attn.CacheMat(cuda.to_device(w), O, I, 1, I * 4, O * I * 4), cuda.to_device(x), y, grp, 1, T, T,
                kernel="tc", shape=dict(BM=16, WM=1, WN=1, CV=-1), causal=causal,      # 16-row tiles: one is skipped
                cpos=cuda.to_device(np.array([pos], np.int32)), ch=1)
    got, want = y.copy_to_host(), x @ w.T
    if causal == 1:
        assert np.isnan(got[:32, 32:]).all()                 # the first tile (tokens 0..31) sees rows < 32 only
        got, want = np.where(vis, got, 0), np.where(vis, want, 0)
    assert rel_rms(got, want) <= 1e-6


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs an NVIDIA GPU (in the simulator: test_tc_causal_skips, and the model "
                                      "test below runs attention_tc)")
def test_attention_tc():
    """Prefill attention on the tensor cores against NumPy, with tiles whose causal skips apply (score rows and
    value columns no token of a 32-token tile sees; the score buffer starts as NaN: nothing unwritten is read)."""
    from numba import cuda

    from refengine.cuda import attn
    rng = np.random.default_rng(7)
    T, H, Hkv, K, pos = 300, 8, 2, 128, 37
    S = pos + T
    s_pad = attn.cols(S + 100)
    q = rng.standard_normal((T, H, K)).astype(np.float32)
    kc = rng.standard_normal((S + 100, Hkv, K)).astype(np.float32)
    vc = rng.standard_normal((S + 100, Hkv, K)).astype(np.float32)
    vt = np.zeros((Hkv, K, s_pad), np.float32)
    vt[:, :, :S] = vc[:S].transpose(1, 2, 0)
    scores = cuda.to_device(np.full((T * H, attn.cols(S)), np.nan, np.float32))
    att = cuda.to_device(np.zeros((T, H * K), np.float32))
    grp = cuda.to_device(attn.head_groups(T, H, H // Hkv))
    scale = 1.0 / np.sqrt(K)
    attn.attention_tc(cuda.to_device(q), cuda.to_device(kc), cuda.to_device(vt), cuda.to_device(np.array([pos], np.int32)),
                      pos, scale, scores, att, grp)
    assert rel_rms(att.copy_to_host(), _attention_np(q, kc, vc, pos, scale)) <= 1e-6


@pytest.mark.parametrize("path", ["gqa", pytest.param("tc", marks=exhaustive)])
def test_device_model_prefill_attention(path, tmp_path_factory, monkeypatch):
    """The device forward with each prefill attention (taken from the first token on) against NumPy: the
    per-KV-head kernel, and the tensor-core GEMMs around the causal softmax (head dim 128; in the simulator
    the per-KV-head kernel runs on the micro model, head dim 32)."""
    from quant.cuda import ops
    from refengine.cuda import DeviceModel, attn
    if GPU:
        arch, preset, wtype = CASES[0]                              # qwen3moe tiny: head dim 128
        m = _model(tmp_path_factory, arch, preset, wtype)
        prompt = [3, 17, 42, 5, 9, 11, 2]
    elif path == "gqa":
        m = _model(tmp_path_factory, "qwen3moe", "micro", "Q8_0")
        prompt = [3, 17]
    else:
        monkeypatch.setattr(ops, "TC_SHAPE", dict(BM=16, WM=1, WN=1, CV=-1))    # 32 simulated threads a block
        synth.PRESETS["qwen3moe"].setdefault("micro128", dict(MICRO_MOE, head_dim=128))
        path_ = tmp_path_factory.mktemp("cuda") / "qwen3moe-micro128-Q8_0.gguf"
        m = Model(synth.write_synth("qwen3moe", path_, preset="micro128", wtype="Q8_0", progress=False))
        prompt = [3, 17]
    K = m.cfg.head_dim_k
    assert attn.fits(len(prompt), m.cfg.layers[0].n_head, K, m.cfg.head_dim_v, len(prompt)) == (K % 128 == 0)
    calls = []
    real_tc = attn.attention_tc
    monkeypatch.setattr(attn, "attention_tc", lambda *a, **k: calls.append(1) or real_tc(*a, **k))
    st, sd = m.new_state(), m.new_state()
    dm = DeviceModel(m, graphs=False, tc_attention=path == "tc", gqa_min_t=1)
    want = m.forward(prompt, st)
    assert rel_rms(dm.forward(prompt, sd), want) <= TOL
    assert bool(calls) == (path == "tc")
    tok = int(np.argmax(want[-1]))                  # one decoded token on the cache the prefill wrote
    assert rel_rms(dm.forward([tok], sd), m.forward([tok], st)) <= TOL


@pytest.mark.parametrize("split_min_t", [2, 100])
def test_device_model_dense_ffn_split(split_min_t, tmp_path_factory, monkeypatch):
    """A dense FFN's prompt: gate and up as two `dense` products then SwiGLU (from split_ffn_min_t tokens), or the
    one-launch GEMV pair (fewer): both against NumPy, prefill and a decoded token, and the path taken checked."""
    import refengine.cuda.runner as runner
    from refengine.cuda import DeviceModel
    arch, preset, wtype = ("llama", "tiny", "Q4_K") if GPU else ("llama", "micro", "Q8_0")
    m = _model(tmp_path_factory, arch, preset, wtype)
    prompt = [3, 17, 42, 5, 9, 11, 2, 8, 30, 1] if GPU else [3, 17]
    dm = DeviceModel(m, graphs=False, split_ffn_min_t=split_min_t)
    gates = {id(L.gate) for L in (dm.layer(il) for il in range(m.cfg.n_layer))}
    seen = []
    real_dense = runner.dense
    monkeypatch.setattr(runner, "dense", lambda dw, *a, **k: seen.append(id(dw) in gates) or real_dense(dw, *a, **k))
    st, sd = m.new_state(), m.new_state()
    want = m.forward(prompt, st)
    assert rel_rms(dm.forward(prompt, sd), want) <= TOL
    assert seen.count(True) == (m.cfg.n_layer if len(prompt) >= split_min_t else 0)
    tok = int(np.argmax(want[-1]))
    assert rel_rms(dm.forward([tok], sd), m.forward([tok], st)) <= TOL
    assert seen.count(True) == (m.cfg.n_layer if len(prompt) >= split_min_t else 0)    # a decode step: the pair


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
    """One specialization of each device-path kernel (norms, RoPE, attention, softmax, routing) compiles for sm_90."""
    ptx_sm90("refengine.cuda.ptx", ["rms_norm", "add", "add_rms_norm", "qk_rope", "attention", "attention_gqa[G=8]",
                                    "softmax_causal", "route[E=128]", "fused_rms_norm", "fused_softmax", "fused_silu",
                                    "fused_delta_rule", "fused_causal_conv", "fused_rope", "fused_attention",
                                    "fused_all_finite", "fused_ggml_top_k_rows"])


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


@(exhaustive if not GPU else (lambda f: f))                # the simulator: a minute (six device forwards)
def test_device_state_saved_and_loaded(tmp_path_factory, tmp_path):
    """The device cache is copied to the host when saved (refengine/state_file.py) and uploaded when a loaded state
    first runs on the device: the continuation equals the uninterrupted device run bit for bit."""
    from refengine.cuda import DeviceModel
    from refengine.state_file import load_state, save_state
    m = _model(tmp_path_factory, "llama", "tiny" if GPU else "micro", "Q8_0")
    prompt, toks = ([3, 17, 42, 5, 9], [7, 11, 13, 2]) if GPU else ([3, 17], [7, 11])
    dm = DeviceModel(m)
    st = m.new_state()
    want = [dm.forward(prompt, st)] + [dm.forward([t], st) for t in toks]
    st = m.new_state()
    dm.forward(prompt, st)
    dm.forward(toks[:1], st)
    save_state(tmp_path / "s.safetensors", m, st)
    assert st.device is not None and all(kv.n == 0 for kv in st.layers)     # the caller's state is left as it was
    m2 = Model(m.path)
    loaded = load_state(tmp_path / "s.safetensors", m2)
    assert all(kv.n == len(prompt) + 1 for kv in loaded.layers)
    dm2 = DeviceModel(m2)
    got = [dm2.forward([t], loaded) for t in toks[1:]]
    for i, (w, g) in enumerate(zip(want[2:], got)):
        assert np.array_equal(w, g), f"step {i}: relative RMS {rel_rms(g, w):.2e}"
