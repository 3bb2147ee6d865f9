"""refengine/ops/products.py (NumPy's matmul and einsum written as one batched product, for a captured decode step on
the GPU, where CuPy cannot call cuBLAS) and its kernel quant/cuda/bmm.py:

- every einsum the modules write (grep'd from refengine/: 16 subscripts, one with three operands) and matmul's
  broadcasting and 1-D cases, lowered onto NumPy's own matmul as the batched product: equal to np.einsum /
  np.matmul within float32 summation order (rel-RMS <= 1e-6), shapes and dtypes equal;
- the kernel in numba's CUDA simulator (toy sizes) against NumPy, float32 and float64;
- malformed subscripts are refused with the subscripts named.
"""
import numpy as np
import pytest

from numerics import rel_rms
from refengine.ops import products

SUBSCRIPTS = ["hk,hkv->hv", "htc,tsc->ths", "hti,hoi->hto", "hts,hsv->htv", "hts,sk->htk", "ngts,snv->ngtv",
              "shk,hsv->hkv", "tc,hcn->thn", "thd,bd->thb", "thd,nd->thn", "thi,tshi,shi->hts", "thk,hkv->htv",
              "thk,sk->hts", "ths,th->ts", "ths,tsc->htc", "tngk,snk->ngts"]
SIZES = dict(h=3, k=5, v=4, t=2, c=6, s=7, i=5, o=3, n=2, g=2, d=4, b=3)


def np_bmm(a, b):
    assert a.ndim == b.ndim == 3 and a.shape[0] == b.shape[0] and a.shape[2] == b.shape[1]
    return np.matmul(a, b)


@pytest.mark.parametrize("sub", SUBSCRIPTS)
def test_einsum_lowered_equals_numpy(sub):
    rng = np.random.default_rng(abs(hash(sub)) % 2**32)
    ins = sub.split("->")[0].split(",")
    ops = [rng.standard_normal([SIZES[i] for i in s]).astype(np.float32) for s in ins]
    want = np.einsum(sub, *ops)
    got = products.einsum(np, sub, *ops, bmm=np_bmm)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert rel_rms(got, want) <= 1e-6, sub


@pytest.mark.parametrize("sa, sb", [((4, 3), (3, 5)), ((2, 4, 3), (3, 5)), ((2, 1, 4, 3), (3, 3, 5)), ((3,), (3, 5)),
                                    ((2, 4, 3), (3,)), ((3,), (3,)), ((5, 1, 1, 6), (5, 1, 6, 7))])
def test_matmul_lowered_equals_numpy(sa, sb):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    want, got = np.matmul(a, b), products.matmul(np, a, b, np_bmm)
    assert np.shape(got) == np.shape(want) and rel_rms(np.asarray(got), np.asarray(want)) <= 1e-6
    out = np.empty_like(want)
    assert products.matmul(np, a, b, np_bmm, out=out) is out and np.array_equal(out, got)


@pytest.mark.parametrize("sub", ["thk,sk->hts", "tngk,snk->ngts"])
def test_einsum_dtype_is_the_computation_type(sub):
    """dtype= casts the operands as NumPy does (the modules ask float64 sums of float32 inputs in places)."""
    rng = np.random.default_rng(11)
    ins = sub.split("->")[0].split(",")
    ops = [rng.standard_normal([SIZES[i] for i in s]).astype(np.float32) for s in ins]
    want = np.einsum(sub, *ops, dtype=np.float64)
    got = products.einsum(np, sub, *ops, bmm=np_bmm, dtype=np.float64)
    assert got.dtype == np.float64 and rel_rms(got, want) <= 1e-14


