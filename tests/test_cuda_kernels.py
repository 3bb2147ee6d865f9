"""quant.cuda kernels against the NumPy oracle (quant.ref), for every type they decode.

Runs on the GPU when there is one, else in numba's CUDA simulator on toy sizes (conftest.py sets
NUMBA_ENABLE_CUDASIM=1 without /dev/nvidia*). Weights are random bytes with finite block scales
(`quant.cuda.testdata`): every bit pattern a decoder can meet. Tolerance: relative RMS <= 1e-5 (float32
sums in another order than NumPy's; the decoders themselves are exact up to one rounding).
Separately, kernels are compiled for sm_90 (`compile_ptx`) in a subprocess without the simulator: one
specialization per kernel family in the default tier, every kernel in the exhaustive tier.

Tiers (tests/tiers.py): in the simulator the default tier keeps every type for the naive / warp GEMV (each
type's decoder) and representative types for the other kernels; the other types are marked `exhaustive`
(`./dev.sh test-all`, and the GPU run, which also uses real sizes).
"""

import numpy as np
import pytest

cuda_mod = pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

from quant import GGMLType, ref  # noqa: E402
from quant.cuda import moe as cmoe  # noqa: E402
from quant.cuda import ops  # noqa: E402
from quant.cuda.decoders import SPECS  # noqa: E402
from quant.cuda.fast import FSPECS  # noqa: E402
from quant.ref import QuantError  # noqa: E402
from quant.cuda.testdata import random_qtensor  # noqa: E402
from numerics import assert_close  # noqa: E402
from tiers import exhaustive, ptx_sm90, tiered  # noqa: E402

pytestmark = pytest.mark.cuda

GPU = not qc.SIM and qc.available()
TOL = 1e-5
TYPES = list(SPECS)
# sizes: a few rows in the simulator (~100 us per weight and token), real tiles on the GPU
O, I = (256, 1024) if GPU else (4, 256)
T_GEMM = 70 if GPU else 33                   # more than one 32-token tile, not a multiple of it
# the simulator runs one Python thread per CUDA thread: a 64-thread tile (same 32-token tiles) keeps it quick
GEMM_SHAPE = None if GPU else dict(BM=16, BN=32, TM=2, TN=4)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def few_threads(monkeypatch):
    """In the simulator: 8 rows and 1 warp per block (fewer Python threads; same code path)."""
    if not GPU:
        monkeypatch.setattr(ops, "GEMV_DEFAULT", (8, 1, 1))
        monkeypatch.setattr(ops, "FAST_DEFAULT", (2, 1))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_gemv_naive_and_warp(t, rng):
    w = random_qtensor(t, (O, I), rng)
    for T in (1, 3):
        x = rng.standard_normal((T, I)).astype(np.float32)
        want = ref.matmul(x, w)
        assert_close(f"{t.name} naive T={T}", ops.matmul(x, w, kernel="naive"), want, TOL)
        assert_close(f"{t.name} gemv T={T}", ops.matmul(x, w, kernel="gemv"), want, TOL)
    if GPU:                                   # every row-group shape the benchmark may pick
        for shape in ((1, 8, 2), (2, 4, 4), (4, 2, 1)):
            assert_close(f"{t.name} gemv {shape}", ops.matmul(x, w, kernel="gemv", shape=shape), want, TOL)


# default-tier types of the per-type matrices below: a 32-block type, a K-quant of each decoder shape, a grid
# i-quant, a code-book nibble type and a float type
KEEP = {GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.IQ2_XXS, GGMLType.MXFP4, GGMLType.F16}


