"""The GPU expert cache (issue 24) without a GPU: the cache logic, the slot pool remapped into the grouped kernels,
and a whole forward on the "sim" device with routed experts streamed through a budget.

- budgets parse ("8GiB", bytes, fractions); eviction order as each policy says (LRU, LFU with history, decayed
  frequency); a batch's own hits are pinned against its misses; a batch wider than the budget is a clear error
  (ExpertBudgetError naming the budget and the layer) that leaves the cache as it was;
- tiny MoE presets (qwen3moe; deepseek2: shared experts, a dense first layer; every MoE arch and a fused gate_up) run
  resident on the sim device with budgets of 1/4, 1/2 and 1 of the routed-expert bytes: logits bit-identical to the
  unbudgeted run, hits + misses = the batches' distinct experts, bytes moved = misses x slot bytes = what the
  slot pool copied, and a replay of the recorded routing trace reproduces the counters;
- the slot pool as a DeviceWeight of N experts in numba's CUDA simulator: the grouped kernels on slot ids give the
  same bits as on the fully resident tensors (the group tables, the one-token ids path, per-expert scales);
- `refengine run --expert-stats F --gpu-expert-budget B` writes the routing trace and prints the cache's counters.
- prefetch (refengine/expert_prefetch.py): the same budgets with the next MoE layer's guessed experts copied on a
  worker thread give the same logits bit for bit, bytes moved = misses x slot + the prefetched bytes; a slow copy
  is waited for (the logits would differ if it were not), a failing one raises at the lookup that needs it and
  leaves no slot claiming an expert it does not hold; prefetches never take pinned slots, lookups never evict
  loading ones; `run --expert-prefetch` prints the counters.
"""
import numpy as np
import pytest

from refengine.errors import ConfigError, ExpertBudgetError
from refengine.expert_cache import POLICIES, ExpertCache, parse_budget
from refengine.expert_trace import ExpertTrace, replay
from refengine.model import Model
from refengine.runtime import Runtime
from tiers import exhaustive

TOKENS = [3, 17, 101, 5, 250, 42, 7] + list(range(40, 53))


# ------------------------------------------------------------------ the cache logic
def test_parse_budget():
    assert parse_budget("8GiB") == 8 * 2 ** 30 and parse_budget("512 MiB") == 512 * 2 ** 20
    assert parse_budget("3GB") == 3 * 10 ** 9 and parse_budget(123456) == 123456 and parse_budget("77") == 77
    assert parse_budget(0.25, 1000) == 250 and parse_budget("0.5", 1000) == 500 and parse_budget("10%", 1000) == 100
    for bad in ("8 parsecs", "-1", 0, "0%", 1.5, True):
        with pytest.raises(ConfigError):
            parse_budget(bad, 1000)
    with pytest.raises(ConfigError, match="for_model"):
        parse_budget(0.25)                         # a fraction needs the model's expert bytes


def cache(n, policy="lru", **kw):
    """n slots of 10 bytes, every load logged."""
    return ExpertCache(10 * n, 10, policy=policy, log=[], **kw)


def run(c, batches):
    for layer, ids in batches:
        c.lookup(layer, np.asarray(ids).reshape(-1, 1))
        c.release()
    return [(l, e) for l, e, _, _ in c.log], [old for _, _, _, old in c.log if old is not None]


def test_lru_eviction_order():
    c = cache(3)
    loads, evicted = run(c, [(0, 1), (0, 2), (0, 3), (0, 1), (0, 4), (0, 5), (0, 1)])
    assert loads == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5)]
    assert evicted == [(0, 2), (0, 3)]             # 1 was touched before 4 came: 2, then 3 went
    assert c.resident() == [(0, 1), (0, 4), (0, 5)]
    assert (c.hits, c.misses) == (2, 5) and c.bytes_moved == 50


