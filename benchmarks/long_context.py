"""Time and peak memory of one long prefill on the tiny presets: `Model(path, n_ctx=T).forward(T random tokens)`.

    python benchmarks/long_context.py [--archs qwen3moe,deepseek32,...] [--T 1024,4096,16384] [--ubatch 512]
                                      [--limit-gb 8] [--blas-threads 1] [--dir /tmp/refengine-long]

Each (arch, T) runs in a fresh child process, so its peak RSS (VmHWM of /proc/self/status in the child, after the
forward) is that prefill's alone, including the interpreter and NumPy (about 100 MB). (Until 2026-12-03 this read
`getrusage(RUSAGE_SELF).ru_maxrss`, which Linux carries over exec from the forking parent's RSS: the parent here is
this small driver, so the table's figures are upper bounds by at most its size.) The
child's address space is capped at --limit-gb (a run over it reports MemoryError instead of swapping a shared
machine). --blas-threads sets OPENBLAS_NUM_THREADS / OMP_NUM_THREADS in the child (default 1: on a shared,
oversubscribed machine OpenBLAS's spinning worker threads made one 512 x 128 x 512 product 80x slower).
One markdown row per run on stdout; BENCHMARKS.md (Long contexts) keeps the current table.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ARCHS = ("qwen3moe", "deepseek32", "kimi-linear", "qwen3next")


def child(path: str, T: int, ubatch: int | None, limit_gb: float, engine: str = "refengine") -> dict:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (int(limit_gb * 2**30),) * 2)
    import warnings

    import numpy as np

    from refengine import Model
    warnings.simplefilter("ignore")                      # n_ctx above the tiny preset's trained context
    kw = {} if ubatch is None else {"n_ubatch": ubatch}
    m = Model(path, n_ctx=T, **kw)
    tokens = np.random.default_rng(0).integers(0, m.cfg.n_vocab, size=T)
    t0 = time.perf_counter()
    try:
        if engine == "llamacpp":          # the oracle: CPU, f32 KV cache, no flash attention, n_batch = n_ubatch = T
            from refengine.oracle import run_llamacpp
            logits = run_llamacpp(path, tokens, trace=False, n_ctx=T, n_threads=1).logits
        else:
            logits = m.forward(tokens)
        ok = bool(np.all(np.isfinite(logits)))
        err = None
    except MemoryError:
        ok, err = False, "MemoryError"
    dt = time.perf_counter() - t0
    with open("/proc/self/status") as f:                                   # this address space's own peak
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**10     # KiB -> MiB
    return {"seconds": dt, "peak_mib": rss, "ok": ok, "error": err}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--T", default="1024,4096,16384")
    p.add_argument("--ubatch", type=int, default=None, help="Model(n_ubatch=...) (default: the Model's default)")
    p.add_argument("--limit-gb", type=float, default=8.0)
    p.add_argument("--blas-threads", type=int, default=1)
    p.add_argument("--llamacpp", action="store_true", help="time llama.cpp (one thread, one batch) instead")
    p.add_argument("--dir", default="/tmp/refengine-long")
    p.add_argument("--child", nargs=2, metavar=("PATH", "T"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.ubatch, a.limit_gb,
                               "llamacpp" if a.llamacpp else "refengine")))
        return 0
    from refengine.synth import write_synth
    os.makedirs(a.dir, exist_ok=True)
    print(f"| tiny preset | T | time{' (llama.cpp)' if a.llamacpp else ''} | peak RSS |")
    print("|---|---|---|---|")
    for arch in a.archs.split(","):
        path = os.path.join(a.dir, f"{arch}-tiny.gguf")
        if not os.path.exists(path):
            write_synth(arch, path, preset="tiny")
        for T in map(int, a.T.split(",")):
            cmd = [sys.executable, __file__, "--child", path, str(T), "--limit-gb", str(a.limit_gb)]
            if a.ubatch is not None:
                cmd += ["--ubatch", str(a.ubatch)]
            if a.llamacpp:
                cmd += ["--llamacpp"]
            env = {**os.environ, "OPENBLAS_NUM_THREADS": str(a.blas_threads), "OMP_NUM_THREADS": str(a.blas_threads)}
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            try:
                d = json.loads(r.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                d = {"seconds": float("nan"), "peak_mib": float("nan"), "ok": False,
                     "error": (r.stderr.strip().splitlines() or ["?"])[-1][:80]}
            note = "" if d["ok"] else f" ({d['error']})"
            print(f"| {arch} | {T} | {d['seconds']:.2f} s{note} | {d['peak_mib']:.0f} MiB |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
