"""Synthetic deepseek2 GGUFs: llama.cpp loads every tiny preset and computes finite, spread logits; the
real-size presets' plans add up to the published parameter counts.

`pytest tests/test_synth_deepseek2.py -s -k graph_names` prints llama.cpp's deepseek2 graph names and shapes.
"""
import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from refengine.errors import ConfigError
from refengine.archs.deepseek2_synth import ignored_by_llamacpp, metadata, n_params, plan_tensors, resolve
from refengine.synth import write_synth


def write_deepseek2(path, **kw):
    return write_synth("deepseek2", path, **kw)

TOKENS = [7, 200, 13, 55, 1, 99, 144, 3]

# ---------------------------------------------------------------- plan arithmetic (no file written)

# Published totals: DeepSeek-V3 main model 671B without its MTP module (deepseek-ai/DeepSeek-V3
# README_WEIGHTS.md, "Total parameters: 671B"); Kimi-K2-Instruct 1026.5B (the Hugging Face safetensors count
# of moonshotai/Kimi-K2-Instruct, the "1T" of its README).
PUBLISHED = {"deepseek-v3": 671e9, "kimi-k2": 1026.5e9}


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_real_size_param_count(preset):
    n = n_params(plan_tensors(resolve(preset)))
    assert abs(n / PUBLISHED[preset] - 1) < 0.01, (preset, n)


def test_real_size_shapes():
    plan = {tp.name: tp.shape for tp in plan_tensors(resolve("deepseek-v3"))}
    assert plan["blk.0.attn_q_a.weight"] == (1536, 7168)
    assert plan["blk.0.attn_q_b.weight"] == (128 * 192, 1536)
    assert plan["blk.0.attn_kv_a_mqa.weight"] == (576, 7168)
    assert plan["blk.0.attn_k_b.weight"] == (128, 512, 128)
    assert plan["blk.0.attn_v_b.weight"] == (128, 128, 512)
    assert plan["blk.0.attn_output.weight"] == (7168, 128 * 128)
    assert plan["blk.2.ffn_gate.weight"] == (18432, 7168)
    assert "blk.3.ffn_gate.weight" not in plan
    assert plan["blk.3.ffn_gate_exps.weight"] == (256, 2048, 7168)
    assert plan["blk.3.ffn_down_exps.weight"] == (256, 7168, 2048)
    assert plan["blk.3.exp_probs_b.bias"] == (256,)
    assert plan["blk.60.ffn_up_shexp.weight"] == (2048, 7168)
    k2 = {tp.name: tp.shape for tp in plan_tensors(resolve("kimi-k2"))}
    assert k2["blk.1.ffn_gate_exps.weight"] == (384, 2048, 7168) and "blk.1.ffn_gate.weight" not in k2


def test_layers_keep_a_moe_block():
    assert resolve("deepseek-v3", layers=2)["n_dense_lead"] == 1
    assert resolve("deepseek-v3", layers=5)["n_dense_lead"] == 3
    assert resolve("tiny", layers=1)["n_dense_lead"] == 0
    names = {tp.name for tp in plan_tensors(resolve("deepseek-v3", layers=2))}
    assert "blk.0.ffn_gate.weight" in names and "blk.1.ffn_gate_exps.weight" in names
    with pytest.raises(ConfigError):
        resolve("tiny", layers=4)
    with pytest.raises(ConfigError):
        resolve("tiny", overrides={"n_kv_heads": 2})


def test_metadata_keys():
    kv = {k: v for k, v, _ in metadata(resolve("deepseek-v3"), all_optional=False, rope_scaling=None, name="x")}
    a = "deepseek2."
    assert kv[a + "attention.key_length"] == 576 and kv[a + "attention.value_length"] == 512
    assert kv[a + "attention.key_length_mla"] == 192 and kv[a + "attention.value_length_mla"] == 128
    assert kv[a + "attention.head_count_kv"] == 1 and kv[a + "rope.dimension_count"] == 64
    assert kv[a + "expert_weights_norm"] is True and kv[a + "expert_gating_func"] == 2
    assert kv[a + "rope.scaling.type"] == "yarn" and kv[a + "rope.scaling.factor"] == 40.0
    assert kv[a + "rope.scaling.yarn_log_multiplier"] == pytest.approx(0.1)
    assert kv[a + "expert_group_count"] == 8 and kv[a + "expert_group_used_count"] == 4
    legacy = {k: v for k, v, _ in metadata(resolve("tiny-legacy"), all_optional=False, rope_scaling=None, name="x")}
    assert a + "attention.key_length_mla" not in legacy and legacy[a + "attention.head_count_kv"] == 4
    with pytest.raises(ConfigError):
        plan_tensors(resolve("tiny"), rope_scaling="longrope")