def test_lfu_and_decay_eviction_order():
    seq = [(0, 1)] * 3 + [(0, 2), (0, 3), (0, 4)]
    _, ev = run(cache(3, "lru"), seq)
    assert ev == [(0, 1)]                          # LRU forgets that 1 was used three times
    _, ev = run(cache(3, "lfu"), seq)
    assert ev == [(0, 2)]                          # LFU keeps 1; 2 and 3 tie at one use: the older goes
    # decayed frequency: an old burst fades. 1 used 3 times long ago, 2 and 3 used twice since: at decay 0.5
    # 1's score is 3 * 0.5^4 < 2's and 3's, so 1 goes; LFU would keep it (3 uses > 2)
    seq = [(0, 1)] * 3 + [(0, 2), (0, 3), (0, 2), (0, 3), (0, 4)]
    _, ev = run(cache(3, "decay", decay=0.5), seq)
    assert ev == [(0, 1)]
    _, ev = run(cache(3, "lfu"), seq)
    assert ev == [(0, 2)]
    assert set(POLICIES) == {"lru", "lfu", "decay"}


def test_lfu_counts_survive_eviction():
    c = cache(2, "lfu")
    _, ev = run(c, [(0, 1), (0, 1), (0, 2), (0, 3), (0, 2)])
    assert ev == [(0, 2), (0, 3)]                  # 2 evicted by 3 (1 has more uses), back in with 2 uses: 3 goes
    assert c.resident() == [(0, 1), (0, 2)]


def test_layers_share_the_slots_and_count_apart():
    c = cache(4)
    run(c, [(0, 1), (1, 1), (0, 1), (1, 2), (2, 7)])
    d = c.as_dict()
    assert d["layers"][0]["hits"] == 1 and d["layers"][1]["misses"] == 2 and d["layers"][2]["misses"] == 1
    assert c.resident(1) == [(1, 1), (1, 2)] and d["evictions"] == 0
    run(c, [(3, 0)])                               # a fifth expert: the least recent of all layers goes, (1, 1)
    assert c.log[-1][3] == (1, 1) and c.as_dict()["layers"][3]["evictions"] == 1


def test_a_batch_pins_its_hits():
    c = cache(3)
    run(c, [(0, 1), (0, 2), (0, 3)])
    slots = c.lookup(0, np.array([[1, 4]]))       # 1 is the LRU victim, but this batch uses it: 2 goes instead
    assert c.log[-1][3] == (0, 2) and c.pinned.sum() == 2
    assert slots[0, 0] == c.where[(0, 1)] and slots[0, 1] == c.where[(0, 4)]
    c.release()
    assert not c.pinned.any()


def test_budget_below_a_batch_is_a_clear_error():
    c = cache(3)
    run(c, [(0, 1)])
    before = c.as_dict()
    with pytest.raises(ExpertBudgetError, match=r"expert budget 30 B \(3 slots of 10 B\).*layer 5's 4 active"):
        c.lookup(5, np.array([[1, 2], [3, 4]]))
    assert c.as_dict() == before and c.resident() == [(0, 1)]   # nothing loaded, nothing counted
    c.lookup(0, np.array([[7, 8]]))               # pinned, not released: only one slot left for the next batch
    with pytest.raises(ExpertBudgetError, match="pinned by an unreleased batch"):
        c.lookup(1, np.array([[1, 2]]))


def test_slot_ids_remap_every_pair():
    c = cache(4)
    ids = np.array([[3, 1], [1, 2], [2, 3]])
    slots = c.lookup(0, ids)
    assert slots.shape == ids.shape and slots.dtype == np.int32
    back = {s: e for (_, e), s in c.where.items()}
    assert np.array_equal(np.vectorize(back.get)(slots), ids)
    assert np.array_equal(c.expert_of_slot(0)[slots], ids)


