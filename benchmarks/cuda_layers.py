"""Real-size qwen3moe layers on the GPU: decode and prefill time per layer, and GPU == CPU on the same input.

    python benchmarks/cuda_layers.py --type Q4_K [--layers 3] [--dir /tmp/rs] [--check] [--json out.json]

The model is the `qwen3-30b-a3b` preset (Qwen3-30B-A3B's published shapes: hidden 2048, 32 / 4 heads of
128, 128 experts of 768 x 2048, 8 used, vocab 151936) cut to 1 and to `--layers` blocks (two files,
`refengine.cuda.randmodel.cut_file`: the names benchmarks/graph_decode.py writes, so the two share them). Its
tensor table and metadata are `refengine.synth`'s; the matrices hold random packed bytes with block scales set so
that every weight has mean 0 and std 1/sqrt(fan_in) (quantizing 1.8 G weights with ggml's quantizer takes minutes,
and the GPU machine has no libggml). What is timed is `Runtime(backend="cuda")`, the concept modules resident on
the GPU (the path of every arch). Per-layer cost is the difference between the cuts of 1 and L blocks (the
embedding and the output head cancel), as llama.cpp's anchor does:

    decode:  a 16-token prompt, then `--decode-tokens` tokens one by one through a `GraphDecoder` (the step
             captured as a CUDA graph, then replayed: graph_decode.py's `decode_graph`); the median over the
             replayed steps of the graph's GPU time (events around its launch) and of the step's wall time
    prefill: `--prefill` tokens in one eager resident forward from a fresh state, the last row's logits
             (graph_decode.py's `time_prefill`: wall time, median of 3 after a warm-up)
    profile: `--decode-tokens` more replays of the largest cut under torch.profiler, GPU time per kernel
             (graph_decode.py's `profile_steps`; a prefill's: benchmarks/profile_prefill.py)
    check:   the largest cut's forward (16-token prompt + 2 decoded tokens) on the GPU and with the NumPy
             backend on the CPU: relative RMS of the logits, and the argmax tokens
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

import quant.cuda  # noqa: F401  (numpy shim before numba)
from graph_decode import decode_graph, profile_steps, runtime, time_prefill   # the script's folder is on sys.path
from refengine.cuda.randmodel import cut_file
from refengine.model import Model
from refengine.runtime import Runtime

LLAMA = {"Q4_K": (53.0, 1.43), "Q8_0": (71.0, 1.66)}        # us decode / ms prefill per layer (anchor, Q4_K_M / Q8_0)


def random_model(directory: str, wtype: str, layers: int) -> str:
    """The preset cut to `layers` blocks of random packed `wtype` weights in `directory` (written once)."""
    return cut_file(directory, "qwen3moe", "qwen3-30b-a3b", layers, wtype)


def rel_rms(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def time_decode(model, prompt, tokens):
    """The graph decoder's steps after the prompt -> (GPU and wall time per replayed step in microseconds, the
    decoder's counters; the decoder)."""
    _, times, dec = decode_graph(model, runtime(fixed_shapes=True), prompt, tokens)
    wall = [t for t, r in zip(times, dec.replayed) if r]
    return dict(decode_gpu_us=1e3 * statistics.median(dec.gpu_ms) if dec.gpu_ms else float("nan"),
                decode_wall_us=1e6 * statistics.median(wall) if wall else float("nan"),
                first_wall_us=[t * 1e6 for t in times[:2]], eager=dec.eager, captures=dec.captures,
                replays=dec.replays, capture_failed=dec.failed), dec


