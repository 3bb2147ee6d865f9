"""One-token kernels side by side on the GPU (the shapes `cuda_matmul.py` tunes over): the float fast GEMV (`fast.fgemv1_kernel`) against the 8-bit
digit-plane GEMV (`fast8.igemv1_kernel`) over shapes and register caps, GEMV 4096 x 14336 and one token's
expert dispatch (128 experts of 768 x 2048, 8 used). Each configuration is checked against the NumPy
oracle (rel-RMS <= 1e-5), then graph-timed like `cuda_matmul.py`.

    python benchmarks/cuda_gemv1.py [--types Q4_K,Q8_0] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics

import numpy as np

import quant.cuda  # noqa: F401
from numba import cuda

from quant import GGMLType, ref
from quant.cuda import ops
from quant.cuda.fast8 import CW
from quant.cuda.gemv import dense_groups
from quant.cuda.testdata import random_qtensor
from quant.cuda.timing import Timer
from quant.cuda.weights import device_weight

from cuda_matmul import FAST_SHAPES, IDS_SHAPES, L2_BYTES, LLAMA_GEMV_US, LLAMA_MOE_US, rel_rms  # noqa: E402


REF_DIMS = (4096, 14336)                  # the GEMV llama.cpp's anchor figures are for


def bench(t, timer, rng, reps, configs, ids_configs, dims=(REF_DIMS,)):
    out = {"type": t.name, "gemv": {}, "moe": {}}
    for O, I in dims:
        gemv_dims(t, timer, rng, reps, configs, O, I, out)
    if ids_configs:
        moe(t, timer, rng, reps, ids_configs, out)
    return out


def gemv_dims(t, timer, rng, reps, configs, O, I, out):
    """GEMV O x I, one token, per configuration: out["gemv"][shape] (4096 x 14336) or out["gemv"]["OxI:shape"]."""
    w0 = random_qtensor(t, (O, I), rng)
    nbuf = min(40, max(2, math.ceil(4 * L2_BYTES / w0.nbytes)))          # a graph replays 40 launches
    ws = [w0] + [random_qtensor(t, (O, I), rng) for _ in range(nbuf - 1)]
    dws = [device_weight(w).ensure() for w in ws]
    x = rng.standard_normal((1, I)).astype(np.float32)
    xd, yd = cuda.to_device(x), cuda.device_array((1, O), np.float32)
    grp = cuda.to_device(dense_groups(1, ops.GEMM_SHAPE["BN"]))
    want = ref.matmul(x, ws[0].rows(0, 64))
    for sh in configs:
        if sh[4] and t not in CW:
            continue
        ops.grouped(dws[0], xd, yd, grp, 1, 1, 1, kernel="fast", shape=sh)
        r = rel_rms(yd.copy_to_host()[:, :64], want)
        assert r <= 1e-5, (t.name, sh, r)
        us = statistics.median(timer.graph(lambda i, s: ops.grouped(dws[i % nbuf], xd, yd, grp, 1, 1, 1, kernel="fast",
                                                                    shape=sh, stream=s), 40, replays=reps))
        key = "x".join(map(str, sh))
        ref_dims = (O, I) == REF_DIMS
        if not ref_dims:
            key = f"{O}x{I}:{key}"
        out["gemv"][key] = dict(us=us, gbs=w0.nbytes / us / 1e3, rel=r)
        ratio = f"x llama {LLAMA_GEMV_US[t.name][0] / us:.2f}" if ref_dims else ""
        print(f"{t.name} gemv {key}: {us:.1f} us  {w0.nbytes / us / 1e3:.0f} GB/s  {ratio}  rel {r:.1e}", flush=True)
    from quant.cuda import weights
    weights.clear()


def moe(t, timer, rng, reps, ids_configs, out):
    from quant.cuda import weights
    E, O, I, A = 128, 768, 2048, 8
    w0 = random_qtensor(t, (E, O, I), rng)
    nbuf = min(max(2, math.ceil(3 * L2_BYTES * E / (A * w0.nbytes))), max(2, int(2e9 // w0.nbytes)))
    ws = [w0] + [random_qtensor(t, (E, O, I), rng) for _ in range(nbuf - 1)]
    dws = [device_weight(w).ensure() for w in ws]
    idss = [rng.permutation(E)[:A].astype(np.int32) for _ in range(16)]
    idd = [cuda.to_device(i) for i in idss]
    x = rng.standard_normal((1, I)).astype(np.float32)
    xd, yd = cuda.to_device(x), cuda.device_array((A, O), np.float32)
    want = np.stack([ref.dequantize(ws[0][int(e)]) @ x[0] for e in idss[0]])
    for sh in ids_configs:
        if sh[4] and t not in CW:
            continue
        ops.grouped_ids(dws[0], xd, yd, idd[0], A, shape=sh)
        r = rel_rms(yd.copy_to_host(), want)
        assert r <= 1e-5, (t.name, "moe", sh, r)
        us = statistics.median(timer.graph(lambda i, s: ops.grouped_ids(dws[i % nbuf], xd, yd, idd[i % 16], A,
                                                                        shape=sh, stream=s), 40, replays=reps))
        key = "x".join(map(str, sh))
        out["moe"][key] = dict(us=us, rel=r)
        print(f"{t.name} moe {key}: {us:.1f} us  x llama {LLAMA_MOE_US.get(t.name, (float('nan'),))[0] / us:.2f}  "
              f"rel {r:.1e}", flush=True)
    weights.clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q4_0")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="the first three configurations only")
    ap.add_argument("--shapes", help="GEMV shapes instead of cuda_matmul's list, e.g. 8x4x8x128x1,8x4x2x128x0x1 "
                    "(RW x KS x P x register cap x 8-bit [x pipelined])")
    ap.add_argument("--ids-shapes", help="the same for the expert dispatch ('none': skip it)")
    ap.add_argument("--dims", default="4096x14336", help="GEMV matrix sizes OxI, comma-separated (the ratio to "
                    "llama.cpp is printed for 4096x14336 only), e.g. 5120x2048,2048x4096 (a decode step's)")
    a = ap.parse_args()
    timer = Timer()
    rng = np.random.default_rng(0)

    def shapes(arg, default):
        if arg == "none":
            return []
        if arg:
            return [tuple(int(v) for v in s.split("x")) for s in arg.split(",")]
        return default[:3] if a.quick else default
    dims = [tuple(int(v) for v in d.split("x")) for d in a.dims.split(",")]
    res = [bench(GGMLType[n], timer, rng, a.reps, shapes(a.shapes, FAST_SHAPES), shapes(a.ids_shapes, IDS_SHAPES),
                 dims) for n in a.types.split(",")]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