def test_malformed_subscripts_are_refused():
    a = np.ones((2, 3), np.float32)
    for sub in ("ij,jk", "i...,jk->ik", "ii,ij->j"):
        with pytest.raises(ValueError, match="einsum"):
            products.einsum(np, sub, a, a, bmm=np_bmm)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bmm_kernel_equals_numpy(dtype):
    qc = pytest.importorskip("quant.cuda")
    from numba import cuda

    from quant.cuda.bmm import bmm_device
    if not qc.available():
        pytest.skip("no GPU and no simulator")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 3, 5)).astype(dtype)
    b = rng.standard_normal((2, 5, 130)).astype(dtype)            # N past one block of threads
    c = cuda.device_array((2, 3, 130), dtype=dtype)
    bmm_device(cuda.to_device(a), cuda.to_device(b), c)
    got = c.copy_to_host()
    assert got.dtype == dtype and rel_rms(got, a @ b) <= (1e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.cuda
def test_bmm_tiled_kernel_gives_the_one_thread_kernels_bits():
    """The tiled kernel (a fixed-shape ubatch's large products) sums each output in the one-thread kernel's order
    with the same multiply-adds: the same bits, on tiles cut by every edge (rows, columns, k past a multiple of 16)."""
    qc = pytest.importorskip("quant.cuda")
    from numba import cuda

    from quant.cuda import bmm as kb
    if not qc.available():
        pytest.skip("no GPU and no simulator")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 70, 37)).astype(np.float32)
    b = rng.standard_normal((2, 37, 81)).astype(np.float32)
    out = {}
    for k in ("thread", "tiled"):
        c = cuda.device_array((2, 70, 81), dtype=np.float32)
        kb.bmm_device(cuda.to_device(a), cuda.to_device(b), c, kernel=k)
        out[k] = c.copy_to_host()
    assert np.array_equal(out["tiled"].view(np.uint32), out["thread"].view(np.uint32))
    assert rel_rms(out["tiled"], a @ b) <= 1e-6
    assert kb.tiled(512, 2048, np.float32) and not kb.tiled(128, 2048, np.float32) and \
        not kb.tiled(512, 2048, np.float64)


@pytest.mark.cuda
def test_bmm_parts_split_what_one_grid_cannot_hold(monkeypatch):
    """bmm_parts (a captured prefill's large products): batches and rows past one launch grid are multiplied in
    parts into one result, equal to the one-launch product (each element is one thread's sum either way). GPU
    (CuPy): the grid's limit patched down to 3 so that toy shapes take 2 x 3 parts."""
    cp = pytest.importorskip("cupy")
    from quant.cuda import bmm as kb
    if not cp.cuda.is_available():
        pytest.skip("no GPU")
    rng = np.random.default_rng(4)
    a = cp.asarray(rng.standard_normal((5, 7, 9)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((5, 9, 11)).astype(np.float32))
    whole = kb.bmm(a, b).get()
    monkeypatch.setattr(kb, "MAX_GRID_YZ", 3)
    got = kb.bmm_parts(a, b).get()
    assert np.array_equal(got, whole) and rel_rms(got, a.get() @ b.get()) <= 1e-6


@pytest.mark.parametrize("arch", ["deepseek2", "qwen3next", "llama", "kimi-linear"])
def test_resident_forward_with_kernel_products(synth_model, arch):
    """The sim device with products="kernel" (as a GPU runs a fixed-shape forward): every np.matmul / np.einsum of
    the modules on device arrays goes through the lowering (NumPy's matmul standing for the kernel); the logits of a
    prefill and two decode steps (fixed shapes, the decode steps under strict()) stay within summation order of the
    host run, same argmax, and nothing falls back to the host."""
    from refengine.model import Model
    from refengine.runtime import Runtime
    m = Model(synth_model(arch, wtype="Q4_K"))
    host, dev = Runtime(), Runtime(resident=True, fixed_shapes=True)
    dev.device.products = "kernel"
    st_h, st_d = m.new_state(), m.new_state()
    a = m.forward([3, 17, 101, 5, 250, 42, 7], st_h, rt=host)
    b = m.forward([3, 17, 101, 5, 250, 42, 7], st_d, rt=dev)
    assert rel_rms(b, a) <= 1e-6 and np.array_equal(a.argmax(-1), b.argmax(-1))
    calls = []
    for name in ("kernel_einsum", "kernel_matmul"):
        real = getattr(dev.device, name)
        setattr(dev.device, name, lambda *x, _r=real, _n=name, **k: calls.append(_n) or _r(*x, **k))
    m.forward([9], st_d, rt=dev)                                   # warm-up: weights uploaded
    m.forward([9], st_h, rt=host)
    for tok in (5, 12):
        a = m.forward([tok], st_h, rt=host)
        step = m.prepare_step([tok], st_d, dev)
        with dev.device.strict():
            out = m.run_step(step, st_d, dev)
        b = dev.to_host(out)
        assert rel_rms(b, a) <= 1e-6 and np.argmax(a) == np.argmax(b), arch
    assert not dev.device.stats.fallbacks
    assert calls, f"{arch}: no product went through the lowering"     # (attention's products, the delta rule's)
