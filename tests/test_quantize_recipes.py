"""Recipes and `refengine quantize`: rule parsing, llama.cpp's keep list and shape fallbacks, and rewritten
GGUFs that refengine and llama.cpp both load and agree on."""
import numpy as np
import pytest

from quant import GGMLType as T
from quant.recipes import NAMED, RecipeError, choose_type, load_recipe, parse_recipe


def test_parse_rules_first_match_wins():
    r = parse_recipe("""
        # comment
        blk.*.ffn_*_exps.weight   q2_k    # routed experts
        blk.*.attn_v.weight = keep
        *                         Q4_K
    """, "mine")
    assert [x.type for x in r.rules] == [T.Q2_K, None, T.Q4_K]
    assert r.rule_type("blk.3.ffn_up_exps.weight") == T.Q2_K
    assert r.rule_type("blk.3.attn_v.weight") is None
    assert r.rule_type("output.weight") == T.Q4_K


@pytest.mark.parametrize("text,msg", [
    ("* Q4_K\nblk.* Q9_X", r"mine:2: unknown ggml type 'Q9_X'"),
    ("blk.* Q4_K extra", r"mine:1: expected 'PATTERN TYPE'"),
    ("* Q8_K", r"mine:1: Q8_K is not a weight type"),
    ("# nothing", r"mine: the recipe has no rules"),
])
def test_parse_errors_name_the_line(text, msg):
    with pytest.raises(RecipeError, match=msg):
        parse_recipe(text, "mine")


def test_named_recipes_parse_and_unknown_names_fail():
    for name in NAMED:
        assert load_recipe(name).rules
    with pytest.raises(RecipeError, match="neither a file nor a named recipe"):
        load_recipe("q5_k_xl")


@pytest.mark.parametrize("name,shape,src,want,target", [
    ("blk.0.attn_norm.weight", (256,), T.F32, T.F32, T.Q4_K),               # 1-D
    ("blk.0.ffn_gate_inp.weight", (8, 256), T.F32, T.F32, T.Q4_K),          # router
    ("blk.0.attn_q_norm.weight", (128,), T.F32, T.F32, T.Q4_K),
    ("blk.0.attn_q.bias", (256,), T.F32, T.F32, T.Q4_K),
    ("blk.0.attn_q.weight", (256, 256), T.F16, T.Q4_K, T.Q4_K),
    ("blk.0.ffn_down.weight", (256, 96), T.F32, T.Q5_0, T.Q4_K),            # fallbacks (tensor_type_fallback)
    ("blk.0.ffn_down.weight", (256, 96), T.F32, T.Q5_1, T.Q5_K),
    ("blk.0.ffn_down.weight", (256, 96), T.F32, T.Q8_0, T.Q6_K),
    ("blk.0.ffn_down.weight", (256, 96), T.F32, T.Q4_0, T.Q2_K),
    ("blk.0.ffn_down.weight", (256, 96), T.F32, T.IQ4_NL, T.IQ2_XXS),
    ("blk.0.ffn_down.weight", (256, 100), T.F32, T.F16, T.Q4_K),            # not even 32: F16
    ("blk.0.ffn_down.weight", (256, 100), T.F32, T.F16, T.Q8_0),
])
def test_choose_type(name, shape, src, want, target):
    recipe = parse_recipe(f"* {target.name}")
    assert choose_type(recipe, name, shape, src)[0] == want


def test_no_fallback_is_an_error():
    with pytest.raises(RecipeError, match="blk.0.ffn_down.weight.*no fallback for NVFP4"):
        choose_type(parse_recipe("* NVFP4"), "blk.0.ffn_down.weight", (256, 96), T.F32)


# ---------------------------------------------------------------- whole files

@pytest.fixture(scope="module")
def moe_f32(tmp_path_factory):
    """qwen3moe tiny, F32, expert hidden width 96 (so ffn_down_exps rows do not fit 256-blocks)."""
    from refengine.synth import write_synth
    return write_synth("qwen3moe", tmp_path_factory.mktemp("rq") / "moe96.gguf", preset="tiny",
                       overrides={"n_ff_exp": 96})


