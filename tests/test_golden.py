"""Golden outputs: golden -> check round trip, a perturbed tensor named downstream, the file formats read
by other tools (safetensors, llama-results GGUF, KL-divergence base), transformers' hidden states,
the conformance kit."""
import json
import os

import numpy as np
import pytest
from gguf_edit import rewrite
from second_oracle import import_transformers

from refengine.cli import main
from refengine.golden import check_golden, make_golden
from refengine.golden.formats import (
    read_kld_base,
    read_llama_results,
    read_safetensors,
    write_safetensors,
)

TOKENS = [5, 17, 42, 99, 3, 200, 11, 64, 128, 7]


def perturb(src, dst, name, factor=1.01):
    """A copy of an F32 model with one tensor scaled by `factor`."""
    def fn(n, raw):
        return (raw.view(np.float32) * np.float32(factor)).view(np.uint8) if n == name else None
    return rewrite(src, dst, tensor_fn=fn)


@pytest.fixture(scope="module")
def golden_dir(tmp_path_factory):
    from refengine.synth import write_synth
    d = tmp_path_factory.mktemp("golden")
    model = write_synth("qwen3moe", d / "m.gguf", preset="tiny")
    make_golden(model, TOKENS, d / "g")
    return d


def test_round_trip_cli(golden_dir, capsys, tmp_path):
    """golden then check against refengine's own fresh dump: exit 0, every tensor compared, MATCH."""
    assert main(["golden", str(golden_dir / "m.gguf"), "--tokens", ",".join(map(str, TOKENS)), "-q",
                 "-o", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    assert main(["check", str(golden_dir / "g"), str(tmp_path / "again"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] and d["first_divergence"] is None and d["compared"] == 57 and not d["missing"]
    m = json.loads((golden_dir / "g" / "manifest.json").read_text())
    assert m["model"]["arch"] == "qwen3moe" and m["tokens"] == TOKENS and len(m["model"]["sha256"]) == 64
    assert m["tensor_table"]["l_out-1"] == {"shape": [10, 256], "dtype": "float32", "tolerance": 1e-8}
    assert "sets" in m["tensor_table"]["ffn_moe_topk-0"]["tolerance"]


def test_perturbed_tensor_named_downstream(golden_dir, tmp_path, capsys):
    """Scale blk.1.ffn_down_exps by 1.01: check fails (exit 1) at ffn_moe_down-1, the first tensor computed
    from it; every tensor before it in the golden's order still matches."""
    bad = perturb(golden_dir / "m.gguf", tmp_path / "bad.gguf", "blk.1.ffn_down_exps.weight")
    make_golden(bad, TOKENS, tmp_path / "bad")
    res = check_golden(golden_dir / "g", tmp_path / "bad" / "tensors.safetensors")
    assert not res.report.ok and res.report.first_divergence == "ffn_moe_down-1"
    names = [s.name for s in res.report.tensors]
    assert all(s.ok for s in res.report.tensors[:names.index("ffn_moe_down-1")])
    assert main(["check", str(golden_dir / "g"), str(tmp_path / "bad")]) == 1
    assert "DIVERGES, first at ffn_moe_down-1" in capsys.readouterr().out


def test_subset_and_bad_input(golden_dir, tmp_path, capsys):
    """A dump of only some names (l_out-N and logits) is checked on those; no common name or no golden: exit 2."""
    gold, _ = read_safetensors(golden_dir / "g" / "tensors.safetensors")
    write_safetensors(tmp_path / "few.safetensors", {k: gold[k] for k in ("l_out-0", "l_out-1", "logits")})
    res = check_golden(golden_dir / "g", tmp_path / "few.safetensors")
    assert res.report.ok and res.compared == 2
    write_safetensors(tmp_path / "none.safetensors", {"foo": np.zeros(3, np.float32)})
    assert main(["check", str(golden_dir / "g"), str(tmp_path / "none.safetensors")]) == 2
    assert main(["check", str(tmp_path), str(tmp_path / "few.safetensors")]) == 2
    assert "manifest.json" in capsys.readouterr().err
    assert main(["golden", str(golden_dir / "m.gguf"), "--tokens", "1,999999", "-o", str(tmp_path / "x")]) == 2


def test_files_for_other_tools(golden_dir):
    """safetensors through the `safetensors` package; results.gguf as results.cpp lays it out; the KLD base
    decodes to log-probabilities within its 16-bit step."""
    st = pytest.importorskip("safetensors.numpy")
    gold = st.load_file(str(golden_dir / "g" / "tensors.safetensors"))
    ours, _ = read_safetensors(golden_dir / "g" / "tensors.safetensors")
    assert list(gold) == sorted(ours) or set(gold) == set(ours)
    assert all(np.array_equal(gold[k], ours[k]) for k in ours) and gold["ffn_moe_topk-0"].dtype == np.int32
    path_model, tokens, logits = read_llama_results(golden_dir / "g" / "results.gguf")
    assert path_model == str(golden_dir / "m.gguf") and tokens.tolist() == TOKENS
    assert np.array_equal(logits, ours["logits"])
    from gguf import GGUFReader
    ti = {t.name: t for t in GGUFReader(str(golden_dir / "g" / "results.gguf")).tensors}
    assert list(ti["logits"].shape) == [len(TOKENS), 256]               # ne = {T, V}, as results.cpp declares
    toks, lp = read_kld_base(golden_dir / "g" / "logits.kld")
    x = ours["logits"][5:9].astype(np.float64)                          # positions T/2 .. T-2
    ref = x - x.max(-1, keepdims=True)
    ref -= np.log(np.exp(ref).sum(-1, keepdims=True))
    keep = ref > ref.max(-1, keepdims=True) - 15                        # the 16-nat window the format keeps
    assert toks.tolist() == TOKENS and np.abs(lp[0] - ref)[keep].max() < 16 / 65535


@pytest.mark.transformers
def test_transformers_hidden_states(golden_dir, tmp_path):
    """transformers' Qwen3-MoE on the same weights: hidden states + logits pass `check --from transformers`
    at the F32 tolerance (hidden state N+1 is l_out-N, the last one result_norm)."""
    torch, tf = import_transformers()               # skipped without them; under CI=true a failure
    import quant
    from refengine.gguf import open_gguf
    gf = open_gguf(golden_dir / "m.gguf")
    W = lambda n: torch.from_numpy(np.array(quant.dequantize(gf.tensor(n))))
    c = tf.Qwen3MoeConfig(vocab_size=256, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=128, intermediate_size=768, moe_intermediate_size=256,
                          num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6,
                          rope_parameters={"rope_type": "default", "rope_theta": 1e6}, max_position_embeddings=512,
                          tie_word_embeddings=False, decoder_sparse_step=1, mlp_only_layers=[])
    hf = tf.Qwen3MoeForCausalLM(c).eval().float()
    sd = {"model.embed_tokens.weight": W("token_embd.weight"), "model.norm.weight": W("output_norm.weight"),
          "lm_head.weight": W("output.weight")}
    for i in range(2):
        b, p = f"blk.{i}.", f"model.layers.{i}."
        sd |= {p + "input_layernorm.weight": W(b + "attn_norm.weight"),
               p + "post_attention_layernorm.weight": W(b + "ffn_norm.weight"),
               p + "self_attn.q_proj.weight": W(b + "attn_q.weight"), p + "self_attn.k_proj.weight": W(b + "attn_k.weight"),
               p + "self_attn.v_proj.weight": W(b + "attn_v.weight"), p + "self_attn.o_proj.weight": W(b + "attn_output.weight"),
               p + "self_attn.q_norm.weight": W(b + "attn_q_norm.weight"), p + "self_attn.k_norm.weight": W(b + "attn_k_norm.weight"),
               p + "mlp.gate.weight": W(b + "ffn_gate_inp.weight"),
               p + "mlp.experts.gate_up_proj": torch.cat([W(b + "ffn_gate_exps.weight"), W(b + "ffn_up_exps.weight")], 1),
               p + "mlp.experts.down_proj": W(b + "ffn_down_exps.weight")}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected and not [m for m in missing if "rotary" not in m], (missing, unexpected)
    with torch.no_grad():
        out = hf(torch.tensor([TOKENS]), output_hidden_states=True)
    dump = {f"hidden_states.{i}": h[0].numpy() for i, h in enumerate(out.hidden_states)}
    dump["logits"] = out.logits[0].numpy()
    write_safetensors(tmp_path / "hf.safetensors", dump)
    res = check_golden(golden_dir / "g", tmp_path / "hf.safetensors", source="transformers")
    print({s.name: f"{s.nmse:.1e}" for s in res.report.tensors}, f"logits {res.report.logits.nmse:.1e}")
    assert res.report.ok, res.report.first_divergence
    assert [s.name for s in res.report.tensors] == ["embd", "l_out-0", "result_norm"] and res.report.tolerance == 1e-8


def test_transformers_missing_fails_under_ci(monkeypatch):
    """Without torch a transformers comparison skips, but under CI=true it fails: CI cannot go green without the
    second oracle (tests/second_oracle.py)."""
    import sys
    monkeypatch.setitem(sys.modules, "torch", None)          # `import torch` raises ImportError
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        import_transformers()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="hf extra"):
        import_transformers()


def test_conformance_kit(tmp_path, capsys):
    """Every registered arch x F32/Q8_0/Q4_K/IQ4_XS: each golden (exact, and llama.cpp mode for quantized
    types) passes check against a fresh refengine run of its model."""
    from refengine.archs import ARCHS
    assert main(["conformance", str(tmp_path / "kit"), "-q"]) == 0
    print(capsys.readouterr().out)
    kit = json.loads((tmp_path / "kit" / "kit.json").read_text())
    assert kit["archs"] == list(ARCHS) and len(kit["models"]) == 4 * len(ARCHS)
    assert os.path.isfile(tmp_path / "kit" / "README.md")
    for m in kit["models"]:
        d = tmp_path / "kit" / m["dir"]
        for g, mode in (("golden", "exact"), ("golden-llamacpp", "llamacpp")):
            if not (d / g).is_dir():
                assert m["type"] == "F32" and mode == "llamacpp"
                continue
            make_golden(d / "model.gguf", m["tokens"], tmp_path / "fresh", mode=mode)
            res = check_golden(d / g, tmp_path / "fresh")
            assert res.report.ok and not res.missing, (m["dir"], g, res.report.first_divergence)


def test_logits_only_golden_keeps_no_scores(synth_model, tmp_path):
    """--tensors logits: nothing is traced, so attention runs blocked; the logits are the full golden's."""
    from safetensors.numpy import load_file
    path = synth_model("qwen3moe")
    toks = list(range(1, 30))
    make_golden(path, toks, tmp_path / "all", tensors="all")
    make_golden(path, toks, tmp_path / "lg", tensors="logits", n_ubatch=8)
    a, b = load_file(tmp_path / "all" / "tensors.safetensors"), load_file(tmp_path / "lg" / "tensors.safetensors")
    assert list(b) == ["logits"] and np.abs(a["logits"] - b["logits"]).max() <= 1e-4
    assert json.loads((tmp_path / "lg" / "manifest.json").read_text())["n_ubatch"] == 8