def test_written_file_reads_back(tmp_path):
    path = write_deepseek2(tmp_path / "t.gguf", preset="tiny", all_optional=True)
    r = GGUFReader(path)
    plan = {tp.name: tp.shape for tp in plan_tensors(resolve("tiny"), all_optional=True)}
    got = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in r.tensors}
    assert got == plan
    f = r.fields["deepseek2.expert_weights_norm"]
    assert f.types == [GGUFValueType.BOOL]
    bias = next(t for t in r.tensors if t.name == "blk.1.exp_probs_b.bias").data
    assert 0.1 < float(np.std(bias)) < 0.4


def test_ignored_by_llamacpp():
    assert ignored_by_llamacpp("blk.1.ffn_gate_exps.scale") and ignored_by_llamacpp("blk.0.attn_output.input_scale")
    assert not ignored_by_llamacpp("blk.0.attn_output.scale") and not ignored_by_llamacpp("blk.1.exp_probs_b.bias")


# ---------------------------------------------------------------- llama.cpp loads them

CASES = [
    dict(preset="tiny"),
    dict(preset="tiny", all_optional=True),
    dict(preset="tiny", wtype="Q8_0"),
    dict(preset="tiny", wtype="Q4_K"),
    dict(preset="tiny", rope_scaling="yarn", tied_output=True),
    dict(preset="tiny", layers=1),
    dict(preset="tiny-lite"),
    dict(preset="tiny-lite", all_optional=True, wtype="Q4_K"),
    dict(preset="tiny-groups"),
    dict(preset="tiny-groups", all_optional=True),
    dict(preset="tiny-legacy"),
    # V3's keys (YaRN factor 40, 8 groups, 4 used) at small dims: 8 of 16 experts = every expert of the kept groups
    dict(preset="deepseek-v3", layers=2, overrides=dict(n_vocab=256, n_embd=256, n_head=4, n_ff=256, q_lora=64,
                                                        kv_lora=64, qk_nope=32, qk_rope=32, v_head=32, n_ff_exp=64,
                                                        n_expert=16)),
]


def _id(kw):
    return "-".join(f"{k}={v}" for k, v in kw.items() if k != "overrides")


@pytest.mark.oracle
@pytest.mark.parametrize("kw", CASES, ids=_id)
def test_llamacpp_runs(tmp_path, kw):
    from refengine.oracle.llamacpp import run_llamacpp
    path = write_deepseek2(tmp_path / "m.gguf", **kw)
    p = resolve(kw["preset"], layers=kw.get("layers"), overrides=kw.get("overrides"))
    res = run_llamacpp(path, TOKENS, n_threads=2)
    assert res.logits.shape == (len(TOKENS), p["n_vocab"])
    assert np.isfinite(res.logits).all()
    top2 = np.sort(res.logits, axis=-1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0] > 1e-3).all(), "near-tied top logits"
    names = set(res.order)
    last = p["n_layer"] - 1
    assert f"ffn_moe_topk-{last}" in names and f"ffn_shexp-{last}" in names and "result_output" in names
    if p["mla"]:
        assert f"q_nope_absorbed-{last}" in names
    else:
        assert f"k_nope_view-{last}" in names
    if p["n_group"] > 1:
        assert f"ffn_moe_group_topk-{last}" in names
    if p["probs_bias"] or kw.get("all_optional"):
        assert f"ffn_moe_probs_biased-{last}" in names


class _Recorder(dict):
    """A dict that also keeps every (name, shape) written to it, repeats included."""
    def __init__(self):
        super().__init__()
        self.log = []

    def __setitem__(self, k, v):
        self.log.append((k, tuple(v.shape)))
        super().__setitem__(k, v)


@pytest.mark.oracle
def test_graph_names(tmp_path):
    """Print every graph tensor llama.cpp names while computing tiny (layer 0 dense, layers 1-2 MoE)."""
    from refengine.oracle.llamacpp import LlamaCpp
    path = write_deepseek2(tmp_path / "m.gguf", preset="tiny")
    with LlamaCpp(path, n_ctx=256, n_batch=len(TOKENS), trace=True, n_threads=2) as lc:
        lc.tensors = _Recorder()
        lc.decode(TOKENS)
        log = lc.tensors.log
    print(f"\n{len(log)} named tensors (NumPy shapes), tiny preset, T={len(TOKENS)}:")
    for name, shape in log:
        if not name.endswith(("-2",)):
            print(f"  {name:32s} {shape}")
    assert any(n == "q_nope_absorbed-0" for n, _ in log)
