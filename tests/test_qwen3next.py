"""qwen3next (Qwen3-Next): synthetic models against llama.cpp, every named tensor, every loader variant.

F32 weights: every loader variant's file is a case of test_vs_llamacpp.py's F32 list (each tensor llama.cpp
names and the logits within NMSE 1e-8, no llama.cpp tensor left untraced); here the chunked form and longer
prompts against llama.cpp, the same bounds. Q8_0 / Q4_K in llama.cpp mode (whole model, and every quantized
matmul teacher-forced): tests/test_llamacpp_mode.py (LLAMACPP_CASES).
Decode: llama.cpp's own prefill-then-decode schedule.
"""
import numpy as np
import pytest

from refengine import Model
from refengine.compare import metrics, run_compare
from reportcheck import check_report

TOKENS = [7, 200, 13, 55, 1, 99, 144, 3, 250, 31, 8, 77, 19, 64, 128, 2, 240, 11, 90]


def _id(kw):
    return "-".join(f"{k}={v}" for k, v in kw.items()).replace(" ", "") or "plain"


@pytest.mark.oracle
@pytest.mark.parametrize("n", [19, 100])
def test_chunked_form_matches_llamacpp(synth_model, n):
    """The chunked delta rule (chunks of 64: one partial chunk, then a full one and a partial one) against
    llama.cpp's token-by-token kernel: every tensor, float32 on both sides."""
    toks = np.random.default_rng(2).integers(0, 256, n)
    check_report(run_compare(synth_model("qwen3next"), toks, attn_form="chunked"), 1e-8)


@pytest.mark.oracle
@pytest.mark.parametrize("kw", [dict(), dict(all_optional=True)], ids=_id)
def test_100_tokens_in_three_calls_match_llamacpp(synth_model, kw):
    """100 tokens (past the tiny preset's 16-100 range's top) as 50 + 1 + 49 in both engines: every position's
    logits, and every tensor of one 100-token prefill."""
    from refengine.oracle import run_llamacpp
    path = synth_model("qwen3next", **kw)
    toks = np.random.default_rng(1).integers(0, 256, 100)
    check_report(run_compare(path, toks))
    ref = run_llamacpp(path, toks, chunks=[50, 1, 49], trace=False).logits
    m = Model(path)
    state = m.new_state()
    got = np.concatenate([m.forward(toks[:50], state), m.forward(toks[50:51], state), m.forward(toks[51:], state)])
    assert metrics(ref, got)[0] <= 1e-8 and np.array_equal(ref.argmax(-1), got.argmax(-1))


# ---------------------------------------------------------------- without the oracle

@pytest.mark.parametrize("kw", [dict(all_optional=True), dict(overrides={"n_mtp": 1}),
                                dict(all_optional=True, overrides={"n_mtp": 1}),
                                dict(all_optional=True, fused_qkv=True,
                                     overrides={"legacy_ssm_in": True, "fused_gate_up": True})], ids=_id)
def test_optional_and_mtp_files_lint_clean(synth_model, kw):
    """Every tensor of the all-optional and MTP files consumed and their keys as llama.cpp reads them (lint
    refuses nothing); the same files match llama.cpp in test_vs_llamacpp's F32 cases."""
    from refengine.lint import lint
    assert not lint(synth_model("qwen3next", **kw)).refused


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
