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


def _run(m, schedule, rule, form=None, fixed=False):
    st = m.new_state(form)
    rt = Runtime(qsa_rule=rule, fixed_shapes=fixed)
    out, i = [], 0
    for n in schedule:
        out.append(m.forward(TOKENS[i:i + n], st, rt))
        i += n
    return np.concatenate(out)


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("rule", qsa.RULES)
def test_decode_in_pieces_equals_one_prefill(synth_model, rule, fixed):
    """Calls of 1..9 tokens through the carried state (KV, raw indexer keys, conv tails, delta state, n-gram token
    and conv history) == one prefill of 30, under either QSA rule, and with fixed shapes (the capacity's blocks and
    cells): only float summation order differs."""
    m = Model(synth_model("qwen4exp"))
    full = _run(m, [len(TOKENS)], rule)
    step = _run(m, SCHEDULE, rule, fixed=fixed)
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


@pytest.mark.parametrize("S, T, top_k, r", [(30, 30, 8, 4), (64, 5, 12, 8), (40, 1, 64, 4)])
def test_llamacpp_rule_as_arrays_equals_the_lists(S, T, top_k, r):
    """`select_llamacpp_rows` (the form every run takes: the heap per row in `ggml_top_k_rows`, a kernel on a GPU)
    keeps the cells `select_llamacpp` keeps, in ascending order, and its mask is `sparse_mask`'s; on scores with
    exact ties between blocks (which cells of a tied block the heap keeps is the rule's point); a budget over the
    context (every visible cell)."""
    qc = qsa.QSAConfig(n_head=2, head_dim=8, top_k=top_k, ratio=r)
    rng = np.random.default_rng(S + T)
    pos = np.arange(S - T, S)
    scores = rng.choice(np.array([0.0, 0.5, 2.0], np.float32), size=(T, S // r + 1))
    cells = qsa.cell_values(scores, pos, S, r)
    want = qsa.select_llamacpp(cells, qc)
    idx, live, mask = qsa.select_llamacpp_rows(cells, pos, qc)
    assert idx.shape == live.shape == (T, min(S, top_k + r - 1))
    for t in range(T):
        assert list(idx[t][live[t]]) == list(want[t]), t
    np.testing.assert_array_equal(mask, qsa.sparse_mask(want, pos, S).mask)


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


# ---------------------------------------------------------------- the authors' indexer (transformers 5.23)

@pytest.mark.transformers
def test_authors_rule_matches_the_authors_indexer(synth_model):
    """transformers' own `Qwen4ExpTextQSAIndexer`, given each QSA layer's input and the file's indexer weights
    (norms zero-centred: GGUF 1 + w), selects per query the same tokens as `select_authors` (30 tokens, blocks
    dropped from query 11 on), except where two blocks' scores tie exactly (relu'd to 0 in every head: both rules
    then choose by their own order; counted, and none in this file)."""
    from second_oracle import import_transformers
    torch, _ = import_transformers()
    from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
    from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpTextQSAIndexer
    import quant
    from refengine.ops.rope import context_rope
    m = Model(synth_model("qwen4exp"))
    tr = Trace()
    m.forward(TOKENS, rt=Runtime(trace=tr))                              # the authors' rule (default)
    T = len(TOKENS)
    cos, sin = context_rope(m.cfg, np.arange(T))                        # [T, R/2]: NEOX = rotate_half layout
    pe = tuple(torch.from_numpy(np.concatenate([a, a], -1)[None].astype(np.float32)) for a in (cos, sin))
    mask = torch.from_numpy(np.tril(np.ones((T, T), bool))[None, None])
    checked = 0
    for il, spec in enumerate(m.cfg.layers):
        if spec.attn != "qsa":
            continue
        qc, w = spec.attn_cfg, m.layer(il)
        cfg = Qwen4ExpTextConfig(hidden_size=m.cfg.n_embd, num_hidden_layers=m.cfg.n_layer, head_dim=m.cfg.head_dim_k,
                                 rms_norm_eps=m.cfg.rms_eps, indexer_n_heads=qc.n_head, indexer_kv_heads=1,
                                 indexer_head_dim=qc.head_dim, indexer_budget=qc.top_k,
                                 indexer_compress_ratio=qc.ratio,
                                 rope_parameters={"rope_type": "default", "rope_theta": m.cfg.rope_freq_base,
                                                  "partial_rotary_factor": m.cfg.n_rot / m.cfg.head_dim_k})
        idx = Qwen4ExpTextQSAIndexer(cfg, il)
        with torch.no_grad():
            idx.index_qk_proj.weight.copy_(torch.from_numpy(np.concatenate(
                [quant.dequantize(w.indexer_q_proj), quant.dequantize(w.indexer_k_proj)])))
            idx.q_layernorm.weight.copy_(torch.from_numpy(w.indexer_q_norm - 1))
            idx.k_layernorm.weight.copy_(torch.from_numpy(w.indexer_k_norm - 1))
            h = torch.from_numpy(tr.earlier["hc_mixed-" + str(il)][0][None])    # the attention side's mixer output
            theirs = idx(h, pe, mask, None)[0, 0].numpy()                         # [T, S] bool
        ours = np.zeros((T, T), bool)
        for t, row in enumerate(tr[f"indexer_top_k-{il}"]):
            ours[t, row[row >= 0]] = True
        assert ours.sum(1)[11:].max() < T and theirs.sum() == ours.sum()        # sparse, the same sizes
        assert np.array_equal(ours, theirs), [t for t in range(T) if not np.array_equal(ours[t], theirs[t])]
        checked += 1
    assert checked == 2


# ---------------------------------------------------------------- the real-size n-gram table

_TABLE_RUN = r"""
import os, sys, numpy as np
from refengine import Model, Runtime
from refengine.cache import NGramState
from refengine.embed import ngram
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20   # MiB now
m = Model(sys.argv[1])
nc, tab = m.cfg.ngram, m.g.per_layer_token_embd
rng = np.random.default_rng(0)
tokens = rng.integers(0, m.cfg.n_vocab, 512)
tokens[::37] = nc.eos                                              # resets inside
st, rt = NGramState(), Runtime()
before = rss()
embs = [ngram.embed(tokens[i:i + 64], st, tab, nc, rt) for i in range(0, 512, 64)]
lookups = rss() - before                                           # what 512 tokens x 16 rows cost
rows = ngram.hash_rows(ngram.contexts(tokens, np.zeros(0, np.int64), nc), nc)
w = m.layer(nc.layer)
R = rng.standard_normal((64, m.cfg.hc, m.cfg.n_embd)).astype(np.float32)
out = ngram.ple_block(R, embs[0], w, nc, NGramState(), eps=m.cfg.rms_eps, rt=rt, il=nc.layer)
assert np.isfinite(out).all()
# peak RSS of this process's own memory: VmHWM (ru_maxrss would also count the forked parent's pages: Linux keeps
# the pre-exec high-water mark, i.e. the test worker's RSS at fork time)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")) // 1024
print(tab.shape[0], tab.shape[1], int(rows.min()), int(rows.max()), lookups, hwm)
"""


@pytest.mark.slow
def test_real_size_ngram_table_costs_only_the_rows_read(tmp_path):
    """The published preset's n-gram table (16 heads x 160, 320M rows: 51.2B parameters, 191 GiB of F32) written
    as a hole of a sparse file, opened and used (512 tokens hashed and looked up, the PLE block of layer 0 run)
    in a fresh process: the 8192 row reads add under 64 MiB, peak RSS (the PLE layer's F32 matrices included) under
    1 GiB, the rows read spread over the whole table. Vocabulary and experts
    cut (layers=1, n_vocab 4096, 2 experts) so the rest of the file is small."""
    import os
    import subprocess
    import sys
    from refengine.synth import write_synth
    path = write_synth("qwen4exp", tmp_path / "big.gguf", preset="qwen3.8-flash-next", layers=1,
                       overrides={"n_vocab": 4096, "n_expert": 2, "n_expert_used": 2})
    st = os.stat(path)
    assert st.st_size > 190 * 2**30 and st.st_blocks * 512 < 2**30              # apparent 191 GiB, on disk < 1
    out = subprocess.run([sys.executable, "-c", _TABLE_RUN, str(path)], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows, width, lo, hi, lookups, rss_mib = (int(x) for x in out.stdout.split())
    print(f"\n  n-gram table {rows} x {width} ({rows * width / 1e9:.1f}B parameters): rows read {lo}..{hi}, "
          f"RSS growth of the lookups {lookups} MiB, peak RSS {rss_mib} MiB")
    assert rows * width > 51e9 and hi > rows // 2 and lookups < 64 and rss_mib < 1024