# ------------------------------------------------------------------ a whole forward on the sim device
def forward(m, rt, steps=(5, 9, 11)):
    st = m.new_state()
    out = [m.forward(TOKENS, st, rt=rt)]
    for t in steps:
        out.append(m.forward([t], st, rt=rt))
    return out


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
def test_budgeted_forward_is_bit_identical(synth_model, arch):
    m = Model(synth_model(arch, wtype="Q4_K"), n_ubatch=2)   # 2-token batches: a quarter of the experts is enough
    want = forward(m, Runtime(resident=True))
    for frac in (0.25, 0.5, 1.0):
        c, tr = ExpertCache.for_model(m, frac), ExpertTrace()
        got = forward(m, Runtime(resident=True, expert_budget=c, expert_stats=tr))
        for i, (a, b) in enumerate(zip(want, got)):
            assert np.array_equal(a, b), f"{arch} budget {frac}: call {i} differs"
        d = c.as_dict()
        lookups = sum(np.unique(ids).size for _, ids, _ in tr.calls)
        assert d["hits"] + d["misses"] == lookups and d["misses"] > 0
        assert d["bytes_moved"] == d["misses"] * c.slot_bytes == c.pool.bytes_loaded
        assert c.n_slots == int(frac * c.geometry.expert_bytes) // c.slot_bytes
        assert d["tokens"] == len(TOKENS) + 3 and not c.pinned.any()
        if frac == 1.0:                            # everything fits: only the first use of an expert misses
            assert d["misses"] == len({(il, int(e)) for il, ids, _ in tr.calls for e in np.unique(ids)})
            assert d["evictions"] == 0
        again = ExpertCache.for_model(m, frac)     # the recorded trace replayed: the same counters
        replay(tr, again)
        assert {k: v for k, v in again.as_dict().items() if k != "load_seconds"} == \
               {k: v for k, v in d.items() if k != "load_seconds"}


def moe_archs():
    from refengine.archs import ARCHS
    return [a for a in ARCHS if a != "llama"]


@pytest.mark.parametrize("arch", moe_archs() + ["qwen3next/fused_gate_up"])
def test_every_moe_arch_through_half_the_experts(synth_model, arch):
    """Every arch's routed experts (separate or fused gate/up, SiTU, latent MoE, hash routing) through a budget of
    half their bytes, one token per batch, with and without prefetch: bit-identical to the unbudgeted resident run."""
    arch, _, fused = arch.partition("/")
    m = Model(synth_model(arch, wtype="Q4_K", **({"overrides": {"fused_gate_up": True}} if fused else {})),
              n_ubatch=1)
    want = m.forward(TOKENS[:6], m.new_state(), rt=Runtime(resident=True))
    for prefetch in (False, True):
        c = ExpertCache.for_model(m, 0.5, prefetch=prefetch)
        got = m.forward(TOKENS[:6], m.new_state(), rt=Runtime(resident=True, expert_budget=c))
        assert np.array_equal(want, got) and c.misses > 0 and c.hits + c.misses == sum(
            cl.lookups for cl in c.layers.values()), prefetch
        if prefetch:
            c.prefetcher.close()
            assert c.pool.bytes_loaded == c.bytes_moved == (c.misses + c.prefetches) * c.slot_bytes
            assert not any(hasattr(m.layer(il), "ffn_gate_tid2eid") for il in c.prefetcher.routers)   # hash: never


def test_budgeted_forward_below_one_batch(synth_model):
    m = Model(synth_model("qwen3moe", wtype="Q4_K"))          # 20 tokens in one batch route to every expert
    rt = Runtime(resident=True, expert_budget=ExpertCache.for_model(m, 0.25))
    with pytest.raises(ExpertBudgetError, match="layer 0's 8 active experts for a batch of 20 tokens"):
        m.forward(TOKENS, m.new_state(), rt=rt)


def test_budget_in_bytes_and_on_host(synth_model):
    m = Model(synth_model("qwen3moe", wtype="Q4_K"), n_ubatch=4)
    want = forward(m, Runtime(resident=True), steps=(5,))
    rt = Runtime(resident=True, expert_budget="1MiB")         # slots sized at the first MoE layer
    assert all(np.array_equal(a, b) for a, b in zip(want, forward(m, rt, steps=(5,))))
    assert rt.expert_cache.budget_bytes == 2 ** 20 and rt.expert_cache.misses > 0
    rt = Runtime(resident=True, expert_budget="1MiB")
    later = rt.untraced()                                      # a traced call's later ubatches: the same slots
    m.forward(TOKENS[:4], m.new_state(), rt=later)
    assert rt.expert_cache is later.expert_cache is not None
    with pytest.raises(ConfigError, match="device-resident"):
        Runtime(expert_budget="1MiB")


