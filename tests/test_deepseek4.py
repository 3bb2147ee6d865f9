"""DeepSeek-V4's own mechanisms, each against a second statement of it, then the carried state across every
ratio's block boundary (refengine alone, and llama.cpp's own prefill-then-decode schedule).

The whole model against llama.cpp tensor by tensor is tests/test_vs_llamacpp.py's F32_CASES (200 tokens).
"""
import numpy as np
import pytest

from refengine import Model, Runtime, Trace
from refengine.attention import csa_indexer, kv_compressor
from refengine.attention.compressed_kv import window_mask
from refengine.cache import BlockFill, PooledBlocks
from refengine.compare import metrics
from refengine.ops.activations import silu, swiglu_clamp
from refengine.residual import hyper_connections as mhc


def test_sinkhorn_is_doubly_stochastic():
    """From random logits: the columns (normalized last) sum to 1; the rows approach 1 as iterations grow (20,
    the published count: within 1e-2 for logits of spread 3; 200: within 1e-5)."""
    logits = np.random.default_rng(0).standard_normal((5, 4, 4)).astype(np.float32) * 3
    for iters, tol in ((20, 1e-2), (200, 1e-5)):
        c = mhc.sinkhorn(logits, iters, 1e-6)
        assert np.all(c > 0)
        np.testing.assert_allclose(c.sum(axis=1), 1.0, atol=1e-5)        # over src
        np.testing.assert_allclose(c.sum(axis=2), 1.0, atol=tol)         # over dst


def test_hc_post_and_collapse_by_hand():
    """hc_post with C = I and post = 0 leaves the streams; collapse with one-hot weights picks a stream; and
    hc_post's write-back equals its einsum statement."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((3, 4, 8)).astype(np.float32)
    y = rng.standard_normal((3, 8)).astype(np.float32)
    eye = np.broadcast_to(np.eye(4, dtype=np.float32), (3, 4, 4))
    np.testing.assert_array_equal(mhc.hc_post(y, X, np.zeros((3, 4), np.float32), eye), X)
    np.testing.assert_array_equal(mhc.collapse(X, np.eye(4, dtype=np.float32)[[2, 2, 2]]), X[:, 2])
    post = rng.random((3, 4)).astype(np.float32)
    comb = rng.random((3, 4, 4)).astype(np.float32)
    want = post[:, :, None] * y[:, None] + np.einsum("tsk,tsd->tkd", comb, X)
    np.testing.assert_allclose(mhc.hc_post(y, X, post, comb), want, rtol=1e-5, atol=1e-6)


def test_overlapping_pool_by_hand():
    """Block b of the ratio-4 compressor: per dim, softmax over the previous block's 4 rows (first half of the
    columns) and this block's 4 rows (second half); block 0 has no previous rows."""
    rng = np.random.default_rng(2)
    K = 6
    kv, sc = (rng.standard_normal((12, 2 * K)).astype(np.float32) for _ in range(2))
    got = kv_compressor.pool_blocks(kv, sc, 0, [0, 1, 2], 4)                   # [3, K]
    for b in range(3):
        rows_v = np.concatenate([kv[4 * b - 4:4 * b, :K] if b else np.zeros((0, K)), kv[4 * b:4 * b + 4, K:]])
        rows_s = np.concatenate([sc[4 * b - 4:4 * b, :K] if b else np.zeros((0, K)), sc[4 * b:4 * b + 4, K:]])
        p = np.exp(rows_s - rows_s.max(0)) / np.exp(rows_s - rows_s.max(0)).sum(0)
        np.testing.assert_allclose(got[b], (p * rows_v).sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ratio, start, blocks", [(4, 0, [0, 1, 2, 3]), (4, 4, [2, 3, 4]), (128, 0, [0, 1]),
                                                  (128, 128, [1, 2, 3])])
def test_blocks_pooled_together_equal_one_by_one(ratio, start, blocks):
    """`pool_blocks` pools a call's finished blocks in one [n, K, rows] softmax and sum (a prefill's 128 CSA blocks
    were 128 launches each of several ops on a GPU): bit for bit what it gives pooling them one at a time."""
    c = 2 if ratio == 4 else 1
    K = 8
    rng = np.random.default_rng(ratio + start)
    rows = (blocks[-1] + 1) * ratio - start
    kv, sc = (rng.standard_normal((rows, c * K)).astype(np.float32) for _ in range(2))
    got = kv_compressor.pool_blocks(kv, sc, start, blocks, ratio)
    one = np.concatenate([kv_compressor.pool_blocks(kv, sc, start, [b], ratio) for b in blocks])
    np.testing.assert_array_equal(got, one)


