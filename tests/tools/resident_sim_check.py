"""quant/cuda/resident.py's routed-expert orchestration without a GPU: numba's CUDA simulator, NumPy standing in
for CuPy. For T = 1 and 5 tokens, SwiGLU and a gated activation of its own: the host-table path
(`moe_ffn_resident` with host ids) and the ids-on-the-device path (`_ids_on_device`: one-token kernels or
`bucket_kernel`'s tables) against the float64 oracle (relative RMS), and whether the two paths agree bit for bit.

    NUMBA_ENABLE_CUDASIM=1 python tests/tools/resident_sim_check.py [gemv|auto]     (~7 min: the simulator's threads)

Not in the test suite (too slow for it); run by hand when resident.py's dispatch changes. Exits 1 when a path is
further than 1e-5 from the oracle.
"""
import sys
import types

import numpy as np

fake = types.ModuleType("cupy")                          # before quant.cuda: its modules import cupy lazily
for k in ("empty", "zeros", "ascontiguousarray", "float32", "int32", "concatenate"):
    setattr(fake, k, getattr(np, k))
sys.modules["cupy"] = fake

import quant.cuda  # noqa: E402,F401  (numpy shim before numba)
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray  # noqa: E402
from quant import GGMLType, ref  # noqa: E402
from quant.cuda import resident  # noqa: E402
from quant.cuda.testdata import random_qtensor  # noqa: E402

KERNEL = sys.argv[1] if len(sys.argv) > 1 else "gemv"
resident._nb = lambda a: a if a is None or isinstance(a, FakeCUDAArray) else FakeCUDAArray(a)
resident._stream = lambda: 0
rng = np.random.default_rng(0)
E, A, D, I = 6, 2, 32, 32
t = GGMLType.Q8_0
up, gate = random_qtensor(t, (E, I, D), rng), random_qtensor(t, (E, I, D), rng)
down = random_qtensor(t, (E, D, I), rng)
U, G, Dn = ref.dequantize(up), ref.dequantize(gate), ref.dequantize(down)


def oracle(x, ids, w, act):
    y = np.zeros((x.shape[0], D), np.float64)
    for tt in range(x.shape[0]):
        for a in range(A):
            e = ids[tt, a]
            y[tt] += w[tt, a] * (Dn[e] @ act(G[e] @ x[tt], U[e] @ x[tt]))
    return y


def silu_glu(g, u):
    return g / (1 + np.exp(-g)) * u


def tanh_glu(g, u):
    return np.tanh(g) * u


bad = False
for T in (1, 5):
    x = rng.standard_normal((T, D)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:A] for _ in range(T)]).astype(np.int32)
    w = rng.uniform(size=(T, A)).astype(np.float32)
    for name, act_dev, f in (("swiglu", None, silu_glu),
                             ("own act", lambda g, u: tanh_glu(np.asarray(g), np.asarray(u)).astype(np.float32),
                              tanh_glu)):
        kw = dict(up=up, gate=gate, down=down, kernel=KERNEL)
        if act_dev is not None:
            kw.update(act=("tanh",), act_device=act_dev)
        host = resident.moe_ffn_resident(x, ids, w, **kw)
        dev = resident._ids_on_device(x, ids, w, up, gate, down, None, None, None, KERNEL, act_dev)
        want = oracle(x, ids, w, f)

        def err(y):
            return float(np.sqrt(np.mean((np.asarray(y) - want) ** 2) / np.mean(want ** 2)))
        e_host, e_dev = err(host), None if dev is None else err(dev)
        bad |= e_host > 1e-5 or (e_dev is not None and e_dev > 1e-5)
        same = dev is not None and np.array_equal(np.asarray(host), np.asarray(dev))
        print(f"T={T} {name}: host tables rel-RMS {e_host:.2e}, ids on the device "
              f"{'refused (read back)' if dev is None else f'{e_dev:.2e}'}, bit-identical {same}", flush=True)
sys.exit(1 if bad else 0)
