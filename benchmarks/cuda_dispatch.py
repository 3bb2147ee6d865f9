"""GPU benchmark: expert dispatch and small-batch GEMV by kernel, to choose `ops.PAIRS_AVG` / `ops.PAIRS_DENSE`.

    python benchmarks/cuda_dispatch.py [--types Q4_K,Q8_0] [--ns 4,8,16,32,64,128] [--json out.json]

- Dispatch (llama.cpp MUL_MAT_ID shapes): 128 experts of 768 x 2048, 8 used per token, n tokens routed
  uniformly at random; timed as the grouping kernel + one grouped launch, for each kernel:
  `pairs` (one block per pair, `fgemv1_kernel(IDM=3)`), `fast` (one block per group: one-token passes per
  pair up to ops.ONE_MAX pairs, else the 8-token kernel), `tc` (32-pair tiles on the tensor cores), and
  `auto` (what the engine runs).
- Dense GEMV 4096 x 14336 at 2, 4, 8 tokens: `pairs` (one block per token, the tokens of a row block side by
  side) against `fast` (what ran before: one-token passes or the 8-token kernel).
- Same timing and checks as `cuda_matmul.py`: CUDA graphs of 40 launches, median of the replays, weight
  buffers rotated past the 50 MB L2, every configuration checked against the NumPy oracle (rel-RMS <= 1e-5).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import numpy as np

# isort: off
import quant.cuda as qc                  # applies the numpy shim before numba loads
from numba import cuda
# isort: on

from cuda_matmul import L2_BYTES, LLAMA_GEMV_US, LLAMA_MOE_US, dispatch_inputs, rel_rms

from quant import GGMLType, ref
from quant.cuda import moe as cmoe
from quant.cuda import ops
from quant.cuda.gemv import dense_groups
from quant.cuda.testdata import random_qtensor
from quant.cuda.timing import Timer
from quant.cuda.weights import clear, device_weight

LLAMA_MOE_N = (1, 4, 8, 32)
LLAMA_GEMV_N = (1, 2, 3, 4)


def checked_time(name: str, launch, yd, view, want, timer: Timer, reps: int) -> float:
    """Output poisoned with NaN, one launch checked against the oracle (rel-RMS <= 1e-5 of `view(y)`), then the
    median microseconds per launch over graph replays."""
    yd.copy_to_device(np.full(yd.shape, np.nan, np.float32))
    launch(0, 0)
    cuda.synchronize()
    r = rel_rms(view(yd.copy_to_host()), want)
    if not r <= 1e-5:
        raise AssertionError(f"{name}: relative RMS {r:.2e} against the oracle")
    return statistics.median(timer.graph(launch, 40, replays=reps))


def bench_dispatch(t: GGMLType, timer: Timer, rng, ns, kernels, E=128, O=768, I=2048, A=8, reps=9) -> dict:
    w0 = random_qtensor(t, (E, O, I), rng)
    nbuf = min(max(2, math.ceil(3 * L2_BYTES / w0.nbytes)), max(2, int(2e9 // w0.nbytes)))
    ws = [w0] + [random_qtensor(t, (E, O, I), rng) for _ in range(nbuf - 1)]
    dws = [device_weight(w).ensure() for w in ws]
    out = {}
    for n in ns:
        nsets = 8
        idss, x, xd, yd, gmax, tabs, cnt, fill = dispatch_inputs(rng, n, E, O, I, A, nsets)
        wd = {int(e): ref.dequantize(ws[0][int(e)]) for e in np.unique(idss[0])}
        want = np.stack([np.stack([wd[int(e)] @ x[k] for e in idss[0][k]]) for k in range(n)])
        row = out[n] = {"auto_is": ops.auto_kernel(dws[0], xd, gmax, n * A, n)}
        for kernel in kernels:
            def launch(i, s, kernel=kernel):
                idd, tx, tp = tabs[i % nsets]
                cmoe.bucket_kernel[1, 256, s](idd, E, A, n * A, cmoe.BN, tx, tp, cnt, fill)
                ops.grouped(dws[i % nbuf], xd, yd, tx, gmax, n * A, n, kernel=kernel, stream=s)
            row[kernel] = checked_time(f"{t.name} dispatch {kernel} n={n}", launch, yd,
                                       lambda y: y.reshape(n, A, O), want, timer, reps)
        ll = LLAMA_MOE_US.get(t.name)
        if ll and n in LLAMA_MOE_N and ll[LLAMA_MOE_N.index(n)]:
            row["llama"] = ll[LLAMA_MOE_N.index(n)]
        print(t.name, "dispatch", n, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()},
              flush=True)
    clear()
    return out


def bench_dense(t: GGMLType, timer: Timer, rng, ns, kernels, O=4096, I=14336, reps=9) -> dict:
    w0 = random_qtensor(t, (O, I), rng)
    nbuf = max(2, math.ceil(4 * L2_BYTES / w0.nbytes))
    ws = [w0] + [random_qtensor(t, (O, I), rng) for _ in range(nbuf - 1)]
    dws = [device_weight(w).ensure() for w in ws]
    wref = ws[0].rows(0, 64)
    out = {}
    for n in ns:
        x = rng.standard_normal((n, I)).astype(np.float32)
        xd = cuda.to_device(x)
        yd = cuda.device_array((n, O), np.float32)
        grp = cuda.to_device(dense_groups(n, ops.GEMM_SHAPE["BN"]))
        row = out[n] = {}
        for kernel in kernels:
            def launch(i, s, kernel=kernel):
                ops.grouped(dws[i % nbuf], xd, yd, grp, 1, n, n, kernel=kernel, stream=s)
            row[kernel] = checked_time(f"{t.name} dense {kernel} n={n}", launch, yd, lambda y: y[:, :64],
                                       ref.matmul(x, wref), timer, reps)
        ll = LLAMA_GEMV_US.get(t.name)
        if ll and n in LLAMA_GEMV_N and ll[LLAMA_GEMV_N.index(n)]:
            row["llama"] = ll[LLAMA_GEMV_N.index(n)]
        print(t.name, "dense", n, {k: round(v, 1) for k, v in row.items()}, flush=True)
    clear()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q4_K,Q8_0,Q6_K,Q4_0,F16,F32,IQ2_XS,IQ4_XS")
    ap.add_argument("--ns", default="4,8,16,32,64,128", help="dispatch: tokens")
    ap.add_argument("--kernels", default="pairs,fast,tc,auto", help="dispatch kernels")
    ap.add_argument("--dense-ns", default="2,3,4,8", help="dense GEMV: tokens ('' to skip)")
    ap.add_argument("--dense-kernels", default="pairs,fast")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    qc.check_available()
    if qc.SIM:
        print("the simulator cannot be timed")
        return 2
    rng = np.random.default_rng(0)
    timer = Timer()
    res = {}
    for name in a.types.split(","):
        t = GGMLType[name]
        res[name] = {"dispatch": bench_dispatch(t, timer, rng, [int(v) for v in a.ns.split(",")],
                                                a.kernels.split(","))}
        if a.dense_ns:
            res[name]["dense"] = bench_dense(t, timer, rng, [int(v) for v in a.dense_ns.split(",")],
                                             a.dense_kernels.split(","))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
