"""Kernel choices as an explicit object (quant.cuda.policy.KernelPolicy) passed to the runtime: a product run
under a policy takes that policy's kernel shape and gives the NumPy reference's result; the module switches are
restored after every call, so two runtimes with two policies run side by side. Runs in the simulator (CI) and on
a GPU."""
import numpy as np
import pytest

qc = pytest.importorskip("quant.cuda")

from quant import QTensor, ref  # noqa: E402
from quant.cuda import ops  # noqa: E402
from quant.cuda.policy import KernelPolicy  # noqa: E402
from refengine.errors import ConfigError  # noqa: E402
from refengine.runtime import Runtime  # noqa: E402

pytestmark = pytest.mark.cuda


def q8_weight(rng, O, I):
    from refengine.synth import encode
    from quant import GGMLType
    w = rng.standard_normal((O, I)).astype(np.float32)
    return QTensor.from_raw("w", GGMLType.Q8_0, (O, I), encode(w, GGMLType.Q8_0))


def test_policy_chooses_the_kernel_and_restores(monkeypatch):
    if not qc.available():
        pytest.skip("no GPU and no simulator")
    rng = np.random.default_rng(0)
    w = q8_weight(rng, 16, 64)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    seen = []
    real = ops.grouped

    def spy(*a, **k):
        seen.append(ops.GEMV_DEFAULT)
        return real(*a, **k)
    monkeypatch.setattr(ops, "grouped", spy)
    before = KernelPolicy.default()
    pol = before.replace(gemv_default=(8, 1, 1), tc=False)
    rt = Runtime(backend="cuda", resident=False, kernel_policy=pol)
    y = rt.matmul(x, w)
    assert seen == [(8, 1, 1)], seen                              # the product ran under the policy's shape
    assert KernelPolicy.default() == before                       # and the module's choice is back
    np.testing.assert_allclose(y, ref.matmul(x, w), rtol=1e-5, atol=1e-5)


def test_policy_errors():
    with pytest.raises(ValueError, match="no field 'gemv'"):
        KernelPolicy.default().replace(gemv=(1, 1, 1))
    with pytest.raises(ConfigError, match="cuda kernels"):
        Runtime(backend="numpy", kernel_policy=KernelPolicy.default())


def test_policy_settings_from_strings():
    """KEY=VALUE strings (benchmarks' --policy): literals parsed, other text kept as a string, errors named."""
    pol = KernelPolicy.default().with_settings(["group_avg=16", "sgemm_decode=staged", "gemv_default=(8, 1, 1)",
                                                "tc=False"])
    assert (pol.group_avg, pol.sgemm_decode, pol.gemv_default, pol.tc) == (16, "staged", (8, 1, 1), False)
    with pytest.raises(ValueError, match="no field 'group'"):
        KernelPolicy.default().with_settings(["group=1"])
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        KernelPolicy.default().with_settings(["group_avg"])
    with pytest.raises(ValueError, match="sgemm_min expects int"):
        KernelPolicy.default().with_settings(["sgemm_min=many"])


def test_policy_turns_the_fused_small_ops_off():
    """KernelPolicy.fused_ops=False: a resident runtime's device runs the small ops as NumPy states them, op by op
    (Device.fused None); the default keeps the one-launch kernels (refengine/cuda/fused.py)."""
    pytest.importorskip("cupy")
    if not qc.available():
        pytest.skip("no GPU and no simulator")
    off = Runtime(backend="cuda", resident=True, kernel_policy=KernelPolicy.default().replace(fused_ops=False))
    on = Runtime(backend="cuda", resident=True)
    assert off.device.fused is None
    from refengine.cuda import fused
    assert on.device.fused is fused


def test_tile_size_other_than_the_group_tables_is_refused():
    """tc_shape / gemm_shape with another BN than the expert group tables' tile (moe.BN) would skip or repeat pairs:
    an error naming the field, not a silent wrong answer; tc_dense_shape builds its own table and may differ."""
    from quant.cuda.moe import BN
    from quant.cuda.policy import KernelPolicy
    pol = KernelPolicy.default()
    with pytest.raises(ValueError, match="tc_shape BN=16"):
        pol.replace(tc_shape=dict(pol.tc_shape, BN=16))
    with pytest.raises(ValueError, match="gemm_shape BN=64"):
        pol.with_settings([f"gemm_shape={dict(pol.gemm_shape, BN=64)!r}"])
    assert pol.replace(tc_dense_shape=dict(pol.tc_dense_shape, BN=64)).tc_dense_shape["BN"] == 64
    assert pol.replace(tc_shape=dict(pol.tc_shape, BM=32, WM=1)).tc_shape["BN"] == BN


def test_unknown_choice_is_refused():
    """A string switch the code compares with one value (else the other) would take a misspelt value silently."""
    from quant.cuda.policy import KernelPolicy
    pol = KernelPolicy.default()
    with pytest.raises(ValueError, match="prefill_gemm = 'h4'"):
        pol.with_settings(["prefill_gemm=h4"])
    with pytest.raises(ValueError, match="sgemm_decode = 'stage'"):
        pol.replace(sgemm_decode="stage")
    with pytest.raises(ValueError, match="h3_kc = 0"):
        pol.replace(h3_kc=0)
    assert pol.with_settings(["prefill_gemm=h3", "sgemm_decode=rows"]).prefill_gemm == "h3"


