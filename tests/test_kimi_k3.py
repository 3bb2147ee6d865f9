"""kimi-k3 (KDA + MLA, attention residuals, latent SiTU MoE) against llama.cpp, tensor by tensor.

F32 weights: every tensor llama.cpp names is traced (`not rep.only_in_llamacpp`), each NMSE <= 1e-8, logits
NMSE <= 1e-8, top-1 100% — the tiny file and the all-optional one are cases of test_vs_llamacpp.py's F32
list; here the file with every optional feature off, decode and the chunked form.
Q8_0 / Q4_K in llama.cpp mode, and the small KDA matrices (ssm_f_a, ssm_f_b, ssm_beta, ssm_g) in each type
llama.cpp takes for a MUL_MAT weight: tests/test_llamacpp_mode.py (LLAMACPP_CASES, outcomes pinned in
tests/llamacpp_mode_outcomes.py). The loader case: small KDA matrices in Q8_0 load, run and match on every
tensor; a non-F32 conv weight is refused naming the tensor, and `refengine lint` exits 1 on it and 0 on a Q8_0
ssm_f_b.
"""
import numpy as np
import pytest

from refengine.compare import run_compare
from reportcheck import check_report

ARCH = "kimi-k3"
TOKENS = [7, 200, 13, 55, 1, 99, 144, 3, 250, 31, 8, 77, 19, 64, 128, 2, 240, 11, 90, 17, 33, 5, 201, 160]

# ---------------------------------------------------------------- the new pieces on their own (no oracle)

