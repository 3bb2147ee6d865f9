"""GPU benchmark: a prefill's routed-expert products by kernel and tile shape (DeepSeek-V3's experts by default).

    python3 benchmarks/expert_prefill.py [--experts 256 --ff 2048 --dim 7168 --tokens 512 --used 8]
        [--shapes 64x4x1x32,...] [--tcq 2x4x32,...] [--kernels fast,gemm] [--dense 4096x14336,...] [--type Q4_K]
        [--ncu]

The gate (ff x dim) and the down (dim x ff) projection of E experts, T tokens routed uniformly at random to A
distinct experts each (~T A / E pairs an expert: 16 for V3 at 512 tokens), one grouped launch each, timed with
CUDA events (median of --reps after a warm-up). Tensor-core shapes BM x WM x WN x BN (BN: the pairs of a tile,
the group table built with it); quant-domain shapes (`tcq.py`) MT x WM x BN[x MR x PW x PF x ST x H] (H=1: the
half-precision variant on mma.m16n8k16, `gemm_tcq16_kernel`). --dense OxI,...:
one dense product of T tokens each, by tc, tcq, tcq16 and cuBLAS after the weight's decode (`dequant_gemm.dense_sgemm`).
Every configuration is checked against the NumPy oracle on --check experts (rel-RMS <= 1e-5). --ncu: one launch
per configuration, nothing timed (for `ncu -k regex:gemm`).
"""
from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

# isort: off
import quant.cuda  # noqa: F401                (the numpy shim before numba loads)
from numba import cuda
# isort: on

from cuda_matmul import rel_rms

from quant import GGMLType, QTensor, ref
from quant.cuda import ops
from quant.cuda.moe import groups_from_ids
from quant.cuda.testdata import random_raw
from quant.cuda.weights import device_weight


def timed(run, reps: int) -> float:
    """Median milliseconds of run() over reps launches (CUDA events on the default stream), after two warm-ups."""
    ev = [cuda.event() for _ in range(reps + 1)]
    for _ in range(2):
        run()
    ev[0].record()
    for i in range(reps):
        run()
        ev[i + 1].record()
    ev[-1].synchronize()
    return statistics.median(cuda.event_elapsed_time(ev[i], ev[i + 1]) for i in range(reps))


