"""Single fused kernels at real sizes, each timed alone: which form of a kernel is faster, and whether a kernel's
register count (its occupancy) is what limits it, without a whole prefill around it.

    python benchmarks/fused_kernels.py [--cases norm,delta,rows] [--reps 20] [--max-registers 64,80] [--json out.json]
    NUMBA_ENABLE_CUDASIM=1 python benchmarks/fused_kernels.py --sim      (toy sizes: the script's own check)

Cases (random inputs; median of --reps launches, `quant.cuda.timing.Timer`: queued behind a spinning kernel
so the clocks are up and the host's launch time hidden, an event pair a launch):
- norm: `rms_norm_raw`'s two kernels on the rows a prefill and a decode step give them: a head's norms (the delta
  rule's l2 norms, KDA's output norm: T x H rows of 128) and the model-width rows. `_rms_rows` (a block a row, 133
  registers for sm_90) against `_rms_warps` (a warp a row, 48) where the row fits a warp.
- delta: the delta rule's kernel (kimi-linear / qwen3next: 32 heads, K = V = 128, T = 1 and 512) in its forms
  (`fused.delta_rule_kernel`: 4 or 8 state rows a lane, 1, 2 or 4 value columns a warp). Session 34's (8 rows, one
  column, 92 registers x 256 threads) left two blocks an SM: 512 blocks, two waves on 132 SMs, for every token; the
  default now (4 rows, DR_COLS = 2 columns, 72 registers) is 256 blocks, one wave. --max-registers recompiles the
  default under a cap (ptxas spills past it).
- rows: `_attention_rows`, a prefill's causal attention (T = 512): llama's heads (32 query heads on 8 key heads,
  K = V = 128) and MLA's absorbed heads (one shared key of 576, values of 512: kimi-linear's 32 heads, DeepSeek-V3's
  128), whose cost under the "rows" form decides `fused.ROWS_MAX_K`; --max-registers as for delta (124 registers).
Each row prints the kernel's time and, for a --max-registers variant, its ratio to the default compile; the
variants' outputs are compared with the default's (max |diff|).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

import quant.cuda  # noqa: F401  (numpy shim before numba)
from numba import cuda

from refengine.cuda import fused as fz

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


_TIMER: list = []


def _time(launch, reps: int) -> float | None:
    """Median us of `launch(stream)` over reps launches (`quant.cuda.timing.Timer`: queued behind a spinning kernel,
    the clocks up, an event pair a launch); None in the simulator (it runs the launch once: no time)."""
    if SIM:
        launch(0)
        return None
    if not _TIMER:
        from quant.cuda.timing import Timer
        _TIMER.append(Timer())
    return float(np.median(_TIMER[0].run(lambda i, s: launch(s), reps)))


def _capped(kernel, cap: int):
    """kernel's Python function compiled again under a register cap (its module's globals, fastmath off)."""
    return cuda.jit(max_registers=cap, fastmath=False)(kernel.py_func)


def norm_cases(sim: bool, reps: int, caps) -> list[dict]:
    shapes = [(6, 40), (2, 300)] if sim else [(16384, 128), (8192, 128), (32, 128), (512, 2304), (512, 7168),
                                              (1, 7168)]
    out = []
    for R, D in shapes:
        x, w = cuda.to_device(_rand((R, D), 1)), cuda.to_device(_rand(D, 2))
        y = cuda.device_array((R, D), np.float32)
        eps, post = np.float32(1e-6), np.float32(1.0)
        rows = lambda s: fz._rms_rows[R, fz.NT, s](x, x, 1, x, False, False, w, True, eps, post, y, y)     # noqa: E731
        res = {"case": "norm", "shape": [R, D], "rms_rows_us": _time(rows, reps)}
        if D <= fz.WARP_ROW_MAX_D:
            want = y.copy_to_host()
            warps = lambda s: fz._rms_warps[fz._grid(R, fz.NTW), fz.NT, s](x, x, 1, x, False, False, w, True, eps, post, x, 0,  # noqa: E731
                                                                              y, y)
            res["rms_warps_us"] = _time(warps, reps)
            res["max_abs_diff"] = float(np.max(np.abs(y.copy_to_host() - want)))
        out.append(res)
    return out


def delta_cases(sim: bool, reps: int, caps) -> list[dict]:
    H, K, V = (2, 8, 10) if sim else (32, 128, 128)
    out = []
    for T in ((1, 5) if sim else (1, 512)):
        q, k = cuda.to_device(_rand((T, H, K), 1, 0.1)), cuda.to_device(_rand((T, H, K), 2, 0.1))
        v, g = cuda.to_device(_rand((T, H, V), 3)), cuda.to_device(-np.abs(_rand((T, H, K), 4, 0.1)))
        beta = cuda.to_device(np.abs(_rand((T, H), 5)) % 1.0)
        S0 = cuda.to_device(_rand((H, K, V), 6, 0.1))
        o, S1 = cuda.device_array((T, H, V), np.float32), cuda.device_array((H, K, V), np.float32)
        scale = np.float32(1.0 / math.sqrt(K))

        def launch(kern, cols):
            blocks = H * ((V + fz.DR_WARPS * cols - 1) // (fz.DR_WARPS * cols))
            return lambda s: kern[blocks, 32 * fz.DR_WARPS, s](q, k, v, g, True, beta, S0, True, scale, o, S1)
        base = _time(launch(fz.delta_rule_kernel(K), fz.DR_COLS), reps)
        want = o.copy_to_host()
        res = {"case": "delta", "T": T, "H": H, "K": K, "V": V, "cols": fz.DR_COLS, "default_us": base}
        # the other forms: 8 rows a lane (the kernel of K > 128, session 34's row count), 1 / 4 columns a warp
        for name, kern, cols in (("rows8_cols1", fz.delta_rule_kernel(256, 1), 1),
                                 ("rows4_cols1", fz.delta_rule_kernel(K, 1), 1),
                                 ("rows4_cols4", fz.delta_rule_kernel(K, 4), 4)):
            res[f"{name}_us"] = _time(launch(kern, cols), reps)
            res[f"{name}_max_abs_diff"] = float(np.max(np.abs(o.copy_to_host() - want)))
        for cap in caps:
            res[f"cap{cap}_us"] = _time(launch(_capped(fz.delta_rule_kernel(K), cap), fz.DR_COLS), reps)
            res[f"cap{cap}_max_abs_diff"] = float(np.max(np.abs(o.copy_to_host() - want)))
        out.append(res)
    return out


def rows_cases(sim: bool, reps: int, caps) -> list[dict]:
    T = 12 if sim else 512
    # (name, query heads, key heads, K, V): llama-3-8b's GQA, MLA's absorbed heads (kimi-linear, DeepSeek-V3)
    kinds = [("gqa", 4, 2, 8, 8), ("mla", 4, 1, 12, 10)] if sim else \
        [("gqa llama-3-8b", 32, 8, 128, 128), ("mla kimi-linear", 32, 1, 576, 512),
         ("mla deepseek-v3", 128, 1, 576, 512)]
    out = []
    for name, H, Hk, K, V in kinds:
        q = cuda.to_device(_rand((T, H, K), 1))
        kk, vv = cuda.to_device(_rand((T, Hk, K), 2)), cuda.to_device(_rand((T, Hk, V), 3))
        pos = cuda.to_device(np.arange(T, dtype=np.int64))
        o = cuda.device_array((T, H, V), np.float32)
        scale = 1.0 / math.sqrt(K)
        base = _time(lambda s: fz.attention_rows_raw(q, kk, vv, pos, scale, True, o, stream=s), reps)
        want = o.copy_to_host()
        res = {"case": "rows", "kind": name, "T": T, "H": H, "Hkv": Hk, "K": K, "V": V, "default_us": base}
        G = H // Hk
        nw = min(fz.ARW, G)
        grid = T * Hk * ((G + nw - 1) // nw)
        for cap in caps:
            kern = _capped(fz._attention_rows, cap)
            res[f"cap{cap}_us"] = _time(lambda s: kern[grid, 32 * nw, s](q, kk, vv, pos, np.float32(scale), True, o),
                                        reps)
            res[f"cap{cap}_max_abs_diff"] = float(np.max(np.abs(o.copy_to_host() - want)))
        out.append(res)
    return out


CASES = {"norm": norm_cases, "delta": delta_cases, "rows": rows_cases}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="norm,delta,rows", help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--max-registers", default="", help="register caps to compile delta and rows under, e.g. 64,80")
    ap.add_argument("--sim", action="store_true", help="toy sizes (under NUMBA_ENABLE_CUDASIM=1: the script's check)")
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args(argv)
    names = [c for c in a.cases.split(",") if c]
    if bad := [c for c in names if c not in CASES]:
        ap.error(f"unknown case {', '.join(bad)} (known: {', '.join(CASES)})")
    if not (a.sim or SIM) and not cuda.is_available():
        print("no CUDA device (run on a GPU, or with NUMBA_ENABLE_CUDASIM=1 --sim)", file=sys.stderr)
        return 2
    caps = [] if SIM else [int(c) for c in a.max_registers.split(",") if c]
    reps = 1 if SIM else a.reps
    rows = []
    for c in names:
        for r in CASES[c](a.sim or SIM, reps, caps):
            rows.append(r)
            print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