@pytest.mark.parametrize("t", tiered(list(FSPECS), KEEP), ids=lambda t: t.name)
def test_fast_gemv(t, rng):
    """The fast GEMV (unit decoders, 128-bit loads, prmt conversions): 1 token (the one-token kernel), 2
    and 3 (the 2- and 4-token kernel), and 9 (the 8-token kernel, two passes)."""
    w = random_qtensor(t, (O + 1, I), rng)          # an odd row count: a partial group of rows
    shape = None if GPU else (2, 1)
    for T in (1, 2, 3, 9):
        x = rng.standard_normal((T, I)).astype(np.float32)
        want = ref.matmul(x, w)
        assert_close(f"{t.name} fast T={T}", ops.matmul(x, w, kernel="fast", shape=shape), want, TOL)
    if GPU:                                          # every shape the benchmark may pick
        for shape in ((1, 4), (4, 4), (2, 8), (4, 2), (1, 8), (2, 2)):
            assert_close(f"{t.name} fast {shape}", ops.matmul(x, w, kernel="fast", shape=shape), want, TOL)
        for T, shapes in ((1, ((4, 4), (8, 4), (16, 4), (8, 2), (16, 2), (32, 4), (8, 8), (16, 8))),
                          (4, ((8, 4, 2), (4, 4, 1), (8, 2, 2), (16, 4, 2)))):
            x1 = x[:T]
            want = ref.matmul(x1, w)
            for shape in shapes:
                assert_close(f"{t.name} fast T={T} {shape}", ops.matmul(x1, w, kernel="fast", shape=shape), want, TOL)


# the pipelined one-token kernel (shape flag DB): (type, I, shape) with lanes holding 1 or 2 units, an odd
# and an even number of chunks of P rows, the float and the 8-bit products
DB_CASES = [(GGMLType.Q8_0, 1088, (3, 1, 1, 0, 0, 1)), (GGMLType.Q4_K, 1280, (4, 1, 2, 0, 1, 1)),
            (GGMLType.Q4_K, 1280, (4, 1, 2, 0, 0, 1)), (GGMLType.Q6_K, 512, (4, 1, 2, 0, 0, 1)),
            (GGMLType.IQ2_XXS, 256, (2, 1, 1, 0, 0, 1))]


@pytest.mark.parametrize("t, i, shape", DB_CASES[:1] + [pytest.param(*c, marks=exhaustive) for c in DB_CASES[1:]], ids=lambda c: getattr(c, "name", str(c)))
def test_fast1_pipelined(t, i, shape, rng):
    """One-token kernel with software-pipelined loads (two register buffers) against the oracle; on the GPU
    also at a real row length with the shapes the benchmark tries."""
    w = random_qtensor(t, (5, i), rng)                # 5 rows: a partial group of rows
    x = rng.standard_normal((1, i)).astype(np.float32)
    assert_close(f"{t.name} fast1 DB {shape}", ops.matmul(x, w, kernel="fast", shape=shape), ref.matmul(x, w), TOL)
    if GPU:
        w = random_qtensor(t, (O + 1, 4 * I), rng)
        x = rng.standard_normal((1, 4 * I)).astype(np.float32)
        want = ref.matmul(x, w)
        for sh in ((8, 4, 2, 128, 0, 1), (8, 4, 2, 128, 1, 1), (8, 4, 4, 0, 0, 1), (16, 4, 4, 0, 1, 1)):
            assert_close(f"{t.name} fast1 DB {sh}", ops.matmul(x, w, kernel="fast", shape=sh), want, TOL)


def test_fast_kernel_refuses_other_types(rng, monkeypatch):
    """A type without an FSpec is refused by kernel="fast" (every type with a decoder has one now: drop one)."""
    monkeypatch.delitem(FSPECS, GGMLType.IQ2_XXS)
    w = random_qtensor(GGMLType.IQ2_XXS, (4, 256), rng)
    with pytest.raises(QuantError, match="fast kernel"):
        ops.matmul(np.ones((1, 256), np.float32), w, kernel="fast")


@pytest.mark.parametrize("t", tiered(TYPES, KEEP), ids=lambda t: t.name)
def test_gemm(t, rng):
    w = random_qtensor(t, (O + 3, I), rng)      # a partial row tile too
    x = rng.standard_normal((T_GEMM, I)).astype(np.float32)
    assert_close(f"{t.name} gemm", ops.matmul(x, w, kernel="gemm", shape=GEMM_SHAPE), ref.matmul(x, w), TOL)