def dense(a, t, O: int, I: int, rng) -> dict:
    """One dense product [T, I] x [O, I]^T by tc, tcq (TF32 and f16) and cuBLAS (decode + SGEMM), checked against
    NumPy."""
    import cupy as cp
    from quant.cuda.dequant_gemm import dense_sgemm
    from quant.cuda.streams import numba_view
    w = QTensor.from_raw("w", t, (O, I), random_raw(t, (O, I), rng, centered=True))
    dw = device_weight(w).ensure()
    x = cp.asarray(rng.standard_normal((a.tokens, I)).astype(np.float32))
    y = cp.empty((a.tokens, O), dtype=cp.float32)
    want = cp.asnumpy(x).astype(np.float64) @ ref.dequantize(w).astype(np.float64).T
    row = dict(config=f"dense {O}x{I} T={a.tokens}")
    for name, run in (("tc", lambda: ops.dense(dw, numba_view(x), numba_view(y), kernel="tc")),
                      ("tcq", lambda: ops.dense(dw, numba_view(x), numba_view(y), kernel="tcq")),
                      ("tcq16", lambda: ops.dense(dw, numba_view(x), numba_view(y), kernel="tcq",
                                                  shape=dict(MT=2, WM=4, BN=32, H=1))),
                      ("sgemm", lambda: dense_sgemm(dw, x, y))):
        y.fill(cp.nan)
        run()
        err = rel_rms(cp.asnumpy(y), want)
        row[name] = dict(ms=timed(run, a.reps), rel_rms=err, ok=err <= 1e-5)
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--ff", type=int, default=2048)
    ap.add_argument("--dim", type=int, default=7168)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--used", type=int, default=8)
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--shapes", default="64x4x1x32,64x4x1x16,128x4x1x32,128x8x1x32,128x4x1x16,32x2x1x16")
    ap.add_argument("--tcq", default="2x4x32,1x4x32,2x2x32,4x2x32,1x8x32")
    ap.add_argument("--kernels", default="fast", help="non-tc kernels to time as well (fast, gemm)")
    ap.add_argument("--dense", default="", help="dense products OxI to time (tc, tcq, sgemm)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--check", type=int, default=3, help="experts checked against NumPy")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    E, F, D, T, A = a.experts, a.ff, a.dim, a.tokens, a.used
    t = GGMLType[a.type]
    gate = QTensor.from_raw("gate", t, (E, F, D), random_raw(t, (E, F, D), rng, centered=True))
    down = QTensor.from_raw("down", t, (E, D, F), random_raw(t, (E, D, F), rng, centered=True))
    dg, dd = device_weight(gate).ensure(), device_weight(down).ensure()
    ids = np.argsort(rng.random((T, E)), axis=1)[:, :A].astype(np.int32)
    x = rng.standard_normal((T, D)).astype(np.float32)
    h = rng.standard_normal((T * A, F)).astype(np.float32)
    xd, hd = cuda.to_device(x), cuda.to_device(h)
    yg, yd = cuda.device_array((T * A, F), np.float32), cuda.device_array((T * A, D), np.float32)
    flat = ids.reshape(-1)
    chk = np.unique(flat)[:a.check]
    want = {}
    for e in chk:
        pj = np.nonzero(flat == e)[0]
        want[int(e)] = (pj, x[pj // A] @ ref.dequantize(gate[int(e)]).T, h[pj] @ ref.dequantize(down[int(e)]).T)
    counts = np.bincount(flat, minlength=E)
    print(f"E={E} ff={F} dim={D} T={T} A={A} {t.name}: pairs an expert mean {counts.mean():.1f} max {counts.max()}",
          flush=True)
    configs = [("tc", dict(zip(("BM", "WM", "WN", "BN"), (int(v) for v in s.split("x")))))
               for s in a.shapes.split(",") if s]
    configs += [("tcq", dict(zip(("MT", "WM", "BN", "MR", "PW", "PF", "ST", "H"), (int(v) for v in s.split("x")))))
                for s in a.tcq.split(",") if s]
    configs += [(k, {}) for k in a.kernels.split(",") if k]
    res = []
    for kern, sh in configs:
        tx, tp, mpg = groups_from_ids(ids, E, sh.get("BN", 32))
        gmax = min(E, T * A)
        txd, tpd = cuda.to_device(tx), cuda.to_device(tp)
        name = kern + ("" if not sh else " " + "x".join(str(v) for v in sh.values()))

        def run(which):
            if which == "gate":
                ops.grouped(dg, xd, yg, txd, gmax, T * A, mpg, kernel=kern, shape=sh or None)
            else:
                ops.grouped(dd, hd, yd, tpd, gmax, T * A, mpg, kernel=kern, shape=sh or None)
        row = dict(config=name)
        for which, y, col in (("gate", yg, 1), ("down", yd, 2)):
            try:
                run(which)
                cuda.synchronize()
            except Exception as exc:            # a shape the kernel refuses: say so, go on
                row[which] = f"refused: {exc}"
                continue
            if a.ncu:
                continue
            got = y.copy_to_host()
            err = max(rel_rms(got[w[0]], w[col]) for w in want.values())
            row[which] = dict(ms=timed(lambda: run(which), a.reps), rel_rms=err, ok=err <= 1e-5)
        print(json.dumps(row), flush=True)
        res.append(row)
    for od in a.dense.split(","):
        if od:
            res.append(dense(a, t, *(int(v) for v in od.split("x")), rng))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(args=vars(a), results=res), f, indent=1)


if __name__ == "__main__":
    main()
