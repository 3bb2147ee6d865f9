"""qwen4exp's own mechanisms: QSA's two selection rules, the n-gram hash, decode == prefill across QSA blocks and
n-gram resets (both rules), and the same schedule against llama.cpp's decode."""
import numpy as np
import pytest

from refengine import Model, Runtime, Trace
from refengine.attention import qsa
from refengine.compare import metrics
from refengine.embed import ngram

EOS = 3                                   # the tiny preset's ple.eos_token_id
# 30 tokens, EOS at 7 and 20 (the hash resets inside the prefill and inside the decoded part)
TOKENS = [7, 200, 13, 55, 1, 99, 144, 3, 250, 31, 8, 77, 19, 64, 128, 2, 240, 11, 90, 17, 3, 5, 201, 160, 42, 9,
          118, 77, 230, 4]
# prefill 9, then calls of 1..5 tokens: QSA blocks (r = 4) complete inside and across calls
SCHEDULE = [9, 1, 1, 1, 4, 1, 3, 5, 1, 2, 2]


def _run(m, schedule, rule, form=None):
    st = m.new_state(form)
    rt = Runtime(qsa_rule=rule)
    out, i = [], 0
    for n in schedule:
        out.append(m.forward(TOKENS[i:i + n], st, rt))
        i += n
    return np.concatenate(out)


@pytest.mark.parametrize("rule", qsa.RULES)
def test_decode_in_pieces_equals_one_prefill(synth_model, rule):
    """Calls of 1..9 tokens through the carried state (KV, raw indexer keys, conv tails, delta state, n-gram token
    and conv history) == one prefill of 30, under either QSA rule: only float summation order differs."""
    m = Model(synth_model("qwen4exp"))
    full = _run(m, [len(TOKENS)], rule)
    step = _run(m, SCHEDULE, rule)
    nmse, max_abs, _ = metrics(full, step)
    assert nmse <= 1e-10, (rule, nmse, max_abs)
    assert np.array_equal(full.argmax(-1), step.argmax(-1))


@pytest.mark.oracle
def test_decode_in_pieces_matches_llamacpp(synth_model):
    """The same schedule in llama.cpp (its caches: KV, idx, conv rows, PLE conv row, token cells): NMSE <= 1e-8."""
    from refengine.oracle import run_llamacpp
    path = synth_model("qwen4exp")
    ref = run_llamacpp(path, TOKENS, chunks=SCHEDULE, trace=False).logits
    got = _run(Model(path), SCHEDULE, "llamacpp")
    assert metrics(ref, got)[0] <= 1e-8


# ---------------------------------------------------------------- QSA selection

def test_ggml_top_k_is_the_top_k_set():
    """Distinct values: the replayed heap-select keeps exactly the k largest (any k, any length)."""
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 30, 64):
        v = rng.standard_normal(n).astype(np.float32)
        for k in range(1, n + 1):
            assert set(qsa.ggml_top_k(v, k)) == set(np.argsort(-v)[:k])


def test_budget_over_the_context_is_dense(synth_model):
    """A budget of at least the context selects every visible cell under both rules: the logits of dense attention
    (compress_ratios 0: the same layers without an indexer)."""
    from gguf_edit import GGUFValueType, rewrite
    big = synth_model("qwen4exp", overrides={"idx_top_k": 64})
    dense = rewrite(big, big.replace(".gguf", "-dense.gguf"), drop_keys=["qwen4exp.attention.compress_ratios"],
                    set_keys={"qwen4exp.attention.compress_ratios": ([0, 0, 0, 0], GGUFValueType.ARRAY,
                                                                     GGUFValueType.UINT32)})
    ref = Model(dense).forward(TOKENS)
    for rule in qsa.RULES:
        got = Model(big).forward(TOKENS, rt=Runtime(qsa_rule=rule))
        assert metrics(ref, got)[0] <= 1e-12, rule