def check(model, prompt, n_dec=2) -> dict:
    """The whole file on the GPU (resident) and on the CPU (NumPy backend), same tokens."""
    out = {}
    for name, rt in (("gpu", Runtime(backend="cuda")), ("cpu", Runtime())):
        st = model.new_state()
        t0 = time.perf_counter()
        lg = [model.forward(prompt, st, rt)]
        toks = []
        for _ in range(n_dec):
            toks.append(int(np.argmax(lg[-1][-1])))
            lg.append(model.forward([toks[-1]], st, rt))
        out[name] = dict(logits=lg, tokens=toks, s=time.perf_counter() - t0)
    g, c = out["gpu"], out["cpu"]
    r = dict(prefill_rel_rms=rel_rms(g["logits"][0], c["logits"][0]),
             decode_rel_rms=[rel_rms(a, b) for a, b in zip(g["logits"][1:], c["logits"][1:])],
             argmax_equal=bool(np.array_equal(np.argmax(g["logits"][0], -1), np.argmax(c["logits"][0], -1))),
             tokens_gpu=g["tokens"], tokens_cpu=c["tokens"], cpu_s=c["s"], gpu_s=g["s"])
    r["max_abs"] = float(max(np.max(np.abs(a - b)) for a, b in zip(g["logits"], c["logits"])))
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--type", default="Q4_K")
    ap.add_argument("--layers", type=int, default=3, help="blocks of the larger cut (per-layer cost from 1 and L)")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--decode-tokens", type=int, default=40)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--check", action="store_true", help="GPU logits against the NumPy backend on the CPU")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-profile", action="store_true", help="skip the kernel profile of the decode replays")
    ap.add_argument("--no-prefill", action="store_true", help="decode only")
    ap.add_argument("--fast1", default="", help="one-token GEMV shapes per matrix size (quant.cuda.ops."
                    "FAST1_SHAPE_BY_DIMS), e.g. 5120x2048=4x2x4x128x1,2048x4096=8x4x8x128x1 (for --type)")
    ap.add_argument("--dispatch-avg", default="", help="expert dispatch kernel choice: ops.PAIRS_AVG,ops.GROUP_AVG "
                    "(0,0: by the batch's tokens alone, the choice before session 11)")
    a = ap.parse_args(argv)
    if a.dispatch_avg:
        from quant.cuda import ops
        try:
            ops.PAIRS_AVG, ops.GROUP_AVG = (int(v) for v in a.dispatch_avg.split(","))
        except ValueError:
            ap.error(f"--dispatch-avg: {a.dispatch_avg!r} is not two integers P,G (e.g. 2,8)")
    if a.fast1:
        from quant import GGMLType
        from quant.cuda import ops
        for item in a.fast1.split(","):
            try:
                dims, sh = item.split("=")
                O, I = (int(v) for v in dims.split("x"))
                ops.FAST1_SHAPE_BY_DIMS[(GGMLType[a.type], O, I)] = tuple(int(v) for v in sh.split("x"))
            except (ValueError, KeyError):
                ap.error(f"--fast1: {item!r} is not OxI=RWxKSxPxCAPxX (e.g. 5120x2048=8x4x8x128x1), "
                         f"or --type {a.type!r} is not a ggml type")
    Ls = sorted({1, a.layers})
    models = {}
    for L in Ls:
        t0 = time.perf_counter()
        path = random_model(a.dir, a.type, L)
        print(f"{path}: {os.path.getsize(path) / 2**30:.2f} GiB (written or found in {time.perf_counter() - t0:.0f} s)",
              flush=True)
        models[L] = Model(path)
    rng = np.random.default_rng(1)
    n_vocab = models[Ls[0]].cfg.n_vocab
    prompt = rng.integers(0, n_vocab, 16).tolist()
    tokens = rng.integers(0, n_vocab, a.decode_tokens).tolist()
    long = rng.integers(0, n_vocab, a.prefill).tolist()
    res = dict(type=a.type, files={L: os.path.basename(m.path) for L, m in models.items()}, layers=a.layers,
               decode={}, prefill_ms={}, fast1=a.fast1, dispatch_avg=a.dispatch_avg)
    Lmax = Ls[-1]
    dec = None
    for L in Ls:
        res["decode"][L], dec = time_decode(models[L], prompt, tokens)
        d = res["decode"][L]
        print(f"L={L}: decode {d['decode_gpu_us']:.1f} us GPU, {d['decode_wall_us']:.1f} us wall per token "
              f"({d['eager']} eager, {d['captures']} captures, {d['replays']} replays"
              + (f"; capture failed: {d['capture_failed']}" if d["capture_failed"] else "") + ")", flush=True)
    for L in ([] if a.no_prefill else Ls):
        res["prefill_ms"][L] = p = time_prefill(models[L], long)
        print(f"L={L}: prefill {a.prefill} tokens {p:.2f} ms wall", flush=True)
    if not a.no_profile:
        profile_steps(dec, tokens, res)                 # (the last decoder: the largest cut's)
    if Lmax > 1:
        d, p = res["decode"], res["prefill_ms"]
        for k in ("gpu", "wall"):
            res[f"decode_{k}_us_per_layer"] = (d[Lmax][f"decode_{k}_us"] - d[1][f"decode_{k}_us"]) / (Lmax - 1)
        if p:
            res["prefill_wall_ms_per_layer"] = (p[Lmax] - p[1]) / (Lmax - 1)
        ll = LLAMA.get(a.type)
        pre = f", prefill {a.prefill} {res['prefill_wall_ms_per_layer']:.2f} ms wall" if p else ""
        print(f"{a.type}: per layer decode {res['decode_gpu_us_per_layer']:.1f} us GPU "
              f"({res['decode_wall_us_per_layer']:.1f} us wall){pre}"
              + (f"  (llama.cpp {ll[0]} us, {ll[1]} ms)" if ll else ""), flush=True)
    if a.check:
        res["check"] = check(models[Lmax], prompt)
        print("check:", {k: v for k, v in res["check"].items()}, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
