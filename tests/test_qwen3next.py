"""qwen3next (Qwen3-Next): synthetic models against llama.cpp, every named tensor, every loader variant.

F32 weights: each tensor llama.cpp names and the logits within NMSE 1e-8 (float summation order only), no
llama.cpp tensor left untraced. Q8_0 / Q4_K in llama.cpp mode (whole model, and every quantized matmul
teacher-forced): tests/test_llamacpp_mode.py (LLAMACPP_CASES).
Decode: llama.cpp's own prefill-then-decode schedule.
"""
import numpy as np
import pytest

from refengine import Model
from refengine.compare import format_report, metrics, run_compare

TOKENS = [7, 200, 13, 55, 1, 99, 144, 3, 250, 31, 8, 77, 19, 64, 128, 2, 240, 11, 90]

GDN_NAMES = ["attn_norm", "linear_attn_qkv_mixed", "z", "linear_attn_mixed_ba", "b", "a", "a_softplus", "gate",
             "conv_states", "conv_input", "conv_output_raw", "conv_output_silu", "q_conv", "k_conv",
             "q_conv_predelta", "k_conv_predelta", "v_conv_predelta", "state_predelta", "attn_output", "new_state",
             "final_output", "linear_attn_out"]
LEGACY_NAMES = ["linear_attn_mixed_qkvz", "query_flat", "key_flat", "value_flat", "qkv_mixed"]
ATTN_NAMES = ["attn_norm", "Qcur_full", "Qcur_normed", "Kcur_normed", "Qcur", "Kcur", "Vcur", "kq", "kq_soft_max",
              "kqv", "attn_pregate", "gate_sigmoid", "attn_gated", "attn_output"]
FFN_NAMES = ["attn_residual", "attn_post_norm", "ffn_moe_logits", "ffn_moe_probs", "ffn_moe_topk",
             "ffn_moe_weights_norm", "ffn_moe_swiglu", "ffn_moe_out", "ffn_shexp", "shared_expert_gate",
             "shared_expert_gate_sigmoid", "ffn_shexp_gated", "ffn_out", "l_out"]

# (write_synth options, the layer kinds they give: True = gated DeltaNet)
F32_CASES = [
    (dict(), [True, True, True, False]),
    (dict(all_optional=True), [False, True, True, True]),          # attention.recurrent_layers wins
    (dict(overrides={"legacy_ssm_in": True}), [True, True, True, False]),
    (dict(fused_qkv=True, tied_output=True, overrides={"fused_gate_up": True}), [True, True, True, False]),
    (dict(all_optional=True, fused_qkv=True, overrides={"legacy_ssm_in": True, "fused_gate_up": True}),
     [False, True, True, True]),
    # one MTP block after the trunk (nextn_predict_layers = 1; with all_optional its optional nextn tensors):
    # llama.cpp skips it when loading and in the main pass, refengine neither loads nor runs it
    (dict(overrides={"n_mtp": 1}), [True, True, True, False]),
    (dict(all_optional=True, overrides={"n_mtp": 1}), [False, True, True, True]),
]


def _id(kw):
    return "-".join(f"{k}={v}" for k, v in kw.items()).replace(" ", "") or "plain"


@pytest.mark.oracle
@pytest.mark.parametrize("kw,kinds", F32_CASES, ids=[_id(kw) for kw, _ in F32_CASES])
def test_f32_every_tensor_matches_llamacpp(synth_model, kw, kinds):
    path = synth_model("qwen3next", **kw)
    assert [s.attn == "gdn" for s in Model(path).cfg.layers] == kinds
    if kw.get("all_optional") or kw.get("overrides", {}).get("n_mtp"):      # every tensor consumed, keys as llama.cpp's
        from refengine.lint import lint
        assert not lint(path).refused
    rep = run_compare(path, TOKENS)
    table = format_report(rep)
    assert rep.tolerance == 1e-8
    assert not rep.only_in_llamacpp, f"llama.cpp tensors refengine does not trace: {rep.only_in_llamacpp}"
    compared = {s.name for s in rep.tensors}
    legacy = kw.get("overrides", {}).get("legacy_ssm_in", False)
    want = {"result_norm", "result_output"}
    for il, recr in enumerate(kinds):
        names = (GDN_NAMES + (LEGACY_NAMES if legacy else []) if recr else ATTN_NAMES) + FFN_NAMES
        if legacy and recr:
            names = [n for n in names if n != "linear_attn_qkv_mixed"]
        want |= {f"{n}-{il}" for n in names}
    assert not want - compared, f"not compared: {sorted(want - compared)}\n{table}"
    for s in rep.tensors:
        assert s.nmse <= 1e-8, (s.name, s.nmse, table)
    assert rep.ok, table
    assert rep.logits.nmse <= 1e-8 and rep.logits.top1_agreement == 1.0, table