def test_situ_formula():
    """SiTU = beta tanh(g/beta) sigmoid(g) * lb tanh(u/lb); lb <= 0 leaves u as is; large beta tends to SiLU."""
    from refengine.ops.activations import silu, situ
    rng = np.random.default_rng(0)
    g, u = (rng.standard_normal((3, 64)) * 4).astype(np.float32), (rng.standard_normal((3, 64)) * 4).astype(np.float32)
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    want = 1.5 * np.tanh(g64 / 1.5) / (1 + np.exp(-g64)) * 3.0 * np.tanh(u64 / 3.0)
    np.testing.assert_allclose(situ(g, u, 1.5, 3.0), want, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(situ(g, u, 1.5, 0.0), want / (3.0 * np.tanh(u64 / 3.0)) * u64, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(situ(g, u, 1e4, -1.0), silu(g) * u, rtol=1e-4, atol=1e-4)
    assert np.all(np.abs(situ(g, u, 1.5, 3.0)) <= 1.5 * 3.0 + 1e-5)            # bounded by beta * lb


def test_res_mix_scores_normed_sums_raw():
    """The scores see rms-normalized checkpoints, the sum the raw ones: scaling a checkpoint scales its share
    of the output but not its weight; an empty bank is the identity."""
    from refengine.ops import softmax
    from refengine.residual import res_mix
    rng = np.random.default_rng(1)
    T, D = 5, 64
    bank = [rng.standard_normal((T, D)).astype(np.float32) for _ in range(2)]
    cur = rng.standard_normal((T, D)).astype(np.float32)
    w = (rng.standard_normal(D) / 8).astype(np.float32)
    assert res_mix(cur, [], w, 1e-6) is cur
    out = res_mix(cur, bank, w, 1e-6)
    nrm = lambda x: x / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + 1e-6)   # noqa: E731
    p = softmax(np.stack([(nrm(c) * w).sum(-1) for c in bank + [cur]], -1).astype(np.float32))
    want = sum(p[:, i:i + 1] * c for i, c in enumerate(bank + [cur]))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    scaled = res_mix(cur, [10 * bank[0], bank[1]], w, 1e-6)                      # same scores, 10x raw values
    np.testing.assert_allclose(scaled - out, 9 * p[:, :1] * bank[0], rtol=1e-4, atol=1e-4)


def test_kimi_k3_preset_layers_hold_every_kind():
    """The published-size preset cut to 4 blocks keeps a KDA block, an MLA block and latent-MoE blocks at K3's
    sizes; the whole plan is about 2.8T values (planned, not written)."""
    from refengine.archs import kimi_k3_synth as ks
    from refengine.synth import resolve_preset
    p = resolve_preset(ARCH, "kimi-k3", layers=4)
    plan = {tp.name: tp.shape for tp in ks.plan_tensors(p)}
    assert p["full_attn"] == (3,) and p["n_dense_lead"] == 1
    assert plan["blk.0.ssm_f_b.weight"] == (96 * 128, 128) and plan["blk.0.ssm_a"] == (96,)
    assert plan["blk.3.attn_q_b.weight"] == (96 * 192, 1536) and plan["blk.3.attn_gate.weight"] == (96 * 128, 7168)
    assert plan["blk.1.ffn_gate_exps.weight"] == (896, 3072, 3584)
    assert plan["blk.1.ffn_routed_up.weight"] == (7168, 3584)
    full = ks.plan_tensors(resolve_preset(ARCH, "kimi-k3"))
    n = sum(int(np.prod(tp.shape, dtype=np.int64)) for tp in full)
    assert 2.6e12 < n < 3.0e12, n
    assert sum(1 for tp in full if tp.name.endswith("attn_kv_a_mqa.weight")) == 24      # 69 KDA + 24 MLA blocks


# ---------------------------------------------------------------- F32 against llama.cpp
# (the tiny and all-optional files: test_vs_llamacpp.py's F32 cases)

@pytest.mark.oracle
def test_no_attention_residuals_matches_llamacpp(synth_model):
    """Every optional feature off: attn_res.block_size = 0 (no res_score tensors, plain pre-norm residual blocks,
    kimi-k3.cpp:63, :280-330), no kda.gate_lower_bound (kimi-linear's softplus gate), plain attn_q, no attn_gate,
    experts at full width (no expert_latent_length, no routed projections or norm), no shared experts,
    situ_linear_beta 0 (the up branch uncapped)."""
    rep = run_compare(synth_model(ARCH, overrides={"res_bs": 0, "latent": 0, "q_lora": 0, "attn_gate": False,
                                                   "routed_norm": False, "gate_lb": None, "situ_linear_beta": 0.0,
                                                   "n_shared": 0}),
                      TOKENS[:16])
    check_report(rep, 1e-8)
    assert not any(s.name.startswith("res_probs") for s in rep.tensors)


# ---------------------------------------------------------------- the loader case: small KDA tensors quantized

SMALL = ("ssm_f_a.weight", "ssm_f_b.weight", "ssm_beta.weight")


@pytest.mark.oracle
def test_k3_ssm_f_b_q8_0_matches_llamacpp(synth_model):
    """ssm_f_b (and ssm_f_a, ssm_beta) stored Q8_0, everything else F32: llama.cpp loads it (MUL_MAT takes any
    type, spec 3.5) and refengine matches it on every tensor, in llama.cpp mode (the activations rounded to
    Q8_0 before those products, as ggml-cpu does): each tensor and the logits within 1e-7, top-1 100%."""
    from refengine import Model
    path = synth_model(ARCH, tensor_types={n: "Q8_0" for n in SMALL})
    types = {n: t.type.name for n, t in Model(path).gf.tensors.items()}
    assert types["blk.0.ssm_f_b.weight"] == types["blk.0.ssm_f_a.weight"] == types["blk.1.ssm_beta.weight"] == "Q8_0"
    rep = run_compare(path, TOKENS, mode="llamacpp")
    assert rep.tolerance == 1e-7
    check_report(rep, 1e-7)


def test_conv_weight_not_f32_is_refused_naming_it(synth_model):
    """ggml_ssm_conv reads F32: an F16 ssm_conv1d_* is refused at load with the tensor's name."""
    from refengine.errors import WeightError
    from refengine.model import Model
    path = synth_model(ARCH, tensor_types={"ssm_conv1d_k.weight": "F16"})
    with pytest.raises(WeightError, match=r"blk\.0\.ssm_conv1d_k\.weight.*F16"):
        Model(path).layer(0)


def test_lint_and_info_on_small_tensor_types(synth_model, capsys):
    """`refengine lint` exits 1 on an F16 conv weight (naming it) and 0 on a Q8_0 ssm_f_b (a flag, no refusal);
    `refengine info --tensors` lists each tensor's type."""
    from refengine.cli import main
    bad = synth_model(ARCH, tensor_types={"ssm_conv1d_k.weight": "F16"})
    good = synth_model(ARCH, tensor_types={n: "Q8_0" for n in SMALL})
    assert main(["lint", bad]) == 1
    assert "blk.0.ssm_conv1d_k.weight" in capsys.readouterr().out
    assert main(["lint", good]) == 0
    out = capsys.readouterr().out
    assert "blk.0.ssm_f_b.weight" in out and "Q8_0" in out
    assert "'blk.0.ssm_f_b.weight' (small matrix) is Q8_0" in out and "strict loaders" in out   # the flag
    # ssm_a is the second operand of a ggml_mul (kimi-k3.cpp:428-438): ggml-cpu's binary ops abort on an F16 one
    # (binary-ops.cpp:135 "unsupported types: dst: f32, src0: f32, src1: f16", seen with llama-cpp-python 0.3.36)
    assert main(["lint", synth_model(ARCH, tensor_types={"ssm_a": "F16"})]) == 1
    assert "'blk.0.ssm_a' is F16" in capsys.readouterr().out
    assert main(["info", good, "--tensors"]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("blk.0.ssm_")]
    got = {r[0]: r[1] for r in rows}
    assert got["blk.0.ssm_f_b.weight"] == "Q8_0" and got["blk.0.ssm_conv1d_q.weight"] == "F32", got


def test_kimi_k3_local_compare_is_refused_clearly(synth_model):
    """A K3 block mixes a bank of earlier checkpoints: llama.cpp's l_out alone cannot feed it, so --local is
    refused with a named error before llama.cpp runs (not a KeyError from deep inside)."""
    from refengine.compare import run_compare
    from refengine.errors import UnsupportedArchError
    with pytest.raises(UnsupportedArchError, match="compare without --local"):
        run_compare(synth_model(ARCH), [1, 2, 3], local=True)


@pytest.mark.oracle
def test_chunked_delta_rule_matches_llamacpp(synth_model):
    """The KDA blocks run the chunked delta rule (chunks of 16; 24 tokens = 16 + 8) against llama.cpp's fused
    token-by-token kernel: every tensor and the logits within the F32 tolerance."""
    rep = run_compare(synth_model(ARCH), TOKENS, attn_form="chunked")
    assert rep.tolerance == 1e-8
    check_report(rep, 1e-8)
