"""Every named tensor and the logits of synthetic llama / qwen3moe models against llama.cpp.

Tolerances are refengine.compare's table: NMSE <= 1e-8 for F32 weights (nothing is rounded on either side
but the order of float sums). Quantized weights in exact mode differ by llama.cpp's activation
rounding; there the figure is printed and top-1 agreement must be 100%.
"""
import numpy as np
import pytest

from refengine.compare import format_report, run_compare

pytestmark = pytest.mark.oracle

TOKENS = [7, 200, 13, 55, 1, 99, 144, 3, 250, 31, 8, 77, 19, 64, 128, 2, 240, 11, 90]

# Names llama.cpp's graph produces that refengine must trace, per layer ({} = layer index).
LLAMA_NAMES = ["attn_norm-{}", "Qcur-{}", "Kcur-{}", "Vcur-{}", "kq-{}", "kq_soft_max-{}", "kqv-{}", "kqv_out-{}", "attn_out-{}", "ffn_inp-{}",
               "ffn_norm-{}", "l_out-{}"]
DENSE_NAMES = ["ffn_up-{}", "ffn_gate-{}", "ffn_swiglu-{}", "ffn_out-{}"]
MOE_NAMES = ["ffn_moe_logits-{}", "ffn_moe_probs-{}", "ffn_moe_topk-{}", "ffn_moe_weights-{}",
             "ffn_moe_weights_sum-{}", "ffn_moe_weights_norm-{}", "ffn_moe_up-{}", "ffn_moe_gate-{}",
             "ffn_moe_swiglu-{}", "ffn_moe_down-{}", "ffn_moe_weighted-{}", "ffn_moe_out-{}"]
QWEN_NAMES = ["attn_norm-{}", "Qcur_normed-{}", "Kcur_normed-{}", "Qcur-{}", "Kcur-{}", "Vcur-{}", "kq-{}",
              "kq_soft_max-{}", "kqv-{}", "kqv_out-{}",
              "ffn_inp-{}", "ffn_norm-{}", "l_out-{}"] + MOE_NAMES
GLOBAL_NAMES = ["embd", "result_norm", "result_output"]


def expected_names(arch, moe, scaled=False, n_layer=2):
    per = QWEN_NAMES if arch == "qwen3moe" else LLAMA_NAMES + (MOE_NAMES if moe else DENSE_NAMES)
    if scaled:   # all-optional: llama.cpp names a scaled expert output ffn_moe_up_scaled etc.; group routing
        per = [n.replace("_up-", "_up_scaled-").replace("_gate-", "_gate_scaled-").replace("_down-", "_down_scaled-")
               if n.startswith("ffn_moe_") else n for n in per]
        if moe:
            per = per + ["ffn_moe_group_topk-{}", "ffn_moe_probs_masked-{}"]
    return set(GLOBAL_NAMES) | {n.format(il) for il in range(n_layer) for n in per}


def check(rep, arch, moe, tol=None, scaled=False):
    table = format_report(rep)
    compared = {s.name for s in rep.tensors}
    missing = expected_names(arch, moe, scaled) - compared
    assert not missing, f"not compared: {sorted(missing)}\n{table}"
    assert not rep.only_in_llamacpp, f"llama.cpp tensors refengine does not trace: {rep.only_in_llamacpp}"
    assert rep.ok, table
    if tol is not None and tol <= 1e-8:
        assert rep.logits.top1_agreement == 1.0, table
    if tol is not None:
        assert rep.logits.nmse <= tol, table


F32_CASES = [
    ("llama", dict()),
    ("llama", dict(all_optional=True)),
    ("llama", dict(all_optional=True, fused_qkv=True, tied_output=True)),
    ("llama", dict(rope_scaling="linear")),
    ("llama", dict(rope_scaling="longrope")),
    ("llama", dict(preset="tiny-moe")),
    ("llama", dict(preset="tiny-moe", all_optional=True)),
    ("qwen3moe", dict()),
    ("qwen3moe", dict(all_optional=True)),
    ("qwen3moe", dict(all_optional=True, fused_qkv=True, tied_output=True)),
    ("qwen3moe", dict(rope_scaling="linear")),
]


