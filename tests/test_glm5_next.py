"""GLM-5.3-Flash's own mechanisms (the k-pool indexer, llama.cpp's top-k tie order, the streams' mean head), each
against a second statement of it, then the carried state across pool boundaries (refengine alone, and llama.cpp's
own prefill-then-decode schedule, whose one-token calls take its gather form).

The whole model against llama.cpp tensor by tensor is tests/test_vs_llamacpp.py's F32_CASES (64 tokens).
"""
import numpy as np
import pytest

from refengine import Model, Runtime, Trace
from refengine.attention import kpool_indexer as kpi
from refengine.cache import KPoolKeys
from refengine.compare import metrics
from refengine.ops.top_k import ggml_top_k, heap_select
from refengine.residual import hc_head

TOKENS = [int(t) for t in np.random.default_rng(3).integers(0, 256, 40)]
# prefill 10, then single tokens across the pool ends 11, 15, 19 (kpool 4), then calls of 4, 3, 5 and 9
CHUNKS = [10, 1, 1, 1, 1, 1, 1, 4, 1, 1, 3, 5, 1, 9]


def _config(**kw):
    return kpi.KPoolConfig(**{**dict(n_head=2, head_dim=8, top_k=8, kpool=4, select_tail=True, k_norm_eps=0.0), **kw})


def test_pool_by_hand():
    """A pooled key: per dimension, the softmax over the pool's members of gate + ape weighs the members' keys."""
    rng = np.random.default_rng(0)
    ik, ig = (rng.standard_normal((3, 4, 8)).astype(np.float32) for _ in range(2))
    ape = rng.standard_normal((4, 8)).astype(np.float32) * 0.1
    got = kpi.pool(ik, ig, ape)                                                   # [3, 8]
    for p in range(3):
        z = ig[p] + ape
        w = np.exp(z - z.max(0)) / np.exp(z - z.max(0)).sum(0)                   # [4, 8] over members
        np.testing.assert_allclose(got[p], (w * ik[p]).sum(0), rtol=1e-5, atol=1e-6)


def test_pools_in_chunks_equal_one_call():
    """The pool being filled carried between calls: any split of the positions pools the same keys."""
    rng = np.random.default_rng(1)
    ik, ig = (rng.standard_normal((23, 8)).astype(np.float32) for _ in range(2))
    w = type("W", (), {"indexer_kpool_ape": rng.standard_normal((4, 8)).astype(np.float32)})()
    kc, rt = _config(), Runtime()
    one = kpi.pool_keys(ik, ig, w, kc=kc, state=KPoolKeys(), rt=rt, il=0)
    st = KPoolKeys()
    for a, b in ((0, 3), (3, 4), (4, 9), (9, 16), (16, 23)):
        parts = kpi.pool_keys(ik[a:b], ig[a:b], w, kc=kc, state=st, rt=rt, il=0)
    assert one.shape == (5, 8) and st.n == 23 and st.pooled.n == 5
    np.testing.assert_array_equal(parts, one)


def test_selection_by_hand():
    """Query p attends the members of its top k/kp finished pools and, with the tail, its own unfinished pool's
    positions up to p; a query that finishes its pool has no tail (it sees itself only through a chosen pool)."""
    kc = _config(top_k=4)                                                         # one pool kept
    score = np.array([[0.5, 0.9, -np.inf], [0.5, 0.9, 0.1], [0.9, 0.5, -np.inf]], np.float32)
    q_pos = np.array([9, 11, 10])
    top, mask, slots, live = kpi.select(score, q_pos, 12, kc)
    att = [set(np.nonzero(mask[t] == 0)[0]) for t in range(3)]
    assert att[0] == {4, 5, 6, 7, 8, 9}                    # pool 1 + tail 8, 9
    assert att[1] == {4, 5, 6, 7}                          # pool 1; 11 finishes pool 2: no tail, not itself
    assert att[2] == {0, 1, 2, 3, 8, 9, 10}                # pool 0 + tail 8..10
    assert list(top[:, 0]) == [1, 1, 0]
    assert slots.shape == (3, 4 + 3) and live[0].tolist() == [True] * 4 + [True, True, False]
    no_tail = kpi.select(score, q_pos, 12, _config(top_k=4, select_tail=False))[1]
    assert set(np.nonzero(no_tail[0] == 0)[0]) == {4, 5, 6, 7}


