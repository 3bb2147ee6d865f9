"""Files written by llama.cpp's converter load in refengine and match llama.cpp and transformers (issue 22, dialect 3).

tests/fixtures/converted/{case}.gguf: a tiny random transformers model of the class the converter maps to the
arch (its register decorator in conversion/*.py), converted by llama.cpp's own `convert_hf_to_gguf.py
--outtype f32` (vendored with the oracle); {case}.q8_0.gguf the same with `--outtype q8_0` (the converter's own
Python quantizer and type choices); {case}.hf.npy: transformers' logits of the original model on
make_converted.TOKENS. Regenerate both with `tests/tools/make_converted.py` (its docstring: versions, the one
converter method it answers, the published config entries it restores).

What the converter's dialect brings that `synth` does not: INT32 per-layer head_count_kv (kimi-linear), the
recurrent-layer BOOL array beside a full_attention_interval it contradicts (qwen3next), vocab_size, token lists
padded with [PAD{i}], expert_group counts of 1, key/value_length of the MQA-converted MLA, DSA indexer keys.

Each case: `refengine lint` exits 0 without "would refuse"; every tensor llama.cpp names is traced and within
NMSE 1e-8, the logits too (F32); the Q8_0 file within 1e-7 in llama.cpp mode or a proven rounding flip; refengine's logits against transformers' within NMSE 1e-8 (the authors' code
as a second check). kimi-k3 has no transformers model: its checkpoint (KimiK3ForConditionalGeneration, the only
form its converter reads) is written from a small synth file by undoing each conversion step (make_converted.py,
build_k3), so there are no transformers logits; instead the converter's file is checked to hold the synth file's
tensors, with the converter's 4-D conv kernels where synth writes 3-D ones.

The DeepSeek-V2(-Lite) form (no q-LoRA: DeepseekV2ForCausalLM with q_lora_rank null) at 2 blocks is refused by
llama.cpp itself: its deepseek2 loader reads q_lora_rank unless the block count is 26 or 27 (or 48 with a 128256
vocab), the published Lite shapes (src/models/deepseek2.cpp:8-13). refengine refuses it with the same key. At 26
blocks the same form loads and matches (exhaustive: converted at test time, no fixture).
"""
import numpy as np
import pytest

from reportcheck import check_report
from traced_names import expected_names

from tools.make_converted import OUT, TOKENS

# case -> (llama.cpp arch, HF architecture the converter mapped to it)
MATCH = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen3moe": ("qwen3moe", "Qwen3MoeForCausalLM"),
    "deepseek2-v3": ("deepseek2", "DeepseekV3ForCausalLM"),
    "deepseek32": ("deepseek32", "DeepseekV32ForCausalLM"),
    "glm-dsa": ("glm-dsa", "GlmMoeDsaForCausalLM"),
    "qwen3next": ("qwen3next", "Qwen3NextForCausalLM"),
    "kimi-linear": ("kimi-linear", "KimiLinearForCausalLM"),
    "kimi-k3": ("kimi-k3", "KimiK3ForConditionalGeneration"),
}
HF_LOGITS = [c for c in MATCH if c != "kimi-k3"]
# case -> (fixture, key missing from it: as converted, or dropped from the fixture, the converter's file of a
# checkpoint without the published `scoring_func` / `moe_router_activation_func`: a required key in both loaders)
REFUSED = {"deepseek2": ("deepseek2", "deepseek2.attention.q_lora_rank"),
           "deepseek32-no-gating-func": ("deepseek32", "deepseek32.expert_gating_func"),
           "kimi-linear-no-gating-func": ("kimi-linear", "kimi-linear.expert_gating_func")}


def _path(case):
    return str(OUT / f"{case}.gguf")


# archs added while this file was written, not converted here yet (deepseek4: DeepseekV4ForCausalLM)
NOT_YET = {"deepseek4", "qwen4exp", "glm5-next"}


def test_every_arch_has_a_case():
    from refengine.archs import ARCHS
    assert {a for a, _ in MATCH.values()} == set(ARCHS) - NOT_YET


@pytest.mark.parametrize("case", list(MATCH) + ["deepseek2"])
def test_written_by_the_converter(case):
    """The fixture is the converter's (its arch, the pre-tokenizer make_converted answers), all F32."""
    from refengine.gguf import open_gguf
    arch = MATCH[case][0] if case in MATCH else case
    g = open_gguf(_path(case))
    assert g.kv["general.architecture"] == arch
    assert g.kv["tokenizer.ggml.pre"] == "default"
    assert {t.type.name for t in g.tensors.values()} == {"F32"}


