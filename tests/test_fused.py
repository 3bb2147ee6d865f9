"""refengine/cuda/fused.py: the one-launch kernels of the small ops against their NumPy statements (ops/norm.py,
ops/softmax.py, ops/activations.py) and the NaN/inf flag kernel against np.isfinite.

On a GPU at real row sizes (and through the ops' own dispatch on device arrays: `Device.fused`); without one in
numba's CUDA simulator on toy sizes (conftest.py sets NUMBA_ENABLE_CUDASIM=1). Tolerance: the kernels sum in
another order than NumPy's (float64 sums where NumPy's are float64) and the simulator's / CUDA's exp may differ from
NumPy's by an ulp: relative 2e-6 per element (rms_norm, softmax), 1e-6 (the activations; softplus also 2.5e-7
absolute), 1e-5 (the delta rule's state after several tokens).
"""
import numpy as np
import pytest

cuda_mod = pytest.importorskip("numba.cuda")
qc = pytest.importorskip("quant.cuda")

from numba import cuda  # noqa: E402

from refengine.cuda import fused  # noqa: E402
from refengine.cuda.standin import StandIn, gdn_gates_np, group_limited_np, numpy_twins  # noqa: E402
from refengine.attention import delta_rule  # noqa: E402
from refengine.attention.mha import attention_blocked, causal_mask, no_mask  # noqa: E402
from refengine.attention.short_conv import causal_conv  # noqa: E402
from refengine.ops.rope import apply_rope, rope_cos_sin  # noqa: E402
from refengine.ops.activations import sigmoid, silu, situ, softplus, swiglu, swiglu_clamp  # noqa: E402
from refengine.ops.norm import add_rms_norm, add_slots_rms_norm, layer_norm, rms_norm  # noqa: E402
from refengine.ops.softmax import softmax  # noqa: E402

pytestmark = pytest.mark.cuda

GPU = not qc.SIM and qc.available()
ROWS, D = (7, 7168) if GPU else (3, 300)          # 300: a row longer than a block, not a multiple of it


def _rand(*shape, seed=0, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _run(launch, *host, out_shapes):
    dev = [cuda.to_device(np.ascontiguousarray(h)) if h is not None else None for h in host]
    outs = [cuda.device_array(s, np.float32) for s in out_shapes]
    launch(*dev, *outs)
    cuda.synchronize()
    return [o.copy_to_host() for o in outs]


# (rows, width): a block a row (rows longer than fused.WARP_ROW_MAX_D), and a warp a row (a head's norm: short rows,
# here not a multiple of 32 wide and not a whole number of blocks of NTW rows, so the last block's spare warps exit)
SHAPES = {"block": (ROWS, D), "warp": (11, 200), "warp_max": (9, 256)}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("with_w", [True, False])
def test_rms_norm_rows(with_w, shape):
    R, Dx = SHAPES[shape]
    assert (Dx <= fused.WARP_ROW_MAX_D) == shape.startswith("warp")
    x = _rand(R, Dx)
    x[1] *= 1e-3                                          # rows of other scales
    w = _rand(Dx, seed=1) if with_w else None
    want = rms_norm(x, w, 1e-6)
    (got,) = _run(lambda xd, wd, y: fused.rms_norm_raw(xd, wd, 1e-6, y), x, w, out_shapes=[x.shape])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=0)
    # rows lying apart (a latent's first D columns of wider rows, as `fused.rms_norm` now passes them): the same
    wide = np.concatenate([x, _rand(R, 5, seed=4)], axis=1)
    (got_w,) = _run(lambda wd_, wd, y: fused.rms_norm_raw(wd_[:, :Dx], wd, 1e-6, y), wide, w, out_shapes=[x.shape])
    assert np.array_equal(got_w, got)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("with_w", [True, False])
def test_add_rms_norm_rows(with_w, shape):
    """(x + a, rms_norm(x + a)): the sum bit for bit (one float32 add), the norm as the plain norm's kernel."""
    ROWS, D = SHAPES[shape]
    x, a = _rand(ROWS, D), _rand(ROWS, D, seed=2)
    a[1] *= 1e-3
    w = _rand(D, seed=1) if with_w else None
    want_s, want_y = add_rms_norm(x, a, w, 1e-6)
    got_s, got_y = _run(lambda xd, ad, wd, s_, y: fused.rms_norm_raw(xd, wd, 1e-6, y, a2=ad, s2=s_), x, a, w,
                        out_shapes=[x.shape, x.shape])
    assert np.array_equal(got_s, want_s)
    np.testing.assert_allclose(got_y, want_y, rtol=2e-6, atol=0)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("A, with_e", [(1, False), (1, True), (3, False), (3, True), (5, False), (8, True)])
def test_add_slots_rms_norm_rows(A, with_e, shape):
    """A MoE layer's combine, its shared experts' add, the residual add and the next norm in one launch
    (`fused._addend`): x + (slots[:, 0] + ... + slots[:, A-1] (+ e)) bit for bit as `ops.slot_sum` adds them (float32,
    in slot order), the norm as the plain norm's kernel. A = 3 rows of other scales: an order flip would show."""
    R, Dx = SHAPES[shape]
    x, slots = _rand(R, Dx), _rand(R, A, Dx, seed=2)
    slots[:, 1:] *= 1e-3
    slots[1] *= 1e4
    e = _rand(R, Dx, seed=5) if with_e else None
    w = _rand(Dx, seed=1)
    want_s, want_y = add_slots_rms_norm(x, slots, e, w, 1e-6)
    got_s, got_y = _run(lambda xd, sd, ed, wd, s_, y: fused.rms_norm_raw(xd, wd, 1e-6, y, a2=sd.reshape(R * A, Dx),
                                                                        s2=s_, A=A, e2=ed),
                        x, slots, e, w, out_shapes=[x.shape, x.shape])
    assert np.array_equal(got_s, want_s)
    np.testing.assert_allclose(got_y, want_y, rtol=2e-6, atol=0)
    if A > 1:                                             # the order matters at these scales: a check that can fail
        other = x + (slots[:, ::-1].sum(axis=1, dtype=np.float32) + (e if with_e else 0))
        assert not np.array_equal(other, want_s)


@pytest.mark.parametrize("with_a", [True, False])
def test_rms_norm_rows_passes(with_a):
    """Rows longer than one pass of a block's registers (`fused.RPT` elements a thread): the values loaded again
    for the scale pass (from the written sum when there is one), as the one-pass rows."""
    n = 2 * fused.RPT * fused.NT + 37
    x, a, w = _rand(2, n), _rand(2, n, seed=2), _rand(n, seed=1)
    if with_a:
        want_s, want_y = add_rms_norm(x, a, w, 1e-6)
        got_s, got_y = _run(lambda xd, ad, wd, s_, y: fused.rms_norm_raw(xd, wd, 1e-6, y, a2=ad, s2=s_), x, a, w,
                            out_shapes=[x.shape, x.shape])
        assert np.array_equal(got_s, want_s)
    else:
        want_y = rms_norm(x, w, 1e-6)
        (got_y,) = _run(lambda xd, wd, y: fused.rms_norm_raw(xd, wd, 1e-6, y), x, w, out_shapes=[x.shape])
    np.testing.assert_allclose(got_y, want_y, rtol=2e-6, atol=0)


def test_l2_norm_rows():
    """delta_rule.l2_norm (the norm with eps / D, then 1 / sqrt(D), each rounded): the norm kernel with `post`."""
    x = _rand(ROWS, 128)
    x[1] *= 1e-3
    want = delta_rule.l2_norm(x, 1e-6)
    (got,) = _run(lambda xd, y: fused.rms_norm_raw(xd, None, 1e-6 / 128, y, post=np.float32(1.0 / np.sqrt(128))),
                  x, out_shapes=[x.shape])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=0)


@pytest.mark.parametrize("wb", [(True, True), (True, False), (False, False)])
def test_layer_norm_rows(wb):
    x = _rand(ROWS, D) + 5.0                              # a mean far from 0
    w, b = (_rand(D, seed=k + 1) if on else None for k, on in enumerate(wb))
    want = layer_norm(x, w, b, 1e-5)
    (got,) = _run(lambda xd, wd, bd, y: fused.layer_norm_raw(xd, wd, bd, 1e-5, y), x, w, b, out_shapes=[x.shape])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_softmax_rows():
    x = _rand(ROWS, D, scale=8.0)
    x[0, ::7] = -np.inf                                   # masked entries -> 0
    x[1, 40] = 200.0                                      # the max held by the second warp only: a max that missed
    want = softmax(x)                                     # a warp's would overflow exp (inf / NaN)
    (got,) = _run(fused.softmax_raw, x, out_shapes=[x.shape])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)
    assert np.all(got[0, ::7] == 0)