def test_ggml_top_k_ties():
    """Without ties: the k largest, in descending order but for the first two swapped (ops.cpp:8818-8821). With
    exact ties the set is the heap select's: of eight zeros, top-2 keeps indices 0 and 1 by the heap's rules, and a
    strictly larger later score replaces the heap's top."""
    s = np.array([0.1, 0.7, 0.3, 0.9, 0.5], np.float32)
    assert ggml_top_k(s, 3) == [1, 3, 4]
    z = np.zeros(8, np.float32)
    assert set(heap_select(z, 2)) == {0, 1}
    z[5] = 1.0
    assert 5 in heap_select(z, 2) and len(set(heap_select(z, 2))) == 2
    rng = np.random.default_rng(2)
    for _ in range(50):
        x = rng.standard_normal(40).astype(np.float32)
        assert set(ggml_top_k(x, 7)) == set(np.argsort(-x)[:7])


def test_fixed_pools_equal_the_ordinary():
    """A fixed-shape run's pooled keys (each position's pool as of it, at the capacity's rows; `pool_keys_fixed`)
    at the pools' last members == the ordinary run's finished pools, bit for bit, whatever the calls' sizes, and
    when one kind of run continues the other's sequence."""
    rng = np.random.default_rng(5)
    ik, ig = (rng.standard_normal((23, 8)).astype(np.float32) for _ in range(2))
    w = type("W", (), {"indexer_kpool_ape": rng.standard_normal((4, 8)).astype(np.float32)})()
    kc, rt = _config(), Runtime()
    want = kpi.pool_keys(ik, ig, w, kc=kc, state=KPoolKeys(), rt=rt, il=0)             # [5, 8]
    calls = ((0, 3), (3, 4), (4, 9), (9, 16), (16, 23))
    for first_fixed in (None, 2, 3):              # all fixed; 2 / 3 calls one way, then the other way
        st = KPoolKeys()
        for c, (a, b) in enumerate(calls):
            fixed = first_fixed is None or (c < first_fixed) == (first_fixed == 2)
            if fixed:
                got = kpi.pool_keys_fixed(ik[a:b], ig[a:b], w, kc=kc, state=st, pos=np.arange(a, b))
            else:
                got = kpi.pool_keys(ik[a:b], ig[a:b], w, kc=kc, state=st, rt=rt, il=0)
            np.testing.assert_array_equal(got[:b // 4], want[:b // 4])
        assert got.shape[0] >= 5 and st.n == 23


@pytest.mark.parametrize("T, S, cap, top_k, tail", [(1, 23, 40, 8, True), (7, 23, 40, 8, True),
                                                    (3, 30, 64, 12, False), (2, 300, 512, 40, True),
                                                    (4, 21, 21, 400, True), (20, 60, 64, 8, True),
                                                    (24, 300, 512, 40, True)])
def test_select_fixed_equals_select(T, S, cap, top_k, tail):
    """`select_fixed` (a fixed-shape run: the capacity's pools, the positions and llama.cpp's padded pool count on
    the device, the heap replayed by `ggml_top_k_rows`) attends what `select` attends, slot for slot in the same
    order, on scores full of exact ties (sums of ReLUs: 0 where every head is negative); the mask past the positions
    so far hides every key. Cases: one query, a ubatch, no tail, over 64 pools (a padded axis of 128), a budget
    above the pools (k/kp = 100: every visible pool kept), calls of more than 16 tokens (select's order there:
    ties by index where the k-th score is not tied)."""
    kc = _config(top_k=top_k, select_tail=tail)
    rng = np.random.default_rng(S + T)
    P, Pc = S // 4, cap // 4
    q_pos = np.arange(S - T, S)
    score = rng.choice(np.array([0.0, 0.0, 0.25, 1.0], np.float32), size=(T, P))
    ends = (np.arange(P) + 1) * 4 - 1
    score[ends[None, :] > q_pos[:, None]] = -np.inf
    top, mask, slots, live = kpi.select(score, q_pos, S, kc)
    wide = np.concatenate([score, np.full((T, Pc - P), -np.inf, np.float32)], axis=1)
    order, mask_f, slots_f, live_f = kpi.select_fixed(wide, q_pos, cap, kc)
    assert mask_f.shape == (T, cap) and slots_f.shape == live_f.shape == (T, kc.n_top * 4 + (3 if tail else 0))
    np.testing.assert_array_equal(mask_f[:, :S], mask)
    assert (mask_f[:, S:] == -np.inf).all()
    for t in range(T):
        assert list(slots_f[t][live_f[t]]) == list(slots[t][live[t]]), t
        n_seen = int(live[t, :kc.n_top * 4].sum()) // 4
        assert list(order[t, :n_seen]) == list(top[t, :n_seen]), t
    n = slots.shape[1] - (3 if tail else 0)                 # select's pool slots: min(k/kp, padded) pools
    np.testing.assert_array_equal(slots_f[:, :n], slots[:, :n])                 # dead ones included
    np.testing.assert_array_equal(slots_f[:, kc.n_top * 4:], slots[:, n:])      # the tail's
    assert (slots_f[:, n:kc.n_top * 4] == q_pos[0]).all() and not live_f[:, n:kc.n_top * 4].any()
    assert any(len(set(score[t][np.isfinite(score[t])])) < np.isfinite(score[t]).sum() for t in range(T))  # ties


def test_hc_mean_adds_streams_in_order():
    X = np.random.default_rng(4).standard_normal((3, 4, 8)).astype(np.float32)
    want = (((X[:, 0] + X[:, 1]) + X[:, 2]) + X[:, 3]) * np.float32(0.25)
    np.testing.assert_array_equal(hc_head.hc_mean(X, Runtime()), want)


@pytest.mark.parametrize("form, fixed", [(None, False), ("naive", False), ("chunked", False), (None, True)])
def test_decode_across_pool_boundaries(synth_model, form, fixed):
    """Calls of 10, 1 x 6, 4, 1, 1, 3, 5, 1, 9 tokens through the carried state (pools finished inside a call and
    by a single token, the tail carried) == one prefill of the 40; MLA absorbed / naive, KDA chunked; and the calls
    with fixed shapes (`Runtime(fixed_shapes=True)`: the capacity's pools, `select_fixed`)."""
    m = Model(synth_model("glm5-next"))
    full = m.forward(TOKENS, m.new_state(form))
    st, pos, parts = m.new_state(form), 0, []
    rt = Runtime(fixed_shapes=True) if fixed else None
    for c in CHUNKS:
        parts.append(m.forward(TOKENS[pos:pos + c], st, rt=rt))
        pos += c
    got = np.concatenate(parts)
    assert metrics(full, got)[0] <= 1e-10
    assert np.array_equal(full.argmax(-1), got.argmax(-1))
    idx = st.layers[1].index                                                      # block 1 runs its indexer
    assert idx.n == 40 and (idx.pk.n if fixed else idx.pooled.n) == (40 if fixed else 10)
    assert st.layers[3].index is None


def test_no_tail_is_warned(synth_model, tmp_path):
    """kpool_select_tail = false: positions 0 .. kpool-2 attend nothing; llama.cpp's softmax gives NaN (measured:
    every logit NaN over 64 tokens, as here), so the file is read with a warning naming the key."""
    from gguf_edit import GGUFValueType, rewrite
    from refengine.config import ConfigWarning
    path = rewrite(synth_model("glm5-next"), tmp_path / "no-tail.gguf",
                   set_keys={"glm5-next.attention.indexer.kpool_select_tail": (False, GGUFValueType.BOOL)})
    with pytest.warns(ConfigWarning, match="kpool_select_tail = false: the first 3 positions attend no key"):
        m = Model(path)
    with pytest.warns(RuntimeWarning, match="NaN"):
        assert np.isnan(m.forward(TOKENS[:8])).all()


def test_pools_are_dropped(synth_model):
    """The tiny preset's indexer keeps 2 pools: over 40 tokens most queries drop some finished pools."""
    m = Model(synth_model("glm5-next"))
    tr = Trace()
    m.forward(TOKENS, rt=Runtime(trace=tr))
    score = tr["indexer_score-1"]                                                 # [T, P]
    visible = np.isfinite(score).sum(-1)
    assert score.shape == (40, 10) and (visible > 2).sum() >= 25


@pytest.mark.oracle
@pytest.mark.parametrize("kw", [dict(), dict(all_optional=True)], ids=["tiny", "all-optional"])
def test_prefill_then_decode_matches_llamacpp(synth_model, kw):
    """llama.cpp decoding the same calls (its one-token calls attend through the gather form, its pools cached in
    the indexer rows): logits NMSE <= 1e-8, and the same top-1 at every position."""
    from refengine.oracle import run_llamacpp
    path = synth_model("glm5-next", **kw)
    ref = run_llamacpp(path, TOKENS, chunks=CHUNKS, trace=False).logits
    m = Model(path)
    st, pos, parts = m.new_state(), 0, []
    for c in CHUNKS:
        parts.append(m.forward(TOKENS[pos:pos + c], st))
        pos += c
    got = np.concatenate(parts)
    assert metrics(ref, got)[0] <= 1e-8
    assert np.array_equal(ref.argmax(-1), got.argmax(-1))


# ---------------------------------------------------------------- llama.cpp's own random-model writer's file

WRITER_SEED = 7
# the quantizations the lead's writer_files were made with (llama-quantize; the overrides as written there)
WRITER_QUANT = {"F32": None,
                "Q4_K_M": ["--tensor-type", "ssm_f_b=q8_0", "--tensor-type", "ssm_f_a=q8_0", "--tensor-type",
                           "attn_k_b=q8_0", "--tensor-type", "ffn_gate_inp=q8_0", "--tensor-type", "ssm_beta=q8_0"],
                "MXFP4_MOE": []}


@pytest.mark.oracle
@pytest.mark.parametrize("ftype", list(WRITER_QUANT))
def test_llamacpp_random_writer_file(tmp_path, ftype, capsys):
    """The file llama.cpp's tests/test-llama-archs writes for glm5-next (seed 7: 2 blocks, MLA dense then KDA MoE,
    head_count uniform, top-k 131072: every pool kept) loads, lints clean and matches llama.cpp over 64 tokens: F32
    at 1e-8, its llama-quantize Q4_K_M / MXFP4_MOE files in llama.cpp mode at 1e-7. Needs the tools built from the
    vendored tree (tests/tools/build_llamacpp_tools.sh; $REFENGINE_LLAMACPP_BIN or build/llamacpp-tools/bin)."""
    import os
    import subprocess

    from refengine.cli import main
    from refengine.compare import run_compare
    from reportcheck import check_report
    root = os.path.join(os.path.dirname(__file__), "..")
    bin_dir = os.environ.get("REFENGINE_LLAMACPP_BIN", os.path.join(root, "build", "llamacpp-tools", "bin"))
    tools = {t: os.path.join(bin_dir, t) for t in ("test-llama-archs", "llama-quantize")}
    if not all(os.access(p, os.X_OK) for p in tools.values()):
        pytest.skip(f"llama.cpp's test-llama-archs / llama-quantize are not built in {bin_dir}")
    subprocess.run([tools["test-llama-archs"], "-a", "^glm5-next$", "-s", str(WRITER_SEED), "-o", str(tmp_path)],
                   check=True, capture_output=True)
    path = str(tmp_path / "glm5-next-moe.gguf")
    if WRITER_QUANT[ftype] is not None:
        out = str(tmp_path / f"glm5-next-moe.{ftype}.gguf")
        subprocess.run([tools["llama-quantize"], *WRITER_QUANT[ftype], path, out, ftype], check=True,
                       capture_output=True)
        path = out
    assert main(["lint", path]) == 0
    assert "would refuse" not in capsys.readouterr().out
    m = Model(path)
    assert [s.attn for s in m.cfg.layers] == ["dsa", "kda"]
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, m.cfg.n_vocab, 64)]
    if ftype == "F32":
        check_report(run_compare(path, tokens), 1e-8)
        return
    from refengine.flips import prove_flips
    proof = prove_flips(m, tokens)
    assert proof.outcome == WRITER_OUTCOME[ftype], proof.summary()
    if proof.outcome == "pass":
        check_report(run_compare(path, tokens, mode="llamacpp"), 1e-7)


