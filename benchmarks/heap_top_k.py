"""GPU benchmark: llama.cpp's `ggml_top_k` heap replayed per row (`refengine/cuda/fused.py` `ggml_top_k_rows`, one
thread a row): what the k-pool indexer's and QSA's (llama.cpp rule) selections cost a step.

    python3 benchmarks/heap_top_k.py [--reps 50] [--json out.json]

Cases (rows x padded axis n x k), the scores drawn from {0, 0.5, 1, -inf} (the exact ties of sums of ReLUs):
  decode, GLM-5.3-Flash (k/kp = 128 pools): 1 row over 64 / 256 / 1024 / 4096 pools (contexts of ~1k to 64k tokens)
  prefill, GLM-5.3-Flash: 512 rows over 64 pools (a 512-token prompt; ties by index where the k-th is not tied)
  QSA under llama.cpp's rule (Qwen3.8-Flash-Next, B + r - 1 cells): 512 rows over 512 cells; 1 row over 4096
Each: the median of --reps launches (CUDA events, after a warm-up), checked once against the NumPy statement
(`ops.top_k.ggml_top_k_rows`, index for index).
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

from refengine.cuda import fused
from refengine.ops.top_k import ggml_top_k_rows

CASES = [  # name, rows, n (padded axis = the row's length here), k, clean_stable
    ("decode glm5 64 pools", 1, 64, 128, False),
    ("decode glm5 256 pools", 1, 256, 128, False),
    ("decode glm5 1024 pools", 1, 1024, 128, False),
    ("decode glm5 4096 pools", 1, 4096, 128, False),
    ("prefill glm5 512 x 64 pools", 512, 64, 128, True),
    ("prefill qsa 512 x 512 cells", 512, 512, 2111, False),
    ("decode qsa 4096 cells", 1, 4096, 2111, False),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    for name, T, n, k, clean in CASES:
        x = rng.choice(np.array([0.0, 0.5, 1.0, -np.inf], np.float32), size=(T, n), p=[0.5, 0.2, 0.1, 0.2])
        nd = np.array([n], np.int64)
        xd, ndd, out = cuda.to_device(x), cuda.to_device(nd), cuda.device_array((T, k), np.int32)
        fused.ggml_top_k_rows_raw(xd, ndd, k, out, clean_stable=clean)
        cuda.synchronize()
        ok = bool(np.array_equal(out.copy_to_host(), ggml_top_k_rows(x, nd, k, clean)))
        times = [float("nan")]                  # (the CUDA simulator: a dry run, nothing timed)
        for _ in range(0 if quant.cuda.SIM else a.reps):
            e0, e1 = cuda.event(), cuda.event()
            e0.record()
            fused.ggml_top_k_rows_raw(xd, ndd, k, out, clean_stable=clean)
            e1.record()
            e1.synchronize()
            times.append(cuda.event_elapsed_time(e0, e1))
        times = times[1:] or times
        ms = statistics.median(times)
        rows.append(dict(case=name, rows=T, n=n, k=k, ms=ms, equal=ok))
        print(f"{name:32s} {ms * 1e3:9.1f} us   equal to the statement: {ok}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