@pytest.mark.parametrize("ratio", [4, 128])
def test_compressor_in_chunks_equals_one_call(ratio):
    """The block being filled carried between calls: any split of the positions pools the same blocks."""
    class Rt:                                    # the projections are the identity: h is already [T, c*K]
        def matmul(self, x, w):
            return x

        def matmul_many(self, x, ws):
            return [x for _ in ws]

        def record(self, *a):
            pass
    c = 2 if ratio == 4 else 1
    K, T = 8, 2 * ratio + 3
    rng = np.random.default_rng(3)
    h = rng.standard_normal((T, c * K)).astype(np.float32)
    ape = 0.1 * rng.standard_normal((ratio, c * K)).astype(np.float32)
    norm = np.ones(K, np.float32)
    rope = lambda x, p: x                                                      # noqa: E731

    def run(splits):
        fill, blocks, at = BlockFill(), PooledBlocks(), 0
        for n in splits:
            out = kv_compressor.compress(h[at:at + n], None, None, ape, norm, pos=np.arange(at, at + n), fill=fill,
                                         blocks=blocks, ratio=ratio, eps=1e-6, rope=rope, rt=Rt(), name="t", il=0)
            at += n
            assert fill.kv.shape[0] <= (2 if c == 2 else 1) * ratio            # only the rows still needed
        return out
    whole = run([T])
    assert whole.shape == (2, K)
    for splits in ([1] * T, [ratio - 1, 2, ratio, T - 2 * ratio - 1], [ratio + 1, T - ratio - 1]):
        np.testing.assert_array_equal(run(splits), whole)


def test_hadamard_is_ggmls_orthonormal_rotation():
    """Sylvester's order scaled by 1/sqrt(n): symmetric, H @ H = I, so q.k is unchanged by rotating both."""
    for n in (64, 128):
        h = csa_indexer.hadamard(n)
        np.testing.assert_allclose(h @ h, np.eye(n), atol=1e-6)
        assert h[0, 0] > 0 and np.array_equal(h, h.T)
        assert np.all(np.abs(np.abs(h) - 1 / np.sqrt(n)) < 1e-7)
    x, y = np.random.default_rng(4).standard_normal((2, 5, 64)).astype(np.float32)
    np.testing.assert_allclose(np.sum(csa_indexer.rotate(x) * csa_indexer.rotate(y), -1), np.sum(x * y, -1),
                               rtol=1e-5, atol=1e-5)


def test_swiglu_clamp_clamps_the_gate_before_silu():
    g = np.array([-30.0, -1.0, 0.5, 3.0, 12.0], np.float32)
    u = np.array([2.0, -5.0, 0.5, 9.0, -0.2], np.float32)
    L = 2.0
    np.testing.assert_allclose(swiglu_clamp(g, u, L), silu(np.minimum(g, L)) * np.clip(u, -L, L), rtol=1e-6)
    assert swiglu_clamp(g, u, L)[3] == pytest.approx(float(silu(np.float32(2.0)) * 2.0), rel=1e-6)


def test_window_mask():
    m = window_mask(np.array([5, 6]), np.arange(7), 3)
    assert m.tolist() == [[False, False, False, True, True, True, False], [False] * 4 + [True] * 3]


# ---------------------------------------------------------------- the model's state

N = 140          # past the ratio-128 block (position 127), 35 ratio-4 blocks, a 16-token window


def _tokens(n=N):
    return [int(t) for t in np.random.default_rng(27).integers(0, 256, n)]


def _schedule(m, tokens, chunks):
    state = m.new_state()
    out, at = [], 0
    for n in chunks:
        out.append(m.forward(tokens[at:at + n], state))
        at += n
    return np.concatenate(out), state


# prefill then one-token decodes over the ratio-128 boundary (127 -> 128) and several ratio-4 ones; chunks that
# start and end inside blocks
SCHEDULES = [[125] + [1] * 7 + [8], [3, 70, 1, 55, 2, 9], [64, 64, 12]]