@pytest.mark.oracle
@pytest.mark.parametrize("n", [19, 100])
def test_chunked_form_matches_llamacpp(synth_model, n):
    """The chunked delta rule (chunks of 64: one partial chunk, then a full one and a partial one) against
    llama.cpp's token-by-token kernel: every tensor, float32 on both sides."""
    toks = np.random.default_rng(2).integers(0, 256, n)
    rep = run_compare(synth_model("qwen3next"), toks, attn_form="chunked")
    assert not rep.only_in_llamacpp
    for s in rep.tensors:
        assert s.nmse <= 1e-8, (s.name, s.nmse)
    assert rep.ok and rep.logits.nmse <= 1e-8 and rep.logits.top1_agreement == 1.0, format_report(rep)


@pytest.mark.oracle
def test_decode_matches_llamacpp_decode(synth_model):
    """Prefill 8 then 4 one-token decodes in both engines (conv tail, delta state and KV cache carried)."""
    from refengine.oracle import run_llamacpp
    path = synth_model("qwen3next", overrides={"legacy_ssm_in": True})
    ref = run_llamacpp(path, TOKENS[:12], chunks=[8, 1, 1, 1, 1], trace=False).logits
    m = Model(path)
    state = m.new_state()
    got = np.concatenate([m.forward(TOKENS[:8], state)] + [m.forward([t], state) for t in TOKENS[8:12]])
    nmse, _, _ = metrics(ref, got)
    assert nmse <= 1e-8, nmse


@pytest.mark.oracle
@pytest.mark.parametrize("kw", [dict(), dict(all_optional=True)], ids=_id)
def test_100_tokens_in_three_calls_match_llamacpp(synth_model, kw):
    """100 tokens (past the tiny preset's 16-100 range's top) as 50 + 1 + 49 in both engines: every position's
    logits, and every tensor of one 100-token prefill."""
    from refengine.oracle import run_llamacpp
    path = synth_model("qwen3next", **kw)
    toks = np.random.default_rng(1).integers(0, 256, 100)
    rep = run_compare(path, toks)
    assert rep.ok and not rep.only_in_llamacpp, format_report(rep)
    ref = run_llamacpp(path, toks, chunks=[50, 1, 49], trace=False).logits
    m = Model(path)
    state = m.new_state()
    got = np.concatenate([m.forward(toks[:50], state), m.forward(toks[50:51], state), m.forward(toks[51:], state)])
    assert metrics(ref, got)[0] <= 1e-8 and np.array_equal(ref.argmax(-1), got.argmax(-1))


# ---------------------------------------------------------------- without the oracle

def test_legacy_decode_equals_prefill(synth_model):
    """The legacy ssm_in file through prefill 8 + 4 decodes == one prefill (the tiny preset is in test_decode)."""
    m = Model(synth_model("qwen3next", overrides={"legacy_ssm_in": True}))
    full = m.forward(TOKENS[:12])
    state = m.new_state()
    step = np.concatenate([m.forward(TOKENS[:8], state)] + [m.forward([t], state) for t in TOKENS[8:12]])
    assert metrics(full, step)[0] <= 1e-10


def test_legacy_ssm_in_equals_split_projections(synth_model, tmp_path):
    """ssm_in regrouped per key head == attn_qkv + attn_gate holding the same rows: the same logits."""
    from gguf_edit import rewrite
    legacy = synth_model("qwen3next", overrides={"legacy_ssm_in": True})
    m = Model(legacy)
    cfg = m.cfg.layers[0].attn_cfg
    Hk, K, rV = cfg.n_k_heads, cfg.head_k_dim, cfg.value_dim // cfg.n_k_heads
    split = {}
    for il, spec in enumerate(m.cfg.layers):
        if spec.attn != "gdn":
            continue
        w = np.asarray(m.gf.tensor(f"blk.{il}.ssm_in.weight").raw).view(np.float32).reshape(Hk, 2 * K + 2 * rV, -1)
        q, k, v, z = w[:, :K], w[:, K:2 * K], w[:, 2 * K:2 * K + rV], w[:, 2 * K + rV:]
        split[f"blk.{il}.attn_qkv.weight"] = np.concatenate([x.reshape(-1, w.shape[-1]) for x in (q, k, v)])
        split[f"blk.{il}.attn_gate.weight"] = z.reshape(-1, w.shape[-1])
    out = tmp_path / "split.gguf"
    rewrite(legacy, out, drop_tensors=[n.replace("attn_gate", "ssm_in") for n in split if "attn_gate" in n],
            add_tensors=split)
    a, b = m.forward(TOKENS[:6]), Model(out).forward(TOKENS[:6])
    assert metrics(a, b)[0] <= 1e-12


