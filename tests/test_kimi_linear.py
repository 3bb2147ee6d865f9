"""kimi-linear (KDA + MLA without rope + DeepSeek-style MoE) against llama.cpp, tensor by tensor.

F32 weights: every tensor llama.cpp names is traced (`not rep.only_in_llamacpp`), each NMSE <= 1e-8, logits
NMSE <= 1e-8, top-1 100% — for the plain tiny file, all optional tensors (of which llama.cpp applies only the
MLA blocks' attn_output.scale), a fused attn_qkv, the 3-D conv / 2-D ssm_a forms, and the legacy attn_kv_b file.
Q8_0 / Q4_K in llama.cpp mode: tests/test_llamacpp_mode.py (LLAMACPP_CASES, outcomes pinned in
tests/llamacpp_mode_outcomes.py).
"""
import numpy as np
import pytest

from refengine.compare import format_report, run_compare

oracle = pytest.mark.oracle          # the tests that run llama.cpp

ARCH = "kimi-linear"
TOKENS = [7, 200, 13, 55, 1, 99, 144, 3, 250, 31, 8, 77, 19, 64, 128, 2, 240, 11, 90, 17, 33, 5, 201, 160,
          42, 9, 118, 77, 230, 4]

KDA_NAMES = ["attn_norm-{}", "g1 f_b(f_a(cur))-{}", "kda_g1-{}", "kda_beta-{}", "new_state-{}", "attn_output-{}",
             "kda_normed-{}", "g2 g_b(g_a(cur_2d))-{}", "kda_out-{}", "ffn_inp-{}", "ffn_norm-{}", "l_out-{}"]
MLA_NAMES = ["attn_norm-{}", "kqv_out-{}", "mla_out-{}", "ffn_inp-{}", "ffn_norm-{}", "l_out-{}"]
ABSORBED_NAMES = ["q_nope-{}", "q_pe-{}", "q_nope_absorbed-{}", "Qcur-{}", "Kcur-{}", "kqv_mla-{}"]
LEGACY_NAMES = ["mla_Q-{}", "mla_K-{}", "mla_V-{}"]


def check_f32(rep, il_kinds, legacy=False):
    table = format_report(rep)
    assert not rep.only_in_llamacpp, f"llama.cpp tensors refengine does not trace: {rep.only_in_llamacpp}"
    assert rep.ok, table
    assert rep.logits.nmse <= 1e-8 and rep.logits.top1_agreement == 1.0, table
    names = {s.name for s in rep.tensors}
    mla_names = MLA_NAMES + (LEGACY_NAMES if legacy else ABSORBED_NAMES)
    want = {n.format(il) for il, kind in enumerate(il_kinds) for n in (KDA_NAMES if kind == "kda" else mla_names)}
    assert want <= names, sorted(want - names)


@oracle
@pytest.mark.parametrize("kw", [dict(preset="tiny"), dict(preset="tiny", all_optional=True),
                                dict(preset="tiny", fused_qkv=True), dict(preset="tiny", overrides={"conv_4d": False}),
                                dict(preset="tiny-legacy", all_optional=True)],
                         ids=["tiny", "all-optional", "fused-qkv", "conv-3d", "legacy-all-optional"])
def test_f32_matches_llamacpp(synth_model, kw):
    rep = run_compare(synth_model(ARCH, **kw), TOKENS)
    check_f32(rep, ["kda", "kda", "kda", "mla"], legacy=kw["preset"] == "tiny-legacy")


@oracle
@pytest.mark.parametrize("preset", ["tiny", "tiny-legacy"])
def test_prefill_then_decode_matches_llamacpp(synth_model, preset):
    """llama.cpp's recurrent state (conv tails, delta state) and its latent (legacy: per-head) cache carried
    across calls, as here."""
    from refengine import Model
    from refengine.compare import metrics
    from refengine.oracle import run_llamacpp
    path = synth_model(ARCH, preset=preset)
    toks = TOKENS[:12]
    ref = run_llamacpp(path, toks, chunks=[8, 1, 1, 1, 1], trace=False).logits
    m = Model(path)
    state = m.new_state()
    got = np.concatenate([m.forward(toks[:8], state)] + [m.forward([t], state) for t in toks[8:]])
    assert metrics(ref, got)[0] <= 1e-8


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


def test_cpu_backend_equals_numpy(synth_model):
    """The whole forward with the Numba kernels equals the NumPy backend, prefill and one-token decode steps."""
    from refengine.model import Model
    from refengine.runtime import Runtime
    m = Model(synth_model(ARCH, wtype="Q4_K"))
    tokens = np.array([3, 17, 101, 5, 250, 42, 7], dtype=np.int64)
    want = m.forward(tokens, rt=Runtime(backend="numpy"))
    got = m.forward(tokens, rt=Runtime(backend="cpu"))
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    st_ref, st_cpu = m.new_state(), m.new_state()
    for tok in tokens[:3]:
        a = m.forward([tok], st_cpu, rt=Runtime(backend="cpu"))
        b = m.forward([tok], st_ref, rt=Runtime(backend="numpy"))
        assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()


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
    """KDAConfig's kimi-k3 switches (kimi-k3.cpp:420-472): the gate lower-bound formula, and a full-rank output
    gate `ssm_g` equal to the low-rank product gives the low-rank layer's output (float32 order only)."""
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
    low = kda.kda_layer(h, SimpleNamespace(**w), kc=kda.KDAConfig(H, dh, Kc, 1e-5), il=0, state=RecurrentState(),
                        rt=Runtime())
    kc_full = kda.KDAConfig(H, dh, Kc, 1e-5, full_rank_gate=True, separate_qkv=True)
    got = kda.kda_layer(h, SimpleNamespace(**w, ssm_g=full), kc=kc_full, il=0, state=RecurrentState(), rt=Runtime())
    assert np.abs(got - low).max() <= 1e-5 * np.abs(low).max()


@pytest.mark.parametrize("drop,err,what", [
    (dict(drop_keys=("kimi-linear.kda.head_dim",)), "MissingKeyError", "kimi-linear.kda.head_dim"),
    (dict(drop_keys=("kimi-linear.expert_gating_func",)), "MissingKeyError", "kimi-linear.expert_gating_func"),
    (dict(drop_tensors=("output.weight",)), "MissingTensorError", "output.weight"),
    (dict(drop_tensors=("blk.1.ssm_conv1d_k.weight",)), "MissingTensorError", "blk.1.ssm_conv1d_k.weight"),
], ids=["kda.head_dim", "gating func", "output", "conv k"])
def test_required_keys_and_tensors(synth_model, tmp_path, drop, err, what):
    """What llama.cpp's kimi-linear loader requires is refused when missing, naming it (kimi-linear.cpp:4-31, :41,
    :57-71)."""
    from gguf_edit import rewrite
    import refengine.errors as errors
    from refengine.model import Model
    path = rewrite(synth_model(ARCH), tmp_path / "bad.gguf", **drop)
    with pytest.raises(getattr(errors, err), match=what.replace(".", r"\.")):
        m = Model(path)
        m.load_all()


@oracle
def test_chunked_delta_rule_matches_llamacpp(synth_model):
    """The KDA layers run the chunked form (chunks of 16; 30 tokens = 16 + 14) against llama.cpp's fused
    token-by-token kernel: every tensor and the logits within the F32 tolerance."""
    rep = run_compare(synth_model(ARCH), TOKENS, attn_form="chunked")
    check_f32(rep, ["kda", "kda", "kda", "mla"], legacy=False)