def test_expert_trace_on_host_backends(synth_model, tmp_path):
    m = Model(synth_model("qwen3moe", wtype="Q4_K"))
    tr = ExpertTrace()
    m.forward(TOKENS, m.new_state(), rt=Runtime(backend="cpu", expert_stats=tr))
    assert tr.layers() == [0, 1] and tr.tokens() == len(TOKENS)
    A = tr.calls[0][1].shape[1]
    assert tr.counts(0).sum() == len(TOKENS) * A and tr.counts(0).shape == (8,)
    tr.save(tmp_path / "r.npz")
    back = ExpertTrace.load(tmp_path / "r.npz")
    assert [(l, e) for l, _, e in back.calls] == [(l, e) for l, _, e in tr.calls]
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(back.calls, tr.calls))


def test_cli_expert_stats(synth_model, tmp_path, capsys):
    from refengine.cli import main
    p = synth_model("qwen3moe", wtype="Q4_K")
    f = tmp_path / "route.npz"
    j = tmp_path / "run.json"
    assert main(["run", str(p), "-n", "3", "--tokens", "1,2,3,4", "--ubatch", "1", "--expert-stats", str(f),
                 "--gpu-expert-budget", "0.5", "--expert-policy", "lfu", "--json", str(j)]) == 0
    err = capsys.readouterr().err
    assert "expert cache lfu" in err and "hit rate" in err
    tr = ExpertTrace.load(f)
    assert tr.tokens() == 4 + 2 and tr.layers() == [0, 1]      # the prompt and the 2 tokens fed after it
    import json
    rec = json.load(open(j))                                    # run --json: the same counters, per layer too
    cache = rec["experts"]["cache"]
    assert rec["resident"] and len(rec["ids"]) == 3 and rec["device"]["calls"] > 0
    assert cache["hits"] + cache["misses"] == sum(c["lookups"] for c in cache["layers"].values()) > 0
    assert rec["experts"]["routing"]["tokens"] == 6
    # the decode line (stdout captured: not a terminal) ends with the cache's figures at the end of the run
    last = err.split("decode:")[-1]
    assert "3/3" in last and f"hit {cache['hit_rate']:.3f}" in last, err


# ------------------------------------------------------------------ the slot pool in the grouped kernels
def toy_experts(monkeypatch, seed: int, T: int):
    """Q8_0 routed experts of a toy layer (E 6, A 2, D = F = 32), T tokens' input and routing weights, and the
    simulator's small kernel shapes: (rng, E, A, D, up, gate, down, x, wts)."""
    from quant import GGMLType
    from quant.cuda import SIM, ops
    from quant.cuda.testdata import random_qtensor
    if SIM:
        monkeypatch.setattr(ops, "GEMV_DEFAULT", (8, 1, 1))
        monkeypatch.setattr(ops, "FAST_DEFAULT", (2, 1))
    rng = np.random.default_rng(seed)
    E, A, D, F = 6, 2, 32, 32
    t = GGMLType.Q8_0
    up, gate = random_qtensor(t, (E, F, D), rng, "up"), random_qtensor(t, (E, F, D), rng, "gate")
    down = random_qtensor(t, (E, D, F), rng, "down")
    x = rng.standard_normal((T, D)).astype(np.float32)
    wts = rng.uniform(0.1, 1.0, (T, A)).astype(np.float32)
    return rng, E, A, D, up, gate, down, x, wts