@pytest.mark.parametrize("t", tiered([GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.F16], {GGMLType.Q4_K}),
                         ids=lambda t: t.name)
def test_stacked_weight_is_its_parts(t, rng):
    """A `quant.QStack` (q, k and v's rows one after another, uploaded part by part at their offsets) multiplied in
    one launch equals its parts' products side by side, bit for bit: each kernel's rows are independent (decode,
    a small batch, the GEMM tile; an odd part size puts a part's rows across a row group)."""
    from quant import QStack
    parts = [random_qtensor(t, (o, I), rng, n) for o, n in ((O, "q"), (3, "k"), (O // 2 + 1, "v"))]
    st = QStack(tuple(parts))
    assert st.shape == (sum(p.shape[0] for p in parts), I) and st.bounds()[1] == (O, O + 3)
    for kernel, T, shape in (("fast", 1, None if GPU else (2, 1)), ("gemv", 3, None),
                             ("gemm", T_GEMM, GEMM_SHAPE)):
        x = rng.standard_normal((T, I)).astype(np.float32)
        whole = ops.matmul(x, st, kernel=kernel, shape=shape)
        sides = np.concatenate([ops.matmul(x, p, kernel=kernel, shape=shape) for p in parts], axis=1)
        assert np.array_equal(whole, sides), (t.name, kernel)
    with pytest.raises(QuantError, match="one type and width"):
        QStack((parts[0], random_qtensor(t, (2, 2 * I), rng, "wide")))


# the tensor-core GEMM: every type on the GPU; in the simulator (mma emulated through shared memory, ~15 s a
# type) one type per decoder shape: the decode stage is gemm's (tested above for every type), the mma part is
# the same for all
TC_TYPES = TYPES if GPU else [GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q2_K, GGMLType.NVFP4, GGMLType.IQ2_XXS,
                              GGMLType.F16]
# 32-token tiles (the default) and the 64-token option of dense products (ops.TC_DENSE_SHAPE)
TC_SHAPES = [None, dict(BM=32, WM=1, WN=1, BN=32), dict(BM=64, WM=4, WN=2, BN=64)] if GPU else \
    [dict(BM=16, WM=1, WN=1, BN=64)]


@pytest.mark.parametrize("t", tiered(TC_TYPES, {GGMLType.Q4_K}), ids=lambda t: t.name)
def test_gemm_tc(t, rng):
    """3xTF32 tensor-core GEMM against the oracle; a partial row tile and a partial token tile."""
    o, i = (O + 3, I) if GPU else (13, max(128, SPECS[t].BS))
    w = random_qtensor(t, (o, i), rng)
    x = rng.standard_normal((T_GEMM, i)).astype(np.float32)
    want = ref.matmul(x, w)
    for sh in TC_SHAPES:
        assert_close(f"{t.name} tc {sh}", ops.matmul(x, w, kernel="tc", shape=sh), want, TOL)


@pytest.mark.parametrize("causal", [1, 2])
def test_tc_causal_skips(causal, rng):
    """The tensor-core GEMM's causal modes (pair row t is token t, which sees rows < pos + t + 1) on an F32 matrix:
    1 skips row tiles past what a token tile sees (those outputs stay unwritten: NaN here), 2 stops the K loop after
    the 128-column tile holding the last visible column (the activations are zero past it, as a causal softmax
    leaves them)."""
    from quant.cuda.gemv import dense_groups
    T, pos = 34, (0 if causal == 1 else 96)
    O, I = (48, 128) if causal == 1 else (16, 256)
    w = random_qtensor(GGMLType.F32, (O, I), rng)
    x = rng.standard_normal((T, I)).astype(np.float32)
    vis = np.arange(I if causal == 2 else O)[None, :] < (pos + np.arange(T) + 1)[:, None]     # [T, cols or rows]
    if causal == 2:
        x = np.where(vis, x, 0).astype(np.float32)
    y = cuda_mod.to_device(np.full((T, O), np.nan, np.float32))
    ops.grouped(qc.weights.device_weight(w).ensure(), cuda_mod.to_device(x), y,
                cuda_mod.to_device(dense_groups(T, cmoe.BN)), 1, T, T, kernel="tc",
                shape=dict(BM=16, WM=1, WN=1, CV=-1), causal=causal,            # 16-row tiles: one is skipped
                cpos=cuda_mod.to_device(np.array([pos], np.int32)), ch=1)
    got, want = y.copy_to_host(), x @ ref.dequantize(w).T
    if causal == 1:
        assert np.isnan(got[:32, 32:]).all()                 # the first tile (tokens 0..31) sees rows < 32 only
        got, want = np.where(vis, got, 0), np.where(vis, want, 0)
    assert_close(f"tc causal={causal}", got, want, 1e-6)


def test_tf32_split_twin():
    """The simulator twin of cvt.rna.tf32.f32 + remainder: hi has 10 mantissa bits, hi + lo == v exactly."""
    from quant.cuda import vec
    if not qc.SIM:
        pytest.skip("the twin exists in the simulator only")
    v = np.random.default_rng(5).standard_normal(2000).astype(np.float32) * np.float32(1e3)
    for f in v:
        hi, lo = vec.tf32_split(f)
        assert int(hi) & 0x1FFF == 0
        h = np.uint32(hi).view(np.float32)
        assert abs(float(f) - float(h)) <= abs(float(f)) * 2.0 ** -11
        assert np.float32(h + np.uint32(lo).view(np.float32)) == f


MOE_TYPES = [GGMLType.Q8_0] if not GPU else TYPES


@pytest.mark.parametrize("t", MOE_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("kernel", ["gemv", "fast", "pairs", "gemm", "tc"])
def test_moe_ffn(t, kernel, rng, few_threads):
    """Grouped dispatch against the loop oracle: fused and traced, experts with no token, scales."""
    from refengine.moe.experts import moe_ffn as loop_moe
    if kernel in ("fast", "pairs") and t not in FSPECS:
        pytest.skip(f"no fast GEMV for {t.name}")
    if kernel in ("gemm", "tc") and not GPU:
        pytest.skip("the tiled GEMMs need rows of 128 weights: too slow for the simulator (GPU only)")
    E, A, T = (4, 2, 2) if not GPU else (16, 4, 20)
    D, F = (32, 32) if not GPU else (512, 256)
    if SPECS[t].BS > 32:
        D, F = 256, 256
        if not GPU:
            pytest.skip("256-weight blocks: too slow for the simulator")
    up, gate = random_qtensor(t, (E, F, D), rng, "up"), random_qtensor(t, (E, F, D), rng, "gate")
    down = random_qtensor(t, (E, D, F), rng, "down")
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids = np.stack([rng.permutation(E - 1)[:A] for _ in range(T)]).astype(np.int32)   # expert E-1 unused
    wts = rng.uniform(0.1, 1.0, (T, A)).astype(np.float32)
    sc = dict(up_scale=rng.uniform(0.5, 2, E).astype(np.float32), down_scale=rng.uniform(0.5, 2, E).astype(np.float32))
    rec_w, rec_g = {}, {}
    want = loop_moe(x, ids, wts, up=up, gate=gate, down=down, matmul=ref.matmul,
                    record=lambda n, il, v: rec_w.__setitem__(n, v), **sc)
    assert_close("fused", cmoe.moe_ffn(x, ids, wts, up=up, gate=gate, down=down, kernel=kernel, **sc), want, TOL)
    if not GPU:
        return                                 # the traced variant runs the same kernels unfused: GPU only
    got = cmoe.moe_ffn(x, ids, wts, up=up, gate=gate, down=down, kernel=kernel,
                       record=lambda n, il, v: rec_g.__setitem__(n, v), **sc)
    assert_close("traced", got, want, TOL)
    assert set(rec_g) == set(rec_w)
    for k in rec_w:
        assert_close(k, rec_g[k], rec_w[k], TOL)
    if GPU and t == MOE_TYPES[0]:              # no gate: act = silu(up)
        want = loop_moe(x, ids, wts, up=up, gate=None, down=down, matmul=ref.matmul)
        assert_close("no gate", cmoe.moe_ffn(x, ids, wts, up=up, gate=None, down=down, kernel=kernel), want, TOL)


@pytest.mark.parametrize("T", [2] if not GPU else [1, 20])
def test_moe_ffn_situ(T, rng, few_threads):
    """Kimi-K3's SiTU experts through the grouped dispatch (activation on the host between the kernels) against
    the loop oracle with the same activation: output and every traced intermediate; one token included."""
    from refengine.moe.experts import moe_ffn as loop_moe
    from refengine.ops.activations import situ
    t = GGMLType.Q8_0
    E, A = (4, 2) if not GPU else (16, 4)
    D, F = (32, 32) if not GPU else (512, 256)
    up, gate = random_qtensor(t, (E, F, D), rng, "up"), random_qtensor(t, (E, F, D), rng, "gate")
    down = random_qtensor(t, (E, D, F), rng, "down")
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:A] for _ in range(T)]).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, (T, A)).astype(np.float32)
    act = (lambda g, u: situ(g, u, 1.5, 3.0), "ffn_moe_situ")
    rec_w, rec_g = {}, {}
    want = loop_moe(x, ids, wts, up=up, gate=gate, down=down, matmul=ref.matmul, act=act,
                    record=lambda n, il, v: rec_w.__setitem__(n, v))
    got = cmoe.moe_ffn(x, ids, wts, up=up, gate=gate, down=down, act=act,
                       record=lambda n, il, v: rec_g.__setitem__(n, v))
    assert_close("situ traced", got, want, TOL)
    assert set(rec_g) == set(rec_w) and "ffn_moe_situ" in rec_g
    for k in rec_w:
        assert_close(k, rec_g[k], rec_w[k], TOL)
    from refengine.runtime import Runtime        # untraced, through the runtime (which sends SiTU experts here)
    assert_close("situ", Runtime(backend="cuda").moe_ffn(x, ids, wts, up=up, gate=gate, down=down, act=act), want, TOL)