@pytest.mark.parametrize("chunks", SCHEDULES, ids=["decode-past-128", "ragged", "halves"])
def test_decode_equals_prefill_across_block_boundaries(synth_model, chunks):
    m = Model(synth_model("deepseek4"))
    toks = _tokens()
    full = m.forward(toks)
    got, state = _schedule(m, toks, chunks)
    nmse, max_abs, _ = metrics(full, got)
    assert nmse <= 1e-10, (nmse, max_abs)
    assert np.array_equal(full.argmax(-1), got.argmax(-1))
    # the state holds what later tokens can still see: the window, and per compressor its pooled blocks and at
    # most the rows of the block being filled (and the one before it, ratio 4)
    sw, s4, s128 = state.layers
    assert sw.window.n == 16 and sw.blocks is None and sw.fill is None
    assert s4.blocks.n == N // 4 and s4.index_keys.n == N // 4 and s4.fill.kv.shape[0] <= 8
    assert s128.blocks.n == N // 128 and s128.fill.kv.shape[0] == N % 128
    assert state.nbytes() > 0


def test_indexer_budget_over_the_blocks_keeps_every_visible_block(synth_model):
    """top-k larger than the number of ratio-4 blocks: the CSA layer attends every finished block (as HCA does)."""
    m = Model(synth_model("deepseek4", overrides={"idx_top_k": 64}))
    tr = Trace()
    m.forward(_tokens(100), rt=Runtime(trace=tr))
    vis = csa_indexer.visible_blocks(np.arange(100), 25, 4)
    np.testing.assert_array_equal(tr["csa_top_k_mask-1"], np.where(vis, 0.0, -np.inf))


@pytest.mark.oracle
def test_prefill_then_decode_matches_llamacpp(synth_model):
    """llama.cpp's own carried state (raw window, compressor states, pooled caches) on the same schedule."""
    from refengine.oracle import run_llamacpp
    path = synth_model("deepseek4")
    toks, chunks = _tokens(), SCHEDULES[0]
    ref = run_llamacpp(path, toks, chunks=chunks, trace=False).logits
    got, _ = _schedule(Model(path), toks, chunks)
    nmse = metrics(ref, got)[0]
    assert nmse <= 1e-8, f"logits NMSE {nmse:.2e}"
    assert np.array_equal(ref.argmax(-1), got.argmax(-1))


# ---------------------------------------------------------------- the real-size preset

