"""The quant-domain tensor-core GEMM (`quant/cuda/tcq.py`) against the NumPy oracle (quant.ref), rel-RMS <= 1e-5.

Runs on the GPU at real tile sizes when there is one, else in numba's CUDA simulator on toy sizes (one warp, 16-pair
tiles: `tc.warp_mma` emulates the tensor core there). The routed groups hold 0, a partial 8-pair column tile, and
more than a tile; rows not a multiple of the warp's 16 (the clamped rows' outputs must not be written); scales and
row weights as the expert dispatch passes them; the latency variants (weight burst, activation prefetch, the weights
staged through shared memory by cp.async: `gemm_tcq_staged_kernel`) compute the same numbers, and so does the
half-precision variant on mma.m16n8k16 (`gemm_tcq16_kernel`, H=1: f16 halves of row-scaled activations).
"""
import numpy as np
import pytest

cuda_mod = pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

from quant import GGMLType, QTensor, ref  # noqa: E402
from quant.cuda import ops  # noqa: E402
from quant.cuda.gemv import GroupTable  # noqa: E402
from quant.cuda.testdata import random_raw  # noqa: E402
from quant.cuda.weights import device_weight  # noqa: E402
from quant.ref import QuantError  # noqa: E402
from numerics import assert_close  # noqa: E402

pytestmark = pytest.mark.cuda
GPU = not qc.SIM and qc.available()
TOL = 1e-5
# experts, rows, columns, tokens; pairs of each expert; the launch shape (the simulator: one warp of 16 rows)
E, O, I, T = (6, 200, 2048, 96) if GPU else (3, 20, 512, 12)      # two super-blocks: the staged kernel's buffers
COUNTS = (0, 5, 41, 30, 17, 64) if GPU else (0, 3, 9)
BN = 32 if GPU else 16
SHAPES = [dict(MT=4, WM=2, BN=BN), dict(MT=2, WM=4, BN=BN, PW=1, PF=1), dict(MT=2, WM=4, BN=BN, ST=1),
          dict(MT=4, WM=2, BN=BN, H=1), dict(MT=2, WM=4, BN=BN, H=1)] if GPU else \
    [dict(MT=1, WM=1, BN=BN), dict(MT=1, WM=1, BN=BN, PW=1, PF=1), dict(MT=1, WM=1, BN=BN, ST=1),
     dict(MT=1, WM=1, BN=BN, H=1)]


def _case(rng):
    w = QTensor.from_raw("w", GGMLType.Q4_K, (E, O, I), random_raw(GGMLType.Q4_K, (E, O, I), rng, centered=True))
    counts = np.array(COUNTS)
    tok = np.concatenate([rng.choice(T, c, replace=False) for c in counts])
    exp = np.repeat(np.arange(E), counts)
    gexp = np.unique(exp)
    n = len(tok)
    tab = GroupTable.build(gexp, np.bincount(exp)[gexp], tok, np.arange(n), min(E, n), BN)
    x = rng.standard_normal((T, I)).astype(np.float32)
    sc = rng.uniform(0.5, 2, E).astype(np.float32)
    rw = rng.uniform(0.5, 2, n).astype(np.float32)
    wd = ref.dequantize(w).astype(np.float64)
    want = np.stack([sc[e] * rw[j] * (x[tok[j]].astype(np.float64) @ wd[e].T) for j, e in enumerate(exp)])
    return w, tab, x, sc, rw, want, int(counts.max())


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(f"{k}{v}" for k, v in s.items()))
def test_tcq_grouped_matches_numpy(shape):
    rng = np.random.default_rng(7)
    w, tab, x, sc, rw, want, mpg = _case(rng)
    n = want.shape[0]
    dw = device_weight(w).ensure()
    yd = cuda_mod.to_device(np.full((n, O), np.nan, np.float32))
    xd = cuda_mod.to_device(x)
    split = ops.tcq_split(xd, half=bool(shape.get("H"))) if shape.get("PW") or shape.get("H") else None
    # (a split made ahead for some variants, as gate / up share one)
    ops.grouped(dw, xd, yd, cuda_mod.to_device(tab), min(E, n), n, mpg, sc=cuda_mod.to_device(sc),
                rw=cuda_mod.to_device(rw), kernel="tcq", shape=shape, split=split)
    assert_close(f"tcq {shape}", yd.copy_to_host(), want, TOL)       # (NaN left in an unwritten output fails it)


def test_tcq_refuses_other_types():
    rng = np.random.default_rng(0)
    w = QTensor.from_raw("w", GGMLType.Q8_0, (1, 16, 256), random_raw(GGMLType.Q8_0, (1, 16, 256), rng))
    dw = device_weight(w).ensure()
    tab = GroupTable.build(np.zeros(1, np.int32), np.array([2]), np.arange(2), np.arange(2), 1, 32)
    with pytest.raises(QuantError, match="Q8_0"):
        ops.grouped(dw, cuda_mod.to_device(np.zeros((2, 256), np.float32)),
                    cuda_mod.device_array((2, 16), np.float32), cuda_mod.to_device(tab), 1, 2, 2, kernel="tcq")