@pytest.mark.parametrize("arch,kw", F32_CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}={w}" for k, w in v.items()) or "plain")
def test_f32_matches_llamacpp(synth_model, arch, kw):
    path = synth_model(arch, **kw)
    rep = run_compare(path, TOKENS)
    assert rep.tolerance == 1e-8
    check(rep, arch, arch == "qwen3moe" or kw.get("preset") == "tiny-moe", tol=1e-8,
          scaled=kw.get("all_optional", False))
    for s in rep.tensors:
        assert s.nmse <= 1e-8, (s.name, s.nmse)


@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
@pytest.mark.parametrize("wtype", ["Q8_0", "Q4_K"])
def test_quantized_exact_mode(synth_model, arch, wtype, capsys):
    """Exact mode on quantized weights: the NMSE is llama.cpp's activation rounding (Q8_0 / Q8_K activations),
    printed; every top-1 disagreement must be a near-tie within the measured logit error."""
    rep = run_compare(synth_model(arch, wtype=wtype), TOKENS)
    with capsys.disabled():
        print(f"\n  {arch} {wtype} exact mode vs llama.cpp: logits NMSE {rep.logits.nmse:.3e}, "
              f"KL mean {rep.logits.kld_mean:.3e}, top-1 {100 * rep.logits.top1_agreement:.1f}% "
              f"({rep.logits.top1_near_ties} near-ties)")
    check(rep, arch, arch == "qwen3moe")
    assert rep.logits.top1_unexplained == 0


def test_one_token(synth_model):
    rep = run_compare(synth_model("qwen3moe"), [42])
    check(rep, "qwen3moe", True, tol=1e-8)


def test_topk_equal_to_expert_count(synth_model):
    """Every token uses every expert: routing reduces to a softmax-weighted sum."""
    rep = run_compare(synth_model("qwen3moe", overrides={"n_expert_used": 8}), TOKENS[:5])
    check(rep, "qwen3moe", True, tol=1e-8)


def test_experts_without_tokens(synth_model):
    """Two tokens, top-2 of 8: most experts receive no token and must contribute nothing."""
    rep = run_compare(synth_model("qwen3moe", seed=5), TOKENS[:2])
    check(rep, "qwen3moe", True, tol=1e-8)
    ids = None
    for s in rep.tensors:
        if s.name == "ffn_moe_topk-0":
            ids = s
    assert ids is not None and ids.ok


def test_json_fields_are_finite(synth_model):
    rep = run_compare(synth_model("llama"), TOKENS[:4])
    d = rep.to_dict()
    for k in ("nmse", "max_abs", "cosine", "top1_agreement", "kld_mean", "kld_max"):
        assert np.isfinite(d["logits"][k])


@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
def test_local_mode_equals_whole_model_on_f32(synth_model, arch):
    """With F32 weights, feeding each layer llama.cpp's input changes nothing measurable."""
    path = synth_model(arch, all_optional=True)
    rep = run_compare(path, TOKENS, local=True)
    check(rep, arch, True if arch == "qwen3moe" else False, tol=1e-8, scaled=True)


# ---------------------------------------------------------------- deepseek2 (MLA)
# Every tensor llama.cpp names is compared (`only_in_llamacpp` empty), so no name list is kept here.

DS2_CASES = [
    dict(preset="tiny"),                                   # q-LoRA, 1 dense + 2 MoE, sigmoid + exp_probs_b, shared
    dict(preset="tiny-lite"),                              # plain attn_q, softmax, no norm
    dict(preset="tiny-groups"),                            # 16 experts in 4 groups, 2 used
    dict(preset="tiny-legacy"),                            # attn_kv_b: llama.cpp's non-absorbed path
    dict(preset="tiny", all_optional=True),                # every .scale/.input_scale, YaRN, attn_factor, temperature
    dict(preset="tiny-lite", all_optional=True, tied_output=True),
]