@pytest.mark.parametrize("t", [GGMLType.Q8_0] if not GPU else list(FSPECS), ids=lambda t: t.name)
def test_moe_one_token_from_ids(t, rng):
    """One token: the fast kernel reads the expert ids directly (no group table), gate/up fused, then down."""
    from refengine.moe.experts import moe_ffn as loop_moe
    E, A = (4, 2) if not GPU else (16, 4)
    D, F = (32, 32) if not GPU else (512, 256)
    if FSPECS[t].BS > 32:
        D, F = 256, 256
    up, gate = random_qtensor(t, (E, F, D), rng, "up"), random_qtensor(t, (E, F, D), rng, "gate")
    down = random_qtensor(t, (E, D, F), rng, "down")
    x = rng.standard_normal((1, D)).astype(np.float32)
    ids = rng.permutation(E)[:A].reshape(1, A).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, (1, A)).astype(np.float32)
    sc = dict(up_scale=rng.uniform(0.5, 2, E).astype(np.float32), down_scale=rng.uniform(0.5, 2, E).astype(np.float32))
    want = loop_moe(x, ids, wts, up=up, gate=gate, down=down, matmul=ref.matmul, **sc)
    dw = {k: qc.weights.device_weight(m).ensure() for k, m in (("up", up), ("gate", gate), ("down", down))}
    assert cmoe.one_token_ok(dw["up"], dw["gate"], dw["down"], cuda_mod.to_device(x))
    assert_close("one token", cmoe.moe_ffn(x, ids, wts, up=up, gate=gate, down=down, **sc), want, TOL)