@pytest.mark.oracle
def test_moe_q2k_loads_in_both_and_agrees(moe_f32, tmp_path):
    from quant import dequantize
    from quant import ggml as qggml
    from refengine.compare import run_compare
    from refengine.gguf import open_gguf
    from refengine.quantize import quantize_gguf

    out = tmp_path / "moe-q2k.gguf"
    s = quantize_gguf(moe_f32, out, load_recipe("moe-q2k"), progress=False, engine="numpy")
    src, dst = open_gguf(moe_f32), open_gguf(out)
    types = {n: ti.type for n, ti in dst.tensors.items()}
    assert types["blk.0.ffn_gate_exps.weight"] == T.Q2_K
    assert types["blk.0.ffn_down_exps.weight"] == T.Q4_0          # 96-wide rows: llama.cpp's Q2_K fallback
    assert types["blk.1.attn_q.weight"] == T.Q8_0
    assert types["blk.1.ffn_gate_inp.weight"] == T.F32            # routers stay
    assert types["output.weight"] == types["token_embd.weight"] == T.Q6_K
    assert types["blk.0.attn_norm.weight"] == T.F32
    assert list(dst.tensors) == list(src.tensors)
    # metadata copied, file type left to llama.cpp to guess
    for key in src.kv:
        if key != "general.file_type":
            assert dst.get(key) == src.get(key) if not hasattr(src.get(key), "__len__") or isinstance(
                src.get(key), str) else list(dst.get(key)) == list(src.get(key)), key
    assert dst.get("general.quantization_version") == 2
    # the bytes are ggml's own quantization of the source values
    for name in ("blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight", "output.weight"):
        x = dequantize(src.tensor(name)).reshape(-1, src.tensors[name].ne[0])
        want = qggml.quantize(x, types[name]).reshape(-1)
        assert np.array_equal(dst.tensor(name).raw.reshape(-1), want), name
    assert s.bytes_out < s.bytes_in / 4
    # llama.cpp loads it; exact mode within the documented tolerance; llama.cpp mode within 1e-7, or rounding
    # flips proven by teacher forcing (refengine.flips.prove_flips), held to its pinned outcome
    # (tests/llamacpp_mode_outcomes.py, "quantize-moe-q2k")
    from refengine.flips import explain
    from tests.llamacpp_mode_outcomes import hold
    tokens = np.random.default_rng(1).integers(0, 256, 12)
    assert run_compare(out, tokens, mode="exact").ok
    rep = run_compare(out, tokens, mode="llamacpp", explain=explain)
    assert rep.logits.nmse <= 1e-5
    hold("quantize-moe-q2k", rep.proof)


@pytest.mark.oracle
def test_split_input_requantized_and_streamed(tmp_path, monkeypatch):
    """A Q8_0 split set requantized to Q4_K in slabs of 1000 values: one output file, the same bytes as
    ggml quantizing the decoded Q8_0 values, and the same file as with one slab per tensor."""
    from quant import dequantize
    from quant import ggml as qggml
    from refengine import quantize as rq
    from refengine.gguf import open_gguf
    from refengine.synth import write_synth

    first = write_synth("llama", tmp_path / "s.gguf", wtype="Q8_0", shards=3)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    rq.quantize_gguf(first, a, load_recipe("q4_k"), progress=False, engine="numpy")
    monkeypatch.setattr(rq, "SLAB_ELEMENTS", 1000)
    rq.quantize_gguf(first, b, load_recipe("q4_k"), progress=False, engine="numpy")
    assert a.read_bytes() == b.read_bytes()
    src, dst = open_gguf(first), open_gguf(a)
    assert len(dst.shards) == 1 and "split.count" not in dst.kv and set(dst.tensors) == set(src.tensors)
    name = "blk.1.ffn_up.weight"
    x = dequantize(src.tensor(name))
    assert np.array_equal(dst.tensor(name).raw, qggml.quantize(x, T.Q4_K).reshape(dst.tensor(name).raw.shape))


def test_cli_errors_exit_2(moe_f32, tmp_path, capsys):
    from refengine.cli import main
    out = str(tmp_path / "o.gguf")
    assert main(["quantize", moe_f32, out, "--recipe", "nosuch", "-q"]) == 2
    assert "neither a file nor a named recipe" in capsys.readouterr().err
    bad = tmp_path / "bad.recipe"
    bad.write_text("blk.* Q4_K\n* Q9_X\n")
    assert main(["quantize", moe_f32, out, "--recipe", str(bad), "-q"]) == 2
    assert "bad.recipe:2: unknown ggml type 'Q9_X'" in capsys.readouterr().err
    assert main(["quantize", moe_f32, moe_f32, "--recipe", "q8_0", "-q"]) == 2
    assert "would overwrite the input" in capsys.readouterr().err