ABSORBED_ONLY = {"q_nope_perm", "q_nope_absorbed", "q_nope_absorbed_perm", "Qcur", "Kcur", "Vcur", "v_cont", "kqv", "kqv_mla"}


def check_all(rep, tol=1e-8, untraced=frozenset()):
    table = format_report(rep)
    left = [n for n in rep.only_in_llamacpp if n.rsplit("-", 1)[0] not in untraced]
    assert not left, f"llama.cpp tensors refengine does not trace: {left}"
    assert rep.ok, table
    assert rep.logits.nmse <= tol and rep.logits.top1_agreement == 1.0, table
    for s in rep.tensors:
        assert s.nmse <= tol, (s.name, s.nmse)


@pytest.mark.parametrize("kw", DS2_CASES, ids=lambda v: "-".join(f"{k}={w}" for k, w in v.items()))
def test_deepseek2_f32_matches_llamacpp(synth_model, kw):
    rep = run_compare(synth_model("deepseek2", **kw), TOKENS)
    assert rep.tolerance == 1e-8
    check_all(rep)


def test_deepseek2_naive_form_matches_llamacpp(synth_model):
    """The naive form (per-head K/V cache) against llama.cpp's absorbed run: every shared tensor, the logits."""
    rep = run_compare(synth_model("deepseek2", preset="tiny"), TOKENS, attn_form="naive")
    check_all(rep, untraced=ABSORBED_ONLY)          # the naive form has no absorbed products to show


def test_deepseek2_topk_equal_to_expert_count(synth_model):
    rep = run_compare(synth_model("deepseek2", preset="tiny", overrides={"n_expert_used": 8}), TOKENS[:5])
    check_all(rep)


# ---------------------------------------------------------------- DSA (deepseek32, glm-dsa): MLA under a top-k mask
# 40 tokens, the tiny presets' indexer top-k 8: from position 8 on every query drops keys.

DSA_TOKENS = [int(t) for t in np.random.default_rng(1).integers(0, 256, 40)]
DSA_CASES = [
    ("deepseek32", dict()),                                   # NEOX indexer rope, LayerNorm eps 1e-6
    ("glm-dsa", dict()),                                      # NORM indexer rope, eps 0 (the quirk), all layers full
    ("glm-dsa", dict(preset="tiny-shared")),                  # GLM-5.2's pattern: layers 3-5 share layer 2's top-k
    ("deepseek32", dict(all_optional=True)),                  # .scale (applied), YaRN, attn_factor, ignored keys
    pytest.param("glm-dsa", dict(preset="tiny-shared", all_optional=True),      # + shared layers' indexer tensors
                 marks=pytest.mark.exhaustive),                                # (unused); CI budget: exhaustive
]


def check_dsa(rep, tol=1e-8):
    """check_all, plus: a selection was compared in every layer that runs an indexer, and every query's set of
    selected keys equals llama.cpp's or is a named near-tie (`_selection_check`'s note)."""
    check_all(rep, tol)
    scores = [s for s in rep.tensors if s.name.startswith("indexer_score-")]
    sels = [s for s in rep.tensors if s.name.startswith("top_k-")]
    assert scores and len(sels) == len(scores), [s.name for s in rep.tensors if "top_k" in s.name]
    for s in sels:
        assert s.ok, (s.name, s.note)
    return [f"{s.name}: {s.note}" for s in sels if s.note]


@pytest.mark.parametrize("arch,kw", DSA_CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}={w}" for k, w in v.items()) or "tiny")
def test_dsa_f32_matches_llamacpp(synth_model, arch, kw, capsys):
    rep = run_compare(synth_model(arch, **kw), DSA_TOKENS)
    assert rep.tolerance == 1e-8
    ties = check_dsa(rep)
    with capsys.disabled():
        print(f"\n  {arch} {kw or 'tiny'}: logits NMSE {rep.logits.nmse:.2e}, worst tensor "
              f"{max(s.nmse for s in rep.tensors):.2e}, selections equal" + (f" ({'; '.join(ties)})" if ties else ""))


