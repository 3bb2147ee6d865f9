"""The 3xFP16 prefill product's accuracy on the GPU by K chunk (hgemm.py's kc): relative RMS against the float64
product of quant.ref's weights, and its time against cuBLAS SGEMM on the decoded weight.

    python3 benchmarks/h3_accuracy.py [--k 14336] [--o 4096] [--t 512]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=14336)
    ap.add_argument("--o", type=int, default=4096)
    ap.add_argument("--t", type=int, default=512)
    a = ap.parse_args(argv)
    import cupy as cp

    from quant import GGMLType, ref
    from quant.cuda import ops
    from quant.cuda.dequant_gemm import dense_sgemm
    from quant.cuda.hgemm import dense_h3
    from quant.cuda.testdata import random_qtensor
    from quant.cuda.weights import device_weight
    from refengine.compare import metrics

    def rel_rms(got):                                   # sqrt of compare's NMSE against the float64 product
        return float(np.sqrt(metrics(want, got)[0]))
    rng = np.random.default_rng(11)
    w = random_qtensor(GGMLType.Q4_K, (a.o, a.k), rng, "blk.0.ffn_down.weight")
    x = rng.standard_normal((a.t, a.k)).astype(np.float32)
    want = x.astype(np.float64) @ ref.dequantize(w).astype(np.float64).T
    dw, xd = device_weight(w).ensure(), cp.asarray(x)
    y = cp.empty((a.t, a.o), np.float32)

    def timed(f):
        f()
        cp.cuda.Device().synchronize()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            f()
            cp.cuda.Device().synchronize()
            ts.append(time.perf_counter() - t0)
        return 1e3 * float(np.median(ts))
    ms = timed(lambda: dense_sgemm(dw, xd, y))
    err = rel_rms(y.get())
    print(f"sgemm            {ms:7.2f} ms  rel RMS {err:.2e}  (decode {ops.SGEMM_DECODE})")
    for kc in (128, 256, 512, 1024, 2048, 4096, a.k):
        ms = timed(lambda: dense_h3(dw, xd, y, kc=kc))
        err = rel_rms(y.get())
        print(f"h3 kc={kc:<6d}    {ms:7.2f} ms  rel RMS {err:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