@pytest.mark.parametrize("t", [GGMLType.Q8_0, GGMLType.Q4_K] if not GPU else list(FSPECS), ids=lambda t: t.name)
def test_pairs_kernel(t, rng):
    """One block per pair ("pairs", `fgemv1_kernel(IDM=3)`) over a device-built group table with skewed groups
    (every token on expert 1, experts with no pair, a group of one pair), against the oracle per pair; and a
    dense product of 3 tokens (one group). Every output row is poisoned first: each must be written."""
    from quant.cuda.gemv import GroupTable
    E, A, T = (5, 2, 3) if not GPU else (16, 4, 21)
    O_, I_ = (3, FSPECS[t].BS) if not GPU else (77, 512)
    w = random_qtensor(t, (E, O_, I_), rng)
    ids = np.stack([[1] + list(rng.permutation([0, 3] if not GPU else range(2, E))[:A - 1]) for _ in range(T)])
    ids[-1, -1] = 4 if not GPU else E - 1                       # a group of a single pair
    ids = ids.astype(np.int32)
    n, gmax = ids.size, min(E, ids.size)
    tx = cuda_mod.to_device(np.full(GroupTable.size(gmax, n, cmoe.BN), -7, np.int32))
    tp = cuda_mod.to_device(np.full(GroupTable.size(gmax, n, cmoe.BN), -7, np.int32))
    cmoe.bucket_kernel[1, 256 if GPU else 32](cuda_mod.to_device(ids.reshape(-1)), E, A, n, cmoe.BN, tx, tp,
                                              cuda_mod.device_array(E, np.int32), cuda_mod.device_array(E, np.int32))
    x = rng.standard_normal((T, I_)).astype(np.float32)
    dw = qc.weights.device_weight(w).ensure()
    yd = cuda_mod.to_device(np.full((n, O_), np.nan, np.float32))
    shape = None if GPU else (2, 1, 1, 0, 0)
    ops.grouped(dw, cuda_mod.to_device(x), yd, tx, gmax, n, T, kernel="pairs", shape=shape)
    wd = ref.dequantize(w)                                       # [E, O, I]
    want = np.stack([wd[ids[k, a]] @ x[k] for k in range(T) for a in range(A)])
    assert_close(f"{t.name} pairs", yd.copy_to_host(), want, TOL)
    xd3 = rng.standard_normal((3, I_)).astype(np.float32)
    assert_close(f"{t.name} pairs dense", ops.matmul(xd3, w[0], kernel="pairs", shape=shape), ref.matmul(xd3, w[0]), TOL)


