"""One input's projections made as one product on a device (`Runtime.matmul_many`, `Runtime.prefetch`,
`quant.QStack`), checked on the sim device: the same numbers as the products one by one (bit for bit: each output
row's sums are the kernels' whichever rows share the launch), one product noted where there were several, a NaN/inf
flag that still names the weight at fault, and the cpu / numpy runtimes unchanged. The kernels' side (a stacked
device weight multiplied in one launch equals its parts side by side): tests/test_cuda_kernels.py
test_stacked_weight_is_its_parts."""
import numpy as np
import pytest

from quant import GGMLType, QStack, QTensor, QuantError
from quant.quantize import quantize
from refengine.errors import NonFiniteError
from refengine.runtime import Runtime

I = 64


def _w(name, rows, seed, t=GGMLType.Q8_0, poison=False):
    x = np.random.default_rng(seed).standard_normal((rows, I)).astype(np.float32)
    raw = quantize(x, t, name=name) if t != GGMLType.F32 else x.view(np.uint8).reshape(rows, -1)
    if poison:                                          # row 1's first block scale: float16 inf
        raw = raw.copy()
        raw[1, :2] = np.array([np.inf], np.float16).view(np.uint8)
    return QTensor.from_raw(name, t, (rows, I), raw)


@pytest.fixture
def ws():
    return [_w("blk.0.attn_q.weight", 64, 1), _w("blk.0.attn_k.weight", 32, 2), _w("blk.0.attn_v.weight", 32, 3)]


def _x(T, seed=9):
    return np.random.default_rng(seed).standard_normal((T, I)).astype(np.float32)


@pytest.mark.parametrize("T", [1, 3])
def test_stacked_equals_the_products_one_by_one(ws, T):
    """Resident on the sim device: one `matmul` op noted for the three (the q, k, v of a layer), outputs equal to
    three separate products bit for bit and to the host runtime's; a token's outputs are views of the one product,
    more tokens' C-contiguous copies."""
    rt = Runtime(resident=True)
    dev = rt.device
    x = dev.put(_x(T))
    with dev.recording() as ops:
        got = rt.matmul_many(x, ws)
    one = [rt.matmul(x, w) for w in ws]
    host = Runtime().matmul_many(_x(T), ws)
    assert [op for op, _, _ in ops if op.startswith("matmul")] == ["matmul " + "+".join(w.name for w in ws)]
    for g, o, h in zip(got, one, host):
        assert np.array_equal(dev.get(g), dev.get(o)) and np.array_equal(dev.get(g), h)
        assert dev.get(g).flags.c_contiguous or T == 1
    rt.check_deferred()


def test_groups_by_type_and_width(ws):
    """Weights of another type (or width) are a product of their own; the output order is the weights'."""
    rt = Runtime(resident=True)
    dev = rt.device
    mixed = [ws[0], _w("blk.0.ssm_beta.weight", 32, 4, GGMLType.F32), ws[1]]
    x = dev.put(_x(1))
    with dev.recording() as ops:
        got = rt.matmul_many(x, mixed)
    names = [op for op, _, _ in ops if op.startswith("matmul")]
    assert names == [f"matmul {ws[0].name}+{ws[1].name}", f"matmul {mixed[1].name}"]
    for g, w in zip(got, mixed):
        assert np.array_equal(dev.get(g), dev.get(rt.matmul(x, w)))


@pytest.mark.parametrize("bad", [0, 1, 2])
def test_a_poisoned_part_is_named(ws, bad):
    """An inf in one part's values: NaN/inf from a finite input names that weight, not its neighbours."""
    ws = list(ws)
    ws[bad] = _w(ws[bad].name, ws[bad].shape[0], 10 + bad, poison=True)
    rt = Runtime(resident=True)
    rt.matmul_many(rt.device.put(_x(2)), ws)
    with pytest.raises(NonFiniteError, match=ws[bad].name.replace(".", r"\.")) as e:
        rt.check_deferred()
    assert all(w.name not in str(e.value) for k, w in enumerate(ws) if k != bad)


def test_an_overflow_names_the_stack(ws):
    """Every part finite, the sums overflowing (a huge input): the error names the parts (which made it is not
    known from one flag)."""
    rt = Runtime(resident=True)
    rt.matmul_many(rt.device.put(np.full((1, I), 3e37, np.float32)), ws)
    with pytest.raises(NonFiniteError, match="one product"):
        rt.check_deferred()


def test_prefetch_is_taken_once(ws):
    """`prefetch` makes the products ahead (one op); each later `matmul(x, w)` takes its own once, another input or
    a second call multiplies anew; a prefetch whose products are all made keeps them (an outer one named them)."""
    rt = Runtime(resident=True)
    dev = rt.device
    x, other = dev.put(_x(1)), dev.put(_x(1, seed=4))
    with dev.recording() as ops:
        rt.prefetch(x, ws)
        rt.prefetch(x, ws[1:])                                         # all made: kept, nothing run
        got = [rt.matmul(x, w) for w in ws]
    assert sum(op.startswith("matmul") for op, _, _ in ops) == 1
    with dev.recording() as ops:
        again, _ = rt.matmul(x, ws[0]), rt.matmul(other, ws[1])
    assert sum(op.startswith("matmul") for op, _, _ in ops) == 2
    assert np.array_equal(dev.get(again), dev.get(got[0]))
    rt.prefetch(x, ws[:2])
    with dev.recording() as ops:
        rt.matmul(other, ws[0])                                         # another input: not the prefetched one
    assert sum(op.startswith("matmul") for op, _, _ in ops) == 1
    rt.prefetch(x, ws)                                                  # matmul_many takes what was made ahead
    with dev.recording() as ops:
        many = rt.matmul_many(x, ws[1:])
    assert sum(op.startswith("matmul") for op, _, _ in ops) == 0
    assert all(np.array_equal(dev.get(a), dev.get(b)) for a, b in zip(many, got[1:]))
    host = Runtime()
    host.prefetch(_x(1), ws)                                            # off a device: nothing made ahead
    assert not host._prefetched


def test_qstack_refuses_mixed_parts(ws):
    with pytest.raises(QuantError, match="one type and width"):
        QStack((ws[0], _w("x", 32, 5, GGMLType.F32)))
    st = QStack(tuple(ws))
    assert st.shape == (128, I) and st.bounds() == [(0, 64), (64, 96), (96, 128)] and st.name.count("+") == 2


def test_policy_turns_stacking_off(ws):
    """`KernelPolicy(stacked_products=False)`: a product a weight (as before stacking), the same numbers; prefetch
    makes nothing ahead."""
    pytest.importorskip("numba.cuda")
    from quant.cuda.policy import KernelPolicy
    rt = Runtime(resident=True)
    rt.kernel_policy = KernelPolicy.default().replace(stacked_products=False)   # (as a cuda runtime's policy reads)
    dev = rt.device
    x = dev.put(_x(1))
    with dev.recording() as ops:
        got = rt.matmul_many(x, ws)
        rt.prefetch(x, ws)
    assert [op for op, _, _ in ops if op.startswith("matmul")] == [f"matmul {w.name}" for w in ws]
    assert not rt._prefetched
    on = Runtime(resident=True)
    for g, w in zip(got, on.matmul_many(on.device.put(_x(1)), ws)):
        assert np.array_equal(dev.get(g), on.device.get(w))
