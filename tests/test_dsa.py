"""DSA (deepseek32, glm-dsa) without the oracle: the indexer's pieces, the per-layer structure, the dense limit,
decode past several top-k boundaries, and the real-size presets' parameter counts.

The llama.cpp comparisons are in tests/test_vs_llamacpp.py (every tensor, the selected key sets) and
tests/test_llamacpp_mode.py (Q8_0 / Q4_K).
"""
import numpy as np
import pytest

from refengine import Model, Runtime, Trace
from refengine.attention import dsa_indexer
from refengine.attention.dsa_indexer import hadamard, index_scores, select_top_k
from refengine.attention.mha import causal_mask
from refengine.cache import DSAState, IndexerKeys
from refengine.compare import metrics
from refengine.config import ROPE_NEOX, ROPE_NORM

TOKENS = [int(t) for t in np.random.default_rng(1).integers(0, 256, 40)]     # 5x the tiny top-k of 8


# ---------------------------------------------------------------- pieces

@pytest.mark.parametrize("n", [64, 128])
def test_hadamard_is_orthonormal_and_leaves_scores_unchanged(n):
    h = hadamard(n)
    assert np.allclose(h, h.T) and np.allclose(h @ h, np.eye(n), atol=1e-6)
    rng = np.random.default_rng(0)
    iq, ik = rng.standard_normal((5, 4, n)).astype(np.float32), rng.standard_normal((7, n)).astype(np.float32)
    iw = rng.standard_normal((5, 4)).astype(np.float32)
    mask = causal_mask(np.arange(2, 7), np.arange(7))
    a, b = index_scores(iq, ik, iw, mask), index_scores(iq @ h, ik @ h, iw, mask)
    assert metrics(a, b)[0] < 1e-12


def test_top_k_covering_the_context_is_the_causal_mask():
    rng = np.random.default_rng(0)
    causal = causal_mask(np.arange(3, 9), np.arange(9))                      # [6, 9]
    score = rng.standard_normal((6, 9)).astype(np.float32) + causal
    for k in (9, 64):
        top, sel = select_top_k(score, k)
        assert top.shape == (6, 9) and np.array_equal(sel + causal, causal)
    top, sel = select_top_k(score, 4)                                         # keeps the 4 best visible keys
    for t in range(6):
        want = set(np.argsort(-score[t])[:4])
        assert set(top[t]) == want and set(np.flatnonzero(sel[t] == 0)) == want


@pytest.mark.parametrize("arch,mode,eps", [("deepseek32", ROPE_NEOX, 1e-6), ("glm-dsa", ROPE_NORM, 0.0)])
def test_indexer_config_per_arch(synth_model, arch, mode, eps):
    """deepseek32: NEOX indexer rope, LayerNorm eps 1e-6 (hard-coded); glm-dsa: NORM and eps 0 (never set), even
    when the file carries attention.layer_norm_epsilon (all_optional writes 1e-3): llama.cpp does not read it."""
    with pytest.warns(Warning, match="layer_norm_epsilon"):
        m = Model(synth_model(arch, all_optional=True))
    ic = m.cfg.layers[0].attn_cfg.indexer
    assert (ic.rope_mode, ic.k_norm_eps, ic.n_head, ic.head_dim, ic.top_k) == (mode, eps, 16, 64, 8)


def test_glm_dsa_indexer_types_rules(synth_model):
    """The key; no key below a 1M context (all full); no key from 1M (GLM-5.2's pattern, llama.cpp's table)."""
    want = [True, True, True, False, False, False, True]
    for preset in ("tiny-shared", "tiny-default"):
        m = Model(synth_model("glm-dsa", preset=preset))
        assert [s.attn_cfg.indexer.full for s in m.cfg.layers] == want
        assert [s.attn_cfg.indexer.source for s in m.cfg.layers] == [0, 1, 2, 2, 2, 2, 6]
        st = m.new_state()
        assert all(isinstance(s, DSAState) for s in st.layers)
        assert [isinstance(s.index, IndexerKeys) for s in st.layers] == want        # shared layers: no indexer cache
    assert all(s.attn_cfg.indexer.full for s in Model(synth_model("glm-dsa")).cfg.layers)