# measured (64 tokens): Q4_K_M logits 4e-14; MXFP4_MOE logits 8.9e-8 but ffn_moe_down-1 3.9e-7: ffn_swiglu-0 forced
# (1 Q8_0 block scale of the dense block's down input), 4.2e-14 after
WRITER_OUTCOME = {"Q4_K_M": "pass", "MXFP4_MOE": "proven-flip"}


# ---------------------------------------------------------------- the real-size preset

def test_flash_preset_is_the_published_size():
    """glm-5.3-flash plans 313B parameters, 16.7B active per token: with its one MTP block (an MLA MoE block, not
    written: llama.cpp does not run it) the published 320B, and about the published 18B active (the MTP block's and
    the vision tower's active parts are not in the trunk). `layers=3` keeps one block of each kind."""
    from refengine.synth import plan_tensors, resolve_preset
    p = resolve_preset("glm5-next", "glm-5.3-flash")
    plan = plan_tensors("glm5-next", p)
    size = {t.name: int(np.prod(t.shape, dtype=np.int64)) for t in plan}
    total = sum(size.values())
    experts = sum(n for name, n in size.items() if "_exps." in name)
    active = total - experts * (1 - 8 / 288) - size["token_embd.weight"]
    mtp = sum(n for name, n in size.items() if name.startswith("blk.3."))           # an MLA MoE block
    assert abs((total + mtp) / 320e9 - 1) < 0.01 and abs(active / 18e9 - 1) < 0.08, (total, mtp, active)
    cut = resolve_preset("glm5-next", "glm-5.3-flash", layers=3)
    assert cut["mla_layers"] == (1,) and cut["n_dense_lead"] == 1
    shapes = {t.name: t.shape for t in plan_tensors("glm5-next", cut)}
    assert shapes["blk.0.ffn_gate.weight"] == (12288, 4096) and shapes["blk.0.attn_q.weight"] == (64 * 128, 4096)
    assert shapes["blk.1.attn_q_b.weight"] == (64 * 256, 1536) and shapes["blk.1.attn_k_b.weight"] == (64, 512, 256)
    assert shapes["blk.1.indexer_compressor_ape.weight"] == (16, 128)
    assert shapes["blk.1.indexer.attn_q_b.weight"] == (32 * 128, 1536)
    assert shapes["blk.2.ffn_gate_exps.weight"] == (288, 2048, 4096) and "blk.2.ssm_g_b.weight" in shapes
    assert shapes["blk.2.hc_attn_fn.weight"] == (24, 4 * 4096)