def test_tcq_auto_choice(monkeypatch):
    """auto takes tcq for Q4_K groups of at most a tile of pairs on average (expert dispatch), tc for fuller ones
    (per-head products, dense) and for types tcq does not read."""
    monkeypatch.setattr(ops, "TC", True)
    rng = np.random.default_rng(0)
    q4 = device_weight(QTensor.from_raw("a", GGMLType.Q4_K, (4, 16, 256),
                                        random_raw(GGMLType.Q4_K, (4, 16, 256), rng))).ensure()
    q8 = device_weight(QTensor.from_raw("b", GGMLType.Q8_0, (4, 16, 256),
                                        random_raw(GGMLType.Q8_0, (4, 16, 256), rng))).ensure()
    xd = cuda_mod.to_device(np.zeros((4, 256), np.float32))
    assert ops.auto_kernel(q4, xd, 256, 4096, 40, pairs_avg=0, group_avg=0) == "tcq"
    assert ops.auto_kernel(q4, xd, 128, 64 * 128, 64, pairs_avg=0, group_avg=0) == "tc"
    assert ops.auto_kernel(q8, xd, 256, 4096, 40, pairs_avg=0, group_avg=0) == "tc"
    monkeypatch.setattr(ops, "PAIRS_AVG", 0)
    monkeypatch.setattr(ops, "GROUP_AVG", 0)
    assert ops.shared_split(q4, xd, 256, 4096, 40) is not None           # gate and up share one split on tcq
    assert ops.shared_split(q8, xd, 256, 4096, 40) is None
    monkeypatch.setattr(ops, "TCQ", False)
    assert ops.auto_kernel(q4, xd, 256, 4096, 40, pairs_avg=0, group_avg=0) == "tc"
    assert ops.shared_split(q4, xd, 256, 4096, 40) is None


@pytest.mark.skipif(not GPU, reason="three 256-row products on the tensor-core emulation: minutes in the simulator")
@pytest.mark.parametrize("half", [0, 1])
def test_tcq_experts_match_the_loop_oracle(monkeypatch, half):
    """The routed experts (gate and up sharing one split, SwiGLU, down with row weights) on tcq against the loop
    oracle, fused and traced; half: the f16 variant as the default shape (TCQ_SHAPE H=1)."""
    monkeypatch.setattr(ops, "TCQ_SHAPE", dict(ops.TCQ_SHAPE, H=half))
    from quant.cuda import moe as cmoe
    from refengine.moe.experts import moe_ffn as loop_moe
    rng = np.random.default_rng(11)
    E, A, T, D, F = 8, 2, 40, 512, 256
    up, gate, down = (QTensor.from_raw(nm, GGMLType.Q4_K, sh, random_raw(GGMLType.Q4_K, sh, rng, centered=True))
                      for nm, sh in (("up", (E, F, D)), ("gate", (E, F, D)), ("down", (E, D, F))))
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:A] for _ in range(T)]).astype(np.int32)
    wts = rng.uniform(0.1, 1.0, (T, A)).astype(np.float32)
    want = loop_moe(x, ids, wts, up=up, gate=gate, down=down, matmul=ref.matmul)
    assert_close("fused", cmoe.moe_ffn(x, ids, wts, up=up, gate=gate, down=down, kernel="tcq"), want, TOL)
    assert_close("traced", cmoe.moe_ffn(x, ids, wts, up=up, gate=gate, down=down, kernel="tcq",
                                        record=lambda *a: None), want, TOL)


def test_tcq16_dense_matches_numpy():
    """A dense product (one group of every token, `ops.dense`) on the f16 variant, as KernelPolicy(prefill_gemm=
    "tcq16") runs a prefill's Q4_K products: rows not a multiple of 16, tokens not a multiple of the tile."""
    rng = np.random.default_rng(9)
    O_, I_, T_ = (300, 1024, 200) if GPU else (20, 256, 19)
    w = QTensor.from_raw("w", GGMLType.Q4_K, (O_, I_), random_raw(GGMLType.Q4_K, (O_, I_), rng, centered=True))
    x = rng.standard_normal((T_, I_)).astype(np.float32)
    yd = cuda_mod.to_device(np.full((T_, O_), np.nan, np.float32))
    shape = dict(MT=2, WM=4, BN=32, H=1) if GPU else dict(MT=1, WM=1, BN=16, H=1)
    ops.dense(device_weight(w).ensure(), cuda_mod.to_device(x), yd, kernel="tcq", shape=shape)
    assert_close("tcq16 dense", yd.copy_to_host(), x.astype(np.float64) @ ref.dequantize(w).astype(np.float64).T,
                 TOL)