def test_v4_flash_preset_is_the_published_size():
    """deepseek-v4-flash plans 284B parameters, 13B active per token (the published 284B / 13B: the trunk without
    its MTP block); `layers=3` keeps one block of each ratio, the first two hash-routed as they were."""
    from refengine.synth import plan_tensors, resolve_preset
    p = resolve_preset("deepseek4", "deepseek-v4-flash")
    plan = plan_tensors("deepseek4", p)
    size = {t.name: int(np.prod(t.shape, dtype=np.int64)) for t in plan}
    total = sum(size.values())
    experts = sum(n for name, n in size.items() if "_exps." in name)
    active = total - experts * (1 - 6 / 256) - size["token_embd.weight"]
    assert abs(total / 284e9 - 1) < 0.01 and abs(active / 13e9 - 1) < 0.03, (total, active)
    cut = resolve_preset("deepseek4", "deepseek-v4-flash", layers=3)
    assert cut["compress_ratios"] == [0, 4, 128] and cut["hash_layers"] == 2
    shapes = {t.name: t.shape for t in plan_tensors("deepseek4", cut)}
    assert shapes["blk.1.indexer.attn_q_b.weight"] == (64 * 128, 1024)
    assert shapes["blk.2.attn_compressor_ape.weight"] == (128, 512)
    assert shapes["blk.1.attn_compressor_kv.weight"] == (1024, 4096)
    assert shapes["blk.0.attn_output_a.weight"] == (8 * 1024, 64 * 512 // 8)
    assert shapes["blk.1.ffn_gate_tid2eid.weight"] == (129280, 6) and "blk.2.exp_probs_b.bias" in shapes
    assert shapes["blk.2.ffn_gate_exps.weight"] == (256, 2048, 4096)


@pytest.mark.oracle
@pytest.mark.exhaustive          # a 200-token proof, ~15 s on 2 cores; the 16-token cases run in CI (LLAMACPP_CASES)
def test_published_mix_over_200_tokens_is_a_proven_flip(synth_model):
    """Q8_0 weights, MXFP4 routed experts (the published files' mix), llama.cpp mode, 200 tokens: llama.cpp
    rounds every matmul input to Q8_0, and over a long context a few values sit on a rounding boundary (measured:
    logits NMSE 2.3e-6, 1-2 Q8_0 codes / block scales of attn_derope and attn_wo_a). Teacher-forced from llama.cpp's
    own values of those inputs, every tensor and the logits come within 1e-7 (2.4e-14): a proven flip, not a bug.
    (16 tokens: tests/test_llamacpp_mode.py "deepseek4-Q8_0-experts-MXFP4", a pass.)"""
    from refengine.flips import prove_flips
    experts = {f"ffn_{x}_exps.weight": "MXFP4" for x in ("gate", "up", "down")}
    f32 = {n: "F32" for n in ("hc_attn_fn.weight", "hc_ffn_fn.weight", "output_hc_fn.weight")}
    m = Model(synth_model("deepseek4", wtype="Q8_0", tensor_types={**experts, **f32}))
    proof = prove_flips(m, _tokens(200))
    assert proof.outcome == "proven-flip", proof.summary()


def test_compare_local_is_refused_clearly(synth_model):
    from refengine.compare import run_compare
    from refengine.errors import UnsupportedArchError
    with pytest.raises(UnsupportedArchError, match="hyper-connection streams.*compare without --local"):
        run_compare(synth_model("deepseek4"), [1, 2, 3], local=True)


def test_rope_tail_rotates_only_the_tail_and_inverts():
    """The last R dims rotated (NORM pairs), the rest untouched; rope_back (inverse) undoes it."""
    from refengine.attention.rope_tail import TailRope
    rope = TailRope(n_rot=8, base=160000.0, freq_scale=0.25, ext_factor=1.0, attn_factor=1 / (1 + 0.1 * np.log(4.0)),
                    n_ctx_orig=128, beta_fast=32.0, beta_slow=1.0)
    x = np.random.default_rng(5).standard_normal((6, 2, 16)).astype(np.float32)
    pos = np.arange(100, 106)
    y = rope.apply(x, pos)
    np.testing.assert_array_equal(y[..., :8], x[..., :8])
    assert not np.allclose(y[..., 8:], x[..., 8:])
    back = rope.apply(y, pos, inverse=True)
    # YaRN's magnitude cancelled by attn_factor (|c + i s| ~ 1): the inverse restores x
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)


def test_hash_routing_takes_the_table_and_weighs_by_the_router():
    from refengine.moe.hash_routing import hash_route
    from refengine.moe.router import GATING_SQRT_SOFTPLUS, gate_probs
    rng = np.random.default_rng(6)
    logits = rng.standard_normal((3, 8)).astype(np.float32)
    table = np.array([[1, 5], [0, 7], [2, 3], [6, 4]], np.int32)              # [V, A]
    ids, w = hash_route(logits, table, np.array([3, 0, 3]), norm_w=True, w_scale=1.5)
    assert ids.tolist() == [[6, 4], [1, 5], [6, 4]]
    p = gate_probs(logits, GATING_SQRT_SOFTPLUS)
    want = np.take_along_axis(p, ids, 1)
    np.testing.assert_allclose(w, 1.5 * want / want.sum(1, keepdims=True), rtol=1e-6)


def test_hash_table_routing_outside_the_experts_is_refused_by_name(synth_model, tmp_path):
    """A tid2eid entry >= n_expert would index past ffn_*_exps: a WeightError naming the tensor, not an IndexError."""
    import shutil

    import gguf

    from refengine.errors import WeightError
    path = str(tmp_path / "bad.gguf")
    shutil.copy(synth_model("deepseek4"), path)
    r = gguf.GGUFReader(path, "r+")
    t = next(t for t in r.tensors if t.name.endswith("ffn_gate_tid2eid.weight"))
    t.data[3, 1] = 10_000                         # a writable memmap of the file's bytes
    del r
    with pytest.raises(WeightError, match=r"blk\.\d+\.ffn_gate_tid2eid\.weight: token 3 routes to expert id 10000"):
        Model(path).forward([3, 4])