def rule_differences(path):
    """Per QSA layer, from one set of scores (the llama.cpp-rule run's, so both rules see the same numbers): the
    queries whose selections differ, with how many cells each keeps and the blocks llama.cpp keeps in part."""
    m = Model(path)
    tr = Trace()
    m.forward(TOKENS, rt=Runtime(trace=tr, qsa_rule="llamacpp"))
    rows = []
    for il, spec in enumerate(m.cfg.layers):
        if spec.attn != "qsa":
            continue
        qc, r = spec.attn_cfg, spec.attn_cfg.ratio
        cells = tr[f"indexer_score_tokens-{il}"]
        scores = tr[f"indexer_score-{il}"]
        pos = np.arange(len(TOKENS))
        auth = qsa.select_authors(scores, pos, len(TOKENS), qc)
        ours = qsa.select_llamacpp(cells, qc)
        for t in range(len(TOKENS)):
            a, b = set(auth[t].tolist()), set(ours[t].tolist())
            if a != b:
                partial = sorted({j // r for j in b - a})
                # a missing cell's block ties (exactly) with a block llama.cpp took instead
                tie = all(any(scores[t, j // r] == scores[t, k // r] for k in b - a) for j in a - b)
                rows.append(dict(layer=il, query=t, authors=len(a), llamacpp=len(b), extra=sorted(b - a),
                                 missing=sorted(a - b), partial_blocks=partial, tail=(t + 1) % r, tie=tie))
    return rows


def test_where_the_two_rules_differ(synth_model, capsys):
    """The tiny preset (r = 4, budget 8 tokens = 2 blocks), 30 tokens, both rules on the same scores: they agree
    while every block fits (queries 0..10); past that a query with a 3-token tail (pos % 4 == 2) gets the same set
    from both, and with a tail of 0, 1, 2 tokens llama.cpp sees 3, 2, 1 cells of one more block (spilled). The only
    cells the authors keep and llama.cpp does not are exact ties: blocks whose score is 0 (every indexer head's dot
    product negative, relu'd to 0), which the authors' rule takes whole (here: the earlier block) and
    `std::partial_sort` mixes (layer 3, query 13: blocks 0 and 1 both 0)."""
    rows = rule_differences(synth_model("qwen4exp"))
    with capsys.disabled():
        print("\n  QSA rules, tiny preset, 30 tokens (layer, query: authors / llama.cpp cells, llama.cpp's extra cells)")
        for x in rows:
            print(f"    layer {x['layer']} query {x['query']:2d}: {x['authors']:2d} / {x['llamacpp']:2d}  "
                  f"extra {x['extra']}")
    assert rows
    for x in rows:
        assert x["query"] >= 11 and x["authors"] == 8 + x["tail"] and x["llamacpp"] == 11
        assert x["tie"] and len(x["extra"]) - len(x["missing"]) == 3 - x["tail"]
    assert [(x["layer"], x["query"]) for x in rows if x["missing"]] == [(3, 13)]
    per_layer = {il: sum(1 for x in rows if x["layer"] == il) for il in (1, 3)}
    assert per_layer == {1: 15, 3: 15}
    # the spilled cells are the ones std::partial_sort leaves, not the block's first ones: the heap replay matters
    assert any(x["extra"] != list(range(x["extra"][0] // 4 * 4, x["extra"][0] // 4 * 4 + len(x["extra"])))
               for x in rows)


# ---------------------------------------------------------------- the n-gram hash

def _cfg():
    return ngram.NGramConfig(layer=0, n=3, heads_per_ngram=2, conv_kernel=4, eos=EOS, head_dim=4,
                             multipliers=(2**61 + 1, 2**62 + 3, 2**60 + 5), offsets=(0, 7, 20, 31),
                             vocab_sizes=(7, 13, 11, 5))


def test_contexts_reset_at_eos_and_the_start():
    nc = _cfg()
    ctx = ngram.contexts(np.array([5, 6, EOS, 8, 9]), np.zeros(0, np.int64), nc)
    assert ctx.tolist() == [[5, EOS, EOS], [6, 5, EOS], [EOS, 6, 5], [8, EOS, EOS], [9, 8, EOS]]
    # a later call reads its predecessors from the carried history: the same rows as one call
    one = ngram.contexts(np.array([5, 6, EOS, 8, 9]), np.zeros(0, np.int64), nc)
    two = ngram.contexts(np.array([8, 9]), np.array([6, EOS]), nc)
    assert np.array_equal(one[3:], two)


def test_hash_is_uint64_wrapping():
    """rows = (XOR_j ctx[j] * mult[j] mod 2^64) % vocab[h] + offset[h], checked with Python integers."""
    nc = _cfg()
    ctx = np.array([[250, 17, EOS], [3, 255, 254]], np.int64)
    rows = ngram.hash_rows(ctx, nc)
    for i, c in enumerate(ctx.tolist()):
        for n in (2, 3):
            mixed = 0
            for j in range(n):
                mixed ^= (c[j] * nc.multipliers[j]) % 2**64
            for g in range(2):
                h = (n - 2) * 2 + g
                assert rows[i, h] == mixed % nc.vocab_sizes[h] + nc.offsets[h]
