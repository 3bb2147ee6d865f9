"""kimi-linear (KDA + MLA without rope + DeepSeek-style MoE) against llama.cpp, tensor by tensor.

F32 weights: every tensor llama.cpp names is traced (`not rep.only_in_llamacpp`), each NMSE <= 1e-8, logits
NMSE <= 1e-8, top-1 100% — the loader variants (plain tiny, all optional, fused attn_qkv, 3-D conv / 2-D ssm_a,
legacy attn_kv_b) are cases of test_vs_llamacpp.py's F32 list; here decode, the chunked form and a cut file.
Q8_0 / Q4_K in llama.cpp mode: tests/test_llamacpp_mode.py (LLAMACPP_CASES, outcomes pinned in
tests/llamacpp_mode_outcomes.py).
"""
import numpy as np
import pytest

from refengine.compare import run_compare
from reportcheck import check_report
from traced_names import expected_names

oracle = pytest.mark.oracle          # the tests that run llama.cpp

ARCH = "kimi-linear"
TOKENS = [7, 200, 13, 55, 1, 99, 144, 3, 250, 31, 8, 77, 19, 64, 128, 2, 240, 11, 90, 17, 33, 5, 201, 160,
          42, 9, 118, 77, 230, 4]

def check_f32(rep, kinds):
    """Every tensor and the logits within the F32 tolerance, the tiny file's names compared (traced_names)."""
    check_report(rep, 1e-8, want=expected_names(ARCH, {}, kinds))



def test_conv_weight_must_be_f32(tmp_path):
    """ggml_ssm_conv reads F32: another stored type is refused at load, naming the tensor."""
    from refengine.errors import WeightError
    from refengine.model import Model
    from refengine.synth import write_synth
    import refengine.synth as synth
    from quant import GGMLType
    orig = synth.choose_type
    synth.choose_type = lambda tp, wt: GGMLType.F16 if tp.kind == "conv" else orig(tp, wt)
    try:
        path = write_synth(ARCH, tmp_path / "f16conv.gguf")
    finally:
        synth.choose_type = orig
    with pytest.raises(WeightError, match="ssm_conv1d_q"):
        Model(path).layer(0)


def test_real_size_preset():
    """kimi-linear-48b carries the published config: 49.1e9 stored values, 3.5e9 active per token (48B-A3B),
    MLA at blocks 3, 7, .., 23 and 26; `layers=N` keeps the first N blocks' kinds."""
    from refengine.synth import plan_tensors, resolve_preset
    p = resolve_preset(ARCH, "kimi-linear-48b")
    assert (p["n_vocab"], p["n_embd"], p["n_layer"], p["n_head"], p["kda_head"], p["kv_lora"]) == \
        (163840, 2304, 27, 32, 128, 512)
    assert (p["n_expert"], p["n_expert_used"], p["n_ff_exp"], p["n_shared"], p["w_scale"]) == (256, 8, 1024, 1, 2.446)
    assert p["mla_layers"] == (3, 7, 11, 15, 19, 23, 26)
    plan = plan_tensors(ARCH, p)
    total = sum(int(np.prod(t.shape, dtype=np.int64)) for t in plan)
    experts = sum(int(np.prod(t.shape, dtype=np.int64)) for t in plan if "_exps" in t.name)
    assert 48.5e9 < total < 49.5e9 and 3.3e9 < total - experts * (1 - 8 / 256) < 3.7e9
    four = {t.name for t in plan_tensors(ARCH, resolve_preset(ARCH, "kimi-linear-48b", layers=4))}
    assert "blk.3.attn_kv_a_mqa.weight" in four and "blk.2.ssm_conv1d_q.weight" in four
    two = resolve_preset(ARCH, "kimi-linear-48b", layers=2)          # no MLA block kept: the last one becomes MLA
    assert two["mla_layers"] == (1,) and two["n_dense_lead"] == 1


@oracle
def test_layers_cut_loads_in_llamacpp(synth_model):
    """tiny cut to 2 blocks (KDA + an MLA block put last, see synth_resolve) runs in llama.cpp and matches."""
    rep = run_compare(synth_model(ARCH, layers=2), TOKENS[:10])
    check_f32(rep, ["kda", "mla"])


