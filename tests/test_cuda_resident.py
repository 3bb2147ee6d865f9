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


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["llama", "qwen3next", "deepseek2"])
def test_state_continued_by_another_runtime(synth_model, arch):
    """A state prefilled under one Runtime and decoded under fresh ones (a served sequence, a loaded state) runs
    the same kernels as one Runtime's run, bit for bit: each Runtime has its own Device, and a state's arrays are
    re-homed to the one running them (`Device.adopt`). Without that, the fused kernels refused the other Device's
    arrays and the NumPy statements ran instead: logits ~2.4e-6 apart at the first decode step (llama tiny, H100)."""
    pytest.importorskip("cupy")
    m = Model(synth_model(arch, wtype="Q8_0"))
    one = Runtime(backend="cuda")
    st1, st2 = m.new_state(), m.new_state()
    m.forward(TOKENS, st1, rt=one)
    m.forward(TOKENS, st2, rt=Runtime(backend="cuda"))
    for tok in (5, 9, 11):
        want, got = m.forward([tok], st1, rt=one), m.forward([tok], st2, rt=Runtime(backend="cuda"))
        assert np.array_equal(want, got), f"{arch} token {tok}: max |diff| {np.max(np.abs(want - got)):.2e}"


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("F", [128, 256])
def test_one_token_experts_ids_stay_on_device(F):
    """One token's routed experts with its ids on the device: when the one-token kernels refuse the weights (Q8_0
    rows of F = 128 are 136 bytes, not 16-byte aligned: qwen4exp's tiny experts) the group tables are built on the
    device (`bucket_kernel`), not read back; bit-identical to the host-built tables' run, for aligned rows (the
    one-token kernels) too, and no read-back inside a capture-like strict span (CuPy raises on a D2H in capture)."""
    cp = pytest.importorskip("cupy")
    from quant import GGMLType
    from quant.cuda.resident import moe_ffn_resident
    from quant.cuda.testdata import random_qtensor
    rng = np.random.default_rng(F)
    E, A, D = 8, 3, 256
    t = GGMLType.Q8_0
    up, gate = random_qtensor(t, (E, F, D), rng, "up"), random_qtensor(t, (E, F, D), rng, "gate")
    down = random_qtensor(t, (E, D, F), rng, "down")
    x = cp.asarray(rng.standard_normal((1, D)).astype(np.float32))
    ids = np.array([[5, 1, 6]], np.int32)
    wts = cp.asarray(rng.uniform(0.1, 1.0, (1, A)).astype(np.float32))
    kw = dict(up=up, gate=gate, down=down)
    want = moe_ffn_resident(x, ids, wts, **kw)                       # host ids: host-built tables
    reads = []
    got = moe_ffn_resident(x, cp.asarray(ids), wts, read_ids=lambda a: reads.append(a) or a.get(), **kw)
    assert not reads, "the ids were read back"
    assert cp.array_equal(got, want), float(cp.max(cp.abs(got - want)))


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("T", [1, 5])
def test_expert_slots_sum_to_the_combined_output(T):
    """`moe_ffn_resident(..., slots=True)`: the A weighted slots [T, A, D] unsummed (the next norm adds them,
    `ops.add_slots_rms_norm`); their sum in slot order (`ops.slot_sum`) is the combined output bit for bit, the ids
    on the host (tables built there) and on the device (one token: the one-token kernels; several: tables built
    there)."""
    cp = pytest.importorskip("cupy")
    from quant import GGMLType
    from quant.cuda.resident import moe_ffn_resident
    from quant.cuda.testdata import random_qtensor
    from refengine.ops.norm import slot_sum
    rng = np.random.default_rng(T)
    E, A, D, F = 8, 3, 256, 256
    t = GGMLType.Q8_0
    kw = dict(up=random_qtensor(t, (E, F, D), rng, "up"), gate=random_qtensor(t, (E, F, D), rng, "gate"),
              down=random_qtensor(t, (E, D, F), rng, "down"))
    x = cp.asarray(rng.standard_normal((T, D)).astype(np.float32))
    ids = np.stack([rng.permutation(E)[:A] for _ in range(T)]).astype(np.int32)
    wts = cp.asarray(rng.uniform(0.1, 1.0, (T, A)).astype(np.float32))
    for i in (ids, cp.asarray(ids)):
        want = moe_ffn_resident(x, i, wts, **kw)
        sl = moe_ffn_resident(x, i, wts, slots=True, **kw)
        assert sl.shape == (T, A, D)
        assert cp.array_equal(slot_sum(sl), want), float(cp.max(cp.abs(slot_sum(sl) - want)))


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("chunk", [None, 96 * 512])
def test_sgemm_products_equal_the_reference(chunk, monkeypatch):
    """The prefill's cuBLAS path (quant/cuda/dequant_gemm.py: the weight decoded to float32, then SGEMM): a 2-D
    and a per-head product == quant.ref's within relative RMS 1e-6 (float32 summation order only), whole and in
    row chunks of 96 (the scratch buffer bounded)."""
    cp = pytest.importorskip("cupy")
    from quant import GGMLType, ref
    from quant.cuda import dequant_gemm
    from quant.cuda.resident import matmul_heads_resident, matmul_resident
    from quant.cuda.testdata import random_qtensor
    if chunk:
        monkeypatch.setattr(dequant_gemm, "CHUNK_ELEMS", chunk)
    rng = np.random.default_rng(3)
    w = random_qtensor(GGMLType.Q4_K, (300, 512), rng, "blk.0.ffn_up.weight")
    x = rng.standard_normal((130, 512)).astype(np.float32)
    y = cp.asnumpy(matmul_resident(cp.asarray(x), w, kernel="sgemm"))
    assert rel_rms(y, ref.matmul(x, w)) <= 1e-6
    wh = random_qtensor(GGMLType.Q4_K, (4, 96, 256), rng, "blk.0.attn_k_b.weight")
    xh = rng.standard_normal((4, 130, 256)).astype(np.float32)
    yh = cp.asnumpy(matmul_heads_resident(cp.asarray(xh), wh, kernel="sgemm"))
    W = ref.dequantize(wh)
    assert rel_rms(yh, np.einsum("hti,hoi->hto", xh, W)) <= 1e-6


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_tcq16_prefill_products_equal_the_reference(monkeypatch):
    """KernelPolicy(prefill_gemm="tcq16"): a Q4_K product of SGEMM_MIN tokens or more on tcq's f16 kernel (no decode,
    no cuBLAS) == quant.ref's within 1e-5; a Q8_0 weight stays on the cuBLAS path (same check)."""
    cp = pytest.importorskip("cupy")
    from quant import GGMLType, ref
    from quant.cuda import ops
    from quant.cuda.resident import matmul_resident
    from quant.cuda.testdata import random_qtensor
    monkeypatch.setattr(ops, "PREFILL_GEMM", "tcq16")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((200, 512)).astype(np.float32)
    for t in (GGMLType.Q4_K, GGMLType.Q8_0):
        w = random_qtensor(t, (300, 512), rng, "blk.0.ffn_up.weight")
        y = cp.asnumpy(matmul_resident(cp.asarray(x), w))
        assert rel_rms(y, ref.matmul(x, w)) <= 1e-5, t.name


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("gemm", ["sgemm", "h3"])
@pytest.mark.parametrize("arch", ["deepseek2", "qwen3next", "kimi-k3"])
def test_resident_sgemm_prefill_equals_numpy(synth_model, arch, gemm):
    """A whole resident forward with every product of 2+ tokens on the cuBLAS path (KernelPolicy(sgemm_min=2)),
    float32 SGEMM or 3xFP16 (hgemm.py), against NumPy: prefill and a decode step within TOL, same argmax."""
    pytest.importorskip("cupy")
    from quant.cuda.policy import KernelPolicy
    m = Model(synth_model(arch, wtype="Q8_0"))
    host = Runtime()
    pol = KernelPolicy.default().replace(sgemm_min=2, prefill_gemm=gemm)
    gpu = Runtime(backend="cuda", resident=True, kernel_policy=pol)
    st_h, st_g = m.new_state(), m.new_state()
    for toks in (TOKENS, [5]):
        a, b = m.forward(toks, st_h, rt=host), m.forward(toks, st_g, rt=gpu)
        assert rel_rms(b, a) <= TOL, (arch, rel_rms(b, a))
        assert np.array_equal(np.argmax(a, -1), np.argmax(b, -1))


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["deepseek32", "glm-dsa"])
def test_resident_dsa_every_key_kept_equals_numpy(synth_model, arch):
    """The DSA prompt whose selection keeps every key (top-k 64 >= 20 keys: masked-dense, mha.attend) on the
    GPU against NumPy, then a decode step: within TOL, same argmax."""
    pytest.importorskip("cupy")
    m = Model(synth_model(arch, wtype="Q8_0", overrides={"idx_top_k": 64}))
    host, gpu = Runtime(), Runtime(backend="cuda", resident=True)
    st_h, st_g = m.new_state(), m.new_state()
    for toks in (TOKENS, [5]):
        a, b = m.forward(toks, st_h, rt=host), m.forward(toks, st_g, rt=gpu)
        assert rel_rms(b, a) <= TOL, (arch, rel_rms(b, a))
        assert np.array_equal(np.argmax(a, -1), np.argmax(b, -1))