@pytest.mark.cuda
@pytest.mark.parametrize("T, kernel", [(2, "fast"), (1, "auto"), pytest.param(3, "gemv", marks=exhaustive)])
def test_slot_pool_kernels_bit_identical(T, kernel, monkeypatch):
    """moe_ffn_device on the slot pool's DeviceWeight-shaped views with slot ids == on the resident tensors."""
    pytest.importorskip("numba.cuda")
    pytest.importorskip("quant.cuda")
    from numba import cuda
    from quant.cuda import moe as cmoe
    from quant.cuda.expert_slots import cached_experts
    from quant.cuda.weights import device_weight
    rng, E, A, D, up, gate, down, x, wts = toy_experts(monkeypatch, 24, T)
    ids = np.array([[4, 1], [1, 5], [5, 4]], np.int32)[:T]
    sc = dict(up_scale=rng.uniform(0.5, 2, E).astype(np.float32), gate_scale=None,
              down_scale=rng.uniform(0.5, 2, E).astype(np.float32))

    def run_device(dup, dgate, ddown, tab_ids, n, scales):
        xd = cuda.to_device(x)
        tab_x, tab_p, mpg = cmoe.groups_from_ids(tab_ids, E)        # gmax = min(E, T*A): the model's E
        sc_gu = cuda.to_device(np.concatenate([cmoe.expert_scales(scales["gate_scale"], n),
                                               cmoe.expert_scales(scales["up_scale"], n)]))
        idd = cuda.to_device(tab_ids.reshape(-1)) if T == 1 else None
        return cmoe.moe_ffn_device(xd, cuda.to_device(tab_x), cuda.to_device(tab_p), min(E, T * A), T * A, mpg, A,
                                   cuda.to_device(wts.reshape(-1)), up=dup, gate=dgate, down=ddown, sc_gu=sc_gu,
                                   sc_d=cuda.to_device(cmoe.expert_scales(scales["down_scale"], n)), kernel=kernel,
                                   ids=idd).copy_to_host()

    want = run_device(device_weight(up).ensure(), device_weight(gate).ensure(), device_weight(down).ensure(),
                      ids, E, sc)
    c = ExpertCache(4 * 3 * up.raw[0].size, 3 * up.raw[0].size)   # 4 slots: fewer than E
    cached_experts(c, np.array([[0, 2, 3, 5]], np.int32), dict(up=up, gate=gate, down=down, il=0), host=False)
    c.release()                                    # slots filled, two of them evicted by the batch: real remapping
    slot_ids, kw = cached_experts(c, ids, dict(up=up, gate=gate, down=down, il=0, **sc), host=False)
    assert not np.array_equal(slot_ids, ids)
    got = run_device(kw["up"], kw["gate"], kw["down"], slot_ids, c.n_slots, kw)
    c.release()
    assert np.array_equal(got, want), np.abs(got - want).max()


@pytest.mark.cuda
@pytest.mark.parametrize("T", [1, pytest.param(3, marks=exhaustive)])       # (3 tokens: 38 s in the simulator)
def test_unsummed_slots_sum_to_the_output(T, monkeypatch):
    """moe_ffn_device(summed=False): the weighted slots dn [T*A, D], not combined (a MoE block whose next norm sums
    them, `ops.add_slots_rms_norm`); their sum in slot order (`ops.slot_sum`) is the combined output bit for bit, one
    token's ids (the one-token kernels) and several tokens' tables."""
    pytest.importorskip("numba.cuda")
    pytest.importorskip("quant.cuda")
    from numba import cuda
    from quant.cuda import moe as cmoe
    from quant.cuda.weights import device_weight
    from refengine.ops.norm import slot_sum
    rng, E, A, D, up, gate, down, x, wts = toy_experts(monkeypatch, 25, T)
    ids = np.array([[4, 1], [1, 5], [5, 4]], np.int32)[:T]
    tab_x, tab_p, mpg = cmoe.groups_from_ids(ids, E)
    sc_gu = cuda.to_device(np.ones(2 * E, np.float32))
    dw = {k: device_weight(v).ensure() for k, v in (("up", up), ("gate", gate), ("down", down))}

    def run(summed):
        return cmoe.moe_ffn_device(cuda.to_device(x), cuda.to_device(tab_x), cuda.to_device(tab_p), min(E, T * A),
                                   T * A, mpg, A, cuda.to_device(wts.reshape(-1)), sc_gu=sc_gu,
                                   sc_d=cuda.to_device(np.ones(E, np.float32)), kernel="fast" if T > 1 else "auto",
                                   ids=cuda.to_device(ids.reshape(-1)) if T == 1 else None, summed=summed,
                                   **dw).copy_to_host()
    want, dn = run(True), run(False)
    assert dn.shape == (T * A, D)
    assert np.array_equal(slot_sum(dn.reshape(T, A, D)), want)


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2", "kimi-k3", "deepseek4"])   # SiTU, clamped: act_device
def test_budgeted_cuda_forward_is_bit_identical(synth_model, arch):
    """On the GPU (skipped without one and CuPy): the resident cuda forward with budgets of 1/4, 1/2 and 1 of the
    routed-expert bytes gives the unbudgeted resident run's logits bit for bit (the same kernels on the same bytes):
    only the expert addressing differs."""
    qc = pytest.importorskip("quant.cuda")
    if qc.SIM or not qc.available():
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("cupy")
    m = Model(synth_model(arch, wtype="Q8_0"), n_ubatch=2)
    want = forward(m, Runtime(backend="cuda"))
    for frac in (0.25, 0.5, 1.0):
        c = ExpertCache.for_model(m, frac)
        got = forward(m, Runtime(backend="cuda", expert_budget=c))
        for i, (a, b) in enumerate(zip(want, got)):
            assert np.array_equal(a, b), f"{arch} budget {frac}: call {i} differs by {np.abs(a - b).max()}"
        d = c.as_dict()
        assert d["misses"] > 0 and d["bytes_moved"] == d["misses"] * c.slot_bytes == c.pool.bytes_loaded
        assert c.pool.nbytes <= c.budget_bytes + 3 * 32          # the pool is the budget (plus the kernels' pad)