@pytest.mark.oracle
@pytest.mark.parametrize("case", list(MATCH))
def test_converted_file_lints_and_matches_llamacpp(case, capsys):
    from refengine.cli import main
    from refengine.compare import run_compare
    from refengine.model import Model
    path = _path(case)
    assert main(["lint", path]) == 0
    assert "would refuse" not in capsys.readouterr().out
    kinds = [s.attn for s in Model(path).cfg.layers]
    rep = run_compare(path, TOKENS)
    check_report(rep, 1e-8, want=expected_names(MATCH[case][0], {}, kinds))


@pytest.mark.parametrize("case", HF_LOGITS)
def test_converted_file_matches_transformers(case):
    """refengine on the converted file against transformers on the original model (logits stored by
    make_converted.py): NMSE <= 1e-8, same top-1 everywhere."""
    from refengine.model import Model
    from numerics import nmse
    ours = np.asarray(Model(_path(case)).forward(np.array(TOKENS)), dtype=np.float64)
    theirs = np.load(OUT / f"{case}.hf.npy").astype(np.float64)
    assert ours.shape == theirs.shape
    assert nmse(theirs, ours) <= 1e-8, nmse(theirs, ours)
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()


# the converter's own Q8_0 ({case}.q8_0.gguf): which small matrices it quantized (lint flags them for strict
# loaders; where rows do not fit a Q8_0 block, F16: kimi ssm_f_b of kda.head_dim 8 rows, not flagged) and the
# matrices it keeps F32 (conversion/base.py prepare_tensors: ffn_gate_inp, conv kernels, the DSA indexer's proj)
Q8_FLAGGED = {"qwen3next": {"ssm_ba.weight"}, "kimi-linear": {"ssm_f_a.weight", "ssm_beta.weight"},
              "kimi-k3": {"ssm_f_a.weight", "ssm_beta.weight"}}
Q8_TYPES = {"deepseek32": {"indexer.proj.weight": "F32", "ffn_gate_inp.weight": "F32", "attn_k_b.weight": "F16"},
            "glm-dsa": {"indexer.proj.weight": "F32", "ffn_gate_inp.weight": "F32"},
            "qwen3next": {"ssm_conv1d.weight": "F32", "ffn_gate_inp_shexp.weight": "F32", "ssm_ba.weight": "Q8_0"},
            "kimi-linear": {"ssm_conv1d_q.weight": "F32", "ssm_f_a.weight": "Q8_0", "ssm_f_b.weight": "F16"},
            "kimi-k3": {"ssm_conv1d_q.weight": "F32", "ssm_f_a.weight": "Q8_0", "ssm_f_b.weight": "F16",
                        "ssm_beta.weight": "Q8_0", "ssm_g.weight": "Q8_0", "ffn_gate_inp.weight": "F32"}}


@pytest.mark.oracle
@pytest.mark.parametrize("case", list(MATCH))
def test_converter_q8_0_lints_and_matches_llamacpp_mode(case):
    """--outtype q8_0: lint refuses nothing and flags exactly the quantized small matrices; in llama.cpp mode the
    logits are within 1e-7 of llama.cpp's or a proven rounding flip (pinned: "converter-{case}-Q8_0")."""
    from refengine.flips import prove_flips
    from refengine.gguf import open_gguf
    from refengine.lint import lint
    from refengine.model import Model
    from tests.llamacpp_mode_outcomes import hold
    path = str(OUT / f"{case}.q8_0.gguf")
    types = {}
    for name, ti in open_gguf(path).tensors.items():
        types.setdefault(name.split(".", 2)[2] if name.startswith("blk.") else name, set()).add(ti.type.name)
    assert {n: types.get(n) for n in Q8_TYPES.get(case, {})} == {n: {t} for n, t in Q8_TYPES.get(case, {}).items()}
    rep = lint(path)
    assert not rep.refused and not rep.refusals, rep.refusals
    flagged = {t.name.split(".", 2)[2] for t in rep.tensors if any("strict loaders" in f for f in t.flags)}
    assert flagged == Q8_FLAGGED.get(case, set())
    hold(f"converter-{case}-Q8_0", prove_flips(Model(path), np.array(TOKENS)))