def test_auto_kernel_choice(rng):
    """`ops.auto_kernel` chooses expert dispatch by the average pairs per group (the host does not know the
    largest group): <= PAIRS_AVG one block per pair, <= GROUP_AVG one block per group, more the tiled GEMM;
    dense products and one-token groups as before; PAIRS_AVG = GROUP_AVG = 0 restores the choice by tokens."""
    dw = qc.weights.device_weight(random_qtensor(GGMLType.Q8_0, (4, 8, 256), rng)).ensure()
    xd = cuda_mod.to_device(np.zeros((4, 256), np.float32))
    tiled = "tc" if ops.TC else "gemm"
    E = 128
    for (gmax, n_pairs, mpg, glu), want in [((E, 256, 32, False), "pairs"), ((E, 512, 64, False), "fast"),
                                            ((E, 1024, 128, False), "fast"), ((E, 4096, 512, False), tiled),
                                            ((E, 4096, 512, True), "fast"), ((8, 8, 1, False), "fast"),
                                            ((1, 4, 4, False), "fast"), ((1, 64, 64, False), tiled)]:
        assert ops.auto_kernel(dw, xd, gmax, n_pairs, mpg, glu) == want, (gmax, n_pairs, mpg, glu)
    assert ops.auto_kernel(dw, xd, E, 256, 32, pairs_avg=0, group_avg=0) == tiled
    assert ops.auto_kernel(dw, xd, E, 64, 8, pairs_avg=0, group_avg=0) == "fast"