@pytest.mark.cuda
def test_host_api_through_the_slot_pool(monkeypatch):
    """quant.cuda.moe.moe_ffn(cache=...) (the resident path's fallback for a traced run): the grouped
    kernels unfused on the slot pool, the activation on the host; output and every traced intermediate bit-identical
    to the whole-tensor run."""
    pytest.importorskip("numba.cuda")
    pytest.importorskip("quant.cuda")
    from quant.cuda import moe as cmoe
    from refengine.ops.activations import situ
    rng, E, A, D, up, gate, down, x, wts = toy_experts(monkeypatch, 7, 2)
    ids = np.array([[4, 1], [1, 5]], np.int32)
    kw = dict(up=up, gate=gate, down=down, up_scale=rng.uniform(0.5, 2, E).astype(np.float32),
              act=(lambda g, u: situ(g, u, 1.5, 3.0), "ffn_moe_situ"), il=3)
    rec_w, rec_g = {}, {}
    want = cmoe.moe_ffn(x, ids, wts, record=lambda n, il, v: rec_w.__setitem__(n, v), **kw)
    c = ExpertCache(3 * 3 * up.raw[0].size, 3 * up.raw[0].size)       # 3 slots, for 3 experts
    c.lookup(3, np.array([[0, 2, 3]]))                                 # (no bytes: evicted by the batch below)
    c.release()
    got = cmoe.moe_ffn(x, ids, wts, record=lambda n, il, v: rec_g.__setitem__(n, v), cache=c, **kw)
    assert np.array_equal(got, want) and set(rec_g) == set(rec_w) and "ffn_moe_situ" in rec_g
    for k in rec_w:
        assert np.array_equal(rec_g[k], rec_w[k]), k
    assert c.misses == 3 + 3 and c.pool.bytes_loaded == 3 * c.slot_bytes and not c.pinned.any()


def test_a_failing_loader_leaves_the_cache_consistent():
    c = cache(2)
    run(c, [(0, 1)])

    def boom(slot, expert):
        raise OSError("disk gone")
    with pytest.raises(OSError):
        c.lookup(0, np.array([[1, 2]]), loader=boom)
    assert c.resident() == [(0, 1)] and not c.pinned.any()      # 1 still there, 2 not, nothing pinned
    assert c.lookup(0, np.array([[2]]))[0, 0] in (0, 1)


def test_golden_with_a_budget_is_the_golden_and_keeps_the_counters(synth_model, tmp_path):
    """golden --gpu-expert-budget: the same tensors as without one (sim device), its counters in the manifest."""
    from safetensors.numpy import load_file
    from refengine.expert_cache import ExpertCache
    from refengine.expert_trace import ExpertTrace
    from refengine.golden import make_golden
    from refengine.model import Model
    m = Model(synth_model("qwen3moe", wtype="Q8_0"))
    toks = [1, 2, 3, 4, 5, 6, 7, 8]
    a = make_golden(m.path, toks, tmp_path / "a", model=m)
    kw = dict(expert_budget=ExpertCache.for_model(m, 0.5), expert_stats=ExpertTrace(), resident=True)   # (sim)
    b = make_golden(m.path, toks, tmp_path / "b", model=m, runtime_kw=kw)
    ta, tb = load_file(str(tmp_path / "a" / a["files"]["tensors"])), load_file(str(tmp_path / "b" / b["files"]["tensors"]))
    assert ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)
    cache = b["experts"]["cache"]
    assert cache["hits"] + cache["misses"] > 0 and b["experts"]["routing"]["tokens"] == len(toks)
    assert "experts" not in a


