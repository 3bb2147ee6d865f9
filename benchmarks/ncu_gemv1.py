"""Driver for a hardware-counter profile of the one-token GEMV kernels (one launch each), e.g.

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats python3 benchmarks/ncu_gemv1.py
    python3 benchmarks/ncu_gemv1.py --sass DIR      # also write each kernel's SASS (needs nvdisasm)

W 4096 x 14336, one token; the kernels and shapes of benchmarks/cuda_gemv1.py.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import quant.cuda  # noqa: F401
from numba import cuda

from quant import GGMLType
from quant.cuda import ops
from quant.cuda.gemv import dense_groups
from quant.cuda.testdata import random_qtensor
from quant.cuda.weights import device_weight

RUNS = [("Q4_K", "f", (8, 4, 8)), ("Q4_K", "i", (8, 4, 8, 128)), ("Q4_K", "i", (8, 4, 4, 0)),
        ("Q8_0", "f", (8, 4, 8)), ("Q8_0", "i", (16, 8, 4, 0))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sass", help="write SASS of each kernel into this folder")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    O, I = 4096, 14336
    ws = {}
    x = cuda.to_device(rng.standard_normal((1, I)).astype(np.float32))
    y = cuda.device_array((1, O), np.float32)
    grp = cuda.to_device(dense_groups(1, ops.GEMM_SHAPE["BN"]))
    for tn, kind, sh in RUNS:
        t = GGMLType[tn]
        if tn not in ws:
            ws[tn] = device_weight(random_qtensor(t, (O, I), rng)).ensure()
        shape = (*sh, *(0,) * (4 - len(sh)), int(kind == "i"))       # X (the 5th entry): the 8-bit kernel
        ops.grouped(ws[tn], x, y, grp, 1, 1, 1, kernel="fast", shape=shape)
        cuda.synchronize()
        print(tn, kind, sh, "launched", flush=True)
        if a.sass:
            from quant.cuda.fast import fgemv1_kernel
            from quant.cuda.fast8 import igemv1_kernel
            k = (igemv1_kernel(t, sh[0], sh[1], False, False, sh[2], 0, sh[3]) if kind == "i"
                 else fgemv1_kernel(t, sh[0], sh[1], False, False, sh[2], 0))
            os.makedirs(a.sass, exist_ok=True)
            for sig, sass in k.inspect_sass().items():
                with open(os.path.join(a.sass, f"{tn}_{kind}_{'x'.join(map(str, sh))}.sass"), "w") as f:
                    f.write(sass)


if __name__ == "__main__":
    main()