def test_bucket_kernel_matches_host(rng):
    """Device grouping (tokens sorted by expert) gives the host's groups, tiles and pairs."""
    from quant.cuda.gemv import GroupTable
    E, A, T = 7, 3, 5
    ids = np.stack([rng.permutation(E)[:A] for _ in range(T)]).astype(np.int32)
    tx, tp, _ = cmoe.groups_from_ids(ids, E)
    n, gmax = ids.size, min(E, ids.size)
    dx = cuda_mod.to_device(np.full(GroupTable.size(gmax, n, cmoe.BN), -7, np.int32))
    dp = cuda_mod.to_device(np.full(GroupTable.size(gmax, n, cmoe.BN), -7, np.int32))
    cmoe.bucket_kernel[1, 256](cuda_mod.to_device(ids.reshape(-1)), E, A, n, cmoe.BN, dx, dp,
                               cuda_mod.device_array(E, np.int32), cuda_mod.device_array(E, np.int32))
    hx, hp = dx.copy_to_host(), dp.copy_to_host()
    P = 2 + 2 * gmax
    q0 = P + 2 * n                             # tile count, then (group, first pair) per tile
    G = tx[0]
    assert hx[0] == G and np.array_equal(hx[1:1 + G], tx[1:1 + G])                        # experts of the groups
    assert np.array_equal(hx[1 + gmax:P], tx[1 + gmax:P])                                 # group offsets
    assert np.array_equal(hx[q0:q0 + 1 + 2 * tx[q0]], tx[q0:q0 + 1 + 2 * tx[q0]])         # GEMM tiles
    for g in range(G):                         # pairs of a group in any order
        a, b = tx[1 + gmax + g], tx[2 + gmax + g]
        for dev, host in ((hx, tx), (hp, tp)):
            assert sorted(zip(dev[P + a:P + b], dev[P + n + a:P + n + b])) == \
                sorted(zip(host[P + a:P + b], host[P + n + a:P + n + b]))


def test_backend_contract(rng):
    """The backend module has the oracle's signature, errors and fallbacks."""
    from quant.ref import QuantError
    w = random_qtensor(GGMLType.Q8_0, (4, 64), rng)
    with pytest.raises(QuantError):
        qc.matmul(np.zeros((2, 32), np.float32), w)
    with pytest.raises(QuantError):
        qc.matmul(np.zeros((2, 64), np.float32), w, mode="nope")
    odd = random_qtensor(GGMLType.F32, (3, 40), rng)           # rows not a whole pseudo-block: NumPy path
    x = rng.standard_normal((2, 40)).astype(np.float32)
    assert_close("fallback", qc.matmul(x, odd), ref.matmul(x, odd), TOL)


# one specialization per kernel family (names as `quant.cuda.ptx.kernels()` gives them), Q8_0 where typed (its
# decoder compiles 2-5x faster than Q4_K's), and the one-token kernel for Q4_K too (a K-quant's working arrays must
# stay in registers): the fast / tc ones are also checked for local memory. About 40 s on 2 cores.
PTX_FAMILIES = ["naive[Q8_0]", "gemv[Q8_0, NT=8, glu]", "gemm[Q8_0, rw]", "tc[Q8_0]", "tc[F32, causal=2]",
                "fast1[Q8_0, pairs, rw]", "fast1[Q4_K]", "fast[Q8_0, NT=8, glu]", "fast8[Q8_0, ids]", "bucket",
                "swiglu", "combine", "staged[Q4_K]", "h3 split", "h3 combine", "tcq[Q4_K]", "tcq split", "tcq16[Q4_K]",
                "tcq16 split"]


def test_ptx_sm90_one_per_family():
    """One specialization of each kernel family compiles for Hopper (sm_90) with NVVM; no GPU needed."""
    ptx_sm90("quant.cuda.ptx", PTX_FAMILIES)


@exhaustive
def test_ptx_sm90_every_kernel():
    """Every kernel compiles for Hopper (sm_90) with NVRTC/NVVM; no GPU needed."""
    ptx_sm90("quant.cuda.ptx", args=["-j", "2"])