@pytest.mark.parametrize("name", ["silu", "sigmoid", "softplus"])
def test_unary(name):
    x = _rand(ROWS * D, scale=10.0)
    x[:3] = (-100.0, 100.0, 0.0)                          # exp overflow: 0 / 1 as NumPy gives
    x[3:5] = (20.0, 20.5)                                 # softplus: x itself above 20
    want = {"silu": silu, "sigmoid": sigmoid, "softplus": softplus}[name](x)
    (got,) = _run(getattr(fused, f"{name}_raw"), x, out_shapes=[x.shape])
    # softplus's log(1 + e) near 1: one ulp of exp (CUDA's and NumPy's float32 exp are not correctly rounded) moves
    # the sum by an ulp of 1, 1.2e-7 absolute in the result: two such ulps allowed
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=2.5e-7 if name == "softplus" else 1e-30)


def test_swiglu():
    g, u = _rand(ROWS * D, scale=6.0), _rand(ROWS * D, seed=1)
    (got,) = _run(fused.swiglu_raw, g, u, out_shapes=[g.shape])
    np.testing.assert_allclose(got, swiglu(g, u), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("lb", [0.0, 5.0])
def test_situ(lb):
    """Kimi-K3's SiTU (with and without the capped up branch) == activations.situ."""
    g, u = _rand(ROWS * D, scale=8.0), _rand(ROWS * D, seed=1, scale=8.0)
    (got,) = _run(lambda gd, ud, y: fused.situ_raw(gd, ud, 3.0, lb, y), g, u, out_shapes=[g.shape])
    np.testing.assert_allclose(got, situ(g, u, 3.0, lb), rtol=2e-6, atol=1e-6)


def test_swiglu_clamp():
    g, u = _rand(ROWS * D, scale=10.0), _rand(ROWS * D, seed=1, scale=10.0)
    (got,) = _run(lambda gd, ud, y: fused.swiglu_clamp_raw(gd, ud, 7.0, y), g, u, out_shapes=[g.shape])
    np.testing.assert_allclose(got, swiglu_clamp(g, u, 7.0), rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("cols", [1, 2])
@pytest.mark.parametrize("per_key", [False, True])
@pytest.mark.parametrize("with_S", [False, True])
@pytest.mark.parametrize("K", ["small", "mid", "wide"])
def test_delta_rule(per_key, with_S, K, cols):
    """Every token of a call in one launch == delta_rule.recurrent (GDN's per-head decay, KDA's per-key one; a new
    sequence's zero state or a carried one; K under a warp's 32 lanes and over them: two rows a lane; over 128:
    the kernel of 8 rows a lane), one and two value columns a warp (`fused.DR_COLS`), V not a whole number of a
    block's columns (dead columns in a live warp)."""
    K = {"small": (8, 32), "mid": (40, 128), "wide": (136, 160)}[K][GPU]
    T, H, V = (21, 32, 120) if GPU else (10, 2, 5)      # T over two staged chunks (DR_TC = 8)
    rng = np.random.default_rng(3)
    q, k = (rng.standard_normal((T, H, K)).astype(np.float32) / np.sqrt(K) for _ in range(2))
    v = rng.standard_normal((T, H, V)).astype(np.float32)
    g = -np.abs(rng.standard_normal((T, H, K) if per_key else (T, H))).astype(np.float32)
    beta = rng.uniform(0, 1, (T, H)).astype(np.float32)
    S = rng.standard_normal((H, K, V)).astype(np.float32) if with_S else None
    o_want, S_want = delta_rule.recurrent(q, k, v, g, beta, S)
    g3 = g if per_key else g[:, :, None]
    o, S_out = _run(lambda *a: fused.delta_rule_raw(a[0], a[1], a[2], a[3], per_key, a[4], a[5], 1 / np.sqrt(V),
                                                    a[6], a[7], cols=cols), q, k, v, g3, beta, S,
                    out_shapes=[(T, H, V), (H, K, V)])
    np.testing.assert_allclose(o, o_want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(S_out, S_want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("then_silu", [False, True])
@pytest.mark.parametrize("T", [1, 2, 5])
@pytest.mark.parametrize("with_tail", [False, True])
def test_causal_conv(T, with_tail, then_silu):
    """The sum (then_silu: its silu) and the new tail in one launch == short_conv.causal_conv (T shorter and longer
    than the tail); with then_silu, the separate silu kernel of the plain launch's sum, bit for bit."""
    C, Kc = (8192, 4) if GPU else (5, 4)
    rng = np.random.default_rng(T)
    x, w = rng.standard_normal((T, C)).astype(np.float32), rng.standard_normal((C, Kc)).astype(np.float32)
    tail = rng.standard_normal((Kc - 1, C)).astype(np.float32) if with_tail else None
    y_want, tail_want = causal_conv(x, w, tail, then_silu)
    y, new_tail = _run(lambda *a: fused.causal_conv_raw(*a, then_silu=then_silu), x, w, tail,
                       out_shapes=[(T, C), (Kc - 1, C)])
    np.testing.assert_allclose(y, y_want, rtol=1e-6, atol=1e-6)
    assert np.array_equal(new_tail, tail_want)
    if then_silu:
        y0, _ = _run(fused.causal_conv_raw, x, w, tail, out_shapes=[(T, C), (Kc - 1, C)])
        (y1,) = _run(lambda a, o: fused.silu_raw(a, o), y0.ravel(), out_shapes=[(T * C,)])
        assert np.array_equal(y, y1.reshape(T, C))


@pytest.mark.parametrize("mode", [0, 2])
def test_rope(mode):
    """The first n_rot dims rotated (NORM pairs (2i, 2i+1), NEOX pairs (i, i + n_rot/2)), the rest copied: ==
    rope.apply_rope, on a strided input (q's rope part is a slice of a wider row)."""
    T, H, K, n_rot = (3, 16, 64, 48) if GPU else (2, 3, 10, 6)
    wide = _rand(T, H, K + 4)
    x = wide[:, :, 4:]
    cos, sin = rope_cos_sin(np.arange(5, 5 + T), n_rot=n_rot, base=10000.0)
    want = apply_rope(x, cos, sin, n_rot, mode)
    (got,) = _run(lambda xd, c, s_, y: fused.rope_raw(xd[:, :, 4:], c, s_, n_rot, mode == 2, y), wide, cos, sin,
                  out_shapes=[(T, H, K)])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # q and k in one launch (`rope.apply_rope_qk`, MLA's q tail and shared key): each the single launch's bits
    k_wide = _rand(T, 1, K + 2, seed=6)
    got_q, got_k = _run(lambda xd, kd, c, s_, y, y2: fused.rope_raw(xd[:, :, 4:], c, s_, n_rot, mode == 2, y,
                                                                    x2=kd[:, :, 2:], y2=y2),
                        wide, k_wide, cos, sin, out_shapes=[(T, H, K), (T, 1, K)])
    (alone_k,) = _run(lambda kd, c, s_, y: fused.rope_raw(kd[:, :, 2:], c, s_, n_rot, mode == 2, y), k_wide, cos, sin,
                      out_shapes=[(T, 1, K)])
    assert np.array_equal(got_q, got) and np.array_equal(got_k, alone_k)
    np.testing.assert_allclose(got_k, apply_rope(k_wide[:, :, 2:], cos, sin, n_rot, mode), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", [0, 2])
@pytest.mark.parametrize("with_w", [True, False])
def test_norm_rope(mode, with_w):
    """A head's rms_norm then its rotation in one launch (Qwen3's q / k norms) == rope.rms_norm_rope's NumPy
    statement (apply_rope of rms_norm), on a strided input (a gated q is a slice of a wider row), rows of other
    scales, n_rot < K (the rest copied normed); the norm as the norm kernel's (2e-6), the rotation as test_rope's."""
    from refengine.ops.norm import rms_norm as rms
    T, H, K, n_rot = (3, 16, 128, 64) if GPU else (2, 3, 10, 6)
    wide = _rand(T, H, 2 * K)
    wide[1] *= 1e-3
    x = wide[:, :, :K]
    w = _rand(K, seed=3) if with_w else None
    cos, sin = rope_cos_sin(np.arange(5, 5 + T), n_rot=n_rot, base=10000.0)
    want = apply_rope(rms(x, w, 1e-6), cos, sin, n_rot, mode)
    (got,) = _run(lambda xd, wd, c, s_, y: fused.norm_rope_raw(xd[:, :, :K], wd, 1e-6, c, s_, n_rot, mode == 2, y),
                  wide, w, cos, sin, out_shapes=[(T, H, K)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[..., n_rot:], rms(x, w, 1e-6)[..., n_rot:], rtol=2e-6, atol=0)
    # q and k in one launch (`rope.rms_norm_rope_qk`): k [T, Hk, K] by its own weight (or none); each the
    # single launch's numbers bit for bit
    Hk = 2 if GPU else 1
    k_wide = _rand(T, Hk, K + 3, seed=7)
    wk = _rand(K, seed=8) if with_w else None
    got_q, got_k = _run(lambda xd, wd, kd, wkd, c, s_, y, y2: fused.norm_rope_raw(
        xd[:, :, :K], wd, 1e-6, c, s_, n_rot, mode == 2, y, x2=kd[:, :, 3:], w2=wkd, y2=y2),
        wide, w, k_wide, wk, cos, sin, out_shapes=[(T, H, K), (T, Hk, K)])
    (alone_k,) = _run(lambda kd, wkd, c, s_, y: fused.norm_rope_raw(kd[:, :, 3:], wkd, 1e-6, c, s_, n_rot, mode == 2,
                                                                     y), k_wide, wk, cos, sin, out_shapes=[(T, Hk, K)])
    assert np.array_equal(got_q, got) and np.array_equal(got_k, alone_k)
    np.testing.assert_allclose(got_k, apply_rope(rms(k_wide[:, :, 3:], wk, 1e-6), cos, sin, n_rot, mode),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("mode", [0, 2])
def test_norm_rope_append(mode, norm):
    """q and k normed and rotated with k and v appended to a layer's cache, one launch (`gqa.rope_append`): q
    bit for bit the pair launch's (`norm_rope_raw`), the cache's new key rows its k, the value rows v (a strided view),
    at each cache's own device count, the rows around them untouched; both counts advanced by T and the ticket back
    to 0 (twice: the second append at the advanced counts). norm False (`gqa.rope_append`): q and k as the rotation
    launch (`rope_raw`) makes them, bit for bit."""
    T, H, Hk, K, V, n_rot, cap = (2, 16, 4, 128, 128, 64, 11) if GPU else (2, 3, 2, 10, 6, 6, 7)
    q, k = _rand(T, H, K, seed=1), _rand(T, Hk, K, seed=2)
    wq, wk = _rand(K, seed=3), _rand(K, seed=4)
    v_wide = _rand(T, Hk, V + 2, seed=5)
    cos, sin = rope_cos_sin(np.arange(3, 3 + T), n_rot=n_rot, base=10000.0)
    if norm:
        want_q, want_k = _run(lambda qd, wqd, kd, wkd, c, s_, y, y2: fused.norm_rope_raw(
            qd, wqd, 1e-6, c, s_, n_rot, mode == 2, y, x2=kd, w2=wkd, y2=y2), q, wq, k, wk, cos, sin,
            out_shapes=[(T, H, K), (T, Hk, K)])
    else:
        want_q, want_k = _run(lambda qd, kd, c, s_, y, y2: fused.rope_raw(qd, c, s_, n_rot, mode == 2, y, x2=kd, y2=y2),
                              q, k, cos, sin, out_shapes=[(T, H, K), (T, Hk, K)])
    kbuf0, vbuf0 = _rand(cap, Hk, K, seed=6), _rand(cap, Hk, V, seed=7)
    kb, vb = cuda.to_device(kbuf0), cuda.to_device(vbuf0)
    kc, vc = cuda.to_device(np.array([1], np.int64)), cuda.to_device(np.array([2], np.int64))
    done = cuda.to_device(np.zeros(1, np.int32))
    qd, kd, vd = cuda.to_device(q), cuda.to_device(k), cuda.to_device(v_wide)[:, :, 2:]
    wqd, wkd, cd, sd = (cuda.to_device(a) for a in (wq, wk, cos, sin))
    want_kb, want_vb = kbuf0.copy(), vbuf0.copy()
    for at_k, at_v in ((1, 2), (1 + T, 2 + T)):
        y = cuda.device_array((T, H, K), np.float32)
        fused.norm_rope_append_raw(qd, wqd, 1e-6, cd, sd, n_rot, mode == 2, y, kd, wkd, vd, kb, kc, vb, vc, done,
                                   norm=norm)
        cuda.synchronize()
        want_kb[at_k:at_k + T], want_vb[at_v:at_v + T] = want_k, v_wide[:, :, 2:]
        assert np.array_equal(y.copy_to_host(), want_q)
        assert np.array_equal(kb.copy_to_host(), want_kb) and np.array_equal(vb.copy_to_host(), want_vb)
        assert [kc.copy_to_host()[0], vc.copy_to_host()[0], done.copy_to_host()[0]] == [at_k + T, at_v + T, 0]


@pytest.mark.parametrize("inverse", [False, True])
def test_rope_tail(inverse):
    """DeepSeek-V4's rope of the last n_rot dims of a head (by -theta: inverse), the first ones copied, in one
    launch: == rope_tail.rotate_tail (as test_rope: the GPU contracts a product and a sum into an FMA), the copied
    dims bit for bit."""
    from refengine.attention.rope_tail import rotate_tail
    T, H, K, n_rot = (3, 64, 512, 64) if GPU else (2, 3, 10, 6)
    x = _rand(T, H, K)
    cos, sin = rope_cos_sin(np.arange(5, 5 + T), n_rot=n_rot, base=10000.0)
    (got,) = _run(lambda xd, c, s_, y: fused.rope_raw(xd, c, s_, n_rot, False, y, off=K - n_rot, inverse=inverse),
                  x, cos, sin, out_shapes=[(T, H, K)])
    np.testing.assert_allclose(got, rotate_tail(x, cos, sin, n_rot, inverse), rtol=1e-6, atol=1e-6)
    assert np.array_equal(got[..., :K - n_rot], x[..., :K - n_rot]) and not np.allclose(got, x)
    # DeepSeek-V4's queries and key in one launch (`TailRope.apply_pair`): each the single launch's bits
    kv = _rand(T, 1, K, seed=9)
    got_q, got_k = _run(lambda xd, kd, c, s_, y, y2: fused.rope_raw(xd, c, s_, n_rot, False, y, off=K - n_rot,
                                                                    inverse=inverse, x2=kd, y2=y2),
                        x, kv, cos, sin, out_shapes=[(T, H, K), (T, 1, K)])
    (alone,) = _run(lambda kd, c, s_, y: fused.rope_raw(kd, c, s_, n_rot, False, y, off=K - n_rot, inverse=inverse),
                    kv, cos, sin, out_shapes=[(T, 1, K)])
    assert np.array_equal(got_q, got) and np.array_equal(got_k, alone)


@pytest.mark.parametrize("yarn", [False, True])
def test_rope_cos_sin(yarn):
    """The tables at arbitrary positions (YaRN and frequency factors included) == rope.rope_cos_sin."""
    from refengine.ops.rope import yarn_mix
    n_rot, base, fs, ext = 64, 10000.0, (0.25 if yarn else 1.0), (1.0 if yarn else 0.0)
    pos = np.array([0, 3, 17, 4095, 100000][:5 if GPU else 3], dtype=np.int64)
    ff = np.linspace(1.0, 4.0, n_rot // 2).astype(np.float32)
    kw = dict(n_rot=n_rot, base=base, freq_scale=fs, ext_factor=ext, attn_factor=1.0, n_ctx_orig=4096,
              freq_factors=ff)
    want = rope_cos_sin(pos, **kw)
    keep, mix = yarn_mix(n_rot, 4096, base, 32.0, 1.0, ext) if yarn else (None, None)
    ms = np.float32(np.float32(1.0) * (1.0 + 0.1 * np.log(1.0 / fs))) if yarn else np.float32(1.0)
    ts = np.float32(base) ** np.float32(-2.0 / n_rot)
    got = _run(lambda p, f, kp, mx, c, s_: fused.rope_cos_sin_raw(p, ts, f, fs, kp, mx, ms, c, s_), pos, ff, keep, mix,
               out_shapes=[(len(pos), n_rot // 2)] * 2)
    # CUDA contracts YaRN's theta * keep + ext * mix into an fma: the mixed theta may differ by an ulp (float32) of
    # the larger term, the unscaled ext (freq_scale < 1), which moves cos / sin by up to that much times mscale
    # (> 1 with YaRN); and the float64 -> float32 rounding of the result by an ulp of it: allowed two of each. (The
    # H200 measured 1.8e-7 over a bound taken from the scaled theta's ulp without mscale; emulating the fma on the
    # host, fma(theta, keep, ext * mix) gives that same excess, and every contraction stays inside this bound.)
    theta_ext = pos[:, None] * np.float64(ts) ** np.arange(n_rot // 2) / ff
    for g, w in zip(got, want):
        tol = 2 * ms * np.spacing(np.abs(theta_ext).astype(np.float32)) + 2 * np.spacing(np.abs(w))
        assert np.all(np.abs(g - w) <= tol), float(np.max(np.abs(g - w) - tol))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T", [1, 3])
def test_attention(causal, T):
    """Scores, softmax and the weighted values in one launch == mha.attention_blocked under causal_mask / no_mask:
    grouped heads (H / Hkv = 2), the cache longer than the positions (rows past the query hidden by the mask), and a
    query at position 0 (one key)."""
    H, Hkv, K, V, S = (16, 2, 576, 512, 40) if GPU else (4, 2, 40, 6, 7)
    rng = np.random.default_rng(T)
    q, k = rng.standard_normal((T, H, K)).astype(np.float32), rng.standard_normal((S, Hkv, K)).astype(np.float32)
    v = rng.standard_normal((S, Hkv, V)).astype(np.float32)
    pos = np.arange(T) if T > 1 else np.array([0])
    scale = 1 / np.sqrt(K)
    want = attention_blocked(q, k, v, pos, scale, mask_fn=causal_mask if causal else no_mask)
    (got,) = _run(lambda qd, kd, vd, pd, out: fused.attention_raw(qd, kd, vd, pd, scale, causal,
                                                                  cuda.device_array((T * H, S), np.float32), out),
                  q, k, v, pos, out_shapes=[(T, H, V)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gathered", [False, True])
def test_attention_passes(gathered):
    """Longer rows than one round of the kernel's loops: keys over several rounds of four a warp (scores) and two a
    warp (values), a head dim with a column tail past the four-column steps, values over two column passes (the
    second short), every warp's partial sums added: == NumPy (dense causal, and gathered with dead slots)."""
    from refengine.attention.mha import attention_gathered
    H, Hkv, K, V, S, T = (8, 2, 576, 600, 300, 2) if GPU else (2, 1, 140, 150, 21, 2)
    rng = np.random.default_rng(7 + gathered)
    q, k = rng.standard_normal((T, H, K)).astype(np.float32), rng.standard_normal((S, Hkv, K)).astype(np.float32)
    v = rng.standard_normal((S, Hkv, V)).astype(np.float32)
    scale = 1 / np.sqrt(K)
    if gathered:
        idx = np.stack([rng.permutation(S) for _ in range(T)]).astype(np.int64)
        live = rng.uniform(size=(T, S)) < 0.8
        want = attention_gathered(q, k, v, idx, live, scale)
        (got,) = _run(lambda qd, kd, vd, idd, lv, out: fused.attention_raw(
            qd, kd, vd, cuda.to_device(np.zeros(T, np.int64)), scale, False, cuda.device_array((T * H, S), np.float32),
            out, idx=idd, live=lv), q, k, v, idx, live, out_shapes=[(T, H, V)])
    else:
        pos = np.array([S - 4, S - 1])
        want = attention_blocked(q, k, v, pos, scale, mask_fn=causal_mask)
        (got,) = _run(lambda qd, kd, vd, pd, out: fused.attention_raw(qd, kd, vd, pd, scale, True,
                                                                      cuda.device_array((T * H, S), np.float32), out),
                      q, k, v, pos, out_shapes=[(T, H, V)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["gqa", "passes"])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_rows(causal, case):
    """A prefill's attention in one launch (`_attention_rows`: a warp per query and head, online softmax over keys
    four at a time) == mha.attention_blocked under causal_mask / no_mask. "gqa": more heads to a key head than a
    block has warps (a second chunk, an idle warp), a head dim with a tail past the four-column steps, keys in the
    cache past the last query (hidden when causal), a key count not a multiple of four, a value width over 128 (the
    lanes' upper columns); "passes": values over two column passes (the second short), the first query at 0."""
    if case == "gqa":
        T, H, Hkv, K, V, S, p0 = (300, 32, 4, 136, 200, 333, 20) if GPU else (4, 6, 2, 40, 140, 11, 5)
    else:
        T, H, Hkv, K, V, S, p0 = (200, 16, 1, 576, 512, 200, 0) if GPU else (3, 2, 1, 8, 300, 3, 0)
    rng = np.random.default_rng(5 + causal)
    q, k = rng.standard_normal((T, H, K)).astype(np.float32), rng.standard_normal((S, Hkv, K)).astype(np.float32)
    v = rng.standard_normal((S, Hkv, V)).astype(np.float32)
    pos = np.arange(p0, p0 + T)
    scale = 1 / np.sqrt(K)
    mask_fn = causal_mask if causal else no_mask
    want = attention_blocked(q, k, v, pos, scale, mask_fn=mask_fn)
    (got,) = _run(lambda qd, kd, vd, pd, out: fused.attention_rows_raw(qd, kd, vd, pd, scale, causal, out),
                  q, k, v, pos, out_shapes=[(T, H, V)])
    # against the float64 statement: within four times NumPy's own float32 error on the same inputs (+ 1e-7). (Not
    # allclose to NumPy's float32 at atol 1e-6: at the GPU shapes NumPy's float32 is itself up to 1.9e-6 from
    # float64, and one element of 1.6 M differed from the kernel's by 1.06e-6, session 34 on an H100.)
    ref = attention_blocked(*(a.astype(np.float64) for a in (q, k, v)), pos, scale, mask_fn=mask_fn, dtype=np.float64)
    bound = 4 * float(np.max(np.abs(want - ref))) + 1e-7
    assert float(np.max(np.abs(got - ref))) <= bound, (float(np.max(np.abs(got - ref))), bound)


@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("T", [1, 3])
def test_attention_gathered(with_sinks, T):
    """Each query's n selected keys (idx, some slots dead, one query with every slot dead: NaN as NumPy, one with its
    live slots first and the rest dead: a fixed-shape selection's slots past the context, which the kernel skips),
    with and without DeepSeek-V4's sinks, in one launch == mha.attention_gathered."""
    from refengine.attention.mha import attention_gathered
    H, Hkv, K, V, S, n = (16, 1, 576, 512, 64, 24) if GPU else (4, 2, 20, 6, 9, 5)
    rng = np.random.default_rng(T + 10)
    q, k = rng.standard_normal((T, H, K)).astype(np.float32), rng.standard_normal((S, Hkv, K)).astype(np.float32)
    v = rng.standard_normal((S, Hkv, V)).astype(np.float32)
    idx = np.stack([rng.permutation(S)[:n] for _ in range(T)]).astype(np.int64)
    live = rng.uniform(size=(T, n)) < 0.7
    live[0, 0] = True
    if T > 1:
        live[1] = False
    if T > 2:
        live[2] = np.arange(n) < n // 3
    sinks = rng.standard_normal(H).astype(np.float32) if with_sinks else None
    scale = 1 / np.sqrt(K)
    want = attention_gathered(q, k, v, idx, live, scale, sinks=sinks)
    (got,) = _run(lambda qd, kd, vd, idd, lv, sk, out: fused.attention_raw(
        qd, kd, vd, cuda.to_device(np.zeros(T, np.int64)), scale, False, cuda.device_array((T * H, n), np.float32),
        out, idx=idd, live=lv, sinks=sk), q, k, v, idx, live, sinks, out_shapes=[(T, H, V)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_hyper_connections():
    """DeepSeek-V4's stream mixing: collapse, hc_post and the gates (Sinkhorn's 20 iterations), each one launch, ==
    residual/hyper_connections.py."""
    from refengine.residual import hyper_connections as hcm
    T, n, D = (3, 4, 4096) if GPU else (2, 4, 7)
    rng = np.random.default_rng(5)
    c = rng.standard_normal((T, n, n)).astype(np.float32) * 3
    X, pre, y = _rand(T, n, D), rng.uniform(size=(T, n)).astype(np.float32), _rand(T, D, seed=2)
    comb = hcm.sinkhorn(c, 20, 1e-6)
    (got,) = _run(fused.collapse_raw, X, pre, out_shapes=[(T, D)])
    np.testing.assert_allclose(got, hcm.collapse(X, pre), rtol=1e-6, atol=1e-6)
    (got,) = _run(fused.hc_post_raw, y, X, pre, comb, out_shapes=[(T, n, D)])
    np.testing.assert_allclose(got, hcm.hc_post(y, X, pre, comb), rtol=1e-6, atol=1e-6)
    M = (2 + n) * n                                       # a sub-layer's gates from its mixes, one launch
    m, base, scale = _rand(T, M, seed=3), _rand(M, seed=4, scale=0.5), np.array([0.7, 1.3, 2.1], np.float32)
    want = hcm.gates(m, scale, base, hcm.HCConfig(n, 20, 1e-6, 0.0))
    got = _run(lambda md, sd, bd, p, q, c: fused.hc_gates_raw(md, sd, bd, 20, 1e-6, p, q, c), m, scale, base,
               out_shapes=[(T, n), (T, n), (T, n, n)])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7)


def test_gated_streams():
    """Qwen3.8-Flash-Next's streams: the mixer's gated mean and the combiner, one launch each, ==
    residual/gated_streams.py (the streams in order; relative 1e-6: the kernels' exp against NumPy's). A stream
    dropped from the mean, or the combiner's 2 or its 1 / P left out, fails it."""
    from refengine.residual import gated_streams as gs
    T, P, D = (3, 4, 4096) if GPU else (2, 4, 7)
    xn, g = _rand(T, P, D), _rand(T, P, D, seed=2)
    R, out, inj = _rand(T, P, D, seed=3), _rand(T, D, seed=4), _rand(T, P, seed=5)
    (got,) = _run(lambda a, b, y: fused.gated_mean_raw(a, b, 1.0 / P, y), xn, g, out_shapes=[(T, D)])
    np.testing.assert_allclose(got, gs.gated_mean(xn, g), rtol=1e-6, atol=1e-6)
    (got,) = _run(lambda a, b, c, y: fused.streams_combine_raw(a, b, c, 1.0 / P, y), R, out, inj,
                  out_shapes=[(T, P, D)])
    np.testing.assert_allclose(got, gs.combine(R, out, inj), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("k", [1, 8, 40, 64])
def test_top_k(k):
    """The k largest of each row, descending, ties in index order, NaN after every number, -inf before NaN ==
    router.topk_desc (np.argsort(-x, kind="stable")[:, :k]); on a GPU also k = 40 (rows of 512) and 64 (rows of
    2048). Rows longer than the block (k = 8 on the simulator too): a thread owns several entries and picks again
    among its own after a pick takes its first (the tie at the top spans two entries of thread 3)."""
    from refengine.moe.router import topk_desc
    if k > 8 and not GPU:
        pytest.skip("the simulator's threads: k over 8 only on a GPU")
    R, E = (9, 2048 if k == 64 else 512) if GPU else (3, 40 if k == 1 else 600)
    x = _rand(R, E)
    x[0, 3] = x[0, 7] = x[0, 11] = 50.0                   # a tie at the top
    if E > 3 + fused.NT:
        x[0, 3 + fused.NT] = 50.0                         # (the same thread's next entry)
    x[1, :] = np.nan
    x[1, [2, 5]] = (-np.inf, 1.0)                         # one number, one -inf, NaNs: k = 8 reaches them
    x[2, ::2] = np.float32(0.25)                          # many ties
    want = topk_desc(x, k)
    ids = cuda.device_array((R, k), np.int32)
    fused.top_k_raw(cuda.to_device(x), k, ids)
    cuda.synchronize()
    assert np.array_equal(ids.copy_to_host(), want)


@pytest.mark.parametrize("clean_stable", [False, True])
@pytest.mark.parametrize("n, k", [(64, 2), (64, 8), (128, 24), (70, 90)])
def test_ggml_top_k_rows(n, k, clean_stable):
    """The k-pool indexer's selection kernel (libstdc++'s heap select replayed, a thread a row) == its statement
    ops/top_k.py `ggml_top_k_rows`, index for index: rows of many exact ties (scores 0 / 0.5 / 1 and -inf, as the
    indexer's sums of ReLUs give), a padded axis n longer than the row (entries past it -inf: n = 70 on 40 scores),
    k above n (the rest -1); clean_stable: rows without a tie at the k-th score ordered with ties by index (a row of
    distinct scores among them)."""
    from refengine.ops.top_k import ggml_top_k_rows
    rng = np.random.default_rng(n + k)
    T, N = 5, min(n, 40) if n == 70 else n
    x = rng.choice(np.array([0.0, 0.5, 1.0, -np.inf], np.float32), size=(T, N), p=[0.5, 0.2, 0.1, 0.2])
    x[1] = 0.0                                            # a row all tied
    x[2, N // 2:] = -np.inf                               # a row half past the visible pools
    x[3] = rng.permutation(N).astype(np.float32)          # distinct scores: a clean boundary
    x[3, :4] = x[3, 4]                                    # ... with a tie at the top
    nd = np.array([n], np.int64)
    want = ggml_top_k_rows(x, nd, k, clean_stable)
    out = cuda.device_array((T, k), np.int32)
    fused.ggml_top_k_rows_raw(cuda.to_device(x), cuda.to_device(nd), k, out, clean_stable=clean_stable)
    cuda.synchronize()
    assert np.array_equal(out.copy_to_host(), want)
    assert (want[:, min(k, n):] == -1).all() and (want[:, :min(k, n)] >= 0).all()


@pytest.mark.parametrize("r", [0, 2])
def test_gdn_gates(r):
    """beta, softplus(a + bias) and its product with A == gated_deltanet.decay_gates within the activations'
    tolerance (the softplus branch above 20 included), read from the fused projection (r = 2) or two arrays."""
    T, Hk = 3, 4
    Hv = Hk * 2
    src = _rand(T, Hk, 4, scale=8.0) if r else _rand(T, Hv, scale=8.0)
    src[0, 0] = 25.0
    a = None if r else _rand(T, Hv, seed=3, scale=8.0)
    bias, A = _rand(Hv, seed=4), -np.abs(_rand(Hv, seed=5))
    want = gdn_gates_np(src, a, r, bias, A)
    got = _run(lambda s_, a_, b_, A_, o1, o2, o3: fused.gdn_gates_raw(s_.reshape(T, -1) if r else s_, a_, r, b_, A_,
                                                                       o1, o2, o3),
               src, a, bias, A, out_shapes=[(T, Hv)] * 3)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-30)                       # beta
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=2.5e-7)                      # softplus's ulp of exp
    np.testing.assert_allclose(got[2], want[2], rtol=1e-6, atol=2.5e-7 * float(np.max(np.abs(A))))   # (times A)


@pytest.mark.parametrize("lb", [None, 5.0])
def test_kda_gates(lb):
    """A KDA layer's log decay and beta in one launch == kda.gates' NumPy statement (gate_decay of z + dt_bias:
    softplus(.) * A, its branch above 20 included, or Kimi-K3's lb * sigmoid(-(A * .)); sigmoid(b)), within the
    activations' tolerance."""
    from refengine.attention.kda import gates
    T, H, dh = (5, 32, 128) if GPU else (3, 4, 6)
    z, b = _rand(T, H * dh, scale=8.0), _rand(T, H, seed=2, scale=8.0)
    z[0, 0] = 40.0
    bias, A = _rand(H * dh, seed=4), -np.abs(_rand(H, seed=5))
    want_g, want_b = gates(z, b, bias, A, dh, lb)
    g, beta = _run(lambda z_, b_, bi, A_, o1, o2: fused.kda_gates_raw(z_, b_, bi, A_, dh, lb, o1, o2), z, b, bias, A,
                   out_shapes=[(T, H, dh), (T, H)])
    np.testing.assert_allclose(beta, want_b, rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(g, want_g, rtol=1e-6, atol=2.5e-7 * float(np.max(np.abs(A))) * (lb or 1.0))
    assert np.array_equal(g[0, 0, 0], want_g[0, 0, 0])                           # (softplus above 20: z itself)


@pytest.mark.parametrize("act", ["silu", "sigmoid"])
@pytest.mark.parametrize("with_w", [True, False])
def test_rms_norm_gated(act, with_w):
    """rms_norm(x, w) * act(gate) in one launch (a warp a row) == norm.rms_norm_gated's NumPy statement, on a gate
    whose rows lie apart (z is a slice of a wider projection), rows not a whole number of blocks."""
    from refengine.ops.norm import rms_norm_gated
    R, Dx = (4099, 128) if GPU else (11, 40)
    x = _rand(R, Dx)
    x[1] *= 1e-3
    gate_wide = _rand(R, Dx + 7, seed=3)
    w = _rand(Dx, seed=1) if with_w else None
    want = rms_norm_gated(x, w, 1e-6, gate_wide[:, :Dx], act)
    (got,) = _run(lambda xd, gd, wd, y: fused.rms_norm_raw(xd, wd, 1e-6, y, gate2=gd[:, :Dx], act=act),
                  x, gate_wide, w, out_shapes=[x.shape])
    np.testing.assert_allclose(got, want, rtol=4e-6, atol=0)


@pytest.mark.parametrize("E,G,n", [(64, 8, 3), (16, 4, 2), (80, 40, 5)])
def test_group_limited(E, G, n):
    """== router.group_limited bit for bit, chosen groups included: a group's score the sum of its two largest
    (NaN after numbers: a group with one number scores NaN, one of -inf and a number the number's sum with -inf),
    ties between groups in index order; 40 groups: a lane holds two."""
    R = 5
    x = _rand(R, E, scale=2.0)
    GS = E // G
    x[0, :GS] = x[0, GS:2 * GS] = np.float32(1.5)             # two tied groups
    x[1, :GS] = np.nan
    x[1, 0] = 3.0                                              # one number among NaNs: NaN
    x[1, GS:2 * GS] = -np.inf                                  # all -inf: -inf
    x[2, ::2] = np.float32(0.25)                               # many ties
    x[3, GS - 1] = np.inf
    x[3, GS - 2] = -np.inf                                     # inf + -inf: NaN
    x[4, :] = np.nan                                           # NaN groups; group 1 all -inf, ranked first; group 0
    x[4, GS:2 * GS] = -np.inf                                  # one number: NaN, second (as -inf it would tie with
    x[4, 0] = 1.0                                              # group 1 and come first)
    want_m, want_g = group_limited_np(x, G, n)
    out = cuda.device_array((R, E), np.float32)
    groups = cuda.device_array((R, n), np.int32)
    fused.group_limited_raw(cuda.to_device(x), G, n, out, groups)
    cuda.synchronize()
    assert np.array_equal(groups.copy_to_host(), want_g)
    assert np.array_equal(out.copy_to_host(), want_m, equal_nan=True)


@pytest.mark.parametrize("bad", [None, np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("at", [0, -1])
@pytest.mark.parametrize("n", [1, 3, fused.FLAG_BATCH])
def test_all_finite_many(bad, at, n):
    """One launch over n arrays of different sizes: page.flat[cell] becomes False exactly for the array that holds
    NaN/inf (its first or last element); the other arrays' cells and the cells no array names stay True."""
    rng = np.random.default_rng(n)
    ys = [_rand(int(rng.integers(1, 3 * 256 * 8))) for _ in range(n)]
    j = n // 2
    if bad is not None:
        ys[j][at] = bad
    cells = [2 * i + 1 - (i % 2) for i in range(n)]           # rows i, the columns alternating
    page = cuda.to_device(np.ones((FLAG_ROWS, 2), dtype=bool))
    fused.all_finite_many_raw([cuda.to_device(y) for y in ys], page.reshape(FLAG_ROWS * 2), cells)
    cuda.synchronize()
    want = np.ones(FLAG_ROWS * 2, dtype=bool)
    for y, c in zip(ys, cells):
        want[c] = bool(np.all(np.isfinite(y)))
    assert np.array_equal(page.copy_to_host().reshape(-1), want)


FLAG_ROWS = 20


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_attention_gathered_entry_takes_a_prefill(monkeypatch):
    """The entry point on device arrays takes a prefill's queries (DeepSeek-V4's shapes: 64 heads, keys of 512, the
    window's 128 and 512 selected), in launches of at most ATTN_MAX_SCRATCH scores (shrunk here: 3 launches, the
    last one short) == mha.attention_gathered on the host."""
    pytest.importorskip("cupy")
    from refengine.attention.mha import attention_gathered
    from refengine.devarray import Device
    T, H, K, S, n = 77, 64, 512, 700, 640
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((T, H, K)).astype(np.float32), rng.standard_normal((S, 1, K)).astype(np.float32)
    idx = np.stack([rng.permutation(S)[:n] for _ in range(T)]).astype(np.int64)
    live = rng.uniform(size=(T, n)) < 0.8
    sinks = rng.standard_normal(H).astype(np.float32)
    want = attention_gathered(q, k, k, idx, live, 1 / np.sqrt(K), sinks=sinks)
    monkeypatch.setattr(fused, "ATTN_MAX_SCRATCH", 30 * H * n)
    monkeypatch.setattr(fused, "GATHERED_PREFILL", "fused")
    dev = Device("cupy")
    got = fused.attention_gathered(*(dev.put(a) for a in (q, k, k, idx, live)), 1 / np.sqrt(K), sinks)
    np.testing.assert_allclose(dev.get(got), want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["qwen3next", "kimi-linear", "deepseek2"])
def test_ops_take_the_kernels_on_a_gpu(synth_model, arch):
    """On a GPU the ops reach the kernels through `Device.fused`: a resident forward with them equals NumPy's
    (rel-RMS <= 1e-5, same argmax) and the one without them (ops as NumPy states them, on the device) to the same
    tolerance; the flags of a step are written by the flag kernel."""
    pytest.importorskip("cupy")
    from refengine.model import Model
    from refengine.runtime import Runtime
    m = Model(synth_model(arch, wtype="Q8_0"))
    ids = [3, 9, 27, 81, 5]
    ref = m.forward(ids, m.new_state(), rt=Runtime())
    on = Runtime(backend="cuda")
    off = Runtime(backend="cuda")
    off.device.fused = None
    with on.device.recording() as ops_on:
        y_on = m.forward(ids, m.new_state(), rt=on)
    with off.device.recording() as ops_off:
        y_off = m.forward(ids, m.new_state(), rt=off)
    rel = lambda a, b: float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))     # noqa: E731
    for y in (y_on, y_off):
        assert rel(y, ref) <= 1e-5 and np.array_equal(np.argmax(y, -1), np.argmax(ref, -1))
    assert any(op.startswith("fused rms_norm") for op, _, _ in ops_on)
    assert len(ops_on) < len(ops_off)


def test_ops_reach_their_kernels_with_the_entries_arguments(synth_model):
    """Every call site of a fused kernel (ops/, attention/, moe/, residual/) passes the arguments its entry point
    takes, and a resident forward through stand-ins that compute the ops' own NumPy functions equals the forward
    without them bit for bit (so the dispatch adds nothing of its own); across the archs every kernel is reached.
    What runs on a GPU is checked by test_ops_take_the_kernels_on_a_gpu."""
    from refengine.model import Model
    from refengine.runtime import Runtime
    hits = {}
    for arch in ["qwen3next", "kimi-k3", "deepseek4", "glm-dsa", "deepseek2", "kimi-linear", "qwen4exp", "deepseek32",
                 "llama", "qwen3moe", "glm5-next", "deepseek2:tiny-groups", "qwen3moe:tiny:eager"]:
        arch, _, preset = arch.partition(":")
        preset, _, eager = preset.partition(":")          # eager: not at fixed shapes (q / k norms apart from the
        m = Model(synth_model(arch, wtype="Q8_0", preset=preset or "tiny"))    # cache write: `norm_rope`)
        rts = [Runtime(resident=True, fixed_shapes=not eager) for _ in range(2)]
        stand = rts[1].device.fused = StandIn(rts[1].device)
        outs = []
        for rt in rts:
            st = m.new_state()
            outs.append([m.forward([3, 9, 27], st, rt=rt), m.forward([5], st, rt=rt)])
        for a, b in zip(*outs):
            assert np.array_equal(a, b), arch
        for k, v in stand.hits.items():
            hits[k] = hits.get(k, 0) + v
    # group_limited alone serves softmax group routing (DeepSeek-V2), which no tiny preset has: sigmoid group routing
    # (tiny-groups) is route_sigmoid's; its kernel and entry: test_group_limited, test_entries_on_numpy_arrays
    want = (set(numpy_twins()) | {"all_finite_many"}) - {"group_limited"}
    assert set(hits) == want, (sorted(want - set(hits)), sorted(set(hits) - want))


@pytest.mark.parametrize("one_block", [True, False])
def test_append_rows(monkeypatch, one_block):
    """`cache.Rows.append`'s fixed-shape write: rows written at the device count, the rows around them untouched;
    one block also advances the count (else the caller does, and the count is left as it was)."""
    if not one_block:
        monkeypatch.setattr(fused, "APPEND_ONE_BLOCK", 8)          # more values than that: the grid-wide form
    cap, W, n0 = 9, 100, 4
    rng = np.random.default_rng(2)
    buf0, x = _rand(cap, W), rng.standard_normal((3, W)).astype(np.float32)
    bd, xd, cd = cuda.to_device(buf0), cuda.to_device(x), cuda.to_device(np.array([n0], np.int64))
    advanced = fused.append_rows_raw(bd, xd, cd)
    cuda.synchronize()
    want = buf0.copy()
    want[n0:n0 + 3] = x
    assert advanced == one_block
    assert np.array_equal(bd.copy_to_host(), want)
    assert cd.copy_to_host()[0] == (n0 + 3 if one_block else n0)
    # two caches (k and v) in one launch, each at its own count; the second's rows a strided view (a column block
    # of a stacked product)
    W2 = 7
    buf2, x2w = _rand(cap, W2, seed=4), rng.standard_normal((3, W2 + 5)).astype(np.float32)
    bd, cd = cuda.to_device(buf0), cuda.to_device(np.array([n0], np.int64))
    bd2, cd2 = cuda.to_device(buf2), cuda.to_device(np.array([n0 + 1], np.int64))
    xd2 = cuda.to_device(x2w)[:, 5:]
    advanced = fused.append_rows_raw(bd, xd, cd, second=(bd2, xd2, cd2))
    cuda.synchronize()
    want2 = buf2.copy()
    want2[n0 + 1:n0 + 4] = x2w[:, 5:]
    assert advanced == one_block
    assert np.array_equal(bd.copy_to_host(), want) and np.array_equal(bd2.copy_to_host(), want2)
    assert [cd.copy_to_host()[0], cd2.copy_to_host()[0]] == ([n0 + 3, n0 + 4] if one_block else [n0, n0 + 1])


@pytest.mark.parametrize("ratio,c", [(4, 2), (4, 1), (8, 1)])
def test_pool_at(ratio, c):
    """DeepSeek-V4's compressed blocks pooled in one launch == kv_compressor.pool_blocks_at's NumPy statement: block
    0 of the overlapping compressor (its previous block's weight 0), a block inside the buffer, one whose rows run
    past its end (clamped to the last row), scores with -inf rows."""
    from refengine.attention.kv_compressor import pool_blocks_at
    K = 64 if GPU else 6
    S = 3 * ratio + 2
    rng = np.random.default_rng(5)
    kv, score = (rng.standard_normal((S, c * K)).astype(np.float32) for _ in range(2))
    score[ratio + 1, :] = -np.inf
    b = np.array([0, 1, 3, 2], np.int64)
    want = pool_blocks_at(kv, score, b, ratio, c, K)
    (got,) = _run(lambda kd, sd, bd, y: fused.pool_at_raw(kd, sd, bd, ratio, c, K, y), kv, score, b,
                  out_shapes=[(4, K)])
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("norm_w,scale", [(False, None), (True, None), (True, 2.5), (False, 16.0)])
def test_expert_weights(norm_w, scale):
    """The selected probs, normalized by their float64 sum clamped at 2^-14, scaled, in one launch ==
    moe.router.expert_weights step by step: a row of tiny probs (the clamp) and a row holding NaN (stays NaN)."""
    from refengine.moe.router import GATING_SOFTMAX, expert_weights, topk_desc
    T, E, A = (70, 256, 8) if GPU else (5, 24, 4)
    rng = np.random.default_rng(3)
    probs = rng.uniform(size=(T, E)).astype(np.float32)
    probs /= probs.sum(-1, keepdims=True)
    probs[1] *= np.float32(1e-9)
    ids = topk_desc(probs, A)
    probs[2, ids[2, 1]] = np.nan
    want = expert_weights(probs, ids, gating=GATING_SOFTMAX, norm_w=norm_w, w_scale=scale or 0.0)
    out = cuda.device_array((T, A), np.float32)
    fused.expert_weights_raw(cuda.to_device(probs), cuda.to_device(ids), norm_w, scale, out)
    got = out.copy_to_host()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got[2]).any()


@pytest.mark.parametrize("norm_w,scale,path", [(False, None, "warps"), (True, 2.5, "warps"), (True, 2.5, "block"),
                                               (False, None, "block"), (True, None, "warps4")])
def test_route_softmax(norm_w, scale, path):
    """Softmax routing in one launch (softmax, its k largest, their weights) == moe.router.route with softmax gating:
    the ids equal (a tie at the top, one of it the same lane's / thread's next entry, rows longer than the block), a
    row holding NaN (NaN probs and weights, the picks in index order), the probs and weights as the three kernels'
    tests hold theirs. path: a warp a row (E <= ROUTE_WARP_E, k <= 32: a decode step's router; warps4: a row that
    takes the kernel whose lanes hold 4 entries, E not a multiple of 32) or a block a row."""
    from refengine.moe.router import GATING_SOFTMAX, route
    if path == "warps4":
        T, E, k = (9, 100, 8) if GPU else (3, 100, 3)
        assert fused.route_rwe(E) == 4
    elif path == "warps":
        T, E, k = (9, fused.ROUTE_WARP_E, 10) if GPU else (3, 300, 3)
    else:
        T, E, k = (9, 3 * fused.ROUTE_WARP_E // 2, 10) if GPU else (3, fused.ROUTE_WARP_E + 1, 3)
    assert (E <= fused.ROUTE_WARP_E) == path.startswith("warps")
    x = _rand(T, E, scale=3.0)
    x[0, [i for i in (5, 9, 5 + 32, 5 + fused.NT) if i < E]] = np.float32(8.0)   # a tie at the top: lane 5's next,
    # thread 5's next
    x[1, 7] = np.nan
    want_ids, want_w = route(x, k, gating=GATING_SOFTMAX, norm_w=norm_w, w_scale=scale or 0.0)
    probs, ids, w = (cuda.device_array((T, E), np.float32), cuda.device_array((T, k), np.int32),
                     cuda.device_array((T, k), np.float32))
    fused.route_softmax_raw(cuda.to_device(x), k, norm_w, scale, probs, ids, w)
    cuda.synchronize()
    assert np.array_equal(ids.copy_to_host(), want_ids) and list(want_ids[1]) == list(range(k))
    np.testing.assert_allclose(w.copy_to_host(), want_w, rtol=2e-6, atol=0)      # (NaN where NaN: assert_allclose)
    np.testing.assert_allclose(probs.copy_to_host(), softmax(x), rtol=2e-6, atol=0)
    assert np.isnan(w.copy_to_host()[1]).all()


@pytest.mark.parametrize("with_bias,norm_w,scale,grouped,wide", [
    (True, True, 2.5, False, False), (False, False, None, False, False), (True, False, None, False, False),
    (True, True, 2.5, True, False), (True, True, 2.5, False, True), (True, True, None, False, "narrow")])
def test_route_sigmoid(with_bias, norm_w, scale, grouped, wide):
    """Sigmoid routing in one launch (sigmoid, the biased selection, with groups the best groups kept, its k
    largest, the unbiased weights) == moe.router.route with sigmoid gating: the ids equal (a tie at the top, rows
    longer than the block), the selection bit for bit from the probs (one float32 add), the kept groups and the
    masked selection as router.group_limited gives them, probs and weights as the kernels' tests hold theirs. Without
    groups a row of at most ROUTE_WARP_E takes a warp (`_route_sigmoid_warps`); wide: a longer row, a block;
    "narrow": a row of 40, the kernel whose lanes hold 2 entries."""
    from refengine.moe.router import GATING_SIGMOID, route
    T, E, k = (9, 512, 8) if GPU else (3, 300, 3)
    if wide == "narrow":
        E = 40
        assert fused.route_rwe(E) == 2
    elif wide:
        E = 3 * fused.ROUTE_WARP_E // 2 if GPU else fused.ROUTE_WARP_E + 1
    G, n_used = ((8, 3) if GPU else (6, 2)) if grouped else (0, 0)
    x = _rand(T, E, scale=3.0)
    tie = [i for i in (5, 9, 5 + 32, 5 + fused.NT) if i < E]     # a tie at the top: lane 5's next, thread 5's next
    x[0, tie] = np.float32(8.0)
    bias = _rand(E, seed=3, scale=0.1) if with_bias else None
    if with_bias:
        bias[tie] = 0.0
    rec = {}
    want_ids, want_w = route(x, k, gating=GATING_SIGMOID, bias=bias, norm_w=norm_w, w_scale=scale or 0.0,
                             n_groups=G, n_group_used=n_used, record=lambda n, il, v: rec.__setitem__(n, v))
    probs, sel, ids, w = (cuda.device_array((T, E), np.float32), cuda.device_array((T, E), np.float32),
                          cuda.device_array((T, k), np.int32), cuda.device_array((T, k), np.float32))
    masked, groups = cuda.device_array((T, E), np.float32), cuda.device_array((T, max(n_used, 1)), np.int32)
    fused.route_sigmoid_raw(cuda.to_device(x), k, None if bias is None else cuda.to_device(bias), norm_w, scale,
                            probs, sel, ids, w, G=G, n_used=n_used, masked=masked, groups=groups)
    cuda.synchronize()
    assert np.array_equal(ids.copy_to_host(), want_ids)
    if grouped:                                          # (the masked selection of the kernel's own selection)
        from refengine.moe.router import group_limited
        assert np.array_equal(groups.copy_to_host(), rec["ffn_moe_group_topk"])
        assert np.array_equal(masked.copy_to_host(), group_limited(sel.copy_to_host(), G, n_used))
    np.testing.assert_allclose(w.copy_to_host(), want_w, rtol=2e-6, atol=0)
    p = probs.copy_to_host()
    np.testing.assert_allclose(p, sigmoid(x), rtol=1e-6, atol=1e-30)
    assert np.array_equal(sel.copy_to_host(), p if bias is None else p + bias[None, :])


@pytest.mark.skipif(not qc.SIM, reason="the simulator's arrays stand in for CuPy's (on a GPU: the tests above)")
def test_entries_on_numpy_arrays(monkeypatch):
    """The entry points of this session's kernels as the modules call them (DeviceArrays in, DeviceArrays out),
    run in the simulator with NumPy arrays standing in for CuPy's: add_rms_norm, l2_norm, group_limited, gdn_gates,
    hc_gates, rope_tail, attention_gathered (a prefill's queries in several launches) and all_finite_many give what
    their NumPy statements give (the sum and the groups bit for bit)."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from refengine.devarray import Device
    from refengine.moe.router import group_limited
    monkeypatch.setattr(fused, "_nv", lambda a: a if a is None or isinstance(a, FakeCUDAArray) else FakeCUDAArray(a))
    monkeypatch.setattr(fused, "_stream", lambda: 0)
    dev = Device("sim")
    x, a, w = _rand(3, 40), _rand(3, 40, seed=2), _rand(40, seed=1)
    s_, y = fused.add_rms_norm(dev.wrap(x), dev.wrap(a), w, 1e-6)
    want_s, want_y = add_rms_norm(x, a, w, 1e-6)
    assert np.array_equal(s_.raw, want_s)
    np.testing.assert_allclose(y.raw, want_y, rtol=2e-6, atol=0)
    # a MoE layer's slots (and shared experts' output) summed into the residual add and the norm; a shape it does
    # not take (slots of other rows) declined
    sl, ex = _rand(3, 4, 40, seed=3), _rand(3, 40, seed=4)
    for e in (ex, None):
        s_, y = fused.add_slots_rms_norm(dev.wrap(x), dev.wrap(sl), None if e is None else dev.wrap(e), w, 1e-6)
        want_s, want_y = add_slots_rms_norm(x, sl, e, w, 1e-6)
        assert np.array_equal(s_.raw, want_s)
        np.testing.assert_allclose(y.raw, want_y, rtol=2e-6, atol=0)
    assert fused.add_slots_rms_norm(dev.wrap(x), dev.wrap(sl[:2]), None, w, 1e-6) is None
    # Qwen3.8-Flash-Next's gated streams: the mean (of a gate viewed [T, P, D] from its product) and the combiner
    from refengine.residual import gated_streams as gs
    xs, gz, os_, ij = _rand(2, 4, 8, seed=6), _rand(2, 32, seed=7), _rand(2, 8, seed=8), _rand(2, 4, seed=9)
    np.testing.assert_allclose(fused.gated_mean(dev.wrap(xs), dev.wrap(gz).reshape(2, 4, 8)).raw,
                               gs.gated_mean(xs, gz.reshape(2, 4, 8)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(fused.streams_combine(dev.wrap(xs), dev.wrap(os_), dev.wrap(ij)).raw,
                               gs.combine(xs, os_, ij), rtol=1e-6, atol=1e-6)
    assert fused.streams_combine(dev.wrap(xs), dev.wrap(os_), dev.wrap(ij[:, :2])) is None
    q = _rand(2, 3, 16)
    np.testing.assert_allclose(fused.l2_norm(dev.wrap(q), 1e-6).raw, delta_rule.l2_norm(q, 1e-6), rtol=2e-6, atol=0)
    sc = _rand(2, 16)
    masked, groups = fused.group_limited(dev.wrap(sc), 4, 2)
    rec = {}
    assert np.array_equal(masked.raw, group_limited(sc, 4, 2, record=lambda n, il, v: rec.__setitem__(n, v)))
    assert np.array_equal(groups.raw, rec["ffn_moe_group_topk"])
    ba, bias, A = _rand(2, 3, 4), _rand(6, seed=4), -np.abs(_rand(6, seed=5))
    for got, want in zip(fused.gdn_gates(dev.wrap(ba), None, 2, bias, A), gdn_gates_np(ba, None, 2, bias, A)):
        np.testing.assert_allclose(got.raw, want, rtol=1e-6, atol=1e-6)
    # KDA's gates (ssm_a as the file shapes it, [H, 1]); the gated norm of a head's rows, declined for longer rows
    from refengine.attention.kda import gates
    from refengine.ops.norm import rms_norm_gated
    z, bk, dtb, Ak = _rand(2, 12), _rand(2, 3, seed=2), _rand(12, seed=3), -np.abs(_rand(3, 1, seed=4))
    for lb in (None, 5.0):
        for got, want in zip(fused.kda_gates(dev.wrap(z), dev.wrap(bk), dtb, Ak, 4, lb), gates(z, bk, dtb, Ak, 4, lb)):
            np.testing.assert_allclose(got.raw, want, rtol=1e-6, atol=1e-6)
    xo, go = _rand(2, 3, 16), _rand(2, 3, 16, seed=5)
    for act in ("silu", "sigmoid"):
        np.testing.assert_allclose(fused.rms_norm_gated(dev.wrap(xo), w[:16], 1e-6, dev.wrap(go), act).raw,
                                   rms_norm_gated(xo, w[:16], 1e-6, go, act), rtol=4e-6, atol=0)
    xl = _rand(2, fused.WARP_ROW_MAX_D + 1)
    assert fused.rms_norm_gated(dev.wrap(xl), None, 1e-6, dev.wrap(xl), "silu") is None
    # the sigmoid router (a bias as the file has it: a host vector; and none), through router.route's dispatch
    from refengine.moe.router import GATING_SIGMOID, route
    lg, eb = _rand(3, 40, seed=6), _rand(40, seed=7, scale=0.1)
    monkeypatch.setattr(dev, "fused", fused)                 # (route's fused_op reaches the entries)
    calls, real = [], fused.route_sigmoid
    monkeypatch.setattr(fused, "route_sigmoid", lambda *a: calls.append(a[2] is None) or real(*a))
    for b in (eb, None):
        got = route(dev.wrap(lg), 4, gating=GATING_SIGMOID, bias=b, norm_w=True, w_scale=2.5)
        want = route(lg, 4, gating=GATING_SIGMOID, bias=b, norm_w=True, w_scale=2.5)
        assert np.array_equal(got[0].raw, want[0])
        np.testing.assert_allclose(got[1].raw, want[1], rtol=2e-6, atol=0)
    assert calls == [False, True]                            # the kernel took both (a bias, then none)
    lg = _rand(3, 48, seed=8)                                # group routing (8 groups of 6, 3 kept): one launch too
    rec_got, rec_want = {}, {}
    got = route(dev.wrap(lg), 4, gating=GATING_SIGMOID, bias=eb[:1].repeat(48), norm_w=True, n_groups=8,
                n_group_used=3, record=lambda n, il, v: rec_got.__setitem__(n, v))
    want = route(lg, 4, gating=GATING_SIGMOID, bias=eb[:1].repeat(48), norm_w=True, n_groups=8, n_group_used=3,
                 record=lambda n, il, v: rec_want.__setitem__(n, v))
    assert len(calls) == 3 and np.array_equal(got[0].raw, want[0])
    np.testing.assert_allclose(got[1].raw, want[1], rtol=2e-6, atol=0)
    assert np.array_equal(rec_got["ffn_moe_group_topk"].raw, rec_want["ffn_moe_group_topk"])
    for name in ("ffn_moe_probs_masked", "ffn_moe_probs_biased"):              # (the sigmoid's exp: an ulp)
        np.testing.assert_allclose(rec_got[name].raw, rec_want[name], rtol=1e-6, atol=0, err_msg=name)
    monkeypatch.setattr(dev, "fused", None)
    from refengine.attention.mha import attention_gathered
    from refengine.attention.rope_tail import rotate_tail
    from refengine.residual import hyper_connections as hcm
    mx, base, scale = _rand(2, 24, seed=6), _rand(24, seed=7, scale=0.5), np.array([0.7, 1.3, 2.1], np.float32)
    for got, want in zip(fused.hc_gates(dev.wrap(mx), scale, base, 4, 20, 1e-6),
                         hcm.gates(mx, scale, base, hcm.HCConfig(4, 20, 1e-6, 0.0))):
        np.testing.assert_allclose(got.raw, want, rtol=2e-6, atol=1e-7)
    xr = _rand(2, 3, 10)
    cs = rope_cos_sin(np.arange(2), n_rot=6, base=10000.0)
    for inverse in (False, True):
        np.testing.assert_allclose(fused.rope_tail(dev.wrap(xr), *map(dev.wrap, cs), 6, inverse).raw,
                                   rotate_tail(xr, *cs, 6, inverse), rtol=1e-6, atol=1e-6)
    T, H, S, n = 5, 2, 9, 4                              # a prefill's queries in launches of 2, 2 and 1
    rng = np.random.default_rng(8)
    qg, kg = _rand(T, H, 6, seed=9), _rand(S, 1, 6, seed=10)
    idx = np.stack([rng.permutation(S)[:n] for _ in range(T)]).astype(np.int64)
    live = rng.uniform(size=(T, n)) < 0.8
    live[:, 0] = True
    monkeypatch.setattr(fused, "ATTN_MAX_SCRATCH", 2 * H * n)
    got = fused.attention_gathered(*map(dev.wrap, (qg, kg, kg, idx, live)), 0.4, None)
    np.testing.assert_allclose(got.raw, attention_gathered(qg, kg, kg, idx, live, 0.4), rtol=1e-5, atol=1e-6)
    # more than ATTN_MAX_T queries (a prefill): declined where the device multiplies activations in the library
    # ("batched": mha's NumPy blocks run), taken under "fused" and where a capture's products are the kernel's
    T = fused.ATTN_MAX_T + 3
    qg = _rand(T, H, 6, seed=11)
    idx = np.stack([rng.permutation(S)[:n] for _ in range(T)]).astype(np.int64)
    live = rng.uniform(size=(T, n)) < 0.8
    live[:, 0] = True
    args = lambda: (*map(dev.wrap, (qg, kg, kg, idx, live)), 0.4, None)             # noqa: E731
    assert fused.GATHERED_PREFILL == "batched" and fused.attention_gathered(*args()) is None
    for gp, products in (("fused", "library"), ("batched", "kernel")):
        monkeypatch.setattr(dev, "gathered_prefill", gp)
        monkeypatch.setattr(dev, "products", products)
        want = attention_gathered(qg, kg, kg, idx, live, 0.4)
        np.testing.assert_allclose(fused.attention_gathered(*args()).raw, want, rtol=1e-5, atol=1e-6)
    # a prefill's dense attention (more than ATTN_MAX_T queries): `_attention_rows` under "auto" (the default) for
    # heads of at most ROWS_MAX_K dims and under "rows" for any, declined under "batched" (mha's NumPy blocks run) and
    # under "auto" for wider heads
    T = fused.ATTN_MAX_T + 2
    qa, ka, va = _rand(T, 4, 6, seed=12), _rand(T + 3, 2, 6, seed=13), _rand(T + 3, 2, 5, seed=14)
    pos = np.arange(3, T + 3)
    args = lambda: (*map(dev.wrap, (qa, ka, va, pos)), 0.4, True)                   # noqa: E731
    assert fused.PREFILL_ATTENTION == "auto" and dev.prefill_attention is None
    np.testing.assert_allclose(fused.attention_causal(*args()).raw, attention_blocked(qa, ka, va, pos, 0.4),
                               rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(dev, "prefill_attention", "batched")
    assert fused.attention_causal(*args()) is None
    monkeypatch.setattr(fused, "ROWS_MAX_K", 5)                                      # heads of 6 dims: wide
    for choice, taken in (("auto", False), ("rows", True)):
        monkeypatch.setattr(dev, "prefill_attention", choice)
        assert (fused.attention_causal(*args()) is not None) == taken, choice
    page = np.ones((4, 2), dtype=bool)
    ys = [dev.wrap(_rand(5)), dev.wrap(np.array([1.0, np.nan], np.float32)), dev.wrap(np.zeros(3, np.int32))]
    assert fused.all_finite_many(ys, page, [0, 3, 5]) == [True, True, False]       # (int32: not taken)
    assert page.reshape(-1).tolist() == [True, True, True, False, True, True, True, True]
