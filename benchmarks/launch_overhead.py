"""Host time per launch on the GPU path: what one small op costs the host, by route.

    python3 benchmarks/launch_overhead.py [--n 2000]

Routes timed (the GPU work itself is a few elements, so the host is what is measured; the stream is synchronised
once at the end of each route): a numba kernel of 4 array arguments given CuPy arrays (numba converts each through
`__cuda_array_interface__`), the same given numba views made once, a CuPy elementwise add, the same add through
refengine.devarray (a NumPy call on DeviceArrays), and a cuBLAS SGEMM of 8 x 8 through CuPy. Microseconds per op.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    a = ap.parse_args(argv)
    import cupy as cp
    from numba import cuda

    from quant.cuda.streams import current_stream, numba_view
    from refengine.devarray import Device

    @cuda.jit
    def k4(a, b, c, d):
        i = cuda.grid(1)
        if i < a.shape[0]:
            d[i] = a[i] + b[i] * c[i]

    xs = [cp.ones(64, np.float32) for _ in range(4)]
    nv = [numba_view(x) for x in xs]
    st = current_stream()
    dev = Device("cupy")
    da, db = dev.put(np.ones(64, np.float32)), dev.put(np.ones(64, np.float32))
    W = cp.ones((8, 8), np.float32)

    routes = {
        "numba kernel, CuPy arrays": lambda: k4[1, 64, st](*xs),
        "numba kernel, numba views": lambda: k4[1, 64, st](*nv),
        "numba views made + kernel": lambda: k4[1, 64, st](*[numba_view(x) for x in xs]),
        "CuPy add": lambda: cp.add(xs[0], xs[1]),
        "devarray add (np.add)": lambda: np.add(da, db),
        "CuPy matmul 8x8": lambda: cp.matmul(W, W),
    }
    for name, f in routes.items():
        for _ in range(50):
            f()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(a.n):
            f()
        cp.cuda.Device().synchronize()
        print(f"{name:32s} {1e6 * (time.perf_counter() - t0) / a.n:8.1f} us/op", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
