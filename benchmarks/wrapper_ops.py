"""The resident wrapper's own host cost per op (refengine/devarray.py: `DeviceArray` unwrap / wrap / note), measured
on the sim device with tiny arrays so the NumPy work is ~0.4 us: what a GPU's eager op pays on top of CuPy's or
numba's own launch. Best of 7 runs of N calls each, microseconds.

    python3 benchmarks/wrapper_ops.py [--n 20000]
"""
import argparse
import time

import numpy as np

from refengine.runtime import Runtime


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000, help="calls a run")
    a = ap.parse_args(argv)
    dev = Runtime(resident=True).device
    x, y = dev.put(np.ones((1, 64), np.float32)), dev.put(np.ones((1, 64), np.float32))
    ops = [("raw NumPy add", lambda: x.raw + y.raw), ("a + b", lambda: x + y), ("np.exp(a)", lambda: np.exp(x)),
           ("a.reshape(64)", lambda: x.reshape(64)), ("np.concatenate([a, b], axis=1)",
                                                      lambda: np.concatenate([x, y], axis=1))]
    for name, f in ops:
        best = float("inf")
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(a.n):
                f()
            best = min(best, (time.perf_counter() - t0) / a.n * 1e6)
        print(f"{name:34s} {best:6.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
