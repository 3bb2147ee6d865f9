"""Prefill GEMMs on the GPU: the float32 SIMT tiled GEMM against the tensor-core one (3xTF32), per type and shape.

    python benchmarks/cuda_prefill.py [--types Q4_K,Q8_0] [--tokens 512] [--json out.json]

- dense: W 4096 x 14336 at 512 tokens (the prefill column of `cuda_matmul.py`);
- experts: 128 experts of 768 x 2048 (gate/up) and of 2048 x 768 (down), 512 tokens x 8 routed: the
  grouped launch of a qwen3-30b-a3b layer at prefill (group table built on the host, rows sorted by expert).
Each configuration is checked against the NumPy oracle first (relative RMS <= 1e-5: 64 rows of the
dense product, 4 experts' pairs of the grouped one), then timed from a CUDA graph (`Timer.graph`),
median of the replays, weight buffers rotated past the 50 MB L2. TFLOP/s counts 2 O I per token (pair).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics

import numpy as np
from numba import cuda

import quant.cuda as qc
from quant import GGMLType, ref
from quant.cuda import ops
from quant.cuda.gemv import GroupTable, dense_groups
from quant.cuda.testdata import random_qtensor
from quant.cuda.timing import Timer
from quant.cuda.weights import clear, device_weight

TC_SHAPES = [dict(BM=64, WM=4, WN=1), dict(BM=64, WM=2, WN=2), dict(BM=64, WM=4, WN=2)]
# dense products only: 64-token tiles (the group table built with 64-pair tiles)
TC_DENSE_SHAPES = [dict(BM=64, WM=2, WN=2, BN=64), dict(BM=64, WM=4, WN=2, BN=64), dict(BM=64, WM=4, WN=1, BN=64)]
L2_BYTES = 50e6


def rel_rms(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sqrt(np.mean((got - want) ** 2) / max(np.mean(want ** 2), 1e-30)))


def _configs(dense=False):
    return [("gemm", None)] + [("tc", dict(sh, BN=32)) for sh in TC_SHAPES] + \
        ([("tc", sh) for sh in TC_DENSE_SHAPES] if dense else [])


def _name(kernel, sh):
    return kernel if sh is None else f"tc {sh['BM']}x{sh['WM']}x{sh['WN']} BN{sh['BN']}"


def bench_dense(t, timer, rng, O=4096, I=14336, T=512, reps=7) -> dict:
    w0 = random_qtensor(t, (O, I), rng)
    nbuf = max(2, math.ceil(3 * L2_BYTES / w0.nbytes))
    ws = [w0] + [random_qtensor(t, (O, I), rng) for _ in range(nbuf - 1)]
    dws = [device_weight(w).ensure() for w in ws]
    x = rng.standard_normal((T, I)).astype(np.float32)
    xd, yd = cuda.to_device(x), cuda.device_array((T, O), np.float32)
    grps = {bn: cuda.to_device(dense_groups(T, bn)) for bn in (32, 64)}
    want = ref.matmul(x, w0.rows(0, 64))
    res = {}
    for kernel, sh in _configs(dense=True):
        grp = grps[sh["BN"] if sh else 32]
        ops.grouped(dws[0], xd, yd, grp, 1, T, T, kernel=kernel, shape=sh)
        r = rel_rms(yd.copy_to_host()[:, :64], want)
        if not r <= 1e-5:
            raise AssertionError(f"{t.name} dense {_name(kernel, sh)}: relative RMS {r:.2e}")
        us = statistics.median(timer.graph(lambda i, s, grp=grp: ops.grouped(dws[i % nbuf], xd, yd, grp, 1, T, T,
                                                                             kernel=kernel, shape=sh, stream=s),
                                           6, replays=reps))
        res[_name(kernel, sh)] = dict(us=us, tflops=2 * O * I * T / us / 1e6, rel_rms=r)
    clear()
    return res


def bench_experts(t, timer, rng, O, I, E=128, A=8, T=512, reps=7) -> dict:
    w = random_qtensor(t, (E, O, I), rng)
    dw = device_weight(w).ensure()
    ids = np.stack([rng.permutation(E)[:A] for _ in range(T)]).astype(np.int32)
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable").astype(np.int32)
    gexp, counts = np.unique(flat, return_counts=True)
    n = T * A
    tab = GroupTable.build(gexp.astype(np.int32), counts, order // A, order, len(gexp), ops.GEMM_SHAPE["BN"])
    grp = cuda.to_device(tab)
    x = rng.standard_normal((T, I)).astype(np.float32)
    xd, yd = cuda.to_device(x), cuda.device_array((n, O), np.float32)
    check = [int(e) for e in gexp[:4]]
    res = {}
    for kernel, sh in _configs():
        ops.grouped(dw, xd, yd, grp, len(gexp), n, int(counts.max()), kernel=kernel, shape=sh)
        got = yd.copy_to_host()
        rs = []
        for e in check:
            pairs = np.nonzero(flat == e)[0]
            rs.append(rel_rms(got[pairs], ref.matmul(x[pairs // A], w[e])))
        r = max(rs)
        if not r <= 1e-5:
            raise AssertionError(f"{t.name} experts {O}x{I} {_name(kernel, sh)}: relative RMS {r:.2e}")
        us = statistics.median(timer.graph(lambda i, s: ops.grouped(dw, xd, yd, grp, len(gexp), n, int(counts.max()),
                                                                    kernel=kernel, shape=sh, stream=s), 6, replays=reps))
        res[_name(kernel, sh)] = dict(us=us, tflops=2 * O * I * n / us / 1e6, rel_rms=r)
    clear()
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q4_K,Q8_0,Q6_K,F16")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    qc.check_available()
    if qc.SIM:
        print("the simulator cannot be timed")
        return 2
    rng = np.random.default_rng(0)
    timer = Timer()
    out = {}
    for name in a.types.split(","):
        t = GGMLType[name]
        r = out[name] = {}
        for label, fn in (("dense 4096x14336", lambda: bench_dense(t, timer, rng, T=a.tokens)),
                          ("experts 768x2048", lambda: bench_experts(t, timer, rng, 768, 2048, T=a.tokens)),
                          ("experts 2048x768", lambda: bench_experts(t, timer, rng, 2048, 768, T=a.tokens))):
            try:
                r[label] = fn()
            except Exception as e:                                   # noqa: BLE001 - report and go on
                r[label] = dict(error=f"{type(e).__name__}: {e}")
            print(f"{name:6s} {label:18s} " + (r[label]["error"] if "error" in r[label] else "  ".join(
                f"{k} {v['us']:.0f} us {v['tflops']:.1f} TF" for k, v in r[label].items())), flush=True)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