def test_fused_gate_up_halves_are_views_of_the_file(synth_model):
    """A fused ffn_gate_up_exps is split into views of the mapped file (nothing copied up front: a model larger
    than RAM stays mapped), and the CPU grouped product on such a view (the experts 2I rows apart) gives the bits of
    the product on a contiguous copy, reading only the experts a call uses."""
    from quant import QTensor
    from quant.cpu.matmul import grouped_matmul
    from refengine.moe.block import split_gate_up
    m = Model(synth_model("qwen3next", wtype="Q4_K", overrides={"fused_gate_up": True}))
    w = next(m.layer(il) for il in range(m.cfg.n_layer) if getattr(m.layer(il), "ffn_gate_up_exps", None) is not None)
    t = w.ffn_gate_up_exps
    gate, up = split_gate_up(w)
    assert split_gate_up(w)[0] is gate                                   # made once per loaded layer
    E, I, D = gate.shape
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, D)).astype(np.float32)
    seg = np.array([0, 2, 2, 5] + [6] * (E - 3))                         # experts 0, 2 and 3 own rows
    for half, lo in ((gate, 0), (up, I)):
        assert np.shares_memory(half.raw, t.raw) and not half.raw.flags.c_contiguous
        assert np.array_equal(half.raw, np.asarray(t.raw)[:, lo:lo + I])
        copy = QTensor(half.name, half.type, half.shape, np.ascontiguousarray(half.raw))
        for blas_min in (1, 1000):                                       # the BLAS path and the kernel path
            assert np.array_equal(grouped_matmul(x, half, seg, blas_min_tokens=blas_min),
                                  grouped_matmul(x, copy, seg, blas_min_tokens=blas_min))


# ------------------------------------------------------------------ prefetch (refengine/expert_prefetch.py)
def executor():
    from concurrent.futures import ThreadPoolExecutor
    return ThreadPoolExecutor(1)


def consistent(c):
    """Every slot claims only what it holds: key and where agree, a free slot is not loading, nothing pinned."""
    held = {k: s for s, k in enumerate(c.key) if k is not None}
    assert held == c.where
    assert all(c.last[s] == -1 and not c.loading[s] and not c.fetched[s] for s, k in enumerate(c.key) if k is None)
    assert not c.pinned.any()


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
def test_prefetched_forward_is_bit_identical(synth_model, arch):
    """Prefetch moves experts earlier, on another thread, into slots a guess chose: the logits keep every bit; the
    counters add up (bytes moved = misses x slot + what the prefetches copied = what the slot pool copied)."""
    m = Model(synth_model(arch, wtype="Q4_K"), n_ubatch=2)
    want = forward(m, Runtime(resident=True))
    total = 0
    for frac in (0.25, 0.5, 1.0):
        c, tr = ExpertCache.for_model(m, frac, prefetch=True), ExpertTrace()
        got = forward(m, Runtime(resident=True, expert_budget=c, expert_stats=tr))
        for i, (a, b) in enumerate(zip(want, got)):
            assert np.array_equal(a, b), f"{arch} budget {frac}: call {i} differs"
        c.prefetcher.close()
        d, pf = c.as_dict(), c.as_dict()["prefetch"]
        lookups = sum(np.unique(ids).size for _, ids, _ in tr.calls)
        assert d["hits"] + d["misses"] == lookups and d["misses"] > 0
        assert pf["bytes"] == pf["experts"] * c.slot_bytes
        assert d["bytes_moved"] == d["misses"] * c.slot_bytes + pf["bytes"] == c.pool.bytes_loaded
        assert c.pool.loads == d["misses"] + pf["experts"]
        assert 0 <= pf["used"] <= pf["experts"] and not c.loading.any()
        if frac < 1:
            assert pf["experts"] > 0 and pf["used"] > 0, (arch, frac, pf)
        total += pf["experts"]
        consistent(c)
    assert total > 0


