"""GPU benchmark of the quant.cuda kernels against llama.cpp's CUDA kernels on the same H200.

    python benchmarks/cuda_matmul.py [--types Q4_K,Q8_0] [--json out.json] [--md out.md] [--quick]

- GEMV: W 4096 x 14336 (4096 outputs, 14336 inputs), 1, 2, 4, 8 tokens; prefill: 512 tokens (tiled GEMM).
- Expert dispatch (llama.cpp MUL_MAT_ID): 128 experts of 768 x 2048, 8 used per token, 1, 4, 8, 32 tokens;
  timed from device expert ids: grouping by expert (bucket kernel) + one grouped launch; for one token and
  the fast types, one launch reading the expert ids directly (`ops.grouped_ids`, what decoding runs).
- Timed from CUDA graphs (`quant.cuda.timing.Timer.graph`): 40 launches (6 for prefill) captured in one
  graph, the graph replayed 15 times, each replay event-timed and divided by its launches; median over the
  replays. numba's host-side launch cost (tens of us) is paid at capture and stays out of the figure; the
  gaps between the kernels of a graph stay in it. Several weight buffers rotated so that the 50 MB L2 holds
  none of the next launch's weights.
- Kernel: `auto` (what the engine runs): the fast GEMV (`quant.cuda.fast`) for Q4_K, Q6_K, Q8_0, Q4_0, the
  generic warp GEMV for the other types; for the fast types the generic kernel's n=1 time is shown too.
- GB/s counts packed weight bytes read once (dispatch: the distinct experts used); "% copy" is that over
  the device-to-device copy bandwidth (read + write) measured in the same process; "x llama" is
  llama.cpp's time over ours (> 1: faster than llama.cpp). Every configuration is also checked
  against the NumPy oracle on a slice of rows (relative RMS <= 1e-5).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

import quant.cuda as qc
from numba import cuda, uint32

from quant import GGMLType, ref
from quant.cuda import moe as cmoe
from quant.cuda import ops
from quant.cuda.decoders import SPECS
from quant.cuda.fast import FSPECS
from quant.cuda.fast8 import CW
from quant.cuda.vec import ld4u
from quant.cuda.gemv import GroupTable, dense_groups
from quant.cuda.testdata import random_qtensor
from quant.cuda.timing import Timer
from quant.cuda.weights import device_weight

# llama.cpp on the same H200 (test-backend-ops perf -o MUL_MAT / MUL_MAT_ID, CUDA 13.0, sm_90, 2026-11-29:
# shared/anchors/llamacpp-h200.md). GEMV: n = 1, 2, 3, 4 tokens (no n = 8 figure). Dispatch: n = 1, 4, 8, 32.
LLAMA_GEMV_US = {
    "F32": (54.3, 57.1, 77.2, 89.9), "F16": (30.9, 46.1, 46.5, 46.5), "BF16": (30.5, 46.4, 46.4, 46.6),
    "Q4_0": (14.4, 14.8, 17.4, 20.2), "Q4_1": (11.5, 12.2, 15.1, 17.8), "Q5_0": (17.6, 18.5, 21.5, 24.7),
    "Q5_1": (16.9, 17.8, 21.1, 24.2), "Q8_0": (23.2, 25.0, 26.7, 28.9), "MXFP4": (20.0, 20.5, 23.7, 26.7),
    "NVFP4": (15.6, 16.3, 19.9, 23.9), "Q2_K": (16.8, 21.5, 27.0, 32.5), "Q3_K": (23.5, 26.1, 32.8, 36.7),
    "Q4_K": (15.8, 18.4, 22.7, 27.1), "Q5_K": (18.5, 20.8, 25.6, 29.9), "Q6_K": (24.0, 29.0, 32.5, 39.3),
    "IQ2_XXS": (17.0, 18.2, 21.5, 26.7), "IQ2_XS": (19.2, 20.1, 24.4, 27.6), "IQ2_S": (20.8, 22.1, 26.4, None),
    "IQ3_XXS": (18.6, 20.3, 23.8, None), "IQ1_S": (18.5, 18.9, 22.0, None), "IQ1_M": (19.7, 20.5, 24.2, None),
    "IQ4_NL": (15.9, 16.6, 19.2, None), "IQ3_S": (22.1, 23.5, 26.9, None), "IQ4_XS": (14.6, 15.0, 18.4, None),
}
LLAMA_MOE_US = {
    "F32": (25.5, 56.8, 91.3, 220.6), "F16": (13.9, 30.6, 48.3, 118.6), "Q4_0": (7.7, 10.1, 18.9, 126.2),
    "Q8_0": (9.5, 16.9, 33.9, 137.3), "Q4_K": (8.2, 12.5, 23.4, 135.0), "Q6_K": (9.5, 20.1, 40.8, 169.3),
    "IQ2_XS": (8.0, 15.2, 29.7, 171.6), "IQ4_XS": (6.1, 11.7, 22.1, None),
}
PRIORITY = ["Q4_K", "Q6_K", "Q8_0", "Q4_0", "F16"]
TUNED = ["Q4_K", "Q6_K", "Q8_0", "Q4_0"]
SHAPES = [(2, 8, 2), (4, 4, 2), (2, 8, 4)]          # generic GEMV: (rows, split-K warps, parts in flight) tried
# one-token fast GEMV: (rows per warp, warps per block, rows whose loads are in flight together, register cap,
# 1 = the 8-bit kernel `fast8.igemv1_kernel`), as in ops.FAST1_SHAPE; 8-bit entries only for its types
FAST_SHAPES = [(8, 4, 8, 128, 0), (8, 4, 4, 96, 0), (8, 4, 4, 80, 0), (4, 4, 4, 80, 0), (8, 4, 8, 128, 1),
               (8, 4, 4, 128, 1), (8, 4, 2, 96, 1), (16, 8, 4, 0, 1)]
# the same for one token's expert dispatch (ops.FAST1_IDS_SHAPE)
IDS_SHAPES = [(8, 4, 8, 128, 0), (8, 4, 4, 80, 0), (4, 4, 4, 80, 0), (8, 4, 8, 128, 1), (8, 4, 4, 128, 1),
              (8, 4, 4, 0, 1)]
L2_BYTES = 50e6


@cuda.jit
def read_kernel(w32, out):
    """Every thread sums 16-byte loads over a grid stride (4 in flight): what a numba kernel can read."""
    i = cuda.grid(1)
    n = cuda.gridsize(1)
    acc = uint32(0)
    m = w32.size // 4
    k = i
    while k + 3 * n < m:
        a0, a1, a2, a3 = ld4u(w32, 4 * k)
        b0, b1, b2, b3 = ld4u(w32, 4 * (k + n))
        c0, c1, c2, c3 = ld4u(w32, 4 * (k + 2 * n))
        d0, d1, d2, d3 = ld4u(w32, 4 * (k + 3 * n))
        acc ^= (a0 + a1 + a2 + a3) ^ (b0 + b1 + b2 + b3) ^ (c0 + c1 + c2 + c3) ^ (d0 + d1 + d2 + d3)
        k += 4 * n
    if acc == uint32(12345):
        out[0] = acc


def read_ceiling(timer: Timer, nbytes: int = 256 << 20) -> float:
    """GB/s of `read_kernel` over rotating buffers (graph-timed, the GEMV's conditions)."""
    bufs = [cuda.device_array(nbytes // 4, np.uint32) for _ in range(4)]
    out = cuda.device_array(1, np.uint32)
    dt = timer.graph(lambda i, s: read_kernel[132 * 16, 256, s](bufs[i % 4], out), 8, replays=7)
    return nbytes / (statistics.median(dt) * 1e-6) / 1e9


def copy_ceiling(timer: Timer, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    a = cuda.device_array(nbytes, np.uint8)
    b = cuda.device_array(nbytes, np.uint8)
    dt = timer.run(lambda i, s: b.copy_to_device(a, stream=s), 10, warm=2)
    return 2 * nbytes / (statistics.median(dt) * 1e-6) / 1e9


def rel_rms(got, want):
    return float(np.sqrt(np.mean((got.astype(np.float64) - want) ** 2) / np.mean(want.astype(np.float64) ** 2)))


def _shapes(cands, t):
    return [sh for sh in cands if not sh[4] or t in CW]


def bench_gemv(t: GGMLType, timer: Timer, rng, ceiling: float, O=4096, I=14336, ns=(1, 2, 4, 8), prefill=512,
               reps=100, tune=False, generic=True) -> dict:
    w0 = random_qtensor(t, (O, I), rng)
    nbytes = w0.nbytes
    nbuf = max(2, math.ceil(4 * L2_BYTES / nbytes))
    ws = [w0] + [random_qtensor(t, (O, I), rng) for _ in range(nbuf - 1)]
    dws = [device_weight(w).ensure() for w in ws]
    res = dict(type=t.name, bytes=nbytes, nbuf=nbuf, gemv={}, check={})
    rows = min(64, O)
    wref = ws[0].rows(0, rows)

    def run(n, kernel, shape=None, check=True):
        kernel = "fast" if kernel == "auto" and n <= 8 and fast else ("gemv" if kernel == "auto" else kernel)
        x = rng.standard_normal((n, I)).astype(np.float32)
        xd = cuda.to_device(x)
        yd = cuda.device_array((n, O), np.float32)
        grp = cuda.to_device(dense_groups(n, ops.GEMM_SHAPE["BN"]))
        if check:
            ops.grouped(dws[0], xd, yd, grp, 1, n, n, kernel=kernel, shape=shape)
            r = rel_rms(yd.copy_to_host()[:, :rows], ref.matmul(x, wref))
            res["check"][f"{kernel}{shape or ''} n={n}"] = r
            if not r <= 1e-5:
                raise AssertionError(f"{t.name} {kernel} n={n}: relative RMS {r:.2e} against the oracle")
        dt = timer.graph(lambda i, s: ops.grouped(dws[i % nbuf], xd, yd, grp, 1, n, n, kernel=kernel, shape=shape,
                                                  stream=s), 40 if n <= 8 else 6, replays=reps)
        return statistics.median(dt)
    fast = t in FSPECS
    res["kernel"] = "fast" if fast else "gemv"
    if tune:
        kind, shapes, table = ("fast", _shapes(FAST_SHAPES, t), ops.FAST1_SHAPE) if fast else ("gemv", SHAPES, ops.GEMV_SHAPE)
        res["tune"] = {"x".join(map(str, sh)): run(1, kind, sh) for sh in shapes}
        best = min(res["tune"], key=res["tune"].get)
        table[t] = tuple(int(v) for v in best.split("x"))
    if fast:
        res["shape"] = "x".join(map(str, ops.FAST1_SHAPE.get(t, ops.FAST1_DEFAULT)))
    if fast and generic:
        us = run(1, "gemv")
        res["generic_n1"] = dict(us=us, gbs=nbytes / us / 1e3)
    for n in ns:
        us = run(n, "auto")
        res["gemv"][n] = dict(us=us, gbs=nbytes / us / 1e3)
    if fast:                                 # 2 and 4 tokens: the 8-token kernel instead of one pass per token
        one_max = ops.ONE_MAX
        ops.ONE_MAX = 1
        try:
            res["gemv_8tok"] = {n: run(n, "auto") for n in ns if 1 < n <= one_max}
        finally:
            ops.ONE_MAX = one_max
    if prefill and I % 128 == 0:
        us = run(prefill, "gemm")
        res["prefill"] = dict(n=prefill, us=us, tflops=2 * O * I * prefill / us / 1e6)
    res["pct_copy"] = 100 * res["gemv"][1]["gbs"] / ceiling
    ll = LLAMA_GEMV_US.get(t.name)
    if ll:
        res["llama_us"] = ll
        res["x_llama"] = {n: ll[i] / res["gemv"][n]["us"] for n, i in ((1, 0), (2, 1), (4, 3)) if ll[i]}
    from quant.cuda import weights
    weights.clear()
    return res


def dispatch_inputs(rng, n: int, E: int, O: int, I: int, A: int, nsets: int):
    """n tokens routed uniformly at random to A of E experts, nsets times: the ids, x [n, I] (host and device),
    y [n*A, O], gmax, per set (device ids, the two group tables the bucket kernel fills), its two scratch arrays."""
    idss = [np.stack([rng.permutation(E)[:A] for _ in range(n)]).astype(np.int32) for _ in range(nsets)]
    x = rng.standard_normal((n, I)).astype(np.float32)
    gmax = min(E, n * A)
    size = GroupTable.size(gmax, n * A, cmoe.BN)
    tabs = [(cuda.to_device(ids.reshape(-1)), cuda.device_array(size, np.int32), cuda.device_array(size, np.int32))
            for ids in idss]
    return (idss, x, cuda.to_device(x), cuda.device_array((n * A, O), np.float32), gmax, tabs,
            cuda.device_array(E, np.int32), cuda.device_array(E, np.int32))


def bench_moe(t: GGMLType, timer: Timer, rng, ceiling: float, E=128, O=768, I=2048, A=8, ns=(1, 4, 8, 32),
              reps=100, tune=False) -> dict:
    w0 = random_qtensor(t, (E, O, I), rng)
    nbuf = max(2, math.ceil(3 * L2_BYTES * E / (A * w0.nbytes)))  # the experts one launch reads, x 3 > L2
    nbuf = min(nbuf, max(2, int(2e9 // w0.nbytes)))
    ws = [w0] + [random_qtensor(t, (E, O, I), rng) for _ in range(nbuf - 1)]
    dws = [device_weight(w).ensure() for w in ws]
    ebytes = w0.nbytes // E
    res = dict(type=t.name, nbuf=nbuf, moe={}, check={})
    for n in ns:
        nsets = 16
        idss, x, xd, yd, gmax, tabs, cnt, fill = dispatch_inputs(rng, n, E, O, I, A, nsets)
        distinct = statistics.mean(len(np.unique(i)) for i in idss)
        kernel = "auto"

        shape = None

        direct = n == 1 and ops.fast_ids_ok(dws[0], xd)             # one token: expert ids read directly

        def launch(i, s):
            idd, tx, tp = tabs[i % nsets]
            if direct:
                ops.grouped_ids(dws[i % nbuf], xd, yd, idd, A, stream=s, shape=shape)
                return
            cmoe.bucket_kernel[1, 256, s](idd, E, A, n * A, cmoe.BN, tx, tp, cnt, fill)
            ops.grouped(dws[i % nbuf], xd, yd, tx, gmax, n * A, n, kernel=kernel, stream=s, shape=shape)
        launch(0, 0)
        cuda.synchronize()
        got = yd.copy_to_host().reshape(n, A, O)
        wd = {int(e): ref.dequantize(ws[0][int(e)]) for e in np.unique(idss[0])}     # [O, I] per used expert
        want = np.stack([np.stack([wd[int(e)] @ x[k] for e in idss[0][k]]) for k in range(n)])
        r = rel_rms(got, want)
        res["check"][n] = r
        if not r <= 1e-5:
            raise AssertionError(f"{t.name} dispatch n={n}: relative RMS {r:.2e} against the oracle")
        if n == 1 and t in FSPECS and tune:                         # the one-token kernel's shape
            tn = {}
            for shape in _shapes(IDS_SHAPES, t):
                launch(0, 0)
                r = rel_rms(yd.copy_to_host().reshape(n, A, O), want)
                if not r <= 1e-5:
                    raise AssertionError(f"{t.name} dispatch n=1 {shape}: relative RMS {r:.2e} against the oracle")
                tn["x".join(map(str, shape))] = statistics.median(timer.graph(launch, 40, replays=reps))
            res["tune"] = tn
            ops.FAST1_IDS_SHAPE[t] = tuple(int(v) for v in min(tn, key=tn.get).split("x"))
            shape = None
        if n == 1 and t in FSPECS:
            res["shape"] = "x".join(map(str, ops.FAST1_IDS_SHAPE.get(t, ops.FAST1_DEFAULT)))
        us = statistics.median(timer.graph(launch, 40, replays=reps))
        res["moe"][n] = dict(us=us, distinct=distinct, gbs=distinct * ebytes / us / 1e3)
        if 1 < n <= ops.ONE_MAX and t in FSPECS:                   # the 8-token kernel instead
            one_max = ops.ONE_MAX
            ops.ONE_MAX = 1
            try:
                res.setdefault("moe_8tok", {})[n] = statistics.median(timer.graph(launch, 40, replays=reps))
            finally:
                ops.ONE_MAX = one_max
    ll = LLAMA_MOE_US.get(t.name)
    if ll:
        res["llama_us"] = ll
        res["x_llama"] = {n: ll[i] / res["moe"][n]["us"] for i, n in enumerate(ns) if ll[i]}
    from quant.cuda import weights
    weights.clear()
    return res


def markdown(gemv: list[dict], moe: list[dict], ceiling: float, dev: str) -> str:
    L = [f"Device: {dev}. Copy ceiling (device-to-device, read + write) measured in the same run: "
         f"**{ceiling:.0f} GB/s**.", "",
         "GEMV, W 4096 x 14336 (packed GGUF bytes, float32 activations, result equal to the NumPy oracle within "
         "rel-RMS 1e-5). `x llama` = llama.cpp time / ours (> 1: we are faster).", "",
         "| type | kernel (shape) | n=1 us | GB/s | % copy | llama n=1 | x llama n=1 | n=2 us | x llama | n=4 us "
         "| x llama | n=8 us | prefill 512 us | TFLOP/s | generic GEMV n=1 us | 8-token kernel n=2 / n=4 us |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in gemv:
        g, xl, ll = r["gemv"], r.get("x_llama", {}), r.get("llama_us", (None,) * 4)
        f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"         # noqa: E731
        pf = r.get("prefill", {})
        tt = GGMLType[r["type"]]
        shape = r.get("shape") or "x".join(map(str, ops.FAST1_SHAPE.get(tt, ops.FAST1_DEFAULT) if r.get("kernel") == "fast"
                                              else ops.GEMV_SHAPE.get(tt, ops.GEMV_DEFAULT)))
        L.append(f"| {r['type']} | {r.get('kernel', 'gemv')} ({shape}) "
                 f"| {f(g[1]['us'])} | {f(g[1]['gbs'], 0)} | {f(r['pct_copy'], 0)}% | {f(ll[0])} | {f(xl.get(1), 2)} "
                 f"| {f(g[2]['us'])} | {f(xl.get(2), 2)} | {f(g[4]['us'])} | {f(xl.get(4), 2)} | {f(g[8]['us'])} "
                 f"| {f(pf.get('us'), 0)} | {f(pf.get('tflops'), 1)} | {f(r.get('generic_n1', {}).get('us'))} "
                 f"| {' / '.join(f(v) for v in r.get('gemv_8tok', {}).values()) or '-'} |")
    L += ["", "Expert dispatch (MUL_MAT_ID): 128 experts of 768 x 2048, 8 used per token; grouping by expert on the "
          "device + one grouped launch. GB/s over the distinct experts read.", "",
          "| type | n=1 shape | n=1 us | GB/s | llama | x llama | n=4 us | x llama | n=8 us | x llama | n=32 us | x llama "
          "| 8-token kernel n=4 us |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in moe:
        m, xl, ll = r["moe"], r.get("x_llama", {}), r.get("llama_us", (None,) * 4)
        f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"         # noqa: E731
        L.append(f"| {r['type']} | {r.get('shape', '-')} | {f(m[1]['us'])} | {f(m[1]['gbs'], 0)} | {f(ll[0])} "
                 f"| {f(xl.get(1), 2)} | {f(m[4]['us'])} | {f(xl.get(4), 2)} | {f(m[8]['us'])} | {f(xl.get(8), 2)} "
                 f"| {f(m[32]['us'])} | {f(xl.get(32), 2)} | {f(r.get('moe_8tok', {}).get(4))} |")
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default=None, help="comma-separated ggml types (default: every decoded type)")
    ap.add_argument("--moe-types", default=None, help="dispatch types (default: the ones llama.cpp was measured on)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--no-prefill", action="store_true", help="skip the 512-token GEMM")
    ap.add_argument("--no-generic", action="store_true", help="skip the generic kernel's n=1 figure for fast types")
    a = ap.parse_args(argv)
    qc.check_available()
    if qc.SIM:
        print("the simulator cannot be timed")
        return 2
    types = [GGMLType[s] for s in a.types.split(",")] if a.types else sorted(
        SPECS, key=lambda t: (t.name not in PRIORITY, PRIORITY.index(t.name) if t.name in PRIORITY else 0))
    moe_types = [GGMLType[s] for s in a.moe_types.split(",")] if a.moe_types else \
        [GGMLType[n] for n in LLAMA_MOE_US if GGMLType[n] in SPECS]
    reps = 7 if a.quick else 15
    rng = np.random.default_rng(0)
    timer = Timer()
    dev = cuda.get_current_device().name
    dev = dev.decode() if isinstance(dev, bytes) else str(dev)
    ceiling = copy_ceiling(timer)
    rc = read_ceiling(timer)
    print(f"{dev}: copy ceiling {ceiling:.0f} GB/s, numba read kernel {rc:.0f} GB/s", flush=True)
    out = dict(device=dev, ceiling_gbs=ceiling, read_gbs=rc, gemv=[], moe=[])

    def do_gemv(t):
        t0 = time.perf_counter()
        try:
            r = bench_gemv(t, timer, rng, ceiling, reps=reps, tune=(t.name in TUNED and not a.no_tune),
                           prefill=0 if a.no_prefill else 512, generic=not a.no_generic)
        except Exception as e:                                     # noqa: BLE001 - report and go on
            print(f"{t.name}: FAILED {type(e).__name__}: {e}", flush=True)
            out.setdefault("failed", []).append(f"gemv {t.name}: {e}")
            return
        out["gemv"].append(r)
        _save(a, out, ceiling, dev)
        print(f"{t.name:8s} n=1 {r['gemv'][1]['us']:7.1f} us {r['gemv'][1]['gbs']:6.0f} GB/s {r['pct_copy']:4.0f}% "
              f"x llama {r.get('x_llama', {}).get(1, float('nan')):.2f}  n=8 {r['gemv'][8]['us']:.1f} us  "
              f"prefill {r.get('prefill', {}).get('us', float('nan')):.0f} us  shape {r.get('shape', '-')}  "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)

    def do_moe(t):
        try:
            r = bench_moe(t, timer, rng, ceiling, reps=reps, tune=(t.name in TUNED and not a.no_tune))
        except Exception as e:                                     # noqa: BLE001
            print(f"moe {t.name}: FAILED {type(e).__name__}: {e}", flush=True)
            out.setdefault("failed", []).append(f"moe {t.name}: {e}")
            return
        out["moe"].append(r)
        _save(a, out, ceiling, dev)
        print(f"moe {t.name:8s} " + "  ".join(f"n={n} {v['us']:.1f} us" for n, v in r["moe"].items())
              + f"  x llama {r.get('x_llama', {})}", flush=True)
    first = [t for t in types if t.name in PRIORITY]                # priority types, dispatch, then the rest
    for t in first:
        do_gemv(t)
    for t in moe_types:
        do_moe(t)
    for t in types:
        if t not in first:
            do_gemv(t)
    print(_save(a, out, ceiling, dev))
    return 1 if out.get("failed") else 0


def _save(a, out, ceiling, dev) -> str:
    """Write the JSON and the Markdown table so far (a time limit may stop the run)."""
    md = markdown(out["gemv"], out["moe"], ceiling, dev)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=float)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")
    return md


if __name__ == "__main__":
    sys.exit(main())