def test_kimi_k3_converter_writes_the_synth_tensors(tmp_path):
    """The K3 checkpoint was written from synth's file; the converter gives back every tensor with the same values,
    the KDA conv kernels 4-D {Kc, 1, d_in, 1} (kimi_k3.py's reshape) where synth writes them 3-D {Kc, 1, d_in}."""
    import quant
    from refengine.gguf import open_gguf
    from refengine.synth import write_synth
    from tools.make_converted import K3_SYNTH
    conv = open_gguf(_path("kimi-k3"))
    synth = open_gguf(write_synth("kimi-k3", tmp_path / "k3.gguf", overrides=K3_SYNTH))
    assert set(conv.tensors) == set(synth.tensors)
    for name, ti in synth.tensors.items():
        a, b = quant.dequantize(synth.tensor(name)), quant.dequantize(conv.tensor(name))
        if "ssm_conv1d" in name:
            assert (ti.shape, conv.tensors[name].shape) == ((a.shape[0], 1, a.shape[2]), (1, a.shape[0], 1, a.shape[2]))
        else:
            assert conv.tensors[name].shape == ti.shape, name
        assert np.array_equal(a.ravel(), b.ravel()), name


@pytest.mark.oracle
@pytest.mark.parametrize("case", list(REFUSED))
def test_files_llamacpp_refuses_are_refused_with_its_reason(case, capsys, tmp_path):
    from gguf_edit import rewrite
    from refengine.cli import main
    from refengine.errors import ConfigError
    from refengine.model import Model
    from refengine.oracle import run_llamacpp
    fixture, key = REFUSED[case]
    path = str(rewrite(_path(fixture), tmp_path / "f.gguf", drop_keys=(key,)))
    with pytest.raises(Exception, match=f"key not found in model: {key}"):
        run_llamacpp(path, TOKENS[:4], n_ctx=64)
    with pytest.raises(ConfigError, match=f"required metadata key '{key}' is missing"):
        Model(path)
    assert main(["lint", path]) == 1
    out = capsys.readouterr().out
    assert "would refuse" in out and key in out


@pytest.mark.transformers
@pytest.mark.exhaustive
def test_make_converted_reproduces_a_fixture(tmp_path, monkeypatch):
    """tests/tools/make_converted.py still writes the committed fixture: the llama case regenerated in a tmp dir
    has the same tensors and logits (the converter and transformers as installed)."""
    from second_oracle import import_transformers
    import_transformers()
    import quant
    from refengine.gguf import open_gguf
    from tools import make_converted
    monkeypatch.setattr(make_converted, "OUT", tmp_path)
    assert make_converted.main(["llama"]) == 0
    for f in ("llama.gguf", "llama.q8_0.gguf"):
        new, old = open_gguf(tmp_path / f), open_gguf(OUT / f)
        assert set(new.tensors) == set(old.tensors)
        for name in old.tensors:
            assert np.array_equal(quant.dequantize(new.tensor(name)), quant.dequantize(old.tensor(name))), name
    np.testing.assert_array_equal(np.load(tmp_path / "llama.hf.npy"), np.load(OUT / "llama.hf.npy"))


@pytest.mark.oracle
@pytest.mark.transformers
@pytest.mark.exhaustive
def test_deepseek2_lite_form_at_its_published_block_count(tmp_path, monkeypatch, capsys):
    """DeepSeek-V2-Lite's form (no q-LoRA) at 26 blocks, where llama.cpp does not read q_lora_rank: converted at
    test time (about 0.5 MB, no fixture), it lints, matches llama.cpp at 1e-8 and transformers' logits at 1e-8."""
    from second_oracle import import_transformers
    import_transformers()
    from refengine.cli import main
    from refengine.compare import run_compare
    from refengine.model import Model
    from numerics import nmse
    from tools import make_converted
    monkeypatch.setattr(make_converted, "OUT", tmp_path)
    assert make_converted.main(["deepseek2-lite"]) == 0
    path = str(tmp_path / "deepseek2-lite.gguf")
    assert main(["lint", path]) == 0
    assert "would refuse" not in capsys.readouterr().out
    model = Model(path)
    assert model.cfg.n_layer == 26 and all(s.attn_cfg.q_lora_rank == 0 for s in model.cfg.layers)
    check_report(run_compare(path, TOKENS), 1e-8)
    ours = np.asarray(model.forward(np.array(TOKENS)), dtype=np.float64)
    assert nmse(np.load(tmp_path / "deepseek2-lite.hf.npy").astype(np.float64), ours) <= 1e-8