def test_a_slow_prefetch_is_waited_for(synth_model, monkeypatch):
    """Copies that take their time (and write their bytes last): every batch that uses a prefetched slot waits for
    it, so the logits are the same bits, and the wait is counted."""
    import time
    from quant.cuda.expert_slots import SlotPool
    m = Model(synth_model("qwen3moe", wtype="Q4_K"), n_ubatch=2)
    want = forward(m, Runtime(resident=True))
    fast = SlotPool.copy

    def slow(self, slot, tensors, expert, stream=0):
        time.sleep(0.03)
        return fast(self, slot, tensors, expert, stream)
    monkeypatch.setattr(SlotPool, "copy", slow)
    c = ExpertCache.for_model(m, 0.5, prefetch=True)
    got = forward(m, Runtime(resident=True, expert_budget=c))
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    c.prefetcher.close()
    assert c.prefetch_used > 0 and c.prefetch_wait_seconds > 0.02 and c.prefetch_seconds >= 0.03 * c.prefetches


def test_a_failing_prefetch_raises_where_it_is_needed():
    c = cache(4)
    run(c, [(0, 1), (0, 2)])

    def boom(slot, expert):
        raise OSError("disk gone")
    with executor() as ex:
        assert c.prefetch(0, [5, 6, 1], boom, ex.submit) == 2         # 1 is resident: not copied again
        assert c.loading.sum() == 2 and c.resident() == [(0, 1), (0, 2), (0, 5), (0, 6)]
        c.lookup(0, np.array([[1, 2]]))                                # needs neither: no wait, no error
        c.release()
        with pytest.raises(OSError, match="disk gone"):
            c.lookup(0, np.array([[5]]))
    consistent(c)
    assert c.resident() == [(0, 1), (0, 2)] and c.prefetch_bytes == 0 and c.bytes_moved == 20
    assert c.lookup(0, np.array([[5]]))[0, 0] in (2, 3) and c.misses == 3     # loaded as a miss now
    c.release()
    consistent(c)


def test_prefetch_and_lookup_keep_off_each_others_slots():
    """A prefetch never takes a pinned slot; a lookup never evicts a slot still loading (it takes another, or
    waits for the copy when it needs the room)."""
    import threading
    c = cache(3)
    with executor() as ex:
        c.lookup(0, np.array([[1, 2, 3]]))                             # every slot pinned by a running batch
        assert c.prefetch(1, [7], lambda s, e: None, ex.submit) == 0
        c.release()
        c.lookup(0, np.array([[1, 2]]))                                # 1 and 2 pinned, 3's slot is not
        assert c.prefetch(1, [7, 8], lambda s, e: None, ex.submit) == 1
        assert c.resident() == [(0, 1), (0, 2), (1, 7)]
        c.release()
        c.wait()
        go = threading.Event()
        assert c.prefetch(1, [9], lambda s, e: go.wait(5) and None, ex.submit) == 1
        s9 = c.where[(1, 9)]
        assert c.key[s9] == (1, 9) and c.loading[s9]                   # the LRU slot (1's) while 9 copies
        c.lookup(0, np.array([[4]]))                                   # a miss: 2's slot, not the loading one
        c.release()
        assert c.loading[s9] and c.where[(1, 9)] == s9 and (0, 2) not in c.where and c.jobs
        threading.Timer(0.1, go.set).start()
        c.lookup(0, np.array([[5, 6, 10]]))                            # needs all three slots: waits for 9's copy
        c.release()
        assert c.prefetch_wait_seconds > 0.05 and not c.loading.any() and not c.jobs
    assert c.prefetches == 2 and c.prefetch_used == 0                  # 7 and 9 were never asked for
    consistent(c)


def test_cli_expert_prefetch(synth_model, tmp_path, capsys):
    import json
    from refengine.cli import main
    p = synth_model("qwen3moe", wtype="Q4_K")
    j = tmp_path / "run.json"
    assert main(["run", str(p), "-n", "4", "--tokens", "1,2,3,4", "--ubatch", "1", "--gpu-expert-budget", "0.5",
                 "--expert-prefetch", "--json", str(j)]) == 0
    err = capsys.readouterr().err
    pf = json.load(open(j))["experts"]["cache"]["prefetch"]
    assert pf["experts"] > 0 and 0 <= pf["used"] <= pf["experts"]
    assert f"prefetched {pf['experts']} experts ({pf['used']} used)" in err and "waited for" in err, err
    assert main(["run", str(p), "-n", "1", "--tokens", "1,2", "--expert-prefetch"]) == 2
    assert "give a budget with --gpu-expert-budget" in capsys.readouterr().err