@pytest.mark.exhaustive          # the naive form is also covered by test_dsa.py's decode test and deepseek2's
def test_dsa_naive_form_matches_llamacpp(synth_model):
    rep = run_compare(synth_model("deepseek32"), DSA_TOKENS, attn_form="naive")
    check_all(rep, untraced=ABSORBED_ONLY)


def test_dsa_sparse_differs_from_dense_and_both_match(synth_model):
    """The same weights with top-k 8 (sparse) and top-k 64 >= 40 tokens (every key kept: dense MLA): both match
    llama.cpp (every tensor, logits NMSE <= 1e-8), and their logits differ, so the selection matters."""
    from refengine import Model
    from refengine.compare import metrics
    paths = [synth_model("glm-dsa", preset="tiny-shared"),
             synth_model("glm-dsa", preset="tiny-shared", overrides={"idx_top_k": 64})]
    check_dsa(run_compare(paths[0], DSA_TOKENS))
    check_all(run_compare(paths[1], DSA_TOKENS))
    a, b = (Model(p).forward(DSA_TOKENS) for p in paths)
    assert metrics(b, a)[0] > 1e-3, "top-k 8 of 40 keys should change the logits"
    assert metrics(b[:8], a[:8])[0] < 1e-10          # the first 8 queries see at most 8 keys: nothing is dropped


def test_dsa_decode_matches_llamacpp_decode(synth_model):
    """Prefill 6 tokens then 34 one-token decodes in llama.cpp (its MLA and indexer caches) and in refengine."""
    from refengine import Model
    from refengine.compare import metrics
    from refengine.oracle import run_llamacpp
    path = synth_model("glm-dsa", preset="tiny-shared")
    ref = run_llamacpp(path, DSA_TOKENS, chunks=[6] + [1] * 34, trace=False).logits
    m = Model(path)
    st = m.new_state()
    got = np.concatenate([m.forward(DSA_TOKENS[:6], st)] + [m.forward([t], st) for t in DSA_TOKENS[6:]])
    assert metrics(ref, got)[0] <= 1e-8


@pytest.mark.parametrize("arch,eps", [("deepseek32", 1e-6), ("glm-dsa", 0.0)])
def test_dsa_indexer_key_norm_eps_as_llamacpp_runs_it(synth_model, arch, eps):
    """indexer.attn_k written with std 1e-5: the keys' variance (~1e-8) is below 1e-6, so the LayerNorm's eps
    decides the normed key. llama.cpp's own pre-norm key (the 1st `indexer_k-0`) normed with the arch's eps
    gives its normed key (the 2nd); the other eps does not (glm-dsa runs eps 0: hparams.f_norm_eps is never set);
    and the whole model still matches llama.cpp."""
    from refengine import Model
    from refengine.compare import metrics
    from refengine.ops import layer_norm
    path = synth_model(arch, overrides={"idx_k_std": 1e-5})
    if eps == 0.0:                                   # the quirk: the whole model too
        check_dsa(run_compare(path, DSA_TOKENS))
    from refengine.oracle import run_llamacpp
    ref = run_llamacpp(path, DSA_TOKENS[:16])
    pre, normed = ref.earlier["indexer_k-0"][:2]
    w = Model(path).layer(0)
    assert Model(path).cfg.layers[0].indexer.k_norm_eps == eps
    assert metrics(normed, layer_norm(pre, w.indexer_k_norm, w.indexer_k_norm_b, eps))[0] < 1e-10
    other = 1e-6 if eps == 0.0 else 0.0
    assert metrics(normed, layer_norm(pre, w.indexer_k_norm, w.indexer_k_norm_b, other))[0] > 1e-3