def test_conv_kernel_must_be_f32(synth_model, tmp_path, monkeypatch):
    from quant import GGMLType
    from refengine import synth
    from refengine.errors import WeightError
    from refengine.lint import lint
    choose = synth.choose_type
    monkeypatch.setattr(synth, "choose_type", lambda tp, wt: GGMLType.F16 if tp.kind == "conv" else choose(tp, wt))
    path = synth.write_synth("qwen3next", tmp_path / "f16conv.gguf")
    with pytest.raises(WeightError, match=r"blk\.0\.ssm_conv1d\.weight.*F16"):
        Model(path).forward(TOKENS[:3])
    assert any("ssm_conv1d" in r for r in lint(path).refusals)


def test_real_size_preset_shapes():
    """qwen3-next-80b as published: tensor shapes of one GDN and one attention block, ~80B parameters."""
    from refengine.synth import plan_tensors, resolve_preset
    p = resolve_preset("qwen3next", "qwen3-next-80b")
    plan = {tp.name: tp.shape for tp in plan_tensors("qwen3next", p)}
    assert plan["blk.0.attn_qkv.weight"] == (2 * 16 * 128 + 32 * 128, 2048)
    assert plan["blk.0.attn_gate.weight"] == (32 * 128, 2048)
    assert plan["blk.0.ssm_conv1d.weight"] == (8192, 4)
    assert plan["blk.0.ssm_ba.weight"] == (64, 2048) and plan["blk.0.ssm_a"] == (32,)
    assert plan["blk.3.attn_q.weight"] == (2 * 16 * 256, 2048) and plan["blk.3.attn_k.weight"] == (2 * 256, 2048)
    assert plan["blk.3.attn_output.weight"] == (2048, 16 * 256)
    assert plan["blk.3.ffn_gate_exps.weight"] == (512, 512, 2048)
    assert plan["blk.3.ffn_gate_inp_shexp.weight"] == (2048,)
    assert sum(k.endswith("attn_q.weight") for k in plan) == 12           # every 4th of 48 blocks
    n = sum(int(np.prod(s, dtype=np.int64)) for s in plan.values())
    assert 79e9 < n < 81e9, n                                               # "80B total" (MTP block not written)
    small = plan_tensors("qwen3next", resolve_preset("qwen3next", "qwen3-next-80b", layers=4))
    assert sum(tp.name.endswith("ssm_a") for tp in small) == 3


def test_cpu_backend_equals_numpy(synth_model):
    """`--backend cpu` (Numba matmuls and expert dispatch through the same runtime calls) == the NumPy backend,
    at prefill and at one-token decode steps through the carried recurrent state."""
    from refengine.runtime import Runtime
    m = Model(synth_model("qwen3next", wtype="Q4_K"))
    tokens = np.array([3, 17, 101, 5, 250, 42, 7], dtype=np.int64)
    want = m.forward(tokens, rt=Runtime(backend="numpy"))
    got = m.forward(tokens, rt=Runtime(backend="cpu"))
    assert metrics(want, got)[0] <= 1e-10
    st_ref, st_cpu = m.new_state(), m.new_state()
    for tok in tokens[:3]:
        a = m.forward([tok], st_ref, rt=Runtime(backend="numpy"))
        b = m.forward([tok], st_cpu, rt=Runtime(backend="cpu"))
        assert metrics(a, b)[0] <= 1e-10


@pytest.mark.parametrize("edit,err,match", [
    (dict(drop_keys=["qwen3next.ssm.state_size"]), "MissingKeyError", "ssm.state_size"),
    (dict(set_keys={"qwen3next.ssm.inner_size": (100, "UINT32")}), "ConfigError", "inner_size 100"),
    (dict(drop_tensors=["blk.0.attn_qkv.weight"]), "MissingTensorError", "blk.0.attn_qkv.weight.*ssm_in"),
    (dict(drop_tensors=["blk.1.ssm_a"]), "MissingTensorError", "blk.1.ssm_a"),
], ids=["no-state-size", "inner-size", "no-qkv", "no-ssm_a"])
def test_bad_files_name_the_key_or_tensor(synth_model, tmp_path, edit, err, match):
    from gguf_edit import GGUFValueType, rewrite
    from refengine import errors
    if "set_keys" in edit:
        edit = dict(set_keys={k: (v, getattr(GGUFValueType, t)) for k, (v, t) in edit["set_keys"].items()})
    out = tmp_path / "bad.gguf"
    rewrite(synth_model("qwen3next"), out, **edit)
    with pytest.raises(getattr(errors, err), match=match):
        Model(out).forward(TOKENS[:2])