def test_shared_layers_reuse_the_selection(synth_model):
    m = Model(synth_model("glm-dsa", preset="tiny-shared"))
    tr = Trace()
    m.forward(TOKENS, rt=Runtime(trace=tr))
    assert "indexer_score-3" not in tr and "indexer_q-4" not in tr
    for il in (3, 4, 5):
        assert np.array_equal(tr[f"top_k-{il}"], tr["top_k-2"])
        assert np.array_equal(np.isfinite(tr[f"kq_soft_max-{il}"]) & (tr[f"kq_soft_max-{il}"] > 0),
                              np.isfinite(tr["kq_soft_max-2"]) & (tr["kq_soft_max-2"] > 0))
    assert not np.array_equal(tr["top_k-6"], tr["top_k-2"])


def test_selection_drops_keys(synth_model):
    """With 40 tokens and top-k 8 every query from position 8 on attends to exactly 8 keys."""
    m = Model(synth_model("deepseek32"))
    tr = Trace()
    m.forward(TOKENS, rt=Runtime(trace=tr))
    p = tr["kq_soft_max-1"]                                                   # [H, T, S]
    kept = (p > 0).sum(-1)                                                    # [H, T]
    assert np.array_equal(kept[0], np.minimum(np.arange(1, 41), 8))


# ---------------------------------------------------------------- whole model

def test_top_k_covering_the_context_equals_dense_mla(synth_model):
    """deepseek32 tiny with top-k >= the context against deepseek2 tiny: every shared tensor is seeded by name, so
    the two files hold the same MLA and MoE weights; DSA then keeps every visible key and must equal dense MLA."""
    dense = Model(synth_model("deepseek2")).forward(TOKENS)
    full = Model(synth_model("deepseek32", overrides={"idx_top_k": 64})).forward(TOKENS)
    sparse = Model(synth_model("deepseek32")).forward(TOKENS)
    assert metrics(dense, full)[0] < 1e-12
    assert np.array_equal(dense, full)       # a prompt of >= DENSE_FROM tokens, every key kept: dense MLA's own path
    assert metrics(dense, sparse)[0] > 1e-3                 # top-k 8 of 40 keys changes the model


DECODE_CASES = [("deepseek32", dict(), None), ("deepseek32", dict(), "naive"), ("glm-dsa", dict(preset="tiny-shared"), None)]


@pytest.mark.parametrize("arch,kw,form", DECODE_CASES, ids=lambda v: v if isinstance(v, str) else "-".join(
    f"{k}={w}" for k, w in (v or {}).items()) or None)
def test_decode_past_several_top_k_boundaries(synth_model, arch, kw, form):
    """Prefill 6 tokens, then 34 one-token decodes (top-k 8: the selection starts dropping keys at position 8 and
    keeps changing) == one prefill of all 40."""
    m = Model(synth_model(arch, **kw))
    full = m.forward(TOKENS, m.new_state(form))
    st = m.new_state(form)
    step = np.concatenate([m.forward(TOKENS[:6], st)] + [m.forward([t], st) for t in TOKENS[6:]])
    assert metrics(full, step)[0] <= 1e-10
    assert np.array_equal(full.argmax(-1), step.argmax(-1))


def test_cache_bytes(synth_model):
    """The indexer cache adds di float32 per position to full layers only."""
    m = Model(synth_model("glm-dsa", preset="tiny-shared"))
    st = m.new_state()
    m.forward(TOKENS[:10], st)
    mla_row = (64 + 32) * 4                                      # C + R floats (the latent cache row)
    assert st.nbytes() == 10 * (7 * mla_row + 4 * 64 * 4)


# ---------------------------------------------------------------- real-size presets

# DeepSeek-V3.2: 685B with its 14B MTP module (Hugging Face deepseek-ai/DeepSeek-V3.2 model card; V3's README_WEIGHTS
# splits 685B = 671B main + 14B MTP): the trunk written here is 671B + the indexers (0.85B). GLM-5.2: ~743B total
# (vLLM recipes zai-org/GLM-5.2; llama.cpp names the 78-layer file 744B.A40B), the trunk without MTP.
PUBLISHED = {("deepseek32", "deepseek-v3.2"): 671.9e9, ("glm-dsa", "glm-5.2"): 744e9}


@pytest.mark.parametrize("arch,preset", sorted(PUBLISHED))
def test_real_size_param_count(arch, preset):
    from refengine.synth import plan_tensors, resolve_preset
    n = sum(int(np.prod(t.shape, dtype=np.int64)) for t in plan_tensors(arch, resolve_preset(arch, preset)))
    assert abs(n / PUBLISHED[arch, preset] - 1) < 0.01, n


