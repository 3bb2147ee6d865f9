"""A resident prefill's wall time on one file under several runtimes, in one process (the kernels compiled once):
the concept modules with the prefill attention in one kernel (KernelPolicy prefill_attention="rows"), the same with
mha's NumPy blocks on CuPy ("batched"), and for llama / qwen3moe the hand-written DeviceModel. Each path's last
logits row is compared with the first path's (rel-RMS, argmax).

    python benchmarks/prefill_paths.py --arch qwen3moe --preset qwen3-30b-a3b --layers 4 --dir /tmp/m
    python benchmarks/prefill_paths.py FILE.gguf --paths rows,batched

Needs a GPU (CuPy; the timing is graph_decode.py's `time_prefill`); the cut is written by refengine.cuda.randmodel
when missing (Q4_K, random-packed)."""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]

from graph_decode import time_prefill  # noqa: E402
from refengine.compare import metrics  # noqa: E402
from refengine.model import Model  # noqa: E402
from refengine.runtime import Runtime  # noqa: E402

PATHS = ("rows", "batched", "devicemodel")


def runtime(path: str) -> Runtime:
    """The runtime of one named path."""
    from quant.cuda.policy import KernelPolicy
    if path == "devicemodel":
        return Runtime(backend="cuda", device_model=True) if hasattr(Runtime, "device_forward") else None
    return Runtime(backend="cuda", kernel_policy=KernelPolicy.default().replace(prefill_attention=path))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--arch", default="qwen3moe")
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5, help="timed prefills a path (the median reported)")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args(argv)
    path = a.model
    if path is None:
        from refengine.cuda.randmodel import cut_file
        path = cut_file(a.dir, a.arch, a.preset, a.layers, a.type, [])
    m = Model(path)
    ids = [int(t) for t in np.random.default_rng(0).integers(0, m.cfg.n_vocab, a.tokens)]
    rec, first = {"file": os.path.basename(path), "tokens": a.tokens}, None
    for name in a.paths.split(","):
        if name not in PATHS:
            ap.error(f"path {name!r}: expected one of {', '.join(PATHS)}")
        rt = runtime(name)
        if name == "devicemodel" and (rt is None or rt.device_forward(m) is None):
            print(f"{rec['file']}: no DeviceModel for {m.cfg.arch}", flush=True)
            continue
        row, times = [], []
        ms = time_prefill(m, ids, a.reps, rt=rt, out=row, times_out=times)   # (one warm-up first)
        logits = row[0]
        line = f"{rec['file']}: prefill of {a.tokens} tokens, {name}: {ms:.1f} ms (median of {a.reps}; " \
               f"{1e3 * min(times):.1f}-{1e3 * max(times):.1f})"
        rec[f"{name}_ms"] = ms
        if first is None:
            first = (name, logits)
        else:
            rel = float(np.sqrt(metrics(first[1], logits)[0]))                 # sqrt(NMSE)
            same = int(np.argmax(logits)) == int(np.argmax(first[1]))
            rec[f"{name}_vs_{first[0]}_rel_rms"] = rel
            line += f"; last row vs {first[0]} rel-RMS {rel:.2e}, argmax equal {same}"
        print(line, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
