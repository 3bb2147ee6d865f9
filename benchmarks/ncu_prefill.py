"""Driver for a hardware-counter profile of the prefill GEMMs (one launch each), e.g.

    ncu --clock-control none -k regex:gemm --section SpeedOfLight --section WarpStateStats \\
        python3 benchmarks/ncu_prefill.py --types Q4_K

W 4096 x 14336 at 512 tokens: the float32 SIMT GEMM, then the tensor-core one in the shapes given.
"""
from __future__ import annotations

import argparse

import numpy as np

import quant.cuda  # noqa: F401
from numba import cuda

from quant import GGMLType
from quant.cuda import ops
from quant.cuda.gemv import dense_groups
from quant.cuda.testdata import random_qtensor
from quant.cuda.weights import device_weight


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q4_K")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--shapes", default="64x4x1", help="tensor-core shapes BMxWMxWN, comma-separated")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    O, I, T = 4096, 14336, a.tokens
    x = cuda.to_device(rng.standard_normal((T, I)).astype(np.float32))
    y = cuda.device_array((T, O), np.float32)
    grp = cuda.to_device(dense_groups(T, ops.GEMM_SHAPE["BN"]))
    for tn in a.types.split(","):
        dw = device_weight(random_qtensor(GGMLType[tn], (O, I), rng)).ensure()
        ops.grouped(dw, x, y, grp, 1, T, T, kernel="gemm")
        for s in a.shapes.split(","):
            bm, wm, wn = (int(v) for v in s.split("x"))
            ops.grouped(dw, x, y, grp, 1, T, T, kernel="tc", shape=dict(BM=bm, WM=wm, WN=wn))
        cuda.synchronize()
        print(tn, "done", flush=True)


if __name__ == "__main__":
    main()