def test_kda_options_for_kimi_k3():
    """KDAConfig's math options that kimi-k3 takes (kimi-k3.cpp:420-472): the gate lower-bound formula, and a
    full-rank output gate `ssm_g` equal to the low-rank product gives the low-rank layer's output (float32 order
    only). The trace names are each arch's data: beta is traced before its sigmoid by kimi-linear, after it by
    kimi-k3, and each arch records only the names it maps."""
    from types import SimpleNamespace
    from quant import GGMLType, QTensor
    from refengine.attention import kda
    from refengine.cache import RecurrentState
    from refengine.runtime import Runtime
    rng = np.random.default_rng(0)
    z = rng.standard_normal((3, 2, 4)).astype(np.float32)
    a = -np.exp(rng.uniform(-3, 0, 2)).astype(np.float32)
    kc = kda.KDAConfig(n_head=2, head_dim=4, d_conv=4, rms_eps=1e-5, gate_lower_bound=-5.0)
    g = kda.gate_decay(z, a, kc)
    assert np.allclose(g, -5.0 / (1.0 + np.exp(a[None, :, None] * z)), rtol=1e-6)
    assert (g < 0).all() and (g > -5).all()

    D, H, dh, Kc, T = 16, 2, 8, 4, 5
    d_in = H * dh
    f32 = lambda *s: (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32)   # noqa: E731
    q = lambda name, x: QTensor.from_raw(name, GGMLType.F32, x.shape, x.reshape(-1).view(np.uint8))  # noqa: E731
    w = {n: q(n, f32(*s)) for n, s in dict(attn_q=(d_in, D), attn_k=(d_in, D), attn_v=(d_in, D), ssm_f_a=(dh, D),
                                             ssm_f_b=(d_in, dh), ssm_beta=(H, D), ssm_g_a=(dh, D), ssm_g_b=(d_in, dh),
                                             attn_output=(D, d_in)).items()}
    for x in "qkv":
        w[f"ssm_conv1d_{x}"] = f32(d_in, 1, Kc)                      # decoded at load (dense rows)
    w.update(ssm_a=a, ssm_dt_b=0.1 * f32(d_in), ssm_norm=1 + 0.1 * f32(dh), attn_qkv=None)
    g_b, g_a = (np.asarray(w[n].raw).view(np.float32).reshape(w[n].shape) for n in ("ssm_g_b", "ssm_g_a"))
    full = q("ssm_g", (g_b.astype(np.float64) @ g_a.astype(np.float64)).astype(np.float32))     # [d_in, D]
    h = f32(T, D)
    from refengine.archs import kimi_k3, kimi_linear
    from refengine.trace import Trace
    t_low, t_full = Trace(), Trace()
    low = kda.kda_layer(h, SimpleNamespace(**w), kc=kda.KDAConfig(H, dh, Kc, 1e-5), il=0, state=RecurrentState(),
                        rt=Runtime(trace=t_low), names=kimi_linear.KDA_NAMES)
    kc_full = kda.KDAConfig(H, dh, Kc, 1e-5, full_rank_gate=True)
    got = kda.kda_layer(h, SimpleNamespace(**w, ssm_g=full), kc=kc_full, il=0, state=RecurrentState(),
                        rt=Runtime(trace=t_full), names=kimi_k3.KDA_NAMES)
    assert np.abs(got - low).max() <= 1e-5 * np.abs(low).max()
    for names, t in ((kimi_linear.KDA_NAMES, t_low), (kimi_k3.KDA_NAMES, t_full)):
        want = {f"{n}-0" for v in names.values() for n in ((v,) if isinstance(v, str) else v)}
        assert set(names) <= set(kda.POINTS) and set(t) == want
    b = h @ np.asarray(w["ssm_beta"].raw).view(np.float32).reshape(H, D).T                 # [T, H] logits
    np.testing.assert_allclose(t_low["kda_beta-0"], b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t_full["kda_beta-0"], 1 / (1 + np.exp(-b)), rtol=1e-5, atol=1e-6)


@oracle
def test_chunked_delta_rule_matches_llamacpp(synth_model):
    """The KDA layers run the chunked form (chunks of 16; 30 tokens = 16 + 14) against llama.cpp's fused
    token-by-token kernel: every tensor and the logits within the F32 tolerance."""
    rep = run_compare(synth_model(ARCH), TOKENS, attn_form="chunked")
    check_f32(rep, ["kda", "kda", "kda", "mla"])