def test_gathered_prefill_choice_on_the_device():
    """KernelPolicy.gathered_prefill is the runtime's device's choice (refengine/cuda/fused.py takes_gathered: a
    prefill's gathered attention in the fused kernel or in mha's batched blocks); None leaves fused.py's default; a
    misspelt value is refused."""
    from refengine.cuda import fused
    pol = KernelPolicy.default()
    assert pol.gathered_prefill is None
    T = fused.ATTN_MAX_T + 1
    for choice in ("fused", "batched"):
        rt = Runtime(backend="cuda", resident=True, kernel_policy=pol.replace(gathered_prefill=choice))
        dev = rt.device
        if dev is None:
            pytest.skip("no device-resident runtime here (CuPy or its stand-in)")
        assert dev.gathered_prefill == choice
        assert fused.takes_gathered(T, dev) == (choice == "fused") and fused.takes_gathered(1, dev)
    rt = Runtime(backend="cuda", resident=True, kernel_policy=pol)
    assert rt.device.gathered_prefill is None
    assert fused.takes_gathered(T, rt.device) == (fused.GATHERED_PREFILL == "fused")
    with pytest.raises(ValueError, match="gathered_prefill = 'fuse'"):
        pol.with_settings(["gathered_prefill=fuse"])


def test_prefill_attention_choice_on_the_device():
    """KernelPolicy.prefill_attention is the runtime's device's choice (refengine/cuda/fused.py: a prefill's dense
    attention in `_attention_rows` or in mha's batched blocks); None leaves fused.py's default."""
    from refengine.cuda import fused
    pol = KernelPolicy.default()
    assert pol.prefill_attention is None
    for choice in ("rows", "batched", "auto"):
        rt = Runtime(backend="cuda", resident=True, kernel_policy=pol.replace(prefill_attention=choice))
        if rt.device is None:
            pytest.skip("no device-resident runtime here (CuPy or its stand-in)")
        assert rt.device.prefill_attention == choice
    assert Runtime(backend="cuda", resident=True, kernel_policy=pol).device.prefill_attention is None
    assert fused.PREFILL_ATTENTION == "auto"


def test_fused_off_leaves_entries_to_numpy(synth_model):
    """KernelPolicy.fused_off: the named fused entries are not reached (the ops run as NumPy states them), the
    others are, and the result is the same bits (on the sim device's stand-ins, whose entries compute the NumPy
    functions); "a,b" on the command line is a tuple; an unknown entry is a ConfigError naming it."""
    from refengine.cuda.standin import StandIn
    from refengine.errors import ConfigError
    from refengine.model import Model
    pol = KernelPolicy.default()
    assert pol.with_settings(["fused_off=gated_mean, streams_combine"]).fused_off == ("gated_mean", "streams_combine")
    with pytest.raises(ConfigError, match="no fused entry 'rms_nrom'"):
        Runtime(backend="cuda", resident=True, kernel_policy=pol.replace(fused_off=("rms_nrom",)))
    off = ("gated_mean", "streams_combine", "route_softmax")
    rt = Runtime(backend="cuda", resident=True, kernel_policy=pol.replace(fused_off=off))
    if rt.device is None:
        pytest.skip("no device-resident runtime here (CuPy or its stand-in)")
    assert rt.device.fused_off == frozenset(off)
    from refengine.cuda import fused                      # (a policy's flag_batch None: the kernel's own batch)
    assert rt._flag_batch(fused) == fused.FLAG_BATCH
    m = Model(synth_model("qwen4exp", wtype="Q8_0"))
    outs, hits = [], []
    for left in (frozenset(), rt.device.fused_off):      # the sim device (a GPU's forward: the next lease's)
        rt = Runtime(resident=True)
        stand = rt.device.fused = StandIn(rt.device)
        rt.device.fused_off = left
        st = m.new_state()
        outs.append([m.forward([3, 9, 27], st, rt=rt), m.forward([5], st, rt=rt)])
        hits.append(dict(stand.hits))
    assert all(hits[0].get(k) for k in off), sorted(hits[0])          # reached by default ...
    assert not any(hits[1].get(k) for k in off), hits[1]              # ... and left out under the policy
    assert set(hits[0]) - set(off) <= set(hits[1])                   # (the NumPy statements reach others: top_k)
    for a, b in zip(*outs):
        assert np.array_equal(a, b)


def test_sgemm_path_is_left_inside_a_capture(monkeypatch):
    """The cuBLAS path of a resident product (from KernelPolicy.sgemm_min tokens) is not taken while a graph
    capture records launches (CuPy refuses cuBLAS there): a captured ubatch of 512 tokens multiplies on the
    project's kernels, an eager one on cuBLAS. (The choice alone, as a GPU would make it: SIM patched off.)"""
    from quant.cuda import resident, timing
    monkeypatch.setattr(resident, "SIM", False)
    monkeypatch.setattr(ops, "SGEMM_MIN", 128)
    assert resident._sgemm("auto", 512) and not resident._sgemm("auto", 64) and not timing.capturing()
    monkeypatch.setattr(timing, "_CAPTURING", [1])
    assert timing.capturing() and not resident._sgemm("auto", 512)
    assert resident._sgemm("sgemm", 512)                  # (a forced choice stays forced)


def test_sgemm_path_is_left_in_a_captures_eager_step(monkeypatch):
    """A graph decoder's eager step of T tokens (`timing.graph_kernels()`, the step before that T's capture) takes
    the capture's kernels, not cuBLAS: their kernels are compiled and their tables made there, outside the capture,
    and the replays compute what it computed. Outside the span the choice is as before."""
    from quant.cuda import resident, timing
    monkeypatch.setattr(resident, "SIM", False)
    monkeypatch.setattr(ops, "SGEMM_MIN", 128)
    assert resident._sgemm("auto", 512) and not timing.graph_like()
    with timing.graph_kernels():
        assert timing.graph_like() and not timing.capturing() and not resident._sgemm("auto", 512)
        with timing.graph_kernels():                      # (nested spans)
            assert not resident._sgemm("auto", 512)
        assert not resident._sgemm("auto", 512)
    assert resident._sgemm("auto", 512) and not timing.graph_like()