def test_real_size_shapes():
    from refengine.synth import metadata, plan_tensors, resolve_preset
    p = resolve_preset("glm-dsa", "glm-5.2", layers=4)
    plan = {t.name: t.shape for t in plan_tensors("glm-dsa", p)}
    assert plan["blk.0.indexer.attn_q_b.weight"] == (32 * 128, 2048) and plan["blk.0.indexer.proj.weight"] == (32, 6144)
    assert plan["blk.0.attn_q_b.weight"] == (64 * 256, 2048) and plan["blk.0.attn_v_b.weight"] == (64, 256, 512)
    assert "blk.3.indexer.attn_k.weight" not in plan and "blk.2.indexer.attn_k.weight" in plan
    kv = {k: v for k, v, _ in metadata("glm-dsa", p, all_optional=False, rope_scaling=None, name="x")}
    assert kv["glm-dsa.attention.indexer.types"] == [1, 1, 1, 0]
    ds = {t.name: t.shape for t in plan_tensors("deepseek32", resolve_preset("deepseek32", "deepseek-v3.2", layers=4))}
    assert ds["blk.3.indexer.attn_q_b.weight"] == (64 * 128, 1536) and ds["blk.3.ffn_gate_exps.weight"] == (256, 2048, 7168)


def test_indexer_key_length_must_fit_the_hadamard(tmp_path):
    from refengine.errors import ConfigError
    from refengine.synth import write_synth
    path = write_synth("deepseek32", tmp_path / "bad.gguf", overrides={"idx_dim": 48})
    with pytest.raises(ConfigError, match="power of two"):
        Model(path)
    assert dsa_indexer.ROPE_MODES[ROPE_NEOX] == "NEOX"


def test_selection_compare_names_near_ties():
    """compare's rule for `top_k`: sets of visible positions; a differing set is a near-tie only when llama.cpp's
    k-th and (k+1)-th scores are within twice the measured score error of that query."""
    from refengine.compare import selection_sets
    causal = causal_mask(np.arange(4, 6), np.arange(6))                              # [2, 6]
    ref_score = np.array([[0.9, 0.5, 0.30001, 0.3, 0.1, 0.0], [0.9, 0.8, 0.7, 0.1, 0.2, 0.6]], np.float32) + causal
    got_score = ref_score + np.float32(2e-5) * np.isfinite(ref_score)              # measured error 2e-5 everywhere
    ref_sel = np.array([[0, 1, 2], [0, 1, 2]])
    agree, tie = selection_sets(ref_sel, np.array([[0, 1, 3], [0, 1, 2]]), ref_score, got_score)
    assert agree.tolist() == [False, True] and tie.tolist() == [True, False]       # 0.30001 vs 0.3: a near-tie
    agree, tie = selection_sets(ref_sel, np.array([[0, 1, 2], [0, 1, 5]]), ref_score, got_score)
    assert agree.tolist() == [True, False] and tie.tolist() == [False, False]      # 0.7 vs 0.6: a real difference
    # llama.cpp may name masked positions when fewer than k are visible: they do not count
    agree, _ = selection_sets(np.array([[0, 1, 5]]), np.array([[0, 1, 2]]), np.array([[1.0, 0.5, -np.inf]]),
                               np.array([[1.0, 0.5, -np.inf]]))
    assert agree.tolist() == [True]


@pytest.mark.parametrize("n", [1, 3, 8, 40])
def test_top_k_positions_is_the_stable_argsort(n):
    """The partial selection == the full stable sort: distinct scores, ties at the boundary, -inf (causal) rows."""
    from refengine.attention.dsa_indexer import top_k_positions
    rng = np.random.default_rng(n)
    T, S = 50, 40
    score = rng.standard_normal((T, S)).astype(np.float32)
    score[5:15] = np.round(score[5:15])                                  # many ties
    score[20:30] = np.round(score[20:30] * 4) / 4
    q_pos = np.arange(T) - 10                                            # rows 0..9 see nothing, then 1, 2, ...
    score = score + causal_mask(q_pos, np.arange(S))
    want = np.argsort(-score, axis=-1, kind="stable")[:, :min(n, S)]
    assert np.array_equal(top_k_positions(score, min(n, S)), want)
